/* passes.h - the compiler's passes over IrModule and the pipeline that runs
 * them in order (CONVENTIONS §4): int pass_<name>(IrModule *m, PassCtx *cx).
 * Each pass file states at its top what it expects and guarantees.  The
 * pipeline verifies the module after every pass and dumps it on request. */
#ifndef TS_PASSES_H
#define TS_PASSES_H
#include "ir/ir.h"

typedef enum {
  PASS_RECOMPUTE_NONE,       /* the cheap values only (the default) */
  PASS_RECOMPUTE_FULL,       /* keep each layer's input, recompute the layer */
  PASS_RECOMPUTE_SELECTIVE,  /* the values whose recomputation costs few FLOPs per byte saved */
  PASS_RECOMPUTE_AUTO,       /* the least added FLOPs within memory_budget */
  PASS_RECOMPUTE_COUNT
} PassRecompute;
/* "none", "full", "selective", "auto"; pass_recompute_lookup: -1 if unknown */
const char *pass_recompute_name(int mode);
int pass_recompute_lookup(const char *name);

typedef struct PassCtx {
  Arena scratch;             /* reset after each pass */
  char err[2048];            /* a failing pass writes its message here */
  int verify_each;           /* run ir_verify after every pass (default on) */
  int verify_roundtrip;      /* print -> parse -> print after every pass, must match */
  const char *dump_dir;      /* --dump-ir=all DIR: writes DIR/NN-<pass>.ir */
  const char *print_after;   /* --print-ir-after=PASS: prints that pass's result to stdout */
  FILE *print_to;            /* where print_after goes (stdout) */
  const char *dump_pass;     /* --dump-ir=PASS DIR: dump only that pass; NULL = all */
  FILE *time_to;             /* --time: per-pass wall times go here; NULL = off */
  int no_fuse;               /* --no-fuse: pass_fuse forms no groups */
  int no_remat;              /* --no-remat: pass_remat recomputes nothing */
  /* pass_remat's choice for each gathered value the backward reads (keep
   * the gathered copy, or gather the shard again): by bytes sent, then
   * bytes held (passes/remat.c) */
  int regather;              /* --regather: gather every one again (Megatron's; the least memory) */
  int64_t activation_budget; /* --activation-budget: the most bytes a micro batch may hold across its
                                backward per pipeline stage, or -1 (no limit: every copy is kept) */
  /* --recompute (pass remat, passes/remat.c): what else the backward
   * recomputes beyond the cheap values: whole layers from their inputs
   * (full), what the cost model finds cheap to compute and expensive to
   * keep (selective), or the least FLOPs that fit memory_budget (auto) */
  int recompute;             /* PassRecompute */
  int64_t memory_budget;     /* --memory-budget (auto): the most bytes held for the backward per micro
                                batch and pipeline stage (counted as activation_budget), or -1 */
  char recompute_summary[1536]; /* what pass remat chose under --recompute: its values, bytes, FLOPs */
  /* pipeline partition overrides (pass "partition"; vpp and the schedule
   * are in m->par): --pp-layers (layers per chunk), --pp-layout and
   * --pp-stack (the one repeat stack to cut) */
  const int *pp_layers;
  int pp_nlayers;
  const char *pp_layout;
  const char *pp_stack;
  int cp_attn;               /* PassCpAttn, --cp-attn: how the fused attention runs under cp
                              * (pass "shard"): a ring of k / v blocks, k / v all-gathered,
                              * or all-to-all to head-split layouts (Ulysses) */
  int decode;                /* --decode: pass decode adds the generation blocks prefill and step */
  const char *precision_policy; /* --precision-policy CLASS=f32|16,... (pass precision; NULL: the table's) */
  /* fp16's loss scaling (passes/scaler.c, docs/precision.md), Megatron's
   * flags: --loss-scale (> 0: fixed; 0: dynamic), --initial-loss-scale,
   * --loss-scale-window, --hysteresis, --min-loss-scale */
  double loss_scale, initial_loss_scale, min_loss_scale;
  int64_t loss_scale_window, hysteresis;
  const char *loss_scale_flag; /* one of them given (NULL: none): refused unless the module trains in fp16 */
  /* --fp8 (pass fp8, passes/fp8.c, docs/precision.md "FP8"): Megatron's
   * --fp8-format, --fp8-amax-history-len, --fp8-amax-compute-algo,
   * --fp8-margin; fp8_all_layers: --fp8-all-layers (the first and last
   * layer of each repeat stack in fp8 too; Megatron's
   * --first-last-layers-bf16 is the default) */
  int fp8;                   /* PassFp8: none, hybrid (E4M3 forward, E5M2 gradients), e4m3 (everywhere) */
  int64_t fp8_history;
  int fp8_algo;              /* 0 max over the history, 1 most_recent */
  double fp8_margin;
  int fp8_all_layers;
} PassCtx;
enum PassFp8 { PASS_FP8_NONE, PASS_FP8_HYBRID, PASS_FP8_E4M3 };

typedef int (*PassFn)(IrModule *m, PassCtx *cx);
enum PassCpAttn { PASS_CP_ATTN_RING, PASS_CP_ATTN_ALLGATHER, PASS_CP_ATTN_A2A };
typedef struct { const char *name; PassFn fn; const char *doc; } PassInfo;

/* pp > 1: tags each forward node with its pipeline chunk (IrNode.stage) */
int pass_partition(IrModule *m, PassCtx *cx);
/* recomputes in the backward the values the forward would keep for it that
 * an elementwise / row / layout op makes from values kept anyway */
int pass_remat(IrModule *m, PassCtx *cx);
/* pp > 1: micro -> per-chunk blocks fwd.<g> / bwd.<g> with send, recv,
 * stash and unstash (docs/pipeline.md, "Execution") */
int pass_pipe_split(IrModule *m, PassCtx *cx);
/* --schedule zb-h1: splits every bwd.<g> into its input-gradient part
 * (bwd.<g>, B) and weight-gradient part (wgt.<g>, W); passes/wsplit.c. */
int pass_wsplit(IrModule *m, PassCtx *cx);
/* --zero 3 at dp > 1: parameters and gradient accumulators held as 1/dp
 * flat shards, parameters gathered before use (forward, then again for the
 * backward), gradients reduce-scattered in each micro batch
 * (passes/zero3.c, docs/sharding.md "ZeRO-3") */
int pass_zero3(IrModule *m, PassCtx *cx);
/* forward -> micro (forward + backward + accumulate into grad state) */
int pass_autodiff(IrModule *m, PassCtx *cx);
/* micro block -> one rank's local micro block for tp / sp (docs/sharding.md) */
int pass_shard(IrModule *m, PassCtx *cx);
/* the storage dtype of every value by the op-class table of
 * docs/precision.md: 16-bit storage under train.lowp (--precision bf16),
 * f32 arithmetic through explicit casts, parameter reads from 16-bit copy
 * states (passes/precision.c) */
int pass_precision(IrModule *m, PassCtx *cx);
/* --fp8: the GEMMs of the repeat-stack layers as fp8 GEMMs with delayed
 * scaling (passes/fp8.c); fp8_update_ops appends the step's scale update
 * to block "update" (called by the optimizer pass). */
int pass_fp8(IrModule *m, PassCtx *cx);
int fp8_update_ops(IrModule *m, PassCtx *cx);
/* The table as text: class, default storage, ops (mcc --precision-policy help). */
void pass_precision_classes(StrBuf *out);
/* fp16's dynamic loss scaling (passes/scaler.c; used by autodiff and the
 * optimizer, not a pass of its own).  scaler_on: the module trains in fp16
 * (train.lowp f16), so it scales its loss. */
int scaler_on(const IrModule *m);
/* The scaler states @loss_scale, .good, .hyst, .skipped (made on first
 * use, starting at cx's settings) into st[]; -1 with cx->err. */
int scaler_states(IrModule *m, PassCtx *cx, int st[4]);
/* Blocks "scaler" (the all-rank inf/NaN check and the scale update) and
 * "skip" (what a skipped step does: zero the gradients), replacing earlier
 * ones (whose settings win over cx's: mrun re-specializing a plan). */
int scaler_blocks(IrModule *m, PassCtx *cx);
/* adds the update block: global grad norm, clip, AdamW, zero grads */
int pass_optimizer(IrModule *m, PassCtx *cx);
/* forward-only blocks for validation: "eval", micro's outputs and what
 * they use, dropout as the identity; with pp > 1 eval.<g> from every
 * fwd.<g>, without stashes, with messages of their own (passes/evalblock.c) */
int pass_eval(IrModule *m, PassCtx *cx);
/* with cx->decode: blocks "prefill" and "step" (generation with a KV cache)
 * derived from block "eval" (passes/decode.c, docs/generation.md) */
int pass_decode(IrModule *m, PassCtx *cx);
/* pass decode's layout rule (no pp, cp or sp): 0, or -1 with the message
 * (mrun --generate asks before it starts its ranks). */
int pass_decode_layout(const IrModule *m, char *err, size_t errlen);
/* removes nodes whose value is never used (effects are roots) */
int pass_dce(IrModule *m, PassCtx *cx);
/* marks fusion groups (IrNode.group) that codegen lowers as one kernel,
 * by the rules of plan/groups.h (the executor reads them back with the
 * same code) */
int pass_fuse(IrModule *m, PassCtx *cx);

/* For a compiled module (micro + update, or a pipeline rank's program:
 * its chunks' blocks + update) and another data-parallel size: drops block
 * "update" and the adam_m/adam_v states (refused unless they are the last
 * states and only "update" uses them), sets m->par.dp = dp, re-runs
 * optimizer and dce (and fuse when the plan was fused), verifies.  What
 * mrun does to run a plan at a dp it was not compiled for.  A whole-model
 * pipeline module (stage=0) is refused.  0 on success; -1 with a message,
 * m unchanged. */
int pass_respecialize_dp(IrModule *m, int dp, char *err, size_t errlen);

/* The optimizer's section of mcc --report comm / memory: the rule, and for
 * muon the matrices, the Newton-Schulz collectives measured in the update
 * block next to their closed form and to gathering the matrix instead,
 * and the ZeRO-1 cost (gathered gradients, momentum kept whole). */
int pass_optimizer_report(const IrModule *m, StrBuf *out);

/* FLOPs of computing node n of b once (passes/remat.c): a GEMM 2 M N K,
 * fused attention 4 Tq Tk D per head and batch, a grouped GEMM 2 R N K,
 * leaves and reshapes nothing, anything else one per result element. */
double pass_node_flops(const IrBlock *b, const IrNode *n);

/* The pipeline, in order ("frontend" is the pseudo-pass that made the input). */
extern const PassInfo pass_pipeline[];
extern const int pass_pipeline_count;
void pass_ctx_init(PassCtx *cx);
void pass_ctx_free(PassCtx *cx);
/* ir_emit into block b for a pass that emits many nodes: after the first
 * failure (written to cx->err as "WHO: cannot emit OP: ...") *failed is set
 * and every later call returns -1 without emitting; an operand < 0 (a
 * failed earlier emit) fails too.  sh (NULL: unsharded) becomes the node's
 * sharding.  The new node's id, or -1. */
int pass_emit(IrModule *m, PassCtx *cx, int b, int *failed, const char *who, IrOp op, const int *in, int nin,
              const int64_t *ia, const double *fa, const char *sa, const IrType *type, const IrSharding *sh);
/* Runs every pass in order; the module after the frontend counts as pass 0.
 * 0 on success; -1 with cx->err set. */
int pass_run_pipeline(IrModule *m, PassCtx *cx);
/* 0 for "frontend", i + 1 for pass_pipeline[i], -1 for an unknown name. */
int pass_find(const char *name);
/* 0 if `name` is a pass; else -1 with "unknown pass 'x' for <what>; the
 * passes are: frontend, autodiff, ..." in err. */
int pass_check_name(const char *name, const char *what, char *err, size_t errlen);

#endif
