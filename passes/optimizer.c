/* optimizer.c - the once-per-step update block: gradient collectives over
 * the mesh, global gradient norm, clipping, each parameter's step (AdamW,
 * SGD, Lion or Muon: one row per kind in upd_kinds; optionally ZeRO-1, the
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
 *   4. one step per parameter, its kind chosen in one place
 *      (parameter_kind, upd_kinds): `adamw` with new zero states
 *      "adam_m.<param>" / "adam_v.<param>", `sgd` with "momentum.<param>",
 *      `lion` with "lion_m.<param>": the parameter's local type and
 *      sharding, or (ZeRO) type [c] and sharding {flat:dp} - the step then
 *      updates only the rank's chunk of the parameter; muon (train.optimizer
 *      muon, for the matrices of linear maps other than the embedding and
 *      the head): "muon_m.<param>" whole (never a ZeRO chunk), the
 *      Newton-Schulz iteration as matmuls whose collectives follow from the
 *      matmul sharding rule (or a gather of the matrix, train.muon_tp), then
 *      `lr_step`; weight decay train.weight_decay, 0 for params flagged
 *      nodecay;
 *   5. (ZeRO) after every step, each parameter but muon's rebuilt from the ranks'
 *      updated chunks: flatten -> pad -> shard_slice (own chunk) ->
 *      all_gather -> slice [0, n) -> reshape -> assign;
 *   5b. each 16-bit copy of a parameter (pass precision's copy states)
 *      assigned its cast from the updated parameter;
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
 * and dce again.  A pipeline rank's program (stage = r + 1) gets update.<r>
 * again, as "update": which of its gradients other ranks hold is read from
 * its old block's group_sums (the program has only r's chunks), and its
 * moments are made in the whole-model module's order, so the program
 * equals the one compiled at that dp.  The whole-model pipeline module is
 * refused (mrun respecializes the rank programs). */
#include "passes.h"
#include <math.h>

#define DP_BIT (1u << IR_AXIS_DP)
#define PP_BIT (1u << IR_AXIS_PP)
/* ranks=MASK of group_sum is a 64-bit mask of pp coordinates (stored in
 * the int64 attribute: coordinate 63 makes it negative) */
#define PP_MAX_MASK_RANKS 64

/* Emits into the update block; the first failure is written to cx->err and
 * every later call returns -1 without emitting (operands < 0 propagate).
 * sh (NULL = unsharded) becomes the node's sharding. */
typedef struct { IrModule *m; PassCtx *cx; int b; int failed; } Em;
static int em(Em *e, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
              const char *sa, const IrType *type, const IrSharding *sh) {
  return pass_emit(e->m, e->cx, e->b, &e->failed, "optimizer", op, in, nin, ia, fa, sa, type, sh);
}

/* The update block's view of the mesh. */
typedef struct {
  int dp;            /* dp ranks */
  int zero;          /* ZeRO-1 (or 3): dp > 1 and m->par.zero */
  int z3;            /* ZeRO-3: dp > 1 and m->par.zero == 3 (pass zero3 sharded parameters and gradients) */
  unsigned live;     /* axes of size > 1: only they need collectives */
  IrDtype prec;      /* dtype of the scalars */
  unsigned ppn;      /* PP_BIT when building a pipeline rank's update (the norm's
                        square sums are partial over pp), else 0 */
} Mesh;

/* One parameter's gradient as the update block handles it. */
typedef struct {
  int g, p;          /* grad state, param state */
  int w;             /* the state adamw updates: p, or (ZeRO-3) p's shard */
  unsigned split;    /* live non-dp axes splitting the grad: its square sum is partial over them */
  int64_t n, c;      /* numel of the local param; ZeRO chunk ceil(n / zn) */
  unsigned zax;      /* ZeRO-1: the axes its optimizer state is sharded over, DP_BIT and the live cp / ep
                        axes its gradient is partial over (Megatron's data-parallel group: docs/sharding.md) */
  int zn;            /* the number of ranks of zax (dp without ZeRO-1) */
  int val;           /* the rank's true local gradient [param type], or (ZeRO) its reduced chunk [c] */
  uint64_t ranks;    /* pipeline: pp coordinates whose chunks use it (bit r); 0 with pp = 1 */
  int in_norm;       /* counted in this block's norm (pipeline: only on its lowest rank) */
  int kind;          /* its update rule: a row of upd_kinds (below) */
  int64_t vr, vc;    /* muon: the local matrix the parameter is [vr, vc] (its 2-D view at the matmuls) */
  uint8_t vsplit[2]; /* muon: the axes splitting the view's rows and columns */
  int vblock;        /* muon: the split parameter dim leads its side of the view, so a rank holds a
                        contiguous block of the view's rows or columns (gathering it is concatenation) */
} Grad;

static IrSharding sh_partial(unsigned mask) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.partial = (uint8_t)mask;
  return s;
}
/* A ZeRO moment state: a flat chunk over the parameter's data-parallel
 * axes (dp, or dp+cp / dp+ep: Grad.zax). */
static IrSharding sh_flat(unsigned zax) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.flat = (uint8_t)zax;
  return s;
}
/* A chunk of a flattened vector: its dim 0 split over the axes zax.  Its
 * cp level is contiguous (cp*), not the sequence's causal zigzag: a flat
 * vector is cut into plain blocks, block dp_coord * cp + cp_coord. */
static IrSharding sh_chunk(unsigned zax) {
  IrSharding s;
  memset(&s, 0, sizeof s);
  s.split[0] = (uint8_t)(zax | (zax & (1u << IR_AXIS_CP) ? IR_SPLIT_CP_MINOR : 0));
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
  (void)ms;
  if (gr->c * gr->zn > gr->n) {
    int64_t ia[3] = {0, 0, gr->c * gr->zn - gr->n};
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

/* ZeRO-1: the rank's chunk [c] of gradient v (partial over dp and over
 * the axes of `partial` among gr->zax, replicated over the others): the
 * flattened, padded vector [zn*c] cut over the axes of zax, outer axis
 * major (block dp_coord * cp + cp_coord for dp+cp).  Axis by axis, outer
 * to inner: a reduce-scatter over a run of axes it is partial over (one
 * collective over dp+cp when the cp ranks hold partial sums, as Megatron's
 * reduce-scatter over its data-parallel group), a shard_slice over a run
 * of axes it is replicated over (each cp rank keeps its part of the dp
 * rank's block: no communication). */
static int zero_chunk(Em *e, int v, const Grad *gr, const Mesh *ms, unsigned partial) {
  unsigned pend = (partial & gr->zax) | DP_BIT, done = 0;
  IrSharding cur = sh_partial(pend);
  v = flat_padded(e, v, gr, ms, &cur);
  const char *name = e->m->states.a[gr->p].name;
  for (int a = 0; a < IR_AXIS_COUNT;) {
    if (!(gr->zax & (1u << a))) { a++; continue; }
    unsigned part = (pend >> a) & 1u, run = 0;
    int b = a;
    for (; b < IR_AXIS_COUNT; b++) {
      if (!(gr->zax & (1u << b))) continue;
      if (((pend >> b) & 1u) != part) break;
      run |= 1u << b;
    }
    done |= run;
    cur.partial &= (uint8_t)~run;
    cur.split[0] = sh_chunk(done).split[0];
    int64_t ia[2] = {ir_axes_attr(run), 0};
    v = em(e, part ? IR_OP_REDUCE_SCATTER : IR_OP_SHARD_SLICE, &v, 1, ia, NULL, NULL, NULL, &cur);
    if (!part)
      say(e, v, "ZeRO-1 over the joint data-parallel group: the gradient of %s is the same on these ranks (its "
          "micro block gathered the activations), so each keeps its part of the chunk without communicating", name);
    else if (run == DP_BIT)
      say(e, v, "ZeRO-1: the gradient of %s is summed over the dp ranks once per step, each rank getting the chunk "
          "whose optimizer state it holds", name);
    else
      say(e, v, "ZeRO-1 over the joint data-parallel group: the gradient of %s, a partial sum over dp and over the "
          "cp / ep ranks (each saw its share of the tokens), is summed over all of them once per step in one "
          "reduce-scatter, each rank getting the chunk whose optimizer state it holds", name);
    a = b;
  }
  return v;
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
    /* ZeRO-1: the data-parallel axes (zax) are reduce-scattered together below */
    if (a == IR_AXIS_DP || !(sh.partial & (1u << a)) || (ms->zero && !gs->sh.flat && (gr->zax & (1u << a)))) continue;
    sh.partial &= (uint8_t)~(1u << a);
    int64_t ia[2] = {a, 0};
    v = em(e, IR_OP_ALL_REDUCE, &v, 1, ia, NULL, NULL, NULL, &sh);
    char f[256];
    snprintf(f, sizeof f, "the gradient of %%s is a partial sum over %s (each rank holds its share of the "
             "micro batches' contributions): summed once per step, not per micro batch", ir_axis_name((IrAxis)a));
    say(e, v, f, e->m->states.a[gr->p].name);
  }
  if (gs->sh.flat) {
    /* ZeRO-3: reduce-scattered over dp in every micro batch (pass zero3) */
  } else if (ms->dp > 1 && !ms->zero) {
    sh.partial &= (uint8_t)~DP_BIT;
    int64_t ia[2] = {IR_AXIS_DP, 0};
    v = em(e, IR_OP_ALL_REDUCE, &v, 1, ia, NULL, NULL, NULL, &sh);
    say(e, v, "data parallelism (--no-zero): the gradient of %s is summed over the dp ranks once per step",
        e->m->states.a[gr->p].name);
  } else if (ms->zero) {
    v = zero_chunk(e, v, gr, ms, sh.partial);
  }
  gr->val = v;
}

/* Step 2 for one gradient: its square sum as a precision scalar, partial
 * over the axes splitting it (and over dp with ZeRO: chunks are disjoint). */
static int grad_sumsq(Em *e, const Grad *gr, const Mesh *ms) {
  IrSharding sh = sh_partial(gr->split | (ms->zero ? gr->zax : 0) | ms->ppn);
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
    /* a ZeRO chunk over dp+cp: its square sum is partial over cp too */
    unsigned s = grads[k].split | (ms->zero ? grads[k].zax & ~DP_BIT : 0);
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
 * and sharding, or (flat: ZeRO) a flat dp chunk [c].  Made by ir_state_derived;
 * a leftover one of the right kind (an earlier update block's) is reused
 * and re-typed.  -1 with cx->err on a name clash. */
static int moment_state(Em *e, const Grad *gr, int flat, IrStateKind kind, const char *prefix) {
  IrModule *m = e->m;
  char name[512];
  snprintf(name, sizeof name, "%s.%s", prefix, m->states.a[gr->p].name);
  int s = ir_state_find(m, name);
  if (s < 0 || m->states.a[s].kind != kind || m->states.a[s].of != gr->p)
    s = ir_state_derived(m, gr->p, kind, prefix, e->cx->err, sizeof e->cx->err);
  if (s < 0) { e->failed = 1; return -1; }
  const IrState *ps = &m->states.a[gr->p];
  IrState *d = &m->states.a[s];
  if (flat) {
    type_vec(&d->type, ps->type.dtype, gr->c);
    d->sh = sh_flat(gr->zax);
    memset(d->logical, 0, sizeof d->logical);
  } else {
    d->type = ps->type;
    d->sh = ps->sh;           /* split like the parameter */
    memcpy(d->logical, ps->logical, sizeof d->logical);
  }
  return s;
}

/* gr's gradient operand for its step: gr->val, or (no collective in
 * between) the accumulator read again, as the single-rank block always did
 * (keeps the norm's read short-lived). */
static int step_grad(Em *e, const Grad *gr) {
  const IrModule *m = e->m;
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
  return g;
}

/* gr's weight decay: train.weight_decay, 0 for params flagged nodecay. */
static double decay_of(const Em *e, const Grad *gr) {
  return (e->m->states.a[gr->p].flags & IR_STATE_NODECAY) ? 0.0 : e->m->train.weight_decay;
}

/* Step 4, adamw: states adam_m / adam_v. */
static void step_adamw(Em *e, const Grad *gr, const Mesh *ms, int coef) {
  int mst = moment_state(e, gr, ms->zero, IR_STATE_ADAM_M, "adam_m");
  int vst = mst < 0 ? -1 : moment_state(e, gr, ms->zero, IR_STATE_ADAM_V, "adam_v");
  if (vst < 0) return;
  const IrTrain *t = &e->m->train;
  int64_t ia[3] = {gr->w, mst, vst};   /* the parameter, or (ZeRO-3) its shard */
  double fa[4] = {t->beta1, t->beta2, t->eps, decay_of(e, gr)};
  int in[2] = {coef, step_grad(e, gr)};
  em(e, IR_OP_ADAMW, in, 2, ia, fa, NULL, NULL, NULL);
}

/* Step 4, sgd (torch.optim.SGD: its momentum buffer "momentum.<param>")
 * or lion (its moment "lion_m.<param>", betas train.beta1/2): one moment
 * of kind adam_m (the first moment), flat under ZeRO like adamw's. */
static void step_one_moment(Em *e, const Grad *gr, const Mesh *ms, int coef, IrOp op) {
  int mst = moment_state(e, gr, ms->zero, IR_STATE_ADAM_M, op == IR_OP_SGD ? "momentum" : "lion_m");
  if (mst < 0) return;
  const IrTrain *t = &e->m->train;
  int64_t ia[2] = {gr->p, mst};
  double fa[3] = {op == IR_OP_SGD ? t->momentum : t->beta1, op == IR_OP_SGD ? (t->nesterov ? 1.0 : 0.0) : t->beta2,
                  decay_of(e, gr)};
  int in[2] = {coef, step_grad(e, gr)};
  em(e, op, in, 2, ia, fa, NULL, NULL, NULL);
}
static void step_sgd(Em *e, const Grad *gr, const Mesh *ms, int coef) { step_one_moment(e, gr, ms, coef, IR_OP_SGD); }
static void step_lion(Em *e, const Grad *gr, const Mesh *ms, int coef) { step_one_moment(e, gr, ms, coef, IR_OP_LION); }

/* ---- Muon ---- */

/* A scalar of the precision dtype, or a tensor of type t filled with the
 * scalar x: broadcast, laid out sh. */
static int fill_like(Em *e, int x, const IrType *t, const IrSharding *sh) {
  IrType bt = *t;
  return em(e, IR_OP_BROADCAST, &x, 1, NULL, NULL, NULL, &bt, sh);
}

/* The matmul sharding rule (docs/sharding.md, the table shard.c applies)
 * for 2-D operands with ta / tb as the op's: the result's rows are split
 * like a's rows, its columns like b's columns, and it is a partial sum
 * over the axes splitting the contracted dim (split alike in both).  -1
 * where the rule needs a gather first (the contracted dims split apart, or
 * both result dims over one axis): the Newton-Schulz orientation below
 * never asks for that. */
static int mm_rule(const IrSharding *a, const IrSharding *b, int ta, int tb, IrSharding *out) {
  unsigned ka = a->split[ta ? 0 : 1], kb = b->split[tb ? 1 : 0];
  memset(out, 0, sizeof *out);
  out->split[0] = a->split[ta ? 1 : 0];
  out->split[1] = b->split[tb ? 0 : 1];
  out->partial = (uint8_t)(a->partial | b->partial | ka);
  return ka != kb || (out->split[0] & out->split[1]) ? -1 : 0;
}

/* x @ y (ta, tb) laid out by mm_rule; a partial result is all-reduced over
 * each axis it is partial over (the Gram matrix of a split matrix). */
static int mm(Em *e, int x, int y, int ta, int tb, const char *param) {
  if (e->failed) return -1;
  IrSharding sh;
  const IrBlock *b = &e->m->blocks.a[e->b];
  if (mm_rule(&b->nodes[x].sh, &b->nodes[y].sh, ta, tb, &sh) != 0) {
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: internal error: muon's product for %s has no block layout", param);
    return -1;
  }
  int64_t ia[2] = {ta, tb};
  int z = em(e, IR_OP_MATMUL, (int[]){x, y}, 2, ia, NULL, NULL, NULL, &sh);
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (!(sh.partial & (1u << a))) continue;
    sh.partial &= (uint8_t)~(1u << a);
    int64_t ra[2] = {a, 0};
    z = em(e, IR_OP_ALL_REDUCE, &z, 1, ra, NULL, NULL, NULL, &sh);
    say(e, z, "muon: the Gram matrix of the update of %s is a partial sum over the ranks holding its blocks "
        "(the matmul contracts the split dim): summed once per Newton-Schulz iteration", param);
  }
  return z;
}

/* Muon's Newton-Schulz orthogonalisation of u [r, c] (laid out sh: at most
 * one dim split), Jordan et al.'s quintic iteration:
 *   X = u / (|u|_F + 1e-7);  steps times:  A = X X^T,  B = b A + c A A,  X = a X + B X
 * with (a, b, c) = (3.4445, -4.7750, 2.0315).  The reference transposes a
 * tall matrix so that A is the smaller Gram matrix; here A is the Gram
 * matrix over the dim split over ranks when there is one (X^T X, X B for a
 * row-split X: the same polynomial, X (X^T X)^k = (X X^T)^k X), so that it
 * is a partial sum that one all_reduce completes and X keeps its layout,
 * else over the longer dim as the reference. */
static int newton_schulz(Em *e, int u, int steps, const char *param) {
  const IrBlock *b0 = &e->m->blocks.a[e->b];
  const IrNode *un = &b0->nodes[u];
  IrType t = un->type;
  IrSharding sh = un->sh;
  int left = sh.split[1] ? 1 : sh.split[0] ? 0 : t.dim[0] <= t.dim[1];   /* A = X X^T (over the columns)? */
  IrSharding rep;
  memset(&rep, 0, sizeof rep);
  /* the Frobenius norm: square sums partial over the axes splitting u */
  int sq = em(e, IR_OP_SUMSQ, &u, 1, NULL, NULL, NULL, NULL, NULL);
  if (!e->failed) e->m->blocks.a[e->b].nodes[sq].sh.partial = (uint8_t)(sh.split[0] | sh.split[1]);
  for (int a = 0; a < IR_AXIS_COUNT && !e->failed; a++) {
    if (!(e->m->blocks.a[e->b].nodes[sq].sh.partial & (1u << a))) continue;
    int64_t ra[2] = {a, 0};
    IrSharding s2 = e->m->blocks.a[e->b].nodes[sq].sh;
    s2.partial &= (uint8_t)~(1u << a);
    sq = em(e, IR_OP_ALL_REDUCE, &sq, 1, ra, NULL, NULL, NULL, &s2);
    say(e, sq, "muon: the norm of the update of %s sums the squares of every rank's block", param);
  }
  int nrm = em(e, IR_OP_SQRT, &sq, 1, NULL, NULL, NULL, NULL, NULL);
  nrm = em(e, IR_OP_ADDS, &nrm, 1, NULL, (double[]){1e-7}, NULL, NULL, NULL);
  int x = em(e, IR_OP_DIV, (int[]){u, fill_like(e, nrm, &t, &sh)}, 2, NULL, NULL, NULL, NULL, &sh);
  static const double qa = 3.4445, qb = -4.7750, qc = 2.0315;
  for (int k = 0; k < steps && !e->failed; k++) {
    int A = left ? mm(e, x, x, 0, 1, param) : mm(e, x, x, 1, 0, param);
    int AA = mm(e, A, A, 0, 0, param);
    int B = em(e, IR_OP_ADD, (int[]){em(e, IR_OP_MULS, &A, 1, NULL, &qb, NULL, NULL, &rep),
                                     em(e, IR_OP_MULS, &AA, 1, NULL, &qc, NULL, NULL, &rep)}, 2, NULL, NULL, NULL, NULL, &rep);
    int BX = left ? mm(e, B, x, 0, 0, param) : mm(e, x, B, 0, 0, param);
    x = em(e, IR_OP_ADD, (int[]){em(e, IR_OP_MULS, &x, 1, NULL, &qa, NULL, NULL, &sh), BX}, 2, NULL, NULL, NULL, NULL, &sh);
  }
  return x;
}

/* The global dims of gr's matrix view (its local dims times the axes
 * splitting them). */
static void global_dims(const IrModule *m, const Grad *gr, int64_t *rows, int64_t *cols) {
  int64_t d[2] = {gr->vr, gr->vc};
  for (int k = 0; k < 2; k++)
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (gr->vsplit[k] & (1u << a)) d[k] *= ir_axis_size(m, (IrAxis)a);
  *rows = d[0];
  *cols = d[1];
}

/* Bytes a rank sends per step to orthogonalise gr's update split over the
 * live axes of vsplit (R x C global, n the ranks holding its blocks), ring
 * algorithm: *gram all-reducing the Gram matrix k x k over the split side
 * (k the whole side) every iteration and the norm's scalar; *gather one
 * all_gather of the matrix. */
static void muon_costs(const IrModule *m, const Grad *gr, int64_t R, int64_t C, double *gram, double *gather) {
  unsigned axes = (gr->vsplit[0] | gr->vsplit[1]), n = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (axes & (1u << a)) n *= (unsigned)ir_axis_size(m, (IrAxis)a);
  double es = (double)ir_dtype_size(m->states.a[gr->p].type.dtype), k = (double)(gr->vsplit[1] ? R : C);
  *gram = n > 1 ? 2.0 * (n - 1) / n * (m->train.muon_ns_steps * k * k + 1) * es : 0;
  *gather = n > 1 ? (double)(n - 1) / n * (double)R * (double)C * es : 0;
}

/* Whether muon gathers gr's tp-split matrix (1) or all-reduces its Gram
 * matrix (0): train.muon_tp, auto choosing the fewer bytes (a tie: the
 * all-reduce, which computes less); -1 when gather is asked for but the
 * rank's rows or columns are not one block. */
static int muon_gathers(const IrModule *m, const Grad *gr, int64_t R, int64_t C) {
  double gram, gather;
  muon_costs(m, gr, R, C, &gram, &gather);
  switch (m->train.muon_tp) {
  case IR_MUON_TP_ALLREDUCE: return 0;
  case IR_MUON_TP_GATHER: return gr->vblock ? 1 : -1;
  default: return gr->vblock && gather < gram;
  }
}

/* Step 4, muon (Jordan et al. 2024, the reference implementation's
 * muon_update, momentum as its lerp): for a 2-D parameter W [R, C] with
 * gradient g (clipped):
 *   buf = mu buf + (1 - mu) g;  u = nesterov ? (1 - mu) g + mu buf : buf   (buf "muon_m.<param>")
 *   W = W (1 - lr wd) - lr sqrt(max(1, R / C)) NS(u)
 * The whole matrix (its tp block) is needed, so the momentum is never a
 * ZeRO chunk: under ZeRO the gradient's reduced chunks are all-gathered
 * over dp (with the reduce_scatter the same bytes as an all_reduce), the
 * momentum is replicated over dp and every dp rank computes the same step
 * (docs/sharding.md "Muon"). */
static void step_muon(Em *e, const Grad *gr, const Mesh *ms, int coef) {
  IrModule *m = e->m;
  const IrState *ps = &m->states.a[gr->p];
  const char *name = ps->name;
  IrType pt = ps->type;
  IrSharding psh = ps->sh;
  int g = step_grad(e, gr);
  if (ms->zero) {   /* the reduced chunk [c] -> the whole (tp-local) gradient */
    IrSharding none = sh_partial(0);
    int64_t ia[2] = {ir_axes_attr(gr->zax), 0};
    g = em(e, IR_OP_ALL_GATHER, &g, 1, ia, NULL, NULL, NULL, &none);
    say(e, g, "muon: the update of %s needs the whole matrix: the dp ranks' reduced chunks of its gradient are "
        "gathered (with the reduce_scatter, the bytes of an all_reduce)", name);
    if (gr->c * gr->zn > gr->n) {
      int64_t sa[3] = {0, 0, gr->n};
      g = em(e, IR_OP_SLICE, &g, 1, sa, NULL, NULL, NULL, &none);
    }
    g = em(e, IR_OP_RESHAPE, &g, 1, NULL, NULL, NULL, &pt, &psh);
  }
  g = em(e, IR_OP_MUL, (int[]){g, fill_like(e, coef, &pt, &psh)}, 2, NULL, NULL, NULL, NULL, &psh);
  int bst = moment_state(e, gr, 0, IR_STATE_ADAM_M, "muon_m");
  if (bst < 0) return;
  const IrTrain *t = &m->train;
  double mu = t->muon_momentum;
  int64_t bi[1] = {bst};
  int buf = em(e, IR_OP_STATE, NULL, 0, bi, NULL, NULL, &pt, &psh);
  double mu1 = 1.0 - mu;
  int g1 = em(e, IR_OP_MULS, &g, 1, NULL, &mu1, NULL, NULL, &psh);
  buf = em(e, IR_OP_ADD, (int[]){em(e, IR_OP_MULS, &buf, 1, NULL, &mu, NULL, NULL, &psh), g1}, 2, NULL, NULL, NULL,
           NULL, &psh);
  em(e, IR_OP_ASSIGN, &buf, 1, bi, NULL, NULL, NULL, NULL);
  int u = buf;
  if (t->nesterov)
    u = em(e, IR_OP_ADD, (int[]){g1, em(e, IR_OP_MULS, &buf, 1, NULL, &mu, NULL, NULL, &psh)}, 2, NULL, NULL, NULL,
           NULL, &psh);
  if (gr->vsplit[0] && gr->vsplit[1] && !e->failed) {
    char shs[128];
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: muon: parameter %s (laid out %s) is split along both its "
             "rows and its columns; Newton-Schulz sums its Gram matrix over one split side only: use a layout "
             "that splits it along one side, or --optimizer adamw", name,
             ir_sharding_str(&psh, pt.rank, shs, sizeof shs));
    return;
  }
  IrType vt = pt;   /* the matrix view [vr, vc], laid out by gr->vsplit */
  vt.rank = 2;
  vt.dim[0] = gr->vr;
  vt.dim[1] = gr->vc;
  vt.dname[0] = vt.dname[1] = NULL;
  IrSharding vsh = sh_partial(0);
  vsh.split[0] = gr->vsplit[0];
  vsh.split[1] = gr->vsplit[1];
  if (pt.rank != 2) u = em(e, IR_OP_RESHAPE, &u, 1, NULL, NULL, NULL, &vt, &vsh);
  int64_t R, C;
  global_dims(m, gr, &R, &C);
  int sd = vsh.split[1] ? 1 : 0;   /* the split side, if any */
  unsigned axes = vsh.split[sd] & ms->live;
  if (axes && muon_gathers(m, gr, R, C) < 0) {
    e->failed = 1;
    snprintf(e->cx->err, sizeof e->cx->err, "optimizer: muon: --muon-tp-mode gather: parameter %s's rank holds "
             "rows or columns of its matrix that are not one block (the split dim is not the first of its side); "
             "use --muon-tp-mode allreduce (or auto)", name);
    return;
  }
  int x;
  if (axes && muon_gathers(m, gr, R, C)) {
    /* the whole matrix on every rank, orthogonalised there, the rank's block kept */
    IrSharding whole = vsh;
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      if (!(axes & (1u << a))) continue;
      whole.split[sd] &= (uint8_t)~(1u << a);
      int64_t ia[2] = {a, sd};
      u = em(e, IR_OP_ALL_GATHER, &u, 1, ia, NULL, NULL, NULL, &whole);
      say(e, u, "muon: the update of %s is gathered over the ranks holding its blocks, and every rank "
          "orthogonalises the whole matrix (fewer bytes than all-reducing its Gram matrix every iteration)", name);
    }
    x = newton_schulz(e, u, t->muon_ns_steps, name);
    for (int a = IR_AXIS_COUNT - 1; a >= 0; a--) {
      if (!(axes & (1u << a))) continue;
      whole.split[sd] |= (uint8_t)(1u << a);
      int64_t ia[2] = {a, sd};
      x = em(e, IR_OP_SHARD_SLICE, &x, 1, ia, NULL, NULL, NULL, &whole);
    }
  } else {
    x = newton_schulz(e, u, t->muon_ns_steps, name);
  }
  if (pt.rank != 2) x = em(e, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &pt, &psh);
  double fa[2] = {sqrt(R > C ? (double)R / (double)C : 1.0), decay_of(e, gr)};
  int64_t pi[1] = {gr->p};
  em(e, IR_OP_LR_STEP, &x, 1, pi, fa, NULL, NULL, NULL);
}

/* The update rules, one row per kind; whole: the rule needs the parameter's
 * whole (tp-local) tensor, so it never updates a ZeRO chunk (no rebuild
 * after it).  A parameter's row: parameter_kind. */
enum { UPD_ADAMW, UPD_SGD, UPD_LION, UPD_MUON };
static const struct {
  void (*emit)(Em *e, const Grad *gr, const Mesh *ms, int coef);
  int whole;
  const char *mom[2];   /* its moment states' prefixes, in the order emit makes them (kinds adam_m, adam_v) */
} upd_kinds[] = {
    [UPD_ADAMW] = {step_adamw, 0, {"adam_m", "adam_v"}},
    [UPD_SGD] = {step_sgd, 0, {"momentum", NULL}},
    [UPD_LION] = {step_lion, 0, {"lion_m", NULL}},
    [UPD_MUON] = {step_muon, 1, {"muon_m", NULL}},
};

/* Step 5 (ZeRO): param p <- all ranks' updated chunks, gathered. */
static void rebuild_param(Em *e, const Grad *gr, const Mesh *ms) {
  const IrState *ps = &e->m->states.a[gr->p];
  IrType pt = ps->type;
  IrSharding psh = ps->sh, none = sh_partial(0), ch = sh_chunk(gr->zax);
  int64_t pi[1] = {gr->p};
  int x = em(e, IR_OP_STATE, NULL, 0, pi, NULL, NULL, &pt, &psh);
  x = flat_padded(e, x, gr, ms, &none);
  int64_t ia[2] = {ir_axes_attr(gr->zax), 0};
  x = em(e, IR_OP_SHARD_SLICE, &x, 1, ia, NULL, NULL, NULL, &ch);
  x = em(e, IR_OP_ALL_GATHER, &x, 1, ia, NULL, NULL, NULL, &none);
  say(e, x, gr->zax == DP_BIT ? "ZeRO-1: %s is re-assembled from the chunks the dp ranks updated"
                              : "ZeRO-1: %s is re-assembled from the chunks the ranks of its joint data-parallel "
                                "group (dp+cp / dp+ep) updated", ps->name);
  if (gr->c * gr->zn > gr->n) {
    int64_t sa[3] = {0, 0, gr->n};
    x = em(e, IR_OP_SLICE, &x, 1, sa, NULL, NULL, NULL, &none);
  }
  /* back to p's type, dim names included (a slice drops a rank-1 name) */
  if (!e->failed && ir_type_equal(&e->m->blocks.a[e->b].nodes[x].type, &pt)) e->m->blocks.a[e->b].nodes[x].sh = psh;
  else x = em(e, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &pt, &psh);
  em(e, IR_OP_ASSIGN, &x, 1, pi, NULL, NULL, NULL, NULL);
}

/* Step 5b: each 16-bit copy of parameter gr->p = cast(p) (rounded as
 * runtime/cpu/half.h), so a device keeps its copies on the device.
 * next_copy: per state, the next copy state of the same parameter (-1 at
 * the end); first: per parameter, its first copy (both in state order). */
static void remake_copies(Em *e, const Grad *gr, const int *first, const int *next_copy) {
  for (int s = first[gr->p]; s >= 0; s = next_copy[s]) {
    IrType pt = e->m->states.a[gr->p].type, ct = e->m->states.a[s].type;
    IrSharding psh = e->m->states.a[gr->p].sh;
    int64_t pi[1] = {gr->p}, ci[1] = {s};
    int x = em(e, IR_OP_STATE, NULL, 0, pi, NULL, NULL, &pt, &psh);
    x = em(e, IR_OP_CAST, &x, 1, NULL, NULL, NULL, &ct, &psh);
    em(e, IR_OP_ASSIGN, &x, 1, ci, NULL, NULL, NULL, NULL);
  }
}

/* The parameter a value is read from: x itself a state read, or x made
 * from one by casts, layout ops and gathers (a 16-bit copy counts as its
 * master); -1 otherwise. */
static int param_of(const IrModule *m, const IrBlock *b, int x) {
  while (x >= 0) {
    const IrNode *n = &b->nodes[x];
    if (n->op == IR_OP_STATE) {
      const IrState *s = &m->states.a[n->ia[0]];
      int p = s->kind == IR_STATE_COPY ? s->of : (int)n->ia[0];
      return p >= 0 && m->states.a[p].kind == IR_STATE_PARAM ? p : -1;
    }
    if (n->op != IR_OP_CAST && n->op != IR_OP_RESHAPE && n->op != IR_OP_PERMUTE && n->op != IR_OP_ALL_GATHER &&
        n->op != IR_OP_SHARD_SLICE && n->op != IR_OP_SLICE && n->op != IR_OP_PAD)
      return -1;
    x = n->in[0];
  }
  return -1;
}

/* What muon needs to know of each parameter, read off the graph, never off
 * names.  io[p] = 1: an exclusion by role (Jordan et al.: the input
 * embedding and the output head are trained with AdamW): a parameter read
 * as a table (embedding, take, gather), or one a matmul reads on the last
 * stretch to the loss (walking back from `output "loss"`, stopping at each
 * matmul that reads a parameter: the head is the last one).  vr[p], vc[p]:
 * the 2-D local matrix a matmul reads the parameter as (an attention
 * weight [embed, heads, head_dim] is reshaped to [embed, heads*head_dim]),
 * 0 when no matmul reads it as a matrix. */
typedef struct { unsigned char *io; int64_t *vr, *vc; } Roles;
static void param_roles(const IrModule *m, Arena *a, const Roles *r) {
  unsigned char *io = r->io;
  const char *loss = ts_intern("loss");
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (!strncmp(b->name, "update", 6)) continue;
    unsigned char *seen = arena_alloc(a, (size_t)b->n + 1);
    memset(seen, 0, (size_t)b->n + 1);
    int *stack = arena_alloc(a, ((size_t)b->n + 1) * sizeof *stack), top = 0;
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if ((n->op == IR_OP_EMBEDDING || n->op == IR_OP_TAKE || n->op == IR_OP_GATHER) && n->nin > 0) {
        int p = param_of(m, b, n->in[0]);
        if (p >= 0) io[p] = 1;
      }
      for (int k = 0; n->op == IR_OP_MATMUL && k < 2; k++) {
        const IrType *t = &b->nodes[n->in[k]].type;
        int p = param_of(m, b, n->in[k]);
        if (p >= 0 && t->rank == 2 && !r->vr[p]) r->vr[p] = t->dim[0], r->vc[p] = t->dim[1];
      }
      if (n->op == IR_OP_OUTPUT && n->sa == loss && n->nin == 1 && !seen[n->in[0]]) {
        seen[n->in[0]] = 1;
        stack[top++] = n->in[0];
      }
    }
    while (top > 0) {
      const IrNode *n = &b->nodes[stack[--top]];
      if (n->op == IR_OP_MATMUL || n->op == IR_OP_GMM) {
        int pa = param_of(m, b, n->in[0]), pb = param_of(m, b, n->in[1]);
        if (pa >= 0) io[pa] = 1;
        if (pb >= 0) io[pb] = 1;
        if (pa >= 0 || pb >= 0) continue;
      }
      for (int k = 0; k < n->nin; k++)
        if (n->in[k] >= 0 && !seen[n->in[k]]) {
          seen[n->in[k]] = 1;
          stack[top++] = n->in[k];
        }
    }
  }
}

/* The update rule of gr's parameter: train.optimizer's; with muon, muon
 * for a hidden matrix (a parameter a matmul reads as a 2-D matrix: the
 * weight of a linear map, that is neither the embedding nor the head),
 * adamw for every other (biases, also 2-D ones such as a per-head bias
 * [heads, head_dim], norm gains, embeddings, the head, grouped expert
 * weights [G, K, N]), as the authors recommend.  Sets gr->vr / vc for muon. */
static int parameter_kind(const IrModule *m, Grad *gr, const Roles *r) {
  const IrState *ps = &m->states.a[gr->p];
  switch (m->train.optimizer) {
  case IR_OPT_SGD: return UPD_SGD;
  case IR_OPT_LION: return UPD_LION;
  case IR_OPT_MUON: {
    if (r->io[gr->p] || !r->vr[gr->p]) return UPD_ADAMW;
    gr->vr = r->vr[gr->p];
    gr->vc = r->vc[gr->p];
    /* the view groups the parameter's dims [0, j) into rows, the rest into
     * columns; a split of any dim of a group splits that side (a rank holds
     * a subset of its rows or columns: all Newton-Schulz needs) */
    int64_t rows = 1;
    int j = 0;
    while (j < ps->type.rank && rows < gr->vr) rows *= ps->type.dim[j++];
    if (rows != gr->vr || rows * gr->vc != ir_type_numel(&ps->type)) return UPD_ADAMW;   /* not a regrouping */
    gr->vsplit[0] = gr->vsplit[1] = 0;
    gr->vblock = 1;
    for (int d = 0; d < ps->type.rank; d++) {
      gr->vsplit[d >= j] |= ps->sh.split[d];
      if (ps->sh.split[d] && d != 0 && d != j) gr->vblock = 0;
    }
    return UPD_MUON;
  }
  default: return UPD_ADAMW;
  }
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
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s is not attached to a parameter", gs->name);  /* internal */
    const IrState *ps = &m->states.a[p];
    if (ps->flags & IR_STATE_SHARDED) {   /* ZeRO-3 (pass zero3): both are flat chunks [c] */
      int sh = ir_state_shard_of(m, p);
      if (!ms->z3 || sh < 0 || !gs->sh.flat || !ir_type_same_shape(&gs->type, &m->states.a[sh].type))
        return ts_errf(cx->err, sizeof cx->err, "optimizer: param @%s is held as ZeRO-3 shards but %s%s", ps->name,
                       !ms->z3 ? "the module is not compiled for --zero 3 at dp > 1" : "its gradient is not a flat "
                       "chunk like its shard: @", !ms->z3 ? "" : gs->name);  /* internal */
      Grad *g = &grads[ng++];
      memset(g, 0, sizeof *g);
      g->g = s;
      g->p = p;
      g->w = sh;
      g->n = ir_type_numel(&ps->type);
      g->c = ir_type_numel(&gs->type);
      g->zax = DP_BIT;   /* ZeRO-3's shards are over dp (the update all-reduces them over cp / ep) */
      g->zn = ms->dp;
      for (int d = 0; d < IR_MAX_RANK; d++) g->split |= ps->sh.split[d];
      g->split &= ms->live;
      g->val = -1;
      g->in_norm = 1;
      continue;
    }
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
                     gs->name, ir_type_str(&gs->type, a, sizeof a), ps->name, ir_type_str(&ps->type, b, sizeof b));  /* internal */
    }
    unsigned split = 0;
    for (int d = 0; d < IR_MAX_RANK; d++) split |= gs->sh.split[d];
    if (gs->sh.flat || (split & DP_BIT)) {
      char shs[128];
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s has sharding %s; a gradient is never "  /* internal */
                     "split or flat over dp (it is partial over dp)", gs->name,
                     ir_sharding_str(&gs->sh, gs->type.rank, shs, sizeof shs));
    }
    if (!layout_ok) {
      char a[128], b[128];
      return ts_errf(cx->err, sizeof cx->err, "optimizer: grad state @%s is laid out %s but its parameter @%s %s; "  /* internal */
                     "a gradient is split like its parameter (and maybe along dims the parameter keeps whole)",
                     gs->name, ir_sharding_str(&gs->sh, gs->type.rank, a, sizeof a), ps->name,
                     ir_sharding_str(&ps->sh, ps->type.rank, b, sizeof b));
    }
    split = 0;
    for (int d = 0; d < IR_MAX_RANK; d++) split |= ps->sh.split[d];
    Grad *g = &grads[ng++];
    g->g = s;
    g->p = p;
    g->w = p;
    g->split = split & ms->live;
    g->n = ir_type_numel(&ps->type);
    /* ZeRO-1's data-parallel group: dp, and the cp / ep ranks the
     * parameter is replicated over (Megatron-Core shards the distributed
     * optimizer over dp x cp, and non-expert parameters over dp x ep too;
     * an expert is split over ep, so its group is dp) */
    g->zax = DP_BIT;
    if (ms->zero && !ms->z3) g->zax |= ms->live & ~split & ((1u << IR_AXIS_CP) | (1u << IR_AXIS_EP));
    g->zn = 1;
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (g->zax & (1u << a)) g->zn *= ir_axis_size(m, (IrAxis)a);
    g->c = (g->n + g->zn - 1) / g->zn;
    g->val = -1;
    g->ranks = 0;
    g->in_norm = 1;
    g->kind = UPD_ADAMW;
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
    if (st->kind == IR_STATE_GRAD && !st->sh.flat) st->sh.partial = on ? st->sh.partial | bit : st->sh.partial & ~bit;
  }
  for (int bi = 0; bi < m->blocks.n; bi++) {
    IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_ACCUM || n->ia[0] < 0 || n->ia[0] >= m->states.n) continue;
      if (m->states.a[n->ia[0]].kind != IR_STATE_GRAD || n->in[0] < 0 || n->in[0] >= i) continue;
      if (m->states.a[n->ia[0]].sh.flat) continue;   /* ZeRO-3: a chunk summed over dp already */
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

  /* 4-5. each parameter's step; with ZeRO-1, then the all-gathers (ZeRO-3 keeps the shards) */
  for (int k = 0; k < ng && !e.failed; k++) upd_kinds[grads[k].kind].emit(&e, &grads[k], ms, coef);
  for (int k = 0; ms->zero && !ms->z3 && k < ng && !e.failed; k++)
    if (!upd_kinds[grads[k].kind].whole) rebuild_param(&e, &grads[k], ms);

  /* 5b. the 16-bit copies (pass precision) made again from their updated
   * masters, as the update's last writes: the next forward reads them */
  int nst = m->states.n;
  int *first = ts_xmalloc(((size_t)nst + 1) * sizeof *first), *next_copy = ts_xmalloc(((size_t)nst + 1) * sizeof *next_copy);
  for (int s = 0; s < nst; s++) first[s] = next_copy[s] = -1;
  for (int s = nst - 1; s >= 0; s--) {   /* one pass, not one per gradient: quadratic in the states */
    int of = m->states.a[s].of;
    if (m->states.a[s].kind != IR_STATE_COPY || of < 0 || of >= nst) continue;
    next_copy[s] = first[of];
    first[of] = s;
  }
  for (int k = 0; k < ng && !e.failed; k++) remake_copies(&e, &grads[k], first, next_copy);
  free(first);
  free(next_copy);

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
        ts_errf(cx->err, sizeof cx->err, "optimizer: block \"%s\" already exists", b->name);  /* internal */
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
    ts_errf(cx->err, sizeof cx->err, "optimizer: pp=%d but the module has no pipeline blocks fwd.<g> / bwd.<g> "  /* internal */
            "(run the partition and pipeline passes first)", pp);
    return NULL;
  }
  return use;
}

/* A pipeline rank's program (stage = r + 1) rebuilt for another dp: its
 * moments in the order the whole-model module made them (update.0's
 * parameters first, then update.1's new ones, ...: by the lowest rank
 * holding the gradient, then state order), so that the program equals the
 * one cut from a module compiled at this dp (pipeline_rank.c keeps states
 * in their order).  adamw finds them and re-types nothing. */
static int stage_moments(IrModule *m, PassCtx *cx, const Grad *grads, int ng, const Mesh *ms, int pp) {
  Em e = {m, cx, -1, 0};
  for (int low = 0; low < pp; low++)
    for (int k = 0; k < ng && !e.failed; k++) {
      if ((grads[k].ranks & -grads[k].ranks) != 1ull << low) continue;
      int kd = grads[k].kind, flat = ms->zero && !upd_kinds[kd].whole;
      for (int j = 0; j < 2 && upd_kinds[kd].mom[j] && !e.failed; j++)
        moment_state(&e, &grads[k], flat, j ? IR_STATE_ADAM_V : IR_STATE_ADAM_M, upd_kinds[kd].mom[j]);
    }
  return e.failed ? -1 : 0;
}

/* pass_optimizer, and (stage_ranks != NULL) the update block "update" of
 * one pipeline rank's program (stage = r + 1), for pass_respecialize_dp:
 * stage_ranks[s] is the pp coordinates holding grad state s, which the
 * program alone cannot tell (the other ranks' chunks are not in it). */
static int optimizer_run(IrModule *m, PassCtx *cx, const uint64_t *stage_ranks) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  int stage_prog = pp > 1 && m->par.stage > 0;
  int pipe = pp > 1 && (m->par.stage == 0 || stage_ranks);
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
  /* ZeRO-1 shards over the joint data-parallel group: dp, and cp / ep
   * where they replicate parameters (collect_grads), so also at dp 1 */
  int joint = ms.dp * ir_axis_size(m, IR_AXIS_CP) * ir_axis_size(m, IR_AXIS_EP);
  ms.zero = m->par.zero && (ms.dp > 1 || (joint > 1 && m->par.zero != 3));
  ms.z3 = ms.dp > 1 && m->par.zero == 3;
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
  Roles roles = {arena_alloc(&cx->scratch, (size_t)nstates0 + 1),
                 arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof(int64_t)),
                 arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof(int64_t))};
  if (m->train.optimizer == IR_OPT_MUON) param_roles(m, &cx->scratch, &roles);
  for (int k = 0; k < ng; k++) grads[k].kind = parameter_kind(m, &grads[k], &roles);
  for (int k = 0; ms.z3 && k < ng; k++)
    if (grads[k].kind != UPD_ADAMW) {
      snprintf(cx->err, sizeof cx->err, "optimizer: --zero 3 updates each parameter's dp shard with adamw, and "
               "--optimizer %s would update @%s otherwise: %s under ZeRO-3 is not built yet (use --zero 1, or "
               "--optimizer adamw)", ir_optimizer_name(m->train.optimizer), m->states.a[grads[k].p].name,
               ir_optimizer_name(m->train.optimizer));
      return -1;
    }
  int nacc;
  SavedSh *acc = save_accum_operands(m, &cx->scratch, &nacc);
  dp_marks(m, ms.dp > 1 || ms.zero);

  int rc = 0;
  if (!pipe) {
    rc = build_update(m, cx, "update", grads, ng, &ms);
  } else if (stage_prog) {
    for (int k = 0; k < ng; k++) {
      grads[k].ranks = stage_ranks[grads[k].g];
      grads[k].in_norm = (grads[k].ranks & ((1ull << (m->par.stage - 1)) - 1)) == 0;
    }
    rc = stage_moments(m, cx, grads, ng, &ms, pp);
    if (rc == 0) rc = build_update(m, cx, "update", grads, ng, &ms);
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
  if (rc == 0) rc = fp8_update_ops(m, cx);                  /* --fp8: the scales from the amax history */
  if (rc != 0) {             /* leave the module as it was */
    m->blocks.n = nblocks0;
    if (nstates0) memcpy(m->states.a, saved, (size_t)nstates0 * sizeof *saved);
    ir_states_truncate(m, nstates0);
    for (int k = 0; k < nacc; k++) m->blocks.a[acc[k].b].nodes[acc[k].id].sh = acc[k].sh;
    return -1;
  }
  return 0;
}

int pass_optimizer(IrModule *m, PassCtx *cx) { return optimizer_run(m, cx, NULL); }

/* ---- pass_optimizer_report (mcc --report comm / memory) ---- */

/* Bytes a rank sends per step, ring algorithm, in m's update blocks for
 * the collectives whose note (IrNode.why) starts with "muon:" over axis a
 * (or a set of axes with a: ZeRO over dp+cp gathers over the set). */
static double muon_sent(const IrModule *m, int a) {
  double sent = 0;
  for (int bi = 0; bi < m->blocks.n && ir_axis_size(m, (IrAxis)a) > 1; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (strncmp(b->name, "update", 6)) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (!nd->why || strncmp(nd->why, "muon:", 5) || !(ir_axes_mask(nd->ia[0]) & (1u << a))) continue;
      int n = ir_axes_size(m, nd->ia[0]);
      if (nd->op == IR_OP_ALL_REDUCE) {
        const IrNode *x = &b->nodes[nd->in[0]];
        sent += 2.0 * (n - 1) / n * (double)(ir_type_numel(&x->type) * ir_dtype_size(x->type.dtype));
      } else if (nd->op == IR_OP_ALL_GATHER) {
        sent += (double)(n - 1) / n * (double)(ir_type_numel(&nd->type) * ir_dtype_size(nd->type.dtype));
      }
    }
  }
  return sent;
}

/* ZeRO-1 over the joint data-parallel group (dp+cp / dp+ep: the moments'
 * flat mask wider than dp): the update block's gradient reduce-scatters
 * and parameter all-gathers over dp and over the set, ring bytes, next to
 * Megatron's distributed optimizer over dp x cp, 2 (N-1)/N P E. */
static void zero_joint_report(const IrModule *m, StrBuf *out) {
  unsigned zmask = 0;
  double P = 0;   /* every trained parameter (Megatron shards them all; Muon's too) */
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind == IR_STATE_ADAM_M && st->sh.flat) zmask |= st->sh.flat;
    if (st->kind == IR_STATE_GRAD && st->of >= 0) P += (double)ir_type_numel(&m->states.a[st->of].type);
  }
  if (!(zmask & ~DP_BIT) || !m->par.zero || m->par.zero == 3) return;
  double rs_set = 0, rs_dp = 0, ag = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (strncmp(b->name, "update", 6)) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      unsigned mask = ir_axes_mask(nd->ia[0]);
      if ((nd->op != IR_OP_REDUCE_SCATTER && nd->op != IR_OP_ALL_GATHER) || !(mask & DP_BIT) || (mask & ~zmask))
        continue;
      int n = ir_axes_size(m, nd->ia[0]);
      const IrType *x = nd->op == IR_OP_ALL_GATHER ? &nd->type : &b->nodes[nd->in[0]].type;
      double bytes = (double)(n - 1) / n * (double)ir_type_numel(x) * (double)ir_dtype_size(x->dtype);
      if (nd->op == IR_OP_ALL_GATHER) ag += bytes;
      else if (mask == DP_BIT) rs_dp += bytes;
      else rs_set += bytes;
    }
  }
  char an[32];
  int zn = 1, N = ir_axis_size(m, IR_AXIS_DP) * ir_axis_size(m, IR_AXIS_CP);
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (zmask & (1u << a)) zn *= ir_axis_size(m, (IrAxis)a);
  double E = (double)ir_dtype_size(m->train.precision), meg = 2.0 * (N - 1) / N * P * E;
  sb_printf(out, "ZeRO-1 over the joint data-parallel group %s (%d ranks; moments 1/%d): ring bytes per rank per step: "
            "gradients reduce-scattered over %s %.0f (partial over every axis of the group) + over dp %.0f (whole "
            "over the others: each rank then keeps its part, shard_slice), parameters all-gathered %.0f; total %.0f.  "
            "Megatron's distributed optimizer over dp x cp = %d, closed form 2 x (N-1)/N x %.0f parameters x %g "
            "bytes = %.0f\n", ir_axes_str(ir_axes_attr(zmask), an, sizeof an), zn, zn, an, rs_set, rs_dp, ag,
            rs_set + rs_dp + ag, N, P, E, meg);
}

int pass_optimizer_report(const IrModule *m, StrBuf *out) {
  const IrTrain *t = &m->train;
  zero_joint_report(m, out);
  if (t->optimizer != IR_OPT_MUON) {
    sb_printf(out, "optimizer: %s", ir_optimizer_name(t->optimizer));
    if (t->optimizer == IR_OPT_SGD) sb_printf(out, " (momentum %g%s)", t->momentum, t->nesterov ? ", nesterov" : "");
    if (t->optimizer == IR_OPT_LION) sb_printf(out, " (betas %g, %g)", t->beta1, t->beta2);
    sb_printf(out, ": elementwise, sharded as adamw (ZeRO-1: flat dp chunks), no collective of its own\n");
    return 0;
  }
  /* recompute the per-parameter rule as the pass did */
  Arena a;
  arena_init(&a);
  int ns = m->states.n;
  Roles r = {arena_alloc(&a, (size_t)ns + 1), arena_alloc(&a, ((size_t)ns + 1) * sizeof(int64_t)),
             arena_alloc(&a, ((size_t)ns + 1) * sizeof(int64_t))};
  param_roles(m, &a, &r);
  int tp = ir_axis_size(m, IR_AXIS_TP), dp = ir_axis_size(m, IR_AXIS_DP), zero = dp > 1 && m->par.zero;
  int nmat = 0, nadam = 0, nsplit = 0, ngather = 0;
  double gram = 0, gather = 0, chosen = 0, dpgather = 0, mom = 0;
  for (int s = 0; s < ns; s++) {
    const IrState *ps = &m->states.a[s];
    if (ps->kind != IR_STATE_PARAM) continue;
    Grad g;
    memset(&g, 0, sizeof g);
    g.p = s;
    if (parameter_kind(m, &g, &r) != UPD_MUON) { nadam++; continue; }
    nmat++;
    double es = (double)ir_dtype_size(ps->type.dtype), n = (double)ir_type_numel(&ps->type);
    int64_t R, C;
    global_dims(m, &g, &R, &C);
    mom += n * es;
    if (zero) dpgather += (double)(dp - 1) / dp * (double)((ir_type_numel(&ps->type) + dp - 1) / dp * dp) * es;
    if (tp > 1 && ((g.vsplit[0] | g.vsplit[1]) & (1u << IR_AXIS_TP))) {
      double gr1, ga1;
      muon_costs(m, &g, R, C, &gr1, &ga1);
      int gathers = muon_gathers(m, &g, R, C) > 0;
      nsplit++;
      ngather += gathers;
      gram += gr1;
      gather += ga1;
      chosen += gathers ? ga1 : gr1;
    }
  }
  arena_free(&a);
  sb_printf(out, "optimizer: muon (momentum %g%s, %d Newton-Schulz steps) on %d hidden matrices, adamw on the %d "
            "other parameters (embeddings, head, 1-D; docs/cli.md \"Optimizers\")\n", t->muon_momentum,
            t->nesterov ? ", nesterov" : "", t->muon_ns_steps, nmat, nadam);
  if (tp > 1)
    sb_printf(out, "  muon over tp=%d (--muon-tp-mode %s): %d matrices split, %d gathered and %d all-reducing their "
              "Gram matrix: %.0f ring bytes sent per rank per step (closed form of that choice: %.0f).  Closed forms "
              "for all of them: the Gram matrix all-reduced, 2(tp-1)/tp x (steps x k^2 + 1) x bytes (k the unsplit "
              "side): %.0f; each matrix gathered once, (tp-1)/tp x R x C x bytes: %.0f (then every tp rank iterates "
              "on the whole matrix)\n", tp, ir_muon_tp_name(t->muon_tp), nsplit, ngather, nsplit - ngather,
              muon_sent(m, IR_AXIS_TP), chosen, gram, gather);
  if (zero)
    sb_printf(out, "  muon under ZeRO-1 (dp=%d): each matrix's reduced gradient chunks are all-gathered, %.0f ring "
              "bytes per rank per step (closed form (dp-1)/dp x padded numel x bytes: %.0f; adamw's parameter "
              "all-gather, which muon's matrices skip, is the same bytes); momentum kept whole: %.0f bytes per rank, "
              "%.0f more than dp chunks\n", dp, muon_sent(m, IR_AXIS_DP), dpgather, mom, mom - mom / dp);
  else
    sb_printf(out, "  muon momentum: %.0f bytes per rank (one buffer per matrix; adamw keeps two)\n", mom);
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
                     m->states.a[s].name, ir_state_kind_name(m->states.a[s].kind));  /* internal */
  for (int bi = 0; bi < m->blocks.n; bi++) {
    if (bi == ub) continue;
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < IR_MAX_IATTR; k++)
        if (ir_op_iattr_is_state(b->nodes[i].op, k) && b->nodes[i].ia[k] >= first && b->nodes[i].ia[k] < m->states.n)
          return ts_errf(err, errlen, "block %s, node %d uses optimizer state @%s", b->name, i,
                         m->states.a[b->nodes[i].ia[k]].name);  /* internal */
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

/* A pipeline rank's program (stage = r + 1): the pp coordinates holding
 * each of its gradients, into ranks[state].  The program has only r's
 * chunks, but its update block says which gradients other ranks hold too:
 * the group_sum ~axis=pp ranks=MASK that sums such a gradient over its
 * holders, straight from the state (grad_value); every other gradient is
 * r's alone.  0, or -1 with a message. */
static int stage_grad_ranks(const IrModule *m, int ub, uint64_t *ranks, char *err, size_t errlen) {
  int pp = ir_axis_size(m, IR_AXIS_PP), r = m->par.stage - 1;
  if (pp > PP_MAX_MASK_RANKS || r < 0 || r >= pp)
    return ts_errf(err, errlen, "the program says stage=%d of pp=%d (at most %d pipeline ranks)", m->par.stage, pp,
                   PP_MAX_MASK_RANKS);
  for (int s = 0; s < m->states.n; s++) ranks[s] = m->states.a[s].kind == IR_STATE_GRAD ? 1ull << r : 0;
  const IrBlock *b = &m->blocks.a[ub];
  for (int i = 0; i < b->n; i++) {
    const IrNode *nd = &b->nodes[i];
    if (nd->op != IR_OP_GROUP_SUM || nd->ia[0] != IR_AXIS_PP) continue;
    const IrNode *x = &b->nodes[nd->in[0]];
    int64_t s = x->op == IR_OP_STATE ? x->ia[0] : -1;
    uint64_t mask = (uint64_t)nd->ia[1];
    if (s < 0 || s >= m->states.n || m->states.a[s].kind != IR_STATE_GRAD) continue;
    if (!(mask & (1ull << r)) || (pp < 64 && (mask >> pp) != 0))
      return ts_errf(err, errlen, "block update, node %d: group_sum of @%s over pp ranks=%lld, which is not a set of "
                     "the pp=%d ranks containing this program's rank %d", i, m->states.a[s].name, (long long)nd->ia[1],
                     pp, r);
    ranks[s] = mask;
  }
  return 0;
}

int pass_respecialize_dp(IrModule *m, int dp, char *err, size_t errlen) {
  if (dp < 1 || dp > (1 << 20)) return ts_errf(err, errlen, "respecialize: dp=%d is out of range (1 .. 2^20)", dp);  /* internal */
  /* the whole-model module has one update block per pipeline rank; mrun
   * runs (and respecializes) the rank programs cut from it */
  if (ir_axis_size(m, IR_AXIS_PP) > 1 && m->par.stage == 0)
    return ts_errf(err, errlen, "respecialize to dp=%d: this is a whole-model pipeline module (pp=%d, stage=0); "  /* internal */
                   "respecialize the programs of its pipeline ranks (pass_pipeline_rank_module), as mrun does, or "
                   "compile it with mcc --dp %d", dp, ir_axis_size(m, IR_AXIS_PP), dp);
  /* ZeRO-3's micro block (with pp: each chunk block) gathers and reduce-scatters over the compiled dp */
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_SHARD)
      return ts_errf(err, errlen, "respecialize to dp=%d: this is a ZeRO-3 plan (--zero 3) compiled for dp=%d: its "
                     "parameters are held as 1/%d shards and gathered over dp in the micro block (with pp: in each "
                     "pipeline rank's chunk blocks), which cannot be "
                     "adapted at run time: run it at dp=%d, or recompile it with mcc %s--dp %d", dp,
                     ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_DP),
                     dp > 1 ? "--zero 3 " : "", dp);
  int ub = ir_block_find(m, "update");
  if (ub < 0) return ts_errf(err, errlen, "respecialize: the module has no block \"update\" (the optimizer pass did not run)");
  char why[512];
  int first = droppable_moments(m, ub, why, sizeof why);
  if (first < 0) return ts_errf(err, errlen, "respecialize to dp=%d: %s", dp, why);
  uint64_t *ranks = NULL;
  if (ir_axis_size(m, IR_AXIS_PP) > 1) {
    ranks = ts_xcalloc((size_t)m->states.n + 1, sizeof *ranks);
    if (stage_grad_ranks(m, ub, ranks, why, sizeof why) != 0) {
      free(ranks);
      return ts_errf(err, errlen, "respecialize to dp=%d: %s", dp, why);
    }
  }

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
  for (int i = 0; i < old.n; i++)   /* --fp8's settings, as compiled (fp8_update_ops makes the ops again) */
    if (old.nodes[i].op == IR_OP_FP8_SCALE) {
      cx.fp8_algo = (int)old.nodes[i].ia[3];
      cx.fp8_margin = old.nodes[i].fa[0];
    }
  int rc = optimizer_run(m, &cx, ranks);
  int nb = rc == 0 ? ir_block_find(m, "update") : -1;
  if (nb >= 0 && nb != ub) {   /* back in its place, before the blocks later passes add (eval) */
    IrBlock b = m->blocks.a[nb];
    block_remove(m, nb);
    block_insert(m, ub, &b);
  }
  /* fp16's blocks right after it, where the compile puts them (scaler.c
   * re-made them at the end) */
  for (int k = 0, at = ub + 1; rc == 0 && k < 2; k++, at++) {
    int sb = ir_block_find(m, k ? "skip" : "scaler");
    if (sb < 0 || sb == at) continue;
    IrBlock b = m->blocks.a[sb];
    block_remove(m, sb);
    block_insert(m, sb < at ? at - 1 : at, &b);
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
  free(ranks);
  return rc;
}
