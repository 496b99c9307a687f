/* dev_cuda.c - the CUDA device (device.h) over the driver API.
 *
 * libcuda.so.1 is loaded with dlopen (TS_CUDA_DRIVER overrides the path:
 * the tests point it at a fake driver), so the binaries start on machines
 * without a driver; there rt_dev_cuda_open fails with one line and mrun
 * runs CPU ranks.  The few types and entry points we call are declared in
 * dev_cuda_priv.h, under their real exported names (the _v2 symbols behind
 * cuda.h's macros).
 *
 * One device = its primary context (the one the CUDA runtime inside
 * cuBLASLt and NCCL uses too, so the three share memory and streams), two
 * non-blocking streams (compute, comm), RT_DEV_EVENTS events without
 * timing, and cuBLASLt (dev_cublaslt.c).  Modules load from the cubin when
 * it is for the device's arch, else from the PTX (the driver JITs it),
 * else from the source through NVRTC.  Every kernel takes one parameter,
 * the CgCudaArgs struct by value (kernelParams = {&args}).  Graphs are
 * stream captures in thread-local mode: an allocation or a synchronization
 * by this thread during a capture is an error, not silently outside the
 * graph.  Every driver call goes through RT_CU_CHECK: the message names
 * the call, CUDA's error name and text, and a hint.
 *
 * Assumes one thread drives a device (the context is made current on
 * every entry, so a device may still be used from another thread). */
#include "dev_cuda_priv.h"

/* ---- the device ---- */

static RtCudaDev *cd(RtDev *d) { return d->impl; }
static CuPtr dptr(const void *p) { return (CuPtr)(uintptr_t)p; }

static int bad_stream(int stream, char *err, size_t n) {
  if (stream >= 0 && stream < RT_DEV_STREAMS) return 0;
  return ts_errf(err, n, "internal error: stream %d is not one of the device's %d", stream, RT_DEV_STREAMS);
}

static int c_alloc(RtDev *d, size_t bytes, void **ptr, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  *ptr = NULL;
  if (rt_cuda_current(d, err, n)) return -1;
  char what[200];
  snprintf(what, sizeof what, "allocating %zu bytes on %s", bytes, d->label);
  CuPtr p = 0;
  if (RT_CU_CHECK(c->cu, MemAlloc, what, err, n, &p, bytes ? bytes : 256)) return -1;
  *ptr = (void *)(uintptr_t)p;
  return 0;
}

static void c_free(RtDev *d, void *p) {
  char err[256];
  if (!p || rt_cuda_current(d, err, sizeof err)) return;
  (void)RT_CU_CHECK(cd(d)->cu, MemFree, NULL, err, sizeof err, dptr(p));   /* nothing to tell the caller */
}

static int c_host_alloc(RtDev *d, size_t bytes, void **ptr, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  *ptr = NULL;
  if (rt_cuda_current(d, err, n)) return -1;
  char what[200];
  snprintf(what, sizeof what, "allocating %zu bytes of page-locked host memory for %s", bytes, d->label);
  if (RT_CU_CHECK(c->cu, MemAllocHost, what, err, n, ptr, bytes ? bytes : 64)) return -1;
  memset(*ptr, 0, bytes ? bytes : 64);
  return 0;
}

static void c_host_free(RtDev *d, void *p) {
  char err[256];
  if (!p || rt_cuda_current(d, err, sizeof err)) return;
  (void)RT_CU_CHECK(cd(d)->cu, MemFreeHost, NULL, err, sizeof err, p);
}

static int c_h2d(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (!bytes) return 0;
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, MemcpyHtoDAsync, "copying host to device", err, n, dptr(dst), src, bytes,
                     c->stream[stream]);
}

static int c_d2h(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (!bytes) return 0;
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, MemcpyDtoHAsync, "copying device to host", err, n, dst, dptr(src), bytes,
                     c->stream[stream]);
}

static int c_d2d(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (!bytes) return 0;
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, MemcpyDtoDAsync, "copying device to device", err, n, dptr(dst), dptr(src), bytes,
                     c->stream[stream]);
}

static int c_memset0(RtDev *d, void *dst, size_t bytes, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (!bytes) return 0;
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, MemsetD8Async, "zeroing device memory", err, n, dptr(dst), 0, bytes, c->stream[stream]);
}

/* ---- modules: the loaded image and its functions by name ---- */

typedef struct {
  char *name;           /* NULL: empty slot */
  CuFunction f;
} FnSlot;

struct RtDevModule {
  CuModule m;
  const char *from;     /* "cubin", "PTX", "NVRTC": what was loaded, for messages */
  FnSlot *slot;         /* open addressing, cap a power of two */
  int cap, n;
};

static FnSlot *fn_slot(RtDevModule *mod, const char *name) {
  size_t i = ts_hash64(name, strlen(name), 0) & (size_t)(mod->cap - 1);
  while (mod->slot[i].name && strcmp(mod->slot[i].name, name) != 0) i = (i + 1) & (size_t)(mod->cap - 1);
  return &mod->slot[i];
}

static void fn_grow(RtDevModule *mod) {
  FnSlot *old = mod->slot;
  int oldcap = mod->cap;
  mod->cap = oldcap ? 2 * oldcap : 64;
  mod->slot = ts_xcalloc((size_t)mod->cap, sizeof *mod->slot);
  for (int i = 0; i < oldcap; i++)
    if (old[i].name) *fn_slot(mod, old[i].name) = old[i];
  free(old);
}

/* The function `name` of mod, looked up once (cuModuleGetFunction), then
 * from the table. */
static int fn_get(RtDev *d, RtDevModule *mod, const char *name, CuFunction *f, char *err, size_t n) {
  if (mod->cap) {
    FnSlot *s = fn_slot(mod, name);
    if (s->name) { *f = s->f; return 0; }
  }
  char what[160];
  snprintf(what, sizeof what, "looking up kernel %s in the module (loaded from its %s)", name, mod->from);
  if (RT_CU_CHECK(cd(d)->cu, ModuleGetFunction, what, err, n, f, mod->m, name)) return -1;
  if (10 * (mod->n + 1) > 7 * mod->cap) fn_grow(mod);
  FnSlot *s = fn_slot(mod, name);
  s->name = ts_xstrdup(name);
  s->f = *f;
  mod->n++;
  return 0;
}

/* Loads PTX, with the JIT's error log in the message when it fails. */
static int load_ptx(RtDev *d, CuModule *m, const char *ptx, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  char log[2048] = "";
  int opt[2] = {RT_CU_JIT_ERROR_LOG_BUFFER, RT_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *val[2] = {log, (void *)(uintptr_t)sizeof log};
  CuResult e = c->cu->ModuleLoadDataEx(m, ptx, 2, opt, val);
  if (e == RT_CU_SUCCESS) return 0;
  log[sizeof log - 1] = 0;
  for (char *q = log; *q; q++)
    if (*q == '\n') *q = ' ';
  char what[2200];
  snprintf(what, sizeof what, "JIT-compiling the PTX for sm_%d%s%s", d->sm, log[0] ? ": " : "", log);
  return rt_cu_fail(c->cu, e, rt_cu_names.ModuleLoadDataEx, what, err, n);
}

static int c_module_load(RtDev *d, const RtDevImage *img, RtDevModule **out, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  *out = NULL;
  if (rt_cuda_current(d, err, n)) return -1;
  CuModule m = NULL;
  const char *from;
  if (img->cubin && img->cubin_len && img->sm > 0 && img->sm == d->sm) {
    char what[64];
    snprintf(what, sizeof what, "loading the cubin for sm_%d", img->sm);
    if (RT_CU_CHECK(c->cu, ModuleLoadDataEx, what, err, n, &m, img->cubin, 0, NULL, NULL)) return -1;
    from = "cubin";
  } else if (img->ptx && img->ptx[0]) {
    if (load_ptx(d, &m, img->ptx, err, n)) return -1;
    from = "PTX";
  } else if (img->source && d->sm > 0) {
    /* no binary for this arch: compile the source here (NVRTC by dlopen) */
    char arch[16], why[1024];
    snprintf(arch, sizeof arch, "sm_%d", d->sm);
    CgNvrtcOut o;
    if (cg_nvrtc_compile(img->source, arch, &o, why, sizeof why) != 0) {
      cg_nvrtc_out_free(&o);
      return ts_errf(err, n, "the image has no cubin or PTX for %s and compiling its source failed: %s", arch, why);
    }
    int rc = RT_CU_CHECK(c->cu, ModuleLoadDataEx, "loading the cubin NVRTC made from the source", err, n, &m,
                         o.cubin, 0, NULL, NULL);
    cg_nvrtc_out_free(&o);
    if (rc) return -1;
    from = "NVRTC";
  } else {
    return ts_errf(err, n, "the module image has no cubin for sm_%d, no PTX and no source (hint: recompile with mcc "
                   "--target sm_%d)", d->sm, d->sm);
  }
  RtDevModule *mod = ts_xcalloc(1, sizeof *mod);
  mod->m = m;
  mod->from = from;
  *out = mod;
  return 0;
}

static void c_module_free(RtDev *d, RtDevModule *mod) {
  if (!mod) return;
  char err[256];
  if (rt_cuda_current(d, err, sizeof err) == 0)
    (void)RT_CU_CHECK(cd(d)->cu, ModuleUnload, NULL, err, sizeof err, mod->m);
  for (int i = 0; i < mod->cap; i++) free(mod->slot[i].name);
  free(mod->slot);
  free(mod);
}

static int c_launch(RtDev *d, RtDevModule *mod, const CgCudaLaunch *l, const CgCudaArgs *a, int stream, char *err,
                    size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  if (l->blocks < 1 || l->blocks > 2147483647LL || l->threads < 1 || l->threads > 1024)
    return ts_errf(err, n, "internal error: kernel %s launched with %lld blocks of %d threads", l->name,
                   (long long)l->blocks, l->threads);
  CuFunction f;
  if (fn_get(d, mod, l->name, &f, err, n)) return -1;
  /* the one parameter, by value: the driver copies *a when the launch is
   * issued (or captured), so the caller may reuse its struct at once */
  void *params[1] = {(void *)a};
  char what[160];
  snprintf(what, sizeof what, "launching %s (%lld blocks of %d threads)", l->name, (long long)l->blocks, l->threads);
  return RT_CU_CHECK(c->cu, LaunchKernel, what, err, n, f, (unsigned)l->blocks, 1, 1, (unsigned)l->threads, 1, 1, 0,
                     c->stream[stream], params, NULL);
}

static int c_sync(RtDev *d, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, StreamSynchronize, stream == RT_STREAM_COMM ? "waiting for the comm stream"
                     : "waiting for the compute stream", err, n, c->stream[stream]);
}

static int bad_event(int event, char *err, size_t n) {
  if (event >= 0 && event < RT_DEV_EVENTS) return 0;
  return ts_errf(err, n, "internal error: event %d is not one of the device's %d", event, RT_DEV_EVENTS);
}

static int c_event_record(RtDev *d, int event, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || bad_event(event, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, EventRecord, NULL, err, n, c->event[event], c->stream[stream]);
}

static int c_stream_wait(RtDev *d, int stream, int event, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || bad_event(event, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, StreamWaitEvent, NULL, err, n, c->stream[stream], c->event[event], 0);
}

/* ---- timing events (TS_RT_PROFILE on a GPU) ---- */

static int c_timer(RtDev *d, int stream, int *id, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  if (c->ntimer == c->captimer) {
    int cap = c->captimer ? 2 * c->captimer : 256;
    c->timer = ts_xrealloc(c->timer, (size_t)cap * sizeof *c->timer);
    memset(c->timer + c->captimer, 0, (size_t)(cap - c->captimer) * sizeof *c->timer);
    c->captimer = cap;
  }
  CuEvent *e = &c->timer[c->ntimer];
  if (!*e && RT_CU_CHECK(c->cu, EventCreate, "creating a timing event", err, n, e, 0)) return -1;
  if (RT_CU_CHECK(c->cu, EventRecord, NULL, err, n, *e, c->stream[stream])) return -1;
  *id = c->ntimer++;
  return 0;
}

static int c_timer_ms(RtDev *d, int from, int to, double *ms, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (from < 0 || to < 0 || from >= c->ntimer || to >= c->ntimer)
    return ts_errf(err, n, "internal error: timing events %d, %d of %d", from, to, c->ntimer);
  float f = 0;
  if (rt_cuda_current(d, err, n) ||
      RT_CU_CHECK(c->cu, EventElapsedTime, "reading a timing event", err, n, &f, c->timer[from], c->timer[to]))
    return -1;
  *ms = f;
  return 0;
}

static void c_timer_reset(RtDev *d) { cd(d)->ntimer = 0; }

/* ---- CUDA Graphs by stream capture ---- */

struct RtDevGraph {
  CuGraph g;
  CuGraphExec x;
};

static int c_graph_begin(RtDev *d, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  if (c->capturing) return ts_errf(err, n, "internal error: a graph capture is already under way on stream %d",
                                   c->capturing - 1);
  if (RT_CU_CHECK(c->cu, StreamBeginCapture, "starting a graph capture", err, n, c->stream[stream],
                  RT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)) return -1;
  c->capturing = stream + 1;
  return 0;
}

static int c_graph_end(RtDev *d, int stream, RtDevGraph **out, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  *out = NULL;
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  if (c->capturing != stream + 1)
    return ts_errf(err, n, "internal error: no graph capture under way on stream %d", stream);
  c->capturing = 0;
  CuGraph g = NULL;
  if (RT_CU_CHECK(c->cu, StreamEndCapture, "ending the graph capture", err, n, c->stream[stream], &g)) {
    char tmp[256];
    if (g) (void)RT_CU_CHECK(c->cu, GraphDestroy, NULL, tmp, sizeof tmp, g);
    return -1;
  }
  CuGraphExec x = NULL;
  if (RT_CU_CHECK(c->cu, GraphInstantiate, "instantiating the captured graph", err, n, &x, g, 0)) {
    char tmp[256];
    (void)RT_CU_CHECK(c->cu, GraphDestroy, NULL, tmp, sizeof tmp, g);
    return -1;
  }
  RtDevGraph *G = ts_xcalloc(1, sizeof *G);
  G->g = g;
  G->x = x;
  *out = G;
  return 0;
}

static int c_graph_launch(RtDev *d, RtDevGraph *g, int stream, char *err, size_t n) {
  RtCudaDev *c = cd(d);
  if (bad_stream(stream, err, n) || rt_cuda_current(d, err, n)) return -1;
  return RT_CU_CHECK(c->cu, GraphLaunch, "replaying a graph", err, n, g->x, c->stream[stream]);
}

static void c_graph_free(RtDev *d, RtDevGraph *g) {
  if (!g) return;
  RtCudaDev *c = cd(d);
  char err[256];
  if (rt_cuda_current(d, err, sizeof err) == 0) {
    (void)RT_CU_CHECK(c->cu, GraphExecDestroy, NULL, err, sizeof err, g->x);
    (void)RT_CU_CHECK(c->cu, GraphDestroy, NULL, err, sizeof err, g->g);
  }
  free(g);
}

static void *c_stream_handle(RtDev *d, int stream) {
  if (stream < 0 || stream >= RT_DEV_STREAMS) return NULL;
  return cd(d)->stream[stream];
}

/* ---- open / close ---- */

static void c_close(RtDev *d) {
  if (!d) return;
  RtCudaDev *c = d->impl;
  if (c) {
    char err[256];   /* nothing to report: close cannot fail */
    if (c->ctx && rt_cuda_current(d, err, sizeof err) == 0) {
      for (int s = 0; s < RT_DEV_STREAMS; s++)   /* nothing may still run on what we free */
        if (c->stream[s]) (void)RT_CU_CHECK(c->cu, StreamSynchronize, NULL, err, sizeof err, c->stream[s]);
      rt_cublaslt_close(d);
      for (int e = 0; e < RT_DEV_EVENTS; e++)
        if (c->event[e]) (void)RT_CU_CHECK(c->cu, EventDestroy, NULL, err, sizeof err, c->event[e]);
      for (int e = 0; e < c->captimer; e++)
        if (c->timer[e]) (void)RT_CU_CHECK(c->cu, EventDestroy, NULL, err, sizeof err, c->timer[e]);
      for (int s = 0; s < RT_DEV_STREAMS; s++)
        if (c->stream[s]) (void)RT_CU_CHECK(c->cu, StreamDestroy, NULL, err, sizeof err, c->stream[s]);
    }
    if (c->ctx) {   /* the thread keeps no current context that may be gone with our reference */
      (void)RT_CU_CHECK(c->cu, CtxSetCurrent, NULL, err, sizeof err, NULL);
      (void)RT_CU_CHECK(c->cu, DevicePrimaryCtxRelease, NULL, err, sizeof err, c->dev);
    }
    free(c->timer);
    free(c);
  }
  free(d);
}

static const RtDevOps cuda_ops = {
  .name = "cuda", .close = c_close, .alloc = c_alloc, .free = c_free, .h2d = c_h2d, .d2h = c_d2h, .d2d = c_d2d,
  .memset0 = c_memset0, .module_load = c_module_load, .module_free = c_module_free, .launch = c_launch,
  .gemm = rt_cuda_gemm, .sync = c_sync, .event_record = c_event_record, .stream_wait = c_stream_wait,
  .graph_begin = c_graph_begin, .graph_end = c_graph_end, .graph_launch = c_graph_launch,
  .graph_free = c_graph_free, .stream_handle = c_stream_handle,
  .timer = c_timer, .timer_ms = c_timer_ms, .timer_reset = c_timer_reset,
  .host_alloc = c_host_alloc, .host_free = c_host_free,
};

int rt_dev_cuda_count(char *msg, size_t msglen) {
  const RtCuDriver *cu = rt_cu_driver_load(msg, msglen);
  if (!cu) return 0;
  int is_default, n = 0;
  const char *path = rt_cu_driver_path(&is_default);
  char why[300];
  if (RT_CU_CHECK(cu, DeviceGetCount, NULL, why, sizeof why, &n)) {
    snprintf(msg, msglen, "GPU driver found (%s) but %s", path, why);
    return 0;
  }
  if (n <= 0) {
    snprintf(msg, msglen, "GPU driver found (%s) but it reports no usable device", path);
    return 0;
  }
  snprintf(msg, msglen, "GPU driver found: %d device(s)", n);
  return n;
}

/* The part of open that can fail after the RtDev exists (close undoes it). */
static int open_device(RtDev *d, int ordinal, char *err, size_t n) {
  RtCudaDev *c = d->impl;
  const RtCuDriver *cu = c->cu;
  int count = 0;
  if (RT_CU_CHECK(cu, DeviceGetCount, NULL, err, n, &count)) return -1;
  if (ordinal < 0 || ordinal >= count)
    return ts_errf(err, n, "there is no GPU %d: the driver reports %d (hint: CUDA_VISIBLE_DEVICES?)", ordinal, count);
  if (RT_CU_CHECK(cu, DeviceGet, NULL, err, n, &c->dev, ordinal)) return -1;
  char name[96] = "?";
  int major = 0, minor = 0;
  size_t mem = 0;
  if (RT_CU_CHECK(cu, DeviceGetName, NULL, err, n, name, (int)sizeof name, c->dev) ||
      RT_CU_CHECK(cu, DeviceGetAttribute, "reading the compute capability", err, n, &major,
                  RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev) ||
      RT_CU_CHECK(cu, DeviceGetAttribute, "reading the compute capability", err, n, &minor,
                  RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev) ||
      RT_CU_CHECK(cu, DeviceTotalMem, NULL, err, n, &mem, c->dev))
    return -1;
  name[sizeof name - 1] = 0;
  d->sm = major * 10 + minor;
  snprintf(d->label, sizeof d->label, "%s (sm_%d, %.0f GiB)", name, d->sm, (double)mem / (1 << 30));
  if (RT_CU_CHECK(cu, DevicePrimaryCtxRetain, "retaining the device's primary context", err, n, &c->ctx, c->dev) ||
      rt_cuda_current(d, err, n))
    return -1;
  for (int s = 0; s < RT_DEV_STREAMS; s++)
    if (RT_CU_CHECK(cu, StreamCreate, "creating a stream", err, n, &c->stream[s], RT_CU_STREAM_NON_BLOCKING))
      return -1;
  /* all events now: creating one later could fall inside a graph capture */
  for (int e = 0; e < RT_DEV_EVENTS; e++)
    if (RT_CU_CHECK(cu, EventCreate, "creating an event", err, n, &c->event[e], RT_CU_EVENT_DISABLE_TIMING))
      return -1;
  rt_cublaslt_open(d);   /* its absence only fails GEMMs, with its reason */
  return 0;
}

RtDev *rt_dev_cuda_open(int ordinal, char *err, size_t errlen) {
  char why[1024];
  const RtCuDriver *cu = rt_cu_driver_load(why, sizeof why);
  if (!cu) {
    ts_errf(err, errlen, "%s", why);
    return NULL;
  }
  RtDev *d = ts_xcalloc(1, sizeof *d);
  RtCudaDev *c = ts_xcalloc(1, sizeof *c);
  c->cu = cu;
  d->ops = &cuda_ops;
  d->ordinal = ordinal;
  d->impl = c;
  snprintf(d->label, sizeof d->label, "GPU %d", ordinal);
  if (open_device(d, ordinal, why, sizeof why) != 0) {
    ts_errf(err, errlen, "CUDA device %d: %s", ordinal, why);
    c_close(d);
    return NULL;
  }
  return d;
}
