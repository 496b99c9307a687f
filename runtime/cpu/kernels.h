/* kernels.h - the CPU kernels: what the executor (runtime/exec) calls to
 * compute a node on host memory.  One reference kernel per op (ops_ref.c
 * and the ops_*.c it names), in plain C over f32 / f64 with GEMMs through
 * BLAS: the oracle every other backend is tested against.  Also the
 * counter-based random numbers, the global indices of sharded tensors,
 * and the per-program state of the pipeline and ring kernels.
 *
 * May use: ir/, plan/ (the mesh), runtime/comm (the collectives of the
 * reference kernels).  Never the executor: what a kernel knows of its
 * program is RtKenv, which the executor fills. */
#ifndef TS_RT_KERNELS_H
#define TS_RT_KERNELS_H
#include "ir/ir.h"
#include "runtime/comm/comm.h"

/* Per-run facts that ops read: step and micro-batch (dropout masks), lr. */
/* last: this run is the step's last micro batch (its backward issues the
 * overlapped dp gradient reductions, runtime/exec; docs/sharding.md). */
typedef struct { int64_t step; int micro; double lr; int last; } RtRunInfo;

typedef struct RtPipe RtPipe;
typedef struct RtRing RtRing;
/* What a kernel may know of the program it runs in: its module (the
 * training seed is m->train.seed), where the rank sits in the mesh
 * (coordinates, groups), the host state slab (state s at slab + off[s]),
 * and the state the pipeline and ring kernels keep between nodes (made on
 * first use; the executor frees them with rt_pipe_free / rt_ring_free). */
typedef struct RtKenv {
  const IrModule *m;
  const RtRank *rank;
  unsigned char *slab;
  const size_t *off;
  RtPipe *pipe;
  RtRing *ring;
} RtKenv;
/* The host bytes of state s (NULL out of range). */
static inline void *rt_kenv_state(const RtKenv *e, int s) {
  return s >= 0 && s < e->m->states.n ? e->slab + e->off[s] : NULL;
}

/* ---- counter-based random numbers (rng.c; formulas in its header) ---- */
enum { RT_RNG_INIT = 1, RT_RNG_DROPOUT = 2, RT_RNG_DATA = 3 };  /* domain tags */
static inline uint64_t rt_mix64(uint64_t z) {            /* splitmix64 finalizer */
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rt_hash_words(const uint64_t *w, int n);         /* chained mix over words */
static inline double rt_u01(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }  /* [0, 1) */
uint64_t rt_name_hash(const char *name);                  /* FNV-1a of the name */
/* The initial value of element i of a parameter (name hash nh) under seed. */
double rt_init_value(const IrState *s, uint64_t seed, uint64_t nh, int64_t i);
/* The same with the parameter's part of the hash chain computed once
 * (rt_init_at(&c, i) == rt_init_value(s, seed, nh, i), bit for bit): a
 * normal element costs 3 mixes instead of 10. */
typedef struct { const IrState *s; uint64_t prefix; } RtInit;
RtInit rt_init_begin(const IrState *s, uint64_t seed, uint64_t nh);
double rt_init_at(const RtInit *c, int64_t i);
/* Dropout's uniform draw for element i. */
double rt_dropout_u(uint64_t seed, int64_t stream, int64_t step, int micro, int64_t i);

/* ---- kernels ----
 * One call computes one node.  in[k] / it[k] are operand k's data and type
 * (contiguous, row-major), out / ot the result's (NULL / void for effects).
 * A kernel returns 0, or -1 after writing a message into err (the executor
 * prefixes the block and node). */
typedef struct RtKctx {
  RtKenv *env;              /* the program the node runs in (kernels.h, RtKenv) */
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
/* n elements of dtype from at src -> dtype to at dst, as ref_CAST converts
 * them (16-bit: runtime/cpu/half.h, rounding to nearest even). */
void rt_convert(void *dst, IrDtype to, const void *src, IrDtype from, int64_t n);
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
/* Generation kernels (ops_decode.c; pass decode), entries of the same table. */
int ref_KV_WRITE(RtKctx *k);
int ref_ATTN_CACHED(RtKctx *k);
int ref_SLICE_AT(RtKctx *k);
/* Fused attention kernels (ops_attn.c), entries of the same table. */
int ref_ATTENTION(RtKctx *k);
/* embedding_bwd's scatter-add into k->out as it is (a gradient state),
 * without zeroing it first: the LLVM backend's accum of an embedding
 * gradient (plan_accum_direct_runs). */
int rt_embedding_bwd_add(RtKctx *k);
int ref_ATTENTION_BWD(RtKctx *k);
/* The whole backward of the attention whose attention_bwd node k runs
 * (operands q, k, v, o, do): out[0], out[1], out[2] receive dq, dk, dv,
 * each NULL where not wanted, else a buffer shaped like q, k or v; out[3]
 * dbias (part 3, shaped like the score bias; NULL: none).  One
 * pass over the tiles for all of them; each result equals the reference's
 * for that part alone, bit for bit.  0, or -1 after rt_kfail. */
int rt_attn_grads_run(RtKctx *k, void *out[4]);
/* The attention tile loops are built for the baseline x86-64 ISA and for
 * x86-64-v3 (AVX2; ops_attn.c), the same operations in the same order, so
 * the same bits.  By default the CPU picks (isa 0); 1 forces the baseline,
 * 2 the AVX2 build where the CPU has it (tests run both).  Returns the one
 * in use now: 1 or 2.  Not to be called while a kernel runs. */
int rt_attn_set_isa(int isa);

/* Per-program pipeline state (ops_pipe.c): the stash (values kept by
 * `stash` for the backward block, keyed by chunk, micro batch and slot),
 * local hand-offs (send to this rank's own coordinate) and the posted
 * sends with their buffers.  Made on first use in RtKenv.pipe; freed with
 * rt_pipe_free. */
void rt_pipe_free(RtPipe *s);
/* A buffer of the pipeline's pool for a value of `bytes` bytes (64-byte
 * multiple, as the memory plan sizes buffers), and its return: the
 * buffers the memory plan hands over (memplan.h, ext) come from here. */
void *rt_kenv_pipe_buf(RtKenv *env, size_t bytes);
void rt_kenv_pipe_unbuf(RtKenv *env, void *buf, size_t bytes);
/* The stash node k keeps buf, the buffer of its operand (from
 * rt_kenv_pipe_buf), instead of a copy: from now on the buffer is the
 * stash's.  0, or -1 after rt_kfail. */
int rt_stash_keep(RtKctx *k, void *buf);
/* Megatron's DynamicGradScaler.update on st = {scale, good steps, hysteresis
 * left, skipped steps} (op scale_update; docs/precision.md): found: the
 * step had an inf/NaN gradient on some rank.  dynamic = 0: only the
 * skipped count changes. */
/* --fp8's delayed scaling (op fp8_scale): hist[len] rolls (hist[0] = amax);
 * a = max(hist) or (most_recent) amax; a finite and > 0: *scale = fmax / a /
 * 2^margin, *sinv = 1 / *scale; else both kept (Transformer Engine). */
void rt_fp8_scale(float *hist, int64_t len, float amax, int most_recent, double margin, double fmax, float *scale,
                  float *sinv);
void rt_scale_update(double st[4], int found, int64_t window, int64_t hysteresis, int dynamic, double min_scale);
/* The unstash node k takes the stashed buffer itself as its result
 * (*buf; the caller returns it with rt_kenv_pipe_unbuf).  0, or -1 after
 * rt_kfail. */
int rt_unstash_take(RtKctx *k, void **buf);
/* Waits until every send env's program has posted is complete (the peers
 * received them), against the pp group's deadline, and releases their
 * buffers.  0, or -1 with a message. */
int rt_kenv_pipe_wait_sends(RtKenv *env, char *err, size_t errlen);
/* The end of a training step, before "update" (host memory):
 * rt_kenv_pipe_wait_sends, then checks that nothing is left over -- a
 * stashed value no backward block read, or a local hand-off nobody
 * received -- naming chunk, micro batch and slot (or tag).  Leftovers are
 * released either way. 0 or -1. */
int rt_kenv_pipe_end_step(RtKenv *env, char *err, size_t errlen);
/* ring_shift's posted sends awaiting their ring_wait (ops_a2a.c); made on
 * first use in RtKenv.ring, freed with rt_ring_free. */
void rt_ring_free(RtRing *r);

int rt_kfail(RtKctx *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The sharding of operand i's value (all zero in an unsharded module). */
static inline const IrSharding *rt_kin_sh(const RtKctx *k, int i) { return &k->b->nodes[k->n->in[i]].sh; }

/* ---- global indices of local elements (docs/sharding.md) ----
 * rt_shard_block: the rank's block index along a dim split by the axes in
 * `mask` (outer axis major: b = (c_a1 * S_a2 + c_a2) * S_a3 + ...); the
 * number of blocks (product of the axis sizes) into *nblk if not NULL.
 * 0 (and 1 block) for mask 0. */
int64_t rt_shard_block(const RtRank *r, unsigned mask, int64_t *nblk);
/* Per dim of the local type t under sharding sh: the global offset of the
 * rank's block (off[d]) and the global (padded) size (gdim[d]). */
void rt_shard_offsets(const RtRank *r, const IrSharding *sh, const IrType *t,
                      int64_t off[IR_MAX_RANK], int64_t gdim[IR_MAX_RANK]);
/* The cp level of a split is a zigzag (causal load balancing, cp_layout.c):
 * rt_cp_zigzag: whether a dim split by `mask` is laid out so;
 * rt_global_index: the GLOBAL index of local index j of a dim of local
 * length L split by the axes in mask (contiguous blocks, outer axis major,
 * except the zigzag at the cp level; with IR_SPLIT_CP_MINOR the cp level is
 * contiguous and innermost);
 * rt_cp_reorder: x[outer, S*L, inner] between the cp coordinates' blocks
 * in coordinate order (what an all_gather concatenates) and global order
 * (to_global 1), or back (0).  L must be even. */
int rt_cp_zigzag(const RtRank *r, unsigned mask);
int64_t rt_global_index(const RtRank *r, unsigned mask, int64_t L, int64_t j);
/* The same as seen by cp coordinate cp_coord (< 0: this rank's): where a
 * block that rank holds sits (ring attention computes with other ranks'
 * key blocks). */
int64_t rt_global_index_at(const RtRank *r, unsigned mask, int64_t L, int64_t j, int cp_coord);
void rt_cp_reorder(void *dst, const void *src, int64_t outer, int S, int64_t L, int64_t inner, size_t es,
                   int to_global);
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

#endif
