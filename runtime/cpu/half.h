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
/* ---- fp8 (--fp8, docs/precision.md "FP8") ----
 * E4M3 "fn" (bias 7, 3 mantissa bits, no infinity: exponent 15 is a
 * normal binade except S.1111.111 = NaN; max 448) and E5M2 (bias 15, 2
 * mantissa bits, IEEE: exponent 31 is inf (mantissa 0) or NaN; max 57344).
 * Encoding is what Transformer Engine's cast does (__NV_SATFINITE): round
 * to nearest, ties to even; anything of magnitude >= the largest finite
 * value, infinity included, saturates to it; NaN stays NaN (sign kept);
 * subnormals kept.  Decoding is exact in f32. */
static inline float ts_f8_to_f32(uint8_t c, int mbits, int bias) {
  int ebits = 7 - mbits;
  uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> mbits) & ((1u << ebits) - 1u), m = c & ((1u << mbits) - 1u);
  if (e == 0) {   /* subnormal: m * 2^(1 - bias - mbits), exact */
    float r = ldexpf((float)m, 1 - bias - mbits);
    return sign ? -r : r;
  }
  uint32_t u;
  if (ebits == 4 && e == 15 && m == 7) u = sign | 0x7fc00000u;                        /* E4M3 NaN */
  else if (ebits == 5 && e == 31) u = sign | (m ? 0x7fc00000u | (m << 21) : 0x7f800000u);   /* E5M2 inf, NaN */
  else u = sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits));
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* maxbits: the f32 bits of the largest finite value; maxcode, nancode. */
static inline uint8_t ts_f32_to_f8(float f, int mbits, int bias, uint32_t maxbits, uint8_t maxcode, uint8_t nancode) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | nancode;
  if (ax >= maxbits) return sign | maxcode;              /* saturate (inf included) */
  if ((int)(ax >> 23) - 127 < 1 - bias) {                /* below the smallest normal: round(|f| * 2^(bias - 1 + mbits)) */
    float a;
    memcpy(&a, &ax, 4);
    return sign | (uint8_t)lrintf(ldexpf(a, bias - 1 + mbits));   /* exact product; lrintf rounds to even */
  }
  uint32_t r = ax - ((uint32_t)(127 - bias) << 23), sh = 23u - (uint32_t)mbits;
  r += (1u << (sh - 1)) - 1u + ((r >> sh) & 1u);
  return sign | (uint8_t)(r >> sh);
}
static inline float ts_f8e4m3_to_f32(uint8_t c) { return ts_f8_to_f32(c, 3, 7); }
static inline float ts_f8e5m2_to_f32(uint8_t c) { return ts_f8_to_f32(c, 2, 15); }
static inline uint8_t ts_f32_to_f8e4m3(float f) { return ts_f32_to_f8(f, 3, 7, 0x43e00000u, 0x7e, 0x7f); }   /* 448 */
static inline uint8_t ts_f32_to_f8e5m2(float f) { return ts_f32_to_f8(f, 2, 15, 0x47600000u, 0x7b, 0x7e); }  /* 57344 */
#endif
