/* elab_builtins.c - MDL's builtin functions: one row per builtin in
 * `builtins[]` (name, argument names, how many are required, handler).
 * Arguments are bound (positional, then keyword) before the handler runs,
 * so handlers see a[i] in the order of the row's names, V_UNSET when an
 * optional one was not passed.
 *
 * Tensor builtins emit IR nodes; several names also work on plain numbers
 * at compile time (sqrt, exp, log, tanh, rsqrt, max, min, abs, float, int).
 * Axes may be negative; they are normalized before emitting (the IR has
 * only non-negative axes). */
#include "elab_priv.h"
#include <math.h>

typedef Value (*BuiltinFn)(Elab *e, const ElabCall *c, Value *a, int op);
typedef struct {
  const char *name;
  const char *args[10];  /* NULL-terminated; args[0] == NULL and nreq < 0: variadic */
  int nreq;
  BuiltinFn fn;
  int op;                /* IrOp for the generic handlers */
} Builtin;

static Value fail_arg(Elab *e, const ElabCall *c, const Value *v, const char *fmt) {
  char buf[256];
  elab_error(e, v->k == V_TENSOR ? c->loc : v->loc, fmt, c->fname, elab_value_desc(e, v, buf, sizeof buf));
  elab_note_origin(e, v);
  return elab_err();
}

static const char *list_str(Elab *e, const Value *list) {
  StrBuf b = {0};
  sb_putc(&b, '[');
  for (int i = 0; i < list->n; i++) {
    const Value *v = &list->items[i];
    if (i) sb_puts(&b, ", ");
    if (v->k == V_INT) sb_printf(&b, "%lld", (long long)v->i);
    else sb_puts(&b, "?");
  }
  sb_putc(&b, ']');
  const char *s = arena_strdup(&e->a, b.p);
  sb_free(&b);
  return s;
}

/* ---- elementwise / scalar math ---- */
static Value scalar_math(Elab *e, const ElabCall *c, const Value *x, int op) {
  double v = elab_num(x), r = 0;
  const char *dom = NULL;
  switch (op) {
  case IR_OP_EXP: r = exp(v); break;
  case IR_OP_LOG: if (v <= 0) dom = "> 0"; else r = log(v); break;
  case IR_OP_SQRT: if (v < 0) dom = ">= 0"; else r = sqrt(v); break;
  case IR_OP_RSQRT: if (v <= 0) dom = "> 0"; else r = 1.0 / sqrt(v); break;
  case IR_OP_TANH: r = tanh(v); break;
  default: return fail_arg(e, c, x, "%s() needs a tensor, got %s");
  }
  if (dom) {
    elab_error(e, x->loc, "%s(): the argument must be %s, got %g", c->fname, dom, v);
    return elab_err();
  }
  return elab_float(r, c->loc);
}

static Value bi_unary(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_is_num(&a[0])) return scalar_math(e, c, &a[0], op);
  if (elab_want_tensor(e, c, "x", &a[0], 1)) return elab_err();
  return elab_emit(e, c->loc, (IrOp)op, &a[0], 1, NULL, NULL, NULL, NULL);
}

static Value bi_abs(Elab *e, const ElabCall *c, Value *a, int op) {
  if (a[0].k == V_INT) {
    if (a[0].i == INT64_MIN) { elab_error(e, c->loc, "abs(): integer overflow"); return elab_err(); }
    return elab_int(a[0].i < 0 ? -a[0].i : a[0].i, c->loc);
  }
  if (a[0].k == V_FLOAT) return elab_float(fabs(a[0].f), c->loc);
  return fail_arg(e, c, &a[0], "%s() needs a number, got %s");
}

/* float(t) / int(t) on a tensor: an explicit cast (to the model's float
 * precision, or to i32 truncating toward zero and saturating) */
static Value cast_tensor(Elab *e, const ElabCall *c, Value x, IrDtype to) {
  IrType t = elab_type(e, &x);
  if (t.dtype == to) return x;
  t.dtype = to;
  return elab_emit(e, c->loc, IR_OP_CAST, &x, 1, NULL, NULL, NULL, &t);
}

static Value bi_float(Elab *e, const ElabCall *c, Value *a, int op) {
  if (a[0].k == V_TENSOR) return cast_tensor(e, c, a[0], e->prec);
  if (elab_is_num(&a[0])) return elab_float(elab_num(&a[0]), c->loc);
  if (a[0].k == V_BOOL) return elab_float((double)a[0].i, c->loc);
  return fail_arg(e, c, &a[0], "%s() needs a number, got %s");
}

/* mesh_size("cp"): the size of a mesh axis in the layout being compiled
 * (the parallel block with the command line's overrides), so a library
 * layer can pick an implementation per layout -- nn.attention runs the
 * fused (ring) attention only when the sequence is split over cp. */
static Value bi_mesh_size(Elab *e, const ElabCall *c, Value *a, int op) {
  (void)op;
  if (a[0].k != V_STR)
    return fail_arg(e, c, &a[0], "%s() needs a mesh axis name (\"dp\", \"tp\", \"pp\", \"cp\" or \"ep\"), got %s");
  int ax = ir_axis_lookup(a[0].s);
  if (ax < 0) {
    elab_error(e, a[0].loc, "%s(): unknown mesh axis \"%s\" (known: dp, tp, pp, cp, ep)", c->fname, a[0].s);
    return elab_err();
  }
  return elab_int(ir_axis_size(e->m, (IrAxis)ax), c->loc);
}

static Value bi_int(Elab *e, const ElabCall *c, Value *a, int op) {
  if (a[0].k == V_TENSOR) return cast_tensor(e, c, a[0], IR_I32);
  if (a[0].k == V_INT) return elab_int(a[0].i, c->loc);
  if (a[0].k == V_BOOL) return elab_int(a[0].i, c->loc);
  if (a[0].k == V_FLOAT) {   /* truncates toward zero, like Python */
    double f = trunc(a[0].f);
    if (!(f >= -9.2e18 && f <= 9.2e18)) {
      elab_error(e, a[0].loc, "int(): %g does not fit in an int", a[0].f);
      return elab_err();
    }
    return elab_int((int64_t)f, c->loc);
  }
  return fail_arg(e, c, &a[0], "%s() needs a number, got %s");
}

/* ---- reductions ---- */
static Value reduce(Elab *e, const ElabCall *c, Value x, const Value *axis, const Value *keep, IrOp op) {
  if (elab_want_tensor(e, c, "x", &x, 1)) return elab_err();
  int kd = 0;
  if (keep->k != V_UNSET && elab_want_bool(e, c, "keepdim", keep, &kd)) return elab_err();
  if (axis->k == V_UNSET) return elab_reduce_all(e, c->loc, op, x, kd);
  IrType t = elab_type(e, &x);
  int mark[IR_MAX_RANK] = {0};
  if (axis->k == V_LIST || axis->k == V_TUPLE) {
    for (int i = 0; i < axis->n; i++) {
      int ax = elab_axis(e, c->loc, &axis->items[i], t.rank, &x, c->fname);
      if (ax < 0) return elab_err();
      if (mark[ax]) {
        elab_error(e, axis->items[i].loc, "%s(): axis %d is listed twice", c->fname, ax);
        return elab_err();
      }
      mark[ax] = 1;
    }
  } else {
    int ax = elab_axis(e, c->loc, axis, t.rank, &x, c->fname);
    if (ax < 0) return elab_err();
    mark[ax] = 1;
  }
  for (int ax = t.rank - 1; ax >= 0 && x.k != V_ERR; ax--) {   /* last first: lower axes keep their index */
    if (!mark[ax]) continue;
    int64_t ia[2] = {ax, kd};
    x = elab_emit(e, c->loc, op, &x, 1, ia, NULL, NULL, NULL);
  }
  return x;
}

static Value bi_reduce(Elab *e, const ElabCall *c, Value *a, int op) {
  return reduce(e, c, a[0], &a[1], &a[2], (IrOp)op);
}

/* min/max: on numbers (any count, ints stay ints) or, for max, a tensor
 * reduction max(x, axis:, keepdim:). */
static Value bi_minmax(Elab *e, const ElabCall *c, Value *unused, int op) {
  int is_max = op == IR_OP_MAX;
  if (c->nargs >= 1 && c->args[0].v.k == V_TENSOR && !c->args[0].name) {
    if (!is_max) {
      elab_error(e, c->loc, "min() works on numbers only (there is no min reduction)");
      return elab_err();
    }
    static const char *const names[] = {"x", "axis", "keepdim", NULL};
    Value a[3];
    if (elab_bind_args(e, c, names, 1, a)) return elab_err();
    return reduce(e, c, a[0], &a[1], &a[2], IR_OP_MAX);
  }
  if (c->nargs < 1) {
    elab_error(e, c->loc, "%s() needs at least one number", c->fname);
    return elab_err();
  }
  Value r = elab_int(0, c->loc);
  int all_int = 1;
  double best = 0;
  int64_t ibest = 0;
  for (int i = 0; i < c->nargs; i++) {
    const ElabArg *g = &c->args[i];
    if (g->name) {
      elab_error(e, g->loc, "%s() on numbers takes no keyword arguments", c->fname);
      return elab_err();
    }
    if (!elab_is_num(&g->v)) return fail_arg(e, c, &g->v, "%s() needs numbers, got %s");
    double v = elab_num(&g->v);
    if (g->v.k != V_INT) all_int = 0;
    if (i == 0 || (is_max ? v > best : v < best)) best = v;
    if (g->v.k == V_INT && (i == 0 || (is_max ? g->v.i > ibest : g->v.i < ibest))) ibest = g->v.i;
  }
  if (all_int) { r.i = ibest; return r; }
  return elab_float(best, c->loc);
}

/* ---- layout ---- */
static Value bi_reshape(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType xt = elab_type(e, &a[0]), t = xt;
  int infer;
  if (elab_shape_list(e, &a[1], a[1].loc, &t, 1, &infer, c->fname)) return elab_err();
  for (int i = t.rank; i < IR_MAX_RANK; i++) { t.dim[i] = 0; t.dname[i] = NULL; }
  int64_t n = ir_type_numel(&xt), known = 1;
  IrType probe = t;
  if (infer >= 0) probe.dim[infer] = 1;
  if (elab_check_type(e, a[1].loc, &probe, c->fname)) return elab_err();
  known = ir_type_numel(&probe);
  if (infer >= 0) {
    if (n % known == 0) t.dim[infer] = n / known;
    known = n % known == 0 ? n : -1;
  }
  if (known != n) {
    char buf[256];
    elab_error(e, c->loc, "%s(): cannot reshape %s (%lld elements) to %s", c->fname,
               ir_type_str(&xt, buf, sizeof buf), (long long)n, list_str(e, &a[1]));
    elab_note_origin(e, &a[0]);
    return elab_err();
  }
  return elab_reshape(e, c->loc, a[0], &t);
}

static Value permute(Elab *e, const ElabCall *c, Value x, const int *perm) {
  IrType t = elab_type(e, &x);
  int64_t ia[IR_MAX_RANK];
  int id = 1;
  for (int i = 0; i < t.rank; i++) { ia[i] = perm[i]; id &= perm[i] == i; }
  if (id) return x;
  return elab_emit(e, c->loc, IR_OP_PERMUTE, &x, 1, ia, NULL, NULL, NULL);
}

static Value bi_transpose(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  if (t.rank < 2) return fail_arg(e, c, &a[0], "%s() needs a tensor of rank >= 2, got %s");
  int p = t.rank - 2, q = t.rank - 1;
  if ((a[1].k == V_UNSET) != (a[2].k == V_UNSET)) {
    elab_error(e, c->loc, "%s() takes either no axes or two: transpose(x, a, b)", c->fname);
    return elab_err();
  }
  if (a[1].k != V_UNSET) {
    p = elab_axis(e, c->loc, &a[1], t.rank, &a[0], c->fname);
    q = p < 0 ? -1 : elab_axis(e, c->loc, &a[2], t.rank, &a[0], c->fname);
    if (q < 0) return elab_err();
  }
  int perm[IR_MAX_RANK];
  for (int i = 0; i < t.rank; i++) perm[i] = i;
  perm[p] = q;
  perm[q] = p;
  return permute(e, c, a[0], perm);
}

static Value bi_permute(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  char buf[256];
  if ((a[1].k != V_LIST && a[1].k != V_TUPLE) || a[1].n != t.rank) {
    elab_error(e, a[1].loc, "%s(): expected a list of %d axes for %s", c->fname, t.rank, ir_type_str(&t, buf, sizeof buf));
    elab_note_origin(e, &a[0]);
    return elab_err();
  }
  int perm[IR_MAX_RANK], seen[IR_MAX_RANK] = {0};
  for (int i = 0; i < t.rank; i++) {
    int ax = elab_axis(e, c->loc, &a[1].items[i], t.rank, &a[0], c->fname);
    if (ax < 0) return elab_err();
    if (seen[ax]) {
      elab_error(e, a[1].loc, "%s(): %s is not a permutation of 0..%d", c->fname, list_str(e, &a[1]), t.rank - 1);
      return elab_err();
    }
    seen[ax] = 1;
    perm[i] = ax;
  }
  return permute(e, c, a[0], perm);
}

/* x[start:end] along axis (negative start/end count from the end). */
static Value slice_axis(Elab *e, const ElabCall *c, Value x, int ax, int64_t s, int64_t en, MdlLoc at) {
  IrType t = elab_type(e, &x);
  int64_t n = t.dim[ax], s0 = s, e0 = en;
  if (s < 0) s += n;
  if (en < 0) en += n;
  if (s < 0 || en > n || s >= en) {
    char buf[256];
    elab_error(e, at, "%s(): %lld:%lld is out of range or empty for axis %d of %s", c->fname, (long long)s0,
               (long long)e0, ax, ir_type_str(&t, buf, sizeof buf));
    elab_note_origin(e, &x);
    return elab_err();
  }
  if (s == 0 && en == n) return x;
  int64_t ia[3] = {ax, s, en};
  return elab_emit(e, c->loc, IR_OP_SLICE, &x, 1, ia, NULL, NULL, NULL);
}

static Value bi_slice(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  int ax = elab_axis(e, c->loc, &a[1], t.rank, &a[0], c->fname);
  int64_t s, en;
  if (ax < 0 || elab_want_int(e, c, "start", &a[2], &s) || elab_want_int(e, c, "end", &a[3], &en)) return elab_err();
  return slice_axis(e, c, a[0], ax, s, en, c->loc);
}

static Value bi_concat(Elab *e, const ElabCall *c, Value *a, int op) {
  Value *xs = &a[0];
  if ((xs->k != V_LIST && xs->k != V_TUPLE) || xs->n < 1)
    return fail_arg(e, c, xs, "%s() needs a non-empty list of tensors, got %s");
  for (int i = 0; i < xs->n; i++)
    if (elab_want_tensor(e, c, "xs", &xs->items[i], 0)) return elab_err();
  IrType t0 = elab_type(e, &xs->items[0]);
  Value dflt = elab_int(-1, c->loc);
  int ax = elab_axis(e, c->loc, a[1].k == V_UNSET ? &dflt : &a[1], t0.rank, &xs->items[0], c->fname);
  if (ax < 0) return elab_err();
  for (int i = 1; i < xs->n; i++) {
    IrType t = elab_type(e, &xs->items[i]);
    int ok = t.dtype == t0.dtype && t.rank == t0.rank;
    for (int d = 0; ok && d < t.rank; d++) ok = d == ax || t.dim[d] == t0.dim[d];
    if (!ok) {
      char b1[256], b2[256];
      elab_error(e, c->loc, "%s(): %s and %s do not concatenate along axis %d", c->fname,
                 ir_type_str(&t0, b1, sizeof b1), ir_type_str(&t, b2, sizeof b2), ax);
      elab_note_origin(e, &xs->items[0]);
      elab_note_origin(e, &xs->items[i]);
      return elab_err();
    }
  }
  if (xs->n == 1) return xs->items[0];
  int64_t ia[1] = {ax};
  return elab_emit(e, c->loc, IR_OP_CONCAT, xs->items, xs->n, ia, NULL, NULL, NULL);
}

/* split(x, n or [sizes], axis: -1) -> tuple of slices */
static Value bi_split(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  Value dflt = elab_int(-1, c->loc);
  int ax = elab_axis(e, c->loc, a[2].k == V_UNSET ? &dflt : &a[2], t.rank, &a[0], c->fname);
  if (ax < 0) return elab_err();
  int64_t n = t.dim[ax];
  char buf[256];
  int64_t *sizes;
  int np;
  if (a[1].k == V_INT) {
    int64_t k = a[1].i;
    if (k < 1 || k > 4096 || n % k != 0) {
      elab_error(e, a[1].loc, "%s(): cannot split axis %d of %s (size %lld) into %lld equal parts", c->fname, ax,
                 ir_type_str(&t, buf, sizeof buf), (long long)n, (long long)k);
      elab_note_origin(e, &a[0]);
      return elab_err();
    }
    np = (int)k;
    sizes = arena_alloc(&e->a, (size_t)np * sizeof *sizes);
    for (int i = 0; i < np; i++) sizes[i] = n / k;
  } else if (a[1].k == V_LIST || a[1].k == V_TUPLE) {
    np = a[1].n;
    sizes = arena_alloc(&e->a, (size_t)(np + 1) * sizeof *sizes);
    int64_t sum = 0;
    for (int i = 0; i < np; i++) {
      if (elab_want_int(e, c, "sizes", &a[1].items[i], &sizes[i])) return elab_err();
      if (sizes[i] < 1 || sizes[i] > n) { sum = -1; break; }
      sum += sizes[i];
    }
    if (np < 1 || sum != n) {
      elab_error(e, a[1].loc, "%s(): sizes %s do not add up to %lld, the size of axis %d of %s", c->fname,
                 list_str(e, &a[1]), (long long)n, ax, ir_type_str(&t, buf, sizeof buf));
      elab_note_origin(e, &a[0]);
      return elab_err();
    }
  } else {
    return fail_arg(e, c, &a[1], "%s(): the parts must be an int or a list of sizes, got %s");
  }
  Value r = elab_tuple(e, V_TUPLE, np, c->loc);
  int64_t at = 0;
  for (int i = 0; i < np; i++) {
    r.items[i] = slice_axis(e, c, a[0], ax, at, at + sizes[i], c->loc);
    if (r.items[i].k == V_ERR) return elab_err();
    at += sizes[i];
  }
  return r;
}

static Value bi_broadcast(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t;
  memset(&t, 0, sizeof t);
  if (elab_shape_list(e, &a[1], a[1].loc, &t, 0, NULL, c->fname)) return elab_err();
  if (elab_check_type(e, a[1].loc, &t, c->fname)) return elab_err();
  return elab_broadcast_to(e, c->loc, a[0], &t);
}

static Value bi_full(Elab *e, const ElabCall *c, Value *a, int op) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = e->prec;
  double v;
  if (elab_shape_list(e, &a[0], a[0].loc, &t, 0, NULL, c->fname) || elab_check_type(e, a[0].loc, &t, c->fname) ||
      elab_want_num(e, c, "value", &a[1], &v))
    return elab_err();
  double fa[1] = {v};
  return elab_emit(e, c->loc, IR_OP_FULL, NULL, 0, NULL, fa, NULL, &t);
}

static Value bi_size(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  int ax = elab_axis(e, c->loc, &a[1], t.rank, &a[0], c->fname);
  if (ax < 0) return elab_err();
  Value r = elab_int(t.dim[ax], c->loc);
  r.s = t.dname[ax];
  return r;
}

/* ---- neural-network ops ---- */
static Value bi_softmax(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 1)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  if (t.rank < 1) return fail_arg(e, c, &a[0], "%s() needs a tensor of rank >= 1, got %s");
  if (a[1].k != V_UNSET) {
    int ax = elab_axis(e, c->loc, &a[1], t.rank, &a[0], c->fname);
    if (ax < 0) return elab_err();
    if (ax != t.rank - 1) {
      elab_error(e, a[1].loc, "%s() works on the last axis only (axis: -1); permute the tensor first", c->fname);
      return elab_err();
    }
  }
  return elab_emit(e, c->loc, (IrOp)op, &a[0], 1, NULL, NULL, NULL, NULL);
}

static Value bi_norm(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 1)) return elab_err();
  double eps = 1e-5;
  if (a[1].k != V_UNSET && elab_want_num(e, c, "eps", &a[1], &eps)) return elab_err();
  if (!(eps > 0) || !isfinite(eps)) {
    elab_error(e, a[1].loc, "%s(): eps must be > 0, got %g", c->fname, eps);
    return elab_err();
  }
  double fa[1] = {eps};
  return elab_emit(e, c->loc, (IrOp)op, &a[0], 1, NULL, fa, NULL, NULL);
}

static Value bi_embedding(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "table", &a[0], 1) || elab_want_tensor(e, c, "ids", &a[1], 0)) return elab_err();
  IrType ids = elab_type(e, &a[1]);
  if (ids.dtype != IR_I32) return fail_arg(e, c, &a[1], "%s(): ids must be an i32 tensor, got %s");
  return elab_emit(e, c->loc, IR_OP_EMBEDDING, a, 2, NULL, NULL, NULL, NULL);
}

static Value bi_causal_mask(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 1)) return elab_err();
  double fa[1] = {-INFINITY};
  return elab_emit(e, c->loc, IR_OP_CAUSAL_MASK, &a[0], 1, NULL, fa, NULL, NULL);
}

/* keep as x's dtype and shape: cast, then broadcast */
static Value as_mask(Elab *e, const ElabCall *c, Value keep, const IrType *xt) {
  IrType kt = elab_type(e, &keep);
  if (kt.dtype != xt->dtype) {
    kt.dtype = xt->dtype;
    keep = elab_emit(e, c->loc, IR_OP_CAST, &keep, 1, NULL, NULL, NULL, &kt);
  }
  return elab_broadcast_to(e, c->loc, keep, xt);
}

static Value bi_masked_fill(Elab *e, const ElabCall *c, Value *a, int op) {
  double v;
  if (elab_want_tensor(e, c, "x", &a[0], 1) || elab_want_tensor(e, c, "keep", &a[1], 0) ||
      elab_want_num(e, c, "value", &a[2], &v))
    return elab_err();
  IrType xt = elab_type(e, &a[0]);
  Value in[2] = {a[0], as_mask(e, c, a[1], &xt)};
  double fa[1] = {v};
  return elab_emit(e, c->loc, IR_OP_MASKED_FILL, in, 2, NULL, fa, NULL, NULL);
}

/* scores[batch, ..., k], mask[batch, k]: keys where mask == 0 get -inf. */
static Value bi_padding_mask(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "scores", &a[0], 1) || elab_want_tensor(e, c, "mask", &a[1], 0)) return elab_err();
  IrType st = elab_type(e, &a[0]), mt = elab_type(e, &a[1]);
  if (st.rank < 2 || mt.rank != 2 || mt.dim[0] != st.dim[0] || mt.dim[1] != st.dim[st.rank - 1]) {
    char b1[256], b2[256];
    elab_error(e, c->loc, "%s(): mask %s must be [batch, keys] for scores %s ([batch, ..., keys])", c->fname,
               ir_type_str(&mt, b1, sizeof b1), ir_type_str(&st, b2, sizeof b2));
    elab_note_origin(e, &a[1]);
    elab_note_origin(e, &a[0]);
    return elab_err();
  }
  IrType kt = mt;
  kt.dtype = st.dtype;
  double zero[1] = {0};
  Value keep = elab_emit(e, c->loc, IR_OP_NE_SCALAR, &a[1], 1, NULL, zero, NULL, &kt);
  IrType r = st;   /* [batch, 1, ..., 1, keys] */
  for (int i = 1; i < st.rank - 1; i++) { r.dim[i] = 1; r.dname[i] = NULL; }
  r.dname[0] = mt.dname[0];
  r.dname[st.rank - 1] = mt.dname[1];
  keep = elab_broadcast_to(e, c->loc, elab_reshape(e, c->loc, keep, &r), &st);
  Value in[2] = {a[0], keep};
  double fa[1] = {-INFINITY};
  return elab_emit(e, c->loc, IR_OP_MASKED_FILL, in, 2, NULL, fa, NULL, NULL);
}

static Value bi_dropout(Elab *e, const ElabCall *c, Value *a, int op) {
  double p;
  if (elab_want_tensor(e, c, "x", &a[0], 1) || elab_want_num(e, c, "p", &a[1], &p)) return elab_err();
  if (!(p >= 0 && p < 1)) {
    elab_error(e, a[1].loc, "%s(): p must be in [0, 1), got %g", c->fname, p);
    return elab_err();
  }
  if (p == 0) return a[0];
  int64_t ia[1] = {e->stream++};   /* deterministic: the n-th dropout of the model */
  double fa[1] = {p};
  return elab_emit(e, c->loc, IR_OP_DROPOUT, &a[0], 1, ia, fa, NULL, NULL);
}

/* ---- integer tensors and indexing ---- */
/* arange(n, start: 0, step: 1): [n] of start + step * i; i32 when start and
 * step are ints, else the model's float precision */
static Value bi_arange(Elab *e, const ElabCall *c, Value *a, int op) {
  int64_t n;
  double fa[2] = {0, 1};
  int isint = 1;
  if (elab_want_int(e, c, "n", &a[0], &n)) return elab_err();
  for (int k = 1; k < 3; k++) {
    if (a[k].k == V_UNSET) continue;
    if (elab_want_num(e, c, k == 1 ? "start" : "step", &a[k], &fa[k - 1])) return elab_err();
    isint &= a[k].k == V_INT;
  }
  if (n < 1) {
    elab_error(e, a[0].loc, "%s(): n must be >= 1, got %lld", c->fname, (long long)n);
    return elab_err();
  }
  if (isint && (fabs(fa[0]) > 2147483647.0 || fabs(fa[0] + fa[1] * (double)(n - 1)) > 2147483647.0)) {
    elab_error(e, c->loc, "%s(): the values %g .. %g do not fit i32", c->fname, fa[0], fa[0] + fa[1] * (double)(n - 1));
    return elab_err();
  }
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = isint ? IR_I32 : e->prec;
  t.rank = 1;
  t.dim[0] = n;
  t.dname[0] = a[0].s;
  if (elab_check_type(e, a[0].loc, &t, c->fname)) return elab_err();
  int64_t ia[1] = {0};
  return elab_emit(e, c->loc, IR_OP_ARANGE, NULL, 0, ia, fa, NULL, &t);
}

/* A where() branch: a tensor, or a number made a full tensor of type t */
static Value where_branch(Elab *e, const ElabCall *c, const char *arg, Value v, const IrType *t) {
  if (v.k == V_TENSOR) return v;
  double d;
  if (elab_want_num(e, c, arg, &v, &d)) return elab_err();
  if (t->dtype == IR_I32 && v.k != V_INT) {
    char buf[256];
    elab_error(e, v.loc, "%s(): %s is the float %g but the other branch is %s: no implicit int <-> float conversion",
               c->fname, arg, d, ir_type_str(t, buf, sizeof buf));
    return elab_err();
  }
  double fa[1] = {d};
  return elab_emit(e, v.loc, IR_OP_FULL, NULL, 0, NULL, fa, NULL, t);
}

/* where(cond, x, y): x where cond != 0, else y; broadcast like '+' */
static Value bi_where(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "cond", &a[0], 0)) return elab_err();
  if (a[1].k != V_TENSOR && a[2].k != V_TENSOR) {
    elab_error(e, c->loc, "%s(): x or y must be a tensor (both are numbers)", c->fname);
    return elab_err();
  }
  IrType tx = a[1].k == V_TENSOR ? elab_type(e, &a[1]) : elab_type(e, &a[2]);
  IrType one = tx;
  one.rank = 0;
  Value x = where_branch(e, c, "x", a[1], &one), y = where_branch(e, c, "y", a[2], &one);
  if (x.k == V_ERR || y.k == V_ERR) return elab_err();
  IrType t0 = elab_type(e, &a[0]), t1 = elab_type(e, &x), t2 = elab_type(e, &y), r;
  char b1[256], b2[256];
  if (t1.dtype != t2.dtype) {
    elab_error(e, c->loc, "%s(): x %s and y %s differ in dtype: no implicit int <-> float conversion (float(x), int(x))",
               c->fname, ir_type_str(&t1, b1, sizeof b1), ir_type_str(&t2, b2, sizeof b2));
    return elab_err();
  }
  /* the result shape: the three broadcast together, right-aligned */
  r = t1.rank >= t2.rank ? t1 : t2;
  if (t0.rank > r.rank) { IrType k = t0; k.dtype = t1.dtype; r = k; }
  for (int i = 0; i < r.rank; i++) {
    const IrType *ts[3] = {&t0, &t1, &t2};
    for (int j = 0; j < 3; j++) {
      int d = ts[j]->rank - r.rank + i;
      if (d >= 0 && ts[j]->dim[d] != 1 && r.dim[i] == 1) { r.dim[i] = ts[j]->dim[d]; r.dname[i] = ts[j]->dname[d]; }
    }
  }
  IrType rc = r;
  rc.dtype = t0.dtype;
  Value in[3] = {elab_broadcast_to(e, c->loc, a[0], &rc), elab_broadcast_to(e, c->loc, x, &r),
                 elab_broadcast_to(e, c->loc, y, &r)};
  for (int j = 0; j < 3; j++)
    if (in[j].k == V_ERR) return elab_err();
  return elab_emit(e, c->loc, IR_OP_WHERE, in, 3, NULL, NULL, NULL, NULL);
}

/* gather(x, idx, axis: -1): y[..., j, ...] = x[..., idx[..., j, ...], ...] */
static Value bi_gather(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 0) || elab_want_tensor(e, c, "idx", &a[1], 0)) return elab_err();
  IrType tx = elab_type(e, &a[0]), ti = elab_type(e, &a[1]);
  Value dflt = elab_int(-1, c->loc);
  int ax = elab_axis(e, c->loc, a[2].k == V_UNSET ? &dflt : &a[2], tx.rank, &a[0], c->fname);
  if (ax < 0) return elab_err();
  if (ti.dtype != IR_I32) return fail_arg(e, c, &a[1], "%s(): idx must be an i32 tensor (int(x) converts), got %s");
  char b1[256], b2[256];
  int ok = ti.rank == tx.rank;
  for (int d = 0; ok && d < tx.rank; d++) ok = d == ax || ti.dim[d] == tx.dim[d];
  if (!ok) {
    elab_error(e, c->loc, "%s(): idx %s must have x %s's dims except along axis %d (take_along_axis; broadcast idx first)",
               c->fname, ir_type_str(&ti, b1, sizeof b1), ir_type_str(&tx, b2, sizeof b2), ax);
    elab_note_origin(e, &a[1]);
    return elab_err();
  }
  int64_t ia[1] = {ax};
  return elab_emit(e, c->loc, IR_OP_GATHER, a, 2, ia, NULL, NULL, NULL);
}

/* randint(shape, lo, hi) -> i32 in [lo, hi); rand(shape, lo: 0, hi: 1) ->
 * floats: counter-based (seed, stream, step, micro, index), a new stream
 * per call like dropout */
static Value bi_rand(Elab *e, const ElabCall *c, Value *a, int op) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = op ? IR_I32 : e->prec;
  double fa[2] = {0, 1};
  if (elab_shape_list(e, &a[0], a[0].loc, &t, 0, NULL, c->fname) || elab_check_type(e, a[0].loc, &t, c->fname))
    return elab_err();
  for (int k = 1; k < 3; k++) {
    if (a[k].k == V_UNSET) continue;
    if (op) {
      int64_t v;
      if (elab_want_int(e, c, k == 1 ? "lo" : "hi", &a[k], &v)) return elab_err();
      if (v < INT32_MIN || v > (int64_t)INT32_MAX + 1) {
        elab_error(e, a[k].loc, "%s(): %lld is outside i32", c->fname, (long long)v);
        return elab_err();
      }
      fa[k - 1] = (double)v;
    } else if (elab_want_num(e, c, k == 1 ? "lo" : "hi", &a[k], &fa[k - 1])) return elab_err();
  }
  if (!(fa[0] < fa[1])) {
    elab_error(e, c->loc, "%s(): needs lo < hi, got lo = %g, hi = %g", c->fname, fa[0], fa[1]);
    return elab_err();
  }
  int64_t ia[1] = {e->stream++};
  return elab_emit(e, c->loc, IR_OP_RAND, NULL, 0, ia, fa, NULL, &t);
}

/* topk_mask(x, k): 1 at the k largest entries of each last-axis row (routing). */
static Value bi_topk_mask(Elab *e, const ElabCall *c, Value *a, int op) {
  int64_t k;
  if (elab_want_tensor(e, c, "x", &a[0], 1) || elab_want_int(e, c, "k", &a[1], &k)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  if (t.rank < 1) return fail_arg(e, c, &a[0], "%s() needs a tensor of rank >= 1, got %s");
  if (k < 1 || k > t.dim[t.rank - 1]) {
    elab_error(e, a[1].loc, "%s(): k must be in [1, %lld] (the last dim), got %lld", c->fname,
               (long long)t.dim[t.rank - 1], (long long)k);
    return elab_err();
  }
  int64_t ia[1] = {k};
  return elab_emit(e, c->loc, IR_OP_TOPK_MASK, &a[0], 1, ia, NULL, NULL, NULL);
}

/* Is `output "name"` already in the block being built? */
static int output_taken(Elab *e, const char *name) {
  const IrBlock *b = &e->m->blocks.a[e->blk];
  const char *s = ts_intern(name);
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == s) return 1;
  return 0;
}

/* metric(name, x): reports x (a scalar, or a vector [n] of at most 256
 * entries) as training metrics: `output "name"`, or one `output "name.<i>"`
 * per entry.  A '#' in the name becomes the number of earlier calls with
 * that name (a fn called once per layer: "moe.#.tokens" gives
 * moe.0.tokens.<i>, moe.1.tokens.<i>, ...); without one, a name is
 * reported once.  The trainer sums each metric over the step's micro
 * batches and dp ranks (docs/mdl.md). */
static Value bi_metric(Elab *e, const ElabCall *c, Value *a, int op) {
  if (a[0].k != V_STR) return fail_arg(e, c, &a[0], "%s(): name must be a string, got %s");
  if (elab_want_tensor(e, c, "x", &a[1], 0)) return elab_err();
  IrType t = elab_type(e, &a[1]);
  if (t.rank > 1 || (t.rank == 1 && (t.dim[0] < 1 || t.dim[0] > 256)))
    return fail_arg(e, c, &a[1], "%s() needs a scalar or a vector of 1 to 256 entries, got %s");
  if (!strcmp(a[0].s, "loss") || !strcmp(a[0].s, "grad_norm") || !*a[0].s) {
    elab_error(e, a[0].loc, "%s(): the name '%s' is reserved", c->fname, a[0].s);
    return elab_err();
  }
  char base[400], name[512];
  const char *hash = strchr(a[0].s, '#');
  if (strlen(a[0].s) > 300) return fail_arg(e, c, &a[0], "%s(): the name is too long: %s");
  for (int k = 0;; k++) {       /* the first free call number (or the plain name) */
    if (hash) snprintf(base, sizeof base, "%.*s%d%s", (int)(hash - a[0].s), a[0].s, k, hash + 1);
    else snprintf(base, sizeof base, "%s", a[0].s);
    snprintf(name, sizeof name, t.rank ? "%s.0" : "%s", base);
    if (!output_taken(e, name)) break;
    if (!hash) {
      elab_error(e, a[0].loc, "%s(): '%s' is reported twice (put a '#' in the name to number the calls, e.g. "
                 "\"moe.#.tokens\")", c->fname, a[0].s);
      return elab_err();
    }
  }
  IrType s = {t.dtype, 0, {0}, {NULL}};
  if (t.rank == 0) return elab_emit(e, c->loc, IR_OP_OUTPUT, &a[1], 1, NULL, NULL, ts_intern(base), NULL);
  for (int64_t i = 0; i < t.dim[0]; i++) {
    Value v = elab_reshape(e, c->loc, slice_axis(e, c, a[1], 0, i, i + 1, c->loc), &s);
    snprintf(name, sizeof name, "%s.%lld", base, (long long)i);
    if (elab_emit(e, c->loc, IR_OP_OUTPUT, &v, 1, NULL, NULL, ts_intern(name), NULL).k == V_ERR) return elab_err();
  }
  return elab_none(c->loc);
}

/* error("message"): stops compilation with the message at the call (a
 * library's refusal of arguments it cannot honour; the notes name the
 * calls that led there). */
static Value bi_error(Elab *e, const ElabCall *c, Value *a, int op) {
  (void)op;
  if (a[0].k != V_STR) {
    char buf[256];
    elab_error(e, a[0].loc, "%s() needs a string message, got %s", c->fname, elab_value_desc(e, &a[0], buf, sizeof buf));
    return elab_err();
  }
  elab_error(e, c->loc, "%s", a[0].s);
  return elab_err();
}

/* capacity_mask(keep, cap): per last-axis column of the 0/1 routing mask
 * keep [..., E], the first cap ones in token (row) order (expert capacity). */
static Value bi_capacity_mask(Elab *e, const ElabCall *c, Value *a, int op) {
  int64_t cap;
  if (elab_want_tensor(e, c, "keep", &a[0], 1) || elab_want_int(e, c, "cap", &a[1], &cap)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  if (t.rank < 1) return fail_arg(e, c, &a[0], "%s() needs a tensor of rank >= 1, got %s");
  if (cap < 0) {
    elab_error(e, a[1].loc, "%s(): cap must be >= 0, got %lld", c->fname, (long long)cap);
    return elab_err();
  }
  int64_t ia[1] = {cap};
  return elab_emit(e, c->loc, IR_OP_CAPACITY_MASK, &a[0], 1, ia, NULL, NULL, NULL);
}

/* ---- sparse mixture of experts (docs/ir.md "Token dispatch") ----
 * routed [tokens, experts] is a 0/1 float mask; the token layout of `rows`
 * rows holds expert 0's routed tokens, then expert 1's, ...  The shape
 * rules check how the operands fit together; the handlers check each
 * argument on its own, so the caret points at the argument at fault. */
static int want_matrix(Elab *e, const ElabCall *c, const char *arg, const Value *v, const char *what) {
  if (elab_want_tensor(e, c, arg, v, 1)) return -1;
  if (elab_type(e, v).rank == 2) return 0;
  char fmt[160];
  snprintf(fmt, sizeof fmt, "%%s(): %s must be %s, got %%s", arg, what);
  fail_arg(e, c, v, fmt);
  return -1;
}
/* moe_counts(routed[N, E]) -> i32[1, E]: the routed rows of each expert. */
static Value bi_moe_counts(Elab *e, const ElabCall *c, Value *a, int op) {
  if (want_matrix(e, c, "routed", &a[0], "a [tokens, experts] mask")) return elab_err();
  return elab_emit(e, c->loc, IR_OP_MOE_COUNTS, &a[0], 1, NULL, NULL, NULL, NULL);
}
/* moe_perm(x[N, D], routed[N, E], scale[N, E], rows) -> [rows, D] in token
 * layout, the row of (t, e) holding scale[t, e] * x[t]. */
static Value bi_moe_perm(Elab *e, const ElabCall *c, Value *a, int op) {
  int64_t rows;
  if (want_matrix(e, c, "x", &a[0], "[tokens, features]") ||
      want_matrix(e, c, "routed", &a[1], "a [tokens, experts] mask") ||
      want_matrix(e, c, "scale", &a[2], "[tokens, experts]") || elab_want_int(e, c, "rows", &a[3], &rows))
    return elab_err();
  if (rows < 1) {
    elab_error(e, a[3].loc, "%s(): rows must be >= 1 (an upper bound on the routed slots), got %lld", c->fname,
               (long long)rows);
    return elab_err();
  }
  return elab_emit(e, c->loc, IR_OP_MOE_PERM, a, 3, &rows, NULL, NULL, NULL);
}
/* moe_unperm(y[R, D] token layout, routed[N, E], scale[N, E]) -> [N, D]:
 * per token the scale-weighted sum of its experts' rows. */
static Value bi_moe_unperm(Elab *e, const ElabCall *c, Value *a, int op) {
  if (want_matrix(e, c, "y", &a[0], "[rows, features]") ||
      want_matrix(e, c, "routed", &a[1], "a [tokens, experts] mask") ||
      want_matrix(e, c, "scale", &a[2], "[tokens, experts]"))
    return elab_err();
  return elab_emit(e, c->loc, IR_OP_MOE_UNPERM, a, 3, NULL, NULL, NULL, NULL);
}
/* gmm(a[R, K], w[E, K, N], counts i32[S, E]) -> [R, N]: expert g's rows of
 * a times w[g] (a grouped matmul; rows past all groups are 0). */
static Value bi_gmm(Elab *e, const ElabCall *c, Value *a, int op) {
  if (want_matrix(e, c, "a", &a[0], "[rows, features]") || elab_want_tensor(e, c, "w", &a[1], 1) ||
      elab_want_tensor(e, c, "counts", &a[2], 0))
    return elab_err();
  if (elab_type(e, &a[1]).rank != 3) return fail_arg(e, c, &a[1], "%s(): w must be [experts, in, out], got %s");
  IrType ct = elab_type(e, &a[2]);
  if (ct.dtype != IR_I32 || ct.rank != 2)
    return fail_arg(e, c, &a[2], "%s(): counts must be i32 [sources, experts] (from moe_counts()), got %s");
  int64_t tb = 0;
  return elab_emit(e, c->loc, IR_OP_GMM, a, 3, &tb, NULL, NULL, NULL);
}

/* fused_attention(q[B, Hq, T, D], k[B, Hkv, S, D], v, causal: true,
 * scale: 1 / sqrt(D), docs: none): softmax(scale q k^T) v in one op
 * (docs/ir.md "Fused attention"); kv heads may be fewer (grouped-query).
 * docs i32[B, T] (self-attention, S = T): each position's document id in
 * a packed sequence; a query sees only keys of its own document.  window:
 * W > 0 hides keys W or more positions away (sliding-window attention).
 * alibi: slopes [Hq] (f32 or f64, one per query head): ALiBi, the score of
 * query i and key j of head h less slopes[h] |i - j| (no gradient to the
 * slopes).  bias: [Hq or 1, T, S] in q's dtype, added to the scaled
 * scores before the masks (T5's relative-position buckets: a learned
 * table gathered by bucket; its gradient is attention_bwd part 3).  Keys
 * may be fewer or more than the queries (cross-attention, S != T) when
 * neither causal, docs, window nor alibi compare positions. */
/* Where argument `name` (or the pos-th positional one) is written in call
 * c: the call itself when it is not there (the value's own location may
 * be a signature, far from the call). */
static MdlLoc call_arg_loc(const ElabCall *c, const char *name, int pos) {
  MdlLoc at = c->loc;
  for (int i = 0, p = 0; i < c->nargs; p += !c->args[i].name, i++)
    if (c->args[i].name ? strcmp(c->args[i].name, name) == 0 : p == pos) at = c->args[i].loc;
  return at;
}

static Value bi_fused_attention(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "q", &a[0], 1) || elab_want_tensor(e, c, "k", &a[1], 1) ||
      elab_want_tensor(e, c, "v", &a[2], 1))
    return elab_err();
  IrType t = elab_type(e, &a[0]);
  if (t.rank != 4) return fail_arg(e, c, &a[0], "%s() needs q of shape [batch, heads, seq, head_dim], got %s");
  int causal = 1;
  int64_t window = 0;
  double scale = 1.0 / sqrt((double)t.dim[3]);
  if (a[3].k != V_UNSET && elab_want_bool(e, c, "causal", &a[3], &causal)) return elab_err();
  if (a[4].k != V_UNSET && elab_want_num(e, c, "scale", &a[4], &scale)) return elab_err();
  if (a[6].k != V_UNSET && a[6].k != V_NONE) {
    if (a[6].k != V_INT || a[6].i < 0) {
      char buf[256];
      elab_error(e, a[6].loc, "%s(): window must be an int >= 0 (the positions a query sees: 0 for all), got %s",
                 c->fname, elab_value_desc(e, &a[6], buf, sizeof buf));
      return elab_err();
    }
    window = a[6].i;
  }
  IrType kt0 = elab_type(e, &a[1]);
  int alibi = a[7].k != V_UNSET && a[7].k != V_NONE;
  int has_docs = a[5].k != V_UNSET && a[5].k != V_NONE;
  if (kt0.rank == 4 && kt0.dim[2] != t.dim[2] && (causal || window > 0 || alibi || has_docs)) {
    elab_error(e, c->loc, "%s(): keys of length %lld and queries of length %lld (cross-attention) compare no "
               "positions: causal, window, alibi and docs need as many keys as queries (causal: false and none "
               "of the others would work)", c->fname, (long long)kt0.dim[2], (long long)t.dim[2]);
    return elab_err();
  }
  double fa[1] = {scale};
  int nin = 3;
  if (alibi) {
    if (elab_want_tensor(e, c, "alibi", &a[7], 0)) return elab_err();
    IrType sl = elab_type(e, &a[7]);
    if ((sl.dtype != IR_F32 && sl.dtype != IR_F64) || sl.rank != 1 || sl.dim[0] != t.dim[1]) {
      char buf[256];
      elab_error(e, call_arg_loc(c, "alibi", 7), "%s(): alibi must be the slopes, f32 or f64 [heads] = [%lld] (one per query head), "
                 "got %s", c->fname, (long long)t.dim[1], elab_value_desc(e, &a[7], buf, sizeof buf));
      elab_note_origin(e, &a[7]);
      return elab_err();
    }
  }
  int bias = a[8].k != V_UNSET && a[8].k != V_NONE;
  if (bias) {   /* [heads or 1, queries, keys] in q's dtype: added to the scaled scores */
    if (elab_want_tensor(e, c, "bias", &a[8], 1)) return elab_err();
    IrType b = elab_type(e, &a[8]);
    if (b.dtype != t.dtype || b.rank != 3 || (b.dim[0] != t.dim[1] && b.dim[0] != 1) || b.dim[1] != t.dim[2] ||
        kt0.rank != 4 || b.dim[2] != kt0.dim[2]) {
      char buf[256];
      elab_error(e, call_arg_loc(c, "bias", 8), "%s(): bias must be the additive score bias, %s [heads, queries, "
                 "keys] = [%lld (or 1), %lld, %lld] (q's dtype), got %s", c->fname, ir_dtype_name(t.dtype),
                 (long long)t.dim[1], (long long)t.dim[2], (long long)(kt0.rank == 4 ? kt0.dim[2] : 0),
                 elab_value_desc(e, &a[8], buf, sizeof buf));
      elab_note_origin(e, &a[8]);
      return elab_err();
    }
  }
  if (has_docs) {
    if (elab_want_tensor(e, c, "docs", &a[5], 0)) return elab_err();
    IrType d = elab_type(e, &a[5]), kt = elab_type(e, &a[1]);
    if (d.dtype != IR_I32 || d.rank != 2 || d.dim[0] != t.dim[0] || d.dim[1] != t.dim[2] || kt.rank != 4 ||
        kt.dim[2] != t.dim[2])
    {
      char buf[256];
      elab_error(e, call_arg_loc(c, "docs", 5), "%s(): docs must be i32 [batch, seq] = [%lld, %lld], the document id of each "
                 "position for self-attention over q's sequence (keys as many as queries); got %s", c->fname,
                 (long long)t.dim[0], (long long)t.dim[2], elab_value_desc(e, &a[5], buf, sizeof buf));
      elab_note_origin(e, &a[5]);
      return elab_err();
    }
  }
  /* the operands: q, k, v[, slopes][, bias][, docs] */
  Value in[6] = {a[0], a[1], a[2]};
  if (alibi) in[nin++] = a[7];
  if (bias) in[nin++] = a[8];
  if (has_docs) in[nin++] = a[5];
  int64_t ia[4] = {causal, window, alibi, bias};
  return elab_emit(e, c->loc, IR_OP_ATTENTION, in, nin, ia, fa, NULL, NULL);
}

static Value bi_rope(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "x", &a[0], 1)) return elab_err();
  IrType t = elab_type(e, &a[0]);
  double base = 10000.0;
  if (a[1].k != V_UNSET && elab_want_num(e, c, "base", &a[1], &base)) return elab_err();
  if (t.rank < 2) return fail_arg(e, c, &a[0], "%s() needs a tensor of rank >= 2, got %s");
  Value dflt = elab_int(-3, c->loc);
  if (t.rank < 3 && a[2].k == V_UNSET) dflt.i = -2;
  int ax = elab_axis(e, c->loc, a[2].k == V_UNSET ? &dflt : &a[2], t.rank, &a[0], c->fname);
  if (ax < 0) return elab_err();
  if (ax == t.rank - 1) {
    elab_error(e, c->loc, "%s(): the position axis cannot be the last one (that is the rotated dim)", c->fname);
    return elab_err();
  }
  int64_t ia[2] = {ax, 0};
  double fa[1] = {base};
  return elab_emit(e, c->loc, IR_OP_ROPE, &a[0], 1, ia, fa, NULL, NULL);
}

/* cross_entropy(logits[..., V], targets[...] i32): per-token losses, their
 * sum, or their mean over the targets that are not ignore_index. */
static Value bi_cross_entropy(Elab *e, const ElabCall *c, Value *a, int op) {
  if (elab_want_tensor(e, c, "logits", &a[0], 1) || elab_want_tensor(e, c, "targets", &a[1], 0)) return elab_err();
  int64_t ignore = -1;
  if (a[2].k != V_UNSET && elab_want_int(e, c, "ignore_index", &a[2], &ignore)) return elab_err();
  const char *red = "mean";
  if (a[3].k != V_UNSET) {
    if (a[3].k != V_STR) return fail_arg(e, c, &a[3], "%s(): reduction must be \"mean\", \"sum\" or \"none\", got %s");
    red = a[3].s;
  }
  if (strcmp(red, "mean") && strcmp(red, "sum") && strcmp(red, "none")) {
    elab_error(e, a[3].loc, "%s(): reduction must be \"mean\", \"sum\" or \"none\", got \"%s\"", c->fname, red);
    return elab_err();
  }
  IrType lt = elab_type(e, &a[0]), tt = elab_type(e, &a[1]);
  int ok = tt.dtype == IR_I32 && lt.rank == tt.rank + 1;
  for (int i = 0; ok && i < tt.rank; i++) ok = lt.dim[i] == tt.dim[i];
  if (!ok) {
    char b1[256], b2[256];
    elab_error(e, c->loc, "%s(): logits %s and targets %s: targets must be i32 with the logits' dims minus the last",
               c->fname, ir_type_str(&lt, b1, sizeof b1), ir_type_str(&tt, b2, sizeof b2));
    elab_note_origin(e, &a[0]);
    elab_note_origin(e, &a[1]);
    return elab_err();
  }
  int64_t ia[1] = {ignore};
  Value loss = elab_emit(e, c->loc, IR_OP_CROSS_ENTROPY, a, 2, ia, NULL, NULL, NULL);
  if (!strcmp(red, "none")) return loss;
  Value total = elab_reduce_all(e, c->loc, IR_OP_SUM, loss, 0);
  if (!strcmp(red, "sum")) return total;
  /* mean over counted tokens; count + (count == 0) keeps an all-ignored
   * batch at loss 0 instead of 0/0 */
  IrType vt = tt;
  vt.dtype = lt.dtype;
  double fa[1] = {(double)ignore};
  Value valid = elab_emit(e, c->loc, IR_OP_NE_SCALAR, &a[1], 1, NULL, fa, NULL, &vt);
  Value count = elab_reduce_all(e, c->loc, IR_OP_SUM, valid, 0);
  if (count.k == V_ERR) return count;
  IrType st = elab_type(e, &count);
  double zero[1] = {0};
  Value z = elab_emit(e, c->loc, IR_OP_FULL, NULL, 0, NULL, zero, NULL, &st);
  Value in[2] = {count, z};
  Value isz = elab_emit(e, c->loc, IR_OP_EQ, in, 2, NULL, NULL, NULL, NULL);
  in[1] = isz;
  Value den = elab_emit(e, c->loc, IR_OP_ADD, in, 2, NULL, NULL, NULL, NULL);
  in[0] = total;
  in[1] = den;
  return elab_emit(e, c->loc, IR_OP_DIV, in, 2, NULL, NULL, NULL, NULL);
}

static const Builtin builtins[] = {
  /* elementwise (also scalar math where it makes sense) */
  {"exp", {"x"}, 1, bi_unary, IR_OP_EXP},
  {"log", {"x"}, 1, bi_unary, IR_OP_LOG},
  {"sqrt", {"x"}, 1, bi_unary, IR_OP_SQRT},
  {"rsqrt", {"x"}, 1, bi_unary, IR_OP_RSQRT},
  {"tanh", {"x"}, 1, bi_unary, IR_OP_TANH},
  {"gelu", {"x"}, 1, bi_unary, IR_OP_GELU_ERF},
  {"gelu_erf", {"x"}, 1, bi_unary, IR_OP_GELU_ERF},
  {"gelu_tanh", {"x"}, 1, bi_unary, IR_OP_GELU_TANH},
  {"silu", {"x"}, 1, bi_unary, IR_OP_SILU},
  {"relu", {"x"}, 1, bi_unary, IR_OP_RELU},
  /* scalars */
  {"abs", {"x"}, 1, bi_abs, 0},
  {"float", {"x"}, 1, bi_float, 0},
  {"int", {"x"}, 1, bi_int, 0},
  {"mesh_size", {"axis"}, 1, bi_mesh_size, 0},
  {"error", {"message"}, 1, bi_error, 0},
  {"min", {NULL}, -1, bi_minmax, 0},
  {"max", {NULL}, -1, bi_minmax, IR_OP_MAX},
  /* reductions */
  {"sum", {"x", "axis", "keepdim"}, 1, bi_reduce, IR_OP_SUM},
  {"mean", {"x", "axis", "keepdim"}, 1, bi_reduce, IR_OP_MEAN},
  /* layout */
  {"reshape", {"x", "shape"}, 2, bi_reshape, 0},
  {"view", {"x", "shape"}, 2, bi_reshape, 0},
  {"transpose", {"x", "a", "b"}, 1, bi_transpose, 0},
  {"permute", {"x", "perm"}, 2, bi_permute, 0},
  {"slice", {"x", "axis", "start", "end"}, 4, bi_slice, 0},
  {"concat", {"xs", "axis"}, 1, bi_concat, 0},
  {"split", {"x", "parts", "axis"}, 2, bi_split, 0},
  {"broadcast", {"x", "shape"}, 2, bi_broadcast, 0},
  {"full", {"shape", "value"}, 2, bi_full, 0},
  {"size", {"x", "axis"}, 2, bi_size, 0},
  /* neural-network ops */
  {"softmax", {"x", "axis"}, 1, bi_softmax, IR_OP_SOFTMAX},
  {"log_softmax", {"x", "axis"}, 1, bi_softmax, IR_OP_LOG_SOFTMAX},
  {"layernorm", {"x", "eps"}, 1, bi_norm, IR_OP_LAYERNORM},
  {"rmsnorm", {"x", "eps"}, 1, bi_norm, IR_OP_RMSNORM},
  {"embedding", {"table", "ids"}, 2, bi_embedding, 0},
  {"causal_mask", {"x"}, 1, bi_causal_mask, 0},
  {"masked_fill", {"x", "keep", "value"}, 3, bi_masked_fill, 0},
  {"padding_mask", {"scores", "mask"}, 2, bi_padding_mask, 0},
  {"dropout", {"x", "p"}, 2, bi_dropout, 0},
  {"rope", {"x", "base", "axis"}, 1, bi_rope, 0},
  {"fused_attention", {"q", "k", "v", "causal", "scale", "docs", "window", "alibi", "bias"}, 3, bi_fused_attention, 0},
  {"topk_mask", {"x", "k"}, 2, bi_topk_mask, 0},
  {"arange", {"n", "start", "step"}, 1, bi_arange, 0},
  {"where", {"cond", "x", "y"}, 3, bi_where, 0},
  {"gather", {"x", "idx", "axis"}, 2, bi_gather, 0},
  {"randint", {"shape", "lo", "hi"}, 3, bi_rand, 1},
  {"rand", {"shape", "lo", "hi"}, 1, bi_rand, 0},
  {"capacity_mask", {"keep", "cap"}, 2, bi_capacity_mask, 0},
  {"moe_counts", {"routed"}, 1, bi_moe_counts, 0},
  {"moe_perm", {"x", "routed", "scale", "rows"}, 4, bi_moe_perm, 0},
  {"moe_unperm", {"y", "routed", "scale"}, 3, bi_moe_unperm, 0},
  {"gmm", {"a", "w", "counts"}, 3, bi_gmm, 0},
  {"metric", {"name", "x"}, 2, bi_metric, 0},
  {"cross_entropy", {"logits", "targets", "ignore_index", "reduction"}, 2, bi_cross_entropy, 0},
};
enum { NBUILTINS = sizeof builtins / sizeof builtins[0] };

int elab_builtin_lookup(const char *name) {
  for (int i = 0; i < NBUILTINS; i++)
    if (!strcmp(builtins[i].name, name)) return i;
  return -1;
}

const char *elab_builtin_name(int idx) {
  TS_ASSERT(idx >= 0 && idx < NBUILTINS);
  return builtins[idx].name;
}

Value elab_call_builtin(Elab *e, int idx, const ElabCall *c) {
  TS_ASSERT(idx >= 0 && idx < NBUILTINS);
  const Builtin *b = &builtins[idx];
  Value a[10];  /* one per Builtin.args entry */
  if (b->nreq >= 0 && elab_bind_args(e, c, b->args, b->nreq, a)) return elab_err();
  return b->fn(e, c, a, b->op);
}
