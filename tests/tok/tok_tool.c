/* tok_tool.c - the C tokenizer (runtime/data/tokenizer.h) from the command
 * line, for the tests in tests/tok and bench/tokenizer.sh:
 *
 *   tok_tool load TOKENIZER                 "vocab N eod ID", or the error
 *   tok_tool encode TOKENIZER TEXT IDS      ids as int32 little-endian
 *   tok_tool encode2 VOCAB MERGES TEXT IDS  GPT-2's pair given separately
 *   tok_tool decode TOKENIZER IDS OUT       the bytes of the ids
 *   tok_tool pieces gpt2|llama3 TEXT OUT    the pre-tokenizer regex's pieces
 *                                           of TEXT (valid UTF-8): the byte
 *                                           offset where each ends, int64
 *   tok_tool classes OUT                    one byte per code point
 *                                           0..U+10FFFF: its class bits
 *   tok_tool bench TOKENIZER TEXT SECONDS   encodes TEXT (one call) again
 *                                           and again: MB/s, best run
 *   tok_tool bench-lines TOKENIZER TEXT SECONDS   the same, one call per
 *                                           line (as documents are encoded)
 * TOKENIZER: a tokenizer.json, a vocab.json or a directory (rt_tok_load). */
#include "runtime/data/tokenizer.h"
#include "runtime/data/unicode_tab.h"
#include "runtime/data/tok_pretok.h"
#include "ir/util.h"
#include <errno.h>

static int usage(void) {
  fprintf(stderr, "usage: tok_tool load|encode|encode2|decode|classes|bench ... (see tests/tok/tok_tool.c)\n");
  return 2;
}

static RtTokenizer *load(const char *path) {
  char err[4096];
  RtTokenizer *t = rt_tok_load(path, err, sizeof err);
  if (!t) fprintf(stderr, "tok_tool: error: %s\n", err);
  return t;
}

static char *read_text(const char *path, size_t *len) {
  char *s = ts_read_input(path, len);
  if (!s) fprintf(stderr, "tok_tool: error: cannot read '%s': %s\n", path, strerror(errno));
  return s;
}

static int write_out(const char *path, const void *p, size_t n) {
  if (ts_write_file(path, p, n) == 0) return 0;
  fprintf(stderr, "tok_tool: error: %s\n", ts_io_error());
  return 1;
}

static int encode(RtTokenizer *t, const char *text_path, const char *ids_path) {
  size_t len, n = 0, cap = 0;
  int32_t *ids = NULL;
  char *text = read_text(text_path, &len);
  if (!text) return 1;
  int rc = rt_tok_encode(t, text, len, &ids, &n, &cap);
  if (rc) fprintf(stderr, "tok_tool: error: out of memory encoding '%s'\n", text_path);
  else rc = write_out(ids_path, ids, n * sizeof *ids);   /* little-endian hosts only (x86-64, arm64) */
  free(text);
  free(ids);
  return rc ? 1 : 0;
}

static int decode(RtTokenizer *t, const char *ids_path, const char *out_path) {
  size_t len, olen = 0, ocap = 0;
  char *raw = read_text(ids_path, &len), *out = NULL, err[256];
  if (!raw) return 1;
  int rc = rt_tok_decode(t, (const int32_t *)(void *)raw, len / 4, &out, &olen, &ocap, err, sizeof err);
  if (rc) fprintf(stderr, "tok_tool: error: %s\n", err);
  else rc = write_out(out_path, out, olen);
  free(raw);
  free(out);
  return rc ? 1 : 0;
}

static int classes(const char *out_path) {
  size_t n = 0x110000;
  unsigned char *c = ts_xmalloc(n);
  for (size_t i = 0; i < n; i++) c[i] = (unsigned char)rt_uni_cls((uint32_t)i);
  int rc = write_out(out_path, c, n);
  free(c);
  return rc;
}

static int pieces(const char *which, const char *text_path, const char *out_path) {
  RtTokRe re = !strcmp(which, "gpt2") ? RT_TOK_RE_IS_GPT2 : !strcmp(which, "llama3") ? RT_TOK_RE_IS_LLAMA3 : RT_TOK_RE_NONE;
  size_t len;
  char *text = re != RT_TOK_RE_NONE ? read_text(text_path, &len) : NULL;
  if (!text) return 1;
  if (rt_utf8_valid_prefix(text, len) != len) {
    fprintf(stderr, "tok_tool: error: '%s' is not valid UTF-8\n", text_path);
    return 1;
  }
  VEC(int64_t) ends = {0};
  for (size_t i = 0; i < len; i = (size_t)ends.a[ends.n - 1]) VEC_PUSH(ends, (int64_t)rt_tok_re_match(re, text, len, i));
  int rc = write_out(out_path, ends.a, (size_t)ends.n * sizeof *ends.a);
  free(ends.a);
  free(text);
  return rc;
}

/* Encodes text[0, len) whole, or one call per line. */
static int encode_all(RtTokenizer *t, const char *text, size_t len, int lines, int32_t **ids, size_t *n, size_t *cap) {
  if (!lines) return rt_tok_encode(t, text, len, ids, n, cap);
  for (size_t i = 0; i < len;) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t e = nl ? (size_t)(nl - text) + 1 : len;
    if (rt_tok_encode(t, text + i, e - i, ids, n, cap)) return -1;
    i = e;
  }
  return 0;
}

static int bench(RtTokenizer *t, const char *text_path, double secs, int lines) {
  size_t len, n = 0, cap = 0;
  int32_t *ids = NULL;
  char *text = read_text(text_path, &len);
  if (!text) return 1;
  double best = 1e30, t0 = ts_now_s();
  int runs = 0;
  do {
    n = 0;
    double s = ts_now_s();
    if (encode_all(t, text, len, lines, &ids, &n, &cap)) return 1;
    double d = ts_now_s() - s;
    if (d < best) best = d;
    runs++;
  } while (ts_now_s() - t0 < secs || runs < 3);
  printf("%.1f MB/s (%zu bytes, %zu ids, best of %d runs: %.1f ms)\n", len / best / 1e6, len, n, runs, best * 1e3);
  free(text);
  free(ids);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  const char *cmd = argv[1];
  if (!strcmp(cmd, "classes") && argc == 3) return classes(argv[2]);
  if (!strcmp(cmd, "pieces") && argc == 5) return pieces(argv[2], argv[3], argv[4]);
  if (!strcmp(cmd, "encode2") && argc == 6) {
    char err[4096];
    RtTokenizer *t = rt_tok_load_gpt2(argv[2], argv[3], err, sizeof err);
    if (!t) { fprintf(stderr, "tok_tool: error: %s\n", err); return 1; }
    int rc = encode(t, argv[4], argv[5]);
    rt_tok_free(t);
    return rc;
  }
  if (argc < 3) return usage();
  RtTokenizer *t = load(argv[2]);
  if (!t) return 1;
  int rc;
  if (!strcmp(cmd, "load") && argc == 3) {
    printf("vocab %lld eod %d\n", (long long)rt_tok_vocab_size(t), rt_tok_eod(t));
    rc = 0;
  } else if (!strcmp(cmd, "encode") && argc == 5) rc = encode(t, argv[3], argv[4]);
  else if (!strcmp(cmd, "decode") && argc == 5) rc = decode(t, argv[3], argv[4]);
  else if (!strcmp(cmd, "bench") && argc == 5) rc = bench(t, argv[3], atof(argv[4]), 0);
  else if (!strcmp(cmd, "bench-lines") && argc == 5) rc = bench(t, argv[3], atof(argv[4]), 1);
  else rc = usage();
  rt_tok_free(t);
  return rc;
}
