/* dev_prog.h - a rank program as device work (dev_prog.c): which device
 * kernel, GEMM, copy or collective runs each node of each block, and the
 * CUDA module holding every kernel those blocks launch.
 *
 * The choice of kernels is the CPU executor's (exec_jit.c: fusion groups,
 * lone lowerable nodes, AdamW runs, GEMM bias epilogues); on a device a
 * generated kernel is printed as CUDA C (codegen/cuda.c) instead of being
 * JIT-compiled, and every other node gets a library kernel
 * (codegen/cuda_lib.c), a GEMM, a copy or a collective.  A node with
 * none of these is refused, naming its op.  The module is the same text
 * for mcc (which compiles it with NVRTC into the plan) and mrun (which
 * finds the plan's binary by the text's hash). */
#ifndef TS_RT_DEV_PROG_H
#define TS_RT_DEV_PROG_H
#include "codegen/cuda.h"

typedef struct {
  char name[80];       /* kernel symbol */
  int line0, line1;    /* its lines in the module source (1-based, inclusive): NVRTC messages map back */
  char where[128];     /* "block micro, %12 = softmax (group 3)" for messages */
} RtCudaKernelInfo;

typedef struct {
  StrBuf src;          /* prelude + every distinct kernel, once */
  uint64_t hash;       /* ts_hash64 of src */
  int nkern;
  RtCudaKernelInfo *kern;
} RtCudaModule;

/* The CUDA module of m (one rank program after all passes).  0, or -1
 * with a message naming the first node no device can run. */
int rt_cuda_module_build(const IrModule *m, RtCudaModule *out, char *err, size_t errlen);
void rt_cuda_module_free(RtCudaModule *cm);
/* The kernel whose lines hold source line `line`, or NULL. */
const RtCudaKernelInfo *rt_cuda_module_kernel_at(const RtCudaModule *cm, int line);

#endif
