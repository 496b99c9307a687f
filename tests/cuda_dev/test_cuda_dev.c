/* test_cuda_dev - the CUDA device layer (runtime/device/dev_cuda.c and
 * dev_cublaslt.c) without a GPU, through fake drivers (fake_cuda.c as
 * libcuda.so.1, fake_cublaslt.c as libcublasLt.so.13; TS_CUDA_DRIVER and
 * TS_CUBLASLT_LIB point the layer at them).
 *   test_cuda_dev MODE FAKE_LIBCUDA FAKE_LIBCUBLASLT
 * MODE:
 *   nodriver   no driver at all: one line, count 0 (the default path only
 *              where this machine really has no libcuda.so.1)
 *   device     devices, memory round trips on both streams, events, memset
 *   module     cubin vs PTX by arch, JIT errors, functions by name (and a
 *              real NVRTC image when NVRTC is here)
 *   launch     launch arguments by value, the launcher callback, a faulting
 *              kernel
 *   graph      captured launches, copies and a forked stream replayed with
 *              the captured arguments; what invalidates a capture
 *   errors     out of memory and injected failures come back naming the call
 *   init_fail  cuInit failing
 *   nolt       no cuBLASLt: devices work, GEMMs say why they cannot
 *   gemm       RtGemm cases (transposes, batches, alpha / beta, bias, gelu,
 *              f32 / f64, bf16, odd sizes and leading dimensions) against a
 *              row-major reference; in a graph; the plan cache.  With
 *              FAKE_CUBLASLT_NO_EPILOGUE_64F=1 (no f64 epilogues) the f64
 *              bias cases go through the split plan and gelu ones fail
 * What the fakes do is our reading of NVIDIA's documentation; the tests
 * prove the device layer against that reading. */
#include "runtime/device/dev_cuda_priv.h"
#include "runtime/cpu/half.h"
#include "runtime/exec/train.h"
#include "fake_cuda.h"
#include <dlfcn.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"

/* err must contain every one of the NULL-terminated list, on one line */
static void check_msg(int line, const char *err, ...) {
  va_list ap;
  va_start(ap, err);
  for (const char *w; (w = va_arg(ap, const char *));)
    CHECK_AT(__FILE__, line, strstr(err, w), "the message lacks '%s': %s", w, err);
  va_end(ap);
  CHECK_AT(__FILE__, line, !strchr(err, '\n'), "the message is not one line: %s", err);
}
#define MSG(err, ...) check_msg(__LINE__, err, __VA_ARGS__, (const char *)NULL)

/* ---- the fake driver's controls ---- */
static struct {
  FakeCudaConfigure configure;
  FakeCudaFail fail;
  FakeCudaSetLauncher set_launcher;
  FakeCudaLogCount log_count;
  FakeCudaLog log;
  FakeCudaLogClear log_clear;
  FakeCudaCalls calls;
  FakeCudaLive live;
  FakeCudaOrphans orphans;
  FakeCudaLastModule last_module;
  FakeCudaStreamId stream_id;
  FakeCudaPending pending;
} fk;

static void *sym(void *h, const char *name) {
  void *p = dlsym(h, name);
  if (!p) {
    printf("FAIL: the fake driver has no %s\n", name);
    exit(1);
  }
  return p;
}

/* Points the device layer at the fakes, with devices of these archs. */
static void use_fakes(const char *cuda, const char *lt, int n, const int *sm, size_t mem) {
  setenv("TS_CUDA_DRIVER", cuda, 1);
  setenv("TS_CUBLASLT_LIB", lt, 1);
  void *h = dlopen(cuda, RTLD_NOW | RTLD_LOCAL);   /* the same instance dev_cuda.c will get */
  if (!h) {
    printf("FAIL: cannot load the fake driver %s: %s\n", cuda, dlerror());
    exit(1);
  }
  *(void **)&fk.configure = sym(h, "fake_cuda_configure");
  *(void **)&fk.fail = sym(h, "fake_cuda_fail");
  *(void **)&fk.set_launcher = sym(h, "fake_cuda_set_launcher");
  *(void **)&fk.log_count = sym(h, "fake_cuda_log_count");
  *(void **)&fk.log = sym(h, "fake_cuda_log");
  *(void **)&fk.log_clear = sym(h, "fake_cuda_log_clear");
  *(void **)&fk.calls = sym(h, "fake_cuda_calls");
  *(void **)&fk.live = sym(h, "fake_cuda_live");
  *(void **)&fk.orphans = sym(h, "fake_cuda_orphans");
  *(void **)&fk.last_module = sym(h, "fake_cuda_last_module");
  *(void **)&fk.stream_id = sym(h, "fake_cuda_stream_id");
  *(void **)&fk.pending = sym(h, "fake_cuda_pending");
  fk.configure(n, sm, mem);
}

static RtDev *open_dev(int ordinal) {
  char err[1024];
  RtDev *d = rt_dev_cuda_open(ordinal, err, sizeof err);
  if (!d) {
    printf("FAIL: opening fake GPU %d: %s\n", ordinal, err);
    exit(1);
  }
  return d;
}

/* Every object freed, none left for the context's destruction to free. */
static void check_clean(const char *when) {
  char what[256];
  int live = fk.live(what, sizeof what), orphans = fk.orphans(1);
  CHECK(live == 0 && orphans == 0, "%s: %s alive, %d left to the context's destruction", when, what, orphans);
}

static void *dalloc(RtDev *d, size_t bytes) {
  void *p = NULL;
  char err[512];
  if (d->ops->alloc(d, bytes, &p, err, sizeof err)) {
    printf("FAIL: alloc %zu: %s\n", bytes, err);
    exit(1);
  }
  return p;
}

#define OK(call)                                                      \
  do {                                                                \
    char e_[1024] = "";                                               \
    CHECK((call) == 0, "%s", e_);                                     \
  } while (0)
/* OK(d->ops->h2d(d, ..., E)) : E is the error buffer of the OK block */
#define E e_, sizeof e_

static unsigned rng = 12345;
static unsigned rnd(void) { return rng = rng * 1103515245u + 12345u; }
static double urand(void) { return (double)(rnd() >> 8) / (1 << 24) * 2 - 1; }

/* ---- nodriver ---- */

static void test_nodriver(void) {
  char msg[512] = "", err[512] = "";
  setenv("TS_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  CHECK(rt_dev_cuda_count(msg, sizeof msg) == 0, "count without a driver");
  MSG(msg, "no GPU driver found (TS_CUDA_DRIVER=/nonexistent/libcuda.so.1");
  CHECK(rt_dev_cuda_open(0, err, sizeof err) == NULL, "open without a driver");
  MSG(err, "no GPU driver found (TS_CUDA_DRIVER=/nonexistent/libcuda.so.1");
  printf("no driver (TS_CUDA_DRIVER): %s\n", err);
  unsetenv("TS_CUDA_DRIVER");
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    printf("a libcuda.so.1 is installed here: the default-path case is not tested\n");
    return;
  }
  CHECK(rt_dev_cuda_count(msg, sizeof msg) == 0, "count without a driver");
  CHECK(!strcmp(msg, "no GPU driver found (libcuda.so.1)"), "default-path message: %s", msg);
  CHECK(rt_dev_cuda_open(0, err, sizeof err) == NULL && !strcmp(err, "no GPU driver found (libcuda.so.1)"),
        "open without a driver: %s", err);
  printf("no driver (default path): %s\n", err);
}

/* ---- device ---- */

static void test_device(const char *cuda, const char *lt) {
  int sm[2] = {80, 90};
  use_fakes(cuda, lt, 2, sm, 0);
  char msg[512], err[512];
  CHECK(rt_dev_cuda_count(msg, sizeof msg) == 2, "count %s", msg);
  MSG(msg, "GPU driver found: 2 device(s)");
  CHECK(rt_dev_cuda_open(2, err, sizeof err) == NULL, "GPU 2 of 2 opened");
  MSG(err, "CUDA device 2:", "there is no GPU 2: the driver reports 2");
  check_clean("after a refused open");
  RtDev *d = open_dev(0), *d1 = open_dev(1);
  CHECK(d->sm == 80 && d1->sm == 90 && strstr(d->label, "Fake GPU 0 (sm_80") && !strcmp(d->ops->name, "cuda") &&
        !d->host_memory && d->ordinal == 0 && d1->ordinal == 1, "devices: %s sm %d, %s sm %d", d->label, d->sm,
        d1->label, d1->sm);
  printf("opened %s and %s\n", d->label, d1->label);
  void *hs = d->ops->stream_handle(d, RT_STREAM_COMPUTE), *hc = d->ops->stream_handle(d, RT_STREAM_COMM);
  int sid = fk.stream_id(hs), cid = fk.stream_id(hc);
  CHECK(sid > 0 && cid > 0 && sid != cid, "the device's streams: %d %d", sid, cid);
  CHECK(d->ops->stream_handle(d, 2) == NULL, "stream 2 has a handle");

  /* round trip: host -> a (comm stream) -> b (compute, after an event) -> host */
  enum { N = 1000 };
  unsigned char src[N], dst[N], zero[N];
  for (int i = 0; i < N; i++) src[i] = (unsigned char)rnd();
  memset(dst, 0, N);
  memset(zero, 0, N);
  unsigned char *a = dalloc(d, N), *b = dalloc(d, N);
  CHECK(a && b && a != b && (uintptr_t)a % 256 == 0, "allocations %p %p", (void *)a, (void *)b);
  fk.log_clear();
  OK(d->ops->h2d(d, a, src, N, RT_STREAM_COMM, E));
  OK(d->ops->event_record(d, 5, RT_STREAM_COMM, E));
  OK(d->ops->stream_wait(d, RT_STREAM_COMPUTE, 5, E));
  OK(d->ops->d2d(d, b, a, N, RT_STREAM_COMPUTE, E));
  OK(d->ops->d2h(d, dst, b, N, RT_STREAM_COMPUTE, E));
  CHECK(fk.pending() == 5 && !memcmp(dst, zero, N), "the copies ran before anyone waited (%d pending)", fk.pending());
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  CHECK(!memcmp(dst, src, N), "round trip through the comm stream, an event and the compute stream");
  int n = fk.log_count();
  const FakeCudaOp *L0 = fk.log(0), *L4 = fk.log(n - 1);
  CHECK(n == 5 && L0 && L0->kind == FAKE_OP_H2D && L0->stream == cid && L4->kind == FAKE_OP_D2H &&
        L4->stream == sid, "%d ops ran; first kind %d on %d, last kind %d on %d", n, L0 ? L0->kind : -1,
        L0 ? L0->stream : -1, L4 ? L4->kind : -1, L4 ? L4->stream : -1);

  /* the same without the event: the fake's streams are independent, so the
   * compute stream copies stale bytes (this proves the test above can fail) */
  for (int i = 0; i < N; i++) src[i] = (unsigned char)(src[i] + 1);
  OK(d->ops->h2d(d, a, src, N, RT_STREAM_COMM, E));
  OK(d->ops->d2d(d, b, a, N, RT_STREAM_COMPUTE, E));
  OK(d->ops->d2h(d, dst, b, N, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  CHECK(memcmp(dst, src, N) != 0, "without the event the compute stream saw the comm stream's copy");
  OK(d->ops->sync(d, RT_STREAM_COMM, E));
  CHECK(fk.pending() == 0, "work left after syncing both streams");

  /* memset0 of the middle */
  OK(d->ops->h2d(d, a, src, N, RT_STREAM_COMPUTE, E));
  OK(d->ops->memset0(d, a + 100, 800, RT_STREAM_COMPUTE, E));
  OK(d->ops->d2h(d, dst, a, N, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  int good = 1;
  for (int i = 0; i < N; i++) good &= dst[i] == (i >= 100 && i < 900 ? 0 : src[i]);
  CHECK(good, "memset0 of [100, 900)");
  /* empty copies, an empty allocation, a bad stream */
  OK(d->ops->h2d(d, a, src, 0, RT_STREAM_COMPUTE, E));
  void *z = dalloc(d, 0);
  CHECK(z != NULL, "alloc(0)");
  d->ops->free(d, z);
  CHECK(d->ops->h2d(d, a, src, 8, 7, err, sizeof err) == -1, "stream 7 accepted");
  MSG(err, "stream 7");
  CHECK(d->ops->event_record(d, RT_DEV_EVENTS, 0, err, sizeof err) == -1, "event 64 accepted");
  /* a copy out of an allocation's bounds is the driver's error, named */
  CHECK(d->ops->h2d(d, a + 900, src, 200, RT_STREAM_COMPUTE, err, sizeof err) == -1, "copy past the end accepted");
  MSG(err, "cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_INVALID_VALUE", "copying host to device", "hint:");
  printf("a copy past the end: %s\n", err);
  d->ops->free(d, a);
  d->ops->free(d, b);
  d->ops->close(d);
  d1->ops->close(d1);
  check_clean("after closing both devices");
}

/* ---- module ---- */

/* A cubin as far as the fake looks: an ELF header with the arch, then the
 * names.  The ELF ABI version and e_flags as NVRTC 13 writes them. */
static unsigned char *fake_cubin(int arch, const char *names, size_t names_len, size_t *len) {
  *len = 64 + names_len;
  unsigned char *p = calloc(1, *len);
  memcpy(p, "\177ELF", 4);
  p[4] = 2;
  p[5] = 1;
  p[6] = 1;
  p[7] = 65;
  p[8] = 8;
  uint64_t shoff = *len;
  uint32_t flags = 0x6000004u | (uint32_t)arch << 8;
  uint16_t shentsize = 64;
  memcpy(p + 40, &shoff, 8);
  memcpy(p + 48, &flags, 4);
  memcpy(p + 58, &shentsize, 2);
  memcpy(p + 64, names, names_len);
  return p;
}

static char *fake_ptx(int target, const char *k1, const char *k2) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           ".version 9.0\n.target sm_%d\n.address_size 64\n\n"
           ".visible .entry %s(\n\t.param .align 8 .b8 %s_param_0[%zu]\n)\n{\n\tret;\n}\n"
           ".visible .entry %s(\n\t.param .align 8 .b8 %s_param_0[%zu]\n)\n{\n\tret;\n}\n",
           target, k1, k1, sizeof(CgCudaArgs), k2, k2, sizeof(CgCudaArgs));
  return buf;
}

static CgCudaLaunch lnch(const char *name, long long blocks, int threads) {
  CgCudaLaunch l = {.blocks = blocks, .threads = threads};
  snprintf(l.name, sizeof l.name, "%s", name);
  return l;
}

static CgCudaArgs args_of(uintptr_t base) {
  CgCudaArgs a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < CG_CUDA_MAX_BUFS; k++) a.b[k] = (void *)(base + 64 * (uintptr_t)k);
  a.run = (const long long *)(base + 4096);
  return a;
}

/* The last op of the log that is a launch. */
static const FakeCudaOp *last_launch(void) {
  for (int i = fk.log_count() - 1; i >= 0; i--)
    if (fk.log(i)->kind == FAKE_OP_LAUNCH) return fk.log(i);
  return NULL;
}

static void test_nvrtc_images(RtDev *d80, RtDev *d90) {
  char why[512];
  if (!cg_nvrtc_available(why, sizeof why)) {
    printf("NVRTC is not here (%s): the real-image part is not tested\n", why);
    return;
  }
  StrBuf src = {0};
  sb_printf(&src, "%sextern \"C\" __global__ void tk(TsArgs a) { ((float *)a.b[0])[threadIdx.x] = (float)a.run[0]; }\n",
            cg_cuda_prelude());
  CgNvrtcOut o;
  char err[2048];
  int rc = cg_nvrtc_compile(src.p, "sm_80", &o, err, sizeof err);
  CHECK(rc == 0, "NVRTC: %s", err);
  if (rc != 0) {
    sb_free(&src);
    return;
  }
  RtDevImage img = {src.p, o.ptx, o.cubin, o.cubin_len, 80};
  CgCudaArgs a = args_of(0x10000);
  CgCudaLaunch l = lnch("tk", 3, 64);
  RtDevModule *m80 = NULL, *m90 = NULL, *msrc = NULL;
  /* sm_80: NVRTC's cubin (the fake reads its arch from the ELF header and finds tk in it) */
  OK(d80->ops->module_load(d80, &img, &m80, E));
  CHECK(!strcmp(fk.last_module(), "cubin sm_80"), "sm_80 loaded %s", fk.last_module());
  if (m80) {
    OK(d80->ops->launch(d80, m80, &l, &a, RT_STREAM_COMPUTE, E));
    OK(d80->ops->sync(d80, RT_STREAM_COMPUTE, E));
  }
  /* sm_90: the PTX; the fake takes the parameter's size from its .param
   * declaration: TsArgs under NVRTC must be as large as CgCudaArgs */
  OK(d90->ops->module_load(d90, &img, &m90, E));
  CHECK(!strcmp(fk.last_module(), "PTX sm_80"), "sm_90 loaded %s", fk.last_module());
  if (m90) {
    OK(d90->ops->launch(d90, m90, &l, &a, RT_STREAM_COMPUTE, E));
    OK(d90->ops->sync(d90, RT_STREAM_COMPUTE, E));
    const FakeCudaOp *op = last_launch();
    CHECK(op && op->args_len == sizeof(CgCudaArgs) && !memcmp(op->args, &a, sizeof a),
          "the PTX's parameter is %zu bytes, CgCudaArgs %zu", op ? op->args_len : 0, sizeof(CgCudaArgs));
  }
  /* only the source: the device layer compiles it for its own arch */
  RtDevImage only = {src.p, NULL, NULL, 0, 0};
  OK(d90->ops->module_load(d90, &only, &msrc, E));
  CHECK(!strcmp(fk.last_module(), "cubin sm_90"), "source-only image on sm_90 loaded %s", fk.last_module());
  if (msrc) {
    OK(d90->ops->launch(d90, msrc, &l, &a, RT_STREAM_COMPUTE, E));
    OK(d90->ops->sync(d90, RT_STREAM_COMPUTE, E));
  }
  d80->ops->module_free(d80, m80);
  d90->ops->module_free(d90, m90);
  d90->ops->module_free(d90, msrc);
  cg_nvrtc_out_free(&o);
  sb_free(&src);
  printf("NVRTC images: cubin on sm_80, PTX on sm_90 (parameter %zu bytes), source compiled for sm_90\n",
         sizeof(CgCudaArgs));
}

static void test_module(const char *cuda, const char *lt) {
  int sm[2] = {80, 90};
  use_fakes(cuda, lt, 2, sm, 0);
  RtDev *d = open_dev(0), *d9 = open_dev(1);
  char err[4096];
  size_t clen;
  static const char names[] = "\0.text.k1\0k1\0k2\0";
  unsigned char *cubin = fake_cubin(80, names, sizeof names, &clen);
  RtDevImage img = {NULL, fake_ptx(80, "k1", "k2"), cubin, clen, 80};
  RtDevModule *m = NULL, *m9 = NULL, *bad = NULL;
  OK(d->ops->module_load(d, &img, &m, E));
  CHECK(!strcmp(fk.last_module(), "cubin sm_80"), "sm_80 device loaded %s", fk.last_module());
  OK(d9->ops->module_load(d9, &img, &m9, E));
  CHECK(!strcmp(fk.last_module(), "PTX sm_80"), "sm_90 device loaded %s", fk.last_module());
  /* no PTX and a cubin for another arch: refused before the driver */
  RtDevImage nopx = {NULL, NULL, cubin, clen, 80};
  CHECK(d9->ops->module_load(d9, &nopx, &bad, err, sizeof err) == -1 && !bad, "sm_80 cubin alone on sm_90");
  MSG(err, "no cubin for sm_90, no PTX and no source", "mcc --target sm_90");
  /* the driver refuses a cubin whose header says another arch */
  size_t l90;
  unsigned char *c90 = fake_cubin(90, names, sizeof names, &l90);
  RtDevImage lie = {NULL, NULL, c90, l90, 80};
  CHECK(d->ops->module_load(d, &lie, &bad, err, sizeof err) == -1, "an sm_90 cubin loaded on sm_80");
  MSG(err, "cuModuleLoadDataEx failed: CUDA_ERROR_NO_BINARY_FOR_GPU", "loading the cubin for sm_80",
      "another GPU architecture");
  printf("wrong cubin: %s\n", err);
  /* PTX newer than the device: the JIT's log is in the message */
  RtDevImage newer = {NULL, fake_ptx(90, "k1", "k2"), NULL, 0, 0};
  CHECK(d->ops->module_load(d, &newer, &bad, err, sizeof err) == -1, "sm_90 PTX loaded on sm_80");
  MSG(err, "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX", "JIT-compiling the PTX for sm_80",
      "SM version specified by .target is higher", "update the driver");
  printf("newer PTX: %s\n", err);
  RtDevImage none = {NULL, NULL, NULL, 0, 0};
  CHECK(d->ops->module_load(d, &none, &bad, err, sizeof err) == -1, "an empty image loaded");
  /* functions by name, looked up once */
  CgCudaArgs a = args_of(0x1000);
  CgCudaLaunch l1 = lnch("k1", 1, 32), l2 = lnch("k2", 2, 64), lx = lnch("nope", 1, 32);
  long before = fk.calls("cuModuleGetFunction");
  for (int i = 0; i < 5; i++) {
    OK(d->ops->launch(d, m, &l1, &a, RT_STREAM_COMPUTE, E));
    OK(d->ops->launch(d, m, &l2, &a, RT_STREAM_COMPUTE, E));
    OK(d9->ops->launch(d9, m9, &l1, &a, RT_STREAM_COMM, E));
  }
  CHECK(fk.calls("cuModuleGetFunction") - before == 3, "cuModuleGetFunction called %ld times for 3 (module, name)",
        fk.calls("cuModuleGetFunction") - before);
  CHECK(d->ops->launch(d, m, &lx, &a, RT_STREAM_COMPUTE, err, sizeof err) == -1, "kernel 'nope' launched");
  MSG(err, "cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND", "looking up kernel nope", "(loaded from its cubin)",
      "do not match");
  printf("missing kernel: %s\n", err);
  /* many names: the table grows */
  for (int i = 0; i < 200; i++) {
    CgCudaLaunch li = lnch(i % 2 ? "k1" : "k2", 1 + i, 32);
    OK(d->ops->launch(d, m, &li, &a, RT_STREAM_COMPUTE, E));
  }
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  OK(d9->ops->sync(d9, RT_STREAM_COMM, E));
  test_nvrtc_images(d, d9);
  d->ops->module_free(d, m);
  d9->ops->module_free(d9, m9);
  d->ops->close(d);
  d9->ops->close(d9);
  free(cubin);
  free(c90);
  check_clean("after the module tests");
}

/* ---- launch ---- */

static struct {
  int n;
  char name[80];
  long long blocks;
  int threads;
  CgCudaArgs a;
  int fail;
} seen;

static int launcher(const char *name, long long blocks, int threads, const void *args) {
  seen.n++;
  snprintf(seen.name, sizeof seen.name, "%s", name);
  seen.blocks = blocks;
  seen.threads = threads;
  memcpy(&seen.a, args, sizeof seen.a);
  return seen.fail;
}

static void test_launch(const char *cuda, const char *lt) {
  int sm[1] = {80};
  use_fakes(cuda, lt, 1, sm, 0);
  RtDev *d = open_dev(0);
  static const char names[] = "\0k1\0k2\0";
  size_t clen;
  unsigned char *cubin = fake_cubin(80, names, sizeof names, &clen);
  RtDevImage img = {NULL, NULL, cubin, clen, 80};
  RtDevModule *m = NULL;
  OK(d->ops->module_load(d, &img, &m, E));
  if (!m) exit(1);
  char err[1024];
  CgCudaArgs a = args_of(0xabc000), want = a;
  CgCudaLaunch l = lnch("k1", 37, 128);
  fk.log_clear();
  OK(d->ops->launch(d, m, &l, &a, RT_STREAM_COMPUTE, E));
  a = args_of(0xdef000);   /* passed by value: the launch keeps what it got */
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  const FakeCudaOp *op = last_launch();
  CHECK(op && !strcmp(op->name, "k1") && op->grid[0] == 37 && op->grid[1] == 1 && op->grid[2] == 1 &&
        op->block[0] == 128 && op->block[1] == 1 && op->block[2] == 1 && op->shared == 0 &&
        op->args_len == sizeof want && !memcmp(op->args, &want, sizeof want),
        "the launch as the driver saw it: %s grid %u block %u, %zu argument bytes%s", op ? op->name : "-",
        op ? op->grid[0] : 0, op ? op->block[0] : 0, op ? op->args_len : 0,
        op && !memcmp(op->args, &want, sizeof want) ? "" : ", different");
  /* through the launcher callback (as the CUDA emulator will be) */
  fk.set_launcher(launcher);
  CgCudaLaunch l2 = lnch("k2", 65535LL * 32, 1024);
  OK(d->ops->launch(d, m, &l2, &a, RT_STREAM_COMM, E));
  CHECK(seen.n == 0, "the kernel ran before the stream was waited for");
  OK(d->ops->sync(d, RT_STREAM_COMM, E));
  CHECK(seen.n == 1 && !strcmp(seen.name, "k2") && seen.blocks == 65535LL * 32 && seen.threads == 1024 &&
        !memcmp(&seen.a, &a, sizeof a), "the launcher saw %d launches, %s %lld x %d", seen.n, seen.name, seen.blocks,
        seen.threads);
  /* launches the layer refuses itself */
  CgCudaLaunch big = lnch("k1", 1, 2048), none = lnch("k1", 0, 32);
  CHECK(d->ops->launch(d, m, &big, &a, RT_STREAM_COMPUTE, err, sizeof err) == -1, "2048 threads launched");
  MSG(err, "k1 launched with 1 blocks of 2048 threads");
  CHECK(d->ops->launch(d, m, &none, &a, RT_STREAM_COMPUTE, err, sizeof err) == -1, "0 blocks launched");
  /* a kernel that faults: the launch is issued, the sync reports it, and
   * the context stays lost */
  seen.fail = 1;
  OK(d->ops->launch(d, m, &l, &a, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err) == -1, "a faulting kernel went unnoticed");
  MSG(err, "cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED", "waiting for the compute stream",
      "compute-sanitizer");
  printf("faulting kernel: %s\n", err);
  void *p = NULL;
  CHECK(d->ops->alloc(d, 64, &p, err, sizeof err) == -1, "the lost context still allocates");
  MSG(err, "cuMemAlloc_v2 failed: CUDA_ERROR_LAUNCH_FAILED");
  fk.set_launcher(NULL);
  d->ops->module_free(d, m);
  d->ops->close(d);
  char what[256];
  CHECK(fk.live(what, sizeof what) == 0, "after closing a lost device: %s", what);
  fk.orphans(1);   /* a lost context's objects cannot be destroyed one by one */
  d = open_dev(0);   /* the last release reset the context: the GPU is usable again */
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  d->ops->close(d);
  free(cubin);
  check_clean("after the launch tests");
}

/* ---- graph ---- */

static int count_launches(int from, const char *name, int replay) {
  int n = 0;
  for (int i = from; i < fk.log_count(); i++) {
    const FakeCudaOp *o = fk.log(i);
    n += o->kind == FAKE_OP_LAUNCH && !strcmp(o->name, name) && (replay < 0 || o->replay == replay);
  }
  return n;
}

static void test_graph(const char *cuda, const char *lt) {
  int sm[1] = {90};
  use_fakes(cuda, lt, 1, sm, 0);
  RtDev *d = open_dev(0);
  static const char names[] = "\0k1\0k2\0k3\0";
  size_t clen;
  unsigned char *cubin = fake_cubin(90, names, sizeof names, &clen);
  RtDevImage img = {NULL, NULL, cubin, clen, 90};
  RtDevModule *m = NULL;
  OK(d->ops->module_load(d, &img, &m, E));
  if (!m) exit(1);
  char err[1024];
  int cid = fk.stream_id(d->ops->stream_handle(d, RT_STREAM_COMM));
  /* a captured copy's host side is page-locked (device.h, host_alloc) */
  double *pin = NULL;
  OK(d->ops->host_alloc(d, 2 * sizeof(double), (void **)&pin, E));
  if (!pin) exit(1);
  CHECK(pin[0] == 0 && pin[1] == 0, "host_alloc's memory is not zeroed");
  double *host_p = &pin[0], *back_p = &pin[1];
  *host_p = 1.5;
  double *buf = dalloc(d, 64);
  CgCudaArgs A = args_of(0x100000), B = args_of(0x200000), a;
  CgCudaLaunch l1 = lnch("k1", 4, 256), l2 = lnch("k2", 8, 128), l3 = lnch("k3", 1, 32);

  /* one stream: two launches and a copy from host memory */
  fk.log_clear();
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  a = A;
  OK(d->ops->launch(d, m, &l1, &a, RT_STREAM_COMPUTE, E));
  a = B;
  OK(d->ops->launch(d, m, &l2, &a, RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, buf, host_p, sizeof *host_p, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->graph_begin(d, RT_STREAM_COMM, err, sizeof err) == -1, "two captures at once");
  RtDevGraph *g = NULL;
  OK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g, E));
  CHECK(fk.log_count() == 0 && fk.pending() == 0, "captured work ran or was queued (%d ran)", fk.log_count());
  *host_p = 2.5;   /* a memcpy node reads the host memory when it runs */
  a = args_of(0x300000);
  for (int r = 0; r < 2 && g; r++) OK(d->ops->graph_launch(d, g, RT_STREAM_COMPUTE, E));
  OK(d->ops->d2h(d, back_p, buf, sizeof *back_p, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  int n = fk.log_count();
  int order = n == 9;   /* graph, k1, k2, h2d, graph, k1, k2, h2d, d2h */
  static const int kinds[9] = {FAKE_OP_GRAPH, FAKE_OP_LAUNCH, FAKE_OP_LAUNCH, FAKE_OP_H2D, FAKE_OP_GRAPH,
                               FAKE_OP_LAUNCH, FAKE_OP_LAUNCH, FAKE_OP_H2D, FAKE_OP_D2H};
  for (int i = 0; order && i < 9; i++) order = fk.log(i)->kind == kinds[i];
  CHECK(order, "the replays ran %d ops, not graph k1 k2 h2d twice then d2h", n);
  if (order) {
    const FakeCudaOp *k1 = fk.log(5), *k2 = fk.log(6);
    CHECK(!strcmp(k1->name, "k1") && !memcmp(k1->args, &A, sizeof A) && k1->grid[0] == 4 && k1->block[0] == 256 &&
          !strcmp(k2->name, "k2") && !memcmp(k2->args, &B, sizeof B) && k1->replay == 2 && fk.log(1)->replay == 1,
          "the second replay's launches do not carry the captured arguments");
  }
  CHECK(*back_p == 2.5, "the captured host copy moved %g, want 2.5", *back_p);

  /* a captured copy from pageable memory is refused and spoils the capture */
  double pageable = 3.5;
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->h2d(d, buf, &pageable, sizeof pageable, RT_STREAM_COMPUTE, err, sizeof err) == -1 &&
            strstr(err, "CAPTURE_UNSUPPORTED"), "a captured copy from pageable memory: %s", err);
  RtDevGraph *gbad = NULL;
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &gbad, err, sizeof err) == -1 && !gbad,
        "the capture with a pageable copy ended without an error");

  /* a forked stream: compute -> comm -> compute, joined back */
  fk.log_clear();
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  OK(d->ops->launch(d, m, &l1, &A, RT_STREAM_COMPUTE, E));
  OK(d->ops->event_record(d, 0, RT_STREAM_COMPUTE, E));
  OK(d->ops->stream_wait(d, RT_STREAM_COMM, 0, E));
  OK(d->ops->launch(d, m, &l2, &B, RT_STREAM_COMM, E));
  OK(d->ops->event_record(d, 1, RT_STREAM_COMM, E));
  OK(d->ops->stream_wait(d, RT_STREAM_COMPUTE, 1, E));
  OK(d->ops->launch(d, m, &l3, &A, RT_STREAM_COMPUTE, E));
  RtDevGraph *g2 = NULL;
  OK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g2, E));
  if (g2) OK(d->ops->graph_launch(d, g2, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  int i1 = -1, i2 = -1, i3 = -1;
  for (int i = 0; i < fk.log_count(); i++) {
    const FakeCudaOp *o = fk.log(i);
    if (o->kind != FAKE_OP_LAUNCH) continue;
    if (!strcmp(o->name, "k1")) i1 = i;
    if (!strcmp(o->name, "k2")) {
      i2 = i;
      CHECK(o->stream == cid, "k2 was captured from stream %d, not the comm stream %d", o->stream, cid);
    }
    if (!strcmp(o->name, "k3")) i3 = i;
  }
  CHECK(i1 >= 0 && i1 < i2 && i2 < i3, "the forked graph replayed k1 %d, k2 %d, k3 %d", i1, i2, i3);
  /* the comm stream left out: the capture cannot end */
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  OK(d->ops->event_record(d, 0, RT_STREAM_COMPUTE, E));
  OK(d->ops->stream_wait(d, RT_STREAM_COMM, 0, E));
  OK(d->ops->launch(d, m, &l2, &B, RT_STREAM_COMM, E));
  RtDevGraph *g3 = NULL;
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g3, err, sizeof err) == -1 && !g3, "an unjoined fork ended");
  MSG(err, "cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "ending the graph capture",
      "TS_CUDA_GRAPHS=0");
  printf("unjoined fork: %s\n", err);
  /* what invalidates a capture: an allocation, a sync of the capturing stream,
   * waiting on work outside the capture */
  void *p = NULL;
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->alloc(d, 64, &p, err, sizeof err) == -1, "allocated during a capture");
  MSG(err, "cuMemAlloc_v2 failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "Graph capture does not allow");
  printf("alloc in a capture: %s\n", err);
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g3, err, sizeof err) == -1 && !g3, "an invalidated capture ended");
  MSG(err, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->sync(d, RT_STREAM_COMPUTE, err, sizeof err) == -1, "synchronized a capturing stream");
  MSG(err, "cuStreamSynchronize failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g3, err, sizeof err) == -1, "an invalidated capture ended");
  OK(d->ops->event_record(d, 2, RT_STREAM_COMM, E));
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  CHECK(d->ops->stream_wait(d, RT_STREAM_COMPUTE, 2, err, sizeof err) == -1, "the capture waited on outside work");
  MSG(err, "cuStreamWaitEvent failed: CUDA_ERROR_STREAM_CAPTURE_ISOLATION");
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g3, err, sizeof err) == -1, "an invalidated capture ended");
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g3, err, sizeof err) == -1, "ended a capture twice");
  MSG(err, "no graph capture under way on stream 0");
  /* the device works on after the failed captures */
  fk.log_clear();
  OK(d->ops->graph_launch(d, g, RT_STREAM_COMM, E));
  OK(d->ops->sync(d, RT_STREAM_COMM, E));
  CHECK(count_launches(0, "k1", -1) == 1 && count_launches(0, "k2", -1) == 1, "replay on the comm stream");
  d->ops->graph_free(d, g);
  d->ops->graph_free(d, g2);
  d->ops->host_free(d, pin);   /* after the last replay of g, whose copy reads it */
  d->ops->free(d, buf);
  d->ops->module_free(d, m);
  d->ops->close(d);
  free(cubin);
  check_clean("after the graph tests");
}

/* ---- errors ---- */

static void test_errors(const char *cuda, const char *lt) {
  int sm[1] = {80};
  use_fakes(cuda, lt, 1, sm, (size_t)40 << 20);   /* 40 MiB, 32 of them cuBLASLt's workspace */
  char err[1024];
  RtDev *d = open_dev(0);
  void *p = NULL;
  CHECK(d->ops->alloc(d, (size_t)16 << 20, &p, err, sizeof err) == -1 && !p, "16 MiB allocated in 8");
  MSG(err, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while allocating 16777216 bytes on "
      "Fake GPU 0 (sm_80", "(hint: the GPU is out of memory");
  printf("out of memory: %s\n", err);
  p = dalloc(d, 1024);
  double x[4] = {1, 2, 3, 4};
  fk.fail("cuMemcpyHtoDAsync_v2", 700, 0);
  CHECK(d->ops->h2d(d, p, x, sizeof x, RT_STREAM_COMPUTE, err, sizeof err) == -1, "injected failure passed");
  MSG(err, "cuMemcpyHtoDAsync_v2 failed: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered) "
      "while copying host to device", "compute-sanitizer");
  fk.fail("cuEventRecord", 400, 0);
  CHECK(d->ops->event_record(d, 3, RT_STREAM_COMM, err, sizeof err) == -1, "injected failure passed");
  MSG(err, "cuEventRecord failed: CUDA_ERROR_INVALID_HANDLE", "destroyed");
  fk.fail("cuGraphInstantiateWithFlags", 2, 0);
  OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  RtDevGraph *g = NULL;
  CHECK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &g, err, sizeof err) == -1 && !g, "injected failure passed");
  MSG(err, "cuGraphInstantiateWithFlags failed: CUDA_ERROR_OUT_OF_MEMORY", "instantiating the captured graph");
  fk.fail("cuMemcpyDtoHAsync_v2", 12345, 0);   /* a code the driver cannot name */
  CHECK(d->ops->d2h(d, x, p, 8, RT_STREAM_COMPUTE, err, sizeof err) == -1, "injected failure passed");
  MSG(err, "cuMemcpyDtoHAsync_v2 failed: CUDA error 12345 (no description)");
  d->ops->free(d, p);
  d->ops->close(d);
  check_clean("after the error tests");
  /* opening fails at each step: the message names the call, nothing leaks */
  static const struct { const char *fn; int code, skip; const char *want; } steps[] = {
    {"cuDeviceGet", 101, 0, "cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE"},
    {"cuDeviceGetAttribute", 1, 1, "cuDeviceGetAttribute failed: CUDA_ERROR_INVALID_VALUE (invalid argument) while "
     "reading the compute capability"},
    {"cuDevicePrimaryCtxRetain", 2, 0, "cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) "
     "while retaining the device's primary context"},
    {"cuStreamCreate", 2, 1, "cuStreamCreate failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while creating a "
     "stream"},
    {"cuEventCreate", 2, 10, "cuEventCreate failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while creating an "
     "event"},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    fk.fail(steps[i].fn, steps[i].code, steps[i].skip);
    CHECK(rt_dev_cuda_open(0, err, sizeof err) == NULL, "open passed an injected %s failure", steps[i].fn);
    MSG(err, "CUDA device 0: ", steps[i].want);
    check_clean(steps[i].fn);
  }
  printf("open failing in cuStreamCreate: %s\n", err);
  /* cuBLASLt's workspace does not fit: the device opens, GEMMs say why */
  int sm1[1] = {80};
  fk.configure(1, sm1, (size_t)16 << 20);
  d = open_dev(0);
  RtGemm gm = {.dtype = IR_F32, .m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1, .alpha = 1};
  float one = 1;
  gm.a = gm.b = gm.c = &one;
  CHECK(d->ops->gemm(d, &gm, RT_STREAM_COMPUTE, err, sizeof err) == -1, "a GEMM without cuBLASLt's workspace");
  MSG(err, "need cuBLASLt", "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY", "allocating the cuBLASLt workspace");
  printf("no room for the workspace: %s\n", err);
  d->ops->close(d);
  check_clean("after the workspace test");
}

static void test_init_fail(const char *cuda, const char *lt) {
  int sm[1] = {80};
  use_fakes(cuda, lt, 1, sm, 0);
  fk.fail("cuInit", 100, 0);
  char msg[512], err[512];
  CHECK(rt_dev_cuda_count(msg, sizeof msg) == 0, "count with cuInit failing");
  MSG(msg, "GPU driver found (", "but cuInit failed: CUDA_ERROR_NO_DEVICE", "CUDA_VISIBLE_DEVICES");
  CHECK(rt_dev_cuda_open(0, err, sizeof err) == NULL, "open with cuInit failing");
  MSG(err, "cuInit failed: CUDA_ERROR_NO_DEVICE");
  printf("cuInit failing: %s\n", err);
}

/* A driver older than CUDA 13 (the fake claims 12.4): refused when the
 * driver is loaded, with the versions and what to do, before any PTX or
 * GEMM could fail obscurely. */
static void test_old_driver(const char *cuda, const char *lt) {
  int sm[1] = {90};
  setenv("FAKE_CUDA_DRIVER_VERSION", "12040", 1);
  use_fakes(cuda, lt, 1, sm, 0);
  char msg[512], err[512];
  CHECK(rt_dev_cuda_count(msg, sizeof msg) == 0, "count with a CUDA 12.4 driver");
  MSG(msg, "supports CUDA 12.4; Tessera's GPU path needs CUDA 13.0 or newer (NVIDIA driver 580 or newer");
  CHECK(rt_dev_cuda_open(0, err, sizeof err) == NULL, "open with a CUDA 12.4 driver");
  MSG(err, "supports CUDA 12.4; Tessera's GPU path needs CUDA 13.0", "--cpu");
  printf("old driver: %s\n", err);
}

static void test_nolt(const char *cuda) {
  int sm[1] = {80};
  use_fakes(cuda, "/nonexistent/libcublasLt.so.13", 1, sm, 0);
  RtDev *d = open_dev(0);
  float x = 1;
  RtGemm g = {.dtype = IR_F32, .m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1, .alpha = 1, .a = &x, .b = &x,
              .c = &x};
  char err[1024];
  CHECK(d->ops->gemm(d, &g, RT_STREAM_COMPUTE, err, sizeof err) == -1, "a GEMM without cuBLASLt");
  MSG(err, "GEMMs on Fake GPU 0 (sm_80", "need cuBLASLt: cannot load cuBLASLt (/nonexistent/libcublasLt.so.13)",
      "TS_CUBLASLT_LIB");
  printf("no cuBLASLt: %s\n", err);
  void *p = dalloc(d, 64);   /* the rest of the device works */
  d->ops->free(d, p);
  d->ops->close(d);
  check_clean("after the no-cuBLASLt test");
}

/* ---- gemm ---- */

static double gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static float bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  u &= 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

typedef struct {
  int elem;            /* RT_LT_ELEM_* of A and B (and of C unless cf32) */
  int cf32;            /* C, D and the bias f32 (16-bit A and B: a weight gradient into its main grad) */
  int ta, tb;
  int64_t m, n, k, batch;
  int shared_a, shared_b;   /* stride 0 */
  int pad;             /* extra elements per row of A, B, C */
  double alpha, beta;
  int epilogue;
  int offset;          /* elements A, B, C start after their allocation's start (alignment) */
} Case;

static size_t esize(int elem) { return elem == RT_LT_ELEM_F64 ? 8 : elem == RT_LT_ELEM_F32 ? 4 : 2; }

static double get(const void *p, int elem, size_t i) {
  if (elem == RT_LT_ELEM_F64) return ((const double *)p)[i];
  if (elem == RT_LT_ELEM_F32) return ((const float *)p)[i];
  if (elem == RT_LT_ELEM_F16) return ts_f16_to_f32(((const uint16_t *)p)[i]);
  uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void put(void *p, int elem, size_t i, double v) {
  if (elem == RT_LT_ELEM_F64) ((double *)p)[i] = v;
  else if (elem == RT_LT_ELEM_F32) ((float *)p)[i] = (float)v;
  else if (elem == RT_LT_ELEM_F16) ((uint16_t *)p)[i] = ts_f32_to_f16((float)v);
  else {
    float f = bf16_round((float)v);
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
  }
}

/* When set, the GEMM must fail with this in its message (run_case then
 * returns 0). */
static const char *expect_err;

/* Runs case c on d (in a graph when graph is set) and compares with a
 * row-major loop; returns the worst relative error. */
static IrDtype elem_dtype(int e) {
  return e == RT_LT_ELEM_F64 ? IR_F64 : e == RT_LT_ELEM_F32 ? IR_F32 : e == RT_LT_ELEM_BF16 ? IR_BF16 : IR_F16;
}

static double run_case(RtDev *d, const Case *c, int graph) {
  size_t es = esize(c->elem);
  int ec = c->cf32 ? RT_LT_ELEM_F32 : c->elem;   /* C, D, bias */
  size_t esc = esize(ec);
  int64_t ar = c->ta ? c->k : c->m, ac = c->ta ? c->m : c->k;   /* A as stored, row-major */
  int64_t br = c->tb ? c->n : c->k, bc = c->tb ? c->k : c->n;
  int64_t lda = ac + c->pad, ldb = bc + c->pad, ldc = c->n + c->pad;
  int64_t sa = c->shared_a ? 0 : ar * lda, sb = c->shared_b ? 0 : br * ldb, sc = c->m * ldc;
  int64_t nb = c->batch;
  size_t na = (size_t)((c->shared_a ? 1 : nb) * ar * lda), nbb = (size_t)((c->shared_b ? 1 : nb) * br * ldb);
  size_t nc = (size_t)(nb * sc), off = (size_t)c->offset;
  unsigned char *A = calloc(na + off, es), *B = calloc(nbb + off, es), *C = calloc(nc + off, esc),
                *bias = calloc((size_t)c->n, esc), *R = calloc(nc + off, esc);
  for (size_t i = 0; i < na; i++) put(A + off * es, c->elem, i, urand());
  for (size_t i = 0; i < nbb; i++) put(B + off * es, c->elem, i, urand());
  for (size_t i = 0; i < nc; i++) put(C + off * esc, ec, i, c->beta != 0 ? urand() : NAN);   /* beta 0: unread */
  for (int64_t j = 0; j < c->n; j++) put(bias, ec, (size_t)j, urand());
  /* the reference: row-major, from the values as stored */
  double *ref = calloc(nc, sizeof *ref);
  for (int64_t b = 0; b < nb; b++)
    for (int64_t i = 0; i < c->m; i++)
      for (int64_t j = 0; j < c->n; j++) {
        double acc = 0;
        for (int64_t p = 0; p < c->k; p++) {
          size_t ia = (size_t)(b * sa + (c->ta ? p * lda + i : i * lda + p));
          size_t ib = (size_t)(b * sb + (c->tb ? j * ldb + p : p * ldb + j));
          acc += get(A + off * es, c->elem, ia) * get(B + off * es, c->elem, ib);
        }
        size_t ic = (size_t)(b * sc + i * ldc + j);
        double v = c->alpha * acc;
        if (c->beta != 0) v += c->beta * get(C + off * esc, ec, ic);
        if (c->epilogue != RT_GEMM_PLAIN) v += get(bias, ec, (size_t)j);
        if (c->epilogue == RT_GEMM_BIAS_GELU) v = gelu(v);
        ref[ic] = v;
      }
  unsigned char *dA = dalloc(d, (na + off) * es), *dB = dalloc(d, (nbb + off) * es), *dC = dalloc(d, (nc + off) * esc),
                *dbias = dalloc(d, (size_t)c->n * esc);
  OK(d->ops->h2d(d, dA, A, (na + off) * es, RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, dB, B, (nbb + off) * es, RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, dC, C, (nc + off) * esc, RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, dbias, bias, (size_t)c->n * esc, RT_STREAM_COMPUTE, E));
  RtGemm g = {.dtype = elem_dtype(ec), .ab_dtype = elem_dtype(c->elem), .ta = c->ta, .tb = c->tb, .m = c->m, .n = c->n,
              .k = c->k, .lda = lda, .ldb = ldb, .ldc = ldc, .batch = nb, .stride_a = sa, .stride_b = sb,
              .stride_c = sc, .alpha = c->alpha, .beta = c->beta, .a = dA + off * es, .b = dB + off * es,
              .c = dC + off * esc, .bias = c->epilogue != RT_GEMM_PLAIN ? dbias : NULL, .epilogue = c->epilogue};
  RtDevGraph *gr = NULL;
  if (graph) OK(d->ops->graph_begin(d, RT_STREAM_COMPUTE, E));
  if (expect_err) {
    char err[1024] = "";
    CHECK(d->ops->gemm(d, &g, RT_STREAM_COMPUTE, err, sizeof err) == -1 && strstr(err, expect_err),
          "want a failure with '%s': %s", expect_err, err);
    MSG(err, "");
  } else {
    OK(d->ops->gemm(d, &g, RT_STREAM_COMPUTE, E));
  }
  if (graph) {
    OK(d->ops->graph_end(d, RT_STREAM_COMPUTE, &gr, E));
    OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
    unsigned char *before = calloc(nc + off, esc);
    OK(d->ops->d2h(d, before, dC, (nc + off) * esc, RT_STREAM_COMPUTE, E));
    OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
    CHECK(!memcmp(before, C, (nc + off) * esc), "the captured GEMM ran at capture");
    free(before);
    if (gr) OK(d->ops->graph_launch(d, gr, RT_STREAM_COMPUTE, E));
  }
  OK(d->ops->d2h(d, R, dC, (nc + off) * esc, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  double worst = 0;
  for (int64_t b = 0; b < nb && !expect_err; b++)
    for (int64_t i = 0; i < c->m; i++)
      for (int64_t j = 0; j < ldc; j++) {
        size_t ic = (size_t)(b * sc + i * ldc + j);
        double got = get(R + off * esc, ec, ic);
        if (j >= c->n) {   /* padding: untouched */
          if (memcmp(R + (off + ic) * esc, C + (off + ic) * esc, esc)) worst = INFINITY;
          continue;
        }
        double e = fabs(got - ref[ic]) / fmax(fabs(ref[ic]), 1);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
  if (gr) d->ops->graph_free(d, gr);
  d->ops->free(d, dA);
  d->ops->free(d, dB);
  d->ops->free(d, dC);
  d->ops->free(d, dbias);
  free(A), free(B), free(C), free(bias), free(R), free(ref);
  return worst;
}

static const char *case_str(const Case *c, char *buf, size_t n) {
  static const char *en[] = {"f32", "f64", "bf16", "f16"};
  snprintf(buf, n, "%s%s %s%s m=%lld n=%lld k=%lld batch %lld%s%s pad %d alpha %g beta %g%s offset %d", en[c->elem],
           c->cf32 ? "->f32" : "",
           c->ta ? "A^T " : "", c->tb ? "B^T" : "", (long long)c->m, (long long)c->n, (long long)c->k,
           (long long)c->batch, c->shared_a ? " shared A" : "", c->shared_b ? " shared B" : "", c->pad, c->alpha,
           c->beta, c->epilogue == RT_GEMM_BIAS ? " +bias" : c->epilogue == RT_GEMM_BIAS_GELU ? " +bias gelu" : "",
           c->offset);
  return buf;
}


/* fp8 GEMMs (--fp8; dev_cublaslt.c's rt_cublaslt_gemm8) on the fake
 * cuBLASLt, which keeps cuBLASLt's fp8 rules: the three type pairs, D bf16
 * or f32, the TN form (ta=0 tb=1 in RtGemm's row-major terms), the
 * operands' scale_inv as device pointers multiplying the product, sm_89+.
 * Each legal case against a double loop over the decoded codes; the fake's
 * fp8 counter; the refusals, by the device layer and (asked directly) by
 * the fake: a non-TN call, e5m2 x e5m2, an sm_80 device. */
static long (*fp8_matmuls)(int, int);
static double gemm8_case(RtDev *d, IrDtype a8, IrDtype b8, IrDtype dt, int64_t m, int64_t n, int64_t k, float sa,
                         float sb) {
  uint8_t *A = malloc((size_t)(m * k)), *B = malloc((size_t)(n * k));   /* A [m, k], B [n, k]: TN */
  for (int64_t i = 0; i < m * k; i++) A[i] = a8 == IR_F8E4M3 ? ts_f32_to_f8e4m3(8 * (float)urand()) : ts_f32_to_f8e5m2(8 * (float)urand());
  for (int64_t i = 0; i < n * k; i++) B[i] = b8 == IR_F8E4M3 ? ts_f32_to_f8e4m3(8 * (float)urand()) : ts_f32_to_f8e5m2(8 * (float)urand());
  size_t es = dt == IR_F32 ? 4 : 2;
  unsigned char *dA = dalloc(d, (size_t)(m * k)), *dB = dalloc(d, (size_t)(n * k)), *dC = dalloc(d, (size_t)(m * n) * es);
  float *ds = dalloc(d, 8), sc[2] = {sa, sb};
  unsigned char *R = malloc((size_t)(m * n) * es);
  OK(d->ops->h2d(d, dA, A, (size_t)(m * k), RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, dB, B, (size_t)(n * k), RT_STREAM_COMPUTE, E));
  OK(d->ops->h2d(d, ds, sc, 8, RT_STREAM_COMPUTE, E));
  RtGemm g = {.dtype = dt, .ab_dtype = a8, .b8_dtype = b8, .ta = 0, .tb = 1, .m = m, .n = n, .k = k, .lda = k,
              .ldb = k, .ldc = n, .batch = 1, .alpha = 1, .a = dA, .b = dB, .c = dC, .scale_a = ds, .scale_b = ds + 1};
  OK(d->ops->gemm(d, &g, RT_STREAM_COMPUTE, E));
  OK(d->ops->d2h(d, R, dC, (size_t)(m * n) * es, RT_STREAM_COMPUTE, E));
  OK(d->ops->sync(d, RT_STREAM_COMPUTE, E));
  double worst = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = 0;
      for (int64_t p = 0; p < k; p++)
        acc += (a8 == IR_F8E4M3 ? ts_f8e4m3_to_f32(A[i * k + p]) : ts_f8e5m2_to_f32(A[i * k + p])) *
               (double)(b8 == IR_F8E4M3 ? ts_f8e4m3_to_f32(B[j * k + p]) : ts_f8e5m2_to_f32(B[j * k + p]));
      double want = (double)sa * sb * acc, got = get(R, dt == IR_F32 ? RT_LT_ELEM_F32 : RT_LT_ELEM_BF16, (size_t)(i * n + j));
      double e = fabs(got - want) / fmax(fabs(want), 1);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
  d->ops->free(d, dA), d->ops->free(d, dB), d->ops->free(d, dC), d->ops->free(d, ds);
  free(A), free(B), free(R);
  return worst;
}

static void test_gemm8(const char *cuda, const char *lt) {
  int sm[2] = {90, 80};
  use_fakes(cuda, lt, 2, sm, 0);
  void *h = dlopen(lt, RTLD_NOW | RTLD_LOCAL);
  CHECK(h, "cannot load the fake cuBLASLt %s", lt);
  if (!h) return;
  *(void **)&fp8_matmuls = sym(h, "fake_cublaslt_fp8_matmuls");
  RtDev *d = open_dev(0);
  static const IrDtype pairs[3][2] = {{IR_F8E4M3, IR_F8E4M3}, {IR_F8E4M3, IR_F8E5M2}, {IR_F8E5M2, IR_F8E4M3}};
  static const int64_t shapes[][3] = {{7, 5, 3}, {16, 32, 48}, {1, 9, 4}};
  double w[2] = {0, 0};
  int ncases = 0;
  for (int p = 0; p < 3; p++)
    for (int f = 0; f < 2; f++)
      for (int s = 0; s < 3; s++) {
        IrDtype dt = f ? IR_F32 : IR_BF16;
        double e = gemm8_case(d, pairs[p][0], pairs[p][1], dt, shapes[s][0], shapes[s][1], shapes[s][2],
                              s == 1 ? 0.03125f : 1.0f, s == 2 ? 3.0f : 0.5f);
        CHECK(e <= (f ? 1e-5 : 8e-3), "fp8 %s x %s -> %s m=%lld: error %.3g", ir_dtype_name(pairs[p][0]),
              ir_dtype_name(pairs[p][1]), ir_dtype_name(dt), (long long)shapes[s][0], e);
        w[f] = fmax(w[f], e);
        ncases++;
      }
  /* cuBLASLt's A is our B: our (e4m3, e5m2) is its (e5m2, e4m3) */
  long all = fp8_matmuls(-1, -1), e45 = fp8_matmuls(28, 29), e54 = fp8_matmuls(29, 28);
  printf("%d fp8 GEMM cases (e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3; D bf16 or f32): worst relative error %.2e (bf16 D), "
         "%.2e (f32 D); the fake counted %ld fp8 GEMMs (%ld e4m3 x e5m2, %ld e5m2 x e4m3 in its terms)\n", ncases, w[0],
         w[1], all, e45, e54);
  CHECK(all == ncases && e45 == 6 && e54 == 6, "fp8 GEMMs counted %ld (%ld, %ld), want %d (6, 6)", all, e45, e54, ncases);
  /* refusals by the device layer, in its terms */
  char err[512];
  unsigned char *dm = dalloc(d, 256);
  RtGemm g = {.dtype = IR_BF16, .ab_dtype = IR_F8E4M3, .m = 2, .n = 2, .k = 16, .lda = 16, .ldb = 2, .ldc = 2,
              .alpha = 1, .a = dm, .b = dm, .c = dm, .scale_a = dm, .scale_b = dm};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "a non-TN fp8 GEMM accepted");
  MSG(err, "ta=0 tb=0", "only the TN form");
  g.tb = 1, g.ldb = 16, g.ab_dtype = IR_F8E5M2;
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "e5m2 x e5m2 accepted");
  MSG(err, "f8e5m2 x f8e5m2", "not e5m2 x e5m2");
  /* ... and by the fake cuBLASLt when asked directly, as cuBLASLt would */
  g.ab_dtype = IR_F8E4M3, g.ta = 1, g.tb = 0, g.lda = 2, g.ldb = 2;
  CHECK(rt_cublaslt_gemm(d, &g, (RtLtElem)RT_LT_ELEM_E4M3, RT_LT_ELEM_BF16, 0, err, sizeof err) == -1,
        "the fake cuBLASLt took a non-TN fp8 GEMM");
  MSG(err, "CUBLAS_STATUS_NOT_SUPPORTED");
  g.ta = 0, g.tb = 1, g.lda = 16, g.ldb = 16, g.ab_dtype = IR_F8E5M2, g.b8_dtype = IR_F8E5M2;
  CHECK(rt_cublaslt_gemm(d, &g, (RtLtElem)RT_LT_ELEM_E5M2, RT_LT_ELEM_BF16, 0, err, sizeof err) == -1,
        "the fake cuBLASLt took e5m2 x e5m2");
  MSG(err, "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(fp8_matmuls(-1, -1) == all, "a refused fp8 GEMM was counted");
  d->ops->free(d, dm);
  d->ops->close(d);
  /* an sm_80 device: refused naming the arch (the layer), ARCH_MISMATCH (the fake) */
  d = open_dev(1);
  dm = dalloc(d, 256);
  g = (RtGemm){.dtype = IR_BF16, .ab_dtype = IR_F8E4M3, .tb = 1, .m = 2, .n = 2, .k = 16, .lda = 16, .ldb = 16,
               .ldc = 2, .alpha = 1, .a = dm, .b = dm, .c = dm, .scale_a = dm, .scale_b = dm};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "an fp8 GEMM on sm_80 accepted");
  MSG(err, "an fp8 GEMM on sm_80", "sm_89 or newer", "mrun --cpu");
  CHECK(rt_cublaslt_gemm(d, &g, (RtLtElem)RT_LT_ELEM_E4M3, RT_LT_ELEM_BF16, 0, err, sizeof err) == -1,
        "the fake cuBLASLt ran fp8 on sm_80");
  MSG(err, "CUBLAS_STATUS_ARCH_MISMATCH");
  d->ops->free(d, dm);
  d->ops->close(d);
}

static void test_gemm(const char *cuda, const char *lt) {
  int sm[1] = {80};
  use_fakes(cuda, lt, 1, sm, 0);
  RtDev *d = open_dev(0);
  static const int64_t shapes[][3] = {{7, 5, 3}, {1, 9, 4}, {13, 11, 17}, {6, 1, 1}};
  int ncases = 0, refused = 0;
  double worst32 = 0, worst64 = 0;
  char buf[256];
  const char *ne = getenv("FAKE_CUBLASLT_NO_EPILOGUE_64F");
  int no64 = ne && !strcmp(ne, "1");
  for (int elem = RT_LT_ELEM_F32; elem <= RT_LT_ELEM_F64; elem++)
    for (int t = 0; t < 4; t++)
      for (int s = 0; s < 4; s++)
        for (int v = 0; v < 6; v++) {
          Case c = {.elem = elem, .ta = t & 1, .tb = t >> 1, .m = shapes[s][0], .n = shapes[s][1], .k = shapes[s][2]};
          c.batch = v < 2 ? 1 : 3;
          c.shared_a = v == 3;
          c.shared_b = v == 2 || v == 5;
          c.pad = (v + s) % 3 == 0 ? 2 : 0;
          c.alpha = v == 4 ? 0.5 : 1;
          c.beta = v % 2;
          c.epilogue = (v + t) % 3;
          c.offset = v == 5 ? 1 : 0;   /* misaligned operands: another plan */
          expect_err = no64 && elem == RT_LT_ELEM_F64 && c.epilogue == RT_GEMM_BIAS_GELU
                       ? "cublasLtMatmulAlgoGetHeuristic found no algorithm for GEMM f64" : NULL;
          refused += expect_err != NULL;
          double e = run_case(d, &c, 0), tol = elem == RT_LT_ELEM_F64 ? 1e-12 : 1e-5;
          expect_err = NULL;
          if (elem == RT_LT_ELEM_F64) worst64 = fmax(worst64, e);
          else worst32 = fmax(worst32, e);
          ncases++;
          CHECK(e <= tol, "%s: relative error %.3g > %g", case_str(&c, buf, sizeof buf), e, tol);
        }
  printf("%d GEMM cases against the row-major loop: worst relative error f32 %.2e, f64 %.2e%s\n", ncases, worst32,
         worst64, no64 ? " (f64 bias as a split plan; the f64 gelu cases refused)" : "");
  CHECK(!no64 || refused == 32, "%d f64 gelu cases refused", refused);
  /* plans: one per configuration; running the same again makes none */
  int plans = rt_cublaslt_plans(d);
  Case c = {.elem = RT_LT_ELEM_F32, .ta = 1, .m = 13, .n = 11, .k = 17, .batch = 3, .shared_b = 1, .alpha = 1,
            .beta = 1, .epilogue = RT_GEMM_BIAS};
  run_case(d, &c, 0);
  int p1 = rt_cublaslt_plans(d);
  run_case(d, &c, 0);
  CHECK(rt_cublaslt_plans(d) == p1 && p1 <= plans + 1, "plans %d -> %d -> %d", plans, p1, rt_cublaslt_plans(d));
  /* in a graph: the GEMM runs at replay, not at capture */
  Case cg = {.elem = RT_LT_ELEM_F64, .tb = 1, .m = 9, .n = 7, .k = 5, .batch = 2, .alpha = 2, .beta = 1,
             .epilogue = no64 ? RT_GEMM_BIAS : RT_GEMM_BIAS_GELU};
  double eg = run_case(d, &cg, 1);
  CHECK(eg <= 1e-12, "%s in a graph: error %.3g", case_str(&cg, buf, sizeof buf), eg);
  /* bf16 storage, f32 accumulation (ready for when the IR has bf16) */
  Case cb = {.elem = RT_LT_ELEM_BF16, .ta = 1, .tb = 1, .m = 5, .n = 6, .k = 7, .batch = 2, .alpha = 1, .beta = 1,
             .epilogue = RT_GEMM_BIAS};
  double eb = run_case(d, &cb, 0);
  CHECK(eb <= 1e-2, "%s: error %.3g", case_str(&cb, buf, sizeof buf), eb);
  printf("in a graph (f64, %s): %.2e; bf16 storage: %.2e; %d plans cached\n", no64 ? "bias" : "gelu bias", eg, eb,
         rt_cublaslt_plans(d));
  /* 16-bit A and B, f32 accumulation, D in their type or f32 (the pairs
   * of cuBLASLt's CUBLAS_COMPUTE_32F table), the bias in D's type */
  double w16 = 0, w32 = 0;
  int n16 = 0;
  for (int e = RT_LT_ELEM_BF16; e <= RT_LT_ELEM_F16; e++)
    for (int cf = 0; cf < 2; cf++)
      for (int t = 0; t < 4; t++)
        for (int v = 0; v < 3; v++) {
          Case c16 = {.elem = e, .cf32 = cf, .ta = t & 1, .tb = t >> 1, .m = shapes[t][0], .n = shapes[t][1],
                      .k = shapes[t][2], .batch = v == 2 ? 2 : 1, .shared_b = v == 2, .alpha = 1, .beta = v == 1,
                      .epilogue = (t + v) % 3, .pad = v == 1 ? 2 : 0};
          double e16 = run_case(d, &c16, 0), tol = cf ? 1e-5 : e == RT_LT_ELEM_BF16 ? 1e-2 : 2e-3;
          CHECK(e16 <= tol, "%s: relative error %.3g > %g", case_str(&c16, buf, sizeof buf), e16, tol);
          if (cf) w32 = fmax(w32, e16);
          else w16 = fmax(w16, e16);
          n16++;
        }
  printf("%d 16-bit GEMM cases (bf16 and f16 A, B; D 16-bit or f32): worst relative error %.2e (16-bit D), "
         "%.2e (f32 D)\n", n16, w16, w32);
  /* refusals before cuBLASLt */
  char err[512];
  RtGemm g = {.dtype = IR_I32, .m = 1, .n = 1, .k = 1, .lda = 1, .ldb = 1, .ldc = 1};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "an i32 GEMM");
  MSG(err, "GEMM of i32 operands into i32", "bf16 -> bf16 or f32");
  float one = 1;
  g = (RtGemm){.dtype = IR_F32, .m = 2, .n = 3, .k = 4, .lda = 3, .ldb = 3, .ldc = 3, .a = &one, .b = &one, .c = &one};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "lda 3 < k 4 accepted");
  MSG(err, "lda below A's row length");
  /* pairs cuBLASLt does not take: refused by the device layer, naming the pairs it does */
  g = (RtGemm){.dtype = IR_F64, .ab_dtype = IR_BF16, .m = 2, .n = 3, .k = 4, .lda = 4, .ldb = 3, .ldc = 3, .a = &one,
               .b = &one, .c = &one};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "a bf16 GEMM into f64 accepted");
  MSG(err, "GEMM of bf16 operands into f64", "bf16 -> bf16 or f32");
  g = (RtGemm){.dtype = IR_BF16, .ab_dtype = IR_BF16, .bias_dtype = IR_F32, .m = 2, .n = 3, .k = 4, .lda = 4, .ldb = 3,
               .ldc = 3, .a = &one, .b = &one, .c = &one, .bias = &one, .epilogue = RT_GEMM_BIAS};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "an f32 bias for a bf16 D accepted");
  MSG(err, "a f32 bias for a GEMM into bf16", "D's type (bf16)");
  /* ... and by the fake cuBLASLt, as by the real one, when asked directly:
   * f32 A and B into a bf16 D, bf16 A and B into f64 */
  {
    unsigned char *dm = dalloc(d, 256);
    RtGemm q = {.dtype = IR_F32, .m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2, .alpha = 1, .a = dm, .b = dm,
                .c = dm};
    static const int pairs[2][2] = {{RT_LT_ELEM_F32, RT_LT_ELEM_BF16}, {RT_LT_ELEM_BF16, RT_LT_ELEM_F64}};
    for (int i = 0; i < 2; i++) {
      CHECK(rt_cublaslt_gemm(d, &q, (RtLtElem)pairs[i][0], (RtLtElem)pairs[i][1], 0, err, sizeof err) == -1,
            "the fake cuBLASLt took the pair %d", i);
      MSG(err, "CUBLAS_STATUS_NOT_SUPPORTED");
    }
    printf("the fake cuBLASLt refusing f32 -> bf16 and bf16 -> f64 (the last: %s)\n", err);
    d->ops->free(d, dm);
  }
  /* cuBLASLt's own refusal comes back named: host memory is not device memory */
  float h[64] = {0};
  g = (RtGemm){.dtype = IR_F32, .m = 2, .n = 2, .k = 2, .lda = 2, .ldb = 2, .ldc = 2, .alpha = 1, .a = h, .b = h,
               .c = h};
  CHECK(d->ops->gemm(d, &g, 0, err, sizeof err) == -1, "a GEMM on host memory");
  MSG(err, "cublasLtMatmul failed: CUBLAS_STATUS_INVALID_VALUE", "GEMM f32 m=2 n=2 k=2", "hint:");
  printf("cuBLASLt refusing: %s\n", err);
  d->ops->close(d);
  check_clean("after the GEMM tests");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: test_cuda_dev MODE FAKE_LIBCUDA FAKE_LIBCUBLASLT\n");
    return 2;
  }
  const char *mode = argv[1], *cuda = argc > 2 ? argv[2] : "", *lt = argc > 3 ? argv[3] : "";
  if (!strcmp(mode, "nodriver")) test_nodriver();
  else if (argc < 4) {
    fprintf(stderr, "test_cuda_dev %s: the fake libraries' paths are missing\n", mode);
    return 2;
  } else if (!strcmp(mode, "device")) test_device(cuda, lt);
  else if (!strcmp(mode, "module")) test_module(cuda, lt);
  else if (!strcmp(mode, "launch")) test_launch(cuda, lt);
  else if (!strcmp(mode, "graph")) test_graph(cuda, lt);
  else if (!strcmp(mode, "errors")) test_errors(cuda, lt);
  else if (!strcmp(mode, "init_fail")) test_init_fail(cuda, lt);
  else if (!strcmp(mode, "old_driver")) test_old_driver(cuda, lt);
  else if (!strcmp(mode, "nolt")) test_nolt(cuda);
  else if (!strcmp(mode, "gemm")) test_gemm(cuda, lt);
  else if (!strcmp(mode, "gemm8")) test_gemm8(cuda, lt);
  else {
    fprintf(stderr, "test_cuda_dev: unknown mode %s\n", mode);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "test_cuda_dev %s", mode);
  return check_exit(name);
}
