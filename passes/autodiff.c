/* autodiff.c - reverse-mode automatic differentiation over the IR.
 *
 * Expects: a module with a block "forward" containing `output "loss"` on a
 *          float scalar (the frontend's result), and train.global_batch a
 *          multiple of train.micro_batch.
 * Guarantees: a block "micro" and no block "forward".  "micro" holds the
 *          forward nodes unchanged (same value ids), then the backward graph,
 *          with an `accum` of each parameter read's gradient into a new state
 *          "grad.<param>" (kind grad, same type, zero at start) right after
 *          the backward computes it (with pipeline chunks: one accum per
 *          parameter and chunk, at the end).
 *
 * The backward graph is seeded with FULL(1 / n_micro), n_micro =
 * global_batch / micro_batch, so the gradients accumulated over one step are
 * the gradient of the step's mean loss (the dp pass scales further).  In
 * fp16 (scaler_on) the seed is `muls(state @loss_scale, 1 / n_micro)`: the
 * gradients carry the loss scale, which the update block divides out.
 *
 * Every op has one derivative function ad_NAME (the table at the bottom is
 * built from ops.def, so a new op without one does not compile).  It gets the
 * forward node and the id of its output gradient dy, and adds a gradient
 * contribution to each operand that needs one.  Lean by construction:
 *   - only values that depend on a parameter through differentiable ops and
 *     are float ("need") ever get a gradient; i32 values never do;
 *   - a zero gradient is "no node" (-1), never a FULL 0;
 *   - several contributions to one value are summed with ADD as they arrive.
 * Emission errors are sticky: after the first failure every emit returns -1
 * and the message of the first failure is kept in cx->err. */
#include "passes.h"
#include <stdarg.h>

typedef struct {
  IrModule *m;
  PassCtx *cx;
  int mb;              /* the micro block being built */
  int cur;             /* forward node being differentiated (for messages) */
  unsigned char *need; /* per forward node: a gradient may flow into it */
  int *grad;           /* per forward node: micro id of d loss / d value, -1 = zero */
  int *pgrad;          /* per state: summed gradient of the parameter, -1 = none */
  int *flat[2];        /* per forward node, [ta]: its 2-D flattening for weight
                        * gradients (one activation often feeds several weights) */
  int failed;
  /* Pipeline (pp > 1, forward nodes tagged by pass "partition"): K chunks.
   * Every emitted node gets tag (the chunk of the node being
   * differentiated, backward).  A value that depends on no model input (a
   * parameter read, the broadcast of a gain) can be read by several chunks;
   * its gradient is kept per chunk (gradc, pgradc: [value or state][K]) and
   * differentiated per chunk, so each chunk accumulates its own share into
   * the gradient state and nothing crosses stages only to be summed. */
  int K, tag;
  unsigned char *nodep;  /* per forward node: depends on no model input */
  int *gradc, *pgradc;
} Ad;

static void ad_fail(Ad *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ad_fail(Ad *a, const char *fmt, ...) {
  if (a->failed) return;
  a->failed = 1;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (a->cur >= 0)
    snprintf(a->cx->err, sizeof a->cx->err, "autodiff: differentiating %%%d = %s: %s", a->cur,
             ir_ops[a->m->blocks.a[a->mb].nodes[a->cur].op].name, msg);
  else
    snprintf(a->cx->err, sizeof a->cx->err, "autodiff: %s", msg);
}

/* A node of the micro block.  Re-fetch after every emit: emitting may move
 * the node array. */
static const IrNode *nd(const Ad *a, int id) { return &a->m->blocks.a[a->mb].nodes[id]; }
static IrType ty(const Ad *a, int id) { return nd(a, id)->type; }
static int rank_of(const Ad *a, int id) { return nd(a, id)->type.rank; }
static int in_of(const Ad *a, int id, int k) { return nd(a, id)->in[k]; }
static int needs(const Ad *a, int id) { return a->need[id]; }

/* Appends a node to the micro block; -1 (and nothing emitted) once anything
 * failed or if an operand is missing. */
static int em(Ad *a, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa,
              const IrType *type) {
  if (a->failed) return -1;
  for (int k = 0; k < nin; k++)
    if (in[k] < 0) { ad_fail(a, "internal: missing operand for %s", ir_ops[op].name); return -1; }   /* internal */
  char err[512];
  int id = ir_emit(a->m, a->mb, op, in, nin, ia, fa, NULL, type, err, sizeof err);
  if (id < 0) ad_fail(a, "cannot emit %s: %s", ir_ops[op].name, err);
  else if (a->K > 1) a->m->blocks.a[a->mb].nodes[id].stage = a->tag;
  return id;
}
static int em1(Ad *a, IrOp op, int x) { return em(a, op, &x, 1, NULL, NULL, NULL); }
static int em2(Ad *a, IrOp op, int x, int y) { int in[2] = {x, y}; return em(a, op, in, 2, NULL, NULL, NULL); }
static int emc(Ad *a, IrOp op, int x, double c) { return em(a, op, &x, 1, NULL, &c, NULL); }
static int emt(Ad *a, IrOp op, int x, const IrType *t) { return em(a, op, &x, 1, NULL, NULL, t); }
static int em_matmul(Ad *a, int x, int y, int ta, int tb) {
  int in[2] = {x, y};
  int64_t ia[2] = {ta, tb};
  return em(a, IR_OP_MATMUL, in, 2, ia, NULL, NULL);
}
/* x with its last two dims swapped. */
static int em_swap_last2(Ad *a, int x) {
  int r = rank_of(a, x);
  int64_t perm[IR_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[r - 1] = r - 2;
  perm[r - 2] = r - 1;
  return em(a, IR_OP_PERMUTE, &x, 1, perm, NULL, NULL);
}

static void accumulate(Ad *a, int s, int g);

/* Adds g to the gradient of forward value x (if x can have one).  Without
 * pipeline chunks a parameter read's share goes into the gradient state at
 * once: a parameter read twice (a tied embedding) holds no running sum of
 * its shares across the backward. */
static void add_grad(Ad *a, int x, int g) {
  if (a->failed || g < 0 || !needs(a, x)) return;
  if (a->K <= 1 && nd(a, x)->op == IR_OP_STATE) {
    accumulate(a, (int)nd(a, x)->ia[0], g);
    return;
  }
  int *slot = a->K > 1 && a->nodep[x] ? &a->gradc[(size_t)x * a->K + ir_stage_chunk(a->tag)] : &a->grad[x];
  *slot = *slot < 0 ? g : em2(a, IR_OP_ADD, *slot, g);
}

static int norm_axis(int64_t axis, int rank) { return (int)(axis < 0 ? axis + rank : axis); }

/* ---------------- derivatives, one per op ----------------
 * i: the forward node (same id in micro); dy: its gradient, same shape as
 * its result.  x0, x1: its operands. */
#define X0 in_of(a, i, 0)
#define X1 in_of(a, i, 1)
typedef void (*AdFn)(Ad *a, int i, int dy);

/* Leaves, effects and no-gradient ops contribute nothing (parameters are
 * collected from STATE nodes by the walk itself). */
#define AD_NONE(NAME) static void ad_##NAME(Ad *a, int i, int dy) { (void)a; (void)i; (void)dy; }
AD_NONE(INPUT) AD_NONE(STATE) AD_NONE(FULL)
AD_NONE(EQ) AD_NONE(NE_SCALAR) AD_NONE(CMP) AD_NONE(FLOORDIV) AD_NONE(MOD) AD_NONE(ARANGE) AD_NONE(RAND) AD_NONE(TOPK_MASK) AD_NONE(CAPACITY_MASK) AD_NONE(MOE_COUNTS)
AD_NONE(ACCUM) AD_NONE(ZERO) AD_NONE(ADAMW) AD_NONE(SGD) AD_NONE(LION) AD_NONE(LR_STEP) AD_NONE(OUTPUT) AD_NONE(ASSIGN)
AD_NONE(NONFINITE) AD_NONE(SCALE_UPDATE)

/* Sharding ops are inserted after autodiff (passes/shard.c); the frontend
 * never makes them, nor the derivative ops and clip_coef below. */
#define AD_LATE(NAME) static void ad_##NAME(Ad *a, int i, int dy) { \
    (void)i; (void)dy; \
    ad_fail(a, "%s is inserted by the sharding passes, after autodiff", ir_ops[IR_OP_##NAME].name);   /* internal */ \
  }
AD_LATE(ALL_REDUCE) AD_LATE(ALL_GATHER) AD_LATE(REDUCE_SCATTER) AD_LATE(SHARD_SLICE)
AD_LATE(TAKE) AD_LATE(ONEHOT) AD_LATE(PAD_FILL)
AD_LATE(SEND) AD_LATE(RECV) AD_LATE(STASH) AD_LATE(UNSTASH) AD_LATE(GROUP_SUM)
AD_LATE(ALL_TO_ALL) AD_LATE(ALL_TO_ALL_V) AD_LATE(RING_SHIFT) AD_LATE(RING_WAIT)
AD_LATE(ATTN_ACC) AD_LATE(ATTN_FINISH) AD_LATE(ATTN_LSE) AD_LATE(ATTN_BWD_Q) AD_LATE(ATTN_BWD_KV)
AD_LATE(KV_WRITE) AD_LATE(ATTN_CACHED) AD_LATE(ROPE_AT) AD_LATE(SLICE_AT)
AD_LATE(QUANT8) AD_LATE(AMAX_ACC) AD_LATE(MATMUL8) AD_LATE(FP8_SCALE)

/* Derivative ops themselves: we only do first derivatives. */
#define AD_SECOND(NAME) static void ad_##NAME(Ad *a, int i, int dy) { \
    (void)i; (void)dy; \
    ad_fail(a, "second derivative not supported (the forward graph contains a derivative op)");   /* internal */ \
  }
AD_SECOND(GELU_TANH_BWD) AD_SECOND(GELU_ERF_BWD) AD_SECOND(SILU_BWD) AD_SECOND(RELU_BWD)
AD_SECOND(SOFTMAX_BWD) AD_SECOND(LOG_SOFTMAX_BWD) AD_SECOND(LAYERNORM_BWD) AD_SECOND(RMSNORM_BWD)
AD_SECOND(EMBEDDING_BWD) AD_SECOND(GATHER_BWD) AD_SECOND(CROSS_ENTROPY_BWD) AD_SECOND(ATTENTION_BWD)

static void ad_CLIP_COEF(Ad *a, int i, int dy) {
  (void)i; (void)dy;
  ad_fail(a, "clip_coef belongs to the update step and has no derivative");   /* internal */
}

/* ---- elementwise ---- */
static void ad_ADD(Ad *a, int i, int dy) { add_grad(a, X0, dy); add_grad(a, X1, dy); }
static void ad_SUB(Ad *a, int i, int dy) {
  add_grad(a, X0, dy);
  if (needs(a, X1)) add_grad(a, X1, em1(a, IR_OP_NEG, dy));
}
static void ad_MUL(Ad *a, int i, int dy) {
  int x = X0, y = X1;
  if (needs(a, x)) add_grad(a, x, em2(a, IR_OP_MUL, dy, y));
  if (needs(a, y)) add_grad(a, y, em2(a, IR_OP_MUL, dy, x));
}
/* z = x / y:  dx = dy / y,  dy_ = -dy x / y^2 = -(dy / y) * z */
static void ad_DIV(Ad *a, int i, int dy) {
  int x = X0, y = X1;
  if (!needs(a, x) && !needs(a, y)) return;
  int q = em2(a, IR_OP_DIV, dy, y);
  add_grad(a, x, q);
  if (needs(a, y)) add_grad(a, y, em1(a, IR_OP_NEG, em2(a, IR_OP_MUL, q, i)));
}
static void ad_ADDS(Ad *a, int i, int dy) { add_grad(a, X0, dy); }
static void ad_MULS(Ad *a, int i, int dy) { add_grad(a, X0, emc(a, IR_OP_MULS, dy, nd(a, i)->fa[0])); }
static void ad_NEG(Ad *a, int i, int dy) { add_grad(a, X0, em1(a, IR_OP_NEG, dy)); }
static void ad_EXP(Ad *a, int i, int dy) { add_grad(a, X0, em2(a, IR_OP_MUL, dy, i)); }
static void ad_LOG(Ad *a, int i, int dy) { add_grad(a, X0, em2(a, IR_OP_DIV, dy, X0)); }
/* y = sqrt(x): dx = dy * 0.5 / y */
static void ad_SQRT(Ad *a, int i, int dy) {
  add_grad(a, X0, emc(a, IR_OP_MULS, em2(a, IR_OP_DIV, dy, i), 0.5));
}
/* y = x^-1/2: dx = dy * (-0.5) * y^3 */
static void ad_RSQRT(Ad *a, int i, int dy) {
  int y3 = em2(a, IR_OP_MUL, i, em2(a, IR_OP_MUL, i, i));
  add_grad(a, X0, emc(a, IR_OP_MULS, em2(a, IR_OP_MUL, dy, y3), -0.5));
}
/* y = tanh(x): dx = dy * (1 - y^2) */
static void ad_TANH(Ad *a, int i, int dy) {
  int one_m_y2 = emc(a, IR_OP_ADDS, em1(a, IR_OP_NEG, em2(a, IR_OP_MUL, i, i)), 1.0);
  add_grad(a, X0, em2(a, IR_OP_MUL, dy, one_m_y2));
}
/* Activations with a dedicated (x, dy) -> dx op. */
#define AD_ACT(NAME) static void ad_##NAME(Ad *a, int i, int dy) { \
    add_grad(a, X0, em2(a, IR_OP_##NAME##_BWD, X0, dy)); }
AD_ACT(GELU_TANH) AD_ACT(GELU_ERF) AD_ACT(SILU) AD_ACT(RELU)

/* Converts back to the operand's dtype (no gradient into i32: needs() is 0). */
static void ad_CAST(Ad *a, int i, int dy) {
  if (!needs(a, X0)) return;
  IrType t = ty(a, X0);
  add_grad(a, X0, emt(a, IR_OP_CAST, dy, &t));
}

/* z = where(c, x, y): dx = where(c, dy, 0) = masked_fill(dy, c, 0) and
 * dy_ = where(c, 0, dy) = dy - dx (exact: dy - dy = 0, dy - 0 = dy); c
 * gets none */
static void ad_WHERE(Ad *a, int i, int dy) {
  int c = in_of(a, i, 0), x = in_of(a, i, 1), y = in_of(a, i, 2);
  if (!needs(a, x) && !needs(a, y)) return;
  double zero = 0.0;
  int dx = em(a, IR_OP_MASKED_FILL, (int[]){dy, c}, 2, NULL, &zero, NULL);
  add_grad(a, x, dx);
  if (needs(a, y)) add_grad(a, y, em2(a, IR_OP_SUB, dy, dx));
}
/* y = gather(x, idx, axis): dx = scatter-add of dy at idx (gather_bwd) */
static void ad_GATHER(Ad *a, int i, int dy) {
  if (!needs(a, X0)) return;
  IrType t = ty(a, X0);
  int in[2] = {X1, dy};
  add_grad(a, X0, em(a, IR_OP_GATHER_BWD, in, 2, nd(a, i)->ia, NULL, &t));
}

/* ---- layout ---- */
static void ad_RESHAPE(Ad *a, int i, int dy) {
  IrType t = ty(a, X0);
  add_grad(a, X0, emt(a, IR_OP_RESHAPE, dy, &t));
}
/* result dim k is input dim perm[k], so input dim perm[k] is result dim k */
static void ad_PERMUTE(Ad *a, int i, int dy) {
  int r = rank_of(a, i);
  int64_t inv[IR_MAX_RANK];
  for (int k = 0; k < r; k++) inv[nd(a, i)->ia[k]] = k;
  add_grad(a, X0, em(a, IR_OP_PERMUTE, &dy, 1, inv, NULL, NULL));
}
/* slice [start, end) along axis -> pad the gradient back with zeros */
static void ad_SLICE(Ad *a, int i, int dy) {
  int x = X0, ax = norm_axis(nd(a, i)->ia[0], rank_of(a, x));
  int64_t start = nd(a, i)->ia[1], xd = ty(a, x).dim[ax], yd = ty(a, i).dim[ax];
  if (start < 0) start += xd;
  int64_t ia[3] = {ax, start, xd - start - yd};
  add_grad(a, x, em(a, IR_OP_PAD, &dy, 1, ia, NULL, NULL));
}
/* pad (before, after) along axis -> slice the operand's part back out */
static void ad_PAD(Ad *a, int i, int dy) {
  int x = X0, ax = norm_axis(nd(a, i)->ia[0], rank_of(a, x));
  int64_t before = nd(a, i)->ia[1];
  int64_t ia[3] = {ax, before, before + ty(a, x).dim[ax]};
  add_grad(a, x, em(a, IR_OP_SLICE, &dy, 1, ia, NULL, NULL));
}
/* each operand gets its slice of dy along axis */
static void ad_CONCAT(Ad *a, int i, int dy) {
  int nin = nd(a, i)->nin, ax = norm_axis(nd(a, i)->ia[0], rank_of(a, i));
  int64_t off = 0;
  for (int k = 0; k < nin; k++) {
    int x = in_of(a, i, k);
    int64_t d = ty(a, x).dim[ax];
    if (needs(a, x)) {
      int64_t ia[3] = {ax, off, off + d};
      add_grad(a, x, em(a, IR_OP_SLICE, &dy, 1, ia, NULL, NULL));
    }
    off += d;
  }
}
static void ad_BROADCAST(Ad *a, int i, int dy) {
  IrType t = ty(a, X0);
  add_grad(a, X0, emt(a, IR_OP_SUM_TO, dy, &t));
}
static void ad_SUM_TO(Ad *a, int i, int dy) {
  IrType t = ty(a, X0);
  add_grad(a, X0, emt(a, IR_OP_BROADCAST, dy, &t));
}

/* ---- reductions ---- */
/* Broadcasts v (node i's result or its gradient: x's shape reduced along
 * node i's axis, with or without keepdim) back to x's shape: for keepdim=0
 * first reshape to the keepdim shape so the numpy broadcast lines up. */
static int unreduce(Ad *a, int i, int v) {
  int x = X0;
  IrType xt = ty(a, x);
  if (!nd(a, i)->ia[1]) {
    IrType kt = xt;
    int ax = norm_axis(nd(a, i)->ia[0], xt.rank);
    kt.dim[ax] = 1;
    kt.dname[ax] = NULL;
    v = emt(a, IR_OP_RESHAPE, v, &kt);
  }
  return emt(a, IR_OP_BROADCAST, v, &xt);
}
static void ad_SUM(Ad *a, int i, int dy) { add_grad(a, X0, unreduce(a, i, dy)); }
static void ad_MEAN(Ad *a, int i, int dy) {
  int x = X0;
  int64_t n = ty(a, x).dim[norm_axis(nd(a, i)->ia[0], rank_of(a, x))];
  add_grad(a, x, emc(a, IR_OP_MULS, unreduce(a, i, dy), 1.0 / (double)n));
}
/* The gradient goes to every element equal to the max (ties share it in
 * full; with real data ties are measure-zero). */
static void ad_MAX(Ad *a, int i, int dy) {
  int x = X0;
  int hit = em2(a, IR_OP_EQ, x, unreduce(a, i, i));
  add_grad(a, x, em2(a, IR_OP_MUL, hit, unreduce(a, i, dy)));
}
/* s = sum(x^2) -> scalar: dx = 2 x dy */
static void ad_SUMSQ(Ad *a, int i, int dy) {
  int x = X0;
  IrType xt = ty(a, x);
  int b = emt(a, IR_OP_BROADCAST, dy, &xt);
  add_grad(a, x, em2(a, IR_OP_MUL, emc(a, IR_OP_MULS, x, 2.0), b));
}

/* ---- contraction ----
 * C = A' @ B' with A' = ta ? A^T : A ([.., M, K]) and B' = tb ? B^T : B
 * ([.., K, N]).  dA' = dC @ B'^T, dB' = A'^T @ dC, and dA = dA'^T when ta
 * (likewise B).  Each case is one matmul with the right transpose flags.
 * With a 2-D rhs and a batched lhs the weight gradient must sum over all
 * leading dims: flatten A' and dC to 2-D and contract over the rows. */
static void ad_MATMUL(Ad *a, int i, int dy) {
  int A = X0, B = X1;
  int ta = (int)nd(a, i)->ia[0], tb = (int)nd(a, i)->ia[1];
  int flat = rank_of(a, B) == 2 && rank_of(a, A) > 2;
  if (needs(a, A)) {
    int g;
    if (!ta) g = em_matmul(a, dy, B, 0, !tb);              /* dC @ B'^T */
    else if (!flat) g = em_matmul(a, B, dy, tb, 1);        /* (dC @ B'^T)^T = B' @ dC^T */
    else g = em_swap_last2(a, em_matmul(a, dy, B, 0, !tb)); /* 2-D B cannot be the batched lhs */
    add_grad(a, A, g);
  }
  if (needs(a, B)) {
    int g;
    if (!flat) {
      if (!tb) g = em_matmul(a, A, dy, !ta, 0);            /* A'^T @ dC */
      else g = em_matmul(a, dy, A, 1, ta);                 /* (A'^T @ dC)^T = dC^T @ A' */
    } else {
      IrType at = ty(a, A), dt = ty(a, dy);
      int64_t rows = ir_type_numel(&at) / at.dim[at.rank - (ta ? 2 : 1)];
      /* A' [.., M, K] -> [rows, K], made once per pipeline chunk: an
       * encoder's output feeds weights in several chunks, and a flattening
       * shared across them would travel between the backward blocks */
      if (a->flat[ta][A] < 0 || (a->K > 1 && a->m->blocks.a[a->mb].nodes[a->flat[ta][A]].stage != a->tag)) {
        IrType a2 = {at.dtype, 2, {rows, at.dim[at.rank - (ta ? 2 : 1)]},
                     {NULL, at.dname[at.rank - (ta ? 2 : 1)]}};
        a->flat[ta][A] = emt(a, IR_OP_RESHAPE, ta ? em_swap_last2(a, A) : A, &a2);
      }
      IrType d2 = {dt.dtype, 2, {rows, dt.dim[dt.rank - 1]}, {NULL, dt.dname[dt.rank - 1]}};
      int A2 = a->flat[ta][A], D2 = emt(a, IR_OP_RESHAPE, dy, &d2);
      g = tb ? em_matmul(a, D2, A2, 1, 0) : em_matmul(a, A2, D2, 1, 0);
    }
    add_grad(a, B, g);
  }
}

/* ---- neural-network ops ---- */
static void ad_SOFTMAX(Ad *a, int i, int dy) { add_grad(a, X0, em2(a, IR_OP_SOFTMAX_BWD, i, dy)); }
static void ad_LOG_SOFTMAX(Ad *a, int i, int dy) { add_grad(a, X0, em2(a, IR_OP_LOG_SOFTMAX_BWD, i, dy)); }
static void ad_LAYERNORM(Ad *a, int i, int dy) {
  int in[2] = {X0, dy};
  add_grad(a, X0, em(a, IR_OP_LAYERNORM_BWD, in, 2, NULL, nd(a, i)->fa, NULL));
}
static void ad_RMSNORM(Ad *a, int i, int dy) {
  int in[2] = {X0, dy};
  add_grad(a, X0, em(a, IR_OP_RMSNORM_BWD, in, 2, NULL, nd(a, i)->fa, NULL));
}
/* Scatter-add into the table; the ids are i32 and get nothing. */
static void ad_EMBEDDING(Ad *a, int i, int dy) {
  int table = X0;
  if (!needs(a, table)) return;
  IrType t = ty(a, table);
  int in[2] = {X1, dy};
  add_grad(a, table, em(a, IR_OP_EMBEDDING_BWD, in, 2, NULL, NULL, &t));
}
/* Masked positions are constants: their gradient is 0. */
static void ad_CAUSAL_MASK(Ad *a, int i, int dy) { add_grad(a, X0, emc(a, IR_OP_CAUSAL_MASK, dy, 0.0)); }
static void ad_MASKED_FILL(Ad *a, int i, int dy) {
  if (!needs(a, X0)) return;
  int in[2] = {dy, X1};
  double fill = 0.0;
  add_grad(a, X0, em(a, IR_OP_MASKED_FILL, in, 2, NULL, &fill, NULL));
}
/* The mask is a function of (seed, stream, step, micro, index), so the same
 * attrs on dy reproduce it: dx = dy * mask / (1 - p). */
static void ad_DROPOUT(Ad *a, int i, int dy) {
  IrNode n = *nd(a, i);
  add_grad(a, X0, em(a, IR_OP_DROPOUT, &dy, 1, n.ia, n.fa, NULL));
}
/* A rotation is orthogonal: its transpose is the inverse rotation. */
static void ad_ROPE(Ad *a, int i, int dy) {
  IrNode n = *nd(a, i);
  int64_t ia[2] = {n.ia[0], !n.ia[1]};
  add_grad(a, X0, em(a, IR_OP_ROPE, &dy, 1, ia, n.fa, NULL));
}
static void ad_CROSS_ENTROPY(Ad *a, int i, int dy) {
  if (!needs(a, X0)) return;
  int in[3] = {X0, X1, dy};
  add_grad(a, X0, em(a, IR_OP_CROSS_ENTROPY_BWD, in, 3, nd(a, i)->ia, NULL, NULL));
}
/* Fused attention: one attention_bwd per operand that needs a gradient
 * (part 0, 1, 2 = dq, dk, dv; 3 = the score bias's, the pre-softmax score
 * gradient summed over the batch), each from (q, k, v, o, do[, slope]
 * [, bias][, doc]) with the forward's attrs; each recomputes the
 * probabilities from q, k and the log-sum-exp rows (flash style, nothing
 * [Tq, Tk] is kept but dbias itself).  ALiBi's slopes (a constant of the
 * model, ops.def) and the document ids (i32) get no gradient. */
static void ad_ATTENTION(Ad *a, int i, int dy) {
  int sl = ir_attn_slope(nd(a, i)), bi = ir_attn_bias(nd(a, i));
  if (sl >= 0 && needs(a, nd(a, i)->in[sl])) {
    ad_fail(a, "attention's ALiBi slopes depend on a parameter, but they have no gradient (a constant of the "
            "model: compute them from the head count, not from a param)");
    return;
  }
  for (int part = 0; part < 4; part++) {
    IrNode n = *nd(a, i);
    int of = part < 3 ? n.in[part] : bi >= 0 ? n.in[bi] : -1;
    if (of < 0 || !needs(a, of)) continue;
    int in[8] = {n.in[0], n.in[1], n.in[2], i, dy, -1, -1, -1}, nin = 5;
    for (int k = 3; k < n.nin && k < 6; k++) in[nin++] = n.in[k];   /* slope, bias, doc: after o, do */
    int64_t ia[5] = {n.ia[0], part, n.ia[1], n.ia[2], n.ia[3]};   /* causal, part, window, alibi, bias */
    add_grad(a, of, em(a, IR_OP_ATTENTION_BWD, in, nin, ia, n.fa, NULL));
  }
}

/* ---- sparse mixture of experts (docs/ir.md "Token dispatch") ----
 * perm, unperm and gate_grad are one bilinear form B(x, y, s) =
 * sum over routed (t, e) of s[t, e] <x[t], y[row(t, e)]>, each op its
 * derivative in one slot, so each one's derivative is the other two.  The
 * routing mask r is a constant (no gradient); cnt is i32 (none either). */
static int em_moe(Ad *a, IrOp op, int x, int y, int z, int64_t rows) {
  int in[3] = {x, y, z};
  return em(a, op, in, 3, op == IR_OP_MOE_PERM ? &rows : NULL, NULL, NULL);
}
/* xs[R, D] = moe_perm(x[N, D], r, s; rows=R):
 * dx = moe_unperm(dxs, r, s), ds = moe_gate_grad(dxs, x, r). */
static void ad_MOE_PERM(Ad *a, int i, int dy) {
  int x = X0, r = X1, s = in_of(a, i, 2);
  if (needs(a, x)) add_grad(a, x, em_moe(a, IR_OP_MOE_UNPERM, dy, r, s, 0));
  if (needs(a, s)) add_grad(a, s, em_moe(a, IR_OP_MOE_GATE_GRAD, dy, x, r, 0));
}
/* out[N, D] = moe_unperm(y[R, D], r, s):
 * dy = moe_perm(dout, r, s; rows=R), ds = moe_gate_grad(y, dout, r). */
static void ad_MOE_UNPERM(Ad *a, int i, int dy) {
  int y = X0, r = X1, s = in_of(a, i, 2);
  if (needs(a, y)) add_grad(a, y, em_moe(a, IR_OP_MOE_PERM, dy, r, s, ty(a, y).dim[0]));
  if (needs(a, s)) add_grad(a, s, em_moe(a, IR_OP_MOE_GATE_GRAD, y, dy, r, 0));
}
/* G[N, E] = moe_gate_grad(y[R, D], d[N, D], r):
 * dy = moe_perm(d, r, dG; rows=R), dd = moe_unperm(y, r, dG). */
static void ad_MOE_GATE_GRAD(Ad *a, int i, int dy) {
  int y = X0, d = X1, r = in_of(a, i, 2);
  if (needs(a, y)) add_grad(a, y, em_moe(a, IR_OP_MOE_PERM, d, r, dy, ty(a, y).dim[0]));
  if (needs(a, d)) add_grad(a, d, em_moe(a, IR_OP_MOE_UNPERM, y, r, dy, 0));
}
static int em_gmm(Ad *a, IrOp op, int x, int y, int cnt, int64_t tb) {
  int in[3] = {x, y, cnt};
  return em(a, op, in, 3, op == IR_OP_GMM ? &tb : NULL, NULL, NULL);
}
/* y[R, N] = gmm(a[R, K], w, cnt), per group y_g = a_g w_g (tb: a_g w_g^T):
 *   tb=0, w[G, K, N]: da = gmm(dy, w, cnt; tb=1), dw = gmm_dw(a, dy, cnt);
 *   tb=1, w[G, N, K]: da = gmm(dy, w, cnt; tb=0), dw = gmm_dw(dy, a, cnt).
 * Rows past the groups get gradient 0 in a: gmm zeroes them in da. */
static void ad_GMM(Ad *a, int i, int dy) {
  int A = X0, W = X1, c = in_of(a, i, 2), tb = nd(a, i)->ia[0] != 0;
  if (needs(a, A)) add_grad(a, A, em_gmm(a, IR_OP_GMM, dy, W, c, !tb));
  if (needs(a, W)) add_grad(a, W, tb ? em_gmm(a, IR_OP_GMM_DW, dy, A, c, 0) : em_gmm(a, IR_OP_GMM_DW, A, dy, c, 0));
}
/* O[G, K, N] = gmm_dw(a[R, K], d[R, N], cnt), O_g = a_g^T d_g:
 * da = gmm(d, dO, cnt; tb=1), dd = gmm(a, dO, cnt; tb=0). */
static void ad_GMM_DW(Ad *a, int i, int dy) {
  int A = X0, D = X1, c = in_of(a, i, 2);
  if (needs(a, A)) add_grad(a, A, em_gmm(a, IR_OP_GMM, D, dy, c, 1));
  if (needs(a, D)) add_grad(a, D, em_gmm(a, IR_OP_GMM, A, dy, c, 0));
}
#undef X0
#undef X1

static const AdFn ad_fns[IR_OP_COUNT] = {
#define X(name, text, nin, ia, fa, flags, doc) [IR_OP_##name] = ad_##name,
#include "ir/ops.def"
#undef X
};

/* ---------------- the pass ---------------- */

/* Finds the value reported as `output "loss"` in block b; -1 with a message. */
static int find_loss(const IrModule *m, const IrBlock *b, char *err, size_t errlen) {
  const char *loss = ts_intern("loss");
  int at = -1;
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == loss) {
      if (at >= 0) { snprintf(err, errlen, "autodiff: block forward reports \"loss\" twice (%%%d and %%%d)", at, i); return -1; }
      at = i;
    }
  if (at < 0) { snprintf(err, errlen, "autodiff: block forward has no `output \"loss\"`"); return -1; }
  int v = b->nodes[at].in[0];
  const IrType *t = &b->nodes[v].type;
  if (t->rank != 0 || !ir_dtype_is_float(t->dtype)) {
    char buf[128];
    snprintf(err, errlen, "autodiff: the loss %%%d must be a float scalar, not %s", v, ir_type_str(t, buf, sizeof buf));
    return -1;
  }
  (void)m;
  return v;
}

/* need[i]: value i is float and depends on a parameter through ops a
 * gradient can pass; everything else is a constant for autodiff. */
static void mark_need(const IrModule *m, const IrBlock *b, unsigned char *need) {
  for (int i = 0; i < b->n; i++) {
    const IrNode *n = &b->nodes[i];
    unsigned fl = ir_ops[n->op].flags;
    need[i] = 0;
    if (!ir_dtype_is_float(n->type.dtype)) continue;
    if (n->op == IR_OP_STATE) {   /* (the range check is the verifier's; be safe anyway) */
      need[i] = n->ia[0] >= 0 && n->ia[0] < m->states.n && m->states.a[n->ia[0]].kind == IR_STATE_PARAM;
      continue;
    }
    if (fl & (OPF_LEAF | OPF_NODIFF | OPF_EFFECT)) continue;
    for (int k = 0; k < n->nin; k++) need[i] |= need[n->in[k]];
  }
}

/* accum g into parameter s's gradient state (made on first use). */
static void accumulate(Ad *a, int s, int g) {
  if (a->failed || g < 0) return;
  int gs = ir_state_derived(a->m, s, IR_STATE_GRAD, "grad", a->cx->err, sizeof a->cx->err);
  if (gs < 0) { a->failed = 1; return; }
  int64_t ia[1] = {gs};
  em(a, IR_OP_ACCUM, &g, 1, ia, NULL, NULL);
}

/* The backward walk from the loss down to node 0.  Without pipeline
 * chunks, each share of gradient a parameter read receives is accumulated
 * into the parameter's gradient state as soon as it is computed
 * (add_grad), so its buffer dies there: weight gradients never pile up
 * across layers, and a parameter read twice (a tied embedding) holds no
 * running sum across the backward.  With chunks the reads' gradients are summed per chunk and
 * accumulated at the end, one accum per chunk. */
static void differentiate(Ad *a, int loss, int n_micro) {
  IrModule *m = a->m;
  IrType lt = ty(a, loss);
  double seed = 1.0 / (double)n_micro;
  int K = a->K;
  if (K > 1) a->tag = ir_stage_tag(ir_stage_chunk(nd(a, loss)->stage), 1);
  /* the parameters' states (pgrad / pgradc are this long): not the grad
   * states appended later, nor fp16's scaler states made just below */
  int nstates = m->states.n;
  /* batch-size ramp-up: the step's count of micro batches changes at run
   * time, so its 1 / n_micro is an input the trainer feeds with each
   * micro batch ("micro_weight", a scalar of the loss's type) */
  int weight = -1;
  if (a->need[loss] && ir_train_rampup(&m->train)) {
    char err[512];
    weight = ir_emit(m, a->mb, IR_OP_INPUT, NULL, 0, NULL, NULL, ts_intern(IR_MICRO_WEIGHT), &lt, err, sizeof err);
    if (weight < 0) { ad_fail(a, "cannot emit the micro-batch weight input: %s", err); return; }  /* internal */
    if (a->K > 1) m->blocks.a[a->mb].nodes[weight].stage = a->tag;
  }
  if (a->need[loss] && scaler_on(m)) {
    /* fp16: the loss is multiplied by the loss scale (a state the update
     * changes; passes/scaler.c) before the backward, Megatron's scaled loss */
    int st[4];
    if (scaler_states(m, a->cx, st) != 0) { a->failed = 1; return; }
    int64_t ia[1] = {st[0]};
    int scale = em(a, IR_OP_STATE, NULL, 0, ia, NULL, &m->states.a[st[0]].type);
    a->grad[loss] = weight >= 0 ? em2(a, IR_OP_MUL, scale, weight) : emc(a, IR_OP_MULS, scale, seed);
  } else if (a->need[loss]) {   /* else no parameter influences the loss: nothing to do */
    a->grad[loss] = weight >= 0 ? weight : em(a, IR_OP_FULL, NULL, 0, NULL, &seed, &lt);
  }
  for (int i = loss; i >= 0 && !a->failed; i--) {
    if (K > 1 && a->nodep[i]) {       /* per chunk (see Ad) */
      if (!a->need[i]) continue;
      for (int c = 0; c < K && !a->failed; c++) {
        int gc = a->gradc[(size_t)i * K + c];
        if (gc < 0) continue;
        a->tag = ir_stage_tag(c, 1);
        const IrNode *n = nd(a, i);
        if (n->op == IR_OP_STATE) {
          int *p = &a->pgradc[(size_t)n->ia[0] * K + c];
          *p = *p < 0 ? gc : em2(a, IR_OP_ADD, *p, gc);
          continue;
        }
        a->cur = i;
        ad_fns[n->op](a, i, gc);
        a->cur = -1;
      }
      continue;
    }
    if (K > 1) a->tag = ir_stage_tag(ir_stage_chunk(nd(a, i)->stage), 1);
    int g = a->grad[i];
    if (g < 0 || !a->need[i]) continue;
    const IrNode *n = nd(a, i);
    if (n->op == IR_OP_STATE) {        /* a parameter read (K <= 1: accumulated in add_grad) */
      int s = (int)n->ia[0];
      a->pgrad[s] = a->pgrad[s] < 0 ? g : em2(a, IR_OP_ADD, a->pgrad[s], g);
      continue;
    }
    a->cur = i;
    ad_fns[n->op](a, i, g);
    a->cur = -1;
  }
  for (int s = 0; s < nstates && !a->failed; s++) {
    if (K <= 1) continue;             /* accumulated in the walk */
    for (int c = 0; c < K; c++) {     /* one accum per chunk that reads the parameter */
      if (a->pgradc[(size_t)s * K + c] < 0) continue;
      a->tag = ir_stage_tag(c, 1);
      accumulate(a, s, a->pgradc[(size_t)s * K + c]);
    }
  }
}

int pass_autodiff(IrModule *m, PassCtx *cx) {
  int fb = ir_block_find(m, "forward");
  if (fb < 0) { snprintf(cx->err, sizeof cx->err, "autodiff: the module has no block \"forward\""); return -1; }
  if (ir_block_find(m, "micro") >= 0) { snprintf(cx->err, sizeof cx->err, "autodiff: block \"micro\" already exists"); return -1; }
  const IrTrain *t = &m->train;
  if (t->micro_batch <= 0 || t->global_batch <= 0 || t->global_batch % t->micro_batch) {
    snprintf(cx->err, sizeof cx->err, "autodiff: global_batch %lld is not a positive multiple of micro_batch %lld",
             (long long)t->global_batch, (long long)t->micro_batch);
    return -1;
  }
  int loss = find_loss(m, &m->blocks.a[fb], cx->err, sizeof cx->err);
  if (loss < 0) return -1;

  int nstates0 = m->states.n, nblocks0 = m->blocks.n;
  int mb = ir_block_add(m, "micro");
  /* Copy the forward nodes: same ids, so forward value i is micro value i.
   * Operand arrays stay shared with the forward block (both live in m's
   * arena, and nodes are never edited in place). */
  const IrBlock *f = &m->blocks.a[fb];
  IrBlock *mbk = &m->blocks.a[mb];
  int nf = f->n;
  mbk->cap = nf + 16;
  mbk->nodes = arena_alloc(&m->arena, (size_t)mbk->cap * sizeof *mbk->nodes);
  memcpy(mbk->nodes, f->nodes, (size_t)nf * sizeof *f->nodes);
  mbk->n = nf;

  Ad a = {.m = m, .cx = cx, .mb = mb, .cur = -1};
  a.need = arena_alloc(&cx->scratch, (size_t)nf + 1);
  a.grad = arena_alloc(&cx->scratch, ((size_t)nf + 1) * sizeof *a.grad);
  a.pgrad = arena_alloc(&cx->scratch, ((size_t)nstates0 + 1) * sizeof *a.pgrad);
  for (int t = 0; t < 2; t++) {
    a.flat[t] = arena_alloc(&cx->scratch, ((size_t)nf + 1) * sizeof *a.flat[t]);
    for (int i = 0; i < nf; i++) a.flat[t][i] = -1;
  }
  for (int i = 0; i < nf; i++) a.grad[i] = -1;
  for (int s = 0; s < nstates0; s++) a.pgrad[s] = -1;
  mark_need(m, mbk, a.need);
  /* pipeline: chunks, when pass "partition" tagged the forward nodes */
  int tagged = 0;
  for (int i = 0; i < nf; i++) tagged |= mbk->nodes[i].stage > 0;
  if (tagged) {
    a.K = ir_axis_size(m, IR_AXIS_PP) * (m->par.vpp > 0 ? m->par.vpp : 1);
    for (int i = 0; i < nf; i++)
      if (ir_stage_chunk(mbk->nodes[i].stage) < 0 || ir_stage_chunk(mbk->nodes[i].stage) >= a.K) {
        snprintf(cx->err, sizeof cx->err, "autodiff: forward node %%%d has pipeline stage tag %d outside the %d chunks", i,
                 mbk->nodes[i].stage, a.K);
        m->blocks.n = nblocks0;
        return -1;
      }
    a.nodep = arena_alloc(&cx->scratch, (size_t)nf + 1);
    for (int i = 0; i < nf; i++) {
      const IrNode *n = &mbk->nodes[i];
      int dep = n->op == IR_OP_INPUT;
      for (int k = 0; k < n->nin; k++) dep |= !a.nodep[n->in[k]];
      a.nodep[i] = !dep;
    }
    size_t kn = ((size_t)nf + 1) * (size_t)a.K, ks = ((size_t)nstates0 + 1) * (size_t)a.K;
    a.gradc = arena_alloc(&cx->scratch, kn * sizeof *a.gradc);
    a.pgradc = arena_alloc(&cx->scratch, ks * sizeof *a.pgradc);
    for (size_t k = 0; k < kn; k++) a.gradc[k] = -1;
    for (size_t k = 0; k < ks; k++) a.pgradc[k] = -1;
  }

  differentiate(&a, loss, (int)(t->global_batch / t->micro_batch));
  if (a.failed) {            /* leave the module as it was */
    m->blocks.n = nblocks0;
    ir_states_truncate(m, nstates0);
    return -1;
  }
  /* Drop "forward" (its nodes stay in the arena until the module is freed). */
  memmove(&m->blocks.a[fb], &m->blocks.a[fb + 1], (size_t)(m->blocks.n - fb - 1) * sizeof *m->blocks.a);
  m->blocks.n--;
  return 0;
}
