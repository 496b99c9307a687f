/* llvm.c - kernel IR -> LLVM IR through the LLVM-C API, optimized with the
 * new pass manager (default<O3>) for the host CPU and JIT-compiled with
 * ORC LLJIT.  See cg.h for the API and docs/codegen.md for the design.
 *
 * A kernel becomes
 *     void NAME(void **bufs, int64_t begin, int64_t end)
 *     { for (gid = begin; gid < end; gid++) BODY }
 * A kernel with run-time scalars (PARAM, kir.h) finds them at bufs[nbuf]
 * and loads them in the entry block, so what depends on them alone (the
 * dropout hash's seed/step/micro words) is hoisted out of the gid loop.
 * Loop counters and accumulators are allocas that SROA/mem2reg promote;
 * the vectorizer then sees plain counted loops.  A sum accumulator's adds
 * carry the `reassoc` flag (and nothing else) so the vectorizer may split
 * the sum into lanes: the kernel IR's sums have no prescribed order.
 * exp/log/sqrt are LLVM intrinsics; tanh and erf are libm calls resolved
 * in the process by the JIT.  Every module is built for the host target
 * (triple, data layout, CPU name and features), so the cost model knows
 * the vector width (AVX2: 4 doubles / 8 floats; AVX-512 twice that). */
#include "cg.h"
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Support.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static int g_init_rc, g_vecmath;
/* Once per process: the native target, and glibc's vector math library
 * (libmvec) when it loads: then the vectorizer may turn exp/log of a
 * vector loop into one libmvec call per vector (_ZGVdN4v_exp ...) instead
 * of one libm call per lane.  The library is loaded RTLD_GLOBAL so the
 * JIT's process symbol search finds it.  TS_CG_NO_VECMATH=1 turns it off. */
static void init_llvm(void) {
  g_init_rc = LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter() ? -1 : 0;
  const char *off = getenv("TS_CG_NO_VECMATH");
  if (g_init_rc == 0 && !(off && *off && strcmp(off, "0") != 0) && dlopen("libmvec.so.1", RTLD_NOW | RTLD_GLOBAL)) {
    const char *args[2] = {"tessera", "-vector-library=LIBMVEC-X86"};
    LLVMParseCommandLineOptions(2, args, NULL);
    g_vecmath = 1;
  }
}

/* Consumes e; writes "what: LLVM's message" and returns -1 (0 if no error). */
static int llvm_err(LLVMErrorRef e, const char *what, char *err, size_t errlen) {
  if (!e) return 0;
  char *msg = LLVMGetErrorMessage(e);
  ts_errf(err, errlen, "%s: %s", what, msg);
  LLVMDisposeErrorMessage(msg);
  return -1;
}

/* A target machine for the host CPU (name and features), or NULL. */
static LLVMTargetMachineRef host_tm(char *err, size_t errlen) {
  pthread_once(&g_init_once, init_llvm);
  if (g_init_rc) { ts_errf(err, errlen, "LLVM: cannot initialize the native target (is LLVM built with it?)"); return NULL; }
  char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
  char *msg = NULL;
  LLVMTargetRef target;
  LLVMTargetMachineRef tm = NULL;
  if (LLVMGetTargetFromTriple(triple, &target, &msg) != 0) ts_errf(err, errlen, "LLVM: no target for %s: %s", triple, msg);
  else
    tm = LLVMCreateTargetMachine(target, triple, cpu, feat, LLVMCodeGenLevelAggressive, LLVMRelocDefault,
                                 LLVMCodeModelJITDefault);
  if (!tm && !msg) ts_errf(err, errlen, "LLVM: cannot create a target machine for %s (%s)", triple, cpu);
  LLVMDisposeMessage(msg);
  LLVMDisposeMessage(triple);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
  return tm;
}

/* ---- emission ---- */
typedef struct {
  LLVMContextRef cx;
  LLVMModuleRef mod;
  LLVMBuilderRef b, eb;   /* eb: allocas at the top of the entry block */
  LLVMValueRef fn;
  const CgKernel *k;
  LLVMValueRef *v;        /* value of each instruction (ACC: its alloca) */
  LLVMValueRef bufp[CG_MAX_BUFS];
  LLVMValueRef prm;       /* the run-time scalars: bufs[nbuf] (kernels with PARAM) */
  LLVMTypeRef t[CG_TYPE_COUNT];
} Em;

typedef struct { LLVMValueRef ctr, iv; LLVMBasicBlockRef head, exit; } Loop;

static LLVMValueRef alloca_entry(Em *e, LLVMTypeRef ty, const char *name) {
  return LLVMBuildAlloca(e->eb, ty, name);
}

/* The value of operand a (an accumulator is read where it is used). */
static LLVMValueRef val(Em *e, int a) {
  const CgInst *in = &e->k->code.a[a];
  if (in->op == CG_ACC) return LLVMBuildLoad2(e->b, e->t[in->type], e->v[a], "");
  return e->v[a];
}

static LLVMValueRef intrinsic(Em *e, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args, int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  TS_ASSERT(id != 0);
  LLVMValueRef f = LLVMGetIntrinsicDeclaration(e->mod, id, over, (size_t)nover);
  LLVMTypeRef ft = LLVMIntrinsicGetType(e->cx, id, over, (size_t)nover);
  return LLVMBuildCall2(e->b, ft, f, args, (unsigned)nargs, "");
}

/* A call to libm's double or float function `name` (tanh, erf). */
static LLVMValueRef libm(Em *e, const char *name, CgType t, LLVMValueRef x) {
  char nm[16];
  snprintf(nm, sizeof nm, "%s%s", name, t == CG_F32 ? "f" : "");
  LLVMTypeRef ty = e->t[t];
  LLVMTypeRef ft = LLVMFunctionType(ty, &ty, 1, 0);
  LLVMValueRef f = LLVMGetNamedFunction(e->mod, nm);
  if (!f) {
    f = LLVMAddFunction(e->mod, nm, ft);
    /* pure: lets LLVM hoist and CSE the calls */
    unsigned kind = LLVMGetEnumAttributeKindForName("nounwind", 8);
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(e->cx, kind, 0));
    kind = LLVMGetEnumAttributeKindForName("willreturn", 10);
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(e->cx, kind, 0));
    /* memory(none): errno is never inspected by kernels */
    kind = LLVMGetEnumAttributeKindForName("memory", 6);
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(e->cx, kind, 0));
  }
  return LLVMBuildCall2(e->b, ft, f, &x, 1, "");
}

/* bf16 (held as i16) <-> f32, bit for bit as runtime/cpu/half.h:
 * up: the bits shifted into the top half; down: round to nearest even on
 * the 16 dropped bits, a NaN kept quiet with its sign. */
static LLVMValueRef bf16_to_f32(Em *e, LLVMValueRef x) {
  LLVMTypeRef i32 = e->t[CG_I32];
  LLVMValueRef w = LLVMBuildShl(e->b, LLVMBuildZExt(e->b, x, i32, ""), LLVMConstInt(i32, 16, 0), "");
  return LLVMBuildBitCast(e->b, w, e->t[CG_F32], "");
}
static LLVMValueRef f32_to_bf16(Em *e, LLVMValueRef f) {
  LLVMTypeRef i32 = e->t[CG_I32];
  LLVMValueRef u = LLVMBuildBitCast(e->b, f, i32, "");
  LLVMValueRef lsb = LLVMBuildAnd(e->b, LLVMBuildLShr(e->b, u, LLVMConstInt(i32, 16, 0), ""), LLVMConstInt(i32, 1, 0), "");
  LLVMValueRef r = LLVMBuildAdd(e->b, u, LLVMBuildAdd(e->b, lsb, LLVMConstInt(i32, 0x7fff, 0), ""), "");
  LLVMValueRef q = LLVMBuildOr(e->b, u, LLVMConstInt(i32, 0x400000, 0), "");   /* quiet NaN */
  LLVMValueRef nan = LLVMBuildFCmp(e->b, LLVMRealUNO, f, f, "");
  LLVMValueRef v = LLVMBuildSelect(e->b, nan, q, r, "");
  return LLVMBuildTrunc(e->b, LLVMBuildLShr(e->b, v, LLVMConstInt(i32, 16, 0), ""), e->t[CG_BF16], "");
}

/* f16 (IEEE binary16, held as i16) <-> f32, bit for bit as
 * runtime/cpu/half.h: up exact (a subnormal is m 2^-24, its sign or'ed
 * in); down to nearest even with subnormals (roundeven of |f| 2^24), 65520
 * and up to inf, every NaN 0x7e00 with its sign.  Branch-free: the arms
 * not selected may be poison, which select does not propagate. */
static LLVMValueRef k32(Em *e, unsigned v) { return LLVMConstInt(e->t[CG_I32], v, 0); }
static LLVMValueRef f16_to_f32(Em *e, LLVMValueRef x) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef h = LLVMBuildZExt(b, x, e->t[CG_I32], "");
  LLVMValueRef s = LLVMBuildShl(b, LLVMBuildAnd(b, h, k32(e, 0x8000), ""), k32(e, 16), "");
  LLVMValueRef ex = LLVMBuildAnd(b, LLVMBuildLShr(b, h, k32(e, 10), ""), k32(e, 0x1f), "");
  LLVMValueRef m = LLVMBuildAnd(b, h, k32(e, 0x3ff), ""), m13 = LLVMBuildShl(b, m, k32(e, 13), "");
  LLVMValueRef sub = LLVMBuildFMul(b, LLVMBuildUIToFP(b, m, e->t[CG_F32], ""), LLVMConstReal(e->t[CG_F32], 0x1p-24), "");
  sub = LLVMBuildOr(b, LLVMBuildBitCast(b, sub, e->t[CG_I32], ""), s, "");
  LLVMValueRef inf = LLVMBuildOr(b, LLVMBuildOr(b, s, k32(e, 0x7f800000), ""), m13, "");
  LLVMValueRef nrm = LLVMBuildOr(b, LLVMBuildOr(b, s, LLVMBuildShl(b, LLVMBuildAdd(b, ex, k32(e, 112), ""), k32(e, 23), ""), ""), m13, "");
  LLVMValueRef u = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, ex, k32(e, 31), ""), inf, nrm, "");
  u = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntEQ, ex, k32(e, 0), ""), sub, u, "");
  return LLVMBuildBitCast(b, u, e->t[CG_F32], "");
}
static LLVMValueRef f32_to_f16(Em *e, LLVMValueRef f) {
  LLVMBuilderRef b = e->b;
  LLVMValueRef x = LLVMBuildBitCast(b, f, e->t[CG_I32], "");
  LLVMValueRef ax = LLVMBuildAnd(b, x, k32(e, 0x7fffffff), "");
  LLVMValueRef s = LLVMBuildAnd(b, LLVMBuildLShr(b, x, k32(e, 16), ""), k32(e, 0x8000), "");
  LLVMValueRef a = LLVMBuildFMul(b, LLVMBuildBitCast(b, ax, e->t[CG_F32], ""), LLVMConstReal(e->t[CG_F32], 16777216.0), "");
  LLVMTypeRef f32 = e->t[CG_F32];
  LLVMValueRef sub = LLVMBuildFPToUI(b, intrinsic(e, "llvm.roundeven", &f32, 1, &a, 1), e->t[CG_I32], "");
  LLVMValueRef m = LLVMBuildSub(b, ax, k32(e, 0x38000000), "");
  LLVMValueRef lsb = LLVMBuildAnd(b, LLVMBuildLShr(b, m, k32(e, 13), ""), k32(e, 1), "");
  LLVMValueRef nrm = LLVMBuildLShr(b, LLVMBuildAdd(b, m, LLVMBuildAdd(b, lsb, k32(e, 0xfff), ""), ""), k32(e, 13), "");
  LLVMValueRef r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, ax, k32(e, 0x38800000), ""), sub, nrm, "");
  r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGE, ax, k32(e, 0x477ff000), ""), k32(e, 0x7c00), r, "");
  r = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntUGT, ax, k32(e, 0x7f800000), ""), k32(e, 0x7e00), r, "");
  return LLVMBuildTrunc(b, LLVMBuildOr(b, s, r, ""), e->t[CG_F16], "");
}

static LLVMValueRef emit_cast(Em *e, CgType to, CgType from, LLVMValueRef x) {
  LLVMTypeRef tt = e->t[to];
  if (cg_type_is_half(from)) {   /* through f32 */
    LLVMValueRef w = from == CG_BF16 ? bf16_to_f32(e, x) : f16_to_f32(e, x);
    return to == CG_F32 ? w : emit_cast(e, to, CG_F32, w);
  }
  if (cg_type_is_half(to)) {   /* through f32: f64 -> f32 -> 16 bits as the reference stores it */
    if (from != CG_F32) x = emit_cast(e, CG_F32, from, x);
    return to == CG_BF16 ? f32_to_bf16(e, x) : f32_to_f16(e, x);
  }
  int fi = cg_type_is_float(from), ti = cg_type_is_float(to);
  if (fi && ti) return to == CG_F64 ? LLVMBuildFPExt(e->b, x, tt, "") : LLVMBuildFPTrunc(e->b, x, tt, "");
  if (!fi && ti) return from == CG_I1 ? LLVMBuildUIToFP(e->b, x, tt, "") : LLVMBuildSIToFP(e->b, x, tt, "");
  if (fi && !ti) {
    if (to == CG_I1) return LLVMBuildFCmp(e->b, LLVMRealUNE, x, LLVMConstReal(e->t[from], 0), "");
    LLVMTypeRef over[2] = {tt, e->t[from]};   /* saturating, NaN -> 0 */
    return intrinsic(e, "llvm.fptosi.sat", over, 2, &x, 1);
  }
  if (to == CG_I1) return LLVMBuildICmp(e->b, LLVMIntNE, x, LLVMConstInt(e->t[from], 0, 0), "");
  if (from == CG_I1) return LLVMBuildZExt(e->b, x, tt, "");
  return LLVMBuildIntCast2(e->b, x, tt, 1, "");
}

static LLVMValueRef emit_bin(Em *e, const CgInst *in, LLVMValueRef x, LLVMValueRef y) {
  CgType t = e->k->code.a[in->a[0]].type;
  int fl = cg_type_is_float(t);
  LLVMBuilderRef b = e->b;
  switch (in->op) {
  case CG_ADD: return fl ? LLVMBuildFAdd(b, x, y, "") : LLVMBuildAdd(b, x, y, "");
  case CG_SUB: return fl ? LLVMBuildFSub(b, x, y, "") : LLVMBuildSub(b, x, y, "");
  case CG_MUL: return fl ? LLVMBuildFMul(b, x, y, "") : LLVMBuildMul(b, x, y, "");
  case CG_DIV: return fl ? LLVMBuildFDiv(b, x, y, "") : LLVMBuildSDiv(b, x, y, "");
  case CG_MOD: return LLVMBuildSRem(b, x, y, "");
  case CG_MAX:
  case CG_MIN: {
    if (fl) {
      LLVMValueRef args[2] = {x, y};
      LLVMTypeRef ty = e->t[t];
      return intrinsic(e, in->op == CG_MAX ? "llvm.maxnum" : "llvm.minnum", &ty, 1, args, 2);
    }
    LLVMValueRef c = LLVMBuildICmp(b, in->op == CG_MAX ? LLVMIntSGT : LLVMIntSLT, x, y, "");
    return LLVMBuildSelect(b, c, x, y, "");
  }
  case CG_LT: return fl ? LLVMBuildFCmp(b, LLVMRealOLT, x, y, "") : LLVMBuildICmp(b, LLVMIntSLT, x, y, "");
  case CG_LE: return fl ? LLVMBuildFCmp(b, LLVMRealOLE, x, y, "") : LLVMBuildICmp(b, LLVMIntSLE, x, y, "");
  case CG_EQ: return fl ? LLVMBuildFCmp(b, LLVMRealOEQ, x, y, "") : LLVMBuildICmp(b, LLVMIntEQ, x, y, "");
  case CG_NE: return fl ? LLVMBuildFCmp(b, LLVMRealUNE, x, y, "") : LLVMBuildICmp(b, LLVMIntNE, x, y, "");
  case CG_XOR: return LLVMBuildXor(b, x, y, "");
  case CG_SHR: return LLVMBuildLShr(b, x, y, "");
  case CG_AND: return LLVMBuildAnd(b, x, y, "");
  case CG_OR: return LLVMBuildOr(b, x, y, "");
  default: TS_DIE("llvm: %s is not binary", cg_op_names[in->op]);
  }
}

/* Emits one instruction i of the body. */
static void emit_inst(Em *e, int i, Loop *loops, int *nloops) {
  const CgInst *in = &e->k->code.a[i];
  LLVMBuilderRef b = e->b;
  LLVMTypeRef ty = in->type != CG_VOID ? e->t[in->type] : NULL;
  switch (in->op) {
  case CG_CONST:
    e->v[i] = cg_type_is_float(in->type) ? LLVMConstReal(ty, in->f) : LLVMConstInt(ty, (unsigned long long)in->i, 1);
    return;
  case CG_GID: TS_DIE("llvm: gid is emitted by the caller");
  case CG_PARAM: {   /* read once, in the entry block: invariant over the whole launch */
    LLVMValueRef idx = LLVMConstInt(e->t[CG_I64], (unsigned long long)in->i, 0);
    e->v[i] = LLVMBuildLoad2(e->eb, ty, LLVMBuildInBoundsGEP2(e->eb, ty, e->prm, &idx, 1, ""), "");
    return;
  }
  case CG_RANGE: {
    Loop *l = &loops[(*nloops)++];
    l->ctr = alloca_entry(e, e->t[CG_I64], "i");
    LLVMBuildStore(b, LLVMConstInt(e->t[CG_I64], 0, 0), l->ctr);
    l->head = LLVMAppendBasicBlockInContext(e->cx, e->fn, "loop");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->cx, e->fn, "body");
    l->exit = LLVMAppendBasicBlockInContext(e->cx, e->fn, "done");
    LLVMBuildBr(b, l->head);
    LLVMPositionBuilderAtEnd(b, l->head);
    l->iv = LLVMBuildLoad2(b, e->t[CG_I64], l->ctr, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, l->iv, val(e, in->a[0]), ""), body, l->exit);
    LLVMPositionBuilderAtEnd(b, body);
    e->v[i] = l->iv;
    return;
  }
  case CG_END: {
    Loop *l = &loops[--(*nloops)];
    LLVMBuildStore(b, LLVMBuildNSWAdd(b, l->iv, LLVMConstInt(e->t[CG_I64], 1, 0), ""), l->ctr);
    LLVMBuildBr(b, l->head);
    LLVMPositionBuilderAtEnd(b, l->exit);
    return;
  }
  case CG_ACC:
    e->v[i] = alloca_entry(e, ty, "acc");
    LLVMBuildStore(b, LLVMConstReal(ty, in->f), e->v[i]);
    return;
  case CG_UPDATE: {
    const CgInst *acc = &e->k->code.a[in->a[0]];
    LLVMTypeRef at = e->t[acc->type];
    LLVMValueRef cur = LLVMBuildLoad2(b, at, e->v[in->a[0]], ""), x = val(e, in->a[1]), nv;
    if (acc->red == CG_RED_SUM) {
      nv = LLVMBuildFAdd(b, cur, x, "");
      LLVMSetFastMathFlags(nv, LLVMFastMathAllowReassoc);   /* sums may be split into lanes */
    } else {
      /* llvm.maximum: NaN-propagating like the reference's max reduction,
       * and (unlike maxnum without nnan) vectorized by LLVM 19 */
      LLVMValueRef args[2] = {cur, x};
      nv = intrinsic(e, "llvm.maximum", &at, 1, args, 2);
    }
    LLVMBuildStore(b, nv, e->v[in->a[0]]);
    return;
  }
  case CG_LOAD:
  case CG_STORE: {
    LLVMTypeRef et = e->t[e->k->buf[in->buf].type];
    LLVMValueRef idx = val(e, in->a[0]);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(b, et, e->bufp[in->buf], &idx, 1, "");
    if (in->op == CG_LOAD) e->v[i] = LLVMBuildLoad2(b, et, p, "");
    else LLVMBuildStore(b, val(e, in->a[1]), p);
    return;
  }
  default: break;
  }
  LLVMValueRef x = val(e, in->a[0]);
  switch (in->op) {
  case CG_NEG: e->v[i] = cg_type_is_float(in->type) ? LLVMBuildFNeg(b, x, "") : LLVMBuildNeg(b, x, ""); return;
  case CG_EXP: e->v[i] = intrinsic(e, "llvm.exp", &ty, 1, &x, 1); return;
  case CG_LOG: e->v[i] = intrinsic(e, "llvm.log", &ty, 1, &x, 1); return;
  case CG_SQRT: e->v[i] = intrinsic(e, "llvm.sqrt", &ty, 1, &x, 1); return;
  case CG_RSQRT:
    e->v[i] = LLVMBuildFDiv(b, LLVMConstReal(ty, 1), intrinsic(e, "llvm.sqrt", &ty, 1, &x, 1), "");
    return;
  case CG_TANH: e->v[i] = libm(e, "tanh", in->type, x); return;
  case CG_ERF: e->v[i] = libm(e, "erf", in->type, x); return;
  case CG_SELECT: e->v[i] = LLVMBuildSelect(b, x, val(e, in->a[1]), val(e, in->a[2]), ""); return;
  case CG_CAST: e->v[i] = emit_cast(e, in->type, e->k->code.a[in->a[0]].type, x); return;
  default: e->v[i] = emit_bin(e, in, x, val(e, in->a[1])); return;
  }
}

/* Builds k as function `sym` in a new module of context cx. */
static LLVMModuleRef emit_module(const CgKernel *k, const char *sym, LLVMContextRef cx, LLVMTargetMachineRef tm,
                                 char *err, size_t errlen) {
  if (cg_kernel_verify(k, err, errlen) != 0) return NULL;
  Em e = {.cx = cx, .k = k};
  e.mod = LLVMModuleCreateWithNameInContext(k->name, cx);
  char *triple = LLVMGetTargetMachineTriple(tm);
  LLVMSetTarget(e.mod, triple);
  LLVMDisposeMessage(triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(e.mod, td);
  LLVMDisposeTargetData(td);
  e.t[CG_I1] = LLVMInt1TypeInContext(cx);
  e.t[CG_I32] = LLVMInt32TypeInContext(cx);
  e.t[CG_I64] = LLVMInt64TypeInContext(cx);
  e.t[CG_F32] = LLVMFloatTypeInContext(cx);
  e.t[CG_F64] = LLVMDoubleTypeInContext(cx);
  e.t[CG_BF16] = LLVMInt16TypeInContext(cx);
  e.t[CG_F16] = LLVMInt16TypeInContext(cx);
  LLVMTypeRef ptr = LLVMPointerTypeInContext(cx, 0);
  LLVMTypeRef params[3] = {ptr, e.t[CG_I64], e.t[CG_I64]};
  e.fn = LLVMAddFunction(e.mod, sym, LLVMFunctionType(LLVMVoidTypeInContext(cx), params, 3, 0));
  /* the host CPU for this function too, so the cost model sees AVX */
  char *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
  LLVMAddTargetDependentFunctionAttr(e.fn, "target-cpu", cpu);
  LLVMAddTargetDependentFunctionAttr(e.fn, "target-features", feat);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
  unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
  LLVMAddAttributeAtIndex(e.fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(cx, nounwind, 0));

  LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(cx, e.fn, "entry");
  LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(cx, e.fn, "grid");
  LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(cx, e.fn, "iter");
  LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(cx, e.fn, "exit");
  e.b = LLVMCreateBuilderInContext(cx);
  e.eb = LLVMCreateBuilderInContext(cx);
  LLVMPositionBuilderAtEnd(e.eb, entry);
  LLVMPositionBuilderAtEnd(e.b, entry);
  LLVMValueRef bufs = LLVMGetParam(e.fn, 0);
  for (int i = 0; i < k->nbuf; i++) {   /* buffer pointers, loaded once */
    LLVMValueRef idx = LLVMConstInt(e.t[CG_I64], (unsigned long long)i, 0);
    e.bufp[i] = LLVMBuildLoad2(e.b, ptr, LLVMBuildInBoundsGEP2(e.b, ptr, bufs, &idx, 1, ""), "");
  }
  if (k->nparam) {   /* the scalar array follows the buffers */
    LLVMValueRef idx = LLVMConstInt(e.t[CG_I64], (unsigned long long)k->nbuf, 0);
    e.prm = LLVMBuildLoad2(e.b, ptr, LLVMBuildInBoundsGEP2(e.b, ptr, bufs, &idx, 1, ""), "");
  }
  LLVMValueRef gctr = LLVMBuildAlloca(e.b, e.t[CG_I64], "gid");
  LLVMBuildStore(e.b, LLVMGetParam(e.fn, 1), gctr);
  LLVMValueRef entry_br = LLVMBuildBr(e.b, head);
  LLVMPositionBuilderBefore(e.eb, entry_br);   /* later allocas go before the branch */
  LLVMPositionBuilderAtEnd(e.b, head);
  LLVMValueRef gid = LLVMBuildLoad2(e.b, e.t[CG_I64], gctr, "");
  LLVMBuildCondBr(e.b, LLVMBuildICmp(e.b, LLVMIntSLT, gid, LLVMGetParam(e.fn, 2), ""), body, exit);
  LLVMPositionBuilderAtEnd(e.b, body);

  e.v = ts_xcalloc((size_t)(k->code.n ? k->code.n : 1), sizeof *e.v);
  Loop *loops = ts_xcalloc((size_t)(k->code.n ? k->code.n : 1), sizeof *loops);
  int nloops = 0;
  for (int i = 0; i < k->code.n; i++) {
    if (k->code.a[i].op == CG_GID) e.v[i] = gid;
    else emit_inst(&e, i, loops, &nloops);
  }
  LLVMBuildStore(e.b, LLVMBuildNSWAdd(e.b, gid, LLVMConstInt(e.t[CG_I64], 1, 0), ""), gctr);
  LLVMBuildBr(e.b, head);
  LLVMPositionBuilderAtEnd(e.b, exit);
  LLVMBuildRetVoid(e.b);
  free(e.v);
  free(loops);
  LLVMDisposeBuilder(e.b);
  LLVMDisposeBuilder(e.eb);

  char *msg = NULL;
  if (LLVMVerifyModule(e.mod, LLVMReturnStatusAction, &msg) != 0) {
    ts_errf(err, errlen, "internal error: kernel %s gives invalid LLVM IR: %s", k->name, msg ? msg : "");
    LLVMDisposeMessage(msg);
    LLVMDisposeModule(e.mod);
    return NULL;
  }
  LLVMDisposeMessage(msg);
  return e.mod;
}

static int optimize(LLVMModuleRef mod, LLVMTargetMachineRef tm, char *err, size_t errlen) {
  LLVMPassBuilderOptionsRef o = LLVMCreatePassBuilderOptions();
  LLVMPassBuilderOptionsSetLoopVectorization(o, 1);
  LLVMPassBuilderOptionsSetSLPVectorization(o, 1);
  LLVMPassBuilderOptionsSetLoopUnrolling(o, 1);
  int rc = llvm_err(LLVMRunPasses(mod, "default<O3>", tm, o), "LLVM optimization", err, errlen);
  LLVMDisposePassBuilderOptions(o);
  return rc;
}

/* ---- the JIT ---- */
/* A compiled kernel, keyed by its text form: identical kernels (the same
 * op on the same shapes in every layer of a model) compile once. */
typedef struct { uint64_t hash; char *text; CgFn fn; } CgCached;

struct CgJit {
  LLVMOrcLLJITRef jit;
  LLVMTargetMachineRef tm;   /* for the optimization pipeline */
  int nkern;
  char cpu[512];
  VEC(CgCached) cache;
  int hits;
  char *disk;                /* on-disk object cache directory, or NULL */
  int disk_hits, disk_writes;
};

CgJit *cg_jit_new(char *err, size_t errlen) {
  LLVMTargetMachineRef tm = host_tm(err, errlen), tm2 = tm ? host_tm(err, errlen) : NULL;
  if (!tm2) {
    if (tm) LLVMDisposeTargetMachine(tm);
    return NULL;
  }
  LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
  /* the builder takes tm2 (and disposes of it) */
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(jb, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(tm2));
  LLVMOrcLLJITRef jit;
  if (llvm_err(LLVMOrcCreateLLJIT(&jit, jb), "LLVM JIT", err, errlen) != 0) {
    LLVMDisposeTargetMachine(tm);
    return NULL;
  }
  /* kernels call libm (tanh, erf, exp): resolve in this process */
  LLVMOrcDefinitionGeneratorRef gen;
  if (llvm_err(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL),
               "LLVM JIT symbol search", err, errlen) != 0) {
    LLVMOrcDisposeLLJIT(jit);
    LLVMDisposeTargetMachine(tm);
    return NULL;
  }
  LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
  CgJit *j = ts_xcalloc(1, sizeof *j);
  j->jit = jit;
  j->tm = tm;
  char *cpu = LLVMGetTargetMachineCPU(tm), *feat = LLVMGetTargetMachineFeatureString(tm);
  snprintf(j->cpu, sizeof j->cpu, "%s %s%s", cpu, feat, g_vecmath ? " libmvec" : "");
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(feat);
  return j;
}

void cg_jit_free(CgJit *j) {
  if (!j) return;
  LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
  if (e) LLVMConsumeError(e);
  LLVMDisposeTargetMachine(j->tm);
  for (int i = 0; i < j->cache.n; i++) free(j->cache.a[i].text);
  free(j->cache.a);
  free(j->disk);
  free(j);
}

int cg_jit_cache_hits(const CgJit *j) { return j->hits; }

const char *cg_jit_cpu(const CgJit *j) { return j->cpu; }

static CgFn compile(CgJit *j, const CgKernel *k, const char *text, int *busy, char *err, size_t errlen);

void cg_jit_set_cache_dir(CgJit *j, const char *dir) {
  free(j->disk);
  j->disk = dir && *dir ? ts_xstrdup(dir) : NULL;
}
int cg_jit_disk_hits(const CgJit *j) { return j->disk_hits; }
int cg_jit_disk_writes(const CgJit *j) { return j->disk_writes; }

/* busy: NULL waits for another process compiling the same kernel; else
 * *busy = 1 and NULL back without an error (cg_jit_compile_or_defer). */
static CgFn jit_compile(CgJit *j, const CgKernel *k, int *busy, char *err, size_t errlen) {
  StrBuf key = {0};
  cg_kernel_print(k, &key);
  sb_putc(&key, 0);
  uint64_t h = ts_hash64(key.p, key.n, 0);
  for (int i = 0; i < j->cache.n; i++)
    if (j->cache.a[i].hash == h && strcmp(j->cache.a[i].text, key.p) == 0) {
      sb_free(&key);
      j->hits++;
      return j->cache.a[i].fn;
    }
  CgFn fn = compile(j, k, key.p, busy, err, errlen);
  if (fn) VEC_PUSH(j->cache, ((CgCached){h, key.p, fn}));
  else sb_free(&key);
  return fn;
}

CgFn cg_jit_compile(CgJit *j, const CgKernel *k, char *err, size_t errlen) {
  return jit_compile(j, k, NULL, err, errlen);
}

CgFn cg_jit_compile_or_defer(CgJit *j, const CgKernel *k, int *busy, char *err, size_t errlen) {
  *busy = 0;
  return jit_compile(j, k, busy, err, errlen);
}

/* ---- the on-disk object cache (cg_jit_set_cache_dir) ----
 * One file per kernel: DIR/<key hash>.o holding
 *   "TSKOBJ1\n" | u64 key length | key | the relocatable object file
 * where key = the kernel's text form + the host CPU and features + the
 * LLVM version (a different CPU or LLVM never reads another's code).  The
 * key is compared in full on load, so a hash collision is a miss.  The
 * symbol inside is k_<hash>, the same in every process.  Files are written
 * atomically (temp + rename); an unreadable or foreign file is a miss, a
 * failed write only costs the next run a compilation. */
#define CG_OBJ_MAGIC "TSKOBJ1\n"

static void disk_key(const CgJit *j, const char *text, StrBuf *key) {
  unsigned maj, min, pat;
  LLVMGetVersion(&maj, &min, &pat);
  sb_printf(key, "%s\ncpu %s\nllvm %u.%u.%u\n", text, j->cpu, maj, min, pat);
}

/* The object of key from the cache directory, or NULL. */
static LLVMMemoryBufferRef disk_load(const CgJit *j, const char *path, const StrBuf *key) {
  size_t len = 0;
  char *f = ts_read_file(path, &len);
  if (!f) return NULL;
  LLVMMemoryBufferRef mb = NULL;
  size_t ml = sizeof CG_OBJ_MAGIC - 1;
  uint64_t kl = 0;
  if (len > ml + 8 && memcmp(f, CG_OBJ_MAGIC, ml) == 0) {
    memcpy(&kl, f + ml, 8);
    if (kl == key->n && len > ml + 8 + kl && memcmp(f + ml + 8, key->p, kl) == 0)
      mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(f + ml + 8 + kl, len - ml - 8 - kl, "tessera-kernel");
  }
  (void)j;
  free(f);
  return mb;
}

/* mkdir -p of the cache directory: ~/.cache may not exist yet (errors
 * show up as the writes'). */
static void disk_mkdir(CgJit *j) {
  for (char *c = j->disk + 1;; c++) {
    if (*c != '/' && *c) continue;
    char save = *c;
    *c = 0;
    mkdir(j->disk, 0777);
    *c = save;
    if (!save) break;
  }
}

static void disk_store(CgJit *j, const char *path, const StrBuf *key, LLVMMemoryBufferRef obj) {
  StrBuf b = {0};
  uint64_t kl = key->n;
  sb_write(&b, CG_OBJ_MAGIC, sizeof CG_OBJ_MAGIC - 1);
  sb_write(&b, &kl, 8);
  sb_write(&b, key->p, key->n);
  sb_write(&b, LLVMGetBufferStart(obj), LLVMGetBufferSize(obj));
  disk_mkdir(j);
  if (ts_write_file(path, b.p, b.n) == 0) j->disk_writes++;
  sb_free(&b);
}

/* ---- who compiles a kernel missing from the directory ----
 * Ranks started together on one machine with a cold cache would each
 * compile every kernel.  A process about to compile kernel <hash> first
 * creates DIR/<hash>.lock (O_EXCL, holding its pid), removed once the
 * object is written.  Another process finding the lock compiles other
 * kernels first (cg_jit_compile_or_defer) and later waits for the object
 * (cg_jit_compile), so the compilations are spread over the processes.
 * A lock whose process is gone, or older than CG_LOCK_STALE_S, is taken
 * over; a wait is bounded by the same figure, after which the waiter
 * compiles the kernel itself.  Locks only save work: with none (an
 * unwritable directory) every process compiles, as before. */
#define CG_LOCK_STALE_S 120.0

/* 1: a live process (not this one) holds the lock at lpath. */
static int lock_held(const char *lpath) {
  struct stat st;
  if (stat(lpath, &st) != 0) return 0;
  if ((double)time(NULL) - (double)st.st_mtime > CG_LOCK_STALE_S) return 0;
  char buf[32] = "";
  int fd = open(lpath, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (r <= 0) return 1;   /* being written: its owner is alive */
  buf[r] = 0;
  long pid = strtol(buf, NULL, 10);
  if (pid <= 0) return 1;
  if (pid == (long)getpid()) return 0;
  return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

/* 1: this process now holds the lock at lpath; 0: another live one does;
 * -1: no lock could be made (compile without one).  A stale lock is
 * replaced atomically (ts_write_file: temp + rename) and read back: of
 * several processes replacing it at once the last one's pid stays, and
 * the others see it held. */
static int lock_take(CgJit *j, const char *lpath) {
  char mine[32];
  int n = snprintf(mine, sizeof mine, "%ld\n", (long)getpid());
  disk_mkdir(j);
  int fd = open(lpath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ssize_t w = write(fd, mine, (size_t)n);
    (void)w;
    close(fd);
    return 1;
  }
  if (errno != EEXIST) return -1;
  if (lock_held(lpath)) return 0;
  if (ts_write_file(lpath, mine, (size_t)n) != 0) return -1;   /* stale: its process died mid-compile */
  size_t len = 0;
  char *now = ts_read_file(lpath, &len);
  int ours = now && len == (size_t)n && memcmp(now, mine, len) == 0;
  free(now);
  return ours ? 1 : lock_held(lpath) ? 0 : -1;
}

/* Removes the lock at lpath if it is still this process's. */
static void lock_release(const char *lpath) {
  char mine[32];
  int n = snprintf(mine, sizeof mine, "%ld\n", (long)getpid());
  size_t len = 0;
  char *now = ts_read_file(lpath, &len);
  if (now && len == (size_t)n && memcmp(now, mine, len) == 0) unlink(lpath);
  free(now);
}

/* Waits (bounded) until the object at path exists or nobody holds its lock. */
static void lock_wait(const char *path, const char *lpath) {
  struct timespec nap = {0, 5 * 1000 * 1000};
  double t0 = (double)time(NULL);
  while ((double)time(NULL) - t0 < CG_LOCK_STALE_S) {
    if (access(path, R_OK) == 0 || !lock_held(lpath)) return;
    nanosleep(&nap, NULL);
  }
}

static CgFn lookup(CgJit *j, const char *sym, char *err, size_t errlen) {
  LLVMOrcExecutorAddress addr = 0;
  if (llvm_err(LLVMOrcLLJITLookup(j->jit, &addr, sym), "LLVM JIT: compiling the kernel", err, errlen) != 0) return NULL;
  CgFn fn;
  memcpy(&fn, &(void *){(void *)(uintptr_t)addr}, sizeof fn);   /* object to function pointer */
  return fn;
}

static CgFn compile_module(CgJit *j, const CgKernel *k, const char *sym, const char *path, const StrBuf *key,
                           char *err, size_t errlen);

/* text: k's text form (the in-process cache key); busy as jit_compile. */
static CgFn compile(CgJit *j, const CgKernel *k, const char *text, int *busy, char *err, size_t errlen) {
  char sym[96], path[4200] = "", lpath[4210] = "";
  StrBuf key = {0};
  LLVMOrcJITDylibRef dl = LLVMOrcLLJITGetMainJITDylib(j->jit);
  if (j->disk) {
    disk_key(j, text, &key);
    uint64_t h = ts_hash64(key.p, key.n, 0);
    snprintf(sym, sizeof sym, "k_%016llx", (unsigned long long)h);   /* the same in every process */
    snprintf(path, sizeof path, "%s/%016llx.o", j->disk, (unsigned long long)h);
    LLVMMemoryBufferRef mb = disk_load(j, path, &key);
    if (!mb) {   /* missing: compile it here, unless another process is */
      snprintf(lpath, sizeof lpath, "%s.lock", path);
      int got = lock_take(j, lpath);
      if (got == 0 && busy) {
        *busy = 1;
        sb_free(&key);
        return NULL;
      }
      if (got == 0) {   /* wait for its holder; if that died without the object, take over */
        lock_wait(path, lpath);
        mb = disk_load(j, path, &key);
        if (!mb) got = lock_take(j, lpath);
      }
      if (got != 1) lpath[0] = 0;   /* not ours to remove */
    }
    if (mb) {
      LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(j->jit, dl, mb);   /* takes mb */
      if (!e) {
        CgFn fn = lookup(j, sym, err, errlen);
        if (fn) { j->disk_hits++; sb_free(&key); return fn; }
      } else {
        LLVMConsumeError(e);
      }
      /* a bad cached file: compile under a fresh name below */
      snprintf(sym, sizeof sym, "k_%016llx_%d", (unsigned long long)h, j->nkern++);
    }
  } else {
    snprintf(sym, sizeof sym, "%s_%d", k->name, j->nkern++);   /* unique in the JIT */
  }
  CgFn fn = compile_module(j, k, sym, path, &key, err, errlen);
  if (lpath[0]) lock_release(lpath);
  sb_free(&key);
  return fn;
}

/* Emits, optimizes and adds k under sym; with a cache directory, as an
 * object also written to path (key: its header) when sym is the plain
 * k_<hash>. */
static CgFn compile_module(CgJit *j, const CgKernel *k, const char *sym, const char *path, const StrBuf *key,
                           char *err, size_t errlen) {
  LLVMOrcJITDylibRef dl = LLVMOrcLLJITGetMainJITDylib(j->jit);
  LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
  LLVMModuleRef mod = emit_module(k, sym, LLVMOrcThreadSafeContextGetContext(tsc), j->tm, err, errlen);
  if (!mod || optimize(mod, j->tm, err, errlen) != 0) {
    if (mod) LLVMDisposeModule(mod);
    LLVMOrcDisposeThreadSafeContext(tsc);
    return NULL;
  }
  if (j->disk) {   /* machine code now, kept on disk for the next process */
    char *msg = NULL;
    LLVMMemoryBufferRef obj = NULL;
    int bad = LLVMTargetMachineEmitToMemoryBuffer(j->tm, mod, LLVMObjectFile, &msg, &obj) != 0;
    LLVMDisposeModule(mod);
    LLVMOrcDisposeThreadSafeContext(tsc);
    if (bad) {
      ts_errf(err, errlen, "LLVM: cannot emit the object of %s: %s", k->name, msg ? msg : "");
      LLVMDisposeMessage(msg);
      return NULL;
    }
    if (strncmp(sym, "k_", 2) == 0 && !strchr(sym + 2, '_')) disk_store(j, path, key, obj);
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(j->jit, dl, obj);
    if (e) { llvm_err(e, "LLVM JIT: adding the object", err, errlen); return NULL; }
    return lookup(j, sym, err, errlen);
  }
  LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(mod, tsc);
  LLVMOrcDisposeThreadSafeContext(tsc);   /* the module keeps the context alive */
  LLVMErrorRef e = LLVMOrcLLJITAddLLVMIRModule(j->jit, dl, tsm);
  if (e) {
    LLVMOrcDisposeThreadSafeModule(tsm);
    llvm_err(e, "LLVM JIT: adding the module", err, errlen);
    return NULL;
  }
  return lookup(j, sym, err, errlen);
}

/* ---- text ---- */
static int with_module(const CgKernel *k, int opt, int assembly, StrBuf *out, char *err, size_t errlen) {
  LLVMTargetMachineRef tm = host_tm(err, errlen);
  if (!tm) return -1;
  LLVMContextRef cx = LLVMContextCreate();
  LLVMModuleRef mod = emit_module(k, k->name, cx, tm, err, errlen);
  int rc = mod ? 0 : -1;
  if (rc == 0 && opt) rc = optimize(mod, tm, err, errlen);
  if (rc == 0 && !assembly) {
    char *s = LLVMPrintModuleToString(mod);
    sb_puts(out, s);
    LLVMDisposeMessage(s);
  } else if (rc == 0) {
    char *msg = NULL;
    LLVMMemoryBufferRef mb = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMAssemblyFile, &msg, &mb) != 0) {
      rc = ts_errf(err, errlen, "LLVM: cannot emit assembly: %s", msg ? msg : "");
    } else {
      sb_write(out, LLVMGetBufferStart(mb), LLVMGetBufferSize(mb));
      LLVMDisposeMemoryBuffer(mb);
    }
    LLVMDisposeMessage(msg);
  }
  if (mod) LLVMDisposeModule(mod);
  LLVMContextDispose(cx);
  LLVMDisposeTargetMachine(tm);
  return rc;
}

int cg_kernel_llvm_text(const CgKernel *k, int opt, StrBuf *out, char *err, size_t errlen) {
  return with_module(k, opt, 0, out, err, errlen);
}
int cg_kernel_asm_text(const CgKernel *k, StrBuf *out, char *err, size_t errlen) {
  return with_module(k, 1, 1, out, err, errlen);
}
