/* cuda.h - CUDA C code generation (issue 7): the kernel IR printed as CUDA
 * C (cuda.c), the hand-written kernels of the ops the kernel IR does not
 * express (cuda_lib.c), and NVRTC, loaded lazily, compiling a module to PTX
 * and cubin for sm_80 / sm_90 with ptxas' resource report (nvrtc.c).
 * docs/cuda.md has the design.
 *
 * The kernel ABI.  Every Tessera CUDA kernel is
 *     extern "C" __global__ void NAME(TsArgs a)
 * with ONE argument passed by value: CgCudaArgs below, spelled TsArgs in
 * the CUDA prelude (same layout).  a.b[k] is buffer k (device pointers);
 * a.run points at the run block (CG_RUN_WORDS int64 words in device
 * memory), what changes between launches of the same captured CUDA
 * Graph: seed, step, micro batch, lr, and the rank's mesh coordinates.
 * Launches are 1-D: gridDim.x = blocks, blockDim.x = threads. */
#ifndef TS_CG_CUDA_H
#define TS_CG_CUDA_H
#include "cg.h"

#define CG_CUDA_MAX_BUFS CG_MAX_BUFS
/* split rows (cuda.c): the module's room for the partials of one kernel's
 * rows (doubles) and the most rows a split kernel has (plain numbers: the
 * prelude spells them) */
#define CG_CUDA_SPLIT_PARTS 8192
#define CG_CUDA_SPLIT_ROWS 64
typedef struct {
  void *b[CG_CUDA_MAX_BUFS];
  const long long *run;
} CgCudaArgs;

/* Words of the run block.  SEED, STEP, MICRO are the kernel IR's PARAM
 * slots (CG_PARAM_*, same numbers); LR is a double stored in an int64
 * word (memcpy); COORD + a is this rank's coordinate on mesh axis a
 * (IrAxis). */
enum {
  CG_RUN_SEED = CG_PARAM_SEED,
  CG_RUN_STEP = CG_PARAM_STEP,
  CG_RUN_MICRO = CG_PARAM_MICRO,
  CG_RUN_LR = 4,
  CG_RUN_COORD = 8,
  CG_RUN_WORDS = 16
};

/* One launch of a kernel of the module. */
typedef struct {
  char name[80];   /* the extern "C" __global__ symbol */
  int64_t blocks;  /* gridDim.x, 1 .. 2^31-1 (kernels loop when their space is larger) */
  int threads;     /* blockDim.x: a multiple of 32, 32 .. 1024 */
} CgCudaLaunch;

/* The text every module starts with: TsArgs, fixed-width types without
 * system headers (NVRTC has none), and the device helpers the printed
 * kernels and the library share (NaN-propagating max, saturating casts,
 * warp and block reductions).  Compiles with NVRTC and, with the
 * emulation header of tests/cuda, with a host C++ compiler. */
const char *cg_cuda_prelude(void);

/* ---- the printer (cuda.c) ----
 * Appends kernel k as one __global__ function named k->name (prelude not
 * included) and gives its launch.  Iteration gid of k's parallel space
 * is a thread (flat kernels; 16-byte vector loads and stores when every
 * access is at gid and the buffers allow) or a block (kernels whose
 * iteration loops over a row: the row's loops spread over the block's
 * threads, accumulators combined by warp shuffles and shared memory).
 * PARAM k reads a.run[k].  0, or -1 with a message. */
int cg_kernel_cuda_text(const CgKernel *k, StrBuf *out, CgCudaLaunch *launch, char *err, size_t errlen);

/* ---- the library (cuda_lib.c) ----
 * Kernels for ops the kernel IR does not express.  For node i of block b
 * of m, appends its kernel(s), named NAME_0, NAME_1, ..., to src and
 * fills launch[0 .. *nlaunch) (at most CG_CUDA_LIB_MAX_LAUNCH, run in that
 * order with the same arguments).  The buffers, in this order:
 *   a.b[0 .. nin)       the node's operands' values
 *   a.b[nin]            its result (ops with one)
 *   then one per "@state" int attribute of the op, in attribute order
 *                       (accum, zero, assign: the state)
 *   then, if *scratch > 0, a device scratch buffer of *scratch bytes
 *                       (contents undefined at entry).
 * Kernels are specialized to the node's shapes and attributes (constants
 * in the source).  Position-dependent ops read the rank's coordinates
 * from a.run[CG_RUN_COORD + axis].  0; 1 if the op has no library kernel
 * (or not for this node's form: *why says why); -1 on an internal error. */
#define CG_CUDA_LIB_MAX_LAUNCH 4
int cg_cuda_lib_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                       CgCudaLaunch *launch, int *nlaunch, int64_t *scratch, char *why, size_t whylen);
/* matmul8's scratch (cuda_fp8.c's transposes, runtime/exec's gemm8):
 * cuBLASLt's fp8 GEMM takes only the TN form, so A stored transposed
 * (ta) is copied to A' [batch, M, K] at byte 0 of the scratch and B not
 * stored transposed (!tb) to B' [batch or 1, N, K] at this offset (na:
 * A's bytes there, 0 when A is used in place). */
static inline int64_t cg_cuda_mm8_b_offset(int64_t na) { return (na + 255) / 256 * 256; }
/* The fp8 conversions the fp8 library kernels call (cuda_fp8.c), printed
 * after cg_cuda_prelude in a module that has them. */
const char *cg_cuda_fp8_prelude(void);
/* Whether op has a library kernel at all (for reports). */
int cg_cuda_lib_op(IrOp op);
/* The backward of one attention as ONE launch group (cuda_attn.c): the
 * attention_bwd nodes run[0 .. nrun) of b (1 to 3, different parts, the
 * same operands and attributes: plan_attn_grad_runs' groups).  Kernel 0
 * computes the statistics (each query row's log-sum-exp and rowsum(do * o))
 * once for all of them, then dq's kernel, then one kernel for dk and dv
 * together (one pass over the scores for both).  Same contract as
 * cg_cuda_lib_kernel with the buffers
 *   a.b[0 .. nin)       the operands (q, k, v, o, do[, doc]) of run[0]
 *   a.b[nin + j]        node run[j]'s result
 *   a.b[nin + nrun]     the scratch (*scratch bytes). */
int cg_cuda_attn_grads_kernel(const IrModule *m, const IrBlock *b, const int *run, int nrun, const char *name,
                              StrBuf *src, CgCudaLaunch *launch, int *nlaunch, int64_t *scratch, char *why,
                              size_t whylen);
/* The re-layout kernel of collective node i (all_gather, reduce_scatter)
 * when NCCL's whole rank blocks are not the value's layout (a dim after
 * the first, or the cp zigzag), all_to_all's packing of the blocks
 * (kernel 0, before NCCL) and their placing (kernel 1, after), or
 * group_sum's sum of x and the other member's value (in the blocks
 * buffer); all_to_all_v has no kernel but asks for scratch (the rows in
 * flight, moved by copies at the host's counts): same contract, buffers a.b[0] operand,
 * a.b[1] result, a.b[2] the blocks [S][outer, L, inner] (*scratch bytes,
 * on the comm stream's own scratch).  An all_gather's kernel runs after
 * NCCL gathers into the blocks, a reduce_scatter's before NCCL scatters
 * them.  *nlaunch = 0 when NCCL alone does it; 1 with a reason when the
 * form cannot run (as the reference refuses it). */
int cg_cuda_comm_relayout(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                          CgCudaLaunch *launch, int *nlaunch, int64_t *scratch, char *why, size_t whylen);

/* ---- NVRTC (nvrtc.c) ----
 * libnvrtc is loaded with dlopen on first use (binaries start without
 * it).  Compiles one module for a real arch "sm_XX" that the NVRTC found
 * supports (sm_75 .. sm_121 for CUDA 13.0): PTX for the matching virtual
 * arch, a cubin, and ptxas' verbose report parsed per kernel. */
typedef struct {
  char name[80];
  int registers;
  int64_t smem;         /* static shared memory, bytes */
  int64_t stack;        /* stack frame, bytes */
  int64_t cstack;       /* cumulative stack size (the frames of the functions it calls too), bytes */
  int64_t spill_stores, spill_loads;   /* bytes */
  int64_t cmem;         /* constant bank 0 (parameters), bytes */
} CgPtxasInfo;
typedef struct {
  char *ptx;            /* NUL-terminated */
  size_t ptx_len;
  void *cubin;
  size_t cubin_len;
  char *log;            /* NVRTC's log, ptxas' report included */
  CgPtxasInfo *kern;
  int nkern;
} CgNvrtcOut;
/* Whether NVRTC can be loaded here; if not, *why says so. */
int cg_nvrtc_available(char *why, size_t whylen);
/* "sm_86" -> 86; 0 when arch is not "sm_" and two or three digits. */
int cg_cuda_arch_number(const char *arch);
/* The real archs NVRTC compiles for (e.g. 75, 80, ..., 121), at most max
 * into archs: how many, or -1 with why. */
int cg_nvrtc_archs(int *archs, int max, char *why, size_t whylen);
/* 0, or -1 with a message (NVRTC missing, or the compile failed: the
 * message then quotes the log's first errors).  Free with cg_nvrtc_out_free. */
int cg_nvrtc_compile(const char *src, const char *arch, CgNvrtcOut *out, char *err, size_t errlen);
void cg_nvrtc_out_free(CgNvrtcOut *o);
/* Checks a kernel's report against the limits of arch: spills, stack
 * frame and cumulative stack (with the functions it calls) at most
 * CG_PTXAS_MATH_SLACK bytes each, registers <= 255, static shared memory
 * <= 48 KiB.  0, or -1 naming the kernel and limit.  The slack: CUDA's
 * math library keeps a few values in local memory on its slow paths --
 * double sin / cos's argument reduction a 40-byte stack frame (rope), double
 * exp on sm_90 8 to 44 bytes of spills -- which ptxas reports for every
 * kernel calling them (read since 2026-11-27; before, the report's stack
 * lines were not parsed).  More than that is ours. */
#define CG_PTXAS_MATH_SLACK 64
int cg_ptxas_check(const CgPtxasInfo *k, const char *arch, char *err, size_t errlen);

#endif
