/* groups.c - which nodes of a block run as one launch (groups.h).  The
 * fusion pass forms its groups by these rules and the executors read them
 * back with the same code, so what mcc plans and what mrun runs cannot
 * disagree. */
#include "plan/groups.h"
#include "codegen/cg.h"
#include <limits.h>
#include <string.h>

int plan_kernel_node_ok(const IrModule *m, const IrBlock *b, int i) {
  (void)m;
  const IrNode *n = &b->nodes[i];
  if (!cg_op_lowerable(n->op) || n->type.dtype == IR_VOID) return 0;
  /* the kernels use local indices: a causal mask over a split row or
   * column dim needs the rank's global offsets (the reference has them) */
  if (n->op == IR_OP_CAUSAL_MASK && n->type.rank >= 2 &&
      (n->sh.split[n->type.rank - 1] || n->sh.split[n->type.rank - 2]))
    return 0;
  /* likewise dropout: its mask hashes global indices, the kernel has the
   * local ones, equal only when no dim is split */
  if (n->op == IR_OP_DROPOUT || n->op == IR_OP_RAND)
    for (int d = 0; d < n->type.rank; d++)
      if (n->sh.split[d]) return 0;
  /* and arange, whose values are the global indices along its axis */
  if (n->op == IR_OP_ARANGE && n->ia[0] >= 0 && n->ia[0] < n->type.rank && n->sh.split[n->ia[0]]) return 0;
  /* a row op over a last dim split across ranks is an error the reference
   * kernel reports; leave it to it */
  if (cg_op_is_row(n->op) && n->nin > 0) {
    const IrNode *x = &b->nodes[n->in[0]];
    if (x->type.rank >= 1 && x->sh.split[x->type.rank - 1]) return 0;
  }
  return 1;
}

/* ---- GEMM bias epilogues ---- */

int plan_epilogue_match(const IrBlock *b, int a, PlanEpilogue *e) {
  memset(e, 0, sizeof *e);
  if (a < 0 || a >= b->n) return 0;
  const IrNode *add = &b->nodes[a];
  IrDtype dt = add->type.dtype;
  if (add->op != IR_OP_ADD || add->nin != 2 || (dt != IR_F32 && dt != IR_F64)) return 0;
  for (int side = 0; side < 2; side++) {
    int bc = add->in[side], x = add->in[1 - side];
    const IrNode *bn = &b->nodes[bc];
    if (bn->op != IR_OP_BROADCAST || bn->type.dtype != dt || !ir_type_same_shape(&bn->type, &add->type)) continue;
    /* the matmul, seen through reshapes (same bytes, row-major) */
    int nr = 0, ok = 1;
    while (b->nodes[x].op == IR_OP_RESHAPE && b->nodes[x].nin == 1) {
      if (nr == PLAN_EPILOGUE_MAX_RESHAPES || b->nodes[x].type.dtype != dt) { ok = 0; break; }
      e->reshape[nr++] = x;
      x = b->nodes[x].in[0];
    }
    const IrNode *mm = &b->nodes[x];
    if (!ok || mm->op != IR_OP_MATMUL || mm->type.dtype != dt || ir_type_numel(&mm->type) != ir_type_numel(&add->type))
      continue;
    /* reshapes were collected add-side first: store them ascending */
    for (int i = 0; i < nr / 2; i++) { int t = e->reshape[i]; e->reshape[i] = e->reshape[nr - 1 - i]; e->reshape[nr - 1 - i] = t; }
    e->matmul = x;
    e->bias = bc;
    e->add = a;
    e->nreshape = nr;
    return 1;
  }
  memset(e, 0, sizeof *e);
  return 0;
}

int plan_epilogue_members(const PlanEpilogue *e, int *mem) {
  int n = 0;
  mem[n++] = e->matmul;
  for (int i = 0; i < e->nreshape; i++) mem[n++] = e->reshape[i];
  mem[n++] = e->bias;
  mem[n++] = e->add;
  /* ascending (the broadcast may stand anywhere before the add) */
  for (int a = 1; a < n; a++)
    for (int c = a; c > 0 && mem[c - 1] > mem[c]; c--) { int t = mem[c]; mem[c] = mem[c - 1]; mem[c - 1] = t; }
  return n;
}

/* ---- optimizer step runs ---- */

/* Can the generated multi-tensor step take node i (adamw, sgd, lion,
 * lr_step; node-level facts, the executor also checks the states)? */
static int opt_ok(const IrBlock *b, const IrNode *n) {
  int nmom, nkey, nin = cg_opt_step_layout(n->op, &nmom, &nkey);
  if (nin == 0 || n->nin != nin) return 0;
  const IrNode *gr = &b->nodes[n->in[nin - 1]];
  if (gr->type.dtype != IR_F32 && gr->type.dtype != IR_F64) return 0;
  if (nin == 1) return 1;
  const IrNode *coef = &b->nodes[n->in[0]];
  return ir_dtype_is_float(coef->type.dtype) && ir_type_numel(&coef->type) == 1;
}

/* The same op, dtypes and constant attributes (adamw's b1, b2, eps ...,
 * baked into the kernel: cg_opt_step_layout; lr, wd and the rest come per
 * tensor). */
static int opt_same_key(const IrBlock *b, const IrNode *x, const IrNode *y) {
  int nmom, nkey;
  if (x->op != y->op || x->nin != y->nin) return 0;
  cg_opt_step_layout(x->op, &nmom, &nkey);
  for (int k = 0; k < x->nin; k++)
    if (b->nodes[x->in[k]].type.dtype != b->nodes[y->in[k]].type.dtype) return 0;
  return memcmp(x->fa, y->fa, (size_t)nkey * sizeof x->fa[0]) == 0;
}

/* Does node n refer to a state in `written` (a STATE node of it, an
 * operand that is one, or a state attribute)? */
static int touches_written(const IrBlock *b, const IrNode *n, const unsigned char *written, int nst) {
#define W(s) ((s) >= 0 && (s) < nst && written[(s)])
  if (n->op == IR_OP_STATE && W(n->ia[0])) return 1;
  for (int k = 0; k < n->nin; k++) {
    const IrNode *o = &b->nodes[n->in[k]];
    if (o->op == IR_OP_STATE && W(o->ia[0])) return 1;
  }
  for (int s = 0; s < IR_MAX_IATTR; s++)
    if (ir_op_iattr_is_state(n->op, s) && W(n->ia[s])) return 1;
#undef W
  return 0;
}

int plan_opt_runs(const IrBlock *b, int *run_at) {
  int n = b->n, nst = 0, runs = 0;
  for (int i = 0; i < n; i++) {
    run_at[i] = -1;
    const IrNode *nd = &b->nodes[i];
    for (int s = 0; s < IR_MAX_IATTR; s++)
      if ((ir_op_iattr_is_state(nd->op, s) || (s == 0 && nd->op == IR_OP_STATE)) && nd->ia[s] >= nst)
        nst = (int)nd->ia[s] + 1;
  }
  unsigned char *written = ts_xcalloc((size_t)(nst ? nst : 1), 1);
  int first = -1, last = -1;   /* the open run: its first and last adamw */
#define CLOSE()                                                              do {                                                                         if (first >= 0) {                                                            for (int j = first; j <= last; j++)                                          if (run_at[j] == -2) run_at[j] = last;                                   memset(written, 0, (size_t)(nst ? nst : 1));                               runs++;                                                                  }                                                                          first = last = -1;                                                       } while (0)
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[i];
    if (opt_ok(b, nd)) {
      if (first >= 0 && (!opt_same_key(b, nd, &b->nodes[first]) || touches_written(b, nd, written, nst))) CLOSE();
      if (first < 0) first = i;
      last = i;
      run_at[i] = -2;   /* in the open run */
      int nmom, nkey;
      cg_opt_step_layout(nd->op, &nmom, &nkey);
      for (int s = 0; s < 1 + nmom; s++)
        if (nd->ia[s] >= 0 && nd->ia[s] < nst) written[nd->ia[s]] = 1;
      continue;
    }
    /* Between two steps of a run, the launch happens later than the
     * original order says: nothing may write state there (an operand
     * could be a state read in place), nor read what the run wrote. */
    if (first >= 0 && ((ir_ops[nd->op].flags & OPF_EFFECT) || touches_written(b, nd, written, nst))) CLOSE();
  }
  CLOSE();
#undef CLOSE
  free(written);
  return runs;
}

/* ---- the parts of one attention's backward ---- */

static int same_attention(const IrNode *a, const IrNode *c) {
  if (a->nin < 5 || a->nin > 7 || c->nin != a->nin || a->ia[0] != c->ia[0] || a->ia[2] != c->ia[2] ||
      a->ia[3] != c->ia[3] || a->fa[0] != c->fa[0])
    return 0;
  for (int k = 0; k < a->nin; k++)   /* (q, k, v, o, do[, slope][, doc]) */
    if (a->in[k] != c->in[k]) return 0;
  return 1;
}

int plan_attn_grad_runs(const IrBlock *b, int *run_at) {
  int n = b->n, runs = 0;
  for (int i = 0; i < n; i++) run_at[i] = -1;
  for (int i = 0; i < n; i++) {
    const IrNode *a = &b->nodes[i];
    if (a->op != IR_OP_ATTENTION_BWD || run_at[i] != -1 || a->ia[1] < 0 || a->ia[1] > 2) continue;
    int mem[3] = {i, -1, -1}, cnt = 1, seen = 1 << a->ia[1];
    for (int j = i + 1; j < n && cnt < 3; j++) {
      const IrNode *c = &b->nodes[j];
      if (c->op == IR_OP_ATTENTION_BWD && run_at[j] == -1 && c->ia[1] >= 0 && c->ia[1] <= 2 &&
          !(seen & (1 << c->ia[1])) && same_attention(a, c)) {
        mem[cnt++] = j;
        seen |= 1 << c->ia[1];
      }
    }
    if (cnt < 2) continue;
    int last = mem[cnt - 1], ok = 1;
    for (int k = 0; k < a->nin && ok; k++) ok = b->nodes[a->in[k]].op != IR_OP_STATE;
    /* the earlier parts are computed at the last: nothing may read them before */
    for (int u = i + 1; u < last && ok; u++) {
      const IrNode *x = &b->nodes[u];
      for (int k = 0; k < x->nin && ok; k++)
        for (int q = 0; q < cnt - 1; q++)
          if (x->in[k] == mem[q]) ok = 0;
    }
    if (!ok) continue;
    for (int q = 0; q < cnt; q++) run_at[mem[q]] = last;
    runs++;
  }
  return runs;
}

/* ---- gradients made straight into their state ---- */

int plan_accum_direct_runs(const IrBlock *b, int *run_at) {
  int n = b->n, runs = 0;
  int *uses = ts_xcalloc((size_t)(n ? n : 1), sizeof *uses);
  for (int i = 0; i < n; i++) {
    run_at[i] = -1;
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (b->nodes[i].in[k] >= 0 && b->nodes[i].in[k] < n) uses[b->nodes[i].in[k]]++;
  }
  for (int a = 0; a < n; a++) {
    const IrNode *acc = &b->nodes[a];
    if (acc->op != IR_OP_ACCUM || acc->nin != 1 || acc->group > 0) continue;
    IrDtype dt = b->nodes[acc->in[0]].type.dtype;
    if (dt != IR_F32 && dt != IR_F64) continue;
    int mem[PLAN_EPILOGUE_MAX_RESHAPES + 2], cnt = 0, x = acc->in[0], ok = 1;
    while (ok && b->nodes[x].op == IR_OP_RESHAPE && b->nodes[x].nin == 1) {
      ok = cnt < PLAN_EPILOGUE_MAX_RESHAPES && uses[x] == 1 && b->nodes[x].group == 0 && b->nodes[x].type.dtype == dt;
      mem[cnt++] = x;
      x = b->nodes[x].in[0];
    }
    const IrNode *mm = &b->nodes[x];
    if (!ok || (mm->op != IR_OP_MATMUL && mm->op != IR_OP_EMBEDDING_BWD) || mm->nin != 2 || uses[x] != 1 ||
        mm->group > 0 || mm->type.dtype != dt || ir_type_numel(&mm->type) != ir_type_numel(&b->nodes[acc->in[0]].type))
      continue;
    const IrNode *A = &b->nodes[mm->in[0]], *B = &b->nodes[mm->in[1]];
    if (mm->op == IR_OP_MATMUL) {
      /* operands of its dtype, or (OPF_MIXED) two 16-bit ones into an f32 state */
      int ab_ok = A->type.dtype == B->type.dtype &&
                  (A->type.dtype == dt || (ir_dtype_is_16(A->type.dtype) && dt == IR_F32));
      if (A->type.rank != 2 || B->type.rank != 2 || !ab_ok) continue;
      int64_t M = mm->ia[0] ? A->type.dim[1] : A->type.dim[0], K = mm->ia[0] ? A->type.dim[0] : A->type.dim[1];
      int64_t N = mm->ia[1] ? B->type.dim[0] : B->type.dim[1];
      if (M > INT_MAX || N > INT_MAX || K > INT_MAX) continue;
    }
    int state_operand = A->op == IR_OP_STATE || B->op == IR_OP_STATE;
    for (int u = x + 1; u < a && state_operand && ok; u++)
      if (ir_ops[b->nodes[u].op].flags & OPF_EFFECT) ok = 0;
    if (!ok) continue;
    run_at[x] = a;
    for (int r = 0; r < cnt; r++) run_at[mem[r]] = a;
    run_at[a] = a;
    runs++;
  }
  free(uses);
  return runs;
}
