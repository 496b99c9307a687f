/* bubble_exec.c - the bubble of the schedule mrun actually ran.
 *   bubble_exec PREFIX KIND PP VPP NMICRO [BASE_PREFIX]
 * reads PREFIX.<r> for every pipeline rank r: the steps rank r ran in the
 * first step of training, in order, one "F|B|W micro chunk" per line (the
 * trainer writes them under TS_PIPE_TRACE).  Rebuilds the schedule from
 * them, checks it across ranks (plan_pipe_check: every F and B once -- and
 * W with zb-h1 --, sends matched, no deadlock), simulates it with forward
 * 1 and backward 2 (zb-h1: B 1 and W 1), and requires every rank's bubble
 * to be (p-1)/(v*m) within 1e-12 ((p-1)/(3m) for zb-h1) and, for 1F1B and
 * zb-h1, every stage to hold at most pp micro batches at once.  With
 * BASE_PREFIX (the trace of a 1F1B run with the same pp and micro
 * batches), also that this run's worst bubble is at most a third of that
 * run's, with the same peak in flight (worst rank and first rank).  So
 * the bubble is measured on what ran, not taken from the formula. */
#include "passes/pipe.h"
#include <math.h>

/* The schedule recorded under prefix; 0, or -1 after printing why. */
static int load(const char *prefix, PipeSchedKind kind, int pp, int vpp, int m, PipeSchedule *s) {
  *s = (PipeSchedule){kind, pp, vpp, m, ts_xcalloc((size_t)pp, sizeof(int)), ts_xcalloc((size_t)pp, sizeof(PipeStep *))};
  int fails = 0, per = (plan_pipe_sched_splits_bwd(kind) ? 3 : 2) * m * vpp;
  for (int r = 0; r < pp; r++) {
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", prefix, r);
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "bubble_exec: cannot open %s\n", path); return -1; }
    char k;
    int mi, g, cap = 0;
    while (fscanf(f, " %c %d %d", &k, &mi, &g) == 3) {
      if (s->nsteps[r] == cap) s->steps[r] = ts_xrealloc(s->steps[r], (size_t)(cap = cap ? 2 * cap : 16) * sizeof(PipeStep));
      s->steps[r][s->nsteps[r]++] = (PipeStep){k, mi, g};
    }
    fclose(f);
    if (s->nsteps[r] != per) {
      fprintf(stderr, "FAIL %s: rank %d ran %d steps, want %d\n", prefix, r, s->nsteps[r], per);
      fails++;
    }
  }
  return fails ? -1 : 0;
}

/* Worst rank's bubble of t, and its peak in flight. */
static double worst(const PipeTimeline *t, int *peak) {
  double w = 0;
  *peak = 0;
  for (int r = 0; r < t->pp; r++) {
    if (plan_pipe_bubble(t, r) > w) w = plan_pipe_bubble(t, r);
    if (t->peak_micro[r] > *peak) *peak = t->peak_micro[r];
  }
  return w;
}

int main(int argc, char **argv) {
  if (argc != 6 && argc != 7) { fprintf(stderr, "usage: bubble_exec PREFIX KIND PP VPP NMICRO [BASE_PREFIX]\n"); return 2; }
  int kind = plan_pipe_sched_lookup(argv[2]), pp = atoi(argv[3]), vpp = atoi(argv[4]), m = atoi(argv[5]);
  if (kind < 0 || pp < 1 || vpp < 1 || m < 1) { fprintf(stderr, "bubble_exec: bad arguments\n"); return 2; }
  PipeSchedule s;
  int fails = load(argv[1], (PipeSchedKind)kind, pp, vpp, m, &s) != 0;
  char err[1024];
  PipeTimeline t;
  if (plan_pipe_check(&s, err, sizeof err) != 0 || plan_pipe_simulate(&s, NULL, 2.0, &t, err, sizeof err) != 0) {
    fprintf(stderr, "FAIL the executed schedule: %s\n", err);
    return 1;
  }
  int split = plan_pipe_sched_splits_bwd((PipeSchedKind)kind);
  double want = (double)(pp - 1) / (double)(vpp * m * (split ? 3 : 1));
  for (int r = 0; r < pp; r++) {
    double b = plan_pipe_bubble(&t, r);
    printf("rank %d: %d steps, bubble %.6f (want (p-1)/(%sm) = %.6f), %d micro batches in flight\n", r, s.nsteps[r],
           b, split ? "3" : "v*", want, t.peak_micro[r]);
    if (fabs(b - want) > 1e-12) { fprintf(stderr, "FAIL rank %d bubble %.12f\n", r, b); fails++; }
    if ((kind == PIPE_1F1B || split) && t.peak_micro[r] > pp) {
      fprintf(stderr, "FAIL %s: stage %d held %d micro batches, more than pp = %d\n", argv[2], r, t.peak_micro[r], pp);
      fails++;
    }
  }
  if (argc == 7) {
    PipeSchedule bs;
    PipeTimeline bt;
    if (load(argv[6], PIPE_1F1B, pp, 1, m, &bs) != 0 || plan_pipe_check(&bs, err, sizeof err) != 0 ||
        plan_pipe_simulate(&bs, NULL, 2.0, &bt, err, sizeof err) != 0) {
      fprintf(stderr, "FAIL the 1f1b run %s: %s\n", argv[6], err);
      return 1;
    }
    int peak, bpeak;
    double w = worst(&t, &peak), bw = worst(&bt, &bpeak);
    printf("%s bubble %.6f, peak %d (first rank %d); 1f1b as run: bubble %.6f, peak %d (first rank %d)\n", argv[2], w,
           peak, t.peak_micro[0], bw, bpeak, bt.peak_micro[0]);
    if (!(w <= bw / 3 + 1e-12)) { fprintf(stderr, "FAIL bubble %.6f is more than a third of 1f1b's %.6f\n", w, bw); fails++; }
    if (peak != bpeak || t.peak_micro[0] != bt.peak_micro[0]) {
      fprintf(stderr, "FAIL peak in flight %d (first rank %d), 1f1b %d (%d)\n", peak, t.peak_micro[0], bpeak,
              bt.peak_micro[0]);
      fails++;
    }
    plan_pipe_timeline_free(&bt);
    plan_pipe_schedule_free(&bs);
  }
  plan_pipe_timeline_free(&t);
  plan_pipe_schedule_free(&s);
  return fails != 0;
}
