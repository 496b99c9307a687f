/* fake_cudart.c - the few CUDA runtime calls of runtime/comm/comm_nccl.c
 * (libcudart.so), for test_cuda_dev_nccl: one visible GPU (FAKE_CUDART_DEVICES
 * more), streams that are plain tokens and always finished.  It counts
 * cudaStreamQuery calls per stream, so a test can tell whether the
 * communication layer waited on a stream.  Our reading of the runtime
 * API's documentation, not NVIDIA's behaviour. */
#include <stdio.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

static long queries;
static void *last_queried;

EXPORT int cudaGetDeviceCount(int *n) {
  const char *e = getenv("FAKE_CUDART_DEVICES");
  *n = e && *e ? atoi(e) : 1;
  return 0;
}
EXPORT int cudaSetDevice(int d) {
  int n;
  cudaGetDeviceCount(&n);
  return d >= 0 && d < n ? 0 : 101;   /* cudaErrorInvalidDevice */
}
EXPORT int cudaStreamCreate(void **s) {
  *s = malloc(16);   /* a token: the fake NCCL runs everything at once */
  return *s ? 0 : 2;
}
EXPORT int cudaStreamDestroy(void *s) {
  free(s);
  return 0;
}
EXPORT int cudaStreamQuery(void *s) {
  queries++;
  last_queried = s;
  return 0;
}
EXPORT const char *cudaGetErrorString(int e) { return e == 0 ? "no error" : "fake CUDA runtime error"; }

/* for the test */
EXPORT long fake_cudart_queries(void) { return queries; }
EXPORT void *fake_cudart_last_queried(void) { return last_queried; }
