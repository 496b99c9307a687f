/* train.h - the trainer behind `mrun`: the byte-level data pipeline
 * (data.c), the training loop over a module's "micro" and "update" blocks
 * (train.c) and the GPU driver probe (gpu_probe.c).
 *
 * Data convention: a model's inputs are fed by name -- "tokens" and
 * "targets" (i32, same shape [..., T]: row r holds a window of T bytes of
 * the corpus and the same window shifted by one) and optionally
 * "loss_mask" (all ones).  Any other input is refused at start-up. */
#ifndef TS_TRAIN_H
#define TS_TRAIN_H
#include "rt.h"

/* ---- data: token = byte, vocabulary 256 ---- */
#define RT_BYTE_VOCAB 256
typedef struct { unsigned char *bytes; size_t len; } RtCorpus;

/* Reads the whole file.  0, or -1 with a message. */
int rt_corpus_open(RtCorpus *c, const char *path, char *err, size_t errlen);
void rt_corpus_free(RtCorpus *c);
/* The corpus mrun uses without --data: samples/data/kjv.txt relative to
 * the working directory if it exists there, else in the source tree. */
const char *rt_corpus_default_path(void);
/* Fills rows x T tokens and targets: row r (global row index row0 + r)
 * at step `step` reads the window at offset
 *   H(3, seed, step, row0 + r) mod (len - T - 1)          (H: rng.c)
 * tokens = bytes[off, off + T), targets = bytes[off + 1, off + T + 1).
 * -1 with a message if the corpus is shorter than T + 2 bytes. */
int rt_corpus_batch(const RtCorpus *c, uint64_t seed, int64_t step, int64_t row0,
                    int64_t rows, int64_t T, int32_t *tokens, int32_t *targets,
                    char *err, size_t errlen);

/* ---- training ---- */
typedef struct {
  const char *data_path;     /* NULL: rt_corpus_default_path() */
  const char *metrics_path;  /* JSON Lines, one object per step; NULL: none */
  int quiet;                 /* no progress lines */
  FILE *log;                 /* progress lines (NULL: stdout) */
} RtTrainOpts;

typedef struct {
  int64_t steps;             /* steps completed */
  double first_loss, last_loss, last_grad_norm;
} RtTrainResult;

/* Trains m for m->train.steps steps: per step, global_batch / micro_batch
 * runs of block "micro" (each fed a fresh micro-batch), then block
 * "update"; the step's loss is the mean of the micro runs' `output "loss"`,
 * its grad norm the update's `output "grad_norm"` (NaN if not reported).
 * A non-finite loss stops training with an error naming the step.
 * 0 on success, -1 with a message. */
int rt_train(const IrModule *m, const RtTrainOpts *o, RtTrainResult *res,
             char *err, size_t errlen);

/* ---- GPU probe ---- */
/* dlopen()s libcuda.so.1 (never linked) and counts devices.  Returns the
 * device count (0 with a message in msg when there is no driver or no
 * device). */
int rt_gpu_probe(char *msg, size_t msglen);

#endif
