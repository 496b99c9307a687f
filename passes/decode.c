/* decode.c - pass "decode": the generation program, derived from the
 * model's own forward (block "eval", pass eval's slice of the training
 * step), so that every model, layout and op the forward has is the one
 * generation runs -- nothing here knows GPT or Llama.
 *
 * Expects: a module after pass eval, with block "eval" (no pp), the model
 *   input "tokens" i32 [batch, seq] (dims named: the names say which dims
 *   of every other value are the batch and the sequence) and a cross
 *   entropy of the input "targets" (its first operand is the logits; under
 *   a vocabulary split over tp, pass shard's take of them).  cp = 1 and no
 *   sequence parallelism (one token cannot be split along the sequence).
 *   Runs only when cx->decode is set (mcc --decode; mrun --generate runs it
 *   on a plan that lacks the blocks).
 * Guarantees: blocks "prefill" and "step" (replacing old ones) and states
 *   of kind cache (created once, shared by both):
 *     cache.<n>.k / cache.<n>.v  [1, kv_heads, seq, head_dim] (local shape,
 *                                sharded as the forward's k): the keys and
 *                                values of the n-th attention, by position;
 *     decode.logits              [1, 1, vocab] (global: gathered over tp):
 *                                the next token's logits.
 *   prefill (inputs "tokens" i32 [1, seq] and "last" i32 []): the forward
 *     over a whole window at batch 1, exactly the eval block's nodes
 *     (attention, rope, positions at 0 .. seq-1); after each attention the
 *     window's k and v are written to its cache at position 0; the logits
 *     of position `last` are assigned to decode.logits.
 *   step (inputs "tokens" i32 [1, 1] and "pos" i32 []): the same forward for
 *     ONE token at position pos: every value's seq dim is 1; a state with a
 *     seq dim (a learned position table) is read at pos (slice_at); rope
 *     becomes rope_at (positions from pos); each attention writes its k and
 *     v at pos (kv_write) and attends over the cache's keys 0 .. pos
 *     (attn_cached).  Its logits are assigned to decode.logits.
 *   A node the rewrite cannot express (attention in the composed form, a
 *   causal mask, document ids, an input other than tokens) is refused with
 *   a message naming it: decoding is never silently wrong.
 * Why from "eval" rather than "forward": the eval block is already each
 *   rank's local program (tp splits, collectives, vocab-parallel head), so
 *   the decode blocks inherit every layout the training step has. */
#include "passes.h"

typedef struct {
  IrModule *m;
  PassCtx *cx;
  int src, dst;              /* block indices: eval, the block being built */
  const char *bname, *sname; /* the tokens input's dim names */
  int64_t B, T, Tq;          /* batch and window of eval; the tokens per run of this block */
  int step;                  /* building step (else prefill) */
  int *map;                  /* eval node -> node of dst */
  const unsigned char *fixed; /* eval node -> made from states alone (no input): a parameter, or one
                               gathered from its ZeRO-3 shard */
  int pos;                   /* dst's position value */
  int natt;                  /* attentions seen */
  int failed;
} Dx;

static int dfail(Dx *d, int i, const char *fmt, const char *what) {
  if (!d->failed)
    snprintf(d->cx->err, sizeof d->cx->err, "decode: %%%d (%s) of block eval: %s%s", i,
             ir_ops[d->m->blocks.a[d->src].nodes[i].op].name, fmt, what ? what : "");
  d->failed = 1;
  return -1;
}

static int em(Dx *d, int at, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa, const char *sa,
              const IrType *type, const IrSharding *sh) {
  if (d->failed) return -1;
  char err[600];
  /* a 16-bit operand (--precision bf16: docs/precision.md) reaches an op
   * that computes through a cast to the arithmetic dtype, as pass
   * precision gives the eval block's ops theirs */
  int cin[8];
  if (nin <= 8 && in) {
    for (int k = 0; k < nin; k++) {
      const IrNode *x = &d->m->blocks.a[d->dst].nodes[in[k]];
      cin[k] = in[k];
      if (!ir_dtype_is_16(x->type.dtype) || ir_op_reads_16(op)) continue;
      IrType t = x->type;
      t.dtype = d->m->train.precision;
      IrSharding xsh = x->sh;
      int c = ir_emit(d->m, d->dst, IR_OP_CAST, &in[k], 1, NULL, NULL, NULL, &t, err, sizeof err);
      if (c < 0) break;
      d->m->blocks.a[d->dst].nodes[c].sh = xsh;
      cin[k] = c;
    }
    in = cin;
  }
  int id = ir_emit(d->m, d->dst, op, in, nin, ia, fa, sa, type, err, sizeof err);
  if (id < 0) {
    snprintf(d->cx->err, sizeof d->cx->err, "decode: %%%d of block eval at %lld token(s) per run: %s (is every "
             "sequence dim named '%s'?)", at, (long long)d->Tq, err, d->sname);
    d->failed = 1;
    return -1;
  }
  if (sh) d->m->blocks.a[d->dst].nodes[id].sh = *sh;
  return id;
}

/* t with the batch dim at 1 and the sequence dim at Tq. */
static IrType subst(const Dx *d, IrType t) {
  for (int k = 0; k < t.rank; k++) {
    if (t.dname[k] == d->sname && t.dim[k] == d->T) t.dim[k] = d->Tq;
    else if (t.dname[k] == d->bname && t.dim[k] == d->B) t.dim[k] = 1;
  }
  return t;
}

/* The cache state for the n-th attention's k (kv = 'k') or v, shaped like
 * eval's k at batch 1. */
static int cache_state(Dx *d, int n, char kv, const IrNode *k) {
  char name[64];
  snprintf(name, sizeof name, "cache.%d.%c", n, kv);
  int s = ir_state_find(d->m, name);
  if (s >= 0) return s;
  IrState st = {0};
  st.name = ts_intern(name);
  st.kind = IR_STATE_CACHE;
  st.of = -1;
  st.type = k->type;
  for (int r = 0; r < st.type.rank; r++)
    if (st.type.dname[r] == d->bname && st.type.dim[r] == d->B) st.type.dim[r] = 1;
  st.sh = k->sh;
  return ir_state_add(d->m, &st);
}

/* One attention node i of eval (q, k, v already mapped). */
static int attention(Dx *d, int i, const IrNode *n) {
  int sl = ir_attn_slope(n);   /* ALiBi: the slopes ride along (attn_cached's fifth operand) */
  if (ir_attn_doc(n) >= 0) return dfail(d, i, "attention with document ids (packed sequences) cannot be decoded", NULL);
  if (!n->ia[0]) return dfail(d, i, "non-causal attention cannot be decoded (a token would see later ones)", NULL);
  if (ir_attn_bias(n) >= 0)   /* [H, Tq, Tk] by local rows: the cached query's row would need its own slice */
    return dfail(d, i, "attention with a score bias (nn.attention's score_bias:, e.g. T5's relative-position "
                 "buckets) cannot be decoded yet: attn_cached has no bias operand (train and evaluate it without "
                 "--decode)", NULL);
  const IrNode *src = d->m->blocks.a[d->src].nodes;
  int q = d->map[n->in[0]], k = d->map[n->in[1]], v = d->map[n->in[2]];
  int a = d->natt++;
  int ks = cache_state(d, a, 'k', &src[n->in[1]]), vs = cache_state(d, a, 'v', &src[n->in[2]]);
  int64_t wk[2] = {ks, 2}, wv[2] = {vs, 2};
  em(d, i, IR_OP_KV_WRITE, (int[]){k, d->pos}, 2, wk, NULL, NULL, NULL, NULL);
  em(d, i, IR_OP_KV_WRITE, (int[]){v, d->pos}, 2, wv, NULL, NULL, NULL, NULL);
  int slopes = sl >= 0 ? d->map[n->in[sl]] : -1;
  if (!d->step) return em(d, i, n->op, (int[]){q, k, v, slopes}, sl >= 0 ? 4 : 3, n->ia, n->fa, n->sa, NULL, &n->sh);
  int64_t s0[1] = {ks}, s1[1] = {vs};
  const IrState *K = &d->m->states.a[ks], *V = &d->m->states.a[vs];
  IrType kt = K->type, vt = V->type;
  IrSharding ksh = K->sh, vsh = V->sh;
  int kc = em(d, i, IR_OP_STATE, NULL, 0, s0, NULL, NULL, &kt, &ksh);
  int vc = em(d, i, IR_OP_STATE, NULL, 0, s1, NULL, NULL, &vt, &vsh);
  int64_t ia[1] = {ir_attn_window(n)};
  return em(d, i, IR_OP_ATTN_CACHED, (int[]){q, kc, vc, d->pos, slopes}, sl >= 0 ? 5 : 4, ia, n->fa, NULL, NULL,
            &n->sh);
}

/* How many dims of t are the sequence at the window's length. */
static int has_seq(const Dx *d, const IrType *t) {
  int n = 0;
  for (int k = 0; k < t->rank; k++) n += t->dname[k] == d->sname && t->dim[k] == d->T;
  return n;
}

/* v, a table by position made from states alone (type t: a learned
 * position table), at this token's row along its sequence dims. */
static int at_pos(Dx *d, int i, int v, const IrType *t, const IrSharding *sh) {
  for (int k = 0; k < t->rank && d->Tq != d->T; k++)
    if (t->dname[k] == d->sname && t->dim[k] == d->T) {
      int64_t ia[2] = {k, d->Tq};
      v = em(d, i, IR_OP_SLICE_AT, (int[]){v, d->pos}, 2, ia, NULL, NULL, NULL, sh);
    }
  return v;
}

/* Node i of eval into dst; d->map[i] its value (-1 for none). */
static int one(Dx *d, int i) {
  const IrNode *n = &d->m->blocks.a[d->src].nodes[i];
  IrNode c = *n;   /* the block array moves as dst grows: a copy */
  int in[64];
  if (c.nin > 64) return dfail(d, i, "more than 64 operands", NULL);
  for (int k = 0; k < c.nin; k++) in[k] = d->map[c.in[k]];
  IrType t = subst(d, c.type);
  if (d->fixed[i] && c.op != IR_OP_STATE && c.op != IR_OP_ARANGE && c.op != IR_OP_RAND && has_seq(d, &c.type) == 1) {
    /* the first value of a chain from states alone with the sequence dim
     * (ZeRO-3: a position table gathered from its shard, reshaped to
     * [seq, ...]): whole, then this token's row, as a state read is (a
     * value with two such dims, queries by keys, is not a table by
     * position: it goes the ordinary way) */
    int first = 1;
    for (int k = 0; k < c.nin; k++) first &= !has_seq(d, &d->m->blocks.a[d->src].nodes[c.in[k]].type);
    if (first) {
      IrType w = c.type;   /* batch 1, the whole window */
      for (int k = 0; k < w.rank; k++)
        if (w.dname[k] == d->bname && w.dim[k] == d->B) w.dim[k] = 1;
      return at_pos(d, i, em(d, i, c.op, in, c.nin, c.ia, c.fa, c.sa, ir_op_given_type(c.op, &w), &c.sh), &w, &c.sh);
    }
  }
  switch (c.op) {
  case IR_OP_INPUT:
    if (!c.sa || strcmp(c.sa, "tokens") != 0)
      return dfail(d, i, "generation feeds only the input \"tokens\"; the model also reads input ", c.sa);
    return em(d, i, c.op, NULL, 0, NULL, NULL, c.sa, &t, &c.sh);
  case IR_OP_STATE:   /* a table by position: this token's row */
    return at_pos(d, i, em(d, i, c.op, NULL, 0, c.ia, NULL, NULL, &c.type, &c.sh), &c.type, &c.sh);
  case IR_OP_ATTENTION:
    return attention(d, i, &c);
  case IR_OP_ROPE:
    if (!d->step) break;
    return em(d, i, IR_OP_ROPE_AT, (int[]){in[0], d->pos}, 2, c.ia, c.fa, NULL, NULL, &c.sh);
  case IR_OP_CAUSAL_MASK:
    return dfail(d, i, "attention in the composed form (matmul, causal_mask, softmax) cannot read a KV cache: "
                 "generation needs nn.attention's fused form (fused: true, dropout 0)", NULL);
  case IR_OP_ARANGE: case IR_OP_RAND:
    for (int k = 0; k < c.type.rank; k++)
      if (c.type.dname[k] == d->sname && d->step)
        return dfail(d, i, "a value made from positions along the sequence cannot be decoded one token at a time", NULL);
    break;
  default:
    if (ir_ops[c.op].flags & OPF_EFFECT) return -1;   /* not in the slice */
    break;
  }
  return em(d, i, c.op, in, c.nin, c.ia, c.fa, c.sa, ir_op_given_type(c.op, &t), &c.sh);
}

/* Builds block `name` from eval's nodes live[] keeps, ending in the logits
 * (node L of eval) assigned to decode.logits. */
static int build(Dx *d, const char *name, const unsigned char *live, int L) {
  int nsrc = d->m->blocks.a[d->src].n;
  d->dst = ir_block_add(d->m, name);
  d->natt = 0;
  for (int i = 0; i < nsrc; i++) d->map[i] = -1;
  IrType it = {.dtype = IR_I32};
  if (d->step) {
    d->pos = em(d, -1, IR_OP_INPUT, NULL, 0, NULL, NULL, "pos", &it, NULL);
  } else {
    double zero = 0;
    d->pos = em(d, -1, IR_OP_FULL, NULL, 0, NULL, &zero, NULL, &it, NULL);
  }
  for (int i = 0; i < nsrc && !d->failed; i++)
    if (live[i]) d->map[i] = one(d, i);
  if (d->failed) return -1;
  IrNode ln = d->m->blocks.a[d->src].nodes[L];
  int x = d->map[L], last = ln.type.rank - 1;
  IrSharding sh = ln.sh;
  if (!d->step) {   /* the logits of position `last` */
    int li = em(d, L, IR_OP_INPUT, NULL, 0, NULL, NULL, "last", &it, NULL);
    int64_t ia[2] = {1, 1};
    x = em(d, L, IR_OP_SLICE_AT, (int[]){x, li}, 2, ia, NULL, NULL, NULL, &sh);
  }
  for (int a = 0; a < IR_AXIS_COUNT; a++) {   /* the whole vocabulary on every rank */
    if (sh.partial & (1u << a)) {
      int64_t ar[2] = {a, 0};
      sh.partial &= (uint8_t)~(1u << a);
      x = em(d, L, IR_OP_ALL_REDUCE, &x, 1, ar, NULL, NULL, NULL, &sh);
    }
    if (sh.split[last] & (1u << a)) {
      int64_t ag[2] = {a, last};
      sh.split[last] &= (uint8_t)~(1u << a);
      x = em(d, L, IR_OP_ALL_GATHER, &x, 1, ag, NULL, NULL, NULL, &sh);
    }
  }
  if (d->failed) return -1;
  int ls = ir_state_find(d->m, "decode.logits");
  const IrType *xt = &d->m->blocks.a[d->dst].nodes[x].type;
  if (ls < 0) {
    IrState st = {0};
    st.name = ts_intern("decode.logits");
    st.kind = IR_STATE_CACHE;
    st.of = -1;
    st.type = *xt;
    ls = ir_state_add(d->m, &st);
  }
  int64_t sa[1] = {ls};
  em(d, L, IR_OP_ASSIGN, &x, 1, sa, NULL, NULL, NULL, NULL);
  return d->failed ? -1 : 0;
}

static int drop_decode(const IrBlock *b) { return strcmp(b->name, "prefill") == 0 || strcmp(b->name, "step") == 0; }

int pass_decode_layout(const IrModule *m, char *err, size_t errlen) {
  if (ir_axis_size(m, IR_AXIS_PP) > 1 || ir_axis_size(m, IR_AXIS_CP) > 1 || m->par.sp)
    return ts_errf(err, errlen, "decode: generation needs a layout without pp, cp and sequence "
                   "parallelism (this one: pp=%d cp=%d sp=%d); tp and dp are fine", ir_axis_size(m, IR_AXIS_PP),
                   ir_axis_size(m, IR_AXIS_CP), m->par.sp);
  return 0;
}

int pass_decode(IrModule *m, PassCtx *cx) {
  if (!cx->decode) return 0;
  if (pass_decode_layout(m, cx->err, sizeof cx->err) != 0) return -1;
  int nb = 0;
  for (int bi = 0; bi < m->blocks.n; bi++)
    if (!drop_decode(&m->blocks.a[bi])) m->blocks.a[nb++] = m->blocks.a[bi];
  m->blocks.n = nb;
  Dx d = {.m = m, .cx = cx, .src = ir_block_find(m, "eval")};
  if (d.src < 0) return ts_errf(cx->err, sizeof cx->err, "decode: the module has no block \"eval\" (pass eval's forward)");  /* internal */
  const IrBlock *e = &m->blocks.a[d.src];
  int n = e->n, tok = -1, tgt = -1, L = -1;
  for (int i = 0; i < n; i++) {
    const IrNode *x = &e->nodes[i];
    if (x->op == IR_OP_INPUT && x->sa && strcmp(x->sa, "tokens") == 0) tok = i;
    if (x->op == IR_OP_INPUT && x->sa && strcmp(x->sa, "targets") == 0) tgt = i;
    if (L < 0 && tgt >= 0 && (x->op == IR_OP_CROSS_ENTROPY || x->op == IR_OP_TAKE) && x->nin >= 2 && x->in[1] == tgt)
      L = x->in[0];
  }
  if (tok < 0 || e->nodes[tok].type.rank != 2 || e->nodes[tok].type.dtype != IR_I32)
    return ts_errf(cx->err, sizeof cx->err, "decode: the model has no input \"tokens\" i32 [batch, seq]");
  const IrType *tt = &e->nodes[tok].type;
  if (!tt->dname[0] || !tt->dname[1] || tt->dname[0] == tt->dname[1])
    return ts_errf(cx->err, sizeof cx->err, "decode: the input \"tokens\" must name its dims (e.g. tokens: i32[batch=..., "
                   "seq=...]): the names say which dim of every value is the sequence");
  if (L < 0)
    return ts_errf(cx->err, sizeof cx->err, "decode: no cross_entropy of the input \"targets\": generation needs a "
                   "language model whose loss is the cross entropy of its logits");
  d.bname = tt->dname[0];
  d.sname = tt->dname[1];
  d.B = tt->dim[0];
  d.T = tt->dim[1];
  const IrType *lt = &e->nodes[L].type;
  if (lt->rank != 3 || lt->dim[0] != d.B || lt->dim[1] != d.T) {
    char lb[256], tb[256];
    return ts_errf(cx->err, sizeof cx->err, "decode: the logits that cross_entropy reads with \"targets\" are %s, "
                   "not [%s, %s, vocab] with the dims of \"tokens\" %s: generation needs one row of logits per "
                   "token of the input", ir_type_str(lt, lb, sizeof lb), d.bname, d.sname,
                   ir_type_str(tt, tb, sizeof tb));
  }
  /* the slice: what the logits need */
  unsigned char *live = arena_alloc(&cx->scratch, (size_t)n);
  memset(live, 0, (size_t)n);
  live[L] = 1;
  for (int i = n - 1; i >= 0; i--)
    if (live[i])
      for (int k = 0; k < e->nodes[i].nin; k++) live[e->nodes[i].in[k]] = 1;
  live[tok] = 1;
  d.map = arena_alloc(&cx->scratch, (size_t)n * sizeof *d.map);
  unsigned char *fixed = arena_alloc(&cx->scratch, (size_t)n);
  for (int i = 0; i < n; i++) {
    fixed[i] = e->nodes[i].op != IR_OP_INPUT && e->nodes[i].op != IR_OP_RAND;
    for (int k = 0; k < e->nodes[i].nin; k++) fixed[i] &= fixed[e->nodes[i].in[k]];
  }
  d.fixed = fixed;
  d.Tq = d.T;
  if (build(&d, "prefill", live, L) != 0) return -1;
  d.step = 1;
  d.Tq = 1;
  d.failed = 0;
  return build(&d, "step", live, L);
}
