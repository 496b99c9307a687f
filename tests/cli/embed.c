/* embed.c - an embedder of the installed library (tests/cli/install_test.sh
 * builds it with `cc embed.c $(pkg-config --cflags --libs tessera)` against
 * the installed tessera.pc, and runs it from another directory):
 *   embed SAMPLE.mdl OUT.plan [PROBE.mdl]
 * 1. compiles SAMPLE with mcc's options "-D ... --tp 2" given by name and
 *    writes its plan to OUT.plan (the script compares it with the installed
 *    mcc's, byte for byte);
 * 2. compiles a broken model from a string: a non-zero status, the
 *    file:line:col diagnostic with its caret as a string, and this process
 *    goes on;
 * 3. sets a bad option value: a non-zero status and the message;
 * 4. with PROBE: compiles it (it uses a layer only the installed stdlib has:
 *    the library finds the stdlib beside itself).
 * Prints one "ok:" line per step; exits 1 at the first that fails. */
#include <tessera.h>
#include <stdio.h>
#include <string.h>

static int fail(TsSession *s, const char *what, TsStatus st) {
  fprintf(stderr, "embed: FAIL: %s (status %s):\n%s", what, ts_status_name(st), ts_session_errors(s));
  ts_session_free(s);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: embed SAMPLE.mdl OUT.plan [PROBE.mdl]\n");
    return 2;
  }
  if (ts_version() != TESSERA_VERSION_NUMBER) {
    fprintf(stderr, "embed: FAIL: library %s, header %s\n", ts_version_string(), TESSERA_VERSION_STRING);
    return 1;
  }
  static const char *const opts[][2] = {{"D", "layers=1"}, {"D", "d_model=16"}, {"D", "heads=2"},
                                        {"D", "seq_len=8"}, {"D", "vocab=256"},  {"D", "batch=2"},
                                        {"D", "micro_batch=1"}, {"tp", "2"}};
  TsSession *s = ts_session_new();
  TsStatus st;
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    if ((st = ts_session_set(s, opts[i][0], opts[i][1])) != TS_OK) return fail(s, "an option", st);
  if ((st = ts_session_compile_file(s, argv[1])) != TS_OK) return fail(s, "compiling the sample", st);
  if ((st = ts_session_write_plan(s, argv[2])) != TS_OK) return fail(s, "writing the plan", st);
  printf("ok: libtessera %s compiled %s at tp 2 into %s\n", ts_version_string(), argv[1], argv[2]);

  st = ts_session_compile_string(s, "broken.mdl", "model m(x: f32[4]) {\n  return x +* 2\n}\n");
  const char *e = ts_session_errors(s);
  if (st == TS_OK || !strstr(e, "broken.mdl:2:") || !strstr(e, "^")) return fail(s, "the broken model's diagnostic", st);
  printf("ok: a broken model gives status %s and the diagnostic:\n%s", ts_status_name(st), e);

  st = ts_session_set(s, "tp", "two");
  e = ts_session_errors(s);
  if (st != TS_ERR_OPTION || !strstr(e, "expected a positive size, got 'two'")) return fail(s, "the bad option's message", st);
  printf("ok: a bad option value gives status %s: %s", ts_status_name(st), e);
  ts_session_free(s);

  if (argc > 3) {
    s = ts_session_new();
    for (size_t i = 0; i + 1 < sizeof opts / sizeof opts[0]; i++) ts_session_set(s, opts[i][0], opts[i][1]);
    if ((st = ts_session_compile_file(s, argv[3])) != TS_OK) return fail(s, "the probe (the installed stdlib)", st);
    printf("ok: the library reads the installed stdlib (%s compiles)\n", argv[3]);
    ts_session_free(s);
  }
  return 0;
}
