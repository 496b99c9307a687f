/* passctx.c - a pass context (passes.h, PassCtx): its own file, so that a
 * program running one pass (mrun re-specializes a plan's update block for
 * the dp it runs at: pass_respecialize_dp) links that pass, not the whole
 * pipeline. */
#include "passes.h"

void pass_ctx_init(PassCtx *cx) {
  memset(cx, 0, sizeof *cx);
  arena_init(&cx->scratch);
  cx->verify_each = 1;
  cx->print_to = stdout;
  cx->activation_budget = -1;
  cx->memory_budget = -1;
  cx->initial_loss_scale = 4294967296.0;   /* Megatron's defaults: 2^32, window 1000, hysteresis 2, min 1 */
  cx->loss_scale_window = 1000;
  cx->hysteresis = 2;
  cx->min_loss_scale = 1.0;
  cx->fp8_history = 1024;                  /* Megatron's --fp8-amax-history-len and --fp8-amax-compute-algo */
  cx->fp8_algo = 1;
}

static const char *const recompute_names[PASS_RECOMPUTE_COUNT] = {"none", "full", "selective", "auto"};

const char *pass_recompute_name(int mode) {
  return mode >= 0 && mode < PASS_RECOMPUTE_COUNT ? recompute_names[mode] : "?";
}

int pass_recompute_lookup(const char *name) {
  for (int i = 0; name && i < PASS_RECOMPUTE_COUNT; i++)
    if (strcmp(name, recompute_names[i]) == 0) return i;
  return -1;
}

void pass_ctx_free(PassCtx *cx) { arena_free(&cx->scratch); }

int pass_emit(IrModule *m, PassCtx *cx, int b, int *failed, const char *who, IrOp op, const int *in, int nin,
              const int64_t *ia, const double *fa, const char *sa, const IrType *type, const IrSharding *sh) {
  if (*failed) return -1;
  for (int k = 0; k < nin; k++)
    if (in[k] < 0) { *failed = 1; return -1; }
  char err[512];
  int id = ir_emit(m, b, op, in, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) {
    *failed = 1;
    snprintf(cx->err, sizeof cx->err, "%s: cannot emit %s: %s", who, ir_ops[op].name, err);
    return -1;
  }
  if (sh) m->blocks.a[b].nodes[id].sh = *sh;
  return id;
}
