/* evalblock.c - pass "eval": a forward-only block for validation, derived
 * from the training block, so that mrun can evaluate the loss without
 * running (and then undoing) a backward pass and gradient accumulation.
 *
 * Expects: a module after the optimizer: block "micro" (autodiff's forward,
 *   backward and accumulation into the gradient states, possibly sharded
 *   and rematerialized).  A module without "micro" (a pipeline module,
 *   whose training blocks are fwd.<g> / bwd.<g>) is left unchanged: the
 *   runtime refuses evaluation there with a message.
 * Guarantees: a block "eval" (replacing one of that name) holding, in
 *   micro's order, the nodes that micro's OUTPUT nodes (the loss and the
 *   model's metric() values) transitively use, the OUTPUT nodes, and every
 *   INPUT node (the block's interface is the same as micro's, as pass dce
 *   keeps it); nothing else, so no accum, no other effect and no gradient
 *   state is touched.  DROPOUT is evaluated as the identity (every use of
 *   a dropout node reads its operand instead): evaluation is deterministic
 *   and sees the whole network, as in Megatron, where model.eval() turns
 *   dropout off.  Operand ids are renumbered; operand arrays are new
 *   (micro's are shared with other blocks' copies and never edited).
 *
 * Why slice micro rather than copy "forward" before autodiff: the passes
 * after autodiff (shard, remat) rewrite micro into each rank's local
 * program with its collectives; the slice inherits all of that, so the
 * evaluation of every tp / sp / cp / ep layout is the training forward
 * itself.  Collectives are value nodes: every rank of a group runs the
 * same program, so all of them drop the same ones. */
#include "passes.h"

int pass_eval(IrModule *m, PassCtx *cx) {
  int mi = ir_block_find(m, "micro");
  if (mi < 0) return 0;
  int old = ir_block_find(m, "eval");
  if (old >= 0) {   /* a recompiled module: derived again from micro */
    memmove(&m->blocks.a[old], &m->blocks.a[old + 1], (size_t)(m->blocks.n - old - 1) * sizeof *m->blocks.a);
    m->blocks.n--;
    mi = ir_block_find(m, "micro");
  }
  int n = m->blocks.a[mi].n;
  if (n == 0) return 0;
  unsigned char *live = arena_alloc(&cx->scratch, (size_t)n);
  int *alias = arena_alloc(&cx->scratch, (size_t)n * sizeof *alias);   /* dropout -> what it reads */
  int *newid = arena_alloc(&cx->scratch, (size_t)n * sizeof *newid);
  const IrNode *src = m->blocks.a[mi].nodes;
  for (int i = 0; i < n; i++) {
    alias[i] = i;
    if (src[i].op == IR_OP_DROPOUT && src[i].nin == 1) alias[i] = alias[src[i].in[0]];
  }
  for (int i = n - 1; i >= 0; i--) {   /* uses come after defs: one backward sweep */
    const IrNode *nd = &src[i];
    if (nd->op == IR_OP_OUTPUT || nd->op == IR_OP_INPUT) live[i] = 1;
    if (!live[i]) continue;
    if (alias[i] != i) { live[alias[i]] = 1; live[i] = 0; continue; }   /* a dropout: its operand instead */
    for (int k = 0; k < nd->nin; k++) live[alias[nd->in[k]]] = 1;
  }
  for (int i = 0; i < n; i++)
    if (live[i] && (ir_ops[src[i].op].flags & OPF_EFFECT) && src[i].op != IR_OP_OUTPUT) {
      /* an effect an output depends on cannot be (effects have no value) */
      snprintf(cx->err, sizeof cx->err, "eval: node %%%d (%s) of block micro is an effect the outputs use", i,
               ir_ops[src[i].op].name);
      return -1;
    }
  int kept = 0;
  for (int i = 0; i < n; i++) kept += live[i];
  int eb = ir_block_add(m, "eval");
  IrBlock *b = &m->blocks.a[eb];
  src = m->blocks.a[ir_block_find(m, "micro")].nodes;   /* the block array may have moved */
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
    nd.group = 0;   /* pass fuse groups this block on its own */
    newid[i] = b->n;
    b->nodes[b->n++] = nd;
  }
  return 0;
}
