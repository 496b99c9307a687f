/* fuse.c - the fusion pass: marks groups of nodes that run as ONE kernel
 * (IrNode.group), following what the code generator can lower
 * (cg_lower_group, codegen/cg.h): chains of elementwise ops, layout ops
 * reading outside values, row ops over the last axis (softmax, norms,
 * cross-entropy and their backward forms), trailing reductions.
 *
 * Expects: a verified module after dce; no node has a group yet (any
 *   existing groups are cleared and formed again).
 * Guarantees, per block (greedy and deterministic, in node order):
 *   - every group has >= 2 members and is accepted by cg_lower_group (the
 *     pass asks the lowering itself, so the two can never disagree);
 *   - a group runs at the position of its LAST member: no node outside a
 *     group uses one of its values before that last member (a group is
 *     closed as soon as an outside node uses its values), and every
 *     operand a member reads from outside is an earlier value;
 *   - matmuls, collectives, effects, dropout, rope, embeddings and AdamW
 *     are never in a group (cg_op_lowerable refuses them), nor are nodes
 *     whose result depends on the rank's mesh coordinates in a way the
 *     kernels do not model (pass_fuse_node_ok);
 *   - group numbers are 1, 2, ... per block in order of their first member.
 * Values used only inside their group are then not materialized
 * (ir_value_materialized): the executor gives them no buffer.
 * `--no-fuse` (PassCtx.no_fuse) leaves every group 0. */
#include "passes.h"
#include "../codegen/cg.h"

/* Limits that keep kernels cheap: a lowered group recomputes producer
 * chains inside every loop over a row (statistics loops of each row op),
 * so long chains with many row ops would multiply work. */
enum { FUSE_MAX_NODES = 48, FUSE_MAX_ROWOPS = 3 };

int pass_fuse_node_ok(const IrModule *m, const IrBlock *b, int i) {
  (void)m;
  const IrNode *n = &b->nodes[i];
  if (!cg_op_lowerable(n->op) || n->type.dtype == IR_VOID) return 0;
  /* the kernels use local indices: a causal mask over a split row or
   * column dim needs the rank's global offsets (the reference has them) */
  if (n->op == IR_OP_CAUSAL_MASK && n->type.rank >= 2 &&
      (n->sh.split[n->type.rank - 1] || n->sh.split[n->type.rank - 2]))
    return 0;
  /* a row op over a last dim split across ranks is an error the reference
   * kernel reports; leave it to it */
  if (cg_op_is_row(n->op) && n->nin > 0) {
    const IrNode *x = &b->nodes[n->in[0]];
    if (x->type.rank >= 1 && x->sh.split[x->type.rank - 1]) return 0;
  }
  return 1;
}

typedef struct {
  VEC(int) mem;     /* member node ids, ascending */
  int closed;       /* an outside node used a value: no more members */
  int rowops;
  int reads_state;  /* a member reads a state node directly */
} FGroup;

/* Does cg_lower_group accept nodes[0..n)? */
static int lowers(const IrModule *m, const IrBlock *b, const int *nodes, int n) {
  CgGroupIO io;
  char err[256];
  CgKernel *k = cg_lower_group(m, b, nodes, n, &io, err, sizeof err);
  if (!k) return 0;
  cg_kernel_free(k);
  return 1;
}

/* Ascending union of the members of groups gs[0..ng) plus node i (i is
 * larger than every member) into out; returns the count. */
static int union_with(FGroup *G, const int *gs, int ng, int i, int *out) {
  int n = 0;
  for (int k = 0; k < ng; k++)
    for (int j = 0; j < G[gs[k]].mem.n; j++) out[n++] = G[gs[k]].mem.a[j];
  /* insertion sort: groups are small */
  for (int a = 1; a < n; a++)
    for (int c = a; c > 0 && out[c - 1] > out[c]; c--) { int t = out[c]; out[c] = out[c - 1]; out[c - 1] = t; }
  out[n++] = i;
  return n;
}

static int fuse_block(const IrModule *m, IrBlock *b) {
  int *gof = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *gof);   /* node -> group index or -1 */
  VEC(FGroup) G = {0};
  int cand[FUSE_MAX_NODES * 4 + 1];
  for (int i = 0; i < b->n; i++) {
    IrNode *n = &b->nodes[i];
    gof[i] = -1;
    /* the open groups among i's operands, most recent first */
    int gs[8], ng = 0;
    for (int k = 0; k < n->nin; k++) {
      int g = gof[n->in[k]];
      if (g < 0 || G.a[g].closed) continue;
      int dup = 0;
      for (int j = 0; j < ng; j++) dup |= gs[j] == g;
      if (!dup && ng < 8) gs[ng++] = g;
    }
    for (int a = 1; a < ng; a++)
      for (int c = a; c > 0 && gs[c - 1] < gs[c]; c--) { int t = gs[c]; gs[c] = gs[c - 1]; gs[c - 1] = t; }
    /* An effect writes state; a group reading state runs its kernel at
     * its last member, so it must not straddle a write to what it read. */
    if (ir_ops[n->op].flags & OPF_EFFECT)
      for (int g = 0; g < G.n; g++)
        if (G.a[g].reads_state) G.a[g].closed = 1;
    int joined = -1;
    if (pass_fuse_node_ok(m, b, i)) {
      /* first all of them merged through i, then each alone */
      for (int tryk = 0; tryk <= ng && joined < 0 && ng > 0; tryk++) {
        const int *sel = tryk == 0 ? gs : &gs[tryk - 1];
        int nsel = tryk == 0 ? ng : 1;
        if (tryk == 1 && ng == 1) break;   /* same as the first try */
        int total = 1, rows = cg_op_is_row(n->op);
        for (int j = 0; j < nsel; j++) { total += G.a[sel[j]].mem.n; rows += G.a[sel[j]].rowops; }
        if (total > FUSE_MAX_NODES || rows > FUSE_MAX_ROWOPS) continue;
        int cnt = union_with(G.a, sel, nsel, i, cand);
        if (!lowers(m, b, cand, cnt)) continue;
        /* accepted: the first selected group absorbs the others and i */
        int into = sel[0];
        FGroup *d = &G.a[into];
        d->mem.n = 0;
        for (int j = 0; j < cnt; j++) { VEC_PUSH(d->mem, cand[j]); gof[cand[j]] = into; }
        d->rowops = rows;
        for (int j = 1; j < nsel; j++) d->reads_state |= G.a[sel[j]].reads_state;
        for (int j = 1; j < nsel; j++) { G.a[sel[j]].mem.n = 0; G.a[sel[j]].closed = 1; }
        joined = into;
      }
      if (joined < 0) {   /* start a group of its own (members may join later) */
        FGroup g = {0};
        VEC_PUSH(g.mem, i);
        g.rowops = cg_op_is_row(n->op);
        VEC_PUSH(G, g);
        joined = gof[i] = G.n - 1;
      }
    }
    if (gof[i] >= 0)
      for (int k = 0; k < n->nin; k++)
        if (b->nodes[n->in[k]].op == IR_OP_STATE) G.a[gof[i]].reads_state = 1;
    /* i uses the values of the groups it did not join: they are closed,
     * since a later member would run after i, which needs them now */
    for (int k = 0; k < n->nin; k++) {
      int g = gof[n->in[k]];
      if (g >= 0 && g != joined) G.a[g].closed = 1;
    }
  }
  /* number the groups of 2 or more in order of their first member */
  int next = 0;
  int *num = ts_xcalloc((size_t)(G.n ? G.n : 1), sizeof *num);
  for (int i = 0; i < b->n; i++) {
    int g = gof[i];
    b->nodes[i].group = 0;
    if (g < 0 || G.a[g].mem.n < 2) continue;
    if (!num[g]) num[g] = ++next;
    b->nodes[i].group = num[g];
  }
  for (int g = 0; g < G.n; g++) free(G.a[g].mem.a);
  free(G.a);
  free(num);
  free(gof);
  return next;
}

int pass_fuse(IrModule *m, PassCtx *cx) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrBlock *b = &m->blocks.a[bi];
    if (cx->no_fuse) {
      for (int i = 0; i < b->n; i++) b->nodes[i].group = 0;
      continue;
    }
    fuse_block(m, b);
  }
  return 0;
}
