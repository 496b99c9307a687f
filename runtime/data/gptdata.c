/* gptdata.c - Megatron's GPT sample indices (document, sample, shuffle),
 * blending, --split, and their cache files (gptdata.h; the algorithm and
 * the file layout: docs/data.md "Sample indices").
 *
 * Megatron's facts kept here: a GPT dataset is split and indexed by
 * SEQUENCE; the number of epochs is the least that holds
 * num_samples * T + 1 tokens; with more than one epoch the last one is
 * shuffled separately when fewer than 80% of its samples are used; a
 * sample takes T + 1 tokens and the next one starts on its last token;
 * the greedy blending rule.  What differs on purpose: the random numbers
 * (a counter-based generator instead of numpy's MT19937), the cache file
 * (one checksummed file instead of three .npy). */
#include "gptdata.h"
#include "ir/util.h"
#include <errno.h>
#include <fcntl.h>
#include <fenv.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the generator and the shuffle ---- */

uint64_t rt_gpt_mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rt_gpt_rand(uint64_t seed, uint64_t stream, uint64_t i) {
  return rt_gpt_mix64(rt_gpt_mix64(rt_gpt_mix64(seed) ^ stream) ^ i);
}

void rt_gpt_shuffle(int64_t *a, int64_t n, uint64_t seed, uint64_t stream) {
  uint64_t base = rt_gpt_mix64(rt_gpt_mix64(seed) ^ stream);   /* rt_gpt_rand's first two rounds, hoisted */
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t r = rt_gpt_mix64(base ^ (uint64_t)i);
    /* the high word of r * (i+1): a multiply instead of a division, and a
     * formula Python reproduces exactly with integers */
    int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
    int64_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- --split ---- */

const char *const rt_split_name[RT_SPLIT_COUNT] = {"train", "valid", "test"};

int rt_gpt_split_parse(const char *s, double w[RT_SPLIT_COUNT], char *err, size_t errlen) {
  double v[RT_SPLIT_COUNT] = {0, 0, 0}, sum = 0;
  int n = 0;
  const char *p = s;
  for (;;) {
    char *e;
    errno = 0;
    double x = strtod(p, &e);
    if (e == p || errno || !isfinite(x) || x < 0)
      return ts_errf(err, errlen, "'%s' is not up to three weights >= 0 separated by commas (e.g. 949,50,1)", s);
    if (n == RT_SPLIT_COUNT)
      return ts_errf(err, errlen, "'%s' has more than three weights (train, valid, test)", s);
    v[n++] = x;
    p = e;
    if (!*p) break;
    if (*p != ',' && *p != '/')   /* Megatron accepted both */
      return ts_errf(err, errlen, "'%s' is not up to three weights >= 0 separated by commas (e.g. 949,50,1)", s);
    p++;
  }
  for (int i = 0; i < RT_SPLIT_COUNT; i++) sum += v[i];
  if (!(sum > 0)) return ts_errf(err, errlen, "'%s' gives every part weight 0", s);
  for (int i = 0; i < RT_SPLIT_COUNT; i++) w[i] = v[i] / sum;
  return 0;
}

void rt_gpt_split_ranges(const double w[RT_SPLIT_COUNT], int64_t n, int64_t beg[RT_SPLIT_COUNT],
                         int64_t end[RT_SPLIT_COUNT]) {
  double cum[RT_SPLIT_COUNT + 1] = {0};
  for (int i = 0; i < RT_SPLIT_COUNT; i++) cum[i + 1] = cum[i] + w[i];
  int mode = fegetround();
  fesetround(FE_TONEAREST);   /* Python's round(): ties to even, as nearbyint in this mode */
  for (int i = 0; i < RT_SPLIT_COUNT; i++) {
    if (cum[i + 1] <= cum[i]) { beg[i] = end[i] = 0; continue; }   /* Megatron: the part is None */
    beg[i] = (int64_t)nearbyint(cum[i] * (double)n);
    end[i] = (int64_t)nearbyint(cum[i + 1] * (double)n);
  }
  fesetround(mode);
}

/* ---- the indices ---- */

int rt_gpt_index_shape(const int32_t *len, int64_t beg, int64_t end, int64_t T, int64_t num_samples,
                       RtGptShape *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  s->n_part = end - beg;
  if (T < 1) return ts_errf(err, errlen, "seq_len %lld: it must be at least 1", (long long)T);
  if (s->n_part <= 0) return ts_errf(err, errlen, "it holds no sequence");
  for (int64_t i = beg; i < end; i++) s->tpe += len[i];
  if (s->tpe < 2)
    return ts_errf(err, errlen, "its %lld sequences hold %lld tokens: a sample needs at least 2", (long long)s->n_part,
                   (long long)s->tpe);
  if (num_samples < 0 || num_samples > (INT64_MAX / 4) / T)
    return ts_errf(err, errlen, "%lld samples of %lld tokens is more than this build counts", (long long)num_samples,
                   (long long)T);
  int64_t need = num_samples * T + 1;
  s->epochs = need <= s->tpe ? 1 : (need + s->tpe - 1) / s->tpe;
  if (s->epochs > (INT64_MAX / 4) / s->tpe || s->epochs > (INT64_MAX / 4) / s->n_part)
    return ts_errf(err, errlen, "%lld epochs of %lld tokens is more than this build counts", (long long)s->epochs,
                   (long long)s->tpe);
  s->n_doc = s->epochs * s->n_part;
  s->n_sample = (s->epochs * s->tpe - 1) / T;
  if (s->epochs > 1) {
    s->sans = ((s->epochs - 1) * s->tpe - 1) / T;
    int64_t per_epoch = (s->tpe - 1) / T, from_last = num_samples - s->sans;
    s->separate = from_last < (int64_t)(0.80 * (double)per_epoch);   /* Megatron's int(0.80 * per_epoch) */
  }
  if (s->n_sample < 1)
    return ts_errf(err, errlen, "its %lld tokens give no sample of %lld + 1 tokens", (long long)s->tpe, (long long)T);
  return 0;
}

/* The sample index: Megatron's walk over the document index, T + 1 tokens
 * per sample, the next sample starting on the previous one's last token. */
static void build_samples(const int32_t *len, const int64_t *doc, int64_t n_doc, int64_t T, int64_t n_sample,
                          int64_t *out) {
  int64_t pos = 0, off = 0;
  out[0] = 0, out[1] = 0;
  for (int64_t k = 1; k <= n_sample; k++) {
    int64_t remaining = T + 1;
    while (remaining != 0) {
      int64_t dlen = len[doc[pos]] - off;
      remaining -= dlen;
      if (remaining <= 0) {
        off += remaining + dlen - 1;
        remaining = 0;
      } else {
        if (pos == n_doc - 1) {   /* out of documents: only the last sample may get here */
          TS_ASSERT(k == n_sample);
          off = len[doc[pos]] - 1;
          break;
        }
        pos++;
        off = 0;
      }
    }
    out[2 * k] = pos, out[2 * k + 1] = off;
  }
}

int rt_gpt_index_build(const int32_t *len, int64_t beg, int64_t end, int64_t T, int64_t num_samples,
                       uint64_t seed, RtGptIndex *ix, char *err, size_t errlen) {
  memset(ix, 0, sizeof *ix);
  RtGptShape s;
  if (rt_gpt_index_shape(len, beg, end, T, num_samples, &s, err, errlen) != 0) return -1;
  size_t words = (size_t)s.n_doc + 2 * (size_t)(s.n_sample + 1) + (size_t)s.n_sample;
  int64_t *mem = malloc(words * sizeof *mem);
  if (!mem)
    return ts_errf(err, errlen, "the sample indices need %.1f MB, more than this machine gives",
                   (double)words * 8 / 1e6);
  int64_t *doc = mem, *sample = doc + s.n_doc, *shuf = sample + 2 * (s.n_sample + 1);
  for (int64_t e = 0; e < s.epochs; e++)
    for (int64_t i = 0; i < s.n_part; i++) doc[e * s.n_part + i] = beg + i;
  if (s.separate) {
    rt_gpt_shuffle(doc, s.n_doc - s.n_part, seed, RT_GPT_STREAM_DOC);
    rt_gpt_shuffle(doc + s.n_doc - s.n_part, s.n_part, seed, RT_GPT_STREAM_DOC_LAST);
  } else {
    rt_gpt_shuffle(doc, s.n_doc, seed, RT_GPT_STREAM_DOC);
  }
  build_samples(len, doc, s.n_doc, T, s.n_sample, sample);
  for (int64_t i = 0; i < s.n_sample; i++) shuf[i] = i;
  if (s.separate) {
    rt_gpt_shuffle(shuf, s.sans, seed, RT_GPT_STREAM_SHUF);
    rt_gpt_shuffle(shuf + s.sans, s.n_sample - s.sans, seed, RT_GPT_STREAM_SHUF_LAST);
  } else {
    rt_gpt_shuffle(shuf, s.n_sample, seed, RT_GPT_STREAM_SHUF);
  }
  ix->epochs = s.epochs, ix->tokens_per_epoch = s.tpe, ix->separate_last = s.separate;
  ix->n_doc = s.n_doc, ix->doc = doc;
  ix->n_sample = s.n_sample, ix->sample = sample, ix->shuffle = shuf;
  ix->own = mem;
  return 0;
}

void rt_gpt_index_free(RtGptIndex *ix) {
  free(ix->own);
  if (ix->map) munmap(ix->map, ix->map_len);
  memset(ix, 0, sizeof *ix);
}

/* ---- blending ---- */

void rt_gpt_blend(const double *w, int n, int64_t size, int64_t *ds, int64_t *ds_sample) {
  int64_t *count = ts_xcalloc((size_t)n, sizeof *count);
  for (int64_t k = 0; k < size; k++) {
    double kd = k > 1 ? (double)k : 1.0;   /* Megatron's max(k, 1) */
    int best = 0;
    double best_err = w[0] * kd - (double)count[0];
    for (int d = 1; d < n; d++) {
      double e = w[d] * kd - (double)count[d];
      if (e > best_err) best_err = e, best = d;
    }
    ds[k] = best;
    ds_sample[k] = count[best]++;
  }
  free(count);
}

/* ---- mock data ---- */

void rt_gpt_mock_sample(uint64_t seed, int64_t i, int64_t T, int64_t vocab, int32_t *out) {
  for (int64_t t = 0; t <= T; t++)
    out[t] = (int32_t)(rt_gpt_rand(seed, 5, (uint64_t)(i * (T + 1) + t)) % (uint64_t)vocab);
}
