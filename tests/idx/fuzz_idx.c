/* fuzz_idx.c - libFuzzer target for the indexed dataset's reader
 * (runtime/data/indexed.c, rt_indexed_from_memory: the checks
 * rt_indexed_open makes on the mapped files).  The input is
 *     u32 LE k, then k bytes of .idx, then the rest: .bin
 * (k larger than what follows takes it all, .bin empty).  Each part is
 * copied into its own buffer of exactly its size, so a read past either
 * is an ASan report.  For an accepted pair every access the interface
 * offers is made and must agree with the format's relations; abort()
 * otherwise.  Built with clang's -fsanitize=fuzzer,address,undefined by
 * tests/idx/CMakeLists.txt; seeds: mprep's outputs (fuzz_idx.sh). */
#include "runtime/data/indexed.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
  fprintf(stderr, "fuzz_idx: %s\n", what);
  abort();
}

/* Every sequence of every document read three ways: get, read, read_at. */
static void walk(const RtIndexed *d) {
  if (rt_indexed_doc_idx(d, 0) != 0 || rt_indexed_doc_idx(d, d->n_doc) != d->n_seq) fail("document index ends");
  int64_t tok = 0;
  for (int64_t doc = 0; doc < d->n_doc; doc++) {
    int64_t a = rt_indexed_doc_idx(d, doc), b = rt_indexed_doc_idx(d, doc + 1);
    if (a > b || b > d->n_seq) fail("document index order");
    for (int64_t s = a; s < b; s++) {
      int32_t len = rt_indexed_seq_len(d, s);
      if (rt_indexed_seq_ptr(d, s) != tok * (int64_t)d->elem) fail("pointer out of line");
      int32_t *x = malloc(((size_t)len + 1) * sizeof *x), *y = malloc(((size_t)len + 1) * sizeof *y);
      rt_indexed_read(d, s, 0, len, x);
      rt_indexed_read_at(d, tok, len, y);
      for (int32_t i = 0; i < len; i++) {
        int64_t v = rt_indexed_get(d, s, i);
        if (x[i] != y[i] || (v >= INT32_MIN && v <= INT32_MAX ? v != x[i] : x[i] != -1)) fail("reads disagree");
      }
      free(x);
      free(y);
      tok += len;
    }
  }
  if (tok != d->n_tok || (size_t)tok * d->elem != d->bin_len) fail("token count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  uint32_t k;
  memcpy(&k, data, 4);
  size_t rest = size - 4, ni = k < rest ? k : rest, nb = rest - ni;
  unsigned char *idx = malloc(ni ? ni : 1), *bin = malloc(nb ? nb : 1);
  memcpy(idx, data + 4, ni);
  memcpy(bin, data + 4 + ni, nb);
  RtIndexed d;
  char err[512];
  if (rt_indexed_from_memory(&d, idx, ni, bin, nb, "fuzz", err, sizeof err) == 0) {
    walk(&d);
    rt_indexed_close(&d);
  } else if (strncmp(err, "fuzz.", 5) != 0) {
    fail("a refusal that does not name the file");
  }
  free(idx);
  free(bin);
  return 0;
}
