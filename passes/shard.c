/* shard.c - the sharding propagation pass: the global micro block becomes
 * one rank's local micro block for tensor (and sequence) parallelism.
 * Design and vocabulary: docs/sharding.md.
 *
 * Expects: autodiff's "micro" block (forward + backward + accumulation into
 *          grad states, global shapes, topological order), no "update" yet,
 *          m->rules (dim name -> mesh axes) and m->par (tp, sp).
 * Guarantees: with tp = 1 the module is unchanged.  Otherwise
 *   - every parameter dim whose name has a tp rule is split over tp (its
 *     state type becomes the local shape, IrState.sh says how); a dim that
 *     tp does not divide is padded up when only zero-preserving ops and the
 *     class dim of cross_entropy see it (IrState.logical keeps the model's
 *     size), else the pass fails naming the dim and both sizes;
 *   - the micro block is rebuilt in local shapes, every value annotated
 *     with its IrSharding, with all_reduce / all_gather / reduce_scatter /
 *     shard_slice inserted where layouts meet (see "Propagation");
 *   - cross_entropy over a tp-split class dim is lowered to max / sum /
 *     take with all-reduces, and its backward to exp(l - max) / sum - onehot
 *     from the same statistics: no rank holds the full logits;
 *   - the fused attention under cp becomes ring steps (--cp-attn ring),
 *     keeps its node on all-gathered k / v (allgather), or keeps it on
 *     head-split operands between all_to_all exchanges (a2a; query heads
 *     per tp rank that cp does not divide are refused, naming them, kv
 *     heads are replicated until cp divides them);
 *   - grad states take the layout of their accumulated value: their
 *     parameter's split, plus partial:tp when the value is a partial sum
 *     (the update block reduces it once per step).
 *
 * Propagation visits nodes in order.  A value's layout along one mesh axis
 * is its "axis state": replicated (AX_R), partial (AX_P) or split along dim
 * d (d >= 0).  Each op rule reads its operands' axis states and decides
 * what it wants them to be and what its result is; conv() then converts
 * operands (cached per value and target, so x is gathered once however many
 * matmuls read it).  Rules are written per axis, so cp and ep can join tp. */
#include "passes.h"
#include <math.h>
#include <stdarg.h>

enum { AX_R = -1, AX_P = -2 };
#define BIT(a) ((uint8_t)(1u << (a)))

/* keep: the merged-row axes (Sh.scr) along which the variant keeps its
 * value's merged order (conv_ex) */
typedef struct { IrSharding sh; int id; uint8_t keep; } ConvEntry;
typedef struct { int from, to, id; } XEntry;   /* new value `from` re-laid out to XL_* `to` */
enum { XL_TOK = 1, XL_EXP = 2 };
typedef struct { int logits, targets; int L, mx, e, se, valid; } CeStats;

typedef struct {
  IrModule *m;
  PassCtx *cx;
  IrBlock ob;             /* the global micro block (nodes stay in the arena) */
  int nb;                 /* the block being rebuilt (same index) */
  int T;                  /* tp size */
  int C;                  /* cp size */
  int sp;                 /* sequence parallelism */
  const char *seq_name;   /* the dim name mapped to cp: the sequence dim */
  int *nv;                /* old value -> new value (canonical layout) */
  IrSharding *sh;         /* old value -> its canonical layout */
  uint8_t *taint;         /* old value -> dims holding padding (zeros) */
  IrSharding *hint;       /* old value -> layout its consumer wants (or none) */
  uint8_t *has_hint;
  VEC(ConvEntry) *conv;   /* old value -> converted variants */
  VEC(CeStats) ce;
  int failed;
  int tag;                /* pipeline stage tag of the node being sharded (copied to what it emits) */
  unsigned char *accumed; /* per state: an accum into it was sharded already */
  int cp_ring;            /* attention under cp: k / v stay blocks (the ring or all-to-all) or are all-gathered */
  int cp_a2a;             /* attention under cp by all-to-all to head-split layouts (--cp-attn a2a) */
  /* token dispatch under ep (shard_moe_ep): per old value, its row layout
   * (XL_TOK / XL_EXP, or 0: an ordinary value), the moe_counts node that
   * governs its rows, and its converted variants; per moe_counts node the
   * local (pre-exchange) counts; per routing mask its moe_counts node */
  uint8_t *xl;
  int *xc;
  int *cntl;
  int *cnt_of;
  VEC(XEntry) *xconv;
  /* ring attention: per old attention node its final state; per old
   * attention_bwd node the lse and rowsum(do * o) its parts share */
  int *ring_st, *ring_lse, *ring_drow;
  int *ring_out;             /* attention_bwd parts lowered with a sibling: their value (-1: not yet) */
  /* Merged rows.  A reshape that merges a split dim into a larger one
   * behind an unsplit major dim ([batch, seq/cp, d] -> [batch*seq, d]: a
   * weight gradient's rows under cp at micro batch > 1) cannot keep a
   * contiguous split: each rank's rows are every batch's block.  When every
   * use of the reshape reduces over the merged dim (a matmul contracting
   * it, a sum or mean over it), the order of the rows does not matter: the
   * reshape stays local, its result is marked split along the merged dim
   * for the axes in scr[v] (rows in the source's order, not a block), and
   * a matmul of two such values with the same merged source dims and
   * splits, or a sum over it, gives the partial sum over the axis, as with
   * a contiguous split, with no bytes moved.  Other uses (and a matmul's
   * along axes only one operand merged: scr_use) see it as replicated
   * along those axes and get it gathered through its source.  red[v]: the dims every use of old value v reduces over. */
  uint8_t *scr;
  uint8_t *red;
  IrSharding *scr_src;       /* merged-row value -> the layout its source was read in (its rows' order) */
  /* why each communication node is there (IrNode.why, mcc --report
   * sharding): the old node being sharded and which operand it converts,
   * the matmul rule's weighing of its sides, or a lowering's own note */
  int cur, cur_k;
  const char *note;          /* about node note_at (the matmul's gather choice) */
  int note_at;
  const char *why;           /* set by a lowering for what it emits; NULL: conversions say */
} Sh;

/* "1, 2, 3, 6": the sizes k of a mesh axis (up to 4096) for which times x k
 * divides n, into buf: what a refusal offers instead. */
static const char *sizes_dividing(int64_t n, int times, char *buf, size_t cap) {
  size_t k = 0;
  int listed = 0;
  buf[0] = 0;
  for (int64_t d = 1; d <= 4096 && d * times <= n && k + 32 < cap; d++)
    if (n % (d * times) == 0) k += (size_t)snprintf(buf + k, cap - k, "%s%lld", listed++ ? ", " : "", (long long)d);
  if (!listed) snprintf(buf, cap, "none");
  return buf;
}

/* "parameter layers.0.attention.wq and 3 more": the parameters with a dim
 * named dn (the user's names for where a dim comes from), into buf. */
static const char *params_with_dim(const IrModule *m, const char *dn, char *buf, size_t cap) {
  int n = 0;
  const char *first = NULL;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind != IR_STATE_PARAM) continue;
    for (int d = 0; d < st->type.rank; d++)
      if (st->type.dname[d] && !strcmp(st->type.dname[d], dn)) {
        if (!n++) first = st->name;
        break;
      }
  }
  if (!n) snprintf(buf, cap, "no parameter");
  else if (n == 1) snprintf(buf, cap, "parameter %s", first);
  else snprintf(buf, cap, "parameter %s and %d more", first, n - 1);
  return buf;
}

static int sh_fail(Sh *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh_fail(Sh *S, const char *fmt, ...) {
  if (S->failed) return -1;
  S->failed = 1;
  int k = snprintf(S->cx->err, sizeof S->cx->err, "shard: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(S->cx->err + k, sizeof S->cx->err - (size_t)k, fmt, ap);
  va_end(ap);
  return -1;
}

static const IrNode *onode(const Sh *S, int v) { return &S->ob.nodes[v]; }
static const char *tstr(const IrType *t, char *buf, size_t n) { return ir_type_str(t, buf, n); }
/* " @name" when value v is a parameter (through casts and reshapes), else
 * "": what a refusal names for an operand, as the user wrote it. */
static const char *param_of(const Sh *S, int v, char *buf, size_t n) {
  buf[0] = 0;
  for (int hop = 0; hop < 8; hop++) {
    const IrNode *x = onode(S, v);
    if (x->op == IR_OP_STATE && x->ia[0] >= 0 && x->ia[0] < S->m->states.n) {
      snprintf(buf, n, " @%s", S->m->states.a[x->ia[0]].name);
      break;
    }
    if (x->nin != 1) break;
    v = x->in[0];
  }
  return buf;
}

/* ---------------- axis states ---------------- */

static int ax_get(const IrSharding *s, int a) {
  if (s->partial & BIT(a)) return AX_P;
  for (int d = 0; d < IR_MAX_RANK; d++)
    if (s->split[d] & BIT(a)) return d;
  return AX_R;
}
static void ax_set(IrSharding *s, int a, int st) {
  s->partial &= (uint8_t)~BIT(a);
  for (int d = 0; d < IR_MAX_RANK; d++)   /* the cp-minor mark goes with the cp split */
    s->split[d] &= (uint8_t)~(BIT(a) | (a == IR_AXIS_CP ? IR_SPLIT_CP_MINOR : 0));
  if (st == AX_P) s->partial |= BIT(a);
  else if (st >= 0) s->split[st] |= BIT(a);
}

/* The global type of old value v: its type with padded dims rounded up. */
static IrType gtype(const Sh *S, int v) {
  IrType t = onode(S, v)->type;
  for (int d = 0; d < t.rank; d++)
    if (S->taint[v] & BIT(d)) t.dim[d] = (t.dim[d] + S->T - 1) / S->T * S->T;
  return t;
}

/* Local type of a global type under a sharding (split dims divided). */
static IrType local_type(const Sh *S, IrType t, const IrSharding *sh) {
  for (int d = 0; d < t.rank; d++)
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (sh->split[d] & BIT(a)) t.dim[d] /= ir_axis_size(S->m, (IrAxis)a);
  return t;
}

/* ---------------- emitting ---------------- */

static int emit(Sh *S, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
                const char *sa, const IrType *type, const IrSharding *sh) {
  if (S->failed) return -1;
  for (int k = 0; k < nin; k++)
    if (in[k] < 0) return -1;
  char err[512];
  int id = ir_emit(S->m, S->nb, op, in, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) return sh_fail(S, "internal error: cannot emit %s: %s", ir_ops[op].name, err);
  if (sh) S->m->blocks.a[S->nb].nodes[id].sh = *sh;
  S->m->blocks.a[S->nb].nodes[id].stage = S->tag;
  if (S->why && ir_op_communicates(op)) S->m->blocks.a[S->nb].nodes[id].why = S->why;
  return id;
}
static const IrNode *nnode(const Sh *S, int id) { return &S->m->blocks.a[S->nb].nodes[id]; }

/* ---------------- conversions ---------------- */

/* Emits value `id` (old value v's layout `from`) re-laid out along axis a
 * to state `to`.  Returns the new id; *from is updated. */
static const char *ax_desc(const IrType *t, int st, char *buf, size_t n) {
  if (st == AX_R) snprintf(buf, n, "whole");
  else if (st == AX_P) snprintf(buf, n, "a partial sum");
  else if (st < t->rank && t->dname[st]) snprintf(buf, n, "split along dim %d (%s)", st, t->dname[st]);
  else snprintf(buf, n, "split along dim %d", st);
  return buf;
}

/* The note of a conversion of old value v along axis a from st to `to`,
 * made for old node S->cur (interned). */
static const char *conv_why(Sh *S, int v, int a, int st, int to) {
  const IrNode *c = onode(S, S->cur), *x = onode(S, v);
  IrType xt = gtype(S, v);
  char tb[256], f[96], w[96], k[32] = "";
  if (S->cur_k >= 0) snprintf(k, sizeof k, " (operand %d)", S->cur_k);
  char buf[1024];
  int len = snprintf(buf, sizeof buf, "%s%s reads the %s %s %s over %s; it is %s", ir_ops[c->op].name, k,
                     ir_ops[x->op].name, tstr(&xt, tb, sizeof tb), ax_desc(&xt, to, w, sizeof w), ir_axis_name((IrAxis)a),
                     ax_desc(&xt, st, f, sizeof f));
  if (S->note && S->note_at == S->cur && len > 0 && (size_t)len < sizeof buf)
    snprintf(buf + len, sizeof buf - (size_t)len, "; %s", S->note);
  return ts_intern(buf);
}

static int conv_axis(Sh *S, int v, int id, IrSharding *from, int a, int to) {
  int st = ax_get(from, a);
  if (st == to || id < 0) return id;
  const char *saved = S->why;
  if (!saved) S->why = conv_why(S, v, a, st, to);
  IrSharding sh = *from;
  IrType t = nnode(S, id)->type;
  int64_t ia[2] = {a, 0};
  char tb[256];
  /* integers (token ids, targets) are sliced or gathered, never summed */
  if (t.dtype == IR_I32 && (st == AX_P || to == AX_P))
    return sh_fail(S, "internal error: value %%%d (%s) would need a sum over ranks", v, tstr(&t, tb, sizeof tb));
  if (to == AX_P) return sh_fail(S, "internal error: cannot make value %%%d a partial sum", v);
  if (st == AX_P) {
    if (to == AX_R) { ia[1] = 0; ax_set(&sh, a, AX_R); id = emit(S, IR_OP_ALL_REDUCE, &id, 1, ia, NULL, NULL, NULL, &sh); }
    else { ia[1] = to; ax_set(&sh, a, to); id = emit(S, IR_OP_REDUCE_SCATTER, &id, 1, ia, NULL, NULL, NULL, &sh); }
  } else {
    if (st >= 0) {   /* gather first */
      ia[1] = st;
      ax_set(&sh, a, AX_R);
      id = emit(S, IR_OP_ALL_GATHER, &id, 1, ia, NULL, NULL, NULL, &sh);
    }
    if (to >= 0) {
      ia[1] = to;
      ax_set(&sh, a, to);
      id = emit(S, IR_OP_SHARD_SLICE, &id, 1, ia, NULL, NULL, NULL, &sh);
    }
  }
  S->why = saved;
  *from = sh;
  return id;
}

static int conv(Sh *S, int v, const IrSharding *want);

/* A replicated FULL or BROADCAST asked for a split is re-made at the local
 * shape instead of built whole and sliced. */
static int remake_local(Sh *S, int v, const IrSharding *want) {
  const IrNode *n = onode(S, v);
  if (n->op != IR_OP_FULL && n->op != IR_OP_BROADCAST) return -2;
  if (!ir_sharding_is_none(&S->sh[v]) || want->partial) return -2;
  IrType lt = local_type(S, gtype(S, v), want);
  if (n->op == IR_OP_FULL) return emit(S, IR_OP_FULL, NULL, 0, NULL, n->fa, NULL, &lt, want);
  /* broadcast: the input dims that keep a split take it along */
  int x = n->in[0];
  const IrType *xt = &onode(S, x)->type;
  int off = n->type.rank - xt->rank;
  IrSharding xs = {0};
  for (int d = 0; d < xt->rank; d++)
    if (xt->dim[d] != 1) xs.split[d] = want->split[d + off];
  int xi = conv(S, x, &xs);
  return emit(S, IR_OP_BROADCAST, &xi, 1, NULL, NULL, NULL, &lt, want);
}

static int reshape_map(const IrType *in, const IrType *out, int d, int k);

/* Old value v = reshape(x) wanted in a layout that only gathers some of
 * its splits, or reduces some of its partial sums, when x has such a copy
 * for those axes already: that copy's id (its reshape is v in `want`, no
 * bytes moved: a layer input gathered for the forward matmul serves the
 * weight gradient's reshaped read of it; a key / value gradient
 * reduce-scattered for its projection serves its weight gradient), else
 * -1. */
static int reshape_gathered_src(const Sh *S, int v, const IrSharding *want) {
  const IrNode *n = onode(S, v);
  if (n->op != IR_OP_RESHAPE || want->partial) return -1;
  int x = n->in[0];
  IrType xt = gtype(S, x), vt = gtype(S, v);
  IrSharding wx = S->sh[x];
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    int sv = ax_get(&S->sh[v], a), sw = ax_get(want, a), sx = ax_get(&S->sh[x], a);
    int k = ir_axis_size(S->m, (IrAxis)a);
    if (sw == sv) {   /* kept: x's layout must reshape to it */
      if ((sx < 0 ? sx : reshape_map(&xt, &vt, sx, k)) != sw) return -1;
    } else if (sw == AX_R && (sv >= 0 || sv == AX_P)) {
      ax_set(&wx, a, AX_R);
    } else if (sv == AX_P && sw >= 0 && sx == AX_P) {   /* reduce-scattered: along the x dim that maps to sw */
      int dx = -1;
      for (int d = 0; d < xt.rank && dx < 0; d++)
        if (!S->sh[x].split[d] && reshape_map(&xt, &vt, d, k) == sw) dx = d;
      if (dx < 0) return -1;
      ax_set(&wx, a, dx);
    } else {
      return -1;
    }
  }
  for (int i = 0; i < S->conv[x].n; i++)
    if (ir_sharding_equal(&S->conv[x].a[i].sh, &wx)) return S->conv[x].a[i].id;
  return -1;
}

/* reshape_gathered_src's reshape, emitted; -2 when it does not apply. */
static int reshape_gathered(Sh *S, int v, const IrSharding *want) {
  int src = reshape_gathered_src(S, v, want);
  if (src < 0) return -2;
  IrType lt = local_type(S, gtype(S, v), want);
  return emit(S, IR_OP_RESHAPE, &src, 1, NULL, NULL, NULL, &lt, want);
}

/* The axes of `keep` (merged-row axes of v, Sh.scr) along which `want`
 * keeps v's merged order: their split unchanged, no other axis changing a
 * split of the merged dim, and none of v's other merged axes splitting it
 * again (they are gathered through the source).  0 when none. */
static uint8_t scr_kept(const Sh *S, int v, const IrSharding *want, uint8_t keep) {
  int md = -1;
  uint8_t k = 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (S->scr[v] & BIT(a)) {
      md = ax_get(&S->sh[v], a);
      if ((keep & BIT(a)) && ax_get(want, a) == md) k |= BIT(a);
    }
  for (int a = 0; a < IR_AXIS_COUNT; a++) {   /* merged axes not kept are gathered through the source */
    int f = ax_get(&S->sh[v], a), t = ax_get(want, a);
    if (k & BIT(a)) continue;
    if ((S->scr[v] & BIT(a)) ? t == md : (f != t && (f == md || t == md))) return 0;
  }
  return k;
}

/* Merged-row value v (a reshape) made whole along its merged axes but
 * `keep`: its source gathered along them and reshaped (the rows of the
 * axes kept stay in merged order).  *cur: the result's layout. */
static int scr_gathered(Sh *S, int v, uint8_t keep, IrSharding *cur) {
  int x = onode(S, v)->in[0];
  IrSharding wx = S->scr_src[v];
  *cur = S->sh[v];
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if ((S->scr[v] & ~keep) & BIT(a)) {
      ax_set(&wx, a, AX_R);
      ax_set(cur, a, AX_R);
    }
  int xi = conv(S, x, &wx);
  if (xi < 0) return -1;
  IrType lt = local_type(S, gtype(S, v), cur);
  return emit(S, IR_OP_RESHAPE, &xi, 1, NULL, NULL, NULL, &lt, cur);
}

/* Old value v in layout `want`: the canonical value, or a cached or new
 * conversion of it.  For a value in merged-row order (Sh.scr), `keep` says
 * along which of its merged axes the use reduces over the rows in that
 * order (scr_use); along the others `want` has its ordinary meaning. */
static int conv_ex(Sh *S, int v, const IrSharding *want, uint8_t keep) {
  if (S->failed) return -1;
  keep = S->scr[v] ? scr_kept(S, v, want, keep) : 0;
  if (keep == S->scr[v] && ir_sharding_equal(&S->sh[v], want)) return S->nv[v];
  for (int i = 0; i < S->conv[v].n; i++)
    if (ir_sharding_equal(&S->conv[v].a[i].sh, want) && S->conv[v].a[i].keep == keep) return S->conv[v].a[i].id;
  int id = S->scr[v] ? -2 : remake_local(S, v, want);
  if (id == -2 && !S->scr[v]) id = reshape_gathered(S, v, want);
  if (id == -2) {
    /* Several axes may split one dim (outer axis major), so the order
     * matters: splits are removed inner axis first and added outer axis
     * first; an inner split on a dim whose outer splits change is removed
     * and added back around the change. */
    IrSharding cur = S->sh[v];
    id = S->nv[v];
    if (S->scr[v]) id = scr_gathered(S, v, keep, &cur);
    int from[IR_AXIS_COUNT], to[IR_AXIS_COUNT], force[IR_AXIS_COUNT] = {0};
    for (int a = 0; a < IR_AXIS_COUNT; a++) { from[a] = ax_get(&cur, a); to[a] = ax_get(want, a); }
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      if (from[a] == to[a]) continue;
      for (int b = a + 1; b < IR_AXIS_COUNT; b++)
        if ((from[a] >= 0 && from[b] == from[a]) || (to[a] >= 0 && from[b] == to[a])) force[b] = 1;
    }
    for (int a = IR_AXIS_COUNT - 1; a >= 0 && id >= 0; a--)        /* remove, inner first */
      if ((from[a] != to[a] || force[a]) && from[a] >= 0) id = conv_axis(S, v, id, &cur, a, AX_R);
      else if (from[a] == AX_P && to[a] == AX_R) id = conv_axis(S, v, id, &cur, a, AX_R);
    for (int a = 0; a < IR_AXIS_COUNT && id >= 0; a++)             /* add, outer first */
      if (ax_get(&cur, a) != to[a]) id = conv_axis(S, v, id, &cur, a, to[a]);
  }
  if (id >= 0) VEC_PUSH(S->conv[v], ((ConvEntry){*want, id, keep}));
  return id;
}
static int conv(Sh *S, int v, const IrSharding *want) { return conv_ex(S, v, want, 0xff); }

/* ---------------- per-axis rules ---------------- */

/* The axes this pass shards along (size > 1). */
static int active(const Sh *S, int a) {
  return (a == IR_AXIS_TP && S->T > 1) || (a == IR_AXIS_CP && S->C > 1) ||
         (a == IR_AXIS_EP && ir_axis_size(S->m, IR_AXIS_EP) > 1);
}

/* Product of the sizes of the axes in mask. */
static int64_t axes_size(const Sh *S, unsigned mask) {
  int64_t k = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (mask & BIT(a)) k *= ir_axis_size(S->m, (IrAxis)a);
  return k;
}

/* Where a partial value goes when nothing asks for a layout: all-reduce,
 * or with sequence parallelism a reduce-scatter along the sequence dim.
 * Under cp likewise a reduce-scatter along a whole sequence dim (a key /
 * value gradient under --cp-attn allgather: the rest of the backward runs
 * on the rank's part of the sequence); the sequence must hold two chunks
 * per cp rank (the causal load-balancing layout). */
static int resolve_default(const Sh *S, int v, int a) {
  IrType t = gtype(S, v);
  if (a == IR_AXIS_CP && S->C > 1) {
    for (int d = 0; d < t.rank; d++)
      if (t.dname[d] && t.dname[d] == S->seq_name && !S->sh[v].split[d] && t.dim[d] % (2 * S->C) == 0) return d;
    return AX_R;
  }
  if (!(S->sp && a == IR_AXIS_TP)) return AX_R;
  for (int d = 0; d < t.rank; d++) {
    uint8_t by = S->sh[v].split[d];
    if (t.dname[d] && t.dname[d] == S->seq_name && !(by & BIT(a)) && (t.dim[d] / axes_size(S, by)) % S->T == 0)
      return d;
  }
  return AX_R;
}

/* True if old value v is a parameter seen through reshapes/permutes: the
 * operand to keep in place when a matmul must gather one side. */
static int is_weight(const Sh *S, int v) {
  for (;;) {
    const IrNode *n = onode(S, v);
    if (n->op == IR_OP_STATE) return 1;
    if (n->op != IR_OP_RESHAPE && n->op != IR_OP_PERMUTE) return 0;
    v = n->in[0];
  }
}

/* Reshape in -> out as groups of in-dims [g[0], g[1]) becoming out-dims
 * [g[2], g[3]) of equal size: the group holding in-dim d (d >= 0) or else
 * out-dim od.  0, or -1 when there is none. */
static int reshape_group(const IrType *in, const IrType *out, int d, int od, int g[4]) {
  int i = 0, j = 0;
  while (i < in->rank && j < out->rank) {
    int i0 = i, j0 = j;
    int64_t pi = in->dim[i++], pj = out->dim[j++];
    while (pi != pj) {
      if (pi < pj) { if (i >= in->rank) return -1; pi *= in->dim[i++]; }
      else { if (j >= out->rank) return -1; pj *= out->dim[j++]; }
    }
    /* trailing size-1 dims join this group */
    while (i < in->rank && in->dim[i] == 1 && (j >= out->rank || out->dim[j] != 1)) i++;
    if (d >= 0 ? (d >= i0 && d < i) : (od >= j0 && od < j)) {
      g[0] = i0, g[1] = i, g[2] = j0, g[3] = j;
      return 0;
    }
  }
  return -1;
}

/* Reshape: the output dim carrying in-dim d's split (d must be the major
 * dim of its group and the matching output major dim divisible by k), or
 * -1.  in / out are global types. */
static int reshape_map(const IrType *in, const IrType *out, int d, int k) {
  int g[4];
  if (reshape_group(in, out, d, -1, g)) return -1;
  int mi = g[0], mj = g[2];
  while (mi < g[1] && in->dim[mi] == 1) mi++;
  while (mj < g[3] && out->dim[mj] == 1) mj++;
  if (d != mi || mj >= g[3] || out->dim[mj] % k) return -1;
  return mj;
}

/* Reshape: the one output dim (besides 1s) that the group of in-dims
 * holding d becomes, or -1; [*i0, *i1): the group.  Where reshape_map
 * finds no dim for d's split (d not the group's major dim), this is where
 * merged rows put it (Sh.scr). */
static int reshape_merge_dim(const IrType *in, const IrType *out, int d, int *i0_, int *i1_) {
  int g[4], mj = -1;
  if (reshape_group(in, out, d, -1, g)) return -1;
  for (int jj = g[2]; jj < g[3]; jj++)
    if (out->dim[jj] != 1) { if (mj >= 0) return -1; mj = jj; }
  if (i0_) *i0_ = g[0];
  if (i1_) *i1_ = g[1];
  return mj;
}

/* The dim matmul node i contracts in its operand k. */
static int matmul_kdim(const Sh *S, int i, int k) {
  const IrNode *n = onode(S, i);
  int r = onode(S, n->in[k])->type.rank, t = (int)n->ia[k];
  return k == 0 ? (t ? r - 2 : r - 1) : (t ? r - 1 : r - 2);
}

/* The merged dim of merged-row value v: where its merged axes split it
 * (-1 when they split two dims). */
static int scr_dim(const Sh *S, int v) {
  int md = -1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (S->scr[v] & BIT(a)) {
      if (md >= 0 && ax_get(&S->sh[v], a) != md) return -1;
      md = ax_get(&S->sh[v], a);
    }
  return md;
}

/* Merged-row values u and v, operands of one matmul, hold their rows in the
 * same order once each is gathered along its merged axes outside `keep`:
 * their sources merge the same dims, split alike but for those axes. */
static int scr_same_order(const Sh *S, int u, int v, uint8_t keep) {
  int xu = onode(S, u)->in[0], xv = onode(S, v)->in[0];
  IrType tu = gtype(S, xu), tv = gtype(S, xv), ou = gtype(S, u), ov = gtype(S, v);
  uint8_t gu = S->scr[u] & ~keep, gv = S->scr[v] & ~keep;
  int a = 0;
  while (!(keep & BIT(a))) a++;
  int du = ax_get(&S->scr_src[u], a), dv = ax_get(&S->scr_src[v], a), u0, u1, v0, v1;
  if (du < 0 || dv < 0) return 0;
  if (reshape_merge_dim(&tu, &ou, du, &u0, &u1) < 0 || reshape_merge_dim(&tv, &ov, dv, &v0, &v1) < 0) return 0;
  if (du - u0 != dv - v0 || u1 - u0 != v1 - v0) return 0;
  for (int k = 0; k < u1 - u0; k++)
    if (tu.dim[u0 + k] != tv.dim[v0 + k] ||
        (S->scr_src[u].split[u0 + k] & ~gu) != (S->scr_src[v].split[v0 + k] & ~gv)) return 0;
  return 1;
}

/* The merged axes along which node i reduces its merged-row operand k in
 * merged order (Sh.scr): all of them for a sum or mean over the merged
 * dim; for a matmul contracting it, those the other operand has merged
 * the same way (the rest are gathered first); 0: the use sees the value
 * in its ordinary meaning. */
static uint8_t scr_use(const Sh *S, int i, int k) {
  const IrNode *n = onode(S, i);
  int v = n->in[k], md = scr_dim(S, v);
  if (md < 0) return 0;
  if ((n->op == IR_OP_SUM || n->op == IR_OP_MEAN) && k == 0) return n->ia[0] == md ? S->scr[v] : 0;
  if (n->op != IR_OP_MATMUL || k > 1) return 0;
  int u = n->in[1 - k];
  if (!S->scr[u] || scr_dim(S, u) < 0) return 0;
  int Kv = matmul_kdim(S, i, k), Ku = matmul_kdim(S, i, 1 - k);
  uint8_t keep = S->scr[u] & S->scr[v];
  if (!keep || Kv != md || scr_dim(S, u) != Ku || !scr_same_order(S, u, v, keep)) return 0;
  return keep;
}

/* The group of in-dims [*i0, *i1) that reshape in -> out merges into
 * output dim od (its group's one dim other than 1), or -1. */
static int merge_group_of(const IrType *in, const IrType *out, int od, int *i0_, int *i1_) {
  int g[4];
  if (reshape_group(in, out, -1, od, g)) return -1;
  for (int jj = g[2]; jj < g[3]; jj++)
    if (jj != od && out->dim[jj] != 1) return -1;
  *i0_ = g[0];
  *i1_ = g[1];
  return 0;
}

/* Matmul node i reads merged-row value v = in[k] (contracting its merged
 * dim) and an ordinary reshape u = in[1 - k] of the same merged dims that
 * no merged axis of v splits (replicated, or partial: a key / value
 * gradient under --cp-attn allgather).  Then u can be merged on demand
 * (scr_merge): its source split (sliced, or reduce-scattered) as v's
 * source is along v's merged axes, and reshaped, holding its rows in v's
 * order.  Returns v's merged axes, or 0. */
static uint8_t scr_pairable(const Sh *S, int i, int k) {
  const IrNode *n = onode(S, i);
  if (n->op != IR_OP_MATMUL || k > 1) return 0;
  int v = n->in[k], u = n->in[1 - k], md = scr_dim(S, v);
  if (md < 0 || S->scr[u] || onode(S, u)->op != IR_OP_RESHAPE) return 0;
  int Kv = matmul_kdim(S, i, k), Ku = matmul_kdim(S, i, 1 - k);
  int xu = onode(S, u)->in[0], xv = onode(S, v)->in[0], u0, u1, v0, v1;
  if (Kv != md || S->taint[xu]) return 0;
  IrType tu_ = gtype(S, xu), tv_ = gtype(S, xv), ou = gtype(S, u), ov = gtype(S, v);
  if (merge_group_of(&tu_, &ou, Ku, &u0, &u1) < 0 || merge_group_of(&tv_, &ov, md, &v0, &v1) < 0) return 0;
  if (u1 - u0 != v1 - v0) return 0;
  for (int g = 0; g < u1 - u0; g++)
    if (tu_.dim[u0 + g] != tv_.dim[v0 + g] ||
        S->sh[xu].split[u0 + g] != (S->scr_src[v].split[v0 + g] & (uint8_t)~S->scr[v])) return 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (S->scr[v] & BIT(a)) {
      int d = ax_get(&S->scr_src[v], a);
      if (d < v0 || d >= v1 || ax_get(&S->sh[xu], a) >= 0 || ax_get(&S->sh[u], a) >= 0) return 0;
    }
  return S->scr[v];
}

/* scr_pairable's u in layout `want` (its merged axes split along the
 * contracted dim), its rows in v's merged order: the source converted to
 * v's source's split along those axes, then reshaped. */
static int scr_merge(Sh *S, int u, int v, const IrSharding *want, uint8_t axes) {
  for (int i = 0; i < S->conv[u].n; i++)
    if (ir_sharding_equal(&S->conv[u].a[i].sh, want) && S->conv[u].a[i].keep == axes) return S->conv[u].a[i].id;
  int xu = onode(S, u)->in[0], xv = onode(S, v)->in[0], u0, u1, v0, v1;
  IrType tu = gtype(S, xu), tv = gtype(S, xv), ou = gtype(S, u), ov = gtype(S, v);
  int Ku = -1;
  for (int a = 0; a < IR_AXIS_COUNT && Ku < 0; a++)
    if (axes & BIT(a)) Ku = ax_get(want, a);
  if (Ku < 0 || merge_group_of(&tu, &ou, Ku, &u0, &u1) < 0 || merge_group_of(&tv, &ov, scr_dim(S, v), &v0, &v1) < 0)
    return sh_fail(S, "internal error: merged rows of %%%d for %%%d", u, v);
  IrSharding wx = S->sh[xu];
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (axes & BIT(a)) ax_set(&wx, a, u0 + ax_get(&S->scr_src[v], a) - v0);
  int xi = conv(S, xu, &wx);
  if (xi < 0) return -1;
  IrType lt = local_type(S, ou, want);
  int id = emit(S, IR_OP_RESHAPE, &xi, 1, NULL, NULL, NULL, &lt, want);
  if (id >= 0) VEC_PUSH(S->conv[u], ((ConvEntry){*want, id, axes}));
  return id;
}

/* Sh.red: for each value, the dims every use reduces over (a sum or mean
 * over the dim, a matmul contracting it). */
static void compute_red(Sh *S) {
  int n = S->ob.n;
  memset(S->red, 0xff, (size_t)(n + 1));
  for (int i = 0; i < n; i++) {
    const IrNode *nd = onode(S, i);
    for (int k = 0; k < nd->nin; k++) {
      int v = nd->in[k];
      uint8_t r = 0;
      if ((nd->op == IR_OP_SUM || nd->op == IR_OP_MEAN) && k == 0 && nd->ia[0] >= 0 && nd->ia[0] < 8)
        r = BIT(nd->ia[0]);
      else if (nd->op == IR_OP_MATMUL && k < 2) {
        int rk = onode(S, v)->type.rank, t = (int)nd->ia[k];
        int K = k == 0 ? (t ? rk - 2 : rk - 1) : (t ? rk - 1 : rk - 2);
        if (K >= 0 && K < 8) r = BIT(K);
      }
      if (v >= 0 && v < n) S->red[v] &= r;
    }
  }
}

/* Elementwise ops whose result is a partial sum when some operands are
 * (linear in them, the others replicated). */
static int ew_partial_ok(IrOp op, const int *st, int nin) {
  int np = 0, nr = 0;
  for (int k = 0; k < nin; k++) { np += st[k] == AX_P; nr += st[k] == AX_R; }
  if (!np) return 0;
  switch (op) {
  case IR_OP_ADD: case IR_OP_SUB: return np == nin;
  case IR_OP_MUL: return np == 1 && nr == 1;
  case IR_OP_DIV: return st[0] == AX_P && st[1] == AX_R;
  case IR_OP_MULS: case IR_OP_NEG: case IR_OP_CAST: return 1;
  default: return 0;
  }
}

/* Bytes a rank sends per run of the block to have old value v replicated
 * along axis a: (n-1)/n of the gathered tensor (a ring all-gather), 0 when
 * it is already replicated or a replicated copy exists (conv caches it:
 * the forward's gather serves the backward). */
static double gather_bytes(const Sh *S, int v, int a) {
  IrSharding want = S->sh[v];
  ax_set(&want, a, AX_R);
  if (ir_sharding_equal(&S->sh[v], &want)) return 0;
  for (int i = 0; i < S->conv[v].n; i++)
    if (ir_sharding_equal(&S->conv[v].a[i].sh, &want)) return 0;
  if (reshape_gathered_src(S, v, &want) >= 0) return 0;
  IrType t = local_type(S, gtype(S, v), &want);
  double n = (double)ir_axis_size(S->m, (IrAxis)a);
  return (n - 1) / n * (double)ir_type_numel(&t) * (double)ir_dtype_size(t.dtype);
}

/* Matmul node i, operands split on axis a along dims sa and sb that
 * conflict: whether gathering a is cheaper than gathering b, in bytes
 * sent.  A side whose gather leaves the contraction dim split in the
 * other operand makes the result a partial sum, which costs at least a
 * reduce-scatter of the result later ((n-1)/n of it, per run: a weight
 * gradient is reduced into its state's layout every micro batch).  Ties
 * gather b. */
static int matmul_gather_a(const Sh *S, int i, int a, int sa, int sb, double *ca, double *cb) {
  const IrNode *n = onode(S, i);
  const IrType *at = &onode(S, n->in[0])->type, *bt = &onode(S, n->in[1])->type;
  int aK = n->ia[0] ? at->rank - 2 : at->rank - 1, bK = n->ia[1] ? bt->rank - 1 : bt->rank - 2;
  IrSharding osh = {0};
  IrType ot = local_type(S, gtype(S, i), &osh);
  double nn = (double)ir_axis_size(S->m, (IrAxis)a);
  double partial = (nn - 1) / nn * (double)ir_type_numel(&ot) * (double)ir_dtype_size(ot.dtype);
  double cost_a = gather_bytes(S, n->in[0], a) + (sb == bK ? partial : 0);
  double cost_b = gather_bytes(S, n->in[1], a) + (sa == aK ? partial : 0);
  *ca = cost_a;
  *cb = cost_b;
  return cost_a < cost_b;
}

/* The rule of node i along axis a: st[] operand states -> want[] and *out.
 * Returns 0, or -1 after sh_fail. */
static int rule(Sh *S, int i, int a, const int *st, int *want, int *out) {
  const IrNode *n = onode(S, i);
  int nin = n->nin;
  for (int k = 0; k < nin; k++) want[k] = st[k];
  *out = AX_R;
  const IrOpInfo *info = &ir_ops[n->op];
  switch (n->op) {
  case IR_OP_INPUT: case IR_OP_FULL: case IR_OP_STATE: case IR_OP_ARANGE: case IR_OP_RAND:
    *out = AX_R;          /* states: set by the caller; arange / rand compute from global indices */
    return 0;
  case IR_OP_GATHER: case IR_OP_GATHER_BWD: {
    /* gather(x, idx): a split of idx (any dim) or of x (not the gather
     * axis) is the result's; x is read whole along the axis.  gather_bwd
     * (idx, dy) -> dx: split off the axis stays split; idx split along the
     * axis scatters into all of dx, a partial sum. */
    int ax = (int)n->ia[0], bwd = n->op == IR_OP_GATHER_BWD;
    int ix = bwd ? 0 : 1, t = st[ix] >= 0 ? st[ix] : AX_R;
    if (t == AX_R && st[1 - ix] >= 0 && st[1 - ix] != ax) t = st[1 - ix];
    if (bwd) {
      want[0] = want[1] = t;
      *out = t == ax ? AX_P : t;
    } else {
      want[0] = t == ax ? AX_R : t;
      want[1] = t;
      *out = t;
    }
    return 0;
  }
  case IR_OP_RESHAPE: {
    if (st[0] == AX_P || st[0] == AX_R) { *out = st[0]; return 0; }
    IrType in = gtype(S, n->in[0]), o = gtype(S, i);
    int d = reshape_map(&in, &o, st[0], ir_axis_size(S->m, (IrAxis)a));
    if (d < 0) {
      /* merged rows (Sh.scr), when every use reduces over them: along cp
       * (along tp under sp a weight gradient reads its input gathered) */
      int md = reshape_merge_dim(&in, &o, st[0], NULL, NULL);
      if (a == IR_AXIS_CP && md >= 0 && md < 8 && (S->red[i] & BIT(md)) && !S->taint[n->in[0]]) {
        S->scr[i] |= BIT(a);
        *out = md;
        return 0;
      }
      want[0] = AX_R;
      *out = AX_R;
    } else *out = d;
    return 0;
  }
  case IR_OP_PERMUTE:
    if (st[0] >= 0) {
      for (int d = 0; d < n->type.rank; d++)
        if (n->ia[d] == st[0]) *out = d;
    } else *out = st[0];
    return 0;
  case IR_OP_BROADCAST:
    *out = st[0] >= 0 ? st[0] + (n->type.rank - onode(S, n->in[0])->type.rank) : st[0];
    return 0;
  case IR_OP_SUM_TO: {
    if (st[0] < 0) { *out = st[0]; return 0; }
    const IrType *xt = &onode(S, n->in[0])->type;
    int d = st[0] - (xt->rank - n->type.rank);
    *out = (d >= 0 && n->type.dim[d] == xt->dim[st[0]]) ? d : AX_P;
    return 0;
  }
  case IR_OP_SLICE: case IR_OP_PAD: case IR_OP_CONCAT: {
    int ax = (int)n->ia[0], split = -1, np = 0;
    for (int k = 0; k < nin; k++) { if (st[k] >= 0 && split < 0) split = st[k]; np += st[k] == AX_P; }
    if (split == ax) split = -1;
    int t = split >= 0 ? split : (np == nin ? AX_P : AX_R);
    for (int k = 0; k < nin; k++) want[k] = t;
    *out = t;
    return 0;
  }
  case IR_OP_SUM: case IR_OP_MEAN: case IR_OP_MAX: {
    int ax = (int)n->ia[0], keep = (int)n->ia[1];
    if (st[0] == AX_P) {
      if (n->op == IR_OP_MAX) { want[0] = resolve_default(S, n->in[0], a); if (want[0] == ax) want[0] = AX_R; }
      else { *out = AX_P; return 0; }
    }
    int s = want[0];
    if (s < 0) { *out = s; return 0; }
    if (s == ax) *out = n->op == IR_OP_MAX ? AX_R : AX_P;   /* max: all_reduce(max) after; mean: scaled */
    else *out = (keep || s < ax) ? s : s - 1;
    return 0;
  }
  case IR_OP_SUMSQ:
    if (st[0] == AX_P) want[0] = resolve_default(S, n->in[0], a);
    *out = want[0] >= 0 ? AX_P : AX_R;
    return 0;
  case IR_OP_MATMUL: {
    const IrType *at = &onode(S, n->in[0])->type, *bt = &onode(S, n->in[1])->type;
    int ra = at->rank, rb = bt->rank, ro = n->type.rank;
    int ta = (int)n->ia[0], tb = (int)n->ia[1];
    int aM = ta ? ra - 1 : ra - 2, aK = ta ? ra - 2 : ra - 1;
    int bK = tb ? rb - 1 : rb - 2, bN = tb ? rb - 2 : rb - 1;
    int sa = st[0], sb = st[1];
    /* partial sums: linear in each operand separately.  Under cp a partial
     * a that is smaller than the result (a key / value gradient times its
     * projection) is reduce-scattered along its sequence first: the bytes
     * of a, not of the result, and the product on the rank's rows. */
    if (sa == AX_P && sb == AX_R) {
      int d = a == IR_AXIS_CP ? resolve_default(S, n->in[0], a) : AX_R;
      IrType gat = gtype(S, n->in[0]), got = gtype(S, i);
      if (d < 0 || d == aK || ir_type_numel(&gat) >= ir_type_numel(&got)) { *out = AX_P; return 0; }
      sa = d;
    }
    if (sb == AX_P && sa == AX_R) { *out = AX_P; return 0; }
    if (sa == AX_P) sa = resolve_default(S, n->in[0], a);
    if (sb == AX_P) sb = resolve_default(S, n->in[1], a);
    /* roles: 'B'atch i, 'M', 'K', 'N' */
    for (int pass = 0; pass < 2; pass++) {
      char ra_ = sa == AX_R ? 'R' : sa == aM ? 'M' : sa == aK ? 'K' : 'B';
      char rb_ = sb == AX_R ? 'R' : (rb > 2 && sb < rb - 2) ? 'B' : sb == bK ? 'K' : sb == bN ? 'N' : '?';
      int ok = 1;
      if (ra_ == 'R' && rb_ == 'R') *out = AX_R;
      else if (ra_ == 'B' && (rb_ == 'R' || (rb_ == 'B' && sb == sa))) { if (rb > 2) sb = sa; *out = sa; }
      else if (ra_ == 'R' && rb_ == 'B') { sa = sb; *out = sb; }
      else if (ra_ == 'M' && rb_ == 'R') *out = ro - 2;
      else if (ra_ == 'R' && rb_ == 'N') *out = ro - 1;
      else if (ra_ == 'K' && rb_ == 'K') *out = AX_P;
      else if (ra_ == 'K' && rb_ == 'R') { sb = bK; *out = AX_P; }
      else if (ra_ == 'R' && rb_ == 'K') { sa = aK; *out = AX_P; }
      else ok = 0;
      if (ok) { want[0] = sa; want[1] = sb; return 0; }
      /* conflict: gather one side.  Parameters stay in place (gather the
       * activation: sequence-parallel input of a column-parallel weight);
       * between two activations the cheaper in bytes sent (matmul_gather_a),
       * else b (attention under context parallelism: each rank keeps its
       * queries, gathers keys / values). */
      int wa = is_weight(S, n->in[0]), wb = is_weight(S, n->in[1]);
      double ca = 0, cb = 0;
      int ga = wb && !wa ? 1 : wa && !wb ? 0 : matmul_gather_a(S, i, a, sa, sb, &ca, &cb);
      char note[256];
      if (wa != wb)
        snprintf(note, sizeof note, "the operands' splits conflict over %s and a parameter stays in place: "
                 "the matmul gathers its %s operand", ir_axis_name((IrAxis)a), ga ? "first" : "second");
      else
        snprintf(note, sizeof note, "the operands' splits conflict over %s: gathering the first sends %.0f bytes, "
                 "the second %.0f (a side that leaves the result partial counts its reduce-scatter; a gathered "
                 "copy already made costs 0): the matmul gathers its %s operand", ir_axis_name((IrAxis)a), ca, cb,
                 ga ? "first" : "second");
      S->note = ts_intern(note);
      S->note_at = i;
      if (ga) sa = AX_R; else sb = AX_R;
    }
    return sh_fail(S, "internal error: no layout for matmul %%%d", i);
  }
  case IR_OP_SOFTMAX: case IR_OP_LOG_SOFTMAX: case IR_OP_LAYERNORM: case IR_OP_RMSNORM:
  case IR_OP_SOFTMAX_BWD: case IR_OP_LOG_SOFTMAX_BWD: case IR_OP_LAYERNORM_BWD: case IR_OP_RMSNORM_BWD:
  case IR_OP_ROPE: case IR_OP_CAUSAL_MASK: case IR_OP_DROPOUT: case IR_OP_MASKED_FILL: case IR_OP_TOPK_MASK: {
    /* elementwise-like, no partial sums; the normalized / rotated last
     * dim must be whole */
    int last = n->type.rank - 1, t = AX_R, p = -1;
    for (int k = 0; k < nin; k++) {
      if (st[k] >= 0 && t == AX_R) t = st[k];
      if (st[k] == AX_P && p < 0) p = k;
    }
    int whole_last = n->op != IR_OP_CAUSAL_MASK && n->op != IR_OP_DROPOUT && n->op != IR_OP_MASKED_FILL;
    if (t == last && whole_last) t = AX_R;
    if (t == AX_R && p >= 0) { t = resolve_default(S, n->in[p], a); if (t == last && whole_last) t = AX_R; }
    for (int k = 0; k < nin; k++) want[k] = t;
    *out = t;
    return 0;
  }
  case IR_OP_CAPACITY_MASK: {
    /* keep [..., E]: each expert column counts its tokens in order, so the
     * token (leading) dims are gathered (the mask is small: tokens x
     * experts); the expert dim may stay split (columns are independent). */
    *out = (st[0] == AX_P || (st[0] >= 0 && st[0] < n->type.rank - 1)) ? AX_R : st[0];   /* gather the tokens */
    want[0] = *out;
    return 0;
  }
  case IR_OP_EMBEDDING: {
    /* table [V, C], ids [...] */
    int stab = st[0] == AX_P ? AX_R : st[0];
    want[0] = stab;
    if (stab == 0) { want[1] = AX_R; *out = AX_P; return 0; }            /* vocab-parallel */
    if (stab == 1) { want[1] = AX_R; *out = n->type.rank - 1; return 0; }
    *out = st[1];                                                        /* ids' own split */
    return 0;
  }
  case IR_OP_EMBEDDING_BWD: {
    /* ids [...], dy [..., C] -> [V, C]: made in the layout its user wants */
    int h = S->has_hint[i] ? ax_get(&S->hint[i], a) : AX_R;
    int rdy = onode(S, n->in[1])->type.rank;
    if (h == 0) { want[0] = AX_R; want[1] = AX_R; *out = 0; return 0; }
    if (h == 1) { want[0] = AX_R; want[1] = rdy - 1; *out = 1; return 0; }
    if (st[1] == rdy - 1) { want[0] = AX_R; *out = 1; return 0; }
    if (st[1] >= 0) { want[0] = st[1]; *out = AX_P; return 0; }          /* tokens split: partial table */
    *out = st[1] == AX_P ? AX_P : AX_R;
    return 0;
  }
  case IR_OP_CROSS_ENTROPY: case IR_OP_CROSS_ENTROPY_BWD: {
    int last = onode(S, n->in[0])->type.rank - 1;
    int sl = st[0] == AX_P ? AX_R : st[0];
    want[0] = sl;
    int lead = sl >= 0 && sl < last ? sl : AX_R;
    want[1] = lead;                                   /* targets follow the token dims */
    if (n->op == IR_OP_CROSS_ENTROPY_BWD) want[2] = lead;
    *out = n->op == IR_OP_CROSS_ENTROPY ? lead : sl;
    return 0;
  }
  case IR_OP_ATTENTION: case IR_OP_ATTENTION_BWD: {
    /* q [B, Hq, Tq, D], k / v [B, Hkv, Tk, D] (bwd: o, do like q).  Batch
     * and heads split like batch dims (kv heads with the query heads);
     * the sequence (dim 2) of the queries is a block of rows: along cp
     * with the ring or all-to-all (S->cp_ring) k / v are blocks too and
     * shard_node lowers the node into ring steps (lower_ring) or
     * all-to-all exchanges around it (lower_a2a), else k / v are
     * gathered and dk / dv come out partial.  head_dim stays whole.  The
     * document ids [B, T] (last operand, when there) follow the batch
     * split and are whole along the sequence: the kernels index them by
     * global position. */
    int base = ir_attn_base(n), slope = ir_attn_slope(n), doc = ir_attn_doc(n), bias = ir_attn_bias(n);
    int t = AX_R, ring = a == IR_AXIS_CP && S->cp_ring, part = n->op == IR_OP_ATTENTION_BWD ? (int)n->ia[1] : 0;
    for (int k = 0; k < base && t == AX_R; k++)
      if (st[k] >= 0 && st[k] <= 2) t = st[k];
    if (t == 1) {
      int64_t hk = onode(S, n->in[1])->type.dim[1], sz = ir_axis_size(S->m, (IrAxis)a);
      if (hk % sz)
      {
        char ok[256];
        return sh_fail(S, "attention: kv heads = %lld are not divisible by %s = %lld (query heads split over %s "
                       "need their kv heads split with them); the %s sizes that divide them: %s", (long long)hk,
                       ir_axis_name((IrAxis)a), (long long)sz, ir_axis_name((IrAxis)a), ir_axis_name((IrAxis)a),
                       sizes_dividing(hk, 1, ok, sizeof ok));
      }
    }
    if (bias >= 0 && (a == IR_AXIS_CP || t == 2) && ir_axis_size(S->m, (IrAxis)a) > 1)
      return sh_fail(S, "attention with a score bias (nn.attention's score_bias:, [heads, queries, keys], e.g. "
                     "T5's relative positions) cannot split its sequence over %s = %lld: the bias is indexed by "
                     "local query and key rows, which context parallelism (ring, all-gather, all-to-all) moves "
                     "between ranks; use cp 1 (tp splits the bias over heads, dp over nothing: both work)", ir_axis_name((IrAxis)a), (long long)ir_axis_size(S->m, (IrAxis)a));
    for (int k = 0; k < base; k++) want[k] = (t == 2 && (k == 1 || k == 2) && !ring) ? AX_R : t;
    if (slope >= 0) want[slope] = AX_R;   /* every head's slope: the kernels index them by global head */
    if (doc >= 0) want[doc] = t == 0 ? 0 : AX_R;
    /* the score bias [Hb, Tq, Tk]: split with the query heads (whole when
     * one head serves all); dbias sums over the batch (and the heads when
     * Hb = 1), so a split of either leaves each rank a partial sum */
    int bias_heads = bias >= 0 && onode(S, n->in[bias])->type.dim[0] > 1;
    if (bias >= 0) want[bias] = t == 1 && bias_heads ? 0 : AX_R;
    if (part == 3) {
      *out = t == 1 && bias_heads ? 0 : t == 0 || t == 1 ? AX_P : AX_R;
      return 0;
    }
    *out = (t == 2 && part > 0 && !ring) ? AX_P : t;
    return 0;
  }
  case IR_OP_MOE_COUNTS: case IR_OP_MOE_PERM: case IR_OP_MOE_UNPERM: case IR_OP_MOE_GATE_GRAD: {
    /* Token dispatch (docs/sharding.md "Expert parallelism"): along ep the
     * token rows are this rank's block (dim 0) and moe_counts exchanges
     * the counts (shard_node); along every other axis all operands whole. */
    int t = a == IR_AXIS_EP ? 0 : AX_R;
    /* Under cp (without ep) a dropless layer's tokens stay on their cp
     * rank: each rank routes, permutes and multiplies its own rows with
     * every expert, and its counts are its own rows' (a partial sum over
     * cp of the layer's counts, which only this rank's gmm reads).  A
     * capacity mask reads the tokens whole (their order decides the
     * drops), so its routing is replicated and so is the dispatch. */
    int routed = n->op == IR_OP_MOE_COUNTS ? 0 : n->op == IR_OP_MOE_GATE_GRAD ? 2 : 1;
    if (a == IR_AXIS_CP && !active(S, IR_AXIS_EP) && st[routed] == 0) t = 0;
    for (int k = 0; k < nin; k++) want[k] = t;
    *out = n->op == IR_OP_MOE_COUNTS ? (t == 0 && a == IR_AXIS_CP ? AX_P : AX_R) : t;
    return 0;
  }
  case IR_OP_GMM: case IR_OP_GMM_DW: {
    /* a [R, K] rows in expert layout, w [G, K, N] (tb: [G, N, K]) or dy [R, N] */
    want[2] = AX_R;
    if (a == IR_AXIS_EP) {
      char pw[160];
      if (n->op == IR_OP_GMM && st[1] != 0)
        return sh_fail(S, "gmm: under ep the expert weights%s must be split over ep along their expert dim "
                       "(rules { experts: ep } with the weights' first dim named experts), but they are %s",
                       param_of(S, n->in[1], pw, sizeof pw), st[1] == AX_R ? "replicated" : "split elsewhere");
      want[0] = want[1] = 0;
      *out = 0;
      return 0;
    }
    if (a == IR_AXIS_CP && !active(S, IR_AXIS_EP) && st[0] == 0 && st[2] == AX_P) {
      /* a cp rank's own rows (moe_counts above) with every expert: the
       * rows stay split, the weights' gradient is a partial sum */
      want[0] = 0;
      want[1] = n->op == IR_OP_GMM_DW ? 0 : AX_R;
      want[2] = AX_P;
      *out = n->op == IR_OP_GMM_DW ? AX_P : 0;
      return 0;
    }
    int s0 = st[0] == AX_P ? AX_R : st[0], s1 = st[1] == AX_P ? AX_R : st[1];
    if (s0 == 0) s0 = AX_R;                       /* rows stay whole off ep */
    if (n->op == IR_OP_GMM_DW) {
      if (s1 == 0) s1 = AX_R;
      if (s0 == 1 && s1 == 1) s1 = AX_R;          /* both split: gather dy */
      want[0] = s0;
      want[1] = s1;
      *out = s0 == 1 ? 1 : s1 == 1 ? 2 : AX_R;
      return 0;
    }
    int tb = (int)n->ia[0], wK = tb ? 2 : 1, wN = tb ? 1 : 2;
    if (st[0] == AX_P && st[1] == AX_R) { *out = AX_P; return 0; }   /* linear in a */
    char pw[160];
    if (s1 == 0)
      return sh_fail(S, "gmm: the expert dim of the weights%s is split over %s; only ep may split it (rules { "
                     "experts: ep })", param_of(S, n->in[1], pw, sizeof pw), ir_axis_name((IrAxis)a));
    if (s1 == wK) { want[0] = 1; want[1] = wK; *out = AX_P; }
    else if (s1 == wN) { want[0] = AX_R; want[1] = wN; *out = 1; }
    else { want[0] = AX_R; want[1] = AX_R; *out = AX_R; }
    return 0;
  }
  case IR_OP_OUTPUT:
    want[0] = AX_R;
    return 0;
  case IR_OP_ACCUM:
    return 0;             /* decided by the caller against the state */
  default:
    break;
  }
  if (info->flags & OPF_EW) {
    /* With sequence parallelism a partial activation is reduce-scattered
     * once, right away, rather than carried through products (which would
     * make each consumer reduce its own product); sums of partials stay
     * partial (one reduction for the sum). */
    int eager = 0;
    for (int k = 0; k < nin && n->op != IR_OP_ADD && n->op != IR_OP_SUB; k++)
      if (st[k] == AX_P && resolve_default(S, n->in[k], a) >= 0) eager = 1;
    if (!eager && ew_partial_ok(n->op, st, nin)) { *out = AX_P; return 0; }
    int t = AX_R, p = -1;
    for (int k = 0; k < nin; k++) {
      if (st[k] >= 0 && t == AX_R) t = st[k];
      if (st[k] == AX_P && p < 0) p = k;
    }
    if (t == AX_R && p >= 0) t = resolve_default(S, n->in[p], a);
    for (int k = 0; k < nin; k++) want[k] = t;
    *out = t;
    return 0;
  }
  return sh_fail(S, "op %s has no sharding rule", info->name);  /* internal */
}

/* ---------------- padding (taint) ---------------- */

/* Which dims of node i's result hold padding, from its operands'; -1 after
 * failing when padding reaches an op that would see it. */
static int taint_of(Sh *S, int i) {
  const IrNode *n = onode(S, i);
  uint8_t any = 0;
  for (int k = 0; k < n->nin; k++) any |= S->taint[n->in[k]];
  if (!any && n->op != IR_OP_EMBEDDING_BWD) return 0;
  const uint8_t *tn = S->taint;
  switch (n->op) {
  case IR_OP_ADD: case IR_OP_SUB: case IR_OP_MUL: case IR_OP_NEG: case IR_OP_MULS: case IR_OP_CAST:
    for (int k = 1; k < n->nin; k++)
      if (tn[n->in[k]] != tn[n->in[0]]) goto refuse;
    return tn[n->in[0]];
  case IR_OP_EMBEDDING:
    if (tn[n->in[0]] & ~1u) goto refuse;
    return 0;
  case IR_OP_EMBEDDING_BWD:
    return S->has_hint[i] ? (int)(S->taint[i]) : 0;      /* preset from the hint */
  case IR_OP_MATMUL: {
    const IrType *at = &onode(S, n->in[0])->type, *bt = &onode(S, n->in[1])->type;
    int ra = at->rank, rb = bt->rank, ro = n->type.rank;
    int aM = n->ia[0] ? ra - 1 : ra - 2, aK = n->ia[0] ? ra - 2 : ra - 1;
    int bK = n->ia[1] ? rb - 1 : rb - 2, bN = n->ia[1] ? rb - 2 : rb - 1;
    uint8_t ta = tn[n->in[0]], tb = tn[n->in[1]];
    if (((ta >> aK) & 1) != ((tb >> bK) & 1)) goto refuse;
    if ((ta & ~(BIT(aM) | BIT(aK))) || (tb & ~(BIT(bK) | BIT(bN)))) goto refuse;
    return ((ta >> aM) & 1 ? BIT(ro - 2) : 0) | ((tb >> bN) & 1 ? BIT(ro - 1) : 0);
  }
  case IR_OP_PERMUTE: {
    int r = 0;
    for (int d = 0; d < n->type.rank; d++)
      if (tn[n->in[0]] & BIT(n->ia[d])) r |= BIT(d);
    return r;
  }
  case IR_OP_RESHAPE: {
    const IrType *xt = &onode(S, n->in[0])->type;
    int r = 0;
    for (int d = 0; d < xt->rank; d++) {
      if (!(tn[n->in[0]] & BIT(d))) continue;
      /* a padded dim must map one to one */
      int o = reshape_map(xt, &n->type, d, 1);
      if (o < 0 || n->type.dim[o] != xt->dim[d]) goto refuse;
      r |= BIT(o);
    }
    return r;
  }
  case IR_OP_SUM_TO: {
    const IrType *xt = &onode(S, n->in[0])->type;
    int r = 0, off = xt->rank - n->type.rank;
    for (int d = 0; d < xt->rank; d++)
      if ((tn[n->in[0]] & BIT(d)) && d - off >= 0 && n->type.dim[d - off] == xt->dim[d]) r |= BIT(d - off);
    return r;
  }
  case IR_OP_CROSS_ENTROPY: case IR_OP_CROSS_ENTROPY_BWD: {
    int last = onode(S, n->in[0])->type.rank - 1;
    if (tn[n->in[0]] & ~BIT(last)) goto refuse;
    for (int k = 1; k < n->nin; k++) if (tn[n->in[k]]) goto refuse;
    return n->op == IR_OP_CROSS_ENTROPY_BWD ? BIT(last) : 0;
  }
  case IR_OP_ACCUM:
    return 0;             /* checked against the state by the caller */
  default:
    break;
  }
refuse: {
  /* name the padded dim that got here */
  const char *dn = "?";
  int64_t size = 0;
  for (int k = 0; k < n->nin; k++) {
    const IrType *t = &onode(S, n->in[k])->type;
    for (int d = 0; d < t->rank; d++)
      if ((tn[n->in[k]] & BIT(d)) && t->dname[d]) { dn = t->dname[d]; size = t->dim[d]; }
  }
  char ok[256], who[512];
  (void)i;
  return sh_fail(S, "dim '%s' = %lld is not divisible by tp = %d; the tp sizes that divide it: %s. It cannot be "
                 "padded instead: it is a dim of %s, and the padding would reach a %s (only embedding tables, "
                 "matmuls and the class dim of cross_entropy carry padding)", dn, (long long)size, S->T,
                 sizes_dividing(size, 1, ok, sizeof ok), params_with_dim(S->m, dn, who, sizeof who),
                 ir_ops[n->op].name);
}
}

/* ---------------- the special lowerings ---------------- */

/* The masked local logits and the softmax statistics of a vocab-parallel
 * cross_entropy over (logits l, targets t): L [.., Vl] (padding set to
 * -inf), mx = max over the whole vocab [..], e = exp(L - mx) [.., Vl],
 * se = sum of e over the whole vocab [..], valid = (t != ignore) [..]. */
static CeStats *ce_stats(Sh *S, int i, int L, int tg, const IrSharding *lsh, const IrSharding *tsh) {
  const IrNode *n = onode(S, i);
  for (int k = 0; k < S->ce.n; k++)
    if (S->ce.a[k].logits == n->in[0] && S->ce.a[k].targets == n->in[1]) return &S->ce.a[k];
  CeStats c = {n->in[0], n->in[1], L, -1, -1, -1, -1};
  const IrType *lt = &nnode(S, L)->type;
  int last = lt->rank - 1;
  IrSharding rsh = *lsh;              /* row layout: the token dims' splits */
  rsh.split[last] = 0;
  int64_t ia_max[2] = {last, 0};
  c.mx = emit(S, IR_OP_MAX, &L, 1, ia_max, NULL, NULL, NULL, &rsh);
  int64_t ar_max[2] = {IR_AXIS_TP, 1}, ar_sum[2] = {IR_AXIS_TP, 0};
  c.mx = emit(S, IR_OP_ALL_REDUCE, &c.mx, 1, ar_max, NULL, NULL, NULL, &rsh);
  IrType bt = *lt;
  /* broadcast mx [..] to [.., Vl]: via a keepdim reshape to [.., 1] */
  IrType kt = *lt;
  kt.dim[last] = 1;
  kt.dname[last] = NULL;
  int mk = emit(S, IR_OP_RESHAPE, &c.mx, 1, NULL, NULL, NULL, &kt, &rsh);
  int mbc = emit(S, IR_OP_BROADCAST, &mk, 1, NULL, NULL, NULL, &bt, lsh);
  int in2[2] = {L, mbc};
  int sub = emit(S, IR_OP_SUB, in2, 2, NULL, NULL, NULL, NULL, lsh);
  c.e = emit(S, IR_OP_EXP, &sub, 1, NULL, NULL, NULL, NULL, lsh);
  int64_t ia_sum[2] = {last, 0};
  int se = emit(S, IR_OP_SUM, &c.e, 1, ia_sum, NULL, NULL, NULL, &rsh);
  IrSharding psh = rsh;
  psh.partial |= BIT(IR_AXIS_TP);
  if (se >= 0) S->m->blocks.a[S->nb].nodes[se].sh = psh;
  c.se = emit(S, IR_OP_ALL_REDUCE, &se, 1, ar_sum, NULL, NULL, NULL, &rsh);
  IrType vt = nnode(S, tg)->type;
  vt.dtype = lt->dtype;
  double ign = (double)n->ia[0];
  c.valid = emit(S, IR_OP_NE_SCALAR, &tg, 1, NULL, &ign, NULL, &vt, tsh);
  VEC_PUSH(S->ce, c);
  return &S->ce.a[S->ce.n - 1];
}

/* cross_entropy / cross_entropy_bwd with logits split along the class dim
 * over tp.  in: the converted operands (logits, targets[, dloss]). */
static int lower_ce(Sh *S, int i, const int *in, const IrSharding *ish, const IrSharding *osh) {
  const IrNode *n = onode(S, i);
  int L = in[0];
  const IrType *lt = &nnode(S, L)->type;
  int last = lt->rank - 1;
  if (S->taint[n->in[0]]) {      /* padding columns: -inf, so they get no probability */
    int64_t ia[2] = {last, onode(S, n->in[0])->type.dim[last]};
    double fill = -INFINITY;
    L = emit(S, IR_OP_PAD_FILL, &L, 1, ia, &fill, NULL, NULL, &ish[0]);
  }
  CeStats *c = ce_stats(S, i, L, in[1], &ish[0], &ish[1]);
  if (S->failed) return -1;
  CeStats cs = *c;                /* S->ce may grow below */
  IrSharding rsh = ish[0];
  rsh.split[last] = 0;
  if (n->op == IR_OP_CROSS_ENTROPY) {
    /* loss = (log(se) + mx - l[t]) * valid */
    int64_t ign[1] = {n->ia[0]};
    int tk = emit(S, IR_OP_TAKE, (int[]){cs.L, in[1]}, 2, ign, NULL, NULL, NULL, NULL);
    IrSharding psh = rsh;
    psh.partial |= BIT(IR_AXIS_TP);
    if (tk >= 0) S->m->blocks.a[S->nb].nodes[tk].sh = psh;
    int64_t ar[2] = {IR_AXIS_TP, 0};
    tk = emit(S, IR_OP_ALL_REDUCE, &tk, 1, ar, NULL, NULL, NULL, &rsh);
    int lg = emit(S, IR_OP_LOG, &cs.se, 1, NULL, NULL, NULL, NULL, &rsh);
    int lse = emit(S, IR_OP_ADD, (int[]){lg, cs.mx}, 2, NULL, NULL, NULL, NULL, &rsh);
    int d = emit(S, IR_OP_SUB, (int[]){lse, tk}, 2, NULL, NULL, NULL, NULL, &rsh);
    return emit(S, IR_OP_MUL, (int[]){d, cs.valid}, 2, NULL, NULL, NULL, NULL, osh);
  }
  /* dlogits = (e / se - onehot(t)) * dloss * valid */
  IrType kt = *lt;
  kt.dim[last] = 1;
  kt.dname[last] = NULL;
  int sk = emit(S, IR_OP_RESHAPE, &cs.se, 1, NULL, NULL, NULL, &kt, &rsh);
  int sb = emit(S, IR_OP_BROADCAST, &sk, 1, NULL, NULL, NULL, lt, &ish[0]);
  int p = emit(S, IR_OP_DIV, (int[]){cs.e, sb}, 2, NULL, NULL, NULL, NULL, &ish[0]);
  int64_t ign[1] = {n->ia[0]};
  int oh = emit(S, IR_OP_ONEHOT, &in[1], 1, ign, NULL, NULL, lt, &ish[0]);
  int g = emit(S, IR_OP_SUB, (int[]){p, oh}, 2, NULL, NULL, NULL, NULL, &ish[0]);
  int w = emit(S, IR_OP_MUL, (int[]){in[2], cs.valid}, 2, NULL, NULL, NULL, NULL, &rsh);
  int wk = emit(S, IR_OP_RESHAPE, &w, 1, NULL, NULL, NULL, &kt, &rsh);
  int wb = emit(S, IR_OP_BROADCAST, &wk, 1, NULL, NULL, NULL, lt, &ish[0]);
  return emit(S, IR_OP_MUL, (int[]){g, wb}, 2, NULL, NULL, NULL, NULL, osh);
}

/* ---------------- hints: layouts wanted by accumulations ---------------- */

static void set_hint(Sh *S, int v, const IrSharding *h, uint8_t taint) {
  if (S->has_hint[v]) return;
  S->has_hint[v] = 1;
  S->hint[v] = *h;
  const IrNode *n = onode(S, v);
  if (n->op == IR_OP_EMBEDDING_BWD) S->taint[v] = taint;
  if (n->op == IR_OP_ADD || n->op == IR_OP_SUB)
    for (int k = 0; k < n->nin; k++) set_hint(S, n->in[k], h, taint);
}

static void compute_hints(Sh *S) {
  for (int i = S->ob.n - 1; i >= 0; i--) {
    const IrNode *n = onode(S, i);
    if (n->op != IR_OP_ACCUM) continue;
    const IrState *g = &S->m->states.a[n->ia[0]];
    if (g->of < 0) continue;
    const IrState *p = &S->m->states.a[g->of];
    uint8_t t = 0;
    for (int d = 0; d < p->type.rank; d++) if (p->logical[d]) t |= BIT(d);
    set_hint(S, n->in[0], &p->sh, t);
  }
}

/* ---------------- parameters ---------------- */

static uint8_t rule_axes(const IrModule *m, const char *dname) {
  if (!dname) return 0;
  uint8_t r = 0;
  for (int i = 0; i < m->rules.n; i++)
    if (m->rules.a[i].dim == dname) r = m->rules.a[i].axes;    /* the last rule wins */
  return r;
}

/* Splits every parameter dim with a rule over tp or ep (experts); pads the
 * dims tp does not divide (taint decides later whether that is allowed);
 * an expert count ep does not divide is refused. */
/* Sequence parallelism splits the sequence dim of the model's inputs over
 * tp (after cp's split): refused, never dropped, when no input has that
 * dim or its length does not divide. */
static int sp_check_inputs(Sh *S) {
  int found = 0;
  for (int i = 0; i < S->ob.n; i++) {
    const IrNode *n = &S->ob.nodes[i];
    if (n->op != IR_OP_INPUT) continue;
    for (int d = 0; d < n->type.rank; d++) {
      if (n->type.dname[d] != S->seq_name) continue;
      found = 1;
      int64_t len = n->type.dim[d], local = S->C > 1 ? len / S->C : len;
      if (local % S->T)
        return sh_fail(S, "sequence parallelism (--sp) splits the sequence over tp = %d, and input \"%s\" has "
                       "dim '%s' = %lld%s, which is not divisible by %d: make the sequence a multiple of %lld, "
                       "or leave out --sp", S->T, n->sa ? n->sa : "?", S->seq_name, (long long)len,
                       S->C > 1 ? " split over cp" : "", S->T, (long long)(S->C > 1 ? 2 * S->C * S->T : S->T));
    }
  }
  if (!found)
    return sh_fail(S, "sequence parallelism (--sp) splits the sequence dim '%s' over tp, and no input of the model "
                   "has a dim of that name: it would split nothing (rules { %s: cp } names the sequence dim)",
                   S->seq_name, S->seq_name);
  return 0;
}

static int shard_params(Sh *S) {
  IrModule *m = S->m;
  static const IrAxis axes[2] = {IR_AXIS_TP, IR_AXIS_EP};
  for (int ai = 0; ai < 2; ai++) {
    IrAxis a = axes[ai];
    int k = ir_axis_size(m, a);
    if (k < 2) continue;
    for (int s = 0; s < m->states.n; s++) {
      IrState *st = &m->states.a[s];
      if (st->kind != IR_STATE_PARAM) continue;
      for (int d = 0; d < st->type.rank; d++) {
        if (!(rule_axes(m, st->type.dname[d]) & BIT(a))) continue;
        if (ax_get(&st->sh, a) != AX_R)
          return sh_fail(S, "parameter @%s has two dims ruled to %s ('%s' and '%s'); a mesh axis splits one dim",
                         st->name, ir_axis_name(a), st->type.dname[ax_get(&st->sh, a)], st->type.dname[d]);
        if (st->sh.split[d])
          return sh_fail(S, "parameter @%s: dim '%s' is ruled to both %s and another axis", st->name,
                         st->type.dname[d], ir_axis_name(a));
        int64_t size = st->type.dim[d];
        if (size % k) {
          if (a != IR_AXIS_TP)
          {
            char ok[256];
            return sh_fail(S, "dim '%s' = %lld of parameter @%s is not divisible by %s = %d; the %s sizes that "
                           "divide it: %s", st->type.dname[d], (long long)size, st->name, ir_axis_name(a), k,
                           ir_axis_name(a), sizes_dividing(size, 1, ok, sizeof ok));
          }
          st->logical[d] = size;
          size = (size + k - 1) / k * k;
        }
        st->sh.split[d] |= BIT(a);
        st->type.dim[d] = size / k;
      }
    }
  }
  int ep = ir_axis_size(m, IR_AXIS_EP), split = 0;
  for (int s = 0; s < m->states.n && ep > 1 && !split; s++)
    split = m->states.a[s].kind == IR_STATE_PARAM && ax_get(&m->states.a[s].sh, IR_AXIS_EP) != AX_R;
  if (ep > 1 && !split) {   /* a layout flag that splits nothing is refused, not ignored */
    char dims[256] = "";
    for (int r = 0; r < m->rules.n; r++)
      if (m->rules.a[r].axes & BIT(IR_AXIS_EP) && strlen(dims) + strlen(m->rules.a[r].dim) + 4 < sizeof dims)
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s'%s'", dims[0] ? ", " : "", m->rules.a[r].dim);
    return sh_fail(S, "ep = %d splits nothing: no parameter has a dim ruled to ep (%s%s); expert parallelism "
                   "splits the experts of a mixture-of-experts layer (rules { experts: ep }). For data "
                   "parallelism use --dp %d", ep, dims[0] ? "the rules give ep " : "the rules give ep no dim",
                   dims, ep);
  }
  return 0;
}

/* A layout flag that splits nothing is refused, not ignored: under cp
 * some computation must run on the rank's part of the sequence.  When the
 * inputs are gathered whole where they are first read (a slice of the
 * sequence dim: T5's source and target halves), every cp rank would
 * compute the whole sequence. */
static void cp_splits_something(Sh *S) {
  const IrBlock *b = &S->m->blocks.a[S->nb];
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (ir_ops[n->op].flags & (OPF_LEAF | OPF_LATE | OPF_EFFECT)) continue;
    if (n->sh.partial & BIT(IR_AXIS_CP)) return;
    for (int d = 0; d < n->type.rank; d++)
      if (n->sh.split[d] & BIT(IR_AXIS_CP)) return;
  }
  /* the first reader of a gathered input, in the user's terms */
  const char *in = NULL, *op = NULL;
  for (int i = 0; i < b->n && !op; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op != IR_OP_ALL_GATHER || b->nodes[n->in[0]].op != IR_OP_INPUT) continue;
    in = b->nodes[n->in[0]].sa;
    for (int j = i + 1; j < b->n && !op; j++)
      for (int k = 0; k < b->nodes[j].nin; k++)
        if (b->nodes[j].in[k] == i) op = ir_ops[b->nodes[j].op].name;
  }
  char where[256] = "";
  if (in && op)
    snprintf(where, sizeof where, " (input \"%s\" is gathered whole over cp for the %s that first reads it)", in, op);
  sh_fail(S, "cp = %d splits nothing: no computation keeps the sequence split%s, so every cp rank would compute the "
          "whole sequence. Context parallelism needs the ops along '%s' to keep it split (a slice or a "
          "reshape of the sequence dim does not: an encoder-decoder that cuts each sequence into its source and "
          "target halves cannot use it); use --dp %d or --tp instead", S->C, where, S->seq_name, S->C);
}

/* ---------------- the pass ---------------- */

/* ---------------- token dispatch under ep ----------------
 * The moe ops keep their single-rank meaning on each rank's block of
 * tokens; the rows between moe_perm and moe_unperm change hands.  A value
 * in TOKEN layout (moe_perm's result: this rank's tokens, grouped by
 * expert) becomes EXPERT layout (the rows of this rank's experts from
 * every ep rank, expert-major) by all_to_all_v, and back by all_to_all_v
 * rev=1.  Conversions happen where a reader needs the other layout: gmm
 * and gmm_dw read expert layout, moe_unperm and moe_gate_grad token
 * layout, elementwise ops keep theirs.  Expert-layout rows are a static
 * bound, ep * min(token rows, tokens x local experts): every row a rank
 * can receive in the worst routing.  When the counted routing mask is a
 * capacity_mask (seen through reshapes), each expert takes at most `cap`
 * rows of the micro batch from all ranks together (the mask's tokens are
 * gathered for the count, so cap is the micro batch's), and the bound is
 * also local experts x cap: at capacity factor f, f x the rank's own
 * routed rows instead of ep x them. */

/* The capacity of old moe_counts node c's routing mask: cap when it is a
 * capacity_mask seen through reshapes, else -1 (dropless). */
static int64_t counts_capacity(const Sh *S, int c) {
  int v = onode(S, c)->in[0];
  while (v >= 0 && onode(S, v)->op == IR_OP_RESHAPE) v = onode(S, v)->in[0];
  return v >= 0 && onode(S, v)->op == IR_OP_CAPACITY_MASK ? onode(S, v)->ia[0] : -1;
}

/* New value `id` (old value v, layout from) in layout `to`. */
static int xconv(Sh *S, int v, int id, int to) {
  int from = S->xl[v];
  if (from == to || id < 0) return id;
  for (int k = 0; k < S->xconv[v].n; k++)
    if (S->xconv[v].a[k].from == id && S->xconv[v].a[k].to == to) return S->xconv[v].a[k].id;
  int c = S->xc[v];
  if (c < 0 || S->cntl[c] < 0)
    return sh_fail(S, "internal error: value %%%d in token-dispatch layout has no routing counts", v);
  IrType t = nnode(S, id)->type;
  int ep = ir_axis_size(S->m, IR_AXIS_EP);
  if (to == XL_EXP) {
    const IrNode *cn = nnode(S, S->cntl[c]);
    int64_t ntok = nnode(S, cn->in[0])->type.dim[0], G = nnode(S, S->nv[c])->type.dim[1];
    int64_t per = t.dim[0] < ntok * G ? t.dim[0] : ntok * G, cap = counts_capacity(S, c);
    t.dim[0] = cap > 0 && G * cap < ep * per ? G * cap : ep * per;
  } else {
    t.dim[0] = gtype(S, v).dim[0] / ep;
  }
  int64_t ia[2] = {IR_AXIS_EP, to == XL_TOK};
  int in[3] = {id, S->cntl[c], S->nv[c]};
  S->why = "expert parallelism: each token row goes to the rank that holds its expert (and its result comes back)";
  int r = emit(S, IR_OP_ALL_TO_ALL_V, in, 3, ia, NULL, NULL, &t, &nnode(S, id)->sh);
  S->why = NULL;
  VEC_PUSH(S->xconv[v], ((XEntry){id, to, r}));
  return r;
}

/* The ep half of node i when it is a moe op or reads a token-dispatch
 * value: operands converted (in[] already carries the other axes'
 * conversions), the node emitted.  1 if it handled the node, 0 if the
 * node is ordinary, -1 after failing. */
static int shard_moe_ep(Sh *S, int i, int *in, const IrSharding *osh, IrType *lt) {
  const IrNode *n = onode(S, i);
  int nin = n->nin, xin = 0;
  for (int k = 0; k < nin; k++) xin |= S->xl[n->in[k]];
  int moe = n->op == IR_OP_MOE_COUNTS || n->op == IR_OP_MOE_PERM || n->op == IR_OP_MOE_UNPERM ||
            n->op == IR_OP_MOE_GATE_GRAD || n->op == IR_OP_GMM || n->op == IR_OP_GMM_DW;
  if (!moe && !xin) return 0;
  IrModule *m = S->m;
  if (n->op == IR_OP_MOE_COUNTS) {   /* local counts, then each rank's share: [ep, experts / ep] */
    int64_t E = n->type.dim[1], ep = ir_axis_size(m, IR_AXIS_EP);
    if (E % ep)
    {
      char ok[256];
      return sh_fail(S, "moe: %lld experts are not divisible by ep = %lld; the ep sizes that divide them: %s",
                     (long long)E, (long long)ep, sizes_dividing(E, 1, ok, sizeof ok));
    }
    S->cntl[i] = emit(S, IR_OP_MOE_COUNTS, in, 1, NULL, NULL, NULL, NULL, NULL);
    int64_t ia[3] = {IR_AXIS_EP, 1, 0};
    S->why = "expert parallelism: the token counts per expert, so that every rank sizes its exchange";
    S->nv[i] = emit(S, IR_OP_ALL_TO_ALL, &S->cntl[i], 1, ia, NULL, NULL, NULL, NULL);
    S->why = NULL;
    S->sh[i] = (IrSharding){0};
    return 1;
  }
  int want = 0;   /* the layout the row operands need */
  switch (n->op) {
  case IR_OP_MOE_PERM: break;
  case IR_OP_MOE_UNPERM: case IR_OP_MOE_GATE_GRAD: want = XL_TOK; break;
  case IR_OP_GMM: case IR_OP_GMM_DW: want = XL_EXP; break;
  default:
    if (!(ir_ops[n->op].flags & OPF_EW))
      return sh_fail(S, "%s reads a value in token-dispatch layout (rows of moe_perm, gmm, ...); only "
                     "elementwise ops and the moe ops may read one: apply it after moe_unperm", ir_ops[n->op].name);
    want = (xin & XL_EXP) ? XL_EXP : XL_TOK;
    for (int k = 0; k < nin; k++)
      if (!S->xl[n->in[k]])
        return sh_fail(S, "%s mixes a value in token-dispatch layout (rows of moe_perm, gmm, ...) with an ordinary "
                       "one", ir_ops[n->op].name);
  }
  int c = -1;   /* the counts that govern the result's rows */
  if (n->op == IR_OP_GMM || n->op == IR_OP_GMM_DW) c = n->in[2];
  else if (n->op == IR_OP_MOE_PERM) c = S->cnt_of[n->in[1]];
  else for (int k = 0; k < nin && c < 0; k++) if (S->xl[n->in[k]]) c = S->xc[n->in[k]];
  if (n->op == IR_OP_MOE_PERM && n->ia[0] % ir_axis_size(m, IR_AXIS_EP))
    return sh_fail(S, "moe_perm: rows = %lld are not divisible by ep = %d (each ep rank holds rows / ep of them): "
                   "make rows a multiple of %d", (long long)n->ia[0], ir_axis_size(m, IR_AXIS_EP),
                   ir_axis_size(m, IR_AXIS_EP));
  if (n->op == IR_OP_MOE_PERM && c < 0)
    return sh_fail(S, "moe_perm: under ep its routing mask needs a moe_counts of the same mask (the token dispatch "
                   "exchanges the counts)");
  /* the row operands: rows of gmm / gmm_dw (0, and dy), rows of unperm / gate_grad (0), elementwise all */
  for (int k = 0; k < nin; k++) {
    int rows = (ir_ops[n->op].flags & OPF_EW) || k == 0 || (n->op == IR_OP_GMM_DW && k == 1);
    if (!rows || !want) continue;
    if (!S->xl[n->in[k]])
      return sh_fail(S, "%s: operand %d is not in token-dispatch layout (its rows must come from moe_perm)",
                     ir_ops[n->op].name, k + 1);
    in[k] = xconv(S, n->in[k], in[k], want);
  }
  if (S->failed) return -1;
  int outl = n->op == IR_OP_MOE_PERM ? XL_TOK : n->op == IR_OP_GMM ? XL_EXP
           : (ir_ops[n->op].flags & OPF_EW) ? want : 0;
  const IrType *typed = ir_op_given_type(n->op, lt);
  int64_t ia[IR_MAX_IATTR];
  memcpy(ia, n->ia, sizeof ia);
  if (n->op == IR_OP_MOE_PERM) ia[0] = lt->dim[0];   /* this rank's share of the rows */
  S->sh[i] = *osh;
  S->nv[i] = emit(S, n->op, in, nin, ia, n->fa, n->sa, typed, osh);
  if (S->nv[i] < 0) return -1;
  S->xl[i] = (uint8_t)outl;
  S->xc[i] = outl ? c : -1;
  if (outl == XL_EXP) lt->dim[0] = nnode(S, S->nv[i])->type.dim[0];
  return 1;
}

/* ---------------- ring attention ----------------
 * Under cp with the ring (S->cp_ring), attention and attention_bwd become
 * one attn_* step per cp rank (docs/ir.md "Ring attention"): at step s the
 * rank holds the (k, v) block of the rank s before it, posts it on with
 * ring_shift before computing on it and takes the next one with ring_wait
 * after, so the transfer overlaps the step.  The forward folds the blocks
 * into an online-softmax state; the backward reuses that state's
 * log-sum-exp (the forward value stays alive, or is stashed under pp) and
 * rings (k, v) once more for all three gradients: dq accumulates at home;
 * the block's dk and dv contributions of its home rank (step 0) stay
 * there, and those of the other ranks accumulate into a partial sum that
 * starts at the next rank (step 1), travels with the block and goes home
 * after the last step.  Per layer and micro batch the ring sends (k, v)
 * cp - 1 times forward and backward and (dk, dv) cp - 1 times: the
 * 6 (cp-1) blocks of the closed form. */

/* A zero tensor shaped like new value `like` with the last dim `last`. */
static int zeros_like(Sh *S, int like, int64_t last, const IrSharding *sh) {
  IrType t = nnode(S, like)->type;
  if (t.dim[t.rank - 1] != last) t.dname[t.rank - 1] = NULL;
  t.dim[t.rank - 1] = last;
  double z = 0;
  return emit(S, IR_OP_FULL, NULL, 0, NULL, &z, NULL, &t, sh);
}

/* Posts `id` around the cp ring; *wait gets what arrives (call ring_wait). */
static int ring_post(Sh *S, int id, const IrSharding *sh) {
  int64_t ax[1] = {IR_AXIS_CP};
  return emit(S, IR_OP_RING_SHIFT, &id, 1, ax, NULL, NULL, NULL, sh);
}
static int ring_take(Sh *S, int post, const IrSharding *sh) { return emit(S, IR_OP_RING_WAIT, &post, 1, NULL, NULL, NULL, NULL, sh); }


/* slope: ALiBi's slopes (whole: indexed by global head), doc: the document
 * ids (whole along the sequence), -1 without */
typedef struct {
  int q, dout, lse, drow, causal, part, slope, doc;
  int64_t window;
  double scale;
  const IrSharding *osh;
} RingCtx;
/* The operands of a ring step: the fixed ones, then the slope and the doc
 * where there; returns the count. */
static int ring_opnds(const RingCtx *c, int *in, int nfixed) {
  int n = nfixed;
  if (c->slope >= 0) in[n++] = c->slope;
  if (c->doc >= 0) in[n++] = c->doc;
  return n;
}
/* The step-s node of a ring over (k, v): the block kc / vc folded into acc. */
static int step_fwd(Sh *S, const RingCtx *c, int s, int kc, int vc, int acc) {
  int64_t ia[4] = {c->causal, s, c->window, c->slope >= 0};
  int in[6] = {c->q, kc, vc, acc};
  return emit(S, IR_OP_ATTN_ACC, in, ring_opnds(c, in, 4), ia, &c->scale, NULL, NULL, c->osh);
}
static int step_bwd(Sh *S, const RingCtx *c, int s, int kc, int vc, int acc) {
  int64_t ia[5] = {c->causal, s, c->part, c->window, c->slope >= 0}, iq[4] = {c->causal, s, c->window, c->slope >= 0};
  int in[9] = {c->q, kc, vc, c->dout, c->lse, c->drow, acc};
  return emit(S, c->part ? IR_OP_ATTN_BWD_KV : IR_OP_ATTN_BWD_Q, in, ring_opnds(c, in, 7), c->part ? ia : iq,
              &c->scale, NULL, NULL, c->osh);
}
/* ALiBi's slopes and the document ids of attention / attention_bwd node n
 * (operands in: the new values), -1 where none. */
static int ring_slope(const IrNode *n, const int *in) { return ir_attn_slope(n) >= 0 ? in[ir_attn_slope(n)] : -1; }
static int ring_doc(const IrNode *n, const int *in) { return ir_attn_doc(n) >= 0 ? in[ir_attn_doc(n)] : -1; }

/* The backward ring: out[p] = the gradient part p (0 dq, 1 dk, 2 dv) for
 * each p with c[p].osh != NULL (see the comment above ring_post). */
static void ring_bwd(Sh *S, int k, int v, const IrSharding *ksh, RingCtx *c, const int *like, int *out) {
  int C = S->C, kc = k, vc = v, home[3] = {-1, -1, -1}, trav[3] = {-1, -1, -1};
  for (int s = 0; s < C && !S->failed; s++) {
    int pk = -1, pv = -1;
    if (s < C - 1) { pk = ring_post(S, kc, ksh); pv = ring_post(S, vc, ksh); }
    for (int p = 0; p < 3; p++) {
      if (!c[p].osh) continue;
      int64_t last = nnode(S, like[p])->type.dim[3];
      if (p == 0 || s == 0) {   /* dq at home; a block's own rank's dk / dv */
        if (home[p] < 0) home[p] = zeros_like(S, like[p], last, c[p].osh);
        home[p] = step_bwd(S, &c[p], s, kc, vc, home[p]);
      } else {
        if (s == 1) trav[p] = zeros_like(S, like[p], last, c[p].osh);
        trav[p] = step_bwd(S, &c[p], s, kc, vc, trav[p]);
      }
    }
    if (s < C - 1) { kc = ring_take(S, pk, ksh); vc = ring_take(S, pv, ksh); }
    /* the partial sums move on with their blocks (after the last step:
     * home); every rank posts and waits in one order (ring_shift pairs
     * its messages by order) */
    for (int p = 1; p < 3 && s > 0; p++)
      if (trav[p] >= 0) trav[p] = ring_take(S, ring_post(S, trav[p], c[p].osh), c[p].osh);
  }
  for (int p = 0; p < 3 && !S->failed; p++) {
    if (!c[p].osh) continue;
    out[p] = trav[p] < 0 ? home[p] : emit(S, IR_OP_ADD, (int[]){home[p], trav[p]}, 2, NULL, NULL, NULL, NULL, c[p].osh);
  }
}

/* The forward's final online-softmax state for (q, k, v). */
static int ring_state(Sh *S, const IrNode *n, const int *in, const IrSharding *ish) {
  RingCtx c = {in[0], -1, -1, -1, (int)n->ia[0], 0, ring_slope(n, in), ring_doc(n, in), ir_attn_window(n), n->fa[0],
               &ish[0]};
  int st = zeros_like(S, in[0], nnode(S, in[0])->type.dim[3] + 2, &ish[0]);
  int C = S->C, kc = in[1], vc = in[2];   /* step s folds in the block of rank c - s */
  for (int s = 0; s < C && !S->failed; s++) {
    int pk = -1, pv = -1;
    if (s < C - 1) { pk = ring_post(S, kc, &ish[1]); pv = ring_post(S, vc, &ish[1]); }
    st = step_fwd(S, &c, s, kc, vc, st);
    if (s < C - 1) { kc = ring_take(S, pk, &ish[1]); vc = ring_take(S, pv, &ish[1]); }
  }
  return st;
}

static int lower_ring(Sh *S, int i, const int *in, const IrSharding *ish, const IrSharding *osh) {
  const IrNode *n = onode(S, i);
  if (n->op == IR_OP_ATTENTION) {
    int st = ring_state(S, n, in, ish);
    S->ring_st[i] = st;
    return emit(S, IR_OP_ATTN_FINISH, &st, 1, NULL, NULL, NULL, NULL, osh);
  }
  /* attention_bwd (q, k, v, o, do): the forward's state, else recomputed */
  int f = n->in[3], st = onode(S, f)->op == IR_OP_ATTENTION ? S->ring_st[f] : -1;
  if (st < 0) st = ring_state(S, n, in, ish);
  IrSharding rsh = ish[0];   /* [B, H, T]: q's layout without head_dim */
  rsh.split[3] = 0;
  if (S->ring_lse[i] < 0) {
    int lse = emit(S, IR_OP_ATTN_LSE, &st, 1, NULL, NULL, NULL, NULL, &rsh);
    int64_t sa[2] = {3, 0};
    int pr = emit(S, IR_OP_MUL, (int[]){in[4], in[3]}, 2, NULL, NULL, NULL, NULL, &ish[0]);
    int drow = emit(S, IR_OP_SUM, &pr, 1, sa, NULL, NULL, NULL, &rsh);
    /* the three parts share them */
    for (int j = 0; j < S->ob.n; j++) {
      const IrNode *o = onode(S, j);
      if (o->op == IR_OP_ATTENTION_BWD && o->in[3] == n->in[3] && o->in[4] == n->in[4]) {
        S->ring_lse[j] = lse;
        S->ring_drow[j] = drow;
      }
    }
  }
  if (S->ring_out[i] >= 0) return S->ring_out[i];   /* lowered with a sibling part */
  /* this node and its siblings: the parts of the same attention's gradient */
  int sib[3] = {-1, -1, -1};
  for (int j = 0; j < S->ob.n; j++) {
    const IrNode *o = onode(S, j);
    if (o->op != IR_OP_ATTENTION_BWD || o->ia[1] < 0 || o->ia[1] > 2 || sib[o->ia[1]] >= 0) continue;
    int same = o->ia[0] == n->ia[0] && o->ia[2] == n->ia[2] && o->ia[3] == n->ia[3] && o->fa[0] == n->fa[0] &&
               o->nin == n->nin;
    for (int k = 0; k < n->nin && same; k++) same = o->in[k] == n->in[k];
    if (same) sib[o->ia[1]] = j;
  }
  int part = (int)n->ia[1];
  sib[part] = i;
  RingCtx c[3];
  int out[3] = {-1, -1, -1};
  for (int p = 0; p < 3; p++)
    c[p] = (RingCtx){in[0], in[4], S->ring_lse[i], S->ring_drow[i], (int)n->ia[0], p, ring_slope(n, in), ring_doc(n, in),
                     ir_attn_window(n), n->fa[0], sib[p] < 0 ? NULL : p == part ? osh : &ish[p]};
  ring_bwd(S, in[1], in[2], &ish[1], c, in, out);
  for (int p = 0; p < 3; p++)
    if (sib[p] >= 0) S->ring_out[sib[p]] = out[p];
  return out[part];
}

/* ---------------- all-to-all attention ----------------
 * Under cp with --cp-attn a2a (DeepSpeed-Ulysses), attention and
 * attention_bwd read q, k, v (and o, do) split along the sequence (dim 2,
 * the zigzag of causal load balancing).  Each is exchanged by one
 * all_to_all over cp for a head-split layout over the whole sequence: this
 * tp rank's heads cut in cp contiguous blocks (IR_SPLIT_CP_MINOR, text
 * "1:tp+cp*"), the sequence whole and in global order (the all_to_all
 * joins the zigzag's chunks where they belong).  The fused op then runs on
 * its heads exactly as on one rank (causal mask, window and document ids by
 * global position), and its result goes back by the inverse all_to_all.
 * The head-split layouts are conversions of their values, cached in
 * S->conv: the backward reuses the forward's q, k, v and head-split output
 * and exchanges do once for its three parts.  Per layer and micro batch: 4
 * all_to_all forward (q, k, v, o) and 4 backward (do, dq, dk, dv), each
 * rank sending (cp-1)/cp of each. */

/* The head-split layout of a value laid out sh (sequence split over cp). */
static IrSharding a2a_heads_sh(const IrSharding *sh) {
  IrSharding h = *sh;
  h.split[2] &= (uint8_t)~BIT(IR_AXIS_CP);
  h.split[1] |= (uint8_t)(BIT(IR_AXIS_CP) | IR_SPLIT_CP_MINOR);
  return h;
}

/* [B, H, S, D] as [B, H, rep, S, D] (dim 2 new and whole): its type (names
 * of `like`) and layout. */
static void kv_split5(const IrType *like, const IrSharding *sh, int64_t rep, IrType *t5, IrSharding *s5) {
  *t5 = *like;
  *s5 = (IrSharding){0};
  t5->rank = 5;
  for (int d = 4; d >= 3; d--) { t5->dim[d] = like->dim[d - 1]; t5->dname[d] = like->dname[d - 1]; s5->split[d] = sh->split[d - 1]; }
  t5->dim[2] = rep;
  t5->dname[2] = NULL;
  s5->split[0] = sh->split[0];
  s5->split[1] = sh->split[1];
}

/* Grouped-query kv heads that cp does not divide, replicated: new value id
 * [B, H, S, D] (layout sh, the sequence split) with each head repeated rep
 * times in place (head j -> rep heads j*rep ..): [B, H*rep, S, D], the
 * global tensor repeat_interleave(k, rep) in the same layout.  A query
 * group of g heads then reads g / rep copies of its kv head. */
static int kv_repeat(Sh *S, int id, const IrSharding *sh, int64_t rep) {
  IrType t = nnode(S, id)->type, t5, tb;
  IrSharding s5;
  kv_split5(&t, sh, 1, &t5, &s5);
  int x = emit(S, IR_OP_RESHAPE, &id, 1, NULL, NULL, NULL, &t5, &s5);
  tb = t5;
  tb.dim[2] = rep;
  x = emit(S, IR_OP_BROADCAST, &x, 1, NULL, NULL, NULL, &tb, &s5);
  t.dim[1] *= rep;
  t.dname[1] = NULL;   /* no longer the model's kv heads */
  return emit(S, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &t, sh);
}

/* The gradient of kv_repeat: [B, H*rep, S, D] summed over each head's rep
 * copies into like's [B, H, S, D] (layout sh). */
static int kv_unrepeat(Sh *S, int id, const IrType *like, const IrSharding *sh, int64_t rep) {
  IrType t5;
  IrSharding s5;
  kv_split5(like, sh, rep, &t5, &s5);
  int x = emit(S, IR_OP_RESHAPE, &id, 1, NULL, NULL, NULL, &t5, &s5);
  int64_t ia[2] = {2, 0};
  return emit(S, IR_OP_SUM, &x, 1, ia, NULL, NULL, NULL, sh);
}

/* Old value v, new value id laid out sh, in the head-split layout: a
 * cached conversion or one all_to_all (split the heads, join the
 * sequence), its heads repeated rep times first (kv_repeat; rep is a
 * function of the layout, so a value has one head-split form). */
static int a2a_to_heads(Sh *S, int v, int id, const IrSharding *sh, int64_t rep) {
  IrSharding h = a2a_heads_sh(sh);
  for (int i = 0; i < S->conv[v].n; i++)
    if (ir_sharding_equal(&S->conv[v].a[i].sh, &h)) return S->conv[v].a[i].id;
  if (rep > 1) id = kv_repeat(S, id, sh, rep);
  int64_t ia[3] = {IR_AXIS_CP, 1, 2};
  S->why = "all-to-all attention under cp (--cp-attn a2a): the sequence-split operand exchanged for this rank's "
           "heads over the whole sequence (4 all_to_all forward and 4 backward per layer and micro batch)";
  int r = emit(S, IR_OP_ALL_TO_ALL, &id, 1, ia, NULL, NULL, NULL, &h);
  S->why = NULL;
  if (r >= 0) VEC_PUSH(S->conv[v], ((ConvEntry){h, r, 0}));
  return r;
}

/* "8 / tp 2 = 4 per tp rank" or "8": a head count and its tp split, into buf. */
static const char *heads_desc(const Sh *S, int64_t global, unsigned mask, char *buf, size_t cap) {
  int64_t k = axes_size(S, mask & ~BIT(IR_AXIS_CP));
  if (k > 1) snprintf(buf, cap, "%lld / tp %lld = %lld per tp rank", (long long)global, (long long)k, (long long)(global / k));
  else snprintf(buf, cap, "%lld", (long long)global);
  return buf;
}

static int lower_a2a(Sh *S, int i, const int *in, const IrSharding *ish, const IrSharding *osh) {
  const IrNode *n = onode(S, i);
  int fwd = n->op == IR_OP_ATTENTION, base = fwd ? 3 : 5, C = S->C;
  for (int k = 0; k < base; k++)
    if (ish[k].split[2] != BIT(IR_AXIS_CP) || (ish[k].split[1] & BIT(IR_AXIS_CP)))
      return sh_fail(S, "%s %%%d: --cp-attn a2a needs q, k and v split along the sequence over cp alone (operand %d "
                     "is not); use --cp-attn ring or allgather", ir_ops[n->op].name, i, k + 1);
  /* each cp rank takes whole query heads of its tp block; grouped-query kv
   * heads that cp does not divide are replicated, rep = cp / gcd(kv heads,
   * cp) copies each (enough for cp to divide them; the query group size
   * is then a multiple of rep, since cp divides the query heads) */
  int64_t hq = nnode(S, in[0])->type.dim[1], hkv = nnode(S, in[1])->type.dim[1], rep = 1;
  if (hq % C) {
    char hd[96], ok[256];
    return sh_fail(S, "attention: --cp-attn a2a splits the heads over cp, but query heads = %s are not divisible by "
                   "cp = %d; the cp sizes that divide them: %s (or --cp-attn ring or allgather, which split the "
                   "sequence only)", heads_desc(S, onode(S, n->in[0])->type.dim[1], ish[0].split[1], hd, sizeof hd), C,
                   sizes_dividing(hq, 1, ok, sizeof ok));
  }
  if (hkv % C) {
    int64_t a = hkv, b = C;
    while (b) { int64_t t = a % b; a = b; b = t; }
    rep = C / a;
    if (hkv <= 0 || hq % hkv || (hq / hkv) % rep)
      return sh_fail(S, "internal error: attention %%%d: %lld query heads over %lld kv heads cannot repeat the kv "
                     "heads %lld times", i, (long long)hq, (long long)hkv, (long long)rep);
  }
  int hin[8];
  for (int k = 0; k < base; k++) hin[k] = a2a_to_heads(S, n->in[k], in[k], &ish[k], k == 1 || k == 2 ? rep : 1);
  for (int k = base; k < n->nin; k++) hin[k] = in[k];   /* slopes, document ids: whole */
  IrSharding rsh = a2a_heads_sh(osh);
  int r = emit(S, n->op, hin, n->nin, n->ia, n->fa, NULL, NULL, &rsh);
  if (r < 0) return -1;
  if (fwd) VEC_PUSH(S->conv[i], ((ConvEntry){rsh, r, 0}));   /* the backward reads o head-split */
  int64_t ia[3] = {IR_AXIS_CP, 2, 1};
  S->why = fwd ? "all-to-all attention under cp (--cp-attn a2a): the result, head-split over the whole sequence, "
                 "exchanged back to the sequence split"
               : "all-to-all attention's backward under cp (--cp-attn a2a): the gradient, head-split over the whole "
                 "sequence, exchanged back to the sequence split";
  int o = emit(S, IR_OP_ALL_TO_ALL, &r, 1, ia, NULL, NULL, NULL, osh);
  S->why = NULL;
  if (!fwd && n->ia[1] > 0 && rep > 1) o = kv_unrepeat(S, o, &nnode(S, in[n->ia[1]])->type, osh, rep);   /* dk, dv */
  return o;
}

/* The node made for old value i has the local type lt. */
static void check_local(Sh *S, int i, const IrType *lt) {
  const IrNode *n = onode(S, i);
  if (S->nv[i] < 0 || (ir_ops[n->op].flags & OPF_EFFECT)) return;
  const IrType *got = &nnode(S, S->nv[i])->type;
  if (!ir_type_same_shape(got, lt)) {
    char b1[256], b2[256];
    sh_fail(S, "internal error: %%%d = %s has local type %s, expected %s", i, ir_ops[n->op].name,
            tstr(got, b1, sizeof b1), tstr(lt, b2, sizeof b2));
  }
}

/* Shards node i of the old block into the new one. */
static void shard_node(Sh *S, int i) {
  const IrNode *n = onode(S, i);
  IrModule *m = S->m;
  int nin = n->nin;
  int st[64], want[64], out;
  uint8_t keep[64], mk[64];
  IrSharding ish[64], osh = {0};
  if (nin > 64) { sh_fail(S, "node %%%d has more than 64 operands", i); return; }
  S->tag = n->stage;   /* pipeline stage: everything emitted for node i is i's */
  S->cur = i;
  S->cur_k = -1;
  int t = taint_of(S, i);
  if (t < 0) return;
  if (n->op != IR_OP_EMBEDDING_BWD) S->taint[i] = (uint8_t)t;
  /* merged rows (Sh.scr): keep[k], the axes operand k is used along in
   * merged order; mk[k], those an ordinary operand is merged along on
   * demand (scr_merge), seen by the rules as split along its contracted
   * dim.  If the rules then want more of such an operand than that split,
   * they run again without merging on demand. */
  for (int attempt = 0; attempt < 2; attempt++) {
    int merged = 0;
    osh = (IrSharding){0};
    for (int k = 0; k < nin; k++) {
      ish[k] = S->sh[n->in[k]];
      keep[k] = S->scr[n->in[k]] ? scr_use(S, i, k) : 0;
      mk[k] = 0;
    }
    for (int k = 0; k < nin && k < 2 && attempt == 0; k++)
      if (S->scr[n->in[k]] && !keep[k] && (mk[1 - k] = scr_pairable(S, i, k))) {
        keep[k] = mk[1 - k];
        merged = 1;
        break;
      }
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      if (!active(S, a)) continue;
      for (int k = 0; k < nin; k++) {
        st[k] = ((S->scr[n->in[k]] & ~keep[k]) & BIT(a)) ? AX_R : ax_get(&S->sh[n->in[k]], a);
        if (mk[k] & BIT(a)) st[k] = matmul_kdim(S, i, k);
      }
      if (rule(S, i, a, st, want, &out)) return;
      for (int k = 0; k < nin; k++) ax_set(&ish[k], a, want[k]);
      ax_set(&osh, a, out);
    }
    if (n->op == IR_OP_RESHAPE && S->scr[i]) S->scr_src[i] = ish[0];
    if (!merged) break;
    int ok = 1;
    for (int k = 0; k < nin && k < 2; k++) {
      if (!mk[k]) continue;
      IrSharding e = S->sh[n->in[k]];
      for (int a = 0; a < IR_AXIS_COUNT; a++)
        if (mk[k] & BIT(a)) ax_set(&e, a, matmul_kdim(S, i, k));
      ok = ok && ir_sharding_equal(&e, &ish[k]);
    }
    if (ok) break;
  }
  /* leaves and effects */
  IrType gt = gtype(S, i);
  if (n->op == IR_OP_INPUT && S->C > 1) {
    /* context parallelism: model inputs come split along their cp-ruled
     * dims (the sequence), each rank its contiguous block */
    for (int d = 0; d < gt.rank; d++) {
      if (!(rule_axes(m, gt.dname[d]) & BIT(IR_AXIS_CP))) continue;
      if (gt.dim[d] % (2 * S->C)) {   /* causal load balancing: 2 chunks per rank (runtime/cpu/cp_layout.c) */
        char ok[256];
        sh_fail(S, "input \"%s\": dim '%s' = %lld is not divisible by 2 x cp = %d (causal load balancing gives "
                "each cp rank two chunks); the cp sizes that work: %s", n->sa, gt.dname[d], (long long)gt.dim[d],
                2 * S->C, sizes_dividing(gt.dim[d], 2, ok, sizeof ok));
        return;
      }
      osh.split[d] |= BIT(IR_AXIS_CP);
      break;
    }
  }
  if (n->op == IR_OP_INPUT && ir_axis_size(m, IR_AXIS_EP) > 1) {
    /* expert parallelism is carved out of data parallelism (Megatron): the
     * micro batch's data-parallel dim (ruled to dp) is split over ep too */
    int ep = ir_axis_size(m, IR_AXIS_EP);
    for (int d = 0; d < gt.rank; d++) {
      if (!(rule_axes(m, gt.dname[d]) & BIT(IR_AXIS_DP)) || osh.split[d]) continue;
      if (gt.dim[d] % ep) {
        char ok[256];
        sh_fail(S, "input \"%s\": dim '%s' = %lld is not divisible by ep = %d (expert parallelism splits each "
                "micro batch's '%s' over the ep ranks; make micro_batch a multiple of ep); the ep sizes that "
                "divide it: %s", n->sa, gt.dname[d], (long long)gt.dim[d], ep, gt.dname[d],
                sizes_dividing(gt.dim[d], 1, ok, sizeof ok));
        return;
      }
      osh.split[d] |= BIT(IR_AXIS_EP);
      break;
    }
  }
  if (n->op == IR_OP_STATE) {
    const IrState *s = &m->states.a[n->ia[0]];
    S->sh[i] = s->sh;
    S->taint[i] = 0;
    for (int d = 0; d < s->type.rank; d++) if (s->logical[d]) S->taint[i] |= BIT(d);
    S->nv[i] = emit(S, IR_OP_STATE, NULL, 0, n->ia, NULL, NULL, &s->type, &s->sh);
    return;
  }
  if (n->op == IR_OP_ACCUM) {
    IrState *g = &m->states.a[n->ia[0]];
    const IrState *p = g->of >= 0 ? &m->states.a[g->of] : g;
    IrSharding want_sh = p->sh;
    const IrSharding *xs = &S->sh[n->in[0]];
    /* a partial sum may stay partial along axes the parameter does not split,
     * and a split one split (a position embedding's gradient under sp or
     * cp: each rank accumulates its own rows): the update block reduces or
     * gathers once per step instead of every micro batch.  A second accum
     * into the same state (one per pipeline chunk reading a shared
     * parameter) takes the layout the first one gave it. */
    IrType gt = p->type;
    if (S->accumed[n->ia[0]]) want_sh = g->sh, gt = g->type;
    else
      for (int a = 0; a < IR_AXIS_COUNT; a++) {
        if (ax_get(&p->sh, a) != AX_R || a == IR_AXIS_DP || a == IR_AXIS_PP) continue;
        int d = ax_get(xs, a);
        /* the later accums into this state take this layout: keep it
         * partial or split only if those whose values are already laid out
         * (with pp, the head's gradient of a tied embedding comes before
         * the embedding's accum) have it too -- a replicated value cannot
         * be made a partial sum */
        for (int j = i + 1; j < S->ob.n && d != AX_R; j++)
          if (onode(S, j)->op == IR_OP_ACCUM && onode(S, j)->ia[0] == n->ia[0] && onode(S, j)->in[0] < i &&
              ax_get(&S->sh[onode(S, j)->in[0]], a) != d)
            d = AX_R;
        if (d == AX_P) want_sh.partial |= BIT(a);
        else if (d >= 0 && d < gt.rank && !p->sh.split[d] && xs->split[d] == BIT(a) && !p->logical[d] &&
                 gt.dim[d] % ir_axis_size(m, (IrAxis)a) == 0) {
          want_sh.split[d] |= BIT(a);
          gt.dim[d] /= ir_axis_size(m, (IrAxis)a);
        }
      }
    S->accumed[n->ia[0]] = 1;
    int x = conv(S, n->in[0], &want_sh);
    g->sh = want_sh;
    g->type = gt;
    memcpy(g->logical, p->logical, sizeof g->logical);
    S->nv[i] = emit(S, IR_OP_ACCUM, &x, 1, n->ia, NULL, NULL, NULL, NULL);
    return;
  }
  int in[64];
  for (int k = 0; k < nin; k++) {
    S->cur_k = k;
    in[k] = mk[k] ? scr_merge(S, n->in[k], n->in[1 - k], &ish[k], mk[k]) : conv_ex(S, n->in[k], &ish[k], keep[k]);
  }
  S->cur_k = -1;
  if (S->failed) return;
  S->sh[i] = osh;
  IrType lt = local_type(S, gt, &osh);
  if (ir_axis_size(m, IR_AXIS_EP) > 1) {
    int h = shard_moe_ep(S, i, in, &osh, &lt);
    if (h < 0) return;
    if (h > 0) {
      if (n->op != IR_OP_MOE_COUNTS) check_local(S, i, &lt);
      return;
    }
  }
  const IrType *typed = ir_op_given_type(n->op, &lt);
  int in0_split = nin > 0 ? ax_get(&ish[0], IR_AXIS_TP) : AX_R;   /* leaves have no ish[0] */
  uint8_t red_axes = (n->op == IR_OP_MAX || n->op == IR_OP_MEAN) ? ish[0].split[n->ia[0]] : 0;
  int64_t ia[IR_MAX_IATTR];
  memcpy(ia, n->ia, sizeof ia);
  if (n->op == IR_OP_MOE_PERM && (osh.split[0] & BIT(IR_AXIS_CP))) ia[0] = lt.dim[0];   /* the rank's rows */
  if ((n->op == IR_OP_ATTENTION || n->op == IR_OP_ATTENTION_BWD) && S->cp_a2a && ax_get(&ish[0], IR_AXIS_CP) == 2 &&
      S->C > 1) {   /* all-to-all to head-split layouts and back */
    S->nv[i] = lower_a2a(S, i, in, ish, &osh);
    check_local(S, i, &lt);
    return;
  }
  if ((n->op == IR_OP_ATTENTION || n->op == IR_OP_ATTENTION_BWD) && ax_get(&ish[1], IR_AXIS_CP) == 2 &&
      ir_axis_size(m, IR_AXIS_CP) > 1) {   /* k / v as cp blocks: the ring, step by step */
    S->why = n->op == IR_OP_ATTENTION
        ? "ring attention under cp: each rank's key / value block is passed to the next rank while the rank "
          "computes on it (6 (cp-1) blocks per layer and micro batch with the backward)"
        : "ring attention's backward under cp: the key / value blocks go round once more for dq, dk and dv, "
          "and the other ranks' dk / dv partial sums travel with their blocks back to the owner";
    S->nv[i] = lower_ring(S, i, in, ish, &osh);
    S->why = NULL;
    check_local(S, i, &lt);
    return;
  }
  switch (n->op) {
  case IR_OP_CROSS_ENTROPY: case IR_OP_CROSS_ENTROPY_BWD: {
    int last = onode(S, n->in[0])->type.rank - 1;
    if (in0_split == last) {
      S->why = "cross entropy over vocabulary-split logits (no rank holds the whole logits): the row max, the "
               "sum of exponentials and the target's logit are reduced over the ranks that split the vocabulary";
      S->nv[i] = lower_ce(S, i, in, ish, &osh);
      S->why = NULL;
      return;
    }
    if (S->taint[n->in[0]]) {
      int64_t pa[2] = {last, onode(S, n->in[0])->type.dim[last]};
      double fill = -INFINITY;
      in[0] = emit(S, IR_OP_PAD_FILL, &in[0], 1, pa, &fill, NULL, NULL, &ish[0]);
    }
    break;
  }
  case IR_OP_MAX:
    if (red_axes) {                   /* local max, then the max over each axis */
      int lm = emit(S, n->op, in, nin, ia, n->fa, n->sa, NULL, &osh);
      for (int a = 0; a < IR_AXIS_COUNT; a++) {
        if (!(red_axes & BIT(a))) continue;
        int64_t ar[2] = {a, 1};
        S->why = "max over a dim split across ranks: the local max, then the max over the axis";
        lm = emit(S, IR_OP_ALL_REDUCE, &lm, 1, ar, NULL, NULL, NULL, &osh);
        S->why = NULL;
      }
      S->nv[i] = lm;
      return;
    }
    break;
  case IR_OP_MEAN:
    if (red_axes) {                   /* the local mean is k times a share of the global one */
      IrSharding r = osh;
      int lm = emit(S, n->op, in, nin, ia, n->fa, n->sa, NULL, &r);
      double c = 1.0 / (double)axes_size(S, red_axes);
      S->nv[i] = emit(S, IR_OP_MULS, &lm, 1, NULL, &c, NULL, NULL, &osh);
      return;
    }
    break;
  default:
    break;
  }
  S->nv[i] = emit(S, n->op, in, nin, ia, n->fa, n->sa, typed, &osh);
  check_local(S, i, &lt);
}

int pass_shard(IrModule *m, PassCtx *cx) {
  int T = ir_axis_size(m, IR_AXIS_TP), C = ir_axis_size(m, IR_AXIS_CP), E = ir_axis_size(m, IR_AXIS_EP);
  if (m->par.sp && T < 2) {
    snprintf(cx->err, sizeof cx->err, "shard: sequence parallelism (sp) needs tp > 1, got tp=%d", T);
    return -1;
  }
  if (T < 2 && C < 2 && E < 2) return 0;
  int bi = ir_block_find(m, "micro");
  if (bi < 0) { snprintf(cx->err, sizeof cx->err, "shard: the module has no block \"micro\" (run autodiff first)"); return -1; }
  if (ir_block_find(m, "update") >= 0) { snprintf(cx->err, sizeof cx->err, "shard: run before the optimizer pass"); return -1; }
  Sh S = {0};
  S.m = m;
  S.cx = cx;
  S.T = T;
  S.C = C;
  S.sp = m->par.sp;
  S.cp_ring = cx->cp_attn != PASS_CP_ATTN_ALLGATHER;
  S.cp_a2a = cx->cp_attn == PASS_CP_ATTN_A2A;
  S.seq_name = ts_intern("seq");
  for (int r = 0; r < m->rules.n; r++)
    if (m->rules.a[r].axes & BIT(IR_AXIS_CP)) S.seq_name = m->rules.a[r].dim;
  S.ob = m->blocks.a[bi];
  S.nb = bi;
  int n = S.ob.n;
  S.nv = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.nv);
  S.sh = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.sh);
  S.hint = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.hint);
  S.taint = arena_alloc(&cx->scratch, (size_t)(n + 1));
  S.has_hint = arena_alloc(&cx->scratch, (size_t)(n + 1));
  S.conv = ts_xcalloc((size_t)n + 1, sizeof *S.conv);
  S.accumed = arena_alloc(&cx->scratch, (size_t)m->states.n + 1);
  S.xl = arena_alloc(&cx->scratch, (size_t)(n + 1));
  memset(S.xl, 0, (size_t)(n + 1));
  S.xc = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.xc);
  S.cntl = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.cntl);
  S.cnt_of = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.cnt_of);
  S.xconv = ts_xcalloc((size_t)n + 1, sizeof *S.xconv);
  S.ring_st = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.ring_st);
  S.ring_lse = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.ring_lse);
  S.ring_drow = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.ring_drow);
  S.ring_out = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.ring_out);
  S.scr = arena_alloc(&cx->scratch, (size_t)(n + 1));
  S.scr_src = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *S.scr_src);
  S.red = arena_alloc(&cx->scratch, (size_t)(n + 1));
  memset(S.scr, 0, (size_t)(n + 1));
  compute_red(&S);
  for (int i = 0; i <= n; i++)
    S.xc[i] = S.cntl[i] = S.cnt_of[i] = S.ring_st[i] = S.ring_lse[i] = S.ring_drow[i] = S.ring_out[i] = -1;
  for (int i = 0; i < n; i++)
    if (S.ob.nodes[i].op == IR_OP_MOE_COUNTS) S.cnt_of[S.ob.nodes[i].in[0]] = i;
  memset(S.accumed, 0, (size_t)m->states.n + 1);
  memset(S.sh, 0, (size_t)(n + 1) * sizeof *S.sh);
  memset(S.hint, 0, (size_t)(n + 1) * sizeof *S.hint);
  memset(S.taint, 0, (size_t)(n + 1));
  memset(S.has_hint, 0, (size_t)(n + 1));
  for (int i = 0; i < n; i++) S.nv[i] = -1;

  /* the model's sizes, before padding: checked in messages */
  if ((!S.sp || sp_check_inputs(&S) == 0) && shard_params(&S) == 0) {
    compute_hints(&S);
    m->blocks.a[bi] = (IrBlock){S.ob.name, NULL, 0, 0};
    for (int i = 0; i < n && !S.failed; i++) shard_node(&S, i);
    if (!S.failed && C > 1) cp_splits_something(&S);
  }
  for (int i = 0; i < n + 1; i++) { free(S.conv[i].a); free(S.xconv[i].a); }
  free(S.conv);
  free(S.xconv);
  free(S.ce.a);
  if (S.failed) return -1;
  /* grads never accumulated (no path from the loss) keep their param's layout */
  for (int s = 0; s < m->states.n; s++) {
    IrState *g = &m->states.a[s];
    if (g->kind == IR_STATE_PARAM || g->of < 0) continue;
    const IrState *p = &m->states.a[g->of];
    if (!ir_type_same_shape(&g->type, &p->type) && ir_sharding_is_none(&g->sh)) {
      g->type = p->type;
      g->sh = p->sh;
      memcpy(g->logical, p->logical, sizeof g->logical);
    }
  }
  return 0;
}
