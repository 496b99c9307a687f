/* cuda_fp8.c - the CUDA kernels of --fp8's ops (library kernels, cuda.h's
 * cg_cuda_lib_kernel contract; docs/precision.md "FP8"): quant8, amax_acc,
 * fp8_scale, a cast into or out of an fp8 type, and the byte copy of an
 * fp8 reshape.  Each computes what its
 * reference kernel (runtime/cpu/ops_ref.c) computes, bit for bit: the
 * conversions are runtime/cpu/half.h's (cg_cuda_fp8_prelude), the scale
 * update rounds at the same points.  matmul8 is cuBLASLt's fp8 GEMM
 * (runtime/device/dev_cublaslt.c); its kernels here are the transposes
 * into the TN form cuBLASLt requires (cg_cuda_mm8_b_offset).
 *
 * fp8 values are bytes (`unsigned char`); the arithmetic is f32. */
#include "cuda_priv.h"
#include <math.h>

/* The conversions, as runtime/cpu/half.h's ts_f8_to_f32 / ts_f32_to_f8
 * (bias, mantissa bits, the largest finite value's f32 bits, its code and
 * the NaN code per format), in integer arithmetic so that no compiler
 * flag (fast math, FMA contraction) can change a rounding: round to
 * nearest even, saturate to the largest finite value (infinity included:
 * TE's __NV_SATFINITE), NaN kept with its sign, subnormals kept. */
static const char *const fp8_prelude =
    "/* fp8 <-> f32 (codegen/cuda_fp8.c) as runtime/cpu/half.h: E4M3 (bias 7,\n"
    " * 3 mantissa bits, max 448, S.1111.111 NaN) and E5M2 (bias 15, IEEE) */\n"
    "static __device__ __forceinline__ float ts_f8_f32(unsigned c, int mbits, int bias) {\n"
    "  const int ebits = 7 - mbits;\n"
    "  const unsigned sign = (c & 0x80u) << 24, e = (c >> mbits) & ((1u << ebits) - 1u), m = c & ((1u << mbits) - 1u);\n"
    "  if (e == 0)   /* subnormal: m * 2^(1 - bias - mbits), exact */\n"
    "    return __uint_as_float(__float_as_uint((float)m * __uint_as_float((unsigned)(128 - bias - mbits) << 23)) | sign);\n"
    "  if (ebits == 4 && e == 15 && m == 7) return __uint_as_float(sign | 0x7fc00000u);\n"
    "  if (ebits == 5 && e == 31) return __uint_as_float(sign | (m ? 0x7fc00000u | (m << 21) : 0x7f800000u));\n"
    "  return __uint_as_float(sign | ((e - (unsigned)bias + 127u) << 23) | (m << (23 - mbits)));\n"
    "}\n"
    "static __device__ __forceinline__ unsigned char ts_f32_f8(float f, int mbits, int bias, unsigned maxbits,\n"
    "                                                          unsigned maxcode, unsigned nancode) {\n"
    "  const unsigned x = __float_as_uint(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;\n"
    "  if (ax > 0x7f800000u) return (unsigned char)(sign | nancode);\n"
    "  if (ax >= maxbits) return (unsigned char)(sign | maxcode);\n"
    "  const int e = (int)(ax >> 23) - 127;\n"
    "  if (e < 1 - bias) {   /* below the smallest normal: round(|f| * 2^(bias - 1 + mbits)) to even */\n"
    "    const unsigned mant = (ax & 0x7fffffu) | (ax >> 23 ? 0x800000u : 0u);\n"
    "    const int sh = 23 - ((ax >> 23 ? e : -126) + bias - 1 + mbits);   /* >= 21 */\n"
    "    if (sh > 24) return (unsigned char)sign;   /* below half the smallest subnormal */\n"
    "    const unsigned q = mant >> sh, rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);\n"
    "    return (unsigned char)(sign | (q + (rem > half || (rem == half && (q & 1u)))));\n"
    "  }\n"
    "  const unsigned sh = 23u - (unsigned)mbits;\n"
    "  unsigned r = ax - ((unsigned)(127 - bias) << 23);\n"
    "  r += (1u << (sh - 1)) - 1u + ((r >> sh) & 1u);\n"
    "  return (unsigned char)(sign | (r >> sh));\n"
    "}\n"
    "static __device__ __forceinline__ float ts_f8e4m3_f32(unsigned char c) { return ts_f8_f32(c, 3, 7); }\n"
    "static __device__ __forceinline__ float ts_f8e5m2_f32(unsigned char c) { return ts_f8_f32(c, 2, 15); }\n"
    "static __device__ __forceinline__ unsigned char ts_f32_f8e4m3(float f) { return ts_f32_f8(f, 3, 7, 0x43e00000u, 0x7eu, 0x7fu); }\n"
    "static __device__ __forceinline__ unsigned char ts_f32_f8e5m2(float f) { return ts_f32_f8(f, 2, 15, 0x47600000u, 0x7bu, 0x7eu); }\n";

const char *cg_cuda_fp8_prelude(void) { return fp8_prelude; }

int cg_cuda_fp8_node(const IrBlock *b, int i) {
  const IrNode *nd = &b->nodes[i];
  switch (nd->op) {
  case IR_OP_QUANT8: case IR_OP_AMAX_ACC: case IR_OP_FP8_SCALE: case IR_OP_MATMUL8: return 1;
  case IR_OP_CAST: return ir_dtype_is_8(nd->type.dtype) || ir_dtype_is_8(b->nodes[nd->in[0]].type.dtype);
  case IR_OP_RESHAPE: return ir_dtype_is_8(nd->type.dtype);   /* the kernel IR has no byte type */
  default: return 0;
  }
}

/* The C expression reading element e of a float operand of dtype d from
 * pointer p (as f32), or NULL: d has no fp8 kernel form. */
static const char *load_f32(IrDtype d) {
  switch (d) {
  case IR_F32: return "%s[e]";
  case IR_BF16: return "ts_bf16_f32(%s[e])";
  case IR_F8E4M3: return "ts_f8e4m3_f32(%s[e])";
  case IR_F8E5M2: return "ts_f8e5m2_f32(%s[e])";
  default: return NULL;
  }
}
static const char *ctype8(IrDtype d) {
  return d == IR_F32 ? "float" : d == IR_BF16 ? "unsigned short" : "unsigned char";
}
static const char *store_f32(IrDtype d) {
  return d == IR_F32 ? "" : d == IR_BF16 ? "ts_f32_bf16" : d == IR_F8E4M3 ? "ts_f32_f8e4m3" : "ts_f32_f8e5m2";
}

/* quant8 (b0 x, b1 scale[], b2 y) and cast (b0 x, b1 y): y = enc(x [* scale]) */
static int convert(const IrBlock *b, const IrNode *nd, const char *name, StrBuf *src, CgCudaLaunch *l, int *nl,
                   char *why, size_t whylen) {
  IrDtype xd = b->nodes[nd->in[0]].type.dtype, yd = nd->type.dtype;
  const char *ld = load_f32(xd);
  if (!ld || !load_f32(yd) || (nd->op == IR_OP_QUANT8 && (!ir_dtype_is_8(yd) || ir_dtype_is_8(xd)))) {
    snprintf(why, whylen, "%s from %s to %s (the fp8 kernels convert between f32 / bf16 and f8e4m3 / f8e5m2)",
             ir_ops[nd->op].name, ir_dtype_name(xd), ir_dtype_name(yd));
    return 1;
  }
  int64_t n = ir_type_numel(&nd->type);
  int q = nd->op == IR_OP_QUANT8;
  CG_CUDA_HEAD(src, name, 0);
  sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[%d];\n", ctype8(xd), ctype8(xd), ctype8(yd),
            ctype8(yd), q ? 2 : 1);
  if (q) sb_puts(src, "  const float s = ((const float *)a.b[1])[0];\n");
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_puts(src, "    const float v = ");
  sb_printf(src, ld, "x");
  /* quant8: the product in f32 (one rounding), as TE's cast kernel */
  sb_printf(src, "%s;\n    y[e] = %s(v);\n  }\n}\n", q ? " * s" : "", store_f32(yd));
  cg_cuda_launch(&l[0], name, 0, n, 256);
  *nl = 1;
  return 0;
}

/* amax_acc (b0 x, b1 state[] f32): state = max(state, max |x|), NaN kept.
 * Non-negative floats order as their bits, and every NaN is made the one
 * quiet NaN 0x7fc00000 (the reference's NAN), which is above infinity:
 * so the maximum is an integer maximum of the bits -- a block reduction
 * (warp shuffles, then the warps' partials) and one atomicMax per block
 * into the state, in any order the same bits. */
static int amax(const IrBlock *b, const IrNode *nd, const char *name, StrBuf *src, CgCudaLaunch *l, int *nl,
                char *why, size_t whylen) {
  IrDtype xd = b->nodes[nd->in[0]].type.dtype;
  if (xd != IR_F32 && xd != IR_BF16) {
    snprintf(why, whylen, "amax_acc of %s (the kernel reads f32 or bf16)", ir_dtype_name(xd));
    return 1;
  }
  int64_t n = ir_type_numel(&b->nodes[nd->in[0]].type);
  sb_printf(src, "\nextern \"C\" __global__ void __launch_bounds__(256) %s_0(TsArgs a) {\n", name);
  sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  int *st = (int *)a.b[1];\n  int m = 0;\n", ctype8(xd),
            ctype8(xd));
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_puts(src, "    const float v = ");
  sb_printf(src, load_f32(xd), "x");
  sb_puts(src, ";\n    unsigned u = __float_as_uint(v) & 0x7fffffffu;\n    if (u > 0x7f800000u) u = 0x7fc00000u;\n"
               "    m = (int)u > m ? (int)u : m;\n  }\n"
               "  for (int o = 16; o > 0; o >>= 1) {\n    const int t = __shfl_xor_sync(0xffffffffu, m, o);\n"
               "    m = t > m ? t : m;\n  }\n"
               "  __shared__ int part[8];\n  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;\n"
               "  __syncthreads();\n  if (threadIdx.x == 0) {\n"
               "    for (int w = 1; w < (int)(blockDim.x >> 5); w++) m = part[w] > m ? part[w] : m;\n"
               "    atomicMax(st, m);\n  }\n}\n");
  cg_cuda_launch(&l[0], name, 0, n, 256);
  if (l[0].blocks > 1024) l[0].blocks = 1024;   /* the grid-stride loop covers the rest */
  *nl = 1;
  return 0;
}

/* fp8_scale (b0 amax[], b1 hist[len], b2 scale[], b3 sinv[]), one block:
 * the history rolls (every thread reads its old values before any is
 * written), a = the history's maximum (algo 0, NaN-propagating) or the
 * new amax (algo 1), then rt_fp8_scale's arithmetic: scale =
 * (float)(fmax / (double)a / 2^margin), sinv = 1.0f / scale, both kept
 * when a or scale is not finite or not > 0. */
static int scale(const IrModule *m, const IrBlock *b, const IrNode *nd, const char *name, StrBuf *src,
                 CgCudaLaunch *l, int *nl, char *why, size_t whylen) {
  const IrState *h = &m->states.a[nd->ia[0]];
  int64_t len = ir_type_numel(&h->type);
  IrDtype ad = b->nodes[nd->in[0]].type.dtype;
  if (len < 1 || h->type.dtype != IR_F32 || (ad != IR_F32 && ad != IR_BF16)) {
    snprintf(why, whylen, "fp8_scale with history @%s %s of %lld (f32, at least 1) and an amax of %s", h->name,
             ir_dtype_name(h->type.dtype), (long long)len, ir_dtype_name(ad));
    return 1;
  }
  enum { T = 256 };
  int64_t per = (len + T - 1) / T;
  if (per > 64) {
    snprintf(why, whylen, "an amax history of %lld (the kernel keeps at most %d per block)", (long long)len, 64 * T);
    return 1;
  }
  char fmax[40], p2[40];
  cg_cuda_dlit(fmax, sizeof fmax, nd->fa[1]);
  cg_cuda_dlit(p2, sizeof p2, pow(2.0, nd->fa[0]));
  sb_printf(src, "\nextern \"C\" __global__ void __launch_bounds__(%d) %s_0(TsArgs a) {\n", (int)T, name);
  sb_printf(src, "  const %s *am = (const %s *)a.b[0];\n  float *h = (float *)a.b[1], *sc = (float *)a.b[2], "
                 "*si = (float *)a.b[3];\n  const float amax = ", ctype8(ad), ctype8(ad));
  sb_printf(src, ad == IR_F32 ? "am[0]" : "ts_bf16_f32(am[0])");
  sb_printf(src, ";\n  float old[%lld];\n", (long long)per);
  sb_printf(src, "#pragma unroll\n  for (int k = 0; k < %lld; k++) {\n    const long long i = threadIdx.x + (long long)k * %d;\n"
                 "    old[k] = i == 0 ? amax : i < %lldLL ? h[i - 1] : 0.0f;\n  }\n  __syncthreads();\n"
                 "  float mx = -(float)TS_INF;\n#pragma unroll\n"
                 "  for (int k = 0; k < %lld; k++) {\n    const long long i = threadIdx.x + (long long)k * %d;\n"
                 "    if (i < %lldLL) {\n      h[i] = old[k];\n      mx = (float)ts_maximum(mx, old[k]);\n    }\n  }\n",
            (long long)per, (int)T, (long long)len, (long long)per, (int)T, (long long)len);
  sb_printf(src, "  mx = ts_block_maxf(mx);\n  if (threadIdx.x != 0) return;\n  const float am1 = %s;\n",
            nd->ia[3] == 1 ? "amax" : "mx");
  sb_printf(src, "  if (!(am1 > 0) || isinf(am1) || isnan(am1)) return;\n"
                 "  const float s = (float)(%s / (double)am1 / %s);\n"
                 "  if (isinf(s) || isnan(s) || !(s > 0)) return;\n  sc[0] = s;\n  si[0] = 1.0f / s;\n}\n",
            fmax, p2);
  cg_cuda_launch(&l[0], name, 0, T, T);
  *nl = 1;
  return 0;
}

/* matmul8 (b0 a, b1 b, b2 sa, b3 sb, b4 y, b5 scratch): the operands the
 * GEMM cannot read as stored, transposed into the scratch, one byte per
 * element (matmul's shapes: A [batch..., r, c], B [r, c] shared or with
 * A's batch dims).  Plain element copies: a tiled transpose through shared
 * memory is the optimization not made yet. */
static void transpose(StrBuf *src, const char *name, int k, int buf, int64_t off, int64_t items, int64_t R, int64_t C,
                      CgCudaLaunch *l) {
  CG_CUDA_HEAD(src, name, k);
  sb_printf(src, "  const unsigned char *x = (const unsigned char *)a.b[%d];\n"
                 "  unsigned char *y = (unsigned char *)a.b[5] + %lldLL;\n", buf, (long long)off);
  CG_CUDA_GRID_LOOP(src, "e", items * R * C);
  /* y[t][c][r] = x[t][r][c], e walking y */
  sb_printf(src, "    const long long t = e / %lldLL, c = e / %lldLL %% %lldLL, r = e %% %lldLL;\n"
                 "    y[e] = x[(t * %lldLL + r) * %lldLL + c];\n  }\n}\n",
            (long long)(R * C), (long long)R, (long long)C, (long long)R, (long long)R, (long long)C);
  cg_cuda_launch(l, name, k, items * R * C, 256);
}

static int mm8(const IrBlock *b, const IrNode *nd, const char *name, StrBuf *src, CgCudaLaunch *l, int *nl,
               int64_t *scratch, char *why, size_t whylen) {
  const IrType *at = &b->nodes[nd->in[0]].type, *bt = &b->nodes[nd->in[1]].type;
  int ta = nd->ia[0] != 0, tb = nd->ia[1] != 0, ra = at->rank, rb = bt->rank;
  if (ra < 2 || rb < 2 || (rb != 2 && rb != ra)) {
    snprintf(why, whylen, "matmul8 of ranks %d and %d (the GEMM takes [..., r, c] @ [r, c] or equal batch dims)", ra, rb);
    return 1;
  }
  int64_t batch = 1, M = ta ? at->dim[ra - 1] : at->dim[ra - 2], K = ta ? at->dim[ra - 2] : at->dim[ra - 1];
  int64_t N = tb ? bt->dim[rb - 2] : bt->dim[rb - 1];
  for (int d = 0; d < ra - 2; d++) batch *= at->dim[d];
  int64_t na = ta ? batch * M * K : 0, off = cg_cuda_mm8_b_offset(na);
  *nl = 0;
  if (ta) transpose(src, name, (*nl)++, 0, 0, batch, K, M, &l[0]);   /* A [t][K][M] -> A' [t][M][K] */
  if (!tb) {
    int64_t items = rb == 2 ? 1 : batch;
    transpose(src, name, *nl, 1, off, items, K, N, &l[*nl]);   /* B [t][K][N] -> B' [t][N][K] */
    (*nl)++;
    *scratch = off + items * K * N;
  } else {
    *scratch = na;
  }
  return 0;
}

/* reshape of an fp8 value (b0 x, b1 y): the bytes as they are (the
 * executor makes it a view when the memory plan lets it: then no launch) */
static int copy8(const IrNode *nd, const char *name, StrBuf *src, CgCudaLaunch *l, int *nl) {
  int64_t n = ir_type_numel(&nd->type);
  CG_CUDA_HEAD(src, name, 0);
  sb_puts(src, "  const unsigned char *x = (const unsigned char *)a.b[0];\n  unsigned char *y = (unsigned char *)a.b[1];\n");
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_puts(src, "    y[e] = x[e];\n  }\n}\n");
  cg_cuda_launch(&l[0], name, 0, n, 256);
  *nl = 1;
  return 0;
}

int cg_cuda_fp8_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src, CgCudaLaunch *l,
                       int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  switch (nd->op) {
  case IR_OP_QUANT8: case IR_OP_CAST: return convert(b, nd, name, src, l, nl, why, whylen);
  case IR_OP_AMAX_ACC: return amax(b, nd, name, src, l, nl, why, whylen);
  case IR_OP_FP8_SCALE: return scale(m, b, nd, name, src, l, nl, why, whylen);
  case IR_OP_MATMUL8: return mm8(b, nd, name, src, l, nl, scratch, why, whylen);
  case IR_OP_RESHAPE: return copy8(nd, name, src, l, nl);
  default: snprintf(why, whylen, "not an fp8 op"); return 1;
  }
}
