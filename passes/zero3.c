/* zero3.c - pass "zero3": ZeRO-3 / FSDP (mcc --zero 3).  Every parameter
 * is held only as its rank's 1/dp flat chunk, gathered over dp just before
 * use, and every gradient is reduce-scattered over dp into the rank's chunk
 * of its accumulator in each micro batch: parameters, gradients and Adam
 * moments are all 1/dp per rank (16/dp bytes per parameter in f32, against
 * ZeRO-1's 4 + 4 + 8/dp).
 *
 * Expects: the training blocks, no update block yet: with pp = 1 block
 *   "micro" (autodiff's forward, backward and accumulation, after shard,
 *   precision and remat) whose forward ends at `output "loss"`; with pp > 1
 *   the chunk blocks of passes pipeline and wsplit, fwd.<g> (forward),
 *   bwd.<g> and wgt.<g> (backward).  Runs only when m->par.zero == 3 and
 *   dp > 1; otherwise the module is unchanged.  With --decode, pass eval's
 *   block (the forward's copy, gathers included) gives pass decode its
 *   prefill and step, so generation gathers each parameter as the forward
 *   does.  With cp or ep the shards are over dp only: a gradient chunk
 *   partial over cp (ep) after the reduce-scatter is summed over that axis
 *   by the update block, as a whole gradient is without ZeRO-3
 *   (docs/sharding.md).
 * Pipelines: zero3 runs after pass pipeline and rebuilds each chunk block
 *   on its own, exactly as it rebuilds micro (a chunk block is a piece of
 *   micro: its reads and accums are micro's, cut by stage): fwd.<g>'s
 *   parameter reads get the forward gathers, bwd.<g>'s (wgt.<g>'s) the
 *   backward gathers, placed one layer ahead within the block, and their
 *   accums the reduce-scatters.  The gathers are over dp only, so they
 *   never cross a stage: each gather sits in the block that reads it and
 *   pipeline_rank.c, keeping the states its blocks name, gives every
 *   pipeline rank the shards of its own chunks' parameters only (1/dp of
 *   its stage's parameters; a tied embedding read by the first and the
 *   last stage has a shard on both, its chunk gradients summed over pp by
 *   the update's group_sum like whole ones).  Running zero3 before pass
 *   pipeline instead would leave pipesplit to place gathers, stash
 *   gathered parameters between a chunk's forward and backward, or send
 *   them between stages; after it nothing of the pipeline changes.
 * Guarantees: for every parameter P the training blocks read,
 *   - a state "shard.P" (kind shard, of = P) of type [c] {flat:dp},
 *     c = ceil(numel(P's local type) / dp): the rank's chunk of P's local
 *     tensor (over the other axes, e.g. its tp block) flattened and
 *     zero-padded, exactly the layout of ZeRO-1's moments; P keeps its
 *     description (type, layout, init) and is marked `sharded`: it holds
 *     no memory and no block reads it;
 *   - P's reads in micro are replaced by a gather: state @shard.P ->
 *     all_gather over dp -> slice [0, n) -> reshape to P's local type,
 *     ONCE for the forward's reads (before the loss) and AGAIN for the
 *     backward's (after it), so the gathered copy dies at the forward's last
 *     read and the backward gathers it anew (the memory planner gives each
 *     copy the lifetime of its reads);
 *   - placement, one layer ahead: a layer is the group of parameters of one
 *     index of a repeat stack (names <stack>.<i>.*, as the frontend names
 *     unrolled layers; pass_layer_units' rule); any other parameter is a
 *     group of its own.  Per phase (forward, backward), groups are ordered by
 *     their first read; the gathers of group k are emitted just before the
 *     first read of group k-1 (group 0's before its own), so the next
 *     layer's gathers are issued before this layer's compute and a device's
 *     comm stream overlaps them with it (collectives run there until first
 *     read, docs/cuda.md);
 *   - every `accum v @grad.P` becomes: v (rows accumulated apart gathered
 *     over their axis) -> reshape [n] -> pad [dp*c] -> reduce_scatter over
 *     dp -> accum into grad.P, now [c] {flat:dp} (plus any partial mark over
 *     another axis, reduced by the update block): the reduction happens in
 *     every micro batch, where the gradient is made, and the accumulator is
 *     1/dp;
 *   - 16-bit storage (--precision bf16 / fp16, Megatron-FSDP's way): pass
 *     precision made the reads of P reads of its 16-bit copy @bf16.P; the
 *     shard stays the f32 master chunk, the gather casts it to the copy's
 *     dtype BEFORE the all_gather (half the bytes of an f32 gather) and
 *     ends in the copy's type, so the GEMMs read it as they read the copy
 *     (matmul's mixed flag); the copy states of sharded parameters are
 *     removed (a whole 16-bit copy per rank is what ZeRO-3 does not hold).
 *     The gradient chain is unchanged: the accumulated values are f32 main
 *     grads, reduce-scattered in f32 as ZeRO-1's dp reduction sums them
 *     (docs/precision.md), into f32 chunks.  fp16's loss scaler (scaler.c)
 *     checks the rank's grad states, here the chunks, and takes the max
 *     over every axis, dp included: an inf in any summand makes its
 *     chunk's sum inf on the rank that holds it, and every rank skips;
 *   - m->par.zero stays 3: pass optimizer then builds AdamW on the shards
 *     (no dp collective for the gradients, no all-gather afterwards).
 * The training blocks now depend on dp (pass_respecialize_dp refuses to
 * change it, for a pipeline rank's program too).  Nothing here knows a model: only states, reads, accums. */
#include "passes.h"

#define DP_BIT (1u << IR_AXIS_DP)

typedef struct {
  IrModule *m;
  PassCtx *cx;
  int b;            /* the block being built */
  int failed;
} Z3;

static int z3_emit(Z3 *z, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa, const char *sa,
                   const IrType *type, const IrSharding *sh) {
  return pass_emit(z->m, z->cx, z->b, &z->failed, "zero3", op, in, nin, ia, fa, sa, type, sh);
}

static void z3_why(Z3 *z, int id, const char *fmt, const char *name) {
  if (z->failed || id < 0) return;
  char buf[512];
  snprintf(buf, sizeof buf, fmt, name);
  z->m->blocks.a[z->b].nodes[id].why = ts_intern(buf);
}

/* The layer key of a parameter name: up to and including its first
 * all-digit component ("layers.3" of "layers.3.attention.wq"), else the
 * whole name (a group of its own). */
static const char *layer_key(const char *name) {
  for (const char *p = name; *p;) {
    const char *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q > p && (*q == '.' || !*q) && p > name) return ts_intern_n(name, (size_t)(q - name));
    while (*q && *q != '.') q++;
    p = *q ? q + 1 : q;
  }
  return ts_intern(name);
}

/* Per sharded parameter (index by state): its chunk, shard state and the
 * first read of each phase. */
typedef struct {
  int shard;         /* its shard state, -1 when the micro block does not read it */
  int copy;          /* the 16-bit copy state (pass precision) micro reads it through, -1: read directly */
  int64_t n, c;
  int first[2];      /* first reading node (old ids), per phase (0 forward, 1 backward); -1 none */
  int at[2];         /* old id before which its gather of that phase is emitted */
  int val[2];        /* the gathered value (new id), per phase; -1 not yet */
} Z3Param;

/* Emits the gather of param p for phase ph into the new block. */
static void emit_gather(Z3 *z, int p, Z3Param *zp, int ph) {
  IrModule *m = z->m;
  const IrState *ps = &m->states.a[p], *ss = &m->states.a[zp->shard];
  IrSharding ch, none, psh = ps->sh;
  memset(&ch, 0, sizeof ch);
  memset(&none, 0, sizeof none);
  ch.split[0] = (uint8_t)DP_BIT;
  IrType st = ss->type;
  int64_t si[1] = {zp->shard}, ga[2] = {IR_AXIS_DP, 0};
  int x = z3_emit(z, IR_OP_STATE, NULL, 0, si, NULL, NULL, &st, &ch);
  IrType pt = zp->copy >= 0 ? m->states.a[zp->copy].type : ps->type;
  if (pt.dtype != st.dtype) {
    /* 16-bit storage: the f32 master chunk rounded to the copy's dtype
     * before the gather (half the bytes on the wire), as the runtime rounds
     * a whole master into its copy (runtime/cpu/half.h) */
    st.dtype = pt.dtype;
    x = z3_emit(z, IR_OP_CAST, &x, 1, NULL, NULL, NULL, &st, &ch);
  }
  x = z3_emit(z, IR_OP_ALL_GATHER, &x, 1, ga, NULL, NULL, NULL, &none);
  z3_why(z, x, ph == 0 ? "ZeRO-3: %s is gathered from the dp ranks' shards for the forward (one layer ahead), "
                         "released after its last forward read"
                       : "ZeRO-3: %s is gathered again for the backward (one layer ahead), not kept from the forward",
         ps->name);
  if (zp->c * ir_axis_size(m, IR_AXIS_DP) > zp->n) {
    int64_t sa[3] = {0, 0, zp->n};
    x = z3_emit(z, IR_OP_SLICE, &x, 1, sa, NULL, NULL, NULL, &none);
  }
  if (!z->failed && ir_type_equal(&m->blocks.a[z->b].nodes[x].type, &pt)) m->blocks.a[z->b].nodes[x].sh = psh;
  else x = z3_emit(z, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &pt, &psh);
  zp->val[ph] = x;
}

/* accum x @g (g the grad of sharded param ps, x the new block's value):
 * x reduce-scattered over dp into g's chunk.  gsh0: g's layout before this
 * pass (its rows split where the parameter is whole are gathered first). */
static void emit_reduce(Z3 *z, int x, int g, const IrSharding *gsh0, const Z3Param *zp, const IrState *ps) {
  IrModule *m = z->m;
  if (z->failed) return;
  IrSharding sh = m->blocks.a[z->b].nodes[x].sh;
  IrType t = m->blocks.a[z->b].nodes[x].type;
  /* rows the ranks accumulated apart (split where the parameter is whole,
   * e.g. a position embedding under sp): gathered first */
  for (int d = 0; d < t.rank && d < IR_MAX_RANK; d++)
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      if (!(gsh0->split[d] & ~ps->sh.split[d] & (1u << a))) continue;
      sh.split[d] &= (uint8_t)~(1u << a);
      int64_t ia[2] = {a, d};
      x = z3_emit(z, IR_OP_ALL_GATHER, &x, 1, ia, NULL, NULL, NULL, &sh);
      z3_why(z, x, "ZeRO-3: the rows of the gradient of %s the ranks made apart, gathered before its reduce-scatter",
             ps->name);
    }
  IrSharding pd;
  memset(&pd, 0, sizeof pd);
  pd.partial = (uint8_t)((sh.partial & ~DP_BIT) | DP_BIT);
  if (!z->failed && m->blocks.a[z->b].nodes[x].type.rank != 1) {
    IrType ft;
    memset(&ft, 0, sizeof ft);
    ft.dtype = t.dtype;
    ft.rank = 1;
    ft.dim[0] = zp->n;
    x = z3_emit(z, IR_OP_RESHAPE, &x, 1, NULL, NULL, NULL, &ft, &pd);
  }
  int dp = ir_axis_size(m, IR_AXIS_DP);
  if (zp->c * dp > zp->n) {
    int64_t ia[3] = {0, 0, zp->c * dp - zp->n};
    x = z3_emit(z, IR_OP_PAD, &x, 1, ia, NULL, NULL, NULL, &pd);
  }
  if (!z->failed) {   /* what the reduce_scatter sums: partial over dp */
    IrSharding *xs = &m->blocks.a[z->b].nodes[x].sh;
    xs->partial |= (uint8_t)DP_BIT;
  }
  IrSharding out;
  memset(&out, 0, sizeof out);
  out.split[0] = (uint8_t)DP_BIT;
  out.partial = (uint8_t)(pd.partial & ~DP_BIT);
  int64_t ra[2] = {IR_AXIS_DP, 0};
  x = z3_emit(z, IR_OP_REDUCE_SCATTER, &x, 1, ra, NULL, NULL, NULL, &out);
  z3_why(z, x, "ZeRO-3: the gradient of %s is summed over the dp ranks in every micro batch, each rank keeping the "
         "chunk whose parameter shard and optimizer state it holds", ps->name);
  int64_t gi[1] = {g};
  z3_emit(z, IR_OP_ACCUM, &x, 1, gi, NULL, NULL, NULL, NULL);
}

/* What the pass shares between the blocks it rebuilds. */
typedef struct {
  IrModule *m;
  PassCtx *cx;
  Z3Param *zp;       /* by parameter state */
  int ns0;           /* states before the pass */
  int *gof;          /* grad state -> its sharded parameter, -1 */
  IrSharding *gsh0;  /* grad state -> its layout before the pass */
} Z3Pass;

/* The parameter node i of block b reads (directly, or through its 16-bit
 * copy of pass precision), -1 when it is no parameter read. */
static int param_read(const IrModule *m, const IrBlock *b, int i, int ns0) {
  const IrNode *nd = &b->nodes[i];
  if (nd->op != IR_OP_STATE) return -1;
  int s = (int)nd->ia[0];
  const IrState *st = &m->states.a[s];
  int p = st->kind == IR_STATE_PARAM ? s : st->kind == IR_STATE_COPY && st->of >= 0 && st->of < ns0 ? st->of : -1;
  return p >= 0 && m->states.a[p].kind == IR_STATE_PARAM ? p : -1;
}

/* Whether block bi is one zero3 rebuilds, and where its backward starts:
 * node i is in the backward when i > *L.  "micro" (pp = 1): after its
 * output "loss"; a pipeline chunk block (pass pipeline, wsplit): fwd.<g>
 * all forward, bwd.<g> and wgt.<g> all backward. */
static int training_block(const IrModule *m, int bi, int *L) {
  const IrBlock *b = &m->blocks.a[bi];
  IrChunkKind kind;
  if (ir_block_chunk_kind(b, &kind) >= 0) {
    if (kind == IR_CHUNK_EVAL) return 0;
    *L = kind == IR_CHUNK_FWD ? b->n : -1;
    return 1;
  }
  if (b->name != ts_intern("micro")) return 0;
  *L = -1;
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == ts_intern("loss")) *L = i;
  return *L >= 0 ? 1 : -1;
}

/* Rebuilds training block bi (backward after node L): each parameter read
 * replaced by its gather, placed one layer ahead per phase; each accum into
 * a sharded grad replaced by the reduce-scatter chain.  The new block takes
 * bi's name and place. */
static int rebuild_block(Z3Pass *zs, int bi, int L) {
  IrModule *m = zs->m;
  PassCtx *cx = zs->cx;
  Z3Param *zp = zs->zp;
  int ns0 = zs->ns0, n = m->blocks.a[bi].n;
  for (int p = 0; p < ns0; p++)
    for (int ph = 0; ph < 2; ph++) zp[p].first[ph] = zp[p].at[ph] = zp[p].val[ph] = -1;
  int *rd = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *rd);   /* old node -> param it reads, -1 */
  for (int i = 0; i < n; i++) {
    int p = param_read(m, &m->blocks.a[bi], i, ns0);
    rd[i] = p >= 0 && zp[p].shard >= 0 ? p : -1;
  }
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &m->blocks.a[bi].nodes[i];
    for (int k = 0; k < nd->nin; k++) {
      int p = rd[nd->in[k]], ph = i > L;
      if (p >= 0 && zp[p].first[ph] < 0) zp[p].first[ph] = i;
    }
  }

  /* placement: per phase, layers ordered by first read; a layer's gathers
   * go before the previous layer's first read */
  for (int ph = 0; ph < 2; ph++) {
    const char **key = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *key);
    int *lfirst = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *lfirst), nl = 0;
    int *lof = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *lof);
    for (int p = 0; p < ns0; p++) {
      lof[p] = -1;
      if (zp[p].shard < 0 || zp[p].first[ph] < 0) continue;
      const char *k = layer_key(m->states.a[p].name);
      int l = 0;
      while (l < nl && key[l] != k) l++;
      if (l == nl) { key[nl] = k; lfirst[nl++] = zp[p].first[ph]; }
      else if (zp[p].first[ph] < lfirst[l]) lfirst[l] = zp[p].first[ph];
      lof[p] = l;
    }
    for (int p = 0; p < ns0; p++) {
      if (lof[p] < 0) continue;
      /* the layer read just before this one in this phase */
      int mine = lfirst[lof[p]], prev = -1;
      for (int l = 0; l < nl; l++)
        if (lfirst[l] < mine && (prev < 0 || lfirst[l] > prev)) prev = lfirst[l];
      zp[p].at[ph] = prev >= 0 ? prev : mine;
    }
  }

  /* the new block: old nodes in order, gathers inserted before the node
   * they are placed at (in the order of the layers' first reads, then of
   * the parameters), param reads dropped, accums into sharded grads
   * replaced by the reduce-scatter chain */
  int nb = ir_block_add(m, "zero3.rebuilt");
  Z3 z = {m, cx, nb, 0};
  int *map = arena_alloc(&cx->scratch, ((size_t)n + 1) * sizeof *map);
  int *order = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *order);
  for (int i = 0; i < n && !z.failed; i++) {
    for (int ph = 0; ph < 2; ph++) {
      /* the params placed at i, by their own first read */
      int no = 0;
      for (int p = 0; p < ns0; p++)
        if (zp[p].shard >= 0 && zp[p].at[ph] == i && zp[p].first[ph] >= 0) order[no++] = p;
      for (int a = 1; a < no; a++)   /* insertion sort by first read */
        for (int b = a; b > 0 && zp[order[b]].first[ph] < zp[order[b - 1]].first[ph]; b--) {
          int t = order[b];
          order[b] = order[b - 1];
          order[b - 1] = t;
        }
      for (int k = 0; k < no; k++) emit_gather(&z, order[k], &zp[order[k]], ph);
    }
    const IrNode *nd = &m->blocks.a[bi].nodes[i];
    if (rd[i] >= 0) { map[i] = -1; continue; }
    int *in = nd->nin ? arena_alloc(&cx->scratch, (size_t)nd->nin * sizeof *in) : NULL;
    for (int k = 0; k < nd->nin; k++) {
      int u = nd->in[k], p = rd[u];
      in[k] = p >= 0 ? zp[p].val[i > L] : map[u];
    }
    if (nd->op == IR_OP_ACCUM && nd->ia[0] >= 0 && nd->ia[0] < m->states.n && zs->gof[nd->ia[0]] >= 0) {
      int g = (int)nd->ia[0], p = zs->gof[g];
      emit_reduce(&z, in[0], g, &zs->gsh0[g], &zp[p], &m->states.a[p]);
      map[i] = -1;
      continue;
    }
    IrNode old = *nd;
    int id = z3_emit(&z, old.op, in, old.nin, old.ia, old.fa, old.sa, ir_op_given_type(old.op, &old.type),
                     NULL);
    if (id < 0) break;
    IrNode *nn = &m->blocks.a[nb].nodes[id];
    int *keep_in = nn->in;
    IrType keep_t = nn->type;
    *nn = old;
    nn->in = keep_in;
    nn->type = keep_t;
    memcpy(nn->type.dname, old.type.dname, sizeof old.type.dname);
    map[i] = id;
  }
  if (z.failed) return -1;
  /* the new block replaces the old one, keeping its name and place */
  IrBlock built = m->blocks.a[nb];
  built.name = m->blocks.a[bi].name;
  m->blocks.a[bi] = built;
  m->blocks.n--;
  return 0;
}

int pass_zero3(IrModule *m, PassCtx *cx) {
  int dp = ir_axis_size(m, IR_AXIS_DP);
  if (m->par.zero != 3 || dp <= 1) return 0;
  if (ir_block_find(m, "update") >= 0)
    return ts_errf(cx->err, sizeof cx->err, "zero3: block \"update\" exists already (zero3 runs before the optimizer)");  /* internal */
  int nblk = 0, L;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    int t = training_block(m, bi, &L);
    if (t < 0) return ts_errf(cx->err, sizeof cx->err, "zero3: block micro has no output \"loss\" (the forward's end)");  /* internal */
    nblk += t;
  }
  if (!nblk)
    return ts_errf(cx->err, sizeof cx->err, "zero3: the module has no block \"micro\" and no pipeline blocks (run autodiff first)");  /* internal */

  /* 1. the parameters the training blocks read (through their copies or
   * not) */
  int ns0 = m->states.n;
  Z3Param *zp = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *zp);
  for (int s = 0; s < ns0; s++) zp[s] = (Z3Param){-1, -2, 0, 0, {-1, -1}, {-1, -1}, {-1, -1}};
  for (int bi = 0; bi < m->blocks.n; bi++) {
    if (training_block(m, bi, &L) <= 0) continue;
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      int p = param_read(m, b, i, ns0);
      if (p < 0) continue;
      int cp = p == (int)b->nodes[i].ia[0] ? -1 : (int)b->nodes[i].ia[0];
      if (zp[p].copy != -2 && zp[p].copy != cp)   /* pass precision replaces every read */
        return ts_errf(cx->err, sizeof cx->err, "zero3: param @%s is read both directly and through its copy",
                       m->states.a[p].name);  /* internal */
      zp[p].copy = cp;
    }
    for (int i = 0; i < b->n; i++)
      for (int k = 0; k < b->nodes[i].nin; k++) {
        int p = param_read(m, b, b->nodes[i].in[k], ns0);
        if (p >= 0) zp[p].shard = 0;   /* read: sharded below */
      }
  }
  /* 2. the shard states, and the grads retyped to chunks */
  IrSharding flat;
  memset(&flat, 0, sizeof flat);
  flat.flat = (uint8_t)DP_BIT;
  IrSharding *gsh0 = arena_alloc(&cx->scratch, ((size_t)ns0 + 1) * sizeof *gsh0);
  for (int p = 0; p < ns0; p++) {
    if (zp[p].shard < 0) continue;
    if (!ir_dtype_is_float(m->states.a[p].type.dtype))
      return ts_errf(cx->err, sizeof cx->err, "zero3: parameter @%s is %s; ZeRO-3 shards float parameters only",  /* internal */
                     m->states.a[p].name, ir_dtype_name(m->states.a[p].type.dtype));
    int s = ir_state_derived(m, p, IR_STATE_SHARD, "shard", cx->err, sizeof cx->err);
    if (s < 0) return -1;
    IrState *ps = &m->states.a[p], *ss = &m->states.a[s];
    zp[p].shard = s;
    zp[p].n = ir_type_numel(&ps->type);
    zp[p].c = (zp[p].n + dp - 1) / dp;
    memset(&ss->type, 0, sizeof ss->type);
    ss->type.dtype = ps->type.dtype;
    ss->type.rank = 1;
    ss->type.dim[0] = zp[p].c;
    ss->sh = flat;
    memset(ss->logical, 0, sizeof ss->logical);
    ps->flags |= IR_STATE_SHARDED;
  }
  int *gof = arena_alloc(&cx->scratch, ((size_t)m->states.n + 1) * sizeof *gof);   /* grad -> its param, -1 */
  for (int g = 0; g < m->states.n; g++) {
    gof[g] = -1;
    IrState *gs = &m->states.a[g];
    if (gs->kind != IR_STATE_GRAD || gs->of < 0 || gs->of >= ns0 || zp[gs->of].shard < 0) continue;
    gof[g] = gs->of;
    gsh0[g] = gs->sh;
    if (gs->sh.flat)
      return ts_errf(cx->err, sizeof cx->err, "zero3: grad @%s is flat already (zero3 ran twice?)", gs->name);  /* internal */
    IrSharding sh = flat;
    sh.partial = (uint8_t)(gs->sh.partial & ~DP_BIT);
    memset(&gs->type.dim, 0, sizeof gs->type.dim);
    memset(&gs->type.dname, 0, sizeof gs->type.dname);
    gs->type.rank = 1;
    gs->type.dim[0] = zp[gs->of].c;
    gs->sh = sh;
    memset(gs->logical, 0, sizeof gs->logical);
  }

  /* 3. every training block rebuilt on its own: micro, or each pipeline
   * chunk's fwd / bwd / wgt block (its gathers and reduce-scatters are its
   * own, over dp, so a pipeline rank gathers only its chunks' parameters) */
  Z3Pass zs = {m, cx, zp, ns0, gof, gsh0};
  for (int bi = 0; bi < m->blocks.n; bi++)
    if (training_block(m, bi, &L) > 0 && rebuild_block(&zs, bi, L) != 0) return -1;

  /* 4. the 16-bit copies of sharded parameters: no block reads them now
   * (the gathers round the shard instead), and a whole copy per rank is
   * what ZeRO-3 does not hold */
  unsigned char *drop = arena_alloc(&cx->scratch, (size_t)m->states.n + 1);
  memset(drop, 0, (size_t)m->states.n + 1);
  int ndrop = 0;
  for (int p = 0; p < ns0; p++)
    if (zp[p].shard >= 0 && zp[p].copy >= 0) drop[zp[p].copy] = 1, ndrop++;
  if (ndrop) ir_states_drop(m, drop);
  return 0;
}
