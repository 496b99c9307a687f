/* test_dl_search.c - where the CUDA libraries are looked for (ir/dl.h,
 * ts_dl_load): TS_CUDA_LIB_PATH before the dynamic loader, the
 * nvidia/<package>/lib folders of python3's site-packages (the CUDA
 * wheels) after it, and a one-line "not found" that says where it looked.
 * The library is the fake cuBLASLt (tests/cuda_dev), copied under names no
 * machine has.  Each mode runs in a fresh process (the folders are read
 * once per process).
 *   test_dl_search override FAKE_LT   TS_CUDA_LIB_PATH wins over the loader
 *   test_dl_search python FAKE_LT     found in a site-packages on PYTHONPATH
 *   test_dl_search missing            the message */
#include "ir/dl.h"
#include "tests/check.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct { void *matmul; } Table;
static const TsDlSym syms[] = {TS_DL_SYM(Table, matmul, "cublasLtMatmul")};

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  CHECK(a && b, "copy %s -> %s", from, to);
  if (!a || !b) exit(1);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
  fclose(a);
  fclose(b);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  char tmp[] = "/tmp/ts_dl_search.XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  char dir[512], path[700], cmd[700], detail[1024];
  const char *file = NULL;
  TsDlStatus st;
  Table t = {0};
  if (!strcmp(mode, "override") && argc > 2) {
    /* the same soname the toolkit has: the override must win */
    snprintf(dir, sizeof dir, "%s/lib", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/libcublasLt.so.13", dir);
    copy_file(argv[2], path);
    char env[1200];
    snprintf(env, sizeof env, "/nonexistent:%s", dir);
    setenv("TS_CUDA_LIB_PATH", env, 1);
    const char *files[] = {"libcublasLt.so.13", NULL};
    void *h = ts_dl_load(files, syms, 1, &t, &file, &st, detail, sizeof detail);
    CHECK(h && st == TS_DL_OK && t.matmul, "%s", detail);
    CHECK(file && !strcmp(file, path), "loaded %s, want %s", file ? file : "(null)", path);
    CHECK(strstr(ts_dl_where(), "TS_CUDA_LIB_PATH, LD_LIBRARY_PATH"), "%s", ts_dl_where());
  } else if (!strcmp(mode, "python") && argc > 2) {
    snprintf(dir, sizeof dir, "%s/site", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/nvidia", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/nvidia/fakepkg", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/nvidia/fakepkg/lib", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/nvidia/fakepkg/lib/libts_dlprobe.so.7", dir);
    copy_file(argv[2], path);
    setenv("PYTHONPATH", dir, 1);
    unsetenv("TS_CUDA_LIB_PATH");
    const char *files[] = {"libts_dlprobe.so.7", NULL};
    void *h = ts_dl_load(files, syms, 1, &t, &file, &st, detail, sizeof detail);
    CHECK(h && st == TS_DL_OK && t.matmul, "%s", detail);
    CHECK(file && !strcmp(file, path), "loaded %s, want %s", file ? file : "(null)", path);
  } else if (!strcmp(mode, "missing")) {
    unsetenv("TS_CUDA_LIB_PATH");
    const char *files[] = {"libts_absent.so.9", NULL};
    void *h = ts_dl_load(files, syms, 1, &t, &file, &st, detail, sizeof detail);
    CHECK(!h && st == TS_DL_NOT_FOUND);
    static const char head[] = "not found (looked in LD_LIBRARY_PATH, the ld.so cache, ";
    CHECK(!strncmp(detail, head, sizeof head - 1), "%s", detail);
    CHECK(strstr(detail, "nvidia/*/lib folder") && strstr(detail, "python3's site-packages"), "%s", detail);
    CHECK(strstr(detail, "TS_CUDA_LIB_PATH=DIR[:DIR...] adds folders)"), "%s", detail);
    CHECK(!strchr(detail, '\n'), "one line: %s", detail);
    /* a path is tried as given, never searched for */
    const char *given[] = {"/nonexistent/libts_absent.so.9", NULL};
    CHECK(!ts_dl_load(given, syms, 1, &t, &file, &st, detail, sizeof detail) && st == TS_DL_NOT_FOUND);
    CHECK(!strstr(detail, "looked in"), "%s", detail);
  } else {
    fprintf(stderr, "usage: test_dl_search override|python FAKE_LIB | missing\n");
    return 2;
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  return check_exit(mode);
}
