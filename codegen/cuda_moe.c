/* cuda_moe.c - the mixture-of-experts kernels of the CUDA library
 * (cuda_priv.h; docs/cuda.md "Mixture of experts"): routing (topk_mask,
 * capacity_mask, moe_counts), token dispatch (moe_perm, moe_unperm,
 * moe_gate_grad) and the grouped matmuls (gmm, gmm_dw).  They compute what
 * runtime/cpu/ops_route.c and ops_moe.c compute, in the same order where the
 * order decides the bits (capacity in token order, unperm's sum over
 * experts in expert order); dot products accumulate in double.
 *
 * The token layout (expert 0's routed tokens in token order, then expert
 * 1's, ...) is data-dependent, so perm / unperm / gate_grad start with a
 * one-block kernel writing the row of every (token, expert) pair into the
 * scratch buffer (per-expert counts, their prefix sum, then one thread per
 * expert walking the tokens).  gmm / gmm_dw likewise start with the group
 * offsets.  Where the reference stops with an error (more routed pairs
 * than rows, a negative count, groups larger than the rows) the device
 * cannot: those results are NaN instead, so a loss shows it.
 *
 * The grouped matmuls are one thread per output element with a double
 * accumulator (CUDA cores): correct for any group sizes, but not
 * cuBLASLt's speed; a grouped GEMM is the next step once a GPU can
 * measure it. */
#include "cuda_priv.h"

int cg_cuda_moe_op(IrOp op) {
  switch (op) {
  case IR_OP_TOPK_MASK: case IR_OP_CAPACITY_MASK: case IR_OP_MOE_COUNTS: case IR_OP_MOE_PERM: case IR_OP_MOE_UNPERM:
  case IR_OP_MOE_GATE_GRAD: case IR_OP_GMM: case IR_OP_GMM_DW:
    return 1;
  default:
    return 0;
  }
}

static const char *ctype(IrDtype t) { return t == IR_F64 ? "double" : "float"; }

/* Kernel k: the row of each (t, e) of routed (buffer ri, [N, E]) in the
 * token layout of R rows into map (the scratch, buffer sc: int64 [N * E],
 * then [E] of per-expert bases): -1 where not routed, -2 where the row
 * would be past R (the reference's error). */
static void print_token_rows(StrBuf *s, const char *name, int k, const char *T, int ri, int sc, int64_t N, int64_t E,
                             int64_t R) {
  CG_CUDA_HEAD(s, name, k);
  sb_printf(s, "  const %s *rt = (const %s *)a.b[%d];\n  long long *map = (long long *)a.b[%d], *base = map + %lldLL;\n",
            T, T, ri, sc, (long long)(N * E));
  sb_printf(s, "  if (blockIdx.x != 0) return;\n"
               "  for (long long e = threadIdx.x; e < %lldLL; e += blockDim.x) {\n    long long c = 0;\n"
               "    for (long long t = 0; t < %lldLL; t++) c += rt[t * %lldLL + e] != 0;\n    base[e] = c;\n  }\n"
               "  __syncthreads();\n"
               "  if (threadIdx.x == 0) {\n    long long sum = 0;\n"
               "    for (long long e = 0; e < %lldLL; e++) {\n      const long long c = base[e];\n      base[e] = sum;\n"
               "      sum += c;\n    }\n  }\n  __syncthreads();\n"
               "  for (long long e = threadIdx.x; e < %lldLL; e += blockDim.x) {\n    long long row = base[e];\n"
               "    for (long long t = 0; t < %lldLL; t++) {\n      const long long r = rt[t * %lldLL + e] != 0 ? row++ : -1;\n"
               "      map[t * %lldLL + e] = r >= %lldLL ? -2 : r;\n    }\n  }\n}\n",
            (long long)E, (long long)N, (long long)E, (long long)E, (long long)E, (long long)N, (long long)E,
            (long long)E, (long long)R);
}

/* Kernel k: the group offsets of cnt (buffer 2, i32 [S, G]) into the
 * scratch (buffer sc: int64 off[G + 1], then a flag: 1 when a count is
 * negative or the groups hold more than R rows). */
static void print_group_offsets(StrBuf *s, const char *name, int k, int sc, int64_t S, int64_t G, int64_t R) {
  CG_CUDA_HEAD(s, name, k);
  sb_printf(s, "  const int *cnt = (const int *)a.b[2];\n  long long *off = (long long *)a.b[%d];\n"
               "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n  long long o = 0, bad = 0;\n"
               "  for (long long g = 0; g < %lldLL; g++) {\n    off[g] = o;\n"
               "    for (long long q = 0; q < %lldLL; q++) {\n      const int c = cnt[q * %lldLL + g];\n"
               "      bad |= c < 0;\n      o += c;\n    }\n  }\n"
               "  off[%lld] = o;\n  off[%lld] = bad || o > %lldLL;\n}\n",
            sc, (long long)G, (long long)S, (long long)G, (long long)G, (long long)(G + 1), (long long)R);
}

int cg_cuda_moe_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src, CgCudaLaunch *l,
                       int *nl, int64_t *scratch, char *why, size_t whylen) {
  (void)m;
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  const IrType *t0 = &b->nodes[nd->in[0]].type;
  IrDtype dt = nd->op == IR_OP_MOE_COUNTS ? t0->dtype : nd->type.dtype;
  if (dt != IR_F32 && dt != IR_F64) { snprintf(why, whylen, "needs f32 or f64"); return 1; }
  const char *T = ctype(dt);
  switch (nd->op) {
  case IR_OP_TOPK_MASK: {   /* b0 x[rows, D], b1 y: 1 at the k largest of each row (ties: lower index) */
    int64_t D = t0->rank ? t0->dim[t0->rank - 1] : 1, n = ir_type_numel(t0), K = nd->ia[0];
    if (t0->rank < 1 || K < 1 || K > D) { snprintf(why, whylen, "k outside [1, %lld]", (long long)D); return 1; }
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n", T, T, T, T);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_printf(src, "    const long long j = e %% %lldLL, r0 = e - j;\n    const %s xj = x[e];\n    long long beat = 0;\n"
                   "    for (long long q = 0; q < %lldLL && beat < %lldLL; q++) {\n      const %s xq = x[r0 + q];\n"
                   "      beat += xq > xj || (xq == xj && q < j);\n    }\n    y[e] = beat < %lldLL ? (%s)1 : (%s)0;\n  }\n}\n",
              (long long)D, T, (long long)D, (long long)K, T, (long long)K, T, T);
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_CAPACITY_MASK: {   /* b0 keep[rows, E], b1 y: per column the first cap nonzero rows */
    int64_t E = t0->rank ? t0->dim[t0->rank - 1] : 1, rows = ir_type_numel(t0) / (E ? E : 1), cap = nd->ia[0];
    if (t0->rank < 1 || cap < 0) { snprintf(why, whylen, "bad capacity"); return 1; }
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n", T, T, T, T);
    CG_CUDA_GRID_LOOP(src, "e", E);
    sb_printf(src, "    long long used = 0;\n    for (long long r = 0; r < %lldLL; r++) {\n"
                   "      const int on = x[r * %lldLL + e] != 0 && used < %lldLL;\n      used += on;\n"
                   "      y[r * %lldLL + e] = (%s)on;\n    }\n  }\n}\n",
              (long long)rows, (long long)E, (long long)cap, (long long)E, T);
    cg_cuda_launch(&l[0], name, 0, E, 64);
    *nl = 1;
    return 0;
  }
  case IR_OP_MOE_COUNTS: {   /* b0 routed[N, E], b1 i32[1, E] */
    if (t0->rank != 2) { snprintf(why, whylen, "the routing mask must be [tokens, experts]"); return 1; }
    int64_t N = t0->dim[0], E = t0->dim[1];
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *rt = (const %s *)a.b[0];\n  int *c = (int *)a.b[1];\n", T, T);
    CG_CUDA_GRID_LOOP(src, "e", E);
    sb_printf(src, "    long long n = 0;\n    for (long long t = 0; t < %lldLL; t++) n += rt[t * %lldLL + e] != 0;\n"
                   "    c[e] = (int)n;\n  }\n}\n",
              (long long)N, (long long)E);
    cg_cuda_launch(&l[0], name, 0, E, 64);
    *nl = 1;
    return 0;
  }
  case IR_OP_MOE_PERM:        /* b0 x[N, D], b1 routed[N, E], b2 scale[N, E], b3 out[R, D] token layout */
  case IR_OP_MOE_UNPERM:      /* b0 y[R, D], b1 routed, b2 scale, b3 out[N, D] */
  case IR_OP_MOE_GATE_GRAD: { /* b0 y[R, D], b1 d[N, D], b2 routed, b3 out[N, E] */
    int ri = nd->op == IR_OP_MOE_GATE_GRAD ? 2 : 1;
    const IrType *rt = &b->nodes[nd->in[ri]].type;
    const IrType *yt = nd->op == IR_OP_MOE_PERM ? &nd->type : t0;
    if (rt->rank != 2 || yt->rank != 2 || rt->dtype != dt) { snprintf(why, whylen, "routing mask or rows not 2-D"); return 1; }
    int64_t N = rt->dim[0], E = rt->dim[1], R = yt->dim[0], D = yt->dim[1];
    *scratch = (N * E + E) * 8;
    print_token_rows(src, name, 0, T, ri, 4, N, E, R);
    cg_cuda_launch(&l[0], name, 0, 256, 256);
    CG_CUDA_HEAD(src, name, 1);
    sb_printf(src, "  const long long *map = (const long long *)a.b[4];\n  %s *out = (%s *)a.b[3];\n", T, T);
    if (nd->op == IR_OP_MOE_PERM) {
      CG_CUDA_GRID_LOOP(src, "e", R * D);
      sb_puts(src, "    out[e] = 0;\n  }\n}\n");
      cg_cuda_launch(&l[1], name, 1, R * D, 256);
      /* out[row(t, e)] = scale[t, e] * x[t] */
      CG_CUDA_HEAD(src, name, 2);
      sb_printf(src, "  const %s *x = (const %s *)a.b[0], *sc = (const %s *)a.b[2];\n"
                     "  const long long *map = (const long long *)a.b[4];\n  %s *out = (%s *)a.b[3];\n", T, T, T, T, T);
      CG_CUDA_GRID_LOOP(src, "i", N * E * D);
      sb_printf(src, "    const long long q = i %% %lldLL, te = i / %lldLL, t = te / %lldLL, r = map[te];\n"
                     "    if (r >= 0) out[r * %lldLL + q] = (%s)((double)sc[te] * (double)x[t * %lldLL + q]);\n  }\n}\n",
                (long long)D, (long long)D, (long long)E, (long long)D, T, (long long)D);
      cg_cuda_launch(&l[2], name, 2, N * E * D, 256);
      /* a pair past the rows (the kernel cannot fail as the CPU's does)
       * poisons row 0, after every row is written: a launch of its own, so
       * no thread of the scatter can overwrite the NaN (issue 25) */
      CG_CUDA_HEAD(src, name, 3);
      sb_printf(src, "  const long long *map = (const long long *)a.b[4];\n  %s *out = (%s *)a.b[3];\n"
                     "  if (blockIdx.x != 0) return;\n  double bad = 0;\n"
                     "  for (long long i = threadIdx.x; i < %lldLL; i += blockDim.x) bad = map[i] == -2 ? 1.0 : bad;\n"
                     "  if (ts_block_max(bad) > 0)\n"
                     "    for (long long q = threadIdx.x; q < %lldLL; q += blockDim.x) out[q] = (%s)TS_NAN;\n}\n",
                T, T, (long long)(N * E), (long long)D, T);
      cg_cuda_launch(&l[3], name, 3, 256, 256);
      *nl = 4;
      return 0;
    }
    if (nd->op == IR_OP_MOE_UNPERM) {   /* out[t] = sum over routed e, in order, of scale[t, e] * y[row(t, e)] */
      sb_printf(src, "  const %s *y = (const %s *)a.b[0], *sc = (const %s *)a.b[2];\n", T, T, T);
      CG_CUDA_GRID_LOOP(src, "i", N * D);
      sb_printf(src, "    const long long t = i / %lldLL, q = i %% %lldLL;\n    double acc = 0;\n"
                     "    for (long long e = 0; e < %lldLL; e++) {\n      const long long r = map[t * %lldLL + e];\n"
                     "      if (r >= 0) acc += (double)sc[t * %lldLL + e] * (double)y[r * %lldLL + q];\n"
                     "      else if (r == -2) acc = TS_NAN;\n    }\n    out[i] = (%s)acc;\n  }\n}\n",
                (long long)D, (long long)D, (long long)E, (long long)E, (long long)E, (long long)D, T);
      cg_cuda_launch(&l[1], name, 1, N * D, 256);
    } else {   /* out[t, e] = <y[row(t, e)], d[t]> where routed, else 0 */
      sb_printf(src, "  const %s *y = (const %s *)a.b[0], *d = (const %s *)a.b[1];\n", T, T, T);
      CG_CUDA_GRID_LOOP(src, "i", N * E);
      sb_printf(src, "    const long long t = i / %lldLL, r = map[i];\n    double dot = r == -2 ? TS_NAN : 0.0;\n"
                     "    if (r >= 0)\n      for (long long q = 0; q < %lldLL; q++) dot += (double)y[r * %lldLL + q] * (double)d[t * %lldLL + q];\n"
                     "    out[i] = (%s)dot;\n  }\n}\n",
                (long long)E, (long long)D, (long long)D, (long long)D, T);
      cg_cuda_launch(&l[1], name, 1, N * E, 256);
    }
    *nl = 2;
    return 0;
  }
  case IR_OP_GMM:      /* b0 a[R, K], b1 w[G, K, N] (tb: [G, N, K]), b2 cnt i32[S, G], b3 out[R, N] */
  case IR_OP_GMM_DW: { /* b0 a[R, K], b1 dy[R, N], b2 cnt, b3 out[G, K, N] */
    const IrType *t1 = &b->nodes[nd->in[1]].type, *ct = &b->nodes[nd->in[2]].type;
    if (t0->rank != 2 || ct->rank != 2 || ct->dtype != IR_I32 || (nd->op == IR_OP_GMM ? t1->rank != 3 : t1->rank != 2)) {
      snprintf(why, whylen, "operand ranks do not match");
      return 1;
    }
    int64_t R = t0->dim[0], K = t0->dim[1], S = ct->dim[0], G = ct->dim[1];
    *scratch = (G + 2) * 8;
    print_group_offsets(src, name, 0, 4, S, G, R);
    cg_cuda_launch(&l[0], name, 0, 32, 32);
    CG_CUDA_HEAD(src, name, 1);
    sb_printf(src, "  const %s *a0 = (const %s *)a.b[0], *b1 = (const %s *)a.b[1];\n  %s *out = (%s *)a.b[3];\n"
                   "  const long long *off = (const long long *)a.b[4];\n", T, T, T, T, T);
    if (nd->op == IR_OP_GMM) {
      int tb = nd->ia[0] != 0;
      int64_t N = tb ? t1->dim[1] : t1->dim[2];
      char widx[64];   /* w[g]'s element (k, n) */
      if (tb) snprintf(widx, sizeof widx, "n * %lldLL + k", (long long)K);
      else snprintf(widx, sizeof widx, "k * %lldLL + n", (long long)N);
      CG_CUDA_GRID_LOOP(src, "i", R * N);
      sb_printf(src, "    const long long r = i / %lldLL, n = i %% %lldLL;\n    long long g = 0;\n"
                     "    while (g < %lldLL && r >= off[g + 1]) g++;\n"
                     "    double acc = 0;\n"
                     "    if (g < %lldLL)\n      for (long long k = 0; k < %lldLL; k++)\n"
                     "        acc += (double)a0[r * %lldLL + k] * (double)b1[g * %lldLL + %s];\n"
                     "    out[i] = off[%lld] ? (%s)TS_NAN : (%s)acc;\n  }\n}\n",
                (long long)N, (long long)N, (long long)G, (long long)G, (long long)K, (long long)K,
                (long long)(K * N), widx, (long long)(G + 1), T, T);
      cg_cuda_launch(&l[1], name, 1, R * N, 256);
    } else {
      int64_t N = t1->dim[1], G3 = nd->type.rank == 3 ? nd->type.dim[0] : -1;
      if (G3 != G) { snprintf(why, whylen, "the result's groups differ from the counts'"); return 1; }
      CG_CUDA_GRID_LOOP(src, "i", G * K * N);
      sb_printf(src, "    const long long g = i / %lldLL, k = i / %lldLL %% %lldLL, n = i %% %lldLL;\n    double acc = 0;\n"
                     "    for (long long r = off[g]; r < off[g + 1]; r++) acc += (double)a0[r * %lldLL + k] * (double)b1[r * %lldLL + n];\n"
                     "    out[i] = off[%lld] ? (%s)TS_NAN : (%s)acc;\n  }\n}\n",
                (long long)(K * N), (long long)N, (long long)K, (long long)N, (long long)K, (long long)N,
                (long long)(G + 1), T, T);
      cg_cuda_launch(&l[1], name, 1, G * K * N, 256);
    }
    *nl = 2;
    return 0;
  }
  default:
    snprintf(why, whylen, "not a mixture-of-experts op");
    return -1;
  }
}
