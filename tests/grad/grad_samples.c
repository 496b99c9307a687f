/* grad_samples.c - finite-difference check of whole sample models at toy
 * size: samples/gpt.mdl and samples/llama.mdl compiled in f64 with tiny
 * config overrides, pass_autodiff, one run of "micro" on fixed tokens and
 * targets, and for every parameter 8 deterministically chosen elements of
 * its gradient against central differences of the forward module's loss
 * (relative error <= 1e-6, as in grad_ops.c).
 *
 * Parameters are the runtime's initial values plus N(0, 0.3^2) noise, so
 * the check does not run at the special point where biases are 0 and gains
 * are 1 (where mistakes in their gradients could hide).  The targets
 * include ignore_index (-1) entries. */
#include "frontend/mdl.h"
#include "gradcheck.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/exec/rt.h"
#include <float.h>

#define NCHECK 8

typedef struct {
  const char *name, *file;
  MdlDefine defs[16];
  int ndefs;
} Sample;

static const Sample samples[] = {
  {"gpt", "samples/gpt.mdl",
   {{"layers", "2"}, {"d_model", "16"}, {"heads", "2"}, {"seq_len", "8"}, {"vocab", "32"},
    {"batch", "2"}, {"micro_batch", "2"}}, 7},
  {"gpt+dropout", "samples/gpt.mdl",   /* masks depend on (step, micro) only: fd sees the same */
   {{"layers", "2"}, {"d_model", "16"}, {"heads", "2"}, {"seq_len", "8"}, {"vocab", "32"},
    {"batch", "2"}, {"micro_batch", "2"}, {"dropout", "0.1"}}, 8},
  {"llama", "samples/llama.mdl",
   {{"layers", "2"}, {"d_model", "16"}, {"heads", "2"}, {"kv_heads", "1"}, {"ffn", "32"},
    {"seq_len", "8"}, {"vocab", "32"}, {"batch", "2"}, {"micro_batch", "2"}}, 9},
  {"moe", "samples/moe.mdl",         /* routing is piecewise constant: fd steps do not flip it */
   {{"layers", "2"}, {"d_model", "16"}, {"heads", "2"}, {"kv_heads", "1"}, {"ffn", "32"},
    {"seq_len", "8"}, {"vocab", "32"}, {"batch", "2"}, {"micro_batch", "2"}, {"experts", "4"},
    {"topk", "2"}, {"z_coef", "0.01"}}, 12},
  {"moe+sigmoid+shared+capacity", "samples/moe.mdl",   /* DeepSeek-V3 gating, 2 shared experts, */
   {{"layers", "2"}, {"d_model", "16"}, {"heads", "2"}, {"kv_heads", "1"}, {"ffn", "32"},  /* C = 4 of 16 tokens */
    {"seq_len", "8"}, {"vocab", "32"}, {"batch", "2"}, {"micro_batch", "2"}, {"experts", "4"},
    {"topk", "2"}, {"z_coef", "0.01"}, {"sigmoid", "true"}, {"shared", "2"}, {"capacity_factor", "0.5"}}, 15},
};

/* The input named `name` of block b: its node (type), or NULL. */
static const IrNode *find_input(const IrModule *m, int b, const char *name) {
  const IrBlock *blk = &m->blocks.a[b];
  for (int i = 0; i < blk->n; i++)
    if (blk->nodes[i].op == IR_OP_INPUT && strcmp(blk->nodes[i].sa, name) == 0) return &blk->nodes[i];
  return NULL;
}

/* NCHECK distinct indices spread over [0, n) (all of them when n <= NCHECK). */
static int pick(int64_t n, uint64_t *rng, int64_t *idx) {
  if (n <= NCHECK) { for (int64_t i = 0; i < n; i++) idx[i] = i; return (int)n; }
  int64_t stride = n / NCHECK;
  for (int k = 0; k < NCHECK; k++) idx[k] = k * stride + (int64_t)(gc_next(rng) % (uint64_t)stride);
  return NCHECK;
}

static int run_sample(const Sample *s) {
  char path[4096], err[1024];
  snprintf(path, sizeof path, "%s/%s", TS_SOURCE_DIR, s->file);
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = s->defs;
  opt.ndefines = s->ndefs;
  opt.precision = IR_F64;
  IrModule *m = mdl_compile_file(path, &opt);
  if (!m) { printf("FAIL %s: %s does not compile\n", s->name, path); return 1; }
  int fails = 0;
  IrModule *fwd = ir_module_clone(m);
  RtProgram *pm = NULL, *pf = NULL;
  int32_t *tok = NULL, *tgt = NULL;
  PassCtx cx;
  memset(&cx, 0, sizeof cx);
  arena_init(&cx.scratch);
  int64_t nmicro = m->train.micro_batch > 0 ? m->train.global_batch / m->train.micro_batch : 0;
  if (nmicro != 1) { printf("FAIL %s: expected one micro-batch per step, got %lld\n", s->name, (long long)nmicro); fails++; goto out; }
  if (pass_autodiff(m, &cx) != 0) { printf("FAIL %s: %s\n", s->name, cx.err); fails++; goto out; }
  if (ir_verify(m, err, sizeof err) != 0) { printf("FAIL %s: verify after autodiff: %s\n", s->name, err); fails++; goto out; }

  /* tokens and targets: deterministic ids < vocab; every 5th target ignored */
  const IrNode *tn = find_input(fwd, 0, "tokens"), *gn = find_input(fwd, 0, "targets");
  if (!tn || !gn) { printf("FAIL %s: no tokens/targets inputs\n", s->name); fails++; goto out; }
  int64_t nt = ir_type_numel(&tn->type), ng = ir_type_numel(&gn->type);
  tok = ts_xmalloc((size_t)nt * sizeof *tok);
  tgt = ts_xmalloc((size_t)ng * sizeof *tgt);
  for (int64_t i = 0; i < nt; i++) tok[i] = (int32_t)((i * 7 + 3) % 32);
  for (int64_t i = 0; i < ng; i++) tgt[i] = i % 5 == 4 ? -1 : (int32_t)((i * 11 + 5) % 32);
  RtFeed feeds[2] = {{"tokens", tok}, {"targets", tgt}};

  pm = rt_program_new(m, err, sizeof err);
  pf = rt_program_new(fwd, err, sizeof err);
  if (!pm || !pf) { printf("FAIL %s: %s\n", s->name, err); fails++; goto out; }
  uint64_t rng = 0x5EED5EED12345ULL;
  for (int p = 0; p < fwd->states.n; p++) {
    if (fwd->states.a[p].kind != IR_STATE_PARAM) continue;
    if (fwd->states.a[p].type.dtype != IR_F64) { printf("FAIL %s: @%s is not f64\n", s->name, fwd->states.a[p].name); fails++; goto out; }
    int64_t n = ir_type_numel(&fwd->states.a[p].type);
    double *a = rt_state_data(pm, p), *b = rt_state_data(pf, p);
    for (int64_t i = 0; i < n; i++) a[i] += 0.3 * gc_normal(&rng);
    memcpy(b, a, (size_t)n * sizeof *a);
  }
  RtRunInfo info = {0, 0, 0.0, 0};
  double lm = gc_loss(pm, ir_block_find(m, "micro"), &info, feeds, 2), lf = gc_loss(pf, 0, &info, feeds, 2);
  if (!(fabs(lm - lf) <= 1e-12 * (1 + fabs(lf)))) { printf("FAIL %s: micro loss %.17g vs forward %.17g\n", s->name, lm, lf); fails++; goto out; }

  /* Central differences round to about eps * |loss| / h; a gradient below
   * 10x that (divided by the tolerance) is compared absolutely, e.g. the
   * key bias, whose true gradient is 0 (softmax ignores a per-query shift)
   * and whose fd is pure rounding noise. */
  double fd_floor = 10 * DBL_EPSILON * fabs(lf) / (GC_H * GC_TOL);
  int nparams = 0, ngrads = 0;
  double worst = 0;
  const char *worst_name = "";
  for (int p = 0; p < fwd->states.n; p++) {
    const IrState *ps = &fwd->states.a[p];
    if (ps->kind != IR_STATE_PARAM) continue;
    nparams++;
    char gname[512];
    snprintf(gname, sizeof gname, "grad.%s", ps->name);
    int gs = ir_state_find(m, gname);
    ngrads += gs >= 0;
    int64_t idx[NCHECK];
    int k = pick(ir_type_numel(&ps->type), &rng, idx);
    double max_fd;
    double e = gc_check(pf, 0, &info, feeds, 2, rt_state_data(pf, p), gs >= 0 ? rt_state_data(pm, gs) : NULL,
                        ir_type_numel(&ps->type), idx, k, fd_floor, &max_fd);
    if (getenv("GC_VERBOSE")) printf("     %-36s rel %.2g  max|fd| %.3g\n", ps->name, e, max_fd);
    if (!(e <= GC_TOL)) {
      printf("FAIL %s: @%s: relative error %.3g (max |fd| %.3g)\n", s->name, ps->name, e, max_fd);
      fails++;
    }
    if (e > worst) worst = e, worst_name = ps->name;
  }
  if (ngrads != nparams) { printf("FAIL %s: %d of %d params got a gradient\n", s->name, ngrads, nparams); fails++; }
  if (!fails) printf("ok   %s: %d params, loss %.6f, max rel err %.2g (@%s), fd floor %.2g\n", s->name, nparams, lf, worst, worst_name, fd_floor);
out:
  rt_program_free(pm);
  rt_program_free(pf);
  free(tok);
  free(tgt);
  arena_free(&cx.scratch);
  ir_module_free(fwd);
  ir_module_free(m);
  return fails;
}

int main(void) {
  int fails = 0;
  for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) fails += run_sample(&samples[i]);
  printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
  return fails ? 1 : 0;
}
