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
 * runtime/cp_layout.c -- or over tp under sequence parallelism), so the
 * kernel works on any block of the sequence.
 *
 * Ring (ia[1] = 1, context parallelism, docs/sharding.md): k and v hold
 * this rank's cp block.  The forward passes the (k, v) blocks around the
 * cp group: at step s the rank computes its queries against the block of
 * coordinate c - s while it sends that block on to c + 1 (a nonblocking
 * send, posted before the compute) and then receives the next one from
 * c - 1.  The backward first rings (k, v) once to get each query's lse;
 * dq then rings (k, v) again, while dk / dv keep the keys at home and ring
 * the query side (q, do, lse, D = rowsum(do * o)) instead, so each rank
 * ends with the gradient of its own key block without sending gradient
 * accumulators around.
 *
 * All arithmetic is in double (f32 operands are widened once), and ring
 * messages are f64; the extra bytes are the price of one code path.
 * Threads: rt_par_for over (batch, query head) for the forward and dq, over
 * (batch, kv head) for dk / dv (a kv head's gradient sums over its query
 * heads, so one thread owns it): no result depends on the thread count. */
#include "rt_priv.h"
#include "comm.h"
#include "par.h"
#include <cblas.h>
#include <math.h>

#define ATTN_TILE 64          /* query rows and key rows per tile */
#define ATTN_RING_TAG 7700    /* tag of the ring messages on the cp group */

typedef struct {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  double scale;
  int causal;
} AttnDims;

/* ---- operands ---- */

/* A [n] buffer of dtype dt as doubles: the operand itself when f64 (*own
 * = 0), else a widened copy (*own = 1: free it). */
static double *as_f64(const void *x, IrDtype dt, int64_t n, int *own) {
  if (dt == IR_F64) { *own = 0; return (double *)x; }
  double *y = ts_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *y);
  for (int64_t i = 0; i < n; i++) y[i] = ((const float *)x)[i];
  *own = 1;
  return y;
}

static void store(void *out, IrDtype dt, const double *y, int64_t n) {
  if (dt == IR_F64) { if (out != (void *)y) memcpy(out, y, (size_t)n * sizeof *y); return; }
  for (int64_t i = 0; i < n; i++) ((float *)out)[i] = (float)y[i];
}

/* Global positions of the L local indices of a dim split by `mask`, as
 * rt_global_index gives them, except that the cp coordinate is `cp` (the
 * owner of a block passed around the ring) when cp >= 0. */
static void positions(const RtProgram *p, unsigned mask, int64_t L, int cp, int64_t *pos) {
  for (int64_t j = 0; j < L; j++) pos[j] = rt_global_index_at(p, mask, L, j, cp);
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

/* ---- the forward: online softmax over one block of keys ----
 * q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D]; per query row the running max m
 * and sum l ([B, Hq, Tq]) and acc [B, Hq, Tq, D] (unnormalised output;
 * NULL: lse only).  m starts at -inf, l and acc at 0. */
typedef struct {
  AttnDims d;
  const double *q, *k, *v;
  const int64_t *qpos, *kpos;
  double *m, *l, *acc;
} FwdJob;

static void fwd_rows(void *jp, int64_t lo, int64_t hi) {
  const FwdJob *j = jp;
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

static void fwd_block(FwdJob *j) { rt_par_for(j->d.B * j->d.Hq, 1, fwd_rows, j); }

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

/* ---- the backward over one (query block, key block) pair ----
 * p = exp(scale q.k - lse), dp = do.v, ds = p (dp - Drow):
 *   dq += scale ds k,   dk += scale ds q,   dv += p do.
 * part 0 (dq [B, Hq, Tq, D]) runs over (b, query head); parts 1 and 2
 * (dk / dv [B, Hkv, Tk, D]; `dk` or `dv` may be NULL) over (b, kv head). */
typedef struct {
  AttnDims d;
  const double *q, *k, *v, *dout, *lse, *drow;
  const int64_t *qpos, *kpos;
  double *dq, *dk, *dv;
} BwdJob;

/* For one (b, h) and tile pair: p into s and, unless dp is NULL (dv needs
 * p only), ds into dp (both [nq, nk]); returns 0 when the whole tile is
 * masked.  Q, G (do) are the head's [Tq, D] rows, K, V the kv head's
 * [Tk, D], lse / drow the head's rows. */
static int tile_grads(const BwdJob *j, const Tile *t, const double *Q, const double *G, const double *K,
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
  const BwdJob *j = jp;
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
  const BwdJob *j = jp;
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

/* ---- the ring over the cp group ----
 * Calls step(ctx, buf, owner) S times, buf holding the [n] block of the
 * group rank `owner` (this rank's own first), sending each block on to the
 * next rank while the step computes on it.  buf is the caller's (holding
 * its own block); a second buffer is allocated here.  0 or -1 + message. */
typedef void (*RingStep)(void *ctx, const double *buf, int owner);

static int ring_run(RtComm *g, double *buf, int64_t n, RingStep step, void *ctx, char *err, size_t errlen) {
  int S = g ? rt_comm_size(g) : 1, me = g ? rt_comm_rank(g) : 0;
  if (S == 1) { step(ctx, buf, me); return 0; }
  double *cur = buf, *nxt = ts_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *nxt);
  int rc = 0;
  for (int s = 0; s < S && !rc; s++) {
    RtCommReq *req = NULL;
    /* post the send of the current block before computing on it: the
     * transfer overlaps the compute (the last block goes nowhere) */
    if (s < S - 1 && rt_comm_isend(g, IR_F64, cur, (size_t)n, (me + 1) % S, ATTN_RING_TAG, &req, err, errlen))
      rc = -1;
    if (!rc) step(ctx, cur, ((me - s) % S + S) % S);
    if (!rc && s < S - 1 && rt_comm_recv(g, IR_F64, nxt, (size_t)n, (me - 1 + S) % S, ATTN_RING_TAG, err, errlen))
      rc = -1;
    if (req && rt_comm_wait_all(&req, 1, err, errlen)) rc = -1;
    double *t = cur; cur = nxt; nxt = t;
  }
  free(cur == buf ? nxt : cur);
  return rc;
}

/* ---- the kernels ---- */

/* Everything one call needs: dims, doubles of the operands, positions. */
typedef struct {
  RtKctx *k;
  AttnDims d;
  int ring;                      /* k / v are cp blocks passed around the group */
  RtComm *g;                     /* the cp group when ring */
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
  a->ring = (int)k->n->ia[1];
  a->qmask = rt_kin_sh(k, 0)->split[2];
  a->kmask = rt_kin_sh(k, 1)->split[2];
  if (a->ring) {
    a->g = rt_program_group(k->p, IR_AXIS_CP);
    if (!(a->kmask & (1u << IR_AXIS_CP)) && rt_program_axis_size(k->p, IR_AXIS_CP) > 1)
      return rt_kfail(k, "ring=1 but k is not split over cp along its seq dim");
  }
  for (int i = 0; i < nin; i++) a->x[i] = as_f64(k->in[i], dt, ir_type_numel(k->it[i]), &a->own[i]);
  a->qpos = ts_xmalloc((size_t)(a->d.Tq + 1) * sizeof *a->qpos);
  a->kpos = ts_xmalloc((size_t)(a->d.Tk + 1) * sizeof *a->kpos);
  positions(k->p, a->qmask, a->d.Tq, -1, a->qpos);
  positions(k->p, a->kmask, a->d.Tk, -1, a->kpos);
  return 0;
}

static void attn_close(Attn *a) {
  for (int i = 0; i < 5; i++)
    if (a->own[i]) free(a->x[i]);
  free(a->qpos);
  free(a->kpos);
}

/* The (k, v) ring's step: the forward job on the block of `owner`. */
typedef struct { Attn *a; FwdJob *j; } KvStep;
static void kv_fwd_step(void *cp, const double *buf, int owner) {
  KvStep *s = cp;
  int64_t nk = s->a->d.B * s->a->d.Hkv * s->a->d.Tk * s->a->d.D;
  s->j->k = buf;
  s->j->v = buf + nk;
  positions(s->a->k->p, s->a->kmask, s->a->d.Tk, owner, s->a->kpos);
  fwd_block(s->j);
}

/* (k, v) packed [2, B, Hkv, Tk, D] for the ring. */
static double *pack_kv(const Attn *a) {
  int64_t nk = a->d.B * a->d.Hkv * a->d.Tk * a->d.D;
  double *buf = ts_xmalloc((size_t)(2 * nk + 1) * sizeof *buf);
  memcpy(buf, a->x[1], (size_t)nk * sizeof *buf);
  memcpy(buf + nk, a->x[2], (size_t)nk * sizeof *buf);
  return buf;
}

/* Runs the online softmax of this rank's queries over every key block
 * (the local k / v, or all blocks of the ring): lse [B, Hq, Tq] is
 * returned, and o [B, Hq, Tq, D] is written when not NULL. */
static double *attn_forward(Attn *a, double *o) {
  int64_t rows = a->d.B * a->d.Hq * a->d.Tq;
  double *m = ts_xmalloc((size_t)(rows + 1) * sizeof *m), *l = ts_xcalloc((size_t)rows + 1, sizeof *l);
  for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY;
  if (o) memset(o, 0, (size_t)(rows * a->d.D) * sizeof *o);
  FwdJob j = {a->d, a->x[0], a->x[1], a->x[2], a->qpos, a->kpos, m, l, o};
  int rc = 0;
  if (a->ring) {
    double *buf = pack_kv(a);
    KvStep s = {a, &j};
    rc = ring_run(a->g, buf, 2 * a->d.B * a->d.Hkv * a->d.Tk * a->d.D, kv_fwd_step, &s, a->k->err, a->k->errlen);
    free(buf);
    positions(a->k->p, a->kmask, a->d.Tk, -1, a->kpos);   /* back to the rank's own block */
  } else {
    fwd_block(&j);
  }
  if (rc) { free(m); free(l); return NULL; }
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
  if (lse) store(k->out, k->ot->dtype, o, n);
  if (o != k->out) free(o);
  attn_close(&a);
  if (!lse) return -1;
  free(lse);
  return 0;
}

/* The dq ring's step: (k, v) of `owner` against the local queries. */
typedef struct { Attn *a; BwdJob *j; } BwdStep;
static void kv_bwd_q_step(void *cp, const double *buf, int owner) {
  BwdStep *s = cp;
  int64_t nk = s->a->d.B * s->a->d.Hkv * s->a->d.Tk * s->a->d.D;
  s->j->k = buf;
  s->j->v = buf + nk;
  positions(s->a->k->p, s->a->kmask, s->a->d.Tk, owner, s->a->kpos);
  rt_par_for(s->a->d.B * s->a->d.Hq, 1, bwd_q_rows, s->j);
}

/* The dk / dv ring's step: the query side of `owner`, packed as q, do
 * ([B, Hq, Tq, D] each), lse, drow ([B, Hq, Tq] each), against the local
 * keys.  Every rank's query block has the same local shape. */
static void q_bwd_kv_step(void *cp, const double *buf, int owner) {
  BwdStep *s = cp;
  const AttnDims *d = &s->a->d;
  int64_t nq = d->B * d->Hq * d->Tq * d->D, rows = d->B * d->Hq * d->Tq;
  s->j->q = buf;
  s->j->dout = buf + nq;
  s->j->lse = buf + 2 * nq;
  s->j->drow = buf + 2 * nq + rows;
  positions(s->a->k->p, s->a->qmask, d->Tq, owner, s->a->qpos);
  rt_par_for(d->B * d->Hkv, 1, bwd_kv_rows, s->j);
}

int ref_ATTENTION_BWD(RtKctx *k) {
  Attn a;
  if (attn_open(k, &a, 5)) { attn_close(&a); return -1; }
  const AttnDims *d = &a.d;
  int part = (int)k->n->ia[2];
  if (part < 0 || part > 2) { attn_close(&a); return rt_kfail(k, "part must be 0, 1 or 2"); }
  int64_t rows = d->B * d->Hq * d->Tq, nq = rows * d->D, n = ir_type_numel(k->ot);
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
  BwdJob j = {*d, a.x[0], a.x[1], a.x[2], a.x[4], lse, drow, a.qpos, a.kpos, NULL, NULL, NULL};
  int rc = 0;
  if (part == 0) {
    j.dq = res;
    if (a.ring) {
      double *buf = pack_kv(&a);
      BwdStep s = {&a, &j};
      rc = ring_run(a.g, buf, 2 * d->B * d->Hkv * d->Tk * d->D, kv_bwd_q_step, &s, k->err, k->errlen);
      free(buf);
    } else {
      rt_par_for(d->B * d->Hq, 1, bwd_q_rows, &j);
    }
  } else {
    if (part == 1) j.dk = res; else j.dv = res;
    if (a.ring) {
      double *buf = ts_xmalloc((size_t)(2 * nq + 2 * rows + 1) * sizeof *buf);
      memcpy(buf, a.x[0], (size_t)nq * sizeof *buf);
      memcpy(buf + nq, a.x[4], (size_t)nq * sizeof *buf);
      memcpy(buf + 2 * nq, lse, (size_t)rows * sizeof *buf);
      memcpy(buf + 2 * nq + rows, drow, (size_t)rows * sizeof *buf);
      BwdStep s = {&a, &j};
      rc = ring_run(a.g, buf, 2 * nq + 2 * rows, q_bwd_kv_step, &s, k->err, k->errlen);
      free(buf);
    } else {
      rt_par_for(d->B * d->Hkv, 1, bwd_kv_rows, &j);
    }
  }
  if (!rc) store(k->out, k->ot->dtype, res, n);
  free(res);
  free(drow);
  free(lse);
  attn_close(&a);
  return rc;
}
