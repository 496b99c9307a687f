/* ckpt_index.h - the text index of a checkpoint's shard files
 * (rank_RRRRR.idx, docs/checkpoints.md): one line per tensor of the rank,
 *   tensor NAME kind=K dtype=D global=[..] offsets=[..] shape=[..]
 *          block=[..] flat=I/N partial=AXES|- at=A bytes=B hash=H
 * written by the save, read by the metadata writer and the loader.  Only
 * ir/ is needed (tests/ckpt fuzzes the parser on its own). */
#ifndef TS_CKPT_INDEX_H
#define TS_CKPT_INDEX_H
#include "ir/ir.h"
#include "ir/util.h"

typedef struct CkShard {
  char *name;
  int kind, dtype;               /* IrStateKind, IrDtype */
  int rank;                      /* of the global tensor (and of block, offsets) */
  int lrank;                     /* of the local value (1 for a flat chunk) */
  int fi, fc;                    /* flat (ZeRO) chunk fi of fc; 0 of 1: not flat */
  unsigned partial;              /* mask of axes the local value is a partial sum over */
  int owner;                     /* the world rank that wrote it */
  int64_t global[IR_MAX_RANK], off[IR_MAX_RANK], block[IR_MAX_RANK], shape[IR_MAX_RANK];
  size_t at, bytes;              /* where the data is in the owner's .bin */
  uint64_t hash;                 /* ts_hash64 of the data, seed 0 */
} CkShard;

typedef struct CkIndex {
  CkShard *a;
  int n, cap;
  int *first;                    /* per rank added: its first shard (first[nranks] = n) */
  int nranks;
  int *ord;                      /* after ck_index_sort: shards by (name, position) */
} CkIndex;

/* One line (no newline) into *e; its name is heap-owned by *e on success.
 * -1 if malformed or inconsistent (sizes that do not agree). */
int ck_shard_parse(const char *line, int owner, CkShard *e);
/* The line of e, with its newline: what ck_shard_parse reads back. */
void ck_shard_print(StrBuf *b, const CkShard *e);
/* "tensor NAME kind=K dtype=D global=[..]": what names a tensor in the
 * model hash. */
void ck_shard_head(StrBuf *b, const CkShard *e);

/* Adds every line of text (rank `owner`'s index; the next rank in order)
 * to x.  0, or -1 naming `path` and the bad line. */
int ck_index_add_text(CkIndex *x, const char *text, int owner, const char *path, char *err, size_t errlen);
/* Sorts (fills x->ord) once every rank's text is in. */
void ck_index_sort(CkIndex *x);
/* The run of x->ord holding the shards of `name`: [*lo, return). */
int ck_index_find(const CkIndex *x, const char *name, int *lo);
void ck_index_free(CkIndex *x);

void ck_dims_text(StrBuf *b, const int64_t *d, int n);
/* The product of n dims, or -1 past 2^62. */
int64_t ck_dims_numel(const int64_t *d, int n);

#endif
