/* mcc.c - the Tessera compiler driver: MDL source -> plan.
 *
 *   frontend (mdl_compile_file) -> pass pipeline (passes/pipeline.c) -> plan
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
#include "frontend/mdl.h"
#include "passes/passes.h"
#include "passes/memreport.h"
#include "passes/pipe.h"
#include "passes/timereport.h"
#include "autolayout.h"
#include "kreport.h"
#include "passes/dpreport.h"
#include "runtime/comm/comm.h"
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
          "  --rampup-batch-size S I N  Megatron's batch-size ramp-up: refused, not built (docs/cli.md)\n"
          "  --muon-adamw-lr X      the lr of muon's AdamW group (embedding, head, biases, gains): the schedule\n"
          "                         scaled by X / lr (default: the group runs at --lr); mrun takes it too\n"
          "  --muon-tp-mode M       muon on a tp-split matrix: auto (the fewer bytes), allreduce (its Gram\n"
          "                         matrix every iteration) or gather (the matrix once)\n"
          "  --help, --version\n"
          "Passes, in order: frontend");
  for (int i = 0; i < pass_pipeline_count; i++) fprintf(f, ", %s", pass_pipeline[i].name);
  fprintf(f, "\n");
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "mcc: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(run 'mcc --help' for the options)\n");
  return 2;
}

/* A parallel size: a positive int, at most 1 << 20. */
static int parse_size(const char *s, int *out) {
  char *e;
  errno = 0;
  long v = s ? strtol(s, &e, 10) : 0;
  if (!s || !*s || *e || errno || v < 1 || v > (1 << 20)) return -1;
  *out = (int)v;
  return 0;
}

typedef struct {
  const char *input, *output, *emit, *report;
  VEC(MdlDefine) defines;
  MdlOptions mdl;
  PassCtx *cx;
  int time, stats;
  int dp;                    /* --dp N; -1: the parallel block's (else 1) */
  int check, steps, gpus;    /* --check, --steps K (-1: 3), --gpus N (0: the mesh size) */
  /* pipeline (passes/pipe.h): views of the partition and schedules */
  const char *trace;         /* --emit=trace FILE */
  const char *hw;            /* --hw NAME|FILE (plan/hw.h) */
  const char *llvm_dir;      /* --emit=llvm DIR: each kernel's LLVM IR (runtime/exec/exec_jit.c) */
  const char *cuda_dir;      /* --emit=cuda DIR: each program's CUDA module (runtime/exec/dev_prog.c) */
  int sm[8], nsm;            /* --target sm_80,sm_90: NVRTC images in the plan (docs/cuda.md) */
  const char *schedule;      /* --schedule NAME; NULL: 1f1b, interleaved with vpp >= 2 */
  const char *pp_layout;     /* --pp-layout STR */
  VEC(int) pp_layers;        /* --pp-layers A,B,... */
  int vpp;                   /* --vpp V; 0: 1 or the layout's */
  int vstage_layers;         /* --num-layers-per-virtual-pipeline-stage N (Megatron): vpp = layers / (pp N) */
  VEC(MdlSetting) config_sets, train_sets;   /* Megatron's flags that set config keys / train fields */
  int recompute_given;       /* --recompute was given (else --memory-budget implies auto) */
  int keep_gathered;         /* --keep-gathered (the default; refused with --regather / --activation-budget) */
  int auto_layout;           /* --auto-layout (tools/autolayout.h) */
  int cp_attn_given;         /* --cp-attn was given (--auto-layout then keeps it) */
  unsigned long long memory; /* --memory BYTES: per GPU, for --auto-layout (0: the description's HBM) */
  /* the overlapped dp gradient reduction (plan/dpreduce.h), for --report comm and passed on to mrun by
   * --check: --dp-bucket-size BYTES (0: the default), Megatron's --ddp-bucket-size N in elements,
   * --no-overlap-grad-reduce */
  int64_t dp_bucket_bytes, dp_bucket_elems;
  int no_overlap;
} Args;

/* --report schedule or --emit=trace: the pipeline views (pp > 1 allowed). */
static int pipe_views(const Args *a) { return a->trace || (a->report && strcmp(a->report, "schedule") == 0); }

/* Returns -1 to continue, or the exit code (0 for --help/--version). */
/* A byte count: decimal digits, with suffixes K / M / G (KiB, MiB, GiB)
 * when allowed; at most INT64_MAX.  0, or -1 for anything else. */
static int parse_bytes(const char *s, int suffixes, unsigned long long *out) {
  char *e;
  errno = 0;
  if (!*s || *s < '0' || *s > '9') return -1;
  unsigned long long v = strtoull(s, &e, 10), mul = 1;
  if (suffixes && (*e == 'K' || *e == 'M' || *e == 'G')) mul = 1ull << (*e == 'K' ? 10 : *e == 'M' ? 20 : 30), e++;
  if (*e || errno || v > (unsigned long long)INT64_MAX / mul) return -1;
  *out = v * mul;
  return 0;
}

/* Megatron-LM's flags that mean what one of ours means (docs/cli.md has
 * the table).  A config flag sets the config key of that name, which the
 * samples use (a model without it is refused, naming the flag); a train
 * flag sets the train field over the train block's value. */
typedef enum { MG_SIZE, MG_SWITCH, MG_CONFIG, MG_TRAIN } MgKind;
static const struct { const char *flag; MgKind kind; const char *to; } megatron_flags[] = {
    {"--tensor-model-parallel-size", MG_SIZE, "--tp"},
    {"--pipeline-model-parallel-size", MG_SIZE, "--pp"},
    {"--context-parallel-size", MG_SIZE, "--cp"},
    {"--expert-model-parallel-size", MG_SIZE, "--ep"},
    {"--num-layers-per-virtual-pipeline-stage", MG_SIZE, "--vpp"},
    {"--sequence-parallel", MG_SWITCH, "--sp"},
    {"--use-distributed-optimizer", MG_SWITCH, "zero"},
    {"--num-layers", MG_CONFIG, "layers"},
    {"--hidden-size", MG_CONFIG, "d_model"},
    {"--ffn-hidden-size", MG_CONFIG, "ffn"},
    {"--num-attention-heads", MG_CONFIG, "heads"},
    {"--num-query-groups", MG_CONFIG, "kv_heads"},
    {"--seq-length", MG_CONFIG, "seq_len"},
    {"--micro-batch-size", MG_CONFIG, "micro_batch"},
    {"--num-experts", MG_CONFIG, "experts"},
    {"--moe-router-topk", MG_CONFIG, "topk"},
    {"--global-batch-size", MG_TRAIN, "global_batch"},
    {"--train-iters", MG_TRAIN, "steps"},
    {"--lr", MG_TRAIN, "lr"},
    {"--min-lr", MG_TRAIN, "min_lr"},
    {"--lr-warmup-iters", MG_TRAIN, "warmup"},
    {"--lr-decay-iters", MG_TRAIN, "decay_steps"},
    {"--lr-decay-style", MG_TRAIN, "schedule"},
    {"--clip-grad", MG_TRAIN, "clip_grad"},
    {"--weight-decay", MG_TRAIN, "weight_decay"},
    {"--adam-beta1", MG_TRAIN, "beta1"},
    {"--adam-beta2", MG_TRAIN, "beta2"},
    {"--adam-eps", MG_TRAIN, "eps"},
    {"--seed", MG_TRAIN, "seed"},
    /* optimizers and schedules (issue 24, deliverable 8); Megatron spells sgd's momentum --sgd-momentum */
    {"--optimizer", MG_TRAIN, "optimizer"},
    {"--sgd-momentum", MG_TRAIN, "momentum"},
    {"--momentum", MG_TRAIN, "momentum"},
    {"--nesterov", MG_SWITCH, "nesterov"},
    {"--no-nesterov", MG_SWITCH, "no-nesterov"},
    {"--muon-momentum", MG_TRAIN, "muon_momentum"},
    {"--muon-ns-steps", MG_TRAIN, "muon_ns_steps"},
    {"--muon-adamw-lr", MG_TRAIN, "muon_adamw_lr"},
    {"--muon-tp-mode", MG_TRAIN, "muon_tp"},
    {"--lr-wsd-decay-style", MG_TRAIN, "wsd_style"},
    {"--lr-wsd-decay-iters", MG_TRAIN, "wsd_decay_steps"},
};

/* argv[*i] as one of Megatron's flags ("--flag V" or "--flag=V"): -1 if it
 * is none, 0 when taken, else mcc's exit code. */
static int megatron_flag(Args *a, int argc, char **argv, int *i) {
  const char *s = argv[*i];
  size_t n = strcspn(s, "=");
  int k = 0, nf = (int)(sizeof megatron_flags / sizeof megatron_flags[0]);
  while (k < nf && (strlen(megatron_flags[k].flag) != n || strncmp(s, megatron_flags[k].flag, n))) k++;
  if (k == nf) return -1;
  const char *flag = megatron_flags[k].flag, *to = megatron_flags[k].to, *val = NULL;
  MgKind kind = megatron_flags[k].kind;
  if (kind == MG_SWITCH) {
    if (s[n]) return usage_error("option '%s' takes no value", flag);
    if (!strcmp(to, "--sp")) a->mdl.sp = 1;
    else if (!strcmp(to, "nesterov") || !strcmp(to, "no-nesterov")) {   /* train field nesterov = 1 / 0 */
      MdlSetting set = {ts_intern("nesterov"), to[0] == 'n' && to[1] == 'o' ? "0" : "1", flag};
      VEC_PUSH(a->train_sets, set);
    } else a->mdl.zero = 1;   /* the distributed optimizer: ZeRO-1, also the default */
    return 0;
  }
  if (s[n] == '=') val = s + n + 1;
  else if (*i + 1 < argc) val = argv[++*i];
  else return usage_error("option '%s' needs an argument", flag);
  if (kind == MG_SIZE) {
    int *num = !strcmp(to, "--tp") ? &a->mdl.tp : !strcmp(to, "--pp") ? &a->mdl.pp : !strcmp(to, "--cp") ? &a->mdl.cp
             : !strcmp(to, "--ep") ? &a->mdl.ep : &a->vstage_layers;
    if (parse_size(val, num) != 0) {
      fprintf(stderr, "mcc: %s expects a positive size, got '%s'\n(run 'mcc --help' for the options)\n", flag, val);
      return 2;
    }
    return 0;
  }
  MdlSetting set = {ts_intern(to), val, flag};
  __typeof__(a->config_sets) *list = kind == MG_CONFIG ? &a->config_sets : &a->train_sets;
  for (int j = 0; j < list->n; j++)
    if (list->a[j].name == set.name) {   /* the last value wins, as with -D */
      fprintf(stderr, "mcc: warning: %s is given twice; the last value (%s) replaces %s\n", flag, val, list->a[j].value);
      list->a[j] = set;
      return 0;
    }
  VEC_PUSH(*list, set);
  return 0;
}

static int parse_args(int argc, char **argv, Args *a) {
  for (int i = 1; i < argc; i++) {
    const char *s = argv[i];
    if (strncmp(s, "--rampup-batch-size", 19) == 0 && (s[19] == 0 || s[19] == '=')) {
      fprintf(stderr, "%s --rampup-batch-size (Megatron's batch-size ramp-up) is not built: the number of micro batches per step "
            "is a constant of the compiled program (autodiff bakes the loss gradient's seed 1 / (global_batch / "
            "micro_batch) into the micro block), so a step with a smaller global batch would average over the "
            "wrong count; train with a constant --global-batch-size (docs/cli.md \"LR schedules\")\n", "mcc: error:");
      return 1;
    }
    int mg = megatron_flag(a, argc, argv, &i);
    if (mg >= 0) {
      if (mg > 0) return mg;
      continue;
    }
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_ARG(opt) do { if (!next) return usage_error("option '%s' needs an argument", opt); i++; } while (0)
    if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) { usage(stdout); return 0; }
    if (strcmp(s, "--version") == 0) {
      printf("mcc (Tessera) %s, plan format %d\n", MCC_VERSION, PLAN_VERSION);
      return 0;
    }
    if (strcmp(s, "-o") == 0) { NEED_ARG(s); a->output = next; continue; }
    if (strncmp(s, "-D", 2) == 0) {
      const char *kv = s[2] ? s + 2 : next;
      if (!s[2]) NEED_ARG("-D");
      const char *eq = strchr(kv, '=');
      if (!eq || eq == kv) return usage_error("-D needs key=value, got '%s'", kv);
      MdlDefine d = {ts_intern_n(kv, (size_t)(eq - kv)), eq + 1};
      /* the last value of a key wins (as with cc -D); a warning says so */
      int dup = 0;
      for (int k = 0; k < a->defines.n && !dup; k++)   /* interned: one pointer per name */
        if (a->defines.a[k].name == d.name) {
          fprintf(stderr, "mcc: warning: -D %s is given twice; the last value (%s) replaces %s\n", d.name, d.value,
                  a->defines.a[k].value);
          a->defines.a[k].value = d.value;
          dup = 1;
        }
      if (!dup) VEC_PUSH(a->defines, d);
      continue;
    }
    if (strcmp(s, "--precision") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "f32") == 0) a->mdl.precision = IR_F32;
      else if (strcmp(next, "f64") == 0) a->mdl.precision = IR_F64;
      else if (strcmp(next, "bf16") == 0) a->mdl.precision = IR_BF16;
      else if (strcmp(next, "fp16") == 0 || strcmp(next, "f16") == 0) a->mdl.precision = IR_F16;
      else return usage_error("--precision must be f32, f64, bf16 or fp16, got '%s'", next);
      continue;
    }
    int *num = strcmp(s, "--tp") == 0 ? &a->mdl.tp : strcmp(s, "--pp") == 0 ? &a->mdl.pp
             : strcmp(s, "--cp") == 0 ? &a->mdl.cp : strcmp(s, "--ep") == 0 ? &a->mdl.ep
             : strcmp(s, "--dp") == 0 ? &a->dp : strcmp(s, "--steps") == 0 ? &a->steps
             : strcmp(s, "--gpus") == 0 ? &a->gpus : strcmp(s, "--vpp") == 0 ? &a->vpp : NULL;
    if (num) {
      NEED_ARG(s);
      if (parse_size(next, num) != 0) return usage_error("expected a positive size, got '%s'", next);
      continue;
    }
    if (strcmp(s, "--sp") == 0) { a->mdl.sp = 1; continue; }
    if (strcmp(s, "--no-overlap-grad-reduce") == 0) { a->no_overlap = 1; continue; }
    if (strcmp(s, "--overlap-grad-reduce") == 0) { a->no_overlap = 0; continue; }   /* Megatron's; the default */
    if (strcmp(s, "--dp-bucket-size") == 0 || strcmp(s, "--ddp-bucket-size") == 0) {
      NEED_ARG(s);
      unsigned long long v;
      int elems = s[2] == 'd' && s[3] == 'd';
      if (parse_bytes(next, !elems, &v) != 0 || v < 1 || v > (1ull << 47))
        return usage_error(elems ? "--ddp-bucket-size expects a positive element count up to 2^47, got '%s'"
                                 : "--dp-bucket-size expects a positive byte count (K, M, G suffixes) up to 2^47, got '%s'",
                           next);
      if (elems) a->dp_bucket_elems = (int64_t)v, a->dp_bucket_bytes = 0;
      else a->dp_bucket_bytes = (int64_t)v, a->dp_bucket_elems = 0;
      continue;
    }
    if (strcmp(s, "--no-zero") == 0) { a->mdl.zero = 0; continue; }
    if (strcmp(s, "--zero") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "2") == 0)
        return usage_error("--zero %s is not built: --zero 1 (the default) already reduce-scatters the gradients "
                           "once per step and shards the optimizer state; --zero 3 also shards the parameters and "
                           "the gradient accumulators (docs/sharding.md)", next);
      if (strcmp(next, "0") && strcmp(next, "1") && strcmp(next, "3"))
        return usage_error("--zero expects 0 (no distributed optimizer), 1 (ZeRO-1, the default) or 3 (ZeRO-3 / "
                           "FSDP), got '%s'", next);
      a->mdl.zero = next[0] - '0';
      continue;
    }
    if (strcmp(s, "--no-fuse") == 0) { a->cx->no_fuse = 1; continue; }
    if (strcmp(s, "--no-remat") == 0) { a->cx->no_remat = 1; continue; }
    if (strcmp(s, "--decode") == 0) { a->cx->decode = 1; continue; }
    if (!strcmp(s, "--loss-scale") || !strcmp(s, "--initial-loss-scale") || !strcmp(s, "--min-loss-scale") ||
        !strcmp(s, "--loss-scale-window") || !strcmp(s, "--hysteresis")) {
      NEED_ARG(s);
      char *end;
      double v = strtod(next, &end);
      int whole = !strcmp(s, "--loss-scale-window") || !strcmp(s, "--hysteresis");
      if (*end || !(v > 0) || !isfinite(v) || (whole && (v != floor(v) || v > 1e15)))
        return usage_error(whole ? "--loss-scale-window / --hysteresis expect a positive whole number, got '%s'"
                                 : "--loss-scale / --initial-loss-scale / --min-loss-scale expect a positive number, got '%s'",
                           next);
      if (!strcmp(s, "--loss-scale")) a->cx->loss_scale = v;
      else if (!strcmp(s, "--initial-loss-scale")) a->cx->initial_loss_scale = v;
      else if (!strcmp(s, "--min-loss-scale")) a->cx->min_loss_scale = v;
      else if (!strcmp(s, "--loss-scale-window")) a->cx->loss_scale_window = (int64_t)v;
      else a->cx->hysteresis = (int64_t)v;
      a->cx->loss_scale_flag = s;
      continue;
    }
    if (strcmp(s, "--precision-policy") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "help") == 0) {
        StrBuf b = {0};
        pass_precision_classes(&b);
        printf("op classes of pass precision (storage under --precision bf16; arithmetic is always f32):\n%s", b.p);
        free(b.p);
        exit(0);
      }
      a->cx->precision_policy = next;
      continue;
    }
    if (strcmp(s, "--max-source-bytes") == 0) {
      NEED_ARG(s);
      unsigned long long v;
      if (parse_bytes(next, 0, &v) != 0 || v < 1)
        return usage_error("--max-source-bytes expects a positive byte count, got '%s'", next);
      a->mdl.max_source_bytes = (size_t)v;
      continue;
    }
    if (strcmp(s, "--keep-gathered") == 0) { a->keep_gathered = 1; continue; }
    if (strcmp(s, "--regather") == 0) { a->cx->regather = 1; continue; }
    if (strcmp(s, "--activation-budget") == 0) {
      NEED_ARG(s);
      unsigned long long v;
      if (parse_bytes(next, 1, &v) != 0)
        return usage_error("--activation-budget expects a byte count (suffix K, M or G for KiB, MiB, GiB), got '%s'",
                           next);
      a->cx->activation_budget = (int64_t)v;
      continue;
    }
    if (strcmp(s, "--recompute") == 0) {
      NEED_ARG(s);
      int mode = pass_recompute_lookup(next);
      if (mode < 0) return usage_error("--recompute must be none, full, selective or auto, got '%s'", next);
      a->cx->recompute = mode;
      a->recompute_given = 1;
      continue;
    }
    if (strcmp(s, "--memory-budget") == 0) {
      NEED_ARG(s);
      unsigned long long v;
      if (parse_bytes(next, 1, &v) != 0 || v < 1)
        return usage_error("--memory-budget expects a positive byte count (suffix K, M or G for KiB, MiB, GiB), "
                           "got '%s'", next);
      a->cx->memory_budget = (int64_t)v;
      continue;
    }
    if (strcmp(s, "--cp-attn") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "ring") && strcmp(next, "allgather") && strcmp(next, "a2a"))
        return usage_error("--cp-attn must be ring, allgather or a2a, got '%s'", next);
      a->cx->cp_attn = !strcmp(next, "allgather") ? PASS_CP_ATTN_ALLGATHER
                     : !strcmp(next, "a2a")       ? PASS_CP_ATTN_A2A
                                                  : PASS_CP_ATTN_RING;
      a->cp_attn_given = 1;
      continue;
    }
    if (strcmp(s, "--emit=llvm") == 0) { NEED_ARG(s); a->llvm_dir = next; continue; }
    if (strcmp(s, "--emit=cuda") == 0) { NEED_ARG(s); a->cuda_dir = next; continue; }
    if (strcmp(s, "--target") == 0) {
      NEED_ARG(s);
      for (const char *q = next; *q;) {
        size_t n = strcspn(q, ",");
        char one[16];
        snprintf(one, sizeof one, "%.*s", (int)(n < sizeof one ? n : sizeof one - 1), q);
        int sm = n < sizeof one ? cg_cuda_arch_number(one) : 0, dup = 0;
        if (!sm)
          return usage_error("--target takes GPU archs sm_XX, comma separated (sm_80 for A100, sm_90 for H100 / H200, "
                             "sm_100 for B200, ...), got '%s'", next);
        for (int t = 0; t < a->nsm; t++) dup |= a->sm[t] == sm;
        if (!dup && a->nsm == (int)(sizeof a->sm / sizeof a->sm[0]))
          return usage_error("--target: at most 8 archs, got '%s'", next);
        if (!dup) a->sm[a->nsm++] = sm;
        q += n + (q[n] == ',');
      }
      continue;
    }
    if (strcmp(s, "--check") == 0) { a->check = 1; continue; }
    if (strcmp(s, "--stdlib") == 0) { NEED_ARG(s); a->mdl.stdlib_dir = next; continue; }
    if (strcmp(s, "--emit=trace") == 0) { NEED_ARG(s); a->trace = next; continue; }
    if (strcmp(s, "--hw") == 0) { NEED_ARG(s); a->hw = next; continue; }
    if (strcmp(s, "--schedule") == 0) {
      NEED_ARG(s);
      if (plan_pipe_sched_lookup(next) < 0)
        return usage_error("--schedule must be gpipe, 1f1b, interleaved or zb-h1, got '%s'", next);
      a->schedule = next;
      continue;
    }
    if (strcmp(s, "--pp-layout") == 0) { NEED_ARG(s); a->pp_layout = next; continue; }
    if (strcmp(s, "--pp-layers") == 0) {
      NEED_ARG(s);
      a->pp_layers.n = 0;
      for (const char *c = next;;) {
        char *e;
        errno = 0;
        long v = strtol(c, &e, 10);
        if (e == c || errno || v < 0 || v > 100000 || (*e && *e != ','))
          return usage_error("--pp-layers needs layer counts separated by commas (e.g. 3,3,3,3), got '%s'", next);
        VEC_PUSH(a->pp_layers, (int)v);
        if (!*e) break;
        c = e + 1;
      }
      continue;
    }
    if (strncmp(s, "--emit=", 7) == 0) {
      a->emit = s + 7;
      if (strcmp(a->emit, "plan") && strcmp(a->emit, "plan-text") && strcmp(a->emit, "ir") && strcmp(a->emit, "dot"))
        return usage_error("--emit must be plan, plan-text, ir or dot (or --emit=trace FILE), got '%s'", a->emit);
      continue;
    }
    if (strncmp(s, "--dump-ir=", 10) == 0) {
      const char *which = s + 10;
      NEED_ARG("--dump-ir=all");
      a->cx->dump_dir = next;
      a->cx->dump_pass = strcmp(which, "all") == 0 ? NULL : which;
      continue;
    }
    if (strncmp(s, "--print-ir-after=", 17) == 0) { a->cx->print_after = s + 17; continue; }
    if (strcmp(s, "--verify-each") == 0) { a->cx->verify_each = 1; continue; }
    if (strcmp(s, "--no-verify") == 0) { a->cx->verify_each = 0; continue; }
    if (strcmp(s, "--verify-roundtrip") == 0) { a->cx->verify_roundtrip = 1; continue; }
    if (strcmp(s, "--time") == 0) { a->time = 1; continue; }
    if (strcmp(s, "--stats") == 0) { a->stats = 1; continue; }
    if (strcmp(s, "--report") == 0) {
      NEED_ARG(s);
      if (strcmp(next, "memory") != 0 && strcmp(next, "comm") != 0 && strcmp(next, "schedule") != 0 &&
          strcmp(next, "sharding") != 0 && strcmp(next, "time") != 0 && strcmp(next, "kernels") != 0)
        return usage_error("--report must be memory, comm, sharding, schedule, time or kernels, got '%s'", next);
      a->report = next;
      continue;
    }
    if (strcmp(s, "--explain-sharding") == 0) { a->report = "sharding"; continue; }
    if (strcmp(s, "--auto-layout") == 0) { a->auto_layout = 1; continue; }
    if (strcmp(s, "--memory") == 0) {
      NEED_ARG(s);
      if (parse_bytes(next, 1, &a->memory) != 0 || a->memory == 0)
        return usage_error("--memory needs a byte count per GPU (suffix K, M or G), got '%s'", next);
      continue;
    }
    if (s[0] == '-' && s[1]) return usage_error("unknown option '%s'", s);
    if (a->input) return usage_error("more than one input file ('%s')", s);
    a->input = s;
#undef NEED_ARG
  }
  if (!a->input) return usage_error("%s", "no input file");
  if (a->check && a->report) return usage_error("%s", "--check and --report do not go together");
  if (a->keep_gathered + a->cx->regather + (a->cx->activation_budget >= 0) > 1)
    return usage_error("%s", "--keep-gathered, --regather and --activation-budget each decide what is kept for the "
                             "backward: give one of them");
  if (a->cx->memory_budget >= 0 && !a->recompute_given) a->cx->recompute = PASS_RECOMPUTE_AUTO;
  if (a->cx->memory_budget >= 0 && a->cx->recompute != PASS_RECOMPUTE_AUTO)
    return usage_error("--memory-budget goes with --recompute auto (the compiler chooses what to recompute to fit "
                       "it), not with --recompute %s", pass_recompute_name(a->cx->recompute));
  if (a->cx->recompute == PASS_RECOMPUTE_AUTO && a->cx->memory_budget < 0)
    return usage_error("%s", "--recompute auto needs --memory-budget BYTES: the most bytes a micro batch may hold "
                             "for its backward, per rank");
  if (a->cx->memory_budget >= 0 && a->cx->activation_budget >= 0)
    return usage_error("%s", "--memory-budget and --activation-budget both bound the bytes held for the backward "
                             "(--memory-budget also decides the gathered copies): give one of them");
  if (a->cx->recompute != PASS_RECOMPUTE_NONE && a->cx->no_remat)
    return usage_error("--no-remat turns pass remat off, and --recompute %s is pass remat's: give one of them",
                       pass_recompute_name(a->cx->recompute));
  /* the partition pass reads the overrides from the pass context */
  a->cx->pp_layers = a->pp_layers.n ? a->pp_layers.a : NULL;
  a->cx->pp_nlayers = a->pp_layers.n;
  a->cx->pp_layout = a->pp_layout;
  if (a->check && pipe_views(a)) return usage_error("%s", "--check and the pipeline views do not go together");
  int time_report = a->report && strcmp(a->report, "time") == 0;
  if (a->memory && !a->auto_layout) return usage_error("%s", "--memory goes with --auto-layout (the memory of one GPU)");
  if (a->auto_layout) {
    if (a->gpus <= 0 || !a->hw)
      return usage_error("%s", "--auto-layout needs --gpus N and --hw NAME|FILE (a100-80gb, h100-sxm, h200, b200)");
    if (a->check || a->report || pipe_views(a) || strcmp(a->emit, "plan"))
      return usage_error("%s", "--auto-layout prints its table and writes the chosen plan with -o: it does not go "
                               "with --check, --report or another --emit");
    const char *given = a->mdl.tp >= 0 ? "--tp" : a->mdl.pp >= 0 ? "--pp" : a->mdl.cp >= 0 ? "--cp"
                        : a->mdl.ep >= 0 ? "--ep" : a->mdl.sp >= 0 ? "--sp" : a->dp >= 0 ? "--dp"
                        : a->vpp > 0 || a->vstage_layers > 0 ? "--vpp" : a->schedule ? "--schedule"
                        : a->pp_layers.n || a->pp_layout ? "--pp-layers / --pp-layout"
                        : a->recompute_given || a->cx->memory_budget >= 0 ? "--recompute / --memory-budget" : NULL;
    if (given)
      return usage_error("--auto-layout chooses the layout itself (tp, sp, cp, ep, pp, vpp, schedule, dp, micro "
                         "batch, recompute), and %s fixes part of it: leave it out", given);
    return -1;
  }
  if (!a->check && (a->steps > 0 || (a->gpus > 0 && !time_report)))
    return usage_error("%s", "--steps and --gpus go with --check (mrun takes them for training); --gpus also with --report time");
  if (time_report && !a->hw)
    return usage_error("%s", "--report time needs --hw NAME|FILE (a100-80gb, h100-sxm, h200, b200, or a file: hw/README.md)");
  int comm_report = a->report && strcmp(a->report, "comm") == 0;
  int kernels_report = a->report && strcmp(a->report, "kernels") == 0;
  if (a->hw && !time_report && !a->trace && !comm_report && !kernels_report)
    return usage_error("%s", "--hw goes with --report time, --report comm, --report kernels or --emit=trace");
  if (kernels_report && a->nsm > 1)
    return usage_error("%s", "--report kernels takes one --target arch (its ptxas report gives the registers)");
  if (time_report && a->trace) return usage_error("%s", "--report time and --emit=trace: give one of them per run");
  /* Pass names are checked before the (possibly long) frontend runs. */
  char err[512];
  if (a->cx->print_after && pass_check_name(a->cx->print_after, "--print-ir-after", err, sizeof err) != 0)
    return usage_error("%s", err);
  if (a->cx->dump_pass && pass_check_name(a->cx->dump_pass, "--dump-ir", err, sizeof err) != 0)
    return usage_error("%s", err);
  return -1;
}

/* "tp=2 dp=2 sp": the layout of m, the sizes > 1 only ("1 rank" if none). */
static const char *layout_str(const IrModule *m, char *buf, size_t n) {
  static const IrAxis order[] = {IR_AXIS_TP, IR_AXIS_DP, IR_AXIS_PP, IR_AXIS_CP, IR_AXIS_EP};
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < 5; i++)
    if (ir_axis_size(m, order[i]) > 1 && k < n)
      k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", k ? " " : "", ir_axis_name(order[i]), ir_axis_size(m, order[i]));
  if (ir_axis_size(m, IR_AXIS_PP) > 1 && m->par.vpp > 1 && k < n)   /* the pipeline's shape */
    k += (size_t)snprintf(buf + k, n - k, " vpp=%d", m->par.vpp);
  if (ir_axis_size(m, IR_AXIS_PP) > 1 && m->par.sched > 0 && k < n)
    k += (size_t)snprintf(buf + k, n - k, " %s", ir_pipe_sched_name((IrPipeSched)m->par.sched));
  if (m->par.sp && k < n) k += (size_t)snprintf(buf + k, n - k, "%ssp", k ? " " : "");
  if (ir_axis_size(m, IR_AXIS_DP) > 1 && !m->par.zero && k < n) k += (size_t)snprintf(buf + k, n - k, " no-zero");
  if (ir_axis_size(m, IR_AXIS_DP) > 1 && m->par.zero == 3 && k < n) snprintf(buf + k, n - k, " zero3");
  if (!buf[0]) snprintf(buf, n, "unsharded");
  return buf;
}

/* Ranks of m's mesh: the product of its axis sizes. */
static int64_t mesh_ranks(const IrModule *m) {
  int64_t n = 1;
  for (int ax = 0; ax < IR_AXIS_COUNT; ax++) n *= ir_axis_size(m, (IrAxis)ax);
  return n;
}

#define MCC_MAX_RANKS (1 << 20)

/* What this compiler can lay out, checked on the frontend's module (the
 * parallel block and the options are merged there).  0, or 1 after
 * printing "mcc: error: ...". */
static int check_layout(const IrModule *m) {
  /* context parallelism (cp) works in its all-gather form, expert
   * parallelism (ep) for dense expert layers (docs/sharding.md), pipeline
   * parallelism (pp) as per-rank programs (docs/pipeline.md) */
  if (m->par.sp && ir_axis_size(m, IR_AXIS_TP) < 2) {
    fprintf(stderr, "mcc: error: sequence parallelism (--sp or sp = true) needs tensor parallelism: it splits "
                    "the sequence over the tp ranks, and tp=%d; add --tp N with N > 1\n", ir_axis_size(m, IR_AXIS_TP));
    return 1;
  }
  if (mesh_ranks(m) > MCC_MAX_RANKS) {
    fprintf(stderr, "mcc: error: the mesh has %lld ranks (more than %d)\n", (long long)mesh_ranks(m), MCC_MAX_RANKS);
    return 1;
  }
  /* each dp rank runs a whole number of the step's micro batches */
  int dp = ir_axis_size(m, IR_AXIS_DP);
  int64_t nmicro = m->train.micro_batch > 0 ? m->train.global_batch / m->train.micro_batch : 0;
  if (dp > 1 && nmicro % dp != 0) {
    fprintf(stderr, "mcc: error: dp=%d does not divide the %lld micro batches of a step (global_batch %lld / "
                    "micro_batch %lld): each dp rank must run the same number of them\n",
            dp, (long long)nmicro, (long long)m->train.global_batch, (long long)m->train.micro_batch);
    return 1;
  }
  return 0;
}

/* The pipeline options as the partition takes them; Megatron's
 * --num-layers-per-virtual-pipeline-stage N is vpp = layers / (pp * N).
 * 0, or -1 after printing why. */
static int pipe_options(const Args *a, const IrModule *m, PipeOptions *po) {
  *po = (PipeOptions){ir_axis_size(m, IR_AXIS_PP), a->vpp, a->pp_layers.n ? a->pp_layers.a : NULL, a->pp_layers.n,
                      a->pp_layout};
  if (a->vstage_layers <= 0) return 0;
  PipeOptions one = {po->pp, 1, NULL, 0, NULL};
  PipePartition part;
  char err[2048];
  if (pass_pipe_partition(m, &one, &part, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    return -1;
  }
  int L = part.nlayers, n = a->vstage_layers, pp = po->pp;
  pass_pipe_partition_free(&part);
  if (L % ((long long)pp * n) != 0) {
    fprintf(stderr, "mcc: error: --num-layers-per-virtual-pipeline-stage %d: the model's %d layers over pp=%d stages "
                    "do not make whole chunks of %d layers (%d must be a multiple of %d x %d); values that work:",
            n, L, pp, n, L, pp, n);
    for (int k = 1; k <= L / pp; k++)
      if (L % (pp * k) == 0) fprintf(stderr, " %d", k);
    fprintf(stderr, "\n");
    return -1;
  }
  int vpp = L / (pp * n);
  if (a->vpp > 0 && a->vpp != vpp) {
    fprintf(stderr, "mcc: error: --num-layers-per-virtual-pipeline-stage %d makes vpp %d (%d layers / (pp %d x %d)), "
                    "and --vpp says %d; give one of them\n", n, vpp, L, pp, n, a->vpp);
    return -1;
  }
  po->vpp = vpp;
  return 0;
}

/* The schedule mcc builds for vpp chunks per rank: --schedule, else 1f1b,
 * interleaved when vpp >= 2. */
static PipeSchedKind pipe_kind(const Args *a, int vpp) {
  if (a->schedule) return (PipeSchedKind)plan_pipe_sched_lookup(a->schedule);
  return vpp > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
}

static IrPipeSched ir_sched_of(PipeSchedKind k) {
  return (IrPipeSched)(k + 1);   /* IrPipeSched lists the kinds in the same order, after "none" */
}

/* pp > 1, before the passes: partitions the model once to learn vpp (a
 * --pp-layout implies it), records vpp and the schedule in m->par (the
 * trainer regenerates the schedule from them), then builds every rank's
 * schedule for this step's micro batches and proves it deadlock-free, so a
 * bad --schedule / --vpp / batch combination is a compile error and never
 * a hang.  With pp = 1 the pipeline options are refused (they would do
 * nothing), except in the unsharded reference of --check / --report
 * memory (`reference`), which ignores them.  0, or 1 after printing why. */
static int pipe_prepare(const Args *a, IrModule *m, int reference) {
  int pp = ir_axis_size(m, IR_AXIS_PP);
  if (pp < 2) {
    if (!reference && (a->vpp > 0 || a->vstage_layers > 0 || a->schedule || a->pp_layout || a->pp_layers.n)) {
      fprintf(stderr, "mcc: error: --vpp, --schedule, --pp-layers, --pp-layout and "
                      "--num-layers-per-virtual-pipeline-stage shape a pipeline, and pp=1; add --pp N with N > 1\n");
      return 1;
    }
    return 0;
  }
  char err[2048];
  PipeOptions po;
  if (pipe_options(a, m, &po) != 0) return 1;
  PipePartition part;
  if (pass_pipe_partition(m, &po, &part, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    return 1;
  }
  int vpp = part.vpp;
  pass_pipe_partition_free(&part);
  PipeSchedKind kind = pipe_kind(a, vpp);
  m->par.vpp = vpp;
  m->par.sched = ir_sched_of(kind);
  PipeSchedule sched;
  memset(&sched, 0, sizeof sched);
  int nmicro = 0, rc = 0;
  if (plan_pipe_nmicro(&m->train, ir_axis_size(m, IR_AXIS_DP), &nmicro, err, sizeof err) != 0 ||
      plan_pipe_schedule(kind, pp, vpp, nmicro, &sched, err, sizeof err) != 0 ||
      plan_pipe_check(&sched, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    rc = 1;
  }
  plan_pipe_schedule_free(&sched);
  return rc;
}

/* Frontend + layout checks + passes with options `o` and data-parallel
 * size dp (-1: the parallel block's); `o` is the user's options, or those
 * of the unsharded reference (another MdlOptions).  Returns the compiled module, or
 * NULL after printing why.  *t_front gets the frontend's wall time. */
static IrModule *compile(const Args *a, const MdlOptions *o, int dp, PassCtx *cx, double *t_front) {
  double t0 = (ts_now_s() * 1e3);
  IrModule *m = mdl_compile_file(a->input, o);
  if (t_front) *t_front = (ts_now_s() * 1e3) - t0;
  if (!m) return NULL;                   /* the frontend printed the diagnostics */
  if (dp > 0) m->par.dp = dp;
  if (check_layout(m) != 0 || pipe_prepare(a, m, o != &a->mdl) != 0) { ir_module_free(m); return NULL; }
  if (pass_run_pipeline(m, cx) != 0) {
    /* a pass's refusal (heads not divisible by tp, ...) is the user's
     * error; "internal error: ..." is ours and says so itself */
    int internal = strncmp(cx->err, "internal error", 14) == 0;
    fprintf(stderr, "mcc: %s%s\n", internal ? "" : "error: ", cx->err);
    ir_module_free(m);
    return NULL;
  }
  return m;
}

/* The plan of compiled module m: the mesh of its parallel sizes; every
 * rank on program 0 (SPMD), or with pp > 1 one program per pipeline rank
 * (passes/pipeline_rank.c), each rank on the program of its pp coordinate.
 * The plan takes m (freed here when it is split).  NULL after printing why. */
static Plan *make_plan(const char *source, IrModule *m) {
  Plan *p = plan_new();
  p->source = ts_intern(source);
  p->mesh = (PlanMesh){ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_PP), ir_axis_size(m, IR_AXIS_CP),
                     ir_axis_size(m, IR_AXIS_EP), ir_axis_size(m, IR_AXIS_TP)};
  p->nranks = (int)mesh_ranks(m);
  p->rank_program = ts_xcalloc((size_t)p->nranks, sizeof *p->rank_program);
  int pp = p->mesh.pp;
  if (pp < 2) {
    p->nprograms = 1;
    p->programs = ts_xmalloc(sizeof *p->programs);
    p->programs[0] = m;
    return p;
  }
  p->programs = ts_xcalloc((size_t)pp, sizeof *p->programs);
  char err[2048];
  for (int r = 0; r < pp; r++) {
    p->programs[r] = pass_pipeline_rank_module(m, r, err, sizeof err);
    if (!p->programs[r]) {
      fprintf(stderr, "mcc: %s\n", err);
      ir_module_free(m);
      plan_free(p);              /* frees the programs made so far */
      return NULL;
    }
    p->nprograms = r + 1;
  }
  for (int k = 0; k < p->nranks; k++) {
    int c[RT_AXIS_COUNT];
    rt_mesh_coords(&p->mesh, k, c);
    p->rank_program[k] = c[RT_AXIS_PP];
  }
  ir_module_free(m);
  return p;
}

/* FILE.mdl -> FILE.plan (any other name: FILE.plan appended). */
static char *default_output(const char *in) {
  size_t n = strlen(in);
  const char *slash = strrchr(in, '/');
  const char *dot = strrchr(in, '.');
  if (dot && (!slash || dot > slash) && dot != in && dot[-1] != '/') n = (size_t)(dot - in);
  char *out = ts_xmalloc(n + 6);
  memcpy(out, in, n);
  memcpy(out + n, ".plan", 6);
  return out;
}

static void print_stats(const IrModule *m) {
  int64_t params = 0, nodes = 0;
  int nparams = 0;
  for (int i = 0; i < m->states.n; i++)
    if (m->states.a[i].kind == IR_STATE_PARAM) { params += ir_type_numel(&m->states.a[i].type); nparams++; }
  for (int b = 0; b < m->blocks.n; b++) nodes += m->blocks.a[b].n;
  fprintf(stderr, "stats: %lld parameters in %d tensors, %d states, %d blocks, %lld IR nodes\n",
          (long long)params, nparams, m->states.n, m->blocks.n, (long long)nodes);
}

/* Writes text (or bytes) to -o, or to stdout when there is none or it is "-". */
static int emit_text(const char *out, const StrBuf *b) {
  if (ts_write_file(out ? out : "-", b->p ? b->p : "", b->n) != 0) {
    fprintf(stderr, "mcc: error: %s\n", ts_io_error());
    return 1;
  }
  return 0;
}

/* The plan must print, parse and encode back to the same bytes. */
static int check_plan_roundtrip(const Plan *p) {
  StrBuf bin = {0}, text = {0}, bin2 = {0}, bin3 = {0};
  char err[1024];
  int rc = 1;
  plan_encode(p, &bin);
  plan_print_text(p, &text);
  Plan *q = plan_parse_text(text.p, "<plan text>", err, sizeof err);
  Plan *r = q ? plan_decode(bin.p, bin.n, err, sizeof err) : NULL;
  if (!q || !r) {
    fprintf(stderr, "mcc: internal error: the plan does not read back: %s\n", err);
  } else {
    plan_encode(q, &bin2);
    plan_encode(r, &bin3);
    if (bin2.n != bin.n || memcmp(bin2.p, bin.p, bin.n) != 0)
      fprintf(stderr, "mcc: internal error: the plan text does not parse back to the same plan\n");
    else if (bin3.n != bin.n || memcmp(bin3.p, bin.p, bin.n) != 0)
      fprintf(stderr, "mcc: internal error: the binary plan does not decode to the same plan\n");
    else
      rc = 0;
  }
  plan_free(q);
  plan_free(r);
  sb_free(&bin); sb_free(&text); sb_free(&bin2); sb_free(&bin3);
  return rc;
}

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
                pi, arch, cm.nkern, o.ptx_len, o.cubin_len, regs, spills);
      }
      cg_nvrtc_out_free(&o);
    }
    if (rc == 0 && dir) fprintf(stderr, "mcc: wrote program %d's CUDA module (%d kernels) to %s\n", pi, cm.nkern, dir);
    rt_cuda_module_free(&cm);
    if (rc) return 1;
  }
  return 0;
}

static int write_plan(const Args *a, IrModule *m, int *owned) {
  Plan *p = make_plan(a->input, m);
  *owned = 0;                         /* the plan owns the module now */
  if (!p) return 1;
  int rc = 0;
  if (a->nsm || a->cuda_dir) rc = compile_cuda(a, p, a->cuda_dir);
  if (a->cuda_dir) {   /* the sources instead of a plan */
    plan_free(p);
    return rc;
  }
  if (rc == 0 && a->cx->verify_roundtrip) rc = check_plan_roundtrip(p);
  if (rc == 0 && strcmp(a->emit, "plan-text") == 0) {
    StrBuf b = {0};
    plan_print_text(p, &b);
    rc = emit_text(a->output, &b);
    sb_free(&b);
  } else if (rc == 0 && a->output && strcmp(a->output, "-") == 0) {   /* binary to stdout (a pipe) */
    StrBuf b = {0};
    plan_encode(p, &b);
    rc = emit_text(NULL, &b);
    sb_free(&b);
  } else if (rc == 0) {
    char err[1024];
    char *def = a->output ? NULL : default_output(a->input);
    if (plan_write(p, a->output ? a->output : def, err, sizeof err) != 0) {
      fprintf(stderr, "mcc: error: %s\n", err);
      rc = 1;
    }
    free(def);
  }
  plan_free(p);
  return rc;
}

/* A second compilation of the same model (the unsharded reference of
 * --report memory and --check): options `o`, no dumps or prints. */
static IrModule *compile_quiet(const Args *a, const MdlOptions *o, int dp) {
  PassCtx cx;
  pass_ctx_init(&cx);
  cx.verify_each = a->cx->verify_each;
  cx.no_fuse = a->cx->no_fuse;
  cx.no_remat = a->cx->no_remat;
  cx.precision_policy = a->cx->precision_policy;
  cx.loss_scale = a->cx->loss_scale;
  cx.initial_loss_scale = a->cx->initial_loss_scale;
  cx.min_loss_scale = a->cx->min_loss_scale;
  cx.loss_scale_window = a->cx->loss_scale_window;
  cx.hysteresis = a->cx->hysteresis;
  cx.loss_scale_flag = a->cx->loss_scale_flag;
  cx.regather = a->cx->regather;
  cx.activation_budget = a->cx->activation_budget;
  /* auto's budget is per rank of the layout: the one-rank comparison
   * recomputes the cheap values only (the numbers are the same either way) */
  if (a->cx->recompute != PASS_RECOMPUTE_AUTO) cx.recompute = a->cx->recompute;
  cx.cp_attn = a->cx->cp_attn;
  IrModule *m = compile(a, o, dp, &cx, NULL);
  pass_ctx_free(&cx);
  return m;
}

/* The options of the unsharded run of the same model: one rank. */
static MdlOptions unsharded_options(const MdlOptions *o) {
  MdlOptions u = *o;
  u.tp = u.pp = u.cp = u.ep = 1;
  u.sp = 0;
  return u;
}

/* The LLVM backend's kernel positions, as mrun's executor will find them
 * (the memory report plans what it runs). */
static int llvm_positions(void *ctx, const IrModule *m, int block, int *at, char *err, size_t errlen) {
  (void)ctx;
  RtExecOpts o = {.backend = RT_BACKEND_LLVM};
  return rt_exec_positions(m, &o, block, at, err, errlen);
}

/* --report memory: per group of ranks, then the unsharded model's rows. */
static int report_memory(const Args *a, IrModule *m, StrBuf *out) {
  int64_t n = mesh_ranks(m);
  IrModule *u = NULL;
  if (n > 1 || m->par.sp) {
    MdlOptions uo = unsharded_options(&a->mdl);
    Args ua = *a;   /* one rank has no pipeline for --schedule, --vpp, ... to shape */
    ua.schedule = ua.pp_layout = NULL;
    ua.vpp = 0;
    ua.pp_layers.n = 0;
    if (!(u = compile_quiet(&ua, &uo, 1))) return 1;
  }
  /* the plan's programs: SPMD (all on program 0), or one per pipeline rank */
  Plan *p = make_plan(a->input, ir_module_clone(m));
  if (!p) { ir_module_free(u); return 1; }
  char err[1024];
  int rc = pass_memplan_report_ranks_at(p->programs, p->nprograms, p->rank_program, p->nranks, u, llvm_positions, NULL,
                                        out, err, sizeof err);
  if (rc == 0)
    rc = pass_memplan_report_recompute(p->programs[p->rank_program[0]], a->cx->recompute, a->cx->recompute_summary,
                                       llvm_positions, NULL, out, err, sizeof err);
  if (rc != 0) fprintf(stderr, "mcc: %s\n", err);
  else pass_optimizer_report(m, out);
  plan_free(p);
  ir_module_free(u);
  return rc != 0;
}

/* ---- --report comm ----
 * What one rank communicates per training step, from the compiled program:
 * every collective node over an axis of size n > 1, counted once per run
 * of its block (the micro block, and with pipeline parallelism every
 * fwd.<g> / bwd.<g> block, runs global_batch / (micro_batch * dp) times
 * per rank per step, the update block once).  Payload = the whole tensor
 * the collective works on (all_reduce: its operand; all_gather: its
 * result; reduce_scatter: its operand); "ring" = what a rank sends with a
 * ring algorithm: 2(n-1)/n x payload for all_reduce, (n-1)/n x payload for
 * all_gather and reduce_scatter.  Pipeline point-to-point traffic: a send
 * sends its payload once; a group_sum over k pipeline ranks sends its
 * operand to the k-1 others.  With pp > 1 there is one section per
 * pipeline rank (its program). */
typedef struct {
  int64_t count;
  double payload, ring;
  double a2av_ring, a2av_uniform;   /* all_to_all_v: in `ring` at the worst routing; at uniform routing */
} CommSum;

enum { COMM_AR, COMM_AG, COMM_RS, COMM_GS, COMM_SEND, COMM_A2A, COMM_A2AV, COMM_KINDS };
static int comm_kind(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: return COMM_AR;
  case IR_OP_ALL_GATHER: return COMM_AG;
  case IR_OP_REDUCE_SCATTER: return COMM_RS;
  case IR_OP_GROUP_SUM: return COMM_GS;
  case IR_OP_SEND: return COMM_SEND;
  case IR_OP_ALL_TO_ALL: return COMM_A2A;
  case IR_OP_ALL_TO_ALL_V: return COMM_A2AV;
  case IR_OP_RING_SHIFT: return COMM_SEND;
  default: return -1;
  }
}

/* Runs of block b per step per rank.  The evaluation blocks ("eval",
 * eval.<g>: pass eval) run only when mrun validates, not in a training
 * step: 0. */
static int64_t block_runs(const IrBlock *b, int64_t nmicro) {
  IrChunkKind kind;
  int g = ir_block_chunk_kind(b, &kind);
  if (strcmp(b->name, "eval") == 0 || (g >= 0 && kind == IR_CHUNK_EVAL)) return 0;
  return strcmp(b->name, "micro") == 0 || g >= 0 ? nmicro : 1;
}

/* Node i of b as communication: its kind, axis, payload and ring bytes per
 * run; 0 if it moves nothing (not communication, or an axis of size 1). */
static int comm_node(const IrModule *m, const IrBlock *b, int i, int *kind, int *axis, double *payload, double *ring) {
  const IrNode *nd = &b->nodes[i];
  int k = comm_kind(nd->op);
  if (k < 0) return 0;
  int ax = (int)nd->ia[0];
  int n = ax >= 0 && ax < IR_AXIS_COUNT ? ir_axis_size(m, (IrAxis)ax) : 1;
  if (n < 2) return 0;
  /* all_to_all_v: the larger of its two buffers, the worst routing (its
   * traffic follows the routing; the static plan bounds it) */
  const IrType *t = nd->op == IR_OP_ALL_GATHER ? &nd->type : &b->nodes[nd->in[0]].type;
  if (nd->op == IR_OP_ALL_TO_ALL_V && ir_type_numel(&nd->type) > ir_type_numel(t)) t = &nd->type;
  double bytes = (double)ir_type_numel(t) * (double)ir_dtype_size(t->dtype);
  *ring = k == COMM_AR ? 2.0 * (n - 1) / n * bytes
        : k == COMM_GS ? (double)(__builtin_popcountll((unsigned long long)nd->ia[1]) - 1) * bytes
        : k == COMM_SEND ? bytes : (double)(n - 1) / n * bytes;
  *payload = bytes;
  *kind = k;
  *axis = ax;
  return 1;
}

/* all_to_all_v at uniform routing: each of this rank's own routed rows
 * (the smaller buffer) goes to each rank alike, (n-1)/n of them elsewhere;
 * added to *total next to its worst-routing `ring` bytes. */
static void comm_uniform(const IrModule *m, const IrBlock *b, int i, int kind, double ring, int64_t runs,
                         CommSum *total) {
  if (kind != COMM_A2AV) return;
  const IrNode *nd = &b->nodes[i];
  const IrType *s = &b->nodes[nd->in[0]].type;
  if (ir_type_numel(&nd->type) < ir_type_numel(s)) s = &nd->type;
  int n = ir_axis_size(m, (IrAxis)nd->ia[0]);
  total->a2av_ring += ring * (double)runs;
  total->a2av_uniform += (double)(n - 1) / n * (double)ir_type_numel(s) * (double)ir_dtype_size(s->dtype) * (double)runs;
}

static const char *comm_names[COMM_KINDS] = {"all_reduce", "all_gather", "reduce_scatter", "group_sum", "send",
                                             "all_to_all", "all_to_all_v"};

/* The rows of one program into out, added to *total. */
static void comm_rows(const IrModule *m, int64_t nmicro, StrBuf *out, CommSum *total) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int64_t runs = block_runs(b, nmicro);
    if (!runs) continue;
    CommSum row[COMM_KINDS][IR_AXIS_COUNT];
    memset(row, 0, sizeof row);
    for (int i = 0; i < b->n; i++) {
      int k, ax;
      double bytes, ring;
      if (!comm_node(m, b, i, &k, &ax, &bytes, &ring)) continue;
      row[k][ax].count += runs;
      row[k][ax].payload += bytes * (double)runs;
      row[k][ax].ring += ring * (double)runs;
      comm_uniform(m, b, i, k, ring, runs, total);
    }
    for (int k = 0; k < COMM_KINDS; k++)
      for (int ax = 0; ax < IR_AXIS_COUNT; ax++) {
        const CommSum *c = &row[k][ax];
        if (!c->count) continue;
        sb_printf(out, "  %-8s %-15s %-4s %10lld %16.0f %16.0f\n", b->name, comm_names[k], ir_axis_name((IrAxis)ax),
                  (long long)c->count, c->payload, c->ring);
        total->count += c->count;
        total->payload += c->payload;
        total->ring += c->ring;
      }
  }
}

/* ---- --report sharding (--explain-sharding) ----
 * Every communication node of the compiled program, one entry each: what
 * it moves, how often, its bytes (comm_node: --report comm's figures, and
 * the same total) and why it is there (IrNode.why, written by the pass that
 * made it: a shard conversion names the reader, the value and both
 * layouts, with the matmul rule's weighing of its operands; the ring,
 * cross-entropy and expert lowerings, remat, the optimizer's gradient
 * reductions and the pipeline's messages say what they are). */
static void sharding_rows(const IrModule *m, int64_t nmicro, StrBuf *out, CommSum *total) {
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int64_t runs = block_runs(b, nmicro);
    if (!runs) continue;
    for (int i = 0; i < b->n; i++) {
      int k, ax;
      double bytes, ring;
      if (!comm_node(m, b, i, &k, &ax, &bytes, &ring)) continue;
      const IrNode *nd = &b->nodes[i];
      const IrType *t = nd->op == IR_OP_ALL_GATHER ? &nd->type : &b->nodes[nd->in[0]].type;
      char ts[256];
      sb_printf(out, "  %s %%%d: %s over %s of %s, %lld per step, %.0f bytes sent per step\n      %s\n", b->name, i,
                comm_names[k], ir_axis_name((IrAxis)ax), ir_type_str(t, ts, sizeof ts), (long long)runs,
                ring * (double)runs, nd->why ? nd->why : "(no note recorded: a compiler bug, please report it)");
      total->count += runs;
      total->payload += bytes * (double)runs;
      total->ring += ring * (double)runs;
      comm_uniform(m, b, i, k, ring, runs, total);
    }
  }
}

/* The dp reduction's section of --report comm for program m (passes/dpreport.c). */
static int report_dp_overlap(const Args *a, const IrModule *m, const HwDesc *hw, StrBuf *out) {
  int64_t bytes = a->dp_bucket_elems ? a->dp_bucket_elems * (int64_t)ir_dtype_size(m->train.precision)
                                     : a->dp_bucket_bytes;
  DpOverlapSum sum;
  char err[512];
  if (pass_dp_overlap_report(m, bytes, !a->no_overlap, hw, out, &sum, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: --dp-bucket-size: %s\n", err);
    return 1;
  }
  return 0;
}

static int report_comm(const Args *a, const IrModule *m, StrBuf *out) {
  int dp = ir_axis_size(m, IR_AXIS_DP), pp = ir_axis_size(m, IR_AXIS_PP);
  int64_t nmicro = m->train.global_batch / (m->train.micro_batch * dp);
  char lay[128];
  int explain = strcmp(a->report, "sharding") == 0;
  void (*rows)(const IrModule *, int64_t, StrBuf *, CommSum *) = explain ? sharding_rows : comm_rows;
  sb_printf(out, "%s report: %s, %s (%lld ranks), %s training, per rank per step\n", explain ? "sharding" : "comm",
            m->name ? m->name : "?", layout_str(m, lay, sizeof lay), (long long)mesh_ranks(m),
            ir_dtype_name(m->train.precision));
  if (explain)
    sb_printf(out, "# every communication node of each rank's program: its block and node id (as --emit=ir prints\n"
                   "# them), what it moves, its runs and bytes sent per step (the figures of --report comm), and\n"
                   "# the note of the pass that put it there.\n");
  sb_printf(out, "# from the compiled program: each collective over an axis of size n > 1, times the runs\n"
                 "# of its block per step (micro%s: %lld per rank, update: 1).  payload = the whole tensor\n"
                 "# (all_reduce, reduce_scatter: the operand; all_gather: the result); ring = the bytes a\n"
                 "# rank sends with a ring algorithm: 2(n-1)/n x payload for all_reduce, (n-1)/n for the\n"
                 "# others.  all_to_all_v (expert parallelism's token dispatch): the larger of its static\n"
                 "# buffers, the worst routing; what travels follows the routing.  Not counted: the\n"
                 "# trainer's all-reduce of the step loss over dp (8 bytes).\n",
            pp > 1 ? " and each fwd.<g> / bwd.<g>" : "", (long long)nmicro);
  if (pp > 1)
    sb_printf(out, "# pipeline: a send sends its payload once; a group_sum over k ranks sends its operand\n"
                   "# to the k-1 others; one section per pipeline rank (its program).\n");
  if (!explain)
    sb_printf(out, "  %-8s %-15s %-4s %10s %16s %16s\n", "block", "collective", "axis", "per step", "payload bytes",
              "ring bytes sent");
  HwDesc hwd, *hw = NULL;
  if (a->hw && !explain) {
    char err[2048];
    if (hw_load(a->hw, &hwd, err, sizeof err) != 0) { fprintf(stderr, "mcc: error: %s\n", err); return 1; }
    hw = &hwd;
  }
  if (pp < 2) {
    CommSum total = {0};
    rows(m, nmicro, out, &total);
    sb_printf(out, "total per step: %lld collectives, payload %.0f bytes, ring %.0f bytes sent per rank\n",
              (long long)total.count, total.payload, total.ring);
    if (!explain && report_dp_overlap(a, m, hw, out) != 0) return 1;
    if (total.a2av_ring > 0)
      sb_printf(out, "total per step at uniform routing: %.0f bytes sent per rank (all_to_all_v: %.0f of the %.0f above, "
                     "(n-1)/n of the rank's own routed rows)\n",
                total.ring - total.a2av_ring + total.a2av_uniform, total.a2av_uniform, total.a2av_ring);
    if (!explain) pass_optimizer_report(m, out);
    return 0;
  }
  Plan *p = make_plan(a->input, ir_module_clone(m));
  if (!p) return 1;
  for (int r = 0; r < p->nprograms; r++) {
    CommSum total = {0};
    sb_printf(out, "pipeline rank %d:\n", r);
    rows(p->programs[r], nmicro, out, &total);
    sb_printf(out, "total per step on pipeline rank %d: %lld operations, payload %.0f bytes, %.0f bytes sent per rank\n",
              r, (long long)total.count, total.payload, total.ring);
    if (!explain && report_dp_overlap(a, p->programs[r], hw, out) != 0) { plan_free(p); return 1; }
    if (total.a2av_ring > 0)
      sb_printf(out, "total per step on pipeline rank %d at uniform routing: %.0f bytes sent per rank\n", r,
                total.ring - total.a2av_ring + total.a2av_uniform);
  }
  plan_free(p);
  return 0;
}

/* ---- --report time ----
 * The predicted step time of the compiled layout on a hardware description
 * (passes/timereport.c): every rank's program costed node by node; the
 * model FLOPs of MFU from the frontend's unsharded forward block. */
static int report_time(const Args *a, const IrModule *m, StrBuf *out) {
  HwDesc hw;
  char err[2048];
  if (hw_load(a->hw, &hw, err, sizeof err) != 0) { fprintf(stderr, "mcc: error: %s\n", err); return 1; }
  IrModule *f = mdl_compile_file(a->input, &a->mdl);
  if (!f) return 1;
  double model = pass_time_model_flops(f);
  ir_module_free(f);
  Plan *p = make_plan(a->input, ir_module_clone(m));
  if (!p) return 1;
  char lay[128];
  /* the dp reduction as mrun will run it: --dp-bucket-size / --ddp-bucket-size, --no-overlap-grad-reduce */
  TimeDpOpts dpo = {a->dp_bucket_elems ? a->dp_bucket_elems * (int64_t)ir_dtype_size(m->train.precision)
                                       : a->dp_bucket_bytes, !a->no_overlap};
  int rc = pass_time_report(p->programs, p->nprograms, &hw, model, layout_str(m, lay, sizeof lay), &dpo, out, err,
                            sizeof err);
  if (rc != 0) fprintf(stderr, "mcc: error: %s\n", err);
  plan_free(p);
  return rc != 0;
}

/* ---- --report kernels (tools/kreport.c) ---- */
static int report_kernels(const Args *a, const IrModule *m, StrBuf *out) {
  HwDesc hw;
  char err[2048];
  if (a->hw && hw_load(a->hw, &hw, err, sizeof err) != 0) { fprintf(stderr, "mcc: error: %s\n", err); return 1; }
  if (a->nsm && !cg_nvrtc_available(err, sizeof err)) { fprintf(stderr, "mcc: --target: %s\n", err); return 1; }
  Plan *p = make_plan(a->input, ir_module_clone(m));
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

/* ---- --report schedule, --emit=trace FILE ----
 * Partitions the frontend's forward block (passes/partition.c), builds
 * and checks every pipeline rank's schedule (plan/schedule.c), then
 * runs the pass pipeline too, so the layout's other errors (a dim tp does
 * not divide, ...) are reported as for a plan.  No plan is written. */
static int run_pipe_views(const Args *a, PassCtx *cx) {
  IrModule *m = mdl_compile_file(a->input, &a->mdl);
  if (!m) return 1;
  if (a->dp > 0) m->par.dp = a->dp;
  if (check_layout(m) != 0) { ir_module_free(m); return 1; }
  char err[2048];
  PipeOptions po;
  if (pipe_options(a, m, &po) != 0) { ir_module_free(m); return 1; }
  PipePartition part;
  PipeSchedule sched;
  memset(&sched, 0, sizeof sched);
  int nmicro = 0, rc = 1;
  if (pass_pipe_partition(m, &po, &part, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    ir_module_free(m);
    return 1;
  }
  int kind = pipe_kind(a, part.vpp);
  if (part.pp > 1) {
    m->par.vpp = part.vpp;
    m->par.sched = ir_sched_of((PipeSchedKind)kind);
  }
  if (plan_pipe_nmicro(&m->train, ir_axis_size(m, IR_AXIS_DP), &nmicro, err, sizeof err) != 0 ||
      plan_pipe_schedule((PipeSchedKind)kind, part.pp, part.vpp, nmicro, &sched, err, sizeof err) != 0 ||
      plan_pipe_check(&sched, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    goto done;
  }
  StrBuf rep = {0}, tr = {0};
  int ok = 1;
  if (a->report && pass_pipe_report(m, &part, &sched, &rep, err, sizeof err) != 0) ok = 0;
  if (!ok) fprintf(stderr, "mcc: error: %s\n", err);
  else if (pass_run_pipeline(m, cx) != 0) {
    int internal = strncmp(cx->err, "internal error", 14) == 0;
    fprintf(stderr, "mcc: %s%s\n", internal ? "" : "error: ", cx->err);
    ok = 0;
  }
  /* the trace: with --hw each chunk's predicted seconds, from the compiled
   * fwd.<g> / bwd.<g> blocks (the one place per-op seconds come from:
   * passes/timereport.c); one rank without chunk blocks: its micro block
   * split 1 : 2 */
  double *fs = NULL, *bs = NULL, *ws = NULL;
  if (ok && a->trace && a->hw) {
    HwDesc hw;
    int nch = part.pp * part.vpp;
    fs = ts_xcalloc((size_t)nch, sizeof *fs);
    bs = ts_xcalloc((size_t)nch, sizeof *bs);
    ws = ts_xcalloc((size_t)nch, sizeof *ws);
    if (hw_load(a->hw, &hw, err, sizeof err) != 0) {
      fprintf(stderr, "mcc: error: %s\n", err);
      ok = 0;
    } else if (pass_time_chunks(m, &hw, nch, fs, bs, ws) != 0) {
      for (int i = 0; i < m->blocks.n; i++)
        if (!strcmp(m->blocks.a[i].name, "micro")) {
          TimeCost c = {0};
          pass_time_block(m, &m->blocks.a[i], &hw, hw_format_of(ir_train_dtype(&m->train), 0), &c);
          fs[0] = time_cost_total(&c) / 3;
          bs[0] = 2 * fs[0];
        }
    }
  }
  if (ok && a->trace && pass_pipe_trace(&part, &sched, fs, bs, ws, &tr, err, sizeof err) != 0) {
    fprintf(stderr, "mcc: error: %s\n", err);
    ok = 0;
  }
  free(fs);
  free(bs);
  free(ws);
  if (ok) {
    rc = 0;
    if (a->report) rc = emit_text(a->output, &rep);
    if (rc == 0 && a->trace) rc = emit_text(a->trace, &tr);
  }
  sb_free(&rep);
  sb_free(&tr);
done:
  plan_pipe_schedule_free(&sched);
  pass_pipe_partition_free(&part);
  ir_module_free(m);
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
  int64_t nranks = mesh_ranks(m);
  int gpus = a->gpus > 0 ? a->gpus : (int)nranks;
  int replica = (int)(nranks / ir_axis_size(m, IR_AXIS_DP));   /* tp*pp*cp*ep: ranks per dp replica */
  if (gpus % replica != 0) {
    fprintf(stderr, "mcc: error: --check --gpus %d: not a multiple of the %d ranks of one data-parallel "
                    "replica (tp*pp*cp*ep)\n", gpus, replica);
    return 1;
  }
  char lay[128], mrun[PATH_MAX + 8];
  layout_str(m, lay, sizeof lay);
  if (find_mrun(mrun, sizeof mrun) != 0) {
    fprintf(stderr, "mcc: error: --check needs mrun next to mcc (looked for %s)\n", mrun);
    return 1;
  }
  MdlOptions uo = unsharded_options(&a->mdl);
  IrModule *u = compile_quiet(a, &uo, 1);
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
    Plan *p = make_plan(a->input, i == 0 ? ir_module_clone(mods[i]) : mods[i]);
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
    PipeOptions po = {l->pp, l->vpp, pp_layers, npp_layers, NULL};
    PipePartition part;
    PipeSchedule sc;
    int nmicro = 0;
    if (pass_pipe_partition(m, &po, &part, err, errlen) != 0) { ir_module_free(m); return NULL; }
    pass_pipe_partition_free(&part);
    m->par.vpp = l->vpp;
    m->par.sched = ir_sched_of(l->sched);
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
  IrModule *f = mdl_compile_file(a->input, &a->mdl);
  if (!f) return 1;
  const char *mbk = ts_intern("micro_batch");
  int has_mb = 0, user_mb = 0;
  for (int i = 0; i < f->consts.n; i++) has_mb |= f->consts.a[i].name == mbk;
  for (int i = 0; i < a->defines.n; i++) user_mb |= a->defines.a[i].name == mbk;
  for (int i = 0; i < a->config_sets.n; i++) user_mb |= a->config_sets.a[i].name == mbk;
  AutoCtx ac = {a, !has_mb || user_mb};
  AlCompiler c = {&ac, auto_compile, llvm_positions, NULL};
  AlOptions o = {a->gpus, &hw, (double)a->memory, ac.fixed_mb, 0, 0, a->cp_attn_given ? a->cx->cp_attn : -1};
  StrBuf b = {0};
  AlResult best;
  IrModule *w = NULL;
  int rc = al_search(f, &c, &o, &b, &best, &w, err, sizeof err) != 0;
  ir_module_free(f);
  if (emit_text(NULL, &b) != 0) rc = 1;
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
  PassCtx cx;
  pass_ctx_init(&cx);
  ts_check_stdout_at_exit("mcc");
  Args a;
  memset(&a, 0, sizeof a);
  a.emit = "plan";
  a.cx = &cx;
  a.dp = a.steps = -1;
  mdl_options_init(&a.mdl);
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0) goto out;
  rc = 1;
  if (access(a.input, R_OK) != 0) {
    fprintf(stderr, "mcc: cannot open '%s': %s\n", a.input, strerror(errno));
    goto out;
  }
  a.mdl.defines = a.defines.a;
  a.mdl.ndefines = a.defines.n;
  a.mdl.config_sets = a.config_sets.a;
  a.mdl.nconfig_sets = a.config_sets.n;
  a.mdl.train_sets = a.train_sets.a;
  a.mdl.ntrain_sets = a.train_sets.n;
  for (int i = 0; i < a.config_sets.n; i++)
    for (int k = 0; k < a.defines.n; k++)
      if (a.defines.a[k].name == a.config_sets.a[i].name) {
        fprintf(stderr, "mcc: error: %s %s and -D %s=%s both set the config key '%s'; give one of them\n",
                a.config_sets.a[i].flag, a.config_sets.a[i].value, a.defines.a[k].name, a.defines.a[k].value,
                a.defines.a[k].name);
        goto out;
      }
  if (a.check && a.mdl.precision == IR_VOID) a.mdl.precision = IR_F64;   /* --check compares in f64 */
  if (a.time) cx.time_to = stderr;

  if (pipe_views(&a)) {
    rc = run_pipe_views(&a, &cx);
    goto out;
  }
  if (a.auto_layout) {
    rc = run_auto_layout(&a);
    goto out;
  }
  double t0 = (ts_now_s() * 1e3), tf = 0;
  IrModule *m = compile(&a, &a.mdl, a.dp, &cx, &tf);
  if (a.time) fprintf(stderr, "time: %-12s %9.1f ms\n", "frontend", tf);
  if (!m) goto out;
  if (a.report && !strcmp(a.report, "time") && a.gpus > 0 && a.gpus != mesh_ranks(m)) {
    /* --gpus N: the same layout with dp = N / (tp pp cp ep) */
    int64_t replica = mesh_ranks(m) / ir_axis_size(m, IR_AXIS_DP);
    if (a.gpus % replica != 0) {
      fprintf(stderr, "mcc: error: --gpus %d is not a multiple of the %lld ranks of one data-parallel replica "
                      "(tp*pp*cp*ep)\n", a.gpus, (long long)replica);
      ir_module_free(m);
      goto out;
    }
    ir_module_free(m);
    if (!(m = compile(&a, &a.mdl, (int)(a.gpus / replica), &cx, NULL))) goto out;
  }
  int owned = 1;
  if (a.stats) print_stats(m);
  double t2 = (ts_now_s() * 1e3);
  if (a.check) {
    rc = run_check(&a, m);
  } else if (a.report) {                 /* an analysis, no plan */
    StrBuf b = {0};
    int r = strcmp(a.report, "memory") == 0 ? report_memory(&a, m, &b)
          : strcmp(a.report, "time") == 0  ? report_time(&a, m, &b)
          : strcmp(a.report, "kernels") == 0 ? report_kernels(&a, m, &b) : report_comm(&a, m, &b);
    rc = r != 0 ? 1 : emit_text(a.output, &b);
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
    rc = emit_text(a.output, &b);
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
  free(a.defines.a);
  free(a.config_sets.a);
  free(a.train_sets.a);
  free(a.pp_layers.a);
  pass_ctx_free(&cx);
  return rc;
}
