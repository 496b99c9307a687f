/* test_rank_ops.c - the collective kernels (all_reduce sum and max,
 * all_gather and reduce_scatter along every dim) run through the executor
 * on real groups, under mpirun (tests/comm/run_mpi.sh):
 *   test_rank_ops ops TOKEN
 * On P ranks: the mesh tp = P, and for P = 4 also dp 2 x tp 2 (collectives
 * over tp and over dp).  Rank w contributes x_w[i] = val(w, i); each result
 * is checked against the value computed here from the group's world ranks
 * (rt_mesh_group_ranks), in f32 and f64.  Exit 0 iff every rank passed. */
#include "../runtime/rt_test.h"
#include "runtime/comm/comm.h"

static char err[1024];
static int g_rank;

/* exact in f32: small multiples of 1/8 */
static double val(int w, int64_t i) { return (double)((w + 1) * (int)(i % 11)) * 0.125 - (double)w; }

static double *fill(int w, int64_t n) {
  double *v = ts_xmalloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++) v[i] = val(w, i);
  return v;
}

static void check_eq(const double *got, const double *want, int64_t n, const char *what) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (got[i] != want[i]) bad = i;
  CHECK(bad < 0, "rank %d: %s: element %lld = %g, expected %g", g_rank, what, (long long)bad,
        bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
}

/* Runs op on this rank's x (type t) and compares with want[n]. */
static void run_check(IrOp op, const IrType *t, const double *x, const int64_t *ia, const RtRank *r,
                      const double *want, int64_t n, const char *what) {
  Arg a[1] = {{*t, x}};
  OpShard sh;
  memset(&sh, 0, sizeof sh);
  sh.rank = r;
  IrType rt;
  double *got = run_op_sh(op, 1, a, ia, NULL, NULL, &sh, &rt, err, sizeof err);
  CHECK(got != NULL, "rank %d: %s: %s", g_rank, what, err);
  if (!got) return;
  CHECK(ir_type_numel(&rt) == n, "rank %d: %s: %lld results, expected %lld", g_rank, what,
        (long long)ir_type_numel(&rt), (long long)n);
  if (ir_type_numel(&rt) == n) check_eq(got, want, n, what);
  free(got);
}

/* Every collective over axis ax of r's mesh. */
static void test_axis(const RtRank *r, IrAxis ax, IrDtype dt) {
  int ranks[64], me = g_rank;
  int S = rt_mesh_group_ranks(&r->mesh, me, (RtMeshAxis)ax, ranks), c = r->coord[ax];
  char what[128];
  /* all_reduce sum and max of [3, 5] */
  IrType t = TY(dt, 3, 5);
  double *x = fill(me, 15), want[15];
  for (int red = 0; red < 2; red++) {
    for (int i = 0; i < 15; i++) {
      want[i] = red ? -1e300 : 0;
      for (int q = 0; q < S; q++) want[i] = red ? fmax(want[i], val(ranks[q], i)) : want[i] + val(ranks[q], i);
    }
    snprintf(what, sizeof what, "all_reduce %s over %s (%s)", red ? "max" : "sum", ir_axis_name(ax), ir_dtype_name(dt));
    run_check(IR_OP_ALL_REDUCE, &t, x, (int64_t[]){ax, red}, r, want, 15, what);
  }
  free(x);
  /* all_gather and reduce_scatter along each dim of [2, 3, 4] (x S) */
  for (int d = 0; d < 3; d++) {
    int64_t dims[3] = {2, 3, 4}, outer = 1, inner = 1, L = dims[d];
    for (int e = 0; e < d; e++) outer *= dims[e];
    for (int e = d + 1; e < 3; e++) inner *= dims[e];
    int64_t n = outer * L * inner;
    IrType lt = TY(dt, 2, 3, 4), bt = lt;
    bt.dim[d] *= S;
    x = fill(me, n);
    double *g = ts_xmalloc((size_t)(n * S) * sizeof *g);
    for (int q = 0; q < S; q++)   /* block q of dim d is rank ranks[q]'s x */
      for (int64_t o = 0; o < outer; o++)
        for (int64_t l = 0; l < L; l++)
          for (int64_t i = 0; i < inner; i++)
            g[(o * L * S + q * L + l) * inner + i] = val(ranks[q], (o * L + l) * inner + i);
    snprintf(what, sizeof what, "all_gather dim %d over %s (%s)", d, ir_axis_name(ax), ir_dtype_name(dt));
    run_check(IR_OP_ALL_GATHER, &lt, x, (int64_t[]){ax, d}, r, g, n * S, what);
    free(x);
    /* reduce_scatter: x_w of the big shape; this rank gets block c of the sum */
    x = fill(me, n * S);
    double *rs = ts_xcalloc((size_t)n, sizeof *rs);
    for (int q = 0; q < S; q++)
      for (int64_t o = 0; o < outer; o++)
        for (int64_t l = 0; l < L; l++)
          for (int64_t i = 0; i < inner; i++)
            rs[(o * L + l) * inner + i] += val(ranks[q], (o * L * S + c * L + l) * inner + i);
    snprintf(what, sizeof what, "reduce_scatter dim %d over %s (%s)", d, ir_axis_name(ax), ir_dtype_name(dt));
    run_check(IR_OP_REDUCE_SCATTER, &bt, x, (int64_t[]){ax, d}, r, rs, n, what);
    free(x);
    free(g);
    free(rs);
  }
}

static void test_mesh(RtComm *w, PlanMesh mesh) {
  RtRank r = rt_rank_single();
  r.mesh = mesh;
  rt_mesh_coords(&mesh, g_rank, r.coord);
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (rt_rank_axis_size(&r, (IrAxis)a) > 1) {
      r.group[a] = rt_comm_mesh_group(w, &mesh, (RtMeshAxis)a, err, sizeof err);
      CHECK(r.group[a] != NULL, "rank %d: group %s: %s", g_rank, ir_axis_name((IrAxis)a), err);
      if (!r.group[a]) return;
    }
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (r.group[a])
      for (int d = 0; d < 2; d++) test_axis(&r, (IrAxis)a, d ? IR_F64 : IR_F32);
  for (int a = 0; a < IR_AXIS_COUNT; a++) rt_comm_free(r.group[a]);
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "ops") != 0) { fprintf(stderr, "usage: test_rank_ops ops [TOKEN]\n"); return 2; }
  RtComm *w = rt_comm_init_mpi(&argc, &argv, 30, err, sizeof err);
  if (!w) { fprintf(stderr, "test_rank_ops: %s\n", err); return 1; }
  g_rank = rt_comm_rank(w);
  int P = rt_comm_size(w);
  test_mesh(w, (PlanMesh){1, 1, 1, 1, P});
  if (P == 4) test_mesh(w, (PlanMesh){2, 1, 1, 1, 2});
  double bad = check_bad();
  if (rt_comm_all_reduce(w, IR_F64, &bad, 1, err, sizeof err) != 0) bad = 1;
  char name[64];
  snprintf(name, sizeof name, "test_rank_ops on %d ranks", P);
  int rc = check_exit_all(name, bad);
  rt_comm_free(w);
  return rc;
}
