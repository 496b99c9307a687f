/* compile_c.h - for the codegen tests: compiles C text (the C printer's
 * output) to a shared object in a temporary directory with the system cc
 * and returns function `name` (NULL, with the command printed, when cc
 * or dlopen fails).  *handle gets the dlopen handle for dlclose. */
#ifndef TS_TEST_COMPILE_C_H
#define TS_TEST_COMPILE_C_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "codegen/cg.h"

static CgFn compile_c(const char *text, const char *name, void **handle) {
  char dir[] = "/tmp/cgtestXXXXXX", path[64], so[64], cmd[256];
  if (!mkdtemp(dir)) return NULL;
  snprintf(path, sizeof path, "%s/k.c", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  FILE *f = fopen(path, "w");
  if (!f) { rmdir(dir); return NULL; }
  fputs(text, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -std=c11 -O2 -w -shared -fPIC -o %s %s -lm", so, path);
  CgFn fn = NULL;
  if (system(cmd) == 0 && (*handle = dlopen(so, RTLD_NOW | RTLD_LOCAL)) != NULL) {
    void *sym = dlsym(*handle, name);
    memcpy(&fn, &sym, sizeof fn);
  } else {
    fprintf(stderr, "compile_c: '%s' failed\n", cmd);
  }
  remove(path);
  remove(so);
  rmdir(dir);
  return fn;
}

#endif
