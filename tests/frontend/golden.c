/* golden.c - runs the frontend's golden tests (CONVENTIONS §9): each .mdl
 * file carries its own expectation in comments.
 *
 *   # EXPECT: error 4:12 expected ')'     the FIRST error is at 4:12 (line:col
 *                                         in whichever file it is reported)
 *                                         and its message contains the text
 *   # EXPECT: ok                          compiles without errors
 *   # EXPECT-IR:                          compiles, and ir_print_module gives
 *   # <line 1 of the IR text>             exactly these lines (each comment
 *   # ...                                 line with its "# " removed, up to
 *                                         the first line not starting '#')
 *   # DEFINE: name=value                  a config override (-D), repeatable
 *
 * An EXPECT-IR block takes every '#' line after it, so put it at the end of
 * the file (comments describing the test go first).  --update rewrites an
 * expectation in place; keep a placeholder "# EXPECT: error 0:0 ?" line in
 * a new file so that line numbers do not move when it is filled in.
 *
 * Usage:  golden [--update] [--parse-only] PATH...
 * PATH is an .mdl file or a directory (its *.mdl files, sorted; a missing
 * or empty directory passes with a note, so areas can fill it later).
 * --update rewrites each file's expectation to what happened, for review
 * with git diff.  --parse-only only parses (no imports, no elaboration)
 * and expects no errors: the check that bundled samples stay valid. */
#include <dirent.h>
#include <errno.h>
#include "frontend/mdl.h"
#include "frontend/ast.h"

static int update, parse_only;

typedef struct {
  char *text; size_t len;        /* the whole file; may contain NUL bytes */
  enum { EXP_NONE, EXP_ERROR, EXP_OK, EXP_IR } kind;
  int line, col;                 /* EXP_ERROR */
  char msg[512];
  size_t dir_begin, dir_end;     /* byte range of the expectation block */
  StrBuf ir;                     /* EXP_IR: expected text */
  MdlDefine defs[16]; int ndefs;
  char defbuf[16][128];
} Golden;

/* Next line [*pos, end of line) of g; returns its length, advances *pos. */
static size_t next_line(const Golden *g, size_t *pos, const char **line) {
  *line = g->text + *pos;
  size_t i = *pos;
  while (i < g->len && g->text[i] != '\n') i++;
  size_t n = i - *pos;
  *pos = i < g->len ? i + 1 : i;
  return n;
}

static int starts(const char *s, size_t n, const char *pre) {
  size_t k = strlen(pre);
  return n >= k && !memcmp(s, pre, k);
}

static void scan_expectations(Golden *g) {
  size_t pos = 0;
  while (pos < g->len) {
    size_t at = pos;
    const char *l;
    size_t n = next_line(g, &pos, &l);
    if (starts(l, n, "# DEFINE: ") && g->ndefs < 16) {
      char *b = g->defbuf[g->ndefs];
      snprintf(b, sizeof g->defbuf[0], "%.*s", (int)(n - 10), l + 10);
      char *eq = strchr(b, '=');
      if (eq) {
        *eq = 0;
        g->defs[g->ndefs].name = b;
        g->defs[g->ndefs].value = eq + 1;
        g->ndefs++;
      }
    } else if (starts(l, n, "# EXPECT: error ")) {
      char buf[600];
      snprintf(buf, sizeof buf, "%.*s", (int)(n - 16), l + 16);
      int used = 0;
      if (sscanf(buf, "%d:%d %n", &g->line, &g->col, &used) >= 2) {
        g->kind = EXP_ERROR;
        snprintf(g->msg, sizeof g->msg, "%s", buf + used);
      }
      g->dir_begin = at; g->dir_end = pos;
    } else if (starts(l, n, "# EXPECT: ok")) {
      g->kind = EXP_OK;
      g->dir_begin = at; g->dir_end = pos;
    } else if (starts(l, n, "# EXPECT-IR:")) {
      g->kind = EXP_IR;
      g->dir_begin = at;
      while (pos < g->len && g->text[pos] == '#') {
        const char *il;
        size_t in = next_line(g, &pos, &il);
        size_t skip = in >= 2 && il[1] == ' ' ? 2 : 1;
        sb_write(&g->ir, il + skip, in - skip);
        sb_putc(&g->ir, '\n');
      }
      g->dir_end = pos;
    }
  }
}

/* First "file:L:C: error: msg" (or "file: error: msg", position 0:0) in
 * the captured diagnostics.  0 if none. */
static int first_error(const char *out, int *line, int *col, char *msg, size_t msgn) {
  for (const char *l = out; l && *l; ) {
    const char *eol = strchr(l, '\n');
    size_t n = eol ? (size_t)(eol - l) : strlen(l);
    const char *e = NULL;
    for (size_t i = 0; i + 9 <= n; i++)
      if (!memcmp(l + i, ": error: ", 9)) { e = l + i; break; }
    if (e) {
      snprintf(msg, msgn, "%.*s", (int)(n - (size_t)(e + 9 - l)), e + 9);
      *line = *col = 0;
      /* prefix "file:L:C": the last two ':'-separated fields, if numeric */
      const char *c2 = e, *c1;
      while (c2 > l && c2[-1] != ':') c2--;
      if (c2 > l) {
        c1 = c2 - 1;
        while (c1 > l && c1[-1] != ':') c1--;
        if (c1 > l && sscanf(c1, "%d:%d:", line, col) != 2) *line = *col = 0;
      }
      return 1;
    }
    l = eol ? eol + 1 : NULL;
  }
  return 0;
}

static void strip_trailing_space(StrBuf *b) {
  StrBuf o = {0};
  for (size_t i = 0; i < b->n; ) {
    size_t j = i;
    while (j < b->n && b->p[j] != '\n') j++;
    size_t k = j;
    while (k > i && (b->p[k - 1] == ' ' || b->p[k - 1] == '\t')) k--;
    sb_write(&o, b->p + i, k - i);
    if (j < b->n) sb_putc(&o, '\n');
    i = j + 1;
  }
  sb_free(b);
  *b = o;
  if (!b->p) sb_puts(b, "");
}

/* Replaces the expectation block of g (or inserts one at the top) and
 * writes the file back. */
static int rewrite(const char *path, Golden *g, const char *block) {
  StrBuf o = {0};
  size_t b = g->kind == EXP_NONE ? 0 : g->dir_begin, e = g->kind == EXP_NONE ? 0 : g->dir_end;
  sb_write(&o, g->text, b);
  sb_puts(&o, block);
  sb_write(&o, g->text + e, g->len - e);
  ts_forget_input(path);   /* rewriting the test file it read is --update's job */
  int rc = ts_write_file(path, o.p, o.n);
  sb_free(&o);
  if (rc) fprintf(stderr, "%s\n", ts_io_error());
  else printf("updated %s\n", path);
  return rc;
}

static int run_one(const char *path) {
  Golden g;
  memset(&g, 0, sizeof g);
  g.text = ts_read_file(path, &g.len);
  if (!g.text) { fprintf(stderr, "FAIL %s: cannot read: %s\n", path, strerror(errno)); return 1; }
  scan_expectations(&g);

  char *out = NULL;
  size_t outn = 0;
  FILE *f = open_memstream(&out, &outn);
  IrModule *m = NULL;
  int ok;
  if (parse_only) {
    Arena a;
    arena_init(&a);
    MdlDiag d;
    mdl_diag_init(&d, f);
    ok = mdl_parse(g.text, path, &a, &d) != NULL && d.nerrors == 0 && strlen(g.text) == g.len;
    mdl_diag_free(&d);
    arena_free(&a);
  } else {
    MdlOptions opt;
    mdl_options_init(&opt);
    opt.diag = f;
    opt.defines = g.defs;
    opt.ndefines = g.ndefs;
    m = mdl_compile_file(path, &opt);
    ok = m != NULL;
  }
  fclose(f);

  int line = 0, col = 0, fail = 0;
  char msg[1024] = "";
  int has_err = first_error(out, &line, &col, msg, sizeof msg);
  StrBuf ir = {0};
  if (m) { ir_print_module(m, &ir); strip_trailing_space(&ir); }

  if (parse_only) {
    if (!ok) { fprintf(stderr, "FAIL %s: does not parse:\n%s", path, out); fail = 1; }
  } else if (update) {
    char block[1200];
    if (has_err || !m) {
      snprintf(block, sizeof block, "# EXPECT: error %d:%d %s\n", line, col, msg);
      fail = rewrite(path, &g, block);
    } else if (g.kind != EXP_OK) {
      StrBuf b = {0};
      sb_puts(&b, "# EXPECT-IR:\n");
      for (size_t i = 0; i < ir.n; ) {
        size_t j = i;
        while (j < ir.n && ir.p[j] != '\n') j++;
        sb_puts(&b, j > i ? "# " : "#");
        sb_write(&b, ir.p + i, j - i);
        sb_putc(&b, '\n');
        i = j + 1;
      }
      fail = rewrite(path, &g, b.p);
      sb_free(&b);
    }
  } else if (g.kind == EXP_NONE) {
    fprintf(stderr, "FAIL %s: no '# EXPECT:' or '# EXPECT-IR:' line (run with --update)\n", path);
    fail = 1;
  } else if (g.kind == EXP_ERROR) {
    if (!has_err) {
      fprintf(stderr, "FAIL %s: expected error %d:%d '%s', but it compiled%s\n%s", path, g.line, g.col,
              g.msg, m ? "" : " (no error message, yet no module)", out);
      fail = 1;
    } else if (line != g.line || col != g.col || !strstr(msg, g.msg)) {
      fprintf(stderr, "FAIL %s: expected first error %d:%d containing '%s'\n  got %d:%d %s\n", path,
              g.line, g.col, g.msg, line, col, msg);
      fail = 1;
    }
  } else {
    if (!m || has_err) {
      fprintf(stderr, "FAIL %s: expected success, got:\n%s", path, out);
      fail = 1;
    } else if (g.kind == EXP_IR) {
      StrBuf want = g.ir;
      strip_trailing_space(&want);
      g.ir = want;
      /* compare without trailing blank lines */
      while (ir.n && ir.p[ir.n - 1] == '\n') ir.n--;
      while (g.ir.n && g.ir.p[g.ir.n - 1] == '\n') g.ir.n--;
      if (ir.n != g.ir.n || memcmp(ir.p, g.ir.p, ir.n)) {
        fprintf(stderr, "FAIL %s: IR differs.\n--- expected\n%.*s\n--- got\n%.*s\n", path, (int)g.ir.n,
                g.ir.p, (int)ir.n, ir.p);
        fail = 1;
      }
    }
  }
  if (!fail && !update) printf("ok   %s\n", path);
  if (m) ir_module_free(m);
  sb_free(&ir);
  sb_free(&g.ir);
  free(out);
  free(g.text);
  return fail;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    if (errno == ENOTDIR) return run_one(path);
    if (errno == ENOENT) { printf("note: %s does not exist; nothing to test\n", path); return 0; }
    fprintf(stderr, "FAIL %s: %s\n", path, strerror(errno));
    return 1;
  }
  VEC(char *) files = {0};
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n > 4 && !strcmp(e->d_name + n - 4, ".mdl")) {
      char *p = ts_xmalloc(strlen(path) + n + 2);
      sprintf(p, "%s/%s", path, e->d_name);
      VEC_PUSH(files, p);
    }
  }
  closedir(d);
  if (files.n == 0) printf("note: no .mdl files in %s\n", path);
  qsort(files.a, (size_t)files.n, sizeof *files.a, cmp_str);
  int fails = 0;
  for (int i = 0; i < files.n; i++) {
    fails += run_one(files.a[i]);
    free(files.a[i]);
  }
  free(files.a);
  return fails;
}

int main(int argc, char **argv) {
  int fails = 0, npaths = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--update")) update = 1;
    else if (!strcmp(argv[i], "--parse-only")) parse_only = 1;
    else { fails += run_path(argv[i]); npaths++; }
  }
  if (!npaths) {
    fprintf(stderr, "usage: golden [--update] [--parse-only] PATH...\n");
    return 2;
  }
  if (fails) fprintf(stderr, "%d golden test(s) failed\n", fails);
  return fails ? 1 : 0;
}
