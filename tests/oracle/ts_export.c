/* ts_export.c - the C half of the PyTorch oracle (CONVENTIONS §10).
 *
 *   ts_export MODEL.mdl OUTDIR [-D name=value ...]
 *   ts_export FORWARD.ir OUTDIR        (a forward module as text, already f64)
 *
 * Compiles MODEL.mdl in f64 with one micro-batch per step (global_batch is
 * set to micro_batch), keeps the forward module as text (OUTDIR/forward.ir),
 * runs the pass pipeline, initializes a runtime program and runs block
 * "micro" once on deterministic inputs.  It then writes to OUTDIR:
 *   forward.ir            the module as the frontend made it (ir_print_module)
 *   p.<state>.f64         every parameter's initial values (raw LE f64)
 *   g.<state>.f64         every gradient state's values after the micro block
 *   in.<input>.bin        every model input (raw LE, its IR dtype: i32 or float)
 *   manifest.json         names, kinds, shapes, files, and the loss
 * oracle.py reads these and recomputes loss and gradients with PyTorch.
 *
 * Inputs are generic: an input used as the ids of `embedding` gets ints
 * below the table's row count; one used as the targets of `cross_entropy`
 * gets ints below the logits' last dim, with every 7th set to the op's
 * ignore index (to exercise it); float inputs (masks) get a 0/1 pattern. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/mdl.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/exec/rt.h"

#define MAX_DEFINES 64

static int write_or_complain(const char *dir, const char *file, const void *data, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if (ts_write_file(path, data, len) != 0) {
    fprintf(stderr, "ts_export: %s\n", ts_io_error());
    return -1;
  }
  return 0;
}

/* JSON string with the few escapes our names can need. */
static void json_str(StrBuf *b, const char *s) {
  sb_putc(b, '"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') sb_putc(b, '\\');
    sb_putc(b, *s);
  }
  sb_putc(b, '"');
}

static void json_shape(StrBuf *b, const IrType *t) {
  sb_putc(b, '[');
  for (int i = 0; i < t->rank; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)t->dim[i]);
  sb_putc(b, ']');
}

/* The data of a float state as f64 (states are f64 when compiled in f64,
 * but convert anyway so a f32 run could be exported too). Heap; caller frees. */
static double *state_as_f64(RtProgram *p, const IrState *s, int idx, int64_t n) {
  double *out = ts_xmalloc((size_t)(n ? n : 1) * sizeof(double));
  const void *d = rt_state_data(p, idx);
  if (s->type.dtype == IR_F64) memcpy(out, d, (size_t)n * sizeof(double));
  else if (s->type.dtype == IR_F32) for (int64_t i = 0; i < n; i++) out[i] = ((const float *)d)[i];
  else TS_DIE("state %s is not a float tensor", s->name);
  return out;
}

/* How an input is used, found from the forward block: the bound on its
 * values (ids/targets) and the ignore index (targets). */
typedef struct { int64_t bound; int is_target; int64_t ignore; } InputUse;

static InputUse input_use(const IrModule *m, const IrBlock *b, int id) {
  InputUse u = {2, 0, 0};
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op == IR_OP_EMBEDDING && n->nin == 2 && n->in[1] == id) {
      u.bound = b->nodes[n->in[0]].type.dim[0];
    } else if (n->op == IR_OP_CROSS_ENTROPY && n->in[1] == id) {
      const IrType *lt = &b->nodes[n->in[0]].type;
      u.bound = lt->dim[lt->rank - 1];
      u.is_target = 1;
      u.ignore = n->ia[0];
    }
  }
  (void)m;
  return u;
}

/* Fills input node `n` (numel elements) deterministically.  Heap; caller frees.
 * ids: i32[...] values (7k + 3) mod bound; targets also every 7th = ignore. */
static void *make_input(const IrNode *n, InputUse u, size_t *bytes) {
  int64_t cnt = ir_type_numel(&n->type);
  *bytes = (size_t)cnt * ir_dtype_size(n->type.dtype);
  void *d = ts_xcalloc((size_t)(cnt ? cnt : 1), ir_dtype_size(n->type.dtype));
  for (int64_t i = 0; i < cnt; i++) {
    int64_t v = (i * 7 + 3 + (u.is_target ? 5 * (i / 3) : 0)) % u.bound;
    if (u.is_target && i % 7 == 4) v = u.ignore;
    switch (n->type.dtype) {
      case IR_I32: ((int32_t *)d)[i] = (int32_t)v; break;
      case IR_F32: ((float *)d)[i] = (float)(i % 5 != 2); break;
      case IR_F64: ((double *)d)[i] = (double)(i % 5 != 2); break;
      default: TS_DIE("input \"%s\" has an unsupported dtype", n->sa);
    }
  }
  return d;
}

/* Writes p.<name>.f64 / g.<name>.f64 for every param and grad state and
 * appends their manifest entries to js. */
static int export_states(RtProgram *p, const IrModule *m, const char *dir, StrBuf *js) {
  int first = 1;
  sb_puts(js, "  \"states\": [\n");
  for (int s = 0; s < m->states.n; s++) {
    const IrState *st = &m->states.a[s];
    if (st->kind != IR_STATE_PARAM && st->kind != IR_STATE_GRAD) continue;
    int64_t n = ir_type_numel(&st->type);
    double *v = state_as_f64(p, st, s, n);
    char file[1024];
    snprintf(file, sizeof file, "%s.%s.f64", st->kind == IR_STATE_PARAM ? "p" : "g", st->name);
    int rc = write_or_complain(dir, file, v, (size_t)n * sizeof(double));
    free(v);
    if (rc) return -1;
    sb_printf(js, "%s    {\"name\": ", first ? "" : ",\n");
    json_str(js, st->name);
    sb_printf(js, ", \"kind\": \"%s\", \"of\": ", ir_state_kind_name(st->kind));
    if (st->of >= 0) json_str(js, m->states.a[st->of].name); else sb_puts(js, "null");
    sb_puts(js, ", \"shape\": ");
    json_shape(js, &st->type);
    sb_puts(js, ", \"file\": ");
    json_str(js, file);
    sb_putc(js, '}');
    first = 0;
  }
  sb_puts(js, "\n  ],\n");
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: ts_export MODEL.mdl OUTDIR [-D name=value ...]\n"
                  "       ts_export FORWARD.ir OUTDIR\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const char *mdl = argv[1], *dir = argv[2];
  MdlDefine defs[MAX_DEFINES];
  int ndefs = 0;
  for (int i = 3; i < argc; i++) {
    const char *d = argv[i];
    if (!strcmp(d, "-D")) { if (++i >= argc) return usage(); d = argv[i]; }
    else if (!strncmp(d, "-D", 2)) d += 2;
    else return usage();
    const char *eq = strchr(d, '=');
    if (!eq || ndefs == MAX_DEFINES) return usage();
    defs[ndefs].name = ts_intern_n(d, (size_t)(eq - d));
    defs[ndefs].value = eq + 1;
    ndefs++;
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "ts_export: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }

  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = defs;
  opt.ndefines = ndefs;
  opt.precision = IR_F64;
  IrModule *m = NULL;
  size_t len = strlen(mdl);
  if (len > 3 && !strcmp(mdl + len - 3, ".ir")) {   /* IR text: skips the frontend */
    char perr[1024];
    char *text = ts_read_file(mdl, NULL);
    if (!text) { fprintf(stderr, "ts_export: cannot read %s: %s\n", mdl, strerror(errno)); return 1; }
    m = ir_parse_module(text, mdl, perr, sizeof perr);
    free(text);
    if (!m) { fprintf(stderr, "%s\n", perr); return 1; }
  } else {
    m = mdl_compile_file(mdl, &opt);
  }
  if (!m) return 1;
  m->train.global_batch = m->train.micro_batch;   /* one micro-batch per step */

  IrModule *fwd = ir_module_clone(m);
  StrBuf txt = {0};
  ir_print_module(fwd, &txt);
  int rc = write_or_complain(dir, "forward.ir", txt.p, txt.n);
  sb_free(&txt);

  PassCtx cx;
  pass_ctx_init(&cx);
  RtProgram *prog = NULL;
  StrBuf js = {0};
  char err[2048] = "";
  void *feeds_data[16] = {0};
  RtFeed feeds[16];
  int nfeeds = 0;
  if (rc) goto out;
  if ((rc = pass_run_pipeline(m, &cx)) != 0) {
    fprintf(stderr, "ts_export: pipeline: %s\n", cx.err);
    goto out;
  }
  if (!(prog = rt_program_new(m, err, sizeof err))) {
    fprintf(stderr, "ts_export: runtime: %s\n", err);
    rc = 1;
    goto out;
  }
  int fb = ir_block_find(fwd, "forward"), mb = ir_block_find(m, "micro");
  if (fb < 0 || mb < 0) {
    fprintf(stderr, "ts_export: expected blocks forward (before passes) and micro (after)\n");
    rc = 1;
    goto out;
  }

  /* Inputs: the forward block's INPUT nodes, also fed under those names to micro. */
  const IrBlock *b = &fwd->blocks.a[fb];
  sb_puts(&js, "{\n  \"inputs\": [\n");
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    if (n->op != IR_OP_INPUT) continue;
    if (nfeeds == 16) { fprintf(stderr, "ts_export: too many inputs\n"); rc = 1; goto out; }
    size_t bytes;
    int k = nfeeds++;
    feeds_data[k] = make_input(n, input_use(fwd, b, i), &bytes);
    feeds[k] = (RtFeed){n->sa, feeds_data[k]};
    char file[512];
    snprintf(file, sizeof file, "in.%s.bin", n->sa);
    if ((rc = write_or_complain(dir, file, feeds_data[k], bytes)) != 0) goto out;
    sb_printf(&js, "%s    {\"name\": ", k ? ",\n" : "");
    json_str(&js, n->sa);
    sb_printf(&js, ", \"dtype\": \"%s\", \"shape\": ", ir_dtype_name(n->type.dtype));
    json_shape(&js, &n->type);
    sb_puts(&js, ", \"file\": ");
    json_str(&js, file);
    sb_putc(&js, '}');
  }
  sb_puts(&js, "\n  ],\n");

  RtRunInfo info = {0, 0, m->train.lr, 0};
  if ((rc = rt_run_block(prog, mb, feeds, nfeeds, &info, err, sizeof err)) != 0) {
    fprintf(stderr, "ts_export: running block micro: %s\n", err);
    goto out;
  }
  double loss;
  if (rt_output(prog, "loss", &loss) != 0) {
    fprintf(stderr, "ts_export: block micro reported no \"loss\"\n");
    rc = 1;
    goto out;
  }
  if ((rc = export_states(prog, m, dir, &js)) != 0) goto out;
  char lbuf[64];
  ts_fmt_double(lbuf, sizeof lbuf, loss);
  sb_printf(&js, "  \"loss\": %s\n}\n", isfinite(loss) ? lbuf : "null");
  rc = write_or_complain(dir, "manifest.json", js.p, js.n);
  if (!rc) printf("ts_export: %s -> %s (loss %s)\n", mdl, dir, lbuf);

out:
  for (int i = 0; i < nfeeds; i++) free(feeds_data[i]);
  sb_free(&js);
  if (prog) rt_program_free(prog);
  pass_ctx_free(&cx);
  ir_module_free(fwd);
  ir_module_free(m);
  return rc ? 1 : 0;
}
