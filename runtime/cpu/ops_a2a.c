/* ops_a2a.c - the expert-parallel collectives: all_to_all (fixed blocks,
 * used for the routing counts) and all_to_all_v (token dispatch and
 * combine with variable counts).  Layouts: ops.def and docs/ir.md "Token
 * dispatch".
 *
 * all_to_all_v, rev=0 (dispatch), on the rank with coordinate `me` of S:
 *   x      token layout: the rows of expert e (E = S*G experts) in token
 *          order, experts one after another; cnt[e] rows each.
 *   sends  to rank j the rows of experts j*G .. j*G+G-1 (contiguous);
 *   gets   from rank s its rows for my experts, rcnt[s][g] for expert g,
 *          expert-major (the sender's token layout);
 *   result expert layout: for g, source 0's rows for g, then source 1's...
 *          (gmm runs each local expert on consecutive rows).
 * rev=1 is the exact inverse: the same counts read the other way, so the
 * backward of a dispatch is a combine and vice versa.  Rows past the
 * received total are zero in the result. */
#include "kernels.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void *xalloc0(size_t n) { return ts_xcalloc(n ? n : 1, 1); }

/* ---- all_to_all: x cut along dim `split` into S blocks; block j goes to
 * rank j; the received blocks are concatenated along dim `concat`.  Along
 * cp a dim whose cp level is the zigzag (cp_layout.c) is cut and joined as
 * all_gather / shard_slice do: when the result's split dim is a zigzag,
 * block j is chunks j and 2S-1-j of the split dim; when the operand's
 * concat dim is one, the block from rank j lands at those chunks
 * (all-to-all attention: a sequence split by the zigzag becomes whole, in
 * global order, and back). ---- */

/* Whether dim d split by mask is a cp zigzag for this collective along ax;
 * -1 (with a message) where it cannot be handled. */
static int a2a_zigzag(RtKctx *k, IrAxis ax, unsigned mask, int d, int64_t L) {
  if (ax != IR_AXIS_CP || !rt_cp_zigzag(k->env->rank, mask)) return 0;
  if (mask & ((1u << IR_AXIS_EP) | (1u << IR_AXIS_TP)))
    return rt_kfail(k, "dim %d is also split inside cp: the cp zigzag needs cp innermost here", d);
  if (L % 2) return rt_kfail(k, "the cp block of dim %d has odd length %lld: causal load balancing needs 2 chunks per rank", d, (long long)L);
  return 1;
}

/* x's dims as [outer, len, inner] around dim d */
static void dims3(const int64_t *dims, int r, int d, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < d; i++) *outer *= dims[i];
  for (int i = d + 1; i < r; i++) *inner *= dims[i];
}

/* Copies the sub-tensor of t (dims[], rank r, elements of es bytes) with
 * index range [lo, lo+n) along dim d between the whole tensor `full` and
 * the packed block `blk` (to_blk: full -> blk, else blk -> full). */
static void block_copy(const int64_t *dims, int r, int d, int64_t lo, int64_t n, size_t es, char *full, char *blk,
                       int to_blk) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; i++) outer *= dims[i];
  for (int i = d + 1; i < r; i++) inner *= dims[i];
  size_t row = (size_t)(n * inner) * es;
  for (int64_t o = 0; o < outer; o++) {
    char *f = full + ((size_t)(o * dims[d] + lo) * (size_t)inner) * es, *b = blk + (size_t)o * row;
    if (to_blk) memcpy(b, f, row);
    else memcpy(f, b, row);
  }
}

int ref_ALL_TO_ALL(RtKctx *k) {
  IrAxis ax;
  int S;
  RtComm *g;
  if (rt_kaxis(k, &ax, &S, &g)) return -1;
  const IrType *xt = k->it[0];
  IrDtype dt = xt->dtype;
  if (dt != IR_F32 && dt != IR_F64 && dt != IR_I32)
    return rt_kfail(k, "all_to_all needs f32, f64 or i32 operands, got %s", rt_tstr(xt, 0));
  int r = xt->rank, sd = (int)k->n->ia[1], cd = (int)k->n->ia[2];
  if (sd < 0 || sd >= r || cd < 0 || cd >= r) return rt_kfail(k, "split / concat dims out of range for %s", rt_tstr(xt, 0));
  if (xt->dim[sd] % S) return rt_kfail(k, "dim %d of %s is not divisible by %d ranks", sd, rt_tstr(xt, 0), S);
  size_t es = ir_dtype_size(dt), n = (size_t)ir_type_numel(xt), blk = n / (size_t)S;
  if (!g) { memcpy(k->out, k->in[0], n * es); return 0; }
  int64_t L = xt->dim[sd] / S, Lc = xt->dim[cd], o3, i3;
  int zs = a2a_zigzag(k, ax, k->n->sh.split[sd], sd, L), zc = a2a_zigzag(k, ax, rt_kin_sh(k, 0)->split[cd], cd, Lc);
  if (zs < 0 || zc < 0) return -1;
  /* pack the send blocks contiguously (the zigzag's chunks put in
   * coordinate order first); i32 travels as f64 (exact) */
  char *snd = xalloc0(n * es), *rcv = xalloc0(n * es), *ord = NULL;
  const char *x = k->in[0];
  if (zs) {
    ord = xalloc0(n * es);
    dims3(xt->dim, r, sd, &o3, &i3);
    rt_cp_reorder(ord, x, o3, S, L, i3, es, 0);
    x = ord;
  }
  for (int j = 0; j < S; j++)
    block_copy(xt->dim, r, sd, j * L, L, es, (char *)(uintptr_t)x, snd + (size_t)j * blk * es, 1);
  IrDtype wire = dt == IR_I32 ? IR_F64 : dt;
  double *ws = NULL, *wr = NULL;
  if (dt == IR_I32) {
    ws = ts_xcalloc(n ? n : 1, sizeof *ws);
    wr = ts_xcalloc(n ? n : 1, sizeof *wr);
    for (size_t i = 0; i < n; i++) ws[i] = ((const int32_t *)(const void *)snd)[i];
  }
  int rc = rt_comm_all_to_all(g, wire, ws ? (void *)ws : snd, wr ? (void *)wr : rcv, blk, k->err, k->errlen);
  if (rc == 0 && wr)
    for (size_t i = 0; i < n; i++) ((int32_t *)(void *)rcv)[i] = (int32_t)wr[i];
  /* received block j has x's dims with dim sd / S; it lands at j along cd */
  if (rc == 0) {
    int64_t bd[IR_MAX_RANK], od[IR_MAX_RANK];
    for (int i = 0; i < r; i++) bd[i] = od[i] = xt->dim[i];
    bd[sd] /= S;
    od[sd] /= S;
    od[cd] *= S;
    char *y = zc ? xalloc0(n * es) : k->out;   /* zigzag: coordinate order, then global */
    for (int j = 0; j < S; j++)
      block_copy(od, r, cd, j * bd[cd], bd[cd], es, y, rcv + (size_t)j * blk * es, 0);
    if (zc) {
      dims3(od, r, cd, &o3, &i3);
      rt_cp_reorder(k->out, y, o3, S, bd[cd], i3, es, 1);
      free(y);
    }
  }
  free(ord);
  free(ws);
  free(wr);
  free(snd);
  free(rcv);
  return rc;
}

/* ---- all_to_all_v ---- */

int rt_a2a_regroup(const int32_t *rcnt, const int64_t *exp, int S, int G,
                   int (*run)(void *ctx, int64_t em_row, int64_t sm_row, int64_t rows), void *ctx) {
  int64_t at = 0;
  for (int q = 0; q < G; q++)
    for (int s = 0; s < S; s++) {
      int64_t off = 0;
      for (int s2 = 0; s2 < s; s2++) off += exp[s2];
      for (int q2 = 0; q2 < q; q2++) off += rcnt[s * G + q2];
      if (rcnt[s * G + q] && run(ctx, at, off, rcnt[s * G + q]) != 0) return -1;
      at += rcnt[s * G + q];
    }
  return 0;
}

typedef struct { char *em, *sm; size_t rowb; int to_em; } Regroup;

static int regroup_rows(void *cp, int64_t em_row, int64_t sm_row, int64_t rows) {
  const Regroup *c = cp;
  char *e = c->em + (size_t)em_row * c->rowb, *m = c->sm + (size_t)sm_row * c->rowb;
  memcpy(c->to_em ? e : m, c->to_em ? m : e, (size_t)rows * c->rowb);
  return 0;
}

/* em <-> sm (rt_a2a_regroup) on host memory; to_em: sm -> em. */
static void regroup(char *em, char *sm, const int32_t *rcnt, const int64_t *exp, int S, int G, size_t rowb,
                    int to_em) {
  Regroup c = {em, sm, rowb, to_em};
  rt_a2a_regroup(rcnt, exp, S, G, regroup_rows, &c);
}

int ref_ALL_TO_ALL_V(RtKctx *k) {
  IrAxis ax;
  int S;
  RtComm *g;
  if (rt_kaxis(k, &ax, &S, &g)) return -1;
  const IrType *xt = k->it[0], *ct = k->it[1], *rt = k->it[2];
  IrDtype dt = xt->dtype;
  if ((dt != IR_F32 && dt != IR_F64) || k->ot->dtype != dt)
    return rt_kfail(k, "all_to_all_v needs f32 or f64 rows, got %s", rt_tstr(xt, 0));
  if (ct->dtype != IR_I32 || rt->dtype != IR_I32 || ct->rank != 2 || rt->rank != 2 || rt->dim[0] != S ||
      rt->dim[0] * rt->dim[1] != ct->dim[1])
    return rt_kfail(k, "counts %s / %s do not fit %d ranks", rt_tstr(ct, 0), rt_tstr(rt, 1), S);
  int rev = k->n->ia[1] != 0, G = (int)rt->dim[1];
  int64_t D = xt->dim[1], xrows = xt->dim[0], orows = k->ot->dim[0];
  const int32_t *cnt = k->in[1], *rcnt = k->in[2];
  size_t es = ir_dtype_size(dt), rowb = (size_t)D * es;
  /* per-peer row counts: tok[j] what this rank's token layout holds for
   * rank j's experts, exp[s] what its expert layout holds from source s */
  int64_t *tok = ts_xcalloc((size_t)S, sizeof *tok), *exp = ts_xcalloc((size_t)S, sizeof *exp);
  int64_t ttot = 0, etot = 0;
  for (int j = 0; j < S; j++)
    for (int q = 0; q < G; q++) {
      if (cnt[j * G + q] < 0 || rcnt[j * G + q] < 0) { free(tok); free(exp); return rt_kfail(k, "negative count"); }
      tok[j] += cnt[j * G + q];
      exp[j] += rcnt[j * G + q];
    }
  for (int j = 0; j < S; j++) { ttot += tok[j]; etot += exp[j]; }
  int64_t in_need = rev ? etot : ttot, out_need = rev ? ttot : etot;
  if (in_need > xrows || out_need > orows) {
    free(tok);
    free(exp);
    return rt_kfail(k, "%lld rows to send and %lld to receive do not fit the %lld / %lld rows of the buffers "
                    "(the routing counts and the layout disagree)", (long long)in_need, (long long)out_need,
                    (long long)xrows, (long long)orows);
  }
  if (in_need * D > INT_MAX || out_need * D > INT_MAX) {
    free(tok);
    free(exp);
    return rt_kfail(k, "all_to_all_v: %lld rows of %lld elements exceed one MPI call", (long long)in_need, (long long)D);
  }
  char *out = k->out;
  const char *x = k->in[0];
  memset(out + (size_t)out_need * rowb, 0, (size_t)(orows - out_need) * rowb);
  /* the expert layout reordered source-major (what travels): from source s,
   * its rows for my expert q sit at soff[s] + sum_{q' < q} rcnt[s][q'] */
  char *src = xalloc0((size_t)etot * rowb);
  int rc = 0;
  if (rev) regroup((char *)(uintptr_t)x, src, rcnt, exp, S, G, rowb, 0);   /* expert-major -> source-major */
  if (!g) {   /* one rank: the two layouts are the same */
    memcpy(out, rev ? src : x, (size_t)out_need * rowb);
  } else {
    int *tc = ts_xcalloc((size_t)S, sizeof *tc), *td = ts_xcalloc((size_t)S, sizeof *td);
    int *ec = ts_xcalloc((size_t)S, sizeof *ec), *ed = ts_xcalloc((size_t)S, sizeof *ed);
    for (int j = 0, t = 0, e = 0; j < S; j++) {
      tc[j] = (int)(tok[j] * D);
      td[j] = t;
      t += tc[j];
      ec[j] = (int)(exp[j] * D);
      ed[j] = e;
      e += ec[j];
    }
    rc = rev ? rt_comm_all_to_all_v(g, dt, src, ec, ed, out, tc, td, k->err, k->errlen)
             : rt_comm_all_to_all_v(g, dt, x, tc, td, src, ec, ed, k->err, k->errlen);
    free(tc);
    free(td);
    free(ec);
    free(ed);
  }
  if (rc == 0 && !rev && g) regroup(out, src, rcnt, exp, S, G, rowb, 1);   /* source-major -> expert layout */
  free(src);
  free(tok);
  free(exp);
  return rc;
}
/* ---- ring_shift / ring_wait: one step of a ring over an axis, split so
 * that the compute between them overlaps the transfer.  ring_shift copies
 * x into its result and posts that buffer to coordinate + 1 (its only
 * reader is its ring_wait, so the memory plan keeps it alive until then);
 * ring_wait receives the left neighbour's post into its result and waits
 * for this rank's own post.  Every rank runs the same program, so the
 * posts and the waits pair up in order on one tag. ---- */
#define RING_TAG 7701

typedef struct { const IrNode *n; RtCommReq *req; } RingPost;
struct RtRing { RingPost *a; int n, cap; };

void rt_ring_free(RtRing *r) {
  if (!r) return;
  free(r->a);
  free(r);
}

static int ring_args(RtKctx *k, const IrNode *shift, RtComm **g, int *S) {
  IrAxis ax;
  RtKctx kk = *k;
  kk.n = shift;
  if (rt_kaxis(&kk, &ax, S, g)) return -1;
  IrDtype dt = k->ot->dtype;
  if (dt != IR_F32 && dt != IR_F64) return rt_kfail(k, "%s needs f32 or f64, got %s", ir_ops[k->n->op].name, rt_tstr(k->ot, 0));
  return 0;
}

int ref_RING_SHIFT(RtKctx *k) {
  RtComm *g;
  int S;
  if (ring_args(k, k->n, &g, &S)) return -1;
  size_t n = (size_t)ir_type_numel(k->ot);
  memcpy(k->out, k->in[0], n * ir_dtype_size(k->ot->dtype));
  if (!g) return 0;
  RtRing **rp = &k->env->ring;
  if (!*rp) *rp = ts_xcalloc(1, sizeof **rp);
  RtRing *r = *rp;
  for (int i = 0; i < r->n; i++)
    if (r->a[i].n == k->n) return rt_kfail(k, "ring_shift posted twice without its ring_wait");
  RtCommReq *req = NULL;
  int me = rt_comm_rank(g);
  if (rt_comm_isend(g, k->ot->dtype, k->out, n, (me + 1) % S, RING_TAG, &req, k->err, k->errlen)) return -1;
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 8;
    r->a = ts_xrealloc(r->a, (size_t)r->cap * sizeof *r->a);
  }
  r->a[r->n++] = (RingPost){k->n, req};
  return 0;
}

int ref_RING_WAIT(RtKctx *k) {
  const IrNode *shift = &k->b->nodes[k->n->in[0]];
  RtComm *g;
  int S;
  if (shift->op != IR_OP_RING_SHIFT) return rt_kfail(k, "the operand is not a ring_shift");
  if (ring_args(k, shift, &g, &S)) return -1;
  size_t n = (size_t)ir_type_numel(k->ot);
  if (!g) { memcpy(k->out, k->in[0], n * ir_dtype_size(k->ot->dtype)); return 0; }
  RtRing *r = k->env->ring;
  int at = -1;
  for (int i = 0; r && i < r->n; i++)
    if (r->a[i].n == shift) at = i;
  if (at < 0) return rt_kfail(k, "ring_wait without a posted ring_shift");
  int me = rt_comm_rank(g);
  if (rt_comm_recv(g, k->ot->dtype, k->out, n, (me - 1 + S) % S, RING_TAG, k->err, k->errlen)) return -1;
  RtCommReq *req = r->a[at].req;
  r->a[at] = r->a[--r->n];
  return rt_comm_wait_all(&req, 1, k->err, k->errlen);
}
