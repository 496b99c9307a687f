/* pipeline.c - the compiler's passes in order, and the driver that runs
 * them with the checks between them (CONVENTIONS §4, §6, §8).
 *
 * The module handed to pass_run_pipeline is what the frontend made; it is
 * checked as pass 0 "frontend".  After every pass (and for pass 0):
 *   - ir_verify                  if cx->verify_each (default on)
 *   - print -> parse -> print    if cx->verify_roundtrip; must be identical
 *   - dump to DIR/NN-<name>.ir   if cx->dump_dir (atomic writes)
 *   - print to cx->print_to      if cx->print_after names the pass
 * and the scratch arena is reset.  A check that fails is a compiler bug,
 * reported as "internal error: ... after pass 'NAME': ...". */
#include "passes.h"
#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <time.h>

const PassInfo pass_pipeline[] = {
    {"partition", pass_partition, "pp > 1: tags forward nodes with their pipeline chunk (docs/pipeline.md)"},
    {"autodiff", pass_autodiff, "forward -> micro: forward, backward, accumulate into gradient state"},
    {"shard", pass_shard, "tensor / sequence parallelism: local shapes, layouts, collectives (docs/sharding.md)"},
    {"precision", pass_precision, "the dtype each value is stored in: 16-bit storage and f32 arithmetic per op class, casts explicit (docs/precision.md)"},
    {"fp8", pass_fp8, "--fp8: the repeat-stack layers' GEMMs read fp8 operands quantized with delayed scaling (docs/precision.md \"FP8\")"},
    {"remat", pass_remat, "recomputes in the backward the cheap values the forward would keep (passes/remat.c)"},
    {"pipeline", pass_pipe_split, "pp > 1: micro -> per-chunk blocks fwd.<g> / bwd.<g> joined by send/recv and stash"},
    {"wsplit", pass_wsplit, "--schedule zb-h1: each bwd.<g> -> input-gradient part bwd.<g> (B) and weight-gradient part wgt.<g> (W)"},
    {"zero3", pass_zero3, "--zero 3: parameters and gradients as 1/dp shards, each layer's parameters gathered one layer ahead before use (again in the backward), gradients reduce-scattered per micro batch"},
    {"optimizer", pass_optimizer, "adds the update block: grad norm, clipping, AdamW, zeroing grads"},
    {"eval", pass_eval, "forward-only blocks for validation: \"eval\" sliced from micro (eval.<g> from fwd.<g> with pp > 1): the outputs' operands, no stash, dropout off"},
    {"decode", pass_decode, "with --decode: generation blocks \"prefill\" and \"step\" derived from eval, with KV-cache states (docs/generation.md)"},
    {"dce", pass_dce, "removes values that nothing uses"},
    {"fuse", pass_fuse, "fusion groups: nodes that run as one generated kernel (docs/codegen.md)"},
};
const int pass_pipeline_count = (int)(sizeof pass_pipeline / sizeof pass_pipeline[0]);

static int cx_fail(PassCtx *cx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cx_fail(PassCtx *cx, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cx->err, sizeof cx->err, fmt, ap);
  va_end(ap);
  return -1;
}

/* Pass numbers as the dumps use them: 0 = "frontend", i + 1 = pass_pipeline[i]. */
static const char *pass_name_at(int i) { return i == 0 ? "frontend" : pass_pipeline[i - 1].name; }

int pass_find(const char *name) {
  for (int i = 0; name && i <= pass_pipeline_count; i++)
    if (strcmp(pass_name_at(i), name) == 0) return i;
  return -1;
}

int pass_check_name(const char *name, const char *what, char *err, size_t errlen) {
  if (pass_find(name) >= 0) return 0;
  StrBuf b = {0};
  for (int i = 0; i <= pass_pipeline_count; i++) sb_printf(&b, "%s%s", i ? ", " : "", pass_name_at(i));
  snprintf(err, errlen, "unknown pass '%s' for %s; the passes are: %s", name ? name : "", what, b.p);
  sb_free(&b);
  return -1;
}

/* The first line where a and b differ, for the round-trip message. */
static void first_diff(const char *a, const char *b, char *out, size_t n) {
  int line = 1;
  const char *la = a, *lb = b;
  while (*a && *a == *b) {
    if (*a == '\n') { line++; la = a + 1; lb = b + 1; }
    a++, b++;
  }
  int ka = (int)strcspn(la, "\n"), kb = (int)strcspn(lb, "\n");
  snprintf(out, n, "line %d: printed '%.*s', reprinted '%.*s'", line, ka > 300 ? 300 : ka, la,
           kb > 300 ? 300 : kb, lb);
}

/* print -> parse -> print must be identical (CONVENTIONS §8). */
static int check_roundtrip(const IrModule *m, PassCtx *cx, const char *name) {
  StrBuf a = {0}, b = {0};
  ir_print_module(m, &a);
  char perr[1024] = "";
  char fname[64];
  snprintf(fname, sizeof fname, "<IR after %s>", name);
  IrModule *back = ir_parse_module(a.p ? a.p : "", fname, perr, sizeof perr);
  int rc = 0;
  if (!back) {
    rc = cx_fail(cx, "internal error: IR printed after pass '%s' does not parse back: %s", name, perr);
  } else {
    ir_print_module(back, &b);
    if (a.n != b.n || memcmp(a.p, b.p, a.n) != 0) {
      char d[800];
      first_diff(a.p, b.p ? b.p : "", d, sizeof d);
      rc = cx_fail(cx, "internal error: IR text does not round-trip after pass '%s': %s", name, d);
    }
    ir_module_free(back);
  }
  sb_free(&a);
  sb_free(&b);
  return rc;
}

static int dump(const IrModule *m, PassCtx *cx, int idx, const char *name) {
  if (mkdir(cx->dump_dir, 0777) != 0 && errno != EEXIST)
    return cx_fail(cx, "cannot create the IR dump directory '%s': %s", cx->dump_dir, strerror(errno));
  char path[4096];
  snprintf(path, sizeof path, "%s/%02d-%s.ir", cx->dump_dir, idx, name);
  StrBuf b = {0};
  ir_print_module(m, &b);
  int rc = ts_write_file(path, b.p ? b.p : "", b.n);
  sb_free(&b);
  if (rc != 0) return cx_fail(cx, "IR dump: %s", ts_io_error());
  return 0;
}

/* Everything that happens after pass `idx` (0 = the frontend's output). */
static int after_pass(IrModule *m, PassCtx *cx, int idx) {
  const char *name = pass_name_at(idx);
  char verr[1024];
  if (cx->verify_each && ir_verify(m, verr, sizeof verr) != 0)
    return cx_fail(cx, "internal error: IR invalid after pass '%s': %s", name, verr);
  if (cx->verify_roundtrip && check_roundtrip(m, cx, name) != 0) return -1;
  if (cx->dump_dir && (!cx->dump_pass || strcmp(cx->dump_pass, name) == 0) && dump(m, cx, idx, name) != 0)
    return -1;
  if (cx->print_after && strcmp(cx->print_after, name) == 0) {
    StrBuf b = {0};
    sb_printf(&b, "# IR after pass '%s'\n", name);
    ir_print_module(m, &b);
    FILE *f = cx->print_to ? cx->print_to : stdout;
    fwrite(b.p, 1, b.n, f);
    fflush(f);
    sb_free(&b);
  }
  arena_free(&cx->scratch);
  arena_init(&cx->scratch);
  return 0;
}

int pass_run_pipeline(IrModule *m, PassCtx *cx) {
  cx->err[0] = 0;
  /* Name checks first: a typo should not cost a full compile. */
  if (cx->print_after && pass_check_name(cx->print_after, "--print-ir-after", cx->err, sizeof cx->err) != 0)
    return -1;
  if (cx->dump_pass && pass_check_name(cx->dump_pass, "--dump-ir", cx->err, sizeof cx->err) != 0) return -1;

  double t0 = (ts_now_s() * 1e3);
  if (after_pass(m, cx, 0) != 0) return -1;
  double checks = (ts_now_s() * 1e3) - t0;
  for (int i = 0; i < pass_pipeline_count; i++) {
    const PassInfo *p = &pass_pipeline[i];
    double t1 = (ts_now_s() * 1e3);
    cx->err[0] = 0;
    int bad = p->fn(m, cx) != 0;
    double t2 = (ts_now_s() * 1e3);
    if (!bad && cx->time_to) fprintf(cx->time_to, "time: %-12s %9.1f ms\n", p->name, t2 - t1);
    if (bad || after_pass(m, cx, i + 1) != 0) {
      if (!cx->err[0]) cx_fail(cx, "pass '%s' failed", p->name);
      arena_free(&cx->scratch);   /* what the failed pass took (a caller may go on: tests, fuzzers) */
      arena_init(&cx->scratch);
      return -1;
    }
    checks += (ts_now_s() * 1e3) - t2;
  }
  if (cx->time_to) fprintf(cx->time_to, "time: %-12s %9.1f ms\n", "checks", checks);
  char why[1024];
  if (ir_verify_training(m, why, sizeof why) != 0)   /* a pass lost or doubled a gradient's bookkeeping */
    return cx_fail(cx, "internal error after the passes: %s", why);
  return 0;
}
