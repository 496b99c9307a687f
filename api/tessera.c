/* tessera.c - the C API of include/tessera.h over the compile driver
 * (api/session.h): a TsSession is an ApiSession whose diagnostics go to a
 * memory stream instead of stderr, and which keeps the last compiled
 * module to make the plan, reports and IR from on request.
 *
 * Every public call takes api_lock (the compiler has process-wide state:
 * the interned strings, the data root, and a parser that is not known to
 * be reentrant), resets the diagnostics, and maps the driver's result to
 * a TsStatus.  Option values and the source text are copied: the caller's
 * strings may go away after the call. */
#include "tessera.h"
#include "api/session.h"
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

struct TsSession {
  ApiSession s;
  FILE *diag;                /* this call's diagnostics: a memory stream over dbuf */
  char *dbuf;
  size_t dlen;
  VEC(char *) strs;          /* copies of option values, the input name and the source */
  IrModule *m;               /* the last compilation's module, or NULL */
  char *after;               /* the IR after pass after_pass (option print-ir-after), or NULL */
  const char *after_pass;
  StrBuf plan, text;         /* what ts_session_plan / report / ir returned last */
};

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;

uint32_t ts_version(void) { return TESSERA_VERSION_NUMBER; }
const char *ts_version_string(void) { return TESSERA_VERSION_STRING; }
int32_t ts_plan_format(void) { return PLAN_VERSION; }

const char *ts_status_name(TsStatus st) {
  switch (st) {
  case TS_OK: return "ok";
  case TS_ERR_OPTION: return "option";
  case TS_ERR_COMPILE: return "compile";
  case TS_ERR_IO: return "io";
  case TS_ERR_STATE: return "state";
  case TS_ERR_INTERNAL: return "internal";
  }
  return "unknown";
}

/* A fresh diagnostics stream for this call (the last call's text goes). */
static int begin(TsSession *s) {
  pthread_mutex_lock(&api_lock);
  if (s->diag) fclose(s->diag);
  free(s->dbuf);
  s->dbuf = NULL;
  s->dlen = 0;
  s->diag = open_memstream(&s->dbuf, &s->dlen);
  if (!s->diag) {
    pthread_mutex_unlock(&api_lock);
    return -1;
  }
  s->s.diag = s->s.mdl.diag = s->diag;
  return 0;
}

static TsStatus end(TsSession *s, TsStatus st) {
  fflush(s->diag);
  pthread_mutex_unlock(&api_lock);
  return st;
}

static const char *keep(TsSession *s, const char *str) {
  char *c = ts_xstrdup(str);
  VEC_PUSH(s->strs, c);
  return c;
}

TsSession *ts_session_new(void) {
  TsSession *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  api_session_init(&s->s, "tessera", NULL);
  s->s.api = 1;
  if (begin(s) != 0) {
    api_session_free(&s->s);
    free(s);
    return NULL;
  }
  end(s, TS_OK);
  return s;
}

static void drop_results(TsSession *s) {
  ir_module_free(s->m);
  s->m = NULL;
  free(s->after);
  s->after = NULL;
  s->after_pass = NULL;
}

void ts_session_free(TsSession *s) {
  if (!s) return;
  pthread_mutex_lock(&api_lock);
  drop_results(s);
  api_session_free(&s->s);
  for (int i = 0; i < s->strs.n; i++) free(s->strs.a[i]);
  free(s->strs.a);
  sb_free(&s->plan);
  sb_free(&s->text);
  if (s->diag) fclose(s->diag);
  free(s->dbuf);
  pthread_mutex_unlock(&api_lock);
  free(s);
}

const char *ts_session_errors(const TsSession *s) {
  if (!s) return "tessera: no session (NULL)\n";
  if (s->diag) fflush(s->diag);
  return s->dbuf ? s->dbuf : "";
}

/* A NULL session or argument: TS_ERR_STATE, with a message when there is a session. */
static TsStatus null_arg(TsSession *s, const char *call, const char *what) {
  if (!s || begin(s) != 0) return TS_ERR_STATE;
  api_diag(&s->s, "error: %s: %s is NULL\n", call, what);
  return end(s, TS_ERR_STATE);
}

TsStatus ts_session_set(TsSession *s, const char *name, const char *value) {
  if (!s || !name) return null_arg(s, "ts_session_set", "the option name");
  if (begin(s) != 0) return TS_ERR_STATE;
  int rc = api_opt_apply(&s->s, name, value ? keep(s, value) : NULL);
  return end(s, rc == API_OK ? TS_OK : TS_ERR_OPTION);
}

/* The status of a failed compilation: the compiler's own bug or the model's. */
static TsStatus compile_status(TsSession *s) {
  fflush(s->diag);
  return s->dbuf && strstr(s->dbuf, "internal error") ? TS_ERR_INTERNAL : TS_ERR_COMPILE;
}

static TsStatus compile(TsSession *s, const char *name, const char *source) {
  drop_results(s);
  s->s.input = keep(s, name);
  s->s.source = source ? keep(s, source) : NULL;
  if (api_opt_finish(&s->s) != API_OK) return end(s, TS_ERR_OPTION);
  if (!source && access(name, R_OK) != 0) {
    api_diag(&s->s, "error: cannot open '%s': %s\n", name, strerror(errno));
    return end(s, TS_ERR_IO);
  }
  /* print-ir-after: the text into the session, never to stdout */
  char *abuf = NULL;
  size_t alen = 0;
  FILE *af = s->s.cx->print_after ? open_memstream(&abuf, &alen) : NULL;
  s->s.cx->print_to = af;
  s->m = api_compile_main(&s->s, NULL);
  s->s.cx->print_to = NULL;
  if (af) {
    fclose(af);
    if (s->m) {
      s->after = abuf;
      s->after_pass = s->s.cx->print_after;
    } else free(abuf);
  }
  return end(s, s->m ? TS_OK : compile_status(s));
}

TsStatus ts_session_compile_file(TsSession *s, const char *path) {
  if (!s || !path) return null_arg(s, "ts_session_compile_file", "the path");
  if (begin(s) != 0) return TS_ERR_STATE;
  return compile(s, path, NULL);
}

TsStatus ts_session_compile_string(TsSession *s, const char *name, const char *source) {
  if (!s || !source) return null_arg(s, "ts_session_compile_string", "the source");
  if (begin(s) != 0) return TS_ERR_STATE;
  return compile(s, name && *name ? name : "<string>", source);
}

/* The calls on a compiled module: TS_ERR_STATE (with why) when there is none. */
static int need_module(TsSession *s, const char *call) {
  if (s->m) return 0;
  api_diag(&s->s, "error: %s: no compiled model (call ts_session_compile_file or ts_session_compile_string first, "
                  "and check that it returned TS_OK)\n", call);
  return -1;
}

TsStatus ts_session_plan(TsSession *s, const void **data, size_t *size) {
  if (!s || !data || !size) return null_arg(s, "ts_session_plan", "an argument");
  if (begin(s) != 0) return TS_ERR_STATE;
  if (need_module(s, "ts_session_plan") != 0) return end(s, TS_ERR_STATE);
  Plan *p = api_make_plan(&s->s, ir_module_clone(s->m));
  if (!p) return end(s, compile_status(s));
  s->plan.n = 0;
  plan_encode(p, &s->plan);
  plan_free(p);
  *data = s->plan.p;
  *size = s->plan.n;
  return end(s, TS_OK);
}

TsStatus ts_session_write_plan(TsSession *s, const char *path) {
  if (!s || !path) return null_arg(s, "ts_session_write_plan", "the path");
  if (begin(s) != 0) return TS_ERR_STATE;
  if (need_module(s, "ts_session_write_plan") != 0) return end(s, TS_ERR_STATE);
  if (!*path || strcmp(path, "-") == 0) {
    api_diag(&s->s, "error: ts_session_write_plan needs a file path, got '%s' (ts_session_plan gives the bytes)\n", path);
    return end(s, TS_ERR_IO);
  }
  Plan *p = api_make_plan(&s->s, ir_module_clone(s->m));
  if (!p) return end(s, compile_status(s));
  ApiSession w = s->s;   /* mcc's plan output (api_plan_output): -o path, --emit=plan */
  w.output = path;
  w.emit = "plan";
  int rc = api_plan_output(&w, p);
  plan_free(p);
  return end(s, rc == 0 ? TS_OK : s->dbuf && strstr(s->dbuf, "internal error") ? TS_ERR_INTERNAL : TS_ERR_IO);
}

TsStatus ts_session_report(TsSession *s, const char *kind, const char **text) {
  if (!s || !kind || !text) return null_arg(s, "ts_session_report", "an argument");
  if (begin(s) != 0) return TS_ERR_STATE;
  *text = NULL;
  int known = !strcmp(kind, "memory") || !strcmp(kind, "comm") || !strcmp(kind, "sharding") ||
              !strcmp(kind, "schedule") || !strcmp(kind, "time");
  if (!known) {
    api_diag(&s->s, "error: ts_session_report: '%s' is no report; the library has memory, comm, sharding, schedule "
                    "and time%s\n", kind, strcmp(kind, "kernels") == 0 ? " (kernels is mcc's: mcc --report kernels)" : "");
    return end(s, TS_ERR_OPTION);
  }
  if (!strcmp(kind, "time") && !s->s.hw) {
    api_diag(&s->s, "error: the time report needs the option hw (a100-80gb, h100-sxm, h200, b200, or a file: "
                    "hw/README.md)\n");
    return end(s, TS_ERR_OPTION);
  }
  if (need_module(s, "ts_session_report") != 0) return end(s, TS_ERR_STATE);
  s->text.n = 0;
  if (s->text.p) s->text.p[0] = 0;
  int rc;
  if (!strcmp(kind, "schedule")) {   /* from the frontend again, as mcc --report schedule */
    ApiSession v = s->s;
    v.report = "schedule";
    v.trace = NULL;
    StrBuf tr = {0};
    const char *after = v.cx->print_after;   /* kept by the compilation; a report prints nothing */
    v.cx->print_after = NULL;
    rc = api_pipe_views(&v, v.cx, &s->text, &tr);
    v.cx->print_after = after;
    sb_free(&tr);
  } else {
    rc = api_report(&s->s, kind, s->m, &s->text);
  }
  if (rc != 0) return end(s, compile_status(s));
  *text = s->text.p ? s->text.p : "";
  return end(s, TS_OK);
}

TsStatus ts_session_ir(TsSession *s, const char *pass, const char **text) {
  if (!s || !text) return null_arg(s, "ts_session_ir", "an argument");
  if (begin(s) != 0) return TS_ERR_STATE;
  *text = NULL;
  if (need_module(s, "ts_session_ir") != 0) return end(s, TS_ERR_STATE);
  if (!pass || !strcmp(pass, "final")) {
    s->text.n = 0;
    ir_print_module(s->m, &s->text);
    *text = s->text.p;
    return end(s, TS_OK);
  }
  char err[512];
  if (pass_check_name(pass, "ts_session_ir", err, sizeof err) != 0) {
    api_diag(&s->s, "error: %s\n", err);
    return end(s, TS_ERR_OPTION);
  }
  if (!s->after_pass || strcmp(s->after_pass, pass) != 0) {
    api_diag(&s->s, "error: the IR after pass '%s' was not kept: set the option print-ir-after=%s before compiling "
                    "(one pass per compilation; dump-ir=all DIR writes every pass's to files)\n", pass, pass);
    return end(s, TS_ERR_STATE);
  }
  *text = s->after;
  return end(s, TS_OK);
}
