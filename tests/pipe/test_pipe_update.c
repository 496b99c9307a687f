/* test_pipe_update.c - the optimizer's per-pipeline-rank update blocks and
 * the per-rank program extraction (passes/optimizer.c, passes/pipeline_rank.c;
 * docs/pipeline.md, "Execution"), on a hand-written whole-model module of
 * two chunks: @emb is read in both (tied, shared by pp ranks 0 and 1),
 * @w0 only in chunk 0, @w1 only in chunk 1.  Checked:
 *   - pass_optimizer builds update.0 / update.1 (no "update"), each over
 *     its rank's parameters only; the shared gradient is group_summed over
 *     ranks=3 before use; every gradient is squared into the norm on
 *     exactly one rank (the shared one on rank 0); the norm's square sums
 *     are all-reduced over pp (and dp with ZeRO, where the reduce_scatter
 *     follows the group_sum); adamw and zero per rank parameter;
 *   - with pp=4 and vpp=2 (chunks 0..7) a parameter used by chunks 0 and 7
 *     is shared by ranks 0 and 3 (mask 9), and ranks holding nothing still
 *     join the norm's all_reduce;
 *   - refusals: a "micro" block with pp > 1, a rank program, respecializing
 *     the whole-model pipeline module for another dp;
 *   - pass_respecialize_dp on a rank program (what mrun does to run a
 *     pipeline plan at another dp): dp 1 -> 2 -> 4 -> 1 -> 3 and 2 -> 1,
 *     with and without ZeRO, pp 2 and pp 4 x vpp 2, a shared parameter
 *     declared before or after the ranks' own: each step prints exactly as
 *     the rank program compiled at that dp; a group_sum that leaves out the
 *     program's rank is refused, the program unchanged;
 *   - pass_pipeline_rank_module: blocks of the rank's chunks, "update",
 *     only the states used, every state reference re-indexed to the same
 *     name (and `of`), stage = r + 1, verifies, and the text round-trips;
 *     bad ranks and non-pipeline modules are refused;
 *   - a plan of the rank programs keeps the pipeline fields (vpp, schedule,
 *     stage) and the nodes' stage tags through the binary form. */
#include "passes/pipe.h"
#include "plan/plan.h"
#include "../check.h"

static const char *head =
    "module two_chunks\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=10 "
    "min_lr=0.0 clip_grad=1.0 global_batch=4 micro_batch=1 seq_len=4 steps=10 seed=1 precision=f64\n";

/* fwd.0: emb @ w0, sent to chunk 1; fwd.1: received @ w1 * emb -> loss;
 * backward blocks accumulate stand-in gradients (the values do not matter
 * to the optimizer, only which chunk accumulates into which state). */
static const char *body2 =
    "state @emb : f64[4, 3] param init=normal(0.0, 0.02)\n"
    "state @w0 : f64[3, 3] param init=normal(0.0, 0.02)\n"
    "state @w1 : f64[3, 3] param init=normal(0.0, 0.02)\n"
    "state @grad.emb : f64[4, 3] grad of=@emb\n"
    "state @grad.w0 : f64[3, 3] grad of=@w0\n"
    "state @grad.w1 : f64[3, 3] grad of=@w1\n"
    "block fwd.0 {\n"
    "  %0 = state @emb : f64[4, 3]\n"
    "  %1 = state @w0 : f64[3, 3]\n"
    "  %2 = matmul %0, %1 ta=0 tb=0 : f64[4, 3]\n"
    "  send %2 axis=pp peer=1 tag=0\n"
    "}\n"
    "block fwd.1 {\n"
    "  %0 = recv axis=pp peer=-1 tag=0 : f64[4, 3]\n"
    "  %1 = state @w1 : f64[3, 3]\n"
    "  %2 = matmul %0, %1 ta=0 tb=0 : f64[4, 3]\n"
    "  %3 = state @emb : f64[4, 3]\n"
    "  %4 = mul %2, %3 : f64[4, 3]\n"
    "  %5 = sumsq %4 : f64[]\n"
    "  output \"loss\" %5\n"
    "}\n"
    "block bwd.1 {\n"
    "  %0 = state @emb : f64[4, 3]\n"
    "  accum %0 @grad.emb\n"
    "  %2 = state @w1 : f64[3, 3]\n"
    "  accum %2 @grad.w1\n"
    "  send %0 axis=pp peer=-1 tag=1\n"
    "}\n"
    "block bwd.0 {\n"
    "  %0 = recv axis=pp peer=1 tag=1 : f64[4, 3]\n"
    "  accum %0 @grad.emb\n"
    "  %2 = state @w0 : f64[3, 3]\n"
    "  accum %2 @grad.w0\n"
    "}\n"
    "end\n";

static IrModule *parse(const char *par, const char *body) {
  StrBuf b = {0};
  sb_puts(&b, head);
  sb_puts(&b, par);
  sb_puts(&b, body);
  char err[1024] = "";
  IrModule *m = ir_parse_module(b.p, "two_chunks.ir", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (m) CHECK(ir_verify(m, err, sizeof err) == 0, "verify the input: %s", err);
  sb_free(&b);
  return m;
}

/* The state a value comes from, following first operands (group_sum,
 * all_reduce, reshape, pad, reduce_scatter ...); -1 if none. */
static int source_state(const IrBlock *b, int v) {
  while (v >= 0 && v < b->n) {
    const IrNode *n = &b->nodes[v];
    if (n->op == IR_OP_STATE) return (int)n->ia[0];
    if (n->nin < 1) return -1;
    v = n->in[0];
  }
  return -1;
}

static int count_op(const IrBlock *b, IrOp op, int axis) {
  int k = 0;
  for (int i = 0; i < b->n; i++) k += b->nodes[i].op == op && (axis < 0 || b->nodes[i].ia[0] == axis);
  return k;
}

/* The effect `op` on state s in block b (ia[0] for zero/accum, the param for adamw). */
static int has_effect(const IrBlock *b, IrOp op, int s) {
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == op && b->nodes[i].ia[0] == s) return 1;
  return 0;
}

/* Per grad state: in how many update blocks, and how often, it is squared
 * into the norm (a sumsq whose operand comes from it). */
static void norm_counts(const IrModule *m, int pp, int *count) {
  for (int s = 0; s < m->states.n; s++) count[s] = 0;
  for (int r = 0; r < pp; r++) {
    char name[32];
    snprintf(name, sizeof name, "update.%d", r);
    int bi = ir_block_find(m, name);
    if (bi < 0) continue;
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      if (b->nodes[i].op == IR_OP_SUMSQ) {
        int s = source_state(b, b->nodes[i].in[0]);
        if (s >= 0) count[s]++;
      }
  }
}

static const IrBlock *block(const IrModule *m, const char *name) {
  int bi = ir_block_find(m, name);
  CHECK(bi >= 0, "no block %s", name);
  return bi >= 0 ? &m->blocks.a[bi] : NULL;
}

/* The group_sum of shared grad g in b: its ranks mask, or 0 if none; and
 * whether every use of the grad's state read goes through it. */
static int64_t group_sum_mask(const IrBlock *b, int g) {
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_GROUP_SUM && source_state(b, i) == g) {
      CHECK(b->nodes[i].ia[0] == IR_AXIS_PP, "group_sum over axis %lld", (long long)b->nodes[i].ia[0]);
      CHECK(!(b->nodes[i].sh.partial & (1u << IR_AXIS_PP)), "group_sum result still partial over pp");
      /* no other reader of that state read: adamw / reduce take the sum */
      int rd = b->nodes[i].in[0];
      for (int j = 0; j < b->n; j++)
        for (int k = 0; k < b->nodes[j].nin; k++)
          CHECK(b->nodes[j].in[k] != rd || j == i, "node %d (%s) reads the unsummed shared gradient", j,
                ir_ops[b->nodes[j].op].name);
      return b->nodes[i].ia[1];
    }
  return 0;
}

static void test_update_blocks(int dp, int zero) {
  char par[256];
  snprintf(par, sizeof par, "parallel tp=1 pp=2 cp=1 ep=1 dp=%d sp=0 zero=%d vpp=1 schedule=1f1b stage=0\n", dp, zero);
  IrModule *m = parse(par, body2);
  if (!m) return;
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_optimizer(m, &cx);
  CHECK(rc == 0, "optimizer: %s", cx.err);
  char err[1024];
  if (rc == 0) CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  int emb = ir_state_find(m, "emb"), w0 = ir_state_find(m, "w0"), w1 = ir_state_find(m, "w1");
  int gemb = ir_state_find(m, "grad.emb"), gw0 = ir_state_find(m, "grad.w0"), gw1 = ir_state_find(m, "grad.w1");
  CHECK(ir_block_find(m, "update") < 0, "a single update block with pp=2");
  const IrBlock *u0 = block(m, "update.0"), *u1 = block(m, "update.1");
  if (rc != 0 || !u0 || !u1) goto out;
  /* each rank updates and clears its own parameters only */
  CHECK(has_effect(u0, IR_OP_ADAMW, emb) && has_effect(u0, IR_OP_ADAMW, w0) && !has_effect(u0, IR_OP_ADAMW, w1),
        "update.0 adamw set");
  CHECK(has_effect(u1, IR_OP_ADAMW, emb) && has_effect(u1, IR_OP_ADAMW, w1) && !has_effect(u1, IR_OP_ADAMW, w0),
        "update.1 adamw set");
  CHECK(has_effect(u0, IR_OP_ZERO, gemb) && has_effect(u0, IR_OP_ZERO, gw0) && !has_effect(u0, IR_OP_ZERO, gw1),
        "update.0 zero set");
  CHECK(has_effect(u1, IR_OP_ZERO, gemb) && has_effect(u1, IR_OP_ZERO, gw1) && !has_effect(u1, IR_OP_ZERO, gw0),
        "update.1 zero set");
  /* the shared gradient is summed over both ranks, the others are not */
  CHECK(group_sum_mask(u0, gemb) == 3 && group_sum_mask(u1, gemb) == 3, "group_sum ranks=3 of grad.emb");
  CHECK(group_sum_mask(u0, gw0) == 0 && group_sum_mask(u1, gw1) == 0, "group_sum of an unshared gradient");
  CHECK(count_op(u0, IR_OP_GROUP_SUM, -1) == 1 && count_op(u1, IR_OP_GROUP_SUM, -1) == 1, "one group_sum per rank");
  /* every gradient squared exactly once over all ranks; the shared one on rank 0 */
  int cnt[64];
  norm_counts(m, 2, cnt);
  CHECK(cnt[gemb] == 1 && cnt[gw0] == 1 && cnt[gw1] == 1, "norm counts emb %d w0 %d w1 %d", cnt[gemb], cnt[gw0],
        cnt[gw1]);
  CHECK(count_op(u0, IR_OP_SUMSQ, -1) == 2 && count_op(u1, IR_OP_SUMSQ, -1) == 1, "sumsq per rank %d %d",
        count_op(u0, IR_OP_SUMSQ, -1), count_op(u1, IR_OP_SUMSQ, -1));
  /* the norm: one all_reduce over pp per rank, after the dp one with ZeRO */
  for (int r = 0; r < 2; r++) {
    const IrBlock *u = r ? u1 : u0;
    CHECK(count_op(u, IR_OP_ALL_REDUCE, IR_AXIS_PP) == 1, "update.%d: %d all_reduce over pp", r,
          count_op(u, IR_OP_ALL_REDUCE, IR_AXIS_PP));
    int sq = -1;
    for (int i = 0; i < u->n; i++)
      if (u->nodes[i].op == IR_OP_SQRT) sq = i;
    CHECK(sq > 0 && u->nodes[u->nodes[sq].in[0]].op == IR_OP_ALL_REDUCE &&
          u->nodes[u->nodes[sq].in[0]].ia[0] == IR_AXIS_PP, "update.%d: the norm's sqrt reads the pp all_reduce", r);
    int zr = dp > 1 && zero;
    CHECK(count_op(u, IR_OP_REDUCE_SCATTER, IR_AXIS_DP) == (zr ? 2 : 0), "update.%d: reduce_scatters %d",
          r, count_op(u, IR_OP_REDUCE_SCATTER, IR_AXIS_DP));
    CHECK(count_op(u, IR_OP_ALL_REDUCE, IR_AXIS_DP) == (dp > 1 ? (zr ? 1 : 2) : 0), "update.%d: dp all_reduces %d",
          r, count_op(u, IR_OP_ALL_REDUCE, IR_AXIS_DP));
    CHECK(count_op(u, IR_OP_ALL_GATHER, IR_AXIS_DP) == (zr ? 2 : 0), "update.%d: all_gathers", r);
    CHECK(count_op(u, IR_OP_OUTPUT, -1) == 1, "update.%d: grad_norm output", r);
  }
  /* a second run refuses: the blocks exist */
  CHECK(pass_optimizer(m, &cx) != 0 && strstr(cx.err, "already exists"), "second optimizer run: %s", cx.err);

  /* ---- extraction ---- */
  for (int r = 0; r < 2; r++) {
    IrModule *p = pass_pipeline_rank_module(m, r, err, sizeof err);
    CHECK(p != NULL, "rank %d: %s", r, err);
    if (!p) continue;
    CHECK(p->par.stage == r + 1 && p->par.pp == 2 && p->par.dp == dp && p->train.seed == 1 &&
          p->name == m->name, "rank %d: header copied, stage set", r);
    char f[16], b[16];
    snprintf(f, sizeof f, "fwd.%d", r);
    snprintf(b, sizeof b, "bwd.%d", r);
    CHECK(p->blocks.n == 3 && ir_block_find(p, f) >= 0 && ir_block_find(p, b) >= 0 && ir_block_find(p, "update") >= 0,
          "rank %d: %d blocks", r, p->blocks.n);
    /* the states: emb, own weight, their grads, their moments */
    CHECK(p->states.n == 8, "rank %d: %d states", r, p->states.n);
    CHECK(ir_state_find(p, r ? "w0" : "w1") < 0 && ir_state_find(p, r ? "adam_m.w0" : "adam_v.w1") < 0,
          "rank %d holds the other rank's weight", r);
    for (int s = 0; s < p->states.n; s++) {
      const IrState *st = &p->states.a[s];
      int ws = ir_state_find(m, st->name);
      CHECK(ws >= 0 && ir_type_equal(&st->type, &m->states.a[ws].type) && st->kind == m->states.a[ws].kind,
            "state %s", st->name);
      if (st->of >= 0 && ws >= 0)
        CHECK(p->states.a[st->of].name == m->states.a[m->states.a[ws].of].name, "of of %s", st->name);
    }
    /* every node equal to the whole module's, state references by name */
    for (int bi = 0; bi < p->blocks.n; bi++) {
      const IrBlock *pb = &p->blocks.a[bi];
      char wn[32];
      snprintf(wn, sizeof wn, "update.%d", r);
      const IrBlock *wb = block(m, strcmp(pb->name, "update") == 0 ? wn : pb->name);
      if (!wb) continue;
      CHECK(wb->n == pb->n, "block %s size", pb->name);
      for (int i = 0; i < pb->n && i < wb->n; i++) {
        const IrNode *x = &pb->nodes[i], *y = &wb->nodes[i];
        CHECK(x->op == y->op && x->nin == y->nin && ir_type_equal(&x->type, &y->type), "block %s node %d", pb->name, i);
        for (int k = 0; k < IR_MAX_IATTR; k++) {
          if (!ir_op_iattr_is_state(x->op, k)) { CHECK(x->ia[k] == y->ia[k], "attr"); continue; }
          CHECK(x->ia[k] >= 0 && x->ia[k] < p->states.n &&
                p->states.a[x->ia[k]].name == m->states.a[y->ia[k]].name, "block %s node %d: state attr %d", pb->name,
                i, k);
        }
      }
    }
    /* text round trip */
    StrBuf t1 = {0}, t2 = {0};
    ir_print_module(p, &t1);
    CHECK(strstr(t1.p, "stage=") != NULL, "parallel line without stage");
    IrModule *q = ir_parse_module(t1.p, "rank.ir", err, sizeof err);
    CHECK(q != NULL, "rank %d reparse: %s", r, err);
    if (q) {
      ir_print_module(q, &t2);
      CHECK(t2.p && strcmp(t1.p, t2.p) == 0, "rank %d: text does not round-trip", r);
      CHECK(ir_verify(q, err, sizeof err) == 0, "rank %d reparsed: %s", r, err);
      ir_module_free(q);
    }
    sb_free(&t1);
    sb_free(&t2);
    /* the binary plan keeps the parallel line's pipeline fields and the
     * nodes' stage tags (tag one node: the hand-written blocks have none) */
    p->blocks.a[0].nodes[0].stage = ir_stage_tag(r, 0);
    Plan *plan = plan_new();
    plan->mesh = (PlanMesh){dp, 2, 1, 1, 1};
    plan->nprograms = 1;
    plan->programs = ts_xmalloc(sizeof *plan->programs);
    plan->programs[0] = p;
    plan->nranks = 2 * dp;
    plan->rank_program = ts_xcalloc((size_t)plan->nranks, sizeof *plan->rank_program);
    StrBuf bin = {0}, pt1 = {0}, pt2 = {0};
    plan_encode(plan, &bin);
    Plan *back = plan_decode(bin.p, bin.n, err, sizeof err);
    CHECK(back != NULL, "rank %d: plan decode: %s", r, err);
    if (back) {
      const IrModule *bp = back->programs[0];
      CHECK(bp->par.stage == r + 1 && bp->par.vpp == 1 && bp->par.sched == IR_PIPE_1F1B, "rank %d: decoded parallel "
            "stage=%d vpp=%d sched=%d", r, bp->par.stage, bp->par.vpp, bp->par.sched);
      CHECK(bp->blocks.a[0].nodes[0].stage == ir_stage_tag(r, 0), "rank %d: stage tag lost", r);
      ir_print_module(p, &pt1);
      ir_print_module(bp, &pt2);
      CHECK(pt1.p && pt2.p && strcmp(pt1.p, pt2.p) == 0, "rank %d: decoded program prints differently", r);
      plan_free(back);
    }
    sb_free(&bin);
    sb_free(&pt1);
    sb_free(&pt2);
    plan->programs[0] = NULL;
    plan->nprograms = 0;
    plan_free(plan);
    /* a rank program is not re-optimized nor re-specialized */
    PassCtx c2;
    pass_ctx_init(&c2);
    CHECK(pass_optimizer(p, &c2) != 0 && strstr(c2.err, "stage"), "optimizer on a rank program: %s", c2.err);
    pass_ctx_free(&c2);
    /* (respecializing a rank program for another dp: test_respecialize) */
    ir_module_free(p);
  }
  CHECK(pass_pipeline_rank_module(m, 2, err, sizeof err) == NULL && strstr(err, "rank 2"), "rank 2 of pp=2: %s", err);
  CHECK(pass_pipeline_rank_module(m, -1, err, sizeof err) == NULL, "rank -1");
  /* the whole-model module is not what runs: its rank programs are respecialized */
  StrBuf before = {0}, after = {0};
  ir_print_module(m, &before);
  CHECK(pass_respecialize_dp(m, 4, err, sizeof err) != 0 && strstr(err, "whole-model pipeline module") &&
        strstr(err, "--dp 4"), "respecialize whole: %s", err);
  ir_print_module(m, &after);
  CHECK(before.p && after.p && strcmp(before.p, after.p) == 0, "a refused respecialize changed the whole module");
  sb_free(&before);
  sb_free(&after);
out:
  pass_ctx_free(&cx);
  ir_module_free(m);
}

/* pp=4, vpp=2: chunks 0..7 (rank g % 4); @emb read by chunks 0 and 7
 * (ranks 0 and 3), @w<g> by chunk g.  Blocks of the middle chunks only
 * relay.  Ranks 1 and 2 count w1, w5 / w2, w6 in their norm. */
static void interleaved_body(StrBuf *bp) {
  StrBuf b = {0};
  sb_puts(&b, "state @emb : f64[4, 3] param init=normal(0.0, 0.02)\n");
  for (int g = 0; g < 8; g++) sb_printf(&b, "state @w%d : f64[3, 3] param init=normal(0.0, 0.02)\n", g);
  sb_puts(&b, "state @grad.emb : f64[4, 3] grad of=@emb\n");
  for (int g = 0; g < 8; g++) sb_printf(&b, "state @grad.w%d : f64[3, 3] grad of=@w%d\n", g, g);
  for (int g = 0; g < 8; g++) {
    sb_printf(&b, "block fwd.%d {\n  %%0 = state @w%d : f64[3, 3]\n", g, g);
    if (g == 0 || g == 7) sb_puts(&b, "  %1 = state @emb : f64[4, 3]\n");
    sb_puts(&b, "}\n");
    sb_printf(&b, "block bwd.%d {\n  %%0 = state @w%d : f64[3, 3]\n  accum %%0 @grad.w%d\n", g, g, g);
    if (g == 0 || g == 7) sb_puts(&b, "  %2 = state @emb : f64[4, 3]\n  accum %2 @grad.emb\n");
    sb_puts(&b, "}\n");
  }
  sb_puts(&b, "end\n");
  *bp = b;
}

static void test_interleaved(void) {
  StrBuf b = {0};
  interleaved_body(&b);
  IrModule *m = parse("parallel tp=1 pp=4 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=2 schedule=interleaved stage=0\n", b.p);
  sb_free(&b);
  if (!m) return;
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_optimizer(m, &cx);
  CHECK(rc == 0, "optimizer: %s", cx.err);
  char err[1024];
  if (rc == 0) CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  int gemb = ir_state_find(m, "grad.emb");
  int cnt[64];
  norm_counts(m, 4, cnt);
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_GRAD) CHECK(cnt[s] == 1, "%s squared %d times", m->states.a[s].name, cnt[s]);
  for (int r = 0; rc == 0 && r < 4; r++) {
    char n[32];
    snprintf(n, sizeof n, "update.%d", r);
    const IrBlock *u = block(m, n);
    if (!u) continue;
    CHECK(group_sum_mask(u, gemb) == (r == 0 || r == 3 ? 9 : 0), "update.%d group_sum mask", r);
    CHECK(count_op(u, IR_OP_ADAMW, -1) == (r == 0 || r == 3 ? 3 : 2), "update.%d: %d adamw", r,
          count_op(u, IR_OP_ADAMW, -1));
    CHECK(count_op(u, IR_OP_ALL_REDUCE, IR_AXIS_PP) == 1, "update.%d: pp all_reduce", r);
    for (int g = 0; g < 8; g++) {
      char w[16];
      snprintf(w, sizeof w, "w%d", g);
      CHECK(has_effect(u, IR_OP_ADAMW, ir_state_find(m, w)) == (g % 4 == r), "update.%d adamw of %s", r, w);
    }
    IrModule *p = pass_pipeline_rank_module(m, r, err, sizeof err);
    CHECK(p != NULL, "rank %d: %s", r, err);
    if (!p) continue;
    /* chunks r and r + 4: 2 weights, 2 grads, 4 moments, plus emb's 4 states on ranks 0 and 3 */
    CHECK(p->blocks.n == 5, "rank %d: %d blocks", r, p->blocks.n);
    CHECK(p->states.n == (r == 0 || r == 3 ? 12 : 8), "rank %d: %d states", r, p->states.n);
    ir_module_free(p);
  }
  pass_ctx_free(&cx);
  ir_module_free(m);

  /* a rank whose chunks hold no parameter still joins the norm's all_reduce */
  IrModule *e = parse("parallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n",
                      "state @w : f64[3] param init=ones\n"
                      "state @grad.w : f64[3] grad of=@w\n"
                      "block fwd.0 {\n  %0 = state @w : f64[3]\n}\n"
                      "block bwd.0 {\n  %0 = state @w : f64[3]\n  accum %0 @grad.w\n}\n"
                      "block fwd.1 {\n}\nblock bwd.1 {\n}\nend\n");
  if (!e) return;
  pass_ctx_init(&cx);
  rc = pass_optimizer(e, &cx);
  CHECK(rc == 0, "optimizer (empty rank): %s", cx.err);
  if (rc == 0) {
    CHECK(ir_verify(e, err, sizeof err) == 0, "verify: %s", err);
    const IrBlock *u1 = block(e, "update.1");
    if (u1) CHECK(count_op(u1, IR_OP_ALL_REDUCE, IR_AXIS_PP) == 1 && count_op(u1, IR_OP_ADAMW, -1) == 0 &&
                  count_op(u1, IR_OP_FULL, -1) >= 1, "update.1 of an empty rank");
    IrModule *p = pass_pipeline_rank_module(e, 1, err, sizeof err);
    CHECK(p && p->states.n == 0 && p->blocks.n == 3, "empty rank program: %s", p ? "wrong shape" : err);
    ir_module_free(p);
  }
  pass_ctx_free(&cx);
  ir_module_free(e);
}

/* The text of pipeline rank r's program of `body` compiled (pass_optimizer
 * and pass_dce on the whole module, then cut) with parallel line par at dp; NULL on a
 * failure (checked). */
static char *rank_text(const char *parfmt, int dp, const char *body, int r) {
  char par[256];
  snprintf(par, sizeof par, parfmt, dp);
  IrModule *m = parse(par, body);
  if (!m) return NULL;
  PassCtx cx;
  pass_ctx_init(&cx);
  char err[1024], *text = NULL;
  int rc = pass_optimizer(m, &cx);
  if (rc == 0) rc = pass_dce(m, &cx);     /* as mcc's pipeline does after the optimizer */
  CHECK(rc == 0, "optimizer at dp=%d: %s", dp, cx.err);
  IrModule *p = rc == 0 ? pass_pipeline_rank_module(m, r, err, sizeof err) : NULL;
  CHECK(rc != 0 || p, "rank %d at dp=%d: %s", r, dp, err);
  if (p) {
    StrBuf t = {0};
    ir_print_module(p, &t);
    text = t.p;
    ir_module_free(p);
  }
  pass_ctx_free(&cx);
  ir_module_free(m);
  return text;
}

/* Every rank program of `body` compiled at dp `from`, respecialized to
 * each dp of `to` in turn (what mrun does), prints exactly as the program
 * compiled at that dp: the update block (group_sum of the shared gradient,
 * the norm counted once over the ranks, ZeRO's chunks), the dp marks on
 * the gradients, the moments and their order. */
static void respec_chain(const char *tag, const char *parfmt, const char *body, int pp, int from, const int *to,
                         int nto) {
  for (int r = 0; r < pp; r++) {
    char par[256], err[1024];
    snprintf(par, sizeof par, parfmt, from);
    IrModule *m = parse(par, body);
    if (!m) return;
    PassCtx cx;
    pass_ctx_init(&cx);
    IrModule *p = pass_optimizer(m, &cx) == 0 && pass_dce(m, &cx) == 0 ? pass_pipeline_rank_module(m, r, err, sizeof err)
                                                                        : NULL;
    CHECK(p != NULL, "%s: rank %d at dp=%d: %s %s", tag, r, from, cx.err, err);
    pass_ctx_free(&cx);
    ir_module_free(m);
    for (int k = 0; p && k < nto; k++) {
      int rc = pass_respecialize_dp(p, to[k], err, sizeof err);
      CHECK(rc == 0, "%s: rank %d: respecialize to dp=%d: %s", tag, r, to[k], err);
      if (rc != 0) break;
      CHECK(ir_verify(p, err, sizeof err) == 0, "%s: rank %d at dp=%d: %s", tag, r, to[k], err);
      StrBuf got = {0};
      ir_print_module(p, &got);
      char *want = rank_text(parfmt, to[k], body, r);
      CHECK(want && got.p && strcmp(got.p, want) == 0, "%s: rank %d: respecialized %d -> dp=%d differs from "
            "compiling at dp=%d:\n--- respecialized\n%s--- compiled\n%s", tag, r, k ? to[k - 1] : from, to[k], to[k],
            got.p ? got.p : "", want ? want : "");
      free(want);
      sb_free(&got);
    }
    ir_module_free(p);
  }
}

static void test_respecialize(void) {
  static const int chain[] = {2, 4, 1, 3};
  for (int zero = 0; zero <= 1; zero++) {
    char fmt[256];
    snprintf(fmt, sizeof fmt, "parallel tp=1 pp=2 cp=1 ep=1 dp=%%d sp=0 zero=%d vpp=1 schedule=1f1b stage=0\n", zero);
    respec_chain(zero ? "pp2 zero" : "pp2 no-zero", fmt, body2, 2, 1, chain, 4);
    static const int down[] = {1};
    respec_chain(zero ? "pp2 zero 2->1" : "pp2 no-zero 2->1", fmt, body2, 2, 2, down, 1);
  }
  /* the shared parameter declared after the ranks' own: rank 1's program
   * holds the moments of emb (made for update.0) before those of w1 */
  StrBuf late = {0};
  const char *blocks = strstr(body2, "block fwd.0");
  sb_puts(&late, "state @w0 : f64[3, 3] param init=normal(0.0, 0.02)\n"
                 "state @w1 : f64[3, 3] param init=normal(0.0, 0.02)\n"
                 "state @emb : f64[4, 3] param init=normal(0.0, 0.02)\n"
                 "state @grad.w0 : f64[3, 3] grad of=@w0\n"
                 "state @grad.w1 : f64[3, 3] grad of=@w1\n"
                 "state @grad.emb : f64[4, 3] grad of=@emb\n");
  sb_puts(&late, blocks);
  respec_chain("pp2 shared last", "parallel tp=1 pp=2 cp=1 ep=1 dp=%d sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n",
               late.p, 2, 1, chain, 4);
  sb_free(&late);
  /* pp 4 x vpp 2: emb shared by ranks 0 and 3 (mask 9) */
  StrBuf il = {0};
  interleaved_body(&il);
  respec_chain("pp4 vpp2", "parallel tp=1 pp=4 cp=1 ep=1 dp=%d sp=0 zero=1 vpp=2 schedule=interleaved stage=0\n",
               il.p, 4, 1, chain, 4);
  sb_free(&il);

  /* a group_sum whose ranks leave out the program's own rank is refused,
   * the program unchanged */
  IrModule *m = parse("parallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n", body2);
  if (!m) return;
  PassCtx cx;
  pass_ctx_init(&cx);
  char err[1024];
  IrModule *p = pass_optimizer(m, &cx) == 0 ? pass_pipeline_rank_module(m, 1, err, sizeof err) : NULL;
  CHECK(p != NULL, "rank 1: %s %s", cx.err, err);
  pass_ctx_free(&cx);
  ir_module_free(m);
  if (!p) return;
  IrBlock *u = &p->blocks.a[ir_block_find(p, "update")];
  for (int i = 0; i < u->n; i++)
    if (u->nodes[i].op == IR_OP_GROUP_SUM) u->nodes[i].ia[1] = 1;   /* rank 0 only: not rank 1's */
  StrBuf before = {0}, after = {0};
  ir_print_module(p, &before);
  CHECK(pass_respecialize_dp(p, 2, err, sizeof err) != 0 && strstr(err, "ranks=1") && strstr(err, "rank 1"),
        "a group_sum without the program's rank: %s", err);
  ir_print_module(p, &after);
  CHECK(before.p && after.p && strcmp(before.p, after.p) == 0, "a refused respecialize changed the program");
  sb_free(&before);
  sb_free(&after);
  ir_module_free(p);
}

/* s with every `from` replaced by `to`, into out. */
static void subst_all(const char *s, const char *from, const char *to, StrBuf *out) {
  size_t n = strlen(from);
  for (const char *q; (q = strstr(s, from)); s = q + n) {
    sb_printf(out, "%.*s", (int)(q - s), s);
    sb_puts(out, to);
  }
  sb_puts(out, s);
}

/* fp16 (issue 20): the whole module's scaler.<r> and skip.<r> check and
 * clear rank r's gradients (the shared emb on both ranks), take the max
 * over pp, and are cut into the rank program's "scaler" and "skip", right
 * after its "update" (which ends with the scale update); respecialized
 * for another dp, each rank program prints exactly as compiled there. */
static void test_respecialize_fp16(void) {
  const char *h0 = head;
  StrBuf hb = {0}, bb = {0};
  subst_all(h0, "precision=f64", "precision=f16", &hb);
  sb_puts(&bb, "state @loss_scale : f32[] scaler start=1024.0\n"
               "state @loss_scale.good : f32[] scaler start=0.0\n"
               "state @loss_scale.hyst : f32[] scaler start=2.0\n"
               "state @loss_scale.skipped : f32[] scaler start=0.0\n");
  subst_all(body2, "f64", "f32", &bb);
  head = hb.p;
  const char *fmt = "parallel tp=1 pp=2 cp=1 ep=1 dp=%d sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n";
  static const int chain[] = {2, 4, 1, 3};
  respec_chain("pp2 fp16", fmt, bb.p, 2, 1, chain, 4);
  static const char *const grads[2][3] = {{"grad.emb", "grad.w0", NULL}, {"grad.emb", "grad.w1", NULL}};
  for (int r = 0; r < 2; r++) {
    char *text = rank_text(fmt, 2, bb.p, r);
    char err[1024] = "";
    IrModule *p = text ? ir_parse_module(text, "rank.ir", err, sizeof err) : NULL;
    CHECK(p != NULL, "fp16 rank %d program: %s", r, err);
    if (p) {
      int ub = ir_block_find(p, "update"), sb = ir_block_find(p, "scaler"), kb = ir_block_find(p, "skip");
      CHECK(ub >= 0 && sb == ub + 1 && kb == ub + 2, "fp16 rank %d: blocks update %d, scaler %d, skip %d", r, ub, sb,
            kb);
      if (sb >= 0 && kb >= 0) {
        const IrBlock *b = &p->blocks.a[sb], *k = &p->blocks.a[kb];
        CHECK(count_op(b, IR_OP_ALL_REDUCE, IR_AXIS_PP) == 1 && count_op(b, IR_OP_ALL_REDUCE, IR_AXIS_DP) == 1,
              "fp16 rank %d: the inf check is not a max over pp and dp", r);
        CHECK(count_op(b, IR_OP_NONFINITE, -1) == 2 && count_op(k, IR_OP_ZERO, -1) == 2,
              "fp16 rank %d: scaler / skip do not cover the rank's 2 gradients", r);
        for (int g = 0; grads[r][g]; g++) {
          int s = ir_state_find(p, grads[r][g]), seen = 0;
          for (int i = 0; i < k->n; i++) seen |= k->nodes[i].op == IR_OP_ZERO && k->nodes[i].ia[0] == s;
          CHECK(s >= 0 && seen, "fp16 rank %d: skip does not clear @%s", r, grads[r][g]);
        }
      }
      if (ub >= 0) {
        const IrBlock *u = &p->blocks.a[ub];
        CHECK(u->n > 0 && u->nodes[u->n - 1].op == IR_OP_SCALE_UPDATE, "fp16 rank %d: update does not end with "
              "scale_update", r);
      }
      ir_module_free(p);
    }
    free(text);
  }
  head = h0;
  sb_free(&hb);
  sb_free(&bb);
}

static void test_refusals(void) {
  /* pp > 1 with a micro block (the pipeline pass did not run) */
  IrModule *m = parse("parallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n",
                      "state @w : f64[3] param init=ones\n"
                      "state @grad.w : f64[3] grad of=@w\n"
                      "block micro {\n  %0 = state @w : f64[3]\n  accum %0 @grad.w\n}\nend\n");
  if (!m) return;
  PassCtx cx;
  pass_ctx_init(&cx);
  CHECK(pass_optimizer(m, &cx) != 0 && strstr(cx.err, "micro"), "micro with pp=2: %s", cx.err);
  CHECK(m->blocks.n == 1, "refusal changed the module");
  char err[512];
  CHECK(pass_pipeline_rank_module(m, 0, err, sizeof err) == NULL && strstr(err, "update.0"), "no update.0: %s", err);
  pass_ctx_free(&cx);
  m->par.pp = 1;
  m->par.vpp = 0;
  m->par.sched = 0;
  CHECK(pass_pipeline_rank_module(m, 0, err, sizeof err) == NULL && strstr(err, "not a whole-model"), "pp=1: %s", err);
  ir_module_free(m);
}

int main(void) {
  test_update_blocks(1, 1);
  test_update_blocks(2, 1);
  test_update_blocks(2, 0);
  test_interleaved();
  test_respecialize();
  test_respecialize_fp16();
  test_refusals();
  return check_exit("test_pipe_update");
}
