/* calibrate.h - `mrun --calibrate FILE`: a hardware description of this
 * host's CPU ranks, measured (issue 23, deliverable 2), in the format of
 * hw/README.md, so that `mcc --report time --hw FILE` and `mcc
 * --auto-layout --hw FILE` predict what mrun's CPU ranks take.
 *
 * A "GPU" of the description is one CPU rank as mrun runs it with more
 * than one rank: one thread (OPENBLAS_NUM_THREADS=1, TS_THREADS=1).  Rank 0
 * measures, the others wait:
 *   GEMMs     square BLAS GEMMs of 96 .. 768 (f64 and f32) as the executor
 *             calls them; t = overhead + F / R fitted by least squares: R is
 *             `peak` (with gemm_efficiency 1: the peak IS what a large GEMM
 *             reaches here), the overhead is `kernel_overhead`;
 *   memory    a streaming triad over 3 x 32 MiB: `hbm_bandwidth` (efficiency 1);
 *   elementwise  the same triad's time is the floor; no compute term;
 *   link      ping-pong between ranks 0 and 1 (MPI, shared memory on one
 *             host): 8 bytes (latency = half the round trip) and 4 MiB
 *             (bandwidth); with one rank the link is not measured and the
 *             file says so (the memory bandwidth, ASSUMED).
 * Every figure is written with how it was measured.  No GPU is involved. */
#ifndef TS_RT_CALIBRATE_H
#define TS_RT_CALIBRATE_H
#include "runtime/comm/comm.h"

/* Rank `me` of `world` (NULL: one rank) takes part; rank 0 returns the
 * description's text in out (others leave it empty).  A summary of the
 * measurements goes to `log` on rank 0 (NULL: none).  0, or -1 with a
 * message. */
int rt_calibrate(RtComm *world, StrBuf *out, FILE *log, char *err, size_t errlen);

#endif
