/* rampup.c - Megatron's batch-size ramp-up (--rampup-batch-size START INCR
 * SAMPLES) as the compiler, the verifier and the trainer all need it: the
 * global batch of a step from the samples consumed before it, and the
 * samples consumed before a step.  One place, so mcc's check of the
 * batches, the plan's steps from --train-samples and mrun's per-step
 * micro-batch count cannot disagree.
 *
 * The rule (Megatron's RampupBatchsizeNumMicroBatchesCalculator): the
 * global batch grows from START by INCR, (GBS - START) / INCR times,
 * evenly over the first SAMPLES samples:
 *   batch(consumed) = GBS                                      if consumed > SAMPLES
 *                   = START + INCR * floor(consumed / (SAMPLES / n))   else,
 *   n = (GBS - START) / INCR increments (n = 0: always GBS). */
#include "ir.h"
#include <math.h>

int ir_train_rampup(const IrTrain *t) { return t->rampup_start > 0; }

int64_t ir_train_batch_at(const IrTrain *t, int64_t consumed) {
  if (!ir_train_rampup(t) || consumed > t->rampup_samples) return t->global_batch;
  int64_t n = t->rampup_incr > 0 ? (t->global_batch - t->rampup_start) / t->rampup_incr : 0;
  if (n <= 0) return t->global_batch;
  double per = (double)t->rampup_samples / (double)n;   /* samples per increment */
  int64_t k = per > 0 ? (int64_t)floor((double)consumed / per) : n;
  int64_t b = t->rampup_start + (k < n ? k : n) * t->rampup_incr;
  return b < t->global_batch ? b : t->global_batch;
}

/* Whether the ramp's step starting at consumed c runs batch b. */
static int ramp_step_at(const IrTrain *t, int64_t c, int64_t b) {
  return c <= t->rampup_samples && ir_train_batch_at(t, c) == b;
}

int64_t ir_train_samples_after(const IrTrain *t, int64_t c0, int64_t nsteps) {
  if (!ir_train_rampup(t)) return c0 + nsteps * t->global_batch;
  /* Step by step: c += batch_at(c) while in the ramp.  The trainer asks for
   * every step (and its prefetch for every micro batch), and a ramp of
   * Megatron's size is ~10^5 steps long, so the steps of one batch size are
   * taken together: batch_at is non-decreasing, so the steps that still
   * run batch b from c are a prefix, found by doubling and bisection:
   * O(increments x log steps) instead of O(steps). */
  int64_t c = c0, s = 0;
  while (s < nsteps && c <= t->rampup_samples) {
    int64_t b = ir_train_batch_at(t, c), lo = 1, hi = 1, cap = nsteps - s;   /* steps [c, c + lo b) run b */
    while (hi < cap && ramp_step_at(t, c + hi * b, b)) {
      lo = hi + 1;
      hi = hi * 2 < cap ? hi * 2 : cap;
    }
    if (hi >= cap && ramp_step_at(t, c + (cap - 1) * b, b)) lo = cap;
    else
      while (lo < hi) {   /* invariant: steps < lo run b, step hi does not (or hi == cap) */
        int64_t mid = lo + (hi - lo) / 2;
        if (ramp_step_at(t, c + mid * b, b)) lo = mid + 1;
        else hi = mid;
      }
    c += lo * b;
    s += lo;
  }
  return c + (nsteps - s) * t->global_batch;   /* past the ramp: whole batches */
}

int64_t ir_train_samples_before(const IrTrain *t, int64_t step) { return ir_train_samples_after(t, 0, step); }

int64_t ir_train_steps_for_samples(const IrTrain *t, int64_t samples) {
  /* Megatron's update_train_iters: the ramp's steps while consumed <=
   * SAMPLES (and <= samples), then whole global batches (a partial last
   * batch is dropped) */
  int64_t c = 0, s = 0;
  while (ir_train_rampup(t) && c <= t->rampup_samples && c <= samples) {
    c += ir_train_batch_at(t, c);
    s++;
  }
  if (samples > c) s += (samples - c) / t->global_batch;
  return s;
}

int ir_train_rampup_check(const IrTrain *t, int64_t unit, char *err, size_t errlen) {
  if (!ir_train_rampup(t)) return 0;
  const char *flag = "--rampup-batch-size";
  if (t->rampup_incr < 1 || t->rampup_samples < 0)
    return ts_errf(err, errlen, "%s %lld %lld %lld: the increment must be >= 1 and the ramp's samples >= 0", flag,
                   (long long)t->rampup_start, (long long)t->rampup_incr, (long long)t->rampup_samples);
  if (t->rampup_start > t->global_batch || (t->global_batch - t->rampup_start) % t->rampup_incr != 0)
    return ts_errf(err, errlen, "%s %lld %lld %lld: the global batch %lld must be the start plus a whole number of "
                   "increments (start <= %lld and %lld - start divisible by %lld)", flag, (long long)t->rampup_start,
                   (long long)t->rampup_incr, (long long)t->rampup_samples, (long long)t->global_batch,
                   (long long)t->global_batch, (long long)t->global_batch, (long long)t->rampup_incr);
  /* every batch of the ramp (START + k INCR) must be whole micro batches on every dp rank */
  for (int64_t b = t->rampup_start; b <= t->global_batch; b += t->rampup_incr)
    if (b % unit != 0)
      return ts_errf(err, errlen, "%s %lld %lld %lld: the ramp's global batch %lld is not a multiple of micro_batch "
                     "%lld x dp %lld = %lld (each dp rank runs whole micro batches); give a start and an increment "
                     "that are multiples of %lld", flag, (long long)t->rampup_start, (long long)t->rampup_incr,
                     (long long)t->rampup_samples, (long long)b, (long long)t->micro_batch,
                     (long long)(unit / (t->micro_batch > 0 ? t->micro_batch : 1)), (long long)unit, (long long)unit);
  return 0;
}
