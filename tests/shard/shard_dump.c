/* shard_dump.c - compiles an MDL file through the pass pipeline with a
 * given tp / sp and prints the resulting IR (a development aid and the
 * driver of the structural sharding tests).
 *   shard_dump FILE TP SP [name=value ...] [+dim=axis ...]
 * "+heads=tp" appends a sharding rule to the module's own. */
#include "frontend/mdl.h"
#include "passes/passes.h"

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: shard_dump FILE TP SP [name=value ...]\n"); return 2; }
  MdlDefine defs[32];
  int nd = 0;
  IrRule extra[32];
  int ne = 0;
  for (int i = 4; i < argc && nd < 32; i++) {
    char *eq = strchr(argv[i], '=');
    if (!eq) continue;
    if (argv[i][0] == '+' && ne < 32) {
      *eq = 0;
      int a = ir_axis_lookup(eq + 1);
      if (a < 0) { fprintf(stderr, "unknown axis %s\n", eq + 1); return 2; }
      extra[ne++] = (IrRule){ts_intern(argv[i] + 1), (uint8_t)(1u << a)};
      continue;
    }
    *eq = 0;
    defs[nd++] = (MdlDefine){argv[i], eq + 1};
  }
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = defs;
  opt.ndefines = nd;
  opt.tp = atoi(argv[2]);
  opt.sp = atoi(argv[3]);
  IrModule *m = mdl_compile_file(argv[1], &opt);
  if (!m) return 1;
  for (int i = 0; i < ne; i++) VEC_PUSH(m->rules, extra[i]);
  PassCtx cx;
  pass_ctx_init(&cx);
  int rc = pass_run_pipeline(m, &cx);
  if (rc) fprintf(stderr, "%s\n", cx.err);
  else {
    StrBuf b = {0};
    ir_print_module(m, &b);
    fputs(b.p, stdout);
    sb_free(&b);
  }
  pass_ctx_free(&cx);
  ir_module_free(m);
  return rc ? 1 : 0;
}
