/* test_selftest - rt_selftest (runtime/exec/selftest.h, mrun --selftest) on the
 * emulated device (tests/cuda/emu_dev.c):
 *   test_selftest all     every kind in f32 and f64 and the training step
 *                         pass, the table lists every kind (names fixed
 *                         here), none is "no kernel"
 *   test_selftest nvrtc   the kinds in f32 (no training step) with the
 *                         device claiming sm_80: the module goes through
 *                         NVRTC first, as on a GPU
 *   test_selftest broken  a device whose launches of one kernel (by name
 *                         prefix: softmax) do nothing and whose GEMMs get
 *                         one element slightly wrong (100x the limit):
 *                         the softmax and matmul rows FAIL and are
 *                         counted, layernorm still passes (run with
 *                         TS_SELFTEST_ONLY=softmax,matmul,layernorm)
 * The table goes to stdout as well. */
#include "runtime/exec/selftest.h"
#include "runtime/device/device.h"
#include "../cuda/emu_dev.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"

/* the kinds the self-test must cover (docs/cuda.md, "The self-test") */
static const char *const want_kinds[] = {
  "elementwise", "softmax", "log_softmax", "layernorm", "rmsnorm", "cross_entropy", "reduce", "sum_to", "sumsq",
  "activations", "dropout", "matmul", "gemm_bias", "attention", "attention_grads", "embedding", "rope", "adamw", "accum_zero",
  "layout",
};
enum { NWANT = sizeof want_kinds / sizeof want_kinds[0] };

/* ---- a device that skips the launches of kernels named SKIP_PREFIX... ---- */
static const char *skip_prefix;
static long long skipped;
static RtDevOps broken_ops;
static const RtDevOps *inner_ops;

static int broken_launch(RtDev *d, RtDevModule *mod, const CgCudaLaunch *l, const CgCudaArgs *a, int stream,
                         char *err, size_t n) {
  if (strncmp(l->name, skip_prefix, strlen(skip_prefix)) == 0) { skipped++; return 0; }
  return inner_ops->launch(d, mod, l, a, stream, err, n);
}

/* Every GEMM's first result element off by a little: 100 times the
 * self-test's limit for a value near 1 (f32 1e-3, f64 1e-8). */
static long long perturbed;
static int broken_gemm(RtDev *d, const RtGemm *g, int stream, char *err, size_t n) {
  if (inner_ops->gemm(d, g, stream, err, n) != 0) return -1;
  if (g->dtype == IR_F64) ((double *)g->c)[0] += 1e-8;
  else ((float *)g->c)[0] += 1e-3f;
  perturbed++;
  return 0;
}

/* The emulated device with launch and gemm replaced.  The emulator's functions
 * only read d->impl, which the copy shares. */
static RtDev *broken_open(const char *prefix) {
  RtDev *inner = ts_emu_dev_open();
  RtDev *d = ts_xmalloc(sizeof *d);
  *d = *inner;
  free(inner);   /* its impl lives on in d; closing d frees both */
  inner_ops = d->ops;
  broken_ops = *d->ops;
  broken_ops.launch = broken_launch;
  broken_ops.gemm = broken_gemm;
  d->ops = &broken_ops;
  skip_prefix = prefix;
  return d;
}

/* The table row of kind / dtype: its line (in buf), or NULL. */
static const char *row_of(const char *table, const char *kind, const char *dt, char *buf, size_t n) {
  for (const char *s = table; *s;) {
    size_t l = strcspn(s, "\n");
    char k[64], t[16];
    snprintf(buf, n, "%.*s", (int)(l < n ? l : n - 1), s);
    if (sscanf(buf, "%63s %15s", k, t) == 2 && strcmp(k, kind) == 0 && strcmp(t, dt) == 0) return buf;
    s += l + (s[l] == '\n');
  }
  return NULL;
}

/* Runs rt_selftest on d; the table into *text (caller frees). */
static int run(RtDev *d, char **text, int *fails) {
  size_t len = 0;
  FILE *f = open_memstream(text, &len);
  char err[1024];
  int rc = rt_selftest(d, &rt_selftest_gpt, f, fails, err, sizeof err);
  fclose(f);
  fputs(*text, stdout);
  if (rc != 0) printf("rt_selftest: %s\n", err);
  return rc;
}

/* sm > 0: the emulated device claims that arch, so the self-test gives it
 * NVRTC's cubin and PTX with the source, as to a GPU (the emulator runs
 * the source): every module compiles with NVRTC for it. */
static void test_all(int sm, int train, int f64) {
  RtDev *d = ts_emu_dev_open();
  d->sm = sm;
  char *text = NULL, line[512];
  int fails = -1;
  CHECK(run(d, &text, &fails) == 0, "rt_selftest did not run");
  CHECK(fails == 0, "%d rows FAIL on the emulated device", fails);
  static const char *const dts[] = {"f32", "f64"};
  for (int t = 0; t < 1 + f64; t++) {
    for (int k = 0; k < NWANT; k++) {
      const char *r = row_of(text, want_kinds[k], dts[t], line, sizeof line);
      CHECK(r, "no row for %s %s", want_kinds[k], dts[t]);
      if (!r) continue;
      CHECK(strstr(r, " pass") != NULL, "row: %s", r);
    }
    int found = 0;
    for (const char *s = strstr(text, "train gpt 2 steps"); s; s = strstr(s + 1, "train gpt 2 steps")) {
      size_t l = strcspn(s, "\n");
      snprintf(line, sizeof line, "%.*s", (int)(l < sizeof line ? l : sizeof line - 1), s);
      if (strstr(line, dts[t])) { found = 1; CHECK(strstr(line, " pass"), "row: %s", line); }
    }
    CHECK(found == train, "%s training row for %s", found ? "a" : "no", dts[t]);
  }
  CHECK(strstr(text, "0 FAIL") != NULL, "no summary line with 0 FAIL");
  long long launches = 0, gemms = 0;
  ts_emu_dev_counts(d, &launches, &gemms, NULL);
  printf("emulated device: %lld launches, %lld GEMMs\n", launches, gemms);
  CHECK(launches > 0 && gemms > 0, "the device did not run");
  free(text);
  d->ops->close(d);
}

/* The max error column of a row (-1 if none). */
static double row_err(const char *row) {
  char k[64], t[16];
  double e = -1;
  if (sscanf(row, "%63s %15s %lf", k, t, &e) != 3) return -1;
  return e;
}

static void test_broken(void) {
  RtDev *d = broken_open("softmax");
  char *text = NULL, line[512];
  int fails = -1;
  CHECK(run(d, &text, &fails) == 0, "rt_selftest did not run");
  printf("launches skipped: %lld, GEMM results perturbed: %lld\n", skipped, perturbed);
  CHECK(skipped > 0 && perturbed > 0, "no kernel named softmax* was launched, or no GEMM");
  static const char *const dts[] = {"f32", "f64"};
  for (int t = 0; t < 2; t++) {
    /* a skipped kernel: garbage (NaN in the emulator's fresh memory) */
    const char *r = row_of(text, "softmax", dts[t], line, sizeof line);
    CHECK(r && strstr(r, " FAIL"), "softmax %s: %s", dts[t], r ? r : "(no row)");
    /* a small error: one element off by ~100x the limit */
    r = row_of(text, "matmul", dts[t], line, sizeof line);
    double e = r ? row_err(r) : -1, lim = t == 0 ? 1e-5 : 1e-10;
    CHECK(r && strstr(r, " FAIL") && e > lim && e < 1e4 * lim, "matmul %s: %s", dts[t], r ? r : "(no row)");
    /* untouched kernels still pass */
    r = row_of(text, "layernorm", dts[t], line, sizeof line);
    CHECK(r && strstr(r, " pass"), "layernorm %s: %s", dts[t], r ? r : "(no row)");
  }
  int nfail = 0;
  for (const char *s = text; (s = strstr(s, "  FAIL\n")); s++) nfail++;
  CHECK(fails == 4 && nfail == 4, "%d failures counted, %d FAIL rows in the table (want 4)", fails, nfail);
  free(text);
  d->ops->close(d);
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  if (strcmp(what, "all") == 0) test_all(0, 1, 1);
  else if (strcmp(what, "nvrtc") == 0 || strcmp(what, "nvrtc_sm86") == 0) {
    char why[256];
    if (!cg_nvrtc_available(why, sizeof why)) { printf("skipped: %s\n", why); return 0; }
    /* every kind in f32 (NVRTC takes ~15 s per module; cuda.resources
     * compiles the training step's modules and cuda_print every kernel in
     * f64) */
    StrBuf only = {0};
    sb_puts(&only, "f32");
    for (int k = 0; k < NWANT; k++) sb_printf(&only, ",%s", want_kinds[k]);
    setenv("TS_SELFTEST_ONLY", only.p, 1);
    sb_free(&only);
    /* nvrtc_sm86: a GPU of an arch the plans are rarely compiled for (the
     * self-test compiles for the device's own arch: every arch NVRTC
     * supports, not only sm_80 and sm_90) */
    test_all(strcmp(what, "nvrtc") == 0 ? 80 : 86, 0, 0);
  }
  else if (strcmp(what, "broken") == 0) test_broken();
  else { fprintf(stderr, "usage: test_selftest all|nvrtc|nvrtc_sm86|broken\n"); return 2; }
  return check_exit("test_selftest");
}
