/* shape.c - the shape rule of every op: shape_NAME, one per row of
 * ops.def, gathered into rules[] by the same X-macro (so an op without a
 * rule does not compile).
 *
 * A rule sees the node (operands are earlier nodes of the block, already
 * range-checked and known to be values, not effects) and either writes the
 * result type or fails with "op: reason, naming the operand types".
 * For OPF_TYPED ops the result type is given (x->out starts as it, already
 * checked to be a well-formed type) and the rule only validates it against
 * the operands.  Attribute validity (axis ranges etc.) is checked here too,
 * so a node that passes its rule is safe for every later stage.
 * Only sizes and dtypes take part in checks; dim names ride along. */
#include "ir.h"
#include "ir_priv.h"
#include <math.h>
#include <stdarg.h>

#define TS_BIG ((int64_t)1 << 40)   /* bound on sizes and size-like attrs */

typedef struct {
  const IrModule *m;
  const IrBlock *b;
  const IrNode *n;
  IrType *out;
  char *err;
  size_t errlen;
  char tbuf[4][256];
  int tb;
} Sx;

static const IrType *opnd(Sx *x, int i) { return &x->b->nodes[x->n->in[i]].type; }

/* Type text for messages; four rotating buffers so one message can name
 * several types. */
static const char *tstr(Sx *x, const IrType *t) {
  char *buf = x->tbuf[x->tb++ & 3];
  return ir_type_str(t, buf, sizeof x->tbuf[0]);
}

static int fail(Sx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Sx *x, const char *fmt, ...) {
  if (x->err && x->errlen) {
    int k = snprintf(x->err, x->errlen, "%s: ", ir_ops[x->n->op].name);
    if (k >= 0 && (size_t)k < x->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(x->err + k, x->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

static int same_sizes(const IrType *a, const IrType *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return 0;
  return 1;
}

/* Dims left unnamed in t take the name the same dim has in u. */
static void fill_names(IrType *t, const IrType *u) {
  for (int i = 0; i < t->rank && i < u->rank; i++)
    if (!t->dname[i]) t->dname[i] = u->dname[i];
}

static int need_float(Sx *x, int i) {
  const IrType *t = opnd(x, i);
  if (ir_dtype_is_float(t->dtype)) return 0;
  return fail(x, "operand %d must be a float tensor, got %s", i + 1, tstr(x, t));
}

static int need_bool(Sx *x, int slot) {
  int64_t v = x->n->ia[slot];
  if (v == 0 || v == 1) return 0;
  return fail(x, "%s must be 0 or 1, got %lld", ir_op_attrs(x->n->op)->iname[slot], (long long)v);
}

static int need_axis(Sx *x, int slot, int rank) {
  int64_t v = x->n->ia[slot];
  if (v >= 0 && v < rank) return 0;
  return fail(x, "%s=%lld out of range for %s (rank %d)", ir_op_attrs(x->n->op)->iname[slot],
              (long long)v, tstr(x, opnd(x, 0)), rank);
}

/* The state named by int attr `slot`, or NULL after failing. */
static const IrState *state_ref(Sx *x, int slot) {
  int64_t v = x->n->ia[slot];
  if (v >= 0 && v < x->m->states.n) return &x->m->states.a[v];
  fail(x, "state reference %lld out of range (module has %d states)", (long long)v, x->m->states.n);
  return NULL;
}

/* Well-formed type: known dtype, rank within bounds, positive sizes whose
 * product cannot overflow.  Returns NULL or a static reason. */
static const char *type_problem(const IrType *t, int allow_void) {
  if ((int)t->dtype < 0 || t->dtype >= IR_DTYPE_COUNT || (t->dtype == IR_VOID && !allow_void))
    return "bad dtype";
  if (t->rank < 0 || t->rank > IR_MAX_RANK) return "rank out of range";
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dim[i] < 1) return "dims must be >= 1";
    if (t->dim[i] > TS_BIG || n > INT64_MAX / 4 / t->dim[i]) return "too many elements";
    n *= t->dim[i];
  }
  return NULL;
}

/* ---- leaves ---- */
static int shape_INPUT(Sx *x) {
  if (!x->n->sa || !*x->n->sa) return fail(x, "needs a name");
  return 0;
}
static int shape_STATE(Sx *x) {
  const IrState *s = state_ref(x, 0);
  if (!s) return -1;
  if (!ir_type_same_shape(&s->type, x->out)) {
    return fail(x, "type %s differs from state @%s : %s", tstr(x, x->out), s->name, tstr(x, &s->type));
  }
  return 0;
}
static int shape_FULL(Sx *x) { return 0; }

/* ---- elementwise: identical sizes and float dtype ---- */
static int ew_rule(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  *x->out = *a;
  for (int i = 1; i < x->n->nin; i++) {
    const IrType *b = opnd(x, i);
    if (b->dtype != a->dtype || !same_sizes(a, b))
      return fail(x, "operand types %s and %s differ", tstr(x, a), tstr(x, b));
    fill_names(x->out, b);
  }
  return 0;
}
/* add sub mul neg adds muls: f32, f64 or i32 (integer arithmetic) */
static int ew_int_rule(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (a->dtype != IR_I32) return ew_rule(x);
  if ((x->n->op == IR_OP_ADDS || x->n->op == IR_OP_MULS) &&
      !(x->n->fa[0] == floor(x->n->fa[0]) && fabs(x->n->fa[0]) <= 2147483647.0))
    return fail(x, "c = %g on the i32 operand %s must be an integer in i32's range", x->n->fa[0], tstr(x, a));
  *x->out = *a;
  for (int i = 1; i < x->n->nin; i++) {
    const IrType *b = opnd(x, i);
    if (b->dtype != IR_I32 || !same_sizes(a, b))
      return fail(x, "operand types %s and %s differ (no implicit int <-> float conversion: cast one)",
                  tstr(x, a), tstr(x, b));
    fill_names(x->out, b);
  }
  return 0;
}
#define EWI(name) static int shape_##name(Sx *x) { return ew_int_rule(x); }
EWI(ADD) EWI(SUB) EWI(MUL) EWI(ADDS) EWI(MULS) EWI(NEG)
#undef EWI
#define EW(name) static int shape_##name(Sx *x) { return ew_rule(x); }
EW(DIV) EW(EXP) EW(LOG) EW(SQRT)
EW(RSQRT) EW(TANH) EW(GELU_TANH) EW(GELU_ERF) EW(SILU) EW(RELU) EW(GELU_TANH_BWD)
EW(GELU_ERF_BWD) EW(SILU_BWD) EW(RELU_BWD) EW(EQ)
#undef EW

static int shape_NE_SCALAR(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (!ir_dtype_is_float(x->out->dtype))
    return fail(x, "result %s must be float", tstr(x, x->out));
  if (!same_sizes(a, x->out))
    return fail(x, "result %s and operand %s differ in shape", tstr(x, x->out), tstr(x, a));
  return 0;
}
static int shape_CAST(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (!same_sizes(a, x->out))
    return fail(x, "result %s and operand %s differ in shape", tstr(x, x->out), tstr(x, a));
  return 0;
}

/* ---- integer tensors and indexing ---- */
static int num_dtype(IrDtype t) { return ir_dtype_is_float(t) || t == IR_I32; }
static int shape_CMP(Sx *x) {
  const IrType *a = opnd(x, 0), *b = opnd(x, 1);
  if (x->n->ia[0] < 0 || x->n->ia[0] > 5) return fail(x, "pred %lld is not 0..5", (long long)x->n->ia[0]);
  if (!num_dtype(a->dtype) || b->dtype != a->dtype || !same_sizes(a, b))
    return fail(x, "operand types %s and %s must be equal (f32, f64 or i32)", tstr(x, a), tstr(x, b));
  *x->out = *a;
  fill_names(x->out, b);
  return 0;
}
static int shape_WHERE(Sx *x) {
  const IrType *c = opnd(x, 0), *a = opnd(x, 1), *b = opnd(x, 2);
  if (!num_dtype(a->dtype) || b->dtype != a->dtype || !same_sizes(a, b))
    return fail(x, "branches %s and %s must have one type (f32, f64 or i32)", tstr(x, a), tstr(x, b));
  if (!num_dtype(c->dtype) || !same_sizes(c, a))
    return fail(x, "condition %s must have the branches' shape %s", tstr(x, c), tstr(x, a));
  *x->out = *a;
  fill_names(x->out, b);
  return 0;
}
static int int_bin(Sx *x) {
  const IrType *a = opnd(x, 0), *b = opnd(x, 1);
  if (a->dtype != IR_I32 || b->dtype != IR_I32 || !same_sizes(a, b))
    return fail(x, "operands %s and %s must be i32 of one shape", tstr(x, a), tstr(x, b));
  *x->out = *a;
  fill_names(x->out, b);
  return 0;
}
static int shape_FLOORDIV(Sx *x) { return int_bin(x); }
static int shape_MOD(Sx *x) { return int_bin(x); }
static int shape_ARANGE(Sx *x) {
  int64_t ax = x->n->ia[0];
  if (!num_dtype(x->out->dtype)) return fail(x, "result %s must be f32, f64 or i32", tstr(x, x->out));
  if (ax < 0 || ax >= x->out->rank) return fail(x, "axis %lld is not a dim of %s", (long long)ax, tstr(x, x->out));
  return 0;
}
static int shape_RAND(Sx *x) {
  double lo = x->n->fa[0], hi = x->n->fa[1];
  if (!num_dtype(x->out->dtype)) return fail(x, "result %s must be f32, f64 or i32", tstr(x, x->out));
  if (!(lo < hi)) return fail(x, "needs lo < hi, got [%g, %g)", lo, hi);
  if (x->out->dtype == IR_I32 && (lo != floor(lo) || hi != floor(hi) || lo < -2147483648.0 || hi > 2147483648.0))
    return fail(x, "i32 bounds [%g, %g) must be integers in i32's range", lo, hi);
  return 0;
}
/* x and idx: equal rank, equal dims except along axis */
static int gather_dims(Sx *x, const IrType *xt, const IrType *idx, int64_t ax, const char *what) {
  if (idx->dtype != IR_I32) return fail(x, "idx %s must be i32", tstr(x, idx));
  if (xt->rank != idx->rank || ax < 0 || ax >= xt->rank)
    return fail(x, "%s %s and idx %s must have one rank, with axis %lld a dim of both", what, tstr(x, xt), tstr(x, idx),
                (long long)ax);
  for (int d = 0; d < xt->rank; d++)
    if (d != ax && xt->dim[d] != idx->dim[d])
      return fail(x, "%s %s and idx %s differ in dim %d (only axis %lld may differ)", what, tstr(x, xt), tstr(x, idx), d,
                  (long long)ax);
  return 0;
}
static int shape_GATHER(Sx *x) {
  const IrType *a = opnd(x, 0), *idx = opnd(x, 1);
  if (!num_dtype(a->dtype)) return fail(x, "x %s must be f32, f64 or i32", tstr(x, a));
  if (gather_dims(x, a, idx, x->n->ia[0], "x")) return -1;
  *x->out = *idx;
  x->out->dtype = a->dtype;
  return 0;
}
static int shape_GATHER_BWD(Sx *x) {
  const IrType *idx = opnd(x, 0), *dy = opnd(x, 1);
  if (!ir_dtype_is_float(x->out->dtype)) return fail(x, "result %s must be float", tstr(x, x->out));
  if (gather_dims(x, x->out, idx, x->n->ia[0], "result")) return -1;
  if (dy->dtype != x->out->dtype || !same_sizes(dy, idx))
    return fail(x, "dy %s must have idx's shape %s and the result's dtype", tstr(x, dy), tstr(x, idx));
  return 0;
}

/* ---- layout ---- */
static int shape_RESHAPE(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (a->dtype != x->out->dtype || ir_type_numel(a) != ir_type_numel(x->out))
    return fail(x, "cannot reshape %s to %s (element count or dtype differs)", tstr(x, a), tstr(x, x->out));
  return 0;
}

static int shape_PERMUTE(Sx *x) {
  const IrType *a = opnd(x, 0);
  int seen[IR_MAX_RANK] = {0};
  *x->out = *a;
  for (int i = 0; i < a->rank; i++) {
    int64_t p = x->n->ia[i];
    if (p < 0 || p >= a->rank || seen[p])
      return fail(x, "perm is not a permutation of 0..%d for %s", a->rank - 1, tstr(x, a));
    seen[p] = 1;
    x->out->dim[i] = a->dim[p];
    x->out->dname[i] = a->dname[p];
  }
  return 0;
}

static int shape_SLICE(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_axis(x, 0, a->rank)) return -1;
  int ax = (int)x->n->ia[0];
  int64_t s = x->n->ia[1], e = x->n->ia[2];
  if (s < 0 || s >= e || e > a->dim[ax])
    return fail(x, "start=%lld end=%lld invalid for axis %d of %s", (long long)s, (long long)e, ax, tstr(x, a));
  *x->out = *a;
  x->out->dim[ax] = e - s;
  if (e - s != a->dim[ax]) x->out->dname[ax] = NULL;   /* a part is no longer that dim */
  return 0;
}

static int shape_PAD(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_axis(x, 0, a->rank)) return -1;
  int ax = (int)x->n->ia[0];
  int64_t lo = x->n->ia[1], hi = x->n->ia[2];
  if (lo < 0 || hi < 0 || lo > TS_BIG || hi > TS_BIG)
    return fail(x, "before=%lld after=%lld must be >= 0", (long long)lo, (long long)hi);
  *x->out = *a;
  x->out->dim[ax] = a->dim[ax] + lo + hi;
  if (lo || hi) x->out->dname[ax] = NULL;
  return 0;
}

static int shape_CONCAT(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_axis(x, 0, a->rank)) return -1;
  int ax = (int)x->n->ia[0];
  *x->out = *a;
  for (int i = 1; i < x->n->nin; i++) {
    const IrType *b = opnd(x, i);
    int ok = b->dtype == a->dtype && b->rank == a->rank;
    for (int d = 0; ok && d < a->rank; d++)
      if (d != ax && b->dim[d] != a->dim[d]) ok = 0;
    if (!ok) return fail(x, "operands %s and %s do not concatenate along axis %d", tstr(x, a), tstr(x, b), ax);
    x->out->dim[ax] += b->dim[ax];
    if (x->out->dim[ax] > TS_BIG) return fail(x, "result too large");
    fill_names(x->out, b);
  }
  if (x->n->nin > 1) x->out->dname[ax] = NULL;
  return 0;
}

static int shape_BROADCAST(Sx *x) {
  const IrType *a = opnd(x, 0), *r = x->out;
  int ok = a->dtype == r->dtype && a->rank <= r->rank;
  for (int i = 0; ok && i < a->rank; i++) {
    int64_t d = a->dim[a->rank - 1 - i], e = r->dim[r->rank - 1 - i];
    if (d != e && d != 1) ok = 0;
  }
  if (!ok) return fail(x, "cannot broadcast %s to %s", tstr(x, a), tstr(x, r));
  return 0;
}

static int shape_SUM_TO(Sx *x) {
  const IrType *a = opnd(x, 0), *r = x->out;
  int ok = a->dtype == r->dtype && r->rank <= a->rank;
  for (int i = 0; ok && i < r->rank; i++) {
    int64_t d = a->dim[a->rank - 1 - i], e = r->dim[r->rank - 1 - i];
    if (d != e && e != 1) ok = 0;
  }
  if (!ok) return fail(x, "cannot sum %s down to %s", tstr(x, a), tstr(x, r));
  return 0;
}

/* ---- reductions ---- */
static int reduce_rule(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0) || need_axis(x, 0, a->rank) || need_bool(x, 1)) return -1;
  int ax = (int)x->n->ia[0];
  *x->out = *a;
  if (x->n->ia[1]) {
    x->out->dim[ax] = 1;
    x->out->dname[ax] = NULL;
  } else {
    for (int i = ax; i + 1 < a->rank; i++) {
      x->out->dim[i] = a->dim[i + 1];
      x->out->dname[i] = a->dname[i + 1];
    }
    x->out->rank--;
    x->out->dim[x->out->rank] = 0;
    x->out->dname[x->out->rank] = NULL;
  }
  return 0;
}
static int shape_SUM(Sx *x) { return reduce_rule(x); }
static int shape_MEAN(Sx *x) { return reduce_rule(x); }
static int shape_MAX(Sx *x) { return reduce_rule(x); }
static int shape_SUMSQ(Sx *x) {
  if (need_float(x, 0)) return -1;
  memset(x->out, 0, sizeof *x->out);
  x->out->dtype = opnd(x, 0)->dtype;
  return 0;
}

/* ---- contraction ---- */
static int contract(Sx *x, const IrType *a0, const IrType *b0, IrDtype rd);
/* a[..., M, K] @ b[K, N] or a[..., M, K] @ b[..., K, N] -> [..., M, N]. */
static int shape_MATMUL(Sx *x) {
  if (need_bool(x, 0) || need_bool(x, 1)) return -1;
  const IrType *a0 = opnd(x, 0), *b0 = opnd(x, 1);
  if (a0->rank < 2 || b0->rank < 2)
    return fail(x, "operands %s and %s must have rank >= 2", tstr(x, a0), tstr(x, b0));
  if (!(ir_dtype_is_float(a0->dtype) || ir_dtype_is_16(a0->dtype)) || a0->dtype != b0->dtype)
    return fail(x, "operands %s and %s must have the same float dtype (f32, f64, or both bf16 or both f16: "
                "pass precision rounds an f32 operand next to a 16-bit one)", tstr(x, a0), tstr(x, b0));
  /* the result: the operands' dtype, or f32 when given for 16-bit operands
   * (the f32 accumulator stored without rounding to 16 bits) */
  IrDtype rd = x->n->type.dtype == IR_VOID ? a0->dtype : x->n->type.dtype;
  if (rd != a0->dtype && !(rd == IR_F32 && ir_dtype_is_16(a0->dtype)))
    return fail(x, "result dtype %s: a matmul of %s operands stores %s%s", ir_dtype_name(rd), ir_dtype_name(a0->dtype),
                ir_dtype_name(a0->dtype), ir_dtype_is_16(a0->dtype) ? " or f32" : "");
  return contract(x, a0, b0, rd);
}
/* matmul's shapes (ta / tb in ia[0], ia[1]) into x->out with dtype rd */
static int contract(Sx *x, const IrType *a0, const IrType *b0, IrDtype rd) {
  IrType a = *a0, b = *b0;      /* apply the transposes of the last two dims */
  if (x->n->ia[0]) {
    int r = a.rank;
    a.dim[r - 2] = a0->dim[r - 1]; a.dim[r - 1] = a0->dim[r - 2];
    a.dname[r - 2] = a0->dname[r - 1]; a.dname[r - 1] = a0->dname[r - 2];
  }
  if (x->n->ia[1]) {
    int r = b.rank;
    b.dim[r - 2] = b0->dim[r - 1]; b.dim[r - 1] = b0->dim[r - 2];
    b.dname[r - 2] = b0->dname[r - 1]; b.dname[r - 1] = b0->dname[r - 2];
  }
  int64_t K = a.dim[a.rank - 1], K2 = b.dim[b.rank - 2];
  if (K != K2)
    return fail(x, "operand shapes %s and %s do not contract (%lld vs %lld)", tstr(x, a0), tstr(x, b0),
                (long long)K, (long long)K2);
  if (b.rank != 2) {
    int ok = b.rank == a.rank;
    for (int i = 0; ok && i < a.rank - 2; i++)
      if (a.dim[i] != b.dim[i]) ok = 0;
    if (!ok)
      return fail(x, "operand shapes %s and %s: batch dims differ (b must be [K, N] or match a's batch dims)",
                  tstr(x, a0), tstr(x, b0));
  }
  *x->out = a;
  x->out->dtype = rd;
  x->out->dim[a.rank - 1] = b.dim[b.rank - 1];
  x->out->dname[a.rank - 1] = b.dname[b.rank - 1];
  return 0;
}

/* ---- neural-network ops ---- */
static int lastaxis_rule(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  if (a->rank < 1) return fail(x, "operand %s must have rank >= 1", tstr(x, a));
  *x->out = *a;
  return 0;
}
static int bwd_rule(Sx *x) {
  if (lastaxis_rule(x)) return -1;
  const IrType *a = opnd(x, 0), *b = opnd(x, 1);
  if (!ir_type_same_shape(a, b)) return fail(x, "operand types %s and %s differ", tstr(x, a), tstr(x, b));
  fill_names(x->out, b);
  return 0;
}
static int need_eps(Sx *x) {
  double e = x->n->fa[0];
  if (e > 0 && isfinite(e)) return 0;
  return fail(x, "eps must be > 0, got %g", e);
}
static int shape_SOFTMAX(Sx *x) { return lastaxis_rule(x); }
static int shape_SOFTMAX_BWD(Sx *x) { return bwd_rule(x); }
static int shape_LOG_SOFTMAX(Sx *x) { return lastaxis_rule(x); }
static int shape_LOG_SOFTMAX_BWD(Sx *x) { return bwd_rule(x); }
static int shape_LAYERNORM(Sx *x) { return need_eps(x) || lastaxis_rule(x) ? -1 : 0; }
static int shape_LAYERNORM_BWD(Sx *x) { return need_eps(x) || bwd_rule(x) ? -1 : 0; }
static int shape_RMSNORM(Sx *x) { return need_eps(x) || lastaxis_rule(x) ? -1 : 0; }
static int shape_RMSNORM_BWD(Sx *x) { return need_eps(x) || bwd_rule(x) ? -1 : 0; }

/* (table [V, C], ids [...] i32) -> [..., C] */
static int shape_EMBEDDING(Sx *x) {
  const IrType *t = opnd(x, 0), *ids = opnd(x, 1);
  if (t->rank != 2 || !ir_dtype_is_float(t->dtype))
    return fail(x, "table %s must be a float [V, C] matrix", tstr(x, t));
  if (ids->dtype != IR_I32) return fail(x, "ids %s must be i32", tstr(x, ids));
  if (ids->rank + 1 > IR_MAX_RANK) return fail(x, "ids %s: result rank too large", tstr(x, ids));
  *x->out = *ids;
  x->out->dtype = t->dtype;
  x->out->dim[ids->rank] = t->dim[1];
  x->out->dname[ids->rank] = t->dname[1];
  x->out->rank = ids->rank + 1;
  return 0;
}

/* (ids [...] i32, dy [..., C]) -> [V, C] given */
static int shape_EMBEDDING_BWD(Sx *x) {
  const IrType *ids = opnd(x, 0), *dy = opnd(x, 1), *r = x->out;
  if (r->rank != 2 || !ir_dtype_is_float(r->dtype))
    return fail(x, "result %s must be a float [V, C] matrix", tstr(x, r));
  if (ids->dtype != IR_I32) return fail(x, "ids %s must be i32", tstr(x, ids));
  int ok = dy->dtype == r->dtype && dy->rank == ids->rank + 1 && dy->dim[ids->rank] == r->dim[1];
  for (int i = 0; ok && i < ids->rank; i++)
    if (dy->dim[i] != ids->dim[i]) ok = 0;
  if (!ok) return fail(x, "dy %s must be ids %s dims + [%lld] of dtype %s", tstr(x, dy), tstr(x, ids),
                       (long long)r->dim[1], ir_dtype_name(r->dtype));
  return 0;
}

static int shape_CAUSAL_MASK(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  if (a->rank < 2) return fail(x, "operand %s must have rank >= 2", tstr(x, a));
  *x->out = *a;
  return 0;
}

static int shape_MASKED_FILL(Sx *x) {
  const IrType *a = opnd(x, 0), *k = opnd(x, 1);
  if (need_float(x, 0)) return -1;
  if (!same_sizes(a, k)) return fail(x, "x %s and keep %s differ in shape", tstr(x, a), tstr(x, k));
  *x->out = *a;
  fill_names(x->out, k);
  return 0;
}

static int shape_DROPOUT(Sx *x) {
  double p = x->n->fa[0];
  if (!(p >= 0 && p < 1)) return fail(x, "p must be in [0, 1), got %g", p);
  if (x->n->ia[0] < 0) return fail(x, "stream must be >= 0");
  if (need_float(x, 0)) return -1;
  *x->out = *opnd(x, 0);
  return 0;
}

static int shape_ROPE(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0) || need_bool(x, 1)) return -1;
  if (a->rank < 2) return fail(x, "operand %s must have rank >= 2", tstr(x, a));
  if (x->n->ia[0] < 0 || x->n->ia[0] >= a->rank - 1)
    return fail(x, "axis=%lld must name a dim before the last of %s", (long long)x->n->ia[0], tstr(x, a));
  if (a->dim[a->rank - 1] % 2) return fail(x, "last dim of %s must be even", tstr(x, a));
  double base = x->n->fa[0];
  if (!(base > 0) || !isfinite(base)) return fail(x, "base must be > 0, got %g", base);
  *x->out = *a;
  return 0;
}

static int shape_TOPK_MASK(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  if (a->rank < 1) return fail(x, "operand %s must have rank >= 1", tstr(x, a));
  int64_t k = x->n->ia[0], d = a->dim[a->rank - 1];
  if (k < 1 || k > d) return fail(x, "k=%lld must be in [1, %lld] (the last dim of %s)", (long long)k, (long long)d, tstr(x, a));
  *x->out = *a;
  return 0;
}

static int shape_CAPACITY_MASK(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  if (a->rank < 1) return fail(x, "operand %s must have rank >= 1", tstr(x, a));
  if (x->n->ia[0] < 0) return fail(x, "cap=%lld must be >= 0", (long long)x->n->ia[0]);
  *x->out = *a;
  return 0;
}

/* ---- sparse MoE dispatch (ops.def): routed [N, E], token / expert layouts ---- */
static int routed_check(Sx *x, int i, int64_t *N, int64_t *E) {
  const IrType *r = opnd(x, i);
  if (need_float(x, i)) return -1;
  if (r->rank != 2) return fail(x, "routing mask %s must be [tokens, experts]", tstr(x, r));
  *N = r->dim[0];
  *E = r->dim[1];
  return 0;
}
static int same_as(Sx *x, int i, int j) {
  const IrType *a = opnd(x, i), *b = opnd(x, j);
  if (a->dtype == b->dtype && same_sizes(a, b)) return 0;
  return fail(x, "operands %d %s and %d %s must have the same type", i + 1, tstr(x, a), j + 1, tstr(x, b));
}
static int rows_of(Sx *x, int i, int64_t N, const char *what) {
  const IrType *a = opnd(x, i);
  if (need_float(x, i)) return -1;
  if (a->rank != 2) return fail(x, "%s %s must be a matrix", what, tstr(x, a));
  if (N >= 0 && a->dim[0] != N) return fail(x, "%s %s must have %lld rows", what, tstr(x, a), (long long)N);
  return 0;
}
static int cnt_check(Sx *x, int i, int64_t G) {
  const IrType *c = opnd(x, i);
  if (c->dtype != IR_I32 || c->rank != 2 || (G >= 0 && c->dim[1] != G)) {
    if (G < 0) return fail(x, "counts %s must be i32[sources, groups]", tstr(x, c));
    return fail(x, "counts %s must be i32[sources, %lld]", tstr(x, c), (long long)G);
  }
  return 0;
}
static int shape_MOE_COUNTS(Sx *x) {
  int64_t N, E;
  if (routed_check(x, 0, &N, &E)) return -1;
  *x->out = (IrType){.dtype = IR_I32, .rank = 2, .dim = {1, E}};
  x->out->dname[1] = opnd(x, 0)->dname[1];
  return 0;
}
static int shape_MOE_PERM(Sx *x) {
  int64_t N, E;
  if (routed_check(x, 1, &N, &E) || same_as(x, 1, 2) || rows_of(x, 0, N, "tokens")) return -1;
  if (opnd(x, 0)->dtype != opnd(x, 1)->dtype) return fail(x, "tokens and routing mask must have one dtype");
  if (x->n->ia[0] < 1 || x->n->ia[0] > TS_BIG) return fail(x, "rows=%lld must be >= 1", (long long)x->n->ia[0]);
  *x->out = *opnd(x, 0);
  x->out->dim[0] = x->n->ia[0];
  x->out->dname[0] = NULL;
  return 0;
}
static int shape_MOE_UNPERM(Sx *x) {
  int64_t N, E;
  if (routed_check(x, 1, &N, &E) || same_as(x, 1, 2) || rows_of(x, 0, -1, "rows")) return -1;
  if (opnd(x, 0)->dtype != opnd(x, 1)->dtype) return fail(x, "rows and routing mask must have one dtype");
  *x->out = *opnd(x, 0);
  x->out->dim[0] = N;
  x->out->dname[0] = opnd(x, 1)->dname[0];
  return 0;
}
static int shape_MOE_GATE_GRAD(Sx *x) {
  int64_t N, E;
  if (routed_check(x, 2, &N, &E) || rows_of(x, 0, -1, "rows") || rows_of(x, 1, N, "token gradient")) return -1;
  const IrType *y = opnd(x, 0), *d = opnd(x, 1);
  if (y->dim[1] != d->dim[1] || y->dtype != d->dtype || y->dtype != opnd(x, 2)->dtype)
    return fail(x, "rows %s and token gradient %s must have one width and dtype", tstr(x, y), tstr(x, d));
  *x->out = *opnd(x, 2);
  return 0;
}
static int shape_GMM(Sx *x) {
  const IrType *a = opnd(x, 0), *w = opnd(x, 1);
  if (rows_of(x, 0, -1, "rows") || need_float(x, 1) || need_bool(x, 0)) return -1;
  if (w->rank != 3 || w->dtype != a->dtype) return fail(x, "weights %s must be [groups, K, N] of %s's dtype", tstr(x, w), tstr(x, a));
  int tb = (int)x->n->ia[0];
  int64_t K = tb ? w->dim[2] : w->dim[1], Nn = tb ? w->dim[1] : w->dim[2];
  if (K != a->dim[1]) return fail(x, "rows %s and weights %s%s: inner dims differ", tstr(x, a), tstr(x, w), tb ? " (tb)" : "");
  if (cnt_check(x, 2, w->dim[0])) return -1;
  *x->out = *a;
  x->out->dim[1] = Nn;
  x->out->dname[1] = w->dname[tb ? 1 : 2];
  return 0;
}
static int shape_GMM_DW(Sx *x) {
  const IrType *a = opnd(x, 0), *d = opnd(x, 1), *c = opnd(x, 2);
  if (rows_of(x, 0, -1, "rows") || rows_of(x, 1, a->dim[0], "row gradient") || cnt_check(x, 2, -1)) return -1;
  if (a->dtype != d->dtype) return fail(x, "%s and %s must have one dtype", tstr(x, a), tstr(x, d));
  *x->out = (IrType){.dtype = a->dtype, .rank = 3, .dim = {c->dim[1], a->dim[1], d->dim[1]}};
  x->out->dname[1] = a->dname[1];
  x->out->dname[2] = d->dname[1];
  return 0;
}

/* logits [..., V] and targets [...] must agree on the leading dims. */
static int ce_check(Sx *x) {
  const IrType *l = opnd(x, 0), *t = opnd(x, 1);
  if (need_float(x, 0)) return -1;
  if (t->dtype != IR_I32) return fail(x, "targets %s must be i32", tstr(x, t));
  int ok = l->rank >= 1 && t->rank == l->rank - 1;
  for (int i = 0; ok && i < t->rank; i++)
    if (t->dim[i] != l->dim[i]) ok = 0;
  if (!ok) return fail(x, "logits %s and targets %s: targets must be logits' dims without the last",
                       tstr(x, l), tstr(x, t));
  return 0;
}
static int shape_CROSS_ENTROPY(Sx *x) {
  if (ce_check(x)) return -1;
  const IrType *l = opnd(x, 0), *t = opnd(x, 1);
  *x->out = *t;
  x->out->dtype = l->dtype;
  for (int i = 0; i < t->rank; i++)
    if (l->dname[i]) x->out->dname[i] = l->dname[i];
  return 0;
}
static int shape_CROSS_ENTROPY_BWD(Sx *x) {
  if (ce_check(x)) return -1;
  const IrType *l = opnd(x, 0), *t = opnd(x, 1), *d = opnd(x, 2);
  if (d->dtype != l->dtype || !same_sizes(d, t))
    return fail(x, "dloss %s must have the shape of targets %s and the dtype of logits %s",
                tstr(x, d), tstr(x, t), tstr(x, l));
  *x->out = *l;
  return 0;
}

/* ---- step program ---- */
static int scalar_float(Sx *x, int i, const char *what) {
  const IrType *a = opnd(x, i);
  if (a->rank == 0 && ir_dtype_is_float(a->dtype)) return 0;
  return fail(x, "%s %s must be a float scalar", what, tstr(x, a));
}
/* Fused attention: q [B, Hq, Tq, D], k / v [B, Hkv, Tk, D] with Hq a
 * multiple of Hkv (grouped-query) -> [B, Hq, Tq, D]. */
static int check_qkv(Sx *x);
/* The node has `base` operands, or base + 1 with the document ids last:
 * i32 [B, T], T the whole sequence (the kernels index it by global
 * position, so it is never split along T). */
static int check_doc(Sx *x, int base) {
  int nin = x->n->nin, al = x->n->ia[ir_attn_alibi_attr(x->n->op)] != 0, ba = ir_attn_bias_attr(x->n->op);
  int bi = ba >= 0 && x->n->ia[ba] != 0;
  if (x->n->ia[ir_attn_alibi_attr(x->n->op)] != 0 && x->n->ia[ir_attn_alibi_attr(x->n->op)] != 1)
    return fail(x, "alibi must be 0 or 1, got %lld", (long long)x->n->ia[ir_attn_alibi_attr(x->n->op)]);
  if (ba >= 0 && x->n->ia[ba] != 0 && x->n->ia[ba] != 1)
    return fail(x, "bias must be 0 or 1, got %lld", (long long)x->n->ia[ba]);
  if (nin != base + al + bi && nin != base + al + bi + 1)
    return fail(x, "takes %d operands%s%s, or %d with the document ids last; got %d", base + al + bi,
                al ? " (the slopes last)" : "", bi ? " (the score bias last)" : "", base + al + bi + 1, nin);
  const IrType *q = opnd(x, 0);
  if (al) {   /* ALiBi's slopes: every query head's (whole: the kernels index them by global head) */
    const IrType *sl = opnd(x, base);
    if ((sl->dtype != IR_F32 && sl->dtype != IR_F64) || sl->rank != 1 || sl->dim[0] < 1 || q->rank != 4 ||
        q->dim[1] < 1 || sl->dim[0] % q->dim[1])
      return fail(x, "ALiBi slopes %s must be f32 or f64 [heads], one per query head of q %s (all of them when "
                  "the heads are split)", tstr(x, sl), tstr(x, q));
  }
  if (bi) {   /* the score bias: this rank's query heads (or one for all), local query and key rows */
    const IrType *b = opnd(x, base + al), *k = opnd(x, 1);
    if (b->dtype != q->dtype || b->rank != 3 || q->rank != 4 || k->rank != 4 ||
        (b->dim[0] != q->dim[1] && b->dim[0] != 1) || b->dim[1] != q->dim[2] || b->dim[2] != k->dim[2])
      return fail(x, "score bias %s must be q %s's dtype and [heads, queries, keys] = [%lld (or 1), %lld, %lld]",
                  tstr(x, b), tstr(x, q), (long long)(q->rank == 4 ? q->dim[1] : 0),
                  (long long)(q->rank == 4 ? q->dim[2] : 0), (long long)(k->rank == 4 ? k->dim[2] : 0));
  }
  if (nin == base + al + bi) return 0;
  const IrType *d = opnd(x, base + al + bi);
  if (d->dtype != IR_I32 || d->rank != 2 || d->dim[0] != q->dim[0] || d->dim[1] < 1)
    return fail(x, "document ids %s must be i32 [batch, seq] with q %s's batch", tstr(x, d), tstr(x, q));
  return 0;
}
static int check_window(Sx *x) {
  int64_t w = ir_attn_window(x->n);
  if (w < 0) return fail(x, "window must be >= 0 (0: none), got %lld", (long long)w);
  return 0;
}
static int check_attention(Sx *x, int base) {
  if (need_bool(x, 0) || check_doc(x, base) || check_window(x)) return -1;
  return check_qkv(x);
}
static int check_qkv(Sx *x) {
  const IrType *q = opnd(x, 0), *k = opnd(x, 1), *v = opnd(x, 2);
  for (int i = 0; i < 3; i++)
    if (need_float(x, i)) return -1;
  if (q->rank != 4 || k->rank != 4 || v->rank != 4)
    return fail(x, "q %s, k %s and v %s must be [batch, heads, seq, head_dim]", tstr(x, q), tstr(x, k),
                tstr(x, v));
  if (k->dtype != q->dtype || v->dtype != q->dtype || !same_sizes(k, v) || k->dim[0] != q->dim[0] ||
      k->dim[3] != q->dim[3])
    return fail(x, "k %s and v %s must match q %s in dtype, batch and head_dim (and each other)", tstr(x, k),
                tstr(x, v), tstr(x, q));
  if (k->dim[1] < 1 || q->dim[1] % k->dim[1])
    return fail(x, "query heads of q %s must be a multiple of the kv heads of k %s", tstr(x, q), tstr(x, k));
  double s = x->n->fa[0];
  if (!isfinite(s)) return fail(x, "scale must be finite, got %g", s);
  return 0;
}

static int shape_ATTENTION(Sx *x) {
  if (check_attention(x, 3)) return -1;
  *x->out = *opnd(x, 0);
  return 0;
}

/* (q, k, v, o, do): o and do shaped like q; the result is shaped like q,
 * k or v by part. */
static int shape_ATTENTION_BWD(Sx *x) {
  if (check_attention(x, 5)) return -1;
  const IrType *q = opnd(x, 0), *o = opnd(x, 3), *dy = opnd(x, 4);
  if (!ir_type_same_shape(o, q) || !ir_type_same_shape(dy, q) || o->dtype != q->dtype || dy->dtype != q->dtype)
    return fail(x, "o %s and do %s must be shaped like q %s", tstr(x, o), tstr(x, dy), tstr(x, q));
  int64_t part = x->n->ia[1];
  if (part == 3 && ir_attn_bias(x->n) >= 0) {   /* dbias, shaped like the bias */
    *x->out = *opnd(x, ir_attn_bias(x->n));
    return 0;
  }
  if (part < 0 || part > 2)
    return fail(x, "part must be 0 (dq), 1 (dk), 2 (dv) or, with bias=1, 3 (dbias), got %lld", (long long)part);
  *x->out = *opnd(x, (int)part);
  return 0;
}

/* ---- ring attention steps ---- */
/* operand i must have q's dtype and q's dims with the last one `last`
 * (-1: dropped) */
static int like_q(Sx *x, int i, int64_t last, const char *what) {
  const IrType *q = opnd(x, 0), *a = opnd(x, i);
  IrType want = *q;
  if (last < 0) want.rank--;
  else want.dim[3] = last;
  if (a->dtype == q->dtype && same_sizes(a, &want)) return 0;
  return fail(x, "%s %s must be q %s's dtype and shape%s", what, tstr(x, a), tstr(x, q),
              last < 0 ? " without head_dim" : last == q->dim[3] ? "" : " with head_dim + 2 columns");
}
static int ring_attrs(Sx *x, int base) {
  if (need_bool(x, 0) || check_doc(x, base) || check_window(x)) return -1;
  if (x->n->ia[1] < 0 || x->n->ia[1] > 4096) return fail(x, "src=%lld must be a ring step >= 0", (long long)x->n->ia[1]);
  if (!isfinite(x->n->fa[0])) return fail(x, "scale must be finite, got %g", x->n->fa[0]);
  return check_qkv(x);
}
static int shape_ATTN_ACC(Sx *x) {
  if (ring_attrs(x, 4) || like_q(x, 3, opnd(x, 0)->dim[3] + 2, "state")) return -1;
  *x->out = *opnd(x, 3);
  return 0;
}
static int state_of(Sx *x) {
  const IrType *st = opnd(x, 0);
  if (need_float(x, 0)) return -1;
  if (st->rank != 4 || st->dim[3] < 3) return fail(x, "state %s must be [B, H, T, head_dim + 2]", tstr(x, st));
  *x->out = *st;
  return 0;
}
static int shape_ATTN_FINISH(Sx *x) {
  if (state_of(x)) return -1;
  x->out->dim[3] -= 2;
  x->out->dname[3] = NULL;
  return 0;
}
static int shape_ATTN_LSE(Sx *x) {
  if (state_of(x)) return -1;
  x->out->rank = 3;
  return 0;
}
static int ring_bwd(Sx *x, int acc_like) {
  if (ring_attrs(x, 7) || like_q(x, 3, opnd(x, 0)->dim[3], "do") || like_q(x, 4, -1, "lse") ||
      like_q(x, 5, -1, "drow"))
    return -1;
  const IrType *want = opnd(x, acc_like), *a = opnd(x, 6);
  if (a->dtype != want->dtype || !same_sizes(a, want))
    return fail(x, "accumulator %s must be shaped like %s", tstr(x, a), tstr(x, want));
  *x->out = *a;
  return 0;
}
static int shape_ATTN_BWD_Q(Sx *x) { return ring_bwd(x, 0); }
static int shape_ATTN_BWD_KV(Sx *x) {
  if (x->n->ia[2] != 1 && x->n->ia[2] != 2) return fail(x, "part must be 1 (dk) or 2 (dv), got %lld", (long long)x->n->ia[2]);
  return ring_bwd(x, 1);
}

/* ---- generation (pass decode): a position operand, i32 [] ---- */
static int pos_operand(Sx *x, int i) {
  const IrType *p = opnd(x, i);
  if (p->dtype == IR_I32 && p->rank == 0) return 0;
  return fail(x, "position %s must be an i32 scalar", tstr(x, p));
}
static int shape_ATTN_CACHED(Sx *x) {
  if (x->n->nin != 4 && x->n->nin != 5)
    return fail(x, "takes 4 operands (q, k, v, pos), or 5 with ALiBi's slopes last; got %d", x->n->nin);
  if (check_qkv(x) || pos_operand(x, 3)) return -1;
  if (x->n->nin == 5) {   /* as attention's: every query head's slope (the kernels index them by global head) */
    const IrType *sl = opnd(x, 4), *q = opnd(x, 0);
    if ((sl->dtype != IR_F32 && sl->dtype != IR_F64) || sl->rank != 1 || sl->dim[0] < 1 || q->dim[1] < 1 ||
        sl->dim[0] % q->dim[1])
      return fail(x, "ALiBi slopes %s must be f32 or f64 [heads], one per query head of q %s (all of them when "
                  "the heads are split)", tstr(x, sl), tstr(x, q));
  }
  if (x->n->ia[0] < 0) return fail(x, "window must be >= 0 (0: none), got %lld", (long long)x->n->ia[0]);
  if (!isfinite(x->n->fa[0])) return fail(x, "scale must be finite, got %g", x->n->fa[0]);
  *x->out = *opnd(x, 0);
  return 0;
}
static int shape_ROPE_AT(Sx *x) { return pos_operand(x, 1) ? -1 : shape_ROPE(x); }
static int shape_SLICE_AT(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_axis(x, 0, a->rank) || pos_operand(x, 1)) return -1;
  int ax = (int)x->n->ia[0];
  int64_t n = x->n->ia[1];
  if (n < 1 || n > a->dim[ax]) return fail(x, "size=%lld invalid for axis %d of %s", (long long)n, ax, tstr(x, a));
  *x->out = *a;
  x->out->dim[ax] = n;
  return 0;
}
/* kv_write(x, pos) @cache axis: x has the state's dims but along axis (at
 * most the state's there) and its dtype. */
static int shape_KV_WRITE(Sx *x) {
  const IrState *s = state_ref(x, 0);
  if (!s) return -1;
  const IrType *a = opnd(x, 0);
  if (pos_operand(x, 1)) return -1;
  if (s->kind != IR_STATE_CACHE) return fail(x, "@%s is a %s, expected kind cache", s->name, ir_state_kind_name(s->kind));
  int64_t ax = x->n->ia[1];
  if (ax < 0 || ax >= s->type.rank) return fail(x, "axis=%lld out of range for @%s", (long long)ax, s->name);
  int ok = a->rank == s->type.rank && a->dtype == s->type.dtype;
  for (int d = 0; ok && d < a->rank; d++) ok = d == ax ? a->dim[d] >= 1 && a->dim[d] <= s->type.dim[d] : a->dim[d] == s->type.dim[d];
  if (!ok) return fail(x, "%s does not fit cache @%s : %s along axis %lld", tstr(x, a), s->name, tstr(x, &s->type), (long long)ax);
  return 0;
}

static int shape_CLIP_COEF(Sx *x) {
  if (scalar_float(x, 0, "norm")) return -1;
  if (!(x->n->fa[0] > 0)) return fail(x, "max must be > 0, got %g", x->n->fa[0]);
  *x->out = *opnd(x, 0);
  return 0;
}
/* any float tensor -> a scalar of its dtype, as sumsq */
static int shape_NONFINITE(Sx *x) { return shape_SUMSQ(x); }
/* (found[]) on four scalar scaler states */
static int shape_SCALE_UPDATE(Sx *x) {
  if (scalar_float(x, 0, "found")) return -1;
  for (int i = 0; i < 4; i++) {
    const IrState *s = state_ref(x, i);
    if (!s) return -1;
    if (s->kind != IR_STATE_SCALER || s->type.rank != 0)
      return fail(x, "@%s is a %s %s, expected a scalar of kind scaler", s->name, ir_state_kind_name(s->kind),
                  tstr(x, &s->type));
  }
  if (x->n->ia[4] < 1 || x->n->ia[5] < 1)
    return fail(x, "window=%lld and hysteresis=%lld must be >= 1", (long long)x->n->ia[4], (long long)x->n->ia[5]);
  if (!(x->n->fa[0] > 0)) return fail(x, "min must be > 0, got %g", x->n->fa[0]);
  return 0;
}
/* ---- fp8 ---- */
/* (x, scale[]) -> fp8 of x's shape: the result dtype given */
static int shape_QUANT8(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (!(ir_dtype_is_float(a->dtype) || ir_dtype_is_16(a->dtype)))
    return fail(x, "operand %s must be f32, f64, bf16 or f16", tstr(x, a));
  if (scalar_float(x, 1, "scale")) return -1;
  if (!ir_dtype_is_8(x->out->dtype) || !same_sizes(x->out, a))
    return fail(x, "result %s must be %s's shape in f8e4m3 or f8e5m2", tstr(x, x->out), tstr(x, a));
  fill_names(x->out, a);
  return 0;
}
/* a state of kind fp8 of rank `rank` (len: its one dim, when rank 1) */
static const IrState *fp8_state(Sx *x, int slot, int rank) {
  const IrState *s = state_ref(x, slot);
  if (!s) return NULL;
  if (s->kind != IR_STATE_FP8 || s->type.rank != rank || s->type.dtype != IR_F32) {
    fail(x, "@%s is a %s %s, expected an f32 %s of kind fp8", s->name, ir_state_kind_name(s->kind),
         tstr(x, &s->type), rank ? "vector" : "scalar");
    return NULL;
  }
  return s;
}
static int shape_AMAX_ACC(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (!(ir_dtype_is_float(a->dtype) || ir_dtype_is_16(a->dtype)))
    return fail(x, "operand %s must be f32, f64, bf16 or f16", tstr(x, a));
  return fp8_state(x, 0, 0) ? 0 : -1;
}
static int shape_MATMUL8(Sx *x) {
  if (need_bool(x, 0) || need_bool(x, 1)) return -1;
  const IrType *a0 = opnd(x, 0), *b0 = opnd(x, 1);
  if (!ir_dtype_is_8(a0->dtype) || !ir_dtype_is_8(b0->dtype) || a0->rank < 2 || b0->rank < 2)
    return fail(x, "operands %s and %s must be fp8 (f8e4m3 or f8e5m2) of rank >= 2", tstr(x, a0), tstr(x, b0));
  if (scalar_float(x, 2, "scale_inv of a") || scalar_float(x, 3, "scale_inv of b")) return -1;
  IrDtype rd = x->n->type.dtype;
  if (rd != IR_BF16 && rd != IR_F32) return fail(x, "result dtype %s: fp8 GEMMs store bf16 or f32", ir_dtype_name(rd));
  IrType given = *x->out;
  if (contract(x, a0, b0, rd)) return -1;
  if (!same_sizes(&given, x->out))
    return fail(x, "result %s: the operands give %s", tstr(x, &given), tstr(x, x->out));
  return 0;
}
static int shape_FP8_SCALE(Sx *x) {
  if (scalar_float(x, 0, "amax")) return -1;
  if (!fp8_state(x, 0, 1) || !fp8_state(x, 1, 0) || !fp8_state(x, 2, 0)) return -1;
  if (x->n->ia[3] != 0 && x->n->ia[3] != 1) return fail(x, "algo=%lld must be 0 (max) or 1 (most_recent)", (long long)x->n->ia[3]);
  if (!(x->n->fa[0] >= 0) || !(x->n->fa[1] > 0) || !isfinite(x->n->fa[1]))
    return fail(x, "margin %g must be >= 0 and fmax %g finite and > 0", x->n->fa[0], x->n->fa[1]);
  return 0;
}
/* accum and assign: the operand has the state's shape. */
static int state_operand(Sx *x) {
  const IrState *s = state_ref(x, 0);
  if (!s) return -1;
  const IrType *a = opnd(x, 0);
  if (!ir_type_same_shape(a, &s->type))
    return fail(x, "operand %s does not match state @%s : %s", tstr(x, a), s->name, tstr(x, &s->type));
  return 0;
}
static int shape_ACCUM(Sx *x) { return state_operand(x); }
static int shape_ZERO(Sx *x) { return state_ref(x, 0) ? 0 : -1; }
/* adamw, sgd, lion: (coef[], grad) on @param with nmom moment states
 * (adam_m, then adam_v), each the param's shape or all one flat chunk. */
static int shape_opt_step(Sx *x, int nmom) {
  if (scalar_float(x, 0, "coef")) return -1;
  static const IrStateKind kinds[3] = {IR_STATE_PARAM, IR_STATE_ADAM_M, IR_STATE_ADAM_V};
  const IrState *s[3];
  for (int i = 0; i < 1 + nmom; i++) {
    if (!(s[i] = state_ref(x, i))) return -1;
    if (s[i]->kind != kinds[i] && !(i == 0 && s[i]->kind == IR_STATE_SHARD))
      return fail(x, "@%s is a %s, expected kind %s", s[i]->name, ir_state_kind_name(s[i]->kind),
                  ir_state_kind_name(kinds[i]));
  }
  /* a ZeRO-3 shard: the parameter is itself the rank's flat chunk */
  if (s[0]->kind == IR_STATE_SHARD && !s[1]->sh.flat)
    return fail(x, "shard @%s needs flat moments, @%s is not", s[0]->name, s[1]->name);
  /* m and v: the param's shape, or (ZeRO) both a flat chunk [c] */
  const IrType *want = s[1]->sh.flat ? &s[1]->type : &s[0]->type;
  if (s[1]->sh.flat) {
    int64_t n = ir_type_numel(&s[0]->type), c = s[1]->type.dim[0];
    int64_t k = 1;   /* the ranks holding chunks: dp, or dp+cp (ZeRO over the joint group) */
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (s[1]->sh.flat & (1u << a)) k *= ir_axis_size(x->m, (IrAxis)a);
    if (s[1]->type.rank != 1 || c * k < n)
      return fail(x, "flat moment @%s : %s cannot hold a chunk of param @%s : %s", s[1]->name,
                  tstr(x, &s[1]->type), s[0]->name, tstr(x, &s[0]->type));
  }
  for (int i = 1; i < 1 + nmom; i++)
    if (!ir_type_same_shape(&s[i]->type, want) || s[i]->sh.flat != s[1]->sh.flat)
      return fail(x, "@%s : %s does not match @%s : %s", s[i]->name, tstr(x, &s[i]->type),
                  s[1]->name, tstr(x, want));
  const IrType *g = opnd(x, 1);
  if (!ir_type_same_shape(g, want))
    return fail(x, "grad %s must have the type of @%s : %s", tstr(x, g), s[1]->name, tstr(x, want));
  return 0;
}
static int shape_ADAMW(Sx *x) {
  if (shape_opt_step(x, 2)) return -1;
  const double *f = x->n->fa;
  if (!(f[0] >= 0 && f[0] < 1) || !(f[1] >= 0 && f[1] < 1))
    return fail(x, "b1=%g b2=%g must be in [0, 1)", f[0], f[1]);
  if (!(f[2] >= 0) || !(f[3] >= 0) || !isfinite(f[2]) || !isfinite(f[3]))
    return fail(x, "eps=%g wd=%g must be >= 0", f[2], f[3]);
  return 0;
}
static int shape_SGD(Sx *x) {
  if (shape_opt_step(x, 1)) return -1;
  const double *f = x->n->fa;
  if (!(f[0] >= 0 && f[0] < 1) || (f[1] != 0 && f[1] != 1) || !(f[2] >= 0) || !isfinite(f[2]))
    return fail(x, "mom=%g must be in [0, 1), nesterov=%g 0 or 1, wd=%g >= 0", f[0], f[1], f[2]);
  return 0;
}
static int shape_LION(Sx *x) {
  if (shape_opt_step(x, 1)) return -1;
  const double *f = x->n->fa;
  if (!(f[0] >= 0 && f[0] <= 1) || !(f[1] >= 0 && f[1] <= 1) || !(f[2] >= 0) || !isfinite(f[2]))
    return fail(x, "b1=%g b2=%g must be in [0, 1], wd=%g >= 0", f[0], f[1], f[2]);
  return 0;
}
static int shape_LR_STEP(Sx *x) {
  const IrState *p = state_ref(x, 0);
  if (!p) return -1;
  if (p->kind != IR_STATE_PARAM)
    return fail(x, "@%s is a %s, expected kind %s", p->name, ir_state_kind_name(p->kind), ir_state_kind_name(IR_STATE_PARAM));
  const IrType *u = opnd(x, 0);
  if (!ir_type_same_shape(u, &p->type))
    return fail(x, "update %s must have the type of @%s : %s", tstr(x, u), p->name, tstr(x, &p->type));
  const double *f = x->n->fa;
  if (!(f[0] > 0) || !isfinite(f[0]) || !(f[1] >= 0) || !isfinite(f[1]))
    return fail(x, "scale=%g must be > 0 and wd=%g >= 0", f[0], f[1]);
  return 0;
}
static int shape_ASSIGN(Sx *x) { return state_operand(x); }

/* ---- sharding ops ---- */
static int mesh_axis(Sx *x, int slot) {
  int64_t v = x->n->ia[slot];
  if (v >= 0 && v < IR_AXIS_COUNT) return 0;
  if (ir_axes_mask(v)) {
    char ax[32];
    return fail(x, "%s takes one mesh axis, not the set %s (only all_reduce, all_gather, reduce_scatter and "
                "shard_slice run over a set of axes)", ir_ops[x->n->op].name, ir_axes_str(v, ax, sizeof ax));
  }
  return fail(x, "mesh axis %lld out of range", (long long)v);
}
/* One axis or a set of axes (ir_axes_mask): the collectives a flat ZeRO
 * chunk over dp+cp needs. */
static int mesh_axes(Sx *x, int slot) {
  return ir_axes_mask(x->n->ia[slot]) ? 0 : mesh_axis(x, slot);
}
static int shape_ALL_REDUCE(Sx *x) {
  if (mesh_axes(x, 0) || need_float(x, 0)) return -1;
  if (x->n->ia[1] != 0 && x->n->ia[1] != 1) return fail(x, "red must be 0 (sum) or 1 (max)");
  *x->out = *opnd(x, 0);
  return 0;
}
/* all_gather multiplies dim by the axis size; reduce_scatter and
 * shard_slice divide it (which must be exact). */
static int axis_resize(Sx *x, int grow) {
  const IrType *a = opnd(x, 0);
  if (mesh_axes(x, 0) || need_axis(x, 1, a->rank)) return -1;
  int k = ir_axes_size(x->m, x->n->ia[0]);
  int d = (int)x->n->ia[1];
  *x->out = *a;
  if (grow) {
    x->out->dim[d] *= k;
  } else {
    char ax[32];
    if (a->dim[d] % k)
      return fail(x, "dim %d of %s is not divisible by the %s size %d", d, tstr(x, a),
                  ir_axes_str(x->n->ia[0], ax, sizeof ax), k);
    x->out->dim[d] /= k;
  }
  return 0;
}
static int shape_ALL_GATHER(Sx *x) { return axis_resize(x, 1); }   /* any dtype: bytes are copied */
static int shape_REDUCE_SCATTER(Sx *x) { return need_float(x, 0) ? -1 : axis_resize(x, 0); }
static int shape_SHARD_SLICE(Sx *x) { return axis_resize(x, 0); }
/* x[..., V] and idx[...] i32 agreeing on the leading dims. */
static int index_check(Sx *x, const IrType *v, const IrType *idx) {
  if (idx->dtype != IR_I32) return fail(x, "index %s must be i32", tstr(x, idx));
  int ok = v->rank >= 1 && idx->rank == v->rank - 1;
  for (int i = 0; ok && i < idx->rank; i++)
    if (idx->dim[i] != v->dim[i]) ok = 0;
  if (!ok) return fail(x, "%s and index %s: the index must have the dims of %s without the last",
                       tstr(x, v), tstr(x, idx), tstr(x, v));
  return 0;
}
static int shape_TAKE(Sx *x) {
  const IrType *v = opnd(x, 0), *idx = opnd(x, 1);
  if (need_float(x, 0) || index_check(x, v, idx)) return -1;
  *x->out = *idx;
  x->out->dtype = v->dtype;
  return 0;
}
static int shape_ONEHOT(Sx *x) {
  if (!ir_dtype_is_float(x->out->dtype)) return fail(x, "result %s must be float", tstr(x, x->out));
  return index_check(x, x->out, opnd(x, 0));
}
static int shape_PAD_FILL(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (need_float(x, 0) || need_axis(x, 0, a->rank)) return -1;
  if (x->n->ia[1] < 0) return fail(x, "limit must be >= 0");
  *x->out = *a;
  return 0;
}
/* ---- pipeline ops: point-to-point along an axis, and the stash ---- */
static int shape_ALL_TO_ALL(Sx *x) {
  const IrType *a = opnd(x, 0);
  if (mesh_axis(x, 0) || need_axis(x, 1, a->rank) || need_axis(x, 2, a->rank)) return -1;
  int k = ir_axis_size(x->m, (IrAxis)x->n->ia[0]);
  int s = (int)x->n->ia[1], c = (int)x->n->ia[2];
  if (a->dim[s] % k) return fail(x, "dim %d of %s is not divisible by the %s size %d", s, tstr(x, a), ir_axis_name((IrAxis)x->n->ia[0]), k);
  *x->out = *a;
  x->out->dim[s] /= k;
  x->out->dim[c] *= k;
  return 0;
}
static int shape_ALL_TO_ALL_V(Sx *x) {
  const IrType *a = opnd(x, 0), *c = opnd(x, 1), *r = opnd(x, 2);
  if (mesh_axis(x, 0) || need_bool(x, 1) || rows_of(x, 0, -1, "rows")) return -1;
  if (c->dtype != IR_I32 || c->rank != 2 || c->dim[0] != 1) return fail(x, "local counts %s must be i32[1, experts]", tstr(x, c));
  if (cnt_check(x, 2, -1)) return -1;
  if (r->dim[0] * r->dim[1] != c->dim[1])
    return fail(x, "received counts %s must split the %lld experts of %s over the sources", tstr(x, r), (long long)c->dim[1], tstr(x, c));
  if (x->out->dtype == IR_VOID) return fail(x, "needs a result type");
  if (x->out->dtype != a->dtype || x->out->rank != 2 || x->out->dim[1] != a->dim[1])
    return fail(x, "result must have the width and dtype of %s", tstr(x, a));
  return 0;
}
static int shape_RING_SHIFT(Sx *x) {
  if (mesh_axis(x, 0) || need_float(x, 0)) return -1;
  *x->out = *opnd(x, 0);
  return 0;
}
static int shape_RING_WAIT(Sx *x) {
  if (need_float(x, 0)) return -1;
  if (x->b->nodes[x->n->in[0]].op != IR_OP_RING_SHIFT) return fail(x, "the operand must be a ring_shift");
  *x->out = *opnd(x, 0);
  return 0;
}
static int shape_SEND(Sx *x) { return mesh_axis(x, 0); }
static int shape_RECV(Sx *x) {
  if (mesh_axis(x, 0)) return -1;
  if (x->out->dtype == IR_VOID) return fail(x, "needs a result type");
  return 0;
}
static int shape_STASH(Sx *x) {
  if (x->n->ia[0] < 0) return fail(x, "slot must be >= 0");
  return 0;
}
static int shape_UNSTASH(Sx *x) {
  if (x->n->ia[0] < 0) return fail(x, "slot must be >= 0");
  if (x->out->dtype == IR_VOID) return fail(x, "needs a result type");
  return 0;
}
static int shape_GROUP_SUM(Sx *x) {
  if (mesh_axis(x, 0) || need_float(x, 0)) return -1;
  if (x->n->ia[1] == 0) return fail(x, "ranks must be a non-empty bit mask");
  *x->out = *opnd(x, 0);
  return 0;
}
static int shape_OUTPUT(Sx *x) {
  if (!x->n->sa || !*x->n->sa) return fail(x, "needs a name");
  return scalar_float(x, 0, "operand");
}

typedef int (*ShapeFn)(Sx *x);
static const ShapeFn rules[IR_OP_COUNT] = {
#define X(name, text, nin, ia, fa, flags, doc) [IR_OP_##name] = shape_##name,
#include "ops.def"
#undef X
};

int ir_infer_type(const IrModule *m, const IrBlock *b, const IrNode *n,
                  IrType *out, char *err, size_t errlen) {
  Sx x = {.m = m, .b = b, .n = n, .out = out, .err = err, .errlen = errlen};
  memset(out, 0, sizeof *out);
  if ((int)n->op < 0 || n->op >= IR_OP_COUNT) {
    if (err && errlen) snprintf(err, errlen, "unknown op %d", (int)n->op);
    return -1;
  }
  const IrOpInfo *info = &ir_ops[n->op];
  if (info->nin >= 0 ? n->nin != info->nin : n->nin < 1)
    return fail(&x, "expects %s%d operand%s, got %d", info->nin < 0 ? "at least " : "",
                info->nin < 0 ? 1 : info->nin, info->nin == 1 || info->nin < 0 ? "" : "s", n->nin);
  if (n->nin > 0 && !n->in) return fail(&x, "operand list missing");
  for (int i = 0; i < n->nin; i++) {
    int v = n->in[i];
    if (v < 0 || v >= b->n) return fail(&x, "operand %d (%%%d) is not a value of block %s", i + 1, v, b->name);
    if (b->nodes[v].type.dtype == IR_VOID)
      return fail(&x, "operand %d (%%%d) is an effect, not a value", i + 1, v);
    /* 16-bit values are storage (ir.h): arithmetic reads them through a cast */
    if (ir_dtype_is_8(b->nodes[v].type.dtype) && !ir_op_reads_8(n->op))
      return fail(&x, "operand %d (%%%d) is %s, an fp8 storage type: only matmul8 (with its scale_inv), cast and "
                  "the ops that move bytes read it", i + 1, v, ir_dtype_name(b->nodes[v].type.dtype));
    if (ir_dtype_is_16(b->nodes[v].type.dtype) && !ir_op_reads_16(n->op))
      return fail(&x, "operand %d (%%%d) is %s, a storage type: %s computes in f32 and reads it through a "
                  "cast to f32 (pass precision inserts them)", i + 1, v, ir_dtype_name(b->nodes[v].type.dtype),
                  info->name);
  }
  if (info->flags & OPF_TYPED) {
    const char *why = type_problem(&n->type, 0);
    if (why) return fail(&x, "result type: %s", why);
    *out = n->type;
  }
  if (rules[n->op](&x)) return -1;
  if (info->flags & OPF_EFFECT) {
    memset(out, 0, sizeof *out);     /* dtype IR_VOID, rank 0 */
    return 0;
  }
  const char *why = type_problem(out, 0);
  if (why) return fail(&x, "result type %s: %s", tstr(&x, out), why);
  return 0;
}
