/* precision.c - pass "precision": the dtype every value is STORED in, as
 * an IR type, decided per op class by one table (docs/precision.md).
 *
 * Expects: the block "micro" (after autodiff and shard; before remat, the
 *   pipeline split and the optimizer), every arithmetic value in the model
 *   precision.  16-bit values (bf16 / f16) may already exist: an MDL
 *   annotation or cast made them.
 * Guarantees:
 *   - the arithmetic of every op is f32 (or the model's f64): an operand
 *     stored in 16 bits reaches an op that does arithmetic (other than the
 *     16-bit matmul below) through an
 *     explicit `cast ... : f32` placed right before that op (one per op
 *     and operand: cast at use, so the f32 copy lives only as long as the
 *     op, and the fusion pass folds it into the op's kernel);
 *   - with m->train.lowp set (--precision bf16): each value an op class
 *     stores in 16 bits (table below) is followed by `cast ... : bf16`,
 *     and every reader gets the 16-bit value; a matmul (OPF_MIXED) reads
 *     its 16-bit operands as they are, an f32 operand rounded to 16 bits
 *     first, and stores its result in 16 bits (no cast after it) or, when
 *     an accum reads it or the policy says gemm=f32, in f32 (a GEMM of bf16
 *     operands with f32 accumulation, Megatron's); in a bf16 plan a matmul
 *     whose only reader (through reshapes) is a bias add keeps its f32
 *     product too, the bias cast to f32 before its broadcast, so the add
 *     rounds once (cuBLASLt's bias epilogue); gmm and gmm_dw read f32
 *     casts of operands rounded to 16 bits;
 *     every parameter read becomes a read of its 16-bit copy, a new state
 *     of kind `copy` (ir.h) that the runtime refreshes from the f32 master
 *     once per step; values added into gradient states (accum) and the
 *     loss stay f32 (main grads); layout ops move the dtype they read;
 *     scalars (rank 0) stay f32: no bytes to save, and fp16's scaled loss
 *     seed (2^32 / n) would round to inf;
 *   - pipeline stage tags (pp > 1): a cast that stores a value in 16 bits
 *     (or rounds a GEMM operand to them) carries its producer's tag, a cast
 *     back to f32 at use carries its reader's tag, so that what pass
 *     pipeline sends across a stage boundary or stashes for the backward is
 *     the 16-bit value (2 bytes per element), never an f32 copy of it;
 *   - without lowp and without 16-bit values the module is unchanged.
 * Refuses: lowp with an f64 model, a policy override naming an unknown
 *   class. */
#include "passes.h"
#include <string.h>

/* ---- the policy table ----
 * class, its name for --precision-policy and the docs, and whether its
 * results are stored in 16 bits under --precision bf16 by default: 1 yes,
 * 0 no (f32), -1 as its operands were stored (a tp all-reduce of a bf16
 * GEMM output gives bf16, as in Megatron; vocab-parallel cross entropy's
 * statistics, f32 reductions, stay f32). */
typedef enum {
  PC_NONE,      /* effects, leaves, i32: untouched */
  PC_GEMM,      /* matmul gmm gmm_dw: operands rounded to 16 bits, f32 accumulation */
  PC_ATTN,      /* attention attention_bwd attn_finish attn_cached: f32 inside, output stored */
  PC_EW,        /* elementwise, activations, dropout, rope, masks, embedding, gathers, MoE moves */
  PC_NORM,      /* layernorm rmsnorm and their backwards: computed in f32 */
  PC_SOFTMAX,   /* softmax softmax_bwd: computed in f32 */
  PC_LOSS,      /* log_softmax cross_entropy and their backwards */
  PC_REDUCE,    /* sum mean max sumsq sum_to */
  PC_STATS,     /* the ring attention's running softmax state and log-sum-exp */
  PC_COMM,      /* collectives that sum: in f32 (MPI sums f32); the result stored as the operand was */
  PC_LAYOUT,    /* reshape permute slice pad concat broadcast shard_slice: the operand's dtype */
  PC_COUNT
} PrecClass;

static const struct { const char *name; int store16; const char *doc; } pc_info[PC_COUNT] = {
    [PC_NONE] = {"none", 0, "leaves, effects, integers"},
    [PC_GEMM] = {"gemm", 1, "matmul, gmm, gmm_dw"},
    [PC_ATTN] = {"attn", 1, "attention, attention_bwd, attn_finish, attn_cached"},
    [PC_EW] = {"ew", 1, "elementwise ops, activations, dropout, rope, masks, embedding, gathers, MoE"},
    [PC_NORM] = {"norm", 1, "layernorm, rmsnorm and their backwards"},
    [PC_SOFTMAX] = {"softmax", 1, "softmax, softmax_bwd"},
    [PC_LOSS] = {"loss", 0, "log_softmax, cross_entropy and their backwards"},
    [PC_REDUCE] = {"reduce", 0, "sum, mean, max, sumsq, sum_to"},
    [PC_STATS] = {"stats", 0, "attn_acc, attn_lse, attn_bwd_q, attn_bwd_kv (ring attention)"},
    [PC_COMM] = {"comm", -1, "all_reduce, reduce_scatter, all_to_all, group_sum (summed in f32)"},
    [PC_LAYOUT] = {"layout", -1, "reshape, permute, slice, pad, concat, broadcast, shard_slice, all_gather"},
};

static PrecClass op_class(IrOp op) {
  switch (op) {
  case IR_OP_MATMUL: case IR_OP_GMM: case IR_OP_GMM_DW: return PC_GEMM;
  case IR_OP_ATTENTION: case IR_OP_ATTENTION_BWD: case IR_OP_ATTN_FINISH: case IR_OP_ATTN_CACHED: return PC_ATTN;
  case IR_OP_LAYERNORM: case IR_OP_LAYERNORM_BWD: case IR_OP_RMSNORM: case IR_OP_RMSNORM_BWD: return PC_NORM;
  case IR_OP_SOFTMAX: case IR_OP_SOFTMAX_BWD: return PC_SOFTMAX;
  case IR_OP_LOG_SOFTMAX: case IR_OP_LOG_SOFTMAX_BWD: case IR_OP_CROSS_ENTROPY: case IR_OP_CROSS_ENTROPY_BWD:
    return PC_LOSS;
  case IR_OP_SUM: case IR_OP_MEAN: case IR_OP_MAX: case IR_OP_SUMSQ: case IR_OP_SUM_TO: case IR_OP_CLIP_COEF:
    return PC_REDUCE;
  case IR_OP_ATTN_ACC: case IR_OP_ATTN_LSE: case IR_OP_ATTN_BWD_Q: case IR_OP_ATTN_BWD_KV: return PC_STATS;
  case IR_OP_RESHAPE: case IR_OP_PERMUTE: case IR_OP_SLICE: case IR_OP_PAD: case IR_OP_CONCAT:
  case IR_OP_BROADCAST: case IR_OP_SHARD_SLICE: case IR_OP_ALL_GATHER:
    return PC_LAYOUT;
  case IR_OP_INPUT: case IR_OP_STATE: case IR_OP_FULL: case IR_OP_ARANGE: case IR_OP_RAND: case IR_OP_RECV:
  case IR_OP_UNSTASH:
  case IR_OP_RING_SHIFT: case IR_OP_RING_WAIT:   /* the ring's blocks: f32, a ring_wait reads its ring_shift */
    return PC_NONE;
  default:
    break;
  }
  if (ir_op_communicates(op)) return PC_COMM;
  if (ir_ops[op].flags & OPF_EFFECT) return PC_NONE;
  return PC_EW;
}

void pass_precision_classes(StrBuf *out) {
  for (int c = 1; c < PC_COUNT; c++)
    sb_printf(out, "%-8s %-6s %s\n", pc_info[c].name,
              pc_info[c].store16 < 0 ? "follow" : pc_info[c].store16 ? "16" : "f32", pc_info[c].doc);
  sb_puts(out, "(follow: stored as the operands were: 16 if one was)\n");
}

/* "norm=f32,softmax=16" -> store16[] overrides.  0 or -1 with a message. */
static int parse_policy(const char *spec, int *store16, char *err, size_t errlen) {
  for (int c = 0; c < PC_COUNT; c++) store16[c] = pc_info[c].store16;
  if (!spec || !*spec) return 0;
  const char *s = spec;
  while (*s) {
    const char *eq = strchr(s, '='), *end = strchr(s, ',');
    if (!end) end = s + strlen(s);
    if (!eq || eq > end)
      return ts_errf(err, errlen, "--precision-policy '%s': expected CLASS=f32 or CLASS=16, comma-separated", spec);
    int c = -1;
    for (int k = 1; k < PC_COUNT; k++)
      if ((size_t)(eq - s) == strlen(pc_info[k].name) && !strncmp(s, pc_info[k].name, (size_t)(eq - s))) c = k;
    size_t vn = (size_t)(end - eq - 1);
    int v = vn == 3 && !strncmp(eq + 1, "f32", 3) ? 0 : vn == 2 && !strncmp(eq + 1, "16", 2) ? 1 : -1;
    if (c < 0 || c == PC_LAYOUT || v < 0) {
      StrBuf b = {0};
      for (int k = 1; k < PC_COUNT; k++)
        if (k != PC_LAYOUT) sb_printf(&b, "%s%s", k > 1 ? ", " : "", pc_info[k].name);
      ts_errf(err, errlen, "--precision-policy: '%.*s' is not CLASS=f32 or CLASS=16 (classes: %s; layout ops "
              "always keep their operand's dtype)", (int)(end - s), s, b.p ? b.p : "");
      free(b.p);
      return -1;
    }
    store16[c] = v;
    s = *end ? end + 1 : end;
  }
  return 0;
}

/* ---- the rewrite ---- */
typedef struct {
  IrModule *m;
  PassCtx *cx;
  int bi;            /* the new block */
  IrDtype lowp;      /* IR_VOID: legalize only */
  IrDtype prec;      /* the arithmetic dtype */
  int reader_stage;  /* the stage tag of the op whose operands are being cast */
  int failed;
} Px;

/* cast v to `to`.  Its pipeline stage tag: a cast to 16 bits is part of
 * the producer (the value crosses stages and is stashed in 16 bits), a
 * cast to the arithmetic type part of the reader (cast at use). */
static int emit_cast(Px *x, int v, IrDtype to) {
  const IrNode *src = &x->m->blocks.a[x->bi].nodes[v];
  if (src->type.dtype == to) return v;
  IrType t = src->type;
  t.dtype = to;
  IrSharding sh = src->sh;
  int stage = ir_dtype_is_16(to) ? src->stage : x->reader_stage;
  char msg[512];
  int id = ir_emit(x->m, x->bi, IR_OP_CAST, &v, 1, NULL, NULL, NULL, &t, msg, sizeof msg);
  if (id < 0) {
    x->failed = 1;
    ts_errf(x->cx->err, sizeof x->cx->err, "precision: %s", msg);
    return v;
  }
  IrNode *n = &x->m->blocks.a[x->bi].nodes[id];
  n->sh = sh;
  n->stage = stage;
  return id;
}

/* The 16-bit copy state of param p (created on first use). */
static int copy_state(Px *x, int p) {
  char name[512];
  snprintf(name, sizeof name, "%s.%s", ir_dtype_name(x->lowp), x->m->states.a[p].name);
  int s = ir_state_find(x->m, name);
  if (s >= 0) return s;
  IrState c = x->m->states.a[p];
  c.name = ts_intern(name);
  c.type.dtype = x->lowp;
  c.kind = IR_STATE_COPY;
  c.of = p;
  c.init = IR_INIT_ZEROS;
  c.init_a = c.init_b = 0;
  c.flags = 0;
  return ir_state_add(x->m, &c);
}

int pass_precision(IrModule *m, PassCtx *cx) {
  int mb = ir_block_find(m, "micro");
  IrDtype lowp = m->train.lowp;
  if (lowp != IR_VOID && !ir_dtype_is_16(lowp))
    return ts_errf(cx->err, sizeof cx->err, "precision: train lowp=%s is not a 16-bit type", ir_dtype_name(lowp));  /* internal */
  if (lowp != IR_VOID && m->train.precision != IR_F32)
    return ts_errf(cx->err, sizeof cx->err, "precision: precision %s keeps f32 masters; the model's arithmetic "  /* internal */
                   "type is %s (compile it with --precision %s alone)", ir_dtype_name(lowp),
                   ir_dtype_name(m->train.precision), ir_dtype_name(lowp));
  if (cx->loss_scale_flag && lowp != IR_F16)
    return ts_errf(cx->err, sizeof cx->err, "precision: %s sets fp16's loss scaling, but this module trains in %s; "
                   "use it with --precision fp16 (bf16 has f32's exponent range and needs no loss scale)",
                   cx->loss_scale_flag, ir_dtype_name(lowp != IR_VOID ? lowp : m->train.precision));
  int store16[PC_COUNT];
  if (parse_policy(cx->precision_policy, store16, cx->err, sizeof cx->err) != 0) return -1;
  if (cx->precision_policy && *cx->precision_policy && lowp == IR_VOID)
    return ts_errf(cx->err, sizeof cx->err, "precision: --precision-policy '%s' chooses which values --precision bf16 "
                   "or fp16 stores in 16 bits, and this module trains in %s: give --precision bf16 (or fp16), or leave "
                   "out --precision-policy", cx->precision_policy, ir_dtype_name(m->train.precision));
  if (mb < 0) return 0;   /* nothing to type (a module without autodiff's block) */
  const IrBlock *ob0 = &m->blocks.a[mb];
  int any16 = 0;
  for (int i = 0; i < ob0->n; i++) any16 |= ir_dtype_is_16(ob0->nodes[i].type.dtype);
  if (lowp == IR_VOID && !any16) return 0;

  /* the old block, detached; the new one takes its place */
  IrBlock old = m->blocks.a[mb];
  int n = old.n;
  IrBlock fresh = {.name = old.name};
  m->blocks.a[mb] = fresh;
  Px x = {.m = m, .cx = cx, .bi = mb, .lowp = lowp, .prec = m->train.precision};

  /* which values an accum or output reads: they stay f32 (main grads, loss) */
  unsigned char *keep32 = arena_alloc(&cx->scratch, (size_t)n + 1);
  memset(keep32, 0, (size_t)n + 1);
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &old.nodes[i];
    if (nd->op == IR_OP_ACCUM || nd->op == IR_OP_OUTPUT)
      for (int k = 0; k < nd->nin; k++) keep32[nd->in[k]] = 1;
  }
  /* ... and through a layout op to the value it alone reads: a weight
   * gradient reshaped into its parameter's shape ([embed, heads * hd] ->
   * [embed, heads, hd]) is made in f32 by its GEMM, not rounded to 16 bits
   * on the way to the f32 main grad */
  int *readers = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *readers);
  memset(readers, 0, ((size_t)n + 1) * sizeof *readers);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < old.nodes[i].nin; k++) readers[old.nodes[i].in[k]]++;
  for (int i = n - 1; i >= 0; i--) {
    const IrNode *nd = &old.nodes[i];
    if (keep32[i] && op_class(nd->op) == PC_LAYOUT && nd->nin == 1 && readers[nd->in[0]] == 1) keep32[nd->in[0]] = 1;
  }
  /* GEMM bias adds (bf16): a matmul whose only reader, through reshapes
   * each read once, is an add of a broadcast read once (`x @ W + b`, the
   * epilogue form of plan_epilogue_match) keeps its f32 product, and the
   * bias is cast to f32 before its broadcast, so the add reads both in f32
   * and rounds once to bf16 after it -- cuBLASLt's bias epilogue (f32
   * accumulator + bias, one rounding into D), not the product rounded to
   * bf16 and the sum rounded again; the fusion pass then makes the matmul,
   * reshapes, broadcast and add one epilogue as in an f32 plan.  bf16 only:
   * fp16 plans keep their rounding points. */
  unsigned char *bias32 = arena_alloc(&cx->scratch, (size_t)n + 1);
  memset(bias32, 0, (size_t)n + 1);
  if (lowp == IR_BF16 && store16[PC_GEMM])
    for (int i = 0; i < n; i++) {
      const IrNode *a = &old.nodes[i];
      if (a->op != IR_OP_ADD || a->nin != 2 || a->in[0] == a->in[1]) continue;
      for (int side = 0; side < 2; side++) {
        int bc = a->in[side], v = a->in[1 - side];
        if (old.nodes[bc].op != IR_OP_BROADCAST || readers[bc] != 1) continue;
        while (old.nodes[v].op == IR_OP_RESHAPE && readers[v] == 1) v = old.nodes[v].in[0];
        if (old.nodes[v].op != IR_OP_MATMUL || readers[v] != 1) continue;
        for (int u = a->in[1 - side]; u != v; u = old.nodes[u].in[0]) keep32[u] = 1;
        keep32[v] = 1;
        bias32[bc] = 1;
        break;
      }
    }
  int *nv = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *nv);
  int ops[64];
  for (int i = 0; i < n && !x.failed; i++) {
    IrNode nd = old.nodes[i];
    PrecClass pc = op_class(nd.op);
    int *in = nd.nin <= 64 ? ops : arena_alloc(&cx->scratch, (size_t)nd.nin * sizeof *in);
    x.reader_stage = nd.stage;
    /* operands: as stored, then what the op reads */
    IrDtype follow = IR_VOID;   /* a layout op's result dtype: its float operands' one dtype */
    int mixed = 0, any16 = 0;
    for (int k = 0; k < nd.nin; k++) {
      in[k] = nv[nd.in[k]];
      IrDtype d = m->blocks.a[mb].nodes[in[k]].type.dtype;
      any16 |= ir_dtype_is_16(d);
      if (pc == PC_LAYOUT && (ir_dtype_is_16(d) || ir_dtype_is_float(d))) {
        if (follow == IR_VOID) follow = d;
        else if (follow != d) mixed = 1;
      }
    }
    /* a GEMM that reads 16-bit operands itself (OPF_MIXED: matmul): under
     * lowp, when its operands are lowp values or the policy rounds them */
    int gemm16 = 0;
    if (lowp != IR_VOID && (ir_ops[nd.op].flags & OPF_MIXED)) {
      int all16 = 1, other16 = 0;
      for (int k = 0; k < nd.nin; k++) {
        IrDtype d = m->blocks.a[mb].nodes[in[k]].type.dtype;
        all16 &= d == lowp;
        other16 |= ir_dtype_is_16(d) && d != lowp;
      }
      gemm16 = !other16 && (all16 || store16[PC_GEMM]);
    }
    int reads16 = (ir_op_reads_16(nd.op) && !(pc == PC_LAYOUT && mixed) && !(ir_ops[nd.op].flags & OPF_MIXED)) ||
                  gemm16;
    for (int k = 0; k < nd.nin; k++) {
      IrDtype d = m->blocks.a[mb].nodes[in[k]].type.dtype;
      int dup = -1;
      for (int j = 0; j < k; j++)
        if (nd.in[j] == nd.in[k]) dup = j;
      if (dup >= 0) { in[k] = in[dup]; continue; }   /* one cast per op and operand value */
      if (gemm16 && d == x.prec) {
        /* the 16-bit GEMM: an f32 operand (the loss's gradient) is rounded to 16 bits */
        in[k] = emit_cast(&x, in[k], lowp);
      } else if (ir_dtype_is_16(d) && (!reads16 || bias32[i])) {   /* bias32: the bias, cast before its broadcast */
        in[k] = emit_cast(&x, in[k], x.prec);
      } else if (pc == PC_GEMM && lowp != IR_VOID && d == x.prec && store16[PC_GEMM]) {
        /* a GEMM of 16-bit operands computed in f32 (gmm, gmm_dw): an f32 operand is rounded first */
        in[k] = emit_cast(&x, emit_cast(&x, in[k], lowp), x.prec);
      }
    }
    if (x.failed) break;
    if (bias32[i]) follow = x.prec;   /* the broadcast of the f32 cast of the bias */
    /* parameter reads become reads of the 16-bit copy */
    if (nd.op == IR_OP_STATE && lowp != IR_VOID && m->states.a[nd.ia[0]].kind == IR_STATE_PARAM &&
        m->states.a[nd.ia[0]].type.dtype == x.prec) {
      nd.ia[0] = copy_state(&x, (int)nd.ia[0]);
      nd.type.dtype = lowp;
    }
    IrType t = nd.type;
    /* the 16-bit GEMM stores its result in 16 bits as the policy says, else
     * its f32 accumulator (weight gradients: f32 main grads) */
    if (gemm16) t.dtype = store16[PC_GEMM] && !keep32[i] ? lowp : x.prec;
    else if (ir_ops[nd.op].flags & OPF_MIXED) t.dtype = IR_VOID;   /* f32 operands: inferred */
    if (pc == PC_LAYOUT && !mixed && follow != IR_VOID && ir_dtype_is_float(t.dtype)) t.dtype = follow;
    if (pc == PC_LAYOUT && mixed && ir_dtype_is_16(t.dtype)) t.dtype = x.prec;
    if (nd.op == IR_OP_CONCAT && mixed)
      for (int k = 0; k < nd.nin; k++) in[k] = emit_cast(&x, in[k], x.prec);
    char msg[512];
    int id = ir_emit(m, mb, nd.op, in, nd.nin, nd.ia, nd.fa, nd.sa,
                     ir_op_given_type(nd.op, &t), msg, sizeof msg);
    if (id < 0) {
      ts_errf(cx->err, sizeof cx->err, "precision: node %d (%s): %s", i, ir_ops[nd.op].name, msg);  /* internal */
      x.failed = 1;
      break;
    }
    IrNode *out = &m->blocks.a[mb].nodes[id];
    out->sh = nd.sh;
    out->group = 0;
    out->stage = nd.stage;
    out->why = nd.why;
    nv[i] = id;
    /* the result's storage */
    if (lowp != IR_VOID && out->type.dtype == x.prec && pc != PC_LAYOUT && pc != PC_NONE && !keep32[i] &&
        out->type.rank > 0 && (store16[pc] > 0 || (store16[pc] < 0 && any16)))
      nv[i] = emit_cast(&x, id, lowp);
  }
  if (x.failed) {
    m->blocks.a[mb] = old;   /* the new nodes stay in the arena */
    return -1;
  }
  return 0;
}
