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

/* The two tests' common start: whether a C compiler is there (without one
 * the printed C is not compiled, and the tests say so), and the JIT
 * (exits with the reason when it cannot be created). */
static int g_have_cc;
static CgJit *g_jit;
static void codegen_test_init(void) {
  char err[512];
  g_have_cc = system("cc --version > /dev/null 2>&1") == 0;
  if (!g_have_cc) printf("no cc: the C printer's output is not compiled\n");
  g_jit = cg_jit_new(err, sizeof err);
  if (!g_jit) {
    fprintf(stderr, "cannot create the JIT: %s\n", err);
    exit(1);
  }
}

#endif
