/* train.h - the trainer behind `mrun`: the data pipeline (data.c: the
 * byte-level corpus, Megatron's indexed datasets, mock data), the training
 * loop over a module's "micro" and "update" blocks (train.c) and the GPU
 * driver probe (gpu_probe.c).
 *
 * Data convention: a model's inputs are fed by name (ir.h's list of
 * feeds) -- "tokens" and "targets" (i32, same shape [..., T]: row r holds
 * a window of T tokens and the same window shifted by one; RtDataSrc
 * below) and optionally "loss_mask", "position_ids" and "document_ids",
 * made from the tokens (rt_packed_inputs).  Any other input is refused at
 * start-up (and by mcc, for a model with a train block). */
#ifndef TS_TRAIN_H
#define TS_TRAIN_H
#include "rt.h"
#include "hf.h"
#include "runtime/data/gptdata.h"

/* ---- data: token = byte, vocabulary 256 ---- */
#define RT_BYTE_VOCAB 256
typedef struct { const unsigned char *bytes; size_t len; } RtCorpus;

/* Maps the file read-only (a regular, non-empty file: windows are drawn
 * at random offsets, so a pipe or device is refused); its pages load as
 * windows touch them.  0, or -1 with a message. */
int rt_corpus_open(RtCorpus *c, const char *path, char *err, size_t errlen);
void rt_corpus_free(RtCorpus *c);
/* The corpus mrun uses without --data: samples/data/kjv.txt relative to
 * the working directory if it exists there, else under ts_data_root() (an
 * installed tree's share/tessera, or the source tree). */
const char *rt_corpus_default_path(void);
/* Fills rows x T tokens and targets: row r (global row index row0 + r)
 * at step `step` reads the window at offset
 *   H(3, seed, step, row0 + r) mod (len - T - 1)          (H: rng.c)
 * tokens = bytes[off, off + T), targets = bytes[off + 1, off + T + 1).
 * -1 with a message if the corpus is shorter than T + 2 bytes. */
int rt_corpus_batch(const RtCorpus *c, uint64_t seed, int64_t step, int64_t row0,
                    int64_t rows, int64_t T, int32_t *tokens, int32_t *targets,
                    char *err, size_t errlen);

/* ---- Megatron's data (--data-path, --mock-data; runtime/data/gptdata.h) ---- */
typedef struct {
  int n;                        /* --data-path datasets (0: none) */
  const char *const *prefix;    /* PREFIX of PREFIX.bin / PREFIX.idx */
  const double *weight;         /* NULL: weighted by their sizes */
  const char *split;            /* --split; NULL: 969,30,1 */
  const char *cache_dir;        /* --data-cache-path; NULL: a "cache" folder beside the first dataset */
  int mock;                     /* --mock-data */
  /* Megatron's packed-sequence flags (packed.c), for every data source */
  int reset_position_ids;       /* --reset-position-ids: positions restart after each EOD */
  int reset_attention_mask;     /* --reset-attention-mask: document_ids count the EODs before each token */
  int eod_mask_loss;            /* --eod-mask-loss: loss_mask 0 where the token is the EOD */
  int has_eod;                  /* eod below is set (--eod-id, or --tokenizer's end-of-document token) */
  int32_t eod;
} RtGptOpts;

/* ---- packed sequences (packed.c; docs/data.md "Packed sequences") ----
 * The inputs Megatron's get_ltor_masks_and_position_ids makes from a
 * micro batch's tokens [rows, T] (row-major), each [rows, T]:
 *   pos[r][t]  = t, or with reset_position_ids t minus the index after the
 *                last EOD before t in row r (a document's positions from 0)
 *   doc[r][t]  = 0, or with reset_attention_mask the number of EODs in
 *                row r before t (the EOD belongs to the document it ends)
 *   mask[r][t] = 1, or with eod_mask_loss 0 where tokens[r][t] is the EOD
 * Any of pos / doc / mask may be NULL. */
void rt_packed_inputs(const RtGptOpts *g, const int32_t *tokens, int64_t rows, int64_t T, int32_t *pos,
                      int32_t *doc, int32_t *mask);
/* The flags against the model: each needs the EOD id and the input it
 * fills, declared by some program of the plan (progs[0..n); a pipeline's
 * first stage takes position_ids, its last loss_mask), so no flag is
 * silently ignored.  0, or -1 naming the flag and what would work. */
int rt_packed_check(const RtGptOpts *g, const IrModule *const *progs, int n, char *err, size_t errlen);

/* What rt_train reads: the byte corpus, indexed datasets or mock data.
 * Row r of global micro batch rows [row0, row0 + rows) of step s is global
 * sample i = s * per_step + row0 + r (per_step = global_batch), so every
 * rank and layout reads the single-rank batch: tokens = sample[0, T),
 * targets = sample[1, T+1) (a sample holds T + 1 tokens).  Indexed data:
 * sample i is the train part's sample i (gptdata.h); mock data:
 * rt_gpt_mock_sample(seed, i, T, vocab).  Byte corpus: rt_corpus_batch.
 * Ids are checked against the model's vocabulary: the rows of the
 * embedding table the "tokens" input indexes (unpadded), else the classes
 * of the cross-entropy; an id at or above it stops training with a message
 * naming the dataset, the sequence and the id. */
enum { RT_DATA_BYTES, RT_DATA_GPT, RT_DATA_MOCK };
typedef struct RtTrainOpts RtTrainOpts;
typedef struct {
  int kind;                     /* RT_DATA_* */
  RtCorpus corpus;
  RtGptData *gpt;
  int64_t T, per_step, vocab;
  char vocab_from[160];
  uint64_t seed;
  int32_t *buf;                 /* one sample */
} RtDataSrc;
/* samples: how many the run reads (steps * per_step).  note: the data's
 * start-up lines (where the indices came from, how long it took). */
int rt_data_open(RtDataSrc *d, const RtTrainOpts *o, const RtProgram *p, int64_t T, int64_t per_step,
                 int64_t samples, FILE *note, char *err, size_t errlen);
/* The same for split part `part` (RT_SPLIT_*): indexed data reads that
 * part's indices; mock data draws part p > 0 from seed rand(seed, 6, p)
 * (gptdata.h), so validation never sees a training sample; the byte
 * corpus has no split and refuses p > 0. */
int rt_data_open_part(RtDataSrc *d, const RtTrainOpts *o, const RtProgram *p, int part, int64_t T, int64_t per_step,
                      int64_t samples, FILE *note, char *err, size_t errlen);
/* Rows row0 .. row0 + rows - 1 of step `step`, whose first global sample
 * is `first` (step * per_step, or a ramp-up's samples consumed before the
 * step): the indexed and mock data read samples first + row0 + r; the byte
 * corpus draws its windows from (seed, step, row0 + r). */
int rt_data_rows(RtDataSrc *d, int64_t step, int64_t first, int64_t row0, int64_t rows, int32_t *tokens,
                 int32_t *targets, char *err, size_t errlen);
void rt_data_close(RtDataSrc *d);

/* ---- prefetch (prefetch.c): the next step's feeds made by a thread ----
 * fill(ctx, step, j, tokens, targets, gtokens) writes local micro batch j
 * of step (n elements each), as the trainer would, and, when the trainer
 * needs them (ng > 0: packed-sequence inputs of split tokens are made from
 * the micro batch's global tokens), the global tokens into gtokens (ng
 * elements; NULL when ng = 0).  Steps first .. end-1 are filled in order
 * into two slots; rt_prefetch_get waits for (step, j) and copies it out
 * (gtokens too when ng > 0; an error of its fill is returned there);
 * rt_prefetch_release frees the step's slot for step + 2; rt_prefetch_stop
 * joins the thread (also mid-run: on an error or a signal). */
typedef struct RtPrefetch RtPrefetch;
typedef int (*RtPrefetchFill)(void *ctx, int64_t step, int64_t j, int32_t *tokens, int32_t *targets, int32_t *gtokens,
                              char *err, size_t errlen);
RtPrefetch *rt_prefetch_start(RtPrefetchFill fill, void *ctx, int64_t first, int64_t end, int64_t nmicro, size_t n,
                              size_t ng, char *err, size_t errlen);
int rt_prefetch_get(RtPrefetch *p, int64_t step, int64_t j, int32_t *tokens, int32_t *targets, int32_t *gtokens,
                    char *err, size_t errlen);
void rt_prefetch_release(RtPrefetch *p, int64_t step);
void rt_prefetch_stop(RtPrefetch *p);

/* ---- training ----
 * Over N ranks (opts.rank and opts.world set), each rank trains its own
 * program (SPMD).  With dp = the rank's mesh dp and r its dp coordinate,
 * a step runs n_local = global_batch / (micro_batch * dp) micro batches
 * per rank: micro j is the GLOBAL micro batch g = r * n_local + j, holding
 * global rows [g * micro_batch, (g+1) * micro_batch) (RtRunInfo.micro = g,
 * for dropout), so the ranks together see exactly the single-rank step's
 * batch.  The step's loss is the sum of the micro losses, all-reduced over
 * dp, divided by global_batch / micro_batch.  Only world rank 0 prints
 * progress and writes metrics.
 *
 * Pipeline programs (m->par.pp > 1, m->par.stage = pp coordinate + 1; see
 * docs/pipeline.md): instead of "micro", the rank runs the steps of its
 * schedule (regenerated from m->par with n_local micro batches and checked
 * with plan_pipe_check): F of micro j on chunk g runs block fwd.<g>, B runs
 * bwd.<g>, each fed micro batch r * n_local + j when it has data inputs
 * (RtRunInfo.micro is that global index, as without pp).  Then every posted
 * send completes, no stashed value may be left, and "update" runs.  The
 * loss: the forward blocks' `output "loss"` (once per micro batch over the
 * pipeline), summed, all-reduced over pp and dp, divided as above; the grad
 * norm is the update's (every stage reports the same global value).
 *
 * Fault injection for the tests (world ranks, steps from 1):
 *   TS_FAULT_KILL_RANK=R TS_FAULT_KILL_STEP=S   rank R SIGKILLs itself in
 *       step S, after its first micro batch;
 *   TS_FAULT_STALL_RANK=R TS_FAULT_STALL_STEP=S rank R stops (sleeps) there;
 *   TS_FAULT_CKPT_RANK=R TS_FAULT_CKPT_KILL=K   rank R SIGKILLs itself at
 *       the K-th point of its checkpoint saves (ckpt.c lists them). */
/* Checkpoints (ckpt.c; the format: docs/checkpoints.md). */
typedef struct {
  const char *save_dir;      /* --save DIR: NULL, none */
  int64_t save_interval;     /* a checkpoint after every N-th step (0: only at the end) */
  int keep;                  /* the newest K checkpoints kept (0: all) */
  const char *load_dir;      /* --load DIR: resume from DIR/latest (or DIR itself, an iter_N) */
  int async;                 /* --async-save: files written by a thread while training goes on */
} RtCkptOpts;

/* ---- generation (generate.c; mrun --generate, docs/generation.md) ---- */
typedef struct RtTokenizer RtTokenizer;
typedef struct {
  const char *prompt;        /* the prompt's bytes */
  size_t prompt_len;
  const RtTokenizer *tok;    /* --tokenizer: its ids; NULL: one token per byte */
  int64_t max_tokens;        /* new tokens */
  double temperature;        /* 0: greedy */
  int64_t top_k;             /* 0: every id */
  double top_p;              /* 1: every id */
  uint64_t seed;             /* the draws: rt_u01(H(seed, 7, t)) for new token t */
  int64_t vocab;             /* ids sampled from: [0, vocab) (0: every logit; with tok: its vocabulary) */
  int check_full;            /* --generate-check: each token equals the full forward's argmax */
  int print_ids;             /* the new tokens' ids on a line of their own */
  int quiet;                 /* the tokens/s line on stderr */
} RtGenOpts;
/* Collective over world (every rank runs the same blocks): the prompt,
 * prefill, then max_tokens - 1 steps; world rank 0 prints the text (the
 * prompt and the new tokens) and the tokens/s to out.  Refuses a prompt
 * or a length past the model's window (the KV cache).  0, or -1. */
int rt_generate(RtProgram *p, RtComm *world, const RtGenOpts *o, FILE *out, char *err, size_t errlen);

struct RtTrainOpts {
  const char *data_path;     /* NULL: rt_corpus_default_path() */
  const char *metrics_path;  /* JSON Lines, one object per step; NULL: none */
  int quiet;                 /* no progress lines */
  FILE *log;                 /* progress lines (NULL: stdout) */
  const RtRank *rank;        /* NULL: a single rank (no communication) */
  RtComm *world;             /* all ranks (for --save-params); NULL: single rank */
  const char *save_params_path;  /* after training: rt_params_save; NULL: none */
  RtCkptOpts ckpt;           /* --save / --load */
  const char *init_from;     /* --init-from PATH: Hugging Face weights (hf.h) instead of the initializers */
  const char *export_dir;    /* --export DIR: after training, the weights as a Hugging Face model */
  RtHfOpts hf;               /* the map and the plan's programs, for both */
  RtGptOpts gpt;             /* --data-path / --mock-data instead of data_path */
  /* Validation (docs/data.md "Validation"): after every eval_interval-th
   * step, the mean loss of block "eval" (pass eval: the forward alone,
   * dropout off) over global batches 0 .. eval_iters-1 of the valid part,
   * the same samples every time; with eval_test, over those of the test
   * part once after the last step.  0: none.  No gradient, parameter or
   * optimizer state changes; every rank takes part. */
  int64_t eval_interval, eval_iters;
  int eval_test;
  int no_prefetch;           /* --no-prefetch: each step reads its batches itself (prefetch.c otherwise) */
  const RtGenOpts *generate; /* --generate: after loading the weights, rt_generate instead of training */
  const char *trace_path;    /* --trace FILE: the Chrome trace of every rank's ops and steps (trace.c) */
  double peak_flops;         /* mrun --hw: a rank's peak FLOP/s for the plan's format; MFU against it (0: none) */
};

/* mrun --trace (trace.c): collective over world (NULL: one rank): the
 * events p recorded (rt_program_trace_start) and the steps' start and end
 * (step_t[2 s], step_t[2 s + 1], seconds from the same base; steps
 * first_step + 1 ..) of every rank, merged by rank 0 into the Chrome /
 * Perfetto trace at path.  0, or -1 with a message. */
int rt_trace_write(const RtProgram *p, RtComm *world, const char *path, const double *step_t, int64_t nsteps,
                   int64_t first_step, char *err, size_t errlen);

typedef struct {
  int64_t steps;             /* steps completed */
  double first_loss, last_loss, last_grad_norm;
  /* On a CUDA device: collectives issued on the comm stream, and device
   * operations issued on compute while one was still in flight (so
   * overlapping it). */
  long long dev_collectives, dev_overlapped;
  int accum_direct;          /* gradients the program makes straight into their state (RtExecStats) */
  /* The dp gradient reduction (RtExecStats' dp_*): buckets posted during the
   * last micro batches and the gradients in them, seconds the update block
   * waited for them, seconds packing and posting them; the dp collectives
   * run in the update block itself and their seconds. */
  long long dp_buckets, dp_grads, dp_blocking;
  double dp_wait_s, dp_post_s, dp_blocking_s, dp_poll_s;
  long long dp_dev_overlapped;   /* on a CUDA device: buckets after which the backward issued compute work */
  int graphs;                /* on a device: blocks captured as CUDA graphs, and their launches */
  long long graph_launches;
  int stopped_by;            /* SIGINT / SIGTERM stopped training after `steps` (0: ran to the end) */
  int64_t resumed_from;      /* --load: the checkpoint's step (training ran steps resumed_from+1 ..); 0: none */
  int64_t saved;             /* checkpoints written */
  int64_t timed_saves;       /* the saves of --save-interval (not the one after the last step) */
  double save_stall_s;       /* the time training waited for them, in all */
  double save_copy_s;        /* of which copying the states to host buffers (--async-save) */
  int64_t evals;             /* evaluations on the valid part */
  double val_loss, test_loss;/* the last evaluation's loss, the test loss (NaN: none) */
} RtTrainResult;

/* Stopping: SIGINT or SIGTERM during rt_train ends training after the step
 * under way (all ranks agree on the step: the stop request is all-reduced
 * over `world` after every step); rt_train then returns 0 with
 * RtTrainResult.stopped_by set, the metrics of every finished step
 * written and --save-params saved.  A second signal of the same kind kills the process as usual.
 * With TS_MRUN_STATUS_DIR set (mrun's launcher), each rank writes its
 * state to DIR/rank.<world rank>: "step S PID" when step S starts, then
 * "done S PID", "stopped S PID" or "error S PID" (so the launcher can pass
 * a signal to the ranks themselves and say which step a rank that died was
 * in). */

/* Trains m for m->train.steps steps: per step, global_batch / micro_batch
 * runs of block "micro" (each fed a fresh micro-batch; a pipeline program:
 * its schedule, see above), then block
 * "update"; the step's loss is the mean of the micro runs' `output "loss"`,
 * its grad norm the update's `output "grad_norm"` (NaN if not reported).
 * A non-finite loss stops training with an error naming the step.
 * 0 on success, -1 with a message. */
int rt_train(const IrModule *m, const RtTrainOpts *o, RtTrainResult *res,
             char *err, size_t errlen);

/* Collective over `world` (NULL: a single rank): writes the checkpoint of
 * `step` (every state of every rank) into o->save_dir/iter_<step> and points
 * o->save_dir/latest at it; keeps the newest o->keep.  0, or -1 with a
 * message on every rank. */
int rt_ckpt_save(RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, char *err, size_t errlen);
/* Asynchronous saves (--async-save): rt_ckpt_save_async finishes the
 * previous save (rt_ckpt_finish), copies the states to host buffers (the
 * time it took: *copy_s) and returns while a thread writes this rank's files; rt_ckpt_finish (a
 * collective, on every rank) waits for the thread and completes the
 * checkpoint (metadata, rename, `latest`).  rt_ckpt_writer_free waits for a
 * thread still writing and drops an unfinished save (its .tmp is never
 * loaded).  0, or -1 with a message on every rank. */
typedef struct RtCkptWriter RtCkptWriter;
RtCkptWriter *rt_ckpt_writer_new(void);
int rt_ckpt_save_async(RtCkptWriter *w, RtProgram *p, RtComm *world, const RtCkptOpts *o, int64_t step, double *copy_s,
                       char *err, size_t errlen);
int rt_ckpt_finish(RtCkptWriter *w, RtComm *world, const RtCkptOpts *o, char *err, size_t errlen);
void rt_ckpt_writer_free(RtCkptWriter *w);
/* A save is under way (rt_ckpt_finish has work to do); its thread is
 * still writing.  Local: the caller agrees with the other ranks first. */
int rt_ckpt_writer_pending(const RtCkptWriter *w);
int rt_ckpt_writer_busy(const RtCkptWriter *w);
/* Collective: loads this rank's states from the checkpoint `dir` names (its
 * `latest`, or dir itself) and returns its step.  The checkpoint may come
 * from any layout of the same model: each state is assembled from the saved
 * shards that overlap it (resharding; `how` then says from what layout,
 * else it is ""); a checkpoint of another model is refused, naming the
 * first tensor that differs in name, kind, dtype or global shape.  0, or -1
 * with a message. */
int rt_ckpt_load(RtProgram *p, RtComm *world, const char *dir, int64_t *step, char *how, size_t howlen, char *err,
                 size_t errlen);

/* ---- parameter files (mrun --save-params) ----
 * Every parameter in its GLOBAL logical shape: tp (and other) splits
 * undone, padding for sharding stripped (IrState.logical), so a sharded
 * run's file compares element by element with the single-rank run's.
 * Format (little-endian, written atomically):
 *   "TSPARAMS" | u32 version (1) | u32 count
 *   count times, sorted by name (strcmp):
 *     u32 name length | name bytes (no NUL) | u32 dtype (IrDtype: 1 f32,
 *     2 f64) | u32 rank | i64 dim[rank] | numel * dtype-size bytes of data,
 *     row-major. */
typedef struct {
  char *name;
  IrDtype dtype;
  int rank;
  int64_t dim[IR_MAX_RANK];
  int64_t numel;
  double *data;              /* converted to double */
} RtParam;
typedef struct { int n; RtParam *a; } RtParams;

/* Collective over `world` (every rank calls it; world NULL: single rank):
 * gathers each parameter of p's module over the axes it is split on and
 * world rank 0 writes `path`.  With pp > 1 every pipeline rank holds a
 * different subset of the parameters: the ranks of world rank 0's pp group
 * send it the ones it lacks (a parameter held by several pipeline ranks,
 * like a tied embedding, from the lowest), so the file holds every
 * parameter, as the single-rank run's does.  0, or -1 with a message
 * (rank 0's write error is only known to rank 0). */
int rt_params_save(RtProgram *p, RtComm *world, const char *path, char *err, size_t errlen);
/* The same collective, the parameters kept in memory: on world rank 0 every
 * parameter (sorted by name, global logical shape, as double); on the
 * other ranks an empty set.  NULL with a message on failure. */
RtParams *rt_params_collect(RtProgram *p, RtComm *world, char *err, size_t errlen);
RtParams *rt_params_read(const char *path, char *err, size_t errlen);
void rt_params_free(RtParams *ps);
/* The largest tensor-wise relative difference between a and b:
 *   max over parameters of  max_i |a_i - b_i| / max(max_i |b_i|, 0.1 * M)
 * with M the largest |b_i| of the whole model.  The floor matters only for
 * a parameter whose entries all stay below 10% of M: one whose true gradient
 * is 0, like an attention key bias, moves by AdamW steps driven by rounding
 * noise that differs with every summation order, so its own size is no
 * scale to compare against.
 * -1 with a message in where when the files hold different parameters or
 * shapes; else where names the parameter with the largest difference. */
double rt_params_max_rel_diff(const RtParams *a, const RtParams *b, char *where, size_t n);

#endif
