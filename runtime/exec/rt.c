/* rt.c - the reference runtime's program: one rank's IrModule brought to
 * life.  Every state (parameters, gradients, moments) lives in ONE slab,
 * each at a 64-byte aligned offset (llm.c's single allocation), initialized
 * counter-based, so element i of a parameter has the same value whatever
 * else the module holds and however a later pass shards it:
 *   u_d(P, i) = U(H(1, seed, fnv1a64(P's name), i, d))     d = draw 0 or 1
 *   H(w...)   = h = 0x6a09e667f3bcc909; h = splitmix64_mix(h ^ w) per word
 *   U(h)      = (h >> 11) * 2^-53                          in [0, 1)
 *   normal(mu, sd)  = mu + sd * sqrt(-2 ln(1 - u_0)) cos(2 pi u_1)
 *   uniform(a, b)   = a + (b - a) u_0;   zeros / ones: 0 / 1
 * (rng.c spells out every constant; other states start at zero.)
 * In a sharded module i is the element's index in the parameter's GLOBAL
 * logical shape, found from the rank's mesh coordinates (RtRank), so each
 * rank holds exactly its block of the single-rank initialization.
 *
 * Execution (rt_run_block) walks a block's nodes in order.  Every value
 * lives in ONE activation arena, allocated once per program (the size of
 * the largest block's plan; blocks run one after another) and reused by
 * every run: value v of block b sits at the offset the static memory plan
 * (plan/memplan.h, plan_mem_block_at) gives it, computed once per
 * block when the program is created, as the backend runs the block.  So
 * `mcc --report memory` is what a run allocates, and the executor measures
 * its own use to prove it (rt_program_block_memory; tests/memplan):
 * independently of the plan it works out where each value dies, and
 * refuses to run on if a buffer dies anywhere but where the plan said.
 * INPUT values are copied from the caller's feed into the arena; STATE
 * values alias the slab; effects write the slab; a RESHAPE run alone
 * shares its operand's bytes (no copy) as the plan says.  Kernels never
 * keep a pointer into the arena after they return (a send copies).  The
 * buffers the pipeline hands over (the plan's ext: a stashed value, an
 * unstash result) are not in the arena: the executor takes them from the
 * pipeline's pool, a stash keeps its operand's buffer and the unstash
 * gives that buffer back (no copy either way; handover()).  Under
 * AddressSanitizer every byte of the arena that holds no live value is
 * poisoned, so a reference kernel reading a dead value (or
 * past the end of a live one) is caught; generated (JIT) code and BLAS are
 * not instrumented, so their reads are not checked.
 * Backends (RtExecOpts): with the reference one every node runs its
 * kernel of ops_ref.c.  With the LLVM one (exec_jit.c) a fusion group runs
 * as one generated kernel when the walk reaches its last member (the other
 * members are skipped, and values used only inside the group never get a
 * buffer); lone lowerable nodes run generated kernels too; everything else
 * the reference kernels.  A value read by a kernel counts as read at the
 * kernel's position, which is what the last uses are computed from. */
#include "rt_priv.h"
#include "dev_priv.h"
#include "runtime/comm/comm.h"
#include "plan/memplan.h"
#include "plan/dpreduce.h"
#include "runtime/cpu/par.h"
#include <math.h>
#include <stdarg.h>
#include <time.h>

typedef struct { const char *name; double v; } RtOut;   /* name interned */

/* AddressSanitizer: dead arena bytes are poisoned (see the header). */
#if defined(__SANITIZE_ADDRESS__)
#define RT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RT_ASAN 1
#endif
#endif
#ifdef RT_ASAN
#include <sanitizer/asan_interface.h>
#define RT_POISON(q, n) ASAN_POISON_MEMORY_REGION((q), (n))
#define RT_UNPOISON(q, n) ASAN_UNPOISON_MEMORY_REGION((q), (n))
#else
#define RT_POISON(q, n) ((void)(q), (void)(n))
#define RT_UNPOISON(q, n) ((void)(q), (void)(n))
#endif

/* One block's memory: where its values live in the arena, where the
 * executor releases them, and what the runs measured. */
typedef struct {
  MemPlan plan;            /* offsets in the arena, as this program's backend runs the block */
  int *rel_off, *rel_val;  /* after position i the executor releases values
                              rel_val[rel_off[i] .. rel_off[i+1]) (compute_free_plan) */
  size_t used;             /* measured: the highest end (offset + size) of a buffer written */
  size_t live;             /* measured: the most bytes of buffers live at one position */
  size_t held;             /* measured: the bytes of buffers live where `output "loss"` runs (what the
                              forward holds for the backward: mcc --report memory's "held" row) */
  int64_t runs;
} RtBlockMem;

typedef struct RtDevBlockRun RtDevBlockRun;
/* TS_RT_PROFILE on a device: a launch between two timing events, and the
 * time of one label (a kernel, a GEMM shape) over all runs */
typedef struct { const char *label; int from, to; } RtDevMark;
typedef struct { const char *label; double ms; long long n; } RtDevTime;

struct RtProgram {
  int64_t start_step, start_samples;   /* the run's first step and the samples consumed before it
                                         (rt_program_set_start: a checkpoint's) */
  int copies_stale;         /* a parameter may differ from its 16-bit copy (IR_STATE_COPY): refresh before a
                               block reads a copy (refresh_copies) */
  const IrModule *m;
  RtRank rank;              /* mesh coordinates and groups (single rank: all 0) */
  unsigned char *slab;      /* all states, 64-byte aligned offsets */
  size_t slab_bytes;
  size_t *off;              /* per state: byte offset into slab */
  RtExecOpts opts;
  RtJit *jit;               /* LLVM backend: compiled kernels and their pool */
  RtBlockMem *mem;          /* per block */
  unsigned char *arena;     /* every block's values (the largest plan's peak) */
  size_t arena_bytes;
  VEC(RtOut) outs;
  int profile;              /* TS_RT_PROFILE set: time every op */
  int dprof;                /* ... and on a device that can time its work: CUDA events around every
                               kernel, GEMM and copy, graphs off (dmark, dtime) */
  VEC(RtDevMark) dmark;     /* this block run's marks */
  VEC(RtDevTime) dtime;     /* per label, all runs */
  /* mrun --trace: every op or kernel run on the CPU, with its wall times
   * (rt_program_trace_start); at most RT_TRACE_MAX events */
  int trace;
  double trace_base;
  VEC(RtTraceEvent) tev;
  double op_s[IR_OP_COUNT]; /* seconds spent per op (when profiling) */
  int64_t op_n[IR_OP_COUNT];
  long long stash_handed, stash_copied;   /* rt_program_exec_stats */
  RtKenv env;               /* what the kernels see of the program (runtime/cpu/kernels.h): module, rank,
                               host slab, pipeline state (stashes, posted sends), ring_shift posts */
  RtDevExec *dx;            /* on a device (RtExecOpts.dev): its plan and module; the arena is device
                               memory, the slab has a device copy (dslab) the blocks work on */
  unsigned char *dslab;
  RtDevBlockRun *dgr;       /* per block: staging buffers, pending outputs, its captured graph */
  /* the overlapped dp gradient reduction (plan/dpreduce.h; "Overlapped dp
   * reduction" below): the buckets, and per bucket its run state */
  PlanDpPlan dpr;
  struct RtDpRun *dpb;
  int dpr_inflight;         /* buckets posted and not yet complete */
  long long dp_buckets, dp_grads, dp_blocking;
  double dp_wait_s, dp_post_s, dp_blocking_s, dp_poll_s;
  double dp_last_poll;      /* when the buckets in flight were last polled */
};
#define RT_DP_POLL_S 1e-3   /* the least time between two polls of the buckets in flight (dp_after) */

/* A bucket's buffers and request.  buf: the packed gradients (all-reduce:
 * reduced in place; reduce-scatter: the send side [dp][count]); recv: a
 * reduce-scatter's result [count].  at: the position of walk_block after
 * which it is posted (the kernel running its last write), -1 until known.
 * posted: in flight or complete and not yet read by the update block;
 * left: its gradients the update block has not read yet. */
typedef struct RtDpRun {
  void *buf, *recv;
  RtCommReq *req;
  int at, posted, left;
} RtDpRun;

/* A device program's per-block run state.  Feeds go through host staging
 * buffers that stay put (a captured graph copies from them when it
 * replays); outputs come back into host slots read after the block's
 * final sync.  The block "micro" is captured as a CUDA Graph on its second
 * run and replayed from then on (docs/cuda.md). */
struct RtDevBlockRun {
  void **stage;             /* per node: the INPUT's host staging buffer */
  double *slot;             /* per node: the OUTPUT's host slot */
  VEC(int) outs;            /* OUTPUT nodes copied this run, in order */
  RtDevGraph *graph;
  int runs;                 /* eager runs so far */
  long long launches;       /* launches of graph (the first, after the capture, included) */
  int no_graph;             /* never captured: why in the profile line */
};

static int plan_memory(RtProgram *p, char *err, size_t errlen);
static int dp_overlap_setup(RtProgram *p, char *err, size_t errlen);
static void dp_overlap_free(RtProgram *p);
static void print_memory(const RtProgram *p);

/* ---- TS_RT_PROFILE on a device: CUDA events around every launch ---- */

/* Records a timing event on the compute stream: its id, or -1 (profiling
 * is then switched off, once, with a warning). */
static int dev_mark(RtProgram *p) {
  RtDev *d = p->opts.dev;
  char why[512];
  int id;
  if (d->ops->timer(d, RT_STREAM_COMPUTE, &id, why, sizeof why) == 0) return id;
  fprintf(stderr, "warning: TS_RT_PROFILE: no timing on %s (%s); the device profile stops here\n", d->label, why);
  p->dprof = 0;
  return -1;
}

/* What a timed launch is called in the profile: the kernel's symbol; for
 * the planned runs without one, what they are (a GEMM with its bias
 * epilogue, a weight gradient's GEMM into its state, AdamW, an attention's
 * backward as one launch group: its statistics, dq and dk + dv kernels
 * timed together) with the node's type; else the op and its type. */
static const char *dev_label(const IrBlock *b, const RtJitKernel *K, const IrNode *nd) {
  if (K && K->cl.name[0]) return ts_intern(K->cl.name);
  char t[160], s[256];
  const IrNode *shape = nd;
  const char *what = ir_ops[nd->op].name;
  if (K && K->gemm_mm) what = "gemm+bias";
  else if (K && K->accum_from) {
    what = "gemm into grad";
    shape = &b->nodes[K->accum_from - 1];   /* the weight gradient's matmul */
  } else if (K && K->opt) {
    snprintf(t, sizeof t, "%s (all tensors)", ir_ops[K->op].name);
    what = ts_intern(t);
  }
  else if (K && K->attn_grads) what = "attention_bwd (all parts)";
  snprintf(s, sizeof s, "%s %s", what, ir_type_str(&shape->type, t, sizeof t));
  return ts_intern(s);
}

static void dev_mark_end(RtProgram *p, int from, const IrBlock *b, const RtJitKernel *K, const IrNode *nd) {
  int to = dev_mark(p);
  if (to < 0) return;
  VEC_PUSH(p->dmark, ((RtDevMark){dev_label(b, K, nd), from, to}));
}

/* After the block's sync: each mark pair's milliseconds into dtime, when
 * `count` (not on a block's first run: it loads the kernels' code lazily
 * and plans every GEMM shape, which the steps after it do not). */
static void dev_marks_read(RtProgram *p, int count) {
  RtDev *d = p->opts.dev;
  char why[512];
  for (int k = 0; k < p->dmark.n && p->dprof && count; k++) {
    double ms;
    if (d->ops->timer_ms(d, p->dmark.a[k].from, p->dmark.a[k].to, &ms, why, sizeof why) != 0) {
      fprintf(stderr, "warning: TS_RT_PROFILE: %s; the device profile stops here\n", why);
      p->dprof = 0;
      break;
    }
    int j = 0;
    while (j < p->dtime.n && p->dtime.a[j].label != p->dmark.a[k].label) j++;
    if (j == p->dtime.n) VEC_PUSH(p->dtime, ((RtDevTime){p->dmark.a[k].label, 0, 0}));
    p->dtime.a[j].ms += ms;
    p->dtime.a[j].n++;
  }
  p->dmark.n = 0;
  d->ops->timer_reset(d);
}

static int dtime_cmp(const void *a, const void *b) {
  double x = ((const RtDevTime *)a)->ms, y = ((const RtDevTime *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The device part of the profile: GPU time per kernel / GEMM, most first. */
static void print_dev_profile(RtProgram *p) {
  if (!p->dtime.n) return;
  qsort(p->dtime.a, (size_t)p->dtime.n, sizeof *p->dtime.a, dtime_cmp);
  double total = 0;
  for (int j = 0; j < p->dtime.n; j++) total += p->dtime.a[j].ms;
  fprintf(stderr, "rt profile: GPU time per kernel (CUDA events around each launch, CUDA graphs off, each block's "
          "first run not counted): %.3f ms in %d kinds\n", total, p->dtime.n);  /* not a refusal */
  int shown = p->dtime.n < 15 ? p->dtime.n : 15;
  for (int j = 0; j < shown; j++)
    fprintf(stderr, "  %-48s %10.3f ms %5.1f%% %7lld calls %9.1f us/call\n", p->dtime.a[j].label, p->dtime.a[j].ms,
            total > 0 ? 100 * p->dtime.a[j].ms / total : 0.0, p->dtime.a[j].n,
            1e3 * p->dtime.a[j].ms / (double)p->dtime.a[j].n);
}

/* With TS_RT_PROFILE in the environment, the time per op, most first, on
 * stderr when the program is freed: where a step's time goes. */
static void print_profile(const RtProgram *p) {
  double total = 0;
  for (int i = 0; i < IR_OP_COUNT; i++) total += p->op_s[i];
  unsigned char done[IR_OP_COUNT] = {0};
  fprintf(stderr, "rt profile: %.3f s in kernels\n", total);  /* not a refusal */
  if (p->stash_handed || p->stash_copied)
    fprintf(stderr, "rt profile: pipeline stashes: %lld handed over, %lld copied\n", p->stash_handed, p->stash_copied);  /* not a refusal */
  for (;;) {
    int best = -1;
    for (int i = 0; i < IR_OP_COUNT; i++)
      if (!done[i] && p->op_n[i] && (best < 0 || p->op_s[i] > p->op_s[best])) best = i;
    if (best < 0) break;
    done[best] = 1;
    fprintf(stderr, "  %-18s %9.3f s %5.1f%% %9lld calls\n", ir_ops[best].name, p->op_s[best],
            total > 0 ? 100 * p->op_s[best] / total : 0.0, (long long)p->op_n[best]);
  }
}

#define RT_ALIGN 64
static size_t align_up(size_t x) { return (x + RT_ALIGN - 1) & ~(size_t)(RT_ALIGN - 1); }


/* ---- the rank in the mesh ---- */
int rt_rank_gpu_groups(RtRank *r, RtDev *dev, char *err, size_t errlen) {
  void *stream = dev->ops->stream_handle ? dev->ops->stream_handle(dev, RT_STREAM_COMM) : NULL;
  if (!stream)
    return ts_errf(err, errlen, "device %s has no CUDA stream for NCCL (the %s device)", dev->label, dev->ops->name);
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (!r->group[a]) continue;
    char why[1024];
    if (!(r->dev_group[a] = rt_comm_init_nccl(r->group[a], dev->ordinal, why, sizeof why)) ||
        rt_comm_nccl_bind(r->dev_group[a], stream, dev->ordinal, why, sizeof why) != 0) {
      rt_rank_gpu_groups_free(r);
      return ts_errf(err, errlen, "NCCL for the %s axis on %s: %s", ir_axis_name((IrAxis)a), dev->label, why);
    }
  }
  for (unsigned k = 0; k < (1u << IR_AXIS_COUNT); k++) {   /* the sets of axes (ZeRO over dp+cp) */
    if (!r->sets[k]) continue;
    char why[1024];
    if (!(r->dev_sets[k] = rt_comm_init_nccl(r->sets[k], dev->ordinal, why, sizeof why)) ||
        rt_comm_nccl_bind(r->dev_sets[k], stream, dev->ordinal, why, sizeof why) != 0) {
      rt_rank_gpu_groups_free(r);
      return ts_errf(err, errlen, "NCCL for the %s axis on %s: %s", rt_comm_name(r->sets[k]), dev->label, why);
    }
  }
  return 0;
}

void rt_rank_gpu_groups_free(RtRank *r) {
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    rt_comm_free(r->dev_group[a]);
    r->dev_group[a] = NULL;
  }
  for (unsigned k = 0; k < (1u << IR_AXIS_COUNT); k++) {
    rt_comm_free(r->dev_sets[k]);
    r->dev_sets[k] = NULL;
  }
}

int rt_program_axis_size(const RtProgram *p, IrAxis a) { return rt_rank_axis_size(&p->rank, a); }
RtComm *rt_program_group(const RtProgram *p, IrAxis a) { return a < IR_AXIS_COUNT ? p->rank.group[a] : NULL; }
RtComm *rt_program_dev_group(const RtProgram *p, IrAxis a) { return a < IR_AXIS_COUNT ? p->rank.dev_group[a] : NULL; }
const RtRank *rt_program_rank(const RtProgram *p) { return &p->rank; }
RtDevExec *rt_program_dev_exec(RtProgram *p) { return p->dx; }
RtKenv *rt_program_kenv(RtProgram *p) { return &p->env; }

int rt_pipe_wait_sends(RtProgram *p, char *err, size_t errlen) {
  return rt_kenv_pipe_wait_sends(&p->env, err, errlen);
}

int rt_pipe_end_step(RtProgram *p, char *err, size_t errlen) {
  if (p->dx && !rt_dev_exec_dev(p->dx)->host_memory) return rt_dev_exec_pipe_end(p->dx, err, errlen);   /* on a GPU */
  return rt_kenv_pipe_end_step(&p->env, err, errlen);
}

static void store(void *data, IrDtype dt, int64_t i, double v) {
  switch (dt) {
  case IR_F32: ((float *)data)[i] = (float)v; break;
  case IR_F64: ((double *)data)[i] = v; break;
  case IR_I32: ((int32_t *)data)[i] = (int32_t)v; break;
  default: break;
  }
}

/* Fills parameter s (local type, row-major): element i takes val(ctx, g),
 * g its flat index in the LOGICAL global shape (the model's sizes, before
 * padding for sharding); padding elements are 0.  In an unsharded,
 * unpadded module g is i itself.  Elements are independent (val is a
 * pure function of g): the work is split over the thread pool. */
typedef struct {
  const IrType *t;
  void *data;
  double (*val)(const void *ctx, int64_t g);
  const void *ctx;
  int64_t off[IR_MAX_RANK], lg[IR_MAX_RANK];
  int plain;
} FillJob;

static void fill_range(void *jp, int64_t lo, int64_t hi) {
  const FillJob *j = jp;
  const IrType *t = j->t;
  if (j->plain) {   /* the whole tensor: the global index is the local one */
    for (int64_t i = lo; i < hi; i++) store(j->data, t->dtype, i, j->val(j->ctx, i));
    return;
  }
  int64_t idx[IR_MAX_RANK] = {0}, rem = lo;
  for (int d = t->rank - 1; d >= 0; d--) {   /* lo's local multi-index */
    idx[d] = t->dim[d] ? rem % t->dim[d] : 0;
    rem = t->dim[d] ? rem / t->dim[d] : 0;
  }
  for (int64_t i = lo; i < hi; i++) {
    int64_t g = 0, pad = 0;
    for (int d = 0; d < t->rank; d++) {
      int64_t gd = j->off[d] + idx[d];
      pad |= gd >= j->lg[d];
      g = g * j->lg[d] + gd;
    }
    store(j->data, t->dtype, i, pad ? 0.0 : j->val(j->ctx, g));
    for (int d = t->rank - 1; d >= 0; d--) {   /* odometer over the local index */
      if (++idx[d] < t->dim[d]) break;
      idx[d] = 0;
    }
  }
}

static int fill_param(const RtProgram *p, const IrState *s, void *data, double (*val)(const void *ctx, int64_t g),
                      const void *ctx, char *err, size_t errlen) {
  const IrType *t = &s->type;
  if (s->sh.flat || s->sh.partial)
    return ts_errf(err, errlen, "parameter @%s is %s; a parameter can only be split or replicated",
                   s->name, s->sh.flat ? "flat (ZeRO)" : "partial");
  FillJob j = {t, data, val, ctx, {0}, {0}, 1};
  int64_t gdim[IR_MAX_RANK];
  rt_shard_offsets(&p->rank, &s->sh, t, j.off, gdim);
  for (int d = 0; d < t->rank; d++) {
    j.lg[d] = s->logical[d] > 0 ? s->logical[d] : gdim[d];
    if (j.lg[d] > gdim[d])
      return ts_errf(err, errlen, "parameter @%s: logical size %lld of dim %d exceeds its global size %lld",
                     s->name, (long long)j.lg[d], d, (long long)gdim[d]);
    if (j.off[d] != 0 || j.lg[d] != t->dim[d]) j.plain = 0;
  }
  rt_par_for(ir_type_numel(t), 1 << 14, fill_range, &j);
  return 0;
}

static double init_value(const void *ctx, int64_t g) { return rt_init_at(ctx, g); }
static double global_value(const void *ctx, int64_t g) { return ((const double *)ctx)[g]; }

/* Parameter s filled by val into data; a ZeRO-3 sharded parameter
 * (IR_STATE_SHARDED) into its shard state's buffer `data`: the rank's
 * chunk [r*c, (r+1)*c) of the flattened local tensor, zero past its end
 * (filled whole into a temporary: initialization and loading only). */
static int fill_param_or_shard(const RtProgram *p, const IrState *s, void *data,
                               double (*val)(const void *ctx, int64_t g), const void *ctx, char *err, size_t errlen) {
  if (!(s->flags & IR_STATE_SHARDED)) return fill_param(p, s, data, val, ctx, err, errlen);
  int sh = ir_state_shard_of(p->m, (int)(s - p->m->states.a));
  if (sh < 0) return ts_errf(err, errlen, "parameter @%s is sharded but has no shard state", s->name);  /* internal */
  const IrState *st = &p->m->states.a[sh];
  size_t es = ir_dtype_size(s->type.dtype);
  int64_t n = ir_type_numel(&s->type), c = ir_type_numel(&st->type);
  int64_t start = rt_shard_block(&p->rank, st->sh.flat, NULL) * c;
  char *full = ts_xmalloc((size_t)(n ? n : 1) * es);
  int rc = fill_param(p, s, full, val, ctx, err, errlen);
  if (rc == 0) {
    int64_t have = start >= n ? 0 : (n - start < c ? n - start : c);
    memset(data, 0, (size_t)c * es);
    if (have > 0) memcpy(data, full + (size_t)start * es, (size_t)have * es);
  }
  free(full);
  return rc;
}

/* Parameter s from its initializer (into its shard under ZeRO-3). */
static int init_param(const RtProgram *p, const IrState *s, uint64_t seed, void *data, char *err, size_t errlen) {
  RtInit c = rt_init_begin(s, seed, rt_name_hash(s->name));
  return fill_param_or_shard(p, s, data, init_value, &c, err, errlen);
}

int rt_any_failed(RtComm *w, int bad, const char *what, char *err, size_t errlen) {
  if (!w) return bad;
  double v = bad;
  char why[512];
  if (rt_comm_all_reduce_max(w, IR_F64, &v, 1, why, sizeof why) != 0) {
    if (!bad) ts_errf(err, errlen, "%s", why);
    return 1;
  }
  if (v > 0 && !bad && what) ts_errf(err, errlen, "another rank could not %s (its message says why)", what);
  return v > 0;
}

int rt_program_set_param(RtProgram *p, int s, const double *global, char *err, size_t errlen) {
  const IrModule *m = p->m;
  TS_ASSERT(s >= 0 && s < m->states.n && m->states.a[s].kind == IR_STATE_PARAM);
  const IrState *st = &m->states.a[s];
  int at = (st->flags & IR_STATE_SHARDED) ? ir_state_shard_of(m, s) : s;
  if (at < 0) return ts_errf(err, errlen, "parameter @%s is sharded but has no shard state", st->name);  /* internal */
  return fill_param_or_shard(p, st, p->slab + p->off[at], global_value, global, err, errlen);
}

/* The default backend: what rt_exec_set_default set, else TS_BACKEND from
 * the environment ("llvm" or "ref", so that tests written against
 * rt_program_new can be run on either), else the reference. */
static RtExecOpts g_exec_default;
static int g_exec_set;
void rt_exec_set_default(const RtExecOpts *o) {
  if (!o) return;
  g_exec_default = *o;
  g_exec_set = 1;
}
RtExecOpts rt_exec_default(void) {
  if (!g_exec_set) {
    const char *e = getenv("TS_BACKEND");
    RtExecOpts o = {0};
    if (e && strcmp(e, "llvm") == 0) o.backend = RT_BACKEND_LLVM;
    return o;
  }
  return g_exec_default;
}

RtProgram *rt_program_new(const IrModule *m, char *err, size_t errlen) {
  RtRank r = rt_rank_single();
  RtExecOpts o = rt_exec_default();
  return rt_program_new_opts(m, &r, &o, err, errlen);
}

RtProgram *rt_program_new_rank(const IrModule *m, const RtRank *r, char *err, size_t errlen) {
  RtExecOpts o = rt_exec_default();
  return rt_program_new_opts(m, r, &o, err, errlen);
}

void rt_program_exec_stats(const RtProgram *p, RtExecStats *s) {
  memset(s, 0, sizeof *s);
  if (p->jit) *s = *rt_jit_stats(p->jit);
  if (p->dx) rt_dev_exec_comm_stats(p->dx, &s->dev_collectives, &s->dev_overlapped);
  s->stash_handed = p->stash_handed;
  s->stash_copied = p->stash_copied;
  s->dp_buckets = p->dp_buckets;
  s->dp_grads = p->dp_grads;
  s->dp_wait_s = p->dp_wait_s;
  s->dp_post_s = p->dp_post_s;
  s->dp_poll_s = p->dp_poll_s;
  s->dp_blocking = p->dp_blocking;
  s->dp_blocking_s = p->dp_blocking_s;
  if (p->dx) {
    long long posted;
    rt_dev_exec_dp_stats(p->dx, &posted, &s->dp_dev_overlapped);
  }
  for (int b = 0; p->dgr && b < p->m->blocks.n; b++) {
    s->graphs += p->dgr[b].graph != NULL;
    s->graph_launches += p->dgr[b].launches;
  }
}

/* Host memory a device copy reads or writes when it may be captured in a
 * graph (staging buffers, output slots): page-locked when the device has
 * it (a capture refuses copies through pageable memory), else the heap.
 * Zeroed.  0, or -1 with why. */
static int host_buf(RtProgram *p, size_t bytes, void **q, char *why, size_t n) {
  RtDev *d = p->opts.dev;
  if (d->ops->host_alloc) return d->ops->host_alloc(d, bytes, q, why, n);
  *q = ts_xcalloc(1, bytes ? bytes : 1);
  return 0;
}

static void host_buf_free(RtProgram *p, void *q) {
  RtDev *d = p->opts.dev;
  if (!q) return;
  if (d->ops->host_alloc) d->ops->host_free(d, q);
  else free(q);
}

/* A program on a device: the device plan and module (exec_dev.c), and
 * the device copy of the initialized slab.  0 or -1. */
/* The 16-bit copies (IR_STATE_COPY) made from their masters in the host
 * slab, now. */
static void copies_make(RtProgram *p) {
  for (int s = 0; s < p->m->states.n; s++) {
    const IrState *c = &p->m->states.a[s];
    if (c->kind != IR_STATE_COPY) continue;
    const IrState *ms = &p->m->states.a[c->of];
    rt_convert(p->slab + p->off[s], c->type.dtype, p->slab + p->off[c->of], ms->type.dtype, ir_type_numel(&c->type));
  }
  p->copies_stale = 0;
}

/* The host slab copied to the device (after creation, after a load): the
 * 16-bit copies made on the host first; from then on the update block
 * keeps them (optimizer step 5b). */
static int push_slab(RtProgram *p, const char *what, char *err, size_t errlen) {
  RtDev *d = p->opts.dev;
  char why[512];
  copies_make(p);
  if (d->ops->h2d(d, p->dslab, p->slab, p->slab_bytes, RT_STREAM_COMPUTE, why, sizeof why) != 0 ||
      d->ops->sync(d, RT_STREAM_COMPUTE, why, sizeof why) != 0)
    return ts_errf(err, errlen, "copying the %s states to %s: %s", what, d->label, why);
  return 0;
}

static int device_setup(RtProgram *p, char *err, size_t errlen) {
  RtDev *d = p->opts.dev;
  const MemPlan **plans = ts_xmalloc((size_t)(p->m->blocks.n ? p->m->blocks.n : 1) * sizeof *plans);
  for (int b = 0; b < p->m->blocks.n; b++) plans[b] = &p->mem[b].plan;
  p->dx = rt_dev_exec_new(p->m, &p->opts, p->jit, plans, err, errlen);
  free(plans);
  if (!p->dx) return -1;
  void *q = NULL;
  char why[512];
  if (d->ops->alloc(d, p->slab_bytes ? p->slab_bytes : RT_ALIGN, &q, why, sizeof why) != 0)
    return ts_errf(err, errlen, "the %zu-byte state slab on %s: %s", p->slab_bytes, d->label, why);
  p->dslab = q;
  p->dgr = ts_xcalloc((size_t)(p->m->blocks.n ? p->m->blocks.n : 1), sizeof *p->dgr);
  for (int b = 0; b < p->m->blocks.n; b++) {
    int n = p->m->blocks.a[b].n;
    p->dgr[b].stage = ts_xcalloc((size_t)(n ? n : 1), sizeof *p->dgr[b].stage);
    void *slot = NULL;
    if (host_buf(p, (size_t)(n ? n : 1) * sizeof *p->dgr[b].slot, &slot, why, sizeof why) != 0)
      return ts_errf(err, errlen, "block %s's output slots: %s", p->m->blocks.a[b].name, why);
    p->dgr[b].slot = slot;
  }
  return push_slab(p, "initial", err, errlen);
}

void *rt_state_dev(RtProgram *p, int s) { return p->dslab ? p->dslab + p->off[s] : rt_state_data(p, s); }

int rt_program_sync_states(RtProgram *p, char *err, size_t errlen) {
  if (!p->dx) return 0;
  RtDev *d = p->opts.dev;
  char why[512];
  if (d->ops->sync(d, RT_STREAM_COMPUTE, why, sizeof why) != 0 ||
      d->ops->d2h(d, p->slab, p->dslab, p->slab_bytes, RT_STREAM_COMPUTE, why, sizeof why) != 0 ||
      d->ops->sync(d, RT_STREAM_COMPUTE, why, sizeof why) != 0)
    return ts_errf(err, errlen, "copying the states back from %s: %s", d->label, why);
  return 0;
}

int rt_program_push_states(RtProgram *p, char *err, size_t errlen) { return p->dx ? push_slab(p, "loaded", err, errlen) : 0; }

int rt_fp8_refused_on_gpu(const IrModule *m, int sm, char *err, size_t errlen) {
  if (sm <= 0 || sm >= 89) return 0;   /* unknown (the layer refuses the GEMM itself) or Ada / Hopper and newer */
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_FP8)
      return ts_errf(err, errlen, "this plan trains with --fp8 (matmul8 on f8e4m3 / f8e5m2 operands), and this GPU "
                     "is sm_%d: cuBLASLt's fp8 GEMMs need sm_89 or newer (Ada, Hopper: sm_90 for H100 / H200): run it "
                     "on CPU ranks (mrun --cpu), on an sm_89+ GPU, or compile it without --fp8 for this one", sm), 1;
  return 0;
}

RtProgram *rt_program_new_opts(const IrModule *m, const RtRank *r, const RtExecOpts *o, char *err, size_t errlen) {
  RtExecOpts dflt = {0};
  if (!o) o = &dflt;
  if (!m) { ts_errf(err, errlen, "rt_program_new: no module"); return NULL; }  /* internal */
  if (!r) { ts_errf(err, errlen, "rt_program_new_rank: no rank"); return NULL; }  /* internal */
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    int want = ir_axis_size(m, (IrAxis)a), have = rt_rank_axis_size(r, (IrAxis)a);
    if (want != have) {
      ts_errf(err, errlen, "the program was compiled for %s=%d but this rank's mesh has %s=%d",
              ir_axis_name((IrAxis)a), want, ir_axis_name((IrAxis)a), have);
      return NULL;
    }
    if (r->coord[a] < 0 || r->coord[a] >= have) {
      ts_errf(err, errlen, "rank coordinate %s=%d is outside the mesh (size %d)", ir_axis_name((IrAxis)a),  /* internal */
              r->coord[a], have);
      return NULL;
    }
  }
  RtProgram *p = ts_xcalloc(1, sizeof *p);
  p->m = m;
  p->rank = *r;
  p->profile = getenv("TS_RT_PROFILE") != NULL;
  p->dprof = p->profile && o->dev && o->dev->ops->timer && o->dev->ops->timer_ms && o->dev->ops->timer_reset;
  p->off = ts_xcalloc((size_t)m->states.n + 1, sizeof *p->off);
  p->opts = *o;
  p->mem = ts_xcalloc((size_t)m->blocks.n + 1, sizeof *p->mem);
  size_t total = 0;
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
    size_t es = ir_dtype_size(s->type.dtype);
    int64_t n = ir_type_numel(&s->type);
    if (es == 0 || n < 0) {
      ts_errf(err, errlen, "state @%s: unsupported type", s->name);  /* internal */
      rt_program_free(p);
      return NULL;
    }
    p->off[i] = total;
    total += align_up(ir_state_bytes(s));   /* a ZeRO-3 sharded parameter: none (its shard holds it) */
  }
  p->slab_bytes = total;
  void *slab = NULL;
  if (posix_memalign(&slab, RT_ALIGN, total ? total : RT_ALIGN) != 0) {
    ts_errf(err, errlen, "out of memory allocating %zu bytes of state", total);
    rt_program_free(p);
    return NULL;
  }
  p->slab = slab;
  memset(p->slab, 0, total);
  p->env = (RtKenv){.m = m, .rank = &p->rank, .slab = p->slab, .off = p->off};
  for (int i = 0; i < m->states.n; i++) {
    const IrState *s = &m->states.a[i];
    if (s->kind == IR_STATE_SCALER) {   /* a scalar starting at init_a (fp16's loss scaler) */
      if (s->type.dtype == IR_F64) *(double *)(p->slab + p->off[i]) = s->init_a;
      else *(float *)(p->slab + p->off[i]) = (float)s->init_a;
    }
    if (s->kind == IR_STATE_FP8)   /* --fp8's scales (1) and amax history (0): every element init_a */
      for (int64_t e = 0; e < ir_type_numel(&s->type); e++) ((float *)(p->slab + p->off[i]))[e] = (float)s->init_a;
    int at = (s->flags & IR_STATE_SHARDED) ? ir_state_shard_of(m, i) : i;
    if (s->kind == IR_STATE_PARAM && (at < 0 || init_param(p, s, m->train.seed, p->slab + p->off[at], err, errlen) != 0)) {
      if (at < 0) ts_errf(err, errlen, "parameter @%s is sharded but has no shard state", s->name);  /* internal */
      rt_program_free(p);
      return NULL;
    }
  }
  p->copies_stale = 1;
  if (o->dev && rt_fp8_refused_on_gpu(m, o->dev->sm, err, errlen)) {
    rt_program_free(p);
    return NULL;
  }
  if (o->dev) p->opts.backend = RT_BACKEND_LLVM;   /* a device runs the planned kernels */
  if ((o->backend == RT_BACKEND_LLVM || o->dev) && !(p->jit = rt_jit_new(m, &p->opts, err, errlen))) {
    rt_program_free(p);
    return NULL;
  }
  if (plan_memory(p, err, errlen) != 0 || (o->dev && device_setup(p, err, errlen) != 0) ||
      dp_overlap_setup(p, err, errlen) != 0) {
    rt_program_free(p);
    return NULL;
  }
  if (p->jit && p->profile) {
    const RtExecStats *s = rt_jit_stats(p->jit);
    fprintf(stderr, "rt: llvm backend: %d kernels (%d fused groups, %d distinct compiled, %d groups on the reference) "
            "in %.3f s, %d from the disk cache (%d waited for another process), %d threads; %d GEMM bias epilogues, %d optimizer-step launches for %d "  /* not a refusal */
            "tensors, %d attention backwards in one pass, %d gradients made straight into their state\n",
            s->kernels, s->groups, s->distinct, s->fallbacks, s->jit_s, s->disk_hits, s->deferred, s->threads, s->epilogues,
            s->opt_runs, s->opt_tensors, s->attn_grads, s->accum_direct);
  }
  return p;
}

void rt_program_trace_start(RtProgram *p, double base) {
  p->trace = 1;
  p->trace_base = base;
}

const RtTraceEvent *rt_program_trace_events(const RtProgram *p, int *n) {
  *n = p->tev.n;
  return p->tev.a;
}

void rt_program_free(RtProgram *p) {
  if (!p) return;
  if (p->profile) print_profile(p);
  print_dev_profile(p);
  free(p->dmark.a);
  free(p->dtime.a);
  free(p->tev.a);
  if (getenv("TS_RT_MEMORY")) print_memory(p);
  for (int b = 0; p->mem && b < p->m->blocks.n; b++) {
    plan_mem_free(&p->mem[b].plan);
    free(p->mem[b].rel_off);
    free(p->mem[b].rel_val);
  }
  dp_overlap_free(p);   /* before the device's buffers go */
  if (p->opts.dev) {
    RtDev *d = p->opts.dev;
    for (int b = 0; p->dgr && b < p->m->blocks.n; b++) {
      RtDevBlockRun *g = &p->dgr[b];
      for (int i = 0; g->stage && i < p->m->blocks.a[b].n; i++) host_buf_free(p, g->stage[i]);
      free(g->stage);
      host_buf_free(p, g->slot);
      free(g->outs.a);
      if (g->graph) d->ops->graph_free(d, g->graph);
    }
    free(p->dgr);
    if (p->arena) d->ops->free(d, p->arena);
    if (p->dslab) d->ops->free(d, p->dslab);
    p->arena = NULL;
    rt_dev_exec_free(p->dx);
  }
  free(p->mem);
  if (p->arena) RT_UNPOISON(p->arena, p->arena_bytes);
  free(p->arena);
  dp_overlap_free(p);
  rt_jit_free(p->jit);
  rt_pipe_free(p->env.pipe);
  rt_ring_free(p->env.ring);
  free(p->off);
  free(p->slab);
  free(p->outs.a);
  free(p);
}

const IrModule *rt_program_module(const RtProgram *p) { return p->m; }

void rt_program_set_start(RtProgram *p, int64_t step, int64_t samples) {
  p->start_step = step;
  p->start_samples = samples;
}

int64_t rt_samples_before(const RtProgram *p, int64_t step) {
  const IrTrain *t = &p->m->train;
  if (step < p->start_step) return ir_train_samples_before(t, step);   /* (fp16's lr of a step before skipped ones) */
  return ir_train_samples_after(t, p->start_samples, step - p->start_step);
}
uint64_t rt_program_seed(const RtProgram *p) { return p->m->train.seed; }

void *rt_state_data(RtProgram *p, int s) {
  if (s < 0 || s >= p->m->states.n) return NULL;
  p->copies_stale = 1;   /* whoever holds the pointer may write a parameter */
  return p->slab + p->off[s];
}

/* The 16-bit copies (IR_STATE_COPY, pass precision) from their f32
 * masters, when a block that reads them is about to run and a master may
 * have changed: after the program's creation, a load, or a block writing
 * a parameter (the update block).  Once per step when training. */
static void refresh_copies(RtProgram *p, int bi) {
  if (!p->copies_stale) return;
  const IrBlock *b = &p->m->blocks.a[bi];
  int reads = 0;
  for (int i = 0; i < b->n && !reads; i++)
    reads = b->nodes[i].op == IR_OP_STATE && p->m->states.a[b->nodes[i].ia[0]].kind == IR_STATE_COPY;
  if (reads) copies_make(p);
}
/* Whether block bi writes every 16-bit copy (the update block: optimizer
 * step 5b), so they are fresh after it. */
static int writes_copies(const RtProgram *p, int bi) {
  const IrBlock *b = &p->m->blocks.a[bi];
  int copies = 0, written = 0;
  for (int s = 0; s < p->m->states.n; s++) copies += p->m->states.a[s].kind == IR_STATE_COPY;
  for (int i = 0; i < b->n; i++)
    written += b->nodes[i].op == IR_OP_ASSIGN && p->m->states.a[b->nodes[i].ia[0]].kind == IR_STATE_COPY;
  return copies > 0 && written >= copies;
}
/* Whether block bi writes a parameter that has a copy. */
static int writes_masters(const RtProgram *p, int bi) {
  const IrBlock *b = &p->m->blocks.a[bi];
  for (int i = 0; i < b->n; i++)
    for (int k = 0; k < IR_MAX_IATTR; k++)
      if (ir_op_iattr_is_state(b->nodes[i].op, k) && (ir_ops[b->nodes[i].op].flags & OPF_EFFECT) &&
          p->m->states.a[b->nodes[i].ia[k]].kind == IR_STATE_PARAM)
        return 1;
  return 0;
}

/* The bytes a value's kernel writes (its buffer is this, rounded up). */
static size_t value_bytes(const IrNode *n) {
  return (size_t)ir_type_numel(&n->type) * ir_dtype_size(n->type.dtype);
}

/* Where each value is released: last[v] = the last position reading v
 * (v's own position if none), as CSR lists per position (*off: b->n + 1
 * offsets into *val).  A node computed by a kernel (jb, LLVM backend)
 * "runs" at the kernel's position, and reads inside one kernel are not
 * reads of a buffer. */
static void compute_free_plan(const IrBlock *b, const RtJitBlock *jb, int **off_out, int **val_out) {
  int n = b->n;
  int *last = ts_xmalloc((size_t)(n ? n : 1) * sizeof *last);
#define EP(u) (jb && jb->kern[u] >= 0 ? jb->k.a[jb->kern[u]].at : (u))
  for (int i = 0; i < n; i++) last[i] = EP(i);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < b->nodes[i].nin; k++) {
      int v = b->nodes[i].in[k];
      if (v < 0 || v >= i) continue;
      if (jb && jb->kern[i] >= 0 && jb->kern[i] == jb->kern[v]) continue;
      if (last[v] < EP(i)) last[v] = EP(i);
    }
#undef EP
  int *off = ts_xcalloc((size_t)n + 1, sizeof *off), *val = ts_xmalloc((size_t)(n ? n : 1) * sizeof *val);
  for (int v = 0; v < n; v++) off[last[v] + 1]++;
  for (int i = 0; i < n; i++) off[i + 1] += off[i];
  int *fill = ts_xcalloc((size_t)(n ? n : 1), sizeof *fill);
  for (int v = 0; v < n; v++) val[off[last[v]] + fill[last[v]]++] = v;
  free(fill);
  free(last);
  *off_out = off;
  *val_out = val;
}

/* at[i] = the position at which the executor computes node i of b: its
 * kernel's (RtJitKernel.at) on the LLVM backend, else its own. */
static void kernel_positions(const IrBlock *b, const RtJitBlock *jb, int *at) {
  for (int i = 0; i < b->n; i++) at[i] = jb && jb->kern[i] >= 0 ? jb->k.a[jb->kern[i]].at : i;
}

int rt_exec_positions(const IrModule *m, const RtExecOpts *o, int block, int *at, char *err, size_t errlen) {
  if (!m || block < 0 || block >= m->blocks.n) return ts_errf(err, errlen, "no block %d", block);
  const IrBlock *b = &m->blocks.a[block];
  if (!o || o->backend != RT_BACKEND_LLVM) {
    kernel_positions(b, NULL, at);
    return 0;
  }
  RtExecOpts one = *o;
  one.threads = 1;                  /* no pool to speak of: nothing runs */
  RtJit *j = rt_jit_new(m, &one, err, errlen);
  if (!j) return -1;
  kernel_positions(b, rt_jit_block(j, block), at);
  rt_jit_free(j);
  return 0;
}

/* Every block's memory plan as this program's backend runs it (a kernel
 * at its position, RtJitKernel.at), checked; the executor's own release
 * lists; and the arena, the size of the largest plan.  0 or -1. */
static int plan_memory(RtProgram *p, char *err, size_t errlen) {
  const IrModule *m = p->m;
  size_t peak = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    const RtJitBlock *jb = p->jit ? rt_jit_block(p->jit, bi) : NULL;
    RtBlockMem *bm = &p->mem[bi];
    int *at = NULL;
    if (jb) {
      at = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *at);
      kernel_positions(b, jb, at);
    }
    char why[512];
    int rc = plan_mem_block_checked(m, bi, at, &bm->plan, why, sizeof why);
    free(at);
    if (rc != 0) return ts_errf(err, errlen, "the memory plan of block %s: %s", b->name, why);
    compute_free_plan(b, jb, &bm->rel_off, &bm->rel_val);
    if (bm->plan.peak_bytes > peak) peak = bm->plan.peak_bytes;
  }
  void *q = NULL;
  p->arena_bytes = peak;
  if (p->opts.dev) {   /* device memory (aligned to at least 256 bytes by the device) */
    char why[512];
    if (p->opts.dev->ops->alloc(p->opts.dev, peak ? peak : RT_ALIGN, &q, why, sizeof why) != 0)
      return ts_errf(err, errlen, "the %zu-byte activation arena on %s: %s", peak, p->opts.dev->label, why);
    p->arena = q;
    return 0;
  }
  /* page-aligned: the plan's offsets are 64-byte aligned from here */
  if (posix_memalign(&q, 4096, peak ? peak : RT_ALIGN) != 0)
    return ts_errf(err, errlen, "out of memory allocating the %zu-byte activation arena", peak);
  p->arena = q;
  RT_POISON(p->arena, p->arena_bytes);
  return 0;
}

size_t rt_program_arena_bytes(const RtProgram *p) { return p->arena_bytes; }
size_t rt_program_slab_bytes(const RtProgram *p) { return p->slab_bytes; }

int rt_program_block_memory(const RtProgram *p, int b, size_t *used, size_t *live) {
  if (b < 0 || b >= p->m->blocks.n) return -1;
  if (used) *used = p->mem[b].used;
  if (live) *live = p->mem[b].live;
  return 0;
}

/* TS_RT_MEMORY set: what the program allocated and what its runs used,
 * on stderr when it is freed (tests/memplan compares it with `mcc --report
 * memory`). */
static void print_memory(const RtProgram *p) {
  size_t kind[IR_STATE_KIND_COUNT] = {0};   /* exact bytes of the slab's states, by kind */
  for (int i = 0; i < p->m->states.n; i++) {
    const IrState *st = &p->m->states.a[i];
    if (st->kind >= 0 && st->kind < IR_STATE_KIND_COUNT)
      kind[st->kind == IR_STATE_SHARD ? IR_STATE_PARAM : st->kind] += ir_state_bytes(st);   /* ZeRO-3: the shards */
  }
  fprintf(stderr, "rt memory: rank dp %d pp %d cp %d ep %d tp %d: params %zu grads %zu adam %zu slab %zu arena %zu\n",
          p->rank.coord[IR_AXIS_DP], p->rank.coord[IR_AXIS_PP], p->rank.coord[IR_AXIS_CP], p->rank.coord[IR_AXIS_EP],
          p->rank.coord[IR_AXIS_TP], kind[IR_STATE_PARAM], kind[IR_STATE_GRAD],
          kind[IR_STATE_ADAM_M] + kind[IR_STATE_ADAM_V], p->slab_bytes, p->arena_bytes);  /* not a refusal */
  for (int b = 0; p->mem && b < p->m->blocks.n; b++)
    fprintf(stderr, "rt memory: rank dp %d pp %d cp %d ep %d tp %d: block %s: runs %lld used %zu live %zu held %zu\n",
            p->rank.coord[IR_AXIS_DP], p->rank.coord[IR_AXIS_PP], p->rank.coord[IR_AXIS_CP],
            p->rank.coord[IR_AXIS_EP], p->rank.coord[IR_AXIS_TP], p->m->blocks.a[b].name,
            (long long)p->mem[b].runs, p->mem[b].used, p->mem[b].live, p->mem[b].held);  /* not a refusal */
}

/* ---- Overlapped dp reduction ----
 * On CPU ranks with dp > 1 (unless RtExecOpts.no_overlap), the gradients
 * plan/dpreduce.h puts in buckets are reduced over dp while the last micro
 * batch's backward still runs: once the position completing a bucket's
 * last gradient has run (walk_block), its gradients are packed from the
 * slab into the bucket's buffer and its collective is posted without
 * waiting (MPI_Iallreduce / MPI_Ireduce_scatter_block); every later
 * position polls the requests in flight (MPI moves data only inside its
 * calls).  The update block's dp collective of such a gradient then waits
 * for its bucket and copies its part out, instead of communicating; the
 * summands are the same, each element summed over the same ranks.  A
 * bucket not posted (a caller that never says RtRunInfo.last) leaves the
 * update block's collectives to run as written. */
/* On a CUDA device (not the host-memory emulator, whose collectives are
 * the reference kernels') the buckets are device buffers, packed and
 * reduced on the comm stream by NCCL (rt_dev_exec_dp_post), pending like
 * the device's other collectives: the backward issued after a bucket
 * overlaps it, and the block's end joins it; a last micro batch runs its
 * block eagerly (not its CUDA graph, which posts nothing). */
static int dp_dev(const RtProgram *p) { return p->dx && !rt_dev_exec_dev(p->dx)->host_memory; }

/* The group bucket b's collective runs on (dp, or a set such as dp+cp),
 * NULL when the rank has none it can post a bucket on. */
static RtComm *dp_group(const RtProgram *p, const PlanDpBucket *b) {
  RtComm *g = rt_rank_axes_group(&p->rank, b->axes, p->dx ? 1 : 0);
  if (!g || rt_rank_axes_size(&p->rank, b->axes) != b->size) return NULL;
  return p->dx ? (dp_dev(p) ? g : NULL) : (rt_comm_is_nccl(g) ? NULL : g);
}

static int dp_overlap_setup(RtProgram *p, char *err, size_t errlen) {
  if (p->opts.no_overlap) return 0;
  int64_t bytes = p->opts.dp_bucket_bytes;
  if (bytes < 0) bytes = -bytes * (int64_t)ir_dtype_size(p->m->train.precision);   /* given in elements */
  if (plan_dp_buckets(p->m, bytes, &p->dpr, err, errlen) != 0) return -1;
  for (int k = 0; k < p->dpr.nb; k++)
    if (!dp_group(p, &p->dpr.b[k])) {   /* no group to post on: the update block reduces as written */
      plan_dp_free(&p->dpr);
      return 0;
    }
  if (!p->dpr.nb) return 0;
  p->dpb = ts_xcalloc((size_t)p->dpr.nb + 1, sizeof *p->dpb);
  for (int k = 0; k < p->dpr.nb; k++) {
    const PlanDpBucket *b = &p->dpr.b[k];
    size_t es = ir_dtype_size(b->dt);
    int rs = b->op == IR_OP_REDUCE_SCATTER;
    size_t nb = ((size_t)b->count * (rs ? (size_t)b->size : 1) + 1) * es, nr = ((size_t)b->count + 1) * es;
    p->dpb[k].at = -1;
    if (p->dx) {
      RtDev *d = rt_dev_exec_dev(p->dx);
      char why[256];
      if (d->ops->alloc(d, nb, &p->dpb[k].buf, why, sizeof why) != 0 ||
          (rs && d->ops->alloc(d, nr, &p->dpb[k].recv, why, sizeof why) != 0))
        return ts_errf(err, errlen, "the dp reduction's bucket %d (%zu bytes) on %s: %s", k, nb, d->label, why);
      continue;
    }
    p->dpb[k].buf = ts_xcalloc(nb, 1);
    p->dpb[k].recv = rs ? ts_xcalloc(nr, 1) : NULL;
  }
  return 0;
}

/* dp_post on a device: the packing as copies on the comm stream. */
static int dp_post_dev(RtProgram *p, int k, char *msg, size_t n) {
  const PlanDpBucket *b = &p->dpr.b[k];
  RtDpRun *r = &p->dpb[k];
  size_t es = ir_dtype_size(b->dt);
  int dp = b->size, np = 0;
  RtDevPack *pk = ts_xmalloc(((size_t)b->n * (size_t)dp * 2 + 1) * sizeof *pk);
  for (int j = b->first; j < b->first + b->n; j++) {
    const PlanDpGrad *g = &p->dpr.g[j];
    const char *src = rt_state_dev(p, g->state);
    if (b->op == IR_OP_ALL_REDUCE) {
      pk[np++] = (RtDevPack){(size_t)g->off * es, src, (size_t)g->n * es};
      continue;
    }
    for (int q = 0; q < dp; q++) {
      int64_t lo = (int64_t)q * g->c, hi = lo + g->c < g->n ? lo + g->c : g->n;
      size_t at = ((size_t)q * (size_t)b->count + (size_t)g->off) * es, have = hi > lo ? (size_t)(hi - lo) : 0;
      if (have) pk[np++] = (RtDevPack){at, src + (size_t)lo * es, have * es};
      if (have < (size_t)g->c) pk[np++] = (RtDevPack){at + have * es, NULL, ((size_t)g->c - have) * es};
    }
  }
  int rc = rt_dev_exec_dp_post(p->dx, p, b->op, b->axes, b->dt, pk, np, r->buf, r->recv, (size_t)b->count, msg, n);
  free(pk);
  if (rc != 0) return -1;
  r->posted = 1;
  r->left = b->n;
  p->dp_buckets++;
  p->dp_grads += b->n;
  return 0;
}

static void dp_overlap_free(RtProgram *p) {
  for (int k = 0; p->dpb && k < p->dpr.nb; k++) {
    char why[256];
    rt_comm_coll_wait(&p->dpb[k].req, why, sizeof why);   /* nothing posted may outlive its buffers */
    if (p->dx) {
      RtDev *d = rt_dev_exec_dev(p->dx);
      if (p->dpb[k].buf) d->ops->free(d, p->dpb[k].buf);
      if (p->dpb[k].recv) d->ops->free(d, p->dpb[k].recv);
    } else {
      free(p->dpb[k].buf);
      free(p->dpb[k].recv);
    }
  }
  free(p->dpb);
  p->dpb = NULL;
  plan_dp_free(&p->dpr);
}

/* Bucket k's gradients from the slab into its buffer, then its collective
 * posted.  0 or -1 with a message. */
static int dp_post(RtProgram *p, int k, char *msg, size_t n) {
  const PlanDpBucket *b = &p->dpr.b[k];
  RtDpRun *r = &p->dpb[k];
  size_t es = ir_dtype_size(b->dt);
  int dp = b->size;
  double t0 = ts_now_s();
  char *buf = r->buf;
  if (p->dx) return dp_post_dev(p, k, msg, n);
  for (int j = b->first; j < b->first + b->n; j++) {
    const PlanDpGrad *g = &p->dpr.g[j];
    const char *src = (const char *)rt_state_data(p, g->state);
    if (b->op == IR_OP_ALL_REDUCE) {
      memcpy(buf + (size_t)g->off * es, src, (size_t)g->n * es);
      continue;
    }
    for (int q = 0; q < dp; q++) {   /* chunk q of the gradient, zero past its end */
      int64_t lo = (int64_t)q * g->c, hi = lo + g->c < g->n ? lo + g->c : g->n;
      char *dst = buf + ((size_t)q * (size_t)b->count + (size_t)g->off) * es;
      size_t have = hi > lo ? (size_t)(hi - lo) : 0;
      if (have) memcpy(dst, src + (size_t)lo * es, have * es);
      if (have < (size_t)g->c) memset(dst + have * es, 0, ((size_t)g->c - have) * es);
    }
  }
  RtComm *c = dp_group(p, b);
  int rc = b->op == IR_OP_ALL_REDUCE ? rt_comm_iall_reduce(c, b->dt, buf, (size_t)b->count, &r->req, msg, n)
                                     : rt_comm_ireduce_scatter(c, b->dt, buf, r->recv, (size_t)b->count, &r->req, msg, n);
  if (rc != 0) return -1;
  r->posted = 1;
  r->left = b->n;
  p->dpr_inflight++;
  p->dp_buckets++;
  p->dp_grads += b->n;
  p->dp_post_s += ts_now_s() - t0;
  return 0;
}

/* After position i of block bi ran on a last micro batch: posts the
 * buckets it completes; polls those in flight. */
static int dp_after(RtProgram *p, int bi, int i, const RtJitBlock *jb, const RtRunInfo *info, char *msg, size_t n) {
  /* MPI moves a bucket's data inside these calls, on this rank's core;
   * an idle poll may yield the core (mpi_yield_when_idle, oversubscribed
   * ranks), so at most one per RT_DP_POLL_S of backward */
  double now = p->dpr_inflight ? ts_now_s() : 0;
  if (p->dpr_inflight && now - p->dp_last_poll >= RT_DP_POLL_S) {
    for (int k = 0; k < p->dpr.nb; k++)
      if (p->dpb[k].req && rt_comm_test(&p->dpb[k].req)) p->dpr_inflight--;
    p->dp_last_poll = ts_now_s();
    p->dp_poll_s += p->dp_last_poll - now;
  }
  if (!info->last) return 0;
  for (int k = 0; k < p->dpr.nb; k++) {
    const PlanDpBucket *b = &p->dpr.b[k];
    RtDpRun *r = &p->dpb[k];
    if (b->wblock != bi || r->posted) continue;
    if (r->at < 0) {   /* where the writes of its gradients run: their nodes, or the kernels holding them */
      for (int j = b->first; j < b->first + b->n; j++) {
        int w = p->dpr.g[j].wpos, kid = jb ? jb->kern[w] : -1;
        int at = kid >= 0 ? jb->k.a[kid].at : w;
        if (at > r->at) r->at = at;
      }
    }
    if (r->at == i && dp_post(p, k, msg, n) != 0) return -1;
  }
  return 0;
}

/* Node i of update block bi, if it is the dp collective of a gradient
 * whose bucket was posted: waits for the bucket, copies the gradient's
 * part into out.  1 when done so, 0 when the node runs as written, -1
 * with a message (a device copy failed). */
static int dp_take(RtProgram *p, int bi, int i, void *out, char *msg, size_t n) {
  if (!p->dpb) return 0;
  for (int j = 0; j < p->dpr.ng; j++) {
    const PlanDpGrad *g = &p->dpr.g[j];
    if (g->ublock != bi || g->unode != i) continue;
    RtDpRun *r = &p->dpb[g->bucket];
    if (!r->posted) return 0;
    const PlanDpBucket *b = &p->dpr.b[g->bucket];
    if (r->req) {
      double t0 = ts_now_s();
      char why[256];
      rt_comm_coll_wait(&r->req, why, sizeof why);   /* a failure ends the job */
      p->dpr_inflight--;
      p->dp_wait_s += ts_now_s() - t0;
    }
    size_t es = ir_dtype_size(b->dt);
    const char *src = b->op == IR_OP_ALL_REDUCE ? r->buf : r->recv;
    if (p->dx) {   /* after the bucket's collective (the micro block's end joined it), on compute */
      RtDev *d = rt_dev_exec_dev(p->dx);
      RtDevRange rr[2] = {{src + (size_t)g->off * es, (size_t)g->c * es}, {out, (size_t)g->c * es}};
      if (rt_dev_exec_order(p->dx, rr, 2, msg, n) != 0 ||
          d->ops->d2d(d, out, src + (size_t)g->off * es, (size_t)g->c * es, RT_STREAM_COMPUTE, msg, n) != 0)
        return -1;
    } else {
      memcpy(out, src + (size_t)g->off * es, (size_t)g->c * es);
    }
    if (--r->left == 0) r->posted = 0;   /* read: free for the next step */
    return 1;
  }
  return 0;
}

/* One run of a block: where its values are, and the arena buffers held. */
typedef struct {
  RtBlockMem *bm;
  void **buf;            /* per value: its data (arena or slab), NULL once dead */
  int *refs;             /* per buffer owner: values holding the buffer, not yet released */
  unsigned char *held;   /* per value: holds an arena buffer */
  size_t live;           /* bytes of the buffers held now */
  size_t ext_live;       /* bytes of the pipeline's (ext) buffers held now: with live, what is held at
                            the loss (the plan counts both there) */
  void **xbuf;           /* per owner of an ext buffer (memplan.h): the pool buffer it holds */
  unsigned char *kept;   /* per such owner: a stash keeps its buffer (not ours to return) */
} RtRun;

/* The pipeline pool's buffers for the plan's ext values: the device's on
 * a CUDA device, the host's (ops_pipe.c, whose kernels then run the
 * pipeline) on CPU ranks and the emulator. */
static int dev_pipeline(const RtProgram *p) { return p->dx && !rt_dev_exec_dev(p->dx)->host_memory; }

static int ext_get(RtProgram *p, size_t bytes, void **q, char *msg, size_t n) {
  if (dev_pipeline(p)) return rt_dev_exec_pipe_buf(p->dx, bytes, q, msg, n);
  *q = rt_kenv_pipe_buf(&p->env, bytes);
  return 0;
}

static void ext_put(RtProgram *p, void *q, size_t bytes) {
  if (dev_pipeline(p)) rt_dev_exec_pipe_unbuf(p->dx, q, bytes);
  else rt_kenv_pipe_unbuf(&p->env, q, bytes);
}

/* Value v's buffer, where the plan puts it; held until its release.
 * NULL with a message if the plan gives v no buffer of its own (the
 * executor and the plan disagree: a bug). */
static void *claim(RtProgram *p, RtRun *r, const IrBlock *b, int v, char *msg, size_t n) {
  const MemPlan *pl = &r->bm->plan;
  if (pl->buf[v] != v) {
    snprintf(msg, n, "internal error: the memory plan gives %%%d no buffer of its own", v);
    return NULL;
  }
  if (pl->ext[v]) {   /* a pool buffer the pipeline will hand over */
    void *x;
    if (ext_get(p, pl->size[v], &x, msg, n) != 0) return NULL;
    r->buf[v] = r->xbuf[v] = x;
    r->held[v] = 1;
    r->refs[v] = 1;
    r->ext_live += pl->size[v];
    return x;
  }
  unsigned char *q = p->arena + pl->offset[v];
  if (!p->dx) RT_UNPOISON(q, value_bytes(&b->nodes[v]));
  r->buf[v] = q;
  r->held[v] = 1;
  r->refs[v] = 1;
  r->live += pl->size[v];
  if (r->live > r->bm->live) r->bm->live = r->live;
  if ((size_t)pl->offset[v] + pl->size[v] > r->bm->used) r->bm->used = (size_t)pl->offset[v] + pl->size[v];
  return q;
}

/* Value v is dead after position i.  Its buffer is free when no value
 * shares it any more, which must be where the plan said, or the plan may
 * have put a live value there: -1 with a message. */
static int release(RtProgram *p, RtRun *r, int v, int i, char *msg, size_t n) {
  r->buf[v] = NULL;
  if (!r->held[v]) return 0;
  r->held[v] = 0;
  const MemPlan *pl = &r->bm->plan;
  int o = pl->buf[v];
  if (--r->refs[o] > 0) return 0;
  if (pl->last[o] != i) {
    snprintf(msg, n, "internal error: the buffer of %%%d dies at %%%d but the memory plan says at %%%d", o, i, pl->last[o]);
    return -1;
  }
  if (pl->ext[o]) {   /* back to the pool, unless a stash keeps it */
    r->ext_live -= pl->size[o];
    if (!r->kept[o]) ext_put(p, r->xbuf[o], pl->size[o]);
    r->xbuf[o] = NULL;
    return 0;
  }
  if (!p->dx) RT_POISON(p->arena + pl->offset[o], pl->size[o]);
  r->live -= pl->size[o];
  return 0;
}

static void record_output(RtProgram *p, const char *name, double v) {
  for (int i = 0; i < p->outs.n; i++)
    if (p->outs.a[i].name == name) { p->outs.a[i].v = v; return; }
  RtOut o = {name, v};
  VEC_PUSH(p->outs, o);
}

int rt_output(const RtProgram *p, const char *name, double *value) {
  const char *s = ts_intern(name);
  for (int i = 0; i < p->outs.n; i++)
    if (p->outs.a[i].name == s) { if (value) *value = p->outs.a[i].v; return 0; }
  return -1;
}

static double load_scalar(const void *d, IrDtype t) {
  switch (t) {
  case IR_F32: return ((const float *)d)[0];
  case IR_F64: return ((const double *)d)[0];
  case IR_I32: return ((const int32_t *)d)[0];
  default: return NAN;
  }
}

/* Structural checks the executor relies on (a module that passed ir_verify
 * satisfies them; we still refuse rather than read out of bounds). */
static int check_node(const RtProgram *p, const IrBlock *b, int i, char *msg, size_t n) {
  const IrNode *nd = &b->nodes[i];
  if ((int)nd->op < 0 || nd->op >= IR_OP_COUNT) { snprintf(msg, n, "bad op %d", (int)nd->op); return -1; }
  const IrOpInfo *oi = &ir_ops[nd->op];
  if (oi->nin >= 0 ? nd->nin != oi->nin : nd->nin < 1) {
    snprintf(msg, n, "%d operands", nd->nin);
    return -1;
  }
  for (int k = 0; k < nd->nin; k++) {
    int v = nd->in[k];
    if (v < 0 || v >= i) { snprintf(msg, n, "operand %d refers to %%%d, not an earlier value", k, v); return -1; }
    if (b->nodes[v].type.dtype == IR_VOID) { snprintf(msg, n, "operand %d (%%%d) has no value", k, v); return -1; }
  }
  /* int attrs spelled "@name" in ops.def are state indices */
  const char *s = oi->iattrs;
  for (int slot = 0; *s && slot < IR_MAX_IATTR; slot++) {
    while (*s == ' ') s++;
    if (!*s) break;
    if (*s == '@') {
      int64_t st = nd->ia[slot];
      if (st < 0 || st >= p->m->states.n) { snprintf(msg, n, "state index %lld out of range", (long long)st); return -1; }
    }
    s += strcspn(s, " ");
  }
  if (!(oi->flags & OPF_EFFECT) && (nd->type.dtype == IR_VOID || ir_dtype_size(nd->type.dtype) == 0)) {
    snprintf(msg, n, "result has no dtype");
    return -1;
  }
  return 0;
}

static const RtFeed *find_feed(const RtFeed *feeds, int nfeeds, const char *name) {
  for (int i = 0; i < nfeeds; i++)
    if (feeds[i].name && name && strcmp(feeds[i].name, name) == 0) return &feeds[i];
  return NULL;
}

/* `output` on a device: the scalar copied back and recorded. */
static int device_output(RtProgram *p, int bi, int i, const IrNode *nd, const void *x, const IrType *t, char *msg,
                         size_t n) {
  if (ir_type_numel(t) != 1) { snprintf(msg, n, "output \"%s\" is not a scalar", nd->sa ? nd->sa : ""); return -1; }
  RtDev *d = p->opts.dev;
  RtDevBlockRun *g = &p->dgr[bi];
  VEC_PUSH(g->outs, i);   /* recorded after the block's final sync (dev_finish) */
  RtDevRange r = {x, ir_dtype_size(t->dtype)};
  return rt_dev_exec_order(p->dx, &r, 1, msg, n) ||
         d->ops->d2h(d, &g->slot[i], x, ir_dtype_size(t->dtype), RT_STREAM_COMPUTE, msg, n);
}

/* A stash whose operand's buffer the plan hands over (keeps it, no copy),
 * or an unstash whose result is handed over (takes the stashed buffer as
 * its own).  0 or -1 with a message. */
static int handover(RtProgram *p, const IrBlock *b, int i, RtRun *r, const RtRunInfo *info, char *msg, size_t n) {
  const IrNode *nd = &b->nodes[i];
  const MemPlan *pl = &r->bm->plan;
  const IrType *it = nd->op == IR_OP_STASH ? &b->nodes[nd->in[0]].type : NULL;
  const void *in = nd->op == IR_OP_STASH ? r->buf[nd->in[0]] : NULL;
  RtKctx k = {&p->env, b, nd, info, NULL, &nd->type, &in, &it, msg, n};
  if (nd->op == IR_OP_STASH) {
    int o = pl->buf[nd->in[0]];
    if (!r->xbuf[o]) {
      snprintf(msg, n, "internal error: the memory plan hands %%%d over but it holds no pool buffer", nd->in[0]);
      return -1;
    }
    if ((dev_pipeline(p) ? rt_dev_exec_handover(p->dx, b, nd, info, &r->xbuf[o], msg, n)
                         : rt_stash_keep(&k, r->xbuf[o])) != 0)
      return -1;
    r->kept[o] = 1;
    p->stash_handed++;
    return 0;
  }
  void *q = NULL;
  if ((dev_pipeline(p) ? rt_dev_exec_handover(p->dx, b, nd, info, &q, msg, n) : rt_unstash_take(&k, &q)) != 0)
    return -1;
  r->buf[i] = r->xbuf[i] = q;
  r->held[i] = 1;
  r->refs[i] = 1;
  r->kept[i] = 0;
  r->ext_live += pl->size[i];
  return 0;
}

/* Runs node i of block b; r->buf[] holds the live values.  0 or -1 with a
 * message in msg. */
static int run_node(RtProgram *p, const IrBlock *b, int i, RtRun *r,
                    const RtFeed *feeds, int nfeeds, const RtRunInfo *info, char *msg, size_t n) {
  const IrNode *nd = &b->nodes[i];
  void **buf = r->buf;
  if (check_node(p, b, i, msg, n) != 0) return -1;
  switch (nd->op) {
  case IR_OP_INPUT: {
    const RtFeed *f = find_feed(feeds, nfeeds, nd->sa);
    if (!f || !f->data) { snprintf(msg, n, "missing input \"%s\" (no feed of that name)", nd->sa ? nd->sa : ""); return -1; }
    void *q = claim(p, r, b, i, msg, n);   /* the arena holds every value of the block */
    if (!q) return -1;
    if (p->dx) {   /* through the node's staging buffer: the feed may change after we return */
      RtDevBlockRun *g = &p->dgr[b - p->m->blocks.a];
      if (!g->stage[i] && host_buf(p, value_bytes(nd), &g->stage[i], msg, n) != 0) return -1;
      memcpy(g->stage[i], f->data, value_bytes(nd));
      RtDev *d = p->opts.dev;
      RtDevRange w = {q, value_bytes(nd)};
      return rt_dev_exec_order(p->dx, &w, 1, msg, n) ||
             d->ops->h2d(d, q, g->stage[i], value_bytes(nd), RT_STREAM_COMPUTE, msg, n);
    }
    memcpy(q, f->data, value_bytes(nd));
    return 0;
  }
  case IR_OP_STATE: {
    const IrState *st = &p->m->states.a[nd->ia[0]];
    if (!ir_type_same_shape(&st->type, &nd->type)) {
      char a[128], c[128];
      snprintf(msg, n, "state @%s is %s but the node says %s", st->name,
               ir_type_str(&st->type, a, sizeof a), ir_type_str(&nd->type, c, sizeof c));
      return -1;
    }
    buf[i] = p->dx ? rt_state_dev(p, (int)nd->ia[0]) : rt_state_data(p, (int)nd->ia[0]);
    return 0;
  }
  default: break;
  }

  const void *in_data[64];
  const IrType *in_type[64];
  const void **ind = in_data;
  const IrType **inty = in_type;
  if (nd->nin > 64) {  /* only concat can be that wide */
    ind = ts_xmalloc((size_t)nd->nin * sizeof *ind);
    inty = ts_xmalloc((size_t)nd->nin * sizeof *inty);
  }
  for (int k = 0; k < nd->nin; k++) {
    ind[k] = buf[nd->in[k]];
    inty[k] = &b->nodes[nd->in[k]].type;
  }
  void *out = NULL;
  if (nd->op == IR_OP_STASH) p->stash_copied++;   /* (a stash handed over runs handover()) */
  if (!(ir_ops[nd->op].flags & OPF_EFFECT) && !(out = claim(p, r, b, i, msg, n))) {
    if (ind != in_data) { free(ind); free(inty); }
    return -1;
  }
  RtKctx k = {&p->env, b, nd, info, out, &nd->type, ind, inty, msg, n};
  int rc;
  if (nd->op == IR_OP_OUTPUT && nd->sa && strcmp(nd->sa, "loss") == 0 && r->live + r->ext_live > r->bm->held)
    r->bm->held = r->live + r->ext_live;
  int taken = (nd->op == IR_OP_ALL_REDUCE || nd->op == IR_OP_REDUCE_SCATTER) &&
              (ir_axes_mask(nd->ia[0]) & (1u << IR_AXIS_DP)) && p->dpb
              ? dp_take(p, (int)(b - p->m->blocks.a), i, out, msg, n) : 0;
  if (taken) {
    rc = taken < 0 ? -1 : 0;
  } else if (p->dx && nd->op == IR_OP_OUTPUT) {
    rc = device_output(p, (int)(b - p->m->blocks.a), i, nd, ind[0], inty[0], msg, n);
  } else if (p->dx) {
    rc = rt_dev_exec_node(p->dx, p, (int)(b - p->m->blocks.a), i, ind, out, info, msg, n);
  } else if (nd->op == IR_OP_OUTPUT) {
    if (ir_type_numel(inty[0]) != 1) rc = rt_kfail(&k, "output \"%s\" is not a scalar", nd->sa ? nd->sa : "");
    else { record_output(p, ts_intern(nd->sa ? nd->sa : ""), load_scalar(ind[0], inty[0]->dtype)); rc = 0; }
  } else if ((nd->op == IR_OP_ALL_REDUCE || nd->op == IR_OP_REDUCE_SCATTER) &&
             (ir_axes_mask(nd->ia[0]) & (1u << IR_AXIS_DP)) && nd->type.rank > 0 &&
             rt_rank_axes_size(&p->rank, nd->ia[0]) > 1) {
    double t0 = ts_now_s();   /* a dp reduction the update block waits for in full */
    rc = rt_ref_kernels[nd->op](&k);
    p->dp_blocking++;
    p->dp_blocking_s += ts_now_s() - t0;
  } else {
    rc = rt_ref_kernels[nd->op](&k);
  }
  if (ind != in_data) { free(ind); free(inty); }
  return rc;
}

/* The parts of one attention's backward in one pass: bufs as
 * RtJitKernel.attn_grads says. */
static int attn_grads_run(RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs, const RtRunInfo *info,
                          char *msg, size_t n) {
  const IrNode *nd = &b->nodes[K->run[0]];
  const IrType *it[8];   /* (q, k, v, o, do[, slope][, bias][, doc]), then the parts */
  int nin = nd->nin < 8 ? nd->nin : 8;
  for (int k = 0; k < nin; k++) it[k] = &b->nodes[nd->in[k]].type;
  void *out[4] = {NULL, NULL, NULL, NULL};
  for (int j = 0; j < K->nrun; j++) out[b->nodes[K->run[j]].ia[1]] = bufs[nin + j];
  RtKctx k = {&p->env, b, nd, info, NULL, &nd->type, (const void *const *)bufs, it, msg, n};
  return rt_attn_grads_run(&k, out);
}

/* Runs kernel K (at its position): reads its inputs' buffers, claims
 * its outputs'.  0 or -1 with a message. */
static int run_kernel(RtProgram *p, const IrBlock *b, const RtJitKernel *K, RtRun *r,
                      const RtRunInfo *info, char *msg, size_t n) {
  void *bufs[CG_MAX_BUFS];
  void **buf = r->buf;
  int bi = (int)(b - p->m->blocks.a);
  if (K->opt && p->dx) return rt_dev_exec_kernel(p->dx, p, bi, K, NULL, buf, info, msg, n);
  if (K->opt)   /* one launch for a run of optimizer steps: states updated in place */
    return rt_jit_run_opt(p->jit, p, b, K, buf, info, msg, n);
  for (int k = 0; k < K->io.nin; k++) {
    if (!(bufs[k] = buf[K->io.in[k]])) {
      snprintf(msg, n, "internal error: kernel input %%%d has no buffer", K->io.in[k]);
      return -1;
    }
  }
  for (int j = 0; j < K->io.nout; j++) {
    void *q = claim(p, r, b, K->io.out[j], msg, n);
    if (!q) return -1;
    bufs[K->io.nin + j] = q;
  }
  if (p->dx) return rt_dev_exec_kernel(p->dx, p, bi, K, bufs, buf, info, msg, n);
  if (K->gemm_mm) return rt_jit_run_gemm(p->jit, p, b, K, bufs, info, msg, n);   /* BLAS, beta = 1 */
  if (K->attn_grads) return attn_grads_run(p, b, K, bufs, info, msg, n);
  if (K->accum_from) return rt_accum_direct_run(p, b, K, bufs, info, msg, n);   /* into the state */
  rt_jit_run(p->jit, p, K, bufs, info);
  return 0;
}

/* Runs block bi node by node (kernels at their positions), claiming and
 * releasing buffers as the memory plan says.  On a device the work is
 * only issued (or captured); run_block_dev waits for it. */
static int walk_block(RtProgram *p, int bi, const RtFeed *feeds, int nfeeds, const RtRunInfo *info, char *err,
                      size_t errlen) {
  const IrModule *m = p->m;
  const IrBlock *b = &m->blocks.a[bi];
  const RtJitBlock *jb = p->jit ? rt_jit_block(p->jit, bi) : NULL;
  RtBlockMem *bm = &p->mem[bi];
  const int *foff = bm->rel_off, *fval = bm->rel_val;
  const MemPlan *pl = &bm->plan;
  RtRun r = {bm, ts_xcalloc((size_t)b->n + 1, sizeof *r.buf), ts_xcalloc((size_t)b->n + 1, sizeof *r.refs),
             ts_xcalloc((size_t)b->n + 1, 1), 0, 0, ts_xcalloc((size_t)b->n + 1, sizeof *r.xbuf),
             ts_xcalloc((size_t)b->n + 1, 1)};
  bm->runs++;
  char msg[512];
  int rc = 0;
  for (int i = 0; i < b->n; i++) {
    msg[0] = 0;
    int kid = jb ? jb->kern[i] : -1, bad = 0;
    if (pl->view[i]) {
      /* a reshape of a state this block never writes (memplan.h): its bytes in the slab */
      int v = b->nodes[i].in[0];
      if (!r.buf[v]) {
        snprintf(msg, sizeof msg, "internal error: the memory plan makes %%%d a view of %%%d, which is not there", i, v);
        bad = 1;
      } else r.buf[i] = r.buf[v];
    } else if (pl->buf[i] >= 0 && pl->buf[i] != i) {
      /* a reshape sharing its operand's bytes (memplan.h): nothing to run */
      int v = b->nodes[i].in[0];
      if (b->nodes[i].op != IR_OP_RESHAPE || !r.held[v] || pl->buf[v] != pl->buf[i]) {
        snprintf(msg, sizeof msg, "internal error: the memory plan shares %%%d's buffer but it is not held", v);
        bad = 1;
      } else {
        r.buf[i] = r.buf[v];
        r.held[i] = 1;
        r.refs[pl->buf[i]]++;
      }
    } else {
      if (kid >= 0 && jb->k.a[kid].at != i) continue;   /* computed by a kernel later */
      double t0 = p->profile || p->trace ? ts_now_s() : 0;
      int mark0 = p->dprof ? dev_mark(p) : -1;
      const IrNode *nd = &b->nodes[i];
      int hand = (nd->op == IR_OP_UNSTASH && pl->ext[i]) ||
                 (nd->op == IR_OP_STASH && nd->nin == 1 && nd->in[0] < i && pl->ext[nd->in[0]]);
      bad = hand       ? handover(p, b, i, &r, info, msg, sizeof msg)
            : kid >= 0 ? run_kernel(p, b, &jb->k.a[kid], &r, info, msg, sizeof msg)
                       : run_node(p, b, i, &r, feeds, nfeeds, info, msg, sizeof msg);
      if (p->profile) {
        p->op_s[b->nodes[i].op] += ts_now_s() - t0;
        p->op_n[b->nodes[i].op]++;
      }
      IrOp top = b->nodes[i].op;
      if (p->trace && p->tev.n < RT_TRACE_MAX && top != IR_OP_STATE && top != IR_OP_INPUT && top != IR_OP_OUTPUT) {
        const RtJitKernel *jk = kid >= 0 ? &jb->k.a[kid] : NULL;
        int kind = !jk ? RT_TRACE_REF : jk->gemm_mm ? RT_TRACE_GEMM_BIAS : jk->attn_grads ? RT_TRACE_ATTN_GRADS
                   : jk->accum_from ? RT_TRACE_INTO_GRAD : jk->opt ? RT_TRACE_OPT : RT_TRACE_KERNEL;
        RtTraceEvent ev = {b->name, b->nodes[i].op, i, kind, t0 - p->trace_base, ts_now_s() - t0};
        VEC_PUSH(p->tev, ev);
      }
      if (mark0 >= 0 && !bad) dev_mark_end(p, mark0, b, kid >= 0 ? &jb->k.a[kid] : NULL, nd);
    }
    /* release what position i was the last reader of (and unread results) */
    for (int f = foff[i]; f < foff[i + 1] && !bad; f++) bad = release(p, &r, fval[f], i, msg, sizeof msg);
    if (p->dpb && !bad) bad = dp_after(p, bi, i, jb, info, msg, sizeof msg);
    if (bad) {
      ts_errf(err, errlen, "block %s, %%%d = %s: %s", b->name, i, ir_ops[b->nodes[i].op].name, msg);
      rc = -1;
      break;
    }
  }
  if (rc != 0 && !p->dx) RT_POISON(p->arena, p->arena_bytes);   /* nothing is live after a run */
  for (int v = 0; v < b->n; v++)   /* after an error: the pool buffers no stash keeps */
    if (r.xbuf[v] && !r.kept[v]) ext_put(p, r.xbuf[v], pl->size[v]);
  free(r.buf);
  free(r.refs);
  free(r.held);
  free(r.xbuf);
  free(r.kept);
  return rc;
}

/* After a device run's work is issued: wait for it, then record the
 * outputs listed in outs[0..n) from their host slots. */
static int dev_finish(RtProgram *p, int bi, const int *outs, int n, char *err, size_t errlen) {
  RtDev *d = p->opts.dev;
  char why[512];
  if (d->ops->sync(d, RT_STREAM_COMPUTE, why, sizeof why) != 0)
    return ts_errf(err, errlen, "block %s on %s: %s", p->m->blocks.a[bi].name, d->label, why);
  const IrBlock *b = &p->m->blocks.a[bi];
  for (int k = 0; k < n; k++) {
    const IrNode *nd = &b->nodes[outs[k]];
    record_output(p, ts_intern(nd->sa ? nd->sa : ""),
                  load_scalar(&p->dgr[bi].slot[outs[k]], b->nodes[nd->in[0]].type.dtype));
  }
  return 0;
}

/* Whether block bi is captured as a graph: the per-micro-batch block,
 * with nothing that runs on the host, unless TS_CUDA_GRAPHS=0.  Its
 * collectives are captured with it (NCCL on the comm stream joins the
 * capture through the events that order it, and rejoins at the block's
 * end) except those with host work: any on a host-memory device (the
 * reference kernels), all_to_all_v (its counts come to the host) and the
 * pipeline's (their buffers are kept by the host). */
static int graph_ok(const RtProgram *p, int bi) {
  const char *e = getenv("TS_CUDA_GRAPHS");
  if (e && strcmp(e, "0") == 0) return 0;
  if (p->dprof) return 0;   /* every launch timed on its own */
  const IrBlock *b = &p->m->blocks.a[bi];
  if (strcmp(b->name, "micro") != 0) return 0;
  const RtDevBlock *db = &rt_dev_exec_plan(p->dx)->blk[bi];
  for (int i = 0; i < b->n; i++) {
    if (db->kind[i] != RT_DS_COMM) continue;
    if (p->opts.dev->host_memory) return 0;
    switch (b->nodes[i].op) {
    case IR_OP_ALL_REDUCE: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER: case IR_OP_ALL_TO_ALL:
    case IR_OP_RING_SHIFT: case IR_OP_RING_WAIT:
      break;
    default:
      return 0;
    }
  }
  return 1;
}

/* A block on a device: the first run issues the work node by node, the
 * second (of a block graph_ok allows) captures it as a graph and launches
 * it, later runs copy the feeds into the staging buffers and replay the
 * graph.  Every run ends with a sync and the outputs. */
static int run_block_dev(RtProgram *p, int bi, const RtFeed *feeds, int nfeeds, const RtRunInfo *info, char *err,
                         size_t errlen) {
  RtDevBlockRun *g = &p->dgr[bi];
  RtDev *d = p->opts.dev;
  const IrBlock *b = &p->m->blocks.a[bi];
  char why[512];
  if (rt_dev_exec_begin(p->dx, p, info, err, errlen) != 0) return -1;
  int posts = 0;   /* a last micro batch posting dp buckets: run eagerly (the graph posts none) */
  for (int k = 0; info->last && p->dpb && k < p->dpr.nb; k++) posts |= p->dpr.b[k].wblock == bi;
  if (g->graph && !posts) {
    for (int i = 0; i < b->n; i++) {
      if (b->nodes[i].op != IR_OP_INPUT) continue;
      const RtFeed *f = find_feed(feeds, nfeeds, b->nodes[i].sa);
      if (!f || !f->data)
        return ts_errf(err, errlen, "block %s, %%%d = input: missing input \"%s\" (no feed of that name)", b->name,
                       i, b->nodes[i].sa ? b->nodes[i].sa : "");
      memcpy(g->stage[i], f->data, value_bytes(&b->nodes[i]));
    }
    if (d->ops->graph_launch(d, g->graph, RT_STREAM_COMPUTE, why, sizeof why) != 0)
      return ts_errf(err, errlen, "block %s: replaying its graph on %s: %s", b->name, d->label, why);
    g->launches++;
    p->mem[bi].runs++;
    return dev_finish(p, bi, g->outs.a, g->outs.n, err, errlen);
  }
  int capture = !posts && g->runs == 1 && graph_ok(p, bi);
  if (capture && d->ops->graph_begin(d, RT_STREAM_COMPUTE, why, sizeof why) != 0)
    return ts_errf(err, errlen, "block %s: starting its graph capture on %s: %s", b->name, d->label, why);
  g->outs.n = 0;
  int rc = walk_block(p, bi, feeds, nfeeds, info, err, errlen);
  /* compute waits for the collectives still in flight (NCCL), so that the
   * sync below and a capture's end cover them */
  if (rc == 0 && rt_dev_exec_join(p->dx, why, sizeof why) != 0)
    rc = ts_errf(err, errlen, "block %s on %s: %s", b->name, d->label, why);
  if (!posts) g->runs++;   /* (a graph is captured on the second run that posts nothing) */
  if (capture) {
    RtDevGraph *gr = NULL;
    int e = d->ops->graph_end(d, RT_STREAM_COMPUTE, &gr, why, sizeof why);
    if (rc == 0 && e != 0) rc = ts_errf(err, errlen, "block %s: ending its graph capture on %s: %s", b->name, d->label, why);
    if (rc == 0) {
      g->graph = gr;   /* the outputs list stays: every replay reports the same */
      if (d->ops->graph_launch(d, gr, RT_STREAM_COMPUTE, why, sizeof why) != 0)
        rc = ts_errf(err, errlen, "block %s: launching its graph on %s: %s", b->name, d->label, why);
      else g->launches++;
    } else if (gr) {
      d->ops->graph_free(d, gr);
    }
  }
  if (rc != 0) {
    d->ops->sync(d, RT_STREAM_COMPUTE, why, sizeof why);   /* nothing in flight after an error */
    p->dmark.n = 0;
    if (p->dprof) d->ops->timer_reset(d);
    return -1;
  }
  rc = dev_finish(p, bi, g->outs.a, g->outs.n, err, errlen);
  if (rc == 0 && p->dprof) dev_marks_read(p, g->runs > 1);
  return rc;
}

int rt_run_block(RtProgram *p, int bi, const RtFeed *feeds, int nfeeds, const RtRunInfo *info, char *err,
                 size_t errlen) {
  if (bi < 0 || bi >= p->m->blocks.n) return ts_errf(err, errlen, "no block %d", bi);
  RtRunInfo dflt = {0, 0, p->m->train.lr, 0};
  if (!info) info = &dflt;
  if (!p->dx) refresh_copies(p, bi);   /* a device's are made on the host before each push (push_slab) */
  int rc = p->dx ? run_block_dev(p, bi, feeds, nfeeds, info, err, errlen)
                 : walk_block(p, bi, feeds, nfeeds, info, err, errlen);
  if (p->m->train.lowp != IR_VOID && writes_masters(p, bi)) p->copies_stale = !writes_copies(p, bi);
  return rc;
}

/* rt_program_exec_stats' device part: whether block "micro" replays a graph. */
int rt_program_graphs(const RtProgram *p) {
  int n = 0;
  for (int b = 0; p->dgr && b < p->m->blocks.n; b++) n += p->dgr[b].graph != NULL;
  return n;
}

/* Warmup, then cosine / linear decay to min_lr over the steps after warmup
 * (up to decay_steps, 0 meaning train.steps), then min_lr.  wsd and
 * inverse_sqrt follow Megatron's OptimizerParamScheduler with its step
 * count n = step + 1 (the step being taken, from 1):
 *   inverse_sqrt  max(min_lr, lr * sqrt(max(warmup, 1)) / sqrt(n))
 *   wsd           lr while n <= D - Dw (D = decay_steps, Dw = wsd_decay_steps),
 *                 then min_lr + f(r) (lr - min_lr), r = (n - (D - Dw)) / Dw,
 *                 f = 1 - r (linear), (1 + cos(pi r)) / 2 (cosine),
 *                 2 * 0.5^r - 1 (exponential), 1 - sqrt(r) (minus_sqrt);
 *                 min_lr after D. */
static double wsd_coef(IrWsdStyle s, double r) {
  switch (s) {
  case IR_WSD_COSINE: return 0.5 * (cos(M_PI * r) + 1.0);
  case IR_WSD_EXPONENTIAL: return 2.0 * pow(0.5, r) - 1.0;
  case IR_WSD_MINUS_SQRT: return 1.0 - sqrt(r);
  default: return 1.0 - r;
  }
}
/* The schedule over a count of units done (steps, or samples under a
 * batch-size ramp-up): n0 before this step, n1 after it; warmup W, decay
 * end D, wsd's final decay Dw in the same units. */
static double lr_at_units(const IrTrain *t, int64_t n0, int64_t n1, int64_t W, int64_t D, int64_t Dw) {
  if (W > 0 && n0 < W) return t->lr * (double)(n1 < W ? n1 : W) / (double)W;   /* (a ramp's step may cross W) */
  if (t->schedule == IR_SCHED_CONSTANT) return t->lr;
  if (t->schedule == IR_SCHED_INVSQRT) {
    double lr = t->lr * sqrt((double)(W > 1 ? W : 1)) / sqrt((double)n1);
    return lr > t->min_lr ? lr : t->min_lr;
  }
  if (t->schedule == IR_SCHED_WSD) {
    int64_t dw = Dw > 0 ? Dw : 1, start = D - dw;
    if (n1 > D) return t->min_lr;
    if (n1 <= start) return t->lr;
    return t->min_lr + wsd_coef(t->wsd_style, (double)(n1 - start) / (double)dw) * (t->lr - t->min_lr);
  }
  int64_t span = D - W;
  if (span < 1) span = 1;
  double prog = (double)(n0 - W) / (double)span;
  if (prog < 0) prog = 0;
  if (prog > 1) prog = 1;
  if (t->schedule == IR_SCHED_COSINE) return t->min_lr + 0.5 * (t->lr - t->min_lr) * (1.0 + cos(M_PI * prog));
  return t->lr - (t->lr - t->min_lr) * prog;   /* linear */
}

/* In steps; under a batch-size ramp-up in samples, as Megatron's scheduler
 * counts (it advances by each step's global batch): the iteration counts
 * (warmup, decay_steps, wsd_decay_steps) times global_batch, Megatron's
 * conversion of --lr-*-iters, and the samples consumed before and after
 * the step.  Without a ramp the two agree exactly (the same quotients). */
double rt_lr_at(const IrTrain *t, int64_t step, int64_t n0) {
  int64_t d = t->decay_steps > 0 ? t->decay_steps : t->steps;
  if (!ir_train_rampup(t)) return lr_at_units(t, step, step + 1, t->warmup, d, t->wsd_decay_steps);
  int64_t g = t->global_batch;
  return lr_at_units(t, n0, n0 + ir_train_batch_at(t, n0), t->warmup * g, d * g, t->wsd_decay_steps * g);
}

void rt_outputs_clear(RtProgram *p) { p->outs.n = 0; }
int rt_output_count(const RtProgram *p) { return p->outs.n; }
const char *rt_output_at(const RtProgram *p, int i, double *value) {
  if (i < 0 || i >= p->outs.n) return NULL;
  if (value) *value = p->outs.a[i].v;
  return p->outs.a[i].name;
}
