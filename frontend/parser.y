/* parser.y - MDL grammar (bison, pure/reentrant) building the AST of ast.h
 * in the compilation's Arena.  The grammar is the one in ast.h's header
 * comment; docs/mdl.md explains it with examples.
 *
 * Statement structure: the lexer turns line ends into NL tokens (none
 * inside () and []), so a statement list is statements separated by NL or
 * ';', with any number of separators before, between and after.
 *
 * The lexer and parser share one MdlParseState (declared below, so that
 * it lands in the generated header mdl_parser.h that lexer.l includes).
 *
 * Errors: yyreport_syntax_error (parse.error custom) turns bison's view of
 * the failure (the unexpected token, the tokens that would have been
 * accepted, computed exactly thanks to LAC) plus the lexer's bracket stack
 * into a message a person can act on.  `error` productions at item, entry
 * and statement level let parsing continue at the next statement; we stop
 * after MDL_MAX_ERRORS.  Lists are built in the arena (never on the heap),
 * so abandoning a parse half-way leaks nothing. */

%define api.pure full
%define api.prefix {mdl_yy}
%define api.token.prefix {T_}
%define parse.error custom
%define parse.lac full
%locations
%param {MdlParseState *P}

%code requires {
#include "frontend/ast.h"

#define MDL_MAX_ERRORS 20

/* An open bracket, for newline handling and "opened at" messages. */
typedef struct { char ch; int line, col; const char *owner; } MdlBracket;

/* Arena-backed growable list of pointers (parser-internal). */
typedef struct { void **a; int n, cap; } MdlSeq;

/* Everything one parse needs; shared by lexer.l and parser.y. */
typedef struct MdlParseState {
  Arena *arena;
  MdlDiag *diag;
  const char *file;
  int nerrors_start;             /* diag->nerrors when this parse began */
  void *scanner;                 /* the flex scanner */
  int line, col;                 /* position of the next character */
  VEC(MdlBracket) brackets;      /* open ( [ { (heap; freed by mdl_lex_free) */
  const char *pending_owner;     /* "'config' block": owns the next '{' */
  int pending_func;              /* T_FN / T_MODEL: the next NAME names the body */
  const char *pending_name;
  MdlBracket mismatch;           /* innermost bracket left unclosed by the */
  int mismatch_valid, mismatch_line, mismatch_col;   /* closer at this position */
  int stray_line, stray_col;     /* a closer with no opener */
  int cur_tok, prev_tok, cur_ntok;   /* the last two tokens, for messages */
  char cur_text[40], prev_text[40];
  MdlProgram *prog;
  MdlLoc config_loc, rules_loc, train_loc, parallel_loc;   /* duplicate-block checks */
  MdlSeq imports, funcs, rules;  /* collected here, copied into prog at the end */
} MdlParseState;

int mdl_lex_init(MdlParseState *P, const char *src, size_t len);
void mdl_lex_free(MdlParseState *P);
}

%union {
  int64_t ival;
  double fval;
  const char *name;      /* interned */
  const char *str;       /* arena string (decoded literal) */
  MdlExpr *expr;
  MdlStmt *stmt;
  MdlSeq *seq;           /* of MdlExpr*, MdlStmt*, MdlDecl*, MdlArg*, MdlKV*, const char* */
  MdlDecl *decl;
  MdlArg *arg;
  MdlKV *kv;
  struct { MdlExpr *init; int flags; int has_init; } popts;
}

%code {
#include <stdarg.h>
/* flex's scanner (lexer.l, prefix mdl_lex_yy) */
int mdl_lex_yylex(MDL_YYSTYPE *lval, MDL_YYLTYPE *lloc, void *scanner);
static int yylex(MDL_YYSTYPE *lval, MDL_YYLTYPE *lloc, MdlParseState *P);
static MdlLoc L(MdlParseState *P, MDL_YYLTYPE l) { MdlLoc r = { P->file, l.first_line, l.first_column }; return r; }
static MdlSeq *seq_new(MdlParseState *P);
static MdlSeq *seq_push(MdlParseState *P, MdlSeq *s, void *x);
static MdlExpr *mk(MdlParseState *P, MdlExprKind k, MDL_YYLTYPE l);
static MdlExpr *mk_bin(MdlParseState *P, int op, MdlExpr *a, MdlExpr *b, MDL_YYLTYPE l);
static MdlExpr *mk_un(MdlParseState *P, int op, MdlExpr *a, MDL_YYLTYPE l);
static MdlExpr *mk_items(MdlParseState *P, MdlExprKind k, MdlSeq *items, MDL_YYLTYPE l);
static MdlExpr *mk_call(MdlParseState *P, MdlExpr *callee, MdlSeq *args, MDL_YYLTYPE l);
static MdlStmt *mk_stmt(MdlParseState *P, MdlStmtKind k, MDL_YYLTYPE l);
static void stmt_body(MdlParseState *P, MdlStmt *s, MdlSeq *body);
static MdlFunc *mk_func(MdlParseState *P, int is_model, const char *name, MDL_YYLTYPE l, MdlSeq *decls, MdlSeq *body);
static MdlKV *mk_kv(MdlParseState *P, const char *name, MDL_YYLTYPE l, MdlExpr *v);
static void set_kvs(MdlParseState *P, const char *what, MdlLoc *seen, MDL_YYLTYPE l, MdlSeq *s, MdlKV **out, int *n);
static const char *check_dtype(MdlParseState *P, const char *name, MDL_YYLTYPE l);
static void perr(MdlParseState *P, MDL_YYLTYPE l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void yyerror(MDL_YYLTYPE *l, MdlParseState *P, const char *msg);
}

%token <ival> INT "integer"
%token <fval> FLOAT "number"
%token <str> STRING "string"
%token <name> NAME "name"
%token NL "end of line"
%token IMPORT "'import'" CONFIG "'config'" RULES "'rules'" TRAIN "'train'"
%token PARALLEL "'parallel'" FN "'fn'" MODEL "'model'" RETURN "'return'" IF "'if'"
%token ELSE "'else'" REPEAT "'repeat'" AS "'as'" PARAM "'param'" INIT "'init'"
%token DECAY "'decay'" NODECAY "'nodecay'" TRUE "'true'" FALSE "'false'" NONE "'none'"
%token AND "'and'" OR "'or'" NOT "'not'" KW_INT "'int'" KW_FLOAT "'float'"
%token KW_BOOL "'bool'" KW_STR "'str'"
%token ELLIPSIS "'...'" FLOORDIV "'//'" LE "'<='" GE "'>='" EQ "'=='" NE "'!='"

%left OR
%left AND
%precedence NOT
%nonassoc '<' '>' LE GE EQ NE
%left '+' '-'
%left '*' '/' FLOORDIV '%' '@'

%type <expr> expr unary init_arg postfix primary param dim sub
%type <seq> exprs args args_opt dims dims_opt subs decls decls_opt stmt_lines stmt_body block
%type <seq> kv_lines kv_body names
%type <stmt> stmt if_stmt
%type <decl> decl type
%type <arg> arg
%type <kv> kv
%type <popts> popts
%type <name> dtype

%%

/* Lists of items, entries and statements all have the shape
 *   lines := (sep | X sep)*        list := lines | lines X
 * (X needs a separator after it unless it is the last).  The empty `lines`
 * is reduced before any token is read, so a syntax error in the very
 * first X still finds the X-level `error` rule (important with LAC). */
program
  : top_lines
  | top_lines item
  ;
top_lines
  : %empty
  | top_lines sep
  | top_lines item sep
  ;
sep     : NL | ';' ;

item
  : IMPORT NAME {
      MdlExpr *e = mk(P, MDL_E_NAME, @2);
      e->str = $2;
      seq_push(P, &P->imports, e);
    }
  | CONFIG '{' kv_body '}'   { set_kvs(P, "config", &P->config_loc, @1, $3, &P->prog->config, &P->prog->nconfig); }
  | TRAIN '{' kv_body '}'    { set_kvs(P, "train", &P->train_loc, @1, $3, &P->prog->train, &P->prog->ntrain); }
  | PARALLEL '{' kv_body '}' { set_kvs(P, "parallel", &P->parallel_loc, @1, $3, &P->prog->parallel, &P->prog->nparallel); }
  | RULES '{' rule_body '}'  {
      if (P->rules_loc.line)
        perr(P, @1, "duplicate 'rules' block (the first is at %d:%d); put all rules in one block",
             P->rules_loc.line, P->rules_loc.col);
      else P->rules_loc = L(P, @1);
    }
  | FN NAME '(' decls_opt ')' block { seq_push(P, &P->funcs, mk_func(P, 0, $2, @2, $4, $6)); }
  | MODEL NAME '(' decls_opt ')' block {
      MdlProgram *g = P->prog;
      if (g->model)
        perr(P, @1, "a second model '%s': a program has exactly one model, and '%s' is declared at %d:%d",
             $2, g->model->name, g->model_loc.line, g->model_loc.col);
      else { g->model = mk_func(P, 1, $2, @2, $4, $6); g->model_loc = L(P, @1); }
    }
  | error
  | error block              /* skip a whole { ... } after a bad header */
  ;

/* ---- config / train / parallel: NAME = expr entries ---- */
kv_body
  : kv_lines                 { $$ = $1; }
  | kv_lines kv              { $$ = seq_push(P, $1, $2); }
  ;
kv_lines
  : %empty                   { $$ = seq_new(P); }
  | kv_lines sep             { $$ = $1; }
  | kv_lines kv sep          { $$ = seq_push(P, $1, $2); }
  ;
kv
  : NAME '=' expr            { $$ = mk_kv(P, $1, @1, $3); }
  | error                    { $$ = NULL; }
  ;

/* ---- rules { dim: axis, ... }: commas or line ends between rules ---- */
rule_body
  : rule_lines
  | rule_lines rule
  ;
rule_lines
  : %empty
  | rule_lines sep
  | rule_lines rule sep
  | rule_lines rule ','
  ;
rule
  : NAME ':' NAME {
      MdlRule *r = arena_alloc(P->arena, sizeof *r);
      r->dim = $1; r->axis = $3; r->loc = L(P, @1);
      seq_push(P, &P->rules, r);
    }
  | error
  ;

/* ---- declarations: x: f32[batch, seq] = default ---- */
decls_opt
  : %empty                   { $$ = seq_new(P); }
  | decls                    { $$ = $1; }
  | decls ','                { $$ = $1; }
  ;
decls
  : decl                     { $$ = seq_push(P, seq_new(P), $1); }
  | decls ',' decl           { $$ = seq_push(P, $1, $3); }
  ;
decl
  : NAME                     { $$ = arena_alloc(P->arena, sizeof *$$); $$->name = $1; $$->loc = L(P, @1); }
  | NAME '=' expr            { $$ = arena_alloc(P->arena, sizeof *$$); $$->name = $1; $$->loc = L(P, @1); $$->dflt = $3; }
  | NAME ':' type            { $$ = $3; $$->name = $1; $$->loc = L(P, @1); }
  | NAME ':' type '=' expr   { $$ = $3; $$->name = $1; $$->loc = L(P, @1); $$->dflt = $5; }
  ;
/* A type: a fresh MdlDecl with only the type part filled in. */
type
  : KW_INT                   { $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_INT; }
  | KW_FLOAT                 { $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_FLOAT; }
  | KW_BOOL                  { $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_BOOL; }
  | KW_STR                   { $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_STR; }
  | FN                       { $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_FN; }
  | dtype '[' dims_opt ']'   {
      $$ = arena_alloc(P->arena, sizeof *$$); $$->type = MDL_T_TENSOR;
      $$->dtype = $1 ? check_dtype(P, $1, @1) : NULL;
      $$->dims = (MdlExpr **)$3->a; $$->ndims = $3->n;
    }
  ;
dtype
  : %empty                   { $$ = NULL; }
  | NAME                     { $$ = $1; }   /* checked by the user: `x: foo` is a type error only once */
  ;

/* ---- shapes: [batch=micro_batch, seq, ..., heads * 2] ---- */
dims_opt
  : %empty                   { $$ = seq_new(P); }
  | dims                     { $$ = $1; }
  | dims ','                 { $$ = $1; }
  ;
dims
  : dim                      { $$ = seq_push(P, seq_new(P), $1); }
  | dims ',' dim             { $$ = seq_push(P, $1, $3); }
  ;
dim
  : expr                     { $$ = $1; }
  | NAME '=' expr            { $$ = mk(P, MDL_E_NAMED_DIM, @1); $$->str = $1; $$->a = $3; }
  | ELLIPSIS                 { $$ = mk(P, MDL_E_ELLIPSIS, @1); }
  ;

/* ---- fn / model bodies and statements ---- */
block
  : '{' stmt_body '}'        { $$ = $2; }
  ;
stmt_body
  : stmt_lines               { $$ = $1; }
  | stmt_lines stmt          { $$ = seq_push(P, $1, $2); }
  ;
stmt_lines
  : %empty                   { $$ = seq_new(P); }
  | stmt_lines sep           { $$ = $1; }
  | stmt_lines stmt sep      { $$ = seq_push(P, $1, $2); }
  ;
stmt
  : names '=' expr {
      $$ = mk_stmt(P, MDL_S_ASSIGN, @1);
      $$->nnames = $1->n;
      $$->names = arena_alloc(P->arena, sizeof *$$->names * (size_t)$1->n);
      $$->name_locs = arena_alloc(P->arena, sizeof *$$->name_locs * (size_t)$1->n);
      for (int i = 0; i < $1->n; i++) {
        MdlExpr *nm = $1->a[i];
        $$->names[i] = nm->str; $$->name_locs[i] = nm->loc;
      }
      $$->value = $3;
    }
  | RETURN exprs {
      $$ = mk_stmt(P, MDL_S_RETURN, @1);
      $$->items = (MdlExpr **)$2->a; $$->nitems = $2->n;
    }
  | if_stmt                  { $$ = $1; }
  | REPEAT expr block        { $$ = mk_stmt(P, MDL_S_REPEAT, @1); $$->value = $2; stmt_body(P, $$, $3); }
  | REPEAT expr AS NAME block { $$ = mk_stmt(P, MDL_S_REPEAT, @1); $$->value = $2; $$->as = $4; stmt_body(P, $$, $5); }
  | expr                     { $$ = mk_stmt(P, MDL_S_EXPR, @1); $$->value = $1; }
  | error                    { $$ = NULL; }
  | error block              { $$ = NULL; }   /* e.g. `else {` on its own line: skip the block */
  ;
/* Assignment targets; kept as NAME exprs for their locations. */
names
  : NAME                     { MdlExpr *e = mk(P, MDL_E_NAME, @1); e->str = $1; $$ = seq_push(P, seq_new(P), e); }
  | names ',' NAME           { MdlExpr *e = mk(P, MDL_E_NAME, @3); e->str = $3; $$ = seq_push(P, $1, e); }
  ;
if_stmt
  : IF expr block            { $$ = mk_stmt(P, MDL_S_IF, @1); $$->value = $2; stmt_body(P, $$, $3); }
  | IF expr block ELSE block {
      $$ = mk_stmt(P, MDL_S_IF, @1); $$->value = $2; stmt_body(P, $$, $3);
      $$->els = (MdlStmt **)$5->a; $$->nels = $5->n;
    }
  | IF expr block ELSE if_stmt {
      $$ = mk_stmt(P, MDL_S_IF, @1); $$->value = $2; stmt_body(P, $$, $3);
      $$->els = arena_alloc(P->arena, sizeof *$$->els); $$->els[0] = $5; $$->nels = 1;
    }
  ;

/* ---- expressions, lowest precedence first ---- */
expr
  : expr OR expr             { $$ = mk_bin(P, MDL_OP_OR, $1, $3, @2); }
  | expr AND expr            { $$ = mk_bin(P, MDL_OP_AND, $1, $3, @2); }
  | NOT expr                 { $$ = mk_un(P, MDL_OP_NOT, $2, @1); }
  | expr '<' expr            { $$ = mk_bin(P, '<', $1, $3, @2); }
  | expr '>' expr            { $$ = mk_bin(P, '>', $1, $3, @2); }
  | expr LE expr             { $$ = mk_bin(P, MDL_OP_LE, $1, $3, @2); }
  | expr GE expr             { $$ = mk_bin(P, MDL_OP_GE, $1, $3, @2); }
  | expr EQ expr             { $$ = mk_bin(P, MDL_OP_EQ, $1, $3, @2); }
  | expr NE expr             { $$ = mk_bin(P, MDL_OP_NE, $1, $3, @2); }
  | expr '+' expr            { $$ = mk_bin(P, '+', $1, $3, @2); }
  | expr '-' expr            { $$ = mk_bin(P, '-', $1, $3, @2); }
  | expr '*' expr            { $$ = mk_bin(P, '*', $1, $3, @2); }
  | expr '/' expr            { $$ = mk_bin(P, '/', $1, $3, @2); }
  | expr FLOORDIV expr       { $$ = mk_bin(P, MDL_OP_FLOORDIV, $1, $3, @2); }
  | expr '%' expr            { $$ = mk_bin(P, '%', $1, $3, @2); }
  | expr '@' expr            { $$ = mk_bin(P, '@', $1, $3, @2); }
  | unary                    { $$ = $1; }
  ;
unary
  : '-' unary               { $$ = mk_un(P, '-', $2, @1); }
  | postfix                  { $$ = $1; }
  | param                    { $$ = $1; }
  ;
postfix
  : primary                  { $$ = $1; }
  | postfix '(' args_opt ')' { $$ = mk_call(P, $1, $3, @2); }
  | postfix '.' NAME         { $$ = mk(P, MDL_E_MEMBER, @3); $$->a = $1; $$->str = $3; }
  | postfix '[' subs ']'     { $$ = mk_items(P, MDL_E_INDEX, $3, @2); $$->a = $1; }
  ;
primary
  : INT                      { $$ = mk(P, MDL_E_INT, @1); $$->ival = $1; }
  | FLOAT                    { $$ = mk(P, MDL_E_FLOAT, @1); $$->fval = $1; }
  | TRUE                     { $$ = mk(P, MDL_E_BOOL, @1); $$->ival = 1; }
  | FALSE                    { $$ = mk(P, MDL_E_BOOL, @1); $$->ival = 0; }
  | NONE                     { $$ = mk(P, MDL_E_NONE, @1); }
  | STRING                   { $$ = mk(P, MDL_E_STRING, @1); $$->str = $1; }
  | NAME                     { $$ = mk(P, MDL_E_NAME, @1); $$->str = $1; }
  | KW_INT                   { $$ = mk(P, MDL_E_NAME, @1); $$->str = ts_intern("int"); }    /* int(x): the conversion */
  | KW_FLOAT                 { $$ = mk(P, MDL_E_NAME, @1); $$->str = ts_intern("float"); }  /* float(x) */
  | '(' expr ')'             { $$ = $2; }
  | '(' ')'                  { $$ = mk_items(P, MDL_E_TUPLE, seq_new(P), @1); }
  | '(' expr ',' ')'         { $$ = mk_items(P, MDL_E_TUPLE, seq_push(P, seq_new(P), $2), @1); }
  | '(' expr ',' exprs comma_opt ')' {
      MdlSeq *s = seq_push(P, seq_new(P), $2);
      for (int i = 0; i < $4->n; i++) seq_push(P, s, $4->a[i]);
      $$ = mk_items(P, MDL_E_TUPLE, s, @1);
    }
  | '[' ']'                  { $$ = mk_items(P, MDL_E_LIST, seq_new(P), @1); }
  | '[' exprs comma_opt ']'  { $$ = mk_items(P, MDL_E_LIST, $2, @1); }
  ;
comma_opt: %empty | ',' ;
exprs
  : expr                     { $$ = seq_push(P, seq_new(P), $1); }
  | exprs ',' expr           { $$ = seq_push(P, $1, $3); }
  ;

/* param [dtype] [shape] init <unary> decay|nodecay (options in any order) */
param
  : PARAM dtype '[' dims_opt ']' popts {
      $$ = mk_items(P, MDL_E_PARAM, $4, @1);
      $$->str = $2 ? check_dtype(P, $2, @2) : NULL; $$->a = $6.init; $$->ival = $6.flags;
    }
  ;
popts
  : %empty                   { $$.init = NULL; $$.flags = 0; $$.has_init = 0; }
  | popts INIT init_arg {
      $$ = $1;
      if ($1.has_init) perr(P, @2, "a param has one 'init'");
      $$.init = $3; $$.has_init = 1;
    }
  | popts DECAY {
      $$ = $1;
      if ($1.flags) perr(P, @2, "a param is either 'decay' or 'nodecay', once");
      $$.flags = MDL_PARAM_DECAY;
    }
  | popts NODECAY {
      $$ = $1;
      if ($1.flags) perr(P, @2, "a param is either 'decay' or 'nodecay', once");
      $$.flags = MDL_PARAM_NODECAY;
    }
  ;

/* An initializer: a name, call or number (so `init normal(0.02) * 2` is
 * not ambiguous, and a param cannot initialize a param). */
init_arg
  : '-' init_arg             { $$ = mk_un(P, '-', $2, @1); }
  | postfix                  { $$ = $1; }
  ;

/* ---- call arguments: positional first, then name: value ---- */
args_opt
  : %empty                   { $$ = seq_new(P); }
  | args                     { $$ = $1; }
  | args ','                 { $$ = $1; }
  ;
args
  : arg                      { $$ = seq_push(P, seq_new(P), $1); }
  | args ',' arg {
      MdlArg *last = $1->a[$1->n - 1];
      if (last->name && !$3->name)
        perr(P, @3, "positional argument after keyword argument '%s:'", last->name);
      $$ = seq_push(P, $1, $3);
    }
  ;
arg
  : expr                     { $$ = arena_alloc(P->arena, sizeof *$$); $$->value = $1; $$->loc = $1->loc; }
  | NAME ':' expr            { $$ = arena_alloc(P->arena, sizeof *$$); $$->name = $1; $$->value = $3; $$->loc = L(P, @1); }
  ;

/* ---- subscripts: x[i], x[a:b], x[..., 0] ---- */
subs
  : sub                      { $$ = seq_push(P, seq_new(P), $1); }
  | subs ',' sub             { $$ = seq_push(P, $1, $3); }
  ;
sub
  : expr                     { $$ = $1; }
  | ELLIPSIS                 { $$ = mk(P, MDL_E_ELLIPSIS, @1); }
  | expr ':' expr            { $$ = mk(P, MDL_E_SLICE, @2); $$->a = $1; $$->b = $3; }
  | expr ':'                 { $$ = mk(P, MDL_E_SLICE, @2); $$->a = $1; }
  | ':' expr                 { $$ = mk(P, MDL_E_SLICE, @1); $$->b = $2; }
  | ':'                      { $$ = mk(P, MDL_E_SLICE, @1); }
  ;

%%

/* ---------------------------------------------------------------------- */

static int too_many_errors(const MdlParseState *P) {
  return P->diag->nerrors - P->nerrors_start >= MDL_MAX_ERRORS;
}

/* The scanner, cut off (end of input) once there are too many errors. */
static int yylex(MDL_YYSTYPE *lval, MDL_YYLTYPE *lloc, MdlParseState *P) {
  if (too_many_errors(P)) {
    lloc->first_line = lloc->last_line = P->line;
    lloc->first_column = lloc->last_column = P->col;
    return 0;
  }
  return mdl_lex_yylex(lval, lloc, P->scanner);
}

static void perr(MdlParseState *P, MDL_YYLTYPE l, const char *fmt, ...) {
  if (too_many_errors(P)) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  mdl_error(P->diag, L(P, l), "%s", msg);
}

/* Bison's own failures: only "memory exhausted" (stack deeper than
 * YYMAXDEPTH) can happen with this grammar. */
static void yyerror(MDL_YYLTYPE *l, MdlParseState *P, const char *msg) {
  perr(P, *l, "input nested too deeply for the parser (%s)", msg);
}

static MdlSeq *seq_new(MdlParseState *P) { return arena_alloc(P->arena, sizeof(MdlSeq)); }

/* Appends in the arena: a full list moves to a block twice the size (the
 * old block stays in the arena; total waste is bounded by the list). */
static MdlSeq *seq_push(MdlParseState *P, MdlSeq *s, void *x) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 4;
    void **a = arena_alloc(P->arena, sizeof *a * (size_t)cap);
    if (s->n) memcpy(a, s->a, sizeof *a * (size_t)s->n);
    s->a = a; s->cap = cap;
  }
  s->a[s->n++] = x;
  return s;
}

static MdlExpr *mk(MdlParseState *P, MdlExprKind k, MDL_YYLTYPE l) {
  MdlExpr *e = arena_alloc(P->arena, sizeof *e);
  e->kind = k;
  e->loc = L(P, l);
  return e;
}

static MdlExpr *mk_bin(MdlParseState *P, int op, MdlExpr *a, MdlExpr *b, MDL_YYLTYPE l) {
  MdlExpr *e = mk(P, MDL_E_BINARY, l);
  e->op = op; e->a = a; e->b = b;
  return e;
}

static MdlExpr *mk_un(MdlParseState *P, int op, MdlExpr *a, MDL_YYLTYPE l) {
  MdlExpr *e = mk(P, MDL_E_UNARY, l);
  e->op = op; e->a = a;
  return e;
}

static MdlExpr *mk_items(MdlParseState *P, MdlExprKind k, MdlSeq *items, MDL_YYLTYPE l) {
  MdlExpr *e = mk(P, k, l);
  e->items = (MdlExpr **)items->a;
  e->nitems = items->n;
  return e;
}

static MdlExpr *mk_call(MdlParseState *P, MdlExpr *callee, MdlSeq *args, MDL_YYLTYPE l) {
  MdlExpr *e = mk(P, MDL_E_CALL, l);
  e->a = callee;
  e->loc = callee->loc;            /* a call is where its callee is written */
  e->nargs = args->n;
  e->args = arena_alloc(P->arena, sizeof *e->args * (size_t)(args->n ? args->n : 1));
  for (int i = 0; i < args->n; i++) e->args[i] = *(MdlArg *)args->a[i];
  return e;
}

static MdlStmt *mk_stmt(MdlParseState *P, MdlStmtKind k, MDL_YYLTYPE l) {
  MdlStmt *s = arena_alloc(P->arena, sizeof *s);
  s->kind = k;
  s->loc = L(P, l);
  return s;
}

/* Statement lists may hold NULL where a statement had a syntax error;
 * those only exist in programs that are rejected, but drop them anyway. */
static void compact(MdlSeq *s) {
  int n = 0;
  for (int i = 0; i < s->n; i++) if (s->a[i]) s->a[n++] = s->a[i];
  s->n = n;
}

static void stmt_body(MdlParseState *P, MdlStmt *s, MdlSeq *body) {
  compact(body);
  s->body = (MdlStmt **)body->a;
  s->nbody = body->n;
}

static MdlFunc *mk_func(MdlParseState *P, int is_model, const char *name, MDL_YYLTYPE l,
                        MdlSeq *decls, MdlSeq *body) {
  MdlFunc *f = arena_alloc(P->arena, sizeof *f);
  f->name = name;
  f->loc = L(P, l);
  f->is_model = is_model;
  f->ndecls = decls->n;
  f->decls = arena_alloc(P->arena, sizeof *f->decls * (size_t)(decls->n ? decls->n : 1));
  for (int i = 0; i < decls->n; i++) f->decls[i] = *(MdlDecl *)decls->a[i];
  compact(body);
  f->body = (MdlStmt **)body->a;
  f->nbody = body->n;
  return f;
}

static MdlKV *mk_kv(MdlParseState *P, const char *name, MDL_YYLTYPE l, MdlExpr *v) {
  MdlKV *kv = arena_alloc(P->arena, sizeof *kv);
  kv->name = name; kv->loc = L(P, l); kv->value = v;
  return kv;
}

/* A config/train/parallel block: one per program. */
static void set_kvs(MdlParseState *P, const char *what, MdlLoc *seen, MDL_YYLTYPE l, MdlSeq *s,
                    MdlKV **out, int *n) {
  if (seen->line) {
    perr(P, l, "duplicate '%s' block (the first is at %d:%d); put all entries in one block",
         what, seen->line, seen->col);
    return;
  }
  *seen = L(P, l);
  compact(s);
  *out = arena_alloc(P->arena, sizeof **out * (size_t)(s->n ? s->n : 1));
  for (int i = 0; i < s->n; i++) (*out)[i] = *(MdlKV *)s->a[i];
  *n = s->n;
}

/* Element types a tensor may be declared with. */
static const char *check_dtype(MdlParseState *P, const char *name, MDL_YYLTYPE l) {
  static const char *const ok[] = { "f32", "f64", "i32", "bf16", "f16" };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
    if (!strcmp(name, ok[i])) return name;
  perr(P, l, "unknown element type '%s' (expected f32, f64, i32, bf16 or f16)", name);
  return NULL;
}

/* ---- syntax error messages ---- */

/* "name 'x'", "integer 3", "')'", "end of line" for the token with code tok. */
static void tok_desc(int tok, const char *text, char *buf, size_t n) {
  switch (tok) {
  case 0: snprintf(buf, n, "end of file"); break;
  case T_NL: snprintf(buf, n, "end of line"); break;
  case T_NAME: snprintf(buf, n, "name '%s'", text); break;
  case T_INT: snprintf(buf, n, "integer %s", text); break;
  case T_FLOAT: snprintf(buf, n, "number %s", text); break;
  case T_STRING: snprintf(buf, n, "a string"); break;
  default: snprintf(buf, n, "'%s'", text); break;
  }
}

/* Bison's name for an expected symbol, without the quoting of aliases. */
static void sym_desc(yysymbol_kind_t k, char *buf, size_t n) {
  const char *s = yysymbol_name(k);
  size_t len = strlen(s);
  if (len >= 2 && s[0] == '"' && s[len - 1] == '"') snprintf(buf, n, "%.*s", (int)len - 2, s + 1);
  else snprintf(buf, n, "%s", s);
  if (k == YYSYMBOL_NAME) snprintf(buf, n, "a name");
}

/* Tokens after which "expected an expression after 'X'" reads well. */
static int expects_operand(int tok) {
  switch (tok) {
  case '+': case '-': case '*': case '/': case '%': case '@': case '<': case '>': case '=':
  case ',': case '(': case '[': case ':':
  case T_FLOORDIV: case T_LE: case T_GE: case T_EQ: case T_NE: case T_AND: case T_OR: case T_NOT:
  case T_RETURN: case T_IF: case T_REPEAT: case T_INIT:
    return 1;
  default:
    return 0;
  }
}

static char closer_of(char open) { return open == '(' ? ')' : open == '[' ? ']' : '}'; }

static const char *bracket_owner(const MdlBracket *b, char *buf, size_t n) {
  if (b->owner) return b->owner;
  snprintf(buf, n, "'%c'", b->ch);
  return buf;
}

static int yyreport_syntax_error(const yypcontext_t *ctx, MdlParseState *P) {
  if (too_many_errors(P)) return 0;
  MDL_YYLTYPE at = *yypcontext_location(ctx);
  yysymbol_kind_t la = yypcontext_token(ctx);
  char found[96], ob[16];
  tok_desc(P->cur_tok, P->cur_text, found, sizeof found);

  /* End of input inside a bracket: name the bracket, innermost first. */
  if (la == YYSYMBOL_YYEOF && P->brackets.n > 0) {
    const MdlBracket *b = &P->brackets.a[P->brackets.n - 1];
    perr(P, at, "expected '%c' to close %s opened at %d:%d", closer_of(b->ch),
         bracket_owner(b, ob, sizeof ob), b->line, b->col);
    return 0;
  }
  /* A closer (or '{') that left a bracket open. */
  if (P->mismatch_valid && P->mismatch_line == at.first_line && P->mismatch_col == at.first_column) {
    const MdlBracket *b = &P->mismatch;
    perr(P, at, "expected '%c' to close %s opened at %d:%d, found %s", closer_of(b->ch),
         bracket_owner(b, ob, sizeof ob), b->line, b->col, found);
    return 0;
  }
  if ((la == YYTRANSLATE(')') || la == YYTRANSLATE(']') || la == YYTRANSLATE('}')) &&
      P->stray_line == at.first_line && P->stray_col == at.first_column) {
    perr(P, at, "unexpected %s (nothing to close)", found);
    return 0;
  }
  /* An item keyword inside a block: the block above it was not closed. */
  if ((la == YYSYMBOL_MODEL || la == YYSYMBOL_FN || la == YYSYMBOL_CONFIG || la == YYSYMBOL_IMPORT ||
       la == YYSYMBOL_RULES || la == YYSYMBOL_TRAIN || la == YYSYMBOL_PARALLEL) && P->brackets.n > 0 &&
      !(la == YYSYMBOL_FN && P->prev_tok == ':')) {
    const MdlBracket *b = &P->brackets.a[P->brackets.n - 1];
    perr(P, at, "expected '%c' to close %s opened at %d:%d, found %s", closer_of(b->ch),
         bracket_owner(b, ob, sizeof ob), b->line, b->col, found);
    return 0;
  }
  /* keywords are declared contiguously, 'import' through 'str' */
  if (la == YYTRANSLATE('=') && P->prev_tok >= T_IMPORT && P->prev_tok <= T_KW_STR) {
    perr(P, at, "'%s' is a keyword and cannot be assigned to; choose another name", P->prev_text);
    return 0;
  }
  if (P->prev_tok == T_PARAM) {
    perr(P, at, "expected a shape after 'param', such as [embed] or f32[vocab, embed], found %s", found);
    return 0;
  }
  /* "x += 1": there are no compound assignments. */
  if (la == YYTRANSLATE('=') && (P->prev_tok == '+' || P->prev_tok == '-' || P->prev_tok == '*' ||
                                 P->prev_tok == '/' || P->prev_tok == '%' || P->prev_tok == '@')) {
    perr(P, at, "MDL has no '%c=': write 'x = x %c y'", P->prev_tok, P->prev_tok);
    return 0;
  }
  if (la == YYSYMBOL_ELSE && P->prev_tok == T_NL) {
    perr(P, at, "'else' must be on the same line as the '}' that closes its 'if'");
    return 0;
  }

  yysymbol_kind_t exp[YYNTOKENS];
  int n = yypcontext_expected_tokens(ctx, exp, YYNTOKENS);
  if (n < 0) n = 0;
  int has[YYNTOKENS] = {0};
  for (int i = 0; i < n; i++) has[exp[i]] = 1;

  char prev[96];
  tok_desc(P->prev_tok, P->prev_text, prev, sizeof prev);
  if (has[YYSYMBOL_INT] && has[YYSYMBOL_NAME]) {
    if (P->prev_tok && expects_operand(P->prev_tok))
      perr(P, at, "expected an expression after %s, found %s", prev, found);
    else
      perr(P, at, "expected an expression, found %s", found);
    return 0;
  }
  if (has[YYSYMBOL_KW_INT] && has[YYSYMBOL_KW_FLOAT]) {
    perr(P, at, "expected a type (int, float, bool, str, fn, or a shape such as f32[batch, seq]), found %s",
         found);
    return 0;
  }
  if (has[YYSYMBOL_IMPORT] && has[YYSYMBOL_MODEL]) {
    perr(P, at, "expected an item ('import', 'config', 'rules', 'train', 'parallel', 'fn' or 'model'), "
         "found %s", found);
    return 0;
  }
  int cmp = la == YYTRANSLATE('<') || la == YYTRANSLATE('>') || la == YYSYMBOL_LE || la == YYSYMBOL_GE ||
            la == YYSYMBOL_EQ || la == YYSYMBOL_NE;
  if (cmp && has[YYTRANSLATE('+')]) {
    perr(P, at, "comparisons do not chain: write 'a < b and b < c' instead of 'a < b < c'");
    return 0;
  }
  /* After a complete expression every operator could follow; listing them
   * helps nobody, so keep only the other tokens. */
  if (has[YYTRANSLATE('+')]) {
    static const char ops[] = "+-*/%@<>([.";
    for (const char *o = ops; *o; o++) has[YYTRANSLATE((unsigned char)*o)] = 0;
    has[YYSYMBOL_FLOORDIV] = has[YYSYMBOL_LE] = has[YYSYMBOL_GE] = has[YYSYMBOL_EQ] = 0;
    has[YYSYMBOL_NE] = has[YYSYMBOL_AND] = has[YYSYMBOL_OR] = 0;
  }
  /* "f(x) = 2", "a.b = 1": a complete expression followed by '='. */
  if (la == YYTRANSLATE('=') && has[YYSYMBOL_NL]) {
    perr(P, at, "only names can be assigned to ('name = value' or 'a, b = value')");
    return 0;
  }
  /* In a call, ':' is expected only because the argument could have been
   * a keyword; "expected ',' or ')'" is what the writer needs to hear. */
  if (P->brackets.n > 0 && P->brackets.a[P->brackets.n - 1].ch == '(' && has[YYTRANSLATE(')')] &&
      has[YYTRANSLATE(',')])
    has[YYTRANSLATE(':')] = 0;
  int m = 0;
  yysymbol_kind_t keep[YYNTOKENS];
  /* Only a statement end fits: the statement is complete. */
  int only_end = has[YYSYMBOL_NL];
  for (int i = 0; i < n; i++)
    if (has[exp[i]] && exp[i] != YYSYMBOL_NL && exp[i] != YYTRANSLATE(';') && exp[i] != YYTRANSLATE('}') &&
        exp[i] != YYSYMBOL_YYEOF)
      only_end = 0;
  if (only_end) {
    perr(P, at, "expected the end of the statement (a new line or ';'), found %s", found);
    return 0;
  }
  for (int i = 0; i < n; i++) if (has[exp[i]]) keep[m++] = exp[i];
  if (m >= 1 && m <= 4) {
    char msg[400] = "expected ";
    for (int i = 0; i < m; i++) {
      char d[64];
      sym_desc(keep[i], d, sizeof d);
      if (i > 0) strcat(msg, i == m - 1 ? " or " : ", ");
      strcat(msg, d);
    }
    /* Say which bracket the expected closer would close. */
    if (P->brackets.n > 0 && P->brackets.a[P->brackets.n - 1].ch != '{') {
      const MdlBracket *b = &P->brackets.a[P->brackets.n - 1];
      if (has[YYTRANSLATE((unsigned char)closer_of(b->ch))]) {
        size_t len = strlen(msg);
        snprintf(msg + len, sizeof msg - len, " (to close %s opened at %d:%d)",
                 bracket_owner(b, ob, sizeof ob), b->line, b->col);
      }
    }
    if (m == 1 && P->prev_tok > 0 && P->prev_tok != T_NL && la != YYSYMBOL_YYEOF &&
        !(P->brackets.n > 0 && has[YYTRANSLATE((unsigned char)closer_of(P->brackets.a[P->brackets.n - 1].ch))]))
      perr(P, at, "%s after %s, found %s", msg, prev, found);
    else
      perr(P, at, "%s, found %s", msg, found);
    return 0;
  }
  perr(P, at, "unexpected %s", found);
  return 0;
}

/* ---- limits on nesting, so later recursive stages cannot overflow ---- */
enum { MDL_MAX_EXPR_DEPTH = 256, MDL_MAX_BLOCK_DEPTH = 64 };

static int check_expr(MdlParseState *P, const MdlExpr *e, int depth) {
  if (!e) return 0;
  if (depth > MDL_MAX_EXPR_DEPTH) {
    mdl_error(P->diag, e->loc, "expression nested too deeply (more than %d levels)", MDL_MAX_EXPR_DEPTH);
    return -1;
  }
  if (check_expr(P, e->a, depth + 1) || check_expr(P, e->b, depth + 1)) return -1;
  for (int i = 0; i < e->nitems; i++) if (check_expr(P, e->items[i], depth + 1)) return -1;
  for (int i = 0; i < e->nargs; i++) if (check_expr(P, e->args[i].value, depth + 1)) return -1;
  return 0;
}

static int check_stmts(MdlParseState *P, MdlStmt *const *ss, int n, int depth) {
  for (int i = 0; i < n; i++) {
    const MdlStmt *s = ss[i];
    if (depth > MDL_MAX_BLOCK_DEPTH) {
      mdl_error(P->diag, s->loc, "blocks nested too deeply (more than %d levels)", MDL_MAX_BLOCK_DEPTH);
      return -1;
    }
    if (check_expr(P, s->value, 0)) return -1;
    for (int j = 0; j < s->nitems; j++) if (check_expr(P, s->items[j], 0)) return -1;
    if (check_stmts(P, s->body, s->nbody, depth + 1) || check_stmts(P, s->els, s->nels, depth + 1))
      return -1;
  }
  return 0;
}

static int check_func(MdlParseState *P, const MdlFunc *f) {
  for (int i = 0; i < f->ndecls; i++) {
    if (check_expr(P, f->decls[i].dflt, 0)) return -1;
    for (int j = 0; j < f->decls[i].ndims; j++) if (check_expr(P, f->decls[i].dims[j], 0)) return -1;
  }
  return check_stmts(P, f->body, f->nbody, 0);
}

static int check_program(MdlParseState *P, const MdlProgram *g) {
  const MdlKV *kvs[3] = { g->config, g->train, g->parallel };
  int nkv[3] = { g->nconfig, g->ntrain, g->nparallel };
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < nkv[k]; i++) if (check_expr(P, kvs[k][i].value, 0)) return -1;
  for (int i = 0; i < g->nfuncs; i++) if (check_func(P, g->funcs[i])) return -1;
  if (g->model && check_func(P, g->model)) return -1;
  return 0;
}

/* Moves the collected imports, fns and rules into the program's arrays. */
static void finish_program(MdlParseState *P) {
  MdlProgram *g = P->prog;
  int n = P->imports.n;
  g->imports = arena_alloc(P->arena, sizeof *g->imports * (size_t)(n ? n : 1));
  g->import_locs = arena_alloc(P->arena, sizeof *g->import_locs * (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) {
    const MdlExpr *e = P->imports.a[i];
    g->imports[i] = e->str;
    g->import_locs[i] = e->loc;
  }
  g->nimports = n;
  g->funcs = (MdlFunc **)P->funcs.a;
  g->nfuncs = P->funcs.n;
  g->rules = arena_alloc(P->arena, sizeof *g->rules * (size_t)(P->rules.n ? P->rules.n : 1));
  for (int i = 0; i < P->rules.n; i++) g->rules[i] = *(MdlRule *)P->rules.a[i];
  g->nrules = P->rules.n;
}

static int diag_has_source(const MdlDiag *d, const char *file) {
  for (int i = 0; i < d->sources.n; i++)
    if (d->sources.a[i].file == file) return 1;
  return 0;
}

MdlProgram *mdl_parse(const char *src, const char *file, Arena *a, MdlDiag *d) {
  MdlParseState st;
  memset(&st, 0, sizeof st);
  st.arena = a;
  st.diag = d;
  st.file = ts_intern(file ? file : "<input>");
  st.nerrors_start = d->nerrors;
  st.prog = arena_alloc(a, sizeof *st.prog);
  st.prog->file = st.file;
  st.prog->src = arena_strdup(a, src);
  /* So that messages show the line even when the caller did not register
   * the text (the arena outlives this parse's diagnostics). */
  if (!diag_has_source(d, st.file)) mdl_diag_add_source(d, st.file, st.prog->src);

  size_t len = strlen(st.prog->src);
  if (len > (size_t)1 << 30) {       /* flex takes an int length; no model is this big */
    MdlLoc at = { st.file, 0, 0 };
    mdl_error(d, at, "file too large (%zu bytes; the limit is 1 GiB)", len);
    return NULL;
  }
  if (mdl_lex_init(&st, st.prog->src, len) != 0) {
    MdlLoc at = { st.file, 0, 0 };
    mdl_error(d, at, "cannot start the scanner (out of memory)");
    return NULL;
  }
  mdl_yyparse(&st);
  mdl_lex_free(&st);
  finish_program(&st);

  if (too_many_errors(&st))
    fprintf(d->out ? d->out : stderr, "%s: note: too many errors (%d); stopping\n", st.file, MDL_MAX_ERRORS);
  if (d->nerrors != st.nerrors_start) return NULL;
  if (check_program(&st, st.prog)) return NULL;
  return st.prog;
}
