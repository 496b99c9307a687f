/* dev_cuda_priv.h - what cu_driver.c (the driver API loaded and
 * checked), dev_cuda.c (the device over it) and dev_cublaslt.c (cuBLASLt
 * GEMMs) share: the slice of NVIDIA's ABI we call,
 * declared here instead of including cuda.h / cublasLt.h so the library
 * builds on machines without the toolkit (both libraries are loaded with
 * dlopen), and the state of one opened device.
 *
 * Names: Cu* / RT_CU_* for the driver, Lt* / RT_LT_* for cuBLASLt, so that
 * tests/cuda_dev/abi_check.c can include this header next to NVIDIA's and
 * check every constant and struct layout against them (where the toolkit
 * is installed).  Opaque handles use NVIDIA's struct tags. */
#ifndef TS_RT_DEV_CUDA_PRIV_H
#define TS_RT_DEV_CUDA_PRIV_H
#include "device.h"

/* ---- the driver API (cuda.h) ---- */
typedef int CuResult;                     /* CUresult: 0 = CUDA_SUCCESS */
typedef int CuDevice;                     /* CUdevice */
typedef unsigned long long CuPtr;         /* CUdeviceptr (v2: 64-bit) */
typedef struct CUctx_st *CuContext;
typedef struct CUmod_st *CuModule;
typedef struct CUfunc_st *CuFunction;
typedef struct CUstream_st *CuStream;
typedef struct CUevent_st *CuEvent;
typedef struct CUgraph_st *CuGraph;
typedef struct CUgraphExec_st *CuGraphExec;
typedef void (*CuHostFn)(void *user);

enum {
  RT_CU_SUCCESS = 0,
  RT_CU_ERROR_INVALID_VALUE = 1,
  RT_CU_ERROR_OUT_OF_MEMORY = 2,
  RT_CU_ERROR_NOT_INITIALIZED = 3,
  RT_CU_ERROR_STUB_LIBRARY = 34,
  RT_CU_ERROR_INSUFFICIENT_DRIVER = 35,
  RT_CU_ERROR_NO_DEVICE = 100,
  RT_CU_ERROR_INVALID_DEVICE = 101,
  RT_CU_ERROR_INVALID_IMAGE = 200,
  RT_CU_ERROR_INVALID_CONTEXT = 201,
  RT_CU_ERROR_NO_BINARY_FOR_GPU = 209,
  RT_CU_ERROR_ECC_UNCORRECTABLE = 214,
  RT_CU_ERROR_INVALID_PTX = 218,
  RT_CU_ERROR_UNSUPPORTED_PTX_VERSION = 222,
  RT_CU_ERROR_INVALID_HANDLE = 400,
  RT_CU_ERROR_ILLEGAL_STATE = 401,
  RT_CU_ERROR_NOT_FOUND = 500,
  RT_CU_ERROR_NOT_READY = 600,
  RT_CU_ERROR_ILLEGAL_ADDRESS = 700,
  RT_CU_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  RT_CU_ERROR_LAUNCH_TIMEOUT = 702,
  RT_CU_ERROR_MISALIGNED_ADDRESS = 716,
  RT_CU_ERROR_LAUNCH_FAILED = 719,
  RT_CU_ERROR_NOT_SUPPORTED = 801,
  RT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  RT_CU_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  RT_CU_ERROR_STREAM_CAPTURE_UNMATCHED = 903,
  RT_CU_ERROR_STREAM_CAPTURE_UNJOINED = 904,
  RT_CU_ERROR_STREAM_CAPTURE_ISOLATION = 905,
  RT_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  RT_CU_ERROR_UNKNOWN = 999
};
enum {
  RT_CU_STREAM_NON_BLOCKING = 0x1,              /* CUstream_flags */
  RT_CU_EVENT_DISABLE_TIMING = 0x2,             /* CUevent_flags */
  RT_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,         /* CUstreamCaptureMode */
  RT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  RT_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
  RT_CU_STREAM_CAPTURE_STATUS_NONE = 0,         /* CUstreamCaptureStatus */
  RT_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  RT_CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
  RT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,   /* CUdevice_attribute */
  RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  RT_CU_JIT_INFO_LOG_BUFFER = 3,                /* CUjit_option */
  RT_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
  RT_CU_JIT_ERROR_LOG_BUFFER = 5,
  RT_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
};

/* Every driver entry point we use: X(field, exported symbol, parameters).
 * The symbols are the real ones behind cuda.h's macros (cuMemAlloc is
 * cuMemAlloc_v2, cuGraphInstantiate is cuGraphInstantiateWithFlags, ...):
 * dlsym sees no macros.  All return CUresult. */
/* the oldest driver the GPU path runs on: CUDA 13.0 (cuDriverGetVersion) */
#define RT_CUDA_MIN_DRIVER 13000

#define RT_CU_FUNCS(X)                                                                                          \
  X(GetErrorName, "cuGetErrorName", (CuResult e, const char **s))                                              \
  X(GetErrorString, "cuGetErrorString", (CuResult e, const char **s))                                          \
  X(Init, "cuInit", (unsigned flags))                                                                          \
  X(DriverGetVersion, "cuDriverGetVersion", (int *v))                                                          \
  X(DeviceGetCount, "cuDeviceGetCount", (int *n))                                                              \
  X(DeviceGet, "cuDeviceGet", (CuDevice *d, int ordinal))                                                      \
  X(DeviceGetName, "cuDeviceGetName", (char *name, int len, CuDevice d))                                       \
  X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *v, int attr, CuDevice d))                                \
  X(DeviceTotalMem, "cuDeviceTotalMem_v2", (size_t *bytes, CuDevice d))                                        \
  X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CuContext *c, CuDevice d)) \
  X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CuDevice d)) \
  X(CtxSetCurrent, "cuCtxSetCurrent", (CuContext c))                                                           \
  X(MemAlloc, "cuMemAlloc_v2", (CuPtr *p, size_t bytes))                                                       \
  X(MemFree, "cuMemFree_v2", (CuPtr p))                                                                        \
  X(MemAllocHost, "cuMemAllocHost_v2", (void **p, size_t bytes))                                               \
  X(MemFreeHost, "cuMemFreeHost", (void *p))                                                                   \
  X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", (CuPtr dst, const void *src, size_t bytes, CuStream s))          \
  X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *dst, CuPtr src, size_t bytes, CuStream s))                \
  X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", (CuPtr dst, CuPtr src, size_t bytes, CuStream s))                \
  X(MemsetD8Async, "cuMemsetD8Async", (CuPtr dst, unsigned char v, size_t n, CuStream s))                     \
  X(StreamCreate, "cuStreamCreate", (CuStream *s, unsigned flags))                                             \
  X(StreamDestroy, "cuStreamDestroy_v2", (CuStream s))                                                         \
  X(StreamSynchronize, "cuStreamSynchronize", (CuStream s))                                                    \
  X(StreamWaitEvent, "cuStreamWaitEvent", (CuStream s, CuEvent e, unsigned flags))                             \
  X(EventCreate, "cuEventCreate", (CuEvent *e, unsigned flags))                                                \
  X(EventDestroy, "cuEventDestroy_v2", (CuEvent e))                                                            \
  X(EventRecord, "cuEventRecord", (CuEvent e, CuStream s))                                                     \
  X(EventElapsedTime, "cuEventElapsedTime_v2", (float *ms, CuEvent start, CuEvent end))                          \
  X(ModuleLoadDataEx, "cuModuleLoadDataEx", (CuModule *m, const void *image, unsigned nopt, int *opt, void **val)) \
  X(ModuleUnload, "cuModuleUnload", (CuModule m))                                                              \
  X(ModuleGetFunction, "cuModuleGetFunction", (CuFunction *f, CuModule m, const char *name))                   \
  X(LaunchKernel, "cuLaunchKernel",                                                                            \
    (CuFunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, \
     CuStream s, void **params, void **extra))                                                                 \
  X(StreamBeginCapture, "cuStreamBeginCapture_v2", (CuStream s, int mode))                                     \
  X(StreamEndCapture, "cuStreamEndCapture", (CuStream s, CuGraph *g))                                          \
  X(GraphInstantiate, "cuGraphInstantiateWithFlags", (CuGraphExec *x, CuGraph g, unsigned long long flags))    \
  X(GraphLaunch, "cuGraphLaunch", (CuGraphExec x, CuStream s))                                                 \
  X(GraphExecDestroy, "cuGraphExecDestroy", (CuGraphExec x))                                                   \
  X(GraphDestroy, "cuGraphDestroy", (CuGraph g))

typedef struct {
#define RT_CU_FIELD(field, sym, params) CuResult(*field) params;
  RT_CU_FUNCS(RT_CU_FIELD)
#undef RT_CU_FIELD
} RtCuDriver;

/* ---- cuBLASLt (cublasLt.h, cublas_api.h, library_types.h) ---- */
typedef int LtStatus;                     /* cublasStatus_t: 0 = CUBLAS_STATUS_SUCCESS */
typedef struct LtContext *LtHandle;       /* cublasLtHandle_t */
typedef struct { uint64_t data[32]; } LtDescOpaque;
typedef struct { uint64_t data[8]; } LtLayoutOpaque, LtPrefOpaque, LtAlgo;
typedef LtDescOpaque *LtDesc;             /* cublasLtMatmulDesc_t */
typedef LtLayoutOpaque *LtLayout;         /* cublasLtMatrixLayout_t */
typedef LtPrefOpaque *LtPref;             /* cublasLtMatmulPreference_t */
typedef struct {                          /* cublasLtMatmulHeuristicResult_t */
  LtAlgo algo;
  size_t workspaceSize;
  LtStatus state;
  float wavesCount;
  int reserved[4];
} LtHeuristic;

enum {
  RT_LT_STATUS_SUCCESS = 0,
  RT_LT_STATUS_NOT_INITIALIZED = 1,
  RT_LT_STATUS_ALLOC_FAILED = 3,
  RT_LT_STATUS_INVALID_VALUE = 7,
  RT_LT_STATUS_ARCH_MISMATCH = 8,
  RT_LT_STATUS_EXECUTION_FAILED = 13,
  RT_LT_STATUS_INTERNAL_ERROR = 14,
  RT_LT_STATUS_NOT_SUPPORTED = 15,
  RT_LT_R_32F = 0, RT_LT_R_64F = 1, RT_LT_R_16F = 2, RT_LT_R_16BF = 14,     /* cudaDataType */
  RT_LT_COMPUTE_32F = 68, RT_LT_COMPUTE_32F_FAST_TF32 = 77, RT_LT_COMPUTE_64F = 70,  /* cublasComputeType_t */
  RT_LT_OP_N = 0, RT_LT_OP_T = 1,                                            /* cublasOperation_t */
  RT_LT_DESC_TRANSA = 3, RT_LT_DESC_TRANSB = 4, RT_LT_DESC_EPILOGUE = 7,     /* cublasLtMatmulDescAttributes_t */
  RT_LT_DESC_BIAS_POINTER = 8, RT_LT_DESC_BIAS_BATCH_STRIDE = 10,
  RT_LT_EPILOGUE_DEFAULT = 1, RT_LT_EPILOGUE_BIAS = 4, RT_LT_EPILOGUE_GELU_BIAS = 36,  /* cublasLtEpilogue_t */
  RT_LT_LAYOUT_BATCH_COUNT = 5, RT_LT_LAYOUT_STRIDED_BATCH_OFFSET = 6,      /* cublasLtMatrixLayoutAttribute_t */
  RT_LT_PREF_MAX_WORKSPACE_BYTES = 1,                                        /* cublasLtMatmulPreferenceAttributes_t */
  RT_LT_PREF_MIN_ALIGNMENT_A_BYTES = 5, RT_LT_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  RT_LT_PREF_MIN_ALIGNMENT_C_BYTES = 7, RT_LT_PREF_MIN_ALIGNMENT_D_BYTES = 8,
  RT_LT_R_8F_E4M3 = 28, RT_LT_R_8F_E5M2 = 29,                               /* fp8 (--fp8): cudaDataType */
  RT_LT_DESC_A_SCALE_POINTER = 17, RT_LT_DESC_B_SCALE_POINTER = 18           /* device float *: D = sa sb op(A) op(B) */
};

typedef struct {
  LtStatus (*Create)(LtHandle *h);
  LtStatus (*Destroy)(LtHandle h);
  const char *(*GetStatusName)(LtStatus s);
  const char *(*GetStatusString)(LtStatus s);
  LtStatus (*DescCreate)(LtDesc *d, int compute, int scale);
  LtStatus (*DescDestroy)(LtDesc d);
  LtStatus (*DescSetAttribute)(LtDesc d, int attr, const void *buf, size_t size);
  LtStatus (*LayoutCreate)(LtLayout *l, int type, uint64_t rows, uint64_t cols, int64_t ld);
  LtStatus (*LayoutDestroy)(LtLayout l);
  LtStatus (*LayoutSetAttribute)(LtLayout l, int attr, const void *buf, size_t size);
  LtStatus (*PrefCreate)(LtPref *p);
  LtStatus (*PrefDestroy)(LtPref p);
  LtStatus (*PrefSetAttribute)(LtPref p, int attr, const void *buf, size_t size);
  LtStatus (*AlgoGetHeuristic)(LtHandle h, LtDesc d, LtLayout a, LtLayout b, LtLayout c, LtLayout dd, LtPref p,
                               int requested, LtHeuristic *out, int *returned);
  LtStatus (*Matmul)(LtHandle h, LtDesc d, const void *alpha, const void *A, LtLayout la, const void *B,
                     LtLayout lb, const void *beta, const void *C, LtLayout lc, void *D, LtLayout ld,
                     const LtAlgo *algo, void *ws, size_t ws_bytes, CuStream s);
} RtLtLib;

/* ---- one opened device (RtDev.impl) ---- */
typedef struct RtLtState RtLtState;        /* dev_cublaslt.c */
typedef struct {
  const RtCuDriver *cu;
  CuDevice dev;
  CuContext ctx;                            /* the device's primary context */
  CuStream stream[RT_DEV_STREAMS];
  CuEvent event[RT_DEV_EVENTS];             /* created on first use */
  CuEvent *timer;                           /* timing events (c_timer), created as needed and reused */
  int ntimer, captimer;
  int capturing;                            /* a graph capture is under way (its stream) + 1 */
  RtLtState *lt;                            /* cuBLASLt: handle, workspace, plans (NULL: not loaded) */
  char lt_why[384];                         /* why cuBLASLt is not there ("" if it is) */
} RtCudaDev;

/* The exported symbol of each table field, for messages. */
typedef struct {
#define RT_CU_NAME(field, sym, params) const char *field;
  RT_CU_FUNCS(RT_CU_NAME)
#undef RT_CU_NAME
} RtCuNames;
extern const RtCuNames rt_cu_names;

/* cu_driver.c: the driver of TS_CUDA_DRIVER / libcuda.so.1 (its path,
 * and whether that is the default), loaded once per path and initialized;
 * NULL with a one-line reason in why. */
const char *rt_cu_driver_path(int *is_default);
const RtCuDriver *rt_cu_driver_load(char *why, size_t n);
/* cu_driver.c: 0 if e is CUDA_SUCCESS; else -1 with "FN failed: NAME (text)
 * (hint: ...)" in err, with "while WHAT" if what is not NULL.  RT_CU_CHECK
 * calls table field `field` and checks its result: every driver call of
 * the device layer goes through it (CONVENTIONS.md 7). */
int rt_cu_fail(const RtCuDriver *cu, CuResult e, const char *fn, const char *what, char *err, size_t n);
#define RT_CU_CHECK(cu, field, what, err, n, ...) \
  rt_cu_fail((cu), (cu)->field(__VA_ARGS__), rt_cu_names.field, (what), (err), (n))
/* Makes the device's context current on this thread (every entry point). */
int rt_cuda_current(RtDev *d, char *err, size_t n);

/* dev_cublaslt.c.  Element type of a GEMM's A and B (ab) and of its C = D
 * and bias (cd): f32 and f64 compute in their own type (ab = cd); bf16 /
 * fp16 A and B compute in f32 (CUBLAS_COMPUTE_32F) into a D of their type
 * or f32. */
typedef enum { RT_LT_ELEM_F32, RT_LT_ELEM_F64, RT_LT_ELEM_BF16, RT_LT_ELEM_F16 } RtLtElem;
/* fp8 A and B (--fp8; no ones vector, no bias epilogue): rt_cublaslt_gemm
 * takes them when g->ab_dtype is an fp8 type (rt_cublaslt_gemm8's rules) */
enum { RT_LT_ELEM_E4M3 = 8, RT_LT_ELEM_E5M2 = 9 };
/* Loads cuBLASLt (TS_CUBLASLT_LIB, else libcublasLt.so.13), makes the
 * handle and the workspace.  Failure is not fatal to the device: the
 * reason goes to lt_why and every GEMM returns it. */
void rt_cublaslt_open(RtDev *d);
void rt_cublaslt_close(RtDev *d);
int rt_cublaslt_gemm(RtDev *d, const RtGemm *g, RtLtElem ab, RtLtElem cd, int stream, char *err, size_t n);
/* The RtDevOps.gemm entry: the elements from g->ab_dtype and g->dtype;
 * a pair cuBLASLt does not take is refused naming the pairs it does. */
int rt_cuda_gemm(RtDev *d, const RtGemm *g, int stream, char *err, size_t n);
/* An fp8 GEMM (--fp8, matmul8): A g->ab_dtype, B g->b8_dtype (IR_VOID:
 * A's), f8e4m3 / f8e5m2 but not both e5m2; D bf16 or f32; the TN form
 * only (ta = 0, tb = 1 in the row-major terms of RtGemm: the executor
 * transposes an operand stored the other way); g->scale_a / scale_b the
 * operands' scale_inv (device f32 scalars); sm_89 or newer.  cuBLASLt's
 * rules, each refused by name before cuBLASLt sees the call. */
int rt_cublaslt_gemm8(RtDev *d, const RtGemm *g, int stream, char *err, size_t n);
/* How many plans (cached descriptor sets + algorithm) the device holds. */
int rt_cublaslt_plans(RtDev *d);

#endif
