/* test_rt_ops.c - every reference kernel (ops_ref.c) against a direct,
 * independent computation written here, for f32 and f64: elementwise ops
 * (the *_BWD ones against finite differences of the forward formula),
 * layout, reductions, matmul variants, softmax, norms, embedding,
 * masks, dropout, rope, cross-entropy, the ring-attention steps (against
 * the fused attention kernels and a direct computation from global
 * positions), and the step ops.
 * The worker pool (runtime/cpu/par.h): every range covered once, and every
 * threaded kernel at sizes that split gives the 1-thread result bit for
 * bit on 3 threads, with layout ops (merged dims, tiles) against direct
 * index arithmetic at those sizes. */
#include "rt_test.h"
#include "runtime/cpu/par.h"
#include "runtime/cpu/kernels.h"

#define NT 2
static const IrDtype DTS[NT] = {IR_F32, IR_F64};
static char err[1024];

/* Compares n results with expected values; msg names the case. */
static void cmp(const double *got, const double *want, int64_t n, double tol, const char *msg, IrDtype dt) {
  TS_ASSERT(got);
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++) {
    double a = got[i], b = want[i];
    if (!(fabs(a - b) <= tol * (fabs(b) > 1 ? fabs(b) : 1)) && !(a == b)) bad = i;
  }
  CHECK(bad < 0, "%s (%s): element %lld = %.10g, expected %.10g", msg, ir_dtype_name(dt), (long long)bad,
        bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
}

/* Runs op and compares to want; frees the result. */
static void expect(IrOp op, int nin, const Arg *a, const int64_t *ia, const double *fa, const IrType *typed,
                   const double *want, int64_t n, double tol, const char *msg, IrDtype dt) {
  IrType rt;
  double *got = run_op(op, nin, a, ia, fa, typed, &rt, err, sizeof err);
  CHECK(got != NULL, "%s (%s): %s", msg, ir_dtype_name(dt), err);
  if (!got) return;
  CHECK(ir_type_numel(&rt) == n, "%s: %lld results, expected %lld", msg, (long long)ir_type_numel(&rt), (long long)n);
  if (ir_type_numel(&rt) == n) cmp(got, want, n, tol, msg, dt);
  free(got);
}

/* ---- reference formulas ---- */
static double sig(double x) { return 1 / (1 + exp(-x)); }
static double gelu_t(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_e(double x) { return 0.5 * x * (1 + erf(x / sqrt(2))); }
static double silu(double x) { return x * sig(x); }
static double fd(double (*f)(double), double x) { double h = 1e-5; return (f(x + h) - f(x - h)) / (2 * h); }

static void test_elementwise(IrDtype dt) {
  enum { N = 24 };
  IrType t = TY(dt, 4, 6);
  double *x = rand_vec(N, -3, 3, dt), *y = rand_vec(N, 0.5, 2, dt), *pos = rand_vec(N, 0.1, 4, dt);
  double w[N];
  Arg a1[1] = {{t, x}}, a2[2] = {{t, x}, {t, y}}, ap[1] = {{t, pos}};
  double tol = tol_of(dt), c[1] = {0.75};
#define EW2T(OP, EXPR) do { for (int i = 0; i < N; i++) w[i] = (EXPR); expect(OP, 2, a2, NULL, NULL, NULL, w, N, tol, #OP, dt); } while (0)
#define EW1T(OP, ARGS, EXPR) do { for (int i = 0; i < N; i++) w[i] = (EXPR); expect(OP, 1, ARGS, NULL, c, NULL, w, N, tol, #OP, dt); } while (0)
  EW2T(IR_OP_ADD, x[i] + y[i]);
  EW2T(IR_OP_SUB, x[i] - y[i]);
  EW2T(IR_OP_MUL, x[i] * y[i]);
  EW2T(IR_OP_DIV, x[i] / y[i]);
  EW1T(IR_OP_ADDS, a1, x[i] + 0.75);
  EW1T(IR_OP_MULS, a1, x[i] * 0.75);
  EW1T(IR_OP_NEG, a1, -x[i]);
  EW1T(IR_OP_EXP, a1, exp(x[i]));
  EW1T(IR_OP_LOG, ap, log(pos[i]));
  EW1T(IR_OP_SQRT, ap, sqrt(pos[i]));
  EW1T(IR_OP_RSQRT, ap, 1 / sqrt(pos[i]));
  EW1T(IR_OP_TANH, a1, tanh(x[i]));
  EW1T(IR_OP_GELU_TANH, a1, gelu_t(x[i]));
  EW1T(IR_OP_GELU_ERF, a1, gelu_e(x[i]));
  EW1T(IR_OP_SILU, a1, silu(x[i]));
  EW1T(IR_OP_RELU, a1, x[i] > 0 ? x[i] : 0);
  /* backward ops: (x, dy) -> dy * f'(x), f' by central differences */
  double ftol = dt == IR_F32 ? 1e-4 : 1e-8;
  for (int i = 0; i < N; i++) w[i] = y[i] * fd(gelu_t, x[i]);
  expect(IR_OP_GELU_TANH_BWD, 2, a2, NULL, NULL, NULL, w, N, ftol, "gelu_tanh_bwd", dt);
  for (int i = 0; i < N; i++) w[i] = y[i] * fd(gelu_e, x[i]);
  expect(IR_OP_GELU_ERF_BWD, 2, a2, NULL, NULL, NULL, w, N, ftol, "gelu_erf_bwd", dt);
  for (int i = 0; i < N; i++) w[i] = y[i] * fd(silu, x[i]);
  expect(IR_OP_SILU_BWD, 2, a2, NULL, NULL, NULL, w, N, ftol, "silu_bwd", dt);
  EW2T(IR_OP_RELU_BWD, x[i] > 0 ? y[i] : 0);
  /* eq: half the elements equal */
  double *z = ts_xmalloc(N * sizeof *z);
  for (int i = 0; i < N; i++) z[i] = i % 2 ? x[i] : y[i];
  Arg aeq[2] = {{t, x}, {t, z}};
  for (int i = 0; i < N; i++) w[i] = x[i] == z[i];
  expect(IR_OP_EQ, 2, aeq, NULL, NULL, NULL, w, N, 0, "eq", dt);
  free(z);
#undef EW2T
#undef EW1T
  free(x);
  free(y);
  free(pos);
}

/* ne_scalar on i32 and float inputs; cast among all dtypes; full */
static void test_typed_ew(IrDtype dt) {
  double ids[6] = {0, -1, 3, -1, 7, 2}, w[6];
  IrType ti = TY(IR_I32, 2, 3), tr = TY(dt, 2, 3);
  Arg a[1] = {{ti, ids}};
  double c[1] = {-1};
  for (int i = 0; i < 6; i++) w[i] = ids[i] != -1;
  expect(IR_OP_NE_SCALAR, 1, a, NULL, c, &tr, w, 6, 0, "ne_scalar i32", dt);
  double xf[6] = {1.5, -1, 0, -1, 2.25, -1.5};
  IrType tf = TY(dt, 2, 3);
  Arg af[1] = {{tf, xf}};
  for (int i = 0; i < 6; i++) w[i] = xf[i] != -1;
  expect(IR_OP_NE_SCALAR, 1, af, NULL, c, &tr, w, 6, 0, "ne_scalar float", dt);
  /* cast float -> i32 truncates toward zero; i32 -> float exact */
  IrType to_i = TY(IR_I32, 2, 3);
  for (int i = 0; i < 6; i++) w[i] = (double)(int32_t)xf[i];
  expect(IR_OP_CAST, 1, af, NULL, NULL, &to_i, w, 6, 0, "cast to i32", dt);
  expect(IR_OP_CAST, 1, a, NULL, NULL, &tr, ids, 6, 0, "cast from i32", dt);
  IrType other = TY(dt == IR_F32 ? IR_F64 : IR_F32, 2, 3);
  expect(IR_OP_CAST, 1, af, NULL, NULL, &other, xf, 6, 0, "cast float->float", dt);
  double fv[1] = {-2.5};
  for (int i = 0; i < 6; i++) w[i] = -2.5;
  expect(IR_OP_FULL, 0, NULL, NULL, fv, &tr, w, 6, 0, "full", dt);
}

/* integer tensors and indexing: cmp, where, floordiv, mod, integer
 * add / muls, arange, rand, gather, gather_bwd against formulas written
 * here (Python's // and % by floor()) */
static void test_ints(IrDtype dt) {
  enum { N = 8 };
  double xi[N] = {7, -7, 7, -7, 0, 5, -3, 2}, yi[N] = {2, 2, -2, -2, 3, 0, 3, 2}, w[N];
  IrType ti = TY(IR_I32, 2, 4), tf = TY(dt, 2, 4);
  Arg ai[2] = {{ti, xi}, {ti, yi}};
  for (int p = 0; p < 6; p++) {
    int64_t pred[1] = {p};
    for (int i = 0; i < N; i++) {
      double a = xi[i], b = yi[i];
      w[i] = p == 0 ? a == b : p == 1 ? a != b : p == 2 ? a < b : p == 3 ? a <= b : p == 4 ? a > b : a >= b;
    }
    expect(IR_OP_CMP, 2, ai, pred, NULL, NULL, w, N, 0, "cmp i32", IR_I32);
    double xf[N], yf[N];
    for (int i = 0; i < N; i++) { xf[i] = xi[i] / 4; yf[i] = yi[i] / 4; }
    Arg af[2] = {{tf, xf}, {tf, yf}};
    expect(IR_OP_CMP, 2, af, pred, NULL, NULL, w, N, 0, "cmp float", dt);
  }
  for (int i = 0; i < N; i++) w[i] = yi[i] == 0 ? 0 : floor(xi[i] / yi[i]);
  expect(IR_OP_FLOORDIV, 2, ai, NULL, NULL, NULL, w, N, 0, "floordiv", IR_I32);
  for (int i = 0; i < N; i++) w[i] = yi[i] == 0 ? 0 : xi[i] - yi[i] * floor(xi[i] / yi[i]);
  expect(IR_OP_MOD, 2, ai, NULL, NULL, NULL, w, N, 0, "mod", IR_I32);
  for (int i = 0; i < N; i++) w[i] = xi[i] * yi[i];
  expect(IR_OP_MUL, 2, ai, NULL, NULL, NULL, w, N, 0, "mul i32", IR_I32);
  double c3[1] = {-3};
  for (int i = 0; i < N; i++) w[i] = xi[i] - 3;
  expect(IR_OP_ADDS, 1, ai, NULL, c3, NULL, w, N, 0, "adds i32", IR_I32);
  /* where: the i32 condition picks x or y (float branches) */
  double bx[N], by[N];
  for (int i = 0; i < N; i++) { bx[i] = i + 0.5; by[i] = -i; w[i] = xi[i] > 0 ? bx[i] : by[i]; }
  double cnd[N];
  for (int i = 0; i < N; i++) cnd[i] = xi[i] > 0;
  Arg aw[3] = {{ti, cnd}, {tf, bx}, {tf, by}};
  expect(IR_OP_WHERE, 3, aw, NULL, NULL, NULL, w, N, 0, "where", dt);
  /* arange along axis 1 of [2, 4]: start + step * j */
  int64_t ax1[1] = {1};
  double ss[2] = {3, -2};
  for (int i = 0; i < N; i++) w[i] = 3 - 2 * (i % 4);
  expect(IR_OP_ARANGE, 0, NULL, ax1, ss, &ti, w, N, 0, "arange i32", IR_I32);
  expect(IR_OP_ARANGE, 0, NULL, ax1, ss, &tf, w, N, 0, "arange float", dt);
  /* gather along axis 1: x [2, 4], idx [2, 3]; gather_bwd scatter-adds */
  double gx[N] = {10, 11, 12, 13, 20, 21, 22, 23}, gi[6] = {3, 0, 3, 1, 1, 2}, gw[6] = {13, 10, 13, 21, 21, 22};
  IrType tgi = TY(IR_I32, 2, 3), tgy = TY(dt, 2, 3);
  Arg ag[2] = {{tf, gx}, {tgi, gi}};
  int64_t gax[1] = {1};
  expect(IR_OP_GATHER, 2, ag, gax, NULL, NULL, gw, 6, 0, "gather", dt);
  double dy[6] = {1, 2, 4, 8, 16, 32}, dw[N] = {2, 0, 0, 5, 0, 24, 32, 0};
  Arg ab[2] = {{tgi, gi}, {tgy, dy}};
  expect(IR_OP_GATHER_BWD, 2, ab, gax, NULL, &tf, dw, N, 0, "gather_bwd", dt);
  /* rand: i32 in [lo, hi) covering every value, deterministic per stream;
   * floats in [lo, hi) with a mean near the middle */
  enum { M = 4000 };
  IrType tr = TY(IR_I32, 40, 100), tu = TY(dt, 40, 100), rt;
  int64_t st[1] = {5};
  double lh[2] = {-2, 3}, seen[5] = {0}, sum = 0;
  double *r1 = run_op(IR_OP_RAND, 0, NULL, st, lh, &tr, &rt, err, sizeof err);
  double *r2 = run_op(IR_OP_RAND, 0, NULL, st, lh, &tr, &rt, err, sizeof err);
  double *u = run_op(IR_OP_RAND, 0, NULL, st, lh, &tu, &rt, err, sizeof err);
  CHECK(r1 && r2 && u, "rand: %s", err);
  if (r1 && r2 && u) {
    int ok = 1, same = 1;
    for (int i = 0; i < M; i++) {
      ok &= r1[i] >= -2 && r1[i] < 3 && r1[i] == floor(r1[i]) && u[i] >= -2 && u[i] < 3;
      same &= r1[i] == r2[i];
      if (r1[i] >= -2 && r1[i] < 3) seen[(int)r1[i] + 2]++;
      sum += u[i];
    }
    CHECK(ok, "rand: a value outside [-2, 3) or not an integer");
    CHECK(same, "rand: two runs differ");
    for (int v = 0; v < 5; v++) CHECK(fabs(seen[v] / M - 0.2) < 0.03, "randint value %d: frequency %g", v - 2, seen[v] / M);
    CHECK(fabs(sum / M - 0.5) < 0.05, "rand mean %g, expected about 0.5", sum / M);
  }
  free(r1);
  free(r2);
  free(u);
}

/* index helpers for the layout references */
static void test_layout(IrDtype dt) {
  enum { A = 2, B = 3, C = 4, N = A * B * C };
  IrType t = TY(dt, A, B, C);
  double *x = rand_vec(N, -1, 1, dt), w[4 * N];
  Arg a[1] = {{t, x}};
  /* reshape: same order */
  IrType rs = TY(dt, 6, 4);
  expect(IR_OP_RESHAPE, 1, a, NULL, NULL, &rs, x, N, 0, "reshape", dt);
  /* permute [2, 0, 1]: y[k, i, j] = x[i, j, k] */
  int64_t perm[3] = {2, 0, 1};
  for (int k = 0; k < C; k++)
    for (int i = 0; i < A; i++)
      for (int j = 0; j < B; j++) w[(k * A + i) * B + j] = x[(i * B + j) * C + k];
  expect(IR_OP_PERMUTE, 1, a, perm, NULL, NULL, w, N, 0, "permute", dt);
  /* slice axis 1 [1, 3) */
  int64_t sl[3] = {1, 1, 3};
  int n = 0;
  for (int i = 0; i < A; i++)
    for (int j = 1; j < 3; j++)
      for (int k = 0; k < C; k++) w[n++] = x[(i * B + j) * C + k];
  expect(IR_OP_SLICE, 1, a, sl, NULL, NULL, w, n, 0, "slice", dt);
  /* pad axis 2 by 1 before, 2 after */
  int64_t pd[3] = {2, 1, 2};
  n = 0;
  for (int i = 0; i < A; i++)
    for (int j = 0; j < B; j++)
      for (int k = -1; k < C + 2; k++) w[n++] = k >= 0 && k < C ? x[(i * B + j) * C + k] : 0;
  expect(IR_OP_PAD, 1, a, pd, NULL, NULL, w, n, 0, "pad", dt);
  /* concat along axis 1 of x[2,3,4], y[2,1,4], x */
  IrType t2 = TY(dt, A, 1, C);
  double *y = rand_vec(A * C, -1, 1, dt);
  Arg ac[3] = {{t, x}, {t2, y}, {t, x}};
  int64_t ax1[1] = {1};
  n = 0;
  for (int i = 0; i < A; i++) {
    for (int j = 0; j < B; j++) for (int k = 0; k < C; k++) w[n++] = x[(i * B + j) * C + k];
    for (int k = 0; k < C; k++) w[n++] = y[i * C + k];
    for (int j = 0; j < B; j++) for (int k = 0; k < C; k++) w[n++] = x[(i * B + j) * C + k];
  }
  expect(IR_OP_CONCAT, 3, ac, ax1, NULL, NULL, w, n, 0, "concat", dt);
  /* broadcast [3, 1] -> [2, 3, 4]; sum_to back = 8 * value */
  IrType tb = TY(dt, B, 1);
  double *v = rand_vec(B, -1, 1, dt);
  Arg ab[1] = {{tb, v}};
  for (int i = 0; i < A; i++)
    for (int j = 0; j < B; j++)
      for (int k = 0; k < C; k++) w[(i * B + j) * C + k] = v[j];
  expect(IR_OP_BROADCAST, 1, ab, NULL, NULL, &t, w, N, 0, "broadcast", dt);
  double s[B];
  for (int j = 0; j < B; j++) {
    s[j] = 0;
    for (int i = 0; i < A; i++) for (int k = 0; k < C; k++) s[j] += x[(i * B + j) * C + k];
  }
  expect(IR_OP_SUM_TO, 1, a, NULL, NULL, &tb, s, B, tol_of(dt), "sum_to [3,1]", dt);
  IrType tc = TY(dt, C);   /* fewer dims: [2,3,4] -> [4] */
  double s2[C] = {0};
  for (int i = 0; i < N; i++) s2[i % C] += x[i];
  expect(IR_OP_SUM_TO, 1, a, NULL, NULL, &tc, s2, C, tol_of(dt), "sum_to [4]", dt);
  free(x);
  free(y);
  free(v);
}

static void test_reductions(IrDtype dt) {
  enum { A = 3, B = 5, C = 2, N = A * B * C };
  IrType t = TY(dt, A, B, C);
  double *x = rand_vec(N, -2, 2, dt), w[N];
  Arg a[1] = {{t, x}};
  for (int keep = 0; keep < 2; keep++) {
    int64_t ia[2] = {1, keep};
    for (int op = 0; op < 3; op++) {
      for (int i = 0; i < A; i++)
        for (int k = 0; k < C; k++) {
          double acc = op == 2 ? -INFINITY : 0;
          for (int j = 0; j < B; j++) {
            double v = x[(i * B + j) * C + k];
            acc = op == 2 ? (v > acc ? v : acc) : acc + v;
          }
          w[i * C + k] = op == 1 ? acc / B : acc;
        }
      IrOp ops[3] = {IR_OP_SUM, IR_OP_MEAN, IR_OP_MAX};
      IrType rt;
      double *got = run_op(ops[op], 1, a, ia, NULL, NULL, &rt, err, sizeof err);
      CHECK(got, "%s: %s", ir_ops[ops[op]].name, err);
      if (!got) continue;
      CHECK(rt.rank == (keep ? 3 : 2), "%s keepdim=%d gives rank %d", ir_ops[ops[op]].name, keep, rt.rank);
      cmp(got, w, A * C, tol_of(dt), ir_ops[ops[op]].name, dt);
      free(got);
    }
  }
  /* axis 0 and the last axis too (sum only) */
  int64_t ia0[2] = {0, 0}, ia2[2] = {2, 0};
  for (int j = 0; j < B * C; j++) { w[j] = 0; for (int i = 0; i < A; i++) w[j] += x[i * B * C + j]; }
  expect(IR_OP_SUM, 1, a, ia0, NULL, NULL, w, B * C, tol_of(dt), "sum axis 0", dt);
  for (int r = 0; r < A * B; r++) w[r] = x[r * C] + x[r * C + 1];
  expect(IR_OP_SUM, 1, a, ia2, NULL, NULL, w, A * B, tol_of(dt), "sum axis 2", dt);
  double ss = 0;
  for (int i = 0; i < N; i++) ss += x[i] * x[i];
  expect(IR_OP_SUMSQ, 1, a, NULL, NULL, NULL, &ss, 1, tol_of(dt), "sumsq", dt);
  free(x);
}

/* C[b, m, n] = sum_k A[b, m, k] B[b?, k, n], operands stored transposed as asked */
static void test_matmul(IrDtype dt) {
  enum { BT = 3, M = 4, K = 5, N = 6 };
  double *A = rand_vec(BT * M * K, -1, 1, dt), *B = rand_vec(BT * K * N, -1, 1, dt);
  double As[BT * M * K], Bs[BT * K * N], w[BT * M * N];
  for (int batched_b = 0; batched_b < 2; batched_b++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        /* store A as [BT, M, K] or [BT, K, M]; B as [(BT,) K, N] or [(BT,) N, K] */
        for (int b = 0; b < BT; b++)
          for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++) As[b * M * K + (ta ? k * M + m : m * K + k)] = A[(b * M + m) * K + k];
        int nbb = batched_b ? BT : 1;
        for (int b = 0; b < nbb; b++)
          for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) Bs[b * K * N + (tb ? n * K + k : k * N + n)] = B[(b * K + k) * N + n];
        for (int b = 0; b < BT; b++)
          for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
              double s = 0;
              for (int k = 0; k < K; k++) s += A[(b * M + m) * K + k] * B[((batched_b ? b : 0) * K + k) * N + n];
              w[(b * M + m) * N + n] = s;
            }
        IrType at = ta ? TY(dt, BT, K, M) : TY(dt, BT, M, K);
        IrType bt = batched_b ? (tb ? TY(dt, BT, N, K) : TY(dt, BT, K, N)) : (tb ? TY(dt, N, K) : TY(dt, K, N));
        Arg args[2] = {{at, As}, {bt, Bs}};
        int64_t ia[2] = {ta, tb};
        char msg[64];
        snprintf(msg, sizeof msg, "matmul ta=%d tb=%d %s rhs", ta, tb, batched_b ? "batched" : "2-D");
        expect(IR_OP_MATMUL, 2, args, ia, NULL, NULL, w, BT * M * N, tol_of(dt) * 5, msg, dt);
      }
  /* plain 2-D @ 2-D */
  IrType a2 = TY(dt, M, K), b2 = TY(dt, K, N);
  Arg args[2] = {{a2, A}, {b2, B}};
  expect(IR_OP_MATMUL, 2, args, (int64_t[]){0, 0}, NULL, NULL, w, M * N, tol_of(dt) * 5, "matmul 2-D", dt);
  free(A);
  free(B);
}

static void test_softmax_norms(IrDtype dt) {
  enum { R = 6, D = 7, N = R * D };
  IrType t = TY(dt, 2, 3, D);
  double *x = rand_vec(N, -4, 4, dt), *dy = rand_vec(N, -1, 1, dt), w[N], sm[N], ls[N];
  for (int r = 0; r < R; r++) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < D; i++) mx = fmax(mx, x[r * D + i]);
    for (int i = 0; i < D; i++) s += exp(x[r * D + i] - mx);
    for (int i = 0; i < D; i++) { sm[r * D + i] = exp(x[r * D + i] - mx) / s; ls[r * D + i] = x[r * D + i] - mx - log(s); }
  }
  Arg a[1] = {{t, x}};
  expect(IR_OP_SOFTMAX, 1, a, NULL, NULL, NULL, sm, N, tol_of(dt), "softmax", dt);
  IrType rt;
  double *got = run_op(IR_OP_SOFTMAX, 1, a, NULL, NULL, NULL, &rt, err, sizeof err);
  for (int r = 0; got && r < R; r++) {
    double s = 0;
    for (int i = 0; i < D; i++) s += got[r * D + i];
    CHECK(fabs(s - 1) < tol_of(dt) * 5, "softmax row %d sums to %.10g", r, s);
  }
  free(got);
  expect(IR_OP_LOG_SOFTMAX, 1, a, NULL, NULL, NULL, ls, N, tol_of(dt), "log_softmax", dt);
  /* backward formulas from ops.def, on rounded y */
  double *y = ts_xmalloc(N * sizeof *y), *ly = ts_xmalloc(N * sizeof *ly);
  for (int i = 0; i < N; i++) { y[i] = dt == IR_F32 ? (float)sm[i] : sm[i]; ly[i] = dt == IR_F32 ? (float)ls[i] : ls[i]; }
  for (int r = 0; r < R; r++) {
    double s = 0, s2 = 0;
    for (int i = 0; i < D; i++) { s += dy[r * D + i] * y[r * D + i]; s2 += dy[r * D + i]; }
    for (int i = 0; i < D; i++) {
      sm[r * D + i] = y[r * D + i] * (dy[r * D + i] - s);
      ls[r * D + i] = dy[r * D + i] - exp(ly[r * D + i]) * s2;
    }
  }
  Arg sb[2] = {{t, y}, {t, dy}}, lb[2] = {{t, ly}, {t, dy}};
  expect(IR_OP_SOFTMAX_BWD, 2, sb, NULL, NULL, NULL, sm, N, tol_of(dt), "softmax_bwd", dt);
  expect(IR_OP_LOG_SOFTMAX_BWD, 2, lb, NULL, NULL, NULL, ls, N, tol_of(dt), "log_softmax_bwd", dt);
  free(y);
  free(ly);

  /* layernorm / rmsnorm forward by hand; backward against finite
   * differences of L(x) = sum(dy * norm(x)) computed here in double */
  double eps[1] = {1e-5};
  for (int rms = 0; rms < 2; rms++) {
    for (int r = 0; r < R; r++) {
      const double *xr = x + r * D;
      double mu = 0, v = 0;
      for (int i = 0; i < D; i++) mu += xr[i];
      mu /= D;
      for (int i = 0; i < D; i++) v += rms ? xr[i] * xr[i] : (xr[i] - mu) * (xr[i] - mu);
      v /= D;
      for (int i = 0; i < D; i++) w[r * D + i] = (rms ? xr[i] : xr[i] - mu) / sqrt(v + eps[0]);
    }
    IrOp fwd = rms ? IR_OP_RMSNORM : IR_OP_LAYERNORM, bwd = rms ? IR_OP_RMSNORM_BWD : IR_OP_LAYERNORM_BWD;
    expect(fwd, 1, a, NULL, eps, NULL, w, N, tol_of(dt) * 2, ir_ops[fwd].name, dt);
    double *xx = ts_xmalloc(N * sizeof *xx);
    memcpy(xx, x, N * sizeof *xx);
    for (int j = 0; j < N; j++) {
      double lp[2];
      double orig = xx[j];
      int r = j / D;
      for (int sgn = 0; sgn < 2; sgn++) {
        xx[j] = orig + (sgn ? -1e-6 : 1e-6);
        const double *xr = xx + r * D;
        double mu = 0, v = 0, L = 0;
        for (int i = 0; i < D; i++) mu += xr[i];
        mu /= D;
        for (int i = 0; i < D; i++) v += rms ? xr[i] * xr[i] : (xr[i] - mu) * (xr[i] - mu);
        v /= D;
        for (int i = 0; i < D; i++) L += dy[r * D + i] * (rms ? xr[i] : xr[i] - mu) / sqrt(v + eps[0]);
        lp[sgn] = L;
      }
      xx[j] = orig;
      w[j] = (lp[0] - lp[1]) / 2e-6;
    }
    free(xx);
    Arg ab[2] = {{t, x}, {t, dy}};
    expect(bwd, 2, ab, NULL, eps, NULL, w, N, dt == IR_F32 ? 1e-4 : 1e-6, ir_ops[bwd].name, dt);
  }
  free(x);
  free(dy);
}

static void test_embedding(IrDtype dt) {
  enum { V = 5, C = 3, B = 2, T = 4 };
  IrType tt = TY(dt, V, C), it = TY(IR_I32, B, T);
  double *tab = rand_vec(V * C, -1, 1, dt), ids[B * T] = {0, 4, 2, 2, 1, 0, 4, 4}, w[V * C];
  double out[B * T * C];
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) out[i * C + c] = tab[(int)ids[i] * C + c];
  Arg a[2] = {{tt, tab}, {it, ids}};
  expect(IR_OP_EMBEDDING, 2, a, NULL, NULL, NULL, out, B * T * C, 0, "embedding", dt);
  /* out-of-range ids are refused with a message, for both directions */
  double bad[B * T] = {0, 1, 5, 0, 0, 0, 0, 0};
  Arg ab[2] = {{tt, tab}, {it, bad}};
  IrType rt;
  double *got = run_op(IR_OP_EMBEDDING, 2, ab, NULL, NULL, NULL, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "outside"), "embedding with id 5 of 5 should fail, got '%s'", err);
  free(got);
  bad[2] = -1;
  got = run_op(IR_OP_EMBEDDING, 2, ab, NULL, NULL, NULL, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "outside"), "embedding with id -1 should fail, got '%s'", err);
  free(got);
  /* backward: scatter-add of dy rows into [V, C] */
  IrType dyt = TY(dt, B, T, C);
  double *dy = rand_vec(B * T * C, -1, 1, dt);
  memset(w, 0, sizeof w);
  for (int i = 0; i < B * T; i++)
    for (int c = 0; c < C; c++) w[(int)ids[i] * C + c] += dy[i * C + c];
  Arg bb[2] = {{it, ids}, {dyt, dy}};
  expect(IR_OP_EMBEDDING_BWD, 2, bb, NULL, NULL, &tt, w, V * C, tol_of(dt), "embedding_bwd", dt);
  Arg bbad[2] = {{it, bad}, {dyt, dy}};
  got = run_op(IR_OP_EMBEDDING_BWD, 2, bbad, NULL, NULL, &tt, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "outside"), "embedding_bwd with id -1 should fail, got '%s'", err);
  free(got);
  free(tab);
  free(dy);
}

static void test_masks(IrDtype dt) {
  enum { B = 2, R = 3, C = 4, N = B * R * C };
  IrType t = TY(dt, B, R, C);
  double *x = rand_vec(N, -1, 1, dt), w[N], fill[1] = {-INFINITY};
  for (int b = 0; b < B; b++)
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) w[(b * R + i) * C + j] = j > i ? -INFINITY : x[(b * R + i) * C + j];
  Arg a[1] = {{t, x}};
  expect(IR_OP_CAUSAL_MASK, 1, a, NULL, fill, NULL, w, N, 0, "causal_mask", dt);
  double keep[N], f2[1] = {7.5};
  for (int i = 0; i < N; i++) { keep[i] = (i % 3) != 0; w[i] = keep[i] ? x[i] : 7.5; }
  Arg am[2] = {{t, x}, {t, keep}};
  expect(IR_OP_MASKED_FILL, 2, am, NULL, f2, NULL, w, N, 0, "masked_fill", dt);
  free(x);
}

static void test_dropout(IrDtype dt) {
  enum { N = 20000 };
  IrType t = TY(dt, 100, 200);
  double *x = rand_vec(N, 0.5, 1.5, dt);
  Arg a[1] = {{t, x}};
  int64_t stream[1] = {3};
  double p[1] = {0.3};
  IrType rt;
  double *y1 = run_op(IR_OP_DROPOUT, 1, a, stream, p, NULL, &rt, err, sizeof err);
  double *y2 = run_op(IR_OP_DROPOUT, 1, a, stream, p, NULL, &rt, err, sizeof err);
  int64_t stream2[1] = {4};
  double *y3 = run_op(IR_OP_DROPOUT, 1, a, stream2, p, NULL, &rt, err, sizeof err);
  CHECK(y1 && y2 && y3, "dropout: %s", err);
  if (y1 && y2 && y3) {
    int kept = 0, scaled_ok = 1, same = 1, diff = 0;
    for (int i = 0; i < N; i++) {
      if (y1[i] != 0) {
        kept++;
        if (fabs(y1[i] - x[i] / 0.7) > tol_of(dt) * 2) scaled_ok = 0;
      }
      if (y1[i] != y2[i]) same = 0;
      if ((y1[i] != 0) != (y3[i] != 0)) diff++;
    }
    double frac = (double)kept / N;
    CHECK(fabs(frac - 0.7) < 0.02, "dropout keep fraction %.4f, expected 0.7", frac);
    CHECK(scaled_ok, "dropout: kept values are not x / (1 - p)");
    CHECK(same, "dropout is not reproducible");
    CHECK(diff > N / 10, "another stream gives nearly the same mask (%d differ)", diff);
  }
  free(y1);
  free(y2);
  free(y3);
  double p0[1] = {0};
  expect(IR_OP_DROPOUT, 1, a, stream, p0, NULL, x, N, 0, "dropout p=0", dt);
  free(x);
}

/* pass decode's value ops at a position: rope_at (rope from pos), slice_at,
 * and attn_cached (queries at pos + i over the cached keys 0 .. pos + i, a
 * window, grouped-query heads) against direct loops. */
static void test_decode_ops(IrDtype dt) {
  enum { B = 1, T = 3, H = 2, D = 4, N = B * T * H * D, P = 5 };
  IrType t = TY(dt, B, T, H, D), pt = scalar_ty(IR_I32);
  double *x = rand_vec(N, -1, 1, dt), w[N], base[1] = {100.0}, pos[1] = {P};
  for (int s = 0; s < T; s++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < D / 2; i++) {
        int r = (s * H + h) * D;
        double th = (s + P) * pow(100.0, -2.0 * i / D);
        w[r + i] = x[r + i] * cos(th) - x[r + i + D / 2] * sin(th);
        w[r + i + D / 2] = x[r + i] * sin(th) + x[r + i + D / 2] * cos(th);
      }
  Arg a[2] = {{t, x}, {pt, pos}};
  expect(IR_OP_ROPE_AT, 2, a, (int64_t[]){1, 0}, base, NULL, w, N, tol_of(dt) * 2, "rope_at", dt);
  double one[1] = {1};
  Arg as[2] = {{t, x}, {pt, one}};
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < H * D; k++) w[s * H * D + k] = x[(s + 1) * H * D + k];
  expect(IR_OP_SLICE_AT, 2, as, (int64_t[]){1, 2}, NULL, NULL, w, 2 * H * D, 0, "slice_at", dt);
  /* attn_cached: 4 query heads over 2 kv heads, 2 queries at positions 3, 4 of 6 cached */
  enum { Hq = 4, Hk = 2, Tq = 2, Tk = 6, Q0 = 3 };
  IrType qt = TY(dt, 1, Hq, Tq, D), kt = TY(dt, 1, Hk, Tk, D);
  double *q = rand_vec(Hq * Tq * D, -1, 1, dt), *kk = rand_vec(Hk * Tk * D, -1, 1, dt);
  double *v = rand_vec(Hk * Tk * D, -1, 1, dt), q0[1] = {Q0}, want[Hq * Tq * D];
  for (int win = 0; win < 3; win += 2) {
    for (int h = 0; h < Hq; h++)
      for (int i = 0; i < Tq; i++) {
        const double *qr = q + (h * Tq + i) * D;
        double sc[Tk], mx = -INFINITY, l = 0;
        int g = h / (Hq / Hk), qp = Q0 + i, lo = win && qp - win + 1 > 0 ? qp - win + 1 : 0;
        for (int j = lo; j <= qp; j++) {
          sc[j] = 0;
          for (int d = 0; d < D; d++) sc[j] += qr[d] * kk[(g * Tk + j) * D + d];
          sc[j] *= 0.5;
          if (sc[j] > mx) mx = sc[j];
        }
        double *o = want + (h * Tq + i) * D;
        for (int d = 0; d < D; d++) o[d] = 0;
        for (int j = lo; j <= qp; j++) {
          double e = exp(sc[j] - mx);
          l += e;
          for (int d = 0; d < D; d++) o[d] += e * v[(g * Tk + j) * D + d];
        }
        for (int d = 0; d < D; d++) o[d] /= l;
      }
    Arg aa[4] = {{qt, q}, {kt, kk}, {kt, v}, {pt, q0}};
    expect(IR_OP_ATTN_CACHED, 4, aa, (int64_t[]){win}, (double[]){0.5}, NULL, want, Hq * Tq * D, tol_of(dt) * 4,
           win ? "attn_cached window=2" : "attn_cached", dt);
  }
  free(x);
  free(q);
  free(kk);
  free(v);
}

static void test_rope(IrDtype dt) {
  enum { B = 2, T = 5, H = 3, D = 8, N = B * T * H * D };
  IrType t = TY(dt, B, T, H, D);
  double *x = rand_vec(N, -1, 1, dt), w[N], base[1] = {100.0};
  for (int b = 0; b < B; b++)
    for (int s = 0; s < T; s++)
      for (int h = 0; h < H; h++) {
        const double *xr = x + ((b * T + s) * H + h) * D;
        double *yr = w + ((b * T + s) * H + h) * D;
        for (int i = 0; i < D / 2; i++) {
          double th = s * pow(100.0, -2.0 * i / D);
          yr[i] = xr[i] * cos(th) - xr[i + D / 2] * sin(th);
          yr[i + D / 2] = xr[i] * sin(th) + xr[i + D / 2] * cos(th);
        }
      }
  Arg a[1] = {{t, x}};
  int64_t ia[2] = {1, 0};
  expect(IR_OP_ROPE, 1, a, ia, base, NULL, w, N, tol_of(dt) * 2, "rope", dt);
  /* inverse undoes it */
  double *rw = ts_xmalloc(N * sizeof *rw);
  for (int i = 0; i < N; i++) rw[i] = dt == IR_F32 ? (float)w[i] : w[i];
  Arg ai[1] = {{t, rw}};
  int64_t inv[2] = {1, 1};
  expect(IR_OP_ROPE, 1, ai, inv, base, NULL, x, N, tol_of(dt) * 4, "rope inverse", dt);
  free(rw);
  free(x);
}

static void test_cross_entropy(IrDtype dt) {
  enum { B = 2, T = 3, V = 5, R = B * T };
  IrType lt = TY(dt, B, T, V), tt = TY(IR_I32, B, T), dlt = TY(dt, B, T);
  double *lg = rand_vec(R * V, -3, 3, dt), tg[R] = {0, 4, -1, 2, 2, 1}, w[R * V];
  for (int r = 0; r < R; r++) {
    if (tg[r] == -1) { w[r] = 0; continue; }
    double s = 0;
    for (int i = 0; i < V; i++) s += exp(lg[r * V + i]);
    w[r] = log(s) - lg[r * V + (int)tg[r]];
  }
  Arg a[2] = {{lt, lg}, {tt, tg}};
  int64_t ign[1] = {-1};
  expect(IR_OP_CROSS_ENTROPY, 2, a, ign, NULL, NULL, w, R, tol_of(dt), "cross_entropy", dt);
  /* a target outside [0, V) that is not `ignore` is an error */
  double bad[R] = {0, 5, 0, 0, 0, 0};
  Arg ab[2] = {{lt, lg}, {tt, bad}};
  IrType rt;
  double *got = run_op(IR_OP_CROSS_ENTROPY, 2, ab, ign, NULL, NULL, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "target 5"), "cross_entropy with target 5 of 5 should fail, got '%s'", err);
  free(got);
  /* with ignore = 4 the 4 is ignored and the -1 is refused */
  int64_t ign4[1] = {4};
  got = run_op(IR_OP_CROSS_ENTROPY, 2, a, ign4, NULL, NULL, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "target -1"), "cross_entropy with target -1 (ignore 4) should fail, got '%s'", err);
  free(got);
  /* backward vs finite differences of sum(dl * ce) */
  double *dl = rand_vec(R, 0.5, 1.5, dt);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < V; i++) {
      if (tg[r] == -1) { w[r * V + i] = 0; continue; }
      double f[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        double s = 0;
        for (int j = 0; j < V; j++) s += exp(lg[r * V + j] + (j == i ? (sgn ? -1e-6 : 1e-6) : 0));
        f[sgn] = log(s) - (lg[r * V + (int)tg[r]] + ((int)tg[r] == i ? (sgn ? -1e-6 : 1e-6) : 0));
      }
      w[r * V + i] = dl[r] * (f[0] - f[1]) / 2e-6;
    }
  Arg abw[3] = {{lt, lg}, {tt, tg}, {dlt, dl}};
  expect(IR_OP_CROSS_ENTROPY_BWD, 3, abw, ign, NULL, NULL, w, R * V, dt == IR_F32 ? 1e-4 : 1e-7, "cross_entropy_bwd", dt);
  free(lg);
  free(dl);
}

static void test_clip(IrDtype dt) {
  IrType t = scalar_ty(dt);
  double mx[1] = {1.0};
  double n1[1] = {4.0}, n2[1] = {0.25}, w1 = 1.0 / (4.0 + 1e-6), w2 = 1.0;
  Arg a1[1] = {{t, n1}}, a2[1] = {{t, n2}};
  expect(IR_OP_CLIP_COEF, 1, a1, NULL, mx, NULL, &w1, 1, tol_of(dt), "clip_coef large norm", dt);
  expect(IR_OP_CLIP_COEF, 1, a2, NULL, mx, NULL, &w2, 1, tol_of(dt), "clip_coef small norm", dt);
}

/* nonfinite: 1 for any inf or NaN, 0 for finite values up to the largest */
static void test_nonfinite(IrDtype dt) {
  IrType t = {dt, 1, {4}, {NULL}};
  double big = dt == IR_F32 ? 3.4028234663852886e38 : 1.7976931348623157e308;
  double fin[4] = {0.0, -big, big, 1e-45}, inf[4] = {1.0, INFINITY, 2.0, 3.0}, nan[4] = {1.0, 2.0, 3.0, NAN};
  double ninf[4] = {-INFINITY, 0, 0, 0}, zero = 0, one = 1;
  Arg a0[1] = {{t, fin}}, a1[1] = {{t, inf}}, a2[1] = {{t, nan}}, a3[1] = {{t, ninf}};
  expect(IR_OP_NONFINITE, 1, a0, NULL, NULL, NULL, &zero, 1, 0, "nonfinite of finite values", dt);
  expect(IR_OP_NONFINITE, 1, a1, NULL, NULL, NULL, &one, 1, 0, "nonfinite with +inf", dt);
  expect(IR_OP_NONFINITE, 1, a2, NULL, NULL, NULL, &one, 1, 0, "nonfinite with NaN", dt);
  expect(IR_OP_NONFINITE, 1, a3, NULL, NULL, NULL, &one, 1, 0, "nonfinite with -inf", dt);
}

/* topk_mask: the k largest of each row, ties to the lower index */
static void test_topk(IrDtype dt) {
  IrType t = {dt, 2, {2, 5}, {NULL}};
  double x[10] = {0.1, 0.7, -2.0, 0.7, 0.3,   4.0, 3.0, 2.0, 1.0, 0.0};
  double w2[10] = {0, 1, 0, 1, 0,   1, 1, 0, 0, 0};
  double w1[10] = {0, 1, 0, 0, 0,   1, 0, 0, 0, 0};    /* the tie goes to index 1 */
  Arg a[1] = {{t, x}};
  int64_t k2[1] = {2}, k1[1] = {1}, k5[1] = {5};
  double all[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  expect(IR_OP_TOPK_MASK, 1, a, k2, NULL, NULL, w2, 10, 0, "topk_mask k=2", dt);
  expect(IR_OP_TOPK_MASK, 1, a, k1, NULL, NULL, w1, 10, 0, "topk_mask k=1 tie", dt);
  expect(IR_OP_TOPK_MASK, 1, a, k5, NULL, NULL, all, 10, 0, "topk_mask k=D", dt);
}

/* capacity_mask: per column, the first cap nonzero rows stay 1 */
static void test_capacity(IrDtype dt) {
  IrType t = {dt, 3, {2, 2, 3}, {NULL}};          /* [batch, seq, experts]: 4 tokens in row order */
  double x[12] = {1, 1, 0,   1, 0, 1,   0, 1, 1,   1, 1, 0};
  double w1[12] = {1, 1, 0,   0, 0, 1,   0, 0, 0,   0, 0, 0};
  double w2[12] = {1, 1, 0,   1, 0, 1,   0, 1, 1,   0, 0, 0};
  double w0[12] = {0};
  Arg a[1] = {{t, x}};
  int64_t c1[1] = {1}, c2[1] = {2}, c0[1] = {0}, c9[1] = {9};
  expect(IR_OP_CAPACITY_MASK, 1, a, c1, NULL, NULL, w1, 12, 0, "capacity_mask cap=1", dt);
  expect(IR_OP_CAPACITY_MASK, 1, a, c2, NULL, NULL, w2, 12, 0, "capacity_mask cap=2", dt);
  expect(IR_OP_CAPACITY_MASK, 1, a, c0, NULL, NULL, w0, 12, 0, "capacity_mask cap=0", dt);
  expect(IR_OP_CAPACITY_MASK, 1, a, c9, NULL, NULL, x, 12, 0, "capacity_mask cap >= tokens", dt);
}

/* token dispatch (ops.def, docs/ir.md "Token dispatch"), worked by hand:
 * 3 tokens, 3 experts, routed = [[1,0,1],[0,0,1],[1,1,0]], so the token
 * layout is (t0,e0) (t2,e0) (t2,e1) (t0,e2) (t1,e2) and one spare row. */
static void test_moe(IrDtype dt) {
  IrType tr = {dt, 2, {3, 3}, {NULL}}, tx = {dt, 2, {3, 2}, {NULL}}, ty = {dt, 2, {6, 2}, {NULL}};
  IrType tc = {IR_I32, 2, {1, 3}, {NULL}}, tw = {dt, 3, {3, 2, 1}, {NULL}}, twt = {dt, 3, {3, 1, 2}, {NULL}};
  IrType tg = {dt, 2, {6, 1}, {NULL}};
  double r[9] = {1, 0, 1, 0, 0, 1, 1, 1, 0}, sc[9] = {0.5, 7, 2, 7, 7, 3, 1, 4, 7};   /* 7: never read */
  double x[6] = {1, 2, 3, 4, 5, 6}, y[12] = {1, 0, 0, 1, 1, 1, 2, 0, 0, 2, 9, 9}, cnt[3] = {2, 1, 2};
  double w[6] = {1, 2, 3, 4, 5, 6}, dy[6] = {1, 2, 3, 4, 5, 6};
  double want_cnt[3] = {2, 1, 2};
  double want_perm[12] = {0.5, 1, 5, 6, 20, 24, 2, 4, 9, 12, 0, 0};
  double want_unperm[6] = {4.5, 0, 0, 6, 4, 5};
  double want_gg[9] = {1, 0, 2, 0, 0, 8, 6, 11, 0};
  double want_gmm[6] = {1, 2, 7, 10, 12, 0};              /* row 5 is past the groups: 0, not y5 . w */
  double want_dw[6] = {1, 2, 3, 3, 8, 10};
  expect(IR_OP_MOE_COUNTS, 1, (Arg[]){{tr, r}}, NULL, NULL, NULL, want_cnt, 3, 0, "moe_counts", dt);
  int64_t rows6[1] = {6};
  expect(IR_OP_MOE_PERM, 3, (Arg[]){{tx, x}, {tr, r}, {tr, sc}}, rows6, NULL, NULL, want_perm, 12, 0, "moe_perm", dt);
  expect(IR_OP_MOE_UNPERM, 3, (Arg[]){{ty, y}, {tr, r}, {tr, sc}}, NULL, NULL, NULL, want_unperm, 6, 0, "moe_unperm", dt);
  expect(IR_OP_MOE_GATE_GRAD, 3, (Arg[]){{ty, y}, {tx, x}, {tr, r}}, NULL, NULL, NULL, want_gg, 9, 0, "moe_gate_grad", dt);
  int64_t tb0[1] = {0}, tb1[1] = {1};
  expect(IR_OP_GMM, 3, (Arg[]){{ty, y}, {tw, w}, {tc, cnt}}, tb0, NULL, NULL, want_gmm, 6, 0, "gmm", dt);
  expect(IR_OP_GMM, 3, (Arg[]){{ty, y}, {twt, w}, {tc, cnt}}, tb1, NULL, NULL, want_gmm, 6, 0, "gmm tb=1", dt);
  expect(IR_OP_GMM_DW, 3, (Arg[]){{ty, y}, {tg, dy}, {tc, cnt}}, NULL, NULL, NULL, want_dw, 6, 0, "gmm_dw", dt);
  /* too few rows for the routed slots: refused, not written past the end */
  int64_t rows4[1] = {4};
  IrType rt;
  double *got = run_op(IR_OP_MOE_PERM, 3, (Arg[]){{tx, x}, {tr, r}, {tr, sc}}, rows4, NULL, NULL, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "do not fit"), "moe_perm with 4 rows for 5 slots (%s): '%s'", ir_dtype_name(dt), err);
  free(got);
  /* the ep collectives on one rank (axis size 1): a copy, and the layouts
   * coincide (extra result rows are 0) */
  int64_t a2a[3] = {IR_AXIS_EP, 1, 0};
  expect(IR_OP_ALL_TO_ALL, 1, (Arg[]){{ty, y}}, a2a, NULL, NULL, y, 12, 0, "all_to_all on one rank", dt);
  IrType t7 = {dt, 2, {7, 2}, {NULL}};
  double want_v[14] = {1, 0, 0, 1, 1, 1, 2, 0, 0, 2, 0, 0, 0, 0};
  for (int rev = 0; rev < 2; rev++) {
    int64_t ia[2] = {IR_AXIS_EP, rev};
    expect(IR_OP_ALL_TO_ALL_V, 3, (Arg[]){{ty, y}, {tc, cnt}, {tc, cnt}}, ia, NULL, &t7, want_v, 14, 0,
           rev ? "all_to_all_v rev=1 on one rank" : "all_to_all_v on one rank", dt);
  }
}

/* ---- sharding: the ops of one rank, with coordinates set by hand (a
 * single process: axes of size > 1 have no group, so only local ops; the
 * collectives run under MPI in tests/rank) ---- */
#define TPB (1u << IR_AXIS_TP)
#define DPB (1u << IR_AXIS_DP)

/* A rank of a dp x tp mesh at coordinates (cd, ct). */
static RtRank mkrank(int dp, int tp, int cd, int ct) {
  RtRank r = rt_rank_single();
  r.mesh.dp = dp;
  r.mesh.tp = tp;
  r.coord[IR_AXIS_DP] = cd;
  r.coord[IR_AXIS_TP] = ct;
  return r;
}

/* Result split on dim rd by mask rm, operand 0 on dim id by im (-1: none). */
static OpShard shd(const RtRank *r, int rd, unsigned rm, int id, unsigned im) {
  OpShard sh;
  memset(&sh, 0, sizeof sh);
  sh.rank = r;
  if (rd >= 0) sh.res.split[rd] = (uint8_t)rm;
  if (id >= 0) sh.in[0].split[id] = (uint8_t)im;
  return sh;
}

/* Runs op sharded (sh) and compares to want[n]. */
static void expect_sh(IrOp op, int nin, const Arg *a, const int64_t *ia, const double *fa, const IrType *typed,
                      const OpShard *sh, const double *want, int64_t n, double tol, const char *msg, IrDtype dt) {
  IrType rt;
  double *got = run_op_sh(op, nin, a, ia, fa, typed, sh, &rt, err, sizeof err);
  CHECK(got != NULL, "%s (%s): %s", msg, ir_dtype_name(dt), err);
  if (!got) return;
  CHECK(ir_type_numel(&rt) == n, "%s: %lld results, expected %lld", msg, (long long)ir_type_numel(&rt), (long long)n);
  if (ir_type_numel(&rt) == n) cmp(got, want, n, tol, msg, dt);
  free(got);
}

/* shard_slice on dims 0..2 over tp and dp, any dtype; collectives over axes
 * of size 1 are copies (all_gather / reduce_scatter keep the dim) */
static void test_shard_local(IrDtype dt) {
  enum { A = 2, B = 8, C = 3, N = A * B * C };
  IrType t = TY(dt, A, B, C);
  double *x = rand_vec(N, -1, 1, dt), w[N];
  Arg a[1] = {{t, x}};
  for (int ct = 0; ct < 4; ct++) {   /* dim 1 over tp = 4: rows [2ct, 2ct+2) */
    RtRank r = mkrank(1, 4, 0, ct);
    OpShard sh = shd(&r, 1, TPB, -1, 0);
    int n = 0;
    for (int i = 0; i < A; i++)
      for (int j = 2 * ct; j < 2 * ct + 2; j++)
        for (int k = 0; k < C; k++) w[n++] = x[(i * B + j) * C + k];
    int64_t ia[2] = {IR_AXIS_TP, 1};
    expect_sh(IR_OP_SHARD_SLICE, 1, a, ia, NULL, NULL, &sh, w, n, 0, "shard_slice dim 1 tp", dt);
  }
  RtRank r = mkrank(2, 1, 1, 0);   /* dim 0 over dp = 2, coordinate 1 */
  OpShard sh = shd(&r, 0, DPB, -1, 0);
  int64_t ia0[2] = {IR_AXIS_DP, 0};
  expect_sh(IR_OP_SHARD_SLICE, 1, a, ia0, NULL, NULL, &sh, x + B * C, B * C, 0, "shard_slice dim 0 dp", dt);
  RtRank r3 = mkrank(1, 3, 0, 2);   /* last dim over tp = 3: column 2 */
  OpShard sh3 = shd(&r3, 2, TPB, -1, 0);
  for (int i = 0; i < A * B; i++) w[i] = x[i * C + 2];
  int64_t ia2[2] = {IR_AXIS_TP, 2};
  expect_sh(IR_OP_SHARD_SLICE, 1, a, ia2, NULL, NULL, &sh3, w, A * B, 0, "shard_slice dim 2 tp", dt);
  /* an i32 operand moves too (the result is cast to f64 by run_op) */
  IrType ti = TY(IR_I32, 4);
  double ids[4] = {7, -3, 11, 2};
  Arg ai[1] = {{ti, ids}};
  RtRank r2 = mkrank(1, 2, 0, 1);
  OpShard shi = shd(&r2, 0, TPB, -1, 0);
  int64_t iai[2] = {IR_AXIS_TP, 0};
  expect_sh(IR_OP_SHARD_SLICE, 1, ai, iai, NULL, NULL, &shi, ids + 2, 2, 0, "shard_slice i32", dt);
  /* axes of size 1: identity */
  int64_t ar[2] = {IR_AXIS_TP, 0}, ar1[2] = {IR_AXIS_TP, 1}, ag[2] = {IR_AXIS_CP, 1};
  expect(IR_OP_ALL_REDUCE, 1, a, ar, NULL, NULL, x, N, 0, "all_reduce size 1", dt);
  ar1[1] = 1;
  expect(IR_OP_ALL_REDUCE, 1, a, ar1, NULL, NULL, x, N, 0, "all_reduce max size 1", dt);
  expect(IR_OP_ALL_GATHER, 1, a, ag, NULL, NULL, x, N, 0, "all_gather size 1", dt);
  expect(IR_OP_REDUCE_SCATTER, 1, a, ag, NULL, NULL, x, N, 0, "reduce_scatter size 1", dt);
  /* a collective over an axis of size > 1 without a group: a clear error */
  RtRank rg = mkrank(1, 2, 0, 0);
  OpShard shg = shd(&rg, -1, 0, -1, 0);
  IrType rt;
  double *got = run_op_sh(IR_OP_ALL_REDUCE, 1, a, ar, NULL, NULL, &shg, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "no tp group"), "all_reduce without a group should fail, got '%s'", err);
  free(got);
  /* a row op over a split last dim would normalize each block alone */
  OpShard shl = shd(&rg, -1, 0, 2, TPB);
  got = run_op_sh(IR_OP_SOFTMAX, 1, a, NULL, NULL, NULL, &shl, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "split across ranks"), "softmax over a split last dim should fail, got '%s'", err);
  free(got);
  free(x);
}

/* take / onehot / pad_fill with the vocab dim split over tp = 2 (this
 * rank: coordinate 1, global columns [4, 8)) */
static void test_index_ops(IrDtype dt) {
  enum { R = 4, V = 4 };
  RtRank r = mkrank(1, 2, 0, 1);
  IrType xt = TY(dt, R, V), it = TY(IR_I32, R);
  double *x = rand_vec(R * V, -2, 2, dt), idx[R] = {5, 2, -100, 7}, w[R * V];
  Arg a[2] = {{xt, x}, {it, idx}};
  int64_t ign[1] = {-100};
  OpShard sh = shd(&r, -1, 0, 1, TPB);
  double wt[R] = {x[0 * V + 1], 0, 0, x[3 * V + 3]};
  expect_sh(IR_OP_TAKE, 2, a, ign, NULL, NULL, &sh, wt, R, 0, "take vocab-split", dt);
  double wu[R] = {0, x[1 * V + 2], 0, 0};   /* unsplit: only idx 2 is in [0, 4) ... */
  double idx_u[R] = {1, 2, -100, 3};
  Arg au[2] = {{xt, x}, {it, idx_u}};
  wu[0] = x[0 * V + 1];
  wu[3] = x[3 * V + 3];
  expect(IR_OP_TAKE, 2, au, ign, NULL, NULL, wu, R, 0, "take", dt);
  IrType rt;
  double *got = run_op_sh(IR_OP_TAKE, 2, a, ign, NULL, NULL, NULL, &rt, err, sizeof err);   /* 5 >= V */
  CHECK(!got && strstr(err, "index 5"), "take of index 5 in 4 columns should fail, got '%s'", err);
  free(got);
  /* onehot: result [R, V] split on its last dim */
  Arg ao[1] = {{it, idx}};
  OpShard sho = shd(&r, 1, TPB, -1, 0);
  memset(w, 0, sizeof w);
  w[0 * V + 1] = 1;
  w[3 * V + 3] = 1;
  expect_sh(IR_OP_ONEHOT, 1, ao, ign, NULL, &xt, &sho, w, R * V, 0, "onehot vocab-split", dt);
  memset(w, 0, sizeof w);
  w[0 * V + 1] = w[1 * V + 2] = w[3 * V + 3] = 1;
  Arg aou[1] = {{it, idx_u}};
  expect(IR_OP_ONEHOT, 1, aou, ign, NULL, &xt, w, R * V, 0, "onehot", dt);
  /* pad_fill: global columns >= 6 get -1e30; on this rank columns 2, 3 */
  int64_t pf[2] = {1, 6};
  double fill[1] = {-1e30};
  Arg ax[1] = {{xt, x}};
  for (int i = 0; i < R * V; i++) w[i] = (i % V) >= 2 ? -1e30 : x[i];
  if (dt == IR_F32) for (int i = 0; i < R * V; i++) w[i] = (float)w[i];
  expect_sh(IR_OP_PAD_FILL, 1, ax, pf, fill, NULL, &sho, w, R * V, 0, "pad_fill vocab-split", dt);
  int64_t pf3[2] = {1, 3};
  for (int i = 0; i < R * V; i++) w[i] = (i % V) >= 3 ? (dt == IR_F32 ? (float)-1e30 : -1e30) : x[i];
  expect(IR_OP_PAD_FILL, 1, ax, pf3, fill, NULL, w, R * V, 0, "pad_fill", dt);
  free(x);
}

/* A kernel whose result depends on where an element is: the sharded
 * local block must equal the same block of the unsharded result. */
static void block_matches(IrOp op, const IrType *full, const int64_t *ia, const double *fa, int dim,
                          const char *msg, IrDtype dt) {
  int64_t n = ir_type_numel(full);
  double *x = rand_vec(n, -1, 1, dt);
  Arg a[1] = {{*full, x}};
  IrType rt;
  double *y = run_op(op, 1, a, ia, fa, NULL, &rt, err, sizeof err);
  CHECK(y != NULL, "%s unsharded: %s", msg, err);
  int64_t outer, len, inner;
  outer = inner = 1;
  for (int d = 0; d < dim; d++) outer *= full->dim[d];
  for (int d = dim + 1; d < full->rank; d++) inner *= full->dim[d];
  len = full->dim[dim];
  for (int c = 0; y && c < 2; c++) {   /* tp = 2, both coordinates */
    RtRank r = mkrank(1, 2, 0, c);
    IrType lt = *full;
    lt.dim[dim] /= 2;
    int64_t L = len / 2, k = 0;
    double *xl = ts_xmalloc((size_t)(n / 2) * sizeof *xl), *wl = ts_xmalloc((size_t)(n / 2) * sizeof *wl);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t l = c * L; l < (c + 1) * L; l++)
        for (int64_t i = 0; i < inner; i++, k++) {
          xl[k] = x[(o * len + l) * inner + i];
          wl[k] = y[(o * len + l) * inner + i];
        }
    OpShard sh = shd(&r, -1, 0, -1, 0);
    sh.res.split[dim] = TPB;
    sh.in[0].split[dim] = TPB;
    Arg al[1] = {{lt, xl}};
    char m2[96];
    snprintf(m2, sizeof m2, "%s: block %d of dim %d", msg, c, dim);
    expect_sh(op, 1, al, ia, fa, NULL, &sh, wl, n / 2, 0, m2, dt);
    free(xl);
    free(wl);
  }
  free(y);
  free(x);
}

static void test_global_positions(IrDtype dt) {
  IrType t = TY(dt, 2, 6, 4);
  int64_t drop[1] = {3}, rope[2] = {1, 0}, none[1] = {0};
  double p[1] = {0.4}, base[1] = {10000}, fill[1] = {-1e9};
  for (int d = 0; d < 3; d++) block_matches(IR_OP_DROPOUT, &t, drop, p, d, "dropout", dt);
  block_matches(IR_OP_ROPE, &t, rope, base, 1, "rope", dt);
  IrType sq = TY(dt, 2, 6, 6);
  block_matches(IR_OP_CAUSAL_MASK, &sq, none, fill, 1, "causal_mask rows", dt);
  block_matches(IR_OP_CAUSAL_MASK, &sq, none, fill, 2, "causal_mask columns", dt);
}

/* embedding with a vocab-split table (rows [4, 8) of 8 on this rank) and
 * embedding_bwd with a vocab-split result */
static void test_embedding_split(IrDtype dt) {
  enum { V = 4, C = 3, N = 5 };
  RtRank r = mkrank(1, 2, 0, 1);
  IrType tt = TY(dt, V, C), it = TY(IR_I32, N);
  double *tab = rand_vec(V * C, -1, 1, dt), ids[N] = {5, 1, 7, 4, 5}, w[N * C];
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C; c++) w[i * C + c] = ids[i] >= 4 ? tab[((int)ids[i] - 4) * C + c] : 0;
  Arg a[2] = {{tt, tab}, {it, ids}};
  OpShard sh = shd(&r, -1, 0, 0, TPB);
  sh.res.partial = TPB;
  expect_sh(IR_OP_EMBEDDING, 2, a, NULL, NULL, NULL, &sh, w, N * C, 0, "embedding vocab-split", dt);
  double *dy = rand_vec(N * C, -1, 1, dt), g[V * C] = {0};
  for (int i = 0; i < N; i++)
    for (int c = 0; c < C && ids[i] >= 4; c++) g[((int)ids[i] - 4) * C + c] += dy[i * C + c];
  IrType dyt = TY(dt, N, C);
  Arg ab[2] = {{it, ids}, {dyt, dy}};
  OpShard shb = shd(&r, 0, TPB, -1, 0);
  expect_sh(IR_OP_EMBEDDING_BWD, 2, ab, NULL, NULL, &tt, &shb, g, V * C, tol_of(dt), "embedding_bwd vocab-split", dt);
  double big[N] = {5, 1, 8, 4, 5};   /* 8 is outside the global table of 8 rows */
  Arg abad[2] = {{tt, tab}, {it, big}};
  IrType rt;
  double *got = run_op_sh(IR_OP_EMBEDDING, 2, abad, NULL, NULL, NULL, &sh, &rt, err, sizeof err);
  CHECK(!got && strstr(err, "token id 8") && strstr(err, "[0, 8)"), "embedding id 8 of 8 should fail, got '%s'", err);
  free(got);
  free(tab);
  free(dy);
}

/* ---- ring attention steps (ops_ring.c; docs/ir.md "Ring attention") ----
 * A direct computation here, from global positions: queries at qpos
 * against keys at kpos, grouped-query heads, causal by global position. */
typedef struct {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  double scale;
  int causal;
  const double *q, *k, *v, *dout;   /* q, do [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D] */
  const int64_t *qpos, *kpos;
} RaCase;

static double ra_score(const RaCase *c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const double *q = c->q + ((b * c->Hq + h) * c->Tq + i) * c->D;
  const double *k = c->k + ((b * c->Hkv + h / (c->Hq / c->Hkv)) * c->Tk + j) * c->D;
  double s = 0;
  for (int64_t e = 0; e < c->D; e++) s += q[e] * k[e];
  return c->scale * s;
}
static int ra_sees(const RaCase *c, int64_t i, int64_t j) { return !c->causal || c->kpos[j] <= c->qpos[i]; }

/* The online-softmax state st [B, Hq, Tq, D + 2] after all keys, from the
 * zero state (rows that see no key stay 0). */
static void ra_state(const RaCase *c, double *st) {
  int64_t D = c->D, W = D + 2;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Tq; i++) {
        double *o = st + ((b * c->Hq + h) * c->Tq + i) * W, m = -INFINITY, l = 0;
        memset(o, 0, (size_t)W * sizeof *o);
        for (int64_t j = 0; j < c->Tk; j++)
          if (ra_sees(c, i, j)) m = fmax(m, ra_score(c, b, h, i, j));
        if (m == -INFINITY) continue;
        for (int64_t j = 0; j < c->Tk; j++) {
          if (!ra_sees(c, i, j)) continue;
          double p = exp(ra_score(c, b, h, i, j) - m);
          const double *v = c->v + ((b * c->Hkv + h / (c->Hq / c->Hkv)) * c->Tk + j) * D;
          for (int64_t e = 0; e < D; e++) o[e] += p * v[e];
          l += p;
        }
        o[D] = m;
        o[D + 1] = l;
      }
}

/* Adds the gradients: dq [B, Hq, Tq, D], dk, dv [B, Hkv, Tk, D] (any may
 * be NULL) for lse and drow [B, Hq, Tq]. */
static void ra_grads(const RaCase *c, const double *lse, const double *drow, double *dq, double *dk, double *dv) {
  int64_t D = c->D;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->Hq; h++)
      for (int64_t i = 0; i < c->Tq; i++) {
        int64_t r = (b * c->Hq + h) * c->Tq + i, hk = b * c->Hkv + h / (c->Hq / c->Hkv);
        const double *q = c->q + r * D, *g = c->dout + r * D;
        for (int64_t j = 0; j < c->Tk; j++) {
          if (!ra_sees(c, i, j)) continue;
          const double *k = c->k + (hk * c->Tk + j) * D, *v = c->v + (hk * c->Tk + j) * D;
          double p = exp(ra_score(c, b, h, i, j) - lse[r]), dp = 0;
          for (int64_t e = 0; e < D; e++) dp += g[e] * v[e];
          double ds = p * (dp - drow[r]);
          for (int64_t e = 0; e < D; e++) {
            if (dq) dq[r * D + e] += c->scale * ds * k[e];
            if (dk) dk[(hk * c->Tk + j) * D + e] += c->scale * ds * q[e];
            if (dv) dv[(hk * c->Tk + j) * D + e] += p * g[e];
          }
        }
      }
}

/* st -> o and lse as attn_finish / attn_lse define them (rows [B*Hq*Tq]). */
static void ra_finish(const double *st, int64_t rows, int64_t D, double *o, double *lse) {
  for (int64_t r = 0; r < rows; r++) {
    const double *s = st + r * (D + 2);
    for (int64_t e = 0; e < D && o; e++) o[r * D + e] = s[D + 1] > 0 ? s[e] / s[D + 1] : 0;
    if (lse) lse[r] = s[D + 1] > 0 ? s[D] + log(s[D + 1]) : 0;
  }
}

/* drow = rowsum(do * o), rounded to dt like an operand. */
static double *ra_drow(const double *dout, const double *o, int64_t rows, int64_t D, IrDtype dt) {
  double *y = ts_xmalloc((size_t)rows * sizeof *y);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t e = 0; e < D; e++) s += dout[r * D + e] * o[r * D + e];
    y[r] = dt == IR_F32 ? (float)s : s;
  }
  return y;
}

/* Rows [t0, t1) of dim 2 of x [outer, T, D]. */
static double *ra_rows(const double *x, int64_t outer, int64_t T, int64_t D, int64_t t0, int64_t t1) {
  double *y = ts_xmalloc((size_t)(outer * (t1 - t0) * D) * sizeof *y);
  for (int64_t o = 0; o < outer; o++)
    memcpy(y + o * (t1 - t0) * D, x + (o * T + t0) * D, (size_t)((t1 - t0) * D) * sizeof *y);
  return y;
}

/* Largest |got - want| / max(1, |want|) seen per dtype (RT_VERBOSE=1
 * prints them), and the check against tol. */
static double g_ra_max[NT][3];   /* vs the fused kernels, vs the direct computation, two-block fold */
static void ra_cmp(const double *got, const double *want, int64_t n, double tol, int kind, const char *msg,
                   IrDtype dt) {
  CHECK(got != NULL, "%s (%s): %s", msg, ir_dtype_name(dt), err);
  if (!got) return;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(got[i] - want[i]) / (fabs(want[i]) > 1 ? fabs(want[i]) : 1);
    worst = d > worst || isnan(d) ? d : worst;
  }
  double *mx = &g_ra_max[dt == IR_F32 ? 0 : 1][kind];
  *mx = worst > *mx ? worst : *mx;
  CHECK(worst <= tol, "%s (%s): max relative difference %.3g > %.3g", msg, ir_dtype_name(dt), worst, tol);
}

/* One op, its result (NULL on failure, message in err). */
static double *ra_run(IrOp op, int nin, const Arg *a, const int64_t *ia, double scale, const OpShard *sh) {
  IrType rt;
  double fa[1] = {scale};
  return run_op_sh(op, nin, a, ia, fa, NULL, sh, &rt, err, sizeof err);
}

/* C = 1: the five step ops against the fused attention / attention_bwd
 * kernels (one attn_acc over all keys from the zero state, src = 0),
 * causal or not, grouped-query heads; T > one 64-row tile, so whole tiles
 * are masked; accumulation into nonzero dq / dk; and a two-block fold. */
static void ring_vs_fused(IrDtype dt, int causal) {
  enum { B = 2, HQ = 4, HKV = 2, T = 70, D = 6, RQ = B * HQ * T, RK = B * HKV * T };
  double scale = 0.45, tol = dt == IR_F32 ? 1e-4 : 1e-12, dtol = dt == IR_F32 ? 1e-4 : tol_of(dt);
  IrType tq = TY(dt, B, HQ, T, D), tk = TY(dt, B, HKV, T, D), ts = TY(dt, B, HQ, T, D + 2), tr = TY(dt, B, HQ, T);
  double *q = rand_vec(RQ * D, -1, 1, dt), *k = rand_vec(RK * D, -1, 1, dt), *v = rand_vec(RK * D, -1, 1, dt);
  double *g = rand_vec(RQ * D, -1, 1, dt), *zst = ts_xcalloc(RQ * (D + 2), sizeof *zst);
  double *zq = ts_xcalloc(RQ * D, sizeof *zq), *zk = ts_xcalloc(RK * D, sizeof *zk);
  int64_t pos[T];
  for (int i = 0; i < T; i++) pos[i] = i;
  RaCase c = {B, HQ, HKV, T, T, D, scale, causal, q, k, v, g, pos, pos};
  char msg[96];
  int64_t ia[4] = {causal, 0, 0, 0};   /* attention: causal window alibi; attn_acc: causal src window alibi */
  double *st = ra_run(IR_OP_ATTN_ACC, 4, (Arg[]){{tq, q}, {tk, k}, {tk, v}, {ts, zst}}, ia, scale, NULL);
  double *ref_st = ts_xmalloc(RQ * (D + 2) * sizeof *ref_st), ref_lse[RQ];
  ra_state(&c, ref_st);
  ra_finish(ref_st, RQ, D, NULL, ref_lse);
  snprintf(msg, sizeof msg, "attn_acc causal=%d vs direct", causal);
  ra_cmp(st, ref_st, RQ * (D + 2), dtol, 1, msg, dt);
  double *o_ref = ra_run(IR_OP_ATTENTION, 3, (Arg[]){{tq, q}, {tk, k}, {tk, v}}, ia, scale, NULL);
  CHECK(o_ref != NULL, "attention: %s", err);
  if (st && o_ref) {
    double *o = ra_run(IR_OP_ATTN_FINISH, 1, (Arg[]){{ts, st}}, NULL, 0, NULL);
    snprintf(msg, sizeof msg, "attn_finish(attn_acc) causal=%d vs attention", causal);
    ra_cmp(o, o_ref, RQ * D, tol, 0, msg, dt);
    double *lse = ra_run(IR_OP_ATTN_LSE, 1, (Arg[]){{ts, st}}, NULL, 0, NULL);
    snprintf(msg, sizeof msg, "attn_lse causal=%d vs direct", causal);
    ra_cmp(lse, ref_lse, RQ, dtol, 1, msg, dt);
    double *drow = ra_drow(g, o_ref, RQ, D, dt);
    /* the three gradients: from zero, and added to a nonzero accumulator */
    for (int part = 0; part < 3 && lse; part++) {
      /* fused (causal, part, window); steps at src 0 (causal, src[, part], window) */
      int64_t fia[5] = {causal, part, 0, 0, 0}, sia[5] = {causal, 0, part, 0, 0}, sq[4] = {causal, 0, 0, 0};
      int64_t n = part ? RK * D : RQ * D;
      double *want = ra_run(IR_OP_ATTENTION_BWD, 5, (Arg[]){{tq, q}, {tk, k}, {tk, v}, {tq, o_ref}, {tq, g}}, fia,
                            scale, NULL);
      CHECK(want != NULL, "attention_bwd part %d: %s", part, err);
      IrOp op = part ? IR_OP_ATTN_BWD_KV : IR_OP_ATTN_BWD_Q;
      const IrType *ta = part ? &tk : &tq;
      Arg a[7] = {{tq, q}, {tk, k}, {tk, v}, {tq, g}, {tr, lse}, {tr, drow}, {*ta, part ? zk : zq}};
      double *got = ra_run(op, 7, a, part ? sia : sq, scale, NULL);
      snprintf(msg, sizeof msg, "%s part=%d causal=%d vs attention_bwd", ir_ops[op].name, part, causal);
      if (want) ra_cmp(got, want, n, tol, 0, msg, dt);
      double *acc = rand_vec(n, -1, 1, dt), *w2 = ts_xmalloc((size_t)n * sizeof *w2);
      for (int64_t i = 0; want && i < n; i++) w2[i] = want[i] + acc[i];
      a[6].v = acc;
      double *got2 = ra_run(op, 7, a, part ? sia : sq, scale, NULL);
      snprintf(msg, sizeof msg, "%s part=%d causal=%d into a nonzero accumulator", ir_ops[op].name, part, causal);
      if (want) ra_cmp(got2, w2, n, tol, 0, msg, dt);
      free(got);
      free(got2);
      free(acc);
      free(w2);
      free(want);
    }
    free(drow);
    free(o);
    free(lse);
  }
  if (!causal && o_ref) {   /* two blocks: keys [0, 33) then [33, 70) */
    IrType th = TY(dt, B, HKV, 33, D), th2 = TY(dt, B, HKV, T - 33, D);
    double *k1 = ra_rows(k, B * HKV, T, D, 0, 33), *v1 = ra_rows(v, B * HKV, T, D, 0, 33);
    double *k2 = ra_rows(k, B * HKV, T, D, 33, T), *v2 = ra_rows(v, B * HKV, T, D, 33, T);
    double *s1 = ra_run(IR_OP_ATTN_ACC, 4, (Arg[]){{tq, q}, {th, k1}, {th, v1}, {ts, zst}}, ia, scale, NULL);
    CHECK(s1 != NULL, "attn_acc first block: %s", err);
    double *s2 = s1 ? ra_run(IR_OP_ATTN_ACC, 4, (Arg[]){{tq, q}, {th2, k2}, {th2, v2}, {ts, s1}}, ia, scale, NULL) : NULL;
    CHECK(s2 != NULL, "attn_acc second block: %s", err);
    double *o = s2 ? ra_run(IR_OP_ATTN_FINISH, 1, (Arg[]){{ts, s2}}, NULL, 0, NULL) : NULL;
    ra_cmp(o, o_ref, RQ * D, tol, 2, "attn_acc in two blocks then attn_finish vs attention", dt);
    free(o);
    free(s1);
    free(s2);
    free(k1);
    free(v1);
    free(k2);
    free(v2);
  }
  free(o_ref);
  free(st);
  free(ref_st);
  free(q);
  free(k);
  free(v);
  free(g);
  free(zst);
  free(zq);
  free(zk);
}

#define CPB (1u << IR_AXIS_CP)
/* Zigzag position of local index i on cp coordinate c of S (chunks of h:
 * the rank holds chunks c and 2S-1-c of 2S; runtime/cpu/cp_layout.c). */
static int64_t zz(int S, int c, int64_t h, int64_t i) { return i < h ? c * h + i : (2 * S - 1 - c) * h + (i - h); }

/* A cp mesh of S set by hand: this rank (coordinate c) holds its zigzag
 * query block; k / v are split over cp on dim 2, and the step `src` holds
 * the block of coordinate c - src (wrapping).  Against the direct
 * computation over the global positions of the rank's own block and that
 * one: attn_acc over both (src 0 then src) then attn_finish / attn_lse; a
 * row that sees none of the second block keeps its state bit for bit
 * (`hidden`: the case has such rows); dq summed over both steps; dk / dv of
 * the second block from this rank's queries.  (With S = 2, c - src and
 * c + src coincide; S = 4 tells them apart.) */
static void ring_cp(IrDtype dt, int S, int c, int src, int hidden) {
  enum { B = 1, HQ = 4, HKV = 2, H = 5, L = 2 * H, D = 3, RQ = B * HQ * L, RK = B * HKV * L };
  double scale = 0.6, tol = dt == IR_F32 ? 1e-4 : tol_of(dt);
  RtRank r = rt_rank_single();
  r.mesh.cp = S;
  r.coord[IR_AXIS_CP] = c;
  OpShard sh;
  memset(&sh, 0, sizeof sh);
  sh.rank = &r;
  sh.res.split[2] = sh.in[0].split[2] = sh.in[1].split[2] = sh.in[2].split[2] = sh.in[3].split[2] = CPB;
  IrType tq = TY(dt, B, HQ, L, D), tk = TY(dt, B, HKV, L, D), ts = TY(dt, B, HQ, L, D + 2), tr = TY(dt, B, HQ, L);
  double *q = rand_vec(RQ * D, -1, 1, dt), *g = rand_vec(RQ * D, -1, 1, dt), *zst = ts_xcalloc(RQ * (D + 2), 8);
  double *kb[2], *vb[2];   /* [0]: this rank's block, [1]: coordinate c - src's */
  int owner = ((c - src) % S + S) % S;
  for (int s = 0; s < 2; s++) { kb[s] = rand_vec(RK * D, -1, 1, dt); vb[s] = rand_vec(RK * D, -1, 1, dt); }
  /* the direct computation over both blocks: keys concatenated per kv head */
  double *kall = ts_xmalloc(2 * RK * D * sizeof *kall), *vall = ts_xmalloc(2 * RK * D * sizeof *vall);
  int64_t qpos[L], kpos[2 * L];
  for (int64_t i = 0; i < L; i++) {
    qpos[i] = zz(S, c, H, i);
    kpos[i] = zz(S, c, H, i);
    kpos[L + i] = zz(S, owner, H, i);
  }
  for (int64_t hk = 0; hk < B * HKV; hk++)
    for (int s = 0; s < 2; s++) {
      memcpy(kall + (hk * 2 * L + s * L) * D, kb[s] + hk * L * D, L * D * sizeof *kall);
      memcpy(vall + (hk * 2 * L + s * L) * D, vb[s] + hk * L * D, L * D * sizeof *vall);
    }
  RaCase all = {B, HQ, HKV, L, 2 * L, D, scale, 1, q, kall, vall, g, qpos, kpos};
  RaCase other = {B, HQ, HKV, L, L, D, scale, 1, q, kb[1], vb[1], g, qpos, kpos + L};
  double *st_all = ts_xmalloc(RQ * (D + 2) * sizeof *st_all), o_all[RQ * D], lse_all[RQ];
  ra_state(&all, st_all);
  ra_finish(st_all, RQ, D, o_all, lse_all);
  char msg[96];
  /* the forward: own block (src 0), then the other (src) */
  double *st[2] = {NULL, NULL};
  for (int s = 0; s < 2; s++) {
    int64_t ia[4] = {1, s ? src : 0, 0, 0};
    Arg a[4] = {{tq, q}, {tk, kb[s]}, {tk, vb[s]}, {ts, s ? st[0] : zst}};
    st[s] = s && !st[0] ? NULL : ra_run(IR_OP_ATTN_ACC, 4, a, ia, scale, &sh);
    CHECK(st[s] != NULL, "attn_acc cp %d coord %d src %d (%s): %s", S, c, (int)ia[1], ir_dtype_name(dt), err);
  }
  if (st[1]) {
    /* rows that see no key of the other block keep their state bit for bit */
    int kept = 1, some = 0;
    for (int64_t row = 0; row < RQ; row++) {
      int64_t i = row % L, sees = 0;
      for (int64_t j = 0; j < L; j++) sees |= kpos[L + j] <= qpos[i];
      if (sees) continue;
      some = 1;
      kept &= memcmp(st[1] + row * (D + 2), st[0] + row * (D + 2), (D + 2) * sizeof(double)) == 0;
    }
    CHECK(kept, "cp %d coord %d: a row that sees none of block %d changed", S, c, owner);
    CHECK(some == hidden, "cp %d coord %d: rows hiding block %d: %d, expected %d", S, c, owner, some, hidden);
    double *o = ra_run(IR_OP_ATTN_FINISH, 1, (Arg[]){{ts, st[1]}}, NULL, 0, &sh);
    snprintf(msg, sizeof msg, "cp %d coord %d: attn_finish after src 0, %d vs direct", S, c, src);
    ra_cmp(o, o_all, RQ * D, tol, 1, msg, dt);
    double *lse = ra_run(IR_OP_ATTN_LSE, 1, (Arg[]){{ts, st[1]}}, NULL, 0, &sh);
    snprintf(msg, sizeof msg, "cp %d coord %d: attn_lse after src 0, %d vs direct", S, c, src);
    ra_cmp(lse, lse_all, RQ, tol, 1, msg, dt);
    free(o);
    free(lse);
  }
  {   /* from a state with l = 0 and garbage in m and acc: ignored where the block is seen, kept where not */
    double *gst = rand_vec(RQ * (D + 2), -3, 3, dt), *want = ts_xmalloc(RQ * (D + 2) * sizeof *want);
    ra_state(&other, want);
    for (int64_t row = 0; row < RQ; row++) {
      int sees = 0;
      for (int64_t j = 0; j < L; j++) sees |= kpos[L + j] <= qpos[row % L];
      gst[row * (D + 2) + D + 1] = 0;
      if (!sees) memcpy(want + row * (D + 2), gst + row * (D + 2), (D + 2) * sizeof *want);
    }
    int64_t ia[4] = {1, src, 0, 0};
    double *got = ra_run(IR_OP_ATTN_ACC, 4, (Arg[]){{tq, q}, {tk, kb[1]}, {tk, vb[1]}, {ts, gst}}, ia, scale, &sh);
    snprintf(msg, sizeof msg, "cp %d coord %d: attn_acc src %d from a state with l = 0 vs direct", S, c, src);
    ra_cmp(got, want, RQ * (D + 2), tol, 1, msg, dt);
    free(got);
    free(want);
    free(gst);
  }
  /* the backward, with the exact lse and drow rounded to dt */
  double *lse = ts_xmalloc(RQ * sizeof *lse), *drow = ra_drow(g, o_all, RQ, D, dt);
  for (int64_t i = 0; i < RQ; i++) lse[i] = dt == IR_F32 ? (float)lse_all[i] : lse_all[i];
  double *dq_ref = ts_xcalloc(RQ * D, sizeof *dq_ref), *dk_ref = ts_xcalloc(RK * D, 8), *dv_ref = ts_xcalloc(RK * D, 8);
  ra_grads(&all, lse, drow, dq_ref, NULL, NULL);
  ra_grads(&other, lse, drow, NULL, dk_ref, dv_ref);
  double *dq = ts_xcalloc(RQ * D, sizeof *dq);
  for (int s = 0; s < 2 && dq; s++) {
    int64_t ia[4] = {1, s ? src : 0, 0, 0};
    Arg a[7] = {{tq, q}, {tk, kb[s]}, {tk, vb[s]}, {tq, g}, {tr, lse}, {tr, drow}, {tq, dq}};
    double *nx = ra_run(IR_OP_ATTN_BWD_Q, 7, a, ia, scale, &sh);
    CHECK(nx != NULL, "attn_bwd_q cp %d coord %d src %d: %s", S, c, (int)ia[1], err);
    free(dq);
    dq = nx;
  }
  snprintf(msg, sizeof msg, "cp %d coord %d: attn_bwd_q over src 0, %d vs direct", S, c, src);
  ra_cmp(dq, dq_ref, RQ * D, tol, 1, msg, dt);
  double *zk = ts_xcalloc(RK * D, sizeof *zk);
  for (int part = 1; part <= 2; part++) {
    int64_t ia[5] = {1, src, part, 0, 0};
    Arg a[7] = {{tq, q}, {tk, kb[1]}, {tk, vb[1]}, {tq, g}, {tr, lse}, {tr, drow}, {tk, zk}};
    double *got = ra_run(IR_OP_ATTN_BWD_KV, 7, a, ia, scale, &sh);
    snprintf(msg, sizeof msg, "cp %d coord %d: attn_bwd_kv part %d src %d vs direct", S, c, part, src);
    ra_cmp(got, part == 1 ? dk_ref : dv_ref, RK * D, tol, 1, msg, dt);
    free(got);
  }
  free(zk);
  free(dq);
  free(dq_ref);
  free(dk_ref);
  free(dv_ref);
  free(lse);
  free(drow);
  free(st[0]);
  free(st[1]);
  free(st_all);
  free(kall);
  free(vall);
  for (int s = 0; s < 2; s++) { free(kb[s]); free(vb[s]); }
  free(q);
  free(g);
  free(zst);
}

static void test_ring_attn(IrDtype dt) {
  for (int causal = 0; causal < 2; causal++) ring_vs_fused(dt, causal);
  ring_cp(dt, 2, 0, 1, 1);   /* chunk 0's queries see none of chunks 1, 2 */
  ring_cp(dt, 2, 1, 1, 0);
  ring_cp(dt, 4, 1, 1, 0);   /* chunks 1, 6 against 0, 7 */
  ring_cp(dt, 4, 0, 3, 1);   /* wraps: block of coordinate 1 (chunks 1, 6) against 0, 7 */
  if (getenv("RT_VERBOSE")) {
    const double *m = g_ra_max[dt == IR_F32 ? 0 : 1];
    printf("ring attention (%s): max relative difference vs fused %.3g, vs direct %.3g, two-block fold %.3g\n",
           ir_dtype_name(dt), m[0], m[1], m[2]);
  }
}

/* ---- the worker pool and the threaded kernels ---- */
static void mark_range(void *c, int64_t lo, int64_t hi) {
  unsigned char *seen = c;
  for (int64_t i = lo; i < hi; i++) seen[i]++;
}

static void test_par_pool(void) {
  static const int thr[] = {1, 2, 3, 7};
  static const int64_t ns[] = {0, 1, 5, 64, 1000, 100003};
  for (size_t t = 0; t < sizeof thr / sizeof *thr; t++) {
    rt_par_set_threads(thr[t]);
    CHECK(rt_par_threads() == thr[t], "pool has %d threads, set %d", rt_par_threads(), thr[t]);
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
      for (int64_t grain = 1; grain <= 4096; grain *= 64) {
        int64_t n = ns[a];
        unsigned char *seen = ts_xcalloc((size_t)(n ? n : 1), 1);
        rt_par_for(n, grain, mark_range, seen);
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
          if (seen[i] != 1) bad = i;
        CHECK(bad < 0, "rt_par_for(n=%lld, grain=%lld) on %d threads ran item %lld %d times", (long long)n,
              (long long)grain, thr[t], (long long)bad, bad >= 0 ? seen[bad] : 0);
        free(seen);
      }
  }
  /* big copies and fills */
  size_t nb = RT_PAR_MEM_MIN + 4099;   /* large enough to split */
  unsigned char *a = ts_xmalloc(nb), *b = ts_xmalloc(nb);
  for (size_t i = 0; i < nb; i++) a[i] = (unsigned char)(i * 31 + 7);
  rt_par_memcpy(b, a, nb);
  CHECK(memcmp(a, b, nb) == 0, "rt_par_memcpy of %zu bytes differs", nb);
  rt_par_memset(b, 0x5a, nb - 3);
  int ok = b[nb - 3] == a[nb - 3];
  for (size_t i = 0; i < nb - 3 && ok; i++) ok = b[i] == 0x5a;
  CHECK(ok, "rt_par_memset of %zu bytes wrong", nb - 3);
  free(a);
  free(b);
  rt_par_set_threads(0);
}

/* Runs op on 1 and on 3 threads: the results must be identical (kernels
 * split work only where the order of every sum stays the same). */
/* y1 and y2 (results of type r, either NULL after a failed run) are the
 * same bits; frees both.  how1 / how2 say how each was computed. */
static void same_bits(double *y1, double *y2, const IrType *r, const char *msg, IrDtype dt, const char *how1,
                      const char *how2) {
  if (y1 && y2) {
    int64_t n = ir_type_numel(r), bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
      if (memcmp(&y1[i], &y2[i], sizeof y1[i]) != 0) bad = i;
    CHECK(bad < 0, "%s (%s): element %lld is %.17g %s, %.17g %s", msg, ir_dtype_name(dt), (long long)bad,
          bad >= 0 ? y1[bad] : 0.0, how1, bad >= 0 ? y2[bad] : 0.0, how2);
  }
  free(y1);
  free(y2);
}

static void same_on_threads(IrOp op, int nin, const Arg *a, const int64_t *ia, const double *fa,
                            const IrType *typed, const char *msg, IrDtype dt) {
  IrType r1, r3;
  rt_par_set_threads(1);
  double *y1 = run_op(op, nin, a, ia, fa, typed, &r1, err, sizeof err);
  CHECK(y1 != NULL, "%s (%s) on 1 thread: %s", msg, ir_dtype_name(dt), err);
  rt_par_set_threads(3);
  double *y3 = run_op(op, nin, a, ia, fa, typed, &r3, err, sizeof err);
  CHECK(y3 != NULL, "%s (%s) on 3 threads: %s", msg, ir_dtype_name(dt), err);
  rt_par_set_threads(0);
  same_bits(y1, y3, &r1, msg, dt, "on 1 thread", "on 3");
}

/* Every threaded kernel at a size its ranges split (> 2 x 32k elements). */
static void test_threads_same(IrDtype dt) {
  enum { B = 3, R = 67, D = 701, N = B * R * D };
  IrType t = TY(dt, B, R, D), rows = TY(dt, B, R), it = TY(IR_I32, B, R);
  double *x = rand_vec(N, -3, 3, dt), *y = rand_vec(N, -1, 1, dt), *dl = rand_vec(B * R, 0.5, 1.5, dt);
  double *tg = ts_xmalloc(B * R * sizeof *tg), fa[2] = {1e-5, 0};
  for (int i = 0; i < B * R; i++) tg[i] = i % 11 == 3 ? -1 : (i * 37) % D;
  Arg a1[1] = {{t, x}}, a2[2] = {{t, x}, {t, y}}, ce[2] = {{t, x}, {it, tg}}, ceb[3] = {{t, x}, {it, tg}, {rows, dl}};
  int64_t ign[1] = {-1}, drop[1] = {5}, rope[2] = {1, 0};
  same_on_threads(IR_OP_ADD, 2, a2, NULL, NULL, NULL, "add", dt);
  same_on_threads(IR_OP_GELU_TANH, 1, a1, NULL, NULL, NULL, "gelu_tanh", dt);
  same_on_threads(IR_OP_GELU_TANH_BWD, 2, a2, NULL, NULL, NULL, "gelu_tanh_bwd", dt);
  same_on_threads(IR_OP_SOFTMAX, 1, a1, NULL, NULL, NULL, "softmax", dt);
  same_on_threads(IR_OP_SOFTMAX_BWD, 2, a2, NULL, NULL, NULL, "softmax_bwd", dt);
  same_on_threads(IR_OP_LOG_SOFTMAX, 1, a1, NULL, NULL, NULL, "log_softmax", dt);
  same_on_threads(IR_OP_LOG_SOFTMAX_BWD, 2, a2, NULL, NULL, NULL, "log_softmax_bwd", dt);
  same_on_threads(IR_OP_LAYERNORM, 1, a1, NULL, fa, NULL, "layernorm", dt);
  same_on_threads(IR_OP_LAYERNORM_BWD, 2, a2, NULL, fa, NULL, "layernorm_bwd", dt);
  same_on_threads(IR_OP_RMSNORM, 1, a1, NULL, fa, NULL, "rmsnorm", dt);
  same_on_threads(IR_OP_RMSNORM_BWD, 2, a2, NULL, fa, NULL, "rmsnorm_bwd", dt);
  same_on_threads(IR_OP_CROSS_ENTROPY, 2, ce, ign, NULL, NULL, "cross_entropy", dt);
  same_on_threads(IR_OP_CROSS_ENTROPY_BWD, 3, ceb, ign, NULL, NULL, "cross_entropy_bwd", dt);
  same_on_threads(IR_OP_SUMSQ, 1, a1, NULL, NULL, NULL, "sumsq", dt);
  double p[1] = {0.25}, fill[1] = {-1e9}, base[1] = {10000.0};
  same_on_threads(IR_OP_DROPOUT, 1, a1, drop, p, NULL, "dropout", dt);
  same_on_threads(IR_OP_CAUSAL_MASK, 1, a1, NULL, fill, NULL, "causal_mask", dt);
  IrType te = TY(dt, B, R, 7, 100);   /* rope needs an even last dim (and <= N elements) */
  Arg ar[1] = {{te, x}};
  same_on_threads(IR_OP_ROPE, 1, ar, rope, base, NULL, "rope", dt);
  IrType tc = TY(dt, D);
  same_on_threads(IR_OP_SUM_TO, 1, a1, NULL, NULL, &tc, "sum_to [D]", dt);
  IrType tab = TY(dt, 97, D);
  double *ids = ts_xmalloc(B * R * sizeof *ids);
  for (int i = 0; i < B * R; i++) ids[i] = (i * 13) % 97;
  Arg eb[2] = {{it, ids}, {t, y}};
  same_on_threads(IR_OP_EMBEDDING_BWD, 2, eb, NULL, NULL, &tab, "embedding_bwd", dt);
  /* batched matmul with small GEMMs: one per thread */
  IrType ma = TY(dt, 5, 4, 33, 40), mb = TY(dt, 5, 4, 40, 29);
  Arg am[2] = {{ma, x}, {mb, y}};
  same_on_threads(IR_OP_MATMUL, 2, am, (int64_t[]){0, 0}, NULL, NULL, "batched matmul", dt);
  /* ring attention steps: threads over (batch, head); the state's l column
   * is random, so some rows start fresh and some fold into a running state */
  IrType aq = TY(dt, 2, 4, 70, 6), ak = TY(dt, 2, 2, 70, 6), ast = TY(dt, 2, 4, 70, 8), arow = TY(dt, 2, 4, 70);
  double sc[1] = {0.4};
  Arg aacc[4] = {{aq, x}, {ak, y}, {ak, x + 5000}, {ast, y + 5000}};
  Arg abw[7] = {{aq, x}, {ak, y}, {ak, x + 5000}, {aq, y + 5000}, {arow, x + 20000}, {arow, y + 9000}, {ak, x + 9000}};
  same_on_threads(IR_OP_ATTN_ACC, 4, aacc, (int64_t[]){1, 0, 0, 0}, sc, NULL, "attn_acc", dt);
  same_on_threads(IR_OP_ATTN_BWD_KV, 7, abw, (int64_t[]){1, 0, 1, 0, 0}, sc, NULL, "attn_bwd_kv", dt);
  abw[6].t = aq;
  same_on_threads(IR_OP_ATTN_BWD_Q, 7, abw, (int64_t[]){1, 0, 0, 0}, sc, NULL, "attn_bwd_q", dt);
  free(x);
  free(y);
  free(dl);
  free(tg);
  free(ids);
}

/* op on the baseline build of the attention tile loops and on the AVX2 one
 * (rt_attn_set_isa): the same bits, or the machine would change results.
 * Where the CPU has no AVX2 both runs take the baseline and agree
 * trivially; every x86-64 machine this project runs on has it. */
static void same_on_isas(IrOp op, int nin, const Arg *a, const int64_t *ia, const double *fa, const char *msg,
                         IrDtype dt) {
  IrType r1, r2;
  rt_attn_set_isa(1);
  double *y1 = run_op(op, nin, a, ia, fa, NULL, &r1, err, sizeof err);
  CHECK(y1 != NULL, "%s (%s), baseline ISA: %s", msg, ir_dtype_name(dt), err);
  int isa = rt_attn_set_isa(2);
  double *y2 = run_op(op, nin, a, ia, fa, NULL, &r2, err, sizeof err);
  CHECK(y2 != NULL, "%s (%s), ISA %d: %s", msg, ir_dtype_name(dt), isa, err);
  rt_attn_set_isa(0);
  same_bits(y1, y2, &r1, msg, dt, "on the baseline ISA", "with AVX2");
}

/* Every attention kernel, causal and not, at sizes with several query and
 * key tiles, a tail, grouped kv heads and a one-tile-per-row backward. */
static void test_isas_same(IrDtype dt) {
  for (int big = 0; big < 2; big++) {
    int64_t T = big ? 150 : 70, D = big ? 16 : 6, B = 2, HQ = 4, HKV = 2;
    IrType aq = TY(dt, B, HQ, T, D), ak = TY(dt, B, HKV, T, D), ast = TY(dt, B, HQ, T, D + 2), arow = TY(dt, B, HQ, T);
    int64_t nq = B * HQ * T * D, nk = B * HKV * T * D;
    double *q = rand_vec(nq, -2, 2, dt), *k = rand_vec(nk, -2, 2, dt), *v = rand_vec(nk, -1, 1, dt);
    double *o = rand_vec(nq, -1, 1, dt), *g = rand_vec(nq, -1, 1, dt), *st = rand_vec(B * HQ * T * (D + 2), 0.5, 1, dt);
    double *lse = rand_vec(B * HQ * T, 1, 3, dt), *drow = rand_vec(B * HQ * T, -1, 1, dt), *acc = rand_vec(nq, -1, 1, dt);
    double sc[1] = {0.4};
    char msg[64];
    for (int causal = 0; causal < 2; causal++) {
      snprintf(msg, sizeof msg, "attention T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTENTION, 3, (Arg[]){{aq, q}, {ak, k}, {ak, v}}, (int64_t[]){causal, 0, 0, 0}, sc, msg, dt);
      for (int part = 0; part < 3; part++) {
        snprintf(msg, sizeof msg, "attention_bwd part %d T%lld causal=%d", part, (long long)T, causal);
        same_on_isas(IR_OP_ATTENTION_BWD, 5, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {aq, o}, {aq, g}},
                     (int64_t[]){causal, part, 0, 0, 0}, sc, msg, dt);
      }
      /* ALiBi: the bias added inside the tile loops, the same on both builds */
      IrType asl = TY(dt, HQ);
      double *slope = rand_vec(HQ, 0.05, 0.5, dt);
      snprintf(msg, sizeof msg, "attention alibi T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTENTION, 4, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {asl, slope}}, (int64_t[]){causal, 0, 1, 0}, sc,
                   msg, dt);
      snprintf(msg, sizeof msg, "attention_bwd alibi part 1 T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTENTION_BWD, 6, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {aq, o}, {aq, g}, {asl, slope}},
                   (int64_t[]){causal, 1, 0, 1, 0}, sc, msg, dt);
      free(slope);
      snprintf(msg, sizeof msg, "attn_acc T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTN_ACC, 4, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {ast, st}}, (int64_t[]){causal, 0, 0, 0}, sc, msg,
                   dt);
      snprintf(msg, sizeof msg, "attn_bwd_q T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTN_BWD_Q, 7, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {aq, g}, {arow, lse}, {arow, drow}, {aq, acc}},
                   (int64_t[]){causal, 0, 0, 0}, sc, msg, dt);
      snprintf(msg, sizeof msg, "attn_bwd_kv T%lld causal=%d", (long long)T, causal);
      same_on_isas(IR_OP_ATTN_BWD_KV, 7, (Arg[]){{aq, q}, {ak, k}, {ak, v}, {aq, g}, {arow, lse}, {arow, drow}, {ak, acc}},
                   (int64_t[]){causal, 0, 1, 0, 0}, sc, msg, dt);
    }
    free(q), free(k), free(v), free(o), free(g), free(st), free(lse), free(drow), free(acc);
  }
}

/* The additive score bias (bias=1) against the composed form written out
 * here in double: s = scale q.k + bias[h or 0] (then the causal mask),
 * p = softmax(s), o = p v; ds = p (do.v - rowsum(do o)), dq = scale ds k,
 * dbias = sum over b (and h when the bias has one head) of ds.  Cases:
 * causal over 70 positions (two query tiles, key tiles cut on the
 * diagonal), grouped-query heads; 3 queries over 530 keys (the backward's
 * log-sum-exp pass), one bias head for all.  f64 within 1e-12, f32 within
 * 2e-5 of the largest value; then the two ISA builds, bit for bit. */
static void attn_bias_case(IrDtype dt, int64_t Tq, int64_t Tk, int causal, int Hb) {
  enum { B = 2, HQ = 4, HKV = 2, D = 6 };
  double scale = 0.45, tol = dt == IR_F32 ? 2e-5 : 1e-12;
  IrType aq = TY(dt, B, HQ, Tq, D), ak = TY(dt, B, HKV, Tk, D), ab = TY(dt, Hb, Tq, Tk);
  int64_t nq = B * HQ * Tq * D, nk = B * HKV * Tk * D, nb = Hb * Tq * Tk;
  double *q = rand_vec(nq, -1, 1, dt), *k = rand_vec(nk, -1, 1, dt), *v = rand_vec(nk, -1, 1, dt);
  double *g = rand_vec(nq, -1, 1, dt), *bias = rand_vec(nb, -2, 2, dt);
  double *o = ts_xcalloc((size_t)nq, sizeof *o), *dq = ts_xcalloc((size_t)nq, sizeof *dq);
  double *db = ts_xcalloc((size_t)nb, sizeof *db), *p = ts_xmalloc((size_t)(Tk + 1) * sizeof *p);
  double *dp = ts_xmalloc((size_t)(Tk + 1) * sizeof *dp);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < HQ; h++)
      for (int64_t i = 0; i < Tq; i++) {
        const double *qi = q + ((b * HQ + h) * Tq + i) * D, *gi = g + ((b * HQ + h) * Tq + i) * D;
        const double *K = k + (b * HKV + h / 2) * Tk * D, *V = v + (b * HKV + h / 2) * Tk * D;
        const double *bi = bias + ((Hb == 1 ? 0 : h) * Tq + i) * Tk;
        double mx = -INFINITY, sum = 0, drow = 0;
        for (int64_t j = 0; j < Tk; j++) {
          double d = 0;
          for (int e = 0; e < D; e++) d += qi[e] * K[j * D + e];
          p[j] = causal && j > i ? -INFINITY : scale * d + bi[j];
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int64_t j = 0; j < Tk; j++) sum += p[j] = exp(p[j] - mx);
        double *oi = o + ((b * HQ + h) * Tq + i) * D;
        for (int64_t j = 0; j < Tk; j++) {
          p[j] /= sum;
          for (int e = 0; e < D; e++) oi[e] += p[j] * V[j * D + e];
        }
        for (int e = 0; e < D; e++) drow += gi[e] * oi[e];
        double *dqi = dq + ((b * HQ + h) * Tq + i) * D, *dbi = db + ((Hb == 1 ? 0 : h) * Tq + i) * Tk;
        for (int64_t j = 0; j < Tk; j++) {
          double d = 0;
          for (int e = 0; e < D; e++) d += gi[e] * V[j * D + e];
          dp[j] = p[j] * (d - drow);
          dbi[j] += dp[j];
          for (int e = 0; e < D; e++) dqi[e] += scale * dp[j] * K[j * D + e];
        }
      }
  if (dt == IR_F32)   /* the kernel's o is rounded to f32 before the backward reads it */
    for (int64_t i = 0; i < nq; i++) o[i] = (float)o[i];
  char msg[96];
  snprintf(msg, sizeof msg, "attention bias [%d, %lld, %lld] causal=%d", Hb, (long long)Tq, (long long)Tk, causal);
  Arg fwd[4] = {{aq, q}, {ak, k}, {ak, v}, {ab, bias}}, bwd[6] = {{aq, q}, {ak, k}, {ak, v}, {aq, o}, {aq, g}, {ab, bias}};
  struct { IrOp op; int nin, part; const Arg *a; const double *want; int64_t n; } outs[3] = {
      {IR_OP_ATTENTION, 4, -1, fwd, o, nq}, {IR_OP_ATTENTION_BWD, 6, 0, bwd, dq, nq}, {IR_OP_ATTENTION_BWD, 6, 3, bwd, db, nb}};
  for (int r = 0; r < 3; r++) {
    int64_t fia[4] = {causal, 0, 0, 1}, bia[5] = {causal, outs[r].part, 0, 0, 1};
    double *y = ra_run(outs[r].op, outs[r].nin, outs[r].a, outs[r].part < 0 ? fia : bia, scale, NULL);
    CHECK(y != NULL, "%s %s: %s", msg, r ? "backward" : "forward", err);
    if (!y) continue;
    double worst = 0, big = 1e-30;
    for (int64_t i = 0; i < outs[r].n; i++) big = fabs(outs[r].want[i]) > big ? fabs(outs[r].want[i]) : big;
    for (int64_t i = 0; i < outs[r].n; i++) worst = fmax(worst, fabs(y[i] - outs[r].want[i]) / big);
    CHECK(worst <= tol, "%s (%s) %s: rel err %.3g > %.3g", msg, ir_dtype_name(dt),
          r == 0 ? "o" : r == 1 ? "dq" : "dbias", worst, tol);
    free(y);
    char m2[128];
    snprintf(m2, sizeof m2, "%s %s", msg, r == 0 ? "o" : r == 1 ? "dq" : "dbias");
    same_on_isas(outs[r].op, outs[r].nin, outs[r].a, outs[r].part < 0 ? fia : bia, &scale, m2, dt);
  }
  free(q), free(k), free(v), free(g), free(bias), free(o), free(dq), free(db), free(p), free(dp);
}
static void test_attn_bias(IrDtype dt) {
  attn_bias_case(dt, 70, 70, 1, 4);
  attn_bias_case(dt, 70, 70, 0, 1);
  attn_bias_case(dt, 3, 530, 0, 1);
  attn_bias_case(dt, 5, 9, 0, 4);
}

/* Layout ops at sizes that take the merged-row, tiled and threaded paths
 * (memory-bound kernels split only above 2^20 elements per range), against
 * direct index arithmetic; also summing columns and batched GEMMs. */
static void test_layout_big(IrDtype dt) {
  enum { A = 6, B = 129, C = 41, D = 68, N = A * B * C * D };
  const int64_t dims[4] = {A, B, C, D};
  IrType t = TY(dt, A, B, C, D);
  double *x = rand_vec(N, -1, 1, dt), *w = ts_xmalloc(N * sizeof *w);
  Arg a[1] = {{t, x}};
  static const int64_t perms[][4] = {{0, 2, 1, 3}, {0, 1, 3, 2}, {3, 2, 1, 0}, {1, 0, 2, 3}, {2, 3, 0, 1}, {0, 3, 1, 2}};
  {   /* on 3 threads (one range is the serial loop, checked by the small cases) */
    int th = 3;
    rt_par_set_threads(th);
    for (size_t q = 0; q < sizeof perms / sizeof *perms; q++) {
      const int64_t *pm = perms[q];
      int64_t yd[4] = {dims[pm[0]], dims[pm[1]], dims[pm[2]], dims[pm[3]]}, xs[4] = {B * C * D, C * D, D, 1};
      int64_t i = 0;
      for (int64_t i0 = 0; i0 < yd[0]; i0++)
        for (int64_t i1 = 0; i1 < yd[1]; i1++)
          for (int64_t i2 = 0; i2 < yd[2]; i2++)
            for (int64_t i3 = 0; i3 < yd[3]; i3++)
              w[i++] = x[i0 * xs[pm[0]] + i1 * xs[pm[1]] + i2 * xs[pm[2]] + i3 * xs[pm[3]]];
      char msg[80];
      snprintf(msg, sizeof msg, "permute [%lld %lld %lld %lld] on %d threads", (long long)pm[0], (long long)pm[1],
               (long long)pm[2], (long long)pm[3], th);
      expect(IR_OP_PERMUTE, 1, a, pm, NULL, NULL, w, N, 0, msg, dt);
    }
    /* broadcast [B, 1, D] and [D] and [A, 1, C, 1] up to [A, B, C, D] */
    IrType bs[3] = {TY(dt, B, 1, D), TY(dt, D), TY(dt, A, 1, C, 1)};
    for (int k = 0; k < 3; k++) {
      int64_t ns = ir_type_numel(&bs[k]);
      double *v = rand_vec(ns, -1, 1, dt);
      for (int64_t i0 = 0; i0 < A; i0++)
        for (int64_t i1 = 0; i1 < B; i1++)
          for (int64_t i2 = 0; i2 < C; i2++)
            for (int64_t i3 = 0; i3 < D; i3++) {
              int64_t src = k == 0 ? i1 * D + i3 : k == 1 ? i3 : i0 * C + i2;
              w[((i0 * B + i1) * C + i2) * D + i3] = v[src];
            }
      Arg ab[1] = {{bs[k], v}};
      char msg[64];
      snprintf(msg, sizeof msg, "broadcast #%d on %d threads", k, th);
      expect(IR_OP_BROADCAST, 1, ab, NULL, NULL, &t, w, N, 0, msg, dt);
      /* and back: sum_to, in the serial order (exact in f64 up to rounding) */
      double *s = ts_xcalloc((size_t)ns, sizeof *s);
      for (int64_t i0 = 0; i0 < A; i0++)
        for (int64_t i1 = 0; i1 < B; i1++)
          for (int64_t i2 = 0; i2 < C; i2++)
            for (int64_t i3 = 0; i3 < D; i3++)
              s[k == 0 ? i1 * D + i3 : k == 1 ? i3 : i0 * C + i2] += x[((i0 * B + i1) * C + i2) * D + i3];
      snprintf(msg, sizeof msg, "sum_to #%d on %d threads", k, th);
      expect(IR_OP_SUM_TO, 1, a, NULL, NULL, &bs[k], s, ns, tol_of(dt), msg, dt);
      free(s);
      free(v);
    }
    /* causal mask over [A*B, C*... ]: rows longer than columns and fewer */
    IrType mt = TY(dt, A, B * C, D);
    Arg amk[1] = {{mt, x}};
    double fill[1] = {-5};
    for (int64_t m = 0; m < A; m++)
      for (int64_t i = 0; i < B * C; i++)
        for (int64_t j = 0; j < D; j++) {
          int64_t o = (m * B * C + i) * D + j;
          w[o] = j > i ? -5 : x[o];
        }
    expect(IR_OP_CAUSAL_MASK, 1, amk, NULL, fill, NULL, w, N, 0, "causal_mask big", dt);
    /* batched GEMMs small enough to run one per thread, both transposes */
    enum { BT = 6, M = 17, K = 23, NN = 19 };
    double *pa = rand_vec(BT * M * K, -1, 1, dt), *pb = rand_vec(BT * K * NN, -1, 1, dt), *pw = ts_xmalloc(BT * M * NN * sizeof *pw);
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        for (int bb = 0; bb < BT; bb++)
          for (int mm = 0; mm < M; mm++)
            for (int n = 0; n < NN; n++) {
              double acc = 0;
              for (int kk = 0; kk < K; kk++)
                acc += pa[bb * M * K + (ta ? kk * M + mm : mm * K + kk)] * pb[bb * K * NN + (tb ? n * K + kk : kk * NN + n)];
              pw[(bb * M + mm) * NN + n] = acc;
            }
        IrType at = ta ? TY(dt, 2, 3, K, M) : TY(dt, 2, 3, M, K), bt = tb ? TY(dt, 2, 3, NN, K) : TY(dt, 2, 3, K, NN);
        Arg ag[2] = {{at, pa}, {bt, pb}};
        char msg[64];
        snprintf(msg, sizeof msg, "batched matmul ta=%d tb=%d on %d threads", ta, tb, th);
        expect(IR_OP_MATMUL, 2, ag, (int64_t[]){ta, tb}, NULL, NULL, pw, BT * M * NN, tol_of(dt) * 5, msg, dt);
      }
    free(pa);
    free(pb);
    free(pw);
    /* sumsq over many fixed blocks */
    double ss = 0;
    for (int i = 0; i < N; i++) ss += x[i] * x[i];
    IrType big = TY(dt, N);
    Arg asq[1] = {{big, x}};
    expect(IR_OP_SUMSQ, 1, asq, NULL, NULL, NULL, &ss, 1, tol_of(dt), "sumsq big", dt);
  }
  rt_par_set_threads(0);
  free(x);
  free(w);
}

int main(void) {
  for (int d = 0; d < NT; d++) {
    IrDtype dt = DTS[d];
    test_elementwise(dt);
    test_typed_ew(dt);
    test_ints(dt);
    test_layout(dt);
    test_reductions(dt);
    test_matmul(dt);
    test_softmax_norms(dt);
    test_embedding(dt);
    test_masks(dt);
    test_dropout(dt);
    test_rope(dt);
    test_decode_ops(dt);
    test_cross_entropy(dt);
    test_clip(dt);
    test_nonfinite(dt);
    test_topk(dt);
    test_capacity(dt);
    test_moe(dt);
    test_shard_local(dt);
    test_index_ops(dt);
    test_global_positions(dt);
    test_embedding_split(dt);
    test_ring_attn(dt);
    test_threads_same(dt);
    test_isas_same(dt);
    test_attn_bias(dt);
    test_layout_big(dt);
  }
  test_par_pool();
  /* every op of ops.def has a kernel test here, except those that need
   * state or a whole block and are tested in test_rt_exec.c, and the
   * pipeline and ring ops, which need several ranks (tests/pipe_rt,
   * tests/parallel's cp cells) */
  static const IrOp elsewhere[] = {IR_OP_STATE, IR_OP_ZERO, IR_OP_ADAMW, IR_OP_OUTPUT, IR_OP_ASSIGN,
                                   IR_OP_SEND, IR_OP_RECV, IR_OP_STASH, IR_OP_UNSTASH, IR_OP_GROUP_SUM,
                                   IR_OP_ATTENTION, IR_OP_ATTENTION_BWD,    /* tests/grad, tests/oracle, tests/attn */
                                   IR_OP_RING_SHIFT, IR_OP_RING_WAIT,       /* a pair on cp ranks: tests/parallel */
                                   IR_OP_KV_WRITE,    /* writes a cache state: tests/generate */
                                   /* optimizer steps on states: tests/grad/opt_torch (against torch), their
                                    * ZeRO chunks in tests/parallel's optim cells */
                                   IR_OP_SGD, IR_OP_LION, IR_OP_LR_STEP,
                                   IR_OP_SCALE_UPDATE,    /* scaler states: tests/fp16 against Megatron's rule */
                                   /* fp8 (tests/fp8/test_fp8.c, fp8.unit): quant8 + matmul8 bit for bit the
                                    * rounding written out on both backends, amax_acc's max |x| and fp8_scale's
                                    * history / scale rule on their states */
                                   IR_OP_QUANT8, IR_OP_MATMUL8, IR_OP_AMAX_ACC, IR_OP_FP8_SCALE};
  for (int op = 0; op < IR_OP_COUNT; op++) {
    int skip = 0;
    for (size_t i = 0; i < sizeof elsewhere / sizeof *elsewhere; i++) skip |= elsewhere[i] == (IrOp)op;
    CHECK(skip || g_covered[op], "op %s has no kernel test", ir_ops[op].name);
  }
  return check_exit("test_rt_ops");
}
