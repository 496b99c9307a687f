/* rt.h - the runtime's view of one rank's program (an IrModule after the
 * passes): persistent state in memory, and execution of its blocks.
 * This is the reference backend: every op has a plain-C kernel (ops_ref.c)
 * for f32 and f64, GEMMs through BLAS. */
#ifndef TS_RT_H
#define TS_RT_H
#include "../ir/ir.h"
#include "plan.h"

typedef struct RtProgram RtProgram;
typedef struct RtComm RtComm;   /* comm.h */

/* Where a rank sits in the device mesh, and its communicators: group[a]
 * is the rank's group along mesh axis a (ordered by the coordinate on a,
 * as rt_comm_mesh_group makes them), NULL when the axis has size 1.  The
 * kernels use coord[] to find a local element's global index (see
 * docs/sharding.md) and group[] for the collectives. */
typedef struct RtRank {
  RtMesh mesh;
  int coord[IR_AXIS_COUNT];
  RtComm *group[IR_AXIS_COUNT];
} RtRank;
/* The single-rank context: 1x1x1x1x1 mesh, coordinates 0, no groups. */
RtRank rt_rank_single(void);
/* Size of axis a of r's mesh (sizes < 1 count as 1). */
int rt_rank_axis_size(const RtRank *r, IrAxis a);

/* Allocates every state of m and initializes parameters from m->train.seed.
 * Initialization is counter-based: element i of parameter P gets
 * rng(seed, hash(P's name), i), so it does not depend on parameter order or
 * on how a later pass shards P.  Other states start at zero.
 * NULL with a message in err on failure. m must outlive the program. */
RtProgram *rt_program_new(const IrModule *m, char *err, size_t errlen);
/* The same for one rank of a sharded module: m's axis sizes (m->par) must
 * be those of r's mesh, and every axis of size > 1 needs its group (unless
 * the caller only runs local ops, as the kernel tests do).  Parameters are
 * initialized from their GLOBAL indices (so every rank holds exactly its
 * block of the single-rank initialization).  r is copied; its groups must
 * outlive the program. */
RtProgram *rt_program_new_rank(const IrModule *m, const RtRank *r, char *err, size_t errlen);
const RtRank *rt_program_rank(const RtProgram *p);
void rt_program_free(RtProgram *p);
const IrModule *rt_program_module(const RtProgram *p);

/* Contiguous row-major data of state s (dtype and shape of its IrState). */
void *rt_state_data(RtProgram *p, int s);

/* One input fed to a block: matched by name to the block's INPUT nodes,
 * must have the same dtype and shape. */
typedef struct { const char *name; const void *data; } RtFeed;

/* Per-run facts that ops read: step and micro-batch (dropout masks), lr. */
typedef struct { int64_t step; int micro; double lr; } RtRunInfo;

/* Executes block b once.  0 on success; -1 with a message (missing feed,
 * ...).  Every OUTPUT node's value is recorded and can be read back. */
int rt_run_block(RtProgram *p, int b, const RtFeed *feeds, int nfeeds,
                 const RtRunInfo *info, char *err, size_t errlen);
/* The value last reported by `output "name"`; 0 if found, -1 if never. */
int rt_output(const RtProgram *p, const char *name, double *value);
/* Forgets every recorded output (so a caller can tell "not reported by
 * this run" from a stale value). */
void rt_outputs_clear(RtProgram *p);

/* The learning rate at `step` (0-based) under m->train's schedule. */
double rt_lr_at(const IrTrain *t, int64_t step);

#endif
