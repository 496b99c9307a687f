/* test_codegen.c - the LLVM backend against the reference runtime.
 *
 * Every case builds a small tensor-IR module, lowers a group of its nodes
 * (one node, or a fused chain) with cg_lower_group, JIT-compiles the
 * kernel, runs it on random inputs (split into several [begin, end)
 * pieces, or over 2 threads) and compares each output element with the
 * reference runtime running the same module node by node (rt_run_block;
 * results read back through accum into states).  f32 within 1e-6
 * relative, f64 within 1e-12 (see rel_ok).  Plus: the kernel-IR printer
 * (golden text), the verifier's and the lowering's errors, and that the
 * JIT emits vector code for the host (AVX when the CPU has it). */
#include "codegen/cg.h"
#include "runtime/exec/rt.h"
#include <dlfcn.h>
#include <math.h>
#include <unistd.h>
#include "compile_c.h"
#include "../check.h"
#ifdef TS_EMU_HEADER
#include "codegen/cuda.h"
#include "emu_host.h"
#endif

static char err[2048];

/* ---- the CUDA printer under the emulator (test_codegen --cuda) ----
 * Every kernel a case checks is also printed as CUDA C (cuda.c) into ONE
 * module with its inputs and the reference's outputs kept; at the end the
 * module is compiled once for the emulator and every kernel launched on
 * its inputs and compared like the LLVM kernel (f32 1e-6, f64 1e-12). */
static int g_cuda;
typedef struct {
  char what[96];
  CgCudaLaunch l;
  int nin, nout, shared_out, shared_in;
  CgBuf buf[CG_MAX_BUFS];
  void *data[CG_MAX_BUFS];      /* inputs: copies; outputs: filled by the launch */
  double *want[CG_MAX_BUFS];    /* the reference's outputs */
  IrDtype wt[CG_MAX_BUFS];
} CudaCase;
static VEC(CudaCase) g_cuda_cases;
static StrBuf g_cuda_src;

/* ---- deterministic inputs ---- */
static uint64_t g_rs = 0x5eed;
static double urand(void) {   /* [0, 1) */
  uint64_t z = (g_rs += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

static IrType mkty(IrDtype dt, int rank, const int64_t *dims) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return t;
}
#define TY(dt, ...) mkty(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

/* ---- a test module: inputs with random data, then nodes ---- */
#define MAXF 12
typedef struct {
  IrModule *m;
  int b;
  int nfeed;
  RtFeed feeds[MAXF];
  int feed_id[MAXF];
  void *data[MAXF];
  char names[MAXF][16];
} Case;

static void case_init(Case *c) {
  memset(c, 0, sizeof *c);
  c->m = ir_module_new("t");
  c->b = ir_block_add(c->m, "forward");
}
static void case_free(Case *c) {
  ir_module_free(c->m);
  for (int i = 0; i < c->nfeed; i++) free(c->data[i]);
}

/* An input of type t, uniform in [lo, hi); i32 inputs get integers in
 * [lo, hi).  Returns its value id. */
static int input(Case *c, IrType t, double lo, double hi) {
  TS_ASSERT(c->nfeed < MAXF);
  int i = c->nfeed++;
  snprintf(c->names[i], sizeof c->names[i], "x%d", i);
  int id = ir_emit(c->m, c->b, IR_OP_INPUT, NULL, 0, NULL, NULL, c->names[i], &t, err, sizeof err);
  TS_ASSERT(id >= 0);
  int64_t n = ir_type_numel(&t);
  void *p = ts_xmalloc((size_t)(n ? n : 1) * 8);
  for (int64_t k = 0; k < n; k++) {
    double v = lo + (hi - lo) * urand();
    if (t.dtype == IR_F32) ((float *)p)[k] = (float)v;
    else if (t.dtype == IR_F64) ((double *)p)[k] = v;
    else ((int32_t *)p)[k] = (int32_t)floor(v);
  }
  c->data[i] = p;
  c->feeds[i] = (RtFeed){c->names[i], p};
  c->feed_id[i] = id;
  return id;
}

static int emit(Case *c, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa, const IrType *typed) {
  int id = ir_emit(c->m, c->b, op, in, nin, ia, fa, NULL, typed, err, sizeof err);
  if (id < 0) TS_DIE("test setup: %s: %s", ir_ops[op].name, err);
  return id;
}
#define E1(c, op, a) emit(c, op, (int[]){a}, 1, NULL, NULL, NULL)
#define E2(c, op, a, b) emit(c, op, (int[]){a, b}, 2, NULL, NULL, NULL)

static double ld(const void *p, IrDtype t, int64_t i) {
  return t == IR_F32 ? ((const float *)p)[i] : t == IR_F64 ? ((const double *)p)[i] : ((const int32_t *)p)[i];
}

/* |got - want| <= tol * |want| (relative), with want == got for exact
 * values (0, inf, NaN on both sides); a floor of tol * 1e-3 absolute
 * covers results that are a cancellation near 0 (layernorm of a value at
 * the mean, x - y of nearly equal inputs): there a relative error is
 * meaningless, the error is relative to the operands' scale. */
static int rel_ok(double got, double want, double tol) {
  if (got == want || (isnan(got) && isnan(want))) return 1;
  return fabs(got - want) <= tol * fmax(fabs(want), 1e-3);
}

/* how to run a kernel: in three [begin, end) pieces, over 2 threads, or
 * in pieces with an output sharing memory with an input of its shape */
enum { RUN_PIECES, RUN_THREADS, RUN_INPLACE };
/* flag: also print the kernel as C (cg_kernel_c_text), compile it with cc
 * and check that too (the second printer against the same reference) */
enum { RUN_C = 8 };


/* Compares the kernel's outputs (bufs[nin..]) with the reference's states. */
static void compare_outputs(Case *c, RtProgram *p, const CgGroupIO *io, void **bufs, const int *st_of,
                            const char *what, const char *backend) {
  IrModule *m = c->m;
  for (int j = 0; j < io->nout; j++) {
    const IrNode *nd = &m->blocks.a[c->b].nodes[io->out[j]];
    const void *want = rt_state_data(p, st_of[io->nin + j]);
    IrDtype dt = nd->type.dtype, wt = m->states.a[st_of[io->nin + j]].type.dtype;
    double tol = dt == IR_F32 ? 1e-6 : dt == IR_F64 ? 1e-12 : 0;
    /* the float inputs decide the precision of an i32 or cast result */
    for (int a = 0; a < nd->nin && dt == IR_I32; a++)
      if (m->blocks.a[c->b].nodes[nd->in[a]].type.dtype == IR_F32) tol = 1e-6;
    int64_t cnt = ir_type_numel(&nd->type), bad = -1;
    for (int64_t i = 0; i < cnt && bad < 0; i++)
      if (!rel_ok(ld(bufs[io->nin + j], dt, i), ld(want, wt, i), tol)) bad = i;
    CHECK(bad < 0, "%s (%s): output %%%d (%s) element %lld = %.17g, reference %.17g", what, backend, io->out[j],
          ir_ops[nd->op].name, (long long)bad, bad >= 0 ? ld(bufs[io->nin + j], dt, bad) : 0.0,
          bad >= 0 ? ld(want, wt, bad) : 0.0);
  }
}

static size_t buf_bytes(const CgBuf *b) { return (size_t)b->n * (b->type == CG_F64 ? 8 : 4); }

/* Keeps kernel k (renamed to be unique in the module) with copies of its
 * inputs, as run now, and the reference's outputs. */
static void cuda_keep(Case *c, RtProgram *p, CgKernel *k, const CgGroupIO *io, void **bufs, const int *st_of,
                      const char *what, int shared_out, int shared_in) {
  CudaCase cc;
  memset(&cc, 0, sizeof cc);
  snprintf(cc.what, sizeof cc.what, "%s", what);
  char name[64];
  snprintf(name, sizeof name, "k%d_%.40s", g_cuda_cases.n, k->name);
  snprintf(k->name, sizeof k->name, "%s", name);
  CHECK(cg_kernel_cuda_text(k, &g_cuda_src, &cc.l, err, sizeof err) == 0, "%s: CUDA printer: %s", what, err);
  cc.nin = io->nin;
  cc.nout = io->nout;
  cc.shared_out = shared_out;
  cc.shared_in = shared_in;
  memcpy(cc.buf, k->buf, sizeof cc.buf);
  for (int i = 0; i < io->nin + io->nout; i++) {
    cc.data[i] = ts_xcalloc(buf_bytes(&k->buf[i]) + 8, 1);
    if (i < io->nin && i != shared_in) memcpy(cc.data[i], bufs[i], buf_bytes(&k->buf[i]));
  }
  if (shared_out >= 0) {   /* the output starts as the input it overwrites */
    const void *src = NULL;
    for (int f = 0; f < c->nfeed; f++)
      if (c->feed_id[f] == io->in[shared_in]) src = c->data[f];
    if (!src) src = rt_state_data(p, st_of[shared_in]);
    memcpy(cc.data[shared_out], src, buf_bytes(&k->buf[shared_in]));
  } else {
    for (int j = 0; j < io->nout; j++) memset(cc.data[io->nin + j], 0xff, buf_bytes(&k->buf[io->nin + j]));
  }
  IrModule *m = c->m;
  for (int j = 0; j < io->nout; j++) {
    int s = st_of[io->nin + j];
    int64_t n = ir_type_numel(&m->states.a[s].type);
    cc.wt[j] = m->blocks.a[c->b].nodes[io->out[j]].type.dtype;
    cc.want[j] = ts_xmalloc((size_t)(n ? n : 1) * sizeof(double));
    for (int64_t e = 0; e < n; e++) cc.want[j][e] = ld(rt_state_data(p, s), m->states.a[s].type.dtype, e);
  }
  VEC_PUSH(g_cuda_cases, cc);
}

/* Compiles the kept kernels as one module for the emulator, runs each on
 * its inputs and compares with the reference. */
static void cuda_run_all(void) {
#ifdef TS_EMU_HEADER
  StrBuf src = {0};
  sb_printf(&src, "%s%s", cg_cuda_prelude(), g_cuda_src.p ? g_cuda_src.p : "");
  TsEmu *e = ts_emu_load(src.p, err, sizeof err);
  CHECK(e != NULL, "the CUDA module does not compile for the emulator: %s", err);
  long long run[CG_RUN_WORDS] = {0};
  int rows = 0, vecs = 0;
  for (int i = 0; e && i < g_cuda_cases.n; i++) {
    CudaCase *cc = &g_cuda_cases.a[i];
    CgCudaArgs a;
    memset(&a, 0, sizeof a);
    for (int b = 0; b < cc->nin + cc->nout; b++) a.b[b] = cc->data[b];
    if (cc->shared_out >= 0) a.b[cc->shared_in] = cc->data[cc->shared_out];
    a.run = run;
    int rc = ts_emu_launch_kernel(e, &cc->l, &a, err, sizeof err);
    CHECK(rc == 0, "%s (cuda): %s", cc->what, err);
    if (rc != 0) continue;
    const char *mode = strstr(src.p, cc->l.name);
    rows += cc->l.threads != 256 || (mode && 0);
    for (int j = 0; j < cc->nout; j++) {
      const CgBuf *b = &cc->buf[cc->nin + j];
      IrDtype dt = b->type == CG_F64 ? IR_F64 : b->type == CG_F32 ? IR_F32 : IR_I32;
      double tol = dt == IR_F32 ? 1e-6 : dt == IR_F64 ? 1e-12 : 0;
      if (dt == IR_I32) tol = 1e-6;
      int64_t bad = -1;
      for (int64_t x = 0; x < b->n && bad < 0; x++)
        if (!rel_ok(ld(cc->data[cc->nin + j], dt, x), cc->want[j][x], tol)) bad = x;
      CHECK(bad < 0, "%s (cuda, kernel %s): output %d element %lld = %.17g, reference %.17g", cc->what, cc->l.name, j,
            (long long)bad, bad >= 0 ? ld(cc->data[cc->nin + j], dt, bad) : 0.0, bad >= 0 ? cc->want[j][bad] : 0.0);
    }
  }
  for (const char *q = src.p; (q = strstr(q, "16-byte vectors")); q++) vecs++;
  printf("cuda: %d kernels run under the emulator (%d with 16-byte vectors)\n", g_cuda_cases.n, vecs);
  CHECK(vecs > 0, "no kernel used 16-byte vector accesses");
  CHECK(strstr(src.p, "row mode") != NULL, "no kernel in row mode");
  (void)rows;
  ts_emu_free(e);
  sb_free(&src);
#endif
  for (int i = 0; i < g_cuda_cases.n; i++) {
    CudaCase *cc = &g_cuda_cases.a[i];
    for (int b = 0; b < cc->nin + cc->nout; b++) free(cc->data[b]);
    for (int j = 0; j < cc->nout; j++) free(cc->want[j]);
  }
  free(g_cuda_cases.a);
  sb_free(&g_cuda_src);
}

/* Lowers nodes[0..n) of c, runs kernel and reference, compares every output. */
static void check_group(Case *c, const int *nodes, int n, const char *what, int how_flags) {
  IrModule *m = c->m;
  int how = how_flags & 7, with_c = (how_flags & RUN_C) && how != RUN_INPLACE;
  CgGroupIO io;
  CgKernel *k = cg_lower_group(m, &m->blocks.a[c->b], nodes, n, &io, err, sizeof err);
  CHECK(k != NULL, "%s: lowering failed: %s", what, err);
  if (!k) return;
  /* reference: capture every kernel buffer that is not an input's data */
  int st_of[CG_MAX_BUFS];
  for (int i = 0; i < io.nin + io.nout; i++) {
    int id = i < io.nin ? io.in[i] : io.out[i - io.nin];
    st_of[i] = -1;
    const IrNode *nd = &m->blocks.a[c->b].nodes[id];
    if (nd->op == IR_OP_INPUT) continue;
    int v = id;
    if (!ir_dtype_is_float(nd->type.dtype)) {
      IrType f = nd->type;
      f.dtype = IR_F64;
      v = emit(c, IR_OP_CAST, &id, 1, NULL, NULL, &f);
    }
    IrState s;
    memset(&s, 0, sizeof s);
    char nm[32];
    snprintf(nm, sizeof nm, "out%d", i);
    s.name = ts_intern(nm);
    s.type = m->blocks.a[c->b].nodes[v].type;
    s.kind = IR_STATE_GRAD;
    s.of = -1;
    st_of[i] = ir_state_add(m, &s);
    emit(c, IR_OP_ACCUM, &v, 1, (int64_t[]){st_of[i]}, NULL, NULL);
  }
  RtProgram *p = rt_program_new(m, err, sizeof err);
  TS_ASSERT(p);
  RtRunInfo info = {0, 0, 1e-3, 0};
  int rc = rt_run_block(p, c->b, c->feeds, c->nfeed, &info, err, sizeof err);
  CHECK(rc == 0, "%s: reference run failed: %s", what, err);
  CgFn fn = rc == 0 ? cg_jit_compile(g_jit, k, err, sizeof err) : NULL;
  CHECK(rc != 0 || fn != NULL, "%s: JIT failed: %s", what, err);
  if (fn) {
    void *bufs[CG_MAX_BUFS];
    for (int i = 0; i < io.nin; i++) {
      bufs[i] = NULL;
      for (int f = 0; f < c->nfeed; f++)
        if (c->feed_id[f] == io.in[i]) bufs[i] = c->data[f];
      if (!bufs[i]) bufs[i] = rt_state_data(p, st_of[i]);   /* same dtype: float producers */
    }
    for (int j = 0; j < io.nout; j++)
      bufs[io.nin + j] = ts_xcalloc((size_t)(k->buf[io.nin + j].n + 1), 8);
    int shared_out = -1, shared_in = -1;   /* RUN_INPLACE: this output overwrites this input */
    /* the first output that can, over the LAST input it can: an input read
     * by later nodes than the output's, the case where a store before the
     * other loads would go wrong */
    for (int j = 0; j < io.nout && how == RUN_INPLACE && shared_out < 0; j++)
      for (int i = io.nin - 1; i >= 0 && shared_out < 0; i--)
        if (k->buf[i].type == k->buf[io.nin + j].type && k->buf[i].n == k->buf[io.nin + j].n) {
          shared_out = io.nin + j;
          shared_in = i;
        }
    CHECK(how != RUN_INPLACE || shared_out >= 0, "%s: no output to run in place", what);
    if (shared_out >= 0) {
      memcpy(bufs[shared_out], bufs[shared_in], (size_t)k->buf[shared_in].n * (k->buf[shared_in].type == CG_F64 ? 8 : 4));
      bufs[shared_in] = bufs[shared_out];
    }
    int64_t g = k->grid;
    if (how == RUN_THREADS) cg_par_run(fn, bufs, g, 2);
    else { fn(bufs, 0, g / 3); fn(bufs, g / 3, 2 * g / 3); fn(bufs, 2 * g / 3, g); }
    compare_outputs(c, p, &io, bufs, st_of, what, "llvm");
    if (g_cuda) cuda_keep(c, p, k, &io, bufs, st_of, what, shared_out, shared_in);
    if (with_c && g_have_cc) {   /* the same buffers through the C printer's code */
      StrBuf src = {0};
      void *h = NULL;
      CHECK(cg_kernel_c_text(k, &src, err, sizeof err) == 0, "%s: C printer: %s", what, err);
      CgFn cfn = src.p ? compile_c(src.p, k->name, &h) : NULL;
      CHECK(cfn != NULL, "%s: the printed C does not compile:\n%s", what, src.p ? src.p : "");
      if (cfn) {
        for (int j = 0; j < io.nout; j++)   /* poison: every element must be written again */
          memset(bufs[io.nin + j], 0xff, (size_t)k->buf[io.nin + j].n * (k->buf[io.nin + j].type == CG_F64 ? 8 : 4));
        cfn(bufs, 0, g / 2);
        cfn(bufs, g / 2, g);
        compare_outputs(c, p, &io, bufs, st_of, what, "C");
      }
      if (h) dlclose(h);
      sb_free(&src);
    }
    for (int j = 0; j < io.nout; j++) free(bufs[io.nin + j]);
  }
  rt_program_free(p);
  cg_kernel_free(k);
}
static void check1(Case *c, int id, const char *what) { check_group(c, &id, 1, what, RUN_PIECES); }

/* ---- single ops ---- */
static const IrOp EW1_OPS[] = {IR_OP_NEG, IR_OP_EXP, IR_OP_TANH, IR_OP_GELU_TANH, IR_OP_GELU_ERF, IR_OP_SILU,
                               IR_OP_RELU, IR_OP_ADDS, IR_OP_MULS};
static const IrOp EWPOS_OPS[] = {IR_OP_LOG, IR_OP_SQRT, IR_OP_RSQRT};
static const IrOp EW2_OPS[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_GELU_TANH_BWD,
                               IR_OP_GELU_ERF_BWD, IR_OP_SILU_BWD, IR_OP_RELU_BWD};
static unsigned char g_covered[IR_OP_COUNT];

static void test_elementwise(IrDtype dt) {
  IrType t = TY(dt, 5, 37);   /* 185: not a multiple of any vector width */
  char what[96];
  for (size_t i = 0; i < sizeof EW1_OPS / sizeof *EW1_OPS; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3);
    int id = emit(&c, EW1_OPS[i], &x, 1, NULL, (double[]){0.75}, NULL);
    snprintf(what, sizeof what, "%s %s", ir_ops[EW1_OPS[i]].name, ir_dtype_name(dt));
    check1(&c, id, what);
    g_covered[EW1_OPS[i]] = 1;
    case_free(&c);
  }
  for (size_t i = 0; i < sizeof EWPOS_OPS / sizeof *EWPOS_OPS; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, 0.01, 5);
    snprintf(what, sizeof what, "%s %s", ir_ops[EWPOS_OPS[i]].name, ir_dtype_name(dt));
    check1(&c, E1(&c, EWPOS_OPS[i], x), what);
    g_covered[EWPOS_OPS[i]] = 1;
    case_free(&c);
  }
  for (size_t i = 0; i < sizeof EW2_OPS / sizeof *EW2_OPS; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3), y = input(&c, t, 0.5, 2);
    snprintf(what, sizeof what, "%s %s", ir_ops[EW2_OPS[i]].name, ir_dtype_name(dt));
    check1(&c, E2(&c, EW2_OPS[i], x, y), what);
    g_covered[EW2_OPS[i]] = 1;
    case_free(&c);
  }
  { /* eq: inputs from a small integer range, so about a third are equal */
    Case c;
    case_init(&c);
    int x = input(&c, TY(IR_I32, 5, 37), 0, 3), y = input(&c, TY(IR_I32, 5, 37), 0, 3);
    IrType ft = t;
    int xf = emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &ft), yf = emit(&c, IR_OP_CAST, &y, 1, NULL, NULL, &ft);
    int id = E2(&c, IR_OP_EQ, xf, yf);
    snprintf(what, sizeof what, "cast+eq %s", ir_dtype_name(dt));
    check_group(&c, (int[]){xf, yf, id}, 3, what, RUN_PIECES);
    g_covered[IR_OP_EQ] = g_covered[IR_OP_CAST] = 1;
    case_free(&c);
  }
  { /* ne_scalar of i32 ids, and cast float -> i32 (saturating) and back */
    Case c;
    case_init(&c);
    int ids = input(&c, TY(IR_I32, 5, 37), -2, 3);
    int ne = emit(&c, IR_OP_NE_SCALAR, &ids, 1, NULL, (double[]){1}, &t);
    snprintf(what, sizeof what, "ne_scalar %s", ir_dtype_name(dt));
    check1(&c, ne, what);
    int x = input(&c, t, -1e10, 1e10);
    IrType it = TY(IR_I32, 5, 37);
    int ci = emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &it);
    snprintf(what, sizeof what, "cast %s -> i32", ir_dtype_name(dt));
    check_group(&c, &ci, 1, what, RUN_PIECES | RUN_C);
    g_covered[IR_OP_NE_SCALAR] = 1;
    case_free(&c);
  }
  { /* cmp, every predicate, on floats from a small integer range (ties) and
     * on i32; where picking between floats by a float and an i32 mask */
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2), y = input(&c, t, -2, 2);
    IrType it = TY(IR_I32, 5, 37);
    int xi = input(&c, it, -3, 3), yi = input(&c, it, -3, 3);
    int xr = emit(&c, IR_OP_CAST, &xi, 1, NULL, NULL, &t), yr = emit(&c, IR_OP_CAST, &yi, 1, NULL, NULL, &t);
    for (int64_t pred = 0; pred < 6; pred++) {
      snprintf(what, sizeof what, "cmp pred=%lld %s", (long long)pred, ir_dtype_name(dt));
      check1(&c, emit(&c, IR_OP_CMP, (int[]){x, y}, 2, &pred, NULL, NULL), what);
      check_group(&c, (int[]){xr, yr, emit(&c, IR_OP_CMP, (int[]){xr, yr}, 2, &pred, NULL, NULL)}, 3, what, RUN_PIECES);
      snprintf(what, sizeof what, "cmp pred=%lld i32", (long long)pred);
      check1(&c, emit(&c, IR_OP_CMP, (int[]){xi, yi}, 2, &pred, NULL, NULL), what);
    }
    int lt = emit(&c, IR_OP_CMP, (int[]){x, y}, 2, (int64_t[]){2}, NULL, NULL);
    snprintf(what, sizeof what, "where %s", ir_dtype_name(dt));
    check_group(&c, (int[]){lt, emit(&c, IR_OP_WHERE, (int[]){lt, x, y}, 3, NULL, NULL, NULL)}, 2, what, RUN_PIECES);
    check1(&c, emit(&c, IR_OP_WHERE, (int[]){xi, x, y}, 3, NULL, NULL, NULL), what);
    /* floordiv and mod of i32, negative operands and zero divisors (0) */
    snprintf(what, sizeof what, "floordiv i32");
    check1(&c, E2(&c, IR_OP_FLOORDIV, xi, yi), what);
    snprintf(what, sizeof what, "mod i32");
    check1(&c, E2(&c, IR_OP_MOD, xi, yi), what);
    g_covered[IR_OP_CMP] = g_covered[IR_OP_WHERE] = g_covered[IR_OP_FLOORDIV] = g_covered[IR_OP_MOD] = 1;
    case_free(&c);
  }
  { /* masked_fill with an i32 and a float mask; causal_mask; full; broadcast */
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3), ikeep = input(&c, TY(IR_I32, 5, 37), 0, 2), fkeep = input(&c, t, -1, 1);
    int keep = emit(&c, IR_OP_CAST, &ikeep, 1, NULL, NULL, &t);
    int relu_keep = E1(&c, IR_OP_RELU, fkeep);
    snprintf(what, sizeof what, "masked_fill %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_MASKED_FILL, (int[]){x, keep}, 2, NULL, (double[]){-1e9}, NULL), what);
    int mf = emit(&c, IR_OP_MASKED_FILL, (int[]){x, relu_keep}, 2, NULL, (double[]){-7}, NULL);
    check_group(&c, (int[]){relu_keep, mf}, 2, what, RUN_PIECES);
    int s = input(&c, TY(dt, 2, 3, 7, 6), -2, 2);
    snprintf(what, sizeof what, "causal_mask %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_CAUSAL_MASK, &s, 1, NULL, (double[]){-INFINITY}, NULL), what);
    IrType ft = TY(dt, 3, 4);
    snprintf(what, sizeof what, "full %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_FULL, NULL, 0, NULL, (double[]){2.5}, &ft), what);
    int bias = input(&c, TY(dt, 37), -1, 1), col = input(&c, TY(dt, 5, 1), -1, 1), mid = input(&c, TY(dt, 3, 1, 4), -1, 1);
    snprintf(what, sizeof what, "broadcast %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_BROADCAST, &bias, 1, NULL, NULL, &t), what);
    check1(&c, emit(&c, IR_OP_BROADCAST, &col, 1, NULL, NULL, &t), what);
    IrType big = TY(dt, 2, 3, 5, 4);
    check1(&c, emit(&c, IR_OP_BROADCAST, &mid, 1, NULL, NULL, &big), what);
    /* arange along each axis of a 3-D type, float and i32, and fused with
     * what reads it (ALiBi's slopes: exp(float(arange) * c)) */
    IrType at = TY(dt, 3, 4, 5), ai = TY(IR_I32, 3, 4, 5);
    for (int64_t ax = 0; ax < 3; ax++) {
      snprintf(what, sizeof what, "arange axis=%lld %s", (long long)ax, ir_dtype_name(dt));
      check1(&c, emit(&c, IR_OP_ARANGE, NULL, 0, &ax, (double[]){-1.5, 0.25}, &at), what);
      snprintf(what, sizeof what, "arange axis=%lld i32", (long long)ax);
      check1(&c, emit(&c, IR_OP_ARANGE, NULL, 0, &ax, (double[]){1, 1}, &ai), what);
    }
    IrType hs = TY(IR_I32, 8), hf = TY(dt, 8);
    int h = emit(&c, IR_OP_ARANGE, NULL, 0, (int64_t[]){0}, (double[]){1, 1}, &hs);
    int hx = emit(&c, IR_OP_CAST, &h, 1, NULL, NULL, &hf);
    int hm = emit(&c, IR_OP_MULS, &hx, 1, NULL, (double[]){-0.6931471805599453}, NULL);
    snprintf(what, sizeof what, "ALiBi slopes exp(float(arange) * c) %s", ir_dtype_name(dt));
    check_group(&c, (int[]){h, hx, hm, E1(&c, IR_OP_EXP, hm)}, 4, what, RUN_PIECES);
    g_covered[IR_OP_MASKED_FILL] = g_covered[IR_OP_CAUSAL_MASK] = g_covered[IR_OP_FULL] = g_covered[IR_OP_BROADCAST] = 1;
    g_covered[IR_OP_ARANGE] = 1;
    case_free(&c);
  }
}

static void test_rows(IrDtype dt) {
  char what[96];
  IrType t = TY(dt, 3, 4, 29);
  static const IrOp R1[] = {IR_OP_SOFTMAX, IR_OP_LOG_SOFTMAX, IR_OP_LAYERNORM, IR_OP_RMSNORM};
  static const IrOp R2[] = {IR_OP_SOFTMAX_BWD, IR_OP_LOG_SOFTMAX_BWD, IR_OP_LAYERNORM_BWD, IR_OP_RMSNORM_BWD};
  for (int i = 0; i < 4; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -4, 4), dy = input(&c, t, -1, 1);
    snprintf(what, sizeof what, "%s %s", ir_ops[R1[i]].name, ir_dtype_name(dt));
    check1(&c, emit(&c, R1[i], &x, 1, NULL, (double[]){1e-5}, NULL), what);
    snprintf(what, sizeof what, "%s %s", ir_ops[R2[i]].name, ir_dtype_name(dt));
    check_group(&c, (int[]){emit(&c, R2[i], (int[]){x, dy}, 2, NULL, (double[]){1e-5}, NULL)}, 1, what, RUN_THREADS);
    g_covered[R1[i]] = g_covered[R2[i]] = 1;
    case_free(&c);
  }
  { /* softmax of a fully masked row stays finite (0/0 guarded like the reference) */
    Case c;
    case_init(&c);
    int x = input(&c, TY(dt, 4, 8), -1, 1);
    int cm = emit(&c, IR_OP_CAUSAL_MASK, &x, 1, NULL, (double[]){-INFINITY}, NULL);
    int sm = E1(&c, IR_OP_SOFTMAX, cm);
    snprintf(what, sizeof what, "causal_mask+softmax %s", ir_dtype_name(dt));
    check_group(&c, (int[]){cm, sm}, 2, what, RUN_PIECES);
    case_free(&c);
  }
  { /* cross-entropy (+bwd), V = 53, some targets ignored (-1) */
    Case c;
    case_init(&c);
    int lg = input(&c, TY(dt, 2, 5, 53), -5, 5), tg = input(&c, TY(IR_I32, 2, 5), -1, 53);
    int dl = input(&c, TY(dt, 2, 5), 0.1, 1);
    snprintf(what, sizeof what, "cross_entropy %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_CROSS_ENTROPY, (int[]){lg, tg}, 2, (int64_t[]){-1}, NULL, NULL), what);
    snprintf(what, sizeof what, "cross_entropy_bwd %s", ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_CROSS_ENTROPY_BWD, (int[]){lg, tg, dl}, 3, (int64_t[]){-1}, NULL, NULL), what);
    g_covered[IR_OP_CROSS_ENTROPY] = g_covered[IR_OP_CROSS_ENTROPY_BWD] = 1;
    case_free(&c);
  }
  /* reductions along every axis, with and without keepdim; sumsq */
  static const IrOp RED[] = {IR_OP_SUM, IR_OP_MEAN, IR_OP_MAX};
  for (int r = 0; r < 3; r++)
    for (int ax = 0; ax < 3; ax++) {
      Case c;
      case_init(&c);
      int x = input(&c, t, -2, 2);
      snprintf(what, sizeof what, "%s axis=%d %s", ir_ops[RED[r]].name, ax, ir_dtype_name(dt));
      check1(&c, emit(&c, RED[r], &x, 1, (int64_t[]){ax, ax & 1}, NULL, NULL), what);
      g_covered[RED[r]] = 1;
      case_free(&c);
    }
  for (int ax = 0; ax < 3; ax += 2) {   /* a NaN wins a max reduction, as in the reference */
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2);
    if (dt == IR_F32) ((float *)c.data[0])[7] = NAN;
    else ((double *)c.data[0])[7] = NAN;
    snprintf(what, sizeof what, "max with a NaN, axis=%d %s", ax, ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_MAX, &x, 1, (int64_t[]){ax, 0}, NULL, NULL), what);
    case_free(&c);
  }
  Case c;
  case_init(&c);
  int x = input(&c, t, -2, 2);
  snprintf(what, sizeof what, "sumsq %s", ir_dtype_name(dt));
  check1(&c, E1(&c, IR_OP_SUMSQ, x), what);
  g_covered[IR_OP_SUMSQ] = 1;
  case_free(&c);
}

/* ---- layout ops: standalone, and read by a fused elementwise node ---- */
static void test_layout(IrDtype dt) {
  char what[96];
  Case c;
  case_init(&c);
  IrType t4 = TY(dt, 2, 3, 4, 5);
  int x = input(&c, t4, -2, 2);
  IrType r1 = TY(dt, 6, 20), r2 = TY(dt, 120);
  snprintf(what, sizeof what, "reshape %s", ir_dtype_name(dt));
  check1(&c, emit(&c, IR_OP_RESHAPE, &x, 1, NULL, NULL, &r1), what);
  check1(&c, emit(&c, IR_OP_RESHAPE, &x, 1, NULL, NULL, &r2), what);
  static const int64_t perms[3][4] = {{0, 2, 1, 3}, {3, 1, 0, 2}, {1, 2, 3, 0}};
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "permute #%d %s", i, ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_PERMUTE, &x, 1, perms[i], NULL, NULL), what);
  }
  static const int64_t sl[3][3] = {{0, 1, 2}, {2, 1, 3}, {3, 2, 5}};
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "slice axis=%lld %s", (long long)sl[i][0], ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_SLICE, &x, 1, sl[i], NULL, NULL), what);
  }
  static const int64_t pd[3][3] = {{0, 1, 0}, {1, 2, 1}, {3, 0, 3}};
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "pad axis=%lld %s", (long long)pd[i][0], ir_dtype_name(dt));
    check1(&c, emit(&c, IR_OP_PAD, &x, 1, pd[i], NULL, NULL), what);
  }
  int y = input(&c, TY(dt, 2, 1, 4, 5), -2, 2), z = input(&c, TY(dt, 2, 2, 4, 5), -2, 2);
  snprintf(what, sizeof what, "concat axis=1 %s", ir_dtype_name(dt));
  check1(&c, emit(&c, IR_OP_CONCAT, (int[]){y, x, z}, 3, (int64_t[]){1}, NULL, NULL), what);
  int w = input(&c, TY(dt, 2, 3, 4, 2), -2, 2);
  snprintf(what, sizeof what, "concat axis=3 %s", ir_dtype_name(dt));
  check1(&c, emit(&c, IR_OP_CONCAT, (int[]){x, w}, 2, (int64_t[]){3}, NULL, NULL), what);
  IrType s1 = TY(dt, 3, 1, 5), s2 = TY(dt, 4, 1), s3 = TY(dt, 1, 3, 1, 1), s0 = TY(dt, 1);
  snprintf(what, sizeof what, "sum_to %s", ir_dtype_name(dt));
  check_group(&c, (int[]){emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s1)}, 1, what, RUN_PIECES | RUN_C);
  check1(&c, emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s2), what);
  check1(&c, emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s3), what);
  check1(&c, emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s0), what);
  /* fused: heads back to [b, t, h, d] and a residual add; a slice into gelu */
  int p = emit(&c, IR_OP_PERMUTE, &x, 1, perms[0], NULL, NULL);
  int res = input(&c, c.m->blocks.a[c.b].nodes[p].type, -1, 1);
  int a = E2(&c, IR_OP_ADD, p, res);
  snprintf(what, sizeof what, "permute+add %s", ir_dtype_name(dt));
  check_group(&c, (int[]){p, a}, 2, what, RUN_PIECES | RUN_C);
  int sv = emit(&c, IR_OP_SLICE, &x, 1, sl[2], NULL, NULL), g = E1(&c, IR_OP_GELU_TANH, sv);
  int sm = E1(&c, IR_OP_SOFTMAX, g);
  snprintf(what, sizeof what, "slice+gelu+softmax %s", ir_dtype_name(dt));
  check_group(&c, (int[]){sv, g, sm}, 3, what, RUN_THREADS | RUN_C);
  g_covered[IR_OP_RESHAPE] = g_covered[IR_OP_PERMUTE] = g_covered[IR_OP_SLICE] = g_covered[IR_OP_PAD] = 1;
  g_covered[IR_OP_CONCAT] = g_covered[IR_OP_SUM_TO] = 1;
  case_free(&c);
}

/* ---- fused chains vs the nodes one by one ---- */
static void test_fused(IrDtype dt) {
  char what[96];
  int64_t R = 6, C = 67;
  IrType t = TY(dt, R, C);
  { /* bias add + gelu + residual add; the gelu is also used outside */
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2), b = input(&c, TY(dt, C), -1, 1), res = input(&c, t, -1, 1);
    int bb = emit(&c, IR_OP_BROADCAST, &b, 1, NULL, NULL, &t);
    int a = E2(&c, IR_OP_ADD, x, bb), g = E1(&c, IR_OP_GELU_TANH, a), y = E2(&c, IR_OP_ADD, g, res);
    E1(&c, IR_OP_EXP, g);   /* a user after the group: g must be an output */
    snprintf(what, sizeof what, "bias+gelu+residual %s", ir_dtype_name(dt));
    check_group(&c, (int[]){bb, a, g, y}, 4, what, RUN_THREADS | RUN_C);
    check_group(&c, (int[]){bb, a, g, y}, 4, what, RUN_INPLACE);
    case_free(&c);
  }
  { /* layernorm with its affine */
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3), gm = input(&c, TY(dt, C), 0.5, 1.5), be = input(&c, TY(dt, C), -1, 1);
    int ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
    int g = emit(&c, IR_OP_BROADCAST, &gm, 1, NULL, NULL, &t), bt = emit(&c, IR_OP_BROADCAST, &be, 1, NULL, NULL, &t);
    int mu = E2(&c, IR_OP_MUL, ln, g), y = E2(&c, IR_OP_ADD, mu, bt);
    snprintf(what, sizeof what, "layernorm+affine %s", ir_dtype_name(dt));
    check_group(&c, (int[]){ln, g, bt, mu, y}, 5, what, RUN_PIECES | RUN_C);
    case_free(&c);
  }
  { /* attention scores: scale, causal mask, softmax */
    Case c;
    case_init(&c);
    int s = input(&c, TY(dt, 2, 3, 9, 9), -4, 4);
    int sc = emit(&c, IR_OP_MULS, &s, 1, NULL, (double[]){0.125}, NULL);
    int cm = emit(&c, IR_OP_CAUSAL_MASK, &sc, 1, NULL, (double[]){-INFINITY}, NULL);
    int sm = E1(&c, IR_OP_SOFTMAX, cm);
    snprintf(what, sizeof what, "scale+causal+softmax %s", ir_dtype_name(dt));
    check_group(&c, (int[]){sc, cm, sm}, 3, what, RUN_PIECES | RUN_C);
    case_free(&c);
  }
  { /* logits scaled then cross-entropy and its backward in one kernel */
    Case c;
    case_init(&c);
    int lg = input(&c, t, -3, 3), tg = input(&c, TY(IR_I32, R), 0, C), dl = input(&c, TY(dt, R), 0.1, 1);
    int sc = emit(&c, IR_OP_MULS, &lg, 1, NULL, (double[]){2}, NULL);
    int ce = emit(&c, IR_OP_CROSS_ENTROPY, (int[]){sc, tg}, 2, (int64_t[]){-100}, NULL, NULL);
    int cb = emit(&c, IR_OP_CROSS_ENTROPY_BWD, (int[]){sc, tg, dl}, 3, (int64_t[]){-100}, NULL, NULL);
    E1(&c, IR_OP_NEG, ce);
    snprintf(what, sizeof what, "scale+cross_entropy+bwd %s", ir_dtype_name(dt));
    check_group(&c, (int[]){sc, ce, cb}, 3, what, RUN_THREADS | RUN_C);
    check_group(&c, (int[]){sc, ce, cb}, 3, what, RUN_INPLACE);
    case_free(&c);
  }
  { /* a chain ending in a reduction: mean over the last axis of (x - y)^2 */
    Case c;
    case_init(&c);
    int x = input(&c, t, -1, 1), y = input(&c, t, -1, 1);
    int d = E2(&c, IR_OP_SUB, x, y), sq = E2(&c, IR_OP_MUL, d, d);
    int mn = emit(&c, IR_OP_MEAN, &sq, 1, (int64_t[]){1, 1}, NULL, NULL);
    snprintf(what, sizeof what, "sub+square+mean %s", ir_dtype_name(dt));
    check_group(&c, (int[]){d, sq, mn}, 3, what, RUN_PIECES | RUN_C);
    case_free(&c);
  }
  { /* two independent outputs, the first overwriting the input of the
     * second (in place): all loads must come before the stores */
    Case c;
    case_init(&c);
    int x = input(&c, t, -1, 1), y = input(&c, t, -1, 1);
    int a = E1(&c, IR_OP_NEG, y), e = E1(&c, IR_OP_EXP, x);
    E1(&c, IR_OP_NEG, a);
    snprintf(what, sizeof what, "neg, exp in place %s", ir_dtype_name(dt));
    check_group(&c, (int[]){a, e}, 2, what, RUN_INPLACE);
    case_free(&c);
  }
  { /* two row ops in one group: layernorm, scale, softmax (the softmax's
     * loops recompute the layernorm from its statistics) */
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3);
    int ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
    int sc = emit(&c, IR_OP_MULS, &ln, 1, NULL, (double[]){1.5}, NULL);
    int sm = E1(&c, IR_OP_SOFTMAX, sc), ls = E1(&c, IR_OP_LOG_SOFTMAX, sm);
    snprintf(what, sizeof what, "layernorm+scale+softmax+log_softmax %s", ir_dtype_name(dt));
    check_group(&c, (int[]){ln, sc, sm, ls}, 4, what, RUN_INPLACE);
    case_free(&c);
  }
  { /* a long chain (more nodes than kernel buffers) ending in a sum */
    Case c;
    case_init(&c);
    int x = input(&c, t, -1, 1), v = x, ids[48], n = 0;
    for (int i = 0; i < 40; i++) {
      v = emit(&c, i % 2 ? IR_OP_ADDS : IR_OP_MULS, &v, 1, NULL, (double[]){i % 2 ? 0.25 : 0.9}, NULL);
      ids[n++] = v;
    }
    ids[n++] = emit(&c, IR_OP_SUM, &v, 1, (int64_t[]){1, 0}, NULL, NULL);
    snprintf(what, sizeof what, "40 scalar ops + sum %s", ir_dtype_name(dt));
    check_group(&c, ids, n, what, RUN_PIECES);
    case_free(&c);
  }
  { /* rmsnorm backward of a silu output, then the product with a gain */
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2), dy = input(&c, t, -1, 1), gm = input(&c, TY(dt, C), 0.5, 1.5);
    int s = E1(&c, IR_OP_SILU, x);
    int rb = emit(&c, IR_OP_RMSNORM_BWD, (int[]){s, dy}, 2, NULL, (double[]){1e-6}, NULL);
    int g = emit(&c, IR_OP_BROADCAST, &gm, 1, NULL, NULL, &t);
    int y = E2(&c, IR_OP_MUL, rb, g);
    snprintf(what, sizeof what, "silu+rmsnorm_bwd+gain %s", ir_dtype_name(dt));
    check_group(&c, (int[]){s, rb, g, y}, 4, what, RUN_PIECES);
    case_free(&c);
  }
}

/* ---- printer, verifier, lowering errors, vector code ---- */
static void test_printer(void) {
  Case c;
  case_init(&c);
  int x = input(&c, TY(IR_F32, 2, 3), -1, 1);
  int s = E1(&c, IR_OP_SOFTMAX, x);
  CgGroupIO io;
  CgKernel *k = cg_lower_group(c.m, &c.m->blocks.a[c.b], &s, 1, &io, err, sizeof err);
  TS_ASSERT(k);
  StrBuf sb = {0};
  cg_kernel_print(k, &sb);
  const char *want =
      "kernel softmax_f32(b0: f32[6] in, b1: f32[6] out) grid=2\n"
      "  %0 = gid : i64\n"
      "  %1 = const 3 : i64\n"
      "  %2 = mul %0, %1 : i64\n"
      "  %3 = acc max init=-inf : f64\n"
      "  %4 = const 3 : i64\n"
      "  %5 = range %4 : i64 {\n"
      "    %6 = add %2, %5 : i64\n"
      "    %7 = load b0[%6] : f32\n"
      "    %8 = cast %7 : f64\n"
      "    update %3, %8\n"
      "  }\n"
      "  %11 = const 0.0 : f64\n"
      "  %12 = const -inf : f64\n"
      "  %13 = eq %3, %12 : i1\n"
      "  %14 = select %13, %11, %3 : f64\n"
      "  %15 = acc sum init=0.0 : f64\n"
      "  %16 = const 3 : i64\n"
      "  %17 = range %16 : i64 {\n"
      "    %18 = add %2, %17 : i64\n"
      "    %19 = load b0[%18] : f32\n"
      "    %20 = cast %19 : f64\n"
      "    %21 = sub %20, %14 : f64\n"
      "    %22 = const -7e+02 : f64\n"
      "    %23 = lt %21, %22 : i1\n"
      "    %24 = const -7e+02 : f64\n"
      "    %25 = select %23, %24, %21 : f64\n"
      "    %26 = exp %25 : f64\n"
      "    %27 = const 0.0 : f64\n"
      "    %28 = select %23, %27, %26 : f64\n"
      "    update %15, %28\n"
      "  }\n"
      "  %31 = const 3 : i64\n"
      "  %32 = range %31 : i64 {\n"
      "    %33 = add %2, %32 : i64\n"
      "    %34 = load b0[%33] : f32\n"
      "    %35 = cast %34 : f64\n"
      "    %36 = sub %35, %14 : f64\n"
      "    %37 = const -7e+02 : f64\n"
      "    %38 = lt %36, %37 : i1\n"
      "    %39 = const -7e+02 : f64\n"
      "    %40 = select %38, %39, %36 : f64\n"
      "    %41 = exp %40 : f64\n"
      "    %42 = const 0.0 : f64\n"
      "    %43 = select %38, %42, %41 : f64\n"
      "    %44 = div %43, %15 : f64\n"
      "    %45 = cast %44 : f32\n"
      "    %46 = cast %45 : f64\n"
      "    store b1[%33], %45\n"
      "  }\n";
  CHECK(sb.p && strcmp(sb.p, want) == 0, "printer: softmax kernel text differs:\n%s\nexpected:\n%s",
        sb.p ? sb.p : "", want);
  sb_free(&sb);
  cg_kernel_free(k);
  case_free(&c);
}

static void test_errors(void) {
  /* verifier: a value used after its loop closed */
  CgKernel *k = cg_kernel_new("bad", 4);
  int b0 = cg_buf(k, CG_F64, 4, 1), gid = cg_gid(k);
  int r = cg_range(k, cg_const_i(k, CG_I64, 2));
  int v = cg_cast(k, CG_F64, r);
  cg_end(k);
  cg_store(k, b0, gid, v);
  CHECK(cg_kernel_verify(k, err, sizeof err) != 0 && strstr(err, "outside its loop"), "verifier: scope error not caught (%s)", err);
  cg_kernel_free(k);
  k = cg_kernel_new("bad2", 4);
  b0 = cg_buf(k, CG_F64, 4, 0);
  gid = cg_gid(k);
  cg_store(k, b0, gid, cg_const_f(k, CG_F64, 1));
  CHECK(cg_kernel_verify(k, err, sizeof err) != 0 && strstr(err, "read-only"), "verifier: store to input not caught (%s)", err);
  char e2[256];
  CHECK(cg_jit_compile(g_jit, k, e2, sizeof e2) == NULL, "JIT accepted an invalid kernel");
  cg_kernel_free(k);

  Case c;
  case_init(&c);
  int a = input(&c, TY(IR_F32, 4, 8), -1, 1), w = input(&c, TY(IR_F32, 8, 8), -1, 1);
  int mm = E2(&c, IR_OP_MATMUL, a, w);
  CgGroupIO io;
  CHECK(cg_lower_group(c.m, &c.m->blocks.a[c.b], &mm, 1, &io, err, sizeof err) == NULL && strstr(err, "matmul"),
        "lowering: matmul should be refused (%s)", err);
  int sm = emit(&c, IR_OP_SUM, &a, 1, (int64_t[]){1, 1}, NULL, NULL);
  int bc = emit(&c, IR_OP_BROADCAST, &sm, 1, NULL, NULL, &c.m->blocks.a[c.b].nodes[a].type);
  int ad = E2(&c, IR_OP_ADD, a, bc);
  CHECK(cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){sm, bc, ad}, 3, &io, err, sizeof err) == NULL,
        "lowering: a reduction used inside its group should be refused");
  CHECK(cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){ad, sm}, 2, &io, err, sizeof err) == NULL && strstr(err, "ascending"),
        "lowering: unordered nodes should be refused (%s)", err);
  int s0 = emit(&c, IR_OP_SUM, &a, 1, (int64_t[]){0, 0}, NULL, NULL), e0 = E1(&c, IR_OP_EXP, a);
  CHECK(cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){s0, e0}, 2, &io, err, sizeof err) == NULL && strstr(err, "last axis"),
        "lowering: a fused reduction over axis 0 should be refused (%s)", err);
  /* not convex: %ad's operand %ex is computed outside the group from %e1 in it */
  int e1 = E1(&c, IR_OP_EXP, a), ex = E1(&c, IR_OP_NEG, e1), ad2 = E2(&c, IR_OP_ADD, e1, ex);
  CHECK(cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){e1, ad2}, 2, &io, err, sizeof err) == NULL && strstr(err, "convex"),
        "lowering: a non-convex group should be refused (%s)", err);
  CgKernel *whole = cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){e1, ex, ad2}, 3, &io, err, sizeof err);
  CHECK(whole != NULL && io.nin == 1 && io.nout == 1, "lowering: the convex group {exp, neg, add} should lower (%s)", err);
  cg_kernel_free(whole);
  case_free(&c);
}

/* The optimized code of a flat kernel and of a row kernel uses vectors. */
static void test_vector_code(void) {
  Case c;
  case_init(&c);
  int x = input(&c, TY(IR_F32, 64, 256), -1, 1), y = input(&c, TY(IR_F32, 64, 256), -1, 1);
  int ad = E2(&c, IR_OP_ADD, x, y), ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
  int ids[2] = {ad, ln};
  const char *cpu = cg_jit_cpu(g_jit);
  int avx2 = strstr(cpu, "+avx2") != NULL, avx512 = strstr(cpu, "+avx512f") != NULL;
  printf("host: %.60s... avx2=%d avx512f=%d\n", cpu, avx2, avx512);
  for (int i = 0; i < 2; i++) {
    CgGroupIO io;
    CgKernel *k = cg_lower_group(c.m, &c.m->blocks.a[c.b], &ids[i], 1, &io, err, sizeof err);
    TS_ASSERT(k);
    StrBuf ir = {0}, as = {0};
    CHECK(cg_kernel_llvm_text(k, 1, &ir, err, sizeof err) == 0, "llvm text: %s", err);
    CHECK(ir.p && strstr(ir.p, "define void @") && (strstr(ir.p, " x double>") || strstr(ir.p, " x float>")),
          "%s: optimized IR has no vectors",
          k->name);
    CHECK(cg_kernel_asm_text(k, &as, err, sizeof err) == 0, "asm: %s", err);
    if (avx2) CHECK(as.p && (strstr(as.p, "ymm") || strstr(as.p, "zmm")), "%s: no AVX registers in the assembly", k->name);
    sb_free(&ir);
    sb_free(&as);
    cg_kernel_free(k);
  }
  case_free(&c);
}

/* The pool gives exactly what one thread gives (every element is computed
 * by the same code whichever thread runs it), over many runs, for spaces
 * larger and smaller than the thread count. */
static void test_pool(void) {
  Case c;
  case_init(&c);
  IrType t = TY(IR_F32, 37, 29);
  int x = input(&c, t, -3, 3), y = input(&c, t, -1, 1);
  int ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL), a = E2(&c, IR_OP_ADD, ln, y);
  CgGroupIO io;
  CgKernel *k = cg_lower_group(c.m, &c.m->blocks.a[c.b], (int[]){ln, a}, 2, &io, err, sizeof err);
  TS_ASSERT(k && io.nin == 2 && io.nout == 1);
  CgFn fn = cg_jit_compile(g_jit, k, err, sizeof err);
  TS_ASSERT(fn);
  size_t bytes = (size_t)ir_type_numel(&t) * sizeof(float);
  float *want = ts_xmalloc(bytes), *got = ts_xmalloc(bytes);
  void *bufs[3] = {c.data[0], c.data[1], want};
  fn(bufs, 0, k->grid);
  bufs[2] = got;
  for (int nt = 1; nt <= 3; nt++) {
    CgPool *pool = cg_pool_new(nt);
    CHECK(cg_pool_threads(pool) == nt, "pool: %d threads, asked %d", cg_pool_threads(pool), nt);
    int same = 1;
    for (int r = 0; r < 50 && same; r++) {
      memset(got, 0xff, bytes);
      cg_pool_run(pool, fn, bufs, r % 2 ? k->grid : 2);   /* 2 rows: fewer than the threads */
      same = memcmp(got, want, r % 2 ? bytes : 2 * 29 * sizeof(float)) == 0;
    }
    CHECK(same, "pool of %d threads: results differ from one thread", nt);
    cg_pool_free(pool);
  }
  free(want);
  free(got);
  cg_kernel_free(k);
  case_free(&c);
}

int main(int argc, char **argv) {
  g_cuda = argc > 1 && strcmp(argv[1], "--cuda") == 0;
  codegen_test_init();
  test_printer();
  test_errors();
  test_vector_code();
  test_pool();
  IrDtype dts[2] = {IR_F32, IR_F64};
  for (int i = 0; i < 2; i++) {
    test_elementwise(dts[i]);
    test_rows(dts[i]);
    test_layout(dts[i]);
    test_fused(dts[i]);
  }
  /* every op the lowering accepts has a case above; dropout's and rand's
   * kernels need run-time scalars and are checked bit for bit in
   * test_dropout.c */
  g_covered[IR_OP_DROPOUT] = g_covered[IR_OP_RAND] = 1;
  for (int op = 0; op < IR_OP_COUNT; op++)
    CHECK(!cg_op_lowerable((IrOp)op) || g_covered[op], "op %s is lowerable but has no test", ir_ops[op].name);
  /* identical kernels (the same op and shapes, as in every layer) compile once */
  CHECK(cg_jit_cache_hits(g_jit) > 0, "JIT cache: no kernel was reused");
  {
    Case c;
    case_init(&c);
    int x = input(&c, TY(IR_F32, 3, 11), -1, 1);
    int a = E1(&c, IR_OP_TANH, x), b = E1(&c, IR_OP_TANH, x);
    CgGroupIO io;
    CgKernel *ka = cg_lower_group(c.m, &c.m->blocks.a[c.b], &a, 1, &io, err, sizeof err);
    CgKernel *kb = cg_lower_group(c.m, &c.m->blocks.a[c.b], &b, 1, &io, err, sizeof err);
    int before = cg_jit_cache_hits(g_jit);
    CgFn fa = cg_jit_compile(g_jit, ka, err, sizeof err), fb = cg_jit_compile(g_jit, kb, err, sizeof err);
    CHECK(fa && fa == fb && cg_jit_cache_hits(g_jit) == before + 1, "JIT cache: the same kernel compiled twice");
    cg_kernel_free(ka);
    cg_kernel_free(kb);
    case_free(&c);
  }
  cg_jit_free(g_jit);
  if (g_cuda) cuda_run_all();
  return check_exit("test_codegen");
}
