/* test_comm.c - the communication layer (runtime/comm/comm.h), run under mpirun
 * with 1..4 ranks by run_mpi.sh.  One program, one mode per argv[1]:
 *   collectives  every collective in f32 and f64 against values computed
 *                locally from the rank numbers; send/recv around a ring;
 *                split groups; the group of every axis of every mesh whose
 *                size is the number of ranks (2x2 dp x tp among them);
 *                argument errors.  Exit 0 iff every check on every rank passed.
 *   stall        the last rank sleeps instead of joining an all_reduce; the
 *                others must abort after the (short) timeout naming it.
 *   stall_tp     the same inside the tp group of a 2x2 mesh (4 ranks).
 *   die, die0, kill  the last rank exits (status 3, status 0 without
 *                MPI_Finalize, SIGKILL) in the middle of the job; the others
 *                must not hang, and mpirun must name the rank.
 *   nccl         without a GPU, rt_comm_init_nccl fails cleanly with
 *                "no GPU" on every rank.
 *   mesh         pure mesh arithmetic (no MPI call beyond init).
 * The inputs are small multiples of 1/4, exact in f32, so sums are exact
 * whatever order MPI adds them in and the checks can ask for equality. */
#include "runtime/comm/comm.h"
#include <signal.h>
#include <unistd.h>
#include "../check.h"

static int g_rank;

/* The value rank r contributes at element i (exact in f32). */
static double val(int r, size_t i) { return (double)((r + 1) * (int)(i % 13)) * 0.25 - (double)r + 0.5; }

static void *alloc_dt(IrDtype dt, size_t n) { return ts_xcalloc(n ? n : 1, ir_dtype_size(dt)); }
static void put(IrDtype dt, void *p, size_t i, double v) {
  if (dt == IR_F32) ((float *)p)[i] = (float)v; else ((double *)p)[i] = v;
}
static double get(IrDtype dt, const void *p, size_t i) {
  return dt == IR_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

static char err[512];
#define OK(call) do { err[0] = 0; int rc_ = (call); CHECK(rc_ == 0, "%s: %s", #call, err); } while (0)

/* all_reduce, all_gather, reduce_scatter, all_to_all of count elements. */
static void test_collectives(RtComm *c, IrDtype dt, size_t count) {
  int p = rt_comm_size(c), r = rt_comm_rank(c);
  const char *dn = ir_dtype_name(dt);
  void *a = alloc_dt(dt, count), *big = alloc_dt(dt, count * p), *big2 = alloc_dt(dt, count * p);

  for (size_t i = 0; i < count; i++) put(dt, a, i, val(r, i));
  OK(rt_comm_all_reduce(c, dt, a, count, err, sizeof err));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int q = 0; q < p; q++) want += val(q, i);
    CHECK(get(dt, a, i) == want, "%s all_reduce n=%zu [%zu]: got %g want %g", dn, count, i, get(dt, a, i), want);
  }

  for (size_t i = 0; i < count; i++) put(dt, a, i, val(r, i));
  OK(rt_comm_all_gather(c, dt, a, big, count, err, sizeof err));
  for (int q = 0; q < p; q++)
    for (size_t i = 0; i < count; i++)
      CHECK(get(dt, big, q * count + i) == val(q, i), "%s all_gather n=%zu block %d [%zu]", dn, count, q, i);

  /* reduce_scatter: rank q's send block b holds val(q, b*count + i). */
  for (size_t j = 0; j < count * p; j++) put(dt, big, j, val(r, j));
  OK(rt_comm_reduce_scatter(c, dt, big, a, count, err, sizeof err));
  for (size_t i = 0; i < count; i++) {
    double want = 0;
    for (int q = 0; q < p; q++) want += val(q, (size_t)r * count + i);
    CHECK(get(dt, a, i) == want, "%s reduce_scatter n=%zu [%zu]: got %g want %g", dn, count, i, get(dt, a, i), want);
  }

  /* all_to_all: rank q sends block b = val(q*p + b, i); rank r's block q
   * must then be val(q*p + r, i). */
  for (int b = 0; b < p; b++)
    for (size_t i = 0; i < count; i++) put(dt, big, b * count + i, val(r * p + b, i));
  OK(rt_comm_all_to_all(c, dt, big, big2, count, err, sizeof err));
  for (int q = 0; q < p; q++)
    for (size_t i = 0; i < count; i++)
      CHECK(get(dt, big2, q * count + i) == val(q * p + r, i), "%s all_to_all n=%zu block %d [%zu]", dn, count, q, i);
  free(a); free(big); free(big2);
}

/* all_to_all_v: rank r sends n(r, j) = (r + 2j + count) % 5 elements to
 * rank j (zero for some pairs), element i of that message val(r*p + j, i);
 * rank r receives n(q, r) from each q, packed in rank order. */
static int a2av_n(int r, int j, size_t count) { return (int)((size_t)(r + 2 * j) + count) % 5; }
static void test_all_to_all_v(RtComm *c, IrDtype dt, size_t count) {
  int p = rt_comm_size(c), r = rt_comm_rank(c);
  int *sc = ts_xcalloc((size_t)p, sizeof *sc), *sd = ts_xcalloc((size_t)p, sizeof *sd);
  int *rc = ts_xcalloc((size_t)p, sizeof *rc), *rd = ts_xcalloc((size_t)p, sizeof *rd);
  int st = 0, rt = 0;
  for (int j = 0; j < p; j++) {
    sc[j] = a2av_n(r, j, count), sd[j] = st, st += sc[j];
    rc[j] = a2av_n(j, r, count), rd[j] = rt, rt += rc[j];
  }
  void *snd = alloc_dt(dt, (size_t)st), *rcv = alloc_dt(dt, (size_t)rt);
  for (int j = 0; j < p; j++)
    for (int i = 0; i < sc[j]; i++) put(dt, snd, (size_t)(sd[j] + i), val(r * p + j, (size_t)i));
  OK(rt_comm_all_to_all_v(c, dt, snd, sc, sd, rcv, rc, rd, err, sizeof err));
  for (int q = 0; q < p; q++)
    for (int i = 0; i < rc[q]; i++)
      CHECK(get(dt, rcv, (size_t)(rd[q] + i)) == val(q * p + r, (size_t)i), "%s all_to_all_v from %d [%d]",
            ir_dtype_name(dt), q, i);
  free(sc); free(sd); free(rc); free(rd); free(snd); free(rcv);
}

/* Each rank sends to r+1 and receives from r-1; even ranks send first so
 * the ring cannot deadlock (our send waits for completion). */
static void test_ring(RtComm *c, IrDtype dt, size_t count) {
  int p = rt_comm_size(c), r = rt_comm_rank(c);
  if (p < 2) return;
  void *s = alloc_dt(dt, count), *d = alloc_dt(dt, count);
  for (size_t i = 0; i < count; i++) put(dt, s, i, val(r, i));
  int to = (r + 1) % p, from = (r + p - 1) % p;
  if (r % 2 == 0) {
    OK(rt_comm_send(c, dt, s, count, to, 5, err, sizeof err));
    OK(rt_comm_recv(c, dt, d, count, from, 5, err, sizeof err));
  } else {
    OK(rt_comm_recv(c, dt, d, count, from, 5, err, sizeof err));
    OK(rt_comm_send(c, dt, s, count, to, 5, err, sizeof err));
  }
  for (size_t i = 0; i < count; i++)
    CHECK(get(dt, d, i) == val(from, i), "%s ring n=%zu [%zu]: got %g want %g", ir_dtype_name(dt), count, i,
          get(dt, d, i), val(from, i));
  free(s); free(d);
}

/* The group of every axis of mesh m: its size, our position, and (through
 * an all_gather of world ranks) exactly the members rt_mesh_group_ranks
 * predicts, in order. */
static void test_mesh_groups(RtComm *w, const PlanMesh *m) {
  int coord[RT_AXIS_COUNT], want[64];
  rt_mesh_coords(m, rt_comm_rank(w), coord);
  for (int a = 0; a < RT_AXIS_COUNT; a++) {
    RtComm *g = rt_comm_mesh_group(w, m, (RtMeshAxis)a, err, sizeof err);
    CHECK(g != NULL, "mesh group %s: %s", rt_mesh_axis_name((RtMeshAxis)a), err);
    if (!g) continue;
    int n = rt_mesh_group_ranks(m, rt_comm_rank(w), (RtMeshAxis)a, want);
    CHECK(rt_comm_size(g) == n, "axis %s: group size %d, want %d", rt_mesh_axis_name((RtMeshAxis)a), rt_comm_size(g), n);
    CHECK(rt_comm_rank(g) == coord[a], "axis %s: group rank %d, want coord %d", rt_mesh_axis_name((RtMeshAxis)a),
          rt_comm_rank(g), coord[a]);
    CHECK(strcmp(rt_comm_name(g), rt_mesh_axis_name((RtMeshAxis)a)) == 0, "group name %s", rt_comm_name(g));
    double me = rt_comm_world_rank(w), got[64];
    OK(rt_comm_all_gather(g, IR_F64, &me, got, 1, err, sizeof err));
    for (int i = 0; i < n && i < rt_comm_size(g); i++)
      CHECK(got[i] == want[i], "mesh dp=%d pp=%d cp=%d ep=%d tp=%d axis %s member %d: rank %g, want %d", m->dp,
            m->pp, m->cp, m->ep, m->tp, rt_mesh_axis_name((RtMeshAxis)a), i, got[i], want[i]);
    test_collectives(g, IR_F32, 5);   /* and collectives inside the subgroup */
    rt_comm_free(g);
  }
}

/* The groups over a set of axes (ZeRO over dp x cp): every set of two or
 * more axes with a live one; members are the ranks sharing every other
 * coordinate, group rank k the flat index over the set, outer axis major. */
static void test_mesh_axes_groups(RtComm *w, const PlanMesh *m) {
  int coord[RT_AXIS_COUNT], c2[RT_AXIS_COUNT];
  const int size[RT_AXIS_COUNT] = {m->dp, m->pp, m->cp, m->ep, m->tp};
  int me = rt_comm_rank(w), p = rt_comm_size(w);
  rt_mesh_coords(m, me, coord);
  for (unsigned mask = 1; mask < (1u << RT_AXIS_COUNT); mask++) {
    int live = 0, n = 1;
    for (int a = 0; a < RT_AXIS_COUNT; a++)
      if (mask & (1u << a)) live |= size[a] > 1, n *= size[a];
    if (!(mask & (mask - 1)) || !live) continue;
    RtComm *g = rt_comm_mesh_axes_group(w, m, mask, err, sizeof err);
    CHECK(g != NULL, "axes group %#x: %s", mask, err);
    if (!g) continue;
    int want[64];
    for (int r = 0; r < p; r++) {   /* the members, by their index over the set */
      rt_mesh_coords(m, r, c2);
      int same = 1;
      for (int a = 0; a < RT_AXIS_COUNT; a++)
        if (!(mask & (1u << a)) && c2[a] != coord[a]) same = 0;
      if (same) want[rt_mesh_axes_index(m, mask, c2)] = r;
    }
    CHECK(rt_comm_size(g) == n, "axes %#x: group size %d, want %d", mask, rt_comm_size(g), n);
    CHECK(rt_comm_rank(g) == rt_mesh_axes_index(m, mask, coord), "axes %#x: group rank %d", mask, rt_comm_rank(g));
    CHECK(strchr(rt_comm_name(g), '+') != NULL, "axes group name %s", rt_comm_name(g));
    double x = rt_comm_world_rank(w), got[64];
    OK(rt_comm_all_gather(g, IR_F64, &x, got, 1, err, sizeof err));
    for (int i = 0; i < n && i < rt_comm_size(g); i++)
      CHECK(got[i] == want[i], "mesh dp=%d pp=%d cp=%d ep=%d tp=%d axes %#x member %d: rank %g, want %d", m->dp,
            m->pp, m->cp, m->ep, m->tp, mask, i, got[i], want[i]);
    rt_comm_free(g);
  }
  if (m->dp == 2 && m->cp == 2 && p == 4) {   /* dp x cp by hand: ranks (dp, cp) = 0 (0,0), 1 (0,1), 2 (1,0), 3 (1,1) */
    RtComm *g = rt_comm_mesh_axes_group(w, m, (1u << RT_AXIS_DP) | (1u << RT_AXIS_CP), err, sizeof err);
    CHECK(g && rt_comm_rank(g) == me && strcmp(rt_comm_name(g), "dp+cp") == 0, "2x2 dp+cp group: %s", err);
    rt_comm_free(g);
  }
  CHECK(rt_comm_mesh_axes_group(w, m, 1u << RT_AXIS_COUNT, err, sizeof err) == NULL && strstr(err, "bad axis mask"),
        "a mask beyond the axes: '%s'", err);
}

/* Every assignment of the factors of size to the 5 axes (size <= 4 here). */
static void test_all_meshes(RtComm *w) {
  int p = rt_comm_size(w), meshes = 0;
  for (int dp = 1; dp <= p; dp++) for (int pp = 1; pp <= p; pp++) for (int cp = 1; cp <= p; cp++)
    for (int ep = 1; ep <= p; ep++) for (int tp = 1; tp <= p; tp++) {
      if (dp * pp * cp * ep * tp != p) continue;
      PlanMesh m = {dp, pp, cp, ep, tp};
      test_mesh_groups(w, &m);
      test_mesh_axes_groups(w, &m);
      meshes++;
    }
  CHECK(meshes > 0, "no mesh tried");
  if (p == 4) {   /* the 2x2 dp x tp mesh by hand: tp pairs {0,1},{2,3}; dp pairs {0,2},{1,3} */
    PlanMesh m = {2, 1, 1, 1, 2};
    int r = rt_comm_rank(w);
    RtComm *tp = rt_comm_mesh_group(w, &m, RT_AXIS_TP, err, sizeof err);
    RtComm *dp = rt_comm_mesh_group(w, &m, RT_AXIS_DP, err, sizeof err);
    CHECK(tp && dp, "2x2 groups: %s", err);
    if (tp && dp) {
      double x = r, y = r;
      OK(rt_comm_all_reduce(tp, IR_F64, &x, 1, err, sizeof err));
      OK(rt_comm_all_reduce(dp, IR_F64, &y, 1, err, sizeof err));
      CHECK(x == (r < 2 ? 1 : 5), "2x2 tp sum at rank %d: %g", r, x);
      CHECK(y == (r % 2 == 0 ? 2 : 4), "2x2 dp sum at rank %d: %g", r, y);
    }
    rt_comm_free(tp);
    rt_comm_free(dp);
  }
}

static void test_split(RtComm *w) {
  int r = rt_comm_rank(w), p = rt_comm_size(w);
  /* even and odd ranks, the key reverses the order inside each */
  RtComm *g = rt_comm_split(w, r % 2, -r, "parity", err, sizeof err);
  CHECK(g != NULL, "split: %s", err);
  if (!g) return;
  int n = (p + 1 - r % 2) / 2;
  CHECK(rt_comm_size(g) == n, "parity group size %d, want %d", rt_comm_size(g), n);
  CHECK(rt_comm_rank(g) == n - 1 - r / 2, "parity group rank %d", rt_comm_rank(g));
  double x = r;
  OK(rt_comm_all_reduce(g, IR_F64, &x, 1, err, sizeof err));
  double want = 0;
  for (int q = r % 2; q < p; q += 2) want += q;
  CHECK(x == want, "parity sum %g, want %g", x, want);
  CHECK(rt_comm_timeout(g) == rt_comm_timeout(w), "split inherits the timeout");
  rt_comm_free(g);
  CHECK(rt_comm_split(w, -1, 0, "bad", err, sizeof err) == NULL && strstr(err, "color"), "negative color: %s", err);
}

static void test_arg_errors(RtComm *w) {
  float x = 1;
  int p = rt_comm_size(w);
  CHECK(rt_comm_all_reduce(w, IR_I32, &x, 1, err, sizeof err) == -1 && strstr(err, "i32"), "i32 refused: %s", err);
  CHECK(rt_comm_send(w, IR_F32, &x, 1, p, 0, err, sizeof err) == -1 && strstr(err, "peer"), "bad peer: %s", err);
  CHECK(rt_comm_recv(w, IR_F32, &x, 1, rt_comm_rank(w), 0, err, sizeof err) == -1, "recv from self refused");
  CHECK(rt_comm_all_gather(w, IR_F32, NULL, NULL, 4, err, sizeof err) == -1 && strstr(err, "NULL"), "NULL: %s", err);
  CHECK(rt_comm_all_to_all(w, IR_F64, &x, &x, (size_t)1 << 40, err, sizeof err) == -1 && strstr(err, "elements"),
        "huge count: %s", err);
  PlanMesh m = {p + 1, 1, 1, 1, 1};
  CHECK(rt_comm_mesh_group(w, &m, RT_AXIS_DP, err, sizeof err) == NULL && strstr(err, "mpirun -np"),
        "mesh/size mismatch: %s", err);
}

static void test_mesh_math(void) {
  PlanMesh m = {2, 3, 1, 1, 4};   /* 24 ranks */
  int c[RT_AXIS_COUNT], g[8];
  CHECK(rt_mesh_size(&m) == 24, "mesh size");
  for (int r = 0; r < 24; r++) {
    CHECK(rt_mesh_coords(&m, r, c) == 0 && rt_mesh_rank(&m, c) == r, "round trip %d", r);
    CHECK(c[RT_AXIS_TP] == r % 4 && c[RT_AXIS_PP] == (r / 4) % 3 && c[RT_AXIS_DP] == r / 12, "coords of %d", r);
  }
  CHECK(rt_mesh_coords(&m, 24, c) == -1 && rt_mesh_coords(&m, -1, c) == -1, "outside the mesh");
  CHECK(rt_mesh_group_ranks(&m, 17, RT_AXIS_TP, g) == 4 && g[0] == 16 && g[3] == 19, "tp group of 17");
  CHECK(rt_mesh_group_ranks(&m, 17, RT_AXIS_PP, g) == 3 && g[0] == 13 && g[1] == 17 && g[2] == 21, "pp group of 17");
  CHECK(rt_mesh_group_ranks(&m, 17, RT_AXIS_DP, g) == 2 && g[0] == 5 && g[1] == 17, "dp group of 17");
  CHECK(rt_mesh_group_ranks(&m, 17, RT_AXIS_CP, g) == 1 && g[0] == 17, "cp group of 17");
  PlanMesh z = {0, 0, 0, 0, 0};
  CHECK(rt_mesh_size(&z) == 1, "axes < 1 count as 1");
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: test_comm collectives|stall|stall_tp|die|die0|kill|nccl|mesh\n"); return 2; }
  const char *mode = argv[1];
  double timeout = !strncmp(mode, "stall", 5) || !strncmp(mode, "die", 3) || !strcmp(mode, "kill") ? 3.0 : 30.0;
  RtComm *w = rt_comm_init_mpi(&argc, &argv, timeout, err, sizeof err);
  if (!w) { fprintf(stderr, "test_comm: %s\n", err); return 1; }
  check_rank = g_rank = rt_comm_rank(w);
  int p = rt_comm_size(w);

  if (!strcmp(mode, "collectives")) {
    static const size_t counts[] = {0, 1, 17, 1000};
    for (int d = 0; d < 2; d++) {
      IrDtype dt = d ? IR_F64 : IR_F32;
      for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
        test_collectives(w, dt, counts[k]);
        test_all_to_all_v(w, dt, counts[k]);
        test_ring(w, dt, counts[k]);
      }
    }
    test_split(w);
    test_all_meshes(w);
    test_arg_errors(w);
    OK(rt_comm_barrier(w, err, sizeof err));
  } else if (!strcmp(mode, "stall") || !strcmp(mode, "die") || !strcmp(mode, "die0") || !strcmp(mode, "kill")) {
    double x = 1;
    OK(rt_comm_all_reduce(w, IR_F64, &x, 1, err, sizeof err));   /* everyone is up */
    if (g_rank == p - 1) {
      if (!strcmp(mode, "die")) _exit(3);    /* dies without MPI_Finalize */
      if (!strcmp(mode, "die0")) _exit(0);   /* ... even with status 0 */
      if (!strcmp(mode, "kill")) raise(SIGKILL);
      sleep(40);                             /* stall: longer than the test's bound */
    }
    rt_comm_all_reduce(w, IR_F64, &x, 1, err, sizeof err);
    fprintf(stderr, "rank %d: all_reduce returned, it should have aborted\n", g_rank);
    return 0;   /* exit 0: the test wants non-zero */
  } else if (!strcmp(mode, "stall_tp")) {
    /* 2x2 dp x tp mesh; rank 3 stalls, so its tp partner (rank 2) must
     * name it, in world ranks, and name the group. */
    PlanMesh m = {2, 1, 1, 1, 2};
    RtComm *tp = rt_comm_mesh_group(w, &m, RT_AXIS_TP, err, sizeof err);
    CHECK(tp != NULL, "tp group: %s", err);
    /* Only rank 2 may time out: ranks 0 and 1 finish their tp all_reduce
     * and wait in the world agreement below.  With the world's 3 s they
     * could time out first under load (rank 2 descheduled after the split)
     * and abort the job before rank 2 names rank 3, so the world gets a
     * longer deadline than the tp group. */
    rt_comm_set_timeout(w, 20.0);
    double x = 1;
    if (tp) {
      if (g_rank == 3) sleep(40);
      rt_comm_all_reduce(tp, IR_F64, &x, 1, err, sizeof err);
      rt_comm_free(tp);
    }
  } else if (!strcmp(mode, "nccl")) {
    RtComm *n = rt_comm_init_nccl(w, -1, err, sizeof err);
    if (n) {
      printf("rank %d: a GPU is present, NCCL group made\n", g_rank);
      CHECK(rt_comm_is_nccl(n) && rt_comm_size(n) == p, "nccl group");
      rt_comm_free(n);
    } else {
      printf("rank %d: %s\n", g_rank, err);
      CHECK(strncmp(err, "no GPU", 6) == 0, "message starts with 'no GPU': %s", err);
    }
    OK(rt_comm_barrier(w, err, sizeof err));   /* every rank came back */
  } else if (!strcmp(mode, "mesh")) {
    test_mesh_math();
  } else {
    fprintf(stderr, "test_comm: unknown mode %s\n", mode);
    check_fails++;
  }

  /* Every rank must agree the test passed. */
  double bad = check_bad();
  if (rt_comm_all_reduce(w, IR_F64, &bad, 1, err, sizeof err) != 0) bad = 1;
  char name[64];
  snprintf(name, sizeof name, "test_comm %s on %d rank(s)", mode, p);
  rt_comm_free(w);
  return check_exit_all(name, bad);
}
