/* fuzz_ckpt_index.c - libFuzzer target for a checkpoint's index reader
 * (runtime/exec/ckpt_index.c: the rank_RRRRR.idx lines the loader and the
 * metadata writer read).  The input is one rank's index text.  For every
 * line the reader accepts, printing it and reading it back must give the
 * same shard, and printing that the same line (the format's round trip);
 * every accepted shard is found by its name after sorting.  abort()
 * otherwise.  Built with clang's -fsanitize=fuzzer,address,undefined by
 * tests/ckpt/CMakeLists.txt; a crash, a hang, a leak or a broken round
 * trip fails the run. */
#include "runtime/exec/ckpt_index.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const CkShard *a, const CkShard *b) {
  return !strcmp(a->name, b->name) && a->kind == b->kind && a->dtype == b->dtype && a->rank == b->rank &&
         a->lrank == b->lrank && a->fi == b->fi && a->fc == b->fc && a->partial == b->partial && a->at == b->at &&
         a->bytes == b->bytes && a->hash == b->hash && !memcmp(a->global, b->global, sizeof a->global) &&
         !memcmp(a->off, b->off, sizeof a->off) && !memcmp(a->block, b->block, sizeof a->block) &&
         !memcmp(a->shape, b->shape, sizeof a->shape);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1), err[512];
  memcpy(text, data, size);
  text[size] = 0;
  CkIndex x = {0};
  if (ck_index_add_text(&x, text, 0, "<fuzz>", err, sizeof err) == 0) {
    for (int i = 0; i < x.n; i++) {
      StrBuf a = {0}, b = {0};
      CkShard back;
      ck_shard_print(&a, &x.a[i]);
      a.p[--a.n] = 0;   /* the newline */
      if (ck_shard_parse(a.p, 0, &back) != 0) { fprintf(stderr, "fuzz_ckpt_index: a printed line is refused: %s\n", a.p); abort(); }
      if (!same(&back, &x.a[i])) { fprintf(stderr, "fuzz_ckpt_index: print -> parse differs: %s\n", a.p); abort(); }
      ck_shard_print(&b, &back);
      b.p[--b.n] = 0;
      if (strcmp(a.p, b.p)) { fprintf(stderr, "fuzz_ckpt_index: print -> parse -> print differs\n"); abort(); }
      free(back.name);
      sb_free(&a);
      sb_free(&b);
    }
    ck_index_sort(&x);
    for (int i = 0; i < x.n; i++) {
      int lo, hi = ck_index_find(&x, x.a[i].name, &lo), found = 0;
      for (int k = lo; k < hi; k++) found |= x.ord[k] == i;
      if (!found) { fprintf(stderr, "fuzz_ckpt_index: shard %d is not found by its name\n", i); abort(); }
    }
  }
  ck_index_free(&x);
  free(text);
  return 0;
}
