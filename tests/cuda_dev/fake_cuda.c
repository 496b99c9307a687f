/* fake_cuda.c - a fake CUDA driver (libcuda.so.1) for the tests of
 * runtime/device/dev_cuda.c on machines without a GPU: only the entry points the
 * device layer (and the fake cuBLASLt) call, under their exported names.
 *
 * It encodes our reading of NVIDIA's documentation, not NVIDIA's
 * behaviour.  Device memory is host memory (the CUdeviceptr is the host
 * address); kernels are recorded, with a copy of their parameter bytes
 * taken at launch, and run through a launcher callback if one is set.
 * Streams queue work that runs when waited for (fake_cuda.h).  What it
 * checks, each returning the error CUDA documents:
 *   - cuInit first; a current context for everything that needs one;
 *   - copies and memsets inside live allocations, host pointers outside;
 *   - cubins for the device's arch only (the ELF header's arch), PTX whose
 *     .target is not newer than the device; functions that the image
 *     defines; the parameter size from the PTX's .param declaration;
 *   - launch shapes (grid, 1..1024 threads, no `extra`);
 *   - stream capture: work is recorded into the graph, not run; a stream
 *     that waits on an event recorded in a capture joins it and must be
 *     joined back before the capture ends; waiting on an event from
 *     outside the capture, allocating, freeing, loading modules or
 *     synchronizing the capturing stream from the capturing thread
 *     invalidates the capture; a graph replays its work with the
 *     parameter bytes captured;
 *   - a failed kernel (the launcher returned nonzero) poisons the context.
 * Single-threaded. */
#include "fake_cuda.h"
#include "codegen/cuda.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef void (*HostFn)(void *);

enum {
  OK = 0, E_INVALID_VALUE = 1, E_OUT_OF_MEMORY = 2, E_NOT_INITIALIZED = 3, E_INVALID_DEVICE = 101,
  E_INVALID_IMAGE = 200, E_INVALID_CONTEXT = 201, E_NO_BINARY_FOR_GPU = 209, E_INVALID_PTX = 218,
  E_INVALID_HANDLE = 400, E_ILLEGAL_STATE = 401, E_NOT_FOUND = 500, E_NOT_READY = 600, E_LAUNCH_FAILED = 719,
  E_CAPTURE_UNSUPPORTED = 900, E_CAPTURE_INVALIDATED = 901, E_CAPTURE_UNMATCHED = 903, E_CAPTURE_UNJOINED = 904,
  E_CAPTURE_ISOLATION = 905
};

static const struct { int code; const char *name, *text; } errors[] = {
  {OK, "CUDA_SUCCESS", "no error"},
  {E_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
  {E_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
  {E_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
  {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
  {E_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
  {E_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
  {E_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
  {E_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
  {E_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
  {E_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
  {E_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
  {E_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
  {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
  {E_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
  {E_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
  {E_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
   "operation failed due to a previous error during capture"},
  {E_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "operation would make the legacy stream depend on a "
   "capturing blocking stream"},
  {E_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capture sequence contains a fork that was not joined "
   "to the primary stream"},
  {E_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another "
   "stream"},
};

/* ---- state ---- */

typedef struct Ctx { int dev, retain, sticky; } Ctx;
typedef struct Stream Stream;
typedef struct Graph Graph;
typedef struct Exec Exec;
typedef struct Module { int alive, sm, cubin; char *image; size_t len; Ctx *ctx; } Module;
typedef struct Func { Module *m; char name[80]; size_t param_bytes; } Func;

typedef struct {
  int kind;
  Stream *s;
  Func *f;
  unsigned grid[3], block[3], shared;
  unsigned char *args;
  size_t args_len;
  void *dst;
  const void *src;
  size_t bytes;
  HostFn fn;
  void *user;
  Stream *wait_s;          /* WAIT: run wait_s up to wait_pos first */
  long long wait_pos;
  Exec *x;                 /* GRAPH */
} Op;

struct Stream {
  int id, alive;
  Ctx *ctx;
  Op *q;                   /* queued, not yet run: q[0 .. nq) are positions done .. enq */
  int nq, capq;
  long long enq, done;
  Graph *cap;              /* capturing into (NULL: not) */
  int origin;              /* began the capture */
  long long cap_last, cap_rejoined;   /* joined streams: last captured op, last op joined back */
  int eager;               /* fake_cuda_set_eager: runs its work as it is issued */
};

struct Graph {
  int alive, invalid, capturing, mode;
  Op *ops;
  int n, cap;
};

struct Exec {
  int alive;
  Op *ops;
  int n;
};

typedef struct {
  int alive, recorded;
  unsigned flags;          /* cuEventCreate's: 0x2 = CU_EVENT_DISABLE_TIMING */
  Ctx *ctx;
  Stream *s;               /* recorded outside a capture: s reached position pos */
  long long pos;
  Graph *g;                /* recorded in a capture */
  Stream *gs;
  long long gidx;
} Event;

typedef struct { char *p; size_t n; int dev; } Alloc;

static struct {
  int configured, initialized, ndev, sm[8];
  size_t mem_limit, used[8];
  Ctx ctx[8];
  Alloc *al;
  int nal, capal;
  Stream **streams;
  int nstreams;
  Event **events;
  int nevents;
  Module **mods;
  int nmods;
  Func **funcs;
  int nfuncs;
  Graph **graphs;
  int ngraphs;
  Exec **execs;
  int nexecs;
  FakeCudaOp *log;
  int nlog, caplog;
  FakeCudaLauncher launcher;
  char fail_fn[64];
  int fail_code, fail_skip;
  struct { char name[48]; long n; } calls[64];
  int ncalls;
  char last_module[64];
  int replays;
  int eager;
  int orphans;             /* objects still alive when their context was destroyed */
} F;

/* initial-exec: static TLS, read without __tls_get_addr.  The driver is
 * dlopen'ed, so the default (general-dynamic) model would call it on every
 * driver call, and LeakSanitizer's bookkeeping of such dynamic TLS blocks
 * made its exit-time scan crash now and then ("Tracer caught signal 11" in
 * ScanRangeForPointers, cuda_dev.fake_gpu_dp2_f64_overlap under ASan). */
#define FAKE_TLS __thread __attribute__((tls_model("initial-exec")))
static FAKE_TLS Ctx *cur;
static FAKE_TLS int thread_captures;   /* captures this thread began (not relaxed) */

#define GROW(p, n, cap) \
  do { if ((n) == (cap)) { (cap) = (cap) ? 2 * (cap) : 16; (p) = realloc((p), (size_t)(cap) * sizeof *(p)); \
       if (!(p)) abort(); } } while (0)

/* appends x to a small array of pointers */
#define PUSH(p, n, x) \
  do { (p) = realloc((p), (size_t)((n) + 1) * sizeof *(p)); if (!(p)) abort(); (p)[(n)++] = (x); } while (0)

static void *xcalloc(size_t n, size_t s) {
  void *p = calloc(n ? n : 1, s ? s : 1);
  if (!p) abort();
  return p;
}

/* ---- configuration ---- */

static void configure_from_env(void) {
  if (F.configured) return;
  F.configured = 1;
  const char *d = getenv("FAKE_CUDA_DEVICES");
  F.ndev = 0;
  for (const char *p = d && *d ? d : "80"; *p && F.ndev < 8;) {
    char *e;
    long v = strtol(p, &e, 10);
    if (e == p) break;
    F.sm[F.ndev++] = (int)v;
    p = *e == ',' ? e + 1 : e;
  }
  const char *m = getenv("FAKE_CUDA_MEM");
  F.mem_limit = m && *m ? (size_t)strtoull(m, NULL, 10) : 0;
  F.eager = getenv("FAKE_CUDA_EAGER") && !strcmp(getenv("FAKE_CUDA_EAGER"), "1");
}

EXPORT void fake_cuda_configure(int n, const int *sm, size_t mem_limit) {
  F.configured = 1;
  F.ndev = n < 0 ? 0 : n > 8 ? 8 : n;
  for (int i = 0; i < F.ndev; i++) F.sm[i] = sm[i];
  F.mem_limit = mem_limit;
  F.eager = getenv("FAKE_CUDA_EAGER") && !strcmp(getenv("FAKE_CUDA_EAGER"), "1");
}

EXPORT void fake_cuda_fail(const char *fn, int code, int skip) {
  snprintf(F.fail_fn, sizeof F.fail_fn, "%s", fn ? fn : "");
  F.fail_code = code;
  F.fail_skip = skip;
}

EXPORT void fake_cuda_set_launcher(FakeCudaLauncher fn) { F.launcher = fn; }
EXPORT void fake_cuda_set_eager(const void *h, int on) {
  for (int i = 0; i < F.nstreams; i++)
    if ((const void *)F.streams[i] == h) F.streams[i]->eager = on;
}
EXPORT int fake_cuda_log_count(void) { return F.nlog; }
EXPORT const FakeCudaOp *fake_cuda_log(int i) { return i >= 0 && i < F.nlog ? &F.log[i] : NULL; }
EXPORT void fake_cuda_log_clear(void) { F.nlog = 0; }
EXPORT const char *fake_cuda_last_module(void) { return F.last_module; }

EXPORT long fake_cuda_calls(const char *fn) {
  for (int i = 0; i < F.ncalls; i++)
    if (!strcmp(F.calls[i].name, fn)) return F.calls[i].n;
  return 0;
}

EXPORT int fake_cuda_stream_id(const void *s) {
  for (int i = 0; i < F.nstreams; i++)
    if ((const void *)F.streams[i] == s) return F.streams[i]->id;
  return 0;
}

EXPORT int fake_cuda_pending(void) {
  int n = 0;
  for (int i = 0; i < F.nstreams; i++) n += F.streams[i]->nq;
  return n;
}

EXPORT int fake_cuda_orphans(int reset) {
  int n = F.orphans;
  if (reset) F.orphans = 0;
  return n;
}

EXPORT int fake_cuda_live(char *what, size_t n) {
  int a = F.nal, s = 0, e = 0, m = 0, g = 0, x = 0, c = 0;
  for (int i = 0; i < F.nstreams; i++) s += F.streams[i]->alive;
  for (int i = 0; i < F.nevents; i++) e += F.events[i]->alive;
  for (int i = 0; i < F.nmods; i++) m += F.mods[i]->alive;
  for (int i = 0; i < F.ngraphs; i++) g += F.graphs[i]->alive;
  for (int i = 0; i < F.nexecs; i++) x += F.execs[i]->alive;
  for (int i = 0; i < 8; i++) c += F.ctx[i].retain;
  if (what) snprintf(what, n, "%d allocations, %d streams, %d events, %d modules, %d graphs, %d executable graphs, "
                     "%d context retains", a, s, e, m, g, x, c);
  return a + s + e + m + g + x + c;
}

static Alloc *find_alloc(unsigned long long p, size_t bytes) {
  for (int i = 0; i < F.nal; i++) {
    uintptr_t b = (uintptr_t)F.al[i].p;
    if (p >= b && p - b <= F.al[i].n && bytes <= F.al[i].n - (size_t)(p - b)) return &F.al[i];
  }
  return NULL;
}

EXPORT int fake_cuda_ptr_ok(unsigned long long p, size_t bytes) { return find_alloc(p, bytes ? bytes : 1) != NULL; }
/* The compute capability * 10 of the current context's device (0: none):
 * the fake cuBLASLt's fp8 GEMMs need 89 or more, as cuBLASLt's. */
EXPORT int fake_cuda_current_sm(void) { return cur && cur->dev >= 0 && cur->dev < F.ndev ? F.sm[cur->dev] : 0; }

/* ---- the common prologue of every entry point ---- */

static CUresult enter(const char *fn) {
  int i = 0;
  while (i < F.ncalls && strcmp(F.calls[i].name, fn)) i++;
  if (i == F.ncalls && F.ncalls < 64) snprintf(F.calls[F.ncalls++].name, sizeof F.calls[0].name, "%s", fn);
  if (i < 64) F.calls[i].n++;
  if (F.fail_fn[0] && !strcmp(F.fail_fn, fn)) {
    if (F.fail_skip-- <= 0) {
      F.fail_fn[0] = 0;
      return F.fail_code;
    }
  }
  if (!F.initialized && strcmp(fn, "cuInit") && strcmp(fn, "cuGetErrorName") && strcmp(fn, "cuGetErrorString") &&
      strcmp(fn, "cuDriverGetVersion"))
    return E_NOT_INITIALIZED;
  return OK;
}

/* ... and of those that need the current context */
static CUresult enter_ctx(const char *fn) {
  CUresult e = enter(fn);
  if (e) return e;
  if (!cur || cur->retain <= 0) return E_INVALID_CONTEXT;
  return cur->sticky;
}

#define ENTER(fn) do { CUresult e_ = enter(fn); if (e_) return e_; } while (0)
#define ENTER_CTX(fn) do { CUresult e_ = enter_ctx(fn); if (e_) return e_; } while (0)

/* ---- errors, init, devices, contexts ---- */

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == e) { *s = errors[i].name; return OK; }
  *s = NULL;
  return E_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == e) { *s = errors[i].text; return OK; }
  *s = NULL;
  return E_INVALID_VALUE;
}

EXPORT CUresult cuInit(unsigned flags) {
  ENTER("cuInit");
  if (flags) return E_INVALID_VALUE;
  configure_from_env();
  F.initialized = 1;
  return OK;
}

/* CUDA 13.0 (580 drivers), or FAKE_CUDA_DRIVER_VERSION (e.g. 12040: an
 * older driver) */
EXPORT CUresult cuDriverGetVersion(int *v) {
  ENTER("cuDriverGetVersion");
  const char *e = getenv("FAKE_CUDA_DRIVER_VERSION");
  *v = e && *e ? atoi(e) : 13000;
  return OK;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
  ENTER("cuDeviceGetCount");
  *n = F.ndev;
  return OK;
}

EXPORT CUresult cuDeviceGet(int *d, int ordinal) {
  ENTER("cuDeviceGet");
  if (ordinal < 0 || ordinal >= F.ndev) return E_INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, int d) {
  ENTER("cuDeviceGetName");
  if (d < 0 || d >= F.ndev) return E_INVALID_DEVICE;
  if (len <= 0 || !name) return E_INVALID_VALUE;
  snprintf(name, (size_t)len, "Fake GPU %d", d);
  return OK;
}

EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  ENTER("cuDeviceGetAttribute");
  if (d < 0 || d >= F.ndev) return E_INVALID_DEVICE;
  switch (attr) {
  case 75: *v = F.sm[d] / 10; return OK;
  case 76: *v = F.sm[d] % 10; return OK;
  case 16: *v = 108; return OK;
  default: return E_INVALID_VALUE;
  }
}

static size_t dev_mem(int d) { return F.mem_limit ? F.mem_limit : (size_t)16 << 30; }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, int d) {
  ENTER("cuDeviceTotalMem_v2");
  if (d < 0 || d >= F.ndev) return E_INVALID_DEVICE;
  *bytes = dev_mem(d);
  return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (d < 0 || d >= F.ndev) return E_INVALID_DEVICE;
  F.ctx[d].dev = d;
  F.ctx[d].retain++;
  *c = &F.ctx[d];
  return OK;
}

static void op_free(Op *o);

/* The last release destroys the primary context and everything in it. */
static void ctx_destroy(Ctx *c) {
  for (int i = 0; i < F.nstreams; i++) {
    Stream *s = F.streams[i];
    if (s->ctx != c || !s->alive) continue;
    F.orphans++;
    for (int j = 0; j < s->nq; j++) op_free(&s->q[j]);
    free(s->q);
    s->q = NULL;
    s->nq = s->capq = 0;
    s->alive = 0;
  }
  for (int i = 0; i < F.nevents; i++)
    if (F.events[i]->ctx == c && F.events[i]->alive) F.events[i]->alive = 0, F.orphans++;
  for (int i = 0; i < F.nmods; i++)
    if (F.mods[i]->ctx == c && F.mods[i]->alive) {
      F.orphans++;
      F.mods[i]->alive = 0;
      free(F.mods[i]->image);
      F.mods[i]->image = NULL;
    }
  for (int i = 0; i < F.nal;)
    if (F.al[i].dev == c->dev) {
      F.orphans++;
      F.used[c->dev] -= F.al[i].n;
      free(F.al[i].p);
      F.al[i] = F.al[--F.nal];
    } else {
      i++;
    }
  c->sticky = 0;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int d) {
  ENTER("cuDevicePrimaryCtxRelease_v2");
  if (d < 0 || d >= F.ndev) return E_INVALID_DEVICE;
  if (F.ctx[d].retain <= 0) return E_INVALID_CONTEXT;
  if (--F.ctx[d].retain == 0) {
    ctx_destroy(&F.ctx[d]);   /* a later retain starts clean */
    if (cur == &F.ctx[d]) cur = NULL;
  }
  return OK;
}

EXPORT CUresult cuCtxSetCurrent(void *c) {
  ENTER("cuCtxSetCurrent");
  if (!c) { cur = NULL; return OK; }
  Ctx *x = c;
  if (x < F.ctx || x >= F.ctx + 8 || x->retain <= 0) return E_INVALID_CONTEXT;
  cur = x;
  return OK;
}

/* ---- the log and running work ---- */

static void log_op(const Op *o, int replay) {
  GROW(F.log, F.nlog, F.caplog);
  FakeCudaOp *l = &F.log[F.nlog++];
  memset(l, 0, sizeof *l);
  l->kind = o->kind;
  l->stream = o->s ? o->s->id : 0;
  l->replay = replay;
  if (o->f) snprintf(l->name, sizeof l->name, "%s", o->f->name);
  if (o->kind == FAKE_OP_HOSTFN) snprintf(l->name, sizeof l->name, "hostfn");
  memcpy(l->grid, o->grid, sizeof l->grid);
  memcpy(l->block, o->block, sizeof l->block);
  l->shared = o->shared;
  l->args_len = o->args_len < sizeof l->args ? o->args_len : sizeof l->args;
  if (o->args) memcpy(l->args, o->args, l->args_len);
  l->dst = (unsigned long long)(uintptr_t)o->dst;
  l->src = (unsigned long long)(uintptr_t)o->src;
  l->bytes = o->bytes;
}

static void drain(Stream *s, long long upto);

static void run_op(const Op *o, int replay) {
  if (o->kind == FAKE_OP_WAIT) {   /* logged once the other stream got to the event */
    if (o->wait_s && !replay) drain(o->wait_s, o->wait_pos);
    log_op(o, replay);
    return;
  }
  log_op(o, replay);
  switch (o->kind) {
  case FAKE_OP_LAUNCH:
    if (F.launcher && o->s && !o->s->ctx->sticky &&
        F.launcher(o->f->name, (long long)o->grid[0], (int)o->block[0], o->args) != 0)
      o->s->ctx->sticky = E_LAUNCH_FAILED;   /* a kernel fault loses the context */
    break;
  case FAKE_OP_H2D:
  case FAKE_OP_D2H:
  case FAKE_OP_D2D: memmove(o->dst, o->src, o->bytes); break;
  case FAKE_OP_MEMSET: memset(o->dst, 0, o->bytes); break;
  case FAKE_OP_HOSTFN: o->fn(o->user); break;
  case FAKE_OP_GRAPH: {
    int r = ++F.replays;
    for (int i = 0; i < o->x->n; i++) run_op(&o->x->ops[i], r);
    break;
  }
  default: break;
  }
}

static void op_free(Op *o) {
  free(o->args);
  o->args = NULL;
}

/* Runs s's queue up to position upto (ops before it). */
static void drain(Stream *s, long long upto) {
  while (s->done < upto && s->nq > 0) {
    Op o = s->q[0];
    memmove(s->q, s->q + 1, (size_t)(s->nq - 1) * sizeof *s->q);
    s->nq--;
    s->done++;
    run_op(&o, 0);
    op_free(&o);
  }
}

static void drain_all(void) {
  for (int i = 0; i < F.nstreams; i++) drain(F.streams[i], F.streams[i]->enq);
}

/* Issues o on s: into s's capture, or s's queue.  Takes o's args. */
static CUresult submit(Stream *s, Op *o) {
  o->s = s;
  if (s->cap) {
    Graph *g = s->cap;
    if (g->invalid) { op_free(o); return E_CAPTURE_INVALIDATED; }
    GROW(g->ops, g->n, g->cap);
    g->ops[g->n++] = *o;
    s->cap_last = g->n - 1;
    return OK;
  }
  GROW(s->q, s->nq, s->capq);
  s->q[s->nq++] = *o;
  s->enq++;
  if (F.eager || s->eager) drain(s, s->enq);
  return OK;
}

static Stream *stream_of(void *h) {
  for (int i = 0; i < F.nstreams; i++)
    if ((void *)F.streams[i] == h) return F.streams[i]->alive && F.streams[i]->ctx == cur ? F.streams[i] : NULL;
  return NULL;
}

/* An unsafe call from a thread with a capture under way invalidates it. */
static CUresult capture_guard(void) {
  if (!thread_captures) return OK;
  for (int i = 0; i < F.ngraphs; i++)
    if (F.graphs[i]->capturing) F.graphs[i]->invalid = 1;
  return E_CAPTURE_UNSUPPORTED;
}

/* ---- memory ---- */

EXPORT CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes) {
  ENTER_CTX("cuMemAlloc_v2");
  CUresult g = capture_guard();
  if (g) return g;
  if (!bytes) return E_INVALID_VALUE;
  int d = cur->dev;
  if (bytes > dev_mem(d) - F.used[d]) return E_OUT_OF_MEMORY;
  void *q = NULL;
  if (posix_memalign(&q, 256, bytes)) return E_OUT_OF_MEMORY;
  memset(q, 0xff, bytes);   /* garbage (NaN) until written */
  GROW(F.al, F.nal, F.capal);
  F.al[F.nal++] = (Alloc){q, bytes, d};
  F.used[d] += bytes;
  *p = (unsigned long long)(uintptr_t)q;
  return OK;
}

EXPORT CUresult cuMemFree_v2(unsigned long long p) {
  ENTER_CTX("cuMemFree_v2");
  CUresult g = capture_guard();
  if (g) return g;
  for (int i = 0; i < F.nal; i++)
    if ((uintptr_t)F.al[i].p == p) {
      drain_all();   /* cuMemFree waits for work that may use the memory */
      F.used[F.al[i].dev] -= F.al[i].n;
      free(F.al[i].p);
      F.al[i] = F.al[--F.nal];
      return OK;
    }
  return E_INVALID_VALUE;
}

/* ---- page-locked host memory (cuMemAllocHost) ---- */

static struct { char *p; size_t n; } *pinned;
static int npinned, cappinned;

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytes) {
  ENTER_CTX("cuMemAllocHost_v2");
  CUresult g = capture_guard();
  if (g) return g;
  if (!bytes || !pp) return E_INVALID_VALUE;
  void *q = NULL;
  if (posix_memalign(&q, 4096, bytes)) return E_OUT_OF_MEMORY;
  memset(q, 0xa5, bytes);   /* garbage until written */
  GROW(pinned, npinned, cappinned);
  pinned[npinned].p = q;
  pinned[npinned++].n = bytes;
  *pp = q;
  return OK;
}

EXPORT CUresult cuMemFreeHost(void *p) {
  ENTER_CTX("cuMemFreeHost");
  CUresult g = capture_guard();
  if (g) return g;
  for (int i = 0; i < npinned; i++)
    if (pinned[i].p == p) {
      drain_all();   /* as cuMemFree: work that may use it is waited for */
      free(p);
      pinned[i] = pinned[--npinned];
      return OK;
    }
  return E_INVALID_VALUE;
}

static int is_pinned(const void *p, size_t bytes) {
  for (int i = 0; i < npinned; i++)
    if ((const char *)p >= pinned[i].p && (const char *)p + bytes <= pinned[i].p + pinned[i].n) return 1;
  return 0;
}

static CUresult copy(int kind, void *dst, const void *src, size_t bytes, void *stream) {
  Stream *s = stream_of(stream);
  if (!s) return E_INVALID_HANDLE;
  uintptr_t d = (uintptr_t)dst, r = (uintptr_t)src;
  int dev_dst = kind != FAKE_OP_D2H, dev_src = kind != FAKE_OP_H2D;
  if ((dev_dst && !find_alloc(d, bytes)) || (dev_src && !find_alloc(r, bytes))) return E_INVALID_VALUE;
  if ((!dev_dst && find_alloc(d, 1)) || (!dev_src && find_alloc(r, 1))) return E_INVALID_VALUE;   /* swapped? */
  /* A captured copy to or from the host must use page-locked memory: the
   * graph replays it later, asynchronously, which pageable memory cannot
   * be (our reading of the CUDA Graphs notes; a capture rejects or
   * serializes such copies): the capture is invalidated. */
  const void *host = kind == FAKE_OP_H2D ? src : kind == FAKE_OP_D2H ? dst : NULL;
  if (s->cap && host && !is_pinned(host, bytes)) {
    s->cap->invalid = 1;
    return E_CAPTURE_UNSUPPORTED;
  }
  Op o = {.kind = kind, .dst = dst, .src = src, .bytes = bytes};
  return submit(s, &o);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t bytes, void *s) {
  ENTER_CTX("cuMemcpyHtoDAsync_v2");
  return copy(FAKE_OP_H2D, (void *)(uintptr_t)dst, src, bytes, s);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t bytes, void *s) {
  ENTER_CTX("cuMemcpyDtoHAsync_v2");
  return copy(FAKE_OP_D2H, dst, (const void *)(uintptr_t)src, bytes, s);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t bytes, void *s) {
  ENTER_CTX("cuMemcpyDtoDAsync_v2");
  return copy(FAKE_OP_D2D, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes, s);
}

EXPORT CUresult cuMemsetD8Async(unsigned long long dst, unsigned char v, size_t n, void *stream) {
  ENTER_CTX("cuMemsetD8Async");
  Stream *s = stream_of(stream);
  if (!s) return E_INVALID_HANDLE;
  if (!find_alloc(dst, n)) return E_INVALID_VALUE;
  if (v != 0) return E_INVALID_VALUE;   /* the fake only zeroes (all the device layer does) */
  Op o = {.kind = FAKE_OP_MEMSET, .dst = (void *)(uintptr_t)dst, .bytes = n};
  return submit(s, &o);
}

/* ---- streams and events ---- */

EXPORT CUresult cuStreamCreate(void **out, unsigned flags) {
  ENTER_CTX("cuStreamCreate");
  if (flags > 1) return E_INVALID_VALUE;
  Stream *s = xcalloc(1, sizeof *s);
  s->alive = 1;
  s->ctx = cur;
  s->id = F.nstreams + 1;
  PUSH(F.streams, F.nstreams, s);
  *out = s;
  return OK;
}

EXPORT CUresult cuStreamDestroy_v2(void *h) {
  ENTER_CTX("cuStreamDestroy_v2");
  Stream *s = stream_of(h);
  if (!s) return E_INVALID_HANDLE;
  if (s->cap) return E_ILLEGAL_STATE;
  drain(s, s->enq);   /* its work completes first */
  free(s->q);
  s->q = NULL;
  s->capq = 0;
  s->alive = 0;
  return OK;
}

EXPORT CUresult cuStreamSynchronize(void *h) {
  ENTER_CTX("cuStreamSynchronize");
  Stream *s = stream_of(h);
  if (!s) return E_INVALID_HANDLE;
  if (s->cap) {
    s->cap->invalid = 1;
    return E_CAPTURE_UNSUPPORTED;
  }
  drain(s, s->enq);
  return cur->sticky;
}

EXPORT CUresult cuStreamQuery(void *h) {
  ENTER_CTX("cuStreamQuery");
  Stream *s = stream_of(h);
  if (!s) return E_INVALID_HANDLE;
  if (s->cap) {
    s->cap->invalid = 1;
    return E_CAPTURE_UNSUPPORTED;
  }
  drain(s, s->enq);
  return cur->sticky;
}

EXPORT CUresult cuStreamIsCapturing(void *h, int *status) {
  ENTER_CTX("cuStreamIsCapturing");
  Stream *s = stream_of(h);
  if (!s) return E_INVALID_HANDLE;
  *status = !s->cap ? 0 : s->cap->invalid ? 2 : 1;
  return OK;
}

static Event *event_of(void *h) {
  for (int i = 0; i < F.nevents; i++)
    if ((void *)F.events[i] == h) return F.events[i]->alive ? F.events[i] : NULL;
  return NULL;
}

EXPORT CUresult cuEventCreate(void **out, unsigned flags) {
  ENTER_CTX("cuEventCreate");
  if (flags & ~0x7u) return E_INVALID_VALUE;
  Event *e = xcalloc(1, sizeof *e);
  e->alive = 1;
  e->flags = flags;
  e->ctx = cur;
  PUSH(F.events, F.nevents, e);
  *out = e;
  return OK;
}

EXPORT CUresult cuEventDestroy_v2(void *h) {
  ENTER_CTX("cuEventDestroy_v2");
  Event *e = event_of(h);
  if (!e) return E_INVALID_HANDLE;
  e->alive = 0;
  return OK;
}

EXPORT CUresult cuEventRecord(void *he, void *hs) {
  ENTER_CTX("cuEventRecord");
  Event *e = event_of(he);
  Stream *s = stream_of(hs);
  if (!e || !s) return E_INVALID_HANDLE;
  if (s->cap && s->cap->invalid) return E_CAPTURE_INVALIDATED;
  e->recorded = 1;
  Graph *g = s->cap;
  e->g = g;
  e->gs = g ? s : NULL;
  e->s = g ? NULL : s;
  Op o = {.kind = FAKE_OP_RECORD};
  CUresult rc = submit(s, &o);
  e->pos = s->enq;         /* outside a capture: s's work up to and with this record */
  e->gidx = s->cap_last;   /* in a capture: the same, as an index into the graph */
  return rc;
}

/* As the driver: both events recorded outside a capture, with timing, on
 * work that has run (else CUDA_ERROR_NOT_READY).  The "time" is the
 * number of operations between the two, in microseconds: deterministic. */
EXPORT CUresult cuEventElapsedTime_v2(float *ms, void *ha, void *hb) {
  ENTER_CTX("cuEventElapsedTime_v2");
  Event *a = event_of(ha), *b = event_of(hb);
  if (!a || !b || !ms) return E_INVALID_HANDLE;
  if ((a->flags | b->flags) & 0x2) return E_INVALID_HANDLE;
  if (!a->recorded || !b->recorded || !a->s || !b->s) return E_INVALID_HANDLE;
  if (a->s->done < a->pos || b->s->done < b->pos) return E_NOT_READY;
  *ms = (float)(b->pos - a->pos) * 1e-3f;
  return OK;
}

EXPORT CUresult cuStreamWaitEvent(void *hs, void *he, unsigned flags) {
  ENTER_CTX("cuStreamWaitEvent");
  Stream *s = stream_of(hs);
  Event *e = event_of(he);
  if (!e || !s) return E_INVALID_HANDLE;
  if (flags) return E_INVALID_VALUE;
  Op o = {.kind = FAKE_OP_WAIT};
  if (e->recorded && e->g) {   /* an event of a capture */
    Graph *g = e->g;
    if (!g->capturing) return E_ILLEGAL_STATE;
    if (s->cap && s->cap != g) return E_ILLEGAL_STATE;
    if (!s->cap) {   /* fork: s joins the capture */
      s->cap = g;
      s->origin = 0;
      s->cap_last = s->cap_rejoined = -1;
    }
    if (e->gs != s && e->gidx > e->gs->cap_rejoined) e->gs->cap_rejoined = e->gidx;
    return submit(s, &o);
  }
  if (s->cap) {
    if (e->recorded) {   /* a capture may not depend on work outside it */
      s->cap->invalid = 1;
      return E_CAPTURE_ISOLATION;
    }
    return OK;
  }
  if (!e->recorded) return OK;   /* waiting on an event never recorded: nothing */
  o.wait_s = e->s;
  o.wait_pos = e->pos;
  return submit(s, &o);
}

/* ---- modules ---- */

/* The arch of a cubin from its ELF header (our reading of NVIDIA's
 * format: ELF ABI version 8 and later keep it in e_flags bits 8..15,
 * earlier ones in bits 0..7), and its size from the section headers. */
static int cubin_arch(const unsigned char *p, size_t *len) {
  uint32_t flags;
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&flags, p + 48, 4);
  memcpy(&shoff, p + 40, 8);
  memcpy(&shentsize, p + 58, 2);
  memcpy(&shnum, p + 60, 2);
  *len = (size_t)(shoff + (uint64_t)shentsize * shnum);
  return p[8] >= 8 ? (int)((flags >> 8) & 0xff) : (int)(flags & 0xff);
}

EXPORT CUresult cuModuleLoadDataEx(void **out, const void *image, unsigned nopt, int *opt, void **val) {
  ENTER_CTX("cuModuleLoadDataEx");
  CUresult g = capture_guard();
  if (g) return g;
  if (!image) return E_INVALID_VALUE;
  char *log = NULL;
  size_t loglen = 0;
  for (unsigned i = 0; i < nopt; i++) {
    if (opt[i] == 5) log = val[i];
    else if (opt[i] == 6) loglen = (size_t)(uintptr_t)val[i];
    else if (opt[i] != 3 && opt[i] != 4) return E_INVALID_VALUE;
  }
  if (log && loglen) log[0] = 0;
  int sm = F.sm[cur->dev];
  Module *m = xcalloc(1, sizeof *m);
  const unsigned char *p = image;
  if (!memcmp(p, "\177ELF", 4)) {
    size_t len;
    int arch = cubin_arch(p, &len);
    if (arch != sm) { free(m); return E_NO_BINARY_FOR_GPU; }
    m->cubin = 1;
    m->sm = arch;
    m->len = len;
    m->image = xcalloc(1, len + 1);
    memcpy(m->image, image, len);
  } else {
    const char *t = strstr(image, ".target sm_");
    int target = t ? atoi(t + 11) : 0;
    if (!strstr(image, ".version") || !t || target > sm) {
      if (log && loglen)
        snprintf(log, loglen, "ptxas application ptx input, line 1; fatal   : %s",
                 !t ? "no .target directive" : "SM version specified by .target is higher than default SM version "
                 "assumed");
      free(m);
      return E_INVALID_PTX;
    }
    m->sm = target;
    m->len = strlen(image);
    m->image = xcalloc(1, m->len + 1);
    memcpy(m->image, image, m->len);
  }
  m->alive = 1;
  m->ctx = cur;
  snprintf(F.last_module, sizeof F.last_module, "%s sm_%d", m->cubin ? "cubin" : "PTX", m->sm);
  PUSH(F.mods, F.nmods, m);
  *out = m;
  return OK;
}

static Module *module_of(void *h) {
  for (int i = 0; i < F.nmods; i++)
    if ((void *)F.mods[i] == h) return F.mods[i]->alive ? F.mods[i] : NULL;
  return NULL;
}

EXPORT CUresult cuModuleUnload(void *h) {
  ENTER_CTX("cuModuleUnload");
  CUresult g = capture_guard();
  if (g) return g;
  Module *m = module_of(h);
  if (!m) return E_INVALID_HANDLE;
  drain_all();
  m->alive = 0;
  free(m->image);
  m->image = NULL;
  return OK;
}

EXPORT CUresult cuModuleGetFunction(void **out, void *h, const char *name) {
  ENTER_CTX("cuModuleGetFunction");
  Module *m = module_of(h);
  if (!m) return E_INVALID_HANDLE;
  size_t nl = strlen(name);
  if (!nl || nl >= sizeof ((Func *)0)->name) return E_NOT_FOUND;
  size_t bytes = sizeof(CgCudaArgs);
  char key[128];
  if (m->cubin) {   /* the symbol's name in the string table */
    key[0] = 0;
    memcpy(key + 1, name, nl + 1);
    if (!memmem(m->image, m->len, key, nl + 2)) return E_NOT_FOUND;
  } else {
    snprintf(key, sizeof key, ".entry %s(", name);
    if (!strstr(m->image, key)) return E_NOT_FOUND;
    snprintf(key, sizeof key, "%s_param_0[", name);   /* .param .align 8 .b8 NAME_param_0[264] */
    const char *q = strstr(m->image, key);
    if (q) bytes = (size_t)atol(q + strlen(key));
    snprintf(key, sizeof key, "%s_param_1", name);
    if (strstr(m->image, key)) return E_INVALID_IMAGE;   /* not our one-parameter ABI */
  }
  Func *f = xcalloc(1, sizeof *f);
  f->m = m;
  memcpy(f->name, name, nl + 1);
  f->param_bytes = bytes;
  PUSH(F.funcs, F.nfuncs, f);
  *out = f;
  return OK;
}

EXPORT CUresult cuLaunchKernel(void *hf, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, void *hs, void **params, void **extra) {
  ENTER_CTX("cuLaunchKernel");
  Func *f = NULL;
  for (int i = 0; i < F.nfuncs && !f; i++)
    if ((void *)F.funcs[i] == hf) f = F.funcs[i];
  Stream *s = stream_of(hs);
  if (!f || !f->m->alive || !s) return E_INVALID_HANDLE;
  if (!gx || !gy || !gz || gx > 2147483647u || gy > 65535 || gz > 65535) return E_INVALID_VALUE;
  if (!bx || !by || !bz || (unsigned long)bx * by * bz > 1024 || bz > 64 || smem > 48 * 1024) return E_INVALID_VALUE;
  if (extra || !params || !params[0]) return E_INVALID_VALUE;
  Op o = {.kind = FAKE_OP_LAUNCH, .f = f, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shared = smem};
  o.args_len = f->param_bytes;
  o.args = xcalloc(1, f->param_bytes);
  memcpy(o.args, params[0], f->param_bytes);   /* by value, now: the caller may reuse its struct */
  return submit(s, &o);
}

EXPORT CUresult cuLaunchHostFunc(void *hs, HostFn fn, void *user) {
  ENTER_CTX("cuLaunchHostFunc");
  Stream *s = stream_of(hs);
  if (!s) return E_INVALID_HANDLE;
  if (!fn) return E_INVALID_VALUE;
  Op o = {.kind = FAKE_OP_HOSTFN, .fn = fn, .user = user};
  return submit(s, &o);
}

/* ---- graphs ---- */

EXPORT CUresult cuStreamBeginCapture_v2(void *hs, int mode) {
  ENTER_CTX("cuStreamBeginCapture_v2");
  Stream *s = stream_of(hs);
  if (!s) return E_INVALID_HANDLE;
  if (s->cap) return E_ILLEGAL_STATE;
  if (mode < 0 || mode > 2) return E_INVALID_VALUE;
  Graph *g = xcalloc(1, sizeof *g);
  g->alive = g->capturing = 1;
  g->mode = mode;
  PUSH(F.graphs, F.ngraphs, g);
  s->cap = g;
  s->origin = 1;
  s->cap_last = s->cap_rejoined = -1;
  if (mode != 2) thread_captures++;
  return OK;
}

static void graph_release(Graph *g) {
  for (int i = 0; i < g->n; i++) op_free(&g->ops[i]);
  free(g->ops);
  g->ops = NULL;
  g->n = g->cap = 0;
  g->alive = 0;
}

EXPORT CUresult cuStreamEndCapture(void *hs, void **out) {
  ENTER_CTX("cuStreamEndCapture");
  Stream *s = stream_of(hs);
  if (!s) return E_INVALID_HANDLE;
  *out = NULL;
  if (!s->cap) return E_ILLEGAL_STATE;
  if (!s->origin) return E_CAPTURE_UNMATCHED;
  Graph *g = s->cap;
  CUresult rc = g->invalid ? E_CAPTURE_INVALIDATED : OK;
  for (int i = 0; i < F.nstreams; i++) {
    Stream *t = F.streams[i];
    if (t->cap != g) continue;
    if (t != s && !rc && t->cap_last > t->cap_rejoined) rc = E_CAPTURE_UNJOINED;
    t->cap = NULL;
    t->origin = 0;
  }
  g->capturing = 0;
  if (g->mode != 2) thread_captures--;
  if (rc) {
    graph_release(g);
    return rc;
  }
  *out = g;
  return OK;
}

static Graph *graph_of(void *h) {
  for (int i = 0; i < F.ngraphs; i++)
    if ((void *)F.graphs[i] == h) return F.graphs[i]->alive && !F.graphs[i]->capturing ? F.graphs[i] : NULL;
  return NULL;
}

EXPORT CUresult cuGraphInstantiateWithFlags(void **out, void *hg, unsigned long long flags) {
  ENTER_CTX("cuGraphInstantiateWithFlags");
  Graph *g = graph_of(hg);
  if (!g) return E_INVALID_HANDLE;
  if (flags) return E_INVALID_VALUE;
  Exec *x = xcalloc(1, sizeof *x);
  x->alive = 1;
  x->n = g->n;
  x->ops = xcalloc((size_t)g->n, sizeof *x->ops);
  for (int i = 0; i < g->n; i++) {   /* the executable graph keeps its own copy of the parameters */
    x->ops[i] = g->ops[i];
    if (g->ops[i].args) {
      x->ops[i].args = xcalloc(1, g->ops[i].args_len);
      memcpy(x->ops[i].args, g->ops[i].args, g->ops[i].args_len);
    }
  }
  PUSH(F.execs, F.nexecs, x);
  *out = x;
  return OK;
}

static Exec *exec_of(void *h) {
  for (int i = 0; i < F.nexecs; i++)
    if ((void *)F.execs[i] == h) return F.execs[i]->alive ? F.execs[i] : NULL;
  return NULL;
}

EXPORT CUresult cuGraphLaunch(void *hx, void *hs) {
  ENTER_CTX("cuGraphLaunch");
  Exec *x = exec_of(hx);
  Stream *s = stream_of(hs);
  if (!x || !s) return E_INVALID_HANDLE;
  Op o = {.kind = FAKE_OP_GRAPH, .x = x};
  return submit(s, &o);
}

EXPORT CUresult cuGraphExecDestroy(void *hx) {
  ENTER_CTX("cuGraphExecDestroy");
  Exec *x = exec_of(hx);
  if (!x) return E_INVALID_HANDLE;
  drain_all();   /* a launch of it still queued runs first */
  for (int i = 0; i < x->n; i++) op_free(&x->ops[i]);
  free(x->ops);
  x->ops = NULL;
  x->alive = 0;
  return OK;
}

EXPORT CUresult cuGraphDestroy(void *hg) {
  ENTER_CTX("cuGraphDestroy");
  Graph *g = graph_of(hg);
  if (!g) return E_INVALID_HANDLE;
  graph_release(g);
  return OK;
}

/* Frees everything at unload, so leak checkers see only real leaks. */
__attribute__((destructor)) static void fake_cuda_fini(void) {
  for (int i = 0; i < F.nstreams; i++) {
    for (int j = 0; j < F.streams[i]->nq; j++) op_free(&F.streams[i]->q[j]);
    free(F.streams[i]->q);
    free(F.streams[i]);
  }
  for (int i = 0; i < F.ngraphs; i++) {
    if (F.graphs[i]->alive) graph_release(F.graphs[i]);
    free(F.graphs[i]);
  }
  for (int i = 0; i < F.nexecs; i++) {
    for (int j = 0; F.execs[i]->ops && j < F.execs[i]->n; j++) op_free(&F.execs[i]->ops[j]);
    free(F.execs[i]->ops);
    free(F.execs[i]);
  }
  for (int i = 0; i < F.nevents; i++) free(F.events[i]);
  for (int i = 0; i < F.nmods; i++) {
    free(F.mods[i]->image);
    free(F.mods[i]);
  }
  for (int i = 0; i < F.nfuncs; i++) free(F.funcs[i]);
  for (int i = 0; i < F.nal; i++) free(F.al[i].p);
  free(F.streams);
  free(F.graphs);
  free(F.execs);
  free(F.events);
  free(F.mods);
  free(F.funcs);
  free(F.al);
  free(F.log);
  memset(&F, 0, sizeof F);
}
