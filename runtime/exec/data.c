/* data.c - what training reads (train.h RtDataSrc): Megatron's indexed
 * datasets through runtime/data's sample indices, mock ids, or the
 * byte-level pipeline: a corpus file mapped into memory
 * (never read whole: a corpus larger than RAM trains, its pages loaded as
 * windows touch them), token = byte (vocabulary 256), and deterministic
 * sampling of windows, so a run (and any rank of a sharded run) draws the
 * same batches from the same seed.  The window formula is in train.h. */
#include "train.h"
#include "rt_priv.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int rt_corpus_open(RtCorpus *c, const char *path, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* a FIFO: refused below, not waited on */
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, errlen, "cannot read corpus %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {   /* windows are drawn at random offsets: it must be a file with a size */
    snprintf(err, errlen, "corpus %s is %s, not a regular file: mrun draws windows at random offsets of it", path,
             S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a pipe" : "a device or socket");
    close(fd);
    return -1;
  }
  if (st.st_size == 0) {
    snprintf(err, errlen, "corpus %s is empty", path);
    close(fd);
    return -1;
  }
  if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
    snprintf(err, errlen, "corpus %s has %lld bytes, more than this machine can address", path,
             (long long)st.st_size);
    close(fd);
    return -1;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);   /* the mapping keeps the file */
  if (p == MAP_FAILED) {
    snprintf(err, errlen, "cannot map corpus %s (%lld bytes): %s", path, (long long)st.st_size, strerror(e));
    return -1;
  }
  (void)madvise(p, (size_t)st.st_size, MADV_RANDOM);   /* windows: no read-ahead of the whole file */
  ts_note_input(path);   /* no output of this run may overwrite it (--save-params, --metrics) */
  c->bytes = p;
  c->len = (size_t)st.st_size;
  return 0;
}

void rt_corpus_free(RtCorpus *c) {
  if (c->bytes) munmap((void *)c->bytes, c->len);
  c->bytes = NULL;
  c->len = 0;
}

const char *rt_corpus_default_path(void) {
  static const char rel[] = "samples/data/kjv.txt";
  static char inst[4200];
  if (access(rel, R_OK) == 0) return rel;
  snprintf(inst, sizeof inst, "%s/%s", ts_data_root(), rel);
  return inst;
}

int rt_corpus_batch(const RtCorpus *c, uint64_t seed, int64_t step, int64_t row0,
                    int64_t rows, int64_t T, int32_t *tokens, int32_t *targets,
                    char *err, size_t errlen) {
  if (T < 1 || c->len < (size_t)T + 2) {
    snprintf(err, errlen, "the corpus has %zu bytes; windows of %lld tokens need at least %lld",
             c->len, (long long)T, (long long)T + 2);
    return -1;
  }
  uint64_t span = (uint64_t)(c->len - (size_t)T - 1);
  for (int64_t r = 0; r < rows; r++) {
    uint64_t w[4] = {RT_RNG_DATA, seed, (uint64_t)step, (uint64_t)(row0 + r)};
    size_t off = (size_t)(rt_hash_words(w, 4) % span);
    for (int64_t t = 0; t < T; t++) {
      if (tokens) tokens[r * T + t] = c->bytes[off + (size_t)t];
      if (targets) targets[r * T + t] = c->bytes[off + (size_t)t + 1];
    }
  }
  return 0;
}

/* ---- the data source mrun trains on (train.h RtDataSrc) ---- */

/* The global size of dim d of node n's value (its type is the local shard). */
static int64_t global_dim(const RtProgram *p, const IrNode *n, int d) {
  int64_t off[IR_MAX_RANK], gdim[IR_MAX_RANK];
  rt_shard_offsets(rt_program_rank(p), &n->sh, &n->type, off, gdim);
  return gdim[d];
}

/* The model's vocabulary: the rows of the embedding table that the
 * "tokens" input indexes (the unpadded size of a table padded for tp),
 * else the classes of its cross-entropy (a last pipeline stage).  0 when
 * the program has neither; from says where the number came from. */
static int64_t model_vocab(const RtProgram *p, const IrModule *m, char *from, size_t n) {
  for (int b = 0; b < m->blocks.n; b++) {
    const IrBlock *blk = &m->blocks.a[b];
    for (int i = 0; i < blk->n; i++) {
      const IrNode *e = &blk->nodes[i];
      if (e->op != IR_OP_EMBEDDING || e->nin < 2) continue;
      const IrNode *ids = &blk->nodes[e->in[1]], *tab = &blk->nodes[e->in[0]];
      if (ids->op != IR_OP_INPUT || !ids->sa || strcmp(ids->sa, "tokens") != 0 || tab->type.rank < 1) continue;
      int64_t V = global_dim(p, tab, 0);
      const char *name = "the embedding table";
      if (tab->op == IR_OP_STATE && tab->ia[0] >= 0 && tab->ia[0] < m->states.n) {
        const IrState *st = &m->states.a[tab->ia[0]];
        if (st->logical[0] > 0) V = st->logical[0];
        name = st->name;
      }
      snprintf(from, n, "the rows of embedding table %s", name);
      return V;
    }
  }
  for (int b = 0; b < m->blocks.n; b++) {
    const IrBlock *blk = &m->blocks.a[b];
    for (int i = 0; i < blk->n; i++) {
      const IrNode *x = &blk->nodes[i];
      if (x->op != IR_OP_CROSS_ENTROPY || x->nin < 1) continue;
      const IrNode *lg = &blk->nodes[x->in[0]];
      if (lg->type.rank < 1) continue;
      snprintf(from, n, "the classes of the cross-entropy");
      return global_dim(p, lg, lg->type.rank - 1);
    }
  }
  snprintf(from, n, "no embedding or cross-entropy in this rank's program");
  return 0;
}

int rt_data_open(RtDataSrc *d, const RtTrainOpts *o, const RtProgram *p, int64_t T, int64_t per_step,
                 int64_t samples, FILE *note, char *err, size_t errlen) {
  return rt_data_open_part(d, o, p, RT_SPLIT_TRAIN, T, per_step, samples, note, err, errlen);
}

int rt_data_open_part(RtDataSrc *d, const RtTrainOpts *o, const RtProgram *p, int part, int64_t T, int64_t per_step,
                      int64_t samples, FILE *note, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  memset(d, 0, sizeof *d);
  d->T = T;
  d->per_step = per_step;
  d->seed = m->train.seed;
  if (part != RT_SPLIT_TRAIN && !o->gpt.mock && o->gpt.n == 0)
    return ts_errf(err, errlen, "%s needs a %s split, and the byte corpus (%s) has none: give --data-path "
                   "(an indexed dataset, split by --split) or --mock-data",
                   part == RT_SPLIT_VALID ? "--eval-interval" : "--test", rt_split_name[part],
                   o->data_path ? o->data_path : rt_corpus_default_path());
  /* mock data: the validation and test samples are another stream of the
   * same generator, so they are never training samples */
  if (part != RT_SPLIT_TRAIN) d->seed = rt_gpt_rand(m->train.seed, RT_GPT_STREAM_MOCK_PART, (uint64_t)part);
  d->vocab = model_vocab(p, m, d->vocab_from, sizeof d->vocab_from);
  d->buf = ts_xcalloc((size_t)T + 1, sizeof *d->buf);
  if (o->gpt.mock) {
    d->kind = RT_DATA_MOCK;
    if (d->vocab < 1)
      return ts_errf(err, errlen, "--mock-data draws token ids below the model's vocabulary, and this program "
                     "shows none (%s)", d->vocab_from);
    return 0;
  }
  if (o->gpt.n > 0) {
    d->kind = RT_DATA_GPT;
    RtGptDataOpts go = {.n = o->gpt.n, .prefix = o->gpt.prefix, .weight = o->gpt.weight, .split = o->gpt.split,
                        .part = part, .seq_len = T, .num_samples = samples, .seed = m->train.seed,
                        .cache_dir = o->gpt.cache_dir, .cache_flag = "--data-cache-path", .flag = "--data-path"};
    return (d->gpt = rt_gpt_data_open(&go, note, err, errlen)) ? 0 : -1;
  }
  d->kind = RT_DATA_BYTES;
  const char *path = o->data_path ? o->data_path : rt_corpus_default_path();
  if (rt_corpus_open(&d->corpus, path, err, errlen) != 0) return -1;
  if (d->corpus.len < (size_t)T + 2)
    return ts_errf(err, errlen, "corpus %s has %zu bytes; seq_len %lld needs at least %lld", path, d->corpus.len,
                   (long long)T, (long long)T + 2);
  return 0;
}

int rt_data_rows(RtDataSrc *d, int64_t step, int64_t first, int64_t row0, int64_t rows, int32_t *tokens,
                 int32_t *targets, char *err, size_t errlen) {
  if (d->kind == RT_DATA_BYTES)
    return rt_corpus_batch(&d->corpus, d->seed, step, row0, rows, d->T, tokens, targets, err, errlen);
  int64_t T = d->T;
  for (int64_t r = 0; r < rows; r++) {
    int64_t i = first + row0 + r;   /* the global sample: the same on every rank and layout */
    if (d->kind == RT_DATA_MOCK) rt_gpt_mock_sample(d->seed, i, T, d->vocab, d->buf);
    else if (rt_gpt_data_sample(d->gpt, i, d->vocab, d->buf, err, errlen) != 0) {
      size_t k = strlen(err);
      if (d->vocab > 0 && strstr(err, "vocabulary"))
        snprintf(err + k, errlen > k ? errlen - k : 0, " of %lld ids (%s)", (long long)d->vocab, d->vocab_from);
      return -1;
    }
    if (tokens) memcpy(tokens + r * T, d->buf, (size_t)T * sizeof *tokens);
    if (targets) memcpy(targets + r * T, d->buf + 1, (size_t)T * sizeof *targets);
  }
  return 0;
}

void rt_data_close(RtDataSrc *d) {
  rt_corpus_free(&d->corpus);
  rt_gpt_data_free(d->gpt);
  free(d->buf);
  memset(d, 0, sizeof *d);
}
