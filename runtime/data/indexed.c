/* indexed.c - Megatron's indexed dataset, PREFIX.bin + PREFIX.idx
 * (indexed.h; docs/data.md "Indexed datasets").
 *
 * The reader maps both files and checks the whole index before anything
 * reads through it, so every later access (rt_indexed_get / read) is in
 * bounds by construction and needs no check of its own.  The checks cost
 * one pass over the index (20 bytes per sequence), never over .bin.
 * The writer streams .bin through ir/io.c's TsOut and keeps only the
 * lengths and the document index in memory. */
#include "indexed.h"
#include "ir/util.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The format is little-endian and the accessors load it as it lies. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "indexed.c reads little-endian files natively");

static const unsigned char IDX_MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { IDX_HEADER = 34 };   /* magic 9 + version 8 + dtype 1 + counts 8 + 8 */

size_t rt_idx_dtype_size(int code) {
  switch (code) {
  case RT_IDX_U8: case RT_IDX_I8: return 1;
  case RT_IDX_I16: case RT_IDX_U16: return 2;
  case RT_IDX_I32: case RT_IDX_F32: return 4;
  case RT_IDX_I64: case RT_IDX_F64: return 8;
  default: return 0;
  }
}

static const char *dtype_name(int code) {
  static const char *names[] = {"?", "u8", "i8", "i16", "i32", "i64", "f64", "f32", "u16"};
  return code >= 1 && code <= 8 ? names[code] : "?";
}

/* Megatron's choice (megatron/core/datasets/indexed_dataset.py): u16 below
 * 65500 ids, else i32 */
int rt_idx_dtype_for_vocab(int64_t n) { return n < 65500 ? RT_IDX_U16 : RT_IDX_I32; }

static uint64_t load_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* ---- reading ---- */

/* Maps path read-only (a regular file; an empty one maps to NULL). */
static int map_file(const char *path, const unsigned char **p, size_t *len, char *err, size_t errlen) {
  *p = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_NOCTTY);
  if (fd < 0) return ts_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ts_errf(err, errlen, "%s: not a regular file", path);
  }
  if (st.st_size > 0) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      return ts_errf(err, errlen, "%s: cannot map: %s", path, strerror(e));
    }
    *p = m;
    *len = (size_t)st.st_size;
  }
  close(fd);   /* the mapping keeps the file */
  ts_note_input(path);
  return 0;
}

/* The header: magic, version, dtype, counts against the size of .idx. */
static int check_header(RtIndexed *d, const char *path, char *err, size_t errlen) {
  if (d->idx_len < IDX_HEADER)
    return ts_errf(err, errlen, "%s: truncated: %zu bytes, the header alone takes %d", path, d->idx_len, IDX_HEADER);
  if (memcmp(d->idx, IDX_MAGIC, 9) != 0)
    return ts_errf(err, errlen, "%s: not a Megatron indexed dataset index (the first 9 bytes are not \"MMIDIDX\\0\\0\")",
                   path);
  uint64_t version = load_u64(d->idx + 9);
  if (version != 1)
    return ts_errf(err, errlen, "%s: version %llu; only version 1 is known", path, (unsigned long long)version);
  d->dtype = d->idx[17];
  d->elem = rt_idx_dtype_size(d->dtype);
  if (!d->elem) return ts_errf(err, errlen, "%s: unknown dtype code %d (known: 1 to 8)", path, d->dtype);
  if (d->dtype == RT_IDX_F32 || d->dtype == RT_IDX_F64)
    return ts_errf(err, errlen, "%s: dtype code %d (%s) is not an integer type; token ids are integers", path,
                   d->dtype, dtype_name(d->dtype));
  uint64_t n = load_u64(d->idx + 18), m = load_u64(d->idx + 26);
  /* 20 bytes per sequence and 8 per document entry: bound each count by
   * the file before multiplying, so the sum cannot overflow */
  size_t room = d->idx_len - IDX_HEADER;
  if (n > room / 12 || m > room / 8)
    return ts_errf(err, errlen, "%s: truncated: %llu sequences and %llu document index entries need more than its %zu bytes",
                   path, (unsigned long long)n, (unsigned long long)m, d->idx_len);
  if (12 * n + 8 * m != room) {
    int multi = 13 * n + 8 * m == room;   /* n <= room / 12 keeps this from overflowing */
    return ts_errf(err, errlen, "%s: %llu sequences and %llu document index entries take %llu bytes, the file has %zu%s",
                   path, (unsigned long long)n, (unsigned long long)m,
                   (unsigned long long)(IDX_HEADER + 12 * n + 8 * m), d->idx_len,
                   multi ? " (a multimodal index, with a mode byte per sequence: not supported)" : "");
  }
  if (m < 1) return ts_errf(err, errlen, "%s: the document index is empty (it holds at least the 0 it starts with)", path);
  d->n_seq = (int64_t)n;
  d->n_doc = (int64_t)m - 1;
  d->seq_len_at = d->idx + IDX_HEADER;
  d->seq_ptr_at = d->seq_len_at + 4 * n;
  d->doc_idx_at = d->seq_ptr_at + 8 * n;
  return 0;
}

/* Lengths non-negative, pointers their running sum from 0, .bin exactly
 * as long as the sequences. */
static int check_sequences(RtIndexed *d, const char *ipath, const char *bpath, char *err, size_t errlen) {
  uint64_t at = 0, elem = d->elem;
  for (int64_t s = 0; s < d->n_seq; s++) {
    int32_t len = rt_indexed_seq_len(d, s);
    int64_t ptr = rt_indexed_seq_ptr(d, s);
    if (len < 0) return ts_errf(err, errlen, "%s: sequence %lld has length %d", ipath, (long long)s, len);
    if (ptr < 0 || (uint64_t)ptr != at)
      return ts_errf(err, errlen, "%s: sequence %lld starts at byte %lld of .bin, but the sequences before it end at %llu",
                     ipath, (long long)s, (long long)ptr, (unsigned long long)at);
    at += (uint64_t)len * elem;
    if (at > d->bin_len)
      return ts_errf(err, errlen, "%s: sequence %lld (%d %s elements at byte %lld) ends at byte %llu, past the end of %s "
                     "(%zu bytes)", ipath, (long long)s, len, dtype_name(d->dtype), (long long)ptr,
                     (unsigned long long)at, bpath, d->bin_len);
  }
  if (at != d->bin_len)
    return ts_errf(err, errlen, "%s: %zu bytes, but its index %s describes %llu (%lld sequences of %s)", bpath,
                   d->bin_len, ipath, (unsigned long long)at, (long long)d->n_seq, dtype_name(d->dtype));
  return 0;
}

/* 0 first, never decreasing, the sequence count last. */
static int check_documents(RtIndexed *d, const char *path, char *err, size_t errlen) {
  int64_t first = rt_indexed_doc_idx(d, 0), last = rt_indexed_doc_idx(d, d->n_doc);
  if (first != 0) return ts_errf(err, errlen, "%s: the document index starts at %lld, not 0", path, (long long)first);
  for (int64_t i = 1; i <= d->n_doc; i++) {
    int64_t a = rt_indexed_doc_idx(d, i - 1), b = rt_indexed_doc_idx(d, i);
    if (b < a)
      return ts_errf(err, errlen, "%s: the document index decreases: entry %lld is %lld, entry %lld is %lld", path,
                     (long long)(i - 1), (long long)a, (long long)i, (long long)b);
  }
  if (last != d->n_seq)
    return ts_errf(err, errlen, "%s: the document index ends at %lld, not at the sequence count %lld", path,
                   (long long)last, (long long)d->n_seq);
  return 0;
}

/* "PREFIX.idx" and "PREFIX.bin" (heap). */
static void pair_paths(const char *prefix, char **ipath, char **bpath) {
  size_t n = strlen(prefix) + 8;
  *ipath = ts_xmalloc(n);
  *bpath = ts_xmalloc(n);
  snprintf(*ipath, n, "%s.idx", prefix);
  snprintf(*bpath, n, "%s.bin", prefix);
}

/* Every check on d->idx / d->bin, set by the caller. */
static int check_all(RtIndexed *d, const char *ipath, const char *bpath, char *err, size_t errlen) {
  int rc = check_header(d, ipath, err, errlen);
  if (rc == 0) rc = check_sequences(d, ipath, bpath, err, errlen);
  if (rc == 0) rc = check_documents(d, ipath, err, errlen);
  if (rc == 0) d->n_tok = (int64_t)(d->bin_len / d->elem);
  return rc;
}

int rt_indexed_open(RtIndexed *d, const char *prefix, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->mapped = 1;
  char *ipath, *bpath;
  pair_paths(prefix, &ipath, &bpath);
  /* .idx alone first: its header says whether .bin is worth opening */
  int rc = map_file(ipath, &d->idx, &d->idx_len, err, errlen);
  if (rc == 0) rc = check_header(d, ipath, err, errlen);
  if (rc == 0) rc = map_file(bpath, &d->bin, &d->bin_len, err, errlen);
  if (rc == 0) rc = check_all(d, ipath, bpath, err, errlen);
  if (rc != 0) rt_indexed_close(d);
  free(ipath);
  free(bpath);
  return rc;
}

int rt_indexed_from_memory(RtIndexed *d, const void *idx, size_t idx_len, const void *bin, size_t bin_len,
                           const char *name, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->idx = idx;
  d->idx_len = idx_len;
  d->bin = bin_len ? bin : NULL;
  d->bin_len = bin_len;
  char *ipath, *bpath;
  pair_paths(name, &ipath, &bpath);
  int rc = check_all(d, ipath, bpath, err, errlen);
  if (rc != 0) memset(d, 0, sizeof *d);
  free(ipath);
  free(bpath);
  return rc;
}

void rt_indexed_close(RtIndexed *d) {
  if (d->mapped && d->idx) munmap((void *)d->idx, d->idx_len);
  if (d->mapped && d->bin) munmap((void *)d->bin, d->bin_len);
  memset(d, 0, sizeof *d);
}

/* Element k of .bin. */
static int64_t load_elem(const RtIndexed *d, int64_t k) {
  const unsigned char *p = d->bin + (size_t)k * d->elem;
  switch (d->dtype) {
  case RT_IDX_U8: return *p;
  case RT_IDX_I8: return (int8_t)*p;
  case RT_IDX_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
  case RT_IDX_I16: { int16_t v; memcpy(&v, p, 2); return v; }
  case RT_IDX_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  default: { int64_t v; memcpy(&v, p, 8); return v; }
  }
}

int64_t rt_indexed_get(const RtIndexed *d, int64_t s, int64_t i) {
  return load_elem(d, rt_indexed_seq_ptr(d, s) / (int64_t)d->elem + i);
}

void rt_indexed_read_at(const RtIndexed *d, int64_t tok, int64_t n, int32_t *out) {
  if (d->dtype == RT_IDX_U16) {   /* the common case, a loop the compiler vectorizes */
    const unsigned char *p = d->bin + (size_t)tok * 2;
    for (int64_t k = 0; k < n; k++) {
      uint16_t v;
      memcpy(&v, p + 2 * k, 2);
      out[k] = v;
    }
    return;
  }
  for (int64_t k = 0; k < n; k++) {
    int64_t v = load_elem(d, tok + k);
    out[k] = v >= INT32_MIN && v <= INT32_MAX ? (int32_t)v : -1;
  }
}

void rt_indexed_read(const RtIndexed *d, int64_t s, int64_t off, int64_t n, int32_t *out) {
  rt_indexed_read_at(d, rt_indexed_seq_ptr(d, s) / (int64_t)d->elem + off, n, out);
}

/* ---- writing ---- */
struct RtIndexedWriter {
  TsOut *bin;
  char *ipath, *bpath;
  int dtype;
  size_t elem;
  int64_t lo, hi;               /* the ids the dtype holds */
  VEC(int32_t) len;             /* per sequence */
  VEC(int64_t) doc;             /* the document index, from 0 */
  int64_t nseq;                 /* sequences (len.n as int64) */
  unsigned char *conv;          /* ids converted to the dtype */
  size_t conv_cap;
  int failed;
};

RtIndexedWriter *rt_indexed_create(const char *prefix, int dtype, char *err, size_t errlen) {
  if (!rt_idx_dtype_size(dtype) || dtype == RT_IDX_F32 || dtype == RT_IDX_F64) {
    ts_errf(err, errlen, "%s: dtype code %d is not an integer dtype of the format", prefix, dtype);
    return NULL;
  }
  RtIndexedWriter *w = ts_xcalloc(1, sizeof *w);
  pair_paths(prefix, &w->ipath, &w->bpath);
  /* .idx is checked now, so that a refused index path fails before a
   * multi-GB .bin is written */
  if (ts_check_output(w->ipath) != 0 || !(w->bin = ts_out_open(w->bpath))) {
    ts_errf(err, errlen, "%s", ts_io_error());
    rt_indexed_abort(w);
    return NULL;
  }
  w->dtype = dtype;
  w->elem = rt_idx_dtype_size(dtype);
  static const int64_t lo[] = {0, 0, -128, -32768, INT32_MIN, INT64_MIN, 0, 0, 0};
  static const int64_t hi[] = {0, 255, 127, 32767, INT32_MAX, INT64_MAX, 0, 0, 65535};
  w->lo = lo[dtype];
  w->hi = hi[dtype];
  int64_t zero = 0;
  VEC_PUSH(w->doc, zero);
  return w;
}

/* ids converted into w->conv in the dtype; -1 with err at the first that
 * does not fit. */
static int convert(RtIndexedWriter *w, const int32_t *ids, size_t n, char *err, size_t errlen) {
  if (n * w->elem > w->conv_cap) {
    w->conv_cap = n * w->elem * 2;
    w->conv = ts_xrealloc(w->conv, w->conv_cap);
  }
  for (size_t k = 0; k < n; k++) {
    int64_t v = ids[k];
    if (v < w->lo || v > w->hi || v < 0)
      return ts_errf(err, errlen, "%s: id %lld (element %zu of sequence %lld) does not fit the dtype %s (ids 0 to %lld)",
                     w->bpath, (long long)v, k, (long long)w->nseq, dtype_name(w->dtype), (long long)w->hi);
    unsigned char *p = w->conv + k * w->elem;
    switch (w->elem) {
    case 1: *p = (unsigned char)v; break;
    case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case 4: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    default: memcpy(p, &v, 8); break;
    }
  }
  return 0;
}

int rt_indexed_add(RtIndexedWriter *w, const int32_t *ids, size_t n, char *err, size_t errlen) {
  if (w->failed) return ts_errf(err, errlen, "%s: an earlier write failed", w->bpath);
  if (n > INT32_MAX) {
    w->failed = 1;
    return ts_errf(err, errlen, "%s: a sequence of %zu elements; the index holds lengths below 2^31", w->bpath, n);
  }
  if (w->len.n >= INT32_MAX - 1) {
    w->failed = 1;
    return ts_errf(err, errlen, "%s: more than 2^31 sequences", w->bpath);
  }
  if (convert(w, ids, n, err, errlen) != 0) { w->failed = 1; return -1; }
  if (ts_out_write(w->bin, w->conv, n * w->elem) != 0) {
    w->failed = 1;
    return ts_errf(err, errlen, "%s", ts_io_error());
  }
  int32_t len = (int32_t)n;
  VEC_PUSH(w->len, len);
  w->nseq++;
  return 0;
}

void rt_indexed_end_doc(RtIndexedWriter *w) {
  if (w->doc.n >= INT32_MAX - 1) TS_DIE("%s: more than 2^31 documents", w->ipath);
  VEC_PUSH(w->doc, w->nseq);
}

/* .idx through the same streaming writer: header, lengths, pointers (the
 * running sum, computed here), document index. */
static int write_index(RtIndexedWriter *w, TsOut *o) {
  unsigned char h[IDX_HEADER];
  uint64_t version = 1, n = (uint64_t)w->nseq, m = (uint64_t)w->doc.n;
  memcpy(h, IDX_MAGIC, 9);
  memcpy(h + 9, &version, 8);
  h[17] = (unsigned char)w->dtype;
  memcpy(h + 18, &n, 8);
  memcpy(h + 26, &m, 8);
  int rc = ts_out_write(o, h, sizeof h);
  if (rc == 0 && n) rc = ts_out_write(o, w->len.a, 4 * n);
  int64_t ptr = 0;
  for (int64_t s = 0; rc == 0 && s < w->nseq; s++) {
    rc = ts_out_write(o, &ptr, 8);
    ptr += (int64_t)w->len.a[s] * (int64_t)w->elem;
  }
  if (rc == 0) rc = ts_out_write(o, w->doc.a, 8 * m);
  return rc;
}

int rt_indexed_finish(RtIndexedWriter *w, char *err, size_t errlen) {
  if (w->failed) {
    ts_errf(err, errlen, "%s: an earlier write failed", w->bpath);
    rt_indexed_abort(w);
    return -1;
  }
  /* a trailing sequence outside any document would be lost by readers */
  if (w->doc.a[w->doc.n - 1] != w->nseq) rt_indexed_end_doc(w);
  TsOut *idx = ts_out_open(w->ipath);
  /* both files complete and synced before either is renamed: what a crash
   * can leave is the old pair, or the new .bin with the old .idx for the
   * instant between the two renames (which the reader's size checks
   * refuse), never a half-written file */
  int rc = idx ? 0 : -1;
  if (rc == 0) rc = write_index(w, idx);
  if (rc == 0) rc = ts_out_close(idx);
  if (rc == 0) rc = ts_out_close(w->bin);
  if (rc == 0) { rc = ts_out_commit(w->bin); w->bin = NULL; }
  if (rc == 0) { rc = ts_out_commit(idx); idx = NULL; }
  if (rc != 0) ts_errf(err, errlen, "%s", ts_io_error());
  if (idx) ts_out_abort(idx);
  rt_indexed_abort(w);
  return rc;
}

void rt_indexed_abort(RtIndexedWriter *w) {
  if (!w) return;
  ts_out_abort(w->bin);
  free(w->ipath);
  free(w->bpath);
  free(w->len.a);
  free(w->doc.a);
  free(w->conv);
  free(w);
}
