/* util.c - arenas, interning, string buffers. Files: io.c. */
#include "util.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

void ts_die_at(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

int ts_errf(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void *ts_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) TS_DIE("out of memory allocating %zu bytes", n);
  return p;
}
void *ts_xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz ? sz : 1);
  if (!p) TS_DIE("out of memory allocating %zu x %zu bytes", n, sz);
  return p;
}
void *ts_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) TS_DIE("out of memory reallocating %zu bytes", n);
  return q;
}
char *ts_xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  return memcpy(ts_xmalloc(n), s, n);
}

/* ---- arena ---- */
struct ArenaBlock { ArenaBlock *next; size_t size, used; _Alignas(16) unsigned char data[]; };

void arena_init(Arena *a) { a->head = NULL; a->used_total = 0; }

void arena_free(Arena *a) {
  for (ArenaBlock *b = a->head, *n; b; b = n) { n = b->next; free(b); }
  a->head = NULL;
  a->used_total = 0;
}

void *arena_alloc(Arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  ArenaBlock *b = a->head;
  if (!b || b->size - b->used < n) {
    size_t size = n > 64 * 1024 ? n : 64 * 1024;
    b = ts_xmalloc(sizeof *b + size);
    b->size = size;
    b->used = 0;
    b->next = a->head;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += n;
  a->used_total += n;
  memset(p, 0, n);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}
char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(a, (size_t)n + 1);
  vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

/* ---- interning: open-addressing hash set, process-wide, thread-safe ---- */
static struct { const char **slot; size_t cap, n; Arena arena; } intern_tab;
static pthread_mutex_t intern_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t ts_hash64(const void *p, size_t n, uint64_t seed) {
  const unsigned char *s = p;
  uint64_t h = 14695981039346656037ull ^ seed;
  for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ull; }
  return h;
}

double ts_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void intern_grow(void) {
  size_t cap = intern_tab.cap ? intern_tab.cap * 2 : 1024;
  const char **slot = ts_xcalloc(cap, sizeof *slot);
  for (size_t i = 0; i < intern_tab.cap; i++) {
    const char *s = intern_tab.slot[i];
    if (!s) continue;
    size_t j = ts_hash64(s, strlen(s), 0) & (cap - 1);
    while (slot[j]) j = (j + 1) & (cap - 1);
    slot[j] = s;
  }
  free(intern_tab.slot);
  intern_tab.slot = slot;
  intern_tab.cap = cap;
}

const char *ts_intern_n(const char *s, size_t n) {
  if (!s) return NULL;
  pthread_mutex_lock(&intern_mu);
  if (2 * (intern_tab.n + 1) > intern_tab.cap) intern_grow();
  size_t j = ts_hash64(s, n, 0) & (intern_tab.cap - 1);
  const char *r;
  for (;;) {
    r = intern_tab.slot[j];
    if (!r) {
      r = intern_tab.slot[j] = arena_strndup(&intern_tab.arena, s, n);
      intern_tab.n++;
      break;
    }
    if (strncmp(r, s, n) == 0 && r[n] == 0) break;
    j = (j + 1) & (intern_tab.cap - 1);
  }
  pthread_mutex_unlock(&intern_mu);
  return r;
}
const char *ts_intern(const char *s) { return s ? ts_intern_n(s, strlen(s)) : NULL; }

/* ---- StrBuf ---- */
static void sb_reserve(StrBuf *b, size_t extra) {
  if (b->n + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->n + extra + 1) cap *= 2;
  b->p = ts_xrealloc(b->p, cap);
  b->cap = cap;
}
void sb_write(StrBuf *b, const void *p, size_t n) {
  sb_reserve(b, n);
  memcpy(b->p + b->n, p, n);
  b->n += n;
  b->p[b->n] = 0;
}
void sb_putc(StrBuf *b, char c) { sb_write(b, &c, 1); }
void sb_puts(StrBuf *b, const char *s) { sb_write(b, s, strlen(s)); }
void sb_printf(StrBuf *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  sb_reserve(b, (size_t)n);
  vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  b->n += (size_t)n;
}
void sb_free(StrBuf *b) { free(b->p); b->p = NULL; b->n = b->cap = 0; }

void ts_fmt_double(char *buf, size_t n, double x) {
  if (isnan(x)) { snprintf(buf, n, "nan"); return; }
  if (isinf(x)) { snprintf(buf, n, x > 0 ? "inf" : "-inf"); return; }
  for (int prec = 1; prec <= 17; prec++) {       /* shortest that round-trips */
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  /* keep it visibly a float: "1" -> "1.0" (unless it has e/./inf) */
  if (!strpbrk(buf, ".eEni")) {
    size_t k = strlen(buf);
    if (k + 2 < n) { buf[k] = '.'; buf[k + 1] = '0'; buf[k + 2] = 0; }
  }
}

/* PREFIX/share/tessera when dir is PREFIX/<up>: 0 with it in root. */
static int data_root_beside(const char *dir, const char *up, char *root) {
  char probe[4096 + 64];
  snprintf(probe, sizeof probe, "%s/%s/share/tessera/stdlib/nn.mdl", dir, up);
  if (access(probe, R_OK) != 0) return -1;
  snprintf(probe, sizeof probe, "%s/%s/share/tessera", dir, up);
  return realpath(probe, root) ? 0 : -1;   /* without the "bin/.." */
}

static char data_root[4096];
static void data_root_find(void) {
  char path[4096];
  /* the program: PREFIX/bin/mcc */
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  char *s;
  if (n > 0) {
    path[n] = 0;
    if ((s = strrchr(path, '/'))) {
      *s = 0;
      if (data_root_beside(path, "..", data_root) == 0) return;
    }
  }
  /* the library this code is in (libtessera.so, include/tessera.h):
   * PREFIX/lib or PREFIX/lib/<multiarch> */
  Dl_info info;
  if (dladdr((void *)data_root_find, &info) && info.dli_fname && strlen(info.dli_fname) < sizeof path) {
    snprintf(path, sizeof path, "%s", info.dli_fname);
    if ((s = strrchr(path, '/'))) {
      *s = 0;
      if (data_root_beside(path, "..", data_root) == 0 || data_root_beside(path, "../..", data_root) == 0) return;
    }
  }
#ifdef TS_SOURCE_DIR
  snprintf(data_root, sizeof data_root, "%s", TS_SOURCE_DIR);
#else
  snprintf(data_root, sizeof data_root, ".");
#endif
}

const char *ts_data_root(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, data_root_find);
  return data_root;
}
