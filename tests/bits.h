/* bits.h - for the numeric tests: a float's bit pattern and back, and a
 * seeded xorshift stream of 32-bit words (next32).  A test picks its
 * stream by defining TEST_RNG_SEED before including this header, so
 * each test's inputs stay what they were.  Header-only and static. */
#ifndef TESTS_BITS_H
#define TESTS_BITS_H
#include <stdint.h>
#include <string.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static inline uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint64_t rng = TEST_RNG_SEED;
static inline uint32_t next32(void) {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}
#endif
