/* test_parser.c - unit tests of the MDL parser's AST, the diagnostics'
 * exact format, and the driver's file and import handling (everything of
 * the frontend that the golden files cannot see: tree shapes, caret
 * lines, the error cap, module search order). */
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>
#include "frontend/ast.h"
#include "frontend/mdl.h"
#include "../check.h"

/* Parses src; diagnostics into *out (caller frees). */
static MdlProgram *parse(Arena *a, const char *src, char **out) {
  size_t n;
  FILE *f = open_memstream(out, &n);
  MdlDiag d;
  mdl_diag_init(&d, f);
  MdlProgram *p = mdl_parse(src, "t.mdl", a, &d);
  mdl_diag_free(&d);
  fclose(f);
  return p;
}

static const MdlStmt *stmt(const MdlFunc *f, int i) { return i < f->nbody ? f->body[i] : NULL; }

static void test_expressions(void) {
  Arena a;
  arena_init(&a);
  char *out = NULL;
  MdlProgram *p = parse(&a,
    "fn f(x: f32[b=4, ..., d], n: int = 2, g: fn = relu) {\n"
    "  y = 1 + 2 * 3 - -x @ w // 2\n"
    "  a, b = g(x, eps: 1e-5)\n"
    "  w = param bf16[d, n * 2] init normal(0.02) nodecay\n"
    "  v = x[0, 1:, :n, ..., :]; t = (1,); u = [1, 2.5, \"s\\n\\\"\"]\n"
    "  if n > 1 { return x } else if n < 0 { return y } else { return none }\n"
    "  repeat n as i {\n    x = nn.mlp(x,\n      ffn: 4)\n  }\n"
    "}\n", &out);
  CHECK(p != NULL);
  if (!p) { fprintf(stderr, "%s", out); free(out); arena_free(&a); return; }
  CHECK(p->nfuncs == 1 && p->model == NULL);
  const MdlFunc *f = p->funcs[0];
  CHECK(f->name == ts_intern("f") && f->loc.line == 1 && f->loc.col == 4);
  CHECK(f->ndecls == 3);
  const MdlDecl *x = &f->decls[0];
  CHECK(x->type == MDL_T_TENSOR && !strcmp(x->dtype, "f32") && x->ndims == 3);
  CHECK(x->dims[0]->kind == MDL_E_NAMED_DIM && !strcmp(x->dims[0]->str, "b") &&
        x->dims[0]->a->kind == MDL_E_INT && x->dims[0]->a->ival == 4);
  CHECK(x->dims[1]->kind == MDL_E_ELLIPSIS);
  CHECK(x->dims[2]->kind == MDL_E_NAME && x->dims[2]->str == ts_intern("d"));
  CHECK(f->decls[1].type == MDL_T_INT && f->decls[1].dflt && f->decls[1].dflt->ival == 2);
  CHECK(f->decls[2].type == MDL_T_FN && f->decls[2].dflt->kind == MDL_E_NAME);
  CHECK(f->nbody == 8);

  /* 1 + 2 * 3 - -x @ w // 2  ==  (1 + (2*3)) - (((-x) @ w) // 2) */
  const MdlStmt *s = stmt(f, 0);
  CHECK(s && s->kind == MDL_S_ASSIGN && s->nnames == 1 && s->names[0] == ts_intern("y"));
  const MdlExpr *e = s->value;
  CHECK(e->kind == MDL_E_BINARY && e->op == '-');
  CHECK(e->a->kind == MDL_E_BINARY && e->a->op == '+' && e->a->b->op == '*');
  CHECK(e->b->op == MDL_OP_FLOORDIV && e->b->a->op == '@' && e->b->a->a->kind == MDL_E_UNARY &&
        e->b->a->a->op == '-');
  CHECK(e->loc.line == 2 && e->loc.col == 17);   /* a binary op is located at its operator */

  s = stmt(f, 1);
  CHECK(s->nnames == 2 && s->names[1] == ts_intern("b") && s->name_locs[1].col == 6);
  CHECK(s->value->kind == MDL_E_CALL && s->value->nargs == 2 && s->value->args[0].name == NULL &&
        s->value->args[1].name == ts_intern("eps") && s->value->args[1].value->fval == 1e-5);
  CHECK(s->value->loc.col == 10);                 /* a call is located at its callee */
  s = stmt(f, 2);
  e = s->value;
  CHECK(e->kind == MDL_E_PARAM && !strcmp(e->str, "bf16") && e->nitems == 2 &&
        e->items[1]->op == '*' && e->a && e->a->kind == MDL_E_CALL && e->ival == MDL_PARAM_NODECAY);

  s = stmt(f, 3);
  e = s->value;
  CHECK(e->kind == MDL_E_INDEX && e->nitems == 5);
  CHECK(e->items[0]->kind == MDL_E_INT);
  CHECK(e->items[1]->kind == MDL_E_SLICE && e->items[1]->a && !e->items[1]->b);
  CHECK(e->items[2]->kind == MDL_E_SLICE && !e->items[2]->a && e->items[2]->b);
  CHECK(e->items[3]->kind == MDL_E_ELLIPSIS);
  CHECK(e->items[4]->kind == MDL_E_SLICE && !e->items[4]->a && !e->items[4]->b);
  s = stmt(f, 4);
  CHECK(s->value->kind == MDL_E_TUPLE && s->value->nitems == 1);
  s = stmt(f, 5);
  CHECK(s->value->kind == MDL_E_LIST && s->value->nitems == 3 && s->value->items[2]->kind == MDL_E_STRING &&
        !strcmp(s->value->items[2]->str, "s\n\""));

  s = stmt(f, 6);
  CHECK(s->kind == MDL_S_IF && s->nbody == 1 && s->body[0]->kind == MDL_S_RETURN && s->nels == 1);
  CHECK(s->els[0]->kind == MDL_S_IF && s->els[0]->nels == 1 && s->els[0]->els[0]->kind == MDL_S_RETURN &&
        s->els[0]->els[0]->items[0]->kind == MDL_E_NONE);
  s = stmt(f, 7);
  CHECK(s->kind == MDL_S_REPEAT && s->as == ts_intern("i") && s->nbody == 1);
  e = s->body[0]->value;
  CHECK(e->kind == MDL_E_CALL && e->a->kind == MDL_E_MEMBER && e->a->str == ts_intern("mlp") &&
        e->a->a->str == ts_intern("nn") && e->nargs == 2);   /* newline inside (...) is ignored */

  free(out);
  arena_free(&a);

  arena_init(&a);
  /* 'not' binds looser than comparison, 'and' tighter than 'or' */
  p = parse(&a, "config { a = not x == 1 or y and z }\n", &out);
  CHECK(p && p->nconfig == 1);
  if (p) {
    e = p->config[0].value;
    CHECK(e->op == MDL_OP_OR && e->a->op == MDL_OP_NOT && e->a->a->op == MDL_OP_EQ && e->b->op == MDL_OP_AND);
  }
  free(out);
  arena_free(&a);
}

static void test_items(void) {
  Arena a;
  arena_init(&a);
  char *out = NULL;
  MdlProgram *p = parse(&a,
    "# comment\n\n;import nn; import other\n"
    "config { a = 1; b = \"x\" }\n"
    "rules {\n  batch: dp,\n  heads: tp\n  ffn: tp,\n}\n"
    "model m(tokens: i32[batch, seq]) { return tokens }\n"
    "train { steps = 3 }\nparallel { tp = 2 }\n", &out);
  CHECK(p != NULL);
  if (p) {
    CHECK(p->nimports == 2 && p->imports[1] == ts_intern("other") && p->import_locs[0].line == 3 &&
          p->import_locs[0].col == 9);
    CHECK(p->nconfig == 2 && p->config[1].value->kind == MDL_E_STRING);
    CHECK(p->nrules == 3 && p->rules[2].dim == ts_intern("ffn") && p->rules[2].axis == ts_intern("tp"));
    CHECK(p->model && p->model->is_model && p->model_loc.line == 10 && p->model_loc.col == 1);
    CHECK(p->ntrain == 1 && p->nparallel == 1 && p->parallel[0].value->ival == 2);
    CHECK(p->src && strstr(p->src, "import nn"));
  }
  free(out);
  arena_free(&a);
}

/* The exact shape of a diagnostic: position, message, line, caret (a tab
 * in the line is kept in the caret line so the caret stays aligned). */
static void test_diag_format(void) {
  Arena a;
  arena_init(&a);
  char *out = NULL;
  MdlProgram *p = parse(&a, "config {\n\ta = 1 +\n}\n", &out);
  CHECK(p == NULL);
  CHECK(!strcmp(out,
    "t.mdl:2:9: error: expected an expression after '+', found end of line\n"
    "    \ta = 1 +\n"
    "    \t       ^\n"));
  free(out);
  arena_free(&a);
}

static int count(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p++) n++;
  return n;
}

static void test_error_cap(void) {
  StrBuf src = {0};
  for (int i = 0; i < 50; i++) sb_printf(&src, "fn f%d() { x = ) }\n", i);
  Arena a;
  arena_init(&a);
  char *out = NULL;
  CHECK(parse(&a, src.p, &out) == NULL);
  CHECK(count(out, ": error: ") == 20);
  CHECK(strstr(out, "too many errors") != NULL);
  /* recovery continues at the next statement: errors on 20 different lines */
  CHECK(strstr(out, "t.mdl:20:16: error:") != NULL);
  free(out);
  arena_free(&a);
  sb_free(&src);

  /* Errors from inside one token (a string full of bad escapes) and from
   * a run of invalid bytes count against the same limit. */
  StrBuf s2 = {0};
  sb_puts(&s2, "config { a = \"");
  for (int i = 0; i < 50; i++) sb_puts(&s2, "\\q");
  sb_puts(&s2, "\" }\nconfig { b = ");
  for (int i = 0; i < 50; i++) sb_puts(&s2, "$");
  sb_puts(&s2, " }\n");
  arena_init(&a);
  CHECK(parse(&a, s2.p, &out) == NULL);
  CHECK(count(out, ": error: ") == 20);
  free(out);
  arena_free(&a);
  sb_free(&s2);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) { fputs(text, f); fclose(f); }
}

/* Runs mdl_compile_* and returns the diagnostics (caller frees). */
static char *compile(const char *src, const char *fname, const char *stdlib, const char *path) {
  char *out = NULL;
  size_t n;
  FILE *f = open_memstream(&out, &n);
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.diag = f;
  opt.stdlib_dir = stdlib;
  IrModule *m = path ? mdl_compile_file(path, &opt) : mdl_compile_string(src, fname, &opt);
  if (m) ir_module_free(m);
  fclose(f);
  return out;
}

static void test_driver(void) {
  MdlOptions o;
  mdl_options_init(&o);
  CHECK(o.stdlib_dir == NULL && o.precision == IR_VOID && o.tp == -1 && o.pp == -1 && o.cp == -1 &&
        o.ep == -1 && o.sp == -1 && o.diag == NULL && o.ndefines == 0);

  char *out = compile(NULL, NULL, NULL, "/nonexistent/dir/x.mdl");
  CHECK(!strcmp(out, "mcc: error: cannot read '/nonexistent/dir/x.mdl': No such file or directory\n"));
  free(out);

  /* A module tree in a temp dir: main -> a (next to main) -> b (stdlib
   * dir only), and b has a syntax error that must be shown with b's own
   * path, line and caret. */
  char dir[] = "/tmp/mdl_test_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char lib[300], p_main[300], p_a[300], p_b[300], p_c[300];
  snprintf(lib, sizeof lib, "%s/lib", dir);
  mkdir(lib, 0700);
  snprintf(p_main, sizeof p_main, "%s/main.mdl", dir);
  snprintf(p_a, sizeof p_a, "%s/a.mdl", dir);
  snprintf(p_b, sizeof p_b, "%s/lib/b.mdl", dir);
  snprintf(p_c, sizeof p_c, "%s/lib/c.mdl", dir);
  write_file(p_main, "import a\nmodel m(x: [n]) { return x }\n");
  write_file(p_a, "import b\nfn fa(x) { return x }\n");
  write_file(p_b, "fn fb(x) {\n  return x +\n}\n");
  out = compile(NULL, NULL, lib, p_main);
  char want[600];
  snprintf(want, sizeof want,
           "%s:2:13: error: expected an expression after '+', found end of line\n"
           "      return x +\n"
           "                ^\n", p_b);
  CHECK(!strcmp(out, want));
  if (strcmp(out, want)) fprintf(stderr, "got:\n%s", out);
  free(out);

  /* Without the stdlib dir, b is missing: an error at a's import line. */
  out = compile(NULL, NULL, "/nonexistent", p_main);
  snprintf(want, sizeof want, "%s:1:8: error: cannot find module 'b'", p_a);
  CHECK(!strncmp(out, want, strlen(want)));
  free(out);

  /* TESSERA_STDLIB is used when the option is not set. */
  setenv("TESSERA_STDLIB", lib, 1);
  out = compile(NULL, NULL, NULL, p_main);
  CHECK(strstr(out, "b.mdl:2:13: error:") != NULL);
  free(out);
  unsetenv("TESSERA_STDLIB");

  /* compile_string: imports come from the stdlib dir; a module imported
   * twice (directly and through another) is loaded once; a library may
   * not hold a model. */
  write_file(p_b, "fn fb(x) { return x }\n");
  write_file(p_c, "import b\nmodel oops(x) { return x }\n");
  out = compile("import b\nimport c\nmodel m(x: [n]) { return x }\n", NULL, lib, NULL);
  CHECK(strstr(out, "c.mdl:2:1: error: module 'c' is imported, so it is a library") != NULL);
  CHECK(count(out, ": error: ") == 1);
  free(out);

  /* A string that imports itself through a module: cycle c -> d -> c. */
  write_file(p_c, "import d\nfn fc(x) { return x }\n");
  char p_d[300];
  snprintf(p_d, sizeof p_d, "%s/lib/d.mdl", dir);
  write_file(p_d, "import c\nfn fd(x) { return x }\n");
  out = compile("import c\nmodel m(x: [n]) { return x }\n", "<test>", lib, NULL);
  CHECK(strstr(out, "d.mdl:1:8: error: import cycle: c -> d -> c") != NULL);
  free(out);

  /* A main file that imports itself. */
  char p_self[300];
  snprintf(p_self, sizeof p_self, "%s/selfie.mdl", dir);
  write_file(p_self, "import selfie\nmodel m(x: [n]) { return x }\n");
  out = compile(NULL, NULL, lib, p_self);
  CHECK(strstr(out, "selfie.mdl:1:8: error: import cycle: selfie -> selfie") != NULL);
  free(out);
  unlink(p_self);

  unlink(p_main); unlink(p_a); unlink(p_b); unlink(p_c); unlink(p_d);
  rmdir(lib);
  rmdir(dir);
}

/* Many items and long lists must parse in linear time (an earlier
 * version copied the fn array on every fn: 100k fns took minutes). */
static void test_large_input(void) {
  StrBuf src = {0};
  for (int i = 0; i < 30000; i++) sb_printf(&src, "fn f%d(x) { return x + %d }\nimport m%d\n", i, i, i);
  sb_puts(&src, "rules {");
  for (int i = 0; i < 30000; i++) sb_printf(&src, " d%d: tp,", i);
  sb_puts(&src, " }\nmodel m(x) { return g(");
  for (int i = 0; i < 30000; i++) sb_printf(&src, "%d, ", i);
  sb_puts(&src, ") }\n");
  Arena a;
  arena_init(&a);
  char *out = NULL;
  MdlProgram *p = parse(&a, src.p, &out);
  CHECK(p != NULL);
  if (p) {
    CHECK(p->nfuncs == 30000 && p->nimports == 30000 && p->nrules == 30000);
    CHECK(p->funcs[29999]->name == ts_intern("f29999") && p->imports[123] == ts_intern("m123"));
    CHECK(p->model->body[0]->items[0]->nargs == 30000);
  }
  free(out);
  arena_free(&a);
  sb_free(&src);
}

int main(void) {
  test_large_input();
  test_expressions();
  test_items();
  test_diag_format();
  test_error_cap();
  test_driver();
  return check_exit("test_parser");
}
