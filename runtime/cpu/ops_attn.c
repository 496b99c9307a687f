/* ops_attn.c - reference kernels of the fused attention ops (attention,
 * attention_bwd; docs/ir.md "Fused attention"), entries of rt_ref_kernels
 * (ops_ref.c) like every other kernel.
 *
 * Flash style: the forward walks 64 x 64 tiles of (queries, keys) with an
 * online softmax (running max m, running sum l, unnormalised accumulator;
 * the tile's scores and products are BLAS GEMMs), so nothing of size
 * [Tq, Tk] is ever held; the backward recomputes the probabilities
 * p = exp(scale q.k - lse) from q, k and the log-sum-exp rows, which it
 * recomputes itself (one extra pass over the keys) rather than taking from
 * the forward, so both ops keep single results.
 *
 * Positions: a causal mask hides key j from query i when the GLOBAL
 * position of j is after that of i.  Global positions come from the
 * operands' shardings (the seq dim, 2, may be split over cp -- a zigzag,
 * runtime/cpu/cp_layout.c -- or over tp under sequence parallelism), so the
 * kernel works on any block of the sequence.
 *
 * Ring attention (context parallelism) is not here: the sharding pass
 * lowers it into one attn_* step per cp rank (ops_ring.c, docs/sharding.md
 * "Ring attention"), so these kernels see whole keys or a gathered
 * sequence.
 *
 * All arithmetic is in double (f32 operands are widened once).
 * Threads: rt_par_for over (batch, query head) for the forward and dq, over
 * (batch, kv head) for dk / dv (a kv head's gradient sums over its query
 * heads, so one thread owns it): no result depends on the thread count.
 *
 * The tile loops (forward block, dq, dk / dv) are declared in attn_priv.h:
 * the ring-attention step kernels (ops_ring.c) run the same ones on one
 * key block each, so both paths give the same numbers. */
#include "attn_priv.h"
#include "par.h"
#include <cblas.h>
#include <math.h>

#define ATTN_TILE 64          /* query rows and key rows per tile */

/* ---- operands ---- */

double *rt_attn_f64(const void *x, IrDtype dt, int64_t n, int *own) {
  if (dt == IR_F64) { *own = 0; return (double *)x; }
  double *y = ts_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = ((const float *)x)[i];
  *own = 1;
  return y;
}

void rt_attn_store(void *out, IrDtype dt, const double *y, int64_t n) {
  if (dt == IR_F64) { if (out != (void *)y) memcpy(out, y, (size_t)n * sizeof *y); return; }
  for (int64_t i = 0; i < n; i++) ((float *)out)[i] = (float)y[i];
}

void rt_attn_positions(const RtRank *r, unsigned mask, int64_t L, int cp, int64_t *pos) {
  for (int64_t j = 0; j < L; j++) pos[j] = rt_global_index_at(r, mask, L, j, cp);
}

/* ---- tiles ----
 * Queries and keys are taken in tiles of ATTN_TILE rows; the scores of one
 * tile pair, s[nq, nk] = scale * Q_t K_t^T, are one small GEMM (BLAS) into
 * a per-thread buffer, so the only score storage is [ATTN_TILE, ATTN_TILE].
 * Masked scores are -inf and their probabilities exactly 0. */
typedef struct { int64_t i0, nq, j0, nk; } Tile;

/* s = scale * Q_t K_t^T with the causal mask applied; returns whether any
 * score of the tile is unmasked.  q: rows of this (b, h), [Tq, D]; k: the
 * kv head's rows [Tk, D]. */
static int tile_scores(const AttnDims *d, const Tile *t, const double *q, const double *k, const int64_t *qpos,
                       const int64_t *kpos, double *s) {
  if (d->causal && kpos[t->j0] > qpos[t->i0 + t->nq - 1]) {
    /* the tile may be wholly masked (its first key after its last query): check */
    int any = 0;
    for (int64_t r = 0; r < t->nq && !any; r++)
      for (int64_t c = 0; c < t->nk && !any; c++) any = kpos[t->j0 + c] <= qpos[t->i0 + r];
    if (!any) return 0;
  }
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->nq, (int)t->nk, (int)d->D, d->scale,
              q + t->i0 * d->D, (int)d->D, k + t->j0 * d->D, (int)d->D, 0.0, s, (int)t->nk);
  if (d->causal)
    for (int64_t r = 0; r < t->nq; r++)
      for (int64_t c = 0; c < t->nk; c++)
        if (kpos[t->j0 + c] > qpos[t->i0 + r]) s[r * t->nk + c] = -INFINITY;
  return 1;
}

/* ---- the forward: online softmax over one block of keys (attn_priv.h) ----
 * A row that has seen no key yet has m = -inf, l = 0 and acc = 0. */

static void fwd_rows(void *jp, int64_t lo, int64_t hi) {
  const AttnFwdJob *j = jp;
  const AttnDims *d = &j->d;
  int64_t D = d->D, grp = d->Hq / d->Hkv;
  double *s = ts_xmalloc(ATTN_TILE * ATTN_TILE * sizeof *s);
  for (int64_t bh = lo; bh < hi; bh++) {
    int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / grp;
    const double *K = j->k + (b * d->Hkv + hk) * d->Tk * D, *V = j->v + (b * d->Hkv + hk) * d->Tk * D;
    const double *Q = j->q + bh * d->Tq * D;
    double *M = j->m + bh * d->Tq, *L = j->l + bh * d->Tq, *A = j->acc ? j->acc + bh * d->Tq * D : NULL;
    for (Tile t = {0}; t.i0 < d->Tq; t.i0 += ATTN_TILE) {
      t.nq = d->Tq - t.i0 < ATTN_TILE ? d->Tq - t.i0 : ATTN_TILE;
      for (t.j0 = 0; t.j0 < d->Tk; t.j0 += ATTN_TILE) {
        t.nk = d->Tk - t.j0 < ATTN_TILE ? d->Tk - t.j0 : ATTN_TILE;
        if (!tile_scores(d, &t, Q, K, j->qpos, j->kpos, s)) continue;
        /* per row: new max, rescale what was summed so far, p = exp(s - m) */
        for (int64_t r = 0; r < t.nq; r++) {
          double *sr = s + r * t.nk, mt = -INFINITY;
          for (int64_t c = 0; c < t.nk; c++) mt = sr[c] > mt ? sr[c] : mt;
          int64_t i = t.i0 + r;
          if (mt == -INFINITY) {                     /* the row sees no key of this tile */
            for (int64_t c = 0; c < t.nk; c++) sr[c] = 0;
            continue;
          }
          double m_new = M[i] > mt ? M[i] : mt, corr = M[i] == -INFINITY ? 0.0 : exp(M[i] - m_new), sum = 0;
          for (int64_t c = 0; c < t.nk; c++) { sr[c] = exp(sr[c] - m_new); sum += sr[c]; }
          L[i] = L[i] * corr + sum;
          M[i] = m_new;
          if (A && corr != 1.0)
            for (int64_t e = 0; e < D; e++) A[i * D + e] *= corr;
        }
        if (A)   /* acc_t += P V_t */
          cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t.nq, (int)D, (int)t.nk, 1.0, s, (int)t.nk,
                      V + t.j0 * D, (int)D, 1.0, A + t.i0 * D, (int)D);
      }
    }
  }
  free(s);
}

void rt_attn_fwd_block(const AttnFwdJob *j) { rt_par_for(j->d.B * j->d.Hq, 1, fwd_rows, (void *)j); }

/* m, l -> lse in place of m (-inf for a row that sees no key); acc -> o =
 * acc / l (0 for such a row: no NaN when a rank's queries are all masked). */
static void fwd_finish(int64_t rows, int64_t D, double *m, const double *l, double *acc) {
  for (int64_t r = 0; r < rows; r++) {
    double inv = l[r] > 0 ? 1.0 / l[r] : 0.0;
    if (acc)
      for (int64_t e = 0; e < D; e++) acc[r * D + e] *= inv;
    m[r] = l[r] > 0 ? m[r] + log(l[r]) : -INFINITY;
  }
}

/* ---- the backward over one (query block, key block) pair (attn_priv.h) ----
 * p = exp(scale q.k - lse), dp = do.v, ds = p (dp - Drow):
 *   dq += scale ds k,   dk += scale ds q,   dv += p do.
 * part 0 (dq [B, Hq, Tq, D]) runs over (b, query head); parts 1 and 2
 * (dk / dv [B, Hkv, Tk, D]; `dk` or `dv` may be NULL) over (b, kv head). */

/* For one (b, h) and tile pair: p into s and, unless dp is NULL (dv needs
 * p only), ds into dp (both [nq, nk]); returns 0 when the whole tile is
 * masked.  Q, G (do) are the head's [Tq, D] rows, K, V the kv head's
 * [Tk, D], lse / drow the head's rows. */
static int tile_grads(const AttnBwdJob *j, const Tile *t, const double *Q, const double *G, const double *K,
                      const double *V, const double *lse, const double *drow, double *s, double *dp) {
  const AttnDims *d = &j->d;
  if (!tile_scores(d, t, Q, K, j->qpos, j->kpos, s)) return 0;
  if (dp)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->nq, (int)t->nk, (int)d->D, 1.0, G + t->i0 * d->D,
                (int)d->D, V + t->j0 * d->D, (int)d->D, 0.0, dp, (int)t->nk);
  for (int64_t r = 0; r < t->nq; r++) {
    double ls = lse[t->i0 + r], dr = drow[t->i0 + r];
    for (int64_t c = 0; c < t->nk; c++) {
      int64_t x = r * t->nk + c;
      s[x] = (ls == -INFINITY || s[x] == -INFINITY) ? 0.0 : exp(s[x] - ls);
      if (dp) dp[x] = s[x] * (dp[x] - dr);
    }
  }
  return 1;
}

static void bwd_q_rows(void *jp, int64_t lo, int64_t hi) {
  const AttnBwdJob *j = jp;
  const AttnDims *d = &j->d;
  int64_t D = d->D, grp = d->Hq / d->Hkv;
  double *s = ts_xmalloc(2 * ATTN_TILE * ATTN_TILE * sizeof *s), *dp = s + ATTN_TILE * ATTN_TILE;
  for (int64_t bh = lo; bh < hi; bh++) {
    int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / grp;
    const double *K = j->k + (b * d->Hkv + hk) * d->Tk * D, *V = j->v + (b * d->Hkv + hk) * d->Tk * D;
    const double *Q = j->q + bh * d->Tq * D, *G = j->dout + bh * d->Tq * D;
    for (Tile t = {0}; t.i0 < d->Tq; t.i0 += ATTN_TILE) {
      t.nq = d->Tq - t.i0 < ATTN_TILE ? d->Tq - t.i0 : ATTN_TILE;
      for (t.j0 = 0; t.j0 < d->Tk; t.j0 += ATTN_TILE) {
        t.nk = d->Tk - t.j0 < ATTN_TILE ? d->Tk - t.j0 : ATTN_TILE;
        if (!tile_grads(j, &t, Q, G, K, V, j->lse + bh * d->Tq, j->drow + bh * d->Tq, s, dp)) continue;
        /* dq_t += scale dS K_t */
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t.nq, (int)D, (int)t.nk, d->scale, dp,
                    (int)t.nk, K + t.j0 * D, (int)D, 1.0, j->dq + (bh * d->Tq + t.i0) * D, (int)D);
      }
    }
  }
  free(s);
}

static void bwd_kv_rows(void *jp, int64_t lo, int64_t hi) {
  const AttnBwdJob *j = jp;
  const AttnDims *d = &j->d;
  int64_t D = d->D, grp = d->Hq / d->Hkv;
  double *s = ts_xmalloc(2 * ATTN_TILE * ATTN_TILE * sizeof *s), *dp = s + ATTN_TILE * ATTN_TILE;
  for (int64_t bk = lo; bk < hi; bk++) {
    int64_t b = bk / d->Hkv, hk = bk % d->Hkv;
    const double *K = j->k + bk * d->Tk * D, *V = j->v + bk * d->Tk * D;
    double *dK = j->dk ? j->dk + bk * d->Tk * D : NULL, *dV = j->dv ? j->dv + bk * d->Tk * D : NULL;
    for (int64_t h = hk * grp; h < (hk + 1) * grp; h++) {   /* the query heads reading this kv head */
      int64_t bh = b * d->Hq + h;
      const double *Q = j->q + bh * d->Tq * D, *G = j->dout + bh * d->Tq * D;
      for (Tile t = {0}; t.i0 < d->Tq; t.i0 += ATTN_TILE) {
        t.nq = d->Tq - t.i0 < ATTN_TILE ? d->Tq - t.i0 : ATTN_TILE;
        for (t.j0 = 0; t.j0 < d->Tk; t.j0 += ATTN_TILE) {
          t.nk = d->Tk - t.j0 < ATTN_TILE ? d->Tk - t.j0 : ATTN_TILE;
          if (!tile_grads(j, &t, Q, G, K, V, j->lse + bh * d->Tq, j->drow + bh * d->Tq, s, dK ? dp : NULL))
            continue;
          if (dV)   /* dV_t += P^T dO_t */
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t.nk, (int)D, (int)t.nq, 1.0, s, (int)t.nk,
                        G + t.i0 * D, (int)D, 1.0, dV + t.j0 * D, (int)D);
          if (dK)   /* dK_t += scale dS^T Q_t */
            cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t.nk, (int)D, (int)t.nq, d->scale, dp,
                        (int)t.nk, Q + t.i0 * D, (int)D, 1.0, dK + t.j0 * D, (int)D);
        }
      }
    }
  }
  free(s);
}

void rt_attn_bwd_q(const AttnBwdJob *j) { rt_par_for(j->d.B * j->d.Hq, 1, bwd_q_rows, (void *)j); }
void rt_attn_bwd_kv(const AttnBwdJob *j) { rt_par_for(j->d.B * j->d.Hkv, 1, bwd_kv_rows, (void *)j); }

void rt_attn_bwd_part(AttnBwdJob *j, int part, double *res) {
  j->dq = part == 0 ? res : NULL;
  j->dk = part == 1 ? res : NULL;
  j->dv = part == 2 ? res : NULL;
  if (part == 0) rt_attn_bwd_q(j);
  else rt_attn_bwd_kv(j);
}

/* ---- the kernels ---- */

/* Everything one call needs: dims, doubles of the operands, positions. */
typedef struct {
  RtKctx *k;
  AttnDims d;
  unsigned qmask, kmask;         /* split masks of the seq dims of q and k */
  double *x[5];                  /* q, k, v, o, do as doubles */
  int own[5];
  int64_t *qpos, *kpos;
} Attn;

static int attn_open(RtKctx *k, Attn *a, int nin) {
  memset(a, 0, sizeof *a);
  a->k = k;
  const IrType *q = k->it[0], *kt = k->it[1];
  IrDtype dt = q->dtype;
  if (dt != IR_F32 && dt != IR_F64) return rt_kfail(k, "needs f32 or f64 operands");
  for (int i = 0; i < nin; i++)
    if (k->it[i]->dtype != dt || k->it[i]->rank != 4) return rt_kfail(k, "operand %d must be a 4-D %s tensor", i + 1,
                                                                    ir_dtype_name(dt));
  a->d = (AttnDims){q->dim[0], q->dim[1], kt->dim[1], q->dim[2], kt->dim[2], q->dim[3], k->n->fa[0],
                    (int)k->n->ia[0]};
  if (a->d.Hkv < 1 || a->d.Hq % a->d.Hkv) return rt_kfail(k, "query heads %lld are not a multiple of kv heads %lld",
                                                          (long long)a->d.Hq, (long long)a->d.Hkv);
  a->qmask = rt_kin_sh(k, 0)->split[2];
  a->kmask = rt_kin_sh(k, 1)->split[2];
  for (int i = 0; i < nin; i++) a->x[i] = rt_attn_f64(k->in[i], dt, ir_type_numel(k->it[i]), &a->own[i]);
  a->qpos = ts_xmalloc((size_t)(a->d.Tq + 1) * sizeof *a->qpos);
  a->kpos = ts_xmalloc((size_t)(a->d.Tk + 1) * sizeof *a->kpos);
  rt_attn_positions(k->env->rank, a->qmask, a->d.Tq, -1, a->qpos);
  rt_attn_positions(k->env->rank, a->kmask, a->d.Tk, -1, a->kpos);
  return 0;
}

static void attn_close(Attn *a) {
  for (int i = 0; i < 5; i++)
    if (a->own[i]) free(a->x[i]);
  free(a->qpos);
  free(a->kpos);
}

/* Runs the online softmax of this rank's queries over the keys: lse
 * [B, Hq, Tq] is returned, and o [B, Hq, Tq, D] is written when not NULL. */
static double *attn_forward(Attn *a, double *o) {
  int64_t rows = a->d.B * a->d.Hq * a->d.Tq;
  double *m = ts_xmalloc((size_t)(rows + 1) * sizeof *m), *l = ts_xcalloc((size_t)rows + 1, sizeof *l);
  for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY;
  if (o) memset(o, 0, (size_t)(rows * a->d.D) * sizeof *o);
  AttnFwdJob j = {a->d, a->x[0], a->x[1], a->x[2], a->qpos, a->kpos, m, l, o};
  rt_attn_fwd_block(&j);
  fwd_finish(rows, a->d.D, m, l, o);
  free(l);
  return m;
}

int ref_ATTENTION(RtKctx *k) {
  Attn a;
  if (attn_open(k, &a, 3)) { attn_close(&a); return -1; }
  int64_t n = ir_type_numel(k->ot);
  double *o = k->ot->dtype == IR_F64 ? k->out : ts_xmalloc((size_t)(n + 1) * sizeof *o);
  double *lse = attn_forward(&a, o);
  if (lse) rt_attn_store(k->out, k->ot->dtype, o, n);
  if (o != k->out) free(o);
  attn_close(&a);
  if (!lse) return -1;
  free(lse);
  return 0;
}

int ref_ATTENTION_BWD(RtKctx *k) {
  Attn a;
  if (attn_open(k, &a, 5)) { attn_close(&a); return -1; }
  const AttnDims *d = &a.d;
  int part = (int)k->n->ia[1];
  if (part < 0 || part > 2) { attn_close(&a); return rt_kfail(k, "part must be 0, 1 or 2"); }
  int64_t rows = d->B * d->Hq * d->Tq, n = ir_type_numel(k->ot);
  double *lse = attn_forward(&a, NULL);
  if (!lse) { attn_close(&a); return -1; }
  /* Drow = rowsum(do * o): the softmax backward's sum, per query row */
  double *drow = ts_xmalloc((size_t)(rows + 1) * sizeof *drow);
  for (int64_t r = 0; r < rows; r++) {
    double s = 0;
    for (int64_t e = 0; e < d->D; e++) s += a.x[4][r * d->D + e] * a.x[3][r * d->D + e];
    drow[r] = s;
  }
  double *res = ts_xcalloc((size_t)n + 1, sizeof *res);
  AttnBwdJob j = {*d, a.x[0], a.x[1], a.x[2], a.x[4], lse, drow, a.qpos, a.kpos, NULL, NULL, NULL};
  rt_attn_bwd_part(&j, part, res);
  rt_attn_store(k->out, k->ot->dtype, res, n);
  free(res);
  free(drow);
  free(lse);
  attn_close(&a);
  return 0;
}
