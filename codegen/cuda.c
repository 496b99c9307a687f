/* cuda.c - the kernel IR as CUDA C (cg_kernel_cuda_text, cuda.h): the C
 * printer (cprint.c) with the parallel space mapped onto the GPU.
 *
 * Every instruction prints as in cprint.c (one `const` local each,
 * accumulators plain locals, RANGE a for loop, integer arithmetic through
 * unsigned types so it wraps).  What changes is who runs an iteration:
 *
 *   thread mode   iteration gid is one thread: a grid-stride loop over
 *                 blockIdx.x * blockDim.x + threadIdx.x.  When the kernel
 *                 has no loop and every load and store is at gid (plain
 *                 elementwise kernels), each thread takes V = 16 / (element
 *                 size) consecutive iterations with one 16-byte vector load
 *                 per buffer (float4, int4, double2), the scalar body V
 *                 times, and one vector store.
 *   row mode      iteration gid is one block (a row of softmax, a norm,
 *                 cross-entropy...): every loop at the iteration's top
 *                 level is spread over the block's threads (i = threadIdx.x;
 *                 i += blockDim.x), loops inside it run in each thread, and
 *                 after the loop each accumulator it updated is combined
 *                 over the block (warp shuffles, then 32 shared slots), so
 *                 every thread sees the row's value.  A __syncthreads after
 *                 every top-level loop and store orders the statistics
 *                 loops' reads of the row before the final loop's writes
 *                 (in place, docs/codegen.md) and any store before a later
 *                 loop's loads.  Top-level stores are thread 0's.
 *
 * Row mode is used when it is provably the same computation: the kernel
 * has a top-level loop, no accumulator is read inside a loop that updates
 * it, and no accumulator is updated outside loops.  Otherwise thread mode
 * (always correct).  Sums are reassociated (per-thread partials, then a
 * tree): a few ulp, as the LLVM backend's vector lanes. */
#include "cuda.h"
#include <math.h>

/* ---- the prelude (cuda.h) ---- */
static const char *const prelude =
    "/* Tessera CUDA module (codegen/cuda.c) */\n"
    "#ifndef TS_ARGS_DEFINED\n"
    "#define TS_ARGS_DEFINED\n"
    "typedef struct { void *b[32]; const long long *run; } TsArgs;\n"
    "#endif\n"
    "#define TS_NAN __longlong_as_double(0x7ff8000000000000LL)\n"
    "#define TS_INF __longlong_as_double(0x7ff0000000000000LL)\n"
    "static __device__ __forceinline__ double ts_maximum(double a, double b) {\n"
    "  return a != a || b != b ? TS_NAN : a > b ? a : b;\n"
    "}\n"
    "static __device__ __forceinline__ int ts_to_i32(double x) {\n"
    "  return x != x ? 0 : x >= 2147483647.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;\n"
    "}\n"
    "static __device__ __forceinline__ long long ts_to_i64(double x) {\n"
    "  return x != x ? 0 : x >= 9223372036854775807.0 ? 9223372036854775807LL\n"
    "       : x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (long long)x;\n"
    "}\n"
    "/* Sum / NaN-propagating max over the block, returned to every thread.\n"
    " * Every thread of the block must call it (it has barriers). */\n"
    "static __device__ __forceinline__ double ts_warp_sum(double v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n"
    "static __device__ __forceinline__ double ts_warp_max(double v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = ts_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "static __device__ double ts_block_sum(double v) {\n"
    "  __shared__ double ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;\n"
    "  v = ts_warp_sum(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_sum(lane < nw ? ts_part[lane] : 0.0);\n"
    "}\n"
    "static __device__ double ts_block_max(double v) {\n"
    "  __shared__ double ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;\n"
    "  v = ts_warp_max(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_max(lane < nw ? ts_part[lane] : -TS_INF);\n"
    "}\n";

const char *cg_cuda_prelude(void) { return prelude; }

static const char *cu_type(CgType t) {
  switch (t) {
  case CG_I1: return "int";
  case CG_I32: return "int";
  case CG_I64: return "long long";
  case CG_F32: return "float";
  case CG_F64: return "double";
  default: return "void";
  }
}

static void cu_float(StrBuf *out, CgType t, double v) {
  if (isnan(v)) sb_puts(out, t == CG_F32 ? "(float)TS_NAN" : "TS_NAN");
  else if (isinf(v)) sb_puts(out, v > 0 ? (t == CG_F32 ? "(float)TS_INF" : "TS_INF") : (t == CG_F32 ? "-(float)TS_INF" : "-TS_INF"));
  else {
    char b[40];
    ts_fmt_double(b, sizeof b, v);
    /* a literal the C++ parser reads as floating point */
    int has = strpbrk(b, ".eEn") != NULL;
    sb_printf(out, "%s%s%s", b, has ? "" : ".0", t == CG_F32 ? "f" : "");
  }
}

/* The expression of a value instruction; `ld` prints a LOAD (the vector
 * mode reads lanes instead of memory). */
static void cu_expr(const CgKernel *k, int i, StrBuf *out, int vec) {
  const CgInst *in = &k->code.a[i];
  const CgInst *a0 = in->a[0] >= 0 ? &k->code.a[in->a[0]] : NULL;
  int fl = a0 && cg_type_is_float(a0->type), f32 = a0 && a0->type == CG_F32;
  const char *fs = f32 ? "f" : "";
  int x = in->a[0], y = in->a[1];
  switch (in->op) {
  case CG_CONST:
    if (cg_type_is_float(in->type)) cu_float(out, in->type, in->f);
    else if (in->i == INT64_MIN) sb_puts(out, "(-9223372036854775807LL - 1)");
    else sb_printf(out, "%lldLL", (long long)in->i);
    return;
  case CG_LOAD:
    if (vec) sb_printf(out, "l%d[lane]", in->buf);
    else sb_printf(out, "b%d[v%d]", in->buf, x);
    return;
  case CG_NEG: sb_printf(out, "-v%d", x); return;
  case CG_EXP: sb_printf(out, "exp%s(v%d)", fs, x); return;
  case CG_LOG: sb_printf(out, "log%s(v%d)", fs, x); return;
  case CG_SQRT: sb_printf(out, "sqrt%s(v%d)", fs, x); return;
  case CG_RSQRT: sb_printf(out, "1 / sqrt%s(v%d)", fs, x); return;   /* as the CPU backends: no rsqrt approximation */
  case CG_TANH: sb_printf(out, "tanh%s(v%d)", fs, x); return;
  case CG_ERF: sb_printf(out, "erf%s(v%d)", fs, x); return;
  case CG_ADD:
  case CG_SUB:
  case CG_MUL: {
    const char *o = in->op == CG_ADD ? "+" : in->op == CG_SUB ? "-" : "*";
    if (fl) sb_printf(out, "v%d %s v%d", x, o, y);
    else if (a0->type == CG_I64) sb_printf(out, "(long long)((unsigned long long)v%d %s (unsigned long long)v%d)", x, o, y);
    else sb_printf(out, "(int)((unsigned)v%d %s (unsigned)v%d)", x, o, y);
    return;
  }
  case CG_DIV: sb_printf(out, "v%d / v%d", x, y); return;
  case CG_MOD: sb_printf(out, "v%d %% v%d", x, y); return;
  case CG_XOR: sb_printf(out, "v%d ^ v%d", x, y); return;
  case CG_SHR:
    if (a0->type == CG_I64) sb_printf(out, "(long long)((unsigned long long)v%d >> v%d)", x, y);
    else sb_printf(out, "(int)((unsigned)v%d >> v%d)", x, y);
    return;
  case CG_PARAM: sb_printf(out, "a.run[%lld]", (long long)in->i); return;
  case CG_MAX:
  case CG_MIN:
    if (fl) sb_printf(out, "f%s%s(v%d, v%d)", in->op == CG_MAX ? "max" : "min", fs, x, y);
    else sb_printf(out, "v%d %s v%d ? v%d : v%d", x, in->op == CG_MAX ? ">" : "<", y, x, y);
    return;
  case CG_LT: sb_printf(out, "v%d < v%d", x, y); return;
  case CG_LE: sb_printf(out, "v%d <= v%d", x, y); return;
  case CG_EQ: sb_printf(out, "v%d == v%d", x, y); return;
  case CG_NE: sb_printf(out, "v%d != v%d", x, y); return;
  case CG_AND: sb_printf(out, "v%d && v%d", x, y); return;
  case CG_OR: sb_printf(out, "v%d || v%d", x, y); return;
  case CG_SELECT: sb_printf(out, "v%d ? v%d : v%d", x, y, in->a[2]); return;
  case CG_CAST:
    if (fl && (in->type == CG_I32 || in->type == CG_I64))
      sb_printf(out, "ts_to_%s(v%d)", in->type == CG_I32 ? "i32" : "i64", x);
    else if (fl && in->type == CG_I1) sb_printf(out, "v%d != 0", x);
    else sb_printf(out, "(%s)v%d", cu_type(in->type), x);
    return;
  default: TS_DIE("cuda: %s has no expression", cg_op_names[in->op]);
  }
}

static const int nargs[CG_OP_COUNT] = {
#define X(name, text, n) n,
    CG_OPS(X)
#undef X
};

/* The END matching the RANGE at i. */
static int loop_end(const CgKernel *k, int i) {
  int d = 0;
  for (int u = i; u < k->code.n; u++) {
    d += k->code.a[u].op == CG_RANGE ? 1 : k->code.a[u].op == CG_END ? -1 : 0;
    if (d == 0) return u;
  }
  return k->code.n - 1;
}

static void indent(StrBuf *out, int d) {
  for (int i = 0; i < d; i++) sb_puts(out, "  ");
}

/* ---- the mode ---- */

/* Whether row mode computes the same as one thread per iteration (see the
 * header); *threads gets the block size for the loops' trip counts. */
static int row_mode_ok(const CgKernel *k, int *threads) {
  int n = k->code.n, depth = 0, top_loops = 0;
  int64_t most = 0;
  int *loop_of = ts_xcalloc((size_t)(n ? n : 1), sizeof *loop_of);  /* per inst: the top-level RANGE it is in, or -1 */
  int cur = -1, ok = 1;
  for (int i = 0; i < n; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op == CG_RANGE) {
      if (depth == 0) {
        cur = i;
        top_loops++;
        const CgInst *c = &k->code.a[in->a[0]];
        if (c->op == CG_CONST && c->i > most) most = c->i;
        else if (c->op != CG_CONST) most = 1 << 30;
      }
      depth++;
    } else if (in->op == CG_END) {
      if (--depth == 0) cur = -1;
    }
    loop_of[i] = in->op == CG_RANGE && depth == 1 ? -1 : cur;
  }
  if (top_loops == 0) ok = 0;
  for (int i = 0; i < n && ok; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op == CG_UPDATE) {
      if (loop_of[in->a[0]] < 0 && loop_of[i] < 0) ok = 0;   /* a top-level accumulator updated outside loops */
      continue;
    }
    /* a top-level accumulator read inside a loop that updates it */
    for (int j = 0; j < nargs[in->op] && ok; j++) {
      int a = in->a[j];
      if (a < 0 || k->code.a[a].op != CG_ACC || loop_of[a] >= 0 || loop_of[i] < 0) continue;
      for (int u = 0; u < n; u++)
        if (k->code.a[u].op == CG_UPDATE && k->code.a[u].a[0] == a && loop_of[u] == loop_of[i]) ok = 0;
    }
  }
  free(loop_of);
  if (most <= 0) most = 1;
  int t = most >= 256 ? 256 : (int)((most + 31) / 32 * 32);
  *threads = t < 32 ? 32 : t;
  return ok;
}

/* Whether every access is at gid with no loops, every buffer has grid
 * elements of one size, and the grid divides into 16-byte vectors: the
 * vector width (4 or 2), else 0. */
static int vector_width(const CgKernel *k) {
  int gid = -1;
  size_t es = 0;
  for (int i = 0; i < k->code.n; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op == CG_GID) gid = i;
    if (in->op == CG_RANGE || in->op == CG_ACC) return 0;
    if ((in->op == CG_LOAD || in->op == CG_STORE) && (gid < 0 || in->a[0] != gid)) return 0;
  }
  for (int b = 0; b < k->nbuf; b++) {
    size_t s = k->buf[b].type == CG_F64 ? 8 : 4;
    if (k->buf[b].n != k->grid || (es && s != es)) return 0;
    es = s;
  }
  if (!es) return 0;
  int v = (int)(16 / es);
  return k->grid % v == 0 && k->grid >= v ? v : 0;
}

static const char *vec_type(CgType t) {
  return t == CG_F64 ? "double2" : t == CG_F32 ? "float4" : "int4";
}

/* The body of one iteration: every instruction but GID (printed by the
 * caller).  row: top-level loops spread over the block, accumulators
 * combined after them, top-level stores by thread 0.  vec: loads and
 * stores through the lane arrays. */
static void body(const CgKernel *k, StrBuf *out, int base, int row, int vec) {
  int depth = 0;
  int n = k->code.n;
  for (int i = 0; i < n; i++) {
    const CgInst *in = &k->code.a[i];
    int d = base + depth - (in->op == CG_END);
    switch (in->op) {
    case CG_GID:
      indent(out, d);
      sb_printf(out, "const long long v%d = gid;\n", i);
      break;
    case CG_RANGE:
      indent(out, d);
      if (row && depth == 0) {
        /* accumulators summed in this loop start from 0 in every thread
         * but the first (the block sum adds the partials once) */
        int e = loop_end(k, i);
        for (int u = i + 1; u < e; u++) {
          const CgInst *up = &k->code.a[u];
          if (up->op == CG_UPDATE && up->a[0] < i && k->code.a[up->a[0]].red == CG_RED_SUM) {
            sb_printf(out, "if (threadIdx.x != 0) v%d = 0;\n", up->a[0]);
            indent(out, d);
          }
        }
        sb_printf(out, "for (long long v%d = threadIdx.x; v%d < v%d; v%d += blockDim.x) {\n", i, i, in->a[0], i);
      } else {
        sb_printf(out, "for (long long v%d = 0; v%d < v%d; v%d++) {\n", i, i, in->a[0], i);
      }
      depth++;
      break;
    case CG_END: {
      depth--;
      indent(out, d);
      sb_puts(out, "}\n");
      if (row && depth == 0) {
        /* combine the accumulators this loop updated (top-level ones) */
        int start = i;
        while (start > 0 && !(k->code.a[start].op == CG_RANGE && loop_end(k, start) == i)) start--;
        int done[64], nd = 0;
        for (int u = start; u < i; u++) {
          const CgInst *up = &k->code.a[u];
          if (up->op != CG_UPDATE || up->a[0] >= start) continue;
          int dup = 0;
          for (int q = 0; q < nd; q++) dup |= done[q] == up->a[0];
          if (dup || nd == 64) continue;
          done[nd++] = up->a[0];
          const CgInst *acc = &k->code.a[up->a[0]];
          indent(out, d);
          sb_printf(out, "v%d = (%s)ts_block_%s((double)v%d);\n", up->a[0], cu_type(acc->type),
                    acc->red == CG_RED_SUM ? "sum" : "max", up->a[0]);
        }
        indent(out, d);
        sb_puts(out, "__syncthreads();\n");
      }
      break;
    }
    case CG_ACC:
      indent(out, d);
      sb_printf(out, "%s v%d = ", cu_type(in->type), i);
      cu_float(out, in->type, in->f);
      sb_puts(out, ";\n");
      break;
    case CG_UPDATE:
      indent(out, d);
      if (k->code.a[in->a[0]].red == CG_RED_SUM) sb_printf(out, "v%d += v%d;\n", in->a[0], in->a[1]);
      else sb_printf(out, "v%d = ts_maximum(v%d, v%d);\n", in->a[0], in->a[0], in->a[1]);
      break;
    case CG_STORE:
      indent(out, d);
      if (vec) sb_printf(out, "s%d[lane] = v%d;\n", in->buf, in->a[1]);
      else if (row && depth == 0)
        sb_printf(out, "if (threadIdx.x == 0) b%d[v%d] = v%d;\n", in->buf, in->a[0], in->a[1]);
      else sb_printf(out, "b%d[v%d] = v%d;\n", in->buf, in->a[0], in->a[1]);
      if (row && depth == 0) {
        indent(out, d);
        sb_puts(out, "__syncthreads();\n");
      }
      break;
    default:
      indent(out, d);
      sb_printf(out, "const %s v%d = ", cu_type(in->type), i);
      cu_expr(k, i, out, vec);
      sb_puts(out, ";\n");
      break;
    }
  }
}

int cg_kernel_cuda_text(const CgKernel *k, StrBuf *out, CgCudaLaunch *l, char *err, size_t errlen) {
  if (cg_kernel_verify(k, err, errlen) != 0) return -1;
  if (k->nbuf > CG_CUDA_MAX_BUFS) return ts_errf(err, errlen, "kernel %s has %d buffers (at most %d)", k->name, k->nbuf, CG_CUDA_MAX_BUFS);
  memset(l, 0, sizeof *l);
  snprintf(l->name, sizeof l->name, "%s", k->name);
  int threads = 256, row = row_mode_ok(k, &threads);
  int vec = row ? 0 : vector_width(k);
  int64_t space = vec ? k->grid / vec : k->grid;
  l->threads = row ? threads : 256;
  l->blocks = row ? space : (space + 255) / 256;
  if (l->blocks > 65535LL * 32) l->blocks = 65535LL * 32;   /* the loops below cover the rest */
  if (l->blocks < 1) l->blocks = 1;

  sb_printf(out, "\n/* %s mode, grid = %lld iterations%s */\n", row ? "row" : "thread", (long long)k->grid,
            vec == 4 ? ", 16-byte vectors of 4" : vec == 2 ? ", 16-byte vectors of 2" : "");
  sb_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d) %s(TsArgs a) {\n", l->threads, k->name);
  for (int b = 0; b < k->nbuf; b++) {
    const char *t = cu_type(k->buf[b].type);
    sb_printf(out, "  %s%s *__restrict__ b%d = (%s%s *)a.b[%d];\n", k->buf[b].written ? "" : "const ", t, b,
              k->buf[b].written ? "" : "const ", t, b);
  }
  if (row) {
    sb_printf(out, "  for (long long gid = blockIdx.x; gid < %lldLL; gid += gridDim.x) {\n", (long long)k->grid);
    body(k, out, 2, 1, 0);
    sb_puts(out, "  }\n}\n");
  } else if (vec) {
    sb_printf(out, "  for (long long vg = blockIdx.x * (long long)blockDim.x + threadIdx.x; vg < %lldLL;\n"
                   "       vg += (long long)gridDim.x * blockDim.x) {\n", (long long)space);
    for (int b = 0; b < k->nbuf; b++) {
      const char *t = cu_type(k->buf[b].type), *vt = vec_type(k->buf[b].type);
      int loaded = 0;
      for (int i = 0; i < k->code.n; i++) loaded |= k->code.a[i].op == CG_LOAD && k->code.a[i].buf == b;
      if (loaded) {
        sb_printf(out, "    const %s q%d = ((const %s *)b%d)[vg];\n", vt, b, vt, b);
        if (vec == 4) sb_printf(out, "    const %s l%d[4] = {q%d.x, q%d.y, q%d.z, q%d.w};\n", t, b, b, b, b, b);
        else sb_printf(out, "    const %s l%d[2] = {q%d.x, q%d.y};\n", t, b, b, b);
      }
      if (k->buf[b].written) sb_printf(out, "    %s s%d[%d];\n", t, b, vec);
    }
    sb_printf(out, "    for (int lane = 0; lane < %d; lane++) {\n      const long long gid = vg * %d + lane;\n", vec, vec);
    body(k, out, 3, 0, 1);
    sb_puts(out, "    }\n");
    for (int b = 0; b < k->nbuf; b++) {
      if (!k->buf[b].written) continue;
      const char *vt = vec_type(k->buf[b].type);
      if (vec == 4) sb_printf(out, "    ((%s *)b%d)[vg] = make_%s(s%d[0], s%d[1], s%d[2], s%d[3]);\n", vt, b, vt, b, b, b, b);
      else sb_printf(out, "    ((%s *)b%d)[vg] = make_%s(s%d[0], s%d[1]);\n", vt, b, vt, b, b);
    }
    sb_puts(out, "  }\n}\n");
  } else {
    sb_printf(out, "  for (long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x; gid < %lldLL;\n"
                   "       gid += (long long)gridDim.x * blockDim.x) {\n", (long long)k->grid);
    body(k, out, 2, 0, 0);
    sb_puts(out, "  }\n}\n");
  }
  return 0;
}
