/* options.c - mcc's options, one table for both clients: mcc's argv parser
 * (tools/mcc.c) and ts_session_set (api/tessera.c) look every option up in
 * api_options[] and apply it with api_opt_apply, so a flag cannot exist in
 * one and not the other, nor mean two things.  Megatron-LM's flags that
 * mean what one of ours means are rows of the same table (docs/cli.md has
 * the mapping).  Rows marked MCC_ONLY are the command-line program's own
 * (they write files or run programs the library has calls for, or none):
 * the library refuses them, naming the call that does their job.
 *
 * Every message goes to a->diag (api_diag); nothing here exits. */
#include "api/session.h"
#include "codegen/cuda.h"
#include "plan/schedule.h"
#include "passes/pipe.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>

typedef enum {
  O_HELP, O_VERSION, O_OUTPUT, O_DEFINE, O_PRECISION, O_SIZE, O_SP, O_OVERLAP, O_NO_OVERLAP, O_BUCKET, O_NO_ZERO,
  O_ZERO, O_NO_FUSE, O_NO_REMAT, O_DECODE, O_LOSS_SCALE, O_POLICY, O_MAX_SOURCE, O_KEEP_GATHERED, O_REGATHER,
  O_ACT_BUDGET, O_RECOMPUTE, O_MEM_BUDGET, O_CP_ATTN, O_EMIT_LLVM, O_EMIT_CUDA, O_TARGET, O_CHECK, O_STDLIB,
  O_TRACE, O_HW, O_SCHEDULE, O_PP_LAYOUT, O_PP_LAYERS, O_PP_STACK, O_EMIT, O_DUMP_IR, O_PRINT_AFTER, O_VERIFY_EACH,
  O_NO_VERIFY, O_VERIFY_RT, O_TIME, O_STATS, O_REPORT, O_EXPLAIN, O_AUTO_LAYOUT, O_MEMORY,
  O_FP8, O_FP8_OPT,
  O_MG_SIZE, O_MG_SWITCH, O_MG_CONFIG, O_MG_TRAIN, O_RAMPUP   /* Megatron-LM's flags: a size, a switch, a config key, a train field */
} OptId;

enum {
  MCC_ONLY = 1,     /* the command-line program's own: the library refuses it */
  INLINE_ONLY = 2,  /* only as "--flag=VALUE" ("--emit=ir"): the bare name is no option */
  NOT_BUILT = 4     /* a flag users know (Megatron's) that is not built: refused with `instead` as the reason */
};

typedef struct {
  const char *name;   /* as on mcc's command line; a trailing '=' takes a suffix ("--dump-ir=PASS DIR") */
  ApiArg arg;
  OptId id;
  const char *to;     /* O_SIZE / O_MG_*: the field or option it sets */
  int flags;
  const char *instead;   /* MCC_ONLY: what the library has instead; NOT_BUILT: why it is refused */
} ApiOption;

static const ApiOption api_options[] = {
    {"--help", API_ARG_NONE, O_HELP, NULL, MCC_ONLY, "the options are documented in docs/cli.md"},
    {"-h", API_ARG_NONE, O_HELP, NULL, MCC_ONLY, "the options are documented in docs/cli.md"},
    {"--version", API_ARG_NONE, O_VERSION, NULL, MCC_ONLY, "ts_version_string()"},
    {"-o", API_ARG_VALUE, O_OUTPUT, NULL, MCC_ONLY, "ts_session_write_plan() or ts_session_plan()"},
    {"-D", API_ARG_VALUE, O_DEFINE, NULL, 0, NULL},
    {"--precision", API_ARG_VALUE, O_PRECISION, NULL, 0, NULL},
    {"--tp", API_ARG_VALUE, O_SIZE, "tp", 0, NULL},
    {"--pp", API_ARG_VALUE, O_SIZE, "pp", 0, NULL},
    {"--cp", API_ARG_VALUE, O_SIZE, "cp", 0, NULL},
    {"--ep", API_ARG_VALUE, O_SIZE, "ep", 0, NULL},
    {"--dp", API_ARG_VALUE, O_SIZE, "dp", 0, NULL},
    {"--vpp", API_ARG_VALUE, O_SIZE, "vpp", 0, NULL},
    {"--gpus", API_ARG_VALUE, O_SIZE, "gpus", MCC_ONLY, "the option dp (a layout at dp = N / (tp pp cp ep))"},
    {"--steps", API_ARG_VALUE, O_SIZE, "steps", MCC_ONLY, "nothing: it goes with --check, which runs mrun"},
    {"--sp", API_ARG_NONE, O_SP, NULL, 0, NULL},
    {"--no-overlap-grad-reduce", API_ARG_NONE, O_NO_OVERLAP, NULL, 0, NULL},
    {"--overlap-grad-reduce", API_ARG_NONE, O_OVERLAP, NULL, 0, NULL},
    {"--dp-bucket-size", API_ARG_VALUE, O_BUCKET, NULL, 0, NULL},
    {"--ddp-bucket-size", API_ARG_VALUE, O_BUCKET, NULL, 0, NULL},
    {"--no-zero", API_ARG_NONE, O_NO_ZERO, NULL, 0, NULL},
    {"--zero", API_ARG_VALUE, O_ZERO, NULL, 0, NULL},
    {"--no-fuse", API_ARG_NONE, O_NO_FUSE, NULL, 0, NULL},
    {"--no-remat", API_ARG_NONE, O_NO_REMAT, NULL, 0, NULL},
    {"--decode", API_ARG_NONE, O_DECODE, NULL, 0, NULL},
    {"--loss-scale", API_ARG_VALUE, O_LOSS_SCALE, NULL, 0, NULL},
    {"--initial-loss-scale", API_ARG_VALUE, O_LOSS_SCALE, NULL, 0, NULL},
    {"--min-loss-scale", API_ARG_VALUE, O_LOSS_SCALE, NULL, 0, NULL},
    {"--loss-scale-window", API_ARG_VALUE, O_LOSS_SCALE, NULL, 0, NULL},
    {"--hysteresis", API_ARG_VALUE, O_LOSS_SCALE, NULL, 0, NULL},
    {"--precision-policy", API_ARG_VALUE, O_POLICY, NULL, 0, NULL},
    {"--fp8", API_ARG_VALUE, O_FP8, NULL, 0, NULL},
    {"--fp8-format", API_ARG_VALUE, O_FP8, NULL, 0, NULL},   /* Megatron's name */
    {"--fp8-amax-history-len", API_ARG_VALUE, O_FP8_OPT, NULL, 0, NULL},
    {"--fp8-amax-compute-algo", API_ARG_VALUE, O_FP8_OPT, NULL, 0, NULL},
    {"--fp8-margin", API_ARG_VALUE, O_FP8_OPT, NULL, 0, NULL},
    {"--fp8-all-layers", API_ARG_NONE, O_FP8_OPT, NULL, 0, NULL},
    {"--max-source-bytes", API_ARG_VALUE, O_MAX_SOURCE, NULL, 0, NULL},
    {"--keep-gathered", API_ARG_NONE, O_KEEP_GATHERED, NULL, 0, NULL},
    {"--regather", API_ARG_NONE, O_REGATHER, NULL, 0, NULL},
    {"--activation-budget", API_ARG_VALUE, O_ACT_BUDGET, NULL, 0, NULL},
    {"--recompute", API_ARG_VALUE, O_RECOMPUTE, NULL, 0, NULL},
    {"--memory-budget", API_ARG_VALUE, O_MEM_BUDGET, NULL, 0, NULL},
    {"--cp-attn", API_ARG_VALUE, O_CP_ATTN, NULL, 0, NULL},
    {"--emit=llvm", API_ARG_VALUE, O_EMIT_LLVM, NULL, MCC_ONLY, "nothing yet: run mcc --emit=llvm DIR"},
    {"--emit=cuda", API_ARG_VALUE, O_EMIT_CUDA, NULL, MCC_ONLY, "nothing yet: run mcc --emit=cuda DIR"},
    {"--target", API_ARG_VALUE, O_TARGET, NULL, MCC_ONLY, "nothing yet: run mcc --target (it needs NVRTC)"},
    {"--check", API_ARG_NONE, O_CHECK, NULL, MCC_ONLY, "nothing: it runs mrun; run mcc --check"},
    {"--stdlib", API_ARG_VALUE, O_STDLIB, NULL, 0, NULL},
    {"--emit=trace", API_ARG_VALUE, O_TRACE, NULL, MCC_ONLY, "ts_session_report(s, \"schedule\") for the table"},
    {"--hw", API_ARG_VALUE, O_HW, NULL, 0, NULL},
    {"--schedule", API_ARG_VALUE, O_SCHEDULE, NULL, 0, NULL},
    {"--pp-layout", API_ARG_VALUE, O_PP_LAYOUT, NULL, 0, NULL},
    {"--pp-layers", API_ARG_VALUE, O_PP_LAYERS, NULL, 0, NULL},
    {"--pp-stack", API_ARG_VALUE, O_PP_STACK, NULL, 0, NULL},
    {"--emit", API_ARG_VALUE, O_EMIT, NULL, MCC_ONLY | INLINE_ONLY, "ts_session_plan() and ts_session_ir()"},
    {"--dump-ir=", API_ARG_SUFFIX, O_DUMP_IR, NULL, 0, NULL},
    {"--print-ir-after", API_ARG_VALUE, O_PRINT_AFTER, NULL, 0, NULL},
    {"--verify-each", API_ARG_NONE, O_VERIFY_EACH, NULL, 0, NULL},
    {"--no-verify", API_ARG_NONE, O_NO_VERIFY, NULL, 0, NULL},
    {"--verify-roundtrip", API_ARG_NONE, O_VERIFY_RT, NULL, 0, NULL},
    {"--time", API_ARG_NONE, O_TIME, NULL, MCC_ONLY, "nothing: time the calls"},
    {"--stats", API_ARG_NONE, O_STATS, NULL, MCC_ONLY, "nothing yet: run mcc --stats"},
    {"--report", API_ARG_VALUE, O_REPORT, NULL, MCC_ONLY, "ts_session_report()"},
    {"--explain-sharding", API_ARG_NONE, O_EXPLAIN, NULL, MCC_ONLY, "ts_session_report(s, \"sharding\")"},
    {"--auto-layout", API_ARG_NONE, O_AUTO_LAYOUT, NULL, MCC_ONLY, "nothing yet: run mcc --auto-layout"},
    {"--memory", API_ARG_VALUE, O_MEMORY, NULL, MCC_ONLY, "nothing: it goes with --auto-layout"},
    /* Megatron-LM's flags that mean what one of ours means (docs/cli.md has the table).  A config flag
     * sets the config key of that name, which the samples use (a model without it is refused, naming
     * the flag); a train flag sets the train field over the train block's value. */
    {"--tensor-model-parallel-size", API_ARG_VALUE, O_MG_SIZE, "--tp", 0, NULL},
    {"--pipeline-model-parallel-size", API_ARG_VALUE, O_MG_SIZE, "--pp", 0, NULL},
    {"--context-parallel-size", API_ARG_VALUE, O_MG_SIZE, "--cp", 0, NULL},
    {"--expert-model-parallel-size", API_ARG_VALUE, O_MG_SIZE, "--ep", 0, NULL},
    {"--num-layers-per-virtual-pipeline-stage", API_ARG_VALUE, O_MG_SIZE, "--vpp", 0, NULL},
    {"--sequence-parallel", API_ARG_NONE, O_MG_SWITCH, "--sp", 0, NULL},
    {"--use-distributed-optimizer", API_ARG_NONE, O_MG_SWITCH, "zero", 0, NULL},
    {"--num-layers", API_ARG_VALUE, O_MG_CONFIG, "layers", 0, NULL},
    {"--hidden-size", API_ARG_VALUE, O_MG_CONFIG, "d_model", 0, NULL},
    {"--ffn-hidden-size", API_ARG_VALUE, O_MG_CONFIG, "ffn", 0, NULL},
    {"--num-attention-heads", API_ARG_VALUE, O_MG_CONFIG, "heads", 0, NULL},
    {"--num-query-groups", API_ARG_VALUE, O_MG_CONFIG, "kv_heads", 0, NULL},
    {"--seq-length", API_ARG_VALUE, O_MG_CONFIG, "seq_len", 0, NULL},
    {"--micro-batch-size", API_ARG_VALUE, O_MG_CONFIG, "micro_batch", 0, NULL},
    {"--num-experts", API_ARG_VALUE, O_MG_CONFIG, "experts", 0, NULL},
    {"--moe-router-topk", API_ARG_VALUE, O_MG_CONFIG, "topk", 0, NULL},
    {"--global-batch-size", API_ARG_VALUE, O_MG_TRAIN, "global_batch", 0, NULL},
    {"--train-iters", API_ARG_VALUE, O_MG_TRAIN, "steps", 0, NULL},
    {"--lr", API_ARG_VALUE, O_MG_TRAIN, "lr", 0, NULL},
    {"--min-lr", API_ARG_VALUE, O_MG_TRAIN, "min_lr", 0, NULL},
    {"--lr-warmup-iters", API_ARG_VALUE, O_MG_TRAIN, "warmup", 0, NULL},
    {"--lr-decay-iters", API_ARG_VALUE, O_MG_TRAIN, "decay_steps", 0, NULL},
    {"--lr-decay-style", API_ARG_VALUE, O_MG_TRAIN, "schedule", 0, NULL},
    {"--clip-grad", API_ARG_VALUE, O_MG_TRAIN, "clip_grad", 0, NULL},
    {"--weight-decay", API_ARG_VALUE, O_MG_TRAIN, "weight_decay", 0, NULL},
    {"--adam-beta1", API_ARG_VALUE, O_MG_TRAIN, "beta1", 0, NULL},
    {"--adam-beta2", API_ARG_VALUE, O_MG_TRAIN, "beta2", 0, NULL},
    {"--adam-eps", API_ARG_VALUE, O_MG_TRAIN, "eps", 0, NULL},
    {"--seed", API_ARG_VALUE, O_MG_TRAIN, "seed", 0, NULL},
    /* optimizers and schedules (issue 24, deliverable 8); Megatron spells sgd's momentum --sgd-momentum */
    {"--optimizer", API_ARG_VALUE, O_MG_TRAIN, "optimizer", 0, NULL},
    {"--sgd-momentum", API_ARG_VALUE, O_MG_TRAIN, "momentum", 0, NULL},
    {"--momentum", API_ARG_VALUE, O_MG_TRAIN, "momentum", 0, NULL},
    {"--nesterov", API_ARG_NONE, O_MG_SWITCH, "nesterov", 0, NULL},
    {"--no-nesterov", API_ARG_NONE, O_MG_SWITCH, "no-nesterov", 0, NULL},
    {"--muon-momentum", API_ARG_VALUE, O_MG_TRAIN, "muon_momentum", 0, NULL},
    {"--muon-ns-steps", API_ARG_VALUE, O_MG_TRAIN, "muon_ns_steps", 0, NULL},
    {"--muon-adamw-lr", API_ARG_VALUE, O_MG_TRAIN, "muon_adamw_lr", 0, NULL},
    /* START INCR SAMPLES: three words on mcc's command line (tools/mcc.c), one "S I N" string in the library */
    {"--rampup-batch-size", API_ARG_VALUE, O_RAMPUP, NULL, 0, NULL},
    {"--train-samples", API_ARG_VALUE, O_MG_TRAIN, "train_samples", 0, NULL},
    {"--muon-tp-mode", API_ARG_VALUE, O_MG_TRAIN, "muon_tp", 0, NULL},
    {"--lr-wsd-decay-style", API_ARG_VALUE, O_MG_TRAIN, "wsd_style", 0, NULL},
    {"--lr-wsd-decay-iters", API_ARG_VALUE, O_MG_TRAIN, "wsd_decay_steps", 0, NULL},
};
enum { API_NOPTIONS = (int)(sizeof api_options / sizeof api_options[0]) };

void api_diag(const ApiSession *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(a->diag, "%s: ", a->prog);
  vfprintf(a->diag, fmt, ap);
  va_end(ap);
}

/* A refused option: the message, then where the options are described. */
static int usage_error(const ApiSession *a, const char *fmt, const char *arg) {
  fprintf(a->diag, "%s: ", a->prog);
  fprintf(a->diag, fmt, arg);
  if (a->api) fprintf(a->diag, "\n(the options are mcc's: docs/cli.md, docs/embedding.md)\n");
  else fprintf(a->diag, "\n(run 'mcc --help' for the options)\n");
  return API_USAGE;
}

/* The row named exactly n bytes of s (dashes as written), or NULL. */
static const ApiOption *find_row(const char *s, size_t n) {
  for (int k = 0; k < API_NOPTIONS; k++)
    if (strlen(api_options[k].name) == n && strncmp(api_options[k].name, s, n) == 0) return &api_options[k];
  return NULL;
}

/* The row of `name` as written, or with its dashes added ("tp" -> "--tp", "D" -> "-D"). */
static const ApiOption *find_named(const char *name, size_t n) {
  const ApiOption *r = find_row(name, n);
  if (r || name[0] == '-') return r;
  char buf[128];
  if (n + 3 > sizeof buf) return NULL;
  for (int dashes = 2; dashes >= 1 && !r; dashes--) {
    snprintf(buf, sizeof buf, "%.*s%.*s", dashes, "--", (int)n, name);
    r = find_row(buf, n + (size_t)dashes);
  }
  return r;
}

static const ApiOption *lookup(const char *name, const char **sub, const char **inline_value) {
  *sub = *inline_value = NULL;
  size_t n = strlen(name);
  const ApiOption *r = find_named(name, n);
  if (r) return r->flags & INLINE_ONLY ? NULL : r;
  const char *eq = strchr(name, '=');
  if (!eq) return NULL;
  size_t k = (size_t)(eq - name);
  if ((r = find_named(name, k + 1)) && r->arg == API_ARG_SUFFIX) {   /* --dump-ir=PASS */
    *sub = eq + 1;
    return r;
  }
  if ((r = find_named(name, k)) && r->arg != API_ARG_SUFFIX) {       /* --flag=VALUE (a switch refuses it) */
    *inline_value = eq + 1;
    return r;
  }
  return NULL;
}

int api_opt_lookup(const char *name, ApiArg *arg, const char **sub, const char **inline_value) {
  const ApiOption *r = lookup(name, sub, inline_value);
  if (!r) return -1;
  *arg = *inline_value ? API_ARG_NONE : r->arg == API_ARG_SUFFIX ? API_ARG_VALUE : r->arg;
  return 0;
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

/* A byte count: decimal digits, with suffixes K / M / G (KiB, MiB, GiB)
 * when allowed; at most INT64_MAX.  0, or -1 for anything else. */
static int parse_bytes(const char *s, int suffixes, unsigned long long *out) {
  char *e;
  errno = 0;
  if (!*s || *s < '0' || *s > '9') return -1;
  unsigned long long v = strtoull(s, &e, 10), mul = 1;
  if (suffixes && (*e == 'K' || *e == 'M' || *e == 'G')) mul = 1ull << (*e == 'K' ? 10 : *e == 'M' ? 20 : 30), e++;
  if (*e || errno || v > (unsigned long long)INT64_MAX / mul) return -1;
  *out = v * mul;
  return 0;
}

static int *size_field(ApiSession *a, const char *to) {
  return !strcmp(to, "tp") || !strcmp(to, "--tp") ? &a->mdl.tp : !strcmp(to, "pp") || !strcmp(to, "--pp") ? &a->mdl.pp
       : !strcmp(to, "cp") || !strcmp(to, "--cp") ? &a->mdl.cp : !strcmp(to, "ep") || !strcmp(to, "--ep") ? &a->mdl.ep
       : !strcmp(to, "dp") ? &a->dp : !strcmp(to, "steps") ? &a->steps : !strcmp(to, "gpus") ? &a->gpus
       : !strcmp(to, "vpp") ? &a->vpp : &a->vstage_layers;
}

/* A Megatron flag's config key or train field: the last value wins, as with -D. */
static void mg_setting(ApiSession *a, const ApiOption *r, const char *val) {
  MdlSetting set = {ts_intern(r->to), val, r->name};
  __typeof__(a->config_sets) *list = r->id == O_MG_CONFIG ? &a->config_sets : &a->train_sets;
  for (int j = 0; j < list->n; j++)
    if (list->a[j].name == set.name) {
      api_diag(a, "warning: %s is given twice; the last value (%s) replaces %s\n", r->name, val, list->a[j].value);
      list->a[j] = set;
      return;
    }
  VEC_PUSH(*list, set);
}

static int opt_define(ApiSession *a, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv) return usage_error(a, "-D needs key=value, got '%s'", kv);
  MdlDefine d = {ts_intern_n(kv, (size_t)(eq - kv)), eq + 1};
  /* the last value of a key wins (as with cc -D); a warning says so */
  for (int k = 0; k < a->defines.n; k++)   /* interned: one pointer per name */
    if (a->defines.a[k].name == d.name) {
      api_diag(a, "warning: -D %s is given twice; the last value (%s) replaces %s\n", d.name, d.value,
               a->defines.a[k].value);
      a->defines.a[k].value = d.value;
      return API_OK;
    }
  VEC_PUSH(a->defines, d);
  return API_OK;
}

static int opt_loss_scale(ApiSession *a, const char *s, const char *next) {
  char *end;
  double v = strtod(next, &end);
  int whole = !strcmp(s, "--loss-scale-window") || !strcmp(s, "--hysteresis");
  if (!*next || *end || !(v > 0) || !isfinite(v) || (whole && (v != floor(v) || v > 1e15)))
    return usage_error(a, whole ? "--loss-scale-window / --hysteresis expect a positive whole number, got '%s'"
                                : "--loss-scale / --initial-loss-scale / --min-loss-scale expect a positive number, got '%s'",
                       next);
  if (!strcmp(s, "--loss-scale")) a->cx->loss_scale = v;
  else if (!strcmp(s, "--initial-loss-scale")) a->cx->initial_loss_scale = v;
  else if (!strcmp(s, "--min-loss-scale")) a->cx->min_loss_scale = v;
  else if (!strcmp(s, "--loss-scale-window")) a->cx->loss_scale_window = (int64_t)v;
  else a->cx->hysteresis = (int64_t)v;
  a->cx->loss_scale_flag = s;
  return API_OK;
}

/* --fp8 FORMAT and its settings (pass fp8, docs/precision.md "FP8") */
static int opt_fp8(ApiSession *a, const char *s, const char *next) {
  if (!strcmp(s, "--fp8") || !strcmp(s, "--fp8-format")) {
    if (!strcmp(next, "hybrid")) a->cx->fp8 = PASS_FP8_HYBRID;
    else if (!strcmp(next, "e4m3")) a->cx->fp8 = PASS_FP8_E4M3;
    else return usage_error(a, "--fp8 / --fp8-format must be hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 "
                                  "everywhere), got '%s'", next);
    return API_OK;
  }
  if (!strcmp(s, "--fp8-all-layers")) {
    a->cx->fp8_all_layers = 1;
    return API_OK;
  }
  if (!strcmp(s, "--fp8-amax-compute-algo")) {
    if (!strcmp(next, "max")) a->cx->fp8_algo = 0;
    else if (!strcmp(next, "most_recent")) a->cx->fp8_algo = 1;
    else return usage_error(a, "--fp8-amax-compute-algo must be max or most_recent, got '%s'", next);
    return API_OK;
  }
  char *end;
  double v = strtod(next, &end);
  int len = !strcmp(s, "--fp8-amax-history-len");
  if (!*next || *end || !isfinite(v) || v < (len ? 1 : 0) || (len && (v != floor(v) || v > 1000000)) || (!len && v >= 64))
    return usage_error(a, len ? "--fp8-amax-history-len expects a whole number from 1 to 1000000, got '%s'"
                              : "--fp8-margin expects a number from 0 to 63 (scale = fp8_max / amax / 2^margin), got '%s'",
                       next);
  if (len) a->cx->fp8_history = (int64_t)v;
  else a->cx->fp8_margin = v;
  return API_OK;
}

static int opt_target(ApiSession *a, const char *next) {
  for (const char *q = next; *q;) {
    size_t n = strcspn(q, ",");
    char one[16];
    snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), q);
    int sm = n < sizeof one ? cg_cuda_arch_number(one) : 0, dup = 0;
    if (!sm)
      return usage_error(a, "--target takes GPU archs sm_XX, comma separated (sm_80 for A100, sm_90 for H100 / H200, "
                            "sm_100 for B200, ...), got '%s'", next);
    for (int t = 0; t < a->nsm; t++) dup |= a->sm[t] == sm;
    if (!dup && a->nsm == (int)(sizeof a->sm / sizeof a->sm[0]))
      return usage_error(a, "--target: at most 8 archs, got '%s'", next);
    if (!dup) a->sm[a->nsm++] = sm;
    q += n + (q[n] == ',');
  }
  return API_OK;
}

static int opt_pp_layers(ApiSession *a, const char *next) {
  a->pp_layers.n = 0;
  for (const char *c = next;;) {
    char *e;
    errno = 0;
    long v = strtol(c, &e, 10);
    if (e == c || errno || v < 0 || v > 100000 || (*e && *e != ','))
      return usage_error(a, "--pp-layers needs layer counts separated by commas (e.g. 3,3,3,3), got '%s'", next);
    VEC_PUSH(a->pp_layers, (int)v);
    if (!*e) break;
    c = e + 1;
  }
  return API_OK;
}

/* The options that take a word from a fixed list, and the byte counts. */
static int opt_word(ApiSession *a, const ApiOption *r, const char *s, const char *next) {
  unsigned long long v;
  switch (r->id) {
  case O_PRECISION:
    if (strcmp(next, "f32") == 0) a->mdl.precision = IR_F32;
    else if (strcmp(next, "f64") == 0) a->mdl.precision = IR_F64;
    else if (strcmp(next, "bf16") == 0) a->mdl.precision = IR_BF16;
    else if (strcmp(next, "fp16") == 0 || strcmp(next, "f16") == 0) a->mdl.precision = IR_F16;
    else return usage_error(a, "--precision must be f32, f64, bf16 or fp16, got '%s'", next);
    return API_OK;
  case O_BUCKET: {
    int elems = s[2] == 'd' && s[3] == 'd';
    if (parse_bytes(next, !elems, &v) != 0 || v < 1 || v > (1ull << 47))
      return usage_error(a, elems ? "--ddp-bucket-size expects a positive element count up to 2^47, got '%s'"
                                  : "--dp-bucket-size expects a positive byte count (K, M, G suffixes) up to 2^47, got '%s'",
                         next);
    if (elems) a->dp_bucket_elems = (int64_t)v, a->dp_bucket_bytes = 0;
    else a->dp_bucket_bytes = (int64_t)v, a->dp_bucket_elems = 0;
    return API_OK;
  }
  case O_ZERO:
    if (strcmp(next, "2") == 0)
      return usage_error(a, "--zero %s is not built: --zero 1 (the default) already reduce-scatters the gradients "
                            "once per step and shards the optimizer state; --zero 3 also shards the parameters and "
                            "the gradient accumulators (docs/sharding.md)", next);
    if (strcmp(next, "0") && strcmp(next, "1") && strcmp(next, "3"))
      return usage_error(a, "--zero expects 0 (no distributed optimizer), 1 (ZeRO-1, the default) or 3 (ZeRO-3 / "
                            "FSDP), got '%s'", next);
    a->mdl.zero = next[0] - '0';
    return API_OK;
  case O_MAX_SOURCE:
    if (parse_bytes(next, 0, &v) != 0 || v < 1)
      return usage_error(a, "--max-source-bytes expects a positive byte count, got '%s'", next);
    a->mdl.max_source_bytes = (size_t)v;
    return API_OK;
  case O_ACT_BUDGET:
    if (parse_bytes(next, 1, &v) != 0)
      return usage_error(a, "--activation-budget expects a byte count (suffix K, M or G for KiB, MiB, GiB), got '%s'",
                         next);
    a->cx->activation_budget = (int64_t)v;
    return API_OK;
  case O_RECOMPUTE: {
    int mode = pass_recompute_lookup(next);
    if (mode < 0) return usage_error(a, "--recompute must be none, full, selective or auto, got '%s'", next);
    a->cx->recompute = mode;
    a->recompute_given = 1;
    return API_OK;
  }
  case O_MEM_BUDGET:
    if (parse_bytes(next, 1, &v) != 0 || v < 1)
      return usage_error(a, "--memory-budget expects a positive byte count (suffix K, M or G for KiB, MiB, GiB), "
                            "got '%s'", next);
    a->cx->memory_budget = (int64_t)v;
    return API_OK;
  case O_CP_ATTN:
    if (strcmp(next, "ring") && strcmp(next, "allgather") && strcmp(next, "a2a"))
      return usage_error(a, "--cp-attn must be ring, allgather or a2a, got '%s'", next);
    a->cx->cp_attn = !strcmp(next, "allgather") ? PASS_CP_ATTN_ALLGATHER
                   : !strcmp(next, "a2a")       ? PASS_CP_ATTN_A2A
                                                : PASS_CP_ATTN_RING;
    a->cp_attn_given = 1;
    return API_OK;
  case O_SCHEDULE:
    if (plan_pipe_sched_lookup(next) < 0)
      return usage_error(a, "--schedule must be gpipe, 1f1b, interleaved or zb-h1, got '%s'", next);
    a->schedule = next;
    return API_OK;
  case O_EMIT:
    if (strcmp(next, "plan") && strcmp(next, "plan-text") && strcmp(next, "ir") && strcmp(next, "dot"))
      return usage_error(a, "--emit must be plan, plan-text, ir or dot (or --emit=trace FILE), got '%s'", next);
    a->emit = next;
    return API_OK;
  case O_REPORT:
    if (strcmp(next, "memory") != 0 && strcmp(next, "comm") != 0 && strcmp(next, "schedule") != 0 &&
        strcmp(next, "sharding") != 0 && strcmp(next, "time") != 0 && strcmp(next, "kernels") != 0)
      return usage_error(a, "--report must be memory, comm, sharding, schedule, time or kernels, got '%s'", next);
    a->report = next;
    return API_OK;
  case O_MEMORY:
    if (parse_bytes(next, 1, &a->memory) != 0 || a->memory == 0)
      return usage_error(a, "--memory needs a byte count per GPU (suffix K, M or G), got '%s'", next);
    return API_OK;
  default:
    return -1;
  }
}

/* --precision-policy help: the op classes, as text to print (mcc) or in the message (the library). */
static int opt_policy(ApiSession *a, const char *next) {
  if (strcmp(next, "help") != 0) {
    a->cx->precision_policy = next;
    return API_OK;
  }
  StrBuf b = {0};
  sb_printf(&b, "op classes of pass precision (storage under --precision bf16; arithmetic is always f32):\n");
  pass_precision_classes(&b);
  if (a->api) {
    api_diag(a, "--precision-policy help lists the op classes instead of setting a policy; they are:\n%s", b.p);
    free(b.p);
    return API_USAGE;
  }
  free(a->text);
  a->text = b.p;
  return API_STOP;
}

static int apply_row(ApiSession *a, const ApiOption *r, const char *sub, const char *next) {
  const char *s = r->name;
  int w = opt_word(a, r, s, next);
  if (w >= 0) return w;
  switch (r->id) {
  case O_HELP: case O_VERSION: return API_STOP;
  case O_OUTPUT: a->output = next; return API_OK;
  case O_DEFINE: return opt_define(a, next);
  case O_SIZE:
    if (parse_size(next, size_field(a, r->to)) != 0) return usage_error(a, "expected a positive size, got '%s'", next);
    return API_OK;
  case O_SP: a->mdl.sp = 1; return API_OK;
  case O_NO_OVERLAP: a->no_overlap = 1; return API_OK;
  case O_OVERLAP: a->no_overlap = 0; return API_OK;   /* Megatron's; the default */
  case O_NO_ZERO: a->mdl.zero = 0; return API_OK;
  case O_NO_FUSE: a->cx->no_fuse = 1; return API_OK;
  case O_NO_REMAT: a->cx->no_remat = 1; return API_OK;
  case O_DECODE: a->cx->decode = 1; return API_OK;
  case O_LOSS_SCALE: return opt_loss_scale(a, s, next);
  case O_POLICY: return opt_policy(a, next);
  case O_FP8: case O_FP8_OPT: return opt_fp8(a, s, next);
  case O_KEEP_GATHERED: a->keep_gathered = 1; return API_OK;
  case O_REGATHER: a->cx->regather = 1; return API_OK;
  case O_EMIT_LLVM: a->llvm_dir = next; return API_OK;
  case O_EMIT_CUDA: a->cuda_dir = next; return API_OK;
  case O_TARGET: return opt_target(a, next);
  case O_CHECK: a->check = 1; return API_OK;
  case O_STDLIB: a->mdl.stdlib_dir = next; return API_OK;
  case O_TRACE: a->trace = next; return API_OK;
  case O_HW: a->hw = next; return API_OK;
  case O_PP_LAYOUT: a->pp_layout = next; return API_OK;
  case O_PP_LAYERS: return opt_pp_layers(a, next);
  case O_PP_STACK: a->pp_stack = next; return API_OK;
  case O_DUMP_IR:
    a->cx->dump_dir = next;
    a->cx->dump_pass = strcmp(sub, "all") == 0 ? NULL : sub;
    return API_OK;
  case O_PRINT_AFTER: a->cx->print_after = next; return API_OK;
  case O_VERIFY_EACH: a->cx->verify_each = 1; return API_OK;
  case O_NO_VERIFY: a->cx->verify_each = 0; return API_OK;
  case O_VERIFY_RT: a->cx->verify_roundtrip = 1; return API_OK;
  case O_TIME: a->time = 1; return API_OK;
  case O_STATS: a->stats = 1; return API_OK;
  case O_EXPLAIN: a->report = "sharding"; return API_OK;
  case O_AUTO_LAYOUT: a->auto_layout = 1; return API_OK;
  case O_MG_SWITCH:
    if (!strcmp(r->to, "--sp")) a->mdl.sp = 1;
    else if (!strcmp(r->to, "nesterov") || !strcmp(r->to, "no-nesterov")) {   /* train field nesterov = 1 / 0 */
      MdlSetting set = {ts_intern("nesterov"), r->to[0] == 'n' && r->to[1] == 'o' ? "0" : "1", r->name};
      VEC_PUSH(a->train_sets, set);
    } else a->mdl.zero = 1;   /* the distributed optimizer: ZeRO-1, also the default */
    return API_OK;
  case O_MG_SIZE:
    if (parse_size(next, size_field(a, r->to)) != 0) {
      api_diag(a, "%s expects a positive size, got '%s'\n", r->name, next);
      fprintf(a->diag, a->api ? "(the options are mcc's: docs/cli.md, docs/embedding.md)\n"
                              : "(run 'mcc --help' for the options)\n");
      return API_USAGE;
    }
    return API_OK;
  case O_MG_CONFIG: case O_MG_TRAIN: mg_setting(a, r, next); return API_OK;
  case O_RAMPUP: {   /* "START INCR SAMPLES" (or with commas): three train fields */
    static const char *const field[3] = {"rampup_start", "rampup_incr", "rampup_samples"};
    char w[3][32];
    int n = 0;
    const char *q = next;
    while (*q && n < 4) {
      while (*q == ' ' || *q == ',') q++;
      if (!*q) break;
      size_t len = strcspn(q, " ,");
      if (n < 3 && len < sizeof w[0]) memcpy(w[n], q, len), w[n][len] = 0;
      else n = 4;   /* too long or too many */
      n++;
      q += len;
    }
    if (n != 3) return usage_error(a, "--rampup-batch-size takes three numbers, START INCR SAMPLES (Megatron's: the "
                                   "global batch starts at START and grows by INCR over SAMPLES samples), got '%s'", next);
    for (int k = 0; k < 3; k++) {
      ApiOption row = {r->name, API_ARG_VALUE, O_MG_TRAIN, field[k], 0, NULL};
      mg_setting(a, &row, ts_intern(w[k]));
    }
    return API_OK;
  }
  default: return usage_error(a, "internal error: option '%s' has no handler", s);
  }
}

int api_opt_apply(ApiSession *a, const char *name, const char *value) {
  const char *sub, *inl;
  const ApiOption *r = name && *name ? lookup(name, &sub, &inl) : NULL;
  if (!r) return usage_error(a, "unknown option '%s'", name ? name : "(null)");
  if (r->flags & NOT_BUILT) return usage_error(a, "%s", r->instead);
  if (a->api && (r->flags & MCC_ONLY)) {
    api_diag(a, "option '%s' is mcc's own; the library has %s\n", r->name, r->instead);
    return API_USAGE;
  }
  if (inl) {
    if (value) return usage_error(a, "option '%s' is given a value twice", name);
    value = inl;
  }
  if (r->arg == API_ARG_NONE && value) return usage_error(a, "option '%s' takes no value", r->name);
  if (r->arg != API_ARG_NONE && !value) return usage_error(a, "option '%s' needs an argument", r->name);
  if (r->arg == API_ARG_SUFFIX && (!sub || !*sub)) return usage_error(a, "option '%s' needs a pass name (or all) after '='", r->name);
  return apply_row(a, r, sub, value);
}

int api_opt_finish(ApiSession *a) {
  if (!a->input) return usage_error(a, "%s", "no input file");
  if (a->check && a->report) return usage_error(a, "%s", "--check and --report do not go together");
  if (a->keep_gathered + a->cx->regather + (a->cx->activation_budget >= 0) > 1)
    return usage_error(a, "%s", "--keep-gathered, --regather and --activation-budget each decide what is kept for the "
                                "backward: give one of them");
  if (a->cx->memory_budget >= 0 && !a->recompute_given) a->cx->recompute = PASS_RECOMPUTE_AUTO;
  if (a->cx->memory_budget >= 0 && a->cx->recompute != PASS_RECOMPUTE_AUTO)
    return usage_error(a, "--memory-budget goes with --recompute auto (the compiler chooses what to recompute to fit "
                          "it), not with --recompute %s", pass_recompute_name(a->cx->recompute));
  if (a->cx->recompute == PASS_RECOMPUTE_AUTO && a->cx->memory_budget < 0)
    return usage_error(a, "%s", "--recompute auto needs --memory-budget BYTES: the most bytes a micro batch may hold "
                                "for its backward, per rank");
  if (a->cx->memory_budget >= 0 && a->cx->activation_budget >= 0)
    return usage_error(a, "%s", "--memory-budget and --activation-budget both bound the bytes held for the backward "
                                "(--memory-budget also decides the gathered copies): give one of them");
  if (a->cx->recompute != PASS_RECOMPUTE_NONE && a->cx->no_remat)
    return usage_error(a, "--no-remat turns pass remat off, and --recompute %s is pass remat's: give one of them",
                       pass_recompute_name(a->cx->recompute));
  /* the partition pass reads the overrides from the pass context */
  a->cx->pp_layers = a->pp_layers.n ? a->pp_layers.a : NULL;
  a->cx->pp_nlayers = a->pp_layers.n;
  a->cx->pp_layout = a->pp_layout;
  a->cx->pp_stack = a->pp_stack;
  if (a->check && api_pipe_views_wanted(a))
    return usage_error(a, "%s", "--check and the pipeline views do not go together");
  int time_report = a->report && strcmp(a->report, "time") == 0;
  if (a->memory && !a->auto_layout) return usage_error(a, "%s", "--memory goes with --auto-layout (the memory of one GPU)");
  if (a->auto_layout) {
    if (a->gpus <= 0 || !a->hw)
      return usage_error(a, "%s", "--auto-layout needs --gpus N and --hw NAME|FILE (a100-80gb, h100-sxm, h200, b200)");
    if (a->check || a->report || api_pipe_views_wanted(a) || strcmp(a->emit, "plan"))
      return usage_error(a, "%s", "--auto-layout prints its table and writes the chosen plan with -o: it does not go "
                                  "with --check, --report or another --emit");
    const char *given = a->mdl.tp >= 0 ? "--tp" : a->mdl.pp >= 0 ? "--pp" : a->mdl.cp >= 0 ? "--cp"
                        : a->mdl.ep >= 0 ? "--ep" : a->mdl.sp >= 0 ? "--sp" : a->dp >= 0 ? "--dp"
                        : a->vpp > 0 || a->vstage_layers > 0 ? "--vpp" : a->schedule ? "--schedule"
                        : a->pp_layers.n || a->pp_layout || a->pp_stack ? "--pp-layers / --pp-layout / --pp-stack"
                        : a->recompute_given || a->cx->memory_budget >= 0 ? "--recompute / --memory-budget" : NULL;
    if (given)
      return usage_error(a, "--auto-layout chooses the layout itself (tp, sp, cp, ep, pp, vpp, schedule, dp, micro "
                            "batch, recompute), and %s fixes part of it: leave it out", given);
  } else {
    if (!a->check && (a->steps > 0 || (a->gpus > 0 && !time_report)))
      return usage_error(a, "%s", "--steps and --gpus go with --check (mrun takes them for training); --gpus also with --report time");
    if (time_report && !a->hw)
      return usage_error(a, "%s", "--report time needs --hw NAME|FILE (a100-80gb, h100-sxm, h200, b200, or a file: hw/README.md)");
    int comm_report = a->report && strcmp(a->report, "comm") == 0;
    int kernels_report = a->report && strcmp(a->report, "kernels") == 0;
    if (a->hw && !time_report && !a->trace && !comm_report && !kernels_report && !a->api)
      return usage_error(a, "%s", "--hw goes with --report time, --report comm, --report kernels or --emit=trace");
    if (kernels_report && a->nsm > 1)
      return usage_error(a, "%s", "--report kernels takes one --target arch (its ptxas report gives the registers)");
    if (time_report && a->trace) return usage_error(a, "%s", "--report time and --emit=trace: give one of them per run");
  }
  /* fp8 GEMMs (cuBLASLt's CUDA_R_8F_E4M3 / E5M2) run on sm_89 and newer only */
  for (int t = 0; a->cx->fp8 && t < a->nsm; t++)
    if (a->sm[t] < 89) {
      char arch[16];
      snprintf(arch, sizeof arch, "sm_%d", a->sm[t]);
      return usage_error(a, "--fp8 with --target %s: cuBLASLt's fp8 GEMMs need sm_89 or newer (Ada, Hopper: sm_90 "
                            "for H100 / H200); drop it from --target or drop --fp8", arch);
    }
  /* Pass names are checked before the (possibly long) frontend runs. */
  char err[512];
  if (a->cx->print_after && pass_check_name(a->cx->print_after, "--print-ir-after", err, sizeof err) != 0)
    return usage_error(a, "%s", err);
  if (a->cx->dump_pass && pass_check_name(a->cx->dump_pass, "--dump-ir", err, sizeof err) != 0)
    return usage_error(a, "%s", err);
  a->mdl.defines = a->defines.a;
  a->mdl.ndefines = a->defines.n;
  a->mdl.config_sets = a->config_sets.a;
  a->mdl.nconfig_sets = a->config_sets.n;
  a->mdl.train_sets = a->train_sets.a;
  a->mdl.ntrain_sets = a->train_sets.n;
  for (int i = 0; i < a->config_sets.n; i++)
    for (int k = 0; k < a->defines.n; k++)
      if (a->defines.a[k].name == a->config_sets.a[i].name) {
        api_diag(a, "error: %s %s and -D %s=%s both set the config key '%s'; give one of them\n",
                 a->config_sets.a[i].flag, a->config_sets.a[i].value, a->defines.a[k].name, a->defines.a[k].value,
                 a->defines.a[k].name);
        return API_FAIL;
      }
  return API_OK;
}
