/* partition.c - pipeline stage partitioning (see pipe.h for units and
 * chunks, docs/pipeline.md for the design).
 *
 * Expects: a module with block "forward" (the frontend's output), nodes in
 * topological (program) order, parameters of the repeat stack named
 * "<stack>.<i>.<...>" (frontend/elaborate.c's naming).
 * Guarantees: the module is not changed.
 *
 * How a node finds its unit, with no name but the stack's:
 *   - a node is ANCHORED when it depends (transitively) on a model input
 *     and on a parameter: the activations.  Nodes that depend on
 *     parameters only (broadcast of a gain, reshape of a weight) or on
 *     inputs only (a mask from the targets) are FREE: every stage that
 *     needs them computes them itself, they never cross a cut;
 *   - an anchored node that reads a stack parameter of layer i (through
 *     free operands) is PINNED to unit i + 1; one that reads a parameter
 *     outside the stack is pinned to E while it does not depend on the
 *     stack yet, to L once it depends on the last layer (a parameter read
 *     in the middle of the stack is shared, not pinned);
 *   - between the last node pinned at or before unit u and the first one
 *     pinned after it, the cut u|u+1 goes where the fewest bytes of
 *     anchored values cross it (in a residual network: right after the
 *     residual add, where one tensor carries everything forward);
 *   - a free node counts (for costs) in the unit of its first anchored
 *     reader. */
#include "pipe.h"
#include <ctype.h>
#include <math.h>

typedef PipeStacks Stacks;

/* ---- the repeat stack ---- */

/* "layers.3.attention.wq" -> prefix "layers", index 3; 0 if the name has no
 * ".<digits>." component after a non-empty prefix (the LAST such split is
 * not wanted: a repeat nested in a layer names "layers.3.sub.1.w"; the
 * first numeric component is the outer stack's). */
static int stack_split(const char *name, size_t *plen, long *idx) {
  for (const char *d = strchr(name, '.'); d; d = strchr(d + 1, '.')) {
    const char *s = d + 1;
    if (!isdigit((unsigned char)*s)) continue;
    char *e;
    long v = strtol(s, &e, 10);
    if (*e != '.' || v < 0) continue;
    *plen = (size_t)(d - name);
    *idx = v;
    return 1;
  }
  return 0;
}

/* The stacks: every prefix of "<prefix>.<i>.<name>" parameters (one per
 * top-level `repeat`), in program order (the order of their first
 * parameter: the frontend makes states as it elaborates), each with layer
 * indices 0 .. n-1.  The units of all stacks follow each other: stack k's
 * layer i is global layer st->begin[k] + i.  layer_of[state] = global
 * layer or -1.  0, or -1 with a message. */
static int find_stacks(const IrModule *m, Stacks *st, int *layer_of, char *err, size_t errlen) {
  memset(st, 0, sizeof *st);
  VEC(long) maxes = {0};
  VEC(const char *) names = {0};
  for (int i = 0; i < m->states.n; i++) {
    layer_of[i] = -1;
    size_t pl;
    long idx;
    if (m->states.a[i].kind != IR_STATE_PARAM || !stack_split(m->states.a[i].name, &pl, &idx)) continue;
    const char *pre = ts_intern_n(m->states.a[i].name, pl);
    int k = 0;
    while (k < names.n && names.a[k] != pre) k++;
    if (k == names.n) { VEC_PUSH(names, pre); VEC_PUSH(maxes, idx); }
    else if (idx > maxes.a[k]) maxes.a[k] = idx;
  }
  int rc = 0;
  long total = 0;
  for (int k = 0; k < names.n && rc == 0; k++) {
    if (maxes.a[k] > 1000000 || total + maxes.a[k] + 1 > 1000000)
      rc = ts_errf(err, errlen, "pipeline: the repeat stack '%s' has %ld layers", names.a[k], maxes.a[k] + 1);
    total += maxes.a[k] + 1;
  }
  if (rc == 0 && names.n == 0)
    rc = ts_errf(err, errlen, "pipeline: the model has no repeat stack (no parameter named <stack>.<i>.<name>): "
                              "there are no layers to split into stages: write the model's layers as `repeat N { ... }` "
                              "(docs/mdl.md) to pipeline them, or drop --pp");
  if (rc == 0) {
    st->n = names.n;
    st->name = ts_xmalloc((size_t)names.n * sizeof *st->name);
    st->begin = ts_xmalloc((size_t)(names.n + 1) * sizeof *st->begin);
    st->begin[0] = 0;
    for (int k = 0; k < names.n; k++) {
      st->name[k] = names.a[k];
      st->begin[k + 1] = st->begin[k] + (int)maxes.a[k] + 1;
    }
    char *seen = ts_xcalloc((size_t)total, 1);
    for (int i = 0; i < m->states.n; i++) {
      size_t pl;
      long idx;
      if (m->states.a[i].kind != IR_STATE_PARAM || !stack_split(m->states.a[i].name, &pl, &idx)) continue;
      const char *pre = ts_intern_n(m->states.a[i].name, pl);
      int k = 0;
      while (st->name[k] != pre) k++;
      layer_of[i] = st->begin[k] + (int)idx;
      seen[layer_of[i]] = 1;
    }
    for (int k = 0; k < st->n && rc == 0; k++)
      for (int i = st->begin[k]; i < st->begin[k + 1]; i++)
        if (!seen[i]) {
          rc = ts_errf(err, errlen, "pipeline: the repeat stack '%s' has parameters of layer %d but none of layer %d: "
                       "the stages are cut between layers, which are told apart by their parameters, so every "
                       "iteration of the repeat must make its own (or drop --pp)",
                       st->name[k], st->begin[k + 1] - st->begin[k] - 1, i - st->begin[k]);
          break;
        }
    free(seen);
  }
  free(names.a);
  free(maxes.a);
  return rc;
}

static void stacks_free(Stacks *st) {
  free(st->name);
  free(st->begin);
  memset(st, 0, sizeof *st);
}

/* The name of unit u in messages: "E", "L", "layer 3" (one stack) or
 * "layer 1 of 'dec_layers'". */
static const char *unit_name(const Stacks *st, int u, char *buf, size_t n) {
  int L = st->begin[st->n];
  if (u <= 0) snprintf(buf, n, "E");
  else if (u > L) snprintf(buf, n, "L");
  else {
    int k = 0;
    while (u - 1 >= st->begin[k + 1]) k++;
    if (st->n == 1) snprintf(buf, n, "layer %d", u - 1);
    else snprintf(buf, n, "layer %d of '%s'", u - 1 - st->begin[k], st->name[k]);
  }
  return buf;
}

/* "'enc_layers' (6 layers) then 'dec_layers' (6 layers)" */
static void stacks_str(const Stacks *st, char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < st->n && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s'%s' (%d layers)", i ? " then " : "", st->name[i],
                          st->begin[i + 1] - st->begin[i]);
}

/* ---- costs ---- */

/* Forward FLOPs of node n: matmul 2*M*N*K (batch dims included), leaves and
 * pure layout ops 0, everything else one per result element. */
static double node_flops(const IrBlock *b, const IrNode *n) {
  if (n->op == IR_OP_MATMUL) {
    const IrType *a = &b->nodes[n->in[0]].type;
    int64_t k = n->ia[0] ? a->dim[a->rank - 2] : a->dim[a->rank - 1];
    return 2.0 * (double)ir_type_numel(&n->type) * (double)k;
  }
  if ((ir_ops[n->op].flags & (OPF_LEAF | OPF_EFFECT)) || n->op == IR_OP_RESHAPE) return 0;
  return (double)ir_type_numel(&n->type);
}

static double node_bytes(const IrNode *n) {
  if ((ir_ops[n->op].flags & (OPF_LEAF | OPF_EFFECT)) || n->type.dtype == IR_VOID) return 0;
  return (double)ir_type_numel(&n->type) * (double)ir_dtype_size(n->type.dtype);
}

/* ---- node -> unit ---- */

enum { DEP_INPUT = 1, DEP_PARAM = 2 };

typedef struct {
  int n, L;
  unsigned char *dep;      /* DEP_* of each node, transitive */
  int *maxlayer;           /* free nodes: max unit of stack params they read (0 = none) */
  unsigned char *nonstack; /* free nodes: read a parameter outside the stack */
  int *lo;                 /* anchored nodes: earliest unit (data flow + pins) */
  int *pin;                /* anchored nodes: pinned unit, -1 = not pinned */
  int *by, *by_other;      /* the parameter (state id, -1 none) behind maxlayer / nonstack of a
                              free node, and the one that pinned an anchored node: what a refusal
                              names, as the user wrote it */
} Flow;

static int anchored(const Flow *f, int i) { return f->dep[i] == (DEP_INPUT | DEP_PARAM); }

/* Fills f for block b; layer_of[state] from find_stacks. */
static void flow_build(const IrModule *m, const IrBlock *b, const int *layer_of, const Stacks *st, Flow *f) {
  int n = b->n, L = st->begin[st->n], inlayers = 0;   /* inlayers: a node was pinned to a layer */
  f->n = n;
  f->L = L;
  f->dep = ts_xcalloc((size_t)n, 1);
  f->nonstack = ts_xcalloc((size_t)n, 1);
  f->maxlayer = ts_xcalloc((size_t)n, sizeof *f->maxlayer);
  f->lo = ts_xcalloc((size_t)n, sizeof *f->lo);
  f->pin = ts_xmalloc((size_t)n * sizeof *f->pin);
  f->by = ts_xmalloc((size_t)n * sizeof *f->by);
  f->by_other = ts_xmalloc((size_t)n * sizeof *f->by_other);
  for (int i = 0; i < n; i++) {
    const IrNode *nd = &b->nodes[i];
    f->pin[i] = f->by[i] = f->by_other[i] = -1;
    if (nd->op == IR_OP_INPUT) f->dep[i] = DEP_INPUT;
    if (nd->op == IR_OP_STATE) {
      int s = (int)nd->ia[0];
      if (s >= 0 && s < m->states.n && m->states.a[s].kind == IR_STATE_COPY) s = m->states.a[s].of;   /* its master's */
      if (s >= 0 && s < m->states.n && m->states.a[s].kind == IR_STATE_PARAM) {
        f->dep[i] = DEP_PARAM;
        if (layer_of[s] >= 0) f->maxlayer[i] = layer_of[s] + 1, f->by[i] = s;
        else f->nonstack[i] = 1, f->by_other[i] = s;
      }
    }
    int flo = 0, ns = 0, mx = 0, mxby = -1, nsby = -1;   /* anchored operands' lo; free operands' params */
    for (int k = 0; k < nd->nin; k++) {
      int v = nd->in[k];
      f->dep[i] |= f->dep[v];
      if (anchored(f, v)) { if (f->lo[v] > flo) flo = f->lo[v]; }
      else {
        if (f->maxlayer[v] > mx) mx = f->maxlayer[v], mxby = f->by[v];
        if (f->nonstack[v] && nsby < 0) nsby = f->by_other[v];
        ns |= f->nonstack[v];
      }
    }
    if (!anchored(f, i)) {           /* free: carry the params it reads */
      if (mx > f->maxlayer[i]) f->maxlayer[i] = mx, f->by[i] = mxby;
      f->nonstack[i] |= (unsigned char)ns;
      if (f->by_other[i] < 0) f->by_other[i] = nsby;
      continue;
    }
    int lo = flo > mx ? flo : mx;
    /* a layer's parameter read after a later layer (flo > mx: a weight
     * tied across layers or stacks, as a tied embedding's head reads the
     * embedding) is a shared read that pins nothing; its gradient is
     * summed over the ranks that read it (PipePartition.shared) */
    if (mx > 0 && flo <= mx) {
      f->pin[i] = mx;
      f->by[i] = mxby;
      inlayers = 1;
    }
    if (ns && f->pin[i] < 0) {
      /* before the first layer: E (a later node that depends on no layer,
       * like a decoder's embedding after the encoder, is placed by the cut) */
      if (flo == 0 && !inlayers) f->pin[i] = 0;
      else if (flo >= L) { f->pin[i] = L + 1; lo = L + 1; }   /* after the last layer: L */
      if (f->pin[i] >= 0) f->by[i] = nsby;
    }
    f->lo[i] = lo;
  }
}

static void flow_free(Flow *f) {
  free(f->dep);
  free(f->nonstack);
  free(f->maxlayer);
  free(f->lo);
  free(f->pin);
  free(f->by);
  free(f->by_other);
}

/* Node i (pinned) as the user wrote it: "the matmul reading
 * @layers.3.attn.w_q (layer 3)" (the op, the parameter that pinned it, its
 * unit). */
static const char *pinned_str(const IrModule *m, const Stacks *st, const IrBlock *b, const Flow *f, int i, char *buf,
                              size_t n) {
  char u[80];
  unit_name(st, f->pin[i], u, sizeof u);
  int s = f->by[i];
  if (s >= 0 && s < m->states.n)
    snprintf(buf, n, "the %s reading @%s (%s)", ir_ops[b->nodes[i].op].name, m->states.a[s].name, u);
  else   /* every pin has its parameter; a fallback */
    snprintf(buf, n, "a %s (%s)", ir_ops[b->nodes[i].op].name, u);
  return buf;
}

/* Cuts between units: node positions cut[u] (u = 0 .. L), nodes at
 * positions >= cut[u] are in unit > u.  Also the bytes crossing each cut. */
static int place_cuts(const IrModule *m, const IrBlock *b, const Flow *f, const Stacks *st, int *cut,
                      double *cut_bytes, char *err, size_t errlen) {
  int n = b->n, L = f->L, nu = L + 2;
  /* cross[p] = bytes of anchored values made before p and read at or after p */
  double *cross = ts_xcalloc((size_t)n + 2, sizeof *cross);
  int *last = ts_xmalloc((size_t)n * sizeof *last);
  for (int i = 0; i < n; i++) last[i] = i;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++)
      if (last[b->nodes[i].in[k]] < i) last[b->nodes[i].in[k]] = i;
  for (int i = 0; i < n; i++)
    if (anchored(f, i) && last[i] > i) {
      double by = node_bytes(&b->nodes[i]);
      cross[i + 1] += by;
      cross[last[i] + 1] -= by;
    }
  for (int p = 1; p <= n; p++) cross[p] += cross[p - 1];
  /* lastpin[u]: last position pinned at unit <= u; firstpin[u]: first pinned >= u */
  int *lastpin = ts_xmalloc((size_t)nu * sizeof *lastpin), *firstpin = ts_xmalloc((size_t)(nu + 1) * sizeof *firstpin);
  for (int u = 0; u < nu; u++) lastpin[u] = -1;
  for (int u = 0; u <= nu; u++) firstpin[u] = n;
  for (int i = 0; i < n; i++)
    if (anchored(f, i) && f->pin[i] >= 0) {
      if (i > lastpin[f->pin[i]]) lastpin[f->pin[i]] = i;
      if (i < firstpin[f->pin[i]]) firstpin[f->pin[i]] = i;
    }
  for (int u = 1; u < nu; u++) if (lastpin[u - 1] > lastpin[u]) lastpin[u] = lastpin[u - 1];
  for (int u = nu - 1; u >= 0; u--) if (firstpin[u + 1] < firstpin[u]) firstpin[u] = firstpin[u + 1];
  int rc = 0, prev = 0;
  for (int u = 0; u + 1 < nu; u++) {
    int a = lastpin[u] + 1, z = firstpin[u + 1];   /* cut in [a, z] */
    if (a < prev) a = prev;
    if (a > z) {
      char x[80], y[80], c[160], later[240], earlier[240];
      pinned_str(m, st, b, f, z, later, sizeof later);
      pinned_str(m, st, b, f, lastpin[u], earlier, sizeof earlier);
      unit_name(st, u, x, sizeof x);
      unit_name(st, u + 1, y, sizeof y);
      if (st->n == 1)
        rc = ts_errf(err, errlen, "pipeline: the forward block cannot be cut between %s and %s: %s comes before "
                                  "%s in the model's code; the layers are cut in order, so the code of each must "
                                  "come after the one before it: reorder the code, or drop --pp",
                     x, y, later, earlier);
      else {
        stacks_str(st, c, sizeof c);
        rc = ts_errf(err, errlen, "pipeline: the forward block cannot be cut between %s and %s: %s comes before "
                                  "%s in the model's code; the stacks %s are cut in that order, so the code of one "
                                  "must come after the stack before it: write the stacks one after the other, or "
                                  "drop --pp",
                     x, y, later, earlier, c);
      }
      break;
    }
    int best = a;
    for (int p = a; p <= z; p++)
      if (cross[p] < cross[best]) best = p;
    cut[u] = best;
    cut_bytes[u] = cross[best];
    prev = best;
  }
  free(cross);
  free(last);
  free(lastpin);
  free(firstpin);
  return rc;
}

/* ---- chunks ---- */

/* Min over partitions of costs c[0..n) into k non-empty contiguous parts
 * of the maximum part, then (with that bound) of the sum of squares.
 * begin[0..k] = part boundaries.  O(k n^2): fine for stacks up to a few
 * thousand layers; beyond, greedy (minimum max, not the most even). */
static void balance(const double *c, int n, int k, int *begin) {
  double *pre = ts_xmalloc((size_t)(n + 1) * sizeof *pre);
  pre[0] = 0;
  for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + c[i];
#define SEG(i, j) (pre[j] - pre[i])
  if ((double)k * n * n > 2e8) {
    /* binary search the bound, greedy parts, then split the last ones so
     * that there are k */
    double lo = 0, hi = pre[n];
    for (int i = 0; i < n; i++) if (c[i] > lo) lo = c[i];
    for (int it = 0; it < 100; it++) {
      double mid = (lo + hi) / 2, s = 0;
      int parts = 1;
      for (int i = 0; i < n; i++) {
        if (s + c[i] > mid && s > 0) { parts++; s = 0; }
        s += c[i];
      }
      if (parts <= k) hi = mid; else lo = mid;
    }
    int g = 0;
    double s = 0;
    begin[0] = 0;
    for (int i = 0; i < n; i++) {
      /* start a new part when over the bound or when the rest needs it */
      if (i > begin[g] && g + 1 < k && (s + c[i] > hi * (1 + 1e-12) || n - i == k - 1 - g)) { begin[++g] = i; s = 0; }
      s += c[i];
    }
    begin[k] = n;
    free(pre);
    return;
  }
  /* best[j][i]: min max over splits of the first i costs into j parts */
  double *best = ts_xmalloc((size_t)(k + 1) * (n + 1) * sizeof *best);
  int *arg = ts_xmalloc((size_t)(k + 1) * (n + 1) * sizeof *arg);
#define B(j, i) best[(size_t)(j) * (n + 1) + (i)]
#define A(j, i) arg[(size_t)(j) * (n + 1) + (i)]
  for (int j = 0; j <= k; j++)
    for (int i = 0; i <= n; i++) B(j, i) = INFINITY;
  B(0, 0) = 0;
  for (int j = 1; j <= k; j++)
    for (int i = j; i <= n; i++)
      for (int h = j - 1; h < i; h++) {
        double v = fmax(B(j - 1, h), SEG(h, i));
        if (v < B(j, i)) B(j, i) = v;
      }
  double bound = B(k, n) * (1 + 1e-12) + 1e-300;
  /* the most even split within the bound: min sum of squares */
  for (int j = 0; j <= k; j++)
    for (int i = 0; i <= n; i++) B(j, i) = INFINITY;
  B(0, 0) = 0;
  for (int j = 1; j <= k; j++)
    for (int i = j; i <= n; i++)
      for (int h = j - 1; h < i; h++) {
        double s = SEG(h, i);
        if (s > bound || B(j - 1, h) == INFINITY) continue;
        double v = B(j - 1, h) + s * s;
        if (v < B(j, i)) { B(j, i) = v; A(j, i) = h; }
      }
  begin[k] = n;
  for (int j = k, i = n; j > 0; j--) { i = A(j, i); begin[j - 1] = i; }
#undef A
#undef B
#undef SEG
  free(best);
  free(arg);
  free(pre);
}

/* One symbol list of a Megatron layout, expanded: a string of E t m L and
 * '|' (stage separator).  Grammar: item* where item = symbol ['*' N] |
 * '(' items ')' '*' N | '|' | ',' (ignored) | spaces (ignored).  The
 * expansion is capped so a typo cannot eat the memory. */
typedef struct { const char *s; size_t pos; StrBuf out; char *err; size_t errlen; int failed; } LayoutParse;

static int lp_fail(LayoutParse *lp, const char *what) {
  if (!lp->failed) ts_errf(lp->err, lp->errlen, "--pp-layout: %s at column %zu of \"%s\"", what, lp->pos + 1, lp->s);
  lp->failed = 1;
  return -1;
}

static long lp_count(LayoutParse *lp) {
  if (lp->s[lp->pos] != '*') return 1;
  lp->pos++;
  if (!isdigit((unsigned char)lp->s[lp->pos])) return lp_fail(lp, "expected a count after '*'");
  char *e;
  long v = strtol(lp->s + lp->pos, &e, 10);
  lp->pos = (size_t)(e - lp->s);
  if (v < 0 || v > 100000) return lp_fail(lp, "repeat count out of range (0 .. 100000)");
  return v;
}

static int lp_items(LayoutParse *lp, int depth) {
  for (;;) {
    char c = lp->s[lp->pos];
    if (c == 0 || c == ')') return 0;
    if (c == ',' || c == ' ') { lp->pos++; continue; }
    if (c == '|' || c == 'E' || c == 't' || c == 'm' || c == 'L') {
      lp->pos++;
      long k = c == '|' ? 1 : lp_count(lp);
      if (k < 0) return -1;
      for (long i = 0; i < k; i++) sb_putc(&lp->out, c);
    } else if (c == '(') {
      if (depth > 16) return lp_fail(lp, "parentheses nested too deep");
      lp->pos++;
      size_t at = lp->out.n;
      if (lp_items(lp, depth + 1) != 0) return -1;
      if (lp->s[lp->pos] != ')') return lp_fail(lp, "missing ')'");
      lp->pos++;
      if (lp->s[lp->pos] != '*') return lp_fail(lp, "a group needs a count: (...)*N");
      long k = lp_count(lp);
      if (k < 0) return -1;
      size_t len = lp->out.n - at;
      char *grp = ts_xmalloc(len + 1);
      memcpy(grp, lp->out.p + at, len);
      lp->out.n = at;
      for (long i = 0; i < k && !lp->failed; i++) sb_write(&lp->out, grp, len);
      free(grp);
    } else {
      return lp_fail(lp, "unexpected character (the symbols are E t m L, '|' between stages, (...)*N, x*N)");
    }
    if (lp->out.n > (size_t)1 << 22) return lp_fail(lp, "the expanded layout is too long");
  }
}

/* Chunk boundaries from a layout; sets *nchunks.  -1 with a message. */
static int layout_chunks(const char *layout, const Stacks *st, int pp, int vpp, int **begin_out, int *nchunks,
                         char *err, size_t errlen) {
  int L = st->begin[st->n];
  LayoutParse lp = {layout, 0, {0}, err, errlen, 0};
  int rc = lp_items(&lp, 0);
  if (rc == 0 && layout[lp.pos] == ')') rc = lp_fail(&lp, "unmatched ')'");
  sb_putc(&lp.out, 0);
  const char *x = lp.out.p;
  int stages = 1, nt = 0, nE = 0, nL = 0;
  for (const char *c = x; rc == 0 && *c; c++) {
    if (*c == '|') stages++;
    else if (*c == 't') nt++;
    else if (*c == 'E') nE++;
    else if (*c == 'L') nL++;
    else if (*c == 'm') rc = ts_errf(err, errlen, "--pp-layout \"%s\": 'm' is an MTP layer and this model has none",
                                     layout);
  }
  if (rc == 0 && (nE != 1 || x[0] != 'E'))
    rc = ts_errf(err, errlen, "--pp-layout \"%s\": the embedding E must appear exactly once, as the first symbol "
                              "(found %d)", layout, nE);
  if (rc == 0 && (nL != 1 || x[strlen(x) - 1] != 'L'))
    rc = ts_errf(err, errlen, "--pp-layout \"%s\": the loss L must appear exactly once, as the last symbol (found %d)",
                 layout, nL);
  if (rc == 0 && nt != L && st->n == 1)
    rc = ts_errf(err, errlen, "--pp-layout \"%s\" has %d transformer layers 't' but the model's stack has %d: each "
                              "layer must be placed exactly once", layout, nt, L);
  if (rc == 0 && nt != L) {
    char c[256];
    stacks_str(st, c, sizeof c);
    rc = ts_errf(err, errlen, "--pp-layout \"%s\" has %d transformer layers 't' but the model's stacks %s have %d: "
                              "each layer must be placed exactly once, the stacks' layers one after the other",
                 layout, nt, c, L);
  }
  if (rc == 0 && stages % pp != 0)
    rc = ts_errf(err, errlen, "--pp-layout \"%s\" has %d stages, not a multiple of pp=%d (stages = pp x vpp)",
                 layout, stages, pp);
  if (rc == 0 && vpp > 0 && stages != pp * vpp)
    rc = ts_errf(err, errlen, "--pp-layout \"%s\" has %d stages but pp=%d x vpp=%d = %d", layout, stages, pp, vpp,
                 pp * vpp);
  if (rc == 0) {
    int *begin = ts_xmalloc((size_t)(stages + 1) * sizeof *begin);
    int g = 0, u = 0;            /* the next unit to place: E = 0, t = 1 .. L, L = L + 1 */
    begin[0] = 0;
    for (const char *c = x; *c; c++) {
      if (*c == '|') begin[++g] = u;
      else if (*c == 'E') u = 1;
      else if (*c == 't') u++;
      else if (*c == 'L') u = L + 2;
    }
    begin[stages] = L + 2;
    *begin_out = begin;
    *nchunks = stages;
  }
  sb_free(&lp.out);
  return rc;
}

static int chunks_from_layers(const PipeOptions *o, int L, int nchunks, int *begin, char *err, size_t errlen) {
  if (o->nlayers != nchunks)
    return ts_errf(err, errlen, "--pp-layers has %d entries but there are pp=%d x vpp=%d = %d stages", o->nlayers,
                   o->pp, nchunks / o->pp, nchunks);
  long sum = 0;
  for (int g = 0; g < nchunks; g++) {
    if (o->layers[g] < 0)   /* api/options.c refuses it first */
      return ts_errf(err, errlen, "--pp-layers: a negative layer count (%d)", o->layers[g]);   /* internal */
    sum += o->layers[g];
  }
  if (sum != L)
    return ts_errf(err, errlen, "--pp-layers places %ld layers but the model's stack has %d: each layer must be "
                                "placed exactly once", sum, L);
  begin[0] = 0;
  int u = 1;
  for (int g = 1; g < nchunks; g++) { u += o->layers[g - 1]; begin[g] = u; }
  begin[nchunks] = L + 2;
  return 0;
}

/* The balanced chunks of p (its costs, stacks, nchunks; chunk_begin
 * allocated): the layers that may start a chunk are those of every stack,
 * or of stack `only` (--pp-stack); the units before them (E, the stacks
 * before `only`) ride with the first such layer, those after them with
 * the last.  0, or -1 with a message naming the stacks. */
static int balance_chunks(PipePartition *p, const char *only, char *err, size_t errlen) {
  const Stacks *st = &p->stacks;
  int L = p->nlayers, k0 = 0, k1 = st->n;   /* the stacks cut: [k0, k1) */
  char c[256];
  stacks_str(st, c, sizeof c);
  if (only) {
    while (k0 < st->n && strcmp(st->name[k0], only) != 0) k0++;
    if (k0 == st->n)
      return ts_errf(err, errlen, "--pp-stack %s: the model has no repeat stack of that name; its stacks are %s",
                     only, c);
    k1 = k0 + 1;
  }
  int first = st->begin[k0], n = st->begin[k1] - first;   /* the global layers that may start a chunk */
  if (p->nchunks > n) {
    if (st->n == 1)
      return ts_errf(err, errlen, "pipeline: pp=%d x vpp=%d = %d stages but the stack '%s' has only %d layers: "
                                  "every stage needs at least one layer (or say where they go with --pp-layout)",
                     p->pp, p->vpp, p->nchunks, p->stack, L);
    if (only)
      return ts_errf(err, errlen, "pipeline: pp=%d x vpp=%d = %d stages but --pp-stack %s cuts only its %d layers: "
                                  "every stage needs at least one of them (the stacks are %s): drop --pp-stack to cut "
                                  "all %d layers, or use at most %d stages", p->pp, p->vpp, p->nchunks, only, n, c, L, n);
    return ts_errf(err, errlen, "pipeline: pp=%d x vpp=%d = %d stages but the stacks %s have only %d layers: every "
                                "stage needs at least one layer (or say where they go with --pp-layout)",
                   p->pp, p->vpp, p->nchunks, c, L);
  }
  double *cost = ts_xmalloc((size_t)n * sizeof *cost);
  for (int i = 0; i < n; i++) cost[i] = p->cost[first + i + 1];
  for (int u = 0; u <= first; u++) cost[0] += p->cost[u];                 /* E and the stacks before */
  for (int u = first + n + 1; u < L + 2; u++) cost[n - 1] += p->cost[u];  /* the stacks after and L */
  balance(cost, n, p->nchunks, p->chunk_begin);
  free(cost);
  for (int g = 1; g < p->nchunks; g++) p->chunk_begin[g] += first + 1;
  p->chunk_begin[0] = 0;
  p->chunk_begin[p->nchunks] = L + 2;
  return 0;
}

/* units: anchored nodes by position (cut[]); free nodes follow their first
 * anchored reader (in reverse, so chains of free nodes follow too); a free
 * value nothing anchored reads is in unit 0. */
static void assign_units(const IrBlock *b, const Flow *f, const int *cut, int nu, int *unit) {
  for (int i = 0, u = 0; i < b->n; i++) {
    while (u + 1 < nu && cut[u] <= i) u++;
    unit[i] = anchored(f, i) ? u : -1;
  }
  for (int i = b->n - 1; i >= 0; i--)
    if (unit[i] >= 0 || !anchored(f, i))
      for (int k = 0; k < b->nodes[i].nin; k++) {
        int v = b->nodes[i].in[k];
        if (!anchored(f, v) && unit[i] >= 0 && (unit[v] < 0 || unit[v] > unit[i])) unit[v] = unit[i];
      }
  for (int i = 0; i < b->n; i++)
    if (unit[i] < 0) unit[i] = 0;
}

int pass_layer_units(const IrModule *m, const IrBlock *blk, int n, int *unit, unsigned char *anch, int *nlayers,
                     char *err, size_t errlen) {
  IrBlock b = *blk;   /* a view of the first n nodes */
  b.n = n < blk->n ? n : blk->n;
  int *layer_of = ts_xmalloc((size_t)(m->states.n + 1) * sizeof *layer_of);
  Stacks st;
  int L = 0, *cut = NULL;
  Flow f;
  memset(&f, 0, sizeof f);
  int rc = find_stacks(m, &st, layer_of, err, errlen);
  if (rc == 0) flow_build(m, &b, layer_of, &st, &f);
  if (rc == 0) {
    L = st.begin[st.n];
    double *cut_bytes = ts_xcalloc((size_t)L + 2, sizeof *cut_bytes);
    cut = ts_xmalloc((size_t)(L + 2) * sizeof *cut);
    rc = place_cuts(m, &b, &f, &st, cut, cut_bytes, err, errlen);
    free(cut_bytes);
  }
  if (rc == 0) {
    assign_units(&b, &f, cut, L + 2, unit);
    if (anch)
      for (int i = 0; i < b.n; i++) anch[i] = (unsigned char)anchored(&f, i);
    *nlayers = L;
  }
  free(cut);
  free(layer_of);
  flow_free(&f);
  stacks_free(&st);
  return rc;
}

int pass_layer_stacks(const IrModule *m, PipeStacks *st, char *err, size_t errlen) {
  int *layer_of = ts_xmalloc((size_t)(m->states.n + 1) * sizeof *layer_of);
  int rc = find_stacks(m, st, layer_of, err, errlen);
  free(layer_of);
  return rc;
}
void pass_layer_stacks_free(PipeStacks *st) { stacks_free(st); }

void pass_pipe_partition_free(PipePartition *p) {
  free(p->flops);
  free(p->bytes);
  free(p->cost);
  free(p->cut_bytes);
  free(p->chunk_begin);
  free(p->node_unit);
  free(p->shared);
  stacks_free(&p->stacks);
  memset(p, 0, sizeof *p);
}

int pass_pipe_partition(const IrModule *m, const PipeOptions *o, PipePartition *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  int fb = ir_block_find(m, "forward");
  if (fb < 0)   /* the frontend always makes it */
    return ts_errf(err, errlen, "pipeline: the module has no block \"forward\" to partition");   /* internal */
  if (o->pp < 1) return ts_errf(err, errlen, "pipeline: pp=%d", o->pp);
  if (o->vpp < 0)   /* api/options.c refuses it first */
    return ts_errf(err, errlen, "--vpp %d: must be at least 1", o->vpp);   /* internal */
  if (o->layers && o->layout) return ts_errf(err, errlen, "--pp-layers and --pp-layout both say where the layers go: give one of them");
  if (o->only_stack && (o->layers || o->layout))
    return ts_errf(err, errlen, "--pp-stack and %s do not go together: %s already places every layer of every stack",
                   o->layers ? "--pp-layers" : "--pp-layout", o->layers ? "--pp-layers" : "--pp-layout");
  const IrBlock *b = &m->blocks.a[fb];
  int *layer_of = ts_xmalloc((size_t)(m->states.n + 1) * sizeof *layer_of);
  int L = 0;
  Flow f;
  memset(&f, 0, sizeof f);
  int rc = find_stacks(m, &out->stacks, layer_of, err, errlen);
  if (rc == 0) {
    out->stack = out->stacks.name[0];
    L = out->stacks.begin[out->stacks.n];
    flow_build(m, b, layer_of, &out->stacks, &f);
  }
  int nu = L + 2;
  int *cut = NULL;
  if (rc == 0) {
    out->nlayers = L;
    out->nunits = nu;
    out->flops = ts_xcalloc((size_t)nu, sizeof *out->flops);
    out->bytes = ts_xcalloc((size_t)nu, sizeof *out->bytes);
    out->cost = ts_xcalloc((size_t)nu, sizeof *out->cost);
    out->cut_bytes = ts_xcalloc((size_t)nu, sizeof *out->cut_bytes);
    cut = ts_xmalloc((size_t)nu * sizeof *cut);
    rc = place_cuts(m, b, &f, &out->stacks, cut, out->cut_bytes, err, errlen);
  }
  if (rc == 0) {
    out->nnodes = b->n;
    out->node_unit = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *out->node_unit);
    assign_units(b, &f, cut, nu, out->node_unit);
    for (int i = 0; i < b->n; i++) {
      int u = out->node_unit[i];
      out->flops[u] += 3 * node_flops(b, &b->nodes[i]);
      out->bytes[u] += node_bytes(&b->nodes[i]);
    }
    for (int u = 0; u < nu; u++) out->cost[u] = out->flops[u] + PIPE_FLOPS_PER_BYTE * out->bytes[u];
  }
  /* chunks */
  if (rc == 0) {
    out->pp = o->pp;
    if (o->layout) {
      rc = layout_chunks(o->layout, &out->stacks, o->pp, o->vpp, &out->chunk_begin, &out->nchunks, err, errlen);
      if (rc == 0) out->vpp = out->nchunks / o->pp;
    } else {
      out->vpp = o->vpp > 0 ? o->vpp : 1;
      out->nchunks = o->pp * out->vpp;
      out->chunk_begin = ts_xmalloc((size_t)(out->nchunks + 1) * sizeof *out->chunk_begin);
      if (o->layers) {
        rc = chunks_from_layers(o, L, out->nchunks, out->chunk_begin, err, errlen);
      } else {
        rc = balance_chunks(out, o->only_stack, err, errlen);
      }
    }
  }
  /* parameters read on more than one pipeline rank: the ranks of the
   * anchored readers, carried back through free values (a tied embedding
   * is ONE state node read by the embedding and by the head) */
  if (rc == 0) {
    int *unit_rank = ts_xmalloc((size_t)nu * sizeof *unit_rank);
    for (int g = 0; g < out->nchunks; g++)
      for (int u = out->chunk_begin[g]; u < out->chunk_begin[g + 1]; u++) unit_rank[u] = g % out->pp;
    int *rank = ts_xmalloc((size_t)(b->n + 1) * sizeof *rank);   /* -1 none, -2 several */
    for (int i = 0; i < b->n; i++) rank[i] = -1;
    for (int i = b->n - 1; i >= 0; i--) {
      int r = anchored(&f, i) ? unit_rank[out->node_unit[i]] : rank[i];
      if (r == -1) continue;
      for (int k = 0; k < b->nodes[i].nin; k++) {
        int v = b->nodes[i].in[k];
        if (anchored(&f, v)) continue;
        rank[v] = rank[v] == -1 ? r : rank[v] == r ? r : -2;
      }
    }
    out->shared = ts_xcalloc((size_t)(m->states.n + 1), sizeof *out->shared);
    char *done = ts_xcalloc((size_t)(m->states.n + 1), 1);
    for (int i = 0; i < b->n; i++) {
      int s = (int)b->nodes[i].ia[0];
      if (b->nodes[i].op != IR_OP_STATE || rank[i] != -2 || done[s]) continue;
      done[s] = 1;
      out->shared[out->nshared++] = m->states.a[s].name;
    }
    free(done);
    free(rank);
    free(unit_rank);
  }
  free(cut);
  free(layer_of);
  flow_free(&f);
  if (rc != 0) pass_pipe_partition_free(out);
  return rc;
}

void pass_pipe_chunk_str(const PipePartition *p, int g, char *buf, size_t n) {
  int u0 = p->chunk_begin[g], u1 = p->chunk_begin[g + 1], L = p->nlayers;
  int l0 = u0 < 1 ? 1 : u0, l1 = u1 > L + 1 ? L + 1 : u1;   /* layer units [l0, l1) */
  size_t k = 0;
  buf[0] = 0;
  if (u0 == 0 && u1 > 0) k += (size_t)snprintf(buf + k, n - k, "E");
  if (l1 > l0 && k < n && p->stacks.n <= 1) {
    if (l1 - l0 == 1) k += (size_t)snprintf(buf + k, n - k, "%slayer %d", k ? " + " : "", l0 - 1);
    else k += (size_t)snprintf(buf + k, n - k, "%slayers %d-%d", k ? " + " : "", l0 - 1, l1 - 2);
  }
  for (int s = 0; p->stacks.n > 1 && s < p->stacks.n && k < n; s++) {   /* "enc_layers 0-5 + dec_layers 0" */
    int a = p->stacks.begin[s] + 1, z = p->stacks.begin[s + 1] + 1;    /* the stack's units [a, z) */
    if (a < l0) a = l0;
    if (z > l1) z = l1;
    if (z - a == 1) k += (size_t)snprintf(buf + k, n - k, "%s%s %d", k ? " + " : "", p->stacks.name[s], a - 1 - p->stacks.begin[s]);
    else if (z > a)
      k += (size_t)snprintf(buf + k, n - k, "%s%s %d-%d", k ? " + " : "", p->stacks.name[s], a - 1 - p->stacks.begin[s],
                            z - 2 - p->stacks.begin[s]);
  }
  if (u1 == L + 2 && u0 < u1 && k < n) k += (size_t)snprintf(buf + k, n - k, "%sL", k ? " + " : "");
  if (!buf[0]) snprintf(buf, n, "(empty)");
}
