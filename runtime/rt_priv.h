/* rt_priv.h - what the files of runtime/ share and nobody else needs: the
 * counter-based random numbers (rng.c), the kernel calling convention and
 * the reference kernel table (ops_ref.c), used by the executor (rt.c). */
#ifndef TS_RT_PRIV_H
#define TS_RT_PRIV_H
#include "rt.h"
#include "../codegen/cg.h"
#include "../codegen/cuda.h"
#include "dev_prog.h"

/* ---- counter-based random numbers (rng.c; formulas in its header) ---- */
enum { RT_RNG_INIT = 1, RT_RNG_DROPOUT = 2, RT_RNG_DATA = 3 };  /* domain tags */
uint64_t rt_mix64(uint64_t z);                            /* splitmix64 finalizer */
uint64_t rt_hash_words(const uint64_t *w, int n);         /* chained mix over words */
static inline double rt_u01(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }  /* [0, 1) */
uint64_t rt_name_hash(const char *name);                  /* FNV-1a of the name */
/* The initial value of element i of a parameter (name hash nh) under seed. */
double rt_init_value(const IrState *s, uint64_t seed, uint64_t nh, int64_t i);
/* Dropout's uniform draw for element i. */
double rt_dropout_u(uint64_t seed, int64_t stream, int64_t step, int micro, int64_t i);

/* ---- kernels ----
 * One call computes one node.  in[k] / it[k] are operand k's data and type
 * (contiguous, row-major), out / ot the result's (NULL / void for effects).
 * A kernel returns 0, or -1 after writing a message into err (the executor
 * prefixes the block and node). */
typedef struct RtKctx {
  RtProgram *p;
  const IrBlock *b;         /* the node's block: operand k is b->nodes[n->in[k]] */
  const IrNode *n;
  const RtRunInfo *info;
  void *out;
  const IrType *ot;
  const void *const *in;
  const IrType *const *it;
  char *err;
  size_t errlen;
} RtKctx;
typedef int (*RtKernel)(RtKctx *k);
extern const RtKernel rt_ref_kernels[IR_OP_COUNT];
/* Routing kernels (ops_route.c), entries of the same table. */
int ref_TOPK_MASK(RtKctx *k);
int ref_CAPACITY_MASK(RtKctx *k);
/* Pipeline kernels (ops_pipe.c), entries of the same table. */
int ref_SEND(RtKctx *k);
int ref_RECV(RtKctx *k);
int ref_STASH(RtKctx *k);
int ref_UNSTASH(RtKctx *k);
int ref_GROUP_SUM(RtKctx *k);
/* A type as text for kernel messages; two slots so one message can show two. */
const char *rt_tstr(const IrType *t, int slot);
/* The mesh axis in the node's ia[0]: its size and this rank's group over
 * it (NULL when the size is 1).  0, or -1 after rt_kfail. */
int rt_kaxis(RtKctx *k, IrAxis *ax, int *size, RtComm **g);
/* Sparse mixture-of-experts kernels (ops_moe.c), entries of the same table. */
int ref_MOE_COUNTS(RtKctx *k);
int ref_MOE_PERM(RtKctx *k);
int ref_MOE_UNPERM(RtKctx *k);
int ref_MOE_GATE_GRAD(RtKctx *k);
int ref_GMM(RtKctx *k);
int ref_GMM_DW(RtKctx *k);
/* Expert-parallel collectives (ops_a2a.c), entries of the same table. */
int ref_ALL_TO_ALL(RtKctx *k);
int ref_ALL_TO_ALL_V(RtKctx *k);
/* Ring attention steps (ops_ring.c) and the ring transfer (ops_a2a.c). */
int ref_ATTN_ACC(RtKctx *k);
int ref_ATTN_FINISH(RtKctx *k);
int ref_ATTN_LSE(RtKctx *k);
int ref_ATTN_BWD_Q(RtKctx *k);
int ref_ATTN_BWD_KV(RtKctx *k);
int ref_RING_SHIFT(RtKctx *k);
int ref_RING_WAIT(RtKctx *k);
/* Fused attention kernels (ops_attn.c), entries of the same table. */
int ref_ATTENTION(RtKctx *k);
int ref_ATTENTION_BWD(RtKctx *k);

/* Per-program pipeline state (ops_pipe.c): the stash (values kept by
 * `stash` for the backward block, keyed by chunk, micro batch and slot),
 * local hand-offs (send to this rank's own coordinate) and the posted
 * sends with their buffers.  Made on first use; *rt_program_pipe(p) is the
 * program's pointer to it (rt.c frees it with the program). */
/* ring_shift's posted sends awaiting their ring_wait (ops_a2a.c); made on
 * first use, freed with the program. */
typedef struct RtRing RtRing;
RtRing **rt_program_ring(RtProgram *p);
void rt_ring_free(RtRing *r);
typedef struct RtPipe RtPipe;
RtPipe **rt_program_pipe(RtProgram *p);
void rt_pipe_free(RtPipe *s);
/* Waits until every send the program has posted is complete (the peers
 * received them), against the pp group's deadline, and releases their
 * buffers.  0, or -1 with a message. */
int rt_pipe_wait_sends(RtProgram *p, char *err, size_t errlen);
/* The end of a training step, before "update": rt_pipe_wait_sends, then
 * checks that nothing is left over -- a stashed value no backward block
 * read, or a local hand-off nobody received -- naming chunk, micro batch
 * and slot (or tag).  Leftovers are released either way. 0 or -1. */
int rt_pipe_end_step(RtProgram *p, char *err, size_t errlen);

int rt_kfail(RtKctx *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sharding of operand i's value (all zero in an unsharded module). */
static inline const IrSharding *rt_kin_sh(const RtKctx *k, int i) { return &k->b->nodes[k->n->in[i]].sh; }

/* ---- global indices of local elements (docs/sharding.md) ----
 * rt_shard_block: the rank's block index along a dim split by the axes in
 * `mask` (outer axis major: b = (c_a1 * S_a2 + c_a2) * S_a3 + ...); the
 * number of blocks (product of the axis sizes) into *nblk if not NULL.
 * 0 (and 1 block) for mask 0. */
int64_t rt_shard_block(const RtProgram *p, unsigned mask, int64_t *nblk);
/* Per dim of the local type t under sharding sh: the global offset of the
 * rank's block (off[d]) and the global (padded) size (gdim[d]). */
void rt_shard_offsets(const RtProgram *p, const IrSharding *sh, const IrType *t,
                      int64_t off[IR_MAX_RANK], int64_t gdim[IR_MAX_RANK]);
/* The cp level of a split is a zigzag (causal load balancing, cp_layout.c):
 * rt_cp_zigzag: whether a dim split by `mask` is laid out so;
 * rt_global_index: the GLOBAL index of local index j of a dim of local
 * length L split by the axes in mask (contiguous blocks, outer axis major,
 * except the zigzag at the cp level);
 * rt_cp_reorder: x[outer, S*L, inner] between the cp coordinates' blocks
 * in coordinate order (what an all_gather concatenates) and global order
 * (to_global 1), or back (0).  L must be even. */
int rt_cp_zigzag(const RtProgram *p, unsigned mask);
int64_t rt_global_index(const RtProgram *p, unsigned mask, int64_t L, int64_t j);
/* The same as seen by cp coordinate cp_coord (< 0: this rank's): where a
 * block that rank holds sits (ring attention computes with other ranks'
 * key blocks). */
int64_t rt_global_index_at(const RtProgram *p, unsigned mask, int64_t L, int64_t j, int cp_coord);
void rt_cp_reorder(void *dst, const void *src, int64_t outer, int S, int64_t L, int64_t inner, size_t es,
                   int to_global);
/* The rank's group along axis a, or NULL (axis of size 1, or none made). */
RtComm *rt_program_group(const RtProgram *p, IrAxis a);
RtComm *rt_program_dev_group(const RtProgram *p, IrAxis a);   /* RtRank.dev_group */
/* all_to_all_v's two orders of the rows of this rank's experts
 * (ops_a2a.c): `em` expert-major (the expert layout: for local expert q,
 * source 0's rows, then source 1's...) and `sm` source-major (what
 * travels: source s's rows, its experts in order, at the sum of the
 * earlier sources' totals exp[]).  Calls run(ctx, em_row, sm_row, rows)
 * for every nonempty run of rows (rcnt i32[S, G]); stops at the first
 * nonzero return (-1). */
int rt_a2a_regroup(const int32_t *rcnt, const int64_t *exp, int S, int G,
                   int (*run)(void *ctx, int64_t em_row, int64_t sm_row, int64_t rows), void *ctx);
/* All-gather along a middle dim (ops_ref.c): x[outer, L, inner] on each
 * rank of g -> y[outer, size*L, inner], block q from group rank q.  g NULL
 * or of size 1: a copy.  dt f32 or f64. */
int rt_all_gather_dim(RtComm *g, IrDtype dt, const void *x, void *y, int64_t outer, int64_t L,
                      int64_t inner, char *err, size_t errlen);
int rt_program_axis_size(const RtProgram *p, IrAxis a);
/* The module's training seed, for dropout (set by the program). */
uint64_t rt_program_seed(const RtProgram *p);

/* ---- the LLVM backend (exec_jit.c) ----
 * A kernel run at node `at` of its block (a group's last member, or a
 * lone lowerable node): buffer k of fn is value io.in[k] (k < io.nin),
 * then io.out[j] (written). */
typedef struct {
  int at;
  IrOp op;            /* the op at `at` (profiles) */
  CgFn fn;
  int64_t grid, work; /* iterations; elements of the largest buffer */
  CgGroupIO io;
  int nparam;         /* > 0: the kernel reads run-time scalars (dropout: seed, step, micro; kir.h
                         PARAM), passed after its buffers by rt_jit_run */
  int adamw;          /* a multi-tensor AdamW launch over the adamw nodes run[0..nrun): per
                         tensor, buffers coef, grad, {lr, 1-b1^t, 1-b2^t, wd}, then param, m, v
                         (states, updated in place; see exec_jit.c) */
  int *run, nrun;
  int gemm_mm;        /* > 0 (the matmul's id + 1): a GEMM bias epilogue (exec_gemm.c), buffers
                         A, B, bias, then the add's value */
  CgCudaLaunch cl;    /* cuda mode (RtExecOpts.cuda): the printed kernel's launch */
  CgCudaLaunch *cls;  /* cuda mode, adamw: per member j of run[], the launches cls[2j], cls[2j + 1] */
  int64_t *ccnt;      /* ... for element counts ccnt[2j] (full ZeRO chunk or whole tensor), ccnt[2j + 1]
                         (partial chunk; 0: none) (exec_jit.c cuda_adamw_run) */
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
/* The per-run scalars of an AdamW kernel for node n at info's step and lr:
 * lr, 1 - b1^t, 1 - b2^t, wd. */
void rt_jit_adamw_scalars(const IrNode *n, const RtRunInfo *info, double s[4]);
/* The elements of its param adamw node n updates on this rank: all of
 * them, or (ZeRO: flat moments) the rank's chunk [*off, *off + *cnt). */
void rt_jit_adamw_chunk(const RtProgram *p, const IrNode *n, int64_t *off, int64_t *cnt);
/* Runs the multi-tensor AdamW kernel K (K->adamw) of block b: vals[] are
 * the run's value buffers.  0, or -1 with a message. */
int rt_jit_run_adamw(RtJit *j, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void *const *vals,
                     const RtRunInfo *info, char *msg, size_t n);
/* GEMM bias epilogues (exec_gemm.c).  rt_gemm_epilogue_ok: whether the
 * matmul node mm of b is a product the epilogue runs (float, shapes BLAS
 * takes).  rt_gemm_epilogue_run: kernel K (K->gemm_mm) with bufs = A, B,
 * bias, out: out = broadcast(bias) (the reference kernel), then
 * out = A.B + out (one GEMM, or one per batch item, beta = 1).  0 or -1. */
int rt_gemm_epilogue_ok(const IrBlock *b, int mm);
/* The product of matmul node mm as GEMMs: M, N, K, batch (product of a's
 * leading dims) and whether b is one matrix shared by every batch item.
 * 0, or -1 if BLAS cannot take it. */
int rt_gemm_shape(const IrBlock *b, const IrNode *mm, int64_t *M, int64_t *N, int64_t *K, int64_t *batch, int *shared);
int rt_gemm_epilogue_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                         char *msg, size_t n);
/* rt_gemm_epilogue_run, counted in j's stats. */
int rt_jit_run_gemm(RtJit *j, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs,
                    const RtRunInfo *info, char *msg, size_t n);

#endif
