/* attn_priv.h - the tile loops of attention, shared by the fused kernels
 * (ops_attn.c, which defines everything here) and the ring-attention step
 * kernels (ops_ring.c).  All arithmetic is in double; q [B, Hq, Tq, D],
 * k / v [B, Hkv, Tk, D] (grouped-query: query head h reads kv head
 * h / (Hq / Hkv)).  Positions are GLOBAL indices along the seq dim (the
 * causal mask hides key j from query i when kpos[j] > qpos[i]).  Every
 * loop runs on rt_par_for with one owner per output row range, so no
 * result depends on the thread count. */
#ifndef TS_ATTN_PRIV_H
#define TS_ATTN_PRIV_H
#include "kernels.h"

typedef struct {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  double scale;
  int causal;
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

/* The forward: this rank's queries against one block of keys, folded into
 * the online softmax.  Per query row ([B, Hq, Tq]) the running max m (-inf:
 * no key seen yet) and sum l, and acc [B, Hq, Tq, D] the unnormalised
 * output (NULL: m and l only).  Rows that see no key of the block are left
 * as they are.  Threads over (b, query head). */
typedef struct {
  AttnDims d;
  const double *q, *k, *v;
  const int64_t *qpos, *kpos;
  double *m, *l, *acc;
} AttnFwdJob;
void rt_attn_fwd_block(const AttnFwdJob *j);

/* The backward over one (query block, key block) pair, accumulating into
 * dq [B, Hq, Tq, D] (rt_attn_bwd_q; threads over (b, query head)) or into
 * dk and / or dv [B, Hkv, Tk, D] (rt_attn_bwd_kv, either may be NULL;
 * threads over (b, kv head), a kv head summing over its query heads):
 *   p = exp(scale q.k - lse) (0 when masked or lse = -inf), dp = do.v,
 *   ds = p (dp - drow):  dq += scale ds k,  dk += scale ds q,  dv += p do.
 * lse and drow are [B, Hq, Tq]. */
typedef struct {
  AttnDims d;
  const double *q, *k, *v, *dout, *lse, *drow;
  const int64_t *qpos, *kpos;
  double *dq, *dk, *dv;
} AttnBwdJob;
void rt_attn_bwd_q(const AttnBwdJob *j);
void rt_attn_bwd_kv(const AttnBwdJob *j);
/* One part into res: dq (part 0), dk (1) or dv (2); j's dq / dk / dv are set
 * here. */
void rt_attn_bwd_part(AttnBwdJob *j, int part, double *res);

#endif
