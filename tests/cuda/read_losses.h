/* read_losses.h - the per-step "loss" values of a metrics file (JSON Lines,
 * as rt_train writes with metrics_path), for the tests that compare a
 * device run's losses with the CPU's (tests/cuda_step, tests/cuda_dev).
 * The count read, or -1 if the file cannot be opened. */
#ifndef TS_TEST_READ_LOSSES_H
#define TS_TEST_READ_LOSSES_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int read_losses(const char *path, double *out, int max) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[8192];
  int n = 0;
  while (n < max && fgets(line, sizeof line, f)) {
    const char *s = strstr(line, "\"loss\":");
    if (s) out[n++] = strtod(s + 7, NULL);
  }
  fclose(f);
  return n;
}

#endif
