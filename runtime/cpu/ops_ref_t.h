/* ops_ref_t.h - the float kernels of the reference backend, written once and
 * included twice by ops_ref.c: with T = float, SUF = f32, GEMM =
 * cblas_sgemm, and with T = double, SUF = f64, GEMM = cblas_dgemm.  Each
 * kernel FN(k_name) computes one node; ops_ref.c has checked that the
 * float operands and the result have dtype T.  Arithmetic is in double;
 * reductions, norms, softmax and cross-entropy accumulate in double.  The
 * exponentials of softmax and cross-entropy use TEXP (expf for float):
 * they dominate a step's time at large vocabularies, and one float
 * rounding per term is below what an f32 result keeps anyway.
 * Shapes: in[k] / it[k] operand k, out / ot the result, all row-major. */
#ifndef T
#error "include ops_ref_t.h from ops_ref.c with T, SUF and GEMM defined"
#endif

#define FN(name) RT_CAT(name, SUF)

/* ---- elementwise: y[i] = EXPR of x = operand 0 (and z = operand 1) ----
 * Each op is a range function run over the pool (par.h): elements are
 * independent, so the result is the serial loop's bit for bit. */
typedef struct { const T *x, *z; T *y; double c; } FN(EwJob);
#define EW1(NAME, EXPR)                                                      \
  static void FN(ew_##NAME)(void *jp, int64_t lo, int64_t hi) {              \
    const FN(EwJob) *j = jp;                                                 \
    const T *xp = j->x;                                                      \
    T *yp = j->y;                                                            \
    const double c = j->c;                                                   \
    (void)c;                                                                 \
    for (int64_t i = lo; i < hi; i++) { double x = xp[i]; yp[i] = (T)(EXPR); } \
  }                                                                          \
  static int FN(k_##NAME)(RtKctx *k) {                                       \
    FN(EwJob) j = {k->in[0], NULL, k->out, k->n->fa[0]};                     \
    rt_par_for(ir_type_numel(k->ot), RT_EW_GRAIN, FN(ew_##NAME), &j);        \
    return 0;                                                                \
  }
#define EW2(NAME, EXPR)                                                      \
  static void FN(ew_##NAME)(void *jp, int64_t lo, int64_t hi) {              \
    const FN(EwJob) *j = jp;                                                 \
    const T *xp = j->x, *zp = j->z;                                          \
    T *yp = j->y;                                                            \
    for (int64_t i = lo; i < hi; i++) {                                      \
      double x = xp[i], z = zp[i];                                           \
      yp[i] = (T)(EXPR);                                                     \
    }                                                                        \
  }                                                                          \
  static int FN(k_##NAME)(RtKctx *k) {                                       \
    FN(EwJob) j = {k->in[0], k->in[1], k->out, 0};                           \
    rt_par_for(ir_type_numel(k->ot), RT_EW_GRAIN, FN(ew_##NAME), &j);        \
    return 0;                                                                \
  }

EW2(ADD, x + z)
EW2(SUB, x - z)
EW2(MUL, x * z)
EW2(DIV, x / z)
EW1(ADDS, x + c)
EW1(MULS, x * c)
EW1(NEG, -x)
EW1(EXP, exp(x))
EW1(LOG, log(x))
EW1(SQRT, sqrt(x))
EW1(RSQRT, 1.0 / sqrt(x))
EW1(TANH, tanh(x))
EW1(GELU_TANH, gelu_tanh(x))
EW1(GELU_ERF, gelu_erf(x))
EW1(SILU, x * sigmoid(x))
EW1(RELU, x > 0 ? x : 0.0)
/* the *_BWD ops take (x, dy): z is dy */
EW2(GELU_TANH_BWD, z * gelu_tanh_grad(x))
EW2(GELU_ERF_BWD, z * gelu_erf_grad(x))
EW2(SILU_BWD, z * sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))))
EW2(RELU_BWD, x > 0 ? z : 0.0)
#undef EW1
#undef EW2

/* ---- reductions ---- */
/* SUM / MEAN / MAX: x[outer, len, inner] -> y[outer, inner] along axis. */
static int FN(reduce)(RtKctx *k, int kind) {
  const IrType *xt = k->it[0];
  int ax = rt_axis(k->n->ia[0], xt->rank);
  if (ax < 0) return rt_kfail(k, "axis %lld out of range for rank %d", (long long)k->n->ia[0], xt->rank);
  int64_t outer, len, inner;
  rt_split(xt, ax, &outer, &len, &inner);
  if (ir_type_numel(k->ot) != outer * inner) return rt_kfail(k, "result size does not match the reduction");
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const T *p = x + o * len * inner + j;
      double acc = kind == 2 ? -INFINITY : 0.0;
      for (int64_t l = 0; l < len; l++) {
        double v = p[l * inner];
        if (kind == 2) { if (v > acc || isnan(v)) acc = v; }
        else acc += v;
      }
      if (kind == 1) acc = len ? acc / (double)len : NAN;
      y[o * inner + j] = (T)acc;
    }
  return 0;
}
static int FN(k_SUM)(RtKctx *k) { return FN(reduce)(k, 0); }
static int FN(k_MEAN)(RtKctx *k) { return FN(reduce)(k, 1); }
static int FN(k_MAX)(RtKctx *k) { return FN(reduce)(k, 2); }

/* x[...] -> y[] = sum of x^2.  Summed in fixed blocks of RT_SUM_BLOCK
 * elements (a double partial each, in order within the block), then the
 * partials in block order: the same result on any thread count. */
typedef struct { const T *x; int64_t n; double *part; } FN(SumsqJob);
static void FN(sumsq_blocks)(void *jp, int64_t lo, int64_t hi) {
  const FN(SumsqJob) *j = jp;
  for (int64_t b = lo; b < hi; b++) {
    int64_t i0 = b * RT_SUM_BLOCK, i1 = i0 + RT_SUM_BLOCK < j->n ? i0 + RT_SUM_BLOCK : j->n;
    double acc = 0;
    for (int64_t i = i0; i < i1; i++) acc += (double)j->x[i] * (double)j->x[i];
    j->part[b] = acc;
  }
}
static int FN(k_SUMSQ)(RtKctx *k) {
  int64_t n = ir_type_numel(k->it[0]), nb = (n + RT_SUM_BLOCK - 1) / RT_SUM_BLOCK;
  double one, *part = nb > 1 ? ts_xmalloc((size_t)nb * sizeof *part) : &one;
  FN(SumsqJob) j = {k->in[0], n, part};
  one = 0;
  rt_par_for(nb, 1, FN(sumsq_blocks), &j);
  double acc = 0;
  for (int64_t b = 0; b < nb; b++) acc += part[b];
  ((T *)k->out)[0] = (T)acc;
  if (part != &one) free(part);
  return 0;
}

/* x[in shape] -> y[ot], summing over the dims that broadcast expanded
 * (right-aligned; a result dim is 1 or equal to the input's). */
/* The common case of SUM_TO: x viewed as [R, C] summed over its rows into
 * y[C] (leading dims summed, trailing kept: bias gradients).  Columns are
 * split over the threads; each output still adds its rows in order, as
 * the general loop below does, so the result is the same bit for bit. */
typedef struct { const T *x; T *y; int64_t R, C; } FN(ColsJob);
static void FN(sum_cols)(void *jp, int64_t lo, int64_t hi) {
  const FN(ColsJob) *j = jp;
  enum { W = 256 };   /* columns per pass: the accumulators stay in L1 */
  double acc[W];
  for (int64_t c0 = lo; c0 < hi; c0 += W) {
    int64_t w = hi - c0 < W ? hi - c0 : W;
    for (int64_t c = 0; c < w; c++) acc[c] = 0;
    for (int64_t r = 0; r < j->R; r++) {
      const T *row = j->x + r * j->C + c0;
      for (int64_t c = 0; c < w; c++) acc[c] += row[c];
    }
    for (int64_t c = 0; c < w; c++) j->y[c0 + c] = (T)acc[c];
  }
}

static int FN(k_SUM_TO)(RtKctx *k) {
  const IrType *xt = k->it[0], *yt = k->ot;
  int64_t ymap[IR_MAX_RANK];  /* per input dim: stride in y, 0 if summed */
  if (rt_bcast_strides(yt, xt, ymap) != 0)
    return rt_kfail(k, "cannot sum %s down to %s", rt_tstr(xt, 0), rt_tstr(yt, 1));
  int64_t ny = ir_type_numel(yt), nx = ir_type_numel(xt);
  /* leading dims summed (stride 0), the rest kept densely: [R, C] -> [C] */
  int lead = 0;
  while (lead < xt->rank && ymap[lead] == 0) lead++;
  int64_t dense = 1, C = 1;
  for (int d = xt->rank - 1; d >= lead; d--) {
    if (ymap[d] != dense) { dense = -1; break; }
    dense *= xt->dim[d];
    C *= xt->dim[d];
  }
  if (dense > 0 && C == ny && C > 0) {
    FN(ColsJob) j = {k->in[0], k->out, nx / C, C};
    rt_par_for(C, (RT_MEM_GRAIN + j.R - 1) / (j.R ? j.R : 1), FN(sum_cols), &j);
    return 0;
  }
  double *acc = ts_xcalloc((size_t)(ny ? ny : 1), sizeof *acc);
  const T *x = k->in[0];
  int64_t idx[IR_MAX_RANK] = {0}, off = 0;
  for (int64_t i = 0; i < nx; i++) {
    acc[off] += x[i];
    for (int d = xt->rank - 1; d >= 0; d--) {   /* odometer over x's index */
      off += ymap[d];
      if (++idx[d] < xt->dim[d]) break;
      off -= ymap[d] * xt->dim[d];
      idx[d] = 0;
    }
  }
  T *y = k->out;
  for (int64_t i = 0; i < ny; i++) y[i] = (T)acc[i];
  free(acc);
  return 0;
}

/* ---- contraction ---- */
/* One GEMM per batch item i in [lo, hi): C_i = op(A_i) @ op(B_i), B shared
 * when sb == 0. */
typedef struct {
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K, lda, ldb;
  const T *A, *B;
  T *C;
  int64_t sa, sb, sc;   /* element strides between batch items */
} FN(GemmJob);
static void FN(gemm_batch)(void *jp, int64_t lo, int64_t hi) {
  const FN(GemmJob) *j = jp;
  for (int64_t i = lo; i < hi; i++)
    GEMM(CblasRowMajor, j->ta, j->tb, j->M, j->N, j->K, 1.0, j->A + i * j->sa, j->lda, j->B + i * j->sb, j->ldb,
         0.0, j->C + i * j->sc, j->N);
}

/* a[..., M, K] @ b[..., K, N] (equal batch dims) or a[..., M, K] @ b[K, N];
 * ta / tb: a is stored [..., K, M] / b is stored [..., N, K]. */
static int FN(k_MATMUL)(RtKctx *k) {
  const IrType *at = k->it[0], *bt = k->it[1];
  int ta = k->n->ia[0] != 0, tb = k->n->ia[1] != 0;
  int ra = at->rank, rb = bt->rank;
  if (ra < 2 || rb < 2) return rt_kfail(k, "operands must have rank >= 2");
  int64_t M = ta ? at->dim[ra - 1] : at->dim[ra - 2], K = ta ? at->dim[ra - 2] : at->dim[ra - 1];
  int64_t Kb = tb ? bt->dim[rb - 1] : bt->dim[rb - 2], N = tb ? bt->dim[rb - 2] : bt->dim[rb - 1];
  int64_t batch = 1;
  for (int d = 0; d < ra - 2; d++) batch *= at->dim[d];
  if (K != Kb) return rt_kfail(k, "contraction sizes differ: %s @ %s", rt_tstr(at, 0), rt_tstr(bt, 1));
  if (rb != 2) {
    if (rb != ra) return rt_kfail(k, "batch dims differ: %s @ %s", rt_tstr(at, 0), rt_tstr(bt, 1));
    for (int d = 0; d < ra - 2; d++)
      if (at->dim[d] != bt->dim[d]) return rt_kfail(k, "batch dims differ: %s @ %s", rt_tstr(at, 0), rt_tstr(bt, 1));
  }
  if (ir_type_numel(k->ot) != batch * M * N) return rt_kfail(k, "result size is not batch * M * N");
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch * M > INT_MAX)
    return rt_kfail(k, "matrix dims exceed the BLAS int range");
  const T *A = k->in[0], *B = k->in[1];
  T *C = k->out;
  (void)rt_par_threads();   /* first call: shares the cores among local ranks (par.h) */
  if (batch * M * N == 0) return 0;
  if (K == 0) { memset(C, 0, (size_t)(batch * M * N) * sizeof *C); return 0; }
  int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (rb == 2 && !ta) {   /* rows of all batches at once: one GEMM */
    GEMM(CblasRowMajor, TA, TB, (int)(batch * M), (int)N, (int)K, 1.0, A, lda, B, ldb, 0.0, C, (int)N);
    return 0;
  }
  /* Batched (attention's [b, h, s, d] products): the GEMMs are small, and
   * OpenBLAS splitting each one over the cores costs more than it gains;
   * whole GEMMs per pool thread (BLAS single-threaded meanwhile) keep every
   * core busy.  Each GEMM is the same computation either way (BLAS threads
   * split M and N, never K), so results do not change.  Large GEMMs keep
   * BLAS's own threading. */
  FN(GemmJob) j = {TA, TB, (int)M, (int)N, (int)K, lda, ldb, A, B, C, M * K, rb == 2 ? 0 : K * N, M * N};
  if (batch > 1 && (double)M * (double)N * (double)K <= RT_SMALL_GEMM)
    rt_par_blas_serial(FN(gemm_batch), &j, batch, 1);
  else
    FN(gemm_batch)(&j, 0, batch);
  return 0;
}

/* ---- row-wise neural-network ops over the last axis: [rows, D] ---- */
/* k_NAME runs rows_NAME(k, lo, hi) over the rows on the pool: rows are
 * independent, so threads change nothing in the result. */
#define RT_ROW_KERNEL(NAME)                                                  \
  static int FN(k_##NAME)(RtKctx *k) {                                       \
    int64_t D, rows = rt_rows(k->ot, &D);                                    \
    rt_par_for(rows, rt_row_grain(D), FN(rows_##NAME), k);                   \
    return 0;                                                                \
  }
/* The largest of x[0..n), n >= 1 (a NaN anywhere may or may not win;
 * the sum of exponentials is NaN then anyway). */
static T FN(row_max)(const T *x, int64_t n) {
  T m = x[0];
  for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}

/* sum of exp(x[i] - mx) over i < n, in double; the terms are also stored
 * into e[0..n) when e is not NULL.  Chunked, with four partial sums: one
 * running double sum would make every element wait for the previous add,
 * and this loop is most of a step's time at large vocabularies. */
static double FN(sum_exp)(const T *x, int64_t n, T mx, T *e) {
  T tmp[256];
  double acc[4] = {0, 0, 0, 0};
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    int64_t m = n - i0 < 256 ? n - i0 : 256, i = 0;
    T *dst = e ? e + i0 : tmp;
    for (int64_t j = 0; j < m; j++) dst[j] = TEXP(x[i0 + j] - mx);
    for (; i + 4 <= m; i += 4) {
      acc[0] += dst[i];
      acc[1] += dst[i + 1];
      acc[2] += dst[i + 2];
      acc[3] += dst[i + 3];
    }
    for (; i < m; i++) acc[0] += dst[i];
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static void FN(rows_SOFTMAX)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = lo; r < hi; r++) {
    const T *xr = x + r * D;
    T *yr = y + r * D;
    T mx = FN(row_max)(xr, D);
    if (mx == -INFINITY) mx = 0;   /* a fully masked row: avoid inf - inf */
    double s = FN(sum_exp)(xr, D, mx, yr);
    for (int64_t i = 0; i < D; i++) yr[i] = (T)((double)yr[i] / s);
  }
}
RT_ROW_KERNEL(SOFTMAX)

static void FN(rows_LOG_SOFTMAX)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = lo; r < hi; r++) {
    const T *xr = x + r * D;
    T mx = FN(row_max)(xr, D);
    if (mx == -INFINITY) mx = 0;
    double lse = (double)mx + log(FN(sum_exp)(xr, D, mx, NULL));
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)((double)xr[i] - lse);
  }
}
RT_ROW_KERNEL(LOG_SOFTMAX)

/* (y, dy) -> y * (dy - sum(dy * y)) */
static void FN(rows_SOFTMAX_BWD)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *y = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = lo; r < hi; r++) {
    double s = 0;
    for (int64_t i = 0; i < D; i++) s += (double)dy[r * D + i] * (double)y[r * D + i];
    for (int64_t i = 0; i < D; i++) dx[r * D + i] = (T)((double)y[r * D + i] * ((double)dy[r * D + i] - s));
  }
}
RT_ROW_KERNEL(SOFTMAX_BWD)

/* (y, dy) -> dy - exp(y) * sum(dy), y = log_softmax(x) */
static void FN(rows_LOG_SOFTMAX_BWD)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *y = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = lo; r < hi; r++) {
    double s = 0;
    for (int64_t i = 0; i < D; i++) s += dy[r * D + i];
    for (int64_t i = 0; i < D; i++) dx[r * D + i] = (T)((double)dy[r * D + i] - exp((double)y[r * D + i]) * s);
  }
}
RT_ROW_KERNEL(LOG_SOFTMAX_BWD)

/* y = (x - mu) * rstd, rstd = 1 / sqrt(var + eps), biased var (divide by D) */
static void FN(ln_stats)(const T *x, int64_t D, double eps, double *mu, double *rstd) {
  double m = 0, v = 0;
  for (int64_t i = 0; i < D; i++) m += x[i];
  m /= (double)D;
  for (int64_t i = 0; i < D; i++) v += ((double)x[i] - m) * ((double)x[i] - m);
  v /= (double)D;
  *mu = m;
  *rstd = 1.0 / sqrt(v + eps);
}

static void FN(rows_LAYERNORM)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = lo; r < hi && D > 0; r++) {
    double mu, rs;
    FN(ln_stats)(x + r * D, D, k->n->fa[0], &mu, &rs);
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)(((double)x[r * D + i] - mu) * rs);
  }
}
RT_ROW_KERNEL(LAYERNORM)

/* dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
static void FN(rows_LAYERNORM_BWD)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = lo; r < hi && D > 0; r++) {
    const T *xr = x + r * D, *gr = dy + r * D;
    double mu, rs, mg = 0, mgx = 0;
    FN(ln_stats)(xr, D, k->n->fa[0], &mu, &rs);
    for (int64_t i = 0; i < D; i++) {
      double xh = ((double)xr[i] - mu) * rs;
      mg += gr[i];
      mgx += (double)gr[i] * xh;
    }
    mg /= (double)D;
    mgx /= (double)D;
    for (int64_t i = 0; i < D; i++) {
      double xh = ((double)xr[i] - mu) * rs;
      dx[r * D + i] = (T)(rs * ((double)gr[i] - mg - xh * mgx));
    }
  }
}
RT_ROW_KERNEL(LAYERNORM_BWD)

static double FN(rms_r)(const T *x, int64_t D, double eps) {
  double s = 0;
  for (int64_t i = 0; i < D; i++) s += (double)x[i] * (double)x[i];
  return 1.0 / sqrt(s / (double)D + eps);
}

static void FN(rows_RMSNORM)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = lo; r < hi && D > 0; r++) {
    double rr = FN(rms_r)(x + r * D, D, k->n->fa[0]);
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)((double)x[r * D + i] * rr);
  }
}
RT_ROW_KERNEL(RMSNORM)

/* dx_i = r dy_i - r^3 x_i mean(dy * x), r = 1 / sqrt(mean(x^2) + eps) */
static void FN(rows_RMSNORM_BWD)(void *jp, int64_t lo, int64_t hi) {
  RtKctx *k = jp;
  int64_t D;
  rt_rows(k->ot, &D);
  const T *x = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = lo; r < hi && D > 0; r++) {
    const T *xr = x + r * D, *gr = dy + r * D;
    double rr = FN(rms_r)(xr, D, k->n->fa[0]), dot = 0;
    for (int64_t i = 0; i < D; i++) dot += (double)gr[i] * (double)xr[i];
    dot /= (double)D;
    for (int64_t i = 0; i < D; i++)
      dx[r * D + i] = (T)(rr * (double)gr[i] - rr * rr * rr * (double)xr[i] * dot);
  }
}
RT_ROW_KERNEL(RMSNORM_BWD)

/* (table[V, C], ids[...] i32) -> out[..., C].  A table split on dim 0
 * (vocab-parallel) holds global rows [off, off + V): ids outside that
 * block give 0 rows (the result is a partial sum over the split axes). */
static int FN(k_EMBEDDING)(RtKctx *k) {
  const IrType *tt = k->it[0];
  if (tt->rank != 2) return rt_kfail(k, "the table must be [V, C], got %s", rt_tstr(tt, 0));
  int64_t V = tt->dim[0], C = tt->dim[1], n = ir_type_numel(k->it[1]), nb;
  int64_t off = rt_shard_block(k->env->rank, rt_kin_sh(k, 0)->split[0], &nb) * V, Vg = nb * V;
  if (ir_type_numel(k->ot) != n * C) return rt_kfail(k, "result size is not ids * C");
  const T *tab = k->in[0];
  const int32_t *ids = k->in[1];
  T *y = k->out;
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= Vg)
      return rt_kfail(k, "token id %d at position %lld is outside the table [0, %lld)", ids[i], (long long)i, (long long)Vg);
    if (ids[i] >= off && ids[i] < off + V) memcpy(y + i * C, tab + ((int64_t)ids[i] - off) * C, (size_t)C * sizeof *y);
    else memset(y + i * C, 0, (size_t)C * sizeof *y);
  }
  return 0;
}

/* Columns [lo, hi) of the scatter-add: every thread walks all ids in
 * order, so each table element adds its rows in the serial order. */
typedef struct {
  const int32_t *ids;
  const T *dy;
  T *g;
  int64_t n, C, off, V;
  const int64_t *next;          /* adding into values (below), else NULL */
  const unsigned char *later;
} FN(EmbBwdJob);
static void FN(emb_bwd_cols)(void *jp, int64_t lo, int64_t hi) {
  const FN(EmbBwdJob) *j = jp;
  for (int64_t i = 0; i < j->n; i++) {
    if (j->ids[i] < j->off || j->ids[i] >= j->off + j->V) continue;
    T *row = j->g + ((int64_t)j->ids[i] - j->off) * j->C;
    const T *d = j->dy + i * j->C;
    if (!j->next) {
      for (int64_t c = lo; c < hi; c++) row[c] += d[c];
      continue;
    }
    /* into a table that holds values (a state): a token's rows summed
     * first, from its first position on, then added once -- the bits of
     * the scatter into zeros followed by the accum, as the reference */
    if (j->later[i]) continue;   /* added with the token's first position */
    for (int64_t c = lo; c < hi; c++) {
      T acc = d[c];
      for (int64_t k = j->next[i]; k >= 0; k = j->next[k]) acc += j->dy[k * j->C + c];
      row[c] += acc;
    }
  }
}

/* (ids[...] i32, dy[..., C]) -> d table [V, C]: scatter-add into zeros.
 * A result split on dim 0 holds global rows [off, off + V): only ids in
 * that block are scattered. */
static int FN(emb_bwd)(RtKctx *k, int zero) {
  const IrType *ot = k->ot;
  if (ot->rank != 2) return rt_kfail(k, "the result must be [V, C], got %s", rt_tstr(ot, 0));
  int64_t V = ot->dim[0], C = ot->dim[1], n = ir_type_numel(k->it[0]), nb;
  int64_t off = rt_shard_block(k->env->rank, k->n->sh.split[0], &nb) * V, Vg = nb * V;
  if (ir_type_numel(k->it[1]) != n * C) return rt_kfail(k, "dy size is not ids * C");
  const int32_t *ids = k->in[0];
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= Vg)
      return rt_kfail(k, "token id %d at position %lld is outside the table [0, %lld)", ids[i], (long long)i, (long long)Vg);
  if (zero) rt_par_memset(k->out, 0, (size_t)(V * C) * sizeof(T));
  /* adding into values: next[i] = the token's next position (-1: none),
   * later[i] = 1 where it is not the token's first */
  int64_t *next = NULL, *last = NULL;
  unsigned char *later = NULL;
  if (!zero) {
    next = ts_xmalloc((size_t)(n ? n : 1) * sizeof *next);
    later = ts_xcalloc((size_t)(n ? n : 1), 1);
    last = ts_xmalloc((size_t)(V ? V : 1) * sizeof *last);
    for (int64_t v = 0; v < V; v++) last[v] = -1;
    for (int64_t i = 0; i < n; i++) {
      next[i] = -1;
      if (ids[i] < off || ids[i] >= off + V) continue;
      int64_t *l = &last[ids[i] - off];
      if (*l >= 0) next[*l] = i, later[i] = 1;
      *l = i;
    }
  }
  FN(EmbBwdJob) j = {ids, k->in[1], k->out, n, C, off, V, next, later};
  rt_par_for(C, 64, FN(emb_bwd_cols), &j);
  free(next);
  free(later);
  free(last);
  return 0;
}
static int FN(k_EMBEDDING_BWD)(RtKctx *k) { return FN(emb_bwd)(k, 1); }

/* Rows [lo, hi) of all the [R, C] matrices: row i keeps its columns
 * j <= i (global), the rest is fill. */
typedef struct { const T *x; T *y; T fill; int64_t R, C, ro, co; const int64_t *grow, *gcol; } FN(MaskJob);
static void FN(mask_rows)(void *jp, int64_t lo, int64_t hi) {
  const FN(MaskJob) *j = jp;
  for (int64_t r = lo; r < hi; r++) {
    int64_t i = r % j->R, gi = j->grow ? j->grow[i] : i + j->ro;
    if (j->gcol) {                 /* columns in zigzag order (cp_layout.c) */
      for (int64_t c = 0; c < j->C; c++) j->y[r * j->C + c] = j->gcol[c] <= gi ? j->x[r * j->C + c] : j->fill;
      continue;
    }
    int64_t keep = gi - j->co + 1;   /* columns j < keep stay */
    keep = keep < 0 ? 0 : keep > j->C ? j->C : keep;
    memcpy(j->y + r * j->C, j->x + r * j->C, (size_t)keep * sizeof(T));
    for (int64_t c = keep; c < j->C; c++) j->y[r * j->C + c] = j->fill;
  }
}

/* x[..., R, C]: fill where column j > row i, both global indices (a
 * split row or column dim starts at the rank's block offset).  (Not I/J:
 * cblas.h pulls in complex.h, whose I is a macro.) */
static int FN(k_CAUSAL_MASK)(RtKctx *k) {
  const IrType *t = k->ot;
  if (t->rank < 2) return rt_kfail(k, "needs rank >= 2");
  int64_t R = t->dim[t->rank - 2], Cn = t->dim[t->rank - 1];
  int64_t ro = rt_shard_block(k->env->rank, k->n->sh.split[t->rank - 2], NULL) * R;
  int64_t co = rt_shard_block(k->env->rank, k->n->sh.split[t->rank - 1], NULL) * Cn;
  int64_t mats = (R > 0 && Cn > 0) ? ir_type_numel(t) / (R * Cn) : 0;
  unsigned rm = k->n->sh.split[t->rank - 2], cm = k->n->sh.split[t->rank - 1];
  int64_t *grow = NULL, *gcol = NULL;   /* global positions when a dim is a cp zigzag */
  if (rt_cp_zigzag(k->env->rank, rm)) {
    grow = ts_xmalloc((size_t)R * sizeof *grow);
    for (int64_t i = 0; i < R; i++) grow[i] = rt_global_index(k->env->rank, rm, R, i);
  }
  if (rt_cp_zigzag(k->env->rank, cm)) {
    gcol = ts_xmalloc((size_t)Cn * sizeof *gcol);
    for (int64_t c = 0; c < Cn; c++) gcol[c] = rt_global_index(k->env->rank, cm, Cn, c);
  }
  FN(MaskJob) j = {k->in[0], k->out, (T)k->n->fa[0], R, Cn, ro, co, grow, gcol};
  rt_par_for(mats * R, rt_row_grain(Cn), FN(mask_rows), &j);
  free(grow);
  free(gcol);
  return 0;
}

/* (x, keep) -> keep != 0 ? x : fill; keep of any dtype */
static int FN(k_MASKED_FILL)(RtKctx *k) {
  int64_t n = ir_type_numel(k->ot);
  const T *x = k->in[0];
  T *y = k->out;
  IrDtype kt = k->it[1]->dtype;
  T fill = (T)k->n->fa[0];
  for (int64_t i = 0; i < n; i++) y[i] = rt_ld(k->in[1], kt, i) != 0 ? x[i] : fill;
  return 0;
}

typedef struct {
  RtKctx *k;
  const T *x;
  T *y;
  double p, scale;
  uint64_t seed;
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  int split;
  unsigned char zz[IR_MAX_RANK];   /* dim is a cp zigzag: global index by rt_global_index */
} FN(DropJob);
/* Elements [lo, hi): the local index's odometer starts at lo's. */
static void FN(drop_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(DropJob) *j = jp;
  const IrType *t = j->k->ot;
  int64_t idx[IR_MAX_RANK] = {0};
  for (int64_t d = t->rank - 1, r = lo; d >= 0 && j->split; d--) {
    idx[d] = t->dim[d] ? r % t->dim[d] : 0;
    r = t->dim[d] ? r / t->dim[d] : 0;
  }
  for (int64_t i = lo; i < hi; i++) {
    int64_t g = i;
    if (j->split) {
      g = 0;
      for (int d = 0; d < t->rank; d++)
        g = g * j->gdim[d] + (j->zz[d] ? rt_global_index(j->k->env->rank, j->k->n->sh.split[d], t->dim[d], idx[d])
                                        : j->off[d] + idx[d]);
      for (int d = t->rank - 1; d >= 0; d--) {   /* odometer over the local index */
        if (++idx[d] < t->dim[d]) break;
        idx[d] = 0;
      }
    }
    double u = rt_dropout_u(j->seed, j->k->n->ia[0], j->k->info->step, j->k->info->micro, g);
    j->y[i] = u >= j->p ? (T)((double)j->x[i] * j->scale) : (T)0;
  }
}

/* keep iff U(H(2, seed, stream, step, micro, g)) >= p; kept scaled
 * 1/(1-p).  g is the element's flat index in the GLOBAL tensor (the local
 * index i when nothing is split) and micro the global micro-batch index,
 * so a sharded run draws the single-rank run's mask element by element. */
static int FN(k_DROPOUT)(RtKctx *k) {
  const IrType *t = k->ot;
  int64_t n = ir_type_numel(t);
  const T *x = k->in[0];
  T *y = k->out;
  double p = k->n->fa[0];
  if (!(p >= 0 && p <= 1)) return rt_kfail(k, "p = %g is not in [0, 1]", p);
  if (p == 0) { memcpy(y, x, (size_t)n * sizeof *y); return 0; }
  FN(DropJob) j = {k, x, y, p, p < 1 ? 1.0 / (1.0 - p) : 0.0, k->env->m->train.seed, {0}, {0}, 0, {0}};
  rt_shard_offsets(k->env->rank, &k->n->sh, t, j.off, j.gdim);
  for (int d = 0; d < t->rank; d++) {
    j.split |= j.gdim[d] != t->dim[d];
    j.zz[d] = (unsigned char)rt_cp_zigzag(k->env->rank, k->n->sh.split[d]);
  }
  rt_par_for(n, RT_EW_GRAIN / 8, FN(drop_range), &j);
  return 0;
}

typedef struct { const T *x; T *y; const double *freq; double sign; int64_t p0, per, len, D; const int64_t *gpos; } FN(RopeJob);
static void FN(rope_rows)(void *jp, int64_t lo, int64_t hi) {
  const FN(RopeJob) *j = jp;
  int64_t D = j->D, h = D / 2;
  for (int64_t r = lo; r < hi; r++) {
    int64_t l = (r / j->per) % j->len;
    double pos = (double)(j->gpos ? j->gpos[l] : j->p0 + l);
    const T *x = j->x + r * D;
    T *y = j->y + r * D;
    for (int64_t i = 0; i < h; i++) {
      double th = j->sign * pos * j->freq[i];
      double c = cos(th), s = sin(th), x1 = x[i], x2 = x[i + h];
      y[i] = (T)(x1 * c - x2 * s);
      y[i + h] = (T)(x1 * s + x2 * c);
    }
  }
}

/* x[..., T at axis, ..., D]: pairs (x[i], x[i + D/2]) rotate by
 * theta = t * base^(-2i/D) (inverse: -theta), t = GLOBAL index along axis
 * (the rank's block offset plus the local one when the axis is split). */
static int FN(k_ROPE)(RtKctx *k) {
  const IrType *t = k->ot;
  int ax = rt_axis(k->n->ia[0], t->rank);
  if (ax < 0 || ax >= t->rank - 1) return rt_kfail(k, "axis %lld must be a dim before the last", (long long)k->n->ia[0]);
  int64_t D = t->dim[t->rank - 1];
  if (D % 2) return rt_kfail(k, "the last dim (%lld) must be even", (long long)D);
  int64_t h = D / 2, rows = ir_type_numel(t) / (D ? D : 1), per = 1;   /* rows per step of axis */
  for (int d = ax + 1; d < t->rank - 1; d++) per *= t->dim[d];
  double sign = k->n->ia[1] ? -1.0 : 1.0, base = k->n->fa[0];
  /* the frequencies once per call: the same pow() as per element before */
  double *freq = ts_xmalloc((size_t)(h ? h : 1) * sizeof *freq);
  for (int64_t i = 0; i < h; i++) freq[i] = pow(base, -2.0 * (double)i / (double)D);
  int64_t *gpos = NULL;            /* global positions when the axis is a cp zigzag */
  if (rt_cp_zigzag(k->env->rank, k->n->sh.split[ax])) {
    gpos = ts_xmalloc((size_t)t->dim[ax] * sizeof *gpos);
    for (int64_t l = 0; l < t->dim[ax]; l++) gpos[l] = rt_global_index(k->env->rank, k->n->sh.split[ax], t->dim[ax], l);
  }
  /* rope_at (pass decode): positions start at its operand pos, not 0 */
  int64_t p0 = k->n->op == IR_OP_ROPE_AT ? *(const int32_t *)k->in[1] : 0;
  FN(RopeJob) j = {k->in[0], k->out, freq, sign, p0 + rt_shard_block(k->env->rank, k->n->sh.split[ax], NULL) * t->dim[ax],
                   per, t->dim[ax], D, gpos};
  rt_par_for(rows, rt_row_grain(D * 8), FN(rope_rows), &j);
  free(freq);
  free(gpos);
  return 0;
}

/* Checks logits[rows, V] against targets[rows] i32; returns rows or -1. */
static int64_t FN(ce_shape)(RtKctx *k, int64_t *V) {
  const IrType *lt = k->it[0];
  if (lt->rank < 1) { rt_kfail(k, "logits must have a class dim"); return -1; }
  int64_t rows = rt_rows(lt, V);
  if (ir_type_numel(k->it[1]) != rows) {
    rt_kfail(k, "targets %s do not match logits %s", rt_tstr(k->it[1], 0), rt_tstr(lt, 1));
    return -1;
  }
  return rows;
}

/* Checks every target is in [0, V) or the ignore index, before the rows
 * run on the pool (which cannot fail). */
static int FN(ce_targets)(RtKctx *k, int64_t rows, int64_t V) {
  const int32_t *tg = k->in[1];
  for (int64_t r = 0; r < rows; r++)
    if (tg[r] != k->n->ia[0] && (tg[r] < 0 || tg[r] >= V))
      return rt_kfail(k, "target %d at position %lld is outside [0, %lld)", tg[r], (long long)r, (long long)V);
  return 0;
}

typedef struct { const T *lg; const int32_t *tg; const T *dl; T *y; int64_t V, ign; } FN(CeJob);
static void FN(ce_rows)(void *jp, int64_t lo, int64_t hi) {
  const FN(CeJob) *j = jp;
  for (int64_t r = lo; r < hi; r++) {
    if (j->tg[r] == j->ign) { j->y[r] = 0; continue; }
    const T *lr = j->lg + r * j->V;
    T mx = FN(row_max)(lr, j->V);
    j->y[r] = (T)((double)mx + log(FN(sum_exp)(lr, j->V, mx, NULL)) - (double)lr[j->tg[r]]);
  }
}

/* logsumexp(row) - row[target]; 0 where target == ignore.  The row works
 * in T (exponentials of x - max are in (0, 1]); the sum is in double. */
static int FN(k_CROSS_ENTROPY)(RtKctx *k) {
  int64_t V, rows = FN(ce_shape)(k, &V);
  if (rows < 0) return -1;
  if (ir_type_numel(k->ot) != rows) return rt_kfail(k, "result size is not the token count");
  if (FN(ce_targets)(k, rows, V) != 0) return -1;
  FN(CeJob) j = {k->in[0], k->in[1], NULL, k->out, V, k->n->ia[0]};
  rt_par_for(rows, rt_row_grain(V), FN(ce_rows), &j);
  return 0;
}

static void FN(ce_bwd_rows)(void *jp, int64_t lo, int64_t hi) {
  const FN(CeJob) *j = jp;
  int64_t V = j->V;
  for (int64_t r = lo; r < hi; r++) {
    T *gr = j->y + r * V;
    int32_t t = j->tg[r];
    if (t == j->ign) { memset(gr, 0, (size_t)V * sizeof *gr); continue; }
    const T *lr = j->lg + r * V;
    T mx = FN(row_max)(lr, V);
    double d = j->dl[r], s = FN(sum_exp)(lr, V, mx, gr);
    T scale = (T)(d / s);
    for (int64_t i = 0; i < V; i++) gr[i] *= scale;
    gr[t] = (T)((double)gr[t] - d);
  }
}

/* (logits, targets, dl[rows]) -> (softmax - onehot) * dl; 0 rows for ignored */
static int FN(k_CROSS_ENTROPY_BWD)(RtKctx *k) {
  int64_t V, rows = FN(ce_shape)(k, &V);
  if (rows < 0) return -1;
  if (ir_type_numel(k->it[2]) != rows) return rt_kfail(k, "dloss size is not the token count");
  if (FN(ce_targets)(k, rows, V) != 0) return -1;
  FN(CeJob) j = {k->in[0], k->in[1], k->in[2], k->out, V, k->n->ia[0]};
  rt_par_for(rows, rt_row_grain(V), FN(ce_bwd_rows), &j);
  return 0;
}

/* ---- step program ---- */
/* norm[] -> min(1, max / (norm + 1e-6)) */
static int FN(k_CLIP_COEF)(RtKctx *k) {
  double nrm = ((const T *)k->in[0])[0], mx = k->n->fa[0];
  double c = mx / (nrm + 1e-6);
  ((T *)k->out)[0] = (T)(c < 1 ? c : 1.0);
  return 0;
}

static void FN(accum_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(EwJob) *j = jp;
  for (int64_t i = lo; i < hi; i++) j->y[i] += j->x[i];
}

/* state[ia0] += x */
static int FN(k_ACCUM)(RtKctx *k) {
  FN(EwJob) j = {k->in[0], NULL, rt_kenv_state(k->env, (int)k->n->ia[0]), 0};
  rt_par_for(ir_type_numel(k->it[0]), RT_MEM_GRAIN, FN(accum_range), &j);
  return 0;
}

/* One pass over elements [lo, hi) of w, grad, m, v (the serial formula,
 * element by element). */
typedef struct { T *w; const T *gr; T *m, *v; double coef, b1, b2, eps, wd, lr, c1, c2; } FN(AdamJob);
static void FN(adamw_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(AdamJob) *j = jp;
  T *w = j->w, *m = j->m, *v = j->v;
  const T *gr = j->gr;
  double coef = j->coef, b1 = j->b1, b2 = j->b2, eps = j->eps, wd = j->wd, lr = j->lr, c1 = j->c1, c2 = j->c2;
  for (int64_t i = lo; i < hi; i++) {
    double g = (double)gr[i] * coef;
    double mi = b1 * (double)m[i] + (1.0 - b1) * g;
    double vi = b2 * (double)v[i] + (1.0 - b2) * g * g;
    m[i] = (T)mi;
    v[i] = (T)vi;
    double mh = mi / c1, vh = vi / c2;
    w[i] = (T)((double)w[i] - lr * (mh / (sqrt(vh) + eps) + wd * (double)w[i]));
  }
}

/* coef[]: g = grad * coef; m, v moments; bias-corrected step with
 * decoupled weight decay wd (0 for nodecay params, set by the optimizer pass).
 * ZeRO: when @m is flat-sharded, m, v and grad are the rank's chunk [c] of
 * the flattened (local) parameter, chunk b = the rank's block over the
 * flat axes: only param elements [b*c, min((b+1)*c, numel)) are updated. */
static int FN(k_ADAMW)(RtKctx *k) {
  const IrNode *n = k->n;
  RtKenv *e = k->env;
  const IrModule *mod = e->m;
  const IrState *ms = &mod->states.a[n->ia[1]];
  T *w = rt_kenv_state(e, (int)n->ia[0]);
  const T *gr = k->in[1];
  T *m = rt_kenv_state(e, (int)n->ia[1]), *v = rt_kenv_state(e, (int)n->ia[2]);
  int64_t cnt = ir_type_numel(&mod->states.a[n->ia[0]].type);
  if (ms->sh.flat && !mod->states.a[n->ia[0]].sh.flat) {   /* (a ZeRO-3 shard is the chunk itself) */
    int64_t c = ir_type_numel(&ms->type), start = rt_shard_block(e->rank, ms->sh.flat, NULL) * c;
    w += start < cnt ? start : cnt;
    cnt = start >= cnt ? 0 : (cnt - start < c ? cnt - start : c);
  }
  double t = (double)(k->info->step + 1);
  FN(AdamJob) j = {w, gr, m, v, rt_ld(k->in[0], k->it[0]->dtype, 0), n->fa[0], n->fa[1], n->fa[2], n->fa[3],
                   ir_train_adamw_lr(&mod->train, k->info->lr), 1.0 - pow(n->fa[0], t), 1.0 - pow(n->fa[1], t)};
  rt_par_for(cnt, RT_EW_GRAIN, FN(adamw_range), &j);
  return 0;
}

/* sgd / lion: the param elements the node updates, as k_ADAMW (the whole
 * param, or with a flat-sharded @buf the rank's chunk), from *w on. */
static int64_t FN(opt_span)(RtKctx *k, T **w) {
  const IrModule *mod = k->env->m;
  const IrState *ms = &mod->states.a[k->n->ia[1]];
  *w = rt_kenv_state(k->env, (int)k->n->ia[0]);
  int64_t cnt = ir_type_numel(&mod->states.a[k->n->ia[0]].type);
  if (!ms->sh.flat) return cnt;
  int64_t c = ir_type_numel(&ms->type), start = rt_shard_block(k->env->rank, ms->sh.flat, NULL) * c;
  *w += start < cnt ? start : cnt;
  return start >= cnt ? 0 : (cnt - start < c ? cnt - start : c);
}

/* torch.optim.SGD (dampening 0): d = g + wd w; buf = mom buf + d (buf
 * starts at 0, so the first step's buf is d, as torch's clone); step
 * nesterov ? d + mom buf : buf.  mom = 0: buf stays d, the plain step. */
typedef struct { T *w; const T *gr; T *m; double coef, a, b, wd, lr; } FN(StepJob);
static void FN(sgd_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(StepJob) *j = jp;
  for (int64_t i = lo; i < hi; i++) {
    double d = (double)j->gr[i] * j->coef + j->wd * (double)j->w[i];
    double buf = j->a * (double)j->m[i] + d;
    j->m[i] = (T)buf;
    double step = j->b != 0 ? d + j->a * buf : buf;
    j->w[i] = (T)((double)j->w[i] - j->lr * step);
  }
}
/* sgd, lion: (coef[], grad) with @param, one moment and attrs (a, b, wd). */
static int FN(moment_step)(RtKctx *k, void (*range)(void *, int64_t, int64_t)) {
  T *w;
  int64_t cnt = FN(opt_span)(k, &w);
  const double *f = k->n->fa;
  FN(StepJob) j = {w, k->in[1], rt_kenv_state(k->env, (int)k->n->ia[1]), rt_ld(k->in[0], k->it[0]->dtype, 0),
                   f[0], f[1], f[2], k->info->lr};
  rt_par_for(cnt, RT_EW_GRAIN, range, &j);
  return 0;
}
static int FN(k_SGD)(RtKctx *k) { return FN(moment_step)(k, FN(sgd_range)); }

/* Lion: c = b1 m + (1 - b1) g; w = w (1 - lr wd) - lr sign(c) (sign 0 at
 * 0, as torch.sign); m = b2 m + (1 - b2) g. */
static void FN(lion_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(StepJob) *j = jp;
  for (int64_t i = lo; i < hi; i++) {
    double g = (double)j->gr[i] * j->coef, m = (double)j->m[i];
    double c = j->a * m + (1.0 - j->a) * g, sg = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
    j->w[i] = (T)((double)j->w[i] * (1.0 - j->lr * j->wd) - j->lr * sg);
    j->m[i] = (T)(j->b * m + (1.0 - j->b) * g);
  }
}
static int FN(k_LION)(RtKctx *k) { return FN(moment_step)(k, FN(lion_range)); }

/* lr_step: w = w (1 - lr wd) - lr scale x (Muon's decoupled step). */
static void FN(lr_step_range)(void *jp, int64_t lo, int64_t hi) {
  const FN(StepJob) *j = jp;
  for (int64_t i = lo; i < hi; i++)
    j->w[i] = (T)((double)j->w[i] * (1.0 - j->lr * j->wd) - j->lr * j->a * (double)j->gr[i]);
}
static int FN(k_LR_STEP)(RtKctx *k) {
  const double *f = k->n->fa;
  FN(StepJob) j = {rt_kenv_state(k->env, (int)k->n->ia[0]), k->in[0], NULL, 1.0, f[0], 0, f[1], k->info->lr};
  rt_par_for(ir_type_numel(k->it[0]), RT_EW_GRAIN, FN(lr_step_range), &j);
  return 0;
}

#undef FN
