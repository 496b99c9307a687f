/* pipeline_rank.c - the program of one pipeline rank, cut out of the
 * compiler's whole-model module (docs/pipeline.md, "Execution").
 *
 * Expects: a module after all passes with pp > 1 and parallel stage=0:
 *   blocks fwd.<g> / bwd.<g> for the global chunks g, and one "update.<r>"
 *   per pipeline rank r (pass "optimizer").
 * Gives: for rank r a new module with the blocks of r's chunks (g % pp ==
 *   r) in the whole module's order, "update.<r>" renamed "update" (and
 *   fp16's "scaler.<r>", "skip.<r>" renamed "scaler", "skip"), only the
 *   states those blocks refer to (plus the parameter of every kept gradient
 *   or moment), re-indexed in their original order, and parallel
 *   stage=r+1.  Everything else (name, consts, train, rules, the rest of
 *   the parallel line) is copied.  States keep their names, so a
 *   parameter's initial value (a function of its name) and its checkpoint
 *   entry are the same on every rank holding it.
 * The result is verified; its text round-trips like any module. */
#include "pipe.h"

IrModule *pass_pipeline_rank_module(const IrModule *whole, int r, char *err, size_t errlen) {
  int pp = ir_axis_size(whole, IR_AXIS_PP);
  if (pp < 2 || whole->par.stage != 0) {
    ts_errf(err, errlen, "pipeline rank program: the module is not a whole-model pipeline module (pp=%d, stage=%d)",
            pp, whole->par.stage);  /* internal */
    return NULL;
  }
  if (r < 0 || r >= pp) {
    ts_errf(err, errlen, "pipeline rank program: rank %d is outside 0 .. %d", r, pp - 1);  /* internal */
    return NULL;
  }
  /* the rank's own blocks of the whole module: "update.<r>", and fp16's
   * "scaler.<r>" and "skip.<r>" (passes/scaler.c), renamed without the rank */
  static const char *const own[3] = {"update", "scaler", "skip"};
  const char *mine[3];
  char uname[32];
  for (int k = 0; k < 3; k++) {
    snprintf(uname, sizeof uname, "%s.%d", own[k], r);
    mine[k] = ts_intern(uname);
  }
  snprintf(uname, sizeof uname, "update.%d", r);
  if (ir_block_find(whole, uname) < 0) {
    ts_errf(err, errlen, "pipeline rank program: the module has no block \"%s\" (run the optimizer pass)", uname);  /* internal */
    return NULL;
  }

  /* The clone owns copies of every block; the ones not kept stay in its
   * arena until the module is freed (they are small against a plan). */
  IrModule *m = ir_module_clone(whole);
  int nb = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrBlock b = m->blocks.a[bi];
    int g = ir_block_chunk(&b, NULL), k = 0;
    while (k < 3 && b.name != mine[k]) k++;
    if (k < 3) b.name = ts_intern(own[k]);
    else if (g < 0 || g % pp != r) continue;    /* other ranks' chunks, updates, scalers */
    m->blocks.a[nb++] = b;
  }
  m->blocks.n = nb;

  /* states referred to by the kept blocks, and their parameters */
  int ns = m->states.n;
  int *newidx = ts_xmalloc(((size_t)ns + 1) * sizeof *newidx);
  for (int s = 0; s < ns; s++) newidx[s] = -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < IR_MAX_IATTR; k++)
        if (ir_op_iattr_is_state(b->nodes[i].op, k) && b->nodes[i].ia[k] >= 0 && b->nodes[i].ia[k] < ns)
          newidx[b->nodes[i].ia[k]] = 1;
  }
  for (int s = 0; s < ns; s++) {
    int p = m->states.a[s].of;
    if (newidx[s] > 0 && p >= 0 && p < ns) newidx[p] = 1;
  }
  int kept = 0;
  for (int s = 0; s < ns; s++) {
    if (newidx[s] < 0) continue;
    newidx[s] = kept;
    m->states.a[kept++] = m->states.a[s];
  }
  ir_states_truncate(m, kept);   /* moved in place: the name index starts again */
  for (int s = 0; s < kept; s++) {
    IrState *st = &m->states.a[s];
    if (st->of >= 0) st->of = st->of < ns ? newidx[st->of] : -1;
  }
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < IR_MAX_IATTR; k++)
        if (ir_op_iattr_is_state(b->nodes[i].op, k) && b->nodes[i].ia[k] >= 0 && b->nodes[i].ia[k] < ns)
          b->nodes[i].ia[k] = newidx[b->nodes[i].ia[k]];
  }
  free(newidx);
  m->par.stage = r + 1;

  char why[1024];
  if (ir_verify(m, why, sizeof why) != 0) {
    ts_errf(err, errlen, "internal error: the program of pipeline rank %d does not verify: %s", r, why);
    ir_module_free(m);
    return NULL;
  }
  return m;
}
