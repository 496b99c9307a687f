/* test_fuse.c - the fusion pass on a known snippet (which nodes fuse, which
 * values stay materialized), --no-fuse, the verifier's convexity check, and
 * the executor's LLVM backend on that snippet against the reference (also
 * with a group the code generator cannot lower: it falls back).
 * The whole-model equivalences (fused/unfused, ref/llvm on the samples)
 * are equiv.sh. */
#include "passes/passes.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include "../check.h"

/* x -> matmul + bias (group 1: a GEMM bias epilogue, BLAS with beta = 1),
 * gelu + layernorm (group 2), a matmul, then a residual add + exp + row
 * sum + neg (group 3: the sum is a trailing reduction, the neg another
 * output of the same rows).  %13 uses the sum from outside: group 3 is
 * closed, so %14 starts group 4.  sumsq never fuses with others; %17
 * cannot join the sumsq nodes. */
static const char *snippet =
    "module snippet\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=1.0 global_batch=2 micro_batch=2 seq_len=4 steps=1 seed=7 precision=f64\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0\n"
    "state @w : f64[6, 6] param init=normal(0.0, 0.5)\n"
    "state @b : f64[6] param init=uniform(-1.0, 1.0)\n"
    "block forward {\n"
    "  %0 = state @w : f64[6, 6]\n"
    "  %1 = state @b : f64[6]\n"
    "  %2 = input \"x\" : f64[2, 4, 6]\n"
    "  %3 = matmul %2, %0 ta=0 tb=0 : f64[2, 4, 6]\n"
    "  %4 = broadcast %1 : f64[2, 4, 6]\n"
    "  %5 = add %3, %4 : f64[2, 4, 6]\n"
    "  %6 = gelu_tanh %5 : f64[2, 4, 6]\n"
    "  %7 = layernorm %6 eps=1e-05 : f64[2, 4, 6]\n"
    "  %8 = matmul %7, %0 ta=0 tb=0 : f64[2, 4, 6]\n"
    "  %9 = add %8, %6 : f64[2, 4, 6]\n"
    "  %10 = exp %9 : f64[2, 4, 6]\n"
    "  %11 = sum %10 axis=2 keepdim=0 : f64[2, 4]\n"
    "  %12 = neg %10 : f64[2, 4, 6]\n"
    "  %13 = sumsq %11 : f64[]\n"
    "  %14 = mul %12, %12 : f64[2, 4, 6]\n"
    "  %15 = adds %14 c=1.0 : f64[2, 4, 6]\n"
    "  %16 = sumsq %15 : f64[]\n"
    "  %17 = add %13, %16 : f64[]\n"
    "  output \"loss\" %17\n"
    "}\n"
    "end\n";

static const int want_group[] = {0, 0, 0, 1, 1, 1, 2, 2, 0, 3, 3, 3, 3, 0, 4, 4, 0, 0, 0};

static IrModule *parse(void) {
  char err[512];
  IrModule *m = ir_parse_module(snippet, "<snippet>", err, sizeof err);
  if (!m) { printf("parse: %s\n", err); exit(1); }
  return m;
}

/* The block's loss under backend `be` (no_groups: LLVM with every node alone). */
static double run(const IrModule *m, RtBackend be, int no_groups, RtExecStats *st) {
  double x[48];
  for (int i = 0; i < 48; i++) x[i] = sin(0.7 * i + 0.3) * 1.5;
  RtFeed f = {"x", x};
  RtRank r = rt_rank_single();
  RtExecOpts o = {.backend = be, .threads = 2, .no_groups = no_groups};
  char err[512];
  RtProgram *p = rt_program_new_opts(m, &r, &o, err, sizeof err);
  CHECK(p != NULL, "program: %s", err);
  if (!p) return NAN;
  double loss = NAN;
  int rc = rt_run_block(p, 0, &f, 1, NULL, err, sizeof err);
  CHECK(rc == 0, "run: %s", err);
  if (rc == 0) rt_output(p, "loss", &loss);
  if (st) rt_program_exec_stats(p, st);
  rt_program_free(p);
  return loss;
}

static void close_to(double a, double ref, const char *what) {
  double d = fabs(a - ref) / fmax(fabs(ref), 1e-300);
  CHECK(d <= 1e-12, "%s: %.17g vs reference %.17g (relative %.3g)", what, a, ref, d);
}

int main(void) {
  PassCtx cx;
  char err[1024];

  /* 1. the groups of the snippet */
  IrModule *m = parse();
  pass_ctx_init(&cx);
  CHECK(pass_fuse(m, &cx) == 0, "pass_fuse failed: %s", cx.err);
  const IrBlock *b = &m->blocks.a[0];
  CHECK(b->n == (int)(sizeof want_group / sizeof want_group[0]), "snippet has %d nodes", b->n);
  for (int i = 0; i < b->n; i++)
    CHECK(b->nodes[i].group == want_group[i], "%%%d (%s): group %d, want %d", i, ir_ops[b->nodes[i].op].name,
          b->nodes[i].group, want_group[i]);
  CHECK(ir_verify(m, err, sizeof err) == 0, "fused snippet does not verify: %s", err);
  /* used only inside group 1: no buffer; used outside: materialized */
  CHECK(!ir_value_materialized(b, 3) && !ir_value_materialized(b, 4) && ir_value_materialized(b, 5),
        "epilogue group 1: the product or the broadcast bias is materialized, or the add is not");
  CHECK(ir_value_materialized(b, 6) && ir_value_materialized(b, 7), "gelu / layernorm (used outside) not materialized");
  CHECK(!ir_value_materialized(b, 9) && ir_value_materialized(b, 11) && ir_value_materialized(b, 12),
        "group 2's materialized values are wrong");
  /* the text form shows the groups and round-trips */
  StrBuf t = {0};
  ir_print_module(m, &t);
  CHECK(strstr(t.p, "%7 = layernorm %6 eps=1e-05 : f64[2, 4, 6] group=2\n") != NULL, "text form lacks group=2");
  IrModule *back = ir_parse_module(t.p, "<printed>", err, sizeof err);
  CHECK(back && back->blocks.a[0].nodes[14].group == 4, "groups do not round-trip");
  ir_module_free(back);
  sb_free(&t);

  /* 2. the LLVM backend against the reference, fused, unfused */
  IrModule *plain = parse();
  RtExecStats st;
  double ref = run(plain, RT_BACKEND_REF, 0, NULL);
  CHECK(isfinite(ref), "reference loss %g", ref);
  double ref_f = run(m, RT_BACKEND_REF, 0, &st);
  CHECK(ref_f == ref, "reference backend on the fused module: %.17g vs %.17g", ref_f, ref);
  CHECK(st.kernels == 0, "reference backend compiled %d kernels", st.kernels);
  close_to(run(m, RT_BACKEND_LLVM, 0, &st), ref, "llvm fused");
  CHECK(st.groups == 4 && st.fallbacks == 0, "llvm fused: %d groups, %d fallbacks (want 4, 0)", st.groups, st.fallbacks);
  CHECK(st.epilogues == 1 && st.epilogue_gemms == 1, "llvm fused: %d epilogues run %lld times (want 1, 1)",
        st.epilogues, st.epilogue_gemms);
  /* 4 groups + sumsq %13, %16 + add %17 alone */
  CHECK(st.kernels == 7, "llvm fused: %d kernels, want 7", st.kernels);
  close_to(run(m, RT_BACKEND_LLVM, 1, &st), ref, "llvm, groups ignored");
  CHECK(st.groups == 0, "no_groups still ran %d groups", st.groups);

  /* 3. --no-fuse: no groups at all */
  IrModule *nf = parse();
  PassCtx cx2;
  pass_ctx_init(&cx2);
  cx2.no_fuse = 1;
  CHECK(pass_fuse(nf, &cx2) == 0, "pass_fuse --no-fuse failed");
  for (int i = 0; i < nf->blocks.a[0].n; i++) CHECK(nf->blocks.a[0].nodes[i].group == 0, "--no-fuse: %%%d in a group", i);
  pass_ctx_free(&cx2);

  /* 4. the verifier: %5 and %9 in one group, but %6..%8 outside use %5's
   * value before %9: not convex */
  IrBlock *nb = &nf->blocks.a[0];
  nb->nodes[5].group = nb->nodes[9].group = 1;
  CHECK(ir_verify(nf, err, sizeof err) != 0 && strstr(err, "not convex"), "non-convex group accepted (%s)", err);
  nb->nodes[9].group = 0;
  nb->nodes[18].group = 1;   /* an effect in a group */
  CHECK(ir_verify(nf, err, sizeof err) != 0 && strstr(err, "no result"), "effect in a group accepted (%s)", err);
  nb->nodes[18].group = 0;
  nb->nodes[5].group = 0;

  /* 5. a convex group the code generator refuses (a matmul in it): the
   * executor runs it on the reference kernels, same result */
  nb->nodes[3].group = nb->nodes[5].group = 1;
  CHECK(ir_verify(nf, err, sizeof err) == 0, "convex group with a matmul rejected: %s", err);
  close_to(run(nf, RT_BACKEND_LLVM, 0, &st), ref, "llvm with an unlowerable group");
  CHECK(st.fallbacks == 1, "fallbacks %d, want 1", st.fallbacks);

  /* 6. the pipeline runs fuse last */
  CHECK(pass_find("fuse") == pass_pipeline_count, "fuse is not the last pass");

  ir_module_free(nf);
  ir_module_free(plain);
  ir_module_free(m);
  pass_ctx_free(&cx);
  return check_exit("test_fuse");
}
