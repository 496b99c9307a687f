/* kreport.h - `mcc --report kernels`: the CUDA form of each rank program
 * as a roofline table, one row per distinct kernel: its launches per run
 * of their blocks, launch shape, ptxas' registers / shared memory / spills
 * and the occupancy they allow (with --target), the bytes it moves and
 * FLOPs it does, its arithmetic intensity, and (with --hw) the time the
 * roofline predicts and which bound it is under.  docs/cuda.md, "Roofline". */
#ifndef TS_KREPORT_H
#define TS_KREPORT_H
#include "ir/ir.h"
#include "plan/hw.h"

/* Appends program `prog`'s table to out.  sm: the arch whose ptxas report
 * gives registers and shared memory (0: none, those columns say "-");
 * hw: the description of the roofline's times (NULL: none).  0, or -1
 * with a message. */
int kreport_program(const IrModule *m, int prog, int sm, const HwDesc *hw, StrBuf *out, char *err, size_t errlen);

/* Resident blocks per SM of a kernel of `threads` threads per block,
 * `regs` registers per thread and `smem` bytes of static shared memory on
 * arch sm (80, 86, 89, 90, ...), and *occ the resident warps' fraction of
 * the SM's maximum.  The CUDA occupancy rules: registers allocated per
 * warp in units of 256, shared memory per block plus 1 KiB the system
 * reserves, the SM's thread and block limits. */
int kreport_occupancy(int sm, int threads, int regs, int64_t smem, double *occ);

#endif
