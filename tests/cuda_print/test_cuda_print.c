/* test_cuda_print.c - the CUDA printer (codegen/cuda.c) on every kind of
 * kernel the executor generates.
 *
 * Every case builds a small tensor-IR module, lowers a group of its nodes
 * (cg_lower_group_opts with f32 arithmetic for f32 groups, as the executor's
 * CUDA path; AdamW's kernel as runtime/exec/exec_jit.c builds it), runs
 * the reference runtime node by node and the LLVM JIT on the same inputs,
 * and prints the kernel as CUDA C into ONE module (prelude + all kernels).
 * Then, by mode (argv[1]):
 *   emu       the module is compiled for the CUDA emulator (tests/cuda)
 *             and every kernel launched on its inputs -- with its own
 *             launch and again with at most 3 blocks (the grid-stride
 *             loops) -- and compared with the reference and the JIT:
 *             f32 within 1e-5 relative, f64 within 1e-12 (rel_ok); in
 *             place cases run with an output on its input's memory, AdamW
 *             also at a parameter chunk that is not 16-byte aligned;
 *   sm_80, sm_90 [PART PARTS]  the module (part PART of PARTS of it) is
 *             compiled with NVRTC for that arch: no error, no warning,
 *             every kernel in ptxas' report with no spill and no stack
 *             frame (cg_ptxas_check's limits too);
 *   shape     the mode, launch and text of chosen kernels: row mode with
 *             block reductions for softmax, 16-byte vectors for an f32 add
 *             of 256 elements and none for 185 ...;
 *   --emit F  writes the module to F (nvcc_check.sh compiles it with nvcc).
 * Shapes are multiples of the vector widths and not, rows shorter than a
 * warp and longer than the block. */
#include "codegen/cg.h"
#include "codegen/cuda.h"
#include "runtime/cpu/half.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include "../check.h"
#ifdef TS_EMU_HEADER
#include "emu_host.h"
#endif

static char err[4096];
static CgJit *g_jit;

/* ---- deterministic inputs ---- */
static uint64_t g_rs = 0xc0da;
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

static size_t cg_size(CgType t) { return t == CG_F64 ? 8 : cg_type_is_half(t) ? 2 : 4; }
static size_t bytes_of(const CgBuf *b) { return (size_t)b->n * cg_size(b->type); }
static double ldc(const void *p, CgType t, int64_t i) {
  return t == CG_F32    ? ((const float *)p)[i]
         : t == CG_F64  ? ((const double *)p)[i]
         : t == CG_BF16 ? ts_bf16_to_f32(((const uint16_t *)p)[i])
         : t == CG_F16  ? ts_f16_to_f32(((const uint16_t *)p)[i])
                        : ((const int32_t *)p)[i];
}
static double ldd(const void *p, IrDtype t, int64_t i) {
  return t == IR_F32    ? ((const float *)p)[i]
         : t == IR_F64  ? ((const double *)p)[i]
         : t == IR_BF16 ? ts_bf16_to_f32(((const uint16_t *)p)[i])
         : t == IR_F16  ? ts_f16_to_f32(((const uint16_t *)p)[i])
                        : ((const int32_t *)p)[i];
}

/* |got - want| <= tol * |want|, exact values (0, inf, NaN) equal; a floor
 * of tol * 1e-3 absolute for results that cancel near 0 (as test_codegen). */
static int rel_ok(double got, double want, double tol) {
  if (got == want || (isnan(got) && isnan(want))) return 1;
  return fabs(got - want) <= tol * fmax(fabs(want), 1e-3);
}

/* ---- a kept kernel: the printed CUDA with its inputs and expected outputs ---- */
typedef struct {
  char what[96];
  CgCudaLaunch l;
  size_t text_at, text_end;      /* its text in g_src */
  int nbuf, nin;                 /* buffers [0, nin) are read, [nin, nbuf) written */
  CgBuf buf[CG_MAX_BUFS];
  void *init[CG_MAX_BUFS];       /* every buffer's contents before the launch */
  void *jit[CG_MAX_BUFS];        /* written buffers after the LLVM kernel */
  double *ref[CG_MAX_BUFS];      /* written buffers per the reference (NULL: none) */
  int alias_out, alias_in;       /* in place: buffer alias_out is given alias_in's memory (-1: none) */
  int misalign;                  /* buffer nin (an optimizer step's param) one element past a 16-byte boundary */
  long long run[CG_RUN_WORDS];
} Kept;
static VEC(Kept) g_kept;
static StrBuf g_src;

/* Prints k (renamed unique) into the module and keeps it; init[] holds
 * every buffer's contents (outputs: what they hold before the launch). */
static Kept *keep(CgKernel *k, int nin, const char *what) {
  Kept kp;
  memset(&kp, 0, sizeof kp);
  snprintf(kp.what, sizeof kp.what, "%s", what);
  char name[64];
  snprintf(name, sizeof name, "k%d_%.40s", g_kept.n, k->name);
  snprintf(k->name, sizeof k->name, "%s", name);
  kp.text_at = g_src.n;
  int rc = cg_kernel_cuda_text(k, &g_src, &kp.l, err, sizeof err);
  CHECK(rc == 0, "%s: the CUDA printer failed: %s", what, err);
  kp.text_end = g_src.n;
  kp.nbuf = k->nbuf;
  kp.nin = nin;
  memcpy(kp.buf, k->buf, sizeof kp.buf);
  kp.alias_out = kp.alias_in = -1;
  for (int b = 0; b < k->nbuf; b++) kp.init[b] = ts_xcalloc(bytes_of(&k->buf[b]) + 16, 1);
  VEC_PUSH(g_kept, kp);
  return &g_kept.a[g_kept.n - 1];
}

static void kept_free(void) {
  for (int i = 0; i < g_kept.n; i++)
    for (int b = 0; b < g_kept.a[i].nbuf; b++) {
      free(g_kept.a[i].init[b]);
      free(g_kept.a[i].jit[b]);
      free(g_kept.a[i].ref[b]);
    }
  free(g_kept.a);
  sb_free(&g_src);
}

/* The text of kept kernel kp (a copy to free). */
static char *kept_text(const Kept *kp) {
  size_t n = kp->text_end - kp->text_at;
  char *s = ts_xmalloc(n + 1);
  memcpy(s, g_src.p + kp->text_at, n);
  s[n] = 0;
  return s;
}

/* Runs k through the LLVM JIT on kp's initial contents (in two pieces)
 * and keeps the written buffers. */
static void run_jit(CgKernel *k, Kept *kp) {
  CgFn fn = cg_jit_compile(g_jit, k, err, sizeof err);
  CHECK(fn != NULL, "%s: JIT: %s", kp->what, err);
  void *bufs[CG_MAX_BUFS + 1];
  for (int b = 0; b < kp->nbuf; b++) {
    bufs[b] = kp->init[b];
    if (b >= kp->nin) {
      kp->jit[b] = ts_xmalloc(bytes_of(&kp->buf[b]) + 16);
      memcpy(kp->jit[b], kp->init[b], bytes_of(&kp->buf[b]));
      bufs[b] = kp->jit[b];
    }
  }
  int64_t prm[CG_PARAM_COUNT] = {kp->run[CG_RUN_SEED], kp->run[CG_RUN_STEP], kp->run[CG_RUN_MICRO]};
  bufs[kp->nbuf] = prm;
  if (fn) {
    fn(bufs, 0, k->grid / 2);
    fn(bufs, k->grid / 2, k->grid);
  }
}

/* ---- a test module: inputs with random data, then nodes ---- */
#define MAXF 12
typedef struct {
  IrModule *m;
  int b, nfeed;
  RtFeed feeds[MAXF];
  int feed_id[MAXF];
  void *data[MAXF];
  char names[MAXF][16];
  RtRunInfo info;
} Case;

static void case_init(Case *c) {
  memset(c, 0, sizeof *c);
  c->m = ir_module_new("t");
  c->b = ir_block_add(c->m, "forward");
  c->info.lr = 1e-3;
}
static void case_free(Case *c) {
  ir_module_free(c->m);
  for (int i = 0; i < c->nfeed; i++) free(c->data[i]);
}

/* An input of type t, uniform in [lo, hi) (i32: integers in [lo, hi)). */
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
    else if (t.dtype == IR_BF16) ((uint16_t *)p)[k] = ts_f32_to_bf16((float)v);
    else if (t.dtype == IR_F16) ((uint16_t *)p)[k] = ts_f32_to_f16((float)v);
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

enum { PLAIN = 0, INPLACE = 1 };

/* Lowers nodes[0..n) of c, runs the reference (node by node, results read
 * back through accum into states) and the JIT, prints and keeps the
 * kernel.  INPLACE: the CUDA run gives the first output that can the
 * memory of the last input of its type and size. */
static Kept *group(Case *c, const int *nodes, int n, const char *what, int how) {
  IrModule *m = c->m;
  CgGroupIO io;
  CgLowerOpts lo = {.f32 = 1};   /* f32 arithmetic for f32 groups, as the executor's CUDA path */
  CgKernel *k = cg_lower_group_opts(m, &m->blocks.a[c->b], NULL, nodes, n, &io, &lo, err, sizeof err);
  CHECK(k != NULL, "%s: lowering failed: %s", what, err);
  if (!k) return NULL;
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
  int rc = rt_run_block(p, c->b, c->feeds, c->nfeed, &c->info, err, sizeof err);
  CHECK(rc == 0, "%s: reference run failed: %s", what, err);
  Kept *kp = NULL;
  if (rc == 0) {
    kp = keep(k, io.nin, what);
    kp->run[CG_RUN_SEED] = (long long)m->train.seed;
    kp->run[CG_RUN_STEP] = c->info.step;
    kp->run[CG_RUN_MICRO] = c->info.micro;
    for (int i = 0; i < io.nin; i++) {
      const void *src = NULL;
      for (int f = 0; f < c->nfeed; f++)
        if (c->feed_id[f] == io.in[i]) src = c->data[f];
      if (!src) src = rt_state_data(p, st_of[i]);   /* a float producer outside the group */
      memcpy(kp->init[i], src, bytes_of(&k->buf[i]));
    }
    for (int j = 0; j < io.nout; j++) {   /* poison: every element must be written */
      int b = io.nin + j, s = st_of[b];
      memset(kp->init[b], 0xff, bytes_of(&k->buf[b]));
      IrDtype st = m->states.a[s].type.dtype;
      kp->ref[b] = ts_xmalloc((size_t)k->buf[b].n * sizeof(double) + 8);
      for (int64_t e = 0; e < k->buf[b].n; e++) kp->ref[b][e] = ldd(rt_state_data(p, s), st, e);
    }
    for (int j = 0; j < io.nout && how == INPLACE && kp->alias_out < 0; j++)
      for (int i = io.nin - 1; i >= 0 && kp->alias_out < 0; i--)
        if (k->buf[i].type == k->buf[io.nin + j].type && k->buf[i].n == k->buf[io.nin + j].n) {
          kp->alias_out = io.nin + j;
          kp->alias_in = i;
        }
    CHECK(how != INPLACE || kp->alias_out >= 0, "%s: no output to run in place", what);
    run_jit(k, kp);
  }
  rt_program_free(p);
  cg_kernel_free(k);
  return kp;
}
static Kept *one(Case *c, int id, const char *what) { return group(c, &id, 1, what, PLAIN); }

/* ---- the cases ---- */
static const IrOp EW1[] = {IR_OP_NEG, IR_OP_EXP, IR_OP_TANH, IR_OP_GELU_TANH, IR_OP_GELU_ERF, IR_OP_SILU,
                           IR_OP_RELU, IR_OP_ADDS, IR_OP_MULS};
static const IrOp EWPOS[] = {IR_OP_LOG, IR_OP_SQRT, IR_OP_RSQRT};
static const IrOp EW2[] = {IR_OP_ADD, IR_OP_SUB, IR_OP_MUL, IR_OP_DIV, IR_OP_GELU_TANH_BWD,
                           IR_OP_GELU_ERF_BWD, IR_OP_SILU_BWD, IR_OP_RELU_BWD};
static unsigned char g_covered[IR_OP_COUNT];

/* The kernels the shape checks look at. */
static int g_add_vec[2], g_add_odd[2], g_cast_vec, g_cast_mixed, g_softmax_long[2], g_softmax_short[2];
static int g_sum_axis0, g_adamw_vec, g_adamw_odd, g_big, g_bf16_vec = -1, g_bf16_round = -1, g_f16_vec = -1,
           g_f16_round = -1;

/* Elementwise ops on R x C. */
static void ew(IrDtype dt, int64_t R, int64_t C) {
  IrType t = TY(dt, R, C);
  char what[96];
  const char *dn = ir_dtype_name(dt);
  for (size_t i = 0; i < sizeof EW1 / sizeof *EW1; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3);
    snprintf(what, sizeof what, "%s %s [%lld, %lld]", ir_ops[EW1[i]].name, dn, (long long)R, (long long)C);
    one(&c, emit(&c, EW1[i], &x, 1, NULL, (double[]){0.75}, NULL), what);
    g_covered[EW1[i]] = 1;
    case_free(&c);
  }
  for (size_t i = 0; i < sizeof EWPOS / sizeof *EWPOS; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, 0.01, 5);
    snprintf(what, sizeof what, "%s %s [%lld, %lld]", ir_ops[EWPOS[i]].name, dn, (long long)R, (long long)C);
    one(&c, E1(&c, EWPOS[i], x), what);
    g_covered[EWPOS[i]] = 1;
    case_free(&c);
  }
  for (size_t i = 0; i < sizeof EW2 / sizeof *EW2; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3), y = input(&c, t, 0.5, 2);
    snprintf(what, sizeof what, "%s %s [%lld, %lld]", ir_ops[EW2[i]].name, dn, (long long)R, (long long)C);
    one(&c, E2(&c, EW2[i], x, y), what);
    if (EW2[i] == IR_OP_ADD) {
      int *slot = (R * C) % 4 == 0 ? &g_add_vec[dt == IR_F64] : &g_add_odd[dt == IR_F64];
      *slot = g_kept.n - 1;
    }
    g_covered[EW2[i]] = 1;
    case_free(&c);
  }
  { /* cast to i32 (saturating: inputs beyond the range), eq, ne_scalar, in place */
    Case c;
    case_init(&c);
    IrType it = TY(IR_I32, R, C);
    int x = input(&c, t, -1e10, 1e10);
    snprintf(what, sizeof what, "cast %s -> i32 [%lld, %lld]", dn, (long long)R, (long long)C);
    one(&c, emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &it), what);
    if ((R * C) % 4 == 0) *(dt == IR_F32 ? &g_cast_vec : &g_cast_mixed) = g_kept.n - 1;
    int a = input(&c, it, 0, 3), b = input(&c, it, 0, 3);
    int af = emit(&c, IR_OP_CAST, &a, 1, NULL, NULL, &t), bf = emit(&c, IR_OP_CAST, &b, 1, NULL, NULL, &t);
    snprintf(what, sizeof what, "cast+eq %s", dn);
    group(&c, (int[]){af, bf, E2(&c, IR_OP_EQ, af, bf)}, 3, what, PLAIN);
    snprintf(what, sizeof what, "ne_scalar %s", dn);
    one(&c, emit(&c, IR_OP_NE_SCALAR, &a, 1, NULL, (double[]){1}, &t), what);
    int y = input(&c, t, -1, 1), e = E1(&c, IR_OP_EXP, y), ng = E1(&c, IR_OP_NEG, e);
    snprintf(what, sizeof what, "exp+neg in place %s", dn);
    group(&c, (int[]){e, ng}, 2, what, INPLACE);
    g_covered[IR_OP_CAST] = g_covered[IR_OP_EQ] = g_covered[IR_OP_NE_SCALAR] = 1;
    case_free(&c);
  }
  { /* integer tensors: cmp (every pred, i32 and float), floordiv / mod with
     * negative and zero divisors, where, i32 add / muls, each alone and fused */
    Case c;
    case_init(&c);
    IrType it = TY(IR_I32, R, C);
    int a = input(&c, it, -7, 7), b = input(&c, it, -3, 3), x = input(&c, t, -1, 1), y = input(&c, t, -1, 1);
    for (int64_t p = 0; p < 6; p++) {
      snprintf(what, sizeof what, "cmp pred=%lld i32 [%lld, %lld]", (long long)p, (long long)R, (long long)C);
      one(&c, emit(&c, IR_OP_CMP, (int[]){a, b}, 2, &p, NULL, NULL), what);
      snprintf(what, sizeof what, "cmp pred=%lld %s", (long long)p, dn);
      one(&c, emit(&c, IR_OP_CMP, (int[]){x, y}, 2, &p, NULL, NULL), what);
    }
    snprintf(what, sizeof what, "floordiv [%lld, %lld]", (long long)R, (long long)C);
    one(&c, E2(&c, IR_OP_FLOORDIV, a, b), what);
    snprintf(what, sizeof what, "mod [%lld, %lld]", (long long)R, (long long)C);
    one(&c, E2(&c, IR_OP_MOD, a, b), what);
    snprintf(what, sizeof what, "where %s", dn);
    one(&c, emit(&c, IR_OP_WHERE, (int[]){b, x, y}, 3, NULL, NULL, NULL), what);
    int64_t lt = 2;
    int m = emit(&c, IR_OP_CMP, (int[]){a, b}, 2, &lt, NULL, NULL), q = E2(&c, IR_OP_FLOORDIV, a, b);
    int s2 = E2(&c, IR_OP_ADD, q, a), w = emit(&c, IR_OP_MULS, &s2, 1, NULL, (double[]){-3}, NULL);
    int r = emit(&c, IR_OP_WHERE, (int[]){m, w, q}, 3, NULL, NULL, NULL);
    snprintf(what, sizeof what, "cmp+floordiv+add+muls+where i32 [%lld, %lld]", (long long)R, (long long)C);
    group(&c, (int[]){m, q, s2, w, r}, 5, what, PLAIN);
    g_covered[IR_OP_CMP] = g_covered[IR_OP_FLOORDIV] = g_covered[IR_OP_MOD] = g_covered[IR_OP_WHERE] = 1;
    case_free(&c);
  }
}

/* masked_fill, causal_mask, full, broadcast, arange. */
static void misc(IrDtype dt) {
  char what[96];
  const char *dn = ir_dtype_name(dt);
  IrType t = TY(dt, 5, 37);
  Case c;
  case_init(&c);
  int x = input(&c, t, -3, 3), ikeep = input(&c, TY(IR_I32, 5, 37), 0, 2), fkeep = input(&c, t, -1, 1);
  int keep = emit(&c, IR_OP_CAST, &ikeep, 1, NULL, NULL, &t), rk = E1(&c, IR_OP_RELU, fkeep);
  snprintf(what, sizeof what, "masked_fill %s", dn);
  one(&c, emit(&c, IR_OP_MASKED_FILL, (int[]){x, keep}, 2, NULL, (double[]){-1e9}, NULL), what);
  int mf = emit(&c, IR_OP_MASKED_FILL, (int[]){x, rk}, 2, NULL, (double[]){-7}, NULL);
  group(&c, (int[]){rk, mf}, 2, what, PLAIN);
  int s = input(&c, TY(dt, 2, 3, 7, 6), -2, 2);
  snprintf(what, sizeof what, "causal_mask %s", dn);
  one(&c, emit(&c, IR_OP_CAUSAL_MASK, &s, 1, NULL, (double[]){-INFINITY}, NULL), what);
  IrType ft = TY(dt, 3, 4);
  snprintf(what, sizeof what, "full %s", dn);
  one(&c, emit(&c, IR_OP_FULL, NULL, 0, NULL, (double[]){2.5}, &ft), what);
  int bias = input(&c, TY(dt, 37), -1, 1), col = input(&c, TY(dt, 5, 1), -1, 1);
  snprintf(what, sizeof what, "broadcast %s", dn);
  one(&c, emit(&c, IR_OP_BROADCAST, &bias, 1, NULL, NULL, &t), what);
  one(&c, emit(&c, IR_OP_BROADCAST, &col, 1, NULL, NULL, &t), what);
  /* arange along each axis (float and i32), and ALiBi's slopes exp(float(arange) * c) fused */
  IrType at = TY(dt, 3, 4, 5), ai = TY(IR_I32, 3, 4, 5);
  for (int64_t ax = 0; ax < 3; ax++) {
    snprintf(what, sizeof what, "arange axis=%lld %s", (long long)ax, dn);
    one(&c, emit(&c, IR_OP_ARANGE, NULL, 0, &ax, (double[]){-1.5, 0.25}, &at), what);
    snprintf(what, sizeof what, "arange axis=%lld i32", (long long)ax);
    one(&c, emit(&c, IR_OP_ARANGE, NULL, 0, &ax, (double[]){1, 1}, &ai), what);
  }
  IrType hs = TY(IR_I32, 8), hf = TY(dt, 8);
  int h = emit(&c, IR_OP_ARANGE, NULL, 0, (int64_t[]){0}, (double[]){1, 1}, &hs);
  int hx = emit(&c, IR_OP_CAST, &h, 1, NULL, NULL, &hf);
  int hm = emit(&c, IR_OP_MULS, &hx, 1, NULL, (double[]){-0.6931471805599453}, NULL);
  snprintf(what, sizeof what, "ALiBi slopes exp(float(arange) * c) %s", dn);
  group(&c, (int[]){h, hx, hm, E1(&c, IR_OP_EXP, hm)}, 4, what, PLAIN);
  g_covered[IR_OP_MASKED_FILL] = g_covered[IR_OP_CAUSAL_MASK] = g_covered[IR_OP_FULL] = 1;
  g_covered[IR_OP_BROADCAST] = g_covered[IR_OP_ARANGE] = 1;
  case_free(&c);
}

/* Row ops over rows of D: D < 32 (a row shorter than a warp), D > 256
 * (longer than the block). */
static void rows(IrDtype dt, int64_t D) {
  char what[96];
  const char *dn = ir_dtype_name(dt);
  IrType t = TY(dt, 3, 4, D);
  static const IrOp R1[] = {IR_OP_SOFTMAX, IR_OP_LOG_SOFTMAX, IR_OP_LAYERNORM, IR_OP_RMSNORM};
  static const IrOp R2[] = {IR_OP_SOFTMAX_BWD, IR_OP_LOG_SOFTMAX_BWD, IR_OP_LAYERNORM_BWD, IR_OP_RMSNORM_BWD};
  for (int i = 0; i < 4; i++) {
    Case c;
    case_init(&c);
    int x = input(&c, t, -4, 4), dy = input(&c, t, -1, 1);
    snprintf(what, sizeof what, "%s %s D=%lld", ir_ops[R1[i]].name, dn, (long long)D);
    one(&c, emit(&c, R1[i], &x, 1, NULL, (double[]){1e-5}, NULL), what);
    if (R1[i] == IR_OP_SOFTMAX)
      *(D > 256 ? &g_softmax_long[dt == IR_F64] : &g_softmax_short[dt == IR_F64]) = g_kept.n - 1;
    snprintf(what, sizeof what, "%s %s D=%lld", ir_ops[R2[i]].name, dn, (long long)D);
    one(&c, emit(&c, R2[i], (int[]){x, dy}, 2, NULL, (double[]){1e-5}, NULL), what);
    snprintf(what, sizeof what, "%s in place %s D=%lld", ir_ops[R2[i]].name, dn, (long long)D);
    group(&c, (int[]){emit(&c, R2[i], (int[]){x, dy}, 2, NULL, (double[]){1e-5}, NULL)}, 1, what, INPLACE);
    g_covered[R1[i]] = g_covered[R2[i]] = 1;
    case_free(&c);
  }
  { /* a fully masked row stays finite */
    Case c;
    case_init(&c);
    int x = input(&c, TY(dt, 4, D), -1, 1);
    int cm = emit(&c, IR_OP_CAUSAL_MASK, &x, 1, NULL, (double[]){-INFINITY}, NULL), sm = E1(&c, IR_OP_SOFTMAX, cm);
    snprintf(what, sizeof what, "causal_mask+softmax %s D=%lld", dn, (long long)D);
    group(&c, (int[]){cm, sm}, 2, what, PLAIN);
    case_free(&c);
  }
  { /* cross-entropy (+bwd), some targets ignored (-1) */
    Case c;
    case_init(&c);
    int lg = input(&c, TY(dt, 2, 5, D), -5, 5), tg = input(&c, TY(IR_I32, 2, 5), -1, (double)D);
    int dl = input(&c, TY(dt, 2, 5), 0.1, 1);
    snprintf(what, sizeof what, "cross_entropy %s V=%lld", dn, (long long)D);
    one(&c, emit(&c, IR_OP_CROSS_ENTROPY, (int[]){lg, tg}, 2, (int64_t[]){-1}, NULL, NULL), what);
    snprintf(what, sizeof what, "cross_entropy_bwd %s V=%lld", dn, (long long)D);
    one(&c, emit(&c, IR_OP_CROSS_ENTROPY_BWD, (int[]){lg, tg, dl}, 3, (int64_t[]){-1}, NULL, NULL), what);
    g_covered[IR_OP_CROSS_ENTROPY] = g_covered[IR_OP_CROSS_ENTROPY_BWD] = 1;
    case_free(&c);
  }
  static const IrOp RED[] = {IR_OP_SUM, IR_OP_MEAN, IR_OP_MAX};
  for (int r = 0; r < 3; r++)
    for (int ax = 0; ax < 3; ax++) {
      Case c;
      case_init(&c);
      int x = input(&c, t, -2, 2);
      snprintf(what, sizeof what, "%s axis=%d %s D=%lld", ir_ops[RED[r]].name, ax, dn, (long long)D);
      one(&c, emit(&c, RED[r], &x, 1, (int64_t[]){ax, ax & 1}, NULL, NULL), what);
      if (ax == 0 && r == 0 && dt == IR_F32) g_sum_axis0 = g_kept.n - 1;
      g_covered[RED[r]] = 1;
      case_free(&c);
    }
  for (int ax = 0; ax < 3; ax += 2) {   /* a NaN wins a max reduction */
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2);
    if (dt == IR_F32) ((float *)c.data[0])[7] = NAN;
    else ((double *)c.data[0])[7] = NAN;
    snprintf(what, sizeof what, "max with a NaN, axis=%d %s D=%lld", ax, dn, (long long)D);
    one(&c, emit(&c, IR_OP_MAX, &x, 1, (int64_t[]){ax, 0}, NULL, NULL), what);
    case_free(&c);
  }
  Case c;
  case_init(&c);
  int x = input(&c, t, -2, 2);
  snprintf(what, sizeof what, "sumsq %s D=%lld", dn, (long long)D);
  one(&c, E1(&c, IR_OP_SUMSQ, x), what);
  g_covered[IR_OP_SUMSQ] = 1;
  case_free(&c);
}

static void layout(IrDtype dt) {
  char what[96];
  const char *dn = ir_dtype_name(dt);
  Case c;
  case_init(&c);
  IrType t4 = TY(dt, 2, 3, 4, 5);
  int x = input(&c, t4, -2, 2);
  IrType r1 = TY(dt, 6, 20);
  snprintf(what, sizeof what, "reshape %s", dn);
  one(&c, emit(&c, IR_OP_RESHAPE, &x, 1, NULL, NULL, &r1), what);
  static const int64_t perms[2][4] = {{0, 2, 1, 3}, {3, 1, 0, 2}};
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "permute #%d %s", i, dn);
    one(&c, emit(&c, IR_OP_PERMUTE, &x, 1, perms[i], NULL, NULL), what);
  }
  static const int64_t sl[2][3] = {{0, 1, 2}, {3, 2, 5}};
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "slice axis=%lld %s", (long long)sl[i][0], dn);
    one(&c, emit(&c, IR_OP_SLICE, &x, 1, sl[i], NULL, NULL), what);
  }
  static const int64_t pd[2][3] = {{0, 1, 0}, {3, 0, 3}};
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "pad axis=%lld %s", (long long)pd[i][0], dn);
    one(&c, emit(&c, IR_OP_PAD, &x, 1, pd[i], NULL, NULL), what);
  }
  int y = input(&c, TY(dt, 2, 1, 4, 5), -2, 2), w = input(&c, TY(dt, 2, 3, 4, 2), -2, 2);
  snprintf(what, sizeof what, "concat %s", dn);
  one(&c, emit(&c, IR_OP_CONCAT, (int[]){y, x}, 2, (int64_t[]){1}, NULL, NULL), what);
  one(&c, emit(&c, IR_OP_CONCAT, (int[]){x, w}, 2, (int64_t[]){3}, NULL, NULL), what);
  IrType s1 = TY(dt, 3, 1, 5), s0 = TY(dt, 1);
  snprintf(what, sizeof what, "sum_to %s", dn);
  one(&c, emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s1), what);
  one(&c, emit(&c, IR_OP_SUM_TO, &x, 1, NULL, NULL, &s0), what);
  int p = emit(&c, IR_OP_PERMUTE, &x, 1, perms[0], NULL, NULL);
  int res = input(&c, c.m->blocks.a[c.b].nodes[p].type, -1, 1);
  snprintf(what, sizeof what, "permute+add %s", dn);
  group(&c, (int[]){p, E2(&c, IR_OP_ADD, p, res)}, 2, what, PLAIN);
  int sv = emit(&c, IR_OP_SLICE, &x, 1, sl[1], NULL, NULL), g = E1(&c, IR_OP_GELU_TANH, sv);
  snprintf(what, sizeof what, "slice+gelu+softmax %s", dn);
  group(&c, (int[]){sv, g, E1(&c, IR_OP_SOFTMAX, g)}, 3, what, PLAIN);
  g_covered[IR_OP_RESHAPE] = g_covered[IR_OP_PERMUTE] = g_covered[IR_OP_SLICE] = g_covered[IR_OP_PAD] = 1;
  g_covered[IR_OP_CONCAT] = g_covered[IR_OP_SUM_TO] = 1;
  case_free(&c);
}

/* Fused chains (as test_codegen's), rows of C. */
static void fused(IrDtype dt, int64_t C) {
  char what[96];
  const char *dn = ir_dtype_name(dt);
  int64_t R = 6;
  IrType t = TY(dt, R, C);
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2), b = input(&c, TY(dt, C), -1, 1), res = input(&c, t, -1, 1);
    int bb = emit(&c, IR_OP_BROADCAST, &b, 1, NULL, NULL, &t);
    int a = E2(&c, IR_OP_ADD, x, bb), g = E1(&c, IR_OP_GELU_TANH, a), y = E2(&c, IR_OP_ADD, g, res);
    E1(&c, IR_OP_EXP, g);
    snprintf(what, sizeof what, "bias+gelu+residual %s C=%lld", dn, (long long)C);
    group(&c, (int[]){bb, a, g, y}, 4, what, PLAIN);
    group(&c, (int[]){bb, a, g, y}, 4, what, INPLACE);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3), gm = input(&c, TY(dt, C), 0.5, 1.5), be = input(&c, TY(dt, C), -1, 1);
    int ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
    int g = emit(&c, IR_OP_BROADCAST, &gm, 1, NULL, NULL, &t), bt = emit(&c, IR_OP_BROADCAST, &be, 1, NULL, NULL, &t);
    int mu = E2(&c, IR_OP_MUL, ln, g), y = E2(&c, IR_OP_ADD, mu, bt);
    snprintf(what, sizeof what, "layernorm+affine %s C=%lld", dn, (long long)C);
    group(&c, (int[]){ln, g, bt, mu, y}, 5, what, PLAIN);
    group(&c, (int[]){ln, g, bt, mu, y}, 5, what, INPLACE);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int s = input(&c, TY(dt, 2, 3, 9, C), -4, 4);
    int sc = emit(&c, IR_OP_MULS, &s, 1, NULL, (double[]){0.125}, NULL);
    int cm = emit(&c, IR_OP_CAUSAL_MASK, &sc, 1, NULL, (double[]){-INFINITY}, NULL);
    snprintf(what, sizeof what, "scale+causal+softmax %s C=%lld", dn, (long long)C);
    group(&c, (int[]){sc, cm, E1(&c, IR_OP_SOFTMAX, cm)}, 3, what, PLAIN);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int lg = input(&c, t, -3, 3), tg = input(&c, TY(IR_I32, R), 0, (double)C), dl = input(&c, TY(dt, R), 0.1, 1);
    int sc = emit(&c, IR_OP_MULS, &lg, 1, NULL, (double[]){2}, NULL);
    int ce = emit(&c, IR_OP_CROSS_ENTROPY, (int[]){sc, tg}, 2, (int64_t[]){-100}, NULL, NULL);
    int cb = emit(&c, IR_OP_CROSS_ENTROPY_BWD, (int[]){sc, tg, dl}, 3, (int64_t[]){-100}, NULL, NULL);
    E1(&c, IR_OP_NEG, ce);
    snprintf(what, sizeof what, "scale+cross_entropy+bwd %s C=%lld", dn, (long long)C);
    group(&c, (int[]){sc, ce, cb}, 3, what, PLAIN);
    group(&c, (int[]){sc, ce, cb}, 3, what, INPLACE);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -1, 1), y = input(&c, t, -1, 1);
    int d = E2(&c, IR_OP_SUB, x, y), sq = E2(&c, IR_OP_MUL, d, d);
    int mn = emit(&c, IR_OP_MEAN, &sq, 1, (int64_t[]){1, 1}, NULL, NULL);
    snprintf(what, sizeof what, "sub+square+mean %s C=%lld", dn, (long long)C);
    group(&c, (int[]){d, sq, mn}, 3, what, PLAIN);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -3, 3);
    int ln = emit(&c, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
    int sc = emit(&c, IR_OP_MULS, &ln, 1, NULL, (double[]){1.5}, NULL);
    int sm = E1(&c, IR_OP_SOFTMAX, sc), ls = E1(&c, IR_OP_LOG_SOFTMAX, sm);
    snprintf(what, sizeof what, "layernorm+scale+softmax+log_softmax %s C=%lld", dn, (long long)C);
    group(&c, (int[]){ln, sc, sm, ls}, 4, what, INPLACE);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -1, 1), v = x, ids[48], n = 0;
    for (int i = 0; i < 40; i++) {
      v = emit(&c, i % 2 ? IR_OP_ADDS : IR_OP_MULS, &v, 1, NULL, (double[]){i % 2 ? 0.25 : 0.9}, NULL);
      ids[n++] = v;
    }
    ids[n++] = emit(&c, IR_OP_SUM, &v, 1, (int64_t[]){1, 0}, NULL, NULL);
    snprintf(what, sizeof what, "40 scalar ops + sum %s C=%lld", dn, (long long)C);
    group(&c, ids, n, what, PLAIN);
    case_free(&c);
  }
  {
    Case c;
    case_init(&c);
    int x = input(&c, t, -2, 2), dy = input(&c, t, -1, 1), gm = input(&c, TY(dt, C), 0.5, 1.5);
    int s = E1(&c, IR_OP_SILU, x);
    int rb = emit(&c, IR_OP_RMSNORM_BWD, (int[]){s, dy}, 2, NULL, (double[]){1e-6}, NULL);
    int g = emit(&c, IR_OP_BROADCAST, &gm, 1, NULL, NULL, &t);
    snprintf(what, sizeof what, "silu+rmsnorm_bwd+gain %s C=%lld", dn, (long long)C);
    group(&c, (int[]){s, rb, g, E2(&c, IR_OP_MUL, rb, g)}, 4, what, PLAIN);
    case_free(&c);
  }
}

/* bias + dropout + residual with the run-time scalars seed, step, micro
 * (the run block's words), several of each. */
static void dropout(IrDtype dt, int64_t C) {
  static const int64_t steps[2] = {0, 7};
  static const int micros[2] = {0, 3};
  char what[96];
  for (int si = 0; si < 2; si++)
    for (int mi = 0; mi < 2; mi++) {
      Case c;
      case_init(&c);
      c.m->train.seed = 1234567 + (uint64_t)si;
      c.info.step = steps[si];
      c.info.micro = micros[mi];
      IrType t = TY(dt, 4, 5, C);
      int x = input(&c, t, -1, 1), b = input(&c, TY(dt, C), -1, 1), r = input(&c, t, -1, 1);
      int bb = emit(&c, IR_OP_BROADCAST, &b, 1, NULL, NULL, &t), a = E2(&c, IR_OP_ADD, x, bb);
      int dr = emit(&c, IR_OP_DROPOUT, &a, 1, (int64_t[]){3}, (double[]){0.3}, NULL);
      int z = E2(&c, IR_OP_ADD, dr, r);
      snprintf(what, sizeof what, "bias+dropout+residual %s C=%lld seed+%d step %lld micro %d", ir_dtype_name(dt),
               (long long)C, si, (long long)steps[si], micros[mi]);
      Kept *kp = group(&c, (int[]){bb, a, dr, z}, 4, what, PLAIN);
      if (kp && si == 1 && mi == 1) {   /* the mask really changes with the scalars: ~30% dropped */
        int64_t n = kp->buf[kp->nbuf - 1].n, same = 0;
        for (int64_t e = 0; e < n; e++) same += kp->ref[kp->nbuf - 1][e] == ldd(c.data[2], dt, e);
        CHECK(same > n / 6 && same < n / 2, "%s: %lld of %lld elements dropped", what, (long long)same, (long long)n);
      }
      g_covered[IR_OP_DROPOUT] = 1;
      case_free(&c);
    }
}

/* rand (BERT's masking draw: dropout's hash, lo + u (hi - lo), for i32 its
 * floor) into a residual add, i32 over [-3, 250) cast to the float type and
 * the float type over [-1, 1), with the run-time scalars */
static void rand_draw(IrDtype dt, int64_t C) {
  char what[96];
  for (int si = 0; si < 2; si++) {
    Case c;
    case_init(&c);
    c.m->train.seed = 99 + (uint64_t)si;
    c.info.step = 3 * si;
    c.info.micro = si;
    IrType t = TY(dt, 4, 5, C), ti = TY(IR_I32, 4, 5, C);
    int x = input(&c, t, -1, 1);
    int ri = emit(&c, IR_OP_RAND, NULL, 0, (int64_t[]){5}, (double[]){-3, 250}, &ti);
    int rc = emit(&c, IR_OP_CAST, &ri, 1, NULL, NULL, &t);
    int rf = emit(&c, IR_OP_RAND, NULL, 0, (int64_t[]){6}, (double[]){-1, 1}, &t);
    int a = E2(&c, IR_OP_ADD, x, rc), z = E2(&c, IR_OP_ADD, a, rf);
    snprintf(what, sizeof what, "rand i32 + rand %s + residual C=%lld seed+%d", ir_dtype_name(dt), (long long)C, si);
    group(&c, (int[]){ri, rc, rf, a, z}, 5, what, PLAIN);
    g_covered[IR_OP_RAND] = 1;
    case_free(&c);
  }
}

static void st(void *p, CgType t, int64_t i, double v) {
  if (t == CG_F32) ((float *)p)[i] = (float)v;
  else ((double *)p)[i] = v;
}

/* The executor's optimizer-step kernels (cg_lower_opt_step: adamw, sgd
 * with and without Nesterov, lion, lr_step), against each rule's formula
 * computed here in the reference's order (ops_ref_t.h, *_range). */
static void opt_step(IrOp op, CgType t, int64_t cnt, int misalign, double nesterov) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, mom = 0.9;
  double fa[3] = {b1, b2, eps};
  if (op == IR_OP_SGD) fa[0] = mom, fa[1] = nesterov;
  if (op == IR_OP_LION) fa[1] = 0.99;
  CgKernel *k = cg_lower_opt_step(op, t == CG_F32 ? IR_F32 : IR_F64, IR_F32, fa, cnt);
  int nmom, nkey, nin = cg_opt_step_layout(op, &nmom, &nkey);
  char what[96];
  snprintf(what, sizeof what, "%s%s %s n=%lld%s", ir_ops[op].name, nesterov != 0 ? " nesterov" : "", cg_type_name(t),
           (long long)cnt, misalign ? " misaligned" : "");
  CHECK(k != NULL, "%s: no kernel", what);
  if (!k) return;
  int bg = nin - 1, bs = nin, bw = nin + 1, bm = nin + 2, bv = nin + 3;   /* cg_opt_step_layout's buffers */
  Kept *kp = keep(k, bw, what);
  kp->misalign = misalign;
  if (nin == 2) ((float *)kp->init[0])[0] = 0.5f;   /* the clip coefficient */
  double sc[4] = {1e-2, op == IR_OP_ADAMW ? 1 - pow(b1, 3) : op == IR_OP_LR_STEP ? 1.25 : 0,
                  op == IR_OP_ADAMW ? 1 - pow(b2, 3) : 0, 0.1};
  memcpy(kp->init[bs], sc, sizeof sc);
  for (int64_t e = 0; e < cnt; e++) {
    st(kp->init[bg], t, e, urand() * 2 - 1);
    st(kp->init[bw], t, e, urand() * 2 - 1);
    if (nmom > 0) st(kp->init[bm], t, e, (urand() * 2 - 1) * 0.1);
    if (nmom > 1) st(kp->init[bv], t, e, urand() * 0.01);
  }
  if (op == IR_OP_LION && cnt > 2) {   /* sign(0) is 0: an interpolation exactly 0 */
    st(kp->init[bg], t, 1, 0);
    st(kp->init[bm], t, 1, 0);
  }
  for (int b = bw; b < bw + 1 + nmom; b++) kp->ref[b] = ts_xmalloc((size_t)cnt * sizeof(double) + 8);
  for (int64_t e = 0; e < cnt; e++) {
    double x = ldc(kp->init[bg], t, e), g = nin == 2 ? x * 0.5 : x, w = ldc(kp->init[bw], t, e), wn, m = 0, v = 0;
    double m0 = nmom > 0 ? ldc(kp->init[bm], t, e) : 0;
    if (op == IR_OP_ADAMW) {
      m = b1 * m0 + (1 - b1) * g;
      v = b2 * ldc(kp->init[bv], t, e) + ((1 - b2) * g) * g;
      wn = w - sc[0] * (m / sc[1] / (sqrt(v / sc[2]) + eps) + sc[3] * w);
    } else if (op == IR_OP_SGD) {
      double d = g + sc[3] * w;
      m = mom * m0 + d;
      wn = w - sc[0] * (nesterov != 0 ? d + mom * m : m);
    } else if (op == IR_OP_LION) {
      double c = b1 * m0 + (1 - b1) * g;
      wn = w * (1 - sc[0] * sc[3]) - sc[0] * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
      m = fa[1] * m0 + (1 - fa[1]) * g;
    } else {
      wn = w * (1 - sc[0] * sc[3]) - sc[0] * sc[1] * g;
    }
    kp->ref[bw][e] = t == CG_F32 ? (float)wn : wn;
    if (nmom > 0) kp->ref[bm][e] = t == CG_F32 ? (float)m : m;
    if (nmom > 1) kp->ref[bv][e] = t == CG_F32 ? (float)v : v;
  }
  if (op == IR_OP_ADAMW && t == CG_F32 && !misalign) *(cnt % 4 == 0 ? &g_adamw_vec : &g_adamw_odd) = g_kept.n - 1;
  run_jit(k, kp);
  cg_kernel_free(k);
}

static int has(int i, const char *needle);

/* ---- kernels built by hand: row-mode corners the lowering does not produce ---- */

static void fill(void *p, CgType t, int64_t n, double lo, double hi) {
  for (int64_t e = 0; e < n; e++) st(p, t, e, lo + (hi - lo) * urand());
}

/* A sum accumulator starting at 1.5, updated in two loops and read
 * between them; a max accumulator starting at 0 (above some rows' values):
 *   s = 1.5 + sum x;  t = 2 s;  y = x t;  out = s + sum x^2;  mx = max(0, x...)
 * rows of D over R rows, in type t (f32: the f32 block reductions). */
static void hand_two_loops(CgType t, int64_t R, int64_t D) {
  CgKernel *k = cg_kernel_new(t == CG_F32 ? "two_loops_f32" : "two_loops_f64", R);
  int bx = cg_buf(k, t, R * D, 0), by = cg_buf(k, t, R * D, 1), bo = cg_buf(k, t, R, 1), bm = cg_buf(k, t, R, 1);
  int gid = cg_gid(k), base = cg_bin(k, CG_MUL, gid, cg_const_i(k, CG_I64, D));
  int s = cg_acc(k, t, CG_RED_SUM, 1.5), mx = cg_acc(k, t, CG_RED_MAX, 0.0);
  int r1 = cg_range(k, cg_const_i(k, CG_I64, D));
  int l1 = cg_load(k, bx, cg_bin(k, CG_ADD, base, r1));
  cg_update(k, s, l1);
  cg_update(k, mx, l1);
  cg_end(k);
  int tt = cg_bin(k, CG_MUL, s, cg_const_f(k, t, 2));
  int r2 = cg_range(k, cg_const_i(k, CG_I64, D));
  int idx = cg_bin(k, CG_ADD, base, r2), l2 = cg_load(k, bx, idx);
  cg_update(k, s, cg_bin(k, CG_MUL, l2, l2));
  cg_store(k, by, idx, cg_bin(k, CG_MUL, l2, tt));
  cg_end(k);
  cg_store(k, bo, gid, s);
  cg_store(k, bm, gid, mx);
  char what[96];
  snprintf(what, sizeof what, "hand: sum from 1.5 over two loops, max from 0, %s D=%lld", cg_type_name(t),
           (long long)D);
  Kept *kp = keep(k, 1, what);
  fill(kp->init[0], t, R * D, -2, 1);
  for (int b = 1; b < 4; b++) {
    memset(kp->init[b], 0xff, bytes_of(&kp->buf[b]));
    kp->ref[b] = ts_xmalloc((size_t)kp->buf[b].n * sizeof(double) + 8);
  }
  for (int64_t r = 0; r < R; r++) {
    double sum = 1.5, sq = 0, m = 0;
    for (int64_t j = 0; j < D; j++) {
      double x = ldc(kp->init[0], t, r * D + j);
      sum += x;
      sq += x * x;
      m = x > m ? x : m;
    }
    for (int64_t j = 0; j < D; j++) kp->ref[1][r * D + j] = ldc(kp->init[0], t, r * D + j) * 2 * sum;
    kp->ref[2][r] = sum + sq;
    kp->ref[3][r] = m;
  }
  if (R * D > 0) {   /* one row entirely below 0: the init wins the max */
    for (int64_t j = 0; j < D; j++) st(kp->init[0], t, j, -1 - urand());
    double sum = 1.5, sq = 0;
    for (int64_t j = 0; j < D; j++) {
      double x = ldc(kp->init[0], t, j);
      sum += x;
      sq += x * x;
    }
    for (int64_t j = 0; j < D; j++) kp->ref[1][j] = ldc(kp->init[0], t, j) * 2 * sum;
    kp->ref[2][0] = sum + sq;
    kp->ref[3][0] = 0;
  }
  CHECK(has(g_kept.n - 1, "row mode") && has(g_kept.n - 1, t == CG_F32 ? "ts_block_sumf" : "ts_block_sum(") &&
            has(g_kept.n - 1, "if (threadIdx.x != 0)"),
        "%s: not in row mode with its sum started once", what);
  run_jit(k, kp);
  cg_kernel_free(k);
}

/* Split rows (cuda.c): R long rows, each a pure reduction, on several
 * blocks per row combined by the last:  s = 1.5 + sum x^2;  mx = max(0,
 * x...);  out = 2 s;  mx.  The text must be split, the values right (the
 * emulator runs the blocks in order; the ticket picks the last). */
static void hand_split(CgType t, int64_t R, int64_t D) {
  CgKernel *k = cg_kernel_new(t == CG_F32 ? "split_f32" : "split_f64", R);
  int bx = cg_buf(k, t, R * D, 0), bo = cg_buf(k, t, R, 1), bm = cg_buf(k, t, R, 1);
  int gid = cg_gid(k), base = cg_bin(k, CG_MUL, gid, cg_const_i(k, CG_I64, D));
  int s = cg_acc(k, t, CG_RED_SUM, 1.5), mx = cg_acc(k, t, CG_RED_MAX, 0.0);
  int r1 = cg_range(k, cg_const_i(k, CG_I64, D));
  int l1 = cg_load(k, bx, cg_bin(k, CG_ADD, base, r1));
  cg_update(k, s, cg_bin(k, CG_MUL, l1, l1));
  cg_update(k, mx, l1);
  cg_end(k);
  cg_store(k, bo, gid, cg_bin(k, CG_MUL, s, cg_const_f(k, t, 2)));
  cg_store(k, bm, gid, mx);
  char what[96];
  snprintf(what, sizeof what, "hand: split rows, %s R=%lld D=%lld", cg_type_name(t), (long long)R, (long long)D);
  Kept *kp = keep(k, 1, what);
  fill(kp->init[0], t, R * D, -2, 1);
  for (int64_t j = 0; j < D; j++) st(kp->init[0], t, j, -1 - urand());   /* row 0 below 0: the init wins */
  for (int b = 1; b < 3; b++) {
    memset(kp->init[b], 0xff, bytes_of(&kp->buf[b]));
    kp->ref[b] = ts_xmalloc((size_t)kp->buf[b].n * sizeof(double) + 8);
  }
  for (int64_t r = 0; r < R; r++) {
    double sq = 1.5, m = 0;
    for (int64_t j = 0; j < D; j++) {
      double x = ldc(kp->init[0], t, r * D + j);
      sq += x * x;
      m = x > m ? x : m;
    }
    kp->ref[1][r] = 2 * sq;
    kp->ref[2][r] = m;
  }
  CHECK(has(g_kept.n - 1, "split rows of") && has(g_kept.n - 1, "ts_split_ticket[gid]") &&
            has(g_kept.n - 1, "|| ts_chunk != 0) v"), "%s: not split, or its sum not started once", what);
  run_jit(k, kp);
  cg_kernel_free(k);
}

/* In place with a load at top level before the loop that overwrites its
 * element: y[r, j] = x[r, j] - x[r, 0], y on x's memory.  One thread per
 * iteration reads x[r, 0] before it stores y[r, 0]; in row mode the
 * loop's stores must wait for every thread's load (a barrier). */
static void hand_top_load(int64_t D) {
  int64_t R = 4;
  CgKernel *k = cg_kernel_new("top_load_inplace", R);
  int bx = cg_buf(k, CG_F32, R * D, 0), by = cg_buf(k, CG_F32, R * D, 1);
  int gid = cg_gid(k), base = cg_bin(k, CG_MUL, gid, cg_const_i(k, CG_I64, D));
  int x0 = cg_load(k, bx, base);
  int r = cg_range(k, cg_const_i(k, CG_I64, D));
  int idx = cg_bin(k, CG_ADD, base, r);
  cg_store(k, by, idx, cg_bin(k, CG_SUB, cg_load(k, bx, idx), x0));
  cg_end(k);
  char what[96];
  snprintf(what, sizeof what, "hand: top-level load, then the loop overwrites it in place, D=%lld", (long long)D);
  Kept *kp = keep(k, 1, what);
  kp->alias_out = 1;
  kp->alias_in = 0;
  fill(kp->init[0], CG_F32, R * D, -1, 1);
  kp->ref[1] = ts_xmalloc((size_t)(R * D) * sizeof(double));
  for (int64_t e = 0; e < R * D; e++)
    kp->ref[1][e] = (float)(((float *)kp->init[0])[e] - ((float *)kp->init[0])[e / D * D]);
  CHECK(has(g_kept.n - 1, "row mode"), "%s: not in row mode", what);
  run_jit(k, kp);
  cg_kernel_free(k);
}

/* A loop whose trip count is a run-time scalar (param step): row mode
 * with 256 threads; sums x[r, 0 .. step). */
static void hand_param_trip(void) {
  int64_t R = 3, D = 300;
  CgKernel *k = cg_kernel_new("param_trip", R);
  int bx = cg_buf(k, CG_F64, R * D, 0), bo = cg_buf(k, CG_F64, R, 1);
  int gid = cg_gid(k), base = cg_bin(k, CG_MUL, gid, cg_const_i(k, CG_I64, D));
  int s = cg_acc(k, CG_F64, CG_RED_SUM, 0);
  int r = cg_range(k, cg_param(k, CG_PARAM_STEP));
  cg_update(k, s, cg_load(k, bx, cg_bin(k, CG_ADD, base, r)));
  cg_end(k);
  cg_store(k, bo, gid, s);
  Kept *kp = keep(k, 1, "hand: a loop of a run-time length");
  kp->run[CG_RUN_STEP] = 277;
  fill(kp->init[0], CG_F64, R * D, -1, 1);
  memset(kp->init[1], 0xff, bytes_of(&kp->buf[1]));
  kp->ref[1] = ts_xmalloc((size_t)R * sizeof(double));
  for (int64_t i = 0; i < R; i++) {
    double sum = 0;
    for (int64_t j = 0; j < 277; j++) sum += ((double *)kp->init[0])[i * D + j];
    kp->ref[1][i] = sum;
  }
  CHECK(has(g_kept.n - 1, "row mode") && g_kept.a[g_kept.n - 1].l.threads == 256 && has(g_kept.n - 1, "a.run[1]"),
        "a loop of a run-time length: not in row mode with 256 threads");
  run_jit(k, kp);
  cg_kernel_free(k);
}

/* An accumulator read inside the loop that updates it (a running sum):
 * row mode would see partials, so one thread per row.  y[r, j] = x[r, j] + sum x[r, 0..j) */
static void hand_running_sum(void) {
  int64_t R = 5, D = 40;
  CgKernel *k = cg_kernel_new("running_sum", R);
  int bx = cg_buf(k, CG_F64, R * D, 0), by = cg_buf(k, CG_F64, R * D, 1);
  int gid = cg_gid(k), base = cg_bin(k, CG_MUL, gid, cg_const_i(k, CG_I64, D));
  int s = cg_acc(k, CG_F64, CG_RED_SUM, 0);
  int r = cg_range(k, cg_const_i(k, CG_I64, D));
  int idx = cg_bin(k, CG_ADD, base, r), x = cg_load(k, bx, idx);
  cg_store(k, by, idx, cg_bin(k, CG_ADD, x, s));
  cg_update(k, s, x);
  cg_end(k);
  Kept *kp = keep(k, 1, "hand: a running sum (read in its loop)");
  fill(kp->init[0], CG_F64, R * D, -1, 1);
  memset(kp->init[1], 0xff, bytes_of(&kp->buf[1]));
  kp->ref[1] = ts_xmalloc((size_t)(R * D) * sizeof(double));
  for (int64_t i = 0; i < R; i++) {
    double sum = 0;
    for (int64_t j = 0; j < D; j++) {
      double v = ((double *)kp->init[0])[i * D + j];
      kp->ref[1][i * D + j] = v + sum;
      sum += v;
    }
  }
  CHECK(has(g_kept.n - 1, "thread mode"), "a running sum in row mode");
  run_jit(k, kp);
  cg_kernel_free(k);
}

/* An elementwise kernel whose space needs the grid-stride loop when the
 * launch is cut to 3 blocks (and without vectors: 4001 elements). */
static void big(void) {
  for (int64_t n = 4000; n <= 4001; n++) {
    Case c;
    case_init(&c);
    IrType t = TY(IR_F32, n);
    int x = input(&c, t, -2, 2), y = input(&c, t, -2, 2);
    char what[96];
    snprintf(what, sizeof what, "gelu(x) * y f32 n=%lld", (long long)n);
    int g = E1(&c, IR_OP_GELU_ERF, x);
    group(&c, (int[]){g, E2(&c, IR_OP_MUL, g, y)}, 2, what, PLAIN);
    if (n == 4000) g_big = g_kept.n - 1;
    case_free(&c);
  }
}

/* 16-bit storage (bf16 or f16) as the precision pass leaves it
 * (docs/precision.md): 16-bit values widened to f32 by casts, f32
 * arithmetic, the result rounded back to dt -- a bias add, a row softmax, a
 * reduction, a pure 16-bit copy (vectors of 4) and layout op, and the
 * rounding itself on chosen values (ties to even, NaN, infinities,
 * overflow past the largest finite, f16's subnormals). */
static void half16(IrDtype dt, int64_t R, int64_t C) {
  char what[96];
  const char *dn = ir_dtype_name(dt);
  Case c;
  case_init(&c);
  IrType tb = TY(dt, R, C), tf = TY(IR_F32, R, C);
  int x = input(&c, tb, -2, 2), b = input(&c, tb, -1, 1);
  int xf = emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &tf), bf = emit(&c, IR_OP_CAST, &b, 1, NULL, NULL, &tf);
  int sum = E2(&c, IR_OP_ADD, xf, bf);
  snprintf(what, sizeof what, "%s bias add %lldx%lld", dn, (long long)R, (long long)C);
  group(&c, (int[]){xf, bf, sum, emit(&c, IR_OP_CAST, &sum, 1, NULL, NULL, &tb)}, 4, what, PLAIN);
  int xf2 = emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &tf), sm = E1(&c, IR_OP_SOFTMAX, xf2);
  snprintf(what, sizeof what, "%s softmax rows of %lld", dn, (long long)C);
  group(&c, (int[]){xf2, sm, emit(&c, IR_OP_CAST, &sm, 1, NULL, NULL, &tb)}, 3, what, PLAIN);
  int xf3 = emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &tf);
  snprintf(what, sizeof what, "%s sum over rows of %lld", dn, (long long)C);
  group(&c, (int[]){xf3, emit(&c, IR_OP_SUM, &xf3, 1, (int64_t[]){1, 1}, NULL, NULL)}, 2, what, PLAIN);
  IrType r1 = TY(dt, R * C);
  snprintf(what, sizeof what, "%s reshape (copy) %lld", dn, (long long)(R * C));
  Kept *cp = one(&c, emit(&c, IR_OP_RESHAPE, &x, 1, NULL, NULL, &r1), what);
  if ((R * C) % 4 == 0 && cp) *(dt == IR_BF16 ? &g_bf16_vec : &g_f16_vec) = g_kept.n - 1;
  snprintf(what, sizeof what, "%s permute %lldx%lld", dn, (long long)R, (long long)C);
  one(&c, emit(&c, IR_OP_PERMUTE, &x, 1, (int64_t[]){1, 0}, NULL, NULL), what);
  case_free(&c);
}

/* f32 -> bf16 / f16 rounding on values chosen to hit each rule; the
 * kernel's bits must equal runtime/cpu/half.h's (run_kept: tolerance 0
 * and the bits compared). */
static const float g_round_in[] = {1.0f, 1.00390625f /* tie, even below */, 1.01171875f /* tie, odd: up */,
                                   1.0078125f, -3.14159274f, 3.3895314e38f /* past bf16's max: inf */, 1e-40f,
                                   -0.0f, 0.0f, 65504.0f, 1.00390637f};
static const float g_round_in_f16[] = {
    1.0f, 1.00048828125f /* 1 + 2^-11: tie, even below */, 1.00146484375f /* 1 + 3 2^-11: tie, odd: up */,
    -3.14159274f, 65504.0f /* the largest finite */, 65519.99f /* rounds down to it */, 65520.0f /* tie: inf */,
    1e6f, 6.103515625e-05f /* 2^-14, the smallest normal */, 6.0975551605224609e-05f /* subnormal below it */,
    8.9406967163085938e-08f /* 1.5 2^-24: tie between subnormals, up to even 2^-23 */,
    2.9802322387695312e-08f /* 2^-25: tie, down to 0 */, 4.4703483581542969e-08f /* 0.75 2^-24: up to 2^-24 */,
    -1e-40f, -0.0f, 0.0f};
static void half_round(IrDtype dt) {
  const float *in = dt == IR_BF16 ? g_round_in : g_round_in_f16;
  int64_t nin = dt == IR_BF16 ? (int64_t)(sizeof g_round_in / sizeof *g_round_in)
                              : (int64_t)(sizeof g_round_in_f16 / sizeof *g_round_in_f16);
  char what[64];
  Case c;
  case_init(&c);
  int64_t n = nin + 3;
  IrType tf = TY(IR_F32, n), tb = TY(dt, n);
  int x = input(&c, tf, -1, 1);
  float *d = c.data[c.nfeed - 1];
  for (int64_t i = 0; i < n - 3; i++) d[i] = in[i];
  d[n - 3] = NAN;
  d[n - 2] = INFINITY;
  d[n - 1] = -INFINITY;
  snprintf(what, sizeof what, "f32 -> %s rounding", ir_dtype_name(dt));
  one(&c, emit(&c, IR_OP_CAST, &x, 1, NULL, NULL, &tb), what);
  *(dt == IR_BF16 ? &g_bf16_round : &g_f16_round) = g_kept.n - 1;
  g_covered[IR_OP_CAST] = 1;
  case_free(&c);
}

static void build_all(void) {
  IrDtype dts[2] = {IR_F32, IR_F64};
  for (int i = 0; i < 2; i++) {
    ew(dts[i], 5, 37);    /* 185: no vector width divides it */
    ew(dts[i], 4, 64);    /* 256: vectors */
    misc(dts[i]);
    rows(dts[i], 29);     /* shorter than a warp */
    rows(dts[i], 300);    /* longer than the block */
    layout(dts[i]);
    fused(dts[i], 67);
    fused(dts[i], 520);
    dropout(dts[i], 67);
    dropout(dts[i], 64);
    rand_draw(dts[i], 67);
  }
  for (int h = 0; h < 2; h++) {
    IrDtype dt = h ? IR_F16 : IR_BF16;
    half16(dt, 5, 37);
    half16(dt, 4, 300);
    half_round(dt);
  }
  opt_step(IR_OP_ADAMW, CG_F32, 1000, 0, 0);
  opt_step(IR_OP_ADAMW, CG_F32, 1000, 1, 0);
  opt_step(IR_OP_ADAMW, CG_F32, 999, 0, 0);
  opt_step(IR_OP_ADAMW, CG_F64, 1000, 0, 0);
  opt_step(IR_OP_ADAMW, CG_F64, 1000, 1, 0);
  for (int ti = 0; ti < 2; ti++) {   /* the other update rules, f32 and f64, a chunk not 16-byte aligned */
    CgType t = ti ? CG_F64 : CG_F32;
    opt_step(IR_OP_SGD, t, 1000, 0, 0);
    opt_step(IR_OP_SGD, t, 999, 1, 1);
    opt_step(IR_OP_LION, t, 1000, 0, 0);
    opt_step(IR_OP_LION, t, 999, 1, 0);
    opt_step(IR_OP_LR_STEP, t, 1000, 0, 0);
    opt_step(IR_OP_LR_STEP, t, 998, 1, 0);
  }
  big();
  hand_two_loops(CG_F64, 5, 300);
  hand_two_loops(CG_F32, 5, 100);
  hand_two_loops(CG_F64, 3, 20);
  hand_split(CG_F64, 1, 100003);
  hand_split(CG_F32, 3, 70001);
  hand_top_load(64);
  hand_top_load(700);
  hand_param_trip();
  hand_running_sum();
  for (int op = 0; op < IR_OP_COUNT; op++)
    CHECK(!cg_op_lowerable((IrOp)op) || g_covered[op], "op %s is lowerable but has no case here", ir_ops[op].name);
}

static char *module_text(void) {
  StrBuf s = {0};
  sb_printf(&s, "%s%s", cg_cuda_prelude(), g_src.p ? g_src.p : "");
  return s.p;
}

/* ---- shape: modes, launches and text ---- */
static int has(int i, const char *needle) {
  char *t = kept_text(&g_kept.a[i]);
  int r = strstr(t, needle) != NULL;
  free(t);
  return r;
}

static void check_shapes(void) {
  const char *pre = cg_cuda_prelude();
  CHECK(strstr(pre, "__shfl_xor_sync(0xffffffffu") && strstr(pre, "__syncthreads()") && strstr(pre, "__shared__") &&
            strstr(pre, "TS_ARGS_DEFINED") && !strstr(pre, "#include"),
        "prelude: no warp shuffle / barrier / shared slots / TsArgs guard, or an #include");
  for (int d = 0; d < 2; d++) {
    const char *vt = d ? "double2" : "float4";
    CHECK(has(g_add_vec[d], vt) && has(g_add_vec[d], "16-byte vectors") && g_kept.a[g_add_vec[d]].l.threads == 256,
          "add %s of 256 elements: no %s", d ? "f64" : "f32", vt);
    CHECK(g_kept.a[g_add_vec[d]].l.blocks == 1, "add of 256 elements in vectors: %lld blocks, want 1",
          (long long)g_kept.a[g_add_vec[d]].l.blocks);
    CHECK(!has(g_add_odd[d], vt) && !has(g_add_odd[d], "16-byte"), "add of 185 elements uses vectors");
    for (int s = 0; s < 2; s++) {
      int i = s ? g_softmax_long[d] : g_softmax_short[d];
      const Kept *kp = &g_kept.a[i];
      CHECK(has(i, "row mode") && has(i, "threadIdx.x; ") && has(i, "ts_block_max") && has(i, "ts_block_sum") &&
                has(i, "blockIdx.x; gid < 12LL; gid += gridDim.x"),
            "%s: not in row mode with block reductions", kp->what);
      CHECK(kp->l.blocks == 12 && kp->l.threads == (s ? 256 : 32), "%s: launch %lld x %d, want 12 x %d", kp->what,
            (long long)kp->l.blocks, kp->l.threads, s ? 256 : 32);
    }
  }
  /* f32 arithmetic for f32 groups (expf, float accumulators), f64 for f64 */
  CHECK(has(g_softmax_long[0], "expf(") && has(g_softmax_long[0], "ts_block_sumf") && !has(g_softmax_long[0], "double"),
        "softmax f32: not computed in f32 (expf, float block sums, no double)");
  CHECK(has(g_softmax_long[1], " exp(") && !has(g_softmax_long[1], "expf("), "softmax f64: not computed in f64");
  /* 32-bit index arithmetic where the sizes allow; the dropout hash stays 64-bit */
  int narrow_div = 0, hash64 = 0, drop = 0;
  for (int i = 0; i < g_kept.n; i++) {
    narrow_div += has(i, "(int)v") && has(i, " % (int)v");
    if (strncmp(g_kept.a[i].what, "bias+dropout", 12) == 0) {
      drop++;
      hash64 += has(i, "(unsigned long long)v") && has(i, "const int v");
    }
  }
  CHECK(narrow_div > 10, "only %d kernels do their index modulo in 32 bits", narrow_div);
  CHECK(drop > 0 && hash64 == drop, "%d of %d dropout kernels hash in 64 bits with 32-bit indices", hash64, drop);
  CHECK(has(g_cast_vec, "int4") && has(g_cast_vec, "float4"), "cast f32 -> i32 of 256: no int4 / float4");
  CHECK(!has(g_cast_mixed, "16-byte"), "cast f64 -> i32 (mixed sizes) uses vectors");
  CHECK(has(g_sum_axis0, "thread mode"), "sum over an axis of 3: not one thread per output");
  CHECK(has(g_adamw_vec, "float4") && has(g_adamw_vec, "& 15) == 0"),
        "adamw f32 of 1000: no float4 with an alignment test");
  CHECK(!has(g_adamw_odd, "16-byte"), "adamw f32 of 999 uses vectors");
  CHECK(g_kept.a[g_big].l.blocks == 4 && g_kept.a[g_big].l.threads == 256, "4000 elements in float4: %lld x %d",
        (long long)g_kept.a[g_big].l.blocks, g_kept.a[g_big].l.threads);
  /* bf16 and f16: 8-byte ushort4 vectors on a pure 16-bit copy; f32
   * arithmetic and the prelude's conversions in the mixed kernels */
  for (int h = 0; h < 2; h++) {
    const char *dn = h ? "f16" : "bf16";
    int vec = h ? g_f16_vec : g_bf16_vec, rnd = h ? g_f16_round : g_bf16_round;
    char up[32], down[32], pre[8];
    snprintf(up, sizeof up, "ts_%s_f32(", dn);
    snprintf(down, sizeof down, "ts_f32_%s(", dn);
    snprintf(pre, sizeof pre, "%s ", dn);
    CHECK(vec >= 0 && has(vec, "ushort4") && has(vec, "8-byte vectors of 4") && has(vec, "& 7) == 0"),
          "%s copy: no ushort4 vectors with an 8-byte alignment test", dn);
    int kernels = 0;
    for (int i = 0; i < g_kept.n; i++) {
      if (strncmp(g_kept.a[i].what, pre, strlen(pre)) != 0) continue;
      kernels++;
      CHECK(strstr(g_kept.a[i].what, "bias add") == NULL || (has(i, up) && has(i, down) && !has(i, "double")),
            "%s: not f32 arithmetic between %s and %s", g_kept.a[i].what, up, down);
    }
    CHECK(kernels >= 8 && rnd >= 0 && has(rnd, down), "%s cases: %d kernels", dn, kernels);
  }
  int rows = 0, vecs = 0;
  for (int i = 0; i < g_kept.n; i++) {
    rows += has(i, "row mode");
    vecs += has(i, "16-byte vectors");
    const CgCudaLaunch *l = &g_kept.a[i].l;
    CHECK(l->threads % 32 == 0 && l->threads >= 32 && l->threads <= 1024 && l->blocks >= 1,
          "%s: launch %lld x %d", g_kept.a[i].what, (long long)l->blocks, l->threads);
  }
  printf("shape: %d kernels, %d in row mode, %d with 16-byte vectors\n", g_kept.n, rows, vecs);

  /* errors: a kernel name that is not an identifier, an invalid kernel */
  CgKernel *k = cg_kernel_new("ok", 4);
  int b0 = cg_buf(k, CG_F32, 4, 1), gid = cg_gid(k);
  cg_store(k, b0, gid, cg_const_f(k, CG_F32, 1));
  StrBuf s = {0};
  CgCudaLaunch l;
  snprintf(k->name, sizeof k->name, "bad-name");
  CHECK(cg_kernel_cuda_text(k, &s, &l, err, sizeof err) != 0 && strstr(err, "identifier"), "bad name accepted (%s)",
        err);
  snprintf(k->name, sizeof k->name, "ok");
  k->buf[0].written = 0;
  CHECK(cg_kernel_cuda_text(k, &s, &l, err, sizeof err) != 0, "a store to a read-only buffer accepted");
  sb_free(&s);
  cg_kernel_free(k);
}

/* ---- nvrtc: compile the module for sm_80 or sm_90 ----
 * NVRTC takes ~0.1 s per kernel and arch (and runs one compile at a time
 * per process), so kernels that differ only in numbers (shapes, constants,
 * value names: the same code with other immediates) are compiled once,
 * and ctest runs the rest in two halves (part 0 / 1 of 2). */
static int *g_nv_pick, g_nv_n;   /* the kept kernels compiled */

/* kp's text without digits */
static char *shape_of(const Kept *kp) {
  char *t = kept_text(kp);
  size_t j = 0;
  for (size_t i = 0; t[i]; i++)
    if (t[i] < '0' || t[i] > '9') t[j++] = t[i];
  t[j] = 0;
  return t;
}

static void nv_pick(void) {
  char **seen = ts_xcalloc((size_t)g_kept.n + 1, sizeof *seen);
  g_nv_pick = ts_xcalloc((size_t)g_kept.n + 1, sizeof *g_nv_pick);
  g_nv_n = 0;
  for (int i = 0; i < g_kept.n; i++) {
    char *t = shape_of(&g_kept.a[i]);
    int dup = 0;
    for (int q = 0; q < g_nv_n && !dup; q++) dup = strcmp(seen[q], t) == 0;
    if (dup) {
      free(t);
      continue;
    }
    seen[g_nv_n] = t;
    g_nv_pick[g_nv_n++] = i;
  }
  for (int q = 0; q < g_nv_n; q++) free(seen[q]);
  free(seen);
}

static void check_nvrtc(const char *arch, int part, int parts) {
  char why[512];
  if (!cg_nvrtc_available(why, sizeof why)) {
    printf("nvrtc: SKIPPED (%s)\n", why);
    return;
  }
  nv_pick();
  int lo = (int)((int64_t)g_nv_n * part / parts), hi = (int)((int64_t)g_nv_n * (part + 1) / parts);
  StrBuf src = {0};
  sb_puts(&src, cg_cuda_prelude());
  for (int x = lo; x < hi; x++) {
    char *t = kept_text(&g_kept.a[g_nv_pick[x]]);
    sb_puts(&src, t);
    free(t);
  }
  CgNvrtcOut o;
  memset(&o, 0, sizeof o);
  int rc = cg_nvrtc_compile(src.p, arch, &o, err, sizeof err);
  sb_free(&src);
  CHECK(rc == 0, "NVRTC %s: %s", arch, err);
  int found = 0, regs = 0, nlocal = 0;
  long long local = 0;
  if (rc == 0) {
    CHECK(!o.log || !strstr(o.log, "warning"), "NVRTC %s warns:\n%.2000s", arch, o.log);
    for (int x = lo; x < hi; x++) {
      int i = g_nv_pick[x];
      const CgPtxasInfo *pi = NULL;
      for (int q = 0; q < o.nkern; q++)
        if (strcmp(o.kern[q].name, g_kept.a[i].l.name) == 0) pi = &o.kern[q];
      CHECK(pi != NULL, "%s: %s is not in ptxas' report", arch, g_kept.a[i].l.name);
      if (!pi) continue;
      found++;
      if (pi->registers > regs) regs = pi->registers;
      CHECK(cg_ptxas_check(pi, arch, err, sizeof err) == 0, "%s: %s (%s)", arch, err, g_kept.a[i].what);
      if (pi->spill_stores || pi->stack || pi->cstack) {
        nlocal++;
        if (pi->spill_stores > local) local = pi->spill_stores;
        if (pi->cstack > local) local = pi->cstack;
      }
    }
  }
  printf("nvrtc %s part %d/%d: %d kernels compiled (%d of the %d kept differ in more than numbers), %zu bytes of "
         "cubin, at most %d registers; %d kernels with spills or stack, at most %lld bytes (limit %d: the math "
         "library's slow paths)\n", arch, part, parts, found, g_nv_n, g_kept.n, rc == 0 ? o.cubin_len : 0, regs,
         nlocal, local, CG_PTXAS_MATH_SLACK);
  CHECK(found == hi - lo, "%s: %d of %d kernels in ptxas' report", arch, found, hi - lo);
  if (rc == 0) cg_nvrtc_out_free(&o);
  free(g_nv_pick);
}

/* ---- emu: run every kernel under the emulator ---- */
#ifdef TS_EMU_HEADER
#include <sys/mman.h>
#include <unistd.h>

/* bytes (a multiple of 16) that end where an inaccessible page begins: a
 * kernel that reads or writes past its buffer faults (with the module
 * compiled at -O0, cuda_print.emu_O0, also the loads only optimization
 * would remove).  *base / *len: what munmap takes. */
static void *guarded(size_t bytes, void **base, size_t *len) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *len = (bytes + page - 1) / page * page + page;
  char *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TS_ASSERT(m != MAP_FAILED);
  TS_ASSERT(mprotect(m + *len - page, page, PROT_NONE) == 0);
  *base = m;
  return m + *len - page - bytes;
}
/* One launch of kept kernel kp with launch l on fresh copies of its
 * buffers; compares the written ones with the reference and the JIT.
 * save (if not NULL) gets a copy of each written buffer; same (if not
 * NULL) holds such copies the written buffers must equal bit for bit. */
static void emu_run(TsEmu *e, const Kept *kp, const CgCudaLaunch *l, const char *how, void **save, void *const *same) {
  void *mem[CG_MAX_BUFS], *at[CG_MAX_BUFS];
  size_t mlen[CG_MAX_BUFS];
  for (int b = 0; b < kp->nbuf; b++) {
    /* 16-byte aligned, or one element past (a ZeRO chunk of a parameter),
     * ending at most 15 bytes before a guard page */
    size_t off = kp->misalign && b == kp->nin ? cg_size(kp->buf[b].type) : 0;
    at[b] = (char *)guarded((bytes_of(&kp->buf[b]) + off + 15) / 16 * 16, &mem[b], &mlen[b]) + off;
    memcpy(at[b], kp->init[b], bytes_of(&kp->buf[b]));
  }
  CgCudaArgs a;
  memset(&a, 0, sizeof a);
  for (int b = 0; b < kp->nbuf; b++) a.b[b] = at[b];
  if (kp->alias_out >= 0) {   /* the output starts as the input it overwrites, and is it */
    memcpy(at[kp->alias_out], kp->init[kp->alias_in], bytes_of(&kp->buf[kp->alias_in]));
    a.b[kp->alias_in] = at[kp->alias_out];
  }
  a.run = kp->run;
  if (getenv("TS_EMU_TRACE")) fprintf(stderr, "launch %s (%s): %s\n", kp->l.name, how, kp->what);
  int rc = ts_emu_launch_kernel(e, l, &a, err, sizeof err);
  CHECK(rc == 0, "%s (%s): launch: %s", kp->what, how, err);
  for (int b = kp->nin; b < kp->nbuf && rc == 0; b++) {
    const CgBuf *cb = &kp->buf[b];
    /* bf16 results: within one bf16 ulp (the reference rounds f64 results,
     * the kernel f32 ones) */
    double tol = cb->type == CG_F64 ? 1e-12 : cb->type == CG_BF16 ? 0x1p-7 : cb->type == CG_F16 ? 0x1p-10 : 1e-5;
    int rounding = kp == &g_kept.a[g_bf16_round] || kp == &g_kept.a[g_f16_round];
    if (rounding) tol = 0;   /* the rounding itself: bit for bit, NaN's bits included */
    for (int64_t x = 0; rounding && x < cb->n; x++) {
      float in = ((const float *)kp->init[0])[x];
      uint16_t got = ((const uint16_t *)at[b])[x], want = cb->type == CG_BF16 ? ts_f32_to_bf16(in) : ts_f32_to_f16(in);
      CHECK(got == want, "%s (%s): element %lld = %.9g: bits 0x%04x, half.h 0x%04x", kp->what, how, (long long)x,
            (double)in, got, want);
    }
    /* f32 kernels compute in f32: a result that cancels (softmax_bwd's
     * y (dy - sum y dy)) is off by f32 rounding of the terms it cancels,
     * so its error is measured against the buffer's largest element */
    double scale = 0;
    for (int64_t x = 0; cb->type == CG_F32 && kp->ref[b] && x < cb->n; x++)
      if (isfinite(kp->ref[b][x])) scale = fmax(scale, fabs(kp->ref[b][x]));
    int64_t bad = -1, badj = -1;
    for (int64_t x = 0; x < cb->n; x++) {
      double got = ldc(at[b], cb->type, x), want = kp->ref[b] ? kp->ref[b][x] : 0;
      double jit = kp->jit[b] ? ldc(kp->jit[b], cb->type, x) : 0;
      if (bad < 0 && kp->ref[b] && !rel_ok(got, want, tol) && !(fabs(got - want) <= tol * scale)) bad = x;
      if (badj < 0 && kp->jit[b] && !rel_ok(got, jit, tol) && !(fabs(got - jit) <= tol * scale)) badj = x;
    }
    CHECK(bad < 0, "%s (%s, %s): buffer %d element %lld = %.17g, reference %.17g", kp->what, how, kp->l.name, b,
          (long long)bad, bad >= 0 ? ldc(at[b], cb->type, bad) : 0.0, bad >= 0 ? kp->ref[b][bad] : 0.0);
    CHECK(badj < 0, "%s (%s, %s): buffer %d element %lld = %.17g, LLVM kernel %.17g", kp->what, how, kp->l.name, b,
          (long long)badj, badj >= 0 ? ldc(at[b], cb->type, badj) : 0.0,
          badj >= 0 ? ldc(kp->jit[b], cb->type, badj) : 0.0);
    size_t bytes = bytes_of(cb);
    if (save) save[b] = memcpy(ts_xmalloc(bytes + 1), at[b], bytes);
    if (same && same[b] && memcmp(same[b], at[b], bytes) != 0) {
      int64_t x = 0;
      size_t es = cg_size(cb->type);
      while (x < cb->n && memcmp((char *)same[b] + x * es, (char *)at[b] + x * es, es) == 0) x++;
      CHECK(0, "%s (%s, %s): buffer %d element %lld = %.17g, %.17g in the default order: the result depends on the "
            "order threads and blocks run in", kp->what, how, kp->l.name, b, (long long)x, ldc(at[b], cb->type, x),
            ldc(same[b], cb->type, x));
    }
  }
  for (int b = 0; b < kp->nbuf; b++) munmap(mem[b], mlen[b]);
}

static void check_emu(void) {
  char *src = module_text();
  TsEmu *e = ts_emu_load(src, err, sizeof err);
  CHECK(e != NULL, "the module does not compile for the emulator: %s", err);
  free(src);
  if (!e) return;
  int strided = 0;
  for (int i = 0; i < g_kept.n; i++) {
    const Kept *kp = &g_kept.a[i];
    void *fifo[CG_MAX_BUFS] = {0};
    emu_run(e, kp, &kp->l, "own launch", fifo, NULL);
    /* the same bits whatever order the threads and blocks run in (the
     * emulator's TS_EMU_ORDER: a race a GPU may show changes them) */
    char seed[32];
    snprintf(seed, sizeof seed, "random:%d", i + 1);
    const char *orders[] = {"reverse", seed};
    for (int o = 0; o < 2; o++) {
      setenv("TS_EMU_ORDER", orders[o], 1);
      emu_run(e, kp, &kp->l, o ? "threads and blocks in random order" : "threads and blocks in reverse order", NULL,
              fifo);
    }
    unsetenv("TS_EMU_ORDER");
    for (int b = 0; b < CG_MAX_BUFS; b++) free(fifo[b]);
    if (kp->l.blocks > 3) {   /* fewer blocks than the space: the kernel loops */
      CgCudaLaunch l = kp->l;
      l.blocks = 3;
      emu_run(e, kp, &l, "3 blocks", NULL, NULL);
      strided++;
    }
  }
  printf("emu: %d kernels run and compared, each also in reverse and random order (bit for bit); %d also with 3 "
         "blocks\n", g_kept.n, strided);
  ts_emu_free(e);
}
#endif

/* ptxas' stack report, read: a kernel that calls a function with a local
 * array (not inlined) has a stack frame and a cumulative stack size, and
 * cg_ptxas_check refuses it; the function alone is fine. */
static void check_stack(void) {
  char why[512];
  if (!cg_nvrtc_available(why, sizeof why)) { printf("stack: skipped: %s\n", why); CHECK(1); return; }
  const char *src =
      "extern \"C\" __device__ __noinline__ int f(int i) {\n"
      "  volatile int a[64];\n  for (int j = 0; j < 64; j++) a[j] = i + j;\n  return a[i & 63];\n}\n"
      "extern \"C\" __global__ void k(int *o) { o[threadIdx.x] = f(threadIdx.x); }\n";
  CgNvrtcOut o;
  CHECK(cg_nvrtc_compile(src, "sm_90", &o, err, sizeof err) == 0, "NVRTC: %s", err);
  int seen = 0;
  for (int i = 0; i < o.nkern; i++) {
    const CgPtxasInfo *k = &o.kern[i];
    if (strcmp(k->name, "k") != 0) continue;
    seen = 1;
    printf("stack: k: %lld bytes stack frame, %lld bytes cumulative\n", (long long)k->stack, (long long)k->cstack);
    CHECK(k->stack > 0 && k->cstack >= k->stack, "ptxas' stack report not read: frame %lld, cumulative %lld",
          (long long)k->stack, (long long)k->cstack);
    CHECK(cg_ptxas_check(k, "sm_90", err, sizeof err) != 0 && strstr(err, "stack"), "a kernel with a stack passed");
    CgPtxasInfo c = *k;
    c.stack = 0;   /* the callee's frame alone is caught too */
    CHECK(cg_ptxas_check(&c, "sm_90", err, sizeof err) != 0 && strstr(err, "with the functions it calls"),
          "a cumulative stack passed: %s", err);
  }
  CHECK(seen, "no report for kernel k");
  cg_nvrtc_out_free(&o);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "all";
  if (!strcmp(mode, "stack")) {
    check_stack();
    return check_exit("test_cuda_print");
  }
  g_jit = cg_jit_new(err, sizeof err);
  if (!g_jit) {
    fprintf(stderr, "cannot create the JIT: %s\n", err);
    return 1;
  }
  build_all();
  if (strcmp(mode, "--emit") == 0) {
    char *src = module_text();
    CHECK(argc > 2 && ts_write_file(argv[2], src, strlen(src)) == 0, "cannot write %s",
          argc > 2 ? argv[2] : "?");
    free(src);
  }
  if (!strcmp(mode, "shape") || !strcmp(mode, "all")) check_shapes();
  int part = argc > 2 ? atoi(argv[2]) : 0, parts = argc > 3 ? atoi(argv[3]) : 1;
  if (!strcmp(mode, "sm_80") || !strcmp(mode, "all")) check_nvrtc("sm_80", part, parts);
  if (!strcmp(mode, "sm_90") || !strcmp(mode, "all")) check_nvrtc("sm_90", part, parts);
#ifdef TS_EMU_HEADER
  if (!strcmp(mode, "emu") || !strcmp(mode, "all")) check_emu();
#else
  if (!strcmp(mode, "emu")) printf("emu: SKIPPED (built without the emulator)\n");
#endif
  kept_free();
  cg_jit_free(g_jit);
  return check_exit("test_cuda_print");
}
