/* kprint.c - the kernel IR printed as C or CUDA C: the body of one
 * iteration, written once for both dialects (kprint.h).  docs/codegen.md
 * and docs/cuda.md, "The printer".
 *
 * One statement per instruction: values are `const` locals named after
 * their instruction (v12), accumulators plain locals, RANGE a for loop.
 * Integer add / sub / mul wrap in the kernel IR (the RNG's hash relies on
 * it) and signed overflow is undefined in C and C++, so they go through
 * unsigned types; float -> int casts through the prelude's saturating
 * helpers (NaN -> 0); binary max / min as fmax / fmin (a NaN operand
 * loses), max accumulators through the prelude's maximum (NaN wins);
 * rsqrt as 1 / sqrt, as the LLVM backend (no approximation); every
 * operation in its instruction's type (expf for f32).
 *
 * CUDA's row mode and vector lanes (cuda.c decides them, the header of
 * cuda.c explains them) change a few statements; in C both are off.
 *
 * Narrow indices (a dialect's `narrow`, CUDA's): the kernel IR's indices
 * are i64, and a 64-bit integer division or modulo is a long instruction
 * sequence on a GPU (a 32-bit one by a constant is a multiply-high and a
 * shift).  An interval analysis bounds every integer value (GID by the
 * grid, RANGE by its trip count, constants, and + - * / % min max select
 * of bounded values); index arithmetic whose value and operands fit in 32
 * bits is printed in `int` (and its wrapping forms in `unsigned`), with the
 * same results, since no bounded value wraps.  Anything else (the RNG's
 * hash, parameters, values loaded or converted from floats) stays 64-bit. */
#include "kprint.h"
#include <math.h>

/* Interval of each integer value (see the top); lo > hi: unbounded. */
typedef struct { __int128 lo, hi; } KpIv;
static const __int128 KP_I32_MIN = -2147483647 - 1, KP_I32_MAX = 2147483647;

static int iv_bounded(KpIv v) { return v.lo <= v.hi; }
static int iv_fits32(KpIv v) { return iv_bounded(v) && v.lo >= KP_I32_MIN && v.hi <= KP_I32_MAX; }
/* hull of four corner values, unbounded beyond 2^62 (no __int128 overflow later) */
static KpIv iv_hull(__int128 a, __int128 b, __int128 c, __int128 e) {
  __int128 lo = a, hi = a, v[3] = {b, c, e};
  for (int i = 0; i < 3; i++) { if (v[i] < lo) lo = v[i]; if (v[i] > hi) hi = v[i]; }
  const __int128 lim = (__int128)1 << 62;
  if (lo < -lim || hi > lim) return (KpIv){1, 0};
  return (KpIv){lo, hi};
}

static void kp_narrow(CgKp *p) {
  const CgKernel *k = p->k;
  KpIv *iv = ts_xcalloc((size_t)(p->n ? p->n : 1), sizeof *iv);
  for (int i = 0; i < p->n; i++) {
    const CgInst *in = cg_kp_ins(p, i);
    KpIv r = {1, 0}, x = {1, 0}, y = {1, 0};
    if (cg_op_nargs[in->op] > 0 && in->a[0] >= 0 && in->a[0] < i) x = iv[in->a[0]];
    if (cg_op_nargs[in->op] > 1 && in->a[1] >= 0 && in->a[1] < i) y = iv[in->a[1]];
    int ints = in->type == CG_I64 || in->type == CG_I32;
    switch (in->op) {
    case CG_GID: r = (KpIv){0, k->grid > 0 ? k->grid - 1 : 0}; break;
    case CG_RANGE:   /* a narrow loop index must not overflow stepping past its end (grid strides) */
      if (iv_bounded(x) && x.hi < ((__int128)1 << 30)) r = (KpIv){0, x.hi > 0 ? x.hi - 1 : 0};
      break;
    case CG_CONST: if (ints) r = (KpIv){in->i, in->i}; break;
    case CG_ADD: if (ints && iv_bounded(x) && iv_bounded(y)) r = iv_hull(x.lo + y.lo, x.hi + y.hi, x.lo + y.lo, x.hi + y.hi); break;
    case CG_SUB: if (ints && iv_bounded(x) && iv_bounded(y)) r = iv_hull(x.lo - y.hi, x.hi - y.lo, x.lo - y.hi, x.hi - y.lo); break;
    case CG_MUL:
      if (ints && iv_fits32(x) && iv_fits32(y))   /* |corners| < 2^62 */
        r = iv_hull(x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi);
      break;
    case CG_DIV:   /* truncating; a divisor interval that excludes 0 */
      if (ints && iv_bounded(x) && iv_bounded(y) && y.lo > 0)
        r = iv_hull(x.lo / y.lo, x.lo / y.hi, x.hi / y.lo, x.hi / y.hi);
      break;
    case CG_MOD:   /* the sign of the dividend, |r| < |divisor| */
      if (ints && iv_bounded(x) && iv_bounded(y) && y.lo > 0)
        r = x.lo >= 0 ? (KpIv){0, x.hi < y.hi - 1 ? x.hi : y.hi - 1} : (KpIv){-(y.hi - 1), y.hi - 1};
      break;
    case CG_MIN:
    case CG_MAX:
      if (ints && iv_bounded(x) && iv_bounded(y))
        r = in->op == CG_MIN ? (KpIv){x.lo < y.lo ? x.lo : y.lo, x.hi < y.hi ? x.hi : y.hi}
                             : (KpIv){x.lo > y.lo ? x.lo : y.lo, x.hi > y.hi ? x.hi : y.hi};
      break;
    case CG_SELECT:
      if (ints && iv_bounded(y) && in->a[2] >= 0 && in->a[2] < i && iv_bounded(iv[in->a[2]])) {
        KpIv z = iv[in->a[2]];
        r = (KpIv){y.lo < z.lo ? y.lo : z.lo, y.hi > z.hi ? y.hi : z.hi};
      }
      break;
    default: break;
    }
    iv[i] = r;
    /* printed narrow: an i64 index value that fits, whose operands fit too
     * (so a 64-bit operand may be cast down: division and modulo then run
     * in 32 bits) */
    int arith = in->op == CG_ADD || in->op == CG_SUB || in->op == CG_MUL || in->op == CG_DIV || in->op == CG_MOD ||
                in->op == CG_MIN || in->op == CG_MAX;
    int ok = in->type == CG_I64 && iv_fits32(r) &&
             (in->op == CG_GID || in->op == CG_RANGE || in->op == CG_CONST || in->op == CG_SELECT ||
              (arith && iv_fits32(x) && iv_fits32(y)));
    p->i32[i] = (unsigned char)ok;
  }
  free(iv);
}

void cg_kp_init(CgKp *p, const CgKernel *k, const CgDialect *d) {
  memset(p, 0, sizeof *p);
  p->k = k;
  p->d = d;
  p->n = k->code.n;
  size_t n = (size_t)(p->n ? p->n : 1);
  p->top = ts_xcalloc(n, sizeof *p->top);
  p->match = ts_xcalloc(n, sizeof *p->match);
  p->mark = ts_xcalloc(n, sizeof *p->mark);
  p->i32 = ts_xcalloc(n, 1);
  p->gid = -1;
  int *stack = ts_xcalloc(n, sizeof *stack), sp = 0, cur = -1;   /* open RANGEs (the verifier checked balance) */
  for (int i = 0; i < p->n; i++) {
    const CgInst *in = cg_kp_ins(p, i);
    p->match[i] = -1;
    if (in->op == CG_GID && p->gid < 0) p->gid = i;
    if (in->op == CG_END) {
      int r = sp > 0 ? stack[--sp] : 0;
      p->match[i] = r;
      p->match[r] = i;
      if (sp == 0) cur = -1;
    }
    p->top[i] = cur;
    if (in->op == CG_RANGE) {
      if (sp == 0) cur = i;
      stack[sp++] = i;
    }
  }
  free(stack);
  if (d->narrow) kp_narrow(p);
}

void cg_kp_free(CgKp *p) {
  free(p->i32);
  free(p->top);
  free(p->match);
  free(p->mark);
}

static void indent(StrBuf *out, int d) {
  for (int i = 0; i < d; i++) sb_puts(out, "  ");
}

static void kp_float(const CgKp *p, StrBuf *out, CgType t, double v) {
  int f32 = t == CG_F32;
  if (isnan(v)) sb_puts(out, f32 ? p->d->nan_f32 : p->d->nan_f64);
  else if (isinf(v)) sb_printf(out, "%s%s", v > 0 ? "" : "-", f32 ? p->d->inf_f32 : p->d->inf_f64);
  else {
    char b[40];
    ts_fmt_double(b, sizeof b, v);   /* "2.0", never "2": C++ would read an int */
    sb_printf(out, "%s%s", b, f32 ? "f" : "");
  }
}

/* Integer x OP y of type t (i64, else i32) through the unsigned type, so
 * that it wraps; a shift (logical) casts only its left operand. */
static void kp_wrap(const CgKp *p, StrBuf *out, CgType t, int x, const char *op, int y) {
  int w = t == CG_I64;   /* a narrow result (kp_expr) passes CG_I32 */
  const char *s = p->d->type[w ? CG_I64 : CG_I32], *u = w ? p->d->u64 : p->d->u32;
  if (op[0] == '>') sb_printf(out, "(%s)((%s)v%d >> v%d)", s, u, x, y);
  else sb_printf(out, "(%s)((%s)v%d %s (%s)v%d)", s, u, x, op, u, y);
}

/* The expression of value instruction i. */
static void kp_expr(const CgKp *p, int i, StrBuf *out) {
  const CgDialect *d = p->d;
  const CgInst *in = cg_kp_ins(p, i);
  const CgInst *a0 = cg_op_nargs[in->op] > 0 && in->a[0] >= 0 ? cg_kp_ins(p, in->a[0]) : NULL;
  int fl = a0 && cg_type_is_float(a0->type), f32 = a0 && a0->type == CG_F32;
  const char *fs = f32 ? "f" : "";
  int x = in->a[0], y = in->a[1];
  switch (in->op) {
  case CG_CONST:
    if (cg_type_is_float(in->type)) kp_float(p, out, in->type, in->f);
    else if (in->i == INT64_MIN) sb_puts(out, d->i64_min);
    else sb_printf(out, p->i32[i] ? "%lld" : "%lldLL", (long long)in->i);
    return;
  case CG_LOAD:
    if (p->vec && x == p->gid) sb_printf(out, "q%d.%c", in->buf, "xyzw"[p->lane]);   /* the lane of a vector load */
    else sb_printf(out, "b%d[v%d]", in->buf, x);
    return;
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
    if (fl) sb_printf(out, "v%d %s v%d", x, o, y);
    else kp_wrap(p, out, p->i32[i] ? CG_I32 : a0->type, x, o, y);
    return;
  }
  case CG_DIV:
  case CG_MOD: {
    const char *o = in->op == CG_DIV ? "/" : "%";
    if (p->i32[i]) sb_printf(out, "(int)v%d %s (int)v%d", x, o, y);   /* both fit: 32-bit division */
    else sb_printf(out, "v%d %s v%d", x, o, y);
    return;
  }
  case CG_XOR: sb_printf(out, "v%d ^ v%d", x, y); return;
  case CG_SHR: kp_wrap(p, out, a0->type, x, ">>", y); return;
  case CG_PARAM: sb_printf(out, "%s[%lld]", d->param, (long long)in->i); return;
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
      sb_printf(out, "%sto_%s(v%d)", d->helper, in->type == CG_I32 ? "i32" : "i64", x);
    else if (fl && in->type == CG_I1) sb_printf(out, "v%d != 0", x);
    else if (a0 && cg_type_is_half(a0->type))   /* bf16 / f16 widen through f32 (kir.h) */
      sb_printf(out, "(%s)%s%s_f32(v%d)", d->type[in->type], d->helper, cg_type_name(a0->type), x);
    else if (cg_type_is_half(in->type))   /* to nearest even from f32: a double is rounded to f32 first */
      sb_printf(out, "%sf32_%s((float)v%d)", d->helper, cg_type_name(in->type), x);
    else sb_printf(out, "(%s)v%d", d->type[in->type], x);
    return;
  default: TS_DIE("kprint: %s has no expression", cg_op_names[in->op]);
  }
}

/* ---- CUDA row mode (cuda.c decides it): iteration gid is one block ---- */

/* Whether the top-level loop opened at r loads / stores memory. */
static int loop_has(const CgKp *p, int r, CgOp op) {
  for (int u = r + 1; u < p->match[r]; u++)
    if (cg_kp_ins(p, u)->op == op) return 1;
  return 0;
}

/* Before the top-level loop at r: sums it updates start from 0 in every
 * thread but thread 0 (the block sum then adds each partial and the value
 * before the loop once); maxima keep their value (idempotent). */
static void row_loop_open(CgKp *p, StrBuf *out, int r, int d) {
  for (int u = r + 1; u < p->match[r]; u++) {
    const CgInst *up = cg_kp_ins(p, u);
    if (up->op != CG_UPDATE || p->top[up->a[0]] >= 0 || cg_kp_ins(p, up->a[0])->red != CG_RED_SUM) continue;
    if (p->mark[up->a[0]] == -r - 1) continue;   /* printed already */
    p->mark[up->a[0]] = -r - 1;
    int before = 0;   /* still at its start value 0 in every thread: nothing to do */
    for (int q = up->a[0]; q < r && !before; q++)
      before = cg_kp_ins(p, q)->op == CG_UPDATE && cg_kp_ins(p, q)->a[0] == up->a[0];
    if (!before && cg_kp_ins(p, up->a[0])->f == 0) continue;
    indent(out, d);
    sb_printf(out, "if (threadIdx.x != 0%s) v%d = 0;\n", p->split > 1 ? " || ts_chunk != 0" : "", up->a[0]);
  }
}

/* Split rows: after the block reductions, thread 0 of every block of the
 * row writes its partials (as doubles: exact for both float types) to the
 * module's ts_split_part, and the block that arrives last (ts_split_ticket)
 * combines them in part order, so the result does not depend on which
 * block finishes when.  The other blocks are done. */
/* one line of text at indent d */
static void put_line(StrBuf *out, int d, const char *text) {
  indent(out, d);
  sb_puts(out, text);
  sb_puts(out, "\n");
}

static void split_combine(CgKp *p, StrBuf *out, const int *acc, int na, int d) {
  put_line(out, d, "{");
  put_line(out, d + 1, "__shared__ int ts_last;");
  put_line(out, d + 1, "if (threadIdx.x == 0) {");
  for (int j = 0; j < na; j++) {
    indent(out, d + 2);
    sb_printf(out, "ts_split_part[(gid * ts_s + ts_chunk) * %d + %d] = (double)v%d;\n", na, j, acc[j]);
  }
  put_line(out, d + 2, "__threadfence();");
  put_line(out, d + 2, "ts_last = atomicAdd(&ts_split_ticket[gid], 1ULL) == (unsigned long long)(ts_s - 1);");
  put_line(out, d + 1, "}");
  put_line(out, d + 1, "__syncthreads();");
  put_line(out, d + 1, "if (!ts_last) return;");
  put_line(out, d + 1, "__threadfence();");
  for (int j = 0; j < na; j++) {
    const CgInst *a = cg_kp_ins(p, acc[j]);
    int sum = a->red == CG_RED_SUM;
    indent(out, d + 1);
    sb_printf(out, "{ double t = %s; for (long long q = threadIdx.x; q < ts_s; q += blockDim.x) ", sum ? "0.0" : "-TS_INF");
    sb_printf(out, sum ? "t += ((volatile double *)ts_split_part)[(gid * ts_s + q) * %d + %d];"
                       : "t = ts_maximum(t, ((volatile double *)ts_split_part)[(gid * ts_s + q) * %d + %d]);",
              na, j);
    sb_printf(out, " v%d = (%s)ts_block_%s(t); }\n", acc[j], p->d->type[a->type], sum ? "sum" : "max");
  }
  put_line(out, d + 1, "if (threadIdx.x == 0) ts_split_ticket[gid] = 0ULL;");
  put_line(out, d, "}");
}

/* After the END of the top-level loop at r: every top-level accumulator
 * it updated is combined over the block (and, split, over the row's
 * blocks).  Returns whether any was (the block reductions have barriers). */
static int row_loop_close(CgKp *p, StrBuf *out, int r, int d) {
  int any = 0, acc_ids[64], na = 0;
  for (int u = r + 1; u < p->match[r]; u++) {
    const CgInst *up = cg_kp_ins(p, u);
    if (up->op != CG_UPDATE || p->top[up->a[0]] >= 0) continue;
    if (p->mark[up->a[0]] == -r - 2 - p->n) continue;
    p->mark[up->a[0]] = -r - 2 - p->n;
    const CgInst *acc = cg_kp_ins(p, up->a[0]);
    indent(out, d);
    sb_printf(out, "v%d = ts_block_%s%s(v%d);\n", up->a[0], acc->red == CG_RED_SUM ? "sum" : "max",
              acc->type == CG_F32 ? "f" : "", up->a[0]);
    if (na < 64) acc_ids[na++] = up->a[0];
    any = 1;
  }
  if (p->split > 1 && na) split_combine(p, out, acc_ids, na, d);
  return any;
}

/* ---- the body ---- */

/* Row mode: top-level loops spread over the block, accumulators combined
 * after them, top-level stores by thread 0, barriers between a thread's
 * accesses and another's to memory that may be the same (pl / ps: loads /
 * stores by any thread since the last barrier).  Vector lanes: loads and
 * stores at gid through lane p->lane of the vectors. */
void cg_kp_body(CgKp *p, StrBuf *out, int base) {
  const CgDialect *dl = p->d;
  int depth = 0, pl = 0, ps = 0;
  for (int i = 0; i < p->n; i++) {
    const CgInst *in = cg_kp_ins(p, i);
    int d = base + depth - (in->op == CG_END), top = p->row && depth == 0;
    if (top && (in->op == CG_LOAD || in->op == CG_STORE || in->op == CG_RANGE)) {
      int ld = in->op == CG_LOAD || (in->op == CG_RANGE && loop_has(p, i, CG_LOAD));
      int st = in->op == CG_STORE || (in->op == CG_RANGE && loop_has(p, i, CG_STORE));
      if ((ld && ps) || (st && (pl || ps))) {
        indent(out, d);
        sb_puts(out, "__syncthreads();\n");
        pl = ps = 0;
      }
      pl |= ld;
      ps |= st;
    }
    if (top && in->op == CG_RANGE) row_loop_open(p, out, i, d);
    indent(out, d);
    switch (in->op) {
    case CG_GID: sb_printf(out, "const %s v%d = %sgid;\n", p->i32[i] ? "int" : dl->type[CG_I64], i, p->i32[i] ? "(int)" : ""); break;
    case CG_RANGE: {
      const char *it = p->i32[i] ? "int" : dl->type[CG_I64];
      if (top && p->split > 1)
        sb_printf(out, "for (%s v%d = ts_chunk * blockDim.x + threadIdx.x; v%d < v%d; v%d += ts_s * blockDim.x) {\n",
                  it, i, i, in->a[0], i);
      else if (top)
        sb_printf(out, "for (%s v%d = threadIdx.x; v%d < v%d; v%d += blockDim.x) {\n", it, i, i, in->a[0], i);
      else sb_printf(out, "for (%s v%d = 0; v%d < v%d; v%d++) {\n", it, i, i, in->a[0], i);
      depth++;
      break;
    }
    case CG_END:
      depth--;
      sb_puts(out, "}\n");
      if (p->row && depth == 0 && row_loop_close(p, out, p->match[i], d)) pl = ps = 0;
      break;
    case CG_ACC:   /* a float: cg_acc makes no other */
      sb_printf(out, "%s v%d = ", dl->type[in->type], i);
      kp_float(p, out, in->type, in->f);
      sb_puts(out, ";\n");
      break;
    case CG_UPDATE:
      if (cg_kp_ins(p, in->a[0])->red == CG_RED_SUM) sb_printf(out, "v%d += v%d;\n", in->a[0], in->a[1]);
      else sb_printf(out, "v%d = %smaximum(v%d, v%d);\n", in->a[0], dl->helper, in->a[0], in->a[1]);
      break;
    case CG_STORE:
      if (p->vec) sb_printf(out, "s%d.%c = v%d;\n", in->buf, "xyzw"[p->lane], in->a[1]);
      else sb_printf(out, "%sb%d[v%d] = v%d;\n", top ? "if (threadIdx.x == 0) " : "", in->buf, in->a[0], in->a[1]);
      break;
    default:
      sb_printf(out, "const %s v%d = ", p->i32[i] ? "int" : dl->type[in->type], i);
      kp_expr(p, i, out);
      sb_puts(out, ";\n");
      break;
    }
  }
}
