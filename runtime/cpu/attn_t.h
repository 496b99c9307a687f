/* attn_t.h - the tile loops of attention (attn_priv.h), written once and
 * included per dtype and instruction set (attn_isa.h, from ops_attn.c):
 * with T = float, SUF = f32, GEMM = cblas_sgemm, EXPROW =
 * attn_exp_row_f32 (ops_attn.c: a polynomial the compiler vectorizes), and
 * with T = double, SUF = f64, GEMM = cblas_dgemm, EXPROW =
 * attn_exp_row_f64 (libm's exp); ISA names the build (base, v3).  Tensors
 * (q, k, v, o, do, the accumulator and the gradients) and the score tiles
 * are in T; the per-row statistics (the running max m and sum l, the
 * log-sum-exp, the softmax backward's row sum) are doubles, and so are the
 * sums that make them.  An f32 model thus runs its attention on sgemm, as
 * its other matmuls do.
 *
 * Tiles: queries in tiles of ATTN_TQ rows, keys of ATTN_TK (the whole
 * backward takes up to ATTN_TK_ROW keys as one tile); the scores of one
 * tile pair, s[nq, nk] = scale Q_t K_t^T, are one small GEMM into a
 * per-thread buffer, so the only score storage is [ATTN_TQ, ATTN_TK].
 * Masked scores are -inf and their probabilities exactly 0. */
#if !defined(T) || !defined(ISA)
#error "include attn_t.h from ops_attn.c with T, SUF, ISA, GEMM and EXPROW defined"
#endif

#define FN(name) RT_CAT(RT_CAT(name, SUF), ISA)

/* s = scale * Q_t K_t^T with the causal and document masks applied;
 * returns whether any score of the tile may be unmasked.  Trailing keys every query of the tile
 * masks are dropped from it (t->nk shrinks: their probabilities would be
 * 0), so a wide key tile on the diagonal computes little that is masked.
 * vis[r] (r < t->nq): row r's scores past its first vis[r] are all masked
 * (-inf), so the row loops stop there (a causal row on the diagonal sees
 * half the tile); keys out of order leave masked scores inside that
 * prefix too, which the loops handle as -inf.
 * q: rows of this (b, h), [Tq, D]; k: the kv head's rows [Tk, D]; doc:
 * batch row b's document ids by global position (NULL: none).  A tile
 * whose keys' documents all differ from its queries' is skipped.  slope:
 * the head's ALiBi slope (0: none), -slope |qpos - kpos| added to every
 * score after the scale (no masking, so no tile is skipped for it).  bias:
 * the head's additive score bias [Tq, Tk] (local indices; NULL: none),
 * added after the scale and before the masks. */
ATTN_INLINE int FN(tile_scores)(const AttnDims *d, Tile *t, const T *q, const T *k, const int64_t *qpos,
                                const int64_t *kpos, const int32_t *doc, double slope, const T *bias, T *s,
                                int64_t *vis) {
  int mask = 0, dmask = 0, wmask = 0;
  if (doc) {   /* documents: no query of the tile shares one with a key -> nothing to compute */
    int32_t qlo = INT32_MAX, qhi = INT32_MIN, klo = INT32_MAX, khi = INT32_MIN;
    for (int64_t r = 0; r < t->nq; r++) {
      int32_t v = doc[qpos[t->i0 + r]];
      qlo = v < qlo ? v : qlo;
      qhi = v > qhi ? v : qhi;
    }
    for (int64_t c = 0; c < t->nk; c++) {
      int32_t v = doc[kpos[t->j0 + c]];
      klo = v < klo ? v : klo;
      khi = v > khi ? v : khi;
    }
    if (khi < qlo || klo > qhi) return 0;
    dmask = !(qlo == qhi && klo == khi && qlo == klo);   /* else one document throughout */
  }
  if (d->causal || d->window > 0) {   /* positions need not be sorted (cp's zigzag): bound them */
    int64_t qmin = INT64_MAX, qmax = INT64_MIN, kmin = INT64_MAX, kmax = INT64_MIN, W = d->window;
    for (int64_t r = 0; r < t->nq; r++) {
      qmin = qpos[t->i0 + r] < qmin ? qpos[t->i0 + r] : qmin;
      qmax = qpos[t->i0 + r] > qmax ? qpos[t->i0 + r] : qmax;
    }
    for (int64_t c = 0; c < t->nk; c++) {
      kmin = kpos[t->j0 + c] < kmin ? kpos[t->j0 + c] : kmin;
      kmax = kpos[t->j0 + c] > kmax ? kpos[t->j0 + c] : kmax;
    }
    if (W > 0) {   /* the window: every key too far from every query, or some pair too far */
      if (qmin - kmax >= W || kmin - qmax >= W) return 0;
      wmask = qmax - kmin >= W || kmax - qmin >= W;
    }
    if (d->causal) {
      if (kmin > qmax) return 0;   /* every key after every query */
      mask = kmax > qmin;          /* else every key is visible to every query */
      while (t->nk > 1 && kpos[t->j0 + t->nk - 1] > qmax) t->nk--;
    }
  }
  GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->nq, (int)t->nk, (int)d->D, (T)d->scale, q + t->i0 * d->D,
       (int)d->D, k + t->j0 * d->D, (int)d->D, 0, s, (int)t->nk);
  for (int64_t r = 0; r < t->nq; r++) vis[r] = t->nk;
  if (bias)   /* the score bias, row r of the tile at query t->i0 + r */
    for (int64_t r = 0; r < t->nq; r++) {
      T *sr = s + r * t->nk;
      const T *br = bias + (t->i0 + r) * d->Tk + t->j0;
      for (int64_t c = 0; c < t->nk; c++) sr[c] += br[c];
    }
  if (slope != 0)   /* ALiBi by global positions: -slope |i - j| */
    for (int64_t r = 0; r < t->nq; r++) {
      T *sr = s + r * t->nk;
      int64_t qp = qpos[t->i0 + r];
      for (int64_t c = 0; c < t->nk; c++) {
        int64_t dist = qp - kpos[t->j0 + c];
        sr[c] -= (T)(slope * (double)(dist < 0 ? -dist : dist));
      }
    }
  if (dmask)   /* keys of other documents: -inf inside the visible prefix, as keys out of order */
    for (int64_t r = 0; r < t->nq; r++) {
      T *sr = s + r * t->nk;
      int32_t qd = doc[qpos[t->i0 + r]];
      for (int64_t c = 0; c < t->nk; c++)
        if (doc[kpos[t->j0 + c]] != qd) sr[c] = -INFINITY;
    }
  if (wmask)   /* keys W or more positions from the query: -inf, as above */
    for (int64_t r = 0; r < t->nq; r++) {
      T *sr = s + r * t->nk;
      int64_t qp = qpos[t->i0 + r];
      for (int64_t c = 0; c < t->nk; c++) {
        int64_t dist = qp - kpos[t->j0 + c];
        if (dist >= d->window || -dist >= d->window) sr[c] = -INFINITY;
      }
    }
  if (!mask) return 1;
  const int64_t *kp = kpos + t->j0;
  int sorted = 1;
  for (int64_t c = 1; c < t->nk && sorted; c++) sorted = kp[c - 1] <= kp[c];
  for (int64_t r = 0; r < t->nq; r++) {
    T *sr = s + r * t->nk;
    int64_t qp = qpos[t->i0 + r];
    if (sorted) {   /* keys in order (no cp zigzag inside the tile): mask the row's tail */
      int64_t lo = 0, hi = t->nk;   /* the first key after the query */
      while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (kp[mid] > qp) hi = mid;
        else lo = mid + 1;
      }
      for (int64_t c = lo; c < t->nk; c++) sr[c] = -INFINITY;
      vis[r] = lo;
    } else {
      for (int64_t c = 0; c < t->nk; c++)
        if (kp[c] > qp) sr[c] = -INFINITY;
    }
  }
  return 1;
}

/* x[0] + ... + x[n-1] in double, in four partial sums (no chain of
 * dependent adds) */
ATTN_INLINE double FN(row_sum)(const T *x, int64_t n) {
  double part[4] = {0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    for (int u = 0; u < 4; u++) part[u] += x[c + u];
  for (; c < n; c++) part[0] += x[c];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

/* The softmax numerators of a score row s[0, n) whose scores past vis are
 * masked: s = exp(s - m) over the prefix, exactly 0 past it.  With m the
 * row's max this is the tile's own softmax, unnormalised; with the
 * log-sum-exp it is the probability itself. */
ATTN_INLINE void FN(row_exp)(T *sr, int64_t vis, int64_t n, T m) {
  EXPROW(sr, vis, m);   /* a masked score inside the prefix (keys out of order): exp(-inf) = 0 */
  for (int64_t c = vis; c < n; c++) sr[c] = 0;
}

/* max(s[0, n)), -inf when every score is masked; in eight running maxima
 * (independent lanes: one chain of dependent compares is what it costs
 * otherwise) */
ATTN_INLINE T FN(row_max)(const T *sr, int64_t n) {
  T part[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int u = 0; u < 8; u++) part[u] = sr[c + u] > part[u] ? sr[c + u] : part[u];
  for (; c < n; c++) part[0] = sr[c] > part[0] ? sr[c] : part[0];
  T mt = part[0];
  for (int u = 1; u < 8; u++) mt = part[u] > mt ? part[u] : mt;
  return mt;
}

/* ---- the forward: online softmax over one block of keys ----
 * For head bh (b * Hq + h): its rows M, L ([Tq]) and, when A is not NULL,
 * its unnormalised output [Tq, D].  A row that has seen no key
 * yet has m = -inf, l = 0 and acc = 0; rows that see no key of this block
 * are left as they are.  s is a per-thread [ATTN_TQ, ATTN_TK] tile. */
ATTN_INLINE void FN(fwd_head)(const AttnFwdJob *j, int64_t bh, double *M, double *L, T *A, T *s) {
  const AttnDims *d = &j->d;
  int64_t D = d->D, grp = d->Hq / d->Hkv;
  int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / grp;
  const T *K = (const T *)j->k + (b * d->Hkv + hk) * d->Tk * D, *V = (const T *)j->v + (b * d->Hkv + hk) * d->Tk * D;
  const T *Q = (const T *)j->q + bh * d->Tq * D;
  const int32_t *doc = d->doc ? d->doc + b * d->Tdoc : NULL;
  double slope = d->slope ? d->slope[h] : 0.0;
  const T *bias = d->bias ? (const T *)d->bias + h * d->bias_hs : NULL;
  int64_t vis[ATTN_TQ];
  for (Tile t = {0}; t.i0 < d->Tq; t.i0 += ATTN_TQ) {
    t.nq = d->Tq - t.i0 < ATTN_TQ ? d->Tq - t.i0 : ATTN_TQ;
    for (t.j0 = 0; t.j0 < d->Tk; t.j0 += ATTN_TK) {
      t.nk = d->Tk - t.j0 < ATTN_TK ? d->Tk - t.j0 : ATTN_TK;
      if (!FN(tile_scores)(d, &t, Q, K, j->qpos, j->kpos, doc, slope, bias, s, vis)) continue;
      /* per row: new max, rescale what was summed so far, p = exp(s - m) */
      for (int64_t r = 0; r < t.nq; r++) {
        T *sr = s + r * t.nk, mt = FN(row_max)(sr, vis[r]);   /* -inf: masked */
        int64_t i = t.i0 + r;
        if (mt == -INFINITY) {                     /* the row sees no key of this tile */
          for (int64_t c = 0; c < t.nk; c++) sr[c] = 0;
          continue;
        }
        int fresh = M[i] == -INFINITY;   /* no key seen yet: the accumulator row is 0 */
        double m_new = M[i] > mt ? M[i] : mt, corr = fresh ? 0.0 : exp(M[i] - m_new);
        FN(row_exp)(sr, vis[r], t.nk, (T)m_new);
        L[i] = L[i] * corr + FN(row_sum)(sr, vis[r]);
        M[i] = m_new;
        if (A && corr != 1.0 && !fresh)
          for (int64_t e = 0; e < D; e++) A[i * D + e] *= (T)corr;
      }
      if (A)   /* acc_t += P V_t */
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t.nq, (int)D, (int)t.nk, 1, s, (int)t.nk,
             V + t.j0 * D, (int)D, 1, A + t.i0 * D, (int)D);
    }
  }
}

/* the heads bh in [lo, hi) of job j (rt_attn_fwd_block) */
static void FN(fwd_range)(void *jp, int64_t lo, int64_t hi) {
  const AttnFwdJob *j = jp;
  int64_t Tq = j->d.Tq, D = j->d.D;
  T *s = ts_xmalloc(ATTN_TQ * ATTN_TK * sizeof *s);
  for (int64_t bh = lo; bh < hi; bh++)
    FN(fwd_head)(j, bh, j->m + bh * Tq, j->l + bh * Tq, j->acc ? (T *)j->acc + bh * Tq * D : NULL, s);
  free(s);
}

/* ---- the backward over one (query head, kv head) pair ----
 * p = exp(scale q.k - lse), dp = do.v, ds = p (dp - drow):
 *   dq += scale ds k,   dk += scale ds q,   dv += p do,
 * for the outputs that are not NULL: DQ this head's [Tq, D] rows, DK / DV
 * the kv head's [Tk, D].  Q, G (do) are the head's rows, K, V the kv
 * head's, lse / drow the head's [Tq].  Key tiles of tk rows (ATTN_TK, or
 * every key at once when lse is NULL); s, dp: [ATTN_TQ, tk] tiles.  Each output accumulates tile by tile in (query tile, key tile)
 * order, whichever others are computed alongside, so one part alone and
 * all three together give the same bits. */
typedef struct {
  const AttnDims *d;
  const T *Q, *G, *K, *V;
  const double *lse, *drow;
  const int64_t *qpos, *kpos;
  const int32_t *doc;   /* batch row b's document ids (NULL: none) */
  double slope;         /* the head's ALiBi slope (0: none) */
  const T *bias;        /* the head's score bias [Tq, Tk] (NULL: none) */
  T *DQ, *DK, *DV;
  double *DB;           /* NULL, or the bias head's gradient [Tq, Tk] += ds */
  int64_t tk;   /* key rows per tile */
} FN(HeadGrad);

ATTN_INLINE void FN(head_grads)(const FN(HeadGrad) *g, T *s, T *dp) {
  /* lse NULL: every row's keys fit one tile (Tk <= tk, the caller's
   * promise), so its probabilities come from the tile itself */
  const AttnDims *d = g->d;
  int64_t D = d->D;
  int need_ds = g->DQ || g->DK || g->DB;
  int64_t vis[ATTN_TQ];
  for (Tile t = {0}; t.i0 < d->Tq; t.i0 += ATTN_TQ) {
    t.nq = d->Tq - t.i0 < ATTN_TQ ? d->Tq - t.i0 : ATTN_TQ;
    for (t.j0 = 0; t.j0 < d->Tk; t.j0 += g->tk) {
      t.nk = d->Tk - t.j0 < g->tk ? d->Tk - t.j0 : g->tk;
      if (!FN(tile_scores)(d, &t, g->Q, g->K, g->qpos, g->kpos, g->doc, g->slope, g->bias, s, vis)) continue;
      if (need_ds)
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t.nq, (int)t.nk, (int)D, 1, g->G + t.i0 * D, (int)D,
             g->V + t.j0 * D, (int)D, 0, dp, (int)t.nk);
      for (int64_t r = 0; r < t.nq; r++) {
        double dr = g->drow[t.i0 + r];
        T *sr = s + r * t.nk, *dr_ = dp + r * t.nk;
        int64_t v = vis[r];   /* past it p = 0, and so ds */
        if (g->lse) {
          double ls = g->lse[t.i0 + r];
          if (ls == -INFINITY) v = 0;   /* the row sees no key */
          FN(row_exp)(sr, v, t.nk, (T)ls);
        } else {   /* the tile is the row's only one: its softmax from the row itself */
          T mt = FN(row_max)(sr, v);
          if (mt == -INFINITY) v = 0;
          FN(row_exp)(sr, v, t.nk, mt);
          if (v) {
            double inv = 1.0 / FN(row_sum)(sr, v);
            for (int64_t c = 0; c < v; c++) sr[c] = (T)(sr[c] * inv);
          }
        }
        if (need_ds) {
          for (int64_t c = 0; c < v; c++) dr_[c] = (T)(sr[c] * ((double)dr_[c] - dr));
          for (int64_t c = v; c < t.nk; c++) dr_[c] = 0;
          if (g->DB)   /* dbias: ds itself (the bias enters the score with weight 1) */
            for (int64_t c = 0; c < v; c++) g->DB[(t.i0 + r) * d->Tk + t.j0 + c] += (double)dr_[c];
        }
      }
      if (g->DV)   /* dV_t += P^T dO_t */
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t.nk, (int)D, (int)t.nq, 1, s, (int)t.nk, g->G + t.i0 * D,
             (int)D, 1, g->DV + t.j0 * D, (int)D);
      if (g->DK)   /* dK_t += scale dS^T Q_t */
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t.nk, (int)D, (int)t.nq, (T)d->scale, dp, (int)t.nk,
             g->Q + t.i0 * D, (int)D, 1, g->DK + t.j0 * D, (int)D);
      if (g->DQ)   /* dQ_t += scale dS K_t */
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t.nq, (int)D, (int)t.nk, (T)d->scale, dp, (int)t.nk,
             g->K + t.j0 * D, (int)D, 1, g->DQ + t.i0 * D, (int)D);
    }
  }
}

/* The pair (b, h) of job j: operands and outputs at their rows (dq and the
 * kv outputs only where asked). */
static FN(HeadGrad) FN(head_of)(const AttnBwdJob *j, int64_t b, int64_t h, const double *lse, const double *drow,
                               int want_q, int want_kv) {
  const AttnDims *d = &j->d;
  int64_t D = d->D, hk = h / (d->Hq / d->Hkv), bh = b * d->Hq + h, bk = b * d->Hkv + hk;
  FN(HeadGrad) g = {d, (const T *)j->q + bh * d->Tq * D, (const T *)j->dout + bh * d->Tq * D,
                    (const T *)j->k + bk * d->Tk * D, (const T *)j->v + bk * d->Tk * D, lse, drow, j->qpos,
                    j->kpos, d->doc ? d->doc + b * d->Tdoc : NULL, d->slope ? d->slope[h] : 0.0,
                    d->bias ? (const T *)d->bias + h * d->bias_hs : NULL, NULL, NULL, NULL, NULL, ATTN_TK};
  if (want_q && j->dq) g.DQ = (T *)j->dq + bh * d->Tq * D;
  if (want_kv && j->dk) g.DK = (T *)j->dk + bk * d->Tk * D;
  if (want_kv && j->dv) g.DV = (T *)j->dv + bk * d->Tk * D;
  return g;
}

/* dq over the heads bh in [lo, hi), lse / drow given (attn_bwd_q) */
static void FN(bwd_q_range)(void *jp, int64_t lo, int64_t hi) {
  const AttnBwdJob *j = jp;
  T *s = ts_xmalloc(2 * ATTN_TQ * ATTN_TK * sizeof *s);
  for (int64_t bh = lo; bh < hi; bh++) {
    int64_t off = bh * j->d.Tq;
    FN(HeadGrad) g = FN(head_of)(j, bh / j->d.Hq, bh % j->d.Hq, j->lse + off, j->drow + off, 1, 0);
    FN(head_grads)(&g, s, s + ATTN_TQ * ATTN_TK);
  }
  free(s);
}

/* The rows the whole backward of head bh needs (keys in tiles of tk):
 * *lse its log-sum-exp rows (a forward pass without the accumulator into
 * row[0, 2 Tq)), or NULL when the keys fit one tile (each tile's rows give
 * their own), and *drow = rowsum(do * o) (into row[2 Tq, 3 Tq)); s a
 * [ATTN_TQ, tk] scratch tile. */
static void FN(whole_rows)(const AttnBwdJob *j, int64_t bh, int64_t tk, double *row, T *s, const double **lse,
                           const double **drow) {
  const AttnDims *d = &j->d;
  int64_t Tq = d->Tq, D = d->D;
  double *m = row, *l = row + Tq, *dr = row + 2 * Tq;
  if (d->Tk > tk) {   /* several key tiles per row: their log-sum-exp first */
    for (int64_t i = 0; i < Tq; i++) { m[i] = -INFINITY; l[i] = 0; }
    AttnFwdJob f = {*d, j->dt, j->q, j->k, j->v, j->qpos, j->kpos, NULL, NULL, NULL};
    FN(fwd_head)(&f, bh, m, l, NULL, s);
    for (int64_t i = 0; i < Tq; i++) m[i] = l[i] > 0 ? m[i] + log(l[i]) : -INFINITY;
  }
  const T *O = (const T *)j->o + bh * Tq * D, *G = (const T *)j->dout + bh * Tq * D;
  for (int64_t i = 0; i < Tq; i++) {
    double acc = 0;
    for (int64_t e = 0; e < D; e++) acc += (double)G[i * D + e] * (double)O[i * D + e];
    dr[i] = acc;
  }
  *lse = d->Tk > tk ? m : NULL;   /* NULL: head_grads takes each row's from its tile */
  *drow = dr;
}

/* Over the kv heads bk in [lo, hi) (b * Hkv + hk): everything the query
 * heads reading them give.  With j->lse NULL this is the whole backward
 * (rt_attn_grads_run): per query head, the log-sum-exp rows (a forward pass
 * without the accumulator; when the keys fit one tile, each tile's rows
 * give their own instead) and drow = rowsum(do * o) first, then dq of the
 * head (a query head reads one kv head, so this range owns it) and its
 * share of dk, dv.  Else (attn_bwd_kv) the given lse / drow, dk / dv only. */
static void FN(bwd_kv_range)(void *jp, int64_t lo, int64_t hi) {
  const AttnBwdJob *j = jp;
  const AttnDims *d = &j->d;
  int64_t grp = d->Hq / d->Hkv, Tq = d->Tq;
  int whole = j->lse == NULL;
  /* the whole backward with few keys: one tile per row, no log-sum-exp pass */
  int64_t tk = whole && d->Tk <= ATTN_TK_ROW && d->Tk > ATTN_TK ? d->Tk : ATTN_TK;
  T *s = ts_xmalloc(2 * ATTN_TQ * tk * sizeof *s);
  double *row = whole ? ts_xmalloc((size_t)(3 * Tq + 1) * sizeof *row) : NULL;
  for (int64_t bk = lo; bk < hi; bk++) {
    int64_t b = bk / d->Hkv, hk = bk % d->Hkv;
    for (int64_t h = hk * grp; h < (hk + 1) * grp; h++) {   /* the query heads reading this kv head */
      int64_t bh = b * d->Hq + h;
      const double *lse, *drow;
      if (whole) FN(whole_rows)(j, bh, tk, row, s, &lse, &drow);
      else {
        lse = j->lse + bh * Tq;
        drow = j->drow + bh * Tq;
      }
      FN(HeadGrad) g = FN(head_of)(j, b, h, lse, drow, whole, 1);
      g.tk = tk;
      FN(head_grads)(&g, s, s + ATTN_TQ * tk);
    }
  }
  free(row);
  free(s);
}

/* dbias over the bias heads hb in [lo, hi) (rt_attn_bwd_bias): per batch
 * row in order, each query head it covers (hb itself, or every head when
 * the bias has one) adds its ds, the whole backward's, into dbias[hb]. */
static void FN(bwd_bias_range)(void *jp, int64_t lo, int64_t hi) {
  const AttnBwdJob *j = jp;
  const AttnDims *d = &j->d;
  int64_t Tq = d->Tq, tk = d->Tk <= ATTN_TK_ROW && d->Tk > ATTN_TK ? d->Tk : ATTN_TK;
  T *s = ts_xmalloc(2 * ATTN_TQ * tk * sizeof *s);
  double *row = ts_xmalloc((size_t)(3 * Tq + 1) * sizeof *row);
  for (int64_t hb = lo; hb < hi; hb++) {
    int64_t h0 = d->bias_hs ? hb : 0, h1 = d->bias_hs ? hb + 1 : d->Hq;
    for (int64_t b = 0; b < d->B; b++)
      for (int64_t h = h0; h < h1; h++) {
        const double *lse, *drow;
        FN(whole_rows)(j, b * d->Hq + h, tk, row, s, &lse, &drow);
        FN(HeadGrad) g = FN(head_of)(j, b, h, lse, drow, 0, 0);
        g.tk = tk;
        g.DB = j->dbias + hb * Tq * d->Tk;
        FN(head_grads)(&g, s, s + ATTN_TQ * tk);
      }
  }
  free(row);
  free(s);
}

#undef FN
