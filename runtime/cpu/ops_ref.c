/* ops_ref.c - the reference kernel of every op in ops.def, for f32 and f64
 * (i32 where an op moves ids or targets).  The table rt_ref_kernels[] is
 * built from ops.def with the X-macro, so an op without a kernel
 * `ref_<NAME>` is a compile error.
 *
 * Float kernels are written once in ops_ref_t.h and instantiated for float
 * and double; each ref_<NAME> checks operand dtypes and sizes against a
 * small signature, then dispatches on the dtype.  Layout ops (reshape,
 * permute, slice, pad, concat, broadcast) move elements by size, so they
 * work for every dtype.  The executor (rt.c) handles INPUT, STATE and
 * OUTPUT itself; their entries here only exist to keep the table whole.
 * Sharded modules: kernels whose result depends on where an element sits
 * in the global tensor (init, dropout, rope, causal_mask, embedding,
 * take, onehot, pad_fill, ZeRO adamw) read the shardings of their node and
 * operands and the rank's coordinates (rt_shard_block); the collectives
 * run on the rank's groups (comm.h).  Unsharded, every offset is 0 and the
 * results are bit-identical to a single-rank build.
 * Speed (bench/README.md): the big loops run on the worker pool of par.h,
 * split so that no result depends on the thread count: elementwise and row
 * ops by ranges of elements or rows, column sums by columns, sumsq in
 * fixed blocks; batched small GEMMs one per thread.  Layout ops merge dims
 * and move whole rows (memcpy) or 32x32 tiles, not single elements.
 * Assumes: operands are contiguous row-major buffers of their IrType. */
#include "half.h"
#include "kernels.h"
#include "par.h"
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>

/* ---- helpers shared by the kernels ---- */
static inline double rt_ld(const void *p, IrDtype t, int64_t i) {
  switch (t) {
  case IR_F32: return ((const float *)p)[i];
  case IR_F64: return ((const double *)p)[i];
  case IR_I32: return ((const int32_t *)p)[i];
  case IR_BF16: return ts_bf16_to_f32(((const uint16_t *)p)[i]);
  case IR_F16: return ts_f16_to_f32(((const uint16_t *)p)[i]);
  case IR_F8E4M3: return ts_f8e4m3_to_f32(((const uint8_t *)p)[i]);
  case IR_F8E5M2: return ts_f8e5m2_to_f32(((const uint8_t *)p)[i]);
  default: return NAN;
  }
}
/* double -> i32 truncating toward zero like a C cast, but defined for
 * every input: NaN gives 0, out-of-range values saturate. */
static inline int32_t rt_to_i32(double v) {
  if (!(v == v)) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}
static inline void rt_st(void *p, IrDtype t, int64_t i, double v) {
  switch (t) {
  case IR_F32: ((float *)p)[i] = (float)v; break;
  case IR_F64: ((double *)p)[i] = v; break;
  case IR_I32: ((int32_t *)p)[i] = rt_to_i32(v); break;
  case IR_BF16: ((uint16_t *)p)[i] = ts_f32_to_bf16((float)v); break;   /* half.h: through f32 */
  case IR_F16: ((uint16_t *)p)[i] = ts_f32_to_f16((float)v); break;
  case IR_F8E4M3: ((uint8_t *)p)[i] = ts_f32_to_f8e4m3((float)v); break;   /* saturating */
  case IR_F8E5M2: ((uint8_t *)p)[i] = ts_f32_to_f8e5m2((float)v); break;
  default: break;
  }
}

/* A type as text for messages; two slots so one message can show two. */
const char *rt_tstr(const IrType *t, int slot) {
  static _Thread_local char buf[2][192];
  return ir_type_str(t, buf[slot & 1], sizeof buf[0]);
}

/* axis attr (negative counts from the end) -> 0..rank-1, or -1 */
static int rt_axis(int64_t a, int rank) {
  if (a < 0) a += rank;
  return a >= 0 && a < rank ? (int)a : -1;
}

/* t viewed as [outer, len, inner] around axis ax */
static void rt_split(const IrType *t, int ax, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int d = 0; d < ax; d++) *outer *= t->dim[d];
  for (int d = ax + 1; d < t->rank; d++) *inner *= t->dim[d];
  *len = t->dim[ax];
}

/* t viewed as [rows, D] with D the last dim (a scalar is one row of 1) */
static int64_t rt_rows(const IrType *t, int64_t *D) {
  *D = t->rank ? t->dim[t->rank - 1] : 1;
  return *D ? ir_type_numel(t) / *D : 0;
}

/* Numpy broadcasting, right-aligned, from small (dims equal or 1, or
 * missing on the left) to big: per dim of big, the stride in small (0
 * where small is broadcast).  -1 if small does not broadcast to big. */
static int rt_bcast_strides(const IrType *small, const IrType *big, int64_t *str) {
  if (small->rank > big->rank) return -1;
  int off = big->rank - small->rank;
  int64_t s = 1;
  for (int d = big->rank - 1; d >= 0; d--) {
    int sd = d - off;
    if (sd < 0) { str[d] = 0; continue; }
    if (small->dim[sd] == big->dim[d]) str[d] = small->dim[sd] == 1 ? 0 : s;
    else if (small->dim[sd] == 1) str[d] = 0;
    else return -1;
    s *= small->dim[sd];
  }
  return 0;
}

/* Copies one element of es bytes; the fixed sizes compile to one move
 * (a variable-size memcpy per element would be a call). */
static inline void copy_elem(char *dst, const char *src, size_t es) {
  if (es == 4) memcpy(dst, src, 4);
  else if (es == 8) memcpy(dst, src, 8);
  else memcpy(dst, src, es);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
#define GELU_K 0.7978845608028654   /* sqrt(2 / pi) */
#define GELU_A 0.044715
static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_A * x * x * x))); }
static double gelu_tanh_grad(double x) {
  double th = tanh(GELU_K * (x + GELU_A * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * GELU_A * x * x);
}
static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / M_SQRT2)); }
static double gelu_erf_grad(double x) {
  return 0.5 * (1.0 + erf(x / M_SQRT2)) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* Work per pool range: ~32k elements keeps the dispatch (a few us) small
 * next to the loop. */
#define RT_EW_GRAIN 32768
/* sumsq's fixed block (elements per double partial sum) */
#define RT_SUM_BLOCK 32768
/* A batched GEMM with M * N * K at most this runs one GEMM per pool thread
 * (attention's [s, s, d] products), larger ones use BLAS's threads. */
#define RT_SMALL_GEMM (64.0 * 1024 * 1024)
/* Per range for kernels bound by memory (copies, column sums, accum): one
 * core nearly saturates it, so only large tensors split (par.h). */
#define RT_MEM_GRAIN (1 << 20)
/* rows of D elements per pool range */
static inline int64_t rt_row_grain(int64_t D) { return D >= RT_EW_GRAIN ? 1 : RT_EW_GRAIN / (D > 0 ? D : 1); }

/* ---- the float kernels, instantiated twice ---- */
#define T float
#define SUF f32
#define GEMM cblas_sgemm
#define TEXP expf
#include "ops_ref_t.h"
#undef T
#undef SUF
#undef GEMM
#undef TEXP
#define T double
#define SUF f64
#define GEMM cblas_dgemm
#define TEXP exp
#include "ops_ref_t.h"
#undef T
#undef SUF
#undef GEMM
#undef TEXP

int rt_kfail(RtKctx *k, const char *fmt, ...) {
  if (k->err && k->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, k->errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

/* Checks operands against sig (one char per operand) for float type ft:
 *   'T' dtype ft and as many elements as the result, 't' dtype ft,
 *   'i' i32, '*' any dtype and as many elements as the result, '?' anything. */
static int check_sig(RtKctx *k, const char *sig, IrDtype ft) {
  int64_t n = k->ot && k->ot->dtype != IR_VOID ? ir_type_numel(k->ot) : -1;
  for (int i = 0; i < k->n->nin && sig[i]; i++) {
    const IrType *t = k->it[i];
    char c = sig[i];
    if ((c == 'T' || c == 't') && t->dtype != ft)
      return rt_kfail(k, "operand %d is %s, expected %s", i, rt_tstr(t, 0), ir_dtype_name(ft));
    if (c == 'i' && t->dtype != IR_I32)
      return rt_kfail(k, "operand %d is %s, expected i32", i, rt_tstr(t, 0));
    if ((c == 'T' || c == '*') && n >= 0 && ir_type_numel(t) != n)
      return rt_kfail(k, "operand %d %s does not have the result's %lld elements", i, rt_tstr(t, 0), (long long)n);
  }
  return 0;
}

/* ref_NAME for a float op: check, then run the f32 or f64 instance on the
 * result dtype. */
#define FLOAT_OP_PRE(NAME, SIG, PRE)                                                \
  static int ref_##NAME(RtKctx *k) {                                                \
    IrDtype ft = k->ot->dtype;                                                      \
    if (!ir_dtype_is_float(ft)) return rt_kfail(k, "result must be f32 or f64, not %s", ir_dtype_name(ft)); \
    if (check_sig(k, SIG, ft) != 0 || (PRE)) return -1;                             \
    return ft == IR_F32 ? k_##NAME##_f32(k) : k_##NAME##_f64(k);                    \
  }
#define FLOAT_OP(NAME, SIG) FLOAT_OP_PRE(NAME, SIG, 0)
/* add sub mul adds muls neg also run on i32: computed in f64 (exact for
 * sums of i32; products saturate), stored saturating like a cast. */
static int int_arith(RtKctx *k) {
  if (check_sig(k, k->n->nin == 2 ? "ii" : "i", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  const int32_t *x = k->in[0], *y = k->n->nin == 2 ? k->in[1] : NULL;
  int32_t *o = k->out;
  double c = k->n->fa[0];
  for (int64_t i = 0; i < n; i++) {
    double a = x[i], r;
    switch (k->n->op) {
    case IR_OP_ADD: r = a + y[i]; break;
    case IR_OP_SUB: r = a - y[i]; break;
    case IR_OP_MUL: r = a * y[i]; break;
    case IR_OP_ADDS: r = a + c; break;
    case IR_OP_MULS: r = a * c; break;
    default: r = -a; break;
    }
    o[i] = rt_to_i32(r);
  }
  return 0;
}
#define INT_OR_FLOAT_OP(NAME, SIG)                                                  \
  static int ref_##NAME(RtKctx *k) {                                                \
    IrDtype ft = k->ot->dtype;                                                      \
    if (ft == IR_I32) return int_arith(k);                                          \
    if (!ir_dtype_is_float(ft)) return rt_kfail(k, "result must be f32, f64 or i32, not %s", ir_dtype_name(ft)); \
    if (check_sig(k, SIG, ft) != 0) return -1;                                      \
    return ft == IR_F32 ? k_##NAME##_f32(k) : k_##NAME##_f64(k);                    \
  }
/* The row ops normalize over the last dim, which must be whole on every
 * rank: a split one means the sharding pass left it to us, and each rank
 * would silently normalize its own block. */
static int whole_last_dim(RtKctx *k) {
  const IrType *t = k->it[0];
  if (t->rank < 1 || !rt_kin_sh(k, 0)->split[t->rank - 1]) return 0;
  return rt_kfail(k, "the last dim of %s is split across ranks; %s needs it whole (the sharding pass "
                  "gathers it or lowers the op first)", rt_tstr(t, 0), ir_ops[k->n->op].name);
}
#define FLOAT_ROW_OP(NAME, SIG) FLOAT_OP_PRE(NAME, SIG, whole_last_dim(k))
INT_OR_FLOAT_OP(ADD, "TT")
INT_OR_FLOAT_OP(SUB, "TT")
INT_OR_FLOAT_OP(MUL, "TT")
FLOAT_OP(DIV, "TT")
INT_OR_FLOAT_OP(ADDS, "T")
INT_OR_FLOAT_OP(MULS, "T")
INT_OR_FLOAT_OP(NEG, "T")
FLOAT_OP(EXP, "T")
FLOAT_OP(LOG, "T")
FLOAT_OP(SQRT, "T")
FLOAT_OP(RSQRT, "T")
FLOAT_OP(TANH, "T")
FLOAT_OP(GELU_TANH, "T")
FLOAT_OP(GELU_ERF, "T")
FLOAT_OP(SILU, "T")
FLOAT_OP(RELU, "T")
FLOAT_OP(GELU_TANH_BWD, "TT")
FLOAT_OP(GELU_ERF_BWD, "TT")
FLOAT_OP(SILU_BWD, "TT")
FLOAT_OP(RELU_BWD, "TT")
FLOAT_OP(SUM_TO, "t")
FLOAT_OP(SUM, "t")
FLOAT_OP(MEAN, "t")
FLOAT_OP(MAX, "t")
FLOAT_OP(SUMSQ, "t")
/* matmul: f32 / f64 operands and result of one dtype, or (OPF_MIXED) bf16 /
 * f16 operands with a result in their dtype or f32.  16-bit operands are
 * converted to f32 (exact), multiplied by the f32 GEMM (sgemm, called as
 * for f32 operands of the same shapes), and the f32 result is rounded once
 * to the result dtype: bit for bit the `cast : f32`, f32 matmul, `cast :
 * bf16` the precision pass emitted before the GEMM read 16 bits itself.
 * The f32 copies are this call's own (malloc'd whole, freed before it
 * returns): the plan has no buffer for them.  OpenBLAS 0.3.21 of Debian 12
 * declares cblas_sbgemm but does not export it (docs/precision.md). */
static int matmul_f32_of(RtKctx *k, float alpha);
static int ref_MATMUL(RtKctx *k) {
  IrDtype d = k->it[0]->dtype, ft = k->ot->dtype;
  if (!ir_dtype_is_16(d)) {
    if (!ir_dtype_is_float(ft)) return rt_kfail(k, "result must be f32 or f64, not %s", ir_dtype_name(ft));
    if (check_sig(k, "tt", ft) != 0) return -1;
    return ft == IR_F32 ? k_MATMUL_f32(k) : k_MATMUL_f64(k);
  }
  if (k->it[1]->dtype != d || (ft != d && ft != IR_F32))
    return rt_kfail(k, "a 16-bit matmul takes two %s operands and stores %s or f32, not %s @ %s -> %s", ir_dtype_name(d),
                    ir_dtype_name(d), rt_tstr(k->it[0], 0), rt_tstr(k->it[1], 1), ir_dtype_name(ft));
  return matmul_f32_of(k, 1.0f);
}
/* The GEMM of a 16-bit or fp8 matmul: both operands converted to f32
 * (exact), cblas_sgemm as an f32 matmul of those shapes, the f32 sum times
 * alpha (fp8: the operands' scale_inv product; 1: none), stored once in
 * the result dtype (bf16 / f16 rounded, or f32 as it is). */
static int matmul_f32_of(RtKctx *k, float alpha) {
  IrDtype ft = k->ot->dtype;
  int64_t na = ir_type_numel(k->it[0]), nb = ir_type_numel(k->it[1]), no = ir_type_numel(k->ot);
  /* the copies in this thread's scratch (par.h): made again on every call */
  float *a = rt_scratch(0, (size_t)na * sizeof *a), *b = rt_scratch(1, (size_t)nb * sizeof *b);
  float *c = ft == IR_F32 ? k->out : rt_scratch(2, (size_t)no * sizeof *c);
  rt_convert(a, IR_F32, k->in[0], k->it[0]->dtype, na);
  rt_convert(b, IR_F32, k->in[1], k->it[1]->dtype, nb);
  IrType at = *k->it[0], bt = *k->it[1], ct = *k->ot;
  at.dtype = bt.dtype = ct.dtype = IR_F32;
  const void *in[2] = {a, b};
  const IrType *it[2] = {&at, &bt};
  RtKctx k32 = *k;
  k32.in = in;
  k32.it = it;
  k32.out = c;
  k32.ot = &ct;
  int rc = k_MATMUL_f32(&k32);
  if (rc == 0 && alpha != 1.0f)
    for (int64_t i = 0; i < no; i++) c[i] *= alpha;
  if (rc == 0 && ft != IR_F32) rt_convert(k->out, ft, c, IR_F32, no);
  for (int slot = 0; slot < 3; slot++) rt_scratch_done(slot);
  return rc;
}
FLOAT_ROW_OP(SOFTMAX, "T")
FLOAT_ROW_OP(SOFTMAX_BWD, "TT")
FLOAT_ROW_OP(LOG_SOFTMAX, "T")
FLOAT_ROW_OP(LOG_SOFTMAX_BWD, "TT")
FLOAT_ROW_OP(LAYERNORM, "T")
FLOAT_ROW_OP(LAYERNORM_BWD, "TT")
FLOAT_ROW_OP(RMSNORM, "T")
FLOAT_ROW_OP(RMSNORM_BWD, "TT")
FLOAT_OP(EMBEDDING, "ti")
FLOAT_OP(EMBEDDING_BWD, "it")

int rt_embedding_bwd_add(RtKctx *k) {
  IrDtype ft = k->ot->dtype;
  if (!ir_dtype_is_float(ft)) return rt_kfail(k, "result must be f32 or f64, not %s", ir_dtype_name(ft));
  if (check_sig(k, "it", ft) != 0) return -1;
  return ft == IR_F32 ? emb_bwd_f32(k, 0) : emb_bwd_f64(k, 0);
}
FLOAT_OP(CAUSAL_MASK, "T")
FLOAT_OP(MASKED_FILL, "T*")
FLOAT_OP(DROPOUT, "T")
FLOAT_OP(ROPE, "T")
static int ref_ROPE_AT(RtKctx *k) {
  IrDtype ft = k->ot->dtype;
  if (!ir_dtype_is_float(ft) || k->it[0]->dtype != ft || k->it[1]->dtype != IR_I32) return rt_kfail(k, "rope_at takes (x float, pos i32)");
  if (*(const int32_t *)k->in[1] < 0) return rt_kfail(k, "position %d is negative", *(const int32_t *)k->in[1]);
  return ft == IR_F32 ? k_ROPE_f32(k) : k_ROPE_f64(k);
}
FLOAT_ROW_OP(CROSS_ENTROPY, "ti")
FLOAT_ROW_OP(CROSS_ENTROPY_BWD, "Tit")
FLOAT_OP(CLIP_COEF, "T")
#undef FLOAT_OP
#undef FLOAT_ROW_OP
#undef FLOAT_OP_PRE
#undef INT_OR_FLOAT_OP

/* ---- leaves: INPUT and STATE are the executor's (they alias memory) ---- */
static int ref_INPUT(RtKctx *k) { return rt_kfail(k, "internal error: input is run by the executor"); }
static int ref_STATE(RtKctx *k) { return rt_kfail(k, "internal error: state is run by the executor"); }
static int ref_OUTPUT(RtKctx *k) { return rt_kfail(k, "internal error: output is run by the executor"); }

static int ref_FULL(RtKctx *k) {
  int64_t n = ir_type_numel(k->ot);
  for (int64_t i = 0; i < n; i++) rt_st(k->out, k->ot->dtype, i, k->n->fa[0]);
  return 0;
}

/* ---- dtype-generic elementwise: any input dtype, result dtype given ---- */
static int ref_EQ(RtKctx *k) {
  if (check_sig(k, "**", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  for (int64_t i = 0; i < n; i++)
    rt_st(k->out, k->ot->dtype, i, rt_ld(k->in[0], k->it[0]->dtype, i) == rt_ld(k->in[1], k->it[1]->dtype, i));
  return 0;
}
static int ref_NE_SCALAR(RtKctx *k) {
  if (check_sig(k, "*", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  for (int64_t i = 0; i < n; i++)
    rt_st(k->out, k->ot->dtype, i, rt_ld(k->in[0], k->it[0]->dtype, i) != k->n->fa[0]);
  return 0;
}
/* rt_convert's pairs between f32 and the 16-bit types, one typed loop each
 * (the copies of every step and the GEMMs' f32 operands of 16-bit plans);
 * the same bits as through rt_ld / rt_st (f32 -> double -> f32 is exact). */
typedef struct { void *dst; const void *src; IrDtype to, from; } ConvJob;
static void convert_range(void *ctx, int64_t lo, int64_t hi) {
  const ConvJob *j = ctx;
#define CONVERT(FROM, TO, TIN, TOUT, FN)                                \
  if (j->from == FROM && j->to == TO) {                                 \
    const TIN *x = j->src;                                              \
    TOUT *y = j->dst;                                                   \
    for (int64_t i = lo; i < hi; i++) y[i] = FN(x[i]);                  \
    return;                                                             \
  }
  CONVERT(IR_F32, IR_BF16, float, uint16_t, ts_f32_to_bf16)
  CONVERT(IR_F32, IR_F16, float, uint16_t, ts_f32_to_f16)
  CONVERT(IR_BF16, IR_F32, uint16_t, float, ts_bf16_to_f32)
  CONVERT(IR_F16, IR_F32, uint16_t, float, ts_f16_to_f32)
#undef CONVERT
  for (int64_t i = lo; i < hi; i++) rt_st(j->dst, j->to, i, rt_ld(j->src, j->from, i));
}
void rt_convert(void *dst, IrDtype to, const void *src, IrDtype from, int64_t n) {
  ConvJob j = {dst, src, to, from};
  rt_par_for(n, 1 << 16, convert_range, &j);
}
static int ref_CAST(RtKctx *k) {
  if (check_sig(k, "*", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  for (int64_t i = 0; i < n; i++) rt_st(k->out, k->ot->dtype, i, rt_ld(k->in[0], k->it[0]->dtype, i));
  return 0;
}

/* ---- integer tensors and indexing (ops.def: cmp ... gather_bwd) ---- */
static int ref_CMP(RtKctx *k) {
  if (check_sig(k, "**", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  IrDtype ta = k->it[0]->dtype, tb = k->it[1]->dtype;
  int pred = (int)k->n->ia[0];
  for (int64_t i = 0; i < n; i++) {
    double a = rt_ld(k->in[0], ta, i), b = rt_ld(k->in[1], tb, i);
    int r = pred == 0 ? a == b : pred == 1 ? a != b : pred == 2 ? a < b : pred == 3 ? a <= b : pred == 4 ? a > b : a >= b;
    rt_st(k->out, k->ot->dtype, i, r);
  }
  return 0;
}
static int ref_WHERE(RtKctx *k) {
  if (check_sig(k, "***", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  size_t es = ir_dtype_size(k->ot->dtype);
  for (int64_t i = 0; i < n; i++) {
    const char *src = rt_ld(k->in[0], k->it[0]->dtype, i) != 0 ? k->in[1] : k->in[2];
    copy_elem((char *)k->out + (size_t)i * es, src + (size_t)i * es, es);
  }
  return 0;
}
/* Python's floor division and modulo; y == 0 gives 0 (the frontend refuses
 * a constant 0 divisor) */
static inline int64_t floordiv64(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static int int_divmod(RtKctx *k, int mod) {
  if (check_sig(k, "ii", IR_VOID) != 0) return -1;
  int64_t n = ir_type_numel(k->ot);
  const int32_t *x = k->in[0], *y = k->in[1];
  int32_t *o = k->out;
  for (int64_t i = 0; i < n; i++) {
    int64_t a = x[i], b = y[i];
    if (b == 0) { o[i] = 0; continue; }
    int64_t q = floordiv64(a, b);
    o[i] = rt_to_i32((double)(mod ? a - b * q : q));
  }
  return 0;
}
static int ref_FLOORDIV(RtKctx *k) { return int_divmod(k, 0); }
static int ref_MOD(RtKctx *k) { return int_divmod(k, 1); }
/* The GLOBAL index of each dim of local flat element i, from the node's
 * sharding (unsharded: the local one). */
static void global_idx(RtKctx *k, int64_t i, int64_t g[IR_MAX_RANK]) {
  const IrType *t = k->ot;
  for (int d = t->rank - 1; d >= 0; d--) {
    int64_t j = t->dim[d] ? i % t->dim[d] : 0;
    i = t->dim[d] ? i / t->dim[d] : 0;
    g[d] = k->n->sh.split[d] ? rt_global_index(k->env->rank, k->n->sh.split[d], t->dim[d], j) : j;
  }
}
static int ref_ARANGE(RtKctx *k) {
  const IrType *t = k->ot;
  int ax = (int)k->n->ia[0];
  int64_t n = ir_type_numel(t), g[IR_MAX_RANK];
  for (int64_t i = 0; i < n; i++) {
    global_idx(k, i, g);
    rt_st(k->out, t->dtype, i, k->n->fa[0] + k->n->fa[1] * (double)g[ax]);
  }
  return 0;
}
static int ref_RAND(RtKctx *k) {
  const IrType *t = k->ot;
  int64_t n = ir_type_numel(t), g[IR_MAX_RANK], off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  double lo = k->n->fa[0], hi = k->n->fa[1];
  rt_shard_offsets(k->env->rank, &k->n->sh, t, off, gdim);
  for (int64_t i = 0; i < n; i++) {
    global_idx(k, i, g);
    int64_t f = 0;
    for (int d = 0; d < t->rank; d++) f = f * gdim[d] + g[d];
    double u = rt_dropout_u(k->env->m->train.seed, k->n->ia[0], k->info->step, k->info->micro, f);
    double v = t->dtype == IR_I32 ? floor(lo + u * (hi - lo)) : lo + u * (hi - lo);
    if (v >= hi) v = t->dtype == IR_I32 ? hi - 1 : lo;   /* rounding at u -> 1 */
    rt_st(k->out, t->dtype, i, v);
  }
  return 0;
}
/* x, idx viewed as [outer, len, inner] around axis; y / dx likewise */
static int ref_GATHER(RtKctx *k) {
  const IrType *xt = k->it[0], *it = k->it[1];
  int ax = (int)k->n->ia[0];
  if (it->dtype != IR_I32) return rt_kfail(k, "idx %s must be i32", rt_tstr(it, 0));
  if (xt->rank && rt_kin_sh(k, 0)->split[ax])
    return rt_kfail(k, "x %s is split along the gather axis %d", rt_tstr(xt, 0), ax);
  int64_t outer, len, inner, o2, ilen, in2;
  rt_split(xt, ax, &outer, &len, &inner);
  rt_split(it, ax, &o2, &ilen, &in2);
  size_t es = ir_dtype_size(xt->dtype);
  const int32_t *idx = k->in[1];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < ilen; j++)
      for (int64_t c = 0; c < inner; c++) {
        int64_t e = (o * ilen + j) * inner + c, v = idx[e];
        if (v < 0 || v >= len) return rt_kfail(k, "index %lld is outside [0, %lld) along axis %d", (long long)v, (long long)len, ax);
        copy_elem((char *)k->out + (size_t)e * es, (const char *)k->in[0] + (size_t)((o * len + v) * inner + c) * es, es);
      }
  return 0;
}
static int ref_GATHER_BWD(RtKctx *k) {
  const IrType *xt = k->ot, *it = k->it[0];
  int ax = (int)k->n->ia[0];
  if (!ir_dtype_is_float(xt->dtype) || check_sig(k, "it", xt->dtype) != 0) return -1;
  if (xt->rank && k->n->sh.split[ax]) return rt_kfail(k, "dx %s is split along the gather axis %d", rt_tstr(xt, 0), ax);
  int64_t outer, len, inner, o2, ilen, in2, n = ir_type_numel(xt);
  rt_split(xt, ax, &outer, &len, &inner);
  rt_split(it, ax, &o2, &ilen, &in2);
  const int32_t *idx = k->in[0];
  for (int64_t i = 0; i < n; i++) rt_st(k->out, xt->dtype, i, 0);
  for (int64_t o = 0; o < outer; o++)   /* in index order: the sums do not depend on threads */
    for (int64_t j = 0; j < ilen; j++)
      for (int64_t c = 0; c < inner; c++) {
        int64_t e = (o * ilen + j) * inner + c, v = idx[e];
        if (v < 0 || v >= len) return rt_kfail(k, "index %lld is outside [0, %lld) along axis %d", (long long)v, (long long)len, ax);
        int64_t d = (o * len + v) * inner + c;
        if (xt->dtype == IR_F32) ((float *)k->out)[d] += ((const float *)k->in[1])[e];
        else ((double *)k->out)[d] += ((const double *)k->in[1])[e];
      }
  return 0;
}

/* ---- layout: moves elements by size, any dtype ---- */
static int same_dtype(RtKctx *k) {
  for (int i = 0; i < k->n->nin; i++)
    if (k->it[i]->dtype != k->ot->dtype)
      return rt_kfail(k, "operand %d is %s but the result is %s", i, rt_tstr(k->it[i], 0), rt_tstr(k->ot, 1));
  return 0;
}

static int ref_RESHAPE(RtKctx *k) {
  if (same_dtype(k) != 0 || check_sig(k, "*", IR_VOID) != 0) return -1;
  /* a copy still: the executor gives every value its own buffer (an alias
   * would need rt.c to share the operand's buffer and its lifetime) */
  rt_par_memcpy(k->out, k->in[0], (size_t)ir_type_numel(k->ot) * ir_dtype_size(k->ot->dtype));
  return 0;
}

/* y[i] = x[sum_d idx_d(i) * str[d]] for every element i of y (row-major):
 * the gather that permute (strides of x's dims in y's order) and broadcast
 * (stride 0 on broadcast dims) both are.  Dims are merged first: y dims d
 * and d+1 merge when str[d] == str[d+1] * dim[d+1] (contiguous in x, or
 * both broadcast), and size-1 dims drop, so [b, s, h, d] -> [b, h, s, d]
 * becomes rows of d contiguous elements and a bias broadcast [C] ->
 * [B, T, C] rows of C. */
typedef struct {
  int r;                             /* merged rank, >= 1 */
  int64_t dim[IR_MAX_RANK], str[IR_MAX_RANK];
  size_t es;
  char *y;
  const char *x;
  int64_t ntile;                     /* tiles of 32 along dim r-2 (tiled case) */
} Gather;

enum { RT_TILE = 32 };

static void gather_init(Gather *g, char *y, const char *x, const IrType *yt, const int64_t *str) {
  g->r = 0;
  for (int d = 0; d < yt->rank; d++) {
    if (yt->dim[d] == 1) continue;
    if (g->r > 0 && g->str[g->r - 1] == str[d] * yt->dim[d]) {
      g->dim[g->r - 1] *= yt->dim[d];
      g->str[g->r - 1] = str[d];
      continue;
    }
    g->dim[g->r] = yt->dim[d];
    g->str[g->r] = str[d];
    g->r++;
  }
  if (g->r == 0) { g->dim[0] = 1; g->str[0] = 0; g->r = 1; }
  g->es = ir_dtype_size(yt->dtype);
  g->y = y;
  g->x = x;
  g->ntile = 0;
}

/* x offset of the first element of outer index q over dims [0, nd) */
static int64_t gather_off(const Gather *g, int nd, int64_t q, int64_t *idx) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = q % g->dim[d];
    q /= g->dim[d];
    off += idx[d] * g->str[d];
  }
  return off;
}

/* Rows [lo, hi) of y (a row = the last merged dim): a memcpy when it is
 * contiguous in x, a fill when broadcast, else element by element. */
static void gather_rows(void *jp, int64_t lo, int64_t hi) {
  const Gather *g = jp;
  int r = g->r;
  int64_t L = g->dim[r - 1], sL = g->str[r - 1], idx[IR_MAX_RANK];
  int64_t off = gather_off(g, r - 1, lo, idx);
  size_t es = g->es;
  for (int64_t row = lo; row < hi; row++) {
    char *y = g->y + (size_t)(row * L) * es;
    const char *x = g->x + (size_t)off * es;
    if (sL == 1) memcpy(y, x, (size_t)L * es);
    else
      for (int64_t i = 0; i < L; i++) copy_elem(y + (size_t)i * es, x + (size_t)(i * sL) * es, es);
    for (int d = r - 2; d >= 0; d--) {   /* odometer over the row index */
      off += g->str[d];
      if (++idx[d] < g->dim[d]) break;
      off -= g->str[d] * g->dim[d];
      idx[d] = 0;
    }
  }
}

/* A transpose: y[o, a, b] = x[off(o) + a + b * sB] (x contiguous along a).
 * Items [lo, hi) are (o, tile of 32 a's); each copies 32x32 tiles so that
 * both the rows written and the x lines read stay in cache. */
static void gather_tiles(void *jp, int64_t lo, int64_t hi) {
  const Gather *g = jp;
  int r = g->r;
  int64_t A = g->dim[r - 2], B = g->dim[r - 1], sB = g->str[r - 1], idx[IR_MAX_RANK];
  size_t es = g->es;
  for (int64_t it = lo; it < hi; it++) {
    int64_t o = it / g->ntile, a0 = (it % g->ntile) * RT_TILE, a1 = a0 + RT_TILE < A ? a0 + RT_TILE : A;
    int64_t off = gather_off(g, r - 2, o, idx);
    for (int64_t b0 = 0; b0 < B; b0 += RT_TILE) {
      int64_t b1 = b0 + RT_TILE < B ? b0 + RT_TILE : B;
      for (int64_t a = a0; a < a1; a++) {
        char *y = g->y + (size_t)((o * A + a) * B) * es;
        const char *x = g->x + (size_t)(off + a) * es;
        for (int64_t b = b0; b < b1; b++) copy_elem(y + (size_t)b * es, x + (size_t)(b * sB) * es, es);
      }
    }
  }
}

static void gather_strided(char *y, const char *x, const IrType *yt, const int64_t *str) {
  Gather g;
  gather_init(&g, y, x, yt, str);
  int64_t n = ir_type_numel(yt);
  if (n == 0) return;
  int r = g.r;
  int64_t L = g.dim[r - 1];
  if (r >= 2 && g.str[r - 2] == 1 && g.str[r - 1] != 1 && g.str[r - 1] != 0) {
    int64_t A = g.dim[r - 2];
    g.ntile = (A + RT_TILE - 1) / RT_TILE;
    int64_t items = n / (A * L) * g.ntile;
    rt_par_for(items, (RT_MEM_GRAIN + RT_TILE * L - 1) / (RT_TILE * L), gather_tiles, &g);
    return;
  }
  rt_par_for(n / L, (RT_MEM_GRAIN + L - 1) / L, gather_rows, &g);
}

/* y[i0..] = x[index with y dim d taken from x dim perm[d]] */
static int ref_PERMUTE(RtKctx *k) {
  if (same_dtype(k) != 0) return -1;
  const IrType *xt = k->it[0], *yt = k->ot;
  int r = xt->rank;
  if (yt->rank != r) return rt_kfail(k, "rank changes");
  int64_t xs[IR_MAX_RANK], ps[IR_MAX_RANK];
  unsigned seen = 0;
  int64_t s = 1;
  for (int d = r - 1; d >= 0; d--) { xs[d] = s; s *= xt->dim[d]; }
  for (int d = 0; d < r; d++) {
    int64_t q = k->n->ia[d];
    if (q < 0 || q >= r || (seen & (1u << q)) || yt->dim[d] != xt->dim[q]) return rt_kfail(k, "bad perm");
    seen |= 1u << q;
    ps[d] = xs[q];
  }
  gather_strided(k->out, k->in[0], yt, ps);
  return 0;
}

/* Copies rows of `len` slices: [outer, xl, inner] -> [outer, yl, inner]
 * taking x's slice starting at xs to y's at ys, cnt along the axis. */
static void copy_axis(char *y, int64_t yl, int64_t ys, const char *x, int64_t xl, int64_t xs,
                      int64_t cnt, int64_t outer, int64_t inner, size_t es) {
  size_t chunk = (size_t)(cnt * inner) * es;
  for (int64_t o = 0; o < outer; o++)
    memcpy(y + (size_t)((o * yl + ys) * inner) * es, x + (size_t)((o * xl + xs) * inner) * es, chunk);
}

static int ref_SLICE(RtKctx *k) {
  if (same_dtype(k) != 0) return -1;
  const IrType *xt = k->it[0];
  int ax = rt_axis(k->n->ia[0], xt->rank);
  int64_t st = k->n->ia[1], en = k->n->ia[2];
  if (ax < 0 || st < 0 || en < st || en > xt->dim[ax]) return rt_kfail(k, "bad slice of %s", rt_tstr(xt, 0));
  int64_t outer, len, inner;
  rt_split(xt, ax, &outer, &len, &inner);
  if (ir_type_numel(k->ot) != outer * (en - st) * inner) return rt_kfail(k, "result size does not match the slice");
  copy_axis(k->out, en - st, 0, k->in[0], len, st, en - st, outer, inner, ir_dtype_size(xt->dtype));
  return 0;
}

static int ref_PAD(RtKctx *k) {
  if (same_dtype(k) != 0) return -1;
  const IrType *xt = k->it[0];
  int ax = rt_axis(k->n->ia[0], xt->rank);
  int64_t bef = k->n->ia[1], aft = k->n->ia[2];
  if (ax < 0 || bef < 0 || aft < 0) return rt_kfail(k, "bad pad of %s", rt_tstr(xt, 0));
  int64_t outer, len, inner;
  rt_split(xt, ax, &outer, &len, &inner);
  int64_t yl = bef + len + aft;
  if (ir_type_numel(k->ot) != outer * yl * inner) return rt_kfail(k, "result size does not match the pad");
  size_t es = ir_dtype_size(xt->dtype);
  memset(k->out, 0, (size_t)ir_type_numel(k->ot) * es);
  copy_axis(k->out, yl, bef, k->in[0], len, 0, len, outer, inner, es);
  return 0;
}

static int ref_CONCAT(RtKctx *k) {
  if (same_dtype(k) != 0) return -1;
  const IrType *yt = k->ot;
  int ax = rt_axis(k->n->ia[0], yt->rank);
  if (ax < 0) return rt_kfail(k, "axis out of range");
  int64_t outer, yl, inner, at = 0;
  rt_split(yt, ax, &outer, &yl, &inner);
  size_t es = ir_dtype_size(yt->dtype);
  for (int i = 0; i < k->n->nin; i++) {
    const IrType *xt = k->it[i];
    int64_t xl = xt->rank == yt->rank ? xt->dim[ax] : -1;
    if (xl < 0 || ir_type_numel(xt) != outer * xl * inner || at + xl > yl)
      return rt_kfail(k, "operand %d %s does not fit %s", i, rt_tstr(xt, 0), rt_tstr(yt, 1));
    copy_axis(k->out, yl, at, k->in[i], xl, 0, xl, outer, inner, es);
    at += xl;
  }
  if (at != yl) return rt_kfail(k, "operands do not fill %s", rt_tstr(yt, 0));
  return 0;
}

static int ref_BROADCAST(RtKctx *k) {
  if (same_dtype(k) != 0) return -1;
  const IrType *xt = k->it[0], *yt = k->ot;
  int64_t str[IR_MAX_RANK];
  if (rt_bcast_strides(xt, yt, str) != 0)
    return rt_kfail(k, "cannot broadcast %s to %s", rt_tstr(xt, 0), rt_tstr(yt, 1));
  gather_strided(k->out, k->in[0], yt, str);
  return 0;
}

/* ---- effects on state ---- */
static const IrState *kstate(RtKctx *k, int slot) {
  return &k->env->m->states.a[k->n->ia[slot]];
}

static int ref_ZERO(RtKctx *k) {
  const IrState *s = kstate(k, 0);
  rt_par_memset(rt_kenv_state(k->env, (int)k->n->ia[0]), 0, (size_t)ir_type_numel(&s->type) * ir_dtype_size(s->type.dtype));
  return 0;
}

/* (x) -> 1 if any element is inf or NaN, else 0 (x - x is 0 exactly for
 * every finite x and NaN otherwise). */
static int ref_NONFINITE(RtKctx *k) {
  if (!ir_dtype_is_float(k->it[0]->dtype) || k->ot->dtype != k->it[0]->dtype)
    return rt_kfail(k, "nonfinite takes f32 or f64, not %s", rt_tstr(k->it[0], 0));
  int64_t n = ir_type_numel(k->it[0]);
  int bad = 0;
  if (k->it[0]->dtype == IR_F32) {
    const float *x = k->in[0];
    for (int64_t i = 0; i < n && !bad; i++) bad = !isfinite(x[i]);
  } else {
    const double *x = k->in[0];
    for (int64_t i = 0; i < n && !bad; i++) bad = !isfinite(x[i]);
  }
  rt_st(k->out, k->ot->dtype, 0, bad ? 1.0 : 0.0);
  return 0;
}

/* Megatron's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py),
 * on the scaler states @scale @good @hyst @skipped; found: the step's
 * all-reduced inf/NaN flag.  dynamic=0: a fixed scale (only the skip counts). */
static int ref_SCALE_UPDATE(RtKctx *k) {
  double x[4];
  for (int i = 0; i < 4; i++) x[i] = rt_ld(rt_kenv_state(k->env, (int)k->n->ia[i]), kstate(k, i)->type.dtype, 0);
  int found = rt_ld(k->in[0], k->it[0]->dtype, 0) != 0;
  rt_scale_update(x, found, k->n->ia[4], k->n->ia[5], (int)k->n->ia[6], k->n->fa[0]);
  for (int i = 0; i < 4; i++) rt_st(rt_kenv_state(k->env, (int)k->n->ia[i]), kstate(k, i)->type.dtype, 0, x[i]);
  return 0;
}

void rt_scale_update(double st[4], int found, int64_t window, int64_t hysteresis, int dynamic, double min_scale) {
  double *scale = &st[0], *good = &st[1], *hyst = &st[2], *skipped = &st[3];
  if (found) *skipped += 1;
  if (!dynamic) return;
  if (found) {
    *good = 0;
    *hyst -= 1;
    if (*hyst <= 0) *scale = fmax(*scale * 0.5, min_scale);
  } else {
    *good += 1;
    if (*good == (double)window) {
      *good = 0;
      *hyst = (double)hysteresis;
      *scale *= 2.0;
    }
  }
}

/* ---- fp8 (passes/fp8.c): TE's delayed scaling ---- */
static int ref_QUANT8(RtKctx *k) {
  IrDtype d = k->it[0]->dtype, ft = k->ot->dtype;
  if (!(ir_dtype_is_float(d) || ir_dtype_is_16(d)) || !ir_dtype_is_8(ft) || k->it[1]->dtype != IR_F32)
    return rt_kfail(k, "quant8 takes (x, f32 scale) into fp8, not %s, %s -> %s", rt_tstr(k->it[0], 0),
                    rt_tstr(k->it[1], 1), ir_dtype_name(ft));
  float scale = *(const float *)k->in[1];
  int64_t n = ir_type_numel(k->ot);
  uint8_t *y = k->out;
  for (int64_t i = 0; i < n; i++) {
    float v = (float)rt_ld(k->in[0], d, i) * scale;   /* the product in f32, as TE's cast kernel */
    y[i] = ft == IR_F8E4M3 ? ts_f32_to_f8e4m3(v) : ts_f32_to_f8e5m2(v);
  }
  return 0;
}
static int ref_AMAX_ACC(RtKctx *k) {
  float *st = rt_kenv_state(k->env, (int)k->n->ia[0]);
  IrDtype d = k->it[0]->dtype;
  int64_t n = ir_type_numel(k->it[0]);
  float a = *st;
  for (int64_t i = 0; i < n; i++) {
    float v = fabsf((float)rt_ld(k->in[0], d, i));
    if (v != v || a != a) a = NAN;   /* a NaN is kept: fp8_scale then keeps the old scale */
    else if (v > a) a = v;
  }
  *st = a;
  return 0;
}
static int ref_MATMUL8(RtKctx *k) {
  if (!ir_dtype_is_8(k->it[0]->dtype) || !ir_dtype_is_8(k->it[1]->dtype) ||
      (k->ot->dtype != IR_BF16 && k->ot->dtype != IR_F32))
    return rt_kfail(k, "matmul8 takes two fp8 operands into bf16 or f32, not %s @ %s -> %s", rt_tstr(k->it[0], 0),
                    rt_tstr(k->it[1], 1), ir_dtype_name(k->ot->dtype));
  float alpha = *(const float *)k->in[2] * *(const float *)k->in[3];
  return matmul_f32_of(k, alpha);
}
void rt_fp8_scale(float *hist, int64_t len, float amax, int most_recent, double margin, double fmax, float *scale,
                  float *sinv) {
  memmove(hist + 1, hist, (size_t)(len - 1) * sizeof *hist);
  hist[0] = amax;
  float a = hist[0];
  for (int64_t i = 1; !most_recent && i < len; i++)
    a = a != a || hist[i] != hist[i] ? NAN : fmaxf(a, hist[i]);
  if (!(a > 0) || !isfinite(a)) return;   /* TE: keep the scale when amax is 0 or not finite */
  float sc = (float)(fmax / (double)a / pow(2.0, margin));   /* TE: (fp8_max / amax) / 2^margin */
  if (!isfinite(sc) || !(sc > 0)) return;
  *scale = sc;
  *sinv = 1.0f / sc;
}
static int ref_FP8_SCALE(RtKctx *k) {
  const IrState *h = kstate(k, 0);
  rt_fp8_scale(rt_kenv_state(k->env, (int)k->n->ia[0]), h->type.dim[0], (float)rt_ld(k->in[0], k->it[0]->dtype, 0),
               k->n->ia[3] == 1, k->n->fa[0], k->n->fa[1], rt_kenv_state(k->env, (int)k->n->ia[1]),
               rt_kenv_state(k->env, (int)k->n->ia[2]));
  return 0;
}

static int ref_ACCUM(RtKctx *k) {
  const IrState *s = kstate(k, 0);
  if (!ir_type_same_shape(&s->type, k->it[0]) || !ir_dtype_is_float(s->type.dtype))
    return rt_kfail(k, "cannot add %s into @%s %s", rt_tstr(k->it[0], 0), s->name, rt_tstr(&s->type, 1));
  return s->type.dtype == IR_F32 ? k_ACCUM_f32(k) : k_ACCUM_f64(k);
}

/* m, v (and grad) have the param's type, or (ZeRO) are all one flat chunk
 * [c] with c * (number of chunks) covering the param.  nmom moment states
 * (adamw 2, sgd and lion 1). */
static int opt_step_check(RtKctx *k, int nmom) {
  const IrState *w = kstate(k, 0), *m = kstate(k, 1);
  if (!ir_dtype_is_float(w->type.dtype)) return rt_kfail(k, "@%s is not a float tensor", w->name);
  IrType want = w->type;
  if (m->sh.flat && !w->sh.flat) {
    int64_t nb;
    rt_shard_block(k->env->rank, m->sh.flat, &nb);
    if (m->type.rank != 1 || m->type.dtype != w->type.dtype || m->type.dim[0] * nb < ir_type_numel(&w->type))
      return rt_kfail(k, "flat moment @%s %s cannot hold a chunk of @%s %s", m->name, rt_tstr(&m->type, 0),
                      w->name, rt_tstr(&w->type, 1));
    want = m->type;
  }
  if (w->sh.flat) want = w->type;   /* a ZeRO-3 shard: the moments and the gradient are the rank's chunk */
  for (int s = 1; s < 1 + nmom; s++)
    if (!ir_type_same_shape(&kstate(k, s)->type, &want) || kstate(k, s)->sh.flat != m->sh.flat)
      return rt_kfail(k, "@%s does not match @%s", kstate(k, s)->name, s == 1 ? w->name : m->name);
  if (!ir_type_same_shape(k->it[1], &want) || k->it[1]->dtype != w->type.dtype)
    return rt_kfail(k, "grad %s does not match %s", rt_tstr(k->it[1], 0), rt_tstr(&want, 1));
  if (ir_type_numel(k->it[0]) != 1) return rt_kfail(k, "the coefficient must be a scalar");
  return 0;
}
static int ref_ADAMW(RtKctx *k) {
  if (opt_step_check(k, 2)) return -1;
  return kstate(k, 0)->type.dtype == IR_F32 ? k_ADAMW_f32(k) : k_ADAMW_f64(k);
}
static int ref_SGD(RtKctx *k) {
  if (opt_step_check(k, 1)) return -1;
  return kstate(k, 0)->type.dtype == IR_F32 ? k_SGD_f32(k) : k_SGD_f64(k);
}
static int ref_LION(RtKctx *k) {
  if (opt_step_check(k, 1)) return -1;
  return kstate(k, 0)->type.dtype == IR_F32 ? k_LION_f32(k) : k_LION_f64(k);
}
static int ref_LR_STEP(RtKctx *k) {
  const IrState *w = kstate(k, 0);
  if (!ir_dtype_is_float(w->type.dtype)) return rt_kfail(k, "@%s is not a float tensor", w->name);
  if (!ir_type_same_shape(k->it[0], &w->type) || k->it[0]->dtype != w->type.dtype)
    return rt_kfail(k, "update %s does not match @%s %s", rt_tstr(k->it[0], 0), w->name, rt_tstr(&w->type, 1));
  return w->type.dtype == IR_F32 ? k_LR_STEP_f32(k) : k_LR_STEP_f64(k);
}

static int ref_ASSIGN(RtKctx *k) {
  const IrState *s = kstate(k, 0);
  if (!ir_type_same_shape(&s->type, k->it[0]) || s->type.dtype != k->it[0]->dtype)
    return rt_kfail(k, "cannot assign %s to @%s %s", rt_tstr(k->it[0], 0), s->name, rt_tstr(&s->type, 1));
  rt_par_memcpy(rt_kenv_state(k->env, (int)k->n->ia[0]), k->in[0],
                (size_t)ir_type_numel(&s->type) * ir_dtype_size(s->type.dtype));
  return 0;
}

/* ---- sharding ops (docs/sharding.md).  Collectives run over the rank's
 * group along the node's mesh axis (ia[0]); a group's rank i is coordinate
 * i on that axis, so "block i" of a dim is coordinate i's.  An axis of
 * size 1 needs no group: the collective is a copy. ---- */

/* The mesh axis of a sharding op (ia[0]), its size and the group (NULL for
 * size 1).  -1 with a message when the axis is bad or a group is missing. */
int rt_kaxis(RtKctx *k, IrAxis *ax, int *size, RtComm **g) {
  int64_t a = k->n->ia[0];
  if (ir_axes_mask(a) && (a < 0 || a >= IR_AXIS_COUNT)) {
    /* a set of axes (dp+cp): *ax = IR_AXIS_COUNT, no axis of its own */
    char nm[32];
    *ax = IR_AXIS_COUNT;
    *size = rt_rank_axes_size(k->env->rank, a);
    *g = rt_rank_axes_group(k->env->rank, a, 0);
    ir_axes_str(a, nm, sizeof nm);
    if (*size > 1 && !*g)
      return rt_kfail(k, "the axes %s have %d ranks but this rank has no %s group (mrun makes it)", nm, *size, nm);
    if (*g && rt_comm_size(*g) != *size)
      return rt_kfail(k, "the %s group has %d ranks, the mesh says %d", nm, rt_comm_size(*g), *size);
    return 0;
  }
  if (a < 0 || a >= IR_AXIS_COUNT) return rt_kfail(k, "mesh axis %lld out of range", (long long)a);
  *ax = (IrAxis)a;
  *size = rt_rank_axis_size(k->env->rank, *ax);
  *g = *size > 1 ? k->env->rank->group[*ax] : NULL;
  if (*size > 1 && !*g)
    return rt_kfail(k, "the %s axis has %d ranks but this rank has no %s group (run the plan with mrun --gpus)",
                    ir_axis_name(*ax), *size, ir_axis_name(*ax));
  if (*g && rt_comm_size(*g) != *size)
    return rt_kfail(k, "the %s group has %d ranks, the mesh says %d", ir_axis_name(*ax), rt_comm_size(*g), *size);
  return 0;
}

/* Operand 0 viewed as [outer, len, inner] around dim ia[1]. */
static int kdim(RtKctx *k, int64_t *outer, int64_t *len, int64_t *inner) {
  int d = rt_axis(k->n->ia[1], k->it[0]->rank);
  if (d < 0) return rt_kfail(k, "dim %lld out of range for %s", (long long)k->n->ia[1], rt_tstr(k->it[0], 0));
  rt_split(k->it[0], d, outer, len, inner);
  return 0;
}

static int kfloat(RtKctx *k) {
  if (!ir_dtype_is_float(k->ot->dtype) || same_dtype(k) != 0)
    return rt_kfail(k, "%s needs f32 or f64 operands, got %s", ir_ops[k->n->op].name, rt_tstr(k->it[0], 0));
  return 0;
}

/* x -> sum (red=0) or max (red=1) over the axis' ranks */
static int ref_ALL_REDUCE(RtKctx *k) {
  IrAxis ax;
  int size;
  RtComm *g;
  if (kfloat(k) || check_sig(k, "*", IR_VOID) || rt_kaxis(k, &ax, &size, &g)) return -1;
  if (k->n->ia[1] != 0 && k->n->ia[1] != 1) return rt_kfail(k, "red must be 0 (sum) or 1 (max)");
  size_t n = (size_t)ir_type_numel(k->ot);
  memcpy(k->out, k->in[0], n * ir_dtype_size(k->ot->dtype));
  if (!g) return 0;
  return k->n->ia[1] ? rt_comm_all_reduce_max(g, k->ot->dtype, k->out, n, k->err, k->errlen)
                     : rt_comm_all_reduce(g, k->ot->dtype, k->out, n, k->err, k->errlen);
}

/* x[outer, L, inner] -> y[outer, size*L, inner]: block q of the dim is
 * group rank q's x.  The comm layer concatenates along the leading dim, so
 * for outer > 1 the blocks go through a buffer [size][outer, L, inner]. */
int rt_all_gather_dim(RtComm *g, IrDtype dt, const void *x, void *y, int64_t outer, int64_t L,
                      int64_t inner, char *err, size_t errlen) {
  int size = g ? rt_comm_size(g) : 1;
  size_t es = ir_dtype_size(dt), blk = (size_t)(outer * L * inner);
  if (!g || size == 1) { memcpy(y, x, blk * es); return 0; }
  if (outer == 1) return rt_comm_all_gather(g, dt, x, y, blk, err, errlen);
  char *tmp = ts_xmalloc(blk * (size_t)size * es);
  int rc = rt_comm_all_gather(g, dt, x, tmp, blk, err, errlen);
  for (int q = 0; rc == 0 && q < size; q++)
    copy_axis(y, L * size, q * L, tmp + (size_t)q * blk * es, L, 0, L, outer, inner, es);
  free(tmp);
  return rc;
}

/* A collective along cp on a dim whose cp level is a zigzag (cp_layout.c):
 * 1 if so, 0 if not, -1 (with a message) when the layout cannot be handled:
 * an odd block, or the dim also split by an axis inside cp (the local block
 * would be a piece of a zigzag chunk). */
static int cp_zigzag_dim(RtKctx *k, IrAxis ax, int size, const IrSharding *sh, int64_t L) {
  if (ax != IR_AXIS_CP || size <= 1) return 0;
  int d = rt_axis(k->n->ia[1], k->it[0]->rank);
  if (ir_split_cp_minor(sh->split[d])) return 0;   /* cp contiguous and innermost: an ordinary block */
  if (sh->split[d] & ((1u << IR_AXIS_EP) | (1u << IR_AXIS_TP)))
    return rt_kfail(k, "dim %d is also split inside cp: the cp zigzag needs cp innermost here", d);
  if (L % 2) return rt_kfail(k, "the cp block of dim %d has odd length %lld: causal load balancing needs 2 chunks per rank", d, (long long)L);
  return 1;
}

static int ref_ALL_GATHER(RtKctx *k) {
  IrAxis ax;
  int size;
  RtComm *g;
  int64_t outer, L, inner;
  /* ids and 16-bit values are gathered too (bytes copied) */
  if (k->ot->dtype == IR_I32 || ir_dtype_is_16(k->ot->dtype) ? same_dtype(k) != 0 : kfloat(k))
    return rt_kfail(k, "all_gather needs f32, f64, bf16, f16 or i32 operands of the result's dtype, got %s",
                    rt_tstr(k->it[0], 0));
  if (rt_kaxis(k, &ax, &size, &g) || kdim(k, &outer, &L, &inner)) return -1;
  if (ir_type_numel(k->ot) != outer * L * inner * size) return rt_kfail(k, "result size is not %d times the operand's", size);
  int zz = cp_zigzag_dim(k, ax, size, rt_kin_sh(k, 0), L);
  if (zz < 0) return -1;
  if (!zz || !g) return rt_all_gather_dim(g, k->ot->dtype, k->in[0], k->out, outer, L, inner, k->err, k->errlen);
  size_t es = ir_dtype_size(k->ot->dtype);
  char *tmp = ts_xmalloc((size_t)(outer * L * inner * size) * es);   /* coordinate order */
  int rc = rt_all_gather_dim(g, k->ot->dtype, k->in[0], tmp, outer, L, inner, k->err, k->errlen);
  if (rc == 0) rt_cp_reorder(k->out, tmp, outer, size, L, inner, es, 1);
  free(tmp);
  return rc;
}

/* x[outer, size*L, inner] -> y[outer, L, inner] = block c (this rank's
 * coordinate) of the sum over the axis' ranks. */
static int ref_REDUCE_SCATTER(RtKctx *k) {
  IrAxis ax;
  int size;
  RtComm *g;
  int64_t outer, len, inner;
  if (kfloat(k) || rt_kaxis(k, &ax, &size, &g) || kdim(k, &outer, &len, &inner)) return -1;
  if (len % size) return rt_kfail(k, "dim of %s is not divisible by the size %d of its axes", rt_tstr(k->it[0], 0), size);
  int64_t L = len / size;
  size_t es = ir_dtype_size(k->ot->dtype), blk = (size_t)(outer * L * inner);
  if (ir_type_numel(k->ot) != (int64_t)blk) return rt_kfail(k, "result size is not 1/%d of the operand's", size);
  if (!g) { memcpy(k->out, k->in[0], blk * es); return 0; }
  int zz = cp_zigzag_dim(k, ax, size, &k->n->sh, L);
  if (zz < 0) return -1;
  const char *x = k->in[0];
  char *coord = NULL;              /* cp zigzag: the operand in coordinate order */
  if (zz) {
    coord = ts_xmalloc(blk * (size_t)size * es);
    rt_cp_reorder(coord, x, outer, size, L, inner, es, 0);
    x = coord;
  }
  int rc;
  if (outer == 1) {
    rc = rt_comm_reduce_scatter(g, k->ot->dtype, x, k->out, blk, k->err, k->errlen);
  } else {
    char *tmp = ts_xmalloc(blk * (size_t)size * es);   /* [size][outer, L, inner] */
    for (int q = 0; q < size; q++) copy_axis(tmp + (size_t)q * blk * es, L, 0, x, len, q * L, L, outer, inner, es);
    rc = rt_comm_reduce_scatter(g, k->ot->dtype, tmp, k->out, blk, k->err, k->errlen);
    free(tmp);
  }
  free(coord);
  return rc;
}

/* x[outer, size*L, inner] -> block c (this rank's coordinate) of dim; any
 * dtype, no communication. */
static int ref_SHARD_SLICE(RtKctx *k) {
  int64_t a = k->n->ia[0], outer, len, inner;
  if (same_dtype(k) != 0 || kdim(k, &outer, &len, &inner)) return -1;
  unsigned mask = ir_axes_mask(a);
  if (!mask) return rt_kfail(k, "mesh axis %lld out of range", (long long)a);
  /* a set (dp+cp): the block at the rank's flat index, outer axis major */
  int size = rt_rank_axes_size(k->env->rank, a);
  int c = a < IR_AXIS_COUNT ? k->env->rank->coord[a] : (int)rt_shard_block(k->env->rank, mask, NULL);
  char nm[32];
  if (len % size) return rt_kfail(k, "dim of %s is not divisible by the %s size %d", rt_tstr(k->it[0], 0), ir_axes_str(a, nm, sizeof nm), size);
  int64_t L = len / size;
  if (ir_type_numel(k->ot) != outer * L * inner) return rt_kfail(k, "result size is not 1/%d of the operand's", size);
  size_t es = ir_dtype_size(k->ot->dtype);
  int zz = a < IR_AXIS_COUNT ? cp_zigzag_dim(k, (IrAxis)a, size, &k->n->sh, L) : 0;
  if (zz < 0) return -1;
  if (!zz) {
    copy_axis(k->out, L, 0, k->in[0], len, c * L, L, outer, inner, es);
  } else {                         /* chunks c and 2*size-1-c (cp_layout.c) */
    int64_t h = L / 2;
    copy_axis(k->out, L, 0, k->in[0], len, c * h, h, outer, inner, es);
    copy_axis(k->out, L, h, k->in[0], len, (2 * size - 1 - c) * h, h, outer, inner, es);
  }
  return 0;
}

/* Checks global index id against [0, Vg) unless it is `ignore`. */
static int index_ok(RtKctx *k, int32_t id, int64_t pos, int64_t Vg) {
  if (id == k->n->ia[0] || (id >= 0 && id < Vg)) return 0;
  return rt_kfail(k, "index %d at position %lld is outside [0, %lld)", id, (long long)pos, (long long)Vg);
}

/* (x[rows, V], idx[rows] i32) -> y[rows] = x[r, idx[r] - off] where x's last
 * dim holds global [off, off + V) (its split); 0 outside the block or where
 * idx == ignore. */
static int ref_TAKE(RtKctx *k) {
  const IrType *xt = k->it[0];
  if (!ir_dtype_is_float(xt->dtype) || xt->rank < 1 || k->it[1]->dtype != IR_I32 || k->ot->dtype != xt->dtype)
    return rt_kfail(k, "take needs float x[..., V] and i32 indices, got %s and %s", rt_tstr(xt, 0), rt_tstr(k->it[1], 1));
  int64_t V, rows = rt_rows(xt, &V), nb;
  if (ir_type_numel(k->it[1]) != rows || ir_type_numel(k->ot) != rows)
    return rt_kfail(k, "indices %s do not match %s", rt_tstr(k->it[1], 0), rt_tstr(xt, 1));
  int64_t off = rt_shard_block(k->env->rank, rt_kin_sh(k, 0)->split[xt->rank - 1], &nb) * V;
  const int32_t *idx = k->in[1];
  for (int64_t r = 0; r < rows; r++) {
    if (index_ok(k, idx[r], r, nb * V)) return -1;
    int64_t j = (int64_t)idx[r] - off;
    double v = idx[r] != k->n->ia[0] && j >= 0 && j < V ? rt_ld(k->in[0], xt->dtype, r * V + j) : 0.0;
    rt_st(k->out, xt->dtype, r, v);
  }
  return 0;
}

/* idx[rows] i32 -> y[rows, V]: 1 at global column idx[r] (the result's last
 * dim holds global [off, off + V)), else 0; a row of 0 where idx == ignore. */
static int ref_ONEHOT(RtKctx *k) {
  const IrType *yt = k->ot;
  if (!ir_dtype_is_float(yt->dtype) || yt->rank < 1 || k->it[0]->dtype != IR_I32)
    return rt_kfail(k, "onehot needs i32 indices and a float result, got %s -> %s", rt_tstr(k->it[0], 0), rt_tstr(yt, 1));
  int64_t V, rows = rt_rows(yt, &V), nb;
  if (ir_type_numel(k->it[0]) != rows) return rt_kfail(k, "indices %s do not match %s", rt_tstr(k->it[0], 0), rt_tstr(yt, 1));
  int64_t off = rt_shard_block(k->env->rank, k->n->sh.split[yt->rank - 1], &nb) * V;
  const int32_t *idx = k->in[0];
  memset(k->out, 0, (size_t)ir_type_numel(yt) * ir_dtype_size(yt->dtype));
  for (int64_t r = 0; r < rows; r++) {
    if (index_ok(k, idx[r], r, nb * V)) return -1;
    int64_t j = (int64_t)idx[r] - off;
    if (idx[r] != k->n->ia[0] && j >= 0 && j < V) rt_st(k->out, yt->dtype, r * V + j, 1.0);
  }
  return 0;
}

/* x -> x with `fill` where the GLOBAL index along dim (ia[0]) is >= limit
 * (ia[1]); a split dim starts at the rank's block offset. */
static int ref_PAD_FILL(RtKctx *k) {
  if (kfloat(k) || check_sig(k, "*", IR_VOID)) return -1;
  const IrType *t = k->ot;
  int d = rt_axis(k->n->ia[0], t->rank);
  if (d < 0) return rt_kfail(k, "dim %lld out of range for %s", (long long)k->n->ia[0], rt_tstr(t, 0));
  int64_t outer, len, inner, lim = k->n->ia[1];
  rt_split(t, d, &outer, &len, &inner);
  int64_t off = rt_shard_block(k->env->rank, k->n->sh.split[d], NULL) * len;
  size_t es = ir_dtype_size(t->dtype);
  memcpy(k->out, k->in[0], (size_t)ir_type_numel(t) * es);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t l = lim - off > 0 ? lim - off : 0; l < len; l++)
      for (int64_t i = 0; i < inner; i++) rt_st(k->out, t->dtype, (o * len + l) * inner + i, k->n->fa[0]);
  return 0;
}

/* ---- the table: one entry per ops.def row ---- */
const RtKernel rt_ref_kernels[IR_OP_COUNT] = {
#define X(name, text, nin, ia, fa, flags, doc) [IR_OP_##name] = ref_##name,
#include "ir/ops.def"
#undef X
};
