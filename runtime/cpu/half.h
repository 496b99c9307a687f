/* half.h - the 16-bit storage types (bf16, f16) to and from f32, bit for
 * bit as the LLVM kernels do it (codegen/llvm.c: bf16_to_f32 / f32_to_bf16).
 *
 * Rounding: to nearest, ties to even, from f32.  A double is rounded to f32
 * first (the one rounding that matters: every value pass precision stores
 * in 16 bits is an f32 value).  NaN stays NaN (quiet, sign kept), values
 * past the largest finite number round to infinity.  f16 subnormals are
 * kept (gradual underflow); bf16 has f32's exponent range. */
#ifndef TS_HALF_H
#define TS_HALF_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ts_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t ts_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (f != f) return (uint16_t)((u | 0x400000u) >> 16);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float ts_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) {                         /* zero or subnormal: m * 2^-24 */
    float r = (float)m * 0x1p-24f;
    return sign ? -r : r;
  }
  if (e == 31) u = sign | 0x7f800000u | (m << 13);
  else u = sign | ((e + 112u) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t ts_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
  if (ax >= 0x477ff000u) return sign | 0x7c00u;         /* >= 65520 (and inf): inf */
  if (ax < 0x38800000u) {                               /* below 2^-14: subnormal, round(|f| * 2^24) */
    float a;
    memcpy(&a, &ax, 4);
    return sign | (uint16_t)lrintf(a * 16777216.0f);    /* exact product; lrintf rounds to even */
  }
  uint32_t m = ax - 0x38000000u;                        /* exponent 127 -> 15 bias */
  m += 0xfffu + ((m >> 13) & 1u);
  return sign | (uint16_t)(m >> 13);
}
#endif
