/* mcc.c - the Tessera compiler's command line: MDL source -> plan.
 *
 *   frontend (mdl_compile_file) -> pass pipeline (passes/pipeline.c) -> plan
 *
 * mcc is a client of the library's code (api/, the same code libtessera
 * exposes through include/tessera.h): its options are looked up in the
 * library's one option table (api/options.c) and the compile driver,
 * plan and reports are api/driver.c's.  What stays here is what only a
 * command-line program does: --help, --check (runs mrun), --auto-layout,
 * --emit=llvm / --emit=cuda / --target (NVRTC), --report kernels,
 * --stats and --time.
 *
 * The layout comes from the model's `parallel` block and --tp/--dp/--sp/
 * --no-zero/--cp/--ep/--pp.  The plan's mesh is (dp, pp, cp, ep, tp) of
 * the compiled module.  Without pipeline parallelism every rank runs
 * program 0; dp only shapes the update block (ZeRO), and mrun re-runs the
 * optimizer for another dp, so such a plan runs at any dp.  With pp > 1
 * the passes build one whole-model module (blocks fwd.<g> / bwd.<g>,
 * update.<r>), which is split into one program per pipeline rank
 * (passes/pipeline_rank.c); rank k runs the program of its pp coordinate.
 * The schedule (--schedule, --vpp) is computed and checked here, so a bad
 * combination with the micro batches is a compile error.  A pipeline plan
 * runs at the dp it was compiled for.
 *
 * Besides plans and IR: --report memory|comm (analyses of the compiled
 * program, no plan written) and --check (compile sharded and unsharded,
 * run both with mrun, compare losses and parameters).
 *
 * Exit codes: 0 ok, 1 compile, I/O or check failure, 2 usage error. */
#include "api/session.h"
#include "passes/pipe.h"
#include "autolayout.h"
#include "kreport.h"
#include "plan/plan.h"
#include "runtime/exec/train.h"
#include "runtime/exec/dev_prog.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MCC_VERSION "0.1"

static void usage(FILE *f) {
  fprintf(f,
          "usage: mcc FILE.mdl [options]\n"
          "Compiles an MDL model into a Tessera plan for mrun.\n"
          "\n"
          "  -o OUT                 output file (default: FILE with .plan; stdout for ir/dot/plan-text)\n"
          "  -D key=value           override a config value (repeatable)\n"
          "  --precision f32|f64|bf16|fp16  training precision (default: the train block's); bf16: f32\n"
          "                         masters, grads and optimizer, 16-bit activations and parameter\n"
          "                         copies as pass precision assigns them (docs/precision.md)\n"
          "  --precision-policy CLASS=f32|16[,...]  overrides the 16-bit policy per op class\n"
          "                         (classes: mcc --precision-policy help; docs/precision.md)\n"          "  --initial-loss-scale S, --loss-scale-window N, --hysteresis N, --min-loss-scale S\n"
          "                         fp16's dynamic loss scaling, Megatron's rule (defaults 2^32, 1000, 2, 1)\n"
          "  --loss-scale S         fp16: a fixed loss scale instead (steps with inf/NaN gradients still skip)\n"
          "  --fp8 hybrid|e4m3      with bf16: the repeat-stack layers' GEMMs in fp8, delayed scaling (also\n"
          "                         --fp8-format); --fp8-amax-history-len N (1024), --fp8-amax-compute-algo\n"
          "                         max|most_recent, --fp8-margin M (0), --fp8-all-layers (docs/precision.md)\n"
          "  --tp N                 tensor parallel size (default: the parallel block's, else 1)\n"
          "  --sp                   sequence parallelism (needs tp > 1)\n"
          "  --dp N                 data parallel size the update block and reports are built for\n"
          "                         (default: the parallel block's, else 1; mrun adapts a plan to any dp, pipelines too)\n"
          "  --no-zero              no distributed optimizer: every dp rank keeps whole Adam moments\n"
          "  --zero 0|1|3           0: --no-zero; 1: ZeRO-1 (default): optimizer state sharded over dp; 3: ZeRO-3 /\n"
          "                         FSDP: parameters, gradients and optimizer state sharded over dp, each parameter\n"
          "                         gathered before its use in the forward and again in the backward (docs/sharding.md)\n"
          "  --dp-bucket-size BYTES the dp gradient reduction in buckets of at least BYTES (K, M, G suffixes; default\n"
          "                         Megatron's 40M elements), each issued during the last micro batch's backward:\n"
          "                         --report comm shows them; --check passes it to mrun (--ddp-bucket-size N: elements)\n"
          "  --no-overlap-grad-reduce  --report comm / --check: the dp reduction after the backward, in the update\n"
          "                         block (--overlap-grad-reduce: the default)\n"
          "  --cp N                 context parallel size (sequence split over cp ranks, causal load balancing)\n"
          "  --cp-attn ring|allgather|a2a  fused attention under cp: k/v passed in a ring (default),\n"
          "                         all-gathered, or all-to-all to head-split layouts (Ulysses)\n"
          "  --decode               also the generation blocks prefill and step with a KV cache (pass decode,\n"
          "                         docs/generation.md; mrun --generate derives them itself when missing)\n"
          "  --ep N                 expert parallel size (dims ruled to ep, e.g. experts, split over ep ranks)\n"
          "  --pp N                 pipeline parallel size (stages of the model's layer stack)\n"
          "  --stdlib DIR           where `import nn` looks (default: $TESSERA_STDLIB, else the installed\n"
          "                         share/tessera/stdlib, else the source tree's stdlib/)\n"
          "  --emit=KIND            plan (default), plan-text, ir (final IR), dot (Graphviz)\n"
          "  --emit=llvm DIR        instead of a plan, each distinct kernel's optimized LLVM IR as DIR/<kernel>_<hash>.ll\n"
          "                         and its kernel IR (text) as DIR/<kernel>_<hash>.kir\n"
          "  --target sm_80,sm_90   compile every kernel with NVRTC for these GPUs, any arch NVRTC supports\n"
          "                         (sm_80 A100, sm_86/sm_89 RTX, sm_90 H100/H200, sm_100 B200; PTX + cubin in the plan;\n"
          "                         ptxas must report at most 64 bytes of spills or stack per kernel)\n"
          "  --emit=cuda DIR        instead of a plan, each program's CUDA module as DIR/prog<K>_<hash>.cu\n"
          "                         (and .ptx per --target)\n"
          "  --no-fuse              no fusion groups (every node its own kernel; for comparisons)\n"
          "  --no-remat             keep every value the backward reads instead of recomputing the cheap ones\n"
          "  --max-source-bytes N   refuse an MDL source (or import) larger than N bytes (default 16 MiB)\n"
          "  --activation-budget B  the most bytes a micro batch may hold across its backward, per pipeline\n"
          "                         stage (suffix K, M, G: KiB, MiB, GiB): gathered values (sp) are kept for\n"
          "                         the backward only while they fit, the rest gathered again (default: no\n"
          "                         limit, every gathered copy is kept: it sends fewer bytes)\n"
          "  --regather             gather every gathered value again for the backward (Megatron's sp: the\n"
          "                         least memory, more bytes sent)\n"
          "  --keep-gathered        keep every gathered value for the backward (the default without a budget)\n"
          "  --recompute MODE       activation recompute: none (the default: only values an elementwise, row\n"
          "                         or layout op makes), full (keep each layer's input, recompute the layer),\n"
          "                         selective (what costs at most 256 FLOPs per element saved), auto (the\n"
          "                         least FLOPs that fit --memory-budget); docs/cli.md\n"
          "  --memory-budget B      --recompute auto: the most bytes a micro batch may hold for its backward,\n"
          "                         per rank and pipeline stage (suffix K, M, G); refused with the least\n"
          "                         achievable figure when it cannot be met\n"
          "  --dump-ir=all DIR      write the IR after every pass to DIR/NN-<pass>.ir\n"
          "  --dump-ir=PASS DIR     ... after one pass only\n"
          "  --print-ir-after=PASS  print the IR after PASS to stdout\n"
          "  --verify-each          verify the IR after every pass (the default)\n"
          "  --no-verify            do not verify between passes\n"
          "  --verify-roundtrip     check that the IR (and the plan) print and parse back identically\n"
          "  --time                 per-stage wall times on stderr\n"
          "  --stats                parameter, state and node counts on stderr\n"
          "  --report memory        per-rank memory (parameters, gradients, optimizer state, planned\n"
          "                         activation arenas) and the unsharded totals, to stdout (or -o)\n"
          "  --report comm          per-rank collectives per step (count, payload, ring bytes sent)\n"
          "  --report sharding      every collective with what it moves, its bytes, and the rule that put it\n"
          "                         there (also --explain-sharding)\n"
          "  --report schedule      pipeline: stage partition, each rank's timeline, bubble, in flight\n"
          "  --report time          predicted step time, TFLOP/s per GPU and MFU on --hw, per block: compute,\n"
          "                         exposed communication per mesh axis, pipeline bubble, optimizer\n"
          "                         (docs/performance-model.md); last line step_time_s=... tflops_per_gpu=... mfu=...\n"
          "  --report kernels       the CUDA kernels of each rank program as a roofline table: launches,\n"
          "                         grid, bytes, FLOPs, intensity; registers, shared memory, spills and\n"
          "                         occupancy with --target sm_XX (one arch); predicted times with --hw\n"
          "  --hw NAME|FILE         hardware description for --report time, --report comm (the dp reduction's\n"
          "                         predicted overlap), --auto-layout and --emit=trace: a100-80gb, h100-sxm,\n"
          "                         h200, b200 (hw/*.hw), or a file in that format (hw/README.md)\n"
          "  --auto-layout          with --gpus N --hw NAME: search tp, sp, cp, ep, pp, vpp, dp, micro batch and\n"
          "                         recompute for the fastest predicted step that fits; print the best five and\n"
          "                         write the chosen plan with -o (docs/performance-model.md, \"Layout search\")\n"
          "  --memory B             --auto-layout: bytes per GPU (suffix K, M, G; default: the description's HBM)\n"
          "  --emit=trace FILE      pipeline: Chrome/Perfetto trace (JSON) of the simulated schedule\n"
          "                         (with --hw: in predicted seconds; else in the partition's cost units)\n"
          "  --vpp V                pipeline: chunks per rank (virtual pipeline size; default 1)\n"
          "  --schedule S           pipeline: gpipe, 1f1b (default), interleaved (default with --vpp >= 2) or\n"
          "                         zb-h1 (zero bubble: backward split into B and deferred W steps)\n"
          "  --pp-layers A,B,...    pipeline: layers per stage (pp x vpp entries) instead of balancing\n"
          "  --pp-layout STR        pipeline: Megatron layout string, e.g. \"Et*3|t*3|t*3|t*3L\"\n"
          "  --pp-stack NAME        pipeline: cut only the repeat stack NAME (of several, e.g. an\n"
          "                         encoder-decoder's); the others ride whole with their neighbouring stage\n"
          "  --check                compile the layout and the unsharded model in f64, run both with\n"
          "                         mrun, compare the per-step losses and final parameters (fails\n"
          "                         above 1e-10; with --precision f32: f32 and 1e-5)\n"
          "  --steps K              --check: steps to run (default 3)\n"
          "  --gpus N               --check: ranks for the layout's run (default: its mesh size);\n"
          "                         --report time: GPUs of the step (dp = N / (tp pp cp ep)); --auto-layout: GPUs\n"
          "  Megatron-LM's flags that mean the same (docs/cli.md): --tensor-model-parallel-size,\n"
          "    --pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-stage, --context-parallel-size,\n"
          "    --expert-model-parallel-size, --sequence-parallel, --use-distributed-optimizer; config keys\n"
          "    --num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads, --num-query-groups,\n"
          "    --seq-length, --micro-batch-size, --num-experts, --moe-router-topk; train fields\n"
          "    --global-batch-size, --train-iters, --lr, --min-lr, --lr-warmup-iters, --lr-decay-iters,\n"
          "    --lr-decay-style, --clip-grad, --weight-decay, --adam-beta1, --adam-beta2, --adam-eps, --seed,\n"
          "    --lr-wsd-decay-style, --lr-wsd-decay-iters, --sgd-momentum\n"
          "  --optimizer NAME       adamw (the default; Megatron's adam), sgd, lion or muon (docs/cli.md)\n"
          "  --momentum M           sgd's momentum (default 0.9; --sgd-momentum is the same)\n"
          "  --nesterov, --no-nesterov  Nesterov momentum (default: on for muon as its reference, off for sgd)\n"
          "  --muon-momentum M      muon's momentum (default 0.95)\n"
          "  --muon-ns-steps N      muon's Newton-Schulz iterations (default 5)\n"
          "  --rampup-batch-size S I N  Megatron's batch-size ramp-up: the global batch starts at S and grows by\n"
          "                         I over the first N samples (docs/cli.md \"Batch-size ramp-up\")\n"
          "  --train-samples N      Megatron's: the run's length in samples (the steps that consume N)\n"
          "  --muon-adamw-lr X      the lr of muon's AdamW group (embedding, head, biases, gains): the schedule\n"
          "                         scaled by X / lr (default: the group runs at --lr); mrun takes it too\n"
          "  --muon-tp-mode M       muon on a tp-split matrix: auto (the fewer bytes), allreduce (its Gram\n"
          "                         matrix every iteration) or gather (the matrix once)\n"
          "  --help, --version\n"
          "Any option that takes a value also takes --option=VALUE.  The C API (include/tessera.h, libtessera)\n"
          "takes the same options by the same names: docs/embedding.md.\n"
          "Passes, in order: frontend");
  for (int i = 0; i < pass_pipeline_count; i++) fprintf(f, ", %s", pass_pipeline[i].name);
  fprintf(f, "\n");
}

typedef ApiSession Args;

/* --pipeline views: --report schedule or --emit=trace */
static int pipe_views(const Args *a) { return api_pipe_views_wanted(a); }

/* The command line into the session: every option is looked up in the
 * one table the library uses too (api/options.c), its value taken from
 * "--flag=VALUE" or the next argument ("-Dkey=value" as well).  Returns
 * -1 to continue, or the exit code (0 for --help / --version). */
static int parse_args(int argc, char **argv, Args *a) {
  static char rampup[256];
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i], *value = NULL, *name = s;
    if (s[0] != '-' || !s[1]) {
      if (a->input) {
        fprintf(stderr, "mcc: more than one input file ('%s')\n(run 'mcc --help' for the options)\n", s);
        return 2;
      }
      a->input = s;
      continue;
    }
    char dflag[3] = "-D";
    ApiArg arg;
    const char *sub, *inl;
    if (strncmp(s, "-D", 2) == 0 && s[2]) name = dflag, value = s + 2;   /* -Dkey=value */
    else if (api_opt_lookup(s, &arg, &sub, &inl) == 0 && arg == API_ARG_VALUE) {
      if (i + 1 >= argc) {
        fprintf(stderr, "mcc: option '%s' needs an argument\n(run 'mcc --help' for the options)\n",
                strncmp(s, "--dump-ir=", 10) == 0 ? "--dump-ir=all" : s);
        return 2;
      }
      value = argv[++i];
      if (strcmp(s, "--rampup-batch-size") == 0) {   /* Megatron's three words: START INCR SAMPLES */
        if (i + 2 >= argc) {
          fprintf(stderr, "mcc: --rampup-batch-size takes three numbers, START INCR SAMPLES\n(run 'mcc --help' for "
                  "the options)\n");
          return 2;
        }
        snprintf(rampup, sizeof rampup, "%s %s %s", argv[i], argv[i + 1], argv[i + 2]);
        value = rampup;
        i += 2;
      }
    }
    int rc = api_opt_apply(a, name, value);
    if (rc == API_STOP) {
      if (a->text) fputs(a->text, stdout);
      else if (!strcmp(s, "--version")) printf("mcc (Tessera) %s, plan format %d\n", MCC_VERSION, PLAN_VERSION);
      else usage(stdout);
      return 0;
    }
    if (rc != API_OK) return rc;
  }
  int rc = api_opt_finish(a);
  return rc == API_OK ? -1 : rc;
}

static void print_stats(const IrModule *m) {
  int64_t params = 0, nodes = 0;
  int nparams = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) { params += ir_type_numel(&m->states.a[i].type); nparams++; }
  for (int b = 0; b < m->blocks.n; b++) nodes += m->blocks.a[b].n;
  fprintf(stderr, "stats: %lld parameters in %d tensors, %d states, %d blocks, %lld IR nodes\n",
          (long long)params, nparams, m->states.n, m->blocks.n, (long long)nodes);  /* not a refusal */
}

/* Writes text (or bytes) to -o, or to stdout when there is none or it is "-". */
/* An NVRTC failure: the first error lines, each with the kernel whose
 * lines hold it (a kernel NVRTC rejects is a compiler bug). */
static void nvrtc_failure(const RtCudaModule *cm, const char *log, int sm) {
  fprintf(stderr, "mcc: internal error: NVRTC rejected the CUDA module for sm_%d:\n", sm);
  int shown = 0;
  for (const char *q = log ? strstr(log, "tessera.cu(") : NULL; q && shown < 5; q = strstr(q + 1, "tessera.cu(")) {
    int line = atoi(q + 11);
    const char *e = strchr(q, '\n');
    const RtCudaKernelInfo *k = rt_cuda_module_kernel_at(cm, line);
    fprintf(stderr, "  kernel %s (%s): %.*s\n", k ? k->name : "?", k ? k->where : "the prelude",
            (int)(e ? e - q : (long)strlen(q)), q);
    shown++;
  }
  if (!shown && log) fprintf(stderr, "%s\n", log);
}

/* --target / --emit=cuda: every program's CUDA module, compiled with NVRTC
 * for each arch of a->sm into images of p (ptxas' report checked for
 * every kernel) and, with dir, written there.  0 or 1. */
static int compile_cuda(const Args *a, Plan *p, const char *dir) {
  char err[2048];
  if (a->nsm && !cg_nvrtc_available(err, sizeof err)) { fprintf(stderr, "mcc: --target: %s\n", err); return 1; }
  if (dir && mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "mcc: cannot create '%s': %s\n", dir, strerror(errno));
    return 1;
  }
  for (int pi = 0; pi < p->nprograms; pi++) {
    RtCudaModule cm;
    if (rt_cuda_module_build(p->programs[pi], &cm, err, sizeof err) != 0) {
      fprintf(stderr, "mcc: error: program %d has no CUDA form: %s\n", pi, err);
      return 1;
    }
    char path[4096];
    int rc = 0;
    if (dir) {
      snprintf(path, sizeof path, "%s/prog%d_%08llx.cu", dir, pi, (unsigned long long)(cm.hash & 0xffffffffu));
      if (ts_write_file(path, cm.src.p, cm.src.n) != 0) {
        fprintf(stderr, "mcc: error: %s\n", ts_io_error());
        rc = 1;
      }
    }
    for (int t = 0; t < a->nsm && rc == 0; t++) {
      char arch[8];
      snprintf(arch, sizeof arch, "sm_%d", a->sm[t]);
      CgNvrtcOut o;
      if (cg_nvrtc_compile(cm.src.p, arch, &o, err, sizeof err) != 0) {
        if (o.log) nvrtc_failure(&cm, o.log, a->sm[t]);
        else fprintf(stderr, "mcc: %s\n", err);
        cg_nvrtc_out_free(&o);
        rc = 1;
        break;
      }
      for (int k = 0; k < cm.nkern && rc == 0; k++) {   /* every kernel has a clean report */
        const CgPtxasInfo *q = NULL;
        for (int j = 0; j < o.nkern; j++)
          if (strcmp(o.kern[j].name, cm.kern[k].name) == 0) q = &o.kern[j];
        if (!q) {
          fprintf(stderr, "mcc: internal error: ptxas reports nothing for kernel %s (%s)\n", cm.kern[k].name, cm.kern[k].where);
          rc = 1;
        } else if (cg_ptxas_check(q, arch, err, sizeof err) != 0) {
          fprintf(stderr, "mcc: internal error: %s (%s)\n", err, cm.kern[k].where);
          rc = 1;
        }
      }
      if (rc == 0 && dir) {
        snprintf(path, sizeof path, "%s/prog%d_%08llx.%s.ptx", dir, pi, (unsigned long long)(cm.hash & 0xffffffffu), arch);
        if (ts_write_file(path, o.ptx, o.ptx_len) != 0) {
          fprintf(stderr, "mcc: error: %s\n", ts_io_error());
          rc = 1;
        }
      }
      if (rc == 0) {
        PlanImage im = {pi, a->sm[t], cm.hash, o.ptx, o.ptx_len, o.cubin, o.cubin_len, o.nkern, o.kern};
        plan_add_image(p, &im);
        int regs = 0;
        long long local = 0;   /* the most spill / stack bytes of a kernel (the math library's slow paths) */
        for (int j = 0; j < o.nkern; j++) {
          const CgPtxasInfo *q = &o.kern[j];
          regs = q->registers > regs ? q->registers : regs;
          long long m = q->spill_stores > q->stack ? q->spill_stores : q->stack;
          m = q->cstack > m ? q->cstack : m;
          local = m > local ? m : local;
        }
        char spills[96] = "no spills";
        if (local) snprintf(spills, sizeof spills, "at most %lld bytes of spills or stack (CUDA's math slow paths)", local);
        fprintf(stderr, "mcc: program %d, %s: %d kernels, PTX %zu bytes, cubin %zu bytes, at most %d registers, %s\n",
                pi, arch, cm.nkern, o.ptx_len, o.cubin_len, regs, spills);  /* not a refusal */
      }
      cg_nvrtc_out_free(&o);
    }
    if (rc == 0 && dir) fprintf(stderr, "mcc: wrote program %d's CUDA module (%d kernels) to %s\n", pi, cm.nkern, dir);  /* not a refusal */
    rt_cuda_module_free(&cm);
    if (rc) return 1;
  }
  return 0;
}

/* The plan of m (the plan takes it): --target / --emit=cuda here, the
 * rest as the library writes it (api_plan_output). */
static int write_plan(const Args *a, IrModule *m, int *owned) {
  Plan *p = api_make_plan(a, m);
  *owned = 0;                         /* the plan owns the module now */
  if (!p) return 1;
  int rc = 0;
  if (a->nsm || a->cuda_dir) rc = compile_cuda(a, p, a->cuda_dir);
  if (rc == 0 && !a->cuda_dir) rc = api_plan_output(a, p);   /* --emit=cuda: the sources instead of a plan */
  plan_free(p);
  return rc;
}

/* ---- --report kernels (tools/kreport.c) ---- */
static int report_kernels(const Args *a, const IrModule *m, StrBuf *out) {
  HwDesc hw;
  char err[2048];
  if (a->hw && hw_load(a->hw, &hw, err, sizeof err) != 0) { fprintf(stderr, "mcc: error: %s\n", err); return 1; }
  if (a->nsm && !cg_nvrtc_available(err, sizeof err)) { fprintf(stderr, "mcc: --target: %s\n", err); return 1; }
  Plan *p = api_make_plan(a, ir_module_clone(m));
  if (!p) return 1;
  int rc = 0;
  for (int pi = 0; pi < p->nprograms && rc == 0; pi++)
    if (kreport_program(p->programs[pi], pi, a->nsm ? a->sm[0] : 0, a->hw ? &hw : NULL, out, err, sizeof err) != 0) {
      fprintf(stderr, "mcc: error: --report kernels: program %d: %s\n", pi, err);
      rc = 1;
    }
  plan_free(p);
  return rc;
}

/* ---- --check ---- */

/* A fresh directory for the check's files (under $TMPDIR, else /tmp). */
static char *make_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  size_t n = strlen(base) + 32;
  char *dir = ts_xmalloc(n);
  snprintf(dir, n, "%s/mcc-check-XXXXXX", base);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "mcc: error: --check: cannot create a directory in %s: %s\n", base, strerror(errno));
    free(dir);
    return NULL;
  }
  return dir;
}

/* mrun is installed next to mcc (the build puts both in one directory). */
static int find_mrun(char *path, size_t n) {
  char self[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) return -1;
  self[l] = 0;
  char *slash = strrchr(self, '/');
  if (!slash) return -1;
  *slash = 0;
  snprintf(path, n, "%s/mrun", self);
  return access(path, X_OK);
}

/* Runs mrun PLAN --gpus N --steps K --metrics M --save-params P --quiet
 * [--seed S when seed >= 0], its stdout discarded and its stderr passed
 * on.  0 if it exited 0. */
static int run_mrun(const Args *a, const char *mrun, const char *plan, int gpus, int steps, const char *metrics,
                    const char *params, long long seed) {
  char g[32], k[32], sd[32], bk[32];
  snprintf(g, sizeof g, "%d", gpus);
  snprintf(k, sizeof k, "%d", steps);
  snprintf(sd, sizeof sd, "%lld", seed);
  snprintf(bk, sizeof bk, "%lld", (long long)(a->dp_bucket_elems ? a->dp_bucket_elems : a->dp_bucket_bytes));
  const char *argv[16] = {mrun, plan, "--gpus", g, "--steps", k, "--metrics", metrics, "--save-params", params,
                          "--quiet"};
  int na = 11;
  if (a->no_overlap) argv[na++] = "--no-overlap-grad-reduce";
  if (a->dp_bucket_elems || a->dp_bucket_bytes) {   /* the overlapped dp reduction as asked */
    argv[na++] = a->dp_bucket_elems ? "--ddp-bucket-size" : "--dp-bucket-size";
    argv[na++] = bk;
  }
  if (seed >= 0) argv[na++] = "--seed", argv[na++] = sd;
  argv[na] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) { fprintf(stderr, "mcc: error: --check: fork: %s\n", strerror(errno)); return -1; }
  if (pid == 0) {
    FILE *devnull = freopen("/dev/null", "w", stdout);
    (void)devnull;
    execv(mrun, (char *const *)argv);
    fprintf(stderr, "mcc: error: --check: cannot run %s: %s\n", mrun, strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  if (WIFEXITED(st)) fprintf(stderr, "mcc: error: --check: mrun %s exited with status %d\n", plan, WEXITSTATUS(st));
  else fprintf(stderr, "mcc: error: --check: mrun %s was killed by signal %d\n", plan, WTERMSIG(st));
  return -1;
}

/* The per-step losses of an mrun --metrics file (JSON Lines with
 * "loss": number; null = not finite).  Returns the count, or -1. */
static int read_losses(const char *path, double *loss, int max) {
  size_t len;
  char *text = ts_read_file(path, &len);
  if (!text) { fprintf(stderr, "mcc: error: --check: cannot read %s: %s\n", path, strerror(errno)); return -1; }
  int n = 0;
  for (char *line = text; *line && n < max;) {
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    char *at = strstr(line, "\"loss\":");
    if (at) loss[n++] = strncmp(at + 7 + strspn(at + 7, " "), "null", 4) == 0 ? NAN : strtod(at + 7, NULL);
    if (!end) break;
    line = end + 1;
  }
  free(text);
  return n;
}

static double rel_diff(double a, double b) {
  double s = fabs(b) > 1e-300 ? fabs(b) : 1e-300;
  return fabs(a - b) / s;
}

/* Compiles `m`'s model unsharded too (the module m is the requested
 * layout), runs both with mrun and compares.  0 = within tolerance. */
static int run_check(const Args *a, IrModule *m) {
  int steps = a->steps > 0 ? a->steps : 3;
  /* bf16: the layout rounds to 16 bits at the same ops, but sums in another
   * order (tp partial sums, dp gradients), and a bf16 rounding flips on a
   * different last bit: agreement to 1e-2, not to f32's 1e-5 */
  double tol = m->train.precision == IR_F64 ? 1e-10 : m->train.lowp != IR_VOID ? 1e-2 : 1e-5;
  /* ... and the parameters to 5e-2: a gradient that is rounding noise
   * (attention's key bias: softmax is shift-invariant, its true gradient
   * is 0) is scaled by Adam to whole lr-sized steps of either sign */
  double tol_par = m->train.lowp != IR_VOID ? 5e-2 : tol;
  int64_t nranks = api_mesh_ranks(m);
  int gpus = a->gpus > 0 ? a->gpus : (int)nranks;
  int replica = (int)(nranks / ir_axis_size(m, IR_AXIS_DP));   /* tp*pp*cp*ep: ranks per dp replica */
  if (gpus % replica != 0) {
    fprintf(stderr, "mcc: error: --check --gpus %d: not a multiple of the %d ranks of one data-parallel "
                    "replica (tp*pp*cp*ep); use a multiple of %d (--gpus %d gives dp=1)\n", gpus, replica, replica,
            replica);
    return 1;
  }
  char lay[128], mrun[PATH_MAX + 8];
  api_layout_str(m, lay, sizeof lay);
  if (find_mrun(mrun, sizeof mrun) != 0) {
    fprintf(stderr, "mcc: error: --check needs mrun next to mcc (looked for %s)\n", mrun);
    return 1;
  }
  MdlOptions uo = api_unsharded_options(&a->mdl);
  IrModule *u = api_compile_quiet(a, &uo, 1);
  if (!u) return 1;
  char *dir = make_tmpdir();
  if (!dir) { ir_module_free(u); return 1; }
  static const char *const files[] = {"layout.plan", "layout.jsonl", "layout.params",
                                      "single.plan", "single.jsonl", "single.params"};
  char path[6][PATH_MAX];
  for (int i = 0; i < 6; i++) snprintf(path[i], sizeof path[i], "%s/%s", dir, files[i]);

  int rc = 1;
  char err[1024];
  double *la = NULL, *lb = NULL;          /* per-step losses of the two runs */
  IrModule *mods[2] = {m, u};
  for (int i = 0; i < 2; i++) {        /* a plan owns its module: m's plan gets a clone (the caller owns m) */
    Plan *p = api_make_plan(a, i == 0 ? ir_module_clone(mods[i]) : mods[i]);
    if (i == 1) u = NULL;
    if (!p) goto cleanup;
    int w = plan_write(p, path[3 * i], err, sizeof err);
    plan_free(p);
    if (w != 0) { fprintf(stderr, "mcc: error: --check: %s\n", err); goto cleanup; }
  }
  char at_dp[32] = "";                   /* --gpus beyond the mesh: more dp ranks */
  if (gpus != nranks) snprintf(at_dp, sizeof at_dp, " (dp=%d)", gpus / replica);
  printf("check: %s, %s on %d rank%s%s against 1 rank, %d steps, %s\n", m->name, lay, gpus, gpus == 1 ? "" : "s",
         at_dp, steps, ir_dtype_name(m->train.lowp != IR_VOID ? m->train.lowp : m->train.precision));
  fflush(stdout);
  /* Test hook (tests/parallel): TS_CHECK_PERTURB_SEED=1 runs the layout
   * with another seed, so the comparison must report FAIL. */
  const char *perturb = getenv("TS_CHECK_PERTURB_SEED");
  long long seed = perturb && *perturb && strcmp(perturb, "0") ? (long long)(m->train.seed % (1ull << 62)) + 1 : -1;
  if (run_mrun(a, mrun, path[0], gpus, steps, path[1], path[2], seed) != 0) goto cleanup;
  if (run_mrun(a, mrun, path[3], 1, steps, path[4], path[5], -1) != 0) goto cleanup;

  la = ts_xmalloc((size_t)steps * sizeof *la);
  lb = ts_xmalloc((size_t)steps * sizeof *lb);
  int na = read_losses(path[1], la, steps), nb = read_losses(path[4], lb, steps);
  if (na < 0 || nb < 0) goto cleanup;
  if (na != nb || na != steps) {
    fprintf(stderr, "mcc: error: --check: %d and %d losses reported for %d steps\n", na, nb, steps);
    goto cleanup;
  }
  double dloss = 0;
  int worst_step = 0;
  for (int s = 0; s < na; s++) {
    double d = rel_diff(la[s], lb[s]);
    if (isnan(d) || d > dloss) { dloss = d; worst_step = s + 1; }
    if (isnan(d)) break;
  }
  RtParams *pa = rt_params_read(path[2], err, sizeof err), *pb = pa ? rt_params_read(path[5], err, sizeof err) : NULL;
  if (!pa || !pb) {
    fprintf(stderr, "mcc: error: --check: %s\n", err);
    rt_params_free(pa);
    goto cleanup;
  }
  char where[256];
  double dpar = rt_params_max_rel_diff(pa, pb, where, sizeof where);
  rt_params_free(pa);
  rt_params_free(pb);
  if (dpar < 0 && !isnan(dpar)) {
    fprintf(stderr, "mcc: error: --check: the runs saved different parameters: %s\n", where);
    goto cleanup;
  }
  printf("  loss:   max relative difference %.3g over %d steps (worst at step %d)\n", dloss, na, worst_step);
  printf("  params: max relative difference %.3g (worst: %s; max|a-b| / max|b| per tensor, scale floored at 10%% of the largest parameter)\n", dpar, where);
  int ok = dloss <= tol && dpar <= tol_par;      /* NaN fails */
  if (tol_par != tol)
    printf("check: %s: %s %s the single-rank run within %g (loss) and %g (params)\n", ok ? "PASS" : "FAIL", lay,
           ok ? "matches" : "does NOT match", tol, tol_par);
  else
    printf("check: %s: %s %s the single-rank run within %g\n", ok ? "PASS" : "FAIL", lay, ok ? "matches" : "does NOT match",
           tol);
  rc = ok ? 0 : 1;
cleanup:
  free(la);
  free(lb);
  for (int i = 0; i < 6; i++) unlink(path[i]);
  rmdir(dir);
  free(dir);
  ir_module_free(u);
  fflush(stdout);
  return rc;
}

/* ---- --auto-layout (tools/autolayout.h) ---- */
typedef struct {
  const Args *a;
  int fixed_mb;              /* the micro batch is the model's (no config key micro_batch, or the user set it) */
} AutoCtx;

/* The first line of a captured diagnostic. */
static void first_line(const char *text, char *err, size_t errlen) {
  size_t n = text ? strcspn(text, "\n") : 0;
  snprintf(err, errlen, "%.*s", (int)(n < errlen ? n : errlen - 1), text ? text : "");
  if (!err[0]) snprintf(err, errlen, "the frontend refused it");
}

/* Compiles the model in layout l, as `mcc --tp .. --pp .. --dp ..` would,
 * with its diagnostics captured into err (autolayout.h). */
static IrModule *auto_compile(void *ctx, const AlLayout *l, const char *stack, int stack_layers, const int *pp_layers,
                              int npp_layers, char *err, size_t errlen) {
  const AutoCtx *ac = ctx;
  const Args *a = ac->a;
  MdlOptions o = a->mdl;
  o.tp = l->tp;
  o.sp = l->sp;
  o.cp = l->cp;
  o.ep = l->ep;
  o.pp = l->pp;
  o.zero = l->zero;
  o.repeat_path = stack_layers >= 0 ? stack : NULL;
  o.repeat_count = stack_layers;
  MdlSetting *sets = ts_xmalloc((size_t)(a->config_sets.n + 1) * sizeof *sets);
  int ns = 0;
  char mbv[32];
  for (int i = 0; i < a->config_sets.n; i++) sets[ns++] = a->config_sets.a[i];
  if (!ac->fixed_mb) {
    snprintf(mbv, sizeof mbv, "%d", l->mb);
    sets[ns++] = (MdlSetting){ts_intern("micro_batch"), mbv, "--auto-layout"};
  }
  o.config_sets = sets;
  o.nconfig_sets = ns;
  char *dbuf = NULL;
  size_t dlen = 0;
  FILE *diag = open_memstream(&dbuf, &dlen);
  o.diag = diag;
  IrModule *m = diag ? mdl_compile_file(a->input, &o) : NULL;
  if (diag) fclose(diag);
  free(sets);
  if (!m) {
    first_line(dbuf, err, errlen);
    free(dbuf);
    return NULL;
  }
  free(dbuf);
  m->par.dp = l->dp;
  if (l->pp > 1) {   /* what pipe_prepare does for the flags */
    PipeOptions po = {l->pp, l->vpp, pp_layers, npp_layers, NULL, NULL};
    PipePartition part;
    PipeSchedule sc;
    int nmicro = 0;
    if (pass_pipe_partition(m, &po, &part, err, errlen) != 0) { ir_module_free(m); return NULL; }
    pass_pipe_partition_free(&part);
    m->par.vpp = l->vpp;
    m->par.sched = api_ir_sched_of(l->sched);
    if (plan_pipe_nmicro(&m->train, l->dp, &nmicro, err, errlen) != 0 ||
        plan_pipe_schedule(l->sched, l->pp, l->vpp, nmicro, &sc, err, errlen) != 0) {
      ir_module_free(m);
      return NULL;
    }
    plan_pipe_schedule_free(&sc);
  }
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.verify_each = 0;            /* the plan is verified when mrun loads it */
  cx.no_fuse = a->cx->no_fuse;
  cx.regather = a->cx->regather;
  cx.activation_budget = a->cx->activation_budget;
  cx.cp_attn = l->cp_attn;
  cx.recompute = l->recompute;
  cx.pp_layers = pp_layers;
  cx.pp_nlayers = npp_layers;
  if (pass_run_pipeline(m, &cx) != 0) {
    snprintf(err, errlen, "%s", cx.err);
    ir_module_free(m);
    m = NULL;
  }
  pass_ctx_free(&cx);
  return m;
}

/* --auto-layout: the search's table on stdout, the chosen plan to -o. */
static int run_auto_layout(const Args *a) {
  HwDesc hw;
  char err[2048];
  if (hw_load(a->hw, &hw, err, sizeof err) != 0) { fprintf(stderr, "mcc: error: %s\n", err); return 1; }
  IrModule *f = api_frontend(a, &a->mdl);
  if (!f) return 1;
  const char *mbk = ts_intern("micro_batch");
  int has_mb = 0, user_mb = 0;
  for (int i = 0; i < f->consts.n; i++) has_mb |= f->consts.a[i].name == mbk;
  for (int i = 0; i < a->defines.n; i++) user_mb |= a->defines.a[i].name == mbk;
  for (int i = 0; i < a->config_sets.n; i++) user_mb |= a->config_sets.a[i].name == mbk;
  AutoCtx ac = {a, !has_mb || user_mb};
  AlCompiler c = {&ac, auto_compile, api_llvm_positions, NULL};
  AlOptions o = {a->gpus, &hw, (double)a->memory, ac.fixed_mb, 0, 0, a->cp_attn_given ? a->cx->cp_attn : -1};
  StrBuf b = {0};
  AlResult best;
  IrModule *w = NULL;
  int rc = al_search(f, &c, &o, &b, &best, &w, err, sizeof err) != 0;
  ir_module_free(f);
  if (api_emit_text(a, NULL, &b) != 0) rc = 1;
  sb_free(&b);
  if (rc) {
    fprintf(stderr, "mcc: error: %s\n", err);
    ir_module_free(w);
    return 1;
  }
  if (!a->output) { ir_module_free(w); return 0; }
  int owned = 1;
  rc = write_plan(a, w, &owned);
  if (owned) ir_module_free(w);
  return rc;
}

int main(int argc, char **argv) {
  ts_check_stdout_at_exit("mcc");
  Args a;
  api_session_init(&a, "mcc", stderr);
  PassCtx *cx = a.cx;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) goto out;
  rc = 1;
  if (access(a.input, R_OK) != 0) {
    fprintf(stderr, "mcc: cannot open '%s': %s\n", a.input, strerror(errno));
    goto out;
  }
  if (a.check && a.mdl.precision == IR_VOID) a.mdl.precision = IR_F64;   /* --check compares in f64 */
  if (a.time) cx->time_to = stderr;

  if (pipe_views(&a)) {
    StrBuf rep = {0}, tr = {0};
    rc = api_pipe_views(&a, cx, &rep, &tr);
    if (rc == 0 && a.report) rc = api_emit_text(&a, a.output, &rep);
    if (rc == 0 && a.trace) rc = api_emit_text(&a, a.trace, &tr);
    sb_free(&rep);
    sb_free(&tr);
    goto out;
  }
  if (a.auto_layout) {
    rc = run_auto_layout(&a);
    goto out;
  }
  double t0 = (ts_now_s() * 1e3), tf = 0;
  IrModule *m = api_compile_main(&a, &tf);
  if (a.time) fprintf(stderr, "time: %-12s %9.1f ms\n", "frontend", tf);
  if (!m) goto out;
  int owned = 1;
  if (a.stats) print_stats(m);
  double t2 = (ts_now_s() * 1e3);
  if (a.check) {
    rc = run_check(&a, m);
  } else if (a.report) {                 /* an analysis, no plan */
    StrBuf b = {0};
    int r = strcmp(a.report, "kernels") == 0 ? report_kernels(&a, m, &b) : api_report(&a, a.report, m, &b);
    rc = r != 0 ? 1 : api_emit_text(&a, a.output, &b);
    sb_free(&b);
  } else if (a.llvm_dir) {
    char err[1024];
    int nk = 0;
    rc = rt_emit_llvm(m, a.llvm_dir, &nk, err, sizeof err) != 0;
    if (rc) fprintf(stderr, "mcc: error: --emit=llvm: %s\n", err);
    else fprintf(stderr, "mcc: wrote %d kernels to %s\n", nk, a.llvm_dir);
  } else if (strcmp(a.emit, "ir") == 0 || strcmp(a.emit, "dot") == 0) {
    StrBuf b = {0};
    if (strcmp(a.emit, "ir") == 0) ir_print_module(m, &b);
    else ir_print_dot(m, &b);
    rc = api_emit_text(&a, a.output, &b);
    sb_free(&b);
  } else {
    rc = write_plan(&a, m, &owned);
  }
  double t3 = (ts_now_s() * 1e3);
  if (a.time) {
    fprintf(stderr, "time: %-12s %9.1f ms\n", strcmp(a.emit, "plan") == 0 ? "plan write" : "emit", t3 - t2);
    fprintf(stderr, "time: %-12s %9.1f ms\n", "total", t3 - t0);
  }
  if (owned) ir_module_free(m);
out:
  api_session_free(&a);
  return rc;
}
