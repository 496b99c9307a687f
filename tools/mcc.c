/* mcc.c - the Tessera compiler driver: MDL source -> plan.
 *
 *   frontend (mdl_compile_file) -> pass pipeline (passes/pipeline.c) -> plan
 *
 * The plan is single-rank for now: one program that every rank runs, on a
 * 1x1x1x1x1 mesh.  Parallel settings (--tp ... or the model's `parallel`
 * block) are recorded in the IR, and IR output (--emit=ir/dot) works with
 * them, but a plan with tp/pp/cp/ep > 1 is refused until sharding lands.
 *
 * Exit codes: 0 ok, 1 compile or I/O error, 2 usage error. */
#include "frontend/mdl.h"
#include "passes/passes.h"
#include "passes/memplan.h"
#include "runtime/plan.h"
#include <errno.h>
#include <time.h>
#include <unistd.h>

#define MCC_VERSION "0.1"

static void usage(FILE *f) {
  fprintf(f,
          "usage: mcc FILE.mdl [options]\n"
          "Compiles an MDL model into a Tessera plan for mrun.\n"
          "\n"
          "  -o OUT                 output file (default: FILE with .plan; stdout for ir/dot/plan-text)\n"
          "  -D key=value           override a config value (repeatable)\n"
          "  --precision f32|f64    training precision (default: the train block's)\n"
          "  --tp N --pp N --cp N --ep N\n"
          "                         tensor/pipeline/context/expert parallel sizes (recorded in the\n"
          "                         IR; plans with any of them > 1 are not supported yet)\n"
          "  --sp                   sequence parallelism (with tp)\n"
          "  --stdlib DIR           where `import nn` looks (default: the source tree's stdlib/)\n"
          "  --emit=KIND            plan (default), plan-text, ir (final IR), dot (Graphviz)\n"
          "  --dump-ir=all DIR      write the IR after every pass to DIR/NN-<pass>.ir\n"
          "  --dump-ir=PASS DIR     ... after one pass only\n"
          "  --print-ir-after=PASS  print the IR after PASS to stdout\n"
          "  --verify-each          verify the IR after every pass (the default)\n"
          "  --no-verify            do not verify between passes\n"
          "  --verify-roundtrip     check that the IR (and the plan) print and parse back identically\n"
          "  --time                 per-stage wall times on stderr\n"
          "  --stats                parameter, state and node counts on stderr\n"
          "  --report memory        print per-rank memory (states, planned activation arenas) to\n"
          "                         stdout (or -o) instead of writing a plan\n"
          "  --help, --version\n"
          "Passes, in order: frontend");
  for (int i = 0; i < pass_pipeline_count; i++) fprintf(f, ", %s", pass_pipeline[i].name);
  fprintf(f, "\n");
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "mcc: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(run 'mcc --help' for the options)\n");
  return 2;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A parallel size: a positive int, at most 1 << 20. */
static int parse_size(const char *s, int *out) {
  char *e;
  errno = 0;
  long v = s ? strtol(s, &e, 10) : 0;
  if (!s || !*s || *e || errno || v < 1 || v > (1 << 20)) return -1;
  *out = (int)v;
  return 0;
}

typedef struct {
  const char *input, *output, *emit, *report;
  VEC(MdlDefine) defines;
  MdlOptions mdl;
  PassCtx *cx;
  int time, stats;
} Args;

/* Returns -1 to continue, or the exit code (0 for --help/--version). */
static int parse_args(int argc, char **argv, Args *a) {
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_ARG(opt) do { if (!next) return usage_error("option '%s' needs an argument", opt); i++; } while (0)
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) { usage(stdout); return 0; }
    if (strcmp(s, "--version") == 0) {
      printf("mcc (Tessera) %s, plan format %d\n", MCC_VERSION, RT_PLAN_VERSION);
      return 0;
    }
    if (strcmp(s, "-o") == 0) { NEED_ARG(s); a->output = next; continue; }
    if (strncmp(s, "-D", 2) == 0) {
      const char *kv = s[2] ? s + 2 : next;
      if (!s[2]) NEED_ARG("-D");
      const char *eq = strchr(kv, '=');
      if (!eq || eq == kv) return usage_error("-D needs key=value, got '%s'", kv);
      MdlDefine d = {ts_intern_n(kv, (size_t)(eq - kv)), eq + 1};
      VEC_PUSH(a->defines, d);
      continue;
    }
    if (strcmp(s, "--precision") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "f32") == 0) a->mdl.precision = IR_F32;
      else if (strcmp(next, "f64") == 0) a->mdl.precision = IR_F64;
      else return usage_error("--precision must be f32 or f64, got '%s'", next);
      continue;
    }
    int *par = strcmp(s, "--tp") == 0 ? &a->mdl.tp : strcmp(s, "--pp") == 0 ? &a->mdl.pp
             : strcmp(s, "--cp") == 0 ? &a->mdl.cp : strcmp(s, "--ep") == 0 ? &a->mdl.ep : NULL;
    if (par) {
      NEED_ARG(s);
      if (parse_size(next, par) != 0) return usage_error("expected a positive size, got '%s'", next);
      continue;
    }
    if (strcmp(s, "--sp") == 0) { a->mdl.sp = 1; continue; }
    if (strcmp(s, "--stdlib") == 0) { NEED_ARG(s); a->mdl.stdlib_dir = next; continue; }
    if (strncmp(s, "--emit=", 7) == 0) {
      a->emit = s + 7;
      if (strcmp(a->emit, "plan") && strcmp(a->emit, "plan-text") && strcmp(a->emit, "ir") && strcmp(a->emit, "dot"))
        return usage_error("--emit must be plan, plan-text, ir or dot, got '%s'", a->emit);
      continue;
    }
    if (strncmp(s, "--dump-ir=", 10) == 0) {
      const char *which = s + 10;
      NEED_ARG("--dump-ir=all");
      a->cx->dump_dir = next;
      a->cx->dump_pass = strcmp(which, "all") == 0 ? NULL : which;
      continue;
    }
    if (strncmp(s, "--print-ir-after=", 17) == 0) { a->cx->print_after = s + 17; continue; }
    if (strcmp(s, "--verify-each") == 0) { a->cx->verify_each = 1; continue; }
    if (strcmp(s, "--no-verify") == 0) { a->cx->verify_each = 0; continue; }
    if (strcmp(s, "--verify-roundtrip") == 0) { a->cx->verify_roundtrip = 1; continue; }
    if (strcmp(s, "--time") == 0) { a->time = 1; continue; }
    if (strcmp(s, "--stats") == 0) { a->stats = 1; continue; }
    if (strcmp(s, "--report") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "memory") != 0) return usage_error("--report must be memory, got '%s'", next);
      a->report = next;
      continue;
    }
    if (s[0] == '-' && s[1]) return usage_error("unknown option '%s'", s);
    if (a->input) return usage_error("more than one input file ('%s')", s);
    a->input = s;
#undef NEED_ARG
  }
  if (!a->input) return usage_error("%s", "no input file");
  /* Pass names are checked before the (possibly long) frontend runs. */
  char err[512];
  if (a->cx->print_after && pass_check_name(a->cx->print_after, "--print-ir-after", err, sizeof err) != 0)
    return usage_error("%s", err);
  if (a->cx->dump_pass && pass_check_name(a->cx->dump_pass, "--dump-ir", err, sizeof err) != 0)
    return usage_error("%s", err);
  return -1;
}

/* FILE.mdl -> FILE.plan (any other name: FILE.plan appended). */
static char *default_output(const char *in) {
  size_t n = strlen(in);
  const char *slash = strrchr(in, '/');
  const char *dot = strrchr(in, '.');
  if (dot && (!slash || dot > slash) && dot != in && dot[-1] != '/') n = (size_t)(dot - in);
  char *out = ts_xmalloc(n + 6);
  memcpy(out, in, n);
  memcpy(out + n, ".plan", 6);
  return out;
}

static void print_stats(const IrModule *m) {
  int64_t params = 0, nodes = 0;
  int nparams = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) { params += ir_type_numel(&m->states.a[i].type); nparams++; }
  for (int b = 0; b < m->blocks.n; b++) nodes += m->blocks.a[b].n;
  fprintf(stderr, "stats: %lld parameters in %d tensors, %d states, %d blocks, %lld IR nodes\n",
          (long long)params, nparams, m->states.n, m->blocks.n, (long long)nodes);
}

/* Writes text (or bytes) to -o, or to stdout when there is none or it is "-". */
static int emit_text(const char *out, const StrBuf *b) {
  if (!out || strcmp(out, "-") == 0) {
    fwrite(b->p ? b->p : "", 1, b->n, stdout);
    return fflush(stdout) == 0 ? 0 : 1;
  }
  if (ts_write_file_atomic(out, b->p ? b->p : "", b->n) != 0) {
    fprintf(stderr, "mcc: cannot write '%s': %s\n", out, strerror(errno));
    return 1;
  }
  return 0;
}

/* The plan must print, parse and encode back to the same bytes. */
static int check_plan_roundtrip(const RtPlan *p) {
  StrBuf bin = {0}, text = {0}, bin2 = {0}, bin3 = {0};
  char err[1024];
  int rc = 1;
  rt_plan_encode(p, &bin);
  rt_plan_print_text(p, &text);
  RtPlan *q = rt_plan_parse_text(text.p, "<plan text>", err, sizeof err);
  RtPlan *r = q ? rt_plan_decode(bin.p, bin.n, err, sizeof err) : NULL;
  if (!q || !r) {
    fprintf(stderr, "mcc: internal error: the plan does not read back: %s\n", err);
  } else {
    rt_plan_encode(q, &bin2);
    rt_plan_encode(r, &bin3);
    if (bin2.n != bin.n || memcmp(bin2.p, bin.p, bin.n) != 0)
      fprintf(stderr, "mcc: internal error: the plan text does not parse back to the same plan\n");
    else if (bin3.n != bin.n || memcmp(bin3.p, bin.p, bin.n) != 0)
      fprintf(stderr, "mcc: internal error: the binary plan does not decode to the same plan\n");
    else
      rc = 0;
  }
  rt_plan_free(q);
  rt_plan_free(r);
  sb_free(&bin); sb_free(&text); sb_free(&bin2); sb_free(&bin3);
  return rc;
}

/* Only single-rank plans exist until the sharding passes land. */
static int check_single_rank(const IrModule *m) {
  const char *axis[4] = {"tp", "pp", "cp", "ep"};
  const char *what[4] = {"tensor", "pipeline", "context", "expert"};
  int v[4] = {m->par.tp, m->par.pp, m->par.cp, m->par.ep};
  for (int i = 0; i < 4; i++)
    if (v[i] > 1) {
      fprintf(stderr, "mcc: %s=%d: %s parallelism is not supported yet (plans are single-rank); "
                      "--emit=ir shows the IR with it recorded\n", axis[i], v[i], what[i]);
      return 1;
    }
  return 0;
}

static int write_plan(const Args *a, IrModule *m, int *owned) {
  RtPlan *p = rt_plan_new();
  p->source = ts_intern(a->input);
  /* The mesh follows the module's parallel settings (0 = unset = 1); data
   * parallelism is whatever ranks remain, and there is one rank for now. */
  p->mesh.tp = m->par.tp > 1 ? m->par.tp : 1;
  p->mesh.pp = m->par.pp > 1 ? m->par.pp : 1;
  p->mesh.cp = m->par.cp > 1 ? m->par.cp : 1;
  p->mesh.ep = m->par.ep > 1 ? m->par.ep : 1;
  p->mesh.dp = 1;
  p->nprograms = 1;
  p->programs = ts_xmalloc(sizeof *p->programs);
  p->programs[0] = m;
  *owned = 0;                         /* the plan owns the module now */
  p->nranks = 1;
  p->rank_program = ts_xcalloc(1, sizeof *p->rank_program);
  int rc = 0;
  if (a->cx->verify_roundtrip) rc = check_plan_roundtrip(p);
  if (rc == 0 && strcmp(a->emit, "plan-text") == 0) {
    StrBuf b = {0};
    rt_plan_print_text(p, &b);
    rc = emit_text(a->output, &b);
    sb_free(&b);
  } else if (rc == 0 && a->output && strcmp(a->output, "-") == 0) {   /* binary to stdout (a pipe) */
    StrBuf b = {0};
    rt_plan_encode(p, &b);
    rc = emit_text(NULL, &b);
    sb_free(&b);
  } else if (rc == 0) {
    char err[1024];
    char *def = a->output ? NULL : default_output(a->input);
    if (rt_plan_write(p, a->output ? a->output : def, err, sizeof err) != 0) {
      fprintf(stderr, "mcc: %s\n", err);
      rc = 1;
    }
    free(def);
  }
  rt_plan_free(p);
  return rc;
}

int main(int argc, char **argv) {
  PassCtx cx;
  pass_ctx_init(&cx);
  Args a;
  memset(&a, 0, sizeof a);
  a.emit = "plan";
  a.cx = &cx;
  mdl_options_init(&a.mdl);
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) goto out;
  rc = 1;
  if (access(a.input, R_OK) != 0) {
    fprintf(stderr, "mcc: cannot open '%s': %s\n", a.input, strerror(errno));
    goto out;
  }
  a.mdl.defines = a.defines.a;
  a.mdl.ndefines = a.defines.n;
  if (a.time) cx.time_to = stderr;

  double t0 = now_ms();
  IrModule *m = mdl_compile_file(a.input, &a.mdl);
  double t1 = now_ms();
  if (!m) goto out;                      /* the frontend printed the diagnostics */
  int owned = 1;
  if (a.time) fprintf(stderr, "time: %-12s %9.1f ms\n", "frontend", t1 - t0);

  if (pass_run_pipeline(m, &cx) != 0) {
    fprintf(stderr, "mcc: %s\n", cx.err);
    goto done;
  }
  if (a.stats) print_stats(m);
  double t2 = now_ms();
  if (a.report) {                        /* --report memory: an analysis, no plan */
    StrBuf b = {0};
    char err[1024];
    if (pass_memplan_report(m, &b, err, sizeof err) != 0) fprintf(stderr, "mcc: %s\n", err);
    else rc = emit_text(a.output, &b);
    sb_free(&b);
  } else if (strcmp(a.emit, "ir") == 0 || strcmp(a.emit, "dot") == 0) {
    StrBuf b = {0};
    if (strcmp(a.emit, "ir") == 0) ir_print_module(m, &b);
    else ir_print_dot(m, &b);
    rc = emit_text(a.output, &b);
    sb_free(&b);
  } else if (check_single_rank(m) == 0) {
    rc = write_plan(&a, m, &owned);
  }
  double t3 = now_ms();
  if (a.time) {
    fprintf(stderr, "time: %-12s %9.1f ms\n", strcmp(a.emit, "plan") == 0 ? "plan write" : "emit", t3 - t2);
    fprintf(stderr, "time: %-12s %9.1f ms\n", "total", t3 - t0);
  }
done:
  if (owned) ir_module_free(m);
out:
  free(a.defines.a);
  pass_ctx_free(&cx);
  return rc;
}
