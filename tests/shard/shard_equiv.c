/* shard_equiv.c - the sharding pass against the unsharded program, one
 * micro block at a time, under mpirun with TP ranks:
 *
 *   mpirun -np TP*CP*EP shard_equiv FILE TP SP [--cp=CP] [--ep=EP] [name=value ...]
 *
 * Every rank compiles the model twice in f64: unsharded (tp = 1) and with
 * the given tp / sp, runs the micro block (forward, backward, gradient
 * accumulation) of both on the same tokens, and compares
 *   - the loss, and
 *   - every gradient: the rank's local block (all-reduced first when the
 *     gradient state is a partial sum over tp) against the same block of
 *     the unsharded gradient; padding (vocab not divisible by tp) must be 0.
 * The worst relative error (per tensor, relative to its largest entry, with
 * a floor of 1e-6 x the largest gradient entry of the model, for gradients
 * that are exactly zero in exact arithmetic such as attention key biases)
 * must stay below 1e-10.  Parameters are not compared directly: their blocks come
 * from the counter-based initializer, and any difference shows in the loss.
 * This tests passes/shard.c alone: no optimizer, no trainer, no mrun. */
#include "frontend/mdl.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/rt.h"
#include "runtime/exec/rt_priv.h"
#include <math.h>

static IrModule *compile(const char *file, int tp, int sp, int cp, int ep, const MdlDefine *defs, int nd) {
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = defs;
  opt.ndefines = nd;
  opt.tp = tp;
  opt.sp = sp;
  opt.cp = cp;
  opt.ep = ep;
  opt.precision = IR_F64;
  IrModule *m = mdl_compile_file(file, &opt);
  if (!m) return NULL;
  PassCtx cx;
  pass_ctx_init(&cx);
  if (pass_run_pipeline(m, &cx)) {
    fprintf(stderr, "shard_equiv: tp=%d sp=%d: %s\n", tp, sp, cx.err);
    ir_module_free(m);
    m = NULL;
  }
  pass_ctx_free(&cx);
  return m;
}

/* Deterministic tokens / targets for the micro block's inputs. */
static int32_t *make_ids(const IrModule *m, const char *name, int64_t vocab, int ignore_every) {
  const IrBlock *b = &m->blocks.a[ir_block_find(m, "micro")];
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op != IR_OP_INPUT || strcmp(n->sa, name)) continue;
    int64_t cnt = ir_type_numel(&n->type);
    int32_t *v = ts_xcalloc((size_t)cnt, sizeof *v);
    for (int64_t k = 0; k < cnt; k++)
      v[k] = ignore_every && k % ignore_every == 3 ? -1 : (int32_t)((k * 7919 + (name[0] == 't' && name[1] == 'a') * 13) % vocab);
    return v;
  }
  return NULL;
}

static int64_t vocab_of(const IrModule *m) {
  for (int i = 0; i < m->consts.n; i++)
    if (strcmp(m->consts.a[i].name, "vocab") == 0) return m->consts.a[i].i;
  return 0;
}

/* Worst relative error of sharded gradient state s (rank-local data d)
 * against the unsharded state data `ref` of type rt. */
static double compare_block(const IrState *s, const double *d, const IrType *rt, const double *ref,
                            const RtRank *rk, double floor_, int *nonzero_pad) {
  const IrType *lt = &s->type;
  double scale = floor_;
  int64_t rn = ir_type_numel(rt);
  for (int64_t i = 0; i < rn; i++) scale = fmax(scale, fabs(ref[i]));
  double worst = 0;
  int64_t n = ir_type_numel(lt);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, g[IR_MAX_RANK];
    for (int k = lt->rank - 1; k >= 0; k--) { g[k] = rem % lt->dim[k]; rem /= lt->dim[k]; }
    int pad = 0;
    int64_t flat = 0;
    for (int k = 0; k < lt->rank; k++) {
      /* the global index as the runtime lays the dim out (blocks, outer
       * axes major; the zigzag at the cp level) */
      g[k] = rt_global_index(rk, s->sh.split[k], lt->dim[k], g[k]);
      if (g[k] >= rt->dim[k]) pad = 1;
      flat = flat * rt->dim[k] + (pad ? 0 : g[k]);
    }
    if (pad) { if (d[i] != 0) *nonzero_pad = 1; continue; }
    worst = fmax(worst, fabs(d[i] - ref[flat]) / scale);
  }
  return worst;
}

int main(int argc, char **argv) {
  char err[1024];
  RtComm *w = rt_comm_init_mpi(&argc, &argv, 60, err, sizeof err);
  if (!w) { fprintf(stderr, "shard_equiv: %s\n", err); return 1; }
  if (argc < 4) { fprintf(stderr, "usage: shard_equiv FILE TP SP [name=value ...]\n"); return 2; }
  int T = atoi(argv[2]), sp = atoi(argv[3]), C = 1, E = 1, mask0 = 0;
  int me = rt_comm_rank(w);
  MdlDefine defs[32];
  int nd = 0;
  for (int i = 4; i < argc && nd < 32; i++) {
    if (strncmp(argv[i], "--cp=", 5) == 0) { C = atoi(argv[i] + 5); continue; }
    if (strncmp(argv[i], "--ep=", 5) == 0) { E = atoi(argv[i] + 5); continue; }
    if (strcmp(argv[i], "--mask-cp-rank0") == 0) { mask0 = 1; continue; }
    char *eq = strchr(argv[i], '=');
    if (!eq) continue;
    *eq = 0;
    defs[nd++] = (MdlDefine){argv[i], eq + 1};
  }
  if (rt_comm_size(w) != T * C * E) { fprintf(stderr, "shard_equiv: run with -np %d\n", T * C * E); return 2; }
  IrModule *ref = compile(argv[1], 1, 0, 1, 1, defs, nd), *shd = compile(argv[1], T, sp, C, E, defs, nd);
  if (!ref || !shd) return 1;
  PlanMesh mesh = {1, 1, C, E, T};
  RtRank rk = rt_rank_single();
  rk.mesh = mesh;
  rt_mesh_coords(&mesh, me, rk.coord);
  rk.group[IR_AXIS_TP] = rt_comm_mesh_group(w, &mesh, RT_AXIS_TP, err, sizeof err);
  rk.group[IR_AXIS_CP] = rt_comm_mesh_group(w, &mesh, RT_AXIS_CP, err, sizeof err);
  rk.group[IR_AXIS_EP] = rt_comm_mesh_group(w, &mesh, RT_AXIS_EP, err, sizeof err);
  if (!rk.group[IR_AXIS_TP] || !rk.group[IR_AXIS_CP] || !rk.group[IR_AXIS_EP]) {
    fprintf(stderr, "shard_equiv: %s\n", err);
    return 1;
  }
  RtProgram *pr = rt_program_new(ref, err, sizeof err);
  RtProgram *ps = pr ? rt_program_new_rank(shd, &rk, err, sizeof err) : NULL;
  if (!ps) { fprintf(stderr, "shard_equiv: %s\n", err); return 1; }

  int64_t V = vocab_of(ref);
  int32_t *tok = make_ids(ref, "tokens", V, 0), *tgt = make_ids(ref, "targets", V, 5);
  if (!tok || !tgt) { fprintf(stderr, "shard_equiv: the model has no tokens/targets inputs\n"); return 1; }
  if (mask0 && C > 1) {
    /* --mask-cp-rank0: every target cp rank 0 holds is ignored (its zigzag
     * chunks 0 and 2C-1 of each sequence): its share of the loss and of
     * every gradient is empty, the whole-sequence mean must stay finite */
    const IrBlock *rb = &ref->blocks.a[ir_block_find(ref, "micro")];
    const IrType *it = NULL;
    for (int i = 0; i < rb->n; i++)
      if (rb->nodes[i].op == IR_OP_INPUT && strcmp(rb->nodes[i].sa, "targets") == 0) it = &rb->nodes[i].type;
    int64_t Tl = it->dim[it->rank - 1], ch = Tl / (2 * C), rows = ir_type_numel(it) / Tl;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < Tl; j++)
        if (j < ch || j >= Tl - ch) tgt[r * Tl + j] = -1;
  }
  RtFeed feeds[2] = {{"tokens", tok}, {"targets", tgt}};
  /* each rank feeds its block of the inputs as the sharded module splits
   * them (the sequence over cp with causal load balancing, the batch over
   * ep): local element -> global index by the runtime's own map */
  int32_t *ltok = tok, *ltgt = tgt;
  const IrBlock *sb = &shd->blocks.a[ir_block_find(shd, "micro")];
  const IrNode *in_node = NULL;
  for (int i = 0; i < sb->n; i++)
    if (sb->nodes[i].op == IR_OP_INPUT) in_node = &sb->nodes[i];
  if (in_node && !ir_sharding_is_none(&in_node->sh)) {
    const IrType *lt = &in_node->type, *gt = NULL;
    const IrBlock *rb = &ref->blocks.a[ir_block_find(ref, "micro")];
    for (int i = 0; i < rb->n; i++)
      if (rb->nodes[i].op == IR_OP_INPUT) gt = &rb->nodes[i].type;
    int64_t n = ir_type_numel(lt);
    ltok = ts_xcalloc((size_t)n, sizeof *ltok);
    ltgt = ts_xcalloc((size_t)n, sizeof *ltgt);
    for (int64_t e = 0; e < n; e++) {
      int64_t rem = e, g = 0, stride = 1, idx[IR_MAX_RANK];
      for (int d = lt->rank - 1; d >= 0; d--) { idx[d] = rem % lt->dim[d]; rem /= lt->dim[d]; }
      for (int d = lt->rank - 1; d >= 0; d--) {
        g += rt_global_index(rt_program_rank(ps), in_node->sh.split[d], lt->dim[d], idx[d]) * stride;
        stride *= gt->dim[d];
      }
      ltok[e] = tok[g];
      ltgt[e] = tgt[g];
    }
  }
  RtFeed lfeeds[2] = {{"tokens", ltok}, {"targets", ltgt}};
  RtRunInfo info = {0, 0, 1e-3};
  int fails = 0;
  for (int step = 0; step < 2; step++) {      /* twice: accumulation adds up */
    info.micro = step;
    if (rt_run_block(pr, ir_block_find(ref, "micro"), feeds, 2, &info, err, sizeof err) ||
        rt_run_block(ps, ir_block_find(shd, "micro"), lfeeds, 2, &info, err, sizeof err)) {
      fprintf(stderr, "shard_equiv: %s\n", err);
      return 1;
    }
    double lr_, ls_;
    rt_output(pr, "loss", &lr_);
    rt_output(ps, "loss", &ls_);
    double e = fabs(lr_ - ls_) / fmax(fabs(lr_), 1e-300);
    if (me == 0) printf("micro %d: loss %.17g vs %.17g, rel err %.3g\n", step, lr_, ls_, e);
    if (!(e <= 1e-10)) fails++;
  }
  double worst = 0, gmax = 0;
  const char *worst_name = "";
  for (int s = 0; s < ref->states.n; s++) {
    if (ref->states.a[s].kind != IR_STATE_GRAD) continue;
    const double *d = rt_state_data(pr, s);
    for (int64_t i = 0; i < ir_type_numel(&ref->states.a[s].type); i++) gmax = fmax(gmax, fabs(d[i]));
  }
  for (int s = 0; s < shd->states.n; s++) {
    const IrState *st = &shd->states.a[s];
    if (st->kind != IR_STATE_GRAD) continue;
    int r = ir_state_find(ref, st->name);
    if (r < 0) { fprintf(stderr, "shard_equiv: @%s missing from the unsharded module\n", st->name); fails++; continue; }
    int64_t n = ir_type_numel(&st->type);
    double *d = ts_xcalloc((size_t)n + 1, sizeof *d);
    memcpy(d, rt_state_data(ps, s), (size_t)n * sizeof *d);
    for (int a = IR_AXIS_CP; a <= IR_AXIS_TP; a++)
      if (st->sh.partial & (1u << a) && rt_comm_all_reduce(rk.group[a], IR_F64, d, (size_t)n, err, sizeof err)) {
        fprintf(stderr, "shard_equiv: %s\n", err);
        return 1;
      }
    int nzpad = 0;
    double e = compare_block(st, d, &ref->states.a[r].type, rt_state_data(pr, r), &rk, 1e-6 * gmax, &nzpad);
    if (nzpad) { fprintf(stderr, "rank %d: @%s has non-zero padding\n", me, st->name); fails++; }
    if (!(e <= 1e-10)) { fprintf(stderr, "rank %d: @%s rel err %.3g\n", me, st->name, e); fails++; }
    if (e >= worst) { worst = e; worst_name = st->name; }
    free(d);
  }
  printf("rank %d: worst gradient rel err %.3g (@%s)\n", me, worst, worst_name);
  if (ltok != tok) { free(ltok); free(ltgt); }
  free(tok);
  free(tgt);
  rt_program_free(ps);
  rt_program_free(pr);
  ir_module_free(ref);
  ir_module_free(shd);
  rt_comm_free(rk.group[IR_AXIS_TP]);
  rt_comm_free(rk.group[IR_AXIS_CP]);
  rt_comm_free(rk.group[IR_AXIS_EP]);
  int all = fails;
  double f = fails;
  rt_comm_all_reduce(w, IR_F64, &f, 1, err, sizeof err);
  all = (int)f;
  rt_comm_free(w);
  if (me == 0) printf("%s\n", all ? "FAILED" : "ok");
  return all ? 1 : 0;
}
