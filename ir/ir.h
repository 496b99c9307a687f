/* ir.h - Tessera's tensor IR: a typed SSA graph per block.
 *
 * A module is what one rank runs: persistent state (parameters, gradient
 * accumulators, optimizer moments), the training configuration, and blocks
 * of straight-line SSA code.  Before autodiff a module has one block,
 * "forward", ending in `output "loss"`.  After autodiff it has
 *   "micro"  - run once per micro-batch: forward, backward, accum into grads
 *   "update" - run once per step: grad norm, clipping, AdamW, zeroing grads.
 * A value is the result of the node that makes it; node i of a block is
 * value %i of that block.  Nodes are in execution (topological) order.
 * Effects (accum, zero, adamw, output) have no result (dtype IR_VOID).
 *
 * Everything per op comes from ops.def (ir_ops[] below). */
#ifndef TS_IR_H
#define TS_IR_H
#include "util.h"

typedef enum {
#define X(name, text, nin, ia, fa, flags, doc) IR_OP_##name,
#include "ops.def"
#undef X
  IR_OP_COUNT
} IrOp;

enum {                 /* op flags */
  OPF_LEAF   = 1 << 0, /* no operands */
  OPF_EW     = 1 << 1, /* elementwise over identical shapes */
  OPF_TYPED  = 1 << 2, /* result type is given, not inferred */
  OPF_EFFECT = 1 << 3, /* writes state or reports; no result */
  OPF_NODIFF = 1 << 4, /* no gradient flows through it */
  OPF_LATE   = 1 << 5, /* inserted by the sharding passes, after autodiff: no derivative */
  OPF_MIXED  = 1 << 6, /* a GEMM: reads 16-bit operands as they are (f32 accumulation) and stores
                          its result in their dtype or, when the result dtype is given, in f32 */
};

typedef struct {
  const char *name;     /* text spelling */
  int nin;              /* -1: variadic */
  const char *iattrs;   /* space-separated names for ia[] */
  const char *fattrs;   /* space-separated names for fa[] */
  unsigned flags;
  const char *doc;
} IrOpInfo;
extern const IrOpInfo ir_ops[IR_OP_COUNT];
int ir_op_lookup(const char *name);          /* -1 if unknown */
/* Whether int attr `slot` of op names a state ("@name" in ops.def). */
int ir_op_iattr_is_state(IrOp op, int slot);
/* Whether op moves data between ranks: the collectives, ring_shift, send /
 * recv and group_sum (what mcc --report comm counts). */
int ir_op_communicates(IrOp op);
/* Markdown table of ops.def (name, operands, attrs, flags, doc) for docs/ir.md. */
void ir_ops_markdown(StrBuf *out);

/* bf16 and f16 are STORAGE types (docs/ir.md "16-bit values"): a value of
 * one is read only by the ops that move or convert elements (cast, the
 * layout ops, state reads and writes, stash, send and recv); arithmetic
 * reads it through a cast to f32, which pass `precision` inserts and the
 * verifier requires.  ir_dtype_is_float is the ARITHMETIC float types. */
/* f8e4m3 (E4M3, the finite-only "fn" variant: max 448, NaN S.1111.111, no
 * infinity) and f8e5m2 (E5M2: max 57344, IEEE-like inf and NaN) are the
 * fp8 storage types of --fp8 (passes/fp8.c, docs/precision.md "FP8"): made
 * only by quant8 (x * scale rounded, saturating), read only by matmul8, cast
 * and the ops that move bytes (ir_op_reads_8). */
typedef enum { IR_VOID, IR_F32, IR_F64, IR_I32, IR_BF16, IR_F16, IR_F8E4M3, IR_F8E5M2, IR_DTYPE_COUNT } IrDtype;
const char *ir_dtype_name(IrDtype t);         /* "f32" ... */
int ir_dtype_lookup(const char *name);        /* -1 if unknown */
size_t ir_dtype_size(IrDtype t);
static inline int ir_dtype_is_float(IrDtype t) { return t == IR_F32 || t == IR_F64; }
static inline int ir_dtype_is_16(IrDtype t) { return t == IR_BF16 || t == IR_F16; }
static inline int ir_dtype_is_8(IrDtype t) { return t == IR_F8E4M3 || t == IR_F8E5M2; }
/* Whether an op reads 16-bit operands as they are (moves or converts
 * elements without arithmetic, or an OPF_MIXED GEMM, which accumulates
 * their products in f32); every other op needs f32/f64/i32 operands. */
int ir_op_reads_16(IrOp op);
/* Whether an op reads fp8 operands: matmul8 (with their scale_inv), cast,
 * and the ops that move bytes (the layout ops, stash, send, assign). */
int ir_op_reads_8(IrOp op);

#define IR_MAX_RANK 8
/* A tensor type.  Each dim has a size and optionally a name (interned, e.g.
 * "heads"); names are what sharding rules map to mesh axes.  Names do not
 * take part in shape checks, only sizes do. */
typedef struct {
  IrDtype dtype;
  int rank;                              /* 0 = scalar */
  int64_t dim[IR_MAX_RANK];
  const char *dname[IR_MAX_RANK];        /* NULL = unnamed */
} IrType;
/* The type to pass to ir_emit when re-emitting a node of op `op` whose
 * type is *t: t for OPF_TYPED ops and for OPF_MIXED ops (whose result
 * dtype may differ from their operands'), NULL for the others. */
static inline const IrType *ir_op_given_type(IrOp op, const IrType *t) {
  return (ir_ops[op].flags & (OPF_TYPED | OPF_MIXED)) ? t : NULL;
}

int64_t ir_type_numel(const IrType *t);
int  ir_type_same_shape(const IrType *a, const IrType *b);   /* dtype, rank, sizes */
int  ir_type_equal(const IrType *a, const IrType *b);        /* ... and dim names */
/* "f32[batch:4, seq:64, 768]"; writes into buf, returns buf. */
char *ir_type_str(const IrType *t, char *buf, size_t n);

/* ---- sharding ----
 * The device mesh has five axes, outer to inner (Megatron's order; tp
 * innermost).  A sharded module is what ONE rank runs: every type in it is
 * the rank's LOCAL shape, and the sharding says how the local value relates
 * to the global (single-device) one, per mesh axis:
 *   - replicated (axis in no mask): every rank of the axis holds the same;
 *   - split along dim d (axis in split[d]): the global dim d is the
 *     concatenation of the axis ranks' blocks, in coordinate order; when
 *     several axes split one dim, the outer axis (lower IrAxis) is major;
 *   - partial (axis in `partial`): the global value is the SUM over the
 *     axis' ranks of their local values;
 *   - flat (axis in `flat`, states only: ZeRO): the global tensor, flattened
 *     row-major and zero-padded to a multiple of the axis size, split into
 *     equal chunks; the local type is [chunk].
 * All zero = unsharded.  dp never splits a micro-batch tensor: the batch
 * dim of the program is the per-rank micro batch (Megatron's convention),
 * so data parallelism appears only as dp-partial gradient states and the
 * update block's dp collectives (see docs/sharding.md). */
typedef enum { IR_AXIS_DP, IR_AXIS_PP, IR_AXIS_CP, IR_AXIS_EP, IR_AXIS_TP, IR_AXIS_COUNT } IrAxis;
const char *ir_axis_name(IrAxis a);            /* "dp" ... "tp" */
int ir_axis_lookup(const char *name);          /* -1 if unknown */
/* A collective's mesh-axis attribute (`~axis` in ops.def) names one axis
 * (its IrAxis, printed "dp") or a set of at least two axes:
 * IR_AXES_SET | mask, printed "dp+cp" (outer to inner).  The set's group is
 * the ranks that share every other coordinate, ordered with the outer axis
 * major (group rank = dp_coord * cp + cp_coord for dp+cp), as a split over
 * several axes orders its blocks: block k of a `{0:dp+cp}` chunk vector is
 * group rank k's (Megatron's data-parallel group with cp, docs/sharding.md).
 * ir_axes_attr makes the canonical value (one axis: the plain IrAxis, so
 * single-axis collectives are unchanged); ir_axes_mask is 0 when v is
 * neither form. */
#define IR_AXES_SET 0x100
static inline unsigned ir_axes_mask(int64_t v) {
  if (v >= 0 && v < IR_AXIS_COUNT) return 1u << v;
  unsigned m = (unsigned)(v & 0xff);
  if ((v & ~(int64_t)0xff) != IR_AXES_SET || (m >> IR_AXIS_COUNT) || !(m & (m - 1))) return 0;
  return m;
}
int64_t ir_axes_attr(unsigned mask);           /* mask != 0 of axes -> the attribute */
char *ir_axes_str(int64_t v, char *buf, size_t n);   /* "dp+cp"; "?" if invalid */
typedef struct IrSharding {
  uint8_t split[IR_MAX_RANK];   /* per dim: mask of axes (1u << IrAxis) splitting it */
  uint8_t partial;              /* mask of axes over which the value is a partial sum */
  uint8_t flat;                 /* mask of axes holding flat chunks (ZeRO state) */
} IrSharding;
static inline int ir_sharding_is_none(const IrSharding *s) {
  if (s->partial || s->flat) return 0;
  for (int i = 0; i < IR_MAX_RANK; i++) if (s->split[i]) return 0;
  return 1;
}
/* A bit of a split mask (above the axes): the cp level of this dim is
 * contiguous and the innermost level (minor to every other axis that splits
 * the dim), not the causal zigzag (runtime/cpu/cp_layout.c).  Only with the
 * cp bit.  All-to-all context parallelism splits the heads so: each tp
 * rank's heads cut in cp contiguous blocks (docs/sharding.md "All-to-all
 * attention").  Text: cp written last with a star, "1:tp+cp*". */
#define IR_SPLIT_CP_MINOR 0x80u
static inline int ir_split_cp_minor(unsigned mask) {
  return (mask & IR_SPLIT_CP_MINOR) && (mask & (1u << IR_AXIS_CP));
}
int ir_sharding_equal(const IrSharding *a, const IrSharding *b);
/* "{2:tp, partial:tp}" (the text form); "" when unsharded.  Writes buf. */
char *ir_sharding_str(const IrSharding *s, int rank, char *buf, size_t n);

#define IR_MAX_IATTR 8
#define IR_MAX_FATTR 4
typedef struct {
  IrOp op;
  int nin;
  int *in;                  /* operand value ids (earlier nodes of this block) */
  int64_t ia[IR_MAX_IATTR]; /* int attrs, named by ops.def */
  double fa[IR_MAX_FATTR];  /* float attrs, named by ops.def */
  const char *sa;           /* string attr (interned): input/output name */
  IrType type;              /* result type (local shape); IR_VOID for effects */
  IrSharding sh;            /* how the local value maps to the global one */
  int group;                /* fusion (passes/fuse.c): nodes of a block with the
                               same group > 0 run as one kernel; 0 = alone */
  int stage;                /* pipeline placement (docs/pipeline.md), set only when
                               pp > 1: 1 + 2 * chunk + (1 for the backward), 0 =
                               unplaced.  Text: stage=N */
  const char *why;          /* interned; the pass that made a communication node says
                               why (the rule, the layouts, the bytes weighed):
                               mcc --report sharding.  Not part of the text form */
} IrNode;

/* The fused attention family (attention, attention_bwd, attn_acc,
 * attn_bwd_q, attn_bwd_kv; docs/ir.md "Fused attention"): the window
 * attribute (0: none); the count of operands before the optional ones
 * (-1: not of the family); the operands holding ALiBi's slopes (present
 * when the attribute alibi is 1), the additive score bias (attention and
 * attention_bwd with bias=1: [Hb, Tq, Tk]) and the document ids (-1:
 * none); the index of op's alibi / bias attribute in ia[] (-1: not of the
 * family, or, for bias, a ring step, which has none). */
int64_t ir_attn_window(const IrNode *n);
int ir_attn_base(const IrNode *n);
int ir_attn_slope(const IrNode *n);
int ir_attn_bias(const IrNode *n);
int ir_attn_doc(const IrNode *n);
int ir_attn_alibi_attr(IrOp op);
int ir_attn_bias_attr(IrOp op);
/* Pipeline stage tags (IrNode.stage). */
static inline int ir_stage_tag(int chunk, int backward) { return 1 + 2 * chunk + (backward ? 1 : 0); }
static inline int ir_stage_chunk(int tag) { return tag > 0 ? (tag - 1) / 2 : -1; }
static inline int ir_stage_is_bwd(int tag) { return tag > 0 && (tag - 1) % 2 == 1; }

typedef struct {
  const char *name;         /* interned: "forward", "micro", "update" */
  IrNode *nodes;
  int n, cap;
} IrBlock;

/* IR_STATE_CACHE: a generation block's KV cache (pass decode): zero at
 * start, written by kv_write, never a checkpoint's or a parameter file's. */
/* IR_STATE_COPY: the 16-bit compute copy of parameter `of` (pass
 * precision, --precision bf16): the parameter's shape and sharding in its
 * own 16-bit dtype (a checkpoint load never needs it); the runtime refreshes it from the
 * f32 master before a block reads it whenever the master changed (after
 * the update block, an initialization or a load). */
/* IR_STATE_SHARD: ZeRO-3 (pass zero3, mcc --zero 3): the rank's 1/dp flat
 * chunk of parameter `of`, type [c] {flat:dp} (c = ceil(numel / dp) of the
 * parameter's local type, zero-padded), the only copy of the parameter the
 * rank holds.  Its parameter keeps the description (local type, sharding
 * over the other axes, init, logical sizes) and carries IR_STATE_SHARDED:
 * it occupies no memory and no block reads it; the micro block gathers
 * the shard before use and adamw updates the shard. */
/* IR_STATE_FP8: a state of --fp8's delayed scaling (passes/fp8.c): per
 * quantized tensor its amax of this step (scalar, max-accumulated by
 * amax_acc), amax history [len], scale and scale_inv (scalars); f32, of=-1,
 * every element starts at init_a (printed start=V), written only by
 * amax_acc, zero and fp8_scale, checkpointed like any state. */
/* IR_STATE_SCALER: a scalar of fp16's dynamic loss scaler (passes/scaler.c,
 * docs/precision.md): the scale, its good-step and hysteresis counters and
 * the skipped-step count; of=-1, starts at init_a (printed start=V),
 * written only by scale_update, checkpointed like any state. */
typedef enum { IR_STATE_PARAM, IR_STATE_GRAD, IR_STATE_ADAM_M, IR_STATE_ADAM_V, IR_STATE_CACHE, IR_STATE_COPY,
               IR_STATE_SHARD, IR_STATE_SCALER, IR_STATE_FP8, IR_STATE_KIND_COUNT } IrStateKind;
typedef enum { IR_INIT_ZEROS, IR_INIT_ONES, IR_INIT_NORMAL, IR_INIT_UNIFORM, IR_INIT_KIND_COUNT } IrInitKind;
enum {
  IR_STATE_NODECAY = 1 << 0,   /* no weight decay (biases, norm gains) */
  IR_STATE_SHARDED = 1 << 1,   /* a parameter held only as its ZeRO-3 shard state (text: "sharded") */
};

typedef struct {
  const char *name;         /* interned, dotted path: "layers.3.attn.w_qkv" */
  IrType type;
  IrStateKind kind;
  IrInitKind init;          /* meaningful for params; others start at zero */
  double init_a, init_b;    /* normal: mean a, std b; uniform: [a, b) */
  int of;                   /* grad/moment: index of its parameter; -1 for params */
  unsigned flags;           /* IR_STATE_* */
  IrSharding sh;            /* type is the local shape; see IrSharding */
  int64_t logical[IR_MAX_RANK]; /* per dim: the model's global size when the
                               global dim was padded up for sharding (vocab
                               not divisible by tp), else 0.  Padding is zero
                               and never reaches the loss. */
} IrState;

/* LR schedules (runtime/exec/rt.c rt_lr_at has the formulas): after the
 * linear warmup, constant, cosine or linear decay to min_lr; wsd
 * (warmup-stable-decay: lr until the last wsd_decay_steps of decay_steps,
 * then wsd_style's decay to min_lr); inverse_sqrt (lr * sqrt(warmup / n),
 * at least min_lr). */
typedef enum { IR_SCHED_CONSTANT, IR_SCHED_COSINE, IR_SCHED_LINEAR, IR_SCHED_WSD, IR_SCHED_INVSQRT, IR_SCHED_COUNT } IrSchedule;
/* wsd's final decay (Megatron's --lr-wsd-decay-style) */
typedef enum { IR_WSD_LINEAR, IR_WSD_COSINE, IR_WSD_EXPONENTIAL, IR_WSD_MINUS_SQRT, IR_WSD_COUNT } IrWsdStyle;
/* The update rule of the optimizer pass (passes/optimizer.c's table of
 * kinds): adamw; sgd (torch.optim.SGD: momentum, nesterov, L2 weight
 * decay); lion (sign of the interpolated momentum, decoupled decay, beta1 /
 * beta2); muon (momentum + Newton-Schulz orthogonalisation for the 2-D
 * hidden weights, adamw for every other parameter). */
typedef enum { IR_OPT_ADAMW, IR_OPT_SGD, IR_OPT_LION, IR_OPT_MUON, IR_OPT_COUNT } IrOptimizer;
/* How muon orthogonalises a matrix split over tp (docs/sharding.md "Muon"):
 * auto (the fewer bytes sent), allreduce (the Gram matrix over the split
 * side, all-reduced every iteration: the matmul sharding rule's answer),
 * gather (the matrix gathered once, every rank iterating on all of it). */
typedef enum { IR_MUON_TP_AUTO, IR_MUON_TP_ALLREDUCE, IR_MUON_TP_GATHER, IR_MUON_TP_COUNT } IrMuonTp;
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  IrOptimizer optimizer;
  double momentum;          /* sgd's momentum (0: none) */
  int nesterov;             /* sgd and muon: Nesterov momentum */
  double muon_momentum;     /* muon's momentum */
  int muon_ns_steps;        /* muon's Newton-Schulz iterations */
  double muon_adamw_lr;     /* muon: the lr of its AdamW group (the parameters that are not hidden matrices),
                               scaling the whole schedule by muon_adamw_lr / lr; 0: the group runs at lr */
  IrMuonTp muon_tp;         /* muon: a tp-split matrix's collectives */
  IrSchedule schedule;
  IrWsdStyle wsd_style;     /* wsd: the final decay's shape */
  int64_t wsd_decay_steps;  /* wsd: the steps of the final decay (ending at decay_steps) */
  int64_t warmup;           /* linear warmup steps (from lr/warmup... to lr) */
  int64_t decay_steps;      /* decay ends here (default: steps) */
  double min_lr;
  double clip_grad;         /* global-norm clip; 0 = off */
  int64_t global_batch, micro_batch, seq_len, steps;
  int64_t rampup_start, rampup_incr, rampup_samples;   /* Megatron's --rampup-batch-size START INCR SAMPLES (ir/rampup.c);
                               rampup_start 0: off, every step global_batch */
  uint64_t seed;
  IrDtype precision;        /* IR_F32 or IR_F64: parameters (the masters), gradients, optimizer, and the
                               arithmetic of every op */
  IrDtype lowp;             /* IR_VOID, or IR_BF16 / IR_F16 (precision then f32): --precision bf16, the
                               storage of activations and parameter copies that pass precision assigns.
                               The text form prints precision=bf16 for precision=f32 + lowp=bf16 */
} IrTrain;
/* The number format a plan's GEMMs compute in: the 16-bit type of
 * --precision bf16 / fp16 (lowp), else the precision. */
static inline IrDtype ir_train_dtype(const IrTrain *t) { return t->lowp != IR_VOID ? t->lowp : t->precision; }
/* The lr of the adamw nodes at schedule lr `lr`: Muon's AdamW group with
 * its own lr runs at lr * muon_adamw_lr / t->lr (the whole schedule scaled,
 * as torch's per-group schedulers scale each group's base lr); else lr. */
static inline double ir_train_adamw_lr(const IrTrain *t, double lr) {
  if (t->optimizer != IR_OPT_MUON || !(t->muon_adamw_lr > 0) || !(t->lr > 0)) return lr;
  return lr * (t->muon_adamw_lr / t->lr);
}

/* dp = 0: whatever remains.  sp: sequence parallelism (tp > 1).
 * zero: distributed optimizer (ZeRO-1) when dp > 1 (default 1).
 * Pipeline (pp > 1, docs/pipeline.md): vpp chunks per pipeline rank (0 or 1:
 * one), the schedule, and stage: 0 in the compiler's whole-model module
 * (blocks fwd.<g> / bwd.<g> of every chunk g, update.<r> per pipeline
 * rank), r + 1 in the program of pipeline rank r (its chunks' blocks and
 * "update" only).  The text form prints them only when pp > 1. */
/* In the order of plan/schedule.h's PipeSchedKind, one after it (sched - 1 is the kind). */
typedef enum { IR_PIPE_NONE, IR_PIPE_GPIPE, IR_PIPE_1F1B, IR_PIPE_INTERLEAVED, IR_PIPE_ZBH1, IR_PIPE_COUNT } IrPipeSched;
const char *ir_pipe_sched_name(IrPipeSched s);   /* "none", "gpipe", "1f1b", "interleaved", "zb-h1" */
typedef struct { int tp, pp, cp, ep, dp, sp, zero; int vpp, sched, stage; } IrParallel;
/* The kinds of a pipeline block: "fwd.<g>" and "bwd.<g>" (pass pipeline),
 * "eval.<g>" (pass eval: fwd.<g> without stashes and dropout, run by
 * validation; its sends and receives go to the neighbouring eval blocks),
 * and "wgt.<g>" (pass wsplit, --schedule zb-h1: the weight-gradient part
 * W of bwd.<g>, which keeps the input-gradient part B; no messages, it
 * reads what bwd.<g> stashed for it). */
typedef enum { IR_CHUNK_FWD, IR_CHUNK_BWD, IR_CHUNK_EVAL, IR_CHUNK_WGT } IrChunkKind;
/* The global chunk of a pipeline block "fwd.<g>" / "bwd.<g>" / "eval.<g>"
 * / "wgt.<g>" (*bwd set to 1 for bwd.<g> and wgt.<g>, the backward, else
 * 0, if not NULL: an eval block is a forward block); -1 for any other
 * block. */
int ir_block_chunk(const IrBlock *b, int *bwd);
/* The same with the block's kind in *kind (if not NULL). */
int ir_block_chunk_kind(const IrBlock *b, IrChunkKind *kind);

/* A sharding rule of the MDL `rules` block: dims named `dim` are split over
 * the mesh axes in `axes` (mask).  Stdlib defaults come first, the model's
 * own rules after them (a later rule for the same dim wins). */
typedef struct { const char *dim; uint8_t axes; } IrRule;

/* A config constant of the MDL source, kept for reports and the plan text. */
typedef struct { const char *name; int is_float; int64_t i; double f; } IrConst;

typedef struct IrModule {
  Arena arena;              /* owns everything below */
  const char *name;
  VEC(IrConst) consts;
  VEC(IrState) states;
  VEC(IrBlock) blocks;
  IrTrain train;
  IrParallel par;
  VEC(IrRule) rules;
  struct IrStateIx *state_ix;   /* ir_state_find's index of state names (ir.c); NULL: it scans */
} IrModule;

/* Bytes a rank holds for state s: its type's, 0 for a sharded parameter. */
size_t ir_state_bytes(const IrState *s);
/* The ZeRO-3 shard state of parameter p, or -1. */
int ir_state_shard_of(const IrModule *m, int p);

/* Size of mesh axis a in m (m->par; sizes < 1 count as 1). */
int ir_axis_size(const IrModule *m, IrAxis a);
/* Product of the sizes of the axes of a collective's axis attribute v
 * (ir_axes_mask); 1 when invalid. */
int ir_axes_size(const IrModule *m, int64_t v);

/* ---- building ---- */
IrModule *ir_module_new(const char *name);
void ir_module_free(IrModule *m);
IrModule *ir_module_clone(const IrModule *m);
int ir_block_add(IrModule *m, const char *name);            /* returns block index */
int ir_block_find(const IrModule *m, const char *name);     /* -1 if none */
int ir_state_add(IrModule *m, const IrState *s);            /* copies; returns index */
/* Keeps states [0, n) only.  Code that removes, reorders or rewrites states
 * in place (rather than appending) ends with this, so ir_state_find's index
 * starts again; appending directly to m->states needs nothing. */
void ir_states_truncate(IrModule *m, int n);
/* Removes every state s with drop[s] set, renumbering the rest (their order
 * kept) in every node's state attributes and every state's `of`.  The
 * caller makes sure no node reads or writes a dropped state (asserted) and
 * none refers to one through `of`.  drop: m->states.n flags. */
void ir_states_drop(IrModule *m, const unsigned char *drop);
int ir_state_find(const IrModule *m, const char *name);     /* -1 if none */
/* The state "<prefix>.<name of param p>" of `kind` (a gradient or an
 * optimizer moment: p's type, zero-initialized, of = p): the existing one if
 * it matches, else a new one.  -1 with a message if a state of that name
 * exists but is something else.  Used by autodiff ("grad") and optimizer. */
int ir_state_derived(IrModule *m, int p, IrStateKind kind, const char *prefix,
                     char *err, size_t errlen);
void ir_train_defaults(IrTrain *t);
/* Batch-size ramp-up (ir/rampup.c, Megatron's rule): whether t ramps; the
 * global batch of a step that starts after `consumed` samples; the samples
 * consumed before step `step` (from 0); the samples consumed after nsteps
 * steps that start after c0 (a run resumed from a checkpoint goes on from
 * the samples it records, as Megatron's consumed_train_samples); the steps
 * that consume `samples`
 * (Megatron's --train-samples: the ramp's steps, then whole global
 * batches); and a check of the ramp's numbers (every batch a multiple of
 * unit = micro_batch x dp), 0 or -1 with the message in err. */
int ir_train_rampup(const IrTrain *t);
int64_t ir_train_batch_at(const IrTrain *t, int64_t consumed);
int64_t ir_train_samples_before(const IrTrain *t, int64_t step);
int64_t ir_train_samples_after(const IrTrain *t, int64_t c0, int64_t nsteps);
int64_t ir_train_steps_for_samples(const IrTrain *t, int64_t samples);
int ir_train_rampup_check(const IrTrain *t, int64_t unit, char *err, size_t errlen);

/* Appends a node to block b.  For OPF_TYPED ops `type` gives the result
 * type; for OPF_MIXED ops (matmul) `type`, if not NULL, gives the result's
 * DTYPE only (f32 for a GEMM of 16-bit operands stored in f32; the shape is
 * inferred); otherwise pass NULL and the shape rule infers it.  ia/fa may be NULL
 * (zeros).  On a shape error returns -1 and writes a one-line message to
 * err (naming the op and the operand shapes); the block is unchanged. */
int ir_emit(IrModule *m, int b, IrOp op, const int *in, int nin,
            const int64_t *ia, const double *fa, const char *sa,
            const IrType *type, char *err, size_t errlen);

/* The shape rule of node n (its operands are earlier nodes of block b):
 * computes the result type into *out; 0 on success, -1 with a message. */
int ir_infer_type(const IrModule *m, const IrBlock *b, const IrNode *n,
                  IrType *out, char *err, size_t errlen);

/* Whether value i of block b gets a buffer of its own: not a member of a
 * fusion group, or used by a node outside its group (values that live
 * only inside a fused kernel are never materialized). */
/* written[s] = 1 for every state s that an effect of block b writes
 * (the op table's @state attributes of accum, zero, assign, adamw);
 * written has m->states.n entries, all set here. */
void ir_block_states_written(const IrModule *m, const IrBlock *b, unsigned char *written);
int ir_value_materialized(const IrBlock *b, int i);

/* ---- checking, text, graphviz ---- */
/* Verifier (CONVENTIONS §6): operand ids in range and earlier (SSA order),
 * arity, attrs, every result type equal to its shape rule, state references
 * valid.  0 = ok; -1 with "block %s, %%N = op: message". */
int ir_verify(const IrModule *m, char *err, size_t errlen);
/* The rules of a complete training module (one with block "update", as
 * mcc emits it and mrun runs it): every gradient state is added to by at
 * least one effect of the per-micro-batch blocks ("micro", or the
 * pipeline's "bwd.<g>") and zeroed exactly once in "update"; every
 * parameter with a gradient is updated by exactly one adamw there.  A
 * module without "update" passes.  0, or -1 naming the state. */
int ir_verify_training(const IrModule *m, char *err, size_t errlen);

/* Text form; ir_parse_module(ir_print_module(m)) prints identically. */
void ir_print_module(const IrModule *m, StrBuf *out);
void ir_print_node(const IrModule *m, const IrBlock *b, int id, StrBuf *out);
/* Parses text from ir_print_module.  `fname` is for messages
 * ("file:line:col: error: ..."); NULL result on error with message in err. */
IrModule *ir_parse_module(const char *text, const char *fname, char *err, size_t errlen);
/* Parses starting at *pos inside a larger text (the plan text embeds
 * modules); advances *pos and *line past the module.  *pos must start a
 * line and *line counts the lines before it (0 at the start of the text);
 * a module ends with the line `end` (see docs/ir.md). */
IrModule *ir_parse_module_at(const char *text, size_t *pos, int *line, const char *fname,
                             char *err, size_t errlen);
/* ir_parse_module_at for a plan's program: its `train` and `parallel`
 * lines are required (a module without them would train with defaults). */
IrModule *ir_parse_program_at(const char *text, size_t *pos, int *line, const char *fname,
                              char *err, size_t errlen);
void ir_print_dot(const IrModule *m, StrBuf *out);

const char *ir_state_kind_name(IrStateKind k);    /* "param", "grad", "adam_m", "adam_v", "cache", "copy", "scaler" */
const char *ir_init_kind_name(IrInitKind k);      /* "zeros", "ones", "normal", "uniform" */
const char *ir_schedule_name(IrSchedule s);       /* "constant", "cosine", "linear", "wsd", "inverse_sqrt" */
const char *ir_wsd_style_name(IrWsdStyle s);      /* "linear", "cosine", "exponential", "minus_sqrt" */
const char *ir_optimizer_name(IrOptimizer o);     /* "adamw", "sgd", "lion", "muon" */
const char *ir_muon_tp_name(IrMuonTp t);          /* "auto", "allreduce", "gather" */

/* ---- the model inputs a data pipeline feeds (mrun; docs/data.md) ----
 * One list for the compiler, which refuses any other input of a model with
 * a `train` block at its signature (frontend/elaborate.c), and for the
 * trainer, which feeds these by name (runtime/exec/train.c).  All are
 * [..., seq] like "tokens": the i32 ids "tokens", "targets" (tokens shifted
 * by one), "position_ids" (each token's position: 0..seq-1, or counted from
 * its document's start with --reset-position-ids) and "document_ids" (the
 * document of each token in its row, from 0: all 0 without
 * --reset-attention-mask); "loss_mask" (1, or 0 at end-of-document tokens
 * with --eod-mask-loss) in f32, f64 or i32 as the model declares it. */
typedef enum {
  IR_FEED_TOKENS, IR_FEED_TARGETS, IR_FEED_LOSS_MASK, IR_FEED_POSITION_IDS, IR_FEED_DOCUMENT_IDS, IR_FEED_COUNT
} IrFeed;
/* The input autodiff adds to a ramp-up plan's backward (train.rampup_start
 * > 0): 1 / (the step's micro batches), a scalar of the loss's type, fed
 * by the trainer with every micro batch (the loss gradient's seed). */
#define IR_MICRO_WEIGHT "micro_weight"
/* The IrFeed named name, or -1. */
int ir_feed_find(const char *name);
const char *ir_feed_name(IrFeed f);
/* "tokens, targets, loss_mask, position_ids, document_ids" (for messages). */
const char *ir_feed_list(void);
/* Whether feed f may have dtype d (the ids: i32; loss_mask: f32, f64, i32). */
int ir_feed_dtype_ok(IrFeed f, IrDtype d);

#endif
