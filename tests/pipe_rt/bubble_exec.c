/* bubble_exec.c - the bubble of the schedule mrun actually ran.
 *   bubble_exec PREFIX KIND PP VPP NMICRO
 * reads PREFIX.<r> for every pipeline rank r: the steps rank r ran in the
 * first step of training, in order, one "F|B micro chunk" per line (the
 * trainer writes them under TS_PIPE_TRACE).  Rebuilds the schedule from
 * them, checks it across ranks (plan_pipe_check: every F and B once, sends
 * matched, no deadlock), simulates it with forward 1 and backward 2, and
 * requires every rank's bubble to be (p-1)/(v*m) within 1e-12 and, for
 * 1F1B, the first stage to hold at most pp micro batches at once.  So the
 * bubble is measured on what ran, not taken from the formula. */
#include "passes/pipe.h"
#include <math.h>

int main(int argc, char **argv) {
  if (argc != 6) { fprintf(stderr, "usage: bubble_exec PREFIX KIND PP VPP NMICRO\n"); return 2; }
  int kind = plan_pipe_sched_lookup(argv[2]), pp = atoi(argv[3]), vpp = atoi(argv[4]), m = atoi(argv[5]);
  if (kind < 0 || pp < 1 || vpp < 1 || m < 1) { fprintf(stderr, "bubble_exec: bad arguments\n"); return 2; }
  PipeSchedule s = {(PipeSchedKind)kind, pp, vpp, m, ts_xcalloc((size_t)pp, sizeof(int)),
                    ts_xcalloc((size_t)pp, sizeof(PipeStep *))};
  int fails = 0;
  for (int r = 0; r < pp; r++) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", argv[1], r);
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "bubble_exec: cannot open %s\n", path); return 1; }
    char k;
    int mi, g, cap = 0;
    while (fscanf(f, " %c %d %d", &k, &mi, &g) == 3) {
      if (s.nsteps[r] == cap) s.steps[r] = ts_xrealloc(s.steps[r], (size_t)(cap = cap ? 2 * cap : 16) * sizeof(PipeStep));
      s.steps[r][s.nsteps[r]++] = (PipeStep){k, mi, g};
    }
    fclose(f);
    if (s.nsteps[r] != 2 * m * vpp) {
      fprintf(stderr, "FAIL rank %d ran %d steps, want %d\n", r, s.nsteps[r], 2 * m * vpp);
      fails++;
    }
  }
  char err[1024];
  PipeTimeline t;
  if (plan_pipe_check(&s, err, sizeof err) != 0 || plan_pipe_simulate(&s, NULL, 2.0, &t, err, sizeof err) != 0) {
    fprintf(stderr, "FAIL the executed schedule: %s\n", err);
    return 1;
  }
  double want = (double)(pp - 1) / (double)(vpp * m);
  for (int r = 0; r < pp; r++) {
    double b = plan_pipe_bubble(&t, r);
    printf("rank %d: %d steps, bubble %.6f (want (p-1)/(v*m) = %.6f), %d micro batches in flight\n", r, s.nsteps[r], b,
           want, t.peak_micro[r]);
    if (fabs(b - want) > 1e-12) { fprintf(stderr, "FAIL rank %d bubble %.12f\n", r, b); fails++; }
  }
  if (kind == PIPE_1F1B && t.peak_micro[0] > pp) {
    fprintf(stderr, "FAIL 1f1b: the first stage held %d micro batches, more than pp = %d\n", t.peak_micro[0], pp);
    fails++;
  }
  plan_pipe_timeline_free(&t);
  plan_pipe_schedule_free(&s);
  return fails != 0;
}
