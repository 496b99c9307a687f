/* fuzz_plan.c - libFuzzer target for the plan loader, both forms:
 *   first byte 0: the rest is a binary plan's PAYLOAD; the target puts a
 *     valid header on it (magic, version, length, and the checksum of the
 *     payload), so the fuzzer gets past the checksum to the decoder;
 *   otherwise: the input is a plan's text form (mcc --emit=plan-text).
 * A plan the loader accepts must encode and decode to the same bytes, and
 * print and parse to the same text (the formats' round-trip promise,
 * plan/plan.h); abort otherwise.  Built with clang's
 * -fsanitize=fuzzer,address,undefined by tests/plan/CMakeLists.txt; a
 * crash, a hang (-timeout), a leak or a broken round trip fails the run. */
#include "plan/plan.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put64(unsigned char *q, uint64_t v) {
  for (int i = 0; i < 8; i++) q[i] = (unsigned char)(v >> (8 * i));
}

/* p must encode -> decode -> encode to the same bytes, and print -> parse
 * -> print to the same text */
static void round_trip(const Plan *p) {
  char err[1024];
  StrBuf a = {0}, b = {0};
  plan_encode(p, &a);
  Plan *q = plan_decode(a.p, a.n, err, sizeof err);
  if (!q) { fprintf(stderr, "fuzz_plan: an accepted plan's encoding is refused: %s\n", err); abort(); }
  plan_encode(q, &b);
  if (a.n != b.n || memcmp(a.p, b.p, a.n) != 0) { fprintf(stderr, "fuzz_plan: encode -> decode -> encode differs\n"); abort(); }
  plan_free(q);
  a.n = b.n = 0;
  plan_print_text(p, &a);
  q = plan_parse_text(a.p ? a.p : "", "<printed>", err, sizeof err);
  if (!q) { fprintf(stderr, "fuzz_plan: an accepted plan's text is refused: %s\n", err); abort(); }
  plan_print_text(q, &b);
  if (a.n != b.n || memcmp(a.p, b.p, a.n) != 0) { fprintf(stderr, "fuzz_plan: print -> parse -> print differs\n"); abort(); }
  plan_free(q);
  sb_free(&a);
  sb_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[1024];
  Plan *p = NULL;
  if (size >= 1 && data[0] == 0) {
    size_t n = size - 1, len = 32 + n;
    unsigned char *buf = malloc(len);
    if (!buf) return 0;
    memcpy(buf, "TSPLAN\0\0", 8);
    uint32_t version = PLAN_VERSION;
    for (int i = 0; i < 4; i++) buf[8 + i] = (unsigned char)(version >> (8 * i));
    memset(buf + 12, 0, 4);
    put64(buf + 16, n);
    memcpy(buf + 32, data + 1, n);
    put64(buf + 24, ts_hash64(buf + 32, n, 0));
    p = plan_decode(buf, len, err, sizeof err);
    free(buf);
  } else {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    p = plan_parse_text(text, "<fuzz>", err, sizeof err);
    free(text);
  }
  if (p) round_trip(p);
  plan_free(p);
  return 0;
}
