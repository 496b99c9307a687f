/* timereport.c - predicted step time (timereport.h; the model in
 * docs/performance-model.md).
 *
 * Expects: compiled programs (after the pass pipeline: sharded, with the
 * update block, fusion groups formed).  Guarantees: nothing is changed.
 *
 * Every node is costed from its op and shapes alone (the compiler knows no
 * model): GEMMs and attention by their FLOPs on the description's peak for
 * the plan's number format, everything else as memory traffic (a fusion
 * group moves what enters and what leaves it, once), collectives by the
 * alpha-beta model over the link their mesh axis uses.  Overlap as the GPU
 * executor has it (runtime/exec/exec_dev.c): all_reduce, all_gather and
 * reduce_scatter run on a comm stream behind the compute issued before
 * them and are waited for by the first node that reads their result;
 * every other message (pipeline send/recv, all-to-all, ring steps) blocks.
 * What compute waits for is the exposed communication.  The dp gradient
 * reduction runs as mrun runs it (plan/dpreduce.h): in buckets issued on
 * the comm stream during the last micro batch's run of the block that
 * completes their gradients (micro, or a pipeline chunk's backward), which
 * that run's end waits for; the update block then only copies each
 * bucketed gradient's part out. */
#include "timereport.h"
#include "plan/dpreduce.h"
#include "plan/schedule.h"
#include "plan/flops.h"
#include <math.h>

double time_cost_total(const TimeCost *c) {
  double t = 0;
  for (int k = 0; k < TIME_KINDS; k++) t += c->comp[k];
  for (int a = 0; a < IR_AXIS_COUNT; a++) t += c->comm[a];
  return t;
}

static double tbytes(const IrType *t) { return (double)ir_type_numel(t) * (double)ir_dtype_size(t->dtype); }

static int is_attn(IrOp op) {
  return op == IR_OP_ATTENTION || op == IR_OP_ATTENTION_BWD || op == IR_OP_ATTN_ACC || op == IR_OP_ATTN_BWD_Q ||
         op == IR_OP_ATTN_BWD_KV;
}

/* Nodes that launch nothing: leaves, views, the pipeline's bookkeeping. */
static int is_free(IrOp op) {
  return (ir_ops[op].flags & OPF_LEAF) || op == IR_OP_RESHAPE || op == IR_OP_OUTPUT || op == IR_OP_RECV ||
         op == IR_OP_RING_WAIT || op == IR_OP_STASH || op == IR_OP_UNSTASH;
}

/* Stride in the mesh of axis a: the product of the sizes of the axes
 * inside it (tp innermost: dp, pp, cp, ep, tp). */
static int64_t axis_stride(const IrModule *m, int a) {
  int64_t s = 1;
  for (int k = a + 1; k < IR_AXIS_COUNT; k++) s *= ir_axis_size(m, (IrAxis)k);
  return s;
}

/* A communication node's time; 0 and *axis = -1 when it is none. */
static double comm_time(const IrModule *m, const IrBlock *b, const IrNode *n, const HwDesc *hw, int *axis) {
  *axis = -1;
  HwColl c;
  switch (n->op) {
  case IR_OP_ALL_REDUCE: c = HW_ALL_REDUCE; break;
  case IR_OP_GROUP_SUM: c = HW_ALL_REDUCE; break;
  case IR_OP_ALL_GATHER: c = HW_ALL_GATHER; break;
  case IR_OP_REDUCE_SCATTER: c = HW_REDUCE_SCATTER; break;
  case IR_OP_ALL_TO_ALL: case IR_OP_ALL_TO_ALL_V: c = HW_ALL_TO_ALL; break;
  case IR_OP_SEND: case IR_OP_RING_SHIFT: c = HW_SEND; break;
  default: return 0;
  }
  /* a set of axes (ZeRO over dp+cp) runs on the link of its innermost
   * axis (the closest members) and is charged to its outermost */
  unsigned mask = ir_axes_mask(n->ia[0]);
  if (!mask) return 0;
  int ax = __builtin_ctz(mask), inner = 31 - __builtin_clz(mask);
  int size = ir_axes_size(m, n->ia[0]), k = size;
  if (size < 2) return 0;
  if (n->op == IR_OP_GROUP_SUM) k = __builtin_popcountll((unsigned long long)n->ia[1]);
  if (k < 2) return 0;
  /* the bytes of --report comm's payload: all_gather its result, the
   * others their operand (all_to_all_v: the larger buffer) */
  const IrType *t = n->op == IR_OP_ALL_GATHER ? &n->type : &b->nodes[n->in[0]].type;
  if (n->op == IR_OP_ALL_TO_ALL_V && ir_type_numel(&n->type) > ir_type_numel(t)) t = &n->type;
  int64_t stride = axis_stride(m, inner);
  /* a send goes to the neighbour on the axis: its link is the one between
   * two members (n = 2) */
  HwLink l = hw_link(hw, c == HW_SEND ? 2 : size, stride);
  *axis = ax;
  return hw_coll_time(&l, c, k, tbytes(t));
}

/* Memory traffic of an effect node on state (bytes read + written). */
static double effect_bytes(const IrModule *m, const IrBlock *b, const IrNode *n) {
  const IrType *st = n->op == IR_OP_ZERO || n->op == IR_OP_ADAMW || n->op == IR_OP_ACCUM || n->op == IR_OP_ASSIGN
                         ? &m->states.a[n->ia[0]].type : NULL;
  double s = st ? tbytes(st) : 0;
  switch (n->op) {
  case IR_OP_ZERO: return s;                 /* write */
  case IR_OP_ACCUM: return 3 * s;            /* read x, read and write the state */
  case IR_OP_ASSIGN: return 2 * s;
  case IR_OP_ADAMW: return 7 * s;            /* param, m, v read and written; the gradient read */
  default: break;
  }
  double r = 0;
  for (int j = 0; j < n->nin; j++) r += tbytes(&b->nodes[n->in[j]].type);
  return r;
}

/* The collectives the GPU executor runs on its comm stream, overlapping the
 * compute issued after them until a node reads their result
 * (runtime/exec/exec_dev.c); the others block. */
static int overlappable(IrOp op) {
  return op == IR_OP_ALL_REDUCE || op == IR_OP_ALL_GATHER || op == IR_OP_REDUCE_SCATTER;
}

/* Per block: what a fusion group moves (what enters it, each distinct
 * operand from outside once, and what leaves it: members read outside). */
typedef struct {
  char *leaves;      /* [n] read by a node outside its group (or any node, for group 0) */
  int *seen_in;      /* [n] the group that already counted this operand */
  char *launched;    /* [ngroups + 1] the group's launch counted */
} GroupTraffic;

/* Compute time of node i (not communication): its kind in *kind; its
 * FLOPs added to c->hw_flops. */
static double node_compute(const IrModule *m, const IrBlock *b, int i, const HwDesc *hw, HwFormat fmt,
                           GroupTraffic *g, TimeCost *c, int *kind) {
  const IrNode *n = &b->nodes[i];
  double esize = (double)ir_dtype_size(n->type.dtype ? n->type.dtype : m->train.precision);
  double rate = hw->hbm_bw * hw->mem_eff;
  *kind = TIME_MEM;
  if (n->op == IR_OP_MATMUL) {
    double bt, M, N, K;
    plan_matmul_shape(b, n, &bt, &M, &N, &K);
    c->hw_flops += 2 * bt * M * N * K;
    *kind = TIME_GEMM;
    return hw_gemm_time(hw, fmt, bt, M, N, K, esize);
  }
  if (n->op == IR_OP_GMM || n->op == IR_OP_GMM_DW) {
    /* gmm: a[R, K] x w[G, K, N] -> [R, N]; gmm_dw: a[R, K]^T x dy[R, N] -> [G, K, N] */
    const IrType *a = &b->nodes[n->in[0]].type, *o = &n->type;
    double R = (double)a->dim[0], K = (double)a->dim[1], N = (double)o->dim[o->rank - 1];
    c->hw_flops += 2 * R * K * N;
    *kind = TIME_GEMM;
    return n->op == IR_OP_GMM ? hw_gemm_time(hw, fmt, 1, R, N, K, esize) : hw_gemm_time(hw, fmt, 1, K, N, R, esize);
  }
  if (is_attn(n->op)) {
    double f = plan_attn_flops(b, n, 0), by = tbytes(&n->type);
    for (int j = 0; j < n->nin; j++) by += tbytes(&b->nodes[n->in[j]].type);
    c->hw_flops += f;
    *kind = TIME_ATTN;
    return hw_attention_time(hw, fmt, f, by);
  }
  if (ir_ops[n->op].flags & OPF_EFFECT) return hw_mem_time(hw, effect_bytes(m, b, n));
  double out = n->type.dtype != IR_VOID ? tbytes(&n->type) : 0, t = 0;
  if (n->group > 0) {   /* one launch per group (at its first member): its inputs and outputs */
    int gr = n->group;
    if (!g->launched[gr]) t += hw->kernel_overhead, g->launched[gr] = 1;
    for (int j = 0; j < n->nin; j++) {
      int o = n->in[j];
      if (b->nodes[o].group == gr || g->seen_in[o] == gr) continue;
      g->seen_in[o] = gr;
      t += tbytes(&b->nodes[o].type) / rate;
    }
    if (g->leaves[i]) t += out / rate;
    return t;
  }
  double by = out;
  for (int j = 0; j < n->nin; j++) by += tbytes(&b->nodes[n->in[j]].type);
  return hw_mem_time(hw, by);
}

/* The overlapped dp reduction's part in one run of block bi (dpreduce.h):
 * `issue` (the writer block's last micro batch) posts the buckets whose
 * writer it is; in their update block, a bucketed gradient's dp collective
 * is a copy of its part out of the bucket.  NULL: none (one rank, dp = 1,
 * --no-overlap-grad-reduce, or another run of the block). */
typedef struct { const PlanDpPlan *pl; int bi; int issue; } DpRun;

/* A copy of `bytes` (read and write) at the memory's bandwidth: memcpy on
 * a CPU rank, a device-to-device copy on a GPU; not a kernel of the
 * executor's (whose efficiency is memory_efficiency). */
static double copy_time(const HwDesc *hw, double bytes) { return hw->kernel_overhead + 2 * bytes / hw->hbm_bw; }

/* Bucket bk on the comm stream: its gradients packed into its buffer,
 * then its collective over dp, as comm_time costs a dp collective of the
 * bucket's bytes. */
static double bucket_time(const IrModule *m, const PlanDpBucket *bk, const HwDesc *hw) {
  int dp = bk->size;   /* dp, or the joint group dp+cp ... */
  HwLink l = hw_link(hw, dp, axis_stride(m, IR_AXIS_DP));
  return copy_time(hw, (double)bk->bytes) +
         hw_coll_time(&l, bk->op == IR_OP_ALL_REDUCE ? HW_ALL_REDUCE : HW_REDUCE_SCATTER, dp, (double)bk->bytes);
}

/* 1 when node i of update block dr->bi is a dp collective the buckets did. */
static int bucketed(const DpRun *dr, int i) {
  for (int j = 0; dr && j < dr->pl->ng; j++)
    if (dr->pl->g[j].ublock == dr->bi && dr->pl->g[j].unode == i) return 1;
  return 0;
}

/* Two streams, as the GPU executor runs a block: compute in program order;
 * an overlappable collective starts when the compute issued before it is
 * done and the comm stream is free, and compute waits for it only at the
 * first node that reads its result (or at the block's end).  The waits
 * are the exposed communication, charged to the axis waited for.  dr: the
 * dp buckets this run posts or reads (NULL: none). */
static void time_block(const IrModule *m, const IrBlock *b, const HwDesc *hw, HwFormat fmt, const DpRun *dr,
                       TimeCost *c) {
  int nn = b->n, ngroups = 0;
  for (int i = 0; i < nn; i++) if (b->nodes[i].group > ngroups) ngroups = b->nodes[i].group;
  GroupTraffic g = {ts_xcalloc((size_t)nn + 1, 1), ts_xcalloc((size_t)nn + 1, sizeof(int)),
                    ts_xcalloc((size_t)ngroups + 1, 1)};
  for (int i = 0; i < nn; i++) {
    const IrNode *n = &b->nodes[i];
    for (int j = 0; j < n->nin; j++) {
      int o = n->in[j];
      if (o >= 0 && o < nn && (!b->nodes[o].group || b->nodes[o].group != n->group)) g.leaves[o] = 1;
    }
  }
  double *ready = ts_xcalloc((size_t)nn + 1, sizeof *ready);   /* when a value is there (collectives' results) */
  int *rax = ts_xmalloc(((size_t)nn + 1) * sizeof *rax);       /* the axis it waits for, -1 none */
  /* the comm stream's collectives, in order: [iv_s, iv_e) on axis iv_a */
  size_t niv_max = (size_t)nn + (dr ? (size_t)dr->pl->nb : 0) + 1;
  double *iv_s = ts_xmalloc(niv_max * sizeof *iv_s), *iv_e = ts_xmalloc(niv_max * sizeof *iv_e);
  int *iv_a = ts_xmalloc(niv_max * sizeof *iv_a), niv = 0, iv_lo = 0;
  double clock = 0, comm_free = 0;
/* compute waits from `clock` to `until`: each collective running meanwhile
 * is charged its share, the rest (none when the stream is busy) to `ax` */
#define WAIT(until, ax) do {                                                                   \
    double u_ = (until), left_ = u_ - clock;                                                   \
    while (iv_lo < niv && iv_e[iv_lo] <= clock) iv_lo++;                                       \
    for (int k_ = iv_lo; k_ < niv && iv_s[k_] < u_; k_++) {                                    \
      double a_ = iv_s[k_] > clock ? iv_s[k_] : clock, b_ = iv_e[k_] < u_ ? iv_e[k_] : u_;     \
      if (b_ > a_) { c->comm[iv_a[k_]] += b_ - a_; left_ -= b_ - a_; }                         \
    }                                                                                          \
    if (left_ > 0 && (ax) >= 0) c->comm[(ax)] += left_;                                        \
    clock = u_;                                                                                \
  } while (0)
  for (int i = 0; i < nn; i++) {
    const IrNode *n = &b->nodes[i];
    rax[i] = -1;
    /* what node i waits for: its operands' collectives */
    double w = 0;
    int wax = -1;
    for (int j = 0; j < n->nin; j++) {
      int o = n->in[j];
      if (o >= 0 && o < nn && ready[o] > w) { w = ready[o]; wax = rax[o]; }
    }
    if (bucketed(dr, i)) {   /* its bucket was reduced in the backward: the part copied out */
      double tc = copy_time(hw, tbytes(&n->type));
      if (w > clock) WAIT(w, wax);
      c->comp[TIME_MEM] += tc;
      clock += tc;
      continue;
    }
    int ax;
    double t = comm_time(m, b, n, hw, &ax);
    if (ax >= 0) {
      c->comm_all[ax] += t;
      if (overlappable(n->op)) {
        double st = clock > comm_free ? clock : comm_free;
        st = w > st ? w : st;
        comm_free = st + t;
        iv_s[niv] = st, iv_e[niv] = comm_free, iv_a[niv++] = ax;
        ready[i] = comm_free;
        rax[i] = ax;
      } else {   /* blocking: after the comm stream drains, on the compute clock */
        if (comm_free > clock) WAIT(comm_free, ax);
        if (w > clock) WAIT(w, wax);
        c->comm[ax] += t;
        clock += t;
      }
      continue;
    }
    if (is_free(n->op) || n->op == IR_OP_SEND || n->op == IR_OP_RING_SHIFT) {
      ready[i] = w;   /* a view of a value arrives with it */
      rax[i] = wax;
      continue;
    }
    int kind;
    double tc = node_compute(m, b, i, hw, fmt, &g, c, &kind);
    if (w > clock) WAIT(w, wax);
    c->comp[kind] += tc;
    clock += tc;
    /* the buckets node i completes, posted on the comm stream in order */
    for (int k = 0; dr && dr->issue && k < dr->pl->nb; k++) {
      const PlanDpBucket *bk = &dr->pl->b[k];
      if (bk->wblock != dr->bi || bk->at != i) continue;
      double t = bucket_time(m, bk, hw), st = clock > comm_free ? clock : comm_free;
      c->comm_all[IR_AXIS_DP] += t;
      comm_free = st + t;
      iv_s[niv] = st, iv_e[niv] = comm_free, iv_a[niv++] = IR_AXIS_DP;
    }
  }
  if (comm_free > clock) WAIT(comm_free, -1);   /* the block ends when its collectives do */
#undef WAIT
  free(iv_s);
  free(iv_e);
  free(iv_a);
  free(ready);
  free(rax);
  free(g.leaves);
  free(g.seen_in);
  free(g.launched);
}

void pass_time_block(const IrModule *m, const IrBlock *b, const HwDesc *hw, HwFormat fmt, TimeCost *c) {
  time_block(m, b, hw, fmt, NULL, c);
}

double pass_time_model_flops(const IrModule *f) {
  return 3 * plan_forward_model_flops(f);
}

/* Runs of block b per step (as --report comm counts them): the micro and
 * chunk blocks once per micro batch, update once, evaluation never. */
static int64_t runs_of(const IrBlock *b, int64_t nmicro) {
  IrChunkKind kind;
  int g = ir_block_chunk_kind(b, &kind);
  if (!strcmp(b->name, "eval") || (g >= 0 && kind == IR_CHUNK_EVAL)) return 0;
  return !strcmp(b->name, "micro") || g >= 0 ? nmicro : 1;
}

int pass_time_chunks(const IrModule *m, const HwDesc *hw, int nchunks, double *fwd, double *bwd, double *wgt) {
  HwFormat fmt = hw_format_of(ir_train_dtype(&m->train), 0);
  int found = 0;
  for (int g = 0; g < nchunks; g++) fwd[g] = bwd[g] = 0;
  for (int g = 0; wgt && g < nchunks; g++) wgt[g] = 0;
  for (int i = 0; i < m->blocks.n; i++) {
    const IrBlock *b = &m->blocks.a[i];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind);
    if (g < 0 || g >= nchunks || kind == IR_CHUNK_EVAL) continue;
    TimeCost c = {0};
    pass_time_block(m, b, hw, fmt, &c);
    (kind == IR_CHUNK_FWD ? fwd : kind == IR_CHUNK_WGT && wgt ? wgt : bwd)[g] += time_cost_total(&c);
    found = 1;
  }
  return found ? 0 : -1;
}

/* "1.234 ms" etc. */
static const char *secs(double s, char *buf, size_t n) {
  if (s == 0) snprintf(buf, n, "0");
  else if (s < 1e-3) snprintf(buf, n, "%.1f us", s * 1e6);
  else if (s < 1) snprintf(buf, n, "%.2f ms", s * 1e3);
  else snprintf(buf, n, "%.3f s", s);
  return buf;
}

typedef struct {
  const char *name;
  int64_t runs;
  TimeCost per_run;
} TimeRow;

static void row_print(StrBuf *out, const char *label, int64_t runs, const TimeCost *c, const int *axes_used) {
  char buf[32];
  sb_printf(out, "  %-10s %6lld", label, (long long)runs);
  for (int k = 0; k < TIME_KINDS; k++) sb_printf(out, " %11s", secs(c->comp[k] * (double)runs, buf, sizeof buf));
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (axes_used[a]) sb_printf(out, " %11s", secs(c->comm[a] * (double)runs, buf, sizeof buf));
  sb_printf(out, " %11s\n", secs(time_cost_total(c) * (double)runs, buf, sizeof buf));
}

/* Both entry points: the text goes to out when it is not NULL, the
 * figures to pred when it is not NULL. */
static int time_report(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops_micro,
                       const char *layout, const TimeDpOpts *dpo, StrBuf *out, TimePrediction *pred, char *err,
                       size_t errlen);

int pass_time_report(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops_micro,
                     const char *layout, const TimeDpOpts *dp, StrBuf *out, char *err, size_t errlen) {
  return time_report(progs, nprogs, hw, model_flops_micro, layout, dp, out, NULL, err, errlen);
}

int pass_time_predict(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops, TimePrediction *p,
                      char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  return time_report(progs, nprogs, hw, model_flops, "", NULL, NULL, p, err, errlen);
}

/* 1 when some bucket of pl is posted by block bi. */
static int posts_buckets(const PlanDpPlan *pl, int bi) {
  for (int k = 0; k < pl->nb; k++)
    if (pl->b[k].wblock == bi) return 1;
  return 0;
}

static void report_free(TimeRow *rows, int *row_prog, char **row_names, int nrows_max, double *busy, double *upd,
                        double *last_extra, PlanDpPlan *dpl, int nprogs) {
  for (int k = 0; k < nrows_max; k++) free(row_names[k]);
  for (int r = 0; r < nprogs; r++) plan_dp_free(&dpl[r]);
  free(rows);
  free(row_prog);
  free(row_names);
  free(busy);
  free(upd);
  free(last_extra);
  free(dpl);
}

static int time_report(IrModule *const *progs, int nprogs, const HwDesc *hw, double model_flops_micro,
                       const char *layout, const TimeDpOpts *dpo, StrBuf *out, TimePrediction *pred, char *err,
                       size_t errlen) {
  const IrModule *m0 = progs[0];
  int pp = ir_axis_size(m0, IR_AXIS_PP), dp = ir_axis_size(m0, IR_AXIS_DP);
  int64_t gpus = 1;
  for (int a = 0; a < IR_AXIS_COUNT; a++) gpus *= ir_axis_size(m0, (IrAxis)a);
  int nmicro = 0;
  if (plan_pipe_nmicro(&m0->train, dp, &nmicro, err, errlen) != 0) return -1;
  HwFormat fmt = hw_format_of(ir_train_dtype(&m0->train), 0);
  double peak = hw->peak[fmt] > 0 ? hw->peak[fmt] : hw->peak[HW_FP32];

  /* the overlapped dp reduction's buckets, per program, as mrun makes them
   * (none with --no-overlap-grad-reduce: the update block reduces) */
  int overlap = !dpo || dpo->overlap;   /* no buckets where no group holding dp has 2 ranks */
  PlanDpPlan *dpl = ts_xcalloc((size_t)nprogs, sizeof *dpl);
  for (int r = 0; overlap && r < nprogs; r++)
    if (plan_dp_buckets(progs[r], dpo ? dpo->bucket_bytes : 0, &dpl[r], err, errlen) != 0) {
      for (int q = 0; q < r; q++) plan_dp_free(&dpl[q]);
      free(dpl);
      return -1;
    }

  /* every program's blocks, per run; a block posting buckets has its last
   * micro batch's run as a row of its own ("<block> last") */
  int nrows_max = 0;
  for (int r = 0; r < nprogs; r++) nrows_max += 2 * progs[r]->blocks.n;
  TimeRow *rows = ts_xcalloc((size_t)nrows_max + 1, sizeof *rows);
  int *row_prog = ts_xcalloc((size_t)nrows_max + 1, sizeof *row_prog), nrows = 0;
  char **row_names = ts_xcalloc((size_t)nrows_max + 1, sizeof *row_names);
  double hw_flops_step = 0;   /* summed over all ranks: a program runs on gpus / nprogs ranks */
  double *last_extra = ts_xcalloc((size_t)nprogs, sizeof *last_extra);   /* last runs' time beyond a plain run */
  int axes_used[IR_AXIS_COUNT] = {0};
  for (int r = 0; r < nprogs; r++)
    for (int i = 0; i < progs[r]->blocks.n; i++) {
      const IrBlock *b = &progs[r]->blocks.a[i];
      int64_t runs = runs_of(b, nmicro);
      if (!runs) continue;
      DpRun dr = {&dpl[r], i, 0};
      int posts = dpl[r].nb > 0 && runs == nmicro && posts_buckets(&dpl[r], i);
      TimeCost plain = {0};
      for (int last = 0; last <= posts; last++) {
        TimeRow *w = &rows[nrows];
        memset(w, 0, sizeof *w);
        w->name = b->name;
        w->runs = posts ? (last ? 1 : runs - 1) : runs;
        dr.issue = last;
        time_block(progs[r], b, hw, fmt, dpl[r].nb > 0 ? &dr : NULL, &w->per_run);
        if (last) {
          row_names[nrows] = ts_xmalloc(strlen(b->name) + 8);
          sprintf(row_names[nrows], "%s last", b->name);
          w->name = row_names[nrows];
          last_extra[r] += time_cost_total(&w->per_run) - time_cost_total(&plain);
        } else {
          plain = w->per_run;
        }
        if (!w->runs) continue;   /* one micro batch: its only run is the last */
        for (int a = 0; a < IR_AXIS_COUNT; a++) if (w->per_run.comm_all[a] > 0) axes_used[a] = 1;
        hw_flops_step += w->per_run.hw_flops * (double)w->runs * (double)(gpus / nprogs);
        row_prog[nrows++] = r;
      }
    }

  /* the step: without pp, the blocks one after another; with pp, the
   * schedule simulated on the chunks' predicted seconds, then the update */
  double step = 0, bubble = 0;
  int crit = 0;
  double *busy = ts_xcalloc((size_t)nprogs, sizeof *busy), *upd = ts_xcalloc((size_t)nprogs, sizeof *upd);
  for (int k = 0; k < nrows; k++) {
    double t = time_cost_total(&rows[k].per_run) * (double)rows[k].runs;
    if (!strcmp(rows[k].name, "update")) upd[row_prog[k]] += t;
    else busy[row_prog[k]] += t;
  }
  if (pp < 2) {
    step = busy[0] + upd[0];
  } else {
    int vpp = m0->par.vpp > 0 ? m0->par.vpp : 1, nch = pp * vpp;
    PipeSchedKind kind;
    if (plan_pipe_program_sched(&m0->par, &kind) != 0) kind = PIPE_1F1B;
    PipeSchedule s;
    memset(&s, 0, sizeof s);
    double *f = ts_xcalloc((size_t)nch, sizeof *f), *bw = ts_xcalloc((size_t)nch, sizeof *bw);
    double *w = ts_xcalloc((size_t)nch, sizeof *w);
    for (int r = 0; r < nprogs; r++) {
      double *ff = ts_xcalloc((size_t)nch, sizeof *ff), *bb = ts_xcalloc((size_t)nch, sizeof *bb);
      double *ww = ts_xcalloc((size_t)nch, sizeof *ww);
      pass_time_chunks(progs[r], hw, nch, ff, bb, ww);
      for (int g = 0; g < nch; g++) if (g % pp == r) { f[g] = ff[g]; bw[g] = bb[g]; w[g] = ww[g]; }
      free(ff);
      free(bb);
      free(ww);
    }
    PipeTimeline t;
    int rc = plan_pipe_schedule(kind, pp, vpp, nmicro, &s, err, errlen);
    /* B and W on their own blocks' times (zb-h1); otherwise w is 0 and ignored */
    if (rc == 0) rc = plan_pipe_simulate_fbw(&s, f, bw, plan_pipe_sched_splits_bwd(kind) ? w : NULL, 2, &t, err, errlen);
    free(f);
    free(bw);
    free(w);
    if (rc != 0) {
      plan_pipe_schedule_free(&s);
      report_free(rows, row_prog, row_names, nrows_max, busy, upd, last_extra, dpl, nprogs);
      return -1;
    }
    /* the schedule runs every micro batch at a plain run's time; the last
     * runs' waits for their buckets delay the rank's end (its last steps) */
    for (int r = 0; r < pp && r < nprogs; r++) {
      double end = 0;
      for (int i = 0; i < t.nsteps[r]; i++) if (t.end[r][i] > end) end = t.end[r][i];
      if (end + last_extra[r] + upd[r] > step) { step = end + last_extra[r] + upd[r]; crit = r; }
    }
    double end = 0;
    for (int i = 0; i < t.nsteps[crit]; i++) if (t.end[crit][i] > end) end = t.end[crit][i];
    bubble = end - t.busy[crit];
    plan_pipe_timeline_free(&t);
    plan_pipe_schedule_free(&s);
  }

  double model_step = model_flops_micro * (double)m0->train.global_batch / (double)m0->train.micro_batch;
  double tflops = step > 0 ? model_step / step / (double)gpus : 0, mfu = tflops / peak;
  double hfu = step > 0 ? hw_flops_step / step / (double)gpus / peak : 0;

  if (pred) {
    pred->step = step;
    pred->bubble = bubble;
    pred->tflops = tflops;
    pred->mfu = mfu;
    pred->hfu = hfu;
    for (int k = 0; k < nrows; k++) {
      if (row_prog[k] != crit) continue;
      const TimeCost *c = &rows[k].per_run;
      double comp = (c->comp[TIME_GEMM] + c->comp[TIME_ATTN] + c->comp[TIME_MEM]) * (double)rows[k].runs;
      if (!strcmp(rows[k].name, "update")) pred->optimizer += comp;
      else pred->compute += comp;
      for (int a = 0; a < IR_AXIS_COUNT; a++) pred->comm[a] += c->comm[a] * (double)rows[k].runs;
    }
  }
  if (!out) {
    report_free(rows, row_prog, row_names, nrows_max, busy, upd, last_extra, dpl, nprogs);
    return 0;
  }
  char b1[32], b2[32];
  sb_printf(out, "time report: %s, %s, %lld GPU%s of %s (%s), %s training, %d micro batch%s per step per dp rank\n",
            m0->name ? m0->name : "?", layout, (long long)gpus, gpus == 1 ? "" : "s", hw->name, hw->path,
            ir_dtype_name(ir_train_dtype(&m0->train)), nmicro, nmicro == 1 ? "" : "es");
  sb_printf(out, "# predicted by the cost model of docs/performance-model.md: GEMMs at %.3g TFLOP/s peak (%s) x %.2g x\n"
                 "# wave quantization (or HBM-bound), attention at %.2g of that peak, memory-bound kernels at %.2g x %.3g\n"
                 "# TB/s, collectives by NCCL's ring / tree alpha-beta model over NVLink inside a node of %d GPUs and\n"
                 "# the NICs across nodes.  all_reduce / all_gather / reduce_scatter overlap the compute after\n"
                 "# them until their result is read (the GPU executor's comm stream); the comm columns are the\n"
                 "# exposed part.  %s\n"
                 "# Per rank; with pp the critical pipeline rank's blocks.\n",
            peak / 1e12, hw_format_name(fmt), hw->gemm_eff[fmt], hw->attention_eff[fmt], hw->mem_eff, hw->hbm_bw / 1e12,
            hw->gpus_per_node,
            dp < 2 ? "No dp gradient reduction (dp = 1)."
            : overlap ? "The dp gradient reduction in buckets posted during the last micro batch's\n"
                        "# backward as their gradients are final (\"<block> last\" rows), which that run's end waits for."
                      : "The dp gradient reduction in the update block (--no-overlap-grad-reduce).");
  sb_printf(out, "  %-10s %6s %11s %11s %11s", "block", "runs", "GEMM", "attention", "memory");
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (axes_used[a]) {
      char h[16];
      snprintf(h, sizeof h, "comm %s", ir_axis_name((IrAxis)a));
      sb_printf(out, " %11s", h);
    }
  sb_printf(out, " %11s\n", "total");
  TimeCost tot = {0}, opt = {0};
  for (int k = 0; k < nrows; k++) {
    if (row_prog[k] != crit) continue;
    row_print(out, rows[k].name, rows[k].runs, &rows[k].per_run, axes_used);
    TimeCost *into = !strcmp(rows[k].name, "update") ? &opt : &tot;
    for (int j = 0; j < TIME_KINDS; j++) into->comp[j] += rows[k].per_run.comp[j] * (double)rows[k].runs;
    for (int a = 0; a < IR_AXIS_COUNT; a++) {
      into->comm[a] += rows[k].per_run.comm[a] * (double)rows[k].runs;
      into->comm_all[a] += rows[k].per_run.comm_all[a] * (double)rows[k].runs;
    }
  }
  double opt_comp = opt.comp[TIME_GEMM] + opt.comp[TIME_ATTN] + opt.comp[TIME_MEM];
  sb_printf(out, "compute per step: GEMM %s, attention %s, memory-bound %s; optimizer (update block) %s\n",
            secs(tot.comp[TIME_GEMM], b1, sizeof b1), secs(tot.comp[TIME_ATTN], b2, sizeof b2),
            secs(tot.comp[TIME_MEM], (char[32]){0}, 32), secs(opt_comp, (char[32]){0}, 32));
  sb_printf(out, "exposed communication per step:");
  int any = 0;
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (axes_used[a]) {
      sb_printf(out, " %s %s (of %s)", ir_axis_name((IrAxis)a), secs(tot.comm[a] + opt.comm[a], b1, sizeof b1),
                secs(tot.comm_all[a] + opt.comm_all[a], b2, sizeof b2));
      any = 1;
    }
  sb_printf(out, "%s\n", any ? "" : " none (one rank per replica and dp = 1)");
  if (pp > 1) {
    int zb = m0->par.sched == IR_PIPE_ZBH1;   /* zb-h1: (p-1) idle units against 3m busy (F = B = W) */
    sb_printf(out, "pipeline bubble (pipeline rank %d, from the schedule simulated on these times): %s, %.4f of the "
                   "pipeline's time ((p-1)/(%sm+p-1) = %.4f for %s with equal stages%s)\n",
              crit, secs(bubble, b1, sizeof b1), step - upd[crit] > 0 ? bubble / (step - upd[crit]) : 0,
              zb ? "3" : "", (double)(pp - 1) / ((zb ? 3 : 1) * nmicro + pp - 1), zb ? "zb-h1" : "1F1B",
              zb ? " and F = B = W" : "");
  }
  sb_printf(out, "step time: %s\n", secs(step, b1, sizeof b1));
  sb_printf(out, "model FLOPs per step (Megatron's: 3 x the forward's GEMM and attention FLOPs, full score matrix, no "
                 "recomputation): %.4g\n", model_step);
  sb_printf(out, "hardware FLOPs per step (what the kernels compute: recomputation and causal skipping included): %.4g\n",
            hw_flops_step);
  sb_printf(out, "per GPU: %.2f TFLOP/s model, %.2f hardware; MFU %.1f%%, HFU %.1f%% of %.4g TFLOP/s (%s)\n", tflops / 1e12,
            hfu * peak / 1e12, 100 * mfu, 100 * hfu, peak / 1e12, hw_format_name(fmt));
  sb_printf(out, "step_time_s=%.6g tflops_per_gpu=%.4g mfu=%.4f hfu=%.4f\n", step, tflops / 1e12, mfu, hfu);
  report_free(rows, row_prog, row_names, nrows_max, busy, upd, last_extra, dpl, nprogs);
  return 0;
}
