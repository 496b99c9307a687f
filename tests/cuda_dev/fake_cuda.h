/* fake_cuda.h - the control interface of the fake CUDA driver
 * (fake_cuda.c, built as libcuda.so.1 for the tests of runtime/device/dev_cuda.c).
 * A test dlopens the fake by the same path it puts in TS_CUDA_DRIVER, so
 * it gets the same instance the device layer uses, and looks these
 * functions up with dlsym.
 *
 * The fake encodes our reading of NVIDIA's driver API documentation, not
 * NVIDIA's behaviour.  Work issued on a stream is queued and runs only
 * when something waits for it (cuStreamSynchronize, a cuStreamWaitEvent
 * that another stream's queue reaches, cuStreamQuery, destroying the
 * stream): a caller that reads a copy's destination without waiting sees
 * the old bytes, as it might on a GPU.  FAKE_CUDA_EAGER=1 runs work at once
 * instead.  Single-threaded, like the device layer's use of it. */
#ifndef TS_FAKE_CUDA_H
#define TS_FAKE_CUDA_H
#include <stddef.h>

/* One piece of work that ran, in the order it ran. */
enum {
  FAKE_OP_LAUNCH,      /* a kernel */
  FAKE_OP_H2D,
  FAKE_OP_D2H,
  FAKE_OP_D2D,
  FAKE_OP_MEMSET,
  FAKE_OP_HOSTFN,      /* cuLaunchHostFunc (the fake cuBLASLt's GEMMs) */
  FAKE_OP_RECORD,      /* cuEventRecord reached */
  FAKE_OP_WAIT,        /* cuStreamWaitEvent reached (after the other stream got to the event) */
  FAKE_OP_GRAPH        /* cuGraphLaunch reached: the graph's work follows, replay > 0 */
};
typedef struct {
  int kind;
  int stream;                 /* fake_cuda_stream_id of the stream it was issued on */
  int replay;                 /* 0: issued directly; k: part of the k-th graph replay */
  char name[80];              /* LAUNCH: the kernel; HOSTFN: the function's label */
  unsigned grid[3], block[3];
  unsigned shared;
  unsigned char args[512];    /* LAUNCH: the parameter bytes as copied at launch (or capture) */
  size_t args_len;
  unsigned long long dst, src;
  size_t bytes;
} FakeCudaOp;

typedef int (*FakeCudaLauncher)(const char *name, long long blocks, int threads, const void *args);

/* Devices: sm[i] = compute capability * 10 of device i (n <= 8);
 * mem_limit bytes of memory each (0: 16 GiB).  Before cuInit; the
 * defaults come from FAKE_CUDA_DEVICES ("80,90") and FAKE_CUDA_MEM. */
typedef void (*FakeCudaConfigure)(int n, const int *sm, size_t mem_limit);
/* The next call of driver function `fn` (its exported name) after `skip`
 * more calls returns `code` (once). */
typedef void (*FakeCudaFail)(const char *fn, int code, int skip);
/* Kernels run through `fn` (NULL: only recorded); a nonzero return makes
 * the launch fail as a kernel fault: the context's later calls return
 * CUDA_ERROR_LAUNCH_FAILED, as a GPU's would. */
typedef void (*FakeCudaSetLauncher)(FakeCudaLauncher fn);
/* One stream runs its work as it is issued (its waits first run the other
 * stream up to the event), while the others stay lazy: with the comm
 * stream eager, a collective not ordered after the compute that produces
 * its operand runs too early and reads stale bytes. */
typedef void (*FakeCudaSetEager)(const void *stream, int on);
typedef int (*FakeCudaLogCount)(void);
typedef const FakeCudaOp *(*FakeCudaLog)(int i);
typedef void (*FakeCudaLogClear)(void);
/* How many times driver function fn was called. */
typedef long (*FakeCudaCalls)(const char *fn);
/* Objects still alive (allocations, streams, events, modules, graphs,
 * executable graphs, context retains); a description into what. */
typedef int (*FakeCudaLive)(char *what, size_t n);
/* Objects that were still alive when their primary context was destroyed
 * (the last release frees them, as CUDA does: a leak of the caller's);
 * reset: start counting again. */
typedef int (*FakeCudaOrphans)(int reset);
/* What the last cuModuleLoadDataEx loaded: "cubin sm_80", "PTX sm_80". */
typedef const char *(*FakeCudaLastModule)(void);
/* The small number the fake gives a stream (creation order, from 1). */
typedef int (*FakeCudaStreamId)(const void *stream);
/* Whether [p, p + bytes) lies inside one live allocation (cuBLASLt fake). */
typedef int (*FakeCudaPtrOk)(unsigned long long p, size_t bytes);
/* Work queued on streams and not yet run. */
typedef int (*FakeCudaPending)(void);

#endif
