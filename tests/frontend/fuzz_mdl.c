/* fuzz_mdl.c - libFuzzer target for the whole frontend: any bytes go
 * through mdl_compile_string (lexer, parser, imports of the stdlib,
 * elaboration) with diagnostics thrown away.  Built with clang's
 * -fsanitize=fuzzer,address,undefined by tests/frontend/CMakeLists.txt;
 * a crash, a hang (-timeout) or a leak fails the run.
 *
 * The input is cut at its first NUL byte, as mdl_compile_string takes a C
 * string; NUL bytes in files are the driver's check (errors/nul_byte.mdl). */
#include "frontend/mdl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static FILE *devnull;
  if (!devnull) devnull = fopen("/dev/null", "w");
  char *src = malloc(size + 1);
  if (!src) return 0;
  memcpy(src, data, size);
  src[size] = 0;
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.diag = devnull;
  opt.stdlib_dir = TS_SOURCE_DIR "/stdlib";
  IrModule *m = mdl_compile_string(src, "<fuzz>", &opt);
  if (m) ir_module_free(m);
  free(src);
  return 0;
}
