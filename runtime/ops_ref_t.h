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

/* ---- elementwise: y[i] = EXPR of x = operand 0 (and z = operand 1) ---- */
#define EW1(NAME, EXPR)                                                      \
  static int FN(k_##NAME)(RtKctx *k) {                                       \
    const T *xp = k->in[0];                                                  \
    T *yp = k->out;                                                          \
    const double c = k->n->fa[0];                                            \
    (void)c;                                                                 \
    int64_t n = ir_type_numel(k->ot);                                        \
    for (int64_t i = 0; i < n; i++) { double x = xp[i]; yp[i] = (T)(EXPR); } \
    return 0;                                                                \
  }
#define EW2(NAME, EXPR)                                                      \
  static int FN(k_##NAME)(RtKctx *k) {                                       \
    const T *xp = k->in[0], *zp = k->in[1];                                  \
    T *yp = k->out;                                                          \
    int64_t n = ir_type_numel(k->ot);                                        \
    for (int64_t i = 0; i < n; i++) {                                        \
      double x = xp[i], z = zp[i];                                           \
      yp[i] = (T)(EXPR);                                                     \
    }                                                                        \
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

/* x[...] -> y[] = sum of x^2 */
static int FN(k_SUMSQ)(RtKctx *k) {
  const T *x = k->in[0];
  int64_t n = ir_type_numel(k->it[0]);
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
  ((T *)k->out)[0] = (T)acc;
  return 0;
}

/* x[in shape] -> y[ot], summing over the dims that broadcast expanded
 * (right-aligned; a result dim is 1 or equal to the input's). */
static int FN(k_SUM_TO)(RtKctx *k) {
  const IrType *xt = k->it[0], *yt = k->ot;
  int64_t ymap[IR_MAX_RANK];  /* per input dim: stride in y, 0 if summed */
  if (rt_bcast_strides(yt, xt, ymap) != 0)
    return rt_kfail(k, "cannot sum %s down to %s", rt_tstr(xt, 0), rt_tstr(yt, 1));
  int64_t ny = ir_type_numel(yt), nx = ir_type_numel(xt);
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
  if (batch * M * N == 0) return 0;
  if (K == 0) { memset(C, 0, (size_t)(batch * M * N) * sizeof *C); return 0; }
  int lda = (int)(ta ? M : K), ldb = (int)(tb ? K : N);
  enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if (rb == 2 && !ta) {   /* rows of all batches at once: one GEMM */
    GEMM(CblasRowMajor, TA, TB, (int)(batch * M), (int)N, (int)K, 1.0, A, lda, B, ldb, 0.0, C, (int)N);
    return 0;
  }
  for (int64_t i = 0; i < batch; i++)
    GEMM(CblasRowMajor, TA, TB, (int)M, (int)N, (int)K, 1.0, A + i * M * K, lda,
         B + (rb == 2 ? 0 : i * K * N), ldb, 0.0, C + i * M * N, (int)N);
  return 0;
}

/* ---- row-wise neural-network ops over the last axis: [rows, D] ---- */
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

static int FN(k_SOFTMAX)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = 0; r < rows; r++) {
    const T *xr = x + r * D;
    T *yr = y + r * D;
    T mx = FN(row_max)(xr, D);
    if (mx == -INFINITY) mx = 0;   /* a fully masked row: avoid inf - inf */
    double s = FN(sum_exp)(xr, D, mx, yr);
    for (int64_t i = 0; i < D; i++) yr[i] = (T)((double)yr[i] / s);
  }
  return 0;
}

static int FN(k_LOG_SOFTMAX)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = 0; r < rows; r++) {
    const T *xr = x + r * D;
    T mx = FN(row_max)(xr, D);
    if (mx == -INFINITY) mx = 0;
    double lse = (double)mx + log(FN(sum_exp)(xr, D, mx, NULL));
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)((double)xr[i] - lse);
  }
  return 0;
}

/* (y, dy) -> y * (dy - sum(dy * y)) */
static int FN(k_SOFTMAX_BWD)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *y = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t i = 0; i < D; i++) s += (double)dy[r * D + i] * (double)y[r * D + i];
    for (int64_t i = 0; i < D; i++) dx[r * D + i] = (T)((double)y[r * D + i] * ((double)dy[r * D + i] - s));
  }
  return 0;
}

/* (y, dy) -> dy - exp(y) * sum(dy), y = log_softmax(x) */
static int FN(k_LOG_SOFTMAX_BWD)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *y = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t i = 0; i < D; i++) s += dy[r * D + i];
    for (int64_t i = 0; i < D; i++) dx[r * D + i] = (T)((double)dy[r * D + i] - exp((double)y[r * D + i]) * s);
  }
  return 0;
}

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

static int FN(k_LAYERNORM)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = 0; r < rows && D > 0; r++) {
    double mu, rs;
    FN(ln_stats)(x + r * D, D, k->n->fa[0], &mu, &rs);
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)(((double)x[r * D + i] - mu) * rs);
  }
  return 0;
}

/* dx = rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
static int FN(k_LAYERNORM_BWD)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = 0; r < rows && D > 0; r++) {
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
  return 0;
}

static double FN(rms_r)(const T *x, int64_t D, double eps) {
  double s = 0;
  for (int64_t i = 0; i < D; i++) s += (double)x[i] * (double)x[i];
  return 1.0 / sqrt(s / (double)D + eps);
}

static int FN(k_RMSNORM)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = 0; r < rows && D > 0; r++) {
    double rr = FN(rms_r)(x + r * D, D, k->n->fa[0]);
    for (int64_t i = 0; i < D; i++) y[r * D + i] = (T)((double)x[r * D + i] * rr);
  }
  return 0;
}

/* dx_i = r dy_i - r^3 x_i mean(dy * x), r = 1 / sqrt(mean(x^2) + eps) */
static int FN(k_RMSNORM_BWD)(RtKctx *k) {
  int64_t D, rows = rt_rows(k->ot, &D);
  const T *x = k->in[0], *dy = k->in[1];
  T *dx = k->out;
  for (int64_t r = 0; r < rows && D > 0; r++) {
    const T *xr = x + r * D, *gr = dy + r * D;
    double rr = FN(rms_r)(xr, D, k->n->fa[0]), dot = 0;
    for (int64_t i = 0; i < D; i++) dot += (double)gr[i] * (double)xr[i];
    dot /= (double)D;
    for (int64_t i = 0; i < D; i++)
      dx[r * D + i] = (T)(rr * (double)gr[i] - rr * rr * rr * (double)xr[i] * dot);
  }
  return 0;
}

/* (table[V, C], ids[...] i32) -> out[..., C].  A table split on dim 0
 * (vocab-parallel) holds global rows [off, off + V): ids outside that
 * block give 0 rows (the result is a partial sum over the split axes). */
static int FN(k_EMBEDDING)(RtKctx *k) {
  const IrType *tt = k->it[0];
  if (tt->rank != 2) return rt_kfail(k, "the table must be [V, C], got %s", rt_tstr(tt, 0));
  int64_t V = tt->dim[0], C = tt->dim[1], n = ir_type_numel(k->it[1]), nb;
  int64_t off = rt_shard_block(k->p, rt_kin_sh(k, 0)->split[0], &nb) * V, Vg = nb * V;
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

/* (ids[...] i32, dy[..., C]) -> d table [V, C]: scatter-add into zeros.
 * A result split on dim 0 holds global rows [off, off + V): only ids in
 * that block are scattered. */
static int FN(k_EMBEDDING_BWD)(RtKctx *k) {
  const IrType *ot = k->ot;
  if (ot->rank != 2) return rt_kfail(k, "the result must be [V, C], got %s", rt_tstr(ot, 0));
  int64_t V = ot->dim[0], C = ot->dim[1], n = ir_type_numel(k->it[0]), nb;
  int64_t off = rt_shard_block(k->p, k->n->sh.split[0], &nb) * V, Vg = nb * V;
  if (ir_type_numel(k->it[1]) != n * C) return rt_kfail(k, "dy size is not ids * C");
  const int32_t *ids = k->in[0];
  const T *dy = k->in[1];
  T *g = k->out;
  memset(g, 0, (size_t)(V * C) * sizeof *g);
  for (int64_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= Vg)
      return rt_kfail(k, "token id %d at position %lld is outside the table [0, %lld)", ids[i], (long long)i, (long long)Vg);
    if (ids[i] < off || ids[i] >= off + V) continue;
    T *row = g + ((int64_t)ids[i] - off) * C;
    for (int64_t c = 0; c < C; c++) row[c] += dy[i * C + c];
  }
  return 0;
}

/* x[..., R, C]: fill where column j > row i, both global indices (a
 * split row or column dim starts at the rank's block offset).  (Not I/J:
 * cblas.h pulls in complex.h, whose I is a macro.) */
static int FN(k_CAUSAL_MASK)(RtKctx *k) {
  const IrType *t = k->ot;
  if (t->rank < 2) return rt_kfail(k, "needs rank >= 2");
  int64_t R = t->dim[t->rank - 2], Cn = t->dim[t->rank - 1];
  int64_t ro = rt_shard_block(k->p, k->n->sh.split[t->rank - 2], NULL) * R;
  int64_t co = rt_shard_block(k->p, k->n->sh.split[t->rank - 1], NULL) * Cn;
  int64_t mats = (R > 0 && Cn > 0) ? ir_type_numel(t) / (R * Cn) : 0;
  const T *x = k->in[0];
  T *y = k->out;
  T fill = (T)k->n->fa[0];
  for (int64_t m = 0; m < mats; m++)
    for (int64_t i = 0; i < R; i++)
      for (int64_t j = 0; j < Cn; j++) {
        int64_t o = (m * R + i) * Cn + j;
        y[o] = j + co > i + ro ? fill : x[o];
      }
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
  double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
  uint64_t seed = rt_program_seed(k->p);
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK], idx[IR_MAX_RANK] = {0};
  rt_shard_offsets(k->p, &k->n->sh, t, off, gdim);
  int split = 0;
  for (int d = 0; d < t->rank; d++) split |= gdim[d] != t->dim[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t g = i;
    if (split) {
      g = 0;
      for (int d = 0; d < t->rank; d++) g = g * gdim[d] + off[d] + idx[d];
      for (int d = t->rank - 1; d >= 0; d--) {   /* odometer over the local index */
        if (++idx[d] < t->dim[d]) break;
        idx[d] = 0;
      }
    }
    double u = rt_dropout_u(seed, k->n->ia[0], k->info->step, k->info->micro, g);
    y[i] = u >= p ? (T)((double)x[i] * scale) : (T)0;
  }
  return 0;
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
  int64_t p0 = rt_shard_block(k->p, k->n->sh.split[ax], NULL) * t->dim[ax];
  const T *x = k->in[0];
  T *y = k->out;
  for (int64_t r = 0; r < rows; r++) {
    double pos = (double)(p0 + (r / per) % t->dim[ax]);
    for (int64_t i = 0; i < h; i++) {
      double th = sign * pos * pow(base, -2.0 * (double)i / (double)D);
      double c = cos(th), s = sin(th), x1 = x[r * D + i], x2 = x[r * D + i + h];
      y[r * D + i] = (T)(x1 * c - x2 * s);
      y[r * D + i + h] = (T)(x1 * s + x2 * c);
    }
  }
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

/* logsumexp(row) - row[target]; 0 where target == ignore.  The row works
 * in T (exponentials of x - max are in (0, 1]); the sum is in double. */
static int FN(k_CROSS_ENTROPY)(RtKctx *k) {
  int64_t V, rows = FN(ce_shape)(k, &V);
  if (rows < 0) return -1;
  if (ir_type_numel(k->ot) != rows) return rt_kfail(k, "result size is not the token count");
  const T *lg = k->in[0];
  const int32_t *tg = k->in[1];
  T *y = k->out;
  int64_t ign = k->n->ia[0];
  for (int64_t r = 0; r < rows; r++) {
    if (tg[r] == ign) { y[r] = 0; continue; }
    if (tg[r] < 0 || tg[r] >= V)
      return rt_kfail(k, "target %d at position %lld is outside [0, %lld)", tg[r], (long long)r, (long long)V);
    const T *lr = lg + r * V;
    T mx = FN(row_max)(lr, V);
    y[r] = (T)((double)mx + log(FN(sum_exp)(lr, V, mx, NULL)) - (double)lr[tg[r]]);
  }
  return 0;
}

/* (logits, targets, dl[rows]) -> (softmax - onehot) * dl; 0 rows for ignored */
static int FN(k_CROSS_ENTROPY_BWD)(RtKctx *k) {
  int64_t V, rows = FN(ce_shape)(k, &V);
  if (rows < 0) return -1;
  if (ir_type_numel(k->it[2]) != rows) return rt_kfail(k, "dloss size is not the token count");
  const T *lg = k->in[0], *dl = k->in[2];
  const int32_t *tg = k->in[1];
  T *g = k->out;
  int64_t ign = k->n->ia[0];
  for (int64_t r = 0; r < rows; r++) {
    T *gr = g + r * V;
    if (tg[r] == ign) { memset(gr, 0, (size_t)V * sizeof *gr); continue; }
    if (tg[r] < 0 || tg[r] >= V)
      return rt_kfail(k, "target %d at position %lld is outside [0, %lld)", tg[r], (long long)r, (long long)V);
    const T *lr = lg + r * V;
    T mx = FN(row_max)(lr, V);
    double d = dl[r], s = FN(sum_exp)(lr, V, mx, gr);
    T scale = (T)(d / s);
    for (int64_t i = 0; i < V; i++) gr[i] *= scale;
    gr[tg[r]] = (T)((double)gr[tg[r]] - d);
  }
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

/* state[ia0] += x */
static int FN(k_ACCUM)(RtKctx *k) {
  T *s = rt_state_data(k->p, (int)k->n->ia[0]);
  const T *x = k->in[0];
  int64_t n = ir_type_numel(k->it[0]);
  for (int64_t i = 0; i < n; i++) s[i] += x[i];
  return 0;
}

/* coef[]: g = grad * coef; m, v moments; bias-corrected step with
 * decoupled weight decay wd (0 for nodecay params, set by the optimizer pass).
 * ZeRO: when @m is flat-sharded, m, v and grad are the rank's chunk [c] of
 * the flattened (local) parameter, chunk b = the rank's block over the
 * flat axes: only param elements [b*c, min((b+1)*c, numel)) are updated. */
static int FN(k_ADAMW)(RtKctx *k) {
  const IrNode *n = k->n;
  RtProgram *p = k->p;
  const IrModule *mod = rt_program_module(p);
  const IrState *ms = &mod->states.a[n->ia[1]];
  T *w = rt_state_data(p, (int)n->ia[0]);
  const T *gr = k->in[1];
  T *m = rt_state_data(p, (int)n->ia[1]), *v = rt_state_data(p, (int)n->ia[2]);
  int64_t cnt = ir_type_numel(&mod->states.a[n->ia[0]].type);
  if (ms->sh.flat) {
    int64_t c = ir_type_numel(&ms->type), start = rt_shard_block(p, ms->sh.flat, NULL) * c;
    w += start < cnt ? start : cnt;
    cnt = start >= cnt ? 0 : (cnt - start < c ? cnt - start : c);
  }
  double coef = rt_ld(k->in[0], k->it[0]->dtype, 0);
  double b1 = n->fa[0], b2 = n->fa[1], eps = n->fa[2], wd = n->fa[3], lr = k->info->lr;
  double t = (double)(k->info->step + 1);
  double c1 = 1.0 - pow(b1, t), c2 = 1.0 - pow(b2, t);
  for (int64_t i = 0; i < cnt; i++) {
    double g = (double)gr[i] * coef;
    double mi = b1 * (double)m[i] + (1.0 - b1) * g;
    double vi = b2 * (double)v[i] + (1.0 - b2) * g * g;
    m[i] = (T)mi;
    v[i] = (T)vi;
    double mh = mi / c1, vh = vi / c2;
    w[i] = (T)((double)w[i] - lr * (mh / (sqrt(vh) + eps) + wd * (double)w[i]));
  }
  return 0;
}

#undef FN
