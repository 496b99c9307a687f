/* mrun - trains a compiled plan:
 *
 *   mrun PLAN [--gpus N] [--steps N] [--data FILE] [--metrics out.jsonl]
 *             [--seed N] [--quiet]
 *
 * Loads the plan (binary or text, as written by mcc; a bare IR module
 * with blocks "micro" and "update" is accepted too), takes rank 0's
 * program and trains it on the byte corpus with the reference CPU runtime
 * (runtime/train.c).  Single rank for now: multi-rank plans and --gpus
 * N > 1 are refused with a message.  Exit status 0 on success, 1 on any
 * error (after a message on stderr), 2 on bad usage. */
#include "runtime/plan.h"
#include "runtime/train.h"
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: mrun PLAN [--gpus N] [--steps N] [--data FILE] [--metrics out.jsonl] [--seed N] [--quiet]\n"
    "  PLAN             a plan from mcc (binary or --emit=plan-text), or an IR module text\n"
    "  --gpus N         GPUs to use (only 1 rank is supported for now; CPU without a driver)\n"
    "  --steps N        train N steps instead of the plan's train.steps\n"
    "  --data FILE      training text, byte-level tokens (default samples/data/kjv.txt)\n"
    "  --metrics FILE   write one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, elapsed_s)\n"
    "  --seed N         override the plan's train.seed (initialization, data order, dropout)\n"
    "  --quiet          no per-step progress lines\n"
    "environment: TS_RT_PROFILE=1 prints the time spent per op at exit\n";

typedef struct {
  const char *plan, *data, *metrics;
  int64_t gpus, steps;        /* -1: not given */
  int has_seed, quiet;
  uint64_t seed;
} Args;

/* Parses a non-negative integer option value; 0 or -1 with a message. */
static int parse_count(const char *opt, const char *s, int64_t max, int64_t *out) {
  char *e;
  errno = 0;
  long long v = s ? strtoll(s, &e, 10) : 0;
  if (!s || !*s || *e || errno || v < 0 || v > max) {
    fprintf(stderr, "mrun: %s needs a whole number in [0, %lld], got '%s'\n", opt, (long long)max, s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* Accepts "--opt VALUE" and "--opt=VALUE".  0, -1 (error), 1 (--help). */
static int parse_args(int argc, char **argv, Args *a) {
  memset(a, 0, sizeof *a);
  a->gpus = a->steps = -1;
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i], *val = NULL;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return 1;
    if (strcmp(arg, "--quiet") == 0) { a->quiet = 1; continue; }
    if (strncmp(arg, "--", 2) != 0) {
      if (a->plan) { fprintf(stderr, "mrun: more than one plan given ('%s' and '%s')\n", a->plan, arg); return -1; }
      a->plan = arg;
      continue;
    }
    char name[32];
    char *eq = strchr(arg, '=');
    size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
    snprintf(name, sizeof name, "%.*s", (int)(nl < 31 ? nl : 31), arg);
    if (eq) val = eq + 1;
    else if (i + 1 < argc) val = argv[++i];
    else { fprintf(stderr, "mrun: %s needs a value\n", name); return -1; }
    int64_t v;
    if (strcmp(name, "--gpus") == 0) { if (parse_count(name, val, 1 << 20, &a->gpus)) return -1; }
    else if (strcmp(name, "--steps") == 0) { if (parse_count(name, val, INT64_MAX / 2, &a->steps)) return -1; }
    else if (strcmp(name, "--seed") == 0) {
      if (parse_count(name, val, INT64_MAX, &v)) return -1;
      a->seed = (uint64_t)v;
      a->has_seed = 1;
    }
    else if (strcmp(name, "--data") == 0) a->data = val;
    else if (strcmp(name, "--metrics") == 0) a->metrics = val;
    else { fprintf(stderr, "mrun: unknown option '%s'\n%s", name, usage); return -1; }
  }
  if (!a->plan) { fprintf(stderr, "mrun: no plan given\n%s", usage); return -1; }
  return 0;
}

/* Is the text an IR module (after comments and blank lines)? */
static int is_module_text(const char *s) {
  for (;;) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    if (*s != '#') break;
    s += strcspn(s, "\n");
  }
  return strncmp(s, "module ", 7) == 0;
}

/* Loads PATH as a plan, or as a one-rank plan around a bare IR module. */
static RtPlan *load_plan(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "cannot read plan '%s': it is a directory", path);
    return NULL;
  }
  size_t len = 0;
  char *text = ts_read_file(path, &len);
  if (!text) { snprintf(err, errlen, "cannot read plan '%s': %s", path, strerror(errno)); return NULL; }
  int bare = strlen(text) == len && is_module_text(text);
  RtPlan *p = NULL;
  if (bare) {
    IrModule *m = ir_parse_module(text, path, err, errlen);
    if (m) {
      p = rt_plan_new();
      p->version = RT_PLAN_VERSION;
      p->mesh = (RtMesh){1, 1, 1, 1, 1};
      p->nprograms = 1;
      p->programs = ts_xcalloc(1, sizeof *p->programs);
      p->programs[0] = m;
      p->nranks = 1;
      p->rank_program = ts_xcalloc(1, sizeof *p->rank_program);
    }
  }
  free(text);
  return bare ? p : rt_plan_read(path, err, errlen);
}

int main(int argc, char **argv) {
  Args a;
  int pr = parse_args(argc, argv, &a);
  if (pr == 1) { fputs(usage, stdout); return 0; }
  if (pr != 0) return 2;
  if (a.gpus > 1) {
    fprintf(stderr, "mrun: --gpus %lld: multi-rank execution is not supported yet (single rank only)\n",
            (long long)a.gpus);
    return 1;
  }
  char msg[256];
  int ngpu = rt_gpu_probe(msg, sizeof msg);
  if (ngpu == 0) fprintf(stderr, "mrun: %s; running on CPU ranks\n", msg);
  else fprintf(stderr, "mrun: %s, but CUDA execution is not implemented yet; running on CPU ranks\n", msg);

  char err[2048] = "";
  RtPlan *plan = load_plan(a.plan, err, sizeof err);
  if (!plan) { fprintf(stderr, "mrun: %s\n", err); return 1; }
  int rc = 1;
  if (plan->nranks < 1 || plan->nprograms < 1 || !plan->rank_program ||
      plan->rank_program[0] < 0 || plan->rank_program[0] >= plan->nprograms) {
    fprintf(stderr, "mrun: %s: the plan has no program for rank 0\n", a.plan);
    goto out;
  }
  if (plan->nranks > 1) {
    fprintf(stderr, "mrun: %s: the plan has %d ranks; multi-rank execution is not supported yet\n",
            a.plan, plan->nranks);
    goto out;
  }
  IrModule *m = plan->programs[plan->rank_program[0]];
  /* a plan from another build or edited by hand: refuse it with the
   * verifier's message rather than fail somewhere inside a kernel */
  if (ir_verify(m, err, sizeof err) != 0) {
    fprintf(stderr, "mrun: %s: rank 0's program is invalid: %s\n", a.plan, err);
    goto out;
  }
  if (a.steps >= 0) m->train.steps = a.steps;   /* decay_steps 0 follows it */
  if (a.has_seed) m->train.seed = a.seed;
  RtTrainOpts o = {a.data, a.metrics, a.quiet, stdout};
  RtTrainResult res;
  if (rt_train(m, &o, &res, err, sizeof err) != 0) {
    fprintf(stderr, "mrun: %s\n", err);
    goto out;
  }
  if (!a.quiet && res.steps > 0)
    printf("mrun: trained %lld steps: loss %.4f -> %.4f\n", (long long)res.steps, res.first_loss, res.last_loss);
  rc = 0;
out:
  rt_plan_free(plan);
  return rc;
}
