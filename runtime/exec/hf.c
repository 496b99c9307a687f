/* hf.c - Hugging Face weights in and out: the map language (parsed here),
 * the model's parameters as a catalog (name, global logical shape), and
 * the two directions.
 *
 * A map line `tensor HF = EXPR` says that the Hugging Face tensor HF holds,
 * in row-major order, the elements of EXPR, built from parameters:
 *   P          the parameter P in its own shape
 *   P:k        P viewed as a matrix, rows = the product of its first k dims
 *   flat(E)    E as one dim
 *   t(E)       E transposed (E a matrix)
 *   cat(a, E1, E2, ..)  the Ei concatenated along dim a
 * and at the top only pad(E) (the model may have more rows in dim 0 than
 * the file: a padded vocabulary; the extra rows load as zero) or
 * prefix(E) (the file may have more rows: positions past the model's
 * sequence are dropped).  `{i}` in names stands for a layer index.
 * Importing walks each tensor's elements, maps each to (parameter, index)
 * through the expression and keeps the ones this rank holds; exporting
 * walks the same map the other way.  Every rank reads the files itself
 * (mapped: only the pages of the tensors it needs are touched). */
#include "hf.h"
#include "safetensors.h"
#include "train.h"
#include "ir/json.h"
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the map ---- */
typedef enum { HN_LEAF, HN_T, HN_CAT, HN_FLAT } HnKind;
typedef struct HfNode {
  HnKind kind;
  const char *pat;          /* leaf: the parameter's name, maybe with {i} */
  int split;                /* leaf: -1 its own shape; k a matrix view */
  int axis;                 /* cat */
  int n;
  struct HfNode **kid;
  /* of the instance being worked on */
  int leaf;                 /* leaf: its index in the instance's leaves */
  int rank;
  int64_t dim[IR_MAX_RANK];
} HfNode;

typedef enum { HV_NUM, HV_STR, HV_BOOL, HV_NULL, HV_DIM, HV_COUNT, HV_ATTR, HV_SEQ } HvKind;
typedef struct {
  HvKind kind;
  double num;
  int is_int, boolean, k;   /* k: DIM the dim index, ATTR the slot of fa[] */
  const char *str;          /* STR: the text; DIM / COUNT: the pattern; ATTR: the op */
  const char *attr;         /* ATTR: the attribute */
} HfVal;

typedef struct { const char *key; char rel; HfVal v; int has_def; HfVal def; int line; } HfConf;
typedef struct { const char *hf; HfNode *e; int rows; int line; } HfRule;   /* rows: 1 pad, -1 prefix */
typedef struct { const char *hf, *same; int line; } HfTied;
typedef struct { const char *s; int line; } HfWord;

typedef struct {
  Arena a;
  const char *path, *name;  /* the file, and its name without .map */
  const char *model_type, *arch, *strip;
  VEC(HfConf) conf;
  VEC(HfRule) rules;
  VEC(HfTied) tied;
  VEC(HfWord) ignore, require;
} HfMap;

static void map_free(HfMap *m) {
  free(m->conf.a);
  free(m->rules.a);
  free(m->tied.a);
  free(m->ignore.a);
  free(m->require.a);
  arena_free(&m->a);
  memset(m, 0, sizeof *m);
}

/* -- the line lexer: words (names, numbers), "strings", and ( ) , : = <= >= -- */
typedef struct {
  HfMap *m;
  const char *p, *line0;
  int line;
  char *err;
  size_t errlen;
  int failed;
} Lx;

static int lx_fail(Lx *x, const char *fmt, const char *arg) {
  if (x->failed) return -1;
  char msg[512];
  snprintf(msg, sizeof msg, fmt, arg ? arg : "");
  ts_errf(x->err, x->errlen, "%s:%d:%d: error: %s", x->m->path, x->line, (int)(x->p - x->line0) + 1, msg);
  x->failed = 1;
  return -1;
}

static void lx_ws(Lx *x) {
  while (*x->p == ' ' || *x->p == '\t' || *x->p == '\r') x->p++;
  if (*x->p == '#') while (*x->p && *x->p != '\n') x->p++;
}
static int is_word(char c) { return isalnum((unsigned char)c) || strchr("_.{}+-/", c); }
static int lx_end(Lx *x) { lx_ws(x); return !*x->p || *x->p == '\n'; }
static int lx_punct(Lx *x, const char *s) {
  lx_ws(x);
  size_t n = strlen(s);
  if (strncmp(x->p, s, n)) return 0;
  x->p += n;
  return 1;
}
static int lx_expect(Lx *x, const char *s) {
  if (lx_punct(x, s)) return 0;
  return lx_fail(x, "expected '%s'", s);
}
/* A word into the arena; NULL (and a message) if none. */
static const char *lx_word(Lx *x, const char *what) {
  lx_ws(x);
  const char *s = x->p;
  while (is_word(*x->p)) x->p++;
  if (x->p == s) { lx_fail(x, "expected %s", what); return NULL; }
  return arena_strndup(&x->m->a, s, (size_t)(x->p - s));
}
static int lx_int(Lx *x, const char *what, int *v) {
  const char *w = lx_word(x, what);
  if (!w) return -1;
  char *e;
  long k = strtol(w, &e, 10);
  if (*e || k < 0 || k > 64) return lx_fail(x, "expected %s (a small non-negative integer)", what);
  *v = (int)k;
  return 0;
}

static HfNode *parse_expr(Lx *x, int depth) {
  if (depth > 16) { lx_fail(x, "an expression nested too deep", NULL); return NULL; }
  const char *w = lx_word(x, "a parameter name or t(...), flat(...), cat(...)");
  if (!w) return NULL;
  HfNode *n = arena_alloc(&x->m->a, sizeof *n);
  n->split = -1;
  int call = (!strcmp(w, "t") || !strcmp(w, "flat") || !strcmp(w, "cat")) && (lx_ws(x), *x->p == '(');
  if (!call) {
    if (!strcmp(w, "pad") || !strcmp(w, "prefix")) { lx_fail(x, "%s(...) only around a whole expression", w); return NULL; }
    n->kind = HN_LEAF;
    n->pat = w;
    if (lx_punct(x, ":") && lx_int(x, "a dim count after ':'", &n->split)) return NULL;
    return n;
  }
  lx_punct(x, "(");
  VEC(HfNode *) kids = {0};
  if (!strcmp(w, "cat")) {
    n->kind = HN_CAT;
    if (lx_int(x, "the dim to concatenate along", &n->axis) || lx_expect(x, ",")) return NULL;
  } else n->kind = !strcmp(w, "t") ? HN_T : HN_FLAT;
  for (;;) {
    HfNode *k = parse_expr(x, depth + 1);
    if (!k) { free(kids.a); return NULL; }
    VEC_PUSH(kids, k);
    if (n->kind == HN_CAT && lx_punct(x, ",")) continue;
    break;
  }
  if (lx_expect(x, ")")) { free(kids.a); return NULL; }
  n->n = kids.n;
  n->kid = arena_alloc(&x->m->a, (size_t)kids.n * sizeof *n->kid);
  memcpy(n->kid, kids.a, (size_t)kids.n * sizeof *n->kid);
  free(kids.a);
  return n;
}

static int parse_val(Lx *x, HfVal *v) {
  memset(v, 0, sizeof *v);
  lx_ws(x);
  if (*x->p == '"') {
    const char *s = ++x->p;
    while (*x->p && *x->p != '"' && *x->p != '\n') x->p++;
    if (*x->p != '"') return lx_fail(x, "unterminated string", NULL);
    v->kind = HV_STR;
    v->str = arena_strndup(&x->m->a, s, (size_t)(x->p - s));
    x->p++;
    return 0;
  }
  const char *w = lx_word(x, "a value: a number, \"text\", true, false, null, seq_len, dim(P, k), count(P), attr(op, name)");
  if (!w) return -1;
  if (!strcmp(w, "true") || !strcmp(w, "false")) { v->kind = HV_BOOL; v->boolean = w[0] == 't'; return 0; }
  if (!strcmp(w, "null")) { v->kind = HV_NULL; return 0; }
  if (!strcmp(w, "seq_len")) { v->kind = HV_SEQ; return 0; }
  if (!strcmp(w, "dim") || !strcmp(w, "count") || !strcmp(w, "attr")) {
    if (lx_expect(x, "(")) return -1;
    v->kind = w[0] == 'd' ? HV_DIM : w[0] == 'c' ? HV_COUNT : HV_ATTR;
    if (!(v->str = lx_word(x, v->kind == HV_ATTR ? "an op name" : "a parameter name"))) return -1;
    if (v->kind == HV_DIM && (lx_expect(x, ",") || lx_int(x, "a dim index", &v->k))) return -1;
    if (v->kind == HV_ATTR) {
      int op = ir_op_lookup(v->str);
      if (op < 0) return lx_fail(x, "'%s' is not an IR op", v->str);
      if (lx_expect(x, ",") || !(v->attr = lx_word(x, "an attribute name"))) return -1;
      char names[128];   /* v->k: the attribute's slot in fa[] */
      snprintf(names, sizeof names, "%s", ir_ops[op].fattrs);
      char *t = strtok(names, " ");
      for (v->k = 0; t && strcmp(t, v->attr); t = strtok(NULL, " ")) v->k++;
      if (!t) return lx_fail(x, "the op has no float attribute '%s' (ops.def)", v->attr);
    }
    return lx_expect(x, ")");
  }
  char *e;
  v->num = strtod(w, &e);
  if (*e || !isfinite(v->num)) return lx_fail(x, "'%s' is not a value", w);
  v->kind = HV_NUM;
  v->is_int = !strpbrk(w, ".eE") && fabs(v->num) < 9e15;
  return 0;
}

static int valid_pattern(Lx *x, const char *s) {
  const char *b = strchr(s, '{');
  if (!b && !strchr(s, '}')) return 0;
  if (!b || strncmp(b, "{i}", 3) || strchr(b + 3, '{') || strchr(b + 3, '}') || strchr(s, '}') < b)
    return lx_fail(x, "'%s': the only placeholder is {i}, once", s);
  return 0;
}
static int expr_patterns_ok(Lx *x, const HfNode *n) {
  if (n->kind == HN_LEAF) return valid_pattern(x, n->pat);
  for (int i = 0; i < n->n; i++) if (expr_patterns_ok(x, n->kid[i])) return -1;
  return 0;
}

static int parse_line(Lx *x) {
  HfMap *m = x->m;
  const char *kw = lx_word(x, "a keyword (model_type, architecture, strip_prefix, require, config, tensor, tied, ignore)");
  if (!kw) return -1;
  if (!strcmp(kw, "model_type") || !strcmp(kw, "architecture") || !strcmp(kw, "strip_prefix")) {
    const char *w = lx_word(x, "a word");
    if (!w) return -1;
    if (kw[0] == 'm') m->model_type = w;
    else if (kw[0] == 'a') m->arch = w;
    else m->strip = w;
  } else if (!strcmp(kw, "require") || !strcmp(kw, "ignore")) {
    const char *w = lx_word(x, kw[0] == 'r' ? "an op name" : "a tensor name");
    if (!w) return -1;
    if (kw[0] == 'r' && ir_op_lookup(w) < 0) return lx_fail(x, "'%s' is not an IR op", w);
    if (kw[0] == 'i' && valid_pattern(x, w)) return -1;
    HfWord e = {w, x->line};
    if (kw[0] == 'r') VEC_PUSH(m->require, e);
    else VEC_PUSH(m->ignore, e);
  } else if (!strcmp(kw, "config")) {
    HfConf c = {0};
    c.line = x->line;
    if (!(c.key = lx_word(x, "a config.json key"))) return -1;
    c.rel = lx_punct(x, "<=") ? '<' : lx_punct(x, ">=") ? '>' : lx_punct(x, "=") ? '=' : 0;
    if (!c.rel) return lx_fail(x, "expected '=', '<=' or '>=' after the key", NULL);
    if (parse_val(x, &c.v)) return -1;
    if (!lx_end(x)) {
      const char *d = lx_word(x, "'default'");
      if (!d || strcmp(d, "default")) return lx_fail(x, "expected 'default VALUE' or the end of the line", NULL);
      if (parse_val(x, &c.def)) return -1;
      if (c.def.kind != HV_NUM && c.def.kind != HV_STR && c.def.kind != HV_BOOL && c.def.kind != HV_NULL)
        return lx_fail(x, "a default is a number, a string, true, false or null", NULL);
      c.has_def = 1;
    }
    if (c.rel != '=' && c.v.kind != HV_DIM && c.v.kind != HV_COUNT && c.v.kind != HV_SEQ && c.v.kind != HV_NUM)
      return lx_fail(x, "'<=' and '>=' compare numbers", NULL);
    VEC_PUSH(m->conf, c);
  } else if (!strcmp(kw, "tensor")) {
    HfRule r = {0};
    r.line = x->line;
    if (!(r.hf = lx_word(x, "a Hugging Face tensor name")) || valid_pattern(x, r.hf) || lx_expect(x, "=")) return -1;
    lx_ws(x);
    const char *save = x->p;
    const char *w = lx_word(x, "an expression");
    if (!w) return -1;
    if ((!strcmp(w, "pad") || !strcmp(w, "prefix")) && lx_punct(x, "(")) {
      r.rows = w[0] == 'p' && w[1] == 'a' ? 1 : -1;
      if (!(r.e = parse_expr(x, 0)) || lx_expect(x, ")")) return -1;
    } else {
      x->p = save;
      if (!(r.e = parse_expr(x, 0))) return -1;
    }
    if (expr_patterns_ok(x, r.e)) return -1;
    VEC_PUSH(m->rules, r);
  } else if (!strcmp(kw, "tied")) {
    HfTied t = {0};
    t.line = x->line;
    if (!(t.hf = lx_word(x, "a Hugging Face tensor name")) || lx_expect(x, "=") ||
        !(t.same = lx_word(x, "the Hugging Face tensor it equals")))
      return -1;
    if (strchr(t.hf, '{') || strchr(t.same, '{')) return lx_fail(x, "tied names take no {i}", NULL);
    VEC_PUSH(m->tied, t);
  } else
    return lx_fail(x, "unknown keyword '%s'", kw);
  if (!lx_end(x)) return lx_fail(x, "unexpected text at the end of the line", NULL);
  return 0;
}

static int map_parse(HfMap *m, const char *path, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  arena_init(&m->a);
  m->path = arena_strdup(&m->a, path);
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  size_t bl = strlen(base);
  m->name = arena_strndup(&m->a, base, bl > 4 && !strcmp(base + bl - 4, ".map") ? bl - 4 : bl);
  size_t len;
  char *text = ts_read_file_max(path, 1u << 20, &len);
  if (!text) return ts_errf(err, errlen, "cannot read the Hugging Face map %s: %s", path, strerror(errno));
  if (strlen(text) != len) {
    free(text);
    return ts_errf(err, errlen, "%s: a NUL byte in a map file", path);
  }
  Lx x = {m, text, text, 1, err, errlen, 0};
  while (*x.p && !x.failed) {
    x.line0 = x.p;
    if (!lx_end(&x)) parse_line(&x);
    while (*x.p && *x.p != '\n') x.p++;
    if (*x.p == '\n') { x.p++; x.line++; }
  }
  free(text);
  if (!x.failed && (!m->model_type || !m->arch))
    ts_errf(err, errlen, "%s: a map needs a `model_type` and an `architecture` line", path), x.failed = 1;
  return x.failed ? -1 : 0;
}

/* ---- the model's parameters ---- */
typedef struct { const char *name; IrDtype dtype; int rank; int64_t dim[IR_MAX_RANK]; const double *v; } HfParam;
typedef struct { HfParam *a; int n; } Catalog;

static int by_param_name(const void *a, const void *b) { return strcmp(((const HfParam *)a)->name, ((const HfParam *)b)->name); }
static const HfParam *cat_find(const Catalog *c, const char *name) {
  HfParam key = {.name = name};
  return c->n ? bsearch(&key, c->a, (size_t)c->n, sizeof *c->a, by_param_name) : NULL;
}

/* Every parameter of the plan's programs (a pipeline's stages hold
 * different ones) in its global logical shape. */
static void catalog_of_programs(Catalog *c, const IrModule *const *mods, int nm) {
  memset(c, 0, sizeof *c);
  for (int k = 0; k < nm; k++)
    for (int i = 0; i < mods[k]->states.n; i++) {
      const IrState *s = &mods[k]->states.a[i];
      if (s->kind != IR_STATE_PARAM) continue;
      int seen = 0;
      for (int j = 0; j < c->n && !seen; j++) seen = !strcmp(c->a[j].name, s->name);
      if (seen) continue;
      c->a = ts_xrealloc(c->a, (size_t)(c->n + 1) * sizeof *c->a);
      HfParam *q = &c->a[c->n++];
      *q = (HfParam){s->name, s->type.dtype, s->type.rank, {0}, NULL};
      for (int d = 0; d < s->type.rank; d++) {
        int64_t g = s->type.dim[d];
        for (int a = 0; a < IR_AXIS_COUNT; a++)
          if (s->sh.split[d] & (1u << a)) g *= ir_axis_size(mods[k], (IrAxis)a);
        q->dim[d] = s->logical[d] > 0 ? s->logical[d] : g;
      }
    }
  if (c->n) qsort(c->a, (size_t)c->n, sizeof *c->a, by_param_name);
}

static void catalog_of_params(Catalog *c, const RtParams *ps) {
  c->n = ps->n;
  c->a = ts_xcalloc((size_t)(ps->n ? ps->n : 1), sizeof *c->a);
  for (int i = 0; i < ps->n; i++) {
    c->a[i] = (HfParam){ps->a[i].name, ps->a[i].dtype, ps->a[i].rank, {0}, ps->a[i].data};
    memcpy(c->a[i].dim, ps->a[i].dim, sizeof c->a[i].dim);
  }
  if (c->n) qsort(c->a, (size_t)c->n, sizeof *c->a, by_param_name);
}

static int64_t numel_of(const int64_t *d, int r) {
  int64_t n = 1;
  for (int i = 0; i < r; i++) n *= d[i];
  return n;
}
static void shape_text(StrBuf *b, const int64_t *d, int r) {
  sb_putc(b, '[');
  for (int i = 0; i < r; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)d[i]);
  sb_putc(b, ']');
}

/* ---- patterns: {i} stands for a layer index ---- */
/* 1 if name matches pat; *i gets the index (-1 without {i}). */
static int pat_match(const char *pat, const char *name, int64_t *i) {
  const char *b = strstr(pat, "{i}");
  *i = -1;
  if (!b) return !strcmp(pat, name);
  size_t pre = (size_t)(b - pat);
  if (strncmp(pat, name, pre)) return 0;
  const char *d = name + pre, *e = d;
  while (isdigit((unsigned char)*e)) e++;
  if (e == d || (e - d > 1 && *d == '0') || e - d > 12 || strcmp(e, b + 3)) return 0;
  *i = strtoll(d, NULL, 10);
  return 1;
}
/* pat with {i} replaced by i, into b (reset first). */
static const char *pat_fill(StrBuf *b, const char *pat, int64_t i) {
  b->n = 0;
  const char *p = strstr(pat, "{i}");
  if (!p) sb_puts(b, pat);
  else {
    sb_write(b, pat, (size_t)(p - pat));
    sb_printf(b, "%lld", (long long)i);
    sb_puts(b, p + 3);
  }
  sb_putc(b, 0);
  b->n--;
  return b->p;
}

static const HfNode *first_leaf(const HfNode *n) { return n->kind == HN_LEAF ? n : first_leaf(n->kid[0]); }

static int by_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The layer indices a rule takes: those for which its first parameter
 * exists (one instance, -1, for a rule without {i}; none if it is absent). */
static int rule_instances(const HfRule *r, const Catalog *c, int64_t **out) {
  const char *pat = first_leaf(r->e)->pat;
  int n = 0;
  *out = ts_xmalloc((size_t)(c->n + 1) * sizeof **out);
  for (int k = 0; k < c->n; k++) {
    int64_t i;
    if (pat_match(pat, c->a[k].name, &i)) (*out)[n++] = i;
  }
  if (n) qsort(*out, (size_t)n, sizeof **out, by_i64);   /* ascending (the catalog is by name: 10 before 2) */
  return n;
}

/* ---- an instance of a rule: its parameters and shapes ---- */
typedef struct {
  const HfParam *leaf[16];
  int nleaf;
} Inst;

static int resolve(const HfMap *m, const HfRule *r, HfNode *n, int64_t i, const Catalog *c, Inst *in, StrBuf *tmp,
                   char *err, size_t errlen) {
  if (n->kind == HN_LEAF) {
    const char *name = pat_fill(tmp, n->pat, i);
    const HfParam *q = cat_find(c, name);
    if (!q) return ts_errf(err, errlen, "%s:%d: the model has no parameter '%s'", m->path, r->line, name);
    if (in->nleaf == 16) return ts_errf(err, errlen, "%s:%d: more than 16 parameters in one tensor", m->path, r->line);
    n->leaf = in->nleaf;
    in->leaf[in->nleaf++] = q;
    if (n->split < 0) {
      n->rank = q->rank;
      memcpy(n->dim, q->dim, sizeof n->dim);
    } else {
      if (n->split > q->rank)
        return ts_errf(err, errlen, "%s:%d: '%s:%d' but %s has %d dims", m->path, r->line, name, n->split, name, q->rank);
      n->rank = 2;
      n->dim[0] = numel_of(q->dim, n->split);
      n->dim[1] = numel_of(q->dim + n->split, q->rank - n->split);
    }
    return 0;
  }
  for (int k = 0; k < n->n; k++)
    if (resolve(m, r, n->kid[k], i, c, in, tmp, err, errlen)) return -1;
  const HfNode *a = n->kid[0];
  if (n->kind == HN_FLAT) {
    n->rank = 1;
    n->dim[0] = numel_of(a->dim, a->rank);
  } else if (n->kind == HN_T) {
    if (a->rank != 2) return ts_errf(err, errlen, "%s:%d: t(...) of a tensor with %d dims (a matrix is needed: P:k)", m->path, r->line, a->rank);
    n->rank = 2;
    n->dim[0] = a->dim[1];
    n->dim[1] = a->dim[0];
  } else {   /* cat */
    n->rank = a->rank;
    memcpy(n->dim, a->dim, sizeof n->dim);
    if (n->axis >= a->rank) return ts_errf(err, errlen, "%s:%d: cat along dim %d of tensors with %d dims", m->path, r->line, n->axis, a->rank);
    for (int k = 1; k < n->n; k++) {
      const HfNode *b = n->kid[k];
      int same = b->rank == a->rank;
      for (int d = 0; same && d < a->rank; d++) same = d == n->axis || b->dim[d] == a->dim[d];
      if (!same) {
        StrBuf s = {0};
        shape_text(&s, a->dim, a->rank);
        sb_puts(&s, " and ");
        shape_text(&s, b->dim, b->rank);
        int rc = ts_errf(err, errlen, "%s:%d: cat along dim %d of %s: the other dims differ", m->path, r->line, n->axis, s.p);
        sb_free(&s);
        return rc;
      }
      n->dim[n->axis] += b->dim[n->axis];
    }
  }
  return 0;
}

/* Element `flat` (row-major) of n's value: which leaf and its element. */
static int64_t node_map(const HfNode *n, int64_t flat, int *leaf) {
  switch (n->kind) {
    case HN_LEAF: *leaf = n->leaf; return flat;
    case HN_FLAT: return node_map(n->kid[0], flat, leaf);
    case HN_T: {   /* n is [b, a] of the kid's [a, b] */
      int64_t a = n->dim[1], b = n->dim[0], r = flat / a, c = flat % a;
      return node_map(n->kid[0], c * b + r, leaf);
    }
    case HN_CAT: {
      int64_t inner = numel_of(n->dim + n->axis + 1, n->rank - n->axis - 1), along = n->dim[n->axis];
      int64_t o = flat / (along * inner), rem = flat % (along * inner), x = rem / inner, in = rem % inner;
      for (int k = 0; k < n->n; k++) {
        int64_t e = n->kid[k]->dim[n->axis];
        if (x < e) return node_map(n->kid[k], (o * e + x) * inner + in, leaf);
        x -= e;
      }
    }
  }
  TS_ASSERT(!"node_map: index outside the expression");
  return 0;
}

/* ---- config.json values ---- */
typedef struct {
  const HfMap *m;
  const Catalog *cat;
  const IrModule *const *mods;
  int nmods;
} Ctx;

/* v's value for this model into *out (a number, string, bool or null). */
static int eval_val(const Ctx *c, const HfConf *cf, const HfVal *v, HfVal *out, char *err, size_t errlen) {
  *out = *v;
  if (v->kind == HV_DIM) {
    const HfParam *q = cat_find(c->cat, v->str);
    if (!q) return ts_errf(err, errlen, "%s:%d: the model has no parameter '%s'", c->m->path, cf->line, v->str);
    if (v->k >= q->rank) return ts_errf(err, errlen, "%s:%d: dim %d of '%s', which has %d", c->m->path, cf->line, v->k, v->str, q->rank);
    *out = (HfVal){.kind = HV_NUM, .num = (double)q->dim[v->k], .is_int = 1};
  } else if (v->kind == HV_COUNT) {
    int n = 0;
    for (int k = 0; k < c->cat->n; k++) {
      int64_t i;
      n += pat_match(v->str, c->cat->a[k].name, &i);
    }
    *out = (HfVal){.kind = HV_NUM, .num = n, .is_int = 1};
  } else if (v->kind == HV_SEQ) {
    *out = (HfVal){.kind = HV_NUM, .num = (double)c->mods[0]->train.seq_len, .is_int = 1};
  } else if (v->kind == HV_ATTR) {
    int op = ir_op_lookup(v->str), slot = v->k, found = 0;
    double x = 0;
    for (int k = 0; k < c->nmods; k++)
      for (int b = 0; b < c->mods[k]->blocks.n; b++)
        for (int i = 0; i < c->mods[k]->blocks.a[b].n; i++) {
          const IrNode *nd = &c->mods[k]->blocks.a[b].nodes[i];
          if ((int)nd->op != op) continue;
          if (found && nd->fa[slot] != x)
            return ts_errf(err, errlen, "%s:%d: the model's %s ops have %s %g and %g; config.json's %s can say only one",
                           c->m->path, cf->line, v->str, v->attr, x, nd->fa[slot], cf->key);
          x = nd->fa[slot];
          found = 1;
        }
    if (!found) return ts_errf(err, errlen, "%s:%d: the model has no %s op (for config.json's %s)", c->m->path, cf->line, v->str, cf->key);
    *out = (HfVal){.kind = HV_NUM, .num = x, .is_int = 0};
  }
  return 0;
}

static void val_text(StrBuf *b, const HfVal *v) {
  char d[40];
  switch (v->kind) {
    case HV_NUM:
      if (v->is_int) sb_printf(b, "%lld", (long long)v->num);
      else {
        ts_fmt_double(d, sizeof d, v->num);
        sb_puts(b, d);
        if (!strpbrk(d, ".eE")) sb_puts(b, ".0");
      }
      break;
    case HV_STR: ts_json_put_string(b, v->str); break;
    case HV_BOOL: sb_puts(b, v->boolean ? "true" : "false"); break;
    default: sb_puts(b, "null"); break;
  }
}

/* config.json's value j (NULL: absent) against cf for this model. */
static int check_conf(const Ctx *c, const HfConf *cf, const TsJson *j, char *err, size_t errlen) {
  HfVal want, got = {0};
  if (eval_val(c, cf, &cf->v, &want, err, errlen)) return -1;
  if (j && j->kind == TS_JSON_NULL && cf->v.kind != HV_NULL) j = NULL;   /* null: transformers' default */
  if (!j) {
    if (!cf->has_def) return 0;   /* not stated, no known default: the tensors' shapes check what they can */
    got = cf->def;
  } else
    switch (j->kind) {
      case TS_JSON_NUMBER: got = (HfVal){.kind = HV_NUM, .num = j->num, .is_int = j->is_int}; break;
      case TS_JSON_STRING: got = (HfVal){.kind = HV_STR, .str = j->str}; break;
      case TS_JSON_BOOL: got = (HfVal){.kind = HV_BOOL, .boolean = j->boolean}; break;
      case TS_JSON_NULL: got.kind = HV_NULL; break;
      default: return ts_errf(err, errlen, "config.json: %s is %s; %s:%d expects a value", cf->key, ts_json_kind_name(j->kind), c->m->path, cf->line);
    }
  int ok;
  if (want.kind == HV_NUM && got.kind == HV_NUM) {
    double tol = 1e-9 * fmax(fabs(want.num), fabs(got.num));
    ok = cf->rel == '=' ? fabs(want.num - got.num) <= tol : cf->rel == '<' ? got.num <= want.num + tol : got.num >= want.num - tol;
  } else if (want.kind == HV_NUM && got.kind == HV_NULL && cf->rel != '=')
    ok = 1;   /* a bound not stated */
  else
    ok = want.kind == got.kind && (want.kind != HV_STR || !strcmp(want.str, got.str)) &&
         (want.kind != HV_BOOL || want.boolean == got.boolean);
  if (ok) return 0;
  StrBuf a = {0}, b = {0};
  val_text(&a, &got);
  val_text(&b, &want);
  const char *how = cf->rel == '=' ? "" : cf->rel == '<' ? "at most " : "at least ";
  int rc = ts_errf(err, errlen, "config.json: %s is %s%s, but this model needs %s%s (%s:%d)", cf->key, a.p,
                   j ? "" : " (its default)", how, b.p, c->m->path, cf->line);
  sb_free(&a);
  sb_free(&b);
  return rc;
}

static int check_requires(const Ctx *c, char *err, size_t errlen) {
  for (int r = 0; r < c->m->require.n; r++) {
    int op = ir_op_lookup(c->m->require.a[r].s), found = 0;
    for (int k = 0; k < c->nmods && !found; k++)
      for (int b = 0; b < c->mods[k]->blocks.n && !found; b++)
        for (int i = 0; i < c->mods[k]->blocks.a[b].n && !found; i++) found = (int)c->mods[k]->blocks.a[b].nodes[i].op == op;
    if (!found)
      return ts_errf(err, errlen, "the model has no %s op, which %s (%s:%d) requires: it is not this architecture",
                     c->m->require.a[r].s, c->m->model_type, c->m->path, c->m->require.a[r].line);
  }
  return 0;
}

/* Every parameter is named by exactly one rule instance; every rule has
 * an instance and each instance all its parameters. */
static int check_cover(const Ctx *c, char *err, size_t errlen) {
  int *by = ts_xcalloc((size_t)(c->cat->n ? c->cat->n : 1), sizeof *by);
  StrBuf tmp = {0};
  int rc = 0;
  for (int r = 0; r < c->m->rules.n && rc == 0; r++) {
    HfRule *ru = &c->m->rules.a[r];
    int64_t *is;
    int n = rule_instances(ru, c->cat, &is);
    if (n == 0)
      rc = ts_errf(err, errlen, "the model has no parameter '%s' (%s:%d)", first_leaf(ru->e)->pat, c->m->path, ru->line);
    for (int k = 0; k < n && rc == 0; k++) {
      Inst in = {.nleaf = 0};
      if (resolve(c->m, ru, ru->e, is[k], c->cat, &in, &tmp, err, errlen)) { rc = -1; break; }
      for (int l = 0; l < in.nleaf && rc == 0; l++) {
        int at = (int)(in.leaf[l] - c->cat->a);
        if (by[at])
          rc = ts_errf(err, errlen, "parameter '%s' is named by two tensors of the map (%s:%d and line %d)",
                       in.leaf[l]->name, c->m->path, by[at], ru->line);
        by[at] = ru->line;
      }
    }
    free(is);
  }
  for (int k = 0; k < c->cat->n && rc == 0; k++)
    if (!by[k])
      rc = ts_errf(err, errlen, "%s gives no Hugging Face tensor for parameter '%s' (the map names this model's "
                   "parameters as %s's layers do; another model needs its own map)", c->m->path, c->cat->a[k].name,
                   c->m->model_type);
  sb_free(&tmp);
  free(by);
  return rc;
}

/* ---- where the files are ---- */
const char *rt_hf_map_dir(char *buf, size_t n) {
  const char *e = getenv("TESSERA_STDLIB");
  if (e && *e) snprintf(buf, n, "%s/hf", e);
  else snprintf(buf, n, "%s/stdlib/hf", ts_data_root());
  return buf;
}

/* The map `name` names: a path (has a '/' or ends in .map) or NAME in the map directory. */
static void map_path(const char *name, char *buf, size_t n) {
  size_t l = strlen(name);
  if (strchr(name, '/') || (l > 4 && !strcmp(name + l - 4, ".map"))) snprintf(buf, n, "%s", name);
  else {
    char dir[2048];
    snprintf(buf, n, "%s/%s.map", rt_hf_map_dir(dir, sizeof dir), name);
  }
}

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.map files of the map directory (dir gets its path), sorted by
 * name so that no choice depends on readdir's order; NULL-terminated,
 * malloc'd (map_names_free).  NULL if the directory cannot be read. */
static char **map_names(char *dir, size_t n) {
  DIR *d = opendir(rt_hf_map_dir(dir, n));
  if (!d) return NULL;
  VEC(char *) names = {0};
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (l > 4 && !strcmp(e->d_name + l - 4, ".map")) { char *s = ts_xstrdup(e->d_name); VEC_PUSH(names, s); }
  }
  closedir(d);
  if (names.n) qsort(names.a, (size_t)names.n, sizeof *names.a, by_str);
  char *end = NULL;
  VEC_PUSH(names, end);
  return names.a;
}
static void map_names_free(char **names) {
  for (int i = 0; names && names[i]; i++) free(names[i]);
  free(names);
}

/* "gpt2, llama": the maps there are. */
static void list_maps(StrBuf *b) {
  char dir[4096];
  char **names = map_names(dir, sizeof dir);
  for (int i = 0; names && names[i]; i++) sb_printf(b, "%s%.*s", i ? ", " : "", (int)(strlen(names[i]) - 4), names[i]);
  if (!names || !names[0]) sb_puts(b, "none");
  map_names_free(names);
}

/* ---- import ---- */
typedef struct {
  RtStFile *f;
  int nf;
  char **used;              /* used[file][tensor] */
} Files;

static void files_free(Files *fs) {
  for (int i = 0; i < fs->nf; i++) {
    rt_st_close(&fs->f[i]);
    free(fs->used[i]);
  }
  free(fs->f);
  free(fs->used);
  memset(fs, 0, sizeof *fs);
}

static int files_add(Files *fs, const char *path, char *err, size_t errlen) {
  fs->f = ts_xrealloc(fs->f, (size_t)(fs->nf + 1) * sizeof *fs->f);
  fs->used = ts_xrealloc(fs->used, (size_t)(fs->nf + 1) * sizeof *fs->used);
  if (rt_st_open(&fs->f[fs->nf], path, err, errlen) != 0) return -1;
  fs->used[fs->nf] = ts_xcalloc((size_t)(fs->f[fs->nf].n ? fs->f[fs->nf].n : 1), 1);
  for (int k = 0; k < fs->f[fs->nf].n; k++)   /* names unique over the files */
    for (int g = 0; g < fs->nf; g++)
      if (rt_st_find(&fs->f[g], fs->f[fs->nf].a[k].name)) {
        int rc = ts_errf(err, errlen, "tensor '%s' is in both %s and %s", fs->f[fs->nf].a[k].name, fs->f[g].path, path);
        fs->nf++;
        return rc;
      }
  fs->nf++;
  return 0;
}

/* The tensor `name` (or, for a map with strip_prefix P, name without P). */
static const RtStTensor *files_find(Files *fs, const HfMap *m, const char *name, int *fi, int *ti) {
  for (int pass = 0; pass < 2; pass++) {
    const char *n = name;
    if (pass == 1) {
      size_t l = m->strip ? strlen(m->strip) : 0;
      if (!l || strncmp(name, m->strip, l)) break;
      n = name + l;
    }
    for (int i = 0; i < fs->nf; i++) {
      const RtStTensor *t = rt_st_find(&fs->f[i], n);
      if (t) {
        *fi = i;
        *ti = (int)(t - fs->f[i].a);
        return t;
      }
    }
  }
  return NULL;
}

/* The directory of path (a .safetensors file or a directory) into dir;
 * *isdir says which it is. */
static int weights_dir(const char *path, char *dir, size_t n, int *isdir, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st) != 0) return ts_errf(err, errlen, "--init-from: cannot read %s: %s", path, strerror(errno));
  *isdir = S_ISDIR(st.st_mode);
  snprintf(dir, n, "%s", path);
  if (!*isdir) {
    char *s = strrchr(dir, '/');
    if (s) *s = 0;
    else snprintf(dir, n, ".");
  }
  return 0;
}

/* dir/config.json parsed into a (required when path is a directory; NULL
 * if a lone file has none beside it). */
static int read_config(const char *dir, int isdir, Arena *a, const TsJson **config, char *err, size_t errlen) {
  char p[8192];
  size_t len;
  *config = NULL;
  snprintf(p, sizeof p, "%s/config.json", dir);
  if (!isdir && access(p, F_OK) != 0) return 0;
  char *text = ts_read_file_max(p, 16u << 20, &len);
  if (!text) return ts_errf(err, errlen, "--init-from: cannot read %s: %s (a Hugging Face model directory has one)", p, strerror(errno));
  *config = ts_json_parse(a, text, len, p, err, errlen);
  free(text);
  if (!*config) return -1;
  if ((*config)->kind != TS_JSON_OBJECT) return ts_errf(err, errlen, "%s is not a JSON object", p);
  return 0;
}

/* The safetensors files of path (the file itself, or the directory's
 * model.safetensors or the shards its index names) into fs. */
static int open_weights(const char *path, const char *dir, int isdir, Files *fs, Arena *a, char *err, size_t errlen) {
  char p[8192];
  size_t len;
  if (!isdir) return files_add(fs, path, err, errlen);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  if (access(p, F_OK) != 0) {
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (access(p, F_OK) != 0)
      return ts_errf(err, errlen, "--init-from: %s has neither model.safetensors nor model.safetensors.index.json "
                     "(only safetensors weights are read: not pytorch_model.bin)", dir);
    return files_add(fs, p, err, errlen);
  }
  char *text = ts_read_file_max(p, 64u << 20, &len);
  if (!text) return ts_errf(err, errlen, "--init-from: cannot read %s: %s", p, strerror(errno));
  const TsJson *ix = ts_json_parse(a, text, len, p, err, errlen), *wm = ts_json_get(ix, "weight_map");
  free(text);
  if (!ix) return -1;
  if (!wm || wm->kind != TS_JSON_OBJECT) return ts_errf(err, errlen, "%s has no \"weight_map\" object", p);
  const char **done = ts_xcalloc((size_t)(wm->n ? wm->n : 1), sizeof *done);
  int nd = 0, rc = 0;
  for (int i = 0; i < wm->n && rc == 0; i++) {
    const TsJson *f = wm->items[i];
    if (f->kind != TS_JSON_STRING || !f->str[0] || strchr(f->str, '/') || !strcmp(f->str, "..") || !strcmp(f->str, "."))
      rc = ts_errf(err, errlen, "%s: weight_map.%s is not a file name in that directory", p, wm->keys[i]);
    int seen = 0;
    for (int k = 0; k < nd && !seen; k++) seen = !strcmp(done[k], f->str);
    if (rc || seen) continue;
    done[nd++] = f->str;
    char fp[8192];
    snprintf(fp, sizeof fp, "%s/%s", dir, f->str);
    rc = files_add(fs, fp, err, errlen);
  }
  for (int i = 0; i < wm->n && rc == 0; i++) {   /* the index and the files agree */
    int fi, ti;
    HfMap none = {0};
    if (!files_find(fs, &none, wm->keys[i], &fi, &ti))
      rc = ts_errf(err, errlen, "%s names tensor '%s', which none of its files holds", p, wm->keys[i]);
  }
  free(done);
  return rc;
}

/* One rule instance: the tensor checked, and the parameters this rank
 * holds among its leaves set from it. */
static int import_inst(RtProgram *p, const Ctx *c, Files *fs, HfRule *ru, int64_t i, StrBuf *tmp, int *ntensors,
                       char *err, size_t errlen) {
  Inst in = {.nleaf = 0};
  if (resolve(c->m, ru, ru->e, i, c->cat, &in, tmp, err, errlen)) return -1;
  char name[1024];
  snprintf(name, sizeof name, "%s", pat_fill(tmp, ru->hf, i));
  int fi, ti;
  const RtStTensor *t = files_find(fs, c->m, name, &fi, &ti);
  const HfNode *e = ru->e;
  if (!t) return ts_errf(err, errlen, "the weights have no tensor '%s' (for parameter '%s'; %s:%d)", name, in.leaf[0]->name, c->m->path, ru->line);
  if (!rt_st_dtype_is_float(t->dtype))
    return ts_errf(err, errlen, "tensor '%s' is %s, not a float tensor (%s)", name, rt_st_dtype_name(t->dtype), fs->f[fi].path);
  int ok = t->rank == e->rank;
  for (int d = 0; ok && d < e->rank; d++)
    ok = t->dim[d] == e->dim[d] || (d == 0 && ru->rows == 1 && t->dim[0] < e->dim[0]) || (d == 0 && ru->rows == -1 && t->dim[0] > e->dim[0]);
  if (!ok) {
    StrBuf a = {0}, b = {0};
    shape_text(&a, t->dim, t->rank);
    shape_text(&b, e->dim, e->rank);
    int rc = ts_errf(err, errlen, "tensor '%s' is %s in the weights; this model needs %s%s (from %s%s; %s:%d)", name, a.p,
                     ru->rows == 1 ? "at most " : ru->rows == -1 ? "at least " : "", b.p, in.leaf[0]->name,
                     in.nleaf > 1 ? " and others" : "", c->m->path, ru->line);
    sb_free(&a);
    sb_free(&b);
    return rc;
  }
  fs->used[fi][ti] = 1;
  (*ntensors)++;
  /* the leaves this rank holds: their state and a zeroed global buffer */
  const IrModule *m = rt_program_module(p);
  int st[16];
  double *buf[16] = {0};
  int any = 0;
  for (int l = 0; l < in.nleaf; l++) {
    st[l] = ir_state_find(m, in.leaf[l]->name);
    if (st[l] >= 0 && m->states.a[st[l]].kind == IR_STATE_PARAM) {
      buf[l] = ts_xcalloc((size_t)(numel_of(in.leaf[l]->dim, in.leaf[l]->rank) + 1), sizeof(double));
      any = 1;
    }
  }
  int rc = 0;
  if (any) {
    int64_t rows = t->dim[0] < e->dim[0] ? t->dim[0] : e->dim[0];
    int64_t n = e->rank ? rows * numel_of(e->dim + 1, e->rank - 1) : 1;
    for (int64_t h = 0; h < n && rc == 0; h++) {   /* within the common rows, the flat index is the same on both sides */
      int leaf;
      int64_t k = node_map(e, h, &leaf);
      if (!buf[leaf]) continue;
      buf[leaf][k] = rt_st_get(t, h);
      if (!isfinite(buf[leaf][k]))
        rc = ts_errf(err, errlen, "tensor '%s' holds %g at element %lld (%s): a model with such a weight cannot train",
                     name, buf[leaf][k], (long long)h, fs->f[fi].path);
    }
    for (int l = 0; l < in.nleaf && rc == 0; l++)
      if (buf[l]) rc = rt_program_set_param(p, st[l], buf[l], err, errlen);
  }
  for (int l = 0; l < in.nleaf; l++) free(buf[l]);
  return rc;
}

static int tied_check(const Ctx *c, Files *fs, const HfTied *td, char *err, size_t errlen) {
  int fi, ti, gi, ui;
  const RtStTensor *t = files_find(fs, c->m, td->hf, &fi, &ti);
  if (!t) return 0;   /* usually absent: save_pretrained drops a tied tensor */
  const RtStTensor *u = files_find(fs, c->m, td->same, &gi, &ui);
  int same = u && t->rank == u->rank && t->numel == u->numel && rt_st_dtype_is_float(t->dtype) && rt_st_dtype_is_float(u->dtype);
  for (int d = 0; same && d < t->rank; d++) same = t->dim[d] == u->dim[d];
  for (int64_t k = 0; same && k < t->numel; k++) same = rt_st_get(t, k) == rt_st_get(u, k);
  if (!same)
    return ts_errf(err, errlen, "the weights hold '%s' different from '%s': this model ties them (one tensor), so it "
                   "cannot take an untied checkpoint (%s:%d)", td->hf, td->same, c->m->path, td->line);
  fs->used[fi][ti] = 1;
  return 0;
}

static int import_all(RtProgram *p, const RtHfOpts *o, const char *path, char *how, size_t howlen, char *err,
                      size_t errlen) {
  Files fs = {0};
  Arena a;
  arena_init(&a);
  HfMap m = {0};
  Catalog cat = {0};
  const TsJson *config = NULL;
  char dir[4096], mp[4096];
  int isdir = 0, ntensors = 0;
  int rc = weights_dir(path, dir, sizeof dir, &isdir, err, errlen);
  if (rc == 0) rc = read_config(dir, isdir, &a, &config, err, errlen);
  if (rc == 0) {
    const TsJson *mt = ts_json_get(config, "model_type");
    if (o->map) map_path(o->map, mp, sizeof mp);
    else if (mt && mt->kind == TS_JSON_STRING && mt->str[0] && !strchr(mt->str, '/')) {
      map_path(mt->str, mp, sizeof mp);
      if (access(mp, F_OK) != 0) {
        StrBuf b = {0};
        list_maps(&b);
        rc = ts_errf(err, errlen, "--init-from: model_type '%s' has no map (%s); the maps: %s (--hf-map FILE names "
                     "another)", mt->str, mp, b.p);
        sb_free(&b);
      }
    } else
      rc = ts_errf(err, errlen, "--init-from %s: no config.json with a model_type says which map to use: give --hf-map NAME", path);
  }
  if (rc == 0) rc = map_parse(&m, mp, err, errlen);
  if (rc == 0) rc = open_weights(path, dir, isdir, &fs, &a, err, errlen);
  catalog_of_programs(&cat, o->programs, o->nprograms);
  Ctx c = {&m, &cat, o->programs, o->nprograms};
  if (rc == 0) {
    const TsJson *mt = ts_json_get(config, "model_type");
    if (mt && mt->kind == TS_JSON_STRING && strcmp(mt->str, m.model_type))
      rc = ts_errf(err, errlen, "config.json says model_type '%s'; the map %s is for '%s'", mt->str, m.path, m.model_type);
  }
  if (rc == 0) rc = check_requires(&c, err, errlen);
  for (int k = 0; rc == 0 && config && k < m.conf.n; k++) rc = check_conf(&c, &m.conf.a[k], ts_json_get(config, m.conf.a[k].key), err, errlen);
  if (rc == 0) rc = check_cover(&c, err, errlen);
  StrBuf tmp = {0};
  for (int r = 0; r < m.rules.n && rc == 0; r++) {
    int64_t *is;
    int n = rule_instances(&m.rules.a[r], &cat, &is);
    for (int k = 0; k < n && rc == 0; k++) rc = import_inst(p, &c, &fs, &m.rules.a[r], is[k], &tmp, &ntensors, err, errlen);
    free(is);
  }
  for (int k = 0; k < m.tied.n && rc == 0; k++) rc = tied_check(&c, &fs, &m.tied.a[k], err, errlen);
  for (int f = 0; f < fs.nf && rc == 0; f++)
    for (int t = 0; t < fs.f[f].n && rc == 0; t++) {
      if (fs.used[f][t]) continue;
      int ignored = 0;
      for (int k = 0; k < m.ignore.n && !ignored; k++) {
        int64_t i;
        const char *nm = fs.f[f].a[t].name;
        ignored = pat_match(m.ignore.a[k].s, nm, &i);
        size_t l = m.strip ? strlen(m.strip) : 0;
        if (!ignored && l && !strncmp(m.ignore.a[k].s, m.strip, l)) ignored = pat_match(m.ignore.a[k].s + l, nm, &i);
      }
      if (!ignored)
        rc = ts_errf(err, errlen, "the weights hold tensor '%s' (%s), which this model has no parameter for (%s): a "
                     "model with more layers or other parts?", fs.f[f].a[t].name, fs.f[f].path, m.path);
    }
  sb_free(&tmp);
  if (rc == 0 && how) snprintf(how, howlen, "%s (%s), %d tensors", m.model_type, m.path, ntensors);
  free(cat.a);
  map_free(&m);
  files_free(&fs);
  arena_free(&a);
  return rc;
}

int rt_hf_init_from(RtProgram *p, RtComm *world, const RtHfOpts *o, const char *path, char *how, size_t howlen,
                    char *err, size_t errlen) {
  int bad = import_all(p, o, path, how, howlen, err, errlen) != 0;
  if (!bad) bad = rt_program_push_states(p, err, errlen) != 0;
  return rt_any_failed(world, bad, "read the Hugging Face weights", err, errlen) ? -1 : 0;
}

/* ---- export ---- */
/* 1 if map m fits the model (c); else 0 with why. */
static int map_fits(const Ctx *c, char *why, size_t n) {
  if (check_requires(c, why, n) || check_cover(c, why, n)) return 0;
  HfVal v;
  for (int k = 0; k < c->m->conf.n; k++)
    if (eval_val(c, &c->m->conf.a[k], &c->m->conf.a[k].v, &v, why, n)) return 0;
  return 1;
}

/* Picks and parses the map for export into m: o->map, else the first map
 * of the directory (by name) that fits. */
static int export_map(const RtHfOpts *o, HfMap *m, Ctx *c, char *err, size_t errlen) {
  char mp[8192];
  if (o->map) {
    map_path(o->map, mp, sizeof mp);
    if (map_parse(m, mp, err, errlen)) return -1;
    c->m = m;
    char why[1024];
    if (!map_fits(c, why, sizeof why)) return ts_errf(err, errlen, "--export with %s: %s", mp, why);
    return 0;
  }
  char dir[4096];
  char **names = map_names(dir, sizeof dir);
  if (!names) return ts_errf(err, errlen, "--export: cannot read the map directory %s: %s", dir, strerror(errno));
  StrBuf tried = {0};
  int rc = -1;
  for (int i = 0; names[i] && rc; i++) {
    snprintf(mp, sizeof mp, "%s/%s", dir, names[i]);
    char why[1024];
    if (map_parse(m, mp, why, sizeof why) == 0) {
      c->m = m;
      if (map_fits(c, why, sizeof why)) { rc = 0; break; }
    }
    sb_printf(&tried, "\n  %s: %s", names[i], why);
    map_free(m);
  }
  map_names_free(names);
  if (rc) ts_errf(err, errlen, "--export --format hf: no map in %s fits this model (--hf-map FILE names one):%s", dir,
                  tried.p ? tried.p : " (there are none)");
  sb_free(&tried);
  return rc;
}

static int export_rank0(const RtHfOpts *o, const RtParams *ps, const char *dir, char *how, size_t howlen, char *err,
                        size_t errlen) {
  Catalog cat;
  catalog_of_params(&cat, ps);
  HfMap m = {0};
  Ctx c = {&m, &cat, o->programs, o->nprograms};
  int rc = export_map(o, &m, &c, err, errlen);
  if (rc == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST) rc = ts_errf(err, errlen, "--export: cannot make %s: %s", dir, strerror(errno));
  struct stat st;
  if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) rc = ts_errf(err, errlen, "--export: %s is not a directory", dir);
  VEC(RtStOut) outs = {0};
  StrBuf tmp = {0};
  Arena a;
  arena_init(&a);
  IrDtype dt = cat.n ? cat.a[0].dtype : IR_F32;
  for (int r = 0; r < m.rules.n && rc == 0; r++) {
    HfRule *ru = &m.rules.a[r];
    int64_t *is;
    int n = rule_instances(ru, &cat, &is);
    for (int k = 0; k < n && rc == 0; k++) {
      Inst in = {.nleaf = 0};
      if ((rc = resolve(&m, ru, ru->e, is[k], &cat, &in, &tmp, err, errlen))) break;
      RtStOut t = {arena_strdup(&a, pat_fill(&tmp, ru->hf, is[k])), dt == IR_F64 ? RT_ST_F64 : RT_ST_F32, ru->e->rank, {0}, NULL};
      memcpy(t.dim, ru->e->dim, sizeof t.dim);
      int64_t ne = numel_of(t.dim, t.rank);
      double *v = arena_alloc(&a, (size_t)(ne ? ne : 1) * sizeof *v);
      for (int64_t h = 0; h < ne; h++) {
        int leaf;
        int64_t q = node_map(ru->e, h, &leaf);
        v[h] = in.leaf[leaf]->v[q];
      }
      t.v = v;
      VEC_PUSH(outs, t);
    }
    free(is);
  }
  char path[8192];
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    rc = rt_st_write(path, outs.a, outs.n, err, errlen);
  }
  if (rc == 0) {
    StrBuf j = {0};
    sb_puts(&j, "{\n  \"architectures\": [");
    ts_json_put_string(&j, m.arch);
    sb_puts(&j, "],\n  \"model_type\": ");
    ts_json_put_string(&j, m.model_type);
    for (int k = 0; k < m.conf.n && rc == 0; k++) {
      HfVal v;
      if ((rc = eval_val(&c, &m.conf.a[k], &m.conf.a[k].v, &v, err, errlen))) break;
      sb_puts(&j, ",\n  ");
      ts_json_put_string(&j, m.conf.a[k].key);
      sb_puts(&j, ": ");
      val_text(&j, &v);
    }
    sb_printf(&j, ",\n  \"torch_dtype\": \"%s\"\n}\n", dt == IR_F64 ? "float64" : "float32");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (rc == 0 && ts_write_file(path, j.p, j.n) != 0) rc = ts_errf(err, errlen, "%s", ts_io_error());
    sb_free(&j);
  }
  if (rc == 0 && how) snprintf(how, howlen, "%d tensors as %s (%s)", outs.n, m.model_type, m.path);
  free(outs.a);
  arena_free(&a);
  sb_free(&tmp);
  map_free(&m);
  free(cat.a);
  return rc;
}

int rt_hf_export(RtProgram *p, RtComm *world, const RtHfOpts *o, const char *dir, char *how, size_t howlen, char *err,
                 size_t errlen) {
  RtParams *ps = rt_params_collect(p, world, err, errlen);
  int bad = !ps;
  if (ps && (!world || rt_comm_rank(world) == 0)) bad = export_rank0(o, ps, dir, how, howlen, err, errlen) != 0;
  rt_params_free(ps);
  return rt_any_failed(world, bad, "export the Hugging Face weights", err, errlen) ? -1 : 0;
}
