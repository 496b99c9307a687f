/* remat.c - recomputes in the backward what is cheaper to compute again
 * than to keep: the values the forward would hold for the backward that a
 * memory-bound op (elementwise, per row, layout, reduction: what a
 * generated kernel computes) makes from values held anyway, and the
 * all-gathers of such values (sequence parallelism's gathered GEMM inputs:
 * the rank keeps its 1/t shard and gathers again, as Megatron does).
 *
 * In block "micro" the forward ends at `output "loss"` (autodiff's rule for
 * every model).  A value made before it and read after it is HELD: its
 * buffer lives across the whole backward of the layers after it.  Such a
 * value v is recomputed when it is CLONEABLE:
 *   - its op is cheap (codegen's cg_op_lowerable: no GEMM, no collective,
 *     no send or stash; dropout is left alone), or an all_gather (unless
 *     --keep-gathered: then the gathered copy is kept, which saves one
 *     all-gather per gathered GEMM input and holds t times its bytes), and
 *   - each operand is AVAILABLE in the backward at no extra memory: a state
 *     that no effect of the block writes, a held value (kept, or itself
 *     recomputed), or a cloneable value (recomputed on the way).
 * Then every read of v after the loss reads a clone instead, emitted (with
 * the clones it needs) just before the first such read, and v's forward
 * buffer dies at its last forward read.  Nothing new is held, so the bytes
 * live at the loss drop by v's buffer, and the peak of the backward never
 * grows: a clone lives from its first backward read to its last, a subset
 * of the original's span.
 *
 * What it finds in a transformer (nothing here knows one): layer norm's
 * normalized output, its affine output and the broadcasts of its gain are
 * recomputed from the kept input; the activation (GELU, SiLU) output from
 * its kept input; masks from the kept targets.  What stays: the inputs of
 * the GEMMs and of the ops whose backward needs them, and whatever only a
 * collective other than an all-gather or a GEMM makes.
 *
 * `--no-remat` (PassCtx.no_remat) turns it off, for comparisons;
 * `--keep-gathered` (PassCtx.keep_gathered) leaves the all-gathers alone.
 *
 * Expects: after shard (collectives are in place), before pipeline (a
 *   clone takes the stage tag of the backward node that first reads it).
 * Guarantees: the same numbers (a clone is the same op on the same
 *   operand values), operands earlier than their users, fusion groups
 *   cleared on the clones (fuse runs later). */
#include "passes.h"
#include "codegen/cg.h"

static int cheap(const IrNode *n, int regather) {
  if (n->op == IR_OP_ALL_GATHER) return regather;
  return cg_op_lowerable(n->op) && n->type.dtype != IR_VOID && n->op != IR_OP_DROPOUT &&
         !(ir_ops[n->op].flags & (OPF_EFFECT | OPF_LATE));
}

typedef struct {
  IrModule *m;
  IrBlock *b;          /* the block as it was (nodes read from here) */
  IrNode *out;         /* the new node array */
  int nout;
  int *map;            /* old id -> new id of the original */
  int *clone;          /* old id -> new id of its clone, -1 = none yet */
  const unsigned char *held, *remat;
  int loss;            /* old id of `output "loss"`: later nodes are the backward */
} Remat;

/* The value old id u has in the backward: its clone (made now if need be)
 * or the original.  stage: the tag of the backward node that asks. */
static int backward_value(Remat *r, int u, int stage) {
  const IrNode *nd = &r->b->nodes[u];
  if (u > r->loss || nd->op == IR_OP_STATE || (r->held[u] && !r->remat[u])) return r->map[u];
  if (r->clone[u] >= 0) return r->clone[u];
  int *in = nd->nin ? arena_alloc(&r->m->arena, (size_t)nd->nin * sizeof *in) : NULL;
  for (int k = 0; k < nd->nin; k++) in[k] = backward_value(r, nd->in[k], stage);
  IrNode c = *nd;
  c.in = in;
  c.group = 0;
  c.stage = stage;
  if (nd->op == IR_OP_ALL_GATHER) {   /* mcc --report sharding */
    char buf[1200];
    snprintf(buf, sizeof buf, "gathered again for the backward instead of held across it (pass remat; "
             "--keep-gathered keeps the copy): %s", nd->why ? nd->why : "");
    c.why = ts_intern(buf);
  }
  r->out[r->nout] = c;
  return r->clone[u] = r->nout++;
}

int pass_remat(IrModule *m, PassCtx *cx) {
  int bi = ir_block_find(m, "micro");
  if (bi < 0 || cx->no_remat) return 0;
  IrBlock *b = &m->blocks.a[bi];
  const char *lossname = ts_intern("loss");
  int L = -1, n = b->n;
  for (int i = 0; i < n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == lossname) L = i;
  if (L < 0) return 0;

  unsigned char *written = arena_alloc(&cx->scratch, (size_t)(m->states.n ? m->states.n : 1));
  ir_block_states_written(m, b, written);
  unsigned char *held = arena_alloc(&cx->scratch, (size_t)n), *avail = arena_alloc(&cx->scratch, (size_t)n),
                *remat = arena_alloc(&cx->scratch, (size_t)n);
  for (int i = L + 1; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (b->nodes[i].in[k] < L) held[b->nodes[i].in[k]] = 1;
  int nremat = 0;
  for (int v = 0; v < L; v++) {
    const IrNode *nd = &b->nodes[v];
    if (nd->op == IR_OP_STATE) {
      avail[v] = !written[nd->ia[0]];
      held[v] = 0;                               /* the slab, not the arena */
      continue;
    }
    int ok = cheap(nd, !cx->keep_gathered);
    for (int k = 0; k < nd->nin && ok; k++) ok = avail[nd->in[k]];
    remat[v] = ok && held[v];
    nremat += remat[v];
    avail[v] = held[v] || ok;
  }
  if (!nremat) return 0;

  /* rebuild: forward unchanged, clones inserted before their first reader */
  int cap = 2 * n;
  Remat r = {m, b, arena_alloc(&m->arena, (size_t)cap * sizeof(IrNode)), 0,
             arena_alloc(&cx->scratch, (size_t)n * sizeof(int)), arena_alloc(&cx->scratch, (size_t)n * sizeof(int)),
             held, remat, L};
  for (int i = 0; i < n; i++) r.clone[i] = -1;
  for (int i = 0; i < n; i++) {
    IrNode nd = b->nodes[i];
    if (nd.nin) {
      int *in = arena_alloc(&m->arena, (size_t)nd.nin * sizeof *in);
      for (int k = 0; k < nd.nin; k++) in[k] = i > L ? backward_value(&r, nd.in[k], nd.stage) : r.map[nd.in[k]];
      nd.in = in;
    }
    TS_ASSERT(r.nout < cap);
    r.map[i] = r.nout;
    r.out[r.nout++] = nd;
  }
  b->nodes = r.out;
  b->n = r.nout;
  b->cap = cap;
  return 0;
}
