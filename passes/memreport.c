/* memreport.c - the text of `mcc --report memory` (memreport.h): states by
 * kind, each block's planned activation arena (plan/memplan.h) as the
 * executor runs it, pipeline stashes, per group of ranks. */
#include "memreport.h"
#include "pipe.h"
#include "plan/schedule.h"

static void report_row(StrBuf *out, const char *label, size_t bytes) {
  if (!out) return;   /* pass_memplan_totals: the figures only */
  sb_printf(out, "  %-52s %16zu %12.2f\n", label, bytes, (double)bytes / (1024.0 * 1024.0));
}

/* The plan of block bi as one backend runs it (fused: the LLVM backend,
 * whose positions llvm_at gives, or without it plan_mem_group_at). */
static int plan_backend(const IrModule *m, int bi, int fused, MemPlanAtFn llvm_at, void *ctx, MemPlan *p,
                        char *err, size_t errlen) {
  int *at = NULL;
  memset(p, 0, sizeof *p);
  if (fused) {
    const IrBlock *b = &m->blocks.a[bi];
    at = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *at);
    if (!llvm_at) plan_mem_group_at(b, at);
    else if (llvm_at(ctx, m, bi, at, err, errlen) != 0) { free(at); return -1; }
  }
  int rc = plan_mem_block_checked(m, bi, at, p, err, errlen);
  free(at);
  return rc;
}


/* Pipeline stashes of the program of pipeline rank r = stage - 1: per
 * chunk of r, the bytes one micro batch stashes (the exact bytes of the
 * operands of its forward block's `stash` nodes; they stay in the
 * runtime's stash, outside the arena, until the chunk's backward block
 * unstashes them), and the most bytes stashed at once over the step, from
 * the schedule the trainer runs (regenerated like runtime/exec/train.c does):
 * walking r's steps in order, F of (micro, chunk) adds the chunk's stash,
 * B removes it.  With one chunk per rank that is the stash of a micro
 * batch times the simulated peak in flight (PipeTimeline.peak_chunks).
 * With a split backward (zb-h1, pass wsplit) B also stashes what W reads
 * (the `stash` nodes of bwd.<g>, read by wgt.<g>): B adds the values it
 * made for W (a value it unstashed and stashes again is the same buffer,
 * handed over, and was counted with the forward's stash), then removes
 * the forward's stash and holds W's; W removes it.
 * *peak = 0 and no rows when m is not a pipeline rank's program. */
static int report_stash(const IrModule *m, StrBuf *out, size_t *peak, char *err, size_t errlen) {
  *peak = 0;
  int pp = ir_axis_size(m, IR_AXIS_PP), r = m->par.stage - 1;
  if (pp < 2 || r < 0) return 0;
  int vpp = m->par.vpp > 1 ? m->par.vpp : 1, nchunks = pp * vpp;
  PipeSchedKind kind = m->par.sched > IR_PIPE_NONE && m->par.sched < IR_PIPE_COUNT ? (PipeSchedKind)(m->par.sched - 1)
                       : vpp > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
  size_t *stash = ts_xcalloc((size_t)nchunks, sizeof *stash), *wstash = ts_xcalloc((size_t)nchunks, sizeof *wstash);
  size_t *wnew = ts_xcalloc((size_t)nchunks, sizeof *wnew);   /* of wstash: made by B, not unstashed */
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind ck;
    int g = ir_block_chunk_kind(b, &ck);
    if (g < 0 || g >= nchunks || (ck != IR_CHUNK_FWD && ck != IR_CHUNK_BWD)) continue;
    for (int i = 0; i < b->n; i++)
      if (b->nodes[i].op == IR_OP_STASH && b->nodes[i].nin == 1) {
        const IrType *t = &b->nodes[b->nodes[i].in[0]].type;
        size_t by = (size_t)ir_type_numel(t) * ir_dtype_size(t->dtype);
        (ck == IR_CHUNK_FWD ? stash : wstash)[g] += by;
        if (ck == IR_CHUNK_BWD && b->nodes[b->nodes[i].in[0]].op != IR_OP_UNSTASH) wnew[g] += by;
      }
  }
  int nmicro;
  PipeSchedule sc;
  PipeTimeline tl;
  char why[512];
  if (plan_pipe_nmicro(&m->train, ir_axis_size(m, IR_AXIS_DP), &nmicro, why, sizeof why) != 0 ||
      plan_pipe_schedule(kind, pp, vpp, nmicro, &sc, why, sizeof why) != 0) {
    free(stash);
    free(wstash);
    free(wnew);
    return ts_errf(err, errlen, "memplan: the pipeline schedule of stage %d: %s", r, why);  /* internal */
  }
  if (plan_pipe_simulate(&sc, NULL, 2.0, &tl, why, sizeof why) != 0) {
    plan_pipe_schedule_free(&sc);
    free(stash);
    free(wstash);
    free(wnew);
    return ts_errf(err, errlen, "memplan: simulating the pipeline schedule of stage %d: %s", r, why);  /* internal */
  }
  size_t held = 0;
  for (int k = 0; k < sc.nsteps[r]; k++) {
    const PipeStep *st = &sc.steps[r][k];
    if (st->chunk < 0 || st->chunk >= nchunks) continue;
    size_t add = st->kind == 'F' ? stash[st->chunk] : st->kind == 'B' ? wnew[st->chunk] : 0;
    size_t sub = st->kind == 'B' ? stash[st->chunk] - (wstash[st->chunk] - wnew[st->chunk])
                 : st->kind == 'W' ? wstash[st->chunk] : 0;
    held += add;   /* (B: what it makes for W while the forward's stash is still held) */
    if (held > *peak) *peak = held;
    held -= sub <= held ? sub : held;
  }
  char label[160];
  for (int g = r; g < nchunks; g += pp) {
    snprintf(label, sizeof label, "stash, chunk %d: per micro batch", g);
    report_row(out, label, stash[g]);
    if (plan_pipe_sched_splits_bwd(kind)) {
      snprintf(label, sizeof label, "stash, chunk %d: kept by B for W, per micro batch", g);
      report_row(out, label, wstash[g]);
    }
  }
  snprintf(label, sizeof label, "stash peak (%s, %d micro batches: %d in flight)", plan_pipe_sched_name(kind), nmicro,
           tl.peak_chunks[r]);
  report_row(out, label, *peak);
  plan_pipe_timeline_free(&tl);
  plan_pipe_schedule_free(&sc);
  free(stash);
  free(wstash);
  free(wnew);
  return 0;
}

/* The bytes of the buffers live where block b reports `output "loss"`:
 * what the forward keeps for the backward (plus the loss itself), the
 * activation memory Korthikanti et al. count.  0 if b reports no loss or
 * no backward follows it. */
static int held_at_loss(const IrBlock *b, const MemPlan *p, size_t *held) {
  const char *loss = ts_intern("loss");
  *held = 0;
  /* only where a backward follows: the block accumulates gradients or
   * stashes for a backward block (not pass eval's forward-only blocks) */
  int backward = 0;
  for (int i = 0; i < b->n && !backward; i++) backward = b->nodes[i].op == IR_OP_ACCUM || b->nodes[i].op == IR_OP_STASH;
  if (!backward) return 0;
  for (int i = 0; i < b->n; i++) {
    if (b->nodes[i].op != IR_OP_OUTPUT || b->nodes[i].sa != loss) continue;
    int pos = p->at ? p->at[i] : i;
    for (int v = 0; v < p->n; v++)
      if (p->buf[v] == v && p->first[v] <= pos && pos <= p->last[v]) *held += p->size[v];
    return 1;
  }
  return 0;
}

/* States per parameter element of this rank (its local parameter elements):
 * the bytes of each kind, next to Megatron's mixed-precision arithmetic
 * (Korthikanti et al. / the ZeRO paper: 2 bf16 param + 4 f32 main grad +
 * 4 f32 master + 8 Adam = 18 bytes; the distributed optimizer shards the
 * 12 bytes of master and moments over dp: 6 + 12 / dp). */
static void report_per_param(const IrModule *m, StrBuf *out, size_t par, size_t cpy, size_t grad, size_t opt) {
  double n = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) n += (double)ir_type_numel(&m->states.a[i].type);
  if (n <= 0) return;
  int dp = ir_axis_size(m, IR_AXIS_DP);
  int zero = dp > 1 && m->par.zero, z3 = zero && m->par.zero == 3;
  /* ZeRO-1's moments are flat over the joint data-parallel group (dp, or
   * dp+cp: the optimizer pass's Grad.zax); Megatron's distributed
   * optimizer always shards over dp x cp (mdp) */
  unsigned zmask = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_ADAM_M) zmask |= m->states.a[i].sh.flat;
  int zn = 1, mdp = dp * ir_axis_size(m, IR_AXIS_CP);
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (zmask & (1u << a)) zn *= ir_axis_size(m, (IrAxis)a);
  char zover[64] = ", ZeRO-1 over dp";
  if (zero && !z3 && zn != dp) {
    char an[32];
    snprintf(zover, sizeof zover, ", ZeRO-1 over %s (%d ranks)", ir_axes_str(ir_axes_attr(zmask), an, sizeof an), zn);
  }
  const char *pr = ir_dtype_name(m->train.precision);
  sb_printf(out, "  state bytes per parameter: %.4g = %.4g (%s master%s) + %.4g (%s copy) + %.4g (%s grad%s) + %.4g (adam m+v%s)\n",
            (double)(par + cpy + grad + opt) / n, (double)par / n, pr, z3 ? ", ZeRO-3 shard over dp" : "",
            (double)cpy / n, cpy ? ir_dtype_name(m->train.lowp) : "no", (double)grad / n, pr,
            z3 ? ", ZeRO-3 shard over dp" : "", (double)opt / n, z3 ? ", ZeRO-3 over dp" : zero ? zover : "");
  if (zero && !z3 && zn != dp) {
    char an[32];
    sb_printf(out, "  ZeRO-1 over the joint data-parallel group %s = %d ranks: adam m+v 2 x %d / %d = %.4g bytes per "
              "%s parameter; Megatron's distributed optimizer over dp x cp = %d: 12 / %d = %.4g (f32 master and "
              "moments; Tessera keeps the parameter whole)\n", ir_axes_str(ir_axes_attr(zmask), an, sizeof an), zn,
              (int)ir_dtype_size(m->train.precision), zn, 2.0 * (double)ir_dtype_size(m->train.precision) / zn, pr,
              mdp, mdp, 12.0 / mdp);
  }
  if (dp > 1 && m->train.lowp == IR_VOID) {
    /* the closed forms of the stages at this dp, per parameter element (E bytes per element) */
    double e = (double)ir_dtype_size(m->train.precision);
    sb_printf(out, "  per parameter at dp=%d, closed form (E = %g bytes, %s): ZeRO-3 4E/dp = %.4g; ZeRO-1 E + E + 2E/dp = %.4g; "
              "no ZeRO 4E = %.4g; this plan: %.4g (%s; chunks padded to a multiple of dp)\n",
              dp, e, pr, 4 * e / dp, 2 * e + 2 * e / dp, 4 * e, (double)(par + grad + opt) / n,
              z3 ? "ZeRO-3" : zero ? "ZeRO-1" : "no ZeRO");
    sb_printf(out, "  Megatron (16-bit params, f32 masters): 18 bytes per parameter plain, 6 + 12/dp = %.4g with the "
              "distributed optimizer, Megatron-FSDP (all sharded) 18/dp = %.4g\n", 6.0 + 12.0 / dp, 18.0 / dp);
  }
  if (m->train.lowp != IR_VOID) {
    if (z3)
      sb_printf(out, "  per parameter at dp=%d, ZeRO-3 with %s gathers, closed form: f32 master 4/dp + f32 grad 4/dp + "
                "adam 8/dp = 16/dp = %.4g, no %s copy held (each layer's is gathered in flight: the ZeRO-3 rows below); "
                "this plan: %.4g (chunks padded to a multiple of dp)\n", dp, ir_dtype_name(m->train.lowp), 16.0 / dp,
                ir_dtype_name(m->train.lowp), (double)(par + cpy + grad + opt) / n);
    if (z3)
      sb_printf(out, "  Megatron, 16-bit with f32 masters: 18 bytes per parameter; distributed optimizer 6 + 12 / dp = "
                "%.4g at dp=%d; Megatron-FSDP (16-bit parameter, f32 master, grad and moments all sharded) 18/dp = %.4g\n",
                6.0 + 12.0 / dp, dp, 18.0 / dp);
    else if (zero)
      sb_printf(out, "  Megatron, 16-bit with f32 masters: 18 bytes per parameter; distributed optimizer 6 + 12 / dp = "
                "%.4g at dp=%d (it also shards the f32 master: Tessera's ZeRO-1 shards the moments only, %.4g = 10 + 8 / dp)\n",
                6.0 + 12.0 / dp, dp, 10.0 + 8.0 / dp);
    else
      sb_puts(out, "  Megatron, 16-bit with f32 masters: 18 bytes per parameter = 2 (param) + 4 (main grad) + 4 (master) "
                   "+ 8 (adam)\n");
  }
}

/* ZeRO-3 (pass zero3): the parameters gathered in block micro are
 * activations of the arena (counted in its rows above), shown apart: the
 * largest layer (gather group: the values an all_gather of a shard state
 * makes, at the parameters' local size), and the most bytes of gathered
 * parameters live at once in the micro block's plan (with the prefetch,
 * the layer computing and the next one).  Nothing when no shard exists. */
static int report_gathered(const IrModule *m, MemPlanAtFn llvm_at, void *ctx, StrBuf *out, char *err, size_t errlen) {
  int bi = ir_block_find(m, "micro"), any = 0;
  for (int s = 0; s < m->states.n && !any; s++) any = m->states.a[s].kind == IR_STATE_SHARD;
  if (bi < 0 || !any) return 0;
  const IrBlock *b = &m->blocks.a[bi];
  MemPlan p;
  if (plan_backend(m, bi, 1, llvm_at, ctx, &p, err, errlen) != 0) return -1;
  /* gathered[v]: v is a gathered parameter (all_gather of a shard read, and
   * the slice / reshape after it); the largest per phase-layer run */
  unsigned char *g = ts_xcalloc((size_t)b->n + 1, 1), *own = ts_xcalloc((size_t)b->n + 1, 1);
  size_t largest = 0, run = 0, total = 0;
  for (int i = 0; i < b->n; i++) {
    const IrNode *nd = &b->nodes[i];
    int x = nd->nin == 1 ? nd->in[0] : -1;
    /* (under 16-bit storage the shard is cast to 16 bits before its gather) */
    int y = x >= 0 && b->nodes[x].op == IR_OP_CAST ? b->nodes[x].in[0] : x;
    if (nd->op == IR_OP_ALL_GATHER && y >= 0 && b->nodes[y].op == IR_OP_STATE &&
        m->states.a[b->nodes[y].ia[0]].kind == IR_STATE_SHARD)
      g[i] = 1;
    else if (nd->op == IR_OP_CAST && x >= 0 && b->nodes[x].op == IR_OP_STATE &&
             m->states.a[b->nodes[x].ia[0]].kind == IR_STATE_SHARD)
      g[i] = 1;   /* the rounded chunk, part of the run */
    else if ((nd->op == IR_OP_SLICE || nd->op == IR_OP_RESHAPE) && x >= 0 && g[x])
      g[i] = 1;
    /* a run of gathers emitted together (one layer, or two with the
     * prefetch): their all_gather results, padding included */
    if (g[i] && nd->op == IR_OP_ALL_GATHER) {
      size_t by = (size_t)ir_type_numel(&nd->type) * ir_dtype_size(nd->type.dtype);
      run += by;
      total += by;
    } else if (!g[i] && nd->op != IR_OP_STATE) {
      if (run > largest) largest = run;
      run = 0;
    }
    if (g[i] && p.buf[i] >= 0) own[p.buf[i]] = 1;
  }
  if (run > largest) largest = run;
  size_t peak = 0;
  int npos = 0;
  for (int v = 0; v < p.n; v++) if (p.last[v] + 1 > npos) npos = p.last[v] + 1;
  for (int pos = 0; pos < npos; pos++) {
    size_t live = 0;
    for (int v = 0; v < p.n; v++)
      if (own[v] && p.buf[v] == v && p.first[v] <= pos && pos <= p.last[v]) live += p.size[v];
    if (live > peak) peak = live;
  }
  free(g);
  free(own);
  plan_mem_free(&p);
  report_row(out, "ZeRO-3: gathered parameters, largest run of gathers", largest);
  report_row(out, "ZeRO-3: gathered parameters live at once (peak)", peak);
  report_row(out, "ZeRO-3: gathered per micro batch (forward + backward)", total);
  if (out)
    sb_puts(out, "  (the gathered parameters are values of block micro: inside its arena rows above, not added to "
                 "them; a run is the gathers emitted together, one layer ahead)\n");
  return 0;
}

/* --fp8 (passes/fp8.c): the delayed-scaling states (per quantized tensor
 * an amax history and three scalars) and the fp8 copies the GEMMs read
 * (quant8's results in block micro, 1 byte per element: per micro batch,
 * and those a backward node reads, held from the forward as TE keeps its
 * fp8 activations). */
static void report_fp8(const IrModule *m, StrBuf *out, size_t fp8s) {
  int nt = 0;
  int64_t len = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_FP8 && m->states.a[i].type.rank == 1) {
      nt++;
      len = m->states.a[i].type.dim[0];
    }
  char label[200];
  snprintf(label, sizeof label, "fp8 states (%d tensors x (history %lld + 3) f32)", nt, (long long)len);
  report_row(out, label, fp8s);
  int mb = ir_block_find(m, "micro");
  if (mb < 0) return;
  const IrBlock *b = &m->blocks.a[mb];
  int loss = b->n;
  for (int i = 0; i < b->n && loss == b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa && !strcmp(b->nodes[i].sa, "loss")) loss = i;
  size_t all = 0, held = 0;
  for (int i = 0; i < b->n; i++) {
    if (b->nodes[i].op != IR_OP_QUANT8) continue;
    size_t bytes = (size_t)ir_type_numel(&b->nodes[i].type) * ir_dtype_size(b->nodes[i].type.dtype);
    all += bytes;
    int late = 0;
    for (int j = loss + 1; j < b->n && i < loss && !late; j++)
      for (int k = 0; k < b->nodes[j].nin; k++) {
        int v = b->nodes[j].in[k];
        while (v > i && b->nodes[v].op == IR_OP_RESHAPE) v = b->nodes[v].in[0];   /* through the reshapes */
        late |= v == i;
      }
    held += late ? bytes : 0;
  }
  report_row(out, "fp8 copies per micro batch (quant8, 1 B each)", all);
  report_row(out, "fp8 copies held for the backward", held);
}

/* The states that are neither parameters, gradients nor optimizer state:
 * 16-bit parameter copies, fp8 scales and amax histories, a generation
 * plan's KV cache, fp16's loss-scaler scalars.  The totals count them with
 * the parameters (mrun's slab holds them all). */
static size_t states_beside_params(const IrModule *m) {
  return plan_mem_state_bytes(m, IR_STATE_COPY) + plan_mem_state_bytes(m, IR_STATE_FP8) +
         plan_mem_state_bytes(m, IR_STATE_CACHE) + plan_mem_state_bytes(m, IR_STATE_SCALER);
}

/* The rows of one rank's program m: its states by kind (LOCAL types: a
 * tp-split parameter counts 1/tp of its elements, a ZeRO moment its flat
 * chunk), each block's arena under the LLVM backend (the default) and the
 * reference one, the arenas (blocks run one after another, so one arena
 * the size of the largest block serves them all) and the totals. */
static int report_rows(const IrModule *m, MemPlanAtFn llvm_at, void *ctx, StrBuf *out, char *err, size_t errlen) {
  int ntensors = 0;
  for (int i = 0; i < m->states.n; i++) ntensors += m->states.a[i].kind == IR_STATE_PARAM;
  size_t par = plan_mem_state_bytes(m, IR_STATE_PARAM);
  size_t grad = plan_mem_state_bytes(m, IR_STATE_GRAD);
  size_t opt = plan_mem_state_bytes(m, IR_STATE_ADAM_M) + plan_mem_state_bytes(m, IR_STATE_ADAM_V);
  size_t cpy = plan_mem_state_bytes(m, IR_STATE_COPY);
  char label[160];
  snprintf(label, sizeof label, "parameters (%d tensors)%s", ntensors, cpy ? ", f32 masters" : "");
  report_row(out, label, par);
  if (cpy) {
    snprintf(label, sizeof label, "parameter copies (%s, pass precision)", ir_dtype_name(m->train.lowp));
    report_row(out, label, cpy);
  }
  report_row(out, "gradients", grad);
  /* sgd / lion keep one momentum, muon one per matrix and adam m+v for the rest */
  static const char *const opt_label[IR_OPT_COUNT] = {"optimizer state (adam m+v)", "optimizer state (sgd momentum)",
                                                       "optimizer state (lion momentum)",
                                                       "optimizer state (muon momentum, adam m+v)"};
  report_row(out, m->train.optimizer < IR_OPT_COUNT ? opt_label[m->train.optimizer] : opt_label[0], opt);
  size_t fp8s = plan_mem_state_bytes(m, IR_STATE_FP8);
  if (fp8s) report_fp8(m, out, fp8s);
  size_t cache = plan_mem_state_bytes(m, IR_STATE_CACHE), scal = plan_mem_state_bytes(m, IR_STATE_SCALER);
  if (cache) report_row(out, "KV cache (generation, pass decode)", cache);
  if (scal) report_row(out, "loss scaler (fp16: scale, growth tracker, hysteresis)", scal);
  report_row(out, "states total", par + cpy + grad + opt + fp8s + cache + scal);
  report_per_param(m, out, par, cpy, grad, opt);
  par += states_beside_params(m);   /* the totals below count them with the parameters */
  size_t arena[2] = {0, 0};   /* [0] reference, [1] llvm */
  for (int fused = 1; fused >= 0; fused--) {
    for (int bi = 0; bi < m->blocks.n; bi++) {
      MemPlan p;
      if (plan_backend(m, bi, fused, llvm_at, ctx, &p, err, errlen) != 0) return -1;
      const char *bn = m->blocks.a[bi].name, *be = fused ? "" : ", --backend ref";
      snprintf(label, sizeof label, "block %s%s: arena peak (packed)", bn, be);
      report_row(out, label, p.peak_bytes);
      snprintf(label, sizeof label, "block %s%s: lower bound (max live)", bn, be);
      report_row(out, label, p.lower_bound_bytes);
      if (fused) {
        snprintf(label, sizeof label, "block %s: no reuse (%d buffers)", bn, p.nbuffers);
        report_row(out, label, p.total_bytes);
        size_t held;
        if (held_at_loss(&m->blocks.a[bi], &p, &held)) {
          snprintf(label, sizeof label, "block %s: held for the backward (live at the loss)", bn);
          report_row(out, label, held);
        }
      }
      if (p.peak_bytes > arena[fused]) arena[fused] = p.peak_bytes;
      plan_mem_free(&p);
    }
    if (fused) {
      report_row(out, "activation arena (largest block)", arena[1]);
      report_row(out, "total (states + arena)", par + grad + opt + arena[1]);
    }
  }
  report_row(out, "activation arena, --backend ref", arena[0]);
  report_row(out, "total, --backend ref", par + grad + opt + arena[0]);
  report_row(out, "state slab as allocated (64-byte aligned)", plan_mem_slab_bytes(m));
  if (report_gathered(m, llvm_at, ctx, out, err, errlen) != 0) return -1;
  size_t stash;
  if (report_stash(m, out, &stash, err, errlen) != 0) return -1;
  if (stash) report_row(out, "total with the stash peak (states + arena + stash)", par + grad + opt + arena[1] + stash);
  return 0;
}

int pass_memplan_totals(const IrModule *m, MemPlanAtFn llvm_at, void *ctx, MemTotals *t, char *err, size_t errlen) {
  memset(t, 0, sizeof *t);
  t->params = plan_mem_state_bytes(m, IR_STATE_PARAM) + states_beside_params(m);
  t->grads = plan_mem_state_bytes(m, IR_STATE_GRAD);
  t->opt = plan_mem_state_bytes(m, IR_STATE_ADAM_M) + plan_mem_state_bytes(m, IR_STATE_ADAM_V);
  for (int bi = 0; bi < m->blocks.n; bi++) {
    MemPlan p;
    if (plan_backend(m, bi, 1, llvm_at, ctx, &p, err, errlen) != 0) return -1;
    size_t held;
    if (held_at_loss(&m->blocks.a[bi], &p, &held) && held > t->held) t->held = held;
    if (p.peak_bytes > t->arena) t->arena = p.peak_bytes;
    plan_mem_free(&p);
  }
  if (report_stash(m, NULL, &t->stash, err, errlen) != 0) return -1;
  t->total = t->params + t->grads + t->opt + t->arena + t->stash;
  return 0;
}

static const char *report_note =
    "# exact bytes from the IR types.  mrun allocates the states in one slab (each\n"
    "# 64-byte aligned) and runs every block in ONE activation arena, the size of\n"
    "# the largest block's plan (liveness + best-fit packing, 64-byte aligned); its\n"
    "# measured use equals these rows (tests/memplan).  Blocks are planned as the\n"
    "# default LLVM backend runs them (a fused group is one kernel and values used\n"
    "# only inside it own no bytes); the --backend ref rows run every node alone.\n";

int pass_memplan_report(const IrModule *m, StrBuf *out, char *err, size_t errlen) {
  sb_printf(out, "memory report: %s, rank 0 of 1 (single-rank plan), %s training\n",
            m->name ? m->name : "?", ir_dtype_name(m->train.lowp != IR_VOID ? m->train.lowp : m->train.precision));
  sb_puts(out, report_note);
  sb_printf(out, "  %-52s %16s %12s\n", "", "bytes", "MiB");
  return report_rows(m, NULL, NULL, out, err, errlen);
}

/* "0-3", "0, 2, 4-5": the ranks r with rank_program[r] == prog. */
static void rank_set(const int *rank_program, int nranks, int prog, StrBuf *out) {
  int first = 1;
  for (int r = 0; r < nranks; r++) {
    if (rank_program[r] != prog) continue;
    int e = r;
    while (e + 1 < nranks && rank_program[e + 1] == prog) e++;
    sb_printf(out, "%s%d", first ? "" : ", ", r);
    if (e > r) sb_printf(out, "-%d", e);
    first = 0;
    r = e;
  }
}

int pass_memplan_report_ranks(IrModule *const *programs, int nprograms, const int *rank_program, int nranks,
                              const IrModule *unsharded, StrBuf *out, char *err, size_t errlen) {
  return pass_memplan_report_ranks_at(programs, nprograms, rank_program, nranks, unsharded, NULL, NULL, out, err,
                                      errlen);
}

int pass_memplan_report_ranks_at(IrModule *const *programs, int nprograms, const int *rank_program, int nranks,
                                 const IrModule *unsharded, MemPlanAtFn llvm_at, void *ctx, StrBuf *out, char *err,
                                 size_t errlen) {
  if (nprograms < 1 || nranks < 1) return ts_errf(err, errlen, "memplan: a report needs a program and a rank");  /* internal */
  const IrModule *m0 = programs[0];
  const IrParallel *pr = &m0->par;
  const char *zero = ir_axis_size(m0, IR_AXIS_DP) <= 1 ? "" : pr->zero == 3 ? ", ZeRO-3" : pr->zero ? ", ZeRO-1" : ", no ZeRO";
  sb_printf(out, "memory report: %s, %d rank%s (dp=%d pp=%d cp=%d ep=%d tp=%d%s%s), %s training\n",
            m0->name ? m0->name : "?", nranks, nranks == 1 ? "" : "s", ir_axis_size(m0, IR_AXIS_DP),
            ir_axis_size(m0, IR_AXIS_PP), ir_axis_size(m0, IR_AXIS_CP), ir_axis_size(m0, IR_AXIS_EP),
            ir_axis_size(m0, IR_AXIS_TP), pr->sp ? ", sp" : "", zero,
            ir_dtype_name(m0->train.lowp != IR_VOID ? m0->train.lowp : m0->train.precision));
  sb_puts(out, report_note);
  sb_puts(out, "# per rank, from the LOCAL types of the rank's program: a tp-split parameter (and\n"
               "# its gradient) holds 1/tp of the elements, a ZeRO (flat:dp) Adam moment 1/dp of\n"
               "# its tp-local tensor, zero-padded to a multiple of dp.\n");
  for (int p = 0; p < nprograms; p++) {
    int used = 0;
    for (int r = 0; r < nranks; r++) used |= rank_program[r] == p;
    if (!used) continue;
    StrBuf set = {0};
    rank_set(rank_program, nranks, p, &set);
    sb_printf(out, "%s %s (each):\n", strchr(set.p, '-') || strchr(set.p, ',') ? "ranks" : "rank", set.p);
    sb_free(&set);
    sb_printf(out, "  %-52s %16s %12s\n", "", "bytes", "MiB");
    if (report_rows(programs[p], llvm_at, ctx, out, err, errlen) != 0) return -1;
  }
  if (unsharded) {
    sb_puts(out, "unsharded (the same model on 1 rank), for comparison:\n");
    sb_printf(out, "  %-52s %16s %12s\n", "", "bytes", "MiB");
    if (report_rows(unsharded, llvm_at, ctx, out, err, errlen) != 0) return -1;
  }
  return 0;
}

/* The global elements of value n: its local ones times the ranks of every
 * axis that splits a dim of it. */
double pass_global_numel(const IrModule *m, const IrNode *n) {
  double e = (double)ir_type_numel(&n->type);
  for (int d = 0; d < n->type.rank; d++)
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (n->sh.split[d] & (1u << a)) e *= ir_axis_size(m, (IrAxis)a);
  return e;
}

int pass_memplan_report_recompute(const IrModule *m, int mode, const char *summary, MemPlanAtFn llvm_at, void *ctx,
                                  StrBuf *out, char *err, size_t errlen) {
  sb_printf(out, "recompute: %s (mcc --recompute; docs/cli.md)\n", pass_recompute_name(mode));
  if (summary && summary[0]) sb_printf(out, "# %s\n", summary);
  int bi = ir_block_find(m, "micro");
  const char *lossname = ts_intern("loss");
  int L = -1;
  const IrBlock *b = bi >= 0 ? &m->blocks.a[bi] : NULL;
  for (int i = 0; b && i < b->n; i++)
    if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == lossname) L = i;
  if (L < 0) {
    sb_puts(out, "# (per layer: only for a plan with a micro block; a pipeline's stages: the stash rows)\n");
    return 0;
  }
  int *unit = ts_xmalloc((size_t)(L + 1) * sizeof *unit), nl = 0;
  unsigned char *anch = ts_xmalloc((size_t)L + 1);
  char why[512];
  if (pass_layer_units(m, b, L, unit, anch, &nl, why, sizeof why) != 0 || nl < 1) {
    sb_printf(out, "# (per layer: no layers: %s)\n", why);
    free(unit);
    free(anch);
    return 0;
  }
  MemPlan p;
  if (plan_backend(m, bi, 1, llvm_at, ctx, &p, err, errlen) != 0) {
    free(unit);
    free(anch);
    return -1;
  }
  /* what is live at the loss, by the unit that made it; the layers' inputs
   * (anchored values an earlier unit makes and the layer reads) */
  int pos = p.at ? p.at[L] : L;
  double held = 0, input = 0, h = 0;
  unsigned char *counted = ts_xcalloc((size_t)L + 1, 1);
  for (int v = 0; v < L; v++)
    if (p.buf[v] == v && p.first[v] <= pos && pos <= p.last[v] && unit[v] >= 1 && unit[v] <= nl) held += (double)p.size[v];
  for (int r = 0; r < L; r++)
    for (int k = 0; k < b->nodes[r].nin; k++) {
      int v = b->nodes[r].in[k];
      if (!anch[v] || unit[r] <= unit[v] || unit[r] < 1 || unit[r] > nl || counted[v]) continue;
      counted[v] = 1;
      input += (double)ir_type_numel(&b->nodes[v].type) * ir_dtype_size(b->nodes[v].type.dtype);
      if (unit[r] == 1) h += pass_global_numel(m, &b->nodes[v]);
    }
  plan_mem_free(&p);
  free(counted);
  free(unit);
  free(anch);
  double s = (double)m->train.seq_len, bsz = (double)m->train.micro_batch,
         e = ir_dtype_size(m->train.lowp != IR_VOID ? m->train.lowp : m->train.precision);
  int t = ir_axis_size(m, IR_AXIS_TP), cp = ir_axis_size(m, IR_AXIS_CP), sp = m->par.sp;
  h = s * bsz > 0 ? h / (s * bsz) : 0;
  sb_printf(out, "# per layer of the %d in the repeat stack, on rank 0 (the first stage): the bytes its values hold\n"
                 "# at the loss, and Korthikanti et al. 2022's figures (16-bit activations) scaled to %g-byte\n"
                 "# elements, with s=%g b=%g h=%g (the first layer's input / (s b)) t=%d%s%s:\n",
            nl, e, s, bsz, h, t, sp ? " sp" : "", cp > 1 ? " (and / cp)" : "");
  char label[160];
  report_row(out, "per layer: held at the loss (mean)", (size_t)(held / nl + 0.5));
  report_row(out, "per layer: the layer's input", (size_t)(input / nl + 0.5));
  double sbh = s * bsz * h * e / 2 / cp;   /* s b h at 2 bytes, in this precision */
  double keep = sp || t == 1 ? 34.0 / t : 10.0 + 24.0 / t, in = sp ? 2.0 / t : 2.0;
  if (mode != PASS_RECOMPUTE_FULL) {
    snprintf(label, sizeof label, "Korthikanti, %s: %s", mode == PASS_RECOMPUTE_NONE ? "none (fused attn)" : "selective",
             sp || t == 1 ? "34 s b h / t" : "s b h (10 + 24 / t)");
    report_row(out, label, (size_t)(keep * sbh + 0.5));
  }
  if (mode == PASS_RECOMPUTE_FULL || mode == PASS_RECOMPUTE_AUTO) {
    snprintf(label, sizeof label, "Korthikanti, full: %s", sp ? "2 s b h / t" : "2 s b h");
    report_row(out, label, (size_t)(in * sbh + 0.5));
  }
  return 0;
}
