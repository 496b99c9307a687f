/* pipesplit.c - the two passes that turn one training step into pipeline
 * stages (docs/pipeline.md, "Execution"):
 *
 *   partition (before autodiff): tags every forward node with the chunk
 *     pass_pipe_partition puts it in (IrNode.stage = ir_stage_tag(g, 0)).
 *     autodiff then tags backward nodes with their forward node's chunk and
 *     shard copies the tags to the nodes it emits.
 *   pipeline (after shard): cuts block "micro" into fwd.<g> and bwd.<g> for
 *     every global chunk g, joined by send/recv (between chunks) and
 *     stash/unstash (forward to backward of one chunk).
 *
 * Both do nothing when pp = 1.
 *
 * Placement.  A node is ANCHORED when it depends on a model input and on a
 * state; anchored nodes and effects go where their tag says.  Every other
 * node is FREE (a state read, an input, a mask made from the targets, the
 * broadcast of a gain) and is recomputed in every block that reads it,
 * so free values never travel.  A user of an anchored value is anchored
 * itself, so every value that crosses blocks is anchored and has a home
 * (chunk c, phase F or B).  Its readers may be:
 *   F(c') with c' >= c   forward messages across boundaries c..c'-1, each
 *                        chunk in between receiving and forwarding it;
 *   B(c') with c' >= c   received in F(c') as above (or local when c' = c),
 *                        stashed there, unstashed in B(c');
 *   B(c') with c' <= c   for a backward value: messages down the chunks.
 * Anything else (a forward value read by an earlier chunk's backward, a
 * backward value read by a forward block, a later chunk's backward reading
 * an earlier one's) cannot happen in a program autodiff made from a
 * partitioned forward pass; it is reported as an internal error naming the
 * nodes.
 *
 * Order inside a block: receives (sorted by the value's id in micro), then
 * unstashes (backward), the block's nodes in micro order, stashes, then
 * sends (sorted by id).  The receiver sorts the same way, so both ends of a
 * link agree on the order; tags are numbered in creation order. */
#include "pipe.h"
#include <stdarg.h>

/* ---------------- partition ---------------- */

int pass_partition(IrModule *m, PassCtx *cx) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  if (pp <= 1) return 0;
  int fb = ir_block_find(m, "forward");
  if (fb < 0) {
    snprintf(cx->err, sizeof cx->err, "partition: the module has no block \"forward\"");
    return -1;
  }
  PipeOptions po = {pp, m->par.vpp, cx->pp_layers, cx->pp_nlayers, cx->pp_layout, cx->pp_stack};
  PipePartition part;
  char err[1024];
  if (pass_pipe_partition(m, &po, &part, err, sizeof err) != 0) {
    snprintf(cx->err, sizeof cx->err, "partition: %s", err);
    return -1;
  }
  m->par.vpp = part.vpp;
  if (m->par.sched == IR_PIPE_NONE) m->par.sched = part.vpp > 1 ? IR_PIPE_INTERLEAVED : IR_PIPE_1F1B;
  IrBlock *b = &m->blocks.a[fb];
  for (int i = 0; i < b->n && i < part.nnodes; i++) {
    int u = part.node_unit[i], g = 0;
    while (g + 1 < part.nchunks && u >= part.chunk_begin[g + 1]) g++;
    b->nodes[i].stage = ir_stage_tag(g, 0);
  }
  pass_pipe_partition_free(&part);
  return 0;
}

/* ---------------- pipeline ---------------- */

typedef struct {
  IrModule *m;
  PassCtx *cx;
  IrBlock mb;            /* the sharded micro block (nodes stay in m's arena) */
  int K;                 /* chunks */
  unsigned char *anch;   /* per micro node: anchored */
  int *home;             /* per micro node: stage tag (anchored and effects), else 0 */
  /* per micro node (anchored, non-effect): the range of chunks it must reach */
  int *fhi;              /* F value: highest chunk of a reader (F or B); -1 none */
  int *blo;              /* B value: lowest chunk of a reader; -1 none */
  unsigned char *stash;  /* [n * K]: F value v stashed in chunk h */
  int *slot;             /* [n * K]: its slot */
  int *tagf, *tagb;      /* [n * K]: tag of v's message INTO fwd.h / bwd.h; -1 none */
  int *lmap;             /* per micro node: id in the block being built, -1 none */
  int nb;                /* the block being built */
  int tag;               /* its stage tag */
  int failed;
} Ps;

static int ps_fail(Ps *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int ps_fail(Ps *S, const char *fmt, ...) {
  if (S->failed) return -1;
  S->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(S->cx->err, sizeof S->cx->err, "pipeline: ");
  vsnprintf(S->cx->err + k, sizeof S->cx->err - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *where(int tag, char *buf, size_t n) {
  snprintf(buf, n, "%s.%d", ir_stage_is_bwd(tag) ? "bwd" : "fwd", ir_stage_chunk(tag));
  return buf;
}

/* Appends a copy of micro node `src` (operands already mapped into in[])
 * or a new node, keeping type, sharding and tag. */
static int emit_as(Ps *S, const IrNode *src, const int *in, int nin, int tag) {
  if (S->failed) return -1;
  char err[512];
  const IrType *typed = ir_op_given_type(src->op, &src->type);
  int id = ir_emit(S->m, S->nb, src->op, in, nin, src->ia, src->fa, src->sa, typed, err, sizeof err);
  if (id < 0) return ps_fail(S, "internal error: cannot emit %s: %s", ir_ops[src->op].name, err);
  IrNode *n = &S->m->blocks.a[S->nb].nodes[id];
  n->sh = src->sh;
  if (!(ir_ops[src->op].flags & OPF_EFFECT)) n->type = src->type;   /* keep dim names */
  n->stage = tag;
  n->why = src->why;
  return id;
}

static int emit_op(Ps *S, IrOp op, const int *in, int nin, const int64_t *ia, const IrNode *like, int tag) {
  if (S->failed) return -1;
  char err[512];
  const IrType *typed = ir_op_given_type(op, &like->type);
  int id = ir_emit(S->m, S->nb, op, in, nin, ia, NULL, NULL, typed, err, sizeof err);
  if (id < 0) return ps_fail(S, "internal error: cannot emit %s: %s", ir_ops[op].name, err);
  IrNode *n = &S->m->blocks.a[S->nb].nodes[id];
  if (!(ir_ops[op].flags & OPF_EFFECT)) n->sh = like->sh;
  n->stage = tag;
  if (op == IR_OP_SEND) {   /* the why of a pipeline message (mcc --report sharding) */
    char t[256], buf[512];
    snprintf(buf, sizeof buf, "pipeline: the %s value %s (%s) crosses from chunk %d to chunk %d, once per micro batch",
             ir_stage_is_bwd(tag) ? "backward" : "forward", ir_ops[like->op].name, ir_type_str(&like->type, t, sizeof t),
             ir_stage_chunk(tag), ir_stage_chunk(tag) + (ia[1] > 0 ? 1 : -1));
    n->why = ts_intern(buf);
  }
  return id;
}

/* The id of micro value v in the block being built: a free value is
 * recomputed here (with its free operands) on first use. */
static int use(Ps *S, int v) {
  if (S->lmap[v] >= 0) return S->lmap[v];
  const IrNode *n = &S->mb.nodes[v];
  if (S->anch[v]) {
    char b1[32];
    return ps_fail(S, "internal error: %%%d = %s (home %s) is read in block %s but was not brought there", v,
                   ir_ops[n->op].name, where(S->home[v], b1, sizeof b1), S->m->blocks.a[S->nb].name);
  }
  int in[64];
  if (n->nin > 64) return ps_fail(S, "internal error: %%%d has more than 64 operands", v);
  for (int k = 0; k < n->nin; k++)
    if ((in[k] = use(S, n->in[k])) < 0) return -1;
  return S->lmap[v] = emit_as(S, n, in, n->nin, S->tag);
}

/* Checks the edge u -> i (u anchored, i anchored or an effect) and records
 * what u must reach. */
static void edge(Ps *S, int u, int i) {
  int hu = S->home[u], hi = S->home[i];
  int cu = ir_stage_chunk(hu), ci = ir_stage_chunk(hi);
  int bu = ir_stage_is_bwd(hu), bi = ir_stage_is_bwd(hi);
  int ok = bu ? (bi && ci <= cu) : (ci >= cu);
  if (!ok) {
    char b1[32], b2[32];
    ps_fail(S, "internal error: %%%d = %s in %s reads %%%d = %s in %s, which the pipeline order cannot deliver", i,
            ir_ops[S->mb.nodes[i].op].name, where(hi, b1, sizeof b1), u, ir_ops[S->mb.nodes[u].op].name,
            where(hu, b2, sizeof b2));
    return;
  }
  if (!bu) {
    if (ci > S->fhi[u]) S->fhi[u] = ci;
    if (bi) S->stash[(size_t)u * S->K + ci] = 1;
  } else if (S->blo[u] < 0 || ci < S->blo[u]) {
    S->blo[u] = ci;
  }
}

/* Builds block fwd.<g> (bwd = 0) or bwd.<g> (bwd = 1). */
static void build_block(Ps *S, int g, int bwd) {
  char name[32];
  snprintf(name, sizeof name, "%s.%d", bwd ? "bwd" : "fwd", g);
  S->nb = ir_block_add(S->m, ts_intern(name));
  int n = S->mb.n, K = S->K;
  for (int v = 0; v < n; v++) S->lmap[v] = -1;
  int tag = S->tag = ir_stage_tag(g, bwd);
  /* receives */
  for (int v = 0; v < n && !S->failed; v++) {
    int t = bwd ? S->tagb[(size_t)v * K + g] : S->tagf[(size_t)v * K + g];
    if (t < 0) continue;
    int64_t ia[3] = {IR_AXIS_PP, bwd ? 1 : -1, t};
    S->lmap[v] = emit_op(S, IR_OP_RECV, NULL, 0, ia, &S->mb.nodes[v], tag);
  }
  /* unstashes */
  if (bwd)
    for (int v = 0; v < n && !S->failed; v++) {
      if (!S->stash[(size_t)v * K + g]) continue;
      int64_t ia[1] = {S->slot[(size_t)v * K + g]};
      S->lmap[v] = emit_op(S, IR_OP_UNSTASH, NULL, 0, ia, &S->mb.nodes[v], tag);
    }
  /* the block's own nodes */
  for (int i = 0; i < n && !S->failed; i++) {
    if (S->home[i] != tag) continue;
    const IrNode *nd = &S->mb.nodes[i];
    int in[64];
    if (nd->nin > 64) { ps_fail(S, "internal error: %%%d has more than 64 operands", i); return; }
    for (int k = 0; k < nd->nin; k++)
      if ((in[k] = use(S, nd->in[k])) < 0) return;
    S->lmap[i] = emit_as(S, &S->mb.nodes[i], in, nd->nin, tag);
  }
  /* stashes */
  if (!bwd)
    for (int v = 0; v < n && !S->failed; v++) {
      if (!S->stash[(size_t)v * K + g]) continue;
      int x = use(S, v);
      int64_t ia[1] = {S->slot[(size_t)v * K + g]};
      emit_op(S, IR_OP_STASH, &x, 1, ia, &S->mb.nodes[v], tag);
    }
  /* sends: what the neighbour receives */
  int nbr = bwd ? g - 1 : g + 1;
  if (nbr < 0 || nbr >= K) return;
  for (int v = 0; v < n && !S->failed; v++) {
    int t = bwd ? S->tagb[(size_t)v * K + nbr] : S->tagf[(size_t)v * K + nbr];
    if (t < 0) continue;
    int x = use(S, v);
    int64_t ia[3] = {IR_AXIS_PP, bwd ? -1 : 1, t};
    emit_op(S, IR_OP_SEND, &x, 1, ia, &S->mb.nodes[v], tag);
  }
}

int pass_pipe_split(IrModule *m, PassCtx *cx) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  if (pp <= 1) return 0;
  int bi = ir_block_find(m, "micro");
  if (bi < 0) {
    snprintf(cx->err, sizeof cx->err, "pipeline: the module has no block \"micro\" (run autodiff first)");
    return -1;
  }
  int vpp = m->par.vpp > 0 ? m->par.vpp : 1;
  Ps S = {0};
  S.m = m;
  S.cx = cx;
  S.mb = m->blocks.a[bi];
  S.K = pp * vpp;
  int n = S.mb.n, K = S.K;
  Arena *A = &cx->scratch;
  S.anch = arena_alloc(A, (size_t)n + 1);
  S.home = arena_alloc(A, ((size_t)n + 1) * sizeof *S.home);
  S.fhi = arena_alloc(A, ((size_t)n + 1) * sizeof *S.fhi);
  S.blo = arena_alloc(A, ((size_t)n + 1) * sizeof *S.blo);
  S.lmap = arena_alloc(A, ((size_t)n + 1) * sizeof *S.lmap);
  size_t nk = (size_t)n * (size_t)K + 1;
  S.stash = arena_alloc(A, nk);
  S.slot = arena_alloc(A, nk * sizeof *S.slot);
  S.tagf = arena_alloc(A, nk * sizeof *S.tagf);
  S.tagb = arena_alloc(A, nk * sizeof *S.tagb);
  memset(S.stash, 0, nk);
  for (size_t k = 0; k < nk; k++) S.tagf[k] = S.tagb[k] = S.slot[k] = -1;

  /* anchored: depends on an input and on a state */
  unsigned char *dep = arena_alloc(A, (size_t)n + 1);   /* bit 0: input, bit 1: state */
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &S.mb.nodes[i];
    dep[i] = nd->op == IR_OP_INPUT ? 1 : nd->op == IR_OP_STATE ? 2 : 0;
    for (int k = 0; k < nd->nin; k++) dep[i] |= dep[nd->in[k]];
    S.anch[i] = dep[i] == 3 && !(ir_ops[nd->op].flags & OPF_EFFECT);
    S.fhi[i] = S.blo[i] = -1;
    S.home[i] = 0;
    if (S.anch[i] || (ir_ops[nd->op].flags & OPF_EFFECT)) {
      int c = ir_stage_chunk(nd->stage);
      if (nd->stage <= 0 || c >= K) {
        return ps_fail(&S, "internal error: %%%d = %s has no pipeline stage (stage=%d, %d chunks)", i,
                       ir_ops[nd->op].name, nd->stage, K);
      }
      S.home[i] = nd->stage;
    }
  }
  for (int i = 0; i < n && !S.failed; i++) {
    if (!S.home[i]) continue;
    const IrNode *nd = &S.mb.nodes[i];
    for (int k = 0; k < nd->nin; k++)
      if (S.anch[nd->in[k]]) edge(&S, nd->in[k], i);
  }
  if (S.failed) return -1;
  /* messages and slots */
  int ntag = 0;
  for (int v = 0; v < n; v++) {
    if (!S.anch[v]) continue;
    int c = ir_stage_chunk(S.home[v]);
    if (!ir_stage_is_bwd(S.home[v])) {
      for (int h = c + 1; h <= S.fhi[v]; h++) S.tagf[(size_t)v * K + h] = 0;
    } else if (S.blo[v] >= 0) {
      for (int h = S.blo[v]; h < c; h++) S.tagb[(size_t)v * K + h] = 0;
    }
  }
  /* tags in creation order: forward boundaries up, then backward ones down */
  for (int h = 0; h < K; h++)
    for (int v = 0; v < n; v++)
      if (S.tagf[(size_t)v * K + h] == 0) S.tagf[(size_t)v * K + h] = ntag++ + 1;
  for (int h = K - 1; h >= 0; h--)
    for (int v = 0; v < n; v++)
      if (S.tagb[(size_t)v * K + h] == 0) S.tagb[(size_t)v * K + h] = ntag++ + 1;
  for (size_t k = 0; k + 1 < nk; k++) {   /* tags from 0 */
    if (S.tagf[k] > 0) S.tagf[k]--;
    if (S.tagb[k] > 0) S.tagb[k]--;
  }
  for (int h = 0; h < K; h++) {
    int ns = 0;
    for (int v = 0; v < n; v++)
      if (S.stash[(size_t)v * K + h]) S.slot[(size_t)v * K + h] = ns++;
  }
  for (int g = 0; g < K && !S.failed; g++) build_block(&S, g, 0);
  for (int g = K - 1; g >= 0 && !S.failed; g--) build_block(&S, g, 1);
  if (S.failed) return -1;
  /* drop "micro" (its nodes stay in the arena until the module is freed) */
  memmove(&m->blocks.a[bi], &m->blocks.a[bi + 1], (size_t)(m->blocks.n - bi - 1) * sizeof *m->blocks.a);
  m->blocks.n--;
  return 0;
}
