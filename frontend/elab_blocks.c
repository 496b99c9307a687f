/* elab_blocks.c - the elaborator's top-level blocks other than the model:
 * `config` (constants, with -D overrides, kept as IrConst), `train`
 * (IrTrain, from ir_train_defaults), `parallel` (IrParallel, with the
 * --tp/--pp/... overrides) and `rules` (IrRule: stdlib defaults merged
 * with the model's own).  Values in these blocks are evaluated in the
 * config scope, so `global_batch = batch` works.  Errors from command-line options have no source position. */
#include "elab_priv.h"
#include <errno.h>
#include <math.h>

/* ---- config block ---- */
static const MdlLoc no_loc = {NULL, 0, 0};   /* command-line options: "mcc: error: ..." */

/* How the user wrote an override: "-D name=value" or "--flag value". */
static const char *define_text(Elab *e, const MdlSetting *df) {
  StrBuf b = {0};
  if (df->flag) sb_printf(&b, "%s %s", df->flag, df->value ? df->value : "");
  else sb_printf(&b, "-D %s=%s", df->name, df->value ? df->value : "");
  const char *s = arena_strdup(&e->a, b.p);
  sb_free(&b);
  return s;
}

static int parse_define(Elab *e, const MdlSetting *df, Value *out) {
  const char *s = df->value ? df->value : "", *what = define_text(e, df);
  char *end;
  const char *h = s + (*s == '-' || *s == '+');
  if (h[0] == '0' && (h[1] == 'x' || h[1] == 'X')) {   /* strtod would read it as a float */
    errno = 0;
    long long v = strtoll(s, &end, 16);
    if (*end || errno)
      elab_error(e, no_loc, "%s: hexadecimal values are not accepted; write it in decimal", what);
    else
      elab_error(e, no_loc, "%s: hexadecimal values are not accepted; write %lld", what, v);
    return -1;
  }
  errno = 0;
  long long i = strtoll(s, &end, 10);
  if (*s && !*end) {
    if (errno == ERANGE) {
      elab_error(e, no_loc, "%s: the value does not fit in 64 bits", what);
      return -1;
    }
    *out = elab_int(i, no_loc);
    return 0;
  }
  double f = strtod(s, &end);
  if (*s && !*end && isfinite(f)) {
    *out = elab_float(f, no_loc);
    return 0;
  }
  if (!strcmp(s, "true") || !strcmp(s, "false")) {
    *out = elab_bool(s[0] == 't', no_loc);
    return 0;
  }
  elab_error(e, no_loc, "%s: the value must be an int or float literal", what);
  return -1;
}

static const char *config_keys(Elab *e) {
  StrBuf b = {0};
  for (int i = 0; i < e->main->nconfig; i++) sb_printf(&b, "%s%s", i ? ", " : "", e->main->config[i].name);
  const char *s = arena_strdup(&e->a, b.p ? b.p : "(none)");
  sb_free(&b);
  return s;
}

void elab_config(Elab *e) {
  const MdlProgram *p = e->main;
  const MdlOptions *o = e->opt;
  /* the overrides: -D's, then the flags' (mcc refuses a key set by both) */
  int nset = o->ndefines + o->nconfig_sets;
  MdlSetting *set = arena_alloc(&e->a, (size_t)(nset + 1) * sizeof *set);
  for (int i = 0; i < o->ndefines; i++) set[i] = (MdlSetting){o->defines[i].name, o->defines[i].value, NULL};
  for (int i = 0; i < o->nconfig_sets; i++) set[o->ndefines + i] = o->config_sets[i];
  for (int i = 0; i < nset; i++) {
    int found = 0;
    for (int j = 0; j < p->nconfig; j++) found |= !strcmp(p->config[j].name, set[i].name);
    if (found) continue;
    if (set[i].flag)
      elab_error(e, no_loc, "%s sets the config key '%s', which this model does not have (its keys: %s); set the "
                 "model's own key with -D KEY=VALUE", set[i].flag, set[i].name, config_keys(e));
    else
      elab_error(e, no_loc, "-D %s: no config key of that name (known: %s)", set[i].name, config_keys(e));
  }
  for (int j = 0; j < p->nconfig; j++) {
    const MdlKV *kv = &p->config[j];
    if (elab_frame_has(&e->config, kv->name))   /* (the scan below only for the message) */
      for (int k = 0; k < j; k++)
        if (!strcmp(p->config[k].name, kv->name)) {
          elab_error(e, kv->loc, "config key '%s' is defined twice", kv->name);
          mdl_note(e->d, p->config[k].loc, "first defined here");
          break;
        }
    Value v = elab_eval(e, &e->config, kv->value);
    const MdlSetting *df = NULL;
    for (int i = 0; i < nset; i++)
      if (!strcmp(set[i].name, kv->name)) df = &set[i];   /* the last -D wins */
    if (df && v.k != V_ERR) {
      Value d;
      if (parse_define(e, df, &d)) {
        v = elab_err();
      } else if (v.k == V_FLOAT && d.k == V_INT) {
        v = elab_float((double)d.i, kv->loc);
      } else if (v.k != d.k) {
        elab_error(e, no_loc, "%s: '%s' is %s in the config, not %s", define_text(e, df), kv->name,
                   v.k == V_INT ? "an int" : elab_kind_name(v.k), elab_kind_name(d.k));
        v = elab_err();
      } else {
        v = d;
        v.loc = kv->loc;
      }
    }
    if (v.k != V_ERR && v.k != V_INT && v.k != V_FLOAT && v.k != V_BOOL && v.k != V_STR) {
      char buf[256];
      elab_error(e, kv->value->loc, "config values must be numbers, bools or strings; '%s' is %s", kv->name,
                 elab_value_desc(e, &v, buf, sizeof buf));
      v = elab_err();
    }
    elab_frame_set(&e->config, kv->name, v);
    if (v.k == V_INT || v.k == V_FLOAT) {
      IrConst c = {ts_intern(kv->name), v.k == V_FLOAT, v.k == V_INT ? v.i : 0, v.k == V_FLOAT ? v.f : 0};
      VEC_PUSH(e->m->consts, c);
    }
  }
}

/* ---- train block ---- */
/* key = name(args...) with keyword arguments evaluated in the config scope. */
static int train_call(Elab *e, const MdlKV *kv, const char *const *fnames, int *which,
                      const char *const *names, Value *out) {
  const MdlExpr *x = kv->value;
  const char *fn = x->kind == MDL_E_CALL && x->a->kind == MDL_E_NAME ? x->a->str : NULL;
  *which = -1;
  for (int i = 0; fn && fnames[i]; i++)
    if (!strcmp(fn, fnames[i])) *which = i;
  if (*which < 0) {
    StrBuf b = {0};
    for (int i = 0; fnames[i]; i++) sb_printf(&b, "%s%s(...)", i ? " or " : "", fnames[i]);
    elab_error(e, x->loc, "train: %s must be %s", kv->name, b.p);
    sb_free(&b);
    return -1;
  }
  ElabCall c = {x->loc, fn, arena_alloc(&e->a, (size_t)(x->nargs + 1) * sizeof(ElabArg)), x->nargs};
  for (int i = 0; i < x->nargs; i++) {
    c.args[i].name = x->args[i].name;
    c.args[i].loc = x->args[i].loc;
    c.args[i].vloc = x->args[i].value->loc;
    c.args[i].v = elab_eval(e, &e->config, x->args[i].value);
    if (c.args[i].v.k == V_ERR) return -1;
  }
  return elab_bind_args(e, &c, names, 0, out);
}

static int train_range(Elab *e, const Value *v, const char *what, double lo, double hi, int lo_open, double *out) {
  if (v->k == V_ERR) return -1;
  if (!elab_is_num(v)) {
    char buf[256];
    elab_error(e, v->loc, "train: %s must be a number, got %s", what, elab_value_desc(e, v, buf, sizeof buf));
    return -1;
  }
  double x = elab_num(v);
  if (!isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || !(x < hi || (isinf(hi) && x <= hi))) {
    elab_error(e, v->loc, "train: %s must be %s %g%s, got %g", what, lo_open ? ">" : ">=", lo,
               isinf(hi) ? "" : hi == 1 ? " and < 1" : " and below the limit", x);
    return -1;
  }
  *out = x;
  return 0;
}

static int train_int(Elab *e, const Value *v, const char *what, int64_t lo, int64_t *out) {
  if (v->k == V_ERR) return -1;
  if (v->k != V_INT || v->i < lo) {
    char buf[256];
    elab_error(e, v->loc, "train: %s must be an int >= %lld, got %s", what, (long long)lo,
               elab_value_desc(e, v, buf, sizeof buf));
    return -1;
  }
  *out = v->i;
  return 0;
}

/* The command line's train overrides (mcc's Megatron flags: --lr ...),
 * over what the train block said.  1 if one about the batch failed. */
static int train_overrides(Elab *e, IrTrain *t, int *have_decay, int *gb_at, int64_t *train_samples) {
  int batch_bad = 0;
  for (int i = 0; i < e->opt->ntrain_sets; i++) {
    const MdlSetting *df = &e->opt->train_sets[i];
    const char *k = df->name, *what = define_text(e, df);
    if (!strcmp(k, "schedule") || !strcmp(k, "optimizer") || !strcmp(k, "wsd_style") || !strcmp(k, "muon_tp")) {
      /* our names and Megatron's spellings (--lr-decay-style WSD / inverse-square-root, --optimizer adam) */
      static const struct { const char *key, *name; int v; } names[] = {
          {"schedule", "constant", IR_SCHED_CONSTANT}, {"schedule", "cosine", IR_SCHED_COSINE},
          {"schedule", "linear", IR_SCHED_LINEAR}, {"schedule", "wsd", IR_SCHED_WSD}, {"schedule", "WSD", IR_SCHED_WSD},
          {"schedule", "inverse_sqrt", IR_SCHED_INVSQRT}, {"schedule", "inverse-square-root", IR_SCHED_INVSQRT},
          {"optimizer", "adamw", IR_OPT_ADAMW}, {"optimizer", "adam", IR_OPT_ADAMW}, {"optimizer", "sgd", IR_OPT_SGD},
          {"optimizer", "lion", IR_OPT_LION}, {"optimizer", "muon", IR_OPT_MUON},
          {"wsd_style", "linear", IR_WSD_LINEAR}, {"wsd_style", "cosine", IR_WSD_COSINE},
          {"wsd_style", "exponential", IR_WSD_EXPONENTIAL}, {"wsd_style", "minus_sqrt", IR_WSD_MINUS_SQRT},
          {"muon_tp", "auto", IR_MUON_TP_AUTO}, {"muon_tp", "allreduce", IR_MUON_TP_ALLREDUCE},
          {"muon_tp", "gather", IR_MUON_TP_GATHER},
      };
      int w = -1;
      for (size_t j = 0; j < sizeof names / sizeof names[0]; j++)
        if (!strcmp(names[j].key, k) && df->value && !strcmp(df->value, names[j].name)) w = names[j].v;
      if (w < 0)
        elab_error(e, no_loc, "%s: %s", what, k[0] == 's' ? "the schedules are constant, cosine, linear, wsd (WSD) "
                   "and inverse_sqrt (inverse-square-root)" : k[0] == 'o' ? "the optimizers are adamw (adam), sgd, "
                   "lion and muon" : k[0] == 'm' ? "muon's tp modes are auto, allreduce and gather"
                   : "the wsd decay styles are linear, cosine, exponential and minus_sqrt");
      else if (k[0] == 's') t->schedule = (IrSchedule)w;
      else if (k[0] == 'o') t->optimizer = (IrOptimizer)w;
      else if (k[0] == 'm') t->muon_tp = (IrMuonTp)w;
      else t->wsd_style = (IrWsdStyle)w;
      continue;
    }
    Value v;
    if (parse_define(e, df, &v)) { batch_bad |= !strcmp(k, "global_batch"); continue; }
    int64_t n;
    if (!strcmp(k, "lr")) train_range(e, &v, what, 0, INFINITY, 1, &t->lr);
    else if (!strcmp(k, "min_lr")) train_range(e, &v, what, 0, INFINITY, 0, &t->min_lr);
    else if (!strcmp(k, "clip_grad")) train_range(e, &v, what, 0, INFINITY, 0, &t->clip_grad);
    else if (!strcmp(k, "weight_decay")) train_range(e, &v, what, 0, INFINITY, 0, &t->weight_decay);
    else if (!strcmp(k, "beta1")) train_range(e, &v, what, 0, 1, 0, &t->beta1);
    else if (!strcmp(k, "beta2")) train_range(e, &v, what, 0, 1, 0, &t->beta2);
    else if (!strcmp(k, "eps")) train_range(e, &v, what, 0, INFINITY, 1, &t->eps);
    else if (!strcmp(k, "momentum")) train_range(e, &v, what, 0, 1, 0, &t->momentum);
    else if (!strcmp(k, "muon_momentum")) train_range(e, &v, what, 0, 1, 0, &t->muon_momentum);
    else if (!strcmp(k, "muon_adamw_lr")) train_range(e, &v, what, 0, INFINITY, 0, &t->muon_adamw_lr);
    else if (!strcmp(k, "muon_ns_steps")) { if (!train_int(e, &v, what, 1, &n)) t->muon_ns_steps = (int)(n < 1000 ? n : 1000); }
    else if (!strcmp(k, "nesterov")) { if (!train_int(e, &v, what, 0, &n)) t->nesterov = n != 0; }
    else if (!strcmp(k, "wsd_decay_steps")) train_int(e, &v, what, 1, &t->wsd_decay_steps);
    else if (!strcmp(k, "warmup")) train_int(e, &v, what, 0, &t->warmup);
    else if (!strcmp(k, "decay_steps")) { if (!train_int(e, &v, what, 1, &t->decay_steps)) *have_decay = 1; }
    else if (!strcmp(k, "steps")) train_int(e, &v, what, 1, &t->steps);
    else if (!strcmp(k, "seed")) { if (!train_int(e, &v, what, 0, &n)) t->seed = (uint64_t)n; }
    else if (!strcmp(k, "train_samples")) train_int(e, &v, what, 1, train_samples);
    else if (!strcmp(k, "rampup_start")) train_int(e, &v, what, 1, &t->rampup_start);
    else if (!strcmp(k, "rampup_incr")) train_int(e, &v, what, 1, &t->rampup_incr);
    else if (!strcmp(k, "rampup_samples")) train_int(e, &v, what, 0, &t->rampup_samples);
    else if (!strcmp(k, "global_batch")) {
      if (train_int(e, &v, what, 1, &t->global_batch)) batch_bad = 1;
      else *gb_at = -2;
    } else   /* the keys are mcc's flags (api/options.c's table): a key missing above is a bug */
      elab_error(e, no_loc, "%s: '%s' is not a train field", what, k);   /* internal */
  }
  return batch_bad;
}

void elab_train(Elab *e) {
  const MdlProgram *p = e->main;
  IrTrain t;
  ir_train_defaults(&t);
  t.nesterov = -1;   /* not given: the optimizer's default, resolved below */
  int have_decay = 0, gb_at = -1, batch_bad = 0;   /* batch_bad: an error about either batch size given */
  int64_t train_samples = 0;   /* Megatron's --train-samples: the steps that consume them (0: steps as given) */
  for (int j = 0; j < p->ntrain; j++) {
    const MdlKV *kv = &p->train[j];
    for (int k = 0; k < j; k++)
      if (!strcmp(p->train[k].name, kv->name)) elab_error(e, kv->loc, "train key '%s' is given twice", kv->name);
    const char *key = kv->name;
    Value a[4];
    int which;
    if (!strcmp(key, "optimizer")) {
      /* adamw(lr, betas, eps, weight_decay); sgd(lr, momentum, nesterov, weight_decay); lion(lr, betas,
       * weight_decay); muon(lr, momentum, nesterov, ns_steps, and betas / eps / weight_decay, which its
       * adamw group uses too) */
      static const char *const fns[] = {"adamw", "sgd", "lion", "muon", NULL},
                               *const names[] = {"lr", "betas", "eps", "weight_decay", "momentum", "nesterov",
                                                 "ns_steps", "adamw_lr", NULL};
      static const char takes[4][8] = {{1, 1, 1, 1, 0, 0, 0, 0}, {1, 0, 0, 1, 1, 1, 0, 0}, {1, 1, 0, 1, 0, 0, 0, 0},
                                       {1, 1, 1, 1, 1, 1, 1, 1}};
      Value b[9];
      for (int q = 0; q < 9; q++) b[q].k = V_UNSET;
      if (train_call(e, kv, fns, &which, names, b)) continue;
      int bad = 0;
      for (int q = 0; names[q]; q++)
        if (b[q].k != V_UNSET && !takes[which][q]) {
          elab_error(e, b[q].loc, "train: %s() takes no %s: (it takes lr%s)", fns[which], names[q],
                     which == 1 ? ", momentum, nesterov, weight_decay" : ", betas, weight_decay");
          bad = 1;
        }
      if (bad) continue;
      static const IrOptimizer kinds[] = {IR_OPT_ADAMW, IR_OPT_SGD, IR_OPT_LION, IR_OPT_MUON};
      t.optimizer = kinds[which];
      if (b[4].k != V_UNSET) train_range(e, &b[4], "momentum", 0, 1, 0, which == 1 ? &t.momentum : &t.muon_momentum);
      if (b[5].k != V_UNSET) {
        char nb[128];
        if (b[5].k != V_BOOL && !(b[5].k == V_INT && (b[5].i == 0 || b[5].i == 1)))
          elab_error(e, b[5].loc, "train: nesterov must be true or false (or 1 or 0), got %s",
                     elab_value_desc(e, &b[5], nb, sizeof nb));
        else t.nesterov = b[5].i != 0;
      }
      if (b[7].k != V_UNSET) train_range(e, &b[7], "adamw_lr", 0, INFINITY, 0, &t.muon_adamw_lr);
      if (b[6].k != V_UNSET) {
        int64_t ns;
        if (!train_int(e, &b[6], "ns_steps", 1, &ns)) t.muon_ns_steps = (int)(ns < 1000 ? ns : 1000);
      }
      for (int q = 0; q < 4; q++) a[q] = b[q];
      if (a[0].k != V_UNSET) train_range(e, &a[0], "lr", 0, INFINITY, 1, &t.lr);
      if (a[1].k != V_UNSET) {
        if ((a[1].k != V_TUPLE && a[1].k != V_LIST) || a[1].n != 2) {
          elab_error(e, a[1].loc, "train: betas must be a pair (beta1, beta2)");
        } else {
          train_range(e, &a[1].items[0], "beta1", 0, 1, 0, &t.beta1);
          train_range(e, &a[1].items[1], "beta2", 0, 1, 0, &t.beta2);
        }
      }
      /* eps > 0: a parameter with no gradient (padding for sharding) would get 0 / 0 */
      if (a[2].k != V_UNSET) train_range(e, &a[2], "eps", 0, INFINITY, 1, &t.eps);
      if (a[3].k != V_UNSET) train_range(e, &a[3], "weight_decay", 0, INFINITY, 0, &t.weight_decay);
    } else if (!strcmp(key, "schedule")) {
      static const char *const fns[] = {"constant", "cosine", "linear", "wsd", "inverse_sqrt", NULL},
                               *const names[] = {"warmup", "min_lr", "decay_steps", "wsd_decay_steps", "style", NULL};
      Value b[6];
      for (int q = 0; q < 6; q++) b[q].k = V_UNSET;
      if (train_call(e, kv, fns, &which, names, b)) continue;
      for (int q = 0; q < 4; q++) a[q] = b[q];
      static const IrSchedule sch[] = {IR_SCHED_CONSTANT, IR_SCHED_COSINE, IR_SCHED_LINEAR, IR_SCHED_WSD, IR_SCHED_INVSQRT};
      t.schedule = sch[which];
      if (which == 0 && (a[1].k != V_UNSET || a[2].k != V_UNSET))
        elab_error(e, kv->value->loc, "train: constant() takes only warmup:");
      if (which == 4 && a[2].k != V_UNSET)
        elab_error(e, kv->value->loc, "train: inverse_sqrt() takes warmup: and min_lr: (it never ends)");
      if (which != 3 && (b[3].k != V_UNSET || b[4].k != V_UNSET))
        elab_error(e, kv->value->loc, "train: wsd_decay_steps: and style: go with wsd()");
      if (b[3].k != V_UNSET) train_int(e, &b[3], "wsd_decay_steps", 1, &t.wsd_decay_steps);
      if (b[4].k != V_UNSET) {
        int w = -1;
        for (int q = 0; q < IR_WSD_COUNT && b[4].k == V_STR; q++)
          if (!strcmp(b[4].s, ir_wsd_style_name((IrWsdStyle)q))) w = q;
        if (w < 0) elab_error(e, b[4].loc, "train: wsd style must be \"linear\", \"cosine\", \"exponential\" or \"minus_sqrt\"");
        else t.wsd_style = (IrWsdStyle)w;
      }
      if (a[0].k != V_UNSET) train_int(e, &a[0], "warmup", 0, &t.warmup);
      if (a[1].k != V_UNSET) train_range(e, &a[1], "min_lr", 0, INFINITY, 0, &t.min_lr);
      if (a[2].k != V_UNSET && train_int(e, &a[2], "decay_steps", 1, &t.decay_steps) == 0) have_decay = 1;
    } else if (!strcmp(key, "precision")) {
      const MdlExpr *x = kv->value;
      const char *s = x->kind == MDL_E_NAME || x->kind == MDL_E_STRING ? x->str : "";
      if (!strcmp(s, "f32")) t.precision = IR_F32, t.lowp = IR_VOID;
      else if (!strcmp(s, "f64")) t.precision = IR_F64, t.lowp = IR_VOID;
      else if (!strcmp(s, "bf16")) t.precision = IR_F32, t.lowp = IR_BF16;
      else if (!strcmp(s, "fp16") || !strcmp(s, "f16")) t.precision = IR_F32, t.lowp = IR_F16;
      else elab_error(e, x->loc, "train: precision must be f32, f64, bf16 or fp16");
    } else {
      Value v = elab_eval(e, &e->config, kv->value);
      if (!strcmp(key, "clip_grad")) train_range(e, &v, key, 0, INFINITY, 0, &t.clip_grad);
      else if (!strcmp(key, "global_batch")) {
        if (!train_int(e, &v, key, 1, &t.global_batch)) gb_at = j;
        else batch_bad = 1;
      } else if (!strcmp(key, "micro_batch")) { if (train_int(e, &v, key, 1, &t.micro_batch)) batch_bad = 1; }
      else if (!strcmp(key, "seq_len")) train_int(e, &v, key, 1, &t.seq_len);
      else if (!strcmp(key, "steps")) train_int(e, &v, key, 1, &t.steps);
      else if (!strcmp(key, "seed")) { int64_t s; if (!train_int(e, &v, key, 0, &s)) t.seed = (uint64_t)s; }
      else if (!strcmp(key, "train_samples")) train_int(e, &v, key, 1, &train_samples);
      else if (!strcmp(key, "rampup_start")) train_int(e, &v, key, 1, &t.rampup_start);
      else if (!strcmp(key, "rampup_incr")) train_int(e, &v, key, 1, &t.rampup_incr);
      else if (!strcmp(key, "rampup_samples")) train_int(e, &v, key, 0, &t.rampup_samples);
      else
        elab_error(e, kv->loc, "unknown train key '%s' (known: optimizer, schedule, clip_grad, global_batch, "
                               "micro_batch, seq_len, steps, train_samples, rampup_start, rampup_incr, "
                               "rampup_samples, seed, precision)", key);
    }
  }
  int64_t block_samples = train_samples;   /* the train block's; a flag's replaces it, as for every key */
  train_samples = 0;
  if (train_overrides(e, &t, &have_decay, &gb_at, &train_samples)) batch_bad = 1;
  int flag_steps = 0, block_steps = 0;
  for (int i = 0; i < e->opt->ntrain_sets; i++) flag_steps |= !strcmp(e->opt->train_sets[i].name, "steps");
  for (int j = 0; j < p->ntrain; j++) block_steps |= !strcmp(p->train[j].name, "steps");
  if (train_samples > 0 && flag_steps)
    elab_error(e, no_loc, "both --train-iters (%lld) and --train-samples (%lld) are given: the length of the run is "
               "one of them", (long long)t.steps, (long long)train_samples);
  else if (!train_samples && !flag_steps && block_samples > 0 && block_steps)
    elab_error(e, no_loc, "train: both steps and train_samples (%lld) are given: the length of the run is one of "
               "them", (long long)block_samples);
  else if (!train_samples && !flag_steps)
    train_samples = block_samples;
  if (t.rampup_start > 0 && !batch_bad) {
    char why[512];
    if (ir_train_rampup_check(&t, t.micro_batch, why, sizeof why) != 0) elab_error(e, no_loc, "%s", why);
  } else if (t.rampup_start == 0 && (t.rampup_incr > 0 || t.rampup_samples > 0)) {
    elab_error(e, no_loc, "train: rampup_incr and rampup_samples go with rampup_start (--rampup-batch-size START "
               "INCR SAMPLES)");
  }
  if (train_samples > 0 && !batch_bad) {
    t.steps = ir_train_steps_for_samples(&t, train_samples);
    if (t.steps < 1)
      elab_error(e, no_loc, "train: train_samples %lld is less than one global batch (%lld): no step to run",
                 (long long)train_samples, (long long)ir_train_batch_at(&t, 0));
  }
  if (!batch_bad && t.global_batch % t.micro_batch != 0) {
    MdlLoc at = gb_at >= 0 ? p->train[gb_at].loc : gb_at == -1 && p->ntrain ? p->train[0].loc : no_loc;
    elab_error(e, at, "train: global_batch %lld%s is not a multiple of micro_batch %lld", (long long)t.global_batch,
               gb_at == -2 ? " (from the command line)" : "", (long long)t.micro_batch);
  }
  if (!have_decay) t.decay_steps = t.steps;
  if (t.nesterov < 0) t.nesterov = t.optimizer == IR_OPT_MUON;
  if (t.muon_adamw_lr > 0 && t.optimizer != IR_OPT_MUON)
    elab_error(e, no_loc, "train: muon_adamw_lr (--muon-adamw-lr) is the lr of Muon's AdamW group, and the optimizer "
               "is %s: give --optimizer muon, or leave it out (%s has one lr, --lr)", ir_optimizer_name(t.optimizer),
               ir_optimizer_name(t.optimizer));   /* Muon's reference uses Nesterov, torch's SGD not */
  MdlLoc sched_at = no_loc;   /* the schedule's line, for its refusals */
  for (int j = 0; j < p->ntrain; j++)
    if (!strcmp(p->train[j].name, "schedule")) sched_at = p->train[j].loc;
  if (t.schedule == IR_SCHED_WSD && t.wsd_decay_steps < 1)
    elab_error(e, sched_at, "train: the wsd schedule needs its final decay's length: wsd(wsd_decay_steps: N) or "
               "--lr-wsd-decay-iters N (at most decay_steps = %lld)", (long long)t.decay_steps);
  else if (t.schedule == IR_SCHED_WSD && t.wsd_decay_steps > t.decay_steps)
    elab_error(e, sched_at, "train: wsd_decay_steps = %lld is longer than decay_steps = %lld (the decay ends at "
               "decay_steps); give at most %lld", (long long)t.wsd_decay_steps, (long long)t.decay_steps,
               (long long)t.decay_steps);
  if (e->opt->precision != IR_VOID) {
    if (ir_dtype_is_16(e->opt->precision)) t.precision = IR_F32, t.lowp = e->opt->precision;
    else if (!ir_dtype_is_float(e->opt->precision)) elab_error(e, no_loc, "--precision must be f32, f64, bf16 or fp16");
    else t.precision = e->opt->precision, t.lowp = IR_VOID;
  }
  e->prec = t.precision;
  e->m->train = t;
}

/* The train block's seq_len and micro_batch, where given, against the
 * model's inputs: an input dim of the sequence (the dim ruled to cp, else
 * 'seq') must be seq_len long, one of the batch (ruled to dp, else
 * 'batch') micro_batch long; a mismatch is the train key's error. */
void elab_train_sizes(Elab *e) {
  const MdlProgram *p = e->main;
  const IrTrain *t = &e->m->train;
  const char *seq = ts_intern("seq"), *batch = ts_intern("batch");
  for (int r = 0; r < e->m->rules.n; r++) {
    if (e->m->rules.a[r].axes & (1u << IR_AXIS_CP)) seq = e->m->rules.a[r].dim;
    if (e->m->rules.a[r].axes & (1u << IR_AXIS_DP)) batch = e->m->rules.a[r].dim;
  }
  int fb = ir_block_find(e->m, "forward");
  if (fb < 0) return;
  for (int j = 0; j < p->ntrain; j++) {
    const MdlKV *kv = &p->train[j];
    int is_seq = !strcmp(kv->name, "seq_len"), is_mb = !strcmp(kv->name, "micro_batch");
    if (!is_seq && !is_mb) continue;
    const char *dim = is_seq ? seq : batch;
    int64_t want = is_seq ? t->seq_len : t->micro_batch;
    const IrBlock *b = &e->m->blocks.a[fb];
    for (int i = 0; i < b->n; i++) {
      const IrNode *n = &b->nodes[i];
      if (n->op != IR_OP_INPUT) continue;
      int d = 0;
      while (d < n->type.rank && n->type.dname[d] != dim) d++;
      if (d == n->type.rank || n->type.dim[d] == want) continue;
      elab_error(e, kv->loc, "train: %s = %lld, but the model's input \"%s\" has dim '%s' = %lld; make them "
                 "equal (the data pipeline feeds the input's size)", kv->name, (long long)want,
                 n->sa ? n->sa : "?", dim, (long long)n->type.dim[d]);
      break;
    }
  }
}

/* ---- parallel and rules blocks ---- */
void elab_parallel(Elab *e) {
  const MdlProgram *p = e->main;
  IrParallel par = {.tp = 1, .pp = 1, .cp = 1, .ep = 1, .dp = 0, .sp = 0, .zero = 1};
  for (int j = 0; j < p->nparallel; j++) {
    const MdlKV *kv = &p->parallel[j];
    Value v = elab_eval(e, &e->config, kv->value);
    if (v.k == V_ERR) continue;
    char buf[256];
    const char *k = kv->name;
    int *slot = !strcmp(k, "tp") ? &par.tp : !strcmp(k, "pp") ? &par.pp : !strcmp(k, "cp") ? &par.cp
              : !strcmp(k, "ep") ? &par.ep : !strcmp(k, "dp") ? &par.dp : NULL;
    if (!strcmp(k, "sp") || !strcmp(k, "zero")) {
      if (v.k != V_BOOL) elab_error(e, kv->value->loc, "parallel: %s must be a bool, got %s", k, elab_value_desc(e, &v, buf, sizeof buf));
      else *(k[0] == 's' ? &par.sp : &par.zero) = (int)v.i;
    } else if (slot) {
      int lo = slot == &par.dp ? 0 : 1;
      if (v.k != V_INT || v.i < lo || v.i > 1 << 20)
        elab_error(e, kv->value->loc, "parallel: %s must be an int >= %d, got %s", k, lo, elab_value_desc(e, &v, buf, sizeof buf));
      else *slot = (int)v.i;
    } else {
      elab_error(e, kv->loc, "unknown parallel key '%s' (known: tp, pp, cp, ep, dp, sp, zero)", k);
    }
  }
  const MdlOptions *o = e->opt;
  const int *ov[6] = {&o->tp, &o->pp, &o->cp, &o->ep, &o->sp, &o->zero};
  int *dst[6] = {&par.tp, &par.pp, &par.cp, &par.ep, &par.sp, &par.zero};
  static const char *names[6] = {"tp", "pp", "cp", "ep", "sp", "zero"};
  for (int i = 0; i < 6; i++) {
    if (*ov[i] < 0) continue;
    if ((i < 4 && *ov[i] < 1) || (i == 4 && *ov[i] > 1) || (i == 5 && *ov[i] != 0 && *ov[i] != 1 && *ov[i] != 3))
      elab_error(e, no_loc, "--%s=%d is out of range (%s)", names[i], *ov[i],
                 i < 4 ? ">= 1" : i == 4 ? "0 or 1" : "0, 1 or 3");
    else *dst[i] = *ov[i];
  }
  e->m->par = par;
}

/* Checks one program's rules block and merges it into m->rules: a rule for
 * a dim already there (from a library read earlier) replaces it, and the
 * replacing rule moves to the end, so m->rules reads "the library defaults
 * nobody overrode, then the later module's rules in source order".  The
 * MDL form names one axis per dim; IrRule keeps a mask for later forms. */
static void rules_merge(Elab *e, const MdlProgram *p) {
  for (int i = 0; i < p->nrules; i++) {
    const MdlRule *r = &p->rules[i];
    int axis = ir_axis_lookup(r->axis);
    if (axis < 0)
      elab_error(e, r->loc, "rules: unknown mesh axis '%s' for dim '%s' (known: dp, tp, pp, cp, ep)", r->axis, r->dim);
    int twice = 0;
    for (int j = 0; j < i; j++)
      if (!strcmp(p->rules[j].dim, r->dim)) twice = 1;
    if (twice) elab_error(e, r->loc, "rules: dim '%s' is mapped twice", r->dim);
    if (axis < 0 || twice) continue;
    IrRule rule = {ts_intern(r->dim), (uint8_t)(1u << axis)};
    int w = 0;                               /* drop an earlier rule for the dim */
    for (int j = 0; j < e->m->rules.n; j++)
      if (e->m->rules.a[j].dim != rule.dim) e->m->rules.a[w++] = e->m->rules.a[j];
    e->m->rules.n = w;
    VEC_PUSH(e->m->rules, rule);
  }
}

/* Library modules' rules first (in load order: a module's dependencies
 * before it), then the main file's: the model overrides stdlib defaults. */
void elab_rules(Elab *e) {
  for (int i = 0; i < e->nmods; i++) rules_merge(e, e->mods[i].prog);
  rules_merge(e, e->main);
}
