/* test_emu_step - whole training steps of a plan through the CUDA path,
 * emulated: the same rank program trained on the CPU backend (LLVM) and on
 * the emulated device (tests/cuda/emu_dev.c: the generated CUDA C of every
 * kernel compiled by the host C++ compiler, GEMMs on the host BLAS), and
 * the per-step losses and final parameters compared.
 *   test_emu_step PLAN STEPS TOL
 * Fails if any loss or parameter differs by more than TOL (relative), if
 * the device path did not run (no kernel launches, no GEMMs), or if the
 * block "micro" was not replayed as a captured graph (unless
 * TS_CUDA_GRAPHS=0, which must give no replays). */
#include "runtime/exec/train.h"
#include "runtime/exec/rt.h"
#include "../cuda/emu_dev.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../cuda/read_losses.h"

static int train(const IrModule *m, RtDev *dev, const char *params, const char *metrics, RtTrainResult *res) {
  RtExecOpts o = {.backend = RT_BACKEND_LLVM, .threads = 1, .dev = dev};
  rt_exec_set_default(&o);
  RtTrainOpts to = {.quiet = 1, .metrics_path = metrics, .save_params_path = params};
  char err[1024];
  if (rt_train(m, &to, res, err, sizeof err) != 0) {
    printf("FAIL: training on %s: %s\n", dev ? "the emulated device" : "the CPU", err);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: test_emu_step PLAN STEPS TOL\n"); return 2; }
  char err[1024];
  Plan *plan = plan_read(argv[1], err, sizeof err);
  if (!plan) { printf("FAIL: %s\n", err); return 1; }
  if (plan->nprograms != 1 || plan->nranks != 1) { printf("FAIL: a single-rank plan is needed\n"); return 1; }
  IrModule *m = plan->programs[0];
  m->train.steps = atoi(argv[2]);
  double tol = atof(argv[3]);
  char dir[] = "/tmp/ts_emu_step_XXXXXX";
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  char pc[512], pd[512], mc[512], md[512];
  snprintf(pc, sizeof pc, "%s/cpu.params", dir);
  snprintf(pd, sizeof pd, "%s/dev.params", dir);
  snprintf(mc, sizeof mc, "%s/cpu.jsonl", dir);
  snprintf(md, sizeof md, "%s/dev.jsonl", dir);
  RtTrainResult rc, rd;
  RtDev *dev = ts_emu_dev_open();
  int fails = 0;
  if (train(m, NULL, pc, mc, &rc) != 0 || train(m, dev, pd, md, &rd) != 0) fails++;
  long long launches = 0, gemms = 0, replays = 0;
  ts_emu_dev_counts(dev, &launches, &gemms, &replays);
  const char *graphs = getenv("TS_CUDA_GRAPHS");
  int want_graphs = !(graphs && strcmp(graphs, "0") == 0);
  if (!fails) {
    double lc[1000], ld[1000];
    int nc = read_losses(mc, lc, 1000), nd = read_losses(md, ld, 1000);
    if (nc != m->train.steps || nd != nc) { printf("FAIL: %d and %d losses for %d steps\n", nc, nd, (int)m->train.steps); fails++; }
    double worst = 0;
    for (int i = 0; i < nc && i < nd; i++) {
      double e = fabs(lc[i] - ld[i]) / fmax(fabs(lc[i]), 1e-30);
      if (!(e <= worst)) worst = e;
      printf("step %d: loss cpu %.10f device %.10f rel %.2e\n", i, lc[i], ld[i], e);
    }
    if (!(worst <= tol)) { printf("FAIL: loss differs by %.3e > %.1e\n", worst, tol); fails++; }
    RtParams *a = rt_params_read(pc, err, sizeof err), *b = a ? rt_params_read(pd, err, sizeof err) : NULL;
    if (!a || !b) { printf("FAIL: %s\n", err); fails++; }
    else {
      char where[256];
      double e = rt_params_max_rel_diff(b, a, where, sizeof where);
      printf("parameters after %d steps: max rel diff %.3e (%s)\n", (int)m->train.steps, e, where);
      if (!(e >= 0 && e <= tol)) { printf("FAIL: parameters differ by %.3e > %.1e\n", e, tol); fails++; }
    }
    rt_params_free(a);
    rt_params_free(b);
    printf("device: %lld kernel launches, %lld GEMMs, %lld graph replays\n", launches, gemms, replays);
    if (launches == 0 || gemms == 0) { printf("FAIL: the device path did not run\n"); fails++; }
    /* micro runs 2, 3, ... replay the graph captured in run 2 */
    if (want_graphs != (replays > 0)) {
      printf("FAIL: %lld graph replays with TS_CUDA_GRAPHS=%s\n", replays, graphs ? graphs : "(unset)");
      fails++;
    }
  }
  unlink(pc); unlink(pd); unlink(mc); unlink(md);
  rmdir(dir);
  dev->ops->close(dev);
  plan_free(plan);
  printf("%s\n", fails ? "FAILED" : "ok");
  return fails ? 1 : 0;
}
