/* rng.c - Tessera's counter-based random numbers.  Nothing here has state:
 * every draw is a pure function of (seed, what, where), so a value can be
 * recomputed anywhere (a shard of a parameter computes its elements from
 * their global indices; dropout's backward recomputes its forward mask).
 *
 * The exact formulas (a reimplementation must match them bit for bit):
 *   mix(z)      = splitmix64 finalizer: z += 0x9e3779b97f4a7c15;
 *                 z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
 *                 z = (z ^ z>>27) * 0x94d049bb133111eb;  z ^ z>>31
 *   H(w1..wn)   = h = 0x6a09e667f3bcc909; for each word: h = mix(h ^ w); h
 *   U(h)        = (h >> 11) * 2^-53                     uniform in [0, 1)
 *   namehash(P) = 64-bit FNV-1a of the state's name (offset basis
 *                 0xcbf29ce484222325, prime 0x100000001b3)
 *   init draw d of element i (row-major global index) of parameter P:
 *                 u_d = U(H(1, seed, namehash(P), i, d))
 *     zeros / ones: 0 / 1
 *     uniform(a, b):  a + (b - a) * u_0
 *     normal(mu, sd): mu + sd * sqrt(-2 ln(1 - u_0)) * cos(2 pi u_1)
 *                     (Box-Muller from two draws of the same element)
 *   dropout keep test of element i:
 *                 U(H(2, seed, stream, step, micro, i)) >= p
 *   data window of global row r at step s: H(3, seed, s, r) (see data.c)
 * The leading word is a domain tag so the three uses never share a stream. */
#include "kernels.h"
#include <math.h>

uint64_t rt_hash_words(const uint64_t *w, int n) {
  uint64_t h = 0x6a09e667f3bcc909ull;
  for (int i = 0; i < n; i++) h = rt_mix64(h ^ w[i]);
  return h;
}

/* Standard FNV-1a, spelled out here (not util's ts_hash64) so the init
 * formula cannot drift with a helper that serves other purposes. */
uint64_t rt_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
    h ^= *c;
    h *= 0x100000001b3ull;
  }
  return h;
}

/* H(1, seed, nh, i, d) = mix(mix(prefix ^ i) ^ d) with prefix = H(1, seed, nh):
 * the chain's first three words are the parameter's, hashed once. */
RtInit rt_init_begin(const IrState *s, uint64_t seed, uint64_t nh) {
  uint64_t w[3] = {RT_RNG_INIT, seed, nh};
  return (RtInit){s, rt_hash_words(w, 3)};
}

double rt_init_at(const RtInit *c, int64_t i) {
  const IrState *s = c->s;
  switch (s->init) {
  case IR_INIT_ZEROS: return 0.0;
  case IR_INIT_ONES: return 1.0;
  case IR_INIT_UNIFORM: {
    uint64_t hi = rt_mix64(c->prefix ^ (uint64_t)i);
    return s->init_a + (s->init_b - s->init_a) * rt_u01(rt_mix64(hi ^ 0));
  }
  case IR_INIT_NORMAL: {
    uint64_t hi = rt_mix64(c->prefix ^ (uint64_t)i);
    double u1 = rt_u01(rt_mix64(hi ^ 0)), u2 = rt_u01(rt_mix64(hi ^ 1));
    /* 1 - u1 is in (0, 1], so the log is finite */
    double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
    return s->init_a + s->init_b * z;
  }
  default: return 0.0;
  }
}

double rt_init_value(const IrState *s, uint64_t seed, uint64_t nh, int64_t i) {
  RtInit c = rt_init_begin(s, seed, nh);
  return rt_init_at(&c, i);
}

double rt_dropout_u(uint64_t seed, int64_t stream, int64_t step, int micro, int64_t i) {
  uint64_t w[6] = {RT_RNG_DROPOUT, seed, (uint64_t)stream, (uint64_t)step, (uint64_t)(int64_t)micro, (uint64_t)i};
  return rt_u01(rt_hash_words(w, 6));
}
