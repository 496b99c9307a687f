/* verify.c - the IR verifier (CONVENTIONS §6), run between passes.
 *
 * Checks what a pass could have broken by editing nodes or states
 * directly instead of going through ir_emit: states well-formed with unique
 * names and grads/moments pointing at params; block names unique; in every
 * node, operands earlier in the block (SSA order), arity and attrs valid,
 * the stored result type equal in sizes and dtype to what the shape rule
 * computes (dim names may differ: passes may rename them); input and output
 * names unique per block; shardings well-formed (a mesh axis splits at most
 * one dim, or marks a partial sum, or a flat chunk), `state` and `accum`
 * nodes laid out like their state, and each collective's operand and
 * result layouts consistent with what it does (an all_gather over tp
 * along dim d takes a value split along d over tp and returns one that is
 * not, ...).  Stops at the first problem. */
#include "ir.h"
#include <stdarg.h>

static int sh_well_formed(const IrSharding *sh, int rank) {
  unsigned seen = 0;
  for (int d = 0; d < IR_MAX_RANK; d++) {
    if (!sh->split[d]) continue;
    if (d >= rank || (seen & sh->split[d])) return 0;
    seen |= sh->split[d];
  }
  if ((seen & sh->partial) || (seen & sh->flat) || (sh->partial & sh->flat)) return 0;
  return ((seen | sh->partial | sh->flat) >> IR_AXIS_COUNT) == 0;
}

static int verify_states(const IrModule *m, char *err, size_t errlen) {
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
    if (!s->name || !*s->name) return ts_errf(err, errlen, "state %d has no name", i);
    for (int j = 0; j < i; j++)
      if (m->states.a[j].name == s->name) return ts_errf(err, errlen, "state @%s defined twice", s->name);
    const IrType *t = &s->type;
    int ok = t->dtype != IR_VOID && (int)t->dtype >= 0 && t->dtype < IR_DTYPE_COUNT &&
             t->rank >= 0 && t->rank <= IR_MAX_RANK;
    for (int d = 0; ok && d < t->rank; d++)
      if (t->dim[d] < 1) ok = 0;
    if (!ok) return ts_errf(err, errlen, "state @%s has a malformed type", s->name);
    if (!sh_well_formed(&s->sh, t->rank)) return ts_errf(err, errlen, "state @%s has a malformed sharding", s->name);
    if ((int)s->kind < 0 || s->kind >= IR_STATE_KIND_COUNT)
      return ts_errf(err, errlen, "state @%s has a bad kind %d", s->name, (int)s->kind);
    if (s->kind == IR_STATE_PARAM) {
      if ((int)s->init < 0 || s->init >= IR_INIT_KIND_COUNT)
        return ts_errf(err, errlen, "param @%s has a bad init kind %d", s->name, (int)s->init);
      if (s->of != -1) return ts_errf(err, errlen, "param @%s has of=%d (must be -1)", s->name, s->of);
    } else {
      if (s->of < 0 || s->of >= m->states.n || m->states.a[s->of].kind != IR_STATE_PARAM)
        return ts_errf(err, errlen, "%s @%s: of=%d is not a param", ir_state_kind_name(s->kind), s->name, s->of);
    }
  }
  return 0;
}

/* Equal layouts, except that either may be a partial sum over dp: dp is
 * not a tensor sharding (docs/sharding.md), a gradient state is summed
 * over dp ranks by the update block whatever its annotation says. */
static int same_but_dp(const IrSharding *a, const IrSharding *b) {
  IrSharding x = *a, y = *b;
  x.partial &= (uint8_t)~(1u << IR_AXIS_DP);
  y.partial &= (uint8_t)~(1u << IR_AXIS_DP);
  return ir_sharding_equal(&x, &y);
}

/* Collective ops against their operand's layout; NULL if consistent. */
static const char *collective_problem(const IrNode *n, const IrSharding *in) {
  unsigned a = 1u << (n->ia[0] & 7);
  const IrSharding *out = &n->sh;
  int d = (int)n->ia[1];
  switch (n->op) {
  case IR_OP_ALL_REDUCE:
    if (n->ia[1] == 0 && !(in->partial & a)) return "all_reduce (sum) of a value that is not a partial sum over its axis";
    if ((out->partial & a)) return "all_reduce result is still partial over its axis";
    return NULL;
  case IR_OP_ALL_GATHER:
    if (!(in->split[d] & a)) return "all_gather of a value that is not split along its dim over its axis";
    if (out->split[d] & a) return "all_gather result is still split over its axis";
    return NULL;
  case IR_OP_REDUCE_SCATTER:
    if (!(in->partial & a)) return "reduce_scatter of a value that is not a partial sum over its axis";
    if (!(out->split[d] & a) || (out->partial & a)) return "reduce_scatter result is not split along its dim over its axis";
    return NULL;
  case IR_OP_SHARD_SLICE:
    if (in->partial & a) return "shard_slice of a partial sum";
    for (int k = 0; k < IR_MAX_RANK; k++)
      if (in->split[k] & a) return "shard_slice of a value already split over its axis";
    if (!(out->split[d] & a)) return "shard_slice result is not split along its dim over its axis";
    return NULL;
  default:
    return NULL;
  }
}

/* Name of node id for messages: "%12 = matmul" or "node 3: adamw". */
static void node_label(const IrNode *n, int id, char *buf, size_t len) {
  int ok = (int)n->op >= 0 && n->op < IR_OP_COUNT;
  if (ok && (ir_ops[n->op].flags & OPF_EFFECT)) snprintf(buf, len, "node %d: %s", id, ir_ops[n->op].name);
  else snprintf(buf, len, "%%%d = %s", id, ok ? ir_ops[n->op].name : "?");
}

/* Fusion groups (IrNode.group > 0, passes/fuse.c): a group runs as one
 * kernel at the position of its LAST member, so it must be convex in
 * execution order: no node outside the group may use a group value before
 * that last member (it would read a value not computed yet).  Members
 * have results (effects never fuse).  Whether codegen can lower a group is
 * codegen's check (the executor falls back to the reference kernels). */
static int verify_groups(const IrBlock *b, char *err, size_t errlen) {
  int maxg = 0;
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->group < 0) return ts_errf(err, errlen, "block %s, %%%d: negative fusion group %d", b->name, i, n->group);
    if (n->group > 0 && n->type.dtype == IR_VOID)
      return ts_errf(err, errlen, "block %s, node %d: %s has no result and cannot be in fusion group %d", b->name, i,
                     ir_ops[n->op].name, n->group);
    if (n->group > maxg) maxg = n->group;
  }
  if (!maxg) return 0;
  if (maxg > b->n)   /* groups are numbered 1, 2, ... per block */
    return ts_errf(err, errlen, "block %s: fusion group %d but the block has only %d nodes", b->name, maxg, b->n);
  /* last[g]: the group's last member */
  int *last = ts_xcalloc((size_t)maxg + 1, sizeof *last);
  for (int i = 0; i < b->n; i++) last[b->nodes[i].group] = i;
  int rc = 0;
  for (int u = 0; u < b->n && !rc; u++) {
    const IrNode *n = &b->nodes[u];
    for (int k = 0; k < n->nin && !rc; k++) {
      int g = b->nodes[n->in[k]].group;
      if (g > 0 && g != n->group && u < last[g])
        rc = ts_errf(err, errlen, "block %s: fusion group %d is not convex: node %d (%s) uses its value %%%d "
                     "before the group's last member %%%d", b->name, g, u, ir_ops[n->op].name, n->in[k], last[g]);
    }
  }
  free(last);
  return rc;
}

static int verify_block(const IrModule *m, const IrBlock *b, char *err, size_t errlen) {
  char lab[96], msg[512], t1[256], t2[256];
  for (int id = 0; id < b->n; id++) {
    const IrNode *n = &b->nodes[id];
    node_label(n, id, lab, sizeof lab);
    if ((int)n->op < 0 || n->op >= IR_OP_COUNT) return ts_errf(err, errlen, "block %s, %s: bad op", b->name, lab);
    if (n->nin < 0 || (n->nin > 0 && !n->in))
      return ts_errf(err, errlen, "block %s, %s: bad operand list", b->name, lab);
    for (int i = 0; i < n->nin; i++)
      if (n->in[i] < 0 || n->in[i] >= id)
        return ts_errf(err, errlen, "block %s, %s: operand %d (%%%d) is not defined before use",
                     b->name, lab, i + 1, n->in[i]);
    IrType want;
    if (ir_infer_type(m, b, n, &want, msg, sizeof msg) != 0)
    {
      /* msg starts with the op name: "block micro, %12 = matmul: ..." */
      if (ir_ops[n->op].flags & OPF_EFFECT)
        return ts_errf(err, errlen, "block %s, node %d: %s", b->name, id, msg);
      return ts_errf(err, errlen, "block %s, %%%d = %s", b->name, id, msg);
    }
    if (!ir_type_same_shape(&want, &n->type) || (want.dtype == IR_VOID && n->type.rank != 0))
      return ts_errf(err, errlen, "block %s, %s: stored type %s but the shape rule gives %s", b->name, lab,
                   ir_type_str(&n->type, t1, sizeof t1), ir_type_str(&want, t2, sizeof t2));
    if (!sh_well_formed(&n->sh, n->type.rank))
      return ts_errf(err, errlen, "block %s, %s: malformed sharding", b->name, lab);
    if (n->op == IR_OP_STATE && !same_but_dp(&n->sh, &m->states.a[n->ia[0]].sh))
      return ts_errf(err, errlen, "block %s, %s: sharding differs from state @%s's", b->name, lab,
                     m->states.a[n->ia[0]].name);
    if (n->op == IR_OP_ACCUM && !same_but_dp(&b->nodes[n->in[0]].sh, &m->states.a[n->ia[0]].sh))
      return ts_errf(err, errlen, "block %s, %s: operand sharding differs from state @%s's", b->name, lab,
                     m->states.a[n->ia[0]].name);
    const char *why = n->nin == 1 ? collective_problem(n, &b->nodes[n->in[0]].sh) : NULL;
    if (why) return ts_errf(err, errlen, "block %s, %s: %s", b->name, lab, why);
    if (n->op == IR_OP_INPUT || n->op == IR_OP_OUTPUT)
      for (int j = 0; j < id; j++)
        if (b->nodes[j].op == n->op && b->nodes[j].sa == n->sa)
          return ts_errf(err, errlen, "block %s, %s: name \"%s\" appears twice (first at node %d)", b->name, lab,
                       n->sa, j);
  }
  return 0;
}

int ir_verify(const IrModule *m, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (verify_states(m, err, errlen)) return -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (!b->name) return ts_errf(err, errlen, "block %d has no name", bi);
    for (int j = 0; j < bi; j++)
      if (m->blocks.a[j].name == b->name) return ts_errf(err, errlen, "block %s defined twice", b->name);
    if (b->n < 0 || (b->n > 0 && !b->nodes)) return ts_errf(err, errlen, "block %s: bad node array", b->name);
    if (verify_block(m, b, err, errlen)) return -1;
    if (verify_groups(b, err, errlen)) return -1;
  }
  return 0;
}
