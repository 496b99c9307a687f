/* abi_check.c - our declarations of NVIDIA's ABI (runtime/device/dev_cuda_priv.h,
 * made so the library builds without the toolkit) against the toolkit's
 * own headers, at compile time: every constant and struct layout.  At run
 * time, every symbol the device layer dlsyms must be exported by the
 * toolkit's libcuda link stub and by libcublasLt.
 *   test_cuda_dev_abi STUB_LIBCUDA LIBCUBLASLT */
#include <cuda.h>
#include <cublasLt.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "runtime/device/dev_cuda_priv.h"

#define SAME(ours, theirs) _Static_assert((long long)(ours) == (long long)(theirs), #ours " != " #theirs)

SAME(RT_CU_SUCCESS, CUDA_SUCCESS);
SAME(RT_CU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME(RT_CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME(RT_CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME(RT_CU_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY);
SAME(RT_CU_ERROR_INSUFFICIENT_DRIVER, 35);   /* cudaErrorInsufficientDriver; the driver enum has no name for it */
SAME(RT_CU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME(RT_CU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME(RT_CU_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_IMAGE);
SAME(RT_CU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT);
SAME(RT_CU_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_BINARY_FOR_GPU);
SAME(RT_CU_ERROR_ECC_UNCORRECTABLE, CUDA_ERROR_ECC_UNCORRECTABLE);
SAME(RT_CU_ERROR_INVALID_PTX, CUDA_ERROR_INVALID_PTX);
SAME(RT_CU_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
SAME(RT_CU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME(RT_CU_ERROR_ILLEGAL_STATE, CUDA_ERROR_ILLEGAL_STATE);
SAME(RT_CU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND);
SAME(RT_CU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY);
SAME(RT_CU_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS);
SAME(RT_CU_ERROR_LAUNCH_OUT_OF_RESOURCES, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
SAME(RT_CU_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_TIMEOUT);
SAME(RT_CU_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_MISALIGNED_ADDRESS);
SAME(RT_CU_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_FAILED);
SAME(RT_CU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME(RT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
SAME(RT_CU_ERROR_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
SAME(RT_CU_ERROR_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
SAME(RT_CU_ERROR_STREAM_CAPTURE_UNJOINED, CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
SAME(RT_CU_ERROR_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
SAME(RT_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
SAME(RT_CU_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN);
SAME(RT_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING);
SAME(RT_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING);
SAME(RT_CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL);
SAME(RT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
SAME(RT_CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);
SAME(RT_CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE);
SAME(RT_CU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_ACTIVE);
SAME(RT_CU_STREAM_CAPTURE_STATUS_INVALIDATED, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
SAME(RT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
SAME(RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME(RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME(RT_CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER);
SAME(RT_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
SAME(RT_CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER);
SAME(RT_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
_Static_assert(sizeof(CuPtr) == sizeof(CUdeviceptr), "CUdeviceptr");
_Static_assert(sizeof(CuResult) == sizeof(CUresult) && sizeof(CuDevice) == sizeof(CUdevice), "CUresult / CUdevice");

SAME(RT_LT_STATUS_SUCCESS, CUBLAS_STATUS_SUCCESS);
SAME(RT_LT_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_NOT_INITIALIZED);
SAME(RT_LT_STATUS_ALLOC_FAILED, CUBLAS_STATUS_ALLOC_FAILED);
SAME(RT_LT_STATUS_INVALID_VALUE, CUBLAS_STATUS_INVALID_VALUE);
SAME(RT_LT_STATUS_ARCH_MISMATCH, CUBLAS_STATUS_ARCH_MISMATCH);
SAME(RT_LT_STATUS_EXECUTION_FAILED, CUBLAS_STATUS_EXECUTION_FAILED);
SAME(RT_LT_STATUS_INTERNAL_ERROR, CUBLAS_STATUS_INTERNAL_ERROR);
SAME(RT_LT_STATUS_NOT_SUPPORTED, CUBLAS_STATUS_NOT_SUPPORTED);
SAME(RT_LT_R_32F, CUDA_R_32F);
SAME(RT_LT_R_64F, CUDA_R_64F);
SAME(RT_LT_R_16F, CUDA_R_16F);
SAME(RT_LT_R_16BF, CUDA_R_16BF);
SAME(RT_LT_COMPUTE_32F, CUBLAS_COMPUTE_32F);
SAME(RT_LT_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_FAST_TF32);
SAME(RT_LT_COMPUTE_64F, CUBLAS_COMPUTE_64F);
SAME(RT_LT_OP_N, CUBLAS_OP_N);
SAME(RT_LT_OP_T, CUBLAS_OP_T);
SAME(RT_LT_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSA);
SAME(RT_LT_DESC_TRANSB, CUBLASLT_MATMUL_DESC_TRANSB);
SAME(RT_LT_DESC_EPILOGUE, CUBLASLT_MATMUL_DESC_EPILOGUE);
SAME(RT_LT_DESC_BIAS_POINTER, CUBLASLT_MATMUL_DESC_BIAS_POINTER);
SAME(RT_LT_DESC_BIAS_BATCH_STRIDE, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);
SAME(RT_LT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_DEFAULT);
SAME(RT_LT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_BIAS);
SAME(RT_LT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_BIAS);
SAME(RT_LT_LAYOUT_BATCH_COUNT, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
SAME(RT_LT_LAYOUT_STRIDED_BATCH_OFFSET, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
SAME(RT_LT_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
SAME(RT_LT_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
SAME(RT_LT_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
SAME(RT_LT_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
SAME(RT_LT_PREF_MIN_ALIGNMENT_D_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
/* the structs we pass by pointer or value */
_Static_assert(sizeof(LtAlgo) == sizeof(cublasLtMatmulAlgo_t), "cublasLtMatmulAlgo_t");
_Static_assert(sizeof(LtDescOpaque) == sizeof(cublasLtMatmulDescOpaque_t), "cublasLtMatmulDescOpaque_t");
_Static_assert(sizeof(LtLayoutOpaque) == sizeof(cublasLtMatrixLayoutOpaque_t), "cublasLtMatrixLayoutOpaque_t");
_Static_assert(sizeof(LtHeuristic) == sizeof(cublasLtMatmulHeuristicResult_t), "heuristic result size");
_Static_assert(offsetof(LtHeuristic, workspaceSize) == offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize) &&
               offsetof(LtHeuristic, state) == offsetof(cublasLtMatmulHeuristicResult_t, state) &&
               offsetof(LtHeuristic, wavesCount) == offsetof(cublasLtMatmulHeuristicResult_t, wavesCount),
               "heuristic result layout");
_Static_assert(sizeof(cublasStatus_t) == sizeof(LtStatus), "cublasStatus_t");
_Static_assert(sizeof(cublasComputeType_t) == sizeof(int) && sizeof(cudaDataType) == sizeof(int) &&
               sizeof(cublasLtMatmulDescAttributes_t) == sizeof(int), "enums passed as int");

/* The cuBLASLt entry points dev_cublaslt.c loads (its own table is static). */
static const char *const lt_syms[] = {
  "cublasLtCreate", "cublasLtDestroy", "cublasLtGetStatusName", "cublasLtGetStatusString",
  "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
  "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatrixLayoutSetAttribute",
  "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
  "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
};

int main(int argc, char **argv) {
  int fails = 0;
  if (argc < 3) {
    fprintf(stderr, "usage: test_cuda_dev_abi STUB_LIBCUDA LIBCUBLASLT\n");
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    printf("FAIL: cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  int n = 0;
#define RT_CU_HAS(field, sym, params) \
  n++;                                \
  if (!dlsym(h, sym)) { printf("FAIL: %s does not export %s\n", argv[1], sym); fails++; }
  RT_CU_FUNCS(RT_CU_HAS)
#undef RT_CU_HAS
  /* the symbol we load for field F is what cuda.h makes of cuF (its
   * macros pick the versioned entry point: cuMemAlloc -> cuMemAlloc_v2) */
#define STR(x) #x
#define XSTR(x) STR(x)
#define RT_CU_SAME_NAME(field, sym, params) \
  if (strcmp(sym, XSTR(cu##field))) { printf("FAIL: we load %s, cuda.h calls %s\n", sym, XSTR(cu##field)); fails++; }
  RT_CU_FUNCS(RT_CU_SAME_NAME)
#undef RT_CU_SAME_NAME
  printf("%d driver symbols exported by %s\n", n, argv[1]);
  void *l = dlopen(argv[2], RTLD_LAZY | RTLD_LOCAL);
  if (!l) {
    printf("%s cannot be loaded here (%s): its symbols are not checked\n", argv[2], dlerror());
  } else {
    for (size_t i = 0; i < sizeof lt_syms / sizeof lt_syms[0]; i++)
      if (!dlsym(l, lt_syms[i])) { printf("FAIL: %s does not export %s\n", argv[2], lt_syms[i]); fails++; }
    printf("%zu cuBLASLt symbols exported by %s\n", sizeof lt_syms / sizeof lt_syms[0], argv[2]);
  }
  printf("abi: %d failures\n", fails);
  return fails ? 1 : 0;
}
