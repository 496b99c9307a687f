/* train.c - the training loop: one rank's module (after autodiff and the
 * optimizer pass: blocks "micro" and "update") trained on the byte corpus.
 *
 *   for step s in [0, steps):
 *     lr = rt_lr_at(train, s)
 *     for micro-batch k in [0, global_batch / micro_batch):
 *       feed tokens / targets (/ loss_mask) of rows k*rows .. ; run "micro"
 *     run "update"
 *     loss = mean of the micro runs' `output "loss"`; grad norm = update's
 *
 * Progress goes to stdout one line per step; --metrics writes the same as
 * JSON Lines (step numbered from 1, like the progress line), flushed per
 * line so a crashed or interrupted run leaves every finished step. */
#include "train.h"
#include <math.h>
#include <errno.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What the micro block wants fed, found from its INPUT nodes. */
typedef struct {
  int has_tokens, has_targets, has_mask;
  IrType tok_t, mask_t;      /* tokens/targets type; loss_mask type */
  int64_t T, rows;           /* window length (last dim), rows per micro-batch */
} FeedSpec;

static int same_input_type(const IrType *a, const IrType *b) { return ir_type_same_shape(a, b); }

/* Collects and checks the inputs of block b against the data convention. */
static int feed_spec(const IrModule *m, int b, FeedSpec *fs, char *err, size_t errlen) {
  memset(fs, 0, sizeof *fs);
  const IrBlock *blk = &m->blocks.a[b];
  char tb[160], tb2[160];
  for (int i = 0; i < blk->n; i++) {
    const IrNode *n = &blk->nodes[i];
    if (n->op != IR_OP_INPUT) continue;
    const char *name = n->sa ? n->sa : "";
    int is_tok = strcmp(name, "tokens") == 0, is_tgt = strcmp(name, "targets") == 0;
    if (is_tok || is_tgt) {
      if (n->type.dtype != IR_I32 || n->type.rank < 1) {
        snprintf(err, errlen, "model input \"%s\" is %s; the byte data needs i32[..., seq]",
                 name, ir_type_str(&n->type, tb, sizeof tb));
        return -1;
      }
      if ((fs->has_tokens || fs->has_targets) && !same_input_type(&fs->tok_t, &n->type)) {
        snprintf(err, errlen, "model inputs \"tokens\" and \"targets\" differ: %s vs %s",
                 ir_type_str(&fs->tok_t, tb, sizeof tb), ir_type_str(&n->type, tb2, sizeof tb2));
        return -1;
      }
      fs->tok_t = n->type;
      if (is_tok) fs->has_tokens = 1; else fs->has_targets = 1;
    } else if (strcmp(name, "loss_mask") == 0) {
      fs->has_mask = 1;
      fs->mask_t = n->type;
    } else {
      snprintf(err, errlen, "model input \"%s\" is not provided by the byte data pipeline "
               "(it feeds \"tokens\", \"targets\" and \"loss_mask\")", name);
      return -1;
    }
  }
  if (!fs->has_tokens && !fs->has_targets) {
    snprintf(err, errlen, "block \"micro\" has no input \"tokens\" or \"targets\"");
    return -1;
  }
  fs->T = fs->tok_t.dim[fs->tok_t.rank - 1];
  fs->rows = fs->T ? ir_type_numel(&fs->tok_t) / fs->T : 0;
  if (fs->T < 1 || fs->rows < 1) {
    snprintf(err, errlen, "the tokens input %s is empty", ir_type_str(&fs->tok_t, tb, sizeof tb));
    return -1;
  }
  if (fs->has_mask && (ir_type_numel(&fs->mask_t) != ir_type_numel(&fs->tok_t) || fs->mask_t.dtype == IR_VOID)) {
    snprintf(err, errlen, "model input \"loss_mask\" %s does not match the tokens %s",
             ir_type_str(&fs->mask_t, tb, sizeof tb), ir_type_str(&fs->tok_t, tb2, sizeof tb2));
    return -1;
  }
  return 0;
}

/* Byte tokens are 0..255: warn when a cross-entropy has fewer classes,
 * since such targets will be refused at run time. */
static void warn_vocab(const IrModule *m) {
  for (int b = 0; b < m->blocks.n; b++) {
    const IrBlock *blk = &m->blocks.a[b];
    for (int i = 0; i < blk->n; i++) {
      const IrNode *n = &blk->nodes[i];
      if (n->op != IR_OP_CROSS_ENTROPY || n->nin < 1) continue;
      const IrType *lt = &blk->nodes[n->in[0]].type;
      int64_t V = lt->rank ? lt->dim[lt->rank - 1] : 0;
      if (V < RT_BYTE_VOCAB) {
        fprintf(stderr, "mrun: warning: the cross-entropy has %lld classes but byte tokens go up to 255; "
                "larger targets will stop training\n", (long long)V);
        return;
      }
    }
  }
}

static void json_num(FILE *f, const char *key, double v, int comma) {
  char b[64];
  if (isfinite(v)) ts_fmt_double(b, sizeof b, v);
  else snprintf(b, sizeof b, "null");     /* JSON has no nan/inf */
  fprintf(f, "\"%s\": %s%s", key, b, comma ? ", " : "");
}

typedef struct {
  RtProgram *prog;
  RtCorpus corpus;
  FILE *metrics;
  int32_t *tokens, *targets;
  void *mask;
} TrainRun;

static void run_free(TrainRun *r) {
  rt_program_free(r->prog);
  rt_corpus_free(&r->corpus);
  if (r->metrics) fclose(r->metrics);
  free(r->tokens);
  free(r->targets);
  free(r->mask);
}

/* One step: every micro-batch, then the update.  Writes the step's mean
 * loss and grad norm. */
static int train_step(TrainRun *r, const IrModule *m, const FeedSpec *fs, int mb, int ub,
                      int64_t s, int64_t nmicro, double lr, double *loss, double *gnorm,
                      char *err, size_t errlen) {
  RtFeed feeds[3];
  int nf = 0;
  if (fs->has_tokens) feeds[nf++] = (RtFeed){"tokens", r->tokens};
  if (fs->has_targets) feeds[nf++] = (RtFeed){"targets", r->targets};
  if (fs->has_mask) feeds[nf++] = (RtFeed){"loss_mask", r->mask};
  double sum = 0;
  for (int64_t k = 0; k < nmicro; k++) {
    if (rt_corpus_batch(&r->corpus, m->train.seed, s, k * fs->rows, fs->rows, fs->T,
                        r->tokens, r->targets, err, errlen) != 0)
      return -1;
    RtRunInfo info = {s, (int)k, lr};
    rt_outputs_clear(r->prog);
    if (rt_run_block(r->prog, mb, feeds, nf, &info, err, errlen) != 0) return -1;
    double l;
    if (rt_output(r->prog, "loss", &l) != 0) {
      snprintf(err, errlen, "block \"micro\" did not report `output \"loss\"`");
      return -1;
    }
    sum += l;
  }
  RtRunInfo info = {s, 0, lr};
  rt_outputs_clear(r->prog);
  if (rt_run_block(r->prog, ub, NULL, 0, &info, err, errlen) != 0) return -1;
  *loss = sum / (double)nmicro;
  if (rt_output(r->prog, "grad_norm", gnorm) != 0) *gnorm = NAN;
  return 0;
}

int rt_train(const IrModule *m, const RtTrainOpts *o, RtTrainResult *res, char *err, size_t errlen) {
  RtTrainOpts dflt = {0};
  if (!o) o = &dflt;
  FILE *log = o->log ? o->log : stdout;
  RtTrainResult rs = {0, NAN, NAN, NAN};
  int mb = ir_block_find(m, "micro"), ub = ir_block_find(m, "update");
  if (mb < 0 || ub < 0) {
    snprintf(err, errlen, "the program has no block \"%s\" (was it compiled with autodiff and the optimizer?)",
             mb < 0 ? "micro" : "update");
    return -1;
  }
  const IrTrain *tr = &m->train;
  if (tr->micro_batch <= 0 || tr->global_batch <= 0 || tr->global_batch % tr->micro_batch != 0) {
    snprintf(err, errlen, "global_batch %lld is not a positive multiple of micro_batch %lld",
             (long long)tr->global_batch, (long long)tr->micro_batch);
    return -1;
  }
  int64_t nmicro = tr->global_batch / tr->micro_batch;
  FeedSpec fs;
  if (feed_spec(m, mb, &fs, err, errlen) != 0) return -1;
  if (fs.has_targets) warn_vocab(m);

  TrainRun r = {0};
  const char *path = o->data_path ? o->data_path : rt_corpus_default_path();
  if (rt_corpus_open(&r.corpus, path, err, errlen) != 0) return -1;
  if (r.corpus.len < (size_t)fs.T + 2) {
    snprintf(err, errlen, "corpus %s has %zu bytes; seq_len %lld needs at least %lld",
             path, r.corpus.len, (long long)fs.T, (long long)fs.T + 2);
    run_free(&r);
    return -1;
  }
  if (o->metrics_path && !(r.metrics = fopen(o->metrics_path, "w"))) {
    snprintf(err, errlen, "cannot write metrics %s: %s", o->metrics_path, strerror(errno));
    run_free(&r);
    return -1;
  }
  int64_t ntok = fs.rows * fs.T;
  r.tokens = ts_xcalloc((size_t)ntok, sizeof *r.tokens);
  r.targets = ts_xcalloc((size_t)ntok, sizeof *r.targets);
  if (fs.has_mask) {
    size_t es = ir_dtype_size(fs.mask_t.dtype);
    r.mask = ts_xcalloc((size_t)ntok, es);
    for (int64_t i = 0; i < ntok; i++) {
      if (fs.mask_t.dtype == IR_F32) ((float *)r.mask)[i] = 1.0f;
      else if (fs.mask_t.dtype == IR_F64) ((double *)r.mask)[i] = 1.0;
      else ((int32_t *)r.mask)[i] = 1;
    }
  }
  if (!(r.prog = rt_program_new(m, err, errlen))) { run_free(&r); return -1; }

  double t0 = now_s();
  int rc = 0;
  for (int64_t s = 0; s < tr->steps; s++) {
    double ts = now_s(), lr = rt_lr_at(tr, s), loss, gn;
    if (train_step(&r, m, &fs, mb, ub, s, nmicro, lr, &loss, &gn, err, errlen) != 0) {
      char msg[1024];
      snprintf(msg, sizeof msg, "step %lld: %s", (long long)s + 1, err);
      snprintf(err, errlen, "%s", msg);
      rc = -1;
      break;
    }
    if (!isfinite(loss)) {
      snprintf(err, errlen, "step %lld: the loss is %s; stopping (try a lower lr or clip_grad)",
               (long long)s + 1, isnan(loss) ? "nan" : "inf");
      rc = -1;
      break;
    }
    double t1 = now_s(), tps = (double)(ntok * nmicro) / (t1 - ts > 1e-9 ? t1 - ts : 1e-9);
    if (!o->quiet) {
      fprintf(log, "step %4lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.1f s\n",
              (long long)s + 1, (long long)tr->steps, loss, lr, gn, tps, t1 - t0);
      fflush(log);
    }
    if (r.metrics) {
      fprintf(r.metrics, "{\"step\": %lld, ", (long long)s + 1);
      json_num(r.metrics, "loss", loss, 1);
      json_num(r.metrics, "lr", lr, 1);
      json_num(r.metrics, "grad_norm", gn, 1);
      json_num(r.metrics, "tokens_per_s", tps, 1);
      json_num(r.metrics, "elapsed_s", t1 - t0, 0);
      fprintf(r.metrics, "}\n");
      fflush(r.metrics);
    }
    if (s == 0) rs.first_loss = loss;
    rs.last_loss = loss;
    rs.last_grad_norm = gn;
    rs.steps = s + 1;
  }
  run_free(&r);
  if (res) *res = rs;
  return rc;
}
