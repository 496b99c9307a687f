/* check.h - the one check macro of every test program.  A failed check
 * counts and prints, to stderr, one line
 *     [rank R: ]FAIL file:line: condition[: message]
 * and main ends with `return check_exit("name");`: one summary line and the
 * exit status, 0 only when no check failed and at least one ran (a test
 * that asserts nothing fails).
 *   CHECK(cond) / CHECK(cond, fmt, ...)   the message is printf-style, fmt a
 *                                         string literal; its arguments are
 *                                         evaluated only on failure
 *   CHECK_AT(file, line, cond, ...)       the same for a helper that checks
 *                                         on behalf of its caller's line
 *   CHECK_NEAR(a, b, tol, fmt, ...)       |a - b| <= tol * max(1, |b|)
 *   check_rank                            an MPI program sets it to its rank
 *   check_exit_all(name, all_bad)         main's end under MPI
 * Header-only and static: include it from one file of a test program. */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

static int check_fails, check_count;   /* checks failed, checks made */
static int check_rank = -1;            /* >= 0: "rank R: " before every line */

/* A failed check of `what` at file:line.  fmt is the message behind ": ",
 * or ": " alone for a check without a message. */
__attribute__((format(printf, 4, 5))) static inline void check_failed(const char *file, int line, const char *what,
                                                                      const char *fmt, ...) {
  check_fails++;
  fflush(stdout);   /* what the test printed before stays before the failure */
  if (check_rank >= 0) fprintf(stderr, "rank %d: ", check_rank);
  fprintf(stderr, "FAIL %s:%d: %s", file, line, what);
  if (fmt[2]) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
  }
  fputc('\n', stderr);
}
#define CHECK_TEXT_(file, line, c, text, ...) \
  do { check_count++; if (!(c)) check_failed(file, line, text, ": " __VA_ARGS__); } while (0)
#define CHECK(c, ...) CHECK_TEXT_(__FILE__, __LINE__, c, #c, __VA_ARGS__)
#define CHECK_AT(file, line, c, ...) CHECK_TEXT_(file, line, c, #c, __VA_ARGS__)
#define CHECK_NEAR(a, b, tol, ...) do { double a_ = (a), b_ = (b);                          \
    int near_ = fabs(a_ - b_) <= (tol) * (fabs(b_) > 1 ? fabs(b_) : 1) || a_ == b_;           \
    CHECK_TEXT_(__FILE__, __LINE__, near_, #a " ~ " #b, __VA_ARGS__);                         \
    if (!near_) fprintf(stderr, "    got %.12g, expected %.12g\n", a_, b_); } while (0)

/* This process's part of an MPI verdict: its failures, or 1 when it made
 * no check. */
static inline int check_bad(void) { return check_fails + !check_count; }

/* main's end: one line and the exit status.  Under MPI all_bad is
 * check_bad() summed over the ranks, so that every rank returns the same
 * verdict; rank 0 prints it, the other ranks only their own failures. */
static inline int check_exit_all(const char *name, double all_bad) {
  int mine = check_bad() != 0, bad = mine || all_bad != 0;
  if (check_rank > 0 && !mine) return bad;
  FILE *o = bad ? stderr : stdout;
  fflush(stdout);
  if (check_rank >= 0) fprintf(o, "rank %d: ", check_rank);
  if (!check_count) fprintf(o, "%s: FAILED: no check ran\n", name);
  else if (check_fails) fprintf(o, "%s: %d of %d checks FAILED\n", name, check_fails, check_count);
  else if (bad) fprintf(o, "%s: all %d checks passed here, FAILED on another rank\n", name, check_count);
  else fprintf(o, "%s: all %d checks passed\n", name, check_count);
  return bad;
}
static inline int check_exit(const char *name) { return check_exit_all(name, check_bad()); }

#endif
