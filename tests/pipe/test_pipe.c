/* test_pipe.c - pipeline partitioning and schedules (passes/partition.c,
 * plan/schedule.c): bubbles and in-flight counts measured on the
 * simulated timelines of the generated schedules, the cross-rank checker
 * on broken schedules, refusals, and the partition of the samples
 * (balance against brute force, --pp-layers, Megatron layouts). */
#include "frontend/mdl.h"
#include "passes/pipe.h"
#include <math.h>
#include "../check.h"

/* ---- schedules ---- */

/* Every rank's bubble, simulated with forward 1 and backward `b`, must be
 * `want`; the schedule must pass the checker. */
static void bubble_case(PipeSchedKind k, int p, int v, int m, double b, double want) {
  PipeSchedule s;
  char err[1024];
  if (plan_pipe_schedule(k, p, v, m, &s, err, sizeof err) != 0) { CHECK(0, "schedule %s p=%d v=%d m=%d: %s",
      plan_pipe_sched_name(k), p, v, m, err); return; }
  CHECK(plan_pipe_check(&s, err, sizeof err) == 0, "check %s p=%d v=%d m=%d: %s", plan_pipe_sched_name(k), p, v, m, err);
  PipeTimeline t;
  if (plan_pipe_simulate(&s, NULL, b, &t, err, sizeof err) != 0) { CHECK(0, "simulate: %s", err); plan_pipe_schedule_free(&s); return; }
  for (int r = 0; r < p; r++) {
    double got = plan_pipe_bubble(&t, r);
    CHECK(fabs(got - want) < 1e-12, "%s p=%d v=%d m=%d b=%g rank %d: bubble %.6f, want %.6f", plan_pipe_sched_name(k),
          p, v, m, b, r, got, want);
    CHECK(fabs(t.busy[r] - (double)m * v * (1 + b)) < 1e-9, "busy %g", t.busy[r]);
  }
  /* in flight: 1F1B's first stage holds at most p micro batches (min(p - r, m) on rank r); GPipe all m */
  for (int r = 0; r < p && k != PIPE_INTERLEAVED; r++) {
    int want_f = k == PIPE_GPIPE ? m : (p - r < m ? p - r : m);
    CHECK(t.peak_micro[r] == want_f, "%s p=%d m=%d rank %d: %d micro batches in flight, want %d",
          plan_pipe_sched_name(k), p, m, r, t.peak_micro[r], want_f);
  }
  if (k == PIPE_1F1B) CHECK(t.peak_micro[0] <= p, "1f1b: first stage holds %d > pp=%d", t.peak_micro[0], p);
  plan_pipe_timeline_free(&t);
  plan_pipe_schedule_free(&s);
}

static void test_bubbles(void) {
  int ps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 5, 8, 12, 16, 32};
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 9; j++) {
      int p = ps[i], m = ms[j];
      bubble_case(PIPE_GPIPE, p, 1, m, 1, (double)(p - 1) / m);
      bubble_case(PIPE_GPIPE, p, 1, m, 2, (double)(p - 1) / m);
      if (m >= p) {
        bubble_case(PIPE_1F1B, p, 1, m, 1, (double)(p - 1) / m);
        bubble_case(PIPE_1F1B, p, 1, m, 2, (double)(p - 1) / m);
      }
    }
  int ip[] = {2, 3, 4, 8}, iv[] = {2, 3, 4};
  for (int i = 0; i < 4; i++)
    for (int a = 0; a < 3; a++)
      for (int mult = 1; mult <= 4; mult++) {
        int p = ip[i], v = iv[a], m = p * mult;
        bubble_case(PIPE_INTERLEAVED, p, v, m, 1, (double)(p - 1) / (v * m));
      }
}

/* Worst rank's bubble and peak in flight of kind k, simulated with F = 1
 * and backward b (zb-h1: B = W = b/2); -1 when it does not build. */
static double worst_bubble(PipeSchedKind k, int p, int m, double b, int *peak, int *peak0) {
  PipeSchedule s;
  PipeTimeline t;
  char err[1024];
  if (plan_pipe_schedule(k, p, 1, m, &s, err, sizeof err) != 0) return -1;
  if (plan_pipe_simulate(&s, NULL, b, &t, err, sizeof err) != 0) { plan_pipe_schedule_free(&s); return -1; }
  double w = 0;
  *peak = 0;
  for (int r = 0; r < p; r++) {
    if (plan_pipe_bubble(&t, r) > w) w = plan_pipe_bubble(&t, r);
    if (t.peak_micro[r] > *peak) *peak = t.peak_micro[r];
  }
  *peak0 = t.peak_micro[0];
  plan_pipe_timeline_free(&t);
  plan_pipe_schedule_free(&s);
  return w;
}

/* zb-h1 (Qi et al. 2023): checked; with F = B = W every rank's bubble is
 * (p-1)/(3m), a third of 1F1B's (p-1)/m, measured on both timelines; no
 * rank holds more micro batches between F and W than 1F1B's first rank
 * (p), and the first rank holds as many as under 1F1B.  With B > W the
 * bubble is the paper's (p-1)(F+B-W) / (m(F+B+W)). */
static void test_zbh1(void) {
  int ps[] = {1, 2, 3, 4, 8}, ms[] = {1, 2, 3, 4, 5, 8, 12, 16, 32};
  char err[1024];
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 9; j++) {
      int p = ps[i], m = ms[j];
      if (m < p) continue;
      PipeSchedule s;
      if (plan_pipe_schedule(PIPE_ZBH1, p, 1, m, &s, err, sizeof err) != 0) { CHECK(0, "zb-h1 p=%d m=%d: %s", p, m, err); continue; }
      CHECK(plan_pipe_check(&s, err, sizeof err) == 0, "check zb-h1 p=%d m=%d: %s", p, m, err);
      CHECK(s.nsteps[0] == 3 * m, "zb-h1 p=%d m=%d: %d steps on rank 0, want F, B and W of each micro batch", p, m,
            s.nsteps[0]);
      PipeTimeline t;
      if (plan_pipe_simulate(&s, NULL, 2, &t, err, sizeof err) == 0) {
        for (int r = 0; r < p; r++) {
          double want = (double)(p - 1) / (3.0 * m);
          CHECK(fabs(plan_pipe_bubble(&t, r) - want) < 1e-12, "zb-h1 p=%d m=%d rank %d: bubble %.6f, want %.6f", p,
                m, r, plan_pipe_bubble(&t, r), want);
          CHECK(fabs(t.busy[r] - 3.0 * m) < 1e-9, "zb-h1 busy %g", t.busy[r]);
        }
        plan_pipe_timeline_free(&t);
      } else CHECK(0, "simulate zb-h1 p=%d m=%d: %s", p, m, err);
      plan_pipe_schedule_free(&s);
      int zp, zp0, fp, fp0;
      double zb = worst_bubble(PIPE_ZBH1, p, m, 2, &zp, &zp0), fb = worst_bubble(PIPE_1F1B, p, m, 2, &fp, &fp0);
      CHECK(zb >= 0 && fb >= 0 && zb <= fb / 3 + 1e-12, "p=%d m=%d: zb-h1 bubble %.6f > a third of 1f1b's %.6f", p, m,
            zb, fb);
      CHECK(zp == fp && zp0 == fp0 && zp <= p, "p=%d m=%d: zb-h1 holds %d micro batches (rank 0: %d), 1f1b %d (%d)",
            p, m, zp, zp0, fp, fp0);
      /* B > W: fwd 1, B 1.2, W 0.8 */
      double *f = ts_xcalloc((size_t)p, sizeof *f), *bb = ts_xcalloc((size_t)p, sizeof *bb),
             *ww = ts_xcalloc((size_t)p, sizeof *ww);
      for (int g = 0; g < p; g++) f[g] = 1, bb[g] = 1.2, ww[g] = 0.8;
      if (plan_pipe_schedule(PIPE_ZBH1, p, 1, m, &s, err, sizeof err) == 0 &&
          plan_pipe_simulate_fbw(&s, f, bb, ww, 2, &t, err, sizeof err) == 0) {
        double want = (p - 1) * (1 + 1.2 - 0.8) / (3.0 * m);
        for (int r = 0; r < p; r++)
          CHECK(fabs(plan_pipe_bubble(&t, r) - want) < 1e-9, "zb-h1 B 1.2 W 0.8 p=%d m=%d rank %d: bubble %.6f, want "
                "%.6f", p, m, r, plan_pipe_bubble(&t, r), want);
        plan_pipe_timeline_free(&t);
      } else CHECK(0, "zb-h1 fbw p=%d m=%d: %s", p, m, err);
      plan_pipe_schedule_free(&s);
      free(f), free(bb), free(ww);
    }
}

static void expect_refusal(PipeSchedKind k, int p, int v, int m, const char *needle) {
  PipeSchedule s;
  char err[1024] = "";
  int rc = plan_pipe_schedule(k, p, v, m, &s, err, sizeof err);
  CHECK(rc != 0, "%s p=%d v=%d m=%d accepted", plan_pipe_sched_name(k), p, v, m);
  if (rc == 0) plan_pipe_schedule_free(&s);
  else CHECK(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
}

static void test_refusals(void) {
  expect_refusal(PIPE_1F1B, 4, 1, 3, "needs at least 4 micro batches per step, and there are 3");
  expect_refusal(PIPE_INTERLEAVED, 4, 2, 6, "micro batches per step (6) to be a multiple of pp=4");
  expect_refusal(PIPE_INTERLEAVED, 4, 1, 8, "--vpp V >= 2");
  expect_refusal(PIPE_1F1B, 4, 2, 8, "use --schedule interleaved");
  expect_refusal(PIPE_ZBH1, 4, 1, 3, "--schedule zb-h1 with pp=4 needs at least 4 micro batches per step, and there "
                 "are 3");
  expect_refusal(PIPE_ZBH1, 2, 2, 4, "--schedule zb-h1 runs one chunk per rank, and vpp=2");
  IrTrain t;
  ir_train_defaults(&t);
  t.global_batch = 12, t.micro_batch = 2;
  int nm = 0;
  char err[512] = "";
  CHECK(plan_pipe_nmicro(&t, 4, &nm, err, sizeof err) != 0 && strstr(err, "global_batch 12 / (micro_batch 2 x dp 4)"),
        "nmicro 12/(2*4): %s", err);
  CHECK(plan_pipe_nmicro(&t, 3, &nm, err, sizeof err) == 0 && nm == 2, "nmicro 12/(2*3) = %d", nm);
}

/* A hand-written schedule from strings like "F0 F1 B0 B1" per rank (v = 1). */
static void make_sched(PipeSchedule *s, int p, int m, const char *const *ranks) {
  memset(s, 0, sizeof *s);
  s->kind = PIPE_1F1B, s->pp = p, s->vpp = 1, s->nmicro = m;
  s->nsteps = ts_xcalloc((size_t)p, sizeof *s->nsteps);
  s->steps = ts_xcalloc((size_t)p, sizeof *s->steps);
  for (int r = 0; r < p; r++) {
    s->steps[r] = ts_xmalloc(64 * sizeof **s->steps);
    for (const char *c = ranks[r]; *c;) {
      if (*c == ' ') { c++; continue; }
      char kind = *c++;
      int micro = (int)strtol(c, (char **)&c, 10);
      s->steps[r][s->nsteps[r]++] = (PipeStep){kind, micro, r};
    }
  }
}

static void expect_broken_kind(PipeSchedKind k, int p, int m, const char *const *ranks, const char *needle) {
  PipeSchedule s;
  make_sched(&s, p, m, ranks);
  s.kind = k;
  char err[1024] = "";
  int rc = plan_pipe_check(&s, err, sizeof err);
  CHECK(rc != 0, "broken schedule accepted (%s / %s)", ranks[0], ranks[1]);
  CHECK(rc == 0 || strstr(err, needle), "message '%s' lacks '%s'", err, needle);
  plan_pipe_schedule_free(&s);
}

static void expect_broken(int p, int m, const char *const *ranks, const char *needle) {
  expect_broken_kind(PIPE_1F1B, p, m, ranks, needle);
}

static void test_checker(void) {
  /* a correct hand-written 1F1B passes */
  const char *ok[] = {"F0 F1 B0 F2 B1 B2", "F0 B0 F1 B1 F2 B2"};
  PipeSchedule s;
  make_sched(&s, 2, 3, ok);
  char err[1024] = "";
  CHECK(plan_pipe_check(&s, err, sizeof err) == 0, "hand-written 1f1b: %s", err);
  plan_pipe_schedule_free(&s);
  /* the second stage takes the micro batches in another order than sent */
  const char *order[] = {"F0 F1 B0 B1", "F1 B1 F0 B0"};
  expect_broken(2, 2, order, "message 1 from rank 0 to rank 1 does not match");
  /* same order on every link, but a cycle of waits: rank 0 waits for B0's
   * gradient while rank 1 waits for micro batch 1's activation */
  const char *cycle[] = {"F0 B0 F1 B1", "F0 F1 B0 B1"};
  expect_broken(2, 2, cycle, "deadlocks: rank 0 at step 1 (B of micro batch 0) waits for the gradient");
  {                                   /* the simulation refuses it too, instead of hanging */
    PipeSchedule c;
    PipeTimeline t;
    make_sched(&c, 2, 2, cycle);
    CHECK(plan_pipe_simulate(&c, NULL, 1, &t, err, sizeof err) != 0 && strstr(err, "deadlocks"), "simulate: %s", err);
    plan_pipe_schedule_free(&c);
  }
  const char *missing[] = {"F0 F1 B0 B1", "F0 F1 B0"};
  expect_broken(2, 2, missing, "rank 1 never runs B of micro batch 1");
  const char *twice[] = {"F0 F0 B0 B1", "F0 F1 B0 B1"};
  expect_broken(2, 2, twice, "twice");
  const char *early[] = {"B0 F0 F1 B1", "F0 F1 B0 B1"};
  expect_broken(2, 2, early, "before its F");
  /* split backward (zb-h1): W after its B, one per (micro, chunk), only there */
  const char *zok[] = {"F0 F1 B0 W0 B1 W1", "F0 B0 F1 B1 W0 W1"};
  make_sched(&s, 2, 2, zok);
  s.kind = PIPE_ZBH1;
  CHECK(plan_pipe_check(&s, err, sizeof err) == 0, "hand-written zb-h1: %s", err);
  plan_pipe_schedule_free(&s);
  const char *wearly[] = {"F0 F1 W0 B0 B1 W1", "F0 B0 F1 B1 W0 W1"};
  expect_broken_kind(PIPE_ZBH1, 2, 2, wearly, "rank 0 step 2 runs W of micro batch 0, chunk 0 before its B");
  const char *wmiss[] = {"F0 F1 B0 W0 B1 W1", "F0 B0 F1 B1 W0"};
  expect_broken_kind(PIPE_ZBH1, 2, 2, wmiss, "rank 1 never runs W of micro batch 1");
  const char *wtwice[] = {"F0 F1 B0 W0 B1 W0", "F0 B0 F1 B1 W0 W1"};
  expect_broken_kind(PIPE_ZBH1, 2, 2, wtwice, "twice");
  expect_broken(2, 2, zok, "W only where the backward is split");
  {   /* a W step sends and receives nothing */
    PipeSchedule z;
    CHECK(plan_pipe_schedule(PIPE_ZBH1, 2, 1, 2, &z, err, sizeof err) == 0, "%s", err);
    PipeOp *zo;
    int nz = plan_pipe_rank_ops(&z, 0, &zo), nw = 0;
    for (int i = 0; i < nz; i++)
      if (z.steps[0][zo[i].step].kind == 'W') {
        nw++;
        CHECK(zo[i].op == PIPE_OP_COMPUTE, "a W step has a message");
      }
    CHECK(nw == 2, "%d W ops on rank 0", nw);
    free(zo);
    plan_pipe_schedule_free(&z);
  }
  /* a generated schedule with one rank's steps swapped is rejected too */
  PipeSchedule g;
  CHECK(plan_pipe_schedule(PIPE_INTERLEAVED, 4, 2, 8, &g, err, sizeof err) == 0, "%s", err);
  PipeStep tmp = g.steps[2][3];
  g.steps[2][3] = g.steps[2][4];
  g.steps[2][4] = tmp;
  CHECK(plan_pipe_check(&g, err, sizeof err) != 0, "interleaved with two steps of rank 2 swapped accepted");
  plan_pipe_schedule_free(&g);
  /* the send/recv ops: 1F1B rank 0 of 2: F0 -> send act to rank 1; B0 <- recv grad */
  PipeSchedule h;
  plan_pipe_schedule(PIPE_1F1B, 2, 1, 2, &h, err, sizeof err);
  PipeOp *ops;
  int n = plan_pipe_rank_ops(&h, 0, &ops);
  CHECK(n == 8 && ops[0].op == PIPE_OP_COMPUTE && ops[1].op == PIPE_OP_SEND && ops[1].peer == 1 && ops[1].what == 'a' &&
        ops[1].micro == 0 && ops[1].edge == 0, "rank 0 ops");
  free(ops);
  n = plan_pipe_rank_ops(&h, 1, &ops);
  CHECK(n == 8 && ops[0].op == PIPE_OP_RECV && ops[0].peer == 0 && ops[2].op == PIPE_OP_COMPUTE && ops[2].what == 'B' &&
        ops[3].op == PIPE_OP_SEND && ops[3].what == 'g', "rank 1 ops: F0 then B0 then its gradient sent");
  free(ops);
  plan_pipe_schedule_free(&h);
}

/* ---- partition ---- */

static IrModule *sample(const char *name, int layers, int vocab, int d) {
  char path[1024], L[16], V[16], D[16];
  snprintf(path, sizeof path, "%s/samples/%s.mdl", TS_SOURCE_DIR, name);
  snprintf(L, sizeof L, "%d", layers), snprintf(V, sizeof V, "%d", vocab), snprintf(D, sizeof D, "%d", d);
  MdlDefine defs[] = {{ts_intern("layers"), L}, {ts_intern("vocab"), V}, {ts_intern("d_model"), D},
                      {ts_intern("heads"), "4"}, {ts_intern("seq_len"), "16"}, {ts_intern("batch"), "8"},
                      {ts_intern("micro_batch"), "2"}};
  MdlOptions o;
  mdl_options_init(&o);
  o.defines = defs, o.ndefines = 7;
  IrModule *m = mdl_compile_file(path, &o);
  CHECK(m != NULL, "cannot compile %s", path);
  return m;
}

static double chunk_cost(const PipePartition *p, int g) {
  double c = 0;
  for (int u = p->chunk_begin[g]; u < p->chunk_begin[g + 1]; u++) c += p->cost[u];
  return c;
}

/* min over all splits of L layers (E with the first, L with the last) into
 * k non-empty chunks of the max chunk cost: brute force over compositions */
static double brute(const PipePartition *p, int k, int first, int at, double sofar) {
  int L = p->nlayers;
  if (k == 1) {
    double c = 0;
    for (int u = at; u < L + 2; u++) c += p->cost[u];
    return fmax(sofar, c);
  }
  double best = INFINITY;
  for (int end = at + 1; end <= L + 1 - (k - 1); end++) {   /* chunk [at, end) of units; at least 1 layer left per chunk */
    if (first && end < 2) continue;
    double c = 0;
    for (int u = at; u < end; u++) c += p->cost[u];
    double v = brute(p, k - 1, 0, end, fmax(sofar, c));
    if (v < best) best = v;
  }
  return best;
}

static void check_monotone(const IrModule *m, const PipePartition *p) {
  const IrBlock *b = &m->blocks.a[ir_block_find(m, "forward")];
  CHECK(p->nnodes == b->n, "nnodes");
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) {
      int v = b->nodes[i].in[k];
      /* leaves and parameter-only values are recomputed where used; what
       * flows between units must flow forward */
      if (b->nodes[v].op == IR_OP_INPUT || b->nodes[v].op == IR_OP_STATE) continue;
      CHECK(p->node_unit[v] <= p->node_unit[i] || p->node_unit[v] == 0,
            "node %%%d (unit %d) reads %%%d of a later unit %d", i, p->node_unit[i], v, p->node_unit[v]);
    }
}

static void test_partition(void) {
  char err[1024] = "";
  const char *names[] = {"gpt", "llama"};
  for (int s = 0; s < 2; s++) {
    IrModule *m = sample(names[s], 8, 64, 32);
    if (!m) continue;
    PipeOptions o = {4, 0, NULL, 0, NULL, NULL};
    PipePartition p;
    if (pass_pipe_partition(m, &o, &p, err, sizeof err) != 0) { CHECK(0, "%s: %s", names[s], err); ir_module_free(m); continue; }
    CHECK(p.nlayers == 8 && p.nunits == 10 && p.nchunks == 4 && strcmp(p.stack, "layers") == 0, "%s: stack", names[s]);
    /* identical layers: the stack layers all cost the same */
    for (int u = 2; u <= 8; u++) CHECK(fabs(p.cost[u] - p.cost[1]) < 1e-6 * p.cost[1], "%s: layer costs differ", names[s]);
    /* every cut between layers carries one hidden state: micro 2 x seq 16 x d 32 x 4 bytes */
    for (int u = 1; u < 8; u++)
      CHECK(p.cut_bytes[u] == 2 * 16 * 32 * 4, "%s: cut %d|%d carries %g bytes", names[s], u, u + 1, p.cut_bytes[u]);
    double best = brute(&p, 4, 1, 0, 0), got = 0;
    for (int g = 0; g < 4; g++) got = fmax(got, chunk_cost(&p, g));
    CHECK(fabs(got - best) <= 1e-9 * best, "%s: max chunk cost %g, brute force %g", names[s], got, best);
    CHECK(p.chunk_begin[0] == 0 && p.chunk_begin[4] == 10, "ends");
    for (int g = 0; g < 4; g++) CHECK(p.chunk_begin[g + 1] - p.chunk_begin[g] >= 1, "empty chunk");
    check_monotone(m, &p);
    /* gpt ties the head to the token embedding: shared by the first and last ranks */
    int tied = 0;
    for (int i = 0; i < p.nshared; i++) tied |= strcmp(p.shared[i], "token_embedding.wte") == 0;
    CHECK(tied == (s == 0), "%s: shared parameters (%d)", names[s], p.nshared);
    pass_pipe_partition_free(&p);
    ir_module_free(m);
  }
  /* a heavy head (big vocab): the balancer gives the last stage fewer layers */
  IrModule *m = sample("gpt", 8, 4096, 32);
  if (m) {
    PipeOptions o = {4, 0, NULL, 0, NULL, NULL};
    PipePartition p;
    if (pass_pipe_partition(m, &o, &p, err, sizeof err) == 0) {
      int last = p.chunk_begin[4] - p.chunk_begin[3] - 1;      /* layers of the last chunk (minus L) */
      CHECK(last < 2, "heavy head: the last stage has %d layers", last);
      double best = brute(&p, 4, 1, 0, 0), got = 0;
      for (int g = 0; g < 4; g++) got = fmax(got, chunk_cost(&p, g));
      CHECK(fabs(got - best) <= 1e-9 * best, "heavy head: max chunk cost %g, brute force %g", got, best);
      pass_pipe_partition_free(&p);
    } else CHECK(0, "%s", err);
    /* vpp 2: 8 chunks, chunk g on rank g % 4 */
    PipeOptions o2 = {4, 2, NULL, 0, NULL, NULL};
    if (pass_pipe_partition(m, &o2, &p, err, sizeof err) == 0) {
      CHECK(p.nchunks == 8 && p.vpp == 2, "vpp 2 chunks");
      pass_pipe_partition_free(&p);
    } else CHECK(0, "vpp 2: %s", err);
    ir_module_free(m);
  }
}

typedef struct { int pp, vpp; const char *layout; int nlayers; const int *layers; const char *error; int begin[12]; } Case;

static void test_overrides(void) {
  IrModule *m = sample("gpt", 8, 64, 32);
  if (!m) return;
  static const int l1[] = {1, 3, 3, 1}, l2[] = {2, 2, 2}, l3[] = {3, 3, 3, 3}, l4[] = {0, 4, 4, 0};
  Case cases[] = {
      {4, 0, NULL, 4, l1, NULL, {0, 2, 5, 8, 10}},
      {4, 0, NULL, 4, l4, NULL, {0, 1, 5, 9, 10}},
      {4, 0, NULL, 3, l2, "--pp-layers has 3 entries but there are pp=4 x vpp=1 = 4 stages", {0}},
      {4, 0, NULL, 4, l3, "--pp-layers places 12 layers but the model's stack has 8", {0}},
      {16, 0, NULL, 0, NULL, "16 stages but the stack 'layers' has only 8 layers", {0}},
      {4, 2, NULL, 0, NULL, "8 stages but the stack 'layers' has only 8 layers", {0}},   /* 8 == 8: allowed */
      {4, 0, "Et*3|t*2|t*2|tL", 0, NULL, NULL, {0, 4, 6, 8, 10}},
      {4, 0, "E||t*8|L", 0, NULL, NULL, {0, 1, 1, 9, 10}},
      {2, 0, "E|(tt|)*3,tt|L", 0, NULL, NULL, {0, 1, 3, 5, 7, 9, 10}},
      {2, 3, "E|(tt|)*3,tt|L", 0, NULL, NULL, {0, 1, 3, 5, 7, 9, 10}},
      {2, 2, "E|(tt|)*3,tt|L", 0, NULL, "has 6 stages but pp=2 x vpp=2 = 4", {0}},
      {4, 0, "Et*3|t*2|t*2|L", 0, NULL, "has 7 transformer layers 't' but the model's stack has 8", {0}},
      {4, 0, "Et*3|t*2|t*2|t*2L", 0, NULL, "has 9 transformer layers", {0}},
      {4, 0, "t*3|Et*2|t*2|tL", 0, NULL, "the embedding E must appear exactly once, as the first symbol", {0}},
      {4, 0, "Et*3|t*2|tL|t*2", 0, NULL, "the loss L must appear exactly once, as the last symbol", {0}},
      {4, 0, "Et*3|t*2|t*2|tmL", 0, NULL, "'m' is an MTP layer", {0}},
      {4, 0, "Et*3|t*2|t*2|tX", 0, NULL, "unexpected character", {0}},
      {4, 0, "Et*3|(t*2|t*2|tL", 0, NULL, "missing ')'", {0}},
      {3, 0, "Et*3|t*2|t*2|tL", 0, NULL, "4 stages, not a multiple of pp=3", {0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Case *c = &cases[i];
    PipeOptions o = {c->pp, c->vpp, c->layers, c->nlayers, c->layout, NULL};
    PipePartition p;
    char err[1024] = "";
    int rc = pass_pipe_partition(m, &o, &p, err, sizeof err);
    int want_ok = !c->error || (c->pp == 4 && c->vpp == 2 && !c->layout);
    if (!want_ok) {
      CHECK(rc != 0, "case %zu accepted", i);
      CHECK(rc == 0 || strstr(err, c->error), "case %zu: '%s' lacks '%s'", i, err, c->error);
      if (rc == 0) pass_pipe_partition_free(&p);
      continue;
    }
    if (rc != 0) { CHECK(0, "case %zu: %s", i, err); continue; }
    if (!c->error)
      for (int g = 0; g <= p.nchunks; g++)
        CHECK(p.chunk_begin[g] == c->begin[g], "case %zu: chunk_begin[%d] = %d, want %d", i, g, p.chunk_begin[g],
              c->begin[g]);
    pass_pipe_partition_free(&p);
  }
  ir_module_free(m);
  /* no repeat stack at all */
  MdlOptions o;
  mdl_options_init(&o);
  IrModule *flat = mdl_compile_string(
      "model f(x: f32[b=2, d=4], t: i32[b=2]) {\n  w = param [d, d] init normal(0.02)\n"
      "  return mean(cross_entropy(x @ w, t))\n}\n", "flat.mdl", &o);
  CHECK(flat != NULL, "the flat model does not compile");
  if (flat) {
    PipeOptions po = {2, 0, NULL, 0, NULL, NULL};
    PipePartition p;
    char err[1024] = "";
    CHECK(pass_pipe_partition(flat, &po, &p, err, sizeof err) != 0 && strstr(err, "no repeat stack"), "flat: %s", err);
    ir_module_free(flat);
  }
}

int main(void) {
  test_bubbles();
  test_zbh1();
  test_refusals();
  test_checker();
  test_partition();
  test_overrides();
  return check_exit("test_pipe");
}
