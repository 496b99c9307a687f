/* gpu_probe.c - is there an NVIDIA driver?  libcuda is loaded lazily with
 * dlopen, only for this probe, so the binaries never link it and run on
 * machines without a GPU. */
#include "train.h"
#include <dlfcn.h>

int rt_gpu_probe(char *msg, size_t msglen) {
  void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) {
    snprintf(msg, msglen, "no GPU driver found (libcuda.so.1)");
    return 0;
  }
  typedef int (*InitFn)(unsigned);
  typedef int (*CountFn)(int *);
  InitFn init = (InitFn)dlsym(h, "cuInit");
  CountFn count = (CountFn)dlsym(h, "cuDeviceGetCount");
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) {
    snprintf(msg, msglen, "GPU driver found (libcuda.so.1) but it reports no usable device");
    n = 0;
  } else {
    snprintf(msg, msglen, "GPU driver found: %d device(s)", n);
  }
  dlclose(h);
  return n;
}
