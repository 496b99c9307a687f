/* indexed.h - Megatron's indexed dataset (MMIDIDX): PREFIX.bin holds the
 * token ids of every sequence back to back in one integer dtype, and
 * PREFIX.idx says where each sequence starts and which sequences make a
 * document (docs/data.md "Indexed datasets" gives the layout byte by byte):
 *
 *   magic "MMIDIDX\0\0" (9 bytes), version u64 = 1, dtype code u8,
 *   sequence count u64 N, document count u64 M (= documents + 1),
 *   sequence lengths i32[N], sequence pointers i64[N] (byte offsets into
 *   .bin), document index i64[M] (the first sequence of each document,
 *   then N), all little-endian.
 *
 * Dtype codes (Megatron's): 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32,
 * 8 u16.  Token datasets use 8 (u16) when the vocabulary has fewer than
 * 65500 ids, else 4 (i32).
 *
 * Readers map both files (never read whole) and check the whole index up
 * front: a truncated or damaged file is refused naming it, never read
 * past.  Writers stream .bin and write .idx last, each atomically
 * (ir/io.c's output rules). */
#ifndef TS_RT_INDEXED_H
#define TS_RT_INDEXED_H
#include <stddef.h>
#include <stdint.h>

enum { RT_IDX_U8 = 1, RT_IDX_I8 = 2, RT_IDX_I16 = 3, RT_IDX_I32 = 4, RT_IDX_I64 = 5, RT_IDX_F64 = 6,
       RT_IDX_F32 = 7, RT_IDX_U16 = 8 };

/* Bytes of one element of dtype code c; 0 for an unknown code. */
size_t rt_idx_dtype_size(int code);
/* The dtype code Megatron picks for a vocabulary of n ids. */
int rt_idx_dtype_for_vocab(int64_t n);

typedef struct {
  const unsigned char *idx, *bin;   /* the mapped files */
  size_t idx_len, bin_len;
  int dtype;                        /* code */
  size_t elem;                      /* bytes per element */
  int64_t n_seq, n_doc;             /* sequences; documents (entries of doc_idx - 1) */
  const int32_t *seq_len;           /* [n_seq], into idx */
  const int64_t *seq_ptr;           /* [n_seq] byte offsets into bin */
  const int64_t *doc_idx;           /* [n_doc + 1] */
} RtIndexed;

/* Opens PREFIX.idx and PREFIX.bin.  0, or -1 with err naming the file and
 * what is wrong (magic, version, dtype code, counts against the file
 * size, a pointer or length outside .bin, document index not increasing). */
int rt_indexed_open(RtIndexed *d, const char *prefix, char *err, size_t errlen);
void rt_indexed_close(RtIndexed *d);
/* Element i of sequence s as int64 (integer dtypes). */
int64_t rt_indexed_get(const RtIndexed *d, int64_t s, int64_t i);
/* Elements [off, off + n) of sequence s into out (int32); the caller keeps
 * off + n <= seq_len[s]. */
void rt_indexed_read(const RtIndexed *d, int64_t s, int64_t off, int64_t n, int32_t *out);

/* Writing: sequences are appended in order; rt_indexed_end_doc closes a
 * document (every document holds at least one sequence).  finish writes
 * .idx and commits both files; abort removes what was written. */
typedef struct RtIndexedWriter RtIndexedWriter;
RtIndexedWriter *rt_indexed_create(const char *prefix, int dtype, char *err, size_t errlen);
/* 0, or -1 with err (a write failure naming the path, or an id that does
 * not fit the dtype). */
int rt_indexed_add(RtIndexedWriter *w, const int32_t *ids, size_t n, char *err, size_t errlen);
void rt_indexed_end_doc(RtIndexedWriter *w);
int rt_indexed_finish(RtIndexedWriter *w, char *err, size_t errlen);
void rt_indexed_abort(RtIndexedWriter *w);

#endif
