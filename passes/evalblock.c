/* evalblock.c - pass "eval": forward-only blocks for validation, derived
 * from the training blocks, so that mrun can evaluate the loss without
 * running (and then undoing) a backward pass and gradient accumulation.
 *
 * Expects: a module after the optimizer: block "micro" (autodiff's forward,
 *   backward and accumulation into the gradient states, possibly sharded
 *   and rematerialized), or, with pp > 1, the pipeline blocks fwd.<g> /
 *   bwd.<g> of every global chunk g (pass pipeline) instead of micro.
 * Guarantees, without pp: a block "eval" (replacing one of that name)
 *   holding, in micro's order, the nodes that micro's OUTPUT nodes (the
 *   loss and the model's metric() values) transitively use, the OUTPUT
 *   nodes, and every INPUT node (the block's interface is the same as
 *   micro's, as pass dce keeps it); nothing else, so no accum, no other
 *   effect and no gradient state is touched.
 * With pp > 1: a block eval.<g> per fwd.<g> (replacing old ones), sliced
 *   the same way from fwd.<g>, whose roots are also the sends another
 *   evaluation block needs: a send is kept when its receive in eval.<g+1>
 *   is used there, so the chunks are sliced from the last to the first.
 *   The stashes go (nothing runs a backward), and with them whatever only
 *   the backward needed, messages included.  The kept sends and receives
 *   get tags of their own (old tag + 1 + the module's largest tag), so the
 *   evaluation's messages pair eval.<g> with eval.<g+1> only, in the same
 *   order on each link as the forward blocks' (the verifier checks both).
 * In both, DROPOUT is evaluated as the identity (every use of a dropout
 *   node reads its operand instead): evaluation is deterministic and sees
 *   the whole network, as in Megatron, where model.eval() turns dropout
 *   off.  Operand ids are renumbered; operand arrays are new (the source
 *   block's are shared with other blocks' copies and never edited).
 *
 * Why slice the training blocks rather than copy "forward" before
 * autodiff: the passes after autodiff (shard, remat, pipeline) rewrite the
 * step into each rank's local program with its collectives and messages;
 * the slice inherits all of that, so the evaluation of every tp / sp / cp /
 * ep / pp layout is the training forward itself.  Collectives are value
 * nodes: every rank of a group runs the same program, so all of them drop
 * the same ones. */
#include "passes.h"

/* Removes every block for which drop(name) holds (a recompiled module:
 * the evaluation blocks are derived again). */
static void drop_blocks(IrModule *m, int (*drop)(const IrBlock *)) {
  int nb = 0;
  for (int bi = 0; bi < m->blocks.n; bi++)
    if (!drop(&m->blocks.a[bi])) m->blocks.a[nb++] = m->blocks.a[bi];
  m->blocks.n = nb;
}
static int is_eval(const IrBlock *b) { return strcmp(b->name, "eval") == 0; }
static int is_eval_chunk(const IrBlock *b) {
  IrChunkKind k;
  return ir_block_chunk_kind(b, &k) >= 0 && k == IR_CHUNK_EVAL;
}

/* The slice of block src (n nodes) whose roots are set in live[] on entry:
 * on return live[i] says node i is kept, alias[i] the node a use of i
 * reads (a dropout's operand, transitively).  STASH nodes are never kept
 * (not roots, and nothing reads an effect).  0, or -1 with cx->err when
 * a kept node is an effect other than OUTPUT and SEND. */
static int slice_mark(const IrBlock *src, unsigned char *live, int *alias, PassCtx *cx) {
  const IrNode *nd = src->nodes;
  for (int i = 0; i < src->n; i++) {
    alias[i] = i;
    if (nd[i].op == IR_OP_DROPOUT && nd[i].nin == 1) alias[i] = alias[nd[i].in[0]];
  }
  for (int i = src->n - 1; i >= 0; i--) {   /* uses come after defs: one backward sweep */
    if (!live[i]) continue;
    if (alias[i] != i) { live[alias[i]] = 1; live[i] = 0; continue; }   /* a dropout: its operand instead */
    for (int k = 0; k < nd[i].nin; k++) live[alias[nd[i].in[k]]] = 1;
  }
  for (int i = 0; i < src->n; i++)
    if (live[i] && (ir_ops[nd[i].op].flags & OPF_EFFECT) && nd[i].op != IR_OP_OUTPUT && nd[i].op != IR_OP_SEND) {
      /* an effect an output depends on cannot be (effects have no value) */
      snprintf(cx->err, sizeof cx->err, "eval: node %%%d (%s) of block %s is an effect the outputs use", i,
               ir_ops[nd[i].op].name, src->name);
      return -1;
    }
  return 0;
}

/* Appends block `name` holding the nodes of block si that live[] keeps, in
 * order, operands through alias[]; sends and receives get tag + tag_shift. */
static void slice_emit(IrModule *m, int si, const char *name, const unsigned char *live, const int *alias,
                       int64_t tag_shift, PassCtx *cx) {
  int n = m->blocks.a[si].n, kept = 0;
  for (int i = 0; i < n; i++) kept += live[i];
  int *newid = arena_alloc(&cx->scratch, (size_t)(n ? n : 1) * sizeof *newid);
  int eb = ir_block_add(m, name);
  IrBlock *b = &m->blocks.a[eb];
  const IrNode *src = m->blocks.a[si].nodes;   /* the block array may have moved */
  b->cap = kept ? kept : 1;
  b->nodes = arena_alloc(&m->arena, (size_t)b->cap * sizeof *b->nodes);
  b->n = 0;
  for (int i = 0; i < n; i++) {
    newid[i] = -1;
    if (!live[i]) continue;
    IrNode nd = src[i];
    if (nd.nin > 0) {
      nd.in = arena_alloc(&m->arena, (size_t)nd.nin * sizeof *nd.in);
      for (int k = 0; k < nd.nin; k++) {
        nd.in[k] = newid[alias[src[i].in[k]]];
        TS_ASSERT(nd.in[k] >= 0);
      }
    }
    if (nd.op == IR_OP_SEND || nd.op == IR_OP_RECV) nd.ia[2] += tag_shift;
    nd.group = 0;   /* pass fuse groups this block on its own */
    newid[i] = b->n;
    b->nodes[b->n++] = nd;
  }
}

/* Without pp: "eval" from "micro". */
static int eval_micro(IrModule *m, PassCtx *cx) {
  drop_blocks(m, is_eval);
  int mi = ir_block_find(m, "micro");
  const IrBlock *src = &m->blocks.a[mi];
  int n = src->n;
  if (n == 0) return 0;
  unsigned char *live = arena_alloc(&cx->scratch, (size_t)n);
  int *alias = arena_alloc(&cx->scratch, (size_t)n * sizeof *alias);
  for (int i = 0; i < n; i++) live[i] = src->nodes[i].op == IR_OP_OUTPUT || src->nodes[i].op == IR_OP_INPUT;
  if (slice_mark(src, live, alias, cx) != 0) return -1;
  slice_emit(m, mi, "eval", live, alias, 0, cx);
  return 0;
}

/* With pp: eval.<g> from fwd.<g> for every chunk g. */
static int eval_chunks(IrModule *m, PassCtx *cx) {
  drop_blocks(m, is_eval_chunk);
  int K = 0;
  int64_t maxtag = -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int bwd, g = ir_block_chunk(b, &bwd);
    if (g >= 0 && g + 1 > K) K = g + 1;
    for (int i = 0; i < b->n; i++)
      if ((b->nodes[i].op == IR_OP_SEND || b->nodes[i].op == IR_OP_RECV) && b->nodes[i].ia[2] > maxtag)
        maxtag = b->nodes[i].ia[2];
  }
  int *fb = arena_alloc(&cx->scratch, (size_t)(K ? K : 1) * sizeof *fb);
  unsigned char **live = arena_alloc(&cx->scratch, (size_t)(K ? K : 1) * sizeof *live);
  int **alias = arena_alloc(&cx->scratch, (size_t)(K ? K : 1) * sizeof *alias);
  /* used_tag[t]: the receive with tag t is kept in its evaluation block */
  unsigned char *used_tag = arena_alloc(&cx->scratch, (size_t)maxtag + 2);
  memset(used_tag, 0, (size_t)maxtag + 2);
  for (int g = K - 1; g >= 0; g--) {   /* a send is needed when its receiver, one chunk on, uses the value */
    char name[32];
    snprintf(name, sizeof name, "fwd.%d", g);
    if ((fb[g] = ir_block_find(m, name)) < 0) {
      snprintf(cx->err, sizeof cx->err, "eval: the pipeline module has no block %s (chunks 0 .. %d)", name, K - 1);
      return -1;
    }
    const IrBlock *src = &m->blocks.a[fb[g]];
    int n = src->n;
    live[g] = arena_alloc(&cx->scratch, (size_t)(n ? n : 1));
    alias[g] = arena_alloc(&cx->scratch, (size_t)(n ? n : 1) * sizeof *alias[g]);
    for (int i = 0; i < n; i++) {
      const IrNode *nd = &src->nodes[i];
      live[g][i] = nd->op == IR_OP_OUTPUT || nd->op == IR_OP_INPUT ||
                   (nd->op == IR_OP_SEND && nd->ia[2] >= 0 && nd->ia[2] <= maxtag && used_tag[nd->ia[2]]);
    }
    if (slice_mark(src, live[g], alias[g], cx) != 0) return -1;
    for (int i = 0; i < n; i++)
      if (live[g][i] && src->nodes[i].op == IR_OP_RECV && src->nodes[i].ia[2] >= 0) used_tag[src->nodes[i].ia[2]] = 1;
  }
  if (maxtag + 1 + maxtag > (1 << 24)) {
    snprintf(cx->err, sizeof cx->err, "eval: %lld pipeline messages leave no room for the evaluation's own tags",
             (long long)maxtag + 1);
    return -1;
  }
  for (int g = 0; g < K; g++) {
    char name[32];
    snprintf(name, sizeof name, "eval.%d", g);
    slice_emit(m, fb[g], name, live[g], alias[g], maxtag + 1, cx);
  }
  return 0;
}

int pass_eval(IrModule *m, PassCtx *cx) {
  if (ir_block_find(m, "micro") >= 0) return eval_micro(m, cx);
  int any_chunk = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrChunkKind k;
    any_chunk |= ir_block_chunk_kind(&m->blocks.a[bi], &k) >= 0 && k == IR_CHUNK_FWD;
  }
  return any_chunk ? eval_chunks(m, cx) : 0;   /* neither: a module without training blocks, left as it is */
}
