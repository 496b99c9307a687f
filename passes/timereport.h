/* timereport.h - the step-time prediction of `mcc --report time` and the
 * predicted seconds of `--emit=trace`: every node of a compiled program
 * costed on a hardware description (plan/hw.h), blocks summed, pipeline
 * schedules simulated (plan/schedule.h).  ANALYSES: nothing here changes
 * the IR.  The model and its limits: docs/performance-model.md. */
#ifndef TS_TIMEREPORT_H
#define TS_TIMEREPORT_H
#include "passes.h"
#include "plan/hw.h"

/* What one run of a block costs, in seconds, by kind. */
enum { TIME_GEMM, TIME_ATTN, TIME_MEM, TIME_KINDS };
typedef struct {
  double comp[TIME_KINDS];        /* GEMMs (matmul, gmm), fused attention, memory-bound kernels */
  double comm[IR_AXIS_COUNT];     /* collectives and pipeline messages per mesh axis (all exposed) */
  double hw_flops;                /* FLOPs the kernels run (GEMMs 2MNK, attention as its kernels compute it) */
} TimeCost;
double time_cost_total(const TimeCost *c);

/* One node of block b of m (its fusion group's traffic counted at the
 * group's first member) added to *c.  `fmt`: the number format of m's
 * GEMMs (hw_format_of). */
void pass_time_block(const IrModule *m, const IrBlock *b, const HwDesc *hw, HwFormat fmt, TimeCost *c);

/* Model FLOPs of one micro batch: 3 x the forward's GEMM FLOPs (2MNK) and
 * attention FLOPs (4 B H Tq Tk D, the full score matrix as Megatron's
 * formula counts it) in block "forward" of the frontend's module. */
double pass_time_model_flops(const IrModule *frontend);

/* Per-chunk predicted seconds of a compiled pipeline module (blocks
 * fwd.<g> / bwd.<g>): fwd[g], bwd[g] for g < nchunks.  0, or -1 when m has
 * no chunk blocks (pp = 1). */
int pass_time_chunks(const IrModule *m, const HwDesc *hw, int nchunks, double *fwd, double *bwd);

/* The text of `mcc --report time`.  progs[r]: the program of pipeline rank
 * r (one program without pp), each compiled for the same mesh;
 * model_flops: pass_time_model_flops of the unsharded forward. */
int pass_time_report(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops, const char *layout,
                     StrBuf *out, char *err, size_t errlen);

#endif
