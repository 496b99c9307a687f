/* kir.h - the kernel IR: a small loop-level IR that tensor ops lower into
 * (codegen/lower.c) and that backends print: LLVM IR today (codegen/llvm.c),
 * CUDA C later.  It sits between the tensor IR (ir/ir.h) and machine code.
 *
 * A kernel has
 *   - typed buffer parameters (f32 / f64 / i32, contiguous, row-major,
 *     element counts known), each read-only or written;
 *   - a parallel index space: `grid` independent iterations; iteration
 *     `gid` of the space is the value of the GID instruction.  A backend
 *     may run any subset of the iterations in any order and on any thread
 *     (the CPU entry point computes [begin, end); CUDA maps it to threads),
 *     so iterations never write what another iteration reads or writes;
 *   - a body: a flat list of instructions run once per iteration.  Loops
 *     are structured: RANGE opens a loop (its value is the loop index,
 *     0 .. n-1) and the matching END closes it.  Values are SSA: an
 *     instruction's operands are earlier instructions whose loop is still
 *     open.  The only mutable things are accumulators (ACC, changed by
 *     UPDATE with sum or max), which is how reductions carry a value out of
 *     their loop.
 *
 * Scalar types: i1 (compare results), i32, i64 (indices), f32, f64.
 * Integer ADD, SUB and MUL wrap around (two's complement), so the
 * counter-based RNG (runtime/cpu/rng.c's splitmix64 chain) is plain kernel IR:
 * XOR, SHR (logical) and MUL on i64.
 * Run-time scalars (the training step, the micro batch, the seed: what a
 * dropout mask depends on besides the element) are PARAM instructions:
 * `param k` reads slot k of a small i64 array the caller passes with each
 * launch, as the pointer after the last buffer (bufs[nbuf]); nparam is the
 * number of slots the kernel reads (0: no array is passed).
 * Indices are plain i64 arithmetic (ADD/MUL/DIV/MOD of the loop indices,
 * GID and constants): affine strided expressions plus the div/mod that turn
 * a flat index into coordinates.  The spirit is QBE's IL and tinygrad's
 * UOps: few instruction kinds, all the same shape, easy to print.
 *
 * Text form (cg_kernel_print), one instruction per line, loops indented:
 *
 *   kernel relu_f32(b0: f32[8] in, b1: f32[8] out) grid=8
 *     %0 = gid
 *     %1 = load b0[%0] : f32
 *     ...
 *     %4 = range %3 : i64 {
 *       ...
 *     }
 *     store b1[%0], %6
 *
 * A kernel with run-time scalars says so in its header (`grid=8 params=3`)
 * and reads them as `%5 = param 1 : i64`.
 */
#ifndef TS_CG_KIR_H
#define TS_CG_KIR_H
#include "ir/ir.h"

/* CG_BF16 and CG_F16 (IEEE binary16) are storage types only: a 16-bit
 * buffer's elements are loaded and stored as such and cast to or from f32 /
 * f64 (round to nearest even on the way down, after rounding to f32 first;
 * f16 keeps subnormals and overflows to inf: runtime/cpu/half.h, bit for
 * bit); no arithmetic takes them. */
typedef enum { CG_VOID, CG_I1, CG_I32, CG_I64, CG_F32, CG_F64, CG_BF16, CG_F16, CG_TYPE_COUNT } CgType;
static inline int cg_type_is_half(CgType t) { return t == CG_BF16 || t == CG_F16; }
const char *cg_type_name(CgType t);             /* "f32" ... */
static inline int cg_type_is_float(CgType t) { return t == CG_F32 || t == CG_F64; }
/* The kernel type of a tensor dtype (IR_F32 -> CG_F32 ...); CG_VOID for void. */
CgType cg_type_of_dtype(IrDtype d);

/* X(NAME, "text", number of operands) */
#define CG_OPS(X)                                                          \
  X(CONST, "const", 0)   /* f (floats) or i (ints): a constant            */ \
  X(GID, "gid", 0)       /* i64: this iteration of the parallel space      */ \
  X(RANGE, "range", 1)   /* i64 loop index 0..a0-1; opens a loop           */ \
  X(END, "end", 0)       /* closes the innermost open RANGE                */ \
  X(ACC, "acc", 0)       /* accumulator of `type`, starts at f; red = kind */ \
  X(UPDATE, "update", 2) /* acc a0 = red(a0, a1); max propagates NaN     */ \
  X(LOAD, "load", 1)     /* buf[a0]                                        */ \
  X(STORE, "store", 2)   /* buf[a0] = a1                                   */ \
  X(NEG, "neg", 1)                                                           \
  X(EXP, "exp", 1)                                                           \
  X(LOG, "log", 1)                                                           \
  X(SQRT, "sqrt", 1)                                                         \
  X(RSQRT, "rsqrt", 1)                                                       \
  X(TANH, "tanh", 1)                                                         \
  X(ERF, "erf", 1)                                                           \
  X(ADD, "add", 2)                                                           \
  X(SUB, "sub", 2)                                                           \
  X(MUL, "mul", 2)                                                           \
  X(DIV, "div", 2)      /* ints: truncating; operands >= 0 in practice    */ \
  X(MOD, "mod", 2)      /* ints only                                      */ \
  X(XOR, "xor", 2)      /* i32 / i64: bitwise exclusive or                */ \
  X(SHR, "shr", 2)      /* i32 / i64: logical shift right, 0 <= a1 < bits */ \
  X(MAX, "max", 2)      /* floats: the non-NaN operand wins (maxnum)      */ \
  X(MIN, "min", 2)                                                           \
  X(LT, "lt", 2)        /* compares give i1                               */ \
  X(LE, "le", 2)                                                             \
  X(EQ, "eq", 2)                                                             \
  X(NE, "ne", 2)        /* floats: true when unordered (NaN != NaN)       */ \
  X(AND, "and", 2)      /* i1                                             */ \
  X(OR, "or", 2)                                                             \
  X(SELECT, "select", 3) /* a0 (i1) ? a1 : a2                             */ \
  X(CAST, "cast", 1)    /* to `type`; float -> i32 saturates, NaN -> 0    */ \
  X(PARAM, "param", 0)  /* i64: run-time scalar slot i (CG_PARAM_*)       */

typedef enum {
#define X(name, text, nargs) CG_##name,
  CG_OPS(X)
#undef X
  CG_OP_COUNT
} CgOp;
extern const char *const cg_op_names[CG_OP_COUNT];
extern const int cg_op_nargs[CG_OP_COUNT];   /* operands a[0 .. n) */

typedef enum { CG_RED_SUM, CG_RED_MAX } CgRed;

typedef struct {
  CgOp op;
  CgType type;      /* result type (CG_VOID for STORE, END, UPDATE) */
  int a[3];         /* operands: ids of earlier instructions */
  int buf;          /* LOAD / STORE: buffer index */
  CgRed red;        /* ACC */
  double f;         /* CONST (float types), ACC initial value */
  int64_t i;        /* CONST (int types) */
} CgInst;

#define CG_MAX_BUFS 32
typedef struct {
  CgType type;      /* CG_F32, CG_F64, CG_I32, CG_BF16 or CG_F16 */
  int64_t n;        /* elements */
  int written;      /* the kernel stores into it */
} CgBuf;

typedef struct CgKernel {
  char name[64];    /* a C identifier; backends derive symbol names from it */
  int nbuf;
  CgBuf buf[CG_MAX_BUFS];
  int64_t grid;     /* iterations of the parallel space */
  int nparam;       /* run-time scalar slots read by PARAM (0: none) */
  VEC(CgInst) code;
  int open;         /* builder: RANGEs not yet closed */
} CgKernel;

/* ---- building (asserts on misuse: these are compiler-internal calls) ---- */
CgKernel *cg_kernel_new(const char *name, int64_t grid);
void cg_kernel_free(CgKernel *k);
int cg_buf(CgKernel *k, CgType t, int64_t n, int written);   /* returns buffer index */
int cg_const_f(CgKernel *k, CgType t, double v);             /* t float */
int cg_const_i(CgKernel *k, CgType t, int64_t v);            /* t int or i1 */
int cg_gid(CgKernel *k);
int cg_range(CgKernel *k, int n);                            /* n: an i64 value */
void cg_end(CgKernel *k);
int cg_acc(CgKernel *k, CgType t, CgRed red, double init);
void cg_update(CgKernel *k, int acc, int v);
int cg_load(CgKernel *k, int buf, int idx);
void cg_store(CgKernel *k, int buf, int idx, int v);
int cg_un(CgKernel *k, CgOp op, int a);                      /* NEG .. ERF */
int cg_bin(CgKernel *k, CgOp op, int a, int b);              /* ADD .. OR */
int cg_select(CgKernel *k, int c, int a, int b);
int cg_cast(CgKernel *k, CgType t, int a);                   /* no-op if same type */
/* The run-time scalar slots of a launch (bufs[nbuf] points at an int64_t
 * array of CG_PARAM_COUNT): what the executor fills in per run. */
enum { CG_PARAM_SEED, CG_PARAM_STEP, CG_PARAM_MICRO, CG_PARAM_COUNT };
int cg_param(CgKernel *k, int slot);                         /* i64 value of slot */

/* Checks structure: operands defined earlier in a still-open loop, types,
 * RANGE/END balance, buffer indices, stores only to written buffers.
 * 0 or -1 with a message. */
int cg_kernel_verify(const CgKernel *k, char *err, size_t errlen);

/* The text form above (for --dump-ir and tests). */
void cg_kernel_print(const CgKernel *k, StrBuf *out);

#endif
