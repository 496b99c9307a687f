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
 *   - matmuls, collectives, effects, rope, embeddings and AdamW
 *     are never in a group (cg_op_lowerable refuses them), nor are nodes
 *     whose result depends on the rank's mesh coordinates in a way the
 *     kernels do not model (plan_kernel_node_ok);
 *   - group numbers are 1, 2, ... per block in order of their first member.
 * Values used only inside their group are then not materialized
 * (ir_value_materialized): the executor gives them no buffer.
 *
 * GEMM bias epilogues.  Before the greedy walk, every `x @ W + b` -- an
 * add of a broadcast (the bias) and a matmul, possibly seen through
 * reshapes (q/k/v: [B, T, H*D] -> [B, T, H, D]), each used only by the
 * next -- becomes a group of its own: matmul, reshapes, broadcast, add
 * (the add last, its only output).  The executor runs it as one BLAS call
 * with beta = 1 into the add's buffer pre-filled with the broadcast bias
 * (C = A.B + C; runtime/exec/exec_gemm.c).  The code generator cannot lower such
 * a group (no matmul in the kernel IR); plan_epilogue_match
 * recognizes it, for the executor too.  The group is closed at once: what consumes the
 * add (gelu, a residual) starts its own group.
 *
 * `--no-fuse` (PassCtx.no_fuse) leaves every group 0. */
#include "passes.h"
#include "plan/groups.h"
#include "codegen/cg.h"

/* Limits that keep kernels cheap: a lowered group recomputes producer
 * chains inside every loop over a row (statistics loops of each row op),
 * so long chains with many row ops would multiply work. */
enum { FUSE_MAX_NODES = 48, FUSE_MAX_ROWOPS = 3 };
/* how far back an elementwise node looks for an open sibling group */
enum { FUSE_SIBLING_WINDOW = 8 };


/* Marks the epilogues of b: epi[i] = the add's id + 1 for every member of
 * one, else 0.  An epilogue counts only if its matmul, reshapes and
 * broadcast are used by nothing but the next member (the add is then the
 * group's only output) and no effect stands between its first member and
 * the add (the matmul reads a weight, often a state node, at the add). */
static void mark_epilogues(const IrBlock *b, int *epi) {
  int n = b->n;
  int *uses = ts_xcalloc((size_t)(n ? n : 1), sizeof *uses);
  for (int i = 0; i < n; i++) {
    epi[i] = 0;
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (b->nodes[i].in[k] >= 0 && b->nodes[i].in[k] < n) uses[b->nodes[i].in[k]]++;
  }
  for (int a = 0; a < n; a++) {
    PlanEpilogue e;
    if (!plan_epilogue_match(b, a, &e)) continue;
    int mem[PLAN_EPILOGUE_MAX_RESHAPES + 3], cnt = plan_epilogue_members(&e, mem), ok = 1;
    for (int j = 0; j < cnt - 1; j++) ok &= uses[mem[j]] == 1 && !epi[mem[j]];
    for (int u = mem[0] + 1; u < a && ok; u++) ok = !(ir_ops[b->nodes[u].op].flags & OPF_EFFECT);
    if (ok)
      for (int j = 0; j < cnt; j++) epi[mem[j]] = a + 1;
  }
  free(uses);
}


typedef struct {
  VEC(int) mem;     /* member node ids, ascending */
  int closed;       /* an outside node used a value: no more members */
  int rowops;
  int reads_state;  /* a member reads a state node directly */
} FGroup;

/* Does cg_lower_group accept nodes[0..n)?  (u: b's readers) */
static int lowers(const IrModule *m, const IrBlock *b, const CgUsers *u, const int *nodes, int n) {
  CgGroupIO io;
  char err[256];
  CgKernel *k = cg_lower_group_users(m, b, u, nodes, n, &io, err, sizeof err);
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
  int *epi = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *epi);   /* epilogue member: its add + 1 */
  mark_epilogues(b, epi);
  VEC(FGroup) G = {0};
  VEC(int) rs = {0};   /* groups that read state, not yet closed by an effect */
  CgUsers *users = cg_users_build(b);
  int cand[FUSE_MAX_NODES * 4 + 1];
  int loss = -1;   /* `output "loss"`: the forward ends there (autodiff's rule) */
  const char *lossname = ts_intern("loss");
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == lossname) loss = i;
  for (int i = 0; i < b->n; i++) {
    IrNode *n = &b->nodes[i];
    gof[i] = -1;
    if (epi[i]) {
      /* an epilogue member joins nothing else; at its add the group is
       * made, closed (its operands' groups close below, as for any node) */
      if (epi[i] == i + 1) {
        PlanEpilogue e;
        int mem[PLAN_EPILOGUE_MAX_RESHAPES + 3];
        plan_epilogue_match(b, i, &e);
        int cnt = plan_epilogue_members(&e, mem);
        FGroup g = {0};
        for (int j = 0; j < cnt; j++) VEC_PUSH(g.mem, mem[j]);
        g.closed = 1;
        VEC_PUSH(G, g);
        for (int j = 0; j < cnt; j++) gof[mem[j]] = G.n - 1;
      }
      for (int k = 0; k < n->nin; k++) {
        int g = gof[n->in[k]];
        if (g >= 0 && g != gof[i]) G.a[g].closed = 1;
      }
      continue;
    }
    /* the open groups among i's operands, most recent first */
    int gs[8], ng = 0;
    for (int k = 0; k < n->nin; k++) {
      int g = gof[n->in[k]];
      if (g < 0 || G.a[g].closed) continue;
      int dup = 0;
      for (int j = 0; j < ng; j++) dup |= gs[j] == g;
      if (!dup && ng < 8) gs[ng++] = g;
    }
    /* siblings: in the backward, an open elementwise group whose member
     * reads a value the forward kept that an elementwise i reads too (a
     * recomputation, pass remat, next to the backward of the same op): one
     * kernel reads it once and computes what both share once.  Only kept
     * values: two readers of a gradient fused this way would close the
     * group before the row op that would rather join one of them. */
    if (loss >= 0 && i > loss && !cg_op_is_row(n->op))
      for (int j = i - 1; j >= 0 && j >= i - FUSE_SIBLING_WINDOW && ng < 8; j--) {
        int g = gof[j];
        if (g < 0 || G.a[g].closed || G.a[g].rowops || epi[j]) continue;
        int shares = 0, dup = 0;
        for (int k = 0; k < n->nin; k++)
          for (int q = 0; q < b->nodes[j].nin; q++)
            shares |= b->nodes[j].in[q] == n->in[k] && n->in[k] < loss && gof[n->in[k]] != g &&
                      b->nodes[n->in[k]].op != IR_OP_STATE;
        for (int q = 0; q < ng; q++) dup |= gs[q] == g;
        if (shares && !dup) gs[ng++] = g;
      }
    for (int a = 1; a < ng; a++)
      for (int c = a; c > 0 && gs[c - 1] < gs[c]; c--) { int t = gs[c]; gs[c] = gs[c - 1]; gs[c - 1] = t; }
    /* An effect writes state; a group reading state runs its kernel at
     * its last member, so it must not straddle a write to what it read. */
    if (ir_ops[n->op].flags & OPF_EFFECT) {
      for (int k = 0; k < rs.n; k++) G.a[rs.a[k]].closed = 1;
      rs.n = 0;
    }
    int joined = -1;
    if (plan_kernel_node_ok(m, b, i)) {
      /* first all of them merged through i, then each alone */
      for (int tryk = 0; tryk <= ng && joined < 0 && ng > 0; tryk++) {
        const int *sel = tryk == 0 ? gs : &gs[tryk - 1];
        int nsel = tryk == 0 ? ng : 1;
        if (tryk == 1 && ng == 1) break;   /* same as the first try */
        int total = 1, rows = cg_op_is_row(n->op);
        for (int j = 0; j < nsel; j++) { total += G.a[sel[j]].mem.n; rows += G.a[sel[j]].rowops; }
        if (total > FUSE_MAX_NODES || rows > FUSE_MAX_ROWOPS) continue;
        int cnt = union_with(G.a, sel, nsel, i, cand);
        if (!lowers(m, b, users, cand, cnt)) continue;
        /* accepted: the first selected group absorbs the others and i */
        int into = sel[0];
        FGroup *d = &G.a[into];
        d->mem.n = 0;
        for (int j = 0; j < cnt; j++) { VEC_PUSH(d->mem, cand[j]); gof[cand[j]] = into; }
        d->rowops = rows;
        for (int j = 1; j < nsel && !d->reads_state; j++)
          if (G.a[sel[j]].reads_state) { d->reads_state = 1; VEC_PUSH(rs, into); }
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
      for (int k = 0; k < n->nin && !G.a[gof[i]].reads_state; k++)
        if (b->nodes[n->in[k]].op == IR_OP_STATE) { G.a[gof[i]].reads_state = 1; VEC_PUSH(rs, gof[i]); }
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
  free(rs.a);
  cg_users_free(users);
  free(num);
  free(gof);
  free(epi);
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
