/* test_pipe_split.c - passes "partition" and "pipeline" (passes/pipesplit.c)
 * on the samples: the micro block cut into fwd.<g> / bwd.<g> for pp 2 and
 * 4, with and without interleaving, tp and sp.  Checked on the result:
 *   - blocks of every chunk exist, "micro" is gone, every node carries
 *     its block's stage tag, the module verifies and round-trips as text;
 *   - every boundary carries exactly one activation forward and one
 *     gradient back, of the hidden state's type [micro, seq, d_model]
 *     (sequence-split under sp);
 *   - the loss is reported by the last chunk only;
 *   - no matmul is lost or duplicated: their count over all blocks equals
 *     micro's, and each chunk's parameters are accumulated where they are
 *     read (the tied embedding of gpt: in the first and the last chunk);
 *   - the verifier refuses broken pairings (a recv without its send,
 *     messages received out of order, an unstash without its stash, an
 *     evaluation block's message to a forward block, a stash in one);
 *   - pass eval makes eval.<g> for every chunk: no stash, accum, dropout
 *     or gradient state, the forward's matmuls, the loss in the last
 *     chunk only, one hidden-state message per boundary with tags of its
 *     own; derived again, the module's text is the same.  gpt runs with
 *     dropout 0.1 so that there is dropout to take out. */
#include "frontend/mdl.h"
#include "passes/pipe.h"
#include "../check.h"

static IrModule *sample(const char *name, int layers, int pp, int vpp, int tp, int sp) {
  char path[1024], L[16];
  snprintf(path, sizeof path, "%s/samples/%s.mdl", TS_SOURCE_DIR, name);
  snprintf(L, sizeof L, "%d", layers);
  MdlDefine defs[] = {{ts_intern("layers"), L},       {ts_intern("vocab"), "256"},   {ts_intern("d_model"), "32"},
                      {ts_intern("heads"), "4"},      {ts_intern("kv_heads"), "2"},  {ts_intern("seq_len"), "16"},
                      {ts_intern("batch"), "8"},      {ts_intern("micro_batch"), "2"}, {ts_intern("ffn"), "64"}};
  int nd = strcmp(name, "llama") == 0 ? 9 : 8;
  if (strcmp(name, "gpt") == 0) {   /* gpt has no kv_heads / ffn; it has dropout */
    defs[4] = defs[7], defs[7] = (MdlDefine){ts_intern("dropout"), "0.1"};
    nd = 8;
  }
  MdlOptions o;
  mdl_options_init(&o);
  o.defines = defs, o.ndefines = nd;
  IrModule *m = mdl_compile_file(path, &o);
  CHECK(m != NULL, "cannot compile %s", path);
  if (!m) return NULL;
  m->par.pp = pp;
  m->par.vpp = vpp;
  m->par.tp = tp;
  m->par.sp = sp;
  return m;
}

/* partition, autodiff, shard, pipeline, with the verifier after each */
static int split(IrModule *m, PassCtx *cx) {
  PassFn fns[] = {pass_partition, pass_autodiff, pass_shard, pass_pipe_split};
  char err[1024];
  for (int i = 0; i < 4; i++) {
    if (fns[i](m, cx) != 0) return -1;
    if (ir_verify(m, err, sizeof err) != 0) {
      snprintf(cx->err, sizeof cx->err, "verify after pass %d: %.1000s", i, err);
      return -1;
    }
  }
  return 0;
}

static int count_op(const IrBlock *b, IrOp op) {
  int k = 0;
  for (int i = 0; i < b->n; i++) k += b->nodes[i].op == op;
  return k;
}

static void check_roundtrip(const IrModule *m, const char *what) {
  StrBuf a = {0}, b = {0};
  ir_print_module(m, &a);
  char err[1024];
  IrModule *back = ir_parse_module(a.p, what, err, sizeof err);
  CHECK(back != NULL, "%s: does not parse back: %s", what, err);
  if (back) {
    ir_print_module(back, &b);
    CHECK(a.n == b.n && memcmp(a.p, b.p, a.n) == 0, "%s: text does not round-trip", what);
    ir_module_free(back);
  }
  sb_free(&a);
  sb_free(&b);
}

/* Pass eval on the split module m (K chunks): eval.<g> per chunk, forward
 * only, with messages of their own (see the file's comment). */
static void eval_case(IrModule *m, const char *what, int K, int sp, int tp) {
  int maxtag = -1, drop_fwd = 0, mm_fwd = 0, mm_eval = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      if ((b->nodes[i].op == IR_OP_SEND || b->nodes[i].op == IR_OP_RECV) && b->nodes[i].ia[2] > maxtag)
        maxtag = (int)b->nodes[i].ia[2];
    int bwd, g = ir_block_chunk(b, &bwd);
    if (g >= 0 && !bwd) drop_fwd += count_op(b, IR_OP_DROPOUT), mm_fwd += count_op(b, IR_OP_MATMUL);
  }
  PassCtx cx;
  pass_ctx_init(&cx);
  int ok = pass_eval(m, &cx) == 0;
  CHECK(ok, "%s: pass eval: %s", what, cx.err);
  char err[1024];
  if (ok) CHECK(ir_verify(m, err, sizeof err) == 0, "%s: after pass eval: %s", what, err);
  StrBuf once = {0}, twice = {0};
  ir_print_module(m, &once);
  ok = ok && pass_eval(m, &cx) == 0;   /* a recompiled module: derived again, the same */
  ir_print_module(m, &twice);
  CHECK(ok && once.n == twice.n && memcmp(once.p, twice.p, once.n) == 0, "%s: pass eval run twice differs", what);
  sb_free(&once);
  sb_free(&twice);
  pass_ctx_free(&cx);
  if (!ok) return;
  if (strstr(what, "gpt")) CHECK(drop_fwd > 0, "%s: no dropout in the forward blocks to take out", what);
  for (int g = 0; g < K; g++) {
    char bn[32];
    snprintf(bn, sizeof bn, "eval.%d", g);
    int bi = ir_block_find(m, ts_intern(bn));
    CHECK(bi >= 0, "%s: no block %s", what, bn);
    if (bi < 0) continue;
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind;
    CHECK(ir_block_chunk_kind(b, &kind) == g && kind == IR_CHUNK_EVAL, "%s: %s is not chunk %d's eval block", what, bn, g);
    static const IrOp never[] = {IR_OP_STASH, IR_OP_UNSTASH, IR_OP_ACCUM, IR_OP_DROPOUT, IR_OP_ZERO, IR_OP_ADAMW};
    for (size_t k = 0; k < sizeof never / sizeof never[0]; k++)
      CHECK(count_op(b, never[k]) == 0, "%s: %s has %d %s nodes", what, bn, count_op(b, never[k]), ir_ops[never[k]].name);
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op == IR_OP_STATE)
        CHECK(m->states.a[n->ia[0]].kind == IR_STATE_PARAM, "%s: %s reads state @%s", what, bn, m->states.a[n->ia[0]].name);
      if (n->op == IR_OP_SEND || n->op == IR_OP_RECV) {
        CHECK(n->ia[2] > maxtag, "%s: %s node %d has tag %lld, one of the training messages' (<= %d)", what, bn, i,
              (long long)n->ia[2], maxtag);
        const IrType *t = n->op == IR_OP_RECV ? &n->type : &b->nodes[n->in[0]].type;
        int64_t want_seq = sp && (n->op == IR_OP_RECV ? n : &b->nodes[n->in[0]])->sh.split[1] ? 16 / tp : 16;
        CHECK(t->rank == 3 && t->dim[1] == want_seq && t->dim[2] == 32, "%s: %s node %d: a message that is not the "
              "hidden state", what, bn, i);
      }
    }
    CHECK(count_op(b, IR_OP_RECV) == (g > 0) && count_op(b, IR_OP_SEND) == (g < K - 1),
          "%s: %s receives %d and sends %d messages", what, bn, count_op(b, IR_OP_RECV), count_op(b, IR_OP_SEND));
    int nloss = 0;
    for (int i = 0; i < b->n; i++) nloss += b->nodes[i].op == IR_OP_OUTPUT && strcmp(b->nodes[i].sa, "loss") == 0;
    CHECK(nloss == (g == K - 1), "%s: %s reports the loss %d times", what, bn, nloss);
    mm_eval += count_op(b, IR_OP_MATMUL);
  }
  CHECK(mm_eval == mm_fwd, "%s: %d matmuls in the eval blocks, %d in the forward blocks", what, mm_eval, mm_fwd);
}

/* Splits `ref` into pipeline blocks, and `m` too (then, with `wsplit`, its
 * backwards into B and W under zb-h1, verified).  1 when both worked; else
 * 0 with a failed check, both modules freed (either may be NULL). */
static int split_pair(IrModule *ref, IrModule *m, int wsplit, const char *what) {
  if (!ref || !m) { ir_module_free(ref); ir_module_free(m); return 0; }
  PassCtx cx;
  pass_ctx_init(&cx);
  int ok = split(ref, &cx) == 0;
  CHECK(ok, "%s: reference: %s", what, cx.err);
  pass_ctx_free(&cx);
  pass_ctx_init(&cx);
  if (wsplit) m->par.sched = IR_PIPE_ZBH1;
  ok = ok && split(m, &cx) == 0 && (!wsplit || pass_wsplit(m, &cx) == 0);
  CHECK(ok, "%s: %s", what, cx.err);
  char err[1024];
  if (ok && wsplit) {
    ok = ir_verify(m, err, sizeof err) == 0;
    CHECK(ok, "%s: verify after wsplit: %s", what, err);
  }
  pass_ctx_free(&cx);
  if (!ok) { ir_module_free(ref); ir_module_free(m); }
  return ok;
}

static void split_case(const char *name, int layers, int pp, int vpp, int tp, int sp) {
  char what[128];
  snprintf(what, sizeof what, "%s layers=%d pp=%d vpp=%d tp=%d sp=%d", name, layers, pp, vpp, tp, sp);
  /* the reference: the same model without pipeline, for matmul counts */
  IrModule *ref = sample(name, layers, 1, 0, tp, sp);
  IrModule *m = sample(name, layers, pp, vpp, tp, sp);
  if (!split_pair(ref, m, 0, what)) return;
  int K = pp * vpp;
  CHECK(ir_block_find(m, "micro") < 0, "%s: micro still there", what);
  int mm_ref = count_op(&ref->blocks.a[ir_block_find(ref, "micro")], IR_OP_MATMUL), mm = 0;
  int wte = ir_state_find(m, "grad.token_embedding.wte");
  for (int g = 0; g < K; g++)
    for (int bwd = 0; bwd < 2; bwd++) {
      char bn[32];
      snprintf(bn, sizeof bn, "%s.%d", bwd ? "bwd" : "fwd", g);
      int bi = ir_block_find(m, ts_intern(bn));
      CHECK(bi >= 0, "%s: no block %s", what, bn);
      if (bi < 0) continue;
      const IrBlock *b = &m->blocks.a[bi];
      int tag = ir_stage_tag(g, bwd);
      for (int i = 0; i < b->n; i++)
        if (b->nodes[i].stage != tag) {
          CHECK(0, "%s: block %s node %d has stage %d, want %d", what, bn, i, b->nodes[i].stage, tag);
          break;
        }
      mm += count_op(b, IR_OP_MATMUL);
      /* one message in from the neighbour, one out to the other */
      int nrecv = count_op(b, IR_OP_RECV), nsend = count_op(b, IR_OP_SEND);
      int want_recv = bwd ? g < K - 1 : g > 0, want_send = bwd ? g > 0 : g < K - 1;
      CHECK(nrecv == want_recv && nsend == want_send, "%s: block %s receives %d and sends %d messages, want %d and %d",
            what, bn, nrecv, nsend, want_recv, want_send);
      for (int i = 0; i < b->n; i++) {
        const IrNode *n = &b->nodes[i];
        const IrNode *v = n->op == IR_OP_RECV ? n : n->op == IR_OP_SEND ? &b->nodes[n->in[0]] : NULL;
        if (!v) continue;
        const IrType *t = &v->type;
        /* under sp the hidden state is sequence-split, or (llama's residual
         * stream) a tp-partial sum of the whole sequence */
        int64_t want_seq = sp && v->sh.split[1] ? 16 / tp : 16;
        CHECK(t->rank == 3 && t->dim[0] == 2 && t->dim[1] == want_seq && t->dim[2] == 32,
              "%s: block %s node %d: a message of %lld x %lld x %lld, want the hidden state 2 x %lld x 32", what, bn,
              i, (long long)t->dim[0], (long long)t->dim[1], (long long)t->dim[2], (long long)want_seq);
      }
      int nloss = 0;
      for (int i = 0; i < b->n; i++) nloss += b->nodes[i].op == IR_OP_OUTPUT && strcmp(b->nodes[i].sa, "loss") == 0;
      CHECK(nloss == (!bwd && g == K - 1), "%s: block %s reports the loss %d times", what, bn, nloss);
      /* gpt ties the embedding and the head: both ends accumulate its gradient */
      if (bwd && wte >= 0 && strcmp(name, "gpt") == 0) {
        int acc = 0;
        for (int i = 0; i < b->n; i++) acc += b->nodes[i].op == IR_OP_ACCUM && b->nodes[i].ia[0] == wte;
        CHECK(acc == (g == 0 || g == K - 1), "%s: block %s accumulates the tied embedding %d times", what, bn, acc);
      }
    }
  CHECK(mm == mm_ref, "%s: %d matmuls over the blocks, micro had %d", what, mm, mm_ref);
  eval_case(m, what, K, sp, tp);
  /* every accum of a parameter's gradient sits in a chunk whose blocks read the parameter */
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int bwd, g = ir_block_chunk(b, &bwd);
    for (int i = 0; i < b->n; i++) {
      if (b->nodes[i].op != IR_OP_ACCUM) continue;
      int p = m->states.a[b->nodes[i].ia[0]].of, read = 0;
      for (int bj = 0; bj < m->blocks.n && !read; bj++) {
        const IrBlock *c = &m->blocks.a[bj];
        if (ir_block_chunk(c, NULL) != g) continue;
        for (int j = 0; j < c->n; j++) read |= c->nodes[j].op == IR_OP_STATE && c->nodes[j].ia[0] == p;
      }
      CHECK(read, "%s: %s accumulates @%s's gradient but chunk %d never reads it", what, b->name,
            m->states.a[p].name, g);
    }
  }
  check_roundtrip(m, what);
  ir_module_free(ref);
  ir_module_free(m);
}

/* ---- pass wsplit (--schedule zb-h1): bwd.<g> -> B (bwd.<g>) + W (wgt.<g>) ---- */

/* 1 for every node of b that a send or a stash of b needs, transitively. */
static unsigned char *send_slice(const IrBlock *b) {
  unsigned char *in = ts_xcalloc((size_t)b->n + 1, 1);
  for (int i = b->n - 1; i >= 0; i--) {
    if (b->nodes[i].op == IR_OP_SEND || b->nodes[i].op == IR_OP_STASH) in[i] = 1;
    if (in[i])
      for (int k = 0; k < b->nodes[i].nin; k++) in[b->nodes[i].in[k]] = 1;
  }
  return in;
}

static void wsplit_case(const char *name, int layers, int pp, int tp, int sp) {
  char what[128];
  snprintf(what, sizeof what, "wsplit %s layers=%d pp=%d tp=%d sp=%d", name, layers, pp, tp, sp);
  IrModule *ref = sample(name, layers, pp, 1, tp, sp), *m = sample(name, layers, pp, 1, tp, sp);
  if (!split_pair(ref, m, 1, what)) return;
  for (int g = 0; g < pp; g++) {
    char bn[32], wn[32], fn[32];
    snprintf(bn, sizeof bn, "bwd.%d", g), snprintf(wn, sizeof wn, "wgt.%d", g), snprintf(fn, sizeof fn, "fwd.%d", g);
    int bi = ir_block_find(m, ts_intern(bn)), wi = ir_block_find(m, ts_intern(wn)), fi = ir_block_find(m, ts_intern(fn));
    int ri = ir_block_find(ref, ts_intern(bn));
    CHECK(bi >= 0 && wi >= 0 && fi >= 0 && ri >= 0, "%s: blocks of chunk %d missing", what, g);
    if (bi < 0 || wi < 0 || fi < 0 || ri < 0) continue;
    const IrBlock *B = &m->blocks.a[bi], *W = &m->blocks.a[wi], *F = &m->blocks.a[fi], *R = &ref->blocks.a[ri];
    /* W talks to nobody; B keeps the messages and the forward's stash */
    CHECK(count_op(W, IR_OP_SEND) == 0 && count_op(W, IR_OP_RECV) == 0, "%s: %s has messages", what, wn);
    CHECK(count_op(B, IR_OP_SEND) == count_op(R, IR_OP_SEND) && count_op(B, IR_OP_RECV) == count_op(R, IR_OP_RECV) &&
          count_op(B, IR_OP_UNSTASH) == count_op(R, IR_OP_UNSTASH),
          "%s: %s's messages or unstashes differ from the unsplit block's", what, bn);
    /* every gradient accumulated once, all of them in W */
    CHECK(count_op(B, IR_OP_ACCUM) == 0, "%s: %s accumulates %d gradients (W's job)", what, bn, count_op(B, IR_OP_ACCUM));
    CHECK(count_op(W, IR_OP_ACCUM) == count_op(R, IR_OP_ACCUM), "%s: %s accumulates %d gradients, the unsplit block %d",
          what, wn, count_op(W, IR_OP_ACCUM), count_op(R, IR_OP_ACCUM));
    /* B -> W hand-overs: as many stashes in B as unstashes in W */
    CHECK(count_op(B, IR_OP_STASH) == count_op(W, IR_OP_UNSTASH), "%s: %s stashes %d values, %s unstashes %d", what, bn,
          count_op(B, IR_OP_STASH), wn, count_op(W, IR_OP_UNSTASH));
    /* no matmul lost or duplicated.  With a send (g > 0): a forward matmul of an activation by a weight (one
     * operand free: made of states only) has its input gradient in B and its weight gradient in W; one of two
     * activations (composed attention) has both its gradients in B */
    int mb = count_op(B, IR_OP_MATMUL), mw = count_op(W, IR_OP_MATMUL), mf = count_op(F, IR_OP_MATMUL), lin = 0;
    unsigned char *fr = ts_xcalloc((size_t)F->n + 1, 1);
    for (int i = 0; i < F->n; i++) {
      const IrNode *n = &F->nodes[i];
      fr[i] = n->op != IR_OP_RECV && n->op != IR_OP_INPUT && n->op != IR_OP_UNSTASH;
      for (int k = 0; k < n->nin; k++) fr[i] &= fr[n->in[k]];
      if (n->op == IR_OP_MATMUL) lin += fr[n->in[0]] != fr[n->in[1]];
    }
    free(fr);
    CHECK(mb + mw == count_op(R, IR_OP_MATMUL), "%s: chunk %d: %d + %d matmuls in B and W, %d unsplit", what, g, mb, mw,
          count_op(R, IR_OP_MATMUL));
    if (g > 0)
      CHECK(lin > 0 && mw == lin && mb == lin + 2 * (mf - lin), "%s: chunk %d: B %d, W %d matmuls; the forward has %d, "
            "%d of them by a weight", what, g, mb, mw, mf, lin);
    else CHECK(mb == 0, "%s: chunk 0 sends nothing back, yet B holds %d matmuls", what, mb);
    /* B is what its sends and its hand-overs to W need: nothing else but recvs and unstashes */
    unsigned char *sl = send_slice(B);
    for (int i = 0; i < B->n; i++) {
      IrOp op = B->nodes[i].op;
      CHECK(sl[i] || op == IR_OP_RECV || op == IR_OP_UNSTASH, "%s: %s node %d (%s) is needed neither by a send nor "
            "by W", what, bn, i, ir_ops[op].name);
    }
    free(sl);
    /* what B hands W per micro batch: less than without pulling reductions into B is measured in the report;
     * here: every value handed over is read in W */
    for (int i = 0; i < W->n; i++)
      if (W->nodes[i].op == IR_OP_UNSTASH) {
        int read = 0;
        for (int j = i + 1; j < W->n && !read; j++)
          for (int k = 0; k < W->nodes[j].nin; k++) read |= W->nodes[j].in[k] == i;
        CHECK(read, "%s: %s unstashes slot %lld and never reads it", what, wn, (long long)W->nodes[i].ia[0]);
      }
  }
  check_roundtrip(m, what);
  ir_module_free(ref);
  ir_module_free(m);
}

/* ---- the verifier on broken pipelines ---- */
static const char *head =
    "module v\n"
    "parallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=0\n"
    "state @w : f32[4] param init=ones\n";

static void verify_case(const char *body, const char *want, const char *what) {
  StrBuf b = {0};
  sb_puts(&b, head);
  sb_puts(&b, body);
  sb_puts(&b, "end\n");
  char err[1024] = "";
  IrModule *m = ir_parse_module(b.p, what, err, sizeof err);
  if (!want) CHECK(m != NULL, "%s: refused: %s", what, err);
  else CHECK(!m && strstr(err, want), "%s: want an error with '%s', got '%s'", what, want, m ? "(accepted)" : err);
  ir_module_free(m);
  sb_free(&b);
}

static void test_verifier(void) {
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n  send %0 axis=pp peer=1 tag=1\n}\n"
              "block fwd.1 {\n  %0 = recv axis=pp peer=-1 tag=0 : f32[4]\n  %1 = recv axis=pp peer=-1 tag=1 : f32[4]\n}\n",
              NULL, "good pair");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n}\n"
              "block fwd.1 {\n  %0 = recv axis=pp peer=-1 tag=1 : f32[4]\n}\n",
              "has no matching", "tags differ");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n  send %0 axis=pp peer=1 tag=1\n}\n"
              "block fwd.1 {\n  %0 = recv axis=pp peer=-1 tag=1 : f32[4]\n  %1 = recv axis=pp peer=-1 tag=0 : f32[4]\n}\n",
              "other order", "order");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n}\n"
              "block fwd.1 {\n  %0 = recv axis=pp peer=-1 tag=0 : f32[2, 2]\n}\n",
              "receives", "type");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=-1 tag=0\n}\n", "peer=-1", "direction");
  verify_case("block bwd.0 {\n  %0 = unstash slot=0 : f32[4]\n}\n", "no matching stash", "unstash alone");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n"
              "block bwd.0 {\n  %0 = unstash slot=0 : f32[2]\n}\n", "read as", "stash type");
  verify_case("block micro {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n", "outside a pipeline block", "stash in micro");
  verify_case("block eval.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n}\n"
              "block eval.1 {\n  %0 = recv axis=pp peer=-1 tag=0 : f32[4]\n}\n", NULL, "eval pair");
  verify_case("block eval.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=1 tag=0\n}\n"
              "block fwd.1 {\n  %0 = recv axis=pp peer=-1 tag=0 : f32[4]\n}\n",
              "not the neighbouring evaluation block", "eval to fwd");
  verify_case("block eval.0 {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n"
              "block bwd.0 {\n  %0 = unstash slot=0 : f32[4]\n}\n", "in an evaluation block", "stash in eval");
  verify_case("block eval.0 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=-1 tag=0\n}\n", "peer=-1", "eval direction");
  /* a split backward: B -> W slots; W has no messages; forward slots go to B */
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n"
              "block bwd.0 {\n  %0 = unstash slot=0 : f32[4]\n  stash %0 slot=1\n}\n"
              "block wgt.0 {\n  %0 = unstash slot=1 : f32[4]\n}\n", NULL, "B to W");
  verify_case("block fwd.0 {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n"
              "block wgt.0 {\n  %0 = unstash slot=0 : f32[4]\n}\n", "stashed in fwd.0 and unstashed in wgt.0",
              "forward slot read by W");
  verify_case("block wgt.0 {\n  %0 = state @w : f32[4]\n  stash %0 slot=0\n}\n"
              "block bwd.0 {\n  %0 = unstash slot=0 : f32[4]\n}\n", "belongs in a forward", "stash in W");
  verify_case("block wgt.1 {\n  %0 = state @w : f32[4]\n  send %0 axis=pp peer=-1 tag=0\n}\n"
              "block bwd.0 {\n  %0 = recv axis=pp peer=1 tag=0 : f32[4]\n}\n", "in a weight-gradient block",
              "send in W");
}

int main(void) {
  test_verifier();
  split_case("gpt", 4, 2, 1, 1, 0);
  split_case("gpt", 4, 4, 1, 1, 0);
  split_case("gpt", 4, 2, 2, 1, 0);
  split_case("gpt", 4, 2, 1, 2, 1);
  split_case("gpt", 8, 4, 2, 2, 0);
  split_case("llama", 4, 2, 1, 1, 0);
  split_case("llama", 4, 4, 1, 2, 1);
  split_case("llama", 4, 2, 2, 1, 0);
  wsplit_case("gpt", 4, 2, 1, 0);
  wsplit_case("gpt", 4, 4, 2, 1);
  wsplit_case("llama", 4, 2, 1, 0);
  wsplit_case("llama", 8, 4, 2, 1);
  return check_exit("test_pipe_split");
}
