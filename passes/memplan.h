/* memplan.h - static memory planning: an ANALYSIS over a pipeline-final
 * IrModule (it never changes the IR; nothing in the plan uses it yet).
 *
 * Per block: the liveness of every value buffer, then one arena holding all
 * of them at 64-byte aligned offsets, packed greedily (best fit, biggest
 * buffer first, over the interval graph - ggml's allocator, llm.c's single
 * allocation), a checker that no two simultaneously live buffers overlap,
 * and the peak next to its lower bound.  Also the per-rank memory report of
 * `mcc --report memory` (states + activation arenas, per group of ranks).
 *
 * Which values own a buffer:
 *   - STATE nodes alias the state slab and effects (accum, zero, adamw,
 *     output) have no result: no buffer.
 *   - INPUT owns one: a compiled runtime copies the micro-batch into its
 *     arena (the reference runtime aliases the caller's feed instead).
 *   - RESHAPE shares its operand's buffer when the operand owns one and
 *     this reshape is the operand's last use (same bytes, row-major, so
 *     no copy); otherwise it gets a buffer of its own.  A shared buffer is
 *     live from the first value's node to the last use of the last one.
 *   - every other value owns ceil64(numel * dtype size) bytes (64 at
 *     least, as the runtime allocates), live from the node that makes it
 *     to its last use, both ends included: a node's result never shares
 *     bytes with its operands, because kernels are not in-place. */
#ifndef TS_MEMPLAN_H
#define TS_MEMPLAN_H
#include "passes.h"

#define MEMPLAN_ALIGN 64

typedef struct {
  int block;                 /* block index in the module */
  int n;                     /* nodes in the block */
  /* per node (value id), all of length n: */
  int64_t *offset;           /* byte offset of the value's buffer in the arena; -1 = no buffer */
  size_t *size;              /* bytes of that buffer (64-aligned); 0 = no buffer */
  int *buf;                  /* buffer id (the value that owns it; a reshape that aliases
                                names its operand's owner); -1 = no buffer */
  int *first, *last;         /* live interval [first, last] (node indices, inclusive) of the
                                value's buffer - the same for every value sharing it; -1 = none */
  int nbuffers;              /* distinct buffers (owners) */
  size_t peak_bytes;         /* arena size: max over buffers of offset + size */
  size_t lower_bound_bytes;  /* max over nodes of the sum of live buffer sizes */
  size_t total_bytes;        /* sum of all buffer sizes (no reuse at all) */
} MemPlan;

/* Liveness + offset assignment for block `block` of m.  0 on success; -1
 * with a message (bad block index, a type with no byte size).  On success
 * *out owns heap arrays: release them with pass_memplan_free. */
int pass_memplan_block(const IrModule *m, int block, MemPlan *out, char *err, size_t errlen);
void pass_memplan_free(MemPlan *p);

/* Validity of p as a plan for its block of m.  Liveness is recomputed
 * from the IR, not trusted: every value that needs bytes has a buffer big
 * enough, whose interval covers its node and all its readers; every buffer
 * is 64-byte aligned and inside [0, peak_bytes); no two buffers whose
 * intervals intersect share a byte; peak and bounds add up.
 * 0 = valid; -1 with the first violation in err. */
int pass_memplan_check(const IrModule *m, const MemPlan *p, char *err, size_t errlen);

/* Byte totals of the states of one kind (parameters, gradients, ...):
 * the exact numel * dtype size, summed (no slab alignment). */
size_t pass_memplan_state_bytes(const IrModule *m, IrStateKind kind);

/* The text of `mcc --report memory` for m (one rank): states by kind,
 * each block's packed arena peak and lower bound, and the total, in bytes
 * and MiB.  0, or -1 with a message (then out holds a partial report). */
int pass_memplan_report(const IrModule *m, StrBuf *out, char *err, size_t errlen);

/* The report of a plan's ranks: rank r runs programs[rank_program[r]]
 * (each a sharded module, all types LOCAL).  One section per program,
 * headed by the set of ranks running it ("ranks 0-3 (each):"), with the
 * rows of pass_memplan_report; then, when `unsharded` is not NULL (the
 * same model compiled for one rank), its rows for comparison.  0, or -1
 * with a message. */
int pass_memplan_report_ranks(IrModule *const *programs, int nprograms, const int *rank_program, int nranks,
                              const IrModule *unsharded, StrBuf *out, char *err, size_t errlen);

#endif
