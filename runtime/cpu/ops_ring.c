/* ops_ring.c - reference kernels of the ring-attention step ops (attn_acc,
 * attn_finish, attn_lse, attn_bwd_q, attn_bwd_kv; docs/ir.md "Ring
 * attention"), entries of rt_ref_kernels (ops_ref.c) like every other
 * kernel.
 *
 * Under context parallelism the sharding pass lowers attention into one
 * of these per ring step, with ring_shift / ring_wait moving the key
 * blocks; each kernel here is purely local.  q, do, lse, drow are this
 * rank's; k, v are the block of the cp rank `src` steps before this one
 * (coordinate (c - src) mod C), so the causal mask takes the keys' global
 * positions as on THAT rank (rt_global_index_at) and the queries' as on
 * this one.
 *
 * The online-softmax state st [B, Hq, Tq, D + 2] holds per query row the
 * unnormalised accumulator (columns 0..D-1), the running max m of the
 * scaled scores (column D) and the running sum l (column D + 1); l = 0
 * means no key seen yet, whatever m and the accumulator hold, so an
 * all-zero tensor is the start.
 *
 * The tile loops are the fused kernels' (ops_attn.c, via attn_priv.h):
 * folding all keys in one attn_acc from the zero state, then attn_finish,
 * runs exactly the fused forward's arithmetic, and likewise for the
 * backward, so the fused and the stepped paths agree to rounding (exactly
 * in f64).  Arithmetic in the operands' dtype, row statistics in double
 * (attn_t.h).  Threads: those of the tile loops (rt_par_for over
 * (batch, query head), or (batch, kv head) for attn_bwd_kv), so no result
 * depends on the thread count. */
#include "attn_priv.h"
#include <math.h>

/* One call's operands (in their dtype), dims and global positions. */
typedef struct {
  AttnDims d;
  IrDtype dt;
  const void *x[7];
  int64_t *qpos, *kpos;
} Ring;

static void ring_close(Ring *r) {
  free(r->qpos);
  free(r->kpos);
  free((void *)r->d.slope);
}

/* The cp coordinate of the rank `src` ring steps before this one: the
 * owner of the k / v block (-1, this rank's own, when cp has size 1). */
static int block_owner(const RtRank *rk, int64_t src) {
  int C = rt_rank_axis_size(rk, IR_AXIS_CP);
  if (C <= 1) return -1;
  int64_t c = rk->coord[IR_AXIS_CP];
  return (int)(((c - src) % C + C) % C);
}

/* Operands 0..nin-1: q [B, Hq, Tq, D], k, v [B, Hkv, Tk, D], then the
 * op's others, all of q's float dtype.  0, or -1 after rt_kfail (call
 * ring_close either way). */
static int ring_open(RtKctx *k, Ring *r, int nin) {
  memset(r, 0, sizeof *r);
  const IrType *q = k->it[0], *kt = k->it[1];
  IrDtype dt = q->dtype;
  if (dt != IR_F32 && dt != IR_F64) return rt_kfail(k, "needs f32 or f64 operands");
  for (int i = 0; i < nin; i++)
    if (k->it[i]->dtype != dt) return rt_kfail(k, "operand %d must be %s", i + 1, ir_dtype_name(dt));
  if (q->rank != 4 || kt->rank != 4) return rt_kfail(k, "q and k must be 4-D");
  r->d = (AttnDims){q->dim[0], q->dim[1], kt->dim[1], q->dim[2], kt->dim[2], q->dim[3], k->n->fa[0],
                    (int)k->n->ia[0], NULL, 0, ir_attn_window(k->n), NULL, NULL, 0};
  if (r->d.Hkv < 1 || r->d.Hq % r->d.Hkv)
    return rt_kfail(k, "query heads %lld are not a multiple of kv heads %lld", (long long)r->d.Hq,
                    (long long)r->d.Hkv);
  r->dt = dt;
  for (int i = 0; i < nin; i++) r->x[i] = k->in[i];
  r->qpos = ts_xmalloc((size_t)(r->d.Tq + 1) * sizeof *r->qpos);
  r->kpos = ts_xmalloc((size_t)(r->d.Tk + 1) * sizeof *r->kpos);
  rt_attn_positions(k->env->rank, rt_kin_sh(k, 0)->split[2], r->d.Tq, -1, r->qpos);
  rt_attn_positions(k->env->rank, rt_kin_sh(k, 1)->split[2], r->d.Tk, block_owner(k->env->rank, k->n->ia[1]), r->kpos);
  return rt_attn_extras(k, &r->d, r->qpos, r->kpos);
}

/* Element i of a dtype-dt buffer, read and written as double. */
static double ld(const void *p, IrDtype dt, int64_t i) {
  return dt == IR_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
static void st(void *p, IrDtype dt, int64_t i, double v) {
  if (dt == IR_F64) ((double *)p)[i] = v;
  else ((float *)p)[i] = (float)v;
}

/* (q, k, v, st [B, Hq, Tq, D + 2]) -> st with the block folded in.  The
 * state is unpacked into the forward loop's m, l, acc (a row with l = 0
 * restarts at m = -inf, acc = 0), and packed back; rows that still have
 * l = 0 keep their input values. */
int ref_ATTN_ACC(RtKctx *k) {
  Ring r;
  if (ring_open(k, &r, 4)) { ring_close(&r); return -1; }
  IrDtype dt = r.dt;
  int64_t D = r.d.D, W = D + 2, rows = r.d.B * r.d.Hq * r.d.Tq;
  const void *sin = r.x[3];
  double *m = ts_xmalloc((size_t)(rows + 1) * sizeof *m), *l = ts_xmalloc((size_t)(rows + 1) * sizeof *l);
  void *acc = ts_xmalloc((size_t)(rows * D + 1) * ir_dtype_size(dt));
  for (int64_t i = 0; i < rows; i++) {
    int seen = ld(sin, dt, i * W + D + 1) > 0;
    for (int64_t e = 0; e < D; e++) st(acc, dt, i * D + e, seen ? ld(sin, dt, i * W + e) : 0.0);
    m[i] = seen ? ld(sin, dt, i * W + D) : -INFINITY;
    l[i] = seen ? ld(sin, dt, i * W + D + 1) : 0.0;
  }
  AttnFwdJob j = {r.d, dt, r.x[0], r.x[1], r.x[2], r.qpos, r.kpos, m, l, acc};
  rt_attn_fwd_block(&j);
  for (int64_t i = 0; i < rows; i++) {
    int64_t o = i * W;
    if (!(l[i] > 0)) {
      for (int64_t e = 0; e < W; e++) st(k->out, dt, o + e, ld(sin, dt, o + e));
      continue;
    }
    for (int64_t e = 0; e < D; e++) st(k->out, dt, o + e, ld(acc, dt, i * D + e));
    st(k->out, dt, o + D, m[i]);
    st(k->out, dt, o + D + 1, l[i]);
  }
  free(acc);
  free(l);
  free(m);
  ring_close(&r);
  return 0;
}

/* The state operand of attn_finish / attn_lse as doubles; its row count
 * and head_dim into *rows, *D.  NULL after rt_kfail. */
static double *state_in(RtKctx *k, int64_t *rows, int64_t *D, int *own) {
  const IrType *t = k->it[0];
  if (t->dtype != IR_F32 && t->dtype != IR_F64) { rt_kfail(k, "needs an f32 or f64 state"); return NULL; }
  if (t->rank != 4 || t->dim[3] < 3) { rt_kfail(k, "state %s must be [B, H, T, head_dim + 2]", rt_tstr(t, 0)); return NULL; }
  *D = t->dim[3] - 2;
  *rows = t->dim[0] * t->dim[1] * t->dim[2];
  return rt_attn_f64(k->in[0], t->dtype, ir_type_numel(t), own);
}

/* st -> o [B, Hq, Tq, D] = acc / l, 0 where l = 0 (computed as the fused
 * forward does: acc * (1 / l)). */
int ref_ATTN_FINISH(RtKctx *k) {
  int64_t rows, D;
  int own;
  double *st = state_in(k, &rows, &D, &own);
  if (!st) return -1;
  double *o = ts_xmalloc((size_t)(rows * D + 1) * sizeof *o);
  for (int64_t i = 0; i < rows; i++) {
    const double *s = st + i * (D + 2);
    double l = s[D + 1], inv = l > 0 ? 1.0 / l : 0.0;
    for (int64_t e = 0; e < D; e++) o[i * D + e] = l > 0 ? s[e] * inv : 0.0;
  }
  rt_attn_store(k->out, k->ot->dtype, o, rows * D);
  free(o);
  if (own) free(st);
  return 0;
}

/* st -> lse [B, Hq, Tq] = m + log(l), 0 where l = 0. */
int ref_ATTN_LSE(RtKctx *k) {
  int64_t rows, D;
  int own;
  double *st = state_in(k, &rows, &D, &own);
  if (!st) return -1;
  double *y = ts_xmalloc((size_t)(rows + 1) * sizeof *y);
  for (int64_t i = 0; i < rows; i++) {
    const double *s = st + i * (D + 2);
    y[i] = s[D + 1] > 0 ? s[D] + log(s[D + 1]) : 0.0;
  }
  rt_attn_store(k->out, k->ot->dtype, y, rows);
  free(y);
  if (own) free(st);
  return 0;
}

/* (q, k, v, do, lse, drow, acc) -> acc + the block's share: of dq
 * (part 0, attn_bwd_q; acc [B, Hq, Tq, D]) or of dk / dv (part 1 / 2,
 * attn_bwd_kv; acc [B, Hkv, Tk, D]). */
static int ring_bwd(RtKctx *k, int part) {
  Ring r;
  if (ring_open(k, &r, 7)) { ring_close(&r); return -1; }
  int64_t n = ir_type_numel(k->ot), rows = r.d.B * r.d.Hq * r.d.Tq;
  int own_l, own_d;
  double *lse = rt_attn_f64(r.x[4], r.dt, rows, &own_l), *drow = rt_attn_f64(r.x[5], r.dt, rows, &own_d);
  memcpy(k->out, r.x[6], (size_t)n * ir_dtype_size(r.dt));   /* accumulates onto acc */
  AttnBwdJob j = {r.d, r.dt, r.x[0], r.x[1], r.x[2], NULL, r.x[3], lse, drow, r.qpos, r.kpos,
                  part == 0 ? k->out : NULL, part == 1 ? k->out : NULL, part == 2 ? k->out : NULL, NULL};
  if (part == 0) rt_attn_bwd_q(&j);
  else rt_attn_bwd_kv(&j);
  if (own_l) free(lse);
  if (own_d) free(drow);
  ring_close(&r);
  return 0;
}

int ref_ATTN_BWD_Q(RtKctx *k) { return ring_bwd(k, 0); }

int ref_ATTN_BWD_KV(RtKctx *k) {
  int part = (int)k->n->ia[2];
  if (part != 1 && part != 2) return rt_kfail(k, "part must be 1 (dk) or 2 (dv), got %d", part);
  return ring_bwd(k, part);
}
