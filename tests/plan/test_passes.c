/* test_passes.c - passes/dce.c and passes/pipeline.c on hand-made modules:
 * DCE removes exactly the dead values (transitively) and renumbers
 * operands; the pipeline runs every pass, dumps 00-frontend.ir ...,
 * prints after a named pass, refuses unknown pass names with the list,
 * and reports an invalid input module as an internal error naming the pass.
 *
 * usage: test_passes TMPDIR */
#include "ir/ir.h"
#include "passes/passes.h"
#include <sys/stat.h>
#include "../check.h"

static char err[1024];
#define EMIT(...) emit_or_die(ir_emit(__VA_ARGS__, err, sizeof err))
static int emit_or_die(int id) {
  if (id < 0) TS_DIE("ir_emit: %s", err);
  return id;
}

/* forward: loss = sumsq(tanh(x[2,4] @ w[4,3])), with `dead` unused side
 * computations (a chain of 3 and an unused input that must stay). */
static IrModule *make_forward(int dead) {
  IrModule *m = ir_module_new("fwd");
  IrType tw = {IR_F32, 2, {4, 3}, {ts_intern("in"), ts_intern("out")}};
  IrState w = {"w", tw, IR_STATE_PARAM, IR_INIT_NORMAL, 0.0, 0.02, -1, 0, {{0}, 0, 0}, {0}};
  int sw = ir_state_add(m, &w);
  int b = ir_block_add(m, "forward");
  IrType tx = {IR_F32, 2, {2, 4}, {NULL, ts_intern("in")}};
  int x = EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "x", &tx);
  if (dead) EMIT(m, b, IR_OP_INPUT, NULL, 0, NULL, NULL, "unused", &tx);
  int64_t ia[1] = {sw};
  int ws = EMIT(m, b, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &tw);
  if (dead) {
    int e = EMIT(m, b, IR_OP_EXP, &x, 1, NULL, NULL, NULL, NULL);    /* dead chain: exp -> neg -> sumsq */
    int n = EMIT(m, b, IR_OP_NEG, &e, 1, NULL, NULL, NULL, NULL);
    EMIT(m, b, IR_OP_SUMSQ, &n, 1, NULL, NULL, NULL, NULL);
  }
  int in2[2] = {x, ws};
  int mm = EMIT(m, b, IR_OP_MATMUL, in2, 2, NULL, NULL, NULL, NULL);
  int t = EMIT(m, b, IR_OP_TANH, &mm, 1, NULL, NULL, NULL, NULL);
  if (dead) EMIT(m, b, IR_OP_EXP, &t, 1, NULL, NULL, NULL, NULL);      /* dead leaf use */
  int s = EMIT(m, b, IR_OP_SUMSQ, &t, 1, NULL, NULL, NULL, NULL);
  EMIT(m, b, IR_OP_OUTPUT, &s, 1, NULL, NULL, "loss", NULL);
  TS_ASSERT(ir_verify(m, err, sizeof err) == 0);
  return m;
}

static void print(const IrModule *m, StrBuf *b) { b->n = 0; ir_print_module(m, b); }

static void test_dce(void) {
  IrModule *m = make_forward(1), *clean = make_forward(0);
  PassCtx cx;
  pass_ctx_init(&cx);
  CHECK(m->blocks.a[0].n == 11, "setup: %d nodes", m->blocks.a[0].n);
  CHECK(pass_dce(m, &cx) == 0, "dce failed: %s", cx.err);
  CHECK(ir_verify(m, err, sizeof err) == 0, "invalid after dce: %s", err);
  /* What remains is the clean module plus the unused input (kept: it is
   * the block's interface), with operands renumbered past it. */
  const IrBlock *b = &m->blocks.a[0];
  CHECK(b->n == 7, "%d nodes after dce, expected 7", b->n);
  CHECK(b->nodes[1].op == IR_OP_INPUT && b->nodes[1].sa == ts_intern("unused"), "unused input dropped");
  int matmuls = 0;
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_MATMUL) {
      matmuls++;
      CHECK(b->nodes[i].in[0] == 0 && b->nodes[i].in[1] == 2, "matmul operands %d, %d", b->nodes[i].in[0], b->nodes[i].in[1]);
    }
  CHECK(matmuls == 1, "%d matmuls", matmuls);
  CHECK(b->nodes[b->n - 1].op == IR_OP_OUTPUT && b->nodes[b->n - 1].in[0] == b->n - 2, "output feeds from sumsq");
  /* Idempotent, and a no-op on a module without dead code. */
  StrBuf p1 = {0}, p2 = {0};
  print(m, &p1);
  pass_dce(m, &cx);
  print(m, &p2);
  CHECK(p1.n == p2.n && memcmp(p1.p, p2.p, p1.n) == 0, "dce is not idempotent");
  print(clean, &p1);
  pass_dce(clean, &cx);
  print(clean, &p2);
  CHECK(p1.n == p2.n && memcmp(p1.p, p2.p, p1.n) == 0, "dce changed a module without dead code");
  CHECK(m->states.n == 1, "states changed");
  sb_free(&p1);
  sb_free(&p2);
  pass_ctx_free(&cx);
  ir_module_free(m);
  ir_module_free(clean);
}

static void test_pipeline(const char *tmpdir) {
  char dir[1024], path[1200], outpath[1200];
  snprintf(dir, sizeof dir, "%s/dump", tmpdir);
  snprintf(outpath, sizeof outpath, "%s/printed.ir", tmpdir);
  IrModule *m = make_forward(1);
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.verify_roundtrip = 1;
  cx.dump_dir = dir;
  cx.print_after = "autodiff";
  FILE *pf = fopen(outpath, "w");
  TS_ASSERT(pf);
  cx.print_to = pf;
  int rc = pass_run_pipeline(m, &cx);
  fclose(pf);
  CHECK(rc == 0, "pipeline failed: %s", cx.err);
  CHECK(ir_block_find(m, "micro") >= 0 && ir_block_find(m, "update") >= 0, "no micro/update blocks");

  /* every dump exists, parses back, and re-prints identically */
  for (int i = 0; i <= pass_pipeline_count; i++) {
    snprintf(path, sizeof path, "%s/%02d-%s.ir", dir, i, i ? pass_pipeline[i - 1].name : "frontend");
    size_t n = 0;
    char *text = ts_read_file(path, &n);
    CHECK(text, "missing dump %s", path);
    if (!text) continue;
    IrModule *back = ir_parse_module(text, path, err, sizeof err);
    CHECK(back, "dump %s does not parse: %s", path, err);
    if (back) {
      StrBuf b = {0};
      ir_print_module(back, &b);
      CHECK(b.n == n && memcmp(b.p, text, n) == 0, "dump %s does not re-print identically", path);
      sb_free(&b);
      ir_module_free(back);
    }
    free(text);
  }
  /* the last dump is the final module */
  snprintf(path, sizeof path, "%s/%02d-%s.ir", dir, pass_pipeline_count, pass_pipeline[pass_pipeline_count - 1].name);
  char *last = ts_read_file(path, NULL);
  StrBuf fin = {0};
  ir_print_module(m, &fin);
  CHECK(last && strcmp(last, fin.p) == 0, "last dump differs from the final module");
  free(last);
  sb_free(&fin);

  char *printed = ts_read_file(outpath, NULL);
  CHECK(printed && strncmp(printed, "# IR after pass 'autodiff'\nmodule fwd\n", 38) == 0,
        "print-after output: %.80s", printed ? printed : "(none)");
  if (printed) {
    IrModule *back = ir_parse_module(printed, outpath, err, sizeof err);
    CHECK(back && ir_block_find(back, "micro") >= 0, "printed IR: %s", back ? "no micro block" : err);
    ir_module_free(back);
  }
  free(printed);
  pass_ctx_free(&cx);
  ir_module_free(m);

  /* an unknown pass name is refused before anything runs, listing the passes */
  m = make_forward(0);
  pass_ctx_init(&cx);
  cx.print_after = "autodif";
  CHECK(pass_run_pipeline(m, &cx) != 0 && strstr(cx.err, "unknown pass 'autodif'") &&
            strstr(cx.err, "frontend, partition, autodiff, shard, precision, fp8, remat, pipeline, wsplit, zero3, optimizer, eval, decode, dce"), "unknown pass: '%s'", cx.err);
  CHECK(m->blocks.n == 1, "passes ran despite the bad name");
  CHECK(pass_find("frontend") == 0 && pass_find("fuse") == pass_pipeline_count && pass_find("x") < 0, "pass_find");

  /* a broken input module: internal error naming pass 'frontend' */
  cx.print_after = NULL;
  IrBlock *b = &m->blocks.a[0];
  b->nodes[b->n - 2].type.rank = 1;       /* sumsq's result is a scalar: claim [5] */
  b->nodes[b->n - 2].type.dim[0] = 5;
  CHECK(pass_run_pipeline(m, &cx) != 0 && strstr(cx.err, "internal error: IR invalid after pass 'frontend': "),
        "broken module: '%s'", cx.err);
  pass_ctx_free(&cx);
  ir_module_free(m);
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: test_passes TMPDIR\n"); return 2; }
  mkdir(argv[1], 0777);
  test_dce();
  test_pipeline(argv[1]);
  return check_exit("test_passes");
}
