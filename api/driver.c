/* driver.c - the compile driver of mcc and the C API (api/session.h):
 * frontend, the layout checks, the pipeline's partition and schedule, the
 * pass pipeline, the plan, and the reports over the compiled program
 * (memory, comm, sharding, time, schedule).  Moved here from tools/mcc.c
 * so that mcc and an embedder run the same code; every message goes to
 * the session's diag stream, and nothing here exits. */
#include "api/session.h"
#include "passes/memreport.h"
#include "passes/pipe.h"
#include "passes/timereport.h"
#include "passes/dpreport.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/rt.h"
#include <errno.h>
#include <limits.h>
#include <math.h>

void api_session_init(ApiSession *a, const char *prog, FILE *diag) {
  memset(a, 0, sizeof *a);
  a->prog = prog;
  a->diag = diag;
  a->emit = "plan";
  a->cx = &a->cx_store;
  pass_ctx_init(a->cx);
  a->dp = a->steps = -1;
  mdl_options_init(&a->mdl);
  a->mdl.diag = diag;
  a->mdl.prog = prog;
}

void api_session_free(ApiSession *a) {
  free(a->defines.a);
  free(a->config_sets.a);
  free(a->train_sets.a);
  free(a->pp_layers.a);
  free(a->text);
  pass_ctx_free(a->cx);
  memset(a, 0, sizeof *a);
}

int api_pipe_views_wanted(const ApiSession *a) { return a->trace || (a->report && strcmp(a->report, "schedule") == 0); }

IrModule *api_frontend(const ApiSession *a, const MdlOptions *o) {
  return a->source ? mdl_compile_string(a->source, a->input, o) : mdl_compile_file(a->input, o);
}

/* "tp=2 dp=2 sp": the layout of m, the sizes > 1 only ("1 rank" if none). */
const char *api_layout_str(const IrModule *m, char *buf, size_t n) {
  static const IrAxis order[] = {IR_AXIS_TP, IR_AXIS_DP, IR_AXIS_PP, IR_AXIS_CP, IR_AXIS_EP};
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < 5; i++)
    if (ir_axis_size(m, order[i]) > 1 && k < n)
      k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", k ? " " : "", ir_axis_name(order[i]), ir_axis_size(m, order[i]));
  if (ir_axis_size(m, IR_AXIS_PP) > 1 && m->par.vpp > 1 && k < n)   /* the pipeline's shape */
    k += (size_t)snprintf(buf + k, n - k, " vpp=%d", m->par.vpp);
  if (ir_axis_size(m, IR_AXIS_PP) > 1 && m->par.sched > 0 && k < n)
    k += (size_t)snprintf(buf + k, n - k, " %s", ir_pipe_sched_name((IrPipeSched)m->par.sched));
  if (m->par.sp && k < n) k += (size_t)snprintf(buf + k, n - k, "%ssp", k ? " " : "");
  if (ir_axis_size(m, IR_AXIS_DP) > 1 && !m->par.zero && k < n) k += (size_t)snprintf(buf + k, n - k, " no-zero");
  if (ir_axis_size(m, IR_AXIS_DP) > 1 && m->par.zero == 3 && k < n) snprintf(buf + k, n - k, " zero3");
  if (!buf[0]) snprintf(buf, n, "unsharded");
  return buf;
}

/* Ranks of m's mesh: the product of its axis sizes. */
int64_t api_mesh_ranks(const IrModule *m) {
  int64_t n = 1;
  for (int ax = 0; ax < IR_AXIS_COUNT; ax++) n *= ir_axis_size(m, (IrAxis)ax);
  return n;
}

#define MCC_MAX_RANKS (1 << 20)

/* What this compiler can lay out, checked on the frontend's module (the
 * parallel block and the options are merged there).  0, or 1 after
 * printing "mcc: error: ...". */
static int check_layout(const ApiSession *a, const IrModule *m) {
  /* context parallelism (cp) works in its all-gather form, expert
   * parallelism (ep) for dense expert layers (docs/sharding.md), pipeline
   * parallelism (pp) as per-rank programs (docs/pipeline.md) */
  if (m->par.sp && ir_axis_size(m, IR_AXIS_TP) < 2) {
    api_diag(a, "error: sequence parallelism (--sp or sp = true) needs tensor parallelism: it splits "
                    "the sequence over the tp ranks, and tp=%d; add --tp N with N > 1\n", ir_axis_size(m, IR_AXIS_TP));
    return 1;
  }
  if (api_mesh_ranks(m) > MCC_MAX_RANKS) {
    api_diag(a, "error: the mesh has dp=%d x tp=%d x pp=%d x cp=%d x ep=%d = %lld ranks, more than the %d a plan "
                "can hold; lower one of the sizes\n", ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_TP),
             ir_axis_size(m, IR_AXIS_PP), ir_axis_size(m, IR_AXIS_CP), ir_axis_size(m, IR_AXIS_EP),
             (long long)api_mesh_ranks(m), MCC_MAX_RANKS);
    return 1;
  }
  /* each dp rank runs a whole number of the step's micro batches */
  int dp = ir_axis_size(m, IR_AXIS_DP);
  int64_t nmicro = m->train.micro_batch > 0 ? m->train.global_batch / m->train.micro_batch : 0;
  if (dp > 1 && nmicro % dp != 0) {
    api_diag(a, "error: dp=%d does not divide the %lld micro batches of a step (global_batch %lld / "
                    "micro_batch %lld): each dp rank must run the same number of them\n",
            dp, (long long)nmicro, (long long)m->train.global_batch, (long long)m->train.micro_batch);
    return 1;
  }
  char why[512];   /* and every batch of a ramp-up */
  if (ir_train_rampup_check(&m->train, m->train.micro_batch * dp, why, sizeof why) != 0) {
    api_diag(a, "error: %s (dp=%d)\n", why, dp);
    return 1;
  }
  return 0;
}

/* The pipeline options as the partition takes them; Megatron's
 * --num-layers-per-virtual-pipeline-stage N is vpp = layers / (pp * N).
 * 0, or -1 after printing why. */
static int pipe_options(const ApiSession *a, const IrModule *m, PipeOptions *po) {
  *po = (PipeOptions){ir_axis_size(m, IR_AXIS_PP), a->vpp, a->pp_layers.n ? a->pp_layers.a : NULL, a->pp_layers.n,
                      a->pp_layout, a->pp_stack};
  if (a->vstage_layers <= 0) return 0;
  PipeOptions one = {po->pp, 1, NULL, 0, NULL, a->pp_stack};
  PipePartition part;
  char err[2048];
  if (pass_pipe_partition(m, &one, &part, err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    return -1;
  }
  int L = part.nlayers, n = a->vstage_layers, pp = po->pp;
  for (int k = 0; a->pp_stack && k < part.stacks.n; k++)   /* --pp-stack: only that stack is cut into stages */
    if (strcmp(part.stacks.name[k], a->pp_stack) == 0) L = part.stacks.begin[k + 1] - part.stacks.begin[k];
  pass_pipe_partition_free(&part);
  if (L % ((long long)pp * n) != 0) {
    api_diag(a, "error: --num-layers-per-virtual-pipeline-stage %d: the model's %d layers%s%s over pp=%d stages "
                    "do not make whole chunks of %d layers (%d must be a multiple of %d x %d); values that work:",
            n, L, a->pp_stack ? " in stack " : "", a->pp_stack ? a->pp_stack : "", pp, n, L, pp, n);
    for (int k = 1; k <= L / pp; k++)
      if (L % (pp * k) == 0) fprintf(a->diag, " %d", k);
    fprintf(a->diag, "\n");
    return -1;
  }
  int vpp = L / (pp * n);
  if (a->vpp > 0 && a->vpp != vpp) {
    api_diag(a, "error: --num-layers-per-virtual-pipeline-stage %d makes vpp %d (%d layers / (pp %d x %d)), "
                    "and --vpp says %d; give one of them\n", n, vpp, L, pp, n, a->vpp);
    return -1;
  }
  po->vpp = vpp;
  return 0;
}

/* The schedule mcc builds for vpp chunks per rank: --schedule, else 1f1b,
 * interleaved when vpp >= 2. */
static PipeSchedKind pipe_kind(const ApiSession *a, int vpp) {
  if (a->schedule) return (PipeSchedKind)plan_pipe_sched_lookup(a->schedule);
  return vpp > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
}

IrPipeSched api_ir_sched_of(PipeSchedKind k) {
  return (IrPipeSched)(k + 1);   /* IrPipeSched lists the kinds in the same order, after "none" */
}

/* pp > 1, before the passes: partitions the model once to learn vpp (a
 * --pp-layout implies it), records vpp and the schedule in m->par (the
 * trainer regenerates the schedule from them), then builds every rank's
 * schedule for this step's micro batches and proves it deadlock-free, so a
 * bad --schedule / --vpp / batch combination is a compile error and never
 * a hang.  With pp = 1 the pipeline options are refused (they would do
 * nothing), except in the unsharded reference of --check / --report
 * memory (`reference`), which ignores them.  0, or 1 after printing why. */
static int pipe_prepare(const ApiSession *a, IrModule *m, int reference) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  if (pp < 2) {
    if (!reference && (a->vpp > 0 || a->vstage_layers > 0 || a->schedule || a->pp_layout || a->pp_layers.n ||
                       a->pp_stack)) {
      api_diag(a, "error: --vpp, --schedule, --pp-layers, --pp-layout, --pp-stack and "
                      "--num-layers-per-virtual-pipeline-stage shape a pipeline, and pp=1; add --pp N with N > 1\n");
      return 1;
    }
    return 0;
  }
  char err[2048];
  PipeOptions po;
  if (pipe_options(a, m, &po) != 0) return 1;
  PipePartition part;
  if (pass_pipe_partition(m, &po, &part, err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    return 1;
  }
  int vpp = part.vpp;
  pass_pipe_partition_free(&part);
  PipeSchedKind kind = pipe_kind(a, vpp);
  m->par.vpp = vpp;
  m->par.sched = api_ir_sched_of(kind);
  PipeSchedule sched;
  memset(&sched, 0, sizeof sched);
  int nmicro = 0, rc = 0;
  if (plan_pipe_nmicro(&m->train, ir_axis_size(m, IR_AXIS_DP), &nmicro, err, sizeof err) != 0 ||
      plan_pipe_schedule(kind, pp, vpp, nmicro, &sched, err, sizeof err) != 0 ||
      plan_pipe_check(&sched, err, sizeof err) != 0 ||
      plan_pipe_ramp_check(&m->train, kind, pp, vpp, ir_axis_size(m, IR_AXIS_DP), err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    rc = 1;
  }
  plan_pipe_schedule_free(&sched);
  return rc;
}

/* Frontend + layout checks + passes with options `o` and data-parallel
 * size dp (-1: the parallel block's); `o` is the user's options, or those
 * of the unsharded reference (another MdlOptions).  Returns the compiled module, or
 * NULL after printing why.  *t_front gets the frontend's wall time. */
IrModule *api_compile(const ApiSession *a, const MdlOptions *o, int dp, PassCtx *cx, double *t_front) {
  double t0 = (ts_now_s() * 1e3);
  IrModule *m = api_frontend(a, o);
  if (t_front) *t_front = (ts_now_s() * 1e3) - t0;
  if (!m) return NULL;                   /* the frontend printed the diagnostics */
  if (dp > 0) m->par.dp = dp;
  if (check_layout(a, m) != 0 || pipe_prepare(a, m, o != &a->mdl) != 0) { ir_module_free(m); return NULL; }
  if (pass_run_pipeline(m, cx) != 0) {
    /* a pass's refusal (heads not divisible by tp, ...) is the user's
     * error; "internal error: ..." is ours and says so itself */
    int internal = strncmp(cx->err, "internal error", 14) == 0;
    api_diag(a, "%s%s\n", internal ? "" : "error: ", cx->err);
    ir_module_free(m);
    return NULL;
  }
  return m;
}

/* The plan of compiled module m: the mesh of its parallel sizes; every
 * rank on program 0 (SPMD), or with pp > 1 one program per pipeline rank
 * (passes/pipeline_rank.c), each rank on the program of its pp coordinate.
 * The plan takes m (freed here when it is split).  NULL after printing why. */
Plan *api_make_plan(const ApiSession *a, IrModule *m) {
  Plan *p = plan_new();
  p->source = ts_intern(a->input);
  p->mesh = (PlanMesh){ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_PP), ir_axis_size(m, IR_AXIS_CP),
                     ir_axis_size(m, IR_AXIS_EP), ir_axis_size(m, IR_AXIS_TP)};
  p->nranks = (int)api_mesh_ranks(m);
  p->rank_program = ts_xcalloc((size_t)p->nranks, sizeof *p->rank_program);
  int pp = p->mesh.pp;
  if (pp < 2) {
    p->nprograms = 1;
    p->programs = ts_xmalloc(sizeof *p->programs);
    p->programs[0] = m;
    return p;
  }
  p->programs = ts_xcalloc((size_t)pp, sizeof *p->programs);
  char err[2048];
  for (int r = 0; r < pp; r++) {
    p->programs[r] = pass_pipeline_rank_module(m, r, err, sizeof err);
    if (!p->programs[r]) {
      api_diag(a, "%s\n", err);
      ir_module_free(m);
      plan_free(p);              /* frees the programs made so far */
      return NULL;
    }
    p->nprograms = r + 1;
  }
  for (int k = 0; k < p->nranks; k++) {
    int c[RT_AXIS_COUNT];
    rt_mesh_coords(&p->mesh, k, c);
    p->rank_program[k] = c[RT_AXIS_PP];
  }
  ir_module_free(m);
  return p;
}

/* FILE.mdl -> FILE.plan (any other name: FILE.plan appended). */
static char *default_output(const char *in) {
  size_t n = strlen(in);
  const char *slash = strrchr(in, '/');
  const char *dot = strrchr(in, '.');
  if (dot && (!slash || dot > slash) && dot != in && dot[-1] != '/') n = (size_t)(dot - in);
  char *out = ts_xmalloc(n + 6);
  memcpy(out, in, n);
  memcpy(out + n, ".plan", 6);
  return out;
}

int api_emit_text(const ApiSession *a, const char *out, const StrBuf *b) {
  if (ts_write_file(out ? out : "-", b->p ? b->p : "", b->n) != 0) {
    api_diag(a, "error: %s\n", ts_io_error());
    return 1;
  }
  return 0;
}

/* The plan must print, parse and encode back to the same bytes. */
static int check_plan_roundtrip(const ApiSession *a, const Plan *p) {
  StrBuf bin = {0}, text = {0}, bin2 = {0}, bin3 = {0};
  char err[1024];
  int rc = 1;
  plan_encode(p, &bin);
  plan_print_text(p, &text);
  Plan *q = plan_parse_text(text.p, "<plan text>", err, sizeof err);
  Plan *r = q ? plan_decode(bin.p, bin.n, err, sizeof err) : NULL;
  if (!q || !r) {
    api_diag(a, "internal error: the plan does not read back: %s\n", err);
  } else {
    plan_encode(q, &bin2);
    plan_encode(r, &bin3);
    if (bin2.n != bin.n || memcmp(bin2.p, bin.p, bin.n) != 0)
      api_diag(a, "internal error: the plan text does not parse back to the same plan\n");
    else if (bin3.n != bin.n || memcmp(bin3.p, bin.p, bin.n) != 0)
      api_diag(a, "internal error: the binary plan does not decode to the same plan\n");
    else
      rc = 0;
  }
  plan_free(q);
  plan_free(r);
  sb_free(&bin); sb_free(&text); sb_free(&bin2); sb_free(&bin3);
  return rc;
}

int api_plan_output(const ApiSession *a, const Plan *p) {
  int rc = 0;
  if (a->cx->verify_roundtrip) rc = check_plan_roundtrip(a, p);
  if (rc == 0 && strcmp(a->emit, "plan-text") == 0) {
    StrBuf b = {0};
    plan_print_text(p, &b);
    rc = api_emit_text(a, a->output, &b);
    sb_free(&b);
  } else if (rc == 0 && a->output && strcmp(a->output, "-") == 0) {   /* binary to stdout (a pipe) */
    StrBuf b = {0};
    plan_encode(p, &b);
    rc = api_emit_text(a, NULL, &b);
    sb_free(&b);
  } else if (rc == 0) {
    char err[1024];
    char *def = a->output ? NULL : default_output(a->input);
    if (plan_write(p, a->output ? a->output : def, err, sizeof err) != 0) {
      api_diag(a, "error: %s\n", err);
      rc = 1;
    }
    free(def);
  }
  return rc;
}

/* A second compilation of the same model (the unsharded reference of
 * --report memory and --check): options `o`, no dumps or prints. */
IrModule *api_compile_quiet(const ApiSession *a, const MdlOptions *o, int dp) {
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.verify_each = a->cx->verify_each;
  cx.no_fuse = a->cx->no_fuse;
  cx.no_remat = a->cx->no_remat;
  cx.precision_policy = a->cx->precision_policy;
  cx.loss_scale = a->cx->loss_scale;
  cx.initial_loss_scale = a->cx->initial_loss_scale;
  cx.min_loss_scale = a->cx->min_loss_scale;
  cx.loss_scale_window = a->cx->loss_scale_window;
  cx.hysteresis = a->cx->hysteresis;
  cx.loss_scale_flag = a->cx->loss_scale_flag;
  cx.fp8 = a->cx->fp8;
  cx.fp8_history = a->cx->fp8_history;
  cx.fp8_algo = a->cx->fp8_algo;
  cx.fp8_margin = a->cx->fp8_margin;
  cx.fp8_all_layers = a->cx->fp8_all_layers;
  cx.regather = a->cx->regather;
  cx.activation_budget = a->cx->activation_budget;
  /* auto's budget is per rank of the layout: the one-rank comparison
   * recomputes the cheap values only (the numbers are the same either way) */
  if (a->cx->recompute != PASS_RECOMPUTE_AUTO) cx.recompute = a->cx->recompute;
  cx.cp_attn = a->cx->cp_attn;
  IrModule *m = api_compile(a, o, dp, &cx, NULL);
  pass_ctx_free(&cx);
  return m;
}

/* The options of the unsharded run of the same model: one rank. */
MdlOptions api_unsharded_options(const MdlOptions *o) {
  MdlOptions u = *o;
  u.tp = u.pp = u.cp = u.ep = 1;
  u.sp = 0;
  return u;
}

/* The LLVM backend's kernel positions, as mrun's executor will find them
 * (the memory report plans what it runs). */
int api_llvm_positions(void *ctx, const IrModule *m, int block, int *at, char *err, size_t errlen) {
  (void)ctx;
  RtExecOpts o = {.backend = RT_BACKEND_LLVM};
  return rt_exec_positions(m, &o, block, at, err, errlen);
}

/* --report memory: per group of ranks, then the unsharded model's rows. */
static int report_memory(const ApiSession *a, IrModule *m, StrBuf *out) {
  int64_t n = api_mesh_ranks(m);
  IrModule *u = NULL;
  if (n > 1 || m->par.sp) {
    MdlOptions uo = api_unsharded_options(&a->mdl);
    ApiSession ua = *a;   /* one rank has no pipeline for --schedule, --vpp, ... to shape */
    ua.schedule = ua.pp_layout = ua.pp_stack = NULL;
    ua.vpp = 0;
    ua.pp_layers.n = 0;
    if (!(u = api_compile_quiet(&ua, &uo, 1))) return 1;
  }
  /* the plan's programs: SPMD (all on program 0), or one per pipeline rank */
  Plan *p = api_make_plan(a, ir_module_clone(m));
  if (!p) { ir_module_free(u); return 1; }
  char err[1024];
  int rc = pass_memplan_report_ranks_at(p->programs, p->nprograms, p->rank_program, p->nranks, u, api_llvm_positions, NULL,
                                        out, err, sizeof err);
  if (rc == 0)
    rc = pass_memplan_report_recompute(p->programs[p->rank_program[0]], a->cx->recompute, a->cx->recompute_summary,
                                       api_llvm_positions, NULL, out, err, sizeof err);
  if (rc != 0) api_diag(a, "%s\n", err);
  else pass_optimizer_report(m, out);
  plan_free(p);
  ir_module_free(u);
  return rc != 0;
}

/* ---- --report comm ----
 * What one rank communicates per training step, from the compiled program:
 * every collective node over an axis of size n > 1, counted once per run
 * of its block (the micro block, and with pipeline parallelism every
 * fwd.<g> / bwd.<g> block, runs global_batch / (micro_batch * dp) times
 * per rank per step, the update block once).  Payload = the whole tensor
 * the collective works on (all_reduce: its operand; all_gather: its
 * result; reduce_scatter: its operand); "ring" = what a rank sends with a
 * ring algorithm: 2(n-1)/n x payload for all_reduce, (n-1)/n x payload for
 * all_gather and reduce_scatter.  Pipeline point-to-point traffic: a send
 * sends its payload once; a group_sum over k pipeline ranks sends its
 * operand to the k-1 others.  With pp > 1 there is one section per
 * pipeline rank (its program). */
typedef struct {
  int64_t count;
  double payload, ring;
  double a2av_ring, a2av_uniform;   /* all_to_all_v: in `ring` at the worst routing; at uniform routing */
} CommSum;

enum { COMM_AR, COMM_AG, COMM_RS, COMM_GS, COMM_SEND, COMM_A2A, COMM_A2AV, COMM_KINDS };
static int comm_kind(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: return COMM_AR;
  case IR_OP_ALL_GATHER: return COMM_AG;
  case IR_OP_REDUCE_SCATTER: return COMM_RS;
  case IR_OP_GROUP_SUM: return COMM_GS;
  case IR_OP_SEND: return COMM_SEND;
  case IR_OP_ALL_TO_ALL: return COMM_A2A;
  case IR_OP_ALL_TO_ALL_V: return COMM_A2AV;
  case IR_OP_RING_SHIFT: return COMM_SEND;
  default: return -1;
  }
}

/* Runs of block b per step per rank.  The evaluation blocks ("eval",
 * eval.<g>: pass eval) run only when mrun validates, not in a training
 * step: 0. */
static int64_t block_runs(const IrBlock *b, int64_t nmicro) {
  IrChunkKind kind;
  int g = ir_block_chunk_kind(b, &kind);
  if (strcmp(b->name, "eval") == 0 || (g >= 0 && kind == IR_CHUNK_EVAL)) return 0;
  return strcmp(b->name, "micro") == 0 || g >= 0 ? nmicro : 1;
}

/* Node i of b as communication: its kind, axes (a mask: one axis, or a set
 * such as dp+cp), payload and ring bytes per run; 0 if it moves nothing
 * (not communication, or axes of size 1). */
static int comm_node(const IrModule *m, const IrBlock *b, int i, int *kind, int *axis, double *payload, double *ring) {
  const IrNode *nd = &b->nodes[i];
  int k = comm_kind(nd->op);
  if (k < 0) return 0;
  int ax = (int)ir_axes_mask(nd->ia[0]);
  int n = ax ? ir_axes_size(m, nd->ia[0]) : 1;
  if (n < 2) return 0;
  /* all_to_all_v: the larger of its two buffers, the worst routing (its
   * traffic follows the routing; the static plan bounds it) */
  const IrType *t = nd->op == IR_OP_ALL_GATHER ? &nd->type : &b->nodes[nd->in[0]].type;
  if (nd->op == IR_OP_ALL_TO_ALL_V && ir_type_numel(&nd->type) > ir_type_numel(t)) t = &nd->type;
  double bytes = (double)ir_type_numel(t) * (double)ir_dtype_size(t->dtype);
  *ring = k == COMM_AR ? 2.0 * (n - 1) / n * bytes
        : k == COMM_GS ? (double)(__builtin_popcountll((unsigned long long)nd->ia[1]) - 1) * bytes
        : k == COMM_SEND ? bytes : (double)(n - 1) / n * bytes;
  *payload = bytes;
  *kind = k;
  *axis = ax;
  return 1;
}

/* all_to_all_v at uniform routing: each of this rank's own routed rows
 * (the smaller buffer) goes to each rank alike, (n-1)/n of them elsewhere;
 * added to *total next to its worst-routing `ring` bytes. */
static void comm_uniform(const IrModule *m, const IrBlock *b, int i, int kind, double ring, int64_t runs,
                         CommSum *total) {
  if (kind != COMM_A2AV) return;
  const IrNode *nd = &b->nodes[i];
  const IrType *s = &b->nodes[nd->in[0]].type;
  if (ir_type_numel(&nd->type) < ir_type_numel(s)) s = &nd->type;
  int n = ir_axes_size(m, nd->ia[0]);
  total->a2av_ring += ring * (double)runs;
  total->a2av_uniform += (double)(n - 1) / n * (double)ir_type_numel(s) * (double)ir_dtype_size(s->dtype) * (double)runs;
}

static const char *comm_names[COMM_KINDS] = {"all_reduce", "all_gather", "reduce_scatter", "group_sum", "send",
                                             "all_to_all", "all_to_all_v"};

/* The rows of one program into out, added to *total. */
static void comm_rows(const IrModule *m, int64_t nmicro, StrBuf *out, CommSum *total) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int64_t runs = block_runs(b, nmicro);
    if (!runs) continue;
    CommSum row[COMM_KINDS][1u << IR_AXIS_COUNT];   /* by axis mask: one axis, or a set (dp+cp) */
    memset(row, 0, sizeof row);
    for (int i = 0; i < b->n; i++) {
      int k, ax;
      double bytes, ring;
      if (!comm_node(m, b, i, &k, &ax, &bytes, &ring)) continue;
      row[k][ax].count += runs;
      row[k][ax].payload += bytes * (double)runs;
      row[k][ax].ring += ring * (double)runs;
      comm_uniform(m, b, i, k, ring, runs, total);
    }
    for (int k = 0; k < COMM_KINDS; k++)
      for (unsigned ax = 1; ax < (1u << IR_AXIS_COUNT); ax++) {   /* masks 1, 2, 4...: the axes in order */
        const CommSum *c = &row[k][ax];
        if (!c->count) continue;
        char an[32];
        sb_printf(out, "  %-8s %-15s %-4s %10lld %16.0f %16.0f\n", b->name, comm_names[k],
                  ir_axes_str(ir_axes_attr(ax), an, sizeof an),
                  (long long)c->count, c->payload, c->ring);
        total->count += c->count;
        total->payload += c->payload;
        total->ring += c->ring;
      }
  }
}

/* ---- --report sharding (--explain-sharding) ----
 * Every communication node of the compiled program, one entry each: what
 * it moves, how often, its bytes (comm_node: --report comm's figures, and
 * the same total) and why it is there (IrNode.why, written by the pass that
 * made it: a shard conversion names the reader, the value and both
 * layouts, with the matmul rule's weighing of its operands; the ring,
 * cross-entropy and expert lowerings, remat, the optimizer's gradient
 * reductions and the pipeline's messages say what they are). */
static void sharding_rows(const IrModule *m, int64_t nmicro, StrBuf *out, CommSum *total) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int64_t runs = block_runs(b, nmicro);
    if (!runs) continue;
    for (int i = 0; i < b->n; i++) {
      int k, ax;
      double bytes, ring;
      if (!comm_node(m, b, i, &k, &ax, &bytes, &ring)) continue;
      const IrNode *nd = &b->nodes[i];
      const IrType *t = nd->op == IR_OP_ALL_GATHER ? &nd->type : &b->nodes[nd->in[0]].type;
      char ts[256], an[32];
      sb_printf(out, "  %s %%%d: %s over %s of %s, %lld per step, %.0f bytes sent per step\n      %s\n", b->name, i,
                comm_names[k], ir_axes_str(ir_axes_attr((unsigned)ax), an, sizeof an), ir_type_str(t, ts, sizeof ts), (long long)runs,
                ring * (double)runs, nd->why ? nd->why : "(no note recorded: a compiler bug, please report it)");
      total->count += runs;
      total->payload += bytes * (double)runs;
      total->ring += ring * (double)runs;
      comm_uniform(m, b, i, k, ring, runs, total);
    }
  }
}

/* The dp reduction's section of --report comm for program m (passes/dpreport.c). */
static int report_dp_overlap(const ApiSession *a, const IrModule *m, const HwDesc *hw, StrBuf *out) {
  int64_t bytes = a->dp_bucket_elems ? a->dp_bucket_elems * (int64_t)ir_dtype_size(m->train.precision)
                                     : a->dp_bucket_bytes;
  DpOverlapSum sum;
  char err[512];
  if (pass_dp_overlap_report(m, bytes, !a->no_overlap, hw, out, &sum, err, sizeof err) != 0) {
    api_diag(a, "error: --dp-bucket-size: %s\n", err);  /* internal */
    return 1;
  }
  return 0;
}

static int report_comm(const ApiSession *a, const char *kind, const IrModule *m, StrBuf *out) {
  int dp = ir_axis_size(m, IR_AXIS_DP), pp = ir_axis_size(m, IR_AXIS_PP);
  int64_t nmicro = m->train.global_batch / (m->train.micro_batch * dp);
  char lay[128];
  int explain = strcmp(kind, "sharding") == 0;
  void (*rows)(const IrModule *, int64_t, StrBuf *, CommSum *) = explain ? sharding_rows : comm_rows;
  sb_printf(out, "%s report: %s, %s (%lld ranks), %s training, per rank per step\n", explain ? "sharding" : "comm",
            m->name ? m->name : "?", api_layout_str(m, lay, sizeof lay), (long long)api_mesh_ranks(m),
            ir_dtype_name(ir_train_dtype(&m->train)));
  if (explain)
    sb_printf(out, "# every communication node of each rank's program: its block and node id (as --emit=ir prints\n"
                   "# them), what it moves, its runs and bytes sent per step (the figures of --report comm), and\n"
                   "# the note of the pass that put it there.\n");
  sb_printf(out, "# from the compiled program: each collective over an axis of size n > 1, times the runs\n"
                 "# of its block per step (micro%s: %lld per rank, update: 1).  payload = the whole tensor\n"
                 "# (all_reduce, reduce_scatter: the operand; all_gather: the result); ring = the bytes a\n"
                 "# rank sends with a ring algorithm: 2(n-1)/n x payload for all_reduce, (n-1)/n for the\n"
                 "# others.  all_to_all_v (expert parallelism's token dispatch): the larger of its static\n"
                 "# buffers, the worst routing; what travels follows the routing.  Not counted: the\n"
                 "# trainer's all-reduce of the step loss over dp (8 bytes).\n",
            pp > 1 ? " and each fwd.<g> / bwd.<g>" : "", (long long)nmicro);
  if (pp > 1)
    sb_printf(out, "# pipeline: a send sends its payload once; a group_sum over k ranks sends its operand\n"
                   "# to the k-1 others; one section per pipeline rank (its program).\n");
  if (!explain)
    sb_printf(out, "  %-8s %-15s %-4s %10s %16s %16s\n", "block", "collective", "axis", "per step", "payload bytes",
              "ring bytes sent");
  HwDesc hwd, *hw = NULL;
  if (a->hw && !explain) {
    char err[2048];
    if (hw_load(a->hw, &hwd, err, sizeof err) != 0) { api_diag(a, "error: %s\n", err); return 1; }
    hw = &hwd;
  }
  if (pp < 2) {
    CommSum total = {0};
    rows(m, nmicro, out, &total);
    sb_printf(out, "total per step: %lld collectives, payload %.0f bytes, ring %.0f bytes sent per rank\n",
              (long long)total.count, total.payload, total.ring);
    if (!explain && report_dp_overlap(a, m, hw, out) != 0) return 1;
    if (total.a2av_ring > 0)
      sb_printf(out, "total per step at uniform routing: %.0f bytes sent per rank (all_to_all_v: %.0f of the %.0f above, "
                     "(n-1)/n of the rank's own routed rows)\n",
                total.ring - total.a2av_ring + total.a2av_uniform, total.a2av_uniform, total.a2av_ring);
    if (!explain) pass_optimizer_report(m, out);
    return 0;
  }
  Plan *p = api_make_plan(a, ir_module_clone(m));
  if (!p) return 1;
  for (int r = 0; r < p->nprograms; r++) {
    CommSum total = {0};
    sb_printf(out, "pipeline rank %d:\n", r);
    rows(p->programs[r], nmicro, out, &total);
    sb_printf(out, "total per step on pipeline rank %d: %lld operations, payload %.0f bytes, %.0f bytes sent per rank\n",
              r, (long long)total.count, total.payload, total.ring);
    if (!explain) pass_pipe_p2p_report(p->programs[r], out);
    if (!explain && report_dp_overlap(a, p->programs[r], hw, out) != 0) { plan_free(p); return 1; }
    if (total.a2av_ring > 0)
      sb_printf(out, "total per step on pipeline rank %d at uniform routing: %.0f bytes sent per rank\n", r,
                total.ring - total.a2av_ring + total.a2av_uniform);
  }
  plan_free(p);
  return 0;
}

/* ---- --report time ----
 * The predicted step time of the compiled layout on a hardware description
 * (passes/timereport.c): every rank's program costed node by node; the
 * model FLOPs of MFU from the frontend's unsharded forward block. */
static int report_time(const ApiSession *a, const IrModule *m, StrBuf *out) {
  HwDesc hw;
  char err[2048];
  if (hw_load(a->hw, &hw, err, sizeof err) != 0) { api_diag(a, "error: %s\n", err); return 1; }
  IrModule *f = api_frontend(a, &a->mdl);
  if (!f) return 1;
  double model = pass_time_model_flops(f);
  ir_module_free(f);
  Plan *p = api_make_plan(a, ir_module_clone(m));
  if (!p) return 1;
  char lay[128];
  /* the dp reduction as mrun will run it: --dp-bucket-size / --ddp-bucket-size, --no-overlap-grad-reduce */
  TimeDpOpts dpo = {a->dp_bucket_elems ? a->dp_bucket_elems * (int64_t)ir_dtype_size(m->train.precision)
                                       : a->dp_bucket_bytes, !a->no_overlap};
  int rc = pass_time_report(p->programs, p->nprograms, &hw, model, api_layout_str(m, lay, sizeof lay), &dpo, out, err,
                            sizeof err);
  if (rc != 0) api_diag(a, "error: %s\n", err);
  plan_free(p);
  return rc != 0;
}

/* ---- --report schedule, --emit=trace FILE ----
 * Partitions the frontend's forward block (passes/partition.c), builds
 * and checks every pipeline rank's schedule (plan/schedule.c), then
 * runs the pass pipeline too, so the layout's other errors (a dim tp does
 * not divide, ...) are reported as for a plan.  No plan is written. */
int api_pipe_views(const ApiSession *a, PassCtx *cx, StrBuf *rep, StrBuf *tr) {
  IrModule *m = api_frontend(a, &a->mdl);
  if (!m) return 1;
  if (a->dp > 0) m->par.dp = a->dp;
  if (check_layout(a, m) != 0) { ir_module_free(m); return 1; }
  char err[2048];
  PipeOptions po;
  if (pipe_options(a, m, &po) != 0) { ir_module_free(m); return 1; }
  PipePartition part;
  PipeSchedule sched;
  memset(&sched, 0, sizeof sched);
  int nmicro = 0, rc = 1;
  if (pass_pipe_partition(m, &po, &part, err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    ir_module_free(m);
    return 1;
  }
  int kind = pipe_kind(a, part.vpp);
  if (part.pp > 1) {
    m->par.vpp = part.vpp;
    m->par.sched = api_ir_sched_of((PipeSchedKind)kind);
  }
  if (plan_pipe_nmicro(&m->train, ir_axis_size(m, IR_AXIS_DP), &nmicro, err, sizeof err) != 0 ||
      plan_pipe_schedule((PipeSchedKind)kind, part.pp, part.vpp, nmicro, &sched, err, sizeof err) != 0 ||
      plan_pipe_check(&sched, err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    goto done;
  }
  int ok = 1;
  if (a->report && pass_pipe_report(m, &part, &sched, rep, err, sizeof err) != 0) ok = 0;
  if (!ok) api_diag(a, "error: %s\n", err);
  else if (pass_run_pipeline(m, cx) != 0) {
    int internal = strncmp(cx->err, "internal error", 14) == 0;
    api_diag(a, "%s%s\n", internal ? "" : "error: ", cx->err);
    ok = 0;
  }
  /* the trace: with --hw each chunk's predicted seconds, from the compiled
   * fwd.<g> / bwd.<g> blocks (the one place per-op seconds come from:
   * passes/timereport.c); one rank without chunk blocks: its micro block
   * split 1 : 2 */
  double *fs = NULL, *bs = NULL, *ws = NULL;
  if (ok && a->trace && a->hw) {
    HwDesc hw;
    int nch = part.pp * part.vpp;
    fs = ts_xcalloc((size_t)nch, sizeof *fs);
    bs = ts_xcalloc((size_t)nch, sizeof *bs);
    ws = ts_xcalloc((size_t)nch, sizeof *ws);
    if (hw_load(a->hw, &hw, err, sizeof err) != 0) {
      api_diag(a, "error: %s\n", err);
      ok = 0;
    } else if (pass_time_chunks(m, &hw, nch, fs, bs, ws) != 0) {
      for (int i = 0; i < m->blocks.n; i++)
        if (!strcmp(m->blocks.a[i].name, "micro")) {
          TimeCost c = {0};
          pass_time_block(m, &m->blocks.a[i], &hw, hw_format_of(ir_train_dtype(&m->train), 0), &c);
          fs[0] = time_cost_total(&c) / 3;
          bs[0] = 2 * fs[0];
        }
    }
  }
  if (ok && a->trace && pass_pipe_trace(&part, &sched, fs, bs, ws, tr, err, sizeof err) != 0) {
    api_diag(a, "error: %s\n", err);
    ok = 0;
  }
  free(fs);
  free(bs);
  free(ws);
  if (ok) rc = 0;
done:
  plan_pipe_schedule_free(&sched);
  pass_pipe_partition_free(&part);
  ir_module_free(m);
  return rc;
}


IrModule *api_compile_main(ApiSession *a, double *t_front) {
  IrModule *m = api_compile(a, &a->mdl, a->dp, a->cx, t_front);
  if (!m || !a->report || strcmp(a->report, "time") || a->gpus <= 0 || a->gpus == api_mesh_ranks(m)) return m;
  /* --gpus N: the same layout with dp = N / (tp pp cp ep) */
  int64_t replica = api_mesh_ranks(m) / ir_axis_size(m, IR_AXIS_DP);
  ir_module_free(m);
  if (a->gpus % replica != 0) {
    api_diag(a, "error: --gpus %d is not a multiple of the %lld ranks of one data-parallel replica (tp*pp*cp*ep); "
                "use a multiple of %lld (--gpus %lld gives dp=1)\n", a->gpus, (long long)replica, (long long)replica,
             (long long)replica);
    return NULL;
  }
  return api_compile(a, &a->mdl, (int)(a->gpus / replica), a->cx, NULL);
}

int api_report(const ApiSession *a, const char *kind, IrModule *m, StrBuf *out) {
  if (strcmp(kind, "memory") == 0) return report_memory(a, m, out);
  if (strcmp(kind, "time") == 0) return report_time(a, m, out);
  return report_comm(a, kind, m, out);   /* comm, sharding */
}
