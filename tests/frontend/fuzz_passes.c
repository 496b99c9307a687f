/* fuzz_passes.c - libFuzzer target for MDL through the whole pass
 * pipeline: any bytes go through mdl_compile_string and, when that gives
 * a module of at most FUZZ_MAX_NODES forward nodes, pass_run_pipeline
 * (autodiff, sharding, pipeline, remat, optimizer, fusion, with the
 * verifier after every pass) at a layout picked from the input's length:
 * one rank, tp 2, tp 2 + sp, or pp 2.  A pass may refuse the model (a
 * message); an "internal error" from a pass or the verifier is a compiler
 * bug and aborts, as do crashes, hangs (-timeout), leaks and sanitizer
 * reports.  Built with clang's -fsanitize=fuzzer,address,undefined
 * (ts_fuzz_target, tests/fuzz.cmake). */
#include "fuzz_mdl.h"
#include "passes/passes.h"

#define FUZZ_MAX_NODES 3000   /* keeps an execution in milliseconds */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  MdlOptions opt;
  fuzz_mdl_options(&opt);
  switch (size % 4) {   /* the layout: any mutation may change it */
  case 1: opt.tp = 2; break;
  case 2: opt.tp = 2; opt.sp = 1; break;
  case 3: opt.pp = 2; break;
  default: break;
  }
  IrModule *m = fuzz_mdl_compile(data, size, &opt);
  if (!m) return 0;
  int fwd = ir_block_find(m, "forward");
  if (fwd >= 0 && m->blocks.a[fwd].n <= FUZZ_MAX_NODES) {
    PassCtx cx;
    pass_ctx_init(&cx);
    if (pass_run_pipeline(m, &cx) != 0 && strstr(cx.err, "internal error")) {
      fprintf(stderr, "fuzz_passes: %s\n", cx.err);
      abort();
    }
  }
  ir_module_free(m);
  return 0;
}
