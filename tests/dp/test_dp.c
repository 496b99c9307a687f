/* test_dp.c - the optimizer pass's update block for data parallelism
 * (passes/optimizer.c), checked structurally:
 *
 *   samples  gpt and llama at toy size through the real frontend and
 *            pipeline, for dp in {1, 2, 4} x zero in {0, 1}: which
 *            collectives over which axes and how many, ZeRO chunk sizes
 *            (ceil(numel / dp), padding only where dp does not divide),
 *            flat {flat:dp} moment states, the adamw operand being the
 *            reduced chunk {0:dp}, grad states and accumulated values
 *            marked partial:dp iff dp > 1, every assign after every adamw, the norm
 *            replicated, scalars in the module precision, ir_verify, and
 *            print -> parse -> print;
 *   respec   pass_respecialize_dp 1 -> 4 -> 2 gives the text of compiling
 *            at dp = 2 (and back to 1 the dp = 1 text); refusals (moments
 *            not last, used by micro, no update block, bad dp, optimizer
 *            error) leave the module text unchanged;
 *   tp       a hand-built module with hand-set shardings (a tp-split
 *            weight, a tp-partial gain, a replicated bias) at tp = 2:
 *            the partial grad all-reduced over tp once, the split grad's
 *            square sum partial over tp and all-reduced once in the norm,
 *            the replicated ones not; moments split like their parameter
 *            (or flat); nothing over tp at tp = 1; a flat grad refused.
 * The numbers (losses and params equal to a single rank) are checked by
 * the MPI tests of the runtime and tests/parallel. */
#include "frontend/mdl.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include <time.h>
#include "../check.h"

#define TP_BIT (1u << IR_AXIS_TP)
#define DP_BIT (1u << IR_AXIS_DP)

static char err[2048];

static void print(const IrModule *m, StrBuf *b) { b->n = 0; ir_print_module(m, b); sb_putc(b, 0); }

static int roundtrips(const IrModule *m) {
  StrBuf a = {0}, b = {0};
  print(m, &a);
  IrModule *re = ir_parse_module(a.p, "<test_dp>", err, sizeof err);
  int ok = re != NULL;
  if (re) { print(re, &b); ok = strcmp(a.p, b.p) == 0; ir_module_free(re); }
  sb_free(&a);
  sb_free(&b);
  return ok;
}

/* Follows operand 0 from value id back to the state node it derives from
 * (through collectives, reshapes, casts); its state index or -1. */
static int source_state(const IrBlock *b, int id) {
  while (id >= 0 && b->nodes[id].op != IR_OP_STATE) id = b->nodes[id].nin > 0 ? b->nodes[id].in[0] : -1;
  return id < 0 ? -1 : (int)b->nodes[id].ia[0];
}

/* Collectives of block b with op `op` over `axis`. */
static int count_coll(const IrBlock *b, IrOp op, IrAxis axis) {
  int k = 0;
  for (int i = 0; i < b->n; i++) k += b->nodes[i].op == op && b->nodes[i].ia[0] == axis;
  return k;
}
static int count_op(const IrBlock *b, IrOp op) {
  int k = 0;
  for (int i = 0; i < b->n; i++) k += b->nodes[i].op == op;
  return k;
}

/* ---- the samples ---- */
typedef struct { const char *name, *file; MdlDefine defs[10]; int ndefs; } Sample;
static const Sample samples[] = {
  /* d_model 10: gains and biases of 10 elements are padded at dp = 4 */
  {"gpt", "samples/gpt.mdl",
   {{"layers", "1"}, {"d_model", "10"}, {"heads", "2"}, {"seq_len", "8"}, {"vocab", "30"},
    {"batch", "4"}, {"micro_batch", "2"}}, 7},
  {"llama", "samples/llama.mdl",
   {{"layers", "1"}, {"d_model", "16"}, {"heads", "2"}, {"kv_heads", "1"}, {"ffn", "24"},
    {"seq_len", "8"}, {"vocab", "30"}, {"batch", "4"}, {"micro_batch", "2"}}, 9},
};

static IrModule *frontend(const Sample *s, IrDtype prec) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", TS_SOURCE_DIR, s->file);
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = s->defs;
  opt.ndefines = s->ndefs;
  opt.precision = prec;
  IrModule *m = mdl_compile_file(path, &opt);
  if (!m) TS_DIE("%s does not compile", path);
  return m;
}

/* The forward module fwd compiled for (dp, zero); NULL after a failed check. */
static IrModule *compile_at(const IrModule *fwd, int dp, int zero) {
  IrModule *m = ir_module_clone(fwd);
  m->par.dp = dp;
  m->par.zero = zero;
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.verify_roundtrip = 1;
  int rc = pass_run_pipeline(m, &cx);
  CHECK(rc == 0, "pipeline at dp=%d zero=%d: %s", dp, zero, cx.err);
  pass_ctx_free(&cx);
  if (rc != 0) { ir_module_free(m); return NULL; }
  return m;
}

/* Everything the update block of m (compiled at dp, zero) must satisfy. */
static void check_update(const IrModule *m, int dp, int zero, const char *tag) {
  int ub = ir_block_find(m, "update");
  CHECK(ub >= 0, "%s: no update block", tag);
  if (ub < 0) return;
  const IrBlock *b = &m->blocks.a[ub];
  int z = dp > 1 && zero;
  int ng = 0, npad = 0;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind == IR_STATE_GRAD) {
      ng++;
      if (ir_type_numel(&st->type) % dp) npad++;
    }
    if (st->kind != IR_STATE_ADAM_M && st->kind != IR_STATE_ADAM_V) continue;
    const IrState *p = &m->states.a[st->of];
    int64_t n = ir_type_numel(&p->type), c = (n + dp - 1) / dp;
    if (z) {
      CHECK(st->type.rank == 1 && st->type.dim[0] == c && st->sh.flat == DP_BIT && !st->sh.partial,
            "%s: @%s : rank %d [%lld] flat %u, expected [%lld] {flat:dp}", tag, st->name, st->type.rank,
            (long long)st->type.dim[0], st->sh.flat, (long long)c);
    } else {
      CHECK(ir_type_equal(&st->type, &p->type) && ir_sharding_equal(&st->sh, &p->sh),
            "%s: @%s must have the type and sharding of @%s", tag, st->name, p->name);
    }
    CHECK(st->type.dtype == p->type.dtype, "%s: @%s dtype", tag, st->name);
  }
  CHECK(ng > 5, "%s: only %d grads", tag, ng);
  /* over dp the accumulators are partial sums, marked exactly when dp > 1 */
  unsigned dpmark = dp > 1 ? DP_BIT : 0;
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_GRAD)
      CHECK((m->states.a[s].sh.partial & DP_BIT) == dpmark, "%s: @%s dp mark", tag, m->states.a[s].name);
  const IrBlock *mb = &m->blocks.a[ir_block_find(m, "micro")];
  for (int i = 0; i < mb->n; i++)
    if (mb->nodes[i].op == IR_OP_ACCUM)
      CHECK((mb->nodes[mb->nodes[i].in[0]].sh.partial & DP_BIT) == dpmark, "%s: micro accum %d operand dp mark", tag, i);

  /* collectives: over dp only (tp = 1), counted per gradient */
  int ar = count_coll(b, IR_OP_ALL_REDUCE, IR_AXIS_DP), rs = count_coll(b, IR_OP_REDUCE_SCATTER, IR_AXIS_DP);
  int ag = count_coll(b, IR_OP_ALL_GATHER, IR_AXIS_DP), sl = count_coll(b, IR_OP_SHARD_SLICE, IR_AXIS_DP);
  int want_ar = dp == 1 ? 0 : z ? 1 : ng;
  CHECK(ar == want_ar, "%s: %d all_reduce over dp, expected %d", tag, ar, want_ar);
  CHECK(rs == (z ? ng : 0) && ag == rs && sl == rs, "%s: reduce_scatter %d all_gather %d shard_slice %d, expected %d each",
        tag, rs, ag, sl, z ? ng : 0);
  int allcoll = count_op(b, IR_OP_ALL_REDUCE) + count_op(b, IR_OP_REDUCE_SCATTER) + count_op(b, IR_OP_ALL_GATHER) +
                count_op(b, IR_OP_SHARD_SLICE);
  CHECK(allcoll == ar + rs + ag + sl, "%s: a collective over another axis than dp", tag);
  CHECK(count_op(b, IR_OP_ADAMW) == ng && count_op(b, IR_OP_ZERO) == ng, "%s: adamw/zero counts", tag);
  CHECK(count_op(b, IR_OP_ASSIGN) == (z ? ng : 0), "%s: %d assigns", tag, count_op(b, IR_OP_ASSIGN));
  /* padding where dp does not divide, once for the grad and once for the param */
  CHECK(count_op(b, IR_OP_PAD) == (z ? 2 * npad : 0), "%s: %d pads, expected %d", tag, count_op(b, IR_OP_PAD), z ? 2 * npad : 0);
  CHECK(count_op(b, IR_OP_SLICE) == (z ? npad : 0), "%s: %d slices, expected %d", tag, count_op(b, IR_OP_SLICE), z ? npad : 0);

  int last_adamw = -1, first_assign = b->n, norm_out = -1;
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->type.dtype != IR_VOID && n->type.rank == 0)
      CHECK(n->type.dtype == m->train.precision, "%s: scalar %%%d = %s not in the module precision", tag, i, ir_ops[n->op].name);
    if (n->op == IR_OP_OUTPUT && n->sa == ts_intern("grad_norm")) {
      norm_out = i;
      const IrNode *v = &b->nodes[n->in[0]];
      CHECK(v->op == IR_OP_SQRT && ir_sharding_is_none(&v->sh), "%s: grad_norm is not a replicated sqrt", tag);
      const IrNode *t = &b->nodes[v->in[0]];
      CHECK(ir_sharding_is_none(&t->sh), "%s: the square sum under sqrt is not replicated", tag);
      if (z) CHECK(t->op == IR_OP_ALL_REDUCE && t->ia[0] == IR_AXIS_DP, "%s: the norm's dp all_reduce is not last", tag);
    }
    if (n->op == IR_OP_SUMSQ) {
      unsigned want = z ? DP_BIT : 0;
      CHECK(n->sh.partial == want, "%s: sumsq %%%d partial %u, expected %u", tag, i, n->sh.partial, want);
    }
    if (n->op == IR_OP_ADAMW) {
      last_adamw = i;
      const IrNode *g = &b->nodes[n->in[1]];
      const IrState *ms = &m->states.a[n->ia[1]];
      int gsrc = source_state(b, n->in[1]);
      CHECK(gsrc >= 0 && m->states.a[gsrc].kind == IR_STATE_GRAD && m->states.a[gsrc].of == n->ia[0],
            "%s: adamw %d's grad operand does not come from the param's grad", tag, i);
      CHECK(ir_type_same_shape(&g->type, &ms->type), "%s: adamw grad operand type", tag);
      if (dp == 1) CHECK(g->op == IR_OP_STATE && ir_sharding_is_none(&g->sh), "%s: dp=1 adamw grad is not the plain state", tag);
      else if (!z) CHECK(g->op == IR_OP_ALL_REDUCE && g->ia[0] == IR_AXIS_DP && !g->sh.partial, "%s: adamw grad is not all-reduced", tag);
      else CHECK(g->op == IR_OP_REDUCE_SCATTER && g->sh.split[0] == DP_BIT && !g->sh.partial && g->type.rank == 1,
                 "%s: adamw grad is not a chunk {0:dp}", tag);
    }
    if (n->op == IR_OP_ASSIGN) {
      if (i < first_assign) first_assign = i;
      const IrState *p = &m->states.a[n->ia[0]];
      const IrNode *v = &b->nodes[n->in[0]];
      CHECK(p->kind == IR_STATE_PARAM && source_state(b, n->in[0]) == n->ia[0], "%s: assign of @%s", tag, p->name);
      CHECK(ir_type_equal(&v->type, &p->type) && ir_sharding_equal(&v->sh, &p->sh), "%s: assign @%s value type/sharding", tag, p->name);
    }
    if (n->op == IR_OP_ALL_GATHER) CHECK(b->nodes[n->in[0]].op == IR_OP_SHARD_SLICE && b->nodes[n->in[0]].sh.split[0] == DP_BIT,
                                         "%s: all_gather %%%d of something else than the own chunk", tag, i);
    if (n->op == IR_OP_REDUCE_SCATTER) {
      const IrNode *in = &b->nodes[n->in[0]];
      CHECK(in->sh.partial == DP_BIT && in->type.dim[0] == (int64_t)dp * n->type.dim[0], "%s: reduce_scatter %%%d input", tag, i);
    }
  }
  CHECK(norm_out >= 0 && (last_adamw < 0 || norm_out < last_adamw), "%s: grad_norm missing or after an adamw", tag);
  CHECK(first_assign > last_adamw, "%s: an assign comes before the last adamw", tag);
  CHECK(ir_verify(m, err, sizeof err) == 0, "%s: verify: %s", tag, err);
  CHECK(roundtrips(m), "%s: print/parse/print differs", tag);
}

static double ms_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (t1.tv_sec - t0->tv_sec) * 1e3 + (t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* m respecialized to dp must print as want. */
static void check_respec(IrModule *m, int dp, const StrBuf *want, const char *tag) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = pass_respecialize_dp(m, dp, err, sizeof err);
  double ms = ms_since(&t0);
  CHECK(rc == 0, "%s: respecialize to %d: %s", tag, dp, err);
  CHECK(ms < 2000, "%s: respecialize to %d took %.1f ms", tag, dp, ms);  /* generous: ASan, a busy machine */
  StrBuf got = {0};
  print(m, &got);
  CHECK(strcmp(got.p, want->p) == 0, "%s: respecialized to dp=%d differs from compiling at dp=%d", tag, dp, dp);
  sb_free(&got);
}

/* A refused respecialization leaves the module's text as it was. */
static void check_refused(IrModule *m, int dp, const char *expect, const char *tag) {
  StrBuf a = {0}, b = {0};
  print(m, &a);
  int rc = pass_respecialize_dp(m, dp, err, sizeof err);
  CHECK(rc != 0, "%s: respecialize accepted", tag);
  CHECK(rc == 0 || strstr(err, expect), "%s: message '%s' lacks '%s'", tag, err, expect);
  print(m, &b);
  CHECK(strcmp(a.p, b.p) == 0, "%s: a refused respecialize changed the module", tag);
  sb_free(&a);
  sb_free(&b);
}

static void test_sample(const Sample *s, IrDtype prec) {
  IrModule *fwd = frontend(s, prec);
  CHECK(fwd->par.zero == 1, "%s: zero is not on by default", s->name);
  static const int dps[3] = {1, 2, 4};
  StrBuf text[2][3] = {{{0}}};
  for (int zero = 0; zero <= 1; zero++)
    for (int k = 0; k < 3; k++) {
      char tag[128];
      snprintf(tag, sizeof tag, "%s %s dp=%d zero=%d", s->name, ir_dtype_name(prec), dps[k], zero);
      IrModule *m = compile_at(fwd, dps[k], zero);
      if (!m) continue;
      check_update(m, dps[k], zero, tag);
      print(m, &text[zero][k]);
      ir_module_free(m);
    }
  /* zero means nothing at dp = 1 */
  CHECK(text[0][0].p && text[1][0].p && strcmp(strstr(text[0][0].p, "\nblock"), strstr(text[1][0].p, "\nblock")) == 0,
        "%s: dp=1 blocks differ between zero=0 and zero=1", s->name);

  /* respecialize: 1 -> 4 -> 2 -> 1, for both zero settings */
  for (int zero = 0; zero <= 1; zero++) {
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s respecialize zero=%d", s->name, ir_dtype_name(prec), zero);
    IrModule *m = compile_at(fwd, 1, zero);
    if (!m) continue;
    check_respec(m, 4, &text[zero][2], tag);
    check_respec(m, 2, &text[zero][1], tag);
    check_respec(m, 1, &text[zero][0], tag);
    check_respec(m, 2, &text[zero][1], tag);
    check_update(m, 2, zero, tag);
    ir_module_free(m);
  }

  /* refusals leave the module alone */
  IrModule *m = compile_at(fwd, 2, 1);
  if (m) {
    check_refused(m, 0, "out of range", "dp=0");
    check_refused(m, -3, "out of range", "dp=-3");
    IrDtype p0 = m->train.precision;
    m->train.precision = IR_I32;             /* the optimizer refuses it */
    check_refused(m, 4, "precision", "optimizer refuses");
    m->train.precision = p0;
    /* micro uses a moment: emitted into micro (dead, but referenced) */
    int mb = ir_block_find(m, "micro"), am = -1;
    for (int st = 0; st < m->states.n && am < 0; st++)
      if (m->states.a[st].kind == IR_STATE_ADAM_M) am = st;
    int n0 = m->blocks.a[mb].n;
    int64_t ia[1] = {am};
    IrType t = m->states.a[am].type;
    CHECK(ir_emit(m, mb, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &t, err, sizeof err) >= 0, "emit: %s", err);
    check_refused(m, 4, "uses optimizer state", "micro uses adam_m");
    m->blocks.a[mb].n = n0;
    /* a parameter after the moments */
    IrState extra = m->states.a[0];
    extra.name = "late_param";
    int ns0 = m->states.n;
    ir_state_add(m, &extra);
    check_refused(m, 4, "comes after the optimizer moments", "param after moments");
    m->states.n = ns0;
    /* still fine after all that */
    CHECK(pass_respecialize_dp(m, 2, err, sizeof err) == 0, "respecialize after refusals: %s", err);
    StrBuf b = {0};
    print(m, &b);
    CHECK(strcmp(b.p, text[1][1].p) == 0, "%s: module differs after refusals", s->name);
    sb_free(&b);
    ir_module_free(m);
  }
  /* no update block yet */
  IrModule *f2 = ir_module_clone(fwd);
  check_refused(f2, 2, "no block \"update\"", "not compiled");
  ir_module_free(f2);

  for (int z = 0; z < 2; z++)
    for (int k = 0; k < 3; k++) sb_free(&text[z][k]);
  ir_module_free(fwd);
}

/* ---- hand-set tp shardings ---- */

/* loss = sumsq(tanh(x[2,4] @ w[4,6]) * gain[6]) + sumsq(b[5]), then
 * autodiff; w (and its grad) split on dim 1 over tp, grad.gain partial
 * over tp (a norm gain under sequence parallelism), b replicated. */
static IrModule *make_tp_module(int tp, int dp, int zero) {
  IrModule *m = ir_module_new("tpdp");
  m->train.precision = IR_F64;
  m->train.clip_grad = 1.0;
  IrType tw = {IR_F64, 2, {4, 6}, {NULL, NULL}}, tg = {IR_F64, 1, {6}, {NULL}}, tb = {IR_F64, 1, {5}, {NULL}};
  IrType tx = {IR_F64, 2, {2, 4}, {NULL, NULL}}, th = {IR_F64, 2, {2, 6}, {NULL, NULL}};
  IrState s = {0};
  s.kind = IR_STATE_PARAM;
  s.init = IR_INIT_NORMAL;
  s.init_b = 0.1;
  s.of = -1;
  s.name = "w"; s.type = tw; int w = ir_state_add(m, &s);
  s.name = "gain"; s.type = tg; s.flags = IR_STATE_NODECAY; int gn = ir_state_add(m, &s);
  s.name = "b"; s.type = tb; int bs = ir_state_add(m, &s);
  int b = ir_block_add(m, "forward");
#define E(...) ir_emit(m, b, __VA_ARGS__, err, sizeof err)
  int x = E(IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &tx);
  int wv = E(IR_OP_STATE, NULL, 0, (int64_t[]){w}, NULL, NULL, &tw);
  int gv = E(IR_OP_STATE, NULL, 0, (int64_t[]){gn}, NULL, NULL, &tg);
  int bv = E(IR_OP_STATE, NULL, 0, (int64_t[]){bs}, NULL, NULL, &tb);
  int h = E(IR_OP_MATMUL, (int[]){x, wv}, 2, NULL, NULL, NULL, NULL);
  int t = E(IR_OP_TANH, &h, 1, NULL, NULL, NULL, NULL);
  int gb = E(IR_OP_BROADCAST, &gv, 1, NULL, NULL, NULL, &th);
  int z = E(IR_OP_MUL, (int[]){t, gb}, 2, NULL, NULL, NULL, NULL);
  int s1 = E(IR_OP_SUMSQ, &z, 1, NULL, NULL, NULL, NULL);
  int s2 = E(IR_OP_SUMSQ, &bv, 1, NULL, NULL, NULL, NULL);
  int l = E(IR_OP_ADD, (int[]){s1, s2}, 2, NULL, NULL, NULL, NULL);
  if (E(IR_OP_OUTPUT, &l, 1, NULL, NULL, "loss", NULL) < 0) TS_DIE("building the tp module: %s", err);
#undef E
  PassCtx cx;
  pass_ctx_init(&cx);
  if (pass_autodiff(m, &cx) != 0) TS_DIE("autodiff: %s", cx.err);
  pass_ctx_free(&cx);
  /* what shard would have left (types stay global: the optimizer takes
   * them as local, which is all this test needs) */
  m->par.tp = tp;
  m->par.dp = dp;
  m->par.zero = zero;
  m->states.a[w].sh.split[1] = TP_BIT;
  int gw = ir_state_find(m, "grad.w"), gg = ir_state_find(m, "grad.gain");
  TS_ASSERT(gw >= 0 && gg >= 0);
  m->states.a[gw].sh.split[1] = TP_BIT;
  m->states.a[gg].sh.partial = TP_BIT;
  /* the micro block laid out to match: state reads and accumulated values
   * like their states (what the verifier checks) */
  IrBlock *mb = &m->blocks.a[ir_block_find(m, "micro")];
  for (int i = 0; i < mb->n; i++) {
    IrNode *n = &mb->nodes[i];
    if (n->op == IR_OP_STATE) n->sh = m->states.a[n->ia[0]].sh;
    if (n->op == IR_OP_ACCUM) mb->nodes[n->in[0]].sh = m->states.a[n->ia[0]].sh;
  }
  return m;
}

static int run_optimizer(IrModule *m) {
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_optimizer(m, &cx);
  if (rc == 0) rc = pass_dce(m, &cx);
  if (rc != 0) snprintf(err, sizeof err, "%s", cx.err);
  pass_ctx_free(&cx);
  return rc;
}

static void test_tp(int tp, int dp, int zero) {
  char tag[96];
  snprintf(tag, sizeof tag, "tp=%d dp=%d zero=%d", tp, dp, zero);
  IrModule *m = make_tp_module(tp, dp, zero);
  int rc = run_optimizer(m);
  CHECK(rc == 0, "%s: optimizer: %s", tag, err);
  if (rc != 0) { ir_module_free(m); return; }
  CHECK(ir_verify(m, err, sizeof err) == 0, "%s: verify: %s", tag, err);
  CHECK(roundtrips(m), "%s: print/parse/print differs", tag);
  const IrBlock *b = &m->blocks.a[ir_block_find(m, "update")];
  int w = ir_state_find(m, "w"), gw = ir_state_find(m, "grad.w"), gg = ir_state_find(m, "grad.gain");
  int z = dp > 1 && zero;
  unsigned zdp = z ? DP_BIT : 0;
  /* tp all-reduces: grad.gain's (partial), then one in the norm for the
   * tp-split group {grad.w}; none at all at tp = 1 */
  int artp = count_coll(b, IR_OP_ALL_REDUCE, IR_AXIS_TP);
  CHECK(artp == (tp > 1 ? 2 : 0), "%s: %d all_reduce over tp", tag, artp);
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op == IR_OP_STATE && n->ia[0] == gg && tp > 1)
      CHECK((n->sh.partial & TP_BIT) && b->n > i + 1, "%s: grad.gain read is not partial over tp", tag);
    if (n->op == IR_OP_ALL_REDUCE && n->ia[0] == IR_AXIS_TP) {
      const IrNode *in = &b->nodes[n->in[0]];
      CHECK((in->sh.partial & TP_BIT) && !(n->sh.partial & TP_BIT), "%s: all_reduce over tp %%%d of a non-partial", tag, i);
      int src = source_state(b, n->in[0]);
      if (in->op == IR_OP_STATE) CHECK(src == gg, "%s: tp all_reduce of the state @%s", tag, m->states.a[src].name);
      else CHECK(in->op == IR_OP_SUMSQ || in->op == IR_OP_ADD, "%s: tp all_reduce of %s", tag, ir_ops[in->op].name);
      if (in->op == IR_OP_SUMSQ) CHECK(src == gw, "%s: the norm's tp all_reduce sums @%s", tag, m->states.a[src].name);
    }
    if (n->op == IR_OP_SUMSQ) {
      int src = source_state(b, n->in[0]);
      unsigned want = (src == gw && tp > 1 ? TP_BIT : 0) | zdp;
      CHECK(n->sh.partial == want, "%s: sumsq of @%s partial %u, expected %u", tag, m->states.a[src].name,
            n->sh.partial, want);
    }
    if (n->op == IR_OP_ADAMW && n->ia[0] == w) {
      const IrState *ms = &m->states.a[n->ia[1]];
      if (z) CHECK(ms->sh.flat == DP_BIT && ms->type.dim[0] == (24 + dp - 1) / dp, "%s: adam_m.w not a flat chunk", tag);
      if (z) CHECK(b->nodes[n->in[1]].sh.split[0] == DP_BIT, "%s: w's chunk is not {0:dp}", tag);
      else CHECK(ir_sharding_equal(&ms->sh, &m->states.a[w].sh), "%s: adam_m.w not split like w", tag);
      const IrNode *g = &b->nodes[n->in[1]];
      if (!z) CHECK(g->sh.split[1] == TP_BIT && !g->sh.partial, "%s: w's gradient value is not {1:tp}", tag);
    }
  }
  CHECK(count_coll(b, IR_OP_ALL_REDUCE, IR_AXIS_DP) == (dp == 1 ? 0 : z ? 1 : 3), "%s: dp all_reduces", tag);
  ir_module_free(m);

  /* a flat gradient, and one split unlike its parameter, are refused with
   * the module unchanged */
  for (int bad = 0; bad < 2; bad++) {
    m = make_tp_module(tp, dp, zero);
    if (bad == 0) m->states.a[ir_state_find(m, "grad.b")].sh.flat = DP_BIT;
    else m->states.a[ir_state_find(m, "b")].sh.split[0] = TP_BIT;
    StrBuf a = {0}, a2 = {0};
    print(m, &a);
    const char *want = bad == 0 ? "never split or flat over dp" : "split like its parameter";
    CHECK(run_optimizer(m) != 0 && strstr(err, "grad.b") && strstr(err, want), "%s: bad grad %d accepted (%s)", tag, bad, err);
    print(m, &a2);
    CHECK(strcmp(a.p, a2.p) == 0, "%s: a refused optimizer changed the module", tag);
    sb_free(&a);
    sb_free(&a2);
    ir_module_free(m);
  }
}

int main(void) {
  for (size_t k = 0; k < sizeof samples / sizeof samples[0]; k++) test_sample(&samples[k], IR_F32);
  test_sample(&samples[0], IR_F64);
  static const int tps[2] = {1, 2}, dps[3] = {1, 2, 4};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int zero = 0; zero <= 1; zero++) test_tp(tps[i], dps[j], zero);
  return check_exit("test_dp");
}
