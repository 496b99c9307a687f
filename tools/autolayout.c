/* autolayout.c - `mcc --auto-layout` (autolayout.h): stage A costs every
 * layout from one short compiled copy per intra-layer layout, stage B
 * compiles the best whole and ranks them on the exact prediction.
 *
 * Units, as the pipeline partition has them (passes/pipe.h): E (before
 * the repeat stack), one layer of the stack, L (after it).  The short copy
 * has 5 layers in 4 chunks of 1, 1, 2, 1 layers, so chunk 1 is one layer
 * alone, chunk 0 is E + a layer, chunk 3 a layer + L and chunk 2 shows how
 * a chunk's arena grows per layer. */
#include "autolayout.h"
#include "passes/pipe.h"
#include "passes/timereport.h"
#include <math.h>

enum { U_E, U_LAYER, U_L, U_COUNT };

/* What a short copy of one intra-layer layout says, per unit, at its
 * micro batch mb and data-parallel size dp. */
typedef struct {
  int mb, dp;
  double fwd[U_COUNT], bwd[U_COUNT];   /* s per micro batch, pipeline messages excluded */
  double send_f, send_b;     /* s per micro batch and chunk boundary: the activation / its gradient */
  double upd[U_COUNT];       /* s per step, the update block's kernels (its dp collectives excluded) */
  double par[U_COUNT], grad[U_COUNT], opt[U_COUNT];   /* bytes (opt: at this dp) */
  double stash[U_COUNT];     /* bytes one micro batch keeps for its backward */
  double arena0, arena_mid, arena_last, arena_slope;  /* chunk arenas: E + 1 layer, 1 layer, 1 layer + L; per layer */
} UnitFig;

/* Two copies of an intra-layer layout: a at the model's micro batch and
 * dp = 1, b at another micro batch and dp = 2 where the batch allows
 * (else b = a).  A whole layout's figures are interpolated between them:
 * per micro batch affine in the micro batch (small GEMMs are less
 * efficient; fixed costs per kernel), the update affine in 1 / dp (ZeRO
 * shards AdamW, not the flattening and padding around it). */
typedef struct {
  AlLayout key;              /* tp, sp, cp, ep, recompute (the rest unset) */
  UnitFig a, b;
  int flat;                  /* the copies could not be pipelined (a layout the compiler refuses with
                                pp > 1): two unpipelined copies of 1 and 2 layers; pp = 1 only */
} KeyCost;

typedef struct {
  AlLayout l;
  const KeyCost *k;
  double step, memory, bubble;
  int fits;
} Cand;

const char *al_layout_str(const AlLayout *l, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "tp=%d%s", l->tp, l->sp ? " sp" : "");
  if (l->cp > 1 && k < n)
    k += (size_t)snprintf(buf + k, n - k, " cp=%d%s", l->cp, l->cp_attn == PASS_CP_ATTN_A2A ? " a2a"
                                                          : l->cp_attn == PASS_CP_ATTN_ALLGATHER ? " allgather" : "");
  if (l->ep > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " ep=%d", l->ep);
  if (k < n) k += (size_t)snprintf(buf + k, n - k, " pp=%d", l->pp);
  if (l->pp > 1 && l->vpp > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " vpp=%d", l->vpp);
  if (l->pp > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " %s", plan_pipe_sched_name(l->sched));
  if (k < n) k += (size_t)snprintf(buf + k, n - k, " dp=%d%s mb=%d", l->dp, l->dp > 1 && !l->zero ? " no-zero" : "", l->mb);
  if (k < n) snprintf(buf + k, n - k, " recompute=%s", pass_recompute_name(l->recompute));
  return buf;
}

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

/* ---- stage A: the short copy ---- */

static size_t stash_bytes(const IrBlock *b) {
  size_t s = 0;
  for (int i = 0; i < b->n; i++)
    if (b->nodes[i].op == IR_OP_STASH && b->nodes[i].nin == 1) {
      const IrType *t = &b->nodes[b->nodes[i].in[0]].type;
      s += (size_t)ir_type_numel(t) * ir_dtype_size(t->dtype);
    }
  return s;
}

/* One pipeline rank's program of the copy: its chunk's times and bytes. */
typedef struct { double f, b, sf, sb, upd, par, grad, opt, stash, arena; } RankFig;

static int rank_figures(const IrModule *rm, const HwDesc *hw, RankFig *o, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  HwFormat fmt = hw_format_of(ir_train_dtype(&rm->train), 0);
  for (int i = 0; i < rm->blocks.n; i++) {
    const IrBlock *b = &rm->blocks.a[i];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind);
    TimeCost tc = {0};
    if (g >= 0 && kind != IR_CHUNK_EVAL) {
      pass_time_block(rm, b, hw, fmt, &tc);
      double pp = tc.comm[IR_AXIS_PP], t = time_cost_total(&tc) - pp;
      if (kind == IR_CHUNK_FWD) { o->f += t; o->sf += pp; o->stash += (double)stash_bytes(b); }
      else { o->b += t; o->sb += pp; }
    } else if (!strcmp(b->name, "update")) {
      pass_time_block(rm, b, hw, fmt, &tc);
      o->upd += time_cost_total(&tc) - tc.comm[IR_AXIS_DP];
    }
  }
  /* the fusion groups' own positions (plan_mem_group_at), not the
   * runtime's, which lowers every kernel: an estimate needs no more */
  MemTotals mt;
  if (pass_memplan_totals(rm, NULL, NULL, &mt, err, errlen) != 0) return -1;
  o->par = (double)mt.params;
  o->grad = (double)mt.grads;
  o->opt = (double)mt.opt;
  o->arena = (double)mt.arena;
  return 0;
}

static double pos(double x) { return x > 0 ? x : 0; }

/* Compiles the copy of layout l (tp, sp, cp, ep, recompute) at micro batch
 * mb and dp and fills u.  0, or -1 with the compiler's reason. */
static int copy_figures(const IrModule *f, const char *stack, const AlCompiler *c, const HwDesc *hw, AlLayout l,
                        int mb, int dp, UnitFig *u, char *err, size_t errlen) {
  static const int layers[4] = {1, 1, 2, 1};
  l.pp = 4;
  l.vpp = 1;
  l.dp = dp;
  l.zero = 1;
  l.mb = mb;
  int64_t nmicro = f->train.global_batch / ((int64_t)mb * dp);
  l.sched = nmicro >= 4 ? PIPE_1F1B : PIPE_GPIPE;
  IrModule *m = c->compile(c->ctx, &l, stack, 5, layers, 4, err, errlen);
  if (!m) return -1;
  RankFig r[4];
  int rc = 0;
  for (int i = 0; i < 4 && rc == 0; i++) {
    IrModule *rm = pass_pipeline_rank_module(m, i, err, errlen);
    if (!rm) { rc = -1; break; }
    rc = rank_figures(rm, hw, &r[i], err, errlen);
    ir_module_free(rm);
  }
  ir_module_free(m);
  if (rc != 0) return -1;
  memset(u, 0, sizeof *u);
  u->mb = mb;
  u->dp = dp;
#define UNITS(field, out)                                 \
  do {                                                    \
    out[U_LAYER] = r[1].field;                            \
    out[U_E] = pos(r[0].field - r[1].field);              \
    out[U_L] = pos(r[3].field - r[1].field);              \
  } while (0)
  UNITS(f, u->fwd);
  UNITS(b, u->bwd);
  UNITS(upd, u->upd);
  UNITS(par, u->par);
  UNITS(grad, u->grad);
  UNITS(opt, u->opt);
  UNITS(stash, u->stash);
#undef UNITS
  u->send_f = r[1].sf;
  u->send_b = r[1].sb;
  u->arena0 = r[0].arena;
  u->arena_mid = r[1].arena;
  u->arena_last = r[3].arena;
  u->arena_slope = pos(r[2].arena - r[1].arena);
  if (getenv("TS_AUTOLAYOUT_DEBUG")) {
    char lay[128];
    fprintf(stderr, "autolayout: copy %s:\n", al_layout_str(&l, lay, sizeof lay));  /* not a refusal */
    for (int i = 0; i < 4; i++)
      fprintf(stderr, "  rank %d: f %.4g b %.4g sf %.4g sb %.4g upd %.4g par %.4g stash %.4g arena %.4g\n", i, r[i].f,
              r[i].b, r[i].sf, r[i].sb, r[i].upd, r[i].par, r[i].stash, r[i].arena);
  }
  return 0;
}

/* The same without pipelining, for a layout the compiler pipelines not
 * (e.g. --precision bf16): the copy with 1 and with 2 layers; the layer is
 * their difference, E and L together the rest (in U_E).  Per micro batch
 * the time goes into fwd[] (bwd[] 0), the arena's growth per layer into
 * arena_slope, and the stash stays 0 (an unpipelined micro block keeps it
 * in its arena). */
static int copy_figures_flat(const IrModule *f, const char *stack, const AlCompiler *c, const HwDesc *hw, AlLayout l,
                             int mb, int dp, UnitFig *u, char *err, size_t errlen) {
  l.pp = l.vpp = 1;
  l.dp = dp;
  l.zero = 1;
  l.mb = mb;
  double t[2] = {0, 0}, up[2] = {0, 0}, par[2], grad[2], opt[2], arena[2];
  for (int k = 0; k < 2; k++) {
    IrModule *m = c->compile(c->ctx, &l, stack, k + 1, NULL, 0, err, errlen);
    if (!m) return -1;
    HwFormat fmt = hw_format_of(ir_train_dtype(&m->train), 0);
    for (int i = 0; i < m->blocks.n; i++) {
      const IrBlock *b = &m->blocks.a[i];
      TimeCost tc = {0};
      if (!strcmp(b->name, "micro")) { pass_time_block(m, b, hw, fmt, &tc); t[k] += time_cost_total(&tc); }
      else if (!strcmp(b->name, "update")) {
        pass_time_block(m, b, hw, fmt, &tc);
        up[k] += time_cost_total(&tc) - tc.comm[IR_AXIS_DP];
      }
    }
    MemTotals mt;
    int rc = pass_memplan_totals(m, NULL, NULL, &mt, err, errlen);
    ir_module_free(m);
    if (rc != 0) return -1;
    par[k] = (double)mt.params;
    grad[k] = (double)mt.grads;
    opt[k] = (double)mt.opt;
    arena[k] = (double)mt.arena;
  }
  memset(u, 0, sizeof *u);
  u->mb = mb;
  u->dp = dp;
#define FLAT(out, v) do { out[U_LAYER] = pos(v[1] - v[0]); out[U_E] = pos(v[0] - out[U_LAYER]); } while (0)
  FLAT(u->fwd, t);
  FLAT(u->upd, up);
  FLAT(u->par, par);
  FLAT(u->grad, grad);
  FLAT(u->opt, opt);
#undef FLAT
  u->arena0 = u->arena_mid = u->arena_last = arena[0];
  u->arena_slope = pos(arena[1] - arena[0]);
  return 0;
}

/* Both copies of kc->key. */
static int key_cost(const IrModule *f, const char *stack, const AlCompiler *c, const HwDesc *hw, int fixed_mb,
                    KeyCost *kc, char *err, size_t errlen) {
  int64_t gb = f->train.global_batch, mb0 = f->train.micro_batch;
  char why0[1024];
  kc->flat = 0;
  if (copy_figures(f, stack, c, hw, kc->key, (int)mb0, 1, &kc->a, why0, sizeof why0) != 0) {
    /* not pipelined: the flat copies, or the first refusal */
    if (copy_figures_flat(f, stack, c, hw, kc->key, (int)mb0, 1, &kc->a, err, errlen) != 0) return -1;
    kc->flat = 1;
  }
  /* the second copy: another micro batch at dp 2 if the batch and the
   * layout allow (expert parallelism splits the micro batch), else another
   * micro batch, else dp 2 alone */
  int alt1 = mb0 > 1 ? 1 : 2, alt2 = (int)mb0 * 2;
  const int tries[5][2] = {{alt1, 2}, {alt2, 2}, {alt1, 1}, {alt2, 1}, {(int)mb0, 2}};
  char why[1024];
  kc->b = kc->a;   /* none: proportional to the micro batch, the update 1/dp */
  for (int t = 0; t < 5; t++) {
    int mb = tries[t][0], dp = tries[t][1];
    if ((fixed_mb && mb != mb0) || (mb == mb0 && dp == 1) || mb > gb || gb % mb || (gb / mb) % dp) continue;
    if ((kc->flat ? copy_figures_flat : copy_figures)(f, stack, c, hw, kc->key, mb, dp, &kc->b, why, sizeof why) == 0)
      break;
    kc->b = kc->a;
  }
  return 0;
}

/* v at x, on the line through (xa, va) and (xb, vb); through (xa, va) and
 * the origin when xa == xb (prop: proportional, else constant). */
static double interp(double va, double vb, double xa, double xb, double x, int prop) {
  if (xa == xb) return prop ? (xa > 0 ? va * x / xa : va) : va;
  return pos(va + (vb - va) * (x - xa) / (xb - xa));
}

/* The unit figures of a layout with micro batch mb and data-parallel size dp. */
static void unit_at(const KeyCost *k, int mb, int dp, UnitFig *u) {
  const UnitFig *a = &k->a, *b = &k->b;
  double xa = a->mb, xb = b->mb, x = mb;
  *u = *a;
  u->mb = mb;
  u->dp = dp;
  for (int i = 0; i < U_COUNT; i++) {
    u->fwd[i] = interp(a->fwd[i], b->fwd[i], xa, xb, x, 1);
    u->bwd[i] = interp(a->bwd[i], b->bwd[i], xa, xb, x, 1);
    u->stash[i] = interp(a->stash[i], b->stash[i], xa, xb, x, 1);
    /* the update: affine in 1/dp (a at dp 1, b at b->dp); the moments 1/dp (ZeRO) */
    u->upd[i] = b->dp == a->dp ? a->upd[i] / dp : interp(a->upd[i], b->upd[i], 1.0 / a->dp, 1.0 / b->dp, 1.0 / dp, 0);
    u->opt[i] = a->opt[i] / dp;
  }
  u->send_f = interp(a->send_f, b->send_f, xa, xb, x, 1);
  u->send_b = interp(a->send_b, b->send_b, xa, xb, x, 1);
  u->arena0 = interp(a->arena0, b->arena0, xa, xb, x, 1);
  u->arena_mid = interp(a->arena_mid, b->arena_mid, xa, xb, x, 1);
  u->arena_last = interp(a->arena_last, b->arena_last, xa, xb, x, 1);
  u->arena_slope = interp(a->arena_slope, b->arena_slope, xa, xb, x, 1);
}

/* ---- stage A: a whole layout from its key's figures ---- */

/* Layers per chunk: as even as the units' costs allow, E on chunk 0 and L
 * on the last (the partition pass balances the same way). */
static void split_layers(int L, int nch, double e, double h, int *n) {
  if (nch == 1) { n[0] = L; return; }
  double target = (L + e + h) / nch;
  int left = L;
  n[0] = (int)lround(target - e);
  n[nch - 1] = (int)lround(target - h);
  if (n[0] < 0) n[0] = 0;
  if (n[nch - 1] < 0) n[nch - 1] = 0;
  if (n[0] + n[nch - 1] > L) { n[0] = L / 2; n[nch - 1] = L - L / 2; }
  left -= n[0] + n[nch - 1];
  int mid = nch - 2;
  for (int g = 1; g < nch - 1; g++) n[g] = left / mid + (g - 1 < left % mid ? 1 : 0);
  if (mid == 0) n[0] += left;   /* two chunks: nothing in between */
}

typedef struct { double f, b, par, grad, opt, upd, stash, arena; } ChunkFig;

static void chunk_fig(const UnitFig *u, int g, int nch, int n, ChunkFig *c) {
  int first = g == 0, last = g == nch - 1;
#define SUM(arr) ((double)n * u->arr[U_LAYER] + (first ? u->arr[U_E] : 0) + (last ? u->arr[U_L] : 0))
  c->f = SUM(fwd) + (nch > 1 ? u->send_f : 0);
  c->b = SUM(bwd) + (nch > 1 ? u->send_b : 0);
  c->par = SUM(par);
  c->grad = SUM(grad);
  c->opt = SUM(opt);
  c->upd = SUM(upd);
  c->stash = SUM(stash);
#undef SUM
  double a = first ? u->arena0 : last ? u->arena_last : u->arena_mid;
  c->arena = pos(a + (double)(n - 1) * u->arena_slope);
}

/* Stage A's step time and memory of c.l.  0; 1 when even its busiest
 * rank's compute alone (no bubble) takes longer than `cutoff` seconds (not
 * simulated: it cannot be among the best); -1 when the schedule cannot
 * run (the message is not kept: the layout is just not a candidate). */
static int estimate(const IrModule *f, const HwDesc *hw, int L, double cutoff, Cand *cd) {
  const AlLayout *l = &cd->l;
  UnitFig u;
  unit_at(cd->k, l->mb, l->zero ? l->dp : 1, &u);
  int nch = l->pp * l->vpp, *n = ts_xcalloc((size_t)nch, sizeof *n);
  int nmicro = (int)(f->train.global_batch / ((int64_t)l->mb * l->dp));
  double ul = u.fwd[U_LAYER] + u.bwd[U_LAYER];
  split_layers(L, nch, ul > 0 ? (u.fwd[U_E] + u.bwd[U_E]) / ul : 0, ul > 0 ? (u.fwd[U_L] + u.bwd[U_L]) / ul : 0, n);
  ChunkFig *cf = ts_xcalloc((size_t)nch, sizeof *cf);
  for (int g = 0; g < nch; g++) chunk_fig(&u, g, nch, n[g], &cf[g]);
  double lb = 0;
  for (int r = 0; r < l->pp; r++) {
    double busy = 0;
    for (int g = r; g < nch; g += l->pp) busy += (double)nmicro * (cf[g].f + cf[g].b) + cf[g].upd;
    if (busy > lb) lb = busy;
  }
  if (lb > cutoff) {
    free(n);
    free(cf);
    return 1;
  }
  double *end = ts_xcalloc((size_t)l->pp, sizeof *end), *idle = ts_xcalloc((size_t)l->pp, sizeof *idle);
  double *stash = ts_xcalloc((size_t)l->pp, sizeof *stash);
  int rc = 0;
  if (l->pp == 1) {
    end[0] = (double)nmicro * (cf[0].f + cf[0].b);
    stash[0] = cf[0].stash;   /* one micro batch at a time */
  } else {
    PipeSchedule sc;
    PipeTimeline tl;
    char why[256];
    double *fw = ts_xcalloc((size_t)nch, sizeof *fw), *bw = ts_xcalloc((size_t)nch, sizeof *bw);
    for (int g = 0; g < nch; g++) { fw[g] = cf[g].f; bw[g] = cf[g].b; }
    memset(&sc, 0, sizeof sc);
    rc = plan_pipe_schedule(l->sched, l->pp, l->vpp, nmicro, &sc, why, sizeof why);
    if (rc == 0) rc = plan_pipe_simulate_fb(&sc, fw, bw, 2, &tl, why, sizeof why);
    if (rc == 0) {
      for (int r = 0; r < l->pp; r++) {
        for (int i = 0; i < tl.nsteps[r]; i++) if (tl.end[r][i] > end[r]) end[r] = tl.end[r][i];
        idle[r] = end[r] - tl.busy[r];
        double held = 0;
        for (int i = 0; i < sc.nsteps[r]; i++) {
          const PipeStep *st = &sc.steps[r][i];
          held += st->kind == 'F' ? cf[st->chunk].stash : -cf[st->chunk].stash;
          if (held > stash[r]) stash[r] = held;
        }
      }
      plan_pipe_timeline_free(&tl);
    }
    plan_pipe_schedule_free(&sc);
    free(fw);
    free(bw);
  }
  if (rc == 0) {
    int64_t stride = (int64_t)l->pp * l->cp * l->ep * l->tp;
    HwLink dl = hw_link(hw, l->dp, stride);
    cd->step = cd->memory = cd->bubble = 0;
    for (int r = 0; r < l->pp; r++) {
      double par = 0, grad = 0, opt = 0, upd = 0, arena = 0;
      for (int g = r; g < nch; g += l->pp) {
        par += cf[g].par;
        grad += cf[g].grad;
        opt += cf[g].opt;
        upd += cf[g].upd;
        if (cf[g].arena > arena) arena = cf[g].arena;
      }
      if (l->pp == 1) arena += cf[0].stash;   /* the micro block keeps it in its arena */
      double dpc = l->dp < 2 ? 0
                   : l->zero ? hw_coll_time(&dl, HW_REDUCE_SCATTER, l->dp, grad) + hw_coll_time(&dl, HW_ALL_GATHER, l->dp, par)
                             : hw_coll_time(&dl, HW_ALL_REDUCE, l->dp, grad);
      double t = end[r] + upd + dpc;
      double mem = par + grad + opt + arena + (l->pp > 1 ? stash[r] : 0);
      if (t > cd->step) { cd->step = t; cd->bubble = idle[r]; }
      if (mem > cd->memory) cd->memory = mem;
    }
  }
  free(n);
  free(cf);
  free(end);
  free(idle);
  free(stash);
  return rc;
}

/* ---- stage B: the whole model ---- */

static int exact(const IrModule *f, const AlCompiler *c, const HwDesc *hw, const AlLayout *l, AlResult *res,
                 IrModule **mout, char *err, size_t errlen) {
  IrModule *m = c->compile(c->ctx, l, NULL, -1, NULL, 0, err, errlen);
  if (!m) return -1;
  int np = l->pp > 1 ? l->pp : 1, rc = 0;
  IrModule **progs = ts_xcalloc((size_t)np, sizeof *progs);
  if (l->pp > 1) {
    for (int r = 0; r < np && rc == 0; r++)
      if (!(progs[r] = pass_pipeline_rank_module(m, r, err, errlen))) rc = -1;
  } else {
    progs[0] = m;
  }
  TimePrediction tp;
  double model = pass_time_model_flops(f) * (double)l->mb / (double)f->train.micro_batch;
  if (rc == 0) rc = pass_time_predict(progs, np, hw, model, &tp, err, errlen);
  double mem = 0;
  for (int r = 0; r < np && rc == 0; r++) {
    MemTotals mt;
    rc = pass_memplan_totals(progs[r], NULL, NULL, &mt, err, errlen);
    if (rc == 0 && (double)mt.total > mem) { mem = (double)mt.total; res->fullest = r; }
  }
  if (rc == 0) {
    res->l = *l;
    res->step = tp.step;
    res->tflops = tp.tflops;
    res->mfu = tp.mfu;
    res->bubble = tp.bubble;
    res->memory = mem;
    /* what limits it: the largest of what is not compute */
    const char *what = "compute";
    double worst = 0;
    char axis[48];
    if (tp.bubble > worst) { worst = tp.bubble; what = "the pipeline bubble"; }
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (tp.comm[a] > worst) {
        worst = tp.comm[a];
        snprintf(axis, sizeof axis, "exposed %s communication", ir_axis_name((IrAxis)a));
        what = axis;
      }
    if (tp.optimizer > worst) { worst = tp.optimizer; what = "the optimizer"; }
    /* recomputation's share: what the kernels compute beyond the model's FLOPs */
    double rec = l->recompute != PASS_RECOMPUTE_NONE && tp.hfu > tp.mfu ? tp.step * (1 - tp.mfu / tp.hfu) : 0;
    if (rec > worst) { worst = rec; what = "recomputation"; }
    snprintf(res->limit, sizeof res->limit, "%s %.1f%% of the step; MFU %.1f%%", what,
             tp.step > 0 ? 100 * worst / tp.step : 0, 100 * tp.mfu);
  }
  if (l->pp > 1) {
    for (int r = 0; r < np; r++) ir_module_free(progs[r]);
    if (rc == 0 && mout) *mout = m;
    else ir_module_free(m);
  } else if (rc == 0 && mout) {
    *mout = m;
  } else {
    ir_module_free(m);
  }
  free(progs);
  return rc;
}

/* ---- the search ---- */

/* Parameters of f with a dim that a rule maps to axis a: the axis has
 * something to split. */
static int axis_used(const IrModule *f, IrAxis a) {
  for (int r = 0; r < f->rules.n; r++) {
    if (!(f->rules.a[r].axes & (1u << a))) continue;
    for (int s = 0; s < f->states.n; s++) {
      const IrType *t = &f->states.a[s].type;
      for (int d = 0; d < t->rank; d++)
        if (t->dname[d] && t->dname[d] == f->rules.a[r].dim) return 1;
    }
  }
  return 0;
}

static int cmp_est(const void *x, const void *y) {
  const Cand *a = x, *b = y;
  if (a->fits != b->fits) return b->fits - a->fits;
  return a->step < b->step ? -1 : a->step > b->step;
}
static int cmp_res(const void *x, const void *y) {
  const AlResult *a = x, *b = y;
  return a->step < b->step ? -1 : a->step > b->step;
}

/* A refusal kept for the summary: the first few distinct reasons. */
typedef struct { char text[8][240]; int n, count; } Refusals;
static void refusal(Refusals *r, const AlLayout *l, const char *why) {
  r->count++;
  char lay[128], line[240];
  snprintf(line, sizeof line, "%s: %.*s", al_layout_str(l, lay, sizeof lay), 180, why);
  /* one line per reason: the text after the layout */
  for (int i = 0; i < r->n; i++)
    if (!strcmp(strchr(r->text[i], ':') + 2, strchr(line, ':') + 2)) return;
  if (r->n < 8) snprintf(r->text[r->n++], sizeof r->text[0], "%s", line);
}

int al_search(const IrModule *f, const AlCompiler *c, const AlOptions *o, StrBuf *out, AlResult *best,
              IrModule **winner, char *err, size_t errlen) {
  double t0 = ts_now_s();
  const HwDesc *hw = o->hw;
  int N = o->gpus, top = o->top > 0 ? o->top : 5;
  double limit = o->memory > 0 ? o->memory : hw->hbm_bytes, budget = o->budget_s > 0 ? o->budget_s : 8;
  *winner = NULL;
  PipeOptions po = {1, 1, NULL, 0, NULL, NULL};
  PipePartition part;
  if (pass_pipe_partition(f, &po, &part, err, errlen) != 0) return -1;
  const char *stack = part.stack;
  int L = part.nlayers;
  pass_pipe_partition_free(&part);
  int64_t gb = f->train.global_batch, mb0 = f->train.micro_batch, seq = f->train.seq_len;
  if (gb < 1 || mb0 < 1) return ts_errf(err, errlen, "auto-layout: the train block needs global_batch and micro_batch");  /* internal */

  /* stage A, 1: the intra-layer layouts, one short copy each */
  int use_ep = axis_used(f, IR_AXIS_EP), use_cp = axis_used(f, IR_AXIS_CP) || seq > 0;
  int maxtp = hw->gpus_per_node < N ? hw->gpus_per_node : N;
  VEC(KeyCost) keys = {0};
  Refusals ref = {0};
  int ncopies = 0;
  for (int tp = 1; tp <= maxtp; tp *= 2)
    for (int sp = 0; sp <= (tp > 1); sp++)
      for (int cp = 1; (int64_t)tp * cp <= N && cp <= 16 && (cp == 1 || (use_cp && seq % (2 * cp) == 0)); cp *= 2)
        for (int ep = 1; (int64_t)tp * cp * ep <= N && (ep == 1 || use_ep); ep *= 2) {
          if (N % (tp * cp * ep)) continue;
          /* under cp, the attention's form: ring and all-to-all (the
           * all-gather form sends no less than the ring), or the user's */
          int forms[2] = {PASS_CP_ATTN_RING, PASS_CP_ATTN_A2A}, nforms = cp > 1 ? 2 : 1;
          if (o->cp_attn >= 0) forms[0] = o->cp_attn, nforms = 1;
          for (int fi = 0; fi < nforms; fi++)
            for (int rc = 0; rc < 2; rc++) {
              KeyCost kc;
              memset(&kc, 0, sizeof kc);
              kc.key = (AlLayout){tp, sp, cp, ep, 1, 1, 1, 1, (int)mb0, rc ? PASS_RECOMPUTE_FULL : PASS_RECOMPUTE_NONE,
                                  cp > 1 ? forms[fi] : PASS_CP_ATTN_RING, PIPE_1F1B};
              char why[1024];
              ncopies++;
              if (key_cost(f, stack, c, hw, o->fixed_mb, &kc, why, sizeof why) != 0) {
                refusal(&ref, &kc.key, why);
                break;   /* the same refusal with recompute */
              }
              VEC_PUSH(keys, kc);
            }
        }
  double t_a = ts_now_s() - t0;

  /* stage A, 2: every whole layout of those */
  VEC(Cand) cands = {0};
  double best_fit = INFINITY;   /* the fastest estimate that fits so far */
  int pruned = 0;
  for (int ki = 0; ki < keys.n; ki++) {
    const KeyCost *k = &keys.a[ki];
    int rep = k->key.tp * k->key.cp * k->key.ep;
    for (int pp = 1; pp <= (k->flat ? 1 : L) && (int64_t)rep * pp <= N; pp++) {
      if ((N / rep) % pp) continue;
      int dp = N / rep / pp;
      for (int64_t mb = 1; mb <= gb; mb *= 2) {
        if (o->fixed_mb && mb != mb0) continue;
        if (gb % mb || (gb / mb) % dp) continue;
        int nmicro = (int)(gb / mb / dp);
        for (int vpp = 1; vpp <= 4 && (vpp == 1 || pp > 1); vpp++) {
          if (pp * vpp > L) break;
          PipeSchedKind sched = vpp > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
          if (pp > 1 && vpp == 1 && nmicro < pp) continue;
          if (vpp > 1 && nmicro % pp) continue;
          for (int zero = 1; zero >= (dp > 1 ? 0 : 1); zero--) {   /* ZeRO-1, and without it */
              Cand cd = {{k->key.tp, k->key.sp, k->key.cp, k->key.ep, pp, vpp, dp, zero, (int)mb, k->key.recompute,
                        k->key.cp_attn, sched}, k, 0, 0, 0, 0};
            int e = estimate(f, hw, L, 1.15 * best_fit, &cd);
            if (e > 0) pruned++;
            if (e != 0) continue;
            cd.fits = cd.memory <= limit;
            if (cd.fits && cd.step < best_fit) best_fit = cd.step;
            VEC_PUSH(cands, cd);
          }
        }
        if (mb > 64) break;   /* micro batches beyond 128 sequences do not pay */
      }
    }
  }
  qsort(cands.a, (size_t)cands.n, sizeof *cands.a, cmp_est);
  int nfit = 0;
  for (int i = 0; i < cands.n; i++) nfit += cands.a[i].fits;

  /* stage B: the best, compiled whole, until `top` fit or the budget is spent */
  double t_cost = ts_now_s() - t0 - t_a, t1 = ts_now_s();
  AlResult *res = ts_xcalloc((size_t)top * 3 + 1, sizeof *res);
  IrModule **mods = ts_xcalloc((size_t)top * 3 + 1, sizeof *mods);
  int nres = 0, tried = 0, over = 0;
  for (int i = 0; i < cands.n && nres < top && tried < 3 * top; i++) {
    if (tried >= 1 && ts_now_s() - t1 > budget) break;
    if (!cands.a[i].fits && nres > 0) break;
    char why[1024];
    AlResult r;
    memset(&r, 0, sizeof r);
    tried++;
    IrModule *m = NULL;
    if (exact(f, c, hw, &cands.a[i].l, &r, &m, why, sizeof why) != 0) {
      refusal(&ref, &cands.a[i].l, why);
      continue;
    }
    r.est_step = cands.a[i].step;
    r.est_memory = cands.a[i].memory;
    if (r.memory > limit) { over++; ir_module_free(m); continue; }
    r.index = nres;
    mods[nres] = m;
    res[nres++] = r;
  }
  double t_b = ts_now_s() - t1;
  qsort(res, (size_t)nres, sizeof *res, cmp_res);

  char lay[160];
  sb_printf(out, "auto-layout: %s on %d GPUs of %s (%s), %s training, %.1f GiB per GPU, global batch %lld, "
                 "%d layers in the stack '%s'\n",
            f->name ? f->name : "?", N, hw->name, hw->path, ir_dtype_name(ir_train_dtype(&f->train)), gib(limit),
            (long long)gb, L, stack);
  sb_printf(out, "# stage A: %d intra-layer layouts (tp, sp, cp, ep, recompute) costed from 5-layer copies (two each) in %.2f s, "
                 "%d whole layouts costed from them in %.2f s (%d fit by that estimate; %d more not simulated: their compute "
                 "alone is over 1.15 x the best)\n",
            ncopies, t_a, cands.n, t_cost, nfit, pruned);
  sb_printf(out, "# stage B: %d compiled whole in %.2f s (%d over the memory); ranked by mcc --report time's "
                 "prediction, memory as --report memory counts it (the fullest rank)\n", tried, t_b, over);
  if (nres == 0) {
    sb_printf(out, "no layout fits\n");
  } else {
    sb_printf(out, "  %-2s %-60s %10s %9s %6s %9s %9s  %s\n", "#", "layout", "step (s)", "TFLOP/s", "MFU", "GiB/GPU",
              "est. (s)", "limited by");
    for (int i = 0; i < nres; i++)
      sb_printf(out, "  %-2d %-60s %10.4g %9.2f %5.1f%% %9.2f %9.4g  %s\n", i + 1,
                al_layout_str(&res[i].l, lay, sizeof lay), res[i].step, res[i].tflops / 1e12, 100 * res[i].mfu,
                gib(res[i].memory), res[i].est_step, res[i].limit);
  }
  if (ref.count) {
    sb_printf(out, "# %d layouts refused by the compiler; the reasons:\n", ref.count);
    for (int i = 0; i < ref.n; i++) sb_printf(out, "#   %s\n", ref.text[i]);
  }
  int rc = 0;
  if (nres == 0) {
    rc = ts_errf(err, errlen, "auto-layout: no layout of %s on %d GPUs fits %.1f GiB per GPU (%d costed, %d compiled "
                 "whole, %d of them over); give more GPUs or memory (--memory)", f->name ? f->name : "the model", N,
                 gib(limit), cands.n, tried, over);
  } else {
    *best = res[0];
    sb_printf(out, "chosen: %s (mcc flags: --tp %d%s --pp %d", al_layout_str(&res[0].l, lay, sizeof lay), res[0].l.tp,
              res[0].l.sp ? " --sp" : "", res[0].l.pp);
    if (res[0].l.cp > 1)
      sb_printf(out, " --cp %d%s", res[0].l.cp, res[0].l.cp_attn == PASS_CP_ATTN_A2A ? " --cp-attn a2a"
                                               : res[0].l.cp_attn == PASS_CP_ATTN_ALLGATHER ? " --cp-attn allgather" : "");
    if (res[0].l.ep > 1) sb_printf(out, " --ep %d", res[0].l.ep);
    if (res[0].l.vpp > 1) sb_printf(out, " --vpp %d", res[0].l.vpp);
    sb_printf(out, " --dp %d%s", res[0].l.dp, res[0].l.dp > 1 && !res[0].l.zero ? " --no-zero" : "");
    if (!o->fixed_mb) sb_printf(out, " --micro-batch-size %d", res[0].l.mb);
    sb_printf(out, " --recompute %s)\n", pass_recompute_name(res[0].l.recompute));
    if (nres > 1)
      sb_printf(out, "why: %.1f%% faster than the next (%s), and fits in %.2f of %.2f GiB\n",
                100 * (res[1].step / res[0].step - 1), al_layout_str(&res[1].l, lay, sizeof lay), gib(res[0].memory),
                gib(limit));
    *winner = mods[res[0].index];
    mods[res[0].index] = NULL;
    /* the winner's memory with the runtime's own kernel positions, as
     * --report memory and mrun count it (the search used the fusion
     * groups' positions: the same but for groups the executor splits) */
    if (c->llvm_at) {   /* on the fullest rank by the search's count */
      double mem = 0;
      int np = res[0].l.pp > 1 ? res[0].l.pp : 1;
      IrModule *rm = np > 1 ? pass_pipeline_rank_module(*winner, res[0].fullest, err, errlen) : *winner;
      MemTotals mt;
      if (!rm || pass_memplan_totals(rm, c->llvm_at, c->llvm_ctx, &mt, err, errlen) != 0) rc = -1;
      else mem = (double)mt.total;
      if (np > 1) ir_module_free(rm);
      if (rc == 0) {
        sb_printf(out, "memory of the chosen plan as mrun runs it (--report memory, its fullest rank): %.2f GiB\n", gib(mem));
        if (mem > limit) rc = ts_errf(err, errlen, "auto-layout: the chosen plan needs %.2f GiB per GPU as mrun runs "
                                      "it, over the %.2f GiB given", gib(mem), gib(limit));
      }
    }
  }
  sb_printf(out, "search time: %.2f s\n", ts_now_s() - t0);
  for (int i = 0; i < nres; i++) ir_module_free(mods[i]);
  free(mods);
  free(res);
  free(cands.a);
  free(keys.a);
  return rc;
}
