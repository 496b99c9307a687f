/* selftest.h - `mrun --selftest`: every kind of device kernel, and a tiny
 * training step, run on a device against the CPU backend (selftest.c;
 * docs/cuda.md, "The self-test").
 *
 * Each kernel kind (elementwise chain, softmax, norms, cross-entropy,
 * reductions, GEMMs, attention, embedding, rope, AdamW, layout copies ...)
 * is one block of a small module written in IR text, in f32 and in f64.
 * Its inputs are parameter states (initialized identically on both sides,
 * counter-based) and i32 feeds; its results are `accum`ulated into states.
 * One run of the block on the LLVM backend and one on the device, then
 * every state of the kind is compared: max over elements of
 * |dev - cpu| / max(|cpu|, 1e-3), against 1e-5 (f32) or 1e-10 (f64).  The
 * training step compiles samples/gpt.mdl at toy size in-process and trains
 * it 2 steps with rt_train on both; losses and parameters are compared
 * (rt_params_max_rel_diff) against the same limits. */
#ifndef TS_RT_SELFTEST_H
#define TS_RT_SELFTEST_H
#include <stddef.h>
#include <stdio.h>

typedef struct RtDev RtDev;

/* Runs the self-test on dev and prints its table to out (one row per kind
 * and dtype: max relative error, limit, device milliseconds per run of the
 * block, pass / FAIL; a FAIL row is followed by a line saying where or
 * why).  *failures gets the number of FAIL rows.  A kind whose op has no
 * CUDA kernel yet (the device program is refused with "no CUDA kernel")
 * prints "no kernel" and is not a failure: mcc --target refuses plans
 * using it, so no device runs it.  0 when the test ran (whatever it
 * found), -1 with a message when it could not (no temporary directory).
 * Leaves the executor's default options (rt_exec_set_default) as found. */
int rt_selftest(RtDev *dev, FILE *out, int *failures, char *err, size_t errlen);

#endif
