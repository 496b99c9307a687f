/* pipereport.c - the views of a pipeline schedule (pipe.h): the text of
 * `mcc --report schedule` and the Chrome / Perfetto trace of
 * `--emit=trace`, from the partition's costs and the timeline simulation
 * (plan/schedule.h). */
#include "pipe.h"
#include "memreport.h"
#include <math.h>
static void si(double x, char *buf, size_t n) {
  const char *u[] = {"", "k", "M", "G", "T", "P", "E"};
  int k = 0;
  while (fabs(x) >= 1000 && k < 6) { x /= 1000; k++; }
  snprintf(buf, n, "%.3g%s", x, u[k]);
}

/* Forward time of each chunk from the partition's costs: a chunk's cost is
 * forward + backward (3 x forward), so f = cost / 3 and b = 2 f. */
static double *chunk_fwd(const PipePartition *p) {
  double *f = ts_xcalloc((size_t)p->nchunks, sizeof *f);
  for (int g = 0; g < p->nchunks; g++)
    for (int u = p->chunk_begin[g]; u < p->chunk_begin[g + 1]; u++) f[g] += p->cost[u] / 3;
  return f;
}

static void step_label(const PipeSchedule *s, const PipeStep *st, char *buf, size_t n) {
  if (s->vpp > 1) snprintf(buf, n, "%c%d%c", st->kind, st->micro, 'a' + (st->chunk / s->pp) % 26);
  else snprintf(buf, n, "%c%d", st->kind, st->micro);
}

int pass_pipe_report(const IrModule *m, const PipePartition *p, const PipeSchedule *s, StrBuf *out, char *err,
                     size_t errlen) {
  char a[32], b[32], c[32];
  sb_printf(out, "schedule report: %s, pp=%d vpp=%d, %s, %d micro batches per step\n", m->name ? m->name : "?", s->pp,
            s->vpp, plan_pipe_sched_name(s->kind), s->nmicro);
  if (p->stacks.n > 1) {
    sb_printf(out, "# partition of the repeat stacks");
    for (int k = 0; k < p->stacks.n; k++)
      sb_printf(out, "%s'%s' (%d layers)", k ? " then " : " ", p->stacks.name[k], p->stacks.begin[k + 1] - p->stacks.begin[k]);
    sb_printf(out, ", cut in that order (E = before them, L = after them).  Per micro batch:\n");
  } else {
    sb_printf(out, "# partition of the repeat stack '%s' (%d layers; E = before it, L = after it).  Per micro batch:\n",
              p->stack, p->nlayers);
  }
  sb_printf(out, "# flops = forward + backward (3 x forward; matmul 2MNK), act bytes = forward values kept for the\n"
                 "# backward, cost = flops + %g x bytes; sent = bytes of activations crossing to the next chunk\n",
            PIPE_FLOPS_PER_BYTE);
  sb_printf(out, "  %-5s %-4s %-28s %10s %10s %10s %10s\n", "chunk", "rank", "units", "flops", "act bytes", "cost",
            "sent");
  double *rank_cost = ts_xcalloc((size_t)p->pp, sizeof *rank_cost);
  for (int g = 0; g < p->nchunks; g++) {
    double fl = 0, by = 0, co = 0;
    for (int u = p->chunk_begin[g]; u < p->chunk_begin[g + 1]; u++) { fl += p->flops[u]; by += p->bytes[u]; co += p->cost[u]; }
    rank_cost[g % p->pp] += co;
    char units[96], sent[32] = "-";
    pass_pipe_chunk_str(p, g, units, sizeof units);
    if (g + 1 < p->nchunks) si(p->cut_bytes[p->chunk_begin[g + 1] - 1 < 0 ? 0 : p->chunk_begin[g + 1] - 1], sent, sizeof sent);
    si(fl, a, sizeof a), si(by, b, sizeof b), si(co, c, sizeof c);
    sb_printf(out, "  %-5d %-4d %-28s %10s %10s %10s %10s\n", g, g % p->pp, units, a, b, c, sent);
  }
  for (int r = 0; r < p->pp; r++) {
    si(rank_cost[r], c, sizeof c);
    sb_printf(out, "  rank %d: cost %s\n", r, c);
  }
  free(rank_cost);
  if (p->nshared) {
    sb_printf(out, "  shared across pipeline ranks (gradients all-reduced in an embedding group):");
    for (int i = 0; i < p->nshared; i++) sb_printf(out, " %s", p->shared[i]);
    sb_printf(out, "\n");
  }
  /* the time grid: f = 1, b = 2 per chunk */
  PipeTimeline t, tc;
  if (plan_pipe_simulate(s, NULL, 2, &t, err, errlen) != 0) return -1;
  double *fw = chunk_fwd(p);
  int rc = plan_pipe_simulate(s, fw, 2, &tc, err, errlen);
  free(fw);
  if (rc != 0) { plan_pipe_timeline_free(&t); return -1; }
  int w = 0;
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->nsteps[r]; i++) {
      char l[32];
      step_label(s, &s->steps[r][i], l, sizeof l);
      if ((int)strlen(l) > w) w = (int)strlen(l);
    }
  w++;
  int split = plan_pipe_sched_splits_bwd(s->kind);
  sb_printf(out, "timeline (each cell one time unit: forward 1, backward 2 per chunk%s; '.' idle%s):\n",
            split ? " = B (input gradient) 1 + W (weight gradients) 1" : "",
            s->vpp > 1 ? "; letter = the rank's chunk" : "");
  for (int r = 0; r < s->pp; r++) {
    sb_printf(out, "  rank %-3d|", r);
    double now = 0;
    for (int i = 0; i < s->nsteps[r]; i++) {
      for (; now + 0.5 < t.start[r][i]; now += 1) sb_printf(out, "%-*s", w, ".");
      char l[32];
      step_label(s, &s->steps[r][i], l, sizeof l);
      int cells = (int)lround(t.end[r][i] - t.start[r][i]);
      sb_printf(out, "%-*s", w * cells, l);
      now = t.end[r][i];
    }
    for (; now + 0.5 < t.makespan; now += 1) sb_printf(out, "%-*s", w, ".");
    sb_printf(out, "|\n");
  }
  sb_printf(out, "bubble (idle / busy, from the simulated timeline; communication free):\n");
  for (int r = 0; r < s->pp; r++)
    sb_printf(out, "  rank %-3d f=1,b=2 %.4f   estimated costs %.4f\n", r, plan_pipe_bubble(&t, r),
              plan_pipe_bubble(&tc, r));
  double formula = (double)(s->pp - 1) / ((double)s->vpp * s->nmicro);
  if (split)   /* Qi et al.: (p-1)(F+B-W) idle against m(F+B+W) busy */
    sb_printf(out, "  (p-1)/(3*m) = %.4f (F = B = W: a third of 1f1b's (p-1)/m = %.4f)\n", formula / 3, formula);
  else
    sb_printf(out, "  (p-1)/(v*m) = %.4f\n", formula);
  sb_printf(out, "in flight (micro batches whose activations a rank holds at once%s; chunk activations):\n",
            split ? ", from F until W: B keeps what W reads" : "");
  double worst = 0, worst_c = 0;
  int peak = 0;
  for (int r = 0; r < s->pp; r++) {
    sb_printf(out, "  rank %-3d peak %d micro batches, %d chunk activations\n", r, t.peak_micro[r], t.peak_chunks[r]);
    if (plan_pipe_bubble(&t, r) > worst) worst = plan_pipe_bubble(&t, r);
    if (plan_pipe_bubble(&tc, r) > worst_c) worst_c = plan_pipe_bubble(&tc, r);
    if (t.peak_micro[r] > peak) peak = t.peak_micro[r];
  }
  sb_printf(out, "summary: %s bubble %.4f (worst rank, f=1,b=2), peak in flight %d micro batches (worst rank); "
                 "estimated costs: bubble %.4f (worst rank)\n", plan_pipe_sched_name(s->kind), worst, peak, worst_c);
  plan_pipe_timeline_free(&t);
  plan_pipe_timeline_free(&tc);
  return 0;
}

int pass_pipe_trace(const PipePartition *p, const PipeSchedule *s, const double *fwd_s, const double *bwd_s, const double *wgt_s,
                    StrBuf *out, char *err, size_t errlen) {
  double *fw = fwd_s ? NULL : chunk_fwd(p);
  PipeTimeline t;
  int rc = fwd_s ? plan_pipe_simulate_fbw(s, fwd_s, bwd_s, plan_pipe_sched_splits_bwd(s->kind) ? wgt_s : NULL, 2, &t, err,
                                          errlen)
                 : plan_pipe_simulate(s, fw, 2, &t, err, errlen);
  free(fw);
  if (rc != 0) return -1;
  /* time in us: predicted seconds (passes/timereport.c on a hardware
   * description), else the partition's flop-equivalents at an assumed
   * 1 TFLOP/s */
  const double us = fwd_s ? 1e6 : 1e-6;
  sb_printf(out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  sb_printf(out, "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"pipeline %s pp=%d "
                 "vpp=%d m=%d\"}}", plan_pipe_sched_name(s->kind), s->pp, s->vpp, s->nmicro);
  for (int r = 0; r < s->pp; r++)
    sb_printf(out, ",\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"pp rank %d\"}}", r, r);
  for (int r = 0; r < s->pp; r++)
    for (int i = 0; i < s->nsteps[r]; i++) {
      const PipeStep *st = &s->steps[r][i];
      char l[32], units[96];
      step_label(s, st, l, sizeof l);
      pass_pipe_chunk_str(p, st->chunk, units, sizeof units);
      sb_printf(out, ",\n  {\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.6f, "
                     "\"dur\": %.6f, \"args\": {\"micro\": %d, \"chunk\": %d, \"units\": \"%s\"}}",
                l, st->kind == 'F' ? "forward" : st->kind == 'B' ? "backward" : "weight gradient", r, t.start[r][i] * us,
                (t.end[r][i] - t.start[r][i]) * us, st->micro, st->chunk, units);
    }
  sb_printf(out, "\n]}\n");
  plan_pipe_timeline_free(&t);
  return 0;
}

void pass_pipe_p2p_report(const IrModule *prog, StrBuf *out) {
  int pp = ir_axis_size(prog, IR_AXIS_PP), vpp = prog->par.vpp > 0 ? prog->par.vpp : 1, K = pp * vpp;
  int tp = ir_axis_size(prog, IR_AXIS_TP), cp = ir_axis_size(prog, IR_AXIS_CP);
  double bytes = 0, h = 0, hf = 0;
  int nsend = 0, nmeg = 0;
  IrDtype dt = IR_VOID;
  int mixed = 0;
  for (int bi = 0; bi < prog->blocks.n; bi++) {
    const IrBlock *b = &prog->blocks.a[bi];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind);
    if (g < 0 || (kind != IR_CHUNK_FWD && kind != IR_CHUNK_BWD)) continue;
    /* Megatron: a forward chunk sends to the next unless it is the last,
     * a backward one to the previous unless it is the first */
    nmeg += kind == IR_CHUNK_FWD ? g + 1 < K : g > 0;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (nd->op != IR_OP_SEND) continue;
      const IrNode *x = &b->nodes[nd->in[0]];
      nsend++;
      bytes += (double)ir_type_numel(&x->type) * (double)ir_dtype_size(x->type.dtype);
      if (dt == IR_VOID) dt = x->type.dtype;
      else if (dt != x->type.dtype) mixed = 1;
      /* h from a forward message (the activation), else a backward one
       * (its gradient, the same shape: the last rank sends only those) */
      if (kind == IR_CHUNK_FWD ? !hf : !h) *(kind == IR_CHUNK_FWD ? &hf : &h) = pass_global_numel(prog, x);
    }
  }
  if (!nsend) return;
  double s = (double)prog->train.seq_len, mb = (double)prog->train.micro_batch;
  IrDtype ed = prog->train.lowp != IR_VOID ? prog->train.lowp : prog->train.precision;
  double e = (double)ir_dtype_size(ed);
  if (hf) h = hf;
  h = s * mb > 0 ? h / (s * mb) : 0;
  double sl = s / cp / (prog->par.sp ? tp : 1), meg = sl * mb * h * e;
  sb_printf(out, "  pipeline p2p per micro batch: %d send%s, %.0f bytes (%s); Megatron's closed form: %d x s b h e = "
            "%d x %g x %g x %g x %g = %.0f bytes (s = seq_len%s%s, e = %s's %g bytes)\n", nsend, nsend == 1 ? "" : "s", bytes,
            mixed ? "mixed dtypes" : ir_dtype_name(dt), nmeg, nmeg, sl, mb, h, e, meg * nmeg, cp > 1 ? " / cp" : "",
            prog->par.sp && tp > 1 ? " / tp (sp)" : "", ir_dtype_name(ed), e);
}
