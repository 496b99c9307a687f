/* grad_ops.c - finite-difference check of every op's derivative.
 *
 * For each case: a tiny f64 module whose "forward" block applies one op to
 * parameters (i32 operands are inputs), loss = sum(op(...) * R) with R
 * another random parameter.  pass_autodiff turns it into "micro"; we run
 * micro once and compare every parameter's accumulated gradient with
 * central differences of the loss computed by a clone of the forward
 * module: max|g - fd| / max(1e-8, max|fd|) <= 1e-6.
 *
 * Every op of ops.def that is not a leaf, an effect, NODIFF or a *_bwd op
 * must have a case (checked first), so a new op cannot land without its
 * derivative being checked.  Structural checks ride along: the forward
 * nodes are kept as they were, the only FULL added is the seed, no
 * backward value is i32, the module verifies and round-trips as text. */
#include "gradcheck.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/exec/rt.h"
#include <stdarg.h>

enum { D_NORMAL, D_POS };   /* parameter data: N(0, 1) or U[0.5, 2) */

typedef struct {
  IrModule *m;
  int b;
  int failed;
  char err[512];
  int npar;
  struct { int state; int dist; } par[16];
  int nfeed;
  RtFeed feeds[4];
  void *feed_data[4];
  uint64_t rng;
} Cx;

typedef struct Case Case;
typedef int (*Build)(Cx *c, const Case *k);
struct Case {
  const char *name;
  IrOp op;              /* the op this case covers */
  Build build;
  int v;                /* variant, read by build */
  const char *expect_err;  /* autodiff must fail with this in its message */
  int nmicro;           /* global_batch / micro_batch (0 = 1) */
  const char *no_grad;  /* a param that must get no grad state */
};

/* ---- building ---- */
static IrType tyv(IrDtype dt, int rank, va_list ap) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++) t.dim[i] = va_arg(ap, int);
  return t;
}
static IrType T(int rank, ...) { va_list ap; va_start(ap, rank); IrType t = tyv(IR_F64, rank, ap); va_end(ap); return t; }
static IrType TI(int rank, ...) { va_list ap; va_start(ap, rank); IrType t = tyv(IR_I32, rank, ap); va_end(ap); return t; }

static int E(Cx *c, IrOp op, int nin, const int *in, const int64_t *ia, const double *fa,
             const char *sa, const IrType *t) {
  if (c->failed) return -1;
  int id = ir_emit(c->m, c->b, op, in, nin, ia, fa, sa, t, c->err, sizeof c->err);
  if (id < 0) c->failed = 1;
  return id;
}
static int E1(Cx *c, IrOp op, int x) { return E(c, op, 1, &x, NULL, NULL, NULL, NULL); }
static int E2(Cx *c, IrOp op, int x, int y) { int in[2] = {x, y}; return E(c, op, 2, in, NULL, NULL, NULL, NULL); }
static int Ea(Cx *c, IrOp op, int x, int64_t a0, int64_t a1, int64_t a2) {
  int64_t ia[3] = {a0, a1, a2};
  return E(c, op, 1, &x, ia, NULL, NULL, NULL);
}
static int Et(Cx *c, IrOp op, int x, IrType t) { return E(c, op, 1, &x, NULL, NULL, NULL, &t); }
static IrType type_of(Cx *c, int v) { return c->m->blocks.a[c->b].nodes[v].type; }

/* A parameter "p<k>" of type t and a STATE read of it. */
static int param(Cx *c, IrType t, int dist) {
  char name[32];
  snprintf(name, sizeof name, "p%d", c->npar);
  IrState s;
  memset(&s, 0, sizeof s);
  s.name = name;
  s.type = t;
  s.kind = IR_STATE_PARAM;
  s.init = IR_INIT_NORMAL;
  s.init_b = 1.0;
  s.of = -1;
  int si = ir_state_add(c->m, &s);
  TS_ASSERT(c->npar < 16);
  c->par[c->npar].state = si;
  c->par[c->npar].dist = dist;
  c->npar++;
  int64_t ia[1] = {si};
  return E(c, IR_OP_STATE, 0, NULL, ia, NULL, NULL, &t);
}
static int reread(Cx *c, int pk) {   /* a second STATE read of param k */
  IrType t = c->m->states.a[c->par[pk].state].type;
  int64_t ia[1] = {c->par[pk].state};
  return E(c, IR_OP_STATE, 0, NULL, ia, NULL, NULL, &t);
}

/* An i32 input with values in [lo, hi); every `every`-th element is
 * `ignore` instead (every = 0: none). */
static int ids(Cx *c, const char *name, IrType t, int lo, int hi, int every, int ignore) {
  TS_ASSERT(c->nfeed < 4);
  int64_t n = ir_type_numel(&t);
  int32_t *d = ts_xmalloc((size_t)n * sizeof *d);
  for (int64_t i = 0; i < n; i++)
    d[i] = (every && i % every == every - 1) ? ignore : lo + (int32_t)(gc_next(&c->rng) % (uint64_t)(hi - lo));
  c->feed_data[c->nfeed] = d;
  c->feeds[c->nfeed].name = name;
  c->feeds[c->nfeed].data = d;
  c->nfeed++;
  return E(c, IR_OP_INPUT, 0, NULL, NULL, NULL, name, &t);
}

/* ---- the cases ---- */
static int b_binary(Cx *c, const Case *k) {
  int x = param(c, T(2, 2, 3), D_NORMAL);
  int y = param(c, T(2, 2, 3), k->op == IR_OP_DIV ? D_POS : D_NORMAL);
  return E2(c, k->op, x, y);
}
static int b_unary(Cx *c, const Case *k) {
  int pos = k->op == IR_OP_LOG || k->op == IR_OP_SQRT || k->op == IR_OP_RSQRT;
  int x = param(c, T(2, 3, 4), pos ? D_POS : D_NORMAL);
  double cst = k->op == IR_OP_ADDS ? 0.7 : -1.3;
  return E(c, k->op, 1, &x, NULL, &cst, NULL, NULL);
}
static int b_cast(Cx *c, const Case *k) { return Et(c, IR_OP_CAST, param(c, T(2, 3, 4), D_NORMAL), T(2, 3, 4)); }
/* i32 -> f64 cast times a param: no gradient may flow into the i32 side */
static int b_cast_i32(Cx *c, const Case *k) {
  int f = Et(c, IR_OP_CAST, ids(c, "ids", TI(2, 3, 4), -3, 4, 0, 0), T(2, 3, 4));
  return E2(c, IR_OP_MUL, f, param(c, T(2, 3, 4), D_NORMAL));
}
static int b_reshape(Cx *c, const Case *k) {
  int x = param(c, T(3, 2, 3, 4), D_NORMAL);
  return Et(c, IR_OP_RESHAPE, x, k->v ? T(3, 4, 3, 2) : T(2, 6, 4));
}
static int b_permute(Cx *c, const Case *k) {
  static const int64_t perms[3][4] = {{2, 0, 1}, {1, 0, 2}, {0, 2, 1, 3}};
  int x = param(c, k->v == 2 ? T(4, 2, 3, 2, 4) : T(3, 2, 3, 4), D_NORMAL);
  return E(c, IR_OP_PERMUTE, 1, &x, perms[k->v], NULL, NULL, NULL);
}
static int b_slice(Cx *c, const Case *k) {
  static const int64_t a[3][3] = {{1, 1, 4}, {2, 0, 2}, {0, 1, 2}};
  return Ea(c, IR_OP_SLICE, param(c, T(3, 2, 5, 3), D_NORMAL), a[k->v][0], a[k->v][1], a[k->v][2]);
}
static int b_pad(Cx *c, const Case *k) {
  static const int64_t a[3][3] = {{1, 1, 2}, {2, 0, 1}, {0, 2, 0}};
  return Ea(c, IR_OP_PAD, param(c, T(3, 2, 3, 3), D_NORMAL), a[k->v][0], a[k->v][1], a[k->v][2]);
}
static int b_concat(Cx *c, const Case *k) {
  int in[3], n;
  int64_t axis;
  if (k->v == 0) {
    in[0] = param(c, T(3, 2, 1, 3), D_NORMAL);
    in[1] = param(c, T(3, 2, 3, 3), D_NORMAL);
    in[2] = param(c, T(3, 2, 2, 3), D_NORMAL);
    n = 3, axis = 1;
  } else if (k->v == 1) {
    in[0] = param(c, T(3, 2, 3, 2), D_NORMAL);
    in[1] = param(c, T(3, 2, 3, 1), D_NORMAL);
    n = 2, axis = 2;
  } else {   /* the same value twice: its two slices' gradients are summed */
    in[0] = in[1] = param(c, T(2, 2, 3), D_NORMAL);
    n = 2, axis = 1;
  }
  return E(c, IR_OP_CONCAT, n, in, &axis, NULL, NULL, NULL);
}
static const int bshape[4][2][4] = {   /* {rank, dims...} from -> to */
  {{1, 3}, {2, 2, 3}}, {{3, 2, 1, 3}, {3, 2, 4, 3}}, {{0}, {2, 2, 3}}, {{2, 4, 1}, {3, 2, 4, 3}}};
static IrType bsh(const int *s) { IrType t = T(0); t.rank = s[0]; for (int i = 0; i < s[0]; i++) t.dim[i] = s[1 + i]; return t; }
static int b_broadcast(Cx *c, const Case *k) {
  return Et(c, IR_OP_BROADCAST, param(c, bsh(bshape[k->v][0]), D_NORMAL), bsh(bshape[k->v][1]));
}
static int b_sum_to(Cx *c, const Case *k) {
  return Et(c, IR_OP_SUM_TO, param(c, bsh(bshape[k->v][1]), D_NORMAL), bsh(bshape[k->v][0]));
}
/* v = axis * 2 + keepdim */
static int b_reduce(Cx *c, const Case *k) {
  int64_t ia[2] = {k->v / 2, k->v % 2};
  int x = param(c, T(3, 2, 3, 4), D_NORMAL);
  return E(c, k->op, 1, &x, ia, NULL, NULL, NULL);
}
static int b_sumsq(Cx *c, const Case *k) { return E1(c, IR_OP_SUMSQ, param(c, T(2, 3, 4), D_NORMAL)); }
/* v: bit 0 ta, bit 1 tb, v >> 2 the shape kind: 0 2-D, 1 batched 3-D,
 * 2 batched 4-D, 3 3-D lhs with 2-D rhs, 4 4-D lhs with 2-D rhs. */
static int b_matmul(Cx *c, const Case *k) {
  int ta = k->v & 1, tb = (k->v >> 1) & 1, kind = k->v >> 2;
  const int M = 3, K = 4, N = 5;
  IrType a = T(0), b = T(0);
  int nbatch = kind == 0 ? 0 : kind == 1 || kind == 3 ? 1 : 2;
  for (int i = 0; i < nbatch; i++) a.dim[a.rank++] = 2 + i;
  if (kind == 1 || kind == 2) b = a;
  a.dim[a.rank++] = ta ? K : M; a.dim[a.rank++] = ta ? M : K;
  b.dim[b.rank++] = tb ? N : K; b.dim[b.rank++] = tb ? K : N;
  int in[2] = {param(c, a, D_NORMAL), param(c, b, D_NORMAL)};
  int64_t ia[2] = {ta, tb};
  return E(c, IR_OP_MATMUL, 2, in, ia, NULL, NULL, NULL);
}
static int b_lastaxis(Cx *c, const Case *k) {
  int x = param(c, k->v ? T(3, 2, 2, 6) : T(2, 3, 5), D_NORMAL);
  double eps = 1e-5;
  return E(c, k->op, 1, &x, NULL, &eps, NULL, NULL);
}
static int b_embedding(Cx *c, const Case *k) {
  int table = param(c, T(2, 6, 4), D_NORMAL);
  int id = ids(c, "ids", TI(2, 2, 5), 0, 6, 0, 0);   /* 10 ids over 6 rows: repeats */
  return E2(c, IR_OP_EMBEDDING, table, id);
}
static int b_causal(Cx *c, const Case *k) {
  double fill = k->v ? -1e4 : 0.7;
  int x = param(c, k->v ? T(2, 4, 4) : T(3, 2, 4, 4), D_NORMAL);
  int y = E(c, IR_OP_CAUSAL_MASK, 1, &x, NULL, &fill, NULL, NULL);
  return k->v ? E1(c, IR_OP_SOFTMAX, y) : y;   /* as attention uses it */
}
static int b_masked(Cx *c, const Case *k) {
  int x = param(c, T(2, 3, 4), D_NORMAL);
  IrType ft = T(2, 3, 4);
  double zero = 0.0, fill = -2.5;
  int keep = E(c, IR_OP_NE_SCALAR, 1, (int[]){ids(c, "keep", TI(2, 3, 4), 0, 2, 0, 0)}, NULL, &zero, NULL, &ft);
  int in[2] = {x, keep};
  return E(c, IR_OP_MASKED_FILL, 2, in, NULL, &fill, NULL, NULL);
}
/* where(c, x, y): v = 0 both branches parameters (each gets dy where its
 * side is picked), v = 1 the same parameter on both sides (the two shares
 * sum to dy), v = 2 the condition from a cmp of two parameters (no
 * gradient through it) */
static int b_where(Cx *c, const Case *k) {
  IrType ft = T(2, 3, 4);
  int x = param(c, ft, D_NORMAL), y = k->v == 1 ? x : param(c, ft, D_NORMAL), cond;
  if (k->v == 2) {
    int64_t lt = 2;
    cond = E(c, IR_OP_CMP, 2, (int[]){x, param(c, ft, D_NORMAL)}, &lt, NULL, NULL, NULL);
  } else {
    cond = ids(c, "cond", TI(2, 3, 4), 0, 2, 0, 0);
  }
  return E(c, IR_OP_WHERE, 3, (int[]){cond, x, y}, NULL, NULL, NULL, NULL);
}
/* gather along axis v of x [3, 4, 5] with idx of that rank (repeats: the
 * scatter-add sums them) */
static int b_gather(Cx *c, const Case *k) {
  int x = param(c, T(3, 3, 4, 5), D_NORMAL);
  IrType it = TI(3, 3, 4, 5);
  it.dim[k->v] = 6;
  int64_t ax = k->v;
  int idx = ids(c, "idx", it, 0, (int)T(3, 3, 4, 5).dim[k->v], 0, 0);
  return E(c, IR_OP_GATHER, 2, (int[]){x, idx}, &ax, NULL, NULL, NULL);
}
static int b_dropout(Cx *c, const Case *k) {
  int x = param(c, T(2, 4, 8), D_NORMAL);
  int64_t stream = 3;
  double p = 0.3;
  return E(c, IR_OP_DROPOUT, 1, &x, &stream, &p, NULL, NULL);
}
static int b_rope(Cx *c, const Case *k) {
  int x = param(c, k->v == 2 ? T(2, 5, 4) : T(4, 2, 4, 2, 6), D_NORMAL);
  int64_t ia[2] = {k->v == 2 ? 0 : 1, k->v == 1};
  double base = k->v == 2 ? 100.0 : 10000.0;
  return E(c, IR_OP_ROPE, 1, &x, ia, &base, NULL, NULL);
}
/* Fused attention: q [2, Hq, Tq, Dh], k / v [2, Hkv, Tk, Dh].  v = 0:
 * causal, 2 heads, 5 positions; v = 1: grouped-query (4 query heads over 2
 * kv heads), not causal, 3 queries against 4 keys; v = 2: causal GQA;
 * v = 3: causal, 70 positions (two key tiles of the online softmax, so the
 * rescaling between tiles is differentiated too; the backward takes the 70
 * keys as one tile); v = 4: not causal, 3 queries against 530 keys, head
 * size 1 (more keys than the backward takes as one tile, ATTN_TK_ROW: its
 * log-sum-exp pass first).  With document ids (a fourth operand, i32
 * [2, Tk], drawn from {0, 1, 2} at random, so a document's positions need
 * not be contiguous): v = 5 as v = 3, v = 6 as v = 4.  A sliding window:
 * v = 7 as v = 3 with window 9 (rows see their last 9 positions, so whole
 * tiles fall out), v = 8 as v = 4 with documents and window 200 (keys on
 * both sides, not causal).  ALiBi (alibi=1 and a slopes operand, an f64
 * arange 0.3, 0.55, ... per query head: a constant, no gradient): v = 9 as
 * v = 3 (causal, two key tiles), v = 10 as v = 1 (grouped-query, 3 queries
 * against 4 keys), v = 11 as v = 8 (documents and a window too), v = 12 as
 * v = 4 (530 keys: the log-sum-exp pass with the bias).  An additive score
 * bias (bias=1, a param, so dbias = attention_bwd part 3 is checked too):
 * v = 13 as v = 3 ([Hq, Tq, Tk], causal, two key tiles), v = 14 as v = 1
 * ([1, Tq, Tk]: one for every head, grouped-query, 3 queries against 4
 * keys), v = 15 as v = 11 (ALiBi, documents and a window too), v = 16 as
 * v = 4 (530 keys: the log-sum-exp pass). */
static int b_attention(Cx *c, const Case *k) {
  static const int alibi_of[4] = {3, 1, 8, 4};   /* v = 9 .. 12: the case they add ALiBi to */
  static const int bias_of[4] = {3, 1, 11, 4};   /* v = 13 .. 16: the case they add a score bias to */
  int bi = k->v >= 13, v0 = bi ? bias_of[k->v - 13] : k->v;
  int al = v0 >= 9, kv = al ? alibi_of[v0 - 9] : v0;
  int w = kv >= 7 ? kv - 4 : kv >= 5 ? kv - 2 : kv;   /* the shape of case w */
  int Hq = w == 0 || w >= 3 ? 2 : 4, Hkv = 2, Tq = w == 1 || w == 4 ? 3 : w == 3 ? 70 : 5;
  int Tk = w == 1 ? 4 : w == 4 ? 530 : Tq, Dh = w == 3 ? 2 : w == 4 ? 1 : 3;
  int q = param(c, T(4, 2, Hq, Tq, Dh), D_NORMAL);
  int kk = param(c, T(4, 2, Hkv, Tk, Dh), D_NORMAL);
  int v = param(c, T(4, 2, Hkv, Tk, Dh), D_NORMAL);
  int64_t ia[4] = {w != 1 && w != 4, kv == 7 ? 9 : kv == 8 ? 200 : 0, al, bi};   /* causal, window, alibi, bias */
  double scale = 0.7;
  int doc = kv == 5 || kv == 6 || kv == 8 ? ids(c, "document_ids", TI(2, 2, Tk), 0, 3, 0, 0) : -1;
  int in[6] = {q, kk, v}, nin = 3;
  if (al) {
    int64_t ax = 0;
    double ar[2] = {0.3, 0.25};
    IrType st = T(1, Hq);
    in[nin++] = E(c, IR_OP_ARANGE, 0, NULL, &ax, ar, NULL, &st);
  }
  if (bi) in[nin++] = param(c, T(3, k->v == 14 ? 1 : Hq, Tq, Tk), D_NORMAL);
  if (doc >= 0) in[nin++] = doc;
  return E(c, IR_OP_ATTENTION, nin, in, ia, &scale, NULL, NULL);
}
/* v = 0: ignore_index -1 on every 4th target; v = 1: ignore_index 2, a
 * class that also occurs naturally. */
static int b_cross_entropy(Cx *c, const Case *k) {
  int logits = param(c, T(3, 2, 3, 5), D_NORMAL);
  int ignore = k->v ? 2 : -1;
  int tg = ids(c, "targets", TI(2, 2, 3), 0, 5, k->v ? 0 : 4, ignore);
  int in[2] = {logits, tg};
  int64_t ia[1] = {ignore};
  return E(c, IR_OP_CROSS_ENTROPY, 2, in, ia, NULL, NULL, NULL);
}
static int b_clip(Cx *c, const Case *k) {
  double mx = 1.0;
  int norm = E1(c, IR_OP_SQRT, E1(c, IR_OP_SUMSQ, param(c, T(1, 3), D_NORMAL)));
  return E(c, IR_OP_CLIP_COEF, 1, &norm, NULL, &mx, NULL, NULL);
}
static int b_second(Cx *c, const Case *k) {
  int y = E1(c, IR_OP_SOFTMAX, param(c, T(2, 2, 3), D_NORMAL));
  return E2(c, IR_OP_SOFTMAX_BWD, y, param(c, T(2, 2, 3), D_NORMAL));
}
/* x used three times and read through two STATE nodes: x*x + x' */
static int b_reuse(Cx *c, const Case *k) {
  int x = param(c, T(2, 3, 4), D_NORMAL);
  return E2(c, IR_OP_ADD, E2(c, IR_OP_MUL, x, x), reread(c, 0));
}
/* p1 reaches the loss only through eq (NODIFF): it gets no grad state */
static int b_nodiff(Cx *c, const Case *k) {
  int x = param(c, T(2, 3, 4), D_NORMAL), q = param(c, T(2, 3, 4), D_NORMAL);
  return E2(c, IR_OP_MUL, x, E2(c, IR_OP_EQ, q, q));
}

/* ---- sparse mixture of experts ----
 * A fixed routing of N = 5 tokens over E = 4 experts (a 0/1 f64 input, not
 * a parameter): token 2 goes to three experts, tokens 0 two, expert 1 gets
 * no token; 8 routed pairs in MOE_ROWS = 10 rows, so the last 2 rows of
 * every token / expert layout are spare zeros.  The counts come from a
 * moe_counts node.  The loss is piecewise bilinear in the routed values,
 * which stay fixed, so central differences are exact up to rounding. */
enum { MOE_N = 5, MOE_E = 4, MOE_ROWS = 10 };
static int moe_routed(Cx *c) {
  static const double r[MOE_N][MOE_E] = {{1, 0, 1, 0}, {0, 0, 1, 0}, {1, 0, 1, 1}, {0, 0, 0, 1}, {1, 0, 0, 0}};
  TS_ASSERT(c->nfeed < 4);
  double *d = ts_xmalloc(sizeof r);
  memcpy(d, r, sizeof r);
  c->feed_data[c->nfeed] = d;
  c->feeds[c->nfeed].name = "routed";
  c->feeds[c->nfeed].data = d;
  c->nfeed++;
  IrType t = T(2, MOE_N, MOE_E);
  return E(c, IR_OP_INPUT, 0, NULL, NULL, NULL, "routed", &t);
}
static int E3(Cx *c, IrOp op, int x, int y, int z, int64_t a0) {
  int in[3] = {x, y, z};
  return E(c, op, 3, in, &a0, NULL, NULL, NULL);
}
/* v = 0: moe_perm(x[5, 3], r, s; rows=10); v = 1: the scale is r itself (as
 * stdlib's moe dispatches), only x gets a gradient. */
static int b_moe_perm(Cx *c, const Case *k) {
  int r = moe_routed(c), x = param(c, T(2, MOE_N, 3), D_NORMAL);
  int s = k->v ? r : param(c, T(2, MOE_N, MOE_E), D_NORMAL);
  return E3(c, IR_OP_MOE_PERM, x, r, s, MOE_ROWS);
}
static int b_moe_unperm(Cx *c, const Case *k) {
  int r = moe_routed(c);
  return E3(c, IR_OP_MOE_UNPERM, param(c, T(2, MOE_ROWS, 3), D_NORMAL), r, param(c, T(2, MOE_N, MOE_E), D_NORMAL), 0);
}
static int b_moe_gate_grad(Cx *c, const Case *k) {
  int r = moe_routed(c);
  return E3(c, IR_OP_MOE_GATE_GRAD, param(c, T(2, MOE_ROWS, 3), D_NORMAL), param(c, T(2, MOE_N, 3), D_NORMAL), r, 0);
}
/* gmm(a[10, 3], w[4, 3, 2] (v = 1: tb, [4, 2, 3]), moe_counts(r)) */
static int b_gmm(Cx *c, const Case *k) {
  int cnt = E1(c, IR_OP_MOE_COUNTS, moe_routed(c));
  int a = param(c, T(2, MOE_ROWS, 3), D_NORMAL);
  int w = param(c, k->v ? T(3, MOE_E, 2, 3) : T(3, MOE_E, 3, 2), D_NORMAL);
  return E3(c, IR_OP_GMM, a, w, cnt, k->v);
}
static int b_gmm_dw(Cx *c, const Case *k) {
  int cnt = E1(c, IR_OP_MOE_COUNTS, moe_routed(c));
  return E3(c, IR_OP_GMM_DW, param(c, T(2, MOE_ROWS, 3), D_NORMAL), param(c, T(2, MOE_ROWS, 2), D_NORMAL), cnt, 0);
}
/* The sparse expert layer as stdlib's moe builds it:
 * moe_unperm(gmm(moe_perm(x, r, r), w, cnt), r, g) */
static int b_moe_layer(Cx *c, const Case *k) {
  int r = moe_routed(c), cnt = E1(c, IR_OP_MOE_COUNTS, r);
  int xs = E3(c, IR_OP_MOE_PERM, param(c, T(2, MOE_N, 3), D_NORMAL), r, r, MOE_ROWS);
  int h = E3(c, IR_OP_GMM, xs, param(c, T(3, MOE_E, 3, 2), D_NORMAL), cnt, 0);
  return E3(c, IR_OP_MOE_UNPERM, h, r, param(c, T(2, MOE_N, MOE_E), D_NORMAL), 0);
}

#define MM(v) {"matmul", IR_OP_MATMUL, b_matmul, v, NULL, 0, NULL}
static const Case cases[] = {
  {"add", IR_OP_ADD, b_binary, 0, NULL, 0, NULL},
  {"sub", IR_OP_SUB, b_binary, 0, NULL, 0, NULL},
  {"mul", IR_OP_MUL, b_binary, 0, NULL, 0, NULL},
  {"div", IR_OP_DIV, b_binary, 0, NULL, 0, NULL},
  {"adds", IR_OP_ADDS, b_unary, 0, NULL, 0, NULL},
  {"muls", IR_OP_MULS, b_unary, 0, NULL, 0, NULL},
  {"neg", IR_OP_NEG, b_unary, 0, NULL, 0, NULL},
  {"exp", IR_OP_EXP, b_unary, 0, NULL, 0, NULL},
  {"log", IR_OP_LOG, b_unary, 0, NULL, 0, NULL},
  {"sqrt", IR_OP_SQRT, b_unary, 0, NULL, 0, NULL},
  {"rsqrt", IR_OP_RSQRT, b_unary, 0, NULL, 0, NULL},
  {"tanh", IR_OP_TANH, b_unary, 0, NULL, 0, NULL},
  {"gelu_tanh", IR_OP_GELU_TANH, b_unary, 0, NULL, 0, NULL},
  {"gelu_erf", IR_OP_GELU_ERF, b_unary, 0, NULL, 0, NULL},
  {"silu", IR_OP_SILU, b_unary, 0, NULL, 0, NULL},
  {"relu", IR_OP_RELU, b_unary, 0, NULL, 0, NULL},
  {"cast", IR_OP_CAST, b_cast, 0, NULL, 0, NULL},
  {"cast i32", IR_OP_CAST, b_cast_i32, 0, NULL, 0, NULL},
  {"reshape", IR_OP_RESHAPE, b_reshape, 0, NULL, 0, NULL},
  {"reshape", IR_OP_RESHAPE, b_reshape, 1, NULL, 0, NULL},
  {"permute", IR_OP_PERMUTE, b_permute, 0, NULL, 0, NULL},
  {"permute", IR_OP_PERMUTE, b_permute, 1, NULL, 0, NULL},
  {"permute", IR_OP_PERMUTE, b_permute, 2, NULL, 0, NULL},
  {"slice", IR_OP_SLICE, b_slice, 0, NULL, 0, NULL},
  {"slice", IR_OP_SLICE, b_slice, 1, NULL, 0, NULL},
  {"slice", IR_OP_SLICE, b_slice, 2, NULL, 0, NULL},
  {"pad", IR_OP_PAD, b_pad, 0, NULL, 0, NULL},
  {"pad", IR_OP_PAD, b_pad, 1, NULL, 0, NULL},
  {"pad", IR_OP_PAD, b_pad, 2, NULL, 0, NULL},
  {"concat", IR_OP_CONCAT, b_concat, 0, NULL, 0, NULL},
  {"concat", IR_OP_CONCAT, b_concat, 1, NULL, 0, NULL},
  {"concat", IR_OP_CONCAT, b_concat, 2, NULL, 0, NULL},
  {"broadcast", IR_OP_BROADCAST, b_broadcast, 0, NULL, 0, NULL},
  {"broadcast", IR_OP_BROADCAST, b_broadcast, 1, NULL, 0, NULL},
  {"broadcast", IR_OP_BROADCAST, b_broadcast, 2, NULL, 0, NULL},
  {"broadcast", IR_OP_BROADCAST, b_broadcast, 3, NULL, 0, NULL},
  {"sum_to", IR_OP_SUM_TO, b_sum_to, 0, NULL, 0, NULL},
  {"sum_to", IR_OP_SUM_TO, b_sum_to, 1, NULL, 0, NULL},
  {"sum_to", IR_OP_SUM_TO, b_sum_to, 2, NULL, 0, NULL},
  {"sum_to", IR_OP_SUM_TO, b_sum_to, 3, NULL, 0, NULL},
  {"sum", IR_OP_SUM, b_reduce, 0, NULL, 0, NULL}, {"sum", IR_OP_SUM, b_reduce, 1, NULL, 0, NULL},
  {"sum", IR_OP_SUM, b_reduce, 2, NULL, 0, NULL}, {"sum", IR_OP_SUM, b_reduce, 3, NULL, 0, NULL},
  {"sum", IR_OP_SUM, b_reduce, 4, NULL, 0, NULL}, {"sum", IR_OP_SUM, b_reduce, 5, NULL, 0, NULL},
  {"mean", IR_OP_MEAN, b_reduce, 0, NULL, 0, NULL}, {"mean", IR_OP_MEAN, b_reduce, 1, NULL, 0, NULL},
  {"mean", IR_OP_MEAN, b_reduce, 2, NULL, 0, NULL}, {"mean", IR_OP_MEAN, b_reduce, 3, NULL, 0, NULL},
  {"mean", IR_OP_MEAN, b_reduce, 4, NULL, 0, NULL}, {"mean", IR_OP_MEAN, b_reduce, 5, NULL, 0, NULL},
  {"max", IR_OP_MAX, b_reduce, 0, NULL, 0, NULL}, {"max", IR_OP_MAX, b_reduce, 1, NULL, 0, NULL},
  {"max", IR_OP_MAX, b_reduce, 2, NULL, 0, NULL}, {"max", IR_OP_MAX, b_reduce, 3, NULL, 0, NULL},
  {"max", IR_OP_MAX, b_reduce, 4, NULL, 0, NULL}, {"max", IR_OP_MAX, b_reduce, 5, NULL, 0, NULL},
  {"sumsq", IR_OP_SUMSQ, b_sumsq, 0, NULL, 0, NULL},
  MM(0), MM(1), MM(2), MM(3), MM(4), MM(5), MM(6), MM(7), MM(8), MM(9), MM(10), MM(11),
  MM(12), MM(13), MM(14), MM(15), MM(16), MM(17), MM(18), MM(19),
  {"softmax", IR_OP_SOFTMAX, b_lastaxis, 0, NULL, 0, NULL},
  {"softmax", IR_OP_SOFTMAX, b_lastaxis, 1, NULL, 0, NULL},
  {"log_softmax", IR_OP_LOG_SOFTMAX, b_lastaxis, 0, NULL, 0, NULL},
  {"layernorm", IR_OP_LAYERNORM, b_lastaxis, 0, NULL, 0, NULL},
  {"layernorm", IR_OP_LAYERNORM, b_lastaxis, 1, NULL, 0, NULL},
  {"rmsnorm", IR_OP_RMSNORM, b_lastaxis, 0, NULL, 0, NULL},
  {"rmsnorm", IR_OP_RMSNORM, b_lastaxis, 1, NULL, 0, NULL},
  {"embedding", IR_OP_EMBEDDING, b_embedding, 0, NULL, 0, NULL},
  {"causal_mask", IR_OP_CAUSAL_MASK, b_causal, 0, NULL, 0, NULL},
  {"causal_mask+softmax", IR_OP_CAUSAL_MASK, b_causal, 1, NULL, 0, NULL},
  {"masked_fill", IR_OP_MASKED_FILL, b_masked, 0, NULL, 0, NULL},
  {"where", IR_OP_WHERE, b_where, 0, NULL, 0, NULL},
  {"where same x and y", IR_OP_WHERE, b_where, 1, NULL, 0, NULL},
  {"where of cmp", IR_OP_WHERE, b_where, 2, NULL, 0, NULL},
  {"gather axis 0", IR_OP_GATHER, b_gather, 0, NULL, 0, NULL},
  {"gather axis 1", IR_OP_GATHER, b_gather, 1, NULL, 0, NULL},
  {"gather axis 2", IR_OP_GATHER, b_gather, 2, NULL, 0, NULL},
  {"dropout", IR_OP_DROPOUT, b_dropout, 0, NULL, 0, NULL},
  {"dropout step 5 micro 1", IR_OP_DROPOUT, b_dropout, 1, NULL, 0, NULL},
  {"rope", IR_OP_ROPE, b_rope, 0, NULL, 0, NULL},
  {"attention causal", IR_OP_ATTENTION, b_attention, 0, NULL, 0, NULL},
  {"attention gqa", IR_OP_ATTENTION, b_attention, 1, NULL, 0, NULL},
  {"attention gqa causal", IR_OP_ATTENTION, b_attention, 2, NULL, 0, NULL},
  {"attention 2 tiles", IR_OP_ATTENTION, b_attention, 3, NULL, 0, NULL},
  {"attention 9 key tiles", IR_OP_ATTENTION, b_attention, 4, NULL, 0, NULL},
  {"attention documents causal", IR_OP_ATTENTION, b_attention, 5, NULL, 0, NULL},
  {"attention documents 9 key tiles", IR_OP_ATTENTION, b_attention, 6, NULL, 0, NULL},
  {"attention window causal", IR_OP_ATTENTION, b_attention, 7, NULL, 0, NULL},
  {"attention window documents", IR_OP_ATTENTION, b_attention, 8, NULL, 0, NULL},
  {"attention alibi causal 2 tiles", IR_OP_ATTENTION, b_attention, 9, NULL, 0, NULL},
  {"attention alibi gqa 3x4", IR_OP_ATTENTION, b_attention, 10, NULL, 0, NULL},
  {"attention alibi window documents", IR_OP_ATTENTION, b_attention, 11, NULL, 0, NULL},
  {"attention alibi 9 key tiles", IR_OP_ATTENTION, b_attention, 12, NULL, 0, NULL},
  {"attention score bias causal 2 tiles", IR_OP_ATTENTION, b_attention, 13, NULL, 0, NULL},
  {"attention score bias 1 head gqa 3x4", IR_OP_ATTENTION, b_attention, 14, NULL, 0, NULL},
  {"attention score bias alibi window documents", IR_OP_ATTENTION, b_attention, 15, NULL, 0, NULL},
  {"attention score bias 9 key tiles", IR_OP_ATTENTION, b_attention, 16, NULL, 0, NULL},
  {"rope inverse", IR_OP_ROPE, b_rope, 1, NULL, 0, NULL},
  {"rope 2-D", IR_OP_ROPE, b_rope, 2, NULL, 0, NULL},
  {"cross_entropy", IR_OP_CROSS_ENTROPY, b_cross_entropy, 0, NULL, 0, NULL},
  {"cross_entropy ignore=2", IR_OP_CROSS_ENTROPY, b_cross_entropy, 1, NULL, 0, NULL},
  {"moe_perm", IR_OP_MOE_PERM, b_moe_perm, 0, NULL, 0, NULL},
  {"moe_perm scale=routed", IR_OP_MOE_PERM, b_moe_perm, 1, NULL, 0, NULL},
  {"moe_unperm", IR_OP_MOE_UNPERM, b_moe_unperm, 0, NULL, 0, NULL},
  {"moe_gate_grad", IR_OP_MOE_GATE_GRAD, b_moe_gate_grad, 0, NULL, 0, NULL},
  {"gmm", IR_OP_GMM, b_gmm, 0, NULL, 0, NULL},
  {"gmm tb", IR_OP_GMM, b_gmm, 1, NULL, 0, NULL},
  {"gmm_dw", IR_OP_GMM_DW, b_gmm_dw, 0, NULL, 0, NULL},
  {"moe layer", IR_OP_MOE_PERM, b_moe_layer, 0, NULL, 0, NULL},
  {"clip_coef", IR_OP_CLIP_COEF, b_clip, 0, "clip_coef", 0, NULL},
  {"softmax_bwd in forward", IR_OP_SOFTMAX_BWD, b_second, 0, "second derivative not supported", 0, NULL},
  {"reuse", IR_OP_ADD, b_reuse, 0, NULL, 0, NULL},
  {"reuse, n_micro=4", IR_OP_ADD, b_reuse, 0, NULL, 4, NULL},
  {"nodiff", IR_OP_EQ, b_nodiff, 0, NULL, 0, "p1"},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- running a case ---- */
static void cx_free(Cx *c) {
  for (int i = 0; i < c->nfeed; i++) free(c->feed_data[i]);
}

/* Appends loss = sum(y * R) (R a fresh random param) and `output "loss"`. */
static void add_loss(Cx *c, int y) {
  IrType yt = type_of(c, y);
  int prod = E2(c, IR_OP_MUL, y, param(c, yt, D_NORMAL));
  int s = prod;
  if (yt.rank > 0) {
    int flat = Et(c, IR_OP_RESHAPE, prod, T(1, (int)ir_type_numel(&yt)));
    int64_t ia[2] = {0, 0};
    s = E(c, IR_OP_SUM, 1, &flat, ia, NULL, NULL, NULL);
  }
  E(c, IR_OP_OUTPUT, 1, &s, NULL, NULL, "loss", NULL);
}

/* The micro block must start with the forward nodes unchanged, add one
 * FULL (the seed 1/n_micro), and no i32 value.  0 if so. */
static int check_structure(const IrModule *fwd, const IrModule *m, int nmicro, char *why, size_t n) {
  if (ir_block_find(m, "forward") >= 0) { snprintf(why, n, "block forward still there"); return -1; }
  int mb = ir_block_find(m, "micro");
  if (mb < 0) { snprintf(why, n, "no block micro"); return -1; }
  const IrBlock *f = &fwd->blocks.a[0], *b = &m->blocks.a[mb];
  if (b->n < f->n) { snprintf(why, n, "micro is shorter than forward"); return -1; }
  for (int i = 0; i < f->n; i++)
    if (b->nodes[i].op != f->nodes[i].op || !ir_type_equal(&b->nodes[i].type, &f->nodes[i].type)) {
      snprintf(why, n, "forward node %%%d changed", i);
      return -1;
    }
  int fulls = 0;
  for (int i = f->n; i < b->n; i++) {
    if (b->nodes[i].type.dtype == IR_I32) { snprintf(why, n, "backward node %%%d is i32", i); return -1; }
    if (b->nodes[i].op == IR_OP_FULL) {
      fulls++;
      if (b->nodes[i].fa[0] != 1.0 / nmicro) { snprintf(why, n, "seed %%%d is %g, not 1/%d", i, b->nodes[i].fa[0], nmicro); return -1; }
    }
  }
  if (fulls != 1) { snprintf(why, n, "%d FULL nodes in the backward graph, expected just the seed", fulls); return -1; }
  char err[512];
  if (ir_verify(m, err, sizeof err) != 0) { snprintf(why, n, "verify after autodiff: %s", err); return -1; }
  StrBuf a = {0}, a2 = {0};
  ir_print_module(m, &a);
  sb_putc(&a, 0);
  IrModule *re = ir_parse_module(a.p, "<autodiff>", err, sizeof err);
  int rc = 0;
  if (!re) { snprintf(why, n, "printed micro does not parse: %s", err); rc = -1; }
  else {
    ir_print_module(re, &a2);
    sb_putc(&a2, 0);
    if (strcmp(a.p, a2.p) != 0) { snprintf(why, n, "print/parse/print differs"); rc = -1; }
    ir_module_free(re);
  }
  sb_free(&a);
  sb_free(&a2);
  return rc;
}

/* Fills every param with its data, identically in both programs. */
static void fill_params(Cx *c, RtProgram *pm, RtProgram *pf) {
  for (int k = 0; k < c->npar; k++) {
    int s = c->par[k].state;
    int64_t n = ir_type_numel(&c->m->states.a[s].type);
    double *a = rt_state_data(pm, s), *b = rt_state_data(pf, s);
    for (int64_t i = 0; i < n; i++)
      a[i] = c->par[k].dist == D_POS ? 0.5 + 1.5 * gc_u01(&c->rng) : gc_normal(&c->rng);
    memcpy(b, a, (size_t)n * sizeof *a);
  }
}

/* Returns 0 when the case passes; prints one line either way. */
static int run_case(const Case *k) {
  Cx c;
  memset(&c, 0, sizeof c);
  c.rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(k - cases + 1) * 0x100000001B3ULL;
  c.m = ir_module_new("gradcheck");
  c.m->train.precision = IR_F64;
  int nmicro = k->nmicro ? k->nmicro : 1;
  c.m->train.micro_batch = 1;
  c.m->train.global_batch = nmicro;
  c.b = ir_block_add(c.m, "forward");
  add_loss(&c, k->build(&c, k));
  int rc = 1;
  char why[2200] = "";
  IrModule *fwd = NULL;
  RtProgram *pm = NULL, *pf = NULL;
  PassCtx cx;
  memset(&cx, 0, sizeof cx);
  arena_init(&cx.scratch);
  if (c.failed) { snprintf(why, sizeof why, "building the case: %s", c.err); goto done; }
  if (ir_verify(c.m, why, sizeof why) != 0) goto done;
  fwd = ir_module_clone(c.m);

  if (pass_autodiff(c.m, &cx) != 0) {
    if (k->expect_err && strstr(cx.err, k->expect_err)) {
      /* a failed pass must leave the module as it was */
      if (c.m->blocks.n == 1 && ir_block_find(c.m, "forward") == 0 && c.m->states.n == fwd->states.n) rc = 0;
      else snprintf(why, sizeof why, "failed autodiff changed the module");
    } else {
      snprintf(why, sizeof why, "autodiff: %s", cx.err);
    }
    goto done;
  }
  if (k->expect_err) { snprintf(why, sizeof why, "autodiff succeeded, expected \"%s\"", k->expect_err); goto done; }
  if (check_structure(fwd, c.m, nmicro, why, sizeof why) != 0) goto done;

  char err[512];
  pm = rt_program_new(c.m, err, sizeof err);
  pf = rt_program_new(fwd, err, sizeof err);
  if (!pm || !pf) { snprintf(why, sizeof why, "rt_program_new: %s", err); goto done; }
  fill_params(&c, pm, pf);
  /* variant 1 of dropout runs as a later step and micro-batch: its mask
   * differs from step 0's, and autodiff's dropout must still match it */
  RtRunInfo info = {0, 0, 0.0, 0};
  if (k->op == IR_OP_DROPOUT && k->v) info.step = 5, info.micro = 1;
  double lm = gc_loss(pm, ir_block_find(c.m, "micro"), &info, c.feeds, c.nfeed);
  double lf = gc_loss(pf, 0, &info, c.feeds, c.nfeed);
  if (!(fabs(lm - lf) <= 1e-12 * (1 + fabs(lf)))) {
    snprintf(why, sizeof why, "micro's loss %.17g differs from forward's %.17g", lm, lf);
    goto done;
  }
  double worst = 0;
  for (int p = 0; p < c.npar; p++) {
    const IrState *ps = &c.m->states.a[c.par[p].state];
    char gname[64];
    snprintf(gname, sizeof gname, "grad.%s", ps->name);
    int gs = ir_state_find(c.m, gname);
    if (k->no_grad && strcmp(ps->name, k->no_grad) == 0 && gs >= 0) {
      snprintf(why, sizeof why, "@%s got a grad state", ps->name);
      goto done;
    }
    if (gs >= 0 && (c.m->states.a[gs].kind != IR_STATE_GRAD || c.m->states.a[gs].of != c.par[p].state ||
                    !ir_type_equal(&c.m->states.a[gs].type, &ps->type))) {
      snprintf(why, sizeof why, "@%s is not a proper grad state", gname);
      goto done;
    }
    int64_t n = ir_type_numel(&ps->type);
    double *g = NULL;
    if (gs >= 0) {   /* the seed is 1/n_micro: scale back to d loss */
      g = ts_xmalloc((size_t)n * sizeof *g);
      const double *gd = rt_state_data(pm, gs);
      for (int64_t i = 0; i < n; i++) g[i] = gd[i] * nmicro;
    }
    if (k->op == IR_OP_DROPOUT && p == 0) {   /* a real mask: about p of the gradient is 0 */
      int zeros = 0;
      for (int64_t i = 0; i < n; i++) zeros += g && g[i] == 0.0;
      if (zeros < n / 10 || zeros > n / 2) {
        free(g);
        snprintf(why, sizeof why, "dropout p=0.3 zeroed %d of %lld gradient elements", zeros, (long long)n);
        goto done;
      }
    }
    double max_fd;
    double e = gc_check(pf, 0, &info, c.feeds, c.nfeed, rt_state_data(pf, c.par[p].state), g, n, NULL, 0, 1e-8, &max_fd);
    free(g);
    if (!(e <= GC_TOL)) {
      snprintf(why, sizeof why, "@%s: relative error %.3g (max |fd| %.3g)", ps->name, e, max_fd);
      goto done;
    }
    if (e > worst) worst = e;
  }
  snprintf(why, sizeof why, "max rel err %.2g", worst);
  rc = 0;
done:
  printf("%-4s %-24s v%-2d %s\n", rc ? "FAIL" : "ok", k->name, k->v, why);
  rt_program_free(pm);
  rt_program_free(pf);
  ir_module_free(fwd);
  ir_module_free(c.m);
  arena_free(&cx.scratch);
  cx_free(&c);
  return rc;
}

/* Every op a gradient can pass through needs a case. */
static int check_coverage(void) {
  int missing = 0;
  for (int op = 0; op < IR_OP_COUNT; op++) {
    unsigned fl = ir_ops[op].flags;
    size_t len = strlen(ir_ops[op].name);
    if (fl & (OPF_LEAF | OPF_EFFECT | OPF_NODIFF | OPF_LATE)) continue;
    if (len > 4 && strcmp(ir_ops[op].name + len - 4, "_bwd") == 0) continue;
    int have = 0;
    for (int i = 0; i < NCASES; i++) have |= cases[i].op == (IrOp)op;
    if (!have) { printf("FAIL op %s has no gradient check case\n", ir_ops[op].name); missing++; }
  }
  return missing;
}

/* Modules autodiff must refuse, each with a message naming the problem,
 * leaving the module unchanged. */
static int check_errors(void) {
  static const struct { const char *what, *expect; } errs[] = {
    {"no forward block", "no block \"forward\""},
    {"no loss output", "no `output \"loss\"`"},
    {"loss reported twice", "twice"},
    {"global_batch 3, micro_batch 2", "not a positive multiple"},
  };
  int fails = 0;
  for (int e = 0; e < 4; e++) {
    Cx c;
    memset(&c, 0, sizeof c);
    c.m = ir_module_new("errors");
    c.m->train.precision = IR_F64;
    c.b = ir_block_add(c.m, e == 0 ? "main" : "forward");
    int x = E1(&c, IR_OP_SUMSQ, param(&c, T(1, 3), D_NORMAL));
    if (e != 1) E(&c, IR_OP_OUTPUT, 1, &x, NULL, NULL, "loss", NULL);
    if (e == 2) E(&c, IR_OP_OUTPUT, 1, &x, NULL, NULL, "loss", NULL);
    if (e == 3) c.m->train.global_batch = 3, c.m->train.micro_batch = 2;
    PassCtx cx;
    memset(&cx, 0, sizeof cx);
    arena_init(&cx.scratch);
    int nb = c.m->blocks.n, ns = c.m->states.n;
    int rc = pass_autodiff(c.m, &cx);
    int ok = rc != 0 && strstr(cx.err, errs[e].expect) && c.m->blocks.n == nb && c.m->states.n == ns;
    printf("%-4s error: %-30s %s\n", ok ? "ok" : "FAIL", errs[e].what, rc ? cx.err : "(accepted)");
    fails += !ok;
    arena_free(&cx.scratch);
    ir_module_free(c.m);
  }
  return fails;
}

int main(int argc, char **argv) {
  int fails = check_coverage() + check_errors();
  for (int i = 0; i < NCASES; i++)
    if (argc < 2 || strstr(cases[i].name, argv[1])) fails += run_case(&cases[i]);
  printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
  return fails ? 1 : 0;
}
