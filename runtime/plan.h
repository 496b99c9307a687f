/* plan.h - the plan: what `mcc` writes and `mrun` executes.
 *
 * A plan holds the device mesh, the distinct rank programs (each an
 * IrModule after all passes, carrying its states with their initializers
 * and the training config), and which program each rank runs.
 *
 * On disk (binary, little-endian):
 *   magic "TSPLAN\0\0" | u32 version | u32 flags | u64 payload bytes |
 *   u64 checksum (ts_hash64 of the payload) | payload
 * rt_plan_read refuses, with a message saying which: a file that is not a
 * plan, a truncated one, a corrupted one (checksum), and a newer version.
 * The text form (mcc --emit=plan-text) holds the same content and parses
 * back into an identical plan. */
#ifndef TS_PLAN_H
#define TS_PLAN_H
#include "../ir/ir.h"

#define RT_PLAN_VERSION 2

typedef struct { int dp, pp, cp, ep, tp; } RtMesh;   /* axes outer to inner; tp innermost */

typedef struct RtPlan {
  uint32_t version;
  RtMesh mesh;
  const char *source;        /* the .mdl it was compiled from (informational) */
  int nprograms;
  IrModule **programs;
  int nranks;
  int *rank_program;         /* rank -> index into programs */
} RtPlan;

RtPlan *rt_plan_new(void);
void rt_plan_free(RtPlan *p);                 /* frees the programs too */
int rt_plan_write(const RtPlan *p, const char *path, char *err, size_t errlen);  /* atomic */
RtPlan *rt_plan_read(const char *path, char *err, size_t errlen);
/* In-memory forms of the same (used by the file functions and by tests). */
void rt_plan_encode(const RtPlan *p, StrBuf *out);
RtPlan *rt_plan_decode(const void *data, size_t len, char *err, size_t errlen);
void rt_plan_print_text(const RtPlan *p, StrBuf *out);
RtPlan *rt_plan_parse_text(const char *text, const char *fname, char *err, size_t errlen);

#endif
