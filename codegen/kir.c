/* kir.c - the kernel IR (kir.h): building, verifying and printing kernels.
 * The builder checks operand types as it goes (a mismatch is a bug in the
 * lowering, so it asserts); cg_kernel_verify re-checks a finished kernel,
 * including the scoping rule that backends rely on: an operand is defined
 * earlier and inside a loop that is still open at the use. */
#include "kir.h"

const char *const cg_op_names[CG_OP_COUNT] = {
#define X(name, text, nargs) text,
    CG_OPS(X)
#undef X
};
const int cg_op_nargs[CG_OP_COUNT] = {
#define X(name, text, nargs) nargs,
    CG_OPS(X)
#undef X
};

const char *cg_type_name(CgType t) {
  static const char *const names[CG_TYPE_COUNT] = {"void", "i1", "i32", "i64", "f32", "f64", "bf16", "f16"};
  return t >= 0 && t < CG_TYPE_COUNT ? names[t] : "?";
}

CgType cg_type_of_dtype(IrDtype d) {
  switch (d) {
  case IR_F32: return CG_F32;
  case IR_F64: return CG_F64;
  case IR_I32: return CG_I32;
  case IR_BF16: return CG_BF16;
  case IR_F16: return CG_F16;
  default: return CG_VOID;
  }
}

CgKernel *cg_kernel_new(const char *name, int64_t grid) {
  CgKernel *k = ts_xcalloc(1, sizeof *k);
  /* keep only identifier characters: the name becomes a symbol */
  size_t j = 0;
  for (size_t i = 0; name[i] && j + 1 < sizeof k->name; i++) {
    char c = name[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (j > 0 && c >= '0' && c <= '9');
    k->name[j++] = ok ? c : '_';
  }
  if (!j) k->name[j++] = 'k';
  k->name[j] = 0;
  k->grid = grid;
  return k;
}

void cg_kernel_free(CgKernel *k) {
  if (!k) return;
  free(k->code.a);
  free(k);
}

static int push(CgKernel *k, CgInst in) {
  VEC_PUSH(k->code, in);
  return k->code.n - 1;
}
static CgType ty(const CgKernel *k, int v) {
  TS_ASSERT(v >= 0 && v < k->code.n);
  return k->code.a[v].type;
}

int cg_buf(CgKernel *k, CgType t, int64_t n, int written) {
  TS_ASSERT(k->nbuf < CG_MAX_BUFS && (t == CG_F32 || t == CG_F64 || t == CG_I32 || cg_type_is_half(t)));
  k->buf[k->nbuf] = (CgBuf){t, n, written};
  return k->nbuf++;
}

int cg_const_f(CgKernel *k, CgType t, double v) {
  TS_ASSERT(cg_type_is_float(t));
  return push(k, (CgInst){.op = CG_CONST, .type = t, .a = {-1, -1, -1}, .f = v});
}
int cg_const_i(CgKernel *k, CgType t, int64_t v) {
  TS_ASSERT(t == CG_I1 || t == CG_I32 || t == CG_I64);
  return push(k, (CgInst){.op = CG_CONST, .type = t, .a = {-1, -1, -1}, .i = v});
}
int cg_gid(CgKernel *k) { return push(k, (CgInst){.op = CG_GID, .type = CG_I64, .a = {-1, -1, -1}}); }

int cg_range(CgKernel *k, int n) {
  TS_ASSERT(ty(k, n) == CG_I64);
  k->open++;
  return push(k, (CgInst){.op = CG_RANGE, .type = CG_I64, .a = {n, -1, -1}});
}
void cg_end(CgKernel *k) {
  TS_ASSERT(k->open > 0);
  k->open--;
  push(k, (CgInst){.op = CG_END, .type = CG_VOID, .a = {-1, -1, -1}});
}
int cg_acc(CgKernel *k, CgType t, CgRed red, double init) {
  TS_ASSERT(cg_type_is_float(t));
  return push(k, (CgInst){.op = CG_ACC, .type = t, .a = {-1, -1, -1}, .red = red, .f = init});
}
void cg_update(CgKernel *k, int acc, int v) {
  TS_ASSERT(k->code.a[acc].op == CG_ACC && ty(k, v) == ty(k, acc));
  push(k, (CgInst){.op = CG_UPDATE, .type = CG_VOID, .a = {acc, v, -1}});
}
int cg_load(CgKernel *k, int buf, int idx) {
  TS_ASSERT(buf >= 0 && buf < k->nbuf && ty(k, idx) == CG_I64);
  return push(k, (CgInst){.op = CG_LOAD, .type = k->buf[buf].type, .a = {idx, -1, -1}, .buf = buf});
}
void cg_store(CgKernel *k, int buf, int idx, int v) {
  TS_ASSERT(buf >= 0 && buf < k->nbuf && ty(k, idx) == CG_I64 && ty(k, v) == k->buf[buf].type);
  push(k, (CgInst){.op = CG_STORE, .type = CG_VOID, .a = {idx, v, -1}, .buf = buf});
}
int cg_un(CgKernel *k, CgOp op, int a) {
  TS_ASSERT(op >= CG_NEG && op <= CG_ERF);
  TS_ASSERT(op == CG_NEG ? ty(k, a) != CG_I1 : cg_type_is_float(ty(k, a)));
  return push(k, (CgInst){.op = op, .type = ty(k, a), .a = {a, -1, -1}});
}
int cg_bin(CgKernel *k, CgOp op, int a, int b) {
  TS_ASSERT(op >= CG_ADD && op <= CG_OR && ty(k, a) == ty(k, b));
  CgType t = ty(k, a);
  if (op == CG_AND || op == CG_OR) TS_ASSERT(t == CG_I1);
  else TS_ASSERT(t != CG_I1 && t != CG_VOID);
  if (op == CG_MOD) TS_ASSERT(!cg_type_is_float(t));
  if (op == CG_XOR || op == CG_SHR) TS_ASSERT(t == CG_I32 || t == CG_I64);
  CgType rt = (op >= CG_LT && op <= CG_NE) ? CG_I1 : t;
  return push(k, (CgInst){.op = op, .type = rt, .a = {a, b, -1}});
}
int cg_select(CgKernel *k, int c, int a, int b) {
  TS_ASSERT(ty(k, c) == CG_I1 && ty(k, a) == ty(k, b));
  return push(k, (CgInst){.op = CG_SELECT, .type = ty(k, a), .a = {c, a, b}});
}
int cg_cast(CgKernel *k, CgType t, int a) {
  if (ty(k, a) == t) return a;
  /* narrowing back what an exact widening made gives the original value */
  const CgInst *w = &k->code.a[a];
  if (w->op == CG_CAST && ty(k, w->a[0]) == t &&
      ((t == CG_F32 && w->type == CG_F64) || (t == CG_I32 && (w->type == CG_F64 || w->type == CG_I64))))
    return w->a[0];
  TS_ASSERT(t != CG_VOID && ty(k, a) != CG_VOID);
  return push(k, (CgInst){.op = CG_CAST, .type = t, .a = {a, -1, -1}});
}

int cg_param(CgKernel *k, int slot) {
  TS_ASSERT(slot >= 0 && slot < CG_PARAM_COUNT);
  if (slot >= k->nparam) k->nparam = slot + 1;
  return push(k, (CgInst){.op = CG_PARAM, .type = CG_I64, .a = {-1, -1, -1}, .i = slot});
}

/* ---- verifier ---- */
int cg_kernel_verify(const CgKernel *k, char *err, size_t errlen) {
  int n = k->code.n, rc = 0;
  /* scope[i]: the innermost RANGE open when i was defined (-1: none; a
   * RANGE's own index lives in its loop).  Loops nest, so an operand is in
   * scope exactly when its scope RANGE is still open. */
  int *scope = ts_xmalloc((size_t)(n ? n : 1) * sizeof *scope);
  unsigned char *open = ts_xcalloc((size_t)(n ? n : 1), 1);
  int *stack = ts_xmalloc((size_t)(n ? n : 1) * sizeof *stack);
  int sp = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op < 0 || in->op >= CG_OP_COUNT) { rc = ts_errf(err, errlen, "kernel %s: %%%d: bad op", k->name, i); break; }
    scope[i] = sp ? stack[sp - 1] : -1;
    for (int j = 0; j < cg_op_nargs[in->op] && rc == 0; j++) {
      int a = in->a[j];
      if (a < 0 || a >= i)
        rc = ts_errf(err, errlen, "kernel %s: %%%d = %s: operand %d is not an earlier value", k->name, i, cg_op_names[in->op], a);
      else if (scope[a] >= 0 && !open[scope[a]])
        rc = ts_errf(err, errlen, "kernel %s: %%%d = %s: operand %%%d is used outside its loop", k->name, i, cg_op_names[in->op], a);
      else if (k->code.a[a].type == CG_VOID)
        rc = ts_errf(err, errlen, "kernel %s: %%%d = %s: operand %%%d has no value", k->name, i, cg_op_names[in->op], a);
    }
    if (rc) break;
    switch (in->op) {
    case CG_RANGE:
      scope[i] = i;
      open[i] = 1;
      stack[sp++] = i;
      break;
    case CG_END:
      if (sp == 0) rc = ts_errf(err, errlen, "kernel %s: %%%d: end without range", k->name, i);
      else open[stack[--sp]] = 0;
      break;
    case CG_LOAD:
    case CG_STORE:
      if (in->buf < 0 || in->buf >= k->nbuf) rc = ts_errf(err, errlen, "kernel %s: %%%d: buffer %d out of range", k->name, i, in->buf);
      else if (in->op == CG_STORE && !k->buf[in->buf].written)
        rc = ts_errf(err, errlen, "kernel %s: %%%d: store into read-only buffer b%d", k->name, i, in->buf);
      else if (k->code.a[in->a[0]].type != CG_I64)
        rc = ts_errf(err, errlen, "kernel %s: %%%d: index is not i64", k->name, i);
      else if (in->op == CG_STORE && k->code.a[in->a[1]].type != k->buf[in->buf].type)
        rc = ts_errf(err, errlen, "kernel %s: %%%d: stored value is not of the buffer's type", k->name, i);
      break;
    case CG_PARAM:
      if (in->i < 0 || in->i >= k->nparam || in->type != CG_I64)
        rc = ts_errf(err, errlen, "kernel %s: %%%d: param slot %lld outside the kernel's %d", k->name, i, (long long)in->i,
                     k->nparam);
      break;
    case CG_XOR:
    case CG_SHR: {
      CgType t0 = k->code.a[in->a[0]].type;
      if ((t0 != CG_I32 && t0 != CG_I64) || k->code.a[in->a[1]].type != t0 || in->type != t0)
        rc = ts_errf(err, errlen, "kernel %s: %%%d = %s: operands are not i32 or i64 of one type", k->name, i,
                     cg_op_names[in->op]);
      break;
    }
    case CG_UPDATE:
      if (k->code.a[in->a[0]].op != CG_ACC || k->code.a[in->a[0]].type != k->code.a[in->a[1]].type)
        rc = ts_errf(err, errlen, "kernel %s: %%%d: update of a non-accumulator or of another type", k->name, i);
      break;
    default: break;
    }
  }
  if (rc == 0 && sp != 0) rc = ts_errf(err, errlen, "kernel %s: %d range(s) never closed", k->name, sp);
  free(scope);
  free(open);
  free(stack);
  return rc;
}

/* ---- printer ---- */
static void print_const(const CgInst *in, StrBuf *out) {
  if (cg_type_is_float(in->type)) {
    char b[40];
    ts_fmt_double(b, sizeof b, in->f);
    sb_puts(out, b);
  } else {
    sb_printf(out, "%lld", (long long)in->i);
  }
}

void cg_kernel_print(const CgKernel *k, StrBuf *out) {
  sb_printf(out, "kernel %s(", k->name);
  for (int b = 0; b < k->nbuf; b++)
    sb_printf(out, "%sb%d: %s[%lld] %s", b ? ", " : "", b, cg_type_name(k->buf[b].type), (long long)k->buf[b].n,
              k->buf[b].written ? "out" : "in");
  sb_printf(out, ") grid=%lld", (long long)k->grid);
  if (k->nparam) sb_printf(out, " params=%d", k->nparam);
  sb_putc(out, '\n');
  int depth = 1;
  for (int i = 0; i < k->code.n; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op == CG_END) depth--;
    for (int d = 0; d < depth; d++) sb_puts(out, "  ");
    switch (in->op) {
    case CG_END: sb_puts(out, "}\n"); continue;
    case CG_STORE: sb_printf(out, "store b%d[%%%d], %%%d\n", in->buf, in->a[0], in->a[1]); continue;
    case CG_UPDATE:
      sb_printf(out, "update %%%d, %%%d\n", in->a[0], in->a[1]);
      continue;
    default: break;
    }
    sb_printf(out, "%%%d = %s", i, cg_op_names[in->op]);
    switch (in->op) {
    case CG_CONST: sb_putc(out, ' '); print_const(in, out); break;
    case CG_GID: break;
    case CG_PARAM: sb_printf(out, " %lld", (long long)in->i); break;
    case CG_ACC: {
      char b[40];
      ts_fmt_double(b, sizeof b, in->f);
      sb_printf(out, " %s init=%s", in->red == CG_RED_MAX ? "max" : "sum", b);
      break;
    }
    case CG_LOAD: sb_printf(out, " b%d[%%%d]", in->buf, in->a[0]); break;
    default:
      for (int j = 0; j < cg_op_nargs[in->op]; j++) sb_printf(out, "%s%%%d", j ? ", " : " ", in->a[j]);
      break;
    }
    sb_printf(out, " : %s", cg_type_name(in->type));
    if (in->op == CG_RANGE) { sb_puts(out, " {"); depth++; }
    sb_putc(out, '\n');
  }
}
