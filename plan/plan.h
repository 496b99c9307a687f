/* plan.h - the plan: what `mcc` writes and `mrun` executes.
 *
 * A plan holds the device mesh, the distinct rank programs (each an
 * IrModule after all passes, carrying its states with their initializers
 * and the training config), and which program each rank runs.
 *
 * On disk (binary, little-endian):
 *   magic "TSPLAN\0\0" | u32 version | u32 flags | u64 payload bytes |
 *   u64 checksum (ts_hash64 of the payload) | payload
 * plan_read refuses, with a message saying which: a file that is not a
 * plan, a truncated one, a corrupted one (checksum), and a newer version.
 * The text form (mcc --emit=plan-text) holds the same content and parses
 * back into an identical plan.
 * CUDA images (mcc --target) are an optional CUDA record after the rank
 * table (absent when there are none, so such plans are unchanged), and in
 * the text form a `cuda N` section after the rank lines with PTX and
 * cubin in base64. */
#ifndef TS_PLAN_H
#define TS_PLAN_H
#include "ir/ir.h"
#include "codegen/cuda.h"

#define PLAN_VERSION 4   /* 3: the train record carries the optimizer and the wsd schedule; 4: and Muon's
                            AdamW-group lr */

typedef struct { int dp, pp, cp, ep, tp; } PlanMesh;   /* axes outer to inner; tp innermost */

/* A program's CUDA module compiled for one arch (mcc --target): the PTX
 * (a newer GPU's driver JITs it), the cubin, ptxas' report per kernel, and
 * the hash of the module's source (RtCudaModule.hash), so mrun can tell
 * whether the binary is for the module it rebuilds from the program. */
typedef struct {
  int program;
  int sm;                    /* 80, 90 */
  uint64_t source_hash;
  char *ptx;                 /* NUL-terminated */
  size_t ptx_len;
  void *cubin;
  size_t cubin_len;
  int nkern;
  CgPtxasInfo *kern;
} PlanImage;

typedef struct Plan {
  uint32_t version;
  PlanMesh mesh;
  const char *source;        /* the .mdl it was compiled from (informational) */
  int nprograms;
  IrModule **programs;
  int nranks;
  int *rank_program;         /* rank -> index into programs */
  int nimages;               /* CUDA modules (mcc --target), any number per program */
  PlanImage *images;
} Plan;

Plan *plan_new(void);
/* Adds an image (copied). */
void plan_add_image(Plan *p, const PlanImage *im);
/* Program `program`'s image for arch sm, or NULL. */
const PlanImage *plan_image(const Plan *p, int program, int sm);
void plan_free(Plan *p);                 /* frees the programs too */
int plan_write(const Plan *p, const char *path, char *err, size_t errlen);  /* atomic */
/* plan_read (and mrun's reader) also refuse a device (a plan is a file or a
 * pipe) and a file larger than PLAN_MAX_BYTES: a plan is the rank programs
 * and their kernels, megabytes (GPT-3 175B at tp 8 pp 16: 2.7 MB without
 * GPU images), never the weights. */
#define PLAN_MAX_BYTES ((size_t)256 << 20)
Plan *plan_read(const char *path, char *err, size_t errlen);
/* plan_read's bounded read of the file: NULL with the message in err. */
char *plan_read_bytes(const char *path, size_t *len, char *err, size_t errlen);
/* The plan in data[0..len) (binary or text; NUL-terminated at len), read
 * from path (for messages). */
Plan *plan_from_bytes(const char *data, size_t len, const char *path, char *err, size_t errlen);
/* In-memory forms of the same (used by the file functions and by tests). */
void plan_encode(const Plan *p, StrBuf *out);
Plan *plan_decode(const void *data, size_t len, char *err, size_t errlen);
void plan_print_text(const Plan *p, StrBuf *out);
Plan *plan_parse_text(const char *text, const char *fname, char *err, size_t errlen);

#endif
