/* attn_priv.h - the tile loops of attention, shared by the fused kernels
 * (ops_attn.c, which defines everything here) and the ring-attention step
 * kernels (ops_ring.c).  Tensors are f32 or f64 and the loops run in
 * their dtype (attn_t.h), row statistics in double; q [B, Hq, Tq, D],
 * k / v [B, Hkv, Tk, D] (grouped-query: query head h reads kv head
 * h / (Hq / Hkv)).  Positions are GLOBAL indices along the seq dim (the
 * causal mask hides key j from query i when kpos[j] > qpos[i]).  Every
 * loop runs on rt_par_for with one owner per output row range, so no
 * result depends on the thread count. */
#ifndef TS_ATTN_PRIV_H
#define TS_ATTN_PRIV_H
#include "kernels.h"

/* doc (NULL: none): document ids [B, Tdoc] of the whole sequence; key j
 * is hidden from query i of batch row b when doc[b, kpos[j]] !=
 * doc[b, qpos[i]] (packed sequences).  slope (NULL: none): ALiBi's slope
 * of each LOCAL query head [Hq] (looked up by the head's global index):
 * the score of query i and key j less slope[h] |qpos[i] - kpos[j]|.
 * bias (NULL: none): the additive score bias [Hb, Tq, Tk] in the tensors'
 * dtype, by LOCAL query head (Hb = 1: one for every head, bias_hs = 0)
 * and local query and key index; bias_hs its head stride (Tq Tk or 0). */
typedef struct {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  double scale;
  int causal;
  const int32_t *doc;
  int64_t Tdoc;
  int64_t window;   /* > 0: keys window or more positions from the query are hidden too */
  const double *slope;
  const void *bias;
  int64_t bias_hs;
} AttnDims;

/* A [n] buffer of dtype dt (f32 or f64) as doubles: the operand itself when
 * f64 (*own = 0), else a widened copy (*own = 1: free it). */
double *rt_attn_f64(const void *x, IrDtype dt, int64_t n, int *own);
/* y [n] into out of dtype dt (a copy unless out is y). */
void rt_attn_store(void *out, IrDtype dt, const double *y, int64_t n);
/* Global positions pos[L] of the L local indices of a dim split by mask,
 * as rt_global_index gives them, except that the cp coordinate is cp (the
 * owner of a block passed around the ring) when cp >= 0. */
void rt_attn_positions(const RtRank *r, unsigned mask, int64_t L, int cp, int64_t *pos);
/* ALiBi's slopes, operand sl of kernel k (f32 or f64 [heads], every query
 * head's), for the Hq local query heads by their global index (q's
 * sharding of dim 1): *out allocated (free it).  0, or -1 after rt_kfail. */
int rt_attn_slopes(RtKctx *k, int sl, int64_t Hq, double **out);
/* The optional operands of kernel k (ir_attn_slope, ir_attn_doc): ALiBi's
 * slopes, looked up for the local query heads by their global index (q's
 * sharding of dim 1) into d->slope (allocated: free it), and the document
 * ids (i32 [B, T]) into d->doc / d->Tdoc; every position must index them;
 * the score bias into d->bias / d->bias_hs.
 * 0, or -1 after rt_kfail. */
int rt_attn_extras(RtKctx *k, AttnDims *d, const int64_t *qpos, const int64_t *kpos);

/* The forward: this rank's queries against one block of keys, folded into
 * the online softmax.  Per query row ([B, Hq, Tq]) the running max m (-inf:
 * no key seen yet) and sum l, and acc [B, Hq, Tq, D] the unnormalised
 * output (NULL: m and l only).  Rows that see no key of the block are left
 * as they are.  q, k, v, acc are of dtype dt (f32 or f64: the loops run in
 * it, attn_t.h); m and l are doubles.  Threads over (b, query head). */
typedef struct {
  AttnDims d;
  IrDtype dt;
  const void *q, *k, *v;
  const int64_t *qpos, *kpos;
  double *m, *l;
  void *acc;
} AttnFwdJob;
void rt_attn_fwd_block(const AttnFwdJob *j);

/* The backward over one (query block, key block) pair:
 *   p = exp(scale q.k - lse) (0 when masked or lse = -inf), dp = do.v,
 *   ds = p (dp - drow):  dq += scale ds k,  dk += scale ds q,  dv += p do,
 * accumulating into dq [B, Hq, Tq, D] and dk, dv [B, Hkv, Tk, D] (any may be
 * NULL; tensors of dtype dt, lse and drow [B, Hq, Tq] doubles).
 *   rt_attn_bwd_q: dq; threads over (b, query head).
 *   rt_attn_bwd_kv: dk and / or dv; threads over (b, kv head), a kv head
 *     summing over its query heads.  With lse and drow NULL and o set it is
 *     the whole backward of attention over whole keys: each (b, kv head)
 *     recomputes its query heads' log-sum-exp rows and drow =
 *     rowsum(do * o), then computes dq, dk and dv (those not NULL) from one
 *     pass over the tiles, sharing the probabilities and ds.  Any subset
 *     gives each result bit for bit as it gives it alone. */
typedef struct {
  AttnDims d;
  IrDtype dt;
  const void *q, *k, *v, *o, *dout;
  const double *lse, *drow;
  const int64_t *qpos, *kpos;
  void *dq, *dk, *dv;
  double *dbias;   /* NULL, or [Hb, Tq, Tk] (d.bias's shape) += sum over b (and h when Hb = 1) of ds */
} AttnBwdJob;
void rt_attn_bwd_q(const AttnBwdJob *j);
void rt_attn_bwd_kv(const AttnBwdJob *j);
/* dbias of the whole backward (j->lse NULL, o set, j->dbias zeroed):
 * threads over the bias heads, each summing the batch rows in order (no
 * result depends on the thread count). */
void rt_attn_bwd_bias(const AttnBwdJob *j);

#endif
