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
/* Markdown table of ops.def (name, operands, attrs, flags, doc) for docs/ir.md. */
void ir_ops_markdown(StrBuf *out);

typedef enum { IR_VOID, IR_F32, IR_F64, IR_I32, IR_DTYPE_COUNT } IrDtype;
const char *ir_dtype_name(IrDtype t);         /* "f32" ... */
int ir_dtype_lookup(const char *name);        /* -1 if unknown */
size_t ir_dtype_size(IrDtype t);
static inline int ir_dtype_is_float(IrDtype t) { return t == IR_F32 || t == IR_F64; }

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

int64_t ir_type_numel(const IrType *t);
int  ir_type_same_shape(const IrType *a, const IrType *b);   /* dtype, rank, sizes */
int  ir_type_equal(const IrType *a, const IrType *b);        /* ... and dim names */
/* "f32[batch:4, seq:64, 768]"; writes into buf, returns buf. */
char *ir_type_str(const IrType *t, char *buf, size_t n);

/* Reserved for the sharding passes: per mesh axis, replicated / split(dim) /
 * partial.  NULL everywhere until a sharding pass runs. */
typedef struct IrSharding IrSharding;

#define IR_MAX_IATTR 8
#define IR_MAX_FATTR 4
typedef struct {
  IrOp op;
  int nin;
  int *in;                  /* operand value ids (earlier nodes of this block) */
  int64_t ia[IR_MAX_IATTR]; /* int attrs, named by ops.def */
  double fa[IR_MAX_FATTR];  /* float attrs, named by ops.def */
  const char *sa;           /* string attr (interned): input/output name */
  IrType type;              /* result type; dtype IR_VOID for effects */
  IrSharding *sharding;     /* NULL until a sharding pass */
} IrNode;

typedef struct {
  const char *name;         /* interned: "forward", "micro", "update" */
  IrNode *nodes;
  int n, cap;
} IrBlock;

typedef enum { IR_STATE_PARAM, IR_STATE_GRAD, IR_STATE_ADAM_M, IR_STATE_ADAM_V, IR_STATE_KIND_COUNT } IrStateKind;
typedef enum { IR_INIT_ZEROS, IR_INIT_ONES, IR_INIT_NORMAL, IR_INIT_UNIFORM, IR_INIT_KIND_COUNT } IrInitKind;
enum { IR_STATE_NODECAY = 1 << 0 };  /* no weight decay (biases, norm gains) */

typedef struct {
  const char *name;         /* interned, dotted path: "layers.3.attn.w_qkv" */
  IrType type;
  IrStateKind kind;
  IrInitKind init;          /* meaningful for params; others start at zero */
  double init_a, init_b;    /* normal: mean a, std b; uniform: [a, b) */
  int of;                   /* grad/moment: index of its parameter; -1 for params */
  unsigned flags;           /* IR_STATE_* */
} IrState;

typedef enum { IR_SCHED_CONSTANT, IR_SCHED_COSINE, IR_SCHED_LINEAR, IR_SCHED_COUNT } IrSchedule;
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  IrSchedule schedule;
  int64_t warmup;           /* linear warmup steps (from lr/warmup... to lr) */
  int64_t decay_steps;      /* decay ends here (default: steps) */
  double min_lr;
  double clip_grad;         /* global-norm clip; 0 = off */
  int64_t global_batch, micro_batch, seq_len, steps;
  uint64_t seed;
  IrDtype precision;        /* IR_F32 or IR_F64 */
} IrTrain;

typedef struct { int tp, pp, cp, ep, dp, sp; } IrParallel;  /* dp = 0: whatever remains */

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
} IrModule;

/* ---- building ---- */
IrModule *ir_module_new(const char *name);
void ir_module_free(IrModule *m);
IrModule *ir_module_clone(const IrModule *m);
int ir_block_add(IrModule *m, const char *name);            /* returns block index */
int ir_block_find(const IrModule *m, const char *name);     /* -1 if none */
int ir_state_add(IrModule *m, const IrState *s);            /* copies; returns index */
int ir_state_find(const IrModule *m, const char *name);     /* -1 if none */
/* The state "<prefix>.<name of param p>" of `kind` (a gradient or an
 * optimizer moment: p's type, zero-initialized, of = p): the existing one if
 * it matches, else a new one.  -1 with a message if a state of that name
 * exists but is something else.  Used by autodiff ("grad") and optimizer. */
int ir_state_derived(IrModule *m, int p, IrStateKind kind, const char *prefix,
                     char *err, size_t errlen);
void ir_train_defaults(IrTrain *t);

/* Appends a node to block b.  For OPF_TYPED ops `type` gives the result
 * type; otherwise pass NULL and the shape rule infers it.  ia/fa may be NULL
 * (zeros).  On a shape error returns -1 and writes a one-line message to
 * err (naming the op and the operand shapes); the block is unchanged. */
int ir_emit(IrModule *m, int b, IrOp op, const int *in, int nin,
            const int64_t *ia, const double *fa, const char *sa,
            const IrType *type, char *err, size_t errlen);

/* The shape rule of node n (its operands are earlier nodes of block b):
 * computes the result type into *out; 0 on success, -1 with a message. */
int ir_infer_type(const IrModule *m, const IrBlock *b, const IrNode *n,
                  IrType *out, char *err, size_t errlen);

/* ---- checking, text, graphviz ---- */
/* Verifier (CONVENTIONS §6): operand ids in range and earlier (SSA order),
 * arity, attrs, every result type equal to its shape rule, state references
 * valid.  0 = ok; -1 with "block %s, %%N = op: message". */
int ir_verify(const IrModule *m, char *err, size_t errlen);

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
void ir_print_dot(const IrModule *m, StrBuf *out);

const char *ir_state_kind_name(IrStateKind k);    /* "param", "grad", "adam_m", "adam_v" */
const char *ir_init_kind_name(IrInitKind k);      /* "zeros", "ones", "normal", "uniform" */
const char *ir_schedule_name(IrSchedule s);       /* "constant", "cosine", "linear" */

#endif
