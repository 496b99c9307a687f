/* cuda.c - the kernel IR as CUDA C (cg_kernel_cuda_text, cuda.h) and the
 * prelude every CUDA module starts with: the C printer (cprint.c) with the
 * parallel space mapped onto the GPU.  docs/cuda.md, "The printer".
 *
 * Every instruction prints as in cprint.c (one `const` local each,
 * accumulators plain locals, RANGE a for loop, integer add / sub / mul
 * through unsigned types so they wrap, the same NaN and saturation rules).
 * Buffer pointers are __restrict__ unless the buffer may share memory with
 * another (may_share).  What changes is who runs an iteration:
 *
 *   thread mode   iteration gid is one thread: a grid-stride loop over
 *                 blockIdx.x * blockDim.x + threadIdx.x.  Vector form: when
 *                 the kernel has no loop, every store and every load is at
 *                 gid (loads may also be at constant indices: AdamW's
 *                 scalars), the buffers accessed at gid have one element
 *                 size and at least grid elements, and V = 16 / size
 *                 divides grid, each thread takes V consecutive iterations:
 *                 one 16-byte load per buffer (float4, int4, double2), the
 *                 scalar body V times on the lanes, one 16-byte store.
 *   row mode      iteration gid is one block (a row of softmax, a norm,
 *                 cross-entropy...): every loop at the iteration's top
 *                 level is spread over the block's threads (i = threadIdx.x;
 *                 i += blockDim.x), loops inside it run in each thread, and
 *                 after the loop each accumulator it updated is combined
 *                 over the block (warp shuffles, then 32 shared slots), so
 *                 every thread sees the row's value.  Top-level stores are
 *                 thread 0's.  __syncthreads orders the row's reads before
 *                 its writes where threads may touch the same element (an
 *                 output may share memory with an input: in place,
 *                 docs/codegen.md).
 *
 * Row mode is used only when it provably computes what one thread per
 * iteration computes (row_mode below); otherwise thread mode, always
 * correct.  Sums are reassociated (per-thread partials, then a tree): a
 * few ulp of f64, as the LLVM backend's vector lanes. */
#include "cuda.h"
#include <math.h>

/* ---- the prelude (cuda.h) ---- */
static const char *const prelude =
    "/* Tessera CUDA module (codegen/cuda.c) */\n"
    "#ifndef TS_ARGS_DEFINED\n"
    "#define TS_ARGS_DEFINED\n"
    "typedef struct { void *b[32]; const long long *run; } TsArgs;\n"
    "#endif\n"
    "typedef long long ts_i64;\n"
    "typedef unsigned long long ts_u64;\n"
    "#define TS_NAN __longlong_as_double(0x7ff8000000000000LL)\n"
    "#define TS_INF __longlong_as_double(0x7ff0000000000000LL)\n"
    "/* the max accumulator: a NaN operand wins (the binary max / min\n"
    " * instructions are fmax / fmin: the non-NaN operand wins) */\n"
    "static __device__ __forceinline__ double ts_maximum(double a, double b) {\n"
    "  return a != a || b != b ? TS_NAN : a > b ? a : b;\n"
    "}\n"
    "/* float -> int casts saturate, NaN -> 0 */\n"
    "static __device__ __forceinline__ int ts_to_i32(double x) {\n"
    "  return x != x ? 0 : x >= 2147483647.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;\n"
    "}\n"
    "static __device__ __forceinline__ long long ts_to_i64(double x) {\n"
    "  return x != x ? 0 : x >= 9223372036854775807.0 ? 9223372036854775807LL\n"
    "       : x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (long long)x;\n"
    "}\n"
    "/* sums and NaN-propagating maxima over a warp (every lane gets the\n"
    " * result) and over the block (every thread gets it; every thread of the\n"
    " * block must call: it has barriers; blockDim.x a multiple of 32) */\n"
    "static __device__ __forceinline__ double ts_warp_sum(double v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n"
    "static __device__ __forceinline__ float ts_warp_sumf(float v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "  return v;\n"
    "}\n"
    "static __device__ __forceinline__ double ts_warp_max(double v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = ts_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "static __device__ __forceinline__ float ts_warp_maxf(float v) {\n"
    "  for (int o = 16; o > 0; o >>= 1) v = (float)ts_maximum(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "static __device__ __forceinline__ double ts_block_sum(double v) {\n"
    "  __shared__ double ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "  v = ts_warp_sum(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_sum(lane < nw ? ts_part[lane] : 0.0);\n"
    "}\n"
    "static __device__ __forceinline__ float ts_block_sumf(float v) {\n"
    "  __shared__ float ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "  v = ts_warp_sumf(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_sumf(lane < nw ? ts_part[lane] : 0.0f);\n"
    "}\n"
    "static __device__ __forceinline__ double ts_block_max(double v) {\n"
    "  __shared__ double ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "  v = ts_warp_max(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_max(lane < nw ? ts_part[lane] : -TS_INF);\n"
    "}\n"
    "static __device__ __forceinline__ float ts_block_maxf(float v) {\n"
    "  __shared__ float ts_part[32];\n"
    "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    "  v = ts_warp_maxf(v);\n"
    "  __syncthreads();\n"
    "  if (lane == 0) ts_part[w] = v;\n"
    "  __syncthreads();\n"
    "  return ts_warp_maxf(lane < nw ? ts_part[lane] : -(float)TS_INF);\n"
    "}\n";

const char *cg_cuda_prelude(void) { return prelude; }

static const int nargs[CG_OP_COUNT] = {
#define X(name, text, n) n,
    CG_OPS(X)
#undef X
};

/* What the printer knows about a kernel. */
typedef struct {
  const CgKernel *k;
  int n;            /* instructions */
  int *top;         /* per instruction: the top-level RANGE whose loop holds it, -1 at top level
                       (a top-level RANGE and its END are at top level) */
  int *match;       /* RANGE -> its END, END -> its RANGE */
  int *mark;        /* scratch, one per instruction */
  int gid;          /* the GID instruction, -1 if none */
  int row;          /* row mode */
  int threads;      /* row mode: the block size */
  int vec;          /* thread mode: vector width (4 or 2), or 0 */
  int lane;         /* while printing a vector lane: its number */
} Cu;

static void cu_init(Cu *c, const CgKernel *k) {
  memset(c, 0, sizeof *c);
  c->k = k;
  c->n = k->code.n;
  size_t n = (size_t)(c->n ? c->n : 1);
  c->top = ts_xcalloc(n, sizeof *c->top);
  c->match = ts_xcalloc(n, sizeof *c->match);
  c->mark = ts_xcalloc(n, sizeof *c->mark);
  c->gid = -1;
  int stack[512], sp = 0, cur = -1;   /* loop nesting is shallow (the verifier checked balance) */
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = &k->code.a[i];
    c->match[i] = -1;
    if (in->op == CG_GID && c->gid < 0) c->gid = i;
    if (in->op == CG_END) {
      int r = sp > 0 ? stack[--sp] : 0;
      c->match[i] = r;
      c->match[r] = i;
      if (sp == 0) cur = -1;
    }
    c->top[i] = cur;
    if (in->op == CG_RANGE) {
      if (sp == 0) cur = i;
      TS_ASSERT(sp < (int)(sizeof stack / sizeof *stack));
      stack[sp++] = i;
    }
  }
}

static void cu_free(Cu *c) {
  free(c->top);
  free(c->match);
  free(c->mark);
}

static const CgInst *ins(const Cu *c, int i) { return &c->k->code.a[i]; }
static size_t elem_size(CgType t) { return t == CG_F64 ? 8 : 4; }
static int64_t buf_bytes(const CgBuf *b) { return b->n * (int64_t)elem_size(b->type); }

/* Whether value v depends on instruction r (through operands); uses mark
 * with stamp (distinct per query). */
static int depends(Cu *c, int v, int r, int stamp) {
  if (v == r) return 1;
  if (v < r || c->mark[v] == stamp) return 0;   /* operands are earlier than their users */
  c->mark[v] = stamp;
  const CgInst *in = ins(c, v);
  for (int j = 0; j < nargs[in->op]; j++)
    if (in->a[j] >= 0 && depends(c, in->a[j], r, stamp)) return 1;
  return 0;
}

/* ---- the mode ---- */

/* Row mode computes what one thread per iteration computes when:
 *   - the iteration has a top-level loop, long enough to spread (a
 *     constant trip count >= 16, or one known at run time);
 *   - no accumulator is updated outside loops (every thread would);
 *   - the top-level accumulators a top-level loop updates are floats (the
 *     block reductions are float sums and maxima), and none is read inside
 *     a loop that updates it (its value there is a partial);
 *   - inside a top-level loop, every store is at an index that depends on
 *     the loop's index (each element written by one thread), and every
 *     load of a buffer that may share memory with a stored one (the same
 *     buffer, or one of the same size: in place) is at the very index of
 *     each such store (so the thread that writes an element is the thread
 *     that reads it).
 * *threads gets the block size for the loops' trip counts. */
static int row_mode(Cu *c) {
  const CgKernel *k = c->k;
  int64_t most = 0;
  int loops = 0, stamp = 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = ins(c, i);
    if (in->op != CG_RANGE || c->top[i] >= 0) continue;
    loops++;
    const CgInst *t = ins(c, in->a[0]);
    int64_t trip = t->op == CG_CONST ? t->i : INT64_MAX;
    if (trip > most) most = trip;
  }
  if (loops == 0 || most < 16) return 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = ins(c, i);
    if (in->op == CG_UPDATE) {
      int a = in->a[0];
      if (c->top[i] < 0) return 0;
      if (c->top[a] < 0 && !cg_type_is_float(ins(c, a)->type)) return 0;
    }
    if (c->top[i] < 0) continue;
    for (int j = in->op == CG_UPDATE ? 1 : 0; j < nargs[in->op]; j++) {
      int a = in->a[j];
      if (a < 0 || ins(c, a)->op != CG_ACC || c->top[a] >= 0) continue;
      for (int u = c->top[i]; u < c->match[c->top[i]]; u++)
        if (ins(c, u)->op == CG_UPDATE && ins(c, u)->a[0] == a) return 0;
    }
    if (in->op == CG_STORE && !depends(c, in->a[0], c->top[i], ++stamp)) return 0;
    if (in->op != CG_LOAD) continue;
    const CgBuf *lb = &k->buf[in->buf];
    for (int u = c->top[i]; u < c->match[c->top[i]]; u++) {
      const CgInst *st = ins(c, u);
      if (st->op != CG_STORE) continue;
      const CgBuf *sb = &k->buf[st->buf];
      int alias = st->buf == in->buf || buf_bytes(sb) == buf_bytes(lb);
      if (alias && st->a[0] != in->a[0]) return 0;
    }
  }
  int64_t t = most >= 256 ? 256 : (most + 31) / 32 * 32;
  c->threads = t < 32 ? 32 : (int)t;
  return 1;
}

/* The vector width of a thread-mode kernel (see the header), or 0. */
static int vector_width(Cu *c) {
  const CgKernel *k = c->k;
  if (c->gid < 0) return 0;
  size_t es = 0;
  int stored = 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = ins(c, i);
    if (in->op == CG_RANGE || in->op == CG_ACC) return 0;
    if (in->op != CG_LOAD && in->op != CG_STORE) continue;
    const CgBuf *b = &k->buf[in->buf];
    const CgInst *ix = ins(c, in->a[0]);
    if (in->op == CG_STORE) stored = 1;
    else if (stored) return 0;   /* a load after a store would read the vector loaded before */
    if (in->a[0] != c->gid) {
      if (in->op == CG_STORE || ix->op != CG_CONST || ix->i < 0 || ix->i >= b->n) return 0;
      continue;
    }
    if (b->n < k->grid || (es && elem_size(b->type) != es)) return 0;
    es = elem_size(b->type);
  }
  if (!es) return 0;
  int v = (int)(16 / es);
  return k->grid >= v && k->grid % v == 0 ? v : 0;
}

/* Whether buffer b is loaded / stored at gid (vector mode's lanes). */
static int buf_at_gid(const Cu *c, int b, CgOp op) {
  for (int i = 0; i < c->n; i++)
    if (ins(c, i)->op == op && ins(c, i)->buf == b && ins(c, i)->a[0] == c->gid) return 1;
  return 0;
}

/* ---- printing ---- */

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

static const char *vec_type(CgType t) { return t == CG_F64 ? "double2" : t == CG_F32 ? "float4" : "int4"; }
static char lane_field(int lane) { return "xyzw"[lane]; }

static void cu_float(StrBuf *out, CgType t, double v) {
  const char *f = t == CG_F32 ? "f" : "";
  if (isnan(v)) sb_puts(out, t == CG_F32 ? "(float)TS_NAN" : "TS_NAN");
  else if (isinf(v)) sb_printf(out, "%s%s", v > 0 ? "" : "-", t == CG_F32 ? "(float)TS_INF" : "TS_INF");
  else {
    char b[40];
    ts_fmt_double(b, sizeof b, v);
    /* a literal C++ reads as floating point ("2" would be an int) */
    sb_printf(out, "%s%s%s", b, strpbrk(b, ".eE") ? "" : ".0", f);
  }
}

static void indent(StrBuf *out, int d) {
  for (int i = 0; i < d; i++) sb_puts(out, "  ");
}

/* The expression of value instruction i. */
static void cu_expr(const Cu *c, int i, StrBuf *out) {
  const CgInst *in = ins(c, i);
  const CgInst *a0 = nargs[in->op] > 0 && in->a[0] >= 0 ? ins(c, in->a[0]) : NULL;
  int fl = a0 && cg_type_is_float(a0->type), f32 = a0 && a0->type == CG_F32;
  const char *fs = f32 ? "f" : "";
  int x = in->a[0], y = in->a[1];
  switch (in->op) {
  case CG_CONST:
    if (cg_type_is_float(in->type)) cu_float(out, in->type, in->f);
    else if (in->i == INT64_MIN) sb_puts(out, "(-9223372036854775807LL - 1)");   /* not a literal */
    else sb_printf(out, "%lldLL", (long long)in->i);
    return;
  case CG_LOAD:
    if (c->vec && x == c->gid) sb_printf(out, "q%d.%c", in->buf, lane_field(c->lane));
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
    /* integers wrap (kir.h); signed overflow is undefined in C++, so through unsigned */
    if (fl) sb_printf(out, "v%d %s v%d", x, o, y);
    else if (a0->type == CG_I64)
      sb_printf(out, "(long long)((unsigned long long)v%d %s (unsigned long long)v%d)", x, o, y);
    else sb_printf(out, "(int)((unsigned)v%d %s (unsigned)v%d)", x, o, y);
    return;
  }
  case CG_DIV: sb_printf(out, "v%d / v%d", x, y); return;
  case CG_MOD: sb_printf(out, "v%d %% v%d", x, y); return;
  case CG_XOR: sb_printf(out, "v%d ^ v%d", x, y); return;
  case CG_SHR:   /* logical */
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
  case CG_NE: sb_printf(out, "v%d != v%d", x, y); return;   /* true for NaN, as the IR's ne */
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

/* Whether the top-level loop opened at r loads / stores memory. */
static int loop_has(const Cu *c, int r, CgOp op) {
  for (int u = r + 1; u < c->match[r]; u++)
    if (ins(c, u)->op == op) return 1;
  return 0;
}

/* Row mode, before the top-level loop at r: sums it updates start from 0
 * in every thread but thread 0 (the block sum then adds each partial and
 * the value before the loop once); maxima keep their value (idempotent). */
static void row_loop_open(Cu *c, StrBuf *out, int r, int d) {
  for (int u = r + 1; u < c->match[r]; u++) {
    const CgInst *up = ins(c, u);
    if (up->op != CG_UPDATE || c->top[up->a[0]] >= 0 || ins(c, up->a[0])->red != CG_RED_SUM) continue;
    if (c->mark[up->a[0]] == -r - 1) continue;   /* printed already */
    c->mark[up->a[0]] = -r - 1;
    int before = 0;   /* still at its start value 0 in every thread: nothing to do */
    for (int q = up->a[0]; q < r && !before; q++) before = ins(c, q)->op == CG_UPDATE && ins(c, q)->a[0] == up->a[0];
    if (!before && ins(c, up->a[0])->f == 0) continue;
    indent(out, d);
    sb_printf(out, "if (threadIdx.x != 0) v%d = 0;\n", up->a[0]);
  }
}

/* Row mode, after the END of the top-level loop at r: every top-level
 * accumulator it updated is combined over the block.  Returns whether
 * any was (the block reductions have barriers). */
static int row_loop_close(Cu *c, StrBuf *out, int r, int d) {
  int any = 0;
  for (int u = r + 1; u < c->match[r]; u++) {
    const CgInst *up = ins(c, u);
    if (up->op != CG_UPDATE || c->top[up->a[0]] >= 0) continue;
    if (c->mark[up->a[0]] == -r - 2 - c->n) continue;
    c->mark[up->a[0]] = -r - 2 - c->n;
    const CgInst *acc = ins(c, up->a[0]);
    indent(out, d);
    sb_printf(out, "v%d = ts_block_%s%s(v%d);\n", up->a[0], acc->red == CG_RED_SUM ? "sum" : "max",
              acc->type == CG_F32 ? "f" : "", up->a[0]);
    any = 1;
  }
  return any;
}

/* The body of one iteration at indentation base.  Row mode: top-level
 * loops spread over the block, accumulators combined after them,
 * top-level stores by thread 0, barriers between a thread's accesses and
 * another's to memory that may be the same (pl / ps: loads / stores by
 * any thread since the last barrier).  Vector mode: loads and stores at
 * gid through the lane c->lane of the vectors. */
static void body(Cu *c, StrBuf *out, int base) {
  int depth = 0, pl = 0, ps = 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = ins(c, i);
    int d = base + depth - (in->op == CG_END), top = c->row && depth == 0;
    if (top && (in->op == CG_LOAD || in->op == CG_STORE || in->op == CG_RANGE)) {
      int ld = in->op == CG_LOAD || (in->op == CG_RANGE && loop_has(c, i, CG_LOAD));
      int st = in->op == CG_STORE || (in->op == CG_RANGE && loop_has(c, i, CG_STORE));
      if ((ld && ps) || (st && (pl || ps))) {
        indent(out, d);
        sb_puts(out, "__syncthreads();\n");
        pl = ps = 0;
      }
      pl |= ld;
      ps |= st;
    }
    switch (in->op) {
    case CG_GID:
      indent(out, d);
      sb_printf(out, "const long long v%d = gid;\n", i);
      break;
    case CG_RANGE:
      if (top) {
        row_loop_open(c, out, i, d);
        indent(out, d);
        sb_printf(out, "for (long long v%d = threadIdx.x; v%d < v%d; v%d += blockDim.x) {\n", i, i, in->a[0], i);
      } else {
        indent(out, d);
        sb_printf(out, "for (long long v%d = 0; v%d < v%d; v%d++) {\n", i, i, in->a[0], i);
      }
      depth++;
      break;
    case CG_END:
      depth--;
      indent(out, d);
      sb_puts(out, "}\n");
      if (c->row && depth == 0 && row_loop_close(c, out, c->match[i], d)) pl = ps = 0;
      break;
    case CG_ACC:
      indent(out, d);
      sb_printf(out, "%s v%d = ", cu_type(in->type), i);
      if (cg_type_is_float(in->type)) cu_float(out, in->type, in->f);
      else sb_printf(out, "%lldLL", (long long)in->f);
      sb_puts(out, ";\n");
      break;
    case CG_UPDATE:
      indent(out, d);
      if (ins(c, in->a[0])->red == CG_RED_SUM) sb_printf(out, "v%d += v%d;\n", in->a[0], in->a[1]);
      else sb_printf(out, "v%d = ts_maximum(v%d, v%d);\n", in->a[0], in->a[0], in->a[1]);
      break;
    case CG_STORE:
      indent(out, d);
      if (c->vec) sb_printf(out, "s%d.%c = v%d;\n", in->buf, lane_field(c->lane), in->a[1]);
      else sb_printf(out, "%sb%d[v%d] = v%d;\n", top ? "if (threadIdx.x == 0) " : "", in->buf, in->a[0], in->a[1]);
      break;
    default:
      indent(out, d);
      sb_printf(out, "const %s v%d = ", cu_type(in->type), i);
      cu_expr(c, i, out);
      sb_puts(out, ";\n");
      break;
    }
  }
}

/* Whether buffer b may share memory with another buffer of k while one
 * of them is written: an output may be given the memory of an input of
 * its shape (in place, docs/codegen.md), so any two buffers of the same
 * byte size.  Such a pointer is not __restrict__: the compiler must keep
 * the order of its loads and the other's stores. */
static int may_share(const CgKernel *k, int b) {
  for (int o = 0; o < k->nbuf; o++)
    if (o != b && (k->buf[o].written || k->buf[b].written) && buf_bytes(&k->buf[o]) == buf_bytes(&k->buf[b])) return 1;
  return 0;
}

static int is_ident(const char *s) {
  if (!s[0] || (s[0] >= '0' && s[0] <= '9')) return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')) return 0;
  return 1;
}

int cg_kernel_cuda_text(const CgKernel *k, StrBuf *out, CgCudaLaunch *l, char *err, size_t errlen) {
  if (cg_kernel_verify(k, err, errlen) != 0) return -1;
  if (k->nbuf > CG_CUDA_MAX_BUFS)
    return ts_errf(err, errlen, "kernel %s has %d buffers (at most %d)", k->name, k->nbuf, CG_CUDA_MAX_BUFS);
  if (!is_ident(k->name) || strlen(k->name) >= sizeof l->name)
    return ts_errf(err, errlen, "kernel name '%s' is not a C identifier of at most %d characters", k->name,
                   (int)sizeof l->name - 1);
  if (k->nparam > CG_RUN_LR)
    return ts_errf(err, errlen, "kernel %s reads %d run-time scalars (the run block has %d)", k->name, k->nparam,
                   CG_RUN_LR);
  Cu c;
  cu_init(&c, k);
  c.row = row_mode(&c);
  for (int i = 0; i < c.n; i++) c.mark[i] = 0;
  c.vec = c.row ? 0 : vector_width(&c);
  int64_t space = c.vec ? k->grid / c.vec : k->grid;
  memset(l, 0, sizeof *l);
  snprintf(l->name, sizeof l->name, "%s", k->name);
  l->threads = c.row ? c.threads : 256;
  l->blocks = c.row ? space : (space + 255) / 256;
  if (l->blocks > 65535LL * 32) l->blocks = 65535LL * 32;   /* the grid-stride loops cover the rest */
  if (l->blocks < 1) l->blocks = 1;

  sb_printf(out, "\n/* %s: %s mode, grid = %lld iterations", k->name, c.row ? "row" : "thread", (long long)k->grid);
  if (c.vec) sb_printf(out, ", 16-byte vectors of %d", c.vec);
  sb_printf(out, "; launch %lld x %d */\n", (long long)l->blocks, l->threads);
  sb_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d) %s(TsArgs a) {\n", l->threads, k->name);
  for (int b = 0; b < k->nbuf; b++) {
    const char *cq = k->buf[b].written ? "" : "const ", *t = cu_type(k->buf[b].type);
    sb_printf(out, "  %s%s *%sb%d = (%s%s *)a.b[%d];\n", cq, t, may_share(k, b) ? "" : "__restrict__ ", b, cq, t, b);
  }
  if (c.row) {
    sb_printf(out, "  for (long long gid = blockIdx.x; gid < %lldLL; gid += gridDim.x) {\n", (long long)k->grid);
    body(&c, out, 2);
    sb_puts(out, "  }\n}\n");
  } else if (c.vec) {
    /* the vectors need 16-byte aligned buffers: the executor passes
     * buffer starts, but a ZeRO chunk of a parameter starts anywhere */
    sb_puts(out, "  if (((0");
    for (int b = 0; b < k->nbuf; b++)
      if (buf_at_gid(&c, b, CG_LOAD) || buf_at_gid(&c, b, CG_STORE)) sb_printf(out, " | (unsigned long long)b%d", b);
    sb_puts(out, ") & 15) == 0) {\n");
    sb_printf(out, "  for (long long vg = blockIdx.x * (long long)blockDim.x + threadIdx.x; vg < %lldLL;\n"
                   "       vg += (long long)gridDim.x * blockDim.x) {\n", (long long)space);
    for (int b = 0; b < k->nbuf; b++) {
      const char *vt = vec_type(k->buf[b].type);
      if (buf_at_gid(&c, b, CG_LOAD)) sb_printf(out, "    const %s q%d = ((const %s *)b%d)[vg];\n", vt, b, vt, b);
      if (buf_at_gid(&c, b, CG_STORE)) sb_printf(out, "    %s s%d;\n", vt, b);
    }
    for (c.lane = 0; c.lane < c.vec; c.lane++) {
      sb_printf(out, "    {\n      const long long gid = vg * %d + %d;\n", c.vec, c.lane);
      body(&c, out, 3);
      sb_puts(out, "    }\n");
    }
    for (int b = 0; b < k->nbuf; b++)
      if (buf_at_gid(&c, b, CG_STORE)) sb_printf(out, "    ((%s *)b%d)[vg] = s%d;\n", vec_type(k->buf[b].type), b, b);
    sb_puts(out, "  }\n  } else {\n");
    c.vec = 0;
    sb_printf(out, "  for (long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x; gid < %lldLL;\n"
                   "       gid += (long long)gridDim.x * blockDim.x) {\n", (long long)k->grid);
    body(&c, out, 2);
    sb_puts(out, "  }\n  }\n}\n");
  } else {
    sb_printf(out, "  for (long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x; gid < %lldLL;\n"
                   "       gid += (long long)gridDim.x * blockDim.x) {\n", (long long)k->grid);
    body(&c, out, 2);
    sb_puts(out, "  }\n}\n");
  }
  cu_free(&c);
  return 0;
}
