/* test_emu - the CUDA emulation harness (emu_host.h, emu/ts_cuda_emu.h) on
 * the hand-written kernels of test_emu_kernels.cu, each result checked
 * against a plain C computation of the same thing.
 *   test_emu KERNELS.cu TEST
 * TEST: builtins reduce shuffle atomics vectors math bits refusals speed
 * threads prelude wmma, or all (every one but refusals, speed and threads: one
 * compile, for the ucontext and clang variants). */
#include "emu_host.h"
#include "runtime/cpu/half.h"
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "../check.h"

static TsEmu *E;

static CgCudaLaunch launch_of(const char *name, long long blocks, int threads) {
  CgCudaLaunch l = {.blocks = blocks, .threads = threads};
  snprintf(l.name, sizeof l.name, "%s", name);
  return l;
}

/* Runs a kernel that must succeed. */
static int run(const char *name, long long blocks, int threads, const CgCudaArgs *a) {
  CgCudaLaunch l = launch_of(name, blocks, threads);
  char err[2048] = "";
  int rc = ts_emu_launch_kernel(E, &l, a, err, sizeof err);
  CHECK(rc == 0, "%s (%lld x %d): %s", name, blocks, threads, err);
  return rc == 0 ? 0 : -1;
}

/* Runs a kernel that must fail with a message containing want. */
static void run_refused(TsEmu *e, const char *name, long long blocks, int threads, const CgCudaArgs *a,
                        const char *want) {
  CgCudaLaunch l = launch_of(name, blocks, threads);
  char err[2048] = "";
  int rc = ts_emu_launch_kernel(e, &l, a, err, sizeof err);
  CHECK(rc == -1 && strstr(err, want), "%s (%lld x %d): want an error with '%s', got rc %d '%s'", name, blocks,
        threads, want, rc, err);
  if (rc == -1) printf("  refused as expected: %s\n", err);
}

static double *dalloc(size_t n) { return aligned_alloc(64, (n * sizeof(double) + 63) / 64 * 64); }

/* ---- built-in variables, grid-stride loop ---- */
static void t_builtins(void) {
  static const int shapes[][2] = {{1, 32}, {3, 64}, {5, 256}, {2, 1024}, {70, 96}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int B = shapes[s][0], T = shapes[s][1], n = B * T;
    int *out = malloc((size_t)n * 16), *yz = malloc((size_t)n * 4);
    memset(out, 0xff, (size_t)n * 16);
    memset(yz, 0xff, (size_t)n * 4);
    CgCudaArgs a = {.b = {out, yz}};
    if (run("k_builtins", B, T, &a) == 0) {
      int bad = 0;
      for (int g = 0; g < n; g++)
        bad += out[4 * g] != g % T || out[4 * g + 1] != g / T || out[4 * g + 2] != T || out[4 * g + 3] != B ||
               yz[g] != 0;
      CHECK(bad == 0, "k_builtins %d x %d: %d threads saw wrong built-in values", B, T, bad);
    }
    free(out);
    free(yz);
  }
  /* grid-stride axpy: 3 x 256 threads over 10007 elements */
  long long n = 10007;
  double alpha = 1.5;
  long long run_blk[CG_RUN_WORDS] = {n};
  memcpy(&run_blk[1], &alpha, 8);
  double *x = dalloc(n), *y = dalloc(n), *ref = dalloc(n);
  for (long long i = 0; i < n; i++) {
    x[i] = sin((double)i) * 3;
    y[i] = ref[i] = cos((double)i);
    ref[i] = alpha * x[i] + ref[i];
  }
  CgCudaArgs a = {.b = {x, y}, .run = run_blk};
  if (run("k_axpy", 3, 256, &a) == 0) {
    int bad = 0;
    for (long long i = 0; i < n; i++) bad += y[i] != ref[i];
    CHECK(bad == 0, "k_axpy: %d of %lld elements differ from C", bad, n);
  }
  free(x);
  free(y);
  free(ref);
}

/* ---- block reduction with shared memory and __syncthreads ---- */
static void t_reduce(void) {
  static const int shapes[][3] = {{7, 1000, 32}, {7, 1000, 128}, {3, 33, 1024}, {5, 4099, 256}, {1, 1, 64}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int rows = shapes[s][0], cols = shapes[s][1], T = shapes[s][2];
    double *x = dalloc((size_t)rows * cols), *sum = dalloc(rows);
    float *mx = malloc((size_t)rows * 4);
    for (long long i = 0; i < (long long)rows * cols; i++) x[i] = sin(i * 0.37 + s) * 100;
    long long run_blk[CG_RUN_WORDS] = {cols};
    CgCudaArgs a = {.b = {x, sum, mx}, .run = run_blk};
    if (run("k_block_sum", rows, T, &a) == 0)
      for (int r = 0; r < rows; r++) {
        double ref = 0;
        float rmax = -INFINITY;
        for (int c = 0; c < cols; c++) {
          ref += x[(size_t)r * cols + c];
          rmax = fmaxf(rmax, (float)x[(size_t)r * cols + c]);
        }
        CHECK(fabs(sum[r] - ref) <= 1e-12 * (1 + fabs(ref)), "k_block_sum %dx%d T=%d row %d: sum %.17g, C %.17g",
              rows, cols, T, r, sum[r], ref);
        CHECK(mx[r] == rmax, "k_block_sum row %d: max %g, C %g", r, mx[r], rmax);
      }
    free(x);
    free(sum);
    free(mx);
  }
}

/* ---- warp shuffles: every kind on every type, each lane checked ----
 * The C side simulates the warp: the same operations in the same order on
 * the same type, so results must be identical. */
#define SHFL_CHECK(FN, T, NAME, VAL)                                                                     \
  static void FN(void) {                                                                                 \
    enum { B = 3, TH = 96, N = B * TH };                                                                 \
    T *in = malloc(N * sizeof(T)), *out = malloc(6 * N * sizeof(T));                                     \
    for (int g = 0; g < N; g++) in[g] = (T)(VAL);                                                        \
    CgCudaArgs a = {.b = {in, out}};                                                                     \
    if (run(NAME, B, TH, &a) != 0) goto done;                                                            \
    int bad = 0;                                                                                         \
    for (int wb = 0; wb < N; wb += 32) {                                                                 \
      T s[32], d[32], ns[32], nd[32];                                                                    \
      for (int l = 0; l < 32; l++) s[l] = d[l] = in[wb + l];                                             \
      for (int o = 16; o > 0; o >>= 1) {                                                                 \
        for (int l = 0; l < 32; l++) {                                                                   \
          ns[l] = s[l] + s[l ^ o];                                                                       \
          nd[l] = d[l] + (l + o < 32 ? d[l + o] : d[l]);                                                 \
        }                                                                                                \
        memcpy(s, ns, sizeof s);                                                                         \
        memcpy(d, nd, sizeof d);                                                                         \
      }                                                                                                  \
      for (int l = 0; l < 32; l++) {                                                                     \
        const T *v = in + wb, *r = out + 6 * (wb + l);                                                   \
        int x8 = l ^ 8;                                                                                  \
        T e5 = (x8 >= (l & ~7) + 8 ? v[l] : v[x8]) + v[(l & ~15) + 5];                                   \
        T e[6] = {s[l], d[l], v[(l * 7 + 3) % 32], l + 3 < 32 ? v[l + 3] : v[l],                         \
                  (l % 8) + 3 < 8 ? v[l + 3] : v[l], e5};                                                \
        for (int k = 0; k < 6; k++)                                                                      \
          if (memcmp(&r[k], &e[k], sizeof(T)) != 0) {                                                    \
            if (bad++ < 5) printf("  %s thread %d result %d: got %.17g want %.17g\n", NAME, wb + l, k,   \
                                  (double)r[k], (double)e[k]);                                           \
          }                                                                                              \
      }                                                                                                  \
    }                                                                                                    \
    CHECK(bad == 0, "%s: %d lane results differ from the simulated warp", NAME, bad);                    \
  done:                                                                                                  \
    free(in);                                                                                            \
    free(out);                                                                                           \
  }
SHFL_CHECK(shfl_f32, float, "k_shfl_f32", (g % 17) * 0.25f - 1.5f)
SHFL_CHECK(shfl_f64, double, "k_shfl_f64", sin(g) * 1e3)
SHFL_CHECK(shfl_i32, int, "k_shfl_i32", g * 37 - 5000)
SHFL_CHECK(shfl_u32, unsigned, "k_shfl_u32", 4000000000u + (unsigned)g * 12345u)
SHFL_CHECK(shfl_i64, long long, "k_shfl_i64", (long long)g * 123456789011LL - 7)
SHFL_CHECK(shfl_u64, unsigned long long, "k_shfl_u64", 18000000000000000000ULL + (unsigned long long)g * 977ULL)

static void t_shuffle(void) {
  shfl_f32();
  shfl_f64();
  shfl_i32();
  shfl_u32();
  shfl_i64();
  shfl_u64();
  /* __syncthreads_or: every thread gets the OR of the block's predicates */
  int out[2 * 96], who[2] = {37, -1};
  CgCudaArgs a = {.b = {out, who}};
  CHECK(run("k_sync_or", 2, 96, &a) == 0, "k_sync_or did not run");
  int ones = 0, zeros = 0;
  for (int i = 0; i < 96; i++) ones += out[i] == 1;
  for (int i = 96; i < 192; i++) zeros += out[i] == 0;
  CHECK(ones == 96 && zeros == 96, "__syncthreads_or: block 0 (thread 37 true) %d of 96 got 1, block 1 (none) %d of 96 "
        "got 0", ones, zeros);
}

/* ---- atomics from many threads and blocks ---- */
static void t_atomics(void) {
  enum { N = 100003, NB = 29 };
  int *in = malloc(N * 4), *hist = calloc(NB, 4), *order = malloc(N * 4), imax = -1, counter = 0;
  float fsum = 0;
  double dsum = 0;
  unsigned long long ucount = 0;
  for (int i = 0; i < N; i++) in[i] = (int)((i * 7919LL) % 1000);
  memset(order, 0xff, N * 4);
  long long run_blk[CG_RUN_WORDS] = {N, NB};
  CgCudaArgs a = {.b = {in, hist, &fsum, &dsum, &ucount, &imax, &counter, order}, .run = run_blk};
  if (run("k_atomics", 37, 128, &a) == 0) {
    int rhist[NB] = {0}, rmax = -1;
    double rf = 0, rd = 0;
    unsigned long long ru = 0;
    for (int i = 0; i < N; i++) {
      rhist[in[i] % NB]++;
      rf += in[i] % 64;
      rd += in[i] * 0.5;
      ru += (unsigned long long)in[i];
      if (in[i] > rmax) rmax = in[i];
    }
    for (int k = 0; k < NB; k++) CHECK(hist[k] == rhist[k], "histogram bin %d: %d, C %d", k, hist[k], rhist[k]);
    CHECK(fsum == (float)rf, "float atomicAdd: %.9g, C %.9g", fsum, rf);
    CHECK(dsum == rd, "double atomicAdd: %.17g, C %.17g", dsum, rd);
    CHECK(ucount == ru, "u64 atomicAdd: %llu, C %llu", ucount, ru);
    CHECK(imax == rmax, "atomicMax: %d, C %d", imax, rmax);
    CHECK(counter == N, "ticket counter %d, want %d", counter, N);
    char *seen = calloc(N, 1);
    int bad = 0;
    for (int t = 0; t < N; t++) {
      if (order[t] < 0 || order[t] >= N || seen[order[t]]) bad++;
      else seen[order[t]] = 1;
    }
    CHECK(bad == 0, "atomicAdd's old values: %d tickets are not a permutation of the indices", bad);
    free(seen);
  }
  free(in);
  free(hist);
  free(order);
}

/* ---- float4 / double2 / float2 / int4 ---- */
static void t_vectors(void) {
  enum { N = 1001 };
  float *f4 = aligned_alloc(16, N * 16), *f4o = aligned_alloc(16, N * 16), *f2 = aligned_alloc(16, N * 8 + 8),
        *f2o = aligned_alloc(16, N * 8 + 8);
  double *d2 = aligned_alloc(16, N * 16), *d2o = aligned_alloc(16, N * 16);
  int *i4 = aligned_alloc(16, N * 16), *i4o = aligned_alloc(16, N * 16);
  for (int i = 0; i < 4 * N; i++) {
    f4[i] = (float)sin(i) * 10;
    i4[i] = i * 3 - 77;
  }
  for (int i = 0; i < 2 * N; i++) {
    d2[i] = cos(i) * 1e5;
    f2[i] = (float)(i % 13) - 6.5f;
  }
  long long run_blk[CG_RUN_WORDS] = {N};
  CgCudaArgs a = {.b = {f4, f4o, d2, d2o, f2, f2o, i4, i4o}, .run = run_blk};
  if (run("k_vectors", 2, 128, &a) == 0) {
    int bad = 0;
    for (int i = 0; i < N; i++) {
      for (int c = 0; c < 4; c++) bad += f4o[4 * i + c] != f4[4 * i + c] * 2 + 1;
      bad += d2o[2 * i] != d2[2 * i + 1] || d2o[2 * i + 1] != d2[2 * i] + d2[2 * i + 1];
      bad += f2o[2 * i] != f2[2 * i] - f2[2 * i + 1] || f2o[2 * i + 1] != f2[2 * i] * f2[2 * i + 1];
      for (int c = 0; c < 4; c++) bad += i4o[4 * i + c] != i4[4 * i + 3 - c];
    }
    CHECK(bad == 0, "k_vectors: %d components differ from C", bad);
  }
  free(f4), free(f4o), free(f2), free(f2o), free(d2), free(d2o), free(i4), free(i4o);
}

/* ---- math functions against the host's libm ---- */
static int same(double got, double want, double rel) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= rel * fabs(want) + 1e-300;
}

static void t_math(void) {
  static const double xs[] = {-30, -2.5, -1, -0.0, 0, 1e-300, 0.3, 0.5, 1, 2.75, 10, 88, 700, 800, 1e10,
                              INFINITY, -INFINITY, NAN, 3.14159, -0.7};
  enum { N = sizeof xs / sizeof *xs };
  double *o = dalloc(13 * N);
  float *p = malloc(13 * N * 4);
  long long run_blk[CG_RUN_WORDS] = {N};
  CgCudaArgs a = {.b = {(void *)xs, o, p}, .run = run_blk};
  if (run("k_math", 1, 32, &a) != 0) goto done;
  for (int i = 0; i < N; i++) {
    double x = xs[i];
    float xf = (float)x;
    double wd[13] = {exp(x), log(x), sqrt(x), 1 / sqrt(x), tanh(x), erf(x), fabs(x), fmax(x, 0.5), fmin(x, 0.5),
                     floor(x), isnan(x) ? 1 : 0, isinf(x) ? 1 : 0, expf(xf)};
    float wf[13] = {expf(xf), logf(xf), sqrtf(xf), 1 / sqrtf(xf), tanhf(xf), erff(xf), fabsf(xf), fmaxf(xf, 0.5f),
                    fminf(xf, 0.5f), floorf(xf), expf(xf), logf(xf), xf / 3.0f};
    static const char *dn[13] = {"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "fabs", "fmax", "fmin", "floor",
                                 "isnan", "isinf", "exp(float)"};
    static const char *fn[13] = {"expf", "logf", "sqrtf", "rsqrtf", "tanhf", "erff", "fabsf", "fmaxf", "fminf",
                                 "floorf", "__expf", "__logf", "__fdividef"};
    for (int k = 0; k < 13; k++) {
      CHECK(same(o[13 * i + k], wd[k], k == 12 ? 1e-7 : 1e-15), "%s(%g) = %.17g, libm %.17g", dn[k], x, o[13 * i + k],
            wd[k]);
      CHECK(same(p[13 * i + k], wf[k], 1e-6), "%s(%g) = %.9g, libm %.9g", fn[k], xf, p[13 * i + k], wf[k]);
    }
  }
done:
  free(o);
  free(p);
}

/* ---- bit casts ---- */
static void t_bits(void) {
  enum { N = 40 };
  long long in[N], back[N];
  double d[N];
  for (int i = 0; i < N; i++) in[i] = (long long)((0x7ff0000000000000ULL * (i % 3 == 0)) ^ (i * 0x0123456789abcdULL));
  long long run_blk[CG_RUN_WORDS] = {N};
  CgCudaArgs a = {.b = {in, d, back}, .run = run_blk};
  if (run("k_bits", 2, 32, &a) != 0) return;
  for (int i = 0; i < N; i++) {
    double w;
    memcpy(&w, &in[i], 8);
    CHECK(memcmp(&d[i], &w, 8) == 0, "__longlong_as_double(%#llx) = %.17g, want %.17g", in[i], d[i], w);
    CHECK(back[i] == in[i], "__double_as_longlong round trip: %#llx, want %#llx", back[i], in[i]);
  }
}

/* ---- refusals: barrier errors, bad shapes, unknown kernels, compile errors ---- */
static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void t_refusals(void) {
  int out[1024];
  CgCudaArgs a = {.b = {out}};
  run_refused(E, "k_divergent_sync", 2, 64, &a, "divergent __syncthreads");
  run_refused(E, "k_partial_warp", 1, 64, &a, "warp shuffle reached by 16 lanes");
  run_refused(E, "k_deadlock", 1, 64, &a, "deadlock");
  run_refused(E, "k_partial_mask", 1, 32, &a, "partial mask");
  run_refused(E, "k_two_barriers", 1, 64, &a, "threads reach different __syncthreads (thread 0 at line");
  run_refused(E, "k_two_shuffles", 1, 32, &a, "threads reach different warp shuffles (thread 0 at line");
  /* each block starts with its shared memory poisoned */
  for (int i = 0; i < 128; i++) out[i] = 12345;
  CHECK(run("k_shared_unwritten", 2, 64, &a) == 0, "k_shared_unwritten did not run");
  int poisoned = 0;
  for (int i = 0; i < 128; i++) poisoned += out[i] == -1;
  CHECK(poisoned == 128, "%d of 128 reads of unwritten shared memory saw the poison (-1): block 1 saw %d", poisoned,
        out[64]);
  static const int bad_threads[] = {0, 16, 48, 1056, 2048, -32};
  for (size_t i = 0; i < sizeof bad_threads / sizeof *bad_threads; i++)
    run_refused(E, "k_builtins", 1, bad_threads[i], &a, "threads per block");
  run_refused(E, "k_builtins", 0, 32, &a, "blocks");
  run_refused(E, "k_builtins", 1LL << 31, 32, &a, "blocks");
  run_refused(E, "no_such_kernel", 1, 32, &a, "unknown kernel 'no_such_kernel'");
  run_refused(E, "printf", 1, 32, &a, "unknown kernel 'printf'");          /* in libc, not in the module */
  run_refused(E, "ts_emu_launch", 1, 32, &a, "unknown kernel");
  t_builtins();   /* the module still works after the failed launches (abandoned workers were reset) */

  /* compile errors come back with the compiler's message and the line; the
   * temporary directory is left empty */
  char tmpd[] = "/tmp/ts_emu_test_XXXXXX";
  if (!mkdtemp(tmpd)) { CHECK(0, "mkdtemp"); return; }
  const char *old = getenv("TMPDIR");
  char *saved = old ? strdup(old) : NULL;
  setenv("TMPDIR", tmpd, 1);
  char err[4096] = "";
  TsEmu *e = ts_emu_load("extern \"C\" __global__ void k(TsArgs a) {\n  int x = ;\n}\n", err, sizeof err);
  CHECK(!e && strstr(err, "module.cu:2") && strstr(err, "error") && !strstr(err, tmpd),
        "a syntax error: want the compiler's error at module.cu:2, got '%s'", err);
  printf("  compile error as expected: %s\n", err);
  err[0] = 0;
  e = ts_emu_load("extern \"C\" __global__ void k(TsArgs a) {\n  extern __shared__ float dyn[];\n  dyn[0] = 1;\n}\n",
                  err, sizeof err);
  CHECK(!e && strstr(err, "module.cu:2"), "dynamic shared memory must not compile, got '%s'", err);
  CHECK(dir_entries(tmpd) == 0, "the temporary directories were not removed after failed compiles (%d left)",
        dir_entries(tmpd));
  /* two modules at once: separate statics, launches interleave */
  TsEmu *e2 = ts_emu_load("extern \"C\" __global__ void k_one(TsArgs a) { ((int *)a.b[0])[threadIdx.x] = 1; }\n",
                          err, sizeof err);
  CHECK(e2 != NULL, "loading a second module: %s", err);
  CHECK(dir_entries(tmpd) == 0, "a loaded module left %d files in its temporary directory", dir_entries(tmpd));
  if (e2) {
    memset(out, 0, sizeof out);
    CgCudaLaunch l = launch_of("k_one", 1, 64);
    CHECK(ts_emu_launch_kernel(e2, &l, &a, err, sizeof err) == 0 && out[0] == 1 && out[63] == 1 && out[64] == 0,
          "second module's kernel: %s", err);
    run_refused(e2, "k_builtins", 1, 32, &a, "unknown kernel");   /* the other module's kernel */
    t_builtins();
    ts_emu_free(e2);
  }
  if (saved) {
    setenv("TMPDIR", saved, 1);
    free(saved);
  } else {
    unsetenv("TMPDIR");
  }
  rmdir(tmpd);
  /* a compiler that does not exist */
  setenv("TS_EMU_CXX", "/nonexistent/c++", 1);
  e = ts_emu_load("", err, sizeof err);
  CHECK(!e && strstr(err, "cannot run the C++ compiler"), "missing compiler: got '%s'", err);
  unsetenv("TS_EMU_CXX");
}

/* ---- the module prelude of codegen/cuda.c compiles under the header and a kernel after it runs ---- */
static void t_prelude(void) {
  StrBuf sb = {0};
  sb_puts(&sb, cg_cuda_prelude());
  sb_puts(&sb, "extern \"C\" __global__ void k_after_prelude(TsArgs a) {\n"
               "  ((long long *)a.b[0])[blockIdx.x * blockDim.x + threadIdx.x] = a.run[3] * 1000 + threadIdx.x;\n"
               "}\n");
  char err[4096];
  TsEmu *e = ts_emu_load(sb.p, err, sizeof err);
  sb_free(&sb);
  CHECK(e != NULL, "the prelude does not compile under the emulation header: %s", err);
  if (!e) return;
  long long out[128], run_blk[CG_RUN_WORDS] = {0, 0, 0, 7};
  CgCudaArgs a = {.b = {out}, .run = run_blk};
  CgCudaLaunch l = launch_of("k_after_prelude", 2, 64);
  int rc = ts_emu_launch_kernel(e, &l, &a, err, sizeof err);
  CHECK(rc == 0, "%s", err);
  for (int i = 0; rc == 0 && i < 128; i++) CHECK(out[i] == 7000 + i % 64, "thread %d wrote %lld", i, out[i]);
  ts_emu_free(e);
}

/* ---- WMMA: the emulator's nvcuda::wmma subset on a GEMM ----
 * C = A B^T (+ C) of 16-bit values against a double sum of the same
 * rounded values: the products are exact in float, so the only error is
 * float accumulation over K terms, within 1e-5 of sum |a b|; bf16 and
 * f16 operands, with and without C's load, a non-square shape with more
 * tiles than one block has warps; the row-major B tile; the refusals of
 * divergent pointers and a misaligned one. */
static void wmma_case(const char *kern, int f16, int M, int N, int K, int acc) {
  uint16_t *A = aligned_alloc(64, (size_t)M * K * 2 + 64), *B = aligned_alloc(64, (size_t)N * K * 2 + 64);
  float *C = aligned_alloc(64, (size_t)M * N * 4 + 64);
  double *want = malloc((size_t)M * N * sizeof *want), *mag = malloc((size_t)M * N * sizeof *mag);
  uint64_t r = 0x51ed2701u + (uint64_t)M * 131 + N * 7 + K + f16 * 3 + acc;
  for (int i = 0; i < M * K + N * K; i++) {
    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    float v = (float)((double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    uint16_t h = f16 ? ts_f32_to_f16(v) : ts_f32_to_bf16(v);
    if (i < M * K) A[i] = h;
    else B[i - M * K] = h;
  }
  for (int i = 0; i < M * N; i++) C[i] = acc ? (float)(i % 7) - 3.0f : 1e30f;   /* without acc: overwritten */
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = acc ? C[i * N + j] : 0, m = fabs(s);
      for (int k = 0; k < K; k++) {
        double x = f16 ? ts_f16_to_f32(A[i * K + k]) : ts_bf16_to_f32(A[i * K + k]);
        double y = f16 ? ts_f16_to_f32(B[j * K + k]) : ts_bf16_to_f32(B[j * K + k]);
        s += x * y;
        m += fabs(x * y);
      }
      want[i * N + j] = s;
      mag[i * N + j] = m;
    }
  long long run_blk[CG_RUN_WORDS] = {M, N, K, acc};
  CgCudaArgs a = {.b = {A, B, C}, .run = run_blk};
  int tiles = (M / 16) * (N / 16);
  double worst = 0;
  if (run(kern, (tiles + 3) / 4, 128, &a) == 0)
    for (int i = 0; i < M * N; i++) {
      double e = fabs(C[i] - want[i]) / mag[i];
      worst = e > worst ? e : worst;
      CHECK(e <= 1e-5, "%s %dx%dx%d acc=%d: C[%d][%d] = %.9g, want %.9g", kern, M, N, K, acc, i / N, i % N, C[i],
            want[i]);
    }
  printf("  %s %dx%dx%d acc=%d: max |C - ref| / sum|ab| = %.2e\n", kern, M, N, K, acc, worst);
  free(A), free(B), free(C), free(want), free(mag);
}

static void t_wmma(void) {
  wmma_case("k_wmma_bf16", 0, 16, 16, 16, 0);
  wmma_case("k_wmma_bf16", 0, 48, 80, 128, 0);
  wmma_case("k_wmma_bf16", 0, 32, 96, 64, 1);
  wmma_case("k_wmma_f16", 1, 64, 32, 112, 0);
  wmma_case("k_wmma_f16", 1, 16, 48, 32, 1);
  /* the row-major B tile, C stored column-major */
  uint16_t *A = aligned_alloc(64, 512), *B = aligned_alloc(64, 512);
  float *C = aligned_alloc(64, 1024);
  for (int i = 0; i < 256; i++) A[i] = ts_f32_to_bf16((float)(i % 13) - 6), B[i] = ts_f32_to_bf16((float)(i % 5) * 0.5f);
  CgCudaArgs a = {.b = {A, B, C}};
  if (run("k_wmma_rowb", 1, 32, &a) == 0)
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 16; j++) {
        double s = 0;
        for (int k = 0; k < 16; k++) s += (double)ts_bf16_to_f32(A[i * 16 + k]) * ts_bf16_to_f32(B[k * 16 + j]);
        CHECK(C[j * 16 + i] == s, "k_wmma_rowb: C[%d][%d] = %g, want %g (small integers: exact)", i, j, C[j * 16 + i], s);
      }
  run_refused(E, "k_wmma_divergent", 1, 32, &a, "with different pointers or ldm");
  run_refused(E, "k_wmma_misaligned", 1, 32, &a, "not 32-byte aligned");
  free(A), free(B), free(C);
}

/* ---- speed: many small launches, as a training step makes ---- */
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void t_speed(void) {
  enum { N = 4096, REPS = 2000 };
  double alpha = 0.5, *x = dalloc(N), *y = dalloc(N);
  long long run_blk[CG_RUN_WORDS] = {N};
  memcpy(&run_blk[1], &alpha, 8);
  for (int i = 0; i < N; i++) x[i] = i % 11, y[i] = i % 5;
  CgCudaArgs a = {.b = {x, y}, .run = run_blk};
  double t0 = now();
  for (int r = 0; r < REPS; r++)
    if (run("k_axpy", N / 256, 256, &a) != 0) break;
  double t1 = now();
  int bad = 0;
  for (int i = 0; i < N; i++) bad += y[i] != i % 5 + REPS * alpha * (i % 11);
  CHECK(bad == 0, "repeated axpy: %d elements wrong", bad);
  printf("  %d launches of 16 blocks x 256 threads (no barrier): %.3f ms each\n", REPS, (t1 - t0) * 1e3 / REPS);
  /* block reductions: 8 rows x 2048, 256 threads, 8 __syncthreads each */
  double *m = dalloc(8 * 2048), *sum = dalloc(8);
  float mx[8];
  for (int i = 0; i < 8 * 2048; i++) m[i] = i % 3;
  run_blk[0] = 2048;
  CgCudaArgs b = {.b = {m, sum, mx}, .run = run_blk};
  t0 = now();
  for (int r = 0; r < REPS / 4; r++)
    if (run("k_block_sum", 8, 256, &b) != 0) break;
  t1 = now();
  double ref7 = 0;
  for (int c = 0; c < 2048; c++) ref7 += m[7 * 2048 + c];
  CHECK(sum[7] == ref7, "block sum of row 7: %g, C %g", sum[7], ref7);
  printf("  %d launches of 8 blocks x 256 threads (8 barriers): %.3f ms each\n", REPS / 4,
         (t1 - t0) * 1e3 / (REPS / 4));
  /* warp shuffles: 6 types x 11 shuffles, 3 x 96 threads */
  t0 = now();
  for (int r = 0; r < 20; r++) t_shuffle();
  t1 = now();
  printf("  shuffle kernels: %.3f ms per set of 6 launches\n", (t1 - t0) * 1e3 / 20);
  free(x), free(y), free(m), free(sum);
}

/* ---- launches of one module from two OS threads at once (serialized by the module) ---- */
typedef struct {
  double *x, *sum;
  float mx[4];
  int bad;
} Job;
static void *job_main(void *p) {
  Job *j = p;
  long long run_blk[CG_RUN_WORDS] = {3000};
  CgCudaArgs a = {.b = {j->x, j->sum, j->mx}, .run = run_blk};
  for (int r = 0; r < 40; r++) {
    CgCudaLaunch l = launch_of("k_block_sum", 4, 128);
    char err[1024];
    if (ts_emu_launch_kernel(E, &l, &a, err, sizeof err) != 0) { j->bad++; continue; }
    for (int row = 0; row < 4; row++) {
      double ref = 0;
      for (int c = 0; c < 3000; c++) ref += j->x[row * 3000 + c];
      if (fabs(j->sum[row] - ref) > 1e-9 * (1 + fabs(ref))) j->bad++;
    }
  }
  return NULL;
}
static void t_threads(void) {
  Job jobs[2];
  pthread_t th[2];
  for (int k = 0; k < 2; k++) {
    jobs[k].x = dalloc(4 * 3000);
    jobs[k].sum = dalloc(4);
    jobs[k].bad = 0;
    for (int i = 0; i < 4 * 3000; i++) jobs[k].x[i] = (k + 1) * cos(i);
    pthread_create(&th[k], NULL, job_main, &jobs[k]);
  }
  for (int k = 0; k < 2; k++) {
    pthread_join(th[k], NULL);
    CHECK(jobs[k].bad == 0, "OS thread %d: %d wrong sums or failed launches", k, jobs[k].bad);
    free(jobs[k].x);
    free(jobs[k].sum);
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_emu KERNELS.cu TEST\n");
    return 2;
  }
  char *src = ts_read_file(argv[1], NULL);
  if (!src) {
    printf("FAIL: cannot read %s\n", argv[1]);
    return 1;
  }
  char err[4096];
  double t0 = now();
  E = ts_emu_load(src, err, sizeof err);
  free(src);
  if (!E) {
    printf("FAIL: %s\n", err);
    return 1;
  }
  printf("compiled the kernels in %.2f s\n", now() - t0);
  const char *t = argv[2];
  int all = strcmp(t, "all") == 0, known = all;
  struct { const char *name; void (*fn)(void); int in_all; } tests[] = {
    {"builtins", t_builtins, 1}, {"reduce", t_reduce, 1},     {"shuffle", t_shuffle, 1}, {"atomics", t_atomics, 1},
    {"vectors", t_vectors, 1},   {"math", t_math, 1},         {"bits", t_bits, 1},       {"refusals", t_refusals, 0},
    {"speed", t_speed, 0},       {"threads", t_threads, 0},   {"prelude", t_prelude, 0}, {"wmma", t_wmma, 1},
  };
  for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
    if ((all && tests[i].in_all) || strcmp(t, tests[i].name) == 0) {
      known = 1;
      int before = check_fails;
      tests[i].fn();
      printf("%s %s\n", check_fails == before ? "ok  " : "FAIL", tests[i].name);
    }
  ts_emu_free(E);
  if (!known) {
    printf("FAIL: unknown test %s\n", t);
    return 2;
  }
  return check_exit("test_emu");
}
