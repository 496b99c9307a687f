/* train.c - the training loop: one rank's module (after autodiff and the
 * optimizer pass: blocks "micro" and "update") trained on what data.c reads,
 * alone or as one of N ranks (train.h has the multi-rank contract).
 *
 *   for step s in [0, steps):
 *     lr = rt_lr_at(train, s, samples before s)
 *     for local micro-batch j in [0, n_local), global index g = r*n_local + j:
 *       feed tokens / targets (/ loss_mask) of global rows g*mb ..; run "micro"
 *     run "update"
 *     loss = (sum over dp ranks of the micro losses) / (global_batch / mb)
 *
 * A pipeline program (par.pp > 1, par.stage = r + 1: the blocks fwd.<g> /
 * bwd.<g> of its chunks and "update"; docs/pipeline.md) runs, per step, the
 * steps of its pipeline rank's schedule instead of "micro":
 *
 *     schedule = plan_pipe_schedule(par.sched, pp, vpp, n_local), checked
 *     for each step (F|B|W, micro j, chunk g): run fwd.<g> / bwd.<g> /
 *       wgt.<g> (W: a split backward's weight gradients, --schedule zb-h1), fed
 *       micro batch g_j = r*n_local + j when the block has data inputs
 *     complete the posted sends; no stash may be left
 *     loss = (sum over pp and dp ranks of the forward blocks' losses) / (global_batch / mb)
 *     run "update" (fp16: "scaler" first, then "update" or "skip", as for
 *       any program: the inf check's max spans the pp axis too)
 *
 * Validation (--eval-interval, --test) runs pass eval's forward-only
 * blocks over the valid / test part: "eval" per micro batch, or, in a
 * pipeline program, eval.<g> at every F step of the schedule (the B steps
 * left out), the loss summed as in training.  They touch no state.
 *
 * Progress goes to stdout one line per step; --metrics writes the same as
 * JSON Lines (step numbered from 1, like the progress line), flushed per
 * line so a crashed or interrupted run leaves every finished step. */
#include "train.h"
#include <sys/stat.h>
#include "rt_priv.h"
#include "runtime/comm/comm.h"
#include "plan/schedule.h"
#include "plan/flops.h"
#include <math.h>
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

/* ---- stopping on a signal, and the rank's status file (train.h) ---- */
static volatile sig_atomic_t stop_sig;

static void on_stop(int sig) {
  if (stop_sig) {   /* a second one: the default action, at once */
    signal(sig, SIG_DFL);
    raise(sig);
  }
  stop_sig = sig;
}

/* DIR/rank.<r> <- "what S PID", replaced by a rename: the launcher reads it
 * at any moment (to pass a signal to the rank), and a file rewritten in
 * place is empty between its truncation and the write. */
static void status_write(int world_rank, const char *what, int64_t step) {
  const char *dir = getenv("XNOSTATUS") ? NULL : getenv("TS_MRUN_STATUS_DIR");
  if (!dir || !*dir) return;
  char path[4096], tmp[4200], line[64];
  snprintf(path, sizeof path, "%s/rank.%d", dir, world_rank);
  snprintf(tmp, sizeof tmp, "%s.new", path);
  int n = snprintf(line, sizeof line, "%s %lld %ld\n", what, (long long)step, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  int ok = fwrite(line, 1, (size_t)n, f) == (size_t)n;
  if (fclose(f) != 0) ok = 0;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);   /* the report is best effort */
}

/* What the micro block wants fed, found from its INPUT nodes.  An input
 * split over mesh axes (sequence parallelism) is fed the rank's block of
 * the global micro batch. */
typedef struct {
  int none;                  /* no block has data inputs (a middle pipeline stage) */
  int has_tokens, has_targets, has_mask;
  IrType tok_t, mask_t;      /* tokens/targets type (local); loss_mask type */
  IrSharding tok_sh;         /* the tokens/targets inputs' sharding */
  IrSharding mask_sh;
  int has_pos, has_doc;      /* position_ids / document_ids (packed.c makes them) */
  IrType pos_t, doc_t;
  IrSharding pos_sh, doc_sh;
  int64_t T, rows;           /* GLOBAL window length (last dim), rows per micro-batch */
  int has_weight;            /* a ramp-up plan's "micro_weight" (1 / the step's micro batches) */
  IrDtype weight_t;
  int split;                 /* the inputs are split: slice the global batch */
} FeedSpec;

static int same_input_type(const IrType *a, const IrType *b) { return ir_type_same_shape(a, b); }

/* Collects and checks the inputs of blocks blocks[0..nb) against the data
 * convention (all blocks must agree).  need: at least one of them must
 * read tokens or targets; otherwise no inputs at all sets fs->none. */
static int feed_spec(const RtProgram *p, const IrModule *m, const int *blocks, int nb, int need, FeedSpec *fs,
                     char *err, size_t errlen) {
  memset(fs, 0, sizeof *fs);
  char tb[160], tb2[160];
  for (int bi = 0; bi < nb; bi++)   /* every INPUT node of every block */
  for (int i = 0; i < m->blocks.a[blocks[bi]].n; i++) {
    const IrNode *n = &m->blocks.a[blocks[bi]].nodes[i];
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
      if ((fs->has_tokens || fs->has_targets) && !ir_sharding_equal(&fs->tok_sh, &n->sh)) {
        snprintf(err, errlen, "model inputs \"tokens\" and \"targets\" are sharded differently");
        return -1;
      }
      fs->tok_t = n->type;
      fs->tok_sh = n->sh;
      if (is_tok) fs->has_tokens = 1; else fs->has_targets = 1;
    } else if (strcmp(name, "loss_mask") == 0) {
      if (fs->has_mask && !same_input_type(&fs->mask_t, &n->type)) {
        snprintf(err, errlen, "model input \"loss_mask\" has two types: %s vs %s",
                 ir_type_str(&fs->mask_t, tb, sizeof tb), ir_type_str(&n->type, tb2, sizeof tb2));
        return -1;
      }
      fs->has_mask = 1;
      fs->mask_t = n->type;
      fs->mask_sh = n->sh;
    } else if (ir_feed_find(name) == IR_FEED_POSITION_IDS || ir_feed_find(name) == IR_FEED_DOCUMENT_IDS) {
      int is_pos = ir_feed_find(name) == IR_FEED_POSITION_IDS;
      if (n->type.dtype != IR_I32 || n->type.rank < 1) {
        snprintf(err, errlen, "model input \"%s\" is %s; the data pipeline feeds i32[..., seq] like the tokens",
                 name, ir_type_str(&n->type, tb, sizeof tb));
        return -1;
      }
      *(is_pos ? &fs->has_pos : &fs->has_doc) = 1;
      *(is_pos ? &fs->pos_t : &fs->doc_t) = n->type;
      *(is_pos ? &fs->pos_sh : &fs->doc_sh) = n->sh;
    } else if (strcmp(name, IR_MICRO_WEIGHT) == 0 && n->type.rank == 0 && ir_dtype_is_float(n->type.dtype)) {
      fs->has_weight = 1;   /* the loss gradient's seed of a ramp-up plan (passes/autodiff.c): the trainer's */
      fs->weight_t = n->type.dtype;
    } else {
      snprintf(err, errlen, "model input \"%s\" is not provided by the data pipeline (it feeds %s)", name,
               ir_feed_list());
      return -1;
    }
  }
  if (!fs->has_tokens && !fs->has_targets && need == 0 && (fs->has_pos || fs->has_doc)) {
    /* a middle pipeline stage reading only the document ids (its attention
     * layers): they set the window's shape */
    fs->tok_t = fs->has_doc ? fs->doc_t : fs->pos_t;
    fs->tok_sh = fs->has_doc ? fs->doc_sh : fs->pos_sh;
  } else if (!fs->has_tokens && !fs->has_targets) {
    if (!need && !fs->has_mask) { fs->none = 1; return 0; }
    snprintf(err, errlen, "block \"%s\"%s has no input \"tokens\" or \"targets\"", m->blocks.a[blocks[0]].name,
             nb > 1 ? " (nor any other block of the program)" : "");
    return -1;
  }
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  rt_shard_offsets(rt_program_rank(p), &fs->tok_sh, &fs->tok_t, off, gdim);
  IrType gt = fs->tok_t;
  for (int d = 0; d < gt.rank; d++) {
    fs->split |= gdim[d] != gt.dim[d];
    gt.dim[d] = gdim[d];
  }
  if (fs->tok_sh.partial) {
    snprintf(err, errlen, "model input \"tokens\" is a partial sum; inputs can only be split or replicated");
    return -1;
  }
  fs->T = gt.dim[gt.rank - 1];
  fs->rows = fs->T ? ir_type_numel(&gt) / fs->T : 0;
  if (fs->T < 1 || fs->rows < 1) {
    snprintf(err, errlen, "the tokens input %s is empty", ir_type_str(&fs->tok_t, tb, sizeof tb));
    return -1;
  }
  if (fs->has_mask && (ir_type_numel(&fs->mask_t) != ir_type_numel(&fs->tok_t) || fs->mask_t.dtype == IR_VOID)) {
    snprintf(err, errlen, "model input \"loss_mask\" %s does not match the tokens %s",
             ir_type_str(&fs->mask_t, tb, sizeof tb), ir_type_str(&fs->tok_t, tb2, sizeof tb2));
    return -1;
  }
  /* the other feeds are made per token of the global [rows, T] batch and
   * sliced by their own sharding: their global shape must be the tokens' */
  const struct { int has; const char *name; const IrType *t; const IrSharding *sh; } other[] = {
      {fs->has_pos, "position_ids", &fs->pos_t, &fs->pos_sh},
      {fs->has_doc, "document_ids", &fs->doc_t, &fs->doc_sh},
      {fs->has_mask, "loss_mask", &fs->mask_t, &fs->mask_sh}};
  for (int k = 0; k < 3; k++) {
    if (!other[k].has) continue;
    int64_t o2[IR_MAX_RANK], g2[IR_MAX_RANK];
    rt_shard_offsets(rt_program_rank(p), other[k].sh, other[k].t, o2, g2);
    int same = other[k].t->rank == gt.rank && !other[k].sh->partial;
    for (int d = 0; same && d < gt.rank; d++) {
      same = g2[d] == gt.dim[d];
      fs->split |= g2[d] != other[k].t->dim[d];
    }
    if (!same) {
      snprintf(err, errlen, "model input \"%s\" %s does not match the tokens %s (one value per token)",
               other[k].name, ir_type_str(other[k].t, tb, sizeof tb), ir_type_str(&fs->tok_t, tb2, sizeof tb2));
      return -1;
    }
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

#define RT_MAX_METRICS 1024   /* extra outputs recorded per step */

typedef struct {
  RtProgram *prog;
  RtDataSrc data;
  RtDataSrc vdata, tdata;        /* the valid and test parts (--eval-interval, --test; kind 0 unused) */
  RtDataSrc *src;                /* what load_micro reads: &data, or an evaluation's part */
  RtPrefetch *pf;                /* training batches made one step ahead (NULL: --no-prefetch, no data) */
  const IrTrain *train;          /* the plan's train line (the ramp-up's batches) */
  int dp_coord, ndp;             /* this rank's dp coordinate, dp */
  union { double d; float f; } weight;   /* the micro_weight feed: 1 / the step's micro batches */
  const FeedSpec *pf_fs;         /* for the prefetch thread's fills */
  int32_t *pf_gtok, *pf_gtgt;    /* its global micro batch (split inputs) */
  int pf_global;                 /* the thread delivers the global tokens too (packed inputs of split tokens) */
  FILE *metrics;                 /* --metrics (a log written as it goes) */
  const char *metrics_path;
  char metrics_err[1200];        /* its first write error: the run ends with it */
  int32_t *tokens, *targets;     /* the rank's local block, fed to the program */
  int32_t *gtok, *gtgt;          /* the global micro batch (split inputs only) */
  void *mask;
  int32_t *pos, *doc;            /* position_ids / document_ids: the rank's block */
  int32_t *gpos, *gdoc, *gmask;  /* ... and the loss mask as 0/1, over the global micro batch */
  int32_t *lmask;                /* the rank's block of gmask, before its conversion to the mask's dtype */
  const RtGptOpts *pack;         /* the packed-sequence flags and the EOD id */
  int64_t first_step;            /* the run's first step (after a resume: the checkpoint's) */
  RtComm *dp;                    /* the dp group (NULL: dp = 1) */
  RtComm *pp;                    /* the pp group (NULL: pp = 1) */
  PipeSchedule sched;            /* pipeline programs: every pipeline rank's schedule */
  int have_sched;
  int64_t sched_n;               /* the micro batches per dp rank it is made for (a ramp-up changes them) */
  PipeSchedKind sched_kind;
  int sched_pp, sched_vpp;
  int *chunk_block;              /* pipeline: per global chunk, fwd.<g>, bwd.<g>, eval.<g>, wgt.<g>
                                    ([4g] .. [4g+3]) or -1 */
  unsigned char *has_data;       /* per block: it has data inputs (fed the micro batch) */
  int64_t loaded_step, loaded_micro; /* what the feed buffers hold (-1: nothing) */
  int world_rank;
  int64_t kill_step, stall_step; /* fault injection (0: off) */
  int step_delay_ms;             /* TS_FAULT_STEP_DELAY_MS: each step this much longer (tests: a background
                                    thread's time made independent of the machine's load) */
  /* the model's extra outputs (MDL metric(), e.g. nn.moe's tokens per
   * expert): summed over the step's micro batches and dp ranks, not divided */
  const char *xname[RT_MAX_METRICS];
  double xval[RT_MAX_METRICS];
  int nx;
  /* fp16's loss scaling (passes/scaler.c): blocks "scaler" and "skip"
   * (-1: none), and what the step's scaler block reported */
  int sb, kb;
  const char *inf_steps;         /* TS_FAULT_INF_STEPS (tests): "3,4,9", the steps at which +inf goes into
                                    this rank's first gradient, or NULL */
  double ls_scale, ls_skips, ls_lr;
  int ls_skipped;
} TrainRun;

/* Adds the outputs of the block just run, other than the loss, to r's
 * step metrics (names are interned: pointer comparison). */
static void add_metrics(TrainRun *r) {
  const char *loss = ts_intern("loss");
  double v;
  const char *name;
  for (int i = 0; (name = rt_output_at(r->prog, i, &v)); i++) {
    if (name == loss) continue;
    int j = 0;
    while (j < r->nx && r->xname[j] != name) j++;
    if (j == r->nx) {
      if (r->nx == RT_MAX_METRICS) continue;      /* more are not recorded */
      r->xname[r->nx] = name, r->xval[r->nx++] = 0;
    }
    r->xval[j] += v;
  }
}

/* The progress line's compact form of the metrics: a vector metric
 * "p.0" .. "p.n" prints as " | p a/b/.../n", a scalar as " | name v". */
static void print_metrics(FILE *log, const TrainRun *r) {
  for (int i = 0; i < r->nx; i++) {
    const char *n = r->xname[i], *dot = strrchr(n, '.');
    int vec = dot && dot[1] && strspn(dot + 1, "0123456789") == strlen(dot + 1);
    size_t plen = vec ? (size_t)(dot - n) : strlen(n);
    if (vec && i > 0) {   /* continues the previous entry's vector? */
      const char *pn = r->xname[i - 1], *pd = strrchr(pn, '.');
      if (pd && (size_t)(pd - pn) == plen && !strncmp(pn, n, plen)) { fprintf(log, "/%.6g", r->xval[i]); continue; }
    }
    if (vec) fprintf(log, " | %.*s %.6g", (int)plen, n, r->xval[i]);
    else fprintf(log, " | %s %.4g", n, r->xval[i]);
  }
}

static void run_free(TrainRun *r) {
  rt_prefetch_stop(r->pf);   /* first: its thread reads r->data */
  r->pf = NULL;
  free(r->pf_gtok);
  free(r->pf_gtgt);
  rt_program_free(r->prog);
  rt_data_close(&r->data);
  rt_data_close(&r->vdata);
  rt_data_close(&r->tdata);
  if (r->metrics && ts_close_log(r->metrics, r->metrics_path) != 0 && !r->metrics_err[0])
    snprintf(r->metrics_err, sizeof r->metrics_err, "--metrics: %s", ts_io_error());
  free(r->tokens);
  free(r->targets);
  free(r->gtok);
  free(r->gtgt);
  free(r->mask);
  free(r->pos);
  free(r->doc);
  free(r->gpos);
  free(r->gdoc);
  free(r->gmask);
  free(r->lmask);
  if (r->have_sched) plan_pipe_schedule_free(&r->sched);
  free(r->chunk_block);
  free(r->has_data);
}

/* The local block of a global [rows, T]-shaped i32 batch: x holds the
 * global tensor (dims gdim), y gets the rank's block of local type lt
 * under sharding sh (global indices by rt_global_index: a dim split over
 * cp holds its two zigzag chunks). */
static void slice_block(const RtProgram *p, int32_t *y, const int32_t *x, const IrType *lt, const int64_t *gdim,
                        const IrSharding *sh) {
  int64_t n = ir_type_numel(lt), idx[IR_MAX_RANK] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t g = 0;
    for (int d = 0; d < lt->rank; d++) g = g * gdim[d] + rt_global_index(rt_program_rank(p), sh->split[d], lt->dim[d], idx[d]);
    y[i] = x[g];
    for (int d = lt->rank - 1; d >= 0; d--) {
      if (++idx[d] < lt->dim[d]) break;
      idx[d] = 0;
    }
  }
}

/* slice_block of an input of local type lt and sharding sh (its global
 * dims from them); unsplit, a copy. */
static void slice_input(const RtProgram *p, int split, int32_t *y, const int32_t *x, const IrType *lt,
                        const IrSharding *sh) {
  if (!split) {
    memcpy(y, x, (size_t)ir_type_numel(lt) * sizeof *y);
    return;
  }
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  rt_shard_offsets(rt_program_rank(p), sh, lt, off, gdim);
  slice_block(p, y, x, lt, gdim, sh);
}

/* The rank's block of global micro batch g of step s of src into tok /
 * tgt (gtok / gtgt: room for the global batch when the inputs are split).
 * Only reads r (the prefetch thread calls it too). */
static int fill_micro(const TrainRun *r, const FeedSpec *fs, RtDataSrc *src, int64_t s, int64_t g, int32_t *tok,
                      int32_t *tgt, int32_t *gtok, int32_t *gtgt, char *err, size_t errlen) {
  /* the step's first global sample: training batches follow the ramp-up (the
   * micro batches consumed before step s), evaluation batches are whole */
  int64_t first = src == &r->data ? rt_samples_before(r->prog, s) / r->train->micro_batch * fs->rows
                                  : s * src->per_step;
  if (!fs->split) return rt_data_rows(src, s, first, g * fs->rows, fs->rows, tok, tgt, err, errlen);
  if (rt_data_rows(src, s, first, g * fs->rows, fs->rows, gtok, gtgt, err, errlen) != 0) return -1;
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  rt_shard_offsets(rt_program_rank(r->prog), &fs->tok_sh, &fs->tok_t, off, gdim);
  slice_block(r->prog, tok, gtok, &fs->tok_t, gdim, &fs->tok_sh);
  slice_block(r->prog, tgt, gtgt, &fs->tok_t, gdim, &fs->tok_sh);
  return 0;
}

/* The micro batches of step s, all dp ranks together, and this rank's
 * share: global_batch / micro_batch, or (ramp-up) the step's batch from
 * the samples consumed before it (ir/rampup.c).  The global micro batches
 * of rank d are d * n_local .. (d + 1) * n_local - 1. */
static int64_t step_micros(const TrainRun *r, int64_t s) {
  return ir_train_batch_at(r->train, rt_samples_before(r->prog, s)) / r->train->micro_batch;
}
static int64_t step_local_micros(const TrainRun *r, int64_t s) { return step_micros(r, s) / r->ndp; }

/* The prefetch thread's fill (RtPrefetchFill): local micro j of step s;
 * the global tokens go straight into the slot's gtok when the trainer
 * wants them (packed inputs of split tokens), else into scratch. */
static int pf_fill(void *ctx, int64_t s, int64_t j, int32_t *tok, int32_t *tgt, int32_t *gtok, char *err,
                   size_t errlen) {
  TrainRun *r = ctx;
  int64_t n_local = step_local_micros(r, s);
  if (j >= n_local) return 0;   /* a ramp-up step with fewer micro batches: nothing to make */
  return fill_micro(r, r->pf_fs, &r->data, s, (int64_t)r->dp_coord * n_local + j, tok, tgt, gtok ? gtok : r->pf_gtok,
                    r->pf_gtgt, err, errlen);
}

/* Fills the feeds with global micro batch g of step s: tokens and targets
 * (from the prefetch thread when it runs), then the packed-sequence inputs
 * made from the micro batch's global tokens (packed.c) and each input's
 * block of them.  With split inputs the global tokens are r->gtok, which
 * fill_micro writes, or the prefetch thread delivers (r->pf_global). */
static int load_micro_data(TrainRun *r, const IrModule *m, const FeedSpec *fs, int64_t s, int64_t g,
                           char *err, size_t errlen) {
  (void)m;
  int rc = r->pf && r->src == &r->data
               ? rt_prefetch_get(r->pf, s, g - (int64_t)r->dp_coord * step_local_micros(r, s), r->tokens, r->targets, r->pf_global ? r->gtok : NULL, err,
                                 errlen)
               : fill_micro(r, fs, r->src, s, g, r->tokens, r->targets, r->gtok, r->gtgt, err, errlen);
  if (rc != 0) return -1;
  if (!fs->has_pos && !fs->has_doc && !fs->has_mask) return 0;
  const int32_t *tok = fs->split ? r->gtok : r->tokens;
  rt_packed_inputs(r->pack, tok, fs->rows, fs->T, r->gpos, r->gdoc, r->gmask);
  if (fs->has_pos) slice_input(r->prog, fs->split, r->pos, r->gpos, &fs->pos_t, &fs->pos_sh);
  if (fs->has_doc) slice_input(r->prog, fs->split, r->doc, r->gdoc, &fs->doc_t, &fs->doc_sh);
  if (fs->has_mask) {
    slice_input(r->prog, fs->split, r->lmask, r->gmask, &fs->mask_t, &fs->mask_sh);
    int64_t nm = ir_type_numel(&fs->mask_t);
    for (int64_t i = 0; i < nm; i++) {
      if (fs->mask_t.dtype == IR_F32) ((float *)r->mask)[i] = (float)r->lmask[i];
      else if (fs->mask_t.dtype == IR_F64) ((double *)r->mask)[i] = (double)r->lmask[i];
      else ((int32_t *)r->mask)[i] = r->lmask[i];
    }
  }
  return 0;
}

/* TS_DUMP_FEEDS=DIR (a debugging aid, and how tests/packed sees what the
 * model is fed): the first step's micro batches as this rank feeds them,
 * one file DIR/feeds.<world rank>.<global micro batch>, a line per input:
 * its name, then its values in the rank's local row-major order. */
static void dump_feeds(const TrainRun *r, const FeedSpec *fs, int64_t g) {
  const char *dir = getenv("TS_DUMP_FEEDS");
  if (!dir || !*dir) return;
  char path[4200];
  snprintf(path, sizeof path, "%s/feeds.%d.%lld", dir, r->world_rank, (long long)g);
  FILE *f = fopen(path, "w");
  if (!f) { fprintf(stderr, "mrun: TS_DUMP_FEEDS: cannot write %s: %s\n", path, strerror(errno)); return; }
  const struct { int has; const char *name; const int32_t *v; const IrType *t; } in[] = {
      {1, "tokens", r->tokens, &fs->tok_t}, {1, "targets", r->targets, &fs->tok_t},
      {fs->has_pos, "position_ids", r->pos, &fs->pos_t}, {fs->has_doc, "document_ids", r->doc, &fs->doc_t},
      {fs->has_mask, "loss_mask", r->lmask, &fs->mask_t}};
  for (int k = 0; k < 5; k++) {
    if (!in[k].has) continue;
    fprintf(f, "%s", in[k].name);
    for (int64_t i = 0; i < ir_type_numel(in[k].t); i++) fprintf(f, " %d", in[k].v[i]);
    fprintf(f, "\n");
  }
  if (fclose(f) != 0) fprintf(stderr, "mrun: TS_DUMP_FEEDS: cannot write %s\n", path);
}

/* The same, skipped when the buffers already hold it (a pipeline rank
 * runs the F and the B of a micro batch, and several chunks). */
static int load_micro(TrainRun *r, const IrModule *m, const FeedSpec *fs, int64_t s, int64_t g,
                      char *err, size_t errlen) {
  if (r->loaded_step == s && r->loaded_micro == g) return 0;
  r->loaded_step = r->loaded_micro = -1;
  if (load_micro_data(r, m, fs, s, g, err, errlen) != 0) return -1;
  if (s == r->first_step) dump_feeds(r, fs, g);
  r->loaded_step = s;
  r->loaded_micro = g;
  return 0;
}

/* The feeds of a micro batch: every input the program declares, from the
 * buffers load_micro fills (and the step's micro_weight, set by the
 * trainer).  Returns how many (at most IR_FEED_COUNT + 1). */
static int micro_feeds(const TrainRun *r, const FeedSpec *fs, RtFeed *feeds) {
  int nf = 0;
  if (fs->has_tokens) feeds[nf++] = (RtFeed){ir_feed_name(IR_FEED_TOKENS), r->tokens};
  if (fs->has_targets) feeds[nf++] = (RtFeed){ir_feed_name(IR_FEED_TARGETS), r->targets};
  if (fs->has_mask) feeds[nf++] = (RtFeed){ir_feed_name(IR_FEED_LOSS_MASK), r->mask};
  if (fs->has_pos) feeds[nf++] = (RtFeed){ir_feed_name(IR_FEED_POSITION_IDS), r->pos};
  if (fs->has_doc) feeds[nf++] = (RtFeed){ir_feed_name(IR_FEED_DOCUMENT_IDS), r->doc};
  if (fs->has_weight) feeds[nf++] = (RtFeed){IR_MICRO_WEIGHT, &r->weight};
  return nf;
}

/* TS_FAULT_<what>_RANK / _STEP: the step (from 1) at which this world rank
 * fails, or 0. */
static int64_t fault_step(const char *what, int world_rank) {
  char k1[64], k2[64];
  snprintf(k1, sizeof k1, "TS_FAULT_%s_RANK", what);
  snprintf(k2, sizeof k2, "TS_FAULT_%s_STEP", what);
  const char *r = getenv(k1), *s = getenv(k2);
  if (!r || !s || atoi(r) != world_rank) return 0;
  return atoll(s) > 0 ? atoll(s) : 0;
}

/* The injected faults, in step s (0-based) after a micro batch. */
static void maybe_fail(const TrainRun *r, int64_t s) {
  if (r->kill_step == s + 1) {
    fprintf(stderr, "rank %d: TS_FAULT_KILL: killing myself in step %lld\n", r->world_rank, (long long)s + 1);
    fflush(stderr);
    raise(SIGKILL);
  }
  if (r->step_delay_ms > 0) usleep((useconds_t)r->step_delay_ms * 1000);
  if (r->stall_step == s + 1) {
    fprintf(stderr, "rank %d: TS_FAULT_STALL: stalling in step %lld\n", r->world_rank, (long long)s + 1);
    fflush(stderr);
    for (;;) sleep(1000);   /* the peers' deadline ends the job */
  }
}

/* TS_FAULT_INF_STEPS=LIST when TS_FAULT_INF_RANK is this world rank, else NULL. */
static const char *inf_steps(int world_rank) {
  const char *r = getenv("TS_FAULT_INF_RANK"), *s = getenv("TS_FAULT_INF_STEPS");
  return r && s && atoi(r) == world_rank ? s : NULL;
}
/* step (from 1) in the comma-separated list */
static int inf_at(const char *list, int64_t step) {
  for (const char *p = list; p && *p;) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p) return 0;
    if (v == step) return 1;
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

/* Test hook (TS_FAULT_INF_RANK=r TS_FAULT_INF_STEPS=s,..., docs/precision.md):
 * element 0 of the rank's first gradient state becomes +inf after the
 * step's micro batches, as an fp16 overflow in its backward would make it. */
static int inject_inf(TrainRun *r, const IrModule *m, int64_t s, char *err, size_t errlen) {
  for (int i = 0; i < m->states.n; i++) {
    const IrState *st = &m->states.a[i];
    if (st->kind != IR_STATE_GRAD) continue;
    if (rt_program_sync_states(r->prog, err, errlen) != 0) return -1;
    void *d = rt_state_data(r->prog, i);
    if (st->type.dtype == IR_F64) *(double *)d = INFINITY;
    else *(float *)d = INFINITY;
    fprintf(stderr, "rank %d: TS_FAULT_INF: +inf into @%s[0] in step %lld\n", r->world_rank, st->name,
            (long long)s + 1);
    return rt_program_push_states(r->prog, err, errlen);
  }
  return 0;
}

/* The step's update.  With loss scaling: block "scaler" first (the
 * all-rank inf check and the scale update), then "update" when no rank
 * found an inf or NaN, with the step count and lr of the steps applied so
 * far (Megatron: a skipped step advances neither Adam's step nor the lr
 * schedule), else "skip" (the gradients cleared, nothing else). */
static int run_update(TrainRun *r, const IrModule *m, int ub, int64_t s, double lr, double *gnorm, char *err,
                      size_t errlen) {
  int64_t applied = s;
  r->ls_lr = lr;
  if (r->sb >= 0) {
    RtRunInfo si = {s, 0, lr, 0};
    rt_outputs_clear(r->prog);
    if (rt_run_block(r->prog, r->sb, NULL, 0, &si, err, errlen) != 0) return -1;
    double found = 1;
    if (rt_output(r->prog, "found_inf", &found) != 0 || rt_output(r->prog, "loss_scale", &r->ls_scale) != 0 ||
        rt_output(r->prog, "skipped_steps", &r->ls_skips) != 0)
      return ts_errf(err, errlen, "block \"scaler\" did not report found_inf, loss_scale and skipped_steps");
    r->ls_skipped = found != 0;
    applied = s - (int64_t)r->ls_skips;   /* the skips before this step */
    r->ls_skips += r->ls_skipped;
    if (r->ls_skipped) {
      *gnorm = NAN;
      r->ls_lr = NAN;
      return rt_run_block(r->prog, r->kb, NULL, 0, &si, err, errlen);
    }
    r->ls_lr = lr = rt_lr_at(&m->train, applied, rt_samples_before(r->prog, applied));
  }
  RtRunInfo info = {applied, 0, lr, 0};
  rt_outputs_clear(r->prog);
  if (rt_run_block(r->prog, ub, NULL, 0, &info, err, errlen) != 0) return -1;
  if (rt_output(r->prog, "grad_norm", gnorm) != 0) *gnorm = NAN;
  return 0;
}

/* One step: the rank's micro-batches, then the update.  Writes the step's
 * loss (over all dp ranks) and grad norm. */
static int train_step(TrainRun *r, const IrModule *m, const FeedSpec *fs, int mb, int ub,
                      int64_t s, int64_t n_local, int64_t n_global, int dp_coord, double lr,
                      double *loss, double *gnorm, char *err, size_t errlen) {
  RtFeed feeds[IR_FEED_COUNT + 1];
  int nf = micro_feeds(r, fs, feeds);
  double sum = 0;
  r->nx = 0;
  for (int64_t j = 0; j < n_local; j++) {
    int64_t g = (int64_t)dp_coord * n_local + j;   /* the global micro batch */
    if (load_micro(r, m, fs, s, g, err, errlen) != 0) return -1;
    RtRunInfo info = {s, (int)g, lr, j == n_local - 1};   /* the last one's backward issues the dp reductions */
    rt_outputs_clear(r->prog);
    if (rt_run_block(r->prog, mb, feeds, nf, &info, err, errlen) != 0) return -1;
    double l;
    if (rt_output(r->prog, "loss", &l) != 0) {
      snprintf(err, errlen, "block \"micro\" did not report `output \"loss\"`");
      return -1;
    }
    sum += l;
    add_metrics(r);
    if (j == 0) maybe_fail(r, s);
  }
  if (r->dp && rt_comm_all_reduce(r->dp, IR_F64, &sum, 1, err, errlen) != 0) return -1;
  /* every dp rank runs the same program, so the metric lists agree; tp and
   * ep ranks compute replicated values and are not summed over */
  if (r->dp && r->nx && rt_comm_all_reduce(r->dp, IR_F64, r->xval, r->nx, err, errlen) != 0) return -1;
  if (inf_at(r->inf_steps, s + 1) && inject_inf(r, m, s, err, errlen) != 0) return -1;
  *loss = sum / (double)n_global;
  return run_update(r, m, ub, s, lr, gnorm, err, errlen);
}

/* ---- evaluation (--eval-interval, --test) ---- */

/* One evaluation batch k of a pipeline program: the forward-only
 * schedule, which is the training schedule's F steps in their order (a
 * forward never waits for a backward, so dropping every B step leaves a
 * schedule that cannot deadlock, and each link carries the evaluation's
 * messages in the order the training forwards send theirs), each running
 * eval.<g> of its chunk; then the posted sends complete.  The losses the
 * last chunk reports are added to acc[0], their count to acc[1]. */
static int eval_batch_pipe(TrainRun *r, const IrModule *m, const FeedSpec *fs, const RtFeed *feeds, int nf, int64_t k,
                           int64_t s, int64_t n_local, int dp_coord, double *acc, char *err, size_t errlen) {
  int c = rt_program_rank(r->prog)->coord[IR_AXIS_PP];
  for (int i = 0; i < r->sched.nsteps[c]; i++) {
    const PipeStep *st = &r->sched.steps[c][i];
    if (st->kind != 'F') continue;
    int b = r->chunk_block[4 * st->chunk + 2];
    int64_t g = (int64_t)dp_coord * n_local + st->micro;
    char msg[1536];
    if (r->has_data[b] && load_micro(r, m, fs, k, g, err, errlen) != 0) return -1;
    RtRunInfo info = {s, (int)g, 0, 0};
    rt_outputs_clear(r->prog);
    if (rt_run_block(r->prog, b, feeds, nf, &info, msg, sizeof msg) != 0)
      return ts_errf(err, errlen, "evaluation batch %lld, micro batch %d, chunk %d: %s", (long long)k + 1, st->micro,
                     st->chunk, msg);
    double l;
    if (rt_output(r->prog, "loss", &l) == 0) acc[0] += l, acc[1] += 1;
  }
  return rt_pipe_end_step(r->prog, err, errlen);
}

/* The mean loss of the forward-only blocks (pass eval: "eval", or a
 * pipeline program's eval.<g>, eb unused) over global batches 0 .. iters-1
 * of src, all dp (and pp) ranks together (each runs its share of the
 * micro batches, as in a training step).  The blocks have no effect but
 * their outputs and messages, so parameters, gradients and optimizer
 * states stay as they are; RtRunInfo carries the training step only for
 * messages (the blocks have no dropout left to read it). */
static int pipe_sched_for(TrainRun *r, int64_t n, char *err, size_t errlen);

static int evaluate(TrainRun *r, const IrModule *m, const FeedSpec *fs, int eb, RtDataSrc *src, int64_t iters,
                    int64_t s, int64_t n_local, int64_t n_global, int dp_coord, double *loss, char *err,
                    size_t errlen) {
  if (r->have_sched && pipe_sched_for(r, n_local, err, errlen) != 0) return -1;   /* whole batches */
  RtFeed feeds[IR_FEED_COUNT + 1];
  int nf = micro_feeds(r, fs, feeds);
  RtDataSrc *train_src = r->src;
  r->src = src;
  r->loaded_step = r->loaded_micro = -1;   /* the feed buffers will hold evaluation batches */
  double acc[2] = {0, 0};   /* sum of the reported losses, how many reports */
  int rc = 0;
  for (int64_t k = 0; k < iters && rc == 0; k++) {
    if (r->have_sched) {
      rc = eval_batch_pipe(r, m, fs, feeds, nf, k, s, n_local, dp_coord, acc, err, errlen);
      continue;
    }
    for (int64_t j = 0; j < n_local && rc == 0; j++) {
      int64_t g = (int64_t)dp_coord * n_local + j;
      double l;
      RtRunInfo info = {s, (int)g, 0, 0};
      rt_outputs_clear(r->prog);
      if ((rc = load_micro(r, m, fs, k, g, err, errlen)) != 0) break;
      if ((rc = rt_run_block(r->prog, eb, feeds, nf, &info, err, errlen)) != 0) break;
      if ((rc = rt_output(r->prog, "loss", &l)) != 0) {
        snprintf(err, errlen, "block \"eval\" did not report `output \"loss\"`");
        break;
      }
      acc[0] += l, acc[1] += 1;
    }
  }
  r->src = train_src;
  r->loaded_step = r->loaded_micro = -1;
  if (rc != 0) return -1;
  if (r->have_sched && r->pp && rt_comm_all_reduce(r->pp, IR_F64, acc, 2, err, errlen) != 0) return -1;
  if (r->dp && rt_comm_all_reduce(r->dp, IR_F64, acc, 2, err, errlen) != 0) return -1;
  /* each micro batch's loss comes from exactly one block (the last chunk's
   * eval.<g> under pp): fewer or more reports would silently scale it */
  if (acc[1] != (double)(n_global * iters))
    return ts_errf(err, errlen, "the evaluation blocks reported `output \"loss\"` %.0f times for %lld micro batches",
                   acc[1], (long long)(n_global * iters));
  *loss = acc[0] / (double)(n_global * iters);
  return 0;
}

/* ---- pipeline programs ---- */

/* r->sched made for n micro batches per dp rank (a ramp-up's steps and
 * evaluation change the count; the schedule is regenerated when it does). */
static int pipe_sched_for(TrainRun *r, int64_t n, char *err, size_t errlen) {
  if (r->have_sched && r->sched_n == n) return 0;
  if (r->have_sched) plan_pipe_schedule_free(&r->sched);
  r->have_sched = 0;
  char why[1024];
  if (plan_pipe_schedule(r->sched_kind, r->sched_pp, r->sched_vpp, (int)n, &r->sched, why, sizeof why) != 0)
    return ts_errf(err, errlen, "pipeline schedule for pp=%d, vpp=%d, %lld micro batches per step: %s", r->sched_pp,
                   r->sched_vpp, (long long)n, why);
  r->have_sched = 1;
  r->sched_n = n;
  if (plan_pipe_check(&r->sched, why, sizeof why) != 0)
    return ts_errf(err, errlen, "the regenerated pipeline schedule is wrong (a bug): %s", why);  /* internal */
  return 0;
}

/* The schedule of a pipeline program, regenerated from its parallel line
 * (docs/pipeline.md) for n_local micro batches and checked, and the blocks
 * of its chunks.  0, or -1 with a message. */
static int pipe_setup(TrainRun *r, const IrModule *m, const RtRank *rank, int64_t n_local, int evaluating, char *err,
                      size_t errlen) {
  const IrParallel *par = &m->par;
  int pp = ir_axis_size(m, IR_AXIS_PP), vpp = par->vpp > 1 ? par->vpp : 1, c = rank->coord[IR_AXIS_PP];
  if (par->stage != c + 1)
    return ts_errf(err, errlen, "this is the program of pipeline stage %d (parallel stage=%d) but it runs on pp "
                   "coordinate %d (does the plan's rank_program match its mesh?)", par->stage - 1, par->stage, c);
  PipeSchedKind kind;
  if (plan_pipe_program_sched(par, &kind) != 0)
    /* the plan decoder refuses a schedule out of range */
    return ts_errf(err, errlen, "the program's pipeline schedule %d is not one this runtime knows",
                   par->sched);   /* internal */
  if (n_local > (1 << 20)) return ts_errf(err, errlen, "%lld micro batches per step is too many to schedule", (long long)n_local);  /* internal */
  char why[1024];
  r->sched_kind = kind, r->sched_pp = pp, r->sched_vpp = vpp;
  if (pipe_sched_for(r, n_local, err, errlen) != 0) return -1;
  if (ir_train_rampup(&m->train) && plan_pipe_ramp_check(&m->train, kind, pp, vpp, ir_axis_size(m, IR_AXIS_DP), why,
                                                          sizeof why) != 0)
    return ts_errf(err, errlen, "%s", why);
  int nchunks = pp * vpp;
  int split = plan_pipe_sched_splits_bwd(kind);
  r->chunk_block = ts_xmalloc((size_t)nchunks * 4 * sizeof *r->chunk_block);
  for (int g = 0; g < 4 * nchunks; g++) r->chunk_block[g] = -1;
  for (int g = c; g < nchunks; g += pp)
    for (int k = 0; k < 4; k++) {
      static const char *kname[4] = {"fwd", "bwd", "eval", "wgt"};
      char name[32];
      snprintf(name, sizeof name, "%s.%d", kname[k], g);
      r->chunk_block[4 * g + k] = ir_block_find(m, name);
      if (k == 3 && (r->chunk_block[4 * g + k] >= 0) != split)   /* a plan edited after compiling */
        return ts_errf(err, errlen, "the program of pipeline rank %d says --schedule %s, which %s, but it %s block %s",
                       c, plan_pipe_sched_name(kind), split ? "runs the weight gradients as W steps" :
                       "runs each backward whole", split ? "has no" : "has a", name);
      if (r->chunk_block[4 * g + k] >= 0 || k == 3) continue;
      if (k < 2)
        return ts_errf(err, errlen, "pipeline rank %d runs chunk %d (pp=%d x vpp=%d chunks) but its program has no "
                       "block %s", c, g, pp, vpp, name);
      if (evaluating)   /* only evaluation runs it */
        return ts_errf(err, errlen, "--eval-interval / --test: the program of pipeline rank %d has no forward-only "
                       "block %s (compiled by an mcc without pass eval? compile it again)", c, name);
    }
  /* blocks of chunks that are not ours would never run: a mismatched plan */
  for (int b = 0; b < m->blocks.n; b++) {
    int g = ir_block_chunk(&m->blocks.a[b], NULL);
    if (g >= 0 && (g >= nchunks || g % pp != c))
      return ts_errf(err, errlen, "the program of pipeline rank %d has block %s, but chunk %d %s", c,
                     m->blocks.a[b].name, g, g >= nchunks ? "does not exist" : "runs on another rank");
  }
  return 0;
}

/* TS_PIPE_TRACE=PATH (tests): after the first step, the pipeline rank c
 * of the mesh's first dp/cp/ep/tp coordinates writes the steps it ran, in
 * order, one "F|B|W micro chunk" line each, to PATH.<c> (atomically).  The
 * tests rebuild the schedule from what ran and measure its bubble. */
static int trace_steps(const TrainRun *r, int c, char *err, size_t errlen) {
  const char *path = getenv("TS_PIPE_TRACE");
  const RtRank *rk = rt_program_rank(r->prog);
  if (!path || !*path) return 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (a != IR_AXIS_PP && rk->coord[a] != 0) return 0;
  StrBuf b = {0};
  for (int i = 0; i < r->sched.nsteps[c]; i++) {
    const PipeStep *st = &r->sched.steps[c][i];
    sb_printf(&b, "%c %d %d\n", st->kind, st->micro, st->chunk);
  }
  char file[4096];
  snprintf(file, sizeof file, "%s.%d", path, c);
  int rc = ts_write_file(file, b.p ? b.p : "", b.n);
  sb_free(&b);
  return rc != 0 ? ts_errf(err, errlen, "TS_PIPE_TRACE: %s", ts_io_error()) : 0;
}

/* The step's metrics of a pipeline program: each stage reports its own
 * layers' metric() outputs, so after the dp sum every pipeline rank's
 * list is gathered (names as f64 characters, '\n', then the value) and
 * merged in pp coordinate order, the same on every rank. */
static int pipe_metrics(TrainRun *r, char *err, size_t errlen) {
  if (r->dp && r->nx && rt_comm_all_reduce(r->dp, IR_F64, r->xval, r->nx, err, errlen) != 0) return -1;
  if (!r->pp) return 0;
  int P = rt_comm_size(r->pp);
  int64_t len = 0;
  for (int i = 0; i < r->nx; i++) len += (int64_t)strlen(r->xname[i]) + 2;
  double *mine = ts_xcalloc((size_t)len + 1, sizeof *mine), *lens = ts_xcalloc((size_t)P, sizeof *lens);
  int64_t at = 0;
  for (int i = 0; i < r->nx; i++) {
    for (const char *c = r->xname[i]; *c; c++) mine[at++] = (unsigned char)*c;
    mine[at++] = '\n';
    mine[at++] = r->xval[i];
  }
  double len1 = (double)len;
  int rc = rt_comm_all_gather(r->pp, IR_F64, &len1, lens, 1, err, errlen);
  int64_t maxlen = 1;
  for (int q = 0; q < P; q++) if ((int64_t)lens[q] > maxlen) maxlen = (int64_t)lens[q];
  double *pad = ts_xcalloc((size_t)maxlen, sizeof *pad), *all = ts_xcalloc((size_t)(maxlen * P), sizeof *all);
  memcpy(pad, mine, (size_t)len * sizeof *pad);
  if (rc == 0) rc = rt_comm_all_gather(r->pp, IR_F64, pad, all, (size_t)maxlen, err, errlen);
  if (rc == 0) {
    r->nx = 0;
    char name[256];
    for (int q = 0; q < P; q++) {
      const double *l = all + (int64_t)q * maxlen;
      for (int64_t i = 0, n = (int64_t)lens[q]; i < n;) {
        int k = 0;
        while (i < n && l[i] != '\n') { if (k < (int)sizeof name - 1) name[k++] = (char)l[i]; i++; }
        name[k] = 0;
        double v = i + 1 < n ? l[i + 1] : 0;
        i += 2;
        const char *nm = ts_intern(name);
        int j = 0;
        while (j < r->nx && r->xname[j] != nm) j++;
        if (j == r->nx) {
          if (r->nx == RT_MAX_METRICS) continue;
          r->xname[r->nx] = nm, r->xval[r->nx++] = 0;
        }
        r->xval[j] += v;
      }
    }
  }
  free(mine);
  free(lens);
  free(pad);
  free(all);
  return rc;
}

/* One step of a pipeline program: its rank's schedule, then the update.
 * Writes the step's loss (over all pp and dp ranks) and grad norm. */
static int train_step_pipe(TrainRun *r, const IrModule *m, const FeedSpec *fs, int ub, int64_t s, int64_t n_local,
                           int64_t n_global, int dp_coord, double lr, double *loss, double *gnorm, char *err,
                           size_t errlen) {
  RtFeed feeds[IR_FEED_COUNT + 1];
  int nf = micro_feeds(r, fs, feeds);
  int c = rt_program_rank(r->prog)->coord[IR_AXIS_PP];
  double acc[2] = {0, 0};   /* sum of the reported losses, how many reports */
  r->nx = 0;
  for (int i = 0; i < r->sched.nsteps[c]; i++) {
    const PipeStep *st = &r->sched.steps[c][i];
    int bwd = st->kind != 'F', b = r->chunk_block[4 * st->chunk + (st->kind == 'W' ? 3 : bwd)];
    int64_t g = (int64_t)dp_coord * n_local + st->micro;   /* the global micro batch */
    char msg[1536];
    if (r->has_data[b] && load_micro(r, m, fs, s, g, err, errlen) != 0) return -1;
    RtRunInfo info = {s, (int)g, lr, bwd && st->micro == n_local - 1};   /* last: issues its chunk's dp reductions */
    rt_outputs_clear(r->prog);
    if (rt_run_block(r->prog, b, feeds, nf, &info, msg, sizeof msg) != 0)
      return ts_errf(err, errlen, "pipeline step %d (%c of micro batch %d, chunk %d): %s", i + 1, st->kind,
                     st->micro, st->chunk, msg);
    double l;
    if (!bwd && rt_output(r->prog, "loss", &l) == 0) acc[0] += l, acc[1] += 1;
    if (!bwd) add_metrics(r);
    if (i == 0) maybe_fail(r, s);
  }
  /* the sends first: on GPU ranks the last ones are still queued for
   * NCCL (posted with a receive, and there is none left), and a peer may
   * be waiting for them in its last block while we would wait in the
   * metrics' collective */
  if (rt_pipe_end_step(r->prog, err, errlen) != 0) return -1;
  if (pipe_metrics(r, err, errlen) != 0) return -1;
  if (s == 0 && trace_steps(r, c, err, errlen) != 0) return -1;
  if (r->pp && rt_comm_all_reduce(r->pp, IR_F64, acc, 2, err, errlen) != 0) return -1;
  if (r->dp && rt_comm_all_reduce(r->dp, IR_F64, acc, 2, err, errlen) != 0) return -1;
  /* each micro batch's loss comes from exactly one forward block: fewer
   * or more reports would silently scale the loss */
  if (acc[1] != (double)n_global)
    return ts_errf(err, errlen, "the forward blocks reported `output \"loss\"` %.0f times for %lld micro batches "
                   "(the last chunk's forward should report it once per micro batch)", acc[1], (long long)n_global);
  if (inf_at(r->inf_steps, s + 1) && inject_inf(r, m, s, err, errlen) != 0) return -1;
  *loss = acc[0] / (double)n_global;
  return run_update(r, m, ub, s, lr, gnorm, err, errlen);
}

/* Opens what the run reads.  Indexed datasets: world rank 0 first (it
 * builds and caches the sample indices), then the others (they load its
 * cache files), so N ranks do not build the same indices N times; every
 * rank takes part in both barriers, whether it reads data or not (a middle
 * pipeline stage).  A rank that fails ends the job (mrun aborts it). */
static int open_data(TrainRun *r, const RtTrainOpts *o, const FeedSpec *fs, int64_t nmicro, int lead, FILE *log,
                     char *err, size_t errlen) {
  int staged = o->world && o->gpt.n > 0;
  const IrTrain *tr = r->train;
  int64_t per_step = nmicro * fs->rows;   /* of a whole global batch; a ramp-up's steps take fewer */
  int64_t total = r->prog ? rt_samples_before(r->prog, tr->steps) / tr->micro_batch * fs->rows : 0;
  if (staged && !lead && rt_comm_barrier(o->world, err, errlen) != 0) return -1;
  int rc = 0;
  FILE *note = lead && !o->quiet ? log : NULL;
  int64_t ev = o->eval_iters * per_step;   /* the samples of one evaluation */
  if (!fs->none)
    rc = rt_data_open(&r->data, o, r->prog, fs->T, per_step, total, note, err, errlen);
  if (rc == 0 && !fs->none && o->eval_interval > 0 && o->eval_iters > 0)
    rc = rt_data_open_part(&r->vdata, o, r->prog, RT_SPLIT_VALID, fs->T, per_step, ev, note, err, errlen);
  if (rc == 0 && !fs->none && o->eval_test && o->eval_iters > 0)
    rc = rt_data_open_part(&r->tdata, o, r->prog, RT_SPLIT_TEST, fs->T, per_step, ev, note, err, errlen);
  if (rc == 0 && staged && lead && rt_comm_barrier(o->world, err, errlen) != 0) return -1;
  return rc;
}

/* Whether some block of m reports the loss (a pipeline: only the last stage's). */
static int makes_loss(const IrModule *m) {
  for (int b = 0; b < m->blocks.n; b++)
    for (int i = 0; i < m->blocks.a[b].n; i++) {
      const IrNode *n = &m->blocks.a[b].nodes[i];
      if (n->op == IR_OP_OUTPUT && n->sa && strcmp(n->sa, "loss") == 0) return 1;
    }
  return 0;
}

int rt_train(const IrModule *m, const RtTrainOpts *o, RtTrainResult *res, char *err, size_t errlen) {
  RtTrainOpts dflt = {0};
  if (!o) o = &dflt;
  FILE *log = o->log ? o->log : stdout;
  RtTrainResult rs = {.first_loss = NAN, .last_loss = NAN, .last_grad_norm = NAN, .val_loss = NAN, .test_loss = NAN};
  /* a pipeline stage's program has fwd.<g> / bwd.<g> blocks instead of micro */
  int piped = ir_axis_size(m, IR_AXIS_PP) > 1;
  int mb = ir_block_find(m, "micro"), ub = ir_block_find(m, "update");
  if ((!piped && mb < 0) || ub < 0) {
    snprintf(err, errlen, "the program has no block \"%s\" (was it compiled with autodiff and the optimizer?)",
             !piped && mb < 0 ? "micro" : "update");
    return -1;
  }
  if (piped && m->par.stage < 1) {
    snprintf(err, errlen, "the module is the whole pipelined model (parallel pp=%d stage=0); mrun runs the "
             "per-rank programs of a plan (mcc --pp writes them)", ir_axis_size(m, IR_AXIS_PP));
    return -1;
  }
  /* evaluation runs pass eval's forward-only block */
  int eb = ir_block_find(m, "eval"), evaluating = (o->eval_interval > 0 || o->eval_test) && o->eval_iters > 0;
  if (evaluating && !piped && eb < 0)   /* a pipeline program's eval.<g>: pipe_setup */
    return ts_errf(err, errlen, "--eval-interval / --test: the program has no forward-only block \"eval\" "
                   "(compiled by an mcc without pass eval? compile it again)");
  if (o->eval_interval < 0 || o->eval_iters < 0)
    return ts_errf(err, errlen, "--eval-interval and --eval-iters must be >= 0");  /* internal */
  const IrTrain *tr = &m->train;
  if (tr->micro_batch <= 0 || tr->global_batch <= 0 || tr->global_batch % tr->micro_batch != 0) {
    snprintf(err, errlen, "global_batch %lld is not a positive multiple of micro_batch %lld",
             (long long)tr->global_batch, (long long)tr->micro_batch);
    return -1;
  }
  int64_t nmicro = tr->global_batch / tr->micro_batch;
  RtRank single = rt_rank_single();
  const RtRank *rank = o->rank ? o->rank : &single;
  int dp = rt_rank_axis_size(rank, IR_AXIS_DP);
  if (nmicro % dp != 0) {
    snprintf(err, errlen, "global_batch %lld is not a multiple of micro_batch %lld x dp %d "
             "(each dp rank runs whole micro batches)",
             (long long)tr->global_batch, (long long)tr->micro_batch, dp);
    return -1;
  }
  int64_t n_local = nmicro / dp;   /* of a whole global batch (a ramp-up's steps: step_local_micros) */
  if (ir_train_rampup(tr)) {
    char why[768];
    if (ir_train_rampup_check(tr, tr->micro_batch * dp, why, sizeof why) != 0)
      return ts_errf(err, errlen, "%s; here dp = %d", why, dp);
  }
  TrainRun r = {0};
  r.train = tr;
  r.dp_coord = rank->coord[IR_AXIS_DP];
  r.ndp = dp;
  r.world_rank = o->world ? rt_comm_world_rank(o->world) : 0;
  r.dp = dp > 1 ? rank->group[IR_AXIS_DP] : NULL;
  if (dp > 1 && !r.dp) {
    snprintf(err, errlen, "dp=%d but this rank has no dp group", dp);
    return -1;
  }
  int pp = rt_rank_axis_size(rank, IR_AXIS_PP);
  r.pp = pp > 1 ? rank->group[IR_AXIS_PP] : NULL;
  if (pp > 1 && !r.pp) {
    snprintf(err, errlen, "pp=%d but this rank has no pp group", pp);
    return -1;
  }
  r.loaded_step = r.loaded_micro = -1;
  r.src = &r.data;
  r.sb = ir_block_find(m, "scaler");
  r.kb = ir_block_find(m, "skip");
  if ((r.sb >= 0) != (r.kb >= 0)) {
    snprintf(err, errlen, "the program has block \"%s\" without \"%s\" (loss scaling needs both)",
             r.sb >= 0 ? "scaler" : "skip", r.sb >= 0 ? "skip" : "scaler");
    run_free(&r);
    return -1;
  }
  r.inf_steps = inf_steps(r.world_rank);
  r.kill_step = fault_step("KILL", r.world_rank);
  r.stall_step = fault_step("STALL", r.world_rank);
  const char *delay = getenv("TS_FAULT_STEP_DELAY_MS");
  r.step_delay_ms = delay && atoi(delay) > 0 && atoi(delay) <= 60000 ? atoi(delay) : 0;
  int lead = r.world_rank == 0;   /* prints and writes metrics */
  if (!(r.prog = rt_program_new_rank(m, rank, err, errlen))) return -1;
  int64_t start = 0;
  if (o->ckpt.load_dir) {
    char how[256];
    if (rt_ckpt_load(r.prog, o->world, o->ckpt.load_dir, &start, how, sizeof how, err, errlen) != 0) { run_free(&r); return -1; }
    if (start >= tr->steps && !o->generate) {
      snprintf(err, errlen, "the checkpoint in %s is of step %lld, and training ends at step %lld: nothing to do "
               "(give --steps above %lld)", o->ckpt.load_dir, (long long)start, (long long)tr->steps, (long long)start);
      run_free(&r);
      return -1;
    }
    rs.resumed_from = rs.steps = start;
    r.first_step = start;
    if (lead && !o->quiet)
      fprintf(log, "%s the checkpoint of step %lld in %s%s%s\n", o->generate ? "weights from" : "resumed from",
              (long long)start, o->ckpt.load_dir, how[0] ? ", " : "", how);
  }
  if (o->init_from && !o->ckpt.load_dir) {   /* (mrun refuses both: a resume has its own weights) */
    char how[1024];
    if (rt_hf_init_from(r.prog, o->world, &o->hf, o->init_from, how, sizeof how, err, errlen) != 0) { run_free(&r); return -1; }
    if (lead && !o->quiet) fprintf(log, "initialized from %s: %s\n", o->init_from, how);
  }
  if (o->generate) {   /* the weights are in place: text instead of training */
    int rc = rt_generate(r.prog, o->world, o->generate, log, err, errlen);
    run_free(&r);
    if (res) *res = rs;
    return rc;
  }
  if (o->export_dir) {   /* before the run, not after it */
    struct stat sst;
    if (stat(o->export_dir, &sst) == 0 && !S_ISDIR(sst.st_mode)) {
      snprintf(err, errlen, "--export: '%s' exists and is not a directory", o->export_dir);
      run_free(&r);
      return -1;
    }
  }
  if (o->ckpt.save_dir) {   /* before the run, not after its first interval */
    struct stat sst;
    if (stat(o->ckpt.save_dir, &sst) == 0 && !S_ISDIR(sst.st_mode)) {
      snprintf(err, errlen, "--save: '%s' exists and is not a directory", o->ckpt.save_dir);
      run_free(&r);
      return -1;
    }
  }
  if (piped && pipe_setup(&r, m, rank, n_local, evaluating, err, errlen) != 0) { run_free(&r); return -1; }
  /* the blocks fed with micro batches: micro, or every pipeline block */
  int *fb = ts_xmalloc((size_t)m->blocks.n * sizeof *fb), nfb = 0;
  r.has_data = ts_xcalloc((size_t)m->blocks.n, 1);
  for (int b = 0; b < m->blocks.n; b++) {
    if (piped ? ir_block_chunk(&m->blocks.a[b], NULL) < 0 : b != mb) continue;
    fb[nfb++] = b;
    for (int i = 0; i < m->blocks.a[b].n; i++) r.has_data[b] |= m->blocks.a[b].nodes[i].op == IR_OP_INPUT;
  }
  FeedSpec fs;
  int frc = feed_spec(r.prog, m, fb, nfb, !piped, &fs, err, errlen);
  free(fb);
  /* an edited plan: mcc writes the weight input exactly when the train line ramps */
  if (frc == 0 && !fs.none && fs.has_weight && !ir_train_rampup(tr))
    frc = ts_errf(err, errlen, "the program feeds the loss gradient a micro-batch weight (a ramp-up plan), but its "
                  "train line has no rampup_start: the plan was edited after compiling; compile it again");  /* internal */
  if (frc == 0 && !fs.none && !fs.has_weight && ir_train_rampup(tr) && makes_loss(m))
    frc = ts_errf(err, errlen, "the train line asks for a batch-size ramp-up (rampup_start=%lld), but the program was "
                  "compiled for a constant global batch (no micro_weight input): compile it with mcc "
                  "--rampup-batch-size", (long long)tr->rampup_start);  /* internal */
  if (frc != 0) { run_free(&r); return -1; }
  /* every packed-sequence flag needs its input in some program of the plan
   * (o->hf lists them; a caller without a plan: this module) */
  const IrModule *self[1] = {m};
  r.pack = &o->gpt;
  if (rt_packed_check(&o->gpt, o->hf.nprograms ? o->hf.programs : self, o->hf.nprograms ? o->hf.nprograms : 1, err,
                      errlen) != 0) { run_free(&r); return -1; }
  if (fs.has_targets && lead && !o->gpt.n && !o->gpt.mock) warn_vocab(m);

  if (open_data(&r, o, &fs, nmicro, lead, log, err, errlen) != 0) { run_free(&r); return -1; }
  if (lead && o->metrics_path && !(r.metrics = ts_open_log(o->metrics_path))) {
    snprintf(err, errlen, "--metrics: %s", ts_io_error());
    run_free(&r);
    return -1;
  }
  r.metrics_path = o->metrics_path;
  if (lead && o->save_params_path && ts_check_output(o->save_params_path) != 0) {   /* before the run, not after */
    snprintf(err, errlen, "--save-params: %s", ts_io_error());
    run_free(&r);
    return -1;
  }
  int64_t ntok = fs.rows * fs.T, nloc = ir_type_numel(&fs.tok_t);   /* global / local per micro */
  if (fs.none) ntok = tr->micro_batch * tr->seq_len, nloc = 0;        /* tokens/s of a middle stage */
  r.tokens = ts_xcalloc((size_t)(nloc ? nloc : 1), sizeof *r.tokens);
  r.targets = ts_xcalloc((size_t)(nloc ? nloc : 1), sizeof *r.targets);
  if (fs.split) {
    r.gtok = ts_xcalloc((size_t)ntok, sizeof *r.gtok);
    r.gtgt = ts_xcalloc((size_t)ntok, sizeof *r.gtgt);
  }
  /* the packed-sequence inputs: made per micro batch (load_micro_data) */
  if (fs.has_pos || fs.has_doc || fs.has_mask) {
    r.gpos = ts_xcalloc((size_t)ntok, sizeof *r.gpos);
    r.gdoc = ts_xcalloc((size_t)ntok, sizeof *r.gdoc);
    r.gmask = ts_xcalloc((size_t)ntok, sizeof *r.gmask);
  }
  if (fs.has_pos) r.pos = ts_xcalloc((size_t)ir_type_numel(&fs.pos_t), sizeof *r.pos);
  if (fs.has_doc) r.doc = ts_xcalloc((size_t)ir_type_numel(&fs.doc_t), sizeof *r.doc);
  if (fs.has_mask) {
    r.mask = ts_xcalloc((size_t)ir_type_numel(&fs.mask_t), ir_dtype_size(fs.mask_t.dtype));
    r.lmask = ts_xcalloc((size_t)ir_type_numel(&fs.mask_t), sizeof *r.lmask);
  }

  /* the prefetch thread makes the rank's tokens and targets; packed
   * inputs of split tokens are made from the global ones (load_micro_data),
   * so the thread delivers those rows too */
  if (!fs.none && !o->no_prefetch && start < tr->steps) {
    r.pf_fs = &fs;
    r.pf_global = fs.split && (fs.has_pos || fs.has_doc || fs.has_mask);
    if (fs.split) {
      r.pf_gtok = ts_xcalloc((size_t)ntok, sizeof *r.pf_gtok);
      r.pf_gtgt = ts_xcalloc((size_t)ntok, sizeof *r.pf_gtgt);
    }
    if (!(r.pf = rt_prefetch_start(pf_fill, &r, start, tr->steps, n_local, (size_t)nloc,
                                   r.pf_global ? (size_t)ntok : 0, err, errlen))) {
      run_free(&r);
      return -1;
    }
  }
  /* Megatron's model FLOPs of a step (3 x the forward's GEMMs and attention
   * over the full score matrix): every rank's share of its micro batches,
   * summed over the world (plan/flops.h: what mcc --report time counts) */
  double step_flops = 3 * plan_forward_model_flops(m) * (double)n_local;
  int nranks = o->world ? rt_comm_size(o->world) : 1;
  if (o->world && rt_comm_all_reduce(o->world, IR_F64, &step_flops, 1, err, errlen) != 0) { run_free(&r); return -1; }
  /* --trace: the ranks agree on the instant the trace counts from */
  VEC(double) step_t = {0};
  double trace_base = 0;
  if (o->trace_path) {
    if (o->world && rt_comm_barrier(o->world, err, errlen) != 0) { run_free(&r); return -1; }
    trace_base = ts_now_s();
    rt_program_trace_start(r.prog, trace_base);
  }
  double t0 = ts_now_s();
  int rc = 0;
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESTART;   /* a collective under way finishes its step */
  sigemptyset(&sa.sa_mask);
  stop_sig = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  int64_t saved_at = start;   /* the step whose checkpoint exists (nothing new to save there) */
  RtCkptWriter *writer = o->ckpt.save_dir && o->ckpt.async ? rt_ckpt_writer_new() : NULL;
  for (int64_t s = start; s < tr->steps; s++) {
    double ts = ts_now_s(), lr = rt_lr_at(tr, s, rt_samples_before(r.prog, s)), loss = NAN, gn = NAN;
    r.ls_lr = lr;   /* the lr applied (loss scaling: of the steps applied so far; NaN: skipped) */
    status_write(r.world_rank, "step", s + 1);
    int64_t smicro = step_micros(&r, s), slocal = smicro / dp;   /* this step's (a ramp-up's batch) */
    if (fs.weight_t == IR_F64) r.weight.d = 1.0 / (double)smicro;
    else r.weight.f = (float)(1.0 / (double)smicro);
    int bad = piped && pipe_sched_for(&r, slocal, err, errlen) != 0;
    if (!bad)
      bad = piped ? train_step_pipe(&r, m, &fs, ub, s, slocal, smicro, rank->coord[IR_AXIS_DP], lr, &loss, &gn, err,
                                    errlen)
                  : train_step(&r, m, &fs, mb, ub, s, slocal, smicro, rank->coord[IR_AXIS_DP], lr, &loss, &gn, err,
                               errlen);
    rt_prefetch_release(r.pf, s);   /* its slot takes step s + 2 */
    if (o->trace_path) {
      VEC_PUSH(step_t, ts - trace_base);
      VEC_PUSH(step_t, ts_now_s() - trace_base);
    }
    if (bad) {
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
    double t1 = ts_now_s(), tps = (double)(ntok * smicro) / (t1 - ts > 1e-9 ? t1 - ts : 1e-9);
    double vloss = NAN;   /* this step's validation loss (NaN: none) */
    if (evaluating && o->eval_interval > 0 && (s + 1) % o->eval_interval == 0) {
      if (evaluate(&r, m, &fs, eb, &r.vdata, o->eval_iters, s, n_local, nmicro, rank->coord[IR_AXIS_DP], &vloss,
                   err, errlen) != 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "step %lld: validation: %s", (long long)s + 1, err);
        snprintf(err, errlen, "%s", msg);
        rc = -1;
        break;
      }
      rs.evals++;
      rs.val_loss = vloss;
    }
    double tflops = step_flops * (double)smicro / (double)nmicro / (t1 - ts > 1e-9 ? t1 - ts : 1e-9) / nranks / 1e12;   /* per rank */
    double mfu = o->peak_flops > 0 ? tflops * 1e12 / o->peak_flops : NAN;
    if (!o->quiet && lead) {
      fprintf(log, "step %4lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.3g TFLOP/s/rank",
              (long long)s + 1, (long long)tr->steps, loss, r.ls_lr, gn, tps, tflops);
      if (ir_train_rampup(tr)) fprintf(log, " | batch %lld", (long long)(smicro * tr->micro_batch));
      if (r.sb >= 0)
        fprintf(log, " | loss scale %g%s | skipped %.0f", r.ls_scale, r.ls_skipped ? " | SKIPPED (inf/nan grads)" : "",
                r.ls_skips);
      if (!isnan(mfu)) fprintf(log, " | MFU %.1f%%", 100 * mfu);
      fprintf(log, " | %.1f s", t1 - t0);
      print_metrics(log, &r);
      if (!isnan(vloss)) fprintf(log, " | val_loss %.4f | val_ppl %.3f", vloss, exp(vloss));
      fprintf(log, "\n");
      fflush(log);
    }
    if (r.metrics) {
      fprintf(r.metrics, "{\"step\": %lld, ", (long long)s + 1);
      json_num(r.metrics, "loss", loss, 1);
      json_num(r.metrics, "lr", r.ls_lr, 1);
      json_num(r.metrics, "grad_norm", gn, 1);
      if (ir_train_rampup(tr)) {   /* the step's global batch and the samples consumed after it */
        fprintf(r.metrics, "\"global_batch\": %lld, \"consumed_samples\": %lld, ", (long long)(smicro * tr->micro_batch),
                (long long)rt_samples_before(r.prog, s + 1));
      }
      if (r.sb >= 0) {
        json_num(r.metrics, "loss_scale", r.ls_scale, 1);
        json_num(r.metrics, "skipped", r.ls_skipped, 1);
        json_num(r.metrics, "skipped_steps", r.ls_skips, 1);
      }
      json_num(r.metrics, "tokens_per_s", tps, 1);
      json_num(r.metrics, "tflops_per_rank", tflops, 1);
      if (!isnan(mfu)) json_num(r.metrics, "mfu", mfu, 1);
      for (int i = 0; i < r.nx; i++) json_num(r.metrics, r.xname[i], r.xval[i], 1);
      if (!isnan(vloss)) {
        json_num(r.metrics, "val_loss", vloss, 1);
        json_num(r.metrics, "val_ppl", exp(vloss), 1);
      }
      json_num(r.metrics, "elapsed_s", t1 - t0, 0);
      fprintf(r.metrics, "}\n");
      if (ts_log_flush(r.metrics, r.metrics_path) != 0) {   /* training goes on; the run fails at its end */
        snprintf(r.metrics_err, sizeof r.metrics_err, "--metrics: %s (from step %lld on)", ts_io_error(), (long long)s + 1);
        fprintf(stderr, "mrun: error: %s; training goes on, and mrun will exit with status 1\n", r.metrics_err);
        if (r.metrics != stdout) fclose(r.metrics);
        r.metrics = NULL;
      }
    }
    if (s == start) rs.first_loss = loss;
    rs.last_loss = loss;
    rs.last_grad_norm = gn;
    rs.steps = s + 1;
    /* a stop request on any rank stops every rank after this same step;
     * an asynchronous save whose files every rank has written is completed
     * here, at the first step boundary after (not at the next save) */
    double flags[2] = {stop_sig, writer && rt_ckpt_writer_busy(writer)};
    if (o->world && rt_comm_all_reduce_max(o->world, IR_F64, flags, writer ? 2 : 1, err, errlen) != 0) { rc = -1; break; }
    if (writer && rt_ckpt_writer_pending(writer) && flags[1] == 0) {
      double w0 = ts_now_s();
      if (rt_ckpt_finish(writer, o->world, &o->ckpt, err, errlen) != 0) { rc = -1; break; }
      rs.save_stall_s += ts_now_s() - w0;
    }
    double stop = flags[0];
    if (stop > 0) {
      rs.stopped_by = (int)stop;
      break;
    }
    if (o->ckpt.save_dir && o->ckpt.save_interval > 0 && (s + 1) % o->ckpt.save_interval == 0) {
      double w0 = ts_now_s(), copy_s = 0;
      if (writer ? rt_ckpt_save_async(writer, r.prog, o->world, &o->ckpt, s + 1, &copy_s, err, errlen) != 0
                 : rt_ckpt_save(r.prog, o->world, &o->ckpt, s + 1, err, errlen) != 0) { rc = -1; break; }
      rs.save_stall_s += ts_now_s() - w0;
      rs.save_copy_s += copy_s;
      rs.timed_saves++;
      saved_at = s + 1;
      rs.saved++;
    }
  }
  /* --test: once, after the last step (not after a stop) */
  if (rc == 0 && !rs.stopped_by && evaluating && o->eval_test) {
    double tl;
    if (evaluate(&r, m, &fs, eb, &r.tdata, o->eval_iters, rs.steps > 0 ? rs.steps - 1 : 0, n_local, nmicro,
                 rank->coord[IR_AXIS_DP], &tl, err, errlen) != 0) {
      char msg[1024];
      snprintf(msg, sizeof msg, "test: %s", err);
      snprintf(err, errlen, "%s", msg);
      rc = -1;
    } else {
      rs.test_loss = tl;
      if (!o->quiet && lead) {
        fprintf(log, "test at step %lld | test_loss %.4f | test_ppl %.3f\n", (long long)rs.steps, tl, exp(tl));
        fflush(log);
      }
      if (r.metrics) {
        fprintf(r.metrics, "{\"step\": %lld, ", (long long)rs.steps);
        json_num(r.metrics, "test_loss", tl, 1);
        json_num(r.metrics, "test_ppl", exp(tl), 0);
        fprintf(r.metrics, "}\n");
        if (ts_log_flush(r.metrics, r.metrics_path) != 0 && !r.metrics_err[0])
          snprintf(r.metrics_err, sizeof r.metrics_err, "--metrics: %s", ts_io_error());
      }
    }
  }
  /* the save under way completes; then the last step done is saved (also
   * when a signal stopped the run) */
  if (rc == 0 && writer && rt_ckpt_finish(writer, o->world, &o->ckpt, err, errlen) != 0) rc = -1;
  rt_ckpt_writer_free(writer);
  if (rc == 0 && o->ckpt.save_dir && rs.steps > saved_at) {
    if (rt_ckpt_save(r.prog, o->world, &o->ckpt, rs.steps, err, errlen) != 0) rc = -1;
    else rs.saved++;
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  status_write(r.world_rank, rc ? "error" : rs.stopped_by ? "stopped" : "done", rs.steps);
  if (rc == 0 && o->save_params_path &&   /* also when stopped: the steps done are kept */
      rt_params_save(r.prog, o->world, o->save_params_path, err, errlen) != 0)
    rc = -1;
  if (rc == 0 && o->export_dir) {
    char how[1024];
    if (rt_hf_export(r.prog, o->world, &o->hf, o->export_dir, how, sizeof how, err, errlen) != 0) rc = -1;
    else if (lead && !o->quiet) fprintf(log, "exported to %s: %s\n", o->export_dir, how);
  }
  if (rc == 0 && o->trace_path &&
      rt_trace_write(r.prog, o->world, o->trace_path, step_t.a, step_t.n / 2, start, err, errlen) != 0)
    rc = -1;
  free(step_t.a);
  RtExecStats es;
  rt_program_exec_stats(r.prog, &es);
  rs.dev_collectives = es.dev_collectives;
  rs.dev_overlapped = es.dev_overlapped;
  rs.accum_direct = es.accum_direct;
  rs.dp_buckets = es.dp_buckets;
  rs.dp_grads = es.dp_grads;
  rs.dp_blocking = es.dp_blocking;
  rs.dp_wait_s = es.dp_wait_s;
  rs.dp_post_s = es.dp_post_s;
  rs.dp_poll_s = es.dp_poll_s;
  rs.dp_blocking_s = es.dp_blocking_s;
  rs.dp_dev_overlapped = es.dp_dev_overlapped;
  rs.graphs = es.graphs;
  rs.graph_launches = es.graph_launches;
  run_free(&r);
  if (rc == 0 && r.metrics_err[0]) rc = ts_errf(err, errlen, "%s", r.metrics_err);
  if (res) *res = rs;
  return rc;
}
