/* memplan.h - static memory planning: an ANALYSIS over a pipeline-final
 * IrModule (it never changes the IR).  The runtime (runtime/exec/rt.c) runs
 * every block in ONE arena at the offsets planned here, so the numbers of
 * `mcc --report memory` are what mrun allocates, byte for byte.
 *
 * Per block: the liveness of every value buffer, then one arena holding all
 * of them at 64-byte aligned offsets, packed greedily (best fit, biggest
 * buffer first, over the interval graph - ggml's allocator, llm.c's single
 * allocation), a checker that no two simultaneously live buffers overlap,
 * and the peak next to its lower bound.  The executor plans every block
 * with this code when it makes a program, for the positions its backend
 * runs the nodes at (which mrun decides: --backend, the device, kernels
 * that fall back), and mcc's memory report (passes/memreport.h) calls the
 * runtime's own positions, so the two are the same plan.
 *
 * The plan models how the executor runs the block, given as at[]: node i
 * is computed at position at[i] >= i.  The reference backend runs every
 * node at its own position (at = NULL).  The LLVM backend runs a fusion
 * group as one kernel at its LAST member: its members have at[] = that
 * member (plan_mem_group_at), a value read by the kernel counts as
 * read there, and reads between members of one kernel are not reads of a
 * buffer.
 *
 * Which values own a buffer:
 *   - STATE nodes alias the state slab and effects (accum, zero, adamw,
 *     stash, output, ...) have no result: no buffer.
 *   - a member of a kernel that is not its last member owns one only if a
 *     node outside the kernel reads it (ir_value_materialized); the last
 *     member always does (the kernel writes it).
 *   - INPUT owns one: the runtime copies the caller's feed into its arena
 *     (so the arena is all a block's values, and a feed need only live
 *     until its INPUT node has run).
 *   - RESHAPE run on its own (not inside a kernel) shares its operand's
 *     buffer when the operand owns one (same bytes, row-major, and kernels
 *     never write their operands, so no copy is needed): the shared buffer
 *     is live from the first value's position to the last use of any of
 *     them.  A reshape inside a kernel gets a buffer of its own.
 *   - RESHAPE run on its own of a state (or of such a reshape) is a VIEW of
 *     the state slab when no effect of the block writes that state (a
 *     parameter in the micro block): no buffer, the executor points it at
 *     the state's bytes.  Of a state the block writes (a gradient being
 *     accumulated) it gets a buffer of its own: the copy keeps the value
 *     read, whatever the effects do later.
 *   - every other value owns ceil64(numel * dtype size) bytes (64 at
 *     least, as the runtime allocates), live from the position that makes
 *     it to its last use, both ends included: a node's result never shares
 *     bytes with its operands, because kernels are not in-place.
 *   - a buffer handed over by the pipeline lives OUTSIDE the arena (ext):
 *     the buffer of a value that exactly one `stash` reads (the stash
 *     keeps the buffer itself until the backward block unstashes it), and
 *     the result of an `unstash` (that same buffer, handed back; released
 *     after its last reader).  The runtime takes these from its pipeline
 *     pool, so nothing is copied into or out of the stash; the plan keeps
 *     their size and live interval but gives them no offset, and they
 *     count in no arena figure (peak, lower bound, total).
 *     `mcc --report memory` counts them in the stash rows. */
#ifndef TS_PLAN_MEMPLAN_H
#define TS_PLAN_MEMPLAN_H
#include "ir/ir.h"

#define MEMPLAN_ALIGN 64

typedef struct {
  int block;                 /* block index in the module */
  int n;                     /* nodes in the block */
  int *at;                   /* per node: the position it is computed at (a copy of the
                                caller's at[]), or NULL: every node at its own */
  /* per node (value id), all of length n: */
  int64_t *offset;           /* byte offset of the value's buffer in the arena; -1 = no buffer */
  size_t *size;              /* bytes of that buffer (64-aligned); 0 = no buffer */
  int *buf;                  /* buffer id (the value that owns it; a reshape that aliases
                                names its operand's owner); -1 = no buffer */
  unsigned char *view;       /* per node: 1 = a view of the state slab (no buffer; see above) */
  unsigned char *ext;        /* per node: 1 = its buffer is handed over by the pipeline, outside
                                the arena (offset -1; see above) */
  int *first, *last;         /* live interval [first, last] (positions, inclusive) of the
                                value's buffer - the same for every value sharing it; -1 = none */
  int nbuffers;              /* distinct buffers (owners) in the arena */
  int next;                  /* buffers outside it (ext owners) */
  size_t ext_bytes;          /* their bytes (64-aligned), summed */
  size_t peak_bytes;         /* arena size: max over buffers of offset + size */
  size_t lower_bound_bytes;  /* max over nodes of the sum of live buffer sizes */
  size_t total_bytes;        /* sum of all buffer sizes (no reuse at all) */
} MemPlan;

/* Liveness + offset assignment for block `block` of m, every node run at
 * its own position (the reference backend).  0 on success; -1 with a
 * message (bad block index, a type with no byte size).  On success *out
 * owns heap arrays: release them with plan_mem_free. */
int plan_mem_block(const IrModule *m, int block, MemPlan *out, char *err, size_t errlen);
/* The same for an executor that computes node i at position at[i] (n
 * entries; at[i] >= i, and at[at[i]] == at[i]: a kernel runs at one of its
 * members, the last).  at NULL: plan_mem_block.  -1 with a message
 * for an at[] that breaks those rules. */
int plan_mem_block_at(const IrModule *m, int block, const int *at, MemPlan *out, char *err, size_t errlen);
/* at[] (b->n entries) of the LLVM backend on block b: every fusion group
 * (IrNode.group > 0) one kernel at its last member, every run of optimizer
 * steps one multi-tensor launch at its last step (plan_opt_runs), the
 * parts of one attention's backward at the last part
 * (plan_attn_grad_runs), a gradient's producer and reshapes at the accum
 * that adds it straight into its state (plan_accum_direct_runs), other
 * nodes alone.
 * This is what the executor does when every group lowers, which the fuse
 * pass guarantees (it asks the lowering). */
void plan_mem_group_at(const IrBlock *b, int *at);
void plan_mem_free(MemPlan *p);

/* Validity of p as a plan for its block of m.  Liveness is recomputed
 * from the IR and p->at, not trusted: every value that needs bytes has a buffer big
 * enough, whose interval covers its node and all its readers; every buffer
 * is 64-byte aligned and inside [0, peak_bytes); no two buffers whose
 * intervals intersect share a byte; peak and bounds add up.
 * 0 = valid; -1 with the first violation in err. */
int plan_mem_check(const IrModule *m, const MemPlan *p, char *err, size_t errlen);

/* plan_mem_block_at, then plan_mem_check of the result (freed when it
 * fails): what the executor allocates.  0, or -1 with a message. */
int plan_mem_block_checked(const IrModule *m, int block, const int *at, MemPlan *out, char *err, size_t errlen);

/* Byte totals of the states of one kind (parameters, gradients, ...):
 * the exact numel * dtype size, summed (no slab alignment).  Under ZeRO-3
 * a parameter counts as its shard state (IR_STATE_SHARD), its description
 * as nothing (ir_state_bytes). */
size_t plan_mem_state_bytes(const IrModule *m, IrStateKind kind);

/* The bytes of the runtime's state slab for m: every state at a 64-byte
 * aligned offset (what rt_program_slab_bytes measures). */
size_t plan_mem_slab_bytes(const IrModule *m);

/* The activation arena the runtime allocates for m: the largest block
 * peak, blocks planned as the LLVM backend runs them (fused = 1: groups as
 * kernels) or as the reference does (fused = 0).  -1 with a message. */
int plan_mem_arena_bytes(const IrModule *m, int fused, size_t *out, char *err, size_t errlen);

#endif
