/* ir.c - the IR's data structures: the op table built from ops.def, dtype
 * and type helpers, modules/blocks/states, and ir_emit (the one way nodes
 * get appended, always through the shape rule of ir/shape.c).
 *
 * Memory: a module's blocks' node arrays, operand arrays and everything
 * else reachable from a node live in m->arena; the VEC arrays of the
 * module itself (consts, states, blocks) are heap arrays freed by
 * ir_module_free.  Names are interned (process-wide), never copied. */
#include "ir.h"
#include "ir_priv.h"
#include <pthread.h>
#include <ctype.h>
#include <stdarg.h>

const IrOpInfo ir_ops[IR_OP_COUNT] = {
#define X(name, text, nin, ia, fa, flags, doc) [IR_OP_##name] = {text, nin, ia, fa, flags, doc},
#include "ops.def"
#undef X
};

int ir_op_lookup(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < IR_OP_COUNT; i++)
    if (strcmp(ir_ops[i].name, name) == 0) return i;
  return -1;
}

/* ---- attribute names, split once from the ops.def strings ---- */
static IrOpAttrs op_attrs[IR_OP_COUNT];
static pthread_once_t op_attrs_once = PTHREAD_ONCE_INIT;

/* Splits "a b c" into words of at most 23 chars; returns the count.  The
 * table is ours, so a malformed row is an internal error. */
static int split_words(const char *s, char out[][24], int max) {
  int n = 0;
  while (*s) {
    while (*s == ' ') s++;
    if (!*s) break;
    size_t k = strcspn(s, " ");
    TS_ASSERT(n < max && k < 24);
    memcpy(out[n], s, k);
    out[n][k] = 0;
    n++;
    s += k;
  }
  return n;
}

static void op_attrs_init(void) {
  for (int op = 0; op < IR_OP_COUNT; op++) {
    IrOpAttrs *a = &op_attrs[op];
    a->list = -1;
    a->ni = split_words(ir_ops[op].iattrs, a->iname, IR_MAX_IATTR);
    a->nf = split_words(ir_ops[op].fattrs, a->fname, IR_MAX_FATTR);
    for (int i = 0; i < a->ni; i++) {
      char *w = a->iname[i];
      size_t k = strlen(w);
      if (w[0] == '@') { a->is_state[i] = 1; memmove(w, w + 1, k); k--; }
      else if (w[0] == '~') { a->is_axis[i] = 1; memmove(w, w + 1, k); k--; }
      if (k && w[k - 1] == '*') { w[k - 1] = 0; TS_ASSERT(i == a->ni - 1); a->list = i; }
    }
  }
}

/* operands before the optional ones (slope, bias, doc); the window's,
 * alibi's and bias's int attrs (bias -1: the ring steps, which carry none:
 * pass shard refuses cp with a score bias) */
static int attn_layout(IrOp op, int *base, int *win, int *alibi, int *bias) {
  *bias = -1;
  switch (op) {
  case IR_OP_ATTENTION: *base = 3, *win = 1, *alibi = 2, *bias = 3; return 1;
  case IR_OP_ATTENTION_BWD: *base = 5, *win = 2, *alibi = 3, *bias = 4; return 1;
  case IR_OP_ATTN_ACC: *base = 4, *win = 2, *alibi = 3; return 1;
  case IR_OP_ATTN_BWD_Q: *base = 7, *win = 2, *alibi = 3; return 1;
  case IR_OP_ATTN_BWD_KV: *base = 7, *win = 3, *alibi = 4; return 1;
  default: return 0;
  }
}
int64_t ir_attn_window(const IrNode *n) {
  int base, win, al, bi;
  return attn_layout(n->op, &base, &win, &al, &bi) ? n->ia[win] : 0;
}
int ir_attn_base(const IrNode *n) {
  int base, win, al, bi;
  return attn_layout(n->op, &base, &win, &al, &bi) ? base : -1;
}
int ir_attn_alibi_attr(IrOp op) {
  int base, win, al, bi;
  return attn_layout(op, &base, &win, &al, &bi) ? al : -1;
}
int ir_attn_bias_attr(IrOp op) {
  int base, win, al, bi;
  return attn_layout(op, &base, &win, &al, &bi) ? bi : -1;
}
int ir_attn_slope(const IrNode *n) {
  int base, win, al, bi;
  return attn_layout(n->op, &base, &win, &al, &bi) && n->ia[al] && n->nin > base ? base : -1;
}
int ir_attn_bias(const IrNode *n) {
  int base, win, al, bi;
  if (!attn_layout(n->op, &base, &win, &al, &bi) || bi < 0 || !n->ia[bi]) return -1;
  int at = base + (n->ia[al] != 0);
  return n->nin > at ? at : -1;
}
int ir_attn_doc(const IrNode *n) {
  int base, win, al, bi;
  if (!attn_layout(n->op, &base, &win, &al, &bi)) return -1;
  int at = base + (n->ia[al] != 0) + (bi >= 0 && n->ia[bi] != 0);
  return n->nin > at ? at : -1;
}

const IrOpAttrs *ir_op_attrs(IrOp op) {
  TS_ASSERT((int)op >= 0 && op < IR_OP_COUNT);
  pthread_once(&op_attrs_once, op_attrs_init);
  return &op_attrs[op];
}

int ir_op_reads_16(IrOp op) {
  switch (op) {
  case IR_OP_CAST: case IR_OP_RESHAPE: case IR_OP_PERMUTE: case IR_OP_SLICE: case IR_OP_PAD:
  case IR_OP_CONCAT: case IR_OP_BROADCAST: case IR_OP_SHARD_SLICE: case IR_OP_ASSIGN:
  case IR_OP_STASH: case IR_OP_SLICE_AT: case IR_OP_KV_WRITE: case IR_OP_ALL_GATHER:
  case IR_OP_SEND:   /* a pipeline message carries the value as stored */
  case IR_OP_QUANT8: case IR_OP_AMAX_ACC:   /* fp8: read bf16 activations, f32 arithmetic inside */
    return 1;
  default:
    return (ir_ops[op].flags & OPF_MIXED) != 0;   /* a GEMM: f32 accumulation of 16-bit products */
  }
}

int ir_op_reads_8(IrOp op) {
  if (op == IR_OP_MATMUL8) return 1;
  return ir_op_reads_16(op) && !(ir_ops[op].flags & OPF_MIXED);   /* moves or converts bytes */
}

int ir_op_communicates(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER: case IR_OP_ALL_TO_ALL:
  case IR_OP_ALL_TO_ALL_V: case IR_OP_RING_SHIFT: case IR_OP_SEND: case IR_OP_RECV: case IR_OP_GROUP_SUM:
    return 1;
  default:
    return 0;
  }
}

void ir_block_states_written(const IrModule *m, const IrBlock *b, unsigned char *written) {
  memset(written, 0, (size_t)m->states.n);
  for (int i = 0; i < b->n; i++) {
    const IrNode *nd = &b->nodes[i];
    if (!(ir_ops[nd->op].flags & OPF_EFFECT)) continue;
    for (int k = 0; k < IR_MAX_IATTR; k++)
      if (ir_op_iattr_is_state(nd->op, k) && nd->ia[k] >= 0 && nd->ia[k] < m->states.n) written[nd->ia[k]] = 1;
  }
}

int ir_op_iattr_is_state(IrOp op, int slot) {
  if ((int)op < 0 || op >= IR_OP_COUNT) return 0;
  const IrOpAttrs *a = ir_op_attrs(op);
  return slot >= 0 && slot < a->ni && a->is_state[slot];
}

int ir_op_iattr_count(IrOp op, int rank0) {
  const IrOpAttrs *a = ir_op_attrs(op);
  if (a->list < 0) return a->ni;
  int n = a->list + (rank0 > 0 ? rank0 : 0);
  return n > IR_MAX_IATTR ? IR_MAX_IATTR : n;
}

/* Markdown table of the op table, pasted into docs/ir.md (a test checks
 * that the doc still contains exactly this text). */
void ir_ops_markdown(StrBuf *out) {
  sb_puts(out, "| op | operands | int attrs | float attrs | flags | description |\n");
  sb_puts(out, "|----|----------|-----------|-------------|-------|-------------|\n");
  static const char *flag_names[] = {"leaf", "ew", "typed", "effect", "nodiff", "late", "mixed"};
  enum { NFLAGS = (int)(sizeof flag_names / sizeof flag_names[0]) };
  _Static_assert(OPF_MIXED == 1 << (NFLAGS - 1), "a name for every op flag");
  for (int i = 0; i < IR_OP_COUNT; i++) {
    const IrOpInfo *o = &ir_ops[i];
    sb_printf(out, "| `%s` | ", o->name);
    if (o->nin < 0) sb_puts(out, "1+");
    else sb_printf(out, "%d", o->nin);
    sb_printf(out, " | %s | %s | ", *o->iattrs ? o->iattrs : "-", *o->fattrs ? o->fattrs : "-");
    int any = 0;
    for (int f = 0; f < NFLAGS; f++)
      if (o->flags & (1u << f)) { sb_printf(out, "%s%s", any ? ", " : "", flag_names[f]); any = 1; }
    if (!any) sb_puts(out, "-");
    sb_puts(out, " | ");
    for (const char *d = o->doc; *d; d++) {   /* '|' would end the cell */
      if (*d == '|') sb_puts(out, "\\|");
      else sb_putc(out, *d);
    }
    sb_puts(out, " |\n");
  }
}

/* ---- dtypes and types ---- */
static const char *dtype_names[IR_DTYPE_COUNT] = {"void", "f32", "f64", "i32", "bf16", "f16", "f8e4m3", "f8e5m2"};

const char *ir_dtype_name(IrDtype t) {
  return (int)t >= 0 && t < IR_DTYPE_COUNT ? dtype_names[t] : "?";
}
int ir_dtype_lookup(const char *name) {
  for (int i = 0; name && i < IR_DTYPE_COUNT; i++)
    if (strcmp(dtype_names[i], name) == 0) return i;
  return -1;
}
size_t ir_dtype_size(IrDtype t) {
  switch (t) {
  case IR_F32: case IR_I32: return 4;
  case IR_F64: return 8;
  case IR_BF16: case IR_F16: return 2;
  case IR_F8E4M3: case IR_F8E5M2: return 1;
  default: return 0;
  }
}

int64_t ir_type_numel(const IrType *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dim[i];
  return n;
}

int ir_type_same_shape(const IrType *a, const IrType *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return 0;
  return 1;
}

int ir_type_equal(const IrType *a, const IrType *b) {
  if (!ir_type_same_shape(a, b)) return 0;
  for (int i = 0; i < a->rank; i++)   /* interned: pointer equality */
    if (a->dname[i] != b->dname[i]) return 0;
  return 1;
}

char *ir_type_str(const IrType *t, char *buf, size_t n) {
  if (!n) return buf;
  size_t k = 0;
  buf[0] = 0;
#define PUT(...) do { if (k < n) { int w_ = snprintf(buf + k, n - k, __VA_ARGS__); \
                        if (w_ > 0) k += (size_t)w_; } } while (0)
  PUT("%s[", ir_dtype_name(t->dtype));
  for (int i = 0; i < t->rank && i < IR_MAX_RANK; i++) {
    if (i) PUT(", ");
    if (t->dname[i]) PUT("%s:", t->dname[i]);
    PUT("%lld", (long long)t->dim[i]);
  }
  PUT("]");
#undef PUT
  return buf;
}

/* ---- names of the small enums ---- */
const char *ir_state_kind_name(IrStateKind k) {
  static const char *s[] = {"param", "grad", "adam_m", "adam_v", "cache", "copy", "shard", "scaler", "fp8"};
  return (int)k >= 0 && k < IR_STATE_KIND_COUNT ? s[k] : "?";
}
const char *ir_init_kind_name(IrInitKind k) {
  static const char *s[] = {"zeros", "ones", "normal", "uniform"};
  return (int)k >= 0 && k < IR_INIT_KIND_COUNT ? s[k] : "?";
}
const char *ir_schedule_name(IrSchedule s) {
  static const char *n[] = {"constant", "cosine", "linear", "wsd", "inverse_sqrt"};
  return (int)s >= 0 && s < IR_SCHED_COUNT ? n[s] : "?";
}

const char *ir_wsd_style_name(IrWsdStyle s) {
  static const char *n[] = {"linear", "cosine", "exponential", "minus_sqrt"};
  return (int)s >= 0 && s < IR_WSD_COUNT ? n[s] : "?";
}
const char *ir_muon_tp_name(IrMuonTp t) {
  static const char *n[] = {"auto", "allreduce", "gather"};
  return (int)t >= 0 && t < IR_MUON_TP_COUNT ? n[t] : "?";
}
const char *ir_optimizer_name(IrOptimizer o) {
  static const char *n[] = {"adamw", "sgd", "lion", "muon"};
  return (int)o >= 0 && o < IR_OPT_COUNT ? n[o] : "?";
}

const char *ir_pipe_sched_name(IrPipeSched s) {
  static const char *n[] = {"none", "gpipe", "1f1b", "interleaved", "zb-h1"};
  return (int)s >= 0 && s < IR_PIPE_COUNT ? n[s] : "?";
}

int ir_block_chunk_kind(const IrBlock *b, IrChunkKind *kind) {
  static const struct { const char *prefix; size_t len; IrChunkKind kind; } k[] = {
      {"fwd.", 4, IR_CHUNK_FWD}, {"bwd.", 4, IR_CHUNK_BWD}, {"eval.", 5, IR_CHUNK_EVAL}, {"wgt.", 4, IR_CHUNK_WGT}};
  const char *s = b->name ? b->name : "";
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    if (strncmp(s, k[i].prefix, k[i].len) != 0) continue;
    char *end;
    long g = strtol(s + k[i].len, &end, 10);
    if (end == s + k[i].len || *end || g < 0 || g > INT32_MAX || !isdigit((unsigned char)s[k[i].len])) return -1;
    if (kind) *kind = k[i].kind;
    return (int)g;
  }
  return -1;
}

int ir_block_chunk(const IrBlock *b, int *bwd) {
  IrChunkKind kind;
  int g = ir_block_chunk_kind(b, &kind);
  if (g >= 0 && bwd) *bwd = kind == IR_CHUNK_BWD || kind == IR_CHUNK_WGT;
  return g;
}

/* ---- modules ---- */
void ir_train_defaults(IrTrain *t) {
  memset(t, 0, sizeof *t);
  t->lr = 3e-4;
  t->beta1 = 0.9;
  t->beta2 = 0.95;
  t->eps = 1e-8;
  t->weight_decay = 0.0;
  t->optimizer = IR_OPT_ADAMW;
  t->momentum = 0.9;        /* Megatron's --sgd-momentum default */
  t->nesterov = 0;
  t->muon_momentum = 0.95;  /* Muon's reference default */
  t->muon_ns_steps = 5;
  t->muon_adamw_lr = 0;     /* the AdamW group at Muon's lr, as before there was a choice */
  t->schedule = IR_SCHED_CONSTANT;
  t->wsd_style = IR_WSD_LINEAR;
  t->wsd_decay_steps = 0;
  t->warmup = 0;
  t->decay_steps = 0;       /* 0 = decay over all `steps` */
  t->min_lr = 0.0;
  t->clip_grad = 0.0;
  t->global_batch = 1;
  t->micro_batch = 1;
  t->seq_len = 0;
  t->steps = 100;
  t->seed = 1234;
  t->precision = IR_F32;
  t->lowp = IR_VOID;
}

/* ir_state_find's index (below) */
struct IrStateIx {
  int n, cap, used;
  int *slot;
};

IrModule *ir_module_new(const char *name) {
  IrModule *m = ts_xcalloc(1, sizeof *m);
  arena_init(&m->arena);
  m->name = ts_intern(name ? name : "module");
  m->state_ix = ts_xcalloc(1, sizeof *m->state_ix);
  ir_train_defaults(&m->train);
  return m;   /* parallel: all zero (= 1 / unset), filled by the frontend */
}

void ir_module_free(IrModule *m) {
  if (!m) return;
  free(m->consts.a);
  free(m->states.a);
  free(m->blocks.a);     /* block node arrays are in the arena */
  free(m->rules.a);
  if (m->state_ix) free(m->state_ix->slot);
  free(m->state_ix);
  arena_free(&m->arena);
  free(m);
}

/* ---- mesh axes and shardings ---- */
static const char *const axis_names[IR_AXIS_COUNT] = {"dp", "pp", "cp", "ep", "tp"};
const char *ir_axis_name(IrAxis a) { return (int)a >= 0 && a < IR_AXIS_COUNT ? axis_names[a] : "?"; }
int ir_axis_lookup(const char *name) {
  for (int a = 0; name && a < IR_AXIS_COUNT; a++)
    if (strcmp(name, axis_names[a]) == 0) return a;
  return -1;
}
int ir_axis_size(const IrModule *m, IrAxis a) {
  int v = 1;
  switch (a) {
  case IR_AXIS_DP: v = m->par.dp; break;
  case IR_AXIS_PP: v = m->par.pp; break;
  case IR_AXIS_CP: v = m->par.cp; break;
  case IR_AXIS_EP: v = m->par.ep; break;
  case IR_AXIS_TP: v = m->par.tp; break;
  default: break;
  }
  return v < 1 ? 1 : v;
}
int ir_axes_size(const IrModule *m, int64_t v) {
  unsigned mask = ir_axes_mask(v);
  int k = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (mask & (1u << a)) k *= ir_axis_size(m, (IrAxis)a);
  return k;
}
int64_t ir_axes_attr(unsigned mask) {
  mask &= (1u << IR_AXIS_COUNT) - 1;
  if (mask && !(mask & (mask - 1)))
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (mask == 1u << a) return a;
  return IR_AXES_SET | (int64_t)mask;
}
char *ir_axes_str(int64_t v, char *buf, size_t n) {
  unsigned mask = ir_axes_mask(v);
  size_t k = 0;
  if (n) buf[0] = 0;
  if (!mask) { snprintf(buf, n, "?"); return buf; }
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if ((mask & (1u << a)) && k < n) k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? "+" : "", axis_names[a]);
  return buf;
}
int ir_sharding_equal(const IrSharding *a, const IrSharding *b) { return memcmp(a, b, sizeof *a) == 0; }

static void put_axes(StrBuf *b, unsigned mask) {
  int first = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (mask & (1u << a)) { sb_printf(b, "%s%s", first ? "" : "+", axis_names[a]); first = 0; }
}
char *ir_sharding_str(const IrSharding *s, int rank, char *buf, size_t n) {
  StrBuf b = {0};
  int any = 0;
  for (int d = 0; d < rank && d < IR_MAX_RANK; d++) {
    if (!s->split[d]) continue;
    sb_printf(&b, "%s%d:", any++ ? ", " : "{", d);
    if (ir_split_cp_minor(s->split[d])) {   /* cp innermost and contiguous: written last, starred */
      unsigned rest = s->split[d] & ~(IR_SPLIT_CP_MINOR | (1u << IR_AXIS_CP)) & ((1u << IR_AXIS_COUNT) - 1);
      put_axes(&b, rest);
      sb_printf(&b, "%scp*", rest ? "+" : "");
    } else {
      put_axes(&b, s->split[d]);
    }
  }
  if (s->partial) { sb_printf(&b, "%spartial:", any++ ? ", " : "{"); put_axes(&b, s->partial); }
  if (s->flat) { sb_printf(&b, "%sflat:", any++ ? ", " : "{"); put_axes(&b, s->flat); }
  if (any) sb_putc(&b, '}');
  snprintf(buf, n, "%s", b.p ? b.p : "");
  sb_free(&b);
  return buf;
}

int ir_value_materialized(const IrBlock *b, int i) {
  const IrNode *n = &b->nodes[i];
  if (n->type.dtype == IR_VOID) return 0;
  if (n->group <= 0) return 1;
  for (int j = i + 1; j < b->n; j++) {
    const IrNode *u = &b->nodes[j];
    if (u->group == n->group) continue;
    for (int k = 0; k < u->nin; k++)
      if (u->in[k] == i) return 1;
  }
  return 0;
}

/* Deep copy into a fresh arena. */
IrModule *ir_module_clone(const IrModule *m) {
  IrModule *c = ir_module_new(m->name);
  c->train = m->train;
  c->par = m->par;
  for (int i = 0; i < m->consts.n; i++) VEC_PUSH(c->consts, m->consts.a[i]);
  for (int i = 0; i < m->states.n; i++) VEC_PUSH(c->states, m->states.a[i]);
  for (int i = 0; i < m->rules.n; i++) VEC_PUSH(c->rules, m->rules.a[i]);
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrBlock nb = {b->name, NULL, b->n, b->n};
    if (b->n) {
      nb.nodes = arena_alloc(&c->arena, (size_t)b->n * sizeof *nb.nodes);
      for (int i = 0; i < b->n; i++) {
        IrNode *d = &nb.nodes[i];
        *d = b->nodes[i];
        if (d->nin > 0) {
          d->in = arena_alloc(&c->arena, (size_t)d->nin * sizeof *d->in);
          memcpy(d->in, b->nodes[i].in, (size_t)d->nin * sizeof *d->in);
        } else {
          d->in = NULL;
        }
      }
    }
    VEC_PUSH(c->blocks, nb);
  }
  return c;
}

int ir_block_add(IrModule *m, const char *name) {
  IrBlock b = {ts_intern(name), NULL, 0, 0};
  VEC_PUSH(m->blocks, b);
  return m->blocks.n - 1;
}

int ir_block_find(const IrModule *m, const char *name) {
  const char *s = ts_intern(name);
  for (int i = 0; i < m->blocks.n; i++)
    if (m->blocks.a[i].name == s) return i;
  return -1;
}

int ir_state_add(IrModule *m, const IrState *s) {
  IrState c = *s;
  c.name = ts_intern(s->name);
  for (int i = 0; i < c.type.rank && i < IR_MAX_RANK; i++) c.type.dname[i] = ts_intern(c.type.dname[i]);
  VEC_PUSH(m->states, c);
  return m->states.n - 1;
}

/* ir_state_find's index: interned name -> the first state of that name,
 * open addressing over the name pointers (slot = state index + 1, 0
 * empty), covering states [0, n).  States appended since are added at the
 * next lookup; ir_states_truncate empties it.  A hit is checked against
 * the state's current name, so a stale index never gives a wrong state. */

static size_t ix_hash(const char *p, int cap) {
  return (size_t)(((uintptr_t)p >> 3) * 0x9e3779b97f4a7c15ull >> 17) & (size_t)(cap - 1);
}

static void ix_clear(struct IrStateIx *x) {
  if (x->slot) memset(x->slot, 0, (size_t)x->cap * sizeof *x->slot);
  x->n = x->used = 0;
}

static int ix_get(const struct IrStateIx *x, const IrModule *m, const char *s) {
  if (!x->cap) return -1;
  for (size_t j = ix_hash(s, x->cap);; j = (j + 1) & (size_t)(x->cap - 1)) {
    int v = x->slot[j] - 1;
    if (v < 0) return -1;
    if (v < m->states.n && m->states.a[v].name == s) return v;
  }
}

static void ix_put(struct IrStateIx *x, const IrModule *m, int i) {
  if (2 * (x->used + 1) > x->cap) {   /* grow: re-insert states [0, i) */
    free(x->slot);
    x->cap = x->cap ? 2 * x->cap : 64;
    while (2 * (i + 1) > x->cap) x->cap *= 2;
    x->slot = ts_xcalloc((size_t)x->cap, sizeof *x->slot);
    x->used = 0;
    for (int k = 0; k < i; k++) ix_put(x, m, k);
  }
  const char *s = m->states.a[i].name;
  size_t j = ix_hash(s, x->cap);
  for (; x->slot[j]; j = (j + 1) & (size_t)(x->cap - 1))
    if (m->states.a[x->slot[j] - 1].name == s) return;   /* a duplicate: the first one stays */
  x->slot[j] = i + 1;
  x->used++;
}

int ir_state_find(const IrModule *m, const char *name) {
  const char *s = ts_intern(name);
  struct IrStateIx *x = m->state_ix;
  if (!x) {
    for (int i = 0; i < m->states.n; i++)
      if (m->states.a[i].name == s) return i;
    return -1;
  }
  if (x->n > m->states.n) ix_clear(x);   /* states were removed without ir_states_truncate */
  for (; x->n < m->states.n; x->n++) ix_put(x, m, x->n);
  return ix_get(x, m, s);
}

size_t ir_state_bytes(const IrState *s) {
  if (s->kind == IR_STATE_PARAM && (s->flags & IR_STATE_SHARDED)) return 0;
  int64_t n = ir_type_numel(&s->type);
  return n > 0 ? (size_t)n * ir_dtype_size(s->type.dtype) : 0;
}

int ir_state_shard_of(const IrModule *m, int p) {
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_SHARD && m->states.a[s].of == p) return s;
  return -1;
}

void ir_states_truncate(IrModule *m, int n) {
  if (n >= 0 && n < m->states.n) m->states.n = n;
  if (m->state_ix) ix_clear(m->state_ix);
}

void ir_states_drop(IrModule *m, const unsigned char *drop) {
  int n = m->states.n, k = 0;
  int *to = ts_xcalloc((size_t)n + 1, sizeof *to);
  for (int s = 0; s < n; s++) to[s] = drop[s] ? -1 : k++;
  for (int s = 0; s < n; s++) {
    if (drop[s]) continue;
    IrState st = m->states.a[s];
    if (st.of >= 0 && st.of < n) {
      TS_ASSERT(to[st.of] >= 0);
      st.of = to[st.of];
    }
    m->states.a[to[s]] = st;
  }
  for (int b = 0; b < m->blocks.n; b++)
    for (int i = 0; i < m->blocks.a[b].n; i++) {
      IrNode *nd = &m->blocks.a[b].nodes[i];
      for (int j = 0; j < IR_MAX_IATTR; j++)
        if (ir_op_iattr_is_state(nd->op, j) && nd->ia[j] >= 0 && nd->ia[j] < n) {
          TS_ASSERT(to[nd->ia[j]] >= 0);
          nd->ia[j] = to[nd->ia[j]];
        }
    }
  free(to);
  ir_states_truncate(m, k);
}

int ir_state_derived(IrModule *m, int p, IrStateKind kind, const char *prefix,
                     char *err, size_t errlen) {
  IrState ps = m->states.a[p];
  char name[512];
  snprintf(name, sizeof name, "%s.%s", prefix, ps.name);
  int s = ir_state_find(m, name);
  if (s >= 0) {
    const IrState *d = &m->states.a[s];
    if (d->kind == kind && d->of == p && ir_type_same_shape(&d->type, &ps.type)) return s;
    return ts_errf(err, errlen, "state @%s exists and is not the %s of @%s", name,
                   ir_state_kind_name(kind), ps.name);
  }
  IrState d = {0};
  d.name = name;
  d.type = ps.type;
  d.sh = ps.sh;              /* a gradient or moment is laid out like its parameter */
  memcpy(d.logical, ps.logical, sizeof d.logical);
  d.kind = kind;
  d.init = IR_INIT_ZEROS;
  d.of = p;
  return ir_state_add(m, &d);
}

/* Grows a block's node array inside the module arena (old arrays are
 * abandoned to the arena: at most 2x the final size in total). */
static void block_reserve(IrModule *m, IrBlock *b, int need) {
  if (need <= b->cap) return;
  int cap = b->cap ? 2 * b->cap : 16;
  while (cap < need) cap *= 2;
  IrNode *nodes = arena_alloc(&m->arena, (size_t)cap * sizeof *nodes);
  if (b->n) memcpy(nodes, b->nodes, (size_t)b->n * sizeof *nodes);
  b->nodes = nodes;
  b->cap = cap;
}

int ir_emit(IrModule *m, int b, IrOp op, const int *in, int nin,
            const int64_t *ia, const double *fa, const char *sa,
            const IrType *type, char *err, size_t errlen) {
  if ((int)op < 0 || op >= IR_OP_COUNT) return ts_errf(err, errlen, "ir_emit: bad op %d", (int)op);
  const char *opn = ir_ops[op].name;
  if (b < 0 || b >= m->blocks.n) return ts_errf(err, errlen, "%s: no block %d", opn, b);
  IrBlock *blk = &m->blocks.a[b];
  if (nin < 0 || nin > 4096 || (nin > 0 && !in))
    return ts_errf(err, errlen, "%s: bad operand list (%d operands)", opn, nin);

  IrNode n;
  memset(&n, 0, sizeof n);
  n.op = op;
  n.nin = nin;
  n.in = (int *)in;          /* borrowed until the shape rule accepted it */
  /* Copy only the attr slots the op names: callers pass short arrays. */
  int rank0 = 0;
  if (nin > 0 && in[0] >= 0 && in[0] < blk->n) rank0 = blk->nodes[in[0]].type.rank;
  int ni = ir_op_iattr_count(op, rank0);
  if (ia) memcpy(n.ia, ia, (size_t)ni * sizeof *ia);
  int nf = ir_op_attrs(op)->nf;
  if (fa) memcpy(n.fa, fa, (size_t)nf * sizeof *fa);
  n.sa = ts_intern(sa);
  if (ir_ops[op].flags & OPF_TYPED) {
    if (!type) return ts_errf(err, errlen, "%s: the result type must be given", opn);
    n.type = *type;
    for (int i = 0; i < n.type.rank && i < IR_MAX_RANK; i++) n.type.dname[i] = ts_intern(n.type.dname[i]);
  }
  if ((ir_ops[op].flags & OPF_MIXED) && type) n.type.dtype = type->dtype;   /* the shape rule checks it */

  IrType out;
  if (ir_infer_type(m, blk, &n, &out, err, errlen) != 0) return -1;

  if (nin > 0) {
    n.in = arena_alloc(&m->arena, (size_t)nin * sizeof *n.in);
    memcpy(n.in, in, (size_t)nin * sizeof *n.in);
  } else {
    n.in = NULL;
  }
  n.type = out;
  block_reserve(m, blk, blk->n + 1);
  blk->nodes[blk->n] = n;
  return blk->n++;
}
