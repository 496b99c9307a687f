/* memplan.c - static memory planning analysis (see memplan.h for the rules
 * of which values own a buffer and when RESHAPE aliases).
 *
 * Expects: a verified module (operands are earlier nodes of the block).
 * Guarantees: the module is not changed; the plan packs every value buffer
 * of one block into one arena, checked by plan_mem_check.
 *
 * Packing is ggml-allocator style but offline: buffers sorted by size,
 * largest first (ties: earlier start, then lower id, so the result is
 * deterministic), each placed in the smallest gap between the buffers
 * already placed that it conflicts with (intervals intersect), or after
 * the last of them.  Big buffers first keeps the small ones filling holes
 * instead of fragmenting the bottom of the arena. */
#include "plan/memplan.h"
#include "plan/groups.h"

static size_t align64(size_t x) { return (x + MEMPLAN_ALIGN - 1) & ~(size_t)(MEMPLAN_ALIGN - 1); }

/* Does value node n need bytes of its own (before any reshape aliasing)? */
static int wants_buffer(const IrNode *n) {
  return n->op != IR_OP_STATE && !(ir_ops[n->op].flags & OPF_EFFECT) && n->type.dtype != IR_VOID;
}

/* Bytes of value node n's buffer: numel * dtype size rounded up to 64; an
 * empty tensor still gets 64 (the runtime never allocates 0).  0 if the
 * type has no byte size (the caller reports it). */
static size_t value_bytes(const IrNode *n) {
  int64_t numel = ir_type_numel(&n->type);  /* internal */
  size_t es = ir_dtype_size(n->type.dtype);
  if (numel < 0 || es == 0) return 0;
  size_t b = (size_t)numel * es;
  return align64(b ? b : 1);
}

/* ir_block_states_written into a new heap array. */
static unsigned char *states_written(const IrModule *m, const IrBlock *b) {
  unsigned char *w = ts_xcalloc((size_t)(m->states.n ? m->states.n : 1), 1);
  ir_block_states_written(m, b, w);
  return w;
}

/* The state whose slab bytes value v is (a STATE node, or a view of one),
 * or -1. */
static int slab_state(const IrBlock *b, const unsigned char *view, int v) {
  while (v >= 0 && view && view[v]) v = b->nodes[v].in[0];
  return v >= 0 && b->nodes[v].op == IR_OP_STATE ? (int)b->nodes[v].ia[0] : -1;
}

/* The position node i is computed at (its own without an at[]). */
static int pos(const int *at, int i) { return at ? at[i] : i; }

/* Does node i run alone at its position (not as part of a larger kernel)? */
static int alone(const int *at, int i) {
  if (!at) return 1;
  if (at[i] != i) return 0;
  for (int j = 0; j < i; j++)
    if (at[j] == i) return 0;
  return 1;
}

/* last[i] = the last position reading value i from outside its kernel,
 * or -1 if nobody does (the caller takes pos(i) then). */
static void outside_reads(const IrBlock *b, const int *at, int *last) {
  for (int i = 0; i < b->n; i++) last[i] = -1;
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) {
      int v = b->nodes[i].in[k];
      if (v < 0 || v >= i || pos(at, v) == pos(at, i)) continue;   /* inside one kernel */
      if (last[v] < pos(at, i)) last[v] = pos(at, i);
    }
}

/* Is at[] a valid execution order for a block of n nodes?  (see memplan.h) */
static int check_at(const IrBlock *b, const int *at, char *err, size_t errlen) {
  for (int i = 0; at && i < b->n; i++)
    if (at[i] < i || at[i] >= b->n || at[at[i]] != at[i])
      return ts_errf(err, errlen, "memplan: block %s: node %%%d is said to run at %d (a kernel runs at its last member)",
                     b->name, i, at[i]);  /* internal */
  return 0;
}

/* Which buffers the pipeline hands over (memplan.h): ext[o] = 1 for the
 * owner o of a buffer exactly one `stash` reads (through any value in it)
 * and for an `unstash` result owning its buffer; then every value in such
 * a buffer.  buf[] is the plan's sharing (owner per value, -1 = none). */
static void handed_over(const IrBlock *b, const int *buf, unsigned char *ext) {
  int n = b->n;
  int *stashes = ts_xcalloc((size_t)(n ? n : 1), sizeof *stashes);
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[i];
    ext[i] = 0;
    if (nd->op == IR_OP_STASH && nd->nin == 1 && nd->in[0] >= 0 && nd->in[0] < i && buf[nd->in[0]] >= 0)
      stashes[buf[nd->in[0]]]++;
  }
  for (int i = 0; i < n; i++)
    if (buf[i] == i) ext[i] = stashes[i] == 1 || b->nodes[i].op == IR_OP_UNSTASH;
  for (int i = 0; i < n; i++)
    if (buf[i] >= 0 && buf[i] != i) ext[i] = ext[buf[i]];
  free(stashes);
}

void plan_mem_group_at(const IrBlock *b, int *at) {
  int maxg = 0;
  for (int i = 0; i < b->n; i++) if (b->nodes[i].group > maxg) maxg = b->nodes[i].group;
  int *lastm = ts_xmalloc((size_t)(maxg + 1) * sizeof *lastm);
  for (int g = 0; g <= maxg; g++) lastm[g] = -1;
  for (int i = 0; i < b->n; i++) if (b->nodes[i].group > 0) lastm[b->nodes[i].group] = i;
  for (int i = 0; i < b->n; i++) at[i] = b->nodes[i].group > 0 ? lastm[b->nodes[i].group] : i;
  free(lastm);
  /* the launches of plan/groups.h over nodes in no fusion group: AdamW
   * runs at their last adamw (which reads every member's operands there),
   * the parts of one attention's backward at the last part, gradients made
   * straight into their state at the accum */
  int (*const launches[])(const IrBlock *, int *) = {plan_opt_runs, plan_attn_grad_runs, plan_accum_direct_runs};
  int *run = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *run);
  for (size_t l = 0; l < sizeof launches / sizeof launches[0]; l++) {
    launches[l](b, run);
    for (int i = 0; i < b->n; i++)
      if (run[i] >= 0) at[i] = run[i];
  }
  free(run);
}

void plan_mem_free(MemPlan *p) {
  if (!p) return;
  free(p->at);
  free(p->offset);
  free(p->size);
  free(p->buf);
  free(p->first);
  free(p->last);
  free(p->view);
  free(p->ext);
  memset(p, 0, sizeof *p);
}

typedef struct { size_t off, size; } Span;

static int cmp_span(const void *a, const void *b) {
  const Span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Order of placement: bigger first, then earlier start, then lower id.
 * The sort keys are copied next to the id so that qsort needs no context. */
typedef struct { size_t size; int first, id; } OwnerKey;
static int cmp_owner(const void *a, const void *b) {
  const OwnerKey *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

static int intersects(const MemPlan *p, int a, int b) {
  return p->first[a] <= p->last[b] && p->first[b] <= p->last[a];
}

/* Places the owners in `order` (size-sorted) one by one.  placed[] holds
 * the owners already placed; gaps[] is scratch of p->n spans. */
static void pack(MemPlan *p, const int *order, int nown) {
  int *placed = ts_xmalloc((size_t)(nown ? nown : 1) * sizeof *placed);
  Span *sp = ts_xmalloc((size_t)(nown ? nown : 1) * sizeof *sp);
  int nplaced = 0;
  for (int oi = 0; oi < nown; oi++) {
    int o = order[oi];
    int ns = 0;
    for (int k = 0; k < nplaced; k++)
      if (intersects(p, o, placed[k])) sp[ns++] = (Span){(size_t)p->offset[placed[k]], p->size[placed[k]]};
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    /* walk the occupied spans bottom-up; a gap is [cur, next span's offset) */
    size_t cur = 0, best = 0, best_gap = SIZE_MAX;
    for (int k = 0; k < ns; k++) {
      if (sp[k].off > cur) {
        size_t gap = sp[k].off - cur;
        if (gap >= p->size[o] && gap < best_gap) { best = cur; best_gap = gap; }
      }
      if (sp[k].off + sp[k].size > cur) cur = sp[k].off + sp[k].size;
    }
    p->offset[o] = (int64_t)(best_gap != SIZE_MAX ? best : cur);
    placed[nplaced++] = o;
  }
  free(placed);
  free(sp);
}

int plan_mem_block(const IrModule *m, int block, MemPlan *out, char *err, size_t errlen) {
  return plan_mem_block_at(m, block, NULL, out, err, errlen);
}

int plan_mem_block_at(const IrModule *m, int block, const int *at, MemPlan *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!m || block < 0 || block >= m->blocks.n)
    return ts_errf(err, errlen, "memplan: no block %d (the module has %d)", block, m ? m->blocks.n : 0);  /* internal */
  const IrBlock *b = &m->blocks.a[block];
  if (check_at(b, at, err, errlen) != 0) return -1;
  int n = b->n, cap = n ? n : 1;
  out->block = block;
  out->n = n;
  if (at) {
    out->at = ts_xmalloc((size_t)cap * sizeof *out->at);
    memcpy(out->at, at, (size_t)n * sizeof *at);
  }
  at = out->at;
  out->offset = ts_xmalloc((size_t)cap * sizeof *out->offset);
  out->size = ts_xcalloc((size_t)cap, sizeof *out->size);
  out->buf = ts_xmalloc((size_t)cap * sizeof *out->buf);
  out->first = ts_xmalloc((size_t)cap * sizeof *out->first);
  out->last = ts_xmalloc((size_t)cap * sizeof *out->last);
  out->view = ts_xcalloc((size_t)cap, 1);
  out->ext = ts_xcalloc((size_t)cap, 1);
  int *last = ts_xmalloc((size_t)cap * sizeof *last);
  outside_reads(b, at, last);
  unsigned char *written = states_written(m, b);

  /* 1. buffers and their live intervals (indexed by owner id) */
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[i];
    out->offset[i] = -1;
    out->buf[i] = out->first[i] = out->last[i] = -1;
    if (!wants_buffer(nd)) continue;
    if (pos(at, i) != i && last[i] < 0) continue;   /* lives only inside its kernel */
    int v = nd->op == IR_OP_RESHAPE && nd->nin == 1 ? nd->in[0] : -1;
    int st = v >= 0 && v < i && alone(at, i) ? slab_state(b, out->view, v) : -1;
    if (st >= 0 && !written[st]) {   /* a view of a state no effect of this block writes */
      out->view[i] = 1;
      continue;
    }
    size_t bytes = value_bytes(nd);
    if (bytes == 0) {
      char t[128];
      plan_mem_free(out);
      free(last);
      free(written);
      return ts_errf(err, errlen, "memplan: block %s, %%%d = %s: type %s has no byte size", b->name, i,
                     ir_ops[nd->op].name, ir_type_str(&nd->type, t, sizeof t));
    }
    int end = last[i] > pos(at, i) ? last[i] : pos(at, i);
    if (v >= 0 && v < i && out->buf[v] >= 0 && alone(at, i) && out->size[out->buf[v]] == bytes) {
      int o = out->buf[v];           /* same bytes: read them where they are */
      out->buf[i] = o;
      if (end > out->last[o]) out->last[o] = end;
    } else {
      out->buf[i] = i;
      out->size[i] = bytes;
      out->first[i] = pos(at, i);
      out->last[i] = end;
    }
  }
  free(last);
  free(written);
  handed_over(b, out->buf, out->ext);

  /* 2. lower bound: the most bytes live at any one node (difference array) */
  int64_t *delta = ts_xcalloc((size_t)n + 1, sizeof *delta);
  int *order = ts_xmalloc((size_t)cap * sizeof *order);
  int nown = 0;
  for (int i = 0; i < n; i++) {
    if (out->buf[i] != i) continue;
    if (out->ext[i]) {               /* outside the arena */
      out->next++;
      out->ext_bytes += out->size[i];
      continue;
    }
    out->nbuffers++;
    order[nown++] = i;
    delta[out->first[i]] += (int64_t)out->size[i];
    delta[out->last[i] + 1] -= (int64_t)out->size[i];
    out->total_bytes += out->size[i];
  }
  int64_t live = 0;
  for (int i = 0; i < n; i++) {
    live += delta[i];
    if ((size_t)live > out->lower_bound_bytes) out->lower_bound_bytes = (size_t)live;
  }
  free(delta);

  /* 3. offsets */
  OwnerKey *key = ts_xmalloc((size_t)cap * sizeof *key);
  for (int k = 0; k < nown; k++) key[k] = (OwnerKey){out->size[order[k]], out->first[order[k]], order[k]};
  qsort(key, (size_t)nown, sizeof *key, cmp_owner);
  for (int k = 0; k < nown; k++) order[k] = key[k].id;
  free(key);
  pack(out, order, nown);
  free(order);
  for (int i = 0; i < n; i++) {
    int o = out->buf[i];
    if (o < 0) continue;
    if (o == i) {
      if (out->ext[i]) continue;
      size_t end = (size_t)out->offset[i] + out->size[i];
      if (end > out->peak_bytes) out->peak_bytes = end;
    } else {                         /* aliases share the owner's placement */
      out->offset[i] = out->offset[o];
      out->size[i] = out->size[o];
    }
  }
  for (int i = 0; i < n; i++)         /* every member reports its buffer's interval */
    if (out->buf[i] >= 0 && out->buf[i] != i) {
      out->first[i] = out->first[out->buf[i]];
      out->last[i] = out->last[out->buf[i]];
    }
  return 0;
}

/* Per-value checks: it has the buffer it needs, and the buffer's interval
 * covers its position and every reader (recomputed from the IR and at). */
static int check_values(const IrModule *m, const MemPlan *p, char *err, size_t errlen) {
  const IrBlock *b = &m->blocks.a[p->block];
  const int *at = p->at;
  int *last = ts_xmalloc((size_t)(p->n ? p->n : 1) * sizeof *last);
  outside_reads(b, at, last);
  unsigned char *written = states_written(m, b);
  unsigned char *ext = ts_xcalloc((size_t)(p->n ? p->n : 1), 1);
  handed_over(b, p->buf, ext);
  int rc = 0;
  for (int i = 0; i < p->n && rc == 0; i++) {
    const IrNode *nd = &b->nodes[i];
    int o = p->buf[i];
    if (p->view && p->view[i]) {   /* reads the slab: a reshape alone of an unwritten state */
      int st = nd->op == IR_OP_RESHAPE && nd->nin == 1 && nd->in[0] < i && alone(at, i)
                   ? slab_state(b, p->view, nd->in[0]) : -1;
      if (st < 0 || written[st] || o != -1)
        rc = ts_errf(err, errlen, "memplan: %%%d (%s) is a view of the state slab but not a reshape, run alone, "
                     "of a state this block never writes", i, ir_ops[nd->op].name);  /* internal */
      continue;
    }
    int needs = wants_buffer(nd) && (pos(at, i) == i || last[i] >= 0);
    int end = last[i] > pos(at, i) ? last[i] : pos(at, i);
    if (!needs) {
      if (o != -1) rc = ts_errf(err, errlen, "memplan: %%%d (%s) owns no bytes but has buffer %d", i, ir_ops[nd->op].name, o);  /* internal */
      continue;
    }
    if (o < 0 || o > i || p->buf[o] != o)
      rc = ts_errf(err, errlen, "memplan: %%%d has no valid buffer (buf %d)", i, o);  /* internal */
    else if (p->ext[i] != ext[i])
      rc = ts_errf(err, errlen, "memplan: %%%d (%s) is %s the arena but the pipeline %s its buffer", i,
                   ir_ops[nd->op].name, p->ext[i] ? "outside" : "in", ext[i] ? "hands over" : "does not hand over");  /* internal */
    else if (p->ext[i] ? p->offset[o] != -1 || p->offset[i] != -1 || p->size[o] < value_bytes(nd) ||
                             p->size[i] != p->size[o]
                       : p->size[o] < value_bytes(nd) || p->size[o] % MEMPLAN_ALIGN || p->offset[o] < 0 ||
                             p->offset[o] % MEMPLAN_ALIGN || p->offset[i] != p->offset[o] || p->size[i] != p->size[o])
      rc = ts_errf(err, errlen, "memplan: %%%d: buffer at %lld of %zu bytes is misaligned or too small",
                   i, (long long)p->offset[o], p->size[o]);  /* internal */
    else if (p->first[o] > pos(at, i) || p->first[o] != pos(at, o) || p->last[o] < end ||
             p->first[i] != p->first[o] || p->last[i] != p->last[o])
      rc = ts_errf(err, errlen, "memplan: %%%d is live over [%d, %d] but its buffer only over [%d, %d]",
                   i, pos(at, i), end, p->first[o], p->last[o]);  /* internal */
    else if (o != i) {
      /* sharing is legal only as a reshape, run alone, of a value in that buffer */
      int v = nd->op == IR_OP_RESHAPE && nd->nin == 1 ? nd->in[0] : -1;
      if (v < 0 || v >= i || p->buf[v] != o || !alone(at, i))
        rc = ts_errf(err, errlen, "memplan: %%%d shares buffer %%%d but is not a reshape of a value in it", i, o);  /* internal */
    }
  }
  free(last);
  free(written);
  free(ext);
  return rc;
}

/* Owners by the start of their interval (then id): the order the overlap
 * sweep needs (with kernels a buffer starts at its kernel's position,
 * which need not follow the owner's id). */
typedef struct { int first, id; } StartKey;
static int cmp_start(const void *a, const void *b) {
  const StartKey *x = a, *y = b;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

int plan_mem_check(const IrModule *m, const MemPlan *p, char *err, size_t errlen) {
  if (!m || !p || p->block < 0 || p->block >= m->blocks.n || m->blocks.a[p->block].n != p->n)
    return ts_errf(err, errlen, "memplan: the plan does not belong to this module");  /* internal */
  if (check_at(&m->blocks.a[p->block], p->at, err, errlen) != 0) return -1;
  if (check_values(m, p, err, errlen) != 0) return -1;
  int *own = ts_xmalloc((size_t)(p->n ? p->n : 1) * sizeof *own);
  int nown = 0;
  size_t peak = 0, total = 0, ext_total = 0;
  int next = 0;
  for (int i = 0; i < p->n; i++)
    if (p->buf[i] == i && p->ext[i]) {
      next++;
      ext_total += p->size[i];
    } else if (p->buf[i] == i) {
      own[nown++] = i;
      size_t end = (size_t)p->offset[i] + p->size[i];
      if (end > peak) peak = end;
      total += p->size[i];
    }
  int rc = 0;
  if (peak != p->peak_bytes || total != p->total_bytes || nown != p->nbuffers || next != p->next ||
      ext_total != p->ext_bytes)
    rc = ts_errf(err, errlen, "memplan: peak %zu / total %zu / %d + %d buffers recorded, but the buffers give %zu / "
                 "%zu / %d + %d", p->peak_bytes, p->total_bytes, p->nbuffers, p->next, peak, total, nown, next);  /* internal */
  else if (p->lower_bound_bytes > p->peak_bytes || p->peak_bytes > p->total_bytes)
    rc = ts_errf(err, errlen, "memplan: expected lower bound %zu <= peak %zu <= total %zu",
                 p->lower_bound_bytes, p->peak_bytes, p->total_bytes);  /* internal */
  /* pairwise overlap: by start, each buffer against those starting within it */
  StartKey *key = ts_xmalloc((size_t)(nown ? nown : 1) * sizeof *key);
  for (int k = 0; k < nown; k++) key[k] = (StartKey){p->first[own[k]], own[k]};
  qsort(key, (size_t)nown, sizeof *key, cmp_start);
  for (int k = 0; k < nown; k++) own[k] = key[k].id;
  free(key);
  for (int a = 0; a < nown && rc == 0; a++)
    for (int c = a + 1; c < nown && p->first[own[c]] <= p->last[own[a]]; c++) {
      int x = own[a], y = own[c];
      size_t xo = (size_t)p->offset[x], yo = (size_t)p->offset[y];
      if (xo < yo + p->size[y] && yo < xo + p->size[x]) {
        rc = ts_errf(err, errlen, "memplan: %%%d [%zu, %zu) live over [%d, %d] overlaps %%%d [%zu, %zu) live over [%d, %d]",
                     x, xo, xo + p->size[x], p->first[x], p->last[x], y, yo, yo + p->size[y], p->first[y], p->last[y]);  /* internal */
        break;
      }
    }
  free(own);
  return rc;
}

size_t plan_mem_state_bytes(const IrModule *m, IrStateKind kind) {
  size_t total = 0;
  for (int i = 0; i < m->states.n; i++) {
    IrStateKind k = m->states.a[i].kind == IR_STATE_SHARD ? IR_STATE_PARAM : m->states.a[i].kind;
    if (k == kind) total += ir_state_bytes(&m->states.a[i]);   /* ZeRO-3: a parameter's bytes are its shard's */
  }
  return total;
}

size_t plan_mem_slab_bytes(const IrModule *m) {
  size_t total = 0;
  for (int i = 0; i < m->states.n; i++)
    total += align64(ir_state_bytes(&m->states.a[i]));
  return total;
}


int plan_mem_block_checked(const IrModule *m, int block, const int *at, MemPlan *out, char *err, size_t errlen) {
  int rc = plan_mem_block_at(m, block, at, out, err, errlen);
  if (rc == 0 && (rc = plan_mem_check(m, out, err, errlen)) != 0) plan_mem_free(out);
  return rc;
}

int plan_mem_arena_bytes(const IrModule *m, int fused, size_t *out, char *err, size_t errlen) {
  *out = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int *at = fused ? ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *at) : NULL;
    if (at) plan_mem_group_at(b, at);
    MemPlan p;
    int rc = plan_mem_block_checked(m, bi, at, &p, err, errlen);
    free(at);
    if (rc != 0) return -1;
    if (p.peak_bytes > *out) *out = p.peak_bytes;
    plan_mem_free(&p);
  }
  return 0;
}
