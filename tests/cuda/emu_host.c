/* emu_host.c - the host side of the CUDA emulator (tests only; emu_host.h
 * has the API and what a test executable must add to use it): writes a
 * module's source into a fresh directory, compiles it with the host C++
 * compiler against tests/cuda/emu/ts_cuda_emu.h into a shared object,
 * dlopens it, and launches kernels through the module's ts_emu_launch.
 * The shared object is built without sanitizers even in the sanitizer
 * build (an instrumented test process may dlopen a plain object; the
 * emulator's stack switching then happens only in uninstrumented code). */
#include "emu_host.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TS_EMU_CXX_DEFAULT
#error "define TS_EMU_CXX_DEFAULT (the C++ compiler) and TS_EMU_HEADER (see emu_host.h)"
#endif
#ifndef TS_EMU_HEADER
#error "define TS_EMU_HEADER, the path of tests/cuda/emu/ts_cuda_emu.h (see emu_host.h)"
#endif

extern char **environ;

_Static_assert(sizeof(CgCudaArgs) == 33 * sizeof(void *), "CgCudaArgs must match TsArgs (32 pointers + run)");

typedef int (*TsEmuLaunchFn)(void (*fn)(CgCudaArgs), const CgCudaArgs *a, long long blocks, int threads, char *err,
                             unsigned long errlen);

struct TsEmu {
  void *handle;
  void *base;              /* load address of the shared object: kernels must live in it */
  TsEmuLaunchFn launch;
  char dir[PATH_MAX];      /* "" once removed */
  int keep;
};

static const char *const FILES[] = {"module.cu", "module.so", "compile.log"};

static void remove_dir(TsEmu *e) {
  if (!e->dir[0] || e->keep) return;
  char p[PATH_MAX + 32];
  for (size_t i = 0; i < sizeof FILES / sizeof *FILES; i++) {
    snprintf(p, sizeof p, "%s/%s", e->dir, FILES[i]);
    unlink(p);
  }
  rmdir(e->dir);
  e->dir[0] = 0;
}

/* Splits s at blanks into argv (words appended to *argv, count *argc; at most max). */
static void split_words(char *s, char **argv, int *argc, int max) {
  for (char *w = strtok(s, " \t\n"); w && *argc < max; w = strtok(NULL, " \t\n")) argv[(*argc)++] = w;
}

/* The compiler's log cut to its first error lines, the temporary path
 * dropped from file names. */
static void log_excerpt(const char *logpath, const char *dir, char *out, size_t n) {
  char *log = ts_read_file(logpath, NULL);
  out[0] = 0;
  if (!log) return;
  const char *from = strstr(log, "error");
  if (from) {
    while (from > log && from[-1] != '\n') from--;
  } else {
    from = log;
  }
  size_t dl = strlen(dir), o = 0;
  int lines = 0;
  for (const char *s = from; *s && lines < 14 && o + 1 < n; s++) {
    if (dl && strncmp(s, dir, dl) == 0 && s[dl] == '/') {
      s += dl;   /* "DIR/module.cu:3:5" -> "module.cu:3:5" */
      continue;
    }
    out[o++] = *s;
    if (*s == '\n') lines++;
  }
  while (o > 0 && out[o - 1] == '\n') o--;
  out[o] = 0;
  free(log);
}

/* Runs the compiler on DIR/module.cu -> DIR/module.so, output to DIR/compile.log. */
static int compile(const TsEmu *e, char *err, size_t errlen) {
  const char *cxx_env = getenv("TS_EMU_CXX");
  char *cxx = ts_xstrdup(cxx_env && *cxx_env ? cxx_env : TS_EMU_CXX_DEFAULT);
  const char *fl_env = getenv("TS_EMU_CXXFLAGS");
  char *flags = ts_xstrdup(fl_env ? fl_env : "");
  char src[PATH_MAX + 32], so[PATH_MAX + 32], logp[PATH_MAX + 32];
  snprintf(src, sizeof src, "%s/module.cu", e->dir);
  snprintf(so, sizeof so, "%s/module.so", e->dir);
  snprintf(logp, sizeof logp, "%s/compile.log", e->dir);
  char *argv[96];
  int argc = 0;
  int rc = -1;
  split_words(cxx, argv, &argc, 8);
  if (argc == 0) {
    ts_errf(err, errlen, "emulator: no C++ compiler (TS_EMU_CXX is blank)");
    goto out;
  }
  const char *fixed[] = {"-std=c++17", "-O1", "-fPIC", "-shared", "-x", "c++", "-include", TS_EMU_HEADER, "-w"};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) argv[argc++] = (char *)fixed[i];
  split_words(flags, argv, &argc, 80);
  argv[argc++] = "-o";
  argv[argc++] = so;
  argv[argc++] = src;
  argv[argc] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  int sp = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (sp != 0) {
    ts_errf(err, errlen, "emulator: cannot run the C++ compiler '%s': %s (set TS_EMU_CXX)", argv[0], strerror(sp));
    goto out;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      ts_errf(err, errlen, "emulator: waitpid: %s", strerror(errno));
      goto out;
    }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    rc = 0;
    goto out;
  }
  char excerpt[1800];
  log_excerpt(logp, e->keep ? "" : e->dir, excerpt, sizeof excerpt);
  ts_errf(err, errlen, "emulator: the C++ compiler (%s) failed on the module%s%s:\n%s", argv[0],
          e->keep ? ", kept in " : "", e->keep ? e->dir : "", excerpt[0] ? excerpt : "(no output)");
out:
  free(cxx);
  free(flags);
  return rc;
}

TsEmu *ts_emu_load(const char *source, char *err, size_t errlen) {
  TsEmu *e = ts_xcalloc(1, sizeof *e);
  const char *keep = getenv("TS_EMU_KEEP");
  e->keep = keep && *keep && strcmp(keep, "0") != 0;
  const char *tmp = getenv("TMPDIR");
  snprintf(e->dir, sizeof e->dir, "%s/ts_emu_XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(e->dir)) {
    ts_errf(err, errlen, "emulator: cannot create a directory like %s: %s", e->dir, strerror(errno));
    free(e);
    return NULL;
  }
  char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/module.cu", e->dir);
  if (ts_write_file(p, source, strlen(source)) != 0) {
    ts_errf(err, errlen, "emulator: %s", ts_io_error());
    goto fail;
  }
  if (compile(e, err, errlen) != 0) goto fail;
  snprintf(p, sizeof p, "%s/module.so", e->dir);
  e->handle = dlopen(p, RTLD_NOW | RTLD_LOCAL);
  if (!e->handle) {
    ts_errf(err, errlen, "emulator: dlopen: %s", dlerror());
    goto fail;
  }
  void *sym = dlsym(e->handle, "ts_emu_launch");
  Dl_info info;
  if (!sym || !dladdr(sym, &info)) {
    ts_errf(err, errlen, "emulator: the module has no ts_emu_launch (was it compiled with ts_cuda_emu.h?)");
    goto fail;
  }
  *(void **)&e->launch = sym;
  e->base = info.dli_fbase;
  remove_dir(e);   /* the mapping stays; nothing is left behind if the test dies */
  return e;
fail:
  ts_emu_free(e);
  return NULL;
}

int ts_emu_launch_kernel(TsEmu *e, const CgCudaLaunch *l, const CgCudaArgs *a, char *err, size_t errlen) {
  if (!e || !l || !a) return ts_errf(err, errlen, "emulator: no module, launch or arguments");
  /* dlsym also searches the module's dependencies (libc, libm): a name found there is not a kernel;
   * nor is the emulator's own ts_emu_* */
  void *sym = strncmp(l->name, "ts_emu_", 7) == 0 ? NULL : dlsym(e->handle, l->name);
  Dl_info info;
  if (!sym || !dladdr(sym, &info) || info.dli_fbase != e->base)
    return ts_errf(err, errlen, "emulator: unknown kernel '%s' (not an extern \"C\" function of the module)", l->name);
  void (*fn)(CgCudaArgs);
  *(void **)&fn = sym;
  char why[1024];
  if (e->launch(fn, a, (long long)l->blocks, l->threads, why, sizeof why) != 0)
    return ts_errf(err, errlen, "kernel %s (%lld blocks x %d threads): %s", l->name, (long long)l->blocks, l->threads,
                   why);
  return 0;
}

void ts_emu_free(TsEmu *e) {
  if (!e) return;
  if (e->handle) dlclose(e->handle);
  remove_dir(e);
  free(e);
}
