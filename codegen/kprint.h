/* kprint.h - the one kernel-IR printer (kprint.c) and its two dialects:
 * C (cprint.c, cg_kernel_c_text in cg.h) and CUDA C (cuda.c,
 * cg_kernel_cuda_text in cuda.h).  Internal to codegen/.
 *
 * kprint.c prints the body of one iteration, the same in both; a dialect
 * says how its target spells what differs (below), and its own file
 * prints the kernel's head, the prelude and the loop that hands out the
 * iterations (C: [begin, end) on one thread; CUDA: thread, vector or row
 * mode, which set the `row` / `vec` fields of the printer). */
#ifndef TS_CG_KPRINT_H
#define TS_CG_KPRINT_H
#include "cg.h"

/* What the dialects spell differently inside an iteration. */
typedef struct {
  const char *type[CG_TYPE_COUNT];  /* scalar types (NVRTC has no <stdint.h>: CUDA says long long) */
  const char *u32, *u64;            /* the unsigned forms integer add / sub / mul / shr go through */
  const char *i64_min;              /* INT64_MIN (-9223372036854775808LL is not a literal) */
  const char *nan_f32, *nan_f64;    /* NaN and +infinity constants of each float type */
  const char *inf_f32, *inf_f64;
  const char *helper;               /* prefix of the prelude's maximum / to_i32 / to_i64 */
  const char *param;                /* the array PARAM k reads: NAME[k] */
  int narrow;                       /* i64 index arithmetic whose values provably fit in 32 bits is
                                       printed in `int` (CUDA: 64-bit integer division is a long
                                       software sequence; cg_kp_init's interval analysis) */
} CgDialect;

/* The printer of one kernel: the dialect and the loop structure. */
typedef struct {
  const CgKernel *k;
  const CgDialect *d;
  int n;            /* instructions */
  int *top;         /* per instruction: the top-level RANGE whose loop holds it, -1 at top level
                       (a top-level RANGE and its END are at top level) */
  int *match;       /* RANGE -> its END, END -> its RANGE */
  int *mark;        /* scratch, one per instruction, 0 after cg_kp_init */
  int gid;          /* the GID instruction, -1 if none */
  int row;          /* CUDA row mode: iteration = block (cuda.c) */
  int64_t split;    /* CUDA split rows (> 1): iteration = `split` blocks, the block's part of it
                       `ts_chunk`; the top-level loop's partials combined by the last block (cuda.c) */
  int vec;          /* CUDA thread mode: vector width (4 or 2), or 0 */
  int lane;         /* while printing a vector lane: its number */
  unsigned char *i32;   /* per instruction: an i64 value printed as a 32-bit int (d->narrow) */
} CgKp;

void cg_kp_init(CgKp *p, const CgKernel *k, const CgDialect *d);
void cg_kp_free(CgKp *p);
static inline const CgInst *cg_kp_ins(const CgKp *p, int i) { return &p->k->code.a[i]; }
/* Appends the statements of one iteration (gid is in scope), indented by
 * base levels of two spaces. */
void cg_kp_body(CgKp *p, StrBuf *out, int base);

#endif
