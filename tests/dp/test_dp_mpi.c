/* test_dp_mpi.c - the update block for data parallelism, in numbers: run
 * under mpirun with W ranks (one dp rank each), for zero in {0, 1}, on
 *   - a hand-built f64 module with a padded (numel % W != 0) parameter,
 *   - samples/gpt.mdl at toy size in f64 with clipping and weight decay,
 * every rank compiles the model at dp = 1, respecializes a copy to dp = W
 * (pass_respecialize_dp, what mrun does) and trains STEPS steps of G
 * global micro batches: the dp program runs the rank's G/W micro batches
 * (global micro g = r*G/W + j, as the trainer does) and the update block
 * with its collectives; a single-rank program (no communication) runs all
 * G micro batches on the same rank.  After every step, grad_norm and every
 * parameter must equal the single-rank ones to 1e-10 (relative; absolute
 * for values below 1e-3): the gradient sums differ only in the order of
 * additions.
 *
 * usage: mpirun -np W test_dp_mpi MODE [token]   (MODE: "train" both
 * models, "hand" the hand-built one only (cheaper under ASan); the token
 * lets tests/comm/run_mpi.sh find leftover processes) */
#include "frontend/mdl.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include "../check.h"

#define STEPS 3
#define TOL 1e-10

static int g_rank;
static char err[2048];

/* Relative difference, absolute below 1e-3: a parameter that only ever
 * gets rounding noise as its gradient (an attention key bias: softmax does
 * not see it) holds values ~1e-16 that differ between summation orders. */
static double rel(double a, double b) { return fabs(a - b) / fmax(1e-3, fmax(fabs(a), fabs(b))); }

/* Deterministic pseudo-random numbers from (a, b, i). */
static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static uint64_t draw(int64_t a, int64_t b, int64_t i) { return mix(mix(mix((uint64_t)a) ^ (uint64_t)b) ^ (uint64_t)i); }

/* loss = sumsq(tanh(x[2,4] @ w[4,6]) * gain[6]) + sum(b[5] * y[5]), with
 * G = 4 micro batches per step. */
static IrModule *hand_module(void) {
  IrModule *m = ir_module_new("dpnum");
  m->train.precision = IR_F64;
  m->train.clip_grad = 0.5;
  m->train.weight_decay = 0.1;
  m->train.lr = 0.05;
  m->train.global_batch = 4;
  m->train.micro_batch = 1;
  m->par.zero = 1;
  IrType tw = {IR_F64, 2, {4, 6}, {NULL, NULL}}, tg = {IR_F64, 1, {6}, {NULL}}, tb = {IR_F64, 1, {5}, {NULL}};
  IrType tx = {IR_F64, 2, {2, 4}, {NULL, NULL}}, th = {IR_F64, 2, {2, 6}, {NULL, NULL}};
  IrState s = {0};
  s.kind = IR_STATE_PARAM;
  s.init = IR_INIT_NORMAL;
  s.init_b = 0.5;
  s.of = -1;
  s.name = "w"; s.type = tw; int w = ir_state_add(m, &s);
  s.name = "gain"; s.type = tg; s.init = IR_INIT_ONES; int gn = ir_state_add(m, &s);
  s.name = "b"; s.type = tb; s.init = IR_INIT_UNIFORM; s.init_a = -1; s.init_b = 1; s.flags = IR_STATE_NODECAY;
  int bs = ir_state_add(m, &s);
  int b = ir_block_add(m, "forward");
#define E(...) ir_emit(m, b, __VA_ARGS__, err, sizeof err)
  int x = E(IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &tx);
  int y = E(IR_OP_INPUT, NULL, 0, NULL, NULL, "y", &tb);
  int wv = E(IR_OP_STATE, NULL, 0, (int64_t[]){w}, NULL, NULL, &tw);
  int gv = E(IR_OP_STATE, NULL, 0, (int64_t[]){gn}, NULL, NULL, &tg);
  int bv = E(IR_OP_STATE, NULL, 0, (int64_t[]){bs}, NULL, NULL, &tb);
  int h = E(IR_OP_MATMUL, (int[]){x, wv}, 2, NULL, NULL, NULL, NULL);
  int t = E(IR_OP_TANH, &h, 1, NULL, NULL, NULL, NULL);
  int gb = E(IR_OP_BROADCAST, &gv, 1, NULL, NULL, NULL, &th);
  int z = E(IR_OP_MUL, (int[]){t, gb}, 2, NULL, NULL, NULL, NULL);
  int s1 = E(IR_OP_SUMSQ, &z, 1, NULL, NULL, NULL, NULL);
  int by = E(IR_OP_MUL, (int[]){bv, y}, 2, NULL, NULL, NULL, NULL);
  int s2 = E(IR_OP_SUM, &by, 1, (int64_t[]){0, 0}, NULL, NULL, NULL);
  int l = E(IR_OP_ADD, (int[]){s1, s2}, 2, NULL, NULL, NULL, NULL);
  if (E(IR_OP_OUTPUT, &l, 1, NULL, NULL, "loss", NULL) < 0) TS_DIE("building the module: %s", err);
#undef E
  return m;
}

static IrModule *gpt_module(void) {
  static const MdlDefine defs[] = {
    {"layers", "1"}, {"d_model", "10"}, {"heads", "2"}, {"seq_len", "6"}, {"vocab", "30"},
    {"batch", "8"}, {"micro_batch", "2"}};
  char path[4096];
  snprintf(path, sizeof path, "%s/samples/gpt.mdl", TS_SOURCE_DIR);
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = defs;
  opt.ndefines = (int)(sizeof defs / sizeof defs[0]);
  opt.precision = IR_F64;
  IrModule *m = mdl_compile_file(path, &opt);
  if (!m) TS_DIE("%s does not compile", path);
  m->train.lr = 0.02;            /* large steps: differences would show */
  return m;
}

/* The inputs of global micro batch g at step s: every INPUT of block b
 * filled from (s, g) - floats in [-1, 1), i32 ids in [0, 30). */
typedef struct { int n; RtFeed f[8]; void *buf[8]; } Feeds;
static void make_feeds(const IrModule *m, int b, int64_t s, int g, Feeds *fd) {
  const IrBlock *blk = &m->blocks.a[b];
  fd->n = 0;
  for (int i = 0; i < blk->n; i++) {
    const IrNode *n = &blk->nodes[i];
    if (n->op != IR_OP_INPUT) continue;
    TS_ASSERT(fd->n < 8);
    int64_t k = ir_type_numel(&n->type);
    void *p = ts_xmalloc((size_t)k * ir_dtype_size(n->type.dtype));
    uint64_t key = ts_hash64(n->sa, strlen(n->sa), 7);
    for (int64_t e = 0; e < k; e++) {
      uint64_t r = draw(s * 1000 + g, (int64_t)key, e);
      if (n->type.dtype == IR_I32) ((int32_t *)p)[e] = (int32_t)(r % 30);
      else ((double *)p)[e] = (double)(r >> 11) * 0x1.0p-52 - 1.0;
    }
    fd->f[fd->n].name = n->sa;
    fd->f[fd->n].data = p;
    fd->buf[fd->n++] = p;
  }
}
static void free_feeds(Feeds *fd) { for (int i = 0; i < fd->n; i++) free(fd->buf[i]); }

static int run(RtProgram *p, const char *block, int64_t step, int g, const Feeds *fd) {
  const IrModule *m = rt_program_module(p);
  RtRunInfo info = {step, g, rt_lr_at(&m->train, step, rt_samples_before(p, step)), 0};
  int rc = rt_run_block(p, ir_block_find(m, block), fd ? fd->f : NULL, fd ? fd->n : 0, &info, err, sizeof err);
  CHECK(rc == 0, "run %s (step %lld, micro %d): %s", block, (long long)step, g, err);
  return rc;
}

/* Trains fwd at dp = W (zero on/off) next to a single-rank copy. */
static void check_model(const char *name, const IrModule *fwd, int zero, const RtRank *rank) {
  int W = rt_rank_axis_size(rank, IR_AXIS_DP), r = rank->coord[IR_AXIS_DP];
  IrModule *ref = ir_module_clone(fwd);
  ref->par.dp = 1;
  ref->par.zero = zero;
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_run_pipeline(ref, &cx);
  CHECK(rc == 0, "%s: pipeline: %s", name, cx.err);
  pass_ctx_free(&cx);
  IrModule *dpm = rc == 0 ? ir_module_clone(ref) : NULL;
  if (dpm && pass_respecialize_dp(dpm, W, err, sizeof err) != 0) {
    CHECK(0, "%s: respecialize to %d: %s", name, W, err);
    ir_module_free(dpm);
    dpm = NULL;
  }
  RtProgram *pr = NULL, *pd = NULL;
  if (dpm) {
    pr = rt_program_new(ref, err, sizeof err);
    CHECK(pr, "%s: single-rank program: %s", name, err);
    pd = rt_program_new_rank(dpm, rank, err, sizeof err);
    CHECK(pd, "%s: dp program: %s", name, err);
  }
  /* every rank reaches the same collectives or none: agree first */
  double ok = pr && pd ? 0 : 1;
  if (rank->group[IR_AXIS_DP]) rt_comm_all_reduce(rank->group[IR_AXIS_DP], IR_F64, &ok, 1, err, sizeof err);
  int G = (int)(ref->train.global_batch / ref->train.micro_batch);
  if (ok == 0 && G % W) { CHECK(0, "%s: %d micro batches do not split over %d ranks", name, G, W); ok = 1; }
  double worst = 0;
  for (int64_t s = 0; s < STEPS && ok == 0; s++) {
    int stop = 0;
    for (int g = 0; g < G && !stop; g++) {
      Feeds fd;
      make_feeds(ref, ir_block_find(ref, "micro"), s, g, &fd);
      stop |= run(pr, "micro", s, g, &fd) != 0;
      if (g / (G / W) == r) stop |= run(pd, "micro", s, g, &fd) != 0;
      free_feeds(&fd);
    }
    if (stop) break;   /* a failing rank: the others time out and abort */
    if (run(pr, "update", s, 0, NULL) != 0 || run(pd, "update", s, 0, NULL) != 0) break;
    double nr = NAN, nd = NAN;
    rt_output(pr, "grad_norm", &nr);
    rt_output(pd, "grad_norm", &nd);
    CHECK(rel(nr, nd) <= TOL, "%s zero=%d step %lld: grad_norm %.17g, single rank %.17g", name, zero, (long long)s, nd, nr);
    for (int st = 0; st < ref->states.n; st++) {
      const IrState *ps = &ref->states.a[st];
      if (ps->kind != IR_STATE_PARAM) continue;
      const double *a = rt_state_data(pr, st), *b = rt_state_data(pd, ir_state_find(dpm, ps->name));
      int64_t n = ir_type_numel(&ps->type), bad = -1;
      for (int64_t i = 0; i < n; i++) {
        double d = rel(a[i], b[i]);
        if (d > worst) worst = d;
        if (d > TOL && bad < 0) bad = i;
      }
      CHECK(bad < 0, "%s zero=%d step %lld: @%s[%lld] = %.17g, single rank %.17g", name, zero, (long long)s,
            ps->name, (long long)bad, bad < 0 ? 0 : b[bad], bad < 0 ? 0 : a[bad]);
    }
  }
  if (g_rank == 0) printf("%s dp=%d zero=%d: largest relative difference %.3g over %d steps\n", name, W, zero, worst, STEPS);
  rt_program_free(pr);
  rt_program_free(pd);
  ir_module_free(dpm);
  ir_module_free(ref);
}

int main(int argc, char **argv) {
  RtComm *world = rt_comm_init_mpi(&argc, &argv, 30.0, err, sizeof err);
  if (!world) { fprintf(stderr, "test_dp_mpi: %s\n", err); return 1; }
  int with_gpt = argc >= 2 && strcmp(argv[1], "train") == 0;
  if (argc < 2 || (!with_gpt && strcmp(argv[1], "hand") != 0)) {
    fprintf(stderr, "usage: mpirun -np W test_dp_mpi train|hand [token]\n");
    rt_comm_free(world);
    return 2;
  }
  check_rank = g_rank = rt_comm_rank(world);
  int W = rt_comm_size(world);
  RtRank rank = rt_rank_single();
  rank.mesh.dp = W;
  rank.coord[IR_AXIS_DP] = g_rank;
  if (W > 1) {
    rank.group[IR_AXIS_DP] = rt_comm_mesh_group(world, &rank.mesh, RT_AXIS_DP, err, sizeof err);
    if (!rank.group[IR_AXIS_DP]) rt_comm_abort(world, "dp group: %s", err);
  }
  IrModule *hand = hand_module(), *gpt = with_gpt ? gpt_module() : NULL;
  for (int zero = 0; zero <= 1; zero++) {
    check_model("hand", hand, zero, &rank);
    if (gpt) check_model("gpt", gpt, zero, &rank);
  }
  ir_module_free(hand);
  ir_module_free(gpt);
  /* one verdict for all ranks */
  double f = check_bad();
  if (rt_comm_all_reduce(world, IR_F64, &f, 1, err, sizeof err) != 0) f = 1;
  char name[64];
  snprintf(name, sizeof name, "test_dp_mpi on %d rank(s)", W);
  rt_comm_free(rank.group[IR_AXIS_DP]);
  rt_comm_free(world);
  return check_exit_all(name, f);
}
