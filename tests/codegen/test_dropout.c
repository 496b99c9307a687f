/* test_dropout.c - dropout inside a fused kernel against the reference
 * kernel (ops_ref_t.h k_DROPOUT), BIT FOR BIT.
 *
 * The group is bias + dropout + residual add on x[4, 5, 67] (odd sizes, so
 * the vector loop has a tail):  z = dropout(x + broadcast(bias), p) + r.
 * The reference runtime runs the module node by node with RtRunInfo
 * {step, micro} and the module's seed; the kernel (LLVM JIT, and the C
 * printer's text compiled with cc when there is one) runs with those as
 * its run-time scalars (kir.h PARAM: bufs[nbuf] = {seed, step, micro}).
 * Every output element must have the same bits, in f32 and f64, for
 * p in {0.1, 0.5} and several (step, micro); the dropped fraction must be
 * near p (a mask that kept everything would also agree on p = 0 only);
 * different steps, micro batches or seeds must give different masks.
 * Plus: p = 0, the kernel text names its params, and the
 * lowering refuses a split dropout and p outside [0, 1].  And rand, which
 * draws with the same hash (test_rand). */
#include "codegen/cg.h"
#include "runtime/exec/rt.h"
#include <dlfcn.h>
#include <math.h>
#include <unistd.h>
#include "compile_c.h"
#include "../check.h"

static char err[2048];

enum { B = 4, T = 5, C = 67, N = B * T * C };

static IrType ty3(IrDtype dt) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = 3;
  t.dim[0] = B, t.dim[1] = T, t.dim[2] = C;
  return t;
}

/* deterministic inputs in [-1, 1) (a local LCG: independent of rng.c) */
static double urand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*s >> 11) / 9007199254740992.0 * 2 - 1;
}

static int emit(IrModule *m, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa, const char *sa,
                const IrType *typed) {
  int id = ir_emit(m, 0, op, in, nin, ia, fa, sa, typed, err, sizeof err);
  if (id < 0) TS_DIE("test setup: %s: %s", ir_ops[op].name, err);
  return id;
}


/* z accumulated into a new state z_out of type t (so the reference's
 * result can be read back): the state's index. */
static int accum_out(IrModule *m, int z, const IrType *t) {
  IrState st;
  memset(&st, 0, sizeof st);
  st.name = ts_intern("z_out");
  st.type = *t;
  st.kind = IR_STATE_GRAD;
  st.of = -1;
  int sid = ir_state_add(m, &st);
  emit(m, IR_OP_ACCUM, &z, 1, (int64_t[]){sid}, NULL, NULL, NULL);
  return sid;
}

typedef struct {
  IrModule *m;
  int nodes[4], ngroup;   /* broadcast, add, dropout, add */
  int x, bias, r, st;     /* inputs; the state the reference accumulates z into */
  void *xd, *bd, *rd;
} Drop;

/* The module: inputs x [B,T,C], bias [C], r [B,T,C]; the group; z summed
 * into a state (accum) so the reference's result can be read back. */
static void drop_init(Drop *d, IrDtype dt, double p, int64_t stream, uint64_t seed) {
  memset(d, 0, sizeof *d);
  d->m = ir_module_new("drop");
  ir_block_add(d->m, "forward");
  d->m->train.seed = seed;
  IrType t = ty3(dt), tb = t;
  tb.rank = 1;
  tb.dim[0] = C;
  size_t es = ir_dtype_size(dt);
  d->xd = ts_xmalloc(N * es), d->bd = ts_xmalloc(C * es), d->rd = ts_xmalloc(N * es);
  uint64_t s = 42;
  for (int i = 0; i < N; i++) {
    double a = urand(&s), c = urand(&s);
    if (dt == IR_F32) ((float *)d->xd)[i] = (float)a, ((float *)d->rd)[i] = (float)c;
    else ((double *)d->xd)[i] = a, ((double *)d->rd)[i] = c;
  }
  for (int i = 0; i < C; i++) {
    double a = urand(&s);
    if (dt == IR_F32) ((float *)d->bd)[i] = (float)a;
    else ((double *)d->bd)[i] = a;
  }
  d->x = emit(d->m, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &t);
  d->bias = emit(d->m, IR_OP_INPUT, NULL, 0, NULL, NULL, "bias", &tb);
  d->r = emit(d->m, IR_OP_INPUT, NULL, 0, NULL, NULL, "r", &t);
  int bb = emit(d->m, IR_OP_BROADCAST, &d->bias, 1, NULL, NULL, NULL, &t);
  int a = emit(d->m, IR_OP_ADD, (int[]){d->x, bb}, 2, NULL, NULL, NULL, NULL);
  int dr = emit(d->m, IR_OP_DROPOUT, &a, 1, (int64_t[]){stream}, (double[]){p}, NULL, NULL);
  int z = emit(d->m, IR_OP_ADD, (int[]){dr, d->r}, 2, NULL, NULL, NULL, NULL);
  d->nodes[0] = bb, d->nodes[1] = a, d->nodes[2] = dr, d->nodes[3] = z;
  d->ngroup = 4;
  d->st = accum_out(d->m, z, &t);
}
static void drop_free(Drop *d) {
  ir_module_free(d->m);
  free(d->xd), free(d->bd), free(d->rd);
}

/* The reference's z at (step, micro) into want (N elements of dt). */
static int reference(Drop *d, int64_t step, int micro, void *want) {
  RtProgram *p = rt_program_new(d->m, err, sizeof err);
  if (!p) { CHECK(0, "rt_program_new: %s", err); return -1; }
  RtFeed feeds[3] = {{"x", d->xd}, {"bias", d->bd}, {"r", d->rd}};
  RtRunInfo info = {step, micro, 1e-3, 0};
  int rc = rt_run_block(p, 0, feeds, 3, &info, err, sizeof err);
  CHECK(rc == 0, "reference run: %s", err);
  if (rc == 0) memcpy(want, rt_state_data(p, d->st), N * ir_dtype_size(d->m->states.a[d->st].type.dtype));
  rt_program_free(p);
  return rc;
}

/* The kernel's buffers for io: inputs by value id, then the output. */
static void kernel_bufs(const Drop *d, const CgGroupIO *io, void *out, int64_t *prm, void **bufs) {
  for (int i = 0; i < io->nin; i++)
    bufs[i] = io->in[i] == d->x ? d->xd : io->in[i] == d->bias ? d->bd : d->rd;
  bufs[io->nin] = out;
  bufs[io->nin + 1] = prm;
}

/* How many elements of z equal r exactly: the dropped ones. */
static int64_t dropped(const Drop *d, IrDtype dt, const void *z) {
  int64_t c = 0;
  for (int i = 0; i < N; i++)
    c += dt == IR_F32 ? ((const float *)z)[i] == ((const float *)d->rd)[i] : ((const double *)z)[i] == ((const double *)d->rd)[i];
  return c;
}

static void test_bits(IrDtype dt, double p) {
  Drop d;
  uint64_t seed = 1234567;
  drop_init(&d, dt, p, 3, seed);
  CgGroupIO io;
  CgKernel *k = cg_lower_group(d.m, &d.m->blocks.a[0], d.nodes, d.ngroup, &io, err, sizeof err);
  CHECK(k != NULL, "lowering bias+dropout+residual: %s", err);
  if (!k) { drop_free(&d); return; }
  CHECK(io.nin == 3 && io.nout == 1 && k->nparam == CG_PARAM_COUNT, "io %d in %d out, %d params", io.nin, io.nout,
        k->nparam);
  StrBuf txt = {0};
  cg_kernel_print(k, &txt);
  CHECK(strstr(txt.p, "params=3") && strstr(txt.p, "= param 1 : i64") && strstr(txt.p, "= xor") && strstr(txt.p, "= shr"),
        "kernel text lacks params / param / xor / shr:\n%s", txt.p);
  sb_free(&txt);
  CgFn fn = cg_jit_compile(g_jit, k, err, sizeof err);
  CHECK(fn != NULL, "JIT: %s", err);
  StrBuf ll = {0};   /* --emit=llvm's text: the scalars are read from bufs[nbuf] */
  char at[64];
  snprintf(at, sizeof at, "getelementptr inbounds ptr, ptr %%0, i64 %d", k->nbuf);
  CHECK(cg_kernel_llvm_text(k, 0, &ll, err, sizeof err) == 0 && ll.p && strstr(ll.p, at), "LLVM text (want '%s'): %s\n%s",
        at, err, ll.p ? ll.p : "");
  sb_free(&ll);
  CgFn cfn = NULL;
  void *h = NULL;
  if (g_have_cc) {
    StrBuf src = {0};
    CHECK(cg_kernel_c_text(k, &src, err, sizeof err) == 0, "C printer: %s", err);
    cfn = src.p ? compile_c(src.p, k->name, &h) : NULL;
    CHECK(cfn != NULL, "the printed C does not compile:\n%s", src.p ? src.p : "");
    sb_free(&src);
  }
  size_t bytes = N * ir_dtype_size(dt);
  void *want = ts_xmalloc(bytes), *got = ts_xmalloc(bytes), *first = ts_xmalloc(bytes);
  const int64_t steps[3] = {0, 1, 7};
  const int micros[2] = {0, 3};
  for (int si = 0; si < 3 && fn; si++)
    for (int mi = 0; mi < 2; mi++) {
      int64_t step = steps[si];
      int micro = micros[mi];
      if (reference(&d, step, micro, want) != 0) continue;
      int64_t prm[CG_PARAM_COUNT] = {(int64_t)seed, step, micro};
      void *bufs[CG_MAX_BUFS + 1];
      memset(got, 0xff, bytes);
      kernel_bufs(&d, &io, got, prm, bufs);
      /* in three pieces: the mask depends on the element, not the piece */
      fn(bufs, 0, k->grid / 3);
      fn(bufs, k->grid / 3, k->grid);
      CHECK(memcmp(got, want, bytes) == 0, "%s p=%g step %lld micro %d: the JIT kernel's bits differ from the reference",
            ir_dtype_name(dt), p, (long long)step, micro);
      if (cfn) {
        memset(got, 0xff, bytes);
        cfn(bufs, 0, k->grid);
        CHECK(memcmp(got, want, bytes) == 0, "%s p=%g step %lld micro %d: the C kernel's bits differ from the reference",
              ir_dtype_name(dt), p, (long long)step, micro);
      }
      /* about p of the elements dropped: N = 1340, 5 sigma is under 0.07 */
      double frac = (double)dropped(&d, dt, want) / N;
      CHECK(fabs(frac - p) < 0.07, "%s p=%g: %.3f of the elements dropped", ir_dtype_name(dt), p, frac);
      if (si == 0 && mi == 0) memcpy(first, want, bytes);
      else CHECK(memcmp(first, want, bytes) != 0, "step %lld micro %d draws step 0 micro 0's mask", (long long)step, micro);
    }
  /* another seed: another mask (the seed is a run-time scalar too) */
  if (fn) {
    int64_t prm[CG_PARAM_COUNT] = {(int64_t)seed + 1, 0, 0};
    void *bufs[CG_MAX_BUFS + 1];
    kernel_bufs(&d, &io, got, prm, bufs);
    fn(bufs, 0, k->grid);
    CHECK(memcmp(got, first, bytes) != 0, "seed + 1 draws seed's mask");
  }
  if (h) dlclose(h);
  free(want), free(got), free(first);
  cg_kernel_free(k);
  drop_free(&d);
}

/* p = 0 keeps everything (x + b + r), bit for bit with the reference
 * (which copies; ir_emit refuses p = 1). */
static void test_edges(IrDtype dt) {
  {
    double p = 0;
    Drop d;
    drop_init(&d, dt, p, 0, 99);
    CgGroupIO io;
    CgKernel *k = cg_lower_group(d.m, &d.m->blocks.a[0], d.nodes, d.ngroup, &io, err, sizeof err);
    CHECK(k != NULL, "lowering p=%g: %s", p, err);
    CgFn fn = k ? cg_jit_compile(g_jit, k, err, sizeof err) : NULL;
    size_t bytes = N * ir_dtype_size(dt);
    void *want = ts_xmalloc(bytes), *got = ts_xmalloc(bytes);
    if (fn && reference(&d, 5, 1, want) == 0) {
      int64_t prm[CG_PARAM_COUNT] = {99, 5, 1};
      void *bufs[CG_MAX_BUFS + 1];
      kernel_bufs(&d, &io, got, prm, bufs);
      fn(bufs, 0, k->grid);
      CHECK(memcmp(got, want, bytes) == 0, "%s p=%g: bits differ from the reference", ir_dtype_name(dt), p);
    }
    free(want), free(got);
    cg_kernel_free(k);
    drop_free(&d);
  }
}

/* The lowering refuses what the kernel cannot compute: p outside [0, 1]
 * (the reference reports it) and a dropout split across ranks (its mask
 * needs global indices). */
static void test_refusals(void) {
  Drop d;
  drop_init(&d, IR_F32, 0.1, 0, 1);
  d.m->blocks.a[0].nodes[d.nodes[2]].fa[0] = 1.5;   /* past ir_emit's check: a hand-made node */
  CgGroupIO io;
  CgKernel *k = cg_lower_group(d.m, &d.m->blocks.a[0], d.nodes, d.ngroup, &io, err, sizeof err);
  CHECK(k == NULL && strstr(err, "p = 1.5"), "p = 1.5 lowered (or message '%s')", err);
  cg_kernel_free(k);
  drop_free(&d);
  drop_init(&d, IR_F32, 0.1, 0, 1);
  d.m->blocks.a[0].nodes[d.nodes[2]].sh.split[1] = 1u << IR_AXIS_TP;
  k = cg_lower_group(d.m, &d.m->blocks.a[0], d.nodes, d.ngroup, &io, err, sizeof err);
  CHECK(k == NULL && strstr(err, "split"), "a split dropout lowered (or message '%s')", err);
  cg_kernel_free(k);
  drop_free(&d);
}

/* rand (the counter-based draw of BERT's masking, ops_ref.c ref_RAND): the
 * same hash as dropout's, lo + u (hi - lo) in f64 and, for i32, its floor.
 * The group rand -> cast to f64, accumulated into a state: the kernel's
 * bits equal the reference's at several (step, micro), every value is in
 * [lo, hi) (an integer for i32), and the draw is not constant; a split rand
 * is refused by the lowering (it needs global indices). */
static void test_rand(IrDtype dt, double lo, double hi) {
  IrModule *m = ir_module_new("rand");
  ir_block_add(m, "forward");
  uint64_t seed = 777;
  m->train.seed = seed;
  IrType t = ty3(dt), t64 = ty3(IR_F64);
  int r = emit(m, IR_OP_RAND, NULL, 0, (int64_t[]){5}, (double[]){lo, hi}, NULL, &t);
  int c = emit(m, IR_OP_CAST, &r, 1, NULL, NULL, NULL, &t64);
  int sid = accum_out(m, c, &t64);
  int nodes[2] = {r, c};
  CgGroupIO io;
  CgKernel *k = cg_lower_group(m, &m->blocks.a[0], nodes, 2, &io, err, sizeof err);
  CHECK(k != NULL && io.nin == 0 && io.nout == 1, "lowering rand %s: %s", ir_dtype_name(dt), err);
  CgFn fn = k ? cg_jit_compile(g_jit, k, err, sizeof err) : NULL;
  CHECK(!k || fn != NULL, "JIT: %s", err);
  double *want = ts_xmalloc(N * sizeof *want), *got = ts_xmalloc(N * sizeof *got);
  for (int64_t step = 0; step < 3 && fn; step++)
    for (int micro = 0; micro < 2; micro++) {
      RtProgram *p = rt_program_new(m, err, sizeof err);
      CHECK(p != NULL, "rt_program_new: %s", err);
      if (!p) continue;
      RtRunInfo info = {step, micro, 1e-3, 0};
      int rc = rt_run_block(p, 0, NULL, 0, &info, err, sizeof err);
      CHECK(rc == 0, "reference run: %s", err);
      if (rc == 0) memcpy(want, rt_state_data(p, sid), N * sizeof *want);
      rt_program_free(p);
      if (rc) continue;
      int64_t prm[CG_PARAM_COUNT] = {(int64_t)seed, step, micro};
      void *bufs[CG_MAX_BUFS + 1] = {got, prm};
      memset(got, 0xff, N * sizeof *got);
      fn(bufs, 0, k->grid / 2);
      fn(bufs, k->grid / 2, k->grid);
      CHECK(memcmp(got, want, N * sizeof *got) == 0, "rand %s [%g, %g) step %lld micro %d: the kernel's bits differ "
            "from the reference", ir_dtype_name(dt), lo, hi, (long long)step, micro);
      int ok = 1, distinct = 0;
      for (int i = 0; i < N; i++) {
        ok &= want[i] >= lo && want[i] < hi && (dt != IR_I32 || want[i] == floor(want[i]));
        distinct += i > 0 && want[i] != want[i - 1];
      }
      CHECK(ok && distinct > N / 2, "rand %s [%g, %g): values outside the range, not integers, or constant (%d changes)",
            ir_dtype_name(dt), lo, hi, distinct);
    }
  free(want), free(got);
  cg_kernel_free(k);
  m->blocks.a[0].nodes[r].sh.split[1] = 1u << IR_AXIS_CP;
  k = cg_lower_group(m, &m->blocks.a[0], nodes, 2, &io, err, sizeof err);
  CHECK(k == NULL && strstr(err, "split"), "a split rand lowered (or message '%s')", err);
  cg_kernel_free(k);
  ir_module_free(m);
}

int main(void) {
  codegen_test_init();
  test_rand(IR_I32, 0, 256);
  test_rand(IR_I32, -7, 5);
  test_rand(IR_F32, -1, 1);
  test_rand(IR_F64, 0, 1);
  IrDtype dts[2] = {IR_F32, IR_F64};
  for (int i = 0; i < 2; i++) {
    test_bits(dts[i], 0.1);
    test_bits(dts[i], 0.5);
    test_edges(dts[i]);
  }
  test_refusals();
  cg_jit_free(g_jit);
  return check_exit("test_dropout");
}
