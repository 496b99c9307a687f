/* dev_cuda.c - the CUDA device (device.h) over the driver API.
 *
 * NOT BUILT YET (issue 7): the driver-API device layer and cuBLASLt.  What
 * is here is the probe: libcuda.so.1 is loaded with dlopen (binaries start
 * on machines without a driver) and its devices counted; opening one says
 * plainly that the layer is missing, so mrun falls back to CPU ranks
 * instead of pretending. */
#include "device.h"
#include "train.h"

int rt_dev_cuda_count(char *msg, size_t msglen) { return rt_gpu_probe(msg, msglen); }

RtDev *rt_dev_cuda_open(int ordinal, char *err, size_t errlen) {
  char msg[256];
  if (rt_gpu_probe(msg, sizeof msg) <= 0) {
    ts_errf(err, errlen, "%s", msg);
    return NULL;
  }
  ts_errf(err, errlen, "CUDA device %d: the driver-API device layer (runtime/dev_cuda.c) is not built yet", ordinal);
  return NULL;
}
