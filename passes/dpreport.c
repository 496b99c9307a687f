/* dpreport.c - the overlapped dp gradient reduction as --report comm
 * shows it (dpreport.h). */
#include "dpreport.h"
#include "timereport.h"
#include "plan/dpreduce.h"
#include <math.h>

/* Ring bytes a rank sends for `bytes` (the collective's operand) over n ranks. */
static double ring_bytes(IrOp op, int n, double bytes) {
  return (op == IR_OP_ALL_REDUCE ? 2.0 : 1.0) * (double)(n - 1) / n * bytes;
}

/* Seconds of the first `upto` nodes of block b on hw (a prefix is a valid
 * block: operands come before their users). */
static double prefix_time(const IrModule *m, const IrBlock *b, int upto, const HwDesc *hw) {
  IrBlock pre = *b;
  pre.n = upto;
  TimeCost c;
  memset(&c, 0, sizeof c);
  pass_time_block(m, &pre, hw, hw_format_of(ir_train_dtype(&m->train), 0), &c);
  return time_cost_total(&c);
}

/* ZeRO-3 (pass zero3): the dp collectives of block micro, per micro batch
 * and per step, against Megatron-FSDP's closed form (every parameter
 * gathered for the forward and again for the backward, every gradient
 * reduce-scattered, in each micro batch) and ZeRO-1's (one reduce-scatter
 * of the gradients and one all-gather of the parameters per step). */
static void zero3_report(const IrModule *m, int dp, StrBuf *out, DpOverlapSum *sum) {
  const char *loss = ts_intern("loss"), *micro = ts_intern("micro");
  double ag[2] = {0, 0}, rs = 0, P = 0, es = (double)ir_dtype_size(m->train.precision);
  int nag[2] = {0, 0}, nrs = 0;
  /* block micro, or a pipeline rank's chunk blocks (fwd.<g> forward,
   * bwd.<g> and wgt.<g> backward; eval.<g> does not train) */
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind), ph = g >= 0 && kind != IR_CHUNK_FWD;
    if (g >= 0 ? kind == IR_CHUNK_EVAL : b->name != micro) continue;
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (nd->op == IR_OP_OUTPUT && nd->sa == loss && g < 0) ph = 1;
      if (nd->ia[0] != IR_AXIS_DP) continue;
      if (nd->op == IR_OP_ALL_GATHER) {
        ag[ph] += ring_bytes(nd->op, dp, (double)ir_type_numel(&nd->type) * (double)ir_dtype_size(nd->type.dtype));
        nag[ph]++;
      } else if (nd->op == IR_OP_REDUCE_SCATTER) {
        const IrNode *x = &b->nodes[nd->in[0]];
        rs += ring_bytes(nd->op, dp, (double)ir_type_numel(&x->type) * (double)ir_dtype_size(x->type.dtype));
        nrs++;
      }
    }
  }
  for (int s = 0; s < m->states.n; s++)
    if (m->states.a[s].kind == IR_STATE_PARAM) P += (double)ir_type_numel(&m->states.a[s].type);
  const IrTrain *t = &m->train;
  int64_t nmicro = t->micro_batch > 0 && dp > 0 ? t->global_batch / ((int64_t)t->micro_batch * dp) : 1;
  if (nmicro < 1) nmicro = 1;
  double f = (double)(dp - 1) / dp, per = ag[0] + ag[1] + rs;
  /* 16-bit storage: the gathers move the 16-bit copies, the reduce-scatter
   * f32 main grads (as the ZeRO-1 reduction: docs/precision.md) */
  double eg = m->train.lowp != IR_VOID ? (double)ir_dtype_size(m->train.lowp) : es;
  double fsdp = f * P * (2.0 * eg + es), z1 = 2.0 * f * P * es;
  sum->z3_ring = per * (double)nmicro;
  sum->z3_closed = fsdp * (double)nmicro;
  sum->z1_closed = z1;
  sb_printf(out, "ZeRO-3 (--zero 3): dp=%d, %lld micro batches per rank; ring bytes sent per rank, in block micro (with pp: this pipeline rank's chunk blocks) "
            "(no buckets: each gradient is reduce-scattered where its backward makes it, each parameter gathered "
            "one layer ahead of its use)\n", dp, (long long)nmicro);
  sb_printf(out, "  %-50s %6s %16s %16s\n", "", "count", "per micro batch", "per step");
  sb_printf(out, "  %-50s %6d %16.0f %16.0f\n", "parameter all_gather, forward", nag[0], ag[0], ag[0] * nmicro);
  sb_printf(out, "  %-50s %6d %16.0f %16.0f\n", "parameter all_gather, backward (gathered again)", nag[1], ag[1],
            ag[1] * nmicro);
  sb_printf(out, "  %-50s %6d %16.0f %16.0f\n", "gradient reduce_scatter", nrs, rs, rs * nmicro);
  sb_printf(out, "  %-50s %6d %16.0f %16.0f\n", "total", nag[0] + nag[1] + nrs, per, per * nmicro);
  if (eg != es)
    sb_printf(out, "  Megatron-FSDP, closed form: (dp-1)/dp x %.0f parameter elements x (2 x %.0f bytes gathered, %s, for "
              "the forward and again for the backward + %.0f bytes reduce-scattered, f32 main grads) per micro batch = "
              "%.0f, per step %.0f\n", P, eg, ir_dtype_name(m->train.lowp), es, fsdp, fsdp * nmicro);
  else
    sb_printf(out, "  Megatron-FSDP, closed form: 3 x (dp-1)/dp x %.0f parameter elements x %.0f bytes per micro batch "
              "(gathered for the forward and again for the backward, gradients reduce-scattered) = %.0f, per step "
              "%.0f\n", P, es, fsdp, fsdp * nmicro);
  sb_printf(out, "  ZeRO-1 (--zero 1), closed form: 2 x (dp-1)/dp x %.0f x %.0f bytes per step (gradients "
            "reduce-scattered, parameters all-gathered after AdamW) = %.0f: ZeRO-3 sends %.0f more per step (%.2fx)\n",
            P, es, z1, per * nmicro - z1, z1 > 0 ? per * nmicro / z1 : 0.0);
  sb_puts(out, "  (the backward gathers only the parameters its gradients read: biases and norm shifts are not "
               "gathered again; a parameter read twice, a tied embedding, has its gradient reduce-scattered once "
               "per read)\n");
}

int pass_dp_overlap_report(const IrModule *m, int64_t bucket_bytes, int overlap, const HwDesc *hw, StrBuf *out,
                           DpOverlapSum *sum, char *err, size_t errlen) {
  memset(sum, 0, sizeof *sum);
  if (m->par.zero == 3 && ir_axis_size(m, IR_AXIS_DP) > 1) {
    int any = 0;
    for (int s = 0; s < m->states.n && !any; s++) any = m->states.a[s].kind == IR_STATE_SHARD;
    if (any) {
      zero3_report(m, ir_axis_size(m, IR_AXIS_DP), out, sum);
      return 0;
    }
  }
  PlanDpPlan pl;
  if (plan_dp_buckets(m, bucket_bytes, &pl, err, errlen) != 0) return -1;
  /* dp, or the joint data-parallel group (ZeRO-1 over dp+cp: also at dp 1):
   * the largest group a bucket reduces over */
  int dp = pl.dp;
  for (int k = 0; k < pl.nb; k++)
    if (pl.b[k].size > dp) dp = pl.b[k].size;
  if (dp <= 1) { plan_dp_free(&pl); return 0; }
  int zero = m->par.zero != 0;   /* ZeRO-1 when dp > 1 (passes/optimizer.c) */
  int64_t stride = 1;   /* dp is the outermost axis: its neighbours are every other axis' ranks apart */
  for (int a = IR_AXIS_DP + 1; a < IR_AXIS_COUNT; a++) stride *= ir_axis_size(m, (IrAxis)a);
  HwLink link = hw ? hw_link(hw, dp, stride) : (HwLink){0, 0, 0};
  sb_printf(out, "dp gradient reduction: %s=%d, %s, buckets of >= %lld bytes%s\n", dp > pl.dp ? "joint dp group" : "dp", dp,
            zero ? "ZeRO-1 (reduce_scatter)" : "all_reduce", (long long)pl.bucket_bytes,
            overlap ? ", each issued during the last micro batch's backward once its gradients are final"
                    : " (--no-overlap-grad-reduce: all in the update block, after the backward)");
  sb_printf(out, "  %6s %-8s %-22s %5s %-15s %14s %14s %14s", "bucket", "block", "issued after", "grads", "collective",
            "payload bytes", "ring bytes", "bwd FLOPs after");
  if (hw) sb_printf(out, " %11s %11s %11s", "comm s", "compute s", "exposed s");
  sb_printf(out, "\n");
  double free_at = 0, P = 0, es = (double)ir_dtype_size(m->train.precision);
  int last_wblock = -1;
  double end = 0;
  for (int k = 0; k < pl.nb; k++) {
    const PlanDpBucket *bk = &pl.b[k];
    const IrBlock *b = &m->blocks.a[bk->wblock];
    double flops = 0;
    for (int i = bk->at + 1; i < b->n; i++) flops += pass_node_flops(b, &b->nodes[i]);
    double ring = ring_bytes(bk->op, bk->size, (double)bk->bytes), exposed = overlap && flops > 0 ? 0 : ring;
    char at[64];
    snprintf(at, sizeof at, "%%%d %s", bk->at, ir_ops[b->nodes[bk->at].op].name);
    sb_printf(out, "  %6d %-8s %-22s %5d %-15s %14lld %14.0f %14.4g", k, b->name, at, bk->n,
              ir_ops[bk->op].name, (long long)bk->bytes, ring, flops);
    if (hw) {
      /* the comm stream runs the buckets in order: one starts when issued
       * and the one before it is done; what runs past the block's end is
       * exposed (per writer block: a pipeline chunk's backward ends on its own) */
      if (bk->wblock != last_wblock) {
        end = prefix_time(m, b, b->n, hw);
        free_at = 0;
        last_wblock = bk->wblock;
      }
      double comm = hw_coll_time(&link, bk->op == IR_OP_ALL_REDUCE ? HW_ALL_REDUCE : HW_REDUCE_SCATTER, bk->size,
                                 (double)bk->bytes);
      double issue = overlap ? prefix_time(m, b, bk->at + 1, hw) : end;
      double start = issue > free_at ? issue : free_at, done = start + comm;
      free_at = done;
      double past = done - (start > end ? start : end);
      if (past < 0) past = 0;
      exposed = comm > 0 ? ring * past / comm : 0;
      sb_printf(out, " %11.4g %11.4g %11.4g", comm, end - issue, past);
    }
    sb_printf(out, "\n");
    sum->buckets++;
    sum->grads += bk->n;
    sum->ring += ring;
    sum->exposed += exposed;
  }
  for (int j = 0; j < pl.ng; j++) P += (double)pl.g[j].n;
  P += es > 0 ? (double)pl.left_bytes / es : 0;   /* Megatron reduces those in its buckets too */
  if (pl.nleft) {
    sb_printf(out, "  not bucketed: %d dp reductions of gradients reduced over another axis first (partial over tp "
              "under sp or over cp, tied across pipeline stages, rows gathered) or written by another block too "
              "(fp16's skip), %lld payload bytes: in the update block as written\n", pl.nleft, (long long)pl.left_bytes);
    double r = (zero ? 1.0 : 2.0) * (double)(dp - 1) / dp * (double)pl.left_bytes;
    sum->ring += r;
    sum->exposed += r;
  }
  sum->left = pl.nleft;
  /* Megatron's DDP: the gradient buffer of P elements cut into buckets of
   * B elements from the last parameter back; the last one formed (the
   * remainder) is issued when the backward ends and overlaps nothing */
  double B = es > 0 ? (double)pl.bucket_bytes / es : 0, f = (zero ? 1.0 : 2.0) * (double)(dp - 1) / dp;
  double last = B > 0 && P > 0 ? P - B * floor((P - 1) / B) : P;
  sum->megatron_ring = f * P * es;
  sum->megatron_exposed = overlap ? f * last * es : sum->megatron_ring;
  sb_printf(out, "  exposed after overlap: %.0f of %.0f ring bytes (%.1f%%)%s; Megatron's DDP (--overlap-grad-reduce%s, "
            "the same bucket size, closed form): %.0f ring bytes = %s(dp-1)/dp x %.0f gradient elements x %.0f bytes, "
            "exposed %.0f (its last bucket if buckets were cut at exactly the size: the remainder, %.0f elements)\n",
            sum->exposed, sum->ring, sum->ring > 0 ? 100.0 * sum->exposed / sum->ring : 0.0,
            hw ? " (predicted on the hardware)" : " (buckets overlapping no backward FLOPs)",
            zero ? ", --use-distributed-optimizer" : "", sum->megatron_ring, zero ? "" : "2 x ", P, es,
            sum->megatron_exposed, last);
  plan_dp_free(&pl);
  return 0;
}
