/* ops_route.c - reference kernels of the routing ops (mixture of experts):
 * topk_mask, capacity_mask.  An entry of rt_ref_kernels (ops_ref.c) like every other
 * reference kernel, kept apart because routing is its own family. */
#include "kernels.h"

static double ld(const void *p, IrDtype t, int64_t i) {
  return t == IR_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}
static void st(void *p, IrDtype t, int64_t i, double v) {
  if (t == IR_F32) ((float *)p)[i] = (float)v;
  else ((double *)p)[i] = v;
}

/* x [..., D] -> mask [..., D]: 1 at the k largest entries of each row.
 * Entry j is kept when fewer than k entries beat it, an entry beating j
 * when it is larger, or equal with a lower index (so exactly k are kept;
 * NaN is never larger than anything). O(D^2) per row: D is a number of
 * experts. */
int ref_TOPK_MASK(RtKctx *k) {
  const IrType *t = k->it[0];
  if (!ir_dtype_is_float(t->dtype) || t->dtype != k->ot->dtype || t->rank < 1)
    return rt_kfail(k, "topk_mask: needs a float tensor of rank >= 1");
  int64_t D = t->dim[t->rank - 1], rows = ir_type_numel(t) / (D ? D : 1), K = k->n->ia[0];
  if (K < 1 || K > D) return rt_kfail(k, "topk_mask: k=%lld outside [1, %lld]", (long long)K, (long long)D);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < D; j++) {
      double xj = ld(k->in[0], t->dtype, r * D + j);
      int64_t beat = 0;
      for (int64_t i = 0; i < D && beat < K; i++) {
        double xi = ld(k->in[0], t->dtype, r * D + i);
        if (xi > xj || (xi == xj && i < j)) beat++;
      }
      st(k->out, t->dtype, r * D + j, beat < K ? 1.0 : 0.0);
    }
  return 0;
}

/* keep [..., E] -> mask [..., E]: per last-axis column (an expert), the
 * first `cap` nonzero entries in row order (rows = the leading dims,
 * row-major: token order) stay 1, later ones become 0.  This is an expert's
 * capacity: routing slots past it are dropped (Megatron's "probs" drop
 * policy: the first tokens of the micro batch win). */
int ref_CAPACITY_MASK(RtKctx *k) {
  const IrType *t = k->it[0];
  if (!ir_dtype_is_float(t->dtype) || t->dtype != k->ot->dtype || t->rank < 1)
    return rt_kfail(k, "capacity_mask: needs a float tensor of rank >= 1");
  int64_t E = t->dim[t->rank - 1], rows = ir_type_numel(t) / (E ? E : 1), cap = k->n->ia[0];
  if (cap < 0) return rt_kfail(k, "capacity_mask: cap=%lld < 0", (long long)cap);
  for (int64_t e = 0; e < E; e++) {
    int64_t used = 0;
    for (int64_t r = 0; r < rows; r++) {
      int on = ld(k->in[0], t->dtype, r * E + e) != 0.0 && used < cap;
      used += on;
      st(k->out, t->dtype, r * E + e, on ? 1.0 : 0.0);
    }
  }
  return 0;
}
