/* json.c - the strict JSON reader of json.h: recursive descent over a
 * bounded buffer (the input need not be NUL-terminated), depth-limited. */
#include "json.h"
#include <errno.h>
#include <math.h>

typedef struct {
  Arena *a;
  const char *s, *end, *what;
  const char *p;
  char *err;
  size_t errlen;
  int failed;
} JP;

static int jp_fail(JP *j, const char *msg) {
  if (j->failed) return -1;
  int line = 1, col = 1;
  for (const char *q = j->s; q < j->p && q < j->end; q++) {
    if (*q == '\n') { line++; col = 1; }
    else col++;
  }
  ts_errf(j->err, j->errlen, "%s:%d:%d: error: %s", j->what, line, col, msg);
  j->failed = 1;
  return -1;
}

static void jp_ws(JP *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int jp_lit(JP *j, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n)) return jp_fail(j, "not a JSON value");
  j->p += n;
  return 0;
}

static int hex4(const char *p, unsigned *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    *v = *v * 16 + (unsigned)d;
  }
  return 0;
}

static void put_utf8(StrBuf *b, unsigned c) {
  if (c < 0x80) sb_putc(b, (char)c);
  else if (c < 0x800) { sb_putc(b, (char)(0xC0 | c >> 6)); sb_putc(b, (char)(0x80 | (c & 0x3F))); }
  else if (c < 0x10000) {
    sb_putc(b, (char)(0xE0 | c >> 12));
    sb_putc(b, (char)(0x80 | ((c >> 6) & 0x3F)));
    sb_putc(b, (char)(0x80 | (c & 0x3F)));
  } else {
    sb_putc(b, (char)(0xF0 | c >> 18));
    sb_putc(b, (char)(0x80 | ((c >> 12) & 0x3F)));
    sb_putc(b, (char)(0x80 | ((c >> 6) & 0x3F)));
    sb_putc(b, (char)(0x80 | (c & 0x3F)));
  }
}

/* A string literal at j->p (the opening quote) into the arena. */
static const char *jp_string(JP *j) {
  StrBuf b = {0};
  j->p++;
  for (;;) {
    if (j->p >= j->end) { jp_fail(j, "unterminated string"); break; }
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') { j->p++; break; }
    if (c < 0x20) { jp_fail(j, "a control character in a string (write it as an escape)"); break; }
    if (c != '\\') { sb_putc(&b, (char)c); j->p++; continue; }
    if (j->end - j->p < 2) { jp_fail(j, "unterminated string"); break; }
    char e = j->p[1];
    j->p += 2;
    const char *map = strchr("\"\\/bfnrt", e);
    if (e && map) { sb_putc(&b, "\"\\/\b\f\n\r\t"[map - "\"\\/bfnrt"]); continue; }
    unsigned u, lo;
    if (e != 'u' || j->end - j->p < 4 || hex4(j->p, &u)) { j->p -= 2; jp_fail(j, "a bad escape in a string"); break; }
    j->p += 4;
    if (u >= 0xD800 && u < 0xDC00) {   /* a surrogate pair */
      if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || hex4(j->p + 2, &lo) || lo < 0xDC00 || lo >= 0xE000) {
        jp_fail(j, "an unpaired surrogate in a string");
        break;
      }
      j->p += 6;
      u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
    } else if (u >= 0xDC00 && u < 0xE000) { jp_fail(j, "an unpaired surrogate in a string"); break; }
    if (u == 0) { jp_fail(j, "\\u0000 in a string (names cannot hold NUL)"); break; }
    put_utf8(&b, u);
  }
  const char *s = j->failed ? NULL : arena_strndup(j->a, b.p ? b.p : "", b.n);
  sb_free(&b);
  return s;
}

static int jp_number(JP *j, TsJson *v) {
  const char *q = j->p;
  int frac = 0;
  if (q < j->end && *q == '-') q++;
  if (q >= j->end || *q < '0' || *q > '9') return jp_fail(j, "not a JSON value");
  if (*q == '0') q++;
  else while (q < j->end && *q >= '0' && *q <= '9') q++;
  if (q < j->end && *q == '.') {
    frac = 1;
    if (++q >= j->end || *q < '0' || *q > '9') return jp_fail(j, "a number with no digits after '.'");
    while (q < j->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < j->end && (*q == 'e' || *q == 'E')) {
    frac = 1;
    q++;
    if (q < j->end && (*q == '+' || *q == '-')) q++;
    if (q >= j->end || *q < '0' || *q > '9') return jp_fail(j, "a number with no exponent digits");
    while (q < j->end && *q >= '0' && *q <= '9') q++;
  }
  char *t = arena_strndup(j->a, j->p, (size_t)(q - j->p));
  errno = 0;
  v->num = strtod(t, NULL);
  if (!isfinite(v->num)) return jp_fail(j, "a number out of the range of a double");
  if (!frac) {
    errno = 0;
    long long i = strtoll(t, NULL, 10);
    if (errno == 0) { v->is_int = 1; v->inum = i; }
  }
  v->kind = TS_JSON_NUMBER;
  j->p = q;
  return 0;
}

static TsJson *jp_value(JP *j, int depth);

/* The keys of one object seen so far, as an open-addressing set of indices
 * into keys[] (a tokenizer's vocabulary is an object of 100,000+ keys:
 * comparing each key with every earlier one would take minutes). */
typedef struct { int *slot; int cap; } KeySet;

static uint64_t key_hash(const char *k) { return ts_hash64(k, strlen(k), 0); }

static void keyset_put(KeySet *s, const char *const *keys, int i) {
  int m = s->cap - 1, h = (int)(key_hash(keys[i]) & (uint64_t)m);
  while (s->slot[h] >= 0) h = (h + 1) & m;
  s->slot[h] = i;
}

/* 1 if k is among keys[0, n); else remembers it (it becomes keys[n]). */
static int key_seen(KeySet *s, const char *const *keys, int n, const char *k) {
  if (2 * (n + 1) > s->cap) {   /* grow, keep the load at most one half */
    free(s->slot);
    s->cap = s->cap ? 2 * s->cap : 16;
    s->slot = ts_xmalloc((size_t)s->cap * sizeof *s->slot);
    for (int i = 0; i < s->cap; i++) s->slot[i] = -1;
    for (int i = 0; i < n; i++) keyset_put(s, keys, i);
  }
  int m = s->cap - 1;
  for (int h = (int)(key_hash(k) & (uint64_t)m); s->slot[h] >= 0; h = (h + 1) & m)
    if (!strcmp(keys[s->slot[h]], k)) return 1;
  return 0;
}

static int jp_items(JP *j, TsJson *v, int depth, int object) {
  VEC(TsJson *) items = {0};
  VEC(const char *) keys = {0};
  KeySet seen = {0};
  char close = object ? '}' : ']';
  j->p++;
  jp_ws(j);
  if (j->p < j->end && *j->p == close) j->p++;
  else
    for (;;) {
      jp_ws(j);
      if (object) {
        if (j->p >= j->end || *j->p != '"') { jp_fail(j, "expected a key (a string) in an object"); break; }
        const char *k = jp_string(j);
        if (!k) break;
        if (key_seen(&seen, keys.a, keys.n, k)) { jp_fail(j, "a key repeated in an object"); break; }
        VEC_PUSH(keys, k);
        keyset_put(&seen, keys.a, keys.n - 1);
        jp_ws(j);
        if (j->p >= j->end || *j->p != ':') { jp_fail(j, "expected ':' after a key"); break; }
        j->p++;
      }
      TsJson *x = jp_value(j, depth + 1);
      if (!x) break;
      VEC_PUSH(items, x);
      jp_ws(j);
      if (j->p < j->end && *j->p == ',') { j->p++; continue; }
      if (j->p < j->end && *j->p == close) { j->p++; break; }
      jp_fail(j, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
      break;
    }
  if (!j->failed) {
    v->n = items.n;
    v->items = arena_alloc(j->a, (size_t)(items.n ? items.n : 1) * sizeof *v->items);
    if (items.n) memcpy(v->items, items.a, (size_t)items.n * sizeof *v->items);
    if (object) {
      v->keys = arena_alloc(j->a, (size_t)(keys.n ? keys.n : 1) * sizeof *v->keys);
      if (keys.n) memcpy(v->keys, keys.a, (size_t)keys.n * sizeof *v->keys);
    }
  }
  free(items.a);
  free(keys.a);
  free(seen.slot);
  return j->failed ? -1 : 0;
}

static TsJson *jp_value(JP *j, int depth) {
  jp_ws(j);
  if (depth > TS_JSON_MAX_DEPTH) { jp_fail(j, "nested deeper than 64 levels"); return NULL; }
  if (j->p >= j->end) { jp_fail(j, "the text ends where a value should be"); return NULL; }
  TsJson *v = arena_alloc(j->a, sizeof *v);
  int rc = 0;
  switch (*j->p) {
    case '{': v->kind = TS_JSON_OBJECT; rc = jp_items(j, v, depth, 1); break;
    case '[': v->kind = TS_JSON_ARRAY; rc = jp_items(j, v, depth, 0); break;
    case '"': v->kind = TS_JSON_STRING; rc = (v->str = jp_string(j)) ? 0 : -1; break;
    case 't': v->kind = TS_JSON_BOOL; v->boolean = 1; rc = jp_lit(j, "true"); break;
    case 'f': v->kind = TS_JSON_BOOL; rc = jp_lit(j, "false"); break;
    case 'n': v->kind = TS_JSON_NULL; rc = jp_lit(j, "null"); break;
    default: rc = jp_number(j, v); break;
  }
  return rc ? NULL : v;
}

TsJson *ts_json_parse(Arena *a, const char *text, size_t len, const char *what, char *err, size_t errlen) {
  JP j = {a, text, text + len, what ? what : "<json>", text, err, errlen, 0};
  TsJson *v = jp_value(&j, 0);
  if (!v) return NULL;
  jp_ws(&j);
  if (j.p != j.end) { jp_fail(&j, "text after the JSON value"); return NULL; }
  return v;
}

const TsJson *ts_json_get(const TsJson *o, const char *key) {
  if (!o || o->kind != TS_JSON_OBJECT) return NULL;
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->keys[i], key)) return o->items[i];
  return NULL;
}

const char *ts_json_kind_name(TsJsonKind k) {
  static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
  return (unsigned)k <= TS_JSON_OBJECT ? names[k] : "?";
}

void ts_json_put_string(StrBuf *b, const char *s) {
  sb_putc(b, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') { sb_putc(b, '\\'); sb_putc(b, (char)*p); }
    else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
    else sb_putc(b, (char)*p);
  }
  sb_putc(b, '"');
}
