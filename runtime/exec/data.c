/* data.c - the byte-level data pipeline: a corpus file mapped into memory
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
