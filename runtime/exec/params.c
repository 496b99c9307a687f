/* params.c - parameter files (mrun --save-params): every parameter of a
 * (possibly sharded) run gathered to world rank 0 in its GLOBAL logical
 * shape and written in one file (format in train.h), read back, and
 * compared.  This is how a sharded run is checked against the single-rank
 * run: same names, same shapes, same numbers up to rounding.
 *
 * Pipeline parallelism: each pipeline rank holds its chunks' parameters;
 * world rank 0 gets the ones it lacks from its pp group (pipe_collect).
 *
 * Gathering: a parameter split along dim d by axes a1 (outer) .. ak (inner)
 * holds block b = (c_a1 * S_a2 + c_a2) ... of d.  All-gathering along d
 * over the INNERMOST axis first, then outward, concatenates the blocks in
 * exactly that order.  Every rank takes part (the gathers are collectives)
 * and ends with the whole tensor; only world rank 0 writes. */
#include "train.h"
#include "rt_priv.h"
#include "runtime/comm/comm.h"
#include <errno.h>
#include <math.h>

/* n elements of dtype dt at p (in a file buffer: not aligned) as double[n]. */
static double *to_double(const void *p, IrDtype dt, int64_t n) {
  double *v = ts_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  const char *c = p;
  for (int64_t i = 0; i < n; i++) {
    if (dt == IR_F32) { float f; memcpy(&f, c + 4 * i, 4); v[i] = f; }
    else memcpy(&v[i], c + 8 * i, 8);
  }
  return v;
}

/* Gathers state s (local type t, data x) into its global padded shape:
 * returns a malloc'd buffer of dtype t->dtype and writes the global type. */
static void *gather_param(RtProgram *p, const IrState *s, IrType *gt, char *err, size_t errlen) {
  const IrType *t = &s->type;
  size_t es = ir_dtype_size(t->dtype);
  *gt = *t;
  void *cur = ts_xmalloc((size_t)(ir_type_numel(t) ? ir_type_numel(t) : 1) * es);
  if (s->flags & IR_STATE_SHARDED) {   /* ZeRO-3: the local tensor is the dp ranks' chunks, gathered */
    const IrModule *m = rt_program_module(p);
    int sh = ir_state_shard_of(m, (int)(s - m->states.a)), dp = rt_program_axis_size(p, IR_AXIS_DP);
    RtComm *g = dp > 1 ? rt_program_group(p, IR_AXIS_DP) : NULL;
    if (sh < 0 || (dp > 1 && !g)) {
      free(cur);
      ts_errf(err, errlen, "@%s is held as ZeRO-3 shards but this rank has no %s", s->name,
              sh < 0 ? "shard state" : "dp group");  /* internal */
      return NULL;
    }
    int64_t c = ir_type_numel(&m->states.a[sh].type);
    char *all = ts_xmalloc((size_t)(c * dp) * es);
    if (g && rt_comm_all_gather(g, t->dtype, rt_state_data(p, sh), all, (size_t)c, err, errlen) != 0) {
      free(cur);
      free(all);
      return NULL;
    }
    if (!g) memcpy(all, rt_state_data(p, sh), (size_t)c * es);
    memcpy(cur, all, (size_t)ir_type_numel(t) * es);
    free(all);
  } else {
    memcpy(cur, rt_state_data(p, (int)(s - rt_program_module(p)->states.a)), (size_t)ir_type_numel(t) * es);
  }
  for (int a = IR_AXIS_COUNT - 1; a >= 0; a--) {   /* innermost axis first */
    int size = rt_program_axis_size(p, (IrAxis)a);
    for (int d = 0; d < t->rank; d++) {
      if (!(s->sh.split[d] & (1u << a)) || size == 1) continue;
      RtComm *g = rt_program_group(p, (IrAxis)a);
      if (!g) {
        free(cur);
        ts_errf(err, errlen, "@%s is split over %s but this rank has no %s group", s->name,
                ir_axis_name((IrAxis)a), ir_axis_name((IrAxis)a));  /* internal */
        return NULL;
      }
      int64_t outer = 1, inner = 1;
      for (int e = 0; e < d; e++) outer *= gt->dim[e];
      for (int e = d + 1; e < gt->rank; e++) inner *= gt->dim[e];
      int64_t nn = ir_type_numel(gt) * size;
      void *next = ts_xmalloc((size_t)(nn > 0 ? nn : 1) * es);
      if (rt_all_gather_dim(g, t->dtype, cur, next, outer, gt->dim[d], inner, err, errlen) != 0) {
        free(cur);
        free(next);
        return NULL;
      }
      free(cur);
      cur = next;
      gt->dim[d] *= size;
    }
  }
  return cur;
}

/* The logical box [0, logical[d]) of x (global padded type gt) as double;
 * writes the logical type into lt. */
static double *strip_padding(const void *x, const IrType *gt, const IrState *s, IrType *lt) {
  *lt = *gt;
  for (int d = 0; d < gt->rank; d++)
    if (s->logical[d] > 0 && s->logical[d] < gt->dim[d]) lt->dim[d] = s->logical[d];
  int64_t n = ir_type_numel(lt), idx[IR_MAX_RANK] = {0};
  double *v = ts_xmalloc((size_t)(n ? n : 1) * sizeof *v);
  for (int64_t i = 0; i < n; i++) {
    int64_t g = 0;
    for (int d = 0; d < gt->rank; d++) g = g * gt->dim[d] + idx[d];
    v[i] = gt->dtype == IR_F32 ? ((const float *)x)[g] : ((const double *)x)[g];
    for (int d = lt->rank - 1; d >= 0; d--) {
      if (++idx[d] < lt->dim[d]) break;
      idx[d] = 0;
    }
  }
  return v;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(const IrState *const *)a)->name, (*(const IrState *const *)b)->name);
}

static void put_u32(StrBuf *b, uint32_t v) { sb_write(b, &v, 4); }

/* One parameter in its global logical shape, as doubles. */
typedef struct {
  const char *name;         /* the IrState's, or malloc'd (received) */
  int owned;                /* name is ours to free */
  IrDtype dtype;
  IrType lt;
  double *v;
} SavedParam;

static int by_saved_name(const void *a, const void *b) {
  return strcmp(((const SavedParam *)a)->name, ((const SavedParam *)b)->name);
}

/* ---- pipeline: the parameters world rank 0 lacks, from its pp group ----
 * Each pipeline rank holds the parameters of its chunks.  The members of
 * world rank 0's pp group (every other coordinate 0) learn each other's
 * sorted name lists (an all-gather of the lengths, then of the lists
 * padded to the longest, one character per f64: the comm layer carries
 * floats only); every parameter is then sent to coordinate 0 by the lowest
 * coordinate holding it, in name order, as a header [dtype, rank, dims]
 * and the values as f64.  Coordinate 0 knows the same lists and receives
 * exactly those messages. */
#define PARAM_HDR (2 + IR_MAX_RANK)
enum { PARAM_TAG = 7102 };

/* The names of ps[0..n) as "a\nb\n" in doubles; *len gets the length. */
static double *encode_names(const SavedParam *ps, int n, int64_t *len) {
  StrBuf b = {0};
  for (int i = 0; i < n; i++) { sb_puts(&b, ps[i].name); sb_putc(&b, '\n'); }
  double *v = ts_xmalloc((b.n ? b.n : 1) * sizeof *v);
  for (size_t i = 0; i < b.n; i++) v[i] = (unsigned char)b.p[i];
  *len = (int64_t)b.n;
  sb_free(&b);
  return v;
}

/* Does list l (doubles, "a\nb\n", length n) hold name? */
static int list_has(const double *l, int64_t n, const char *name) {
  size_t k = strlen(name);
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && l[j] != '\n') j++;
    if ((size_t)(j - i) == k) {
      size_t c = 0;
      while (c < k && l[i + (int64_t)c] == (unsigned char)name[c]) c++;
      if (c == k) return 1;
    }
    i = j + 1;
  }
  return 0;
}

/* The name at position *pos of list l (advanced past it), malloc'd. */
static char *list_next(const double *l, int64_t n, int64_t *pos) {
  int64_t i = *pos, j = i;
  while (j < n && l[j] != '\n') j++;
  char *s = ts_xmalloc((size_t)(j - i) + 1);
  for (int64_t c = i; c < j; c++) s[c - i] = (char)l[c];
  s[j - i] = 0;
  *pos = j + 1;
  return s;
}

/* Collective over the pp group g (the members described above): appends
 * to *ps (n entries, capacity grown) on coordinate 0 what it lacks. */
static int pipe_collect(RtComm *g, SavedParam **ps, int *n, char *err, size_t errlen) {
  int P = rt_comm_size(g), me = rt_comm_rank(g);
  int64_t mylen;
  double *mine = encode_names(*ps, *n, &mylen);
  double *lens = ts_xmalloc((size_t)P * sizeof *lens), len1 = (double)mylen;
  int rc = rt_comm_all_gather(g, IR_F64, &len1, lens, 1, err, errlen);
  int64_t maxlen = 1;
  for (int q = 0; rc == 0 && q < P; q++) if ((int64_t)lens[q] > maxlen) maxlen = (int64_t)lens[q];
  double *pad = ts_xcalloc((size_t)maxlen, sizeof *pad), *all = ts_xmalloc((size_t)(maxlen * P) * sizeof *all);
  memcpy(pad, mine, (size_t)mylen * sizeof *pad);
  if (rc == 0) rc = rt_comm_all_gather(g, IR_F64, pad, all, (size_t)maxlen, err, errlen);
  /* list q is all + q * maxlen, lens[q] long; walk every q > 0's list in order */
  for (int q = 1; rc == 0 && q < P; q++) {
    const double *lq = all + (int64_t)q * maxlen;
    int64_t nq = (int64_t)lens[q];
    for (int64_t pos = 0; rc == 0 && pos < nq;) {
      char *name = list_next(lq, nq, &pos);
      int lower = 0;
      for (int o = 0; o < q && !lower; o++) lower = list_has(all + (int64_t)o * maxlen, (int64_t)lens[o], name);
      if (lower) { free(name); continue; }   /* a lower coordinate sends it (or 0 has it) */
      double hdr[PARAM_HDR];
      if (me == q) {
        const SavedParam *sp = NULL;
        for (int i = 0; i < *n && !sp; i++) if (strcmp((*ps)[i].name, name) == 0) sp = &(*ps)[i];
        TS_ASSERT(sp);
        memset(hdr, 0, sizeof hdr);
        hdr[0] = sp->dtype;
        hdr[1] = sp->lt.rank;
        for (int d = 0; d < sp->lt.rank; d++) hdr[2 + d] = (double)sp->lt.dim[d];
        rc = rt_comm_send(g, IR_F64, hdr, PARAM_HDR, 0, PARAM_TAG, err, errlen);
        if (rc == 0)
          rc = rt_comm_send(g, IR_F64, sp->v, (size_t)ir_type_numel(&sp->lt), 0, PARAM_TAG, err, errlen);
      } else if (me == 0) {
        rc = rt_comm_recv(g, IR_F64, hdr, PARAM_HDR, q, PARAM_TAG, err, errlen);
        SavedParam r = {name, 1, (IrDtype)hdr[0], {0}, NULL};
        r.lt.dtype = r.dtype;
        r.lt.rank = (int)hdr[1];
        if (rc == 0 && (r.lt.rank < 0 || r.lt.rank > IR_MAX_RANK || (r.dtype != IR_F32 && r.dtype != IR_F64)))
          rc = ts_errf(err, errlen, "parameter %s from pipeline rank %d: bad header", name, q);  /* internal */
        for (int d = 0; rc == 0 && d < r.lt.rank; d++) r.lt.dim[d] = (int64_t)hdr[2 + d];
        if (rc == 0) {
          int64_t ne = ir_type_numel(&r.lt);
          r.v = ts_xmalloc((size_t)(ne ? ne : 1) * sizeof *r.v);
          rc = rt_comm_recv(g, IR_F64, r.v, (size_t)ne, q, PARAM_TAG, err, errlen);
          *ps = ts_xrealloc(*ps, (size_t)(*n + 1) * sizeof **ps);
          (*ps)[(*n)++] = r;
          name = NULL;   /* owned by the entry now */
        }
      }
      free(name);
    }
  }
  free(mine);
  free(lens);
  free(pad);
  free(all);
  return rc;
}

RtParams *rt_params_collect(RtProgram *p, RtComm *world, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  if (rt_program_sync_states(p, err, errlen) != 0) return NULL;   /* a device program's states */
  int me = world ? rt_comm_rank(world) : 0;
  const IrState **st = ts_xmalloc((size_t)(m->states.n ? m->states.n : 1) * sizeof *st);
  int np = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) st[np++] = &m->states.a[i];
  /* Gathered in name order on every rank: the gathers are collectives, and
   * every rank of a tp (cp, ep) group holds the same parameters. */
  qsort(st, (size_t)np, sizeof *st, by_name);
  int pp = rt_program_axis_size(p, IR_AXIS_PP);
  const int *coord = rt_program_rank(p)->coord;
  int in_root_pp = 1;   /* in world rank 0's pp group: every coordinate but pp is 0 */
  for (int a = 0; a < IR_AXIS_COUNT; a++) if (a != IR_AXIS_PP && coord[a] != 0) in_root_pp = 0;
  int keep = me == 0 || (pp > 1 && in_root_pp);   /* needs the values after gathering */
  SavedParam *ps = ts_xcalloc((size_t)(np ? np : 1), sizeof *ps);
  int n = 0, rc = 0;
  for (int i = 0; i < np && rc == 0; i++) {
    const IrState *s = st[i];
    if (!ir_dtype_is_float(s->type.dtype)) {
      rc = ts_errf(err, errlen, "parameter @%s is %s, not a float tensor", s->name, ir_dtype_name(s->type.dtype));
      break;
    }
    IrType gt;
    void *full = gather_param(p, s, &gt, err, errlen);
    if (!full) { rc = -1; break; }
    if (keep) {
      ps[n] = (SavedParam){s->name, 0, s->type.dtype, {0}, NULL};
      ps[n].v = strip_padding(full, &gt, s, &ps[n].lt);
      n++;
    }
    free(full);
  }
  if (rc == 0 && pp > 1 && in_root_pp) {
    RtComm *g = rt_program_group(p, IR_AXIS_PP);
    if (!g) rc = ts_errf(err, errlen, "pp=%d but this rank has no pp group", pp);  /* internal */
    else rc = pipe_collect(g, &ps, &n, err, errlen);
  }
  RtParams *out = rc == 0 ? ts_xcalloc(1, sizeof *out) : NULL;
  if (out && me == 0) {   /* every parameter, by name */
    qsort(ps, (size_t)n, sizeof *ps, by_saved_name);
    out->a = ts_xcalloc((size_t)(n ? n : 1), sizeof *out->a);
    for (int i = 0; i < n; i++) {
      RtParam *q = &out->a[out->n++];
      q->name = ps[i].owned ? (char *)ps[i].name : ts_xstrdup(ps[i].name);
      ps[i].owned = 0;
      q->dtype = ps[i].dtype;
      q->rank = ps[i].lt.rank;
      memcpy(q->dim, ps[i].lt.dim, sizeof q->dim);
      q->numel = ir_type_numel(&ps[i].lt);
      q->data = ps[i].v;
      ps[i].v = NULL;
    }
  }
  for (int i = 0; i < n; i++) {
    if (ps[i].owned) free((char *)ps[i].name);
    free(ps[i].v);
  }
  free(ps);
  free(st);
  return out;
}

int rt_params_save(RtProgram *p, RtComm *world, const char *path, char *err, size_t errlen) {
  RtParams *ps = rt_params_collect(p, world, err, errlen);
  if (!ps) return -1;
  int rc = 0;
  if (!world || rt_comm_rank(world) == 0) {
    StrBuf out = {0};
    sb_write(&out, "TSPARAMS", 8);
    put_u32(&out, 1);
    put_u32(&out, (uint32_t)ps->n);
    for (int i = 0; i < ps->n; i++) {
      const RtParam *q = &ps->a[i];
      put_u32(&out, (uint32_t)strlen(q->name));
      sb_write(&out, q->name, strlen(q->name));
      put_u32(&out, (uint32_t)q->dtype);
      put_u32(&out, (uint32_t)q->rank);
      for (int d = 0; d < q->rank; d++) sb_write(&out, &q->dim[d], 8);
      for (int64_t k = 0; k < q->numel; k++) {
        if (q->dtype == IR_F32) { float f = (float)q->data[k]; sb_write(&out, &f, 4); }
        else sb_write(&out, &q->data[k], 8);
      }
    }
    if (ts_write_file(path, out.p, out.n) != 0)
      rc = ts_errf(err, errlen, "--save-params: %s", ts_io_error());
    sb_free(&out);
  }
  rt_params_free(ps);
  return rc;
}

void rt_params_free(RtParams *ps) {
  if (!ps) return;
  for (int i = 0; i < ps->n; i++) {
    free(ps->a[i].name);
    free(ps->a[i].data);
  }
  free(ps->a);
  free(ps);
}

/* Reads n bytes at *pos of buf[len]; -1 when the file ends first. */
static int take(const char *buf, size_t len, size_t *pos, void *dst, size_t n) {
  if (n > len - *pos) return -1;
  memcpy(dst, buf + *pos, n);
  *pos += n;
  return 0;
}

RtParams *rt_params_read(const char *path, char *err, size_t errlen) {
  size_t len = 0, pos = 0;
  char *buf = ts_read_input(path, &len);
  if (!buf) { ts_errf(err, errlen, "cannot read %s: %s", path, strerror(errno)); return NULL; }
  RtParams *ps = ts_xcalloc(1, sizeof *ps);
  char magic[8];
  uint32_t ver = 0, cnt = 0;
  if (take(buf, len, &pos, magic, 8) || memcmp(magic, "TSPARAMS", 8) || take(buf, len, &pos, &ver, 4) ||
      take(buf, len, &pos, &cnt, 4)) {
    ts_errf(err, errlen, "%s is not a parameter file (from mrun --save-params)", path);
    goto fail;
  }
  if (ver != 1) { ts_errf(err, errlen, "%s: parameter file version %u, this build reads 1", path, ver); goto fail; }
  if (cnt > len) { ts_errf(err, errlen, "%s: truncated", path); goto fail; }
  ps->a = ts_xcalloc(cnt ? cnt : 1, sizeof *ps->a);
  for (uint32_t i = 0; i < cnt; i++) {
    RtParam *q = &ps->a[i];
    uint32_t nl, dt, rk;
    if (take(buf, len, &pos, &nl, 4) || nl > len - pos) goto trunc;
    q->name = ts_xmalloc(nl + 1);
    ps->n = (int)i + 1;
    take(buf, len, &pos, q->name, nl);
    q->name[nl] = 0;
    if (take(buf, len, &pos, &dt, 4) || take(buf, len, &pos, &rk, 4)) goto trunc;
    if ((dt != IR_F32 && dt != IR_F64) || rk > IR_MAX_RANK) {
      ts_errf(err, errlen, "%s: parameter %s has a bad dtype or rank", path, q->name);
      goto fail;
    }
    q->dtype = (IrDtype)dt;
    q->rank = (int)rk;
    q->numel = 1;
    for (uint32_t d = 0; d < rk; d++) {
      if (take(buf, len, &pos, &q->dim[d], 8) || q->dim[d] < 0) goto trunc;
      if (q->dim[d] && q->numel > (int64_t)len / q->dim[d]) goto trunc;
      q->numel *= q->dim[d];
    }
    size_t es = ir_dtype_size(q->dtype);
    if ((size_t)q->numel > (len - pos) / es) goto trunc;
    q->data = to_double(buf + pos, q->dtype, q->numel);
    pos += (size_t)q->numel * es;
  }
  free(buf);
  return ps;
trunc:
  ts_errf(err, errlen, "%s: truncated", path);
fail:
  free(buf);
  rt_params_free(ps);
  return NULL;
}

double rt_params_max_rel_diff(const RtParams *a, const RtParams *b, char *where, size_t n) {
  if (a->n != b->n) { snprintf(where, n, "%d parameters vs %d", a->n, b->n); return -1; }
  double worst = 0, model = 0;
  int wi = -1;
  snprintf(where, n, "(no parameters)");
  for (int i = 0; i < b->n; i++)
    for (int64_t k = 0; k < b->a[i].numel; k++) model = fmax(model, fabs(b->a[i].data[k]));
  for (int i = 0; i < a->n; i++) {
    const RtParam *x = &a->a[i], *y = &b->a[i];
    int same = strcmp(x->name, y->name) == 0 && x->rank == y->rank;
    for (int d = 0; same && d < x->rank; d++) same = x->dim[d] == y->dim[d];
    if (!same) { snprintf(where, n, "parameter %s vs %s: different names or shapes", x->name, y->name); return -1; }
    /* tensor-wise: the largest difference over the tensor's largest entry,
     * that scale floored at 10% of the model's largest parameter entry */
    double dmax = 0, bmax = 0;
    for (int64_t k = 0; k < x->numel; k++) {
      double d = fabs(x->data[k] - y->data[k]);
      if (!isnan(dmax) && !(d <= dmax)) dmax = d;   /* a NaN wins and stays */
      bmax = fmax(bmax, fabs(y->data[k]));
    }
    double scale = fmax(bmax, 0.1 * model);
    double r = isnan(dmax) ? dmax : dmax / (scale > 0 ? scale : 1);
    if (wi < 0 || r > worst || (isnan(r) && !isnan(worst))) {
      worst = r;
      wi = i;
      snprintf(where, n, "%s", x->name);
    }
  }
  return worst;
}
