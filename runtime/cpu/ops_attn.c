/* ops_attn.c - reference kernels of the fused attention ops (attention,
 * attention_bwd; docs/ir.md "Fused attention"), entries of rt_ref_kernels
 * (ops_ref.c) like every other kernel.
 *
 * Flash style: the forward walks 64 x 64 tiles of (queries, keys) with an
 * online softmax (running max m, running sum l, unnormalised accumulator;
 * the tile's scores and products are BLAS GEMMs), so nothing of size
 * [Tq, Tk] is ever held; the backward recomputes the probabilities
 * p = exp(scale q.k - lse) from q, k and the log-sum-exp rows, which it
 * recomputes itself (one pass over the keys without the products) rather
 * than taking them from the forward, so both ops keep single results.
 * One backward pass gives dq, dk and dv together from shared
 * probabilities (rt_attn_grads_run): the reference runs it for the one
 * part its node asks for, the LLVM backend once for all the parts of one
 * attention (plan_attn_grad_runs, plan/groups.h).
 *
 * Positions: a causal mask hides key j from query i when the GLOBAL
 * position of j is after that of i.  Global positions come from the
 * operands' shardings (the seq dim, 2, may be split over cp -- a zigzag,
 * runtime/cpu/cp_layout.c -- or over tp under sequence parallelism), so the
 * kernel works on any block of the sequence.
 *
 * Ring attention (context parallelism) is not here: the sharding pass
 * lowers it into one attn_* step per cp rank (ops_ring.c, docs/sharding.md
 * "Ring attention"), so these kernels see whole keys or a gathered
 * sequence.
 *
 * Arithmetic is in the operands' dtype (sgemm and expf for f32; attn_t.h),
 * row statistics in double.  Threads: rt_par_for over (batch, query head)
 * for the forward, over (batch, kv head) for the backward (a kv head's
 * gradient sums over its query heads, and each query head reads one kv
 * head, so one thread owns all three gradients of its heads): no result
 * depends on the thread count.
 *
 * The tile loops (forward block, dq, dk / dv) are declared in attn_priv.h:
 * the ring-attention step kernels (ops_ring.c) run the same ones on one
 * key block each, so both paths give the same numbers. */
#include "attn_priv.h"
#include "par.h"
#include <cblas.h>
#include <math.h>

#ifndef ATTN_TQ
#define ATTN_TQ 64            /* query rows per tile */
#endif
#ifndef ATTN_TK
#define ATTN_TK 64            /* key rows per tile */
#endif
#ifndef ATTN_TK_ROW
#define ATTN_TK_ROW 512       /* the whole backward takes up to this many keys as ONE tile per row: its
                                 softmax then comes from the tile, with no log-sum-exp pass first */
#endif

/* ---- operands ---- */

double *rt_attn_f64(const void *x, IrDtype dt, int64_t n, int *own) {
  if (dt == IR_F64) { *own = 0; return (double *)x; }
  double *y = ts_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = ((const float *)x)[i];
  *own = 1;
  return y;
}

void rt_attn_store(void *out, IrDtype dt, const double *y, int64_t n) {
  if (dt == IR_F64) { if (out != (void *)y) memcpy(out, y, (size_t)n * sizeof *y); return; }
  for (int64_t i = 0; i < n; i++) ((float *)out)[i] = (float)y[i];
}

void rt_attn_positions(const RtRank *r, unsigned mask, int64_t L, int cp, int64_t *pos) {
  for (int64_t j = 0; j < L; j++) pos[j] = rt_global_index_at(r, mask, L, j, cp);
}

int rt_attn_slopes(RtKctx *k, int sl, int64_t Hq, double **out) {
  const IrType *t = k->it[sl];
  *out = NULL;
  if ((t->dtype != IR_F32 && t->dtype != IR_F64) || t->rank != 1)
    return rt_kfail(k, "ALiBi slopes %s must be f32 or f64 [heads]", rt_tstr(t, 0));
  int64_t *hpos = ts_xmalloc((size_t)(Hq + 1) * sizeof *hpos);
  double *s = ts_xmalloc((size_t)(Hq + 1) * sizeof *s);
  rt_attn_positions(k->env->rank, rt_kin_sh(k, 0)->split[1], Hq, -1, hpos);
  for (int64_t h = 0; h < Hq; h++) {
    if (hpos[h] < 0 || hpos[h] >= t->dim[0]) {
      int64_t g = hpos[h];
      free(hpos);
      free(s);
      return rt_kfail(k, "query head %lld has no ALiBi slope (%lld of them)", (long long)g, (long long)t->dim[0]);
    }
    s[h] = t->dtype == IR_F64 ? ((const double *)k->in[sl])[hpos[h]] : ((const float *)k->in[sl])[hpos[h]];
  }
  free(hpos);
  *out = s;
  return 0;
}

int rt_attn_extras(RtKctx *k, AttnDims *d, const int64_t *qpos, const int64_t *kpos) {
  d->doc = NULL;
  d->Tdoc = 0;
  d->slope = NULL;
  d->bias = NULL;
  d->bias_hs = 0;
  int sl = ir_attn_slope(k->n), idx = ir_attn_doc(k->n), bi = ir_attn_bias(k->n);
  if (sl >= 0) {
    double *s;
    if (rt_attn_slopes(k, sl, d->Hq, &s) != 0) return -1;
    d->slope = s;
  }
  if (bi >= 0) {   /* local heads and rows: the sharding pass splits it with q's heads, never along Tq / Tk */
    const IrType *t = k->it[bi];
    if (t->dtype != k->it[0]->dtype || t->rank != 3 || (t->dim[0] != d->Hq && t->dim[0] != 1) ||
        t->dim[1] != d->Tq || t->dim[2] != d->Tk)
      return rt_kfail(k, "score bias %s must be %s [%lld or 1, %lld, %lld]", rt_tstr(t, 0),
                      ir_dtype_name(k->it[0]->dtype), (long long)d->Hq, (long long)d->Tq, (long long)d->Tk);
    d->bias = k->in[bi];
    d->bias_hs = t->dim[0] == 1 ? 0 : d->Tq * d->Tk;
  }
  if (idx < 0) return 0;
  const IrType *t = k->it[idx];
  if (t->dtype != IR_I32 || t->rank != 2 || t->dim[0] != d->B)
    return rt_kfail(k, "document ids %s must be i32 [%lld, seq]", rt_tstr(t, 0), (long long)d->B);
  for (int64_t i = 0; i < d->Tq + d->Tk; i++) {
    int64_t p = i < d->Tq ? qpos[i] : kpos[i - d->Tq];
    if (p < 0 || p >= t->dim[1])
      return rt_kfail(k, "position %lld is outside the document ids' %lld (they must cover the whole sequence)",
                      (long long)p, (long long)t->dim[1]);
  }
  d->doc = k->in[idx];
  d->Tdoc = t->dim[1];
  return 0;
}

/* ---- exponentials of a score row ----
 * x[i] = exp(x[i] - m) for i < n; a masked score (-inf) gives exactly 0.
 * f64: libm.  f32: the softmax of every attention row is most of the
 * non-GEMM work, and libm's expf is a call per element the compiler
 * cannot vectorize (without -ffast-math); this is Cephes' expf (range
 * reduction by ln 2 in two parts, a degree-6 polynomial, the exponent put
 * into the bits), plain arithmetic that vectorizes (with
 * -fno-trapping-math, CMakeLists.txt), within 1.4 x 2^-24 relative of
 * exp over [-87, 10] (libm's expf: 1.0); below -87 it gives 0. */
/* The tile loops are built twice on x86-64 with GCC: for the baseline ISA
 * and for x86-64-v3 (AVX2), picked once by the CPU (rt_attn_set_isa), so
 * the row loops (max, exponential, sums, ds) run 8 lanes wide instead of
 * 4 (the f32 exponential: 2.3 -> 0.6 ns, measured).  Both do the same
 * operations in the same order (this file is compiled with
 * -ffp-contract=off: no multiply-add is fused), so they give the same bits
 * (tests/runtime checks) and no result depends on the machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATTN_HAVE_V3 1
#else
#define ATTN_HAVE_V3 0
#endif
#define ATTN_INLINE static inline __attribute__((always_inline))

ATTN_INLINE void attn_exp_row_f64(double *x, int64_t n, double m) {
  for (int64_t i = 0; i < n; i++) x[i] = exp(x[i] - m);
}
ATTN_INLINE void attn_exp_row_f32(float *x, int64_t n, float m) {
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] - m;
    float c = v < -87.0f ? -87.0f : v;                    /* exp(-87) is still normal */
    c = c > 88.0f ? 88.0f : c;
    float kf = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   /* round(c / ln 2) */
    float r = (c - kf * 0.693359375f) + kf * 2.12194440e-4f;             /* c - kf ln 2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)kf + 127) << 23;                            /* 2^kf */
    float sc;
    memcpy(&sc, &bits, sizeof sc);
    x[i] = v < -87.0f ? 0.0f : p * sc;                    /* masked (-inf) or underflow: 0 */
  }
}

/* ---- the tile loops, instantiated per dtype and ISA (attn_t.h) ---- */
typedef struct { int64_t i0, nq, j0, nk; } Tile;

#define ISA base
#include "attn_isa.h"
#undef ISA
#if ATTN_HAVE_V3
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define ISA v3
#include "attn_isa.h"
#undef ISA
#pragma GCC pop_options
#endif

/* 0 until the first kernel: then 1 (baseline) or 2 (x86-64-v3) */
static int attn_isa;

int rt_attn_set_isa(int isa) {
  int v3 = 0;
#if ATTN_HAVE_V3
  __builtin_cpu_init();
  v3 = __builtin_cpu_supports("x86-64-v3");
#endif
  int now = isa == 1 || !v3 ? 1 : 2;
  __atomic_store_n(&attn_isa, now, __ATOMIC_RELAXED);
  return now;
}

/* The range function of a loop for the job's dtype and the ISA in use. */
static RtParFn attn_range(IrDtype dt, RtParFn f32_base, RtParFn f64_base, RtParFn f32_v3, RtParFn f64_v3) {
  int isa = __atomic_load_n(&attn_isa, __ATOMIC_RELAXED);
  if (!isa) isa = rt_attn_set_isa(0);
  if (isa == 2 && ATTN_HAVE_V3) return dt == IR_F32 ? f32_v3 : f64_v3;
  return dt == IR_F32 ? f32_base : f64_base;
}
#if ATTN_HAVE_V3
#define ATTN_RANGE(name, dt) attn_range((dt), name##_f32_base, name##_f64_base, name##_f32_v3, name##_f64_v3)
#else
#define ATTN_RANGE(name, dt) attn_range((dt), name##_f32_base, name##_f64_base, NULL, NULL)
#endif

/* Many small GEMMs, one thread's each: BLAS itself runs single-threaded.
 * A range gets at least ATTN_GRAIN multiply-adds of the scores (Tq Tk D
 * per head): below that, waking the pool costs more than the work (a
 * 64-token, 16-wide head is 65k). */
#define ATTN_GRAIN (1 << 16)
static int64_t attn_grain(const AttnDims *d, int64_t heads_per_item) {
  double w = (double)d->Tq * (double)d->Tk * (double)d->D * (double)heads_per_item;
  return w >= ATTN_GRAIN ? 1 : (int64_t)(ATTN_GRAIN / (w > 1 ? w : 1));
}
#define ATTN_PAR(n, per, name, j) rt_par_blas_serial(ATTN_RANGE(name, (j)->dt), (void *)(j), (n), attn_grain(&(j)->d, (per)))

void rt_attn_fwd_block(const AttnFwdJob *j) { ATTN_PAR(j->d.B * j->d.Hq, 1, fwd_range, j); }
void rt_attn_bwd_q(const AttnBwdJob *j) { ATTN_PAR(j->d.B * j->d.Hq, 1, bwd_q_range, j); }
void rt_attn_bwd_kv(const AttnBwdJob *j) { ATTN_PAR(j->d.B * j->d.Hkv, j->d.Hq / j->d.Hkv, bwd_kv_range, j); }
void rt_attn_bwd_bias(const AttnBwdJob *j) {
  int64_t nb = j->d.bias_hs ? j->d.Hq : 1;
  ATTN_PAR(nb, j->d.B * j->d.Hq / nb, bwd_bias_range, j);
}

/* m, l -> lse in place of m (-inf for a row that sees no key); acc -> o =
 * acc / l (0 for such a row: no NaN when a rank's queries are all masked). */
static void fwd_finish(int64_t rows, int64_t D, double *m, const double *l, void *acc, IrDtype dt) {
  for (int64_t r = 0; r < rows; r++) {
    double inv = l[r] > 0 ? 1.0 / l[r] : 0.0;
    if (acc && dt == IR_F64)
      for (int64_t e = 0; e < D; e++) ((double *)acc)[r * D + e] *= inv;
    else if (acc)
      for (int64_t e = 0; e < D; e++) ((float *)acc)[r * D + e] = (float)(((float *)acc)[r * D + e] * inv);
    m[r] = l[r] > 0 ? m[r] + log(l[r]) : -INFINITY;
  }
}

/* ---- the kernels ---- */

/* Everything one call needs: dims, the operands (q, k, v, o, do) in their
 * dtype, positions. */
typedef struct {
  AttnDims d;
  IrDtype dt;
  const void *x[5];
  int64_t *qpos, *kpos;
} Attn;

static int attn_open(RtKctx *k, Attn *a, int nin) {
  memset(a, 0, sizeof *a);
  const IrType *q = k->it[0], *kt = k->it[1];
  IrDtype dt = q->dtype;
  if (dt != IR_F32 && dt != IR_F64) return rt_kfail(k, "needs f32 or f64 operands");
  for (int i = 0; i < nin; i++)
    if (k->it[i]->dtype != dt || k->it[i]->rank != 4) return rt_kfail(k, "operand %d must be a 4-D %s tensor", i + 1,
                                                                    ir_dtype_name(dt));
  a->d = (AttnDims){q->dim[0], q->dim[1], kt->dim[1], q->dim[2], kt->dim[2], q->dim[3], k->n->fa[0],
                    (int)k->n->ia[0], NULL, 0, ir_attn_window(k->n), NULL, NULL, 0};
  if (a->d.Hkv < 1 || a->d.Hq % a->d.Hkv) return rt_kfail(k, "query heads %lld are not a multiple of kv heads %lld",
                                                          (long long)a->d.Hq, (long long)a->d.Hkv);
  a->dt = dt;
  for (int i = 0; i < nin; i++) a->x[i] = k->in[i];
  a->qpos = ts_xmalloc((size_t)(a->d.Tq + 1) * sizeof *a->qpos);
  a->kpos = ts_xmalloc((size_t)(a->d.Tk + 1) * sizeof *a->kpos);
  rt_attn_positions(k->env->rank, rt_kin_sh(k, 0)->split[2], a->d.Tq, -1, a->qpos);
  rt_attn_positions(k->env->rank, rt_kin_sh(k, 1)->split[2], a->d.Tk, -1, a->kpos);
  return rt_attn_extras(k, &a->d, a->qpos, a->kpos);
}

static void attn_close(Attn *a) {
  free(a->qpos);
  free(a->kpos);
  free((void *)a->d.slope);
}

/* (q, k, v) -> o: the online softmax of this rank's queries over the keys,
 * written straight into the result. */
int ref_ATTENTION(RtKctx *k) {
  Attn a;
  if (attn_open(k, &a, 3)) { attn_close(&a); return -1; }
  int64_t rows = a.d.B * a.d.Hq * a.d.Tq;
  double *m = ts_xmalloc((size_t)(rows + 1) * sizeof *m), *l = ts_xcalloc((size_t)rows + 1, sizeof *l);
  for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY;
  memset(k->out, 0, (size_t)(rows * a.d.D) * ir_dtype_size(a.dt));
  AttnFwdJob j = {a.d, a.dt, a.x[0], a.x[1], a.x[2], a.qpos, a.kpos, m, l, k->out};
  rt_attn_fwd_block(&j);
  fwd_finish(rows, a.d.D, m, l, k->out, a.dt);
  free(l);
  free(m);
  attn_close(&a);
  return 0;
}

int rt_attn_grads_run(RtKctx *k, void *out[4]) {
  Attn a;
  if (attn_open(k, &a, 5)) { attn_close(&a); return -1; }
  size_t es = ir_dtype_size(a.dt);
  int64_t nq = a.d.B * a.d.Hq * a.d.Tq * a.d.D, nk = a.d.B * a.d.Hkv * a.d.Tk * a.d.D;
  for (int p = 0; p < 3; p++)   /* the results accumulate */
    if (out[p]) memset(out[p], 0, (size_t)(p ? nk : nq) * es);
  AttnBwdJob j = {a.d, a.dt, a.x[0], a.x[1], a.x[2], a.x[3], a.x[4], NULL, NULL, a.qpos, a.kpos, out[0], out[1], out[2],
                  NULL};
  if (out[0] || out[1] || out[2]) rt_attn_bwd_kv(&j);   /* lse NULL: the whole backward */
  if (out[3] && !a.d.bias) {
    attn_close(&a);
    return rt_kfail(k, "part 3 (dbias) needs the score bias operand (bias=1)");
  }
  if (out[3]) {   /* summed in double over the batch, then stored in the bias's dtype */
    int64_t nb = (a.d.bias_hs ? a.d.Hq : 1) * a.d.Tq * a.d.Tk;
    j.dq = j.dk = j.dv = NULL;
    j.dbias = ts_xcalloc((size_t)nb + 1, sizeof *j.dbias);
    rt_attn_bwd_bias(&j);
    rt_attn_store(out[3], a.dt, j.dbias, nb);
    free(j.dbias);
  }
  attn_close(&a);
  return 0;
}

/* (q, k, v, o, do) -> one part of the gradient (dq, dk or dv): the whole
 * backward with the other two left out.  The LLVM backend runs the parts
 * of one attention together instead (rt_attn_grads_run). */
int ref_ATTENTION_BWD(RtKctx *k) {
  int part = (int)k->n->ia[1];
  if (part < 0 || part > 3) return rt_kfail(k, "part must be 0, 1, 2 or 3");
  void *out[4] = {NULL, NULL, NULL, NULL};
  out[part] = k->out;
  return rt_attn_grads_run(k, out);
}
