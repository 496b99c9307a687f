/* cp_layout.c - where the elements of a dim split over the context-parallel
 * axis sit in the global tensor: causal load balancing (docs/sharding.md).
 *
 * Under causal attention the first positions of a sequence attend to few
 * keys and the last to many, so contiguous blocks would give the last cp
 * rank the most work.  The cp level of a split is therefore a zigzag: the
 * dim (at that level: the block the axes outer to cp leave) is cut into
 * 2*S chunks and coordinate q holds chunks q and 2*S-1-q, in that order:
 *
 *   cp-local index x in [0, L):   x <  L/2  ->  q * L/2 + x
 *                                  x >= L/2  ->  (2S-1-q) * L/2 + x - L/2
 *
 * Every other axis splits contiguously (outer axis major), as before.  So
 * a value replicated over cp (after an all_gather) is in plain global
 * order, and only kernels that map local to global indices (causal_mask,
 * rope, dropout, the data feed) and the cp collectives (all_gather,
 * reduce_scatter, shard_slice) know about it.
 *
 * All-to-all context parallelism (docs/sharding.md "All-to-all attention")
 * splits the heads over cp the other way: contiguous, and innermost
 * (IR_SPLIT_CP_MINOR: each tp rank's heads cut in cp blocks), so there the
 * cp level is an ordinary block, taken last. */
#include "kernels.h"

int rt_cp_zigzag(const RtRank *r, unsigned mask) {
  return (mask & (1u << IR_AXIS_CP)) && !ir_split_cp_minor(mask) && rt_rank_axis_size(r, IR_AXIS_CP) > 1;
}

int64_t rt_global_index(const RtRank *r, unsigned mask, int64_t L, int64_t j) {
  return rt_global_index_at(r, mask, L, j, -1);
}

int64_t rt_global_index_at(const RtRank *r, unsigned mask, int64_t L, int64_t j, int cp_coord) {
  int64_t g = j, span = L;
  int minor = ir_split_cp_minor(mask);
  if (minor) {   /* cp innermost, contiguous */
    int c = cp_coord >= 0 ? cp_coord : r->coord[IR_AXIS_CP];
    g += (int64_t)c * span;
    span *= rt_rank_axis_size(r, IR_AXIS_CP);
  }
  for (int a = IR_AXIS_COUNT - 1; a >= 0; a--) {   /* inner to outer */
    if (!(mask & (1u << a)) || (minor && a == IR_AXIS_CP)) continue;
    int S = rt_rank_axis_size(r, (IrAxis)a);
    int c = a == IR_AXIS_CP && cp_coord >= 0 ? cp_coord : r->coord[a];
    if (a == IR_AXIS_CP && S > 1) {
      int64_t h = span / 2;
      g = g < h ? (int64_t)c * h + g : (int64_t)(2 * S - 1 - c) * h + (g - h);
    } else {
      g += (int64_t)c * span;
    }
    span *= S;
  }
  return g;
}

void rt_cp_reorder(void *dst, const void *src, int64_t outer, int S, int64_t L, int64_t inner, size_t es,
                   int to_global) {
  int64_t h = L / 2, len = (int64_t)S * L;
  size_t chunk = (size_t)(h * inner) * es;
  const char *x = src;
  char *y = dst;
  for (int64_t o = 0; o < outer; o++)
    for (int q = 0; q < S; q++)
      for (int half = 0; half < 2; half++) {
        int64_t coord_at = (int64_t)q * L + half * h;                      /* in coordinate order */
        int64_t glob_at = (int64_t)(half ? 2 * S - 1 - q : q) * h;          /* in global order */
        int64_t from = to_global ? coord_at : glob_at, to = to_global ? glob_at : coord_at;
        memcpy(y + (size_t)((o * len + to) * inner) * es, x + (size_t)((o * len + from) * inner) * es, chunk);
      }
}

int64_t rt_shard_block(const RtRank *r, unsigned mask, int64_t *nblk) {
  int64_t b = 0, n = 1;
  int minor = ir_split_cp_minor(mask);
  for (int a = 0; a < IR_AXIS_COUNT; a++)   /* IrAxis order is outer to inner (cp* last) */
    if ((mask & (1u << a)) && !(minor && a == IR_AXIS_CP)) {
      int sz = rt_rank_axis_size(r, (IrAxis)a);
      b = b * sz + r->coord[a];
      n *= sz;
    }
  if (minor) {
    int sz = rt_rank_axis_size(r, IR_AXIS_CP);
    b = b * sz + r->coord[IR_AXIS_CP];
    n *= sz;
  }
  if (nblk) *nblk = n;
  return b;
}

void rt_shard_offsets(const RtRank *r, const IrSharding *sh, const IrType *t,
                      int64_t off[IR_MAX_RANK], int64_t gdim[IR_MAX_RANK]) {
  for (int d = 0; d < IR_MAX_RANK; d++) {
    int64_t L = d < t->rank ? t->dim[d] : 1, nb;
    int64_t b = rt_shard_block(r, d < t->rank ? sh->split[d] : 0, &nb);
    off[d] = b * L;
    gdim[d] = nb * L;
  }
}
