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
#include <math.h>
#include <stdarg.h>
#include <string.h>

static int sh_well_formed(const IrSharding *sh, int rank) {
  unsigned seen = 0;
  for (int d = 0; d < IR_MAX_RANK; d++) {
    if (!sh->split[d]) continue;
    unsigned axes = sh->split[d] & ~IR_SPLIT_CP_MINOR;   /* the cp-minor mark goes with cp only */
    if ((sh->split[d] & IR_SPLIT_CP_MINOR) && !(axes & (1u << IR_AXIS_CP))) return 0;
    if (d >= rank || (seen & axes)) return 0;
    seen |= axes;
  }
  if ((seen & sh->partial) || (seen & sh->flat) || (sh->partial & sh->flat)) return 0;
  return ((seen | sh->partial | sh->flat) >> IR_AXIS_COUNT) == 0;
}

/* Whether interned name s is already in the set (slot: the name pointer),
 * adding it if not: the duplicate check of verify_states, linear in the
 * states (not ir_state_find's index, which trusts that names are not
 * edited in place: the verifier trusts nothing). */
static int name_seen(const char **set, size_t cap, const char *s) {
  size_t j = (size_t)(((uintptr_t)s >> 3) * 0x9e3779b97f4a7c15ull >> 17) & (cap - 1);
  for (; set[j]; j = (j + 1) & (cap - 1))
    if (set[j] == s) return 1;
  set[j] = s;
  return 0;
}

static int verify_states(const IrModule *m, char *err, size_t errlen) {
  size_t cap = 16;
  while (cap < 2 * (size_t)m->states.n) cap *= 2;
  const char **seen = ts_xcalloc(cap, sizeof *seen);
  int rc = 0;
  for (int i = 0; i < m->states.n && rc == 0; i++) {
    const IrState *s = &m->states.a[i];
    if (!s->name || !*s->name) rc = ts_errf(err, errlen, "state %d has no name", i);
    else if (name_seen(seen, cap, s->name)) rc = ts_errf(err, errlen, "state @%s defined twice", s->name);
  }
  free(seen);
  if (rc) return rc;
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
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
      if ((s->flags & IR_STATE_SHARDED) && ir_state_shard_of(m, i) < 0)
        return ts_errf(err, errlen, "param @%s is marked sharded but has no shard state", s->name);
    } else if (s->kind == IR_STATE_SHARD) {
      const IrState *p = s->of >= 0 && s->of < m->states.n ? &m->states.a[s->of] : NULL;
      if (!p || p->kind != IR_STATE_PARAM || !(p->flags & IR_STATE_SHARDED))
        return ts_errf(err, errlen, "shard @%s: of=%d is not a param marked sharded", s->name, s->of);
      int64_t c = t->rank == 1 ? t->dim[0] : 0;
      if (t->rank != 1 || !s->sh.flat || c * ir_axis_size(m, IR_AXIS_DP) < ir_type_numel(&p->type) ||
          t->dtype != p->type.dtype)
        return ts_errf(err, errlen, "shard @%s must be a flat chunk [c] of param @%s (c * dp >= its %lld elements)",
                       s->name, p->name, (long long)ir_type_numel(&p->type));
    } else if (s->kind == IR_STATE_CACHE) {
      if (s->of != -1) return ts_errf(err, errlen, "cache @%s has of=%d (must be -1)", s->name, s->of);
    } else if (s->kind == IR_STATE_FP8) {
      if (s->of != -1 || s->type.rank > 1 || s->type.dtype != IR_F32 || !ir_sharding_is_none(&s->sh))
        return ts_errf(err, errlen, "fp8 state @%s must be a replicated f32 scalar or vector with of=-1", s->name);
    } else if (s->kind == IR_STATE_SCALER) {
      if (s->of != -1 || s->type.rank != 0 || !ir_dtype_is_float(s->type.dtype) || s->sh.partial || s->sh.flat)
        return ts_errf(err, errlen, "scaler @%s must be a replicated float scalar with of=-1", s->name);
    } else if (s->kind == IR_STATE_COPY) {
      const IrState *p = s->of >= 0 && s->of < m->states.n ? &m->states.a[s->of] : NULL;
      if (!p || p->kind != IR_STATE_PARAM)
        return ts_errf(err, errlen, "copy @%s: of=%d is not a param", s->name, s->of);
      IrType a = s->type, b = p->type;
      a.dtype = b.dtype = IR_VOID;
      if (!ir_dtype_is_16(s->type.dtype) || !ir_type_same_shape(&a, &b) || !ir_sharding_equal(&s->sh, &p->sh))
        return ts_errf(err, errlen, "copy @%s must be param @%s's shape and sharding in bf16 or f16", s->name, p->name);
    } else {
      if (s->of < 0 || s->of >= m->states.n || m->states.a[s->of].kind != IR_STATE_PARAM)
        return ts_errf(err, errlen, "%s @%s: of=%d is not a param", ir_state_kind_name(s->kind), s->name, s->of);
    }
  }
  return 0;
}

/* Equal layouts, except that either may be a partial sum over dp: dp is
 * not a tensor sharding (docs/sharding.md), a gradient state is summed
 * over dp ranks by the update block whatever its annotation says.  A flat
 * chunk (a rank-1 state, `flat:dp`) is the same thing as dim 0 of the
 * padded flattened vector split over those axes (`0:dp`): a value read
 * from or accumulated into a flat state may say either. */
static int same_but_dp(const IrSharding *a, const IrSharding *b) {
  IrSharding x = *a, y = *b;
  x.partial &= (uint8_t)~(1u << IR_AXIS_DP);
  y.partial &= (uint8_t)~(1u << IR_AXIS_DP);
  x.split[0] |= x.flat, x.flat = 0;
  y.split[0] |= y.flat, y.flat = 0;
  return ir_sharding_equal(&x, &y);
}

/* Collective ops against their operand's layout; NULL if consistent. */
static const char *collective_problem(const IrNode *n, const IrSharding *in) {
  /* a set of axes (dp+cp) acts on all of them at once */
  unsigned a = ir_axes_mask(n->ia[0]);
  const IrSharding *out = &n->sh;
  int d = (int)n->ia[1];
  switch (n->op) {
  case IR_OP_ALL_REDUCE:
    if (n->ia[1] == 0 && (in->partial & a) != a) return "all_reduce (sum) of a value that is not a partial sum over its axis";
    if ((out->partial & a)) return "all_reduce result is still partial over its axis";
    return NULL;
  case IR_OP_ALL_GATHER:
    if ((in->split[d] & a) != a) return "all_gather of a value that is not split along its dim over its axis";
    if (out->split[d] & a) return "all_gather result is still split over its axis";
    return NULL;
  case IR_OP_REDUCE_SCATTER:
    if ((in->partial & a) != a) return "reduce_scatter of a value that is not a partial sum over its axis";
    if ((out->split[d] & a) != a || (out->partial & a)) return "reduce_scatter result is not split along its dim over its axis";
    return NULL;
  case IR_OP_SHARD_SLICE:
    if (in->partial & a) return "shard_slice of a partial sum";
    for (int k = 0; k < IR_MAX_RANK; k++)
      if (in->split[k] & a) return "shard_slice of a value already split over its axis";
    if ((out->split[d] & a) != a) return "shard_slice result is not split along its dim over its axis";
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
    if (n->op == IR_OP_STATE && (m->states.a[n->ia[0]].flags & IR_STATE_SHARDED) &&
        m->states.a[n->ia[0]].kind == IR_STATE_PARAM)
      return ts_errf(err, errlen, "block %s, %s: reads param @%s, which is held only as its ZeRO-3 shard (read the "
                     "shard and gather it)", b->name, lab, m->states.a[n->ia[0]].name);
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

/* Pipeline blocks (pass "pipeline", docs/pipeline.md).  Sends and receives
 * travel along pp between neighbouring chunks: in fwd.<g> a send goes to
 * chunk g + 1 (peer +1), in bwd.<g> to chunk g - 1 (peer -1), and its recv
 * (same tag) sits in the neighbour's block of the same kind with the
 * opposite peer, with the same type and sharding.  Between two blocks the
 * sends and the receives come in the same order (messages on a link are
 * matched in order, as NCCL does).  A stash slot of fwd.<g> is read by one
 * unstash of bwd.<g> with the same type.  The evaluation blocks eval.<g>
 * (pass eval) are forward blocks with messages of their own: a send of
 * eval.<g> goes to eval.<g + 1>, and they hold no stash or unstash.  With a
 * split backward (--schedule zb-h1) wgt.<g> holds no send or recv, and a
 * slot stashed in bwd.<g> is read by one unstash of wgt.<g>: forward slots
 * go forward to backward, backward ones B to W.  In the compiler's whole-model
 * module (parallel stage=0) every message and slot must have both ends; a
 * rank's program holds only its own chunks, so there only the ends it holds
 * are checked against each other. */
typedef struct { int bi, id, chunk, bwd; IrChunkKind kind; } PipeEnd;

static const char *pipe_end_str(const IrModule *m, const PipeEnd *e, char *buf, size_t n) {
  snprintf(buf, n, "block %s, node %d", m->blocks.a[e->bi].name, e->id);
  return buf;
}

static int verify_pipeline(const IrModule *m, char *err, size_t errlen) {
  int whole = m->par.pp > 1 && m->par.stage == 0;
  int maxtag = -1, maxslot = -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      int pipe_op = n->op == IR_OP_SEND || n->op == IR_OP_RECV || n->op == IR_OP_STASH || n->op == IR_OP_UNSTASH;
      if (!pipe_op) continue;
      IrChunkKind kind = IR_CHUNK_FWD;
      int bwd, g = ir_block_chunk(b, &bwd);
      if (g < 0)
        return ts_errf(err, errlen, "block %s, node %d: %s outside a pipeline block (fwd.<g> / bwd.<g> / eval.<g>)",
                       b->name, i, ir_ops[n->op].name);
      ir_block_chunk_kind(b, &kind);
      if (kind == IR_CHUNK_WGT && (n->op == IR_OP_SEND || n->op == IR_OP_RECV))
        return ts_errf(err, errlen, "block %s, node %d: %s in a weight-gradient block (nothing waits for W)", b->name,
                       i, ir_ops[n->op].name);
      if (kind == IR_CHUNK_EVAL && (n->op == IR_OP_STASH || n->op == IR_OP_UNSTASH))
        return ts_errf(err, errlen, "block %s, node %d: %s in an evaluation block (no backward reads it)", b->name, i,
                       ir_ops[n->op].name);
      if (n->op == IR_OP_SEND || n->op == IR_OP_RECV) {
        if (n->ia[0] != IR_AXIS_PP) return ts_errf(err, errlen, "block %s, node %d: %s along an axis other than pp", b->name, i, ir_ops[n->op].name);
        int want = (n->op == IR_OP_SEND) == !bwd ? 1 : -1;
        if (n->ia[1] != want)
          return ts_errf(err, errlen, "block %s, node %d: %s with peer=%lld; in a %s block it must be %+d", b->name, i,
                         ir_ops[n->op].name, (long long)n->ia[1], bwd ? "backward" : "forward", want);
        if (n->ia[2] < 0 || n->ia[2] > (1 << 24)) return ts_errf(err, errlen, "block %s, node %d: tag out of range", b->name, i);
        if (n->ia[2] > maxtag) maxtag = (int)n->ia[2];
      } else {
        if (n->op == IR_OP_STASH ? kind == IR_CHUNK_WGT : kind == IR_CHUNK_FWD)
          return ts_errf(err, errlen, "block %s, node %d: %s belongs in a %s block", b->name, i, ir_ops[n->op].name,
                         n->op == IR_OP_STASH ? "forward (or a split backward's B)" : "backward");
        if (n->ia[0] > (1 << 24)) return ts_errf(err, errlen, "block %s, node %d: slot out of range", b->name, i);
        if (n->ia[0] > maxslot) maxslot = (int)n->ia[0];
      }
    }
  }
  if (maxtag < 0 && maxslot < 0) return 0;
  int rc = 0;
  /* messages: ends by tag */
  size_t nt = (size_t)maxtag + 1;
  PipeEnd *snd = ts_xmalloc((nt ? nt : 1) * sizeof *snd), *rcv = ts_xmalloc((nt ? nt : 1) * sizeof *rcv);
  for (size_t t = 0; t < nt; t++) snd[t].bi = rcv[t].bi = -1;
  char b1[128], b2[128], t1[256], t2[256];
  for (int bi = 0; bi < m->blocks.n && !rc; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind = IR_CHUNK_FWD;
    int bwd, g = ir_block_chunk(b, &bwd);
    ir_block_chunk_kind(b, &kind);
    for (int i = 0; i < b->n && !rc; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_SEND && n->op != IR_OP_RECV) continue;
      PipeEnd *e = n->op == IR_OP_SEND ? &snd[n->ia[2]] : &rcv[n->ia[2]];
      if (e->bi >= 0)
        rc = ts_errf(err, errlen, "block %s, node %d: a second %s with tag %lld (the first: %s)", b->name, i,
                     ir_ops[n->op].name, (long long)n->ia[2], pipe_end_str(m, e, b1, sizeof b1));
      *e = (PipeEnd){bi, i, g, bwd, kind};
    }
  }
  for (size_t t = 0; t < nt && !rc; t++) {
    PipeEnd *s = &snd[t], *r = &rcv[t];
    if (s->bi < 0 && r->bi < 0) continue;
    if (s->bi < 0 || r->bi < 0) {
      if (whole) rc = ts_errf(err, errlen, "%s: %s with tag %zu has no matching %s", pipe_end_str(m, s->bi >= 0 ? s : r, b1, sizeof b1),
                              s->bi >= 0 ? "send" : "recv", t, s->bi >= 0 ? "recv" : "send");
      continue;
    }
    int want = s->chunk + (s->bwd ? -1 : 1);
    if (r->chunk != want || r->kind != s->kind) {
      rc = ts_errf(err, errlen, "%s: send with tag %zu goes to %s, which is not the neighbouring %s block of chunk %d",
                   pipe_end_str(m, s, b1, sizeof b1), t, pipe_end_str(m, r, b2, sizeof b2),
                   s->kind == IR_CHUNK_BWD ? "backward" : s->kind == IR_CHUNK_EVAL ? "evaluation" : "forward", want);
      break;
    }
    const IrNode *sv = &m->blocks.a[s->bi].nodes[m->blocks.a[s->bi].nodes[s->id].in[0]];
    const IrNode *rn = &m->blocks.a[r->bi].nodes[r->id];
    if (!ir_type_same_shape(&sv->type, &rn->type) || !ir_sharding_equal(&sv->sh, &rn->sh))
      rc = ts_errf(err, errlen, "%s: send with tag %zu sends %s but %s receives %s", pipe_end_str(m, s, b1, sizeof b1), t,
                   ir_type_str(&sv->type, t1, sizeof t1), pipe_end_str(m, r, b2, sizeof b2), ir_type_str(&rn->type, t2, sizeof t2));
  }
  /* order on each link: for every pair of blocks, receives in send order */
  for (size_t t = 0; t < nt && !rc; t++) {
    if (snd[t].bi < 0 || rcv[t].bi < 0) continue;
    for (size_t u = t + 1; u < nt && !rc; u++) {
      if (snd[u].bi != snd[t].bi || rcv[u].bi != rcv[t].bi) continue;
      if ((snd[u].id > snd[t].id) != (rcv[u].id > rcv[t].id))
        rc = ts_errf(err, errlen, "%s and %s: messages with tags %zu and %zu are received in the other order than sent",
                     pipe_end_str(m, &rcv[t], b1, sizeof b1), pipe_end_str(m, &rcv[u], b2, sizeof b2), t, u);
    }
  }
  free(snd);
  free(rcv);
  if (rc || maxslot < 0) return rc;
  /* stash slots: per chunk, each slot stashed once and unstashed once, same type */
  for (int bi = 0; bi < m->blocks.n && !rc; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind = IR_CHUNK_FWD;
    int g = ir_block_chunk_kind(b, &kind);
    if (g < 0) continue;
    for (int i = 0; i < b->n && !rc; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_STASH && n->op != IR_OP_UNSTASH) continue;
      const IrType *ty = n->op == IR_OP_STASH ? &b->nodes[n->in[0]].type : &n->type;
      int found = 0;
      for (int cj = 0; cj < m->blocks.n && !rc; cj++) {
        const IrBlock *c = &m->blocks.a[cj];
        IrChunkKind ckind = IR_CHUNK_FWD;
        int cg = ir_block_chunk_kind(c, &ckind);
        if (cg != g) continue;
        for (int j = 0; j < c->n && !rc; j++) {
          const IrNode *o = &c->nodes[j];
          if (o->ia[0] != n->ia[0] || (o->op != IR_OP_STASH && o->op != IR_OP_UNSTASH)) continue;
          if (cj == bi && j == i) continue;
          if (o->op == n->op) {
            rc = ts_errf(err, errlen, "block %s, node %d: a second %s of slot %lld", c->name, j, ir_ops[o->op].name, (long long)o->ia[0]);
            break;
          }
          found = 1;
          /* the stash's block and the unstash's: fwd -> bwd, or bwd -> wgt */
          IrChunkKind sk = n->op == IR_OP_STASH ? kind : ckind, uk = n->op == IR_OP_STASH ? ckind : kind;
          if (!(sk == IR_CHUNK_FWD && uk == IR_CHUNK_BWD) && !(sk == IR_CHUNK_BWD && uk == IR_CHUNK_WGT)) {
            rc = ts_errf(err, errlen, "block %s, node %d: slot %lld is stashed in %s and unstashed in %s (a forward "
                         "stash is read by its backward, a backward one by its weight-gradient block)", b->name, i,
                         (long long)n->ia[0], n->op == IR_OP_STASH ? b->name : c->name,
                         n->op == IR_OP_STASH ? c->name : b->name);
            break;
          }
          const IrType *oty = o->op == IR_OP_STASH ? &c->nodes[o->in[0]].type : &o->type;
          if (!ir_type_same_shape(ty, oty))
            rc = ts_errf(err, errlen, "block %s, node %d: slot %lld stashed as %s but read as %s", b->name, i,
                         (long long)n->ia[0], ir_type_str(n->op == IR_OP_STASH ? ty : oty, t1, sizeof t1),
                         ir_type_str(n->op == IR_OP_STASH ? oty : ty, t2, sizeof t2));
        }
      }
      if (!rc && !found && (whole || m->par.pp > 1))
        rc = ts_errf(err, errlen, "block %s, node %d: %s of slot %lld has no matching %s in chunk %d", b->name, i,
                     ir_ops[n->op].name, (long long)n->ia[0], n->op == IR_OP_STASH ? "unstash" : "stash", g);
    }
  }
  return rc;
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
  return verify_pipeline(m, err, errlen);
}

/* The loss gradient's seed, 1 / (micro batches per step), is baked into the
 * program by autodiff: a `full` right after `output "loss"` in block micro,
 * or the first `full` of the backward block of the chunk whose forward
 * block has the loss under pp.  The train line's global_batch /
 * micro_batch must be that count, or the step would average over other
 * micro batches than it runs (a plan edited after compiling).  0 when they
 * agree or no seed is there (a program not made by autodiff). */
/* The train line: the ranges the train block of MDL enforces (an edited
 * plan or IR text gets the same refusals), and a precision that is the
 * parameters' dtype. */
static int train_check(const IrModule *m, char *err, size_t errlen) {
  const IrTrain *t = &m->train;
  struct { const char *name; double v, lo, hi; int lo_open, hi_open; } r[] = {
      {"lr", t->lr, 0, INFINITY, 1, 0},           {"beta1", t->beta1, 0, 1, 0, 1},
      {"beta2", t->beta2, 0, 1, 0, 1},            {"eps", t->eps, 0, INFINITY, 1, 0},
      {"weight_decay", t->weight_decay, 0, INFINITY, 0, 0}, {"min_lr", t->min_lr, 0, INFINITY, 0, 0},
      {"clip_grad", t->clip_grad, 0, INFINITY, 0, 0},  {"momentum", t->momentum, 0, 1, 0, 1},
      {"muon_momentum", t->muon_momentum, 0, 1, 0, 1}, {"muon_adamw_lr", t->muon_adamw_lr, 0, INFINITY, 0, 0},
  };
  for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
    double x = r[k].v;
    if (!isfinite(x) || (r[k].lo_open ? !(x > r[k].lo) : !(x >= r[k].lo)) || (r[k].hi_open && !(x < r[k].hi)))
      return ts_errf(err, errlen, "the train line's %s = %g is out of range (%s %g%s); the plan was edited after "
                     "compiling, or compile the model again", r[k].name, x, r[k].lo_open ? ">" : ">=", r[k].lo,
                     r[k].hi_open ? " and < 1" : ", finite");
  }
  struct { const char *name; int64_t v, lo; } n[] = {
      {"warmup", t->warmup, 0}, {"decay_steps", t->decay_steps, 0}, {"global_batch", t->global_batch, 1},
      {"micro_batch", t->micro_batch, 1}, {"seq_len", t->seq_len, 0}, {"steps", t->steps, 1},
      {"muon_ns_steps", t->muon_ns_steps, 1}, {"wsd_decay_steps", t->wsd_decay_steps, t->schedule == IR_SCHED_WSD},
      {"nesterov", t->nesterov, 0}, {"rampup_start", t->rampup_start, 0},
  };
  for (size_t k = 0; k < sizeof n / sizeof n[0]; k++)
    if (n[k].v < n[k].lo)
      return ts_errf(err, errlen, "the train line's %s = %lld is out of range (>= %lld); the plan was edited after "
                     "compiling, or compile the model again", n[k].name, (long long)n[k].v, (long long)n[k].lo);
  if (ir_train_rampup(t) && ir_train_rampup_check(t, t->micro_batch, err, errlen) != 0) return -1;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind != IR_STATE_PARAM) continue;
    if (ir_dtype_is_float(st->type.dtype) && st->type.dtype != t->precision)
      return ts_errf(err, errlen, "the train line says precision=%s, but parameter @%s is %s: the plan was edited "
                     "after compiling; compile the model again with --precision %s", ir_dtype_name(t->precision),
                     st->name, ir_dtype_name(st->type.dtype), ir_dtype_name(t->precision));
    int bad = !isfinite(st->init_a) || !isfinite(st->init_b) ||
              (st->init == IR_INIT_NORMAL && st->init_b < 0) || (st->init == IR_INIT_UNIFORM && st->init_b < st->init_a);
    if (bad)
      return ts_errf(err, errlen, "parameter @%s has init %s(%g, %g): %s", st->name,
                     st->init == IR_INIT_NORMAL ? "normal" : st->init == IR_INIT_UNIFORM ? "uniform" : "const",
                     st->init_a, st->init_b, st->init == IR_INIT_NORMAL ? "a normal's std must be finite and >= 0"
                     : st->init == IR_INIT_UNIFORM ? "a uniform's bounds must be finite, low <= high" : "not finite");
  }
  /* the sequence the data pipeline feeds: the inputs' sequence dim (ruled
   * to cp, else 'seq'), global, is seq_len where the train line gives one.
   * (Not the batch: a program's micro_batch may be the default 1 over an
   * input of any batch size, as MDL without a train block compiles.) */
  const char *seq = "seq";
  for (int r = 0; r < m->rules.n; r++)
    if (m->rules.a[r].axes & (1u << IR_AXIS_CP)) seq = m->rules.a[r].dim;
  for (int bi = 0; bi < m->blocks.n && t->seq_len > 0; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    /* generation's step block (pass decode) runs one token; mrun --generate
     * feeds it, not the data pipeline */
    if (strcmp(b->name, "step") == 0) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_INPUT) continue;
      for (int d = 0; d < n->type.rank; d++) {
        const char *dn = n->type.dname[d];
        if (!dn || strcmp(dn, seq)) continue;
        int64_t g = n->type.dim[d];
        for (int a = 0; a < IR_AXIS_COUNT; a++)
          if (n->sh.split[d] & (1u << a)) g *= ir_axis_size(m, (IrAxis)a);
        if (g != t->seq_len)
          return ts_errf(err, errlen, "the train line says seq_len=%lld, but input \"%s\" has dim '%s' = %lld: the "
                         "plan was edited after compiling; compile the model again", (long long)t->seq_len,
                         n->sa ? n->sa : "?", dn, (long long)g);
      }
    }
  }
  return 0;
}

static int loss_seed_check(const IrModule *m, char *err, size_t errlen) {
  const IrTrain *t = &m->train;
  if (t->micro_batch <= 0 || t->global_batch <= 0 || t->global_batch % t->micro_batch) return 0;   /* the trainer says */
  const IrNode *seed = NULL;
  for (int bi = 0; bi < m->blocks.n && !seed; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int bwd = 0, chunk = ir_block_chunk(b, &bwd);
    if (strcmp(b->name, "micro") != 0 && (chunk < 0 || bwd)) continue;
    int at = -1;
    for (int i = 0; i < b->n && at < 0; i++)
      if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa && strcmp(b->nodes[i].sa, "loss") == 0) at = i;
    if (at < 0) continue;
    const IrBlock *sb = b;
    if (chunk >= 0) {   /* pp: the seed opens the chunk's backward block */
      char name[32];
      snprintf(name, sizeof name, "bwd.%d", chunk);
      int k = ir_block_find(m, name);
      if (k < 0) return 0;
      sb = &m->blocks.a[k];
      at = -1;
    }
    for (int i = at + 1; i < sb->n && !seed; i++)
      if (sb->nodes[i].op == IR_OP_FULL) seed = &sb->nodes[i];
  }
  if (!seed || !(seed->fa[0] > 0)) return 0;
  double n = (double)(t->global_batch / t->micro_batch), got = 1.0 / seed->fa[0];
  if (fabs(got - n) <= 1e-9 * n) return 0;
  return ts_errf(err, errlen, "the train line says global_batch %lld / micro_batch %lld = %lld micro batches per "
                 "step, but the program's loss gradient is scaled for %.6g (it was compiled for global_batch %.6g at "
                 "micro_batch %lld): the plan was edited after compiling; compile it again with the batch sizes "
                 "wanted", (long long)t->global_batch, (long long)t->micro_batch, (long long)(t->global_batch /
                 t->micro_batch), got, got * (double)t->micro_batch, (long long)t->micro_batch);
}

int ir_verify_training(const IrModule *m, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  int ub = ir_block_find(m, "update");
  if (ub < 0) return 0;
  int ns = m->states.n;
  int *added = ts_xcalloc((size_t)(ns ? ns : 1), sizeof *added), *zeroed = ts_xcalloc((size_t)(ns ? ns : 1), sizeof *zeroed),
      *updated = ts_xcalloc((size_t)(ns ? ns : 1), sizeof *updated);
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int bwd = 0, per_micro = strcmp(b->name, "micro") == 0 || (ir_block_chunk(b, &bwd) >= 0 && bwd);
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      int64_t s = n->ia[0];
      if (s < 0 || s >= ns) continue;
      if (per_micro && n->op == IR_OP_ACCUM) added[s]++;
      if (bi == ub && n->op == IR_OP_ZERO) zeroed[s]++;
      if (bi == ub && (n->op == IR_OP_ADAMW || n->op == IR_OP_SGD || n->op == IR_OP_LION || n->op == IR_OP_LR_STEP))
        updated[m->states.a[s].kind == IR_STATE_SHARD ? m->states.a[s].of : s]++;
    }
  }
  int rc = train_check(m, err, errlen);
  if (rc == 0) rc = loss_seed_check(m, err, errlen);
  for (int s = 0; s < ns && rc == 0; s++) {
    const IrState *g = &m->states.a[s];
    if (g->kind != IR_STATE_GRAD) continue;
    const char *p = g->of >= 0 && g->of < ns ? m->states.a[g->of].name : "?";
    if (!added[s])
      rc = ts_errf(err, errlen, "gradient @%s is never accumulated (no accum in the micro-batch blocks): parameter "
                   "@%s would be trained on a gradient of zero", g->name, p);
    else if (zeroed[s] != 1)
      rc = ts_errf(err, errlen, "gradient @%s is zeroed %d times in block update (once per step is the rule: %s)",
                   g->name, zeroed[s], zeroed[s] ? "a second zero loses the step's gradient" :
                   "without it the gradients of every step add up");
    else if (g->of >= 0 && g->of < ns && updated[g->of] != 1)
      rc = ts_errf(err, errlen, "parameter @%s is updated by %d adamw nodes in block update (exactly one is the rule; "
                   "sgd, lion and lr_step count as adamw)",
                   p, updated[g->of]);
  }
  free(added);
  free(zeroed);
  free(updated);
  return rc;
}
