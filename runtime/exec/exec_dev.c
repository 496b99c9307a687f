/* exec_dev.c - the executor's device backend: a program's nodes as device
 * work through the device layer (device.h).  rt.c walks the blocks, owns
 * the memory plan and the buffers, and calls here for what a device runs:
 *   - a kernel of the planning (exec_jit.c in cuda mode): a generated
 *     kernel, launched with its buffers; an AdamW run, one launch per
 *     tensor (the per-run scalars lr, 1 - b1^t, 1 - b2^t, wd copied to
 *     the device first); a GEMM bias epilogue, one GEMM with the bias
 *     epilogue;
 *   - a matmul: one GEMM (strided batch);
 *   - a library kernel (codegen/cuda_lib.c): its launches, with the
 *     operands, the result, the states it names and the scratch buffer;
 *   - a collective: on a device whose memory is host memory (the
 *     emulator) the reference kernel, which calls the communication
 *     layer; on a CUDA device NCCL on the device's comm stream (the
 *     rank's dev_group, bound by mrun), ordered against compute by two
 *     events so that it overlaps the compute issued after it: all_reduce
 *     (sum), and all_gather / reduce_scatter whose blocks are contiguous
 *     (the dim has nothing before it, no cp zigzag).  Other collectives
 *     (the pipeline's send / recv, all-to-all, ring steps, gathers inside
 *     a tensor) are refused when the program is made, naming the node.
 * Every kernel takes the run block (a.run): seed, step, micro batch, lr
 * and the rank's coordinates, refreshed on the device when they change. */
#include "dev_priv.h"
#include "runtime/comm/comm.h"
#include <math.h>

/* A collective in flight on the comm stream: what it reads and writes,
 * and the event recorded after it there.  Events 0 and 1 order each
 * collective after compute; 2 .. RT_DEV_EVENTS-1 mark the pending ones. */
#define RT_DEV_PENDING (RT_DEV_EVENTS - 2)
typedef struct {
  RtDevRange rd, wr;
  int event;
} RtDevPending;

/* The pipeline's device buffers: a stash entry ('s', key chunk / micro /
 * slot) or a local hand-off ('m', key tag); a send's copy until the step
 * ends; the pool they come from, reused by exact size. */
typedef struct { char kind; int chunk, micro; int64_t key; size_t bytes; void *buf; size_t cap; } DevKept;
typedef struct { RtCommReq *req; void *buf; size_t bytes; } DevSend;
typedef struct { size_t bytes; void *p; } DevBuf;

struct RtDevExec {
  RtDev *dev;
  RtDevPlan *plan;
  RtDevModule *mod;
  void *run_dev;                   /* CG_RUN_WORDS int64 */
  long long run_host[CG_RUN_WORDS];
  int run_valid;
  void *scratch;
  void *comm_scratch;              /* the collectives' re-layouts (comm stream only) */
  void *scal_dev;                  /* AdamW scalars: 4 doubles per tensor of the largest run */
  double *scal_host;
  int scal_cap;
  /* collectives issued on the comm stream that compute has not waited for
   * yet, oldest first (see "Collectives on a CUDA device" below) */
  RtDevPending pend[RT_DEV_PENDING];
  int npend, next_event;
  long long ncoll, noverlap;   /* rt_dev_exec_comm_stats */
  long long dp_posted, dp_overlapped, dp_fresh;   /* rt_dev_exec_dp_stats; fresh: posted, no compute after yet */
  /* the pipeline on a device (see "The pipeline on a CUDA device") */
  VEC(DevKept) kept;
  VEC(DevSend) sends;
  VEC(DevBuf) pool;
};

RtDev *rt_dev_exec_dev(const RtDevExec *x) { return x->dev; }
const RtDevPlan *rt_dev_exec_plan(const RtDevExec *x) { return x->plan; }

static size_t value_bytes(const IrNode *nd) {
  return (size_t)ir_type_numel(&nd->type) * ir_dtype_size(nd->type.dtype);
}

/* ---- collectives on a CUDA device ---- */

/* Launches k0 .. k1-1 of a collective's re-layout kernels
 * (cg_cuda_comm_relayout) on the comm stream: buffers operand, result,
 * the comm scratch (NCCL's blocks). */
static int relayout_k(RtDevExec *x, const RtDevLib *rl, int k0, int k1, const void *in, void *out, char *msg,
                      size_t n) {
  CgCudaArgs a;
  memset(&a, 0, sizeof a);
  a.b[0] = (void *)in;
  a.b[1] = out;
  a.b[2] = x->comm_scratch;
  a.run = x->run_dev;
  for (int k = k0; k < k1 && k < rl->nl; k++)
    if (x->dev->ops->launch(x->dev, x->mod, &rl->l[k], &a, RT_STREAM_COMM, msg, n) != 0) return -1;
  return 0;
}

static int comm_relayout(RtDevExec *x, const RtDevLib *rl, const void *in, void *out, char *msg, size_t n) {
  return relayout_k(x, rl, 0, rl->nl, in, out, msg, n);
}

#define RT_DEV_RING_TAG 7101   /* the tag of the ring's exchanges (NCCL ignores tags; MPI would not) */

/* Why a collective cannot run as NCCL on device memory, or NULL.
 * all_gather / reduce_scatter are re-laid out around NCCL where their
 * blocks are not the value's layout (dev_prog.c, cg_cuda_comm_relayout). */
static const char *dev_comm_why(const IrNode *nd) {
  switch (nd->op) {
  case IR_OP_ALL_REDUCE: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER: case IR_OP_RING_SHIFT:
  case IR_OP_RING_WAIT: case IR_OP_SEND: case IR_OP_RECV: case IR_OP_STASH: case IR_OP_UNSTASH: case IR_OP_GROUP_SUM:
  case IR_OP_ALL_TO_ALL: case IR_OP_ALL_TO_ALL_V:
    return NULL;
  default:
    return "this collective is not wired to NCCL";
  }
}

/* Every collective of m in a form the device path runs (else the first
 * one, named). */
static int dev_comm_check(const IrModule *m, char *err, size_t errlen) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      const IrNode *nd = &b->nodes[i];
      if (!rt_dev_is_comm(nd->op)) continue;
      const char *why = dev_comm_why(nd);
      if (why)
        return ts_errf(err, errlen, "block %s, %%%d = %s on a CUDA device: %s (run with --cpu)", b->name, i,
                       ir_ops[nd->op].name, why);
    }
  }
  return 0;
}

/* Compute waits for pending collective k and every one before it (the
 * comm stream runs them in order); they are no longer pending. */
static int join_upto(RtDevExec *x, int k, char *msg, size_t n) {
  if (k < 0) return 0;
  if (x->dev->ops->stream_wait(x->dev, RT_STREAM_COMPUTE, x->pend[k].event, msg, n) != 0) return -1;
  memmove(x->pend, x->pend + k + 1, (size_t)(x->npend - k - 1) * sizeof *x->pend);
  x->npend -= k + 1;
  return 0;
}

static int overlaps(RtDevRange a, RtDevRange b) {
  uintptr_t p = (uintptr_t)a.p, q = (uintptr_t)b.p;
  return a.bytes > 0 && b.bytes > 0 && p < q + b.bytes && q < p + a.bytes;
}

int rt_dev_exec_order(RtDevExec *x, const RtDevRange *r, int nr, char *msg, size_t n) {
  int last = -1;
  for (int k = x->npend - 1; k >= 0 && last < 0; k--)
    for (int j = 0; j < nr && last < 0; j++)
      if (overlaps(r[j], x->pend[k].rd) || overlaps(r[j], x->pend[k].wr)) last = k;
  if (join_upto(x, last, msg, n) != 0) return -1;
  if (x->npend > 0) x->noverlap++;   /* issued while NCCL still works on an earlier collective */
  x->dp_overlapped += x->dp_fresh;   /* compute issued after the dp buckets posted before it */
  x->dp_fresh = 0;
  return 0;
}

void rt_dev_exec_dp_stats(const RtDevExec *x, long long *posted, long long *overlapped) {
  *posted = x->dp_posted;
  *overlapped = x->dp_overlapped;
}

void rt_dev_exec_comm_stats(const RtDevExec *x, long long *collectives, long long *overlapped) {
  *collectives = x->ncoll;
  *overlapped = x->noverlap;
}

int rt_dev_exec_join(RtDevExec *x, char *msg, size_t n) {
  x->dp_fresh = 0;   /* posted at the block's end: overlapped nothing */
  return join_upto(x, x->npend - 1, msg, n);
}

/* One collective on the rank's NCCL group of its axis, overlapping the
 * compute issued after it: the comm stream waits for the compute issued
 * so far (event 0), NCCL runs there, and an event recorded after it marks
 * it pending.  Compute waits for it only before work that touches its
 * buffers (rt_dev_exec_order: the executor names the buffers of every
 * node and kernel before issuing it), or at the end of the block
 * (rt_dev_exec_join).  The memory plan may give the collective's operand
 * to a later value once the collective is issued; that value's writer is
 * such work, so the operand is safe until NCCL is done.  Axis of size 1:
 * a copy on compute. */
/* Before work on the comm stream: it waits for the compute issued so far
 * (its operands may be the result of a pending collective: the comm stream
 * runs them in order, nothing to wait for); a full pending list first
 * waits for the oldest. */
static int comm_begin(RtDevExec *x, char *msg, size_t n) {
  RtDev *d = x->dev;
  if (x->npend == RT_DEV_PENDING && join_upto(x, 0, msg, n) != 0) return -1;
  return d->ops->event_record(d, 0, RT_STREAM_COMPUTE, msg, n) || d->ops->stream_wait(d, RT_STREAM_COMM, 0, msg, n);
}

/* After it: an event marks it pending, reading rd and writing wr. */
static int comm_end(RtDevExec *x, RtDevRange rd, RtDevRange wr, char *msg, size_t n) {
  int ev = 2 + x->next_event;
  x->next_event = (x->next_event + 1) % RT_DEV_PENDING;
  if (x->dev->ops->event_record(x->dev, ev, RT_STREAM_COMM, msg, n) != 0) return -1;
  x->pend[x->npend++] = (RtDevPending){rd, wr, ev};
  x->ncoll++;
  return 0;
}

static int dev_comm(RtDevExec *x, RtProgram *p, const IrBlock *b, const IrNode *nd, const void *in, void *out,
                    const RtDevLib *rl, char *msg, size_t n) {
  RtDev *d = x->dev;
  if (nd->op == IR_OP_RING_WAIT) {   /* the block its ring_shift received, once that is done */
    size_t bytes = value_bytes(nd);
    RtDevRange rw[2] = {{in, bytes}, {out, bytes}};
    if (out == in) return rt_dev_exec_order(x, rw, 2, msg, n);
    return rt_dev_exec_order(x, rw, 2, msg, n) || d->ops->d2d(d, out, in, bytes, RT_STREAM_COMPUTE, msg, n);
  }
  IrDtype dt = nd->type.dtype;
  size_t es = ir_dtype_size(dt), cin = (size_t)ir_type_numel(&b->nodes[nd->in[0]].type);
  size_t cout = (size_t)ir_type_numel(&nd->type);
  /* one axis, or a set of axes (ZeRO's dp+cp: one NCCL group over both) */
  int size = rt_rank_axes_size(rt_program_rank(p), nd->ia[0]);
  RtComm *g = size > 1 ? rt_rank_axes_group(rt_program_rank(p), nd->ia[0], 1) : NULL;
  if (size > 1 && !g) {
    char ax[32];
    snprintf(msg, n, "%s on %s: the rank has no NCCL group for the %s axis (mrun makes them on GPU ranks)",
             ir_ops[nd->op].name, d->label, ir_axes_str(nd->ia[0], ax, sizeof ax));
    return -1;
  }
  RtDevRange rw[2] = {{in, cin * es}, {out, cout * es}};
  if (!g) {
    if (out == in) return 0;
    return rt_dev_exec_order(x, rw, 2, msg, n) || d->ops->d2d(d, out, in, cout * es, RT_STREAM_COMPUTE, msg, n);
  }
  if (comm_begin(x, msg, n) != 0) return -1;
  int rc;
  switch (nd->op) {
  case IR_OP_ALL_REDUCE:
    rc = out == in ? 0 : d->ops->d2d(d, out, in, cout * es, RT_STREAM_COMM, msg, n);
    if (rc == 0)
      rc = nd->ia[1] == 0 ? rt_comm_all_reduce(g, dt, out, cout, msg, n) : rt_comm_all_reduce_max(g, dt, out, cout, msg, n);
    break;
  case IR_OP_ALL_GATHER:   /* with a re-layout: NCCL into the blocks, then the kernel into the value */
    rc = rt_comm_all_gather(g, dt, in, rl ? x->comm_scratch : out, cin, msg, n);
    if (rc == 0 && rl) rc = comm_relayout(x, rl, in, out, msg, n);
    break;
  case IR_OP_REDUCE_SCATTER:   /* with a re-layout: the kernel into the blocks, then NCCL */
    rc = rl ? comm_relayout(x, rl, in, out, msg, n) : 0;
    if (rc == 0) rc = rt_comm_reduce_scatter(g, dt, rl ? x->comm_scratch : in, out, cout, msg, n);
    break;
  case IR_OP_ALL_TO_ALL:   /* pack the blocks, exchange (i32 travels as 4-byte words: NCCL copies bytes), place */
    if (!rl) {
      snprintf(msg, n, "internal error: all_to_all without its packing kernels");
      return -1;
    }
    rc = relayout_k(x, rl, 0, 1, in, out, msg, n);
    if (rc == 0)
      rc = rt_comm_all_to_all(g, dt == IR_I32 ? IR_F32 : dt, x->comm_scratch, (char *)x->comm_scratch + cin * es,
                              cin / (size_t)size, msg, n);
    if (rc == 0) rc = relayout_k(x, rl, 1, 2, in, out, msg, n);
    break;
  case IR_OP_RING_SHIFT: {
    /* x to the next rank, the previous rank's x into this node's result,
     * as one NCCL group posted now: the exchange runs while compute goes
     * on, and the ring_wait copies the block out once it is done */
    int me = rt_comm_rank(g);
    RtCommReq *req = NULL;
    rc = rt_comm_isend(g, dt, in, cin, (me + 1) % size, RT_DEV_RING_TAG, &req, msg, n);
    if (rc == 0) rc = rt_comm_recv(g, dt, out, cout, (me - 1 + size) % size, RT_DEV_RING_TAG, msg, n);
    if (rc == 0) rc = rt_comm_wait_all(&req, 1, msg, n);   /* posted with the receive: done in stream order */
    break;
  }
  default:
    snprintf(msg, n, "internal error: %s reached the device collectives", ir_ops[nd->op].name);
    return -1;
  }
  if (rc != 0) return -1;
  return comm_end(x, rw[0], rw[1], msg, n);
}

int rt_dev_exec_dp_post(RtDevExec *x, RtProgram *p, IrOp op, int64_t axes, IrDtype dt, const RtDevPack *pack,
                        int npack, void *buf, void *recv, size_t count, char *msg, size_t n) {
  RtDev *d = x->dev;
  RtComm *g = rt_rank_axes_group(rt_program_rank(p), axes, 1);
  int size = rt_rank_axes_size(rt_program_rank(p), axes);
  if (!g) {
    char ax[32];
    snprintf(msg, n, "dp bucket on %s: the rank has no NCCL group for the %s axis", d->label,   /* internal */
             ir_axes_str(axes, ax, sizeof ax));
    return -1;
  }
  if (comm_begin(x, msg, n) != 0) return -1;
  for (int k = 0; k < npack; k++) {
    char *dst = (char *)buf + pack[k].off;
    if (pack[k].src ? d->ops->d2d(d, dst, pack[k].src, pack[k].bytes, RT_STREAM_COMM, msg, n)
                    : d->ops->memset0(d, dst, pack[k].bytes, RT_STREAM_COMM, msg, n))
      return -1;
  }
  size_t es = ir_dtype_size(dt);
  int rs = op == IR_OP_REDUCE_SCATTER;
  int rc = rs ? rt_comm_reduce_scatter(g, dt, buf, recv, count, msg, n) : rt_comm_all_reduce(g, dt, buf, count, msg, n);
  if (rc != 0) return -1;
  RtDevRange rd = {buf, count * es * (rs ? (size_t)size : 1)}, wr = rs ? (RtDevRange){recv, count * es} : rd;
  x->dp_posted++;
  x->dp_fresh++;
  return comm_end(x, rd, wr, msg, n);
}

/* all_to_all_v (docs/ir.md "Token dispatch", ops_a2a.c): the row counts
 * decide the sizes, so the counts come to the host first (compute waits
 * for what produces them: a copy and a sync, as Megatron's dispatcher
 * syncs its token counts); then on the comm stream: the expert layout
 * regrouped source-major by copies (rev=1, into the comm scratch), NCCL's
 * variable all-to-all, the received rows regrouped into the expert
 * layout (rev=0, from the scratch), the rows past the received total
 * zeroed. */
typedef struct { RtDevExec *x; char *em, *sm; size_t rowb; int to_em; char *msg; size_t n; } RegroupDev;

static int regroup_copy(void *cp, int64_t em_row, int64_t sm_row, int64_t rows) {
  RegroupDev *c = cp;
  char *e = c->em + (size_t)em_row * c->rowb, *m = c->sm + (size_t)sm_row * c->rowb;
  return c->x->dev->ops->d2d(c->x->dev, c->to_em ? e : m, c->to_em ? m : e, (size_t)rows * c->rowb, RT_STREAM_COMM,
                             c->msg, c->n);
}

/* em <-> sm (rt_a2a_regroup) by copies on the comm stream; to_em: sm -> em. */
static int regroup_dev(RtDevExec *x, char *em, char *sm, const int32_t *rcnt, const int64_t *exp, int S, int G,
                       size_t rowb, int to_em, char *msg, size_t n) {
  RegroupDev c = {x, em, sm, rowb, to_em, msg, n};
  return rt_a2a_regroup(rcnt, exp, S, G, regroup_copy, &c);
}

static int dev_a2av(RtDevExec *x, RtProgram *p, const IrBlock *b, const IrNode *nd, const void *const *in, void *out,
                    char *msg, size_t n) {
  RtDev *d = x->dev;
  IrAxis ax = (IrAxis)nd->ia[0];
  int S = rt_program_axis_size(p, ax), rev = nd->ia[1] != 0;
  const IrType *xt = &b->nodes[nd->in[0]].type, *rt = &b->nodes[nd->in[2]].type;
  int G = (int)rt->dim[1], ncnt = (int)(S * G);
  int64_t D = xt->dim[1], xrows = xt->dim[0], orows = nd->type.dim[0];
  size_t rowb = (size_t)D * ir_dtype_size(xt->dtype);
  RtComm *g = S > 1 ? rt_program_dev_group(p, ax) : NULL;
  if (S > 1 && !g) {
    snprintf(msg, n, "all_to_all_v on %s: the rank has no NCCL group for the %s axis", d->label, ir_axis_name(ax));
    return -1;
  }
  int32_t *cnt = ts_xcalloc((size_t)ncnt * 2, sizeof *cnt), *rcnt = cnt + ncnt;
  int64_t *tok = ts_xcalloc((size_t)S * 2, sizeof *tok), *exp = tok + S, ttot = 0, etot = 0;
  int *cd = ts_xcalloc((size_t)S * 4, sizeof *cd);
  int rc = -1;
  RtDevRange cr[2] = {{in[1], (size_t)ncnt * 4}, {in[2], (size_t)ncnt * 4}};
  if (rt_dev_exec_order(x, cr, 2, msg, n) || d->ops->d2h(d, cnt, in[1], (size_t)ncnt * 4, RT_STREAM_COMPUTE, msg, n) ||
      d->ops->d2h(d, rcnt, in[2], (size_t)ncnt * 4, RT_STREAM_COMPUTE, msg, n) ||
      d->ops->sync(d, RT_STREAM_COMPUTE, msg, n))
    goto out;
  for (int j = 0; j < S; j++)
    for (int q = 0; q < G; q++) {
      if (cnt[j * G + q] < 0 || rcnt[j * G + q] < 0) { snprintf(msg, n, "a negative count"); goto out; }
      tok[j] += cnt[j * G + q];
      exp[j] += rcnt[j * G + q];
    }
  for (int j = 0; j < S; j++) ttot += tok[j], etot += exp[j];
  int64_t in_need = rev ? etot : ttot, out_need = rev ? ttot : etot;
  if (in_need > xrows || out_need > orows || in_need * D > INT32_MAX || out_need * D > INT32_MAX) {
    snprintf(msg, n, "%lld rows to send and %lld to receive do not fit the %lld / %lld rows of the "
             "buffers (the routing counts and the layout disagree)", (long long)in_need, (long long)out_need,
             (long long)xrows, (long long)orows);
    goto out;
  }
  if (comm_begin(x, msg, n) != 0) goto out;
  char *sm = x->comm_scratch;   /* the rows in flight, source-major */
  if (out_need < orows &&
      d->ops->memset0(d, (char *)out + (size_t)out_need * rowb, (size_t)(orows - out_need) * rowb, RT_STREAM_COMM, msg, n))
    goto out;
  if (!g) {   /* one rank: the two layouts are the same */
    if (out_need && d->ops->d2d(d, out, in[0], (size_t)out_need * rowb, RT_STREAM_COMM, msg, n)) goto out;
  } else {
    int *tc = cd, *td = cd + S, *ec = cd + 2 * S, *ed = cd + 3 * S;
    for (int j = 0, t = 0, e = 0; j < S; j++) {
      tc[j] = (int)(tok[j] * D), td[j] = t, t += tc[j];
      ec[j] = (int)(exp[j] * D), ed[j] = e, e += ec[j];
    }
    if (rev) {
      if (regroup_dev(x, (char *)(uintptr_t)in[0], sm, rcnt, exp, S, G, rowb, 0, msg, n) ||
          rt_comm_all_to_all_v(g, xt->dtype, sm, ec, ed, out, tc, td, msg, n))
        goto out;
    } else if (rt_comm_all_to_all_v(g, xt->dtype, in[0], tc, td, sm, ec, ed, msg, n) ||
               regroup_dev(x, out, sm, rcnt, exp, S, G, rowb, 1, msg, n)) {
      goto out;
    }
  }
  rc = comm_end(x, (RtDevRange){in[0], (size_t)xrows * rowb}, (RtDevRange){out, (size_t)orows * rowb}, msg, n);
out:
  free(cnt);
  free(tok);
  free(cd);
  return rc;
}

/* ---- the pipeline on a CUDA device ----
 * What ops_pipe.c does on host memory, with device buffers:
 *   send       x copied into a pool buffer on compute (the executor reuses
 *              x's buffer after the node), then queued on the axis' NCCL
 *              group (rt_comm_isend): NCCL gets it with the group's next
 *              receive, in one NCCL group, so two stages sending to each
 *              other never wait on each other's send.  To this rank's own
 *              coordinate (interleaved chunks): a local hand-off.
 *   recv       the queued sends and this receive as one NCCL group on the
 *              comm stream, pending like a collective.
 *   stash / unstash   keyed by (chunk, micro batch, slot): where the
 *              memory plan hands the buffer over (memplan.h, ext), the
 *              value was made in a pool buffer (rt_dev_exec_pipe_buf) and
 *              the stash keeps it, the unstash gives it back as its result
 *              (rt_dev_exec_handover; nothing runs on the device);
 *              otherwise a copy into / out of a pool buffer on compute.
 *   group_sum  of at most two members (the tied weights of the first and
 *              last stage): x to the other member and its value into the
 *              comm scratch as one NCCL group, then x + theirs on the comm
 *              stream (cg_cuda_comm_relayout's kernel; two terms add the
 *              same bits in either order).
 * Send buffers return to the pool when the step ends
 * (rt_dev_exec_pipe_end: the last queued sends flushed, the comm stream
 * synced); the others as soon as their copy is issued (the compute
 * stream orders every later use). */
#define RT_DEV_GROUP_SUM_TAG 32767

static int pool_get(RtDevExec *x, size_t bytes, void **buf, char *msg, size_t n) {
  for (int i = 0; i < x->pool.n; i++)
    if (x->pool.a[i].bytes == bytes) {
      *buf = x->pool.a[i].p;
      x->pool.a[i] = x->pool.a[--x->pool.n];
      return 0;
    }
  char why[256];
  if (x->dev->ops->alloc(x->dev, bytes ? bytes : 1, buf, why, sizeof why) != 0) {
    snprintf(msg, n, "device memory for a pipeline buffer of %zu bytes on %s: %s", bytes, x->dev->label, why);
    return -1;
  }
  return 0;
}

static void pool_put(RtDevExec *x, void *buf, size_t bytes) {
  DevBuf e = {bytes, buf};
  VEC_PUSH(x->pool, e);
}

/* A pool buffer's size for a value of `bytes` bytes: the memory plan's
 * (64-byte multiples, 64 at least), so that buffers it hands over and the
 * stash's copies are interchangeable. */
static size_t pipe_cap(size_t bytes) { return ((bytes ? bytes : 1) + 63) & ~(size_t)63; }

int rt_dev_exec_pipe_buf(RtDevExec *x, size_t bytes, void **buf, char *msg, size_t n) {
  return pool_get(x, pipe_cap(bytes), buf, msg, n);
}

void rt_dev_exec_pipe_unbuf(RtDevExec *x, void *buf, size_t bytes) {
  if (buf) pool_put(x, buf, pipe_cap(bytes));
}

static DevKept *kept_find(RtDevExec *x, char kind, int chunk, int micro, int64_t key) {
  for (int i = 0; i < x->kept.n; i++) {   /* hand-offs: the oldest with the tag */
    DevKept *e = &x->kept.a[i];
    if (e->kind == kind && e->key == key && (kind == 'm' || (e->chunk == chunk && e->micro == micro))) return e;
  }
  return NULL;
}

static void kept_drop(RtDevExec *x, DevKept *e) {
  memmove(e, e + 1, (size_t)(x->kept.a + x->kept.n - e - 1) * sizeof *e);
  x->kept.n--;
}

/* A copy on compute after the collectives touching either buffer. */
static int copy_ordered(RtDevExec *x, void *dst, const void *src, size_t bytes, char *msg, size_t n) {
  RtDevRange rw[2] = {{src, bytes}, {dst, bytes}};
  return rt_dev_exec_order(x, rw, 2, msg, n) || x->dev->ops->d2d(x->dev, dst, src, bytes, RT_STREAM_COMPUTE, msg, n);
}

/* stash: keeps *buf (a pool buffer holding the operand's value) for the
 * node's (chunk, micro batch, slot).  unstash: takes that buffer out,
 * into *buf (handed over), or copied into *buf (copy) and returned to
 * the pool.  0, or -1 with a message (a stash's buffer stays the caller's). */
static int stash_op(RtDevExec *x, const IrBlock *b, const IrNode *nd, const RtRunInfo *info, void **buf, int copy,
                    char *msg, size_t n) {
  int bwd, chunk = ir_block_chunk(b, &bwd), micro = info ? info->micro : 0;
  int64_t slot = nd->ia[0];
  const IrType *vt = nd->op == IR_OP_STASH ? &b->nodes[nd->in[0]].type : &nd->type;
  size_t bytes = (size_t)ir_type_numel(vt) * ir_dtype_size(vt->dtype);
  DevKept *e = kept_find(x, 's', chunk, micro, slot);
  if (nd->op == IR_OP_UNSTASH) {
    if (!e || e->bytes != bytes) {
      snprintf(msg, n, "nothing of %zu bytes stashed for chunk %d, micro batch %d, slot %lld", bytes, chunk, micro,
               (long long)slot);
      return -1;
    }
    if (!copy) *buf = e->buf;
    else if (copy_ordered(x, *buf, e->buf, bytes, msg, n) != 0) return -1;
    else pool_put(x, e->buf, e->cap);
    kept_drop(x, e);
    return 0;
  }
  if (e) {
    snprintf(msg, n, "chunk %d, micro batch %d, slot %lld is already stashed", chunk, micro, (long long)slot);
    return -1;
  }
  DevKept k = {'s', chunk, micro, slot, bytes, *buf, pipe_cap(bytes)};
  VEC_PUSH(x->kept, k);
  return 0;
}

int rt_dev_exec_handover(RtDevExec *x, const IrBlock *b, const IrNode *nd, const RtRunInfo *info, void **buf,
                         char *msg, size_t n) {
  return stash_op(x, b, nd, info, buf, 0, msg, n);
}

static int dev_pipe(RtDevExec *x, RtProgram *p, const IrBlock *b, const IrNode *nd, const void *in, void *out,
                    const RtDevLib *rl, const RtRunInfo *info, char *msg, size_t n) {
  int bwd, chunk = ir_block_chunk(b, &bwd), micro = info ? info->micro : 0;
  const IrType *vt = nd->op == IR_OP_SEND || nd->op == IR_OP_STASH || nd->op == IR_OP_GROUP_SUM
                         ? &b->nodes[nd->in[0]].type : &nd->type;
  size_t bytes = (size_t)ir_type_numel(vt) * ir_dtype_size(vt->dtype);
  if (nd->op == IR_OP_UNSTASH) {   /* copied out of the stash into the result */
    void *buf = out;
    return stash_op(x, b, nd, info, &buf, 1, msg, n);
  }
  if (nd->op == IR_OP_STASH) {     /* a copy kept: returned to the pool if it cannot be */
    void *buf;
    if (pool_get(x, pipe_cap(bytes), &buf, msg, n) != 0) return -1;
    if (copy_ordered(x, buf, in, bytes, msg, n) == 0 && stash_op(x, b, nd, info, &buf, 1, msg, n) == 0) return 0;
    pool_put(x, buf, pipe_cap(bytes));
    return -1;
  }
  IrAxis ax = (IrAxis)nd->ia[0];
  int size = rt_program_axis_size(p, ax), coord = rt_program_rank(p)->coord[ax];
  RtComm *g = size > 1 ? rt_program_dev_group(p, ax) : NULL;
  IrDtype dt = vt->dtype;
  size_t count = (size_t)ir_type_numel(vt);
  if (nd->op == IR_OP_GROUP_SUM) {
    uint64_t mask = (uint64_t)nd->ia[1];
    int other = -1, members = 0;
    for (int q = 0; q < size && q < 64; q++)
      if (mask >> q & 1) members++, other = q != coord ? q : other;
    if (members == 1) return out == in ? 0 : copy_ordered(x, out, (void *)in, bytes, msg, n);
    if (members != 2 || other < 0 || !g || !rl) {
      snprintf(msg, n, "group_sum ranks=%lld on a CUDA device: only two members, this rank one of them, are wired",
               (long long)mask);
      return -1;
    }
    RtCommReq *req = NULL;
    if (comm_begin(x, msg, n) || rt_comm_isend(g, dt, in, count, other, RT_DEV_GROUP_SUM_TAG, &req, msg, n) ||
        rt_comm_recv(g, dt, x->comm_scratch, count, other, RT_DEV_GROUP_SUM_TAG, msg, n) ||
        rt_comm_wait_all(&req, 1, msg, n) || comm_relayout(x, rl, in, out, msg, n))
      return -1;
    return comm_end(x, (RtDevRange){in, bytes}, (RtDevRange){out, bytes}, msg, n);
  }
  int64_t q = ((int64_t)coord + nd->ia[1]) % size;
  int peer = (int)(q < 0 ? q + size : q), tag = (int)nd->ia[2];
  if (peer != coord && !g) {
    snprintf(msg, n, "%s on %s: the rank has no NCCL group for the %s axis", ir_ops[nd->op].name, x->dev->label,
             ir_axis_name(ax));
    return -1;
  }
  if (nd->op == IR_OP_SEND) {
    void *buf;
    if (pool_get(x, bytes, &buf, msg, n) || copy_ordered(x, buf, in, bytes, msg, n)) return -1;
    if (peer == coord) {
      DevKept k = {'m', chunk, micro, tag, bytes, buf, bytes};
      VEC_PUSH(x->kept, k);
      return 0;
    }
    DevSend s = {NULL, buf, bytes};
    if (comm_begin(x, msg, n) || rt_comm_isend(g, dt, buf, count, peer, tag, &s.req, msg, n)) {
      pool_put(x, buf, bytes);
      return -1;
    }
    VEC_PUSH(x->sends, s);
    return 0;
  }
  /* recv */
  if (peer == coord) {
    DevKept *e = kept_find(x, 'm', 0, 0, tag);
    if (!e || e->bytes != bytes) {
      snprintf(msg, n, "recv with tag %d from this rank's own coordinate: nothing of %zu bytes was sent with it", tag,
               bytes);
      return -1;
    }
    if (copy_ordered(x, out, e->buf, bytes, msg, n) != 0) return -1;
    pool_put(x, e->buf, e->bytes);
    kept_drop(x, e);
    return 0;
  }
  if (comm_begin(x, msg, n) || rt_comm_recv(g, dt, out, count, peer, tag, msg, n)) return -1;
  for (int i = 0; i < x->sends.n; i++) rt_comm_test(&x->sends.a[i].req);   /* posted with it: free the requests */
  return comm_end(x, (RtDevRange){NULL, 0}, (RtDevRange){out, bytes}, msg, n);
}

int rt_dev_exec_pipe_end(RtDevExec *x, char *msg, size_t n) {
  RtDev *d = x->dev;
  int rc = 0;
  for (int i = 0; i < x->sends.n && rc == 0; i++) rc = rt_comm_wait_all(&x->sends.a[i].req, 1, msg, n);
  if (rc == 0 && x->sends.n) rc = d->ops->sync(d, RT_STREAM_COMM, msg, n);
  for (int i = 0; i < x->sends.n; i++) pool_put(x, x->sends.a[i].buf, x->sends.a[i].bytes);
  x->sends.n = 0;
  if (rc == 0 && x->kept.n) {
    const DevKept *e = &x->kept.a[0];
    snprintf(msg, n, "the step ended with %d pipeline value%s kept on the device and never %s; the first: chunk %d, "
             "micro batch %d, %s %lld", x->kept.n, x->kept.n == 1 ? "" : "s", e->kind == 's' ? "unstashed" : "received",
             e->chunk, e->micro, e->kind == 's' ? "slot" : "tag", (long long)e->key);
    rc = -1;
  }
  for (int i = 0; i < x->kept.n; i++) pool_put(x, x->kept.a[i].buf, x->kept.a[i].cap);
  x->kept.n = 0;
  return rc;
}

RtDevExec *rt_dev_exec_new(const IrModule *m, const RtExecOpts *o, RtJit *jit, const MemPlan *const *plans,
                           char *err, size_t errlen) {
  RtDevExec *x = ts_xcalloc(1, sizeof *x);
  RtDev *d = x->dev = o->dev;
  char why[512];
  if (!(x->plan = rt_dev_plan_new(m, jit, plans, err, errlen))) goto fail;
  RtDevImage src = {x->plan->mod.src.p, NULL, NULL, 0, 0};
  if (o->image && o->image->source && strcmp(o->image->source, x->plan->mod.src.p) != 0) {
    ts_errf(err, errlen, "the plan's CUDA module is not the one this program needs (recompile the plan)");
    goto fail;
  }
  if (d->ops->module_load(d, o->image ? o->image : &src, &x->mod, why, sizeof why) != 0) {
    ts_errf(err, errlen, "loading the CUDA module on %s: %s", d->label, why);
    goto fail;
  }
  if (!d->host_memory && dev_comm_check(m, err, errlen) != 0) goto fail;
  /* every optimizer-step run its own slots of scalars: a run's host-to-device
   * copy is asynchronous, so the next run must not overwrite what it copies */
  int most = 1;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const RtJitBlock *jb = rt_jit_block(jit, bi);
    for (int k = 0; jb && k < jb->k.n; k++)
      if (jb->k.a[k].opt && jb->k.a[k].scal_at + jb->k.a[k].nrun > most) most = jb->k.a[k].scal_at + jb->k.a[k].nrun;
  }
  x->scal_cap = most;
  x->scal_host = ts_xcalloc((size_t)most * 4, sizeof *x->scal_host);
  if (d->ops->alloc(d, CG_RUN_WORDS * sizeof(long long), &x->run_dev, why, sizeof why) != 0 ||
      d->ops->alloc(d, (size_t)most * 4 * sizeof(double), &x->scal_dev, why, sizeof why) != 0 ||
      (x->plan->scratch > 0 && d->ops->alloc(d, (size_t)x->plan->scratch, &x->scratch, why, sizeof why) != 0) ||
      (x->plan->comm_scratch > 0 &&
       d->ops->alloc(d, (size_t)x->plan->comm_scratch, &x->comm_scratch, why, sizeof why) != 0)) {
    ts_errf(err, errlen, "device memory on %s: %s", d->label, why);
    goto fail;
  }
  return x;
fail:
  rt_dev_exec_free(x);
  return NULL;
}

void rt_dev_exec_free(RtDevExec *x) {
  if (!x) return;
  RtDev *d = x->dev;
  if (x->run_dev) d->ops->free(d, x->run_dev);
  if (x->scal_dev) d->ops->free(d, x->scal_dev);
  if (x->scratch) d->ops->free(d, x->scratch);
  if (x->comm_scratch) d->ops->free(d, x->comm_scratch);
  /* an abandoned step's sends: their requests stay with the group's queue */
  for (int i = 0; i < x->sends.n; i++) d->ops->free(d, x->sends.a[i].buf);
  for (int i = 0; i < x->kept.n; i++) d->ops->free(d, x->kept.a[i].buf);
  for (int i = 0; i < x->pool.n; i++) d->ops->free(d, x->pool.a[i].p);
  free(x->sends.a);
  free(x->kept.a);
  free(x->pool.a);
  if (x->mod) d->ops->module_free(d, x->mod);
  rt_dev_plan_free(x->plan);
  free(x->scal_host);
  free(x);
}

int rt_dev_exec_begin(RtDevExec *x, RtProgram *p, const RtRunInfo *info, char *msg, size_t n) {
  long long w[CG_RUN_WORDS];
  memset(w, 0, sizeof w);
  w[CG_RUN_SEED] = (long long)rt_program_seed(p);
  w[CG_RUN_STEP] = info ? info->step : 0;
  w[CG_RUN_MICRO] = info ? info->micro : 0;
  double lr = info ? info->lr : 0;
  memcpy(&w[CG_RUN_LR], &lr, sizeof lr);
  const RtRank *r = rt_program_rank(p);
  for (int a = 0; a < IR_AXIS_COUNT; a++) w[CG_RUN_COORD + a] = r->coord[a];
  if (x->run_valid && memcmp(w, x->run_host, sizeof w) == 0) return 0;
  memcpy(x->run_host, w, sizeof w);
  x->run_valid = 1;
  /* the device reads the words after the copy is done; the host array
   * stays as it is until the next change */
  return x->dev->ops->h2d(x->dev, x->run_dev, x->run_host, sizeof w, RT_STREAM_COMPUTE, msg, n);
}

static int launch(RtDevExec *x, const CgCudaLaunch *l, const CgCudaArgs *a, char *msg, size_t n) {
  return x->dev->ops->launch(x->dev, x->mod, l, a, RT_STREAM_COMPUTE, msg, n);
}

static void *dev_state(const RtProgram *p, int id) { return rt_state_dev((RtProgram *)p, id); }

/* A run of optimizer steps: per tensor, the buffers of cg_opt_step_layout
 * ((coef,) grad, its scalars, param at the rank's chunk, moments) -- the
 * kernels of exec_jit.c's cuda_opt_run, one launch per tensor. */
static int opt_run(RtDevExec *x, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void *const *vals,
                   const RtRunInfo *info, char *msg, size_t n) {
  const IrModule *m = rt_program_module(p);
  RtDev *d = x->dev;
  if (K->scal_at < 0 || K->scal_at + K->nrun > x->scal_cap) {
    snprintf(msg, n, "internal error: optimizer-step run larger than planned");
    return -1;
  }
  double *sh = x->scal_host + 4 * K->scal_at, *sd = (double *)x->scal_dev + 4 * K->scal_at;
  for (int t = 0; t < K->nrun; t++) rt_jit_opt_scalars(&m->train, &b->nodes[K->run[t]], info, &sh[4 * t]);
  if (d->ops->h2d(d, sd, sh, (size_t)K->nrun * 4 * sizeof(double), RT_STREAM_COMPUTE, msg, n)) return -1;
  for (int t = 0; t < K->nrun; t++) {
    const IrNode *nd = &b->nodes[K->run[t]];
    size_t es = ir_dtype_size(m->states.a[nd->ia[0]].type.dtype);
    int64_t off, cnt;
    rt_jit_opt_chunk(p, nd, &off, &cnt);
    if (cnt == 0) continue;
    const CgCudaLaunch *l = K->ccnt[2 * t] == cnt ? &K->cls[2 * t] : K->ccnt[2 * t + 1] == cnt ? &K->cls[2 * t + 1] : NULL;
    if (!l) {
      snprintf(msg, n, "internal error: no %s kernel for %lld elements", ir_ops[nd->op].name, (long long)cnt);
      return -1;
    }
    CgCudaArgs a;
    memset(&a, 0, sizeof a);
    int nb = rt_jit_opt_buffers(p, nd, vals, sd + 4 * t, off, dev_state, a.b);
    if (nb < 0) { snprintf(msg, n, "internal error: %s %%%d's operand has no buffer", ir_ops[nd->op].name, K->run[t]); return -1; }
    a.run = x->run_dev;
    /* the ranges it reads and writes, against the collectives in flight: operands whole, states the count */
    RtDevRange r[6];
    int nr = 0;
    for (int j = 0; j < nd->nin; j++) r[nr++] = (RtDevRange){a.b[j], value_bytes(&b->nodes[nd->in[j]])};
    for (int j = nd->nin + 1; j < nb; j++) r[nr++] = (RtDevRange){a.b[j], (size_t)cnt * es};
    if (x->npend && rt_dev_exec_order(x, r, nr, msg, n) != 0) return -1;
    if (launch(x, l, &a, msg, n) != 0) return -1;
  }
  return 0;
}

/* The GEMM(s) of matmul node mm into c: C = op(A) op(B) (+ bias per
 * column when bias is not NULL). */
static int gemm(RtDevExec *x, const IrBlock *b, const IrNode *mm, const void *A, const void *B, void *C,
                const void *bias, double beta, char *msg, size_t n) {
  int64_t M, N, K, batch;
  int shared;
  if (rt_gemm_shape(b, mm, &M, &N, &K, &batch, &shared) != 0) {
    snprintf(msg, n, "internal error: a product the device GEMM does not take");
    return -1;
  }
  int ta = mm->ia[0] != 0, tb = mm->ia[1] != 0;
  RtGemm g;
  memset(&g, 0, sizeof g);
  g.dtype = mm->type.dtype;
  g.ab_dtype = b->nodes[mm->in[0]].type.dtype;   /* bf16 / f16 operands: f32 accumulation (OPF_MIXED) */
  g.ta = ta;
  g.tb = tb;
  g.m = M;
  g.n = N;
  g.k = K;
  g.lda = ta ? M : K;
  g.ldb = tb ? K : N;
  g.ldc = N;
  g.batch = batch;
  g.stride_a = M * K;
  g.stride_b = shared ? 0 : K * N;
  g.stride_c = M * N;
  if (shared && !ta) {   /* every batch item's rows in one product */
    g.m = batch * M;
    g.batch = 1;
    g.stride_a = g.stride_c = 0;
  }
  g.alpha = 1;
  g.beta = beta;
  g.a = A;
  g.b = B;
  g.c = C;
  g.bias = bias;
  g.epilogue = bias ? RT_GEMM_BIAS : RT_GEMM_PLAIN;
  if (batch * M * N == 0) return 0;
  return x->dev->ops->gemm(x->dev, &g, RT_STREAM_COMPUTE, msg, n);
}

/* matmul8 (--fp8): cuBLASLt's fp8 GEMM, which takes only the TN form
 * (RtGemm ta=0 tb=1): an operand stored the other way is first transposed
 * into the scratch by the node's library kernels l (cuda_fp8.c; none when
 * both are in place), then the GEMM reads A' / B' there, the operands'
 * scale_inv (in[2], in[3]) as cuBLASLt's scale pointers. */
static int gemm8(RtDevExec *x, const IrBlock *b, const IrNode *nd, const void *const *in, void *out,
                 const RtDevLib *l, char *msg, size_t n) {
  int64_t M, N, K, batch;
  int shared;
  if (rt_gemm_shape(b, nd, &M, &N, &K, &batch, &shared) != 0) {
    snprintf(msg, n, "internal error: an fp8 product the device GEMM does not take");
    return -1;
  }
  int ta = nd->ia[0] != 0, tb = nd->ia[1] != 0;
  if (l && l->nl) {
    CgCudaArgs a;
    memset(&a, 0, sizeof a);
    for (int k = 0; k < 4; k++) a.b[k] = (void *)in[k];
    a.b[4] = out;
    a.b[5] = x->scratch;
    a.run = x->run_dev;
    for (int k = 0; k < l->nl; k++)
      if (launch(x, &l->l[k], &a, msg, n) != 0) return -1;
  }
  char *s = x->scratch;
  RtGemm g;
  memset(&g, 0, sizeof g);
  g.dtype = nd->type.dtype;
  g.ab_dtype = b->nodes[nd->in[0]].type.dtype;
  g.b8_dtype = b->nodes[nd->in[1]].type.dtype;
  g.tb = 1;
  g.m = shared ? batch * M : M;   /* A' rows are contiguous: one product for every item of a shared B */
  g.n = N;
  g.k = K;
  g.lda = g.ldb = K;
  g.ldc = N;
  g.batch = shared ? 1 : batch;
  g.stride_a = shared ? 0 : M * K;
  g.stride_b = shared ? 0 : N * K;
  g.stride_c = shared ? 0 : M * N;
  g.alpha = 1;
  g.a = ta ? s : in[0];
  g.b = tb ? in[1] : s + cg_cuda_mm8_b_offset(ta ? batch * M * K : 0);
  g.c = out;
  g.scale_a = in[2];
  g.scale_b = in[3];
  if (batch * M * N == 0) return 0;
  return x->dev->ops->gemm(x->dev, &g, RT_STREAM_COMPUTE, msg, n);
}

int rt_dev_exec_kernel(RtDevExec *x, RtProgram *p, int bi, const RtJitKernel *K, void **bufs, void *const *vals,
                       const RtRunInfo *info, char *msg, size_t n) {
  const IrBlock *b = &rt_program_module(p)->blocks.a[bi];
  if (K->opt) return opt_run(x, p, b, K, vals, info, msg, n);
  if (x->npend) {   /* its buffers against the collectives in flight */
    RtDevRange r[CG_MAX_BUFS];
    int nr = 0;
    for (int k = 0; k < K->io.nin && nr < CG_MAX_BUFS; k++) r[nr++] = (RtDevRange){bufs[k], value_bytes(&b->nodes[K->io.in[k]])};
    for (int j = 0; j < K->io.nout && nr < CG_MAX_BUFS; j++)
      r[nr++] = (RtDevRange){bufs[K->io.nin + j], value_bytes(&b->nodes[K->io.out[j]])};
    if (rt_dev_exec_order(x, r, nr, msg, n) != 0) return -1;
  }
  if (K->gemm_mm) {   /* A, B, bias -> the add's value */
    const IrNode *mm = &b->nodes[K->gemm_mm - 1];
    return gemm(x, b, mm, bufs[0], bufs[1], bufs[3], bufs[2], 0, msg, n);
  }
  if (K->accum_from) {   /* a weight gradient's GEMM adding into its state: C = A B + C */
    const IrNode *mm = &b->nodes[K->accum_from - 1], *acc = &b->nodes[K->at];
    void *C = rt_state_dev(p, (int)acc->ia[0]);
    RtDevRange r = {C, value_bytes(mm)};
    return rt_dev_exec_order(x, &r, 1, msg, n) || gemm(x, b, mm, bufs[0], bufs[1], C, NULL, 1, msg, n);
  }
  CgCudaArgs a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < K->io.nin + K->io.nout; k++) a.b[k] = bufs[k];
  a.run = x->run_dev;
  if (K->attn_grads) {   /* one attention's backward: its library kernels (cg_cuda_attn_grads_kernel) */
    int li = x->plan->blk[bi].lib[K->at];
    if (li < 0) { snprintf(msg, n, "internal error: attention backward %%%d has no kernels", K->at); return -1; }
    const RtDevLib *l = &x->plan->lib.a[li];
    if (l->scratch > 0) a.b[K->io.nin + K->io.nout] = x->scratch;
    for (int k = 0; k < l->nl; k++)
      if (launch(x, &l->l[k], &a, msg, n) != 0) return -1;
    return 0;
  }
  return launch(x, &K->cl, &a, msg, n);
}

/* Node nd's buffers (operands, result, the states it names) against the
 * collectives in flight. */
static int node_order(RtDevExec *x, RtProgram *p, const IrBlock *b, const IrNode *nd, const void *const *in,
                      const void *out, char *msg, size_t n) {
  const IrModule *m = rt_program_module(p);
  RtDevRange r[72];
  int nr = 0;
  for (int k = 0; k < nd->nin && nr < 64; k++) r[nr++] = (RtDevRange){in[k], value_bytes(&b->nodes[nd->in[k]])};
  if (out) r[nr++] = (RtDevRange){out, value_bytes(nd)};
  const char *s = ir_ops[nd->op].iattrs;
  for (int slot = 0; *s && slot < IR_MAX_IATTR && nr < 72; slot++) {
    while (*s == ' ') s++;
    if (!*s) break;
    if (*s == '@') {
      const IrState *st = &m->states.a[nd->ia[slot]];
      r[nr++] = (RtDevRange){rt_state_dev(p, (int)nd->ia[slot]),
                             (size_t)ir_type_numel(&st->type) * ir_dtype_size(st->type.dtype)};
    }
    s += strcspn(s, " ");
  }
  return rt_dev_exec_order(x, r, nr, msg, n);
}

int rt_dev_exec_node(RtDevExec *x, RtProgram *p, int bi, int i, const void *const *in, void *out, const RtRunInfo *info,
                     char *msg, size_t n) {
  const IrModule *m = rt_program_module(p);
  const IrBlock *b = &m->blocks.a[bi];
  const IrNode *nd = &b->nodes[i];
  const RtDevBlock *db = &x->plan->blk[bi];
  if (x->npend && db->kind[i] != RT_DS_COMM && node_order(x, p, b, nd, in, out, msg, n) != 0) return -1;
  switch (db->kind[i]) {
  case RT_DS_GEMM:
    return gemm(x, b, nd, in[0], in[1], out, NULL, 0, msg, n);
  case RT_DS_COMM: {
    if (!x->dev->host_memory) {
      const RtDevLib *rl = db->lib[i] >= 0 ? &x->plan->lib.a[db->lib[i]] : NULL;
      switch (nd->op) {
      case IR_OP_SEND: case IR_OP_RECV: case IR_OP_STASH: case IR_OP_UNSTASH: case IR_OP_GROUP_SUM:
        return dev_pipe(x, p, b, nd, nd->nin ? in[0] : NULL, out, rl, info, msg, n);
      case IR_OP_ALL_TO_ALL_V:
        return dev_a2av(x, p, b, nd, in, out, msg, n);
      default:
        return dev_comm(x, p, b, nd, in[0], out, rl, msg, n);
      }
    }
    /* host memory: the reference kernel and the communication layer as on CPU ranks */
    const IrType *it[64];
    if (nd->nin > 64) { snprintf(msg, n, "too many operands"); return -1; }
    for (int k = 0; k < nd->nin; k++) it[k] = &b->nodes[nd->in[k]].type;
    if (x->dev->ops->sync(x->dev, RT_STREAM_COMPUTE, msg, n) != 0) return -1;
    RtKctx kc = {rt_program_kenv(p), b, nd, info, out, &nd->type, in, it, msg, n};
    return rt_ref_kernels[nd->op](&kc);
  }
  case RT_DS_LIB: {
    if (nd->op == IR_OP_MATMUL8)
      return gemm8(x, b, nd, in, out, db->lib[i] >= 0 ? &x->plan->lib.a[db->lib[i]] : NULL, msg, n);
    const RtDevLib *l = &x->plan->lib.a[db->lib[i]];
    CgCudaArgs a;
    memset(&a, 0, sizeof a);
    int nb = 0;
    for (int k = 0; k < nd->nin && nb < CG_CUDA_MAX_BUFS; k++) a.b[nb++] = (void *)in[k];
    if (!(ir_ops[nd->op].flags & OPF_EFFECT)) a.b[nb++] = out;
    const char *s = ir_ops[nd->op].iattrs;   /* "@name" int attributes name states */
    for (int slot = 0; *s && slot < IR_MAX_IATTR; slot++) {
      while (*s == ' ') s++;
      if (!*s) break;
      if (*s == '@') a.b[nb++] = rt_state_dev(p, (int)nd->ia[slot]);
      s += strcspn(s, " ");
    }
    if (l->scratch > 0) a.b[nb++] = x->scratch;
    a.run = x->run_dev;
    for (int k = 0; k < l->nl; k++)
      if (launch(x, &l->l[k], &a, msg, n) != 0) return -1;
    return 0;
  }
  default:
    snprintf(msg, n, "internal error: node kind %d has no device step", db->kind[i]);
    return -1;
  }
}
