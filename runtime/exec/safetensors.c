/* safetensors.c - the safetensors reader and writer of safetensors.h. */
#include "safetensors.h"
#include "ir/json.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; size_t size; } g_dtypes[RT_ST_DTYPE_COUNT] = {
  [RT_ST_BOOL] = {"BOOL", 1}, [RT_ST_U8] = {"U8", 1},     [RT_ST_I8] = {"I8", 1},       [RT_ST_I16] = {"I16", 2},
  [RT_ST_U16] = {"U16", 2},   [RT_ST_F16] = {"F16", 2},   [RT_ST_BF16] = {"BF16", 2},   [RT_ST_I32] = {"I32", 4},
  [RT_ST_U32] = {"U32", 4},   [RT_ST_F32] = {"F32", 4},   [RT_ST_F64] = {"F64", 8},     [RT_ST_I64] = {"I64", 8},
  [RT_ST_U64] = {"U64", 8},   [RT_ST_F8_E4M3] = {"F8_E4M3", 1}, [RT_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *rt_st_dtype_name(RtStDtype d) { return (unsigned)d < RT_ST_DTYPE_COUNT ? g_dtypes[d].name : "?"; }
size_t rt_st_dtype_size(RtStDtype d) { return (unsigned)d < RT_ST_DTYPE_COUNT ? g_dtypes[d].size : 0; }
int rt_st_dtype_is_float(RtStDtype d) { return d == RT_ST_F64 || d == RT_ST_F32 || d == RT_ST_F16 || d == RT_ST_BF16; }

static int64_t numel_of(const RtStOut *t) {
  int64_t n = 1;
  for (int d = 0; d < t->rank; d++) n *= t->dim[d];
  return n;
}

typedef struct { int64_t begin, end; int i; } Range;
static int by_begin(const void *a, const void *b) {
  const Range *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The tensor entry `key: v` of the header into t; data of dlen bytes. */
static int parse_entry(RtStFile *f, const char *key, const TsJson *v, size_t dlen, RtStTensor *t, Range *r,
                       char *err, size_t errlen) {
  const char *w = f->path;
  if (!key[0]) return ts_errf(err, errlen, "%s: a tensor with an empty name", w);
  if (v->kind != TS_JSON_OBJECT) return ts_errf(err, errlen, "%s: tensor '%s' is %s, not an object", w, key, ts_json_kind_name(v->kind));
  const TsJson *dt = ts_json_get(v, "dtype"), *sh = ts_json_get(v, "shape"), *off = ts_json_get(v, "data_offsets");
  if (!dt || dt->kind != TS_JSON_STRING || !sh || sh->kind != TS_JSON_ARRAY || !off || off->kind != TS_JSON_ARRAY)
    return ts_errf(err, errlen, "%s: tensor '%s' lacks a string \"dtype\", an array \"shape\" or an array \"data_offsets\"", w, key);
  t->name = key;
  t->dtype = RT_ST_DTYPE_COUNT;
  for (int d = 0; d < RT_ST_DTYPE_COUNT; d++)
    if (!strcmp(dt->str, g_dtypes[d].name)) t->dtype = (RtStDtype)d;
  if (t->dtype == RT_ST_DTYPE_COUNT) return ts_errf(err, errlen, "%s: tensor '%s' has dtype '%s', which is not a safetensors dtype", w, key, dt->str);
  if (sh->n > RT_ST_MAX_RANK) return ts_errf(err, errlen, "%s: tensor '%s' has %d dims; at most %d are read", w, key, sh->n, RT_ST_MAX_RANK);
  t->rank = sh->n;
  t->numel = 1;
  for (int d = 0; d < sh->n; d++) {
    const TsJson *x = sh->items[d];
    if (x->kind != TS_JSON_NUMBER || !x->is_int || x->inum < 0)
      return ts_errf(err, errlen, "%s: tensor '%s': shape entry %d is not a non-negative integer", w, key, d);
    t->dim[d] = x->inum;
    if (x->inum && t->numel > (INT64_MAX / 8) / x->inum)
      return ts_errf(err, errlen, "%s: tensor '%s': its shape has more elements than any file", w, key);
    t->numel *= x->inum;
  }
  if (off->n != 2) return ts_errf(err, errlen, "%s: tensor '%s': data_offsets has %d entries, not 2", w, key, off->n);
  for (int k = 0; k < 2; k++)
    if (off->items[k]->kind != TS_JSON_NUMBER || !off->items[k]->is_int || off->items[k]->inum < 0)
      return ts_errf(err, errlen, "%s: tensor '%s': data_offsets are not non-negative integers", w, key);
  r->begin = off->items[0]->inum;
  r->end = off->items[1]->inum;
  if (r->begin > r->end || (uint64_t)r->end > dlen)
    return ts_errf(err, errlen, "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu bytes of data", w, key,
                   (long long)r->begin, (long long)r->end, dlen);
  int64_t need = t->numel * (int64_t)rt_st_dtype_size(t->dtype);
  if (r->end - r->begin != need)
    return ts_errf(err, errlen, "%s: tensor '%s' is %s with %lld elements (%lld bytes) but its data_offsets span %lld bytes",
                   w, key, g_dtypes[t->dtype].name, (long long)t->numel, (long long)need, (long long)(r->end - r->begin));
  t->bytes = (size_t)need;
  return 0;
}

int rt_st_parse(RtStFile *f, const void *buf, size_t len, const char *what, char *err, size_t errlen) {
  if (!f->arena.head) arena_init(&f->arena);
  f->path = arena_strdup(&f->arena, what ? what : "<safetensors>");
  const unsigned char *b = buf;
  const char *w = f->path;
  if (len < 8) return ts_errf(err, errlen, "%s: %zu bytes, too short for a safetensors file", w, len);
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
  if (n > RT_ST_MAX_HEADER || n > len - 8)
    return ts_errf(err, errlen, "%s: its header length %llu %s", w, (unsigned long long)n,
                   n > RT_ST_MAX_HEADER ? "is over the format's limit of 100 MB (not a safetensors file?)"
                                        : "runs past the end of the file (truncated, or not a safetensors file)");
  TsJson *h = ts_json_parse(&f->arena, (const char *)b + 8, (size_t)n, w, err, errlen);
  if (!h) return -1;
  if (h->kind != TS_JSON_OBJECT) return ts_errf(err, errlen, "%s: the header is %s, not an object", w, ts_json_kind_name(h->kind));
  const unsigned char *data = b + 8 + n;
  size_t dlen = len - 8 - (size_t)n;
  f->a = arena_alloc(&f->arena, (size_t)(h->n ? h->n : 1) * sizeof *f->a);
  Range *r = ts_xmalloc((size_t)(h->n ? h->n : 1) * sizeof *r);
  int rc = 0;
  f->n = 0;
  for (int i = 0; i < h->n && rc == 0; i++) {
    if (!strcmp(h->keys[i], "__metadata__")) {
      const TsJson *m = h->items[i];
      if (m->kind != TS_JSON_OBJECT) { rc = ts_errf(err, errlen, "%s: __metadata__ is not an object", w); break; }
      for (int k = 0; k < m->n && rc == 0; k++)
        if (m->items[k]->kind != TS_JSON_STRING) rc = ts_errf(err, errlen, "%s: __metadata__.%s is not a string", w, m->keys[k]);
      const TsJson *fm = ts_json_get(m, "format");
      f->format = fm && fm->kind == TS_JSON_STRING ? fm->str : NULL;
      continue;
    }
    RtStTensor *t = &f->a[f->n];
    if (parse_entry(f, h->keys[i], h->items[i], dlen, t, &r[f->n], err, errlen)) { rc = -1; break; }
    t->data = data + r[f->n].begin;
    r[f->n].i = f->n;
    f->n++;
  }
  if (rc == 0) {   /* the ranges tile [0, dlen) */
    qsort(r, (size_t)f->n, sizeof *r, by_begin);
    int64_t at = 0;
    for (int i = 0; i < f->n && rc == 0; i++) {
      if (r[i].begin != at)
        rc = ts_errf(err, errlen, "%s: tensor '%s' starts at byte %lld of the data where %lld was expected (the tensors "
                     "overlap or leave a hole)", w, f->a[r[i].i].name, (long long)r[i].begin, (long long)at);
      at = r[i].end;
    }
    if (rc == 0 && (uint64_t)at != dlen)
      rc = ts_errf(err, errlen, "%s: the tensors cover %lld of the %zu bytes of data", w, (long long)at, dlen);
  }
  free(r);
  return rc;
}

int rt_st_open(RtStFile *f, const char *path, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    int e = errno;
    if (fd >= 0) close(fd);
    return ts_errf(err, errlen, "cannot read %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return ts_errf(err, errlen, "%s is not a regular file", path);
  }
  f->len = (size_t)st.st_size;
  if (f->len) {
    f->map = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
      f->map = NULL;
      int e = errno;
      close(fd);
      return ts_errf(err, errlen, "cannot map %s: %s", path, strerror(e));
    }
  }
  close(fd);
  if (rt_st_parse(f, f->map, f->len, path, err, errlen) != 0) {
    rt_st_close(f);
    return -1;
  }
  return 0;
}

void rt_st_close(RtStFile *f) {
  if (f->map) munmap(f->map, f->len);
  if (f->arena.head) arena_free(&f->arena);
  memset(f, 0, sizeof *f);
}

const RtStTensor *rt_st_find(const RtStFile *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->a[i].name, name)) return &f->a[i];
  return NULL;
}

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return h & 0x8000 ? -v : v;
}

double rt_st_get(const RtStTensor *t, int64_t i) {
  const unsigned char *p = t->data + (size_t)i * rt_st_dtype_size(t->dtype);
  switch (t->dtype) {
    case RT_ST_F64: { double d; memcpy(&d, p, 8); return d; }
    case RT_ST_F32: { float x; memcpy(&x, p, 4); return x; }
    case RT_ST_F16: return half_to_double((uint16_t)(p[0] | p[1] << 8));
    case RT_ST_BF16: {
      uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
      float x;
      memcpy(&x, &u, 4);
      return x;
    }
    default: TS_ASSERT(!"rt_st_get on a tensor that is not a float");
  }
  return 0;
}

void rt_st_encode(StrBuf *out, const RtStOut *t, int n) {
  StrBuf h = {0};
  int64_t at = 0;
  sb_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i < n; i++) {
    TS_ASSERT(t[i].dtype == RT_ST_F32 || t[i].dtype == RT_ST_F64);
    int64_t nb = numel_of(&t[i]) * (int64_t)rt_st_dtype_size(t[i].dtype);
    sb_putc(&h, ',');
    ts_json_put_string(&h, t[i].name);
    sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", g_dtypes[t[i].dtype].name);
    for (int d = 0; d < t[i].rank; d++) sb_printf(&h, "%s%lld", d ? "," : "", (long long)t[i].dim[d]);
    sb_printf(&h, "],\"data_offsets\":[%lld,%lld]}", (long long)at, (long long)(at + nb));
    at += nb;
  }
  sb_putc(&h, '}');
  while (h.n % 8) sb_putc(&h, ' ');   /* the data 8-byte aligned, as the reference writer does */
  uint64_t hn = h.n;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hn >> (8 * i));
  sb_write(out, le, 8);
  sb_write(out, h.p, h.n);
  for (int i = 0; i < n; i++) {
    int64_t ne = numel_of(&t[i]);
    for (int64_t k = 0; k < ne; k++) {
      if (t[i].dtype == RT_ST_F32) { float x = (float)t[i].v[k]; sb_write(out, &x, 4); }
      else sb_write(out, &t[i].v[k], 8);
    }
  }
  sb_free(&h);
}

int rt_st_write(const char *path, const RtStOut *t, int n, char *err, size_t errlen) {
  StrBuf out = {0};
  rt_st_encode(&out, t, n);
  int rc = ts_write_file(path, out.p, out.n) != 0 ? ts_errf(err, errlen, "%s", ts_io_error()) : 0;
  sb_free(&out);
  return rc;
}
