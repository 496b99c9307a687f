/* test_rt_exec.c - the runtime around the kernels: the executor (feeds,
 * state aliasing, effects, outputs, errors), counter-based initialization
 * (against an independent implementation of the documented formula;
 * independence from state order; normal statistics), the LR schedule,
 * AdamW against a hand computation, the byte data pipeline, and a small
 * model trained end to end through autodiff, the optimizer pass, rt_train
 * and (given its path as argv[1]) the mrun binary. */
#include "rt_test.h"
#include "passes/passes.h"
#include "runtime/exec/train.h"
#include <limits.h>
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[2048];

static IrState mkstate(const char *name, IrType t, IrStateKind kind, IrInitKind init, double a, double b) {
  IrState s;
  memset(&s, 0, sizeof s);
  s.name = name;
  s.type = t;
  s.kind = kind;
  s.init = init;
  s.init_a = a;
  s.init_b = b;
  s.of = -1;
  return s;
}

static int emit(IrModule *m, int b, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
                const char *sa, const IrType *t) {
  int r = ir_emit(m, b, op, in, nin, ia, fa, sa, t, err, sizeof err);
  if (r < 0 && !(ir_ops[op].flags & OPF_EFFECT)) TS_DIE("test module: %s", err);
  return r;
}

/* ---- executor ---- */
static void test_executor(void) {
  IrModule *m = ir_module_new("exec");
  IrType t3 = TY(IR_F32, 3);
  int acc = ir_state_add(m, &(IrState){.name = "acc", .type = t3, .kind = IR_STATE_PARAM, .init = IR_INIT_ZEROS, .of = -1});
  int b = ir_block_add(m, "b");
  int x = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t3);
  int y = emit(m, b, IR_OP_MULS, &x, 1, NULL, (double[]){2.0}, NULL, NULL);
  emit(m, b, IR_OP_ACCUM, &y, 1, (int64_t[]){acc}, NULL, NULL, NULL);
  int st = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){acc}, NULL, NULL, &t3);
  int ss = emit(m, b, IR_OP_SUMSQ, &st, 1, NULL, NULL, NULL, NULL);
  emit(m, b, IR_OP_OUTPUT, &ss, 1, NULL, NULL, "ss", NULL);
  int z = ir_block_add(m, "z");
  emit(m, z, IR_OP_ZERO, NULL, 0, (int64_t[]){acc}, NULL, NULL, NULL);
  if (ir_verify(m, err, sizeof err) != 0) TS_DIE("verify: %s", err);

  RtProgram *p = rt_program_new(m, err, sizeof err);
  TS_ASSERT(p);
  CHECK(((uintptr_t)rt_state_data(p, acc) & 63) == 0, "state data is not 64-byte aligned");
  float xv[3] = {1, -2, 0.5f};
  RtFeed f = {"x", xv};
  double v;
  CHECK(rt_run_block(p, b, &f, 1, NULL, err, sizeof err) == 0, "run: %s", err);
  CHECK(rt_run_block(p, b, &f, 1, NULL, err, sizeof err) == 0, "run 2: %s", err);
  const float *a = rt_state_data(p, acc);
  for (int i = 0; i < 3; i++) CHECK(a[i] == 4 * xv[i], "acc[%d] = %g after two runs, expected %g", i, a[i], 4 * xv[i]);
  /* the STATE node aliases the state: sumsq sees the accumulated values */
  CHECK(rt_output(p, "ss", &v) == 0 && fabs(v - 16 * (1 + 4 + 0.25)) < 1e-4, "output ss = %g", v);
  CHECK(rt_output(p, "nope", &v) == -1, "an output never reported must be -1");
  rt_outputs_clear(p);
  CHECK(rt_output(p, "ss", &v) == -1, "rt_outputs_clear did not forget ss");
  /* a missing feed is an error naming the input */
  err[0] = 0;
  CHECK(rt_run_block(p, b, NULL, 0, NULL, err, sizeof err) == -1 && strstr(err, "\"x\""),
        "missing input: expected an error naming \"x\", got '%s'", err);
  RtFeed wrong = {"y", xv};
  CHECK(rt_run_block(p, b, &wrong, 1, NULL, err, sizeof err) == -1 && strstr(err, "\"x\""),
        "wrong input name: got '%s'", err);
  CHECK(rt_run_block(p, z, NULL, 0, NULL, err, sizeof err) == 0, "zero: %s", err);
  for (int i = 0; i < 3; i++) CHECK(a[i] == 0, "acc[%d] = %g after zero", i, a[i]);
  CHECK(rt_run_block(p, 7, NULL, 0, NULL, err, sizeof err) == -1, "block 7 does not exist");
  rt_program_free(p);
  ir_module_free(m);
}

/* ---- the backward of one attention in one pass ----
 * Block b takes q, k, v, o, do as inputs and accumulates attention_bwd
 * parts 0, 1, 2 (or a subset) into states.  The LLVM backend runs the
 * parts as ONE launch (plan_attn_grad_runs, rt_attn_grads_run); the
 * reference runs each part on its own: the gradients must be the same
 * bits, and the run must exist (counted in the stats) when two or more
 * parts are there, and not when a reader of an early part sits between
 * them. */
static void attn_grads_case(IrDtype dt, int causal, int nparts, int reader_between) {
  enum { B = 2, HQ = 4, HKV = 2, T = 70, D = 8 };
  IrModule *m = ir_module_new("attn_grads");
  IrType tq = TY(dt, B, HQ, T, D), tk = TY(dt, B, HKV, T, D);
  const IrType *pt[3] = {&tq, &tk, &tk};
  int st[3];
  for (int p = 0; p < nparts; p++) {
    char name[16];
    snprintf(name, sizeof name, "g%d", p);
    st[p] = ir_state_add(m, &(IrState){.name = name, .type = *pt[p], .kind = IR_STATE_PARAM,
                                       .init = IR_INIT_ZEROS, .of = -1});
  }
  int b = ir_block_add(m, "b");
  const char *names[5] = {"q", "k", "v", "o", "do"};
  const IrType *it[5] = {&tq, &tk, &tk, &tq, &tq};
  int in[5];
  for (int i = 0; i < 5; i++) in[i] = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, names[i], it[i]);
  int g[3];
  double scale = 0.3;
  for (int p = 0; p < nparts; p++) {
    g[p] = emit(m, b, IR_OP_ATTENTION_BWD, in, 5, (int64_t[]){causal, p, 0, 0, 0}, &scale, NULL, NULL);
    if (reader_between && p == 0) {   /* a reader of dq before the other parts: no run */
      int ss = emit(m, b, IR_OP_SUMSQ, &g[0], 1, NULL, NULL, NULL, NULL);
      emit(m, b, IR_OP_OUTPUT, &ss, 1, NULL, NULL, "dq_ss", NULL);
    }
  }
  for (int p = 0; p < nparts; p++) emit(m, b, IR_OP_ACCUM, &g[p], 1, (int64_t[]){st[p]}, NULL, NULL, NULL);
  if (ir_verify(m, err, sizeof err) != 0) TS_DIE("verify: %s", err);
  size_t es = ir_dtype_size(dt);
  void *data[5];
  RtFeed f[5];
  uint64_t r = 12345;
  for (int i = 0; i < 5; i++) {
    int64_t n = ir_type_numel(it[i]);
    data[i] = ts_xmalloc((size_t)n * es);
    for (int64_t j = 0; j < n; j++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      double u = (double)(r >> 11) / 9007199254740992.0 * 2 - 1;
      if (dt == IR_F64) ((double *)data[i])[j] = u;
      else ((float *)data[i])[j] = (float)u;
    }
    f[i] = (RtFeed){names[i], data[i]};
  }
  RtRank rank = rt_rank_single();
  RtExecOpts ol = {.backend = RT_BACKEND_LLVM}, orf = {.backend = RT_BACKEND_REF};
  RtProgram *pl = rt_program_new_opts(m, &rank, &ol, err, sizeof err);
  CHECK(pl != NULL, "llvm program: %s", err);
  RtProgram *pr = rt_program_new_opts(m, &rank, &orf, err, sizeof err);
  CHECK(pr != NULL, "ref program: %s", err);
  if (pl && pr) {
    RtExecStats s;
    rt_program_exec_stats(pl, &s);
    int want = nparts >= 2 && !reader_between;   /* with 3 parts, 1 and 2 could still pair */
    CHECK(s.attn_grads == want, "%s causal=%d parts=%d reader=%d: %d attention backwards in one pass, expected %d",
          ir_dtype_name(dt), causal, nparts, reader_between, s.attn_grads, want);
    CHECK(rt_run_block(pl, b, f, 5, NULL, err, sizeof err) == 0, "llvm run: %s", err);
    CHECK(rt_run_block(pr, b, f, 5, NULL, err, sizeof err) == 0, "ref run: %s", err);
    for (int p = 0; p < nparts; p++) {
      int64_t n = ir_type_numel(pt[p]), bad = -1;
      const unsigned char *x = rt_state_data(pl, st[p]), *y = rt_state_data(pr, st[p]);
      double mx = 0;
      for (int64_t j = 0; j < n; j++) {
        double a = dt == IR_F64 ? ((const double *)x)[j] : ((const float *)x)[j];
        if (memcmp(x + j * es, y + j * es, es) != 0 && bad < 0) bad = j;
        mx = fmax(mx, fabs(a));
      }
      CHECK(bad < 0, "%s causal=%d parts=%d: part %d differs from the reference at element %lld",
            ir_dtype_name(dt), causal, nparts, p, (long long)bad);
      CHECK(mx > 1e-3, "part %d is all (near) zero: %g", p, mx);
    }
  }
  rt_program_free(pl);
  rt_program_free(pr);
  for (int i = 0; i < 5; i++) free(data[i]);
  ir_module_free(m);
}

static void test_attn_grads(void) {
  for (int dt = 0; dt < 2; dt++)
    for (int causal = 0; causal < 2; causal++) {
      attn_grads_case(dt ? IR_F64 : IR_F32, causal, 3, 0);
      attn_grads_case(dt ? IR_F64 : IR_F32, causal, 2, 0);
    }
  attn_grads_case(IR_F32, 1, 1, 0);
  attn_grads_case(IR_F32, 1, 2, 1);
}

/* ---- initialization: an independent implementation of rng.c's formula ---- */
static uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double u_of(uint64_t seed, const char *name, uint64_t i, uint64_t draw) {
  uint64_t nh = 0xcbf29ce484222325ull;
  for (const char *c = name; *c; c++) { nh ^= (unsigned char)*c; nh *= 0x100000001b3ull; }
  uint64_t w[5] = {1, seed, nh, i, draw}, h = 0x6a09e667f3bcc909ull;
  for (int k = 0; k < 5; k++) h = mix(h ^ w[k]);
  return (double)(h >> 11) / 9007199254740992.0;
}

static void test_init(void) {
  IrType big = TY(IR_F32, 256, 256), small = TY(IR_F64, 10, 3);
  IrModule *a = ir_module_new("a"), *b = ir_module_new("b");
  a->train.seed = b->train.seed = 77;
  IrState wa = mkstate("layers.0.w", big, IR_STATE_PARAM, IR_INIT_NORMAL, 0.5, 2.0);
  IrState ua = mkstate("u", small, IR_STATE_PARAM, IR_INIT_UNIFORM, -3.0, 1.0);
  IrState oa = mkstate("g", small, IR_STATE_PARAM, IR_INIT_ONES, 0, 0);
  IrState ga = mkstate("grad.u", small, IR_STATE_GRAD, IR_INIT_ONES, 0, 0);
  int aw = ir_state_add(a, &wa), au = ir_state_add(a, &ua);
  /* b: other states first, different order */
  ir_state_add(b, &oa);
  int bu = ir_state_add(b, &ua);
  ir_state_add(b, &ga);
  int bw = ir_state_add(b, &wa);
  RtProgram *pa = rt_program_new(a, err, sizeof err), *pb = rt_program_new(b, err, sizeof err);
  TS_ASSERT(pa && pb);
  CHECK(memcmp(rt_state_data(pa, aw), rt_state_data(pb, bw), 256 * 256 * 4) == 0,
        "parameter values depend on the other states");
  CHECK(memcmp(rt_state_data(pa, au), rt_state_data(pb, bu), 30 * 8) == 0, "uniform values depend on state order");
  const float *w = rt_state_data(pa, aw);
  const double *u = rt_state_data(pa, au);
  /* the documented formula, element by element */
  int bad = 0;
  for (int i = 0; i < 256 * 256; i++) {
    double z = sqrt(-2 * log(1 - u_of(77, "layers.0.w", i, 0))) * cos(2 * M_PI * u_of(77, "layers.0.w", i, 1));
    if (w[i] != (float)(0.5 + 2.0 * z)) bad++;   /* bit for bit: the same libm */
  }
  CHECK(bad == 0, "%d normal elements differ from the documented formula", bad);
  for (int i = 0; i < 30; i++) {
    double want = -3.0 + 4.0 * u_of(77, "u", i, 0);
    CHECK(u[i] == want, "uniform element %d = %.17g, expected %.17g", i, u[i], want);
    CHECK(u[i] >= -3 && u[i] < 1, "uniform element %d out of range", i);
  }
  /* statistics of normal(0.5, 2.0) over 65536 elements */
  double s = 0, s2 = 0;
  for (int i = 0; i < 256 * 256; i++) { s += w[i]; s2 += (double)w[i] * w[i]; }
  double mean = s / 65536, sd = sqrt(s2 / 65536 - mean * mean);
  CHECK(fabs(mean - 0.5) < 0.04, "normal mean %.4f, expected 0.5", mean);
  CHECK(fabs(sd - 2.0) < 0.03, "normal std %.4f, expected 2.0", sd);
  /* ones for params; grads start at zero whatever their init field says */
  const double *g1 = rt_state_data(pb, 0), *gg = rt_state_data(pb, 2);
  int ones = 1, zeros = 1;
  for (int i = 0; i < 30; i++) { ones &= g1[i] == 1.0; zeros &= gg[i] == 0.0; }
  CHECK(ones, "init=ones is not all ones");
  CHECK(zeros, "a grad state is not zero at start");
  /* another seed gives other values */
  b->train.seed = 78;
  RtProgram *pc = rt_program_new(b, err, sizeof err);
  CHECK(memcmp(rt_state_data(pa, aw), rt_state_data(pc, bw), 256 * 256 * 4) != 0, "the seed does not matter");
  rt_program_free(pa);
  rt_program_free(pb);
  rt_program_free(pc);
  ir_module_free(a);
  ir_module_free(b);
}

/* ---- LR schedule ---- */
static void test_lr(void) {
  IrTrain t;
  ir_train_defaults(&t);
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.warmup = 10;
  t.steps = 110;
  t.schedule = IR_SCHED_COSINE;
  CHECK_NEAR(rt_lr_at(&t, 0, 0), 1e-4, 1e-12, "warmup step 0");
  CHECK_NEAR(rt_lr_at(&t, 4, 0), 5e-4, 1e-12, "warmup step 4");
  CHECK_NEAR(rt_lr_at(&t, 9, 0), 1e-3, 1e-12, "warmup step 9");
  CHECK_NEAR(rt_lr_at(&t, 10, 0), 1e-3, 1e-12, "cosine start");
  CHECK_NEAR(rt_lr_at(&t, 60, 0), 1e-4 + 0.5 * 9e-4, 1e-12, "cosine middle");
  CHECK_NEAR(rt_lr_at(&t, 35, 0), 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI * 0.25)), 1e-12, "cosine quarter");
  CHECK_NEAR(rt_lr_at(&t, 110, 0), 1e-4, 1e-12, "cosine end");
  CHECK_NEAR(rt_lr_at(&t, 500, 0), 1e-4, 1e-12, "after the end");
  t.decay_steps = 60;
  CHECK_NEAR(rt_lr_at(&t, 35, 0), 1e-4 + 0.5 * 9e-4, 1e-12, "cosine with decay_steps");
  t.schedule = IR_SCHED_LINEAR;
  t.decay_steps = 0;
  CHECK_NEAR(rt_lr_at(&t, 35, 0), 1e-3 - 9e-4 * 0.25, 1e-12, "linear quarter");
  CHECK_NEAR(rt_lr_at(&t, 110, 0), 1e-4, 1e-12, "linear end");
  t.schedule = IR_SCHED_CONSTANT;
  CHECK_NEAR(rt_lr_at(&t, 3, 0), 4e-4, 1e-12, "constant warmup");
  CHECK_NEAR(rt_lr_at(&t, 90, 0), 1e-3, 1e-12, "constant");
  t.warmup = 0;
  t.schedule = IR_SCHED_COSINE;
  CHECK_NEAR(rt_lr_at(&t, 0, 0), 1e-3, 1e-12, "cosine without warmup");
}

/* ---- AdamW: two steps against a hand computation ---- */
static void test_adamw(IrDtype dt) {
  IrModule *m = ir_module_new("adam");
  IrType t = TY(dt, 5);
  IrState sp = mkstate("w", t, IR_STATE_PARAM, IR_INIT_UNIFORM, -1, 1);
  int p = ir_state_add(m, &sp);
  IrState sg = mkstate("grad.w", t, IR_STATE_GRAD, 0, 0, 0), sm = sg, sv = sg;
  sg.of = sm.of = sv.of = p;
  sm.name = "adam_m.w";
  sm.kind = IR_STATE_ADAM_M;
  sv.name = "adam_v.w";
  sv.kind = IR_STATE_ADAM_V;
  int g = ir_state_add(m, &sg), mm = ir_state_add(m, &sm), vv = ir_state_add(m, &sv);
  int b = ir_block_add(m, "update");
  IrType sc = scalar_ty(dt);
  int c = emit(m, b, IR_OP_FULL, NULL, 0, NULL, (double[]){0.5}, NULL, &sc);
  double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = 0.01;
  IrType gty = m->states.a[g].type;
  int gv = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){g}, NULL, NULL, &gty);
  emit(m, b, IR_OP_ADAMW, (int[]){c, gv}, 2, (int64_t[]){p, mm, vv}, (double[]){b1, b2, eps, wd}, NULL, NULL);
  RtProgram *pr = rt_program_new(m, err, sizeof err);
  TS_ASSERT(pr);
  double w[5], M[5] = {0}, V[5] = {0}, gr[5];
  double *w0 = from_dtype(rt_state_data(pr, p), 5, dt);
  memcpy(w, w0, sizeof w);
  free(w0);
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < 5; i++) gr[i] = 0.3 * (i - 2) + step;
    void *gd = to_dtype(gr, 5, dt);
    memcpy(rt_state_data(pr, g), gd, 5 * ir_dtype_size(dt));
    free(gd);
    RtRunInfo info = {step, 0, lr, 0};
    CHECK(rt_run_block(pr, b, NULL, 0, &info, err, sizeof err) == 0, "adamw: %s", err);
    for (int i = 0; i < 5; i++) {
      double gg = gr[i] * 0.5;
      M[i] = b1 * M[i] + (1 - b1) * gg;
      V[i] = b2 * V[i] + (1 - b2) * gg * gg;
      double mh = M[i] / (1 - pow(b1, step + 1)), vh = V[i] / (1 - pow(b2, step + 1));
      w[i] -= lr * (mh / (sqrt(vh) + eps) + wd * w[i]);
    }
    double *got = from_dtype(rt_state_data(pr, p), 5, dt), *gm = from_dtype(rt_state_data(pr, mm), 5, dt);
    for (int i = 0; i < 5; i++) {
      CHECK_NEAR(got[i], w[i], tol_of(dt), "adamw %s step %d param %d", ir_dtype_name(dt), step, i);
      CHECK_NEAR(gm[i], M[i], tol_of(dt), "adamw %s step %d m %d", ir_dtype_name(dt), step, i);
    }
    free(got);
    free(gm);
  }
  rt_program_free(pr);
  ir_module_free(m);
}

/* ---- ZeRO: adamw on the rank's flat chunk.  Param w[5], dp = 2, chunks
 * of 3: rank 0 updates elements 0..2, rank 1 elements 3..4 (its chunk's
 * last slot is padding).  One step against the hand computation. ---- */
static void test_adamw_flat(IrDtype dt) {
  for (int c = 0; c < 2; c++) {
    IrModule *m = ir_module_new("zero");
    m->par.dp = 2;
    IrState sp = mkstate("w", TY(dt, 5), IR_STATE_PARAM, IR_INIT_UNIFORM, -1, 1);
    int p = ir_state_add(m, &sp);
    IrState sm = mkstate("adam_m.w", TY(dt, 3), IR_STATE_ADAM_M, 0, 0, 0), sv = sm;
    sm.of = sv.of = p;
    sm.sh.flat = sv.sh.flat = 1u << IR_AXIS_DP;
    sv.name = "adam_v.w";
    sv.kind = IR_STATE_ADAM_V;
    int mm = ir_state_add(m, &sm), vv = ir_state_add(m, &sv);
    int b = ir_block_add(m, "update");
    IrType sc = scalar_ty(dt), gt = TY(dt, 3);
    int coef = emit(m, b, IR_OP_FULL, NULL, 0, NULL, (double[]){1.0}, NULL, &sc);
    int g = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "g", &gt);
    CHECK(emit(m, b, IR_OP_ADAMW, (int[]){coef, g}, 2, (int64_t[]){p, mm, vv}, (double[]){0.9, 0.95, 1e-8, 0}, NULL, NULL) >= 0,
          "emit flat adamw: %s", err);
    RtRank r = rt_rank_single();
    r.mesh.dp = 2;
    r.coord[IR_AXIS_DP] = c;
    RtProgram *pr = rt_program_new_rank(m, &r, err, sizeof err);
    TS_ASSERT(pr);
    double *w0 = from_dtype(rt_state_data(pr, p), 5, dt), gr[3] = {0.5, -0.25, 2.0};
    void *gd = to_dtype(gr, 3, dt);
    RtFeed f = {"g", gd};
    RtRunInfo info = {0, 0, 0.01, 0};
    CHECK(rt_run_block(pr, b, &f, 1, &info, err, sizeof err) == 0, "flat adamw: %s", err);
    double *w1 = from_dtype(rt_state_data(pr, p), 5, dt);
    for (int i = 0; i < 5; i++) {
      int k = i - 3 * c;   /* slot in this rank's chunk */
      /* first step: m^ = g, v^ = g^2, so the step is lr * g / (|g| + eps) */
      double want = k >= 0 && k < 3 ? w0[i] - 0.01 * gr[k] / (fabs(gr[k]) + 1e-8) : w0[i];
      CHECK_NEAR(w1[i], want, tol_of(dt), "flat adamw %s rank %d element %d", ir_dtype_name(dt), c, i);
    }
    free(w0);
    free(w1);
    free(gd);
    rt_program_free(pr);
    ir_module_free(m);
  }
}

/* ---- sharded initialization: a rank's block of a split (and padded)
 * parameter equals that block of the single-rank parameter; padding is 0 */
static void test_init_sharded(void) {
  IrModule *full = ir_module_new("full"), *pad5 = ir_module_new("pad5");
  IrState w = mkstate("wte", TY(IR_F64, 6, 4), IR_STATE_PARAM, IR_INIT_NORMAL, 0, 1);
  ir_state_add(full, &w);
  IrState w5 = w;
  w5.type.dim[0] = 5;
  ir_state_add(pad5, &w5);
  RtProgram *pf = rt_program_new(full, err, sizeof err), *p5 = rt_program_new(pad5, err, sizeof err);
  TS_ASSERT(pf && p5);
  const double *W = rt_state_data(pf, 0), *W5 = rt_state_data(p5, 0);
  for (int padded = 0; padded < 2; padded++)
    for (int c = 0; c < 2; c++) {
      IrModule *m = ir_module_new("shard");
      m->par.tp = 2;
      IrState ws = w;
      ws.type.dim[0] = 3;
      ws.sh.split[0] = 1u << IR_AXIS_TP;
      if (padded) ws.logical[0] = 5;   /* global 6 rows = 5 + one row of padding */
      ir_state_add(m, &ws);
      RtRank r = rt_rank_single();
      r.mesh.tp = 2;
      r.coord[IR_AXIS_TP] = c;
      RtProgram *ps = rt_program_new_rank(m, &r, err, sizeof err);
      TS_ASSERT(ps);
      const double *L = rt_state_data(ps, 0);
      int bad = 0;
      for (int i = 0; i < 12; i++) {
        int row = 3 * c + i / 4;
        double want = !padded ? W[row * 4 + i % 4] : row < 5 ? W5[row * 4 + i % 4] : 0.0;
        bad += L[i] != want;
      }
      CHECK(bad == 0, "sharded init (%s) rank %d: %d elements differ from the single-rank block",
            padded ? "padded" : "split", c, bad);
      rt_program_free(ps);
      ir_module_free(m);
    }
  /* a rank outside the mesh, or a mesh the module was not made for */
  RtRank r = rt_rank_single();
  r.mesh.tp = 2;
  CHECK(!rt_program_new_rank(full, &r, err, sizeof err) && strstr(err, "compiled for tp=1"),
        "tp=2 rank for a tp=1 module should be refused, got '%s'", err);
  rt_program_free(pf);
  rt_program_free(p5);
  ir_module_free(full);
  ir_module_free(pad5);
}

/* ---- a tokens input split along the sequence over tp = 2: each rank is
 * fed its block of the global micro batch.  The model's loss is the sum of
 * the squared token values it was fed, so the reported loss shows which
 * tokens arrived: it must equal the same sum over the block of the global
 * batch, averaged over the micro batches. ---- */
static void test_train_split_input(void) {
  const char *path = "rt_split.txt";
  IrType lt = TY(IR_I32, 2, 4), ft = TY(IR_F64, 2, 4);
  RtCorpus cor;
  TS_ASSERT(rt_corpus_open(&cor, path, err, sizeof err) == 0);
  for (int c = 0; c < 2; c++) {
    IrModule *m = ir_module_new("split");
    m->par.tp = 2;
    m->train.global_batch = 4;
    m->train.micro_batch = 2;
    m->train.steps = 1;
    m->train.seed = 5;
    int b = ir_block_add(m, "micro");
    int tok = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "tokens", &lt);
    m->blocks.a[b].nodes[tok].sh.split[1] = 1u << IR_AXIS_TP;
    int f = emit(m, b, IR_OP_CAST, &tok, 1, NULL, NULL, NULL, &ft);
    int sq = emit(m, b, IR_OP_SUMSQ, &f, 1, NULL, NULL, NULL, NULL);
    emit(m, b, IR_OP_OUTPUT, &sq, 1, NULL, NULL, "loss", NULL);
    ir_block_add(m, "update");
    RtRank r = rt_rank_single();
    r.mesh.tp = 2;
    r.coord[IR_AXIS_TP] = c;
    RtTrainOpts o = {.data_path = path, .quiet = 1, .rank = &r};
    RtTrainResult res;
    CHECK(rt_train(m, &o, &res, err, sizeof err) == 0, "split input rank %d: %s", c, err);
    double want = 0;
    int32_t gt[16];
    for (int g = 0; g < 2; g++) {   /* global micro g: rows [2g, 2g+2), columns [4c, 4c+4) */
      TS_ASSERT(rt_corpus_batch(&cor, 5, 0, 2 * g, 2, 8, gt, NULL, err, sizeof err) == 0);
      for (int row = 0; row < 2; row++)
        for (int j = 4 * c; j < 4 * c + 4; j++) want += (double)gt[row * 8 + j] * gt[row * 8 + j];
    }
    CHECK_NEAR(res.first_loss, want / 2, 1e-12, "split input rank %d: fed the wrong block", c);
    ir_module_free(m);
  }
  rt_corpus_free(&cor);
}

/* ---- assign: state = x ---- */
static void test_assign(void) {
  IrModule *m = ir_module_new("assign");
  IrState st = mkstate("s", TY(IR_F32, 3), IR_STATE_PARAM, IR_INIT_ONES, 0, 0);
  int s = ir_state_add(m, &st);
  int b = ir_block_add(m, "update");
  IrType t = TY(IR_F32, 3);
  int x = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  emit(m, b, IR_OP_ASSIGN, &x, 1, (int64_t[]){s}, NULL, NULL, NULL);
  RtProgram *p = rt_program_new(m, err, sizeof err);
  TS_ASSERT(p);
  float xv[3] = {2.5f, -1.0f, 0.125f};
  RtFeed f = {"x", xv};
  CHECK(rt_run_block(p, b, &f, 1, NULL, err, sizeof err) == 0, "assign: %s", err);
  CHECK(memcmp(rt_state_data(p, s), xv, sizeof xv) == 0, "assign did not copy x into the state");
  rt_program_free(p);
  ir_module_free(m);
}

/* ---- data ---- */
static const char *write_corpus(const char *path, size_t n) {
  FILE *f = fopen(path, "wb");
  TS_ASSERT(f);
  static const char text[] = "the cat sat on the mat. ";
  for (size_t i = 0; i < n; i++) fputc(text[i % (sizeof text - 1)], f);
  fclose(f);
  return path;
}

static void test_data(void) {
  RtCorpus c;
  CHECK(rt_corpus_open(&c, "/nonexistent/corpus.txt", err, sizeof err) == -1 && strstr(err, "corpus"),
        "a missing corpus must be refused: '%s'", err);
  write_corpus("rt_corpus.txt", 5000);
  TS_ASSERT(rt_corpus_open(&c, "rt_corpus.txt", err, sizeof err) == 0);
  enum { R = 3, T = 16 };
  int32_t tok[R * T], tgt[R * T], tok2[R * T], tgt2[R * T];
  CHECK(rt_corpus_batch(&c, 5, 2, 6, R, T, tok, tgt, err, sizeof err) == 0, "batch: %s", err);
  CHECK(rt_corpus_batch(&c, 5, 2, 6, R, T, tok2, tgt2, err, sizeof err) == 0, "batch: %s", err);
  CHECK(memcmp(tok, tok2, sizeof tok) == 0 && memcmp(tgt, tgt2, sizeof tgt) == 0, "batches are not deterministic");
  int shifted = 1, inrange = 1;
  for (int r = 0; r < R; r++)
    for (int t = 0; t + 1 < T; t++) shifted &= tgt[r * T + t] == tok[r * T + t + 1];
  for (int i = 0; i < R * T; i++) inrange &= tok[i] >= 0 && tok[i] < 256;
  CHECK(shifted, "targets are not the tokens shifted by one");
  CHECK(inrange, "tokens are not bytes");
  /* the window of row r is found in the corpus at its documented offset */
  uint64_t w[4] = {3, 5, 2, 7}, h = 0x6a09e667f3bcc909ull;
  for (int k = 0; k < 4; k++) h = mix(h ^ w[k]);
  size_t off = (size_t)(h % (5000 - T - 1));
  int at = 1;
  for (int t = 0; t < T; t++) at &= tok[1 * T + t] == c.bytes[off + t] && tgt[1 * T + t] == c.bytes[off + t + 1];
  CHECK(at, "row 1 (global row 7) is not at the documented offset %zu", off);
  CHECK(rt_corpus_batch(&c, 5, 3, 6, R, T, tok2, tgt2, err, sizeof err) == 0 && memcmp(tok, tok2, sizeof tok) != 0,
        "another step gives the same batch");
  rt_corpus_free(&c);
  write_corpus("rt_short.txt", T + 1);
  TS_ASSERT(rt_corpus_open(&c, "rt_short.txt", err, sizeof err) == 0);
  CHECK(rt_corpus_batch(&c, 5, 0, 0, R, T, tok, tgt, err, sizeof err) == -1, "a corpus of T + 1 bytes must be refused");
  rt_corpus_free(&c);
  /* what has no size to draw windows from is refused by name, at once (a
   * FIFO is not waited on) */
  static const struct { const char *path, *why; } bad[] = {
    {".", "a directory"}, {"/dev/null", "a device"}, {"rt_fifo", "a pipe"}, {"rt_empty.txt", "is empty"}};
  TS_ASSERT(mkfifo("rt_fifo", 0600) == 0);
  FILE *f = fopen("rt_empty.txt", "w");
  TS_ASSERT(f && fclose(f) == 0);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK(rt_corpus_open(&c, bad[i].path, err, sizeof err) == -1 && strstr(err, bad[i].path) && strstr(err, bad[i].why),
          "corpus %s: want an error saying '%s', got '%s'", bad[i].path, bad[i].why, err);
  /* a corpus far larger than memory is mapped, never read whole: a 100 GiB
   * sparse file opens and gives batches with the resident set a few MB
   * larger (the pages the windows touch) */
  int fd = open("rt_huge.txt", O_CREAT | O_WRONLY | O_TRUNC, 0600);
  TS_ASSERT(fd >= 0);
  if (ftruncate(fd, (off_t)100 << 30) != 0) {
    printf("test_rt_exec: this filesystem has no 100 GiB sparse files (%s): the large-corpus check is skipped\n",
           strerror(errno));
  } else {
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    int ok = rt_corpus_open(&c, "rt_huge.txt", err, sizeof err) == 0;
    CHECK(ok, "a 100 GiB corpus: %s", err);
    for (int s = 0; ok && s < 50; s++) ok = rt_corpus_batch(&c, 5, s, 0, R, T, tok, tgt, err, sizeof err) == 0;
    CHECK(ok && c.len == (size_t)100 << 30 && tok[0] == 0, "batches of a 100 GiB corpus: %s", err);
    getrusage(RUSAGE_SELF, &ru1);
    CHECK(ru1.ru_maxrss - ru0.ru_maxrss < 64 * 1024, "a 100 GiB corpus grew the resident set by %ld KiB",
          ru1.ru_maxrss - ru0.ru_maxrss);
    rt_corpus_free(&c);
  }
  close(fd);
  remove("rt_huge.txt");
}

/* ---- end to end: a bigram model, tokens i32[4, 16] ->
 *      logits = embedding(wte[256, 32], tokens) @ w_out[32, 256] + b[256]
 *      loss = mean(cross_entropy(logits, targets)) ---- */
static IrModule *bigram(int64_t steps, int nan_loss, IrDtype dt) {
  IrModule *m = ir_module_new("bigram");
  m->train.global_batch = 8;
  m->train.micro_batch = 4;
  m->train.seq_len = 16;
  m->train.steps = steps;
  m->train.lr = 3e-2;
  m->train.clip_grad = 1.0;
  m->train.weight_decay = 0.0;
  m->train.seed = 9;
  m->train.precision = dt;
  IrType it = TY(IR_I32, 4, 16), wt = TY(dt, 256, 32), ot = TY(dt, 32, 256), bt = TY(dt, 256);
  int wte = ir_state_add(m, &(IrState){.name = "wte", .type = wt, .kind = IR_STATE_PARAM, .init = IR_INIT_NORMAL, .init_b = 0.1, .of = -1});
  int wo = ir_state_add(m, &(IrState){.name = "w_out", .type = ot, .kind = IR_STATE_PARAM, .init = IR_INIT_NORMAL, .init_b = 0.1, .of = -1});
  int bo = ir_state_add(m, &(IrState){.name = "b_out", .type = bt, .kind = IR_STATE_PARAM, .init = IR_INIT_ZEROS, .of = -1, .flags = IR_STATE_NODECAY});
  int b = ir_block_add(m, "forward");
  int tok = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "tokens", &it);
  int tgt = emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "targets", &it);
  int e = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){wte}, NULL, NULL, &wt);
  int x = emit(m, b, IR_OP_EMBEDDING, (int[]){e, tok}, 2, NULL, NULL, NULL, NULL);
  int w = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){wo}, NULL, NULL, &ot);
  int lg = emit(m, b, IR_OP_MATMUL, (int[]){x, w}, 2, (int64_t[]){0, 0}, NULL, NULL, NULL);
  int bb = emit(m, b, IR_OP_STATE, NULL, 0, (int64_t[]){bo}, NULL, NULL, &bt);
  IrType lt = m->blocks.a[b].nodes[lg].type;
  int bb3 = emit(m, b, IR_OP_BROADCAST, &bb, 1, NULL, NULL, NULL, &lt);
  int lg2 = emit(m, b, IR_OP_ADD, (int[]){lg, bb3}, 2, NULL, NULL, NULL, NULL);
  int ce = emit(m, b, IR_OP_CROSS_ENTROPY, (int[]){lg2, tgt}, 2, (int64_t[]){-1}, NULL, NULL, NULL);
  int l1 = emit(m, b, IR_OP_MEAN, &ce, 1, (int64_t[]){1, 0}, NULL, NULL, NULL);
  int loss = emit(m, b, IR_OP_MEAN, &l1, 1, (int64_t[]){0, 0}, NULL, NULL, NULL);
  if (nan_loss) {   /* log of a negative number */
    int neg = emit(m, b, IR_OP_MULS, &loss, 1, NULL, (double[]){-1.0}, NULL, NULL);
    loss = emit(m, b, IR_OP_LOG, &neg, 1, NULL, NULL, NULL, NULL);
  }
  emit(m, b, IR_OP_OUTPUT, &loss, 1, NULL, NULL, "loss", NULL);
  PassCtx cx;
  pass_ctx_init(&cx);
  if (pass_autodiff(m, &cx) != 0 || pass_optimizer(m, &cx) != 0) TS_DIE("passes: %s", cx.err);
  pass_ctx_free(&cx);
  TS_ASSERT(ir_verify(m, err, sizeof err) == 0);
  return m;
}

static int count_lines(const char *path, int *with_keys) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  *with_keys = 0;
  while (fgets(line, sizeof line, f)) {
    n++;
    if (strstr(line, "\"step\"") && strstr(line, "\"loss\"") && strstr(line, "\"lr\"") &&
        strstr(line, "\"grad_norm\"") && strstr(line, "\"tokens_per_s\"") && strstr(line, "\"elapsed_s\""))
      (*with_keys)++;
  }
  fclose(f);
  return n;
}

static void test_train(const char *mrun) {
  write_corpus("rt_train.txt", 20000);
  IrModule *m = bigram(40, 0, IR_F32);
  RtTrainOpts o = {.data_path = "rt_train.txt", .metrics_path = "rt_metrics.jsonl", .quiet = 1};
  RtTrainResult r;
  CHECK(rt_train(m, &o, &r, err, sizeof err) == 0, "train: %s", err);
  CHECK(r.steps == 40, "trained %lld steps", (long long)r.steps);
  CHECK(fabs(r.first_loss - log(256)) < 0.3, "first loss %.4f is not near ln 256", r.first_loss);
  CHECK(r.last_loss < 0.5 * r.first_loss, "loss %.4f -> %.4f did not fall by half", r.first_loss, r.last_loss);
  CHECK(isfinite(r.last_grad_norm) && r.last_grad_norm > 0, "grad norm %g", r.last_grad_norm);
  int keys, n = count_lines("rt_metrics.jsonl", &keys);
  CHECK(n == 40 && keys == 40, "metrics: %d lines, %d with all keys", n, keys);
  /* the same run again gives the same losses (deterministic) */
  RtTrainResult r2;
  ir_module_free(m);
  m = bigram(40, 0, IR_F32);
  o.metrics_path = NULL;
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == 0 && r2.last_loss == r.last_loss,
        "a second identical run ends at %.9g, not %.9g", r2.last_loss, r.last_loss);
  /* a corpus shorter than seq_len + 2 is refused */
  write_corpus("rt_short.txt", 17);
  o.data_path = "rt_short.txt";
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == -1 && strstr(err, "seq_len"), "short corpus: '%s'", err);

  /* mrun on the module's text */
  if (mrun) {
    StrBuf sb = {0};
    ir_print_module(m, &sb);
    FILE *f = fopen("rt_bigram.ir", "w");
    TS_ASSERT(f);
    fwrite(sb.p, 1, sb.n, f);
    fclose(f);
    sb_free(&sb);
    char cmd[4096];
    remove("rt_mrun.jsonl");
    snprintf(cmd, sizeof cmd, "'%s' rt_bigram.ir --steps 5 --data rt_train.txt --metrics rt_mrun.jsonl --seed 3 > rt_mrun.out 2>&1", mrun);
    int rc = system(cmd);
    n = count_lines("rt_mrun.jsonl", &keys);
    CHECK(rc == 0 && n == 5 && keys == 5, "mrun: exit %d, %d metric lines (see rt_mrun.out)", rc, n);
    snprintf(cmd, sizeof cmd, "grep -q 'step    5/5 | loss ' rt_mrun.out && grep -q 'using 1 CPU rank' rt_mrun.out");
    CHECK(system(cmd) == 0, "mrun's progress line or GPU line is missing (see rt_mrun.out)");
    snprintf(cmd, sizeof cmd, "'%s' rt_bigram.ir --steps 2 --data rt_short.txt > rt_mrun2.out 2>&1", mrun);
    rc = system(cmd);
    CHECK(rc != 0, "mrun with a too-short corpus must fail");
  }
  ir_module_free(m);

  /* the same model in f64 trains too (every kernel's f64 instance) */
  m = bigram(20, 0, IR_F64);
  o.data_path = "rt_train.txt";
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == 0, "f64 train: %s", err);
  CHECK(r2.steps == 20 && r2.last_loss < r2.first_loss - 1.0, "f64 loss %.4f -> %.4f", r2.first_loss, r2.last_loss);
  ir_module_free(m);

  /* a NaN loss stops training with an error naming the step */
  m = bigram(5, 1, IR_F32);
  o.data_path = "rt_train.txt";
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == -1 && strstr(err, "step 1") && strstr(err, "nan"),
        "nan loss: '%s'", err);
  ir_module_free(m);

  /* loss_mask is fed as all ones: loss = mean(mask) must be exactly 1; an
   * update block that reports no grad norm gives NaN there, not an error */
  m = ir_module_new("mask");
  m->train.global_batch = m->train.micro_batch = 2;
  m->train.steps = 2;
  int mb = ir_block_add(m, "micro");
  ir_block_add(m, "update");
  IrType ti = TY(IR_I32, 2, 8), tm = TY(IR_F32, 2, 8);
  emit(m, mb, IR_OP_INPUT, NULL, 0, NULL, NULL, "tokens", &ti);
  emit(m, mb, IR_OP_INPUT, NULL, 0, NULL, NULL, "targets", &ti);
  int mk = emit(m, mb, IR_OP_INPUT, NULL, 0, NULL, NULL, "loss_mask", &tm);
  int m1 = emit(m, mb, IR_OP_MEAN, &mk, 1, (int64_t[]){1, 0}, NULL, NULL, NULL);
  int m0 = emit(m, mb, IR_OP_MEAN, &m1, 1, (int64_t[]){0, 0}, NULL, NULL, NULL);
  emit(m, mb, IR_OP_OUTPUT, &m0, 1, NULL, NULL, "loss", NULL);
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == 0 && r2.last_loss == 1.0 && isnan(r2.last_grad_norm),
        "loss_mask: %s (loss %g, grad norm %g)", err, r2.last_loss, r2.last_grad_norm);
  ir_module_free(m);

  /* a model input the data pipeline does not provide is refused */
  m = ir_module_new("odd");
  int b = ir_block_add(m, "micro");
  ir_block_add(m, "update");
  IrType it = TY(IR_F32, 2, 3);
  emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "pixels", &it);
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == -1 && strstr(err, "\"pixels\""), "unknown input: '%s'", err);
  ir_module_free(m);
  m = ir_module_new("nomicro");
  CHECK(rt_train(m, &o, &r2, err, sizeof err) == -1 && strstr(err, "micro"), "no micro block: '%s'", err);
  ir_module_free(m);
}

/* The data and mrun tests write files: they run in a scratch directory of
 * their own (never the caller's directory), kept when a check fails so
 * rt_mrun.out can be read, removed when every check passes. */
static char scratch[] = "/tmp/ts_rt_exec.XXXXXX";

static void scratch_enter(void) {
  TS_ASSERT(mkdtemp(scratch) && chdir(scratch) == 0);
}

static void scratch_leave(int failed) {
  if (failed) {
    fprintf(stderr, "test_rt_exec: files kept in %s\n", scratch);
    return;
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", scratch);
  if (chdir("/") != 0 || system(cmd) != 0) fprintf(stderr, "test_rt_exec: could not remove %s\n", scratch);
}

int main(int argc, char **argv) {
  char mrun[4096] = "";
  if (argc > 1 && !realpath(argv[1], mrun)) snprintf(mrun, sizeof mrun, "%s", argv[1]);
  scratch_enter();
  test_executor();
  test_attn_grads();
  test_init();
  test_lr();
  test_adamw(IR_F32);
  test_adamw(IR_F64);
  test_adamw_flat(IR_F32);
  test_adamw_flat(IR_F64);
  test_init_sharded();
  test_assign();
  write_corpus("rt_split.txt", 5000);
  test_train_split_input();
  test_data();
  test_train(mrun[0] ? mrun : NULL);
  int rc = check_exit("test_rt_exec");
  scratch_leave(rc != 0);
  return rc;
}
