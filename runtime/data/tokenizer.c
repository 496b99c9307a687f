/* tokenizer.c - byte-level BPE (tokenizer.h; docs/data.md "Tokenizers"):
 * the loaders of GPT-2's vocab.json + merges.txt and of a Hugging Face
 * tokenizer.json, and encode / decode.
 *
 * The reference is the PyPI `tokenizers` package (0.19): ids equal its
 * Tokenizer.encode(text).ids.  The pipeline is the package's:
 *   1. added tokens split out of the text, leftmost-longest, first those
 *      with "normalized": false, then in what is left those with true;
 *   2. each remaining piece through the pre-tokenizer's steps (a space
 *      prepended, a regex split: tok_pretok.c), in order;
 *   3. each final piece, as bytes, through BPE: merges applied lowest rank
 *      first, equal ranks leftmost first, with the package's queue (a stale
 *      queue entry is recognised by the id it would make, as there).
 * BPE works on bytes: the byte-level alphabet (GPT-2's bytes_to_unicode)
 * maps each byte to one character, so a merge of characters is a merge of
 * bytes.  Whatever the loader cannot honour is refused by name. */
#include "tokenizer.h"
#include "tok_pretok.h"
#include "../../ir/json.h"
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

/* Largest tokenizer file read (Llama 3's tokenizer.json is 9 MB). */
#define TOK_MAX_FILE ((size_t)1 << 30)
#define TOK_MAX_STEPS 8

/* ---- hash maps ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}

/* Byte string -> id; the strings live in pool. */
typedef struct { uint64_t h; uint32_t off, len; int32_t id; } StrEnt;
typedef struct { StrEnt *e; size_t cap, n; StrBuf pool; } StrMap;

static void strmap_grow(StrMap *m) {
  size_t cap = m->cap ? 2 * m->cap : 1024;
  StrEnt *e = ts_xmalloc(cap * sizeof *e);
  for (size_t i = 0; i < cap; i++) e[i].id = -1;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->e[i].id < 0) continue;
    size_t k = m->e[i].h & (cap - 1);
    while (e[k].id >= 0) k = (k + 1) & (cap - 1);
    e[k] = m->e[i];
  }
  free(m->e);
  m->e = e;
  m->cap = cap;
}

static StrEnt *strmap_find(const StrMap *m, const char *s, size_t len, uint64_t h) {
  if (!m->cap) return NULL;
  for (size_t k = h & (m->cap - 1);; k = (k + 1) & (m->cap - 1)) {
    StrEnt *e = &m->e[k];
    if (e->id < 0) return e;
    if (e->h == h && e->len == len && !memcmp(m->pool.p + e->off, s, len)) return e;
  }
}

static int32_t strmap_get(const StrMap *m, const char *s, size_t len) {
  StrEnt *e = strmap_find(m, s, len, ts_hash64(s, len, 0));
  return e ? e->id : -1;
}

/* Sets s -> id (replacing an earlier id). */
static void strmap_put(StrMap *m, const char *s, size_t len, int32_t id) {
  if (2 * (m->n + 1) > m->cap) strmap_grow(m);
  uint64_t h = ts_hash64(s, len, 0);
  StrEnt *e = strmap_find(m, s, len, h);
  if (e->id < 0) {
    e->h = h, e->off = (uint32_t)m->pool.n, e->len = (uint32_t)len;
    sb_write(&m->pool, s, len);
    m->n++;
  }
  e->id = id;
}

static void strmap_free(StrMap *m) { free(m->e); sb_free(&m->pool); }

/* (left id, right id) -> (rank, merged id). */
typedef struct { uint64_t key; int32_t rank, id; } MergeEnt;
typedef struct { MergeEnt *e; size_t cap, n; } MergeMap;

static MergeEnt *merge_find(const MergeMap *m, uint64_t key) {
  for (size_t k = mix64(key) & (m->cap - 1);; k = (k + 1) & (m->cap - 1))
    if (m->e[k].id < 0 || m->e[k].key == key) return &m->e[k];
}

static void merge_put(MergeMap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
  if (2 * (m->n + 1) > m->cap) {
    MergeMap g = {ts_xmalloc((m->cap ? 2 * m->cap : 1024) * sizeof(MergeEnt)), m->cap ? 2 * m->cap : 1024, m->n};
    for (size_t i = 0; i < g.cap; i++) g.e[i].id = -1;
    for (size_t i = 0; i < m->cap; i++)
      if (m->e[i].id >= 0) *merge_find(&g, m->e[i].key) = m->e[i];
    free(m->e);
    *m = g;
  }
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  MergeEnt *e = merge_find(m, key);
  if (e->id < 0) m->n++;
  e->key = key, e->rank = rank, e->id = id;   /* a repeated merge: the last one counts, as in the package */
}

static const MergeEnt *merge_get(const MergeMap *m, int32_t a, int32_t b) {
  if (!m->cap) return NULL;
  const MergeEnt *e = merge_find(m, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
  return e->id >= 0 ? e : NULL;
}

/* ---- the tokenizer ---- */

typedef struct { uint32_t off, len; int32_t id; int normalized; } Added;
typedef enum { STEP_PREFIX_SPACE, STEP_SPLIT } StepKind;
typedef struct { StepKind kind; RtTokRe re; } Step;

struct RtTokenizer {
  StrMap vocab;            /* token as spelled in the vocabulary (byte-level characters) -> id */
  StrMap raw;              /* the token's bytes -> id, for ignore_merges */
  MergeMap merges;
  int32_t byte_id[256];    /* the id of each byte's one-character token, -1 if none */
  int32_t unk_id;          /* model.unk_token's id, -1 if none */
  int fuse_unk, ignore_merges;
  Step steps[TOK_MAX_STEPS];
  int nsteps;
  Added *added;            /* sorted by first byte, then longest first */
  int nadded;
  StrBuf added_pool;
  uint8_t added_first[2][256];   /* [normalized][byte]: some added token starts with byte */
  int64_t nid;             /* 1 + largest id */
  uint32_t *dec_off, *dec_len;   /* each id's bytes in dec_pool; dec_len UINT32_MAX: no token */
  StrBuf dec_pool;
  int32_t vocab_entries;   /* the package's model.get_vocab_size(): the vocabulary's size */
};

/* GPT-2's bytes_to_unicode: the printable bytes stand for themselves, the
 * others (in order) for U+0100 onwards. */
static uint32_t byte_char[256];
static int16_t char_byte[324];   /* the inverse, for characters below 324 */

static void byte_alphabet_init(void) {
  if (byte_char['!']) return;   /* a benign race: every thread writes the same */
  int n = 0;
  for (int b = 0; b < 324; b++) char_byte[b] = -1;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    uint32_t c = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    char_byte[c] = (int16_t)b;
    byte_char[b] = c;
  }
}

/* Appends the UTF-8 of code point c. */
static void put_utf8(StrBuf *b, uint32_t c) {
  char u[4];
  int n;
  if (c < 0x80) { u[0] = (char)c; n = 1; }
  else if (c < 0x800) { u[0] = (char)(0xC0 | c >> 6); u[1] = (char)(0x80 | (c & 63)); n = 2; }
  else { u[0] = (char)(0xE0 | c >> 12); u[1] = (char)(0x80 | ((c >> 6) & 63)); u[2] = (char)(0x80 | (c & 63)); n = 3; }
  sb_write(b, u, (size_t)n);
}

/* A token's bytes: each character mapped back through the byte alphabet;
 * a token with any other character (an added token such as "<s>" may have
 * one) stands for its own UTF-8, as the package's ByteLevel decoder does. */
static void token_bytes(const char *tok, size_t len, StrBuf *out) {
  size_t start = out->n, i = 0;
  while (i < len) {
    uint32_t c = rt_utf8_next(tok, &i);
    if (c >= 324 || char_byte[c] < 0) { out->n = start; sb_write(out, tok, len); return; }
    sb_putc(out, (char)char_byte[c]);
  }
}

static void set_decode(RtTokenizer *t, int32_t id, const char *tok, size_t len) {
  if (id >= t->nid) {
    int64_t cap = t->nid;
    t->nid = (int64_t)id + 1;
    t->dec_off = ts_xrealloc(t->dec_off, (size_t)t->nid * sizeof *t->dec_off);
    t->dec_len = ts_xrealloc(t->dec_len, (size_t)t->nid * sizeof *t->dec_len);
    for (int64_t i = cap; i < t->nid; i++) t->dec_len[i] = UINT32_MAX;
  }
  t->dec_off[id] = (uint32_t)t->dec_pool.n;
  token_bytes(tok, len, &t->dec_pool);
  t->dec_len[id] = (uint32_t)(t->dec_pool.n - t->dec_off[id]);
}

static RtTokenizer *tok_new(void) {
  byte_alphabet_init();
  RtTokenizer *t = ts_xcalloc(1, sizeof *t);
  t->unk_id = -1;
  return t;
}

void rt_tok_free(RtTokenizer *t) {
  if (!t) return;
  strmap_free(&t->vocab);
  strmap_free(&t->raw);
  free(t->merges.e);
  free(t->added);
  sb_free(&t->added_pool);
  free(t->dec_off);
  free(t->dec_len);
  sb_free(&t->dec_pool);
  free(t);
}

/* ---- loading: the vocabulary and the merges ---- */

/* vocab: {"token": id, ...}; where names it in errors ("vocab.json",
 * "tokenizer.json: \"model\".\"vocab\""). */
static int load_vocab(RtTokenizer *t, const TsJson *v, const char *where, char *err, size_t errlen) {
  if (!v || v->kind != TS_JSON_OBJECT)
    return ts_errf(err, errlen, "%s: the vocabulary is %s, not an object of token: id", where,
                   v ? ts_json_kind_name(v->kind) : "missing");
  for (int i = 0; i < v->n; i++) {
    const TsJson *x = v->items[i];
    const char *k = v->keys[i];
    if (x->kind != TS_JSON_NUMBER || !x->is_int || x->inum < 0 || x->inum >= INT32_MAX)
      return ts_errf(err, errlen, "%s: token '%s' has id %s, not an integer in [0, 2^31-1)", where, k,
                     x->kind == TS_JSON_NUMBER ? "out of range" : ts_json_kind_name(x->kind));
    int32_t id = (int32_t)x->inum;
    if (id < t->nid && t->dec_len[id] != UINT32_MAX)
      return ts_errf(err, errlen, "%s: id %d is given to two tokens (the second is '%s')", where, id, k);
    size_t len = strlen(k);
    strmap_put(&t->vocab, k, len, id);
    set_decode(t, id, k, len);
    /* an empty token ("": id) leaves the pool unallocated: no offset into NULL */
    strmap_put(&t->raw, t->dec_pool.p ? t->dec_pool.p + t->dec_off[id] : "", t->dec_len[id], id);
  }
  t->vocab_entries = v->n;
  StrBuf one = {0};
  for (int b = 0; b < 256; b++) {
    one.n = 0;
    put_utf8(&one, byte_char[b]);
    t->byte_id[b] = strmap_get(&t->vocab, one.p, one.n);
  }
  sb_free(&one);
  return 0;
}

/* One merge "left right" of rank; where: "merges.txt:LINE" or the JSON key. */
static int add_merge(RtTokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int32_t rank,
                     const char *where, char *err, size_t errlen) {
  int32_t ia = strmap_get(&t->vocab, a, alen), ib = strmap_get(&t->vocab, b, blen);
  if (ia < 0 || ib < 0)
    return ts_errf(err, errlen, "%s: the merge names '%.*s', which is not in the vocabulary", where,
                   ia < 0 ? (int)alen : (int)blen, ia < 0 ? a : b);
  char stackbuf[256];
  char *ab = alen + blen <= sizeof stackbuf ? stackbuf : ts_xmalloc(alen + blen);
  memcpy(ab, a, alen);
  memcpy(ab + alen, b, blen);
  int32_t id = strmap_get(&t->vocab, ab, alen + blen);
  int rc = 0;
  if (id < 0)
    rc = ts_errf(err, errlen, "%s: the merge makes '%.*s', which is not in the vocabulary", where,
                 (int)(alen + blen), ab);
  else merge_put(&t->merges, ia, ib, rank, id);
  if (ab != stackbuf) free(ab);
  return rc;
}

/* merges.txt: one "left right" per line, an optional "#version" line. */
static int load_merges_txt(RtTokenizer *t, const char *path, char *err, size_t errlen) {
  size_t len;
  char *text = ts_read_input_max(path, TOK_MAX_FILE, &len);
  if (!text) return ts_errf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
  int rc = 0, line = 0;
  int32_t rank = 0;
  char where[4200];
  for (size_t p = 0; p < len && !rc;) {
    size_t e = p;
    while (e < len && text[e] != '\n') e++;
    size_t next = e + 1, le = e > p && text[e - 1] == '\r' ? e - 1 : e;
    line++;
    snprintf(where, sizeof where, "%s:%d", path, line);
    if (le - p >= 8 && !memcmp(text + p, "#version", 8)) { p = next; continue; }
    const char *sp = memchr(text + p, ' ', le - p);
    if (!sp || sp == text + p || sp + 1 == text + le || memchr(sp + 1, ' ', (size_t)(text + le - sp - 1)))
      rc = ts_errf(err, errlen, "%s: expected two tokens separated by one space, found '%.*s'", where,
                   (int)(le - p > 80 ? 80 : le - p), text + p);
    else
      rc = add_merge(t, text + p, (size_t)(sp - text - p), sp + 1, (size_t)(text + le - sp - 1), rank++, where, err, errlen);
    p = next;
  }
  free(text);
  return rc;
}

/* ---- loading: tokenizer.json ---- */

/* The file's type field, or "" (errors name it). */
static const char *type_of(const TsJson *o) {
  const TsJson *ty = ts_json_get(o, "type");
  return ty && ty->kind == TS_JSON_STRING ? ty->str : "";
}

/* A boolean field: def when absent; -1 (an error) when not a boolean. */
static int get_bool(const TsJson *o, const char *key, int def, const char *path, const char *obj, char *err,
                    size_t errlen) {
  const TsJson *v = ts_json_get(o, key);
  if (!v) return def;
  if (v->kind != TS_JSON_BOOL)
    return ts_errf(err, errlen, "%s: \"%s\".\"%s\" is %s, not a boolean", path, obj, key, ts_json_kind_name(v->kind));
  return v->boolean;
}

/* A field that must be absent, null, or equal to the harmless value (a
 * string "" or false): anything else changes the ids and is refused. */
static int need_null(const TsJson *o, const char *key, const char *path, const char *obj, char *err, size_t errlen) {
  const TsJson *v = ts_json_get(o, key);
  if (!v || v->kind == TS_JSON_NULL || (v->kind == TS_JSON_STRING && !v->str[0]) ||
      (v->kind == TS_JSON_BOOL && !v->boolean))
    return 0;
  if (v->kind == TS_JSON_STRING)
    return ts_errf(err, errlen, "%s: \"%s\".\"%s\" is \"%s\": not supported (only null)", path, obj, key, v->str);
  if (v->kind == TS_JSON_NUMBER)
    return ts_errf(err, errlen, "%s: \"%s\".\"%s\" is %g: not supported (only null)", path, obj, key, v->num);
  return ts_errf(err, errlen, "%s: \"%s\".\"%s\" is %s: not supported (only null)", path, obj, key,
                 v->kind == TS_JSON_BOOL ? "true" : ts_json_kind_name(v->kind));
}

static int add_step(RtTokenizer *t, StepKind kind, RtTokRe re, const char *path, char *err, size_t errlen) {
  if (t->nsteps == TOK_MAX_STEPS)
    return ts_errf(err, errlen, "%s: \"pre_tokenizer\": more than %d steps", path, TOK_MAX_STEPS);
  t->steps[t->nsteps++] = (Step){kind, re};
  return 0;
}

/* ByteLevel: add_prefix_space, then GPT-2's regex if use_regex. */
static int pre_bytelevel(RtTokenizer *t, const TsJson *p, const char *path, int *byte_level, char *err, size_t errlen) {
  int prefix = get_bool(p, "add_prefix_space", 1, path, "pre_tokenizer", err, errlen);
  int regex = get_bool(p, "use_regex", 1, path, "pre_tokenizer", err, errlen);
  if (prefix < 0 || regex < 0) return -1;
  *byte_level = 1;
  if (prefix && add_step(t, STEP_PREFIX_SPACE, RT_TOK_RE_NONE, path, err, errlen)) return -1;
  return regex ? add_step(t, STEP_SPLIT, RT_TOK_RE_IS_GPT2, path, err, errlen) : 0;
}

/* Split: {"pattern": {"Regex": one of the two}, "behavior": "Isolated",
 * "invert": false}. */
static int pre_split(RtTokenizer *t, const TsJson *p, const char *path, char *err, size_t errlen) {
  const TsJson *pat = ts_json_get(p, "pattern");
  const TsJson *re = pat ? ts_json_get(pat, "Regex") : NULL;
  if (!re || re->kind != TS_JSON_STRING) {
    const TsJson *s = pat ? ts_json_get(pat, "String") : NULL;
    if (s && s->kind == TS_JSON_STRING)
      return ts_errf(err, errlen, "%s: \"pre_tokenizer\" Split \"pattern\".\"String\" \"%s\": not supported "
                     "(only GPT-2's and Llama 3's regexes)", path, s->str);
    return ts_errf(err, errlen, "%s: \"pre_tokenizer\" Split has no \"pattern\".\"Regex\" string", path);
  }
  RtTokRe k = rt_tok_re_lookup(re->str);
  if (k == RT_TOK_RE_NONE)
    return ts_errf(err, errlen, "%s: \"pre_tokenizer\" Split \"pattern\".\"Regex\" \"%.200s\": not supported "
                   "(only GPT-2's and Llama 3's regexes)", path, re->str);
  const TsJson *b = ts_json_get(p, "behavior");
  if (!b || b->kind != TS_JSON_STRING || strcmp(b->str, "Isolated"))
    return ts_errf(err, errlen, "%s: \"pre_tokenizer\" Split \"behavior\" \"%s\": not supported (only \"Isolated\")",
                   path, b && b->kind == TS_JSON_STRING ? b->str : "(not a string)");
  if (need_null(p, "invert", path, "pre_tokenizer", err, errlen)) return -1;
  return add_step(t, STEP_SPLIT, k, path, err, errlen);
}

static int load_pre_tokenizer(RtTokenizer *t, const TsJson *p, const char *path, int *byte_level, char *err,
                              size_t errlen) {
  const char *ty = type_of(p);
  if (!strcmp(ty, "ByteLevel")) return pre_bytelevel(t, p, path, byte_level, err, errlen);
  if (!strcmp(ty, "Split")) return pre_split(t, p, path, err, errlen);
  if (!strcmp(ty, "Sequence")) {
    const TsJson *seq = ts_json_get(p, "pretokenizers");
    if (!seq || seq->kind != TS_JSON_ARRAY)
      return ts_errf(err, errlen, "%s: \"pre_tokenizer\" Sequence has no \"pretokenizers\" array", path);
    for (int i = 0; i < seq->n; i++) {
      if (!strcmp(type_of(seq->items[i]), "Sequence"))
        return ts_errf(err, errlen, "%s: \"pre_tokenizer\": a Sequence inside a Sequence is not supported", path);
      if (load_pre_tokenizer(t, seq->items[i], path, byte_level, err, errlen)) return -1;
    }
    return 0;
  }
  if (!p || p->kind == TS_JSON_NULL)
    return ts_errf(err, errlen, "%s: \"pre_tokenizer\" is null: not supported (a byte-level BPE needs ByteLevel)", path);
  return ts_errf(err, errlen, "%s: \"pre_tokenizer\" type \"%s\": not supported (only ByteLevel, Split, Sequence)",
                 path, ty);
}

/* The model: BPE without dropout, subword prefix / suffix or byte fallback. */
static int load_model(RtTokenizer *t, const TsJson *m, const char *path, char *err, size_t errlen) {
  if (!m || m->kind != TS_JSON_OBJECT) return ts_errf(err, errlen, "%s: no \"model\" object", path);
  const char *ty = type_of(m);
  if (ts_json_get(m, "type") && strcmp(ty, "BPE"))
    return ts_errf(err, errlen, "%s: \"model\".\"type\" \"%s\": not supported (only BPE)", path, ty);
  if (need_null(m, "dropout", path, "model", err, errlen) ||
      need_null(m, "continuing_subword_prefix", path, "model", err, errlen) ||
      need_null(m, "end_of_word_suffix", path, "model", err, errlen) ||
      need_null(m, "byte_fallback", path, "model", err, errlen))
    return -1;
  if ((t->fuse_unk = get_bool(m, "fuse_unk", 0, path, "model", err, errlen)) < 0) return -1;
  if ((t->ignore_merges = get_bool(m, "ignore_merges", 0, path, "model", err, errlen)) < 0) return -1;
  char where[4200];
  snprintf(where, sizeof where, "%s: \"model\".\"vocab\"", path);
  if (load_vocab(t, ts_json_get(m, "vocab"), where, err, errlen)) return -1;
  const TsJson *unk = ts_json_get(m, "unk_token");
  if (unk && unk->kind == TS_JSON_STRING && (t->unk_id = strmap_get(&t->vocab, unk->str, strlen(unk->str))) < 0)
    return ts_errf(err, errlen, "%s: \"model\".\"unk_token\" '%s' is not in the vocabulary", path, unk->str);
  const TsJson *mg = ts_json_get(m, "merges");
  if (!mg || mg->kind != TS_JSON_ARRAY)
    return ts_errf(err, errlen, "%s: \"model\".\"merges\" is %s, not an array", path,
                   mg ? ts_json_kind_name(mg->kind) : "missing");
  for (int i = 0; i < mg->n; i++) {
    const TsJson *x = mg->items[i];
    snprintf(where, sizeof where, "%s: \"model\".\"merges\"[%d]", path, i);
    const char *a = NULL, *b = NULL, *sp;
    size_t alen = 0;
    if (x->kind == TS_JSON_STRING && (sp = strchr(x->str, ' ')) && !strchr(sp + 1, ' ') && sp > x->str && sp[1])
      a = x->str, alen = (size_t)(sp - x->str), b = sp + 1;
    else if (x->kind == TS_JSON_ARRAY && x->n == 2 && x->items[0]->kind == TS_JSON_STRING &&
             x->items[1]->kind == TS_JSON_STRING)
      a = x->items[0]->str, alen = strlen(a), b = x->items[1]->str;
    if (!a) return ts_errf(err, errlen, "%s: not \"left right\" nor [\"left\", \"right\"]", where);
    if (add_merge(t, a, alen, b, strlen(b), i, where, err, errlen)) return -1;
  }
  return 0;
}

static int added_cmp(const void *x, const void *y) {
  const Added *a = x, *b = y;
  /* first byte then longest first: the first candidate that matches is the longest */
  return a->len != b->len ? (a->len < b->len) - (a->len > b->len) : (a->id > b->id) - (a->id < b->id);
}

/* added_tokens: [{"id", "content", "single_word", "lstrip", "rstrip",
 * "normalized", "special"}].  The package gives an added token the
 * vocabulary's id if its content is there, else the next id after the
 * vocabulary and the earlier added tokens: a file whose "id" says
 * otherwise is refused, so that ids mean the same here and there. */
static int load_added(RtTokenizer *t, const TsJson *a, const char *path, char *err, size_t errlen) {
  if (!a || a->kind == TS_JSON_NULL) return 0;
  if (a->kind != TS_JSON_ARRAY) return ts_errf(err, errlen, "%s: \"added_tokens\" is %s, not an array", path, ts_json_kind_name(a->kind));
  t->added = ts_xcalloc((size_t)(a->n ? a->n : 1), sizeof *t->added);
  int32_t next = t->vocab_entries;
  char obj[64];
  for (int i = 0; i < a->n; i++) {
    const TsJson *x = a->items[i], *c = ts_json_get(x, "content"), *id = ts_json_get(x, "id");
    snprintf(obj, sizeof obj, "added_tokens[%d]", i);
    if (!c || c->kind != TS_JSON_STRING || !c->str[0] || !id || !id->is_int)
      return ts_errf(err, errlen, "%s: \"%s\" needs a non-empty \"content\" and an integer \"id\"", path, obj);
    if (need_null(x, "single_word", path, obj, err, errlen) || need_null(x, "lstrip", path, obj, err, errlen) ||
        need_null(x, "rstrip", path, obj, err, errlen))
      return -1;
    int norm = get_bool(x, "normalized", 1, path, obj, err, errlen);
    if (norm < 0) return -1;
    size_t len = strlen(c->str);
    for (int k = 0; k < t->nadded; k++)
      if (t->added[k].len == len && !memcmp(t->added_pool.p + t->added[k].off, c->str, len))
        return ts_errf(err, errlen, "%s: \"%s\" '%s' repeats an earlier added token", path, obj, c->str);
    int32_t known = strmap_get(&t->vocab, c->str, len);
    int32_t want = known >= 0 ? known : next;
    if (id->inum != want)
      return ts_errf(err, errlen, "%s: \"%s\" '%s' has \"id\" %lld, but the tokenizers package gives it %d", path,
                     obj, c->str, (long long)id->inum, want);
    if (known < 0) next++;
    t->added[t->nadded++] = (Added){(uint32_t)t->added_pool.n, (uint32_t)len, want, norm};
    sb_write(&t->added_pool, c->str, len);
    t->added_first[norm][(unsigned char)c->str[0]] = 1;
    set_decode(t, want, c->str, len);
  }
  qsort(t->added, (size_t)t->nadded, sizeof *t->added, added_cmp);
  return 0;
}

/* What tokenizer.json may hold besides the model, the pre-tokenizer and the
 * added tokens: no normalizer, a ByteLevel decoder, a post-processor that
 * only adds tokens (not applied: encode gives the text's ids), no
 * truncation or padding. */
static int check_rest(const TsJson *root, const char *path, char *err, size_t errlen) {
  const TsJson *n = ts_json_get(root, "normalizer");
  if (n && n->kind != TS_JSON_NULL)
    return ts_errf(err, errlen, "%s: \"normalizer\" type \"%s\": not supported (only null)", path, type_of(n));
  const TsJson *d = ts_json_get(root, "decoder");
  if (!d || strcmp(type_of(d), "ByteLevel"))
    return ts_errf(err, errlen, "%s: \"decoder\" %s%s%s: not supported (only ByteLevel)", path,
                   d && d->kind != TS_JSON_NULL ? "type \"" : "is null", d && d->kind != TS_JSON_NULL ? type_of(d) : "",
                   d && d->kind != TS_JSON_NULL ? "\"" : "");
  const TsJson *pp = ts_json_get(root, "post_processor");
  const char *pt = type_of(pp);
  if (pp && pp->kind != TS_JSON_NULL && strcmp(pt, "ByteLevel") && strcmp(pt, "TemplateProcessing"))
    return ts_errf(err, errlen, "%s: \"post_processor\" type \"%s\": not supported (only ByteLevel, TemplateProcessing)",
                   path, pt);
  const char *keys[] = {"truncation", "padding"};
  for (int i = 0; i < 2; i++) {
    const TsJson *v = ts_json_get(root, keys[i]);
    if (v && v->kind != TS_JSON_NULL)
      return ts_errf(err, errlen, "%s: \"%s\" is set: not supported (only null)", path, keys[i]);
  }
  return 0;
}

static RtTokenizer *load_tokenizer_json(const TsJson *root, const char *path, char *err, size_t errlen) {
  RtTokenizer *t = tok_new();
  int byte_level = 0;
  if (load_model(t, ts_json_get(root, "model"), path, err, errlen) ||
      load_pre_tokenizer(t, ts_json_get(root, "pre_tokenizer"), path, &byte_level, err, errlen) ||
      load_added(t, ts_json_get(root, "added_tokens"), path, err, errlen) || check_rest(root, path, err, errlen)) {
    rt_tok_free(t);
    return NULL;
  }
  if (!byte_level) {
    ts_errf(err, errlen, "%s: \"pre_tokenizer\" has no ByteLevel step: not a byte-level BPE", path);
    rt_tok_free(t);
    return NULL;
  }
  return t;
}

/* Reads and parses a JSON file into arena a. */
static TsJson *read_json(Arena *a, const char *path, char *err, size_t errlen) {
  size_t len;
  char *text = ts_read_input_max(path, TOK_MAX_FILE, &len);
  if (!text) {
    ts_errf(err, errlen, "%s: cannot read: %s", path, errno == EFBIG ? "larger than 1 GiB" : strerror(errno));
    return NULL;
  }
  TsJson *v = ts_json_parse(a, text, len, path, err, errlen);
  free(text);
  return v;
}

RtTokenizer *rt_tok_load_gpt2(const char *vocab_json, const char *merges_txt, char *err, size_t errlen) {
  Arena a;
  arena_init(&a);
  TsJson *v = read_json(&a, vocab_json, err, errlen);
  RtTokenizer *t = v ? tok_new() : NULL;
  if (t && (load_vocab(t, v, vocab_json, err, errlen) || load_merges_txt(t, merges_txt, err, errlen) ||
            add_step(t, STEP_SPLIT, RT_TOK_RE_IS_GPT2, vocab_json, err, errlen))) {
    rt_tok_free(t);
    t = NULL;
  }
  arena_free(&a);
  return t;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path) { return access(path, R_OK) == 0; }

RtTokenizer *rt_tok_load(const char *path, char *err, size_t errlen) {
  char buf[4096], merges[4096];
  if (is_dir(path)) {
    snprintf(buf, sizeof buf, "%s/tokenizer.json", path);
    if (!exists(buf)) snprintf(buf, sizeof buf, "%s/vocab.json", path);
    if (!exists(buf)) {
      ts_errf(err, errlen, "%s: a directory without tokenizer.json or vocab.json", path);
      return NULL;
    }
    path = buf;
  }
  size_t n = strlen(path);
  if (n >= 10 && !strcmp(path + n - 10, "vocab.json") && n < sizeof merges) {
    /* GPT-2's pair: vocab.json -> merges.txt, gpt2-vocab.json -> gpt2-merges.txt */
    snprintf(merges, sizeof merges, "%.*smerges.txt", (int)(n - 10), path);
    return rt_tok_load_gpt2(path, merges, err, errlen);
  }
  Arena a;
  arena_init(&a);
  TsJson *root = read_json(&a, path, err, errlen);
  RtTokenizer *t = NULL;
  if (root && root->kind != TS_JSON_OBJECT)
    ts_errf(err, errlen, "%s: a tokenizer.json holds an object, not %s", path, ts_json_kind_name(root->kind));
  else if (root && !ts_json_get(root, "model"))
    ts_errf(err, errlen, "%s: no \"model\": not a tokenizer.json (GPT-2's vocabulary must be named *vocab.json)", path);
  else if (root)
    t = load_tokenizer_json(root, path, err, errlen);
  arena_free(&a);
  return t;
}

/* ---- queries ---- */

int64_t rt_tok_vocab_size(const RtTokenizer *t) { return t->nid; }

int32_t rt_tok_id(const RtTokenizer *t, const char *token) {
  size_t len = strlen(token);
  for (int i = 0; i < t->nadded; i++)
    if (t->added[i].len == len && !memcmp(t->added_pool.p + t->added[i].off, token, len)) return t->added[i].id;
  return strmap_get(&t->vocab, token, len);
}

int32_t rt_tok_eod(const RtTokenizer *t) {
  const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
  for (int i = 0; i < 4; i++) {
    int32_t id = rt_tok_id(t, names[i]);
    if (id >= 0) return id;
  }
  return -1;
}

/* ---- encoding ---- */

/* A cache of words already encoded in one call (per call, so that encode
 * stays read-only on the tokenizer and thread-safe). */
typedef struct { uint64_t h; uint32_t key_off, key_len, ids_off, ids_n; } CacheEnt;
typedef struct {
  CacheEnt *e;
  size_t cap, n;
  StrBuf keys;
  int32_t *ids;
  size_t nids, capids;
} Cache;
#define CACHE_MAX_WORD 64
#define CACHE_MAX_ENTRIES ((size_t)1 << 18)

typedef struct {
  const RtTokenizer *t;
  int32_t **ids;
  size_t *n, *cap;
  Cache *cache;
  int oom;
} Enc;

static void emit(Enc *e, int32_t id) {
  if (*e->n == *e->cap) {
    size_t cap = *e->cap ? 2 * *e->cap : 256;
    int32_t *p = realloc(*e->ids, cap * sizeof *p);
    if (!p) { e->oom = 1; return; }
    *e->ids = p, *e->cap = cap;
  }
  (*e->ids)[(*e->n)++] = id;
}

/* The package's merge queue: the lowest rank first, then the lowest position. */
typedef struct { int32_t rank, pos, id; } QEnt;
typedef struct { QEnt *q; int n; } Heap;

static int q_less(QEnt a, QEnt b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(Heap *h, QEnt x) {
  int i = h->n++;
  while (i > 0 && q_less(x, h->q[(i - 1) / 2])) { h->q[i] = h->q[(i - 1) / 2]; i = (i - 1) / 2; }
  h->q[i] = x;
}

static QEnt heap_pop(Heap *h) {
  QEnt top = h->q[0], x = h->q[--h->n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && q_less(h->q[c + 1], h->q[c])) c++;
    if (!q_less(h->q[c], x)) break;
    h->q[i] = h->q[c];
    i = c;
  }
  if (h->n) h->q[i] = x;
  return top;
}

/* Symbols of a word being merged: a list threaded through arrays. */
typedef struct { int32_t *id, *prev, *next; int n; Heap heap; } Word;

static void push_pair(const RtTokenizer *t, Word *w, int pos) {
  int nx = w->next[pos];
  if (nx < 0) return;
  const MergeEnt *m = merge_get(&t->merges, w->id[pos], w->id[nx]);
  if (m) heap_push(&w->heap, (QEnt){m->rank, pos, m->id});
}

static void merge_word(const RtTokenizer *t, Word *w) {
  for (int i = 0; i + 1 < w->n; i++) push_pair(t, w, i);
  while (w->heap.n) {
    QEnt top = heap_pop(&w->heap);
    int p = top.pos, nx = w->next[p];
    if (w->id[p] < 0 || nx < 0) continue;           /* merged away, or now last */
    const MergeEnt *m = merge_get(&t->merges, w->id[p], w->id[nx]);
    if (!m || m->id != top.id) continue;             /* stale entry */
    w->id[p] = top.id;
    w->id[nx] = -1;
    w->next[p] = w->next[nx];
    if (w->next[p] >= 0) w->prev[w->next[p]] = p;
    if (w->prev[p] >= 0) push_pair(t, w, w->prev[p]);
    push_pair(t, w, p);
  }
}

/* The symbols a word starts from: one per byte; a byte without a token
 * is the unknown token (fused with a preceding one if fuse_unk) or,
 * without one, dropped, as in the package. */
static int word_init(const RtTokenizer *t, Word *w, const unsigned char *s, size_t len) {
  int n = 0;
  for (size_t i = 0; i < len; i++) {
    int32_t id = t->byte_id[s[i]];
    if (id < 0) {
      if (t->unk_id < 0) continue;
      if (t->fuse_unk && n > 0 && w->id[n - 1] == t->unk_id) continue;
      id = t->unk_id;
    }
    w->id[n] = id;
    w->prev[n] = n - 1;
    w->next[n] = n + 1;
    n++;
  }
  if (n) w->next[n - 1] = -1;
  w->n = n;
  return n;
}

/* BPE of one piece of bytes; appends its ids. */
static void bpe_word(Enc *e, const char *s, size_t len) {
  const RtTokenizer *t = e->t;
  if (t->ignore_merges) {
    int32_t id = strmap_get(&t->raw, s, len);
    if (id >= 0) { emit(e, id); return; }
  }
  enum { SMALL = 64 };
  int32_t sbuf[4 * SMALL];
  QEnt qbuf[3 * SMALL];
  int32_t *buf = len <= SMALL ? sbuf : malloc(4 * len * sizeof *buf);
  QEnt *q = len <= SMALL ? qbuf : malloc(3 * len * sizeof *q);   /* n-1 pairs, then at most 2 per merge */
  if (!buf || !q) { e->oom = 1; goto out; }
  Word w = {buf, buf + len, buf + 2 * len, 0, {q, 0}};
  word_init(t, &w, (const unsigned char *)s, len);
  merge_word(t, &w);
  for (int i = 0; i < w.n; i = w.next[i] < 0 ? w.n : w.next[i]) emit(e, w.id[i]);
out:
  if (buf != sbuf) free(buf);
  if (q != qbuf) free(q);
}

static void cache_free(Cache *c) {
  free(c->e);
  sb_free(&c->keys);
  free(c->ids);
}

/* The cached ids of word s, or NULL; *slot: where to insert it. */
static const CacheEnt *cache_get(const Cache *c, const char *s, size_t len, uint64_t h, size_t *slot) {
  size_t k = h & (c->cap - 1);
  for (; c->e[k].key_len; k = (k + 1) & (c->cap - 1)) {
    const CacheEnt *x = &c->e[k];
    if (x->h == h && x->key_len == len && !memcmp(c->keys.p + x->key_off, s, len)) return x;
  }
  *slot = k;
  return NULL;
}

/* Remembers that word s encodes to ids[from, *e->n); a full cache stops
 * growing (a text of more distinct words than that gains little from it). */
static void cache_put(Enc *e, const char *s, size_t len, uint64_t h, size_t slot, size_t from) {
  Cache *c = e->cache;
  size_t k = *e->n - from;
  if (c->n >= CACHE_MAX_ENTRIES || 2 * (c->n + 1) > c->cap || e->oom) return;
  if (c->nids + k > c->capids) {
    size_t cap = c->capids ? 2 * c->capids : 4096;
    while (cap < c->nids + k) cap *= 2;
    int32_t *p = realloc(c->ids, cap * sizeof *p);
    if (!p) return;
    c->ids = p, c->capids = cap;
  }
  memcpy(c->ids + c->nids, *e->ids + from, k * sizeof *c->ids);
  c->e[slot] = (CacheEnt){h, (uint32_t)c->keys.n, (uint32_t)len, (uint32_t)c->nids, (uint32_t)k};
  sb_write(&c->keys, s, len);
  c->nids += k;
  c->n++;
}

static void encode_word(Enc *e, const char *s, size_t len) {
  Cache *c = e->cache;
  if (!c || len > CACHE_MAX_WORD) { bpe_word(e, s, len); return; }
  uint64_t h = ts_hash64(s, len, 0);
  size_t slot = 0;
  const CacheEnt *x = cache_get(c, s, len, h, &slot);
  if (x) {
    for (uint32_t i = 0; i < x->ids_n; i++) emit(e, c->ids[x->ids_off + i]);
    return;
  }
  size_t from = *e->n;
  bpe_word(e, s, len);
  cache_put(e, s, len, h, slot, from);
}

/* The pre-tokenizer's steps k.. on piece s[0, len), then BPE. */
static void pretok(Enc *e, int k, const char *s, size_t len) {
  const RtTokenizer *t = e->t;
  if (!len || e->oom) return;
  if (k == t->nsteps) { encode_word(e, s, len); return; }
  const Step *st = &t->steps[k];
  if (st->kind == STEP_PREFIX_SPACE) {
    if (s[0] == ' ') { pretok(e, k + 1, s, len); return; }
    char sbuf[256];
    char *b = len < sizeof sbuf ? sbuf : malloc(len + 1);
    if (!b) { e->oom = 1; return; }
    b[0] = ' ';
    memcpy(b + 1, s, len);
    pretok(e, k + 1, b, len + 1);
    if (b != sbuf) free(b);
    return;
  }
  for (size_t i = 0; i < len;) {
    size_t end = rt_tok_re_match(st->re, s, len, i);
    pretok(e, k + 1, s + i, end - i);
    i = end;
  }
}

/* The longest added token of the normalized-or-not set starting at s, or NULL. */
static const Added *added_at(const RtTokenizer *t, int norm, const char *s, size_t len) {
  for (int i = 0; i < t->nadded; i++) {   /* longest first */
    const Added *a = &t->added[i];
    if (a->normalized == norm && a->len <= len && !memcmp(t->added_pool.p + a->off, s, a->len)) return a;
  }
  return NULL;
}

/* Pass 0 splits out the added tokens with "normalized": false, pass 1 those
 * with true, each leftmost-longest; what is left goes to the pre-tokenizer. */
static void split_added(Enc *e, int pass, const char *s, size_t len) {
  const RtTokenizer *t = e->t;
  if (pass == 2) { pretok(e, 0, s, len); return; }
  const uint8_t *first = t->added_first[pass == 0 ? 0 : 1];
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    if (!first[(unsigned char)s[i]]) continue;
    const Added *a = added_at(t, pass == 0 ? 0 : 1, s + i, len - i);
    if (!a) continue;
    split_added(e, pass + 1, s + start, i - start);
    emit(e, a->id);
    i += a->len - 1;
    start = i + 1;
  }
  split_added(e, pass + 1, s + start, len - start);
}

int rt_tok_encode(const RtTokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap) {
  char *fixed = NULL;
  if (rt_utf8_valid_prefix(text, len) != len) {   /* read as Python reads it: U+FFFD per invalid subpart */
    if (!(fixed = rt_utf8_sanitize(text, len, &len))) return -1;
    text = fixed;
  }
  Cache cache = {0};
  Enc e = {t, ids, n, cap, NULL, 0};
  if (len >= 4096) {   /* a cache pays for itself on longer texts */
    cache.cap = 1 << 12;
    while (cache.cap < 2 * CACHE_MAX_ENTRIES && cache.cap < len / 4) cache.cap *= 2;
    cache.e = calloc(cache.cap, sizeof *cache.e);
    if (cache.e) e.cache = &cache;
  }
  split_added(&e, 0, text, len);
  cache_free(&cache);
  free(fixed);
  return e.oom ? -1 : 0;
}

/* ---- decoding ---- */

int rt_tok_decode(const RtTokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len, size_t *cap,
                  char *err, size_t errlen) {
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->nid || t->dec_len[id] == UINT32_MAX)
      return ts_errf(err, errlen, "token %zu: id %d is not in the vocabulary (%lld ids)", i, id, (long long)t->nid);
    size_t k = t->dec_len[id];
    if (*len + k + 1 > *cap) {
      size_t c = *cap ? *cap : 256;
      while (c < *len + k + 1) c *= 2;
      char *p = realloc(*out, c);
      if (!p) return ts_errf(err, errlen, "out of memory decoding %zu ids", n);
      *out = p, *cap = c;
    }
    memcpy(*out + *len, t->dec_pool.p + t->dec_off[id], k);
    *len += k;
  }
  if (*out) (*out)[*len] = 0;
  else if (!*cap) {   /* nothing decoded: still a NUL-terminated buffer */
    if (!(*out = malloc(1))) return ts_errf(err, errlen, "out of memory");
    *cap = 1;
    (*out)[0] = 0;
  }
  return 0;
}
