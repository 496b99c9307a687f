/* exec_gemm.c - GEMMs with an epilogue for the LLVM backend.
 *
 * Straight into the state (plan_accum_direct_runs, plan/groups.h): a
 * weight gradient `accum (reshape* (matmul A, B)) @grad.W` runs as ONE
 * BLAS call, C = A.B + C with beta = 1, C the gradient state's bytes (A
 * and B bf16 / f16: converted to f32 copies first, exact), at
 * the accum's position, and an embedding's `accum (embedding_bwd ids, dy)`
 * scatter-adds into the state's rows; the product never has a buffer of
 * its own (for a tied embedding of a 50k vocabulary, two [vocab, d_model]
 * transients less).
 * Numerics as for the bias below: the reference rounds A.B, then adds it
 * to the state; BLAS adds its partial products into the state, so when it
 * splits K (the tokens of the micro batch) the sums round differently, a
 * few ulp.
 *
 * Bias: the group
 * {matmul, reshapes, broadcast bias, add} that passes/fuse.c forms for
 * every `x @ W + b` runs as ONE BLAS call, C = A.B + C with beta = 1, into
 * the add's buffer pre-filled with the broadcast bias.  The product is
 * never stored on its own and never read back by a separate add.
 *
 * The fill is the reference broadcast kernel (ops_ref.c) on the broadcast
 * node, so any broadcast the IR allows (and its sharding) fills exactly
 * what the reference computes.  The GEMM is the reference matmul's
 * (ops_ref_t.h) with beta = 1: one GEMM over all rows when b is a matrix
 * and a is not transposed, else one per batch item.
 *
 * Numerics: the reference rounds A.B to the dtype, then adds the bias;
 * here BLAS adds its partial products to the bias in the dtype.  For a
 * GEMM that sums K in one pass the two agree bit for bit (a sum of two
 * floats rounds the same either way); when BLAS splits K into blocks the
 * bias enters the sum at a different point: a few ulp (tests/fuse checks
 * 1e-6 in f32, 1e-12 in f64 over whole training runs). */
#include "rt_priv.h"
#include "runtime/cpu/par.h"
#include <cblas.h>
#include <limits.h>

/* The shapes of matmul mm of b: M, N, K, batch (product of a's leading
 * dims) and whether b is one matrix shared by every batch item.  0, or -1
 * if BLAS cannot take them (the reference kernel would say why). */
int rt_gemm_shape(const IrBlock *b, const IrNode *mm, int64_t *M, int64_t *N, int64_t *K, int64_t *batch,
                      int *shared) {
  const IrType *at = &b->nodes[mm->in[0]].type, *bt = &b->nodes[mm->in[1]].type;
  int ta = mm->ia[0] != 0, tb = mm->ia[1] != 0, ra = at->rank, rb = bt->rank;
  if (ra < 2 || rb < 2) return -1;
  *M = ta ? at->dim[ra - 1] : at->dim[ra - 2];
  *K = ta ? at->dim[ra - 2] : at->dim[ra - 1];
  int64_t Kb = tb ? bt->dim[rb - 1] : bt->dim[rb - 2];
  *N = tb ? bt->dim[rb - 2] : bt->dim[rb - 1];
  *batch = 1;
  for (int d = 0; d < ra - 2; d++) *batch *= at->dim[d];
  if (*K != Kb) return -1;
  if (rb != 2) {
    if (rb != ra) return -1;
    for (int d = 0; d < ra - 2; d++)
      if (at->dim[d] != bt->dim[d]) return -1;
  }
  *shared = rb == 2;
  if (ir_type_numel(&mm->type) != *batch * *M * *N) return -1;
  if (*M > INT_MAX || *N > INT_MAX || *K > INT_MAX || *batch * *M > INT_MAX) return -1;
  return 0;
}

int rt_gemm_epilogue_ok(const IrBlock *b, int mm) {
  if (mm < 0 || mm >= b->n) return 0;
  const IrNode *n = &b->nodes[mm];
  if (n->op != IR_OP_MATMUL || n->nin != 2) return 0;
  IrDtype dt = n->type.dtype, ab = b->nodes[n->in[0]].type.dtype;
  /* f32 or f64 throughout, or a bf16 plan's bias GEMM: 16-bit operands,
   * the f32 product (pass precision) */
  int mixed = ir_dtype_is_16(ab) && dt == IR_F32;
  if ((dt != IR_F32 && dt != IR_F64) || (ab != dt && !mixed) || b->nodes[n->in[1]].type.dtype != ab)
    return 0;
  int64_t M, N, K, batch;
  int shared;
  return rt_gemm_shape(b, n, &M, &N, &K, &batch, &shared) == 0;
}

int rt_gemm_node_ok(const IrBlock *b, int mm) {
  if (rt_gemm_epilogue_ok(b, mm)) return 1;
  if (mm < 0 || mm >= b->n) return 0;
  const IrNode *n = &b->nodes[mm];
  if (n->op != IR_OP_MATMUL || n->nin != 2) return 0;
  IrDtype ab = b->nodes[n->in[0]].type.dtype, dt = n->type.dtype;
  if (!ir_dtype_is_16(ab) || b->nodes[n->in[1]].type.dtype != ab || (dt != ab && dt != IR_F32)) return 0;
  int64_t M, N, K, batch;
  int shared;
  return rt_gemm_shape(b, n, &M, &N, &K, &batch, &shared) == 0;
}

/* One GEMM per batch item in [lo, hi), C_i = op(A_i) op(B_i) + C_i. */
typedef struct {
  int f64;
  enum CBLAS_TRANSPOSE ta, tb;
  int M, N, K, lda, ldb;
  const void *A, *B;
  void *C;
  int64_t sa, sb, sc;   /* element strides between batch items */
} GemmJob;

static void gemm_items(void *jp, int64_t lo, int64_t hi) {
  const GemmJob *j = jp;
  for (int64_t i = lo; i < hi; i++) {
    if (j->f64)
      cblas_dgemm(CblasRowMajor, j->ta, j->tb, j->M, j->N, j->K, 1.0, (const double *)j->A + i * j->sa, j->lda,
                  (const double *)j->B + i * j->sb, j->ldb, 1.0, (double *)j->C + i * j->sc, j->N);
    else
      cblas_sgemm(CblasRowMajor, j->ta, j->tb, j->M, j->N, j->K, 1.0f, (const float *)j->A + i * j->sa, j->lda,
                  (const float *)j->B + i * j->sb, j->ldb, 1.0f, (float *)j->C + i * j->sc, j->N);
  }
}

int rt_accum_direct_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                        char *msg, size_t n) {
  const IrNode *mm = &b->nodes[K->accum_from - 1], *acc = &b->nodes[K->at];
  const IrModule *m = rt_program_module(p);
  int st = (int)acc->ia[0];
  if (acc->op != IR_OP_ACCUM || st < 0 || st >= m->states.n || m->states.a[st].type.dtype != mm->type.dtype ||
      ir_type_numel(&m->states.a[st].type) != ir_type_numel(&mm->type)) {
    snprintf(msg, n, "internal error: %%%d is not an accum of %%%d's elements into a state of its dtype", K->at,
             K->accum_from - 1);
    return -1;
  }
  void *C = rt_state_data(p, st);
  if (mm->op == IR_OP_EMBEDDING_BWD) {   /* the scatter-add, into the state's rows */
    const IrType *it[2] = {&b->nodes[mm->in[0]].type, &b->nodes[mm->in[1]].type};
    RtKctx kc = {rt_program_kenv(p), b, mm, info, C, &mm->type, (const void *const *)bufs, it, msg, n};
    return rt_embedding_bwd_add(&kc);
  }
  int64_t M, N, Kd, batch;
  int shared;
  if (mm->op != IR_OP_MATMUL || rt_gemm_shape(b, mm, &M, &N, &Kd, &batch, &shared) != 0 || batch != 1) {
    snprintf(msg, n, "internal error: %%%d is not a matmul BLAS takes", K->accum_from - 1);
    return -1;
  }
  (void)rt_par_threads();   /* first call: shares the cores among local ranks (par.h) */
  if (M * N == 0 || Kd == 0) return 0;   /* A.B is 0: the state stays */
  int ta = mm->ia[0] != 0, tb = mm->ia[1] != 0;
  /* 16-bit operands (a bf16 weight gradient into its f32 main grad): f32
   * copies, exact, then sgemm as for f32 operands */
  IrDtype ad = b->nodes[mm->in[0]].type.dtype;
  float *a32 = NULL, *b32 = NULL;
  const void *A = bufs[0], *B = bufs[1];
  if (ir_dtype_is_16(ad)) {
    a32 = rt_scratch(0, (size_t)(M * Kd) * sizeof *a32);   /* par.h: kept between calls */
    b32 = rt_scratch(1, (size_t)(Kd * N) * sizeof *b32);
    rt_convert(a32, IR_F32, bufs[0], ad, M * Kd);
    rt_convert(b32, IR_F32, bufs[1], b->nodes[mm->in[1]].type.dtype, Kd * N);
    A = a32;
    B = b32;
  }
  GemmJob j = {mm->type.dtype == IR_F64, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
               (int)M, (int)N, (int)Kd, (int)(ta ? M : Kd), (int)(tb ? Kd : N), A, B, C, 0, 0, 0};
  gemm_items(&j, 0, 1);
  if (a32) rt_scratch_done(0), rt_scratch_done(1);
  return 0;
}

/* At most this many multiply-adds per item, batched GEMMs run whole on
 * pool threads with BLAS single-threaded (the reference's RT_SMALL_GEMM). */
#define GEMM_SMALL (64.0 * 1024 * 1024)

/* A bf16 plan's bias GEMM (16-bit operands, f32 product; pass precision):
 * out = the reference's f32 product (converted operands, sgemm), then
 * out += broadcast(bias) in f32 -- the two roundings of the reference's
 * matmul and add nodes, so both backends give the same bits (tests/bf16);
 * beta = 1 into the bias would let BLAS add it to partial sums.  The
 * broadcast bias is this call's own buffer, as the f32 operand copies. */
static int mixed_epilogue(RtProgram *p, const IrBlock *b, const IrNode *mm, const IrNode *bc, void **bufs,
                          const RtRunInfo *info, char *msg, size_t n) {
  const void *min[2] = {bufs[0], bufs[1]};
  const IrType *mty[2] = {&b->nodes[mm->in[0]].type, &b->nodes[mm->in[1]].type};
  RtKctx km = {rt_program_kenv(p), b, mm, info, bufs[3], &mm->type, min, mty, msg, n};
  if (rt_ref_kernels[IR_OP_MATMUL](&km) != 0) return -1;
  int64_t cnt = ir_type_numel(&bc->type);
  float *bias = ts_xmalloc((size_t)(cnt ? cnt : 1) * sizeof *bias), *out = bufs[3];
  const void *bin[1] = {bufs[2]};
  const IrType *bty[1] = {&b->nodes[bc->in[0]].type};
  RtKctx kb = {rt_program_kenv(p), b, bc, info, bias, &bc->type, bin, bty, msg, n};
  int rc = rt_ref_kernels[IR_OP_BROADCAST](&kb);
  for (int64_t i = 0; rc == 0 && i < cnt; i++) out[i] += bias[i];
  free(bias);
  return rc;
}

int rt_gemm_epilogue_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                         char *msg, size_t n) {
  const IrNode *mm = &b->nodes[K->gemm_mm - 1], *add = &b->nodes[K->at];
  int bci = add->in[0];
  if (b->nodes[bci].op != IR_OP_BROADCAST) bci = add->in[1];
  const IrNode *bc = &b->nodes[bci];
  if (ir_dtype_is_16(b->nodes[mm->in[0]].type.dtype)) return mixed_epilogue(p, b, mm, bc, bufs, info, msg, n);
  /* 1. out = broadcast(bias): the reference kernel of the broadcast node */
  const void *bin[1] = {bufs[2]};
  const IrType *bty[1] = {&b->nodes[bc->in[0]].type};
  RtKctx kc = {rt_program_kenv(p), b, bc, info, bufs[3], &bc->type, bin, bty, msg, n};
  if (rt_ref_kernels[IR_OP_BROADCAST](&kc) != 0) return -1;
  /* 2. out += A.B */
  int64_t M, N, Kd, batch;
  int shared;
  if (rt_gemm_shape(b, mm, &M, &N, &Kd, &batch, &shared) != 0) {
    snprintf(msg, n, "internal error: the epilogue's matmul %%%d has shapes BLAS does not take", K->gemm_mm - 1);
    return -1;
  }
  (void)rt_par_threads();   /* first call: shares the cores among local ranks (par.h) */
  if (batch * M * N == 0 || Kd == 0) return 0;   /* A.B is 0: out is the bias */
  int ta = mm->ia[0] != 0, tb = mm->ia[1] != 0;
  GemmJob j = {mm->type.dtype == IR_F64, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
               (int)M, (int)N, (int)Kd, (int)(ta ? M : Kd), (int)(tb ? Kd : N), bufs[0], bufs[1], bufs[3],
               M * Kd, shared ? 0 : Kd * N, M * N};
  if (shared && !ta) {   /* rows of all batch items at once: one GEMM */
    j.M = (int)(batch * M);
    gemm_items(&j, 0, 1);
  } else if (batch > 1 && (double)M * (double)N * (double)Kd <= GEMM_SMALL) {
    rt_par_blas_serial(gemm_items, &j, batch, 1);
  } else {
    gemm_items(&j, 0, batch);
  }
  return 0;
}
