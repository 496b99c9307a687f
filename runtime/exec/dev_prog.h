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
/* One launch site of a kernel in the CUDA form of a rank program: what
 * `mcc --report kernels` lists (a roofline per launch). */
typedef struct {
  char name[80];        /* the kernel's symbol in the module */
  char where[128];      /* "block micro, %12 = softmax" */
  const char *block;    /* its block (interned) */
  int lib;              /* 1: a library kernel (attention, MoE, cuda_lib), 0: generated */
  int64_t blocks;       /* the launch: gridDim.x x blockDim.x */
  int threads;
  int launches;         /* launches of it per run of the block at this site (AdamW: one per tensor part) */
  double bytes;         /* global memory read and written by them: operands and results, each once */
  double flops;         /* arithmetic: attention's plan_attn_flops; one per element per node otherwise
                           (AdamW: 15 per element) */
} RtCudaKernelUse;
/* Every launch site of m's CUDA form (the module as rt_cuda_module_build
 * builds it; *mod gets it when not NULL), in block and node order.  0, or
 * -1 with a message. */
int rt_cuda_kernel_uses(const IrModule *m, RtCudaModule *mod, RtCudaKernelUse **uses, int *n, char *err,
                        size_t errlen);
/* The kernel whose lines hold source line `line`, or NULL. */
const RtCudaKernelInfo *rt_cuda_module_kernel_at(const RtCudaModule *cm, int line);

#endif
