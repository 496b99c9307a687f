/* ast.h - MDL syntax tree, made by the parser (parser.y), consumed by the
 * elaborator (elaborate.c).  All nodes live in the compilation's Arena.
 *
 * Grammar (statements end at a newline or ';'; newlines inside () and []
 * are ignored; '#' starts a comment):
 *   program := item*
 *   item    := 'import' NAME
 *            | 'config'   '{' (NAME '=' expr)* '}'
 *            | 'rules'    '{' NAME ':' NAME (',' NAME ':' NAME)* '}'
 *            | 'train'    '{' (NAME '=' expr)* '}'
 *            | 'parallel' '{' (NAME '=' expr)* '}'
 *            | 'fn'    NAME '(' decls ')' block
 *            | 'model' NAME '(' decls ')' block
 *   decl    := NAME [':' type] ['=' expr]
 *   type    := 'int' | 'float' | 'bool' | 'fn' | 'str' | [DTYPE] '[' dim (',' dim)* ']'
 *   dim     := NAME | NAME '=' expr | '...' | expr            (patterns; see mdl.md)
 *   block   := '{' stmt* '}'
 *   stmt    := NAME (',' NAME)* '=' expr
 *            | 'return' expr (',' expr)*
 *            | 'if' expr block ['else' (block | if-stmt)]
 *            | 'repeat' expr ['as' NAME] block
 *            | expr
 *   expr    := precedence, lowest first: 'or' | 'and' | 'not' | < > <= >= == != |
 *              + - | * / // % @ | unary - | postfix: call f(args), member a.b,
 *              index x[i, a:b, ...] | primary
 *   primary := INT | FLOAT | 'true' | 'false' | 'none' | STRING | NAME
 *            | '(' expr ')' | '(' expr ',' ... ')' tuple | '[' expr, ... ']' list
 *            | 'param' [DTYPE] '[' dim, ... ']' ['init' expr] ['decay' | 'nodecay']
 *   args    := (expr | NAME ':' expr) (',' ...)*   (keyword args after positional) */
#ifndef TS_MDL_AST_H
#define TS_MDL_AST_H
#include "ir/util.h"

typedef struct { const char *file; int line, col; } MdlLoc;   /* file interned; 1-based */

typedef enum {
  MDL_E_INT, MDL_E_FLOAT, MDL_E_BOOL, MDL_E_NONE, MDL_E_STRING,
  MDL_E_NAME,        /* str */
  MDL_E_MEMBER,      /* a.str            (module member: nn.attention) */
  MDL_E_CALL,        /* a(args)          */
  MDL_E_UNARY,       /* op a             ('-', MDL_OP_NOT) */
  MDL_E_BINARY,      /* a op b           */
  MDL_E_INDEX,       /* a[items]         items may be MDL_E_SLICE / MDL_E_ELLIPSIS */
  MDL_E_SLICE,       /* a:b  (either may be NULL) */
  MDL_E_ELLIPSIS,    /* ...              */
  MDL_E_TUPLE,       /* (items)          */
  MDL_E_LIST,        /* [items]          */
  MDL_E_NAMED_DIM,   /* str=a inside a shape */
  MDL_E_PARAM,       /* param str[items] init a; ival = MDL_PARAM_* flags */
} MdlExprKind;

enum {                                 /* operators that are not one character */
  MDL_OP_FLOORDIV = 256, MDL_OP_LE, MDL_OP_GE, MDL_OP_EQ, MDL_OP_NE,
  MDL_OP_AND, MDL_OP_OR, MDL_OP_NOT,
};
enum { MDL_PARAM_DECAY = 1, MDL_PARAM_NODECAY = 2 };

typedef struct MdlExpr MdlExpr;
typedef struct { const char *name; MdlExpr *value; MdlLoc loc; } MdlArg;  /* name NULL: positional */

struct MdlExpr {
  MdlExprKind kind;
  MdlLoc loc;
  int64_t ival;          /* INT, BOOL; PARAM flags */
  double fval;           /* FLOAT */
  const char *str;       /* NAME, MEMBER, STRING, NAMED_DIM; PARAM dtype (NULL = model precision) */
  int op;                /* UNARY/BINARY: a character ('+', '@', '<', ...) or MDL_OP_* */
  MdlExpr *a, *b;        /* operands; CALL: a = callee; PARAM: a = init (NULL = zeros) */
  MdlExpr **items; int nitems;   /* TUPLE, LIST, INDEX subscripts, PARAM shape */
  MdlArg *args; int nargs;       /* CALL */
};

typedef enum { MDL_T_ANY, MDL_T_INT, MDL_T_FLOAT, MDL_T_BOOL, MDL_T_FN, MDL_T_STR, MDL_T_TENSOR } MdlTypeKind;

typedef struct {                 /* one declared argument of a fn or model */
  const char *name;
  MdlLoc loc;
  MdlTypeKind type;
  const char *dtype;             /* TENSOR: "f32", "i32", ... or NULL (any float) */
  MdlExpr **dims; int ndims;     /* TENSOR: the shape pattern */
  MdlExpr *dflt;                 /* default value, or NULL */
} MdlDecl;

typedef enum { MDL_S_ASSIGN, MDL_S_RETURN, MDL_S_IF, MDL_S_REPEAT, MDL_S_EXPR } MdlStmtKind;

typedef struct MdlStmt MdlStmt;
struct MdlStmt {
  MdlStmtKind kind;
  MdlLoc loc;
  const char **names; MdlLoc *name_locs; int nnames;   /* ASSIGN targets */
  MdlExpr *value;                /* ASSIGN, EXPR; IF condition; REPEAT count */
  MdlExpr **items; int nitems;   /* RETURN values */
  MdlStmt **body; int nbody;     /* IF then-part; REPEAT body */
  MdlStmt **els; int nels;       /* IF else-part (an else-if is one IF stmt here) */
  const char *as;                /* REPEAT 'as' name, or NULL */
};

typedef struct { const char *name; MdlLoc loc; MdlExpr *value; } MdlKV;   /* config/train/parallel entry */
typedef struct { const char *dim, *axis; MdlLoc loc; } MdlRule;           /* rules { heads: tp } */

typedef struct {
  const char *name;
  MdlLoc loc;
  int is_model;
  MdlDecl *decls; int ndecls;
  MdlStmt **body; int nbody;
} MdlFunc;

typedef struct {
  const char *file;              /* interned path */
  const char *src;               /* the text (NUL-terminated) */
  const char **imports; MdlLoc *import_locs; int nimports;
  MdlKV *config; int nconfig;
  MdlRule *rules; int nrules;
  MdlKV *train; int ntrain;
  MdlKV *parallel; int nparallel;
  MdlFunc **funcs; int nfuncs;   /* fn items, in source order */
  MdlFunc *model;                /* the model item, or NULL (a library module) */
  MdlLoc model_loc;
} MdlProgram;

/* ---- diagnostics (diag.c) ---- */
typedef struct MdlDiag {
  FILE *out;
  const char *prog;          /* a message without a file starts "prog: error:" (NULL: "mcc") */
  int nerrors;
  VEC(struct { const char *file; const char *src; }) sources;  /* for the source line + caret */
} MdlDiag;
void mdl_diag_init(MdlDiag *d, FILE *out);
void mdl_diag_free(MdlDiag *d);
void mdl_diag_add_source(MdlDiag *d, const char *file, const char *src);
/* "file:line:col: error: msg", the source line, a caret under col. */
void mdl_error(MdlDiag *d, MdlLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "file:line:col: note: msg" + line + caret; for "shape came from here". */
void mdl_note(MdlDiag *d, MdlLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- parsing (parser.y) ---- */
/* Parses src; NULL if there were errors (already reported to d).  Stops
 * after 20 errors.  Never crashes on any input. */
MdlProgram *mdl_parse(const char *src, const char *file, Arena *a, MdlDiag *d);

#endif
