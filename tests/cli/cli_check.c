/* cli_check.c - checks files that mcc wrote, for tests/cli/cli_test.sh:
 *
 *   cli_check ir FILE...        each IR text parses, verifies and re-prints
 *                               byte for byte (the IR round-trip acceptance
 *                               test, run on mcc's per-pass dumps)
 *   cli_check plan FILE...      each plan (binary or text) loads, and
 *                               re-encodes (binary) / re-prints (text) to
 *                               exactly the file's bytes
 *   cli_check same-plan A B     A and B (e.g. binary and text) hold the same
 *                               plan: identical binary encodings
 * Exit 0 if all hold; 1 with a message naming the file otherwise. */
#include "ir/ir.h"
#include "plan/plan.h"

static int check_ir(const char *path) {
  size_t n = 0;
  char *text = ts_read_file(path, &n);
  if (!text) { fprintf(stderr, "cli_check: cannot read '%s'\n", path); return 1; }
  char err[1024];
  IrModule *m = ir_parse_module(text, path, err, sizeof err);
  int rc = 1;
  if (!m) {
    fprintf(stderr, "cli_check: %s does not parse: %s\n", path, err);
  } else if (ir_verify(m, err, sizeof err) != 0) {
    fprintf(stderr, "cli_check: %s does not verify: %s\n", path, err);
  } else {
    StrBuf b = {0};
    ir_print_module(m, &b);
    if (b.n != n || memcmp(b.p, text, n) != 0) {
      size_t i = 0, line = 1;
      while (i < n && i < b.n && b.p[i] == text[i]) line += text[i++] == '\n';
      fprintf(stderr, "cli_check: %s does not re-print identically (first difference on line %zu)\n", path, line);
    } else {
      rc = 0;
    }
    sb_free(&b);
  }
  ir_module_free(m);
  free(text);
  return rc;
}

static int check_plan(const char *path) {
  size_t n = 0;
  char *bytes = ts_read_file(path, &n);
  if (!bytes) { fprintf(stderr, "cli_check: cannot read '%s'\n", path); return 1; }
  char err[1024];
  Plan *p = plan_read(path, err, sizeof err);
  int rc = 1;
  if (!p) {
    fprintf(stderr, "cli_check: %s\n", err);
  } else {
    StrBuf b = {0};
    if (n >= 12 && memcmp(bytes, "tessera-plan", 12) == 0) plan_print_text(p, &b);
    else plan_encode(p, &b);
    if (b.n != n || memcmp(b.p, bytes, n) != 0) fprintf(stderr, "cli_check: %s does not re-encode identically\n", path);
    else if (p->nprograms < 1 || p->nranks < 1) fprintf(stderr, "cli_check: %s has no programs or ranks\n", path);
    else rc = 0;
    sb_free(&b);
  }
  plan_free(p);
  free(bytes);
  return rc;
}

static int same_plan(const char *a, const char *b) {
  char err[1024];
  Plan *pa = plan_read(a, err, sizeof err);
  if (!pa) { fprintf(stderr, "cli_check: %s\n", err); return 1; }
  Plan *pb = plan_read(b, err, sizeof err);
  if (!pb) { fprintf(stderr, "cli_check: %s\n", err); plan_free(pa); return 1; }
  StrBuf ea = {0}, eb = {0};
  plan_encode(pa, &ea);
  plan_encode(pb, &eb);
  int rc = ea.n == eb.n && memcmp(ea.p, eb.p, ea.n) == 0 ? 0 : 1;
  if (rc) fprintf(stderr, "cli_check: %s and %s hold different plans\n", a, b);
  sb_free(&ea);
  sb_free(&eb);
  plan_free(pa);
  plan_free(pb);
  return rc;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "ir") == 0) {
    int rc = 0;
    for (int i = 2; i < argc; i++) rc |= check_ir(argv[i]);
    return rc;
  }
  if (argc >= 3 && strcmp(argv[1], "plan") == 0) {
    int rc = 0;
    for (int i = 2; i < argc; i++) rc |= check_plan(argv[i]);
    return rc;
  }
  if (argc == 4 && strcmp(argv[1], "same-plan") == 0) return same_plan(argv[2], argv[3]);
  fprintf(stderr, "usage: cli_check ir FILE... | plan FILE... | same-plan A B\n");
  return 2;
}
