/* test_fake_gpu_step - a sharded plan trained on "GPU ranks" made of
 * the real device layer over fakes, against the same ranks on CPUs.
 *   mpirun -np N test_fake_gpu_step PLAN STEPS TOL DIR
 * PLAN is a plan for a mesh of N ranks (dp, tp, cp or pp: each rank runs
 * its program).  Every rank trains it
 * twice: on the CPU (LLVM kernels, MPI collectives), then through what a
 * GPU rank runs -- runtime/device/dev_cuda.c over the fake driver (TS_CUDA_DRIVER,
 * fake_cuda.c: work queued per stream, run only when waited for), the
 * module compiled by NVRTC for the fake's sm_80 and its kernels run by the
 * CUDA emulator (tests/cuda/emu_host.c) through the fake's launcher,
 * GEMMs by runtime/device/dev_cublaslt.c over the fake cuBLASLt, and the
 * gradients' collectives by NCCL groups bound to the device's comm stream
 * (rt_rank_gpu_groups, as mrun makes them; fake_nccl.c with
 * FAKE_NCCL_STREAM_ORDER=1 runs them in stream order over MPI).  Because
 * the fake runs a stream's work only when something waits for it, a
 * collective not ordered after the kernels that produce its operand, or
 * compute not ordered after the collective, reads stale bytes here: the
 * latter with every stream lazy, the former with FAKE_GPU_COMM_EAGER=1
 * (the comm stream runs its work as issued, so a collective runs as early
 * as its waits allow).
 * Checks (rank 0's files; the verdict is agreed over all ranks): the
 * per-step losses and the parameters after STEPS steps equal the CPU run
 * within TOL (relative), kernels were launched through the emulator, NCCL
 * was handed the device's comm stream, block micro was replayed as a CUDA
 * graph with its collectives (layouts without pp and ep). */
#include "runtime/comm/comm.h"
#include "runtime/device/device.h"
#include "runtime/exec/dev_prog.h"
#include "runtime/exec/train.h"
#include "plan/groups.h"
#include "emu_host.h"
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "read_losses.h"
#include "../check.h"

/* The GEMM bias epilogue groups of m's blocks: a fusion group ending in
 * the add of plan_epilogue_match, its matmul in the same group. */
static int epilogue_groups(const IrModule *m) {
  int k = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    for (int i = 0; i < b->n; i++) {
      PlanEpilogue e;
      k += b->nodes[i].group && plan_epilogue_match(b, i, &e) && b->nodes[e.matmul].group == b->nodes[i].group;
    }
  }
  return k;
}

typedef int (*Launcher)(const char *name, long long blocks, int threads, const void *args);

static TsEmu *emu;
static long long emu_launches;

/* The fake driver's launches, run by the emulator: the parameter bytes
 * are the CgCudaArgs (device pointers are host addresses in the fake). */
static int run_kernel(const char *name, long long blocks, int threads, const void *args) {
  CgCudaLaunch l;
  memset(&l, 0, sizeof l);
  snprintf(l.name, sizeof l.name, "%s", name);
  l.blocks = blocks;
  l.threads = threads;
  char err[1024];
  if (ts_emu_launch_kernel(emu, &l, (const CgCudaArgs *)args, err, sizeof err) != 0) {
    fprintf(stderr, "emulator: %s\n", err);
    return 1;
  }
  emu_launches++;
  return 0;
}


/* The largest relative difference between the f32 fp8 states (kind=fp8 in
 * rank_RRRRR.idx: amax, amax_history, scale, scale_inv) of two
 * checkpoints of `step` of world rank `me` (docs/checkpoints.md; each
 * element relative to max(|value|, 1e-3)); -1 when unreadable.  *n: the
 * states compared, *nz: their elements that are not a start value (0, 1). */
static double fp8_states_diff(const char *a, const char *b, int me, int step, int *n, int *nz, char *where, size_t wn) {
  char ia[1200], ba[1200], bb[1200];
  snprintf(ia, sizeof ia, "%s/iter_%07d/rank_%05d.idx", a, step, me);
  snprintf(ba, sizeof ba, "%s/iter_%07d/rank_%05d.bin", a, step, me);
  snprintf(bb, sizeof bb, "%s/iter_%07d/rank_%05d.bin", b, step, me);
  size_t la = 0, lb = 0, li = 0;
  char *idx = ts_read_file(ia, &li), *da = ts_read_file(ba, &la), *db = ts_read_file(bb, &lb);
  double worst = idx && da && db && la == lb ? 0 : -1;
  *n = *nz = 0;
  for (char *line = idx; worst >= 0 && line && *line;) {
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    char name[256];
    long long at = -1, bytes = -1;
    const char *pa = strstr(line, " at="), *pb = strstr(line, " bytes=");
    if (sscanf(line, "tensor %255s", name) == 1 && strstr(line, " kind=fp8") && pa && pb) {
      at = atoll(pa + 4);
      bytes = atoll(pb + 7);
      if (at < 0 || bytes < 0 || (size_t)(at + bytes) > la) { worst = -1; break; }
      (*n)++;
      for (long long i = 0; i < bytes / 4; i++) {
        float x, y;
        memcpy(&x, da + at + 4 * i, 4);
        memcpy(&y, db + at + 4 * i, 4);
        double e = x == y ? 0 : fabs((double)x - y) / fmax(fabs((double)x), 1e-3);
        *nz += x != 0 && x != 1;   /* not the start values: an amax seen, a scale moved */
        if (!(e <= worst)) {
          worst = isnan(e) ? INFINITY : e;
          snprintf(where, wn, "%s[%lld]: cpu %.9g gpu %.9g", name, i, x, y);
        }
      }
    }
    line = end ? end + 1 : NULL;
  }
  free(idx), free(da), free(db);
  return worst;
}

int main(int argc, char **argv) {
  char err[2048] = "";
  RtComm *world = rt_comm_init_mpi(&argc, &argv, 300, err, sizeof err);
  if (!world) { fprintf(stderr, "%s\n", err); return 1; }
  int me = rt_comm_rank(world), n = rt_comm_size(world);
  check_rank = me;
  if (argc != 5) rt_comm_abort(world, "usage: test_fake_gpu_step PLAN STEPS TOL DIR");
  Plan *plan = plan_read(argv[1], err, sizeof err);
  if (!plan) rt_comm_abort(world, "%s", err);
  RtRank rank = rt_rank_single();
  rank.mesh = plan->mesh;
  int rest = (rank.mesh.tp > 1 ? rank.mesh.tp : 1) * (rank.mesh.pp > 1 ? rank.mesh.pp : 1) *
             (rank.mesh.cp > 1 ? rank.mesh.cp : 1) * (rank.mesh.ep > 1 ? rank.mesh.ep : 1);
  if (rank.mesh.dp < 1) rank.mesh.dp = n / rest;   /* dp unset: the ranks left */
  if (rank.mesh.dp * rest != n) rt_comm_abort(world, "the plan is not for a mesh of %d ranks", n);
  /* this rank's program (a pipeline has one per stage), as mrun picks it */
  int c[RT_AXIS_COUNT];
  rt_mesh_coords(&rank.mesh, me, c);
  c[RT_AXIS_DP] %= plan->mesh.dp < 1 ? 1 : plan->mesh.dp;
  int pr = rt_mesh_rank(&plan->mesh, c);
  if (plan->nranks < 1 || pr < 0) rt_comm_abort(world, "the plan has no program for rank %d", me);
  IrModule *m = plan->programs[plan->rank_program[pr % plan->nranks]];
  m->train.steps = atoi(argv[2]);
  double tol = atof(argv[3]);
  const char *dir = argv[4];

  rt_mesh_coords(&rank.mesh, me, rank.coord);
  for (int a = 0; a < IR_AXIS_COUNT; a++) {
    if (rt_rank_axis_size(&rank, (IrAxis)a) == 1) continue;
    if (!(rank.group[a] = rt_comm_mesh_group(world, &rank.mesh, (RtMeshAxis)a, err, sizeof err)))
      rt_comm_abort(world, "%s", err);
  }
  /* the sets ZeRO-1 shards over (dp+cp), as mrun makes them */
  if (rt_rank_axes_groups(&rank, world, err, sizeof err) != 0) rt_comm_abort(world, "%s", err);
  /* --fp8 (states of kind fp8): their final values compared too, through
   * a checkpoint of each run (fp8_states_diff) */
  int fp8 = 0;
  for (int s = 0; s < m->states.n; s++) fp8 |= m->states.a[s].kind == IR_STATE_FP8;
  char pc[1024], pd[1024], mc[1024], md[1024], kc[1024], kd[1024];
  snprintf(kc, sizeof kc, "%s/cpu.ckpt", dir);
  snprintf(kd, sizeof kd, "%s/gpu.ckpt", dir);
  snprintf(pc, sizeof pc, "%s/cpu.params", dir);
  snprintf(pd, sizeof pd, "%s/gpu.params", dir);
  snprintf(mc, sizeof mc, "%s/cpu.jsonl", dir);
  snprintf(md, sizeof md, "%s/gpu.jsonl", dir);

  /* FAKE_GPU_DP_BUCKET=BYTES: the overlapped dp reduction in buckets of
   * that size on both runs; unset: the reduction in the update block
   * (--no-overlap-grad-reduce), whose collectives overlap the square sums */
  const char *bk = getenv("FAKE_GPU_DP_BUCKET");
  int64_t bucket = bk ? atoll(bk) : 0;
  /* FAKE_GPU_GENERATE=N: instead of training, N greedy tokens from the
   * prompt "Tessera" (a plan compiled with mcc --decode: the prefill and
   * step blocks, pass decode's kv_write / attn_cached / rope_at /
   * slice_at), each checked against the argmax of a full forward on the
   * same ranks (--generate-check); the GPU's ids must be the CPU's */
  const char *gen = getenv("FAKE_GPU_GENERATE");
  RtGenOpts go = {.prompt = "Tessera", .prompt_len = 7, .max_tokens = gen ? atoll(gen) : 0, .top_p = 1,
                  .check_full = 1, .print_ids = 1, .quiet = 1};
  char gc[1024], gd[1024];
  snprintf(gc, sizeof gc, "%s/cpu.gen", dir);
  snprintf(gd, sizeof gd, "%s/gpu.gen", dir);
  FILE *gen_log = gen ? fopen(gc, "w") : NULL;
  if (gen && !gen_log) rt_comm_abort(world, "%s: %s", gc, strerror(errno));
  /* CPU ranks */
  RtExecOpts xo = {.backend = RT_BACKEND_LLVM, .threads = 1, .dp_bucket_bytes = bucket, .no_overlap = !bk};
  rt_exec_set_default(&xo);
  RtTrainOpts to = {.quiet = 1, .metrics_path = mc, .save_params_path = pc, .rank = &rank, .world = world};
  if (fp8) to.ckpt.save_dir = kc;   /* one checkpoint, after the last step */
  if (gen) to = (RtTrainOpts){.quiet = 1, .rank = &rank, .world = world, .generate = &go, .log = gen_log};
  RtTrainResult res;
  if (rt_train(m, &to, &res, err, sizeof err) != 0) rt_comm_abort(world, "CPU run: %s", err);
  if (gen_log) fclose(gen_log);
  long long cpu_buckets = res.dp_buckets;

  /* GPU ranks over the fakes */
  const char *drv = getenv("TS_CUDA_DRIVER");
  void *fake = drv ? dlopen(drv, RTLD_NOW | RTLD_LOCAL) : NULL;
  void (*set_launcher)(Launcher) = NULL;
  long (*calls)(const char *) = NULL;
  if (fake) {
    *(void **)&set_launcher = dlsym(fake, "fake_cuda_set_launcher");
    *(void **)&calls = dlsym(fake, "fake_cuda_calls");
  }
  if (!set_launcher || !calls) rt_comm_abort(world, "TS_CUDA_DRIVER must name the fake driver (fake_cuda.c)");
  RtDev *dev = rt_dev_cuda_open(me, err, sizeof err);
  if (!dev) rt_comm_abort(world, "opening the fake GPU %d: %s", me, err);
  RtCudaModule cm;
  if (rt_cuda_module_build(m, &cm, err, sizeof err) != 0) rt_comm_abort(world, "no CUDA form: %s", err);
  if (!(emu = ts_emu_load(cm.src.p, err, sizeof err))) rt_comm_abort(world, "emulator: %s", err);
  set_launcher(run_kernel);
  if (rt_rank_gpu_groups(&rank, dev, err, sizeof err) != 0) rt_comm_abort(world, "%s", err);
  /* FAKE_GPU_COMM_EAGER=1: the comm stream runs work as issued (see above) */
  const char *ce = getenv("FAKE_GPU_COMM_EAGER");
  void (*set_eager)(const void *, int) = NULL;
  *(void **)&set_eager = dlsym(fake, "fake_cuda_set_eager");
  if (ce && *ce == '1') {
    if (!set_eager) rt_comm_abort(world, "the fake driver has no fake_cuda_set_eager");
    set_eager(dev->ops->stream_handle(dev, RT_STREAM_COMM), 1);
  }
  RtDevImage img = {cm.src.p, NULL, NULL, 0, 0};   /* compiled by NVRTC for the fake's arch, as from source */
  RtExecOpts gxo = {.backend = RT_BACKEND_LLVM, .threads = 1, .dev = dev, .image = &img, .dp_bucket_bytes = bucket,
                     .no_overlap = !bk};
  rt_exec_set_default(&gxo);
  RtTrainOpts tg = to;
  tg.metrics_path = gen ? NULL : md;
  tg.save_params_path = gen ? NULL : pd;
  if (fp8) tg.ckpt.save_dir = kd;
  if (gen && !(tg.log = fopen(gd, "w"))) rt_comm_abort(world, "%s: %s", gd, strerror(errno));
  if (rt_train(m, &tg, &res, err, sizeof err) != 0) rt_comm_abort(world, "GPU run: %s", err);
  if (gen) {
    fclose(tg.log);
    if (me == 0) {
      char a[4096] = "", b[4096] = "";
      FILE *fa = fopen(gc, "r"), *fb = fopen(gd, "r");
      size_t na = fa ? fread(a, 1, sizeof a - 1, fa) : 0, nb = fb ? fread(b, 1, sizeof b - 1, fb) : 0;
      if (fa) fclose(fa);
      if (fb) fclose(fb);
      a[na] = b[nb] = 0;
      printf("CPU ranks:\n%sGPU ranks:\n%s", a, b);

      const char *ia = strstr(a, "ids:"), *ib = strstr(b, "ids:");
      size_t la = ia ? strcspn(ia, "\n") : 0, lb = ib ? strcspn(ib, "\n") : 0;
      CHECK(la > 5 && la == lb && memcmp(ia, ib, la) == 0, "the GPU generated other tokens than the CPU");
      CHECK(strstr(b, "tokens equal the full forward's argmax"), "the GPU's tokens are not the full forward's argmax");
    }
    printf("rank %d: %lld kernels run by the emulator\n", me, emu_launches);
    CHECK(emu_launches > 0, "no kernel ran");
    goto finish;   /* the checks below are of training */
  }

  void *comm_stream = dev->ops->stream_handle(dev, RT_STREAM_COMM);
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  void *(*last_stream)(void) = nccl ? (void *(*)(void))dlsym(nccl, "fake_nccl_last_stream") : NULL;
  long (*nccl_ops)(void) = nccl ? (long (*)(void))dlsym(nccl, "fake_nccl_ops") : NULL;
  CHECK(last_stream && nccl_ops, "the fake NCCL is not the one loaded (LD_LIBRARY_PATH)");
  long nops = nccl_ops ? nccl_ops() : 0;
  printf("rank %d: %lld kernels run by the emulator, %ld cuLaunchKernel, %ld NCCL operations\n", me, emu_launches,
         calls("cuLaunchKernel"), nops);
  const char *(*last_module)(void) = NULL;
  *(void **)&last_module = dlsym(fake, "fake_cuda_last_module");
  const char *lm = last_module ? last_module() : "?";
  printf("rank %d: the module loaded as %s; %ld graph launches\n", me, lm, calls("cuGraphLaunch"));
  char want_lm[32];   /* sm_80, or the sm_90 of an --fp8 cell (FAKE_CUDA_DEVICES=90,90) */
  snprintf(want_lm, sizeof want_lm, "cubin sm_%d", dev->sm);
  CHECK(strcmp(lm, want_lm) == 0, "the module was loaded as %s, not NVRTC's %s", lm, want_lm);
  /* block micro is captured with its collectives and replayed, unless it
   * has host work: the pipeline's blocks are not "micro", and expert
   * parallelism's all_to_all_v brings counts to the host */
  if (getenv("TS_RT_PROFILE"))   /* every launch timed on its own: no graphs */
    CHECK(calls("cuGraphLaunch") == 0 && calls("cuEventElapsedTime_v2") > 0, "profiled: %ld graph launches, %ld "
          "event times read", calls("cuGraphLaunch"), calls("cuEventElapsedTime_v2"));
  else if (plan->mesh.pp <= 1 && plan->mesh.ep <= 1)
    CHECK(calls("cuGraphLaunch") > 0, "block micro was never replayed as a graph");
  printf("rank %d: %lld collectives on the comm stream, %lld device operations issued while one was in flight\n", me,
         res.dev_collectives, res.dev_overlapped);
  /* A pipeline rank's blocks begin with their recv, which the first
   * kernel reads, and stash / unstash hand buffers over with no device
   * work: nothing is there to overlap (until the schedule posts receives
   * early).  Every other layout's collectives overlap compute. */
  CHECK(res.dev_collectives > 0, "no collective on the comm stream");
  /* weight gradients whose GEMM adds into the state (beta = 1); under
   * ZeRO-3 (--zero 3) none can: every gradient is reduce-scattered over dp
   * before it is added into its 1/dp chunk */
  int zero3 = 0;
  for (int s = 0; s < m->states.n; s++) zero3 |= m->states.a[s].kind == IR_STATE_SHARD;
  printf("rank %d: %d gradients made straight into their state on the device\n", me, res.accum_direct);
  if (zero3) CHECK(res.accum_direct == 0, "ZeRO-3: %d gradients added into their states without a reduce-scatter",
                   res.accum_direct);
  else CHECK(res.accum_direct > 0, "no weight gradient's GEMM adds into its state on the device");
  if (plan->mesh.pp <= 1) CHECK(res.dev_overlapped > 0, "no collective overlapped compute");
  CHECK(emu_launches > 0, "no kernel ran");
  /* the overlapped dp reduction: the GPU ranks post the same buckets as
   * the CPU ranks, and every bucket but each step's last is followed by
   * compute of the backward before the block ends (the executor's record
   * of the order it issued work in); a reduction that waited for the
   * whole backward would have none */
  if (bk) {
    printf("rank %d: dp buckets: %lld on CPU ranks, %lld on the GPU, %lld of them followed by backward compute\n", me,
           cpu_buckets, res.dp_buckets, res.dp_dev_overlapped);
    CHECK(res.dp_buckets > 0 && res.dp_buckets == cpu_buckets, "%lld dp buckets posted on the GPU, %lld on CPU ranks",
          res.dp_buckets, cpu_buckets);
    CHECK(res.dp_buckets >= 2 * m->train.steps, "%lld dp buckets in %lld steps: not bucketed", res.dp_buckets,
          (long long)m->train.steps);
    CHECK(res.dp_dev_overlapped >= res.dp_buckets - m->train.steps,
          "only %lld of %lld dp buckets were issued before backward compute: the reduction waited for the backward",
          res.dp_dev_overlapped, res.dp_buckets);
  }
  /* the GEMMs cuBLASLt was given: under --precision bf16 (fp16) every one
   * reads bf16 (f16) A and B (CUDA_R_16BF, CUDA_R_16F; f32 accumulation),
   * none f32 copies, and the weight gradients go into their f32 main grads
   * (D CUDA_R_32F) */
  void *lt = dlopen(getenv("TS_CUBLASLT_LIB") ? getenv("TS_CUBLASLT_LIB") : "libcublasLt.so.13", RTLD_NOW | RTLD_NOLOAD);
  long (*lt_count)(int, int) = lt ? (long (*)(int, int))dlsym(lt, "fake_cublaslt_matmuls") : NULL;
  CHECK(lt_count, "the fake cuBLASLt is not the one loaded (TS_CUBLASLT_LIB)");
  if (lt_count) {
    long g32 = lt_count(0, -1), g64 = lt_count(1, -1), g16 = lt_count(14, -1), g16_32 = lt_count(14, 0);
    long h16 = lt_count(2, -1), h16_32 = lt_count(2, 0);
    printf("rank %d: cuBLASLt matmuls: %ld f32, %ld f64, %ld bf16 (%ld of them into f32), %ld f16 (%ld into f32)\n", me,
           g32, g64, g16, g16_32, h16, h16_32);
    if (fp8) {
      /* --fp8: every matmul8 of block micro is one fp8 GEMM per micro
       * batch (dp ranks share the global batch); the others stay bf16 */
      long (*lt8)(int, int) = (long (*)(int, int))dlsym(lt, "fake_cublaslt_fp8_matmuls");
      long g8 = lt8 ? lt8(-1, -1) : -1, g8_45 = lt8 ? lt8(28, 29) + lt8(29, 28) : -1, nmm8 = 0;
      int bm = ir_block_find(m, "micro");
      for (int i = 0; bm >= 0 && i < m->blocks.a[bm].n; i++) nmm8 += m->blocks.a[bm].nodes[i].op == IR_OP_MATMUL8;
      int64_t dp = plan->mesh.dp > 1 ? plan->mesh.dp : 1, mb = m->train.micro_batch > 0 ? m->train.micro_batch : 1;
      long want = nmm8 * (long)(m->train.global_batch / (mb * dp)) * (long)m->train.steps;
      printf("rank %d: cuBLASLt fp8 GEMMs: %ld (%ld of them e4m3 x e5m2 or e5m2 x e4m3: the gradients); %ld matmul8 in "
             "block micro x %lld micro batches x %lld steps = %ld\n", me, g8, g8_45, nmm8,
             (long long)(m->train.global_batch / (mb * dp)), (long long)m->train.steps, want);
      CHECK(nmm8 > 0 && g8 == want && g8_45 > 0, "fp8 GEMMs: %ld run, %ld wanted (%ld mixed)", g8, want, g8_45);
    }
    if (m->train.lowp == IR_BF16)
      CHECK(g16 > 0 && g16_32 > 0 && g32 == 0 && g64 == 0 && h16 == 0, "bf16 plan: %ld bf16 GEMMs (%ld into f32), "
            "%ld f32, %ld f64, %ld f16: every GEMM must read bf16 operands", g16, g16_32, g32, g64, h16);
    else if (m->train.lowp == IR_F16)
      CHECK(h16 > 0 && h16_32 > 0 && g32 == 0 && g64 == 0 && g16 == 0, "fp16 plan: %ld f16 GEMMs (%ld into f32), "
            "%ld f32, %ld f64, %ld bf16: every GEMM must read f16 operands", h16, h16_32, g32, g64, g16);
    else
      CHECK(g16 == 0 && h16 == 0, "%ld bf16 and %ld f16 GEMMs in a %s plan", g16, h16, ir_dtype_name(m->train.precision));
    /* a plan with GEMM bias epilogue groups (x @ W + b; in a bf16 plan the
     * f32 product of bf16 operands, pass precision) runs them as cuBLASLt
     * epilogues */
    long (*lt_epi)(int) = (long (*)(int))dlsym(lt, "fake_cublaslt_epilogues");
    long e16 = lt_epi ? lt_epi(14) : -1, eall = lt_epi ? lt_epi(0) + lt_epi(1) + lt_epi(2) + e16 : -1;   /* f32 f64 f16 bf16 */
    int groups = epilogue_groups(m);
    printf("rank %d: GEMM bias epilogue groups in the plan: %d; cuBLASLt epilogues run: %ld (%ld bf16)\n", me, groups,
           eall, e16);
    if (groups > 0)
      CHECK(m->train.lowp == IR_BF16 ? e16 > 0 : eall > 0, "%d GEMM bias epilogue groups, but %ld cuBLASLt epilogues "
            "(%ld of bf16 operands) ran", groups, eall, e16);
  }
  CHECK(nops > 0, "no NCCL operation");
  CHECK(!last_stream || last_stream() == comm_stream, "NCCL was not given the device's comm stream");

  if (me == 0) {
    double lc[1000], ld[1000];
    int nc = read_losses(mc, lc, 1000), nd = read_losses(md, ld, 1000);
    CHECK(nc == m->train.steps && nd == nc, "%d and %d losses for %d steps", nc, nd, (int)m->train.steps);
    for (int i = 0; i < nc && i < nd; i++) {
      double e = fabs(lc[i] - ld[i]) / fmax(fabs(lc[i]), 1e-30);
      printf("step %d: loss cpu %.12f gpu %.12f rel %.2e\n", i, lc[i], ld[i], e);
      CHECK(e <= tol, "step %d: loss differs by %.3e > %.1e", i, e, tol);
    }
    RtParams *a = rt_params_read(pc, err, sizeof err), *b = a ? rt_params_read(pd, err, sizeof err) : NULL;
    CHECK(a && b, "%s", err);
    if (a && b) {
      char where[256];
      double e = rt_params_max_rel_diff(b, a, where, sizeof where);
      printf("parameters after %d steps: max rel diff %.3e (%s)\n", (int)m->train.steps, e, where);
      CHECK(e >= 0 && e <= tol, "parameters differ by %.3e > %.1e", e, tol);
    }
    rt_params_free(a);
    rt_params_free(b);
  }
  if (fp8) {   /* each rank its own file: the fp8 states (scales, amax histories) */
    char where[512] = "";
    int nst = 0, nz = 0;
    double e = fp8_states_diff(kc, kd, me, (int)m->train.steps, &nst, &nz, where, sizeof where);
    printf("rank %d: %d fp8 states (%d values not at their start) after %d steps: max rel diff %.3e (%s)\n", me, nst,
           nz, (int)m->train.steps, e, where);
    CHECK(nst > 0 && nz > 0 && e >= 0 && e <= tol, "fp8 states differ by %.3e > %.1e (%s)", e, tol, where);
  }
finish:;
  double bad = check_bad();
  if (rt_comm_all_reduce(world, IR_F64, &bad, 1, err, sizeof err) != 0) rt_comm_abort(world, "%s", err);
  rt_rank_gpu_groups_free(&rank);
  set_launcher(NULL);
  ts_emu_free(emu);
  rt_cuda_module_free(&cm);
  xo.dev = NULL;
  rt_exec_set_default(&xo);
  dev->ops->close(dev);
  rt_rank_axes_groups_free(&rank);
  for (int a = 0; a < IR_AXIS_COUNT; a++) rt_comm_free(rank.group[a]);
  plan_free(plan);
  rt_comm_free(world);
  return check_exit_all("test_fake_gpu_step", bad);
}
