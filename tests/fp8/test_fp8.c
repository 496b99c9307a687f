/* test_fp8.c - --fp8's numerics (issue 20, deliverable 5; docs/precision.md
 * "FP8"):
 *   - half.h's fp8 conversions against references from first principles:
 *     every one of the 256 codes of each format decodes to the value its
 *     fields define (enumerated here from sign, exponent and mantissa, not
 *     by half.h's bit shuffle); encoding is the nearest value found by a
 *     search over those 256 values in double, ties to the even code,
 *     saturating to the largest finite value, NaN kept -- checked on every
 *     midpoint between neighbouring values, the f32 neighbours of each
 *     midpoint and value, out-of-range values, infinities, f32 subnormals
 *     and 2^20 random floats;
 *   - the IR: fp8 types and the ops quant8 / amax_acc / matmul8 / fp8_scale
 *     print and parse back to the same text; the shape rule refuses an fp8
 *     operand of an arithmetic op and a matmul8 of bf16 operands;
 *   - the kernels: quant8 + matmul8 equal, bit for bit, the reference path
 *     that rounds at the same points (x * scale in f32, cast to fp8, cast
 *     to f32, the f32 matmul, times sinv_a sinv_b, cast to bf16) on the
 *     reference and the LLVM backend; amax_acc and fp8_scale follow
 *     Transformer Engine's delayed-scaling formulas (history roll, max or
 *     most recent, (fp8_max / amax) / 2^margin, the old scale kept when
 *     the amax is 0 or not finite). */
#include "passes/passes.h"
#include "runtime/cpu/half.h"
#include "runtime/cpu/kernels.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"
#define TEST_RNG_SEED 0x2545f4914f6cdd1dull
#include "../bits.h"

/* A format from first principles: value[code] and kind[code] (0 finite,
 * 1 inf, 2 NaN), built by enumerating sign, exponent field and mantissa. */
typedef struct {
  const char *name;
  int e, mb, bias, fn;   /* fn: E4M3's finite-only variant (S.1111.111 NaN, no inf) */
  double v[256];
  int kind[256];
  double max;
  int maxcode;
} Fmt;

static void fmt_build(Fmt *f) {
  f->max = 0;
  for (int s = 0; s < 2; s++)
    for (int ex = 0; ex < (1 << f->e); ex++)
      for (int m = 0; m < (1 << f->mb); m++) {
        int code = (s << 7) | (ex << f->mb) | m;
        double mag;
        int kind = 0;
        if (ex == 0) mag = m * pow(2.0, 1 - f->bias - f->mb);                    /* subnormal */
        else mag = (1.0 + m / (double)(1 << f->mb)) * pow(2.0, ex - f->bias);   /* normal */
        if (f->fn && ex == (1 << f->e) - 1 && m == (1 << f->mb) - 1) kind = 2;
        if (!f->fn && ex == (1 << f->e) - 1) kind = m ? 2 : 1;
        f->v[code] = s ? -mag : mag;
        f->kind[code] = kind;
        if (!kind && mag > f->max) {
          f->max = mag;
          f->maxcode = code;
        }
      }
}

/* the reference encoding: nearest finite value by search, ties to the even
 * code, |x| >= max saturates, NaN -> a NaN code of x's sign */
static int ref_encode(const Fmt *f, float x) {
  if (isnan(x)) return -1;   /* any NaN code of the sign: checked by decoding */
  double d = x;
  if (fabs(d) >= f->max) return d < 0 ? f->maxcode | 0x80 : f->maxcode;
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    if (f->kind[c]) continue;
    if (f->v[c] == 0 && (c & 0x80) != (signbit(x) ? 0x80 : 0)) continue;   /* zero keeps x's sign */
    double dd = fabs(d - f->v[c]);
    if (dd < bd || (dd == bd && !(c & 1) && (best & 1))) { bd = dd; best = c; }
  }
  return best;
}

static int enc(const Fmt *f, float x) { return f->e == 4 ? ts_f32_to_f8e4m3(x) : ts_f32_to_f8e5m2(x); }
static float dec(const Fmt *f, int c) { return f->e == 4 ? ts_f8e4m3_to_f32((uint8_t)c) : ts_f8e5m2_to_f32((uint8_t)c); }

static int nbad;
static void check_enc(const Fmt *f, float x) {
  int want = ref_encode(f, x), got = enc(f, x);
  int ok = want < 0 ? (isnan(dec(f, got)) && (got & 0x80) == (signbit(x) ? 0x80 : 0)) : got == want;
  if (!ok && nbad++ < 10)
    CHECK(0, "%s: encode(%a) = 0x%02x (%g), the nearest is 0x%02x (%g)", f->name, x, got, dec(f, got), want,
          want >= 0 ? f->v[want] : NAN);
  else check_count++;
}

static void test_conversions(void) {
  Fmt fm[2] = {{.name = "f8e4m3", .e = 4, .mb = 3, .bias = 7, .fn = 1}, {.name = "f8e5m2", .e = 5, .mb = 2, .bias = 15}};
  for (int k = 0; k < 2; k++) {
    Fmt *f = &fm[k];
    fmt_build(f);
    CHECK(f->max == (k ? 57344.0 : 448.0), "%s max %g", f->name, f->max);
    int ndec = 0;
    for (int c = 0; c < 256; c++) {
      float g = dec(f, c);
      int ok = f->kind[c] == 2 ? isnan(g) : f->kind[c] == 1 ? isinf(g) && (g < 0) == (c >> 7) :
               (double)g == f->v[c] && !!signbit(g) == (c >> 7);
      CHECK(ok, "%s: decode(0x%02x) = %a, its fields give %a", f->name, c, g, f->v[c]);
      ndec += ok;
      /* a finite code round-trips */
      if (!f->kind[c]) CHECK(enc(f, g) == c, "%s: 0x%02x -> %g -> 0x%02x", f->name, c, g, enc(f, g));
    }
    CHECK(ndec == 256, "%s: %d of 256 codes decode", f->name, ndec);
    /* every midpoint of neighbouring finite values (exact in f32: at most
     * 5 significant bits), its f32 neighbours, and each value's */
    nbad = 0;
    int nmid = 0;
    for (int c = 0; c < 256; c++) {
      if (f->kind[c]) continue;
      float v = (float)f->v[c];
      check_enc(f, v);
      check_enc(f, nextafterf(v, INFINITY));
      check_enc(f, nextafterf(v, -INFINITY));
      for (int d = 0; d < 256; d++) {
        if (f->kind[d] || !(f->v[d] > f->v[c])) continue;
        int between = 0;
        for (int e = 0; e < 256; e++) between |= !f->kind[e] && f->v[e] > f->v[c] && f->v[e] < f->v[d];
        if (between) continue;
        double mid = (f->v[c] + f->v[d]) / 2;
        float mf = (float)mid;
        CHECK((double)mf == mid, "%s: midpoint %g not exact in f32", f->name, mid);
        check_enc(f, mf);
        check_enc(f, nextafterf(mf, INFINITY));
        check_enc(f, nextafterf(mf, -INFINITY));
        nmid++;
      }
    }
    /* beyond the largest finite value, the first midpoint past it, infinities, NaN, f32 subnormals */
    float edge[] = {(float)f->max * 1.0625f, (float)f->max * 1.125f, (float)f->max * 1.25f, 1e30f, 3.0e38f, INFINITY,
                    -INFINITY, -(float)f->max * 1.5f, NAN, -NAN, 1e-45f, -1e-45f, 1e-40f, 0.0f, -0.0f,
                    (float)(f->v[1] / 2), (float)(f->v[1] / 2 * 3), (float)(f->v[1] / 4)};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_enc(f, edge[i]);
    CHECK(enc(f, INFINITY) == f->maxcode && enc(f, -INFINITY) == (f->maxcode | 0x80),
          "%s: infinity saturates to the largest finite value", f->name);
    for (int i = 0; i < (1 << 20); i++) {
      uint32_t u = next32() << 1 ^ next32();
      /* most random floats are far out of range: half of them scaled into it */
      float x = from_bits(u);
      if (i & 1) x = ldexpf(from_bits((u & 0x807fffffu) | 0x3f800000u), (int)(next32() % 40) - 24);
      check_enc(f, x);
    }
    printf("%s: 256 codes decode as their fields say (max %g); encode = nearest, ties to even, saturating, on %d "
           "midpoints (and their f32 neighbours), the edge cases and 2^20 random floats\n", f->name, f->max, nmid);
  }
  (void)bits;
}

/* ---- the IR and the kernels ---- */
static const char *text =
    "module fp8\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=1.0 global_batch=2 micro_batch=2 seq_len=48 steps=1 seed=7 precision=bf16\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0 zero=1\n"
    "state @t.amax : f32[] fp8 start=0.0\n"
    "state @t.amax_history : f32[4] fp8 start=0.0\n"
    "state @t.scale : f32[] fp8 start=1.0\n"
    "state @t.scale_inv : f32[] fp8 start=1.0\n"
    "block forward {\n"
    "  %0 = input \"a\" : f32[2, 48, 640]\n"
    "  %1 = input \"b\" : f32[40, 640]\n"
    "  %2 = cast %0 : bf16[2, 48, 640]\n"
    "  %3 = cast %1 : bf16[40, 640]\n"
    "  %4 = full value=0.375 : f32[]\n"
    "  %5 = full value=24.0 : f32[]\n"
    "  %6 = quant8 %2, %4 : f8e4m3[2, 48, 640]\n"
    "  %7 = quant8 %3, %5 : f8e5m2[40, 640]\n"
    "  %8 = full value=2.6666667461395264 : f32[]\n"
    "  %9 = full value=0.0416666679084301 : f32[]\n"
    "  %10 = matmul8 %6, %7, %8, %9 ta=0 tb=1 : bf16[2, 48, 40]\n"
    "  amax_acc %2 @t.amax\n"
    "  %12 = cast %2 : f32[2, 48, 640]\n"
    "  %13 = muls %12 c=0.375 : f32[2, 48, 640]\n"
    "  %14 = cast %13 : f8e4m3[2, 48, 640]\n"
    "  %15 = cast %14 : f32[2, 48, 640]\n"
    "  %16 = cast %3 : f32[40, 640]\n"
    "  %17 = muls %16 c=24.0 : f32[40, 640]\n"
    "  %18 = cast %17 : f8e5m2[40, 640]\n"
    "  %19 = cast %18 : f32[40, 640]\n"
    "  %20 = matmul %15, %19 ta=0 tb=1 : f32[2, 48, 40]\n"
    "  %21 = muls %20 c=0.1111111119389534 : f32[2, 48, 40]\n"
    "  %22 = cast %21 : bf16[2, 48, 40]\n"
    "  %23 = cast %10 : f32[2, 48, 40]\n"
    "  %24 = cast %22 : f32[2, 48, 40]\n"
    "  %25 = sub %23, %24 : f32[2, 48, 40]\n"
    "  %26 = sumsq %25 : f32[]\n"
    "  output \"d_gemm\" %26\n"
    "  %28 = cast %6 : f32[2, 48, 640]\n"
    "  %29 = sub %28, %15 : f32[2, 48, 640]\n"
    "  %30 = sumsq %29 : f32[]\n"
    "  output \"d_quant\" %30\n"
    "  %32 = sumsq %24 : f32[]\n"
    "  output \"loss\" %32\n"
    "}\n"
    "block update {\n"
    "  %0 = state @t.amax : f32[]\n"
    "  fp8_scale %0 @t.amax_history @t.scale @t.scale_inv algo=0 margin=1.0 fmax=448.0\n"
    "  zero @t.amax\n"
    "}\n"
    "end\n";

static void test_ir(void) {
  char err[1024];
  IrModule *m = ir_parse_module(text, "<fp8>", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  StrBuf a = {0}, b = {0};
  ir_print_module(m, &a);
  IrModule *m2 = ir_parse_module(a.p, "<fp8 printed>", err, sizeof err);
  CHECK(m2 != NULL, "reparse: %s", err);
  if (m2) ir_print_module(m2, &b);
  CHECK(m2 && !strcmp(a.p, b.p), "the IR text does not round-trip");
  CHECK(strstr(a.p, "quant8 %2, %4 : f8e4m3[2, 48, 640]") && strstr(a.p, "f8e5m2[40, 640]") &&
        strstr(a.p, "state @t.amax_history : f32[4] fp8 start=0.0"), "printed text:\n%s", a.p);
  sb_free(&a), sb_free(&b);
  if (m2) ir_module_free(m2);
  ir_module_free(m);
  /* refusals of the shape rule */
  struct { const char *from, *to, *want; } bad[] = {
      {"%28 = cast %6 : f32", "%28 = neg %6 : f32", "is f8e4m3, an fp8 storage type"},
      {"%10 = matmul8 %6, %7, %8, %9", "%10 = matmul8 %2, %7, %8, %9", "(%2) is bf16, a storage type"},
      {"%10 = matmul8 %6, %7, %8, %9", "%10 = matmul8 %6, %7, %0, %9", "scale_inv of a"},
      {"%6 = quant8 %2, %4 : f8e4m3", "%6 = quant8 %2, %4 : bf16", "in f8e4m3 or f8e5m2"},
      {"fp8_scale %0 @t.amax_history @t.scale", "fp8_scale %0 @t.scale @t.scale", "expected an f32 vector of kind fp8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *p = strstr(text, bad[i].from);
    CHECK(p != NULL, "case %zu", i);
    if (!p) continue;
    size_t fl = strlen(bad[i].from), tl = strlen(bad[i].to), n = strlen(text);
    char *t = malloc(n + tl + 1);
    memcpy(t, text, (size_t)(p - text));
    memcpy(t + (p - text), bad[i].to, tl);
    strcpy(t + (p - text) + tl, p + fl);
    IrModule *mb = ir_parse_module(t, "<bad>", err, sizeof err);
    int refused = !mb || ir_verify(mb, err, sizeof err) != 0;
    CHECK(refused && strstr(err, bad[i].want), "case %zu: want '%s', got '%s'", i, bad[i].want, refused ? err : "accepted");
    if (mb) ir_module_free(mb);
    free(t);
  }
}

static void test_kernels(void) {
  char err[1024];
  IrModule *m = ir_parse_module(text, "<fp8>", err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  size_t na = 2 * 48 * 640, nb = 40 * 640;
  float *a = malloc(na * 4), *b = malloc(nb * 4);
  /* values spread over the fp8 range and past it (saturation) */
  for (size_t i = 0; i < na; i++) a[i] = ldexpf((float)((int32_t)next32() >> 8) / 8388608.0f, (int)(next32() % 14) - 4);
  for (size_t i = 0; i < nb; i++) b[i] = ldexpf((float)((int32_t)next32() >> 8) / 8388608.0f, (int)(next32() % 14) - 6);
  RtFeed f[2] = {{"a", a}, {"b", b}};
  for (int be = 0; be < 2; be++) {
    RtRank r = rt_rank_single();
    RtExecOpts o = {.backend = be ? RT_BACKEND_LLVM : RT_BACKEND_REF, .threads = 2};
    RtProgram *p = rt_program_new_opts(m, &r, &o, err, sizeof err);
    CHECK(p != NULL, "program: %s", err);
    if (!p) continue;
    CHECK(rt_run_block(p, 0, f, 2, NULL, err, sizeof err) == 0, "run: %s", err);
    double loss = 0, dg = 1, dq = 1;
    rt_output(p, "loss", &loss);
    rt_output(p, "d_gemm", &dg);
    rt_output(p, "d_quant", &dq);
    CHECK(dq == 0, "%s: quant8 differs from muls + cast: %g", be ? "llvm" : "ref", dq);
    CHECK(dg == 0, "%s: matmul8 differs from the dequantized f32 matmul times sinv_a sinv_b: %g", be ? "llvm" : "ref", dg);
    CHECK(loss > 1, "real products: %g", loss);
    /* amax_acc: max |bf16(a)| */
    float want = 0;
    for (size_t i = 0; i < na; i++) want = fmaxf(want, fabsf(ts_bf16_to_f32(ts_f32_to_bf16(a[i]))));
    float got = *(const float *)rt_state_data(p, ir_state_find(m, "t.amax"));
    CHECK(got == want, "amax %g, want %g", got, want);
    printf("fp8 GEMM on %s: quant8 + matmul8 bit for bit the reference path (sum of squares of the result %.6g), "
           "amax %g\n", be ? "llvm" : "ref", loss, got);
    rt_program_free(p);
  }
  free(a), free(b);
  ir_module_free(m);
}

/* TE's delayed scaling on a history of 4 */
static void test_scale(void) {
  float h[4] = {0, 0, 0, 0}, sc = 1, si = 1;
  rt_fp8_scale(h, 4, 2.0f, 0, 0, 448, &sc, &si);
  CHECK(h[0] == 2 && sc == 224.0f && si == 1.0f / 224.0f, "first: hist %g scale %g", h[0], sc);
  rt_fp8_scale(h, 4, 1.0f, 0, 0, 448, &sc, &si);
  CHECK(h[0] == 1 && h[1] == 2 && sc == 224.0f, "max over the history keeps 2: scale %g", sc);
  rt_fp8_scale(h, 4, 1.0f, 1, 0, 448, &sc, &si);
  CHECK(sc == 448.0f, "most_recent: scale %g", sc);
  rt_fp8_scale(h, 4, 0.5f, 0, 1, 448, &sc, &si);
  CHECK(h[3] == 2 && sc == 448.0f / 2 / 2, "margin 1: scale %g", sc);
  rt_fp8_scale(h, 4, 0.25f, 0, 0, 448, &sc, &si);
  CHECK(sc == 448.0f, "2 rolled out of the history: scale %g (want 448 / 1)", sc);
  float keep = sc;
  float z[1] = {0};
  rt_fp8_scale(z, 1, 0.0f, 1, 0, 448, &sc, &si);
  CHECK(sc == keep, "amax 0 keeps the scale: %g", sc);
  rt_fp8_scale(z, 1, NAN, 1, 0, 448, &sc, &si);
  CHECK(sc == keep, "amax NaN keeps the scale: %g", sc);
  rt_fp8_scale(z, 1, INFINITY, 1, 0, 448, &sc, &si);
  CHECK(sc == keep, "amax inf keeps the scale: %g", sc);
  printf("fp8_scale: TE's formula (fp8_max / amax) / 2^margin over a rolling history; 0, NaN, inf keep the scale\n");
}

int main(void) {
  test_conversions();
  test_ir();
  test_kernels();
  test_scale();
  return check_exit("fp8");
}
