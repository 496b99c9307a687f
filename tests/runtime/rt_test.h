/* rt_test.h - helpers for the runtime tests (their checks: ../check.h): a
 * deterministic test-data generator, and run_op(), which builds a
 * one-op module with ir_emit (inputs -> op -> accum into a state) and runs
 * it on the reference runtime so a test can read the op's full result. */
#ifndef RT_TEST_H
#define RT_TEST_H
#include "ir/ir.h"
#include "runtime/exec/rt.h"
#include "../check.h"
#include <math.h>

/* splitmix-style generator for test inputs (independent of rng.c) */
static uint64_t g_rs = 12345;
static inline double trand(void) {   /* uniform in [-1, 1) */
  uint64_t z = (g_rs += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static inline IrType mkty(IrDtype dt, int rank, const int64_t *dims) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank;
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return t;
}
#define TY(dt, ...) mkty(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
static inline IrType scalar_ty(IrDtype dt) { IrType t; memset(&t, 0, sizeof t); t.dtype = dt; return t; }

/* Converts n doubles to a buffer of dtype dt (malloc'd). */
static inline void *to_dtype(const double *v, int64_t n, IrDtype dt) {
  void *p = ts_xmalloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++) {
    if (dt == IR_F32) ((float *)p)[i] = (float)v[i];
    else if (dt == IR_F64) ((double *)p)[i] = v[i];
    else ((int32_t *)p)[i] = (int32_t)v[i];
  }
  return p;
}
static inline double *from_dtype(const void *p, int64_t n, IrDtype dt) {
  double *v = ts_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = dt == IR_F32 ? ((const float *)p)[i] : dt == IR_F64 ? ((const double *)p)[i] : ((const int32_t *)p)[i];
  return v;
}

typedef struct { IrType t; const double *v; } Arg;

/* Runs one op on inputs args[0..nin) (values as doubles, converted to each
 * arg's dtype).  Returns the result as a malloc'd double array and its type
 * in *rt, or NULL with the message in err (emit or run failure).  A result
 * of an integer dtype is cast to f64 inside the module first (accum needs a
 * float state). */
/* Which ops run_op has exercised (test_rt_ops checks that every op was). */
static unsigned char g_covered[IR_OP_COUNT];

/* Sharded runs of one op (single process): the rank (mesh sizes and
 * coordinates, no groups) and the shardings of the result and operands. */
typedef struct { const RtRank *rank; IrSharding res; IrSharding in[4]; } OpShard;

static inline double *run_op_sh(IrOp op, int nin, const Arg *args, const int64_t *ia, const double *fa,
                                const IrType *typed, const OpShard *sh, IrType *rt, char *err, size_t errlen) {
  IrModule *m = ir_module_new("t");
  if (sh) {
    const PlanMesh *ms = &sh->rank->mesh;
    m->par = (IrParallel){.tp = ms->tp, .pp = ms->pp, .cp = ms->cp, .ep = ms->ep, .dp = ms->dp};
  }
  int b = ir_block_add(m, "forward");
  int ids[16];
  RtFeed feeds[16];
  void *bufs[16];
  char names[16][16];
  double *res = NULL;
  for (int i = 0; i < nin; i++) {
    snprintf(names[i], sizeof names[i], "x%d", i);
    ids[i] = ir_emit(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, names[i], &args[i].t, err, errlen);
    TS_ASSERT(ids[i] >= 0);
    bufs[i] = to_dtype(args[i].v, ir_type_numel(&args[i].t), args[i].t.dtype);
    feeds[i] = (RtFeed){names[i], bufs[i]};
  }
  g_covered[op] = g_covered[IR_OP_INPUT] = g_covered[IR_OP_ACCUM] = 1;
  int r = ir_emit(m, b, op, ids, nin, ia, fa, NULL, typed, err, errlen);
  RtProgram *p = NULL;
  if (r >= 0 && sh) {
    m->blocks.a[b].nodes[r].sh = sh->res;
    for (int i = 0; i < nin && i < 4; i++) m->blocks.a[b].nodes[ids[i]].sh = sh->in[i];
  }
  if (r >= 0) {
    IrType t = m->blocks.a[b].nodes[r].type;
    if (!ir_dtype_is_float(t.dtype)) {
      IrType c = t;
      c.dtype = IR_F64;
      r = ir_emit(m, b, IR_OP_CAST, &r, 1, NULL, NULL, NULL, &c, err, errlen);
      TS_ASSERT(r >= 0);
    }
    IrState st;
    memset(&st, 0, sizeof st);
    st.name = "out";
    st.type = m->blocks.a[b].nodes[r].type;
    st.kind = IR_STATE_GRAD;
    st.of = -1;
    int s = ir_state_add(m, &st);
    int64_t sa[1] = {s};
    TS_ASSERT(ir_emit(m, b, IR_OP_ACCUM, &r, 1, sa, NULL, NULL, NULL, err, errlen) >= 0);
    p = sh ? rt_program_new_rank(m, sh->rank, err, errlen) : rt_program_new(m, err, errlen);
    TS_ASSERT(p);
    RtRunInfo info = {0, 0, 1e-3, 0};
    if (rt_run_block(p, b, feeds, nin, &info, err, errlen) == 0) {
      *rt = t;
      res = from_dtype(rt_state_data(p, s), ir_type_numel(&st.type), st.type.dtype);
    }
  }
  rt_program_free(p);
  ir_module_free(m);
  for (int i = 0; i < nin; i++) free(bufs[i]);
  return res;
}

static inline double *run_op(IrOp op, int nin, const Arg *args, const int64_t *ia, const double *fa,
                             const IrType *typed, IrType *rt, char *err, size_t errlen) {
  return run_op_sh(op, nin, args, ia, fa, typed, NULL, rt, err, errlen);
}

/* A fresh array of n test values in [lo, hi), rounded to dtype dt so the
 * test's double reference sees exactly what the kernel sees. */
static inline double *rand_vec(int64_t n, double lo, double hi, IrDtype dt) {
  double *v = ts_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    v[i] = lo + (hi - lo) * (trand() + 1) / 2;
    if (dt == IR_F32) v[i] = (float)v[i];
  }
  return v;
}
/* Comparison tolerance for results of dtype dt. */
static inline double tol_of(IrDtype dt) { return dt == IR_F32 ? 2e-5 : 1e-11; }

#endif
