/* pipe.h - pipeline parallelism, compile-time half (issue 5): stage
 * partitioning of the model's `repeat` stack, the per-rank schedules
 * (GPipe, 1F1B, interleaved 1F1B), their send/recv pairing, a checker that
 * proves the ranks' schedules cannot deadlock, and a timeline simulation
 * (bubble fraction, micro batches in flight).  ANALYSES: nothing here
 * changes the IR; the runtime half (stage programs, send/recv ops,
 * activation stashes) is designed in docs/pipeline.md.
 *
 * Units.  The forward block is cut into L + 2 contiguous "units": unit 0 =
 * E (everything before the stack: embeddings), units 1..L = the stack's
 * layers 0..L-1, unit L+1 = L (everything after it: final norm, head,
 * loss).  A chunk is a contiguous range of units; there are pp * vpp
 * chunks, chunk g runs on pipeline rank g % pp (its local chunk g / pp),
 * so with vpp > 1 each rank holds vpp non-contiguous chunks (Megatron's
 * interleaving). */
#ifndef TS_PIPE_H
#define TS_PIPE_H
#include "passes.h"

/* ---- partition ---- */
typedef struct {
  int pp;                  /* pipeline ranks (>= 1) */
  int vpp;                 /* chunks per rank; 0 = unspecified (1, or what the layout implies) */
  const int *layers;       /* --pp-layers: layers per chunk (pp * vpp entries); NULL = balance */
  int nlayers;             /* entries in layers[] */
  const char *layout;      /* --pp-layout: Megatron layout string; NULL = none */
} PipeOptions;

typedef struct {
  const char *stack;       /* the repeat stack's name ("layers"), interned */
  int nlayers;             /* L */
  int nunits;              /* L + 2 */
  double *flops;           /* [nunits] forward + backward FLOPs per micro batch (3 x forward) */
  double *bytes;           /* [nunits] bytes of activations the forward produces (kept for backward) */
  double *cost;            /* [nunits] the balancing cost: flops + PIPE_FLOPS_PER_BYTE * bytes */
  double *cut_bytes;       /* [nunits - 1] bytes crossing the cut between unit u and u + 1 per
                              micro batch (the activations sent forward; their gradients backward) */
  int pp, vpp, nchunks;    /* nchunks = pp * vpp */
  int *chunk_begin;        /* [nchunks + 1]: chunk g holds units [chunk_begin[g], chunk_begin[g + 1]) */
  int nnodes;              /* nodes of the forward block */
  int *node_unit;          /* [nnodes] the unit each forward node belongs to */
  int nshared;             /* parameters read by more than one pipeline rank (tied embedding and
                              head): their gradients need an all-reduce over those ranks */
  const char **shared;     /* [nshared] their names (interned) */
} PipePartition;

/* The activation-traffic term of the balancing cost: a byte written by the
 * forward is read and written again by the backward, and on the machines
 * we target an elementwise byte costs a few FLOPs of time. */
#define PIPE_FLOPS_PER_BYTE 12.0

/* Partitions the block "forward" of m (what the frontend makes) into
 * o->pp * vpp chunks: balanced (minimum over partitions of the maximum
 * chunk cost, then the most even), or as o->layers / o->layout say.
 * 0 on success; -1 with a message (no repeat stack, more stages than
 * layers, a layout that does not cover every layer exactly once, ...).
 * On success *out owns heap arrays: pass_pipe_partition_free. */
int pass_pipe_partition(const IrModule *m, const PipeOptions *o, PipePartition *out, char *err, size_t errlen);
void pass_pipe_partition_free(PipePartition *p);
/* "E + layers 0-2", "layers 3-5 + L", "(empty)": the units of chunk g. */
void pass_pipe_chunk_str(const PipePartition *p, int g, char *buf, size_t n);

/* ---- schedules ---- */
typedef enum { PIPE_GPIPE, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_SCHED_COUNT } PipeSchedKind;
const char *pass_pipe_sched_name(PipeSchedKind k);     /* "gpipe", "1f1b", "interleaved" */
int pass_pipe_sched_lookup(const char *name);          /* -1 if unknown */

typedef struct {
  char kind;               /* 'F' forward or 'B' backward */
  int micro;               /* micro batch, 0 .. nmicro - 1 */
  int chunk;               /* GLOBAL chunk id (runs on rank chunk % pp) */
} PipeStep;

typedef struct {
  PipeSchedKind kind;
  int pp, vpp, nmicro;
  int *nsteps;             /* [pp] */
  PipeStep **steps;        /* [pp][nsteps[r]] in execution order */
} PipeSchedule;

/* Micro batches per step of one dp rank: global_batch / (micro_batch * dp).
 * 0 with *nmicro set; -1 with a message naming the numbers when it does
 * not divide. */
int pass_pipe_nmicro(const IrTrain *t, int dp, int *nmicro, char *err, size_t errlen);

/* Generates every rank's schedule.  gpipe and 1f1b need vpp == 1,
 * interleaved vpp >= 2 and pp >= 2; 1f1b needs nmicro >= pp, interleaved
 * nmicro % pp == 0 (Megatron's constraint).  -1 with a message naming the
 * numbers otherwise.  *out owns heap arrays: pass_pipe_schedule_free. */
int pass_pipe_schedule(PipeSchedKind kind, int pp, int vpp, int nmicro, PipeSchedule *out, char *err,
                       size_t errlen);
void pass_pipe_schedule_free(PipeSchedule *s);

/* ---- send/recv and the cross-rank checker ----
 * Each step of rank r becomes: the receive of its input (F of chunk g > 0:
 * the activation of micro m from chunk g - 1; B of chunk g < last: the
 * gradient of that activation from chunk g + 1), the computation, then the
 * send of its output (F: activation to chunk g + 1; B: gradient to chunk
 * g - 1).  Peers are the ranks of those chunks; a neighbour on the same
 * rank (pp = 1) is a local hand-off, not a message.  Semantics: a send is
 * posted without waiting (isend), a receive blocks until its message was
 * posted.  Messages between two ranks are matched in order (as NCCL does,
 * and MPI with one tag), so the checker requires the same order on both
 * sides. */
typedef enum { PIPE_OP_RECV, PIPE_OP_COMPUTE, PIPE_OP_SEND } PipeOpKind;
typedef struct {
  PipeOpKind op;
  int peer;                /* RECV: source rank, SEND: destination; COMPUTE: -1 */
  char what;               /* 'a' activation (forward) or 'g' gradient (backward); COMPUTE: the step's kind */
  int micro;
  int edge;                /* the chunk boundary crossed: between chunk edge and edge + 1; COMPUTE: the chunk */
  int step;                /* index of the step in the rank's schedule */
} PipeOp;

/* Rank r's ops for schedule s (nchunks = pp * vpp).  Returns the count;
 * *ops is a heap array the caller frees. */
int pass_pipe_rank_ops(const PipeSchedule *s, int r, PipeOp **ops);

/* Checks a schedule (generated or written by hand) across all ranks:
 * every step names a chunk of its rank and a valid micro batch; every
 * (micro, chunk) has exactly one F and one B, B after F on its rank; on
 * every link the sends and receives name the same messages in the same
 * order; and running all ranks together under the semantics above
 * finishes (no cycle of blocked receives).  0, or -1 with the first
 * problem (which ranks, which message) in err: a mismatch is a compile
 * error, never a hang. */
int pass_pipe_check(const PipeSchedule *s, char *err, size_t errlen);

/* ---- timeline ---- */
typedef struct {
  int pp;
  int *nsteps;             /* [pp] */
  double **start, **end;   /* [pp][nsteps[r]] */
  double makespan;         /* the step's duration: the last rank's last end */
  double *busy, *idle;     /* [pp]; idle = makespan - busy */
  int *peak_micro;         /* [pp] most micro batches with activations held at once (F started, B
                              of the same chunk not finished), counted per distinct micro batch */
  int *peak_chunks;        /* [pp] the same counted per (micro, chunk) */
} PipeTimeline;

/* Simulates s with communication free: a step starts when its rank is
 * free and its input arrived.  fwd[g]: forward time of chunk g (NULL: 1
 * each); a backward takes bwd_ratio x its forward.  A schedule that
 * pass_pipe_check would reject fails here too (bad steps, deadlock), with
 * its message.  0, or -1.  Free with pass_pipe_timeline_free. */
int pass_pipe_simulate(const PipeSchedule *s, const double *fwd, double bwd_ratio, PipeTimeline *out, char *err,
                       size_t errlen);
void pass_pipe_timeline_free(PipeTimeline *t);
/* idle / busy of rank r (0 when busy is 0). */
double pass_pipe_bubble(const PipeTimeline *t, int r);

/* ---- per-rank programs (passes/pipeline_rank.c) ---- */
/* The program of pipeline rank r, cut out of the whole-model module
 * `whole` (pp > 1, parallel stage=0, after the optimizer): the blocks
 * fwd.<g> / bwd.<g> of r's chunks (g % pp == r), "update.<r>" renamed
 * "update", only the states those use (re-indexed, names kept), parallel
 * stage=r+1; everything else copied.  Verified.  A new module the caller
 * frees, or NULL with a message. */
IrModule *pass_pipeline_rank_module(const IrModule *whole, int r, char *err, size_t errlen);

/* ---- what mcc shows ---- */
/* The text of `mcc --report schedule`: the partition (units, FLOPs,
 * bytes, cost per chunk, bytes crossing each boundary, shared
 * parameters), then the schedule: each rank's timeline as one line of
 * steps on a time grid (f = 1, b = 2; '.' = idle), the bubble fraction of
 * that and of the cost-model timeline, and the peak micro batches in
 * flight per rank.  0, or -1 with a message. */
int pass_pipe_report(const IrModule *m, const PipePartition *p, const PipeSchedule *s, StrBuf *out, char *err,
                     size_t errlen);
/* A Chrome / Perfetto trace (JSON, traceEvents with ph "X") of the
 * cost-model timeline: one thread per pipeline rank, one event per step. */
int pass_pipe_trace(const PipePartition *p, const PipeSchedule *s, StrBuf *out, char *err, size_t errlen);

#endif
