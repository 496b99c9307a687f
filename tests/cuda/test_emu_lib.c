/* test_emu_lib - CUDA library kernels (codegen/cuda_attn.c, cuda_lib.c)
 * against the reference kernels (runtime/cpu/ops_attn.c, ops_ring.c,
 * ops_ref.c); the mixture-of-experts kernels are checked by whole training
 * steps instead (tests/cuda_step, cuda.step_moe_*).
 *
 * Each case is a small module in IR text: q, k, v, do and the ring steps'
 * other operands are parameter states (initialized identically on both
 * sides); every result is accumulated into a state "out...".  One run on
 * the CPU backend, one on the emulated device (tests/cuda/emu_dev.c: the
 * library CUDA C compiled by the host C++ compiler), every out state
 * compared: max |dev - cpu| / max(|cpu|, 1e-3) <= 1e-10 (f64); f32:
 * max |dev - cpu| / max(|cpu|, largest |cpu| of the state) <= 1e-5.
 *
 *   test_emu_lib fused    attention and the three parts of attention_bwd,
 *                         causal and not, grouped-query (groups 1, 2, 4),
 *                         sequence lengths that leave partial tiles, head
 *                         sizes 8 .. 128 (tiles 64 down to 8), f32 and f64
 *   test_emu_lib ring     the ring steps under cp = 2 (attn_acc from a
 *                         zero state and from the previous step, attn_finish,
 *                         attn_lse, attn_bwd_q, attn_bwd_kv dk and dv, keys
 *                         from this rank's and the other rank's block) on
 *                         both cp coordinates: the causal mask by global
 *                         positions of the zigzag layout
 *   test_emu_lib docs     both of the above with document ids (packed
 *                         sequences: a fourth / last operand, i32 [B, T] of
 *                         the whole sequence; contiguous documents in even
 *                         batch rows, interleaved ones in odd rows) and a
 *                         sliding window (window = a third of the sequence)
 *   test_emu_lib grads    the parts of one attention's backward as the
 *                         executor groups them: one launch group on the
 *                         device (statistics once, dq, dk + dv in one
 *                         kernel), every fused case with and without
 *                         documents and a window, f32 and f64 (f64 within
 *                         1e-12); its launches counted against the parts
 *                         run apart (3 against 6)
 *   test_emu_lib vocab  take, onehot and pad_fill on a dim split over
 *                         tp = 2, both coordinates: global indices, ids in
 *                         the other rank's block and the ignored id
 *   test_emu_lib decode   the generation ops at a run-time position (the
 *                         input "pos"): kv_write into two caches, rope_at,
 *                         slice_at, attn_cached (grouped-query, windows,
 *                         1 to 5 new rows), f32 and f64 (nvrtc: with a
 *                         cache of 1024 positions)
 *   test_emu_lib moe_overflow  moe_perm with more routed (token, expert)
 *                         pairs than rows (an internal error the CPU
 *                         refuses; a kernel cannot fail, so it poisons row
 *                         0 with NaN): row 0 all NaN on the emulated device
 *                         whatever order its threads and blocks run in
 *                         (TS_EMU_ORDER fifo, reverse, random)
 *   test_emu_lib fp8      --fp8's kernels (codegen/cuda_fp8.c): quant8 of f32
 *                         and bf16 into e4m3 and e5m2 (scale 1 and ~3),
 *                         cast back to f32, amax_acc, fp8_scale (algo 0
 *                         and 1, margin, a NaN amax), on NaN, infinities,
 *                         saturation, ties of both formats, subnormals of
 *                         both formats and of f32: every state bit for bit
 *                         against the CPU (runtime/cpu/half.h's bits), the
 *                         module also through NVRTC (sm_90, sm_89)
 *   test_emu_lib nvrtc    every module above compiled by NVRTC for sm_80
 *                         and sm_90, and the backward's launch group at
 *                         GPT-2's shapes (seq 1024, head_dim 64 and 128);
 *                         ptxas' report of every attention kernel within
 *                         limits (no spills, no stack, shared memory
 *                         <= 48 KiB)
 */
#include "runtime/exec/rt.h"
#include "runtime/exec/dev_prog.h"
#include "runtime/cpu/half.h"
#include "emu_dev.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"

/* Tk: the keys' length when it differs from the queries' T (cross-attention;
 * 0: T) */
typedef struct { int B, Hq, Hkv, T, D, causal, Tk; } Case;

/* the fused op's cases: partial tiles (37, 20, 10 rows), groups 1, 2, 4,
 * head sizes whose shared tiles shrink (f64: 64 at D 8 down to 8 at D 128) */
static const Case fused_cases[] = {
  {2, 4, 2, 37, 16, 1, 0}, {1, 2, 2, 20, 64, 0, 0}, {1, 8, 2, 24, 8, 1, 0}, {1, 2, 1, 10, 128, 1, 0},
  {1, 3, 3, 70, 8, 1, 0},
};

/* ---- module text ---- */

typedef struct {
  StrBuf st, body;
  const char *dt, *sh;   /* dtype; the sharding suffix of every 4-D / 3-D value (" {2:cp}" or "") */
  int n, nout;
} Mod;

static int m_state(Mod *m, const char *name, const char *shape, const char *init) {
  sb_printf(&m->st, "state @%s : %s%s%s param init=%s\n", name, m->dt, shape, m->sh, init);
  sb_printf(&m->body, "  %%%d = state @%s : %s%s%s\n", m->n, name, m->dt, shape, m->sh);
  return m->n++;
}

__attribute__((format(printf, 3, 4)))
static int m_op(Mod *m, const char *shape, const char *fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  sb_printf(&m->body, "  %%%d = %s : %s%s%s\n", m->n, text, m->dt, shape, m->sh);
  return m->n++;
}

/* result v accumulated into a fresh state starting away from 0 */
static void m_out(Mod *m, int v, const char *shape) {
  sb_printf(&m->st, "state @out%d : %s%s%s param init=uniform(0.5, 1.5)\n", m->nout, m->dt, shape, m->sh);
  sb_printf(&m->body, "  accum %%%d @out%d\n", v, m->nout++);
  m->n++;
}

static char *m_text(Mod *m, int cp, int tp) {
  StrBuf t = {0};
  sb_printf(&t, "module attn\ntrain lr=0.01 seed=99 precision=%s\n", m->dt);
  sb_printf(&t, "parallel tp=%d pp=1 cp=%d ep=1 dp=0 sp=0\n%sblock main {\n%s}\nend\n", tp, cp, m->st.p, m->body.p);
  sb_free(&m->st);
  sb_free(&m->body);
  return t.p;
}

static void shp(char *b, size_t n, int B, int H, int T, int D) {
  if (D > 0) snprintf(b, n, "[%d, %d, %d, %d]", B, H, T, D);
  else snprintf(b, n, "[%d, %d, %d]", B, H, T);
}

/* ALiBi (test "alibi"): every attention op of the next cases gets a
 * slopes operand (a state of Hq slopes in [0.1, 0.9]) and alibi=1. */
static int case_alibi;

/* The optional operands of a case's attention ops: ALiBi's slopes (when
 * case_alibi) and the document ids (docs: an i32 [B, Tg] input named
 * document_ids that doc_ids() feeds); *suf gets ", %SLOPE, %ID" (those
 * there) to append to the attention ops' operands. */
static void m_docs(Mod *m, int docs, int Hq, int B, int Tg, char *suf, size_t n) {
  suf[0] = 0;
  if (case_alibi) {
    sb_printf(&m->st, "state @slope : %s[%d] param init=uniform(0.1, 0.9)\n", m->dt, Hq);
    sb_printf(&m->body, "  %%%d = state @slope : %s[%d]\n", m->n, m->dt, Hq);
    m->n++;
    /* a value, as a model's slopes are (the grouped backward takes no state operand) */
    sb_printf(&m->body, "  %%%d = muls %%%d c=1.0 : %s[%d]\n", m->n, m->n - 1, m->dt, Hq);
    snprintf(suf, n, ", %%%d", m->n++);
  }
  if (!docs) return;
  sb_printf(&m->body, "  %%%d = input \"document_ids\" : i32[%d, %d]\n", m->n, B, Tg);
  size_t at = strlen(suf);
  snprintf(suf + at, n - at, ", %%%d", m->n++);
}

/* attention and the three parts of its backward */
static char *fused_text(const Case *c, const char *dt, int docs, int window) {
  Mod m = {.dt = dt, .sh = ""};
  char qs[64], ks[64], sc[96], ds[32];
  shp(qs, sizeof qs, c->B, c->Hq, c->T, c->D);
  shp(ks, sizeof ks, c->B, c->Hkv, c->Tk ? c->Tk : c->T, c->D);
  snprintf(sc, sizeof sc, "causal=%d window=%d alibi=%d scale=%.17g", c->causal, window, case_alibi,
           1.0 / sqrt((double)c->D));
  int q = m_state(&m, "q", qs, "normal(0.0, 1.0)"), k = m_state(&m, "k", ks, "normal(0.0, 1.0)");
  int v = m_state(&m, "v", ks, "normal(0.0, 1.0)"), d = m_state(&m, "do", qs, "normal(0.0, 1.0)");
  m_docs(&m, docs, c->Hq, c->B, c->T, ds, sizeof ds);
  int o = m_op(&m, qs, "attention %%%d, %%%d, %%%d%s causal=%d window=%d alibi=%d bias=0 scale=%.17g", q, k, v, ds,
               c->causal, window, case_alibi, 1.0 / sqrt((double)c->D));
  m_out(&m, o, qs);
  for (int part = 0; part < 3; part++)
    m_out(&m, m_op(&m, part ? ks : qs, "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d%s causal=%d part=%d window=%d alibi=%d bias=0 "
                   "scale=%.17g", q, k, v, o, d, ds, c->causal, part, window, case_alibi, 1.0 / sqrt((double)c->D)),
          part ? ks : qs);
  return m_text(&m, 1, 1);
}

/* attention and the parts of its backward in `parts` (bit p: part p) as
 * the executor groups them (plan_attn_grad_runs: the parts one after
 * another, on values, nothing reading one before the last): one launch
 * group on a device (cg_cuda_attn_grads_kernel), one pass on the CPU.
 * q, k, v, do are values (times 1), not states. */
static char *grads_text(const Case *c, const char *dt, int docs, int window, int parts) {
  Mod m = {.dt = dt, .sh = ""};
  char qs[64], ks[64], ds[32];
  shp(qs, sizeof qs, c->B, c->Hq, c->T, c->D);
  shp(ks, sizeof ks, c->B, c->Hkv, c->Tk ? c->Tk : c->T, c->D);
  int q = m_state(&m, "q", qs, "normal(0.0, 1.0)"), k = m_state(&m, "k", ks, "normal(0.0, 1.0)");
  int v = m_state(&m, "v", ks, "normal(0.0, 1.0)"), d = m_state(&m, "do", qs, "normal(0.0, 1.0)");
  q = m_op(&m, qs, "muls %%%d c=1.0", q);
  k = m_op(&m, ks, "muls %%%d c=1.0", k);
  v = m_op(&m, ks, "muls %%%d c=1.0", v);
  d = m_op(&m, qs, "muls %%%d c=1.0", d);
  m_docs(&m, docs, c->Hq, c->B, c->T, ds, sizeof ds);
  double scale = 1.0 / sqrt((double)c->D);
  int o = m_op(&m, qs, "attention %%%d, %%%d, %%%d%s causal=%d window=%d alibi=%d bias=0 scale=%.17g", q, k, v, ds, c->causal,
               window, case_alibi, scale);
  m_out(&m, o, qs);
  int g[3], ng = 0;
  for (int part = 0; part < 3; part++)
    if (parts & (1 << part))
      g[ng++] = m_op(&m, part ? ks : qs, "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d%s causal=%d part=%d window=%d alibi=%d bias=0 "
                     "scale=%.17g", q, k, v, o, d, ds, c->causal, part, window, case_alibi, scale);
  for (int j = 0, part = 0; part < 3; part++)
    if (parts & (1 << part)) m_out(&m, g[j++], part ? ks : qs);
  (void)ng;
  return m_text(&m, 1, 1);
}

/* the ring steps of one rank under cp = 2: local sequence T (a zigzag of
 * two chunks of T / 2); keys of block src 0 (this rank's) and 1 (the
 * other rank's) */
static char *ring_text(const Case *c, const char *dt, int docs, int window) {
  Mod m = {.dt = dt, .sh = " {2:cp}"};
  char qs[64], ks[64], ss[64], rs[64], sc[64], ds[32];
  shp(qs, sizeof qs, c->B, c->Hq, c->T, c->D);
  shp(ks, sizeof ks, c->B, c->Hkv, c->T, c->D);
  shp(ss, sizeof ss, c->B, c->Hq, c->T, c->D + 2);
  shp(rs, sizeof rs, c->B, c->Hq, c->T, 0);
  snprintf(sc, sizeof sc, "scale=%.17g", 1.0 / sqrt((double)c->D));
  int q = m_state(&m, "q", qs, "normal(0.0, 1.0)");
  int k0 = m_state(&m, "k0", ks, "normal(0.0, 1.0)"), v0 = m_state(&m, "v0", ks, "normal(0.0, 1.0)");
  int k1 = m_state(&m, "k1", ks, "normal(0.0, 1.0)"), v1 = m_state(&m, "v1", ks, "normal(0.0, 1.0)");
  int z = m_state(&m, "st0", ss, "zeros");
  int d = m_state(&m, "do", qs, "normal(0.0, 1.0)"), dr = m_state(&m, "drow", rs, "normal(0.0, 0.5)");
  int aq = m_state(&m, "dq0", qs, "normal(0.0, 1.0)"), ak = m_state(&m, "dk0", ks, "normal(0.0, 1.0)");
  m_docs(&m, docs, c->Hq, c->B, 2 * c->T, ds, sizeof ds);
  int s1 = m_op(&m, ss, "attn_acc %%%d, %%%d, %%%d, %%%d%s causal=%d src=0 window=%d alibi=%d %s", q, k0, v0, z, ds,
                c->causal, window, case_alibi, sc);
  int s2 = m_op(&m, ss, "attn_acc %%%d, %%%d, %%%d, %%%d%s causal=%d src=1 window=%d alibi=%d %s", q, k1, v1, s1, ds,
                c->causal, window, case_alibi, sc);
  m_out(&m, s1, ss);
  m_out(&m, s2, ss);
  m_out(&m, m_op(&m, qs, "attn_finish %%%d", s2), qs);
  int lse = m_op(&m, rs, "attn_lse %%%d", s2);
  m_out(&m, lse, rs);
  for (int src = 0; src < 2; src++) {
    int kk = src ? k1 : k0, vv = src ? v1 : v0;
    m_out(&m, m_op(&m, qs, "attn_bwd_q %%%d, %%%d, %%%d, %%%d, %%%d, %%%d, %%%d%s causal=%d src=%d window=%d alibi=%d %s",
                   q, kk, vv, d, lse, dr, aq, ds, c->causal, src, window, case_alibi, sc), qs);
    for (int part = 1; part <= 2; part++)
      m_out(&m, m_op(&m, ks, "attn_bwd_kv %%%d, %%%d, %%%d, %%%d, %%%d, %%%d, %%%d%s causal=%d src=%d part=%d window=%d "
                     "alibi=%d %s", q, kk, vv, d, lse, dr, ak, ds, c->causal, src, part, window, case_alibi, sc), ks);
  }
  return m_text(&m, 2, 1);
}

/* ---- running ---- */

static double at(const void *p, IrDtype t, int64_t i) {
  return t == IR_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

/* Runs block main of text on the CPU and on d as the rank at cp
 * coordinate cpc (cp = size of the module's cp axis); compares the out
 * states.  Returns the worst relative error (INFINITY when it did not run). */
static const RtFeed *case_feeds;   /* the i32 inputs of the case run next */
static double case_tol;            /* > 0: the f32 limit of the cases run next (tensor cores) */
static int case_nfeeds;

static double run_case(RtDev *d, const char *text, int cp, int cpc, const char *label) {
  char err[2048];
  IrModule *m = ir_parse_module(text, "<attn>", err, sizeof err);
  CHECK(m, "%s: the module does not parse: %s", label, err);
  if (!m) return INFINITY;
  RtRank rank = rt_rank_single();
  IrAxis ax = m->par.tp > 1 ? IR_AXIS_TP : IR_AXIS_CP;   /* the split axis: tp (vocab cases) or cp */
  if (ax == IR_AXIS_TP) rank.mesh.tp = cp;
  else rank.mesh.cp = cp;
  rank.coord[ax] = cpc;
  RtExecOpts oc = {.backend = RT_BACKEND_LLVM}, od = {.backend = RT_BACKEND_LLVM, .dev = d};
  RtProgram *cpu = rt_program_new_opts(m, &rank, &oc, err, sizeof err);
  CHECK(cpu, "%s: CPU program: %s", label, err);
  RtProgram *dev = cpu ? rt_program_new_opts(m, &rank, &od, err, sizeof err) : NULL;
  CHECK(!cpu || dev, "%s: device program: %s", label, err);
  double worst = INFINITY;
  RtRunInfo info = {1, 0, 0.01, 0};
  int bi = ir_block_find(m, "main");
  if (dev && rt_run_block(cpu, bi, case_feeds, case_nfeeds, &info, err, sizeof err) != 0) { CHECK(0, "%s: CPU run: %s", label, err); goto out; }
  if (dev && rt_run_block(dev, bi, case_feeds, case_nfeeds, &info, err, sizeof err) != 0) { CHECK(0, "%s: device run: %s", label, err); goto out; }
  if (dev && rt_program_sync_states(dev, err, sizeof err) != 0) { CHECK(0, "%s: sync: %s", label, err); goto out; }
  if (!dev) goto out;
  worst = 0;
  char where[256] = "";
  int nout = 0;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (strncmp(st->name, "out", 3) != 0) continue;
    nout++;
    const void *a = rt_state_data(dev, s), *b = rt_state_data(cpu, s);
    /* f64: relative to each element (1e-3 at least); f32: to the tensor's
     * largest element, since the CPU computes f32 attention in f32
     * (sgemm, expf) and the emulated device in f64, so an f32 gradient's
     * small entries, sums that cancel, differ by f32 roundings of the
     * large ones */
    double floor = 1e-3;
    for (int64_t i = 0; st->type.dtype == IR_F32 && i < ir_type_numel(&st->type); i++)
      floor = fmax(floor, fabs(at(b, st->type.dtype, i)));
    for (int64_t i = 0; i < ir_type_numel(&st->type); i++) {
      double x = at(a, st->type.dtype, i), y = at(b, st->type.dtype, i);
      double e = isnan(x) || isnan(y) ? INFINITY : fabs(x - y) / fmax(fabs(y), floor);
      if (!(e <= worst)) {
        worst = e;
        snprintf(where, sizeof where, "@%s[%lld]: device %.12g, cpu %.12g", st->name, (long long)i, x, y);
      }
    }
  }
  double tol = case_tol > 0 ? case_tol : m->train.precision == IR_F64 ? 1e-10 : 1e-5;
  printf("%-44s %2d results  max rel err %.2e  (limit %.0e)%s%s\n", label, nout, worst, tol, worst > 0 ? "  at " : "",
         worst > 0 ? where : "");
  CHECK(nout > 0, "%s: no results", label);
  CHECK(worst <= tol, "%s: error %.3g over %.0e at %s", label, worst, tol, where);
out:
  rt_program_free(dev);
  rt_program_free(cpu);
  ir_module_free(m);
  return worst;
}

static const char *const dts[] = {"f32", "f64"};

static void test_fused(RtDev *d, int docs) {
  /* with documents, a sliding window too (a third of the sequence, so it
   * cuts inside documents and across tiles): the variants' masks together */
  for (size_t i = 0; i < sizeof fused_cases / sizeof fused_cases[0]; i++)
    for (int t = 0; t < 2; t++) {
      const Case *c = &fused_cases[i];
      char label[128];
      int w = docs ? c->T / 3 + 1 : 0;
      snprintf(label, sizeof label, "fused B%d Hq%d Hkv%d T%d D%d %s %s%s", c->B, c->Hq, c->Hkv, c->T, c->D,
               c->causal ? "causal" : "full", dts[t], docs ? " docs window" : "");
      char *text = fused_text(c, dts[t], docs, w);
      run_case(d, text, 1, 0, label);
      free(text);
    }
}

/* The backward's parts of one attention as one launch group: every fused
 * case (and head_dim 6, the double path for f32 operands) in f32 and f64,
 * without and with documents and a window, all three
 * parts and (cases 1 and 2) two of them, against the CPU; f64 within
 * 1e-12.  Launches: the group's kernels (attention_grads_*) are 3 with dq
 * (statistics, dq, dk + dv) and 2 without, and no attention_bwd_* kernel
 * runs; the same parts with an accum between them (fused_text: not a
 * group) launch 6 attention_bwd_* kernels, a statistics pass and its own
 * pass per part.  Every one of these kernels computes the scores once. */
static void test_grads(RtDev *d) {
  enum { MAXB = 2, MAXT = 70 };
  static int32_t ids[MAXB * MAXT];
  RtFeed f = {"document_ids", ids};
  for (int b = 0; b < MAXB; b++)
    for (int p = 0; p < MAXT; p++) ids[b * MAXT + p] = b % 2 ? p % 3 : p < 5 ? 0 : p < 9 ? 1 : 2;
  long long grouped = 0, separate = 0;
  /* and head_dim 6: f32 operands on the double path (not a multiple of 4) */
  static const Case odd = {1, 4, 2, 13, 6, 1, 0};
  size_t nf = sizeof fused_cases / sizeof fused_cases[0];
  for (size_t i = 0; i <= nf; i++)
    for (int t = 0; t < 2; t++)
      for (int docs = 0; docs < 2; docs++) {
        const Case *c = i < nf ? &fused_cases[i] : &odd;
        int parts_list[2] = {7, i == 1 ? 6 : i == 2 ? 5 : 0};
        for (int pi = 0; pi < 2 && parts_list[pi]; pi++) {
          int parts = parts_list[pi], w = docs ? c->T / 3 + 1 : 0;
          char label[128];
          snprintf(label, sizeof label, "grads B%d Hq%d Hkv%d T%d D%d %s %s parts %s%s", c->B, c->Hq, c->Hkv, c->T,
                   c->D, c->causal ? "causal" : "full", dts[t], parts == 7 ? "012" : parts == 6 ? "12" : "02",
                   docs ? " docs window" : "");
          case_feeds = docs ? &f : NULL;
          case_nfeeds = docs;
          char *text = grads_text(c, dts[t], docs, w, parts);
          ts_emu_dev_launches_reset(d);
          double worst = run_case(d, text, 1, 0, label);
          long long n = ts_emu_dev_launches_of(d, "attention_grads_"), want = parts & 1 ? 3 : 2;
          long long apart = ts_emu_dev_launches_of(d, "attention_bwd_");
          CHECK(n == want && apart == 0, "%s: %lld launches of the group's kernels (want %lld), %lld attention_bwd", label,
                n, want, apart);
          if (t == 1) CHECK(worst <= 1e-12, "%s: f64 error %.3g over 1e-12", label, worst);
          if (parts == 7) grouped = n;
          free(text);
          if (parts != 7 || i > 1) continue;
          text = fused_text(c, dts[t], docs, w);   /* the parts apart (an accum between them) */
          ts_emu_dev_launches_reset(d);
          run_case(d, text, 1, 0, label);
          separate = ts_emu_dev_launches_of(d, "attention_bwd_");
          CHECK(separate == 6, "%s: %lld attention_bwd launches for the three parts apart, want 6", label, separate);
          free(text);
        }
      }
  case_feeds = NULL;
  case_nfeeds = 0;
  printf("one attention's backward: %lld launches (score passes) grouped, %lld apart\n", grouped, separate);
}

static const Case ring_cases[] = {{1, 4, 2, 12, 8, 1, 0}, {2, 2, 2, 8, 16, 1, 0}, {1, 4, 1, 10, 8, 0, 0}};

static void test_ring(RtDev *d, int docs) {
  for (size_t i = 0; i < sizeof ring_cases / sizeof ring_cases[0]; i++)
    for (int t = 0; t < 2; t++)
      for (int cpc = 0; cpc < 2; cpc++) {
        const Case *c = &ring_cases[i];
        char label[128];
        snprintf(label, sizeof label, "ring cp %d/2 B%d Hq%d Hkv%d T%d D%d %s %s%s", cpc, c->B, c->Hq, c->Hkv, c->T,
                 c->D, c->causal ? "causal" : "full", dts[t], docs ? " docs window" : "");
        char *text = ring_text(c, dts[t], docs, docs ? (2 * c->T) / 3 + 1 : 0);
        run_case(d, text, 2, cpc, label);
        free(text);
      }
}

/* Document ids for every case (the largest B x T): even batch rows three
 * contiguous documents of uneven lengths, odd rows interleaved ones
 * (position p in document p mod 3), then the fused and ring cases. */
static void test_docs(RtDev *d) {
  enum { MAXB = 2, MAXT = 2 * 70 };
  static int32_t ids[MAXB * MAXT];
  RtFeed f = {"document_ids", ids};
  for (int b = 0; b < MAXB; b++)
    for (int p = 0; p < MAXT; p++) ids[b * MAXT + p] = b % 2 ? p % 3 : p < 5 ? 0 : p < 9 ? 1 : 2;
  case_feeds = &f;
  case_nfeeds = 1;
  /* each case reads the first B x T of the array as its [B, T]: the rows
   * are then cut at other places, which only changes which positions are
   * in which document */
  test_fused(d, 1);
  test_ring(d, 1);
  case_feeds = NULL;
  case_nfeeds = 0;
}

/* Cross-attention: keys of another length than the queries (fewer, more,
 * across tiles), not causal, f32 (the register-tiled kernels) and f64; the
 * forward with the parts apart, and the three parts as one launch group. */
static void test_cross(RtDev *d) {
  static const Case cross[] = {{1, 4, 2, 20, 16, 0, 33}, {2, 2, 2, 37, 8, 0, 9}, {1, 2, 1, 70, 64, 0, 130}};
  for (size_t i = 0; i < sizeof cross / sizeof cross[0]; i++)
    for (int t = 0; t < 2; t++) {
      const Case *c = &cross[i];
      char label[128];
      snprintf(label, sizeof label, "cross B%d Hq%d Hkv%d Tq%d Tk%d D%d %s", c->B, c->Hq, c->Hkv, c->T, c->Tk, c->D,
               dts[t]);
      char *text = fused_text(c, dts[t], 0, 0);
      double worst = run_case(d, text, 1, 0, label);
      if (t == 1) CHECK(worst <= 1e-12, "%s: f64 error %.3g over 1e-12", label, worst);
      free(text);
      text = grads_text(c, dts[t], 0, 0, 7);
      worst = run_case(d, text, 1, 0, label);
      if (t == 1) CHECK(worst <= 1e-12, "%s (grouped): f64 error %.3g over 1e-12", label, worst);
      free(text);
    }
}

/* ALiBi: the fused, grouped-backward and ring cases with slopes, alone and
 * with documents and a window (every mask and the bias together): the
 * device's kernels (f64: the double path; f32: the register-tiled ones,
 * the ring steps on the double path) against the CPU's. */
static void test_alibi(RtDev *d, int grads) {
  case_alibi = 1;
  if (grads) {   /* the backward's parts as one launch group (long: its own test, labelled slow) */
    test_grads(d);
  } else {
    test_fused(d, 0);
    test_ring(d, 0);
    test_docs(d);
  }
  case_alibi = 0;
}

/* take, onehot, pad_fill with the vocab dim (8 local of 16) split over tp:
 * ids 0 .. 15 cover both blocks, -1 is ignored */
static char *vocab_text(const char *dt) {
  Mod m = {.dt = dt, .sh = " {1:tp}"};
  int x = m_state(&m, "x", "[6, 8]", "normal(0.0, 1.0)");
  sb_printf(&m.body, "  %%%d = input \"ids\" : i32[6]\n", m.n);
  int ids = m.n++;
  m.sh = "";
  m_out(&m, m_op(&m, "[6]", "take %%%d, %%%d ignore=-1", x, ids), "[6]");
  m.sh = " {1:tp}";
  m_out(&m, m_op(&m, "[6, 8]", "onehot %%%d ignore=-1", ids), "[6, 8]");
  m_out(&m, m_op(&m, "[6, 8]", "pad_fill %%%d dim=1 limit=13 fill=-7.5", x), "[6, 8]");
  m_out(&m, m_op(&m, "[6, 8]", "pad_fill %%%d dim=0 limit=4 fill=0.0", x), "[6, 8]");
  return m_text(&m, 1, 2);
}

static void test_vocab(RtDev *d) {
  static int32_t ids[6] = {3, 12, -1, 8, 15, 0};
  RtFeed f = {"ids", ids};
  case_feeds = &f;
  case_nfeeds = 1;
  for (int t = 0; t < 2; t++)
    for (int c = 0; c < 2; c++) {
      char label[64], *text = vocab_text(dts[t]);
      snprintf(label, sizeof label, "vocab tp %d/2 take onehot pad_fill %s", c, dts[t]);
      run_case(d, text, 2, c, label);
      free(text);
    }
  case_feeds = NULL;
  case_nfeeds = 0;
}

/* The generation ops (pass decode; codegen/cuda_decode.c) at a position
 * read from the i32 input "pos": Tq new rows written into caches of Tk
 * positions (kv_write: the caches are out states, so the rows around them
 * are compared too), rope_at, slice_at of the cache, and attn_cached over
 * keys 0 .. pos + i (rows before pos still zero), grouped-query (Hq 4,
 * Hkv 2), with and without a window, with and without ALiBi's slopes. */
static char *decode_text(const char *dt, int Tq, int Tk, int window, int alibi) {
  Mod m = {.dt = dt, .sh = ""};
  char qs[64], ks[64], xs[64];
  shp(qs, sizeof qs, 2, 4, Tq, 8);
  shp(ks, sizeof ks, 2, 2, Tk, 8);
  shp(xs, sizeof xs, 2, 2, Tq, 8);
  sb_printf(&m.body, "  %%%d = input \"pos\" : i32[]\n", m.n);
  int pos = m.n++;
  int q = m_state(&m, "q", qs, "normal(0.0, 1.0)"), x = m_state(&m, "x", xs, "normal(0.0, 1.0)");
  int xr = m_op(&m, xs, "rope_at %%%d, %%%d axis=2 inverse=0 base=1e+04", x, pos);
  const char *cache[2] = {"out_k", "out_v"};
  int kv[2];
  for (int c = 0; c < 2; c++) {
    sb_printf(&m.st, "state @%s : %s%s cache\n", cache[c], dt, ks);
    sb_printf(&m.body, "  kv_write %%%d, %%%d @%s axis=2\n", c ? x : xr, pos, cache[c]);
    sb_printf(&m.body, "  %%%d = state @%s : %s%s\n", m.n + 1, cache[c], dt, ks);
    m.n++;
    kv[c] = m.n++;
  }
  char sl[32] = "";
  if (alibi)   /* ALiBi: one slope per query head, a fifth operand */
    snprintf(sl, sizeof sl, ", %%%d", m_state(&m, "slopes", "[4]", "uniform(0.1, 0.9)"));
  m_out(&m, m_op(&m, qs, "attn_cached %%%d, %%%d, %%%d, %%%d%s window=%d scale=0.35355339059327373", q, kv[0], kv[1], pos,
                 sl, window),
        qs);
  m_out(&m, m_op(&m, xs, "slice_at %%%d, %%%d axis=2 size=%d", kv[1], pos, Tq), xs);
  return m_text(&m, 1, 1);
}

static void test_decode(RtDev *d) {
  static int32_t pos;
  RtFeed f = {"pos", &pos};
  case_feeds = &f;
  case_nfeeds = 1;
  /* Tq, Tk, window, pos, ALiBi */
  static const int cases[][5] = {{1, 12, 0, 0, 0}, {1, 12, 0, 11, 0}, {1, 12, 4, 7, 0}, {5, 12, 0, 3, 0},
                                 {3, 40, 6, 20, 0}, {1, 12, 0, 11, 1}, {5, 12, 0, 3, 1}, {3, 40, 6, 20, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int t = 0; t < 2; t++) {
      int Tq = cases[i][0], Tk = cases[i][1], w = cases[i][2], al = cases[i][4];
      pos = cases[i][3];
      char label[96], *text = decode_text(dts[t], Tq, Tk, w, al);
      snprintf(label, sizeof label, "decode Tq%d Tk%d pos%d window%d%s %s", Tq, Tk, (int)pos, w, al ? " alibi" : "",
               dts[t]);
      run_case(d, text, 1, 0, label);
      free(text);
    }
  case_feeds = NULL;
  case_nfeeds = 0;
}

/* moe_perm of 6 tokens all routed to 3 experts (18 pairs) into 8 rows:
 * the pairs past row 7 poison row 0, in every emulator order (the NaN
 * once came from the scatter itself, where a thread writing row 0's real
 * value after it erased it). */
static void test_moe_overflow(RtDev *d) {
  static const char *const orders[] = {"fifo", "reverse", "random:5"};
  for (int t = 0; t < 2; t++) {
    char text[1024], err[2048];
    snprintf(text, sizeof text,
             "module moe\ntrain lr=0.01 seed=99 precision=%s\nparallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n"
             "state @x : %s[6, 4] param init=normal(0.0, 1.0)\nstate @r : %s[6, 3] param init=ones\n"
             "state @out0 : %s[8, 4] param init=zeros\nblock main {\n"
             "  %%0 = state @x : %s[6, 4]\n  %%1 = state @r : %s[6, 3]\n"
             "  %%2 = moe_perm %%0, %%1, %%1 rows=8 : %s[8, 4]\n  accum %%2 @out0\n}\nend\n",
             dts[t], dts[t], dts[t], dts[t], dts[t], dts[t], dts[t]);
    IrModule *m = ir_parse_module(text, "<moe>", err, sizeof err);
    CHECK(m, "moe overflow %s: the module does not parse: %s", dts[t], err);
    if (!m) continue;
    for (int o = 0; o < 3; o++) {
      setenv("TS_EMU_ORDER", orders[o], 1);
      RtRank rank = rt_rank_single();
      RtExecOpts od = {.backend = RT_BACKEND_LLVM, .dev = d};
      RtProgram *p = rt_program_new_opts(m, &rank, &od, err, sizeof err);
      CHECK(p, "moe overflow %s: device program: %s", dts[t], err);
      if (!p) continue;
      RtRunInfo info = {1, 0, 0.01, 0};
      int ok = rt_run_block(p, ir_block_find(m, "main"), NULL, 0, &info, err, sizeof err) == 0 &&
               rt_program_sync_states(p, err, sizeof err) == 0;
      CHECK(ok, "moe overflow %s (%s): %s", dts[t], orders[o], err);
      int s = -1;
      for (int k = 0; k < m->states.n; k++)
        if (!strcmp(m->states.a[k].name, "out0")) s = k;
      const void *out = ok && s >= 0 ? rt_state_data(p, s) : NULL;
      int nan0 = 0, nan_rest = 0;
      for (int64_t i = 0; out && i < 32; i++) {
        if (i < 4) nan0 += isnan(at(out, m->states.a[s].type.dtype, i));
        else nan_rest += isnan(at(out, m->states.a[s].type.dtype, i));
      }
      printf("moe overflow %s, emulator order %-8s: row 0 %d of 4 NaN, rows 1-7 %d NaN\n", dts[t], orders[o], nan0,
             nan_rest);
      CHECK(out && nan0 == 4, "moe overflow %s (%s): row 0 has %d of 4 NaN: the overflow signal was lost", dts[t],
            orders[o], nan0);
      CHECK(out && nan_rest == 0, "moe overflow %s (%s): %d NaN in rows 1-7", dts[t], orders[o], nan_rest);
      rt_program_free(p);
    }
    unsetenv("TS_EMU_ORDER");
    ir_module_free(m);
  }
}

/* ---- tensor cores: attention of bf16 values (q, k, v rounded to bf16 and
 * widened, as pass precision gives them) ----
 * The forward on WMMA (codegen/cuda_attn.c, print_fwd_tc) against the CPU's
 * f32 attention of the same bf16 values: P is rounded to bf16 before P V
 * (relative error 2^-9 per weight), so the limit is 1e-2 of the output's
 * largest element.  Head dims 64 and 128, lengths not a multiple of the
 * tiles (BQ 64; BK 64 at head dim 64, 32 at 128), causal and not, grouped
 * queries, ALiBi.  The same for f16 values (tests *_f16: the kernels'
 * __half form, P rounded to f16, 2^-11 per weight). */
static const char *tc_h = "bf16";   /* the 16-bit dtype of the tc cases */
static char *tc_text(const Case *c, int parts) {
  Mod m = {.dt = "f32", .sh = ""};
  char qs[64], ks[64], sc[96], ds[32];
  shp(qs, sizeof qs, c->B, c->Hq, c->T, c->D);
  shp(ks, sizeof ks, c->B, c->Hkv, c->Tk ? c->Tk : c->T, c->D);
  snprintf(sc, sizeof sc, "causal=%d window=0 alibi=%d bias=0 scale=%.17g", c->causal, case_alibi,
           1.0 / sqrt((double)c->D));
  int x[4];
  const char *nm[4] = {"q", "k", "v", "do"};
  for (int i = 0; i < (parts ? 4 : 3); i++) {   /* q k v (do): bf16 values widened to f32 */
    const char *sh = i == 1 || i == 2 ? ks : qs;
    int st = m_state(&m, nm[i], sh, "normal(0.0, 1.0)");
    sb_printf(&m.body, "  %%%d = cast %%%d : %s%s\n", m.n, st, tc_h, sh);
    m.n++;
    x[i] = m_op(&m, sh, "cast %%%d", m.n - 1);
  }
  m_docs(&m, 0, c->Hq, c->B, c->T, ds, sizeof ds);
  int o = m_op(&m, qs, "attention %%%d, %%%d, %%%d%s %s", x[0], x[1], x[2], ds, sc);
  m_out(&m, o, qs);
  int g[3];
  for (int part = 0; part < 3; part++)
    if (parts & (1 << part))
      g[part] = m_op(&m, part ? ks : qs, "attention_bwd %%%d, %%%d, %%%d, %%%d, %%%d%s causal=%d part=%d window=0 "
                     "alibi=%d bias=0 scale=%.17g", x[0], x[1], x[2], o, x[3], ds, c->causal, part, case_alibi,
                     1.0 / sqrt((double)c->D));
  for (int part = 0; part < 3; part++)
    if (parts & (1 << part)) m_out(&m, g[part], part ? ks : qs);
  return m_text(&m, 1, 1);
}

static const Case tc_cases[] = {
  {1, 2, 2, 70, 64, 1, 0}, {1, 4, 2, 37, 128, 0, 0}, {2, 2, 1, 100, 64, 0, 0}, {1, 2, 2, 20, 128, 1, 0},
  {1, 2, 2, 33, 64, 0, 90},
};

/* Whether text's device module runs attention on tensor cores: the
 * forward, and the dq and dk / dv kernels of the parts (bit p: part p). */
static int tc_used(const char *text, int parts) {
  char err[2048];
  IrModule *m = ir_parse_module(text, "<attn>", err, sizeof err);
  if (!m) return 0;
  RtCudaModule cm;
  int built = rt_cuda_module_build(m, &cm, err, sizeof err) == 0;
  char rnd[64];
  snprintf(rnd, sizeof rnd, "prow[c].x = ts_f32_%s(", tc_h);
  int used = built && strstr(cm.src.p, rnd) != NULL;
  if (built && (parts & 1)) used &= strstr(cm.src.p, "ts_wmma::load_matrix_sync(df[d]") != NULL;
  if (built && (parts & 2)) used &= strstr(cm.src.p, "float> gk[") != NULL;
  if (built && (parts & 4)) used &= strstr(cm.src.p, "float> gv[") != NULL;
  if (built) rt_cuda_module_free(&cm);
  ir_module_free(m);
  return used;
}

static int tc_parts;   /* the backward's parts of the tc cases (bit p: part p; 0: the forward alone) */

static void test_tc(RtDev *d) {
  case_tol = 1e-2;
  for (size_t i = 0; i < sizeof tc_cases / sizeof tc_cases[0] + 1; i++) {
    case_alibi = i == sizeof tc_cases / sizeof tc_cases[0];   /* the last: case 0 with ALiBi */
    const Case *c = &tc_cases[case_alibi ? 0 : i];
    char label[128];
    snprintf(label, sizeof label, "tc %s B%d Hq%d Hkv%d T%d Tk%d D%d %s%s parts %d", tc_h, c->B, c->Hq, c->Hkv, c->T,
             c->Tk ? c->Tk : c->T, c->D, c->causal ? "causal" : "full", case_alibi ? " alibi" : "", tc_parts);
    char *text = tc_text(c, tc_parts);
    CHECK(tc_used(text, tc_parts), "%s: the device module has no tensor-core attention", label);
    double e = run_case(d, text, 1, 0, label);
    CHECK(e > 1e-6, "%s: error %.2e: equal to f32 attention, P was not rounded to %s?", label, e, tc_h);
    free(text);
  }
  case_alibi = 0;
  case_tol = 0;
}

/* Every attention kernel of text through NVRTC for sm_80 and sm_90,
 * ptxas' report checked. */

/* ---- fp8 (test "fp8") ---- */

enum { F8N = 96 };

/* f32 inputs that decide fp8 roundings: NaN (both signs), infinities,
 * E4M3's saturation at 448 (449, the tie 464, 480 and far above), E5M2's at
 * 57344, ties to even in both formats (1.0625 and 1.1875 in E4M3, 1.125
 * and 1.375 in E5M2, negative too), subnormals of both (2^-9 .. 2^-10
 * ties, 2^-16 .. 2^-17 ties), f32 subnormals and zeros; the rest random
 * over many binades. */
static void fp8_inputs(float *x, uint16_t *xb) {
  static const float special[] = {
    NAN, -NAN, INFINITY, -INFINITY, 448.0f, -448.0f, 449.0f, 464.0f, 470.0f, 480.0f, 1e9f, -1e9f,
    57344.0f, 57345.0f, 61440.0f, -61441.0f, 1e30f, 1.0625f, 1.1875f, -1.0625f, -1.1875f, 3.125f, 1.125f, 1.375f,
    -1.375f, 0.001953125f /* 2^-9 */, 0.0009765625f /* 2^-10, tie -> 0 */, 0.0029296875f /* 1.5 * 2^-9 */,
    0.0048828125f /* 2.5 * 2^-9 */, 0.015625f /* 2^-6 */, 0.0146484375f /* 7.5 * 2^-9: tie into the normals */,
    1.52587890625e-05f /* 2^-16 */, 7.62939453125e-06f /* 2^-17 */, 2.288818359375e-05f /* 1.5 * 2^-16 */,
    6.103515625e-05f /* 2^-14 */, 1e-40f, -1e-40f, 0.0f, -0.0f, 1e-30f, 240.0f, 232.0f, 0.3f, -0.7f};
  int ns = (int)(sizeof special / sizeof special[0]);
  uint64_t r = 0x8f8f8f8full;
  for (int i = 0; i < F8N; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(r >> 11) / 9007199254740992.0;
    x[i] = i < ns ? special[i] : (float)((u - 0.5) * ldexp(1.0, (int)(r % 40) - 20));
    xb[i] = ts_f32_to_bf16(x[i]);
  }
}

static char *fp8_text(void) {
  StrBuf st = {0}, b = {0};
  int n = 0, nout = 0;
  sb_printf(&b, "  %%%d = input \"x\" : f32[%d]\n  %%%d = input \"xb\" : bf16[%d]\n", n, F8N, n + 1, F8N);
  n += 2;
  sb_printf(&st, "state @s0 : f32[] fp8 start=1.0\nstate @s1 : f32[] param init=uniform(2.5, 3.5)\n");
  sb_printf(&b, "  %%%d = state @s0 : f32[]\n  %%%d = state @s1 : f32[]\n", n, n + 1);
  int sc[2] = {n, n + 1};
  n += 2;
  static const char *const f8[] = {"f8e4m3", "f8e5m2"};
  for (int xi = 0; xi < 2; xi++)
    for (int s = 0; s < 2; s++)
      for (int f = 0; f < 2; f++) {
        sb_printf(&b, "  %%%d = quant8 %%%d, %%%d : %s[%d]\n", n, xi, sc[s], f8[f], F8N);
        sb_printf(&b, "  %%%d = cast %%%d : %s[%d]\n", n + 1, n, xi ? "bf16" : "f32", F8N);
        sb_printf(&st, "state @out%d : %s[%d] param init=zeros\n", nout, xi ? "bf16" : "f32", F8N);
        sb_printf(&b, "  assign %%%d @out%d\n", n + 1, nout++);
        n += 3;   /* the assign is numbered too */
      }
  /* the f32 -> fp8 cast (no scale) */
  sb_printf(&b, "  %%%d = cast %%0 : f8e4m3[%d]\n  %%%d = cast %%%d : f32[%d]\n", n, F8N, n + 1, n, F8N);
  sb_printf(&st, "state @out%d : f32[%d] param init=zeros\n", nout, F8N);
  sb_printf(&b, "  assign %%%d @out%d\n", n + 1, nout++);
  n += 3;
  /* amax: of x (a NaN: kept), of x's finite part (the slice after the
   * NaNs), of bf16; then the scale updates, one per algo, and a NaN amax */
  sb_printf(&b, "  %%%d = slice %%0 axis=0 start=4 end=%d : f32[%d]\n", n, F8N, F8N - 4);
  int fin = n++;
  const int amx[3] = {0, fin, 1};
  for (int k = 0; k < 3; k++) {
    sb_printf(&st, "state @amax%d : f32[] fp8 start=%s\n", k, k == 1 ? "0.5" : "0.0");
    sb_printf(&b, "  amax_acc %%%d @amax%d\n", amx[k], k);
    n++;
  }
  for (int k = 0; k < 3; k++) {
    int len = k == 0 ? 16 : k == 1 ? 1024 : 300;
    sb_printf(&st, "state @hist%d : f32[%d] fp8 start=%s\nstate @scale%d : f32[] fp8 start=1.0\n"
                   "state @sinv%d : f32[] fp8 start=1.0\n", k, len, k == 0 ? "0.0" : k == 1 ? "2.5" : "0.25", k, k);
    sb_printf(&b, "  %%%d = state @amax%d : f32[]\n", n, k == 0 ? 1 : k == 1 ? 2 : 0);
    sb_printf(&b, "  fp8_scale %%%d @hist%d @scale%d @sinv%d algo=%d margin=%s fmax=%s\n", n, k, k, k, k == 1,
              k == 0 ? "1.0" : "0.0", k == 1 ? "57344.0" : "448.0");
    n += 2;
  }
  StrBuf t = {0};
  sb_printf(&t, "module fp8\ntrain lr=0.01 seed=99 precision=f32\nparallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n%s"
                "block main {\n%s}\nend\n", st.p, b.p);
  sb_free(&st);
  sb_free(&b);
  return t.p;
}

/* Every state of the fp8 module, bit for bit, the device against the CPU. */
static void test_fp8(RtDev *d) {
  static float x[F8N];
  static uint16_t xb[F8N];
  fp8_inputs(x, xb);
  RtFeed f[2] = {{"x", x}, {"xb", xb}};
  char *text = fp8_text(), err[2048];
  IrModule *m = ir_parse_module(text, "<fp8>", err, sizeof err);
  CHECK(m, "the fp8 module does not parse: %s\n%s", err, text);
  free(text);
  if (!m) return;
  RtRank rank = rt_rank_single();
  RtExecOpts oc = {.backend = RT_BACKEND_LLVM}, od = {.backend = RT_BACKEND_LLVM, .dev = d};
  RtProgram *cpu = rt_program_new_opts(m, &rank, &oc, err, sizeof err);
  CHECK(cpu, "CPU program: %s", err);
  RtProgram *dev = cpu ? rt_program_new_opts(m, &rank, &od, err, sizeof err) : NULL;
  CHECK(!cpu || dev, "device program: %s", err);
  RtRunInfo info = {1, 0, 0.01, 0};
  int bi = ir_block_find(m, "main");
  /* twice: the histories hold two amaxes, the second max over both */
  int ok = dev != NULL;
  for (int r = 0; r < 2 && ok; r++) {
    ok = rt_run_block(cpu, bi, f, 2, &info, err, sizeof err) == 0;
    CHECK(ok, "CPU run: %s", err);
    ok = ok && rt_run_block(dev, bi, f, 2, &info, err, sizeof err) == 0;
    CHECK(!dev || ok, "device run: %s", err);
  }
  ok = ok && rt_program_sync_states(dev, err, sizeof err) == 0;
  int nbits = 0, nnan = 0, nsat = 0, nsub = 0;
  for (int s = 0; ok && s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    size_t bytes = (size_t)ir_type_numel(&st->type) * ir_dtype_size(st->type.dtype);
    const unsigned char *a = rt_state_data(dev, s), *c = rt_state_data(cpu, s);
    size_t at = 0;
    while (at < bytes && a[at] == c[at]) at++;
    CHECK(at == bytes, "@%s differs at byte %zu: device 0x%02x, cpu 0x%02x", st->name, at, at < bytes ? a[at] : 0,
          at < bytes ? c[at] : 0);
    nbits += (int)bytes;
    if (strncmp(st->name, "out", 3) || st->type.dtype != IR_F32) continue;
    for (int i = 0; i < F8N; i++) {
      float v = ((const float *)c)[i];
      nnan += isnan(v);
      nsat += fabsf(v) == 448.0f || fabsf(v) == 57344.0f;
      nsub += v != 0 && fabsf(v) < 0.015625f;
    }
  }
  /* the cases above must have happened (a quant8 that never saturates or
   * never meets a NaN would pass vacuously) */
  const float *s0 = ok ? rt_state_data(cpu, ir_state_find(m, "scale0")) : NULL;
  printf("fp8: %d state bytes equal, %d NaN, %d saturated, %d subnormal-range results; scale0 %.9g\n", nbits, nnan, nsat,
         nsub, s0 ? *s0 : 0.0);
  CHECK(!ok || (nnan >= 4 && nsat >= 8 && nsub >= 8), "the special cases did not occur");
  /* the same module through NVRTC for the fp8 archs: every kernel within
   * ptxas' limits, with no spill and no stack frame */
  char why[256] = "";
  RtCudaModule cm;
  if (!cg_nvrtc_available(why, sizeof why)) {
    printf("fp8: NVRTC: SKIPPED (%s)\n", why);
  } else if (rt_cuda_module_build(m, &cm, err, sizeof err) != 0) {
    CHECK(0, "fp8 module: %s", err);
  } else {
    static const char *const archs[] = {"sm_89", "sm_90"};
    for (int a = 0; a < 2; a++) {
      CgNvrtcOut o;
      if (cg_nvrtc_compile(cm.src.p, archs[a], &o, err, sizeof err) != 0) {
        CHECK(0, "fp8 %s: NVRTC: %s", archs[a], err);
        continue;
      }
      int n8 = 0;
      for (int k = 0; k < o.nkern; k++) {
        const CgPtxasInfo *pi = &o.kern[k];
        CHECK(cg_ptxas_check(pi, archs[a], err, sizeof err) == 0, "fp8 %s: %s", archs[a], err);
        CHECK(pi->spill_stores == 0 && pi->spill_loads == 0 && pi->stack == 0, "fp8 %s: %s spills %lld/%lld, stack %lld",
              archs[a], pi->name, (long long)pi->spill_stores, (long long)pi->spill_loads, (long long)pi->stack);
        n8 += strstr(pi->name, "quant8") || strstr(pi->name, "amax_acc") || strstr(pi->name, "fp8_scale") ||
              strstr(pi->name, "cast");
      }
      printf("fp8: NVRTC %s: %d kernels, %d of them fp8, no spills\n", archs[a], o.nkern, n8);
      CHECK(n8 >= 4, "fp8 %s: %d fp8 kernels in ptxas' report", archs[a], n8);
      cg_nvrtc_out_free(&o);
    }
    rt_cuda_module_free(&cm);
  }
  rt_program_free(dev);
  rt_program_free(cpu);
  ir_module_free(m);
}

static void nvrtc_module(const char *text, const char *label) {
  char err[2048];
  IrModule *m = ir_parse_module(text, "<attn>", err, sizeof err);
  CHECK(m, "%s: %s", label, err);
  if (!m) return;
  RtCudaModule cm;
  if (rt_cuda_module_build(m, &cm, err, sizeof err) != 0) {
    CHECK(0, "%s: module: %s", label, err);
    ir_module_free(m);
    return;
  }
  static const char *const archs[] = {"sm_80", "sm_90"};
  for (int a = 0; a < 2; a++) {
    CgNvrtcOut o;
    if (cg_nvrtc_compile(cm.src.p, archs[a], &o, err, sizeof err) != 0) {
      CHECK(0, "%s %s: NVRTC: %s", label, archs[a], err);
      continue;
    }
    int nattn = 0;
    for (int k = 0; k < o.nkern; k++) {
      const CgPtxasInfo *pi = &o.kern[k];
      CHECK(cg_ptxas_check(pi, archs[a], err, sizeof err) == 0, "%s %s: %s", label, archs[a], err);
      if (pi->smem > 1024) {   /* the tiled kernels (the others use 256 bytes at most) */
        nattn++;
        printf("  %s %-28s regs %3d smem %6lld spills %lld/%lld\n", archs[a], pi->name, pi->registers,
               (long long)pi->smem, (long long)pi->spill_stores, (long long)pi->spill_loads);
      }
    }
    CHECK(nattn > 0, "%s %s: no tiled attention kernel in the report", label, archs[a]);
    cg_nvrtc_out_free(&o);
  }
  rt_cuda_module_free(&cm);
  ir_module_free(m);
}

/* The tensor-core attention through NVRTC (test "tc_nvrtc", and in
 * "nvrtc"): GPT-2's shapes, head dims 64 and 128, causal, and with ALiBi. */
static void test_nvrtc_tc(void) {
  static const Case gpt2[] = {{8, 12, 12, 1024, 64, 1, 0}, {8, 6, 6, 1024, 128, 1, 0}};
  for (int g = 0; g < 3; g++) {
    case_alibi = g == 2;
    char *text = tc_text(&gpt2[g % 2], 7), label[128];
    snprintf(label, sizeof label, "tensor cores %s seq 1024 head_dim %d causal%s", tc_h, gpt2[g % 2].D,
             case_alibi ? " alibi" : "");
    printf("%s\n", label);
    CHECK(tc_used(text, 7), "%s: the device module has no tensor-core attention", label);
    nvrtc_module(text, label);
    free(text);
  }
  case_alibi = 0;
}

static void test_nvrtc(void) {
  char why[256] = "";
  int have = cg_nvrtc_available(why, sizeof why);
  CHECK(have, "NVRTC is not available here: %s", why);
  if (!have) return;
  for (size_t i = 0; i < sizeof fused_cases / sizeof fused_cases[0]; i++)
    for (int t = 0; t < 2; t++) {
      char *text = fused_text(&fused_cases[i], dts[t], i % 2, i % 2 ? 5 : 0), label[64];
      snprintf(label, sizeof label, "fused case %zu %s", i, dts[t]);
      printf("%s\n", label);
      nvrtc_module(text, label);
      free(text);
    }
  /* the backward's launch group (statistics, dq, dk + dv): the fused
   * cases, then GPT-2's shapes (seq 1024, head_dim 64 and 128; the docs'
   * ptxas table) */
  for (size_t i = 0; i < sizeof fused_cases / sizeof fused_cases[0]; i++)
    for (int t = 0; t < 2; t++) {
      char *text = grads_text(&fused_cases[i], dts[t], i % 2, i % 2 ? 5 : 0, 7), label[64];
      snprintf(label, sizeof label, "grads case %zu %s", i, dts[t]);
      printf("%s\n", label);
      nvrtc_module(text, label);
      free(text);
    }
  for (int t = 0; t < 4; t++) {   /* the generation ops, a cache of GPT-2's 1024 positions (and with ALiBi) */
    char *text = decode_text(dts[t % 2], 1, 1024, 0, t / 2), label[64];
    snprintf(label, sizeof label, "decode cache 1024%s %s", t / 2 ? " alibi" : "", dts[t % 2]);
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
  }
  {   /* head_dim 6 in f32: the double path's dk + dv kernel on float operands */
    static const Case odd = {1, 4, 2, 13, 6, 1, 0};
    char *text = grads_text(&odd, "f32", 1, 5, 7);
    printf("grads head_dim 6 f32\n");
    nvrtc_module(text, "grads head_dim 6 f32");
    free(text);
  }
  static const Case gpt2[] = {{8, 12, 12, 1024, 64, 1, 0}, {8, 6, 6, 1024, 128, 1, 0}};
  for (int g = 0; g < 2; g++) {
    char *text = grads_text(&gpt2[g], "f32", 0, 0, 7), label[128];
    snprintf(label, sizeof label, "GPT-2 f32 seq 1024 head_dim %d (attention_grads_*: 0 statistics, 1 dq, 2 dk + dv)",
             gpt2[g].D);
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
    text = fused_text(&gpt2[g], "f32", 0, 0);   /* the parts apart: each its statistics and its own kernel */
    snprintf(label, sizeof label, "GPT-2 f32 seq 1024 head_dim %d, the parts apart (attention_bwd_*: 0 statistics, 1 the part)",
             gpt2[g].D);
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
  }
  for (int t = 0; t < 2; t++) {
    char *text = ring_text(&ring_cases[0], dts[t], t, t ? 7 : 0), label[64];
    snprintf(label, sizeof label, "ring %s", dts[t]);
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
  }
  test_nvrtc_tc();
  /* ALiBi: GPT-2's shapes in f32 (the register-tiled kernels) with
   * documents and a window as well, and the ring steps in f64 (the double
   * path): one module each, the compile being minutes under load */
  case_alibi = 1;
  {
    char *text = grads_text(&gpt2[0], "f32", 1, 256, 7), label[128];
    snprintf(label, sizeof label, "ALiBi f32 seq 1024 head_dim 64 docs window (attention, attention_grads_*)");
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
    text = ring_text(&ring_cases[0], "f64", 1, 7);
    snprintf(label, sizeof label, "ALiBi ring f64 docs window");
    printf("%s\n", label);
    nvrtc_module(text, label);
    free(text);
  }
  case_alibi = 0;
}

int main(int argc, char **argv) {
  char whatb[64];
  snprintf(whatb, sizeof whatb, "%s", argc > 1 ? argv[1] : "fused");
  size_t wl = strlen(whatb);
  if (wl > 4 && strncmp(whatb, "tc", 2) == 0 && strcmp(whatb + wl - 4, "_f16") == 0) {   /* tc*_f16: f16 values */
    whatb[wl - 4] = 0;
    tc_h = "f16";
  }
  const char *what = whatb;
  if (strcmp(what, "nvrtc") == 0) {
    test_nvrtc();
  } else if (strcmp(what, "tc_nvrtc") == 0) {
    char why[256] = "";
    int have = cg_nvrtc_available(why, sizeof why);
    CHECK(have, "NVRTC is not available here: %s", why);
    if (have) test_nvrtc_tc();
  } else {
    RtDev *d = ts_emu_dev_open();
    if (strcmp(what, "fused") == 0) test_fused(d, 0);
    else if (strcmp(what, "ring") == 0) test_ring(d, 0);
    else if (strcmp(what, "docs") == 0) test_docs(d);
    else if (strcmp(what, "alibi") == 0) test_alibi(d, 0);
    else if (strcmp(what, "alibi_grads") == 0) test_alibi(d, 1);
    else if (strcmp(what, "cross") == 0) test_cross(d);
    else if (strcmp(what, "grads") == 0) test_grads(d);
    else if (strcmp(what, "vocab") == 0) test_vocab(d);
    else if (strcmp(what, "decode") == 0) test_decode(d);
    else if (strcmp(what, "moe_overflow") == 0) test_moe_overflow(d);
    else if (strcmp(what, "fp8") == 0) test_fp8(d);
    else if (strcmp(what, "tc") == 0) test_tc(d);
    else if (strcmp(what, "tc_grads") == 0) {   /* all three parts (one launch group), then dk + dv, dq, dk, dv */
      static const int sets[] = {7, 6, 1, 2, 4};
      for (int i = 0; i < 5; i++) {
        tc_parts = sets[i];
        test_tc(d);
      }
    }
    else { fprintf(stderr, "usage: test_emu_lib fused|ring|docs|grads|vocab|decode|moe_overflow|fp8|tc|tc_grads|tc_nvrtc|nvrtc (tc*_f16: f16)\n"); return 2; }
    long long launches = 0;
    ts_emu_dev_counts(d, &launches, NULL, NULL);
    printf("emulated device: %lld launches\n", launches);
    CHECK(launches > 0, "the device ran nothing");
    d->ops->close(d);
  }
  return check_exit("test_emu_lib");
}
