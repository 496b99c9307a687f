/* memreport.h - the per-rank memory report of `mcc --report memory`:
 * states by kind, the activation arenas the executor will allocate
 * (plan/memplan.h, planned as it runs each block), pipeline stashes, per
 * group of ranks, next to the unsharded model. */
#ifndef TS_MEMREPORT_H
#define TS_MEMREPORT_H
#include "passes.h"
#include "plan/memplan.h"

/* The text of `mcc --report memory` for m (one rank): states by kind,
 * each block's packed arena peak and lower bound (LLVM backend), the
 * arena and the total, the same for the reference backend, and the state
 * slab as allocated, in bytes and MiB.  0, or -1 with a message (then out
 * holds a partial report). */
int pass_memplan_report(const IrModule *m, StrBuf *out, char *err, size_t errlen);

/* The report of a plan's ranks: rank r runs programs[rank_program[r]]
 * (each a sharded module, all types LOCAL).  One section per program,
 * headed by the set of ranks running it ("ranks 0-3 (each):"), with the
 * rows of pass_memplan_report; then, when `unsharded` is not NULL (the
 * same model compiled for one rank), its rows for comparison.  0, or -1
 * with a message. */
int pass_memplan_report_ranks(IrModule *const *programs, int nprograms, const int *rank_program, int nranks,
                              const IrModule *unsharded, StrBuf *out, char *err, size_t errlen);
/* The same with the LLVM backend's positions from llvm_at(ctx, m, block,
 * at, ...) (0 or -1 with a message) instead of plan_mem_group_at: mcc
 * passes the runtime's own (rt_exec_positions), so that a group the
 * executor runs on the reference kernels is planned that way too. */
typedef int (*MemPlanAtFn)(void *ctx, const IrModule *m, int block, int *at, char *err, size_t errlen);
int pass_memplan_report_ranks_at(IrModule *const *programs, int nprograms, const int *rank_program, int nranks,
                                 const IrModule *unsharded, MemPlanAtFn llvm_at, void *ctx, StrBuf *out, char *err,
                                 size_t errlen);

/* One rank's bytes as that report counts them (LLVM backend). */
typedef struct {
  size_t params, grads, opt;   /* states by kind (params: with the states beside them: 16-bit copies,
                                  fp8 scales, KV cache, loss scaler) */
  size_t arena;                /* the largest block's packed arena */
  size_t held;                 /* the largest "held for the backward (live at the loss)" */
  size_t stash;                /* pipeline: the stash peak under the schedule (0 without pp) */
  size_t total;                /* params + grads + opt + arena + stash */
} MemTotals;
int pass_memplan_totals(const IrModule *m, MemPlanAtFn llvm_at, void *ctx, MemTotals *t, char *err, size_t errlen);

/* The recompute section of --report memory for the compiled module m (the
 * program of rank 0; pipeline plans: the mode only): the mode, pass
 * remat's summary, and per layer of the repeat stack (pass_layer_units)
 * the bytes its values hold at the loss in the micro block's plan and the
 * bytes of its input, next to Korthikanti et al.'s per-layer figures for
 * the mode.  0, or -1 with a message. */
int pass_memplan_report_recompute(const IrModule *m, int mode, const char *summary, MemPlanAtFn llvm_at, void *ctx,
                                  StrBuf *out, char *err, size_t errlen);

/* The global elements of value n: its local ones times the ranks of every
 * axis that splits a dim of it. */
double pass_global_numel(const IrModule *m, const IrNode *n);

#endif
