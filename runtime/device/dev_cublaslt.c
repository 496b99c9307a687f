/* dev_cublaslt.c - the CUDA device's GEMMs (RtDevOps.gemm) on cuBLASLt,
 * loaded by ir/dl.h (TS_CUBLASLT_LIB overrides libcublasLt.so.13: the
 * tests point it at a fake that computes with loops).
 *
 * Row-major onto column-major.  cuBLASLt's matrices are column-major; a
 * row-major X[r][c] with row stride ld is, read column-major with the same
 * ld, the matrix X^T.  So our C = op(A) op(B) (row-major, m x n) is
 * computed as C^T = op(B)^T op(A)^T (column-major, n x m): cuBLASLt's "A"
 * is our B with transa = tb, its "B" is our A with transb = ta, and every
 * layout has rows = the row-major column count, ld = the row stride.  The
 * bias epilogue adds bias[i] to row i of cuBLASLt's D, which is column i
 * of our C: one value per output column, what RtGemm.bias is.
 *
 * Semantics (cuBLASLt's): C = gelu?(alpha op(A) op(B) + beta C + bias);
 * with beta = 0, C is not read.  f32 computes in f32 (CUBLAS_COMPUTE_32F:
 * no TF32 unless TS_CUDA_TF32=1), f64 in f64; bf16 / fp16 A and B compute
 * in f32 (CUBLAS_COMPUTE_32F, scale type f32: tensor cores) into a D of
 * their type or f32 (a weight gradient into its f32 main grad), the pairs
 * of cuBLASLt's table; the bias is D's type (BIAS_DATA_TYPE left unset:
 * cuBLASLt then reads the bias in D's type).
 *
 * One cuBLASLt handle and one 32 MiB workspace per device, made when the
 * device opens (not at the first GEMM, which may be inside a graph
 * capture, where allocating is not allowed).  A plan (descriptors, layouts,
 * the heuristic's algorithm) is cached per shape, transposes, strides,
 * epilogue and pointer alignment: the algorithm may depend on all of them.
 *
 * When cuBLASLt has no algorithm for a BIAS epilogue (NVIDIA documents
 * epilogue support per data type; f64 may lack it), the plan splits: the
 * product without epilogue, then C += ones[m] bias[n] as a rank-1 GEMM
 * per 64Ki rows (a ones vector per element type is made at open).  GELU_BIAS
 * has no such fallback and is refused with cuBLASLt's reason. */
#include "dev_cuda_priv.h"
#include "ir/dl.h"

enum { WORKSPACE_BYTES = 32 << 20, ONES = 1 << 16 };

/* ---- the library, loaded once per path ---- */

static const TsDlSym lt_syms[] = {
  TS_DL_SYM(RtLtLib, Create, "cublasLtCreate"),
  TS_DL_SYM(RtLtLib, Destroy, "cublasLtDestroy"),
  TS_DL_SYM(RtLtLib, GetStatusName, "cublasLtGetStatusName"),
  TS_DL_SYM(RtLtLib, GetStatusString, "cublasLtGetStatusString"),
  TS_DL_SYM(RtLtLib, DescCreate, "cublasLtMatmulDescCreate"),
  TS_DL_SYM(RtLtLib, DescDestroy, "cublasLtMatmulDescDestroy"),
  TS_DL_SYM(RtLtLib, DescSetAttribute, "cublasLtMatmulDescSetAttribute"),
  TS_DL_SYM(RtLtLib, LayoutCreate, "cublasLtMatrixLayoutCreate"),
  TS_DL_SYM(RtLtLib, LayoutDestroy, "cublasLtMatrixLayoutDestroy"),
  TS_DL_SYM(RtLtLib, LayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute"),
  TS_DL_SYM(RtLtLib, PrefCreate, "cublasLtMatmulPreferenceCreate"),
  TS_DL_SYM(RtLtLib, PrefDestroy, "cublasLtMatmulPreferenceDestroy"),
  TS_DL_SYM(RtLtLib, PrefSetAttribute, "cublasLtMatmulPreferenceSetAttribute"),
  TS_DL_SYM(RtLtLib, AlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic"),
  TS_DL_SYM(RtLtLib, Matmul, "cublasLtMatmul"),
};

/* path (TS_CUBLASLT_LIB, else the soname, then the toolkit's copy). */
static int lib_open(const char *path, void *table, char *why, size_t n) {
  int given = getenv("TS_CUBLASLT_LIB") && *getenv("TS_CUBLASLT_LIB");
  const char *files[] = {path, given ? NULL : "/usr/local/cuda/lib64/libcublasLt.so.13", NULL};
  char detail[900];
  TsDlStatus st;
  if (ts_dl_load(files, lt_syms, (int)(sizeof lt_syms / sizeof lt_syms[0]), table, NULL, &st, detail, sizeof detail))
    return 0;
  if (st == TS_DL_NO_SYMBOL)
    return ts_errf(why, n, "cuBLASLt (%s) has no %s (hint: a cuBLASLt older than CUDA 12?)", path, detail);
  if (given) return ts_errf(why, n, "cannot load cuBLASLt (%s): %s (the file TS_CUBLASLT_LIB names)", path, detail);
  return ts_errf(why, n, "cannot load cuBLASLt (%s): %s; or TS_CUBLASLT_LIB=FILE", path, detail);
}

static const RtLtLib *lib_load(char *why, size_t n) {
  static TsDlCache libs = TS_DL_CACHE_INIT;
  const char *path = getenv("TS_CUBLASLT_LIB");
  if (!path || !*path) path = "libcublasLt.so.13";
  return ts_dl_cached(&libs, path, sizeof(RtLtLib), lib_open, why, n);
}

/* ---- errors ---- */

static const char *lt_hint(LtStatus s) {
  switch (s) {
  case RT_LT_STATUS_NOT_INITIALIZED:
    return "cuBLASLt could not start: no usable GPU context, or its CUDA runtime does not match the driver";
  case RT_LT_STATUS_ALLOC_FAILED: return "out of host or GPU memory";
  case RT_LT_STATUS_INVALID_VALUE:
    return "an argument cuBLASLt refuses: a leading dimension below the row count, a misaligned pointer, a "
           "workspace too small";
  case RT_LT_STATUS_ARCH_MISMATCH: return "this GPU lacks a feature the GEMM needs (bf16 before sm_80?)";
  case RT_LT_STATUS_EXECUTION_FAILED: return "the GEMM kernel did not run: did an earlier kernel fault?";
  case RT_LT_STATUS_NOT_SUPPORTED:
    return "cuBLASLt has no kernel for this dtype / epilogue / layout on this GPU";
  case RT_LT_STATUS_INTERNAL_ERROR: return "a cuBLASLt internal error, often an out-of-memory in disguise";
  default: return "see the cuBLAS documentation of this status";
  }
}

static int lt_fail(const RtLtLib *L, LtStatus s, const char *fn, const char *what, char *err, size_t n) {
  if (s == RT_LT_STATUS_SUCCESS) return 0;
  const char *name = L->GetStatusName(s), *text = L->GetStatusString(s);
  return ts_errf(err, n, "%s failed: %s (%s)%s%s (hint: %s)", fn, name ? name : "?", text ? text : "?",
                 what ? " while " : "", what ? what : "", lt_hint(s));
}
#define LT_CHECK(L, field, sym, what, err, n, ...) lt_fail((L), (L)->field(__VA_ARGS__), sym, (what), (err), (n))

/* ---- plans ---- */

typedef struct {
  int elem, elem_c, ta, tb, epilogue;   /* elem: A and B; elem_c: C = D and the bias */
  int elem_b8;                          /* fp8: our B's element (elem is our A's); else 0 */
  int64_t m, n, k, lda, ldb, ldc, batch, sa, sb, sc;
  unsigned align_a, align_b, align_c, align_bias;
} LtPlanKey;

typedef struct {
  LtPlanKey key;
  LtDesc desc;
  LtLayout la, lb, lc;  /* cuBLASLt's A (our B), B (our A), C = D */
  LtAlgo algo;
  int split;            /* no algorithm with the BIAS epilogue: product, then bias as a rank-1 GEMM */
} LtPlan;

struct RtLtState {
  const RtLtLib *L;
  LtHandle h;
  void *ws;
  void *ones[4];        /* ONES ones per RtLtElem, for split bias epilogues */
  VEC(LtPlan *) plans;
};

static unsigned align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  unsigned al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

static void lt_plan_free(const RtLtLib *L, LtPlan *P) {
  if (!P) return;
  if (P->desc) L->DescDestroy(P->desc);
  if (P->la) L->LayoutDestroy(P->la);
  if (P->lb) L->LayoutDestroy(P->lb);
  if (P->lc) L->LayoutDestroy(P->lc);
  free(P);
}

typedef struct {
  int data, compute, scale;
  size_t size;
  const char *name;
} ElemInfo;

static ElemInfo elem_info(int e) {   /* RtLtElem, or RT_LT_ELEM_E4M3 / E5M2 */
  int tf32 = getenv("TS_CUDA_TF32") && !strcmp(getenv("TS_CUDA_TF32"), "1");
  switch (e) {
  case RT_LT_ELEM_F64: return (ElemInfo){RT_LT_R_64F, RT_LT_COMPUTE_64F, RT_LT_R_64F, 8, "f64"};
  case RT_LT_ELEM_BF16: return (ElemInfo){RT_LT_R_16BF, RT_LT_COMPUTE_32F, RT_LT_R_32F, 2, "bf16"};
  case RT_LT_ELEM_F16: return (ElemInfo){RT_LT_R_16F, RT_LT_COMPUTE_32F, RT_LT_R_32F, 2, "f16"};
  case RT_LT_ELEM_E4M3: return (ElemInfo){RT_LT_R_8F_E4M3, RT_LT_COMPUTE_32F, RT_LT_R_32F, 1, "e4m3"};
  case RT_LT_ELEM_E5M2: return (ElemInfo){RT_LT_R_8F_E5M2, RT_LT_COMPUTE_32F, RT_LT_R_32F, 1, "e5m2"};
  default:
    return (ElemInfo){RT_LT_R_32F, tf32 ? RT_LT_COMPUTE_32F_FAST_TF32 : RT_LT_COMPUTE_32F, RT_LT_R_32F, 4, "f32"};
  }
}

/* One layout: rows x cols column-major with leading dimension ld, and the
 * batch (count, element stride) when batched. */
static int layout(const RtLtLib *L, LtLayout *l, int type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                  int64_t stride, const char *what, char *err, size_t n) {
  if (LT_CHECK(L, LayoutCreate, "cublasLtMatrixLayoutCreate", what, err, n, l, type, (uint64_t)rows, (uint64_t)cols,
               ld))
    return -1;
  if (batch <= 1) return 0;
  int32_t count = (int32_t)batch;
  return LT_CHECK(L, LayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute", what, err, n, *l,
                  RT_LT_LAYOUT_BATCH_COUNT, &count, sizeof count) ||
         LT_CHECK(L, LayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute", what, err, n, *l,
                  RT_LT_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
}

/* Descriptors, layouts and the heuristic's first algorithm for key k
 * (with the epilogue unless split).  *none: cuBLASLt has no algorithm (as
 * opposed to an error). */
static LtPlan *lt_plan_try(RtLtState *S, const LtPlanKey *k, int split, const void *bias, const char *what, int *none,
                      char *err, size_t n) {
  const RtLtLib *L = S->L;
  ElemInfo E = elem_info((RtLtElem)k->elem), EC = elem_info((RtLtElem)k->elem_c);
  ElemInfo EB = k->elem_b8 ? elem_info((RtLtElem)k->elem_b8) : E;   /* cuBLASLt's A: our B */
  LtPlan *P = ts_xcalloc(1, sizeof *P);
  P->key = *k;
  P->split = split;
  *none = 0;
  int32_t opa = k->tb ? RT_LT_OP_T : RT_LT_OP_N, opb = k->ta ? RT_LT_OP_T : RT_LT_OP_N;
  uint32_t epi = split ? RT_LT_EPILOGUE_DEFAULT
                 : k->epilogue == RT_GEMM_BIAS ? RT_LT_EPILOGUE_BIAS
                 : k->epilogue == RT_GEMM_BIAS_GELU ? RT_LT_EPILOGUE_GELU_BIAS : RT_LT_EPILOGUE_DEFAULT;
  int64_t bias_stride = 0;   /* one bias for every batch item */
  if (LT_CHECK(L, DescCreate, "cublasLtMatmulDescCreate", what, err, n, &P->desc, E.compute, E.scale) ||
      LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc, RT_LT_DESC_TRANSA, &opa,
               sizeof opa) ||
      LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc, RT_LT_DESC_TRANSB, &opb,
               sizeof opb) ||
      LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc, RT_LT_DESC_EPILOGUE, &epi,
               sizeof epi))
    goto fail;
  if (epi != RT_LT_EPILOGUE_DEFAULT &&
      (LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc, RT_LT_DESC_BIAS_POINTER,
                &bias, sizeof bias) ||
       (k->batch > 1 && LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc,
                                 RT_LT_DESC_BIAS_BATCH_STRIDE, &bias_stride, sizeof bias_stride))))
    goto fail;
  /* row-major X (r x c, row stride ld) is column-major X^T (c x r, ld) */
  if (layout(L, &P->la, EB.data, k->tb ? k->k : k->n, k->tb ? k->n : k->k, k->ldb, k->batch, k->sb, what, err, n) ||
      layout(L, &P->lb, E.data, k->ta ? k->m : k->k, k->ta ? k->k : k->m, k->lda, k->batch, k->sa, what, err, n) ||
      layout(L, &P->lc, EC.data, k->n, k->m, k->ldc, k->batch, k->sc, what, err, n))
    goto fail;
  LtPref pref = NULL;
  uint64_t ws = WORKSPACE_BYTES;
  /* cuBLASLt's A is our B, its B our A */
  uint32_t al[4] = {k->align_b, k->align_a, k->align_c, k->align_c};
  int bad = LT_CHECK(L, PrefCreate, "cublasLtMatmulPreferenceCreate", what, err, n, &pref) ||
            LT_CHECK(L, PrefSetAttribute, "cublasLtMatmulPreferenceSetAttribute", what, err, n, pref,
                     RT_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  static const int al_attr[4] = {RT_LT_PREF_MIN_ALIGNMENT_A_BYTES, RT_LT_PREF_MIN_ALIGNMENT_B_BYTES,
                                 RT_LT_PREF_MIN_ALIGNMENT_C_BYTES, RT_LT_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && !bad; i++)
    bad = LT_CHECK(L, PrefSetAttribute, "cublasLtMatmulPreferenceSetAttribute", what, err, n, pref, al_attr[i],
                   &al[i], sizeof al[i]);
  LtHeuristic h[4];
  int got = 0;
  memset(h, 0, sizeof h);
  LtStatus hs = RT_LT_STATUS_SUCCESS;
  if (!bad) {
    hs = L->AlgoGetHeuristic(S->h, P->desc, P->la, P->lb, P->lc, P->lc, pref, 4, h, &got);
    if (hs == RT_LT_STATUS_NOT_SUPPORTED) got = 0;   /* no algorithm: not an error yet */
    else bad = lt_fail(L, hs, "cublasLtMatmulAlgoGetHeuristic", what, err, n);
  }
  if (pref) L->PrefDestroy(pref);
  if (bad) goto fail;
  int pick = -1;
  for (int i = 0; i < got && i < 4 && pick < 0; i++)
    if (h[i].state == RT_LT_STATUS_SUCCESS && h[i].workspaceSize <= WORKSPACE_BYTES) pick = i;
  if (pick < 0) {
    *none = 1;
    ts_errf(err, n, "cublasLtMatmulAlgoGetHeuristic found no algorithm for %s%s (hint: cuBLASLt has no kernel for this "
            "dtype / epilogue / alignment on this GPU)", what, hs ? " (CUBLAS_STATUS_NOT_SUPPORTED)" : "");
    goto fail;
  }
  P->algo = h[pick].algo;
  return P;
fail:
  lt_plan_free(L, P);
  return NULL;
}

static LtPlan *lt_plan_get(RtLtState *S, const LtPlanKey *k, const void *bias, const char *what, char *err, size_t n) {
  for (int i = 0; i < S->plans.n; i++)
    if (!memcmp(&S->plans.a[i]->key, k, sizeof *k)) return S->plans.a[i];
  int none;
  LtPlan *P = lt_plan_try(S, k, 0, bias, what, &none, err, n);
  if (!P && none && k->epilogue == RT_GEMM_BIAS) P = lt_plan_try(S, k, 1, bias, what, &none, err, n);
  if (P) VEC_PUSH(S->plans, P);
  return P;
}

/* ---- the device's cuBLASLt ---- */

/* ONES ones of every element type, for split bias epilogues. */
static int make_ones(RtDev *d, RtLtState *S, char *err, size_t n) {
  RtCudaDev *c = d->impl;
  static const size_t size[4] = {4, 8, 2, 2};
  unsigned char *host = ts_xmalloc((size_t)ONES * 8);
  int rc = 0;
  for (int e = 0; e < 4 && !rc; e++) {
    for (size_t i = 0; i < ONES; i++) {
      float f = 1;
      double x = 1;
      uint16_t h = e == RT_LT_ELEM_BF16 ? 0x3f80 : 0x3c00;
      memcpy(host + i * size[e], e == RT_LT_ELEM_F32 ? (void *)&f : e == RT_LT_ELEM_F64 ? (void *)&x : (void *)&h,
             size[e]);
    }
    CuPtr p = 0;
    rc = RT_CU_CHECK(c->cu, MemAlloc, "allocating cuBLASLt's ones", err, n, &p, ONES * size[e]);
    if (!rc) {
      S->ones[e] = (void *)(uintptr_t)p;
      rc = RT_CU_CHECK(c->cu, MemcpyHtoDAsync, "filling cuBLASLt's ones", err, n, p, host, ONES * size[e],
                       c->stream[RT_STREAM_COMPUTE]) ||
           RT_CU_CHECK(c->cu, StreamSynchronize, "filling cuBLASLt's ones", err, n, c->stream[RT_STREAM_COMPUTE]);
    }
  }
  free(host);
  return rc;
}

void rt_cublaslt_open(RtDev *d) {
  RtCudaDev *c = d->impl;
  char why[sizeof c->lt_why];
  const RtLtLib *L = lib_load(why, sizeof why);
  if (!L) {
    snprintf(c->lt_why, sizeof c->lt_why, "%s", why);
    return;
  }
  RtLtState *S = ts_xcalloc(1, sizeof *S);
  S->L = L;
  CuPtr ws = 0;
  if (LT_CHECK(L, Create, "cublasLtCreate", "making the cuBLASLt handle", why, sizeof why, &S->h) ||
      RT_CU_CHECK(c->cu, MemAlloc, "allocating the cuBLASLt workspace", why, sizeof why, &ws, WORKSPACE_BYTES)) {
    if (S->h) L->Destroy(S->h);
    free(S);
    snprintf(c->lt_why, sizeof c->lt_why, "%s", why);
    return;
  }
  S->ws = (void *)(uintptr_t)ws;
  c->lt = S;
  if (make_ones(d, S, why, sizeof why) != 0) {
    rt_cublaslt_close(d);
    snprintf(c->lt_why, sizeof c->lt_why, "%s", why);
    return;
  }
  c->lt_why[0] = 0;
}

void rt_cublaslt_close(RtDev *d) {
  RtCudaDev *c = d->impl;
  RtLtState *S = c->lt;
  if (!S) return;
  for (int i = 0; i < S->plans.n; i++) lt_plan_free(S->L, S->plans.a[i]);
  free(S->plans.a);
  char err[256];
  (void)RT_CU_CHECK(c->cu, MemFree, NULL, err, sizeof err, (CuPtr)(uintptr_t)S->ws);
  for (int e = 0; e < 4; e++)
    if (S->ones[e]) (void)RT_CU_CHECK(c->cu, MemFree, NULL, err, sizeof err, (CuPtr)(uintptr_t)S->ones[e]);
  S->L->Destroy(S->h);
  free(S);
  c->lt = NULL;
}

int rt_cublaslt_plans(RtDev *d) {
  RtCudaDev *c = d->impl;
  return c->lt ? c->lt->plans.n : 0;
}

/* The row-major operand checks cuBLASLt would make in its own terms. */
static int gemm_check(const RtGemm *g, char *err, size_t n) {
  const char *bad = NULL;
  if (g->m < 1 || g->n < 1 || g->k < 1) bad = "an empty product (m, n or k < 1)";
  else if (g->lda < (g->ta ? g->m : g->k)) bad = "lda below A's row length";
  else if (g->ldb < (g->tb ? g->k : g->n)) bad = "ldb below B's row length";
  else if (g->ldc < g->n) bad = "ldc below n";
  else if (g->batch > 2147483647LL) bad = "more than 2^31-1 batch items";
  else if (g->epilogue != RT_GEMM_PLAIN && !g->bias) bad = "a bias epilogue without a bias";
  else if (g->epilogue < RT_GEMM_PLAIN || g->epilogue > RT_GEMM_BIAS_GELU) bad = "an unknown epilogue";
  else if (!g->a || !g->b || !g->c) bad = "a NULL operand";
  if (!bad) return 0;
  return ts_errf(err, n, "internal error: GEMM m=%lld n=%lld k=%lld with %s", (long long)g->m, (long long)g->n,
                 (long long)g->k, bad);
}

int rt_cublaslt_gemm(RtDev *d, const RtGemm *g, RtLtElem elem, RtLtElem elem_c, int stream, char *err, size_t n) {
  RtCudaDev *c = d->impl;
  if (!c->lt) return ts_errf(err, n, "GEMMs on %s need cuBLASLt: %s", d->label, c->lt_why);
  if (stream < 0 || stream >= RT_DEV_STREAMS) return ts_errf(err, n, "internal error: stream %d", stream);
  if (gemm_check(g, err, n) || rt_cuda_current(d, err, n)) return -1;
  RtLtState *S = c->lt;
  LtPlanKey k;
  memset(&k, 0, sizeof k);   /* compared with memcmp: no stray padding */
  k.elem = elem;
  k.elem_c = elem_c;
  k.ta = !!g->ta;
  k.tb = !!g->tb;
  k.epilogue = g->epilogue;
  k.m = g->m; k.n = g->n; k.k = g->k;
  k.lda = g->lda; k.ldb = g->ldb; k.ldc = g->ldc;
  k.batch = g->batch > 1 ? g->batch : 1;
  if (k.batch > 1) { k.sa = g->stride_a; k.sb = g->stride_b; k.sc = g->stride_c; }
  k.align_a = align_of(g->a);
  k.align_b = align_of(g->b);
  k.align_c = align_of(g->c);
  k.align_bias = g->epilogue != RT_GEMM_PLAIN ? align_of(g->bias) : 0;
  int fp8 = elem == (RtLtElem)RT_LT_ELEM_E4M3 || elem == (RtLtElem)RT_LT_ELEM_E5M2;
  if (fp8) k.elem_b8 = g->b8_dtype == IR_F8E5M2 ? RT_LT_ELEM_E5M2 : g->b8_dtype == IR_F8E4M3 ? RT_LT_ELEM_E4M3 : elem;
  ElemInfo E = elem_info(elem), EC = elem_info(elem_c);
  char what[200], names[32];
  if (fp8) snprintf(names, sizeof names, "%s x %s->%s", E.name, elem_info((RtLtElem)k.elem_b8).name, EC.name);
  else if (elem == elem_c) snprintf(names, sizeof names, "%s", E.name);
  else snprintf(names, sizeof names, "%s->%s", E.name, EC.name);
  snprintf(what, sizeof what, "GEMM %s m=%lld n=%lld k=%lld%s%s batch %lld%s", names, (long long)g->m,
           (long long)g->n, (long long)g->k, g->ta ? " A^T" : "", g->tb ? " B^T" : "", (long long)k.batch,
           g->epilogue == RT_GEMM_BIAS ? " +bias" : g->epilogue == RT_GEMM_BIAS_GELU ? " +bias gelu" : "");
  LtPlan *P = lt_plan_get(S, &k, g->bias, what, err, n);
  if (!P) return -1;
  const RtLtLib *L = S->L;
  if (g->epilogue != RT_GEMM_PLAIN &&
      LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc, RT_LT_DESC_BIAS_POINTER,
               &g->bias, sizeof g->bias))
    return -1;
  /* fp8: cuBLASLt's A is our B, so its A scale is our B's scale_inv */
  if (fp8 && (LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc,
                       RT_LT_DESC_A_SCALE_POINTER, &g->scale_b, sizeof g->scale_b) ||
              LT_CHECK(L, DescSetAttribute, "cublasLtMatmulDescSetAttribute", what, err, n, P->desc,
                       RT_LT_DESC_B_SCALE_POINTER, &g->scale_a, sizeof g->scale_a)))
    return -1;
  /* alpha and beta in the scale type, read from host memory when the
   * call is issued (so a captured graph keeps these values) */
  float af = (float)g->alpha, bf = (float)g->beta;
  const void *alpha = &af, *beta = &bf;
  if (E.scale == RT_LT_R_64F) alpha = &g->alpha, beta = &g->beta;
  if (LT_CHECK(L, Matmul, "cublasLtMatmul", what, err, n, S->h, P->desc, alpha, g->b, P->la, g->a, P->lb, beta,
               g->c, P->lc, g->c, P->lc, &P->algo, S->ws, (size_t)WORKSPACE_BYTES, c->stream[stream]))
    return -1;
  if (!P->split) return 0;
  /* C[rows r0 ..] += ones[rows] bias[n]: k = 1, the same bias for every item, in C's type */
  size_t es = EC.size;
  for (int64_t r0 = 0; r0 < g->m; r0 += ONES) {
    RtGemm u = {.dtype = g->dtype, .m = g->m - r0 < ONES ? g->m - r0 : ONES, .n = g->n, .k = 1, .lda = 1,
                .ldb = g->n, .ldc = g->ldc, .batch = k.batch, .stride_c = g->stride_c, .alpha = 1, .beta = 1,
                .a = S->ones[elem_c], .b = g->bias, .c = (char *)g->c + (size_t)(r0 * g->ldc) * es};
    if (rt_cublaslt_gemm(d, &u, elem_c, elem_c, stream, err, n)) return -1;
  }
  return 0;
}

static int lt_elem(IrDtype t) {
  return t == IR_F32 ? RT_LT_ELEM_F32 : t == IR_F64 ? RT_LT_ELEM_F64 : t == IR_BF16 ? RT_LT_ELEM_BF16
         : t == IR_F16 ? RT_LT_ELEM_F16 : -1;
}

/* cuBLASLt's fp8 rules (its cublasLtMatmul documentation, "FP8"), in our
 * terms: our B is its A, which must be transposed (tb = 1), our A its B,
 * not transposed (ta = 0); the type pairs; compute and scale type f32; D
 * bf16 or f32 here (cuBLASLt also writes fp8 D with a D scale: not used). */
int rt_cublaslt_gemm8(RtDev *d, const RtGemm *g, int stream, char *err, size_t n) {
  IrDtype a8 = g->ab_dtype, b8 = g->b8_dtype != IR_VOID ? g->b8_dtype : g->ab_dtype;
  if (d->sm > 0 && d->sm < 89)
    return ts_errf(err, n, "an fp8 GEMM on sm_%d: cuBLASLt's fp8 GEMMs need sm_89 or newer (Ada, Hopper); run this "
                   "--fp8 plan on CPU ranks (mrun --cpu) or on an sm_89+ GPU", d->sm);
  if (!ir_dtype_is_8(a8) || !ir_dtype_is_8(b8) || (a8 == IR_F8E5M2 && b8 == IR_F8E5M2))
    return ts_errf(err, n, "internal error: an fp8 GEMM of %s x %s: cuBLASLt takes e4m3 x e4m3, e4m3 x e5m2 and "
                   "e5m2 x e4m3 (not e5m2 x e5m2)", ir_dtype_name(a8), ir_dtype_name(b8));
  if (g->dtype != IR_BF16 && g->dtype != IR_F32)
    return ts_errf(err, n, "internal error: an fp8 GEMM into %s (bf16 or f32 here)", ir_dtype_name(g->dtype));
  if (g->ta || !g->tb)
    return ts_errf(err, n, "internal error: an fp8 GEMM with ta=%d tb=%d: cuBLASLt's fp8 GEMMs take only the TN form "
                   "(ta=0 tb=1 here: B stored [n, k]); transpose the operand first", g->ta, g->tb);
  if (!g->scale_a || !g->scale_b || g->epilogue != RT_GEMM_PLAIN)
    return ts_errf(err, n, "internal error: an fp8 GEMM without its scale pointers or with an epilogue");
  RtLtElem e = a8 == IR_F8E4M3 ? (RtLtElem)RT_LT_ELEM_E4M3 : (RtLtElem)RT_LT_ELEM_E5M2;
  return rt_cublaslt_gemm(d, g, e, g->dtype == IR_BF16 ? RT_LT_ELEM_BF16 : RT_LT_ELEM_F32, stream, err, n);
}

int rt_cuda_gemm(RtDev *d, const RtGemm *g, int stream, char *err, size_t n) {
  if (ir_dtype_is_8(g->ab_dtype)) return rt_cublaslt_gemm8(d, g, stream, err, n);
  IrDtype ab = g->ab_dtype != IR_VOID ? g->ab_dtype : g->dtype, bias = g->bias_dtype != IR_VOID ? g->bias_dtype : g->dtype;
  int ea = lt_elem(ab), ec = lt_elem(g->dtype);
  /* cuBLASLt's pairs (A = B, C = D): f32 f32, f64 f64, and 16-bit A and B
   * with CUBLAS_COMPUTE_32F into a D of their type or f32 */
  int ok = ea >= 0 && ec >= 0 && (ab == g->dtype || (ir_dtype_is_16(ab) && g->dtype == IR_F32));
  if (!ok)
    return ts_errf(err, n, "internal error: GEMM of %s operands into %s: cuBLASLt takes f32 -> f32, f64 -> f64, "
                   "bf16 -> bf16 or f32, f16 -> f16 or f32", ir_dtype_name(ab), ir_dtype_name(g->dtype));
  if (g->epilogue != RT_GEMM_PLAIN && bias != g->dtype)
    return ts_errf(err, n, "internal error: a %s bias for a GEMM into %s: cuBLASLt's bias epilogue reads the bias in "
                   "D's type (%s); cast the bias to %s, or add it after the GEMM", ir_dtype_name(bias),
                   ir_dtype_name(g->dtype), ir_dtype_name(g->dtype), ir_dtype_name(g->dtype));
  return rt_cublaslt_gemm(d, g, (RtLtElem)ea, (RtLtElem)ec, stream, err, n);
}
