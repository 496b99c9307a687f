/* cprint.c - the kernel IR as C source (cg_kernel_c_text, cg.h): the second
 * printer the kernel IR is designed for.  The CUDA printer will be this
 * one with the parallel space mapped to threads (gid = blockIdx.x *
 * blockDim.x + threadIdx.x) instead of the outer loop; everything inside
 * an iteration prints the same.  Also a readable debugging aid and a
 * cross-check of the LLVM backend (tests/codegen compiles it with cc).
 *
 * One C statement per instruction: values are `const` locals named after
 * their instruction (v12), accumulators plain locals, RANGE a for loop.
 * Buffers are not `restrict`: an output may share memory with an input. */
#include "cg.h"
#include <math.h>
#include <stdint.h>

static const char *c_type(CgType t) {
  switch (t) {
  case CG_I1: return "int";
  case CG_I32: return "int32_t";
  case CG_I64: return "int64_t";
  case CG_F32: return "float";
  case CG_F64: return "double";
  default: return "void";
  }
}

static void c_float(StrBuf *out, CgType t, double v) {
  if (isnan(v)) sb_puts(out, t == CG_F32 ? "(float)NAN" : "(double)NAN");
  else if (isinf(v)) sb_puts(out, v > 0 ? "(double)INFINITY" : "-(double)INFINITY");
  else {
    char b[40];
    ts_fmt_double(b, sizeof b, v);
    sb_printf(out, "%s%s", b, t == CG_F32 ? "f" : "");
  }
}

/* helpers the kernels call: NaN-propagating max (the max accumulator),
 * and the saturating float -> integer casts of the kernel IR */
static const char *const c_prelude =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "static inline double cg_maximum(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }\n"
    "static inline int32_t cg_to_i32(double x) { return x != x ? 0 : x >= 2147483647.0 ? INT32_MAX : x <= -2147483648.0 ? INT32_MIN : (int32_t)x; }\n"
    "static inline int64_t cg_to_i64(double x) { return x != x ? 0 : x >= 9223372036854775807.0 ? INT64_MAX : x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x; }\n";

static void c_expr(const CgKernel *k, const CgInst *in, StrBuf *out) {
  const CgInst *a0 = in->a[0] >= 0 ? &k->code.a[in->a[0]] : NULL;
  int fl = a0 && cg_type_is_float(a0->type), f32 = a0 && a0->type == CG_F32;
  const char *fs = f32 ? "f" : "";
  int x = in->a[0], y = in->a[1];
  switch (in->op) {
  case CG_CONST:
    if (cg_type_is_float(in->type)) c_float(out, in->type, in->f);
    else if (in->i == INT64_MIN) sb_puts(out, "INT64_MIN");   /* -9223372036854775808LL is not a literal */
    else sb_printf(out, "%lldLL", (long long)in->i);
    return;
  case CG_LOAD: sb_printf(out, "b%d[v%d]", in->buf, x); return;
  case CG_NEG: sb_printf(out, "-v%d", x); return;
  case CG_EXP: sb_printf(out, "exp%s(v%d)", fs, x); return;
  case CG_LOG: sb_printf(out, "log%s(v%d)", fs, x); return;
  case CG_SQRT: sb_printf(out, "sqrt%s(v%d)", fs, x); return;
  case CG_RSQRT: sb_printf(out, "1 / sqrt%s(v%d)", fs, x); return;
  case CG_TANH: sb_printf(out, "tanh%s(v%d)", fs, x); return;
  case CG_ERF: sb_printf(out, "erf%s(v%d)", fs, x); return;
  case CG_ADD:
  case CG_SUB:
  case CG_MUL: {
    const char *o = in->op == CG_ADD ? "+" : in->op == CG_SUB ? "-" : "*";
    /* integer arithmetic wraps in the kernel IR (the RNG's hash relies on
     * it); C's signed overflow is undefined, so ints go through unsigned */
    if (fl) sb_printf(out, "v%d %s v%d", x, o, y);
    else if (a0->type == CG_I64) sb_printf(out, "(int64_t)((uint64_t)v%d %s (uint64_t)v%d)", x, o, y);
    else sb_printf(out, "(int32_t)((uint32_t)v%d %s (uint32_t)v%d)", x, o, y);
    return;
  }
  case CG_DIV: sb_printf(out, "v%d / v%d", x, y); return;
  case CG_MOD: sb_printf(out, "v%d %% v%d", x, y); return;
  case CG_XOR: sb_printf(out, "v%d ^ v%d", x, y); return;
  case CG_SHR:   /* logical: shift the unsigned bits */
    if (a0->type == CG_I64) sb_printf(out, "(int64_t)((uint64_t)v%d >> v%d)", x, y);
    else sb_printf(out, "(int32_t)((uint32_t)v%d >> v%d)", x, y);
    return;
  case CG_PARAM: sb_printf(out, "prm[%lld]", (long long)in->i); return;
  case CG_MAX:
  case CG_MIN:
    if (fl) sb_printf(out, "f%s%s(v%d, v%d)", in->op == CG_MAX ? "max" : "min", fs, x, y);
    else sb_printf(out, "v%d %s v%d ? v%d : v%d", x, in->op == CG_MAX ? ">" : "<", y, x, y);
    return;
  case CG_LT: sb_printf(out, "v%d < v%d", x, y); return;
  case CG_LE: sb_printf(out, "v%d <= v%d", x, y); return;
  case CG_EQ: sb_printf(out, "v%d == v%d", x, y); return;
  case CG_NE: sb_printf(out, "v%d != v%d", x, y); return;   /* true for NaN, as the IR's ne */
  case CG_AND: sb_printf(out, "v%d && v%d", x, y); return;
  case CG_OR: sb_printf(out, "v%d || v%d", x, y); return;
  case CG_SELECT: sb_printf(out, "v%d ? v%d : v%d", x, y, in->a[2]); return;
  case CG_CAST:
    if (fl && (in->type == CG_I32 || in->type == CG_I64))
      sb_printf(out, "cg_to_%s(v%d)", in->type == CG_I32 ? "i32" : "i64", x);
    else if (fl && in->type == CG_I1) sb_printf(out, "v%d != 0", x);
    else sb_printf(out, "(%s)v%d", c_type(in->type), x);
    return;
  default: TS_DIE("cprint: %s has no expression", cg_op_names[in->op]);
  }
}

int cg_kernel_c_text(const CgKernel *k, StrBuf *out, char *err, size_t errlen) {
  if (cg_kernel_verify(k, err, errlen) != 0) return -1;
  sb_puts(out, c_prelude);
  sb_printf(out, "\n/* grid = %lld iterations */\nvoid %s(void **bufs, int64_t begin, int64_t end) {\n", (long long)k->grid,
            k->name);
  for (int b = 0; b < k->nbuf; b++)
    sb_printf(out, "  %s%s *b%d = bufs[%d];\n", k->buf[b].written ? "" : "const ", c_type(k->buf[b].type), b, b);
  if (k->nparam)   /* the run-time scalars follow the buffers (kir.h) */
    sb_printf(out, "  const int64_t *prm = bufs[%d];\n", k->nbuf);
  sb_puts(out, "  for (int64_t gid = begin; gid < end; gid++) {\n");
  int depth = 2;
  for (int i = 0; i < k->code.n; i++) {
    const CgInst *in = &k->code.a[i];
    if (in->op == CG_END) depth--;
    for (int d = 0; d < depth; d++) sb_puts(out, "  ");
    switch (in->op) {
    case CG_GID: sb_printf(out, "const int64_t v%d = gid;\n", i); break;
    case CG_RANGE:
      sb_printf(out, "for (int64_t v%d = 0; v%d < v%d; v%d++) {\n", i, i, in->a[0], i);
      depth++;
      break;
    case CG_END: sb_puts(out, "}\n"); break;
    case CG_ACC:
      sb_printf(out, "%s v%d = ", c_type(in->type), i);
      c_float(out, in->type, in->f);
      sb_puts(out, ";\n");
      break;
    case CG_UPDATE:
      if (k->code.a[in->a[0]].red == CG_RED_SUM) sb_printf(out, "v%d += v%d;\n", in->a[0], in->a[1]);
      else sb_printf(out, "v%d = cg_maximum(v%d, v%d);\n", in->a[0], in->a[0], in->a[1]);
      break;
    case CG_STORE: sb_printf(out, "b%d[v%d] = v%d;\n", in->buf, in->a[0], in->a[1]); break;
    default:
      sb_printf(out, "const %s v%d = ", c_type(in->type), i);
      c_expr(k, in, out);
      sb_puts(out, ";\n");
      break;
    }
  }
  sb_puts(out, "  }\n}\n");
  return 0;
}
