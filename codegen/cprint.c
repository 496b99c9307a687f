/* cprint.c - the kernel IR as C source (cg_kernel_c_text, cg.h): the C
 * dialect of the kernel printer (kprint.c prints the iteration's body).
 * A readable debugging aid and a cross-check of the LLVM backend
 * (tests/codegen compiles it with cc).  The parallel space is an outer
 * loop over [begin, end), the chunk cg_par_run gives a thread.  Buffers
 * are not `restrict`: an output may share memory with an input. */
#include "kprint.h"

static const CgDialect c_dialect = {
    .type = {"void", "int", "int32_t", "int64_t", "float", "double", "uint16_t", "uint16_t"},   /* in CgType's order */
    .u32 = "uint32_t", .u64 = "uint64_t", .i64_min = "INT64_MIN", .helper = "cg_", .param = "prm",
    .nan_f32 = "(float)NAN", .nan_f64 = "(double)NAN",
    .inf_f32 = "(double)INFINITY", .inf_f64 = "(double)INFINITY"};   /* a float where it is used */

/* helpers the kernels call: NaN-propagating max (the max accumulator),
 * the saturating float -> integer casts of the kernel IR, and bf16 and f16
 * to and from f32 (runtime/cpu/half.h's rounding: to nearest even, NaN kept quiet) */
static const char *const c_prelude =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "static inline double cg_maximum(double a, double b) { return a != a || b != b ? NAN : a > b ? a : b; }\n"
    "static inline int32_t cg_to_i32(double x) { return x != x ? 0 : x >= 2147483647.0 ? INT32_MAX : x <= -2147483648.0 ? INT32_MIN : (int32_t)x; }\n"
    "static inline int64_t cg_to_i64(double x) { return x != x ? 0 : x >= 9223372036854775807.0 ? INT64_MAX : x <= -9223372036854775808.0 ? INT64_MIN : (int64_t)x; }\n"
    "static inline float cg_bf16_f32(uint16_t h) { union { uint32_t u; float f; } c = {(uint32_t)h << 16}; return c.f; }\n"
    "static inline uint16_t cg_f32_bf16(float f) {\n"
    "  union { float f; uint32_t u; } c = {f};\n"
    "  return (uint16_t)((f != f ? c.u | 0x400000u : c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);\n"
    "}\n"
    "static inline float cg_f16_f32(uint16_t h) {\n"
    "  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
    "  if (e == 0) { float r = (float)m * 5.9604644775390625e-8f; return s ? -r : r; }\n"
    "  union { uint32_t u; float f; } c = {e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112u) << 23) | (m << 13)};\n"
    "  return c.f;\n"
    "}\n"
    "static inline uint16_t cg_f32_f16(float f) {\n"
    "  union { float f; uint32_t u; } c = {f}, a;\n"
    "  uint32_t ax = c.u & 0x7fffffffu;\n"
    "  uint16_t s = (uint16_t)((c.u >> 16) & 0x8000u);\n"
    "  if (ax > 0x7f800000u) return s | 0x7e00u;\n"
    "  if (ax >= 0x477ff000u) return s | 0x7c00u;\n"
    "  a.u = ax;\n"
    "  if (ax < 0x38800000u) return s | (uint16_t)rintf(a.f * 16777216.0f);\n"
    "  uint32_t m = ax - 0x38000000u;\n"
    "  return s | (uint16_t)((m + 0xfffu + ((m >> 13) & 1u)) >> 13);\n"
    "}\n";

int cg_kernel_c_text(const CgKernel *k, StrBuf *out, char *err, size_t errlen) {
  if (cg_kernel_verify(k, err, errlen) != 0) return -1;
  sb_puts(out, c_prelude);
  sb_printf(out, "\n/* grid = %lld iterations */\nvoid %s(void **bufs, int64_t begin, int64_t end) {\n", (long long)k->grid,
            k->name);
  for (int b = 0; b < k->nbuf; b++)
    sb_printf(out, "  %s%s *b%d = bufs[%d];\n", k->buf[b].written ? "" : "const ", c_dialect.type[k->buf[b].type], b, b);
  if (k->nparam)   /* the run-time scalars follow the buffers (kir.h) */
    sb_printf(out, "  const int64_t *prm = bufs[%d];\n", k->nbuf);
  sb_puts(out, "  for (int64_t gid = begin; gid < end; gid++) {\n");
  CgKp p;
  cg_kp_init(&p, k, &c_dialect);
  cg_kp_body(&p, out, 2);
  cg_kp_free(&p);
  sb_puts(out, "  }\n}\n");
  return 0;
}
