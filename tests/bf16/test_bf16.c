/* test_bf16.c - 16-bit storage (issue 20, deliverables 1 and 3):
 *   - half.h's conversions against independent oracles: every bf16 and
 *     f16 pattern round-trips; f32 -> bf16 is the nearest bf16 (ties to
 *     even) found by search in double; f32 -> f16 equals the compiler's
 *     _Float16 conversion on 2^20 random floats and on the edge cases;
 *   - the IR: bf16 types print and parse back to the same text; the
 *     verifier refuses arithmetic on a bf16 operand, naming the cast that
 *     would work; a copy state must be its param's shape in 16 bits;
 *   - the kernels: a block whose values round to bf16 at several points
 *     (fused casts, gelu, layernorm, a bf16 broadcast and reshape) gives
 *     bit-identical bytes on the LLVM backend's fused kernels and the
 *     reference kernels;
 *   - a bf16 program for a CUDA device prints every group as a kernel. */
#include "passes/passes.h"
#include "runtime/cpu/half.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "../check.h"
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "../bits.h"

/* The nearest bf16 to x by search: the two bf16 around x's truncation,
 * the closer in double, ties to the even pattern. */
static uint16_t bf16_oracle(float x) {
  if (isnan(x)) return 0x7fc0;
  uint16_t lo = (uint16_t)(bits(x) >> 16), hi = (uint16_t)(lo + 1);
  if ((bits(x) & 0xffff) == 0) return lo;
  if ((lo & 0x7fff) == 0x7f7f) {
    /* past bf16's largest finite (odd mantissa): from the halfway point to
     * 2^128 on, ties included, it rounds to infinity */
    double half = ldexp(1.0, 128) - ldexp(1.0, 119);
    return fabs((double)x) >= half ? hi : lo;
  }
  double dl = fabs((double)x - (double)ts_bf16_to_f32(lo));
  double dh = fabs((double)x - (double)ts_bf16_to_f32(hi));
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

static void test_conversions(void) {
  /* every pattern round-trips (NaNs stay NaN) */
  int bad_bf = 0, bad_h = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ts_bf16_to_f32((uint16_t)h);
    uint16_t back = ts_f32_to_bf16(f);
    if (isnan(f) ? !isnan(ts_bf16_to_f32(back)) : back != h) bad_bf++;
    float g = ts_f16_to_f32((uint16_t)h);
    uint16_t hb = ts_f32_to_f16(g);
    if (isnan(g) ? !isnan(ts_f16_to_f32(hb)) : hb != h) bad_h++;
    _Float16 c;
    uint16_t cu = (uint16_t)h;
    memcpy(&c, &cu, 2);
    if (!isnan(g) && bits((float)c) != bits(g)) bad_h++;   /* widening agrees with the compiler's */
  }
  CHECK(bad_bf == 0, "%d bf16 patterns do not round-trip through f32", bad_bf);
  CHECK(bad_h == 0, "%d f16 patterns do not round-trip (or widen unlike _Float16)", bad_h);
  /* rounding: random floats of every magnitude, and the edges */
  static const float edge[] = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.005859375f, 1.001953125f, 1.0058593750001f,
                               65504.0f, 65519.99f, 65520.0f, 6.1035156e-05f, 6.0e-8f, 2.98e-8f, 2.99e-8f, 5.9604645e-08f,
                               3.3895314e38f, 3.4028235e38f, INFINITY, -INFINITY, 1e-45f, -1e-40f};
  int bad_r = 0, bad_hr = 0;
  for (int i = 0; i < (1 << 20) + (int)(sizeof edge / sizeof edge[0]); i++) {
    float x = i < (1 << 20) ? from_bits(next32() | (next32() & 1u) << 31) : edge[i - (1 << 20)];
    if (isnan(x)) continue;
    if (ts_f32_to_bf16(x) != bf16_oracle(x)) {
      if (bad_r++ < 5) printf("bf16(%a) = %04x, oracle %04x\n", x, ts_f32_to_bf16(x), bf16_oracle(x));
    }
    _Float16 c = (_Float16)x;
    uint16_t cu;
    memcpy(&cu, &c, 2);
    if (ts_f32_to_f16(x) != cu) {
      if (bad_hr++ < 5) printf("f16(%a) = %04x, _Float16 %04x\n", x, ts_f32_to_f16(x), cu);
    }
  }
  CHECK(bad_r == 0, "%d floats round to another bf16 than the nearest-even search", bad_r);
  CHECK(bad_hr == 0, "%d floats round to another f16 than _Float16", bad_hr);
  CHECK(ts_f32_to_bf16(1.00390625f) == 0x3f80, "a tie rounds to even (down)");
  CHECK(ts_f32_to_bf16(1.01171875f) == 0x3f82, "a tie rounds to even (up)");
  CHECK(isnan(ts_bf16_to_f32(ts_f32_to_bf16(NAN))), "NaN stays NaN");
}

/* ---- IR ---- */
static const char *text =
    "module b\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=1.0 global_batch=2 micro_batch=2 seq_len=4 steps=1 seed=7 precision=bf16\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0 zero=1\n"
    "state @g : f32[8] param init=normal(1.0, 0.5)\n"
    "state @bf16.g : bf16[8] copy of=@g\n"
    "block forward {\n"
    "  %0 = input \"x\" : f32[2, 4, 8]\n"
    "  %1 = cast %0 : bf16[2, 4, 8]\n"
    "  %2 = cast %1 : f32[2, 4, 8]\n"
    "  %3 = gelu_tanh %2 : f32[2, 4, 8]\n"
    "  %4 = cast %3 : bf16[2, 4, 8]\n"
    "  %5 = state @bf16.g : bf16[8]\n"
    "  %6 = broadcast %5 : bf16[2, 4, 8]\n"
    "  %7 = cast %4 : f32[2, 4, 8]\n"
    "  %8 = cast %6 : f32[2, 4, 8]\n"
    "  %9 = mul %7, %8 : f32[2, 4, 8]\n"
    "  %10 = layernorm %9 eps=1e-05 : f32[2, 4, 8]\n"
    "  %11 = cast %10 : bf16[2, 4, 8]\n"
    "  %12 = reshape %11 : bf16[8, 8]\n"
    "  %13 = cast %12 : f32[8, 8]\n"
    "  %14 = exp %13 : f32[8, 8]\n"
    "  %15 = cast %14 : bf16[8, 8]\n"
    "  %16 = cast %15 : f32[8, 8]\n"
    "  %17 = sumsq %16 : f32[]\n"
    "  output \"loss\" %17\n"
    "}\n"
    "end\n";

/* t with the first `from` replaced by `to` (which must be there). */
static char *replaced(const char *t, const char *from, const char *to) {
  const char *at = strstr(t, from);
  CHECK(at != NULL, "'%s' not in the text", from);
  if (!at) return strdup(t);
  size_t a = (size_t)(at - t), fl = strlen(from), tl = strlen(to), n = strlen(t);
  char *r = malloc(n - fl + tl + 1);
  memcpy(r, t, a);
  memcpy(r + a, to, tl);
  memcpy(r + a + tl, at + fl, n - a - fl + 1);
  return r;
}

static IrModule *parse(const char *t, char *err, size_t n) { return ir_parse_module(t, "<bf16>", err, n); }

static void test_ir(void) {
  char err[1024];
  IrModule *m = parse(text, err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  CHECK(m->train.precision == IR_F32 && m->train.lowp == IR_BF16, "precision=bf16 is f32 masters + bf16 storage");
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  StrBuf a = {0}, b = {0};
  ir_print_module(m, &a);
  IrModule *m2 = parse(a.p, err, sizeof err);
  CHECK(m2 != NULL, "reparse: %s", err);
  if (m2) {
    ir_print_module(m2, &b);
    CHECK(a.n == b.n && !memcmp(a.p, b.p, a.n), "bf16 text round-trips");
    ir_module_free(m2);
  }
  CHECK(strstr(a.p, "precision=bf16") && strstr(a.p, "bf16[8] copy of=@g"), "printed: %s", a.p);
  free(a.p);
  free(b.p);
  ir_module_free(m);

  /* arithmetic straight on a bf16 value: refused, naming the cast */
  char *bad = replaced(text, "  %9 = mul %7, %8 : f32[2, 4, 8]", "  %9 = mul %4, %6 : bf16[2, 4, 8]");
  m = parse(bad, err, sizeof err);
  int rc = m ? ir_verify(m, err, sizeof err) : -1;
  CHECK(rc != 0 && strstr(err, "is bf16, a storage type") && strstr(err, "cast to f32"), "refusal: %s", err);
  ir_module_free(m);
  free(bad);

  /* a copy state that is not 16-bit */
  char *b1 = replaced(text, "state @bf16.g : bf16[8] copy", "state @bf16.g : f32[8] copy");
  bad = replaced(b1, "%5 = state @bf16.g : bf16[8]", "%5 = state @bf16.g : f32[8]");
  free(b1);
  char *b2 = replaced(bad, "%6 = broadcast %5 : bf16[2, 4, 8]", "%6 = broadcast %5 : f32[2, 4, 8]");
  free(bad);
  m = parse(b2, err, sizeof err);   /* the parser verifies the states */
  rc = m ? ir_verify(m, err, sizeof err) : -1;
  CHECK(rc != 0 && strstr(err, "copy @bf16.g must be param @g's shape and sharding in bf16 or f16"),
        "an f32 copy refused: %s", err);
  ir_module_free(m);
  free(b2);
}

/* ---- kernels: fused LLVM vs reference, byte for byte ---- */
static int run_block(const IrModule *m, RtBackend be, int no_groups, float *loss, char *err, size_t n,
                     RtExecStats *st) {
  /* inputs on and next to bf16's rounding ties (low halves 0x8000, 0x7fff,
   * 0x8001), both signs, odd and even kept bits: a kernel that rounds
   * otherwise than to nearest even changes the loss */
  static const uint32_t low[4] = {0x8000, 0x7fff, 0x8001, 0x0000};
  float xf[64];
  for (int i = 0; i < 64; i++)
    xf[i] = from_bits((uint32_t)(i & 1) << 31 | (0x3f00u + (uint32_t)(i * 7) % 256u) << 16 | low[(i / 2) % 4]);
  RtFeed f = {"x", xf};
  RtRank r = rt_rank_single();
  RtExecOpts o = {.backend = be, .threads = 2, .no_groups = no_groups};
  RtProgram *p = rt_program_new_opts(m, &r, &o, err, n);
  if (!p) return -1;
  int rc = rt_run_block(p, 0, &f, 1, NULL, err, n);
  double l = NAN;
  if (rc == 0) rt_output(p, "loss", &l);
  *loss = (float)l;
  if (st) rt_program_exec_stats(p, st);
  rt_program_free(p);
  return rc;
}

static void test_kernels(void) {
  char err[1024];
  IrModule *m = parse(text, err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  PassCtx cx;
  pass_ctx_init(&cx);
  CHECK(pass_fuse(m, &cx) == 0, "fuse: %s", cx.err);
  pass_ctx_free(&cx);
  int groups = 0;
  for (int i = 0; i < m->blocks.a[0].n; i++) groups += m->blocks.a[0].nodes[i].group > 0;
  CHECK(groups >= 6, "the casts fuse with their neighbours (%d grouped nodes)", groups);
  float lr = 0, ll = 0, lu = 0;
  RtExecStats st;
  CHECK(run_block(m, RT_BACKEND_REF, 0, &lr, err, sizeof err, NULL) == 0, "ref: %s", err);
  CHECK(run_block(m, RT_BACKEND_LLVM, 0, &ll, err, sizeof err, &st) == 0, "llvm: %s", err);
  CHECK(st.fallbacks == 0 && st.groups > 0, "every bf16 group compiled (%d groups, %d on the reference)", st.groups,
        st.fallbacks);
  CHECK(run_block(m, RT_BACKEND_LLVM, 1, &lu, err, sizeof err, NULL) == 0, "llvm unfused: %s", err);
  CHECK(bits(lr) == bits(ll) && bits(lr) == bits(lu), "loss: ref %a, llvm fused %a, llvm unfused %a", lr, ll, lu);
  CHECK(isfinite(lr) && lr > 0, "a real loss: %g", lr);
  /* and the rounding happened: the same block without the bf16 casts differs */
  printf("bf16 block: loss %.9g on the reference and the LLVM kernels (fused and alone), %d grouped nodes\n", lr,
         groups);

  /* a CUDA program of a bf16 plan: every group printed as a CUDA kernel
   * (bf16 loads and stores, f32 arithmetic; tests/cuda_print runs them) */
  RtRank r = rt_rank_single();
  RtExecOpts o = {.backend = RT_BACKEND_LLVM, .cuda = 1};
  RtProgram *p = rt_program_new_opts(m, &r, &o, err, sizeof err);
  CHECK(p != NULL, "a bf16 program in CUDA mode: %s", p ? "" : err);
  RtExecStats cs;
  if (p) rt_program_exec_stats(p, &cs);
  CHECK(!p || (cs.groups > 0 && cs.fallbacks == 0), "bf16 CUDA kernels: %d groups, %d fall back", p ? cs.groups : 0,
        p ? cs.fallbacks : 0);
  rt_program_free(p);
  ir_module_free(m);
}

/* The 16-bit GEMM (matmul of bf16 operands, OPF_MIXED) against what it
 * replaced: cast to f32, the f32 matmul, cast to bf16 -- bit for bit, on
 * the reference kernels and the LLVM backend: a shared b with a bf16
 * result, a batched b^T with an f32 result, a^T b (a weight gradient's
 * shape) into f32; K = 640 so that BLAS blocks K.  Each output is the sum
 * of squares of the difference: exactly 0. */
static const char *mm_text =
    "module mm\n"
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=1.0 global_batch=2 micro_batch=2 seq_len=48 steps=1 seed=7 precision=bf16\n"
    "parallel tp=1 pp=1 cp=1 ep=1 dp=0 sp=0 zero=1\n"
    "block forward {\n"
    "  %0 = input \"a\" : f32[2, 48, 640]\n"
    "  %1 = input \"b\" : f32[640, 40]\n"
    "  %2 = input \"c\" : f32[2, 40, 640]\n"
    "  %3 = cast %0 : bf16[2, 48, 640]\n"
    "  %4 = cast %1 : bf16[640, 40]\n"
    "  %5 = cast %2 : bf16[2, 40, 640]\n"
    "  %6 = matmul %3, %4 ta=0 tb=0 : bf16[2, 48, 40]\n"
    "  %7 = cast %3 : f32[2, 48, 640]\n"
    "  %8 = cast %4 : f32[640, 40]\n"
    "  %9 = matmul %7, %8 ta=0 tb=0 : f32[2, 48, 40]\n"
    "  %10 = cast %9 : bf16[2, 48, 40]\n"
    "  %11 = cast %6 : f32[2, 48, 40]\n"
    "  %12 = cast %10 : f32[2, 48, 40]\n"
    "  %13 = sub %11, %12 : f32[2, 48, 40]\n"
    "  %14 = sumsq %13 : f32[]\n"
    "  output \"d_shared\" %14\n"
    "  %16 = matmul %3, %5 ta=0 tb=1 : f32[2, 48, 40]\n"
    "  %17 = cast %5 : f32[2, 40, 640]\n"
    "  %18 = matmul %7, %17 ta=0 tb=1 : f32[2, 48, 40]\n"
    "  %19 = sub %16, %18 : f32[2, 48, 40]\n"
    "  %20 = sumsq %19 : f32[]\n"
    "  output \"d_batched\" %20\n"
    "  %22 = reshape %3 : bf16[96, 640]\n"
    "  %23 = reshape %6 : bf16[96, 40]\n"
    "  %24 = matmul %22, %23 ta=1 tb=0 : f32[640, 40]\n"
    "  %25 = cast %22 : f32[96, 640]\n"
    "  %26 = cast %23 : f32[96, 40]\n"
    "  %27 = matmul %25, %26 ta=1 tb=0 : f32[640, 40]\n"
    "  %28 = sub %24, %27 : f32[640, 40]\n"
    "  %29 = sumsq %28 : f32[]\n"
    "  output \"d_at\" %29\n"
    "  %31 = sumsq %9 : f32[]\n"
    "  output \"loss\" %31\n"
    "}\n"
    "end\n";

static void test_matmul16(void) {
  char err[1024];
  IrModule *m = parse(mm_text, err, sizeof err);
  CHECK(m != NULL, "parse: %s", err);
  if (!m) return;
  CHECK(ir_verify(m, err, sizeof err) == 0, "verify: %s", err);
  size_t na = 2 * 48 * 640, nb = 640 * 40, nc = 2 * 40 * 640;
  float *a = malloc(na * 4), *b = malloc(nb * 4), *c = malloc(nc * 4);
  for (size_t i = 0; i < na; i++) a[i] = (float)((int32_t)next32() >> 8) / 8388608.0f;
  for (size_t i = 0; i < nb; i++) b[i] = (float)((int32_t)next32() >> 8) / 8388608.0f;
  for (size_t i = 0; i < nc; i++) c[i] = (float)((int32_t)next32() >> 8) / 8388608.0f;
  RtFeed f[3] = {{"a", a}, {"b", b}, {"c", c}};
  static const char *outs[3] = {"d_shared", "d_batched", "d_at"};
  for (int be = 0; be < 2; be++) {
    RtRank r = rt_rank_single();
    RtExecOpts o = {.backend = be ? RT_BACKEND_LLVM : RT_BACKEND_REF, .threads = 2};
    RtProgram *p = rt_program_new_opts(m, &r, &o, err, sizeof err);
    CHECK(p != NULL, "program: %s", err);
    if (!p) continue;
    CHECK(rt_run_block(p, 0, f, 3, NULL, err, sizeof err) == 0, "run: %s", err);
    double loss = 0, d[3] = {1, 1, 1};
    rt_output(p, "loss", &loss);
    for (int k = 0; k < 3; k++) {
      rt_output(p, outs[k], &d[k]);
      CHECK(d[k] == 0, "%s backend: the 16-bit matmul (%s) differs from cast + f32 matmul + cast: sum of squares %g",
            be ? "llvm" : "ref", outs[k], d[k]);
    }
    CHECK(loss > 1, "real products: sum of squares %g", loss);
    printf("16-bit matmul on %s: bit for bit cast + sgemm + cast (shared b -> bf16, batched b^T -> f32, a^T b -> f32; "
           "K 640), products' sum of squares %.6g\n", be ? "llvm" : "ref", loss);
    rt_program_free(p);
  }
  free(a), free(b), free(c);
  ir_module_free(m);
}

int main(void) {
  test_conversions();
  test_ir();
  test_kernels();
  test_matmul16();
  return check_exit("bf16");
}
