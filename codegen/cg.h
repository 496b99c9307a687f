/* cg.h - code generation: tensor-IR nodes -> kernel IR (lower.c), kernel IR
 * -> LLVM IR -> host machine code through ORC LLJIT (llvm.c), and a small
 * helper that spreads a kernel's parallel space over threads (par.c).
 * The kernel IR itself is in kir.h; docs/codegen.md has the design. */
#ifndef TS_CG_H
#define TS_CG_H
#include "kir.h"

/* ---- lowering (lower.c) ----
 * The buffers of a lowered kernel: first the values it reads, then the
 * values it writes, each a whole tensor of its IrType, contiguous row-major. */
typedef struct {
  int nin, nout;
  int in[CG_MAX_BUFS];   /* buffer k (k < nin) holds value %in[k] of the block */
  int out[CG_MAX_BUFS];  /* buffer nin + j receives value %out[j] */
} CgGroupIO;

/* Lowers a group of nodes of block b into ONE kernel.  nodes[0..n) are
 * value ids, ascending (so in execution order); the group is
 *   - a chain (any DAG) of elementwise ops: every OPF_EW op, full,
 *     causal_mask, masked_fill, dropout (unsplit: its mask uses the local
 *     index as the global one; the kernel then reads the run-time scalars
 *     seed, step and micro, kir.h PARAM);
 *   - layout ops that read a value from outside the group at a remapped
 *     index: broadcast, reshape, permute, slice, pad, concat;
 *   - plus any number of row ops over the last axis: softmax, log_softmax,
 *     layernorm, rmsnorm, their _bwd forms, cross_entropy(_bwd);
 *   - plus reductions over the last axis (sum, mean, max) whose results
 *     are not used inside the group (the "at most one reduction at the end"
 *     of a fusion chain).
 * All of them have the same element shape [..., D] (a reduction's and a
 * cross-entropy's is their operand's).  Per-row operands (targets, dloss)
 * and the operands of layout ops come from outside the group.
 * A group of one node may also be a reduction along any axis, sumsq or
 * sum_to.
 * The kernel reads every operand from outside the group (io->in) and
 * writes every group value used by a node outside the group, and the last
 * node (io->out).  Values are computed in f64 (or f32: cg_lower_group_opts) and rounded to each node's
 * dtype after each node, so a fused group computes what the nodes compute
 * one by one.  An output may share memory with an input of its shape (in
 * place).  NULL with a message if the group is not of that form or
 * not convex (an operand computed from the group's values elsewhere). */
CgKernel *cg_lower_group(const IrModule *m, const IrBlock *b, const int *nodes, int n, CgGroupIO *io,
                         char *err, size_t errlen);
/* The readers of every value of a block, built once (time linear in nodes
 * and operands) for callers that lower many candidate groups of one block
 * (the fusion pass): cg_lower_group_users then finds a group's outputs from
 * its members' readers instead of scanning the rest of the block. */
typedef struct CgUsers CgUsers;
CgUsers *cg_users_build(const IrBlock *b);
void cg_users_free(CgUsers *u);
/* cg_lower_group with the readers of b (u built from b, unchanged since;
 * NULL: scan). */
CgKernel *cg_lower_group_users(const IrModule *m, const IrBlock *b, const CgUsers *u, const int *nodes, int n,
                               CgGroupIO *io, char *err, size_t errlen);
/* How to lower.  f32: a group whose values and operands are f32 (or
 * bf16) computes in f32 rather than f64 (the CUDA path's default; the
 * reference and the CPU JIT keep f64, and so does the CUDA path's exact
 * mode): see codegen/lower.c's header for what stays f64. */
typedef struct { int f32; } CgLowerOpts;
/* cg_lower_group_users with options (o NULL: the defaults, f64). */
CgKernel *cg_lower_group_opts(const IrModule *m, const IrBlock *b, const CgUsers *u, const int *nodes, int n,
                              CgGroupIO *io, const CgLowerOpts *o, char *err, size_t errlen);
/* The kernel of one tensor of a multi-tensor optimizer step (the
 * executor's, runtime/exec/exec_jit.c), for op adamw, sgd, lion or
 * lr_step: param dtype T, clip coefficient dtype TC, the rule's constant
 * attributes fa[0 .. nkey) baked in (adamw b1 b2 eps; sgd mom nesterov;
 * lion b1 b2; lr_step none), buffers declared with `cnt` elements:
 *   [coef [1],] grad (lr_step: its update x), scalars f64 [4], param,
 *   then the nmom moments (adamw m v; sgd buf; lion m), written in place.
 * Scalars per tensor: adamw {lr, 1 - b1^t, 1 - b2^t, wd}; sgd and lion
 * {lr, 0, 0, wd}; lr_step {lr, scale, 0, wd}.  The reference's arithmetic
 * in f64 in the same order (runtime/cpu/ops_ref_t.h, *_range):
 *   adamw  g = grad coef; m' = b1 m + (1 - b1) g; v' = b2 v + ((1 - b2) g) g
 *          w' = w - lr (m'/c1 / (sqrt(v'/c2) + eps) + wd w)
 *   sgd    d = g + wd w; b' = mom b + d; w' = w - lr (nesterov ? d + mom b' : b')
 *   lion   c = b1 m + (1 - b1) g; w' = w (1 - lr wd) - lr sign(c); m' = b2 m + (1 - b2) g
 *   lr_step w' = w (1 - lr wd) - (lr scale) x
 * NULL for another op or if the kernel does not verify. */
CgKernel *cg_lower_opt_step(IrOp op, IrDtype T, IrDtype TC, const double *fa, int64_t cnt);
/* The buffers of op's step kernel: returns its operand count (2 with a
 * clip coefficient, 1 for lr_step; 0: not an optimizer step), and sets
 * the moment states it updates and the constant attributes it bakes in. */
int cg_opt_step_layout(IrOp op, int *nmom, int *nkey);
/* Whether op can be part of a group (or be a group of one node). */
int cg_op_lowerable(IrOp op);
/* Whether op is a row op over the last axis (softmax, the norms,
 * cross-entropy, and their backward forms). */
int cg_op_is_row(IrOp op);

/* ---- LLVM (llvm.c) ----
 * A compiled kernel computes iterations [begin, end) of its parallel space;
 * bufs[k] points at buffer k (see CgGroupIO). */
typedef void (*CgFn)(void **bufs, int64_t begin, int64_t end);
typedef struct CgJit CgJit;

/* One ORC LLJIT for the host CPU (its name and features: AVX2/AVX-512 are
 * used where present).  Kernels compiled by it live until cg_jit_free.
 * Compile from one thread at a time; compiled functions run on any. */
CgJit *cg_jit_new(char *err, size_t errlen);
void cg_jit_free(CgJit *j);
/* Emits k as LLVM IR, optimizes it (new pass manager, default<O3>), JITs
 * it.  A kernel whose text form equals one compiled before by this JIT
 * (the same op on the same shapes in another layer) is not compiled
 * again: its function is returned.  NULL with a message on failure. */
CgFn cg_jit_compile(CgJit *j, const CgKernel *k, char *err, size_t errlen);
/* The same, except where another process is compiling this kernel into
 * the cache directory (cg_jit_set_cache_dir) right now: then NULL with
 * *busy = 1 and no error, and the caller goes on with other kernels and
 * asks for this one later with cg_jit_compile, which waits for that
 * process (bounded) and loads its object.  Ranks starting together on one
 * machine with a cold cache so share the compilation (llvm.c, "who
 * compiles a kernel"). */
CgFn cg_jit_compile_or_defer(CgJit *j, const CgKernel *k, int *busy, char *err, size_t errlen);
/* How many cg_jit_compile calls were answered from that cache. */
int cg_jit_cache_hits(const CgJit *j);
/* Keeps compiled machine code in dir (created if missing) across
 * processes: a kernel compiled once is loaded from DIR/<hash>.o by later
 * JITs for the same CPU and LLVM version (keyed by the kernel's full text).
 * NULL or "" turns it off (the default). */
void cg_jit_set_cache_dir(CgJit *j, const char *dir);
int cg_jit_disk_hits(const CgJit *j);     /* kernels loaded from the directory */
int cg_jit_disk_writes(const CgJit *j);   /* kernels written to it */
/* The host CPU name and feature string the JIT targets (for reports). */
const char *cg_jit_cpu(const CgJit *j);

/* k's LLVM IR as text (for --emit=llvm); optimize != 0 runs default<O3>
 * for the host CPU first.  0, or -1 with a message. */
int cg_kernel_llvm_text(const CgKernel *k, int optimize, StrBuf *out, char *err, size_t errlen);
/* The host assembly of k after optimization (to check vectorization). */
int cg_kernel_asm_text(const CgKernel *k, StrBuf *out, char *err, size_t errlen);

/* ---- C (cprint.c) ----
 * k as a C translation unit defining `void NAME(void **bufs, int64_t
 * begin, int64_t end)` with the same meaning as the JIT's function (C11,
 * <math.h>; link with -lm).  0, or -1 with a message if k is invalid. */
int cg_kernel_c_text(const CgKernel *k, StrBuf *out, char *err, size_t errlen);

/* ---- threads (par.c) ----
 * Runs fn over iterations [0, n) split into nthreads contiguous chunks, one
 * pthread each (the caller's thread takes the first); nthreads <= 1 runs
 * inline.  Returns when all are done. */
void cg_par_run(CgFn fn, void **bufs, int64_t n, int nthreads);

/* A persistent pool of nthreads (the caller's thread counts as one; the
 * others sleep between runs), for running many kernels without creating
 * threads each time.  cg_pool_run splits [0, n) like cg_par_run and
 * returns when all chunks are done; one run at a time per pool. */
typedef struct CgPool CgPool;
CgPool *cg_pool_new(int nthreads);
void cg_pool_free(CgPool *p);
int cg_pool_threads(const CgPool *p);   /* threads actually started + 1 */
void cg_pool_run(CgPool *p, CgFn fn, void **bufs, int64_t n);

#endif
