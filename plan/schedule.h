/* schedule.h - pipeline schedules as data: the order in which each
 * pipeline rank runs the forward and backward steps of its chunks (GPipe,
 * 1F1B, interleaved 1F1B), the send/recv pairing those steps imply, a
 * checker that proves the ranks' schedules cannot deadlock, and a timeline
 * simulation (bubble, micro batches in flight).  mcc reports them (passes/
 * pipe.h); mrun's trainer generates and checks the schedule it runs here
 * too, because the micro batches per rank depend on the dp it runs at.
 * Chunk g runs on pipeline rank g % pp (docs/pipeline.md). */
#ifndef TS_PLAN_SCHEDULE_H
#define TS_PLAN_SCHEDULE_H
#include "ir/ir.h"

/* ---- schedules ----
 * zb-h1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism") splits each
 * backward into B (the input gradient, what the previous chunk waits for)
 * and W (the weight gradients, which nobody waits for): its steps are F, B
 * and W, and W steps are deferred into what would be the bubble.  The
 * other schedules have F and B steps only (B = the whole backward). */
typedef enum { PIPE_GPIPE, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_ZBH1, PIPE_SCHED_COUNT } PipeSchedKind;
const char *plan_pipe_sched_name(PipeSchedKind k);     /* "gpipe", "1f1b", "interleaved", "zb-h1" */
/* 1 when schedules of kind k split the backward into B and W steps. */
int plan_pipe_sched_splits_bwd(PipeSchedKind k);
int plan_pipe_sched_lookup(const char *name);          /* -1 if unknown */

typedef struct {
  char kind;               /* 'F' forward, 'B' backward (zb-h1: input gradient only), 'W' weight
                              gradient (zb-h1 only) */
  int micro;               /* micro batch, 0 .. nmicro - 1 */
  int chunk;               /* GLOBAL chunk id (runs on rank chunk % pp) */
} PipeStep;

typedef struct {
  PipeSchedKind kind;
  int pp, vpp, nmicro;
  int *nsteps;             /* [pp] */
  PipeStep **steps;        /* [pp][nsteps[r]] in execution order */
} PipeSchedule;

/* The schedule a pipeline program runs, from its parallel line (mcc writes
 * it; an older plan without one gets mcc's default: interleaved with vpp >
 * 1, else 1f1b).  0, or -1 when the line names no schedule this build
 * knows. */
int plan_pipe_program_sched(const IrParallel *par, PipeSchedKind *kind);

/* Micro batches per step of one dp rank: global_batch / (micro_batch * dp).
 * 0 with *nmicro set; -1 with a message naming the numbers when it does
 * not divide. */
int plan_pipe_nmicro(const IrTrain *t, int dp, int *nmicro, char *err, size_t errlen);

/* A batch-size ramp-up (train.rampup_start > 0) under a pipeline: every
 * batch of the ramp (ir/rampup.c) gives a count of micro batches per dp
 * rank that the schedule `kind` can run.  0 (also without a ramp), or -1
 * with the batch, the count and why. */
int plan_pipe_ramp_check(const IrTrain *t, PipeSchedKind kind, int pp, int vpp, int dp, char *err, size_t errlen);

/* Generates every rank's schedule.  gpipe, 1f1b and zb-h1 need vpp == 1,
 * interleaved vpp >= 2 and pp >= 2; 1f1b and zb-h1 need nmicro >= pp,
 * interleaved nmicro % pp == 0 (Megatron's constraint).  -1 with a message naming the
 * numbers otherwise.  *out owns heap arrays: plan_pipe_schedule_free. */
int plan_pipe_schedule(PipeSchedKind kind, int pp, int vpp, int nmicro, PipeSchedule *out, char *err,
                       size_t errlen);
void plan_pipe_schedule_free(PipeSchedule *s);

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
  char what;               /* 'a' activation (forward) or 'g' gradient (backward); COMPUTE: the step's kind
                              (a W step has no messages, only its COMPUTE) */
  int micro;
  int edge;                /* the chunk boundary crossed: between chunk edge and edge + 1; COMPUTE: the chunk */
  int step;                /* index of the step in the rank's schedule */
} PipeOp;

/* Rank r's ops for schedule s (nchunks = pp * vpp).  Returns the count;
 * *ops is a heap array the caller frees. */
int plan_pipe_rank_ops(const PipeSchedule *s, int r, PipeOp **ops);

/* Checks a schedule (generated or written by hand) across all ranks:
 * every step names a chunk of its rank and a valid micro batch; every
 * (micro, chunk) has exactly one F and one B, B after F on its rank; on
 * every link the sends and receives name the same messages in the same
 * order; and running all ranks together under the semantics above
 * finishes (no cycle of blocked receives).  0, or -1 with the first
 * problem (which ranks, which message) in err: a mismatch is a compile
 * error, never a hang. */
int plan_pipe_check(const PipeSchedule *s, char *err, size_t errlen);

/* ---- timeline ---- */
typedef struct {
  int pp;
  int *nsteps;             /* [pp] */
  double **start, **end;   /* [pp][nsteps[r]] */
  double makespan;         /* the step's duration: the last rank's last end */
  double *busy, *idle;     /* [pp]; idle = makespan - busy */
  int *peak_micro;         /* [pp] most micro batches with activations held at once (F started, B
                              of the same chunk not finished -- W with a split backward, which
                              keeps what W reads), counted per distinct micro batch */
  int *peak_chunks;        /* [pp] the same counted per (micro, chunk) */
} PipeTimeline;

/* Simulates s with communication free: a step starts when its rank is
 * free and its input arrived.  fwd[g]: forward time of chunk g (NULL: 1
 * each); a backward takes bwd_ratio x its forward.  With a split backward
 * (zb-h1) B and W take half of the backward each (the paper's unit model:
 * F = B = W); plan_pipe_simulate_fbw gives them separately.  A schedule that
 * plan_pipe_check would reject fails here too (bad steps, deadlock), with
 * its message.  0, or -1.  Free with plan_pipe_timeline_free. */
int plan_pipe_simulate(const PipeSchedule *s, const double *fwd, double bwd_ratio, PipeTimeline *out, char *err,
                       size_t errlen);
/* The same with the backward times given per chunk: bwd[g] (NULL: bwd_ratio
 * x fwd[g]).  What `mcc --report time` and `--emit=trace --hw` simulate
 * with the predicted seconds of passes/timereport.c. */
int plan_pipe_simulate_fb(const PipeSchedule *s, const double *fwd, const double *bwd, double bwd_ratio,
                          PipeTimeline *out, char *err, size_t errlen);
/* The same with a split backward's W times given per chunk: wgt[g] is W's
 * time and bwd[g] is then B's alone (wgt NULL: B and W each half of the
 * backward).  Schedules without W steps ignore wgt. */
int plan_pipe_simulate_fbw(const PipeSchedule *s, const double *fwd, const double *bwd, const double *wgt,
                           double bwd_ratio, PipeTimeline *out, char *err, size_t errlen);
void plan_pipe_timeline_free(PipeTimeline *t);
/* idle / busy of rank r (0 when busy is 0). */
double plan_pipe_bubble(const PipeTimeline *t, int r);

#endif
