/* cuda_lib.c - CUDA kernels for the ops the kernel IR does not express
 * (cg_cuda_lib_kernel, cuda.h), written per node: shapes, attributes and
 * the mesh's axis sizes are constants in the text; the rank's coordinates
 * come from the run block (a.run[CG_RUN_COORD + axis]).  Each computes
 * what its reference kernel (runtime/cpu/ops_ref_t.h) computes, in the same
 * order where the order decides the bits (the embedding's scatter-add
 * walks the ids serially per column, as the reference does).
 *
 * Ops: embedding, embedding_bwd, clip_coef, accum, zero, assign,
 * shard_slice, rope, take, onehot, pad_fill, and fp16's loss scaling
 * (nonfinite, scale_update: docs/precision.md "fp16: loss scaling"); the fused attention, its backward and the ring steps
 * are in cuda_attn.c, the mixture-of-experts ops in cuda_moe.c. */
#include "cuda_priv.h"

int cg_cuda_lib_op(IrOp op) {
  if (cg_cuda_attn_op(op) || cg_cuda_moe_op(op) || cg_cuda_decode_op(op)) return 1;
  switch (op) {
  case IR_OP_QUANT8: case IR_OP_AMAX_ACC: case IR_OP_FP8_SCALE:   /* cuda_fp8.c */
  case IR_OP_EMBEDDING: case IR_OP_EMBEDDING_BWD: case IR_OP_CLIP_COEF: case IR_OP_ACCUM: case IR_OP_ZERO:
  case IR_OP_ASSIGN: case IR_OP_SHARD_SLICE: case IR_OP_ROPE: case IR_OP_ROPE_AT: case IR_OP_TAKE: case IR_OP_ONEHOT:
  case IR_OP_PAD_FILL: case IR_OP_NONFINITE: case IR_OP_SCALE_UPDATE:
    return 1;
  default:
    return 0;
  }
}

/* 16-bit values are only moved (guard_16 below): their bits as unsigned short */
static const char *ctype(IrDtype t) {
  return t == IR_F64 ? "double" : t == IR_F32 ? "float" : ir_dtype_is_16(t) ? "unsigned short" : "int";
}

/* The ops here that only move or zero bits may take 16-bit values (the
 * update block's assign of a parameter's bf16 copy, a shard's slice); the
 * others compute, and have no 16-bit form: 1 with why. */
static int guard_16(const IrModule *m, const IrBlock *b, const IrNode *nd, char *why, size_t whylen) {
  int any16 = ir_dtype_is_16(nd->type.dtype);
  for (int k = 0; k < nd->nin; k++) any16 |= ir_dtype_is_16(b->nodes[nd->in[k]].type.dtype);
  if ((nd->op == IR_OP_ACCUM || nd->op == IR_OP_ASSIGN || nd->op == IR_OP_ZERO) &&
      ir_dtype_is_16(m->states.a[nd->ia[0]].type.dtype))
    any16 = 1;
  if (!any16 || nd->op == IR_OP_ASSIGN || nd->op == IR_OP_ZERO || nd->op == IR_OP_SHARD_SLICE) return 0;
  snprintf(why, whylen, "%s on 16-bit values has no CUDA kernel (the precision pass computes it in f32)",
           ir_ops[nd->op].name);
  return 1;
}

int cg_cuda_axis_size(const IrModule *m, int a) {
  const IrParallel *q = &m->par;
  int v = a == IR_AXIS_DP ? q->dp : a == IR_AXIS_PP ? q->pp : a == IR_AXIS_CP ? q->cp : a == IR_AXIS_EP ? q->ep : q->tp;
  return v > 1 ? v : 1;
}

/* The C expression of the rank's block index along a dim split by the
 * axes in mask (rt_shard_block: outer axis major), and the block count. */
static void block_expr(const IrModule *m, unsigned mask, char *buf, size_t n, int64_t *nblk) {
  int64_t nb = 1;
  snprintf(buf, n, "0LL");
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (!(mask & (1u << a))) continue;
    int sz = cg_cuda_axis_size(m, a);
    char prev[256];
    snprintf(prev, sizeof prev, "%s", buf);
    snprintf(buf, n, "(%s * %dLL + a.run[%d])", prev, sz, CG_RUN_COORD + a);
    nb *= sz;
  }
  *nblk = nb;
}

void cg_cuda_dlit(char *buf, size_t n, double v) {
  ts_fmt_double(buf, n, v);
  if (!strpbrk(buf, ".eEn")) snprintf(buf + strlen(buf), n - strlen(buf), ".0");
}

void cg_cuda_launch(CgCudaLaunch *l, const char *name, int k, int64_t work, int threads) {
  snprintf(l->name, sizeof l->name, "%s_%d", name, k);
  l->threads = threads;
  int64_t b = (work + threads - 1) / threads;
  l->blocks = b < 1 ? 1 : b > 65535LL * 32 ? 65535LL * 32 : b;
}

int cg_cuda_lib_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                       CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  if (cg_cuda_attn_op(nd->op)) return cg_cuda_attn_kernel(m, b, i, name, src, l, nl, scratch, why, whylen);
  if (cg_cuda_moe_op(nd->op)) return cg_cuda_moe_kernel(m, b, i, name, src, l, nl, scratch, why, whylen);
  if (cg_cuda_fp8_node(b, i)) return cg_cuda_fp8_kernel(m, b, i, name, src, l, nl, scratch, why, whylen);
  if (guard_16(m, b, nd, why, whylen)) return 1;
  if (cg_cuda_decode_op(nd->op)) return cg_cuda_decode_kernel(m, b, i, name, src, l, nl, scratch, why, whylen);
  char blk[512];
  int64_t nb;
  switch (nd->op) {
  case IR_OP_EMBEDDING: {   /* b0 table[V, C], b1 ids[n], b2 out[n, C] */
    const IrType *tt = &b->nodes[nd->in[0]].type;
    if (tt->rank != 2) { snprintf(why, whylen, "the table must be [V, C]"); return 1; }
    int64_t V = tt->dim[0], C = tt->dim[1], n = ir_type_numel(&b->nodes[nd->in[1]].type);
    block_expr(m, b->nodes[nd->in[0]].sh.split[0], blk, sizeof blk, &nb);
    const char *T = ctype(nd->type.dtype);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *tab = (const %s *)a.b[0];\n  const int *ids = (const int *)a.b[1];\n"
                   "  %s *y = (%s *)a.b[2];\n  const long long off = %s * %lldLL;\n", T, T, T, T, blk, (long long)V);
    CG_CUDA_GRID_LOOP(src, "e", n * C);
    /* an id outside the whole table (the reference stops with an error)
     * gives NaN; one in another rank's block 0 */
    sb_printf(src, "    const long long i = e / %lldLL, c = e %% %lldLL, id = ids[i];\n"
                   "    y[e] = id < 0 || id >= %lldLL ? (%s)TS_NAN : id >= off && id < off + %lldLL ? tab[(id - off) * %lldLL + c] : (%s)0;\n"
                   "  }\n}\n",
              (long long)C, (long long)C, (long long)(nb * V), T, (long long)V, (long long)C, T);
    cg_cuda_launch(&l[0], name, 0, n * C, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_EMBEDDING_BWD: {   /* b0 ids[n], b1 dy[n, C], b2 out[V, C] */
    const IrType *ot = &nd->type;
    if (ot->rank != 2) { snprintf(why, whylen, "the result must be [V, C]"); return 1; }
    int64_t V = ot->dim[0], C = ot->dim[1], n = ir_type_numel(&b->nodes[nd->in[0]].type);
    block_expr(m, nd->sh.split[0], blk, sizeof blk, &nb);
    const char *T = ctype(nd->type.dtype);
    CG_CUDA_HEAD(src, name, 0);   /* zero the table */
    sb_printf(src, "  %s *g = (%s *)a.b[2];\n", T, T);
    CG_CUDA_GRID_LOOP(src, "e", V * C);
    sb_puts(src, "    g[e] = 0;\n  }\n}\n");
    CG_CUDA_HEAD(src, name, 1);   /* one thread per column, the ids in order: the reference's sums, bit for bit */
    sb_printf(src, "  const int *ids = (const int *)a.b[0];\n  const %s *dy = (const %s *)a.b[1];\n  %s *g = (%s *)a.b[2];\n"
                   "  const long long off = %s * %lldLL;\n", T, T, T, T, blk, (long long)V);
    CG_CUDA_GRID_LOOP(src, "c", C);
    sb_printf(src, "    for (long long i = 0; i < %lldLL; i++) {\n      const long long id = ids[i];\n"
                   "      if (id >= off && id < off + %lldLL) g[(id - off) * %lldLL + c] += dy[i * %lldLL + c];\n"
                   "    }\n  }\n}\n",
              (long long)n, (long long)V, (long long)C, (long long)C);
    cg_cuda_launch(&l[0], name, 0, V * C, 256);
    cg_cuda_launch(&l[1], name, 1, C, 64);
    *nl = 2;
    return 0;
  }
  case IR_OP_CLIP_COEF: {   /* b0 norm[], b1 out[] */
    const char *T = ctype(nd->type.dtype);
    CG_CUDA_HEAD(src, name, 0);
    char mx[40];
    cg_cuda_dlit(mx, sizeof mx, nd->fa[0]);
    sb_printf(src, "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
                   "  const double c = %s / ((double)((const %s *)a.b[0])[0] + 1e-6);\n"
                   "  ((%s *)a.b[1])[0] = (%s)(c < 1 ? c : 1.0);\n}\n", mx, T, T, T);
    cg_cuda_launch(&l[0], name, 0, 1, 32);
    *nl = 1;
    return 0;
  }
  case IR_OP_NONFINITE: {   /* b0 x (f32 / f64), b1 out[]: 1 if any element is inf or NaN */
    const IrType *xt = &b->nodes[nd->in[0]].type;
    if (!ir_dtype_is_float(xt->dtype) || nd->type.dtype != xt->dtype) { snprintf(why, whylen, "x must be f32 or f64"); return 1; }
    int64_t n = ir_type_numel(xt);
    const char *T = ctype(xt->dtype);
    CG_CUDA_HEAD(src, name, 0);   /* out = 0, then every thread that sees an inf or NaN stores 1 (the same bits) */
    sb_printf(src, "  if (blockIdx.x == 0 && threadIdx.x == 0) ((%s *)a.b[1])[0] = 0;\n}\n", T);
    CG_CUDA_HEAD(src, name, 1);   /* x - x is 0 exactly for every finite x, NaN otherwise (the reference's test) */
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n", T, T, T, T);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_puts(src, "    if (!(x[e] - x[e] == 0)) y[0] = 1;\n  }\n}\n");
    cg_cuda_launch(&l[0], name, 0, 1, 32);
    cg_cuda_launch(&l[1], name, 1, n, 256);
    *nl = 2;
    return 0;
  }
  case IR_OP_SCALE_UPDATE: {   /* b0 found[], b1..b4 @scale @good @hyst @skipped: rt_scale_update (kernels.h) */
    const char *TF = ctype(b->nodes[nd->in[0]].type.dtype), *TS[4];
    for (int k = 0; k < 4; k++) TS[k] = ctype(m->states.a[nd->ia[k]].type.dtype);
    char mn[40];
    cg_cuda_dlit(mn, sizeof mn, nd->fa[0]);
    CG_CUDA_HEAD(src, name, 0);   /* one thread, in f64 as the reference */
    sb_printf(src, "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n"
                   "  %s *sc = (%s *)a.b[1];\n  %s *gd = (%s *)a.b[2];\n  %s *hy = (%s *)a.b[3];\n  %s *sk = (%s *)a.b[4];\n"
                   "  double scale = sc[0], good = gd[0], hyst = hy[0], skipped = sk[0];\n"
                   "  const int found = ((const %s *)a.b[0])[0] != 0;\n"
                   "  if (found) skipped += 1;\n",
              TS[0], TS[0], TS[1], TS[1], TS[2], TS[2], TS[3], TS[3], TF);
    if (nd->ia[6])   /* dynamic: Megatron's DynamicGradScaler.update */
      sb_printf(src, "  if (found) {\n    good = 0;\n    hyst -= 1;\n    if (hyst <= 0) scale = fmax(scale * 0.5, %s);\n"
                     "  } else {\n    good += 1;\n    if (good == %lld.0) { good = 0; hyst = %lld.0; scale *= 2.0; }\n  }\n",
                mn, (long long)nd->ia[4], (long long)nd->ia[5]);
    sb_printf(src, "  sc[0] = (%s)scale;\n  gd[0] = (%s)good;\n  hy[0] = (%s)hyst;\n  sk[0] = (%s)skipped;\n}\n", TS[0], TS[1],
              TS[2], TS[3]);
    cg_cuda_launch(&l[0], name, 0, 1, 32);
    *nl = 1;
    return 0;
  }
  case IR_OP_ACCUM:    /* b0 x, b1 state: state += x */
  case IR_OP_ASSIGN:   /* b0 x, b1 state: state = x */
  case IR_OP_ZERO: {   /* b0 state = 0 */
    const IrState *st = &m->states.a[nd->ia[0]];
    int64_t n = ir_type_numel(&st->type);
    const char *T = ctype(st->type.dtype);
    if (nd->op != IR_OP_ZERO && (ir_type_numel(&b->nodes[nd->in[0]].type) != n ||
                                 b->nodes[nd->in[0]].type.dtype != st->type.dtype)) {
      snprintf(why, whylen, "operand and state @%s differ", st->name);
      return 1;
    }
    CG_CUDA_HEAD(src, name, 0);
    if (nd->op == IR_OP_ZERO) sb_printf(src, "  %s *s = (%s *)a.b[0];\n", T, T);
    else sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *s = (%s *)a.b[1];\n", T, T, T, T);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_printf(src, "    s[e] %s;\n  }\n}\n", nd->op == IR_OP_ZERO ? "= 0" : nd->op == IR_OP_ACCUM ? "+= x[e]" : "= x[e]");
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_SHARD_SLICE: {   /* b0 x[outer, len, inner], b1 y[outer, len / S, inner]: this rank's block */
    const IrType *xt = &b->nodes[nd->in[0]].type;
    int a = (int)nd->ia[0], d = (int)(nd->ia[1] < 0 ? nd->ia[1] + xt->rank : nd->ia[1]);
    unsigned amask = ir_axes_mask(nd->ia[0]);
    if (!amask || d < 0 || d >= xt->rank) { snprintf(why, whylen, "bad axis or dim"); return 1; }
    /* one axis, or a set (dp+cp: the block at the flat index, outer axis major) */
    char cexpr[512];
    int64_t nblk;
    block_expr(m, amask, cexpr, sizeof cexpr, &nblk);
    int S = (int)nblk;
    if (a >= 0 && a < IR_AXIS_COUNT) snprintf(cexpr, sizeof cexpr, "a.run[%d]", CG_RUN_COORD + a);
    int64_t len = xt->dim[d], inner = 1;
    for (int q = d + 1; q < xt->rank; q++) inner *= xt->dim[q];
    if (len % S) { snprintf(why, whylen, "dim %d is not divisible by %d", d, S); return 1; }
    int64_t L = len / S, n = ir_type_numel(&nd->type);
    /* the cp level is a zigzag (cp_layout.c): chunks c and 2S-1-c of L/2 */
    int zz = a == IR_AXIS_CP && S > 1 && !ir_split_cp_minor(nd->sh.split[d]);
    if (zz && (L % 2 || (nd->sh.split[d] & ((1u << IR_AXIS_EP) | (1u << IR_AXIS_TP))))) {
      snprintf(why, whylen, "a cp zigzag slice of odd length or inside another split");
      return 1;
    }
    const char *T = ctype(nd->type.dtype);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n  const long long c = %s;\n", T, T,
              T, T, cexpr);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_printf(src, "    const long long in = e %% %lldLL, l = e / %lldLL %% %lldLL, o = e / (%lldLL * %lldLL);\n",
              (long long)inner, (long long)inner, (long long)L, (long long)inner, (long long)L);
    if (zz)
      sb_printf(src, "    const long long g = l < %lldLL ? c * %lldLL + l : (%dLL - c) * %lldLL + l - %lldLL;\n",
                (long long)(L / 2), (long long)(L / 2), 2 * S - 1, (long long)(L / 2), (long long)(L / 2));
    else
      sb_printf(src, "    const long long g = c * %lldLL + l;\n", (long long)L);
    sb_printf(src, "    y[e] = x[(o * %lldLL + g) * %lldLL + in];\n  }\n}\n", (long long)len, (long long)inner);
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_ROPE:      /* b0 x[..., T at axis, ..., D], b1 y: pairs (i, i + D/2) rotate by pos * base^(-2i/D) */
  case IR_OP_ROPE_AT: {   /* b0 x, b1 pos i32[] (the first position: pass decode), b2 y */
    const IrType *t = &nd->type;
    int ax = (int)(nd->ia[0] < 0 ? nd->ia[0] + t->rank : nd->ia[0]);
    if (ax < 0 || ax >= t->rank - 1 || t->dim[t->rank - 1] % 2) { snprintf(why, whylen, "bad axis or odd last dim"); return 1; }
    int64_t D = t->dim[t->rank - 1], h = D / 2, rows = ir_type_numel(t) / D, per = 1, len = t->dim[ax];
    for (int q = ax + 1; q < t->rank - 1; q++) per *= t->dim[q];
    unsigned mask = nd->sh.split[ax];
    /* global positions: the rank's block offset, or the cp zigzag */
    char pos[768];
    if (mask == (1u << IR_AXIS_CP) && cg_cuda_axis_size(m, IR_AXIS_CP) > 1) {
      if (len % 2) { snprintf(why, whylen, "odd cp block"); return 1; }
      int S = cg_cuda_axis_size(m, IR_AXIS_CP);
      snprintf(pos, sizeof pos, "(l < %lldLL ? a.run[%d] * %lldLL + l : (%dLL - a.run[%d]) * %lldLL + l - %lldLL)",
               (long long)(len / 2), CG_RUN_COORD + IR_AXIS_CP, (long long)(len / 2), 2 * S - 1,
               CG_RUN_COORD + IR_AXIS_CP, (long long)(len / 2), (long long)(len / 2));
    } else if (mask & (1u << IR_AXIS_CP)) {
      snprintf(why, whylen, "rope along a dim split by cp and other axes");
      return 1;
    } else {
      block_expr(m, mask, blk, sizeof blk, &nb);
      snprintf(pos, sizeof pos, "(%s * %lldLL + l)", blk, (long long)len);
    }
    const char *T = ctype(t->dtype);
    char base[40];
    cg_cuda_dlit(base, sizeof base, nd->fa[0]);
    int at = nd->op == IR_OP_ROPE_AT;
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[%d];\n  const long long p0 = %s;\n", T, T, T,
              T, at ? 2 : 1, at ? "((const int *)a.b[1])[0]" : "0");
    CG_CUDA_GRID_LOOP(src, "e", rows * h);
    sb_printf(src, "    const long long r = e / %lldLL, i = e %% %lldLL, l = r / %lldLL %% %lldLL;\n"
                   "    const double p = (double)(p0 + %s);\n"
                   "    const double th = %s * p * pow(%s, -2.0 * (double)i / %lld.0);\n"
                   "    const double c = cos(th), s = sin(th), x1 = x[r * %lldLL + i], x2 = x[r * %lldLL + i + %lldLL];\n"
                   "    y[r * %lldLL + i] = (%s)(x1 * c - x2 * s);\n"
                   "    y[r * %lldLL + i + %lldLL] = (%s)(x1 * s + x2 * c);\n  }\n}\n",
              (long long)h, (long long)h, (long long)per, (long long)len, pos, nd->ia[1] ? "-1.0" : "1.0", base,
              (long long)D, (long long)D, (long long)D, (long long)h, (long long)D, T, (long long)D, (long long)h, T);
    cg_cuda_launch(&l[0], name, 0, rows * h, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_TAKE: {   /* b0 x[rows, V] (a block of the global V), b1 idx[rows] i32, b2 y[rows] */
    const IrType *xt = &b->nodes[nd->in[0]].type;
    if (xt->rank < 1 || !ir_dtype_is_float(xt->dtype)) { snprintf(why, whylen, "x must be a float [..., V]"); return 1; }
    int64_t V = xt->dim[xt->rank - 1], rows = V ? ir_type_numel(xt) / V : 0;
    block_expr(m, b->nodes[nd->in[0]].sh.split[xt->rank - 1], blk, sizeof blk, &nb);
    const char *T = ctype(xt->dtype);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  const int *idx = (const int *)a.b[1];\n  %s *y = (%s *)a.b[2];\n"
                   "  const long long off = %s * %lldLL;\n", T, T, T, T, blk, (long long)V);
    CG_CUDA_GRID_LOOP(src, "r", rows);
    /* an index outside the whole dim (the reference stops with an error) gives NaN */
    sb_printf(src, "    const long long id = idx[r], j = id - off;\n"
                   "    y[r] = id == %lldLL ? (%s)0 : id < 0 || id >= %lldLL ? (%s)TS_NAN : j >= 0 && j < %lldLL ? x[r * %lldLL + j] : (%s)0;\n"
                   "  }\n}\n",
              (long long)nd->ia[0], T, (long long)(nb * V), T, (long long)V, (long long)V, T);
    cg_cuda_launch(&l[0], name, 0, rows, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_ONEHOT: {   /* b0 idx[rows] i32, b1 y[rows, V] (a block of the global V) */
    const IrType *yt = &nd->type;
    if (yt->rank < 1 || !ir_dtype_is_float(yt->dtype)) { snprintf(why, whylen, "the result must be a float [..., V]"); return 1; }
    int64_t V = yt->dim[yt->rank - 1], n = ir_type_numel(yt);
    block_expr(m, nd->sh.split[yt->rank - 1], blk, sizeof blk, &nb);
    const char *T = ctype(yt->dtype);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const int *idx = (const int *)a.b[0];\n  %s *y = (%s *)a.b[1];\n  const long long off = %s * %lldLL;\n",
              T, T, blk, (long long)V);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_printf(src, "    const long long id = idx[e / %lldLL];\n"
                   "    y[e] = id == %lldLL ? (%s)0 : id < 0 || id >= %lldLL ? (%s)TS_NAN : (%s)(id - off == e %% %lldLL);\n"
                   "  }\n}\n",
              (long long)V, (long long)nd->ia[0], T, (long long)(nb * V), T, T, (long long)V);
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  case IR_OP_PAD_FILL: {   /* b0 x, b1 y: fill where the global index along dim is >= limit */
    const IrType *t = &nd->type;
    int d = (int)(nd->ia[0] < 0 ? nd->ia[0] + t->rank : nd->ia[0]);
    if (d < 0 || d >= t->rank || !ir_dtype_is_float(t->dtype)) { snprintf(why, whylen, "bad dim or dtype"); return 1; }
    int64_t len = t->dim[d], inner = 1, n = ir_type_numel(t);
    for (int q = d + 1; q < t->rank; q++) inner *= t->dim[q];
    block_expr(m, nd->sh.split[d], blk, sizeof blk, &nb);
    const char *T = ctype(t->dtype);
    char fill[40];
    cg_cuda_dlit(fill, sizeof fill, nd->fa[0]);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n  const long long off = %s * %lldLL;\n",
              T, T, T, T, blk, (long long)len);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_printf(src, "    y[e] = off + e / %lldLL %% %lldLL >= %lldLL ? (%s)%s : x[e];\n  }\n}\n", (long long)inner,
              (long long)len, (long long)nd->ia[1], T, fill);
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  default:
    snprintf(why, whylen, "no library kernel for %s yet", ir_ops[nd->op].name);
    return 1;
  }
}

/* all_to_all around NCCL: kernel 0 packs x's blocks along dim `split`
 * into the first half of the scratch ([S][n / S], block j for rank j),
 * NCCL exchanges them into the second half, kernel 1 places received
 * block j at j along dim `concat` of the result.  Along cp a dim whose
 * cp level is the zigzag (the result's split dim, the operand's concat
 * dim) is cut and joined by chunks j and 2S-1-j, as the reference kernel
 * does (runtime/cpu/ops_a2a.c). */

/* Whether dim d split by mask is a cp zigzag here (the mask's cp level,
 * not the contiguous innermost one); -1 with why when it cannot be. */
static int a2a_zigzag(int ax, unsigned mask, int64_t L, char *why, size_t whylen) {
  if (ax != IR_AXIS_CP || !(mask & (1u << IR_AXIS_CP)) || ir_split_cp_minor(mask)) return 0;
  if (L % 2 || (mask & ((1u << IR_AXIS_EP) | (1u << IR_AXIS_TP)))) {
    snprintf(why, whylen, "a cp zigzag block of odd length or inside another split");
    return -1;
  }
  return 1;
}

/* The global position along the cut dim of local index `l` of block `j`
 * (length L): C source of an expression. */
static void a2a_pos(StrBuf *src, int zz, int S, int64_t L) {
  if (zz)
    sb_printf(src, "    const long long g = l < %lldLL ? j * %lldLL + l : (%dLL - j) * %lldLL + l - %lldLL;\n",
              (long long)(L / 2), (long long)(L / 2), 2 * S - 1, (long long)(L / 2), (long long)(L / 2));
  else
    sb_printf(src, "    const long long g = j * %lldLL + l;\n", (long long)L);
}
static int relayout_a2a(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src, CgCudaLaunch *l,
                        int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  const IrType *xt = &b->nodes[nd->in[0]].type, *yt = &nd->type;
  int S = cg_cuda_axis_size(m, (int)nd->ia[0]), r = xt->rank, sd = (int)nd->ia[1], cd = (int)nd->ia[2];
  if (S <= 1) return 0;
  if (sd < 0 || sd >= r || cd < 0 || cd >= r || xt->dim[sd] % S) {
    snprintf(why, whylen, "split / concat dims do not fit %d ranks", S);
    return 1;
  }
  int64_t n = ir_type_numel(xt), blk = n / S;
  /* x as [so, S, sl, si] around dim sd; y as [co, S, cl, ci] around dim cd,
   * where block j is the [..., sl / S ...] sub-tensor of x's shape */
  int64_t so = 1, si = 1, sl = xt->dim[sd] / S, co = 1, ci = 1, cl = yt->dim[cd] / S;
  for (int q = 0; q < sd; q++) so *= xt->dim[q];
  for (int q = sd + 1; q < r; q++) si *= xt->dim[q];
  for (int q = 0; q < cd; q++) co *= yt->dim[q];
  for (int q = cd + 1; q < r; q++) ci *= yt->dim[q];
  int zs = a2a_zigzag((int)nd->ia[0], nd->sh.split[sd], sl, why, whylen);
  int zc = a2a_zigzag((int)nd->ia[0], b->nodes[nd->in[0]].sh.split[cd], cl, why, whylen);
  if (zs < 0 || zc < 0) return 1;
  const char *T = ctype(nd->type.dtype);
  *scratch = 2 * n * (int64_t)ir_dtype_size(nd->type.dtype);
  CG_CUDA_HEAD(src, name, 0);   /* pack: element e of block j, row-major over [so, sl, si] */
  sb_printf(src, "  const %s *x = (const %s *)a.b[0];\n  %s *s = (%s *)a.b[2];\n", T, T, T, T);
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_printf(src, "    const long long j = e / %lldLL, w = e %% %lldLL, in = w %% %lldLL, l = w / %lldLL %% %lldLL, o = w / %lldLL;\n",
            (long long)blk, (long long)blk, (long long)si, (long long)si, (long long)sl, (long long)(si * sl));
  a2a_pos(src, zs, S, sl);
  sb_printf(src, "    s[e] = x[(o * %lldLL + g) * %lldLL + in];\n  }\n}\n", (long long)xt->dim[sd], (long long)si);
  CG_CUDA_HEAD(src, name, 1);   /* unpack: received block j, row-major over [co, cl, ci] */
  sb_printf(src, "  const %s *s = (const %s *)a.b[2] + %lldLL;\n  %s *y = (%s *)a.b[1];\n", T, T, (long long)n, T, T);
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_printf(src, "    const long long j = e / %lldLL, w = e %% %lldLL, in = w %% %lldLL, l = w / %lldLL %% %lldLL, o = w / %lldLL;\n",
            (long long)blk, (long long)blk, (long long)ci, (long long)ci, (long long)cl, (long long)(ci * cl));
  a2a_pos(src, zc, S, cl);
  sb_printf(src, "    y[(o * %lldLL + g) * %lldLL + in] = s[e];\n  }\n}\n", (long long)yt->dim[cd], (long long)ci);
  cg_cuda_launch(&l[0], name, 0, n, 256);
  cg_cuda_launch(&l[1], name, 1, n, 256);
  *nl = 2;
  return 0;
}

/* all_gather / reduce_scatter around NCCL: NCCL gathers and scatters
 * whole rank blocks, [S][outer, L, inner] in coordinate order; the value
 * is [outer, S * L, inner] in global order (the cp zigzag: chunks q and
 * 2S-1-q of L / 2).  Element e of the block array is (q, o, l, i). */
int cg_cuda_comm_relayout(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src, CgCudaLaunch *l,
                          int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  if (nd->op == IR_OP_GROUP_SUM) {   /* two members: x + the other's value (in the blocks buffer) */
    int64_t n = ir_type_numel(&nd->type);
    const char *T = ctype(nd->type.dtype);
    *scratch = n * (int64_t)ir_dtype_size(nd->type.dtype);
    CG_CUDA_HEAD(src, name, 0);
    sb_printf(src, "  const %s *x = (const %s *)a.b[0], *o = (const %s *)a.b[2];\n  %s *y = (%s *)a.b[1];\n", T, T, T,
              T, T);
    CG_CUDA_GRID_LOOP(src, "e", n);
    sb_puts(src, "    y[e] = x[e] + o[e];\n  }\n}\n");
    cg_cuda_launch(&l[0], name, 0, n, 256);
    *nl = 1;
    return 0;
  }
  if (nd->op == IR_OP_ALL_TO_ALL_V) {   /* no kernel: copies by the host's counts; scratch for the rows in flight */
    const IrType *xt = &b->nodes[nd->in[0]].type;
    int64_t rows = xt->dim[0] > nd->type.dim[0] ? xt->dim[0] : nd->type.dim[0];
    if (xt->rank == 2 && nd->type.rank == 2) *scratch = rows * xt->dim[1] * (int64_t)ir_dtype_size(xt->dtype);
    return 0;
  }
  if (nd->op == IR_OP_ALL_TO_ALL) return relayout_a2a(m, b, i, name, src, l, nl, scratch, why, whylen);
  if (nd->op != IR_OP_ALL_GATHER && nd->op != IR_OP_REDUCE_SCATTER) return 0;
  int a = (int)nd->ia[0], S = 1;
  for (int q = 0; q < IR_AXIS_COUNT; q++)   /* one axis or a set (dp+cp) */
    if (ir_axes_mask(nd->ia[0]) & (1u << q)) S *= cg_cuda_axis_size(m, q);
  const IrType *t = &b->nodes[nd->in[0]].type;
  int d = (int)(nd->ia[1] < 0 ? nd->ia[1] + t->rank : nd->ia[1]);
  if (S <= 1 || d < 0 || d >= t->rank) return 0;
  int gather = nd->op == IR_OP_ALL_GATHER;
  int64_t outer = 1, inner = 1, len = t->dim[d];
  for (int q = 0; q < d; q++) outer *= t->dim[q];
  for (int q = d + 1; q < t->rank; q++) inner *= t->dim[q];
  if (!gather && len % S) { snprintf(why, whylen, "dim %d is not divisible by %d", d, S); return 1; }
  int64_t L = gather ? len : len / S, h = L / 2;
  unsigned split = gather ? b->nodes[nd->in[0]].sh.split[d] : nd->sh.split[d];
  int zz = a == IR_AXIS_CP && !ir_split_cp_minor(split);   /* cp* (innermost, contiguous): plain blocks */
  if (zz && (L % 2 || (split & ((1u << IR_AXIS_EP) | (1u << IR_AXIS_TP))))) {
    snprintf(why, whylen, "a cp zigzag block of odd length or inside another split");
    return 1;
  }
  if (!zz && outer == 1) return 0;   /* the blocks are the value: NCCL alone */
  int64_t n = S * outer * L * inner;
  *scratch = n * (int64_t)ir_dtype_size(nd->type.dtype);
  const char *T = ctype(nd->type.dtype);
  CG_CUDA_HEAD(src, name, 0);
  sb_printf(src, "  const %s *x = (const %s *)a.b[%d];\n  %s *y = (%s *)a.b[%d];\n", T, T, gather ? 2 : 0, T, T,
            gather ? 1 : 2);
  CG_CUDA_GRID_LOOP(src, "e", n);
  sb_printf(src, "    const long long in = e %% %lldLL, l = e / %lldLL %% %lldLL, o = e / %lldLL %% %lldLL, q = e / %lldLL;\n",
            (long long)inner, (long long)inner, (long long)L, (long long)(inner * L), (long long)outer,
            (long long)(inner * L * outer));
  if (zz)
    sb_printf(src, "    const long long g = l < %lldLL ? q * %lldLL + l : (%dLL - q) * %lldLL + l - %lldLL;\n", (long long)h,
              (long long)h, 2 * S - 1, (long long)h, (long long)h);
  else
    sb_printf(src, "    const long long g = q * %lldLL + l;\n", (long long)L);
  sb_printf(src, "    const long long v = (o * %lldLL + g) * %lldLL + in;\n", (long long)(S * L), (long long)inner);
  sb_puts(src, gather ? "    y[v] = x[e];\n  }\n}\n" : "    y[e] = x[v];\n  }\n}\n");
  cg_cuda_launch(&l[0], name, 0, n, 256);
  *nl = 1;
  return 0;
}
