/* params_diff.c - compares two parameter files from mrun --save-params:
 *   params_diff A B TOL
 * prints the largest relative difference (rt_params_max_rel_diff: per
 * parameter max |a - b| / max |b|) and the parameter it is in; exit 0 iff
 * both files hold the same parameters and shapes and the difference is
 * <= TOL, 1 otherwise, 2 on bad usage. */
#include "runtime/exec/train.h"
#include <math.h>

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: params_diff A B TOL\n"); return 2; }
  char err[512], where[256];
  double tol = atof(argv[3]);
  RtParams *a = rt_params_read(argv[1], err, sizeof err), *b = a ? rt_params_read(argv[2], err, sizeof err) : NULL;
  if (!a || !b) { fprintf(stderr, "params_diff: %s\n", err); rt_params_free(a); return 1; }
  double d = rt_params_max_rel_diff(a, b, where, sizeof where);
  int ok = d >= 0 && d <= tol && a->n > 0;
  if (d < 0) printf("params_diff: the files differ in structure: %s\n", where);
  else printf("params_diff: %d parameters, max relative difference %.3g (in %s), tolerance %.3g -> %s\n", a->n, d,
              where, tol, ok ? "ok" : "FAILED");
  rt_params_free(a);
  rt_params_free(b);
  return ok ? 0 : 1;
}
