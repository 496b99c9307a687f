/* dce.c - dead code elimination: drops value nodes whose result nothing
 * uses, in every block.
 *
 * Expects: a verified module (operands refer to earlier nodes of the same
 *   block; blocks are independent SSA scopes).
 * Guarantees: every effect (OPF_EFFECT: accum, zero, adamw, output) and
 *   every INPUT node is kept; so is everything they transitively use.
 *   So are RECV and UNSTASH, the other ends of a send and a stash.
 *   INPUT nodes count as roots because they are the block's interface:
 *   the runtime feeds inputs by name, and what it must feed should not
 *   depend on what an optimization found unused.  Surviving nodes keep
 *   their relative order; operand ids are renumbered to the new indices.
 *   States are never removed (they are the plan's persistent memory, and
 *   their order fixes checkpoint layout).
 * Node arrays are compacted in place; no allocation besides a scratch map. */
#include "passes.h"

/* Block b: [n] nodes -> [kept] nodes.  Returns the number removed. */
static int dce_block(IrBlock *b, PassCtx *cx) {
  if (b->n == 0) return 0;
  /* live[i]: node i is needed; newid[i]: its index after compaction. */
  int *newid = arena_alloc(&cx->scratch, (size_t)b->n * sizeof *newid);
  unsigned char *live = arena_alloc(&cx->scratch, (size_t)b->n);
  for (int i = b->n - 1; i >= 0; i--) {   /* uses come after defs: one backward sweep */
    const IrNode *n = &b->nodes[i];
    if ((ir_ops[n->op].flags & OPF_EFFECT) || n->op == IR_OP_INPUT || n->op == IR_OP_RECV || n->op == IR_OP_UNSTASH)
      live[i] = 1;
    if (!live[i]) continue;
    for (int k = 0; k < n->nin; k++) {
      TS_ASSERT(n->in[k] >= 0 && n->in[k] < i);
      live[n->in[k]] = 1;
    }
  }
  int kept = 0;
  for (int i = 0; i < b->n; i++) {
    if (!live[i]) { newid[i] = -1; continue; }
    IrNode n = b->nodes[i];
    for (int k = 0; k < n.nin; k++) {
      n.in[k] = newid[n.in[k]];     /* operand arrays are per node: rewrite in place */
      TS_ASSERT(n.in[k] >= 0);
    }
    newid[i] = kept;
    b->nodes[kept++] = n;
  }
  int removed = b->n - kept;
  b->n = kept;
  return removed;
}

int pass_dce(IrModule *m, PassCtx *cx) {
  for (int bi = 0; bi < m->blocks.n; bi++) dce_block(&m->blocks.a[bi], cx);
  return 0;
}
