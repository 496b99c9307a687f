/* wsplit.c - pass "wsplit": with --schedule zb-h1 (Qi et al. 2023, "Zero
 * Bubble Pipeline Parallelism"), every pipeline backward block bwd.<g> is
 * cut in two (docs/pipeline.md, "Zero bubble"):
 *
 *   B = bwd.<g>  the input-gradient part: the nodes the block's sends need
 *                (the gradient the previous chunk waits for), transitively,
 *                plus every recv and unstash (its messages and its stash
 *                stay where the schedule's B step expects them);
 *   W = wgt.<g>  the weight-gradient part: every other effect (the accums
 *                into grad.* states) and every other anchored node.
 *
 * It is a dependency slice over what autodiff (then shard, remat and
 * pipeline) produced: nothing here knows what a layer or a weight is.  A
 * value of B that W reads crosses by `stash slot=k` at the end of bwd.<g>
 * and `unstash slot=k` at the start of wgt.<g>, slots numbered after the
 * forward's (so a slot still names one (chunk, micro, slot) pair); the
 * runtime keeps it from B until W runs, and `mcc --report memory` counts
 * it (the "kept for W" rows).  A FREE value (one that reads no recv and no
 * unstash: a state read, an input, a constant, the broadcast of a weight)
 * is recomputed in W instead, as pass pipeline recomputes free values in
 * every block that reads them; so is a reshape, permute or broadcast of a
 * value of B (from its operand, handed over instead): a view of a value
 * and the value itself would otherwise both be kept, the second a copy
 * (tests/pipe_split counts the bytes).
 *
 * Expects: pass pipeline's blocks (pp > 1); m->par.sched says the
 * schedule.  Guarantees: with zb-h1, for every chunk g, bwd.<g> holds no
 * accum that its sends do not need and wgt.<g> exists (possibly with
 * nothing but unstashes) and holds no send or recv; every node of the old
 * bwd.<g> is in exactly one of them (free values possibly in both).  With
 * any other schedule, or pp = 1, nothing changes. */
#include "passes.h"

typedef struct {
  IrModule *m;
  PassCtx *cx;
  IrBlock ob;             /* the old bwd.<g> (its nodes stay in m's arena) */
  unsigned char *anch;    /* per old node: reads a recv or an unstash (transitively) */
  unsigned char *rw;      /* per old node: a layout op of B's that W recomputes (from its operand) */
  unsigned char *pulled;  /* per old node: moved into B by pull_reductions: 2 a reduction (handed to W),
                             1 what it reads (W recomputes it if it needs it) */
  int *lmap;              /* per old node: its id in the block being built, -1 none */
  int nb;                 /* the block being built */
  int failed;
} Ws;

static int ws_fail(Ws *S, const char *msg, const IrNode *n, const char *err) {
  if (S->failed) return -1;
  S->failed = 1;
  snprintf(S->cx->err, sizeof S->cx->err, "wsplit: internal error in %s: %s %s: %s", S->ob.name, msg,
           n ? ir_ops[n->op].name : "", err ? err : "");
  return -1;
}

/* Appends a copy of old node `src` with operands in[] (already mapped). */
static int ws_copy(Ws *S, const IrNode *src, const int *in) {
  if (S->failed) return -1;
  char err[512];
  const IrType *typed = ir_op_given_type(src->op, &src->type);
  int id = ir_emit(S->m, S->nb, src->op, in, src->nin, src->ia, src->fa, src->sa, typed, err, sizeof err);
  if (id < 0) return ws_fail(S, "cannot emit", src, err);
  IrNode *n = &S->m->blocks.a[S->nb].nodes[id];
  n->sh = src->sh;
  if (!(ir_ops[src->op].flags & OPF_EFFECT)) n->type = src->type;   /* keep dim names */
  n->stage = src->stage;
  n->why = src->why;
  return id;
}

/* A stash (x = the value's id in the block, slot) or an unstash of a value
 * shaped like `like`. */
static int ws_slot(Ws *S, IrOp op, int x, int64_t slot, const IrNode *like) {
  if (S->failed) return -1;
  char err[512];
  int64_t ia[1] = {slot};
  const IrType *typed = ir_op_given_type(op, &like->type);
  int id = ir_emit(S->m, S->nb, op, op == IR_OP_STASH ? &x : NULL, op == IR_OP_STASH, ia, NULL, NULL, typed, err,
                   sizeof err);
  if (id < 0) return ws_fail(S, "cannot emit", like, err);
  IrNode *n = &S->m->blocks.a[S->nb].nodes[id];
  if (op == IR_OP_UNSTASH) {
    n->sh = like->sh;
    n->type = like->type;
  }
  n->stage = like->stage;
  return id;
}

/* The id of old value v in the block being built: a free value is
 * recomputed (with its free operands) on first use. */
static int ws_use(Ws *S, int v) {
  if (S->lmap[v] >= 0) return S->lmap[v];
  const IrNode *n = &S->ob.nodes[v];
  if (S->anch[v] && !S->rw[v]) return ws_fail(S, "a value of B was not handed to W:", n, "");
  int in[64];
  if (n->nin > 64) return ws_fail(S, "more than 64 operands:", n, "");
  for (int k = 0; k < n->nin; k++)
    if ((in[k] = ws_use(S, n->in[k])) < 0) return -1;
  return S->lmap[v] = ws_copy(S, n, in);
}

static int ws_emit(Ws *S, int i) {
  const IrNode *nd = &S->ob.nodes[i];
  int in[64];
  if (nd->nin > 64) return ws_fail(S, "more than 64 operands:", nd, "");
  for (int k = 0; k < nd->nin; k++)
    if ((in[k] = ws_use(S, nd->in[k])) < 0) return -1;
  return S->lmap[i] = ws_copy(S, nd, in);
}

static int is_layout(IrOp op) { return op == IR_OP_RESHAPE || op == IR_OP_PERMUTE || op == IR_OP_BROADCAST; }

/* W reads value v of B: hand it over (tow), or, for a layout op, recompute
 * it in W from what its operand needs. */
static void need_in_w(Ws *S, const unsigned char *inb, unsigned char *tow, int v) {
  const IrNode *n = &S->ob.nodes[v];
  if (!inb[v] || !S->anch[v] || S->rw[v]) return;   /* W's own, free (recomputed), or done */
  if ((is_layout(n->op) && n->nin == 1) || S->pulled[v] == 1) {
    S->rw[v] = 1;
    for (int k = 0; k < n->nin; k++) need_in_w(S, inb, tow, n->in[k]);
  } else {
    tow[v] = 1;
  }
}

static size_t node_bytes(const IrNode *n) { return (size_t)ir_type_numel(&n->type) * ir_dtype_size(n->type.dtype); }

/* What W reads of B under the split inb: tow (handed over) and S->rw
 * (layout ops W recomputes), recomputed from scratch; returns the bytes
 * handed over per micro batch. */
static size_t handed_bytes(Ws *S, const unsigned char *inb, unsigned char *tow) {
  int n = S->ob.n;
  memset(tow, 0, (size_t)n + 1);
  memset(S->rw, 0, (size_t)n + 1);
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &S->ob.nodes[i];
    if (inb[i] || !(S->anch[i] || (ir_ops[nd->op].flags & OPF_EFFECT))) continue;
    for (int k = 0; k < nd->nin; k++) need_in_w(S, inb, tow, nd->in[k]);
  }
  size_t by = 0;
  for (int v = 0; v < n; v++)
    if (tow[v]) by += node_bytes(&S->ob.nodes[v]);
  return by;
}

/* Moves cheap reductions into B where that hands W fewer bytes: a layer
 * norm's gain gradient sum_to(mul(d, xhat)) and its bias gradient
 * sum_to(d) read in W keep the [s, b, h] gradient d for them; computed in
 * B, only the [h] results cross.  A root is a value outside B, no matmul
 * (W keeps the GEMMs), smaller than half its largest operand, all of whose
 * anchored inputs B has or can compute the same way (candidates); the
 * roots move with their candidate ancestors, all together (a gradient is
 * released only when all its reductions moved), and only when the bytes
 * handed over drop.  W recomputes a moved ancestor it reads itself (as it
 * recomputes free values) rather than have it handed over. */
static void pull_reductions(Ws *S, unsigned char *inb, unsigned char *tow) {
  int n = S->ob.n;
  unsigned char *cand = ts_xcalloc((size_t)n + 1, 1), *save = ts_xmalloc((size_t)n + 1);
  int *stack = ts_xmalloc(((size_t)n + 1) * sizeof *stack);
  size_t before = handed_bytes(S, inb, tow);
  memcpy(save, inb, (size_t)n + 1);
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &S->ob.nodes[i];
    if (inb[i] || !S->anch[i] || (ir_ops[nd->op].flags & OPF_EFFECT) || nd->op == IR_OP_MATMUL) continue;
    int ok = 1;
    size_t big = 0;
    for (int k = 0; k < nd->nin && ok; k++) {
      int v = nd->in[k];
      if (!S->anch[v]) continue;
      ok = save[v] || cand[v];
      if (node_bytes(&S->ob.nodes[v]) > big) big = node_bytes(&S->ob.nodes[v]);
    }
    if (!ok) continue;
    cand[i] = 1;
    if (2 * node_bytes(nd) > big) continue;       /* not a reduction: a candidate, no root */
    int sp = 0;
    stack[sp++] = i;
    S->pulled[i] = 2;
    while (sp) {                                  /* the root and its candidate ancestors into B */
      int v = stack[--sp];
      if (inb[v]) continue;
      inb[v] = 1;
      if (!S->pulled[v]) S->pulled[v] = 1;
      for (int k = 0; k < S->ob.nodes[v].nin; k++)
        if (cand[S->ob.nodes[v].in[k]] && !inb[S->ob.nodes[v].in[k]]) stack[sp++] = S->ob.nodes[v].in[k];
    }
  }
  if (handed_bytes(S, inb, tow) >= before) {      /* no better: as it was */
    memcpy(inb, save, (size_t)n + 1);
    memset(S->pulled, 0, (size_t)n + 1);
  }
  free(cand);
  free(save);
  free(stack);
}

/* The largest stash slot of chunk g's forward block, + 1. */
static int64_t first_free_slot(const IrModule *m, int g) {
  char name[32];
  snprintf(name, sizeof name, "fwd.%d", g);
  int fb = ir_block_find(m, name);
  int64_t next = 0;
  for (int i = 0; fb >= 0 && i < m->blocks.a[fb].n; i++) {
    const IrNode *n = &m->blocks.a[fb].nodes[i];
    if (n->op == IR_OP_STASH && n->ia[0] + 1 > next) next = n->ia[0] + 1;
  }
  return next;
}

/* Splits block bi (bwd.<g>) into a new B block (returned in *nb_b) and W
 * block (*nb_w), both appended to m. */
static int split_block(IrModule *m, PassCtx *cx, int bi, int g, int *nb_b, int *nb_w) {
  Ws S = {0};
  S.m = m;
  S.cx = cx;
  S.ob = m->blocks.a[bi];
  int n = S.ob.n;
  Arena *A = &cx->scratch;
  S.anch = arena_alloc(A, (size_t)n + 1);
  S.lmap = arena_alloc(A, ((size_t)n + 1) * sizeof *S.lmap);
  S.rw = arena_alloc(A, (size_t)n + 1);
  memset(S.rw, 0, (size_t)n + 1);
  S.pulled = arena_alloc(A, (size_t)n + 1);
  memset(S.pulled, 0, (size_t)n + 1);
  unsigned char *inb = arena_alloc(A, (size_t)n + 1);   /* B's slice */
  unsigned char *tow = arena_alloc(A, (size_t)n + 1);   /* anchored B value that W reads */
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &S.ob.nodes[i];
    S.anch[i] = nd->op == IR_OP_RECV || nd->op == IR_OP_UNSTASH;
    for (int k = 0; k < nd->nin; k++) S.anch[i] |= S.anch[nd->in[k]];
    if (ir_ops[nd->op].flags & OPF_EFFECT) S.anch[i] = 0;
    inb[i] = nd->op == IR_OP_SEND || nd->op == IR_OP_RECV || nd->op == IR_OP_UNSTASH;
    tow[i] = 0;
  }
  for (int i = n - 1; i >= 0; i--)
    if (inb[i])
      for (int k = 0; k < S.ob.nodes[i].nin; k++) inb[S.ob.nodes[i].in[k]] = 1;
  pull_reductions(&S, inb, tow);
  handed_bytes(&S, inb, tow);
  int64_t slot0 = first_free_slot(m, g);
  char name[32];

  /* B: its slice in order, the hand-overs to W, then the sends */
  *nb_b = S.nb = ir_block_add(m, S.ob.name);
  for (int i = 0; i < n; i++) S.lmap[i] = -1;
  for (int i = 0; i < n && !S.failed; i++)
    if (inb[i] && S.anch[i] && S.ob.nodes[i].op != IR_OP_SEND) ws_emit(&S, i);
    else if (inb[i] && S.ob.nodes[i].op != IR_OP_SEND && (ir_ops[S.ob.nodes[i].op].flags & OPF_EFFECT)) ws_emit(&S, i);
  int64_t slot = slot0;
  for (int v = 0; v < n && !S.failed; v++)
    if (tow[v]) ws_slot(&S, IR_OP_STASH, ws_use(&S, v), slot++, &S.ob.nodes[v]);
  for (int i = 0; i < n && !S.failed; i++)
    if (S.ob.nodes[i].op == IR_OP_SEND) ws_emit(&S, i);

  /* W: the hand-overs, then its nodes in order */
  snprintf(name, sizeof name, "wgt.%d", g);
  *nb_w = S.nb = ir_block_add(m, ts_intern(name));
  for (int i = 0; i < n; i++) S.lmap[i] = -1;
  slot = slot0;
  for (int v = 0; v < n && !S.failed; v++)
    if (tow[v]) S.lmap[v] = ws_slot(&S, IR_OP_UNSTASH, -1, slot++, &S.ob.nodes[v]);
  for (int i = 0; i < n && !S.failed; i++) {
    const IrNode *nd = &S.ob.nodes[i];
    if (!inb[i] && (S.anch[i] || (ir_ops[nd->op].flags & OPF_EFFECT))) ws_emit(&S, i);
  }
  return S.failed ? -1 : 0;
}

int pass_wsplit(IrModule *m, PassCtx *cx) {
  if (ir_axis_size(m, IR_AXIS_PP) <= 1 || m->par.sched != IR_PIPE_ZBH1) return 0;
  int nold = m->blocks.n;
  for (int bi = 0; bi < nold; bi++) {
    IrChunkKind kind;
    int g = ir_block_chunk_kind(&m->blocks.a[bi], &kind);
    if (g < 0 || kind != IR_CHUNK_BWD) continue;
    int nb_b, nb_w;
    if (split_block(m, cx, bi, g, &nb_b, &nb_w) != 0) return -1;
  }
  /* the blocks in their old order, each bwd.<g> replaced by its B and
   * followed by its W (the new blocks were appended in that order) */
  int total = m->blocks.n, at = nold;
  IrBlock *nbl = arena_alloc(&cx->scratch, (size_t)total * sizeof *nbl);
  int k = 0;
  for (int bi = 0; bi < nold; bi++) {
    IrChunkKind kind;
    int g = ir_block_chunk_kind(&m->blocks.a[bi], &kind);
    if (g >= 0 && kind == IR_CHUNK_BWD) {
      nbl[k++] = m->blocks.a[at++];
      nbl[k++] = m->blocks.a[at++];
    } else {
      nbl[k++] = m->blocks.a[bi];
    }
  }
  memcpy(m->blocks.a, nbl, (size_t)k * sizeof *nbl);
  m->blocks.n = k;
  return 0;
}
