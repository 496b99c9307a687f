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
 *     no send or stash; dropout is left alone), or it is an all_gather the
 *     cost model below gathers again, and
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
 * Gathered values (sequence parallelism's gathered GEMM inputs, and any
 * other all_gather the backward reads) are a choice with two costs:
 * keeping the copy holds its bytes across the backward; gathering the
 * shard again sends (n-1)/n of them once more.  The cost model puts bytes
 * sent first and bytes held second:
 *   - with no limit every copy is kept (a re-gather never sends less);
 *   - with --activation-budget B (PassCtx.activation_budget) the copies are
 *     kept one by one, most bytes saved per byte held first (then in
 *     forward order), each only if no pipeline stage's held bytes then
 *     exceed B; the others are gathered again.  Held bytes are counted as
 *     here: every value made before the loss and read after it, at its
 *     local size, per stage (IrNode.stage);
 *   - --regather (PassCtx.regather) gathers every one again: Megatron-LM's
 *     sequence parallelism, the least memory.
 * Each all_gather's note (mcc --explain-sharding) says which and why.
 *
 * `--no-remat` (PassCtx.no_remat) turns the pass off, for comparisons.
 *
 * --recompute (PassCtx.recompute; docs/memory.md) recomputes more, with
 * the same clones: allow[v] lets a value that is not cheap be recomputed
 * (GEMMs, attention, collectives: any op that is neither a leaf nor an
 * effect), pin[v] marks a value the backward reads for a recomputation,
 * deny[v] keeps a layer's input.  Layers are the units of the repeat
 * stack (pass_layer_units, the pipeline partition's rules: no model
 * names); a layer's input is what an earlier unit makes and it reads.
 *   - full: every value of a layer is allowed, its inputs pinned;
 *   - selective: greedy, most held bytes saved per FLOP added first, while
 *     a step adds at most RECOMPUTE_SELECTIVE_FLOPS_PER_ELEMENT per element
 *     it saves;
 *   - auto: the same greedy without that bound until every stage holds at
 *     most PassCtx.memory_budget bytes (counted as the memory plan counts
 *     the bytes live at the loss), or a refusal with the least figure.
 * What was chosen (values, bytes, FLOPs) goes to cx->recompute_summary,
 * which mcc --report memory prints.
 *
 * Expects: after shard (collectives are in place), before pipeline (a
 *   clone takes the stage tag of the backward node that first reads it).
 * Guarantees: the same numbers (a clone is the same op on the same
 *   operand values), operands earlier than their users, fusion groups
 *   cleared on the clones (fuse runs later). */
#include "passes.h"
#include "codegen/cg.h"
#include "pipe.h"

static int cheap(const IrNode *n, int regather) {
  if (n->op == IR_OP_ALL_GATHER) return regather;   /* the cost model's choice */
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
  const char **why;    /* per all_gather gathered again: the cost model's reason */
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
  if (nd->op == IR_OP_ALL_GATHER && r->why[u]) {   /* mcc --report sharding */
    char buf[1400];
    snprintf(buf, sizeof buf, "%s: %s", r->why[u], nd->why ? nd->why : "");
    c.why = ts_intern(buf);
  }
  r->out[r->nout] = c;
  return r->clone[u] = r->nout++;
}

/* Emits old node i (its operands: clones in the backward). */
static void emit(Remat *r, int i, int L) {
  IrNode nd = r->b->nodes[i];
  if (nd.nin) {
    int *in = arena_alloc(&r->m->arena, (size_t)nd.nin * sizeof *in);
    for (int k = 0; k < nd.nin; k++) in[k] = i > L ? backward_value(r, nd.in[k], nd.stage) : r->map[nd.in[k]];
    nd.in = in;
  }
  r->map[i] = r->nout;
  r->out[r->nout++] = nd;
}

/* A backward node to emit just before the clone of u that node i (the
 * clone's first reader) is about to make, so that pass fuse can run both
 * as one kernel that reads their shared input once and computes what they
 * share once (GELU's output for the weight gradient and GELU's backward
 * both need sigmoid(2u) of the same kept input).  Node j qualifies when it
 * is a generated-kernel op of i's stage, reads an operand of u, and can
 * move up to here: every operand it reads is older than i.  Moving it up
 * lengthens its result's life, so it must end the life of an operand at
 * least as large (j is that operand's last reader: the bytes live during
 * the move stay the same).  -1: none.  Looked for among the next 16 nodes. */
static int sibling(const IrBlock *b, int u, int i, const int *last, const unsigned char *done) {
  const IrNode *nu = &b->nodes[u];
  for (int j = i + 1; j < b->n && j <= i + 16; j++) {
    const IrNode *nj = &b->nodes[j];
    if (done[j] || nj->stage != b->nodes[i].stage || !cheap(nj, 0) || nj->op == IR_OP_ALL_GATHER) continue;
    int shares = 0, movable = 1, frees = 0;
    int64_t bytes = ir_type_numel(&nj->type) * (int64_t)ir_dtype_size(nj->type.dtype);
    for (int k = 0; k < nj->nin; k++) {
      int w = nj->in[k];
      movable &= w < i;
      for (int q = 0; q < nu->nin; q++) shares |= nu->in[q] == w && b->nodes[w].op != IR_OP_STATE;
      if (last[w] == j && ir_type_numel(&b->nodes[w].type) * (int64_t)ir_dtype_size(b->nodes[w].type.dtype) >= bytes)
        frees = 1;
    }
    if (shares && movable && frees) return j;
  }
  return -1;
}

/* What the backward recomputes when the all_gathers with keep[v] set are
 * kept (the others gathered again): remat[v] for the held values it
 * recomputes; *held_bytes per stage (nstage entries) what stays held. */
typedef struct {
  const IrModule *m;
  const IrBlock *b;
  int L;                            /* position of output "loss" */
  const unsigned char *written;     /* per state: an effect of the block writes it */
  const unsigned char *read_late;   /* per value before L: read after it */
  int nstage;
  /* --recompute: allow[v] = v may be recomputed though not cheap();
   * pin[v] = the backward needs v (a recomputation reads it) though no
   * original backward node does: v counts as read after the loss;
   * deny[v] = v is never recomputed, cheap or not (a layer's input under
   * --recompute: recomputing it would recompute the layers before it) */
  const unsigned char *allow, *pin, *deny;
  /* --recompute counts as the memory plan does (plan/memplan.h), so that
   * a --memory-budget is the report's "held for the backward" row: each
   * buffer 64-byte aligned, and extra[stage] bytes more (the loss value,
   * live where the loss is reported); 0 / NULL: exact bytes */
  int align;
  const int64_t *extra;
} Held;

static void held_plan(const Held *h, const unsigned char *keep, unsigned char *avail, unsigned char *remat,
                      int64_t *held_bytes) {
  for (int s = 0; s < h->nstage; s++) held_bytes[s] = h->extra ? h->extra[s] : 0;
  for (int v = 0; v < h->L; v++) {
    const IrNode *nd = &h->b->nodes[v];
    remat[v] = 0;
    if (nd->op == IR_OP_STATE) {   /* the slab, not the arena */
      avail[v] = !h->written[nd->ia[0]];
      continue;
    }
    int late = h->read_late[v] || h->pin[v];
    int ok = (cheap(nd, !keep[v]) || h->allow[v]) && !h->deny[v];
    for (int k = 0; k < nd->nin && ok; k++) ok = avail[nd->in[k]];
    remat[v] = ok && late;
    avail[v] = late || ok;
    if (late && !remat[v]) {
      int64_t by = ir_type_numel(&nd->type) * (int64_t)ir_dtype_size(nd->type.dtype);
      if (h->align) by = by < 64 ? 64 : (by + 63) / 64 * 64;
      held_bytes[nd->stage >= 0 && nd->stage < h->nstage ? nd->stage : 0] += by;
    }
  }
}

/* Bytes an all_gather node sends with a ring: (n-1)/n of its result. */
static int64_t gather_sent(const IrModule *m, const IrNode *nd) {
  int n = ir_axes_size(m, nd->ia[0]);
  int64_t bytes = ir_type_numel(&nd->type) * (int64_t)ir_dtype_size(nd->type.dtype);
  return n > 1 ? bytes / n * (n - 1) : 0;
}

typedef struct { double ratio; int v; } Cand;
static int cmp_cand(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  if (x->ratio != y->ratio) return x->ratio > y->ratio ? -1 : 1;
  return (x->v > y->v) - (x->v < y->v);
}

/* The cost model (see the top): keep[v] = 1 for the all_gathers whose
 * copy the backward keeps.  Notes each candidate's reason in why. */
static void choose_kept(const Held *h, PassCtx *cx, unsigned char *keep, unsigned char *avail, unsigned char *remat,
                        const char **why) {
  int n = h->b->n;
  int64_t *base = arena_alloc(&cx->scratch, (size_t)h->nstage * sizeof *base);
  int64_t *cur = arena_alloc(&cx->scratch, (size_t)h->nstage * sizeof *cur);
  int64_t *next = arena_alloc(&cx->scratch, (size_t)h->nstage * sizeof *next);
  memset(keep, 0, (size_t)n);
  held_plan(h, keep, avail, remat, base);
  Cand *c = arena_alloc(&cx->scratch, (size_t)(n ? n : 1) * sizeof *c);
  int nc = 0;
  for (int v = 0; v < h->L; v++)
    if (h->b->nodes[v].op == IR_OP_ALL_GATHER && remat[v]) {   /* gathered again unless kept */
      int64_t bytes = ir_type_numel(&h->b->nodes[v].type) * (int64_t)ir_dtype_size(h->b->nodes[v].type.dtype);
      c[nc++] = (Cand){bytes > 0 ? (double)gather_sent(h->m, &h->b->nodes[v]) / (double)bytes : 0, v};
    }
  qsort(c, (size_t)nc, sizeof *c, cmp_cand);
  memcpy(cur, base, (size_t)h->nstage * sizeof *cur);
  char buf[512];
  for (int k = 0; k < nc; k++) {
    int v = c[k].v;
    const IrNode *nd = &h->b->nodes[v];
    int64_t sent = gather_sent(h->m, nd);
    if (cx->regather || sent == 0) {
      snprintf(buf, sizeof buf, "gathered again for the backward instead of held across it (pass remat: %s)",
               cx->regather ? "--regather" : "a gather over one rank sends nothing");
      why[v] = ts_intern(buf);
      continue;
    }
    keep[v] = 1;
    held_plan(h, keep, avail, remat, next);
    int over = -1;
    for (int s = 0; s < h->nstage && cx->activation_budget >= 0; s++)
      if (next[s] > cur[s] && next[s] > cx->activation_budget) over = s;
    int stage = nd->stage >= 0 && nd->stage < h->nstage ? nd->stage : 0;
    if (over >= 0) {
      keep[v] = 0;
      snprintf(buf, sizeof buf, "gathered again for the backward instead of held across it (pass remat: keeping "
               "the copy would hold %lld bytes on stage %d, over --activation-budget %lld; gathering again sends "
               "%lld bytes)", (long long)next[over], over, (long long)cx->activation_budget, (long long)sent);
      why[v] = ts_intern(buf);
      continue;
    }
    snprintf(buf, sizeof buf, "kept for the backward (pass remat: gathering again would send %lld bytes; keeping "
             "holds %lld more, %lld on stage %d%s)", (long long)sent, (long long)(next[stage] - cur[stage]),
             (long long)next[stage], stage, cx->activation_budget >= 0 ? ", within --activation-budget" : "");
    why[v] = ts_intern(buf);
    memcpy(cur, next, (size_t)h->nstage * sizeof *cur);
  }
  held_plan(h, keep, avail, remat, next);   /* avail / remat of the choice */
}

/* ---- --recompute: beyond the cheap values ---- */

/* A value --recompute may recompute: any op that makes a value from its
 * operands alone (GEMMs, attention, collectives: every rank of the group
 * runs the same clone, in the same order), not a leaf (inputs, states,
 * received or unstashed values), not an effect. */
static int recomputable(const IrNode *n) {
  return n->type.dtype != IR_VOID && !(ir_ops[n->op].flags & (OPF_EFFECT | OPF_LEAF));
}

static int64_t value_bytes(const IrNode *n) {
  return ir_type_numel(&n->type) * (int64_t)ir_dtype_size(n->type.dtype);
}

/* FLOPs of computing node n once: a GEMM 2 M N K, fused attention (and a
 * ring step of it) 4 Tq Tk D per head and batch (q k^T, then p v), a
 * grouped GEMM 2 R N K, a pure layout op nothing, anything else one per
 * result element. */
double pass_node_flops(const IrBlock *b, const IrNode *n) {
  double out = (double)ir_type_numel(&n->type);
  if (n->op == IR_OP_MATMUL) {
    const IrType *a = &b->nodes[n->in[0]].type;
    return 2.0 * out * (double)(n->ia[0] ? a->dim[a->rank - 2] : a->dim[a->rank - 1]);
  }
  if (n->op == IR_OP_GMM) {
    const IrType *a = &b->nodes[n->in[0]].type;
    return 2.0 * out * (double)a->dim[a->rank - 1];
  }
  if ((n->op == IR_OP_ATTENTION || n->op == IR_OP_ATTN_ACC) && n->nin >= 2) {
    const IrType *k = &b->nodes[n->in[1]].type;
    return 4.0 * out * (double)(k->rank >= 2 ? k->dim[k->rank - 2] : 1);
  }
  if (n->op == IR_OP_RESHAPE || (ir_ops[n->op].flags & OPF_LEAF)) return 0;
  return out;
}

/* The FLOPs the backward spends recomputing under plan (avail, remat):
 * every value with remat set, and the values its clone is made from that
 * are neither states nor held (backward_value() clones them on the way).
 * *nvals: how many values that is. */
static double plan_flops(const Held *h, const unsigned char *remat, unsigned char *need, int *nvals) {
  int L = h->L;
  double f = 0;
  *nvals = 0;
  memcpy(need, remat, (size_t)L);
  for (int v = L - 1; v >= 0; v--) {
    if (!need[v]) continue;
    const IrNode *nd = &h->b->nodes[v];
    f += pass_node_flops(h->b, nd);
    (*nvals)++;
    for (int k = 0; k < nd->nin; k++) {
      int w = nd->in[k];
      int late = h->read_late[w] || h->pin[w];
      if (h->b->nodes[w].op != IR_OP_STATE && !(late && !remat[w])) need[w] = 1;
    }
  }
  return f;
}

static int64_t max_stage(const int64_t *bytes, int nstage, int *at) {
  int64_t mx = 0;
  *at = 0;
  for (int s = 0; s < nstage; s++)
    if (bytes[s] > mx) { mx = bytes[s]; *at = s; }
  return mx;
}

/* The cost model of --recompute selective: a value is worth recomputing
 * when the FLOPs its recomputation adds are at most this many per element
 * of held bytes it saves: an elementwise or row op (a few), a GEMM whose
 * reduction is at most 128 long (attention's q k^T over the head dim, the
 * s x s scores of the composed form), attention itself over at most 64
 * keys; not a GEMM over the model width, nor attention over a long
 * sequence.  Counted per element, so the choice does not depend on the
 * precision. */
#define RECOMPUTE_SELECTIVE_FLOPS_PER_ELEMENT 256.0

/* Allows v and, for its recomputation, what it reads that the backward
 * would not have: each such operand recomputed in turn when it is a
 * candidate, else pinned (held).  added[] lists what changed (w: allowed,
 * -w-1: pinned), for undoing; returns its length. */
static int close_over(const Held *h, int v, const unsigned char *cand, const unsigned char *avail,
                      unsigned char *allow, unsigned char *pin, int *added, int *stack) {
  int na = 0, sp = 0;
  allow[v] = 1;
  added[na++] = v;
  stack[sp++] = v;
  while (sp > 0) {
    const IrNode *nd = &h->b->nodes[stack[--sp]];
    for (int k = 0; k < nd->nin; k++) {
      int w = nd->in[k];
      if (avail[w] || allow[w] || pin[w]) continue;
      if (cand[w] && !h->deny[w]) {
        allow[w] = 1;
        added[na++] = w;
        stack[sp++] = w;
      } else {
        pin[w] = 1;
        added[na++] = -w - 1;
      }
    }
  }
  return na;
}

/* Greedy: while a candidate helps, take the one that saves the most held
 * bytes per FLOP added (over stages: all of them for selective, only
 * those over the budget for auto), with what its recomputation needs
 * (close_over: the values it is made from that the backward would not
 * have, recomputed too or, when they cannot be, held: their bytes count
 * against it); for auto, when a candidate that alone brings every stage
 * within the budget adds no more FLOPs than that best one, the cheapest
 * such candidate instead (the last step, not overshooting).
 * selective stops at the cost model's bound, auto when every stage fits.  allow / pin grow; avail / remat / bytes hold the final plan. */
static void greedy(const Held *h, PassCtx *cx, const unsigned char *keep, const unsigned char *cand,
                   unsigned char *allow, unsigned char *pin, unsigned char *avail, unsigned char *remat,
                   unsigned char *need, int64_t *bytes) {
  int L = h->L, ns = h->nstage, nv;
  int64_t *nb = arena_alloc(&cx->scratch, (size_t)ns * sizeof *nb);
  unsigned char *av2 = arena_alloc(&cx->scratch, (size_t)(L ? L : 1)), *rm2 = arena_alloc(&cx->scratch, (size_t)(L ? L : 1));
  int *added = arena_alloc(&cx->scratch, (size_t)(L ? L : 1) * sizeof *added);
  int *stack = arena_alloc(&cx->scratch, (size_t)(L ? L : 1) * sizeof *stack);
  held_plan(h, keep, avail, remat, bytes);
  double flops = plan_flops(h, remat, need, &nv);
  int auto_ = cx->recompute == PASS_RECOMPUTE_AUTO;
  for (;;) {
    int at;
    if (auto_ && max_stage(bytes, ns, &at) <= cx->memory_budget) return;
    int best = -1, fit = -1;   /* fit: the candidate of the least FLOPs that alone brings auto within budget */
    double best_ratio = 0, best_f = 0, fit_f = 0;
    for (int v = 0; v < L; v++) {
      if (!cand[v] || allow[v] || !(h->read_late[v] || pin[v]) || remat[v]) continue;
      const IrNode *nd = &h->b->nodes[v];
      int na = close_over(h, v, cand, avail, allow, pin, added, stack);
      held_plan(h, keep, av2, rm2, nb);
      double f = plan_flops(h, rm2, need, &nv) - flops;
      for (int k = 0; k < na; k++) {
        int w = added[k] < 0 ? -added[k] - 1 : added[k];
        if (added[k] < 0) pin[w] = 0;
        else allow[w] = 0;
      }
      int64_t saved = 0;
      for (int s = 0; s < ns; s++)
        if (!auto_ || bytes[s] > cx->memory_budget) saved += bytes[s] - nb[s];
      if (saved <= 0) continue;
      int at2;
      if (auto_ && max_stage(nb, ns, &at2) <= cx->memory_budget && (fit < 0 || f < fit_f)) { fit = v; fit_f = f; }
      double elems = (double)saved / (double)ir_dtype_size(nd->type.dtype);
      if (!auto_ && f > RECOMPUTE_SELECTIVE_FLOPS_PER_ELEMENT * elems) continue;
      double ratio = (double)saved / (f > 1 ? f : 1);
      if (best < 0 || ratio > best_ratio) { best = v; best_ratio = ratio; best_f = f; }
    }
    if (fit >= 0 && (best < 0 || fit_f <= best_f)) best = fit;   /* no dearer than the next step */
    if (best < 0) return;
    close_over(h, best, cand, avail, allow, pin, added, stack);
    held_plan(h, keep, avail, remat, bytes);
    flops = plan_flops(h, remat, need, &nv);
  }
}

/* The plan of --recompute full: every layer (pass_layer_units: a unit of
 * the model's repeat stack) keeps its input, the anchored values an
 * earlier unit makes and it reads, and recomputes every other value the
 * backward reads. */
static void full_plan(const Held *h, const int *unit, const unsigned char *bound, int nl, unsigned char *allow,
                      unsigned char *pin) {
  for (int v = 0; v < h->L; v++) {
    const IrNode *nd = &h->b->nodes[v];
    allow[v] = unit[v] >= 1 && unit[v] <= nl && !bound[v] && recomputable(nd);
    pin[v] = bound[v] && unit[v] <= nl;
  }
}

static void fmt_bytes(char *buf, size_t n, int64_t b) {
  snprintf(buf, n, "%lld bytes (%.2f MiB)", (long long)b, (double)b / (1024.0 * 1024.0));
}

/* --recompute: sets allow / pin (and avail / remat for them) by the mode,
 * writes cx->recompute_summary.  -1 with cx->err: --recompute full on a
 * model without a repeat stack, a --memory-budget that cannot be met. */
static int choose_recompute(Held *h, PassCtx *cx, const unsigned char *keep, unsigned char *avail,
                            unsigned char *remat, unsigned char *allow, unsigned char *pin, unsigned char *deny) {
  int L = h->L, ns = h->nstage, nl = 0, nv0, nv;
  size_t nn = (size_t)(L ? L : 1);
  int *unit = arena_alloc(&cx->scratch, nn * sizeof *unit);
  unsigned char *anch = arena_alloc(&cx->scratch, nn), *bound = arena_alloc(&cx->scratch, nn),
                *cand = arena_alloc(&cx->scratch, nn), *need = arena_alloc(&cx->scratch, nn);
  char uerr[512];
  int units = pass_layer_units(h->m, h->b, L, unit, anch, &nl, uerr, sizeof uerr) == 0;
  memset(bound, 0, nn);
  if (units) {
    for (int r = 0; r < L; r++)
      for (int k = 0; k < h->b->nodes[r].nin; k++) {
        int v = h->b->nodes[r].in[k];
        if (anch[v] && unit[r] > unit[v]) bound[v] = 1;
      }
  } else if (cx->recompute == PASS_RECOMPUTE_FULL) {
    snprintf(cx->err, sizeof cx->err, "--recompute full recomputes each layer of the model's repeat stack from "
             "its input, and this model has none: %s", uerr);
    return -1;
  }
  int64_t *base = arena_alloc(&cx->scratch, (size_t)ns * sizeof *base), *bytes = arena_alloc(&cx->scratch, (size_t)ns * sizeof *bytes);
  int64_t *extra = arena_alloc(&cx->scratch, (size_t)ns * sizeof *extra);
  memset(extra, 0, (size_t)ns * sizeof *extra);
  const IrNode *lo = h->b->nodes[L].nin ? &h->b->nodes[h->b->nodes[L].in[0]] : NULL;
  if (lo && !h->read_late[h->b->nodes[L].in[0]]) {
    int64_t by = value_bytes(lo);
    extra[lo->stage >= 0 && lo->stage < ns ? lo->stage : 0] += by < 64 ? 64 : (by + 63) / 64 * 64;
  }
  h->align = 1;
  h->extra = extra;
  memset(deny, 0, nn);
  held_plan(h, keep, avail, remat, base);   /* the cheap values only */
  for (int v = 0; v < L; v++) deny[v] = bound[v] && !remat[v];   /* unless the cheap values recompute it */
  double f0 = plan_flops(h, remat, need, &nv0), fwd = 0;
  unsigned char *need0 = arena_alloc(&cx->scratch, nn);   /* what the cheap values recompute */
  memcpy(need0, need, nn);
  for (int v = 0; v < L; v++) fwd += pass_node_flops(h->b, &h->b->nodes[v]);
  /* candidates: what no layer boundary is (recomputing a layer's input
   * would recompute the layers before it, all at once) */
  for (int v = 0; v < L; v++) cand[v] = recomputable(&h->b->nodes[v]) && !bound[v];
  if (cx->recompute == PASS_RECOMPUTE_FULL) {
    full_plan(h, unit, bound, nl, allow, pin);
    held_plan(h, keep, avail, remat, bytes);
  } else {
    greedy(h, cx, keep, cand, allow, pin, avail, remat, need, bytes);
    int at;
    if (cx->recompute == PASS_RECOMPUTE_AUTO && max_stage(bytes, ns, &at) > cx->memory_budget) {
      /* the greedy's end against full recompute: the smaller is the least */
      int64_t least = max_stage(bytes, ns, &at);
      const char *how = "recomputing every value the cost model may";
      if (units) {
        unsigned char *a2 = arena_alloc(&cx->scratch, nn), *p2 = arena_alloc(&cx->scratch, nn);
        int64_t *fb = arena_alloc(&cx->scratch, (size_t)ns * sizeof *fb);
        full_plan(h, unit, bound, nl, a2, p2);
        Held hf = *h;
        hf.allow = a2;
        hf.pin = p2;
        held_plan(&hf, keep, avail, remat, fb);
        int at2;
        int64_t fl = max_stage(fb, ns, &at2);
        if (fl <= cx->memory_budget) {   /* full recompute fits where the greedy did not */
          memcpy(allow, a2, nn);
          memcpy(pin, p2, nn);
          memcpy(bytes, fb, (size_t)ns * sizeof *fb);
          goto chosen;
        }
        if (fl < least) { least = fl; at = at2; how = "recomputing every layer from its input (--recompute full)"; }
      }
      char b1[96], b2[96];
      fmt_bytes(b1, sizeof b1, cx->memory_budget);
      fmt_bytes(b2, sizeof b2, least);
      snprintf(cx->err, sizeof cx->err, "--memory-budget %s cannot be met: the least a micro batch of this layout "
               "can hold for its backward is %s%s, %s; give at least that, or split the activations over more "
               "ranks (--tp with --sp, --cp, --pp) or a smaller micro batch", b1, b2,
               ns > 1 ? " on a pipeline stage" : "", how);
      return -1;
    }
  }
chosen:;
  double f = plan_flops(h, remat, need, &nv);
  int ngemm = 0, nattn = 0, ncoll = 0;
  for (int v = 0; v < L; v++) {
    if (!need[v] || need0[v]) continue;
    IrOp op = h->b->nodes[v].op;
    ngemm += op == IR_OP_MATMUL || op == IR_OP_GMM;
    nattn += op == IR_OP_ATTENTION || op == IR_OP_ATTN_ACC;
    ncoll += op == IR_OP_ALL_REDUCE || op == IR_OP_ALL_GATHER || op == IR_OP_REDUCE_SCATTER ||
             op == IR_OP_ALL_TO_ALL || op == IR_OP_ALL_TO_ALL_V || op == IR_OP_RING_SHIFT;
  }
  int at, at0;
  int64_t held = max_stage(bytes, ns, &at), held0 = max_stage(base, ns, &at0);
  char b1[96], b0[96], bb[160] = "";
  fmt_bytes(b1, sizeof b1, held);
  fmt_bytes(b0, sizeof b0, held0);
  if (cx->recompute == PASS_RECOMPUTE_AUTO) {
    char t[96];
    fmt_bytes(t, sizeof t, cx->memory_budget);
    snprintf(bb, sizeof bb, " (--memory-budget %s)", t);
  }
  snprintf(cx->recompute_summary, sizeof cx->recompute_summary,
           "recompute %s%s: holds at the loss per micro batch %s%s, was %s with the cheap values only; "
           "recomputes %d values in the backward (%d more than the cheap ones, among them %d GEMMs, %d attention, "
           "%d collectives), %.4g FLOPs more per micro batch (+%.1f%% of the forward's %.4g)",
           pass_recompute_name(cx->recompute), bb, b1, ns > 1 ? " (largest stage)" : "", b0, nv, nv - nv0, ngemm,
           nattn, ncoll, f - f0, fwd > 0 ? 100.0 * (f - f0) / fwd : 0.0, fwd);
  return 0;
}

int pass_remat(IrModule *m, PassCtx *cx) {
  cx->recompute_summary[0] = 0;
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
                *remat = arena_alloc(&cx->scratch, (size_t)n), *keep = arena_alloc(&cx->scratch, (size_t)n);
  unsigned char *allow = arena_alloc(&cx->scratch, (size_t)n), *pin = arena_alloc(&cx->scratch, (size_t)n);
  memset(held, 0, (size_t)n);
  memset(allow, 0, (size_t)n);
  memset(pin, 0, (size_t)n);
  for (int i = L + 1; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (b->nodes[i].in[k] < L) held[b->nodes[i].in[k]] = 1;
  int nstage = 1;
  for (int v = 0; v < L; v++) if (b->nodes[v].stage + 1 > nstage) nstage = b->nodes[v].stage + 1;
  unsigned char *deny = arena_alloc(&cx->scratch, (size_t)n);
  memset(deny, 0, (size_t)n);
  /* a value the backward of another pipeline chunk reads (an encoder's
   * output, read by every decoder layer) stays held and travels: a clone
   * there would need its operands, and the parameters they read, on a
   * rank that neither holds nor updates them */
  for (int i = L + 1; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) {
      int v = b->nodes[i].in[k];
      if (v < L && ir_stage_chunk(b->nodes[v].stage) != ir_stage_chunk(b->nodes[i].stage)) deny[v] = 1;
    }
  Held h = {m, b, L, written, held, nstage, allow, pin, deny, 0, NULL};
  const char **why = arena_alloc(&cx->scratch, (size_t)(n ? n : 1) * sizeof *why);
  memset(why, 0, (size_t)(n ? n : 1) * sizeof *why);
  int64_t saved_budget = cx->activation_budget;
  if (cx->recompute == PASS_RECOMPUTE_AUTO && cx->activation_budget < 0) cx->activation_budget = cx->memory_budget;
  choose_kept(&h, cx, keep, avail, remat, why);
  cx->activation_budget = saved_budget;
  if (cx->recompute != PASS_RECOMPUTE_NONE && choose_recompute(&h, cx, keep, avail, remat, allow, pin, deny) != 0)
    return -1;
  for (int v = 0; v < L; v++) held[v] |= pin[v];   /* the backward reads them: backward_value() */
  for (int v = 0; v < L; v++)   /* kept copies: their notes say so (the re-gathered ones' clones do) */
    if (keep[v] && why[v]) {
      char buf[1400];
      snprintf(buf, sizeof buf, "%s; %s", b->nodes[v].why ? b->nodes[v].why : "", why[v]);
      b->nodes[v].why = ts_intern(buf);
    }
  int nremat = 0;
  for (int v = 0; v < L; v++) nremat += remat[v];
  if (!nremat) return 0;

  /* rebuild: forward unchanged, clones inserted before their first reader
   * (with the sibling each may fuse with, hoisted: see sibling()) */
  int cap = 2 * n;
  Remat r = {m, b, arena_alloc(&m->arena, (size_t)cap * sizeof(IrNode)), 0,
             arena_alloc(&cx->scratch, (size_t)n * sizeof(int)), arena_alloc(&cx->scratch, (size_t)n * sizeof(int)),
             held, remat, L, why};
  int *last = arena_alloc(&cx->scratch, (size_t)n * sizeof(int));   /* old id -> its last reader, -1 none */
  unsigned char *done = arena_alloc(&cx->scratch, (size_t)n);        /* hoisted: emitted already */
  memset(done, 0, (size_t)n);
  for (int i = 0; i < n; i++) r.clone[i] = last[i] = -1;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) last[b->nodes[i].in[k]] = i;
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    if (i > L)
      for (int k = 0; k < b->nodes[i].nin; k++) {
        int u = b->nodes[i].in[k], j;
        if (u < L && remat[u] && r.clone[u] < 0 && (j = sibling(b, u, i, last, done)) >= 0) {
          emit(&r, j, L);
          done[j] = 1;
        }
      }
    emit(&r, i, L);
  }
  b->nodes = r.out;
  b->n = r.nout;
  b->cap = cap;
  return 0;
}
