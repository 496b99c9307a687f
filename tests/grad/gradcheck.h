/* gradcheck.h - what the gradient-check programs of tests/grad share:
 * deterministic random numbers, running a block for its loss, and the
 * central-difference comparison of one parameter's analytical gradient.
 * Everything is f64: with h = 1e-6 central differences agree with exact
 * gradients to ~1e-9 relative, so a 1e-6 bound catches any real mistake. */
#ifndef TS_TESTS_GRADCHECK_H
#define TS_TESTS_GRADCHECK_H
#include "ir/ir.h"
#include "runtime/exec/rt.h"
#include <math.h>

#define GC_H 1e-6
#define GC_TOL 1e-6

/* xorshift64*: small, deterministic, good enough for test data. */
static inline uint64_t gc_next(uint64_t *s) {
  *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1DULL;
}
static inline double gc_u01(uint64_t *s) { return (double)(gc_next(s) >> 11) * 0x1.0p-53; }
static inline double gc_normal(uint64_t *s) {       /* Box-Muller */
  double u = gc_u01(s), v = gc_u01(s);
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Runs block b of p (as step/micro `info`; dropout masks depend on them)
 * and returns its `output "loss"`; NAN with a message on stderr if the
 * run fails. */
static inline double gc_loss(RtProgram *p, int b, const RtRunInfo *info, const RtFeed *feeds, int nfeeds) {
  char err[1024];
  if (rt_run_block(p, b, feeds, nfeeds, info, err, sizeof err) != 0) {
    fprintf(stderr, "  run failed: %s\n", err);
    return NAN;
  }
  double v;
  if (rt_output(p, "loss", &v) != 0) { fprintf(stderr, "  no output \"loss\"\n"); return NAN; }
  return v;
}

/* Compares the analytical gradient g (f64, NULL = no gradient, i.e. zero)
 * of parameter data x (f64, n elements, inside program pf whose block fb
 * computes the loss) against central differences, on the elements listed
 * in idx (or all when idx is NULL).  Returns the relative error
 * max|g - fd| / max(floor, max|fd|); x is restored.  The floor is where a
 * relative bound stops making sense: central differences carry a rounding
 * error of about eps * |loss| / h (~1e-9 for a loss of a few units), so a
 * gradient that is (structurally) zero shows up as fd noise of that size. */
static inline double gc_check(RtProgram *pf, int fb, const RtRunInfo *info, const RtFeed *feeds, int nfeeds,
                              double *x, const double *g, int64_t n, const int64_t *idx, int nidx,
                              double floor, double *max_fd_out) {
  double max_err = 0, max_fd = 0;
  int64_t cnt = idx ? nidx : n;
  for (int64_t k = 0; k < cnt; k++) {
    int64_t j = idx ? idx[k] : k;
    double v = x[j];
    x[j] = v + GC_H;
    double lp = gc_loss(pf, fb, info, feeds, nfeeds);
    x[j] = v - GC_H;
    double lm = gc_loss(pf, fb, info, feeds, nfeeds);
    x[j] = v;
    double fd = (lp - lm) / (2 * GC_H);
    double e = fabs((g ? g[j] : 0.0) - fd);
    if (isnan(e) || e > max_err) max_err = e;   /* a NaN sticks */
    if (fabs(fd) > max_fd) max_fd = fabs(fd);
  }
  if (max_fd_out) *max_fd_out = max_fd;
  return max_err / (max_fd > floor ? max_fd : floor);
}

#endif
