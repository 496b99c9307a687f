/* idx_test.c - the indexed dataset's reader and writer
 * (runtime/data/indexed.c), run in a scratch directory given as argv[1].
 *
 *   - a written dataset reads back: counts, lengths, pointers, the
 *     document index (an empty document included), every element, reads
 *     across sequence boundaries; u16, u8 and i32;
 *   - the writer refuses an id that does not fit its dtype (65536 in u16,
 *     256 in u8, a negative id) instead of wrapping it, and an aborted
 *     writer leaves no file behind;
 *   - the reader refuses each kind of damage with its own message naming
 *     the file and the numbers: truncated .idx / .bin, a longer .bin, wrong
 *     magic, version, dtype code (unknown and float), counts, a negative
 *     length, a pointer past .bin or out of line with the lengths, a document
 *     index that does not start at 0, decreases, or does not end at the
 *     sequence count, a missing .bin. */
#include "runtime/data/indexed.h"
#include "tests/check.h"
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char err[1024];

/* The good dataset: 3 sequences in 3 documents, the last one empty:
 * doc 0 = {[1,2,3], [4,5]}, doc 1 = {[6]}, doc 2 = {}. */
static const int32_t S0[] = {1, 2, 3}, S1[] = {4, 5}, S2[] = {6};

static int write_good(const char *prefix, int dtype) {
  RtIndexedWriter *w = rt_indexed_create(prefix, dtype, err, sizeof err);
  if (!w) return -1;
  int rc = rt_indexed_add(w, S0, 3, err, sizeof err);
  if (rc == 0) rc = rt_indexed_add(w, S1, 2, err, sizeof err);
  rt_indexed_end_doc(w);
  if (rc == 0) rc = rt_indexed_add(w, S2, 1, err, sizeof err);
  rt_indexed_end_doc(w);
  rt_indexed_end_doc(w);
  if (rc != 0) { rt_indexed_abort(w); return rc; }
  return rt_indexed_finish(w, err, sizeof err);
}

static void check_good(const char *prefix, int dtype) {
  RtIndexed d;
  int rc = rt_indexed_open(&d, prefix, err, sizeof err);
  CHECK(rc == 0, "%s: %s", prefix, err);
  if (rc != 0) return;
  size_t e = rt_idx_dtype_size(dtype);
  CHECK(d.dtype == dtype && d.elem == e && d.n_seq == 3 && d.n_doc == 3 && d.n_tok == 6);
  CHECK(d.idx_len == 34 + 12 * 3 + 8 * 4, "%zu", d.idx_len);
  CHECK(d.bin_len == 6 * e);
  CHECK(rt_indexed_seq_len(&d, 0) == 3 && rt_indexed_seq_len(&d, 1) == 2 && rt_indexed_seq_len(&d, 2) == 1);
  CHECK(rt_indexed_seq_ptr(&d, 0) == 0 && rt_indexed_seq_ptr(&d, 1) == (int64_t)(3 * e) &&
        rt_indexed_seq_ptr(&d, 2) == (int64_t)(5 * e));
  CHECK(rt_indexed_doc_idx(&d, 0) == 0 && rt_indexed_doc_idx(&d, 1) == 2 && rt_indexed_doc_idx(&d, 2) == 3 &&
        rt_indexed_doc_idx(&d, 3) == 3);
  CHECK(rt_indexed_get(&d, 0, 2) == 3 && rt_indexed_get(&d, 1, 1) == 5 && rt_indexed_get(&d, 2, 0) == 6);
  int32_t all[6], part[2];
  rt_indexed_read_at(&d, 0, 6, all);
  for (int k = 0; k < 6; k++) CHECK(all[k] == k + 1, "element %d is %d", k, all[k]);
  rt_indexed_read(&d, 1, 1, 2, part);   /* from sequence 1 into sequence 2 */
  CHECK(part[0] == 5 && part[1] == 6);
  rt_indexed_close(&d);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* No file of the directory starts with name (a temporary file left). */
static int none_named(const char *dir, const char *name) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int found = 0;
  while (d && (e = readdir(d))) found |= strncmp(e->d_name, name, strlen(name)) == 0;
  if (d) closedir(d);
  return !found;
}

static void check_writer_refuses(int dtype, int32_t id, const char *want) {
  RtIndexedWriter *w = rt_indexed_create("refused", dtype, err, sizeof err);
  CHECK(w != NULL, "%s", err);
  if (!w) return;
  int32_t ids[] = {7, id};
  err[0] = 0;
  CHECK(rt_indexed_add(w, ids, 2, err, sizeof err) != 0, "id %d accepted in dtype %d", id, dtype);
  CHECK(strstr(err, want) && strstr(err, "refused.bin"), "got '%s', want '%s'", err, want);
  CHECK(rt_indexed_finish(w, err, sizeof err) != 0);   /* a failed writer does not commit */
  CHECK(!exists("refused.bin") && !exists("refused.idx") && none_named(".", "refused."));
}

/* ---- damaged copies of the good dataset ---- */
static unsigned char good_idx[4096], good_bin[4096];
static size_t good_idx_n, good_bin_n;

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap, f) : 0;
  if (f) fclose(f);
  return n;
}

static void spit(const char *path, const unsigned char *p, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

static void put64(unsigned char *p, int64_t v) { memcpy(p, &v, 8); }
static void put32(unsigned char *p, int32_t v) { memcpy(p, &v, 4); }

/* Offsets in the good .idx (3 sequences, 4 document index entries). */
enum { O_VER = 9, O_DT = 17, O_N = 18, O_M = 26, O_LEN = 34, O_PTR = 34 + 12, O_DOC = 34 + 36 };

/* Writes bad.idx / bad.bin from copies of the good files changed by the
 * caller, opens "bad" and checks the refusal names `file` and says `want`. */
static void expect_refusal(int line, const unsigned char *idx, size_t ni, const unsigned char *bin, size_t nb,
                           const char *file, const char *want) {
  spit("bad.idx", idx, ni);
  if (bin) spit("bad.bin", bin, nb);
  else unlink("bad.bin");
  RtIndexed d;
  err[0] = 0;
  int rc = rt_indexed_open(&d, "bad", err, sizeof err);
  CHECK_AT(__FILE__, line, rc != 0, "accepted; wanted '%s'", want);
  if (rc == 0) rt_indexed_close(&d);
  CHECK_AT(__FILE__, line, strstr(err, want) != NULL, "got '%s', wanted '%s'", err, want);
  CHECK_AT(__FILE__, line, strncmp(err, file, strlen(file)) == 0, "'%s' does not name %s", err, file);
}
#define REFUSED(idx, ni, bin, nb, file, want) expect_refusal(__LINE__, idx, ni, bin, nb, file, want)

static void check_refusals(void) {
  unsigned char i[4096], b[4096];
  size_t ni = good_idx_n, nb = good_bin_n;
#define FRESH() (memcpy(i, good_idx, ni), memcpy(b, good_bin, nb))
  FRESH();
  REFUSED(i, 20, b, nb, "bad.idx", "truncated: 20 bytes, the header alone takes 34");
  REFUSED(i, ni - 8, b, nb, "bad.idx", "3 sequences and 4 document index entries take 102 bytes, the file has 94");
  REFUSED(i, ni + 3, b, nb, "bad.idx", "take 102 bytes, the file has 105 (a multimodal index");
  REFUSED(i, ni, b, nb - 2, "bad.idx", "sequence 2 (1 u16 elements at byte 10) ends at byte 12, past the end of bad.bin (10 bytes)");
  REFUSED(i, ni, b, nb + 2, "bad.bin", "14 bytes, but its index bad.idx describes 12");
  REFUSED(i, ni, NULL, 0, "bad.bin", "cannot open");
  i[0] = 'X';
  REFUSED(i, ni, b, nb, "bad.idx", "not a Megatron indexed dataset index");
  FRESH();
  put64(i + O_VER, 2);
  REFUSED(i, ni, b, nb, "bad.idx", "version 2; only version 1 is known");
  FRESH();
  i[O_DT] = 9;
  REFUSED(i, ni, b, nb, "bad.idx", "unknown dtype code 9");
  i[O_DT] = 0;
  REFUSED(i, ni, b, nb, "bad.idx", "unknown dtype code 0");
  i[O_DT] = RT_IDX_F32;
  REFUSED(i, ni, b, nb, "bad.idx", "dtype code 7 (f32) is not an integer type");
  i[O_DT] = RT_IDX_I32;   /* 4-byte elements: the same index describes 24 bytes */
  REFUSED(i, ni, b, nb, "bad.idx", "sequence 1 starts at byte 6 of .bin, but the sequences before it end at 12");
  FRESH();
  put64(i + O_N, 4);
  REFUSED(i, ni, b, nb, "bad.idx", "4 sequences and 4 document index entries take 114 bytes");
  put64(i + O_N, INT64_MAX);
  REFUSED(i, ni, b, nb, "bad.idx", "truncated: 9223372036854775807 sequences and 4 document index entries need more");
  FRESH();
  put64(i + O_M, -1);
  REFUSED(i, ni, b, nb, "bad.idx", "18446744073709551615 document index entries need more");
  FRESH();
  put32(i + O_LEN + 4, -2);
  REFUSED(i, ni, b, nb, "bad.idx", "sequence 1 has length -2");
  FRESH();
  put32(i + O_LEN + 8, 1000);
  REFUSED(i, ni, b, nb, "bad.idx", "sequence 2 (1000 u16 elements at byte 10) ends at byte 2010, past the end of bad.bin");
  FRESH();
  put64(i + O_PTR + 16, 1 << 20);
  REFUSED(i, ni, b, nb, "bad.idx", "sequence 2 starts at byte 1048576 of .bin, but the sequences before it end at 10");
  FRESH();
  put64(i + O_PTR, 2);
  REFUSED(i, ni, b, nb, "bad.idx", "sequence 0 starts at byte 2 of .bin, but the sequences before it end at 0");
  FRESH();
  put64(i + O_DOC, 1);
  REFUSED(i, ni, b, nb, "bad.idx", "the document index starts at 1, not 0");
  FRESH();
  put64(i + O_DOC + 16, 1);
  REFUSED(i, ni, b, nb, "bad.idx", "the document index decreases: entry 1 is 2, entry 2 is 1");
  FRESH();
  put64(i + O_DOC + 16, 2);
  put64(i + O_DOC + 24, 2);
  REFUSED(i, ni, b, nb, "bad.idx", "the document index ends at 2, not at the sequence count 3");
#undef FRESH
}

int main(int argc, char **argv) {
  if (argc != 2 || chdir(argv[1]) != 0) { fprintf(stderr, "usage: idx_test SCRATCH_DIR\n"); return 2; }
  CHECK(write_good("good", RT_IDX_U16) == 0, "%s", err);
  check_good("good", RT_IDX_U16);
  CHECK(write_good("good8", RT_IDX_U8) == 0, "%s", err);
  check_good("good8", RT_IDX_U8);
  CHECK(write_good("good32", RT_IDX_I32) == 0, "%s", err);
  check_good("good32", RT_IDX_I32);
  CHECK(none_named(".", "good.idx.tmp") && none_named(".", "good.bin.tmp"));

  check_writer_refuses(RT_IDX_U16, 65536, "id 65536 (element 1 of sequence 0) does not fit the dtype u16 (ids 0 to 65535)");
  check_writer_refuses(RT_IDX_U8, 256, "id 256 (element 1 of sequence 0) does not fit the dtype u8");
  check_writer_refuses(RT_IDX_I32, -1, "id -1 (element 1 of sequence 0) does not fit the dtype i32");
  CHECK(rt_indexed_create("x", RT_IDX_F64, err, sizeof err) == NULL && strstr(err, "not an integer dtype"), "%s", err);
  /* 70000 fits i32 and reads back */
  RtIndexedWriter *w = rt_indexed_create("wide", RT_IDX_I32, err, sizeof err);
  int32_t big[] = {70000, 0, 2147483647};
  CHECK(w && rt_indexed_add(w, big, 3, err, sizeof err) == 0, "%s", err);
  if (w) rt_indexed_end_doc(w);
  CHECK(w && rt_indexed_finish(w, err, sizeof err) == 0, "%s", err);
  RtIndexed d;
  CHECK(rt_indexed_open(&d, "wide", err, sizeof err) == 0 && rt_indexed_get(&d, 0, 0) == 70000 &&
        rt_indexed_get(&d, 0, 2) == 2147483647, "%s", err);
  rt_indexed_close(&d);

  good_idx_n = slurp("good.idx", good_idx, sizeof good_idx);
  good_bin_n = slurp("good.bin", good_bin, sizeof good_bin);
  CHECK(good_idx_n == 102 && good_bin_n == 12);
  check_refusals();
  return check_exit("idx.reader");
}
