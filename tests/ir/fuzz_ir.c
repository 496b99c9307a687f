/* fuzz_ir.c - libFuzzer target for the IR text reader: any bytes go
 * through ir_parse_module; a module it accepts goes through ir_verify and
 * ir_verify_training, and one the verifier accepts must print, parse back
 * and print again to the same text (the IR's round-trip promise,
 * docs/ir.md).  Built with clang's -fsanitize=fuzzer,address,undefined by
 * tests/ir/CMakeLists.txt; a crash, a hang (-timeout), a leak or a broken
 * round trip (abort) fails the run.  The input is cut at its first NUL
 * byte (the reader takes a C string; files with NUL bytes are refused
 * before it by the plan loader). */
#include "ir/ir.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *src = malloc(size + 1);
  if (!src) return 0;
  memcpy(src, data, size);
  src[size] = 0;
  char err[1024];
  IrModule *m = ir_parse_module(src, "<fuzz>", err, sizeof err);
  free(src);
  if (!m) return 0;
  if (ir_verify(m, err, sizeof err) == 0) {
    (void)ir_verify_training(m, err, sizeof err);
    StrBuf a = {0}, b = {0};
    ir_print_module(m, &a);
    IrModule *m2 = ir_parse_module(a.p ? a.p : "", "<printed>", err, sizeof err);
    if (!m2) {
      fprintf(stderr, "fuzz_ir: the printed module does not parse back: %s\n", err);
      abort();
    }
    ir_print_module(m2, &b);
    if (a.n != b.n || memcmp(a.p, b.p, a.n) != 0) {
      fprintf(stderr, "fuzz_ir: print -> parse -> print differs\n");
      abort();
    }
    ir_module_free(m2);
    sb_free(&a);
    sb_free(&b);
  }
  ir_module_free(m);
  return 0;
}
