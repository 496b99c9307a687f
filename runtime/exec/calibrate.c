/* calibrate.c - the measured description of this host's CPU ranks
 * (calibrate.h).  Everything is timed as the median of a few repetitions,
 * each long enough (>= 20 ms) for the clock. */
#include "calibrate.h"
#include "rt.h"
#include "ir/util.h"
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median over 5 runs of the seconds one call of fn takes, each run
 * repeating it until 20 ms have passed. */
typedef void (*TimedFn)(void *ctx);
static double timed(TimedFn fn, void *ctx) {
  double runs[5];
  fn(ctx);   /* warm: pages, caches, BLAS buffers */
  for (int r = 0; r < 5; r++) {
    int n = 0;
    double t0 = ts_now_s(), t;
    do { fn(ctx); n++; } while ((t = ts_now_s() - t0) < 0.02);
    runs[r] = t / n;
  }
  qsort(runs, 5, sizeof *runs, cmp_d);
  return runs[2];
}

typedef struct { int n, f64; void *a, *b, *c; } Gemm;
static void gemm_run(void *p) {
  Gemm *g = p;
  if (g->f64) cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0, g->a, g->n, g->b, g->n, 0.0,
                          g->c, g->n);
  else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f,
                   g->c, g->n);
}

/* Fits t = o + F / R over square GEMMs: *rate = R (FLOP/s), *over = o (s). */
static void gemm_fit(int f64, double *rate, double *over, FILE *log) {
  static const int sizes[] = {96, 192, 384, 768};
  enum { NS = sizeof sizes / sizeof sizes[0] };
  double F[NS], T[NS];
  size_t es = f64 ? 8 : 4;
  for (int i = 0; i < NS; i++) {
    int n = sizes[i];
    Gemm g = {n, f64, ts_xmalloc((size_t)n * n * es), ts_xmalloc((size_t)n * n * es), ts_xmalloc((size_t)n * n * es)};
    for (size_t k = 0; k < (size_t)n * n; k++) {
      if (f64) { ((double *)g.a)[k] = 1.0 / (double)(k % 7 + 1); ((double *)g.b)[k] = (double)(k % 5) - 2; }
      else { ((float *)g.a)[k] = 1.0f / (float)(k % 7 + 1); ((float *)g.b)[k] = (float)(k % 5) - 2; }
    }
    F[i] = 2.0 * n * n * n;
    T[i] = timed(gemm_run, &g);
    if (log) fprintf(log, "calibrate: %s GEMM %d^3: %.1f us, %.2f GFLOP/s\n", f64 ? "f64" : "f32", n, T[i] * 1e6,
                     F[i] / T[i] / 1e9);
    free(g.a);
    free(g.b);
    free(g.c);
  }
  /* least squares of T = o + F * (1/R) */
  double sf = 0, st = 0, sff = 0, sft = 0;
  for (int i = 0; i < NS; i++) { sf += F[i]; st += T[i]; sff += F[i] * F[i]; sft += F[i] * T[i]; }
  double slope = (NS * sft - sf * st) / (NS * sff - sf * sf), o = (st - slope * sf) / NS;
  if (!(slope > 0)) slope = T[NS - 1] / F[NS - 1];
  *rate = 1.0 / slope;
  *over = o > 1e-7 ? o : 1e-7;
}

typedef struct { size_t n; double *a, *b, *c; } Triad;
static void triad_run(void *p) {
  Triad *t = p;
  for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 0.5 * t->c[i];
}

/* Ping-pong between group ranks 0 and 1 of `count` doubles: the seconds of
 * one way (half the round trip), median of 5 runs. */
static int pingpong(RtComm *w, size_t count, double *oneway, char *err, size_t errlen) {
  int me = rt_comm_rank(w);
  double *buf = ts_xcalloc(count ? count : 1, sizeof *buf), runs[5];
  int reps = count > 1024 ? 20 : 2000, rc = 0;
  for (int r = -1; r < 5 && rc == 0; r++) {   /* r = -1: warm-up */
    if (rt_comm_barrier(w, err, errlen) != 0) { rc = -1; break; }
    double t0 = ts_now_s();
    for (int k = 0; k < reps && rc == 0; k++) {
      if (me == 0) {
        rc = rt_comm_send(w, IR_F64, buf, count, 1, 7, err, errlen);
        if (rc == 0) rc = rt_comm_recv(w, IR_F64, buf, count, 1, 8, err, errlen);
      } else if (me == 1) {
        rc = rt_comm_recv(w, IR_F64, buf, count, 0, 7, err, errlen);
        if (rc == 0) rc = rt_comm_send(w, IR_F64, buf, count, 0, 8, err, errlen);
      }
    }
    if (r >= 0) runs[r] = (ts_now_s() - t0) / reps / 2;
  }
  free(buf);
  if (rc != 0) return -1;
  qsort(runs, 5, sizeof *runs, cmp_d);
  *oneway = runs[2];
  return 0;
}

/* ---- the executor's own kernels, on an IR module of calibration blocks ----
 * attn: a causal fused attention and its backward (B 2, H 8, T 256, D 64):
 *       its FLOPs as the cost model counts them (forward 4, backward
 *       6 + 6 + 4 units of B H T^2 D, half of it under the causal mask);
 * ew:   the row and elementwise kernels of a transformer layer, each alone
 *       over [2048, 512]: layernorm and its backward, gelu_tanh and its
 *       backward, softmax, an add; bytes as the model counts them (operands
 *       in, the result out). */
#define CAL_ATT_B 2
#define CAL_ATT_H 8
#define CAL_ATT_T 256
#define CAL_ATT_D 64
#define CAL_EW_R 2048
#define CAL_EW_C 512

static char *cal_module(const char *dt) {
  StrBuf t = {0};
  char a[64], g[64], r[64];
  snprintf(a, sizeof a, "%s[%d, %d, %d, %d]", dt, CAL_ATT_B, CAL_ATT_H, CAL_ATT_T, CAL_ATT_D);
  snprintf(r, sizeof r, "%s[%d, %d]", dt, CAL_EW_R, CAL_EW_C);
  snprintf(g, sizeof g, "scale=%.17g", 1.0 / sqrt((double)CAL_ATT_D));
  sb_printf(&t, "module calibrate_%s\ntrain lr=0.01 seed=1 precision=%s\nparallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n", dt, dt);
  static const char *const an[] = {"q", "k", "v", "do", "o0", "o1", "o2", "o3"};
  for (int i = 0; i < 8; i++) sb_printf(&t, "state @a.%s : %s param init=normal(0.0, 1.0)\n", an[i], a);
  static const char *const en[] = {"x", "y", "dy", "e0", "e1", "e2", "e3", "e4"};
  for (int i = 0; i < 8; i++) sb_printf(&t, "state @e.%s : %s param init=normal(0.0, 1.0)\n", en[i], r);
  sb_printf(&t, "state @e.gain : %s param init=zeros\n", r);
  sb_printf(&t, "block attn {\n"
                "  %%0 = state @a.q : %s\n  %%1 = state @a.k : %s\n  %%2 = state @a.v : %s\n  %%3 = state @a.do : %s\n"
                "  %%4 = attention %%0, %%1, %%2 causal=1 window=0 alibi=0 bias=0 %s : %s\n  accum %%4 @a.o0\n",
            a, a, a, a, g, a);
  for (int part = 0; part < 3; part++)
    sb_printf(&t, "  %%%d = attention_bwd %%0, %%1, %%2, %%4, %%3 causal=1 part=%d window=0 alibi=0 bias=0 %s : %s\n  accum %%%d @a.o%d\n",
              6 + 2 * part, part, g, a, 6 + 2 * part, part + 1);
  sb_printf(&t, "}\nblock ew {\n"
                "  %%0 = state @e.x : %s\n  %%1 = state @e.y : %s\n  %%2 = state @e.dy : %s\n"
                "  %%3 = layernorm_bwd %%0, %%2 eps=1e-05 : %s\n  accum %%3 @e.gain\n"
                "  %%5 = layernorm %%0 eps=1e-05 : %s\n  accum %%5 @e.e0\n"
                "  %%7 = gelu_tanh %%0 : %s\n  accum %%7 @e.e1\n"
                "  %%9 = gelu_tanh_bwd %%0, %%2 : %s\n  accum %%9 @e.e2\n"
                "  %%11 = softmax %%1 : %s\n  accum %%11 @e.e3\n"
                "  %%13 = add %%0, %%1 : %s\n  accum %%13 @e.e4\n}\nend\n",
            r, r, r, r, r, r, r, r, r);
  return t.p;
}

typedef struct { RtProgram *p; int b; } BlockRun;
static void block_run(void *ctx) {
  BlockRun *r = ctx;
  RtRunInfo info = {.step = 1, .micro = 0, .lr = 0.01, .last = 0};
  char err[256];
  if (rt_run_block(r->p, r->b, NULL, 0, &info, err, sizeof err) != 0) TS_DIE("calibrate: %s", err);
}

/* The seconds of block attn and block ew in dtype dt (their accums
 * included: a few percent of either). */
static int cal_kernels(const char *dt, double *t_attn, double *t_ew, char *err, size_t errlen) {
  char *text = cal_module(dt);
  IrModule *m = ir_parse_module(text, "<calibrate>", err, errlen);
  free(text);
  if (!m) return -1;
  RtRank rank = rt_rank_single();
  RtExecOpts o = {.backend = RT_BACKEND_LLVM, .threads = 1};
  RtProgram *p = rt_program_new_opts(m, &rank, &o, err, errlen);
  if (!p) { ir_module_free(m); return -1; }
  BlockRun ra = {p, ir_block_find(m, "attn")}, re = {p, ir_block_find(m, "ew")};
  *t_attn = timed(block_run, &ra);
  *t_ew = timed(block_run, &re);
  rt_program_free(p);
  ir_module_free(m);
  return 0;
}

/* FLOPs of block attn as the cost model counts them (passes/timereport.c). */
static double cal_attn_flops(void) {
  double s = (double)CAL_ATT_B * CAL_ATT_H * CAL_ATT_T * CAL_ATT_T * CAL_ATT_D;
  return (4 + 6 + 6 + 4) * s * 0.5;
}
/* Bytes of block ew as the model counts them: each kernel's operands and
 * result (layernorm's gain and bias too), es bytes per element. */
static double cal_ew_bytes(size_t es) {
  double x = (double)CAL_EW_R * CAL_EW_C * (double)es;
  return (2 * x + x) + (x + x) + (x + x) + (2 * x + x) + (x + x) + (2 * x + x);
}

static double host_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  return pages > 0 && psize > 0 ? (double)pages * (double)psize : 8e9;
}

/* An efficiency as the format takes it: (0, 1].  A kernel can beat the
 * GEMM fit's peak or the triad's bandwidth when the machine's load changed
 * between the measurements; then it is the peak. */
static double eff(double e) { return e > 1 ? 1 : e > 1e-4 ? e : 1e-4; }

int rt_calibrate(RtComm *w, StrBuf *out, FILE *log, char *err, size_t errlen) {
  int me = w ? rt_comm_rank(w) : 0, n = w ? rt_comm_size(w) : 1;
  double r64 = 0, o64 = 0, r32 = 0, o32 = 0, bw = 0, lat = 0, lbw = 0;
  openblas_set_num_threads(1);   /* one rank of several: one thread (mrun sets the same for its ranks) */
  if (me == 0) {
    gemm_fit(1, &r64, &o64, log);
    gemm_fit(0, &r32, &o32, log);
    Triad t = {(size_t)4 << 20, NULL, NULL, NULL};   /* 3 x 32 MiB */
    t.a = ts_xmalloc(t.n * sizeof(double));
    t.b = ts_xmalloc(t.n * sizeof(double));
    t.c = ts_xmalloc(t.n * sizeof(double));
    for (size_t i = 0; i < t.n; i++) { t.a[i] = 0; t.b[i] = (double)(i % 11); t.c[i] = (double)(i % 3); }
    double tt = timed(triad_run, &t);
    bw = 3.0 * (double)t.n * sizeof(double) / tt;
    if (log) fprintf(log, "calibrate: triad over 3 x %zu MiB: %.2f GB/s\n", t.n * sizeof(double) >> 20, bw / 1e9);
    free(t.a);
    free(t.b);
    free(t.c);
  }
  /* the executor's kernels, every rank at once (as they run in training:
   * sharing the memory bandwidth and the caches); rank 0's figures */
  double ta32 = 0, te32 = 0, ta64 = 0, te64 = 0;
  if (w && rt_comm_barrier(w, err, errlen) != 0) return -1;
  if (cal_kernels("f32", &ta32, &te32, err, errlen) != 0 || cal_kernels("f64", &ta64, &te64, err, errlen) != 0) return -1;
  if (w && rt_comm_barrier(w, err, errlen) != 0) return -1;
  if (me == 0 && log)
    fprintf(log, "calibrate: fused attention fwd+bwd f32 %.2f ms (%.2f GFLOP/s), f64 %.2f ms (%.2f GFLOP/s); "
            "row/elementwise kernels f32 %.2f ms (%.2f GB/s), f64 %.2f ms (%.2f GB/s)%s\n",
            ta32 * 1e3, cal_attn_flops() / ta32 / 1e9, ta64 * 1e3, cal_attn_flops() / ta64 / 1e9, te32 * 1e3,
            cal_ew_bytes(4) / te32 / 1e9, te64 * 1e3, cal_ew_bytes(8) / te64 / 1e9, n > 1 ? ", all ranks at once" : "");
  if (n > 1) {
    double small, big;
    const size_t bigc = (size_t)1 << 19;   /* 4 MiB of doubles */
    if (pingpong(w, 1, &small, err, errlen) != 0 || pingpong(w, bigc, &big, err, errlen) != 0) return -1;
    lat = small;
    lbw = (double)bigc * sizeof(double) / (big - small > 0 ? big - small : big);
    if (me == 0 && log)
      fprintf(log, "calibrate: ping-pong ranks 0-1: 8 bytes %.2f us one way, 4 MiB %.2f GB/s\n", lat * 1e6, lbw / 1e9);
  }
  if (me != 0) return 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  char host[64] = "host";
  gethostname(host, sizeof host - 1);
  sb_printf(out, "# This host's CPU ranks, measured by `mrun --calibrate` (runtime/exec/calibrate.c):\n"
                 "# one \"GPU\" is one rank as mrun runs it with more than one rank (one thread:\n"
                 "# OPENBLAS_NUM_THREADS=1, TS_THREADS=1).  Measured on %s, %ld cores, %d rank%s.\n",
            host, cores, n, n == 1 ? "" : "s");
  sb_printf(out, "name cpu-measured\n");
  sb_printf(out, "peak fp64 %.4g        # MEASURED: least squares of t = o + F/R over dgemm 96..768^3 (R)\n", r64);
  sb_printf(out, "peak fp32 %.4g        # MEASURED: the same over sgemm\n", r32);
  sb_printf(out, "gemm_efficiency fp64 1        # the peak above is what a large GEMM reaches here\n");
  sb_printf(out, "gemm_efficiency fp32 1\n");
  sb_printf(out, "attention_efficiency fp64 %.4g  # MEASURED: a causal fused attention + backward, B 2 H 8 T 256 D 64, "
                 "its FLOPs / time / peak fp64\n", eff(cal_attn_flops() / ta64 / r64));
  sb_printf(out, "attention_efficiency fp32 %.4g  # MEASURED: the same in f32\n", eff(cal_attn_flops() / ta32 / r32));
  sb_printf(out, "hbm_bytes %.4g        # the host's memory / its cores\n", host_memory() / (double)cores);
  sb_printf(out, "hbm_bandwidth %.4g    # MEASURED: one thread's triad a = b + s c over 3 x 32 MiB\n", bw);
  /* what the generated row / elementwise kernels reach of it: the model
   * costs every kernel that is not a GEMM or attention by its bytes */
  double mem_e = eff(cal_ew_bytes(4) / te32 / bw);
  sb_printf(out, "memory_efficiency %.4g    # MEASURED: layernorm, gelu_tanh (+ backward), softmax and add, f32 [2048, 512] "
                 "each, bytes in + out / time, over the triad's bandwidth (they compute in f64: more than memory)\n", mem_e);
  sb_printf(out, "sms 1                 # one thread: no wave quantization\n");
  sb_printf(out, "gemm_tile_m 1\ngemm_tile_n 1\ngemm_tile_k 1000000\n");
  double over = o64 > o32 ? o32 : o64;
  sb_printf(out, "kernel_overhead %.4g  # MEASURED: the fit's intercept (the smaller of f64 and f32)\n", over);
  sb_printf(out, "gpus_per_node %ld      # the ranks one host runs with a core each\n", cores);
  if (n > 1) {
    sb_printf(out, "nvlink_bandwidth %.4g # MEASURED: MPI ping-pong of 4 MiB between ranks 0 and 1\n", lbw);
    sb_printf(out, "nvlink_latency %.4g   # MEASURED: MPI ping-pong of 8 bytes, one way\n", lat);
  } else {
    sb_printf(out, "nvlink_bandwidth %.4g # ASSUMED: the memory bandwidth (one rank: no link measured)\n", bw / 2);
    sb_printf(out, "nvlink_latency 2e-6   # ASSUMED (one rank: no link measured)\n");
  }
  sb_printf(out, "nvlink_efficiency 1\n");
  sb_printf(out, "nics_per_node 1       # one host: the NICs are never used; as the link\n");
  /* a rank's share of the "node's NICs" is nic_bandwidth x nics / gpus_per_node: more ranks than cores */
  sb_printf(out, "nic_bandwidth %.4g\nnic_latency %.4g\nnic_efficiency 1\n", (n > 1 ? lbw : bw / 2) * (double)cores,
            n > 1 ? lat : 2e-6);
  return 0;
}
