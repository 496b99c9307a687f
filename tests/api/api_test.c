/* api_test.c - the C API (include/tessera.h) in the build tree, linked
 * against libtessera.so and including nothing else of the project:
 *   api_test SAMPLE.mdl MCC_PLAN TMPDIR
 * SAMPLE is samples/gpt.mdl; MCC_PLAN the plan the build's mcc wrote for
 * it with the options below (tests/api/CMakeLists.txt), which the API's
 * plan must equal byte for byte.  Checks: options by mcc's names and
 * values (and their refusals, as text with a status), compile from a file
 * and from a string, a compile error's file:line:col and caret, the plan
 * as bytes and written atomically, reports and IR dumps as strings, calls
 * out of order, two sessions on two threads, and that the library wrote
 * nothing to stdout or stderr meanwhile.  Everything is freed (the ASan
 * build checks for leaks). */
#include "tessera.h"
#include "../check.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *sample;
static const char *const tiny[][2] = {{"D", "layers=1"}, {"D", "d_model=16"}, {"D", "heads=2"}, {"D", "seq_len=8"},
                                      {"D", "vocab=256"},  {"D", "batch=2"},    {"D", "micro_batch=1"}, {"tp", "2"}};

static char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *p = malloc((size_t)len + 1);
  *n = fread(p, 1, (size_t)len, f);
  p[*n] = 0;
  fclose(f);
  return p;
}

static TsSession *tiny_session(void) {
  TsSession *s = ts_session_new();
  for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++)
    CHECK(ts_session_set(s, tiny[i][0], tiny[i][1]) == TS_OK, "%s %s: %s", tiny[i][0], tiny[i][1], ts_session_errors(s));
  return s;
}

static void *thread_compile(void *arg) {
  TsSession *s = tiny_session();
  TsStatus st = ts_session_compile_file(s, sample);
  const void *p = NULL;
  size_t n = 0;
  if (st == TS_OK) st = ts_session_plan(s, &p, &n);
  char *copy = st == TS_OK ? malloc(n + sizeof(size_t)) : NULL;
  if (copy) {
    memcpy(copy, &n, sizeof n);
    memcpy(copy + sizeof n, p, n);
  }
  ts_session_free(s);
  (void)arg;
  return copy;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: api_test SAMPLE.mdl MCC_PLAN TMPDIR\n");
    return 2;
  }
  sample = argv[1];
  const char *dir = argv[3];
  char out_path[4096], plan_path[4096];
  snprintf(out_path, sizeof out_path, "%s/stdio.txt", dir);
  snprintf(plan_path, sizeof plan_path, "%s/api.plan", dir);
  mkdir(dir, 0777);

  /* the version: the header's and the library's agree */
  CHECK(ts_version() == TESSERA_VERSION_NUMBER, "library %u, header %u", ts_version(), (unsigned)TESSERA_VERSION_NUMBER);
  CHECK(strcmp(ts_version_string(), TESSERA_VERSION_STRING) == 0, "%s", ts_version_string());
  CHECK(ts_plan_format() > 0);

  /* everything the library does below with stdout and stderr pointed at a file, which must stay empty */
  fflush(stdout);
  fflush(stderr);
  int o1 = dup(1), o2 = dup(2);
  FILE *cap = fopen(out_path, "w");
  dup2(fileno(cap), 1);
  dup2(fileno(cap), 2);

  TsSession *s = tiny_session();
  /* out of order: nothing compiled yet */
  const char *text = NULL;
  TsStatus st_plan0 = ts_session_report(s, "memory", &text);
  int plan0_msg = strstr(ts_session_errors(s), "no compiled model") != NULL;
  /* options refused with what would work */
  TsStatus st_bad[8];
  char msg_bad[8][512];
  const char *bad[8][2] = {{"tp", "0"}, {"precision", "f8"}, {"nosuch", NULL}, {"sp", "1"},
                           {"check", NULL}, {"zero", "2"}, {"tp", NULL}, {"precision-policy", "help"}};
  for (int i = 0; i < 8; i++) {
    st_bad[i] = ts_session_set(s, bad[i][0], bad[i][1]);
    snprintf(msg_bad[i], sizeof msg_bad[i], "%s", ts_session_errors(s));
  }
  TsStatus st_compile = ts_session_compile_file(s, sample);
  char compile_errs[1024];
  snprintf(compile_errs, sizeof compile_errs, "%s", ts_session_errors(s));
  const void *plan = NULL;
  size_t plan_n = 0;
  TsStatus st_plan = ts_session_plan(s, &plan, &plan_n);
  char *plan_copy = malloc(plan_n + 1);
  if (plan) memcpy(plan_copy, plan, plan_n);
  TsStatus st_write = ts_session_write_plan(s, plan_path);
  TsStatus st_write_dir = ts_session_write_plan(s, dir);   /* a directory: refused, nothing replaced */
  char write_dir_msg[1024];
  snprintf(write_dir_msg, sizeof write_dir_msg, "%s", ts_session_errors(s));
  char *reports[4] = {0};
  const char *kinds[4] = {"memory", "comm", "sharding", "schedule"};
  TsStatus st_rep[4];
  for (int i = 0; i < 4; i++) {
    st_rep[i] = ts_session_report(s, kinds[i], &text);
    reports[i] = text ? strdup(text) : NULL;
  }
  TsStatus st_time = ts_session_report(s, "time", &text);
  char time_msg[512];
  snprintf(time_msg, sizeof time_msg, "%s", ts_session_errors(s));
  TsStatus st_kernels = ts_session_report(s, "kernels", &text);
  TsStatus st_ir = ts_session_ir(s, NULL, &text);
  char *ir_final = text ? strdup(text) : NULL;
  TsStatus st_ir_missing = ts_session_ir(s, "shard", &text);
  TsStatus st_ir_bad = ts_session_ir(s, "nosuch", &text);
  /* the IR after one pass, kept by print-ir-after; the time report with hw */
  TsStatus st_after_set = ts_session_set(s, "print-ir-after", "shard");
  TsStatus st_hw = ts_session_set(s, "hw", "h100-sxm");
  TsStatus st_compile2 = ts_session_compile_file(s, sample);
  TsStatus st_after = ts_session_ir(s, "shard", &text);
  char *ir_after = text ? strdup(text) : NULL;
  TsStatus st_time2 = ts_session_report(s, "time", &text);
  char *time_rep = text ? strdup(text) : NULL;
  ts_session_free(s);

  /* a broken model from a string: the diagnostic as mcc prints it, and we are still here */
  s = tiny_session();
  TsStatus st_broken = ts_session_compile_string(s, "broken.mdl",
                                                 "import nn\nmodel m(x: f32[4]) {\n  return x +* 2\n}\n");
  char broken_msg[2048];
  snprintf(broken_msg, sizeof broken_msg, "%s", ts_session_errors(s));
  TsStatus st_after_broken = ts_session_plan(s, &plan, &plan_n);
  TsStatus st_missing = ts_session_compile_file(s, "/nonexistent/model.mdl");
  char missing_msg[512];
  snprintf(missing_msg, sizeof missing_msg, "%s", ts_session_errors(s));
  ts_session_free(s);

  /* the same options by other spellings mcc takes: Megatron's name, dashes, name=value */
  s = ts_session_new();
  const char *alt[][2] = {{"-D", "layers=1"}, {"D=d_model=16"}, {"-D", "heads=2"}, {"D", "seq_len=8"}, {"D", "vocab=256"},
                          {"D", "batch=2"}, {"D", "micro_batch=1"}, {"tensor-model-parallel-size=2"}};
  int alt_ok = 1;
  for (size_t i = 0; i < sizeof alt / sizeof alt[0]; i++) alt_ok &= ts_session_set(s, alt[i][0], alt[i][1]) == TS_OK;
  const void *alt_plan = NULL;
  size_t alt_n = 0;
  alt_ok &= ts_session_compile_file(s, sample) == TS_OK && ts_session_plan(s, &alt_plan, &alt_n) == TS_OK;
  char *alt_copy = alt_ok ? malloc(alt_n) : NULL;
  if (alt_copy) memcpy(alt_copy, alt_plan, alt_n);
  ts_session_free(s);

  /* options that do not go together: refused at the compile, as mcc refuses them */
  s = ts_session_new();
  TsStatus st_rc = ts_session_set(s, "recompute", "auto");
  TsStatus st_conflict = ts_session_compile_file(s, sample);
  char conflict_msg[512];
  snprintf(conflict_msg, sizeof conflict_msg, "%s", ts_session_errors(s));
  ts_session_free(s);

  /* two sessions on two threads: the same plan as the first one */
  pthread_t th[2];
  char *tp[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, thread_compile, NULL);
  for (int i = 0; i < 2; i++) pthread_join(th[i], (void **)&tp[i]);

  fflush(stdout);
  fflush(stderr);
  dup2(o1, 1);
  dup2(o2, 2);
  close(o1);
  close(o2);
  fclose(cap);

  size_t nout = 0;
  char *out = read_all(out_path, &nout);
  CHECK(out && nout == 0, "the library wrote %zu bytes to stdout/stderr: %.400s", nout, out ? out : "");
  free(out);

  CHECK(st_plan0 == TS_ERR_STATE && plan0_msg, "a report before compiling: %s", ts_status_name(st_plan0));
  const char *want[8] = {"expected a positive size, got '0'", "--precision must be f32, f64, bf16 or fp16, got 'f8'",
                         "unknown option 'nosuch'", "option '--sp' takes no value", "option '--check' is mcc's own",
                         "--zero 2 is not built", "option '--tp' needs an argument", "op classes"};
  for (int i = 0; i < 8; i++) {
    CHECK(st_bad[i] == TS_ERR_OPTION, "%s=%s: %s", bad[i][0], bad[i][1] ? bad[i][1] : "NULL", ts_status_name(st_bad[i]));
    CHECK(strstr(msg_bad[i], want[i]) != NULL, "%s: want '%s' in: %s", bad[i][0], want[i], msg_bad[i]);
    CHECK(strncmp(msg_bad[i], "tessera: ", 9) == 0, "%s", msg_bad[i]);
  }
  CHECK(st_compile == TS_OK, "compile: %s: %s", ts_status_name(st_compile), compile_errs);
  CHECK(st_plan == TS_OK && plan_n > 64, "plan: %s, %zu bytes", ts_status_name(st_plan), plan_n);
  size_t mcc_n = 0, file_n = 0;
  char *mcc_plan = read_all(argv[2], &mcc_n), *file_plan = read_all(plan_path, &file_n);
  CHECK(mcc_plan && mcc_n == plan_n && memcmp(mcc_plan, plan_copy, plan_n) == 0,
        "the API's plan (%zu bytes) is not mcc's (%s, %zu bytes)", plan_n, argv[2], mcc_n);
  CHECK(st_write == TS_OK && file_plan && file_n == plan_n && memcmp(file_plan, plan_copy, plan_n) == 0,
        "the written plan (%s, %zu bytes) is not the plan's bytes (%zu)", ts_status_name(st_write), file_n, plan_n);
  CHECK(st_write_dir == TS_ERR_IO && strstr(write_dir_msg, dir), "writing over a directory: %s: %s",
        ts_status_name(st_write_dir), write_dir_msg);
  const char *rep_want[4] = {"per rank", "all_reduce", "all_reduce over tp", "pipeline"};
  for (int i = 0; i < 4; i++) {
    CHECK(st_rep[i] == TS_OK || (i == 3 && st_rep[i] == TS_ERR_COMPILE), "report %s: %s", kinds[i], ts_status_name(st_rep[i]));
    if (i < 3) CHECK(reports[i] && strstr(reports[i], rep_want[i]), "report %s: %.300s", kinds[i], reports[i] ? reports[i] : "");
    free(reports[i]);
  }
  CHECK(st_time == TS_ERR_OPTION && strstr(time_msg, "needs the option hw"), "time without hw: %s", time_msg);
  CHECK(st_kernels == TS_ERR_OPTION);
  CHECK(st_ir == TS_OK && ir_final && strstr(ir_final, "block micro"), "final IR: %.200s", ir_final ? ir_final : "");
  CHECK(st_ir_missing == TS_ERR_STATE && st_ir_bad == TS_ERR_OPTION);
  CHECK(st_after_set == TS_OK && st_hw == TS_OK && st_compile2 == TS_OK);
  CHECK(st_after == TS_OK && ir_after && strncmp(ir_after, "# IR after pass 'shard'", 23) == 0, "%.100s",
        ir_after ? ir_after : "");
  CHECK(st_time2 == TS_OK && time_rep && strstr(time_rep, "step_time_s="), "%.300s", time_rep ? time_rep : "");
  free(ir_final);
  free(ir_after);
  free(time_rep);
  CHECK(st_broken == TS_ERR_COMPILE, "%s", ts_status_name(st_broken));
  CHECK(strstr(broken_msg, "broken.mdl:3:") && strstr(broken_msg, "error:") && strstr(broken_msg, "^"),
        "no file:line:col diagnostic with a caret: %s", broken_msg);
  CHECK(st_after_broken == TS_ERR_STATE, "a plan after a failed compile: %s", ts_status_name(st_after_broken));
  CHECK(st_missing == TS_ERR_IO && strstr(missing_msg, "/nonexistent/model.mdl"), "%s", missing_msg);
  CHECK(st_rc == TS_OK && st_conflict == TS_ERR_OPTION && strstr(conflict_msg, "--recompute auto needs --memory-budget"),
        "%s", conflict_msg);
  for (int i = 0; i < 2; i++) {
    size_t n = 0;
    if (tp[i]) memcpy(&n, tp[i], sizeof n);
    CHECK(tp[i] && n == plan_n && memcmp(tp[i] + sizeof n, plan_copy, n) == 0, "thread %d's plan differs", i);
    free(tp[i]);
  }
  CHECK(alt_copy && alt_n == plan_n && memcmp(alt_copy, plan_copy, plan_n) == 0,
        "Megatron's --tensor-model-parallel-size=2 and the -D spellings do not give the --tp 2 plan");
  free(alt_copy);
  free(plan_copy);
  free(mcc_plan);
  free(file_plan);
  printf("api_test: the API's plan %zu bytes, %d checks\n", plan_n, check_count);
  return check_exit("api_test");
}
