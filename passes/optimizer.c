/* optimizer.c - the once-per-step update block: gradient collectives over
 * the mesh, global gradient norm, clipping, AdamW (optionally ZeRO-1, the
 * distributed optimizer), and zeroing the gradient accumulators.
 *
 * Expects: a block "micro" (autodiff's, possibly sharded by `shard`)
 *   accumulating into grad states (kind grad, `of` = their parameter, the
 *   parameter's local type).  A grad state's sharding says how it relates
 *   to the global gradient: split like its parameter (`{0:tp}`) and/or
 *   partial over non-dp axes (`{partial:tp}`).  No block "update" yet.
 *   dp = ir_axis_size(m, IR_AXIS_DP), ZeRO on when dp > 1 and m->par.zero.
 * Guarantees: over dp every accumulator is a partial sum (each dp rank sums
 *   its own micro batches): with dp > 1 the grad states and the values
 *   accumulated into them are marked `partial:dp`, with dp = 1 they are
 *   not (the micro block's computation never depends on dp; only these
 *   marks do).  And a block "update" that
 *   1. reads every grad state; all-reduces it over the non-dp axes it is
 *      partial over; then over dp: nothing (dp = 1), an all_reduce
 *      (zero = 0), or (ZeRO) flatten -> zero-pad to dp*c -> reduce_scatter,
 *      leaving the rank's chunk [c], c = ceil(numel / dp);
 *   2. norm = sqrt(sum of squares of the WHOLE global gradient), exactly the
 *      single-rank value: square sums of grads split over an axis are
 *      partial over it and all-reduced once per distinct set of axes,
 *      replicated grads are counted once; with ZeRO the chunks are disjoint
 *      (padding is zero), so one all_reduce over dp at the end.  Reported
 *      as `output "grad_norm"`.  Axes of size 1 get no collective;
 *   3. coef = clip_coef(norm, max = train.clip_grad) (1 when clipping is
 *      off), the factor every gradient is scaled by;
 *   4. one `adamw` per parameter with new zero states "adam_m.<param>" /
 *      "adam_v.<param>": the parameter's local type and sharding, or (ZeRO)
 *      type [c] and sharding {flat:dp} - adamw then updates only the rank's
 *      chunk of the parameter; weight decay train.weight_decay, 0 for
 *      params flagged nodecay;
 *   5. (ZeRO) after every adamw, each parameter rebuilt from the ranks'
 *      updated chunks: flatten -> pad -> shard_slice (own chunk) ->
 *      all_gather -> slice [0, n) -> reshape -> assign;
 *   6. zeroes every grad state for the next step's accumulation.
 * Every value carries its IrSharding; a chunk value is the flattened,
 * padded vector [dp*c] split along dim 0 over dp (`{0:dp}`), the moment
 * states are `{flat:dp}`.  ZeRO's flattened vectors are of the rank's
 * local tensor over the other axes (a tp-split parameter is chunked within
 * its tp block, as in Megatron's distributed optimizer): only their dp
 * layout is annotated.  The scalars are in the
 * module's precision dtype.  The norm is computed before any adamw so it
 * sees this step's gradients unchanged.  With dp = 1 and no shardings the
 * block is the plain single-rank one (no collectives, no reshapes).
 *
 * Pipeline (pp > 1, whole-model module: parallel stage=0, blocks fwd.<g> /
 * bwd.<g> of every global chunk g instead of "micro"; docs/pipeline.md):
 *   one block "update.<r>" per pipeline rank r, built as above over the
 *   gradients of the parameters r's chunks (g % pp == r) use: a parameter
 *   read, or a gradient accumulated, in a chunk of r.  A gradient used on
 *   several pipeline ranks (the tied embedding and head) is each member's
 *   partial sum: it is first summed over them, `group_sum ~axis=pp
 *   ranks=MASK`, so every member holds the same bits and updates its copy
 *   of the parameter identically.  In the norm each gradient is counted on
 *   one rank only (the lowest of its members), so the square sums are
 *   partial over pp and all-reduced over pp after the other axes.  A
 *   gradient no chunk uses goes to rank 0 (its parameter still decays).
 *   tp, sp, cp, ep and dp (ZeRO or not) are handled inside each update.<r>
 *   exactly as in the single-stage block.  With pp = 1 nothing changes.
 *
 * pass_respecialize_dp (mrun running a plan at another dp than it was
 * compiled for) drops the update block and the moments and runs this pass
 * and dce again.  It refuses pipeline modules (recompile with --dp). */
#include "passes.h"

#define DP_BIT (1u << IR_AXIS_DP)
#define PP_BIT (1u << IR_AXIS_PP)
/* ranks=MASK of group_sum is an int64 bit mask of pp coordinates */
#define PP_MAX_MASK_RANKS 62

/* Emits into the update block; the first failure is written to cx->err and
 * every later call returns -1 without emitting (operands < 0 propagate).
 * sh (NULL = unsharded) becomes the node's sharding. */
typedef struct { IrModule *m; PassCtx *cx; int b; int failed; } Em;
static int em(Em *e, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
              const char *sa, const IrType *type, const IrSharding *sh) {
  if (e->failed) return -1;
  for (int k = 0; k < nin; k++)
    if (in[k] < 0) { e->failed = 1; return -1; }
  char err[512];
  int id = ir_emit(e->m, e->b, op, in, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) {
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: cannot emit %s: %s", ir_ops[op].name, err);
    return -1;
  }
  if (sh) e->m->blocks.a[e->b].nodes[id].sh = *sh;
  return id;
}

/* The update block's view of the mesh. */
typedef struct {
  int dp;            /* dp ranks */
  int zero;          /* ZeRO-1: dp > 1 and m->par.zero */
  unsigned live;     /* axes of size > 1: only they need collectives */
  IrDtype prec;      /* dtype of the scalars */
  unsigned ppn;      /* PP_BIT when building a pipeline rank's update (the norm's
                        square sums are partial over pp), else 0 */
} Mesh;

/* One parameter's gradient as the update block handles it. */
typedef struct {
  int g, p;          /* grad state, param state */
  unsigned split;    /* live non-dp axes splitting the grad: its square sum is partial over them */
  int64_t n, c;      /* numel of the local param; ZeRO chunk ceil(n / dp) */
  int val;           /* the rank's true local gradient [param type], or (ZeRO) its reduced chunk [c] */
  uint64_t ranks;    /* pipeline: pp coordinates whose chunks use it (bit r); 0 with pp = 1 */
  int in_norm;       /* counted in this block's norm (pipeline: only on its lowest rank) */
} Grad;

static IrSharding sh_partial(unsigned mask) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.partial = (uint8_t)mask;
  return s;
}
static IrSharding sh_flat_dp(void) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.flat = (uint8_t)DP_BIT;
  return s;
}
/* A dp chunk of a flattened vector: its dim 0 split over dp. */
static IrSharding sh_chunk_dp(void) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.split[0] = (uint8_t)DP_BIT;
  return s;
}
static void type_vec(IrType *t, IrDtype dt, int64_t n) {
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = 1;
  t->dim[0] = n;
}

/* x : [local param shape] -> the row-major flattening padded with zeros to
 * [dp*c] (no-ops skipped).  sh is the result's sharding. */
static int flat_padded(Em *e, int x, const Grad *gr, const Mesh *ms, const IrSharding *sh) {
  if (x < 0) return -1;
  const IrType t = e->m->blocks.a[e->b].nodes[x].type;
  if (t.rank != 1) {
    IrType ft;
    type_vec(&ft, t.dtype, gr->n);
    x = em(e, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &ft, sh);
  }
  if (gr->c * ms->dp > gr->n) {
    int64_t ia[3] = {0, 0, gr->c * ms->dp - gr->n};
    x = em(e, IR_OP_PAD, &x, 1, ia, NULL, NULL, NULL, sh);
  }
  return x;
}

/* Says why communication node id is there (IrNode.why; mcc --report
 * sharding): fmt with the parameter's name. */
static void say(Em *e, int id, const char *fmt, const char *param) {
  if (e->failed || id < 0) return;
  char buf[512];
  snprintf(buf, sizeof buf, fmt, param);
  e->m->blocks.a[e->b].nodes[id].why = ts_intern(buf);
}

/* Step 1: the gradient value G of gr (sets gr->val). */
static void grad_value(Em *e, Grad *gr, const Mesh *ms) {
  const IrState *gs = &e->m->states.a[gr->g];
  IrType gt = gs->type;
  IrSharding sh = gs->sh;      /* partial:dp when dp > 1 (dp_marks) */
  int64_t gi[1] = {gr->g};
  int v = em(e, IR_OP_STATE, NULL, 0, gi, NULL, NULL, &gt, &sh);
  if (gr->ranks & (gr->ranks - 1)) {
    /* accumulated on several pipeline ranks: their sum, identical on each */
    sh.partial &= (uint8_t)~PP_BIT;
    int64_t ia[2] = {IR_AXIS_PP, (int64_t)gr->ranks};
    v = em(e, IR_OP_GROUP_SUM, &v, 1, ia, NULL, NULL, NULL, &sh);
    say(e, v, "%s is read on several pipeline stages (a tied parameter): its gradient is summed across them "
        "once per step", e->m->states.a[gr->p].name);
  }
  /* rows the ranks accumulated apart (split where the parameter is whole:
   * a position embedding under sp or cp): gathered once per step */
  const IrState *ps = &e->m->states.a[gr->p];
  for (int d = 0; d < gt.rank && d < IR_MAX_RANK; d++)
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      if (!(sh.split[d] & ~ps->sh.split[d] & (1u << a))) continue;
      sh.split[d] &= (uint8_t)~(1u << a);
      int64_t ia[2] = {a, d};
      v = em(e, IR_OP_ALL_GATHER, &v, 1, ia, NULL, NULL, NULL, &sh);
      say(e, v, "each rank accumulated its own rows of the gradient of %s over the step (the parameter is whole, "
          "its gradient split like the activations): gathered once per step, not per micro batch", ps->name);
    }
  /* partial over a size-1 axis is the same as replicated: no collective;
   * over pp a gradient is summed by group_sum only */
  sh.partial &= (uint8_t)((ms->live | DP_BIT) & ~PP_BIT);
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (a == IR_AXIS_DP || !(sh.partial & (1u << a))) continue;
    sh.partial &= (uint8_t)~(1u << a);
    int64_t ia[2] = {a, 0};
    v = em(e, IR_OP_ALL_REDUCE, &v, 1, ia, NULL, NULL, NULL, &sh);
    char f[256];
    snprintf(f, sizeof f, "the gradient of %%s is a partial sum over %s (each rank holds its share of the "
             "micro batches' contributions): summed once per step, not per micro batch", ir_axis_name((IrAxis)a));
    say(e, v, f, e->m->states.a[gr->p].name);
  }
  if (ms->dp > 1 && !ms->zero) {
    sh.partial &= (uint8_t)~DP_BIT;
    int64_t ia[2] = {IR_AXIS_DP, 0};
    v = em(e, IR_OP_ALL_REDUCE, &v, 1, ia, NULL, NULL, NULL, &sh);
    say(e, v, "data parallelism (--no-zero): the gradient of %s is summed over the dp ranks once per step",
        e->m->states.a[gr->p].name);
  } else if (ms->zero) {
    IrSharding pd = sh_partial(DP_BIT), ch = sh_chunk_dp();
    v = flat_padded(e, v, gr, ms, &pd);
    int64_t ia[2] = {IR_AXIS_DP, 0};
    v = em(e, IR_OP_REDUCE_SCATTER, &v, 1, ia, NULL, NULL, NULL, &ch);
    say(e, v, "ZeRO-1: the gradient of %s is summed over the dp ranks once per step, each rank getting the chunk "
        "whose optimizer state it holds", e->m->states.a[gr->p].name);
  }
  gr->val = v;
}

/* Step 2 for one gradient: its square sum as a precision scalar, partial
 * over the axes splitting it (and over dp with ZeRO: chunks are disjoint). */
static int grad_sumsq(Em *e, const Grad *gr, const Mesh *ms) {
  IrSharding sh = sh_partial(gr->split | (ms->zero ? DP_BIT : 0) | ms->ppn);
  int sq = em(e, IR_OP_SUMSQ, &gr->val, 1, NULL, NULL, NULL, NULL, &sh);
  if (!e->failed && e->m->blocks.a[e->b].nodes[sq].type.dtype != ms->prec) {
    IrType ct = {ms->prec, 0, {0}, {0}};
    sq = em(e, IR_OP_CAST, &sq, 1, NULL, NULL, NULL, &ct, &sh);
  }
  return sq;
}

/* all_reduce (sum) of x over every axis in mask, clearing them from its
 * partial mask (which starts as `partial`). */
static int reduce_over(Em *e, int x, unsigned mask, unsigned partial) {
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (!(mask & (1u << a))) continue;
    partial &= ~(1u << a);
    IrSharding sh = sh_partial(partial);
    int64_t ia[2] = {a, 0};
    x = em(e, IR_OP_ALL_REDUCE, &x, 1, ia, NULL, NULL, NULL, &sh);
    say(e, x, "the global gradient norm (for clipping): square sums added over the ranks that hold parts of %s",
        "the gradients");
  }
  return x;
}

/* Steps 1-2: every gradient's value (gr->val) and the global norm.  Square
 * sums are added per set of splitting axes (a tp-split grad's sum is
 * partial over tp, a replicated one is not: adding them before the
 * all_reduce would count the replicated ones tp times); each set is
 * all-reduced over its axes, then all are added.  On one rank each
 * gradient's value and square sum are emitted together (the single-rank
 * block's order); when values come from collectives, every value is
 * emitted first, so that a GPU rank issues the collectives back to back on
 * its comm stream and the square sums overlap the ones still in flight
 * (docs/cuda.md "Collectives on a GPU"; the values live until adamw
 * either way, so memory does not grow). */
static int values_and_norm(Em *e, Grad *grads, int ng, const Mesh *ms) {
  enum { NMASK = 1 << IR_AXIS_COUNT };
  int sum[NMASK], order[NMASK], nsets = 0;
  for (int k = 0; k < NMASK; k++) sum[k] = -1;
  /* the axes every square sum stays partial over until the very end */
  unsigned zdp = (ms->zero ? DP_BIT : 0) | ms->ppn;
  int comm_first = ms->dp > 1 || ms->live;
  for (int k = 0; comm_first && k < ng; k++) grad_value(e, &grads[k], ms);
  for (int k = 0; k < ng; k++) {
    if (!comm_first) grad_value(e, &grads[k], ms);
    if (!grads[k].in_norm) continue;
    int sq = grad_sumsq(e, &grads[k], ms);
    unsigned s = grads[k].split;
    if (sum[s] < 0) { sum[s] = sq; order[nsets++] = (int)s; continue; }
    IrSharding sh = sh_partial(s | zdp);
    int in[2] = {sum[s], sq};
    sum[s] = em(e, IR_OP_ADD, in, 2, NULL, NULL, NULL, NULL, &sh);
  }
  int total = -1;
  for (int k = 0; k < nsets; k++) {
    unsigned s = (unsigned)order[k];
    int x = reduce_over(e, sum[s], s, s | zdp);
    if (total < 0) { total = x; continue; }
    IrSharding sh = sh_partial(zdp);
    int in[2] = {total, x};
    total = em(e, IR_OP_ADD, in, 2, NULL, NULL, NULL, NULL, &sh);
  }
  if (total < 0 && !e->failed) {
    /* a pipeline rank counting no gradient still joins the pp all_reduce */
    IrType sc = {ms->prec, 0, {0}, {0}};
    IrSharding sh = sh_partial(zdp);
    double zero = 0.0;
    total = em(e, IR_OP_FULL, NULL, 0, NULL, &zero, NULL, &sc, &sh);
  }
  total = reduce_over(e, total, zdp, zdp);
  return em(e, IR_OP_SQRT, &total, 1, NULL, NULL, NULL, NULL, NULL);
}

/* The moment state "<prefix>.<param>" of gr's parameter: the param's type
 * and sharding, or (ZeRO) a flat dp chunk [c].  Made by ir_state_derived;
 * a leftover one of the right kind (an earlier update block's) is reused
 * and re-typed.  -1 with cx->err on a name clash. */
static int moment_state(Em *e, const Grad *gr, const Mesh *ms, IrStateKind kind, const char *prefix) {
  IrModule *m = e->m;
  char name[512];
  snprintf(name, sizeof name, "%s.%s", prefix, m->states.a[gr->p].name);
  int s = ir_state_find(m, name);
  if (s < 0 || m->states.a[s].kind != kind || m->states.a[s].of != gr->p)
    s = ir_state_derived(m, gr->p, kind, prefix, e->cx->err, sizeof e->cx->err);
  if (s < 0) { e->failed = 1; return -1; }
  const IrState *ps = &m->states.a[gr->p];
  IrState *d = &m->states.a[s];
  if (ms->zero) {
    type_vec(&d->type, ps->type.dtype, gr->c);
    d->sh = sh_flat_dp();
    memset(d->logical, 0, sizeof d->logical);
  } else {
    d->type = ps->type;
    d->sh = ps->sh;           /* split like the parameter */
    memcpy(d->logical, ps->logical, sizeof d->logical);
  }
  return s;
}

/* Step 4: adamw for one parameter. */
static void adamw(Em *e, const Grad *gr, const Mesh *ms, int coef) {
  int mst = moment_state(e, gr, ms, IR_STATE_ADAM_M, "adam_m");
  int vst = mst < 0 ? -1 : moment_state(e, gr, ms, IR_STATE_ADAM_V, "adam_v");
  if (vst < 0) return;
  const IrModule *m = e->m;
  const IrTrain *t = &m->train;
  int64_t ia[3] = {gr->p, mst, vst};
  double fa[4] = {t->beta1, t->beta2, t->eps,
                  (m->states.a[gr->p].flags & IR_STATE_NODECAY) ? 0.0 : t->weight_decay};
  int g = gr->val;
  if (!e->failed && m->blocks.a[e->b].nodes[g].op == IR_OP_STATE) {
    /* no collective in between: read the accumulator again, as the
     * single-rank block always did (keeps the norm's read short-lived) */
    const IrNode *gn = &m->blocks.a[e->b].nodes[g];
    IrType gt = gn->type;
    IrSharding gsh = gn->sh;
    int64_t gi[1] = {gr->g};
    g = em(e, IR_OP_STATE, NULL, 0, gi, NULL, NULL, &gt, &gsh);
  }
  int in[2] = {coef, g};
  em(e, IR_OP_ADAMW, in, 2, ia, fa, NULL, NULL, NULL);
}

/* Step 5 (ZeRO): param p <- all ranks' updated chunks, gathered. */
static void rebuild_param(Em *e, const Grad *gr, const Mesh *ms) {
  const IrState *ps = &e->m->states.a[gr->p];
  IrType pt = ps->type;
  IrSharding psh = ps->sh, none = sh_partial(0), ch = sh_chunk_dp();
  int64_t pi[1] = {gr->p};
  int x = em(e, IR_OP_STATE, NULL, 0, pi, NULL, NULL, &pt, &psh);
  x = flat_padded(e, x, gr, ms, &none);
  int64_t ia[2] = {IR_AXIS_DP, 0};
  x = em(e, IR_OP_SHARD_SLICE, &x, 1, ia, NULL, NULL, NULL, &ch);
  x = em(e, IR_OP_ALL_GATHER, &x, 1, ia, NULL, NULL, NULL, &none);
  say(e, x, "ZeRO-1: %s is re-assembled from the chunks the dp ranks updated", ps->name);
  if (gr->c * ms->dp > gr->n) {
    int64_t sa[3] = {0, 0, gr->n};
    x = em(e, IR_OP_SLICE, &x, 1, sa, NULL, NULL, NULL, &none);
  }
  /* back to p's type, dim names included (a slice drops a rank-1 name) */
  if (!e->failed && ir_type_equal(&e->m->blocks.a[e->b].nodes[x].type, &pt)) e->m->blocks.a[e->b].nodes[x].sh = psh;
  else x = em(e, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &pt, &psh);
  em(e, IR_OP_ASSIGN, &x, 1, pi, NULL, NULL, NULL, NULL);
}

/* The grads of m (states of kind grad) into grads[]; their count, or -1
 * with cx->err. */
static int collect_grads(IrModule *m, PassCtx *cx, const Mesh *ms, Grad *grads) {
  int ng = 0;
  for (int s = 0; s < m->states.n; s++) {
    const IrState *gs = &m->states.a[s];
    if (gs->kind != IR_STATE_GRAD) continue;
    int p = gs->of;
    if (p < 0 || p >= m->states.n || m->states.a[p].kind != IR_STATE_PARAM)
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s is not attached to a parameter", gs->name);
    const IrState *ps = &m->states.a[p];
    /* split like its parameter, and maybe along dims the parameter keeps
     * whole (rows accumulated apart; grad_value gathers them): the grad's
     * type is the parameter's with those dims divided */
    IrType want = ps->type;
    int layout_ok = !ps->sh.partial && !ps->sh.flat;
    for (int d = 0; d < IR_MAX_RANK && layout_ok; d++) {
      unsigned extra = gs->sh.split[d] & ~ps->sh.split[d];
      if ((gs->sh.split[d] & ps->sh.split[d]) != ps->sh.split[d] || (extra && ps->sh.split[d])) layout_ok = 0;
      for (int a = 0; a < IR_AXIS_COUNT && d < want.rank; a++)
        if (extra & (1u << a)) want.dim[d] /= ir_axis_size(m, (IrAxis)a);
    }
    if (!ir_type_same_shape(&gs->type, &want)) {
      char a[256], b[256];
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s : %s does not have the type of its parameter @%s : %s",
                     gs->name, ir_type_str(&gs->type, a, sizeof a), ps->name, ir_type_str(&ps->type, b, sizeof b));
    }
    unsigned split = 0;
    for (int d = 0; d < IR_MAX_RANK; d++) split |= gs->sh.split[d];
    if (gs->sh.flat || (split & DP_BIT)) {
      char shs[128];
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s has sharding %s; a gradient is never "
                     "split or flat over dp (it is partial over dp)", gs->name,
                     ir_sharding_str(&gs->sh, gs->type.rank, shs, sizeof shs));
    }
    if (!layout_ok) {
      char a[128], b[128];
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s is laid out %s but its parameter @%s %s; "
                     "a gradient is split like its parameter (and maybe along dims the parameter keeps whole)",
                     gs->name, ir_sharding_str(&gs->sh, gs->type.rank, a, sizeof a), ps->name,
                     ir_sharding_str(&ps->sh, ps->type.rank, b, sizeof b));
    }
    split = 0;
    for (int d = 0; d < IR_MAX_RANK; d++) split |= ps->sh.split[d];
    Grad *g = &grads[ng++];
    g->g = s;
    g->p = p;
    g->split = split & ms->live;
    g->n = ir_type_numel(&ps->type);
    g->c = (g->n + ms->dp - 1) / ms->dp;
    g->val = -1;
    g->ranks = 0;
    g->in_norm = 1;
  }
  if (!ng) return ts_errf(cx->err, sizeof cx->err, "optimizer: no parameter receives a gradient; nothing to train");
  /* a parameter without a gradient would never change: refused, not frozen */
  unsigned char *has = ts_xcalloc((size_t)m->states.n + 1, 1);
  for (int k = 0; k < ng; k++) has[grads[k].p] = 1;
  int unused = -1, count = 0;
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_PARAM && !has[s]) {
      if (unused < 0) unused = s;
      count++;
    }
  free(has);
  char more[48] = "";
  if (count > 1) snprintf(more, sizeof more, " (and %d more)", count - 1);
  if (unused >= 0)
    return ts_errf(cx->err, sizeof cx->err, "optimizer: parameter @%s%s does not influence the loss (no gradient "
                   "reaches it, or only through ops without one), so training would never change it; use it in "
                   "the model or remove it", m->states.a[unused].name, more);
  return ng;
}

/* Over dp every accumulator is a partial sum (each dp rank adds its own
 * micro batches).  With dp > 1 the grad states and the values accumulated
 * into them say so (the verifier checks that a state read and an accum
 * operand are laid out like their state, and that a dp collective reduces
 * a dp-partial value); with dp = 1 they do not, so the single-rank module
 * is unsharded.  Only these marks change with dp. */
static void dp_marks(IrModule *m, int on) {
  uint8_t bit = (uint8_t)DP_BIT;
  for (int s = 0; s < m->states.n; s++) {
    IrState *st = &m->states.a[s];
    if (st->kind == IR_STATE_GRAD) st->sh.partial = on ? st->sh.partial | bit : st->sh.partial & ~bit;
  }
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_ACCUM || n->ia[0] < 0 || n->ia[0] >= m->states.n) continue;
      if (m->states.a[n->ia[0]].kind != IR_STATE_GRAD || n->in[0] < 0 || n->in[0] >= i) continue;
      IrSharding *sh = &b->nodes[n->in[0]].sh;
      sh->partial = on ? sh->partial | bit : sh->partial & ~bit;
    }
  }
}

/* The shardings dp_marks may change in the blocks' nodes, to restore. */
typedef struct { int b, id; IrSharding sh; } SavedSh;
static SavedSh *save_accum_operands(IrModule *m, Arena *a, int *n_out) {
  int n = 0;
  for (int bi = 0; bi < m->blocks.n; bi++)
    for (int i = 0; i < m->blocks.a[bi].n; i++) n += m->blocks.a[bi].nodes[i].op == IR_OP_ACCUM;
  SavedSh *v = arena_alloc(a, ((size_t)n + 1) * sizeof *v);
  int k = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (nd->op != IR_OP_ACCUM || nd->in[0] < 0 || nd->in[0] >= i) continue;
      v[k].b = bi;
      v[k].id = nd->in[0];
      v[k++].sh = b->nodes[nd->in[0]].sh;
    }
  }
  *n_out = k;
  return v;
}

/* fp16: 1 / state @loss_scale, a scalar of the update block. */
static int inv_loss_scale(Em *e, const Mesh *ms) {
  int s = ir_state_find(e->m, "loss_scale");
  if (s < 0 || e->m->states.a[s].kind != IR_STATE_SCALER) {
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: an fp16 module without its loss scale @loss_scale (autodiff "
             "makes it)");
    return -1;
  }
  IrType sc = {ms->prec, 0, {0}, {0}};
  double one = 1.0;
  int64_t ia[1] = {s};
  int in[2] = {em(e, IR_OP_FULL, NULL, 0, NULL, &one, NULL, &sc, NULL),
               em(e, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &e->m->states.a[s].type, NULL)};
  return em(e, IR_OP_DIV, in, 2, NULL, NULL, NULL, NULL, NULL);
}

/* Steps 1-6 into a new block `name` for the gradients grads[0..ng). */
static int build_update(IrModule *m, PassCtx *cx, const char *name, Grad *grads, int ng, const Mesh *ms) {
  Em e = {m, cx, ir_block_add(m, name), 0};
  /* 1-2. reduced gradients and the global norm, before any adamw */
  int total_norm = values_and_norm(&e, grads, ng, ms);
  /* fp16: the gradients carry the loss scale; 1 / scale multiplies the
   * norm and the clip factor (exactly the norm and clip of the unscaled
   * gradients: passes/scaler.c) */
  int inv = scaler_on(m) ? inv_loss_scale(&e, ms) : -1;
  if (inv >= 0) total_norm = em(&e, IR_OP_MUL, (int[]){total_norm, inv}, 2, NULL, NULL, NULL, NULL, NULL);
  em(&e, IR_OP_OUTPUT, &total_norm, 1, NULL, NULL, "grad_norm", NULL, NULL);

  /* 3. the clipping factor */
  int coef;
  if (m->train.clip_grad > 0) {
    double mx = m->train.clip_grad;
    coef = em(&e, IR_OP_CLIP_COEF, &total_norm, 1, NULL, &mx, NULL, NULL, NULL);
  } else {
    IrType sc = {ms->prec, 0, {0}, {0}};
    double one = 1.0;
    coef = em(&e, IR_OP_FULL, NULL, 0, NULL, &one, NULL, &sc, NULL);
  }

  if (inv >= 0) coef = em(&e, IR_OP_MUL, (int[]){coef, inv}, 2, NULL, NULL, NULL, NULL, NULL);

  /* 4-5. AdamW per parameter; with ZeRO, then the all-gathers */
  for (int k = 0; k < ng && !e.failed; k++) adamw(&e, &grads[k], ms, coef);
  for (int k = 0; ms->zero && k < ng && !e.failed; k++) rebuild_param(&e, &grads[k], ms);

  /* 6. clear the accumulators */
  for (int k = 0; k < ng; k++) {
    int64_t ia[1] = {grads[k].g};
    em(&e, IR_OP_ZERO, NULL, 0, ia, NULL, NULL, NULL, NULL);
  }
  return e.failed ? -1 : 0;
}

/* Pipeline: the pp coordinates using each state, by the chunks of the
 * blocks fwd.<g> / bwd.<g> referring to it (bit g % pp); 0 = none.
 * Returns the array (scratch), or NULL with cx->err when the module is not
 * a whole-model pipeline module. */
static uint64_t *pipe_state_ranks(IrModule *m, PassCtx *cx, int pp) {
  uint64_t *use = arena_alloc(&cx->scratch, ((size_t)m->states.n + 1) * sizeof *use);
  int nchunk_blocks = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int g = ir_block_chunk(b, NULL);
    if (g < 0) {
      if (strncmp(b->name, "update", 6) == 0) {
        ts_errf(cx->err, sizeof cx->err, "optimizer: block \"%s\" already exists", b->name);
        return NULL;
      }
      continue;
    }
    nchunk_blocks++;
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < IR_MAX_IATTR; k++) {
        if (!ir_op_iattr_is_state(b->nodes[i].op, k)) continue;
        int64_t s = b->nodes[i].ia[k];
        if (s >= 0 && s < m->states.n) use[s] |= 1ull << (g % pp);
      }
  }
  if (!nchunk_blocks) {
    ts_errf(cx->err, sizeof cx->err, "optimizer: pp=%d but the module has no pipeline blocks fwd.<g> / bwd.<g> "
            "(run the partition and pipeline passes first)", pp);
    return NULL;
  }
  return use;
}

int pass_optimizer(IrModule *m, PassCtx *cx) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  int pipe = pp > 1 && m->par.stage == 0;
  if (pp > 1 && !pipe) {
    snprintf(cx->err, sizeof cx->err, "optimizer: this is the program of pipeline rank %d (stage=%d); the update "
             "blocks are built on the whole-model module (stage=0)", m->par.stage - 1, m->par.stage);
    return -1;
  }
  if (pipe && pp > PP_MAX_MASK_RANKS) {
    snprintf(cx->err, sizeof cx->err, "optimizer: pp=%d: at most %d pipeline ranks are supported (group_sum's rank "
             "mask is 64 bits)", pp, PP_MAX_MASK_RANKS);
    return -1;
  }
  if (pipe && ir_block_find(m, "micro") >= 0) {
    snprintf(cx->err, sizeof cx->err, "optimizer: pp=%d but the module still has block \"micro\" (the pipeline "
             "pass cuts it into fwd.<g> / bwd.<g>)", pp);
    return -1;
  }
  if (!pipe && ir_block_find(m, "micro") < 0) { snprintf(cx->err, sizeof cx->err, "optimizer: the module has no block \"micro\" (run autodiff first)"); return -1; }
  if (ir_block_find(m, "update") >= 0) { snprintf(cx->err, sizeof cx->err, "optimizer: block \"update\" already exists"); return -1; }
  Mesh ms;
  ms.prec = m->train.precision;
  if (!ir_dtype_is_float(ms.prec)) { snprintf(cx->err, sizeof cx->err, "optimizer: precision must be f32 or f64"); return -1; }
  ms.dp = ir_axis_size(m, IR_AXIS_DP);
  ms.zero = ms.dp > 1 && m->par.zero;
  ms.live = 0;
  ms.ppn = pipe ? PP_BIT : 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (ir_axis_size(m, (IrAxis)a) > 1) ms.live |= 1u << a;
  uint64_t *use = pipe ? pipe_state_ranks(m, cx, pp) : NULL;
  if (pipe && !use) return -1;

  int nstates0 = m->states.n, nblocks0 = m->blocks.n;
  /* moment_state may re-type leftover moment states: keep them to restore */
  IrState *saved = arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof *saved);
  if (nstates0) memcpy(saved, m->states.a, (size_t)nstates0 * sizeof *saved);
  Grad *grads = arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof *grads);
  int ng = collect_grads(m, cx, &ms, grads);
  if (ng < 0) return -1;
  int nacc;
  SavedSh *acc = save_accum_operands(m, &cx->scratch, &nacc);
  dp_marks(m, ms.dp > 1);

  int rc = 0;
  if (!pipe) {
    rc = build_update(m, cx, "update", grads, ng, &ms);
  } else {
    /* a gradient belongs to the ranks reading its parameter or accumulating
     * into it; one that no chunk uses goes to rank 0 */
    for (int k = 0; k < ng; k++) {
      grads[k].ranks = use[grads[k].g] | use[grads[k].p];
      if (!grads[k].ranks) grads[k].ranks = 1;
    }
    Grad *mine = arena_alloc(&cx->scratch, ((size_t)ng + 1) * sizeof *mine);
    for (int r = 0; r < pp && rc == 0; r++) {
      int n = 0;
      for (int k = 0; k < ng; k++) {
        if (!(grads[k].ranks & (1ull << r))) continue;
        mine[n] = grads[k];
        /* counted in the norm once: on the lowest rank holding it */
        mine[n++].in_norm = (grads[k].ranks & ((1ull << r) - 1)) == 0;
      }
      char name[32];
      snprintf(name, sizeof name, "update.%d", r);
      rc = build_update(m, cx, name, mine, n, &ms);
    }
  }

  if (rc == 0 && scaler_on(m)) rc = scaler_blocks(m, cx);   /* fp16: the inf check and the skip */
  if (rc != 0) {             /* leave the module as it was */
    m->blocks.n = nblocks0;
    if (nstates0) memcpy(m->states.a, saved, (size_t)nstates0 * sizeof *saved);
    ir_states_truncate(m, nstates0);
    for (int k = 0; k < nacc; k++) m->blocks.a[acc[k].b].nodes[acc[k].id].sh = acc[k].sh;
    return -1;
  }
  return 0;
}

/* ---- pass_respecialize_dp ---- */

static int is_moment(const IrState *s) { return s->kind == IR_STATE_ADAM_M || s->kind == IR_STATE_ADAM_V; }

/* The index of the first moment state if the moments can be dropped by
 * truncating the state array: they are the last states and no block but
 * `ub` refers to them (this pass appended them after everything the micro
 * block uses).  -1 with a message otherwise. */
static int droppable_moments(const IrModule *m, int ub, char *err, size_t errlen) {
  int first = m->states.n;
  for (int s = 0; s < m->states.n; s++)
    if (is_moment(&m->states.a[s])) { first = s; break; }
  for (int s = first; s < m->states.n; s++)
    if (!is_moment(&m->states.a[s]))
      return ts_errf(err, errlen, "state @%s (%s) comes after the optimizer moments, so they cannot be dropped",
                     m->states.a[s].name, ir_state_kind_name(m->states.a[s].kind));
  for (int bi = 0; bi < m->blocks.n; bi++) {
    if (bi == ub) continue;
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < IR_MAX_IATTR; k++)
        if (ir_op_iattr_is_state(b->nodes[i].op, k) && b->nodes[i].ia[k] >= first && b->nodes[i].ia[k] < m->states.n)
          return ts_errf(err, errlen, "block %s, node %d uses optimizer state @%s", b->name, i,
                         m->states.a[b->nodes[i].ia[k]].name);
  }
  return first;
}

static void block_remove(IrModule *m, int bi) {
  memmove(&m->blocks.a[bi], &m->blocks.a[bi + 1], (size_t)(m->blocks.n - bi - 1) * sizeof *m->blocks.a);
  m->blocks.n--;
}
static void block_insert(IrModule *m, int bi, const IrBlock *b) {
  VEC_PUSH(m->blocks, *b);   /* grows; then shift into place */
  memmove(&m->blocks.a[bi + 1], &m->blocks.a[bi], (size_t)(m->blocks.n - bi - 1) * sizeof *m->blocks.a);
  m->blocks.a[bi] = *b;
}

int pass_respecialize_dp(IrModule *m, int dp, char *err, size_t errlen) {
  if (dp < 1 || dp > (1 << 20)) return ts_errf(err, errlen, "respecialize: dp=%d is out of range (1 .. 2^20)", dp);
  /* a pipeline rank's program holds only its chunks: its update block
   * cannot be rebuilt without the other ranks' (group_sum masks, the norm) */
  if (ir_axis_size(m, IR_AXIS_PP) > 1)
    return ts_errf(err, errlen, "respecialize to dp=%d: this is a pipeline plan (pp=%d), compiled for dp=%d; a "
                   "pipeline plan cannot be adapted to another dp at run time: recompile it with mcc --dp %d",
                   dp, ir_axis_size(m, IR_AXIS_PP), ir_axis_size(m, IR_AXIS_DP), dp);
  int ub = ir_block_find(m, "update");
  if (ub < 0) return ts_errf(err, errlen, "respecialize: the module has no block \"update\" (the optimizer pass did not run)");
  char why[512];
  int first = droppable_moments(m, ub, why, sizeof why);
  if (first < 0) return ts_errf(err, errlen, "respecialize to dp=%d: %s", dp, why);

  /* Detach the update block and the moments, keeping them to restore the
   * module if the optimizer refuses.  The old block's nodes stay in the
   * module arena (freed with the module). */
  IrBlock old = m->blocks.a[ub];
  int nmom = m->states.n - first;
  IrState *mom = nmom ? ts_xmalloc((size_t)nmom * sizeof *mom) : NULL;
  if (nmom) memcpy(mom, &m->states.a[first], (size_t)nmom * sizeof *mom);
  IrParallel par0 = m->par;
  block_remove(m, ub);
  ir_states_truncate(m, first);
  m->par.dp = dp;

  /* a plan compiled with fusion gets its new update block fused too (the
   * same module as compiling at this dp); one from mcc --no-fuse has no
   * groups anywhere and gets none */
  int fused = 0;
  for (int bi = 0; bi < m->blocks.n && !fused; bi++)
    for (int i = 0; i < m->blocks.a[bi].n && !fused; i++) fused = m->blocks.a[bi].nodes[i].group > 0;
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_optimizer(m, &cx);
  int nb = rc == 0 ? ir_block_find(m, "update") : -1;
  if (nb >= 0 && nb != ub) {   /* back in its place, before the blocks later passes add (eval) */
    IrBlock b = m->blocks.a[nb];
    block_remove(m, nb);
    block_insert(m, ub, &b);
  }
  if (rc == 0) rc = pass_dce(m, &cx);
  if (rc == 0 && fused) rc = pass_fuse(m, &cx);
  if (rc == 0 && ir_verify(m, why, sizeof why) != 0)
    rc = ts_errf(cx.err, sizeof cx.err, "internal error: IR invalid after respecializing: %s", why);
  if (rc != 0) {
    ts_errf(err, errlen, "respecialize to dp=%d: %s", dp, cx.err);
    int nb = ir_block_find(m, "update");
    if (nb >= 0) block_remove(m, nb);
    ir_states_truncate(m, first);
    for (int k = 0; k < nmom; k++) VEC_PUSH(m->states, mom[k]);
    block_insert(m, ub, &old);
    m->par = par0;
    dp_marks(m, ir_axis_size(m, IR_AXIS_DP) > 1);   /* the marks of the old dp */
  }
  pass_ctx_free(&cx);
  free(mom);
  return rc;
}
