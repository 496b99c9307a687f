/* par.h - a small fixed pool of worker threads for the reference kernels
 * (ops_ref.c) and anything else in runtime/ that splits a loop.
 *
 * rt_par_for(n, grain, fn, ctx) runs fn(ctx, lo, hi) over contiguous,
 * disjoint ranges covering [0, n), on up to rt_par_threads() threads (the
 * caller is one of them) and returns when all are done.  Ranges are fixed
 * by n and the thread count only, never by timing, and no kernel reduces
 * across ranges with atomics, so a result never depends on scheduling.
 * Kernels whose ranges sum something (sumsq) split into fixed-size blocks
 * instead, so their result does not depend on the thread count either.
 *
 * Thread count: TS_NUM_THREADS, else TS_THREADS (what the LLVM backend's
 * kernel pool reads too), else OMP_NUM_THREADS, else
 * OPENBLAS_NUM_THREADS, else the online cores divided by the job's ranks
 * on this machine (Open MPI's / MPICH's local size; at most RT_PAR_MAX).
 * mrun sets OPENBLAS_NUM_THREADS=1 when it starts several ranks on one
 * machine; under an outside mpirun with none of the variables set, the
 * first rt_par_threads() also limits OpenBLAS to the rank's share, so
 * ranks never oversubscribe the cores.  A call made while the pool is
 * busy (another thread's kernel, or a nested call) runs serially. */
#ifndef TS_RT_PAR_H
#define TS_RT_PAR_H
#include <stdint.h>
#include <stddef.h>

#define RT_PAR_MAX 64

typedef void (*RtParFn)(void *ctx, int64_t lo, int64_t hi);

/* Runs fn over [0, n) in ranges of at least `grain` items (a range per
 * thread; serial when n < 2 * grain or one thread). */
void rt_par_for(int64_t n, int64_t grain, RtParFn fn, void *ctx);
/* The pool's thread count (>= 1), counting the caller. */
int rt_par_threads(void);
/* Sets the thread count (tests, benchmarks); n <= 0 restores the default
 * from the environment.  Not to be called while a kernel runs. */
void rt_par_set_threads(int n);
/* Copies and fills are bound by memory, which one core nearly saturates:
 * measured on the shared 2-core machine, a 12 MiB memcpy took 1 ms on one
 * thread and 5 ms split over two (the second thread waits for a core).
 * Only very large ones are split. */
#define RT_PAR_MEM_MIN ((size_t)64 << 20)
/* memcpy split over the threads when it is at least RT_PAR_MEM_MIN. */
void rt_par_memcpy(void *dst, const void *src, size_t bytes);
/* memset split over the threads when it is at least RT_PAR_MEM_MIN. */
void rt_par_memset(void *dst, int c, size_t bytes);
/* Runs fn with BLAS limited to one thread (restored after): for loops that
 * run many small GEMMs in parallel, one per pool thread. */
void rt_par_blas_serial(RtParFn fn, void *ctx, int64_t n, int64_t grain);

/* Scratch memory kept between calls: slot `slot` (0 .. RT_SCRATCH_SLOTS-1)
 * of the calling thread, at least `bytes` long, contents undefined, valid
 * until the thread's next rt_scratch or rt_scratch_done of that slot.  For
 * temporaries made on every call (the f32 operand copies of a 16-bit
 * GEMM): a fresh malloc of some MiB is an mmap, a page fault per 4 KiB and
 * a munmap each time (a tenth of a bf16 step on the tiny gpt).
 * rt_scratch_done(slot) after the use frees a buffer larger than
 * RT_SCRATCH_KEEP (GPT-2's f32 logits of 4096 tokens, 823 MB, would
 * otherwise stay resident; at that size the faults cost a few percent of
 * the GEMM).  The rest is freed when the thread exits. */
#define RT_SCRATCH_SLOTS 4
#define RT_SCRATCH_KEEP ((size_t)256 << 20)
void *rt_scratch(int slot, size_t bytes);
void rt_scratch_done(int slot);

/* NAME_SUF: the float and double instances of a kernel written once and
 * included twice (ops_ref_t.h, attn_t.h). */
#define RT_CAT_(a, b) a##_##b
#define RT_CAT(a, b) RT_CAT_(a, b)

#endif
