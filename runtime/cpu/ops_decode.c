/* ops_decode.c - reference kernels of the generation ops pass decode
 * emits (kv_write, attn_cached, slice_at; rope_at is rope's kernel with an
 * offset, ops_ref_t.h), entries of rt_ref_kernels (ops_ref.c).
 *
 * The position operand is an i32 scalar, the block's input "pos": the
 * first position the block's tokens take.  A position past the cache is
 * an error naming both numbers, never a write out of bounds.
 * attn_cached computes one query row per task, in double, keys in order,
 * so its result does not depend on the thread count. */
#include "attn_priv.h"
#include "kernels.h"
#include "par.h"
#include <math.h>

static int pos_of(RtKctx *k, int i, int64_t *pos) {
  if (k->it[i]->dtype != IR_I32 || ir_type_numel(k->it[i]) != 1) return rt_kfail(k, "the position must be an i32 scalar");
  *pos = *(const int32_t *)k->in[i];
  if (*pos < 0) return rt_kfail(k, "position %lld is negative", (long long)*pos);
  return 0;
}

/* Rows before axis (outer), the elements after it (inner) of t. */
static void around(const IrType *t, int ax, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < ax; d++) *outer *= t->dim[d];
  for (int d = ax + 1; d < t->rank; d++) *inner *= t->dim[d];
}

/* state[..., pos:pos + n, ...] = x along axis ia[1]. */
int ref_KV_WRITE(RtKctx *k) {
  const IrState *s = &k->env->m->states.a[k->n->ia[0]];
  const IrType *xt = k->it[0];
  int ax = (int)k->n->ia[1];
  int64_t pos;
  if (pos_of(k, 1, &pos) != 0) return -1;
  if (ax < 0 || ax >= s->type.rank || xt->rank != s->type.rank || xt->dtype != s->type.dtype)
    return rt_kfail(k, "%s does not fit cache @%s %s", rt_tstr(xt, 0), s->name, rt_tstr(&s->type, 1));
  int64_t n = xt->dim[ax], S = s->type.dim[ax];
  if (pos + n > S)
    return rt_kfail(k, "positions %lld .. %lld are past the cache @%s, which holds %lld (the model's seq_len)",
                    (long long)pos, (long long)(pos + n - 1), s->name, (long long)S);
  int64_t outer, inner;
  around(xt, ax, &outer, &inner);
  size_t es = ir_dtype_size(xt->dtype);
  unsigned char *dst = rt_kenv_state(k->env, (int)k->n->ia[0]);
  const unsigned char *src = k->in[0];
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + (size_t)((o * S + pos) * inner) * es, src + (size_t)(o * n * inner) * es, (size_t)(n * inner) * es);
  return 0;
}

/* x[..., pos:pos + size, ...] along axis ia[0]. */
int ref_SLICE_AT(RtKctx *k) {
  const IrType *xt = k->it[0];
  int ax = (int)k->n->ia[0];
  int64_t pos, n = k->n->ia[1];
  if (pos_of(k, 1, &pos) != 0) return -1;
  int64_t L = xt->dim[ax];
  if (pos + n > L)
    return rt_kfail(k, "positions %lld .. %lld are past dim %d of %s", (long long)pos, (long long)(pos + n - 1), ax,
                    rt_tstr(xt, 0));
  int64_t outer, inner;
  around(xt, ax, &outer, &inner);
  size_t es = ir_dtype_size(xt->dtype);
  unsigned char *dst = k->out;
  const unsigned char *src = k->in[0];
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + (size_t)(o * n * inner) * es, src + (size_t)((o * L + pos) * inner) * es, (size_t)(n * inner) * es);
  return 0;
}

typedef struct {
  const void *q, *k, *v;
  void *o;
  IrDtype dt;
  int64_t Hq, Hkv, Tq, Tk, D, pos, window;
  double scale;
  const double *slope;   /* ALiBi: local query head h's slope (NULL: none) */
} CachedJob;

static double ld(const void *p, IrDtype dt, int64_t i) { return dt == IR_F32 ? ((const float *)p)[i] : ((const double *)p)[i]; }

static void cached_rows(void *jp, int64_t lo, int64_t hi) {
  const CachedJob *j = jp;
  int64_t D = j->D, group = j->Hq / j->Hkv;
  double *acc = ts_xmalloc((size_t)(D ? D : 1) * sizeof *acc);
  double *sc = ts_xmalloc((size_t)j->Tk * sizeof *sc);
  for (int64_t r = lo; r < hi; r++) {   /* r = (b * Hq + h) * Tq + i */
    int64_t i = r % j->Tq, bh = r / j->Tq, h = bh % j->Hq, b = bh / j->Hq;
    int64_t qp = j->pos + i, kv = b * j->Hkv + h / group;
    int64_t first = j->window > 0 && qp - j->window + 1 > 0 ? qp - j->window + 1 : 0;
    int64_t qo = r * D, ko = kv * j->Tk * D;
    double mx = -INFINITY;
    for (int64_t t = first; t <= qp; t++) {
      double s = 0;
      for (int64_t d = 0; d < D; d++) s += ld(j->q, j->dt, qo + d) * ld(j->k, j->dt, ko + t * D + d);
      sc[t] = s * j->scale;
      if (j->slope) sc[t] -= j->slope[h] * (double)(qp - t);   /* ALiBi: -slope |i - j| */
      if (sc[t] > mx) mx = sc[t];
    }
    double l = 0;
    for (int64_t d = 0; d < D; d++) acc[d] = 0;
    for (int64_t t = first; t <= qp; t++) {
      double p = exp(sc[t] - mx);
      l += p;
      for (int64_t d = 0; d < D; d++) acc[d] += p * ld(j->v, j->dt, ko + t * D + d);
    }
    for (int64_t d = 0; d < D; d++) {
      double y = acc[d] / l;
      if (j->dt == IR_F32) ((float *)j->o)[qo + d] = (float)y;
      else ((double *)j->o)[qo + d] = y;
    }
  }
  free(acc);
  free(sc);
}

/* q [B, Hq, Tq, D] at positions pos .. pos + Tq - 1 against the cache's
 * keys 0 .. pos + i (k, v [B, Hkv, Tk, D]). */
int ref_ATTN_CACHED(RtKctx *k) {
  const IrType *qt = k->it[0], *kt = k->it[1];
  int64_t pos;
  if (pos_of(k, 3, &pos) != 0) return -1;
  if (!ir_dtype_is_float(qt->dtype) || qt->rank != 4 || kt->rank != 4 || kt->dtype != qt->dtype ||
      k->it[2]->dtype != qt->dtype || kt->dim[1] < 1 || qt->dim[1] % kt->dim[1])
    return rt_kfail(k, "q %s and k %s are not [B, H, T, D] of one float dtype", rt_tstr(qt, 0), rt_tstr(kt, 1));
  if (pos + qt->dim[2] > kt->dim[2])
    return rt_kfail(k, "queries at positions %lld .. %lld are past the %lld cached positions", (long long)pos,
                    (long long)(pos + qt->dim[2] - 1), (long long)kt->dim[2]);
  double *slope = NULL;   /* ALiBi: each local query head's slope, by its global head */
  if (k->n->nin == 5 && rt_attn_slopes(k, 4, qt->dim[1], &slope) != 0) return -1;
  CachedJob j = {k->in[0], k->in[1], k->in[2], k->out, qt->dtype, qt->dim[1], kt->dim[1], qt->dim[2], kt->dim[2],
                 qt->dim[3], pos, k->n->ia[0], k->n->fa[0], slope};
  int64_t rows = qt->dim[0] * qt->dim[1] * qt->dim[2];
  rt_par_for(rows, 1, cached_rows, &j);
  free(slope);
  return 0;
}
