/* optimizer.c - the once-per-step update block: global gradient norm,
 * clipping, AdamW, and zeroing the gradient accumulators.
 *
 * Expects: a block "micro" (autodiff's) accumulating into grad states
 *          (kind grad, `of` = their parameter); no block "update" yet.
 * Guarantees: a block "update" that
 *   1. reads every grad state, norm = sqrt(sum of their sumsq), reports it
 *      as `output "grad_norm"`;
 *   2. coef = clip_coef(norm, max = train.clip_grad) (or 1 when clipping
 *      is off), the factor every gradient is scaled by;
 *   3. one `adamw` per parameter with a gradient, with new zero states
 *      "adam_m.<param>" / "adam_v.<param>" (kinds adam_m / adam_v); weight
 *      decay train.weight_decay, or 0 for params flagged nodecay;
 *   4. zeroes every grad state for the next step's accumulation.
 * The scalars are in the module's precision dtype.  The norm is computed
 * before any adamw so it sees this step's gradients unchanged. */
#include "passes.h"

/* Emits into the update block; the first failure is written to cx->err and
 * every later call returns -1 without emitting (operands < 0 propagate). */
typedef struct { IrModule *m; PassCtx *cx; int b; int failed; } Em;
static int em(Em *e, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
              const char *sa, const IrType *type) {
  if (e->failed) return -1;
  for (int k = 0; k < nin; k++)
    if (in[k] < 0) { e->failed = 1; return -1; }
  char err[512];
  int id = ir_emit(e->m, e->b, op, in, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) {
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: cannot emit %s: %s", ir_ops[op].name, err);
  }
  return id;
}

/* sumsq of grad state s, as a precision-dtype scalar. */
static int grad_sumsq(Em *e, int s, IrDtype prec) {
  IrType st = e->m->states.a[s].type;
  int64_t ia[1] = {s};
  int v = em(e, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &st);
  int sq = em(e, IR_OP_SUMSQ, &v, 1, NULL, NULL, NULL, NULL);
  if (st.dtype != prec) {
    IrType ct = {prec, 0, {0}, {0}};
    sq = em(e, IR_OP_CAST, &sq, 1, NULL, NULL, NULL, &ct);
  }
  return sq;
}

int pass_optimizer(IrModule *m, PassCtx *cx) {
  if (ir_block_find(m, "micro") < 0) { snprintf(cx->err, sizeof cx->err, "optimizer: the module has no block \"micro\" (run autodiff first)"); return -1; }
  if (ir_block_find(m, "update") >= 0) { snprintf(cx->err, sizeof cx->err, "optimizer: block \"update\" already exists"); return -1; }
  IrDtype prec = m->train.precision;
  if (!ir_dtype_is_float(prec)) { snprintf(cx->err, sizeof cx->err, "optimizer: precision must be f32 or f64"); return -1; }

  int nstates0 = m->states.n, nblocks0 = m->blocks.n;
  int *grads = arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof *grads);
  int ng = 0;
  for (int s = 0; s < nstates0; s++)
    if (m->states.a[s].kind == IR_STATE_GRAD) {
      int p = m->states.a[s].of;
      if (p < 0 || p >= nstates0 || m->states.a[p].kind != IR_STATE_PARAM) {
        snprintf(cx->err, sizeof cx->err, "optimizer: grad state @%s is not attached to a parameter", m->states.a[s].name);
        return -1;
      }
      grads[ng++] = s;
    }
  if (!ng) { snprintf(cx->err, sizeof cx->err, "optimizer: no parameter receives a gradient; nothing to train"); return -1; }

  Em e = {m, cx, ir_block_add(m, "update"), 0};
  /* 1. global norm over all gradients */
  int total = -1;
  for (int k = 0; k < ng; k++) {
    int sq = grad_sumsq(&e, grads[k], prec);
    if (total < 0) total = sq;
    else { int in[2] = {total, sq}; total = em(&e, IR_OP_ADD, in, 2, NULL, NULL, NULL, NULL); }
  }
  int norm = em(&e, IR_OP_SQRT, &total, 1, NULL, NULL, NULL, NULL);
  em(&e, IR_OP_OUTPUT, &norm, 1, NULL, NULL, "grad_norm", NULL);

  /* 2. the clipping factor */
  int coef;
  if (m->train.clip_grad > 0) {
    double mx = m->train.clip_grad;
    coef = em(&e, IR_OP_CLIP_COEF, &norm, 1, NULL, &mx, NULL, NULL);
  } else {
    IrType sc = {prec, 0, {0}, {0}};
    double one = 1.0;
    coef = em(&e, IR_OP_FULL, NULL, 0, NULL, &one, NULL, &sc);
  }

  /* 3. AdamW per parameter */
  for (int k = 0; k < ng && !e.failed; k++) {
    int g = grads[k], p = m->states.a[g].of;
    int ms = ir_state_derived(m, p, IR_STATE_ADAM_M, "adam_m", cx->err, sizeof cx->err);
    int vs = ms < 0 ? -1 : ir_state_derived(m, p, IR_STATE_ADAM_V, "adam_v", cx->err, sizeof cx->err);
    if (vs < 0) { e.failed = 1; break; }
    const IrTrain *t = &m->train;
    int64_t ia[3] = {p, ms, vs};
    double fa[4] = {t->beta1, t->beta2, t->eps,
                    (m->states.a[p].flags & IR_STATE_NODECAY) ? 0.0 : t->weight_decay};
    IrType gt = m->states.a[g].type;
    int64_t gi[1] = {g};
    int gv = em(&e, IR_OP_STATE, NULL, 0, gi, NULL, NULL, &gt);
    int in[2] = {coef, gv};
    em(&e, IR_OP_ADAMW, in, 2, ia, fa, NULL, NULL);
  }

  /* 4. clear the accumulators */
  for (int k = 0; k < ng; k++) {
    int64_t ia[1] = {grads[k]};
    em(&e, IR_OP_ZERO, NULL, 0, ia, NULL, NULL, NULL);
  }

  if (e.failed) {            /* leave the module as it was */
    m->blocks.n = nblocks0;
    m->states.n = nstates0;
    return -1;
  }
  return 0;
}
