/* ops_pipe.c - reference kernels of the pipeline ops (send, recv, stash,
 * unstash, group_sum; the contract is docs/pipeline.md, "Execution") and
 * the per-program pipeline state they share.  Entries of rt_ref_kernels
 * (ops_ref.c) like every other kernel.
 *
 * Peers: a send or recv with `peer` talks to pp coordinate (c + peer) mod S
 * of the rank's group along the node's axis (c = own coordinate, S = axis
 * size).  When that is c itself (S = 1) the value is a local hand-off: it
 * waits in the program's mailbox for the recv with the same tag.
 *
 * Why sends copy: the schedule checker (plan_pipe_check) assumes a send
 * never waits (isend), and the executor frees or reuses the operand's
 * buffer right after the node.  So the value is copied into a buffer of
 * the program's and posted with rt_comm_isend; the buffer is released when
 * the send is known complete (checked on every later send, and at the
 * latest by rt_kenv_pipe_wait_sends, which the trainer calls before "update").
 *
 * Stashes are keyed by (chunk, micro batch, slot): chunk from the block's
 * name (fwd.<g> / bwd.<g>), micro batch from RtRunInfo.micro.  Where the
 * memory plan hands the buffer over (memplan.h, ext) there is no copy: the
 * executor made the stashed value in a buffer of this pool
 * (rt_kenv_pipe_buf), the stash keeps that buffer (rt_stash_keep) and the
 * backward block's unstash gets it back as its result (rt_unstash_take),
 * returned to the pool after its last reader.  Otherwise (a view of a
 * state, a value stashed twice) the stash keeps a copy and unstash copies
 * it into the node's result (ref_STASH, ref_UNSTASH).
 *
 * Buffers of both kinds come from a small pool reused by exact size: a
 * step asks for the same sizes in the same order every time, and big
 * buffers come from mmap, whose page faults we would otherwise pay again
 * per micro batch.  The pool holds at most as many buffers as were live at
 * once.  Under AddressSanitizer buffers are really freed. */
#include "kernels.h"

#if defined(__SANITIZE_ADDRESS__)
#define PIPE_POOL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PIPE_POOL 0
#endif
#endif
#ifndef PIPE_POOL
#define PIPE_POOL 1
#endif

/* A kept value: a stash entry (kind 's', key chunk/micro/slot) or a local
 * hand-off (kind 'm', key tag, matched first in first out). */
typedef struct {
  char kind;
  int chunk, micro;
  int64_t key;              /* slot or tag */
  size_t bytes;             /* of the value */
  void *data;
  size_t cap;               /* of the buffer (its pool size) */
} PipeKept;

typedef struct {
  RtCommReq *req;
  void *buf;
  size_t bytes;
} PipeSend;

typedef struct { size_t bytes; void *p; } PipeBuf;

struct RtPipe {
  VEC(PipeKept) kept;
  VEC(PipeSend) sends;
  VEC(PipeBuf) pool;
};

static RtPipe *pipe_of(RtKenv *e) {
  if (!e->pipe) e->pipe = ts_xcalloc(1, sizeof *e->pipe);
  return e->pipe;
}

/* A pool buffer's size for a value of `bytes` bytes: as the memory
 * plan sizes buffers (64-byte multiples, 64 at least), so that a buffer
 * the plan hands over and one the stash copies into are interchangeable. */
static size_t pipe_cap(size_t bytes) { return ((bytes ? bytes : 1) + 63) & ~(size_t)63; }

static void *pbuf_get(RtPipe *s, size_t bytes) {
  for (int i = s->pool.n - 1; i >= 0; i--)
    if (s->pool.a[i].bytes == bytes) {
      void *q = s->pool.a[i].p;
      s->pool.a[i] = s->pool.a[--s->pool.n];
      return q;
    }
  return ts_xmalloc(bytes ? bytes : 1);
}

static void pbuf_put(RtPipe *s, void *q, size_t bytes) {
  if (!PIPE_POOL) { free(q); return; }
  PipeBuf b = {bytes, q};
  VEC_PUSH(s->pool, b);
}

void rt_pipe_free(RtPipe *s) {
  if (!s) return;
  /* Sends still in flight (a failed step): the job is ending; wait for
   * nothing, but never free a buffer MPI may still read. */
  for (int i = 0; i < s->sends.n; i++)
    if (rt_comm_test(&s->sends.a[i].req)) free(s->sends.a[i].buf);
  for (int i = 0; i < s->kept.n; i++) free(s->kept.a[i].data);
  for (int i = 0; i < s->pool.n; i++) free(s->pool.a[i].p);
  free(s->kept.a);
  free(s->sends.a);
  free(s->pool.a);
  free(s);
}

/* Releases the buffers of the sends that have completed. */
static void reap_sends(RtPipe *s) {
  int j = 0;
  for (int i = 0; i < s->sends.n; i++) {
    if (rt_comm_test(&s->sends.a[i].req)) pbuf_put(s, s->sends.a[i].buf, s->sends.a[i].bytes);
    else s->sends.a[j++] = s->sends.a[i];
  }
  s->sends.n = j;
}

int rt_kenv_pipe_wait_sends(RtKenv *env, char *err, size_t errlen) {
  RtPipe *s = env->pipe;
  if (!s || !s->sends.n) return 0;
  RtCommReq **reqs = ts_xmalloc((size_t)s->sends.n * sizeof *reqs);
  for (int i = 0; i < s->sends.n; i++) reqs[i] = s->sends.a[i].req;
  int rc = rt_comm_wait_all(reqs, s->sends.n, err, errlen);
  for (int i = 0; i < s->sends.n; i++) s->sends.a[i].req = reqs[i];   /* NULL once complete */
  free(reqs);
  reap_sends(s);
  return rc;
}

int rt_kenv_pipe_end_step(RtKenv *env, char *err, size_t errlen) {
  if (rt_kenv_pipe_wait_sends(env, err, errlen) != 0) return -1;
  RtPipe *s = env->pipe;
  if (!s || !s->kept.n) return 0;
  const PipeKept *e = &s->kept.a[0];
  if (e->kind == 's')
    ts_errf(err, errlen, "the step ended with %d value%s stashed and never unstashed; the first: chunk %d, "
            "micro batch %d, slot %lld (did block bwd.%d run for micro batch %d?)", s->kept.n,
            s->kept.n == 1 ? "" : "s", e->chunk, e->micro, (long long)e->key, e->chunk, e->micro);
  else
    ts_errf(err, errlen, "the step ended with %d value%s sent to this rank's own coordinate and never received; "
            "the first: tag %lld from chunk %d, micro batch %d", s->kept.n, s->kept.n == 1 ? "" : "s",
            (long long)e->key, e->chunk, e->micro);
  for (int i = 0; i < s->kept.n; i++) pbuf_put(s, s->kept.a[i].data, s->kept.a[i].cap);
  s->kept.n = 0;
  return -1;
}

/* ---- kernels ---- */

static size_t kbytes(const IrType *t) { return (size_t)ir_type_numel(t) * ir_dtype_size(t->dtype); }

/* The node's chunk (from its block's name) and micro batch. */
static int kchunk(RtKctx *k, int *chunk, int *micro) {
  int bwd;
  *chunk = ir_block_chunk(k->b, &bwd);
  *micro = k->info ? k->info->micro : 0;
  if (*chunk < 0)
    return rt_kfail(k, "%s outside a pipeline block (fwd.<g> / bwd.<g>): no chunk to key it by", ir_ops[k->n->op].name);
  return 0;
}

/* Axis ia[0] of a send / recv / group_sum: its size, this rank's
 * coordinate on it, and the group (NULL for size 1). */
static int kpipe_axis(RtKctx *k, int *size, int *coord, RtComm **g) {
  int64_t a = k->n->ia[0];
  if (a < 0 || a >= IR_AXIS_COUNT) return rt_kfail(k, "mesh axis %lld out of range", (long long)a);
  *size = rt_rank_axis_size(k->env->rank, (IrAxis)a);
  *coord = k->env->rank->coord[a];
  *g = *size > 1 ? k->env->rank->group[a] : NULL;
  if (*size > 1 && !*g)
    return rt_kfail(k, "the %s axis has %d ranks but this rank has no %s group (run the plan with mrun --gpus)",
                    ir_axis_name((IrAxis)a), *size, ir_axis_name((IrAxis)a));
  if (*g && rt_comm_size(*g) != *size)
    return rt_kfail(k, "the %s group has %d ranks, the mesh says %d", ir_axis_name((IrAxis)a), rt_comm_size(*g), *size);
  return 0;
}

/* The coordinate a send / recv talks to: (c + peer) mod S. */
static int kpeer(RtKctx *k, int size, int coord) {
  int64_t q = ((int64_t)coord + k->n->ia[1]) % size;
  return (int)(q < 0 ? q + size : q);
}

/* send / recv move values as they are stored: f32, f64, or the 16-bit
 * storage types of --precision bf16 / fp16 (2 bytes per element on the
 * wire; moves16); group_sum adds, so only f32 and f64. */
static int kfloat_value(RtKctx *k, const IrType *t, int moves16) {
  if (t->dtype != IR_F32 && t->dtype != IR_F64 && !(moves16 && ir_dtype_is_16(t->dtype)))
    return rt_kfail(k, "%s carries f32 or f64 values%s, not %s", ir_ops[k->n->op].name,
                    moves16 ? " (or bf16, f16)" : "", ir_dtype_name(t->dtype));
  return 0;
}

static int ktag(RtKctx *k) {
  if (k->n->ia[2] < 0 || k->n->ia[2] > INT32_MAX) return rt_kfail(k, "tag %lld out of range", (long long)k->n->ia[2]);
  return 0;
}

/* send x: copy, then post to coordinate (c + peer) mod S without waiting. */
int ref_SEND(RtKctx *k) {
  int size, coord, chunk, micro;
  RtComm *g;
  if (kpipe_axis(k, &size, &coord, &g) || kchunk(k, &chunk, &micro) || kfloat_value(k, k->it[0], 1) || ktag(k)) return -1;
  RtPipe *s = pipe_of(k->env);
  size_t bytes = kbytes(k->it[0]);
  void *buf = pbuf_get(s, bytes);
  memcpy(buf, k->in[0], bytes);
  int to = kpeer(k, size, coord);
  if (to == coord) {   /* the next chunk is on this rank: a local hand-off */
    PipeKept e = {'m', chunk, micro, k->n->ia[2], bytes, buf, bytes};
    VEC_PUSH(s->kept, e);
    return 0;
  }
  reap_sends(s);
  RtCommReq *req;
  if (rt_comm_isend(g, k->it[0]->dtype, buf, (size_t)ir_type_numel(k->it[0]), to, (int)k->n->ia[2], &req,
                    k->err, k->errlen) != 0) {
    pbuf_put(s, buf, bytes);
    return -1;
  }
  PipeSend e = {req, buf, bytes};
  VEC_PUSH(s->sends, e);
  return 0;
}

/* -> the value sent with this tag by coordinate (c + peer) mod S; blocks
 * (against the group's deadline) until it arrives. */
int ref_RECV(RtKctx *k) {
  int size, coord;
  RtComm *g;
  if (kpipe_axis(k, &size, &coord, &g) || kfloat_value(k, k->ot, 1) || ktag(k)) return -1;
  size_t bytes = kbytes(k->ot);
  int from = kpeer(k, size, coord);
  if (from != coord)
    return rt_comm_recv(g, k->ot->dtype, k->out, (size_t)ir_type_numel(k->ot), from, (int)k->n->ia[2], k->err, k->errlen);
  RtPipe *s = pipe_of(k->env);
  for (int i = 0; i < s->kept.n; i++) {   /* the oldest hand-off with this tag */
    PipeKept *e = &s->kept.a[i];
    if (e->kind != 'm' || e->key != k->n->ia[2]) continue;
    if (e->bytes != bytes)
      return rt_kfail(k, "the value sent with tag %lld has %zu bytes, the recv expects %zu", (long long)e->key,
                      e->bytes, bytes);
    memcpy(k->out, e->data, bytes);
    pbuf_put(s, e->data, e->bytes);
    memmove(e, e + 1, (size_t)(s->kept.n - i - 1) * sizeof *e);
    s->kept.n--;
    return 0;
  }
  /* nobody else can send it now: waiting would hang */
  return rt_kfail(k, "recv with tag %lld from this rank's own coordinate %d: nothing was sent with that tag "
                  "(the schedule runs the receiving block before the sending one?)", (long long)k->n->ia[2], coord);
}

static PipeKept *find_stash(RtPipe *s, int chunk, int micro, int64_t slot) {
  for (int i = 0; i < s->kept.n; i++) {
    PipeKept *e = &s->kept.a[i];
    if (e->kind == 's' && e->chunk == chunk && e->micro == micro && e->key == slot) return e;
  }
  return NULL;
}

void *rt_kenv_pipe_buf(RtKenv *env, size_t bytes) { return pbuf_get(pipe_of(env), pipe_cap(bytes)); }

void rt_kenv_pipe_unbuf(RtKenv *env, void *buf, size_t bytes) {
  if (buf) pbuf_put(pipe_of(env), buf, pipe_cap(bytes));
}

/* Keeps buf (a pool buffer of pipe_cap(bytes)) as the stash of node k's
 * (chunk, micro batch, slot). */
static int stash_keep(RtKctx *k, void *buf, size_t bytes) {
  int chunk, micro;
  if (kchunk(k, &chunk, &micro)) return -1;
  RtPipe *s = pipe_of(k->env);
  if (find_stash(s, chunk, micro, k->n->ia[0]))
    return rt_kfail(k, "chunk %d, micro batch %d, slot %lld is already stashed (did fwd.%d run twice for this "
                    "micro batch?)", chunk, micro, (long long)k->n->ia[0], chunk);
  PipeKept e = {'s', chunk, micro, k->n->ia[0], bytes, buf, pipe_cap(bytes)};
  VEC_PUSH(s->kept, e);
  return 0;
}

/* The stash of node k's (chunk, micro batch, slot), which must hold
 * `bytes` bytes, taken out of the stash (its buffer is the caller's now). */
static PipeKept *stash_take(RtKctx *k, size_t bytes, PipeKept *out) {
  int chunk, micro;
  if (kchunk(k, &chunk, &micro)) return NULL;
  RtPipe *s = pipe_of(k->env);
  PipeKept *e = find_stash(s, chunk, micro, k->n->ia[0]);
  if (!e) {
    rt_kfail(k, "nothing stashed for chunk %d, micro batch %d, slot %lld (has fwd.%d run for this micro batch?)",
             chunk, micro, (long long)k->n->ia[0], chunk);
    return NULL;
  }
  if (e->bytes != bytes) {
    rt_kfail(k, "chunk %d, micro batch %d, slot %lld holds %zu bytes but unstash expects %zu", chunk, micro,
             (long long)e->key, e->bytes, bytes);
    return NULL;
  }
  *out = *e;
  *e = s->kept.a[--s->kept.n];   /* order of stash entries does not matter */
  return out;
}

/* stash x slot=k: a copy kept for (chunk, micro, k) until bwd.<chunk>
 * unstashes it. */
int ref_STASH(RtKctx *k) {
  size_t bytes = kbytes(k->it[0]);
  void *buf = rt_kenv_pipe_buf(k->env, bytes);
  memcpy(buf, k->in[0], bytes);
  if (stash_keep(k, buf, bytes) == 0) return 0;
  rt_kenv_pipe_unbuf(k->env, buf, bytes);
  return -1;
}

int rt_stash_keep(RtKctx *k, void *buf) { return stash_keep(k, buf, kbytes(k->it[0])); }

/* -> a copy of the value stashed for (chunk, micro, slot); releases it. */
int ref_UNSTASH(RtKctx *k) {
  PipeKept e;
  if (!stash_take(k, kbytes(k->ot), &e)) return -1;
  memcpy(k->out, e.data, e.bytes);
  pbuf_put(pipe_of(k->env), e.data, e.cap);
  return 0;
}

int rt_unstash_take(RtKctx *k, void **buf) {
  PipeKept e;
  if (!stash_take(k, kbytes(k->ot), &e)) return -1;
  *buf = e.data;
  return 0;
}

/* Adds n values of dtype dt: y += x. */
static void add_into(void *y, const void *x, int64_t n, IrDtype dt) {
  if (dt == IR_F32) {
    float *a = y;
    const float *b = x;
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
  } else {
    double *a = y;
    const double *b = x;
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
  }
}

/* The tag of group_sum's messages.  It runs in the update block, after
 * every pipeline send of the step has completed (rt_pipe_wait_sends), so
 * no pipeline message with the same tag can be in flight; 32767 is the
 * largest tag every MPI allows. */
#define PIPE_GROUP_SUM_TAG 32767

/* x -> the sum of x over the coordinates in the mask ranks (ia[1]) of the
 * axis, this one included, added in coordinate order (identical bits on
 * every member).  Members exchange their values point to point. */
int ref_GROUP_SUM(RtKctx *k) {
  int size, coord;
  RtComm *g;
  if (kpipe_axis(k, &size, &coord, &g) || kfloat_value(k, k->it[0], 0)) return -1;
  if (k->it[0]->dtype != k->ot->dtype || ir_type_numel(k->it[0]) != ir_type_numel(k->ot))
    return rt_kfail(k, "result and operand differ in dtype or size");
  uint64_t mask = (uint64_t)k->n->ia[1];   /* bit q: coordinate q (bit 63 makes the int64 negative) */
  if (size > 64)
    return rt_kfail(k, "the %s axis has %d ranks; group_sum's ranks mask names at most 64", ir_axis_name((IrAxis)k->n->ia[0]),
                    size);
  if (mask == 0 || (size < 64 && (mask >> size) != 0))
    return rt_kfail(k, "ranks=%lld names coordinates outside the %s axis (size %d)", (long long)k->n->ia[1],
                    ir_axis_name((IrAxis)k->n->ia[0]), size);
  if (!(mask >> coord & 1))
    return rt_kfail(k, "ranks=%lld does not include this rank's %s coordinate %d (only members may run group_sum)",
                    (long long)k->n->ia[1], ir_axis_name((IrAxis)k->n->ia[0]), coord);
  int64_t n = ir_type_numel(k->ot);
  size_t bytes = kbytes(k->ot);
  IrDtype dt = k->ot->dtype;
  if (mask == (uint64_t)1 << coord) { memcpy(k->out, k->in[0], bytes); return 0; }
  /* Post our value to every other member first (so nobody waits on us),
   * then walk the members in coordinate order: the first one's value
   * starts the sum, each next one is added (received into one buffer). */
  RtCommReq **reqs = ts_xcalloc((size_t)size, sizeof *reqs);
  void *tmp = ts_xmalloc(bytes ? bytes : 1);
  int rc = 0, first = 1;
  for (int q = 0; q < size && rc == 0; q++)
    if (q != coord && (mask >> q & 1))
      rc = rt_comm_isend(g, dt, k->in[0], (size_t)n, q, PIPE_GROUP_SUM_TAG, &reqs[q], k->err, k->errlen);
  for (int q = 0; q < size && rc == 0; q++) {
    if (!(mask >> q & 1)) continue;
    const void *v = k->in[0];
    if (q != coord) {
      rc = rt_comm_recv(g, dt, first ? k->out : tmp, (size_t)n, q, PIPE_GROUP_SUM_TAG, k->err, k->errlen);
      v = first ? k->out : tmp;
    }
    if (rc == 0 && first && v != k->out) memcpy(k->out, v, bytes);
    else if (rc == 0 && !first) add_into(k->out, v, n, dt);
    first = 0;
  }
  /* the operand must outlive our sends: wait before returning */
  if (rt_comm_wait_all(reqs, size, NULL, 0) != 0 && rc == 0) rc = rt_kfail(k, "group_sum: waiting for the sends failed");
  free(tmp);
  free(reqs);
  return rc;
}
