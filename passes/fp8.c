/* fp8.c - pass "fp8": FP8 training as Megatron + Transformer Engine's
 * delayed-scaling recipe does it (docs/precision.md "FP8"), as IR.
 *
 * Expects: block "micro" after pass precision under --precision bf16 (the
 *   GEMMs are 16-bit matmuls reading bf16 operands), the forward ending at
 *   `output "loss"`, a repeat stack (pass_layer_units' rule: parameters
 *   named <stack>.<i>.*).  With pp > 1, the partition pass's chunk tags on
 *   the nodes (the new nodes take their GEMM's: a layer's tensors are
 *   quantized in its chunk, the fp8 copies stashed like other values).
 * Guarantees (with cx->fp8 set; otherwise the module is unchanged):
 *   - the layers chosen: every layer of each repeat stack but its first and
 *     last (Megatron's --first-last-layers-bf16), or all of them with
 *     --fp8-all-layers.  Chosen from the IR: the units of pass_layer_units;
 *   - the GEMMs rewritten: each forward matmul of a chosen layer whose
 *     operands are bf16 and not partial sums, and each backward matmul that
 *     reads an operand of one of those (dX = dY W^T, dW = X^T dY); each
 *     becomes `matmul8 a8, b8, sinv_a, sinv_b` with the matmul's ta / tb
 *     and result dtype (bf16, or f32 for a weight gradient into its main
 *     grad);
 *   - each operand is quantized ONCE per micro batch, at the value the
 *     reshapes in front of it start from (TE quantizes a tensor once and
 *     the backward reuses the forward's fp8 copy): `%s = state @<t>.scale`,
 *     `%q = quant8 %x, %s : f8e4m3[...]` (f8e5m2 for a gradient -- an
 *     operand made by the backward -- under hybrid), `amax_acc %x
 *     @<t>.amax`, then the reshapes again on the fp8 value;
 *   - per quantized tensor t four states of kind fp8 (f32, replicated):
 *     <t>.amax [] (this step's, 0), <t>.amax_history [len] (0), <t>.scale
 *     [] (1) and <t>.scale_inv [] (1); t is fp8.<stack>.<i>.<role><j>, role
 *     w (a parameter's copy), x (a forward activation) or dy (a gradient);
 *   - fp8_update_ops (the optimizer pass calls it at the end of "update",
 *     with pp of "update.<r>" for the rank r holding the tensor's chunk):
 *     per t: the amax all-reduced with max over every axis of size > 1 but
 *     pp (dp, cp, ep, tp: the ranks sharing the tensor, so every rank gets
 *     the same scale), `fp8_scale` (history, scale, scale_inv), `zero` the
 *     amax.
 * Refuses: --fp8 without --precision bf16, a history length
 *   < 1, a model without a repeat stack or with no GEMM to rewrite. */
#include "passes.h"
#include "pipe.h"
#include <math.h>
#include <string.h>

#define FP8_E4M3_MAX 448.0
#define FP8_E5M2_MAX 57344.0

typedef struct {
  IrModule *m;
  PassCtx *cx;
  int bi;              /* the new block */
  const IrBlock *old;  /* the old one */
  int *nv;             /* old id -> new id */
  int *q4, *q5;        /* old id -> new id of its fp8 copy (f8e4m3 / f8e5m2), -1 none */
  int *sinv4, *sinv5;  /* old id -> its scale_inv state (of the root quantization) */
  int failed;
} Fx;

static int emit(Fx *x, IrOp op, const int *in, int nin, const int64_t *ia, const IrType *t, const IrSharding *sh,
                int stage) {
  char msg[512];
  int id = ir_emit(x->m, x->bi, op, in, nin, ia, NULL, NULL, t, msg, sizeof msg);
  if (id < 0) {
    x->failed = 1;
    ts_errf(x->cx->err, sizeof x->cx->err, "fp8: cannot emit %s: %s", ir_ops[op].name, msg);   /* internal */
    return -1;
  }
  IrNode *n = &x->m->blocks.a[x->bi].nodes[id];
  if (sh) n->sh = *sh;
  n->stage = stage;
  return id;
}

static int fp8_state(IrModule *m, const char *base, const char *suffix, int64_t len, double start) {
  char name[600];
  snprintf(name, sizeof name, "%s.%s", base, suffix);
  int s = ir_state_find(m, name);
  if (s >= 0) return s;
  IrState st;
  memset(&st, 0, sizeof st);
  st.name = ts_intern(name);
  st.type.dtype = IR_F32;
  st.type.rank = len > 0 ? 1 : 0;
  st.type.dim[0] = len;
  st.kind = IR_STATE_FP8;
  st.of = -1;
  st.init_a = start;
  return ir_state_add(m, &st);
}

/* The fp8 copy (format fmt) of old value v: the reshapes in front of v
 * re-applied to the fp8 copy of the value they start from, which is
 * quantized (scale state read, quant8, amax_acc) on first use.  base: the
 * tensor's state name prefix when this is a new quantization. */
static int fp8_of(Fx *x, int v, IrDtype fmt, const char *base, int stage, int *sinv) {
  int *cache = fmt == IR_F8E4M3 ? x->q4 : x->q5, *sc = fmt == IR_F8E4M3 ? x->sinv4 : x->sinv5;
  if (cache[v] >= 0) {
    *sinv = sc[v];
    return cache[v];
  }
  const IrNode *o = &x->old->nodes[v];
  IrType t = o->type;
  t.dtype = fmt;
  int id;
  if (o->op == IR_OP_RESHAPE && !o->sh.partial) {
    int r = fp8_of(x, o->in[0], fmt, base, stage, sinv);
    if (r < 0) return -1;
    id = emit(x, IR_OP_RESHAPE, &r, 1, NULL, &t, &o->sh, stage);
  } else {
    int hist = fp8_state(x->m, base, "amax_history", x->cx->fp8_history, 0);
    int amax = fp8_state(x->m, base, "amax", 0, 0);
    int scale = fp8_state(x->m, base, "scale", 0, 1);
    *sinv = fp8_state(x->m, base, "scale_inv", 0, 1);
    (void)hist;
    int64_t ia[1] = {scale};
    int s = emit(x, IR_OP_STATE, NULL, 0, ia, &x->m->states.a[scale].type, NULL, stage);
    int in[2] = {x->nv[v], s};
    id = s < 0 ? -1 : emit(x, IR_OP_QUANT8, in, 2, NULL, &t, &o->sh, stage);
    int64_t ja[1] = {amax};
    if (id >= 0) emit(x, IR_OP_AMAX_ACC, &x->nv[v], 1, ja, NULL, NULL, stage);
    if (id >= 0) x->m->blocks.a[x->bi].nodes[id].why =
        ts_intern("fp8 delayed scaling: x * scale rounded to fp8 (scale from the amax history of earlier steps)");
  }
  if (id < 0) return -1;
  cache[v] = id;
  sc[v] = *sinv;
  return id;
}

/* the value the reshapes in front of v start from */
static int root_of(const IrBlock *b, int v) {
  while (b->nodes[v].op == IR_OP_RESHAPE && !b->nodes[v].sh.partial) v = b->nodes[v].in[0];
  return v;
}

/* the operand v of a rewritten matmul: what tensor it is, for its name */
static const char *role_of(const IrModule *m, const IrBlock *b, int v, int loss) {
  v = root_of(b, v);
  if (v > loss) return "dy";
  if (b->nodes[v].op == IR_OP_STATE) {
    const IrState *s = &m->states.a[b->nodes[v].ia[0]];
    if (s->kind == IR_STATE_COPY || s->kind == IR_STATE_PARAM) return "w";
  }
  return "x";
}

int pass_fp8(IrModule *m, PassCtx *cx) {
  if (cx->fp8 == PASS_FP8_NONE) return 0;
  const char *fmtname = cx->fp8 == PASS_FP8_HYBRID ? "hybrid" : "e4m3";
  if (m->train.lowp != IR_BF16)
    return ts_errf(cx->err, sizeof cx->err, "--fp8 %s quantizes the GEMMs of a bf16 model (Megatron: --fp8-format "
                   "with --bf16), but this module trains in %s: add --precision bf16", fmtname,
                   ir_dtype_name(m->train.lowp != IR_VOID ? m->train.lowp : m->train.precision));
  if (cx->fp8_history < 1 || cx->fp8_history > 1000000)
    return ts_errf(cx->err, sizeof cx->err, "--fp8-amax-history-len %lld: must be 1 to 1000000",   /* internal */
                   (long long)cx->fp8_history);
  if (!(cx->fp8_margin >= 0) || !(cx->fp8_margin < 64))
    return ts_errf(cx->err, sizeof cx->err, "--fp8-margin %g: must be >= 0 and < 64 (scale = fp8_max / amax / "   /* internal */
                   "2^margin)", cx->fp8_margin);
  int mb = ir_block_find(m, "micro");
  if (mb < 0) return ts_errf(cx->err, sizeof cx->err, "--fp8: the module has no block \"micro\" (nothing trains)");   /* internal */
  IrBlock old = m->blocks.a[mb];
  int n = old.n, loss = -1;
  for (int i = 0; i < n && loss < 0; i++)
    if (old.nodes[i].op == IR_OP_OUTPUT && old.nodes[i].sa && !strcmp(old.nodes[i].sa, "loss")) loss = i;
  if (loss < 0) return ts_errf(cx->err, sizeof cx->err, "--fp8: block micro has no output \"loss\"");   /* internal */
  /* the layers: units of the forward, by the repeat stacks */
  int *unit = arena_alloc(&cx->scratch, (size_t)(n + 1) * sizeof *unit);
  int nl = 0;
  char uerr[512];
  PipeStacks st;
  memset(&st, 0, sizeof st);
  if (pass_layer_units(m, &old, loss + 1, unit, NULL, &nl, uerr, sizeof uerr) != 0 ||
      pass_layer_stacks(m, &st, uerr, sizeof uerr) != 0) {
    pass_layer_stacks_free(&st);
    return ts_errf(cx->err, sizeof cx->err, "--fp8 %s quantizes the GEMMs of the model's repeat-stack layers, and "
                   "this model has none (no parameter named <stack>.<i>.<name>): write its layers as `repeat N { ... "
                   "}` (docs/mdl.md), or drop --fp8", fmtname);
  }
  unsigned char *chosen = arena_alloc(&cx->scratch, (size_t)nl + 2);
  int *stack_of = arena_alloc(&cx->scratch, ((size_t)nl + 2) * sizeof *stack_of);
  memset(chosen, 0, (size_t)nl + 2);
  for (int k = 0; k < st.n; k++)
    for (int u = st.begin[k] + 1; u <= st.begin[k + 1]; u++) {
      stack_of[u] = k;
      chosen[u] = cx->fp8_all_layers || (u != st.begin[k] + 1 && u != st.begin[k + 1]);
    }
  /* the matmuls: forward ones of chosen layers, backward ones reading their operands */
  unsigned char *sel = arena_alloc(&cx->scratch, (size_t)n + 1), *opf = arena_alloc(&cx->scratch, (size_t)n + 1);
  int *layer = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *layer);
  memset(sel, 0, (size_t)n + 1);
  memset(opf, 0, (size_t)n + 1);
  int nsel = 0;
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &old.nodes[i];
    layer[i] = -1;
    if (nd->op != IR_OP_MATMUL || nd->nin != 2) continue;
    int ok = 1;
    for (int k = 0; k < 2; k++) {
      const IrNode *o = &old.nodes[nd->in[k]];
      ok &= o->type.dtype == IR_BF16 && !o->sh.partial;
    }
    if (!ok) continue;
    if (i < loss) {
      if (unit[i] < 1 || unit[i] > nl || !chosen[unit[i]]) continue;
      layer[i] = unit[i];
      for (int k = 0; k < 2; k++) opf[nd->in[k]] = opf[root_of(&old, nd->in[k])] = (unsigned char)unit[i];
    } else {
      /* dX = dY W^T, dW = X^T dY: an operand (through reshapes) of a chosen forward GEMM */
      for (int k = 0; k < 2; k++) {
        int r = root_of(&old, nd->in[k]);
        if (r < loss && opf[r]) layer[i] = opf[r];
      }
      if (layer[i] < 0) continue;
    }
    sel[i] = 1;
    nsel++;
  }
  if (!nsel) {
    pass_layer_stacks_free(&st);
    return ts_errf(cx->err, sizeof cx->err, "--fp8 %s: no GEMM to quantize: %s%s", fmtname,
                   nl <= 2 && !cx->fp8_all_layers ? "the first and last layer of each repeat stack stay bf16 "
                   "(Megatron's --first-last-layers-bf16) and the stack has " : "the chosen layers have no bf16 "
                   "matmul", nl <= 2 && !cx->fp8_all_layers ? (nl == 1 ? "1 layer: use --fp8-all-layers" :
                   "2 layers: use --fp8-all-layers") : "");
  }
  /* the rewrite into a fresh block */
  m->blocks.a[mb] = (IrBlock){.name = old.name};
  Fx x = {.m = m, .cx = cx, .bi = mb, .old = &old};
  x.nv = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *x.nv);
  x.q4 = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *x.q4);
  x.q5 = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *x.q5);
  x.sinv4 = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *x.sinv4);
  x.sinv5 = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *x.sinv5);
  for (int i = 0; i <= n; i++) x.q4[i] = x.q5[i] = -1;
  int *count = arena_alloc(&cx->scratch, ((size_t)nl + 2) * 3 * sizeof *count);
  memset(count, 0, ((size_t)nl + 2) * 3 * sizeof *count);
  int ops[64];
  for (int i = 0; i < n && !x.failed; i++) {
    IrNode nd = old.nodes[i];
    int *in = nd.nin <= 64 ? ops : arena_alloc(&cx->scratch, (size_t)nd.nin * sizeof *in);
    for (int k = 0; k < nd.nin; k++) in[k] = x.nv[nd.in[k]];
    int id;
    if (sel[i]) {
      int q[4];
      for (int k = 0; k < 2; k++) {
        int v = nd.in[k];
        const char *role = role_of(m, &old, v, loss);
        IrDtype fmt = root_of(&old, v) > loss && cx->fp8 == PASS_FP8_HYBRID ? IR_F8E5M2 : IR_F8E4M3;
        int *cache = fmt == IR_F8E4M3 ? x.q4 : x.q5;
        char base[512] = "";
        if (cache[v] < 0) {
          int u = layer[i], r = role[0] == 'w' ? 0 : role[0] == 'x' ? 1 : 2;
          snprintf(base, sizeof base, "fp8.%s.%d.%s%d", st.name[stack_of[u]], u - 1 - st.begin[stack_of[u]], role,
                   count[u * 3 + r]);
          /* a reshape chain to an already quantized root takes no new name */
          if (cache[root_of(&old, v)] < 0) count[u * 3 + r]++;
        }
        q[k] = fp8_of(&x, v, fmt, base, nd.stage, &q[2 + k]);
        if (q[k] < 0) break;
      }
      if (x.failed) break;
      for (int k = 2; k < 4; k++) {
        int64_t ia[1] = {q[k]};
        q[k] = emit(&x, IR_OP_STATE, NULL, 0, ia, &m->states.a[q[k]].type, NULL, nd.stage);
        if (q[k] < 0) break;
      }
      if (x.failed) break;
      id = emit(&x, IR_OP_MATMUL8, q, 4, nd.ia, &nd.type, &nd.sh, nd.stage);
      if (id >= 0) m->blocks.a[mb].nodes[id].why = ts_intern("fp8 GEMM: the fp8 products summed in f32, times the "
                                                              "operands' scale_inv (cuBLASLt's A/B scale pointers)");
    } else {
      char msg[512];
      id = ir_emit(m, mb, nd.op, in, nd.nin, nd.ia, nd.fa, nd.sa, ir_op_given_type(nd.op, &nd.type), msg, sizeof msg);
      if (id < 0) {
        ts_errf(cx->err, sizeof cx->err, "fp8: node %d (%s): %s", i, ir_ops[nd.op].name, msg);
        x.failed = 1;
        break;
      }
      IrNode *o = &m->blocks.a[mb].nodes[id];
      o->sh = nd.sh;
      o->group = nd.group;
      o->stage = nd.stage;
      o->why = nd.why;
    }
    if (id < 0) break;
    x.nv[i] = id;
  }
  pass_layer_stacks_free(&st);
  if (x.failed) {
    m->blocks.a[mb] = old;
    return -1;
  }
  return 0;
}

/* The scale update of every fp8 tensor (found by its quant8's scale state
 * in block micro, or with pp in the chunk blocks fwd / bwd / wgt.<g>) at
 * the end of the update block of the rank quantizing it: "update", or in
 * a whole-model pipeline module "update.<g % pp>" for chunk g.  A tensor
 * belongs to one layer, so to one chunk and one pipeline rank. */
int fp8_update_ops(IrModule *m, PassCtx *cx) {
  int pp = ir_axis_size(m, IR_AXIS_PP), whole = pp > 1 && m->par.stage == 0;
  int ns = m->states.n;
  int *owner = arena_alloc(&cx->scratch, ((size_t)ns + 1) * sizeof *owner);
  int *order = arena_alloc(&cx->scratch, ((size_t)ns + 1) * sizeof *order);
  IrDtype *fmt = arena_alloc(&cx->scratch, ((size_t)ns + 1) * sizeof *fmt);
  int nq = 0;
  for (int s = 0; s < ns; s++) owner[s] = -1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind), r;
    if (b->name && !strcmp(b->name, "micro")) r = 0;
    else if (g >= 0 && kind != IR_CHUNK_EVAL) r = whole ? g % pp : 0;
    else continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *q = &b->nodes[i];
      if (q->op != IR_OP_QUANT8 || b->nodes[q->in[1]].op != IR_OP_STATE) continue;
      int scale = (int)b->nodes[q->in[1]].ia[0];
      if (scale < 0 || scale >= ns) continue;
      if (owner[scale] < 0) {
        owner[scale] = r;
        fmt[scale] = q->type.dtype;
        order[nq++] = scale;
      } else if (owner[scale] != r) {
        return ts_errf(cx->err, sizeof cx->err, "internal error: fp8: @%s is quantized on pipeline ranks %d and %d "   /* internal */
                       "(a tensor's scale belongs to the rank of its layer)", m->states.a[scale].name, owner[scale], r);
      }
    }
  }
  for (int k = 0; k < nq; k++) {
    int scale = order[k];
    char uname[32];
    if (whole) snprintf(uname, sizeof uname, "update.%d", owner[scale]);
    else snprintf(uname, sizeof uname, "update");
    int ub = ir_block_find(m, uname);
    if (ub < 0)
      return ts_errf(cx->err, sizeof cx->err, "internal error: fp8: no block \"%s\" for @%s's scale update", uname,   /* internal */
                     m->states.a[scale].name);
    double fmax = fmt[scale] == IR_F8E5M2 ? FP8_E5M2_MAX : FP8_E4M3_MAX;
    const char *sname = m->states.a[scale].name;
    size_t bl = strlen(sname) - strlen(".scale");
    char base[512];
    snprintf(base, sizeof base, "%.*s", (int)bl, sname);
    int amax = fp8_state(m, base, "amax", 0, 0), hist = fp8_state(m, base, "amax_history", cx->fp8_history, 0);
    int sinv = fp8_state(m, base, "scale_inv", 0, 1);
    char msg[512];
    int64_t ia[4] = {amax};
    int a = ir_emit(m, ub, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &m->states.a[amax].type, msg, sizeof msg);
    for (int ax = 0; a >= 0 && ax < IR_AXIS_COUNT; ax++) {
      if (ax == IR_AXIS_PP || ir_axis_size(m, (IrAxis)ax) <= 1) continue;
      int64_t ra[2] = {ax, 1};
      a = ir_emit(m, ub, IR_OP_ALL_REDUCE, &a, 1, ra, NULL, NULL, NULL, msg, sizeof msg);
      if (a >= 0) m->blocks.a[ub].nodes[a].why = ts_intern("fp8 delayed scaling: the amax of a tensor is the max "
                                                           "over the ranks sharing it (TE: the dp x tp group), so "
                                                           "every rank computes the same scale");
    }
    int64_t fa_i[4] = {hist, scale, sinv, cx->fp8_algo};
    double fa[2] = {cx->fp8_margin, fmax};
    int64_t za[1] = {amax};
    if (a < 0 || ir_emit(m, ub, IR_OP_FP8_SCALE, &a, 1, fa_i, fa, NULL, NULL, msg, sizeof msg) < 0 ||
        ir_emit(m, ub, IR_OP_ZERO, NULL, 0, za, NULL, NULL, NULL, msg, sizeof msg) < 0)
      return ts_errf(cx->err, sizeof cx->err, "fp8: the scale update of @%s: %s", sname, msg);   /* internal */
  }
  return 0;
}
