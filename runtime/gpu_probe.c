/* gpu_probe.c - is there an NVIDIA driver?  The same driver loading as
 * the CUDA device (dev_cuda.c: libcuda.so.1 by dlopen, or TS_CUDA_DRIVER),
 * so the probe and opening a device never disagree.  The binaries never
 * link libcuda and run on machines without a GPU. */
#include "train.h"
#include "device.h"

int rt_gpu_probe(char *msg, size_t msglen) { return rt_dev_cuda_count(msg, msglen); }
