/* elab_priv.h - what the files of the MDL elaborator share (not a public
 * API; the contract with the driver is elab.h):
 *   elaborate.c     the model, scopes, statements, expressions, calls,
 *                   signature patterns and params
 *   elab_blocks.c   the config, train, parallel and rules blocks
 *   elab_tensor.c   emitting IR nodes, broadcasting, arithmetic, matmul,
 *                   shape lists and shape-error messages
 *   elab_builtins.c the builtin functions (tensor and scalar)
 *
 * The elaborator is an interpreter over the AST: every expression evaluates
 * to a Value; tensor values are IR nodes already emitted into the "forward"
 * block, everything else (ints, floats, functions, ...) exists only at
 * compile time.  Functions are inlined and `repeat` is unrolled this way.
 *
 * Errors: reported at once through MdlDiag; the failing expression then
 * evaluates to V_ERR, a poison value that every consumer passes on silently,
 * so one mistake gives one message. */
#ifndef TS_ELAB_PRIV_H
#define TS_ELAB_PRIV_H
#include "elab.h"

#define ELAB_MAX_DEPTH 64           /* fn call depth (catches recursion) */
#define ELAB_MAX_REPEAT 100000      /* iterations of one repeat */
#define ELAB_MAX_NODES 1000000      /* IR nodes in the forward block */
#define ELAB_MAX_STEPS 500000       /* statements, calls, iterations and nodes in total */
#define ELAB_MAX_ERRORS 20          /* stop elaborating after this many */
#define ELAB_MAX_EVAL_DEPTH 1000    /* nested expressions, counting through calls */
#define ELAB_MAX_DIM ((int64_t)1 << 40)  /* the IR's bound on one size */

typedef enum {
  V_ERR,      /* poison: an error was already reported */
  V_UNSET,    /* an optional builtin argument that was not passed */
  V_NONE, V_INT, V_FLOAT, V_BOOL, V_STR,
  V_TENSOR,   /* i = node id in the forward block */
  V_TUPLE, V_LIST,
  V_FN,       /* an MDL fn: fn, prog (the module it lives in) */
  V_BUILTIN,  /* i = index into the builtin table */
  V_MODULE,   /* an imported module: prog */
} VKind;

typedef struct Value Value;
struct Value {
  VKind k;
  MdlLoc loc;            /* the expression that made it (tensors: for notes) */
  int64_t i;             /* INT, BOOL, TENSOR node id, BUILTIN index */
  double f;              /* FLOAT */
  const char *s;         /* STR text; INT: the variable it was read from (interned) or NULL */
  Value *items; int n;   /* TUPLE, LIST (arena) */
  const MdlFunc *fn;     /* FN */
  const MdlProgram *prog;/* FN, MODULE */
};

typedef struct { const char *name; Value v; const char *iname; } ElabVar;   /* iname: interned, once needed */
typedef struct { const char *name; int count; } ElabCounter;

/* One instance of a naming scope: a fn call or one repeat iteration.  Every
 * fn call, repeat and param inside it takes a component from `counters`
 * (name, name_1, name_2, ...), so dotted state names are unique. */
typedef struct ElabNaming {
  const char *prefix;    /* "layers.0.attention"; "" at the model's top; NULL: not built yet */
  const char *base;      /* a repeat iteration: prefix = base.index, built when first needed */
  int64_t index;
  VEC(ElabCounter) counters;
} ElabNaming;

/* A variable scope: the config block, the model body, or one fn call. */
typedef struct ElabFrame ElabFrame;
struct ElabFrame {
  VEC(ElabVar) vars;
  int *ix, ixcap;               /* a big frame's name index (elaborate.c frame_var); 0: none yet */
  ElabFrame *parent;            /* the model sees the config; fns see nothing */
  const MdlProgram *prog;       /* whose fns and imports are visible */
  const MdlFunc *fn;            /* the fn being run, NULL for model/config */
  ElabNaming *naming;
  Value ret;                    /* set by `return` */
};

typedef struct {                /* one actual argument of a call */
  const char *name;             /* keyword, or NULL */
  Value v;
  MdlLoc loc;                   /* the argument (its keyword, if named) */
  MdlLoc vloc;                  /* its value's expression */
} ElabArg;

typedef struct {                /* a call, arguments evaluated */
  MdlLoc loc;
  const char *fname;            /* for messages: "nn.attention", "reshape" */
  ElabArg *args; int nargs;
} ElabCall;

typedef struct Elab {
  MdlDiag *d;
  const MdlOptions *opt;
  const MdlProgram *main;
  const MdlModuleRef *mods; int nmods;
  IrModule *m;
  int blk;                      /* the forward block */
  Arena a;                      /* values, tuples, scratch strings */
  IrDtype prec;                 /* the model's float dtype */
  int depth;                    /* fn call depth */
  int eval_depth;               /* expression nesting, through calls */
  int64_t steps;                /* work done, against ELAB_MAX_STEPS */
  int64_t stream;               /* next dropout stream id */
  int abort;                    /* stop everything (limits, too many errors) */
  ElabFrame config;             /* config constants */
  /* set of state names (interned pointers, open addressing) */
  const char **snames; int nsnames, capsnames;
} Elab;

/* ---- values (elaborate.c) ---- */
Value elab_err(void);
Value elab_int(int64_t i, MdlLoc loc);
Value elab_float(double f, MdlLoc loc);
Value elab_bool(int b, MdlLoc loc);
Value elab_none(MdlLoc loc);
Value elab_tensor(int id, MdlLoc loc);
Value elab_tuple(Elab *e, VKind k, int n, MdlLoc loc);   /* items zeroed */
const char *elab_kind_name(VKind k);
/* "int", "f32[batch:4, 64]", "tuple of 3", ... into buf. */
const char *elab_value_desc(Elab *e, const Value *v, char *buf, size_t n);
/* Reports an error; also stops everything after ELAB_MAX_ERRORS. */
void elab_error(Elab *e, MdlLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int elab_is_num(const Value *v);                 /* int or float */
double elab_num(const Value *v);                 /* int or float as double */

/* ---- tensors (elab_tensor.c) ---- */
/* The type of tensor value v (a copy: node arrays move when they grow). */
IrType elab_type(Elab *e, const Value *v);
const char *elab_tstr(Elab *e, const Value *v, char *buf, size_t n);
/* Emits a node; on a shape error reports it at loc with a note at each
 * operand's origin and returns V_ERR. */
Value elab_emit(Elab *e, MdlLoc loc, IrOp op, const Value *in, int nin,
                const int64_t *ia, const double *fa, const char *sa, const IrType *type);
/* Notes "<type> comes from here" at a tensor's origin. */
void elab_note_origin(Elab *e, const Value *v);
/* Checks a type built by the elaborator (rank, dims >= 1, element count);
 * reports at loc with `what` ("param", "reshape") and returns -1 if bad. */
int elab_check_type(Elab *e, MdlLoc loc, const IrType *t, const char *what);
/* A shape list ([a, b, -1] or a tuple) into t's dims, names from the ints;
 * allow_infer: one -1 allowed (its index in *infer, else -1). */
int elab_shape_list(Elab *e, const Value *list, MdlLoc loc, IrType *t, int allow_infer, int *infer,
                    const char *what);
/* Normalizes a possibly negative axis against rank; -1 after an error. */
int elab_axis(Elab *e, MdlLoc loc, const Value *axis, int rank, const Value *x, const char *what);
/* x broadcast to t's sizes (numpy rules); x itself when already that shape. */
Value elab_broadcast_to(Elab *e, MdlLoc loc, Value x, const IrType *t);
Value elab_reshape(Elab *e, MdlLoc loc, Value x, const IrType *t);
/* Binary operator on any two values ('+', '-', '*', '/', '@', MDL_OP_*...). */
Value elab_binary(Elab *e, MdlLoc loc, int op, Value a, Value b);
Value elab_negate(Elab *e, MdlLoc loc, Value a);
Value elab_matmul(Elab *e, MdlLoc loc, Value a, Value b);
/* Reduces every axis of x with SUM/MEAN/MAX (keepdim: all ones). */
Value elab_reduce_all(Elab *e, MdlLoc loc, IrOp op, Value x, int keepdim);
const char *elab_op_text(int op);

/* ---- scopes and evaluation (elaborate.c) ---- */
Value elab_eval(Elab *e, ElabFrame *f, const MdlExpr *x);
void elab_frame_set(ElabFrame *f, const char *name, Value v);   /* assigns in f itself */
void elab_frame_free(ElabFrame *f);                              /* its vars and index */
int elab_frame_has(ElabFrame *f, const char *name);              /* in f itself */

/* ---- the config, train, parallel and rules blocks (elab_blocks.c) ---- */
void elab_config(Elab *e);     /* fills e->config and m->consts */
void elab_train(Elab *e);      /* m->train and e->prec */
void elab_parallel(Elab *e);   /* m->par */
void elab_rules(Elab *e);      /* validates only */
void elab_train_sizes(Elab *e); /* after the model: train sizes against its inputs */

/* ---- builtins (elab_builtins.c) ---- */
int elab_builtin_lookup(const char *name);       /* -1 if none */
const char *elab_builtin_name(int idx);
Value elab_call_builtin(Elab *e, int idx, const ElabCall *c);

/* ---- shared helpers for argument binding (elaborate.c) ---- */
/* Binds c's arguments to the parameter names (NULL-terminated); the first
 * nreq are required.  out[i].k == V_UNSET when not passed.  Errors name
 * the function.  0 ok; -1 after an error (or a poisoned argument). */
int elab_bind_args(Elab *e, const ElabCall *c, const char *const *names, int nreq, Value *out);
/* Argument checks that report "f(): argument 'x' must be ..." */
int elab_want_int(Elab *e, const ElabCall *c, const char *arg, const Value *v, int64_t *out);
int elab_want_num(Elab *e, const ElabCall *c, const char *arg, const Value *v, double *out);
int elab_want_bool(Elab *e, const ElabCall *c, const char *arg, const Value *v, int *out);
int elab_want_tensor(Elab *e, const ElabCall *c, const char *arg, const Value *v, int need_float);

#endif
