/* test_fuse_opt.c - AdamW as one pass over all parameters and GEMM bias
 * epilogues (issue 4), on the LLVM backend against the reference:
 *   1. a hand-written update block whose adamw nodes must be cut into
 *      runs (a node between two of them reads a parameter the first one
 *      wrote; another adamw has a different b1): the runs, the memory
 *      plan's launch positions, and the states after 3 steps bit for bit
 *      equal to the reference's per-tensor AdamW;
 *   2. both samples at tiny size, f32 and f64: the epilogue groups of the
 *      fused micro block (one per `x @ W + b`, counted independently on
 *      the IR), run through BLAS; 3 training steps where the LLVM
 *      program's update block (ONE AdamW launch per step) gets the
 *      reference's gradients and must then leave parameters and moments
 *      bit-identical to the reference's; the losses on the way within
 *      1e-6 (f32) / 1e-12 (f64).
 * The whole-run equivalences (fused / --no-fuse / reference) are equiv.sh. */
#include "frontend/mdl.h"
#include "passes/memreport.h"
#include "passes/passes.h"
#include "plan/groups.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include "../check.h"

/* ---- 1. runs on a hand-written update block ---- */
static const char *runs_ir =
    "module runs\n"
    "train lr=0.01 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=1.0 global_batch=2 micro_batch=2 seq_len=4 steps=3 seed=11 precision=f64\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n"
    "state @w1 : f64[40, 50] param init=normal(0.0, 0.5)\n"
    "state @w2 : f64[300] param init=normal(0.0, 0.5)\n"
    "state @w3 : f64[7, 9] param init=uniform(-1.0, 1.0)\n"
    "state @w4 : f64[11] param init=normal(0.0, 0.5)\n"
    "state @g1 : f64[40, 50] grad of=@w1\n"
    "state @g2 : f64[300] grad of=@w2\n"
    "state @g3 : f64[7, 9] grad of=@w3\n"
    "state @g4 : f64[11] grad of=@w4\n"
    "state @m1 : f64[40, 50] adam_m of=@w1\n"
    "state @m2 : f64[300] adam_m of=@w2\n"
    "state @m3 : f64[7, 9] adam_m of=@w3\n"
    "state @m4 : f64[11] adam_m of=@w4\n"
    "state @v1 : f64[40, 50] adam_v of=@w1\n"
    "state @v2 : f64[300] adam_v of=@w2\n"
    "state @v3 : f64[7, 9] adam_v of=@w3\n"
    "state @v4 : f64[11] adam_v of=@w4\n"
    "block update {\n"
    "  %0 = input \"c\" : f64[]\n"
    "  %1 = state @g1 : f64[40, 50]\n"
    "  adamw %0, %1 @w1 @m1 @v1 b1=0.9 b2=0.95 eps=1e-08 wd=0.1\n"
    "  %3 = state @w1 : f64[40, 50]\n"
    "  %4 = sumsq %3 : f64[]\n"
    "  output \"s\" %4\n"
    "  %6 = state @g2 : f64[300]\n"
    "  adamw %0, %6 @w2 @m2 @v2 b1=0.9 b2=0.95 eps=1e-08 wd=0.0\n"
    "  %8 = state @g3 : f64[7, 9]\n"
    "  adamw %0, %8 @w3 @m3 @v3 b1=0.9 b2=0.95 eps=1e-08 wd=0.1\n"
    "  %10 = state @g4 : f64[11]\n"
    "  adamw %0, %10 @w4 @m4 @v4 b1=0.8 b2=0.95 eps=1e-08 wd=0.1\n"
    "}\n"
    "end\n";

static RtProgram *program(const IrModule *m, RtBackend be) {
  RtRank r = rt_rank_single();
  RtExecOpts o = {.backend = be, .threads = 2};
  char err[512];
  RtProgram *p = rt_program_new_opts(m, &r, &o, err, sizeof err);
  if (!p) { printf("program: %s\n", err); exit(1); }
  return p;
}

/* Every state of kind `kind` (or every state, kind < 0): bytes equal in
 * both programs?  Names the first that differs. */
static int states_equal(const IrModule *m, RtProgram *a, RtProgram *b, int kind, const char *what) {
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (kind >= 0 && (int)st->kind != kind) continue;
    size_t bytes = (size_t)ir_type_numel(&st->type) * ir_dtype_size(st->type.dtype);
    int same = memcmp(rt_state_data(a, s), rt_state_data(b, s), bytes) == 0;
    CHECK(same, "%s: state @%s differs between the LLVM backend and the reference", what, st->name);
    if (!same) return 0;
  }
  return 1;
}

/* Deterministic gradients for step `step`, the same in both programs. */
static void fill_grads(const IrModule *m, RtProgram *p, int step) {
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind != IR_STATE_GRAD) continue;
    int64_t n = ir_type_numel(&st->type);
    for (int64_t i = 0; i < n; i++) {
      double v = sin(0.37 * (double)i + 1.3 * s + 0.7 * step) * 0.05;
      if (st->type.dtype == IR_F64) ((double *)rt_state_data(p, s))[i] = v;
      else ((float *)rt_state_data(p, s))[i] = (float)v;
    }
  }
}

static void test_runs(void) {
  char err[512];
  IrModule *m = ir_parse_module(runs_ir, "<runs>", err, sizeof err);
  if (!m) { printf("parse: %s\n", err); exit(1); }
  const IrBlock *b = &m->blocks.a[0];
  int run[16], want[] = {-1, -1, 2, -1, -1, -1, -1, 9, -1, 9, -1, 11};
  CHECK(b->n == 12, "runs snippet has %d nodes", b->n);
  CHECK(plan_opt_runs(b, run) == 3, "want 3 runs");
  for (int i = 0; i < b->n && i < 12; i++) CHECK(run[i] == want[i], "%%%d: run at %d, want %d", i, run[i], want[i]);
  /* the memory plan runs them where the executor does */
  int at[16];
  plan_mem_group_at(b, at);
  CHECK(at[2] == 2 && at[7] == 9 && at[9] == 9 && at[11] == 11 && at[0] == 0, "memplan at[] %d %d %d %d", at[2], at[7],
        at[9], at[11]);

  RtProgram *ref = program(m, RT_BACKEND_REF), *jit = program(m, RT_BACKEND_LLVM);
  double c = 0.7;
  RtFeed f = {"c", &c};
  for (int step = 0; step < 3; step++) {
    fill_grads(m, ref, step);
    fill_grads(m, jit, step);
    RtRunInfo info = {step, 0, 0.01 * (step + 1), 0};
    CHECK(rt_run_block(ref, 0, &f, 1, &info, err, sizeof err) == 0, "ref: %s", err);
    CHECK(rt_run_block(jit, 0, &f, 1, &info, err, sizeof err) == 0, "llvm: %s", err);
    double s1 = NAN, s2 = NAN;
    rt_output(ref, "s", &s1);
    rt_output(jit, "s", &s2);
    /* the sum of squares of w1 AFTER its update: a separate run */
    CHECK(fabs(s1 - s2) <= 1e-12 * fabs(s1), "step %d: sumsq of the updated w1 %.17g vs %.17g", step, s1, s2);
  }
  states_equal(m, ref, jit, -1, "runs snippet after 3 steps");
  RtExecStats st;
  rt_program_exec_stats(jit, &st);
  CHECK(st.opt_runs == 3 && st.opt_tensors == 4 && st.opt_launches == 9,
        "runs snippet: %d runs of %d tensors, %lld launches (want 3, 4, 9)", st.opt_runs, st.opt_tensors,
        st.opt_launches);
  rt_program_free(ref);
  rt_program_free(jit);
  ir_module_free(m);
}

/* ---- 2. the samples ---- */

/* `x @ W + b` in block b, counted on the IR alone: adds with a broadcast
 * operand whose other operand is a matmul, or a reshape of one, used
 * only there. */
static int count_bias_adds(const IrBlock *b) {
  int *uses = calloc((size_t)b->n + 1, sizeof *uses), cnt = 0;
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) uses[b->nodes[i].in[k]]++;
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op != IR_OP_ADD) continue;
    for (int s = 0; s < 2; s++) {
      int x = n->in[s], y = n->in[1 - s];
      if (b->nodes[y].op != IR_OP_BROADCAST || uses[y] != 1 || uses[x] != 1) continue;
      while (b->nodes[x].op == IR_OP_RESHAPE && uses[x] == 1) x = b->nodes[x].in[0];
      if (b->nodes[x].op == IR_OP_MATMUL && uses[x] == 1) { cnt++; break; }
    }
  }
  free(uses);
  return cnt;
}

/* The epilogue groups of block b: groups that are exactly one epilogue. */
static int count_epilogue_groups(const IrBlock *b) {
  int cnt = 0;
  for (int i = 0; i < b->n; i++) {
    int g = b->nodes[i].group, last = 1;
    if (g <= 0) continue;
    for (int j = i + 1; j < b->n; j++) last &= b->nodes[j].group != g;
    if (!last) continue;
    PlanEpilogue e;
    int mem[PLAN_EPILOGUE_MAX_RESHAPES + 3], n = 0, ok = 1;
    if (!plan_epilogue_match(b, i, &e)) continue;
    int k = plan_epilogue_members(&e, mem);
    for (int j = 0; j <= i; j++)
      if (b->nodes[j].group == g) ok &= n < k && mem[n++] == j;
    cnt += ok && n == k;
  }
  return cnt;
}

static int block_index(const IrModule *m, const char *name) {
  for (int i = 0; i < m->blocks.n; i++)
    if (strcmp(m->blocks.a[i].name, name) == 0) return i;
  return -1;
}

static void test_sample(const char *model, IrDtype prec, int layers, int want_epilogues) {
  char path[1024], err[512], what[128];
  snprintf(path, sizeof path, "%s/samples/%s.mdl", TS_SOURCE_DIR, model);
  snprintf(what, sizeof what, "%s %s", model, ir_dtype_name(prec));
  char L[16];
  snprintf(L, sizeof L, "%d", layers);
  MdlDefine tiny[] = {{"layers", L}, {"d_model", "32"}, {"heads", "4"}, {"seq_len", "16"}, {"vocab", "64"},
                      {"batch", "2"}, {"micro_batch", "2"}, {"kv_heads", "2"}, {"ffn", "64"}};
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = tiny;
  opt.ndefines = strcmp(model, "llama") == 0 ? 9 : 7;   /* GQA and the SwiGLU width are llama's */
  opt.precision = prec;
  IrModule *m = mdl_compile_file(path, &opt);
  if (!m) { CHECK(0, "%s does not compile", path); return; }
  /* no clipping in effect (coefficient exactly 1 on both backends): the
   * update's inputs are then the gradients alone, which the test makes
   * equal, so its outputs must be equal bit for bit */
  m->train.clip_grad = 1e30;
  PassCtx cx;
  pass_ctx_init(&cx);
  if (pass_run_pipeline(m, &cx) != 0) { printf("pipeline: %s\n", cx.err); exit(1); }
  pass_ctx_free(&cx);
  int mi = block_index(m, "micro"), ui = block_index(m, "update");
  if (mi < 0 || ui < 0) { CHECK(0, "%s: no micro or update block", what); ir_module_free(m); return; }

  const IrBlock *mb = &m->blocks.a[mi], *ub = &m->blocks.a[ui];
  int nepi = count_epilogue_groups(mb), nbias = count_bias_adds(mb), nadam = 0;
  CHECK(nepi == nbias && nepi == want_epilogues, "%s: %d epilogue groups, %d `x @ W + b` in the IR, want %d", what,
        nepi, nbias, want_epilogues);
  for (int i = 0; i < ub->n; i++) nadam += ub->nodes[i].op == IR_OP_ADAMW;

  RtProgram *ref = program(m, RT_BACKEND_REF), *jit = program(m, RT_BACKEND_LLVM);
  int64_t ntok = 0;
  for (int i = 0; i < mb->n; i++)
    if (mb->nodes[i].op == IR_OP_INPUT) ntok = ir_type_numel(&mb->nodes[i].type);
  int32_t *tok = malloc((size_t)ntok * sizeof *tok), *tgt = malloc((size_t)ntok * sizeof *tgt);
  double tol = prec == IR_F32 ? 1e-6 : 1e-12;
  for (int step = 0; step < 3; step++) {
    for (int64_t i = 0; i < ntok; i++) {
      tok[i] = (int32_t)((i * 7 + step * 13 + 3) % 64);
      tgt[i] = (int32_t)((i * 5 + step * 11 + 1) % 64);
    }
    RtFeed f[2] = {{"tokens", tok}, {"targets", tgt}};
    RtRunInfo info = {step, 0, rt_lr_at(&m->train, step, 0), 0};   /* (no ramp-up: the samples are not read) */
    double l1 = NAN, l2 = NAN;
    CHECK(rt_run_block(ref, mi, f, 2, &info, err, sizeof err) == 0, "%s ref micro: %s", what, err);
    CHECK(rt_run_block(jit, mi, f, 2, &info, err, sizeof err) == 0, "%s llvm micro: %s", what, err);
    rt_output(ref, "loss", &l1);
    rt_output(jit, "loss", &l2);
    CHECK(isfinite(l1) && fabs(l1 - l2) <= tol * fabs(l1), "%s step %d: loss %.17g vs reference %.17g", what, step, l2,
          l1);
    /* the reference's gradients into the LLVM program: the same input */
    for (int s = 0; s < m->states.n; s++)
      if (m->states.a[s].kind == IR_STATE_GRAD)
        memcpy(rt_state_data(jit, s), rt_state_data(ref, s),
               (size_t)ir_type_numel(&m->states.a[s].type) * ir_dtype_size(m->states.a[s].type.dtype));
    CHECK(rt_run_block(ref, ui, NULL, 0, &info, err, sizeof err) == 0, "%s ref update: %s", what, err);
    CHECK(rt_run_block(jit, ui, NULL, 0, &info, err, sizeof err) == 0, "%s llvm update: %s", what, err);
  }
  states_equal(m, ref, jit, -1, what);
  RtExecStats st;
  rt_program_exec_stats(jit, &st);
  CHECK(st.opt_runs == 1 && st.opt_tensors == nadam && st.opt_launches == 3,
        "%s: %d AdamW runs over %d tensors, %lld launches (want 1 over %d, 3)", what, st.opt_runs, st.opt_tensors,
        st.opt_launches, nadam);
  /* compiled: micro's and the forward-only eval block's (pass eval); run:
   * micro's, once per step */
  int ei = block_index(m, "eval"), neval = ei >= 0 ? count_epilogue_groups(&m->blocks.a[ei]) : 0;
  CHECK(ei >= 0 && neval == want_epilogues, "%s: %d epilogue groups in block eval, want %d", what, neval,
        want_epilogues);
  CHECK(st.epilogues == want_epilogues + neval && st.epilogue_gemms == 3LL * want_epilogues,
        "%s: %d epilogue kernels run %lld times (want %d, %d)", what, st.epilogues, st.epilogue_gemms,
        want_epilogues + neval, 3 * want_epilogues);
  CHECK(st.fallbacks == 0, "%s: %d groups fell back to the reference", what, st.fallbacks);
  printf("%s: %d epilogue groups, %d adamw nodes in one launch per step, %d kernels\n", what, nepi, nadam, st.kernels);
  free(tok);
  free(tgt);
  rt_program_free(ref);
  rt_program_free(jit);
  ir_module_free(m);
}

int main(void) {
  test_runs();
  /* GPT: q, k, v, o and the two MLP layers have biases (6 per layer);
   * Llama has none */
  test_sample("gpt", IR_F32, 2, 12);
  test_sample("gpt", IR_F64, 2, 12);
  test_sample("llama", IR_F32, 2, 0);
  test_sample("llama", IR_F64, 2, 0);
  return check_exit("test_fuse_opt");
}
