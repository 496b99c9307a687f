/* ckpt_index.c - the text index of a checkpoint's shard files (the
 * format: ckpt_index.h, docs/checkpoints.md). */
#include "ckpt_index.h"
#include <ctype.h>
#include <errno.h>

void ck_dims_text(StrBuf *b, const int64_t *d, int n) {
  sb_putc(b, '[');
  for (int i = 0; i < n; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)d[i]);
  sb_putc(b, ']');
}

/* ---- the index: one line per state of a rank ----
 * "tensor NAME kind=K dtype=D global=[..] offsets=[..] shape=[..]
 *  block=[..] flat=I/N partial=AXES|- at=A bytes=B hash=H" (write_rank). */
void ck_index_free(CkIndex *x) {
  for (int i = 0; i < x->n; i++) free(x->a[i].name);
  free(x->a);
  free(x->first);
  free(x->ord);
  memset(x, 0, sizeof *x);
}

/* "[a, b, ...]" at *s */
static int dims_parse(const char **s, int64_t *d, int *n) {
  const char *p = *s;
  *n = 0;
  if (*p++ != '[') return -1;
  if (*p == ']') { *s = p + 1; return 0; }
  for (;;) {
    char *e;
    errno = 0;
    long long v = strtoll(p, &e, 10);
    if (e == p || errno || v < 0 || v > (1LL << 48) || *n >= IR_MAX_RANK) return -1;
    d[(*n)++] = v;
    p = e;
    if (*p == ']') { *s = p + 1; return 0; }
    if (*p++ != ',' || *p++ != ' ') return -1;
  }
}
/* " KEY=" at *s, skipped */
static int key_at(const char **s, const char *key) {
  size_t n = strlen(key);
  if ((*s)[0] != ' ' || strncmp(*s + 1, key, n) || (*s)[n + 1] != '=') return -1;
  *s += n + 2;
  return 0;
}
static int word_at(const char **s, char *out, size_t cap) {
  size_t n = strcspn(*s, " ");
  if (!n || n >= cap) return -1;
  memcpy(out, *s, n);
  out[n] = 0;
  *s += n;
  return 0;
}
static int u64_at(const char **s, int hex, unsigned long long *v) {
  char *e;
  if (!(hex ? isxdigit((unsigned char)**s) : isdigit((unsigned char)**s))) return -1;   /* no sign, no space */
  errno = 0;
  *v = strtoull(*s, &e, hex ? 16 : 10);
  if (e == *s || errno || **s == '-') return -1;
  *s = e;
  return 0;
}
int64_t ck_dims_numel(const int64_t *d, int n) {
  int64_t v = 1;
  for (int i = 0; i < n; i++) {
    if (d[i] < 0 || (d[i] && v > ((int64_t)1 << 62) / d[i])) return -1;
    v *= d[i];
  }
  return v;
}

/* A decimal int in [0, INT32_MAX] at *s: digits only. */
static int int_at(const char **s, int *v) {
  unsigned long long u;
  if (**s < '0' || **s > '9') return -1;
  char *e;
  errno = 0;
  u = strtoull(*s, &e, 10);
  if (errno || u > 0x7fffffff) return -1;
  *v = (int)u;
  *s = e;
  return 0;
}

static int shard_parse(const char *line, int owner, CkShard *e) {
  const char *s = line;
  char w[64];
  int n, k;
  unsigned long long v;
  memset(e, 0, sizeof *e);
  e->owner = owner;
  if (strncmp(s, "tensor ", 7)) return -1;
  s += 7;
  size_t nl = strcspn(s, " ");
  if (!nl || nl > 1000) return -1;
  e->name = ts_xmalloc(nl + 1);
  memcpy(e->name, s, nl);
  e->name[nl] = 0;
  s += nl;
  if (key_at(&s, "kind") || word_at(&s, w, sizeof w)) return -1;
  for (k = 0; k < IR_STATE_KIND_COUNT && strcmp(w, ir_state_kind_name((IrStateKind)k)); k++) {}
  e->kind = k;
  if (k == IR_STATE_KIND_COUNT || key_at(&s, "dtype") || word_at(&s, w, sizeof w) || (e->dtype = ir_dtype_lookup(w)) <= 0)
    return -1;
  if (key_at(&s, "global") || dims_parse(&s, e->global, &e->rank) || key_at(&s, "offsets") ||
      dims_parse(&s, e->off, &n) || n != e->rank || key_at(&s, "shape") || dims_parse(&s, e->shape, &e->lrank))
    return -1;
  int has_block = key_at(&s, "block") == 0;   /* absent in the first checkpoints: then the shape */
  if (has_block && (dims_parse(&s, e->block, &n) || n != e->rank)) return -1;
  if (key_at(&s, "flat") || int_at(&s, &e->fi) || *s++ != '/' || int_at(&s, &e->fc) || e->fc < 1 || e->fi >= e->fc)
    return -1;
  if (!has_block) {
    if (e->fc != 1 || e->lrank != e->rank) return -1;
    memcpy(e->block, e->shape, sizeof e->block);
  }
  if (key_at(&s, "partial") || word_at(&s, w, sizeof w)) return -1;
  if (strcmp(w, "-"))
    for (char *save = NULL, *t = strtok_r(w, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      int a = ir_axis_lookup(t);
      if (a < 0) return -1;
      e->partial |= 1u << a;
    }
  if (key_at(&s, "at") || u64_at(&s, 0, &v)) return -1;
  e->at = (size_t)v;
  if (key_at(&s, "bytes") || u64_at(&s, 0, &v)) return -1;
  e->bytes = (size_t)v;
  if (key_at(&s, "hash") || u64_at(&s, 1, &v) || *s) return -1;
  e->hash = v;
  /* the sizes agree with each other */
  int64_t local = ck_dims_numel(e->shape, e->lrank), blk = ck_dims_numel(e->block, e->rank);
  if (local < 0 || blk < 0 || e->dtype >= IR_DTYPE_COUNT || (size_t)local * ir_dtype_size((IrDtype)e->dtype) != e->bytes)
    return -1;
  if (e->fc == 1 ? local != blk : (e->lrank != 1 || local != (blk + e->fc - 1) / e->fc)) return -1;
  for (int d = 0; d < e->rank; d++)
    if (e->global[d] < 1) return -1;
  return 0;
}

int ck_shard_parse(const char *line, int owner, CkShard *e) {
  if (shard_parse(line, owner, e) == 0) return 0;
  free(e->name);
  e->name = NULL;
  return -1;
}

int ck_index_add_text(CkIndex *x, const char *text, int owner, const char *path, char *err, size_t errlen) {
  x->first = ts_xrealloc(x->first, (size_t)(owner + 2) * sizeof *x->first);
  x->first[owner] = x->n;
  x->first[owner + 1] = x->n;
  x->nranks = owner + 1;
  int line = 0;
  for (const char *s = text, *e; *s; s = e + (*e != 0)) {
    e = s + strcspn(s, "\n");
    line++;
    if (e == s) continue;
    char *one = ts_xmalloc((size_t)(e - s) + 1);
    memcpy(one, s, (size_t)(e - s));
    one[e - s] = 0;
    if (x->n == x->cap) {
      x->cap = x->cap ? 2 * x->cap : 256;
      x->a = ts_xrealloc(x->a, (size_t)x->cap * sizeof *x->a);
    }
    int bad = ck_shard_parse(one, owner, &x->a[x->n]) != 0;
    if (bad) {
      ts_errf(err, errlen, "'%s' is corrupted: line %d is not a tensor's entry: %.80s", path, line, one);
    } else x->n++;
    free(one);
    if (bad) return -1;
  }
  x->first[owner + 1] = x->n;
  return 0;
}

static const CkIndex *sort_index;
static int by_name(const void *a, const void *b) {
  int i = *(const int *)a, k = *(const int *)b, c = strcmp(sort_index->a[i].name, sort_index->a[k].name);
  return c ? c : (i > k) - (i < k);
}

void ck_index_sort(CkIndex *x) {
  free(x->ord);
  x->ord = ts_xmalloc((size_t)(x->n ? x->n : 1) * sizeof *x->ord);
  for (int i = 0; i < x->n; i++) x->ord[i] = i;
  sort_index = x;   /* qsort has no context argument; the loader is single-threaded */
  qsort(x->ord, (size_t)x->n, sizeof *x->ord, by_name);
  sort_index = NULL;
}

/* The run of x->ord holding the shards of `name`: [*lo, return). */
int ck_index_find(const CkIndex *x, const char *name, int *lo) {
  int a = 0, b = x->n;
  while (a < b) {
    int c = (a + b) / 2;
    if (strcmp(x->a[x->ord[c]].name, name) < 0) a = c + 1; else b = c;
  }
  *lo = a;
  while (b < x->n && !strcmp(x->a[x->ord[b]].name, name)) b++;
  return b;
}

void ck_shard_head(StrBuf *b, const CkShard *e) {
  sb_printf(b, "tensor %s kind=%s dtype=%s global=", e->name, ir_state_kind_name((IrStateKind)e->kind), ir_dtype_name((IrDtype)e->dtype));
  ck_dims_text(b, e->global, e->rank);
}

void ck_shard_print(StrBuf *b, const CkShard *e) {
  ck_shard_head(b, e);
  sb_puts(b, " offsets=");
  ck_dims_text(b, e->off, e->rank);
  sb_puts(b, " shape=");
  ck_dims_text(b, e->shape, e->lrank);
  sb_puts(b, " block=");
  ck_dims_text(b, e->block, e->rank);
  sb_printf(b, " flat=%d/%d partial=", e->fi, e->fc);
  int np = 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (e->partial & (1u << a)) sb_printf(b, "%s%s", np++ ? "," : "", ir_axis_name((IrAxis)a));
  if (!np) sb_puts(b, "-");
  sb_printf(b, " at=%zu bytes=%zu hash=%016llx\n", e->at, e->bytes, (unsigned long long)e->hash);
}
