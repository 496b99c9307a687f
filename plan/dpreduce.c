/* dpreduce.c - the buckets of the overlapped data-parallel gradient
 * reduction (dpreduce.h says what and why). */
#include "plan/dpreduce.h"
#include "ir/util.h"
#include <stdlib.h>
#include <string.h>

int64_t plan_dp_bucket_default(int dp, IrDtype dt) {
  int64_t el = PLAN_DP_BUCKET_ELEMS, per = 1000000LL * (dp > 1 ? dp : 1);
  return (el > per ? el : per) * (int64_t)(ir_dtype_size(dt) ? ir_dtype_size(dt) : 4);
}

static int is_update(const IrBlock *b) { return strcmp(b->name, "update") == 0 || strncmp(b->name, "update.", 7) == 0; }

/* The grad state whose dp reduction node i of update block b is, straight
 * from the state (dpreduce.h), or -1. */
static int reduced_state(const IrModule *m, const IrBlock *b, int i) {
  const IrNode *nd = &b->nodes[i];
  if (nd->nin != 1 || !(ir_axes_mask(nd->ia[0]) & (1u << IR_AXIS_DP)) || nd->ia[1] != 0) return -1;
  if (nd->type.dtype != IR_F32 && nd->type.dtype != IR_F64) return -1;
  int x = nd->in[0];
  if (nd->op == IR_OP_REDUCE_SCATTER) {
    if (nd->type.rank != 1) return -1;
    if (b->nodes[x].op == IR_OP_PAD) {
      if (b->nodes[x].ia[0] != 0 || b->nodes[x].ia[1] != 0) return -1;
      x = b->nodes[x].in[0];
    }
    if (b->nodes[x].op == IR_OP_RESHAPE) x = b->nodes[x].in[0];
  } else if (nd->op != IR_OP_ALL_REDUCE) {
    return -1;
  }
  const IrNode *s = &b->nodes[x];
  if (s->op != IR_OP_STATE || s->ia[0] < 0 || s->ia[0] >= m->states.n) return -1;
  if (m->states.a[s->ia[0]].kind != IR_STATE_GRAD) return -1;
  return (int)s->ia[0];
}

typedef struct { PlanDpGrad g; int wblock; IrOp op; int64_t axes; int size; IrDtype dt; } Cand;

static int cand_cmp(const void *pa, const void *pb) {
  const Cand *a = pa, *b = pb;
  if (a->wblock != b->wblock) return a->wblock - b->wblock;
  if (a->g.ublock != b->g.ublock) return a->g.ublock - b->g.ublock;
  if (a->op != b->op) return (int)a->op - (int)b->op;
  if (a->axes != b->axes) return a->axes < b->axes ? -1 : 1;
  if (a->dt != b->dt) return (int)a->dt - (int)b->dt;
  if (a->g.wpos != b->g.wpos) return a->g.wpos - b->g.wpos;
  return a->g.unode - b->g.unode;
}

int plan_dp_buckets(const IrModule *m, int64_t bucket_bytes, PlanDpPlan *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  int dp = ir_axis_size(m, IR_AXIS_DP);
  out->dp = dp;
  if (bucket_bytes > (int64_t)1 << 50)
    return ts_errf(err, errlen, "a dp bucket of %lld bytes is more than 2^50 (use at most 1125899906842624, or "  /* internal */
                   "0 for the default of %lld)", (long long)bucket_bytes, (long long)plan_dp_bucket_default(dp, IR_F32));
  if (bucket_bytes <= 0) bucket_bytes = plan_dp_bucket_default(dp, m->train.precision);
  out->bucket_bytes = bucket_bytes;
  /* the block writing each state, and where last; -2 when several do */
  int *wblock = ts_xmalloc(((size_t)m->states.n + 1) * sizeof *wblock), *wpos = ts_xmalloc(((size_t)m->states.n + 1) * sizeof *wpos);
  for (int s = 0; s < m->states.n; s++) wblock[s] = -1, wpos[s] = -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (is_update(b)) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (!(ir_ops[nd->op].flags & OPF_EFFECT)) continue;
      for (int k = 0; k < IR_MAX_IATTR; k++) {
        if (!ir_op_iattr_is_state(nd->op, k)) continue;
        int64_t s = nd->ia[k];
        if (s < 0 || s >= m->states.n) continue;
        if (wblock[s] >= 0 && wblock[s] != bi) wblock[s] = -2;
        else if (wblock[s] != -2) wblock[s] = bi, wpos[s] = nd->op == IR_OP_ACCUM ? i : -3 - i;
      }
    }
  }
  Cand *c = NULL;
  int nc = 0, cap = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    if (!is_update(b)) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if ((nd->op != IR_OP_ALL_REDUCE && nd->op != IR_OP_REDUCE_SCATTER) ||
          !(ir_axes_mask(nd->ia[0]) & (1u << IR_AXIS_DP)))
        continue;
      if (nd->type.rank == 0) continue;   /* a scalar: the gradient norm's square sums, not a gradient */
      int size = ir_axes_size(m, nd->ia[0]);
      if (size <= 1) continue;            /* over one rank: nothing to reduce */
      int s = reduced_state(m, b, i);
      int64_t bytes = ir_type_numel(&b->nodes[nd->in[0]].type) * (int64_t)ir_dtype_size(nd->type.dtype);
      if (s < 0 || wblock[s] < 0 || wpos[s] < 0) {
        out->nleft++;
        out->left_bytes += bytes;
        continue;
      }
      if (nc == cap) c = ts_xrealloc(c, (size_t)(cap = cap ? 2 * cap : 32) * sizeof *c);
      Cand *q = &c[nc++];
      memset(q, 0, sizeof *q);
      q->g.state = s;
      q->g.ublock = bi;
      q->g.unode = i;
      q->g.n = ir_type_numel(&m->states.a[s].type);
      q->g.c = ir_type_numel(&nd->type);
      q->g.wpos = wpos[s];
      q->wblock = wblock[s];
      q->op = nd->op;
      q->axes = nd->ia[0];
      q->size = size;
      q->dt = nd->type.dtype;
    }
  }
  free(wblock);
  free(wpos);
  if (nc) qsort(c, (size_t)nc, sizeof *c, cand_cmp);
  out->g = ts_xcalloc((size_t)nc + 1, sizeof *out->g);
  out->b = ts_xcalloc((size_t)nc + 1, sizeof *out->b);
  for (int k = 0; k < nc; k++) {
    PlanDpBucket *bk = out->nb ? &out->b[out->nb - 1] : NULL;
    int same = bk && bk->wblock == c[k].wblock && bk->ublock == c[k].g.ublock && bk->op == c[k].op &&
               bk->axes == c[k].axes && bk->dt == c[k].dt && bk->bytes < bucket_bytes;
    if (!same) {
      bk = &out->b[out->nb++];
      *bk = (PlanDpBucket){c[k].wblock, c[k].g.ublock, -1, c[k].op, c[k].axes, c[k].size, c[k].dt, k, 0, 0, 0};
    }
    PlanDpGrad *g = &out->g[out->ng++];
    *g = c[k].g;
    g->bucket = out->nb - 1;
    g->off = bk->count;
    bk->count += g->c;
    bk->n++;
    if (g->wpos > bk->at) bk->at = g->wpos;
    bk->bytes = bk->count * (int64_t)ir_dtype_size(bk->dt) * (bk->op == IR_OP_REDUCE_SCATTER ? bk->size : 1);
  }
  free(c);
  return 0;
}

void plan_dp_free(PlanDpPlan *p) {
  free(p->g);
  free(p->b);
  memset(p, 0, sizeof *p);
}
