/* plan.c - the plan file: binary encode/decode, text print/parse, and the
 * file functions mcc and mrun use (see plan.h for the on-disk header).
 *
 * Binary payload: a sequence of tagged, length-prefixed records
 *     u32 tag | u32 body length | body
 * all little-endian.  Top level, in this order:
 *     MESH  u32 dp pp cp ep tp
 *     SRC   str source
 *     PROG  one IrModule (repeated, once per program; see enc_module)
 *     RANK  u32 nranks, then u32 program index per rank
 * Primitive encodings: u8/u32/i32/u64/i64 fixed width; f64 as its IEEE
 * bits (so every value, -0.0 and NaN payloads included, survives); str as
 * u32 length + bytes, length 0xFFFFFFFF meaning NULL.  Ops are stored by
 * NAME, so renumbering ops.def does not invalidate old plans.
 *
 * Decoding trusts nothing: every read is bounds-checked against its
 * record, every count is checked against the bytes left before anything
 * is allocated for it, every enum and index is range-checked, and each
 * decoded program must pass ir_verify.  Failures return NULL with a
 * message; they never crash (tests feed corrupted bytes).
 *
 * Text form (mcc --emit=plan-text): a small header
 *     tessera-plan 2
 *     mesh dp=1 pp=1 cp=1 ep=1 tp=1
 *     source "samples/gpt.mdl"
 *     ranks 1
 *     rank 0 program 0
 * then per program a line `program K` followed by ir_print_module's text.
 * Both forms hold exactly the same content: encode(parse_text(print_text(p)))
 * == encode(p) byte for byte.  A NULL source and "" are the same thing
 * (both print as ""; both decode to NULL).
 *
 * Version 2 added shardings (after each node's and state's type: u8 per
 * dim, then u8 partial, u8 flat; nodes then an i32 fusion group), the states' logical sizes (u8 count,
 * i64 each) and the RULE record (after PARL).  Version 1 plans are refused
 * ("recompile the plan"): they predate sharding.
 * Pipeline programs (pp > 1) add, within version 2 and only when set (so
 * other plans are byte for byte what they were): three i32 at the end of
 * PARL (vpp, schedule, stage), and a STGE record after the blocks holding
 * the nodes' stage tags (u32 count, then u32 block, u32 node, i32 tag). */
#include "plan/plan.h"
#include <errno.h>
#include <sys/stat.h>
#include <stdarg.h>

#define PLAN_MAGIC "TSPLAN\0\0"
#define PLAN_HEADER 32               /* magic 8 | version 4 | flags 4 | len 8 | sum 8 */
#define PLAN_CHECKSUM_SEED 0   /* plan.h: "ts_hash64 of the payload" */
#define STR_NULL 0xFFFFFFFFu

#define TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define TAG_MESH TAG('M', 'E', 'S', 'H')
#define TAG_SRC  TAG('S', 'R', 'C', ' ')
#define TAG_PROG TAG('P', 'R', 'O', 'G')
#define TAG_RANK TAG('R', 'A', 'N', 'K')
/* records inside PROG */
#define TAG_NAME TAG('N', 'A', 'M', 'E')
#define TAG_CNST TAG('C', 'N', 'S', 'T')
#define TAG_TRAN TAG('T', 'R', 'A', 'N')
#define TAG_PARL TAG('P', 'A', 'R', 'L')
#define TAG_STAT TAG('S', 'T', 'A', 'T')
#define TAG_BLCK TAG('B', 'L', 'C', 'K')
#define TAG_RULE TAG('R', 'U', 'L', 'E')
#define TAG_STGE TAG('S', 'T', 'G', 'E')
#define TAG_CUDA TAG('C', 'U', 'D', 'A')

Plan *plan_new(void) {
  Plan *p = ts_xcalloc(1, sizeof *p);
  p->version = PLAN_VERSION;
  p->mesh = (PlanMesh){1, 1, 1, 1, 1};
  return p;
}

static void image_free(PlanImage *im) {
  free(im->ptx);
  free(im->cubin);
  free(im->kern);
}

void plan_add_image(Plan *p, const PlanImage *im) {
  p->images = realloc(p->images, (size_t)(p->nimages + 1) * sizeof *p->images);
  TS_ASSERT(p->images);
  PlanImage *c = &p->images[p->nimages++];
  *c = *im;
  c->ptx = ts_xmalloc(im->ptx_len + 1);
  memcpy(c->ptx, im->ptx ? im->ptx : "", im->ptx_len);
  c->ptx[im->ptx_len] = 0;
  c->cubin = ts_xmalloc(im->cubin_len ? im->cubin_len : 1);
  if (im->cubin_len) memcpy(c->cubin, im->cubin, im->cubin_len);
  c->kern = ts_xcalloc((size_t)(im->nkern ? im->nkern : 1), sizeof *c->kern);
  if (im->nkern) memcpy(c->kern, im->kern, (size_t)im->nkern * sizeof *c->kern);
}

const PlanImage *plan_image(const Plan *p, int program, int sm) {
  for (int i = 0; i < p->nimages; i++)
    if (p->images[i].program == program && p->images[i].sm == sm) return &p->images[i];
  return NULL;
}

void plan_free(Plan *p) {
  if (!p) return;
  for (int i = 0; i < p->nimages; i++) image_free(&p->images[i]);
  free(p->images);
  for (int i = 0; i < p->nprograms; i++) ir_module_free(p->programs[i]);
  free(p->programs);
  free(p->rank_program);
  free(p);           /* source is interned: process-wide, never freed */
}

/* ======================================================================
 * Encoding
 * ====================================================================== */

static void put_u8(StrBuf *b, unsigned v) { unsigned char c = (unsigned char)v; sb_write(b, &c, 1); }
static void put_u32(StrBuf *b, uint32_t v) {
  unsigned char c[4];
  for (int i = 0; i < 4; i++) c[i] = (unsigned char)(v >> (8 * i));
  sb_write(b, c, 4);
}
static void put_u64(StrBuf *b, uint64_t v) {
  unsigned char c[8];
  for (int i = 0; i < 8; i++) c[i] = (unsigned char)(v >> (8 * i));
  sb_write(b, c, 8);
}
static void put_i32(StrBuf *b, int32_t v) { put_u32(b, (uint32_t)v); }
static void put_i64(StrBuf *b, int64_t v) { put_u64(b, (uint64_t)v); }
static void put_f64(StrBuf *b, double v) { uint64_t u; memcpy(&u, &v, 8); put_u64(b, u); }
static void put_str(StrBuf *b, const char *s) {
  if (!s) { put_u32(b, STR_NULL); return; }
  size_t n = strlen(s);
  TS_ASSERT(n < STR_NULL);
  put_u32(b, (uint32_t)n);
  sb_write(b, s, n);
}

/* Starts a record; returns the offset of its length field for rec_end. */
static size_t rec_begin(StrBuf *b, uint32_t tag) {
  put_u32(b, tag);
  put_u32(b, 0);
  return b->n - 4;
}
static void rec_end(StrBuf *b, size_t at) {
  size_t len = b->n - at - 4;
  TS_ASSERT(len < 0xFFFFFFFFu);
  for (int i = 0; i < 4; i++) b->p[at + i] = (char)(unsigned char)(len >> (8 * i));
}

static void enc_type(StrBuf *b, const IrType *t) {
  put_u8(b, (unsigned)t->dtype);
  put_u8(b, (unsigned)t->rank);
  for (int i = 0; i < t->rank; i++) {
    put_i64(b, t->dim[i]);
    put_str(b, t->dname[i]);
  }
}
static void enc_sharding(StrBuf *b, const IrSharding *sh, int rank) {
  for (int i = 0; i < rank; i++) put_u8(b, sh->split[i]);
  put_u8(b, sh->partial);
  put_u8(b, sh->flat);
}

/* Attr slots are stored up to the last non-zero one (bitwise, so -0.0 is
 * kept): unused slots are zero in every node, so this is exact and keeps
 * one canonical encoding per node. */
static int used_ia(const IrNode *n) {
  int k = IR_MAX_IATTR;
  while (k > 0 && n->ia[k - 1] == 0) k--;
  return k;
}
static int used_fa(const IrNode *n) {
  static const double zero = 0.0;
  int k = IR_MAX_FATTR;
  while (k > 0 && memcmp(&n->fa[k - 1], &zero, sizeof zero) == 0) k--;
  return k;
}

static void enc_node(StrBuf *b, const IrNode *n) {
  put_str(b, ir_ops[n->op].name);
  put_u32(b, (uint32_t)n->nin);
  for (int i = 0; i < n->nin; i++) put_u32(b, (uint32_t)n->in[i]);
  int ni = used_ia(n), nf = used_fa(n);
  put_u8(b, (unsigned)ni);
  for (int i = 0; i < ni; i++) put_i64(b, n->ia[i]);
  put_u8(b, (unsigned)nf);
  for (int i = 0; i < nf; i++) put_f64(b, n->fa[i]);
  put_str(b, n->sa);
  enc_type(b, &n->type);
  enc_sharding(b, &n->sh, n->type.rank);
  put_i32(b, n->group);
}

static void enc_train(StrBuf *b, const IrTrain *t) {
  put_f64(b, t->lr); put_f64(b, t->beta1); put_f64(b, t->beta2);
  put_f64(b, t->eps); put_f64(b, t->weight_decay);
  put_u32(b, (uint32_t)t->schedule);
  put_i64(b, t->warmup); put_i64(b, t->decay_steps);
  put_f64(b, t->min_lr); put_f64(b, t->clip_grad);
  put_i64(b, t->global_batch); put_i64(b, t->micro_batch);
  put_i64(b, t->seq_len); put_i64(b, t->steps);
  put_u64(b, t->seed);
  put_u32(b, (uint32_t)(t->lowp != IR_VOID ? t->lowp : t->precision));   /* as the text form: bf16 = f32 + lowp */
  put_u32(b, (uint32_t)t->optimizer); put_f64(b, t->momentum); put_u32(b, (uint32_t)t->nesterov);
  put_f64(b, t->muon_momentum); put_u32(b, (uint32_t)t->muon_ns_steps);
  put_u32(b, (uint32_t)t->wsd_style); put_i64(b, t->wsd_decay_steps);
  put_u32(b, (uint32_t)t->muon_tp);
  put_f64(b, t->muon_adamw_lr);
  if (ir_train_rampup(t)) {   /* only when on (within version 4): other plans' bytes stay as they were */
    put_i64(b, t->rampup_start); put_i64(b, t->rampup_incr); put_i64(b, t->rampup_samples);
  }
}

static void enc_module(StrBuf *b, const IrModule *m) {
  size_t r = rec_begin(b, TAG_NAME);
  put_str(b, m->name);
  rec_end(b, r);

  r = rec_begin(b, TAG_CNST);
  put_u32(b, (uint32_t)m->consts.n);
  for (int i = 0; i < m->consts.n; i++) {
    const IrConst *c = &m->consts.a[i];
    put_str(b, c->name);
    put_u8(b, c->is_float ? 1 : 0);
    put_i64(b, c->i);
    put_f64(b, c->f);
  }
  rec_end(b, r);

  r = rec_begin(b, TAG_TRAN);
  enc_train(b, &m->train);
  rec_end(b, r);

  r = rec_begin(b, TAG_PARL);
  const IrParallel *q = &m->par;
  put_i32(b, q->tp); put_i32(b, q->pp); put_i32(b, q->cp);
  put_i32(b, q->ep); put_i32(b, q->dp); put_i32(b, q->sp); put_i32(b, q->zero);
  if (q->vpp || q->sched || q->stage) { put_i32(b, q->vpp); put_i32(b, q->sched); put_i32(b, q->stage); }
  rec_end(b, r);

  r = rec_begin(b, TAG_RULE);
  put_u32(b, (uint32_t)m->rules.n);
  for (int i = 0; i < m->rules.n; i++) {
    put_str(b, m->rules.a[i].dim);
    put_u8(b, m->rules.a[i].axes);
  }
  rec_end(b, r);

  r = rec_begin(b, TAG_STAT);
  put_u32(b, (uint32_t)m->states.n);
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
    put_str(b, s->name);
    enc_type(b, &s->type);
    put_u32(b, (uint32_t)s->kind);
    put_u32(b, (uint32_t)s->init);
    put_f64(b, s->init_a);
    put_f64(b, s->init_b);
    put_i32(b, s->of);
    put_u32(b, s->flags);
    enc_sharding(b, &s->sh, s->type.rank);
    int nl = s->type.rank;
    while (nl > 0 && s->logical[nl - 1] == 0) nl--;
    put_u8(b, (unsigned)nl);
    for (int d = 0; d < nl; d++) put_i64(b, s->logical[d]);
  }
  rec_end(b, r);

  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *blk = &m->blocks.a[bi];
    r = rec_begin(b, TAG_BLCK);
    put_str(b, blk->name);
    put_u32(b, (uint32_t)blk->n);
    for (int i = 0; i < blk->n; i++) enc_node(b, &blk->nodes[i]);
    rec_end(b, r);
  }
  uint32_t ntags = 0;
  for (int bi = 0; bi < m->blocks.n; bi++)
    for (int i = 0; i < m->blocks.a[bi].n; i++) ntags += m->blocks.a[bi].nodes[i].stage != 0;
  if (ntags) {
    r = rec_begin(b, TAG_STGE);
    put_u32(b, ntags);
    for (int bi = 0; bi < m->blocks.n; bi++)
      for (int i = 0; i < m->blocks.a[bi].n; i++)
        if (m->blocks.a[bi].nodes[i].stage) {
          put_u32(b, (uint32_t)bi);
          put_u32(b, (uint32_t)i);
          put_i32(b, m->blocks.a[bi].nodes[i].stage);
        }
    rec_end(b, r);
  }
}

static void enc_payload(const Plan *p, StrBuf *b) {
  size_t r = rec_begin(b, TAG_MESH);
  put_u32(b, (uint32_t)p->mesh.dp); put_u32(b, (uint32_t)p->mesh.pp);
  put_u32(b, (uint32_t)p->mesh.cp); put_u32(b, (uint32_t)p->mesh.ep);
  put_u32(b, (uint32_t)p->mesh.tp);
  rec_end(b, r);

  r = rec_begin(b, TAG_SRC);
  put_str(b, p->source && *p->source ? p->source : "");
  rec_end(b, r);

  for (int i = 0; i < p->nprograms; i++) {
    r = rec_begin(b, TAG_PROG);
    enc_module(b, p->programs[i]);
    rec_end(b, r);
  }

  r = rec_begin(b, TAG_RANK);
  put_u32(b, (uint32_t)p->nranks);
  for (int i = 0; i < p->nranks; i++) put_u32(b, (uint32_t)p->rank_program[i]);
  rec_end(b, r);

  if (p->nimages == 0) return;   /* plans without CUDA images stay as they were */
  r = rec_begin(b, TAG_CUDA);
  put_u32(b, (uint32_t)p->nimages);
  for (int i = 0; i < p->nimages; i++) {
    const PlanImage *im = &p->images[i];
    put_u32(b, (uint32_t)im->program);
    put_u32(b, (uint32_t)im->sm);
    put_u64(b, im->source_hash);
    put_u64(b, (uint64_t)im->ptx_len);
    sb_write(b, im->ptx, im->ptx_len);
    put_u64(b, (uint64_t)im->cubin_len);
    sb_write(b, im->cubin, im->cubin_len);
    put_u32(b, (uint32_t)im->nkern);
    for (int k = 0; k < im->nkern; k++) {
      const CgPtxasInfo *q = &im->kern[k];
      put_str(b, q->name);
      put_i32(b, q->registers);
      put_i64(b, q->smem);
      put_i64(b, q->stack);
      put_i64(b, q->spill_stores);
      put_i64(b, q->spill_loads);
      put_i64(b, q->cmem);
    }
  }
  rec_end(b, r);
}

void plan_encode(const Plan *p, StrBuf *out) {
  StrBuf pay = {0};
  enc_payload(p, &pay);
  sb_write(out, PLAN_MAGIC, 8);
  put_u32(out, PLAN_VERSION);
  put_u32(out, 0);                          /* flags: none defined yet */
  put_u64(out, (uint64_t)pay.n);
  put_u64(out, ts_hash64(pay.p, pay.n, PLAN_CHECKSUM_SEED));
  sb_write(out, pay.p, pay.n);
  sb_free(&pay);
}

/* ======================================================================
 * Decoding
 * ====================================================================== */

/* A bounds-checked reader over [p, end).  The first failure sets bad and
 * a message; later reads return zeros, so callers check r->bad once per
 * record or before anything that depends on a value (counts, indices). */
typedef struct {
  const unsigned char *p, *end;
  int bad;
  char *err;
  size_t errlen;
  const char *where;      /* what is being read, for messages */
} Rd;

static int rd_fail(Rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rd_fail(Rd *r, const char *fmt, ...) {
  if (r->bad) return -1;
  r->bad = 1;
  if (r->err && r->errlen) {
    int k = snprintf(r->err, r->errlen, "%s: ", r->where ? r->where : "plan");
    if (k >= 0 && (size_t)k < r->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(r->err + k, r->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

static size_t rd_left(const Rd *r) { return (size_t)(r->end - r->p); }

static const unsigned char *rd_take(Rd *r, size_t n) {
  if (r->bad) return NULL;
  if (rd_left(r) < n) { rd_fail(r, "unexpected end of data"); return NULL; }
  const unsigned char *q = r->p;
  r->p += n;
  return q;
}
static unsigned rd_u8(Rd *r) { const unsigned char *q = rd_take(r, 1); return q ? q[0] : 0; }
static uint32_t rd_u32(Rd *r) {
  const unsigned char *q = rd_take(r, 4);
  uint32_t v = 0;
  for (int i = 0; q && i < 4; i++) v |= (uint32_t)q[i] << (8 * i);
  return v;
}
static uint64_t rd_u64(Rd *r) {
  const unsigned char *q = rd_take(r, 8);
  uint64_t v = 0;
  for (int i = 0; q && i < 8; i++) v |= (uint64_t)q[i] << (8 * i);
  return v;
}
static int32_t rd_i32(Rd *r) { return (int32_t)rd_u32(r); }
static int64_t rd_i64(Rd *r) { return (int64_t)rd_u64(r); }
static double rd_f64(Rd *r) { uint64_t u = rd_u64(r); double d; memcpy(&d, &u, 8); return d; }

/* Strings come back interned (names compare by pointer everywhere). */
static const char *rd_str(Rd *r) {
  uint32_t n = rd_u32(r);
  if (r->bad || n == STR_NULL) return NULL;
  const unsigned char *q = rd_take(r, n);
  if (!q) return NULL;
  if (memchr(q, 0, n)) { rd_fail(r, "string contains a NUL byte"); return NULL; }
  return ts_intern_n((const char *)q, n);
}
/* A name the text form can hold (ir/parse.c's words: a letter or '_',
 * then letters, digits, '_' and '.'), so every plan the binary reader
 * accepts also prints to a text plan that parses back (plan.fuzz found
 * one whose dim name held other bytes). */
static int is_word(const char *s) {
  if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return 0;
  for (s++; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '.'))
      return 0;
  return 1;
}
static const char *rd_name(Rd *r, const char *what) {
  const char *s = rd_str(r);
  if (!r->bad && (!s || !*s)) rd_fail(r, "%s has no name", what);
  else if (!r->bad && !is_word(s)) rd_fail(r, "%s name '%.40s' is not a name (letters, digits, '_' and '.')", what, s);
  return s;
}

/* A count of items that each take at least `min_bytes`: refused when the
 * record cannot possibly hold that many, so a bogus count never turns into
 * a huge allocation. */
static int rd_count(Rd *r, size_t min_bytes, const char *what) {
  uint32_t n = rd_u32(r);
  if (r->bad) return -1;
  if (n > INT32_MAX / 2 || (uint64_t)n * min_bytes > rd_left(r))
    return rd_fail(r, "%s count %u does not fit in the %zu bytes left", what, n, rd_left(r));
  return (int)n;
}

/* Opens the next record, which must have tag `want`: *sub reads its body,
 * r moves past it. */
static int rd_record(Rd *r, uint32_t want, const char *what, Rd *sub) {
  uint32_t tag = rd_u32(r), len = rd_u32(r);
  if (r->bad) return -1;
  if (tag != want) return rd_fail(r, "expected the %s record, found tag 0x%08x", what, tag);
  const unsigned char *q = rd_take(r, len);
  if (!q) return -1;
  *sub = (Rd){q, q + len, 0, r->err, r->errlen, what};
  return 0;
}
/* A record must be read to its end: leftovers mean a writer we don't know. */
static int rd_done(Rd *sub, Rd *parent) {
  if (!sub->bad && rd_left(sub)) rd_fail(sub, "%zu unexpected bytes at the end of the record", rd_left(sub));
  if (sub->bad) parent->bad = 1;
  return sub->bad ? -1 : 0;
}
static uint32_t rd_peek_tag(const Rd *r) {
  if (rd_left(r) < 4) return 0;
  return (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
}

static void rd_type(Rd *r, IrType *t) {
  unsigned dt = rd_u8(r), rank = rd_u8(r);
  if (r->bad) return;
  if (dt >= IR_DTYPE_COUNT) { rd_fail(r, "bad dtype %u", dt); return; }
  if (rank > IR_MAX_RANK) { rd_fail(r, "rank %u exceeds the maximum %d", rank, IR_MAX_RANK); return; }
  memset(t, 0, sizeof *t);
  t->dtype = (IrDtype)dt;
  t->rank = (int)rank;
  for (unsigned i = 0; i < rank && !r->bad; i++) {
    t->dim[i] = rd_i64(r);
    t->dname[i] = rd_str(r);
    if (!r->bad && t->dname[i] && !is_word(t->dname[i])) rd_fail(r, "dim name '%.40s' is not a name", t->dname[i]);
    if (!r->bad && t->dim[i] < 0) rd_fail(r, "negative dim size %lld", (long long)t->dim[i]);
  }
}

static void rd_sharding(Rd *r, IrSharding *sh, int rank) {
  memset(sh, 0, sizeof *sh);
  for (int i = 0; i < rank; i++) sh->split[i] = (uint8_t)rd_u8(r);
  sh->partial = (uint8_t)rd_u8(r);
  sh->flat = (uint8_t)rd_u8(r);
  unsigned all = (1u << IR_AXIS_COUNT) - 1;
  for (int i = 0; i < rank; i++) {
    unsigned minor = sh->split[i] & IR_SPLIT_CP_MINOR;   /* with cp only (ir.h) */
    if ((sh->split[i] & ~all & ~IR_SPLIT_CP_MINOR) || (minor && !(sh->split[i] & (1u << IR_AXIS_CP)))) {
      rd_fail(r, "bad sharding mask 0x%x", sh->split[i]);
      return;
    }
  }
  if ((sh->partial | sh->flat) & ~all) rd_fail(r, "bad sharding mask");
}

static void rd_node(Rd *r, IrModule *m, int id, IrNode *n) {
  const char *opname = rd_str(r);
  if (r->bad) return;
  int op = ir_op_lookup(opname);
  if (op < 0) { rd_fail(r, "node %%%d: unknown op '%s'", id, opname ? opname : "(null)"); return; }
  n->op = (IrOp)op;
  int nin = rd_count(r, 4, "operand");
  if (r->bad) return;
  if (ir_ops[op].nin >= 0 ? nin != ir_ops[op].nin : nin < 1) {
    rd_fail(r, "node %%%d = %s: %d operands", id, opname, nin);
    return;
  }
  n->nin = nin;
  n->in = nin ? arena_alloc(&m->arena, (size_t)nin * sizeof *n->in) : NULL;
  for (int i = 0; i < nin && !r->bad; i++) {
    uint32_t v = rd_u32(r);
    if (!r->bad && v >= (uint32_t)id) { rd_fail(r, "node %%%d = %s: operand %%%u is not an earlier node", id, opname, v); return; }
    n->in[i] = (int)v;
  }
  unsigned ni = rd_u8(r);
  if (!r->bad && ni > IR_MAX_IATTR) { rd_fail(r, "node %%%d: %u int attrs", id, ni); return; }
  for (unsigned i = 0; i < ni && !r->bad; i++) {
    n->ia[i] = rd_i64(r);
    if (!r->bad && ir_op_iattr_is_state(n->op, (int)i) && (n->ia[i] < 0 || n->ia[i] >= m->states.n)) {
      rd_fail(r, "node %%%d = %s: state index %lld out of range", id, opname, (long long)n->ia[i]);
      return;
    }
  }
  unsigned nf = rd_u8(r);
  if (!r->bad && nf > IR_MAX_FATTR) { rd_fail(r, "node %%%d: %u float attrs", id, nf); return; }
  for (unsigned i = 0; i < nf && !r->bad; i++) n->fa[i] = rd_f64(r);
  n->sa = rd_str(r);
  rd_type(r, &n->type);
  if (!r->bad) rd_sharding(r, &n->sh, n->type.rank);
  n->group = rd_i32(r);
  if (!r->bad && n->group < 0) rd_fail(r, "node %%%d: bad fusion group %d", id, n->group);
}

static void rd_block(Rd *r, IrModule *m) {
  const char *name = rd_name(r, "block");
  int nn = rd_count(r, 4 + 4 + 1 + 1 + 4 + 2 + 2 + 4, "node");   /* smallest node */
  if (r->bad) return;
  if (ir_block_find(m, name) >= 0) { rd_fail(r, "block '%s' appears twice", name); return; }
  int bi = ir_block_add(m, name);
  IrBlock *b = &m->blocks.a[bi];
  if (nn == 0) return;
  /* Nodes go straight into the arena (not through ir_emit): the plan
   * holds the types as they were, and ir_verify checks them afterwards. */
  b->nodes = arena_alloc(&m->arena, (size_t)nn * sizeof *b->nodes);
  b->cap = nn;
  for (int i = 0; i < nn && !r->bad; i++) {
    rd_node(r, m, i, &b->nodes[i]);
    if (!r->bad) b->n = i + 1;
  }
}

static void rd_state(Rd *r, IrModule *m, int i, int nstates) {
  IrState s;
  memset(&s, 0, sizeof s);
  s.name = rd_name(r, "state");
  rd_type(r, &s.type);
  uint32_t kind = rd_u32(r), init = rd_u32(r);
  s.init_a = rd_f64(r);
  s.init_b = rd_f64(r);
  s.of = rd_i32(r);
  s.flags = rd_u32(r);
  if (r->bad) return;
  rd_sharding(r, &s.sh, s.type.rank);
  unsigned nl = rd_u8(r);
  if (!r->bad && nl > (unsigned)s.type.rank) { rd_fail(r, "state '%s': %u logical sizes for rank %d", s.name, nl, s.type.rank); return; }
  for (unsigned d = 0; d < nl && !r->bad; d++) {
    s.logical[d] = rd_i64(r);
    if (!r->bad && s.logical[d] < 0) rd_fail(r, "state '%s': negative logical size", s.name);
  }
  if (r->bad) return;
  if (kind >= IR_STATE_KIND_COUNT) { rd_fail(r, "state '%s': bad kind %u", s.name, kind); return; }
  if (init >= IR_INIT_KIND_COUNT) { rd_fail(r, "state '%s': bad init %u", s.name, init); return; }
  if (s.of < -1 || s.of >= nstates || s.of == i) { rd_fail(r, "state '%s': bad 'of' %d", s.name, s.of); return; }
  if (ir_state_find(m, s.name) >= 0) { rd_fail(r, "state '%s' appears twice", s.name); return; }
  s.kind = (IrStateKind)kind;
  s.init = (IrInitKind)init;
  ir_state_add(m, &s);
}

static void rd_train(Rd *r, IrTrain *t) {
  t->lr = rd_f64(r); t->beta1 = rd_f64(r); t->beta2 = rd_f64(r);
  t->eps = rd_f64(r); t->weight_decay = rd_f64(r);
  uint32_t sched = rd_u32(r);
  t->warmup = rd_i64(r); t->decay_steps = rd_i64(r);
  t->min_lr = rd_f64(r); t->clip_grad = rd_f64(r);
  t->global_batch = rd_i64(r); t->micro_batch = rd_i64(r);
  t->seq_len = rd_i64(r); t->steps = rd_i64(r);
  t->seed = rd_u64(r);
  uint32_t prec = rd_u32(r);
  uint32_t opt = rd_u32(r);
  t->momentum = rd_f64(r);
  t->nesterov = (int)rd_u32(r);
  t->muon_momentum = rd_f64(r);
  t->muon_ns_steps = (int)rd_u32(r);
  uint32_t wsd = rd_u32(r);
  t->wsd_decay_steps = rd_i64(r);
  uint32_t mtp = rd_u32(r);
  t->muon_adamw_lr = rd_f64(r);
  if (!r->bad && rd_left(r) >= 24) {   /* a batch-size ramp-up */
    t->rampup_start = rd_i64(r); t->rampup_incr = rd_i64(r); t->rampup_samples = rd_i64(r);
  }
  if (r->bad) return;
  if (mtp >= IR_MUON_TP_COUNT) { rd_fail(r, "bad muon_tp %u", mtp); return; }
  t->muon_tp = (IrMuonTp)mtp;
  if (opt >= IR_OPT_COUNT) { rd_fail(r, "bad optimizer %u", opt); return; }
  if (wsd >= IR_WSD_COUNT) { rd_fail(r, "bad wsd style %u", wsd); return; }
  t->optimizer = (IrOptimizer)opt;
  t->wsd_style = (IrWsdStyle)wsd;
  if (sched >= IR_SCHED_COUNT) { rd_fail(r, "bad schedule %u", sched); return; }
  if (prec >= IR_DTYPE_COUNT) { rd_fail(r, "bad precision %u", prec); return; }
  if (prec != IR_F32 && prec != IR_F64 && !ir_dtype_is_16((IrDtype)prec)) { rd_fail(r, "bad precision %u", prec); return; }
  t->schedule = (IrSchedule)sched;
  t->precision = ir_dtype_is_16((IrDtype)prec) ? IR_F32 : (IrDtype)prec;
  t->lowp = ir_dtype_is_16((IrDtype)prec) ? (IrDtype)prec : IR_VOID;
}

/* One PROG record -> a module, or NULL (r->bad set). */
static IrModule *rd_module(Rd *r) {
  Rd s;
  if (rd_record(r, TAG_NAME, "program name", &s) != 0) return NULL;
  const char *name = rd_name(&s, "module");
  if (rd_done(&s, r) != 0) return NULL;
  IrModule *m = ir_module_new(name);

  if (rd_record(r, TAG_CNST, "consts", &s) != 0) goto bad;
  int nc = rd_count(&s, 4 + 1 + 8 + 8, "const");
  for (int i = 0; i < nc && !s.bad; i++) {
    IrConst c;
    c.name = rd_name(&s, "const");
    c.is_float = (int)rd_u8(&s);
    c.i = rd_i64(&s);
    c.f = rd_f64(&s);
    if (!s.bad && c.is_float > 1) rd_fail(&s, "const '%s': bad flag %d", c.name, c.is_float);
    if (!s.bad) VEC_PUSH(m->consts, c);
  }
  if (rd_done(&s, r) != 0) goto bad;

  if (rd_record(r, TAG_TRAN, "train", &s) != 0) goto bad;
  rd_train(&s, &m->train);
  if (rd_done(&s, r) != 0) goto bad;

  if (rd_record(r, TAG_PARL, "parallel", &s) != 0) goto bad;
  m->par.tp = rd_i32(&s); m->par.pp = rd_i32(&s); m->par.cp = rd_i32(&s);
  m->par.ep = rd_i32(&s); m->par.dp = rd_i32(&s); m->par.sp = rd_i32(&s);
  m->par.zero = rd_i32(&s);
  if (!s.bad && rd_left(&s) >= 12) {      /* pipeline fields (pp > 1) */
    m->par.vpp = rd_i32(&s); m->par.sched = rd_i32(&s); m->par.stage = rd_i32(&s);
    if (!s.bad && (m->par.vpp < 0 || m->par.sched < 0 || m->par.sched >= IR_PIPE_COUNT || m->par.stage < 0))
      rd_fail(&s, "bad pipeline fields vpp=%d schedule=%d stage=%d", m->par.vpp, m->par.sched, m->par.stage);
  }
  if (rd_done(&s, r) != 0) goto bad;

  if (rd_record(r, TAG_RULE, "rules", &s) != 0) goto bad;
  int nr = rd_count(&s, 4 + 1, "rule");
  for (int i = 0; i < nr && !s.bad; i++) {
    IrRule ru;
    ru.dim = rd_name(&s, "rule");
    ru.axes = (uint8_t)rd_u8(&s);
    if (!s.bad && (ru.axes & ~((1u << IR_AXIS_COUNT) - 1))) rd_fail(&s, "rule '%s': bad axes", ru.dim);
    if (!s.bad) VEC_PUSH(m->rules, ru);
  }
  if (rd_done(&s, r) != 0) goto bad;

  if (rd_record(r, TAG_STAT, "states", &s) != 0) goto bad;
  int ns = rd_count(&s, 4 + 2 + 4 + 4 + 8 + 8 + 4 + 4, "state");
  for (int i = 0; i < ns && !s.bad; i++) rd_state(&s, m, i, ns);
  if (rd_done(&s, r) != 0) goto bad;

  while (!r->bad && rd_peek_tag(r) == TAG_BLCK) {
    if (rd_record(r, TAG_BLCK, "block", &s) != 0) goto bad;
    rd_block(&s, m);
    if (rd_done(&s, r) != 0) goto bad;
  }
  if (!r->bad && rd_peek_tag(r) == TAG_STGE) {   /* the nodes' pipeline stage tags */
    if (rd_record(r, TAG_STGE, "stage tags", &s) != 0) goto bad;
    int nt = rd_count(&s, 12, "stage tag");
    for (int k = 0; k < nt && !s.bad; k++) {
      uint32_t bi = rd_u32(&s), id = rd_u32(&s);
      int32_t tag = rd_i32(&s);
      if (s.bad) break;
      if (bi >= (uint32_t)m->blocks.n || id >= (uint32_t)m->blocks.a[bi].n || tag < 1)
        rd_fail(&s, "stage tag %d: block %u node %u tag %d out of range", k, bi, id, tag);
      else
        m->blocks.a[bi].nodes[id].stage = tag;
    }
    if (rd_done(&s, r) != 0) goto bad;
  }
  if (rd_left(r) && !r->bad) rd_fail(r, "unexpected record after the blocks");
  if (r->bad) goto bad;
  return m;
bad:
  ir_module_free(m);
  r->bad = 1;
  return NULL;
}

/* What both readers check once the pieces are read: one rank per mesh
 * position, and every program passes the IR verifier (so mrun never sees
 * a node whose operands or types are inconsistent). */
static int check_plan(const Plan *p, const char *what, char *err, size_t errlen) {
  uint64_t size = 1;
  const int ax[5] = {p->mesh.dp, p->mesh.pp, p->mesh.cp, p->mesh.ep, p->mesh.tp};
  for (int i = 0; i < 5; i++) size = size > (1u << 20) ? size : size * (uint64_t)ax[i];
  if (size != (uint64_t)p->nranks)
    return ts_errf(err, errlen, "%s is inconsistent: the mesh dp=%d pp=%d cp=%d ep=%d tp=%d has %llu ranks, the rank table %d",
                what, ax[0], ax[1], ax[2], ax[3], ax[4], (unsigned long long)size, p->nranks);
  for (int i = 0; i < p->nprograms; i++) {
    char verr[1024];
    if (ir_verify(p->programs[i], verr, sizeof verr) != 0 || ir_verify_training(p->programs[i], verr, sizeof verr) != 0)
      return ts_errf(err, errlen, "%s: program %d is invalid: %s", what, i, verr);
  }
  for (int i = 0; i < p->nimages; i++) {
    const PlanImage *im = &p->images[i];
    if (im->program < 0 || im->program >= p->nprograms)
      return ts_errf(err, errlen, "%s: CUDA image %d is for program %d, but there are %d", what, i, im->program,
                     p->nprograms);
    if (im->cubin_len < 4 || memcmp(im->cubin, "\177ELF", 4) != 0)
      return ts_errf(err, errlen, "%s: the cubin of CUDA image %d is not an ELF file", what, i);
  }
  return 0;
}

/* Bytes of a length-prefixed blob (u64 length), copied (NUL-terminated). */
static void *rd_blob(Rd *r, size_t *len, const char *what) {
  uint64_t n = rd_u64(r);
  if (r->bad) return NULL;
  if (n > rd_left(r)) { rd_fail(r, "%s of %llu bytes overruns the record", what, (unsigned long long)n); return NULL; }
  const unsigned char *q = rd_take(r, (size_t)n);
  if (!q) return NULL;
  char *c = ts_xmalloc((size_t)n + 1);
  memcpy(c, q, (size_t)n);
  c[n] = 0;
  *len = (size_t)n;
  return c;
}

/* The CUDA record: images of the plan's programs.  0 or -1. */
static int rd_images(Rd *r, Plan *p) {
  int n = rd_count(r, 32, "image");
  for (int i = 0; i < n && !r->bad; i++) {
    PlanImage im;
    memset(&im, 0, sizeof im);
    im.program = (int)rd_u32(r);
    im.sm = (int)rd_u32(r);
    im.source_hash = rd_u64(r);
    if (!r->bad && (im.program >= p->nprograms || (im.sm != 80 && im.sm != 90)))
      rd_fail(r, "image %d: program %d of %d, arch sm_%d", i, im.program, p->nprograms, im.sm);
    im.ptx = rd_blob(r, &im.ptx_len, "the PTX");
    im.cubin = rd_blob(r, &im.cubin_len, "the cubin");
    if (!r->bad && (im.cubin_len < 4 || memcmp(im.cubin, "\177ELF", 4) != 0)) rd_fail(r, "image %d: the cubin is not an ELF file", i);
    im.nkern = rd_count(r, 44, "kernel report");
    if (!r->bad) im.kern = ts_xcalloc((size_t)(im.nkern ? im.nkern : 1), sizeof *im.kern);
    for (int k = 0; k < im.nkern && !r->bad; k++) {
      CgPtxasInfo *q = &im.kern[k];
      const char *nm = rd_str(r);
      snprintf(q->name, sizeof q->name, "%s", nm ? nm : "");
      q->registers = rd_i32(r);
      q->smem = rd_i64(r);
      q->stack = rd_i64(r);
      q->spill_stores = rd_i64(r);
      q->spill_loads = rd_i64(r);
      q->cmem = rd_i64(r);
    }
    if (!r->bad) plan_add_image(p, &im);
    image_free(&im);
  }
  return r->bad ? -1 : 0;
}

static Plan *decode_payload(const unsigned char *data, size_t len, const char *what,
                              char *err, size_t errlen) {
  char msg[1024] = "";
  Rd r = {data, data + len, 0, msg, sizeof msg, "plan"};
  Rd s;
  Plan *p = plan_new();
  VEC(IrModule *) progs = {0};

  if (rd_record(&r, TAG_MESH, "mesh", &s) != 0) goto bad;
  int *ax[5] = {&p->mesh.dp, &p->mesh.pp, &p->mesh.cp, &p->mesh.ep, &p->mesh.tp};
  for (int i = 0; i < 5; i++) {
    uint32_t v = rd_u32(&s);
    if (!s.bad && (v < 1 || v > 1u << 20)) rd_fail(&s, "mesh axis size %u", v);
    *ax[i] = (int)v;
  }
  if (rd_done(&s, &r) != 0) goto bad;

  if (rd_record(&r, TAG_SRC, "source", &s) != 0) goto bad;
  const char *src = rd_str(&s);
  p->source = src && *src ? src : NULL;
  if (rd_done(&s, &r) != 0) goto bad;

  while (rd_peek_tag(&r) == TAG_PROG) {
    if (rd_record(&r, TAG_PROG, "program", &s) != 0) goto bad;
    char where[32];
    snprintf(where, sizeof where, "program %d", progs.n);
    s.where = where;
    IrModule *m = rd_module(&s);
    if (!m) { r.bad = 1; goto bad; }
    VEC_PUSH(progs, m);
  }
  p->nprograms = progs.n;
  p->programs = progs.a;
  progs.a = NULL;
  progs.n = 0;                          /* the plan owns them now */
  if (p->nprograms == 0) { rd_fail(&r, "no programs"); goto bad; }

  if (rd_record(&r, TAG_RANK, "rank table", &s) != 0) goto bad;
  int nr = rd_count(&s, 4, "rank");
  if (!s.bad && nr < 1) rd_fail(&s, "no ranks");
  if (!s.bad) {
    p->nranks = nr;
    p->rank_program = ts_xcalloc((size_t)nr, sizeof *p->rank_program);
  }
  for (int i = 0; i < nr && !s.bad; i++) {
    uint32_t k = rd_u32(&s);
    if (!s.bad && k >= (uint32_t)p->nprograms) rd_fail(&s, "rank %d runs program %u of %d", i, k, p->nprograms);
    if (!s.bad) p->rank_program[i] = (int)k;
  }
  if (rd_done(&s, &r) != 0) goto bad;
  if (rd_left(&r) && rd_peek_tag(&r) == TAG_CUDA) {
    if (rd_record(&r, TAG_CUDA, "CUDA images", &s) != 0) goto bad;
    s.where = "CUDA images";
    if (rd_images(&s, p) != 0 || rd_done(&s, &r) != 0) { r.bad = 1; goto bad; }
  }
  if (rd_left(&r)) { rd_fail(&r, "%zu unexpected bytes after the rank table", rd_left(&r)); goto bad; }

  if (check_plan(p, what, err, errlen) != 0) { plan_free(p); return NULL; }
  return p;
bad:
  for (int i = 0; i < progs.n; i++) ir_module_free(progs.a[i]);
  free(progs.a);
  plan_free(p);
  ts_errf(err, errlen, "%s is corrupted: %s", what, msg);
  return NULL;
}

static uint32_t le32(const unsigned char *q) {
  return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}
static uint64_t le64(const unsigned char *q) { return (uint64_t)le32(q) | (uint64_t)le32(q + 4) << 32; }

/* Checks the header and checksum, then decodes.  `name` is the file name
 * for messages. */
static Plan *decode_named(const void *data, size_t len, const char *name, char *err, size_t errlen) {
  const unsigned char *q = data;
  char what[512];
  snprintf(what, sizeof what, "plan '%s'", name);
  if (len < 8 || memcmp(q, PLAN_MAGIC, 8) != 0) {
    ts_errf(err, errlen, "'%s' is not a Tessera plan (bad magic)", name);
    return NULL;
  }
  if (len < PLAN_HEADER) {
    ts_errf(err, errlen, "%s is truncated: the file has %zu bytes, less than the %d-byte header", what, len, PLAN_HEADER);
    return NULL;
  }
  uint32_t version = le32(q + 8), flags = le32(q + 12);
  uint64_t plen = le64(q + 16), sum = le64(q + 24);
  if (version > PLAN_VERSION) {
    ts_errf(err, errlen, "%s has format version %u; this mrun reads up to version %d: rebuild mrun or recompile the plan",
         what, version, PLAN_VERSION);
    return NULL;
  }
  if (version == 0) { ts_errf(err, errlen, "%s is corrupted: format version 0", what); return NULL; }
  if (version < PLAN_VERSION) {
    ts_errf(err, errlen, "%s has format version %u, older than this mrun's %d: recompile the plan",
            what, version, PLAN_VERSION);
    return NULL;
  }
  if (flags != 0) {
    ts_errf(err, errlen, "%s uses format flags 0x%x that this mrun does not know: rebuild mrun or recompile the plan", what, flags);
    return NULL;
  }
  size_t have = len - PLAN_HEADER;
  if (plen > have) {
    ts_errf(err, errlen, "%s is truncated: header says %llu payload bytes, file has %zu", what,
         (unsigned long long)plen, have);
    return NULL;
  }
  if (plen < have) {
    ts_errf(err, errlen, "%s is corrupted: header says %llu payload bytes, file has %zu (trailing data)", what,
         (unsigned long long)plen, have);
    return NULL;
  }
  if (ts_hash64(q + PLAN_HEADER, have, PLAN_CHECKSUM_SEED) != sum) {
    ts_errf(err, errlen, "%s is corrupted: checksum mismatch", what);
    return NULL;
  }
  Plan *p = decode_payload(q + PLAN_HEADER, have, what, err, errlen);
  if (p) p->version = version;
  return p;
}

Plan *plan_decode(const void *data, size_t len, char *err, size_t errlen) {
  return decode_named(data, len, "<memory>", err, errlen);
}

/* ======================================================================
 * Text form
 * ====================================================================== */

static void print_quoted(StrBuf *b, const char *s) {
  sb_putc(b, '"');
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\') { sb_putc(b, '\\'); sb_putc(b, *s); }
    else if (*s == '\n') sb_puts(b, "\\n");
    else sb_putc(b, *s);
  }
  sb_putc(b, '"');
}

/* ---- base64 (RFC 4648), for the CUDA images in the text form ---- */
static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
enum { B64_LINE = 76 };

/* data as base64 lines of at most 76 characters */
static void put_b64(StrBuf *out, const unsigned char *d, size_t n) {
  int col = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
    char q[4] = {B64[v >> 18 & 63], B64[v >> 12 & 63], i + 1 < n ? B64[v >> 6 & 63] : '=', i + 2 < n ? B64[v & 63] : '='};
    sb_write(out, q, 4);
    if ((col += 4) == B64_LINE) { sb_putc(out, '\n'); col = 0; }
  }
  if (col) sb_putc(out, '\n');
}
static size_t b64_lines(size_t n) { return (4 * ((n + 2) / 3) + B64_LINE - 1) / B64_LINE; }
static int b64_val(int c) {
  const char *q = c ? strchr(B64, c) : NULL;
  return q ? (int)(q - B64) : -1;
}

/* `cuda N`, then per image a header line, one line per kernel report, the
 * PTX and the cubin in base64 (their line counts follow from the sizes). */
static void print_images(const Plan *p, StrBuf *out) {
  if (p->nimages == 0) return;
  sb_printf(out, "cuda %d\n", p->nimages);
  for (int i = 0; i < p->nimages; i++) {
    const PlanImage *im = &p->images[i];
    sb_printf(out, "image program %d sm_%d hash %016llx ptx %zu cubin %zu kernels %d\n", im->program, im->sm,
              (unsigned long long)im->source_hash, im->ptx_len, im->cubin_len, im->nkern);
    for (int k = 0; k < im->nkern; k++) {
      const CgPtxasInfo *q = &im->kern[k];
      sb_printf(out, "kernel %s registers %d smem %lld stack %lld spills %lld %lld cmem %lld\n", q->name, q->registers,
                (long long)q->smem, (long long)q->stack, (long long)q->spill_stores, (long long)q->spill_loads,
                (long long)q->cmem);
    }
    put_b64(out, (const unsigned char *)im->ptx, im->ptx_len);
    put_b64(out, im->cubin, im->cubin_len);
  }
}

void plan_print_text(const Plan *p, StrBuf *out) {
  sb_printf(out, "tessera-plan %d\n", PLAN_VERSION);
  sb_printf(out, "mesh dp=%d pp=%d cp=%d ep=%d tp=%d\n", p->mesh.dp, p->mesh.pp, p->mesh.cp,
            p->mesh.ep, p->mesh.tp);
  sb_puts(out, "source ");
  print_quoted(out, p->source);
  sb_putc(out, '\n');
  sb_printf(out, "ranks %d\n", p->nranks);
  for (int i = 0; i < p->nranks; i++) sb_printf(out, "rank %d program %d\n", i, p->rank_program[i]);
  print_images(p, out);
  for (int i = 0; i < p->nprograms; i++) {
    sb_printf(out, "program %d\n", i);
    ir_print_module(p->programs[i], out);
  }
}

/* Line-oriented reader for the header lines (the modules are parsed by
 * ir_parse_module_at, which shares pos/line with us). */
typedef struct {
  const char *text, *fname;
  size_t pos;
  int line;
  char *err;
  size_t errlen;
} Tx;

static int tx_fail(Tx *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tx_fail(Tx *t, const char *fmt, ...) {
  if (t->err && t->errlen) {
    int k = snprintf(t->err, t->errlen, "%s:%d: error: ", t->fname, t->line);
    if (k >= 0 && (size_t)k < t->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(t->err + k, t->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

/* Skips blank and comment lines; copies the next line (without the
 * comment and trailing blanks) into buf.  0 at end of text. */
static int tx_line(Tx *t, char *buf, size_t n) {
  for (;;) {
    if (!t->text[t->pos]) return 0;
    const char *s = t->text + t->pos;
    size_t k = strcspn(s, "\n");
    t->pos += k + (s[k] == '\n');
    t->line++;
    /* '#' inside a quoted string is not a comment */
    size_t e = 0;
    int inq = 0;
    for (; e < k; e++) {
      if (inq && s[e] == '\\' && e + 1 < k) { e++; continue; }
      if (s[e] == '"') inq = !inq;
      else if (s[e] == '#' && !inq) break;
    }
    while (e > 0 && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) e--;
    size_t b0 = 0;
    while (b0 < e && (s[b0] == ' ' || s[b0] == '\t')) b0++;
    if (b0 == e) continue;
    if (e - b0 >= n) return tx_fail(t, "line too long"), -1;
    memcpy(buf, s + b0, e - b0);
    buf[e - b0] = 0;
    return 1;
  }
}

/* Position of the next non-blank, non-comment line without consuming it
 * (ir_parse_module_at starts there). */
static void tx_skip_blank(Tx *t) {
  for (;;) {
    const char *s = t->text + t->pos;
    size_t k = strcspn(s, "\n");
    size_t b0 = strspn(s, " \t\r");
    if (!*s || (b0 < k && s[b0] != '#')) return;
    t->pos += k + (s[k] == '\n');
    t->line++;
  }
}

/* Parses a non-negative decimal that fits an int; -1 otherwise. */
static int parse_int(const char *s, const char **end) {
  if (*s < '0' || *s > '9') return -1;
  long long v = 0;
  while (*s >= '0' && *s <= '9') {
    v = v * 10 + (*s++ - '0');
    if (v > INT32_MAX) return -1;
  }
  *end = s;
  return (int)v;
}

/* `word N` with nothing after it; -1 on mismatch. */
static int parse_kv_line(const char *line, const char *word) {
  size_t k = strlen(word);
  if (strncmp(line, word, k) != 0 || line[k] != ' ') return -1;
  const char *e;
  int v = parse_int(line + k + 1, &e);
  return v >= 0 && *e == 0 ? v : -1;
}

static int parse_mesh(Tx *t, const char *line, PlanMesh *mesh) {
  static const char *names[5] = {"dp", "pp", "cp", "ep", "tp"};
  int *ax[5] = {&mesh->dp, &mesh->pp, &mesh->cp, &mesh->ep, &mesh->tp};
  if (strncmp(line, "mesh", 4) != 0) return tx_fail(t, "expected 'mesh dp=N pp=N cp=N ep=N tp=N'");
  const char *s = line + 4;
  for (int i = 0; i < 5; i++) {
    size_t k = strlen(names[i]);
    const char *e;
    if (*s != ' ' || strncmp(s + 1, names[i], k) != 0 || s[1 + k] != '=')
      return tx_fail(t, "expected 'mesh dp=N pp=N cp=N ep=N tp=N'");
    int v = parse_int(s + 2 + k, &e);
    if (v < 1 || v > 1 << 20) return tx_fail(t, "mesh %s must be a positive size", names[i]);
    *ax[i] = v;
    s = e;
  }
  if (*s) return tx_fail(t, "unexpected text after the mesh sizes: '%s'", s);
  return 0;
}

static int parse_source(Tx *t, const char *line, const char **out) {
  if (strncmp(line, "source \"", 8) != 0) return tx_fail(t, "expected 'source \"FILE\"'");
  StrBuf b = {0};
  const char *s = line + 8;
  for (; *s && *s != '"'; s++) {
    if (*s == '\\') {
      s++;
      if (*s == 'n') sb_putc(&b, '\n');
      else if (*s == '"' || *s == '\\') sb_putc(&b, *s);
      else { sb_free(&b); return tx_fail(t, "bad escape in the source string"); }
    } else {
      sb_putc(&b, *s);
    }
  }
  if (*s != '"' || s[1]) { sb_free(&b); return tx_fail(t, "bad source string"); }
  *out = b.n ? ts_intern(b.p) : NULL;
  sb_free(&b);
  return 0;
}

/* n bytes from base64 lines into a new buffer (NUL-terminated). */
static void *parse_b64(Tx *t, size_t n) {
  unsigned char *d = ts_xmalloc(n + 1);
  size_t got = 0, lines = b64_lines(n);
  char line[4096];
  for (size_t l = 0; l < lines; l++) {
    if (tx_line(t, line, sizeof line) <= 0) { tx_fail(t, "the base64 data ends early"); free(d); return NULL; }
    for (const char *q = line; q[0]; q += 4) {
      int v[4];
      for (int j = 0; j < 4; j++) v[j] = q[j] == '=' ? 0 : b64_val(q[j]);
      if (!q[1] || !q[2] || !q[3] || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) {
        tx_fail(t, "bad base64 data");
        free(d);
        return NULL;
      }
      uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
      unsigned char b3[3] = {(unsigned char)(w >> 16), (unsigned char)(w >> 8), (unsigned char)w};
      for (int j = 0; j < 3 && got < n && (j == 0 || q[j + 1] != '='); j++) d[got++] = b3[j];
    }
  }
  if (got != n) { tx_fail(t, "base64 data holds %zu bytes, the header says %zu", got, n); free(d); return NULL; }
  d[n] = 0;
  return d;
}

/* The `cuda N` section (print_images). */
static int parse_images(Tx *t, const char *first, Plan *p) {
  int n = parse_kv_line(first, "cuda");
  if (n < 1 || n > 4096) return tx_fail(t, "expected 'cuda N'");
  char line[4096];
  for (int i = 0; i < n; i++) {
    PlanImage im;
    memset(&im, 0, sizeof im);
    unsigned long long h = 0;
    if (tx_line(t, line, sizeof line) <= 0 ||
        sscanf(line, "image program %d sm_%d hash %llx ptx %zu cubin %zu kernels %d", &im.program, &im.sm, &h,
               &im.ptx_len, &im.cubin_len, &im.nkern) != 6 ||
        im.nkern < 0 || im.nkern > 1 << 20 || (im.sm != 80 && im.sm != 90) || im.ptx_len > (size_t)1 << 31 ||
        im.cubin_len > (size_t)1 << 31)
      return tx_fail(t, "expected 'image program P sm_S hash H ptx N cubin N kernels K'");
    im.source_hash = h;
    im.kern = ts_xcalloc((size_t)(im.nkern ? im.nkern : 1), sizeof *im.kern);
    int rc = 0;
    for (int k = 0; k < im.nkern && rc == 0; k++) {
      CgPtxasInfo *q = &im.kern[k];
      long long a, b, c, d, e;
      char name[80];
      if (tx_line(t, line, sizeof line) <= 0 ||
          sscanf(line, "kernel %79s registers %d smem %lld stack %lld spills %lld %lld cmem %lld", name, &q->registers,
                 &a, &b, &c, &d, &e) != 7)
        rc = tx_fail(t, "expected 'kernel NAME registers R smem S stack S spills A B cmem C'");
      snprintf(q->name, sizeof q->name, "%s", name);
      q->smem = a, q->stack = b, q->spill_stores = c, q->spill_loads = d, q->cmem = e;
    }
    if (rc == 0 && !(im.ptx = parse_b64(t, im.ptx_len))) rc = -1;
    if (rc == 0 && !(im.cubin = parse_b64(t, im.cubin_len))) rc = -1;
    if (rc == 0 && im.program >= 0) plan_add_image(p, &im);
    image_free(&im);
    if (rc != 0) return -1;
  }
  return 0;
}

/* The header lines: version, mesh, source, rank table. */
static int parse_text_header(Tx *t, Plan *p) {
  char line[4096];
  const char *e;
  int r = tx_line(t, line, sizeof line);
  if (r < 0) return -1;
  /* plan_read takes a text only when it starts with "tessera-plan": its first line is never empty */
  if (r == 0) return tx_fail(t, "empty plan text");   /* internal */
  if (strncmp(line, "tessera-plan ", 13) != 0)
    return tx_fail(t, "not a Tessera plan text (expected 'tessera-plan %d')", PLAN_VERSION);
  int version = parse_int(line + 13, &e);
  if (version < 1 || *e) return tx_fail(t, "bad plan version '%s'", line + 13);
  if (version > PLAN_VERSION)   /* the same words as for a binary plan */
    return ts_errf(t->err, t->errlen,
                "plan '%s' has format version %d; this mrun reads up to version %d: rebuild mrun or recompile the plan",
                t->fname, version, PLAN_VERSION);
  if (version < PLAN_VERSION)
    return ts_errf(t->err, t->errlen,
                   "plan '%s' has format version %d, older than this mrun's %d: recompile the plan",
                   t->fname, version, PLAN_VERSION);
  p->version = (uint32_t)version;

  if ((r = tx_line(t, line, sizeof line)) <= 0) return r < 0 ? -1 : tx_fail(t, "expected the mesh line");
  if (parse_mesh(t, line, &p->mesh) != 0) return -1;
  if ((r = tx_line(t, line, sizeof line)) <= 0) return r < 0 ? -1 : tx_fail(t, "expected the source line");
  if (parse_source(t, line, &p->source) != 0) return -1;
  int nr = -1;
  if ((r = tx_line(t, line, sizeof line)) > 0) nr = parse_kv_line(line, "ranks");
  if (nr < 1 || nr > 1 << 20) return r < 0 ? -1 : tx_fail(t, "expected 'ranks N' with N >= 1");
  p->nranks = nr;
  p->rank_program = ts_xcalloc((size_t)nr, sizeof *p->rank_program);
  for (int i = 0; i < nr; i++) {
    int ri = -1, pi = -1;
    if ((r = tx_line(t, line, sizeof line)) > 0 && strncmp(line, "rank ", 5) == 0) {
      ri = parse_int(line + 5, &e);
      if (ri >= 0 && strncmp(e, " program ", 9) == 0) {
        pi = parse_int(e + 9, &e);
        if (*e) pi = -1;
      }
    }
    if (r < 0) return -1;
    if (ri != i || pi < 0) return tx_fail(t, "expected 'rank %d program K'", i);
    p->rank_program[i] = pi;
  }
  size_t pos = t->pos;   /* an optional `cuda N` section */
  int at = t->line;
  if ((r = tx_line(t, line, sizeof line)) > 0 && strncmp(line, "cuda ", 5) == 0) return parse_images(t, line, p);
  t->pos = pos;
  t->line = at;
  return r < 0 ? -1 : 0;
}

/* `program K` + module text, for K = 0, 1, ... up to the end of the text. */
static int parse_text_programs(Tx *t, Plan *p) {
  VEC(IrModule *) progs = {0};
  char line[4096];
  int rc = 0, r;
  while (rc == 0 && (r = tx_line(t, line, sizeof line)) != 0) {
    if (r < 0) { rc = -1; break; }
    if (parse_kv_line(line, "program") != progs.n) { rc = tx_fail(t, "expected 'program %d'", progs.n); break; }
    tx_skip_blank(t);
    IrModule *m = ir_parse_program_at(t->text, &t->pos, &t->line, t->fname, t->err, t->errlen);
    if (!m) rc = -1;
    else VEC_PUSH(progs, m);
  }
  if (rc == 0 && progs.n == 0) rc = tx_fail(t, "the plan has no programs");
  if (rc != 0) {
    for (int i = 0; i < progs.n; i++) ir_module_free(progs.a[i]);
    free(progs.a);
    return -1;
  }
  p->nprograms = progs.n;
  p->programs = progs.a;
  for (int i = 0; i < p->nranks; i++)
    if (p->rank_program[i] >= p->nprograms)
      return ts_errf(t->err, t->errlen, "%s: rank %d runs program %d, but there are %d", t->fname, i,
                  p->rank_program[i], p->nprograms);
  return 0;
}

Plan *plan_parse_text(const char *text, const char *fname, char *err, size_t errlen) {
  Tx t = {text, fname ? fname : "<plan>", 0, 0, err, errlen};
  if (err && errlen) err[0] = 0;
  Plan *p = plan_new();
  char what[512];
  snprintf(what, sizeof what, "plan '%s'", t.fname);
  if (parse_text_header(&t, p) != 0 || parse_text_programs(&t, p) != 0 || check_plan(p, what, err, errlen) != 0) {
    plan_free(p);
    return NULL;
  }
  return p;
}

/* ======================================================================
 * Files
 * ====================================================================== */

int plan_write(const Plan *p, const char *path, char *err, size_t errlen) {
  StrBuf b = {0};
  plan_encode(p, &b);
  int rc = ts_write_file(path, b.p, b.n);
  sb_free(&b);
  if (rc != 0) return ts_errf(err, errlen, "%s", ts_io_error());
  return 0;
}

char *plan_read_bytes(const char *path, size_t *len, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) == 0 && (S_ISDIR(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))) {
    ts_errf(err, errlen, "cannot read plan '%s': it is a %s, not a plan file", path,
            S_ISDIR(st.st_mode) ? "directory" : "device");
    return NULL;
  }
  char *data = ts_read_input_max(path, PLAN_MAX_BYTES, len);
  if (!data && errno == EFBIG)
    ts_errf(err, errlen, "cannot read plan '%s': it is larger than %zu MiB, and a plan is at most that (the rank "
            "programs and their kernels, never the weights)", path, PLAN_MAX_BYTES >> 20);
  else if (!data)
    ts_errf(err, errlen, "cannot read plan '%s': %s", path, strerror(errno));
  return data;
}

Plan *plan_read(const char *path, char *err, size_t errlen) {
  size_t len = 0;
  char *data = plan_read_bytes(path, &len, err, errlen);
  if (!data) return NULL;
  Plan *p = plan_from_bytes(data, len, path, err, errlen);
  free(data);
  return p;
}

Plan *plan_from_bytes(const char *data, size_t len, const char *path, char *err, size_t errlen) {
  Plan *p;
  if (len >= 12 && memcmp(data, "tessera-plan", 12) == 0) {
    if (strlen(data) != len) {
      ts_errf(err, errlen, "plan '%s' is corrupted: NUL byte in the plan text", path);
      p = NULL;
    } else {
      p = plan_parse_text(data, path, err, errlen);
    }
  } else {
    p = decode_named(data, len, path, err, errlen);
  }
  return p;
}
