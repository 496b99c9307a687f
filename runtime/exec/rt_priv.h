/* rt_priv.h - what the executor's files share and nobody else needs: the
 * program's parts the kernels' environment and the device backend reach
 * (rt.c), the LLVM backend's kernels (exec_jit.c) and the GEMM epilogues
 * (exec_gemm.c). */
#ifndef TS_RT_PRIV_H
#define TS_RT_PRIV_H
#include "rt.h"
#include "runtime/cpu/kernels.h"
#include "codegen/cg.h"
#include "codegen/cuda.h"
#include "dev_prog.h"

/* ---- the program (rt.c) ---- */
/* The kernels' view of p (RtKctx.env): its module, rank, seed, host slab,
 * pipeline and ring state. */
RtKenv *rt_program_kenv(RtProgram *p);
/* The module's training seed, for dropout. */
uint64_t rt_program_seed(const RtProgram *p);
int rt_program_axis_size(const RtProgram *p, IrAxis a);
/* The pipeline kernels' state at the end of a step: rt_kenv_pipe_wait_sends /
 * rt_kenv_pipe_end_step on host memory, the device executor's on a GPU
 * (rt_dev_exec_pipe_end).  0, or -1 with a message. */
int rt_pipe_wait_sends(RtProgram *p, char *err, size_t errlen);
int rt_pipe_end_step(RtProgram *p, char *err, size_t errlen);
/* The rank's group along axis a, or NULL (axis of size 1, or none made). */
RtComm *rt_program_group(const RtProgram *p, IrAxis a);
RtComm *rt_program_dev_group(const RtProgram *p, IrAxis a);   /* RtRank.dev_group */

/* ---- the LLVM backend (exec_jit.c) ----
 * A kernel run at node `at` of its block (a group's last member, or a
 * lone lowerable node): buffer k of fn is value io.in[k] (k < io.nin),
 * then io.out[j] (written). */
typedef struct {
  int at;
  IrOp op;            /* the op at `at` (profiles) */
  CgFn fn;
  CgKernel *defer;    /* while rt_jit_new runs: fn is being compiled by another process (exec_jit.c
                         finish_deferred); NULL after */
  int64_t grid, work; /* iterations; elements of the largest buffer */
  CgGroupIO io;
  int nparam;         /* > 0: the kernel reads run-time scalars (dropout: seed, step, micro; kir.h
                         PARAM), passed after its buffers by rt_jit_run */
  int opt;            /* a multi-tensor optimizer step over the adamw, sgd, lion or lr_step nodes
                         run[0..nrun) (one kind, `op`): per tensor, buffers (coef,) grad, four
                         scalars, then param and moments (states, updated in place; see
                         exec_jit.c, cg_lower_opt_step) */
  int *run, nrun;
  int scal_at;        /* opt: the first of its nrun slots of four scalars in the program's table (each run
                         its own slots: a device copies them asynchronously, exec_dev.c opt_run) */
  int gemm_mm;        /* > 0 (the matmul's id + 1): a GEMM bias epilogue (exec_gemm.c), buffers
                         A, B, bias, then the add's value */
  int attn_grads;     /* the attention_bwd parts run[0..nrun) of one attention in one pass
                         (rt_attn_grads_run): buffers q, k, v, o, do, then each part's value */
  int accum_from;     /* > 0 (the producer's id + 1): a gradient made straight into the state of the
                         accum at `at` (exec_gemm.c): a matmul (C = A.B + C) or embedding_bwd
                         (scatter-add); buffers: the producer's two operands */
  CgCudaLaunch cl;    /* cuda mode (RtExecOpts.cuda): the printed kernel's launch */
  CgCudaLaunch *cls;  /* cuda mode, opt: per member j of run[], the launches cls[2j], cls[2j + 1] */
  int64_t *ccnt;      /* ... for element counts ccnt[2j] (full ZeRO chunk or whole tensor), ccnt[2j + 1]
                         (partial chunk; 0: none) (exec_jit.c cuda_opt_run) */
} RtJitKernel;
typedef struct {
  int *kern;          /* per node: the kernel computing it, or -1 (reference kernel) */
  VEC(RtJitKernel) k;
} RtJitBlock;
typedef struct RtJit RtJit;
/* Lowers and compiles every kernel of m's blocks (o->no_groups: every node
 * alone, groups ignored).  NULL with a message on a JIT failure. */
RtJit *rt_jit_new(const IrModule *m, const RtExecOpts *o, char *err, size_t errlen);
void rt_jit_free(RtJit *j);
const RtJitBlock *rt_jit_block(const RtJit *j, int b);
const RtExecStats *rt_jit_stats(const RtJit *j);
/* cuda mode: the printed kernels (no prelude), and where each came from. */
const StrBuf *rt_jit_cuda_source(const RtJit *j);
const RtCudaKernelInfo *rt_jit_cuda_info(const RtJit *j, int *n);

/* Runs kernel k over its parallel space (the pool, or inline if small);
 * bufs[0 .. nin + nout) are its buffers.  A kernel with run-time scalars
 * gets p's seed and info's step and micro batch (info NULL: 0, 0). */
void rt_jit_run(RtJit *j, const RtProgram *p, const RtJitKernel *k, void **bufs, const RtRunInfo *info);
/* The per-run scalars of an optimizer step kernel (cg_lower_opt_step) for
 * node n of a program trained by tr at info's step and lr: adamw {lr (Muon's
 * AdamW group: ir_train_adamw_lr), 1 - b1^t, 1 - b2^t, wd}, sgd and
 * lion {lr, 0, 0, wd}, lr_step {lr, scale, 0, wd}. */
void rt_jit_opt_scalars(const IrTrain *tr, const IrNode *n, const RtRunInfo *info, double s[4]);
/* The elements of its param step node n updates on this rank: all of
 * them, or (ZeRO: flat moments) the rank's chunk [*off, *off + *cnt). */
void rt_jit_opt_chunk(const RtProgram *p, const IrNode *n, int64_t *off, int64_t *cnt);
/* The buffers of step node nd's kernel, in cg_opt_step_layout's order,
 * into row: its operands (vals), the scalars sc, the param from element
 * off on, its moments, the states' memory from state(p, id) (the host's
 * or the device's).  Returns the number of buffers, -1 when an operand
 * has none. */
int rt_jit_opt_buffers(const RtProgram *p, const IrNode *nd, void *const *vals, void *sc, int64_t off,
                       void *(*state)(const RtProgram *, int), void *row[6]);
/* Runs the multi-tensor optimizer step K (K->opt) of block b: vals[] are
 * the run's value buffers.  0, or -1 with a message. */
int rt_jit_run_opt(RtJit *j, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void *const *vals,
                   const RtRunInfo *info, char *msg, size_t n);
/* GEMM bias epilogues (exec_gemm.c).  rt_gemm_epilogue_ok: whether the
 * matmul node mm of b is a product the epilogue runs (float, shapes BLAS
 * takes).  rt_gemm_epilogue_run: kernel K (K->gemm_mm) with bufs = A, B,
 * bias, out: out = broadcast(bias) (the reference kernel), then
 * out = A.B + out (one GEMM, or one per batch item, beta = 1).  0 or -1. */
int rt_gemm_epilogue_ok(const IrBlock *b, int mm);
/* Whether matmul node mm of b is a product a device GEMM runs: that, or
 * (OPF_MIXED) two bf16 / f16 operands into their dtype or f32. */
int rt_gemm_node_ok(const IrBlock *b, int mm);
/* The product of matmul node mm as GEMMs: M, N, K, batch (product of a's
 * leading dims) and whether b is one matrix shared by every batch item.
 * 0, or -1 if BLAS cannot take it. */
int rt_gemm_shape(const IrBlock *b, const IrNode *mm, int64_t *M, int64_t *N, int64_t *K, int64_t *batch, int *shared);
int rt_accum_direct_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                        char *msg, size_t n);
int rt_gemm_epilogue_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                         char *msg, size_t n);
/* rt_gemm_epilogue_run, counted in j's stats. */
int rt_jit_run_gemm(RtJit *j, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs,
                    const RtRunInfo *info, char *msg, size_t n);

#endif
