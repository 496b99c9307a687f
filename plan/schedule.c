/* schedule.c - pipeline schedules (GPipe, 1F1B, interleaved 1F1B), their
 * send/recv ops, the cross-rank checker and the timeline simulation
 * (schedule.h; docs/pipeline.md).  mcc reports them; mrun's trainer
 * generates the schedule it runs from the same code, for the dp it runs at.
 *
 * The schedules follow the published algorithms (GPipe: all forwards,
 * then all backwards; 1F1B: PipeDream-flush as in Megatron-LM, warm-up of
 * pp - r - 1 forwards; interleaved: Megatron-LM's virtual pipeline, warm-up
 * of 2 (pp - r - 1) + (vpp - 1) pp chunk forwards, chunk order cycling
 * every pp micro batches; zb-h1: Qi et al. 2023's handcrafted schedule,
 * below).  Nothing here trusts them: plan_pipe_check
 * proves each generated schedule matched and deadlock-free, and the tests
 * measure their bubbles from the simulated timeline. */
#include "plan/schedule.h"
#include <math.h>

static const char *const sched_names[PIPE_SCHED_COUNT] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
int plan_pipe_sched_splits_bwd(PipeSchedKind k) { return k == PIPE_ZBH1; }
const char *plan_pipe_sched_name(PipeSchedKind k) { return k < PIPE_SCHED_COUNT ? sched_names[k] : "?"; }
int plan_pipe_sched_lookup(const char *name) {
  for (int i = 0; name && i < PIPE_SCHED_COUNT; i++)
    if (strcmp(name, sched_names[i]) == 0) return i;
  return -1;
}

int plan_pipe_program_sched(const IrParallel *par, PipeSchedKind *kind) {
  int vpp = par->vpp > 1 ? par->vpp : 1;
  if (par->sched > IR_PIPE_NONE && par->sched < IR_PIPE_COUNT) *kind = (PipeSchedKind)(par->sched - 1);
  else if (par->sched == IR_PIPE_NONE) *kind = vpp > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;   /* mcc's defaults */
  else return -1;
  return 0;
}

int plan_pipe_nmicro(const IrTrain *t, int dp, int *nmicro, char *err, size_t errlen) {
  if (dp < 1) dp = 1;
  int64_t per = t->micro_batch * (int64_t)dp;
  if (t->micro_batch < 1 || t->global_batch < 1 || t->global_batch % per != 0)
    return ts_errf(err, errlen, "pipeline: the micro batches per step, global_batch %lld / (micro_batch %lld x dp %d), "  /* internal */
                                "is not a whole number", (long long)t->global_batch, (long long)t->micro_batch, dp);
  if (t->global_batch / per > (1 << 20))
    return ts_errf(err, errlen, "pipeline: global_batch %lld / (micro_batch %lld x dp %d) = %lld micro batches per "
                   "step, more than the %d a pipeline schedule holds: raise micro_batch or dp, or lower global_batch",
                   (long long)t->global_batch, (long long)t->micro_batch, dp, (long long)(t->global_batch / per),
                   1 << 20);
  *nmicro = (int)(t->global_batch / per);
  return 0;
}

int plan_pipe_ramp_check(const IrTrain *t, PipeSchedKind kind, int pp, int vpp, int dp, char *err, size_t errlen) {
  if (!ir_train_rampup(t) || t->rampup_incr < 1) return 0;
  for (int64_t b = t->rampup_start; b < t->global_batch; b += t->rampup_incr) {
    IrTrain tb = *t;
    tb.global_batch = b;
    PipeSchedule s;
    memset(&s, 0, sizeof s);
    char why[512];
    int n = 0;
    int ok = plan_pipe_nmicro(&tb, dp, &n, why, sizeof why) == 0 &&
             plan_pipe_schedule(kind, pp, vpp, n, &s, why, sizeof why) == 0 && plan_pipe_check(&s, why, sizeof why) == 0;
    plan_pipe_schedule_free(&s);
    if (!ok)
      return ts_errf(err, errlen, "--rampup-batch-size %lld %lld %lld: the ramp's global batch %lld gives %d micro "
                     "batches per dp rank (micro_batch %lld, dp %d), which the pipeline (pp=%d, vpp=%d, --schedule %s) "
                     "cannot run: %s; start the ramp higher", (long long)t->rampup_start, (long long)t->rampup_incr,
                     (long long)t->rampup_samples, (long long)b, n, (long long)t->micro_batch, dp, pp, vpp,
                     plan_pipe_sched_name(kind), why);
  }
  return 0;
}

void plan_pipe_schedule_free(PipeSchedule *s) {
  for (int r = 0; s->steps && r < s->pp; r++) free(s->steps[r]);
  free(s->steps);
  free(s->nsteps);
  memset(s, 0, sizeof *s);
}

static void push(PipeSchedule *s, int r, char kind, int micro, int chunk) {
  s->steps[r][s->nsteps[r]++] = (PipeStep){kind, micro, chunk};
}

/* Interleaved: the k-th forward (or backward) of rank r, in Megatron's
 * order: groups of pp micro batches go through the local chunks in turn
 * (backwards: the chunks in reverse). */
static void interleaved_step(const PipeSchedule *s, int r, int k, int fwd, int *micro, int *chunk) {
  int p = s->pp, v = s->vpp;
  int local = (k % (p * v)) / p;
  if (!fwd) local = v - 1 - local;
  *micro = (k / (p * v)) * p + k % p;
  *chunk = local * p + r;
}

/* ZB-H1 (Qi et al. 2023, section 3.1) on rank r: 1F1B's order of F and B
 * (warm-up of pp - r - 1 forwards, then one F and one B, then the
 * remaining B), with rank r's W steps starting r micro batches late: W of
 * micro j follows B of micro j + r.  Every rank then holds at most pp
 * micro batches between F and W -- 1F1B's peak, which is its first rank's
 * -- and the deferred W steps fill the cool-down, where 1F1B's ranks wait
 * for gradients: with F = B = W the bubble is (pp - 1) units, a third of
 * 1F1B's (pp - 1)(F + B + W).  The B steps run as early as 1F1B's, so
 * the gradients reach the first rank sooner. */
static void zbh1_rank(PipeSchedule *s, int r) {
  int pp = s->pp, m = s->nmicro, lag = r, nw = 0;
  int warm = pp - r - 1 < m ? pp - r - 1 : m;
  for (int j = 0; j < warm; j++) push(s, r, 'F', j, r);
  for (int i = 0; i < m; i++) {
    if (i + warm < m) push(s, r, 'F', i + warm, r);
    push(s, r, 'B', i, r);
    if (nw <= i - lag) push(s, r, 'W', nw++, r);
  }
  while (nw < m) push(s, r, 'W', nw++, r);
}

int plan_pipe_schedule(PipeSchedKind kind, int pp, int vpp, int nmicro, PipeSchedule *out, char *err,
                       size_t errlen) {
  memset(out, 0, sizeof *out);
  if (pp < 1 || vpp < 1 || nmicro < 1)
    return ts_errf(err, errlen, "pipeline: pp=%d, vpp=%d and %d micro batches: each must be at least 1", pp, vpp,
                   nmicro);  /* internal */
  if (kind == PIPE_INTERLEAVED && (vpp < 2 || pp < 2))
    return ts_errf(err, errlen, "--schedule interleaved needs pp >= 2 and --vpp V >= 2 (pp=%d, vpp=%d)", pp, vpp);
  if (kind != PIPE_INTERLEAVED && vpp != 1)
    return ts_errf(err, errlen, "--schedule %s runs one chunk per rank, and vpp=%d: use --schedule interleaved",
                   plan_pipe_sched_name(kind), vpp);
  if ((kind == PIPE_1F1B || kind == PIPE_ZBH1) && nmicro < pp)
    return ts_errf(err, errlen, "--schedule %s with pp=%d needs at least %d micro batches per step, and there are "
                                "%d: raise global_batch or lower micro_batch (or use gpipe)", plan_pipe_sched_name(kind),
                   pp, pp, nmicro);
  if (kind == PIPE_INTERLEAVED && nmicro % pp != 0)
    return ts_errf(err, errlen, "--schedule interleaved needs the micro batches per step (%d) to be a multiple of "
                                "pp=%d", nmicro, pp);
  if ((double)nmicro * vpp * 2 * pp > 1e8)
    return ts_errf(err, errlen, "pipeline: pp=%d x vpp=%d x %d micro batches: the schedules are too long to build",
                   pp, vpp, nmicro);
  out->kind = kind;
  out->pp = pp;
  out->vpp = vpp;
  out->nmicro = nmicro;
  out->nsteps = ts_xcalloc((size_t)pp, sizeof *out->nsteps);
  out->steps = ts_xcalloc((size_t)pp, sizeof *out->steps);
  int total = nmicro * vpp;                  /* forwards (and backwards) per rank */
  for (int r = 0; r < pp; r++) {
    out->steps[r] = ts_xmalloc((size_t)3 * total * sizeof **out->steps);
    if (kind == PIPE_GPIPE) {
      for (int m = 0; m < nmicro; m++) push(out, r, 'F', m, r);
      for (int m = 0; m < nmicro; m++) push(out, r, 'B', m, r);
    } else if (kind == PIPE_1F1B) {
      int warm = pp - r - 1 < nmicro ? pp - r - 1 : nmicro;
      for (int m = 0; m < warm; m++) push(out, r, 'F', m, r);
      for (int i = 0; i < nmicro - warm; i++) {
        push(out, r, 'F', warm + i, r);
        push(out, r, 'B', i, r);
      }
      for (int i = nmicro - warm; i < nmicro; i++) push(out, r, 'B', i, r);
    } else if (kind == PIPE_ZBH1) {
      zbh1_rank(out, r);
    } else {
      int warm = nmicro == pp ? total : 2 * (pp - r - 1) + (vpp - 1) * pp;
      if (warm > total) warm = total;
      int m, c;
      for (int k = 0; k < warm; k++) { interleaved_step(out, r, k, 1, &m, &c); push(out, r, 'F', m, c); }
      for (int k = 0; k < total - warm; k++) {
        interleaved_step(out, r, k + warm, 1, &m, &c);
        push(out, r, 'F', m, c);
        interleaved_step(out, r, k, 0, &m, &c);
        push(out, r, 'B', m, c);
      }
      for (int k = total - warm; k < total; k++) { interleaved_step(out, r, k, 0, &m, &c); push(out, r, 'B', m, c); }
    }
  }
  return 0;
}

/* ---- send/recv ---- */

int plan_pipe_rank_ops(const PipeSchedule *s, int r, PipeOp **ops) {
  int last = s->pp * s->vpp - 1, n = 0;
  *ops = ts_xmalloc((size_t)(3 * s->nsteps[r] + 1) * sizeof **ops);
  for (int i = 0; i < s->nsteps[r]; i++) {
    const PipeStep *st = &s->steps[r][i];
    int g = st->chunk, fwd = st->kind == 'F';
    if (st->kind == 'W') {   /* weight gradients: nothing received, nothing sent */
      (*ops)[n++] = (PipeOp){PIPE_OP_COMPUTE, -1, 'W', st->micro, g, i};
      continue;
    }
    int from = fwd ? g - 1 : g + 1, to = fwd ? g + 1 : g - 1;   /* neighbour chunks */
    char what = fwd ? 'a' : 'g';
    if (from >= 0 && from <= last && from % s->pp != r)
      (*ops)[n++] = (PipeOp){PIPE_OP_RECV, from % s->pp, what, st->micro, fwd ? g - 1 : g, i};
    (*ops)[n++] = (PipeOp){PIPE_OP_COMPUTE, -1, st->kind, st->micro, g, i};
    if (to >= 0 && to <= last && to % s->pp != r)
      (*ops)[n++] = (PipeOp){PIPE_OP_SEND, to % s->pp, what, st->micro, fwd ? g : g - 1, i};
  }
  return n;
}

static void msg_str(const PipeOp *o, char *buf, size_t n) {
  snprintf(buf, n, "%s of micro batch %d across chunks %d|%d", o->what == 'a' ? "activation" : "gradient", o->micro,
           o->edge, o->edge + 1);
}

static int same_msg(const PipeOp *a, const PipeOp *b) {
  return a->what == b->what && a->micro == b->micro && a->edge == b->edge;
}

typedef struct {
  int pp;
  int *nops;
  PipeOp **ops;
} RankOps;

/* Messages only go to the neighbours on the pp ring (chunk g's ranks are
 * g % pp), so links are indexed (src, 0 = to src + 1, 1 = to src - 1);
 * with pp = 2 both neighbours are one rank and one link. */
static int link_of(int pp, int src, int dst) {
  return 2 * src + (dst == (src + 1) % pp ? 0 : 1);
}

static void rank_ops_free(RankOps *ro) {
  for (int r = 0; r < ro->pp; r++) free(ro->ops[r]);
  free(ro->ops);
  free(ro->nops);
}

static void rank_ops_build(const PipeSchedule *s, RankOps *ro) {
  ro->pp = s->pp;
  ro->nops = ts_xcalloc((size_t)s->pp, sizeof *ro->nops);
  ro->ops = ts_xcalloc((size_t)s->pp, sizeof *ro->ops);
  for (int r = 0; r < s->pp; r++) ro->nops[r] = plan_pipe_rank_ops(s, r, &ro->ops[r]);
}

/* Per step validity: chunks of the rank, micro batches in range, one F and
 * one B per (micro, chunk), B after F. */
static int check_steps(const PipeSchedule *s, char *err, size_t errlen) {
  int nch = s->pp * s->vpp;
  size_t cells = (size_t)nch * (size_t)s->nmicro;
  int *fpos = ts_xmalloc(cells * sizeof *fpos), *bpos = ts_xmalloc(cells * sizeof *bpos);
  int *wpos = ts_xmalloc(cells * sizeof *wpos), split = plan_pipe_sched_splits_bwd(s->kind);
  for (size_t i = 0; i < cells; i++) fpos[i] = bpos[i] = wpos[i] = -1;
  int rc = 0;
  for (int r = 0; r < s->pp && rc == 0; r++)
    for (int i = 0; i < s->nsteps[r] && rc == 0; i++) {
      const PipeStep *st = &s->steps[r][i];
      if (st->kind != 'F' && st->kind != 'B' && !(split && st->kind == 'W')) {
        rc = ts_errf(err, errlen, "pipeline schedule: rank %d step %d has kind '%c' (%s expected)", r, i, st->kind,  /* internal */
                     split ? "F, B or W" : "F or B; W only where the backward is split, --schedule zb-h1");
        break;
      }
      if (st->micro < 0 || st->micro >= s->nmicro || st->chunk < 0 || st->chunk >= nch || st->chunk % s->pp != r) {
        rc = ts_errf(err, errlen, "pipeline schedule: rank %d step %d (%c micro %d chunk %d) names %s", r, i,  /* internal */
                     st->kind, st->micro, st->chunk,
                     st->micro < 0 || st->micro >= s->nmicro ? "a micro batch out of range" : "a chunk of another rank");
        break;
      }
      int *pos = st->kind == 'F' ? fpos : st->kind == 'B' ? bpos : wpos;
      size_t c = (size_t)st->chunk * s->nmicro + st->micro;
      if (pos[c] >= 0) {
        rc = ts_errf(err, errlen, "pipeline schedule: rank %d runs %c of micro batch %d, chunk %d twice (steps %d "
                                  "and %d)", r, st->kind, st->micro, st->chunk, pos[c], i);  /* internal */
        break;
      }
      pos[c] = i;
      if (st->kind == 'B' && fpos[c] < 0)
        rc = ts_errf(err, errlen, "pipeline schedule: rank %d step %d runs B of micro batch %d, chunk %d before its F",
                     r, i, st->micro, st->chunk);
      if (st->kind == 'W' && bpos[c] < 0)   /* W reads what B kept for it */
        rc = ts_errf(err, errlen, "pipeline schedule: rank %d step %d runs W of micro batch %d, chunk %d before its B",
                     r, i, st->micro, st->chunk);
    }
  for (size_t c = 0; c < cells && rc == 0; c++)
    if (fpos[c] < 0 || bpos[c] < 0 || (split && wpos[c] < 0))
      rc = ts_errf(err, errlen, "pipeline schedule: rank %d never runs %s of micro batch %d, chunk %d",
                   (int)(c / s->nmicro) % s->pp, fpos[c] < 0 ? "F" : bpos[c] < 0 ? "B" : "W", (int)(c % s->nmicro),
                   (int)(c / s->nmicro));
  free(fpos);
  free(bpos);
  free(wpos);
  return rc;
}

/* Link (src -> dst): the k-th send of src to dst must be the k-th receive
 * of dst from src. */
static int check_links(const RankOps *ro, char *err, size_t errlen) {
  int pp = ro->pp, rc = 0;
  for (int src = 0; src < pp && rc == 0; src++)
    for (int side = 0; side < 2 && rc == 0; side++) {
      int dst = side == 0 ? (src + 1) % pp : (src + pp - 1) % pp;
      if (src == dst || (side == 1 && dst == (src + 1) % pp)) continue;
      int i = 0, j = 0, k = 0;
      for (;;) {
        while (i < ro->nops[src] && !(ro->ops[src][i].op == PIPE_OP_SEND && ro->ops[src][i].peer == dst)) i++;
        while (j < ro->nops[dst] && !(ro->ops[dst][j].op == PIPE_OP_RECV && ro->ops[dst][j].peer == src)) j++;
        int hs = i < ro->nops[src], hr = j < ro->nops[dst];
        if (!hs && !hr) break;
        char a[128], b[128];
        if (hs) msg_str(&ro->ops[src][i], a, sizeof a);
        if (hr) msg_str(&ro->ops[dst][j], b, sizeof b);
        if (!hr) { rc = ts_errf(err, errlen, "pipeline schedule: rank %d sends the %s to rank %d (message %d on that "  /* internal */
                                             "link), which never receives it", src, a, dst, k + 1); break; }
        if (!hs) { rc = ts_errf(err, errlen, "pipeline schedule: rank %d waits for the %s from rank %d (message %d on "
                                             "that link), which never sends it", dst, b, src, k + 1); break; }
        if (!same_msg(&ro->ops[src][i], &ro->ops[dst][j])) {
          rc = ts_errf(err, errlen, "pipeline schedule: message %d from rank %d to rank %d does not match: rank %d "  /* internal */
                                    "sends the %s, rank %d expects the %s (messages on a link are matched in order)",
                       k + 1, src, dst, src, a, dst, b);
          break;
        }
        i++, j++, k++;
      }
    }
  return rc;
}

/* Runs all ranks together (sends never wait, receives wait for the sent
 * message); with fwd != NULL also times every step.  -1 on deadlock. */
static int run_ranks(const PipeSchedule *s, const RankOps *ro, const double *fwd, const double *bwd, const double *wgt,
                     double bwd_ratio, PipeTimeline *t, char *err, size_t errlen) {
  /* a split backward without W times: B and W take half of it each */
  double part = plan_pipe_sched_splits_bwd(s->kind) && !wgt ? 0.5 : 1.0;
  int pp = s->pp;
  int *pc = ts_xcalloc((size_t)pp, sizeof *pc);            /* next op per rank */
  double *clock = ts_xcalloc((size_t)pp, sizeof *clock);
  double *ready = ts_xcalloc((size_t)pp, sizeof *ready);    /* arrival time of the received input */
  /* sent[link] = messages posted so far (link_of); their times */
  int *sent = ts_xcalloc((size_t)2 * pp, sizeof *sent), *recvd = ts_xcalloc((size_t)2 * pp, sizeof *recvd);
  int cap = 0;
  for (int r = 0; r < pp; r++) cap += ro->nops[r];
  double *when = ts_xmalloc(((size_t)cap + 1) * sizeof *when);   /* per link, in order: packed per src */
  int **link_at = ts_xcalloc((size_t)2 * pp, sizeof *link_at);  /* per link: index into when[] of message k */
  int *cnt = ts_xcalloc((size_t)2 * pp, sizeof *cnt), used = 0;
  for (int src = 0; src < pp; src++)
    for (int i = 0; i < ro->nops[src]; i++)
      if (ro->ops[src][i].op == PIPE_OP_SEND) cnt[link_of(pp, src, ro->ops[src][i].peer)]++;
  for (int l = 0; l < 2 * pp; l++) {
    link_at[l] = ts_xmalloc(((size_t)cnt[l] + 1) * sizeof **link_at);
    for (int k = 0; k < cnt[l]; k++) link_at[l][k] = used++;
  }
  free(cnt);
  int done = 0, rc = 0;
  while (!done) {
    int progress = 0;
    done = 1;
    for (int r = 0; r < pp; r++) {
      while (pc[r] < ro->nops[r]) {
        const PipeOp *o = &ro->ops[r][pc[r]];
        if (o->op == PIPE_OP_RECV) {
          int l = link_of(pp, o->peer, r);
          if (recvd[l] >= sent[l]) break;                      /* blocked */
          ready[r] = when[link_at[l][recvd[l]++]];
        } else if (o->op == PIPE_OP_SEND) {
          int l = link_of(pp, r, o->peer);
          when[link_at[l][sent[l]++]] = clock[r];
        } else {
          double f = fwd ? fwd[o->edge] : 1, b = (bwd ? bwd[o->edge] : f * bwd_ratio) * part;
          double d = o->what == 'F' ? f : o->what == 'B' ? b : wgt ? wgt[o->edge] : b;
          double st = clock[r] > ready[r] ? clock[r] : ready[r];
          if (t) { t->start[r][o->step] = st; t->end[r][o->step] = st + d; t->busy[r] += d; }
          clock[r] = st + d;
          ready[r] = 0;
        }
        pc[r]++;
        progress = 1;
      }
      if (pc[r] < ro->nops[r]) done = 0;
    }
    if (!done && !progress) {
      StrBuf b = {0};
      for (int r = 0; r < pp; r++) {
        if (pc[r] >= ro->nops[r]) continue;
        const PipeOp *o = &ro->ops[r][pc[r]];
        char m[128];
        msg_str(o, m, sizeof m);
        const PipeStep *st = &s->steps[r][o->step];
        sb_printf(&b, "%srank %d at step %d (%c of micro batch %d) waits for the %s from rank %d", b.n ? "; " : "", r,
                  o->step, st->kind, st->micro, m, o->peer);
      }
      rc = ts_errf(err, errlen, "pipeline schedule deadlocks: %s", b.p ? b.p : "");  /* internal */
      sb_free(&b);
      break;
    }
  }
  if (rc == 0 && t) {
    for (int r = 0; r < pp; r++) if (clock[r] > t->makespan) t->makespan = clock[r];
    for (int r = 0; r < pp; r++) t->idle[r] = t->makespan - t->busy[r];
  }
  for (int l = 0; l < 2 * pp; l++) free(link_at[l]);
  free(link_at);
  free(when);
  free(sent);
  free(recvd);
  free(ready);
  free(clock);
  free(pc);
  return rc;
}

int plan_pipe_check(const PipeSchedule *s, char *err, size_t errlen) {
  if (s->pp < 1 || s->vpp < 1 || s->nmicro < 1 || !s->nsteps || !s->steps)
    return ts_errf(err, errlen, "pipeline schedule: empty");  /* internal */
  int rc = check_steps(s, err, errlen);
  if (rc != 0) return rc;
  RankOps ro;
  rank_ops_build(s, &ro);
  rc = check_links(&ro, err, errlen);
  if (rc == 0) rc = run_ranks(s, &ro, NULL, NULL, NULL, 1, NULL, err, errlen);
  rank_ops_free(&ro);
  return rc;
}

/* ---- timeline ---- */

void plan_pipe_timeline_free(PipeTimeline *t) {
  for (int r = 0; t->start && r < t->pp; r++) { free(t->start[r]); free(t->end[r]); }
  free(t->start);
  free(t->end);
  free(t->nsteps);
  free(t->busy);
  free(t->idle);
  free(t->peak_micro);
  free(t->peak_chunks);
  memset(t, 0, sizeof *t);
}

double plan_pipe_bubble(const PipeTimeline *t, int r) { return t->busy[r] > 0 ? t->idle[r] / t->busy[r] : 0; }

int plan_pipe_simulate(const PipeSchedule *s, const double *fwd, double bwd_ratio, PipeTimeline *t, char *err,
                       size_t errlen) {
  return plan_pipe_simulate_fb(s, fwd, NULL, bwd_ratio, t, err, errlen);
}

int plan_pipe_simulate_fb(const PipeSchedule *s, const double *fwd, const double *bwd, double bwd_ratio,
                          PipeTimeline *t, char *err, size_t errlen) {
  return plan_pipe_simulate_fbw(s, fwd, bwd, NULL, bwd_ratio, t, err, errlen);
}

int plan_pipe_simulate_fbw(const PipeSchedule *s, const double *fwd, const double *bwd, const double *wgt,
                           double bwd_ratio, PipeTimeline *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  if (s->pp < 1 || s->vpp < 1 || s->nmicro < 1 || !s->nsteps || !s->steps)
    return ts_errf(err, errlen, "pipeline schedule: empty");  /* internal */
  if (check_steps(s, err, errlen) != 0) return -1;     /* indices below are trusted after this */
  int pp = s->pp;
  t->pp = pp;
  t->nsteps = ts_xmalloc((size_t)pp * sizeof *t->nsteps);
  t->start = ts_xcalloc((size_t)pp, sizeof *t->start);
  t->end = ts_xcalloc((size_t)pp, sizeof *t->end);
  t->busy = ts_xcalloc((size_t)pp, sizeof *t->busy);
  t->idle = ts_xcalloc((size_t)pp, sizeof *t->idle);
  t->peak_micro = ts_xcalloc((size_t)pp, sizeof *t->peak_micro);
  t->peak_chunks = ts_xcalloc((size_t)pp, sizeof *t->peak_chunks);
  for (int r = 0; r < pp; r++) {
    t->nsteps[r] = s->nsteps[r];
    t->start[r] = ts_xcalloc((size_t)s->nsteps[r] + 1, sizeof **t->start);
    t->end[r] = ts_xcalloc((size_t)s->nsteps[r] + 1, sizeof **t->end);
  }
  RankOps ro;
  rank_ops_build(s, &ro);
  int rc = run_ranks(s, &ro, fwd, bwd, wgt, bwd_ratio, t, err, errlen);
  rank_ops_free(&ro);
  /* in flight: a chunk's activations of micro m are held from the start of
   * its F to the end of its B (of its W when the backward is split: B
   * keeps what W reads); steps of one rank never overlap, so walking the
   * rank's steps in order is walking its time */
  char last = plan_pipe_sched_splits_bwd(s->kind) ? 'W' : 'B';
  int *held = ts_xcalloc((size_t)s->nmicro, sizeof *held);
  for (int r = 0; rc == 0 && r < pp; r++) {
    int chunks = 0, micros = 0;
    memset(held, 0, (size_t)s->nmicro * sizeof *held);
    for (int i = 0; i < s->nsteps[r]; i++) {
      const PipeStep *st = &s->steps[r][i];
      if (st->kind == 'F') {
        chunks++;
        if (held[st->micro]++ == 0) micros++;
        if (chunks > t->peak_chunks[r]) t->peak_chunks[r] = chunks;
        if (micros > t->peak_micro[r]) t->peak_micro[r] = micros;
      } else if (st->kind == last) {
        chunks--;
        if (--held[st->micro] == 0) micros--;
      }
    }
  }
  free(held);
  if (rc != 0) plan_pipe_timeline_free(t);
  return rc;
}
