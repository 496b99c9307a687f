/* gptdata.h - the sample indices of Megatron's GPT dataset over indexed
 * datasets (indexed.h), their blending and their cache on disk.  The
 * algorithm is documented in docs/data.md "Sample indices" precisely
 * enough to be reimplemented (tests/gptdata/gptdata_twin.py is); in brief:
 *
 *   split    --split a,b,c: the dataset's SEQUENCES (Megatron splits a GPT
 *            dataset by sequence) [round(lo * N), round(hi * N)) per part;
 *   document index   the part's sequence ids, repeated for enough epochs
 *            to give the samples asked for, shuffled (the last epoch
 *            shuffled on its own when it is used for less than 80%);
 *   sample index     row k = (position in the document index, offset):
 *            where sample k starts; sample k is the seq_len + 1 tokens from
 *            row k to row k+1 inclusive (consecutive samples share a token);
 *   shuffle index    the sample order, shuffled;
 *   blend    the dataset of each blended sample by Megatron's greedy rule.
 *
 * The shuffles are Fisher-Yates driven by a counter-based generator
 * (splitmix64's finalizer over seed, stream and position), so the indices
 * depend on nothing but their inputs.  Uses ir/ (util.h) and indexed.h. */
#ifndef TS_RT_GPTDATA_H
#define TS_RT_GPTDATA_H
#include "indexed.h"
#include <stdio.h>

/* ---- the generator and the shuffle ---- */
/* splitmix64's finalizer (mix64(z + golden gamma)). */
uint64_t rt_gpt_mix64(uint64_t z);
/* The random word at position i of stream `stream` of `seed`:
 * mix(mix(mix(seed) ^ stream) ^ i). */
uint64_t rt_gpt_rand(uint64_t seed, uint64_t stream, uint64_t i);
/* Fisher-Yates: for i = n-1 down to 1, j = (rand(seed, stream, i) * (i+1)) >> 64
 * (the high word of the 128-bit product), swap a[i], a[j]. */
void rt_gpt_shuffle(int64_t *a, int64_t n, uint64_t seed, uint64_t stream);
/* The streams of the four shuffles. */
enum { RT_GPT_STREAM_DOC = 1, RT_GPT_STREAM_DOC_LAST = 2, RT_GPT_STREAM_SHUF = 3, RT_GPT_STREAM_SHUF_LAST = 4,
       RT_GPT_STREAM_MOCK_PART = 6 };   /* --mock-data's seed of the valid / test part: rand(seed, 6, part) */

/* ---- --split ---- */
enum { RT_SPLIT_TRAIN, RT_SPLIT_VALID, RT_SPLIT_TEST, RT_SPLIT_COUNT };
extern const char *const rt_split_name[RT_SPLIT_COUNT];
/* Parses "a,b,c" (1 to 3 numbers >= 0, missing ones 0, not all 0) into
 * normalized weights.  0, or -1 with a message (no flag name: the caller
 * adds it). */
int rt_gpt_split_parse(const char *s, double w[RT_SPLIT_COUNT], char *err, size_t errlen);
/* The sequence range [beg[p], end[p]) of part p among n sequences
 * (Megatron's rounding: bounds round(cum * n), ties to even). */
void rt_gpt_split_ranges(const double w[RT_SPLIT_COUNT], int64_t n, int64_t beg[RT_SPLIT_COUNT],
                         int64_t end[RT_SPLIT_COUNT]);

/* ---- the three indices of one dataset part ---- */
typedef struct {
  int64_t epochs, tokens_per_epoch;
  int separate_last;            /* the last epoch shuffled on its own */
  int64_t n_doc;                /* document index: n_doc sequence ids */
  const int64_t *doc;
  int64_t n_sample;             /* samples: the sample index has n_sample + 1 rows */
  const int64_t *sample;        /* [n_sample + 1][2]: document-index position, offset */
  const int64_t *shuffle;       /* [n_sample] */
  void *own;                    /* what to free (built) */
  void *map;                    /* what to unmap (loaded from a cache file) */
  size_t map_len;
} RtGptIndex;

/* Epochs, separation and sizes: everything about the indices but their
 * contents, from the inputs alone (a cache file is checked against it
 * before it is trusted).  0, or -1 with a message (an empty part, fewer
 * than 2 tokens, no whole sample, sizes past int64). */
typedef struct {
  int64_t n_part, tpe, epochs;  /* sequences of the part, tokens per epoch, epochs */
  int64_t n_doc, n_sample;      /* document index entries; samples */
  int64_t sans;                 /* samples before the last epoch (epochs > 1) */
  int separate;                 /* the last epoch shuffled on its own */
} RtGptShape;
int rt_gpt_index_shape(const int32_t *len, int64_t beg, int64_t end, int64_t T, int64_t num_samples, RtGptShape *s,
                       char *err, size_t errlen);
/* Builds the indices of sequences [beg, end) (lengths len[]) for at least
 * num_samples samples of T + 1 tokens.  0, or -1 with a message (an empty
 * part, a part of fewer than T + 2 tokens... in the user's numbers). */
int rt_gpt_index_build(const int32_t *len, int64_t beg, int64_t end, int64_t T, int64_t num_samples,
                       uint64_t seed, RtGptIndex *ix, char *err, size_t errlen);
void rt_gpt_index_free(RtGptIndex *ix);

/* ---- blending ---- */
/* Megatron's greedy rule: sample k comes from the dataset d maximizing
 * w[d] * max(k, 1) - count[d] (the first such d on ties); ds[k] = d,
 * ds_sample[k] = count[d] before the increment.  w: normalized weights. */
void rt_gpt_blend(const double *w, int n, int64_t size, int64_t *ds, int64_t *ds_sample);

/* ---- a blended GPT dataset for one split part, as mrun reads it ---- */
typedef struct {
  int n;                        /* datasets */
  const char *const *prefix;    /* PREFIX of PREFIX.bin / PREFIX.idx */
  const double *weight;         /* NULL: weighted by their parts' sizes in samples */
  const char *split;            /* "949,50,1"; NULL: "969,30,1" (Megatron's default) */
  int part;                     /* RT_SPLIT_* */
  int64_t seq_len, num_samples;
  uint64_t seed;
  const char *cache_dir;        /* NULL: <the first dataset's folder>/cache, best effort */
  const char *cache_flag;       /* the option that named cache_dir, for its errors ("--data-cache-path") */
  const char *flag;             /* the option that named the datasets, for errors ("--data-path") */
} RtGptDataOpts;

typedef struct RtGptData RtGptData;
/* Opens every dataset (mapped), and loads the indices from the cache or
 * builds them and writes the cache (atomically).  note (may be NULL)
 * gets one line per index saying where it came from and how long it took.
 * NULL with a message naming the flag, the file and the numbers. */
RtGptData *rt_gpt_data_open(const RtGptDataOpts *o, FILE *note, char *err, size_t errlen);
void rt_gpt_data_free(RtGptData *d);
int64_t rt_gpt_data_size(const RtGptData *d);          /* samples available */
/* Sample i (0 <= i < size) as seq_len + 1 token ids into out.  An id < 0
 * or >= vocab (vocab > 0) is refused naming the dataset, the sequence, the
 * position and the id.  0, or -1 with a message. */
int rt_gpt_data_sample(const RtGptData *d, int64_t i, int64_t vocab, int32_t *out, char *err, size_t errlen);
/* How many of the indices were loaded from the cache / built (for tests
 * and the start-up line). */
void rt_gpt_data_stats(const RtGptData *d, int *loaded, int *built, double *seconds);

/* ---- --mock-data ---- */
/* Token t of mock sample i: rand(seed, 5, i * (T + 1) + t) mod vocab. */
void rt_gpt_mock_sample(uint64_t seed, int64_t i, int64_t T, int64_t vocab, int32_t *out);

#endif
