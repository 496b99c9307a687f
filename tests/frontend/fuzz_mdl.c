/* fuzz_mdl.c - libFuzzer target for the whole frontend: any bytes go
 * through mdl_compile_string (lexer, parser, imports of the stdlib,
 * elaboration) with diagnostics thrown away.  Built with clang's
 * -fsanitize=fuzzer,address,undefined (ts_fuzz_target, tests/fuzz.cmake);
 * a crash, a hang (-timeout) or a leak fails the run. */
#include "fuzz_mdl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  MdlOptions opt;
  fuzz_mdl_options(&opt);
  IrModule *m = fuzz_mdl_compile(data, size, &opt);
  if (m) ir_module_free(m);
  return 0;
}
