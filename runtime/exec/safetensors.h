/* safetensors.h - reading and writing the safetensors format (Hugging
 * Face's weight files): an 8-byte little-endian header length N, N bytes
 * of JSON {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
 * ..., "__metadata__": {string: string}}, then the data, each tensor
 * row-major little-endian at [b, e) of it.
 *
 * The reader trusts nothing in the file: the header length is bounded
 * (100 MB, the format's own limit) and must fit the file, every tensor's
 * byte range must equal its shape times its dtype's size, the ranges must
 * tile the data exactly (no overlap, no hole, as the reference
 * implementation requires), names are unique and non-empty.  Fuzzed by
 * tests/hf/fuzz_safetensors.c. */
#ifndef TS_SAFETENSORS_H
#define TS_SAFETENSORS_H
#include "ir/ir.h"
#include "ir/util.h"

#define RT_ST_MAX_RANK 8
#define RT_ST_MAX_HEADER (100u << 20)

typedef enum {
  RT_ST_BOOL, RT_ST_U8, RT_ST_I8, RT_ST_I16, RT_ST_U16, RT_ST_F16, RT_ST_BF16, RT_ST_I32, RT_ST_U32, RT_ST_F32,
  RT_ST_F64, RT_ST_I64, RT_ST_U64, RT_ST_F8_E4M3, RT_ST_F8_E5M2, RT_ST_DTYPE_COUNT
} RtStDtype;

const char *rt_st_dtype_name(RtStDtype d);   /* "F32", ... as the format spells them */
size_t rt_st_dtype_size(RtStDtype d);
int rt_st_dtype_is_float(RtStDtype d);       /* F64, F32, F16, BF16 (read as numbers) */

typedef struct {
  const char *name;
  RtStDtype dtype;
  int rank;
  int64_t dim[RT_ST_MAX_RANK];
  int64_t numel;
  const unsigned char *data;   /* into the file's bytes */
  size_t bytes;
} RtStTensor;

typedef struct {
  Arena arena;            /* names, the parsed header */
  const char *path;       /* (in the arena) for messages */
  void *map;              /* the file, mapped; or NULL (rt_st_parse on a caller's buffer) */
  size_t len;
  int n;
  RtStTensor *a;          /* in header order */
  const char *format;     /* __metadata__.format if given ("pt"), else NULL */
} RtStFile;

/* Maps path and parses it.  0, or -1 with a message naming the file. */
int rt_st_open(RtStFile *f, const char *path, char *err, size_t errlen);
/* Parses buf[0, len) (kept by the caller while f is used); what names it. */
int rt_st_parse(RtStFile *f, const void *buf, size_t len, const char *what, char *err, size_t errlen);
void rt_st_close(RtStFile *f);
/* The tensor called name, or NULL. */
const RtStTensor *rt_st_find(const RtStFile *f, const char *name);
/* Element i of a float tensor (rt_st_dtype_is_float) as a double. */
double rt_st_get(const RtStTensor *t, int64_t i);

/* One tensor to write: values as doubles, stored as dtype (F32 or F64). */
typedef struct {
  const char *name;
  RtStDtype dtype;
  int rank;
  int64_t dim[RT_ST_MAX_RANK];
  const double *v;
} RtStOut;
/* Writes the tensors (in that order) with __metadata__ {"format": "pt"}
 * (what transformers requires) to path, atomically.  0, or -1. */
int rt_st_write(const char *path, const RtStOut *t, int n, char *err, size_t errlen);
/* The bytes rt_st_write writes, appended to out. */
void rt_st_encode(StrBuf *out, const RtStOut *t, int n);

#endif
