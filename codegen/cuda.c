/* cuda.c - the kernel IR as CUDA C (cg_kernel_cuda_text, cuda.h) and the
 * prelude every CUDA module starts with: the CUDA dialect of the kernel
 * printer (kprint.h), with the parallel space mapped onto the GPU.
 * docs/cuda.md, "The printer".
 *
 * The body of an iteration prints as in C (kprint.c), in CUDA's spelling
 * (cuda_dialect: long long, no <stdint.h> in NVRTC, the prelude's ts_
 * helpers, NaN / infinity from their bits).  Buffer pointers are
 * __restrict__ unless the buffer may share memory with another
 * (may_share).  What changes is who runs an iteration:
 *
 *   thread mode   iteration gid is one thread: a grid-stride loop over
 *                 blockIdx.x * blockDim.x + threadIdx.x.  Vector form: when
 *                 the kernel has no loop, every store and every load is at
 *                 gid (loads may also be at constant indices: AdamW's
 *                 scalars), the buffers accessed at gid have one element
 *                 size and at least grid elements, and V = 16 / size
 *                 (bf16: 4) divides grid, each thread takes V consecutive
 *                 iterations: one 16-byte load per buffer (float4, int4,
 *                 double2; bf16 an 8-byte ushort4), the scalar body V
 *                 times on the lanes, one vector store.
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
#include "kprint.h"

/* ---- the prelude (cuda.h) ---- */
#define TS_STR_(x) #x
#define TS_STR(x) TS_STR_(x)
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
    "/* bf16 <-> f32 as runtime/cpu/half.h: up, the bits in the top half;\n"
    " * down, to nearest even on the 16 dropped bits, a NaN kept quiet */\n"
    "static __device__ __forceinline__ float ts_bf16_f32(unsigned short h) {\n"
    "  return __uint_as_float((unsigned)h << 16);\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short ts_f32_bf16(float f) {\n"
    "  unsigned u = __float_as_uint(f);\n"
    "  return (unsigned short)((f != f ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "/* f16 (IEEE binary16) <-> f32 as runtime/cpu/half.h: up exact (subnormals\n"
    " * m 2^-24); down to nearest even, subnormals kept (rintf rounds to even),\n"
    " * 65520 and up to inf, every NaN the quiet 0x7e00 with its sign */\n"
    "static __device__ __forceinline__ float ts_f16_f32(unsigned short h) {\n"
    "  unsigned s = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  if (e == 0) { float r = (float)m * 5.9604644775390625e-8f; return s ? -r : r; }\n"
    "  return __uint_as_float(e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112u) << 23) | (m << 13));\n"
    "}\n"
    "static __device__ __forceinline__ unsigned short ts_f32_f16(float f) {\n"
    "  unsigned x = __float_as_uint(f), ax = x & 0x7fffffffu;\n"
    "  unsigned short s = (unsigned short)((x >> 16) & 0x8000u);\n"
    "  if (ax > 0x7f800000u) return s | 0x7e00u;\n"
    "  if (ax >= 0x477ff000u) return s | 0x7c00u;\n"
    "  if (ax < 0x38800000u) return s | (unsigned short)rintf(__uint_as_float(ax) * 16777216.0f);\n"
    "  unsigned m = ax - 0x38000000u;\n"
    "  return s | (unsigned short)((m + 0xfffu + ((m >> 13) & 1u)) >> 13);\n"
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
    "}\n"
    "/* split rows (codegen/cuda.c): the partials of a row's blocks and the\n"
    " * ticket that tells the last one; the last block resets its row's ticket */\n"
    "static __device__ double ts_split_part[" TS_STR(CG_CUDA_SPLIT_PARTS) "];\n"
    "static __device__ unsigned long long ts_split_ticket[" TS_STR(CG_CUDA_SPLIT_ROWS) "];\n";

const char *cg_cuda_prelude(void) { return prelude; }

/* ---- what CUDA spells its own way inside an iteration (kprint.h) ---- */
static const CgDialect cuda_dialect = {
    .type = {"void", "int", "int", "long long", "float", "double", "unsigned short", "unsigned short"},   /* in CgType's order */
    .u32 = "unsigned", .u64 = "unsigned long long", .i64_min = "(-9223372036854775807LL - 1)", .narrow = 1,
    .helper = "ts_", .param = "a.run",
    .nan_f32 = "(float)TS_NAN", .nan_f64 = "TS_NAN", .inf_f32 = "(float)TS_INF", .inf_f64 = "TS_INF"};

static size_t elem_size(CgType t) { return t == CG_F64 ? 8 : cg_type_is_half(t) ? 2 : 4; }
static int64_t buf_bytes(const CgBuf *b) { return b->n * (int64_t)elem_size(b->type); }

/* Whether value v depends on instruction r (through operands); uses mark
 * with stamp (distinct per query). */
static int depends(CgKp *c, int v, int r, int stamp) {
  if (v == r) return 1;
  if (v < r || c->mark[v] == stamp) return 0;   /* operands are earlier than their users */
  c->mark[v] = stamp;
  const CgInst *in = cg_kp_ins(c, v);
  for (int j = 0; j < cg_op_nargs[in->op]; j++)
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
static int row_mode(CgKp *c, int *threads) {
  const CgKernel *k = c->k;
  int64_t most = 0;
  int loops = 0, stamp = 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = cg_kp_ins(c, i);
    if (in->op != CG_RANGE || c->top[i] >= 0) continue;
    loops++;
    const CgInst *t = cg_kp_ins(c, in->a[0]);
    int64_t trip = t->op == CG_CONST ? t->i : INT64_MAX;
    if (trip > most) most = trip;
  }
  if (loops == 0 || most < 16) return 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = cg_kp_ins(c, i);
    if (in->op == CG_UPDATE) {
      int a = in->a[0];
      if (c->top[i] < 0) return 0;
      if (c->top[a] < 0 && !cg_type_is_float(cg_kp_ins(c, a)->type)) return 0;
    }
    if (c->top[i] < 0) continue;
    for (int j = in->op == CG_UPDATE ? 1 : 0; j < cg_op_nargs[in->op]; j++) {
      int a = in->a[j];
      if (a < 0 || cg_kp_ins(c, a)->op != CG_ACC || c->top[a] >= 0) continue;
      for (int u = c->top[i]; u < c->match[c->top[i]]; u++)
        if (cg_kp_ins(c, u)->op == CG_UPDATE && cg_kp_ins(c, u)->a[0] == a) return 0;
    }
    if (in->op == CG_STORE && !depends(c, in->a[0], c->top[i], ++stamp)) return 0;
    if (in->op != CG_LOAD) continue;
    const CgBuf *lb = &k->buf[in->buf];
    for (int u = c->top[i]; u < c->match[c->top[i]]; u++) {
      const CgInst *st = cg_kp_ins(c, u);
      if (st->op != CG_STORE) continue;
      const CgBuf *sb = &k->buf[st->buf];
      int alias = st->buf == in->buf || buf_bytes(sb) == buf_bytes(lb);
      if (alias && st->a[0] != in->a[0]) return 0;
    }
  }
  int64_t t = most >= 256 ? 256 : (most + 31) / 32 * 32;
  *threads = t < 32 ? 32 : (int)t;
  return 1;
}

/* Split rows: a row-mode kernel of few rows (at most CG_CUDA_SPLIT_ROWS),
 * each a long reduction, runs each row on S blocks instead of one (one
 * block of 256 threads reads a whole tensor at a few GB/s: the gradient
 * norm's sums of squares).  Valid when the iteration has exactly one
 * top-level loop, with a constant trip count, that stores nothing (its
 * accumulators are all it leaves), and no store comes before it: then each
 * block sums a strided part of the loop, and what follows the loop needs
 * only the combined accumulators, which the last block computes
 * (kprint.c, split_combine).  Returns S (>= 2), or 0: plain row mode. */
static int64_t split_blocks(CgKp *c, int threads) {
  const CgKernel *k = c->k;
  if (k->grid > CG_CUDA_SPLIT_ROWS) return 0;
  int range = -1, nacc = 0, stamp = -1000000;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = cg_kp_ins(c, i);
    if (in->op == CG_RANGE && c->top[i] < 0) {
      if (range >= 0) return 0;
      range = i;
    }
    if (in->op == CG_STORE && (c->top[i] >= 0 || range < 0)) return 0;
  }
  if (range < 0) return 0;
  for (int u = range + 1; u < c->match[range]; u++) {   /* the accumulators the loop updates */
    const CgInst *up = cg_kp_ins(c, u);
    if (up->op != CG_UPDATE || c->top[up->a[0]] >= 0 || c->mark[up->a[0]] == stamp) continue;
    c->mark[up->a[0]] = stamp;
    nacc++;
  }
  for (int i = 0; i < c->n; i++) c->mark[i] = 0;
  const CgInst *t = cg_kp_ins(c, cg_kp_ins(c, range)->a[0]);
  if (t->op != CG_CONST || nacc == 0 || nacc > 64) return 0;
  int64_t s = t->i / ((int64_t)threads * 8);   /* at least 8 elements per thread */
  if (s > 1024) s = 1024;
  if (s > 4096 / k->grid) s = 4096 / k->grid;
  if (s > CG_CUDA_SPLIT_PARTS / (k->grid * nacc)) s = CG_CUDA_SPLIT_PARTS / (k->grid * nacc);
  return s >= 2 ? s : 0;
}

/* The vector width of a thread-mode kernel (see the header), or 0. */
static int vector_width(CgKp *c) {
  const CgKernel *k = c->k;
  if (c->gid < 0) return 0;
  size_t es = 0;
  int stored = 0;
  for (int i = 0; i < c->n; i++) {
    const CgInst *in = cg_kp_ins(c, i);
    if (in->op == CG_RANGE || in->op == CG_ACC) return 0;
    if (in->op != CG_LOAD && in->op != CG_STORE) continue;
    const CgBuf *b = &k->buf[in->buf];
    const CgInst *ix = cg_kp_ins(c, in->a[0]);
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
  int v = es == 2 ? 4 : (int)(16 / es);   /* bf16: ushort4, 8 bytes (CUDA has no 8-wide short vector) */
  return k->grid >= v && k->grid % v == 0 ? v : 0;
}

/* Whether buffer b is loaded / stored at gid (vector mode's lanes). */
static int buf_at_gid(const CgKp *c, int b, CgOp op) {
  for (int i = 0; i < c->n; i++)
    if (cg_kp_ins(c, i)->op == op && cg_kp_ins(c, i)->buf == b && cg_kp_ins(c, i)->a[0] == c->gid) return 1;
  return 0;
}

/* The bytes of one vector (vector mode): the lanes times the element size
 * shared by the buffers accessed at gid. */
static int vec_bytes(const CgKp *c) {
  for (int b = 0; b < c->k->nbuf; b++)
    if (buf_at_gid(c, b, CG_LOAD) || buf_at_gid(c, b, CG_STORE)) return c->vec * (int)elem_size(c->k->buf[b].type);
  return 0;
}

/* ---- the kernel ---- */

static const char *vec_type(CgType t) {
  return t == CG_F64 ? "double2" : t == CG_F32 ? "float4" : cg_type_is_half(t) ? "ushort4" : "int4";
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

/* Thread mode: a grid-stride loop over the iterations; with vectors
 * (c->vec), over groups of c->vec iterations, one lane each. */
static void thread_mode(CgKp *c, StrBuf *out) {
  const CgKernel *k = c->k;
  int vec = c->vec;
  if (vec) {
    /* the vectors need aligned buffers (16 bytes, bf16 8): the executor passes
     * buffer starts, but a ZeRO chunk of a parameter starts anywhere */
    sb_puts(out, "  if (((0");
    for (int b = 0; b < k->nbuf; b++)
      if (buf_at_gid(c, b, CG_LOAD) || buf_at_gid(c, b, CG_STORE)) sb_printf(out, " | (unsigned long long)b%d", b);
    sb_printf(out, ") & %d) == 0) {\n", vec_bytes(c) - 1);
    sb_printf(out, "  for (long long vg = blockIdx.x * (long long)blockDim.x + threadIdx.x; vg < %lldLL;\n"
                   "       vg += (long long)gridDim.x * blockDim.x) {\n", (long long)(k->grid / vec));
    for (int b = 0; b < k->nbuf; b++) {
      const char *vt = vec_type(k->buf[b].type);
      if (buf_at_gid(c, b, CG_LOAD)) sb_printf(out, "    const %s q%d = ((const %s *)b%d)[vg];\n", vt, b, vt, b);
      if (buf_at_gid(c, b, CG_STORE)) sb_printf(out, "    %s s%d;\n", vt, b);
    }
    for (c->lane = 0; c->lane < c->vec; c->lane++) {
      sb_printf(out, "    {\n      const long long gid = vg * %d + %d;\n", c->vec, c->lane);
      cg_kp_body(c, out, 3);
      sb_puts(out, "    }\n");
    }
    for (int b = 0; b < k->nbuf; b++)
      if (buf_at_gid(c, b, CG_STORE)) sb_printf(out, "    ((%s *)b%d)[vg] = s%d;\n", vec_type(k->buf[b].type), b, b);
    sb_puts(out, "  }\n  } else {\n");   /* misaligned: the scalar loop */
    c->vec = 0;
  }
  sb_printf(out, "  for (long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x; gid < %lldLL;\n"
                 "       gid += (long long)gridDim.x * blockDim.x) {\n", (long long)k->grid);
  cg_kp_body(c, out, 2);
  sb_puts(out, vec ? "  }\n  }\n}\n" : "  }\n}\n");
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
  CgKp c;
  int threads = 256;
  cg_kp_init(&c, k, &cuda_dialect);
  c.row = row_mode(&c, &threads);
  for (int i = 0; i < c.n; i++) c.mark[i] = 0;
  c.split = c.row ? split_blocks(&c, threads) : 0;
  c.vec = c.row ? 0 : vector_width(&c);
  int64_t space = c.vec ? k->grid / c.vec : k->grid;
  memset(l, 0, sizeof *l);
  snprintf(l->name, sizeof l->name, "%s", k->name);
  l->threads = threads;
  l->blocks = c.split ? space * c.split : c.row ? space : (space + 255) / 256;
  if (l->blocks > 65535LL * 32) l->blocks = 65535LL * 32;   /* the grid-stride loops cover the rest */
  if (l->blocks < 1) l->blocks = 1;

  sb_printf(out, "\n/* %s: %s mode, grid = %lld iterations", k->name, c.row ? "row" : "thread", (long long)k->grid);
  if (c.split) sb_printf(out, ", split rows of %lld blocks", (long long)c.split);
  if (c.vec) sb_printf(out, ", %d-byte vectors of %d", vec_bytes(&c), c.vec);
  sb_printf(out, "; launch %lld x %d */\n", (long long)l->blocks, l->threads);
  sb_printf(out, "extern \"C\" __global__ void __launch_bounds__(%d) %s(TsArgs a) {\n", l->threads, k->name);
  for (int b = 0; b < k->nbuf; b++) {
    const char *cq = k->buf[b].written ? "" : "const ", *t = cuda_dialect.type[k->buf[b].type];
    sb_printf(out, "  %s%s *%sb%d = (%s%s *)a.b[%d];\n", cq, t, may_share(k, b) ? "" : "__restrict__ ", b, cq, t, b);
  }
  if (c.split) {
    /* ts_s blocks per row: the planned split when the launch has the
     * blocks for it, fewer when not (one block per row, rows strided, when
     * there are fewer blocks than rows); blocks past rows * ts_s idle */
    long long R = (long long)k->grid;
    sb_printf(out, "  const long long ts_s = gridDim.x >= %lldLL ? %lldLL : gridDim.x >= %lldLL ? gridDim.x / %lldLL : 1;\n",
              R * c.split, (long long)c.split, R, R);
    sb_printf(out, "  for (long long gid = blockIdx.x / ts_s; gid < %lldLL && blockIdx.x < %lldLL * ts_s; "
                   "gid += gridDim.x / ts_s) {\n", R, R);
    sb_puts(out, "    const long long ts_chunk = blockIdx.x % ts_s;\n");
    cg_kp_body(&c, out, 2);
    sb_puts(out, "  }\n}\n");
  } else if (c.row) {
    sb_printf(out, "  for (long long gid = blockIdx.x; gid < %lldLL; gid += gridDim.x) {\n", (long long)k->grid);
    cg_kp_body(&c, out, 2);
    sb_puts(out, "  }\n}\n");
  } else thread_mode(&c, out);
  cg_kp_free(&c);
  return 0;
}
