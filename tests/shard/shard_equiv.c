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
#include "../equiv.h"
#include "runtime/exec/rt_priv.h"

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
  IrModule *ref = equiv_compile("shard_equiv", argv[1], 1, 0, 1, 1, defs, nd);
  IrModule *shd = equiv_compile("shard_equiv", argv[1], T, sp, C, E, defs, nd);
  if (!ref || !shd) return 1;
  RtRank rk;
  if (equiv_rank(w, (PlanMesh){1, 1, C, E, T}, me, &rk, err, sizeof err)) {
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
  RtRunInfo info = {0, 0, 1e-3, 0};
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
  double worst;
  const char *worst_name;
  int gf = equiv_grads(ref, pr, shd, ps, &rk, me, 1e-10, 0, &worst, &worst_name, err, sizeof err);
  if (gf < 0) {
    fprintf(stderr, "shard_equiv: %s\n", err);
    return 1;
  }
  fails += gf;
  printf("rank %d: worst gradient rel err %.3g (@%s)\n", me, worst, worst_name);
  if (ltok != tok) { free(ltok); free(ltgt); }
  free(tok);
  free(tgt);
  rt_program_free(ps);
  rt_program_free(pr);
  ir_module_free(ref);
  ir_module_free(shd);
  equiv_rank_free(&rk);
  int all = fails;
  double f = fails;
  rt_comm_all_reduce(w, IR_F64, &f, 1, err, sizeof err);
  all = (int)f;
  rt_comm_free(w);
  if (me == 0) printf("%s\n", all ? "FAILED" : "ok");
  return all ? 1 : 0;
}
