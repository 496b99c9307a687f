/* test_simtime.c - the cost model of plan/hw.c against hand-computed
 * figures, the description parser's errors, every shipped description
 * loading, and the pipeline simulator's 1F1B bubble on equal stages
 * ((p-1)/(m+p-1)).  argv[1]: the hw/ folder. */
#include "plan/hw.h"
#include "plan/schedule.h"
#include "tests/check.h"
#include <stdlib.h>

#include "toy_hw.h"

static void expect_error(const char *text, const char *want) {
  HwDesc h;
  char err[512] = "";
  int rc = hw_parse(text, "bad.hw", &h, err, sizeof err);
  CHECK(rc != 0, ": a damaged description was accepted (wanted '%s')", want);
  CHECK(strstr(err, want) != NULL, ": error '%s', wanted it to contain '%s'", err, want);
}

/* toy with line `line` (1-based) replaced by `repl` */
static char *toy_with(int line, const char *repl) {
  StrBuf b = {0};
  int ln = 1;
  for (const char *p = toy; *p;) {
    const char *e = strchr(p, '\n');
    if (ln == line) sb_printf(&b, "%s\n", repl);
    else sb_printf(&b, "%.*s\n", (int)(e - p), p);
    p = e + 1;
    ln++;
  }
  return b.p;
}

int main(int argc, char **argv) {
  HwDesc h;
  char err[512];
  CHECK(hw_parse(toy, "toy.hw", &h, err, sizeof err) == 0, ": %s", err);

  /* ---- collectives: alpha-beta by hand ---- */
  /* NVLink inside the node: B = 400e9 * 0.5 = 200e9, a = 1e-6 */
  HwLink in = hw_link(&h, 8, 1);
  CHECK(!in.inter && in.bw == 200e9 && in.latency == 1e-6);
  /* ring all_reduce of 1 GB over 8: 2*7*1e-6 + 2*7/8*1e9/200e9 = 14e-6 + 8.75e-3;
   * tree: 2*3*1e-6 + 2e9/200e9 = 6e-6 + 10e-3: ring wins */
  CHECK_NEAR(hw_coll_time(&in, HW_ALL_REDUCE, 8, 1e9), 8.764e-3, 1e-12, "");
  /* 8 bytes: ring 14e-6 + 7e-11, tree 6e-6 + 8e-11: tree wins */
  CHECK_NEAR(hw_coll_time(&in, HW_ALL_REDUCE, 8, 8), 6e-6 + 8e-11, 1e-12, "");
  /* all_gather of 1 GB over 8: 7e-6 + 7/8 * 5e-3 */
  CHECK_NEAR(hw_coll_time(&in, HW_ALL_GATHER, 8, 1e9), 7e-6 + 4.375e-3, 1e-12, "");
  CHECK_NEAR(hw_coll_time(&in, HW_REDUCE_SCATTER, 2, 1e9), 1e-6 + 2.5e-3, 1e-12, "");
  CHECK_NEAR(hw_coll_time(&in, HW_SEND, 2, 1e9), 1e-6 + 5e-3, 1e-12, "");
  CHECK(hw_coll_time(&in, HW_ALL_REDUCE, 1, 1e9) == 0, ": one rank communicates nothing");
  /* across nodes: 4 NICs of 50e9 shared by 8 GPUs = 25e9 per GPU, a = 10e-6 */
  HwLink out = hw_link(&h, 4, 8);     /* dp of 4 over tp = 8: every member on another node */
  CHECK(out.inter && out.bw == 25e9 && out.latency == 10e-6);
  CHECK_NEAR(hw_coll_time(&out, HW_ALL_GATHER, 4, 1e9), 3 * 10e-6 + 0.75 * 1e9 / 25e9, 1e-12, "");
  CHECK(hw_link(&h, 4, 4).inter, ": 4 members 4 apart span 16 ranks, two nodes of 8");
  CHECK(!hw_link(&h, 2, 4).inter, ": 2 members 4 apart stay in a node of 8");

  /* ---- GEMMs: 2 MNK / (peak * eff * waves), or memory-bound ---- */
  /* 4096^3: units 32*32*16 = 16384 = 4096 waves of 4 SMs exactly: 2*4096^3 / 50e12 */
  CHECK_NEAR(hw_gemm_time(&h, HW_FP32, 1, 4096, 4096, 4096, 4), 2.0 * 4096 * 4096 * 4096 / 50e12, 1e-12, "");
  /* one unit on 4 SMs: a quarter of the machine: 2*128*128*256 / (50e12 / 4) */
  double one = 2.0 * 128 * 128 * 256 / 12.5e12;
  CHECK_NEAR(hw_gemm_time(&h, HW_FP32, 1, 128, 128, 256, 4), one, 1e-12, "");
  /* batch 4 of them: one full wave, the same time */
  CHECK_NEAR(hw_gemm_time(&h, HW_FP32, 4, 128, 128, 256, 4), one, 1e-12, "");
  /* 5 units: two waves for 5/8 of the work: 2*5*128*128*256 / (50e12 * 5/8) */
  CHECK_NEAR(hw_gemm_time(&h, HW_FP32, 5, 128, 128, 256, 4), 2.0 * 5 * 128 * 128 * 256 / (50e12 * 5 / 8), 1e-12, "");
  /* a matrix-vector product is memory-bound: (M K + K N + M N) * 4 bytes / (20e12 * 0.5) */
  double M = 8192, K = 8192, N = 1;
  CHECK_NEAR(hw_gemm_time(&h, HW_FP32, 1, M, N, K, 4), (M * K + K * N + M * N) * 4 / 1e13, 1e-12, "");
  /* memory-bound kernels: bytes / (20e12 * 0.5) */
  CHECK_NEAR(hw_mem_time(&h, 3e9), 3e-4, 1e-12, "");
  /* attention: FLOPs / (100e12 * 0.25) */
  CHECK_NEAR(hw_attention_time(&h, HW_FP32, 25e12, 1e6), 1.0, 1e-12, "");
  /* a format without a peak computes at fp32's */
  CHECK_NEAR(hw_gemm_time(&h, HW_BF16, 1, 4096, 4096, 4096, 2), 2.0 * 4096 * 4096 * 4096 / 100e12, 1e-12,
             ": gemm_efficiency of a format not given is 1, its peak fp32's");
  CHECK(hw_format_of(IR_F32, 0) == HW_FP32 && hw_format_of(IR_F32, 1) == HW_TF32 && hw_format_of(IR_F64, 0) == HW_FP64);

  /* ---- damaged descriptions: file:line errors ---- */
  char *t;
  expect_error(t = toy_with(3, "peak fp32 lots"), "bad.hw:3: error: 'peak fp32' needs one non-negative number");
  free(t);
  expect_error(t = toy_with(7, "hbm_bandwith 2e12"), "bad.hw:7: error: unknown key 'hbm_bandwith'");
  free(t);
  expect_error(t = toy_with(9, "sms 4.5"), "bad.hw:9: error: 'sms' must be a whole number");
  free(t);
  expect_error(t = toy_with(17, "nvlink_efficiency 1.5"), "bad.hw:17: error: 'nvlink_efficiency' is a fraction");
  free(t);
  expect_error(t = toy_with(4, "peak fp32 1e12"), "bad.hw:4: error: 'peak fp32' is given twice");
  free(t);
  expect_error(t = toy_with(3, "peak fp7 1e12"), "bad.hw:3: error: 'peak' needs a format");
  free(t);
  expect_error(t = toy_with(12, "# gemm_tile_k removed"), "error: the key 'gemm_tile_k' is missing");
  free(t);

  /* ---- the shipped descriptions ---- */
  if (argc > 1) setenv("TESSERA_HW", argv[1], 1);
  const char *names[] = {"a100-80gb", "h100-sxm", "h200", "b200"};
  for (int i = 0; i < 4; i++) {
    HwDesc d;
    CHECK(hw_load(names[i], &d, err, sizeof err) == 0, ": %s", err);
    CHECK(!strcmp(d.name, names[i]), ": %s names itself '%s'", names[i], d.name);
    CHECK(d.peak[HW_BF16] > 8 * d.peak[HW_FP32] && d.peak[HW_TF32] > 0 && d.gpus_per_node == 8, ": %s", names[i]);
    CHECK(d.nvlink_bw > d.nic_bw && d.hbm_bw > d.nvlink_bw, ": %s", names[i]);
  }
  HwDesc d;
  CHECK(hw_load("no-such-gpu", &d, err, sizeof err) != 0 && strstr(err, "h200"), ": %s", err);

  /* ---- 1F1B on equal stages: bubble = (p-1)/(m+p-1) of the makespan ---- */
  for (int pp = 2; pp <= 4; pp++) {
    int m = 8;
    PipeSchedule s;
    memset(&s, 0, sizeof s);
    CHECK(plan_pipe_schedule(PIPE_1F1B, pp, 1, m, &s, err, sizeof err) == 0, ": %s", err);
    double f[4] = {1e-3, 1e-3, 1e-3, 1e-3}, b[4] = {2.5e-3, 2.5e-3, 2.5e-3, 2.5e-3};
    PipeTimeline tl;
    CHECK(plan_pipe_simulate_fb(&s, f, b, 2, &tl, err, sizeof err) == 0, ": %s", err);
    CHECK_NEAR(tl.makespan, (m + pp - 1) * 3.5e-3, 1e-9, ": pp=%d", pp);
    CHECK_NEAR(tl.idle[0] / tl.makespan, (double)(pp - 1) / (m + pp - 1), 1e-9, ": pp=%d", pp);
    plan_pipe_timeline_free(&tl);
    plan_pipe_schedule_free(&s);
  }
  return check_exit("simtime.model");
}
