/* test_rampup.c - ir/rampup.c's samples-before-a-step, which takes the
 * ramp's steps of one batch size together, equals the step-by-step rule
 * (c += batch_at(c) while in the ramp, then whole global batches) for
 * every step of ramps of many shapes, from 0 and from any consumed count
 * (a resumed run's), and answers a ramp of Megatron's
 * size (GPT-3's 32 -> 1536 over 65M samples: ~2x10^5 ramp steps) without
 * walking it. */
#include "ir/ir.h"
#include "../check.h"
#include <time.h>

static int64_t naive_from(const IrTrain *t, int64_t c, int64_t step) {
  if (!ir_train_rampup(t)) return c + step * t->global_batch;
  int64_t s = 0;
  for (; s < step && c <= t->rampup_samples; s++) c += ir_train_batch_at(t, c);
  return c + (step - s) * t->global_batch;
}
static int64_t naive(const IrTrain *t, int64_t step) { return naive_from(t, 0, step); }

int main(void) {
  static const int64_t ramps[][4] = {   /* start incr samples global_batch */
      {2, 2, 16, 8},  {1, 1, 0, 4},   {3, 1, 7, 3},    {4, 4, 100, 64}, {1, 3, 1000, 31},
      {8, 8, 64, 8},  {5, 2, 11, 13}, {2, 2, 15, 10},  {1, 1, 1, 2},    {16, 16, 4096, 512},
  };
  int nr = (int)(sizeof ramps / sizeof ramps[0]);
  for (int r = 0; r < nr; r++) {
    IrTrain t = {0};
    t.rampup_start = ramps[r][0];
    t.rampup_incr = ramps[r][1];
    t.rampup_samples = ramps[r][2];
    t.global_batch = ramps[r][3];
    int bad = 0;
    for (int64_t s = 0; s <= 400 && !bad; s++) {
      int64_t want = naive(&t, s), got = ir_train_samples_before(&t, s);
      if (got != want) bad = 1;
      CHECK(got == want, "ramp %lld %lld %lld to %lld: step %lld: %lld samples before it, the rule gives %lld",
            (long long)ramps[r][0], (long long)ramps[r][1], (long long)ramps[r][2], (long long)ramps[r][3],
            (long long)s, (long long)got, (long long)want);
    }
    /* from any consumed count (a run resumed from a checkpoint written
     * with other batches goes on from the samples it records) */
    for (int64_t c0 = 0; c0 <= 2 * ramps[r][2] + 3 && !bad; c0++)
      for (int64_t s = 0; s <= 40 && !bad; s++) {
        int64_t want = naive_from(&t, c0, s), got = ir_train_samples_after(&t, c0, s);
        if (got != want) bad = 1;
        CHECK(got == want, "ramp %lld %lld %lld to %lld: %lld steps after %lld samples: %lld, the rule gives %lld",
              (long long)ramps[r][0], (long long)ramps[r][1], (long long)ramps[r][2], (long long)ramps[r][3],
              (long long)s, (long long)c0, (long long)got, (long long)want);
      }
  }
  /* GPT-3's ramp (Brown et al. 2020, Megatron's --rampup-batch-size 32 32 65324160, global batch 1536) */
  IrTrain g = {0};
  g.rampup_start = 32, g.rampup_incr = 32, g.rampup_samples = 65324160, g.global_batch = 1536;
  int64_t steps = ir_train_steps_for_samples(&g, 65324160) + 10;
  CHECK(steps > 100000, "GPT-3's ramp has %lld steps", (long long)steps);
  for (int64_t s = 0; s < steps; s += steps / 97 + 1)
    CHECK(ir_train_samples_before(&g, s) == naive(&g, s), "GPT-3's ramp, step %lld", (long long)s);
  clock_t t0 = clock();
  int64_t sum = 0;
  for (int64_t s = 0; s < 20000; s++) sum += ir_train_samples_before(&g, steps - 1 - s % 1000);
  double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
  printf("GPT-3's ramp: %lld steps; 20000 lookups near its end in %.3f s (checksum %lld)\n", (long long)steps, sec,
         (long long)sum);
  return check_exit("test_rampup");
}
