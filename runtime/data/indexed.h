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

/* The index arrays start at byte 34 of .idx, so they are not aligned for
 * their types: they are kept as byte pointers and read through the
 * accessors below (a memcpy, one load on any machine that allows unaligned
 * loads), never cast to int32_t * / int64_t *. */
typedef struct {
  const unsigned char *idx, *bin;   /* the mapped files (bin NULL when empty) */
  size_t idx_len, bin_len;
  int dtype;                        /* code (an integer one: floats are refused) */
  size_t elem;                      /* bytes per element */
  int64_t n_seq, n_doc;             /* sequences; documents (entries of doc_idx - 1) */
  int64_t n_tok;                    /* elements in .bin = bin_len / elem */
  const unsigned char *seq_len_at;  /* i32[n_seq], into idx */
  const unsigned char *seq_ptr_at;  /* i64[n_seq] byte offsets into bin */
  const unsigned char *doc_idx_at;  /* i64[n_doc + 1] */
  int mapped;                       /* close unmaps idx and bin */
} RtIndexed;

/* Opens PREFIX.idx and PREFIX.bin (both noted as inputs: no output of this
 * process may replace them).  0, or -1 with err naming the file and what
 * is wrong (magic, version, dtype code, counts against the file size, a
 * pointer or length outside .bin, document index not starting at 0,
 * decreasing, or not ending at the sequence count).  Accepted files also
 * satisfy: pointers are the running sum of lengths * elem from 0, .bin
 * holds exactly the last sequence's end, so a document's sequences are
 * contiguous and sequence s's first element is element seq_ptr(s) / elem
 * of the whole .bin.  A document may hold no sequence (Megatron writes
 * one for a JSON line whose text gives no token). */
int rt_indexed_open(RtIndexed *d, const char *prefix, char *err, size_t errlen);
void rt_indexed_close(RtIndexed *d);
/* The same checks on two buffers the caller keeps (the fuzzer, tests);
 * messages name NAME.idx and NAME.bin.  close only clears d. */
int rt_indexed_from_memory(RtIndexed *d, const void *idx, size_t idx_len, const void *bin, size_t bin_len,
                           const char *name, char *err, size_t errlen);

static inline int32_t rt_indexed_seq_len(const RtIndexed *d, int64_t s) {
  int32_t v;
  __builtin_memcpy(&v, d->seq_len_at + 4 * s, 4);
  return v;
}
static inline int64_t rt_indexed_seq_ptr(const RtIndexed *d, int64_t s) {
  int64_t v;
  __builtin_memcpy(&v, d->seq_ptr_at + 8 * s, 8);
  return v;
}
/* i in [0, n_doc]: the first sequence of document i; i = n_doc gives n_seq. */
static inline int64_t rt_indexed_doc_idx(const RtIndexed *d, int64_t i) {
  int64_t v;
  __builtin_memcpy(&v, d->doc_idx_at + 8 * i, 8);
  return v;
}

/* Element i of sequence s as int64 (integer dtypes). */
int64_t rt_indexed_get(const RtIndexed *d, int64_t s, int64_t i);
/* Elements [off, off + n) of sequence s into out (int32); the caller keeps
 * off + n <= seq_len(s).  A value outside int32 (an i64 dataset) is read as
 * -1, which no vocabulary holds, so the caller's id check refuses it. */
void rt_indexed_read(const RtIndexed *d, int64_t s, int64_t off, int64_t n, int32_t *out);
/* The same by element position in the whole .bin: [tok, tok + n) of
 * n_tok, across sequence and document boundaries (what a training sample
 * of seq_len + 1 tokens reads). */
void rt_indexed_read_at(const RtIndexed *d, int64_t tok, int64_t n, int32_t *out);

/* Writing: sequences are appended in order; rt_indexed_end_doc closes a
 * document (one with no sequence since the last is recorded as Megatron
 * does: a document index entry equal to the previous).  finish writes .idx
 * and commits both files, .bin first and .idx last; abort removes what was
 * written.  Streams: memory holds 4 bytes per sequence and 8 per
 * document, never the tokens. */
typedef struct RtIndexedWriter RtIndexedWriter;
RtIndexedWriter *rt_indexed_create(const char *prefix, int dtype, char *err, size_t errlen);
/* Appends one sequence of n ids.  0, or -1 with err (a write failure
 * naming the path, an id that does not fit the dtype: negative, or above
 * the dtype's largest value, never wrapped; a sequence of 2^31 or more
 * elements).  After a failure the writer only aborts. */
int rt_indexed_add(RtIndexedWriter *w, const int32_t *ids, size_t n, char *err, size_t errlen);
void rt_indexed_end_doc(RtIndexedWriter *w);
int rt_indexed_finish(RtIndexedWriter *w, char *err, size_t errlen);
void rt_indexed_abort(RtIndexedWriter *w);

#endif
