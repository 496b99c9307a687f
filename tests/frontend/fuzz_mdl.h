/* fuzz_mdl.h - what the MDL fuzz targets (fuzz_mdl.c, fuzz_passes.c)
 * share: options that send diagnostics to /dev/null and find the stdlib
 * of the source tree, and the input turned into a C string (cut at its
 * first NUL byte, as mdl_compile_string takes one; NUL bytes in files are
 * the driver's check, errors/nul_byte.mdl). */
#ifndef TS_TESTS_FUZZ_MDL_H
#define TS_TESTS_FUZZ_MDL_H
#include "frontend/mdl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_mdl_options(MdlOptions *opt) {
  static FILE *devnull;
  if (!devnull) devnull = fopen("/dev/null", "w");
  mdl_options_init(opt);
  opt->diag = devnull;
  opt->stdlib_dir = TS_SOURCE_DIR "/stdlib";
}

/* The module the bytes elaborate to under opt, or NULL (refused). */
static IrModule *fuzz_mdl_compile(const uint8_t *data, size_t size, const MdlOptions *opt) {
  char *src = malloc(size + 1);
  if (!src) return NULL;
  memcpy(src, data, size);
  src[size] = 0;
  IrModule *m = mdl_compile_string(src, "<fuzz>", opt);
  free(src);
  return m;
}
#endif
