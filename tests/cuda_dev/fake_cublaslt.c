/* fake_cublaslt.c - a fake cuBLASLt (libcublasLt.so.13) for the tests of
 * runtime/device/dev_cublaslt.c: the descriptor, layout, preference, heuristic
 * and matmul entry points the device layer calls, computing D with plain
 * loops in cuBLASLt's documented COLUMN-MAJOR semantics:
 *
 *   D[b] = epilogue(alpha * op(A[b]) op(B[b]) + beta * C[b] (+ bias))
 *
 * for b < batch count, X[b] = X + b * strided batch offset (elements);
 * element (i, j) of a layout is at i + j * ld; op = transpose when the
 * descriptor's TRANSA / TRANSB is CUBLAS_OP_T; C is not read when beta is
 * 0; the BIAS epilogue adds bias[i] to row i of D, GELU_BIAS then applies
 * gelu (tanh form).  This is our reading of NVIDIA's documentation, not
 * NVIDIA's behaviour: it proves that the device layer maps row-major
 * GEMMs onto these semantics, not that cuBLASLt has them.
 *
 * Checked as documented (errors as cuBLASLt's status codes): attribute
 * sizes, ld >= rows, shapes and batch counts that agree, compute / scale /
 * data types that go together (bf16 / f16 A and B only with a 32F compute
 * into a D of their type or f32; the bias read in D's type, as cuBLASLt
 * reads it when BIAS_DATA_TYPE is unset; the products accumulated in
 * float, D rounded once), an algorithm from the heuristic of the
 * same configuration, the workspace it asked for, pointers aligned as the
 * preference promised and inside device memory (the fake driver's
 * fake_cuda_ptr_ok).  The matmul runs in stream order through the fake
 * driver's cuLaunchHostFunc (so it is captured into graphs and replayed),
 * found by dlopen of TS_CUDA_DRIVER; without it, at once.
 *
 * fp8 (CUDA_R_8F_E4M3 / E5M2 A and B), as cuBLASLt documents its fp8
 * GEMMs: the pairs e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3 (not e5m2 x
 * e5m2); CUBLAS_COMPUTE_32F with scale type f32; C = D bf16 or f32; A
 * transposed and B not (the "TN" form), anything else NOT_SUPPORTED; a
 * device of sm_89 or newer (the fake driver's current one: ARCH_MISMATCH
 * below); A_SCALE_POINTER / B_SCALE_POINTER device floats multiplying the
 * product (D = alpha sa sb op(A) op(B) + beta C).  Counted apart
 * (fake_cublaslt_fp8_matmuls). */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int St;
enum { S_OK = 0, S_NOT_INITIALIZED = 1, S_ALLOC_FAILED = 3, S_INVALID_VALUE = 7, S_EXECUTION_FAILED = 13,
       S_NOT_SUPPORTED = 15 };
enum { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14, R_8F_E4M3 = 28, R_8F_E5M2 = 29 };
enum { S_ARCH_MISMATCH = 8 };
static int is_fp8(uint32_t t) { return t == R_8F_E4M3 || t == R_8F_E5M2; }
enum { C_32F = 68, C_32F_PEDANTIC = 69, C_32F_FAST_TF32 = 77, C_64F = 70 };
enum { EPI_DEFAULT = 1, EPI_BIAS = 4, EPI_GELU_BIAS = 36 };
enum { MAGIC_HANDLE = 0x4c74, MAGIC_DESC = 0x4465, MAGIC_LAYOUT = 0x4c61, MAGIC_PREF = 0x5072,
       MAGIC_ALGO = 0x416c };

typedef struct Job Job;
typedef struct {
  int magic;
  Job **kept;               /* jobs captured into graphs: live as long as the handle */
  int nkept;
} Handle;

typedef struct {
  int magic, compute, scale;
  int32_t transa, transb, pointer_mode;
  uint32_t epilogue;
  const void *bias;
  int64_t bias_stride;
  const void *scale_a, *scale_b;   /* fp8: A_SCALE_POINTER, B_SCALE_POINTER (device floats) */
} Desc;

typedef struct {
  int magic;
  uint32_t type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch, order;
  int64_t stride;
} Layout;

typedef struct {
  int magic;
  uint64_t max_ws;
  uint32_t align[4];        /* A, B, C, D */
} Pref;

typedef struct { uint64_t data[8]; } Algo;
typedef struct {
  Algo algo;
  size_t workspaceSize;
  St state;
  float wavesCount;
  int reserved[4];
} Heuristic;

struct Job {
  Desc d;
  Layout a, b, c, dl;
  double alpha, beta;
  const void *A, *B, *C;
  void *D;
  int kept;
};

/* ---- the fake driver, if loaded ---- */
static struct {
  int tried;
  int (*host_fn)(void *stream, void (*fn)(void *), void *user);
  int (*is_capturing)(void *stream, int *status);
  int (*ptr_ok)(unsigned long long p, size_t bytes);
  int (*current_sm)(void);
  void *h;
} drv;

static void driver(void) {
  if (drv.tried) return;
  drv.tried = 1;
  const char *p = getenv("TS_CUDA_DRIVER");
  drv.h = dlopen(p && *p ? p : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!drv.h) return;
  *(void **)&drv.host_fn = dlsym(drv.h, "cuLaunchHostFunc");
  *(void **)&drv.is_capturing = dlsym(drv.h, "cuStreamIsCapturing");
  *(void **)&drv.ptr_ok = dlsym(drv.h, "fake_cuda_ptr_ok");
  *(void **)&drv.current_sm = dlsym(drv.h, "fake_cuda_current_sm");
}

/* ---- status names ---- */

EXPORT const char *cublasLtGetStatusName(St s) {
  switch (s) {
  case S_OK: return "CUBLAS_STATUS_SUCCESS";
  case S_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case S_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case S_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case S_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case S_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case S_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

EXPORT const char *cublasLtGetStatusString(St s) {
  switch (s) {
  case S_OK: return "success";
  case S_INVALID_VALUE: return "an invalid numeric value was used as an argument";
  case S_NOT_SUPPORTED: return "the functionality requested is not supported";
  default: return "a cuBLAS error";
  }
}

/* ---- handle, descriptors ---- */

EXPORT St cublasLtCreate(Handle **h) {
  if (!h) return S_INVALID_VALUE;
  driver();
  *h = calloc(1, sizeof **h);
  if (!*h) return S_ALLOC_FAILED;
  (*h)->magic = MAGIC_HANDLE;
  return S_OK;
}

EXPORT St cublasLtDestroy(Handle *h) {
  if (!h || h->magic != MAGIC_HANDLE) return S_NOT_INITIALIZED;
  for (int i = 0; i < h->nkept; i++) free(h->kept[i]);
  free(h->kept);
  h->magic = 0;
  free(h);
  return S_OK;
}

EXPORT St cublasLtMatmulDescCreate(Desc **d, int compute, int scale) {
  int ok = ((compute == C_32F || compute == C_32F_PEDANTIC || compute == C_32F_FAST_TF32) && scale == R_32F) ||
           (compute == C_64F && scale == R_64F);
  if (!d || !ok) return S_INVALID_VALUE;
  *d = calloc(1, sizeof **d);
  if (!*d) return S_ALLOC_FAILED;
  **d = (Desc){.magic = MAGIC_DESC, .compute = compute, .scale = scale, .epilogue = EPI_DEFAULT};
  return S_OK;
}

EXPORT St cublasLtMatmulDescDestroy(Desc *d) {
  if (!d || d->magic != MAGIC_DESC) return S_INVALID_VALUE;
  d->magic = 0;
  free(d);
  return S_OK;
}

/* attribute -> (field, documented size); the ones the fake knows */
EXPORT St cublasLtMatmulDescSetAttribute(Desc *d, int attr, const void *buf, size_t size) {
  if (!d || d->magic != MAGIC_DESC || !buf) return S_INVALID_VALUE;
  void *field;
  size_t want;
  switch (attr) {
  case 2: field = &d->pointer_mode; want = 4; break;
  case 3: field = &d->transa; want = 4; break;
  case 4: field = &d->transb; want = 4; break;
  case 7: field = &d->epilogue; want = 4; break;
  case 8: field = &d->bias; want = sizeof(void *); break;
  case 10: field = &d->bias_stride; want = 8; break;
  case 17: field = &d->scale_a; want = sizeof(void *); break;
  case 18: field = &d->scale_b; want = sizeof(void *); break;
  default: return S_NOT_SUPPORTED;   /* a fake limitation: the device layer must not rely on it */
  }
  if (size != want) return S_INVALID_VALUE;
  memcpy(field, buf, size);
  if ((attr == 3 || attr == 4) && (*(int32_t *)field < 0 || *(int32_t *)field > 1)) return S_NOT_SUPPORTED;
  if (attr == 2 && d->pointer_mode != 0) return S_NOT_SUPPORTED;   /* host alpha / beta only */
  if (attr == 7 && d->epilogue != EPI_DEFAULT && d->epilogue != EPI_BIAS && d->epilogue != EPI_GELU_BIAS)
    return S_NOT_SUPPORTED;
  return S_OK;
}

EXPORT St cublasLtMatrixLayoutCreate(Layout **l, uint32_t type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l || (type != R_32F && type != R_64F && type != R_16F && type != R_16BF && !is_fp8(type))) return S_INVALID_VALUE;
  if (!rows || !cols || ld < (int64_t)rows) return S_INVALID_VALUE;   /* column order: ld >= rows */
  *l = calloc(1, sizeof **l);
  if (!*l) return S_ALLOC_FAILED;
  **l = (Layout){.magic = MAGIC_LAYOUT, .type = type, .rows = rows, .cols = cols, .ld = ld, .batch = 1};
  return S_OK;
}

EXPORT St cublasLtMatrixLayoutDestroy(Layout *l) {
  if (!l || l->magic != MAGIC_LAYOUT) return S_INVALID_VALUE;
  l->magic = 0;
  free(l);
  return S_OK;
}

EXPORT St cublasLtMatrixLayoutSetAttribute(Layout *l, int attr, const void *buf, size_t size) {
  if (!l || l->magic != MAGIC_LAYOUT || !buf) return S_INVALID_VALUE;
  switch (attr) {
  case 1:   /* ORDER: column (0) only */
    if (size != 4) return S_INVALID_VALUE;
    memcpy(&l->order, buf, 4);
    return l->order == 0 ? S_OK : S_NOT_SUPPORTED;
  case 5:
    if (size != 4) return S_INVALID_VALUE;
    memcpy(&l->batch, buf, 4);
    return l->batch >= 1 ? S_OK : S_INVALID_VALUE;
  case 6:
    if (size != 8) return S_INVALID_VALUE;
    memcpy(&l->stride, buf, 8);
    return l->stride >= 0 ? S_OK : S_INVALID_VALUE;
  default: return S_NOT_SUPPORTED;
  }
}

EXPORT St cublasLtMatmulPreferenceCreate(Pref **p) {
  if (!p) return S_INVALID_VALUE;
  *p = calloc(1, sizeof **p);
  if (!*p) return S_ALLOC_FAILED;
  **p = (Pref){.magic = MAGIC_PREF, .align = {256, 256, 256, 256}};
  return S_OK;
}

EXPORT St cublasLtMatmulPreferenceDestroy(Pref *p) {
  if (!p || p->magic != MAGIC_PREF) return S_INVALID_VALUE;
  p->magic = 0;
  free(p);
  return S_OK;
}

EXPORT St cublasLtMatmulPreferenceSetAttribute(Pref *p, int attr, const void *buf, size_t size) {
  if (!p || p->magic != MAGIC_PREF || !buf) return S_INVALID_VALUE;
  if (attr == 1) {
    if (size != 8) return S_INVALID_VALUE;
    memcpy(&p->max_ws, buf, 8);
    return S_OK;
  }
  if (attr >= 5 && attr <= 8) {
    if (size != 4) return S_INVALID_VALUE;
    memcpy(&p->align[attr - 5], buf, 4);
    return S_OK;
  }
  return S_NOT_SUPPORTED;
}

/* ---- what ran: the tests ask how many matmuls of each A type ---- */
static long matmuls[4];   /* R_32F, R_64F, R_16F, other (R_16BF) */
static int type_slot(uint32_t t) { return t == R_32F ? 0 : t == R_64F ? 1 : t == R_16F ? 2 : 3; }
/* fp8 matmuls by cuBLASLt's A and B type (0 E4M3, 1 E5M2), not in
 * matmuls[]: counted when they RUN (run_job), so a graph's replays count */
static long matmuls8[2][2];
/* The fp8 matmuls run so far whose A is of CUDA data type type_a and B
 * of type_b (28 CUDA_R_8F_E4M3, 29 CUDA_R_8F_E5M2; -1: any). */
EXPORT long fake_cublaslt_fp8_matmuls(int type_a, int type_b) {
  long n = 0;
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      if ((type_a < 0 || type_a == R_8F_E4M3 + a) && (type_b < 0 || type_b == R_8F_E4M3 + b)) n += matmuls8[a][b];
  return n;
}
/* The matmuls issued so far whose A and B are of CUDA data type `type`
 * (0 CUDA_R_32F, 1 CUDA_R_64F, 2 CUDA_R_16F, 14 CUDA_R_16BF) and whose D
 * is `dtype` (-1: any). */
static long matmuls_d[4][4];
EXPORT long fake_cublaslt_matmuls(int type, int dtype) {
  int a = type_slot((uint32_t)type);
  return dtype < 0 ? matmuls[a] : matmuls_d[a][type_slot((uint32_t)dtype)];
}
/* ... and of those, how many had a BIAS or GELU_BIAS epilogue (A and B of
 * `type`). */
static long matmuls_epi[4];
EXPORT long fake_cublaslt_epilogues(int type) { return matmuls_epi[type_slot((uint32_t)type)]; }

/* ---- heuristic and matmul ---- */

static size_t type_size(uint32_t t) { return t == R_64F ? 8 : t == R_32F ? 4 : is_fp8(t) ? 1 : 2; }

/* The configuration an algorithm is for (data[1] of the algo). */
static uint64_t config_hash(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dl) {
  uint64_t h = 1469598103934665603ull;
  const void *parts[5] = {d, a, b, c, dl};
  size_t sizes[5] = {sizeof *d, sizeof *a, sizeof *b, sizeof *c, sizeof *dl};
  for (int p = 0; p < 5; p++) {
    const unsigned char *q = parts[p];
    for (size_t i = 0; i < sizes[p]; i++) {
      if (p == 0 && i >= offsetof(Desc, bias) && i < offsetof(Desc, bias) + sizeof(void *)) continue;
      if (p == 0 && i >= offsetof(Desc, scale_a) && i < offsetof(Desc, scale_b) + sizeof(void *)) continue;
      h = (h ^ q[i]) * 1099511628211ull;
    }
  }
  return h;
}

/* The checks shared by the heuristic and the matmul. */
static St check(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dl) {
  if (!d || d->magic != MAGIC_DESC || !a || a->magic != MAGIC_LAYOUT || !b || b->magic != MAGIC_LAYOUT || !c ||
      c->magic != MAGIC_LAYOUT || !dl || dl->magic != MAGIC_LAYOUT)
    return S_INVALID_VALUE;
  uint64_t m = d->transa ? a->cols : a->rows, k = d->transa ? a->rows : a->cols;
  uint64_t kb = d->transb ? b->cols : b->rows, n = d->transb ? b->rows : b->cols;
  if (k != kb || c->rows != m || c->cols != n || dl->rows != m || dl->cols != n) return S_INVALID_VALUE;
  if (a->batch != dl->batch || b->batch != dl->batch || c->batch != dl->batch) return S_INVALID_VALUE;
  /* the type pairs of cuBLASLt's table that the device layer may ask for
   * (A = B, C = D): f64 with CUBLAS_COMPUTE_64F; f32 into f32 with a 32F
   * compute (TF32 included); bf16 into bf16 or f32 and f16 into f16 or f32
   * with CUBLAS_COMPUTE_32F (or its pedantic form), never FAST_TF32;
   * everything else (f32 into bf16, bf16 into f64, mixed A and B) is
   * CUBLAS_STATUS_NOT_SUPPORTED */
  if (c->type != dl->type) return S_NOT_SUPPORTED;
  if (is_fp8(a->type) || is_fp8(b->type)) {   /* fp8: its own rules (the head of this file) */
    if (!is_fp8(a->type) || !is_fp8(b->type) || (a->type == R_8F_E5M2 && b->type == R_8F_E5M2)) return S_NOT_SUPPORTED;
    if (d->compute != C_32F || d->scale != R_32F || (c->type != R_16BF && c->type != R_32F)) return S_NOT_SUPPORTED;
    if (d->transa != 1 || d->transb != 0) return S_NOT_SUPPORTED;   /* "TN" only */
    if (d->epilogue != EPI_DEFAULT) return S_NOT_SUPPORTED;
    if (drv.current_sm && drv.current_sm() < 89) return S_ARCH_MISMATCH;
    return S_OK;
  }
  if (a->type != b->type) return S_NOT_SUPPORTED;
  int ok = 0;
  if (d->compute == C_64F) ok = a->type == R_64F && c->type == R_64F;
  else if (a->type == R_32F) ok = c->type == R_32F;
  else if (a->type == R_16BF || a->type == R_16F)
    ok = d->compute != C_32F_FAST_TF32 && (c->type == a->type || c->type == R_32F);
  if (!ok) return S_NOT_SUPPORTED;
  if (d->epilogue != EPI_DEFAULT && !d->bias) return S_INVALID_VALUE;
  return S_OK;
}

EXPORT St cublasLtMatmulAlgoGetHeuristic(Handle *h, Desc *d, Layout *a, Layout *b, Layout *c, Layout *dl, Pref *p,
                                          int requested, Heuristic *out, int *returned) {
  if (!h || h->magic != MAGIC_HANDLE) return S_NOT_INITIALIZED;
  if (!p || p->magic != MAGIC_PREF || requested <= 0 || !out || !returned) return S_INVALID_VALUE;
  *returned = 0;
  St s = check(d, a, b, c, dl);
  if (s) return s;
  /* FAKE_CUBLASLT_NO_EPILOGUE_64F=1: no f64 algorithm with an epilogue (a
   * cuBLASLt that lacks them; the device layer must cope) */
  const char *ne = getenv("FAKE_CUBLASLT_NO_EPILOGUE_64F");
  if (ne && !strcmp(ne, "1") && d->compute == C_64F && d->epilogue != EPI_DEFAULT) return S_NOT_SUPPORTED;
  memset(out, 0, sizeof *out);
  out->algo.data[0] = MAGIC_ALGO;
  out->algo.data[1] = config_hash(d, a, b, c, dl);
  for (int i = 0; i < 4; i++) out->algo.data[2 + i] = p->align[i];   /* the alignment it assumes */
  out->workspaceSize = p->max_ws >= 4096 ? 4096 : 0;
  out->algo.data[6] = out->workspaceSize;
  out->state = S_OK;
  out->wavesCount = 1.0f;
  *returned = 1;
  return S_OK;
}

/* fp8 code c with mbits mantissa bits and exponent bias (E4M3: S.1111.111
 * NaN, no infinity; E5M2: IEEE) */
static double load8(uint8_t c, int mbits, int bias) {
  int eb = 7 - mbits, e = (c >> mbits) & ((1 << eb) - 1), m = c & ((1 << mbits) - 1);
  double v = e == 0 ? ldexp(m, 1 - bias - mbits) : ldexp(m + (1 << mbits), e - bias - mbits);
  if (eb == 4 && e == 15 && m == 7) v = NAN;
  if (eb == 5 && e == 31) v = m ? NAN : INFINITY;
  return c & 0x80 ? -v : v;
}

static double load(const void *p, uint32_t t, int64_t i) {
  switch (t) {
  case R_8F_E4M3: return load8(((const uint8_t *)p)[i], 3, 7);
  case R_8F_E5M2: return load8(((const uint8_t *)p)[i], 2, 15);
  case R_64F: return ((const double *)p)[i];
  case R_32F: return ((const float *)p)[i];
  case R_16BF: {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  default: {   /* IEEE half */
    uint16_t h = ((const uint16_t *)p)[i];
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
  }
  }
}

static void store(void *p, uint32_t t, int64_t i, double v) {
  switch (t) {
  case R_64F: ((double *)p)[i] = v; break;
  case R_32F: ((float *)p)[i] = (float)v; break;
  case R_16BF: {   /* round to nearest even */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    break;
  }
  default: {
    float f = (float)v;
    int e;
    double m = frexp(fabs(f), &e);   /* |f| = m 2^e, m in [0.5, 1) */
    uint16_t s = f < 0 ? 0x8000 : 0, h;
    if (f != f) h = 0x7e00;
    else if (e > 16) h = 0x7c00;
    else if (e < -13) h = (uint16_t)nearbyint(fabs(f) * 16777216.0);   /* subnormal */
    else h = (uint16_t)(((e + 14) << 10) + (int)nearbyint((m * 2 - 1) * 1024));
    ((uint16_t *)p)[i] = s | h;
    break;
  }
  }
}

static void run_job(void *user) {
  Job *j = user;
  const Desc *d = &j->d;
  if (is_fp8(j->a.type)) __atomic_add_fetch(&matmuls8[j->a.type - R_8F_E4M3][j->b.type - R_8F_E4M3], 1, __ATOMIC_RELAXED);
  uint64_t M = j->dl.rows, N = j->dl.cols, K = d->transa ? j->a.rows : j->a.cols;
  int f32 = d->compute != C_64F;
  for (int32_t bi = 0; bi < j->dl.batch; bi++) {
    const char *A = (const char *)j->A + (size_t)(bi * j->a.stride) * type_size(j->a.type);
    const char *B = (const char *)j->B + (size_t)(bi * j->b.stride) * type_size(j->b.type);
    const char *C = (const char *)j->C + (size_t)(bi * j->c.stride) * type_size(j->c.type);
    char *D = (char *)j->D + (size_t)(bi * j->dl.stride) * type_size(j->dl.type);
    const char *bias = d->bias ? (const char *)d->bias + (size_t)(bi * d->bias_stride) * type_size(j->dl.type) : NULL;
    for (uint64_t i = 0; i < M; i++)
      for (uint64_t jj = 0; jj < N; jj++) {
        double acc = 0;
        float accf = 0;
        for (uint64_t p = 0; p < K; p++) {
          /* op(A)(i, p), op(B)(p, jj); element (r, c) of a layout at r + c * ld */
          int64_t ia = (int64_t)(d->transa ? p + i * j->a.ld : i + p * j->a.ld);
          int64_t ib = (int64_t)(d->transb ? jj + p * j->b.ld : p + jj * j->b.ld);
          double x = load(A, j->a.type, ia), y = load(B, j->b.type, ib);
          if (f32) accf += (float)x * (float)y;
          else acc += x * y;
        }
        double v = j->alpha * (f32 ? (double)accf : acc);
        if (d->scale_a) v *= *(const float *)d->scale_a;   /* fp8: D = alpha sa sb op(A) op(B) */
        if (d->scale_b) v *= *(const float *)d->scale_b;
        if (j->beta != 0) v += j->beta * load(C, j->c.type, (int64_t)(i + jj * j->c.ld));
        if (d->epilogue == EPI_BIAS || d->epilogue == EPI_GELU_BIAS) v += load(bias, j->dl.type, (int64_t)i);
        if (d->epilogue == EPI_GELU_BIAS) v = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        store(D, j->dl.type, (int64_t)(i + jj * j->dl.ld), v);
      }
  }
  if (!j->kept) free(j);
}

/* Elements a layout spans over its batch. */
static size_t span(const Layout *l) {
  return (size_t)((l->batch - 1) * l->stride + (int64_t)(l->cols - 1) * l->ld + (int64_t)l->rows) * type_size(l->type);
}

static int aligned(const void *p, uint64_t al) { return al == 0 || (uintptr_t)p % al == 0; }

EXPORT St cublasLtMatmul(Handle *h, Desc *d, const void *alpha, const void *A, Layout *la, const void *B, Layout *lb,
                         const void *beta, const void *C, Layout *lc, void *D, Layout *ld, const Algo *algo, void *ws,
                         size_t ws_bytes, void *stream) {
  if (!h || h->magic != MAGIC_HANDLE) return S_NOT_INITIALIZED;
  St s = check(d, la, lb, lc, ld);
  if (s) return s;
  if (!alpha || !beta || !A || !B || !C || !D || !algo) return S_INVALID_VALUE;
  /* an algorithm of this configuration, with the workspace it asked for */
  if (algo->data[0] != MAGIC_ALGO || algo->data[1] != config_hash(d, la, lb, lc, ld)) return S_INVALID_VALUE;
  if (ws_bytes < algo->data[6] || (algo->data[6] && !ws)) return S_INVALID_VALUE;
  if (!aligned(A, algo->data[2]) || !aligned(B, algo->data[3]) || !aligned(C, algo->data[4]) ||
      !aligned(D, algo->data[5]))
    return S_INVALID_VALUE;
  if (C != D && lc->ld != ld->ld) return S_NOT_SUPPORTED;
  if (drv.ptr_ok) {   /* every pointer in device memory */
    int ok = drv.ptr_ok((uintptr_t)A, span(la)) && drv.ptr_ok((uintptr_t)B, span(lb)) &&
             drv.ptr_ok((uintptr_t)D, span(ld)) && (!ws_bytes || drv.ptr_ok((uintptr_t)ws, ws_bytes));
    double b = d->scale == R_64F ? *(const double *)beta : *(const float *)beta;
    if (b != 0) ok = ok && drv.ptr_ok((uintptr_t)C, span(lc));
    if (d->epilogue != EPI_DEFAULT) ok = ok && drv.ptr_ok((uintptr_t)d->bias, ld->rows * type_size(ld->type));
    if (!ok) return S_INVALID_VALUE;
  }
  Job *j = calloc(1, sizeof *j);
  if (!j) return S_ALLOC_FAILED;
  if (is_fp8(la->type)) {
    if (!d->scale_a || !d->scale_b || (drv.ptr_ok && (!drv.ptr_ok((uintptr_t)d->scale_a, 4) ||
                                                     !drv.ptr_ok((uintptr_t)d->scale_b, 4))))
      return S_INVALID_VALUE;   /* the scales: device pointers (cuBLASLt reads them at run time) */
  } else {
    matmuls[type_slot(la->type)]++;
    matmuls_d[type_slot(la->type)][type_slot(ld->type)]++;
  }
  if (d->epilogue != EPI_DEFAULT) matmuls_epi[type_slot(la->type)]++;
  *j = (Job){.d = *d, .a = *la, .b = *lb, .c = *lc, .dl = *ld, .A = A, .B = B, .C = C, .D = D};
  /* alpha and beta are read now (host pointer mode), as documented */
  j->alpha = d->scale == R_64F ? *(const double *)alpha : *(const float *)alpha;
  j->beta = d->scale == R_64F ? *(const double *)beta : *(const float *)beta;
  if (!drv.host_fn) {
    run_job(j);
    return S_OK;
  }
  int status = 0;
  if (drv.is_capturing && drv.is_capturing(stream, &status) != 0) {
    free(j);
    return S_EXECUTION_FAILED;
  }
  if (status) {   /* a graph node: replays need it */
    j->kept = 1;
    Job **k = realloc(h->kept, (size_t)(h->nkept + 1) * sizeof *k);
    if (!k) { free(j); return S_ALLOC_FAILED; }
    h->kept = k;
    h->kept[h->nkept++] = j;
  }
  if (drv.host_fn(stream, run_job, j) != 0) {
    if (!j->kept) free(j);
    return S_EXECUTION_FAILED;
  }
  return S_OK;
}
