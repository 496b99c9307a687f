/* cuda_attn.c - the flash-attention kernels of the CUDA library
 * (cuda_priv.h; docs/cuda.md "Attention"): the fused attention op, its
 * backward, and the ring-attention steps of context parallelism.  They
 * compute what runtime/cpu/ops_attn.c and ops_ring.c compute:
 *
 *   attention      one block per (batch, query head, tile of BQ queries):
 *                  the query tile in shared memory, the keys and values
 *                  streamed through it BK rows at a time, an online softmax
 *                  (running max m, sum l, unnormalised accumulator in
 *                  shared doubles); nothing of size [Tq, Tk] is stored.
 *   attention_bwd  kernel 0 recomputes each query row's log-sum-exp (the
 *                  forward without values) and drow = rowsum(do * o) into
 *                  the scratch buffer; kernel 1 is the dq kernel (one block
 *                  per query tile, streaming keys) for part 0, or the dk /
 *                  dv kernel (one block per (batch, kv head, key tile),
 *                  streaming the queries of every query head that reads
 *                  the kv head: grouped-query without copies) for parts 1
 *                  and 2.  p = exp(scale q.k - lse), ds = p (do.v - drow):
 *                  dq += scale ds k, dk += scale ds^T q, dv += p^T do.
 *                  The parts of one attention as one launch group
 *                  (cg_cuda_attn_grads_kernel): kernel 0 once, the dq
 *                  kernel, and ONE kernel for dk and dv (p and ds of a
 *                  tile pair computed once for both, two accumulators):
 *                  the scores three times instead of six.
 *   attn_acc       the forward's loop over one key block, from and into the
 *                  state st [B, Hq, Tq, D + 2] (accumulator, m, l).
 *   attn_finish, attn_lse   per row of the state.
 *   attn_bwd_q, attn_bwd_kv the dq and dk / dv kernels on one key block,
 *                  lse and drow given, adding to an accumulator operand.
 *
 * Every block owns its output rows (no atomics: the result does not depend
 * on scheduling).  f64 operands, and the ring steps of either type, compute
 * in double (f32 operands widened in shared memory loads) with scalar
 * per-thread work.  attention and attention_bwd on f32 operands (head_dim a
 * multiple of 4) have register-tiled kernels in float instead (see "f32
 * operands" below): within the f32 tolerance of the reference, not equal
 * to its rounding.  Causal masks compare GLOBAL positions: each
 * node gets two device functions mapping a local row to its position along
 * the sequence (rt_global_index_at's rule, the cp zigzag included, with
 * the key block's owner on the ring: (c - src) mod C).  Tiles wholly
 * masked are skipped.  Tile sizes are the largest powers of two (at most
 * 64) whose shared memory fits in 47 KiB, so every kernel has static
 * shared memory under the 48 KiB every arch gives without opting in (the
 * f32 kernels choose theirs per kernel, f_choose). */
#include "cuda_priv.h"

#define ATTN_THREADS 128
#define ATTN_SMEM_MAX (47 * 1024)

int cg_cuda_attn_op(IrOp op) {
  switch (op) {
  case IR_OP_ATTENTION: case IR_OP_ATTENTION_BWD: case IR_OP_ATTN_ACC: case IR_OP_ATTN_FINISH: case IR_OP_ATTN_LSE:
  case IR_OP_ATTN_BWD_Q: case IR_OP_ATTN_BWD_KV:
    return 1;
  default:
    return 0;
  }
}

/* One node's attention: dims, dtype, tiles and the kernels' buffer slots. */
typedef struct {
  const char *name, *T;          /* kernel prefix; "float" / "double" */
  int64_t B, Hq, Hkv, Tq, Tk, D, grp;
  int causal, es;                /* es: operand element size */
  char scale[40];
  int BQ, BK;
  /* buffer slots: q, k, v, do, o (-1: none), lse / drow (-1: in scratch),
   * acc (the accumulator operand; -1: start at 0), result, scratch */
  int bq, bk, bv, bdo, bo, blse, bdrow, bacc, bres, bscr;
  int bres2;        /* the dk + dv kernel (part 3): dv's slot (bres: dk's) */
  int dkv2;         /* tiles for the dk + dv kernel: a second score tile and accumulator */
  /* document ids (packed sequences): their slot (-1: none) and length;
   * positions then carry the document id in their high 32 bits (pos_call) */
  int bdoc;
  int64_t Tdoc;
  int64_t window;   /* > 0: keys that many positions or more from the query are masked */
  IrDtype tc;       /* attention_bwd: q, k, v and do are values of this 16-bit dtype, bf16 or f16 (tensor
                     * cores when the tiles fit); IR_VOID: not */
  /* ALiBi: the slopes' slot (-1: none) and type; each kernel's loop over
   * query heads sets `asl`, its head's slope (by global head, <name>_hpos) */
  int bslope;
  const char *slT;
} Att;

/* The call giving the global position of query (qk 'q') or key ('k') row
 * idx.  With document ids it is (doc << 32) | position (doc as unsigned,
 * the position < 2^31): equal high halves mean one document, and within one
 * the low halves order as the positions do (the mask, masked()). */
static const char *pos_call(const Att *a, char *buf, size_t n, char qk, const char *idx) {
  if (a->bdoc < 0) snprintf(buf, n, "%s_%cpos(a.run, %s)", a->name, qk, idx);
  else snprintf(buf, n, "%s_dpos(b, %s_%cpos(a.run, %s))", a->name, a->name, qk, idx);
  return buf;
}

/* The mask test of key position kx against query position qx (as pos_call
 * gives them): "0" when nothing is masked. */
static const char *mask_of(const Att *a, char *buf, size_t n, const char *kx, const char *qx) {
  char win[320] = "";
  if (a->window > 0) {   /* |query - key| >= window, on the positions' low halves with documents */
    char dist[128];
    if (a->bdoc < 0) snprintf(dist, sizeof dist, "(%s - %s)", qx, kx);
    else snprintf(dist, sizeof dist, "((%s & 0xffffffffLL) - (%s & 0xffffffffLL))", qx, kx);
    snprintf(win, sizeof win, " || %s >= %lldLL || -%s >= %lldLL", dist, (long long)a->window, dist,
             (long long)a->window);
  }
  if (a->bdoc < 0 && !a->causal && a->window <= 0) snprintf(buf, n, "0");
  else if (a->bdoc < 0 && !a->causal) snprintf(buf, n, "(0%s)", win);
  else if (a->bdoc < 0) snprintf(buf, n, "(%s > %s%s)", kx, qx, win);
  else if (a->causal) snprintf(buf, n, "(%s > %s || ((%s ^ %s) >> 32) != 0%s)", kx, qx, kx, qx, win);
  else snprintf(buf, n, "(((%s ^ %s) >> 32) != 0%s)", kx, qx, win);
  return buf;
}

/* Static shared memory of the largest kernel for tiles BQ x BK (bytes). */
static int64_t smem_bytes(const Att *a, int64_t BQ, int64_t BK) {
  int64_t rows = BQ > BK ? BQ : BK;
  /* the operand tiles' rows are padded to D + 1 elements (print_shared) */
  return a->es * (2 * BQ * (a->D + 1) + 2 * BK * (a->D + 1)) + 8 * (BQ * BK + rows * a->D + 3 * BQ) + 8 * (BQ + BK) +
         (a->dkv2 ? 8 * (BQ * BK + rows * a->D) : 0) + 16;
}

static int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n && p < 64) p *= 2;
  return p;
}

/* Tiles: the largest power-of-two size (at most 64 and no larger than the
 * rows need) whose shared memory fits.  0, or 1 when even 1 x 1 does not. */
static int choose_tiles(Att *a, char *why, size_t whylen) {
  for (int64_t t = 64; t >= 1; t /= 2) {
    int64_t bq = pow2_at_least(a->Tq), bk = pow2_at_least(a->Tk);
    bq = bq < t ? bq : t;
    bk = bk < t ? bk : t;
    if (smem_bytes(a, bq, bk) <= ATTN_SMEM_MAX) {
      a->BQ = (int)bq;
      a->BK = (int)bk;
      return 0;
    }
  }
  snprintf(why, whylen, "head_dim %lld is too large for attention tiles in 48 KiB of shared memory", (long long)a->D);
  return 1;
}

/* Prints `static long long FN(const long long *run, long long g)`: the
 * global position of local row g of a dim of local length L split by the
 * axes in mask, as rt_global_index_at (runtime/cpu/cp_layout.c) computes it,
 * inner axis first; on the ring (src >= 0) the cp coordinate is the key
 * block's owner, (c - src) mod C. */
void cg_cuda_print_pos(const IrModule *m, StrBuf *src, const char *fn, unsigned mask, int64_t L, int64_t ring_src) {
  sb_printf(src, "static __device__ __forceinline__ long long %s(const long long *run, long long g) {\n", fn);
  int64_t span = L;
  int minor = ir_split_cp_minor(mask);   /* cp innermost and contiguous (ir.h): taken first, a plain block */
  for (int k = IR_AXIS_COUNT; k >= 0; k--) {
    int ax = k == IR_AXIS_COUNT ? IR_AXIS_CP : k;
    if (k == IR_AXIS_COUNT ? !minor : (!(mask & (1u << ax)) || (minor && ax == IR_AXIS_CP))) continue;
    int S = cg_cuda_axis_size(m, ax);
    char c[160];
    if (ax == IR_AXIS_CP && ring_src >= 0 && S > 1)
      snprintf(c, sizeof c, "(((run[%d] - %lldLL) %% %dLL + %dLL) %% %dLL)", CG_RUN_COORD + ax, (long long)ring_src, S,
               S, S);
    else
      snprintf(c, sizeof c, "run[%d]", CG_RUN_COORD + ax);
    if (ax == IR_AXIS_CP && S > 1 && !minor) {
      long long h = (long long)(span / 2);
      sb_printf(src, "  g = g < %lldLL ? %s * %lldLL + g : (%dLL - %s) * %lldLL + g - %lldLL;\n", h, c, h, 2 * S - 1, c,
                h, h);
    } else {
      sb_printf(src, "  g += %s * %lldLL;\n", c, (long long)span);
    }
    span *= S;
  }
  sb_puts(src, "  return g;\n}\n");
}

/* ---- pieces the kernels share ----
 * Shared arrays (rows of sq, sdo, sk, sv padded to D + 1 elements, so the
 * threads of a warp reading one column of different rows hit different
 * banks): sq, sdo [BQ rows] and sk, sv [BK rows] (operand type); ss
 * [BQ * BK] (scores, then p or ds); sacc [acc_rows * D] (double); sm, sl
 * [BQ] (running max and sum, or lse and drow), sc [BQ] (the rescale
 * factor); qp [BQ], kp [BK] (global positions).  Whether a tile pair has
 * an unmasked score is each thread's ts_any, OR-ed by __syncthreads_or. */
enum { USE_DO = 1, USE_V = 2, USE_ACC = 4, USE_SC = 8 };

static void print_shared(const Att *a, StrBuf *s, int use, int64_t acc_rows) {
  int64_t LD = a->D + 1;
  sb_printf(s, "  __shared__ %s sq[%lld], sk[%lld]", a->T, (long long)(a->BQ * LD), (long long)(a->BK * LD));
  if (use & USE_DO) sb_printf(s, ", sdo[%lld]", (long long)(a->BQ * LD));
  if (use & USE_V) sb_printf(s, ", sv[%lld]", (long long)(a->BK * LD));
  sb_printf(s, ";\n  __shared__ double ss[%d], sm[%d], sl[%d]", a->BQ * a->BK, a->BQ, a->BQ);
  if (use & USE_ACC) sb_printf(s, ", sacc[%lld]", (long long)(acc_rows * a->D));
  if (use & USE_SC) sb_printf(s, ", sc[%d]", a->BQ);
  sb_printf(s, ";\n  __shared__ long long qp[%d], kp[%d];\n", a->BQ, a->BK);
  sb_printf(s, "  const int tid = threadIdx.x, nt = blockDim.x;\n");
  sb_printf(s, "  const %s *q = (const %s *)a.b[%d], *k = (const %s *)a.b[%d];\n", a->T, a->T, a->bq, a->T, a->bk);
  if (use & USE_V) sb_printf(s, "  const %s *v = (const %s *)a.b[%d];\n", a->T, a->T, a->bv);
  if (use & USE_DO) sb_printf(s, "  const %s *dout = (const %s *)a.b[%d];\n", a->T, a->T, a->bdo);
}

/* Loads key tile j0 (nk rows of the kv head at offset kvo) into sk (and sv)
 * with its positions, then decides `any` for the tile pair (causal), or
 * just waits for the loads.  Opens with a barrier: the previous pair's
 * readers are done.  Inside the loop over key tiles (or query tiles, when
 * the key tile stays: the loads are then the query side's, see dkv). */
static void print_any(const Att *a, StrBuf *s, const char *ind) {
  sb_printf(s, "%s__syncthreads();\n", ind);
  if (!a->causal && a->bdoc < 0 && a->window <= 0) return;
  /* each thread's own flag, OR-ed by the barrier (no shared flag that
   * many threads write: racecheck stays quiet) */
  char mk[512];
  sb_printf(s, "%sint ts_any = 0;\n%sfor (int x = tid; x < nq * nk; x += nt) ts_any |= !%s;\n", ind, ind,
            mask_of(a, mk, sizeof mk, "kp[x % nk]", "qp[x / nk]"));
  sb_printf(s, "%sif (!__syncthreads_or(ts_any)) continue;\n", ind);
}

static void print_key_loads(const Att *a, StrBuf *s, int use_v, const char *ind) {
  int64_t LD = a->D + 1;
  sb_printf(s, "%s__syncthreads();\n", ind);
  sb_printf(s, "%sfor (int x = tid; x < nk * %lld; x += nt) {\n", ind, (long long)a->D);
  sb_printf(s, "%s  const int c = x / %lld, e = x %% %lld;\n", ind, (long long)a->D, (long long)a->D);
  sb_printf(s, "%s  sk[c * %lld + e] = k[kvo + j0 * %lldLL + x];\n", ind, (long long)LD, (long long)a->D);
  if (use_v) sb_printf(s, "%s  sv[c * %lld + e] = v[kvo + j0 * %lldLL + x];\n", ind, (long long)LD, (long long)a->D);
  char pc[160];
  sb_printf(s, "%s}\n%sfor (int c = tid; c < nk; c += nt) kp[c] = %s;\n", ind, ind, pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
}

/* q . k of row r, column c (and do . v into dp when dp) as doubles, the
 * score scaled and masked into s. */
static void print_dots(const Att *a, StrBuf *s, int dp, const char *ind) {
  int64_t LD = a->D + 1;
  sb_printf(s, "%sdouble s = 0%s;\n", ind, dp ? ", dp = 0" : "");
  sb_printf(s, "%sfor (int e = 0; e < %lld; e++) {\n", ind, (long long)a->D);
  sb_printf(s, "%s  s += (double)sq[r * %lld + e] * (double)sk[c * %lld + e];\n", ind, (long long)LD, (long long)LD);
  if (dp) sb_printf(s, "%s  dp += (double)sdo[r * %lld + e] * (double)sv[c * %lld + e];\n", ind, (long long)LD,
                    (long long)LD);
  sb_printf(s, "%s}\n%ss *= %s;\n", ind, ind, a->scale);
  if (a->bslope >= 0) {   /* ALiBi: -slope |i - j| on the positions (their low halves with documents) */
    const char *lo = a->bdoc >= 0 ? " & 0xffffffffLL" : "";
    sb_printf(s, "%s{\n%s  const long long dd = (qp[r]%s) - (kp[c]%s);\n%s  s -= asl * (double)(dd < 0 ? -dd : dd);\n%s}\n",
              ind, ind, lo, lo, ind, ind);
  }
}

/* `asl`, the ALiBi slope of local query head hexpr (nothing without) */
static void print_slope(const Att *a, StrBuf *s, const char *ind, const char *hexpr) {
  if (a->bslope < 0) return;
  sb_printf(s, "%sconst double asl = (double)((const %s *)a.b[%d])[%s_hpos(a.run, %s)];\n", ind, a->slT, a->bslope,
            a->name, hexpr);
}

/* The mask test of (r, c): "0" when nothing is masked. */
static const char *masked(const Att *a) {
  static char buf[512];   /* used at once by the caller's printf */
  return mask_of(a, buf, sizeof buf, "kp[c]", "qp[r]");
}

/* Opens the dk / dv kernels' loops over the query heads that read kv head
 * hk and over their tiles of `rows` queries: bh, i0, nq, row0 (the
 * tile's first row of q); ends with a barrier. */
static void print_head_tiles(const Att *a, StrBuf *s, int rows) {
  sb_printf(s, "    for (long long h = hk * %lldLL; h < (hk + 1) * %lldLL; h++) {\n", (long long)a->grp,
            (long long)a->grp);
  sb_printf(s, "      const long long bh = b * %lldLL + h;\n", (long long)a->Hq);
  sb_printf(s, "      for (long long i0 = 0; i0 < %lldLL; i0 += %d) {\n", (long long)a->Tq, rows);
  sb_printf(s, "        const int nq = %lldLL - i0 < %d ? (int)(%lldLL - i0) : %d;\n", (long long)a->Tq, rows,
            (long long)a->Tq, rows);
  sb_printf(s, "        const long long row0 = bh * %lldLL + i0;\n        __syncthreads();\n", (long long)a->Tq);
  print_slope(a, s, "        ", "h");
}

/* Opens the loop over (batch, query head, query tile) blocks: bh, i0 (the
 * tile's first row), nq (its rows), kvo (the kv head's offset in k / v),
 * row0 (its first row of q); ends with a barrier (the previous tile's
 * readers are done). */
static void print_qtile_loop(const Att *a, StrBuf *s) {
  int64_t nqt = (a->Tq + a->BQ - 1) / a->BQ;
  sb_printf(s, "  for (long long t = blockIdx.x; t < %lldLL; t += gridDim.x) {\n", (long long)(a->B * a->Hq * nqt));
  sb_printf(s, "    const long long bh = t / %lldLL, i0 = t %% %lldLL * %d;\n", (long long)nqt, (long long)nqt, a->BQ);
  sb_printf(s, "    const int nq = %lldLL - i0 < %d ? (int)(%lldLL - i0) : %d;\n", (long long)a->Tq, a->BQ,
            (long long)a->Tq, a->BQ);
  sb_printf(s, "    const long long kvo = (bh / %lldLL * %lldLL + bh %% %lldLL / %lldLL) * %lldLL;\n", (long long)a->Hq,
            (long long)a->Hkv, (long long)a->Hq, (long long)a->grp, (long long)(a->Tk * a->D));
  sb_printf(s, "    const long long row0 = bh * %lldLL + i0;\n    __syncthreads();\n", (long long)a->Tq);
  if (a->bdoc >= 0) sb_printf(s, "    const long long b = bh / %lldLL;   /* the batch row of the document ids */\n", (long long)a->Hq);
  char hx[64];
  snprintf(hx, sizeof hx, "bh %% %lldLL", (long long)a->Hq);
  print_slope(a, s, "    ", hx);
}

/* ---- the forward (attention, attn_acc) and the backward's statistics ----
 * mode 0: attention -> o; 1: attn_acc, the state in and out; 2: the lse and
 * drow rows of attention_bwd into the scratch. */
static void print_fwd(const Att *a, StrBuf *s, int k, int mode) {
  int64_t D = a->D, LD = D + 1, W = D + 2;
  int use = USE_SC | (mode != 2 ? USE_V | USE_ACC : 0);
  CG_CUDA_HEAD(s, a->name, k);
  print_shared(a, s, use, a->BQ);
  if (mode == 0) sb_printf(s, "  %s *out = (%s *)a.b[%d];\n", a->T, a->T, a->bres);
  if (mode == 1) sb_printf(s, "  const %s *st = (const %s *)a.b[3];\n  %s *out = (%s *)a.b[%d];\n", a->T, a->T, a->T,
                           a->T, a->bres);
  if (mode == 2) sb_printf(s, "  const %s *o = (const %s *)a.b[%d], *dout = (const %s *)a.b[%d];\n"
                              "  double *scr = (double *)a.b[%d];\n", a->T, a->T, a->bo, a->T, a->bdo, a->bscr);
  print_qtile_loop(a, s);
  sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) sq[x / %lld * %lld + x %% %lld] = q[row0 * %lldLL + x];\n",
            (long long)D, (long long)D, (long long)LD, (long long)D, (long long)D);
  char pc[160];
  sb_printf(s, "    for (int r = tid; r < nq; r += nt) {\n      qp[r] = %s;\n", pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  if (mode == 1) {   /* a row with l = 0 has seen no key: start it afresh */
    sb_printf(s, "      const %s *w = st + (row0 + r) * %lldLL;\n", a->T, (long long)W);
    sb_printf(s, "      sm[r] = w[%lld] > 0 ? (double)w[%lld] : -TS_INF;\n      sl[r] = w[%lld] > 0 ? (double)w[%lld] : 0.0;\n",
              (long long)(D + 1), (long long)D, (long long)(D + 1), (long long)(D + 1));
  } else {
    sb_puts(s, "      sm[r] = -TS_INF;\n      sl[r] = 0;\n");
  }
  sb_puts(s, "    }\n");
  if (mode == 1)
    sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) {\n"
                 "      const %s *w = st + (row0 + x / %lld) * %lldLL;\n"
                 "      sacc[x] = w[%lld] > 0 ? (double)w[x %% %lld] : 0.0;\n    }\n",
              (long long)D, a->T, (long long)D, (long long)W, (long long)(D + 1), (long long)D);
  if (mode == 0) sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) sacc[x] = 0;\n", (long long)D);
  sb_printf(s, "    for (long long j0 = 0; j0 < %lldLL; j0 += %d) {\n", (long long)a->Tk, a->BK);
  sb_printf(s, "      const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n", (long long)a->Tk, a->BK,
            (long long)a->Tk, a->BK);
  print_key_loads(a, s, mode != 2, "      ");
  print_any(a, s, "      ");
  sb_puts(s, "      for (int x = tid; x < nq * nk; x += nt) {\n        const int r = x / nk, c = x % nk;\n");
  print_dots(a, s, 0, "        ");
  sb_printf(s, "        ss[r * %d + c] = %s ? -TS_INF : s;\n      }\n      __syncthreads();\n", a->BK, masked(a));
  /* per row: the tile's max, the rescale of what came before, p = exp(s - m) */
  sb_printf(s, "      for (int r = tid; r < nq; r += nt) {\n        double *p = ss + r * %d, mt = -TS_INF;\n"
               "        for (int c = 0; c < nk; c++) mt = p[c] > mt ? p[c] : mt;\n"
               "        if (mt == -TS_INF) {   /* the row sees no key of this tile */\n"
               "          for (int c = 0; c < nk; c++) p[c] = 0;\n          sc[r] = 1;\n          continue;\n        }\n"
               "        const double mn = sm[r] > mt ? sm[r] : mt, corr = sm[r] == -TS_INF ? 0.0 : exp(sm[r] - mn);\n"
               "        double sum = 0;\n"
               "        for (int c = 0; c < nk; c++) {\n          p[c] = exp(p[c] - mn);\n          sum += p[c];\n        }\n"
               "        sl[r] = sl[r] * corr + sum;\n        sm[r] = mn;\n        sc[r] = corr;\n      }\n",
            a->BK);
  if (mode != 2) {   /* acc = acc * corr + P V */
    sb_printf(s, "      __syncthreads();\n      for (int x = tid; x < nq * %lld; x += nt) {\n"
                 "        const int r = x / %lld, e = x %% %lld;\n        double acc = sacc[x] * sc[r];\n"
                 "        for (int c = 0; c < nk; c++) acc += ss[r * %d + c] * (double)sv[c * %lld + e];\n"
                 "        sacc[x] = acc;\n      }\n",
              (long long)D, (long long)D, (long long)D, a->BK, (long long)LD);
  }
  sb_puts(s, "    }\n    __syncthreads();\n");
  if (mode == 0)
    sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) {\n      const int r = x / %lld;\n"
                 "      out[row0 * %lldLL + x] = (%s)(sacc[x] * (sl[r] > 0 ? 1.0 / sl[r] : 0.0));\n    }\n",
              (long long)D, (long long)D, (long long)D, a->T);
  if (mode == 1)   /* rows that saw no key keep their input */
    sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) {\n      const int r = x / %lld, e = x %% %lld;\n"
                 "      const long long at = row0 * %lldLL + x;\n"
                 "      out[at] = sl[r] > 0 ? (%s)(e < %lld ? sacc[r * %lld + e] : e == %lld ? sm[r] : sl[r]) : st[at];\n"
                 "    }\n",
              (long long)W, (long long)W, (long long)W, (long long)W, a->T, (long long)D, (long long)D, (long long)D);
  if (mode == 2)
    sb_printf(s, "    for (int r = tid; r < nq; r += nt) {\n      const long long row = row0 + r;\n"
                 "      scr[row] = sl[r] > 0 ? sm[r] + log(sl[r]) : -TS_INF;\n      double d = 0;\n"
                 "      for (int e = 0; e < %lld; e++) d += (double)dout[row * %lldLL + e] * (double)o[row * %lldLL + e];\n"
                 "      scr[%lldLL + row] = d;\n    }\n",
              (long long)D, (long long)D, (long long)D, (long long)(a->B * a->Hq * a->Tq));
  sb_puts(s, "  }\n}\n");
}

/* Where lse and drow of a row come from: the scratch (attention_bwd,
 * double) or the operands (the ring steps). */
static void print_stats_in(const Att *a, StrBuf *s, const char *ind) {
  if (a->blse < 0)
    sb_printf(s, "%ssm[r] = ((const double *)a.b[%d])[row];\n%ssl[r] = ((const double *)a.b[%d])[%lldLL + row];\n", ind,
              a->bscr, ind, a->bscr, (long long)(a->B * a->Hq * a->Tq));
  else
    sb_printf(s, "%ssm[r] = (double)((const %s *)a.b[%d])[row];\n%ssl[r] = (double)((const %s *)a.b[%d])[row];\n",
              ind, a->T, a->blse, ind, a->T, a->bdrow);
}

/* p (and ds) of the tile pair into ss: ds = p (dp - drow) when want_ds,
 * else p.  p is 0 where masked or where the row's lse is -inf. */
static void print_p(const Att *a, StrBuf *s, int want_ds) {
  sb_puts(s, "        const int r = x / nk, c = x % nk;\n");
  print_dots(a, s, want_ds, "        ");
  sb_printf(s, "        const double p = sm[r] == -TS_INF || %s ? 0.0 : exp(s - sm[r]);\n", masked(a));
  sb_printf(s, "        ss[r * %d + c] = %s;\n", a->BK, want_ds ? "p * (dp - sl[r])" : "p");
}

/* dq: one block per (batch, query head, query tile), the keys streamed. */
static void print_dq(const Att *a, StrBuf *s, int k) {
  int64_t D = a->D, LD = D + 1;
  CG_CUDA_HEAD(s, a->name, k);
  print_shared(a, s, USE_DO | USE_V | USE_ACC, a->BQ);
  sb_printf(s, "  %s *out = (%s *)a.b[%d];\n", a->T, a->T, a->bres);
  if (a->bacc >= 0) sb_printf(s, "  const %s *acc0 = (const %s *)a.b[%d];\n", a->T, a->T, a->bacc);
  print_qtile_loop(a, s);
  char acc0[96];
  if (a->bacc >= 0) snprintf(acc0, sizeof acc0, "(double)acc0[row0 * %lldLL + x]", (long long)D);
  else snprintf(acc0, sizeof acc0, "0");
  sb_printf(s, "    for (int x = tid; x < nq * %lld; x += nt) {\n      const int at = x / %lld * %lld + x %% %lld;\n"
               "      sq[at] = q[row0 * %lldLL + x];\n      sdo[at] = dout[row0 * %lldLL + x];\n"
               "      sacc[x] = %s;\n    }\n",
            (long long)D, (long long)D, (long long)LD, (long long)D, (long long)D, (long long)D, acc0);
  char pc[160];
  sb_printf(s, "    for (int r = tid; r < nq; r += nt) {\n      const long long row = row0 + r;\n"
               "      qp[r] = %s;\n", pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  print_stats_in(a, s, "      ");
  sb_puts(s, "    }\n");
  sb_printf(s, "    for (long long j0 = 0; j0 < %lldLL; j0 += %d) {\n", (long long)a->Tk, a->BK);
  sb_printf(s, "      const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n", (long long)a->Tk, a->BK,
            (long long)a->Tk, a->BK);
  print_key_loads(a, s, 1, "      ");
  print_any(a, s, "      ");
  sb_puts(s, "      for (int x = tid; x < nq * nk; x += nt) {\n");
  print_p(a, s, 1);
  sb_puts(s, "      }\n      __syncthreads();\n");
  sb_printf(s, "      for (int x = tid; x < nq * %lld; x += nt) {\n        const int r = x / %lld, e = x %% %lld;\n"
               "        double g = 0;\n        for (int c = 0; c < nk; c++) g += ss[r * %d + c] * (double)sk[c * %lld + e];\n"
               "        sacc[x] += %s * g;\n      }\n    }\n",
            (long long)D, (long long)D, (long long)D, a->BK, (long long)LD, a->scale);
  sb_printf(s, "    __syncthreads();\n    for (int x = tid; x < nq * %lld; x += nt) out[row0 * %lldLL + x] = (%s)sacc[x];\n"
               "  }\n}\n",
            (long long)D, (long long)D, a->T);
}

/* dk (part 1), dv (part 2) or both (part 3: one pass over the scores for
 * the two, ss holding ds and ss2 p, sacc dk and sacc2 dv): one block per
 * (batch, kv head, key tile), the queries of every query head reading the
 * kv head streamed through it. */
static void print_dkv(const Att *a, StrBuf *s, int k, int part) {
  int64_t D = a->D, LD = D + 1, nkt = (a->Tk + a->BK - 1) / a->BK;
  int dk = part == 1 || part == 3, both = part == 3;
  CG_CUDA_HEAD(s, a->name, k);
  print_shared(a, s, USE_DO | (dk ? USE_V : 0) | USE_ACC, a->BK);
  if (both)
    sb_printf(s, "  __shared__ double ss2[%d], sacc2[%lld];\n  %s *out2 = (%s *)a.b[%d];\n", a->BQ * a->BK,
              (long long)(a->BK * D), a->T, a->T, a->bres2);
  sb_printf(s, "  %s *out = (%s *)a.b[%d];\n", a->T, a->T, a->bres);
  if (a->bacc >= 0) sb_printf(s, "  const %s *acc0 = (const %s *)a.b[%d];\n", a->T, a->T, a->bacc);
  sb_printf(s, "  for (long long t = blockIdx.x; t < %lldLL; t += gridDim.x) {\n", (long long)(a->B * a->Hkv * nkt));
  sb_printf(s, "    const long long bk = t / %lldLL, j0 = t %% %lldLL * %d, b = bk / %lldLL, hk = bk %% %lldLL;\n",
            (long long)nkt, (long long)nkt, a->BK, (long long)a->Hkv, (long long)a->Hkv);
  sb_printf(s, "    const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n", (long long)a->Tk, a->BK,
            (long long)a->Tk, a->BK);
  sb_printf(s, "    const long long kvo = bk * %lldLL;\n", (long long)(a->Tk * D));
  print_key_loads(a, s, dk, "    ");
  if (a->bacc >= 0)
    sb_printf(s, "    for (int x = tid; x < nk * %lld; x += nt) sacc[x] = (double)acc0[kvo + j0 * %lldLL + x];\n",
              (long long)D, (long long)D);
  else
    sb_printf(s, "    for (int x = tid; x < nk * %lld; x += nt) sacc[x] = 0;\n", (long long)D);
  if (both) sb_printf(s, "    for (int x = tid; x < nk * %lld; x += nt) sacc2[x] = 0;\n", (long long)D);
  print_head_tiles(a, s, a->BQ);
  sb_printf(s, "        for (int x = tid; x < nq * %lld; x += nt) {\n          const int at = x / %lld * %lld + x %% %lld;\n"
               "          sq[at] = q[row0 * %lldLL + x];\n          sdo[at] = dout[row0 * %lldLL + x];\n        }\n",
            (long long)D, (long long)D, (long long)LD, (long long)D, (long long)D, (long long)D);
  char pc[160];
  sb_printf(s, "        for (int r = tid; r < nq; r += nt) {\n          const long long row = row0 + r;\n"
               "          qp[r] = %s;\n", pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  print_stats_in(a, s, "          ");
  sb_puts(s, "        }\n");
  print_any(a, s, "        ");
  sb_puts(s, "        for (int x = tid; x < nq * nk; x += nt) {\n");
  print_p(a, s, dk);
  if (both) sb_printf(s, "          ss2[r * %d + c] = p;\n", a->BK);
  sb_puts(s, "        }\n        __syncthreads();\n");
  sb_printf(s, "        for (int x = tid; x < nk * %lld; x += nt) {\n          const int c = x / %lld, e = x %% %lld;\n"
               "          double g = 0%s;\n"
               "          for (int r = 0; r < nq; r++) {\n            g += ss[r * %d + c] * (double)%s[r * %lld + e];\n",
            (long long)D, (long long)D, (long long)D, both ? ", g2 = 0" : "", a->BK, dk ? "sq" : "sdo", (long long)LD);
  if (both) sb_printf(s, "            g2 += ss2[r * %d + c] * (double)sdo[r * %lld + e];\n", a->BK, (long long)LD);
  sb_printf(s, "          }\n          sacc[x] += %s%sg;\n", dk ? a->scale : "", dk ? " * " : "");
  if (both) sb_puts(s, "          sacc2[x] += g2;\n");
  sb_puts(s, "        }\n      }\n    }\n");
  sb_printf(s, "    __syncthreads();\n    for (int x = tid; x < nk * %lld; x += nt) {\n"
               "      out[kvo + j0 * %lldLL + x] = (%s)sacc[x];\n",
            (long long)D, (long long)D, a->T);
  if (both) sb_printf(s, "      out2[kvo + j0 * %lldLL + x] = (%s)sacc2[x];\n", (long long)D, a->T);
  sb_puts(s, "    }\n  }\n}\n");
}

/* ---- f32 operands: register-tiled kernels ----
 * attention (the forward), and attention_bwd's statistics, dq and dk / dv
 * kernels, for f32 operands whose head_dim is a multiple of 4: arithmetic
 * in float (the softmax statistics too; lse and drow keep their double
 * scratch).  128 threads as 16 row groups of 8 lanes: thread (rg, cg) owns
 * rows rg + 16 i (i < RI) and columns cg + 8 j (j < CJ) of the R x C score
 * tile, and the float4 column groups cg + 8 g (g < GJ) of its rows of the
 * R x D accumulator, which lives in registers.  A row's 8 lanes are in one
 * warp: its max and sum are three xor shuffles, so every thread holds its
 * rows' m and l.  Shared tiles are float4 rows padded by one float4
 * (D + 4 floats): a quarter warp reading a float4 of 8 different rows hits
 * each bank once.  Per float4 step of a dot product a thread loads
 * RI + CJ float4 for 4 RI CJ FMAs; per 4 columns of P V, RI + 4 GJ float4
 * for 16 RI GJ FMAs.  Rows and columns past the tile's end are zero in
 * shared memory and masked, so the loops have constant trip counts.  Rows
 * are queries, except in dk / dv: there they are the block's keys and the
 * columns the streamed queries. */
enum { FK_FWD, FK_STATS, FK_DQ, FK_DK, FK_DV, FK_DKV };   /* FK_DKV: dk and dv in one kernel */

typedef struct {
  int R, C;              /* tile rows, columns */
  int RI, CJ, G, GJ;     /* per thread: rows, columns; float4 groups per row; per thread */
  long long P4, LP4;     /* row strides in float4: operand tiles, the score tile sp */
} FTile;

/* Static shared memory of kernel kind for tiles R x C (bytes): the operand
 * tiles, the score tile (two for dk + dv: p and ds), positions, the dk / dv
 * kernels' lse and drow. */
static int64_t f_smem(const Att *a, int kind, int64_t R, int64_t C) {
  int64_t ops = kind == FK_STATS ? R + C : kind == FK_DQ || kind == FK_DK || kind == FK_DKV ? 2 * R + 2 * C : R + 2 * C;
  int64_t sp = kind == FK_STATS ? 0 : (kind == FK_DKV ? 2 : 1) * R * (C + 4) * 4;
  return ops * (a->D + 4) * 4 + sp + 8 * (R + C) + (kind >= FK_DK ? 8 * C : 0) + 16;
}

/* The largest R x C that fits: R in 16 .. 64 (RI <= 4), C in 8 .. 64
 * (CJ <= 4; 8 for the statistics, which keep no accumulator), neither
 * larger than the rows need.  Equal areas load as many float4 per score;
 * C >= 16 then halves the per-row shuffles and rescales per key, and a
 * larger R streams the other side fewer times.  0, or 1 when none fits. */
static int f_choose(const Att *a, int kind, FTile *t) {
  int64_t rmax = pow2_at_least(kind >= FK_DK ? a->Tk : a->Tq), cmax = pow2_at_least(kind >= FK_DK ? a->Tq : a->Tk);
  rmax = rmax < 16 ? 16 : rmax;
  cmax = cmax < 8 ? 8 : cmax;
  int best = 0;
  for (int R = 64; R >= 16; R /= 2)
    for (int C = 64; C >= 8; C /= 2) {
      if (R <= rmax && C <= cmax && C / 8 <= (kind == FK_STATS ? 8 : 4) && f_smem(a, kind, R, C) <= ATTN_SMEM_MAX &&
          (!best || R * C > t->R * t->C || (R * C == t->R * t->C && C >= 16 && t->C < 16))) {
        best = 1;
        t->R = R, t->C = C;
      }
    }
  if (!best) return 1;
  t->RI = t->R / 16, t->CJ = t->C / 8, t->G = (int)(a->D / 4), t->GJ = (t->G + 7) / 8;
  t->P4 = a->D / 4 + 1, t->LP4 = t->C / 4 + 1;
  return 0;
}

/* __shared__ float4 NAME4[rows * p4], seen as floats through NAME. */
static void f_shared(StrBuf *s, const char *name, int64_t rows, long long p4) {
  sb_printf(s, "  __shared__ float4 %s4[%lld];\n  float *const %s = (float *)%s4;\n", name, (long long)rows * p4, name,
            name);
}

/* rows x D floats of src from element base into tile dst; rows n and up 0. */
static void f_load(const Att *a, StrBuf *s, const char *dst, const char *src, const char *base, int64_t rows,
                   const char *n, const char *ind) {
  long long D = (long long)a->D;
  sb_printf(s, "%sfor (int x = tid; x < %lld; x += nt)\n%s  %s[x / %lld * %lld + x %% %lld] = x < %s * %lld ? %s[%s + x] : 0.0f;\n",
            ind, (long long)rows * D, ind, dst, D, D + 4, D, n, D, src, base);
}

/* `for (VAR = 0; VAR < n; VAR++) {`, unrolled (the arrays it indexes
 * stay in registers); f_end closes it. */
static void f_for(StrBuf *s, const char *ind, const char *var, int n) {
  sb_printf(s, "%s#pragma unroll\n%sfor (int %s = 0; %s < %d; %s++) {\n", ind, ind, var, var, n, var);
}

static void f_end(StrBuf *s, const char *ind) { sb_printf(s, "%s}\n", ind); }

/* float s[RI][CJ]: s[i][j] = row rg + 16 i of tile A . row cg + 8 j of B;
 * with A2, u[i][j] the same of A2 and B2 (one loop over the float4s). */
static void f_dots(const FTile *t, StrBuf *s, const char *A, const char *B, const char *A2, const char *B2,
                   const char *ind) {
  char in[32], in2[32], in3[32];
  snprintf(in, sizeof in, "%s  ", ind);
  snprintf(in2, sizeof in2, "%s    ", ind);
  snprintf(in3, sizeof in3, "%s      ", ind);
  sb_printf(s, "%sfloat s[%d][%d]", ind, t->RI, t->CJ);
  if (A2) sb_printf(s, ", u[%d][%d]", t->RI, t->CJ);
  sb_puts(s, ";\n");
  f_for(s, ind, "i", t->RI);
  sb_printf(s, "%sfor (int j = 0; j < %d; j++) s[i][j] = %s0.0f;\n", in, t->CJ, A2 ? "u[i][j] = " : "");
  f_end(s, ind);
  sb_printf(s, "%sfor (int e = 0; e < %d; e++) {\n", ind, t->G);
  for (int pass = 0; pass < (A2 ? 2 : 1); pass++) {
    const char *x = pass ? A2 : A, *y = pass ? B2 : B, *acc = pass ? "u" : "s";
    sb_printf(s, "%s{\n%sfloat4 x[%d], y[%d];\n", in, in2, t->RI, t->CJ);
    f_for(s, in2, "i", t->RI);
    sb_printf(s, "%s  x[i] = %s4[(rg + 16 * i) * %lld + e];\n", in2, x, t->P4);
    f_end(s, in2);
    f_for(s, in2, "j", t->CJ);
    sb_printf(s, "%s  y[j] = %s4[(cg + 8 * j) * %lld + e];\n", in2, y, t->P4);
    f_end(s, in2);
    f_for(s, in2, "i", t->RI);
    f_for(s, in3, "j", t->CJ);
    for (int c = 0; c < 4; c++) sb_printf(s, "%s  %s[i][j] += x[i].%c * y[j].%c;\n", in3, acc, "xyzw"[c], "xyzw"[c]);
    f_end(s, in3);
    f_end(s, in2);
    sb_printf(s, "%s}\n", in);
  }
  sb_printf(s, "%s}\n", ind);
}

/* float4 O[RI][GJ] = 0: the thread's part of an R x D accumulator (o, and
 * the dk + dv kernel's second, o2). */
static void f_acc_zero(const FTile *t, StrBuf *s, const char *O, const char *ind) {
  sb_printf(s, "%sfloat4 %s[%d][%d];\n", ind, O, t->RI, t->GJ);
  f_for(s, ind, "i", t->RI);
  sb_printf(s, "%s  for (int g = 0; g < %d; g++) %s[i][g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n", ind, t->GJ, O);
  f_end(s, ind);
}

/* O[i][g] += sum over the tile's C columns c of P[row rg + 16 i][c] (a
 * score tile: sp, or the dk + dv kernel's sds) times float4 group cg + 8 g
 * of row c of tile X: P V, ds K, ds^T Q, P^T dO. */
static void f_acc(const FTile *t, StrBuf *s, const char *P, const char *X, const char *O, const char *ind) {
  char in[32], in2[32], own[80] = "";
  snprintf(in, sizeof in, "%s  ", ind);
  snprintf(in2, sizeof in2, "%s    ", ind);
  if (t->G % 8) snprintf(own, sizeof own, "cg + 8 * g >= %d ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : ", t->G);
  sb_printf(s, "%sfor (int c = 0; c < %d; c++) {\n%sfloat4 p[%d], w[%d];\n", ind, t->C / 4, in, t->RI, t->GJ);
  f_for(s, in, "i", t->RI);
  sb_printf(s, "%s  p[i] = %s4[(rg + 16 * i) * %lld + c];\n", in, P, t->LP4);
  f_end(s, in);
  for (int u = 0; u < 4; u++) {
    f_for(s, in, "g", t->GJ);
    sb_printf(s, "%s  w[g] = %s%s4[(4 * c + %d) * %lld + cg + 8 * g];\n", in, own, X, u, t->P4);
    f_end(s, in);
    f_for(s, in, "i", t->RI);
    f_for(s, in2, "g", t->GJ);
    for (int c = 0; c < 4; c++)
      sb_printf(s, "%s  %s[i][g].%c += p[i].%c * w[g].%c;\n", in2, O, "xyzw"[c], "xyzw"[u], "xyzw"[c]);
    f_end(s, in2);
    f_end(s, in);
  }
  sb_printf(s, "%s}\n", ind);
}

/* Row rg + 16 i of accumulator O times f (an expression of i) into
 * dst[(base + row) * D ...] for rows below n. */
static void f_store(const Att *a, const FTile *t, StrBuf *s, const char *O, const char *dst, const char *base,
                    const char *n, const char *f, const char *ind) {
  char in[32], own[48] = "";
  snprintf(in, sizeof in, "%s  ", ind);
  if (t->G % 8) snprintf(own, sizeof own, " && cg + 8 * g < %d", t->G);
  f_for(s, ind, "i", t->RI);
  f_for(s, in, "g", t->GJ);
  sb_printf(s, "%s  if (rg + 16 * i < %s%s) {\n", in, n, own);
  sb_printf(s, "%s    float *y = %s + (%s + rg + 16 * i) * %lldLL + 4 * (cg + 8 * g);\n", in, dst, base,
            (long long)a->D);
  sb_printf(s, "%s    const float f = %s;\n", in, f);
  for (int c = 0; c < 4; c++) sb_printf(s, "%s    y[%d] = %s[i][g].%c * f;\n", in, c, O, "xyzw"[c]);
  sb_printf(s, "%s  }\n", in);
  f_end(s, in);
  f_end(s, ind);
}

/* v = the sum (op '+') or max (op 'm') of v over the row's 8 lanes */
static void f_row_reduce(StrBuf *s, const char *v, char op, const char *ind) {
  for (int o = 1; o < 8; o *= 2) {
    if (op == '+') sb_printf(s, "%s%s += __shfl_xor_sync(0xffffffffu, %s, %d);\n", ind, v, v, o);
    else sb_printf(s, "%s%s = fmaxf(%s, __shfl_xor_sync(0xffffffffu, %s, %d));\n", ind, v, v, v, o);
  }
}

/* The opening of an f32 kernel: thread coordinates, constants, operands. */
static void f_head(const Att *a, StrBuf *s, int use_v, int use_do) {
  sb_puts(s, "  const int tid = threadIdx.x, nt = blockDim.x, rg = tid >> 3, cg = tid & 7;\n");
  sb_printf(s, "  const float scl = (float)%s, ninf = -(float)TS_INF;\n", a->scale);
  sb_printf(s, "  const float *q = (const float *)a.b[%d], *k = (const float *)a.b[%d];\n", a->bq, a->bk);
  if (use_v) sb_printf(s, "  const float *v = (const float *)a.b[%d];\n", a->bv);
  if (use_do) sb_printf(s, "  const float *dout = (const float *)a.b[%d];\n", a->bdo);
}

/* The causal mask's positions of the thread's rows and columns into
 * registers (pr, pc), once per tile pair rather than twice per score. */
static void f_pos(const Att *a, const FTile *t, StrBuf *s, int rows_are_keys, const char *ind) {
  if (!a->causal && a->bdoc < 0 && a->window <= 0 && a->bslope < 0) return;
  sb_printf(s, "%slong long pr[%d], pc[%d];\n", ind, t->RI, t->CJ);
  f_for(s, ind, "i", t->RI);
  sb_printf(s, "%s  pr[i] = %s[rg + 16 * i];\n", ind, rows_are_keys ? "kp" : "qp");
  f_end(s, ind);
  f_for(s, ind, "j", t->CJ);
  sb_printf(s, "%s  pc[j] = %s[cg + 8 * j];\n", ind, rows_are_keys ? "qp" : "kp");
  f_end(s, ind);
}

/* `ok`: score (i, j) is unmasked: its column is in range and, causal, the
 * key's position is not after the query's (f_pos). */
static void f_ok(const Att *a, StrBuf *s, int rows_are_keys, const char *ind) {
  char mk[512];
  mask_of(a, mk, sizeof mk, rows_are_keys ? "pr[i]" : "pc[j]", rows_are_keys ? "pc[j]" : "pr[i]");
  sb_printf(s, "%sconst bool ok = cg + 8 * j < %s%s%s;\n", ind, rows_are_keys ? "nq" : "nk",
            strcmp(mk, "0") ? " && !" : "", strcmp(mk, "0") ? mk : "");
}

/* ALiBi's term of score (i, j) after the scale, "- asl |pr[i] - pc[j]|" in
 * float (the positions' low halves with documents; f_pos loads them), or
 * "" without slopes. */
static const char *f_bias(const Att *a) {
  static char buf[160];   /* used at once by the caller's printf */
  if (a->bslope < 0) return "";
  const char *lo = a->bdoc >= 0 ? " & 0xffffffffLL" : "";
  snprintf(buf, sizeof buf, " - (float)asl * fabsf((float)((pr[i]%s) - (pc[j]%s)))", lo, lo);
  return buf;
}

/* Opens the loop over key tiles j0 (C keys): loads k (and v when use_v;
 * zero past nk) and positions, then `any` (print_any). */
static void f_key_tile(const Att *a, const FTile *t, StrBuf *s, int use_v) {
  sb_printf(s, "    for (long long j0 = 0; j0 < %lldLL; j0 += %d) {\n", (long long)a->Tk, t->C);
  sb_printf(s, "      const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n      __syncthreads();\n",
            (long long)a->Tk, t->C, (long long)a->Tk, t->C);
  char base[64];
  snprintf(base, sizeof base, "kvo + j0 * %lldLL", (long long)a->D);
  f_load(a, s, "sk", "k", base, t->C, "nk", "      ");
  if (use_v) f_load(a, s, "sv", "v", base, t->C, "nk", "      ");
  char pc[160];
  sb_printf(s, "      for (int c = tid; c < nk; c += nt) kp[c] = %s;\n", pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
  print_any(a, s, "      ");
}

/* The forward (stats = 0: attention -> o) or the backward's statistics
 * (stats = 1: lse = m + log l and drow = rowsum(do * o) of each query row
 * into the double scratch).  One block per (batch, query head, R
 * queries), keys streamed C at a time, an online softmax per row. */
static void print_fwd_f32(Att *a, const FTile *t, StrBuf *s, int k, int stats) {
  a->BQ = t->R;
  CG_CUDA_HEAD(s, a->name, k);
  f_shared(s, "sq", t->R, t->P4);
  f_shared(s, "sk", t->C, t->P4);
  if (!stats) {
    f_shared(s, "sv", t->C, t->P4);
    f_shared(s, "sp", t->R, t->LP4);
  }
  sb_printf(s, "  __shared__ long long qp[%d], kp[%d];\n", t->R, t->C);
  f_head(a, s, !stats, 0);
  if (!stats) sb_printf(s, "  float *out = (float *)a.b[%d];\n", a->bres);
  else sb_printf(s, "  const float *o = (const float *)a.b[%d], *dout = (const float *)a.b[%d];\n"
                    "  double *scr = (double *)a.b[%d];\n", a->bo, a->bdo, a->bscr);
  print_qtile_loop(a, s);
  char base[64];
  snprintf(base, sizeof base, "row0 * %lldLL", (long long)a->D);
  f_load(a, s, "sq", "q", base, t->R, "nq", "    ");
  char pc[160];
  sb_printf(s, "    for (int r = tid; r < %d; r += nt) qp[r] = %s;\n", t->R, pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  sb_printf(s, "    float m[%d], l[%d];\n", t->RI, t->RI);
  f_for(s, "    ", "i", t->RI);
  sb_puts(s, "      m[i] = ninf, l[i] = 0.0f;\n");
  f_end(s, "    ");
  if (!stats) f_acc_zero(t, s, "o", "    ");
  f_key_tile(a, t, s, !stats);
  f_dots(t, s, "sq", "sk", NULL, NULL, "      ");
  f_pos(a, t, s, 0, "      ");
  /* per row: mask and scale, the tile's max over the row's lanes, the
   * rescale of what came before, p = exp(s - m) */
  f_for(s, "      ", "i", t->RI);
  sb_puts(s, "        float mt = ninf;\n");
  f_for(s, "        ", "j", t->CJ);
  f_ok(a, s, 0, "          ");
  sb_printf(s, "          s[i][j] = ok ? s[i][j] * scl%s : ninf;\n          mt = fmaxf(mt, s[i][j]);\n", f_bias(a));
  f_end(s, "        ");
  f_row_reduce(s, "mt", 'm', "        ");
  sb_puts(s, "        const float mn = fmaxf(m[i], mt), mx = mn == ninf ? 0.0f : mn, corr = expf(m[i] - mx);\n"
             "        float sum = 0.0f;\n");
  f_for(s, "        ", "j", t->CJ);
  sb_puts(s, "          s[i][j] = expf(s[i][j] - mx);\n          sum += s[i][j];\n");
  f_end(s, "        ");
  f_row_reduce(s, "sum", '+', "        ");
  sb_puts(s, "        l[i] = l[i] * corr + sum;\n        m[i] = mn;\n");
  if (!stats) {
    f_for(s, "        ", "g", t->GJ);
    sb_puts(s, "          o[i][g].x *= corr, o[i][g].y *= corr, o[i][g].z *= corr, o[i][g].w *= corr;\n");
    f_end(s, "        ");
    f_for(s, "        ", "j", t->CJ);
    sb_printf(s, "          sp[(rg + 16 * i) * %lld + cg + 8 * j] = s[i][j];\n", 4 * t->LP4);
    f_end(s, "        ");
  }
  f_end(s, "      ");
  if (!stats) {
    sb_puts(s, "      __syncthreads();\n");
    f_acc(t, s, "sp", "sv", "o", "      ");
  }
  sb_puts(s, "    }\n");
  if (!stats) {
    f_store(a, t, s, "o", "out", "row0", "nq", "l[i] > 0.0f ? 1.0f / l[i] : 0.0f", "    ");
  } else {   /* drow by the row's 8 lanes, strided over the head dim */
    long long D = (long long)a->D;
    f_for(s, "    ", "i", t->RI);
    sb_printf(s, "      const int r = rg + 16 * i;\n      const long long row = row0 + r;\n      float d = 0.0f;\n"
                 "      if (r < nq)\n        for (int e = cg; e < %lld; e += 8) d += dout[row * %lldLL + e] * o[row * %lldLL + e];\n",
              D, D, D);
    f_row_reduce(s, "d", '+', "      ");
    sb_printf(s, "      if (cg == 0 && r < nq) {\n        scr[row] = l[i] > 0.0f ? (double)m[i] + log((double)l[i]) : -TS_INF;\n"
                 "        scr[%lldLL + row] = d;\n      }\n",
              (long long)(a->B * a->Hq * a->Tq));
    f_end(s, "    ");
  }
  sb_puts(s, "  }\n}\n");
}

/* dl, dd = lse and drow of scratch row `row` when `in`, else 0; lse = -inf
 * (the row saw no key: its p is 0) becomes +inf, so exp(s - lse) = 0. */
static void f_stats_in(const Att *a, StrBuf *s, const char *dl, const char *dd, const char *row, const char *in,
                       const char *ind) {
  long long N = (long long)(a->B * a->Hq * a->Tq);
  sb_printf(s, "%sconst double x = %s ? ((const double *)a.b[%d])[%s] : 0.0;\n", ind, in, a->bscr, row);
  sb_printf(s, "%s%s = x == -TS_INF ? (float)TS_INF : (float)x;\n", ind, dl);
  sb_printf(s, "%s%s = %s ? (float)((const double *)a.b[%d])[%lldLL + %s] : 0.0f;\n", ind, dd, in, a->bscr, N, row);
}

/* dq: one block per (batch, query head, R queries), keys streamed C at a
 * time: p = exp(scale q.k - lse), ds = p (do.v - drow), dq += scale ds k. */
static void print_dq_f32(Att *a, const FTile *t, StrBuf *s, int k) {
  a->BQ = t->R;
  CG_CUDA_HEAD(s, a->name, k);
  f_shared(s, "sq", t->R, t->P4);
  f_shared(s, "sdo", t->R, t->P4);
  f_shared(s, "sk", t->C, t->P4);
  f_shared(s, "sv", t->C, t->P4);
  f_shared(s, "sp", t->R, t->LP4);
  sb_printf(s, "  __shared__ long long qp[%d], kp[%d];\n", t->R, t->C);
  f_head(a, s, 1, 1);
  sb_printf(s, "  float *out = (float *)a.b[%d];\n", a->bres);
  print_qtile_loop(a, s);
  char base[64];
  snprintf(base, sizeof base, "row0 * %lldLL", (long long)a->D);
  f_load(a, s, "sq", "q", base, t->R, "nq", "    ");
  f_load(a, s, "sdo", "dout", base, t->R, "nq", "    ");
  char pc[160];
  sb_printf(s, "    for (int r = tid; r < %d; r += nt) qp[r] = %s;\n", t->R, pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  sb_printf(s, "    float lse[%d], drw[%d];\n", t->RI, t->RI);
  f_for(s, "    ", "i", t->RI);
  f_stats_in(a, s, "lse[i]", "drw[i]", "row0 + rg + 16 * i", "rg + 16 * i < nq", "      ");
  f_end(s, "    ");
  f_acc_zero(t, s, "o", "    ");
  f_key_tile(a, t, s, 1);
  f_dots(t, s, "sq", "sk", "sdo", "sv", "      ");
  f_pos(a, t, s, 0, "      ");
  f_for(s, "      ", "i", t->RI);
  f_for(s, "        ", "j", t->CJ);
  f_ok(a, s, 0, "          ");
  sb_printf(s, "          const float p = ok ? expf(s[i][j] * scl%s - lse[i]) : 0.0f;\n"
               "          sp[(rg + 16 * i) * %lld + cg + 8 * j] = p * (u[i][j] - drw[i]);\n", f_bias(a), 4 * t->LP4);
  f_end(s, "        ");
  f_end(s, "      ");
  sb_puts(s, "      __syncthreads();\n");
  f_acc(t, s, "sp", "sk", "o", "      ");
  sb_puts(s, "    }\n");
  f_store(a, t, s, "o", "out", "row0", "nq", "scl", "    ");
  sb_puts(s, "  }\n}\n");
}

/* dk (part 1), dv (part 2) or both (part 3: one pass over the scores for
 * the two, p into sp and ds into sds, dk in o and dv in o2): one block per
 * (batch, kv head, R keys), the queries of every query head reading the kv
 * head streamed C at a time: dk += scale ds^T q, dv += p^T do. */
static void print_dkv_f32(Att *a, const FTile *t, StrBuf *s, int k, int part) {
  int dk = part == 1 || part == 3, dv = part == 2 || part == 3;
  long long D = (long long)a->D, nkt = (long long)((a->Tk + t->R - 1) / t->R);
  CG_CUDA_HEAD(s, a->name, k);
  f_shared(s, "sk", t->R, t->P4);
  if (dk) f_shared(s, "sv", t->R, t->P4);
  f_shared(s, "sq", t->C, t->P4);
  f_shared(s, "sdo", t->C, t->P4);
  if (dv) f_shared(s, "sp", t->R, t->LP4);
  if (dk) f_shared(s, "sds", t->R, t->LP4);
  sb_printf(s, "  __shared__ float slse[%d], sdrw[%d];\n  __shared__ long long qp[%d], kp[%d];\n", t->C, t->C, t->C,
            t->R);
  f_head(a, s, dk, 1);
  sb_printf(s, "  float *out = (float *)a.b[%d];\n", a->bres);
  if (part == 3) sb_printf(s, "  float *out2 = (float *)a.b[%d];\n", a->bres2);
  sb_printf(s, "  for (long long t = blockIdx.x; t < %lldLL; t += gridDim.x) {\n", (long long)(a->B * a->Hkv) * nkt);
  sb_printf(s, "    const long long bk = t / %lldLL, j0 = t %% %lldLL * %d, b = bk / %lldLL, hk = bk %% %lldLL;\n", nkt,
            nkt, t->R, (long long)a->Hkv, (long long)a->Hkv);
  sb_printf(s, "    const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n", (long long)a->Tk, t->R,
            (long long)a->Tk, t->R);
  sb_printf(s, "    const long long kvo = bk * %lldLL;\n    __syncthreads();\n", (long long)a->Tk * D);
  char base[64];
  snprintf(base, sizeof base, "kvo + j0 * %lldLL", D);
  f_load(a, s, "sk", "k", base, t->R, "nk", "    ");
  if (dk) f_load(a, s, "sv", "v", base, t->R, "nk", "    ");
  char pc[160];
  sb_printf(s, "    for (int c = tid; c < %d; c += nt) kp[c] = %s;\n", t->R, pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
  if (dk) f_acc_zero(t, s, "o", "    ");
  if (dv) f_acc_zero(t, s, dk ? "o2" : "o", "    ");
  print_head_tiles(a, s, t->C);
  snprintf(base, sizeof base, "row0 * %lldLL", D);
  f_load(a, s, "sq", "q", base, t->C, "nq", "        ");
  f_load(a, s, "sdo", "dout", base, t->C, "nq", "        ");
  sb_printf(s, "        for (int r = tid; r < %d; r += nt) {\n          qp[r] = %s;\n", t->C,
            pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  f_stats_in(a, s, "slse[r]", "sdrw[r]", "row0 + r", "r < nq", "          ");
  sb_puts(s, "        }\n");
  print_any(a, s, "        ");
  f_dots(t, s, "sk", "sq", dk ? "sv" : NULL, dk ? "sdo" : NULL, "        ");
  f_pos(a, t, s, 1, "        ");
  f_for(s, "        ", "i", t->RI);
  f_for(s, "          ", "j", t->CJ);
  f_ok(a, s, 1, "            ");
  sb_printf(s, "            const float p = ok ? expf(s[i][j] * scl%s - slse[cg + 8 * j]) : 0.0f;\n", f_bias(a));
  if (dv) sb_printf(s, "            sp[(rg + 16 * i) * %lld + cg + 8 * j] = p;\n", 4 * t->LP4);
  if (dk) sb_printf(s, "            sds[(rg + 16 * i) * %lld + cg + 8 * j] = p * (u[i][j] - sdrw[cg + 8 * j]);\n",
                    4 * t->LP4);
  f_end(s, "          ");
  f_end(s, "        ");
  sb_puts(s, "        __syncthreads();\n");
  if (dk) f_acc(t, s, "sds", "sq", "o", "        ");
  if (dv) f_acc(t, s, "sp", "sdo", dk ? "o2" : "o", "        ");
  sb_puts(s, "      }\n    }\n");
  snprintf(base, sizeof base, "bk * %lldLL + j0", (long long)a->Tk);
  if (dk) f_store(a, t, s, "o", "out", base, "nk", "scl", "    ");
  if (dv) f_store(a, t, s, dk ? "o2" : "o", dk ? "out2" : "out", base, "nk", "1.0f", "    ");
  sb_puts(s, "  }\n}\n");
}

/* ---- tensor cores: bf16 or f16 operands (docs/cuda.md "Attention on tensor cores") ----
 * (written for bf16; an f16 kernel is the same text with the element
 * type's two names swapped, tc_retype: WMMA takes __half the same way,
 * its fragments are wider, 8 registers for 4)
 * attention whose q, k and v are bf16 values (the f32 operands are casts
 * of bf16 values, as pass precision makes them under --precision bf16:
 * the conversion back to bf16 in the shared-memory loads is exact) runs
 * S = Q K^T and O += P V as 16x16x16 WMMA products of bf16 with f32
 * accumulation, P rounded to bf16 before P V as FlashAttention-2 does (l
 * sums the unrounded p), the online softmax in f32.  128 threads, 4 warps,
 * BQ = 64 queries per block: warp w owns rows 16 w .. 16 w + 15, its Q as
 * D / 16 matrix_a fragments and its O as D / 16 f32 accumulators, both in
 * registers for the whole key loop.  Keys stream BK at a time (64 at head
 * dim 64, 32 at 128: static shared memory under 47 KiB).  Shared memory,
 * one 32-byte aligned arena: sK, sV [BK][D + 8] bf16, sS [BQ][BK + 4]
 * f32 (scores; then each warp's 16 x 16 scratch for the rescale of O), sP
 * [BQ][BK + 8] bf16; the Q tile [BQ][D + 8] bf16 aliases them before the
 * key loop.  Softmax: lane l of a warp takes row l / 2, columns of parity
 * l % 2; one xor shuffle joins the two halves.  The rescale O *= corr
 * needs each element's row, which WMMA's fragment layout does not give:
 * each accumulator goes through the warp's scratch (store, scale by row,
 * load).  The WMMA API: CUDA's nvcuda::wmma under the emulator
 * (tests/cuda/emu/ts_cuda_emu.h), the same subset over NVRTC's built-in
 * __mma_bf16_m16n16k16_* intrinsics otherwise (NVRTC finds no mma.h
 * without the toolkit's include path), as ts_wmma. */
enum { TC_BQ = 64 };

typedef struct {
  int BK;
  long long LDH, LDS, LDP;        /* row strides: the bf16 operand tiles, sS (f32), sP (bf16) */
  long long oK, oV, oS, oP, bytes;  /* byte offsets in the arena, its size */
} TcTile;

static int tc_choose(const Att *a, TcTile *t) {
  int64_t kmax = pow2_at_least(a->Tk) < 16 ? 16 : pow2_at_least(a->Tk);   /* no larger than the keys need */
  for (int bk = 64; bk >= 16; bk /= 2) {
    if (bk > kmax) continue;
    t->BK = bk;
    t->LDH = a->D + 8, t->LDS = bk + 4, t->LDP = bk + 8;
    t->oK = 0, t->oV = bk * t->LDH * 2, t->oS = 2 * t->oV, t->oP = t->oS + TC_BQ * t->LDS * 4;
    t->bytes = t->oP + TC_BQ * t->LDP * 2;
    if (t->bytes < TC_BQ * t->LDH * 2) t->bytes = TC_BQ * t->LDH * 2;   /* the Q tile aliases them */
    if (t->bytes + 8 * TC_BQ + 8 * (TC_BQ + bk) <= ATTN_SMEM_MAX) return 0;
  }
  return 1;
}

/* The 16-bit dtype (bf16 or f16) whose values the operands in[0 .. n) of
 * nd all are, as casts to f32 of such values (exact); IR_VOID if none. */
static IrDtype tc_from_half(const IrBlock *b, const IrNode *nd, const int *in, int n) {
  IrDtype h = IR_VOID;
  for (int i = 0; i < n; i++) {
    const IrNode *c = &b->nodes[nd->in[in[i]]];
    IrDtype d = c->op == IR_OP_CAST && c->nin == 1 ? b->nodes[c->in[0]].type.dtype : IR_VOID;
    if (c->type.dtype != IR_F32 || (d != IR_BF16 && d != IR_F16) || (i && d != h)) return IR_VOID;
    h = d;
  }
  return h;
}

/* attention_bwd's q, k, v and do (operands 1, 2, 3, 5) are values of one 16-bit dtype */
static IrDtype tc_bwd_operands(const IrBlock *b, const IrNode *nd) {
  return nd->type.dtype == IR_F32 ? tc_from_half(b, nd, (const int[]){0, 1, 2, 4}, 4) : IR_VOID;
}

/* An f16 kernel from its bf16 text, src[from ..): the WMMA element type
 * and the rounding into it renamed (the two names only the tensor-core
 * kernels print; the prelude defines both types). */
static void tc_retype(StrBuf *src, size_t from, IrDtype h) {
  if (h != IR_F16) return;
  static const char *const pat[2][2] = {{"ts_wmma::bf16", "ts_wmma::f16"}, {"ts_f32_bf16(", "ts_f32_f16("}};
  StrBuf out = {0};
  sb_write(&out, src->p, from);
  for (size_t i = from; i < src->n;) {
    int k = -1;
    for (int j = 0; j < 2 && k < 0; j++)
      if (src->n - i >= strlen(pat[j][0]) && !memcmp(src->p + i, pat[j][0], strlen(pat[j][0]))) k = j;
    if (k < 0) { sb_putc(&out, src->p[i++]); continue; }
    sb_puts(&out, pat[k][1]);
    i += strlen(pat[k][0]);
  }
  sb_free(src);
  *src = out;
}

/* The WMMA subset as ts_wmma (once per module). */
static void tc_prelude(StrBuf *s) {
  sb_puts(s,
    "#ifndef TS_WMMA_DEFINED\n#define TS_WMMA_DEFINED 1\n"
    "#ifdef TS_CUDA_EMU_H\n"
    "namespace ts_wmma {\nusing namespace nvcuda::wmma;\ntypedef __nv_bfloat16 bf16;\ntypedef __half f16;\n}\n"
    "#else\n"
    "namespace ts_wmma {\n"
    "struct bf16 { unsigned short x; };\nstruct f16 { unsigned short x; };\n"
    "struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {}; struct col_major {};\n"
    "enum layout_t { mem_row_major, mem_col_major };\n"
    "template <class L> struct lay_ { enum { col = 0 }; };\n"
    "template <> struct lay_<col_major> { enum { col = 1 }; };\n"
    "template <class U, int M, int N, int K, class T, class L = void> struct fragment { int x[4]; };\n"
    "template <> struct fragment<accumulator, 16, 16, 16, float, void> { float x[8]; };\n"
    "template <class L> struct fragment<matrix_a, 16, 16, 16, f16, L> { int x[8]; };\n"
    "template <class L> struct fragment<matrix_b, 16, 16, 16, f16, L> { int x[8]; };\n"
    "typedef fragment<accumulator, 16, 16, 16, float, void> acc_;\n"
    "static __device__ __forceinline__ void fill_fragment(acc_ &f, float v) {\n"
    "#pragma unroll\n  for (int i = 0; i < 8; i++) f.x[i] = v;\n}\n"
    "template <class L> static __device__ __forceinline__ void load_matrix_sync(fragment<matrix_a, 16, 16, 16, bf16, L> &f, const bf16 *p, unsigned ldm) {\n"
    "  __mma_bf16_m16n16k16_ld_a(f.x, (const int *)p, ldm, lay_<L>::col);\n}\n"
    "template <class L> static __device__ __forceinline__ void load_matrix_sync(fragment<matrix_b, 16, 16, 16, bf16, L> &f, const bf16 *p, unsigned ldm) {\n"
    "  __mma_bf16_m16n16k16_ld_b(f.x, (const int *)p, ldm, lay_<L>::col);\n}\n"
    "template <class L> static __device__ __forceinline__ void load_matrix_sync(fragment<matrix_a, 16, 16, 16, f16, L> &f, const f16 *p, unsigned ldm) {\n"
    "  __hmma_m16n16k16_ld_a(f.x, (const int *)p, ldm, lay_<L>::col);\n}\n"
    "template <class L> static __device__ __forceinline__ void load_matrix_sync(fragment<matrix_b, 16, 16, 16, f16, L> &f, const f16 *p, unsigned ldm) {\n"
    "  __hmma_m16n16k16_ld_b(f.x, (const int *)p, ldm, lay_<L>::col);\n}\n"
    "static __device__ __forceinline__ void load_matrix_sync(acc_ &f, const float *p, unsigned ldm, layout_t l) {\n"
    "  if (l == mem_col_major) __hmma_m16n16k16_ld_c_f32(f.x, p, ldm, 1);\n  else __hmma_m16n16k16_ld_c_f32(f.x, p, ldm, 0);\n}\n"
    "static __device__ __forceinline__ void store_matrix_sync(float *p, const acc_ &f, unsigned ldm, layout_t l) {\n"
    "  if (l == mem_col_major) __hmma_m16n16k16_st_c_f32(p, (float *)f.x, ldm, 1);\n  else __hmma_m16n16k16_st_c_f32(p, (float *)f.x, ldm, 0);\n}\n"
    "template <class LA, class LB> static __device__ __forceinline__ void mma_sync(acc_ &d, const fragment<matrix_a, 16, 16, 16, bf16, LA> &a,\n"
    "    const fragment<matrix_b, 16, 16, 16, bf16, LB> &b, const acc_ &c) {\n"
    "  __mma_bf16_m16n16k16_mma_f32(d.x, a.x, b.x, c.x, lay_<LA>::col * 2 + lay_<LB>::col, 0);\n}\n"
    "template <class LA, class LB> static __device__ __forceinline__ void mma_sync(acc_ &d, const fragment<matrix_a, 16, 16, 16, f16, LA> &a,\n"
    "    const fragment<matrix_b, 16, 16, 16, f16, LB> &b, const acc_ &c) {\n"
    "  __hmma_m16n16k16_mma_f32f32(d.x, a.x, b.x, c.x, lay_<LA>::col * 2 + lay_<LB>::col, 0);\n}\n"
    "}\n#endif\n"
    "struct alignas(32) ts_smem32 { float v[8]; };\n"
    "#endif\n");
}

/* rows x D f32 values of src (exact bf16 values) from element base into
 * the bf16 tile dst (row stride LDH); rows n and up 0. */
static void tc_load(const Att *a, const TcTile *t, StrBuf *s, const char *dst, const char *src, const char *base,
                    int rows, const char *n, const char *ind) {
  long long D = (long long)a->D;
  sb_printf(s, "%sfor (int x = tid; x < %lld; x += nt)\n%s  %s[x / %lld * %lld + x %% %lld].x = x < %s * %lld ? "
               "ts_f32_bf16(%s[%s + x]) : (unsigned short)0;\n",
            ind, rows * D, ind, dst, D, t->LDH, D, n, D, src, base);
}

/* The forward on tensor cores (see above): attention -> o. */
static void print_fwd_tc(Att *a, const TcTile *t, StrBuf *s) {
  long long D = (long long)a->D, ND = D / 16, NK = t->BK / 16;
  a->BQ = TC_BQ;
  tc_prelude(s);
  CG_CUDA_HEAD(s, a->name, 0);
  sb_printf(s, "  __shared__ ts_smem32 arena[%lld];\n", t->bytes / 32);
  sb_printf(s, "  __shared__ float sc[%d], sl[%d];\n  __shared__ long long qp[%d], kp[%d];\n", TC_BQ, TC_BQ, TC_BQ, t->BK);
  sb_puts(s, "  char *const ar = (char *)arena;\n");
  sb_printf(s, "  ts_wmma::bf16 *const sK = (ts_wmma::bf16 *)(ar + %lld), *const sV = (ts_wmma::bf16 *)(ar + %lld), "
               "*const sP = (ts_wmma::bf16 *)(ar + %lld), *const sQ = (ts_wmma::bf16 *)ar;\n", t->oK, t->oV, t->oP);
  sb_printf(s, "  float *const sS = (float *)(ar + %lld);\n", t->oS);
  sb_puts(s, "  const int tid = threadIdx.x, nt = blockDim.x, w = tid >> 5, lane = tid & 31, rr = lane >> 1, "
             "h = lane & 1;\n");
  sb_printf(s, "  const float scl = (float)%s, ninf = -(float)TS_INF;\n", a->scale);
  sb_printf(s, "  const float *q = (const float *)a.b[%d], *k = (const float *)a.b[%d], *v = (const float *)a.b[%d];\n",
            a->bq, a->bk, a->bv);
  sb_printf(s, "  float *out = (float *)a.b[%d];\n", a->bres);
  sb_printf(s, "  float *const scr = sS + w * %lld;   /* the warp's rows of sS: its 16 x 16 scratch */\n", 16 * t->LDS);
  print_qtile_loop(a, s);
  char base[64], pc[160];
  snprintf(base, sizeof base, "row0 * %lldLL", D);
  tc_load(a, t, s, "sQ", "q", base, TC_BQ, "nq", "    ");
  sb_printf(s, "    for (int r = tid; r < %d; r += nt) qp[r] = %s;\n    __syncthreads();\n", TC_BQ,
            pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  sb_printf(s, "    ts_wmma::fragment<ts_wmma::matrix_a, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> qf[%lld];\n"
               "    ts_wmma::fragment<ts_wmma::accumulator, 16, 16, 16, float> o[%lld];\n", ND, ND);
  f_for(s, "    ", "d", (int)ND);
  sb_printf(s, "      ts_wmma::load_matrix_sync(qf[d], sQ + w * %lld + d * 16, %lld);\n"
               "      ts_wmma::fill_fragment(o[d], 0.0f);\n", 16 * t->LDH, t->LDH);
  f_end(s, "    ");
  sb_puts(s, "    const long long pq = qp[16 * w + rr];\n    float m = ninf, l = 0.0f;\n");
  /* the key loop: loads (the barrier first: the previous tile's readers, or the Q tile's, are done) */
  sb_printf(s, "    for (long long j0 = 0; j0 < %lldLL; j0 += %d) {\n", (long long)a->Tk, t->BK);
  sb_printf(s, "      const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n      __syncthreads();\n",
            (long long)a->Tk, t->BK, (long long)a->Tk, t->BK);
  snprintf(base, sizeof base, "kvo + j0 * %lldLL", D);
  tc_load(a, t, s, "sK", "k", base, t->BK, "nk", "      ");
  tc_load(a, t, s, "sV", "v", base, t->BK, "nk", "      ");
  sb_printf(s, "      for (int c = tid; c < nk; c += nt) kp[c] = %s;\n", pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
  print_any(a, s, "      ");
  /* S = Q K^T: K's rows as the columns of a col_major matrix_b */
  f_for(s, "      ", "kt", (int)NK);
  sb_puts(s, "        ts_wmma::fragment<ts_wmma::accumulator, 16, 16, 16, float> sf;\n"
             "        ts_wmma::fill_fragment(sf, 0.0f);\n");
  f_for(s, "        ", "d", (int)ND);
  sb_printf(s, "          ts_wmma::fragment<ts_wmma::matrix_b, 16, 16, 16, ts_wmma::bf16, ts_wmma::col_major> kf;\n"
               "          ts_wmma::load_matrix_sync(kf, sK + kt * %lld + d * 16, %lld);\n"
               "          ts_wmma::mma_sync(sf, qf[d], kf, sf);\n", 16 * t->LDH, t->LDH);
  f_end(s, "        ");
  sb_printf(s, "        ts_wmma::store_matrix_sync(scr + kt * 16, sf, %lld, ts_wmma::mem_row_major);\n", t->LDS);
  f_end(s, "      ");
  sb_puts(s, "      __syncwarp();\n");
  /* the online softmax: lane pair (rr, h) over row 16 w + rr */
  char mk[512], bias[160] = "";
  mask_of(a, mk, sizeof mk, "kp[c]", "pq");
  if (a->bslope >= 0) {
    const char *lo = a->bdoc >= 0 ? " & 0xffffffffLL" : "";
    snprintf(bias, sizeof bias, " - (float)asl * fabsf((float)((pq%s) - (kp[c]%s)))", lo, lo);
  }
  sb_printf(s, "      {\n        float *const srow = scr + rr * %lld;\n        ts_wmma::bf16 *const prow = sP + (16 * w + rr) * %lld;\n"
               "        float mt = ninf;\n", t->LDS, t->LDP);
  f_for(s, "        ", "j", t->BK / 2);
  sb_printf(s, "          const int c = 2 * j + h;\n          const bool ok = c < nk%s%s;\n"
               "          const float x = ok ? srow[c] * scl%s : ninf;\n          srow[c] = x;\n          mt = fmaxf(mt, x);\n",
            strcmp(mk, "0") ? " && !" : "", strcmp(mk, "0") ? mk : "", bias);
  f_end(s, "        ");
  f_row_reduce(s, "mt", 'm', "        ");
  sb_puts(s, "        const float mn = fmaxf(m, mt), mx = mn == ninf ? 0.0f : mn, corr = expf(m - mx);\n"
             "        float sum = 0.0f;\n");
  f_for(s, "        ", "j", t->BK / 2);
  sb_puts(s, "          const int c = 2 * j + h;\n          const float p = expf(srow[c] - mx);\n          sum += p;\n"
             "          prow[c].x = ts_f32_bf16(p);\n");
  f_end(s, "        ");
  sb_puts(s, "        sum += __shfl_xor_sync(0xffffffffu, sum, 1);\n        l = l * corr + sum;\n        m = mn;\n"
             "        if (!h) sc[16 * w + rr] = corr;\n      }\n      __syncwarp();\n");
  /* O *= corr by row, through the scratch; then O += P V */
  f_for(s, "      ", "d", (int)ND);
  sb_printf(s, "        ts_wmma::store_matrix_sync(scr, o[d], %lld, ts_wmma::mem_row_major);\n        __syncwarp();\n"
               "        for (int e = lane; e < 256; e += 32) scr[(e >> 4) * %lld + (e & 15)] *= sc[16 * w + (e >> 4)];\n"
               "        __syncwarp();\n        ts_wmma::load_matrix_sync(o[d], scr, %lld, ts_wmma::mem_row_major);\n"
               "        __syncwarp();\n", t->LDS, t->LDS, t->LDS);
  f_end(s, "      ");
  f_for(s, "      ", "kt", (int)NK);
  sb_printf(s, "        ts_wmma::fragment<ts_wmma::matrix_a, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> pf;\n"
               "        ts_wmma::load_matrix_sync(pf, sP + w * %lld + kt * 16, %lld);\n", 16 * t->LDP, t->LDP);
  f_for(s, "        ", "d", (int)ND);
  sb_printf(s, "          ts_wmma::fragment<ts_wmma::matrix_b, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> vf;\n"
               "          ts_wmma::load_matrix_sync(vf, sV + kt * %lld + d * 16, %lld);\n"
               "          ts_wmma::mma_sync(o[d], pf, vf, o[d]);\n", 16 * t->LDH, t->LDH);
  f_end(s, "        ");
  f_end(s, "      ");
  sb_puts(s, "    }\n");
  /* o / l through the scratch, rows below nq */
  sb_puts(s, "    if (!h) sl[16 * w + rr] = l > 0.0f ? 1.0f / l : 0.0f;\n    __syncwarp();\n");
  f_for(s, "    ", "d", (int)ND);
  sb_printf(s, "      ts_wmma::store_matrix_sync(scr, o[d], %lld, ts_wmma::mem_row_major);\n      __syncwarp();\n"
               "      for (int e = lane; e < 256; e += 32) {\n        const int r = 16 * w + (e >> 4);\n"
               "        if (r < nq) out[(row0 + r) * %lldLL + d * 16 + (e & 15)] = scr[(e >> 4) * %lld + (e & 15)] * sl[r];\n"
               "      }\n      __syncwarp();\n", t->LDS, D, t->LDS);
  f_end(s, "    ");
  sb_puts(s, "  }\n}\n");
}

/* ---- the backward on tensor cores ----
 * attention_bwd of bf16 values (q, k, v and do casts of bf16 values) after
 * the f32 statistics kernel (lse, drow): the dq kernel (64 queries per
 * block, 4 warps of 16 rows, keys streamed BK at a time: S = Q K^T and
 * dP = dO V^T on WMMA, ds = p (dp - drow) in f32, rounded to bf16 for
 * dQ += dS K) and the dk / dv kernel (16 NW keys per block, NW warps; the
 * queries of every query head reading the kv head streamed C at a time:
 * S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q with P and dS
 * rounded to bf16).  Q and dO fragments (dq) are in registers; K and V
 * (dk / dv) stay in shared memory for the block and are read as
 * fragments; the accumulators (dq, or dk and dv) are registers. */
typedef struct {
  int NW, C;                        /* warps (16 rows each), columns per tile */
  long long LDH, LDS, LDP;          /* row strides: bf16 operand tiles, f32 score tiles, bf16 p / ds tiles */
  long long oA, oB, oC, oD, oS, oS2, oP, oP2, bytes;   /* arena offsets (bytes) */
} TcBwd;

/* dq (kind 0): rows 64 queries, A = sK, B = sV [C keys]; dk / dv (kind 1):
 * rows 16 NW keys, A = sK, B = sV [rows], C = sQ, D = sdO [C queries]. */
static int tc_bwd_choose(const Att *a, int kind, TcBwd *t) {
  int64_t cmax = pow2_at_least(kind ? a->Tq : a->Tk);
  cmax = cmax < 16 ? 16 : cmax;
  for (int nw = 4; nw >= (kind ? 1 : 4); nw /= 2)
    for (int c = 64; c >= 16; c /= 2) {
      if (c > cmax) continue;
      long long R = 16 * nw, LDH = a->D + 8, LDS = c + 4, LDP = c + 8, o = 0;
      *t = (TcBwd){.NW = nw, .C = c, .LDH = LDH, .LDS = LDS, .LDP = LDP};
      long long side = (kind ? R : c) * LDH * 2;
      t->oA = o, o += side, t->oB = o, o += side;
      if (kind) t->oC = o, o += c * LDH * 2, t->oD = o, o += c * LDH * 2;
      t->oS = o, o += R * LDS * 4, t->oS2 = o, o += R * LDS * 4;
      t->oP = o, o += R * LDP * 2;
      if (kind) t->oP2 = o, o += R * LDP * 2;
      if (!kind && o < 2 * R * LDH * 2) o = 2 * R * LDH * 2;   /* dq: the Q and dO tiles alias them before the loop */
      t->bytes = o;
      if (o + 16 * c + 16 * R <= ATTN_SMEM_MAX) return 0;
    }
  return 1;
}

static void tc_bwd_arena(const TcBwd *t, StrBuf *s, int kind) {
  sb_printf(s, "  __shared__ ts_smem32 arena[%lld];\n  char *const ar = (char *)arena;\n", t->bytes / 32);
  sb_printf(s, "  ts_wmma::bf16 *const sK = (ts_wmma::bf16 *)(ar + %lld), *const sV = (ts_wmma::bf16 *)(ar + %lld), "
               "*const sP = (ts_wmma::bf16 *)(ar + %lld);\n", t->oA, t->oB, t->oP);
  if (kind) sb_printf(s, "  ts_wmma::bf16 *const sQ = (ts_wmma::bf16 *)(ar + %lld), *const sDO = (ts_wmma::bf16 *)(ar + %lld), "
                         "*const sDS = (ts_wmma::bf16 *)(ar + %lld);\n", t->oC, t->oD, t->oP2);
  else sb_printf(s, "  ts_wmma::bf16 *const sQ = (ts_wmma::bf16 *)ar, *const sDO = (ts_wmma::bf16 *)(ar + %lld);\n",
                 64 * t->LDH * 2);
  sb_printf(s, "  float *const scr = (float *)(ar + %lld) + (threadIdx.x >> 5) * %lld, "
               "*const scr2 = (float *)(ar + %lld) + (threadIdx.x >> 5) * %lld;\n", t->oS, 16 * t->LDS, t->oS2,
            16 * t->LDS);
  sb_puts(s, "  const int tid = threadIdx.x, nt = blockDim.x, w = tid >> 5, lane = tid & 31, rr = lane >> 1, "
             "hf = lane & 1;\n");
}

/* `nf` products of 16 rows (A: fragments `af[d]` in registers, or rows of
 * a bf16 tile when asrc) with the CN 16-column blocks of a bf16 tile bsrc
 * as col_major B (its rows are the columns), into the scratch dst. */
static void tc_rows_by_cols(const TcBwd *t, StrBuf *s, long long D, const char *af, const char *asrc, const char *bsrc,
                            int CN, const char *dst, const char *ind) {
  char in[32];
  snprintf(in, sizeof in, "%s  ", ind);
  f_for(s, ind, "ct", CN);
  sb_printf(s, "%s  ts_wmma::fragment<ts_wmma::accumulator, 16, 16, 16, float> sf;\n%s  ts_wmma::fill_fragment(sf, 0.0f);\n",
            ind, ind);
  f_for(s, in, "d", (int)(D / 16));
  if (asrc)
    sb_printf(s, "%s  ts_wmma::fragment<ts_wmma::matrix_a, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> af;\n"
                 "%s  ts_wmma::load_matrix_sync(af, %s + w * %lld + d * 16, %lld);\n", in, in, asrc, 16 * t->LDH, t->LDH);
  sb_printf(s, "%s  ts_wmma::fragment<ts_wmma::matrix_b, 16, 16, 16, ts_wmma::bf16, ts_wmma::col_major> bf;\n"
               "%s  ts_wmma::load_matrix_sync(bf, %s + ct * %lld + d * 16, %lld);\n"
               "%s  ts_wmma::mma_sync(sf, %s, bf, sf);\n", in, in, bsrc, 16 * t->LDH, t->LDH, in, asrc ? "af" : af);
  f_end(s, in);
  sb_printf(s, "%s  ts_wmma::store_matrix_sync(%s + ct * 16, sf, %lld, ts_wmma::mem_row_major);\n", ind, dst, t->LDS);
  f_end(s, ind);
}

/* acc[d] += (16 rows of the bf16 tile psrc, CN blocks of 16 columns) times
 * the rows of the bf16 tile xsrc (row_major B). */
static void tc_acc(const TcBwd *t, StrBuf *s, long long D, const char *psrc, const char *xsrc, const char *acc, int CN,
                   const char *ind) {
  char in[32];
  snprintf(in, sizeof in, "%s  ", ind);
  f_for(s, ind, "ct", CN);
  sb_printf(s, "%s  ts_wmma::fragment<ts_wmma::matrix_a, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> pf;\n"
               "%s  ts_wmma::load_matrix_sync(pf, %s + w * %lld + ct * 16, %lld);\n", ind, ind, psrc, 16 * t->LDP, t->LDP);
  f_for(s, in, "d", (int)(D / 16));
  sb_printf(s, "%s  ts_wmma::fragment<ts_wmma::matrix_b, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> xf;\n"
               "%s  ts_wmma::load_matrix_sync(xf, %s + ct * %lld + d * 16, %lld);\n"
               "%s  ts_wmma::mma_sync(%s[d], pf, xf, %s[d]);\n", in, in, xsrc, 16 * t->LDH, t->LDH, in, acc, acc);
  f_end(s, in);
  f_end(s, ind);
}

/* Accumulators acc[d] times f into rows below n of dst from row `base`
 * (16 rows per warp), through the warp's scratch. */
static void tc_store(const TcBwd *t, StrBuf *s, long long D, const char *acc, const char *dst, const char *base,
                     const char *n, const char *f, const char *ind) {
  f_for(s, ind, "d", (int)(D / 16));
  sb_printf(s, "%s  ts_wmma::store_matrix_sync(scr, %s[d], %lld, ts_wmma::mem_row_major);\n%s  __syncwarp();\n"
               "%s  for (int e = lane; e < 256; e += 32) {\n%s    const int r = 16 * w + (e >> 4);\n"
               "%s    if (r < %s) %s[(%s + r) * %lldLL + d * 16 + (e & 15)] = scr[(e >> 4) * %lld + (e & 15)] * %s;\n"
               "%s  }\n%s  __syncwarp();\n", ind, acc, t->LDS, ind, ind, ind, ind, n, dst, base, D, t->LDS, f, ind, ind);
  f_end(s, ind);
}

static void tc_acc_zero(StrBuf *s, long long D, const char *acc, const char *ind) {
  sb_printf(s, "%sts_wmma::fragment<ts_wmma::accumulator, 16, 16, 16, float> %s[%lld];\n", ind, acc, D / 16);
  f_for(s, ind, "d", (int)(D / 16));
  sb_printf(s, "%s  ts_wmma::fill_fragment(%s[d], 0.0f);\n", ind, acc);
  f_end(s, ind);
}

/* ALiBi's term after the scale for key position kx and query position qx ("" without) */
static const char *tc_bias(const Att *a, char *buf, size_t n, const char *kx, const char *qx) {
  buf[0] = 0;
  if (a->bslope < 0) return buf;
  const char *lo = a->bdoc >= 0 ? " & 0xffffffffLL" : "";
  snprintf(buf, n, " - (float)asl * fabsf((float)((%s%s) - (%s%s)))", qx, lo, kx, lo);
  return buf;
}

/* Opens the loop over the lane's columns c = 2 j + hf of its scratch row
 * rr: p = exp(s scale (+ ALiBi) - lse), 0 where masked or c >= n (key
 * position kx, query position qx); the caller closes it with f_end. */
static void tc_p(const Att *a, const TcBwd *t, StrBuf *s, const char *kx, const char *qx, const char *n, const char *lse,
                 const char *ind) {
  char mk[512], bias[200];
  mask_of(a, mk, sizeof mk, kx, qx);
  tc_bias(a, bias, sizeof bias, kx, qx);
  f_for(s, ind, "j", t->C / 2);
  sb_printf(s, "%s  const int c = 2 * j + hf;\n%s  const bool ok = c < %s%s%s;\n"
               "%s  const float p = ok ? expf(scr[rr * %lld + c] * scl%s - %s) : 0.0f;\n",
            ind, ind, n, strcmp(mk, "0") ? " && !" : "", strcmp(mk, "0") ? mk : "", ind, t->LDS, bias, lse);
}

static void print_dq_tc(Att *a, const TcBwd *t, StrBuf *s, int k) {
  long long D = (long long)a->D;
  int CN = t->C / 16;
  a->BQ = 64;
  tc_prelude(s);
  CG_CUDA_HEAD(s, a->name, k);
  tc_bwd_arena(t, s, 0);
  sb_printf(s, "  __shared__ float slse[64], sdrw[64];\n  __shared__ long long qp[64], kp[%d];\n", t->C);
  sb_printf(s, "  const float scl = (float)%s;\n", a->scale);
  sb_printf(s, "  const float *q = (const float *)a.b[%d], *k = (const float *)a.b[%d], *v = (const float *)a.b[%d], "
               "*dout = (const float *)a.b[%d];\n  float *out = (float *)a.b[%d];\n", a->bq, a->bk, a->bv, a->bdo, a->bres);
  TcTile lt = {.LDH = t->LDH};
  print_qtile_loop(a, s);
  char base[64], pc[160];
  snprintf(base, sizeof base, "row0 * %lldLL", D);
  tc_load(a, &lt, s, "sQ", "q", base, 64, "nq", "    ");
  tc_load(a, &lt, s, "sDO", "dout", base, 64, "nq", "    ");
  sb_printf(s, "    for (int r = tid; r < 64; r += nt) {\n      qp[r] = %s;\n", pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  f_stats_in(a, s, "slse[r]", "sdrw[r]", "row0 + r", "r < nq", "      ");
  sb_puts(s, "    }\n    __syncthreads();\n");
  sb_printf(s, "    ts_wmma::fragment<ts_wmma::matrix_a, 16, 16, 16, ts_wmma::bf16, ts_wmma::row_major> qf[%lld], df[%lld];\n",
            D / 16, D / 16);
  f_for(s, "    ", "d", (int)(D / 16));
  sb_printf(s, "      ts_wmma::load_matrix_sync(qf[d], sQ + w * %lld + d * 16, %lld);\n"
               "      ts_wmma::load_matrix_sync(df[d], sDO + w * %lld + d * 16, %lld);\n",
            16 * t->LDH, t->LDH, 16 * t->LDH, t->LDH);
  f_end(s, "    ");
  tc_acc_zero(s, D, "acc", "    ");
  sb_puts(s, "    const long long pq = qp[16 * w + rr];\n    const float lse = slse[16 * w + rr], drw = sdrw[16 * w + rr];\n");
  sb_printf(s, "    for (long long j0 = 0; j0 < %lldLL; j0 += %d) {\n", (long long)a->Tk, t->C);
  sb_printf(s, "      const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n      __syncthreads();\n",
            (long long)a->Tk, t->C, (long long)a->Tk, t->C);
  snprintf(base, sizeof base, "kvo + j0 * %lldLL", D);
  tc_load(a, &lt, s, "sK", "k", base, t->C, "nk", "      ");
  tc_load(a, &lt, s, "sV", "v", base, t->C, "nk", "      ");
  sb_printf(s, "      for (int c = tid; c < nk; c += nt) kp[c] = %s;\n", pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
  print_any(a, s, "      ");
  tc_rows_by_cols(t, s, D, "qf[d]", NULL, "sK", CN, "scr", "      ");
  tc_rows_by_cols(t, s, D, "df[d]", NULL, "sV", CN, "scr2", "      ");
  sb_puts(s, "      __syncwarp();\n");
  tc_p(a, t, s, "kp[c]", "pq", "nk", "lse", "      ");
  sb_printf(s, "        sP[(16 * w + rr) * %lld + c].x = ts_f32_bf16(p * (scr2[rr * %lld + c] - drw));\n", t->LDP, t->LDS);
  f_end(s, "      ");
  sb_puts(s, "      __syncwarp();\n");
  tc_acc(t, s, D, "sP", "sK", "acc", CN, "      ");
  sb_puts(s, "    }\n");
  tc_store(t, s, D, "acc", "out", "row0", "nq", "scl", "    ");
  sb_puts(s, "  }\n}\n");
}

/* dk (part 1), dv (part 2) or both (part 3) on tensor cores. */
static void print_dkv_tc(Att *a, const TcBwd *t, StrBuf *s, int k, int part) {
  int dk = part == 1 || part == 3, dv = part == 2 || part == 3, R = 16 * t->NW, CN = t->C / 16;
  long long D = (long long)a->D, nkt = (long long)((a->Tk + R - 1) / R);
  tc_prelude(s);
  CG_CUDA_HEAD(s, a->name, k);
  tc_bwd_arena(t, s, 1);
  sb_printf(s, "  __shared__ float slse[%d], sdrw[%d];\n  __shared__ long long qp[%d], kp[%d];\n", t->C, t->C, t->C, R);
  sb_printf(s, "  const float scl = (float)%s;\n", a->scale);
  sb_printf(s, "  const float *q = (const float *)a.b[%d], *k = (const float *)a.b[%d], *v = (const float *)a.b[%d], "
               "*dout = (const float *)a.b[%d];\n  float *out = (float *)a.b[%d];\n", a->bq, a->bk, a->bv, a->bdo, a->bres);
  if (part == 3) sb_printf(s, "  float *out2 = (float *)a.b[%d];\n", a->bres2);
  TcTile lt = {.LDH = t->LDH};
  sb_printf(s, "  for (long long t = blockIdx.x; t < %lldLL; t += gridDim.x) {\n", (long long)(a->B * a->Hkv) * nkt);
  sb_printf(s, "    const long long bk = t / %lldLL, j0 = t %% %lldLL * %d, b = bk / %lldLL, hk = bk %% %lldLL;\n", nkt,
            nkt, R, (long long)a->Hkv, (long long)a->Hkv);
  sb_printf(s, "    const int nk = %lldLL - j0 < %d ? (int)(%lldLL - j0) : %d;\n", (long long)a->Tk, R, (long long)a->Tk, R);
  sb_printf(s, "    const long long kvo = bk * %lldLL;\n    __syncthreads();\n", (long long)a->Tk * D);
  char base[64], pc[160];
  snprintf(base, sizeof base, "kvo + j0 * %lldLL", D);
  tc_load(a, &lt, s, "sK", "k", base, R, "nk", "    ");
  tc_load(a, &lt, s, "sV", "v", base, R, "nk", "    ");
  sb_printf(s, "    for (int c = tid; c < %d; c += nt) kp[c] = %s;\n", R, pos_call(a, pc, sizeof pc, 'k', "j0 + c"));
  if (dk) tc_acc_zero(s, D, "gk", "    ");
  if (dv) tc_acc_zero(s, D, "gv", "    ");
  print_head_tiles(a, s, t->C);
  snprintf(base, sizeof base, "row0 * %lldLL", D);
  tc_load(a, &lt, s, "sQ", "q", base, t->C, "nq", "        ");
  tc_load(a, &lt, s, "sDO", "dout", base, t->C, "nq", "        ");
  sb_printf(s, "        for (int r = tid; r < %d; r += nt) {\n          qp[r] = %s;\n", t->C,
            pos_call(a, pc, sizeof pc, 'q', "i0 + r"));
  f_stats_in(a, s, "slse[r]", "sdrw[r]", "row0 + r", "r < nq", "          ");
  sb_puts(s, "        }\n");
  print_any(a, s, "        ");
  tc_rows_by_cols(t, s, D, NULL, "sK", "sQ", CN, "scr", "        ");
  if (dk) tc_rows_by_cols(t, s, D, NULL, "sV", "sDO", CN, "scr2", "        ");
  sb_puts(s, "        __syncwarp();\n        {\n          const long long pk = kp[16 * w + rr];\n");
  tc_p(a, t, s, "pk", "qp[c]", "nq", "slse[c]", "          ");
  if (dv) sb_printf(s, "            sP[(16 * w + rr) * %lld + c].x = ts_f32_bf16(p);\n", t->LDP);
  if (dk) sb_printf(s, "            sDS[(16 * w + rr) * %lld + c].x = ts_f32_bf16(p * (scr2[rr * %lld + c] - sdrw[c]));\n",
                    t->LDP, t->LDS);
  f_end(s, "          ");
  sb_puts(s, "        }\n        __syncwarp();\n");
  if (dv) tc_acc(t, s, D, "sP", "sDO", "gv", CN, "        ");
  if (dk) tc_acc(t, s, D, "sDS", "sQ", "gk", CN, "        ");
  sb_puts(s, "      }\n    }\n");
  snprintf(base, sizeof base, "bk * %lldLL + j0", (long long)a->Tk);
  if (dk) tc_store(t, s, D, "gk", "out", base, "nk", "scl", "    ");
  if (dv) tc_store(t, s, D, "gv", dk ? "out2" : "out", base, "nk", "1.0f", "    ");
  sb_puts(s, "  }\n}\n");
}

/* attn_finish (o = acc / l) and attn_lse (m + log l) over the state's rows. */
static void print_state_rows(const Att *a, StrBuf *s, const IrNode *nd, int64_t rows) {
  int64_t D = a->D, W = D + 2;
  CG_CUDA_HEAD(s, a->name, 0);
  sb_printf(s, "  const %s *st = (const %s *)a.b[0];\n  %s *y = (%s *)a.b[1];\n", a->T, a->T, a->T, a->T);
  if (nd->op == IR_OP_ATTN_FINISH) {
    CG_CUDA_GRID_LOOP(s, "e", rows * D);
    sb_printf(s, "    const %s *w = st + e / %lldLL * %lldLL;\n    const double l = w[%lld];\n"
                 "    y[e] = (%s)(l > 0 ? (double)w[e %% %lldLL] * (1.0 / l) : 0.0);\n  }\n}\n",
              a->T, (long long)D, (long long)W, (long long)(D + 1), a->T, (long long)D);
  } else {
    CG_CUDA_GRID_LOOP(s, "r", rows);
    sb_printf(s, "    const %s *w = st + r * %lldLL;\n"
                 "    y[r] = (%s)(w[%lld] > 0 ? (double)w[%lld] + log((double)w[%lld]) : 0.0);\n  }\n}\n",
              a->T, (long long)W, a->T, (long long)(D + 1), (long long)D, (long long)(D + 1));
  }
}

/* attention_bwd: the parts of one attention whose result slots res[p] are
 * >= 0 (p = 0 dq, 1 dk, 2 dv), the scratch in slot scr.  Kernel 0 the
 * statistics (lse and drow into the scratch), once for all the parts; then
 * dq's kernel (by query tiles); then ONE kernel for dk and dv together
 * (by key tiles, one pass over the scores for both), or the one of them
 * wanted.  a->bres / bres2 are set here. */
static int attn_bwd(Att *a, StrBuf *src, const int res[3], int scr, CgCudaLaunch *l, int *nl, int64_t *scratch,
                    char *why, size_t whylen) {
  int kv = (res[1] >= 0) | (res[2] >= 0) << 1;   /* 1 dk, 2 dv, 3 both: print_dkv's part */
  if (res[0] < 0 && !kv) { snprintf(why, whylen, "no part of the backward wanted"); return -1; }
  a->bo = 3, a->bdo = 4, a->bscr = scr;
  *scratch = 2 * a->B * a->Hq * a->Tq * (int64_t)sizeof(double);
  *nl = 0;
  FTile ft[3];   /* statistics, dq, dk / dv */
  int kind = kv == 3 ? FK_DKV : kv == 1 ? FK_DK : FK_DV;
  int f32 = a->es == 4 && a->D % 4 == 0 && !f_choose(a, FK_STATS, &ft[0]) && (res[0] < 0 || !f_choose(a, FK_DQ, &ft[1])) &&
            (!kv || !f_choose(a, kind, &ft[2]));
  TcBwd tq, tk;   /* tensor cores: the dq and dk / dv kernels' tiles (the statistics stay the f32 kernel's) */
  int tc = f32 && a->tc && a->D % 16 == 0 && (res[0] < 0 || !tc_bwd_choose(a, 0, &tq)) &&
           (!kv || !tc_bwd_choose(a, 1, &tk));
  Att akv = *a;   /* the dk / dv kernel's tiles (the double path: its own, two accumulators for both) */
  akv.dkv2 = kv == 3;
  if (!f32 && (choose_tiles(a, why, whylen) || (kv && choose_tiles(&akv, why, whylen)))) return 1;
  int64_t qblocks = a->B * a->Hq * ((a->Tq + (f32 ? ft[0].R : a->BQ) - 1) / (f32 ? ft[0].R : a->BQ)) * ATTN_THREADS;
  if (f32) print_fwd_f32(a, &ft[0], src, 0, 1);
  else print_fwd(a, src, 0, 2);
  cg_cuda_launch(&l[(*nl)++], a->name, 0, qblocks, ATTN_THREADS);
  int k = 1;
  if (res[0] >= 0) {
    a->bres = res[0];
    int64_t rows = tc ? 64 : f32 ? ft[1].R : a->BQ;
    size_t from = src->n;
    if (tc) print_dq_tc(a, &tq, src, k), tc_retype(src, from, a->tc);
    else if (f32) print_dq_f32(a, &ft[1], src, k);
    else print_dq(a, src, k);
    cg_cuda_launch(&l[(*nl)++], a->name, k++, a->B * a->Hq * ((a->Tq + rows - 1) / rows) * ATTN_THREADS, ATTN_THREADS);
  }
  if (kv) {
    akv.bo = a->bo, akv.bdo = a->bdo, akv.bscr = a->bscr;
    akv.bres = kv == 2 ? res[2] : res[1];
    akv.bres2 = kv == 3 ? res[2] : -1;
    int64_t rows = tc ? 16 * tk.NW : f32 ? ft[2].R : akv.BK;
    int threads = tc ? 32 * tk.NW : ATTN_THREADS;
    size_t from = src->n;
    if (tc) print_dkv_tc(&akv, &tk, src, k, kv), tc_retype(src, from, a->tc);
    else if (f32) print_dkv_f32(&akv, &ft[2], src, k, kv);
    else print_dkv(&akv, src, k, kv);
    cg_cuda_launch(&l[(*nl)++], a->name, k++, a->B * a->Hkv * ((a->Tk + rows - 1) / rows) * threads, threads);
  }
  return 0;
}

/* What every attention node's kernels share (not attn_finish / attn_lse):
 * operand checks, dims and attributes into *a, ALiBi's slopes, document
 * ids, and the position functions printed.  *sh: the optional operands
 * (slopes, document ids) the node has (the slots after them move by as
 * many).  0; 1 with *why; -1 on an internal error. */
static int attn_open(const IrModule *m, const IrBlock *b, const IrNode *nd, const char *name, StrBuf *src, Att *a,
                     int *sh, char *why, size_t whylen) {
  IrDtype dt = nd->type.dtype;
  if (dt != IR_F32 && dt != IR_F64) { snprintf(why, whylen, "attention needs f32 or f64"); return 1; }
  /* the operands before the optional slopes and document ids */
  int base = ir_attn_base(nd), sl = ir_attn_slope(nd), doc = ir_attn_doc(nd);
  if (ir_attn_bias(nd) >= 0) {   /* the CPU kernels have it (ops_attn.c); the device ones not yet */
    snprintf(why, whylen, "an additive score bias (bias=1: nn.attention's score_bias, T5's relative positions) has no "
             "CUDA kernel yet; train such a model on CPU ranks (a machine without a GPU driver, docs/cli.md --gpus)");
    return 1;
  }
  *sh = nd->nin - base;
  for (int o = 0; o < base; o++)
    if (b->nodes[nd->in[o]].type.dtype != dt) { snprintf(why, whylen, "operand %d is not %s", o + 1, ir_dtype_name(dt)); return 1; }
  *a = (Att){.name = name, .T = dt == IR_F64 ? "double" : "float", .es = dt == IR_F64 ? 8 : 4,
             .bo = -1, .blse = -1, .bdrow = -1, .bacc = -1, .bscr = -1, .bres2 = -1, .bdoc = -1, .bslope = -1};
  if (sl >= 0) {
    const IrType *st = &b->nodes[nd->in[sl]].type;
    if ((st->dtype != IR_F32 && st->dtype != IR_F64) || st->rank != 1) {
      snprintf(why, whylen, "the ALiBi slopes must be f32 or f64 [heads]");
      return 1;
    }
    a->bslope = sl;
    a->slT = st->dtype == IR_F64 ? "double" : "float";
  }
  if (doc >= 0) {
    const IrType *dt_ = &b->nodes[nd->in[doc]].type;
    if (dt_->dtype != IR_I32 || dt_->rank != 2) { snprintf(why, whylen, "the document ids must be i32 [B, T]"); return 1; }
    a->bdoc = doc;
    a->Tdoc = dt_->dim[1];
  }
  const IrType *qt = &b->nodes[nd->in[0]].type, *kt = &b->nodes[nd->in[1]].type;
  if (qt->rank != 4 || kt->rank != 4 || kt->dim[0] != qt->dim[0] || kt->dim[3] != qt->dim[3]) {
    snprintf(why, whylen, "q [B, Hq, Tq, D] and k [B, Hkv, Tk, D] do not match");
    return 1;
  }
  a->B = qt->dim[0], a->Hq = qt->dim[1], a->Tq = qt->dim[2], a->D = qt->dim[3], a->Hkv = kt->dim[1], a->Tk = kt->dim[2];
  if (a->Hkv < 1 || a->Hq % a->Hkv) { snprintf(why, whylen, "query heads are not a multiple of kv heads"); return 1; }
  a->grp = a->Hq / a->Hkv;
  a->causal = nd->ia[0] != 0;
  a->window = ir_attn_window(nd);
  cg_cuda_dlit(a->scale, sizeof a->scale, nd->fa[0]);
  int ring = nd->op != IR_OP_ATTENTION && nd->op != IR_OP_ATTENTION_BWD;
  char fn[128];
  snprintf(fn, sizeof fn, "%s_qpos", name);
  cg_cuda_print_pos(m, src, fn, b->nodes[nd->in[0]].sh.split[2], a->Tq, -1);
  snprintf(fn, sizeof fn, "%s_kpos", name);
  cg_cuda_print_pos(m, src, fn, b->nodes[nd->in[1]].sh.split[2], a->Tk, ring ? nd->ia[1] : -1);
  if (a->bslope >= 0) {   /* the global index of a local query head: its slope's */
    snprintf(fn, sizeof fn, "%s_hpos", name);
    cg_cuda_print_pos(m, src, fn, b->nodes[nd->in[0]].sh.split[1], a->Hq, -1);
  }
  if (a->bdoc >= 0)   /* (doc << 32) | p for batch row bb_ (pos_call) */
    sb_printf(src, "#define %s_dpos(bb_, p_) ((long long)((unsigned long long)(unsigned)((const int *)a.b[%d])"
                   "[(bb_) * %lldLL + (p_)] << 32) | (p_))\n", name, a->bdoc, (long long)a->Tdoc);
  a->bq = 0, a->bk = 1, a->bv = 2;
  return 0;
}

int cg_cuda_attn_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                        CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen) {
  const IrNode *nd = &b->nodes[i];
  *nl = 0;
  *scratch = 0;
  IrDtype dt = nd->type.dtype;
  Att a;
  if (nd->op == IR_OP_ATTN_FINISH || nd->op == IR_OP_ATTN_LSE) {
    if (dt != IR_F32 && dt != IR_F64) { snprintf(why, whylen, "attention needs f32 or f64"); return 1; }
    if (b->nodes[nd->in[0]].type.dtype != dt) { snprintf(why, whylen, "operand 1 is not %s", ir_dtype_name(dt)); return 1; }
    a = (Att){.name = name, .T = dt == IR_F64 ? "double" : "float", .es = dt == IR_F64 ? 8 : 4};
    const IrType *st = &b->nodes[nd->in[0]].type;
    if (st->rank != 4 || st->dim[3] < 3) { snprintf(why, whylen, "the state must be [B, H, T, head_dim + 2]"); return 1; }
    a.D = st->dim[3] - 2;
    int64_t rows = st->dim[0] * st->dim[1] * st->dim[2];
    print_state_rows(&a, src, nd, rows);
    cg_cuda_launch(&l[0], name, 0, nd->op == IR_OP_ATTN_FINISH ? rows * a.D : rows, 256);
    *nl = 1;
    return 0;
  }
  int sh, r = attn_open(m, b, nd, name, src, &a, &sh, why, whylen);
  if (r != 0) return r;
  int part = 0;
  switch (nd->op) {
  case IR_OP_ATTENTION: {   /* q, k, v[, doc] -> o */
    TcTile tt;
    IrDtype h = dt == IR_F32 ? tc_from_half(b, nd, (const int[]){0, 1, 2}, 3) : IR_VOID;
    if (h != IR_VOID && a.D % 16 == 0 && !tc_choose(&a, &tt)) {
      a.bres = 3 + sh;
      size_t from = src->n;
      print_fwd_tc(&a, &tt, src);
      tc_retype(src, from, h);
      cg_cuda_launch(&l[0], name, 0, a.B * a.Hq * ((a.Tq + TC_BQ - 1) / TC_BQ) * ATTN_THREADS, ATTN_THREADS);
      *nl = 1;
      return 0;
    }
    FTile ft;
    int f32 = dt == IR_F32 && a.D % 4 == 0 && !f_choose(&a, FK_FWD, &ft);
    if (!f32 && choose_tiles(&a, why, whylen)) return 1;
    int64_t rows = f32 ? ft.R : a.BQ;
    a.bres = 3 + sh;
    if (f32) print_fwd_f32(&a, &ft, src, 0, 0);
    else print_fwd(&a, src, 0, 0);
    cg_cuda_launch(&l[0], name, 0, a.B * a.Hq * ((a.Tq + rows - 1) / rows) * ATTN_THREADS, ATTN_THREADS);
    *nl = 1;
    return 0;
  }
  case IR_OP_ATTENTION_BWD: {   /* q, k, v, o, do[, doc] -> dq / dk / dv; scratch: lse, drow */
    part = (int)nd->ia[1];
    if (part < 0 || part > 2) { snprintf(why, whylen, "part must be 0, 1 or 2"); return 1; }
    int res[3] = {-1, -1, -1};
    res[part] = 5 + sh;
    a.tc = tc_bwd_operands(b, nd);
    return attn_bwd(&a, src, res, 6 + sh, l, nl, scratch, why, whylen);
  }
  case IR_OP_ATTN_ACC:   /* q, k, v, st[, doc] -> st (the double path) */
    if (choose_tiles(&a, why, whylen)) return 1;
    a.bres = 4 + sh;
    print_fwd(&a, src, 0, 1);
    cg_cuda_launch(&l[0], name, 0, a.B * a.Hq * ((a.Tq + a.BQ - 1) / a.BQ) * ATTN_THREADS, ATTN_THREADS);
    *nl = 1;
    return 0;
  case IR_OP_ATTN_BWD_Q:    /* q, k, v, do, lse, drow, dq -> dq */
  case IR_OP_ATTN_BWD_KV:   /* q, k, v, do, lse, drow, acc -> acc */
    part = nd->op == IR_OP_ATTN_BWD_Q ? 0 : (int)nd->ia[2];
    if (nd->op == IR_OP_ATTN_BWD_KV && part != 1 && part != 2) {
      snprintf(why, whylen, "part must be 1 (dk) or 2 (dv)");
      return 1;
    }
    if (choose_tiles(&a, why, whylen)) return 1;
    a.bdo = 3, a.blse = 4, a.bdrow = 5, a.bacc = 6, a.bres = 7 + sh;
    if (part == 0) print_dq(&a, src, 0);
    else print_dkv(&a, src, 0, part);
    cg_cuda_launch(&l[0], name, 0,
                   part == 0 ? a.B * a.Hq * ((a.Tq + a.BQ - 1) / a.BQ) * ATTN_THREADS
                             : a.B * a.Hkv * ((a.Tk + a.BK - 1) / a.BK) * ATTN_THREADS,
                   ATTN_THREADS);
    *nl = 1;
    return 0;
  default:
    snprintf(why, whylen, "not an attention op");
    return -1;
  }
}

int cg_cuda_attn_grads_kernel(const IrModule *m, const IrBlock *b, const int *run, int nrun, const char *name,
                              StrBuf *src, CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen) {
  *nl = 0;
  *scratch = 0;
  if (nrun < 1 || nrun > 3) { snprintf(why, whylen, "%d parts of one attention's backward", nrun); return -1; }
  const IrNode *nd = &b->nodes[run[0]];
  int res[3] = {-1, -1, -1};
  for (int j = 0; j < nrun; j++) {
    const IrNode *x = &b->nodes[run[j]];
    int p = (int)x->ia[1];
    if (x->op != IR_OP_ATTENTION_BWD || x->nin != nd->nin || p < 0 || p > 2 || res[p] >= 0 || x->ia[0] != nd->ia[0] ||
        x->ia[2] != nd->ia[2] || x->ia[3] != nd->ia[3] || x->fa[0] != nd->fa[0] || x->type.dtype != nd->type.dtype) {
      snprintf(why, whylen, "%%%d is not another part of %%%d's attention backward", run[j], run[0]);
      return -1;
    }
    for (int k = 0; k < nd->nin; k++)
      if (x->in[k] != nd->in[k]) {
        snprintf(why, whylen, "%%%d reads other operands than %%%d", run[j], run[0]);
        return -1;
      }
    res[p] = nd->nin + j;
  }
  Att a;
  int sh, r = attn_open(m, b, nd, name, src, &a, &sh, why, whylen);
  if (r != 0) return r;
  a.tc = tc_bwd_operands(b, nd);
  return attn_bwd(&a, src, res, nd->nin + nrun, l, nl, scratch, why, whylen);
}
