/* gptblend.c - a blended GPT dataset for one split part, as mrun reads it
 * (gptdata.h RtGptData): the indexed datasets mapped, the indices of
 * gptdata.c loaded from their cache files or built and cached, and the
 * reading of sample i.
 *
 * Cache files (docs/data.md "Sample indices" gives the layout): one per
 * dataset part (document, sample and shuffle index) and one per blend
 * (dataset and dataset-sample index), named by a hash of a description of
 * everything they depend on, which the file also holds and which must
 * match byte for byte.  A file is trusted only after its header, sizes,
 * description and checksum agree; otherwise it is rebuilt.  Loaded files
 * are mapped, so a warm start costs one pass of the checksum over them.
 * Reading a sample checks every index it follows against the dataset, so
 * even an index that passed the checks cannot read outside a file. */
#include "gptdata.h"
#include "ir/util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_MAGIC "TSGPTIDX"
#define CACHE_VERSION 1u
#define CACHE_HEADER 80
#define CACHE_MAX_ARRAYS 4

typedef struct {
  RtIndexed ds;
  int32_t *len;                 /* the sequence lengths, aligned (.idx holds them unaligned) */
  char *prefix;
  int open;
  int64_t beg, end;             /* the part's sequences */
  int64_t need;                 /* samples asked of it */
  RtGptIndex ix;
} Part;

struct RtGptData {
  int n;
  Part *p;
  int64_t T, size;
  int64_t *bds, *bsample;       /* blend: dataset and its sample, per sample (n > 1) */
  void *bown, *bmap;
  size_t bmap_len;
  int loaded, built;
  double seconds;
};

/* ---- the cache file ---- */

/* The checksum of the bytes after the header, as little-endian u64 words:
 * h = 0xcbf29ce484222325, then h = (h ^ w) * 0x100000001b3 per word. */
static uint64_t sum_words(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  return h;
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Writes narr arrays (counts cnt[], int64) under key and desc, atomically. */
static int cache_write(const char *path, uint64_t key, const char *desc, int narr, const int64_t *const *arr,
                       const int64_t *cnt) {
  size_t dlen = strlen(desc), dpad = pad8(dlen);
  unsigned char head[CACHE_HEADER] = {0};
  char *dbuf = ts_xcalloc(dpad ? dpad : 1, 1);
  memcpy(dbuf, desc, dlen);
  uint64_t h = sum_words(0xcbf29ce484222325ull, dbuf, dpad);
  for (int a = 0; a < narr; a++) h = sum_words(h, arr[a], (size_t)cnt[a] * 8);
  memcpy(head, CACHE_MAGIC, 8);
  put_u32(head + 8, CACHE_VERSION);
  put_u32(head + 12, (uint32_t)narr);
  put_u64(head + 16, key);
  put_u64(head + 24, h);
  put_u64(head + 32, dlen);
  for (int a = 0; a < narr; a++) put_u64(head + 40 + 8 * a, (uint64_t)cnt[a]);
  TsPiece pc[2 + CACHE_MAX_ARRAYS] = {{head, CACHE_HEADER}, {dbuf, dpad}};
  for (int a = 0; a < narr; a++) pc[2 + a] = (TsPiece){arr[a], (size_t)cnt[a] * 8};
  int rc = ts_write_pieces(path, pc, 2 + narr);
  free(dbuf);
  return rc;
}

/* Maps path and checks it against key, desc and the expected counts.
 * 1 (arr[] point into *map), 0 (no such file), -1 (damaged: why says how). */
static int cache_load(const char *path, uint64_t key, const char *desc, int narr, const int64_t *cnt,
                      void **map, size_t *map_len, const int64_t **arr, char *why, size_t whylen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    return ts_errf(why, whylen, "cannot open it: %s", strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { close(fd); return ts_errf(why, whylen, "not a regular file"); }
  size_t dlen = strlen(desc), total = CACHE_HEADER + pad8(dlen);
  for (int a = 0; a < narr; a++) total += (size_t)cnt[a] * 8;
  if ((uint64_t)st.st_size != total) {
    close(fd);
    return ts_errf(why, whylen, "%lld bytes where %zu were expected", (long long)st.st_size, total);
  }
  unsigned char *m = mmap(NULL, total, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return ts_errf(why, whylen, "cannot map it: %s", strerror(errno));
  const char *bad = NULL;
  if (memcmp(m, CACHE_MAGIC, 8) != 0) bad = "wrong magic";
  else if (get_u32(m + 8) != CACHE_VERSION) bad = "another version";
  else if (get_u32(m + 12) != (uint32_t)narr || get_u64(m + 16) != key || get_u64(m + 32) != dlen ||
           memcmp(m + CACHE_HEADER, desc, dlen) != 0)
    bad = "its header or description differs";
  for (int a = 0; !bad && a < narr; a++)
    if (get_u64(m + 40 + 8 * a) != (uint64_t)cnt[a]) bad = "its array sizes differ";
  if (!bad && sum_words(0xcbf29ce484222325ull, m + CACHE_HEADER, total - CACHE_HEADER) != get_u64(m + 24))
    bad = "its checksum does not match";
  if (bad) {
    munmap(m, total);
    return ts_errf(why, whylen, "%s", bad);
  }
  const unsigned char *q = m + CACHE_HEADER + pad8(dlen);
  for (int a = 0; a < narr; a++) {
    arr[a] = (const int64_t *)(const void *)q;
    q += (size_t)cnt[a] * 8;
  }
  *map = m;
  *map_len = total;
  return 1;
}

/* mkdir -p: 0, or -1 with errno. */
static int make_dirs(const char *dir) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) { errno = ENAMETOOLONG; return -1; }
  for (char *p = buf + 1;; p++) {
    if (*p != '/' && *p) continue;
    char c = *p;
    *p = 0;
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    *p = c;
    if (!c) break;
  }
  struct stat st;
  if (stat(buf, &st) != 0) return -1;
  if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
  return 0;
}

/* ---- opening ---- */

typedef struct {
  const RtGptDataOpts *o;
  FILE *note;
  char dir[PATH_MAX];           /* the cache folder ("" : none usable) */
  int explicit_dir, warned;
} Ctx;

static const char *flag_of(const RtGptDataOpts *o) { return o->flag ? o->flag : "--data-path"; }

/* A stable description of dataset part p's indices: the dataset's .idx
 * identity (real path, size, mtime, inode) and .bin size, the part, T,
 * the samples and the seed. */
static char *part_desc(const Ctx *c, const Part *p, const double *w) {
  StrBuf b = {0};
  char path[PATH_MAX + 8], real[PATH_MAX + 8];
  struct stat si = {0}, sb = {0};
  snprintf(path, sizeof path, "%s.idx", p->prefix);
  if (!realpath(path, real)) memcpy(real, path, sizeof real);
  stat(path, &si);
  snprintf(path, sizeof path, "%s.bin", p->prefix);
  stat(path, &sb);
  char wb[3][40];
  for (int i = 0; i < 3; i++) ts_fmt_double(wb[i], sizeof wb[i], w[i]);
  sb_printf(&b, "tessera gpt sample indices v1\nidx %s\nidx size %lld mtime %lld.%09ld inode %llu\n"
            "bin size %lld\nsplit %s,%s,%s part %s sequences [%lld, %lld)\nseq_len %lld\nsamples %lld\nseed %llu\n",
            real, (long long)si.st_size, (long long)si.st_mtim.tv_sec, (long)si.st_mtim.tv_nsec,
            (unsigned long long)si.st_ino, (long long)sb.st_size, wb[0], wb[1], wb[2], rt_split_name[c->o->part],
            (long long)p->beg, (long long)p->end, (long long)c->o->seq_len, (long long)p->need,
            (unsigned long long)c->o->seed);
  return b.p;
}

/* path = DIR/NAME.PART.KEY.gptidx */
static void cache_path(const Ctx *c, const char *name, uint64_t key, char *out, size_t n) {
  const char *base = strrchr(name, '/');
  base = base ? base + 1 : name;
  snprintf(out, n, "%s/%s.%s.%016llx.gptidx", c->dir, base, rt_split_name[c->o->part], (unsigned long long)key);
}

/* Writes a cache file; a failure is an error with an explicit folder and
 * a warning (once) without.  1 written, 0 not (no folder, or warned), -1. */
static int cache_store(Ctx *c, const char *path, uint64_t key, const char *desc, int narr, const int64_t *const *arr,
                       const int64_t *cnt, char *err, size_t errlen) {
  if (!c->dir[0]) return 0;
  if (cache_write(path, key, desc, narr, arr, cnt) == 0) return 1;
  if (c->explicit_dir) return ts_errf(err, errlen, "%s %s: %s", c->o->cache_flag, c->dir, ts_io_error());
  if (!c->warned && c->note)
    fprintf(c->note, "data: the sample indices are not cached (%s); %s DIR names a folder for them\n", ts_io_error(),
            c->o->cache_flag ? c->o->cache_flag : "--data-cache-path");
  c->warned = 1;
  return 0;
}

/* The indices of part p: from the cache, or built (and cached). */
static int part_indices(Ctx *c, RtGptData *d, Part *p, const double *w, char *err, size_t errlen) {
  char *desc = part_desc(c, p, w), path[PATH_MAX + 256] = "", why[256];
  uint64_t key = ts_hash64(desc, strlen(desc), 0);
  double t0 = ts_now_s();
  RtGptShape s;
  char msg[512];
  if (rt_gpt_index_shape(p->len, p->beg, p->end, c->o->seq_len, p->need, &s, msg, sizeof msg) != 0) {
    free(desc);
    return ts_errf(err, errlen, "%s %s: the %s part of --split (sequences [%lld, %lld) of %lld): %s", flag_of(c->o),
                   p->prefix, rt_split_name[c->o->part], (long long)p->beg, (long long)p->end,
                   (long long)p->ds.n_seq, msg);
  }
  int64_t cnt[3] = {s.n_doc, 2 * (s.n_sample + 1), s.n_sample};
  int got = 0, stored = 0;
  if (c->dir[0]) {
    cache_path(c, p->prefix, key, path, sizeof path);
    const int64_t *arr[3];
    got = cache_load(path, key, desc, 3, cnt, &p->ix.map, &p->ix.map_len, arr, why, sizeof why);
    if (got == 1) {
      p->ix.epochs = s.epochs, p->ix.tokens_per_epoch = s.tpe, p->ix.separate_last = s.separate;
      p->ix.n_doc = s.n_doc, p->ix.doc = arr[0];
      p->ix.n_sample = s.n_sample, p->ix.sample = arr[1], p->ix.shuffle = arr[2];
    } else if (got < 0 && c->note) {
      fprintf(c->note, "data: cache file %s is damaged (%s): rebuilding it\n", path, why);
    }
  }
  if (got != 1) {
    if (rt_gpt_index_build(p->len, p->beg, p->end, c->o->seq_len, p->need, c->o->seed, &p->ix, msg,
                           sizeof msg) != 0) {
      free(desc);
      return ts_errf(err, errlen, "%s %s: %s", flag_of(c->o), p->prefix, msg);
    }
    const int64_t *arr[3] = {p->ix.doc, p->ix.sample, p->ix.shuffle};
    if (path[0] && (stored = cache_store(c, path, key, desc, 3, arr, cnt, err, errlen)) < 0) { free(desc); return -1; }
  }
  double dt = ts_now_s() - t0;
  got == 1 ? d->loaded++ : d->built++;
  d->seconds += dt;
  if (c->note)
    fprintf(c->note, "data: %s %s: %lld samples (%lld epoch%s of %lld tokens) %s in %.3f s\n", rt_split_name[c->o->part],
            p->prefix, (long long)s.n_sample, (long long)s.epochs, s.epochs == 1 ? "" : "s", (long long)s.tpe,
            got == 1 ? "loaded from the cache" : stored ? "built and cached" : "built", dt);
  free(desc);
  return 0;
}

/* The blend's weights: given (normalized), or the parts' samples per epoch. */
static int blend_weights(const Ctx *c, RtGptData *d, double *w, char *err, size_t errlen) {
  double sum = 0;
  for (int i = 0; i < d->n; i++) {
    Part *p = &d->p[i];
    if (c->o->weight) w[i] = c->o->weight[i];
    else {
      int64_t tpe = 0;
      for (int64_t k = p->beg; k < p->end; k++) tpe += p->len[k];
      w[i] = (double)(tpe > 0 ? (tpe - 1) / d->T : 0);
    }
    if (!(w[i] >= 0) || !isfinite(w[i]))
      return ts_errf(err, errlen, "%s: the weight of %s is %g; weights are numbers >= 0", flag_of(c->o), p->prefix, w[i]);
    sum += w[i];
  }
  if (!(sum > 0)) return ts_errf(err, errlen, "%s: every dataset has weight 0", flag_of(c->o));
  for (int i = 0; i < d->n; i++) w[i] /= sum;
  return 0;
}

/* The blend of num_samples samples: from the cache or built. */
static int blend_indices(Ctx *c, RtGptData *d, const double *w, const uint64_t *keys, char *err, size_t errlen) {
  StrBuf b = {0};
  int64_t N = c->o->num_samples;
  sb_printf(&b, "tessera gpt blend v1\nsamples %lld\n", (long long)N);
  for (int i = 0; i < d->n; i++) {
    char wb[40];
    ts_fmt_double(wb, sizeof wb, w[i]);
    sb_printf(&b, "dataset %016llx weight %s\n", (unsigned long long)keys[i], wb);
  }
  uint64_t key = ts_hash64(b.p, strlen(b.p), 0);
  char path[PATH_MAX + 256] = "", why[256];
  int64_t cnt[2] = {N, N};
  int got = 0;
  if (c->dir[0]) {
    cache_path(c, "blend", key, path, sizeof path);
    const int64_t *arr[2];
    got = cache_load(path, key, b.p, 2, cnt, &d->bmap, &d->bmap_len, arr, why, sizeof why);
    if (got == 1) d->bds = (int64_t *)arr[0], d->bsample = (int64_t *)arr[1];
    else if (got < 0 && c->note) fprintf(c->note, "data: cache file %s is damaged (%s): rebuilding it\n", path, why);
  }
  int rc = 0;
  if (got != 1) {
    d->bown = d->bds = ts_xmalloc((size_t)(2 * N > 0 ? 2 * N : 1) * sizeof *d->bds);
    d->bsample = d->bds + N;
    rt_gpt_blend(w, d->n, N, d->bds, d->bsample);
    const int64_t *arr[2] = {d->bds, d->bsample};
    if (path[0] && cache_store(c, path, key, b.p, 2, arr, cnt, err, errlen) < 0) rc = -1;
    d->built++;
  } else {
    d->loaded++;
  }
  free(b.p);
  return rc;
}

/* The folder of the cache: the flag's, or <first dataset's folder>/cache. */
static int cache_dir(Ctx *c, char *err, size_t errlen) {
  const RtGptDataOpts *o = c->o;
  if (o->cache_dir) {
    c->explicit_dir = 1;
    if (make_dirs(o->cache_dir) != 0)
      return ts_errf(err, errlen, "%s %s: cannot make the folder: %s", o->cache_flag ? o->cache_flag : "--data-cache-path",
                     o->cache_dir, strerror(errno));
    snprintf(c->dir, sizeof c->dir, "%s", o->cache_dir);
    return 0;
  }
  const char *slash = strrchr(o->prefix[0], '/');
  if (slash) snprintf(c->dir, sizeof c->dir, "%.*s/cache", (int)(slash - o->prefix[0]), o->prefix[0]);
  else snprintf(c->dir, sizeof c->dir, "cache");
  if (make_dirs(c->dir) != 0) {
    if (c->note)
      fprintf(c->note, "data: the sample indices are not cached (cannot make %s: %s); %s DIR names a folder for "
              "them\n", c->dir, strerror(errno), o->cache_flag ? o->cache_flag : "--data-cache-path");
    c->dir[0] = 0;
  }
  return 0;
}

/* Opens dataset i and finds its part of the split. */
static int open_part(Ctx *c, RtGptData *d, int i, const double *sw, char *err, size_t errlen) {
  const RtGptDataOpts *o = c->o;
  Part *p = &d->p[i];
  char msg[1024];
  p->prefix = ts_xstrdup(o->prefix[i]);
  if (rt_indexed_open(&p->ds, p->prefix, msg, sizeof msg) != 0)
    return ts_errf(err, errlen, "%s %s: %s", flag_of(o), p->prefix, msg);
  p->open = 1;
  p->len = ts_xmalloc((size_t)(p->ds.n_seq > 0 ? p->ds.n_seq : 1) * sizeof *p->len);
  if (p->ds.n_seq > 0) memcpy(p->len, p->ds.seq_len_at, (size_t)p->ds.n_seq * sizeof *p->len);
  int64_t beg[RT_SPLIT_COUNT], end[RT_SPLIT_COUNT];
  rt_gpt_split_ranges(sw, p->ds.n_seq, beg, end);
  p->beg = beg[o->part], p->end = end[o->part];
  if (p->end <= p->beg)
    return ts_errf(err, errlen, "--split %s leaves the %s part of %s empty: of its %lld sequences train gets "
                   "[%lld, %lld), valid [%lld, %lld), test [%lld, %lld); give %s a larger weight or use a larger "
                   "dataset", o->split ? o->split : "969,30,1", rt_split_name[o->part], p->prefix,
                   (long long)p->ds.n_seq, (long long)beg[0], (long long)end[0], (long long)beg[1], (long long)end[1],
                   (long long)beg[2], (long long)end[2], rt_split_name[o->part]);
  return 0;
}

RtGptData *rt_gpt_data_open(const RtGptDataOpts *o, FILE *note, char *err, size_t errlen) {
  Ctx c = {.o = o, .note = note};
  double sw[RT_SPLIT_COUNT];
  char msg[512];
  if (o->n < 1) { ts_errf(err, errlen, "%s: no dataset given", flag_of(o)); return NULL; }
  if (rt_gpt_split_parse(o->split ? o->split : "969,30,1", sw, msg, sizeof msg) != 0) {
    ts_errf(err, errlen, "--split %s", msg);
    return NULL;
  }
  RtGptData *d = ts_xcalloc(1, sizeof *d);
  d->n = o->n;
  d->T = o->seq_len;
  d->p = ts_xcalloc((size_t)o->n, sizeof *d->p);
  double *w = ts_xcalloc((size_t)o->n, sizeof *w);
  uint64_t *keys = ts_xcalloc((size_t)o->n, sizeof *keys);
  int rc = cache_dir(&c, err, errlen);
  for (int i = 0; rc == 0 && i < o->n; i++) rc = open_part(&c, d, i, sw, err, errlen);
  if (rc == 0 && o->n > 1) rc = blend_weights(&c, d, w, err, errlen);
  if (rc == 0 && o->n > 1) {
    /* a part's own indices depend on its share of the blend, which the
     * blend computes: the blend's key uses the parts' identities without it */
    for (int i = 0; i < o->n; i++) {
      Part tmp = d->p[i];
      tmp.need = -1;
      char *desc = part_desc(&c, &tmp, sw);
      keys[i] = ts_hash64(desc, strlen(desc), 0);
      free(desc);
    }
    rc = blend_indices(&c, d, w, keys, err, errlen);
    for (int64_t k = 0; rc == 0 && k < o->num_samples; k++) {
      int64_t ds = d->bds[k];
      if (ds < 0 || ds >= o->n) { rc = ts_errf(err, errlen, "the blend index names dataset %lld (a bug)", (long long)ds); break; }
      if (d->bsample[k] + 1 > d->p[ds].need) d->p[ds].need = d->bsample[k] + 1;
    }
  } else if (rc == 0) {
    d->p[0].need = o->num_samples;
  }
  for (int i = 0; rc == 0 && i < o->n; i++) rc = part_indices(&c, d, &d->p[i], sw, err, errlen);
  if (rc == 0) d->size = o->n > 1 ? o->num_samples : d->p[0].ix.n_sample;
  free(w);
  free(keys);
  if (rc != 0) { rt_gpt_data_free(d); return NULL; }
  return d;
}

void rt_gpt_data_free(RtGptData *d) {
  if (!d) return;
  for (int i = 0; i < d->n; i++) {
    rt_gpt_index_free(&d->p[i].ix);
    if (d->p[i].open) rt_indexed_close(&d->p[i].ds);
    free(d->p[i].prefix);
    free(d->p[i].len);
  }
  free(d->p);
  free(d->bown);
  if (d->bmap) munmap(d->bmap, d->bmap_len);
  free(d);
}

int64_t rt_gpt_data_size(const RtGptData *d) { return d->size; }

void rt_gpt_data_stats(const RtGptData *d, int *loaded, int *built, double *seconds) {
  if (loaded) *loaded = d->loaded;
  if (built) *built = d->built;
  if (seconds) *seconds = d->seconds;
}

/* ---- reading a sample ---- */

static int damaged(const Part *p, int64_t j, char *err, size_t errlen) {
  return ts_errf(err, errlen, "the sample indices of %s do not fit the dataset at sample %lld (the dataset changed "
                 "under its cache file?): remove the cache file to rebuild them", p->prefix, (long long)j);
}

/* Ids in out[0, n) (sequence s from position from) against [0, vocab). */
static int check_ids(const Part *p, int64_t s, int64_t from, const int32_t *out, int64_t n, int64_t vocab, char *err,
                     size_t errlen) {
  for (int64_t t = 0; t < n; t++)
    if (out[t] < 0 || (vocab > 0 && out[t] >= vocab))
      return ts_errf(err, errlen, "dataset %s: sequence %lld holds token id %d at position %lld, %s", p->prefix,
                     (long long)s, out[t], (long long)(from + t),
                     out[t] < 0 ? "a negative id" : "at or above the model's vocabulary");
  return 0;
}

int rt_gpt_data_sample(const RtGptData *d, int64_t i, int64_t vocab, int32_t *out, char *err, size_t errlen) {
  if (i < 0 || i >= d->size)
    return ts_errf(err, errlen, "sample %lld is outside the %lld samples the indices were built for", (long long)i,
                   (long long)d->size);
  int ds = d->n > 1 ? (int)d->bds[i] : 0;
  int64_t j = d->n > 1 ? d->bsample[i] : i;
  const Part *p = &d->p[ds];
  const RtGptIndex *ix = &p->ix;
  if (j < 0 || j >= ix->n_sample) return damaged(p, j, err, errlen);
  int64_t k = ix->shuffle[j];
  if (k < 0 || k >= ix->n_sample) return damaged(p, j, err, errlen);
  int64_t p0 = ix->sample[2 * k], o0 = ix->sample[2 * k + 1], p1 = ix->sample[2 * k + 2], o1 = ix->sample[2 * k + 3];
  if (p0 < 0 || p1 < p0 || p1 >= ix->n_doc) return damaged(p, j, err, errlen);
  int64_t got = 0, want = d->T + 1;
  for (int64_t q = p0; q <= p1; q++) {
    int64_t s = ix->doc[q];
    if (s < 0 || s >= p->ds.n_seq) return damaged(p, j, err, errlen);
    int64_t len = p->len[s], from = q == p0 ? o0 : 0, to = q == p1 ? o1 + 1 : len;
    if (from < 0 || to < from || to > len || got + (to - from) > want) return damaged(p, j, err, errlen);
    rt_indexed_read(&p->ds, s, from, to - from, out + got);
    if (check_ids(p, s, from, out + got, to - from, vocab, err, errlen) != 0) return -1;
    got += to - from;
  }
  if (got != want) return damaged(p, j, err, errlen);
  return 0;
}
