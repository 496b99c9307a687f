/* pipe.h - pipeline parallelism, compile-time half: stage partitioning of
 * the model's `repeat` stack, the per-rank programs, and mcc's views of
 * the schedule (the schedules themselves, their send/recv pairing, the
 * deadlock checker and the timeline are plan/schedule.h, shared with
 * mrun).  ANALYSES: nothing here changes the IR; the runtime half (stage
 * programs, send/recv ops, activation stashes) is designed in
 * docs/pipeline.md.
 *
 * Units.  The forward block is cut into L + 2 contiguous "units": unit 0 =
 * E (everything before the stack: embeddings), units 1..L = the stack's
 * layers 0..L-1, unit L+1 = L (everything after it: final norm, head,
 * loss).  A model with several stacks (an encoder-decoder) has their
 * layers one after the other in program order (the encoder's, then the
 * decoder's: L is their sum); the code between two stacks rides with a
 * neighbouring layer, wherever the fewest bytes cross.  A chunk is a contiguous range of units; there are pp * vpp
 * chunks, chunk g runs on pipeline rank g % pp (its local chunk g / pp),
 * so with vpp > 1 each rank holds vpp non-contiguous chunks (Megatron's
 * interleaving). */
#ifndef TS_PIPE_H
#define TS_PIPE_H
#include "passes.h"
#include "plan/schedule.h"

/* ---- partition ---- */
/* The model's repeat stacks in program order: stack k holds the global
 * layers [begin[k], begin[k + 1]) (units begin[k] + 1 ...). */
typedef struct {
  int n;
  const char **name;       /* [n] interned: "enc_layers", "dec_layers" */
  int *begin;              /* [n + 1] */
} PipeStacks;

typedef struct {
  int pp;                  /* pipeline ranks (>= 1) */
  int vpp;                 /* chunks per rank; 0 = unspecified (1, or what the layout implies) */
  const int *layers;       /* --pp-layers: layers per chunk (pp * vpp entries); NULL = balance */
  int nlayers;             /* entries in layers[] */
  const char *layout;      /* --pp-layout: Megatron layout string; NULL = none */
  const char *only_stack;  /* --pp-stack NAME: cut only inside this stack, the others ride whole
                              with their neighbouring stage; NULL = cut anywhere */
} PipeOptions;

typedef struct {
  const char *stack;       /* the (first) repeat stack's name ("layers"), interned */
  PipeStacks stacks;       /* all of them, in program order */
  int nlayers;             /* L (all stacks) */
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
/* The units of the first n nodes of block b (any block whose first n
 * nodes are a forward in program order: "forward", or "micro" up to its
 * `output "loss"` after shard), by the rules above: unit[i] = 0 (E),
 * 1 + layer, or nlayers + 1 (L); anch[i] (when not NULL) = 1 for an
 * anchored node (an activation: depends on a model input and a
 * parameter), 0 for a free one (its unit is its first anchored reader's).
 * What pass remat's --recompute calls a layer.  0, or -1 with a message
 * (no repeat stack, layers out of order). */
int pass_layer_units(const IrModule *m, const IrBlock *b, int n, int *unit, unsigned char *anch, int *nlayers,
                     char *err, size_t errlen);
/* The model's repeat stacks (what pass_layer_units numbers: stack k's
 * layers are units begin[k] + 1 .. begin[k + 1]).  0, or -1 with a message
 * (no repeat stack); pass_layer_stacks_free frees *st. */
int pass_layer_stacks(const IrModule *m, PipeStacks *st, char *err, size_t errlen);
void pass_layer_stacks_free(PipeStacks *st);
/* "E + layers 0-2", "layers 3-5 + L", "(empty)": the units of chunk g. */
void pass_pipe_chunk_str(const PipePartition *p, int g, char *buf, size_t n);

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
/* The pipeline's point-to-point traffic of one pipeline rank's program
 * per micro batch (`mcc --report comm`): its training sends (fwd.<g>,
 * bwd.<g>), their bytes and element types, next to Megatron's closed
 * form, one [s/cp (/tp with sp), b, h] tensor in its params dtype per
 * boundary each way: s b h e bytes, e = 2 in bf16 / fp16 (s = train
 * seq_len, b = micro_batch, h = the first forward message's global
 * elements / (s b), as the memory report takes h from a layer's input). */
void pass_pipe_p2p_report(const IrModule *prog, StrBuf *out);
/* A Chrome / Perfetto trace (JSON, traceEvents with ph "X") of the
 * simulated timeline: one thread per pipeline rank, one event per step.
 * fwd_s / bwd_s / wgt_s: each chunk's predicted seconds (pass_time_chunks, `mcc
 * --hw`); NULL: the partition's cost units at an assumed 1 TFLOP/s. */
int pass_pipe_trace(const PipePartition *p, const PipeSchedule *s, const double *fwd_s, const double *bwd_s, const double *wgt_s,
                    StrBuf *out, char *err, size_t errlen);

#endif
