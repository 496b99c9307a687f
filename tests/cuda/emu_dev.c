/* emu_dev.c - a device for the tests: the device layer (runtime/device/device.h)
 * over the CUDA emulator (emu_host.h).  Device memory is host memory;
 * kernels are the module's CUDA C compiled by the host C++ compiler
 * against the emulation header; GEMMs run on the host BLAS, as the CPU
 * backend's (bias epilogue: C pre-filled with the bias, then beta = 1);
 * streams execute in order at once; a captured graph is the list of the
 * launches, GEMMs and copies issued during the capture, replayed with the
 * arguments they had then (as CUDA does).  It proves the executor's
 * device path and the generated kernels, not the driver. */
#include "emu_dev.h"
#include "emu_host.h"
#include "runtime/cpu/kernels.h"
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { OP_LAUNCH, OP_GEMM, OP_COPY, OP_ZERO } OpKind;
typedef struct {
  OpKind kind;
  RtDevModule *mod;
  CgCudaLaunch l;
  CgCudaArgs a;
  RtGemm g;
  void *dst;
  const void *src;
  size_t bytes;
} Op;

struct RtDevGraph {
  VEC(Op) ops;
};

typedef struct {
  char name[sizeof(((CgCudaLaunch *)0)->name)];
  long long n;
} EmuNamed;

typedef struct {
  RtDevGraph *capture;     /* recording instead of running (one stream captures at a time) */
  int capture_stream;
  long long launches, gemms, replays;
  VEC(EmuNamed) named;     /* launches per kernel name since ts_emu_dev_launches_reset */
} Emu;

struct RtDevModule {
  TsEmu *e;
};

static Emu *emu(RtDev *d) { return d->impl; }

static int e_alloc(RtDev *d, size_t bytes, void **ptr, char *err, size_t n) {
  void *q = NULL;
  if (posix_memalign(&q, 256, bytes ? (bytes + 255) / 256 * 256 : 256) != 0)
    return ts_errf(err, n, "out of memory (%zu bytes)", bytes);
  memset(q, 0xff, bytes);   /* device memory starts as garbage (NaN): kernels must not rely on zeros */
  *ptr = q;
  return 0;
}
static void e_free(RtDev *d, void *p) { free(p); }

static int record(RtDev *d, int stream, const Op *op) {
  Emu *E = emu(d);
  if (!E->capture || stream != E->capture_stream) return 0;
  VEC_PUSH(E->capture->ops, *op);
  return 1;
}

static int run_op(RtDev *d, const Op *op, char *err, size_t n);

static int issue(RtDev *d, int stream, const Op *op, char *err, size_t n) {
  if (record(d, stream, op)) return 0;
  return run_op(d, op, err, n);
}

static int e_h2d(RtDev *d, void *dst, const void *src, size_t bytes, int stream, char *err, size_t n) {
  Op op = {.kind = OP_COPY, .dst = dst, .src = src, .bytes = bytes};
  return issue(d, stream, &op, err, n);
}
static int e_memset0(RtDev *d, void *dst, size_t bytes, int stream, char *err, size_t n) {
  Op op = {.kind = OP_ZERO, .dst = dst, .bytes = bytes};
  return issue(d, stream, &op, err, n);
}

static int e_module_load(RtDev *d, const RtDevImage *img, RtDevModule **mod, char *err, size_t n) {
  if (!img->source) return ts_errf(err, n, "the emulator needs the module's source");
  char why[2048];
  TsEmu *e = ts_emu_load(img->source, why, sizeof why);
  if (!e) return ts_errf(err, n, "%s", why);
  *mod = ts_xcalloc(1, sizeof **mod);
  (*mod)->e = e;
  return 0;
}
static void e_module_free(RtDev *d, RtDevModule *mod) {
  if (!mod) return;
  ts_emu_free(mod->e);
  free(mod);
}

static int e_launch(RtDev *d, RtDevModule *mod, const CgCudaLaunch *l, const CgCudaArgs *a, int stream, char *err,
                    size_t n) {
  Op op = {.kind = OP_LAUNCH, .mod = mod, .l = *l, .a = *a};
  return issue(d, stream, &op, err, n);
}

static int e_gemm(RtDev *d, const RtGemm *g, int stream, char *err, size_t n) {
  IrDtype ab = g->ab_dtype ? g->ab_dtype : g->dtype;
  int ok = (g->dtype == IR_F32 || g->dtype == IR_F64) && ab == g->dtype;
  ok |= ir_dtype_is_16(ab) && (g->dtype == ab || g->dtype == IR_F32);
  /* fp8 (matmul8): cuBLASLt's fp8 rules as the device layer states them
   * (dev_cublaslt.c's rt_cublaslt_gemm8), so the executor is held to them */
  IrDtype b8 = g->b8_dtype ? g->b8_dtype : ab;
  if (ir_dtype_is_8(ab) && (!ir_dtype_is_8(b8) || (ab == IR_F8E5M2 && b8 == IR_F8E5M2) || g->ta || !g->tb ||
                            !g->scale_a || !g->scale_b || g->epilogue != RT_GEMM_PLAIN))
    return ts_errf(err, n, "the emulated fp8 GEMM takes e4m3 / e5m2 (not both e5m2) in the TN form (ta=0 tb=1) with "
                   "both scale pointers, not %s x %s ta=%d tb=%d", ir_dtype_name(ab), ir_dtype_name(b8), g->ta, g->tb);
  ok |= ir_dtype_is_8(ab) && (g->dtype == IR_BF16 || g->dtype == IR_F32);
  if (!ok || (g->bias_dtype && g->bias_dtype != g->dtype))
    return ts_errf(err, n, "the emulated GEMM takes f32 and f64, and bf16 / f16 operands into their dtype or f32 "
                   "(the bias in C's dtype), not %s into %s", ir_dtype_name(ab), ir_dtype_name(g->dtype));
  Op op = {.kind = OP_GEMM, .g = *g};
  return issue(d, stream, &op, err, n);
}

static void host_gemm32(const RtGemm *g);

/* Elements a row-major operand spans: its batch items at their stride. */
static int64_t span(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (batch > 1 ? (batch - 1) * stride : 0) + rows * ld;
}

/* C = alpha op(A) op(B) + beta C (+ bias per column, gelu), row-major.
 * bf16 / f16 A and B: converted to f32 (exact), the f32 GEMM, C rounded
 * once to its dtype (as the CPU's matmul, ops_ref.c); fp8 A and B (TN) the
 * same, alpha times the scales. */
static void host_gemm(const RtGemm *g) {
  IrDtype ab = g->ab_dtype ? g->ab_dtype : g->dtype;
  if (!ir_dtype_is_16(ab) && !ir_dtype_is_8(ab)) { host_gemm32(g); return; }
  IrDtype bd = ir_dtype_is_8(ab) && g->b8_dtype ? g->b8_dtype : ab;
  int64_t batch = g->batch > 0 ? g->batch : 1;
  int64_t na = span(batch, g->stride_a, g->ta ? g->k : g->m, g->lda), nb = span(batch, g->stride_b, g->tb ? g->n : g->k, g->ldb);
  int64_t nc = span(batch, g->stride_c, g->m, g->ldc);
  float *a = ts_xmalloc((size_t)na * 4), *b = ts_xmalloc((size_t)nb * 4), *c = g->c, *bias = NULL;
  rt_convert(a, IR_F32, g->a, ab, na);
  rt_convert(b, IR_F32, g->b, bd, nb);
  if (g->dtype != IR_F32) {
    c = ts_xmalloc((size_t)nc * 4);
    rt_convert(c, IR_F32, g->c, g->dtype, nc);
    if (g->bias) {
      bias = ts_xmalloc((size_t)g->n * 4);
      rt_convert(bias, IR_F32, g->bias, g->dtype, g->n);
    }
  }
  RtGemm g32 = *g;
  g32.dtype = IR_F32;
  g32.ab_dtype = IR_VOID;
  if (ir_dtype_is_8(ab))   /* the scales' product in f32, as the CPU's matmul8 (ops_ref.c) */
    g32.alpha = g->alpha * (double)(*(const float *)g->scale_a * *(const float *)g->scale_b);
  g32.a = a;
  g32.b = b;
  g32.c = c;
  if (bias) g32.bias = bias;
  host_gemm32(&g32);
  if (c != g->c) rt_convert(g->c, g->dtype, c, IR_F32, nc);
  free(a);
  free(b);
  if (c != g->c) free(c);
  free(bias);
}

static void host_gemm32(const RtGemm *g) {
  int f64 = g->dtype == IR_F64;
  size_t es = f64 ? 8 : 4;
  int64_t batch = g->batch > 0 ? g->batch : 1;
  for (int64_t i = 0; i < batch; i++) {
    char *C = (char *)g->c + (size_t)(i * g->stride_c) * es;
    const char *A = (const char *)g->a + (size_t)(i * g->stride_a) * es;
    const char *B = (const char *)g->b + (size_t)(i * g->stride_b) * es;
    double beta = g->beta;
    if (g->epilogue != RT_GEMM_PLAIN && g->bias) {   /* as the CPU epilogue: C = bias, then += A.B */
      for (int64_t r = 0; r < g->m; r++)
        for (int64_t c = 0; c < g->n; c++) {
          if (f64) ((double *)C)[r * g->ldc + c] = ((const double *)g->bias)[c];
          else ((float *)C)[r * g->ldc + c] = ((const float *)g->bias)[c];
        }
      beta = 1;
    }
    enum CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
    if (f64)
      cblas_dgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, g->alpha, (const double *)A, (int)g->lda,
                  (const double *)B, (int)g->ldb, beta, (double *)C, (int)g->ldc);
    else
      cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, (float)g->alpha, (const float *)A,
                  (int)g->lda, (const float *)B, (int)g->ldb, (float)beta, (float *)C, (int)g->ldc);
    if (g->epilogue == RT_GEMM_BIAS_GELU)
      for (int64_t r = 0; r < g->m; r++)
        for (int64_t c = 0; c < g->n; c++) {
          size_t at = (size_t)(r * g->ldc + c);
          double x = f64 ? ((double *)C)[at] : ((float *)C)[at];
          double y = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
          if (f64) ((double *)C)[at] = y;
          else ((float *)C)[at] = (float)y;
        }
  }
}

static void count_named(Emu *E, const char *name) {
  for (int k = 0; k < E->named.n; k++)
    if (strcmp(E->named.a[k].name, name) == 0) { E->named.a[k].n++; return; }
  EmuNamed x = {.n = 1};
  snprintf(x.name, sizeof x.name, "%s", name);
  VEC_PUSH(E->named, x);
}

static int run_op(RtDev *d, const Op *op, char *err, size_t n) {
  Emu *E = emu(d);
  switch (op->kind) {
  case OP_COPY: memmove(op->dst, op->src, op->bytes); return 0;
  case OP_ZERO: memset(op->dst, 0, op->bytes); return 0;
  case OP_GEMM: host_gemm(&op->g); E->gemms++; return 0;
  case OP_LAUNCH:
    E->launches++;
    count_named(E, op->l.name);
    return ts_emu_launch_kernel(op->mod->e, &op->l, &op->a, err, n);
  }
  return ts_errf(err, n, "bad op");
}

static int e_sync(RtDev *d, int stream, char *err, size_t n) { return 0; }
static int e_event_record(RtDev *d, int event, int stream, char *err, size_t n) { return 0; }
static int e_stream_wait(RtDev *d, int stream, int event, char *err, size_t n) { return 0; }

static int e_graph_begin(RtDev *d, int stream, char *err, size_t n) {
  Emu *E = emu(d);
  if (E->capture) return ts_errf(err, n, "a capture is already under way");
  E->capture = ts_xcalloc(1, sizeof *E->capture);
  E->capture_stream = stream;
  return 0;
}
static int e_graph_end(RtDev *d, int stream, RtDevGraph **g, char *err, size_t n) {
  Emu *E = emu(d);
  if (!E->capture || E->capture_stream != stream) return ts_errf(err, n, "no capture on stream %d", stream);
  *g = E->capture;
  E->capture = NULL;
  return 0;
}
static int e_graph_launch(RtDev *d, RtDevGraph *g, int stream, char *err, size_t n) {
  emu(d)->replays++;
  for (int i = 0; i < g->ops.n; i++)
    if (run_op(d, &g->ops.a[i], err, n) != 0) return -1;
  return 0;
}
static void e_graph_free(RtDev *d, RtDevGraph *g) {
  if (!g) return;
  free(g->ops.a);
  free(g);
}
static void *e_stream_handle(RtDev *d, int stream) { return NULL; }

static void e_close(RtDev *d) {
  if (!d) return;
  Emu *E = d->impl;
  if (E) e_graph_free(d, E->capture);
  if (E) free(E->named.a);
  free(E);
  free(d);
}

static const RtDevOps emu_ops = {
  .name = "emu", .close = e_close, .alloc = e_alloc, .free = e_free, .h2d = e_h2d, .d2h = e_h2d, .d2d = e_h2d,
  .memset0 = e_memset0, .module_load = e_module_load, .module_free = e_module_free, .launch = e_launch,
  .gemm = e_gemm, .sync = e_sync, .event_record = e_event_record, .stream_wait = e_stream_wait,
  .graph_begin = e_graph_begin, .graph_end = e_graph_end, .graph_launch = e_graph_launch,
  .graph_free = e_graph_free, .stream_handle = e_stream_handle,
};

RtDev *ts_emu_dev_open(void) {
  RtDev *d = ts_xcalloc(1, sizeof *d);
  d->ops = &emu_ops;
  d->sm = 0;
  d->host_memory = 1;
  snprintf(d->label, sizeof d->label, "the CUDA emulator (host C++, user-level threads)");
  d->impl = ts_xcalloc(1, sizeof(Emu));
  return d;
}

void ts_emu_dev_counts(RtDev *d, long long *launches, long long *gemms, long long *replays) {
  Emu *E = emu(d);
  if (launches) *launches = E->launches;
  if (gemms) *gemms = E->gemms;
  if (replays) *replays = E->replays;
}

void ts_emu_dev_launches_reset(RtDev *d) { emu(d)->named.n = 0; }

long long ts_emu_dev_launches_of(RtDev *d, const char *prefix) {
  Emu *E = emu(d);
  long long n = 0;
  for (int k = 0; k < E->named.n; k++)
    if (strncmp(E->named.a[k].name, prefix, strlen(prefix)) == 0) n += E->named.a[k].n;
  return n;
}
