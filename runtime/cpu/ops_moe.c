/* ops_moe.c - reference kernels of the sparse mixture-of-experts ops
 * (moe_counts, moe_perm, moe_unperm, moe_gate_grad, gmm, gmm_dw; ops.def
 * and docs/ir.md "Token dispatch"), entries of rt_ref_kernels (ops_ref.c)
 * like every other kernel.
 *
 * routed [N, E] is a 0/1 mask (a float; != 0 counts as routed).  The TOKEN
 * LAYOUT of R rows holds expert 0's routed tokens in token order, then
 * expert 1's, ...; rows past the routed total are 0.  row(t, e) is computed
 * once per kernel call into a [N, E] map (token_rows).  gmm / gmm_dw read
 * the EXPERT LAYOUT: group g holds sum_s cnt[s, g] rows, groups one after
 * the other; only the group totals matter here.
 *
 * f32 and f64: the row loops are typed per row (ROW_LOOP); sums (unperm
 * over experts, gate_grad's dot products) accumulate in double.  Every
 * token's result is computed by one thread in a fixed order, so results do
 * not depend on the thread count.  gmm / gmm_dw run each group as ONE BLAS
 * call (BLAS threads split M and N, never K: results do not change with
 * threads either). */
#include "kernels.h"
#include "par.h"
#include <cblas.h>
#include <limits.h>

/* Rows of a few hundred elements: enough work per range to pay the pool. */
#define MOE_GRAIN_ELEMS 32768

static int64_t grain_rows(int64_t D) { return D >= MOE_GRAIN_ELEMS ? 1 : MOE_GRAIN_ELEMS / (D > 0 ? D : 1); }

static int is_f(IrDtype t) { return t == IR_F32 || t == IR_F64; }

static int routed_at(const void *r, IrDtype t, int64_t i) {
  return t == IR_F32 ? ((const float *)r)[i] != 0.0f : ((const double *)r)[i] != 0.0;
}
static double ldd(const void *p, IrDtype t, int64_t i) {
  return t == IR_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Checks routed (operand ri) is a float [N, E]; into *N, *E. */
static int routed_dims(RtKctx *k, int ri, int64_t *N, int64_t *E) {
  const IrType *r = k->it[ri];
  if (!is_f(r->dtype) || r->rank != 2)
    return rt_kfail(k, "routing mask %s must be a float [tokens, experts]", rt_tstr(r, 0));
  *N = r->dim[0];
  *E = r->dim[1];
  return 0;
}

/* map[t * E + e] = row of (t, e) in the token layout, -1 where not routed;
 * the routed total into *total.  Fails (naming the counts) when the routed
 * pairs do not fit in R rows. */
static int token_rows(RtKctx *k, const void *r, IrDtype rt, int64_t N, int64_t E, int64_t R, int64_t *map,
                      int64_t *total) {
  int64_t row = 0;
  for (int64_t e = 0; e < E; e++)
    for (int64_t t = 0; t < N; t++)
      map[t * E + e] = routed_at(r, rt, t * E + e) ? row++ : -1;
  *total = row;
  if (row > R)
    return rt_kfail(k, "%lld routed (token, expert) pairs do not fit in the %lld rows (rows= must be an upper "
                    "bound on the routed slots: tokens * topk, or the capacity)", (long long)row, (long long)R);
  return 0;
}

/* ---- moe_counts: routed[N, E] -> i32[1, E] ---- */
int ref_MOE_COUNTS(RtKctx *k) {
  int64_t N, E;
  if (routed_dims(k, 0, &N, &E)) return -1;
  if (k->ot->dtype != IR_I32 || ir_type_numel(k->ot) != E)
    return rt_kfail(k, "result %s must be i32[1, %lld]", rt_tstr(k->ot, 0), (long long)E);
  int32_t *c = k->out;
  for (int64_t e = 0; e < E; e++) {
    int64_t n = 0;
    for (int64_t t = 0; t < N; t++) n += routed_at(k->in[0], k->it[0]->dtype, t * E + e);
    if (n > INT32_MAX) return rt_kfail(k, "expert %lld has more than 2^31 rows", (long long)e);
    c[e] = (int32_t)n;
  }
  return 0;
}

/* ---- row kernels over tokens ----
 * One job for perm, unperm and gate_grad: token range [lo, hi). */
typedef struct {
  IrDtype dt;            /* dtype of x / y / d / scale */
  int64_t N, E, D;
  const int64_t *map;    /* [N, E] rows of the token layout, -1 = not routed */
  const void *x, *y, *s; /* operands by role (see each kernel) */
  void *out;
} MoeJob;

/* dst[0:D] OP c * src[0:D], typed per row. */
#define ROW_LOOP(T, dst, src, c, D, OP)                                        \
  do {                                                                         \
    T *dp_ = (T *)(dst);                                                       \
    const T *sp_ = (const T *)(src);                                           \
    for (int64_t j_ = 0; j_ < (D); j_++) dp_[j_] OP (T)((c) * (double)sp_[j_]); \
  } while (0)

/* perm: out[row(t, e)] = s[t, e] * x[t] */
static void perm_rows(void *jp, int64_t lo, int64_t hi) {
  const MoeJob *j = jp;
  size_t es = ir_dtype_size(j->dt);
  for (int64_t t = lo; t < hi; t++)
    for (int64_t e = 0; e < j->E; e++) {
      int64_t r = j->map[t * j->E + e];
      if (r < 0) continue;
      double c = ldd(j->s, j->dt, t * j->E + e);
      char *dst = (char *)j->out + (size_t)(r * j->D) * es;
      const char *src = (const char *)j->x + (size_t)(t * j->D) * es;
      if (j->dt == IR_F32) ROW_LOOP(float, dst, src, c, j->D, =);
      else ROW_LOOP(double, dst, src, c, j->D, =);
    }
}

/* unperm: out[t] = sum over routed e (in expert order) of s[t, e] * y[row(t, e)] */
static void unperm_rows(void *jp, int64_t lo, int64_t hi) {
  const MoeJob *j = jp;
  double *acc = ts_xmalloc((size_t)(j->D > 0 ? j->D : 1) * sizeof *acc);
  for (int64_t t = lo; t < hi; t++) {
    for (int64_t c = 0; c < j->D; c++) acc[c] = 0.0;
    for (int64_t e = 0; e < j->E; e++) {
      int64_t r = j->map[t * j->E + e];
      if (r < 0) continue;
      double c = ldd(j->s, j->dt, t * j->E + e);
      for (int64_t q = 0; q < j->D; q++) acc[q] += c * ldd(j->y, j->dt, r * j->D + q);
    }
    if (j->dt == IR_F32)
      for (int64_t q = 0; q < j->D; q++) ((float *)j->out)[t * j->D + q] = (float)acc[q];
    else
      memcpy((double *)j->out + t * j->D, acc, (size_t)j->D * sizeof *acc);
  }
  free(acc);
}

/* gate_grad: out[t, e] = <y[row(t, e)], x[t]> where routed, else 0 */
static void gate_rows(void *jp, int64_t lo, int64_t hi) {
  const MoeJob *j = jp;
  for (int64_t t = lo; t < hi; t++)
    for (int64_t e = 0; e < j->E; e++) {
      int64_t r = j->map[t * j->E + e];
      double dot = 0.0;
      if (r >= 0)
        for (int64_t q = 0; q < j->D; q++) dot += ldd(j->y, j->dt, r * j->D + q) * ldd(j->x, j->dt, t * j->D + q);
      if (j->dt == IR_F32) ((float *)j->out)[t * j->E + e] = (float)dot;
      else ((double *)j->out)[t * j->E + e] = dot;
    }
}

/* The common checks of perm / unperm / gate_grad: routed (operand ri)
 * [N, E]; the token-side operand ti [N, D] and the row-side operand yi
 * [R, D] (yi = -1: the result is the row side) share routed's dtype; scale
 * (operand si, -1 = none) is routed's type.  Fills j (dt, N, E, D) and *R. */
static int moe_check(RtKctx *k, int ri, int ti, int yi, int si, MoeJob *j, int64_t *R) {
  if (routed_dims(k, ri, &j->N, &j->E)) return -1;
  const IrType *rt = k->it[ri], *xt = ti >= 0 ? k->it[ti] : k->ot, *yt = yi >= 0 ? k->it[yi] : k->ot;
  j->dt = rt->dtype;
  if (xt->dtype != j->dt || xt->rank != 2 || xt->dim[0] != j->N)
    return rt_kfail(k, "tokens %s must be [%lld, D] of the routing mask's dtype", rt_tstr(xt, 0), (long long)j->N);
  if (yt->dtype != j->dt || yt->rank != 2 || yt->dim[1] != xt->dim[1])
    return rt_kfail(k, "rows %s and tokens %s must have one width and dtype", rt_tstr(yt, 0), rt_tstr(xt, 1));
  if (si >= 0 && (k->it[si]->dtype != j->dt || ir_type_numel(k->it[si]) != j->N * j->E))
    return rt_kfail(k, "scale %s must have the routing mask's type %s", rt_tstr(k->it[si], 0), rt_tstr(rt, 1));
  j->D = xt->dim[1];
  *R = yt->dim[0];
  return 0;
}

/* j->map of the routing mask in operand ri (token_rows), or NULL after
 * failing; the caller frees it. */
static int64_t *job_map(RtKctx *k, int ri, MoeJob *j, int64_t R) {
  int64_t total, *map = ts_xmalloc((size_t)(j->N * j->E > 0 ? j->N * j->E : 1) * sizeof *map);
  if (token_rows(k, k->in[ri], j->dt, j->N, j->E, R, map, &total)) { free(map); return NULL; }
  j->map = map;
  return map;
}

/* (x[N, D], routed[N, E], scale[N, E]; rows=R) -> [R, D] token layout */
int ref_MOE_PERM(RtKctx *k) {
  MoeJob j = {0};
  int64_t R;
  if (moe_check(k, 1, 0, -1, 2, &j, &R)) return -1;
  if (R != k->n->ia[0]) return rt_kfail(k, "result %s does not have rows=%lld", rt_tstr(k->ot, 0), (long long)k->n->ia[0]);
  int64_t *map = job_map(k, 1, &j, R);
  if (!map) return -1;
  j.x = k->in[0];
  j.s = k->in[2];
  j.out = k->out;
  memset(k->out, 0, (size_t)(R * j.D) * ir_dtype_size(j.dt));
  rt_par_for(j.N, grain_rows(j.D * j.E), perm_rows, &j);
  free(map);
  return 0;
}

/* (y[R, D] token layout, routed[N, E], scale[N, E]) -> [N, D] */
int ref_MOE_UNPERM(RtKctx *k) {
  MoeJob j = {0};
  int64_t R;
  if (moe_check(k, 1, -1, 0, 2, &j, &R)) return -1;
  int64_t *map = job_map(k, 1, &j, R);
  if (!map) return -1;
  j.y = k->in[0];
  j.s = k->in[2];
  j.out = k->out;
  rt_par_for(j.N, grain_rows(j.D * j.E), unperm_rows, &j);
  free(map);
  return 0;
}

/* (y[R, D] token layout, d[N, D], routed[N, E]) -> [N, E] */
int ref_MOE_GATE_GRAD(RtKctx *k) {
  MoeJob j = {0};
  int64_t R;
  if (moe_check(k, 2, 1, 0, -1, &j, &R)) return -1;
  if (k->ot->dtype != j.dt || ir_type_numel(k->ot) != j.N * j.E)
    return rt_kfail(k, "result %s must have the routing mask's type %s", rt_tstr(k->ot, 0), rt_tstr(k->it[2], 1));
  int64_t *map = job_map(k, 2, &j, R);
  if (!map) return -1;
  j.y = k->in[0];
  j.x = k->in[1];
  j.out = k->out;
  rt_par_for(j.N, grain_rows(j.D * j.E), gate_rows, &j);
  free(map);
  return 0;
}

/* ---- grouped matmuls ---- */

/* The group totals of cnt i32[S, G] (operand 2) into tot[G]; fails on a
 * negative count or groups that do not fit in R rows. */
static int group_rows(RtKctx *k, int64_t G, int64_t R, int64_t *tot) {
  const IrType *ct = k->it[2];
  if (ct->dtype != IR_I32 || ct->rank != 2 || ct->dim[1] != G)
    return rt_kfail(k, "counts %s must be i32[sources, %lld]", rt_tstr(ct, 0), (long long)G);
  const int32_t *c = k->in[2];
  int64_t S = ct->dim[0], sum = 0;
  for (int64_t g = 0; g < G; g++) {
    tot[g] = 0;
    for (int64_t s = 0; s < S; s++) {
      if (c[s * G + g] < 0) return rt_kfail(k, "count [%lld, %lld] is negative (%d)", (long long)s, (long long)g, c[s * G + g]);
      tot[g] += c[s * G + g];
    }
    sum += tot[g];
  }
  if (sum > R) return rt_kfail(k, "the groups hold %lld rows, more than the %lld of %s", (long long)sum, (long long)R, rt_tstr(k->it[0], 0));
  return 0;
}

/* C[M, N] = op(A) op(B), one BLAS call in the dtype. */
static void gemm(IrDtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                 const void *B, int64_t ldb, void *C) {
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (dt == IR_F64)
    cblas_dgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb, 0.0, C, (int)N);
  else
    cblas_sgemm(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, 0.0f, C, (int)N);
}

static int blas_dims(RtKctx *k, int64_t a, int64_t b, int64_t c, int64_t d) {
  if (a > INT_MAX || b > INT_MAX || c > INT_MAX || d > INT_MAX) return rt_kfail(k, "matrix dims exceed the BLAS int range");
  return 0;
}

/* (a[R, K] expert layout, w[G, K, N] (tb: [G, N, K]), cnt i32[S, G]) -> [R, N]:
 * y_g = a_g w_g (tb: a_g w_g^T) per group, rows past the groups 0. */
int ref_GMM(RtKctx *k) {
  const IrType *at = k->it[0], *wt = k->it[1];
  int tb = k->n->ia[0] != 0;
  IrDtype dt = at->dtype;
  if (!is_f(dt) || at->rank != 2 || wt->rank != 3 || wt->dtype != dt || k->ot->dtype != dt)
    return rt_kfail(k, "needs a[R, K] and w[G, K, N] of one float dtype, got %s and %s", rt_tstr(at, 0), rt_tstr(wt, 1));
  int64_t R = at->dim[0], K = at->dim[1], G = wt->dim[0];
  int64_t Kw = tb ? wt->dim[2] : wt->dim[1], N = tb ? wt->dim[1] : wt->dim[2];
  if (Kw != K || k->ot->rank != 2 || k->ot->dim[0] != R || k->ot->dim[1] != N)
    return rt_kfail(k, "%s times %s%s does not give %s", rt_tstr(at, 0), rt_tstr(wt, 1), tb ? " (tb)" : "", rt_tstr(k->ot, 0));
  if (blas_dims(k, R, K, N, K * N)) return -1;
  int64_t *tot = ts_xmalloc((size_t)(G > 0 ? G : 1) * sizeof *tot);
  if (group_rows(k, G, R, tot)) { free(tot); return -1; }
  (void)rt_par_threads();   /* first call: shares the cores among local ranks (par.h) */
  size_t es = ir_dtype_size(dt);
  int64_t off = 0;
  for (int64_t g = 0; g < G; g++) {
    int64_t m = tot[g];
    if (m > 0 && N > 0) {
      if (K == 0) memset((char *)k->out + (size_t)(off * N) * es, 0, (size_t)(m * N) * es);
      else
        gemm(dt, 0, tb, m, N, K, (const char *)k->in[0] + (size_t)(off * K) * es, K,
             (const char *)k->in[1] + (size_t)(g * K * N) * es, tb ? K : N, (char *)k->out + (size_t)(off * N) * es);
    }
    off += m;
  }
  memset((char *)k->out + (size_t)(off * N) * es, 0, (size_t)((R - off) * N) * es);
  free(tot);
  return 0;
}

/* (a[R, K], dy[R, N] expert layout, cnt i32[S, G]) -> [G, K, N]:
 * O_g = a_g^T dy_g; a group without rows gets 0; rows past the groups are
 * not read. */
int ref_GMM_DW(RtKctx *k) {
  const IrType *at = k->it[0], *dt_ = k->it[1], *ot = k->ot;
  IrDtype dt = at->dtype;
  if (!is_f(dt) || at->rank != 2 || dt_->rank != 2 || dt_->dtype != dt || dt_->dim[0] != at->dim[0] || ot->dtype != dt)
    return rt_kfail(k, "needs a[R, K] and dy[R, N] of one float dtype, got %s and %s", rt_tstr(at, 0), rt_tstr(dt_, 1));
  int64_t R = at->dim[0], K = at->dim[1], N = dt_->dim[1];
  if (ot->rank != 3 || ot->dim[1] != K || ot->dim[2] != N)
    return rt_kfail(k, "result %s must be [groups, %lld, %lld]", rt_tstr(ot, 0), (long long)K, (long long)N);
  int64_t G = ot->dim[0];
  if (blas_dims(k, R, K, N, K * N)) return -1;
  int64_t *tot = ts_xmalloc((size_t)(G > 0 ? G : 1) * sizeof *tot);
  if (group_rows(k, G, R, tot)) { free(tot); return -1; }
  (void)rt_par_threads();
  size_t es = ir_dtype_size(dt);
  int64_t off = 0;
  for (int64_t g = 0; g < G; g++) {
    int64_t m = tot[g];
    char *o = (char *)k->out + (size_t)(g * K * N) * es;
    if (m == 0) memset(o, 0, (size_t)(K * N) * es);
    else if (K > 0 && N > 0)
      gemm(dt, 1, 0, K, N, m, (const char *)k->in[0] + (size_t)(off * K) * es, K,
           (const char *)k->in[1] + (size_t)(off * N) * es, N, o);
    off += m;
  }
  free(tot);
  return 0;
}
