/* equiv.h - what the equivalence programs share (tests/shard/shard_equiv.c,
 * tests/attn/packed_equiv.c, variant_equiv.c): compiling a model in f64 for a layout, the
 * rank's mesh groups, and comparing every gradient state of a sharded
 * program with the same state of an unsharded one.  Header-only and
 * static: include it from one file of a test program. */
#ifndef TESTS_EQUIV_H
#define TESTS_EQUIV_H
#include "frontend/mdl.h"
#include "passes/passes.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/rt.h"
#include <math.h>

/* The model in FILE through the whole pass pipeline at tp / sp / cp / ep,
 * f64; NULL after printing why (prog names the program). */
/* How the fused attention runs under cp (PassCpAttn); a test may set it. */
static int equiv_cp_attn = PASS_CP_ATTN_RING;

static IrModule *equiv_compile(const char *prog, const char *file, int tp, int sp, int cp, int ep,
                               const MdlDefine *defs, int nd) {
  MdlOptions opt;
  mdl_options_init(&opt);
  opt.defines = defs;
  opt.ndefines = nd;
  opt.tp = tp;
  opt.sp = sp;
  opt.cp = cp;
  opt.ep = ep;
  opt.precision = IR_F64;
  IrModule *m = mdl_compile_file(file, &opt);
  if (!m) return NULL;
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.cp_attn = equiv_cp_attn;
  if (pass_run_pipeline(m, &cx)) {
    fprintf(stderr, "%s: tp=%d sp=%d cp=%d ep=%d: %s\n", prog, tp, sp, cp, ep, cx.err);
    ir_module_free(m);
    m = NULL;
  }
  pass_ctx_free(&cx);
  return m;
}

/* World rank me's place in mesh (tp x cp x ep, pp = dp = 1) with its tp, cp
 * and ep groups; -1 with err. */
static int equiv_rank(RtComm *w, PlanMesh mesh, int me, RtRank *rk, char *err, size_t errlen) {
  *rk = rt_rank_single();
  rk->mesh = mesh;
  rt_mesh_coords(&mesh, me, rk->coord);
  rk->group[IR_AXIS_TP] = rt_comm_mesh_group(w, &mesh, RT_AXIS_TP, err, errlen);
  rk->group[IR_AXIS_CP] = rk->group[IR_AXIS_TP] ? rt_comm_mesh_group(w, &mesh, RT_AXIS_CP, err, errlen) : NULL;
  rk->group[IR_AXIS_EP] = rk->group[IR_AXIS_CP] ? rt_comm_mesh_group(w, &mesh, RT_AXIS_EP, err, errlen) : NULL;
  return rk->group[IR_AXIS_EP] ? 0 : -1;
}

static void equiv_rank_free(RtRank *rk) {
  rt_comm_free(rk->group[IR_AXIS_TP]);
  rt_comm_free(rk->group[IR_AXIS_CP]);
  rt_comm_free(rk->group[IR_AXIS_EP]);
}

/* Worst relative error of sharded gradient state s (rank-local data d)
 * against the unsharded state data `ref` of type rt, relative to ref's
 * largest entry with a floor (floor_: a gradient that is zero in exact
 * arithmetic, such as an attention key bias's, holds only rounding);
 * *nonzero_pad is set when an entry past rt's size (padding) is not 0. */
static double equiv_block_err(const IrState *s, const double *d, const IrType *rt, const double *ref, const RtRank *rk,
                              double floor_, int *nonzero_pad) {
  const IrType *lt = &s->type;
  double scale = floor_, worst = 0;
  for (int64_t i = 0; i < ir_type_numel(rt); i++) scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < ir_type_numel(lt); i++) {
    int64_t rem = i, g[IR_MAX_RANK], flat = 0;
    for (int k = lt->rank - 1; k >= 0; k--) { g[k] = rem % lt->dim[k]; rem /= lt->dim[k]; }
    int pad = 0;
    for (int k = 0; k < lt->rank; k++) {
      /* the global index as the runtime lays the dim out (blocks, outer
       * axes major; the zigzag at the cp level) */
      g[k] = rt_global_index(rk, s->sh.split[k], lt->dim[k], g[k]);
      pad |= g[k] >= rt->dim[k];
      flat = flat * rt->dim[k] + (pad ? 0 : g[k]);
    }
    if (pad) { if (d[i] != 0) *nonzero_pad = 1; continue; }
    worst = fmax(worst, fabs(d[i] - ref[flat]) / scale);
  }
  return worst;
}

/* Every gradient state of the sharded program ps (module shd) against the
 * same state of the unsharded pr (module ref): partial sums over tp / cp /
 * ep all-reduced first; the floor is 1e-6 x the largest unsharded gradient
 * entry.  Each state over tol (or with non-zero padding) is printed (unless
 * quiet; me: the world rank printed) and counted in the result; *worst
 * and *worst_name get the largest error.  -1 when a collective fails (err). */
static int equiv_grads(const IrModule *ref, RtProgram *pr, const IrModule *shd, RtProgram *ps, const RtRank *rk,
                       int me, double tol, int quiet, double *worst, const char **worst_name, char *err,
                       size_t errlen) {
  int fails = 0;
  double gmax = 0;
  *worst = 0;
  *worst_name = "";
  for (int s = 0; s < ref->states.n; s++) {
    if (ref->states.a[s].kind != IR_STATE_GRAD) continue;
    const double *d = rt_state_data(pr, s);
    for (int64_t i = 0; i < ir_type_numel(&ref->states.a[s].type); i++) gmax = fmax(gmax, fabs(d[i]));
  }
  for (int s = 0; s < shd->states.n; s++) {
    const IrState *st = &shd->states.a[s];
    if (st->kind != IR_STATE_GRAD) continue;
    int r = ir_state_find(ref, st->name);
    if (r < 0) { fprintf(stderr, "@%s missing from the unsharded module\n", st->name); fails++; continue; }
    int64_t n = ir_type_numel(&st->type);
    double *d = ts_xcalloc((size_t)n + 1, sizeof *d);
    memcpy(d, rt_state_data(ps, s), (size_t)n * sizeof *d);
    for (int a = IR_AXIS_CP; a <= IR_AXIS_TP; a++)
      if (st->sh.partial & (1u << a) && rt_comm_all_reduce(rk->group[a], IR_F64, d, (size_t)n, err, errlen)) {
        free(d);
        return -1;
      }
    int nzpad = 0;
    double e = equiv_block_err(st, d, &ref->states.a[r].type, rt_state_data(pr, r), rk, 1e-6 * gmax, &nzpad);
    free(d);
    if (nzpad) { fprintf(stderr, "rank %d: @%s has non-zero padding\n", me, st->name); fails++; }
    if (!(e <= tol)) {
      if (!quiet) fprintf(stderr, "rank %d: @%s rel err %.3g\n", me, st->name, e);
      fails++;
    }
    if (e >= *worst) { *worst = e; *worst_name = st->name; }
  }
  return fails;
}

/* The input node `name` of module m's micro block (NULL: none). */
__attribute__((unused)) static const IrNode *equiv_input_node(const IrModule *m, const char *name) {
  const IrBlock *b = &m->blocks.a[ir_block_find(m, "micro")];
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_INPUT && strcmp(b->nodes[i].sa, name) == 0) return &b->nodes[i];
  return NULL;
}

/* This rank's block of the global [rows, T] input g, as the sharded
 * module splits that input (the runtime's own local -> global map). */
__attribute__((unused)) static int32_t *equiv_local_block(const RtProgram *p, const IrNode *in, int64_t T, const int32_t *g) {
  const IrType *lt = &in->type;
  int64_t n = ir_type_numel(lt);
  int32_t *l = ts_xcalloc((size_t)n + 1, sizeof *l);
  for (int64_t e = 0; e < n; e++) {
    int64_t r = e / lt->dim[1], c = e % lt->dim[1];
    int64_t gr = rt_global_index(rt_program_rank(p), in->sh.split[0], lt->dim[0], r);
    int64_t gc = rt_global_index(rt_program_rank(p), in->sh.split[1], lt->dim[1], c);
    l[e] = g[gr * T + gc];
  }
  return l;
}

/* The run and the verdict of an equivalence program (tests/attn): block
 * micro of the reference pr (module ref, feeds rf) and of the sharded ps
 * (module shd, feeds pf), the loss and every gradient compared within tol
 * (lref / lshd name the two in the loss line), then the programs, modules
 * and rk freed and the failures summed over w (freed too).  brk: the
 * comparison must fail (a test that shows the check can).  The exit
 * status of the program. */
__attribute__((unused)) static int equiv_run_compare(const char *prog, RtComm *w, int me, const char *lref,
                                                     const char *lshd, IrModule *ref, RtProgram *pr, const RtFeed *rf,
                                                     IrModule *shd, RtProgram *ps, const RtFeed *pf, int nfeeds,
                                                     RtRank *rk, double tol, int brk) {
  char err[1024];
  RtRunInfo info = {0, 0, 1e-3, 0};
  if (rt_run_block(pr, ir_block_find(ref, "micro"), rf, nfeeds, &info, err, sizeof err) ||
      rt_run_block(ps, ir_block_find(shd, "micro"), pf, nfeeds, &info, err, sizeof err)) {
    fprintf(stderr, "%s: %s\n", prog, err);
    return 1;
  }
  int fails = 0;
  double lr_, ls_;
  rt_output(pr, "loss", &lr_);
  rt_output(ps, "loss", &ls_);
  double le = fabs(lr_ - ls_) / fmax(fabs(lr_), 1e-300);
  if (me == 0) printf("loss: %s %.17g, %s %.17g, rel err %.3g\n", lref, lr_, lshd, ls_, le);
  if (!(le <= tol)) fails++;
  double worst;
  const char *worst_name;
  int gf = equiv_grads(ref, pr, shd, ps, rk, me, tol, brk, &worst, &worst_name, err, sizeof err);
  if (gf < 0) {
    fprintf(stderr, "%s: %s\n", prog, err);
    return 1;
  }
  fails += gf;
  printf("rank %d: worst gradient rel err %.3g (@%s)\n", me, worst, worst_name);
  rt_program_free(ps);
  rt_program_free(pr);
  ir_module_free(ref);
  ir_module_free(shd);
  equiv_rank_free(rk);
  double f = fails;
  rt_comm_all_reduce(w, IR_F64, &f, 1, err, sizeof err);
  rt_comm_free(w);
  int bad = f > 0;
  if (me == 0) printf("%s\n", brk ? (bad ? "ok: --break was caught" : "FAILED: --break went unnoticed")
                                  : (bad ? "FAILED" : "ok"));
  return brk ? !bad : bad;
}

#endif
