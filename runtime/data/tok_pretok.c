/* tok_pretok.c - UTF-8 decoding with Python's replacement rule, and the
 * GPT-2 and Llama 3 pre-tokenizer regexes as scanners (tok_pretok.h).
 *
 * Each scanner tries the regex's alternatives in order at one position and
 * returns the first that matches, as a backtracking engine does; where an
 * alternative would backtrack (\s+(?!\S), \s*[\r\n]+) the comment says
 * which match the backtracking ends on.  Character classes come from
 * unicode_tab.c (Unicode 14.0.0, as the package's Oniguruma). */
#include "tok_pretok.h"
#include "unicode_tab.h"
#include <stdlib.h>
#include <string.h>

RtTokRe rt_tok_re_lookup(const char *pattern) {
  if (!strcmp(pattern, RT_TOK_RE_GPT2)) return RT_TOK_RE_IS_GPT2;
  if (!strcmp(pattern, RT_TOK_RE_LLAMA3)) return RT_TOK_RE_IS_LLAMA3;
  return RT_TOK_RE_NONE;
}

/* ---- UTF-8 ---- */

/* Length of the well-formed sequence at s[0, n) (1..4), or minus the
 * length of its maximal invalid subpart (Unicode 3.9, table 3-7: the
 * bytes that could still begin a valid sequence, at least one). */
static int utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  int need;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return -1;
  for (int k = 1; k <= need; k++) {
    if ((size_t)k >= n || s[k] < lo || s[k] > hi) return -k;
    lo = 0x80, hi = 0xBF;   /* only the second byte has a narrower range */
  }
  return need + 1;
}

size_t rt_utf8_valid_prefix(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    if (u[i] < 0x80) { i++; continue; }
    int k = utf8_seq(u + i, len - i);
    if (k < 0) return i;
    i += (size_t)k;
  }
  return len;
}

char *rt_utf8_sanitize(const char *s, size_t len, size_t *outlen) {
  /* each invalid byte becomes at most 3 bytes */
  if (len > (SIZE_MAX - 1) / 3) return NULL;
  char *out = malloc(3 * len + 1);
  if (!out) return NULL;
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, o = 0;
  while (i < len) {
    int k = utf8_seq(u + i, len - i);
    if (k > 0) { memcpy(out + o, s + i, (size_t)k); o += (size_t)k; i += (size_t)k; continue; }
    memcpy(out + o, "\xEF\xBF\xBD", 3);
    o += 3;
    i += (size_t)-k;
  }
  out[o] = 0;
  *outlen = o;
  return out;
}

uint32_t rt_utf8_next(const char *s, size_t *i) {
  const unsigned char *u = (const unsigned char *)s + *i;
  uint32_t c = u[0];
  if (c < 0x80) { *i += 1; return c; }
  if (c < 0xE0) { *i += 2; return ((c & 0x1F) << 6) | (u[1] & 0x3F); }
  if (c < 0xF0) { *i += 3; return ((c & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F); }
  *i += 4;
  return ((c & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}

/* ---- character classes ---- */

/* ASCII classes without the table lookup: most text is ASCII. */
static uint8_t ascii_cls[128];
static int ascii_ready;

static void ascii_init(void) {
  for (int c = 0; c < 128; c++) ascii_cls[c] = (uint8_t)rt_uni_cls((uint32_t)c);
  ascii_ready = 1;   /* a benign race: every thread writes the same bytes */
}

/* Class bits of the character at s[i] (i < len); *next gets its end. */
static int cls_at(const char *s, size_t len, size_t i, size_t *next) {
  (void)len;
  unsigned char c = (unsigned char)s[i];
  if (c < 0x80) { *next = i + 1; return ascii_cls[c]; }
  *next = i;
  return rt_uni_cls(rt_utf8_next(s, next));
}

#define OTHER(k) (!((k) & (RT_UNI_L | RT_UNI_N | RT_UNI_S)))

/* The end of the run of characters whose class satisfies want, from i. */
static size_t run_of(const char *s, size_t len, size_t i, int mask, int other) {
  while (i < len) {
    size_t nx;
    int k = cls_at(s, len, i, &nx);
    if (other ? !OTHER(k) : !(k & mask)) break;
    i = nx;
  }
  return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d at s[i] == '\''; fold: also the upper case and
 * U+017F LONG S (which Unicode case folding maps to s). */
static size_t contraction(const char *s, size_t len, size_t i, int fold) {
  if (i + 1 >= len) return 0;
  char a = s[i + 1], b = i + 2 < len ? s[i + 2] : 0;
  if (fold) {
    if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
    if (b >= 'A' && b <= 'Z') b = (char)(b - 'A' + 'a');
    if (a == '\xC5' && b == '\xBF') return i + 3;     /* 'ſ */
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' || a == 'v') && b == 'e') return i + 3;
  if (a == 'l' && b == 'l') return i + 3;
  return 0;
}

/* \s+(?!\S) then \s+ at a whitespace character: the run, less its last
 * character when a non-space follows and the run has more than one (the
 * backtracking stops one short, where the lookahead sees a space). */
static size_t spaces(const char *s, size_t len, size_t i) {
  size_t j = run_of(s, len, i, RT_UNI_S, 0);
  if (j == len) return j;
  size_t last = i, p = i;
  while (p < j) { last = p; size_t nx; cls_at(s, len, p, &nx); p = nx; }
  return last > i ? last : j;
}

static size_t match_gpt2(const char *s, size_t len, size_t i) {
  size_t e, nx;
  if (s[i] == '\'' && (e = contraction(s, len, i, 0))) return e;
  size_t j = i;
  if (s[i] == ' ' && i + 1 < len) j = i + 1;     /* the optional space */
  int k = cls_at(s, len, j, &nx);
  if (j > i && (k & RT_UNI_S)) { j = i; k = cls_at(s, len, j, &nx); }
  if (k & RT_UNI_L) return run_of(s, len, nx, RT_UNI_L, 0);
  if (k & RT_UNI_N) return run_of(s, len, nx, RT_UNI_N, 0);
  if (OTHER(k)) return run_of(s, len, nx, 0, 1);
  return spaces(s, len, i);
}

static int is_crlf(char c) { return c == '\r' || c == '\n'; }

static size_t match_llama3(const char *s, size_t len, size_t i) {
  size_t e, nx, nx2;
  if (s[i] == '\'' && (e = contraction(s, len, i, 1))) return e;
  int k = cls_at(s, len, i, &nx);
  /* [^\r\n\p{L}\p{N}]?\p{L}+ */
  if (k & RT_UNI_L) return run_of(s, len, nx, RT_UNI_L, 0);
  if (!(k & RT_UNI_N) && !is_crlf(s[i]) && nx < len && (cls_at(s, len, nx, &nx2) & RT_UNI_L))
    return run_of(s, len, nx2, RT_UNI_L, 0);
  /* \p{N}{1,3} */
  if (k & RT_UNI_N) {
    for (int n = 1; n < 3 && nx < len && (cls_at(s, len, nx, &nx2) & RT_UNI_N); n++) nx = nx2;
    return nx;
  }
  /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
  size_t j = i;
  if (s[i] == ' ' && i + 1 < len && OTHER(cls_at(s, len, i + 1, &nx2))) j = i + 1;
  if (OTHER(cls_at(s, len, j, &nx))) {
    e = run_of(s, len, nx, 0, 1);
    while (e < len && is_crlf(s[e])) e++;
    return e;
  }
  /* \s*[\r\n]+ : the whitespace run up to its last \r or \n */
  size_t run = run_of(s, len, i, RT_UNI_S, 0), last = 0;
  for (size_t p = i; p < run; p++)
    if (is_crlf(s[p])) last = p + 1;
  if (last) return last;
  return spaces(s, len, i);
}

size_t rt_tok_re_match(RtTokRe re, const char *s, size_t len, size_t i) {
  if (!ascii_ready) ascii_init();
  size_t e = re == RT_TOK_RE_IS_GPT2 ? match_gpt2(s, len, i) : match_llama3(s, len, i);
  if (e <= i) {   /* cannot happen (every character starts a match); one character */
    e = i;
    rt_utf8_next(s, &e);
  }
  return e;
}
