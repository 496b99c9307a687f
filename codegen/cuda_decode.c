/* cuda_decode.c - the CUDA library kernels of the generation ops pass
 * decode emits (kv_write, slice_at, attn_cached; rope_at is rope's kernel
 * with an offset, cuda_lib.c).  They compute what runtime/cpu/ops_decode.c
 * computes.  Same contract as cg_cuda_lib_kernel (cuda.h); the buffers are
 * the operands in order, then the result or (kv_write) the cache state.
 *
 * The position is the block's input "pos", an i32 scalar in device
 * memory, read by every thread.  The CPU refuses a position past the
 * cache with an error; a kernel cannot stop the run, so kv_write then
 * writes nothing and slice_at / attn_cached write NaN (the next token's
 * logits are NaN: generation stops there, and the host never asks for
 * positions past seq_len anyway: generate.c checks the prompt and
 * --max-tokens against it first).
 *
 *   kv_write     one thread per element of x: cache[o, pos + t, inner] = x[o, t, inner]
 *   slice_at     one thread per element of y: y[o, t, inner] = x[o, pos + t, inner]
 *   attn_cached  one block (128 threads) per query row (b, h, i): the
 *                scores of keys first .. pos + i in shared memory (the
 *                cache length times 8 bytes, at most 40 KiB), their max and
 *                sum by block reductions (the prelude's ts_block_max /
 *                ts_block_sum), then each thread a dim of the output,
 *                summing over the keys in order; in double, as the CPU. */
#include "cuda_priv.h"

int cg_cuda_decode_op(IrOp op) {
  return op == IR_OP_KV_WRITE || op == IR_OP_SLICE_AT || op == IR_OP_ATTN_CACHED;
}

#define DECODE_SMEM_MAX (40 * 1024)

static const char *ftype(IrDtype t) { return t == IR_F64 ? "double" : "float"; }

/* Rows before axis (outer), the elements after it (inner) of t. */
static void around(const IrType *t, int ax, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < ax; d++) *outer *= t->dim[d];
  for (int d = ax + 1; d < t->rank; d++) *inner *= t->dim[d];
}

int cg_cuda_decode_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                          CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  const IrType *xt = &b->nodes[nd->in[0]].type;
  if (!ir_dtype_is_float(xt->dtype)) { snprintf(why, whylen, "needs f32 or f64"); return 1; }
  const char *T = ftype(xt->dtype);
  switch (nd->op) {
  case IR_OP_KV_WRITE:     /* b0 x, b1 pos, b2 cache state */
  case IR_OP_SLICE_AT: {   /* b0 x, b1 pos, b2 y */
    int kv = nd->op == IR_OP_KV_WRITE;
    const IrType *big = kv ? &m->states.a[nd->ia[0]].type : xt, *small = kv ? xt : &nd->type;
    int ax = (int)(kv ? nd->ia[1] : nd->ia[0]);
    if (ax < 0 || ax >= big->rank || big->rank != small->rank || big->dtype != small->dtype) {
      snprintf(why, whylen, "the slice does not fit the tensor along axis %d", ax);
      return 1;
    }
    int64_t outer, inner, n = small->dim[ax], L = big->dim[ax], cnt = ir_type_numel(small);
    around(small, ax, &outer, &inner);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  const long long pos = ((const int *)a.b[1])[0];\n"
                   "  %s *y = (%s *)a.b[2];\n  const int bad = pos < 0 || pos + %lldLL > %lldLL;\n",
              T, T, T, T, (long long)n, (long long)L);
    CG_CUDA_GRID_LOOP(src, "e", cnt);
    sb_printf(src, "    const long long in = e %% %lldLL, t = e / %lldLL %% %lldLL, o = e / %lldLL;\n",
              (long long)inner, (long long)inner, (long long)n, (long long)(n * inner));
    if (kv)
      sb_printf(src, "    if (!bad) y[(o * %lldLL + pos + t) * %lldLL + in] = x[e];\n  }\n}\n", (long long)L,
                (long long)inner);
    else
      sb_printf(src, "    y[e] = bad ? (%s)TS_NAN : x[(o * %lldLL + pos + t) * %lldLL + in];\n  }\n}\n", T,
                (long long)L, (long long)inner);
    cg_cuda_launch(&l[0], name, 0, cnt, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_ATTN_CACHED: {   /* b0 q[B, Hq, Tq, D], b1 k, b2 v [B, Hkv, Tk, D], b3 pos, [b4 slopes,] then y */
    const IrType *kt = &b->nodes[nd->in[1]].type;
    if (xt->rank != 4 || kt->rank != 4 || kt->dtype != xt->dtype || kt->dim[1] < 1 || xt->dim[1] % kt->dim[1]) {
      snprintf(why, whylen, "q and k are not [B, H, T, D] of one float dtype");
      return 1;
    }
    int64_t B = xt->dim[0], Hq = xt->dim[1], Tq = xt->dim[2], D = xt->dim[3], Hkv = kt->dim[1], Tk = kt->dim[2];
    if (Tk * 8 > DECODE_SMEM_MAX) {
      snprintf(why, whylen, "a cache of %lld positions: the scores need %lld bytes of shared memory (at most %d)",
               (long long)Tk, (long long)(Tk * 8), DECODE_SMEM_MAX);
      return 1;
    }
    char sc[40], alibi[200] = "";
    cg_cuda_dlit(sc, sizeof sc, nd->fa[0]);
    int64_t rows = B * Hq * Tq;
    int by = nd->nin;   /* y's slot: after the operands */
    if (nd->nin == 5) {   /* ALiBi: the slope of local query head h by its global head (cuda_attn.c's _hpos) */
      const IrType *st = &b->nodes[nd->in[4]].type;
      if ((st->dtype != IR_F32 && st->dtype != IR_F64) || st->rank != 1) {
        snprintf(why, whylen, "the ALiBi slopes must be f32 or f64 [heads]");
        return 1;
      }
      char fn[128];
      snprintf(fn, sizeof fn, "%s_hpos", name);
      cg_cuda_print_pos(m, src, fn, b->nodes[nd->in[0]].sh.split[1], Hq, -1);
      snprintf(alibi, sizeof alibi, " - (double)((const %s *)a.b[4])[%s(a.run, h)] * (double)(qp - t)", ftype(st->dtype),
               fn);
    }
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src,
              "  const %s *q = (const %s *)a.b[0], *k = (const %s *)a.b[1], *v = (const %s *)a.b[2];\n"
              "  const long long pos = ((const int *)a.b[3])[0];\n"
              "  %s *y = (%s *)a.b[%d];\n"
              "  __shared__ double sc[%lld];\n"
              "  const int bad = pos < 0 || pos + %lldLL > %lldLL;\n"
              "  for (long long r = blockIdx.x; r < %lldLL; r += gridDim.x) {   /* r = (b * Hq + h) * Tq + i */\n"
              "    const long long i = r %% %lldLL, bh = r / %lldLL, h = bh %% %lldLL, bb = bh / %lldLL;\n"
              "    const long long qp = pos + i, kv = bb * %lldLL + h / %lldLL, qo = r * %lldLL, ko = kv * %lldLL;\n"
              "    const long long first = %lldLL > 0 && qp - %lldLL + 1 > 0 ? qp - %lldLL + 1 : 0;\n"
              "    const long long last = bad ? first - 1 : qp;\n"
              "    double mx = -TS_INF;\n"
              "    for (long long t = first + threadIdx.x; t <= last; t += blockDim.x) {\n"
              "      double s = 0;\n"
              "      for (long long d = 0; d < %lldLL; d++) s += (double)q[qo + d] * (double)k[ko + t * %lldLL + d];\n"
              "      sc[t] = s * %s%s;\n"
              "      mx = ts_maximum(mx, sc[t]);\n"
              "    }\n"
              "    mx = ts_block_max(mx);\n"
              "    double l = 0;\n"
              "    for (long long t = first + threadIdx.x; t <= last; t += blockDim.x) {\n"
              "      const double p = exp(sc[t] - mx);\n"
              "      sc[t] = p;\n"
              "      l += p;\n"
              "    }\n"
              "    l = ts_block_sum(l);\n"
              "    for (long long d = threadIdx.x; d < %lldLL; d += blockDim.x) {\n"
              "      double acc = 0;\n"
              "      for (long long t = first; t <= last; t++) acc += sc[t] * (double)v[ko + t * %lldLL + d];\n"
              "      y[qo + d] = bad ? (%s)TS_NAN : (%s)(acc / l);\n"
              "    }\n"
              "    __syncthreads();   /* the next row's scores overwrite sc */\n"
              "  }\n}\n",
              T, T, T, T, T, T, by, (long long)Tk, (long long)Tq, (long long)Tk, (long long)rows, (long long)Tq,
              (long long)Tq, (long long)Hq, (long long)Hq, (long long)Hkv, (long long)(Hq / Hkv), (long long)D,
              (long long)(Tk * D), (long long)nd->ia[0], (long long)nd->ia[0], (long long)nd->ia[0], (long long)D,
              (long long)D, sc, alibi, (long long)D, (long long)D, T, T);
    l[0].threads = 128;
    snprintf(l[0].name, sizeof l[0].name, "%s_0", name);
    l[0].blocks = rows < 1 ? 1 : rows > 65535LL * 32 ? 65535LL * 32 : rows;
    *nl = 1;
    return 0;
  }
  default:
    snprintf(why, whylen, "%s is not a generation op", ir_ops[nd->op].name);
    return 1;
  }
}
