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
  double comm[IR_AXIS_COUNT];     /* exposed communication per mesh axis: the time compute waits for it */
  double comm_all[IR_AXIS_COUNT]; /* all communication per axis, overlapped or not */
  double hw_flops;                /* FLOPs the kernels run (GEMMs 2MNK, attention as its kernels compute it) */
} TimeCost;
double time_cost_total(const TimeCost *c);

/* One run of block b of m added to *c: its nodes in program order on a
 * compute stream, all_reduce / all_gather / reduce_scatter on a comm
 * stream overlapping the compute after them until their result is read
 * (as the GPU executor runs them), other communication blocking.  `fmt`:
 * the number format of m's GEMMs (hw_format_of). */
void pass_time_block(const IrModule *m, const IrBlock *b, const HwDesc *hw, HwFormat fmt, TimeCost *c);

/* Model FLOPs of one micro batch: 3 x the forward's GEMM FLOPs (2MNK) and
 * attention FLOPs (4 B H Tq Tk D, the full score matrix as Megatron's
 * formula counts it) in block "forward" of the frontend's module. */
double pass_time_model_flops(const IrModule *frontend);

/* Per-chunk predicted seconds of a compiled pipeline module (blocks
 * fwd.<g> / bwd.<g>): fwd[g], bwd[g] for g < nchunks.  With a split
 * backward (zb-h1): wgt[g] = wgt.<g>'s (W) and bwd[g] = bwd.<g>'s (B);
 * wgt NULL: bwd[g] is both, the whole backward.  0, or -1 when m has
 * no chunk blocks (pp = 1). */
int pass_time_chunks(const IrModule *m, const HwDesc *hw, int nchunks, double *fwd, double *bwd, double *wgt);

/* The dp gradient reduction as mrun will run it (plan/dpreduce.h): in
 * buckets of bucket_bytes (<= 0: plan_dp_bucket_default) issued during
 * the last micro batch's backward, or (overlap 0, mrun
 * --no-overlap-grad-reduce) in the update block as written.  NULL: the
 * defaults, overlapped. */
typedef struct { int64_t bucket_bytes; int overlap; } TimeDpOpts;

/* The text of `mcc --report time`.  progs[r]: the program of pipeline rank
 * r (one program without pp), each compiled for the same mesh;
 * model_flops: pass_time_model_flops of the unsharded forward.  With dp >
 * 1 and the reduction overlapped, a block that completes gradients has its
 * last micro batch's run as its own row ("micro last", "bwd.<g> last"):
 * the buckets posted on the comm stream as their gradients are final, the
 * run ending when they are done; the update block copies their parts out
 * instead of reducing. */
int pass_time_report(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops, const char *layout,
                     const TimeDpOpts *dp, StrBuf *out, char *err, size_t errlen);

/* The figures of that report, without the text (mcc --auto-layout; the dp
 * reduction overlapped, default buckets, as mrun runs by default). */
typedef struct {
  double step;                    /* predicted seconds per step */
  double bubble;                  /* pipeline bubble of the critical rank (s; 0 without pp) */
  double optimizer;               /* the update block on the critical rank (s) */
  double compute;                 /* GEMM + attention + memory-bound kernels outside the update (s) */
  double comm[IR_AXIS_COUNT];     /* exposed communication per axis, update block included (s) */
  double tflops, mfu, hfu;        /* model TFLOP/s per GPU (FLOP/s), MFU, HFU */
} TimePrediction;
int pass_time_predict(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops, TimePrediction *p,
                      char *err, size_t errlen);

#endif
