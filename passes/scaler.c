/* scaler.c - fp16's dynamic loss scaling as IR (docs/precision.md, "Loss
 * scaling"), Megatron's DynamicGradScaler.  Not a pass of its own: autodiff
 * seeds the backward with the scale, the optimizer pass unscales inside its
 * norm and clip factor and calls scaler_blocks at its end.
 *
 * Expects: train.lowp f16 (scaler_on), the grad states (kind grad) of
 *   autodiff, and the optimizer's block "update" (one program: pp = 1, or a
 *   pipeline rank's program) or its blocks "update.<r>" (the whole-model
 *   pipeline module, pp > 1: one per pipeline rank r).
 * Guarantees:
 *   - four scalar states of kind scaler, f32 (the masters' precision):
 *     @loss_scale (start: the fixed or initial scale), @loss_scale.good
 *     (consecutive good steps, 0), @loss_scale.hyst (hysteresis left, starts
 *     at --hysteresis), @loss_scale.skipped (skipped steps, 0);
 *   - block "scaler": found = the sum over the rank's grad states of
 *     nonfinite(grad) (its own accumulators, before any reduction: an inf
 *     or NaN in a summand makes the sum inf or NaN), then all_reduce max
 *     over every axis of size > 1 (dp, tp, cp, ep: every rank that holds
 *     gradients), so every rank holds the same flag; outputs "found_inf",
 *     "loss_scale" (the scale this step's gradients carry) and
 *     "skipped_steps" (before this step);
 *   - block "skip": zero every grad state (what a skipped step does), then
 *     scale_update with found = 1;
 *   - block "update" (the optimizer's, which unscales by 1 / @loss_scale)
 *     ends with scale_update with found = 0: the scale changes after the
 *     step used it, as in Megatron (unscale, check, update the scaler,
 *     then step or skip).
 *   - with pp > 1 on the whole-model module, the three per pipeline rank r:
 *     "scaler.<r>" and "skip.<r>" over the grad states "update.<r>" clears
 *     (the rank's own, in state order: what the rank's program holds), and
 *     the scale_update at the end of "update.<r>"; the max over the pp axis
 *     makes every pipeline rank skip together.  pipeline_rank.c renames
 *     them "scaler" and "skip" in rank r's program, which is then exactly
 *     what this function makes from that program alone (mrun's
 *     re-specialization for another dp).
 * The runtime runs "update" when found_inf is 0, else "skip", and gives the
 * update the step count (Adam's bias correction, the lr schedule) of the
 * steps applied before it: step - skipped_steps (runtime/exec/train.c). */
#include "passes.h"

static const char *const st_names[4] = {"loss_scale", "loss_scale.good", "loss_scale.hyst", "loss_scale.skipped"};

int scaler_on(const IrModule *m) { return m->train.lowp == IR_F16; }

/* Scalar scaler state `name` starting at v (made on first use). */
static int scaler_state(IrModule *m, PassCtx *cx, const char *name, double v) {
  int s = ir_state_find(m, name);
  if (s >= 0) {
    char tb[256];
    if (m->states.a[s].kind != IR_STATE_SCALER || m->states.a[s].type.rank != 0)   /* a parameter of that name */
      return ts_errf(cx->err, sizeof cx->err, "loss scaling: the model's @%s (%s) has a name that fp16's loss "
                     "scaling keeps its state under: rename it in the model", name,
                     ir_type_str(&m->states.a[s].type, tb, sizeof tb));
    return s;
  }
  IrState st;
  memset(&st, 0, sizeof st);
  st.name = ts_intern(name);
  st.type.dtype = m->train.precision;
  st.kind = IR_STATE_SCALER;
  st.of = -1;
  st.init_a = v;
  return ir_state_add(m, &st);
}

int scaler_states(IrModule *m, PassCtx *cx, int st[4]) {
  double start[4] = {cx->loss_scale > 0 ? cx->loss_scale : cx->initial_loss_scale, 0, (double)cx->hysteresis, 0};
  for (int k = 0; k < 4; k++)
    if ((st[k] = scaler_state(m, cx, st_names[k], start[k])) < 0) return -1;
  return 0;
}

/* Settings of an earlier scaler block's scale_update, into cx; removes the
 * blocks "scaler" and "skip". */
static void take_old_blocks(IrModule *m, PassCtx *cx) {
  for (int pass = 0; pass < 2; pass++) {
    int bi = ir_block_find(m, pass ? "skip" : "scaler");
    if (bi < 0) continue;
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_SCALE_UPDATE) continue;
      cx->loss_scale_window = n->ia[4];
      cx->hysteresis = n->ia[5];
      cx->loss_scale = n->ia[6] ? 0 : 1;   /* fixed: only its start value matters, which the state keeps */
      cx->min_loss_scale = n->fa[0];
    }
    memmove(&m->blocks.a[bi], &m->blocks.a[bi + 1], (size_t)(m->blocks.n - bi - 1) * sizeof *m->blocks.a);
    m->blocks.n--;
  }
}

static int emit(IrModule *m, int b, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
                const char *sa, const IrType *t, PassCtx *cx) {
  char msg[512];
  int id = ir_emit(m, b, op, in, nin, ia, fa, sa, t, msg, sizeof msg);
  if (id < 0) ts_errf(cx->err, sizeof cx->err, "loss scaling: cannot emit %s: %s", ir_ops[op].name, msg);  /* internal */
  return id;
}

/* state read of scalar state s */
static int read_scalar(IrModule *m, int b, int s, PassCtx *cx) {
  int64_t ia[1] = {s};
  return emit(m, b, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &m->states.a[s].type, cx);
}

/* scale_update of the scaler states st[] with the constant found, at the
 * end of block b. */
static int scale_update(IrModule *m, int b, const int st[4], double found, PassCtx *cx) {
  IrType sc = {m->train.precision, 0, {0}, {0}};
  int f = emit(m, b, IR_OP_FULL, NULL, 0, NULL, &found, NULL, &sc, cx);
  int64_t ia[7] = {st[0], st[1], st[2], st[3], cx->loss_scale_window, cx->hysteresis, cx->loss_scale > 0 ? 0 : 1};
  double fa[1] = {cx->min_loss_scale};
  return f < 0 ? -1 : emit(m, b, IR_OP_SCALE_UPDATE, &f, 1, ia, fa, NULL, NULL, cx);
}

/* Block `sname` (the inf/NaN check over the grad states mine[] says, all
 * when mine is NULL) and block `kname` (a skipped step: those cleared, the
 * scale updated with found = 1), and the scale update with found = 0 at the
 * end of block ub. */
static int scaler_pair(IrModule *m, PassCtx *cx, const int st[4], const char *sname, const char *kname, int ub,
                       const unsigned char *mine) {
  int b = ir_block_add(m, ts_intern(sname));
  IrType sc = {m->train.precision, 0, {0}, {0}};
  int found = -1;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *gs = &m->states.a[s];
    if (gs->kind != IR_STATE_GRAD || (mine && !mine[s])) continue;
    int64_t ia[1] = {s};
    int g = emit(m, b, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &gs->type, cx);
    if (g < 0) return -1;
    m->blocks.a[b].nodes[g].sh = gs->sh;
    int f = emit(m, b, IR_OP_NONFINITE, &g, 1, NULL, NULL, NULL, NULL, cx);
    if (f < 0) return -1;
    if (m->blocks.a[b].nodes[f].type.dtype != sc.dtype) f = emit(m, b, IR_OP_CAST, &f, 1, NULL, NULL, NULL, &sc, cx);
    int in[2] = {found, f};
    found = found < 0 ? f : emit(m, b, IR_OP_ADD, in, 2, NULL, NULL, NULL, NULL, cx);
    if (found < 0) return -1;
  }
  if (found < 0)   /* a pipeline rank without gradients still joins the max */
    found = emit(m, b, IR_OP_FULL, NULL, 0, NULL, (double[]){0.0}, NULL, &sc, cx);
  if (found < 0) return -1;
  /* every rank that holds gradients learns of an inf anywhere: max over
   * each axis (pp included: the pipeline ranks skip together) */
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (ir_axis_size(m, (IrAxis)a) <= 1) continue;
    int64_t ia[2] = {a, 1};
    found = emit(m, b, IR_OP_ALL_REDUCE, &found, 1, ia, NULL, NULL, NULL, cx);
    if (found < 0) return -1;
    m->blocks.a[b].nodes[found].why = ts_intern("fp16 loss scaling: an inf or NaN in any rank's gradients skips "
                                                "the step on every rank (max of the found-inf flags)");
  }
  if (emit(m, b, IR_OP_OUTPUT, &found, 1, NULL, NULL, "found_inf", NULL, cx) < 0) return -1;
  int scale = read_scalar(m, b, st[0], cx);
  if (scale < 0 || emit(m, b, IR_OP_OUTPUT, &scale, 1, NULL, NULL, "loss_scale", NULL, cx) < 0) return -1;
  int sk = read_scalar(m, b, st[3], cx);
  if (sk < 0 || emit(m, b, IR_OP_OUTPUT, &sk, 1, NULL, NULL, "skipped_steps", NULL, cx) < 0) return -1;

  /* a skipped step still clears the accumulators */
  int z = ir_block_add(m, ts_intern(kname));
  for (int s = 0; s < m->states.n; s++) {
    if (m->states.a[s].kind != IR_STATE_GRAD || (mine && !mine[s])) continue;
    int64_t zi[1] = {s};
    if (emit(m, z, IR_OP_ZERO, NULL, 0, zi, NULL, NULL, NULL, cx) < 0) return -1;
  }
  /* the scale changes only after the step used it to unscale (Megatron's
   * order: unscale and check, update the scaler, then step or skip): the
   * last node of the skip block (found = 1) and of the update (found = 0) */
  return scale_update(m, z, st, 1.0, cx) < 0 || scale_update(m, ub, st, 0.0, cx) < 0 ? -1 : 0;
}

int scaler_blocks(IrModule *m, PassCtx *cx) {
  take_old_blocks(m, cx);
  if (!(cx->loss_scale >= 0) || !(cx->initial_loss_scale > 0) || !(cx->min_loss_scale > 0) ||
      cx->loss_scale_window < 1 || cx->hysteresis < 1)
    return ts_errf(cx->err, sizeof cx->err, "loss scaling: --loss-scale %g, --initial-loss-scale %g, "  /* internal */
                   "--min-loss-scale %g, --loss-scale-window %lld, --hysteresis %lld: the scales must be > 0 (a "
                   "fixed --loss-scale, or 0 for dynamic) and the window and hysteresis >= 1", cx->loss_scale,
                   cx->initial_loss_scale, cx->min_loss_scale, (long long)cx->loss_scale_window,
                   (long long)cx->hysteresis);
  if (cx->loss_scale == 0 && cx->min_loss_scale > cx->initial_loss_scale)   /* Megatron asserts it too */
    return ts_errf(cx->err, sizeof cx->err, "loss scaling: --min-loss-scale %g is above --initial-loss-scale %g: the "
                   "dynamic scale starts at the initial one and never goes below the minimum; give a minimum of at "
                   "most %g", cx->min_loss_scale, cx->initial_loss_scale, cx->initial_loss_scale);
  int st[4];
  if (scaler_states(m, cx, st) != 0) return -1;
  int ub = ir_block_find(m, "update");
  if (ub >= 0) {
    int any = 0;
    for (int s = 0; s < m->states.n; s++) any |= m->states.a[s].kind == IR_STATE_GRAD;
    if (!any) return ts_errf(cx->err, sizeof cx->err, "loss scaling: the module has no gradient to check");  /* internal */
    return scaler_pair(m, cx, st, "scaler", "skip", ub, NULL);
  }
  /* the whole-model pipeline module: one update block per pipeline rank */
  int pp = ir_axis_size(m, IR_AXIS_PP), nupd = 0;
  unsigned char *mine = arena_alloc(&cx->scratch, (size_t)m->states.n + 1);
  for (int r = 0; r < pp; r++) {
    char un[32], sn[32], kn[32];
    snprintf(un, sizeof un, "update.%d", r);
    snprintf(sn, sizeof sn, "scaler.%d", r);
    snprintf(kn, sizeof kn, "skip.%d", r);
    int rb = ir_block_find(m, un);
    if (rb < 0) continue;
    nupd++;
    memset(mine, 0, (size_t)m->states.n + 1);
    const IrBlock *b = &m->blocks.a[rb];
    for (int i = 0; i < b->n; i++)   /* the rank's gradients: those its update clears */
      if (b->nodes[i].op == IR_OP_ZERO && b->nodes[i].ia[0] >= 0 && b->nodes[i].ia[0] < m->states.n)
        mine[b->nodes[i].ia[0]] = 1;
    if (scaler_pair(m, cx, st, sn, kn, rb, mine) != 0) return -1;
  }
  if (!nupd) return ts_errf(cx->err, sizeof cx->err, "loss scaling: the module has no block \"update\"%s",  /* internal */
                            pp > 1 ? " nor \"update.<r>\" blocks" : "");
  return 0;
}
