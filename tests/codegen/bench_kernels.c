/* bench_kernels.c - GB/s of a few fused kernels: the LLVM JIT (1 and 2
 * threads) against the reference runtime running the same nodes one by
 * one.  Not a test; bench/kernels.sh runs it and prints the table.
 * Bytes counted are the kernel's compulsory traffic: every input read
 * once and every output written once (what a fused kernel should move);
 * the reference moves more (its intermediates), which is the point. */
#include "codegen/cg.h"
#include "runtime/exec/rt.h"
#include <math.h>
#include <time.h>

static char err[1024];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  IrModule *m;
  int b, nfeed, group[8], ng;
  RtFeed feeds[8];
  int feed_id[8];
  void *data[8];
  char names[8][8];
} Bench;

static int input(Bench *B, IrType t, double lo, double hi) {
  int i = B->nfeed++;
  snprintf(B->names[i], sizeof B->names[i], "x%d", i);
  int id = ir_emit(B->m, B->b, IR_OP_INPUT, NULL, 0, NULL, NULL, B->names[i], &t, err, sizeof err);
  TS_ASSERT(id >= 0);
  int64_t n = ir_type_numel(&t);
  void *p = ts_xmalloc((size_t)n * 8);
  for (int64_t k = 0; k < n; k++) {
    double v = lo + (hi - lo) * (double)((k * 2654435761u) % 1000) / 1000.0;
    if (t.dtype == IR_F32) ((float *)p)[k] = (float)v;
    else if (t.dtype == IR_F64) ((double *)p)[k] = v;
    else ((int32_t *)p)[k] = (int32_t)v;
  }
  B->data[i] = p;
  B->feeds[i] = (RtFeed){B->names[i], p};
  B->feed_id[i] = id;
  return id;
}
static int E(Bench *B, IrOp op, const int *in, int nin, const int64_t *ia, const double *fa, const IrType *typed) {
  int id = ir_emit(B->m, B->b, op, in, nin, ia, fa, NULL, typed, err, sizeof err);
  if (id < 0) TS_DIE("bench setup: %s", err);
  B->group[B->ng++] = id;
  return id;
}

static IrType ty2(int64_t a, int64_t b) {
  IrType t;
  memset(&t, 0, sizeof t);
  t.dtype = IR_F32;
  t.rank = 2;
  t.dim[0] = a;
  t.dim[1] = b;
  return t;
}

/* Times the reference and the JIT on B's group; prints one table row. */
static void run(CgJit *jit, Bench *B, const char *name, int reps) {
  CgGroupIO io;
  CgKernel *k = cg_lower_group(B->m, &B->m->blocks.a[B->b], B->group, B->ng, &io, err, sizeof err);
  if (!k) TS_DIE("%s: %s", name, err);
  double bytes = 0;
  for (int i = 0; i < k->nbuf; i++) bytes += (double)k->buf[i].n * (k->buf[i].type == CG_F64 ? 8 : 4);
  RtProgram *p = rt_program_new(B->m, err, sizeof err);
  RtRunInfo info = {0, 0, 1e-3, 0};
  TS_ASSERT(p && rt_run_block(p, B->b, B->feeds, B->nfeed, &info, err, sizeof err) == 0);
  double t0 = now();
  for (int r = 0; r < reps; r++) rt_run_block(p, B->b, B->feeds, B->nfeed, &info, err, sizeof err);
  double tref = (now() - t0) / reps;
  double tc = now();
  CgFn fn = cg_jit_compile(jit, k, err, sizeof err);
  tc = now() - tc;
  if (!fn) TS_DIE("%s: %s", name, err);
  void *bufs[CG_MAX_BUFS];
  for (int i = 0; i < io.nin; i++)
    for (int f = 0; f < B->nfeed; f++)
      if (B->feed_id[f] == io.in[i]) bufs[i] = B->data[f];
  for (int j = 0; j < io.nout; j++) bufs[io.nin + j] = ts_xmalloc((size_t)k->buf[io.nin + j].n * 8);
  double tj[2];
  for (int th = 1; th <= 2; th++) {
    CgPool *pool = cg_pool_new(th);
    cg_pool_run(pool, fn, bufs, k->grid);
    t0 = now();
    for (int r = 0; r < reps; r++) cg_pool_run(pool, fn, bufs, k->grid);
    tj[th - 1] = (now() - t0) / reps;
    cg_pool_free(pool);
  }
  printf("| %-28s | %7.1f | %8.2f | %6.2f | %8.2f | %6.2f | %8.2f | %6.2f | %7.1f |\n", name, bytes / 1e6, tref * 1e3,
         bytes / tref / 1e9, tj[0] * 1e3, bytes / tj[0] / 1e9, tj[1] * 1e3, bytes / tj[1] / 1e9, tc * 1e3);
  for (int j = 0; j < io.nout; j++) free(bufs[io.nin + j]);
  rt_program_free(p);
  cg_kernel_free(k);
}

static void bench_new(Bench *B) {
  memset(B, 0, sizeof *B);
  B->m = ir_module_new("bench");
  B->b = ir_block_add(B->m, "forward");
}
static void bench_free(Bench *B) {
  ir_module_free(B->m);
  for (int i = 0; i < B->nfeed; i++) free(B->data[i]);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  if (reps < 1) reps = 1;
  CgJit *jit = cg_jit_new(err, sizeof err);
  if (!jit) { fprintf(stderr, "bench_kernels: %s\n", err); return 1; }
  printf("host: %.40s...  f32, %d reps; MB = compulsory bytes (inputs + outputs once)\n\n", cg_jit_cpu(jit), reps);
  printf("| %-28s | %7s | %8s | %6s | %8s | %6s | %8s | %6s | %7s |\n", "kernel", "MB", "ref ms", "GB/s", "jit1 ms",
         "GB/s", "jit2 ms", "GB/s", "jit cms");
  printf("|%s|---:|---:|---:|---:|---:|---:|---:|---:|\n", "------------------------------");
  Bench B;
  int64_t R = 2048, C = 768;
  IrType t = ty2(R, C);
  { bench_new(&B);
    int x = input(&B, t, -1, 1), y = input(&B, t, -1, 1);
    E(&B, IR_OP_ADD, (int[]){x, y}, 2, NULL, NULL, NULL);
    run(jit, &B, "add [2048,768]", reps);
    bench_free(&B); }
  { bench_new(&B);
    IrType bt = t;
    bt.rank = 1;
    bt.dim[0] = C;
    int x = input(&B, t, -2, 2), b = input(&B, bt, -1, 1), res = input(&B, t, -1, 1);
    int bb = E(&B, IR_OP_BROADCAST, &b, 1, NULL, NULL, &t);
    int a = E(&B, IR_OP_ADD, (int[]){x, bb}, 2, NULL, NULL, NULL);
    int g = E(&B, IR_OP_GELU_TANH, &a, 1, NULL, NULL, NULL);
    E(&B, IR_OP_ADD, (int[]){g, res}, 2, NULL, NULL, NULL);
    run(jit, &B, "bias+gelu+residual", reps);
    bench_free(&B); }
  { bench_new(&B);
    IrType bt = t;
    bt.rank = 1;
    bt.dim[0] = C;
    int x = input(&B, t, -2, 2), gm = input(&B, bt, 0.5, 1.5), be = input(&B, bt, -1, 1);
    int ln = E(&B, IR_OP_LAYERNORM, &x, 1, NULL, (double[]){1e-5}, NULL);
    int g = E(&B, IR_OP_BROADCAST, &gm, 1, NULL, NULL, &t), b2 = E(&B, IR_OP_BROADCAST, &be, 1, NULL, NULL, &t);
    int mu = E(&B, IR_OP_MUL, (int[]){ln, g}, 2, NULL, NULL, NULL);
    E(&B, IR_OP_ADD, (int[]){mu, b2}, 2, NULL, NULL, NULL);
    run(jit, &B, "layernorm+affine", reps);
    bench_free(&B); }
  { bench_new(&B);
    IrType st = ty2(12 * 256, 256);
    int s = input(&B, st, -4, 4);
    int sc = E(&B, IR_OP_MULS, &s, 1, NULL, (double[]){0.125}, NULL);
    int cm = E(&B, IR_OP_CAUSAL_MASK, &sc, 1, NULL, (double[]){-INFINITY}, NULL);
    E(&B, IR_OP_SOFTMAX, &cm, 1, NULL, NULL, NULL);
    run(jit, &B, "scale+causal+softmax", reps);
    bench_free(&B); }
  { bench_new(&B);
    IrType lt = ty2(128, 50304), tt = lt;
    tt.rank = 1;
    tt.dim[0] = 128;
    IrType it = tt;
    it.dtype = IR_I32;
    int lg = input(&B, lt, -3, 3), tg = input(&B, it, 0, 50000), dl = input(&B, tt, 0.1, 1);
    E(&B, IR_OP_CROSS_ENTROPY, (int[]){lg, tg}, 2, (int64_t[]){-1}, NULL, NULL);
    E(&B, IR_OP_CROSS_ENTROPY_BWD, (int[]){lg, tg, dl}, 3, (int64_t[]){-1}, NULL, NULL);
    run(jit, &B, "cross_entropy+bwd [128,50304]", reps);
    bench_free(&B); }
  cg_jit_free(jit);
  return 0;
}
