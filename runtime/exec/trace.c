/* trace.c - mrun --trace FILE: the Chrome / Perfetto trace of what every
 * rank ran (train.h rt_trace_write).  One process per rank (pid = world
 * rank), thread 0 its ops and kernels, thread 1 its steps; times in
 * microseconds from the instant the ranks agreed on (a barrier, then
 * ts_now_s(): one clock on one host; ranks on several hosts are as far
 * apart as their clocks).  Each rank writes FILE.rank<r>, rank 0 merges
 * them into FILE after a barrier and removes them; every file is written
 * atomically. */
#include "train.h"
#include "rt.h"
#include <unistd.h>

/* What the trace calls an event's kind (Perfetto colours by it). */
static const char *category(int op, int kind) {
  if (kind == RT_TRACE_GEMM_BIAS || kind == RT_TRACE_INTO_GRAD) return "gemm";
  if (kind == RT_TRACE_ATTN_GRADS) return "attention";
  switch (op) {
  case IR_OP_MATMUL: case IR_OP_GMM: return "gemm";
  case IR_OP_ATTENTION: case IR_OP_ATTENTION_BWD: case IR_OP_ATTN_ACC: case IR_OP_ATTN_FINISH: case IR_OP_ATTN_LSE:
  case IR_OP_ATTN_BWD_Q: case IR_OP_ATTN_BWD_KV: return "attention";
  case IR_OP_ALL_REDUCE: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER: case IR_OP_GROUP_SUM:
  case IR_OP_ALL_TO_ALL: case IR_OP_ALL_TO_ALL_V: case IR_OP_RING_SHIFT: case IR_OP_RING_WAIT: return "collective";
  case IR_OP_SEND: case IR_OP_RECV: case IR_OP_STASH: case IR_OP_UNSTASH: return "pipeline";
  default: return "kernel";
  }
}

static const char *event_name(int op, int kind, char *buf, size_t n) {
  const char *o = ir_ops[op].name;
  switch (kind) {
  case RT_TRACE_KERNEL: snprintf(buf, n, "kernel %s", o); break;
  case RT_TRACE_GEMM_BIAS: snprintf(buf, n, "gemm + bias"); break;
  case RT_TRACE_ATTN_GRADS: snprintf(buf, n, "attention backward"); break;
  case RT_TRACE_INTO_GRAD: snprintf(buf, n, "%s into its gradient", op == IR_OP_ACCUM ? "gemm" : o); break;
  case RT_TRACE_OPT: snprintf(buf, n, "%s (multi-tensor)", o); break;
  default: snprintf(buf, n, "%s", o);
  }
  return buf;
}

/* This rank's events as JSON objects, each followed by ",\n". */
static void rank_events(const RtProgram *p, int rank, const double *step_t, int64_t nsteps, int64_t first_step,
                        StrBuf *out) {
  sb_printf(out, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n", rank, rank);
  sb_printf(out, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"ops\"}},\n", rank);
  sb_printf(out, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": \"steps\"}},\n", rank);
  for (int64_t s = 0; s < nsteps; s++)
    sb_printf(out, "{\"name\": \"step %lld\", \"cat\": \"step\", \"ph\": \"X\", \"pid\": %d, \"tid\": 1, \"ts\": %.3f, "
                   "\"dur\": %.3f},\n", (long long)(first_step + s + 1), rank, step_t[2 * s] * 1e6,
              (step_t[2 * s + 1] - step_t[2 * s]) * 1e6);
  int n;
  const RtTraceEvent *ev = rt_program_trace_events(p, &n);
  char name[96];
  for (int i = 0; i < n; i++)
    sb_printf(out, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": %.3f, "
                   "\"dur\": %.3f, \"args\": {\"block\": \"%s\", \"node\": %d}},\n",
              event_name(ev[i].op, ev[i].kind, name, sizeof name), category(ev[i].op, ev[i].kind), rank, ev[i].t0 * 1e6,
              ev[i].dur * 1e6, ev[i].block, ev[i].node);
}

int rt_trace_write(const RtProgram *p, RtComm *world, const char *path, const double *step_t, int64_t nsteps,
                   int64_t first_step, char *err, size_t errlen) {
  int me = world ? rt_comm_rank(world) : 0, n = world ? rt_comm_size(world) : 1;
  StrBuf b = {0};
  rank_events(p, world ? rt_comm_world_rank(world) : 0, step_t, nsteps, first_step, &b);
  char part[4200];
  int rc = 0;
  if (n > 1) {   /* every rank's part, then rank 0 merges */
    snprintf(part, sizeof part, "%s.rank%d", path, me);
    if (ts_write_file(part, b.p ? b.p : "", b.n) != 0) rc = ts_errf(err, errlen, "--trace: %s", ts_io_error());
    sb_free(&b);
    double bad = rc != 0;
    if (rt_comm_all_reduce_max(world, IR_F64, &bad, 1, err, errlen) != 0) return -1;
    if (bad) {
      unlink(part);
      return rc != 0 ? rc : ts_errf(err, errlen, "--trace: another rank could not write its part");
    }
    if (me == 0) {
      for (int r = 0; r < n && rc == 0; r++) {
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        size_t len = 0;
        char *text = ts_read_input_max(part, (size_t)1 << 34, &len);
        if (!text) rc = ts_errf(err, errlen, "--trace: reading rank %d's part %s: %s", r, part, ts_io_error());
        else sb_write(&b, text, len);
        free(text);
        ts_forget_input(part);
      }
    }
  }
  if (me == 0 && rc == 0) {
    /* the last ",\n" closes no element: drop it */
    if (b.n >= 2 && b.p[b.n - 2] == ',') b.n -= 2;
    StrBuf doc = {0};
    sb_printf(&doc, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"mrun --trace\", \"ranks\": %d},\n"
                    "\"traceEvents\": [\n", n);
    sb_write(&doc, b.p ? b.p : "", b.n);
    sb_puts(&doc, "\n]}\n");
    if (ts_write_file(path, doc.p, doc.n) != 0) rc = ts_errf(err, errlen, "--trace: %s", ts_io_error());
    sb_free(&doc);
  }
  sb_free(&b);
  if (n > 1) {
    if (rt_comm_barrier(world, err, errlen) != 0) return -1;   /* rank 0 has read every part */
    snprintf(part, sizeof part, "%s.rank%d", path, me);
    unlink(part);
  }
  return rc;
}
