/* dpreduce.h - the data-parallel gradient reduction as buckets issued
 * during the last micro batch's backward (docs/sharding.md, "Overlapped
 * gradient reduction").  Both mcc (--report comm: where each bucket is
 * issued and what it overlaps) and mrun (runtime/exec: when it posts each
 * bucket's nonblocking collective) compute it from a rank's program with
 * this code, so what the report shows is what runs.  Pure function of the
 * IR: nothing here changes it.
 *
 * A gradient takes part when the update block reduces it over dp straight
 * from its state: `all_reduce ~axis=dp` of the state read (no ZeRO), or
 * `reduce_scatter ~axis=dp` of the state flattened and zero-padded (ZeRO-1;
 * over the joint data-parallel group it is a set holding dp, `axis=dp+cp`,
 * also at dp 1), and exactly one other block writes the state (accum:
 * "micro", or a pipeline backward block "bwd.<g>").  A gradient reduced over another axis
 * first (partial over tp under sp, summed across pipeline stages, rows
 * gathered) stays where it is: the update block reduces it as before.
 *
 * Buckets: per (writer block, update block, collective, axes, dtype), the
 * gradients in the order the writer block completes them (position of
 * their last write), closed once they hold at least `bucket_bytes` (the
 * bytes the collective sends per rank: all-reduce sum n_k, reduce-scatter
 * N * sum c_k for a group of N ranks, times the element size).  A bucket is issued after the node
 * that completes its last gradient.  Its buffer (the runtime's, outside the
 * arena) holds the gradients packed: all-reduce [g_1 | g_2 | ...] (each
 * row-major), reduce-scatter [N][sum c_k], rank r's block being chunk r of
 * each gradient in turn (zero-padded): rank r then receives exactly the
 * chunks the update block's reduce_scatter nodes give it. */
#ifndef TS_PLAN_DPREDUCE_H
#define TS_PLAN_DPREDUCE_H
#include "ir/ir.h"

/* Megatron's default bucket: 40M elements (at least 1M per dp rank). */
#define PLAN_DP_BUCKET_ELEMS 40000000LL
int64_t plan_dp_bucket_default(int dp, IrDtype dt);

typedef struct {
  int state;            /* the grad state */
  int ublock, unode;    /* the update block's dp collective that reduces it */
  int64_t n;            /* elements of the state */
  int64_t c;            /* elements of that collective's result (n for all-reduce, the chunk for reduce-scatter) */
  int64_t off;          /* where its result sits in the bucket's result (all-reduce: its n elements; reduce-scatter:
                           its chunk in the rank's block) */
  int wpos;             /* the node of the writer block that writes it last */
  int bucket;
} PlanDpGrad;

typedef struct {
  int wblock, ublock;   /* the block whose last-micro-batch run issues it; the update block that waits for it */
  int at;               /* issued once node `at` of wblock has run (its gradients are then final) */
  IrOp op;              /* IR_OP_ALL_REDUCE or IR_OP_REDUCE_SCATTER */
  int64_t axes;         /* the collectives' axis attribute: dp, or a set holding dp (dp+cp ...) */
  int size;             /* the ranks of that group, N */
  IrDtype dt;
  int first, n;         /* its gradients: grads[first .. first + n) */
  int64_t count;        /* all-reduce: sum n_k; reduce-scatter: sum c_k (one rank's block; size * count are sent) */
  int64_t bytes;        /* bytes sent per rank into the collective: count (x size for reduce-scatter) x element size */
} PlanDpBucket;

typedef struct {
  int dp;               /* the dp axis (each bucket has its group's size) */
  int64_t bucket_bytes;
  PlanDpGrad *g;        /* grouped by bucket, buckets in issue order per writer block */
  int ng;
  PlanDpBucket *b;
  int nb;
  int nleft;            /* dp reductions of gradients the update block keeps (another axis first; scalars
                           such as the norm's square sums are not counted) */
  int64_t left_bytes;   /* ... and their bytes */
} PlanDpPlan;

/* The plan of module m (a rank's program) for buckets of bucket_bytes
 * (<= 0: plan_dp_bucket_default).  No buckets when no such group has more
 * than one rank.  0, or -1 with
 * a message (bucket_bytes absurd). */
int plan_dp_buckets(const IrModule *m, int64_t bucket_bytes, PlanDpPlan *out, char *err, size_t errlen);
void plan_dp_free(PlanDpPlan *p);

#endif
