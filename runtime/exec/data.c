/* data.c - the byte-level data pipeline: a corpus file read into memory,
 * token = byte (vocabulary 256), and deterministic sampling of windows, so
 * a run (and any rank of a sharded run) draws the same batches from the
 * same seed.  The window formula is in train.h. */
#include "train.h"
#include "rt_priv.h"
#include <errno.h>
#include <unistd.h>

int rt_corpus_open(RtCorpus *c, const char *path, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  size_t len = 0;
  char *data = ts_read_input(path, &len);
  if (!data) {
    snprintf(err, errlen, "cannot read corpus %s: %s", path, strerror(errno));
    return -1;
  }
  c->bytes = (unsigned char *)data;
  c->len = len;
  return 0;
}

void rt_corpus_free(RtCorpus *c) {
  free(c->bytes);
  c->bytes = NULL;
  c->len = 0;
}

const char *rt_corpus_default_path(void) {
  static const char rel[] = "samples/data/kjv.txt";
  if (access(rel, R_OK) == 0) return rel;
#ifdef TS_SOURCE_DIR
  return TS_SOURCE_DIR "/samples/data/kjv.txt";
#else
  return rel;
#endif
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
