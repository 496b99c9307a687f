/* test_pipe_rt.c - the runtime half of pipeline parallelism, kernel by
 * kernel: send, recv, stash, unstash and group_sum run through the executor
 * (rt_run_block) on small hand-written IR modules.
 *
 *   test_pipe_rt local                 one process (pp = 1): stash/unstash
 *       across blocks for several micro batches and chunks, local
 *       hand-offs, and the errors (unstash of nothing, a leftover stash, a
 *       double stash, a recv nobody sent to), which must name chunk, micro
 *       batch and slot.
 *   test_pipe_rt ring TOKEN            under mpirun, P = 2 or 3 ranks as
 *       pp = P with two chunks per rank (interleaved placement, chunk g on
 *       rank g % P): chunk g receives two values from chunk g - 1 (rank 0's
 *       second chunk from rank P - 1: peer -1 wraps), combines them and
 *       sends two to chunk g + 1 with tags in decreasing order.  Run once
 *       in a 1F-per-micro order and once GPipe-style (every forward of a
 *       chunk before the next chunk), which only finishes if sends never
 *       wait (values big enough that MPI cannot buffer them eagerly).
 *       Also a receive in the opposite order of the sends (tag matching).
 *   test_pipe_rt group TOKEN           under mpirun, 2 or 3 ranks: group_sum
 *       over masks {0,1}, {0,2}, {0,1,2} and {self} in f32 and f64; members
 *       must hold exactly the coordinate-order sum (so identical bits), and
 *       a mask without this rank or outside the axis is refused.
 *   test_pipe_rt train TOKEN           2 ranks: rt_train on a hand-written
 *       2-stage program (1F1B over 4 micro batches: the loss over the
 *       pipeline, stash across blocks, update), and its refusals (stages
 *       swapped, missing backward blocks, the loss reported twice).
 *   test_pipe_rt stall_recv TOKEN      2 ranks, timeout 3 s: rank 1 waits
 *       for a message rank 0 never sends; the job must end naming rank 0.
 *   test_pipe_rt stall_send TOKEN      2 ranks, timeout 3 s: rank 0 waits for
 *       its posted sends, rank 1 never receives them.
 * Exit 0 iff every check passed on every rank. */
#include "../runtime/rt_test.h"
#include "runtime/exec/rt_priv.h"
#include "runtime/comm/comm.h"
#include "runtime/exec/train.h"
#include <stdarg.h>
#include <unistd.h>

static char err[2048];
static int g_rank;

static const char *hdr =
    "train lr=0.001 beta1=0.9 beta2=0.95 eps=1e-08 weight_decay=0.1 schedule=constant warmup=0 decay_steps=0 "
    "min_lr=0.0 clip_grad=0.0 global_batch=4 micro_batch=1 seq_len=4 steps=1 seed=1 precision=f64\n";

/* Parses a module from printf-style text (aborts the test on error). */
static IrModule *module(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static IrModule *module(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *text = ts_xmalloc((size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(text, (size_t)n + 1, fmt, ap);
  va_end(ap);
  IrModule *m = ir_parse_module(text, "test.ir", err, sizeof err);
  if (!m) fprintf(stderr, "rank %d: parse error: %s\n%s", g_rank, err, text);
  free(text);
  TS_ASSERT(m);
  return m;
}

static int run(RtProgram *p, const char *block, const RtFeed *f, int nf, int micro) {
  RtRunInfo info = {0, micro, 0.001, 0};
  int b = ir_block_find(rt_program_module(p), block);
  TS_ASSERT(b >= 0);
  err[0] = 0;
  return rt_run_block(p, b, f, nf, &info, err, sizeof err);
}

static double *state(RtProgram *p, const char *name) {
  int s = ir_state_find(rt_program_module(p), name);
  TS_ASSERT(s >= 0);
  return rt_state_data(p, s);
}

/* ---------------- one process ---------------- */

/* x_m[i] for micro batch m: distinct per micro and element. */
static double xv(int m, int i) { return 1.0 + m * 10.0 + i * 0.25; }

static void test_local(void) {
  /* two chunks on one rank (pp = 1): fwd.0 stashes 3x and x and hands x+1
   * to fwd.1 (a send to peer +1 = this rank itself); fwd.1 stashes what it
   * received under the SAME slot number (chunks are keyed apart); bwd.1
   * and bwd.0 read them back. */
  IrModule *m = module(
      "module local\n%s"
      "parallel tp=1 pp=1 cp=1 ep=1 dp=1 sp=0 zero=1\n"
      "state @out0 : f64[3] param init=zeros\n"
      "state @out1 : f64[3] param init=zeros\n"
      "block fwd.0 {\n"
      "  %%0 = input \"x\" : f64[3]\n"
      "  %%1 = muls %%0 c=3.0 : f64[3]\n"
      "  stash %%1 slot=0\n"
      "  stash %%0 slot=1\n"
      "  %%4 = adds %%0 c=1.0 : f64[3]\n"
      "  send %%4 axis=pp peer=1 tag=0\n"
      "}\n"
      "block fwd.1 {\n"
      "  %%0 = recv axis=pp peer=-1 tag=0 : f64[3]\n"
      "  stash %%0 slot=0\n"
      "}\n"
      "block bwd.1 {\n"
      "  %%0 = unstash slot=0 : f64[3]\n"
      "  assign %%0 @out1\n"
      "}\n"
      "block bwd.0 {\n"
      "  %%0 = unstash slot=1 : f64[3]\n"
      "  %%1 = unstash slot=0 : f64[3]\n"
      "  %%2 = add %%0, %%1 : f64[3]\n"
      "  assign %%2 @out0\n"
      "}\n"
      "end\n", hdr);
  RtProgram *p = rt_program_new(m, err, sizeof err);
  CHECK(p != NULL, "program: %s", err);
  if (!p) { ir_module_free(m); return; }
  double x[3];
  RtFeed f = {"x", x};
  /* forwards of micro batches 0..3, then backwards in another order */
  for (int mi = 0; mi < 4; mi++) {
    for (int i = 0; i < 3; i++) x[i] = xv(mi, i);
    CHECK(run(p, "fwd.0", &f, 1, mi) == 0, "fwd.0 micro %d: %s", mi, err);
    CHECK(run(p, "fwd.1", NULL, 0, mi) == 0, "fwd.1 micro %d: %s", mi, err);
  }
  int order[4] = {2, 0, 3, 1};
  for (int k = 0; k < 4; k++) {
    int mi = order[k];
    CHECK(run(p, "bwd.1", NULL, 0, mi) == 0, "bwd.1 micro %d: %s", mi, err);
    CHECK(run(p, "bwd.0", NULL, 0, mi) == 0, "bwd.0 micro %d: %s", mi, err);
    for (int i = 0; i < 3; i++) {
      CHECK(state(p, "out0")[i] == 4 * xv(mi, i), "micro %d: bwd.0 got %g, want %g", mi, state(p, "out0")[i], 4 * xv(mi, i));
      CHECK(state(p, "out1")[i] == xv(mi, i) + 1, "micro %d: bwd.1 got %g, want %g", mi, state(p, "out1")[i], xv(mi, i) + 1);
    }
  }
  CHECK(rt_pipe_end_step(p, err, sizeof err) == 0, "clean step end: %s", err);
  /* every stash kept its operand's buffer (the memory plan hands them
   * over): 3 per micro batch, nothing copied */
  RtExecStats st;
  rt_program_exec_stats(p, &st);
  CHECK(st.stash_handed == 12 && st.stash_copied == 0, "%lld stashes handed over, %lld copied; want 12 and 0",
        st.stash_handed, st.stash_copied);

  /* unstash with nothing stashed: names chunk, micro batch and slot */
  CHECK(run(p, "bwd.1", NULL, 0, 5) != 0, "unstash of nothing must fail");
  CHECK(strstr(err, "nothing stashed for chunk 1, micro batch 5, slot 0") != NULL, "message: %s", err);
  CHECK(strstr(err, "block bwd.1") != NULL, "names the block: %s", err);

  /* a stash left at the end of the step (fwd.1 ran, bwd.1 did not) */
  for (int i = 0; i < 3; i++) x[i] = xv(7, i);
  CHECK(run(p, "fwd.0", &f, 1, 7) == 0, "fwd.0: %s", err);
  CHECK(run(p, "fwd.1", NULL, 0, 7) == 0, "fwd.1: %s", err);
  CHECK(run(p, "bwd.0", NULL, 0, 7) == 0, "bwd.0: %s", err);
  CHECK(rt_pipe_end_step(p, err, sizeof err) != 0, "a leftover stash must fail the step");
  CHECK(strstr(err, "chunk 1, micro batch 7, slot 0") != NULL, "message: %s", err);
  CHECK(rt_pipe_end_step(p, err, sizeof err) == 0, "leftovers are released after the error: %s", err);

  /* stashing twice for one (chunk, micro, slot) */
  CHECK(run(p, "fwd.0", &f, 1, 8) == 0, "fwd.0: %s", err);
  CHECK(run(p, "fwd.0", &f, 1, 8) != 0, "a second stash of the same key must fail");
  CHECK(strstr(err, "chunk 0, micro batch 8, slot 0 is already stashed") != NULL, "message: %s", err);
  CHECK(rt_pipe_end_step(p, err, sizeof err) != 0, "leftovers of micro 8");

  /* a local recv with nothing sent fails at once instead of waiting forever */
  CHECK(run(p, "fwd.1", NULL, 0, 9) != 0, "recv with nothing sent must fail");
  CHECK(strstr(err, "nothing was sent with that tag") != NULL, "message: %s", err);
  rt_program_free(p);
  ir_module_free(m);

  /* a value stashed twice: each stash keeps a copy (the buffer cannot be
   * handed over twice); the unstashes still take the stashed buffers */
  m = module("module twice\n%sparallel tp=1 pp=1 cp=1 ep=1 dp=1 sp=0 zero=1\n"
             "state @out0 : f64[3] param init=zeros\n"
             "block fwd.0 {\n  %%0 = input \"x\" : f64[3]\n  %%1 = muls %%0 c=2.0 : f64[3]\n"
             "  stash %%1 slot=0\n  stash %%1 slot=1\n}\n"
             "block bwd.0 {\n  %%0 = unstash slot=1 : f64[3]\n  %%1 = unstash slot=0 : f64[3]\n"
             "  %%2 = mul %%0, %%1 : f64[3]\n  assign %%2 @out0\n}\nend\n", hdr);
  p = rt_program_new(m, err, sizeof err);
  CHECK(p != NULL, "program: %s", err);
  for (int mi = 0; p && mi < 2; mi++) {
    for (int i = 0; i < 3; i++) x[i] = xv(mi, i);
    CHECK(run(p, "fwd.0", &f, 1, mi) == 0, "fwd.0 micro %d: %s", mi, err);
    for (int i = 0; i < 3; i++) x[i] = -1;   /* the stash must not read the feed again */
  }
  for (int mi = 1; p && mi >= 0; mi--) {
    CHECK(run(p, "bwd.0", NULL, 0, mi) == 0, "bwd.0 micro %d: %s", mi, err);
    for (int i = 0; i < 3; i++)
      CHECK(state(p, "out0")[i] == 4 * xv(mi, i) * xv(mi, i), "micro %d: got %g, want %g", mi, state(p, "out0")[i],
            4 * xv(mi, i) * xv(mi, i));
  }
  if (p) {
    rt_program_exec_stats(p, &st);
    CHECK(st.stash_handed == 0 && st.stash_copied == 4, "stashed twice: %lld handed over, %lld copied; want 0 and 4",
          st.stash_handed, st.stash_copied);
  }
  rt_program_free(p);
  ir_module_free(m);

  /* a stash outside a pipeline block is refused by the kernel too (the
   * parser's verifier refuses such text; the executor does not verify):
   * rename a pipeline block after parsing */
  m = module("module bad\n%sparallel tp=1 pp=1 cp=1 ep=1 dp=1 sp=0 zero=1\n"
             "block fwd.0 {\n  %%0 = input \"x\" : f64[3]\n  stash %%0 slot=0\n}\n"
             "block bwd.0 {\n  %%0 = unstash slot=0 : f64[3]\n}\nend\n", hdr);
  m->blocks.a[ir_block_find(m, "fwd.0")].name = ts_intern("micro");
  p = rt_program_new(m, err, sizeof err);
  CHECK(p && run(p, "micro", &f, 1, 0) != 0 && strstr(err, "outside a pipeline block"), "stash in micro: %s", err);
  rt_program_free(p);
  ir_module_free(m);
}

/* ---------------- MPI ---------------- */

static RtRank make_rank(RtComm *w, PlanMesh mesh) {
  RtRank r = rt_rank_single();
  r.mesh = mesh;
  rt_mesh_coords(&mesh, rt_comm_rank(w), r.coord);
  for (int a = 0; a < IR_AXIS_COUNT; a++)
    if (rt_rank_axis_size(&r, (IrAxis)a) > 1) {
      r.group[a] = rt_comm_mesh_group(w, &mesh, (RtMeshAxis)a, err, sizeof err);
      TS_ASSERT(r.group[a]);
    }
  return r;
}

static void free_rank(RtRank *r) {
  for (int a = 0; a < IR_AXIS_COUNT; a++) rt_comm_free(r->group[a]);
}

#define RING_N 8192    /* 64 KB per value: above the eager limits of Open MPI's transports */

/* The value chunk g holds for micro batch m (element i): chunk 0 gets
 * x = m + i/N; chunk g > 0 computes a + 0.5 b + (g + 1) from a = y_{g-1}
 * and b = 2 y_{g-1}, i.e. 2 y_{g-1} + g + 1, exact in f64. */
static double ring_y(int g, int m, int i) {
  double y = m + (double)i / RING_N;
  for (int k = 1; k <= g; k++) y = 2 * y + (double)(k + 1);   /* the module's order */
  return y;
}

/* The program of pipeline rank c of P, chunks c and c + P. reversed: the
 * receiver takes the two messages in the other order than they were sent. */
static IrModule *ring_module(int P, int c, int reversed) {
  StrBuf b = {0};
  sb_printf(&b, "module ring\n%sparallel tp=1 pp=%d cp=1 ep=1 dp=1 sp=0 zero=1 vpp=2 schedule=interleaved stage=%d\n",
            hdr, P, c + 1);
  sb_printf(&b, "state @out : f64[%d] param init=zeros\n", RING_N);
  int G = 2 * P;
  for (int g = c; g < G; g += P) {
    sb_printf(&b, "block fwd.%d {\n", g);
    int v = 0;
    if (g == 0) {
      sb_printf(&b, "  %%0 = input \"x\" : f64[%d]\n", RING_N);
      v = 1;
    } else {
      /* chunk g-1 sent a = y with tag 2(g-1)+1, then b = 2y with tag 2(g-1) */
      int ta = 2 * (g - 1) + 1, tb = 2 * (g - 1);
      int first_a = !reversed;
      sb_printf(&b, "  %%0 = recv axis=pp peer=-1 tag=%d : f64[%d]\n", first_a ? ta : tb, RING_N);
      sb_printf(&b, "  %%1 = recv axis=pp peer=-1 tag=%d : f64[%d]\n", first_a ? tb : ta, RING_N);
      sb_printf(&b, "  %%2 = muls %%%d c=0.5 : f64[%d]\n", first_a ? 1 : 0, RING_N);
      sb_printf(&b, "  %%3 = add %%%d, %%2 : f64[%d]\n", first_a ? 0 : 1, RING_N);
      sb_printf(&b, "  %%4 = adds %%3 c=%d.0 : f64[%d]\n", g + 1, RING_N);
      v = 5;
    }
    int y = v - 1;
    if (g < G - 1) {
      sb_printf(&b, "  send %%%d axis=pp peer=1 tag=%d\n", y, 2 * g + 1);
      sb_printf(&b, "  %%%d = muls %%%d c=2.0 : f64[%d]\n", v + 1, y, RING_N);
      sb_printf(&b, "  send %%%d axis=pp peer=1 tag=%d\n", v + 1, 2 * g);
    } else {
      sb_printf(&b, "  assign %%%d @out\n", y);
    }
    sb_puts(&b, "}\n");
  }
  sb_puts(&b, "end\n");
  IrModule *m = ir_parse_module(b.p, "ring.ir", err, sizeof err);
  if (!m) fprintf(stderr, "%s\n%s", err, b.p);
  TS_ASSERT(m);
  sb_free(&b);
  return m;
}

static void check_ring_out(RtProgram *p, int G, int micro, const char *what) {
  const double *o = state(p, "out");
  int bad = -1;
  for (int i = 0; i < RING_N && bad < 0; i++)
    if (o[i] != ring_y(G - 1, micro, i)) bad = i;
  CHECK(bad < 0, "rank %d: %s: micro %d element %d = %.17g, want %.17g", g_rank, what, micro, bad,
        bad >= 0 ? o[bad] : 0, bad >= 0 ? ring_y(G - 1, micro, bad) : 0);
}

static void test_ring(RtComm *w, int reversed) {
  int P = rt_comm_size(w);
  RtRank r = make_rank(w, (PlanMesh){1, P, 1, 1, 1});
  int c = r.coord[IR_AXIS_PP], G = 2 * P, M = 3;
  IrModule *m = ring_module(P, c, reversed);
  if (!reversed) CHECK(ir_verify(m, err, sizeof err) == 0, "rank %d: the ring module verifies: %s", g_rank, err);
  RtProgram *p = rt_program_new_rank(m, &r, err, sizeof err);
  CHECK(p != NULL, "rank %d: program: %s", g_rank, err);
  double *x = ts_xmalloc(RING_N * sizeof *x);
  RtFeed f = {"x", x};
  char blk[32];
  /* (a) per micro batch, this rank's chunks in order */
  for (int mi = 0; p && mi < M; mi++)
    for (int g = c; g < G; g += P) {
      for (int i = 0; i < RING_N; i++) x[i] = ring_y(0, mi, i);
      snprintf(blk, sizeof blk, "fwd.%d", g);
      CHECK(run(p, blk, &f, 1, mi) == 0, "rank %d: %s micro %d: %s", g_rank, blk, mi, err);
      if (g == G - 1) check_ring_out(p, G, mi, reversed ? "reversed receives" : "per micro");
    }
  CHECK(p && rt_pipe_end_step(p, err, sizeof err) == 0, "rank %d: step end: %s", g_rank, err);
  /* (b) GPipe-like: all micro batches of a chunk, then the next chunk.
   * Chunk 0's sends of all M micro batches are posted before anyone
   * receives them: only nonblocking sends get through this. */
  for (int g = c; p && g < G; g += P)
    for (int mi = 0; mi < M; mi++) {
      for (int i = 0; i < RING_N; i++) x[i] = ring_y(0, mi, i);
      snprintf(blk, sizeof blk, "fwd.%d", g);
      CHECK(run(p, blk, &f, 1, mi) == 0, "rank %d: %s micro %d: %s", g_rank, blk, mi, err);
      if (g == G - 1) check_ring_out(p, G, mi, "all forwards of a chunk first");
    }
  CHECK(p && rt_pipe_end_step(p, err, sizeof err) == 0, "rank %d: step end: %s", g_rank, err);
  free(x);
  rt_program_free(p);
  ir_module_free(m);
  free_rank(&r);
}

/* group_sum of x over mask on axis pp; members compare with the sum in
 * coordinate order computed here (so all members hold the same bits). */
static double gval(int c, int i) { return 0.1 * (c + 1) + 1e-3 * i + 1.0 / (3 + c + i); }   /* inexact sums */

static void test_group(RtComm *w) {
  int P = rt_comm_size(w);
  RtRank r = make_rank(w, (PlanMesh){1, P, 1, 1, 1});
  int c = r.coord[IR_AXIS_PP];
  int masks[4] = {3, 5, 7, 1 << c}, nm = 4;
  enum { N = 37 };
  for (int di = 0; di < 2; di++) {
    IrDtype dt = di ? IR_F64 : IR_F32;
    const char *dn = ir_dtype_name(dt);
    for (int k = 0; k < nm; k++) {
      int mask = masks[k];
      if (mask >> P) continue;   /* names a coordinate this run does not have */
      IrModule *m = module("module gs\n%sparallel tp=1 pp=%d cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=%d\n"
                           "state @out : %s[%d] param init=zeros\n"
                           "block update {\n  %%0 = input \"x\" : %s[%d]\n"
                           "  %%1 = group_sum %%0 axis=pp ranks=%d : %s[%d]\n  assign %%1 @out\n}\nend\n",
                           hdr, P, c + 1, dn, N, dn, N, mask, dn, N);
      RtProgram *p = rt_program_new_rank(m, &r, err, sizeof err);
      TS_ASSERT(p);
      double xs[N];
      for (int i = 0; i < N; i++) xs[i] = gval(c, i);
      void *x = to_dtype(xs, N, dt);
      RtFeed f = {"x", x};
      int member = mask >> c & 1;
      int rc = run(p, "update", &f, 1, 0);
      if (member) {
        CHECK(rc == 0, "rank %d: group_sum ranks=%d (%s): %s", g_rank, mask, dn, err);
        /* the sum in coordinate order, in the dtype's arithmetic */
        int bad = -1;
        for (int i = 0; i < N && bad < 0; i++) {
          float sf = 0;
          double sd = 0;
          int first = 1;
          for (int q = 0; q < P; q++) {
            if (!(mask >> q & 1)) continue;
            if (first) sf = (float)gval(q, i), sd = gval(q, i);
            else sf += (float)gval(q, i), sd += gval(q, i);
            first = 0;
          }
          double got = di ? ((double *)state(p, "out"))[i] : ((float *)(void *)state(p, "out"))[i];
          if (di ? got != sd : (float)got != sf) bad = i;
        }
        CHECK(bad < 0, "rank %d: group_sum ranks=%d (%s): element %d differs from the coordinate-order sum", g_rank,
              mask, dn, bad);
      } else {
        CHECK(rc != 0 && strstr(err, "does not include this rank's pp coordinate"), "rank %d: non-member ranks=%d: %s",
              g_rank, mask, err);
      }
      free(x);
      rt_program_free(p);
      ir_module_free(m);
    }
  }
  /* a mask naming a coordinate outside the axis */
  IrModule *m = module("module gs\n%sparallel tp=1 pp=%d cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=%d\n"
                       "block update {\n  %%0 = input \"x\" : f64[2]\n  %%1 = group_sum %%0 axis=pp ranks=%d : f64[2]\n}\nend\n",
                       hdr, P, c + 1, (1 << P) | 1);
  RtProgram *p = rt_program_new_rank(m, &r, err, sizeof err);
  double x2[2] = {1, 2};
  RtFeed f = {"x", x2};
  CHECK(p && run(p, "update", &f, 1, 0) != 0 && strstr(err, "outside the pp axis"), "rank %d: bad mask: %s", g_rank, err);
  rt_program_free(p);
  ir_module_free(m);
  free_rank(&r);
}

/* A recv that never gets its message, or sends never received: the job
 * must end within the timeout, naming the peer (run_mpi.sh checks). */
static void test_stall(RtComm *w, int sender_waits) {
  RtRank r = make_rank(w, (PlanMesh){1, 2, 1, 1, 1});
  int c = r.coord[IR_AXIS_PP];
  IrModule *m = module("module st\n%sparallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=%d\n"
                       "block fwd.0 {\n  %%0 = input \"x\" : f64[200000]\n  send %%0 axis=pp peer=1 tag=0\n}\n"
                       "block fwd.1 {\n  %%0 = recv axis=pp peer=-1 tag=0 : f64[200000]\n}\nend\n", hdr, c + 1);
  RtProgram *p = rt_program_new_rank(m, &r, err, sizeof err);
  TS_ASSERT(p);
  double *x = ts_xcalloc(200000, sizeof *x);
  RtFeed f = {"x", x};
  if (sender_waits) {
    if (c == 0) {
      run(p, "fwd.0", &f, 1, 0);
      rt_pipe_wait_sends(p, err, sizeof err);   /* never returns: rank 1 never receives */
    } else {
      sleep(30);   /* busy elsewhere; the sender's deadline ends the job */
    }
  } else if (c == 1) {
    run(p, "fwd.1", NULL, 0, 0);   /* never returns: rank 0 never sends */
  } else {
    sleep(30);
  }
  fprintf(stderr, "rank %d: the stall was not detected\n", g_rank);
  free(x);
  rt_program_free(p);
  ir_module_free(m);
  free_rank(&r);
}

/* ---------------- the trainer (rt_train) on 2 pipeline ranks ----------------
 * A hand-written 2-stage program: fwd.0 casts the tokens and sends them,
 * fwd.1 receives them, stashes them and reports loss = sumsq(tokens), bwd.1
 * unstashes and sends them back, bwd.0 receives them; update reports a
 * fixed grad norm.  The step's loss must be the mean over the step's 4
 * micro batches of sumsq(their tokens) (read from the corpus here), on
 * both ranks.  variant: 0 as described; 1 the stages swapped (each rank
 * gets the other's program); 2 no bwd blocks; 3 both forwards report the
 * loss.  The errors happen on both ranks alike, so no rank waits. */
static IrModule *train_module(int c, int variant) {
  int stage = variant == 1 ? 2 - c : c + 1;
  const char *bwd0 = variant == 2 ? "" : "block bwd.0 {\n  %0 = recv axis=pp peer=1 tag=1 : f64[1, 4]\n}\n";
  const char *bwd1 = variant == 2 ? "" : "block bwd.1 {\n  %0 = unstash slot=0 : f64[1, 4]\n  send %0 axis=pp peer=-1 tag=1\n}\n";
  const char *loss0 = variant == 3 ? "  %3 = sumsq %1 : f64[]\n  output \"loss\" %3\n" : "";
  char blocks[1024];
  if (c == 0)
    snprintf(blocks, sizeof blocks,
             "block fwd.0 {\n  %%0 = input \"tokens\" : i32[1, 4]\n  %%1 = cast %%0 : f64[1, 4]\n"
             "  send %%1 axis=pp peer=1 tag=0\n%s}\n%s", loss0, bwd0);
  else
    snprintf(blocks, sizeof blocks,
             "block fwd.1 {\n  %%0 = recv axis=pp peer=-1 tag=0 : f64[1, 4]\n  %%1 = sumsq %%0 : f64[]\n"
             "  output \"loss\" %%1\n%s}\n%s", variant == 2 ? "" : "  stash %0 slot=0\n", bwd1);
  return module("module tr\n%sparallel tp=1 pp=2 cp=1 ep=1 dp=1 sp=0 zero=1 vpp=1 schedule=1f1b stage=%d\n"
                "%sblock update {\n  %%0 = full value=2.5 : f64[]\n  output \"grad_norm\" %%0\n}\nend\n",
                hdr, stage, blocks);
}

static void test_train(RtComm *w) {
  RtRank r = make_rank(w, (PlanMesh){1, 2, 1, 1, 1});
  int c = r.coord[IR_AXIS_PP];
  RtTrainOpts o = {.quiet = 1, .rank = &r, .world = w};
  /* the expected loss of step 1 from the corpus */
  RtCorpus corpus;
  CHECK(rt_corpus_open(&corpus, rt_corpus_default_path(), err, sizeof err) == 0, "corpus: %s", err);
  double want = 0;
  for (int j = 0; j < 4; j++) {
    int32_t tok[4], tgt[4];
    CHECK(rt_corpus_batch(&corpus, 1, 0, j, 1, 4, tok, tgt, err, sizeof err) == 0, "batch: %s", err);
    for (int i = 0; i < 4; i++) want += (double)tok[i] * tok[i];
  }
  want /= 4;
  rt_corpus_free(&corpus);
  static const char *const expect[4] = {NULL, "this is the program of pipeline stage", "has no block bwd.",
                                        "reported `output \"loss\"` 8 times for 4 micro batches"};
  for (int v = 0; v < 4; v++) {
    IrModule *m = train_module(c, v);
    RtTrainResult res;
    int rc = rt_train(m, &o, &res, err, sizeof err);
    if (v == 0) {
      CHECK(rc == 0, "rank %d: training the 2-stage program: %s", g_rank, err);
      CHECK(rc == 0 && res.steps == 1 && res.first_loss == want && res.last_grad_norm == 2.5,
            "rank %d: loss %.17g (want %.17g), grad norm %g (want 2.5), %lld steps", g_rank, res.first_loss, want,
            res.last_grad_norm, (long long)res.steps);
    } else {
      CHECK(rc != 0 && strstr(err, expect[v]), "rank %d: variant %d: want /%s/, got: %s", g_rank, v, expect[v],
            rc ? err : "success");
    }
    ir_module_free(m);
  }
  free_rank(&r);
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: test_pipe_rt local | ring|group|train|stall_recv|stall_send TOKEN\n"); return 2; }
  const char *mode = argv[1];
  if (strcmp(mode, "local") == 0) {
    test_local();
    return check_exit("test_pipe_rt local");
  }
  int stall = strncmp(mode, "stall", 5) == 0;
  RtComm *w = rt_comm_init_mpi(&argc, &argv, stall ? 3 : 30, err, sizeof err);
  if (!w) { fprintf(stderr, "test_pipe_rt: %s\n", err); return 1; }
  g_rank = rt_comm_rank(w);
  if (strcmp(mode, "ring") == 0) {
    test_ring(w, 0);
    test_ring(w, 1);
  } else if (strcmp(mode, "group") == 0) {
    test_group(w);
  } else if (strcmp(mode, "train") == 0) {
    test_train(w);
  } else if (stall) {
    test_stall(w, strcmp(mode, "stall_send") == 0);
    rt_comm_free(w);
    return 1;
  } else {
    fprintf(stderr, "test_pipe_rt: unknown mode %s\n", mode);
    rt_comm_free(w);
    return 2;
  }
  double bad = check_bad();
  if (rt_comm_all_reduce(w, IR_F64, &bad, 1, err, sizeof err) != 0) bad = 1;
  char name[64];
  snprintf(name, sizeof name, "test_pipe_rt %s on %d ranks", mode, rt_comm_size(w));
  int rc = check_exit_all(name, bad);
  rt_comm_free(w);
  return rc;
}
