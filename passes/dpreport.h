/* dpreport.h - the overlapped data-parallel gradient reduction of a
 * compiled program as `mcc --report comm` shows it (plan/dpreduce.h: the
 * buckets mrun posts during the last micro batch's backward).  ANALYSIS:
 * nothing here changes the IR. */
#ifndef TS_DPREPORT_H
#define TS_DPREPORT_H
#include "passes.h"
#include "plan/hw.h"

/* Figures of one program's dp reduction. */
typedef struct {
  int buckets, grads, left;     /* buckets, gradients in them, dp reductions left in the update block */
  double ring;                  /* ring bytes sent per rank per step by the dp gradient reduction */
  double exposed;               /* ... of which not hidden behind the backward */
  double megatron_ring, megatron_exposed;   /* the closed forms for Megatron's DDP with the same bucket size */
  double z3_ring;               /* ZeRO-3: ring bytes of micro's dp gathers and reduce-scatters per rank per step */
  double z3_closed, z1_closed;  /* ... Megatron-FSDP's closed form per step; ZeRO-1's (reduce-scatter + gather) */
} DpOverlapSum;

/* The section of `--report comm` for program m (a rank's program): per
 * bucket, the block and node after which it is issued, its gradients, its
 * collective and bytes, and the backward FLOPs of its block after that
 * node (what it overlaps); with hw (NULL: none) also the predicted seconds
 * of its collective and of that compute, buckets queued one after the
 * other on the comm stream.  Exposed bytes: without hw, the bytes of the
 * buckets that overlap no FLOPs; with hw, the bytes still in flight when
 * the backward ends (each bucket's share of its time after that end).
 * overlap = 0 (--no-overlap-grad-reduce): every byte exposed.  Nothing is
 * written when dp = 1.  A ZeRO-3 program (pass zero3) has no buckets: its
 * section is the dp collectives of block micro next to Megatron-FSDP's and
 * ZeRO-1's closed forms (z3_* of sum).  0, or -1 with a message. */
int pass_dp_overlap_report(const IrModule *m, int64_t bucket_bytes, int overlap, const HwDesc *hw, StrBuf *out,
                           DpOverlapSum *sum, char *err, size_t errlen);

#endif
