/* elab_tensor.c - the elaborator's tensor layer: emitting IR nodes with
 * diagnostics, numpy broadcasting, arithmetic on scalars and tensors,
 * matmul (with transpose folding), shape lists and type checks.
 *
 * Every shape error names both shapes in the message and adds a note at
 * each operand's origin (the expression that made the tensor), because
 * the place where shapes clash is rarely where the wrong shape was made. */
#include "elab_priv.h"
#include <math.h>
#include <stdarg.h>

IrType elab_type(Elab *e, const Value *v) {
  TS_ASSERT(v->k == V_TENSOR && v->i >= 0 && v->i < e->m->blocks.a[e->blk].n);
  return e->m->blocks.a[e->blk].nodes[v->i].type;
}

const char *elab_tstr(Elab *e, const Value *v, char *buf, size_t n) {
  IrType t = elab_type(e, v);
  return ir_type_str(&t, buf, n);
}

void elab_note_origin(Elab *e, const Value *v) {
  if (v->k != V_TENSOR) return;
  char buf[256];
  mdl_note(e->d, v->loc, "%s comes from here", elab_tstr(e, v, buf, sizeof buf));
}

/* Reports a problem between two tensors: the message, then where each came
 * from (once if both are the same value). */
static void shape_error2(Elab *e, MdlLoc loc, const Value *a, const Value *b, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void shape_error2(Elab *e, MdlLoc loc, const Value *a, const Value *b, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  elab_error(e, loc, "%s", msg);
  if (a) elab_note_origin(e, a);
  if (b && !(a && a->k == V_TENSOR && b->k == V_TENSOR && a->i == b->i)) elab_note_origin(e, b);
}

Value elab_emit(Elab *e, MdlLoc loc, IrOp op, const Value *in, int nin,
                const int64_t *ia, const double *fa, const char *sa, const IrType *type) {
  for (int i = 0; i < nin; i++) {
    if (in[i].k == V_ERR) return elab_err();
    TS_ASSERT(in[i].k == V_TENSOR);
  }
  if (e->abort) return elab_err();
  if (++e->steps > ELAB_MAX_STEPS) {   /* emitting is work too: bounds time and memory */
    elab_error(e, loc, "elaboration does too much work (more than %d steps); is a repeat count too large?",
               ELAB_MAX_STEPS);
    e->abort = 1;
    return elab_err();
  }
  if (e->m->blocks.a[e->blk].n >= ELAB_MAX_NODES) {
    /* every node is a step too, and ELAB_MAX_STEPS < ELAB_MAX_NODES stops first: a second guard */
    elab_error(e, loc, "the model is too large: more than %d IR nodes", ELAB_MAX_NODES);   /* internal */
    e->abort = 1;
    return elab_err();
  }
  int small[8] = {0};
  int *ids = nin <= 8 ? small : arena_alloc(&e->a, (size_t)nin * sizeof *ids);
  for (int i = 0; i < nin; i++) ids[i] = (int)in[i].i;
  char err[1024];
  int id = ir_emit(e->m, e->blk, op, ids, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) {
    elab_error(e, loc, "%s", err);
    for (int i = 0; i < nin; i++) {
      int dup = 0;
      for (int j = 0; j < i; j++) dup |= in[j].i == in[i].i;
      if (!dup) elab_note_origin(e, &in[i]);
    }
    return elab_err();
  }
  return elab_tensor(id, loc);
}

int elab_check_type(Elab *e, MdlLoc loc, const IrType *t, const char *what) {
  if (t->rank > IR_MAX_RANK) {
    elab_error(e, loc, "%s: rank %d exceeds the maximum of %d", what, t->rank, IR_MAX_RANK);
    return -1;
  }
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dim[i] < 1) {
      elab_error(e, loc, "%s: dim %d is %lld; dims must be >= 1", what, i, (long long)t->dim[i]);
      return -1;
    }
    /* the IR's own bounds: one size <= 2^40, element count far from overflow */
    if (t->dim[i] > ELAB_MAX_DIM || n > INT64_MAX / 4 / t->dim[i]) {
      elab_error(e, loc, "%s: too many elements (the element count overflows)", what);
      return -1;
    }
    n *= t->dim[i];
  }
  return 0;
}

int elab_shape_list(Elab *e, const Value *list, MdlLoc loc, IrType *t, int allow_infer, int *infer,
                    const char *what) {
  if (infer) *infer = -1;
  if (list->k == V_ERR) return -1;
  if (list->k != V_LIST && list->k != V_TUPLE) {
    char buf[256];
    elab_error(e, loc, "%s: expected a shape list like [a, b], got %s", what,
               elab_value_desc(e, list, buf, sizeof buf));
    return -1;
  }
  if (list->n > IR_MAX_RANK) {
    elab_error(e, loc, "%s: rank %d exceeds the maximum of %d", what, list->n, IR_MAX_RANK);
    return -1;
  }
  t->rank = list->n;
  for (int i = 0; i < list->n; i++) {
    const Value *v = &list->items[i];
    if (v->k == V_ERR) return -1;
    if (v->k != V_INT) {
      char buf[256];
      elab_error(e, v->loc, "%s: shape entries must be ints, got %s", what, elab_value_desc(e, v, buf, sizeof buf));
      return -1;
    }
    if (v->i == -1 && allow_infer) {
      if (*infer >= 0) {
        elab_error(e, v->loc, "%s: only one dim may be -1", what);
        return -1;
      }
      *infer = i;
    } else if (v->i < 1) {
      elab_error(e, v->loc, "%s: dim %d is %lld; dims must be >= 1", what, i, (long long)v->i);
      return -1;
    }
    t->dim[i] = v->i;
    t->dname[i] = v->s;
  }
  return 0;
}

int elab_axis(Elab *e, MdlLoc loc, const Value *axis, int rank, const Value *x, const char *what) {
  if (axis->k == V_ERR) return -1;
  if (axis->k != V_INT) {
    char buf[256];
    elab_error(e, axis->k == V_TENSOR ? loc : axis->loc, "%s: axis must be an int, got %s", what,
               elab_value_desc(e, axis, buf, sizeof buf));
    elab_note_origin(e, axis);
    return -1;
  }
  int64_t a = axis->i < 0 ? axis->i + rank : axis->i;
  if (a < 0 || a >= rank) {
    char buf[256] = "a scalar";
    if (x && x->k == V_TENSOR) elab_tstr(e, x, buf, sizeof buf);
    elab_error(e, axis->loc, "%s: axis %lld is out of range for %s (rank %d)", what, (long long)axis->i, buf, rank);
    if (x) elab_note_origin(e, x);
    return -1;
  }
  return (int)a;
}

Value elab_broadcast_to(Elab *e, MdlLoc loc, Value x, const IrType *t) {
  if (x.k == V_ERR) return x;
  IrType xt = elab_type(e, &x);
  int ok = xt.rank <= t->rank;
  for (int i = 0; ok && i < xt.rank; i++) {
    int64_t d = xt.dim[xt.rank - 1 - i], r = t->dim[t->rank - 1 - i];
    if (d != r && d != 1) ok = 0;
  }
  if (!ok) {
    char b1[256], b2[256];
    IrType tt = *t;
    tt.dtype = xt.dtype;
    elab_error(e, loc, "cannot broadcast %s to %s (dims must be equal or 1, aligned from the right)",
               ir_type_str(&xt, b1, sizeof b1), ir_type_str(&tt, b2, sizeof b2));
    elab_note_origin(e, &x);
    return elab_err();
  }
  if (xt.rank == t->rank) {
    int same = 1;
    for (int i = 0; i < xt.rank; i++) same &= xt.dim[i] == t->dim[i];
    if (same) return x;
  }
  IrType r = *t;
  r.dtype = xt.dtype;
  for (int i = 0; i < xt.rank; i++) {   /* keep x's names where the size is kept */
    int j = r.rank - 1 - i;
    if (!r.dname[j] && xt.dim[xt.rank - 1 - i] == r.dim[j]) r.dname[j] = xt.dname[xt.rank - 1 - i];
  }
  return elab_emit(e, loc, IR_OP_BROADCAST, &x, 1, NULL, NULL, NULL, &r);
}

Value elab_reshape(Elab *e, MdlLoc loc, Value x, const IrType *t) {
  if (x.k == V_ERR) return x;
  IrType xt = elab_type(e, &x), r = *t;
  r.dtype = xt.dtype;
  if (ir_type_equal(&xt, &r)) return x;
  return elab_emit(e, loc, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &r);
}

const char *elab_op_text(int op) {
  switch (op) {
  case '+': return "+";
  case '-': return "-";
  case '*': return "*";
  case '/': return "/";
  case '%': return "%";
  case '@': return "@";
  case '<': return "<";
  case '>': return ">";
  case MDL_OP_FLOORDIV: return "//";
  case MDL_OP_LE: return "<=";
  case MDL_OP_GE: return ">=";
  case MDL_OP_EQ: return "==";
  case MDL_OP_NE: return "!=";
  case MDL_OP_AND: return "and";
  case MDL_OP_OR: return "or";
  case MDL_OP_NOT: return "not";
  default: return "?";
  }
}

static int is_compare(int op) {
  return op == '<' || op == '>' || op == MDL_OP_LE || op == MDL_OP_GE || op == MDL_OP_EQ || op == MDL_OP_NE;
}

static Value compare_result(int op, int cmp, MdlLoc loc) {   /* cmp: <0, 0, >0 */
  int r = 0;
  switch (op) {
  case '<': r = cmp < 0; break;
  case '>': r = cmp > 0; break;
  case MDL_OP_LE: r = cmp <= 0; break;
  case MDL_OP_GE: r = cmp >= 0; break;
  case MDL_OP_EQ: r = cmp == 0; break;
  case MDL_OP_NE: r = cmp != 0; break;
  }
  return elab_bool(r, loc);
}

/* int op int, exactly: overflow, division by zero and inexact '/' are errors. */
static Value int_binary(Elab *e, MdlLoc loc, int op, int64_t a, int64_t b) {
  int64_t r = 0;
  if (is_compare(op)) return compare_result(op, a < b ? -1 : a > b, loc);
  if ((op == '/' || op == MDL_OP_FLOORDIV || op == '%') && b == 0) {
    elab_error(e, loc, "division by zero: %lld %s 0", (long long)a, elab_op_text(op));
    return elab_err();
  }
  int ovf = 0;
  switch (op) {
  case '+': ovf = __builtin_add_overflow(a, b, &r); break;
  case '-': ovf = __builtin_sub_overflow(a, b, &r); break;
  case '*': ovf = __builtin_mul_overflow(a, b, &r); break;
  case '/':
  case MDL_OP_FLOORDIV:
  case '%':
    if (a == INT64_MIN && b == -1) { ovf = 1; break; }
    if (op == '/' && a % b != 0) {
      elab_error(e, loc, "%lld / %lld does not divide exactly (use // for floor division)", (long long)a,
                 (long long)b);
      return elab_err();
    }
    r = a / b;
    if (op != '/' && a % b != 0 && ((a < 0) != (b < 0))) r--;   /* floor, like Python */
    if (op == '%') r = a - r * b;
    break;
  default:
    /* the parser's binary operators are + - * / // % @ and the comparisons; and/or never come here */
    elab_error(e, loc, "operator '%s' does not apply to ints", elab_op_text(op));   /* internal */
    return elab_err();
  }
  if (ovf) {
    elab_error(e, loc, "integer overflow in %lld %s %lld", (long long)a, elab_op_text(op), (long long)b);
    return elab_err();
  }
  return elab_int(r, loc);
}

static Value float_binary(Elab *e, MdlLoc loc, int op, double a, double b) {
  if (is_compare(op)) return compare_result(op, a < b ? -1 : a > b, loc);
  if ((op == '/' || op == MDL_OP_FLOORDIV || op == '%') && b == 0) {
    elab_error(e, loc, "division by zero: %g %s 0", a, elab_op_text(op));
    return elab_err();
  }
  switch (op) {
  case '+': return elab_float(a + b, loc);
  case '-': return elab_float(a - b, loc);
  case '*': return elab_float(a * b, loc);
  case '/': return elab_float(a / b, loc);
  case MDL_OP_FLOORDIV: return elab_float(floor(a / b), loc);
  case '%': {
    double r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return elab_float(r, loc);
  }
  default:
    elab_error(e, loc, "operator '%s' does not apply to floats", elab_op_text(op));   /* internal */
    return elab_err();
  }
}

static Value scalar_binary(Elab *e, MdlLoc loc, int op, Value a, Value b) {
  if (a.k == V_INT && b.k == V_INT) return int_binary(e, loc, op, a.i, b.i);
  if (elab_is_num(&a) && elab_is_num(&b)) return float_binary(e, loc, op, elab_num(&a), elab_num(&b));
  if ((op == MDL_OP_EQ || op == MDL_OP_NE) && a.k == b.k) {
    int eq = 0;
    if (a.k == V_BOOL) eq = a.i == b.i;
    else if (a.k == V_STR) eq = strcmp(a.s, b.s) == 0;
    else if (a.k == V_NONE) eq = 1;
    else goto bad;
    return elab_bool(op == MDL_OP_EQ ? eq : !eq, loc);
  }
  if ((op == MDL_OP_EQ || op == MDL_OP_NE) && (a.k == V_NONE || b.k == V_NONE))
    return elab_bool(op == MDL_OP_NE, loc);
bad:;
  char b1[256], b2[256];
  elab_error(e, loc, "operator '%s' cannot combine %s and %s", elab_op_text(op),
             elab_value_desc(e, &a, b1, sizeof b1), elab_value_desc(e, &b, b2, sizeof b2));
  return elab_err();
}

static int need_float_tensor(Elab *e, MdlLoc loc, int op, const Value *t) {
  IrType tt = elab_type(e, t);
  if (ir_dtype_is_float(tt.dtype)) return 0;
  char buf[256];
  elab_error(e, loc, "operator '%s' needs a float tensor, got %s", elab_op_text(op), ir_type_str(&tt, buf, sizeof buf));
  elab_note_origin(e, t);
  return -1;
}

/* tensor op number, or number op tensor (scalar_left). */
/* CMP's pred for a comparison operator (ops.def: 0 ==, 1 !=, 2 <, 3 <=, 4 >, 5 >=) */
static int64_t cmp_pred(int op) {
  switch (op) {
  case MDL_OP_EQ: return 0;
  case MDL_OP_NE: return 1;
  case '<': return 2;
  case MDL_OP_LE: return 3;
  case '>': return 4;
  default: return 5;
  }
}

/* tensor op number on an i32 tensor or a comparison: the number as a
 * full tensor of t's type, then the tensor-tensor op (s is the scalar) */
static Value tensor_tensor(Elab *e, MdlLoc loc, int op, Value a, Value b);
static Value scalar_as_tensor(Elab *e, MdlLoc loc, int op, Value t, const Value *s, int scalar_left) {
  IrType tt = elab_type(e, &t);
  char b1[256];
  if (tt.dtype == IR_I32 && s->k != V_INT) {
    elab_error(e, loc, "operator '%s' combines the i32 tensor %s with the float %g: no implicit int <-> float "
               "conversion (write an int, or float(x) to make the tensor float)", elab_op_text(op),
               ir_type_str(&tt, b1, sizeof b1), elab_num(s));
    return elab_err();
  }
  if (tt.dtype == IR_I32 && !scalar_left && (op == MDL_OP_FLOORDIV || op == '%') && s->i == 0) {
    elab_error(e, loc, "integer division by zero: %s %s 0", ir_type_str(&tt, b1, sizeof b1), elab_op_text(op));
    return elab_err();
  }
  if (tt.dtype == IR_I32 && (s->k == V_INT && (s->i > INT32_MAX || s->i < INT32_MIN))) {
    elab_error(e, loc, "%lld does not fit an i32 tensor element", (long long)s->i);
    return elab_err();
  }
  double fa[1] = {elab_num(s)};
  Value f = elab_emit(e, loc, IR_OP_FULL, NULL, 0, NULL, fa, NULL, &tt);
  return scalar_left ? tensor_tensor(e, loc, op, f, t) : tensor_tensor(e, loc, op, t, f);
}

static Value tensor_scalar(Elab *e, MdlLoc loc, int op, Value t, const Value *s, int scalar_left) {
  IrDtype dt = elab_type(e, &t).dtype;
  if (is_compare(op) || (dt == IR_I32 && (op != '+' && op != '*' && (op != '-' || scalar_left))))
    return scalar_as_tensor(e, loc, op, t, s, scalar_left);
  if (dt == IR_I32 && s->k != V_INT) return scalar_as_tensor(e, loc, op, t, s, scalar_left);   /* refuses */
  double c = elab_num(s);
  if (dt != IR_I32 && need_float_tensor(e, loc, op, &t)) return elab_err();
  double fa[1];
  switch (op) {
  case '+':
    fa[0] = c;
    return elab_emit(e, loc, IR_OP_ADDS, &t, 1, NULL, fa, NULL, NULL);
  case '*':
    fa[0] = c;
    return elab_emit(e, loc, IR_OP_MULS, &t, 1, NULL, fa, NULL, NULL);
  case '-':
    if (!scalar_left) {
      fa[0] = -c;
      return elab_emit(e, loc, IR_OP_ADDS, &t, 1, NULL, fa, NULL, NULL);
    } else {                                   /* c - x = -x + c */
      Value n = elab_emit(e, loc, IR_OP_NEG, &t, 1, NULL, NULL, NULL, NULL);
      fa[0] = c;
      return elab_emit(e, loc, IR_OP_ADDS, &n, 1, NULL, fa, NULL, NULL);
    }
  case '/':
    if (!scalar_left) {
      if (c == 0) {
        elab_error(e, loc, "division of a tensor by zero");
        return elab_err();
      }
      fa[0] = 1.0 / c;
      return elab_emit(e, loc, IR_OP_MULS, &t, 1, NULL, fa, NULL, NULL);
    } else {                                   /* c / x = full(c) / x */
      IrType tt = elab_type(e, &t);
      fa[0] = c;
      Value f = elab_emit(e, loc, IR_OP_FULL, NULL, 0, NULL, fa, NULL, &tt);
      Value in[2] = {f, t};
      return elab_emit(e, loc, IR_OP_DIV, in, 2, NULL, NULL, NULL, NULL);
    }
  default:
    elab_error(e, loc, "operator '%s' is not defined between a float tensor and a number (+ - * / and comparisons; // and %% take i32 tensors)",
               elab_op_text(op));
    return elab_err();
  }
}

/* Broadcast result shape of a and b (numpy: right-aligned, equal or 1);
 * names from the operand whose size survives (a first).  -1 on mismatch
 * with *bad set to the result-aligned dim index. */
static int broadcast_shape(const IrType *a, const IrType *b, IrType *r, int *bad) {
  memset(r, 0, sizeof *r);
  r->dtype = a->dtype;
  r->rank = a->rank > b->rank ? a->rank : b->rank;
  for (int i = 0; i < r->rank; i++) {
    int ia = a->rank - 1 - i, ib = b->rank - 1 - i, j = r->rank - 1 - i;
    int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
    const char *na = ia >= 0 ? a->dname[ia] : NULL, *nb = ib >= 0 ? b->dname[ib] : NULL;
    if (da != db && da != 1 && db != 1) {
      *bad = j;
      return -1;
    }
    r->dim[j] = da > db ? da : db;
    r->dname[j] = (ia >= 0 && da == r->dim[j] && na) ? na : (ib >= 0 && db == r->dim[j]) ? nb : NULL;
  }
  return 0;
}

static Value tensor_tensor(Elab *e, MdlLoc loc, int op, Value a, Value b) {
  IrOp iop;
  switch (op) {
  case '+': iop = IR_OP_ADD; break;
  case '-': iop = IR_OP_SUB; break;
  case '*': iop = IR_OP_MUL; break;
  case '/': iop = IR_OP_DIV; break;
  case MDL_OP_FLOORDIV: iop = IR_OP_FLOORDIV; break;
  case '%': iop = IR_OP_MOD; break;
  default:
    if (is_compare(op)) { iop = IR_OP_CMP; break; }
    shape_error2(e, loc, &a, &b, "operator '%s' is not defined on tensors (+ - * / // %% @ and comparisons)",
                 elab_op_text(op));   /* internal */
    return elab_err();
  }
  IrType ta = elab_type(e, &a), tb = elab_type(e, &b), r;
  char b1[256], b2[256];
  int is_int = ta.dtype == IR_I32;
  if ((!ir_dtype_is_float(ta.dtype) && !is_int) || ta.dtype != tb.dtype) {
    shape_error2(e, loc, &a, &b, "operator '%s' needs tensors of one dtype (f32, f64 or i32), got %s and %s%s",
                 elab_op_text(op), ir_type_str(&ta, b1, sizeof b1), ir_type_str(&tb, b2, sizeof b2),
                 ta.dtype != tb.dtype ? ": no implicit int <-> float conversion, use float(x) or int(x)" : "");
    return elab_err();
  }
  if (is_int && iop == IR_OP_DIV) {
    shape_error2(e, loc, &a, &b, "'/' on i32 tensors %s and %s: use // (floor division) or float(x) / float(y)",
                 ir_type_str(&ta, b1, sizeof b1), ir_type_str(&tb, b2, sizeof b2));
    return elab_err();
  }
  if (!is_int && (iop == IR_OP_FLOORDIV || iop == IR_OP_MOD)) {
    shape_error2(e, loc, &a, &b, "'%s' takes i32 tensors, got %s and %s (int(x) converts, truncating)",
                 elab_op_text(op), ir_type_str(&ta, b1, sizeof b1), ir_type_str(&tb, b2, sizeof b2));
    return elab_err();
  }
  int bad;
  if (broadcast_shape(&ta, &tb, &r, &bad)) {
    int ia = bad - (r.rank - ta.rank), ib = bad - (r.rank - tb.rank);
    shape_error2(e, loc, &a, &b, "shapes %s and %s do not broadcast for '%s' (%lld vs %lld)",
                 ir_type_str(&ta, b1, sizeof b1), ir_type_str(&tb, b2, sizeof b2), elab_op_text(op),
                 (long long)ta.dim[ia], (long long)tb.dim[ib]);
    return elab_err();
  }
  Value in[2] = {elab_broadcast_to(e, loc, a, &r), elab_broadcast_to(e, loc, b, &r)};
  int64_t pred = cmp_pred(op);
  return elab_emit(e, loc, iop, in, 2, iop == IR_OP_CMP ? &pred : NULL, NULL, NULL, NULL);
}

Value elab_binary(Elab *e, MdlLoc loc, int op, Value a, Value b) {
  if (a.k == V_ERR || b.k == V_ERR) return elab_err();
  if (op == '@') return elab_matmul(e, loc, a, b);
  if ((op == MDL_OP_EQ || op == MDL_OP_NE) && (a.k == V_NONE || b.k == V_NONE))   /* `x != none`: was it given? */
    return elab_bool((a.k == b.k) == (op == MDL_OP_EQ), loc);
  if (a.k == V_TENSOR && b.k == V_TENSOR) return tensor_tensor(e, loc, op, a, b);
  if (a.k == V_TENSOR || b.k == V_TENSOR) {
    int left = b.k == V_TENSOR;                /* the scalar is on the left */
    Value t = left ? b : a, s = left ? a : b;
    if (!elab_is_num(&s)) {
      char b1[256], b2[256];
      elab_error(e, loc, "operator '%s' cannot combine %s and %s", elab_op_text(op),
                 elab_value_desc(e, &a, b1, sizeof b1), elab_value_desc(e, &b, b2, sizeof b2));
      return elab_err();
    }
    return tensor_scalar(e, loc, op, t, &s, left);
  }
  return scalar_binary(e, loc, op, a, b);
}

Value elab_negate(Elab *e, MdlLoc loc, Value a) {
  switch (a.k) {
  case V_ERR: return a;
  case V_INT:
    if (a.i == INT64_MIN) {
      elab_error(e, loc, "integer overflow in -(%lld)", (long long)a.i);
      return elab_err();
    }
    return elab_int(-a.i, loc);
  case V_FLOAT: return elab_float(-a.f, loc);
  case V_TENSOR:
    if (elab_type(e, &a).dtype != IR_I32 && need_float_tensor(e, loc, '-', &a)) return elab_err();
    return elab_emit(e, loc, IR_OP_NEG, &a, 1, NULL, NULL, NULL, NULL);
  default: {
    char buf[256];
    elab_error(e, loc, "unary '-' needs a number or a tensor, got %s", elab_value_desc(e, &a, buf, sizeof buf));
    return elab_err();
  }
  }
}

/* If v is a PERMUTE that swaps exactly its last two dims (what transpose()
 * makes), returns its input's node id, else -1. */
static int swapped_input(Elab *e, const Value *v) {
  const IrNode *n = &e->m->blocks.a[e->blk].nodes[v->i];
  int r = n->type.rank;
  if (n->op != IR_OP_PERMUTE || r < 2) return -1;
  for (int i = 0; i < r - 2; i++)
    if (n->ia[i] != i) return -1;
  if (n->ia[r - 2] != r - 1 || n->ia[r - 1] != r - 2) return -1;
  return n->in[0];
}

/* Shape with the last two dims of t replaced by the last two of `last2`,
 * and the leading dims by `batch` (rank nb). */
static IrType with_batch(const IrType *batch, int nb, const IrType *last2) {
  IrType r = *last2;
  r.rank = nb + 2;
  for (int i = 0; i < nb; i++) { r.dim[i] = batch->dim[i]; r.dname[i] = batch->dname[i]; }
  for (int i = 0; i < 2; i++) {
    r.dim[nb + i] = last2->dim[last2->rank - 2 + i];
    r.dname[nb + i] = last2->dname[last2->rank - 2 + i];
  }
  return r;
}

/* a[..., M, K] @ b[..., K, N].  A transposed operand made by transpose()
 * is folded into the matmul's ta/tb; batch dims broadcast (numpy matmul);
 * rank-1 operands are treated as a row (a) or a column (b) and the unit
 * dim is dropped again. */
Value elab_matmul(Elab *e, MdlLoc loc, Value a, Value b) {
  char b1[256], b2[256];
  if (a.k != V_TENSOR || b.k != V_TENSOR) {
    elab_error(e, loc, "'@' needs two tensors, got %s and %s", elab_value_desc(e, &a, b1, sizeof b1),
               elab_value_desc(e, &b, b2, sizeof b2));
    return elab_err();
  }
  IrType A = elab_type(e, &a), B = elab_type(e, &b);
  if (!ir_dtype_is_float(A.dtype) || A.dtype != B.dtype || A.rank < 1 || B.rank < 1) {
    shape_error2(e, loc, &a, &b, "'@' needs float tensors of rank >= 1 and the same dtype, got %s and %s",
                 ir_type_str(&A, b1, sizeof b1), ir_type_str(&B, b2, sizeof b2));
    return elab_err();
  }
  int64_t K = A.dim[A.rank - 1], K2 = B.dim[B.rank >= 2 ? B.rank - 2 : 0];
  if (K != K2) {
    shape_error2(e, loc, &a, &b, "matmul contraction mismatch: %s @ %s (%lld vs %lld)",
                 ir_type_str(&A, b1, sizeof b1), ir_type_str(&B, b2, sizeof b2), (long long)K, (long long)K2);
    return elab_err();
  }
  int row = A.rank == 1, col = B.rank == 1;
  if (row) {   /* [K] -> [1, K] */
    IrType t = A;
    t.rank = 2; t.dim[0] = 1; t.dname[0] = NULL; t.dim[1] = A.dim[0]; t.dname[1] = A.dname[0];
    a = elab_reshape(e, loc, a, &t);
    A = t;
  }
  if (col) {   /* [K] -> [K, 1] */
    IrType t = B;
    t.rank = 2; t.dim[1] = 1; t.dname[1] = NULL;
    b = elab_reshape(e, loc, b, &t);
    B = t;
  }
  if (a.k == V_ERR || b.k == V_ERR) return elab_err();

  /* fold transposes: operate on the permute's input with ta/tb set */
  int64_t ia[2] = {0, 0};
  Value pa = a, pb = b;
  int in;
  if ((in = swapped_input(e, &a)) >= 0) { pa = elab_tensor(in, a.loc); ia[0] = 1; }
  if ((in = swapped_input(e, &b)) >= 0) { pb = elab_tensor(in, b.loc); ia[1] = 1; }

  int na = A.rank - 2, nb = B.rank - 2;
  int direct = nb == 0 || na == nb;
  for (int i = 0; direct && nb > 0 && i < na; i++) direct = A.dim[i] == B.dim[i];
  if (!direct) {   /* broadcast the batch dims of both to a common shape */
    IrType ba = A, bb = B, r;
    ba.rank = na; bb.rank = nb;
    int bad;
    if (broadcast_shape(&ba, &bb, &r, &bad)) {
      shape_error2(e, loc, &a, &b, "matmul batch dims do not broadcast: %s @ %s",
                   ir_type_str(&A, b1, sizeof b1), ir_type_str(&B, b2, sizeof b2));
      return elab_err();
    }
    IrType PA = elab_type(e, &pa), PB = elab_type(e, &pb);
    IrType ta = with_batch(&r, r.rank, &PA), tb = with_batch(&r, r.rank, &PB);
    pa = elab_broadcast_to(e, loc, pa, &ta);
    pb = elab_broadcast_to(e, loc, pb, &tb);
  }
  Value in2[2] = {pa, pb};
  Value y = elab_emit(e, loc, IR_OP_MATMUL, in2, 2, ia, NULL, NULL, NULL);
  if (y.k == V_ERR || (!row && !col)) return y;
  IrType t = elab_type(e, &y), s = t;   /* drop the unit dims again */
  s.rank = 0;
  for (int i = 0; i < t.rank; i++) {
    if ((row && i == t.rank - 2) || (col && i == t.rank - 1)) continue;
    s.dim[s.rank] = t.dim[i];
    s.dname[s.rank++] = t.dname[i];
  }
  for (int i = s.rank; i < IR_MAX_RANK; i++) { s.dim[i] = 0; s.dname[i] = NULL; }
  return elab_reshape(e, loc, y, &s);
}

Value elab_reduce_all(Elab *e, MdlLoc loc, IrOp op, Value x, int keepdim) {
  if (x.k == V_ERR) return x;
  IrType t = elab_type(e, &x);
  if (t.rank == 0) return x;
  if (t.rank > 1) {   /* one reduction over the flattened tensor */
    IrType flat = t;
    flat.rank = 1;
    flat.dim[0] = ir_type_numel(&t);
    for (int i = 0; i < IR_MAX_RANK; i++) flat.dname[i] = NULL;
    for (int i = 1; i < IR_MAX_RANK; i++) flat.dim[i] = 0;
    x = elab_reshape(e, loc, x, &flat);
  }
  int64_t ia[2] = {0, 0};
  Value y = elab_emit(e, loc, op, &x, 1, ia, NULL, NULL, NULL);
  if (!keepdim || y.k == V_ERR) return y;
  IrType ones = t;
  for (int i = 0; i < t.rank; i++) { ones.dim[i] = 1; ones.dname[i] = NULL; }
  return elab_reshape(e, loc, y, &ones);
}
