/* diag.c - user-facing diagnostics of the frontend (CONVENTIONS §7):
 *
 *   file:line:col: error: message
 *       the source line
 *       ^
 *
 * The source text of every file is registered once (mdl_diag_add_source)
 * so that errors in imported files show their own lines.  A location with
 * line 0 has no position: "file: error: message" (or "mcc: error: ..."
 * without a file; the C API's "tessera: error: ...": MdlOptions.prog).  The diag only counts and prints; stages decide when to
 * stop (at the end of the stage that found errors). */
#include <stdarg.h>
#include "frontend/ast.h"

void mdl_diag_init(MdlDiag *d, FILE *out) {
  memset(d, 0, sizeof *d);
  d->out = out;
}

void mdl_diag_free(MdlDiag *d) {
  free(d->sources.a);
  memset(d, 0, sizeof *d);
}

void mdl_diag_add_source(MdlDiag *d, const char *file, const char *src) {
  file = ts_intern(file);
  for (int i = 0; i < d->sources.n; i++)
    if (d->sources.a[i].file == file) { d->sources.a[i].src = src; return; }
  /* VEC_PUSH needs an lvalue of the element type: build it in place. */
  if (d->sources.n == d->sources.cap) {
    d->sources.cap = d->sources.cap ? 2 * d->sources.cap : 8;
    d->sources.a = ts_xrealloc(d->sources.a, (size_t)d->sources.cap * sizeof *d->sources.a);
  }
  d->sources.a[d->sources.n].file = file;
  d->sources.a[d->sources.n].src = src;
  d->sources.n++;
}

static const char *find_source(const MdlDiag *d, const char *file) {
  if (!file) return NULL;
  for (int i = 0; i < d->sources.n; i++)
    if (d->sources.a[i].file == file || !strcmp(d->sources.a[i].file, file)) return d->sources.a[i].src;
  return NULL;
}

/* Prints line `line` of src and a caret under column col.  Long lines are
 * shown as a window around the column so the caret stays on screen. */
enum { DIAG_WIDTH = 120 };
static void show_line(FILE *out, const char *src, int line, int col) {
  const char *p = src;
  for (int l = 1; l < line && *p; p++)
    if (*p == '\n') l++;
  if (line < 1) return;
  if (line == 1 && !strncmp(p, "\xEF\xBB\xBF", 3)) p += 3;   /* the lexer skips a BOM too */
  const char *end = strchr(p, '\n');
  size_t len = end ? (size_t)(end - p) : strlen(p);
  if (len == 0 && !*p && line > 1 && col <= 1) return;   /* end of file on an empty last line */
  size_t c = col > 0 ? (size_t)col - 1 : 0;
  if (c > len) c = len;
  size_t from = 0;
  if (len > DIAG_WIDTH && c > DIAG_WIDTH / 2) from = c - DIAG_WIDTH / 2;
  size_t to = from + DIAG_WIDTH < len ? from + DIAG_WIDTH : len;
  fputs("    ", out);
  if (from > 0) fputs("...", out);
  for (size_t i = from; i < to; i++) {
    unsigned char ch = (unsigned char)p[i];
    fputc(ch == '\t' || (ch >= 32 && ch != 127) ? ch : ' ', out);   /* no control bytes on the terminal */
  }
  if (to < len) fputs("...", out);
  fputs("\n    ", out);
  if (from > 0) fputs("   ", out);
  for (size_t i = from; i < c; i++) fputc(p[i] == '\t' ? '\t' : ' ', out);   /* tabs keep the caret aligned */
  fputs("^\n", out);
}

static void report(MdlDiag *d, MdlLoc loc, const char *kind, const char *fmt, va_list ap) {
  FILE *out = d->out ? d->out : stderr;
  if (loc.file && loc.line > 0) fprintf(out, "%s:%d:%d: %s: ", loc.file, loc.line, loc.col, kind);
  else fprintf(out, "%s: %s: ", loc.file ? loc.file : d->prog ? d->prog : "mcc", kind);
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  const char *src = loc.line > 0 ? find_source(d, loc.file) : NULL;
  if (src) show_line(out, src, loc.line, loc.col);
}

void mdl_error(MdlDiag *d, MdlLoc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(d, loc, "error", fmt, ap);
  va_end(ap);
  d->nerrors++;
}

void mdl_note(MdlDiag *d, MdlLoc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(d, loc, "note", fmt, ap);
  va_end(ap);
}
