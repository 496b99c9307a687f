/* autolayout.h - `mcc --auto-layout`: the search for the fastest layout of
 * a model on N GPUs of a hardware description that fits their memory.
 *
 * Two stages (docs/performance-model.md, "Layout search"):
 *   A. For every intra-layer layout (tp, sp, cp, ep, recompute) the model
 *      is compiled ONCE as a short copy: its repeat stack cut to 5 layers
 *      over 4 pipeline chunks of 1, 1, 2, 1 layers at dp = 1.  The
 *      per-chunk predicted seconds (passes/timereport.c) and bytes
 *      (passes/memreport.c) of that copy give what one layer, what comes
 *      before the stack (E) and what comes after it (L) cost, and how a
 *      chunk's arena grows with its layers.  Every whole layout (pp, vpp
 *      and schedule, dp and ZeRO, micro batch) is then costed from those
 *      figures: chunks balanced over the layers, the pipeline schedule
 *      simulated (plan/schedule.c), the stash walked over it, the dp
 *      gradient reduction by the collective model (plan/hw.c), micro
 *      batch sizes other than the copy's scaled linearly.
 *   B. The best of those are compiled whole, as mcc would compile them
 *      given the flags, and costed exactly (`--report time`'s prediction,
 *      `--report memory`'s bytes); those that fit are ranked.
 * The compiler itself is a callback: this file knows no MDL and no model. */
#ifndef TS_AUTOLAYOUT_H
#define TS_AUTOLAYOUT_H
#include "passes/passes.h"
#include "passes/memreport.h"
#include "plan/hw.h"
#include "plan/schedule.h"

typedef struct {
  int tp, sp, cp, ep, pp, vpp, dp, zero, mb;
  int recompute;             /* PassRecompute */
  int cp_attn;               /* PassCpAttn, with cp > 1 */
  PipeSchedKind sched;       /* with pp > 1 */
} AlLayout;

/* How to compile one layout.  stack_layers < 0: the whole model; else the
 * repeat stack `stack` cut to stack_layers layers.  pp_layers: --pp-layers
 * (NULL: balanced).  quiet: diagnostics into err, not stderr.  The
 * compiled module (after every pass), or NULL with the reason in err. */
typedef struct {
  void *ctx;
  IrModule *(*compile)(void *ctx, const AlLayout *l, const char *stack, int stack_layers, const int *pp_layers,
                       int npp_layers, char *err, size_t errlen);
  MemPlanAtFn llvm_at;       /* the runtime's kernel positions, for the memory plan (NULL: the plan's own) */
  void *llvm_ctx;
} AlCompiler;

typedef struct {
  int gpus;                  /* N */
  const HwDesc *hw;
  double memory;             /* bytes per GPU (0: the description's HBM) */
  int fixed_mb;              /* the micro batch cannot be changed (no config key micro_batch): 1 */
  double budget_s;           /* stage B stops compiling after this many seconds in all (0: 8) */
  int top;                   /* layouts printed (0: 5) */
  int cp_attn;               /* the user's --cp-attn (PassCpAttn), or -1: ring and a2a are searched */
} AlOptions;

typedef struct {
  AlLayout l;
  double step, tflops, mfu, bubble;   /* exact (stage B) */
  double memory;                      /* bytes on the fullest rank */
  char limit[160];                    /* what limits it, one line */
  double est_step, est_memory;        /* stage A's figures */
  int index;                          /* stage B's order (internal) */
  int fullest;                        /* the pipeline rank that holds the most */
} AlResult;

/* Runs the search for the model `frontend` (the frontend's module with the
 * user's options: its train block, rules and repeat stack).  Prints the
 * table to out; *best gets the winner and *winner its compiled module
 * (the caller frees it; NULL if no layout fits).  0, or -1 with a message
 * (no layout compiles or fits: the message says why). */
int al_search(const IrModule *frontend, const AlCompiler *c, const AlOptions *o, StrBuf *out, AlResult *best,
              IrModule **winner, char *err, size_t errlen);

/* "tp=8 sp pp=16 dp=8 mb=1 1f1b": the flags' values of l. */
const char *al_layout_str(const AlLayout *l, char *buf, size_t n);

#endif
