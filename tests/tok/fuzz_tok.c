/* fuzz_tok.c - libFuzzer harness for the tokenizer (runtime/data/
 * tokenizer.c): the first byte of the input picks what the rest is
 *   'J'  a tokenizer.json: loaded, then (if it loads) some text encoded
 *        and decoded with it;
 *   'G'  vocab.json, a NUL, merges.txt: GPT-2's pair, loaded;
 *   else text: encoded with the sample tokenizers (both pre-tokenizers),
 *        then decoded, which must give the text back as Python reads it
 *        (U+FFFD for invalid UTF-8), and every id must be in range.
 * Files go through a scratch directory, as the loaders take paths. */
#include "runtime/data/tokenizer.h"
#include "runtime/data/tok_pretok.h"
#include "ir/util.h"
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static RtTokenizer *sample[2];
static char dir[64];

static void write_file(const char *name, const uint8_t *p, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (n) fwrite(p, 1, n, f);
  fclose(f);
}

/* Encodes and decodes text with t: ids in range, decoding succeeds, and
 * (exact) the round trip holds.  Not for a fuzzed tokenizer.json: a vocab
 * without some byte's symbol drops that byte, as the tokenizers package
 * does (CI found one without "\r": both give "...\n\xef\xbf\xbd"). */
static void roundtrip(const RtTokenizer *t, const char *text, size_t len, int exact) {
  int32_t *ids = NULL;
  size_t n = 0, cap = 0, olen = 0, ocap = 0, flen;
  char *out = NULL, err[256];
  if (rt_tok_encode(t, text, len, &ids, &n, &cap)) abort();
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= rt_tok_vocab_size(t)) abort();
  if (rt_tok_decode(t, ids, n, &out, &olen, &ocap, err, sizeof err)) abort();
  char *fixed = rt_utf8_sanitize(text, len, &flen);
  if (!fixed || (exact && (flen != olen || memcmp(fixed, out, olen)))) abort();
  free(fixed);
  free(out);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  char err[4096], path[128], path2[128];
  if (!sample[0]) {
    snprintf(dir, sizeof dir, "fuzz_tok_files.%d", (int)getpid());   /* in the working directory */
    mkdir(dir, 0700);
    sample[0] = rt_tok_load(TS_SOURCE_DIR "/samples/tokenizer/tokenizer.json", err, sizeof err);
    sample[1] = rt_tok_load(TS_SOURCE_DIR "/samples/tokenizer/llama3-style", err, sizeof err);
    if (!sample[0] || !sample[1]) { fprintf(stderr, "fuzz_tok: %s\n", err); abort(); }
  }
  if (n && d[0] == 'J') {
    write_file("tokenizer.json", d + 1, n - 1);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    RtTokenizer *t = rt_tok_load(path, err, sizeof err);
    if (t) roundtrip(t, "Hello, world!  It's 2024 <|endoftext|>\r\n\xff", 42, 0);
    rt_tok_free(t);
    return 0;
  }
  if (n && d[0] == 'G') {
    const uint8_t *nul = memchr(d + 1, 0, n - 1);
    size_t vn = nul ? (size_t)(nul - d - 1) : n - 1;
    write_file("vocab.json", d + 1, vn);
    write_file("merges.txt", nul ? nul + 1 : d, nul ? n - 2 - vn : 0);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    snprintf(path2, sizeof path2, "%s/merges.txt", dir);
    RtTokenizer *t = rt_tok_load_gpt2(path, path2, err, sizeof err);
    if (t) {
      int32_t *ids = NULL;
      size_t k = 0, cap = 0;
      rt_tok_encode(t, "the lord's", 10, &ids, &k, &cap);
      free(ids);
    }
    rt_tok_free(t);
    return 0;
  }
  roundtrip(sample[0], (const char *)d, n, 1);
  roundtrip(sample[1], (const char *)d, n, 1);
  return 0;
}
