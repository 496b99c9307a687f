/* cu_driver.c - the CUDA driver API as a table of functions (RtCuDriver,
 * dev_cuda_priv.h): libcuda.so.1 loaded with ir/dl.h's loader
 * (TS_CUDA_DRIVER overrides the path: the tests point it at fake drivers,
 * so one process may load several, each once), cuInit, and the checks
 * every driver call of the device layer goes through (RT_CU_CHECK: the
 * call, CUDA's error name and text, a hint).  Shared by the device
 * (dev_cuda.c) and its GEMMs (dev_cublaslt.c). */
#include "dev_cuda_priv.h"
#include "ir/dl.h"

const RtCuNames rt_cu_names = {
#define RT_CU_NAME_INIT(field, sym, params) .field = sym,
  RT_CU_FUNCS(RT_CU_NAME_INIT)
#undef RT_CU_NAME_INIT
};

static const TsDlSym cu_syms[] = {
#define RT_CU_SYM(field, sym, params) TS_DL_SYM(RtCuDriver, field, sym),
  RT_CU_FUNCS(RT_CU_SYM)
#undef RT_CU_SYM
};

/* ---- the driver, loaded once per path ---- */

const char *rt_cu_driver_path(int *is_default) {
  const char *p = getenv("TS_CUDA_DRIVER");
  *is_default = !p || !*p;
  return *is_default ? "libcuda.so.1" : p;
}

/* Opens path, finds every entry point, calls cuInit(0).  0, or -1 with
 * the reason in why. */
static int driver_open(const char *path, void *table, char *why, size_t n) {
  RtCuDriver *cu = table;
  int is_default;
  rt_cu_driver_path(&is_default);
  const char *files[] = {path, NULL};
  char detail[900];
  TsDlStatus st;
  if (!ts_dl_load(files, cu_syms, (int)(sizeof cu_syms / sizeof cu_syms[0]), cu, NULL, &st, detail, sizeof detail)) {
    /* the default case is the one line mrun and its tests print */
    if (st == TS_DL_NO_SYMBOL)
      ts_errf(why, n, "the GPU driver %s has no %s (hint: the driver is older than CUDA 12 needs: update it)", path,
              detail);
    else if (is_default) ts_errf(why, n, "no GPU driver found (libcuda.so.1)");
    else ts_errf(why, n, "no GPU driver found (TS_CUDA_DRIVER=%s: %s)", path, detail);
    return -1;
  }
  char msg[300];
  if (RT_CU_CHECK(cu, Init, NULL, msg, sizeof msg, 0) != 0) {
    ts_errf(why, n, "GPU driver found (%s) but %s", path, msg);
    return -1;
  }
  /* The GPU path is built for CUDA 13: cuBLASLt 13 and NVRTC 13's PTX
   * (PTX ISA 9.0) need a driver of CUDA 13 (the 580 series) or newer; an
   * older one would fail later, at the first PTX load or GEMM, with an
   * unclear error. */
  int v = 0;
  if (RT_CU_CHECK(cu, DriverGetVersion, NULL, msg, sizeof msg, &v) != 0) {
    ts_errf(why, n, "GPU driver found (%s) but %s", path, msg);
    return -1;
  }
  if (v < RT_CUDA_MIN_DRIVER) {
    ts_errf(why, n, "the GPU driver (%s) supports CUDA %d.%d; Tessera's GPU path needs CUDA %d.%d or newer (NVIDIA "
            "driver 580 or newer; nvidia-smi shows the driver): update the driver, or use --cpu", path, v / 1000,
            v % 1000 / 10, RT_CUDA_MIN_DRIVER / 1000, RT_CUDA_MIN_DRIVER % 1000 / 10);
    return -1;
  }
  return 0;
}

const RtCuDriver *rt_cu_driver_load(char *why, size_t n) {
  static TsDlCache drivers = TS_DL_CACHE_INIT;
  int is_default;
  return ts_dl_cached(&drivers, rt_cu_driver_path(&is_default), sizeof(RtCuDriver), driver_open, why, n);
}

/* ---- errors ---- */

static const char *cu_hint(CuResult e) {
  switch (e) {
  case RT_CU_ERROR_OUT_OF_MEMORY:
    return "the GPU is out of memory: a smaller micro batch, more pipeline stages or ZeRO; another process on the "
           "GPU? (nvidia-smi)";
  case RT_CU_ERROR_NOT_INITIALIZED: return "cuInit was not called or failed";
  case RT_CU_ERROR_STUB_LIBRARY:
    return "the libcuda.so.1 found is the toolkit's link stub, not a driver: check LD_LIBRARY_PATH";
  case RT_CU_ERROR_INSUFFICIENT_DRIVER: return "the NVIDIA driver is older than this CUDA version needs: update it";
  case RT_CU_ERROR_NO_DEVICE: return "no GPU is visible: CUDA_VISIBLE_DEVICES? does nvidia-smi list one?";
  case RT_CU_ERROR_INVALID_DEVICE: return "no GPU of that number: CUDA_VISIBLE_DEVICES?";
  case RT_CU_ERROR_INVALID_IMAGE:
  case RT_CU_ERROR_NO_BINARY_FOR_GPU:
    return "the cubin was made for another GPU architecture: recompile with mcc --target sm_XX for this GPU";
  case RT_CU_ERROR_INVALID_PTX:
  case RT_CU_ERROR_UNSUPPORTED_PTX_VERSION:
    return "the driver cannot JIT-compile this PTX (it is older than the toolkit that made it?): update the driver "
           "or compile a cubin for this GPU (mcc --target sm_XX)";
  case RT_CU_ERROR_NOT_FOUND:
    return "the module has no kernel of that name: the image and the program do not match (rebuild the plan)";
  case RT_CU_ERROR_ILLEGAL_ADDRESS:
  case RT_CU_ERROR_MISALIGNED_ADDRESS:
  case RT_CU_ERROR_LAUNCH_FAILED:
    return "a kernel before this point faulted (out-of-bounds or misaligned access) and the context is lost: rerun "
           "with CUDA_LAUNCH_BLOCKING=1 under compute-sanitizer to find it";
  case RT_CU_ERROR_LAUNCH_OUT_OF_RESOURCES:
    return "the kernel needs more registers or shared memory than its block size allows";
  case RT_CU_ERROR_LAUNCH_TIMEOUT: return "a kernel ran too long (a display watchdog?)";
  case RT_CU_ERROR_ECC_UNCORRECTABLE: return "a GPU memory error: see nvidia-smi -q; the GPU may need a reset";
  case RT_CU_ERROR_INVALID_CONTEXT: return "no current context on this thread, or it was destroyed";
  case RT_CU_ERROR_INVALID_VALUE: return "a bad argument: a pointer outside device memory, or a bad size";
  case RT_CU_ERROR_INVALID_HANDLE: return "a stream, event, module or graph used after it was destroyed";
  case RT_CU_ERROR_NOT_SUPPORTED: return "this GPU or driver does not support the call";
  case RT_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED:
  case RT_CU_ERROR_STREAM_CAPTURE_INVALIDATED:
  case RT_CU_ERROR_STREAM_CAPTURE_UNMATCHED:
  case RT_CU_ERROR_STREAM_CAPTURE_UNJOINED:
  case RT_CU_ERROR_STREAM_CAPTURE_ISOLATION:
  case RT_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD:
    return "something CUDA Graph capture does not allow (an allocation, a synchronization, a stream left out of "
           "the capture) happened during a capture; TS_CUDA_GRAPHS=0 runs without graphs";
  default: return "see the CUDA driver API documentation of this error";
  }
}

int rt_cu_fail(const RtCuDriver *cu, CuResult e, const char *fn, const char *what, char *err, size_t n) {
  if (e == RT_CU_SUCCESS) return 0;
  const char *name = NULL, *text = NULL;
  if (cu && cu->GetErrorName(e, &name) != RT_CU_SUCCESS) name = NULL;
  if (cu && cu->GetErrorString(e, &text) != RT_CU_SUCCESS) text = NULL;
  char num[32];
  snprintf(num, sizeof num, "CUDA error %d", (int)e);
  return ts_errf(err, n, "%s failed: %s (%s)%s%s (hint: %s)", fn, name ? name : num, text ? text : "no description",
                 what ? " while " : "", what ? what : "", cu_hint(e));
}

int rt_cuda_current(RtDev *d, char *err, size_t n) {
  RtCudaDev *c = d->impl;
  return RT_CU_CHECK(c->cu, CtxSetCurrent, "making the device's context current", err, n, c->ctx);
}
