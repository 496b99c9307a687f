/* params.c - parameter files (mrun --save-params): every parameter of a
 * (possibly sharded) run gathered to world rank 0 in its GLOBAL logical
 * shape and written in one file (format in train.h), read back, and
 * compared.  This is how a sharded run is checked against the single-rank
 * run: same names, same shapes, same numbers up to rounding.
 *
 * Gathering: a parameter split along dim d by axes a1 (outer) .. ak (inner)
 * holds block b = (c_a1 * S_a2 + c_a2) ... of d.  All-gathering along d
 * over the INNERMOST axis first, then outward, concatenates the blocks in
 * exactly that order.  Every rank takes part (the gathers are collectives)
 * and ends with the whole tensor; only world rank 0 writes. */
#include "train.h"
#include "rt_priv.h"
#include "comm.h"
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
  memcpy(cur, rt_state_data(p, (int)(s - rt_program_module(p)->states.a)), (size_t)ir_type_numel(t) * es);
  for (int a = IR_AXIS_COUNT - 1; a >= 0; a--) {   /* innermost axis first */
    int size = rt_program_axis_size(p, (IrAxis)a);
    for (int d = 0; d < t->rank; d++) {
      if (!(s->sh.split[d] & (1u << a)) || size == 1) continue;
      RtComm *g = rt_program_group(p, (IrAxis)a);
      if (!g) {
        free(cur);
        ts_errf(err, errlen, "@%s is split over %s but this rank has no %s group", s->name,
                ir_axis_name((IrAxis)a), ir_axis_name((IrAxis)a));
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

int rt_params_save(RtProgram *p, RtComm *world, const char *path, char *err, size_t errlen) {
  const IrModule *m = rt_program_module(p);
  int me = world ? rt_comm_rank(world) : 0;
  if (rt_program_axis_size(p, IR_AXIS_PP) > 1)
    return ts_errf(err, errlen, "--save-params does not support pipeline parallelism yet (pp=%d)",
                   rt_program_axis_size(p, IR_AXIS_PP));
  const IrState **ps = ts_xmalloc((size_t)(m->states.n ? m->states.n : 1) * sizeof *ps);
  int np = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) ps[np++] = &m->states.a[i];
  qsort(ps, (size_t)np, sizeof *ps, by_name);
  StrBuf out = {0};
  sb_write(&out, "TSPARAMS", 8);
  put_u32(&out, 1);
  put_u32(&out, (uint32_t)np);
  int rc = 0;
  for (int i = 0; i < np && rc == 0; i++) {
    const IrState *s = ps[i];
    if (!ir_dtype_is_float(s->type.dtype)) {
      rc = ts_errf(err, errlen, "parameter @%s is %s, not a float tensor", s->name, ir_dtype_name(s->type.dtype));
      break;
    }
    IrType gt, lt;
    void *full = gather_param(p, s, &gt, err, errlen);
    if (!full) { rc = -1; break; }
    if (me == 0) {
      double *v = strip_padding(full, &gt, s, &lt);
      int64_t n = ir_type_numel(&lt);
      put_u32(&out, (uint32_t)strlen(s->name));
      sb_write(&out, s->name, strlen(s->name));
      put_u32(&out, (uint32_t)s->type.dtype);
      put_u32(&out, (uint32_t)lt.rank);
      for (int d = 0; d < lt.rank; d++) sb_write(&out, &lt.dim[d], 8);
      for (int64_t k = 0; k < n; k++) {
        if (s->type.dtype == IR_F32) { float f = (float)v[k]; sb_write(&out, &f, 4); }
        else sb_write(&out, &v[k], 8);
      }
      free(v);
    }
    free(full);
  }
  if (rc == 0 && me == 0 && ts_write_file_atomic(path, out.p, out.n) != 0)
    rc = ts_errf(err, errlen, "cannot write %s: %s", path, strerror(errno));
  sb_free(&out);
  free(ps);
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
  char *buf = ts_read_file(path, &len);
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
