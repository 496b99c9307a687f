/* elaborate.c - evaluates a parsed MDL program into IR (mdl_elaborate);
 * the config/train/parallel/rules blocks are in elab_blocks.c.
 *
 * The elaborator is a tree-walking interpreter: config constants, the train
 * and parallel blocks and all int/float arithmetic are computed here; every
 * tensor operation emits an IR node into the single block "forward".  fn
 * calls are inlined (a fresh scope per call) and `repeat` is unrolled, so
 * the IR has no control flow and no symbolic sizes.  The language is
 * defined in docs/mdl.md ("Semantics and builtins"); the samples and
 * stdlib/nn.mdl use all of it.
 *
 * Scopes: the config block is one scope; the model body sees it and its
 * own arguments; a fn body sees only its arguments.  Assignments inside
 * `if` and `repeat` bodies write the enclosing scope (like Python).
 * Names that are not variables resolve to imported modules, then the fns
 * of the current module, then builtins (inside fn f, `f` is the builtin f
 * if there is one, so nn.layernorm can call the layernorm builtin).
 *
 * Parameter names are dotted paths built from naming scopes (ElabNaming):
 * one component per repeat iteration ("layers.3"), one per fn call
 * ("attention", then "attention_1" for a second call in the same scope
 * instance), then the variable the param is assigned to ("wq"). */
#include "elab_priv.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>

/* ---- values ---- */
Value elab_err(void) { Value v; memset(&v, 0, sizeof v); v.k = V_ERR; return v; }
static Value mk(VKind k, MdlLoc loc) { Value v; memset(&v, 0, sizeof v); v.k = k; v.loc = loc; return v; }
Value elab_int(int64_t i, MdlLoc loc) { Value v = mk(V_INT, loc); v.i = i; return v; }
Value elab_float(double f, MdlLoc loc) { Value v = mk(V_FLOAT, loc); v.f = f; return v; }
Value elab_bool(int b, MdlLoc loc) { Value v = mk(V_BOOL, loc); v.i = !!b; return v; }
Value elab_none(MdlLoc loc) { return mk(V_NONE, loc); }
Value elab_tensor(int id, MdlLoc loc) { Value v = mk(V_TENSOR, loc); v.i = id; return v; }
Value elab_tuple(Elab *e, VKind k, int n, MdlLoc loc) {
  Value v = mk(k, loc);
  v.n = n;
  v.items = n ? arena_alloc(&e->a, (size_t)n * sizeof *v.items) : NULL;
  return v;
}
int elab_is_num(const Value *v) { return v->k == V_INT || v->k == V_FLOAT; }
double elab_num(const Value *v) { return v->k == V_INT ? (double)v->i : v->f; }

const char *elab_kind_name(VKind k) {
  static const char *names[] = {"error", "unset", "none", "int", "float", "bool", "string",
                                "tensor", "tuple", "list", "function", "builtin function", "module"};
  return names[k];
}

const char *elab_value_desc(Elab *e, const Value *v, char *buf, size_t n) {
  switch (v->k) {
  case V_TENSOR: return elab_tstr(e, v, buf, n);
  case V_INT: snprintf(buf, n, "int %lld", (long long)v->i); break;
  case V_FLOAT: {
    char num[64];
    ts_fmt_double(num, sizeof num, v->f);
    snprintf(buf, n, "float %s", num);
    break;
  }
  case V_BOOL: snprintf(buf, n, "bool %s", v->i ? "true" : "false"); break;
  case V_STR: snprintf(buf, n, "string \"%s\"", v->s); break;
  case V_TUPLE: case V_LIST: snprintf(buf, n, "%s of %d", elab_kind_name(v->k), v->n); break;
  case V_FN: snprintf(buf, n, "function '%s'", v->fn->name); break;
  case V_BUILTIN: snprintf(buf, n, "builtin function '%s'", elab_builtin_name((int)v->i)); break;
  default: snprintf(buf, n, "%s", elab_kind_name(v->k)); break;
  }
  return buf;
}

void elab_error(Elab *e, MdlLoc loc, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  mdl_error(e->d, loc, "%s", msg);
  if (e->d->nerrors >= ELAB_MAX_ERRORS) e->abort = 1;
}

/* ---- scopes ----
 * A frame holds each name once (elab_frame_set assigns an existing one).
 * Small frames are searched from the end; once a frame has FRAME_IX_MIN
 * vars (a config block of thousands of keys) it gets an index of name
 * hashes (open addressing, slot = var index + 1), so elaborating stays
 * linear in the number of names. */
#define FRAME_IX_MIN 32

static size_t frame_hash(const char *name, int cap) {
  return (size_t)ts_hash64(name, strlen(name), 0) & (size_t)(cap - 1);
}

static void frame_ix_put(ElabFrame *f, int i) {
  size_t j = frame_hash(f->vars.a[i].name, f->ixcap);
  while (f->ix[j]) j = (j + 1) & (size_t)(f->ixcap - 1);
  f->ix[j] = i + 1;
}

static ElabVar *frame_var(ElabFrame *f, const char *name) {
  if (f->ixcap) {
    for (size_t j = frame_hash(name, f->ixcap); f->ix[j]; j = (j + 1) & (size_t)(f->ixcap - 1))
      if (strcmp(f->vars.a[f->ix[j] - 1].name, name) == 0) return &f->vars.a[f->ix[j] - 1];
    return NULL;
  }
  for (int i = f->vars.n - 1; i >= 0; i--)
    if (strcmp(f->vars.a[i].name, name) == 0) return &f->vars.a[i];
  return NULL;
}
static Value *frame_own(ElabFrame *f, const char *name) {
  ElabVar *v = frame_var(f, name);
  return v ? &v->v : NULL;
}
static ElabVar *frame_lookup_var(ElabFrame *f, const char *name) {
  for (; f; f = f->parent) {
    ElabVar *v = frame_var(f, name);
    if (v) return v;
  }
  return NULL;
}
static Value *frame_lookup(ElabFrame *f, const char *name) {
  ElabVar *v = frame_lookup_var(f, name);
  return v ? &v->v : NULL;
}
void elab_frame_set(ElabFrame *f, const char *name, Value v) {
  ElabVar *old = frame_var(f, name);
  if (old) { old->v = v; return; }
  ElabVar var = {name, v, NULL};
  VEC_PUSH(f->vars, var);
  if (f->vars.n < FRAME_IX_MIN) return;
  if (2 * f->vars.n > f->ixcap) {   /* (re)build at twice the size */
    free(f->ix);
    f->ixcap = 4 * FRAME_IX_MIN;
    while (2 * f->vars.n > f->ixcap) f->ixcap *= 2;
    f->ix = ts_xcalloc((size_t)f->ixcap, sizeof *f->ix);
    for (int i = 0; i < f->vars.n; i++) frame_ix_put(f, i);
  } else {
    frame_ix_put(f, f->vars.n - 1);
  }
}

int elab_frame_has(ElabFrame *f, const char *name) { return frame_var(f, name) != NULL; }

void elab_frame_free(ElabFrame *f) {
  free(f->vars.a);
  free(f->ix);
  f->vars.a = NULL;
  f->vars.n = f->vars.cap = 0;
  f->ix = NULL;
  f->ixcap = 0;
}

/* The next free component `base`, `base_1`, ... of a naming scope. */
static const char *naming_component(Elab *e, ElabNaming *nm, const char *base) {
  for (int i = 0; i < nm->counters.n; i++) {
    ElabCounter *c = &nm->counters.a[i];
    if (strcmp(c->name, base) == 0) return arena_printf(&e->a, "%s_%d", base, c->count++);
  }
  ElabCounter c = {base, 1};
  VEC_PUSH(nm->counters, c);
  return base;
}
/* The dotted prefix of a naming scope (repeat iterations build it lazily:
 * most iterations of big loops never need it). */
static const char *naming_prefix(Elab *e, ElabNaming *nm) {
  if (!nm->prefix)
    nm->prefix = arena_printf(&e->a, "%s%s%lld", nm->base, *nm->base ? "." : "", (long long)nm->index);
  return nm->prefix;
}
static const char *join_path(Elab *e, const char *prefix, const char *comp) {
  return *prefix ? arena_printf(&e->a, "%s.%s", prefix, comp) : comp;
}

/* State names already taken (interned pointers; open addressing). */
static int sname_insert(Elab *e, const char *s) {
  if (2 * (e->nsnames + 1) > e->capsnames) {
    int cap = e->capsnames ? 2 * e->capsnames : 256;
    const char **t = ts_xcalloc((size_t)cap, sizeof *t);
    for (int i = 0; i < e->capsnames; i++) {
      if (!e->snames[i]) continue;
      size_t h = (size_t)ts_hash64(&e->snames[i], sizeof e->snames[i], 0) & (size_t)(cap - 1);
      while (t[h]) h = (h + 1) & (size_t)(cap - 1);
      t[h] = e->snames[i];
    }
    free(e->snames);
    e->snames = t;
    e->capsnames = cap;
  }
  size_t h = (size_t)ts_hash64(&s, sizeof s, 0) & (size_t)(e->capsnames - 1);
  for (; e->snames[h]; h = (h + 1) & (size_t)(e->capsnames - 1))
    if (e->snames[h] == s) return -1;
  e->snames[h] = s;
  e->nsnames++;
  return 0;
}

/* ---- printing patterns for messages ---- */
static void expr_str(StrBuf *b, const MdlExpr *x) {
  if (!x) return;
  switch (x->kind) {
  case MDL_E_INT: sb_printf(b, "%lld", (long long)x->ival); break;
  case MDL_E_FLOAT: sb_printf(b, "%g", x->fval); break;
  case MDL_E_BOOL: sb_puts(b, x->ival ? "true" : "false"); break;
  case MDL_E_NAME: sb_puts(b, x->str); break;
  case MDL_E_MEMBER: expr_str(b, x->a); sb_printf(b, ".%s", x->str); break;
  case MDL_E_ELLIPSIS: sb_puts(b, "..."); break;
  case MDL_E_NAMED_DIM: sb_printf(b, "%s=", x->str); expr_str(b, x->a); break;
  case MDL_E_UNARY:
    sb_puts(b, x->op == MDL_OP_NOT ? "not " : "-");
    expr_str(b, x->a);
    break;
  case MDL_E_BINARY:
    sb_putc(b, '(');
    expr_str(b, x->a);
    sb_printf(b, " %s ", elab_op_text(x->op));
    expr_str(b, x->b);
    sb_putc(b, ')');
    break;
  case MDL_E_CALL:
    expr_str(b, x->a);
    sb_puts(b, "(...)");
    break;
  default: sb_puts(b, "<expr>"); break;
  }
}

static const char *pattern_str(Elab *e, const MdlDecl *dc) {
  StrBuf b = {0};
  if (dc->dtype) sb_puts(&b, dc->dtype);
  sb_putc(&b, '[');
  for (int i = 0; i < dc->ndims; i++) {
    if (i) sb_puts(&b, ", ");
    expr_str(&b, dc->dims[i]);
  }
  sb_putc(&b, ']');
  const char *s = arena_strdup(&e->a, b.p);
  sb_free(&b);
  return s;
}

/* ---- argument binding for builtins and the train block ---- */
static int count_names(const char *const *names) {
  int n = 0;
  while (names[n]) n++;
  return n;
}
static const char *names_list(Elab *e, const char *const *names) {
  StrBuf b = {0};
  for (int i = 0; names[i]; i++) sb_printf(&b, "%s%s", i ? ", " : "", names[i]);
  const char *s = arena_strdup(&e->a, b.p ? b.p : "");
  sb_free(&b);
  return s;
}

int elab_bind_args(Elab *e, const ElabCall *c, const char *const *names, int nreq, Value *out) {
  int n = count_names(names), npos = 0, ngiven_pos = 0;
  for (int i = 0; i < n; i++) out[i] = mk(V_UNSET, c->loc);
  for (int i = 0; i < c->nargs; i++) ngiven_pos += !c->args[i].name;
  for (int i = 0; i < c->nargs; i++) {
    const ElabArg *a = &c->args[i];
    if (a->v.k == V_ERR) return -1;
    int j = -1;
    if (!a->name) {
      if (npos >= n) {
        elab_error(e, a->loc, "%s() takes at most %d argument%s (%s), got %d", c->fname, n, n == 1 ? "" : "s",
                   names_list(e, names), ngiven_pos);
        return -1;
      }
      j = npos++;
    } else {
      for (int k = 0; k < n; k++)
        if (strcmp(names[k], a->name) == 0) j = k;
      if (j < 0) {
        elab_error(e, a->loc, "%s() has no argument named '%s' (it takes: %s)", c->fname, a->name,
                   names_list(e, names));
        return -1;
      }
      if (out[j].k != V_UNSET) {
        elab_error(e, a->loc, "%s(): argument '%s' is given twice", c->fname, a->name);
        return -1;
      }
    }
    out[j] = a->v;
    /* a number, string or list is located where it is passed, so an error
     * about this argument points at the call, not at the config line or
     * signature it came from; a tensor keeps its origin for the notes */
    if (out[j].k != V_TENSOR) out[j].loc = a->vloc.line ? a->vloc : a->loc;
  }
  for (int i = 0; i < nreq; i++) {
    if (out[i].k == V_UNSET) {
      elab_error(e, c->loc, "%s() is missing argument '%s' (it takes: %s)", c->fname, names[i],
                 names_list(e, names));
      return -1;
    }
  }
  return 0;
}

static int want_fail(Elab *e, const ElabCall *c, const char *arg, const Value *v, const char *what) {
  if (v->k == V_ERR) return -1;
  char buf[256];
  elab_error(e, v->k == V_TENSOR ? c->loc : v->loc, "%s(): argument '%s' must be %s, got %s", c->fname, arg, what,
             elab_value_desc(e, v, buf, sizeof buf));
  if (v->k == V_TENSOR) elab_note_origin(e, v);
  return -1;
}
int elab_want_int(Elab *e, const ElabCall *c, const char *arg, const Value *v, int64_t *out) {
  if (v->k != V_INT) return want_fail(e, c, arg, v, "an int");
  *out = v->i;
  return 0;
}
int elab_want_num(Elab *e, const ElabCall *c, const char *arg, const Value *v, double *out) {
  if (!elab_is_num(v)) return want_fail(e, c, arg, v, "a number");
  *out = elab_num(v);
  return 0;
}
int elab_want_bool(Elab *e, const ElabCall *c, const char *arg, const Value *v, int *out) {
  if (v->k != V_BOOL) return want_fail(e, c, arg, v, "a bool");
  *out = (int)v->i;
  return 0;
}
int elab_want_tensor(Elab *e, const ElabCall *c, const char *arg, const Value *v, int need_float) {
  if (v->k != V_TENSOR) return want_fail(e, c, arg, v, need_float ? "a float tensor" : "a tensor");
  if (need_float) {
    IrType t = elab_type(e, v);
    if (!ir_dtype_is_float(t.dtype)) return want_fail(e, c, arg, v, "a float tensor");
  }
  return 0;
}

/* ---- expressions ---- */
typedef enum { FLOW_NEXT, FLOW_RETURN, FLOW_STOP } Flow;
static Value eval(Elab *e, ElabFrame *f, const MdlExpr *x);
Value elab_eval(Elab *e, ElabFrame *f, const MdlExpr *x) { return eval(e, f, x); }
static Flow exec_block(Elab *e, ElabFrame *f, MdlStmt **body, int n);

static const MdlProgram *find_module(Elab *e, const char *name) {
  for (int i = 0; i < e->nmods; i++)
    if (strcmp(e->mods[i].name, name) == 0) return e->mods[i].prog;
  return NULL;
}

static const MdlFunc *find_fn(const MdlProgram *p, const char *name) {
  for (int i = 0; i < p->nfuncs; i++)
    if (strcmp(p->funcs[i]->name, name) == 0) return p->funcs[i];
  return NULL;
}

/* A name in value position: variable, module, fn of this module, builtin. */
static Value lookup_name(Elab *e, ElabFrame *f, const char *name, MdlLoc loc, int callee) {
  ElabVar *var = frame_lookup_var(f, name);
  Value *v = var ? &var->v : NULL;
  /* a call looks past variables that are not functions: `dropout(x, dropout)`
   * with a float argument named dropout calls the builtin */
  Value *shadow = NULL;
  if (v && callee && v->k != V_FN && v->k != V_BUILTIN && v->k != V_ERR) { shadow = v; v = NULL; }
  if (v) {
    Value r = *v;
    if (r.k == V_INT) {   /* an int read from a variable names a dim */
      if (!var->iname) var->iname = ts_intern(name);   /* interning takes a lock: once per variable */
      r.s = var->iname;
      r.loc = loc;
    }
    return r;
  }
  for (int i = 0; i < f->prog->nimports; i++) {
    if (strcmp(f->prog->imports[i], name) != 0) continue;
    const MdlProgram *p = find_module(e, name);
    if (p) {
      Value m = mk(V_MODULE, loc);
      m.prog = p;
      m.s = f->prog->imports[i];
      return m;
    }
  }
  int bi = elab_builtin_lookup(name);
  const MdlFunc *fn = find_fn(f->prog, name);
  if (fn && !(f->fn && bi >= 0 && strcmp(f->fn->name, name) == 0)) {
    Value r = mk(V_FN, loc);
    r.fn = fn;
    r.prog = f->prog;
    return r;
  }
  if (bi >= 0) {
    Value r = mk(V_BUILTIN, loc);
    r.i = bi;
    return r;
  }
  if (shadow) {
    char buf[256];
    elab_error(e, loc, "'%s' is not a function, it is %s", name, elab_value_desc(e, shadow, buf, sizeof buf));
  } else if (callee) elab_error(e, loc, "unknown function '%s'", name);
  else elab_error(e, loc, "unknown name '%s'", name);
  return elab_err();
}

static Value eval_member(Elab *e, ElabFrame *f, const MdlExpr *x) {
  const MdlExpr *obj = x->a;
  if (obj->kind == MDL_E_NAME && !frame_lookup(f, obj->str) && !find_fn(f->prog, obj->str) &&
      elab_builtin_lookup(obj->str) < 0) {
    int imported = 0;
    for (int i = 0; i < f->prog->nimports; i++) imported |= !strcmp(f->prog->imports[i], obj->str);
    if (!imported) {   /* the usual cause: a file that uses nn.* without `import nn` */
      elab_error(e, obj->loc, "unknown module '%s' (missing 'import %s'?)", obj->str, obj->str);
      return elab_err();
    }
  }
  Value m = eval(e, f, x->a);
  if (m.k == V_ERR) return m;
  if (m.k != V_MODULE) {
    char buf[256];
    elab_error(e, x->loc, "'.%s': only modules have members, this is %s", x->str,
               elab_value_desc(e, &m, buf, sizeof buf));
    return elab_err();
  }
  const MdlFunc *fn = find_fn(m.prog, x->str);
  if (!fn) {
    elab_error(e, x->loc, "module '%s' has no function '%s'", m.s, x->str);
    return elab_err();
  }
  Value r = mk(V_FN, x->loc);
  r.fn = fn;
  r.prog = m.prog;
  return r;
}

static int64_t as_index(Elab *e, const MdlExpr *x, ElabFrame *f, int *ok) {
  Value v = eval(e, f, x);
  *ok = 0;
  if (v.k == V_ERR) return 0;
  if (v.k != V_INT) {
    char buf[256];
    elab_error(e, x->loc, "indices must be ints, got %s", elab_value_desc(e, &v, buf, sizeof buf));
    return 0;
  }
  *ok = 1;
  return v.i;
}

/* x[a:b, i, ..., :]: slices stay, an int index drops its axis. */
static Value index_tensor(Elab *e, ElabFrame *f, const MdlExpr *x, Value base) {
  IrType t = elab_type(e, &base);
  int nell = 0, ellpos = x->nitems;
  for (int i = 0; i < x->nitems; i++)
    if (x->items[i]->kind == MDL_E_ELLIPSIS) { nell++; ellpos = i; }
  char buf[256];
  if (nell > 1) {
    elab_error(e, x->loc, "only one '...' is allowed in an index");
    return elab_err();
  }
  int k = x->nitems - nell;
  if (k > t.rank) {
    elab_error(e, x->loc, "too many indices (%d) for %s", k, ir_type_str(&t, buf, sizeof buf));
    elab_note_origin(e, &base);
    return elab_err();
  }
  int drop[IR_MAX_RANK] = {0}, ndrop = 0;
  Value cur = base;
  for (int j = 0; j < x->nitems; j++) {
    const MdlExpr *it = x->items[j];
    if (it->kind == MDL_E_ELLIPSIS) continue;
    int axis = j < ellpos ? j : t.rank - (x->nitems - j);
    int64_t n = t.dim[axis], s, en;
    int ok = 1;
    if (it->kind == MDL_E_SLICE) {
      s = it->a ? as_index(e, it->a, f, &ok) : 0;
      if (!ok) return elab_err();
      en = it->b ? as_index(e, it->b, f, &ok) : n;
      if (!ok) return elab_err();
      int64_t s0 = s, e0 = en;
      if (s < 0) s += n;
      if (en < 0) en += n;
      if (s < 0 || en > n || s >= en) {
        elab_error(e, it->loc, "slice %lld:%lld is out of range or empty for axis %d of %s", (long long)s0,
                   (long long)e0, axis, ir_type_str(&t, buf, sizeof buf));
        elab_note_origin(e, &base);
        return elab_err();
      }
      if (s == 0 && en == n) continue;
    } else {
      int64_t i0 = as_index(e, it, f, &ok);
      if (!ok) return elab_err();
      s = i0 < 0 ? i0 + n : i0;
      if (s < 0 || s >= n) {
        elab_error(e, it->loc, "index %lld is out of range for axis %d of %s", (long long)i0, axis,
                   ir_type_str(&t, buf, sizeof buf));
        elab_note_origin(e, &base);
        return elab_err();
      }
      en = s + 1;
      drop[axis] = 1;
      ndrop++;
    }
    int64_t ia[3] = {axis, s, en};
    cur = elab_emit(e, x->loc, IR_OP_SLICE, &cur, 1, ia, NULL, NULL, NULL);
    if (cur.k == V_ERR) return cur;
  }
  if (!ndrop) return cur;
  IrType ct = elab_type(e, &cur), r = ct;
  r.rank = 0;
  for (int i = 0; i < ct.rank; i++) {
    if (drop[i]) continue;
    r.dim[r.rank] = ct.dim[i];
    r.dname[r.rank++] = ct.dname[i];
  }
  for (int i = r.rank; i < IR_MAX_RANK; i++) { r.dim[i] = 0; r.dname[i] = NULL; }
  return elab_reshape(e, x->loc, cur, &r);
}

static Value eval_index(Elab *e, ElabFrame *f, const MdlExpr *x) {
  Value base = eval(e, f, x->a);
  if (base.k == V_ERR) return base;
  if (base.k == V_TENSOR) return index_tensor(e, f, x, base);
  char buf[256];
  if (base.k == V_TUPLE || base.k == V_LIST) {
    if (x->nitems != 1 || x->items[0]->kind == MDL_E_SLICE || x->items[0]->kind == MDL_E_ELLIPSIS) {
      elab_error(e, x->loc, "a %s takes one int index", elab_kind_name(base.k));
      return elab_err();
    }
    int ok;
    int64_t i = as_index(e, x->items[0], f, &ok);
    if (!ok) return elab_err();
    int64_t j = i < 0 ? i + base.n : i;
    if (j < 0 || j >= base.n) {
      elab_error(e, x->items[0]->loc, "index %lld is out of range for a %s of %d", (long long)i,
                 elab_kind_name(base.k), base.n);
      return elab_err();
    }
    return base.items[j];
  }
  elab_error(e, x->loc, "cannot index %s", elab_value_desc(e, &base, buf, sizeof buf));
  return elab_err();
}

/* ---- params ---- */
static int param_init(Elab *e, ElabFrame *f, const MdlExpr *ix, IrState *st) {
  st->init = IR_INIT_ZEROS;
  if (!ix) return 0;
  static const char *kinds = "zeros, ones, normal(std), uniform(lo, hi) or scaled_normal(std, n)";
  const char *name = ix->kind == MDL_E_NAME ? ix->str
                     : ix->kind == MDL_E_CALL && ix->a->kind == MDL_E_NAME ? ix->a->str : NULL;
  static const char *const n_none[] = {NULL}, *const n_normal[] = {"std", NULL},
                           *const n_uniform[] = {"lo", "hi", NULL}, *const n_scaled[] = {"std", "n", NULL};
  const char *const *names = NULL;
  if (name && !strcmp(name, "zeros")) names = n_none;
  else if (name && !strcmp(name, "ones")) names = n_none;
  else if (name && !strcmp(name, "normal")) names = n_normal;
  else if (name && !strcmp(name, "uniform")) names = n_uniform;
  else if (name && !strcmp(name, "scaled_normal")) names = n_scaled;
  if (!name && (ix->kind == MDL_E_INT || ix->kind == MDL_E_FLOAT || ix->kind == MDL_E_UNARY)) {
    Value v = eval(e, f, ix);   /* `init 1.0`, `init 0`: the constants the IR has */
    if (v.k == V_ERR) return -1;
    if (elab_is_num(&v) && (elab_num(&v) == 0 || elab_num(&v) == 1)) {
      st->init = elab_num(&v) == 0 ? IR_INIT_ZEROS : IR_INIT_ONES;
      return 0;
    }
    elab_error(e, ix->loc, "constant param inits other than 0 and 1 are not supported; expected %s", kinds);
    return -1;
  }
  if (!names) {
    elab_error(e, ix->loc, "unknown param init: expected %s", kinds);
    return -1;
  }
  ElabCall c = {ix->loc, name, NULL, 0};
  if (ix->kind == MDL_E_CALL) {
    c.args = arena_alloc(&e->a, (size_t)(ix->nargs + 1) * sizeof *c.args);
    c.nargs = ix->nargs;
    for (int i = 0; i < ix->nargs; i++) {
      c.args[i].name = ix->args[i].name;
      c.args[i].loc = ix->args[i].loc;
      c.args[i].vloc = ix->args[i].value->loc;
      c.args[i].v = eval(e, f, ix->args[i].value);
      if (c.args[i].v.k == V_ERR) return -1;
    }
  }
  Value a[2];
  if (elab_bind_args(e, &c, names, count_names(names), a)) return -1;
  double x0 = 0, x1 = 0;
  if (names == n_none) {
    st->init = !strcmp(name, "ones") ? IR_INIT_ONES : IR_INIT_ZEROS;
    return 0;
  }
  if (elab_want_num(e, &c, names[0], &a[0], &x0)) return -1;
  if (names == n_uniform) {
    if (elab_want_num(e, &c, "hi", &a[1], &x1)) return -1;
    if (!(x0 < x1) || !isfinite(x0) || !isfinite(x1)) {
      elab_error(e, ix->loc, "uniform(lo, hi) needs finite lo < hi, got %g, %g", x0, x1);
      return -1;
    }
    st->init = IR_INIT_UNIFORM;
    st->init_a = x0;
    st->init_b = x1;
    return 0;
  }
  if (!(x0 >= 0) || !isfinite(x0)) {
    elab_error(e, a[0].loc, "%s(): std must be finite and >= 0, got %g", name, x0);
    return -1;
  }
  if (names == n_scaled) {   /* GPT-2's residual scaling: std / sqrt(2 n) */
    int64_t n;
    if (elab_want_int(e, &c, "n", &a[1], &n)) return -1;
    if (n < 1) {
      elab_error(e, a[1].loc, "scaled_normal(): n must be >= 1, got %lld", (long long)n);
      return -1;
    }
    x0 /= sqrt(2.0 * (double)n);
  }
  st->init = IR_INIT_NORMAL;
  st->init_a = 0;
  st->init_b = x0;
  return 0;
}

/* A float dtype spelled in the source: f32 / f64 are the model precision
 * (the arithmetic type); bf16 / f16 are themselves (16-bit storage: a
 * cast to one rounds, and pass precision gives its readers f32). */
static int resolve_dtype(Elab *e, const char *name, MdlLoc loc, IrDtype *out) {
  if (!name) { *out = e->prec; return 0; }
  int d = ir_dtype_lookup(name);
  if (d > 0 && ir_dtype_is_16((IrDtype)d)) { *out = (IrDtype)d; return 0; }
  if (d < 0 || d == IR_VOID) {
    elab_error(e, loc, "unknown dtype '%s' (expected f32, f64, bf16, f16 or i32)", name);
    return -1;
  }
  *out = ir_dtype_is_float((IrDtype)d) ? e->prec : (IrDtype)d;
  return 0;
}

/* `param [dims] init I [decay|nodecay]` -> a new param state and a STATE
 * node reading it.  varname: the variable it is assigned to, or NULL. */
static Value eval_param(Elab *e, ElabFrame *f, const MdlExpr *x, const char *varname) {
  if (!f->naming) {
    elab_error(e, x->loc, "param is only allowed in a model or fn body");
    return elab_err();
  }
  IrState st;
  memset(&st, 0, sizeof st);
  if (resolve_dtype(e, x->str, x->loc, &st.type.dtype)) return elab_err();
  if (ir_dtype_is_16(st.type.dtype)) {
    elab_error(e, x->loc, "param %s[...]: parameters are trained as f32 (or f64) masters; their 16-bit compute copy "
               "comes from --precision bf16 (or `precision = bf16` in the train block): write f32 or leave the "
               "dtype out", x->str);
    return elab_err();
  }
  if (!ir_dtype_is_float(st.type.dtype)) {
    elab_error(e, x->loc, "parameters must have a float dtype, not %s", x->str);
    return elab_err();
  }
  if (x->nitems > IR_MAX_RANK) {
    elab_error(e, x->loc, "param: rank %d exceeds the maximum of %d", x->nitems, IR_MAX_RANK);
    return elab_err();
  }
  st.type.rank = x->nitems;
  for (int i = 0; i < x->nitems; i++) {
    const MdlExpr *it = x->items[i];
    if (it->kind == MDL_E_ELLIPSIS) {
      elab_error(e, it->loc, "'...' is not allowed in a param shape");
      return elab_err();
    }
    Value v = eval(e, f, it->kind == MDL_E_NAMED_DIM ? it->a : it);
    if (v.k == V_ERR) return v;
    if (v.k != V_INT) {
      char buf[256];
      elab_error(e, it->loc, "param shape entries must be ints, got %s", elab_value_desc(e, &v, buf, sizeof buf));
      return elab_err();
    }
    st.type.dim[i] = v.i;
    st.type.dname[i] = it->kind == MDL_E_NAMED_DIM ? ts_intern(it->str) : v.s;
  }
  if (elab_check_type(e, x->loc, &st.type, "param")) return elab_err();
  if (param_init(e, f, x->a, &st)) return elab_err();
  int decay = x->ival & MDL_PARAM_NODECAY ? 0 : x->ival & MDL_PARAM_DECAY ? 1 : st.type.rank >= 2;
  st.flags = decay ? 0 : IR_STATE_NODECAY;
  st.kind = IR_STATE_PARAM;
  st.of = -1;
  st.name = ts_intern(join_path(e, naming_prefix(e, f->naming), naming_component(e, f->naming, varname ? varname : "param")));
  if (sname_insert(e, st.name)) {
    elab_error(e, x->loc, "parameter name '%s' is already taken", st.name);
    return elab_err();
  }
  int64_t ia[1] = {ir_state_add(e->m, &st)};
  return elab_emit(e, x->loc, IR_OP_STATE, NULL, 0, ia, NULL, NULL, &st.type);
}

/* ---- calls ---- */
static int check_decl(Elab *e, ElabFrame *fr, const char *fname, const MdlDecl *dc, Value *v, MdlLoc at);

/* Binds the arguments of a call to fn's declarations in the callee frame:
 * first every argument passed (so patterns and defaults can refer to any
 * of them), then in order: defaults for the missing ones, types, shape
 * patterns (which bind dim names). */
static int bind_fn_args(Elab *e, ElabFrame *fr, const MdlFunc *fn, const ElabCall *c) {
  int n = fn->ndecls, npos = 0;
  Value *given = arena_alloc(&e->a, (size_t)(n + 1) * sizeof *given);
  MdlLoc *at = arena_alloc(&e->a, (size_t)(n + 1) * sizeof *at);
  for (int i = 0; i < n; i++) { given[i] = mk(V_UNSET, c->loc); at[i] = c->loc; }
  for (int i = 0; i < c->nargs; i++) {
    const ElabArg *a = &c->args[i];
    int j = -1;
    if (!a->name) {
      if (npos >= n) {
        int np = 0;
        for (int k = 0; k < c->nargs; k++) np += !c->args[k].name;
        elab_error(e, a->loc, "%s() takes %d argument%s, got %d", c->fname, n, n == 1 ? "" : "s", np);
        mdl_note(e->d, fn->loc, "'%s' is defined here", fn->name);
        return -1;
      }
      j = npos++;
    } else {
      for (int k = 0; k < n; k++)
        if (strcmp(fn->decls[k].name, a->name) == 0) j = k;
      if (j < 0) {
        elab_error(e, a->loc, "%s() has no argument named '%s'", c->fname, a->name);
        mdl_note(e->d, fn->loc, "'%s' is defined here", fn->name);
        return -1;
      }
      if (given[j].k != V_UNSET) {
        elab_error(e, a->loc, "%s(): argument '%s' is given twice", c->fname, a->name);
        return -1;
      }
    }
    given[j] = a->v;
    at[j] = a->loc;
  }
  for (int i = 0; i < n; i++)
    if (given[i].k != V_UNSET) elab_frame_set(fr, fn->decls[i].name, given[i]);
  for (int i = 0; i < n; i++) {
    const MdlDecl *dc = &fn->decls[i];
    Value v = given[i];
    if (v.k == V_UNSET) {
      if (!dc->dflt) {
        elab_error(e, c->loc, "%s() is missing argument '%s'", c->fname, dc->name);
        mdl_note(e->d, dc->loc, "'%s' is declared here", dc->name);
        return -1;
      }
      v = eval(e, fr, dc->dflt);
      if (v.k == V_ERR) {
        mdl_note(e->d, c->loc, "in the call of '%s' here", c->fname);
        return -1;
      }
      at[i] = dc->dflt->loc;
    }
    if (check_decl(e, fr, c->fname, dc, &v, at[i])) return -1;
    elab_frame_set(fr, dc->name, v);
  }
  return 0;
}

static Value call_fn(Elab *e, ElabFrame *caller, const MdlFunc *fn, const MdlProgram *prog, const ElabCall *c) {
  if (e->depth >= ELAB_MAX_DEPTH) {
    elab_error(e, c->loc, "call depth exceeds %d at the call of '%s' (recursion?)", ELAB_MAX_DEPTH, c->fname);
    e->abort = 1;   /* every frame below would report it again */
    return elab_err();
  }
  ElabNaming nm;
  memset(&nm, 0, sizeof nm);
  ElabNaming top;
  memset(&top, 0, sizeof top);
  top.prefix = "";
  ElabNaming *outer = caller->naming ? caller->naming : &top;
  nm.prefix = join_path(e, naming_prefix(e, outer), naming_component(e, outer, fn->name));
  ElabFrame fr;
  memset(&fr, 0, sizeof fr);
  fr.prog = prog;
  fr.fn = fn;
  fr.naming = caller->naming ? &nm : NULL;   /* no params from the config block */
  Value r = elab_err();
  if (bind_fn_args(e, &fr, fn, c) == 0) {
    int err0 = e->d->nerrors;
    e->depth++;
    Flow fl = exec_block(e, &fr, fn->body, fn->nbody);
    e->depth--;
    if (e->d->nerrors > err0) {
      if (!e->abort || e->depth == 0) mdl_note(e->d, c->loc, "in the call of '%s' here", c->fname);
    } else {
      r = fl == FLOW_RETURN ? fr.ret : elab_none(c->loc);
    }
  }
  elab_frame_free(&fr);
  free(nm.counters.a);
  free(top.counters.a);
  return r;
}

static Value eval_call(Elab *e, ElabFrame *f, const MdlExpr *x) {
  const MdlExpr *ce = x->a;
  Value fv;
  const char *fname;
  if (ce->kind == MDL_E_NAME) {
    fv = lookup_name(e, f, ce->str, ce->loc, 1);
    fname = ce->str;
  } else if (ce->kind == MDL_E_MEMBER) {
    fv = eval(e, f, ce);
    fname = ce->a->kind == MDL_E_NAME ? arena_printf(&e->a, "%s.%s", ce->a->str, ce->str) : ce->str;
  } else {
    fv = eval(e, f, ce);
    fname = "<expression>";
  }
  if (fv.k == V_ERR) return fv;
  if (fv.k == V_FN && ce->kind == MDL_E_NAME) fname = fv.fn->name;   /* act(h) -> gelu_tanh */
  if (fv.k == V_BUILTIN) fname = elab_builtin_name((int)fv.i);
  if (fv.k != V_FN && fv.k != V_BUILTIN) {
    char buf[256];
    elab_error(e, ce->loc, "'%s' is not a function, it is %s", fname, elab_value_desc(e, &fv, buf, sizeof buf));
    return elab_err();
  }
  ElabCall c = {x->loc, fname, NULL, x->nargs};
  c.args = arena_alloc(&e->a, (size_t)(x->nargs + 1) * sizeof *c.args);
  int bad = 0;
  for (int i = 0; i < x->nargs; i++) {
    c.args[i].name = x->args[i].name;
    c.args[i].loc = x->args[i].loc;
    c.args[i].vloc = x->args[i].value->loc;
    c.args[i].v = eval(e, f, x->args[i].value);
    bad |= c.args[i].v.k == V_ERR;
  }
  if (bad || e->abort) return elab_err();
  if (++e->steps > ELAB_MAX_STEPS) {
    elab_error(e, x->loc, "elaboration does too much work (more than %d steps); is a repeat count too large?",
               ELAB_MAX_STEPS);
    e->abort = 1;
    return elab_err();
  }
  if (fv.k == V_BUILTIN) return elab_call_builtin(e, (int)fv.i, &c);
  return call_fn(e, f, fv.fn, fv.prog, &c);
}

/* ---- signature checks ---- */
static int pattern_mismatch(Elab *e, const char *fname, const MdlDecl *dc, const Value *v, MdlLoc at,
                            const char *why) {
  char buf[256];
  elab_error(e, at, "%s(): argument '%s' has shape %s, which does not match %s: %s", fname, dc->name,
             elab_tstr(e, v, buf, sizeof buf), pattern_str(e, dc), why);
  elab_note_origin(e, v);
  mdl_note(e->d, dc->loc, "'%s' is declared here", dc->name);
  return -1;
}

/* Binds or checks a dim name of a pattern against size. */
static int bind_dim(Elab *e, ElabFrame *fr, const char *fname, const MdlDecl *dc, const Value *v, MdlLoc at,
                    const char *name, int k, int64_t size) {
  Value *b = frame_own(fr, name);
  if (!b) {
    Value iv = elab_int(size, dc->loc);
    elab_frame_set(fr, name, iv);
    return 0;
  }
  if (b->k == V_INT && b->i == size) return 0;
  char why[512], bd[256];
  if (b->k == V_INT)
    snprintf(why, sizeof why, "dim %d is %lld but %s = %lld", k, (long long)size, name, (long long)b->i);
  else
    snprintf(why, sizeof why, "dim %d names '%s', which is %s", k, name, elab_value_desc(e, b, bd, sizeof bd));
  return pattern_mismatch(e, fname, dc, v, at, why);
}

static int match_pattern(Elab *e, ElabFrame *fr, const char *fname, const MdlDecl *dc, const Value *v, MdlLoc at) {
  IrType t = elab_type(e, v);
  char buf[256];
  if (dc->dtype) {
    IrDtype want;
    if (resolve_dtype(e, dc->dtype, dc->loc, &want)) return -1;
    if (t.dtype != want) {
      elab_error(e, at, "%s(): argument '%s' must be %s, got %s", fname, dc->name, pattern_str(e, dc),
                 ir_type_str(&t, buf, sizeof buf));
      elab_note_origin(e, v);
      return -1;
    }
  } else if (!ir_dtype_is_float(t.dtype)) {
    elab_error(e, at, "%s(): argument '%s' must be a float tensor %s, got %s", fname, dc->name, pattern_str(e, dc),
               ir_type_str(&t, buf, sizeof buf));
    elab_note_origin(e, v);
    return -1;
  }
  int nell = 0, ellpos = dc->ndims;
  for (int i = 0; i < dc->ndims; i++)
    if (dc->dims[i]->kind == MDL_E_ELLIPSIS) { nell++; ellpos = i; }
  if (nell > 1) {
    elab_error(e, dc->loc, "only one '...' is allowed in a shape pattern");
    return -1;
  }
  int fixed = dc->ndims - nell;
  if (nell ? t.rank < fixed : t.rank != fixed) {
    char why[128];
    snprintf(why, sizeof why, "rank %d, expected %s%d", t.rank, nell ? "at least " : "", fixed);
    return pattern_mismatch(e, fname, dc, v, at, why);
  }
  for (int j = 0; j < dc->ndims; j++) {
    const MdlExpr *p = dc->dims[j];
    if (p->kind == MDL_E_ELLIPSIS) continue;
    int k = j < ellpos ? j : t.rank - (dc->ndims - j);
    int64_t size = t.dim[k];
    if (p->kind == MDL_E_NAME) {
      if (bind_dim(e, fr, fname, dc, v, at, p->str, k, size)) return -1;
      continue;
    }
    Value w = eval(e, fr, p->kind == MDL_E_NAMED_DIM ? p->a : p);
    if (w.k == V_ERR) return -1;
    if (w.k != V_INT) {
      elab_error(e, p->loc, "shape pattern entries must be ints, got %s", elab_value_desc(e, &w, buf, sizeof buf));
      return -1;
    }
    if (w.i != size) {
      char why[256];
      snprintf(why, sizeof why, "dim %d is %lld, expected %lld", k, (long long)size, (long long)w.i);
      return pattern_mismatch(e, fname, dc, v, at, why);
    }
    if (p->kind == MDL_E_NAMED_DIM && bind_dim(e, fr, fname, dc, v, at, p->str, k, size)) return -1;
  }
  return 0;
}

/* Checks (and for float, converts) an argument against its declaration. */
static int check_decl(Elab *e, ElabFrame *fr, const char *fname, const MdlDecl *dc, Value *v, MdlLoc at) {
  const char *want = NULL;
  switch (dc->type) {
  case MDL_T_ANY: return 0;
  case MDL_T_INT: if (v->k != V_INT) want = "an int"; break;
  case MDL_T_FLOAT:
    if (v->k == V_INT) { *v = elab_float((double)v->i, v->loc); return 0; }
    if (v->k != V_FLOAT) want = "a float";
    break;
  case MDL_T_BOOL: if (v->k != V_BOOL) want = "a bool"; break;
  case MDL_T_STR: if (v->k != V_STR) want = "a string"; break;
  case MDL_T_FN: if (v->k != V_FN && v->k != V_BUILTIN) want = "a function"; break;
  case MDL_T_TENSOR:
    if (v->k != V_TENSOR) { want = "a tensor"; break; }
    return match_pattern(e, fr, fname, dc, v, at);
  }
  if (!want) return 0;
  char buf[256];
  elab_error(e, at, "%s(): argument '%s' must be %s, got %s", fname, dc->name, want,
             elab_value_desc(e, v, buf, sizeof buf));
  mdl_note(e->d, dc->loc, "'%s' is declared here", dc->name);
  return -1;
}

static Value eval_expr(Elab *e, ElabFrame *f, const MdlExpr *x);

/* Expression nesting counts across calls (the parser bounds it per file,
 * calls multiply it), so that no program can exhaust the C stack. */
static Value eval(Elab *e, ElabFrame *f, const MdlExpr *x) {
  if (e->abort) return elab_err();
  if (e->eval_depth >= ELAB_MAX_EVAL_DEPTH) {
    elab_error(e, x->loc, "expressions nest too deeply (more than %d levels, counting through calls)",
               ELAB_MAX_EVAL_DEPTH);
    e->abort = 1;
    return elab_err();
  }
  e->eval_depth++;
  Value r = eval_expr(e, f, x);
  e->eval_depth--;
  return r;
}

static Value eval_expr(Elab *e, ElabFrame *f, const MdlExpr *x) {
  switch (x->kind) {
  case MDL_E_INT: return elab_int(x->ival, x->loc);
  case MDL_E_FLOAT: return elab_float(x->fval, x->loc);
  case MDL_E_BOOL: return elab_bool((int)x->ival, x->loc);
  case MDL_E_NONE: return elab_none(x->loc);
  case MDL_E_STRING: { Value v = mk(V_STR, x->loc); v.s = x->str; return v; }
  case MDL_E_NAME: return lookup_name(e, f, x->str, x->loc, 0);
  case MDL_E_MEMBER: return eval_member(e, f, x);
  case MDL_E_CALL: return eval_call(e, f, x);
  case MDL_E_INDEX: return eval_index(e, f, x);
  case MDL_E_PARAM: return eval_param(e, f, x, NULL);
  case MDL_E_UNARY: {
    Value a = eval(e, f, x->a);
    if (a.k == V_ERR) return a;
    if (x->op == '-') return elab_negate(e, x->loc, a);
    if (a.k != V_BOOL) {
      char buf[256];
      elab_error(e, x->loc, "'not' needs a bool, got %s", elab_value_desc(e, &a, buf, sizeof buf));
      return elab_err();
    }
    return elab_bool(!a.i, x->loc);
  }
  case MDL_E_BINARY: {
    Value a = eval(e, f, x->a);
    if (a.k == V_ERR) return a;
    if (x->op == MDL_OP_AND || x->op == MDL_OP_OR) {   /* short-circuit */
      char buf[256];
      if (a.k != V_BOOL) {
        elab_error(e, x->a->loc, "'%s' needs bools, got %s", elab_op_text(x->op), elab_value_desc(e, &a, buf, sizeof buf));
        return elab_err();
      }
      if (a.i == (x->op == MDL_OP_OR)) return elab_bool((int)a.i, x->loc);
      Value b = eval(e, f, x->b);
      if (b.k == V_ERR) return b;
      if (b.k != V_BOOL) {
        elab_error(e, x->b->loc, "'%s' needs bools, got %s", elab_op_text(x->op), elab_value_desc(e, &b, buf, sizeof buf));
        return elab_err();
      }
      return elab_bool((int)b.i, x->loc);
    }
    Value b = eval(e, f, x->b);
    return elab_binary(e, x->loc, x->op, a, b);
  }
  case MDL_E_TUPLE:
  case MDL_E_LIST: {
    Value t = elab_tuple(e, x->kind == MDL_E_TUPLE ? V_TUPLE : V_LIST, x->nitems, x->loc);
    for (int i = 0; i < x->nitems; i++) {
      t.items[i] = eval(e, f, x->items[i]);
      if (t.items[i].k == V_ERR) return elab_err();
    }
    return t;
  }
  case MDL_E_SLICE:
  case MDL_E_ELLIPSIS:
  case MDL_E_NAMED_DIM:   /* the grammar makes them only as index items and dims, evaluated there */
    elab_error(e, x->loc, "%s is only allowed inside an index or a shape",
               x->kind == MDL_E_SLICE ? "a slice" : x->kind == MDL_E_ELLIPSIS ? "'...'" : "'name=size'");   /* internal */
    return elab_err();
  }
  TS_DIE("elaborate: unknown expression kind %d", (int)x->kind);
}

/* ---- statements ---- */
static Flow exec_repeat(Elab *e, ElabFrame *f, const MdlStmt *s) {
  Value cv = eval(e, f, s->value);
  char buf[256];
  if (cv.k == V_ERR) return FLOW_NEXT;
  if (cv.k != V_INT) {
    elab_error(e, s->value->loc, "the repeat count must be an int, got %s", elab_value_desc(e, &cv, buf, sizeof buf));
    return FLOW_NEXT;
  }
  if (cv.i < 0 || cv.i > ELAB_MAX_REPEAT) {
    elab_error(e, s->value->loc, "the repeat count %lld is out of range (0 .. %d)", (long long)cv.i, ELAB_MAX_REPEAT);
    return FLOW_NEXT;
  }
  ElabNaming *outer = f->naming;
  const char *base = s->as ? s->as : s->value->kind == MDL_E_NAME ? s->value->str : "repeat";
  const char *path = outer ? join_path(e, naming_prefix(e, outer), naming_component(e, outer, base)) : "";
  if (e->opt && e->opt->repeat_path && outer && !strcmp(path, e->opt->repeat_path) && e->opt->repeat_count >= 0)
    cv.i = e->opt->repeat_count;   /* MdlOptions.repeat_path: a shortened copy of the stack */
  for (int64_t i = 0; i < cv.i; i++) {
    if (++e->steps > ELAB_MAX_STEPS) {   /* nested repeats of empty bodies count too */
      elab_error(e, s->loc, "elaboration does too much work (more than %d steps); is a repeat count too large?",
                 ELAB_MAX_STEPS);
      e->abort = 1;
      return FLOW_STOP;
    }
    ElabNaming it;
    memset(&it, 0, sizeof it);
    it.base = path;
    it.index = i;
    f->naming = outer ? &it : NULL;
    if (s->as) elab_frame_set(f, s->as, elab_int(i, s->loc));   /* `repeat n as i`: i = 0 .. n-1 in the body */
    int err0 = e->d->nerrors;
    Flow fl = exec_block(e, f, s->body, s->nbody);
    f->naming = outer;
    free(it.counters.a);
    if (fl != FLOW_NEXT) return fl;
    if (e->d->nerrors > err0) break;   /* the next iteration would say the same */
  }
  return FLOW_NEXT;
}

static Flow exec_stmt(Elab *e, ElabFrame *f, const MdlStmt *s) {
  if (++e->steps > ELAB_MAX_STEPS) {
    elab_error(e, s->loc, "elaboration does too much work (more than %d steps); is a repeat count too large?",
               ELAB_MAX_STEPS);
    e->abort = 1;
    return FLOW_STOP;
  }
  switch (s->kind) {
  case MDL_S_ASSIGN: {
    if (s->nnames == 1) {
      Value v = s->value->kind == MDL_E_PARAM ? eval_param(e, f, s->value, s->names[0]) : eval(e, f, s->value);
      elab_frame_set(f, s->names[0], v);
      return FLOW_NEXT;
    }
    Value v = eval(e, f, s->value);
    if (v.k != V_ERR && ((v.k != V_TUPLE && v.k != V_LIST) || v.n != s->nnames)) {
      char buf[256];
      elab_error(e, s->loc, "cannot unpack %s into %d names", elab_value_desc(e, &v, buf, sizeof buf), s->nnames);
      v = elab_err();
    }
    for (int i = 0; i < s->nnames; i++) elab_frame_set(f, s->names[i], v.k == V_ERR ? v : v.items[i]);
    return FLOW_NEXT;
  }
  case MDL_S_RETURN:
    if (s->nitems == 1) {
      f->ret = eval(e, f, s->items[0]);
    } else {
      f->ret = elab_tuple(e, V_TUPLE, s->nitems, s->loc);
      for (int i = 0; i < s->nitems; i++) {
        f->ret.items[i] = eval(e, f, s->items[i]);
        if (f->ret.items[i].k == V_ERR) f->ret = elab_err();
        if (f->ret.k == V_ERR) break;
      }
    }
    return FLOW_RETURN;
  case MDL_S_IF: {
    Value c = eval(e, f, s->value);
    if (c.k == V_ERR) return FLOW_NEXT;
    if (c.k != V_BOOL) {
      char buf[256];
      elab_error(e, s->value->loc, "the condition of 'if' must be a bool, got %s", elab_value_desc(e, &c, buf, sizeof buf));
      return FLOW_NEXT;
    }
    return c.i ? exec_block(e, f, s->body, s->nbody) : exec_block(e, f, s->els, s->nels);
  }
  case MDL_S_REPEAT: return exec_repeat(e, f, s);
  case MDL_S_EXPR: eval(e, f, s->value); return FLOW_NEXT;
  }
  TS_DIE("elaborate: unknown statement kind %d", (int)s->kind);
}

static Flow exec_block(Elab *e, ElabFrame *f, MdlStmt **body, int n) {
  for (int i = 0; i < n; i++) {
    if (e->abort) return FLOW_STOP;
    Flow fl = exec_stmt(e, f, body[i]);
    if (fl != FLOW_NEXT) return fl;
  }
  return e->abort ? FLOW_STOP : FLOW_NEXT;
}

/* ---- the model ---- */
/* The type of a model argument: every dim must have a size. */
static int input_type(Elab *e, ElabFrame *f, const MdlDecl *dc, IrType *t) {
  memset(t, 0, sizeof *t);
  if (resolve_dtype(e, dc->dtype, dc->loc, &t->dtype)) return -1;
  if (dc->ndims > IR_MAX_RANK) {
    elab_error(e, dc->loc, "model argument '%s': rank %d exceeds the maximum of %d", dc->name, dc->ndims, IR_MAX_RANK);
    return -1;
  }
  t->rank = dc->ndims;
  for (int i = 0; i < dc->ndims; i++) {
    const MdlExpr *p = dc->dims[i];
    if (p->kind == MDL_E_ELLIPSIS) {
      elab_error(e, p->loc, "model argument '%s': '...' is not allowed; the runtime needs every size", dc->name);
      return -1;
    }
    if (p->kind == MDL_E_NAME && !frame_lookup(f, p->str)) {
      elab_error(e, p->loc, "model argument '%s': dim '%s' has no size (write %s=<size>)", dc->name, p->str, p->str);
      return -1;
    }
    Value v = eval(e, f, p->kind == MDL_E_NAMED_DIM ? p->a : p);
    if (v.k == V_ERR) return -1;
    if (v.k != V_INT) {
      char buf[256];
      elab_error(e, p->loc, "model argument '%s': dims must be ints, got %s", dc->name, elab_value_desc(e, &v, buf, sizeof buf));
      return -1;
    }
    t->dim[i] = v.i;
    t->dname[i] = p->kind == MDL_E_NAMED_DIM ? ts_intern(p->str) : v.s;
    /* `batch=micro_batch` binds batch in the model body, as in a fn (it may
     * shadow a config constant of that name: inside, it is this size) */
    if (p->kind == MDL_E_NAMED_DIM) elab_frame_set(f, p->str, elab_int(v.i, p->loc));
  }
  char what[256];
  snprintf(what, sizeof what, "model argument '%s'", dc->name);
  return elab_check_type(e, dc->loc, t, what);
}

/* A model with a `train` block is trained by mrun, which feeds its inputs
 * by name from the data pipeline (ir.h "the model inputs a data pipeline
 * feeds"): any other name, a wrong dtype, or a shape other than the
 * tokens' (else the targets') is refused here, at the signature, rather
 * than when a run starts.  Models without one are compiled for their IR
 * (tests, analyses) and may take any input. */
static void check_feeds(Elab *e, const MdlFunc *fn, const IrType *ty, const unsigned char *ok) {
  if (!e->main->ntrain) return;
  const IrType *ref = NULL;
  const char *refname = NULL;
  for (int i = 0; i < fn->ndecls; i++) {
    int f = ok[i] ? ir_feed_find(fn->decls[i].name) : -1;
    if ((f == IR_FEED_TOKENS || (f == IR_FEED_TARGETS && !ref)) && ir_feed_dtype_ok(f, ty[i].dtype))
      ref = &ty[i], refname = fn->decls[i].name;
  }
  for (int i = 0; i < fn->ndecls; i++) {
    const MdlDecl *dc = &fn->decls[i];
    if (!ok[i]) continue;
    char b1[256], b2[256];
    int f = ir_feed_find(dc->name);
    if (f < 0) {
      elab_error(e, dc->loc, "model input '%s': a model with a train block is trained by mrun, whose data pipeline "
                 "feeds only the inputs %s (docs/data.md)", dc->name, ir_feed_list());
    } else if (!ir_feed_dtype_ok((IrFeed)f, ty[i].dtype)) {
      elab_error(e, dc->loc, "model input '%s' is %s; the data pipeline feeds it as %s", dc->name,
                 ir_type_str(&ty[i], b1, sizeof b1), f == IR_FEED_LOSS_MASK ? "f32, f64 or i32" : "i32");
    } else if (ref && &ty[i] != ref) {
      int same = ty[i].rank == ref->rank;
      for (int d = 0; same && d < ref->rank; d++) same = ty[i].dim[d] == ref->dim[d];
      if (!same)
        elab_error(e, dc->loc, "model input '%s' is %s, but '%s' is %s: the data pipeline feeds every input one "
                   "value per token, in the shape of '%s'", dc->name, ir_type_str(&ty[i], b1, sizeof b1), refname,
                   ir_type_str(ref, b2, sizeof b2), refname);
    }
  }
}

static void elab_model(Elab *e) {
  const MdlFunc *fn = e->main->model;
  IrType *ty = ts_xcalloc((size_t)fn->ndecls + 1, sizeof *ty);   /* the tensor inputs' types, for check_feeds */
  unsigned char *tok = ts_xcalloc((size_t)fn->ndecls + 1, 1);
  ElabNaming nm;
  memset(&nm, 0, sizeof nm);
  nm.prefix = "";
  ElabFrame fr;
  memset(&fr, 0, sizeof fr);
  fr.parent = &e->config;
  fr.prog = e->main;
  fr.naming = &nm;
  for (int i = 0; i < fn->ndecls; i++) {
    const MdlDecl *dc = &fn->decls[i];
    Value v;
    if (dc->type == MDL_T_TENSOR) {
      IrType t;
      v = input_type(e, &fr, dc, &t) ? elab_err()
                                     : elab_emit(e, dc->loc, IR_OP_INPUT, NULL, 0, NULL, NULL, dc->name, &t);
      if (v.k != V_ERR) ty[i] = elab_type(e, &v), tok[i] = 1;
    } else if (!dc->dflt) {
      elab_error(e, dc->loc, "model argument '%s' is not a tensor, so it needs a default value", dc->name);
      v = elab_err();
    } else {
      v = eval(e, &fr, dc->dflt);
      if (v.k != V_ERR && check_decl(e, &fr, fn->name, dc, &v, dc->dflt->loc)) v = elab_err();
    }
    elab_frame_set(&fr, dc->name, v);
  }
  check_feeds(e, fn, ty, tok);
  free(ty);
  free(tok);
  int err0 = e->d->nerrors;
  Flow fl = exec_block(e, &fr, fn->body, fn->nbody);
  if (e->d->nerrors == err0) {
    if (fl != FLOW_RETURN) {
      elab_error(e, fn->loc, "model '%s' must return its loss (a scalar float tensor)", fn->name);
    } else if (fr.ret.k != V_ERR) {
      Value r = fr.ret;
      IrType t;
      if (r.k == V_TENSOR) t = elab_type(e, &r);
      if (r.k != V_TENSOR || t.rank != 0 || !ir_dtype_is_float(t.dtype)) {
        char buf[256];
        elab_error(e, r.loc, "the model must return a scalar float tensor (the loss), got %s",
                   elab_value_desc(e, &r, buf, sizeof buf));
        if (r.k == V_TENSOR) mdl_note(e->d, r.loc, "reduce it with sum(...) or mean(...)");
      } else {
        elab_emit(e, r.loc, IR_OP_OUTPUT, &r, 1, NULL, NULL, "loss", NULL);
      }
    }
  }
  elab_frame_free(&fr);
  free(nm.counters.a);
}

IrModule *mdl_elaborate(const MdlProgram *main, const MdlModuleRef *mods, int nmods,
                        const MdlOptions *opt, MdlDiag *d) {
  MdlOptions defaults;
  if (!opt) { mdl_options_init(&defaults); opt = &defaults; }
  int err0 = d->nerrors;
  if (!main->model) {
    MdlLoc at = {main->file, 0, 0};
    mdl_error(d, at, "no model to elaborate");   /* internal */ /* the parser refuses a main file without one */
    return NULL;
  }
  Elab e;
  memset(&e, 0, sizeof e);
  e.d = d;
  e.opt = opt;
  e.main = main;
  e.mods = mods;
  e.nmods = nmods;
  e.m = ir_module_new(main->model->name);
  e.blk = ir_block_add(e.m, "forward");
  e.prec = IR_F32;
  arena_init(&e.a);
  e.config.prog = main;
  /* the blocks in dependency order: train and parallel read config values,
   * the model needs the precision from train */
  elab_config(&e);
  if (!e.abort) elab_train(&e);
  if (!e.abort) elab_parallel(&e);
  if (!e.abort) elab_rules(&e);
  if (!e.abort && d->nerrors == err0) elab_model(&e);
  if (!e.abort && d->nerrors == err0) elab_train_sizes(&e);
  IrModule *m = e.m;
  if (d->nerrors > err0) {
    ir_module_free(m);
    m = NULL;
  }
  elab_frame_free(&e.config);
  free(e.snames);
  arena_free(&e.a);
  return m;
}
