/* test_dp_time.c - `mcc --report time` with the overlapped dp gradient
 * reduction (passes/timereport.c over plan/dpreduce.h): the buckets run on
 * the comm stream during the last micro batch's run of the block that
 * completes them, and only what outlasts that run is exposed.  On a
 * hand-written module (micro: accum into grad.w, two 1024^3 GEMMs, accum
 * into grad.a; dp 2 without ZeRO) and the toy machine of toy_hw.h,
 * with buckets of one gradient each:
 *   - grad.w's bucket (4 MiB packed and all-reduced, 23 us) is issued
 *     before the GEMMs (86 us) and hidden; grad.a's, issued at the end, is
 *     exposed whole: the exposed dp time is exactly its packing (a copy at
 *     the memory's bandwidth) plus the all_reduce time of 4 MiB on the
 *     link (hw_coll_time); with one default bucket for both, all of it;
 *   - the update block then copies each gradient out of its bucket
 *     instead of reducing it: cheaper than the update without overlap;
 *   - the report has a "micro last" row (1 run) next to "micro" (1 run)
 *     and says that the reduction is in buckets;
 *   - with grad.a's accum moved before the GEMMs nothing is exposed;
 *   - with --no-overlap-grad-reduce (TimeDpOpts.overlap 0) the step is
 *     2 x micro + update as pass_time_block costs them, no "last" row. */
#include "passes/timereport.h"
#include "tests/check.h"
#include "toy_hw.h"
#include <math.h>
#include <stdlib.h>

/* micro: w's gradient complete at node 1; a's after the GEMMs (late = 1)
 * or before them (late = 0). */
static IrModule *module(int late) {
  StrBuf b = {0};
  sb_puts(&b, "module dp_time\n"
              "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 "
              "decay_steps=10 min_lr=0.0 clip_grad=1.0 global_batch=4 micro_batch=1 seq_len=4 steps=10 seed=1 "
              "precision=f32\n"
              "parallel tp=1 pp=1 cp=1 ep=1 dp=2 sp=0 zero=0\n"
              "state @w : f32[1048576] param init=ones\n"
              "state @a : f32[1024, 1024] param init=ones\n"
              "state @grad.w : f32[1048576] grad of=@w\n"
              "state @grad.a : f32[1024, 1024] grad of=@a\n"
              "block micro {\n"
              "  %0 = state @w : f32[1048576]\n"
              "  accum %0 @grad.w\n"
              "  %2 = state @a : f32[1024, 1024]\n");
  if (late)
    sb_puts(&b, "  %3 = matmul %2, %2 ta=0 tb=0 : f32[1024, 1024]\n"
                "  %4 = matmul %3, %3 ta=0 tb=0 : f32[1024, 1024]\n"
                "  accum %4 @grad.a\n"
                "}\nend\n");
  else
    sb_puts(&b, "  accum %2 @grad.a\n"
                "  %4 = matmul %2, %2 ta=0 tb=0 : f32[1024, 1024]\n"
                "  %5 = matmul %4, %4 ta=0 tb=0 : f32[1024, 1024]\n"
                "}\nend\n");
  char err[1024] = "";
  IrModule *m = ir_parse_module(b.p, "dp_time.ir", err, sizeof err);
  sb_free(&b);
  CHECK(m != NULL, ": parse: %s", err);
  if (!m) return NULL;
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_optimizer(m, &cx);
  CHECK(rc == 0, ": optimizer: %s", cx.err);
  pass_ctx_free(&cx);
  if (rc != 0) { ir_module_free(m); return NULL; }
  return m;
}

static double step_of(const char *text) {
  const char *p = text ? strstr(text, "step_time_s=") : NULL;
  return p ? atof(p + strlen("step_time_s=")) : -1;
}

static int near(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b) + 1e-15; }

int main(void) {
  HwDesc hw;
  char err[1024];
  CHECK(hw_parse(toy, "toy.hw", &hw, err, sizeof err) == 0, ": %s", err);
  HwLink l = hw_link(&hw, 2, 1);
  /* either gradient's bucket: packed (a copy at the memory's bandwidth), then all-reduced */
  double pack = 2 * 4.0 * 1048576 / hw.hbm_bw;
  double t4m = pack + hw_coll_time(&l, HW_ALL_REDUCE, 2, 4.0 * 1048576);
  HwFormat fmt = hw_format_of(IR_F32, 0);

  IrModule *m = module(1);
  if (!m) return check_exit("test_dp_time");
  /* the GEMMs after w's bucket outlast it (else the test shows nothing) */
  const IrBlock *mb = &m->blocks.a[ir_block_find(m, "micro")];
  TimeCost c = {0};
  pass_time_block(m, mb, &hw, fmt, &c);
  double t_micro = time_cost_total(&c);
  CHECK(c.comp[TIME_GEMM] > 2 * t4m, ": the GEMMs (%g s) should outlast w's bucket (%g s)", c.comp[TIME_GEMM], t4m);

  TimeDpOpts one = {1, 1};   /* buckets of >= 1 byte: one gradient each */
  TimePrediction p;
  IrModule *progs[1] = {m};
  StrBuf out = {0};
  CHECK(pass_time_report(progs, 1, &hw, 0, "dp=2", &one, &out, err, sizeof err) == 0, ": report: %s", err);
  CHECK(out.p && strstr(out.p, "  micro last      1 ") && strstr(out.p, "  micro           1 "),
        ": want rows 'micro' and 'micro last', one run each:\n%s", out.p ? out.p : "");
  CHECK(out.p && strstr(out.p, "dp gradient reduction in buckets posted during the last micro batch"),
        ": the header does not say how the reduction runs:\n%s", out.p ? out.p : "");
  /* exposed: a's bucket whole, w's hidden; all dp comm: both */
  const char *ex = out.p ? strstr(out.p, "exposed communication per step: dp ") : NULL;
  CHECK(ex != NULL, ": no exposed line");
  sb_free(&out);
  /* the figures (pass_time_predict: default buckets, here one for both
   * gradients, issued at the end: both exposed) */
  CHECK(pass_time_predict(progs, 1, &hw, 0, &p, err, sizeof err) == 0, ": predict: %s", err);
  double both = 2 * pack + hw_coll_time(&l, HW_ALL_REDUCE, 2, 8.0 * 1048576);
  CHECK(near(p.comm[IR_AXIS_DP], both, 1e-9), ": one bucket at the end: exposed dp %.6g s, want %.6g s (all of it)",
        p.comm[IR_AXIS_DP], both);

  /* the same through the report's text with one gradient per bucket: the
   * step is micro + (micro + a's bucket) + update */
  const IrBlock *ub = &m->blocks.a[ir_block_find(m, "update")];
  StrBuf o2 = {0};
  CHECK(pass_time_report(progs, 1, &hw, 0, "dp=2", &one, &o2, err, sizeof err) == 0, ": %s", err);
  double step_on = step_of(o2.p);
  sb_free(&o2);
  /* the update with both gradients copied out of their buckets: its time
   * is step_on - 2 micro - t4m; it has no dp communication left */
  TimeDpOpts off = {0, 0};
  StrBuf o3 = {0};
  CHECK(pass_time_report(progs, 1, &hw, 0, "dp=2", &off, &o3, err, sizeof err) == 0, ": %s", err);
  double step_off = step_of(o3.p);
  CHECK(o3.p && !strstr(o3.p, "micro last") && strstr(o3.p, "(--no-overlap-grad-reduce)"),
        ": --no-overlap-grad-reduce: no 'last' row, and the header says so:\n%s", o3.p ? o3.p : "");
  sb_free(&o3);
  TimeCost cu = {0};
  pass_time_block(m, ub, &hw, fmt, &cu);
  double t_upd = time_cost_total(&cu);
  CHECK(near(step_off, 2 * t_micro + t_upd, 1e-5), ": no overlap: step %.6g s, want 2 x micro %.6g + update %.6g",
        step_off, t_micro, t_upd);
  CHECK(near(cu.comm_all[IR_AXIS_DP], 2 * (t4m - pack), 1e-9), ": the update block reduces both gradients without "
        "overlap: %.6g s of dp communication, want %.6g", cu.comm_all[IR_AXIS_DP], 2 * (t4m - pack));
  /* with overlap: micro + micro + a's bucket (w's hidden) + the update without its all_reduces */
  double upd_on = step_on - 2 * t_micro - t4m;
  CHECK(upd_on > 0 && upd_on < t_upd, ": with overlap the update (%.6g s) should be cheaper than without (%.6g s)",
        upd_on, t_upd);
  /* its compute: the update's compute plus the two copies out (read + write 4 MiB each at the
   * memory's 20 TB/s) */
  double copies = 2 * pack;
  double upd_comp = cu.comp[TIME_GEMM] + cu.comp[TIME_ATTN] + cu.comp[TIME_MEM];
  CHECK(near(upd_on, upd_comp + copies, 1e-4), ": update with overlap %.6g s, want its compute %.6g + copies %.6g",
        upd_on, upd_comp, copies);
  ir_module_free(m);

  /* both gradients complete before the GEMMs: both buckets hidden */
  m = module(0);
  if (m) {
    progs[0] = m;
    StrBuf o4 = {0};
    CHECK(pass_time_report(progs, 1, &hw, 0, "dp=2", &one, &o4, err, sizeof err) == 0, ": %s", err);
    CHECK(o4.p && strstr(o4.p, "exposed communication per step: dp 0 (of "), ": want nothing exposed:\n%s",
          o4.p ? o4.p : "");
    sb_free(&o4);
    ir_module_free(m);
  }
  return check_exit("test_dp_time");
}
