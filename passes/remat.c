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
 * Expects: after shard (collectives are in place), before pipeline (a
 *   clone takes the stage tag of the backward node that first reads it).
 * Guarantees: the same numbers (a clone is the same op on the same
 *   operand values), operands earlier than their users, fusion groups
 *   cleared on the clones (fuse runs later). */
#include "passes.h"
#include "codegen/cg.h"

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
} Held;

static void held_plan(const Held *h, const unsigned char *keep, unsigned char *avail, unsigned char *remat,
                      int64_t *held_bytes) {
  for (int s = 0; s < h->nstage; s++) held_bytes[s] = 0;
  for (int v = 0; v < h->L; v++) {
    const IrNode *nd = &h->b->nodes[v];
    remat[v] = 0;
    if (nd->op == IR_OP_STATE) {   /* the slab, not the arena */
      avail[v] = !h->written[nd->ia[0]];
      continue;
    }
    int ok = cheap(nd, !keep[v]);
    for (int k = 0; k < nd->nin && ok; k++) ok = avail[nd->in[k]];
    remat[v] = ok && h->read_late[v];
    avail[v] = h->read_late[v] || ok;
    if (h->read_late[v] && !remat[v])
      held_bytes[nd->stage >= 0 && nd->stage < h->nstage ? nd->stage : 0] +=
          ir_type_numel(&nd->type) * (int64_t)ir_dtype_size(nd->type.dtype);
  }
}

/* Bytes an all_gather node sends with a ring: (n-1)/n of its result. */
static int64_t gather_sent(const IrModule *m, const IrNode *nd) {
  int n = ir_axis_size(m, (IrAxis)nd->ia[0]);
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
                *remat = arena_alloc(&cx->scratch, (size_t)n), *keep = arena_alloc(&cx->scratch, (size_t)n);
  memset(held, 0, (size_t)n);
  for (int i = L + 1; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (b->nodes[i].in[k] < L) held[b->nodes[i].in[k]] = 1;
  int nstage = 1;
  for (int v = 0; v < L; v++) if (b->nodes[v].stage + 1 > nstage) nstage = b->nodes[v].stage + 1;
  Held h = {m, b, L, written, held, nstage};
  const char **why = arena_alloc(&cx->scratch, (size_t)(n ? n : 1) * sizeof *why);
  memset(why, 0, (size_t)(n ? n : 1) * sizeof *why);
  choose_kept(&h, cx, keep, avail, remat, why);
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
