/* device.h - the device layer: what the executor (runtime/exec) needs
 * from a device, as a table of functions (RtDevOps).  The executor is the same code for CPU
 * and GPU ranks; a program made with a device (RtExecOpts.dev) keeps its
 * state slab and activation arena in device memory and runs every node as
 * a device kernel, GEMM, copy or collective through this table.
 *
 * Implementations:
 *   - dev_cuda.c: the CUDA driver API, loaded with dlopen (binaries start
 *     on machines with no driver), cuBLASLt for GEMMs (dlopen too),
 *     streams, events, CUDA Graphs.  Never run here (no GPU).
 *   - tests/cuda/emu_dev.c (tests only): host memory, kernels compiled
 *     from the same CUDA C by the host C++ compiler against the emulation
 *     header, GEMMs on the host BLAS.
 *
 * Streams are small integers: RT_STREAM_COMPUTE and RT_STREAM_COMM (NCCL
 * collectives, so they overlap compute); events are small integers too
 * (0 .. RT_DEV_EVENTS-1).  Every call returns 0, or -1 with a message.
 *
 * runtime/device may use: ir/ (types, utilities), codegen/ (the kernels'
 * launch ABI, NVRTC to compile a module from source).  Nothing else of the
 * runtime: the executor and the communication layer reach a device only
 * through this table (NCCL gets the comm stream's native handle). */
#ifndef TS_RT_DEVICE_H
#define TS_RT_DEVICE_H
#include "ir/ir.h"
#include "codegen/cuda.h"

typedef struct RtDev RtDev;
typedef struct RtDevImage RtDevImage;

enum { RT_STREAM_COMPUTE = 0, RT_STREAM_COMM = 1, RT_DEV_STREAMS = 2 };
enum { RT_DEV_EVENTS = 64 };

/* Loaded code: one module per program (all its kernels). */
typedef struct RtDevModule RtDevModule;
typedef struct RtDevGraph RtDevGraph;

/* What a module is made from; a device takes what it can: the CUDA device
 * a cubin for its own arch, else the PTX (the driver JITs it); the
 * emulator the source. */
struct RtDevImage {
  const char *source;            /* CUDA C, prelude included (may be NULL) */
  const char *ptx;               /* may be NULL */
  const void *cubin;             /* may be NULL */
  size_t cubin_len;
  int sm;                        /* the cubin's arch: 80, 90 (0: none) */
};

/* C[m, n] (+)= alpha * op(A) op(B), row-major, op = transpose if ta / tb,
 * `batch` products at the given element strides (0: shared operand);
 * beta = 0 overwrites C, 1 accumulates (a bias epilogue pre-fills C).
 * epilogue: RT_GEMM_BIAS adds bias[n] to every row, RT_GEMM_BIAS_GELU
 * then applies gelu (tanh form).  dtype (C's and the bias's) IR_F32 or
 * IR_F64 with A and B of that dtype, or A and B bf16 / f16 (ab_dtype)
 * with an f32 accumulator and C of their dtype or f32 (cuBLASLt's
 * CUBLAS_COMPUTE_32F table; Megatron's bf16 GEMMs).  The bias is C's
 * dtype (cuBLASLt's bias epilogue reads D's type). */
enum { RT_GEMM_PLAIN, RT_GEMM_BIAS, RT_GEMM_BIAS_GELU };
typedef struct {
  IrDtype dtype;                  /* C (and D, and the bias) */
  IrDtype ab_dtype;               /* A and B; IR_VOID: dtype */
  IrDtype bias_dtype;             /* IR_VOID: dtype; anything else is refused */
  int ta, tb;
  int64_t m, n, k;
  int64_t lda, ldb, ldc;          /* row strides (elements) of A, B, C as stored */
  int64_t batch, stride_a, stride_b, stride_c;
  double alpha, beta;
  const void *a, *b;
  void *c;
  const void *bias;
  int epilogue;
  /* fp8 (ab_dtype f8e4m3 / f8e5m2; dev_cublaslt.c's rt_cublaslt_gemm8):
   * B's type when it differs from A's (IR_VOID: A's), and the operands'
   * scale_inv as device f32 scalars: C = sa sb op(A) op(B) */
  IrDtype b8_dtype;
  const void *scale_a, *scale_b;
} RtGemm;

typedef struct {
  const char *name;              /* "cuda", "emu" */
  void (*close)(RtDev *d);
  int (*alloc)(RtDev *d, size_t bytes, void **ptr, char *err, size_t n);
  void (*free)(RtDev *d, void *ptr);
  /* Page-locked host memory (optional: NULL means plain malloc will do):
   * what a copy captured in a CUDA graph may read or write on the host
   * (the staging buffers of the feeds, the output slots), since a capture
   * refuses copies through pageable memory.  Zeroed. */
  int (*host_alloc)(RtDev *d, size_t bytes, void **ptr, char *err, size_t n);
  void (*host_free)(RtDev *d, void *ptr);
  /* copies are ordered on `stream`; d2h into host memory the caller reads
   * after sync */
  int (*h2d)(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n);
  int (*d2h)(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n);
  int (*d2d)(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n);
  int (*memset0)(RtDev *d, void *dst, size_t bytes, int stream, char *err, size_t n);
  int (*module_load)(RtDev *d, const RtDevImage *img, RtDevModule **mod, char *err, size_t n);
  void (*module_free)(RtDev *d, RtDevModule *mod);
  int (*launch)(RtDev *d, RtDevModule *mod, const CgCudaLaunch *l, const CgCudaArgs *a, int stream, char *err,
                size_t n);
  int (*gemm)(RtDev *d, const RtGemm *g, int stream, char *err, size_t n);
  int (*sync)(RtDev *d, int stream, char *err, size_t n);
  int (*event_record)(RtDev *d, int event, int stream, char *err, size_t n);
  int (*stream_wait)(RtDev *d, int stream, int event, char *err, size_t n);
  /* CUDA Graphs: everything issued on `stream` between begin and end is
   * captured (not run); launch replays it on the stream. */
  int (*graph_begin)(RtDev *d, int stream, char *err, size_t n);
  int (*graph_end)(RtDev *d, int stream, RtDevGraph **g, char *err, size_t n);
  int (*graph_launch)(RtDev *d, RtDevGraph *g, int stream, char *err, size_t n);
  void (*graph_free)(RtDev *d, RtDevGraph *g);
  /* the stream's native handle (CUstream) for NCCL; NULL if none */
  void *(*stream_handle)(RtDev *d, int stream);
  /* Timing (optional: NULL where the device cannot time its work).  timer
   * records a timing event on `stream` and gives its id (0, 1, ... since
   * the last timer_reset); timer_ms, after a sync, the milliseconds from
   * event `from` to event `to` (CUDA events: cuEventElapsedTime). */
  int (*timer)(RtDev *d, int stream, int *id, char *err, size_t n);
  int (*timer_ms)(RtDev *d, int from, int to, double *ms, char *err, size_t n);
  void (*timer_reset)(RtDev *d);
} RtDevOps;

struct RtDev {
  const RtDevOps *ops;
  int ordinal;                   /* device number */
  int sm;                        /* compute capability * 10 (80, 90), 0 if unknown */
  char label[128];               /* for messages: "NVIDIA H100 80GB HBM3 (sm_90)" */
  int host_memory;               /* device pointers are host pointers (the emulator): the reference
                                    kernels of collectives can run on them */
  void *impl;
};

/* ---- the CUDA device (dev_cuda.c) ----
 * Opens device `ordinal` through the driver API (libcuda.so.1 by dlopen),
 * creates its context, streams and events.  NULL with a message when
 * there is no driver or no such device: the caller says so in one line and
 * runs on CPU ranks. */
RtDev *rt_dev_cuda_open(int ordinal, char *err, size_t errlen);
/* How many CUDA devices the driver reports (0 with a message when there
 * is no driver). */
int rt_dev_cuda_count(char *msg, size_t msglen);

#endif
