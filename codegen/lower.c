/* lower.c - tensor-IR nodes -> kernel IR (cg_lower_group, see cg.h).
 *
 * One engine lowers single ops and fused groups alike.  A group's values
 * share one element shape, viewed as [rows, D] with D the last dim:
 *   - flat mode (only elementwise ops): one iteration per element, the
 *     parallel space is the flat index and vectorizes directly;
 *   - row mode (any row op or last-axis reduction): one iteration per row.
 *     Each row op first computes its per-row statistics (max, sums, mean,
 *     rstd) in loops over the row, at row level, in node order; then one
 *     final loop over the row stores every output element and feeds the
 *     reductions.
 * elem() gives the value of a group node at the current element position,
 * recursively: an operand from outside the group is a load, an elementwise
 * node applies its formula to its operands' elements, a row op combines its
 * operand's element with its statistics.  So a producer chain is recomputed
 * inside every loop that needs it (rematerialization: cheaper than a
 * round trip through memory for the memory-bound ops fused here); within
 * one loop each value is computed once (memo, reset when a loop ends).
 *
 * Numerics follow runtime/cpu/ops_ref_t.h: arithmetic and accumulation in f64,
 * each node's value rounded to its dtype (so fusing does not change
 * results), the same formulas in the same order where it matters.  That is
 * the compute type `ct`; a caller may ask for f32 arithmetic instead
 * (CgLowerOpts.f32, the CUDA path outside its exact mode): then a group
 * whose values and operands are all f32 or 16-bit computes and accumulates
 * in f32 (expf, not exp), while a group with an f64, integer or f16 value
 * and the one-node whole reductions (sumsq, sum_to, sums along an axis:
 * long, memory-bound sums whose f64 adds cost nothing) keep f64.  Dropout's
 * uniform draw and its comparison with p stay f64 in either case, so the
 * masks are the reference's bit for bit. */
#include "cg.h"
#include <math.h>

#define GELU_K 0.7978845608028654   /* sqrt(2 / pi), as the reference */
#define GELU_A 0.044715

typedef struct { int v[5]; } RowStats;   /* per-row values of a row op */

typedef struct {
  CgKernel *k;
  const IrModule *m;
  const IrBlock *b;
  const int *nodes;
  int n;
  CgGroupIO *io;
  IrType shape;          /* the element shape */
  int rowmode;
  int64_t D, rows, numel;
  int gid;
  CgType ct;             /* the compute type: CG_F64, or CG_F32 (see the top) */
  int row, col, flat;    /* current position (values; -1 = not built yet) */
  int rowbase;           /* row mode: row * D, built once per iteration */
  int needs_col;         /* some node depends on the column (bias, mask) */
  int gen;               /* memo generation: bumped when a loop ends */
  int *memo, *memogen;   /* per group position */
  int inmemo[CG_MAX_BUFS], inmemogen[CG_MAX_BUFS];
  RowStats *st;          /* per group position (row ops, cross-entropy) */
  int *outbuf;           /* per group position: output buffer or -1 */
  const CgUsers *users;  /* the block's readers, or NULL (scan for them) */
  char *err;
  size_t errlen;
} Lw;

/* CSR of readers: value v is read by rd[off[v] .. off[v + 1]) (ascending;
 * a node reading v twice appears twice) */
struct CgUsers {
  int n;
  int *off, *rd;
};

CgUsers *cg_users_build(const IrBlock *b) {
  CgUsers *u = ts_xcalloc(1, sizeof *u);
  u->n = b->n;
  u->off = ts_xcalloc((size_t)b->n + 2, sizeof *u->off);
  for (int i = 0; i < b->n; i++)
    for (int j = 0; j < b->nodes[i].nin; j++)
      if (b->nodes[i].in[j] >= 0 && b->nodes[i].in[j] < b->n) u->off[b->nodes[i].in[j] + 2]++;
  for (int v = 0; v < b->n; v++) u->off[v + 2] += u->off[v + 1];
  u->rd = ts_xmalloc((size_t)(u->off[b->n + 1] + 1) * sizeof *u->rd);
  for (int i = 0; i < b->n; i++)   /* off[v + 1] is v's fill cursor, ending at v + 1's start */
    for (int j = 0; j < b->nodes[i].nin; j++)
      if (b->nodes[i].in[j] >= 0 && b->nodes[i].in[j] < b->n) u->rd[u->off[b->nodes[i].in[j] + 1]++] = i;
  return u;
}

void cg_users_free(CgUsers *u) {
  if (!u) return;
  free(u->off);
  free(u->rd);
  free(u);
}

static int gpos(const Lw *L, int id) {
  for (int i = 0; i < L->n; i++)
    if (L->nodes[i] == id) return i;
  return -1;
}
static const IrNode *node(const Lw *L, int id) { return &L->b->nodes[id]; }
static int in_buf(const Lw *L, int id) {
  for (int i = 0; i < L->io->nin; i++)
    if (L->io->in[i] == id) return i;
  return -1;
}

static int is_ew_like(IrOp op) {
  return (ir_ops[op].flags & OPF_EW) || op == IR_OP_FULL || op == IR_OP_ARANGE || op == IR_OP_BROADCAST ||
         op == IR_OP_CAUSAL_MASK || op == IR_OP_MASKED_FILL || op == IR_OP_DROPOUT || op == IR_OP_RAND;
}
static int is_row_op(IrOp op) {
  switch (op) {
  case IR_OP_SOFTMAX: case IR_OP_SOFTMAX_BWD: case IR_OP_LOG_SOFTMAX: case IR_OP_LOG_SOFTMAX_BWD:
  case IR_OP_LAYERNORM: case IR_OP_LAYERNORM_BWD: case IR_OP_RMSNORM: case IR_OP_RMSNORM_BWD:
  case IR_OP_CROSS_ENTROPY: case IR_OP_CROSS_ENTROPY_BWD: return 1;
  default: return 0;
  }
}
/* layout ops read one value (concat: several) from outside the group at a
 * remapped index, like broadcast */
static int is_layout(IrOp op) {
  return op == IR_OP_RESHAPE || op == IR_OP_PERMUTE || op == IR_OP_SLICE || op == IR_OP_PAD || op == IR_OP_CONCAT;
}
static int is_reduce(IrOp op) { return op == IR_OP_SUM || op == IR_OP_MEAN || op == IR_OP_MAX; }
/* one value per row rather than per element */
static int is_per_row(IrOp op) { return is_reduce(op) || op == IR_OP_CROSS_ENTROPY; }

/* ---- small emit helpers (all in the compute type unless named otherwise) ---- */
static int F(Lw *L, double v) { return cg_const_f(L->k, L->ct, v); }
static int I(Lw *L, int64_t v) { return cg_const_i(L->k, CG_I64, v); }
static int add(Lw *L, int a, int b) { return cg_bin(L->k, CG_ADD, a, b); }
static int sub(Lw *L, int a, int b) { return cg_bin(L->k, CG_SUB, a, b); }
static int mul(Lw *L, int a, int b) { return cg_bin(L->k, CG_MUL, a, b); }
static int dvd(Lw *L, int a, int b) { return cg_bin(L->k, CG_DIV, a, b); }
static int un(Lw *L, CgOp op, int a) { return cg_un(L->k, op, a); }
static int sel(Lw *L, int c, int a, int b) { return cg_select(L->k, c, a, b); }
static int sigmoid(Lw *L, int x) { return dvd(L, F(L, 1), add(L, F(L, 1), un(L, CG_EXP, un(L, CG_NEG, x)))); }
/* u = K (x + A x^3), the argument of gelu_tanh's tanh */
static int gelu_u(Lw *L, int x) {
  int x3 = mul(L, mul(L, mul(L, F(L, GELU_A), x), x), x);
  return mul(L, F(L, GELU_K), add(L, x, x3));
}
/* exp(d) for d = x - max(row) <= 0, as the softmax family uses it.  A
 * masked entry gives d = -inf; exp underflows to exactly 0 below -745.
 * Vector exp (libmvec) takes a slow scalar path for such lanes, and a
 * causal mask makes half the lanes -inf, so those are answered by a
 * select and exp only sees d >= -700 (where it is a normal number).
 * NaN stays NaN (it fails the d < -700 test and reaches exp). */
static int exp_shifted(Lw *L, int d) {
  int lo = cg_bin(L->k, CG_LT, d, F(L, -700));
  return sel(L, lo, F(L, 0), un(L, CG_EXP, sel(L, lo, F(L, -700), d)));
}
/* value v (compute type) rounded to dtype dt and back, as storing it would */
static int round_to(Lw *L, IrDtype dt, int v) {
  CgType t = cg_type_of_dtype(dt);
  return t == L->ct ? v : cg_cast(L->k, L->ct, cg_cast(L->k, t, v));
}
static int load_c(Lw *L, int buf, int idx) { return cg_cast(L->k, L->ct, cg_load(L->k, buf, idx)); }

/* ---- dropout's random numbers (runtime/cpu/rng.c, bit for bit) ----
 * mix(z): splitmix64's finalizer; H(w1..wn) = fold of mix(h ^ w) from
 * 0x6a09e667f3bcc909; U(h) = (h >> 11) * 2^-53.  All i64, wrapping. */
static int xr(Lw *L, int a, int b) { return cg_bin(L->k, CG_XOR, a, b); }
static int shr(Lw *L, int a, int n) { return cg_bin(L->k, CG_SHR, a, I(L, n)); }
static int mix64(Lw *L, int z) {
  z = add(L, z, I(L, (int64_t)0x9e3779b97f4a7c15ull));
  z = mul(L, xr(L, z, shr(L, z, 30)), I(L, (int64_t)0xbf58476d1ce4e5b9ull));
  z = mul(L, xr(L, z, shr(L, z, 27)), I(L, (int64_t)0x94d049bb133111ebull));
  return xr(L, z, shr(L, z, 31));
}
/* The uniform draw of dropout node nd at flat index g (an i64 value):
 * U(H(2, seed, stream, step, micro, g)), the words of rt_dropout_u; seed,
 * step and micro are the launch's run-time scalars (kir.h PARAM). */
static int dropout_u(Lw *L, const IrNode *nd, int g) {
  int w[6] = {I(L, 2), cg_param(L->k, CG_PARAM_SEED), I(L, nd->ia[0]), cg_param(L->k, CG_PARAM_STEP),
              cg_param(L->k, CG_PARAM_MICRO), g};
  int h = I(L, (int64_t)0x6a09e667f3bcc909ull);
  for (int j = 0; j < 6; j++) h = mix64(L, xr(L, h, w[j]));
  return mul(L, cg_cast(L->k, CG_F64, shr(L, h, 11)), cg_const_f(L->k, CG_F64, 0x1p-53));
}

/* ---- positions ---- */
static int pos_flat(Lw *L) {
  if (L->flat < 0) L->flat = add(L, L->rowbase, L->col);
  return L->flat;
}
static int pos_col(Lw *L) {
  if (L->col < 0) L->col = cg_bin(L->k, CG_MOD, L->flat, I(L, L->D));
  return L->col;
}
static int pos_row(Lw *L) {
  if (L->row < 0) L->row = cg_bin(L->k, CG_DIV, L->flat, I(L, L->D));
  return L->row;
}
static void forget(Lw *L) { L->gen++; }

/* A loop over the row (row mode); its body sees the position (gid, i). */
static int loop_begin(Lw *L) {
  int r = cg_range(L->k, I(L, L->D));
  forget(L);
  L->col = r;
  L->flat = -1;
  return r;
}
static void loop_end(Lw *L) {
  cg_end(L->k);
  forget(L);
  L->col = L->flat = -1;
}

/* Index into a broadcast source src for the current element of dst
 * (right-aligned numpy broadcasting, as ref_BROADCAST). */
static int bcast_index(Lw *L, const IrType *src, const IrType *dst) {
  int off = dst->rank - src->rank;
  int64_t sn = ir_type_numel(src);
  /* common case, a bias: src without its leading 1s is dst's trailing dims */
  int f = 0, trailing = 1;
  while (f < src->rank && src->dim[f] == 1) f++;
  for (int d = f; d < src->rank; d++)
    if (src->dim[d] != dst->dim[d + off]) trailing = 0;
  if (trailing) {
    if (L->rowmode && L->D % (sn ? sn : 1) == 0)
      return sn == L->D ? pos_col(L) : cg_bin(L->k, CG_MOD, pos_col(L), I(L, sn));
    return cg_bin(L->k, CG_MOD, pos_flat(L), I(L, sn ? sn : 1));
  }
  /* general: sum over kept dims of coordinate * stride in src */
  int idx = I(L, 0);
  int64_t sstride = 1, dstride = 1;
  int64_t ds[IR_MAX_RANK], ss[IR_MAX_RANK];
  for (int d = dst->rank - 1; d >= 0; d--) {
    ds[d] = dstride;
    dstride *= dst->dim[d];
    int sd = d - off;
    ss[d] = (sd >= 0 && src->dim[sd] != 1) ? sstride : 0;
    if (sd >= 0) sstride *= src->dim[sd];
  }
  for (int d = 0; d < dst->rank; d++) {
    if (!ss[d]) continue;
    int c = cg_bin(L->k, CG_MOD, cg_bin(L->k, CG_DIV, pos_flat(L), I(L, ds[d])), I(L, dst->dim[d]));
    idx = add(L, idx, mul(L, c, I(L, ss[d])));
  }
  return idx;
}

static int elem(Lw *L, int id);

/* t viewed as [outer, len, inner] around axis ax */
static void split3(const IrType *t, int ax, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < ax; d++) *outer *= t->dim[d];
  for (int d = ax + 1; d < t->rank; d++) *inner *= t->dim[d];
  *len = t->dim[ax];
}
static int axis_of(int64_t a, int rank) { return (int)(a < 0 ? a + rank : a); }

/* The current element of node nd (a layout op reading value `src` from
 * outside the group) as a load from src's buffer at a remapped index.
 * With the result viewed as [outer, yl, inner] around the op's axis:
 * o = flat / (yl inner), l = flat / inner % yl, j = flat % inner. */
static int view_load(Lw *L, const IrNode *nd, int src, int64_t at, int64_t xl) {
  const IrType *yt = &nd->type;
  int ax = axis_of(nd->ia[0], yt->rank);
  int64_t outer, yl, inner;
  split3(yt, ax, &outer, &yl, &inner);
  int f = pos_flat(L);
  int o = cg_bin(L->k, CG_DIV, f, I(L, yl * inner));
  int l = cg_bin(L->k, CG_MOD, cg_bin(L->k, CG_DIV, f, I(L, inner)), I(L, yl));
  int j = cg_bin(L->k, CG_MOD, f, I(L, inner));
  /* source row l - at, valid when 0 <= l - at < xl; index 0 otherwise */
  int sl = cg_bin(L->k, CG_SUB, l, I(L, at));
  int ok = cg_bin(L->k, CG_AND, cg_bin(L->k, CG_LE, I(L, 0), sl), cg_bin(L->k, CG_LT, sl, I(L, xl)));
  int idx = add(L, add(L, mul(L, o, I(L, xl * inner)), mul(L, sl, I(L, inner))), j);
  idx = sel(L, ok, idx, I(L, 0));
  int v = load_c(L, in_buf(L, src), idx);
  return sel(L, ok, v, F(L, 0));
}

static int elem_layout(Lw *L, const IrNode *nd) {
  const IrType *yt = &nd->type;
  switch (nd->op) {
  case IR_OP_RESHAPE: return load_c(L, in_buf(L, nd->in[0]), pos_flat(L));
  case IR_OP_PERMUTE: {   /* result dim d is operand dim perm[d] */
    const IrType *xt = &node(L, nd->in[0])->type;
    int64_t xs[IR_MAX_RANK], s = 1, ys = 1;
    for (int d = xt->rank - 1; d >= 0; d--) { xs[d] = s; s *= xt->dim[d]; }
    int idx = I(L, 0);
    for (int d = yt->rank - 1; d >= 0; d--) {
      int c = cg_bin(L->k, CG_DIV, pos_flat(L), I(L, ys));
      if (d > 0) c = cg_bin(L->k, CG_MOD, c, I(L, yt->dim[d]));
      idx = add(L, idx, mul(L, c, I(L, xs[nd->ia[d]])));
      ys *= yt->dim[d];
    }
    return load_c(L, in_buf(L, nd->in[0]), idx);
  }
  case IR_OP_SLICE: {     /* x[..., start:end, ...]: result row l is x's row l + start */
    const IrType *xt = &node(L, nd->in[0])->type;
    int ax = axis_of(nd->ia[0], yt->rank);
    /* x viewed around the axis, shifted so that result row l reads x row l + start */
    int64_t outer, xl, inner;
    split3(xt, ax, &outer, &xl, &inner);
    int64_t yl = yt->dim[ax];
    int f = pos_flat(L);
    int o = cg_bin(L->k, CG_DIV, f, I(L, yl * inner)), r = cg_bin(L->k, CG_MOD, f, I(L, yl * inner));
    int idx = add(L, add(L, mul(L, o, I(L, xl * inner)), I(L, nd->ia[1] * inner)), r);
    return load_c(L, in_buf(L, nd->in[0]), idx);
  }
  case IR_OP_PAD: {
    const IrType *xt = &node(L, nd->in[0])->type;
    int ax = axis_of(nd->ia[0], yt->rank);
    return view_load(L, nd, nd->in[0], nd->ia[1], xt->dim[ax]);
  }
  case IR_OP_CONCAT: {    /* each element from the operand whose rows cover it */
    int ax = axis_of(nd->ia[0], yt->rank), v = F(L, 0);
    int64_t at = 0;
    for (int i = 0; i < nd->nin; i++) {
      int64_t xl = node(L, nd->in[i])->type.dim[ax];
      int x = view_load(L, nd, nd->in[i], at, xl);   /* 0 outside its rows */
      v = i ? add(L, v, x) : x;
      at += xl;
    }
    return v;
  }
  default: TS_DIE("lower: %s is not a layout op", ir_ops[nd->op].name);
  }
}

/* Per-row operand (targets, dloss) at the current row, raw type. */
static int row_operand(Lw *L, int id) { return cg_load(L->k, in_buf(L, id), pos_row(L)); }

/* The formula of an elementwise node at the current position. */
static int elem_ew(Lw *L, const IrNode *nd) {
  /* a broadcast reads its operand at a computed index, not at the
   * position: no load at the position, which may be past the operand's
   * end (only optimization would remove it) */
  int at_pos = nd->op != IR_OP_BROADCAST;
  int x = nd->nin > 0 && at_pos ? elem(L, nd->in[0]) : -1;
  int z = nd->nin > 1 && at_pos ? elem(L, nd->in[1]) : -1;
  double c = nd->fa[0];
  switch (nd->op) {
  case IR_OP_ADD: return add(L, x, z);
  case IR_OP_SUB: return sub(L, x, z);
  case IR_OP_MUL: return mul(L, x, z);
  case IR_OP_DIV: return dvd(L, x, z);
  case IR_OP_ADDS: return add(L, x, F(L, c));
  case IR_OP_MULS: return mul(L, x, F(L, c));
  case IR_OP_NEG: return un(L, CG_NEG, x);
  case IR_OP_EXP: return un(L, CG_EXP, x);
  case IR_OP_LOG: return un(L, CG_LOG, x);
  case IR_OP_SQRT: return un(L, CG_SQRT, x);
  case IR_OP_RSQRT: return dvd(L, F(L, 1), un(L, CG_SQRT, x));
  case IR_OP_TANH: return un(L, CG_TANH, x);
  case IR_OP_GELU_TANH:      /* 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = K (x + A x^3) */
    return mul(L, x, sigmoid(L, mul(L, F(L, 2), gelu_u(L, x))));
  case IR_OP_GELU_ERF:      /* 0.5 x (1 + erf(x / sqrt 2)) */
    return mul(L, mul(L, F(L, 0.5), x), add(L, F(L, 1), un(L, CG_ERF, dvd(L, x, F(L, M_SQRT2)))));
  case IR_OP_SILU: return mul(L, x, sigmoid(L, x));
  case IR_OP_RELU: return sel(L, cg_bin(L->k, CG_LT, F(L, 0), x), x, F(L, 0));
  case IR_OP_GELU_TANH_BWD: {
    /* the reference's 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 A x^2) with
     * th = tanh(u), through s = sigmoid(2u) = 0.5 (1 + th), 1 - th^2 = 4 s (1 - s):
     * exp vectorizes where tanh is a scalar libm call */
    int s = sigmoid(L, mul(L, F(L, 2), gelu_u(L, x)));
    int p = add(L, F(L, 1), mul(L, mul(L, F(L, 3 * GELU_A), x), x));
    int bb = mul(L, mul(L, mul(L, mul(L, F(L, 2), x), mul(L, s, sub(L, F(L, 1), s))), F(L, GELU_K)), p);
    return mul(L, z, add(L, s, bb));
  }
  case IR_OP_GELU_ERF_BWD: {
    int a = mul(L, F(L, 0.5), add(L, F(L, 1), un(L, CG_ERF, dvd(L, x, F(L, M_SQRT2)))));
    int e = un(L, CG_EXP, mul(L, mul(L, F(L, -0.5), x), x));
    int bb = dvd(L, mul(L, x, e), F(L, sqrt(2.0 * M_PI)));
    return mul(L, z, add(L, a, bb));
  }
  case IR_OP_SILU_BWD: {    /* dy sig (1 + x (1 - sig)) */
    int s = sigmoid(L, x);
    return mul(L, mul(L, z, s), add(L, F(L, 1), mul(L, x, sub(L, F(L, 1), s))));
  }
  case IR_OP_RELU_BWD: return sel(L, cg_bin(L->k, CG_LT, F(L, 0), x), z, F(L, 0));
  case IR_OP_EQ: return sel(L, cg_bin(L->k, CG_EQ, x, z), F(L, 1), F(L, 0));
  case IR_OP_NE_SCALAR: return sel(L, cg_bin(L->k, CG_NE, x, F(L, c)), F(L, 1), F(L, 0));
  case IR_OP_CAST: return x;   /* the rounding to the result dtype does it */
  case IR_OP_CMP: {           /* pred 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >= (ops_ref.c ref_CMP) */
    static const CgOp cop[6] = {CG_EQ, CG_NE, CG_LT, CG_LE, CG_LT, CG_LE};
    int p = (int)nd->ia[0], sw = p >= 4;
    return sel(L, cg_bin(L->k, cop[p], sw ? z : x, sw ? x : z), F(L, 1), F(L, 0));
  }
  case IR_OP_WHERE: return sel(L, cg_bin(L->k, CG_NE, x, F(L, 0)), z, elem(L, nd->in[2]));
  case IR_OP_FLOORDIV: case IR_OP_MOD: {   /* Python's // and %, 0 where y == 0 (ref int_divmod) */
    int z0 = cg_bin(L->k, CG_EQ, z, F(L, 0));
    z = sel(L, z0, F(L, 1), z);   /* no division by 0, even in the arm not taken */
    int t = cg_cast(L->k, L->ct, cg_cast(L->k, CG_I64, dvd(L, x, z)));   /* truncated quotient */
    int r = sub(L, x, mul(L, t, z));
    int q = sel(L, cg_bin(L->k, CG_LT, mul(L, r, z), F(L, 0)), sub(L, t, F(L, 1)), t);
    int v = nd->op == IR_OP_MOD ? sub(L, x, mul(L, z, q)) : q;
    return sel(L, z0, F(L, 0), v);
  }
  case IR_OP_FULL: return F(L, nd->fa[0]);
  case IR_OP_ARANGE: {       /* start + step * the index along axis (local = global: the axis is not split) */
    const IrType *t = &nd->type;
    int ax = (int)nd->ia[0];
    int64_t inner = 1;
    for (int d = ax + 1; d < t->rank; d++) inner *= t->dim[d];
    int i = cg_bin(L->k, CG_MOD, cg_bin(L->k, CG_DIV, pos_flat(L), I(L, inner)), I(L, t->dim[ax] > 0 ? t->dim[ax] : 1));
    return add(L, F(L, nd->fa[0]), mul(L, F(L, nd->fa[1]), cg_cast(L->k, L->ct, i)));
  }
  case IR_OP_BROADCAST: {
    const IrType *st = &node(L, nd->in[0])->type;
    return load_c(L, in_buf(L, nd->in[0]), bcast_index(L, st, &nd->type));
  }
  case IR_OP_CAUSAL_MASK: {  /* fill where column j > row i of the last two dims */
    int64_t R = nd->type.dim[nd->type.rank - 2];
    int i = cg_bin(L->k, CG_MOD, pos_row(L), I(L, R));
    return sel(L, cg_bin(L->k, CG_LT, i, pos_col(L)), F(L, c), x);
  }
  case IR_OP_MASKED_FILL: return sel(L, cg_bin(L->k, CG_NE, z, F(L, 0)), x, F(L, c));
  case IR_OP_DROPOUT: {      /* keep iff u >= p, kept x * (1 / (1 - p)): ops_ref_t.h k_DROPOUT */
    double scale = c < 1 ? 1.0 / (1.0 - c) : 0.0;
    int keep = cg_bin(L->k, CG_LE, cg_const_f(L->k, CG_F64, c), dropout_u(L, nd, pos_flat(L)));
    return sel(L, keep, mul(L, x, F(L, scale)), F(L, 0));
  }
  case IR_OP_RAND: {         /* lo + u (hi - lo) in f64, i32: its floor (ops_ref.c ref_RAND, bit for bit) */
    double lo = nd->fa[0], hi = nd->fa[1];
    int v = cg_bin(L->k, CG_ADD, cg_const_f(L->k, CG_F64, lo),
                   cg_bin(L->k, CG_MUL, dropout_u(L, nd, pos_flat(L)), cg_const_f(L->k, CG_F64, hi - lo)));
    if (nd->type.dtype == IR_I32) {
      int t = cg_cast(L->k, CG_F64, cg_cast(L->k, CG_I64, v));        /* truncated, then down for v < 0 */
      t = sel(L, cg_bin(L->k, CG_LT, v, t), cg_bin(L->k, CG_SUB, t, cg_const_f(L->k, CG_F64, 1)), t);
      v = sel(L, cg_bin(L->k, CG_LE, cg_const_f(L->k, CG_F64, hi), t), cg_const_f(L->k, CG_F64, hi - 1), t);
    } else {
      v = sel(L, cg_bin(L->k, CG_LE, cg_const_f(L->k, CG_F64, hi), v), cg_const_f(L->k, CG_F64, lo), v);   /* u -> 1 */
    }
    return cg_cast(L->k, L->ct, v);
  }
  default: TS_DIE("lower: %s is not elementwise", ir_ops[nd->op].name);
  }
}

/* A row op's element from its statistics (computed by row_stats). */
static int elem_row(Lw *L, const IrNode *nd, const RowStats *s) {
  const int *v = s->v;
  switch (nd->op) {
  case IR_OP_SOFTMAX: return dvd(L, exp_shifted(L, sub(L, elem(L, nd->in[0]), v[0])), v[1]);
  case IR_OP_LOG_SOFTMAX: return sub(L, elem(L, nd->in[0]), v[2]);
  case IR_OP_SOFTMAX_BWD: {
    int y = elem(L, nd->in[0]), dy = elem(L, nd->in[1]);
    return mul(L, y, sub(L, dy, v[0]));
  }
  case IR_OP_LOG_SOFTMAX_BWD: {
    int y = elem(L, nd->in[0]), dy = elem(L, nd->in[1]);
    return sub(L, dy, mul(L, un(L, CG_EXP, y), v[0]));
  }
  case IR_OP_LAYERNORM: return mul(L, sub(L, elem(L, nd->in[0]), v[0]), v[1]);
  case IR_OP_LAYERNORM_BWD: {  /* rs (dy - mean(dy) - xh mean(dy xh)) */
    int xh = mul(L, sub(L, elem(L, nd->in[0]), v[0]), v[1]);
    int dy = elem(L, nd->in[1]);
    return mul(L, v[1], sub(L, sub(L, dy, v[2]), mul(L, xh, v[3])));
  }
  case IR_OP_RMSNORM: return mul(L, elem(L, nd->in[0]), v[0]);
  case IR_OP_RMSNORM_BWD: {    /* r dy - r^3 x mean(dy x) */
    int x = elem(L, nd->in[0]), dy = elem(L, nd->in[1]);
    int r3 = mul(L, mul(L, v[0], v[0]), v[0]);
    return sub(L, mul(L, v[0], dy), mul(L, mul(L, r3, x), v[1]));
  }
  case IR_OP_CROSS_ENTROPY_BWD: {
    /* (T)e * (T)(d / s), then d subtracted at the target; 0 if ignored,
     * NaN for a target outside [0, V) */
    IrDtype dt = nd->type.dtype;
    int e = round_to(L, dt, exp_shifted(L, sub(L, elem(L, nd->in[0]), v[0])));
    int g = round_to(L, dt, mul(L, e, v[1]));
    int at = cg_bin(L->k, CG_EQ, pos_col(L), v[2]);
    g = sel(L, at, round_to(L, dt, sub(L, g, v[3])), g);
    return sel(L, v[4], g, F(L, 0));   /* v[4]: 1 kept, 0 ignored (NaN folded into v[1]) */
  }
  default: TS_DIE("lower: %s is not a row op", ir_ops[nd->op].name);
  }
}

static int elem(Lw *L, int id) {
  int g = gpos(L, id);
  if (g < 0) {                    /* from outside: a load, once per loop */
    int bi = in_buf(L, id);
    TS_ASSERT(bi >= 0);
    if (L->inmemogen[bi] == L->gen && L->inmemo[bi] >= 0) return L->inmemo[bi];
    L->inmemogen[bi] = L->gen;
    return L->inmemo[bi] = load_c(L, bi, pos_flat(L));
  }
  if (L->memogen[g] == L->gen && L->memo[g] >= 0) return L->memo[g];
  const IrNode *nd = node(L, id);
  int v = is_layout(nd->op) ? elem_layout(L, nd) : is_row_op(nd->op) ? elem_row(L, nd, &L->st[g]) : elem_ew(L, nd);
  v = round_to(L, nd->type.dtype, v);
  L->memogen[g] = L->gen;
  return L->memo[g] = v;
}

/* sum over the row of f(element), f selected by `what`; one loop */
enum { S_X, S_EXP_SHIFT, S_PROD, S_SQDEV, S_SQ, S_PROD_XH };
static int row_sum(Lw *L, int what, int a, int bnode, int p0, int p1) {
  int acc = cg_acc(L->k, L->ct, CG_RED_SUM, 0);
  loop_begin(L);
  int x = elem(L, a), t;
  switch (what) {
  case S_X: t = x; break;
  case S_EXP_SHIFT: t = exp_shifted(L, sub(L, x, p0)); break;
  case S_PROD: t = mul(L, x, elem(L, bnode)); break;
  case S_SQDEV: { int d = sub(L, x, p0); t = mul(L, d, d); break; }
  case S_SQ: t = mul(L, x, x); break;
  default: /* S_PROD_XH: dy * ((x - mu) * rs), x = a, dy = bnode */
    t = mul(L, elem(L, bnode), mul(L, sub(L, x, p0), p1));
    break;
  }
  cg_update(L->k, acc, t);
  loop_end(L);
  return acc;
}
static int row_max(Lw *L, int a) {
  int acc = cg_acc(L->k, L->ct, CG_RED_MAX, -INFINITY);
  loop_begin(L);
  cg_update(L->k, acc, elem(L, a));
  loop_end(L);
  return acc;
}

/* Statistics of row op nodes[g] for the current row (at row level). */
static void row_stats(Lw *L, int g) {
  const IrNode *nd = node(L, L->nodes[g]);
  int *v = L->st[g].v;
  double eps = nd->fa[0];
  int Dv = -1;
  if (nd->op == IR_OP_LAYERNORM || nd->op == IR_OP_LAYERNORM_BWD || nd->op == IR_OP_RMSNORM || nd->op == IR_OP_RMSNORM_BWD)
    Dv = F(L, (double)L->D);
  switch (nd->op) {
  case IR_OP_SOFTMAX:
  case IR_OP_LOG_SOFTMAX: {
    int mx = row_max(L, nd->in[0]);
    mx = sel(L, cg_bin(L->k, CG_EQ, mx, F(L, -INFINITY)), F(L, 0), mx);   /* fully masked row */
    v[0] = mx;
    v[1] = row_sum(L, S_EXP_SHIFT, nd->in[0], -1, mx, -1);
    if (nd->op == IR_OP_LOG_SOFTMAX) v[2] = add(L, mx, un(L, CG_LOG, v[1]));
    break;
  }
  case IR_OP_SOFTMAX_BWD: v[0] = row_sum(L, S_PROD, nd->in[1], nd->in[0], -1, -1); break;
  case IR_OP_LOG_SOFTMAX_BWD: v[0] = row_sum(L, S_X, nd->in[1], -1, -1, -1); break;
  case IR_OP_LAYERNORM:
  case IR_OP_LAYERNORM_BWD: {
    int mu = dvd(L, row_sum(L, S_X, nd->in[0], -1, -1, -1), Dv);
    int var = dvd(L, row_sum(L, S_SQDEV, nd->in[0], -1, mu, -1), Dv);
    v[0] = mu;
    v[1] = dvd(L, F(L, 1), un(L, CG_SQRT, add(L, var, F(L, eps))));
    if (nd->op == IR_OP_LAYERNORM_BWD) {
      v[2] = dvd(L, row_sum(L, S_X, nd->in[1], -1, -1, -1), Dv);
      v[3] = dvd(L, row_sum(L, S_PROD_XH, nd->in[0], nd->in[1], mu, v[1]), Dv);
    }
    break;
  }
  case IR_OP_RMSNORM:
  case IR_OP_RMSNORM_BWD:
    v[0] = dvd(L, F(L, 1), un(L, CG_SQRT, add(L, dvd(L, row_sum(L, S_SQ, nd->in[0], -1, -1, -1), Dv), F(L, eps))));
    if (nd->op == IR_OP_RMSNORM_BWD) v[1] = dvd(L, row_sum(L, S_PROD, nd->in[1], nd->in[0], -1, -1), Dv);
    break;
  case IR_OP_CROSS_ENTROPY:
  case IR_OP_CROSS_ENTROPY_BWD: {
    /* t = target; kept = t != ignore; valid = 0 <= t < V */
    int t = cg_cast(L->k, CG_I64, row_operand(L, nd->in[1]));
    int kept = cg_bin(L->k, CG_NE, t, I(L, nd->ia[0]));
    int valid = cg_bin(L->k, CG_AND, cg_bin(L->k, CG_LE, I(L, 0), t), cg_bin(L->k, CG_LT, t, I(L, L->D)));
    int tc = sel(L, valid, t, I(L, 0));    /* never index outside the row */
    int mx = row_max(L, nd->in[0]);
    int s = row_sum(L, S_EXP_SHIFT, nd->in[0], -1, mx, -1);
    int nan = F(L, NAN);
    if (nd->op == IR_OP_CROSS_ENTROPY) {
      /* the logit at the target: elem at column tc of this row */
      forget(L);
      L->col = tc;
      L->flat = -1;
      int xt = elem(L, nd->in[0]);
      forget(L);
      L->col = L->flat = -1;
      int loss = sub(L, add(L, mx, un(L, CG_LOG, s)), xt);
      v[0] = sel(L, kept, sel(L, valid, loss, nan), F(L, 0));
    } else {
      int d = load_c(L, in_buf(L, nd->in[2]), pos_row(L));
      v[0] = mx;
      v[1] = sel(L, valid, round_to(L, nd->type.dtype, dvd(L, d, s)), nan);
      v[2] = tc;
      v[3] = d;
      v[4] = kept;
    }
    break;
  }
  default: break;
  }
}

int cg_op_is_row(IrOp op) { return op >= 0 && op < IR_OP_COUNT && is_row_op(op); }

int cg_op_lowerable(IrOp op) {
  return op >= 0 && op < IR_OP_COUNT &&
         (is_ew_like(op) || is_layout(op) || is_row_op(op) || is_reduce(op) || op == IR_OP_SUMSQ || op == IR_OP_SUM_TO);
}

/* The element shape of a node: its own type, or its operand's for per-row nodes. */
static const IrType *elem_type(const Lw *L, const IrNode *nd) {
  return is_per_row(nd->op) || nd->op == IR_OP_SUMSQ || nd->op == IR_OP_SUM_TO ? &node(L, nd->in[0])->type : &nd->type;
}
static int same_sizes(const IrType *a, const IrType *b) {
  if (ir_type_numel(a) != ir_type_numel(b)) return 0;
  int64_t la = a->rank ? a->dim[a->rank - 1] : 1, lb = b->rank ? b->dim[b->rank - 1] : 1;
  return la == lb;
}
static int is_last_axis(int64_t ax, int rank) { return ax == rank - 1 || (ax == -1 && rank > 0); }

/* Whether value id (outside the group) reads a group value, directly or
 * through other nodes outside the group.  Iterative: marks ids from id
 * down to the group's first node. */
static int depends_on_group(const Lw *L, int id) {
  int lo = L->nodes[0], n = id - lo + 1, found = 0;
  unsigned char *need = ts_xcalloc((size_t)n, 1);   /* need[v - lo]: v feeds id */
  need[n - 1] = 1;
  for (int v = id; v >= lo && !found; v--) {
    if (!need[v - lo]) continue;
    if (v != id && gpos(L, v) >= 0) { found = 1; break; }
    const IrNode *nd = &L->b->nodes[v];
    for (int j = 0; j < nd->nin; j++)
      if (nd->in[j] >= lo && nd->in[j] < v) need[nd->in[j] - lo] = 1;
  }
  free(need);
  return found;
}

/* Checks the group's form and fills io; 0 or -1 with a message. */
static int check_group(Lw *L) {
  const IrBlock *b = L->b;
  CgGroupIO *io = L->io;
  for (int i = 0; i < L->n; i++) {
    int id = L->nodes[i];
    if (id < 0 || id >= b->n || (i && id <= L->nodes[i - 1]))
      return ts_errf(L->err, L->errlen, "group: node ids must be ascending values of block %s (got %d)", b->name, id);
    const IrNode *nd = node(L, id);
    if (!cg_op_lowerable(nd->op) || (L->n > 1 && (nd->op == IR_OP_SUMSQ || nd->op == IR_OP_SUM_TO)))
      return ts_errf(L->err, L->errlen, "group: %%%d = %s cannot be lowered into a fused kernel", id, ir_ops[nd->op].name);
    if (is_reduce(nd->op) && !is_last_axis(nd->ia[0], node(L, nd->in[0])->type.rank) && L->n > 1)
      return ts_errf(L->err, L->errlen, "group: %%%d = %s reduces axis %lld; a fused reduction must be over the last axis",
                     id, ir_ops[nd->op].name, (long long)nd->ia[0]);
    if (!same_sizes(elem_type(L, nd), &L->shape)) {
      char b1[128], b2[128];
      return ts_errf(L->err, L->errlen, "group: %%%d = %s works on %s but the group on %s", id, ir_ops[nd->op].name,
                     ir_type_str(elem_type(L, nd), b1, sizeof b1), ir_type_str(&L->shape, b2, sizeof b2));
    }
    for (int j = 0; j < nd->nin; j++) {
      int a = nd->in[j], ga = gpos(L, a);
      if (ga >= 0 && is_per_row(node(L, a)->op))
        return ts_errf(L->err, L->errlen, "group: %%%d = %s uses the per-row result %%%d inside the group", id,
                       ir_ops[nd->op].name, a);
      int per_row_operand = (nd->op == IR_OP_CROSS_ENTROPY || nd->op == IR_OP_CROSS_ENTROPY_BWD) && j > 0;
      int remapped = nd->op == IR_OP_BROADCAST || is_layout(nd->op);   /* read at a computed index */
      if (ga >= 0 && (per_row_operand || remapped))
        return ts_errf(L->err, L->errlen, "group: operand %d of %%%d = %s must come from outside the group", j, id,
                       ir_ops[nd->op].name);
      if (ga < 0 && !per_row_operand && !remapped &&
          ir_type_numel(&node(L, a)->type) != ir_type_numel(&L->shape))
        return ts_errf(L->err, L->errlen, "group: operand %%%d of %%%d = %s is not of the group's shape", a, id,
                       ir_ops[nd->op].name);
      if (ga < 0 && in_buf(L, a) < 0) {
        if (io->nin >= CG_MAX_BUFS / 2) return ts_errf(L->err, L->errlen, "group: more than %d inputs", CG_MAX_BUFS / 2);
        if (cg_type_of_dtype(node(L, a)->type.dtype) == CG_VOID)
          return ts_errf(L->err, L->errlen, "group: operand %%%d has no value", a);
        io->in[io->nin++] = a;
      }
    }
    if (cg_type_of_dtype(nd->type.dtype) == CG_VOID)
      return ts_errf(L->err, L->errlen, "group: %%%d = %s has no value", id, ir_ops[nd->op].name);
    if (nd->op == IR_OP_DROPOUT) {
      /* the mask hashes the element's index in the GLOBAL tensor; the
       * kernel knows only the local one, equal when no dim is split.  A
       * bad p is the reference kernel's error to report. */
      for (int d = 0; d < nd->type.rank; d++)
        if (nd->sh.split[d])
          return ts_errf(L->err, L->errlen, "group: %%%d = dropout is split across ranks (its mask needs global indices)", id);
      if (!(nd->fa[0] >= 0 && nd->fa[0] <= 1))
        return ts_errf(L->err, L->errlen, "group: %%%d = dropout has p = %g outside [0, 1]", id, nd->fa[0]);
    }
    for (int d = 0; d < nd->type.rank && nd->op == IR_OP_RAND; d++)   /* hashes global indices, as dropout */
      if (nd->sh.split[d])
        return ts_errf(L->err, L->errlen, "group: %%%d = rand is split across ranks (it needs global indices)", id);  /* internal */
    if (nd->op == IR_OP_ARANGE && nd->ia[0] >= 0 && nd->ia[0] < nd->type.rank && nd->sh.split[nd->ia[0]])
      return ts_errf(L->err, L->errlen, "group: %%%d = arange is split across ranks along its axis (its values are "
                     "global indices)", id);
    if (is_row_op(nd->op) || is_reduce(nd->op)) L->rowmode = 1;
    if (nd->op == IR_OP_BROADCAST || nd->op == IR_OP_CAUSAL_MASK) L->needs_col = 1;
  }
  /* convexity: no input may depend on a group value (through nodes outside
   * the group), or the kernel would need its own output before it runs */
  for (int i = 0; i < io->nin; i++)
    if (io->in[i] > L->nodes[0] && depends_on_group(L, io->in[i]))
      return ts_errf(L->err, L->errlen, "group: operand %%%d is computed from the group's own values (the group is not convex)",
                     io->in[i]);
  /* outputs: group values used after the group by other nodes, and the last */
  const CgUsers *us = L->users && L->users->n == b->n ? L->users : NULL;
  for (int i = 0; i < L->n; i++) {
    int id = L->nodes[i], used = i == L->n - 1;
    if (us)
      for (int r = us->off[id]; r < us->off[id + 1] && !used; r++) used = gpos(L, us->rd[r]) < 0;
    for (int u = id + 1; !us && u < b->n && !used; u++) {
      if (gpos(L, u) >= 0) continue;
      for (int j = 0; j < b->nodes[u].nin; j++)
        if (b->nodes[u].in[j] == id) used = 1;
    }
    L->outbuf[i] = -1;
    if (used) {
      if (io->nout >= CG_MAX_BUFS / 2) return ts_errf(L->err, L->errlen, "group: more than %d outputs", CG_MAX_BUFS / 2);
      io->out[io->nout++] = id;
    }
  }
  return 0;
}

/* A reduction along any axis, or sumsq (a group of one node):
 * x viewed as [outer, len, inner] -> y[outer, inner]; one iteration per
 * output element, the loop strides by inner through x. */
static void lower_reduce_axis(Lw *L, const IrNode *nd, int xb, int yb) {
  const IrType *xt = &node(L, nd->in[0])->type;
  int64_t outer = 1, len = ir_type_numel(xt), inner = 1;
  if (nd->op != IR_OP_SUMSQ) {
    int ax = (int)(nd->ia[0] < 0 ? nd->ia[0] + xt->rank : nd->ia[0]);
    outer = 1;
    for (int d = 0; d < ax; d++) outer *= xt->dim[d];
    for (int d = ax + 1; d < xt->rank; d++) inner *= xt->dim[d];
    len = xt->dim[ax];
  }
  L->k->grid = outer * inner;
  int gid = L->gid;
  int o = cg_bin(L->k, CG_DIV, gid, I(L, inner)), j = cg_bin(L->k, CG_MOD, gid, I(L, inner));
  int base = add(L, mul(L, o, I(L, len * inner)), j);
  int acc = cg_acc(L->k, L->ct, nd->op == IR_OP_MAX ? CG_RED_MAX : CG_RED_SUM, nd->op == IR_OP_MAX ? -INFINITY : 0);
  int l = cg_range(L->k, I(L, len));
  int x = load_c(L, xb, add(L, base, mul(L, l, I(L, inner))));
  cg_update(L->k, acc, nd->op == IR_OP_SUMSQ ? mul(L, x, x) : x);
  cg_end(L->k);
  int r = acc;
  if (nd->op == IR_OP_MEAN) r = len ? dvd(L, acc, F(L, (double)len)) : F(L, NAN);
  cg_store(L->k, yb, gid, cg_cast(L->k, cg_type_of_dtype(nd->type.dtype), r));
}

/* Stores every per-element output at index idx.  All values are computed
 * before the first store, so an output may share memory with an input of
 * the same shape (in place): every load of the element precedes every
 * store to it, and no other element is touched. */
static void store_outputs(Lw *L, int idx) {
  int val[CG_MAX_BUFS];
  for (int i = 0; i < L->n; i++)
    if (L->outbuf[i] >= 0 && !is_per_row(node(L, L->nodes[i])->op))
      val[L->outbuf[i]] = cg_cast(L->k, L->k->buf[L->outbuf[i]].type, elem(L, L->nodes[i]));
  for (int i = 0; i < L->n; i++)
    if (L->outbuf[i] >= 0 && !is_per_row(node(L, L->nodes[i])->op)) cg_store(L->k, L->outbuf[i], idx, val[L->outbuf[i]]);
}

/* sum_to (a group of one node): x[in shape] -> y[out shape], summing the
 * dims that broadcasting expanded (right-aligned; out dims are 1 or equal).
 * One iteration per element of y; the loop runs over the S = |x| / |y|
 * combinations of the summed dims, decoded from the loop index. */
static void lower_sum_to(Lw *L, const IrNode *nd, int xb, int yb) {
  const IrType *xt = &node(L, nd->in[0])->type, *yt = &nd->type;
  int off = xt->rank - yt->rank;
  int64_t xs[IR_MAX_RANK], s = 1, ny = ir_type_numel(yt), S = ny ? ir_type_numel(xt) / ny : 0;
  for (int d = xt->rank - 1; d >= 0; d--) { xs[d] = s; s *= xt->dim[d]; }
  L->k->grid = ny;
  /* the kept dims' coordinates come from gid (y's index), the summed dims'
   * from the loop index r, both decoded innermost dim first */
  int base = I(L, 0);
  int64_t ys = 1;
  for (int d = xt->rank - 1; d >= 0; d--) {
    int yd = d - off;
    if (yd < 0 || yt->dim[yd] == 1) continue;
    int c = cg_bin(L->k, CG_MOD, cg_bin(L->k, CG_DIV, L->gid, I(L, ys)), I(L, yt->dim[yd]));
    base = add(L, base, mul(L, c, I(L, xs[d])));
    ys *= yt->dim[yd];
  }
  int acc = cg_acc(L->k, L->ct, CG_RED_SUM, 0);
  int r = cg_range(L->k, I(L, S)), idx = base;
  int64_t rs = 1;
  for (int d = xt->rank - 1; d >= 0; d--) {
    int yd = d - off;
    if (yd >= 0 && yt->dim[yd] != 1) continue;
    int c = cg_bin(L->k, CG_MOD, cg_bin(L->k, CG_DIV, r, I(L, rs)), I(L, xt->dim[d]));
    idx = add(L, idx, mul(L, c, I(L, xs[d])));
    rs *= xt->dim[d];
  }
  cg_update(L->k, acc, load_c(L, xb, idx));
  cg_end(L->k);
  cg_store(L->k, yb, L->gid, cg_cast(L->k, cg_type_of_dtype(yt->dtype), acc));
}

/* f32 arithmetic for the group (CgLowerOpts.f32 asked for it): every member
 * and every operand is f32 or bf16 (a cross-entropy's targets excepted:
 * they are read as integers), and the group is not a one-node whole
 * reduction. */
static int group_f32(const Lw *L) {
  const IrNode *last = node(L, L->nodes[L->n - 1]);
  if (L->n == 1 && (last->op == IR_OP_SUM_TO || last->op == IR_OP_SUMSQ ||
                    (is_reduce(last->op) && !is_last_axis(last->ia[0], L->shape.rank))))
    return 0;
  for (int i = 0; i < L->n; i++) {
    const IrNode *nd = node(L, L->nodes[i]);
    CgType t = cg_type_of_dtype(nd->type.dtype);
    if (t != CG_F32 && !cg_type_is_half(t)) return 0;
    for (int j = 0; j < nd->nin; j++) {
      if ((nd->op == IR_OP_CROSS_ENTROPY || nd->op == IR_OP_CROSS_ENTROPY_BWD) && j == 1) continue;
      CgType a = cg_type_of_dtype(node(L, nd->in[j])->type.dtype);
      if (a != CG_F32 && !cg_type_is_half(a)) return 0;
    }
  }
  return 1;
}

CgKernel *cg_lower_group(const IrModule *m, const IrBlock *b, const int *nodes, int n, CgGroupIO *io,
                         char *err, size_t errlen) {
  return cg_lower_group_opts(m, b, NULL, nodes, n, io, NULL, err, errlen);
}

CgKernel *cg_lower_group_users(const IrModule *m, const IrBlock *b, const CgUsers *users, const int *nodes, int n,
                               CgGroupIO *io, char *err, size_t errlen) {
  return cg_lower_group_opts(m, b, users, nodes, n, io, NULL, err, errlen);
}

CgKernel *cg_lower_group_opts(const IrModule *m, const IrBlock *b, const CgUsers *users, const int *nodes, int n,
                              CgGroupIO *io, const CgLowerOpts *o, char *err, size_t errlen) {
  memset(io, 0, sizeof *io);
  if (n < 1 || !nodes) { ts_errf(err, errlen, "group: no nodes"); return NULL; }
  if (nodes[0] < 0 || nodes[0] >= b->n) { ts_errf(err, errlen, "group: node %d out of range", nodes[0]); return NULL; }
  Lw L = {.m = m, .b = b, .nodes = nodes, .n = n, .io = io, .users = users, .ct = CG_F64, .err = err, .errlen = errlen};
  L.shape = *elem_type(&L, &b->nodes[nodes[0]]);
  L.memo = ts_xmalloc((size_t)n * sizeof *L.memo);
  L.memogen = ts_xmalloc((size_t)n * sizeof *L.memogen);
  L.outbuf = ts_xmalloc((size_t)n * sizeof *L.outbuf);
  L.st = ts_xcalloc((size_t)n, sizeof *L.st);
  for (int i = 0; i < n; i++) L.memo[i] = L.memogen[i] = -1;
  for (int i = 0; i < CG_MAX_BUFS; i++) L.inmemo[i] = L.inmemogen[i] = -1;
  CgKernel *k = NULL;
  int *accs = ts_xmalloc((size_t)n * sizeof *accs);   /* per group position: a reduction's accumulator */
  if (check_group(&L) != 0) goto done;
  if (o && o->f32 && group_f32(&L)) L.ct = CG_F32;

  const IrNode *last = &b->nodes[nodes[n - 1]];
  char name[64];
  snprintf(name, sizeof name, "%s%s_%s", n > 1 ? "fused_" : "", ir_ops[last->op].name, ir_dtype_name(last->type.dtype));
  L.numel = ir_type_numel(&L.shape);
  L.D = L.shape.rank ? L.shape.dim[L.shape.rank - 1] : 1;
  L.rows = L.D ? L.numel / L.D : 0;
  /* An elementwise group whose values depend on the column (a broadcast
   * bias, a causal mask) runs row by row when rows are long enough: the
   * column is then the loop index, where flat mode would need a div/mod
   * per element, which does not vectorize. */
  if (L.needs_col && L.D >= 8) L.rowmode = 1;
  k = L.k = cg_kernel_new(name, L.rowmode ? L.rows : L.numel);
  for (int i = 0; i < io->nin; i++) cg_buf(k, cg_type_of_dtype(b->nodes[io->in[i]].type.dtype), ir_type_numel(&b->nodes[io->in[i]].type), 0);
  for (int j = 0; j < io->nout; j++) {
    int id = io->out[j];
    L.outbuf[gpos(&L, id)] = cg_buf(k, cg_type_of_dtype(b->nodes[id].type.dtype), ir_type_numel(&b->nodes[id].type), 1);
  }
  L.gid = cg_gid(k);

  if (n == 1 && last->op == IR_OP_SUM_TO) {
    lower_sum_to(&L, last, 0, io->nin);
    goto done;
  }
  if (n == 1 && (last->op == IR_OP_SUMSQ || (is_reduce(last->op) && !is_last_axis(last->ia[0], L.shape.rank)))) {
    lower_reduce_axis(&L, last, 0, io->nin);
    goto done;
  }
  L.row = L.col = L.flat = -1;
  if (!L.rowmode) {                          /* flat: one element per iteration */
    L.flat = L.gid;
    store_outputs(&L, L.gid);
    goto done;
  }
  /* row mode: statistics of every row op, then one loop for the outputs */
  L.row = L.gid;
  L.rowbase = mul(&L, L.gid, I(&L, L.D));
  for (int i = 0; i < n; i++)
    if (is_row_op(b->nodes[nodes[i]].op)) row_stats(&L, i);
  int need_loop = 0;
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[nodes[i]];
    if (is_reduce(nd->op)) {
      accs[i] = cg_acc(k, L.ct, nd->op == IR_OP_MAX ? CG_RED_MAX : CG_RED_SUM, nd->op == IR_OP_MAX ? -INFINITY : 0);
      need_loop = 1;
    } else if (L.outbuf[i] >= 0 && !is_per_row(nd->op)) {
      need_loop = 1;
    }
  }
  if (need_loop) {
    loop_begin(&L);
    for (int i = 0; i < n; i++) {
      const IrNode *nd = &b->nodes[nodes[i]];
      if (is_reduce(nd->op)) cg_update(k, accs[i], elem(&L, nd->in[0]));
    }
    store_outputs(&L, pos_flat(&L));
    loop_end(&L);
  }
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[nodes[i]];
    if (L.outbuf[i] < 0 || !is_per_row(nd->op)) continue;
    int v = nd->op == IR_OP_CROSS_ENTROPY ? L.st[i].v[0] : accs[i];
    if (nd->op == IR_OP_MEAN) v = L.D ? dvd(&L, v, F(&L, (double)L.D)) : F(&L, NAN);
    cg_store(k, L.outbuf[i], L.gid, cg_cast(k, k->buf[L.outbuf[i]].type, v));
  }
done:
  if (k && cg_kernel_verify(k, err, errlen) != 0) {
    cg_kernel_free(k);
    k = NULL;
  }
  free(L.memo);
  free(L.memogen);
  free(L.outbuf);
  free(L.st);
  free(accs);
  return k;
}

/* ---- optimizer steps (cg.h, cg_lower_opt_step) ----
 * One lowering for every update rule: the buffers and the per-tensor
 * scalars are the same for all (cg_opt_step_layout), the rule is the
 * arithmetic in the middle, written in the reference's order
 * (runtime/cpu/ops_ref_t.h: adamw_range, sgd_range, lion_range,
 * lr_step_range) so that every element gets the reference's bits. */

int cg_opt_step_layout(IrOp op, int *nmom, int *nkey) {
  switch (op) {
  case IR_OP_ADAMW: *nmom = 2; *nkey = 3; return 2;   /* b1 b2 eps */
  case IR_OP_SGD: *nmom = 1; *nkey = 2; return 2;     /* mom nesterov */
  case IR_OP_LION: *nmom = 1; *nkey = 2; return 2;    /* b1 b2 */
  case IR_OP_LR_STEP: *nmom = 0; *nkey = 0; return 1; /* (scale and wd come per tensor) */
  default: return 0;
  }
}

CgKernel *cg_lower_opt_step(IrOp op, IrDtype T, IrDtype TC, const double *fa, int64_t cnt) {
  int nmom, nkey, nin = cg_opt_step_layout(op, &nmom, &nkey);
  if (nin == 0) return NULL;
  CgType t = cg_type_of_dtype(T);
  char name[64];
  snprintf(name, sizeof name, "%s_multi_%s", ir_ops[op].name, ir_dtype_name(T));
  CgKernel *k = cg_kernel_new(name, cnt);
  /* (coef [1],) grad or update x, scalars f64 [4], param, moments */
  int bc = nin == 2 ? cg_buf(k, cg_type_of_dtype(TC), 1, 0) : -1, bg = cg_buf(k, t, cnt, 0);
  int bs = cg_buf(k, CG_F64, 4, 0), bw = cg_buf(k, t, cnt, 1);
  int bm = nmom > 0 ? cg_buf(k, t, cnt, 1) : -1, bv = nmom > 1 ? cg_buf(k, t, cnt, 1) : -1;
#define C(x) cg_const_f(k, CG_F64, (x))
#define LD(buf, i) cg_cast(k, CG_F64, cg_load(k, (buf), (i)))
#define B(o, x, y) cg_bin(k, CG_##o, (x), (y))
  int gid = cg_gid(k), z = cg_const_i(k, CG_I64, 0);
  int lr = cg_load(k, bs, z), s1 = cg_load(k, bs, cg_const_i(k, CG_I64, 1));
  int s2 = cg_load(k, bs, cg_const_i(k, CG_I64, 2)), wd = cg_load(k, bs, cg_const_i(k, CG_I64, 3));
  int wv = LD(bw, gid), g = bc >= 0 ? B(MUL, LD(bg, gid), LD(bc, z)) : LD(bg, gid);
  int wn, m1 = -1, v1 = -1;
  switch (op) {
  case IR_OP_ADAMW: {   /* s = {lr, 1 - b1^t, 1 - b2^t, wd} */
    double b1 = fa[0], b2 = fa[1], eps = fa[2];
    m1 = B(ADD, B(MUL, C(b1), LD(bm, gid)), B(MUL, C(1.0 - b1), g));
    v1 = B(ADD, B(MUL, C(b2), LD(bv, gid)), B(MUL, B(MUL, C(1.0 - b2), g), g));
    int mh = B(DIV, m1, s1), vh = B(DIV, v1, s2);
    wn = B(SUB, wv, B(MUL, lr, B(ADD, B(DIV, mh, B(ADD, cg_un(k, CG_SQRT, vh), C(eps))), B(MUL, wd, wv))));
    break;
  }
  case IR_OP_SGD: {   /* s = {lr, -, -, wd}: d = g + wd w; buf = mom buf + d; w -= lr (nesterov ? d + mom buf : buf) */
    int d = B(ADD, g, B(MUL, wd, wv));
    m1 = B(ADD, B(MUL, C(fa[0]), LD(bm, gid)), d);
    int step = fa[1] != 0 ? B(ADD, d, B(MUL, C(fa[0]), m1)) : m1;
    wn = B(SUB, wv, B(MUL, lr, step));
    break;
  }
  case IR_OP_LION: {   /* s = {lr, -, -, wd}: w = w (1 - lr wd) - lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g */
    int m0 = LD(bm, gid), c = B(ADD, B(MUL, C(fa[0]), m0), B(MUL, C(1.0 - fa[0]), g));
    int sg = cg_select(k, B(LT, C(0.0), c), C(1.0), cg_select(k, B(LT, c, C(0.0)), C(-1.0), C(0.0)));
    wn = B(SUB, B(MUL, wv, B(SUB, C(1.0), B(MUL, lr, wd))), B(MUL, lr, sg));
    m1 = B(ADD, B(MUL, C(fa[1]), m0), B(MUL, C(1.0 - fa[1]), g));
    break;
  }
  default: /* IR_OP_LR_STEP, s = {lr, scale, -, wd}: w = w (1 - lr wd) - lr scale x */
    wn = B(SUB, B(MUL, wv, B(SUB, C(1.0), B(MUL, lr, wd))), B(MUL, B(MUL, lr, s1), g));
    break;
  }
  (void)s2;
  /* every value is computed before the stores (in place, element by element) */
  if (m1 >= 0) cg_store(k, bm, gid, cg_cast(k, t, m1));
  if (v1 >= 0) cg_store(k, bv, gid, cg_cast(k, t, v1));
  cg_store(k, bw, gid, cg_cast(k, t, wn));
#undef C
#undef LD
#undef B
  char err[256];
  if (cg_kernel_verify(k, err, sizeof err) != 0) { cg_kernel_free(k); return NULL; }
  return k;
}
