/* parse.c - reads the IR text form written by print.c (docs/ir.md).
 *
 * Line oriented: one item per line, '#' comments, blank lines ignored.
 * Every node goes through ir_emit, so the shape rules re-check it; the
 * written type must then agree in sizes and dtype with the inferred one
 * (the written dim names are kept).  The whole module is verified at the
 * end.  Errors are "file:line:col: error: message"; the parser must never
 * crash on any input (it is fuzzed), so every read is bounds-checked
 * against the NUL terminator and every number against overflow. */
#include "ir.h"
#include "ir_priv.h"
#include <errno.h>
#include <stdarg.h>

typedef struct { int state; const char *name; int line, col; } PendingOf;

typedef struct {
  const char *s;
  size_t pos, line_start;
  int line;
  const char *fname;
  char *err;
  size_t errlen;
  IrModule *m;
  /* `of=@name` of grads/moments, resolved once all states are known */
  VEC(PendingOf) ofs;
} P;

static int perr_at(P *p, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int perr_at(P *p, int line, int col, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int k = snprintf(p->err, p->errlen, "%s:%d:%d: error: ", p->fname ? p->fname : "<ir>", line, col);
    if (k >= 0 && (size_t)k < p->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}
static int col_of(P *p, size_t pos) { return (int)(pos - p->line_start) + 1; }
#define PERR(...) perr_at(p, p->line, col_of(p, p->pos), __VA_ARGS__)

static char cur(P *p) { return p->s[p->pos]; }

/* Skips blanks within the line; a '#' comment runs to the end of line. */
static void skip_ws(P *p) {
  for (;;) {
    char c = cur(p);
    if (c == ' ' || c == '\t' || c == '\r') p->pos++;
    else if (c == '#') { while (cur(p) && cur(p) != '\n') p->pos++; }
    else break;
  }
}
static int at_eol(P *p) { skip_ws(p); return cur(p) == '\n' || cur(p) == 0; }

static int expect_eol(P *p) {
  if (!at_eol(p)) return PERR("unexpected '%c' (expected end of line)", cur(p));
  if (cur(p) == '\n') { p->pos++; p->line++; p->line_start = p->pos; }
  return 0;
}

/* Moves to the first character of the next non-blank, non-comment line.
 * Returns 0 at end of text. */
static int next_item(P *p) {
  for (;;) {
    skip_ws(p);
    if (cur(p) == '\n') { p->pos++; p->line++; p->line_start = p->pos; continue; }
    return cur(p) != 0;
  }
}

static int accept(P *p, char c) {
  skip_ws(p);
  if (cur(p) != c) return 0;
  p->pos++;
  return 1;
}
static int expect(P *p, char c) {
  if (accept(p, c)) return 0;
  if (at_eol(p)) return PERR("expected '%c' before end of line", c);
  return PERR("expected '%c', found '%c'", c, cur(p));
}

static int is_word_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_word_char(char c) { return is_word_start(c) || (c >= '0' && c <= '9') || c == '.'; }

/* A (dotted) identifier: letters, digits, '_' and '.', not starting with a
 * digit or '.'.  Returns the interned word or NULL after an error. */
static const char *word(P *p, const char *what) {
  skip_ws(p);
  size_t st = p->pos;
  if (!is_word_start(cur(p))) {
    if (at_eol(p)) return PERR("expected %s before end of line", what), NULL;
    return PERR("expected %s, found '%c'", what, cur(p)), NULL;
  }
  while (is_word_char(cur(p))) p->pos++;
  return ts_intern_n(p->s + st, p->pos - st);
}

/* Is the next word `w` (whole word)?  Consumes it if so. */
static int accept_word(P *p, const char *w) {
  skip_ws(p);
  size_t k = strlen(w);
  if (strncmp(p->s + p->pos, w, k) != 0 || is_word_char(p->s[p->pos + k])) return 0;
  p->pos += k;
  return 1;
}
static int expect_word(P *p, const char *w) {
  size_t at = (skip_ws(p), p->pos);
  if (accept_word(p, w)) return 0;
  return perr_at(p, p->line, col_of(p, at), "expected '%s'", w);
}

static int parse_int(P *p, int64_t *out) {
  skip_ws(p);
  size_t st = p->pos;
  if (cur(p) == '-' || cur(p) == '+') p->pos++;
  if (!(cur(p) >= '0' && cur(p) <= '9')) { p->pos = st; return PERR("expected an integer"); }
  while (cur(p) >= '0' && cur(p) <= '9') p->pos++;
  char buf[32];
  size_t k = p->pos - st;
  if (k >= sizeof buf) { p->pos = st; return PERR("integer too long"); }
  memcpy(buf, p->s + st, k);
  buf[k] = 0;
  errno = 0;
  long long v = strtoll(buf, NULL, 10);
  if (errno) { p->pos = st; return PERR("integer out of range"); }
  *out = v;
  return 0;
}

/* A number token (up to blank, ',', ')', ']' or end of line): an integer
 * if it is only digits, else a float spelled as strtod reads it. */
static int parse_number(P *p, int *is_float, int64_t *iv, double *fv) {
  skip_ws(p);
  size_t st = p->pos;
  while (cur(p) && !strchr(" \t\r\n#,)]", cur(p))) p->pos++;
  size_t k = p->pos - st;
  char buf[64];
  if (k == 0 || k >= sizeof buf) { p->pos = st; return PERR("expected a number"); }
  memcpy(buf, p->s + st, k);
  buf[k] = 0;
  char *end;
  size_t d = (buf[0] == '-' || buf[0] == '+') ? 1 : 0;
  if (buf[d] && strspn(buf + d, "0123456789") == k - d) {
    errno = 0;
    *iv = strtoll(buf, &end, 10);
    if (errno) { p->pos = st; return PERR("integer out of range"); }
    *is_float = 0;
    *fv = (double)*iv;
    return 0;
  }
  *fv = strtod(buf, &end);
  if (*end || end == buf) { p->pos = st; return PERR("bad number '%s'", buf); }
  *is_float = 1;
  return 0;
}
static int parse_double(P *p, double *out) {
  int isf;
  int64_t iv;
  return parse_number(p, &isf, &iv, out);
}

/* "..." with \" \\ \n \t \xHH escapes; result interned. */
static const char *parse_string(P *p) {
  skip_ws(p);
  if (cur(p) != '"') return PERR("expected a string"), NULL;
  p->pos++;
  StrBuf b = {0};
  for (;;) {
    char c = cur(p);
    if (c == 0 || c == '\n') { sb_free(&b); return PERR("unterminated string"), NULL; }
    p->pos++;
    if (c == '"') break;
    if (c == '\\') {
      char e = cur(p);
      if (e == '"' || e == '\\') { sb_putc(&b, e); p->pos++; }
      else if (e == 'n') { sb_putc(&b, '\n'); p->pos++; }
      else if (e == 't') { sb_putc(&b, '\t'); p->pos++; }
      else if (e == 'x') {
        int v = 0;
        for (int i = 1; i <= 2; i++) {
          char h = p->s[p->pos + i];
          int dv = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (dv < 0) { sb_free(&b); return PERR("bad \\x escape"), NULL; }
          v = v * 16 + dv;
        }
        if (v == 0) { sb_free(&b); return PERR("\\x00 is not allowed in a string"), NULL; }
        sb_putc(&b, (char)v);
        p->pos += 3;
      } else { sb_free(&b); return PERR("unknown escape '\\%c'", e ? e : '0'), NULL; }
    } else {
      sb_putc(&b, c);
    }
  }
  const char *r = ts_intern_n(b.p ? b.p : "", b.n);
  sb_free(&b);
  return r;
}

/* f32[batch:4, 64] */
static int parse_type(P *p, IrType *t) {
  memset(t, 0, sizeof *t);
  skip_ws(p);
  size_t at = p->pos;
  const char *dt = word(p, "a dtype");
  if (!dt) return -1;
  int d = ir_dtype_lookup(dt);
  if (d < 0 || d == IR_VOID) return perr_at(p, p->line, col_of(p, at), "unknown dtype '%s'", dt);
  t->dtype = (IrDtype)d;
  if (expect(p, '[')) return -1;
  if (accept(p, ']')) return 0;
  for (;;) {
    if (t->rank == IR_MAX_RANK) return PERR("more than %d dims", IR_MAX_RANK);
    skip_ws(p);
    if (is_word_start(cur(p))) {
      if (!(t->dname[t->rank] = word(p, "a dim name"))) return -1;
      if (expect(p, ':')) return -1;
    }
    int64_t v;
    skip_ws(p);
    size_t vat = p->pos;
    if (parse_int(p, &v)) return -1;
    if (v < 1) return perr_at(p, p->line, col_of(p, vat), "dim size must be >= 1");
    t->dim[t->rank++] = v;
    if (accept(p, ']')) return 0;
    if (expect(p, ',')) return -1;
  }
}

/* One mesh axis name -> its IrAxis in *a. */
static int parse_axis(P *p, int *a) {
  skip_ws(p);
  size_t at = p->pos;
  const char *w = word(p, "a mesh axis");
  if (!w) return -1;
  *a = ir_axis_lookup(w);
  if (*a < 0) return perr_at(p, p->line, col_of(p, at), "unknown mesh axis '%s' (dp, pp, cp, ep, tp)", w);
  return 0;
}

/* axes joined by '+': "cp+tp" -> mask; in a split (star_ok) a last
 * "cp*" is the contiguous innermost cp level (IR_SPLIT_CP_MINOR) */
static int parse_axes(P *p, uint8_t *mask, int star_ok) {
  *mask = 0;
  for (;;) {
    skip_ws(p);
    size_t at = p->pos;
    int a;
    if (parse_axis(p, &a)) return -1;
    if (*mask & (1u << a)) return perr_at(p, p->line, col_of(p, at), "mesh axis %s given twice", ir_axis_name((IrAxis)a));
    *mask |= (uint8_t)(1u << a);
    if (cur(p) == '*') {
      if (!star_ok || a != IR_AXIS_CP)
        return perr_at(p, p->line, col_of(p, at), "only cp takes a star (the contiguous innermost cp level of a split)");
      p->pos++;
      *mask |= (uint8_t)IR_SPLIT_CP_MINOR;
      if (cur(p) == '+') return perr_at(p, p->line, col_of(p, at), "cp* must be the last axis of its split");
      return 0;
    }
    if (!accept(p, '+')) return 0;
  }
}

/* Optional " {1:tp, partial:dp, flat:dp}" after a type of rank `rank`. */
static int parse_sharding(P *p, IrSharding *sh, int rank) {
  memset(sh, 0, sizeof *sh);
  skip_ws(p);
  if (cur(p) != '{') return 0;
  p->pos++;
  for (;;) {
    skip_ws(p);
    size_t at = p->pos;
    uint8_t *slot;
    if (cur(p) >= '0' && cur(p) <= '9') {
      int64_t d;
      if (parse_int(p, &d)) return -1;
      if (d < 0 || d >= rank) return perr_at(p, p->line, col_of(p, at), "sharding dim %lld out of range (rank %d)", (long long)d, rank);
      slot = &sh->split[d];
    } else {
      const char *k = word(p, "a dim number, 'partial' or 'flat'");
      if (!k) return -1;
      if (!strcmp(k, "partial")) slot = &sh->partial;
      else if (!strcmp(k, "flat")) slot = &sh->flat;
      else return perr_at(p, p->line, col_of(p, at), "unknown sharding key '%s'", k);
    }
    if (*slot) return perr_at(p, p->line, col_of(p, at), "sharding entry given twice");
    if (expect(p, ':') || parse_axes(p, slot, slot != &sh->partial && slot != &sh->flat)) return -1;
    if (accept(p, '}')) return 0;
    if (expect(p, ',')) return -1;
  }
}

/* @name of an existing state -> its index */
static int parse_state_ref(P *p, int64_t *idx) {
  skip_ws(p);
  size_t at = p->pos;
  if (expect(p, '@')) return -1;
  const char *nm = word(p, "a state name");
  if (!nm) return -1;
  int i = ir_state_find(p->m, nm);
  if (i < 0) return perr_at(p, p->line, col_of(p, at), "unknown state @%s", nm);
  *idx = i;
  return 0;
}

static int parse_key(P *p, const char *key) {
  if (expect_word(p, key)) return -1;
  return expect(p, '=');
}

/* ---- header lines ---- */
static int parse_const(P *p) {
  IrConst c = {0};
  if (!(c.name = word(p, "a const name")) || expect(p, '=')) return -1;
  double f;
  if (parse_number(p, &c.is_float, &c.i, &f)) return -1;
  if (c.is_float) c.f = f;
  VEC_PUSH(p->m->consts, c);
  return expect_eol(p);
}

static int parse_train(P *p) {
  IrTrain *t = &p->m->train;
  while (!at_eol(p)) {
    size_t at = p->pos;
    const char *k = word(p, "a train key");
    if (!k || expect(p, '=')) return -1;
    int64_t iv = 0;
    int r = 0;
#define FKEY(n) else if (strcmp(k, #n) == 0) r = parse_double(p, &t->n)
#define IKEY(n) else if (strcmp(k, #n) == 0) { r = parse_int(p, &iv); t->n = iv; }
    if (0) {}
    FKEY(lr); FKEY(beta1); FKEY(beta2); FKEY(eps); FKEY(weight_decay); FKEY(min_lr); FKEY(clip_grad);
    FKEY(momentum); FKEY(muon_momentum); FKEY(muon_adamw_lr);
    IKEY(warmup) IKEY(decay_steps) IKEY(global_batch) IKEY(micro_batch) IKEY(seq_len) IKEY(steps)
    IKEY(nesterov) IKEY(muon_ns_steps) IKEY(wsd_decay_steps)
    IKEY(rampup_start) IKEY(rampup_incr) IKEY(rampup_samples)
    else if (strcmp(k, "optimizer") == 0 || strcmp(k, "wsd_style") == 0 || strcmp(k, "muon_tp") == 0) {
      skip_ws(p);
      size_t vat = p->pos;
      const char *v = word(p, "a name");
      if (!v) return -1;
      int which = k[0] == 'o' ? 0 : k[0] == 'w' ? 1 : 2, w = -1;
      int nn = which == 0 ? IR_OPT_COUNT : which == 1 ? IR_WSD_COUNT : IR_MUON_TP_COUNT;
      for (int i = 0; i < nn; i++)
        if (strcmp(v, which == 0 ? ir_optimizer_name((IrOptimizer)i) : which == 1 ? ir_wsd_style_name((IrWsdStyle)i)
                          : ir_muon_tp_name((IrMuonTp)i)) == 0) w = i;
      if (w < 0)
        return perr_at(p, p->line, col_of(p, vat), which == 0 ? "unknown optimizer '%s' (adamw, sgd, lion, muon)"
                       : which == 1 ? "unknown wsd_style '%s' (linear, cosine, exponential, minus_sqrt)"
                       : "unknown muon_tp '%s' (auto, allreduce, gather)", v);
      if (which == 0) t->optimizer = (IrOptimizer)w;
      else if (which == 1) t->wsd_style = (IrWsdStyle)w;
      else t->muon_tp = (IrMuonTp)w;
    }
    else if (strcmp(k, "seed") == 0) {
      skip_ws(p);
      size_t st = p->pos;
      while (cur(p) >= '0' && cur(p) <= '9') p->pos++;
      char buf[32];
      if (p->pos == st || p->pos - st >= sizeof buf) { p->pos = st; return PERR("expected a seed"); }
      memcpy(buf, p->s + st, p->pos - st);
      buf[p->pos - st] = 0;
      errno = 0;
      t->seed = strtoull(buf, NULL, 10);
      if (errno) { p->pos = st; return PERR("seed out of range"); }
    } else if (strcmp(k, "schedule") == 0 || strcmp(k, "precision") == 0) {
      skip_ws(p);
      size_t vat = p->pos;
      const char *v = word(p, "a name");
      if (!v) return -1;
      if (k[0] == 's') {
        int s = -1;
        for (int i = 0; i < IR_SCHED_COUNT; i++)
          if (strcmp(v, ir_schedule_name((IrSchedule)i)) == 0) s = i;
        if (s < 0) return perr_at(p, p->line, col_of(p, vat), "unknown schedule '%s'", v);
        t->schedule = (IrSchedule)s;
      } else {
        int d = ir_dtype_lookup(v);
        if (d != IR_F32 && d != IR_F64 && d != IR_BF16 && d != IR_F16)
          return perr_at(p, p->line, col_of(p, vat), "precision must be f32, f64, bf16 or f16");
        /* bf16 / f16: f32 masters and arithmetic, 16-bit storage (ir.h IrTrain) */
        t->precision = ir_dtype_is_16((IrDtype)d) ? IR_F32 : (IrDtype)d;
        t->lowp = ir_dtype_is_16((IrDtype)d) ? (IrDtype)d : IR_VOID;
      }
    } else {
      return perr_at(p, p->line, col_of(p, at), "unknown train key '%s'", k);
    }
#undef FKEY
#undef IKEY
    if (r) return -1;
  }
  return expect_eol(p);
}

static int parse_parallel(P *p) {
  IrParallel *q = &p->m->par;
  while (!at_eol(p)) {
    size_t at = p->pos;
    const char *k = word(p, "a parallel key");
    if (!k || expect(p, '=')) return -1;
    if (!strcmp(k, "schedule")) {      /* pipeline schedule by name */
      skip_ws(p);
      size_t vat = p->pos;
      /* "1f1b" starts with a digit, which word() does not take; "zb-h1" has a '-' */
      while (is_word_char(cur(p)) || cur(p) == '-') p->pos++;
      if (p->pos == vat) return PERR("expected a pipeline schedule"), -1;
      const char *v = ts_intern_n(p->s + vat, p->pos - vat);
      int s = -1;
      for (int i = 0; i < IR_PIPE_COUNT; i++)
        if (strcmp(v, ir_pipe_sched_name((IrPipeSched)i)) == 0) s = i;
      if (s < 0) return perr_at(p, p->line, col_of(p, vat), "unknown pipeline schedule '%s'", v);
      q->sched = s;
      continue;
    }
    int *slot = !strcmp(k, "tp") ? &q->tp : !strcmp(k, "pp") ? &q->pp : !strcmp(k, "cp") ? &q->cp
              : !strcmp(k, "ep") ? &q->ep : !strcmp(k, "dp") ? &q->dp : !strcmp(k, "sp") ? &q->sp : !strcmp(k, "zero") ? &q->zero
              : !strcmp(k, "vpp") ? &q->vpp : !strcmp(k, "stage") ? &q->stage : NULL;
    if (!slot) return perr_at(p, p->line, col_of(p, at), "unknown parallel key '%s'", k);
    int64_t v;
    skip_ws(p);
    size_t vat = p->pos;
    if (parse_int(p, &v)) return -1;
    if (v < 0 || v > 1 << 20) return perr_at(p, p->line, col_of(p, vat), "%s=%lld out of range", k, (long long)v);
    *slot = (int)v;
  }
  return expect_eol(p);
}

/* rule DIM = axis... */
static int parse_rule(P *p) {
  IrRule r = {0};
  if (!(r.dim = word(p, "a dim name")) || expect(p, '=')) return -1;
  while (!at_eol(p)) {
    int a;
    if (parse_axis(p, &a)) return -1;
    r.axes |= (uint8_t)(1u << a);
  }
  VEC_PUSH(p->m->rules, r);
  return expect_eol(p);
}

/* state @name : type [sharding] kind (init=... | start=V | of=@param) [nodecay] [sharded] [logical=[...]] */
static int parse_state(P *p) {
  IrState s = {0};
  s.of = -1;
  skip_ws(p);
  size_t at = p->pos;
  if (expect(p, '@') || !(s.name = word(p, "a state name"))) return -1;
  if (ir_state_find(p->m, s.name) >= 0) return perr_at(p, p->line, col_of(p, at), "state @%s defined twice", s.name);
  if (expect(p, ':') || parse_type(p, &s.type) || parse_sharding(p, &s.sh, s.type.rank)) return -1;
  skip_ws(p);
  size_t kat = p->pos;
  const char *kind = word(p, "a state kind");
  if (!kind) return -1;
  int k = -1;
  for (int i = 0; i < IR_STATE_KIND_COUNT; i++)
    if (strcmp(kind, ir_state_kind_name((IrStateKind)i)) == 0) k = i;
  if (k < 0) return perr_at(p, p->line, col_of(p, kat), "unknown state kind '%s'", kind);
  s.kind = (IrStateKind)k;
  if (s.kind == IR_STATE_PARAM) {
    if (parse_key(p, "init")) return -1;
    skip_ws(p);
    size_t iat = p->pos;
    const char *init = word(p, "an init kind");
    if (!init) return -1;
    int ik = -1;
    for (int i = 0; i < IR_INIT_KIND_COUNT; i++)
      if (strcmp(init, ir_init_kind_name((IrInitKind)i)) == 0) ik = i;
    if (ik < 0) return perr_at(p, p->line, col_of(p, iat), "unknown init '%s'", init);
    s.init = (IrInitKind)ik;
    if (s.init == IR_INIT_NORMAL || s.init == IR_INIT_UNIFORM) {
      if (expect(p, '(') || parse_double(p, &s.init_a) || expect(p, ',') || parse_double(p, &s.init_b) ||
          expect(p, ')'))
        return -1;
    }
  } else if (s.kind == IR_STATE_SCALER || s.kind == IR_STATE_FP8) {
    if (parse_key(p, "start") || parse_double(p, &s.init_a)) return -1;
  } else if (s.kind != IR_STATE_CACHE) {
    if (parse_key(p, "of")) return -1;
    skip_ws(p);
    int oline = p->line, ocol = col_of(p, p->pos);
    const char *of;
    if (expect(p, '@') || !(of = word(p, "a param name"))) return -1;
    VEC_PUSH(p->ofs, ((PendingOf){p->m->states.n, of, oline, ocol}));
  }
  if (accept_word(p, "nodecay")) s.flags |= IR_STATE_NODECAY;
  if (accept_word(p, "sharded")) s.flags |= IR_STATE_SHARDED;
  if (accept_word(p, "logical")) {
    if (expect(p, '=') || expect(p, '[')) return -1;
    for (int d = 0;; d++) {
      if (d >= s.type.rank) return PERR("logical has more entries than the type's rank");
      skip_ws(p);
      if (parse_int(p, &s.logical[d])) return -1;
      if (s.logical[d] < 0) return PERR("logical sizes must be >= 0");
      if (accept(p, ']')) { if (d != s.type.rank - 1) return PERR("logical needs one entry per dim"); break; }
      if (expect(p, ',')) return -1;
    }
  }
  if (expect_eol(p)) return -1;
  ir_state_add(p->m, &s);
  return 0;
}

static int resolve_ofs(P *p) {
  for (int i = 0; i < p->ofs.n; i++) {
    int j = ir_state_find(p->m, p->ofs.a[i].name);
    if (j < 0 || p->m->states.a[j].kind != IR_STATE_PARAM)
      return perr_at(p, p->ofs.a[i].line, p->ofs.a[i].col, "@%s is not a param", p->ofs.a[i].name);
    p->m->states.a[p->ofs.a[i].state].of = j;
  }
  p->ofs.n = 0;
  return 0;
}

/* ---- nodes ---- */
/*   %N = op ["sa"] %a, %b @state... key=value... : type
 *   op ["sa"] %a @state... key=value...                   (effects) */
static int parse_node(P *p, int bi) {
  IrBlock *b = &p->m->blocks.a[bi];
  int has_result = 0;
  skip_ws(p);
  if (cur(p) == '%') {
    p->pos++;
    int64_t id;
    size_t idat = p->pos;
    if (parse_int(p, &id)) return -1;
    if (id != b->n)
      return perr_at(p, p->line, col_of(p, idat), "expected %%%d (nodes, effects included, are numbered in order)", b->n);
    if (expect(p, '=')) return -1;
    has_result = 1;
  }
  skip_ws(p);
  int opline = p->line, opcol = col_of(p, p->pos);
  const char *opname = word(p, "an op");
  if (!opname) return -1;
  int op = ir_op_lookup(opname);
  if (op < 0) return perr_at(p, opline, opcol, "unknown op '%s'", opname);
  const IrOpInfo *info = &ir_ops[op];
  const IrOpAttrs *at = ir_op_attrs((IrOp)op);
  int effect = (info->flags & OPF_EFFECT) != 0;
  if (effect && has_result) return perr_at(p, opline, opcol, "%s is an effect and has no result", opname);
  if (!effect && !has_result) return perr_at(p, opline, opcol, "expected '%%%d = ' before %s", b->n, opname);

  const char *sa = NULL;
  skip_ws(p);
  if (cur(p) == '"' && !(sa = parse_string(p))) return -1;

  VEC(int) in = {0};
  int rc = -1;
  skip_ws(p);
  if (cur(p) == '%') {
    for (;;) {
      skip_ws(p);
      size_t oat = p->pos;
      int64_t v;
      if (expect(p, '%') || parse_int(p, &v)) goto out;
      if (v < 0 || v >= b->n) {
        perr_at(p, p->line, col_of(p, oat), "%%%lld is not defined before %%%d", (long long)v, b->n);
        goto out;
      }
      if (in.n >= 4096) { PERR("too many operands"); goto out; }
      VEC_PUSH(in, (int)v);
      if (!accept(p, ',')) break;
    }
  }
  int64_t ia[IR_MAX_IATTR] = {0};
  double fa[IR_MAX_FATTR] = {0};
  for (int i = 0; i < at->ni; i++)
    if (at->is_state[i] && parse_state_ref(p, &ia[i])) goto out;
  for (int i = 0; i < at->ni; i++) {
    if (at->is_state[i]) continue;
    skip_ws(p);
    size_t kat = p->pos;
    if (parse_key(p, at->iname[i])) goto out;
    if (i == at->list) {
      int want = in.n > 0 ? b->nodes[in.a[0]].type.rank : 0, k = 0;
      if (expect(p, '[')) goto out;
      if (!accept(p, ']')) {
        for (;;) {
          if (i + k >= IR_MAX_IATTR) { PERR("%s has too many entries", at->iname[i]); goto out; }
          if (parse_int(p, &ia[i + k])) goto out;
          k++;
          if (accept(p, ']')) break;
          if (expect(p, ',')) goto out;
        }
      }
      if (k != want) {
        perr_at(p, p->line, col_of(p, kat),"%s has %d entries, expected %d (the operand's rank)", at->iname[i], k, want);
        goto out;
      }
    } else if (at->is_axis[i]) {
      uint8_t mask;   /* one axis, or a set "dp+cp" (ir_axes_mask) */
      if (parse_axes(p, &mask, 0)) goto out;
      ia[i] = ir_axes_attr(mask);
    } else if (parse_int(p, &ia[i])) {
      goto out;
    }
  }
  for (int i = 0; i < at->nf; i++)
    if (parse_key(p, at->fname[i]) || parse_double(p, &fa[i])) goto out;
  IrType t = {0};
  IrSharding sh = {0};
  if (!effect && (expect(p, ':') || parse_type(p, &t) || parse_sharding(p, &sh, t.rank))) goto out;
  int64_t group = 0;
  if (accept_word(p, "group")) {
    if (expect(p, '=')) goto out;
    skip_ws(p);
    size_t gat = p->pos;
    if (parse_int(p, &group)) goto out;
    if (group < 1 || group > INT32_MAX) { perr_at(p, p->line, col_of(p, gat), "fusion group must be >= 1"); goto out; }
  }
  int64_t stage = 0;
  if (accept_word(p, "stage")) {
    if (expect(p, '=')) goto out;
    skip_ws(p);
    size_t sat = p->pos;
    if (parse_int(p, &stage)) goto out;
    if (stage < 1 || stage > INT32_MAX) { perr_at(p, p->line, col_of(p, sat), "pipeline stage tag must be >= 1"); goto out; }
  }
  if (expect_eol(p)) goto out;
  {
    char msg[512];
    int id = ir_emit(p->m, bi, (IrOp)op, in.a, in.n, ia, fa, sa, ir_op_given_type((IrOp)op, &t),
                     msg, sizeof msg);
    if (id < 0) { perr_at(p, opline, opcol, "%s", msg); goto out; }
    b = &p->m->blocks.a[bi];
    IrNode *n = &b->nodes[id];
    if (!effect) {
      if (!ir_type_same_shape(&t, &n->type)) {
        char t1[256], t2[256];
        perr_at(p, opline, opcol, "%s: written type %s but the operands give %s", opname,
                ir_type_str(&t, t1, sizeof t1), ir_type_str(&n->type, t2, sizeof t2));
        goto out;
      }
      n->type = t;    /* keep the written dim names */
      n->sh = sh;
    }
    n->group = (int)group;
    n->stage = (int)stage;
  }
  rc = 0;
out:
  free(in.a);
  return rc;
}

/* block NAME {  ...nodes...  } */
static int parse_block(P *p) {
  const char *name = word(p, "a block name");
  if (!name || expect(p, '{') || expect_eol(p)) return -1;
  if (ir_block_find(p->m, name) >= 0) return PERR("block %s defined twice", name);
  int bi = ir_block_add(p->m, name);
  for (;;) {
    if (!next_item(p)) return PERR("missing '}' at end of block %s", name);
    if (accept(p, '}')) return expect_eol(p);
    if (parse_node(p, bi)) return -1;
  }
}

/* module NAME, header lines, states, blocks, `end` (or end of text). */
static IrModule *parse_module(P *p, int need_end_or_eof, int need_sections) {
  if (!next_item(p)) return PERR("expected 'module'"), NULL;
  int mline = p->line;
  if (expect_word(p, "module")) return NULL;
  const char *name = word(p, "a module name");
  if (!name || expect_eol(p)) return NULL;
  p->m = ir_module_new(name);
  int seen_block = 0, ok = 0, seen_train = 0, seen_par = 0;
  for (;;) {
    if (!next_item(p)) {
      if (need_end_or_eof) { ok = 1; break; }
      PERR("missing 'end' of module %s", name);
      break;
    }
    skip_ws(p);
    int kline = p->line, kcol = col_of(p, p->pos);
    const char *kw = word(p, "a line keyword (const, train, parallel, state, block, end)");
    if (!kw) break;
    int r;
    if (!strcmp(kw, "end")) {
      if (expect_eol(p)) break;
      ok = 1;
      break;
    } else if (!strcmp(kw, "block")) {
      if (!seen_block && resolve_ofs(p)) break;
      seen_block = 1;
      r = parse_block(p);
    } else if (seen_block) {
      perr_at(p, kline, kcol, "'%s' must come before the blocks", kw);
      break;
    } else if (!strcmp(kw, "const")) r = parse_const(p);
    else if (!strcmp(kw, "train")) r = parse_train(p), seen_train = 1;
    else if (!strcmp(kw, "parallel")) r = parse_parallel(p), seen_par = 1;
    else if (!strcmp(kw, "state")) r = parse_state(p);
    else if (!strcmp(kw, "rule")) r = parse_rule(p);
    else { perr_at(p, kline, kcol, "unknown line '%s'", kw); break; }
    if (r) break;
  }
  if (ok && !seen_block && resolve_ofs(p)) ok = 0;
  if (ok && need_sections && (!seen_train || !seen_par)) {
    perr_at(p, mline, 1, "module %s has no '%s' line (a plan's program states its training settings and its layout; "
            "recompile the plan with mcc)", name, !seen_train ? "train" : "parallel");
    ok = 0;
  }
  if (ok) {
    char msg[512];
    if (ir_verify(p->m, msg, sizeof msg)) { perr_at(p, mline, 1, "module %s: %s", name, msg); ok = 0; }
  }
  free(p->ofs.a);
  p->ofs.a = NULL;
  p->ofs.n = p->ofs.cap = 0;
  if (!ok) { ir_module_free(p->m); p->m = NULL; }
  return p->m;
}

static IrModule *parse_at(const char *text, size_t *pos, int *line, const char *fname, char *err, size_t errlen,
                          int need_sections) {
  /* *line counts the lines before *pos (which starts a line), as the plan
   * text reader keeps it; our own counter is the 1-based line at pos. */
  P p = {.s = text, .pos = *pos, .line_start = *pos, .line = *line + 1, .fname = fname, .err = err,
         .errlen = errlen};
  if (err && errlen) err[0] = 0;
  IrModule *m = parse_module(&p, 0, need_sections);
  if (m) { *pos = p.pos; *line = p.line - 1; }
  return m;
}

IrModule *ir_parse_module_at(const char *text, size_t *pos, int *line, const char *fname,
                             char *err, size_t errlen) {
  return parse_at(text, pos, line, fname, err, errlen, 0);
}

IrModule *ir_parse_program_at(const char *text, size_t *pos, int *line, const char *fname,
                              char *err, size_t errlen) {
  return parse_at(text, pos, line, fname, err, errlen, 1);
}

IrModule *ir_parse_module(const char *text, const char *fname, char *err, size_t errlen) {
  P p = {.s = text, .line = 1, .fname = fname, .err = err, .errlen = errlen};
  if (err && errlen) err[0] = 0;
  IrModule *m = parse_module(&p, 1, 0);
  if (m && next_item(&p)) {
    perr_at(&p, p.line, col_of(&p, p.pos), "unexpected text after the end of module %s", m->name);
    ir_module_free(m);
    return NULL;
  }
  return m;
}
