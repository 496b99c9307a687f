/* mrun - trains a compiled plan on GPU ranks, or on CPU ranks:
 *
 *   mrun PLAN [--gpus N] [--steps N] [--data FILE] [--metrics out.jsonl]
 *             [--data-path [W1] P1 [W2] P2 ... [--split a,b,c] [--data-cache-path DIR]]
 *             [--mock-data]
 *             [--seed N] [--timeout S] [--save-params FILE] [--quiet]
 *             [--backend llvm|ref] [--cpu]
 *   mrun --selftest
 *
 * Loads the plan (binary or text, as written by mcc; a bare IR module
 * with blocks "micro" and "update" is accepted too) and trains it with the
 * CPU runtime (runtime/exec/train.c) on N ranks, one process each:
 *   - N = 1 without an MPI launcher: this process, no MPI at all;
 *   - N > 1 without a launcher: mrun runs itself under
 *     `mpirun -np N --oversubscribe --bind-to none` as a child (marker
 *     TS_MRUN_LAUNCHED in the environment, so a broken launcher cannot
 *     loop) and stays: it passes SIGINT / SIGTERM to the ranks, names a
 *     rank that died, and removes MPI's files (launch());
 *   - under a launcher (OMPI_COMM_WORLD_SIZE or PMI_SIZE set): joins it;
 *     the world size must equal N (N defaults to the world size).
 * The mesh is the plan's tp, pp, cp, ep and dp = N / (tp*pp*cp*ep); a plan
 * compiled for another dp gets its update block rebuilt for this dp
 * (pass_respecialize_dp: the reduction over dp, ZeRO-1's chunks, the
 * norm; the overlapped buckets follow from it, plan/dpreduce.c).  With
 * pp > 1 each rank runs the program of its pp coordinate (the plan's
 * rank_program), respecialized the same way, and trains it with its
 * pipeline schedule, regenerated for global_batch / (micro_batch x dp)
 * micro batches per dp rank (runtime/exec/train.h); a dp whose micro
 * batches the schedule cannot run (1f1b and zb-h1 need at least pp,
 * interleaved a multiple of pp) is refused before any rank starts, naming
 * the --gpus values that work.  A rank that fails or dies ends every rank: an
 * error calls MPI_Abort, and a stalled or dead peer is caught by the
 * collectives' deadline (--timeout, default 60 s).
 * GPUs: when the CUDA driver reports devices (and neither --cpu nor
 * --backend ref is given), each rank opens device (local rank mod device
 * count), local rank from OMPI_COMM_WORLD_LOCAL_RANK, else SLURM_LOCALID,
 * else the world rank, and runs its program there from the plan's image
 * for the device's arch (mcc --target: the cubin, or the PTX of the
 * newest older arch, which the driver JIT-compiles).  A plan without one,
 * or whose image was compiled for another module (e.g. another dp), is
 * refused naming the mcc option that fixes it.  Without a driver every
 * rank is a CPU rank (one line says so).
 * --selftest (runtime/exec/selftest.h): runs every kernel kind and a tiny
 * training step on GPU 0 against the CPU and prints the table; no plan.
 * Exit status 0 on success, 1 on any error (after a message on stderr), 2
 * on bad usage.  With --selftest: 0 when every row passes, 1 when a row
 * FAILs, the device cannot be opened, or there is no GPU driver or device
 * (then one line says so: nothing was tested). */
#include "codegen/cuda.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "runtime/exec/train.h"
#include "runtime/comm/comm.h"
#include "runtime/device/device.h"
#include "runtime/exec/dev_prog.h"
#include "runtime/exec/selftest.h"
#include "runtime/exec/calibrate.h"
#include "plan/hw.h"
#include "runtime/data/tokenizer.h"
#include "passes/passes.h"
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char usage[] =
    "usage: mrun PLAN [--gpus N] [--steps N] [--data FILE] [--metrics out.jsonl] [--seed N]\n"
    "                 [--timeout S] [--save-params FILE] [--quiet] [--backend llvm|ref] [--cpu]\n"
    "       mrun --selftest\n"
    "       mrun --calibrate FILE [--gpus N]\n"
    "  PLAN               a plan from mcc (binary or --emit=plan-text), or an IR module text\n"
    "  --gpus N           number of ranks (CPU ranks without a GPU driver); N / (tp*pp*cp*ep) is dp.\n"
    "                     N > 1 starts the ranks with mpirun unless already under an MPI launcher.\n"
    "                     With a GPU driver each rank runs on device (local rank mod device count)\n"
    "                     from the plan's cubin / PTX for its arch (mcc --target sm_XX), else\n"
    "                     its CUDA source compiled by NVRTC\n"
    "  --cpu              CPU ranks even when there are GPUs\n"
    "  --calibrate FILE   measure this host's CPU ranks (BLAS GEMMs, memory bandwidth, with --gpus N >= 2\n"
    "                     the MPI link between two ranks) and write a hardware description for\n"
    "                     mcc --report time / --auto-layout --hw FILE; no plan\n"
    "  --selftest         every kernel kind and a 2-step training run on GPU 0 against the CPU, as a\n"
    "                     table; exit 0 iff every row passes (1 also when there is no GPU: nothing tested)\n"
    "  --steps N          train N steps instead of the plan's train.steps (also --train-iters N)\n"
    "  --data FILE        training text, byte-level tokens (default samples/data/kjv.txt)\n"
    "  --data-path [W1] P1 [W2] P2 ...\n"
    "                     train on Megatron's indexed datasets P.bin + P.idx (tools/mprep), blended by the\n"
    "                     weights W (default: by size); every word up to the next option belongs to it.\n"
    "                     Samples of seq_len + 1 tokens across documents, shuffled (docs/data.md)\n"
    "  --split a,b,c      train / valid / test weights over each dataset's sequences (default 969,30,1)\n"
    "  --data-cache-path DIR  where the sample indices are cached (default: a cache folder beside the\n"
    "                     first dataset, when it can be made); a second start loads them in milliseconds\n"
    "  --mock-data        synthetic token ids below the model's vocabulary, no file (benchmarks)\n"
    "  --reset-position-ids    packed sequences (docs/data.md): position_ids restart after each end-of-document\n"
    "  --reset-attention-mask  ... document_ids number the documents of a row (attention stays inside one)\n"
    "  --eod-mask-loss         ... loss_mask is 0 where the token is the end-of-document token\n"
    "  --eod-id N         the end-of-document token id for these flags;  --tokenizer PATH: its EOD token instead\n"
    "  --eval-interval N  after every N-th step, the loss on --eval-iters global batches of the valid split\n"
    "                     (forward only, dropout off; the same samples each time): val_loss and val_ppl in\n"
    "                     the progress line and --metrics (docs/data.md \"Validation\")\n"
    "  --eval-iters K     global batches per evaluation (default 100; 0: no evaluation)\n"
    "  --test             after the last step, the loss on --eval-iters global batches of the test split\n"
    "  --no-prefetch      each step reads its own batches (default: a thread prepares the next step's)\n"
    "  --metrics FILE     write one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, tflops_per_rank,\n"
    "                     mfu with --hw, elapsed_s)\n"
    "  --hw NAME|FILE     a hardware description (mcc --hw's: a100-80gb, h100-sxm, h200, b200, or mrun\n"
    "                     --calibrate's file): the progress line and --metrics give MFU against its peak\n"
    "                     (TFLOP/s per rank, Megatron's model FLOPs, always)\n"
    "  --trace FILE       a Chrome / Perfetto trace of the run: one process per rank, its ops, kernels, GEMMs,\n"
    "                     collectives and pipeline messages with their wall times, and its steps (CPU ranks)\n"
    "  --seed N           override the plan's train.seed (initialization, data order, dropout)\n"
    "  --lr X, --min-lr X, --lr-warmup-iters N, --lr-decay-iters N, --lr-wsd-decay-iters N\n"
    "  --lr-decay-style constant|linear|cosine|WSD|inverse-square-root, --lr-wsd-decay-style S\n"
    "  --muon-adamw-lr X  Muon's AdamW group at X (the schedule scaled by X / lr)\n"
    "  --rampup-batch-size S I N  a ramp-up plan's (mcc --rampup-batch-size) ramp at run time: the global\n"
    "                         batch from S, growing by I over the first N samples\n"
    "                     the LR schedule, over the plan's train line (Megatron's flags; run-time values)\n"
    "  --weight-decay X, --clip-grad X, --adam-beta1 X, --adam-beta2 X, --adam-eps X, --momentum X\n"
    "  (--sgd-momentum), --muon-momentum X, --muon-ns-steps N, --[no-]nesterov, --optimizer NAME,\n"
    "  --global-batch-size N, --micro-batch-size N\n"
    "                     constants of the compiled program: accepted at the plan's value, else refused\n"
    "                     naming the mcc flag that compiles the other program (docs/cli.md)\n"
    "  --timeout S        seconds a rank waits in a collective before the job is stopped (default 60)\n"
    "  --save-params FILE after training, write every parameter in its global shape (format: runtime/exec/train.h)\n"
    "  --save DIR         checkpoints into DIR (docs/checkpoints.md): at the end (or when stopped by a signal)\n"
    "  --save-interval N  ... and after every N-th step;  --keep K: only the newest K are kept\n"
    "  --async-save       the states are copied to host memory and written by a thread while training goes on\n"
    "  --load DIR         resume from the checkpoint DIR/latest names (or DIR itself, one checkpoint) of the\n"
    "                     same model in any layout; training goes on to --steps (steps count from the run's start)\n"
    "  --init-from PATH   start from Hugging Face weights (a .safetensors file, or a directory with config.json\n"
    "                     and model.safetensors or its index) instead of the initializers; the map of names\n"
    "                     is stdlib/hf/<config.json's model_type>.map (docs/checkpoints.md)\n"
    "  --export DIR       after training, write DIR/model.safetensors and DIR/config.json for transformers\n"
    "  --format hf        --export's format (the only one)\n"
    "  --hf-map NAME|FILE the map for --init-from / --export (default: config.json's model_type; for --export\n"
    "                     the map in stdlib/hf that fits the model)\n"
    "  --generate         text from the model instead of training (docs/generation.md): needs --load DIR or\n"
    "                     --init-from PATH, --prompt TEXT or --prompt-file FILE, and --max-tokens N; byte tokens,\n"
    "                     or --tokenizer PATH's.  Prints the text and tokens/s\n"
    "  --temperature T    0 (default): greedy;  --top-k K (0: all);  --top-p P (1: all);  --seed S: the draws\n"
    "  --generate-check   --generate (greedy), then each new token checked against the argmax of a full forward\n"
    "  --print-ids        --generate: the new tokens' ids on a line of their own\n"
  "  --quiet            no per-step progress lines\n"
    "  --dp-bucket-size BYTES  dp > 1 on CPU ranks: the gradient reduction in buckets of at least BYTES (default\n"
    "                     Megatron's 40M elements), each posted without waiting during the last micro batch's\n"
    "                     backward once its gradients are final; the update block waits for it (docs/sharding.md).\n"
    "                     --ddp-bucket-size N: Megatron's, in elements.  At the end: buckets, posting and waiting time\n"
    "  --no-overlap-grad-reduce  the dp reduction in the update block after the backward, as the plan writes it\n"
    "                     (--overlap-grad-reduce: the default)\n"
    "  --backend B        llvm (default): fusion groups and elementwise / row ops as JIT-compiled kernels;\n"
    "                     ref: every op on the reference kernels (the oracle for tests; CPU ranks)\n"
    "  --help             this text\n"
    "environment: TS_RT_PROFILE=1 prints the time spent per op at exit (and the JIT's work; on a GPU\n"
    "             the GPU time per kernel from CUDA events);\n"
    "             TS_CUDA_LIB_PATH=DIR[:DIR...] folders searched first for the CUDA libraries;\n"
    "             TS_THREADS=N threads of the generated kernels (default: all cores; 1 per rank when\n"
    "             mrun starts several ranks itself);\n"
    "             TS_SELFTEST_ONLY=NAME,... runs only these kinds / dtypes of --selftest (e.g. softmax,train,f32)\n";

/* ---- the optimizer and schedule flags (docs/cli.md "Megatron-LM's flags") ----
 * mrun takes Megatron's hyperparameter flags where they mean what mcc's
 * do.  The trainer reads the LR schedule's fields from the plan's train
 * line at every step (rt_lr_at), so mrun's value replaces the plan's
 * (run = 1).  The others are constants of the compiled program -- the
 * attributes of its update block's nodes (adamw's b1, b2, eps and wd,
 * clip_coef's max, sgd's momentum, Muon's unrolled Newton-Schulz steps),
 * the update rule itself, or the loss gradient's seed 1 / (micro batches
 * per step) -- so mrun takes them only at the plan's value and otherwise
 * names mcc's flag (run = 0). */
typedef enum { HP_F64, HP_I64, HP_INT, HP_SCHED, HP_WSD, HP_OPT, HP_ON, HP_OFF } HpType;
typedef struct {
  const char *flag, *key;   /* key: the train line's name */
  int run;                  /* 1: a run-time value of the plan */
  HpType type;
  size_t off;               /* the field in IrTrain */
  double lo, hi;            /* numbers: the range (lo excluded when lo_open, hi when hi_open) */
  int lo_open, hi_open;
  const char *holds;        /* run = 0: what in the program holds it */
} HpFlag;
#define HP_T(f) offsetof(IrTrain, f)
static const HpFlag hp_flags[] = {
    {"--lr", "lr", 1, HP_F64, HP_T(lr), 0, INFINITY, 1, 0, NULL},
    {"--min-lr", "min_lr", 1, HP_F64, HP_T(min_lr), 0, INFINITY, 0, 0, NULL},
    {"--lr-warmup-iters", "warmup", 1, HP_I64, HP_T(warmup), 0, 1e15, 0, 0, NULL},
    {"--lr-decay-iters", "decay_steps", 1, HP_I64, HP_T(decay_steps), 1, 1e15, 0, 0, NULL},
    {"--lr-decay-style", "schedule", 1, HP_SCHED, HP_T(schedule), 0, 0, 0, 0, NULL},
    {"--lr-wsd-decay-iters", "wsd_decay_steps", 1, HP_I64, HP_T(wsd_decay_steps), 1, 1e15, 0, 0, NULL},
    {"--lr-wsd-decay-style", "wsd_style", 1, HP_WSD, HP_T(wsd_style), 0, 0, 0, 0, NULL},
    {"--muon-adamw-lr", "muon_adamw_lr", 1, HP_F64, HP_T(muon_adamw_lr), 0, INFINITY, 0, 0, NULL},
    {"--weight-decay", "weight_decay", 0, HP_F64, HP_T(weight_decay), 0, INFINITY, 0, 0,
     "the wd of its optimizer steps"},
    {"--clip-grad", "clip_grad", 0, HP_F64, HP_T(clip_grad), 0, INFINITY, 0, 0, "clip_coef's max"},
    {"--adam-beta1", "beta1", 0, HP_F64, HP_T(beta1), 0, 1, 0, 1, "adamw's and lion's b1"},
    {"--adam-beta2", "beta2", 0, HP_F64, HP_T(beta2), 0, 1, 0, 1, "adamw's and lion's b2"},
    {"--adam-eps", "eps", 0, HP_F64, HP_T(eps), 0, INFINITY, 1, 0, "adamw's eps"},
    {"--sgd-momentum", "momentum", 0, HP_F64, HP_T(momentum), 0, 1, 0, 1, "sgd's mom"},
    {"--momentum", "momentum", 0, HP_F64, HP_T(momentum), 0, 1, 0, 1, "sgd's mom"},
    {"--muon-momentum", "muon_momentum", 0, HP_F64, HP_T(muon_momentum), 0, 1, 0, 1,
     "the factors of Muon's momentum update"},
    {"--muon-ns-steps", "muon_ns_steps", 0, HP_INT, HP_T(muon_ns_steps), 1, 1000, 0, 0,
     "Muon's Newton-Schulz iterations, unrolled"},
    {"--nesterov", "nesterov", 0, HP_ON, HP_T(nesterov), 0, 0, 0, 0, "sgd's nesterov, Muon's update"},
    {"--no-nesterov", "nesterov", 0, HP_OFF, HP_T(nesterov), 0, 0, 0, 0, "sgd's nesterov, Muon's update"},
    {"--optimizer", "optimizer", 0, HP_OPT, HP_T(optimizer), 0, 0, 0, 0, "the update block's steps"},
    {"--global-batch-size", "global_batch", 0, HP_I64, HP_T(global_batch), 1, 1e15, 0, 0,
     "the loss gradient's seed 1 / (global_batch / micro_batch)"},
    {"--micro-batch-size", "micro_batch", 0, HP_I64, HP_T(micro_batch), 1, 1e15, 0, 0,
     "the micro block's shapes"},
};
#define HP_COUNT ((int)(sizeof hp_flags / sizeof hp_flags[0]))

typedef struct {
  const char *plan, *data, *metrics, *save_params;
  RtGptOpts gpt;              /* --data-path, --split, --data-cache-path, --mock-data */
  const char **dpath;         /* --data-path's words, and the weights they gave */
  double *dweight;
  int has_split;
  const char *tokenizer;      /* --tokenizer PATH: where the EOD id comes from (unless --eod-id) */
  int64_t eod_id;             /* --eod-id N; -1: not given */
  int64_t dp_bucket_bytes;    /* --dp-bucket-size BYTES (0: the default); --ddp-bucket-size N: N elements */
  int64_t dp_bucket_elems;
  int no_overlap;             /* --no-overlap-grad-reduce */
  int64_t eval_interval, eval_iters;  /* --eval-interval, --eval-iters (-1: not given) */
  int eval_test;              /* --test */
  int no_prefetch;            /* --no-prefetch */
  const char *init_from, *export_dir, *format, *hf_map;
  RtCkptOpts ckpt;
  int64_t gpus, steps;        /* -1: not given */
  int has_seed, quiet, cpu, selftest;
  int64_t rampup[3];          /* --rampup-batch-size START INCR SAMPLES (rampup_set) */
  int rampup_set;
  int hp_set[HP_COUNT];       /* the optimizer and schedule flags given (hp_flags), and their values */
  double hp_val[HP_COUNT];    /* (names: the enum's value) */
  const char *calibrate;      /* --calibrate FILE (runtime/exec/calibrate.h) */
  const char *trace;          /* --trace FILE (runtime/exec/trace.c) */
  const char *hw;             /* --hw NAME|FILE: MFU against its peak (plan/hw.h) */
  HwDesc hwd;
  uint64_t seed;
  double timeout;             /* seconds */
  RtBackend backend;
  /* --generate (runtime/exec/generate.c) */
  int generate, generate_check, print_ids;
  const char *prompt, *prompt_file;
  int64_t max_tokens, top_k;    /* -1: not given */
  double temperature, top_p;
} Args;

/* Parses an integer option value in [min, max]; 0 or -1 with a message. */
static int parse_count(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out) {
  char *e;
  errno = 0;
  long long v = s ? strtoll(s, &e, 10) : 0;
  if (!s || !*s || *e || errno || v < min || v > max) {
    fprintf(stderr, "mrun: %s needs a whole number in [%lld, %lld], got '%s'\n", opt, (long long)min, (long long)max,
            s ? s : "");
    return -1;
  }
  *out = v;
  return 0;
}

/* Whether two output paths name the same regular file (their directories
 * resolved: "out.bin" and "./out.bin" do; the files need not exist yet). */
static int same_path(const char *a, const char *b) {
  struct stat st;
  if (stat(a, &st) == 0 && !S_ISREG(st.st_mode)) return 0;   /* a device takes any number of writers */
  if (strcmp(a, b) == 0) return 1;
  char *p[2] = {NULL, NULL};
  const char *in[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    const char *slash = strrchr(in[k], '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - in[k]) + (slash == in[k]) : 1, slash ? in[k] : ".");
    char *real = realpath(dir, NULL);
    if (real) {
      size_t n = strlen(real) + strlen(in[k]) + 2;
      p[k] = malloc(n);
      if (p[k]) snprintf(p[k], n, "%s/%s", real, slash ? slash + 1 : in[k]);
      free(real);
    }
  }
  int same = p[0] && p[1] && strcmp(p[0], p[1]) == 0;
  free(p[0]);
  free(p[1]);
  return same;
}

/* The number s, whole: 1 (and *v), else 0. */
static int is_number(const char *s, double *v) {
  char *e;
  errno = 0;
  *v = strtod(s, &e);
  return *s && !*e && !errno;
}

/* --data-path [W1] P1 [W2] P2 ... (Megatron's form): every word after it
 * (and after "=") up to the next option.  All weights or none: when the
 * first word is a number, the words are weight-path pairs. */
static int parse_data_path(int argc, char **argv, int *i, Args *a) {
  const char **w = ts_xmalloc((size_t)argc * sizeof *w);
  int n = 0;
  char *eq = strchr(argv[*i], '=');
  if (eq) w[n++] = eq + 1;
  while (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0) w[n++] = argv[++*i];
  if (a->gpt.n) { fprintf(stderr, "mrun: --data-path given twice: list every dataset after one --data-path\n"); free(w); return -1; }
  if (n == 0 || (n == 1 && !*w[0])) { fprintf(stderr, "mrun: --data-path needs a dataset prefix (P for P.bin + P.idx)\n"); free(w); return -1; }
  double v;
  int weighted = is_number(w[0], &v);
  if (weighted && n % 2 != 0) {
    fprintf(stderr, "mrun: --data-path: %d words starting with the weight %s: give weight-prefix pairs "
            "(W1 P1 W2 P2 ...) or prefixes alone\n", n, w[0]);
    free(w);
    return -1;
  }
  int nd = weighted ? n / 2 : n;
  a->dpath = ts_xmalloc((size_t)nd * sizeof *a->dpath);
  a->dweight = weighted ? ts_xmalloc((size_t)nd * sizeof *a->dweight) : NULL;
  for (int k = 0; k < nd; k++) {
    if (weighted && (!is_number(w[2 * k], &v) || !(v >= 0) || !isfinite(v))) {
      fprintf(stderr, "mrun: --data-path: '%s' (before %s) is not a weight >= 0\n", w[2 * k], w[2 * k + 1]);
      free(w);
      return -1;
    }
    if (weighted) a->dweight[k] = v;
    a->dpath[k] = weighted ? w[2 * k + 1] : w[k];
  }
  free(w);
  a->gpt.n = nd;
  a->gpt.prefix = a->dpath;
  a->gpt.weight = a->dweight;
  return 0;
}

/* The end-of-document id of the packed-sequence flags: --eod-id N, else
 * --tokenizer PATH's EOD token (rt_tok_eod); a flag without one, or a
 * tokenizer that has none, is refused here, before any rank starts. */
static int eod_args(Args *a) {
  RtGptOpts *g = &a->gpt;
  const char *flag = g->reset_position_ids ? "--reset-position-ids" : g->reset_attention_mask ? "--reset-attention-mask"
                   : g->eod_mask_loss ? "--eod-mask-loss" : NULL;
  if (a->tokenizer) {
    char err[1024];
    RtTokenizer *t = rt_tok_load(a->tokenizer, err, sizeof err);
    if (!t) { fprintf(stderr, "mrun: --tokenizer: %s\n", err); return -1; }
    int32_t eod = rt_tok_eod(t);
    rt_tok_free(t);
    if (eod < 0 && a->eod_id < 0 && flag) {
      fprintf(stderr, "mrun: %s: tokenizer %s has no end-of-document token (<|endoftext|>, <|end_of_text|>, </s> or "
              "<eos>): give its id with --eod-id N\n", flag, a->tokenizer);
      return -1;
    }
    if (eod >= 0 && a->eod_id >= 0 && eod != a->eod_id) {
      fprintf(stderr, "mrun: --eod-id %lld but tokenizer %s's end-of-document token is %d: give one of them\n",
              (long long)a->eod_id, a->tokenizer, eod);
      return -1;
    }
    if (eod >= 0) g->eod = eod, g->has_eod = 1;
  }
  if (a->eod_id >= 0) g->eod = (int32_t)a->eod_id, g->has_eod = 1;
  if (flag && !g->has_eod) {
    fprintf(stderr, "mrun: %s needs the end-of-document token id: give --tokenizer PATH (the tokenizer the data "
            "was made with) or --eod-id N\n", flag);
    return -1;
  }
  return 0;
}

/* The data options that go together. */
static int check_data_args(const Args *a) {
  const char *other = a->data ? "--data" : a->gpt.mock ? "--mock-data" : NULL;
  if (a->gpt.n && other) {
    fprintf(stderr, "mrun: --data-path and %s both say what to train on: give one\n", other);
    return -1;
  }
  if (a->data && a->gpt.mock) { fprintf(stderr, "mrun: --data and --mock-data both say what to train on: give one\n"); return -1; }
  if ((a->has_split || a->gpt.cache_dir) && !a->gpt.n) {
    fprintf(stderr, "mrun: %s goes with --data-path (indexed datasets)\n", a->has_split ? "--split" : "--data-cache-path");
    return -1;
  }
  return 0;
}

/* Validation's options (docs/data.md "Validation"): what they need.  The
 * byte corpus has no valid / test split, so evaluation is refused there
 * rather than drawn from the training text. */
static int check_eval_args(Args *a) {
  if (a->eval_iters >= 0 && !a->eval_interval && !a->eval_test) {
    fprintf(stderr, "mrun: --eval-iters goes with --eval-interval N (or --test)\n");
    return -1;
  }
  if (a->eval_iters < 0) a->eval_iters = 100;   /* Megatron's default */
  if ((a->eval_interval || a->eval_test) && a->eval_iters > 0 && !a->gpt.n && !a->gpt.mock) {
    fprintf(stderr, "mrun: %s needs a %s split, and the byte corpus (%s) has none: give --data-path (indexed "
            "datasets, split by --split) or --mock-data\n", a->eval_interval ? "--eval-interval" : "--test",
            a->eval_interval ? "validation" : "test", a->data ? a->data : "--data, by default samples/data/kjv.txt");
    return -1;
  }
  return 0;
}

/* --generate's options: together, and not with training's outputs. */
static int check_generate_args(Args *a) {
  int sampling = a->prompt || a->prompt_file || a->max_tokens >= 0 || a->temperature >= 0 || a->top_k >= 0 ||
                 a->top_p >= 0 || a->print_ids;
  if (!a->generate) {
    if (sampling) fprintf(stderr, "mrun: --prompt, --prompt-file, --max-tokens, --temperature, --top-k, --top-p and "
                          "--print-ids go with --generate\n");
    return sampling ? -1 : 0;
  }
  const char *bad = a->ckpt.save_dir ? "--save" : a->export_dir ? "--export" : a->save_params ? "--save-params"
                    : a->metrics ? "--metrics" : a->eval_interval > 0 || a->eval_test ? "--eval-interval / --test"
                    : a->steps >= 0 ? "--steps" : NULL;
  if (bad) { fprintf(stderr, "mrun: --generate writes text, it does not train: %s does not go with it\n", bad); return -1; }
  if (!a->ckpt.load_dir && !a->init_from) {
    fprintf(stderr, "mrun: --generate needs trained weights: --load DIR (a checkpoint) or --init-from PATH (Hugging "
            "Face weights); the initializers' random weights would only make noise\n");
    return -1;
  }
  if (!!a->prompt == !!a->prompt_file) {
    fprintf(stderr, "mrun: --generate needs the prompt: --prompt TEXT or --prompt-file FILE (one of them)\n");
    return -1;
  }
  if (a->max_tokens < 0) { fprintf(stderr, "mrun: --generate needs --max-tokens N (new tokens)\n"); return -1; }
  if (a->temperature < 0) a->temperature = 0;
  if (a->top_k < 0) a->top_k = 0;
  if (a->top_p < 0) a->top_p = 1;
  if (a->generate_check && a->temperature > 0) {
    fprintf(stderr, "mrun: --generate-check compares greedy decoding with the full forward: not with --temperature > 0\n");
    return -1;
  }
  return 0;
}

/* The value of one of the names of IrSchedule / IrWsdStyle / IrOptimizer,
 * Megatron's spellings too (WSD, inverse-square-root, adam); -1 if none. */
static int hp_name_value(HpType t, const char *v) {
  if (t == HP_SCHED && strcasecmp(v, "WSD") == 0) return IR_SCHED_WSD;
  if (t == HP_SCHED && strcmp(v, "inverse-square-root") == 0) return IR_SCHED_INVSQRT;
  if (t == HP_OPT && strcmp(v, "adam") == 0) return IR_OPT_ADAMW;
  int n = t == HP_SCHED ? IR_SCHED_COUNT : t == HP_WSD ? IR_WSD_COUNT : IR_OPT_COUNT;
  for (int i = 0; i < n; i++)
    if (strcmp(v, t == HP_SCHED ? ir_schedule_name((IrSchedule)i) : t == HP_WSD ? ir_wsd_style_name((IrWsdStyle)i)
                                                                   : ir_optimizer_name((IrOptimizer)i)) == 0)
      return i;
  return -1;
}

/* Parses the value of hp_flags[k] into *out.  0, or -1 with a message. */
static int hp_parse(int k, const char *val, double *out) {
  const HpFlag *f = &hp_flags[k];
  if (f->type == HP_SCHED || f->type == HP_WSD || f->type == HP_OPT) {
    int v = hp_name_value(f->type, val);
    if (v < 0) {
      fprintf(stderr, "mrun: %s must be %s, got '%s'\n", f->flag,
              f->type == HP_SCHED ? "constant, linear, cosine, WSD or inverse-square-root"
              : f->type == HP_WSD ? "linear, cosine, exponential or minus_sqrt" : "adam (adamw), sgd, lion or muon",
              val);
      return -1;
    }
    *out = v;
    return 0;
  }
  char *e;
  errno = 0;
  double x = strtod(val, &e);
  int whole = f->type == HP_I64 || f->type == HP_INT;
  if (!*val || *e || errno || !isfinite(x) || (whole && x != floor(x)) || (f->lo_open ? !(x > f->lo) : !(x >= f->lo)) ||
      (f->hi_open ? !(x < f->hi) : !(x <= f->hi))) {
    fprintf(stderr, "mrun: %s needs %s %s %g%s, got '%s'\n", f->flag, whole ? "a whole number" : "a number",
            f->lo_open ? ">" : ">=", f->lo, f->hi_open ? " and < 1" : "", val);
    return -1;
  }
  *out = x;
  return 0;
}

/* hp_flags[k]'s field of t, as a double (an enum as its value). */
static double hp_get(const IrTrain *t, int k) {
  const char *p = (const char *)t + hp_flags[k].off;
  switch (hp_flags[k].type) {
  case HP_F64: return *(const double *)p;
  case HP_I64: return (double)*(const int64_t *)p;
  case HP_INT: case HP_ON: case HP_OFF: return *(const int *)p;
  case HP_SCHED: return *(const IrSchedule *)p;
  case HP_WSD: return *(const IrWsdStyle *)p;
  default: return *(const IrOptimizer *)p;
  }
}

static void hp_set_field(IrTrain *t, int k, double v) {
  char *p = (char *)t + hp_flags[k].off;
  switch (hp_flags[k].type) {
  case HP_F64: *(double *)p = v; break;
  case HP_I64: *(int64_t *)p = (int64_t)v; break;
  case HP_SCHED: *(IrSchedule *)p = (IrSchedule)(int)v; break;
  case HP_WSD: *(IrWsdStyle *)p = (IrWsdStyle)(int)v; break;
  default: break;   /* the program's constants are never written */
  }
}

/* A value of hp_flags[k] as the user would write it. */
static void hp_str(int k, double v, char *buf, size_t n) {
  switch (hp_flags[k].type) {
  case HP_SCHED: snprintf(buf, n, "%s", ir_schedule_name((IrSchedule)(int)v)); break;
  case HP_WSD: snprintf(buf, n, "%s", ir_wsd_style_name((IrWsdStyle)(int)v)); break;
  case HP_OPT: snprintf(buf, n, "%s", ir_optimizer_name((IrOptimizer)(int)v)); break;
  case HP_ON: case HP_OFF: snprintf(buf, n, "%s", v != 0 ? "on" : "off"); break;
  default:   /* the shortest form that reads back as v */
    snprintf(buf, n, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, n, "%.17g", v);
  }
}

/* Applies the optimizer and schedule flags to m's train line: the run-time
 * ones replace the plan's values; one that is a constant of the program
 * is refused unless it is the plan's value.  0, or -1 with a message. */
static int hp_apply(IrModule *m, const Args *a, char *err, size_t errlen) {
  IrTrain *t = &m->train;
  if (a->rampup_set) {   /* the ramp's numbers are run-time values of a plan compiled with a ramp-up */
    if (!ir_train_rampup(t))
      return ts_errf(err, errlen, "--rampup-batch-size: the plan was compiled for a constant global batch (%lld), "
                     "whose loss gradient is scaled for %lld micro batches per step: compile it with mcc "
                     "--rampup-batch-size %lld %lld %lld", (long long)t->global_batch,
                     (long long)(t->global_batch / (t->micro_batch > 0 ? t->micro_batch : 1)), (long long)a->rampup[0],
                     (long long)a->rampup[1], (long long)a->rampup[2]);
    t->rampup_start = a->rampup[0], t->rampup_incr = a->rampup[1], t->rampup_samples = a->rampup[2];
    if (ir_train_rampup_check(t, t->micro_batch, err, errlen) != 0) return -1;
  }
  for (int k = 0; k < HP_COUNT; k++) {
    if (!a->hp_set[k]) continue;
    const HpFlag *f = &hp_flags[k];
    double want = f->type == HP_ON ? 1 : f->type == HP_OFF ? 0 : a->hp_val[k];
    if (f->off == offsetof(IrTrain, muon_adamw_lr) && t->optimizer != IR_OPT_MUON && want > 0)
      return ts_errf(err, errlen, "--muon-adamw-lr is the lr of Muon's AdamW group, and the plan's optimizer is %s "
                     "(one lr: --lr); compile with mcc --optimizer muon for Muon", ir_optimizer_name(t->optimizer));
    if (f->run) { hp_set_field(t, k, want); continue; }
    double have = hp_get(t, k);
    if (f->type == HP_ON || f->type == HP_OFF) have = have != 0;
    if (have == want) continue;   /* the plan's own value: nothing changes */
    char hv[64], wv[64], flag[96];
    hp_str(k, have, hv, sizeof hv);
    hp_str(k, want, wv, sizeof wv);
    if (f->type == HP_ON || f->type == HP_OFF) snprintf(flag, sizeof flag, "%s", f->flag);
    else snprintf(flag, sizeof flag, "%s %s", f->flag, wv);
    return ts_errf(err, errlen, "%s: the plan (optimizer %s) was compiled with %s = %s, a constant of its program "
                   "(%s), not a run-time value: compile the plan again with mcc %s.  mrun changes only --lr, "
                   "--min-lr, --lr-warmup-iters, --lr-decay-iters, --lr-decay-style, --lr-wsd-decay-iters, "
                   "--lr-wsd-decay-style, --muon-adamw-lr, --train-iters and --seed at run time", flag,
                   ir_optimizer_name(t->optimizer),
                   f->key, hv, f->holds, flag);
  }
  int64_t d = t->decay_steps > 0 ? t->decay_steps : t->steps;
  if (t->schedule == IR_SCHED_WSD && (t->wsd_decay_steps < 1 || t->wsd_decay_steps > d))
    return ts_errf(err, errlen, "the WSD schedule needs its final decay's length in 1 .. %lld (the decay steps): give "
                   "--lr-wsd-decay-iters N (the plan's wsd_decay_steps is %lld)", (long long)d,
                   (long long)t->wsd_decay_steps);
  return 0;
}

/* Accepts "--opt VALUE" and "--opt=VALUE".  0, -1 (error), 1 (--help). */
static int parse_args(int argc, char **argv, Args *a) {
  memset(a, 0, sizeof *a);
  a->gpus = a->steps = a->eod_id = a->eval_iters = -1;
  a->max_tokens = a->top_k = -1;
  a->temperature = -1;
  a->top_p = -1;
  a->timeout = RT_COMM_DEFAULT_TIMEOUT;
  a->backend = RT_BACKEND_LLVM;
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i], *val = NULL;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return 1;
    if (strcmp(arg, "--quiet") == 0) { a->quiet = 1; continue; }
    if (strcmp(arg, "--async-save") == 0) { a->ckpt.async = 1; continue; }
    if (strcmp(arg, "--cpu") == 0) { a->cpu = 1; continue; }
    if (strcmp(arg, "--selftest") == 0) { a->selftest = 1; continue; }
    if (strcmp(arg, "--mock-data") == 0) { a->gpt.mock = 1; continue; }
    if (strcmp(arg, "--reset-position-ids") == 0) { a->gpt.reset_position_ids = 1; continue; }
    if (strcmp(arg, "--reset-attention-mask") == 0) { a->gpt.reset_attention_mask = 1; continue; }
    if (strcmp(arg, "--eod-mask-loss") == 0) { a->gpt.eod_mask_loss = 1; continue; }
    if (strcmp(arg, "--test") == 0) { a->eval_test = 1; continue; }
    if (strcmp(arg, "--no-prefetch") == 0) { a->no_prefetch = 1; continue; }
    if (strcmp(arg, "--generate") == 0) { a->generate = 1; continue; }
    if (strcmp(arg, "--generate-check") == 0) { a->generate = a->generate_check = 1; continue; }
    if (strcmp(arg, "--print-ids") == 0) { a->print_ids = 1; continue; }
    if (strcmp(arg, "--no-overlap-grad-reduce") == 0) { a->no_overlap = 1; continue; }
    if (strcmp(arg, "--overlap-grad-reduce") == 0) { a->no_overlap = 0; continue; }   /* Megatron's; the default */
    if (strncmp(arg, "--data-path", 11) == 0 && (arg[11] == 0 || arg[11] == '=')) {
      if (parse_data_path(argc, argv, &i, a) != 0) return -1;
      continue;
    }
    if (strncmp(arg, "--", 2) != 0) {
      if (a->plan) { fprintf(stderr, "mrun: more than one plan given ('%s' and '%s')\n", a->plan, arg); return -1; }
      a->plan = arg;
      continue;
    }
    char name[32];
    char *eq = strchr(arg, '=');
    size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
    snprintf(name, sizeof name, "%.*s", (int)(nl < 31 ? nl : 31), arg);
    if (strcmp(name, "--rampup-batch-size") == 0) {   /* Megatron's three words: START INCR SAMPLES */
      for (int k = 0; k < 3; k++) {
        char *e = NULL;
        const char *w = i + 1 < argc ? argv[++i] : NULL;
        long long v = w ? strtoll(w, &e, 10) : -1;
        if (!w || !*w || *e || v < (k == 2 ? 0 : 1)) {
          fprintf(stderr, "mrun: --rampup-batch-size takes three numbers, START INCR SAMPLES (start and increment "
                  ">= 1, samples >= 0)%s%s%s\n", w ? ", got '" : "", w ? w : "", w ? "'" : "");
          return -1;
        }
        a->rampup[k] = v;
      }
      a->rampup_set = 1;
      continue;
    }
    int hk = -1;   /* one of the optimizer and schedule flags? */
    for (int k = 0; k < HP_COUNT && hk < 0; k++)
      if (strlen(hp_flags[k].flag) == nl && strncmp(arg, hp_flags[k].flag, nl) == 0) hk = k;
    if (hk >= 0) {
      HpType ht = hp_flags[hk].type;
      if (ht == HP_ON || ht == HP_OFF) {
        if (eq) { fprintf(stderr, "mrun: %s takes no value\n", name); return -1; }
        for (int k = 0; k < HP_COUNT; k++)   /* --nesterov and --no-nesterov: the last wins */
          if (hp_flags[k].off == hp_flags[hk].off) a->hp_set[k] = 0;
      } else {
        const char *hv = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!hv) { fprintf(stderr, "mrun: %s needs a value\n", name); return -1; }
        if (hp_parse(hk, hv, &a->hp_val[hk]) != 0) return -1;
        for (int k = 0; k < HP_COUNT; k++)   /* --momentum and --sgd-momentum: one field */
          if (k != hk && hp_flags[k].off == hp_flags[hk].off) a->hp_set[k] = 0;
      }
      a->hp_set[hk] = 1;
      continue;
    }
    static const char *const valued[] = {"--gpus", "--steps", "--train-iters", "--seed", "--timeout", "--backend",
                                         "--save-params", "--data", "--metrics", "--save", "--save-interval",
                                         "--keep", "--load", "--init-from", "--export", "--format", "--hf-map",
                                         "--split", "--data-cache-path", "--eod-id", "--tokenizer", "--eval-interval",
                                         "--eval-iters", "--prompt", "--prompt-file", "--max-tokens",
                                         "--temperature", "--top-k", "--top-p", "--calibrate", "--trace", "--hw",
                                         "--dp-bucket-size", "--ddp-bucket-size", NULL};
    int known = 0;
    for (int k = 0; valued[k]; k++) known |= strlen(valued[k]) == nl && strncmp(arg, valued[k], nl) == 0;
    if (!known) { fprintf(stderr, "mrun: unknown option '%.*s'\n%s", (int)nl, arg, usage); return -1; }
    if (eq) val = eq + 1;
    else if (i + 1 < argc) val = argv[++i];
    else { fprintf(stderr, "mrun: %s needs a value\n", name); return -1; }
    int64_t v;
    if (strcmp(name, "--gpus") == 0) {
      if (parse_count(name, val, 1, 1 << 20, &a->gpus)) return -1;
    }
    else if (strcmp(name, "--calibrate") == 0) a->calibrate = val;
    else if (strcmp(name, "--steps") == 0 || strcmp(name, "--train-iters") == 0) {   /* Megatron's name */
      if (parse_count(name, val, 1, INT64_MAX / 2, &a->steps)) return -1;
    }
    else if (strcmp(name, "--seed") == 0) {
      if (parse_count(name, val, 0, INT64_MAX, &v)) return -1;
      a->seed = (uint64_t)v;
      a->has_seed = 1;
    }
    else if (strcmp(name, "--timeout") == 0) {
      char *e;
      errno = 0;
      double t = strtod(val, &e);
      if (!*val || *e || errno || !(t > 0) || t > 1e6) {
        fprintf(stderr, "mrun: --timeout needs seconds > 0, got '%s'\n", val);
        return -1;
      }
      a->timeout = t;
    }
    else if (strcmp(name, "--backend") == 0) {
      if (strcmp(val, "llvm") == 0) a->backend = RT_BACKEND_LLVM;
      else if (strcmp(val, "ref") == 0) a->backend = RT_BACKEND_REF;
      else { fprintf(stderr, "mrun: --backend must be llvm or ref, got '%s'\n", val); return -1; }
    }
    else if (strcmp(name, "--save-params") == 0) a->save_params = val;
    else if (strcmp(name, "--save") == 0) a->ckpt.save_dir = val;
    else if (strcmp(name, "--load") == 0) a->ckpt.load_dir = val;
    else if (strcmp(name, "--init-from") == 0) a->init_from = val;
    else if (strcmp(name, "--export") == 0) a->export_dir = val;
    else if (strcmp(name, "--format") == 0) a->format = val;
    else if (strcmp(name, "--hf-map") == 0) a->hf_map = val;
    else if (strcmp(name, "--save-interval") == 0) {
      if (parse_count(name, val, 1, INT64_MAX / 2, &a->ckpt.save_interval)) return -1;
    } else if (strcmp(name, "--keep") == 0) {
      if (parse_count(name, val, 1, 1 << 20, &v)) return -1;
      a->ckpt.keep = (int)v;
    }
    else if (strcmp(name, "--data") == 0) a->data = val;
    else if (strcmp(name, "--split") == 0) {
      double w[RT_SPLIT_COUNT];
      char why[256];
      if (rt_gpt_split_parse(val, w, why, sizeof why) != 0) { fprintf(stderr, "mrun: --split %s\n", why); return -1; }
      a->gpt.split = val;
      a->has_split = 1;
    }
    else if (strcmp(name, "--data-cache-path") == 0) a->gpt.cache_dir = val;
    else if (strcmp(name, "--eod-id") == 0) {
      if (parse_count(name, val, 0, INT32_MAX, &a->eod_id)) return -1;
    }
    else if (strcmp(name, "--tokenizer") == 0) a->tokenizer = val;
    else if (strcmp(name, "--eval-interval") == 0) {
      if (parse_count(name, val, 1, INT64_MAX / 2, &a->eval_interval)) return -1;
    } else if (strcmp(name, "--eval-iters") == 0) {
      if (parse_count(name, val, 0, 1 << 30, &a->eval_iters)) return -1;
    }
    else if (strcmp(name, "--metrics") == 0) a->metrics = val;
    else if (strcmp(name, "--trace") == 0) a->trace = val;
    else if (strcmp(name, "--hw") == 0) {
      char herr[1024];
      a->hw = val;
      if (hw_load(val, &a->hwd, herr, sizeof herr) != 0) { fprintf(stderr, "mrun: --hw: %s\n", herr); return -1; }
    }
    else if (strcmp(name, "--dp-bucket-size") == 0) {
      if (parse_count(name, val, 1, (int64_t)1 << 47, &a->dp_bucket_bytes)) return -1;
    } else if (strcmp(name, "--ddp-bucket-size") == 0) {   /* Megatron's, in elements */
      if (parse_count(name, val, 1, (int64_t)1 << 47, &a->dp_bucket_elems)) return -1;
    }
    else if (strcmp(name, "--prompt") == 0) a->prompt = val;
    else if (strcmp(name, "--prompt-file") == 0) a->prompt_file = val;
    else if (strcmp(name, "--max-tokens") == 0) {
      if (parse_count(name, val, 0, 1 << 30, &a->max_tokens)) return -1;
    } else if (strcmp(name, "--top-k") == 0) {
      if (parse_count(name, val, 0, 1 << 30, &a->top_k)) return -1;
    } else if (strcmp(name, "--temperature") == 0 || strcmp(name, "--top-p") == 0) {
      char *e;
      errno = 0;
      double t = strtod(val, &e);
      int top = name[2] == 't' && name[3] == 'o';
      if (!*val || *e || errno || !isfinite(t) || t < 0 || (top && (t <= 0 || t > 1)) || t > 1e6) {
        fprintf(stderr, "mrun: %s needs %s, got '%s'\n", name, top ? "a probability in (0, 1]" : "a number >= 0 (0: greedy)", val);
        return -1;
      }
      if (top) a->top_p = t;
      else a->temperature = t;
    }
    else { fprintf(stderr, "mrun: unknown option '%s'\n%s", name, usage); return -1; }
  }
  if ((a->ckpt.save_interval || a->ckpt.keep || a->ckpt.async) && !a->ckpt.save_dir) {
    fprintf(stderr, "mrun: --save-interval, --keep and --async-save go with --save DIR\n");
    return -1;
  }
  if (a->format && strcmp(a->format, "hf") != 0) {
    fprintf(stderr, "mrun: --format %s: the one export format is hf (Hugging Face safetensors and config.json)\n", a->format);
    return -1;
  }
  if (a->format && !a->export_dir) { fprintf(stderr, "mrun: --format goes with --export DIR\n"); return -1; }
  if (a->hf_map && !a->init_from && !a->export_dir) {
    fprintf(stderr, "mrun: --hf-map goes with --init-from PATH or --export DIR\n");
    return -1;
  }
  if (a->init_from && a->ckpt.load_dir) {
    fprintf(stderr, "mrun: --load resumes a checkpoint with its own weights; --init-from starts from Hugging Face "
            "weights: give one\n");
    return -1;
  }
  if (check_generate_args(a) != 0) return -1;
  if (a->selftest && a->plan) { fprintf(stderr, "mrun: --selftest takes no plan (got '%s')\n", a->plan); return -1; }
  if (a->calibrate) {
    if (a->plan || a->selftest) {
      fprintf(stderr, "mrun: --calibrate FILE measures this host and writes a hardware description; it takes no plan "
              "and no --selftest\n");
      return -1;
    }
    return 0;
  }
  if (a->trace && ((a->metrics && same_path(a->trace, a->metrics)) || (a->save_params && same_path(a->trace, a->save_params)))) {
    fprintf(stderr, "mrun: --trace names '%s', which --metrics or --save-params writes too: each needs a file of its own\n",
            a->trace);
    return -1;
  }
  if (a->metrics && a->save_params && same_path(a->metrics, a->save_params)) {
    fprintf(stderr, "mrun: --metrics and --save-params both name '%s': each needs a file of its own\n", a->metrics);
    return -1;
  }
  if (check_data_args(a) != 0 || check_eval_args(a) != 0) return -1;
  if (eod_args(a) != 0) return -1;
  if (!a->plan && !a->selftest) {
    fprintf(stderr, "mrun: no plan given%s\n%s", a->gpt.n ? " (--data-path takes every word after it up to the next "
            "option: put PLAN before --data-path)" : "", usage);
    return -1;
  }
  return 0;
}

/* Is the text an IR module (after comments and blank lines)? */
static int is_module_text(const char *s) {
  for (;;) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    if (*s != '#') break;
    s += strcspn(s, "\n");
  }
  return strncmp(s, "module ", 7) == 0;
}

/* Loads PATH as a plan, or as a one-rank plan around a bare IR module. */
static Plan *load_plan(const char *path, char *err, size_t errlen) {
  size_t len = 0;
  char *text = plan_read_bytes(path, &len, err, errlen);
  if (!text) return NULL;
  int bare = strlen(text) == len && is_module_text(text);
  Plan *p = NULL;
  if (bare) {
    IrModule *m = ir_parse_module(text, path, err, errlen);
    /* the training rules a plan's programs are held to (every gradient
     * accumulated once per micro batch, zeroed once per step, ...) hold
     * for a bare module too: a deleted `zero @grad` line is refused here as
     * in a plan, not trained with gradients that add up over the steps */
    char verr[1024];
    if (m && ir_verify_training(m, verr, sizeof verr) != 0) {
      ts_errf(err, errlen, "'%s' (an IR module) is invalid: %s", path, verr);
      ir_module_free(m);
      m = NULL;
    }
    if (m) {
      p = plan_new();
      p->version = PLAN_VERSION;
      /* the module says what mesh it was sharded for */
      p->mesh = (PlanMesh){ir_axis_size(m, IR_AXIS_DP), ir_axis_size(m, IR_AXIS_PP), ir_axis_size(m, IR_AXIS_CP),
                         ir_axis_size(m, IR_AXIS_EP), ir_axis_size(m, IR_AXIS_TP)};
      p->nprograms = 1;
      p->programs = ts_xcalloc(1, sizeof *p->programs);
      p->programs[0] = m;
      p->nranks = 1;
      p->rank_program = ts_xcalloc(1, sizeof *p->rank_program);
    }
  }
  if (!bare) p = plan_from_bytes(text, len, path, err, errlen);
  free(text);
  return p;
}

static int under_launcher(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL;
}

/* 1 when a pipeline program's schedule can run dp's micro batches per dp
 * rank: the same generator and checker the trainer regenerates it with
 * (runtime/exec/train.c), and mcc compiled it with; why gets the reason. */
static int pipeline_runs_at(const IrModule *m, PipeSchedKind kind, int dp, char *why, size_t whylen) {
  int nmicro = 0, vpp = m->par.vpp > 1 ? m->par.vpp : 1;
  PipeSchedule s;
  memset(&s, 0, sizeof s);
  int ok = plan_pipe_nmicro(&m->train, dp, &nmicro, why, whylen) == 0 &&
           plan_pipe_schedule(kind, ir_axis_size(m, IR_AXIS_PP), vpp, nmicro, &s, why, whylen) == 0 &&
           plan_pipe_check(&s, why, whylen) == 0;
  plan_pipe_schedule_free(&s);
  return ok;
}

/* A pipeline plan runs at any dp (each rank's program is respecialized
 * like any other, prepare()) whose micro batches per dp rank, global_batch
 * / (micro_batch x dp), its schedule can run: 1f1b and zb-h1 need at least
 * pp of them, interleaved a multiple of pp.  -1 with the numbers and the
 * --gpus values that work (per = ranks of one dp replica). */
static int check_pipeline_dp(const Plan *plan, const PlanMesh *mesh, int64_t per, const char *given, char *err,
                             size_t errlen) {
  const IrModule *m = NULL;
  for (int i = 0; i < plan->nprograms && !m; i++)
    if (ir_axis_size(plan->programs[i], IR_AXIS_PP) > 1) m = plan->programs[i];
  if (!m) return 0;
  PipeSchedKind kind;
  if (plan_pipe_program_sched(&m->par, &kind) != 0)
    /* the plan decoder refuses a schedule out of range (bad pipeline fields) */
    return ts_errf(err, errlen, "the plan's pipeline schedule %d is not one this mrun knows (a plan from a newer "
                   "mcc?)", m->par.sched);   /* internal */
  char why[512];
  if (pipeline_runs_at(m, kind, mesh->dp, why, sizeof why)) return 0;
  /* the dp values that divide the step's micro batches and that the
   * schedule can run */
  const IrTrain *t = &m->train;
  int64_t total = t->micro_batch > 0 ? t->global_batch / t->micro_batch : 0;
  StrBuf ok = {0};
  int nok = 0;
  for (int64_t d = 1; d <= total && d <= (1 << 20) && nok < 8; d++) {
    char w2[512];
    if (total % d != 0 || !pipeline_runs_at(m, kind, (int)d, w2, sizeof w2)) continue;
    sb_printf(&ok, "%s%lld", nok ? ", " : "", (long long)(d * per));
    nok++;
  }
  ts_errf(err, errlen, "%s gives dp=%d, so each dp rank runs global_batch %lld / (micro_batch %lld x dp %d) "
          "micro batches per step, which the plan's pipeline (pp=%d, vpp=%d, --schedule %s) cannot run: %s. %s%s",
          given, mesh->dp, (long long)t->global_batch, (long long)t->micro_batch, mesh->dp,
          ir_axis_size(m, IR_AXIS_PP), m->par.vpp > 1 ? m->par.vpp : 1, plan_pipe_sched_name(kind), why,
          !nok ? "No rank count works with this global_batch and micro_batch"
          : under_launcher() ? "The mpirun -np values that work: " : "The --gpus values that work: ",
          nok ? ok.p : "");
  sb_free(&ok);
  return -1;
}

/* How the user chose the run's n ranks, in their own terms, for the
 * messages of mesh_for: "--gpus 3", "mpirun -np 3" (under a launcher),
 * "1 rank (no --gpus given)". */
static const char *ranks_given(const Args *a, int64_t n, char *buf, size_t len) {
  if (under_launcher()) snprintf(buf, len, "mpirun -np %lld", (long long)n);
  else if (a->gpus >= 1) snprintf(buf, len, "--gpus %lld", (long long)n);
  else snprintf(buf, len, "1 rank (no --gpus given)");
  return buf;
}

/* dp for n ranks of the plan's mesh; -1 with a message if n does not
 * divide.  *mesh gets the run's mesh; given says how the user chose n
 * (ranks_given). */
static int mesh_for(const Plan *plan, const Args *a, int64_t n, const char *given, PlanMesh *mesh, char *err,
                    size_t errlen) {
  PlanMesh m = plan->mesh;
  int64_t per = 1;
  int s[4] = {m.tp, m.pp, m.cp, m.ep};
  for (int i = 0; i < 4; i++) per *= s[i] < 1 ? 1 : s[i];
  if (n < 1 || n % per != 0)
    return ts_errf(err, errlen, "%s does not divide into the plan's mesh: tp=%d x pp=%d x cp=%d x ep=%d "
                   "= %lld ranks per data-parallel replica (use a multiple of %lld: %s %lld)",
                   given, m.tp < 1 ? 1 : m.tp, m.pp < 1 ? 1 : m.pp, m.cp < 1 ? 1 : m.cp,
                   m.ep < 1 ? 1 : m.ep, (long long)per, (long long)per, under_launcher() ? "mpirun -np" : "--gpus",
                   (long long)per);
  m.dp = (int)(n / per);
  /* each dp rank runs whole micro batches (the trainer checks it too, but
   * only after N processes have started) */
  const IrTrain *tr = plan->nprograms > 0 ? &plan->programs[0]->train : NULL;
  if (tr && tr->micro_batch > 0 && tr->global_batch > 0 && tr->global_batch % tr->micro_batch == 0 &&
      (tr->global_batch / tr->micro_batch) % m.dp != 0)
    return ts_errf(err, errlen, "%s gives dp = %lld / %lld = %d, which does not divide the %lld micro "
                   "batches of a step (global_batch %lld / micro_batch %lld): each dp rank runs whole micro "
                   "batches", given, (long long)n, (long long)per, m.dp,
                   (long long)(tr->global_batch / tr->micro_batch), (long long)tr->global_batch,
                   (long long)tr->micro_batch);
  if (tr && (ir_train_rampup(tr) || a->rampup_set)) {   /* and every batch of the ramp-up */
    IrTrain t = *tr;
    if (a->rampup_set) t.rampup_start = a->rampup[0], t.rampup_incr = a->rampup[1], t.rampup_samples = a->rampup[2];
    char why[768];
    if (ir_train_rampup(&t) && ir_train_rampup_check(&t, t.micro_batch * m.dp, why, sizeof why) != 0)
      return ts_errf(err, errlen, "%s gives dp = %d: %s", given, m.dp, why);
    for (int i = 0; i < plan->nprograms; i++) {   /* a pipeline runs each batch's count of micro batches */
      const IrModule *pm = plan->programs[i];
      PipeSchedKind kind;
      if (ir_axis_size(pm, IR_AXIS_PP) < 2 || plan_pipe_program_sched(&pm->par, &kind) != 0) continue;
      if (plan_pipe_ramp_check(&t, kind, ir_axis_size(pm, IR_AXIS_PP), pm->par.vpp > 1 ? pm->par.vpp : 1, m.dp, why,
                               sizeof why) != 0)
        return ts_errf(err, errlen, "%s gives dp = %d: %s", given, m.dp, why);
      break;
    }
  }
  if (check_pipeline_dp(plan, &m, per, given, err, errlen) != 0) return -1;
  *mesh = m;
  return 0;
}

static const char *sig_name(int sig) {
  static char buf[32];
  switch (sig) {
  case SIGINT: return "SIGINT";
  case SIGTERM: return "SIGTERM";
  case SIGHUP: return "SIGHUP";
  case SIGKILL: return "SIGKILL";
  case SIGSEGV: return "SIGSEGV";
  case SIGABRT: return "SIGABRT";
  case SIGBUS: return "SIGBUS";
  default: snprintf(buf, sizeof buf, "signal %d", sig); return buf;
  }
}

/* The launcher (mrun --gpus N > 1 outside MPI): runs this binary under
 * mpirun as a child and stays to
 *   - pass SIGINT / SIGTERM / SIGHUP on to mpirun (which passes them to
 *     every rank: they stop after the same step, train.h);
 *   - say which rank died, in which step and by which signal (each rank
 *     writes its step to a status file; Open MPI's "exited on signal"
 *     line gives the signal);
 *   - remove what the job left: Open MPI's shared-memory segments and
 *     session files are put in a job directory of their own (under
 *     /dev/shm), removed when mpirun ends, however it ends.
 * Returns the exit status (mpirun's; 128 + signal when stopped by one).
 * The signal goes to the ranks themselves (their pids are in their status
 * files), so they stop after the step under way: mpirun would end them
 * with SIGTERM and then SIGKILL.  Before any rank has started, or for a
 * second signal, it goes to mpirun, which ends the job. */
static volatile sig_atomic_t got_sig, ngot;

static void note_sig(int sig) {
  got_sig = sig;
  ngot++;
}

/* Passes signal sig to every rank with a status file in job (to mpirun
 * when none has one, or when `to_mpirun`). */
static void pass_signal(const char *job, int64_t n, pid_t mpirun, int sig, int to_mpirun) {
  int sent = 0;
  for (int64_t r = 0; r < n && !to_mpirun; r++) {
    char path[PATH_MAX + 32], what[16];
    long long step;
    long pid = 0;
    snprintf(path, sizeof path, "%s/rank.%lld", job, (long long)r);
    FILE *f = fopen(path, "r");
    if (f && fscanf(f, "%15s %lld %ld", what, &step, &pid) == 3 && pid > 1 && kill((pid_t)pid, sig) == 0) sent++;
    if (f) fclose(f);
  }
  if (!sent) kill(mpirun, sig);
}

/* rm -rf of the job directory (only what the job made: plain files and
 * directories, no symlinks followed) */
static void remove_tree(const char *dir) {
  pid_t p = fork();
  if (p == 0) {
    execlp("rm", "rm", "-rf", "--one-file-system", "--", dir, (char *)NULL);
    _exit(127);
  }
  int st;
  if (p > 0) while (waitpid(p, &st, 0) < 0 && errno == EINTR) {}
}

/* A job directory names its owners in job/owner: "HOST LAUNCHER-PID
 * MPIRUN-PID".  A launcher killed with SIGKILL cannot remove its directory
 * (MPI's shared-memory segments: megabytes in /dev/shm); the next launcher
 * removes every job directory of this host whose launcher and mpirun are
 * both gone. */
static void write_job_owner(const char *job, pid_t mpirun_pid) {
  char path[PATH_MAX + 16], host[256] = "?", tmp[PATH_MAX + 32];
  gethostname(host, sizeof host - 1);
  snprintf(path, sizeof path, "%s/owner", job);
  snprintf(tmp, sizeof tmp, "%s/owner.tmp", job);
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  fprintf(f, "%s %ld %ld\n", host, (long)getpid(), (long)mpirun_pid);
  if (fclose(f) == 0) rename(tmp, path);
}

/* No such process, or only its zombie (its parent died with it unreaped). */
static int pid_gone(long pid) {
  if (pid <= 0) return 0;
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = 0;
  const char *c = strrchr(stat, ')');   /* "PID (COMM) STATE ..." */
  return c && c[1] == ' ' && c[2] == 'Z';
}

static void clean_stale_jobs(const char *base) {
  DIR *d = opendir(base);
  if (!d) return;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "tessera-mrun.", 13) != 0) continue;
    char dir[PATH_MAX], path[PATH_MAX + 16], h[256];
    snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
    snprintf(path, sizeof path, "%s/owner", dir);
    FILE *f = fopen(path, "r");
    if (!f) continue;   /* being made, or not ours to judge */
    long lp = 0, mp = 0;
    int ok = fscanf(f, "%255s %ld %ld", h, &lp, &mp) == 3;
    fclose(f);
    if (ok && !strcmp(h, host) && pid_gone(lp) && pid_gone(mp)) remove_tree(dir);
  }
  closedir(d);
}

/* "rank R ... exited on signal S" in mpirun's output: S for rank r, else 0 */
static int mpirun_signal_of(const char *log, int r) {
  char key[64];
  snprintf(key, sizeof key, "process rank %d ", r);
  const char *p = log ? strstr(log, key) : NULL;
  const char *e = p ? strstr(p, "exited on signal ") : NULL;
  return e && e - p < 200 ? atoi(e + strlen("exited on signal ")) : 0;
}

static int launch(int64_t n, char **argv) {
  char self[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
  if (l <= 0) { fprintf(stderr, "mrun: cannot find my own binary: %s\n", strerror(errno)); return 1; }
  self[l] = 0;
  int argc = 0;
  while (argv[argc]) argc++;
  char np[32];
  snprintf(np, sizeof np, "%lld", (long long)n);
  char **av = ts_xcalloc((size_t)argc + 12, sizeof *av);
  int k = 0;
  av[k++] = "mpirun";
  av[k++] = "-np";
  av[k++] = np;
  av[k++] = "--oversubscribe";
  if (getuid() == 0) av[k++] = "--allow-run-as-root";
  av[k++] = "--bind-to";
  av[k++] = "none";
  av[k++] = self;
  for (int i = 1; i < argc; i++) av[k++] = argv[i];
  av[k] = NULL;
  /* the job directory: /dev/shm where it exists (Open MPI's default place
   * for its segments), else the temporary directory */
  const char *base = getenv("TS_MRUN_JOB_BASE");
  if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  clean_stale_jobs(base);
  char job[PATH_MAX];
  snprintf(job, sizeof job, "%s/tessera-mrun.XXXXXX", base);
  if (!mkdtemp(job)) {
    fprintf(stderr, "mrun: cannot make a job directory in %s: %s\n", base, strerror(errno));
    free(av);
    return 1;
  }
  char logpath[PATH_MAX + 16];
  snprintf(logpath, sizeof logpath, "%s/mpirun.err", job);
  setenv("TS_MRUN_LAUNCHED", "1", 1);
  setenv("TS_MRUN_STATUS_DIR", job, 1);
  setenv("OMPI_MCA_btl_vader_backing_directory", job, 0);
  setenv("OMPI_MCA_orte_tmpdir_base", job, 0);
  /* Ranks share the cores: waiting ranks must yield (Open MPI) and BLAS
   * must not start a thread per core in every rank. */
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  setenv("TS_THREADS", "1", 0);   /* the same for the generated kernels' pool */
  fflush(NULL);
  /* mpirun's stderr goes through a pipe: copied to ours as it comes, and
   * kept (its "exited on signal" lines) */
  int pfd[2];
  if (pipe(pfd) != 0) {
    fprintf(stderr, "mrun: cannot start %lld ranks: pipe: %s\n", (long long)n, strerror(errno));
    remove_tree(job);
    free(av);
    return 1;
  }
  struct sigaction sa, old[3];
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = note_sig;   /* no SA_RESTART: the read below wakes up to pass it on */
  sigemptyset(&sa.sa_mask);
  const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, &old[i]);
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
    setpgid(0, 0);   /* a terminal's Ctrl-C reaches mrun, which passes it on once */
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    execvp("mpirun", av);
    av[0] = "mpiexec";   /* the same launcher under its MPI-standard name */
    execvp("mpiexec", av);
    fprintf(stderr, "mrun: cannot start %lld ranks with mpirun: %s (is Open MPI installed and on PATH?)\n",
            (long long)n, strerror(errno));
    _exit(127);
  }
  free(av);
  close(pfd[1]);
  if (pid < 0) {
    fprintf(stderr, "mrun: cannot start %lld ranks: fork: %s\n", (long long)n, strerror(errno));
    close(pfd[0]);
    remove_tree(job);
    return 1;
  }
  write_job_owner(job, pid);
  StrBuf log = {0};
  char buf[4096];
  int passed = 0, stop_sig = 0;
  for (;;) {
    if (ngot > passed) {   /* SIGINT / SIGTERM / SIGHUP: on to the ranks (a second one: to mpirun) */
      stop_sig = got_sig;
      pass_signal(job, n, pid, got_sig, passed > 0);
      passed = ngot;
    }
    ssize_t r = read(pfd[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (write(2, buf, (size_t)r) < 0) { /* our stderr is gone: keep reading */ }
    if (log.n < (1u << 20)) sb_write(&log, buf, (size_t)r);
  }
  close(pfd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  for (int i = 0; i < 3; i++) sigaction(sigs[i], &old[i], NULL);
  int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  /* which step each rank reached; a rank still "in step S" died there */
  int dead = 0;
  for (int64_t r = 0; r < n && rc != 0; r++) {
    char path[PATH_MAX + 32], what[16] = "";
    long long step = 0;
    snprintf(path, sizeof path, "%s/rank.%lld", job, (long long)r);
    FILE *f = fopen(path, "r");
    int got = f ? fscanf(f, "%15s %lld", what, &step) : 0;
    if (f) fclose(f);
    if (got != 2 || strcmp(what, "step") != 0) continue;   /* done, stopped or failed on its own terms */
    int sig = mpirun_signal_of(log.p, (int)r);
    if (!sig) continue;   /* stopped by the job's end, not dead on its own */
    fprintf(stderr, "mrun: rank %lld was killed by %s in step %lld\n", (long long)r, sig_name(sig), step);
    dead++;
  }
  sb_free(&log);
  remove_tree(job);
  return stop_sig && (rc == 0 || rc < 128) ? 128 + stop_sig : rc;
}

/* The program rank `rank` (of `mesh`) runs: the plan's program for the
 * same coordinates, with the dp coordinate folded onto the plan's dp (one
 * plan runs at any dp); *index gets its index in the plan.  NULL with a
 * message. */
static IrModule *pick_program(Plan *plan, const PlanMesh *mesh, int rank, int *index, char *err, size_t errlen) {
  int c[RT_AXIS_COUNT];
  if (rt_mesh_coords(mesh, rank, c) != 0) { ts_errf(err, errlen, "rank %d is outside the mesh", rank); return NULL; }  /* internal */
  int pdp = plan->mesh.dp < 1 ? 1 : plan->mesh.dp;
  c[RT_AXIS_DP] %= pdp;
  int pr = rt_mesh_rank(&plan->mesh, c);
  if (plan->nranks < 1 || !plan->rank_program) {   /* plan_read refuses a plan without ranks: a second guard */
    ts_errf(err, errlen, "the plan has no ranks");   /* internal */
    return NULL;
  }
  if (pr < 0 || pr >= plan->nranks) pr = pr < 0 ? 0 : pr % plan->nranks;
  int pi = plan->rank_program[pr];
  if (pi < 0 || pi >= plan->nprograms) { ts_errf(err, errlen, "the plan has no program for rank %d", pr); return NULL; }
  *index = pi;
  return plan->programs[pi];
}

/* Prepares rank `rank`'s program: picks it (*index: its index in the
 * plan), respecializes it for the run's dp, applies --steps / --seed,
 * verifies it.  NULL with a message. */
static IrModule *prepare(Plan *plan, const PlanMesh *mesh, int rank, const Args *a, int *index, char *err,
                         size_t errlen) {
  IrModule *m = pick_program(plan, mesh, rank, index, err, errlen);
  if (!m) return NULL;
  char why[1536];
  /* a plan from another build or edited by hand: refuse it with the
   * verifier's message rather than fail somewhere inside a kernel */
  if (ir_verify(m, why, sizeof why) != 0) {   /* plan_read verifies every program first: a second guard */
    ts_errf(err, errlen, "%s: the program is invalid: %s", a->plan, why);   /* internal */
    return NULL;
  }
  if (ir_axis_size(m, IR_AXIS_DP) != mesh->dp) {
    if (pass_respecialize_dp(m, mesh->dp, why, sizeof why) != 0) {
      ts_errf(err, errlen, "%s was compiled for dp=%d; running it at dp=%d failed: %s", a->plan,
              ir_axis_size(m, IR_AXIS_DP), mesh->dp, why);
      return NULL;
    }
  }
  if (a->generate && (ir_block_find(m, "prefill") < 0 || ir_block_find(m, "step") < 0)) {
    /* a plan compiled without mcc --decode: the same pass, here */
    PassCtx cx;
    pass_ctx_init(&cx);
    cx.decode = 1;
    int bad = pass_decode(m, &cx) != 0;
    if (bad) snprintf(why, sizeof why, "%.1500s", cx.err);
    pass_ctx_free(&cx);
    if (!bad && ir_verify(m, why, sizeof why) != 0) bad = 1;
    if (bad) { ts_errf(err, errlen, "%s: --generate: %s", a->plan, why); return NULL; }
  }
  if (a->steps >= 0) m->train.steps = a->steps;   /* decay_steps 0 follows it */
  if (a->has_seed) m->train.seed = a->seed;
  if (hp_apply(m, a, why, sizeof why) != 0) { ts_errf(err, errlen, "%s", why); return NULL; }
  return m;
}

/* ---- GPU ranks ---- */

/* How many CUDA devices the ranks may use: 0 for CPU ranks (--cpu,
 * --backend ref, no driver or no device).  With `say`, one line on stderr
 * when the ranks are CPU ranks, saying why. */
static int gpus_usable(const Args *a, int nranks, int say) {
  char msg[256] = "";
  const char *why = NULL;
  int n = 0;
  if (a->cpu) why = "--cpu";
  else if (a->backend == RT_BACKEND_REF) why = "--backend ref runs on the CPU";
  else if ((n = rt_dev_cuda_count(msg, sizeof msg)) <= 0) {
    n = 0;
    why = msg;
  }
  if (say && why) fprintf(stderr, "mrun: %s; using %d CPU rank%s\n", why, nranks, nranks == 1 ? "" : "s");
  return n;
}

/* The rank's index among the ranks on its node: the launcher's, else the
 * world rank (one node). */
static int local_rank(int world_rank) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    char *e;
    long r = v ? strtol(v, &e, 10) : -1;
    if (v && *v && !*e && r >= 0 && r < INT_MAX) return (int)r;
  }
  return world_rank;
}

/* The plan's image of program pi for arch sm: the exact one (cubin and
 * PTX; *exact = 1), else the one of the newest older arch that has PTX
 * (the driver JIT-compiles it; *exact = 0), else NULL. */
static const PlanImage *image_for(const Plan *plan, int pi, int sm, int *exact) {
  const PlanImage *im = plan_image(plan, pi, sm);
  *exact = im != NULL;
  for (int i = 0; !im && i < plan->nimages; i++) {
    const PlanImage *c = &plan->images[i];
    if (c->program == pi && c->sm <= sm && c->ptx && c->ptx_len) im = c;
  }
  for (int i = 0; !*exact && im && i < plan->nimages; i++) {
    const PlanImage *c = &plan->images[i];
    if (c->program == pi && c->sm <= sm && c->sm > im->sm && c->ptx && c->ptx_len) im = c;
  }
  return im;
}

/* A rank on a GPU: the device and what its program's module is loaded
 * from (the plan's binary; the source it was compiled from, rebuilt). */
typedef struct {
  RtDev *dev;
  RtDevImage img;
  RtCudaModule cm;
} Gpu;

/* Opens this rank's GPU (device local rank mod count) for program pi of
 * the plan (m, prepared for the run) and makes it the one rt_train's
 * programs run on.  `respecialized`: m's update block was rebuilt for
 * another dp than the plan's.  0, or -1 with a message (g->dev NULL). */
static int gpu_setup(const Args *a, const Plan *plan, int pi, const IrModule *m, int respecialized, int world_rank,
                     int count, Gpu *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  int ordinal = local_rank(world_rank) % count;
  char why[512];
  RtDev *d = rt_dev_cuda_open(ordinal, why, sizeof why);
  if (!d)
    return ts_errf(err, errlen, "rank %d: opening GPU %d: %s (--cpu runs on CPU ranks)", world_rank, ordinal, why);
  int exact = 0;
  const PlanImage *im = d->sm > 0 ? image_for(plan, pi, d->sm, &exact) : NULL;
  if (!im && d->sm > 0 && !cg_nvrtc_available(why, sizeof why)) {
    ts_errf(err, errlen, "%s: the plan has no cubin/PTX for sm_%d, the arch of GPU %d, and NVRTC cannot compile it "
            "here (%s); recompile with mcc --target sm_%d", a->plan, d->sm, ordinal, why, d->sm);
    d->ops->close(d);
    return -1;
  }
  if (!im && d->sm <= 0) {
    ts_errf(err, errlen, "%s: the architecture of %s is unknown, so no image of the plan can be chosen", a->plan,
            d->label);
    d->ops->close(d);
    return -1;
  }
  /* the image must be of the module this run builds from the program */
  if (rt_cuda_module_build(m, &g->cm, why, sizeof why) != 0) {
    ts_errf(err, errlen, "%s: program %d has no CUDA form: %s", a->plan, pi, why);
    d->ops->close(d);
    return -1;
  }
  if (!im) {   /* no image for this arch or an older one: NVRTC compiles the source when the module loads */
    if (world_rank == 0)
      fprintf(stderr, "mrun: %s has no cubin or PTX for sm_%d (mcc --target sm_%d would add one): compiling its CUDA "
              "source for GPU %d with NVRTC\n", a->plan, d->sm, d->sm, ordinal);
  } else if (g->cm.hash != im->source_hash) {
    if (respecialized)
      ts_errf(err, errlen, "%s: the plan's CUDA image is for dp=%d and this run has dp=%d; recompile with mcc --dp %d "
              "--target sm_%d", a->plan, plan->mesh.dp < 1 ? 1 : plan->mesh.dp, ir_axis_size(m, IR_AXIS_DP),
              ir_axis_size(m, IR_AXIS_DP), d->sm);
    else
      ts_errf(err, errlen, "%s: the plan's CUDA image (sm_%d) was compiled from another module than its program %d "
              "(a plan from another build, or TS_CUDA_EXACT set for one of mcc and mrun only?); recompile with mcc --target sm_%d", a->plan, im->sm, pi, d->sm);
    rt_cuda_module_free(&g->cm);
    d->ops->close(d);
    return -1;
  }
  g->dev = d;
  g->img = im ? (RtDevImage){g->cm.src.p, im->ptx, exact ? im->cubin : NULL, exact ? im->cubin_len : 0, exact ? im->sm : 0}
              : (RtDevImage){g->cm.src.p, NULL, NULL, 0, 0};
  RtExecOpts xo = {.backend = RT_BACKEND_LLVM, .dev = d, .image = &g->img};
  rt_exec_set_default(&xo);
  return 0;
}

static void gpu_close(Gpu *g) {
  if (!g->dev) return;
  RtExecOpts xo = {.backend = RT_BACKEND_LLVM};
  rt_exec_set_default(&xo);
  g->dev->ops->close(g->dev);
  g->dev = NULL;
  rt_cuda_module_free(&g->cm);
}

/* mrun --selftest: on GPU 0, or one line saying there is none. */
static int run_selftest(void) {
  char msg[512];
  int n = rt_dev_cuda_count(msg, sizeof msg);
  if (n <= 0) {
    printf("mrun --selftest: %s: nothing to test; the CUDA path has been checked here only under emulation "
           "(ctest -L cuda)\n", msg);
    return 1;
  }
  RtDev *d = rt_dev_cuda_open(0, msg, sizeof msg);
  if (!d) { fprintf(stderr, "mrun --selftest: opening GPU 0: %s\n", msg); return 1; }
  int failures = 0;
  int rc = rt_selftest(d, &rt_selftest_gpt, stdout, &failures, msg, sizeof msg);
  d->ops->close(d);
  if (rc != 0) { fprintf(stderr, "mrun --selftest: %s\n", msg); return 1; }
  return failures ? 1 : 0;
}

/* A run a signal stopped: one line saying after which step, and the exit
 * status 128 + signal (0 for a run that ended).  Ranks under mrun's
 * launcher exit 0 (the launcher gives the status, without mpirun's
 * report of a failed process). */
static int stopped(const RtTrainResult *res, const IrModule *m, const char *save_dir, int print) {
  if (!res->stopped_by) return 0;
  if (print)
    fprintf(stderr, "mrun: stopped by %s after step %lld of %lld (the metrics of every step done are written%s%s)\n",
            sig_name(res->stopped_by), (long long)res->steps, (long long)m->train.steps,
            res->saved && save_dir ? "; its checkpoint is in " : "", res->saved && save_dir ? save_dir : "");
  return getenv("TS_MRUN_STATUS_DIR") ? 0 : 128 + res->stopped_by;
}

static void print_done(const Args *a, const RtTrainResult *res) {
  if (!a->quiet && res->steps > res->resumed_from)
    printf("mrun: trained %lld steps%s: loss %.4f -> %.4f%s\n", (long long)(res->steps - res->resumed_from),
           res->resumed_from ? " after the checkpoint" : "", res->first_loss, res->last_loss,
           res->saved ? (res->saved > 1 ? "; checkpoints saved" : "; checkpoint saved") : "");
  if (!a->quiet && res->timed_saves > 0)
    printf("mrun: %lld checkpoint%s during training (%s): training waited %.3f s per save%s", (long long)res->timed_saves,
           res->timed_saves > 1 ? "s" : "", a->ckpt.async ? "asynchronous" : "synchronous",
           res->save_stall_s / (double)res->timed_saves, a->ckpt.async ? "" : "\n");
  if (!a->quiet && res->dp_buckets > 0)
    printf("mrun: dp reduction: %lld buckets (%lld gradients) issued during the last micro batch's backward; "
           "posting them took %.3f ms, polling them %.3f ms, and the update waited %.3f ms for them (per step: "
           "%.3f ms); %lld dp collectives waited for in the update block, %.3f ms\n", res->dp_buckets, res->dp_grads,
           res->dp_post_s * 1e3, res->dp_poll_s * 1e3, res->dp_wait_s * 1e3,
           res->steps ? res->dp_wait_s * 1e3 / (double)res->steps : 0, res->dp_blocking, res->dp_blocking_s * 1e3);
  else if (!a->quiet && res->dp_blocking > 0)
    printf("mrun: dp reduction: %lld dp collectives waited for in the update block, %.3f ms (per step: %.3f ms)\n",
           res->dp_blocking, res->dp_blocking_s * 1e3,
           res->steps ? res->dp_blocking_s * 1e3 / (double)res->steps : 0);
  if (!a->quiet && res->graphs > 0)
    printf("mrun: CUDA graphs: %d block%s captured, %lld graph launches\n", res->graphs, res->graphs > 1 ? "s" : "",
           res->graph_launches);
  if (!a->quiet && res->timed_saves > 0 && a->ckpt.async)
    printf(", of which %.3f s copying the states\n", res->save_copy_s / (double)res->timed_saves);
}

/* What --init-from and --export need: the map asked for, and every
 * program of the plan (each pipeline stage's parameters). */
static RtHfOpts hf_opts(const Args *a, const Plan *plan) {
  return (RtHfOpts){a->hf_map, (const IrModule *const *)plan->programs, plan->nprograms};
}

/* --generate's options for rt_generate: the prompt read, the tokenizer
 * loaded (gen_opts_free frees both).  0, or -1 with a message. */
static int gen_opts(const Args *a, const IrModule *m, RtGenOpts *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  g->max_tokens = a->max_tokens;
  g->temperature = a->temperature;
  g->top_k = a->top_k;
  g->top_p = a->top_p;
  g->seed = m->train.seed;
  g->check_full = a->generate_check;
  g->print_ids = a->print_ids;
  g->quiet = a->quiet;
  if (a->prompt_file) {
    size_t len = 0;
    char *t = ts_read_input(a->prompt_file, &len);
    if (!t) return ts_errf(err, errlen, "--prompt-file: cannot read '%s': %s", a->prompt_file, strerror(errno));
    g->prompt = t;
    g->prompt_len = len;
  } else {
    g->prompt = ts_xstrdup(a->prompt);
    g->prompt_len = strlen(a->prompt);
  }
  if (a->tokenizer && !(g->tok = rt_tok_load(a->tokenizer, err, errlen))) {
    free((char *)g->prompt);
    g->prompt = NULL;
    return -1;
  }
  return 0;
}
static void gen_opts_free(RtGenOpts *g) {
  free((char *)g->prompt);
  rt_tok_free((RtTokenizer *)g->tok);
}

/* A rank's peak FLOP/s for the plan's number format on --hw's description
 * (0 without --hw): what MFU divides by, as mcc --report time does. */
static double peak_flops(const Args *a, const Plan *plan, int gpu) {
  if (!a->hw || !plan || plan->nprograms < 1) return 0;
  const char *tf = getenv("TS_CUDA_TF32");
  HwFormat f = hw_format_of(ir_train_dtype(&plan->programs[0]->train), gpu && tf && *tf && strcmp(tf, "0"));
  return a->hwd.peak[f] > 0 ? a->hwd.peak[f] : a->hwd.peak[HW_FP32];
}

/* One process, no MPI. */
static int run_single(const Args *a) {
  char err[2048] = "";
  int ngpu = gpus_usable(a, 1, 1);
  Plan *plan = load_plan(a->plan, err, sizeof err);
  if (!plan) { fprintf(stderr, "mrun: %s\n", err); return 1; }
  int rc = 1, pi = 0;
  PlanMesh mesh;
  IrModule *m;
  Gpu gpu = {0};
  char given[64];
  if (mesh_for(plan, a, 1, ranks_given(a, 1, given, sizeof given), &mesh, err, sizeof err) != 0 || !(m = prepare(plan, &mesh, 0, a, &pi, err, sizeof err)) ||
      (ngpu > 0 && gpu_setup(a, plan, pi, m, plan->mesh.dp > 1, 0, ngpu, &gpu, err, sizeof err) != 0)) {
    fprintf(stderr, "mrun: %s\n", err);
    goto out;
  }
  if (gpu.dev) fprintf(stderr, "mrun: 1 GPU rank on %s\n", gpu.dev->label);  /* not a refusal */
  RtRank rank = rt_rank_single();
  rank.mesh = mesh;
  RtTrainOpts o = {.data_path = a->data, .metrics_path = a->metrics, .trace_path = a->trace, .quiet = a->quiet, .log = stdout,
                   .rank = &rank, .save_params_path = a->save_params, .ckpt = a->ckpt, .init_from = a->init_from,
                   .export_dir = a->export_dir, .hf = hf_opts(a, plan), .gpt = a->gpt};
  o.peak_flops = peak_flops(a, plan, gpu.dev != NULL);
  o.eval_interval = a->eval_interval;
  o.eval_iters = a->eval_iters;
  o.eval_test = a->eval_test;
  o.no_prefetch = a->no_prefetch;
  RtGenOpts go;
  if (a->generate && gen_opts(a, m, &go, err, sizeof err) != 0) { fprintf(stderr, "mrun: %s\n", err); goto out; }
  o.generate = a->generate ? &go : NULL;
  RtTrainResult res;
  int trc = rt_train(m, &o, &res, err, sizeof err);
  if (a->generate) gen_opts_free(&go);
  if (trc != 0) { fprintf(stderr, "mrun: %s\n", err); goto out; }
  if (a->generate) { rc = 0; goto out; }
  print_done(a, &res);
  rc = stopped(&res, m, a->ckpt.save_dir, 1);
out:
  gpu_close(&gpu);
  plan_free(plan);
  return rc;
}

/* One rank of an MPI job.  Any error ends the whole job (MPI_Abort), so no
 * rank waits for a peer that gave up. */
static int run_rank(int *argc, char ***argv, const Args *a) {
  char err[2048] = "";
  RtComm *world = rt_comm_init_mpi(argc, argv, a->timeout, err, sizeof err);
  if (!world) { fprintf(stderr, "mrun: %s\n", err); return 1; }
  int me = rt_comm_rank(world), n = rt_comm_size(world);
  if (a->gpus >= 1 && a->gpus != n)
    rt_comm_abort(world, "mrun: --gpus %lld but the MPI job has %d ranks", (long long)a->gpus, n);
  int ngpu = gpus_usable(a, n, me == 0);
  Plan *plan = load_plan(a->plan, err, sizeof err);
  if (!plan) rt_comm_abort(world, "mrun: %s", err);
  PlanMesh mesh;
  char given[64];
  if (mesh_for(plan, a, n, ranks_given(a, n, given, sizeof given), &mesh, err, sizeof err) != 0)
    rt_comm_abort(world, "mrun: %s", err);
  int pi = 0;
  IrModule *m = prepare(plan, &mesh, me, a, &pi, err, sizeof err);
  if (!m) rt_comm_abort(world, "mrun: %s", err);
  Gpu gpu = {0};
  int pdp = plan->mesh.dp < 1 ? 1 : plan->mesh.dp;
  if (ngpu > 0 && gpu_setup(a, plan, pi, m, pdp != mesh.dp, me, ngpu, &gpu, err, sizeof err) != 0)
    rt_comm_abort(world, "mrun: %s", err);
  if (me == 0 && gpu.dev)
    fprintf(stderr, "mrun: %d GPU ranks, rank 0 on %s (%d device%s per node)\n", n, gpu.dev->label, ngpu,
            ngpu == 1 ? "" : "s");  /* not a refusal */
  RtRank rank = rt_rank_single();
  rank.mesh = mesh;
  rt_mesh_coords(&mesh, me, rank.coord);
  for (int ax = 0; ax < IR_AXIS_COUNT; ax++) {
    if (rt_rank_axis_size(&rank, (IrAxis)ax) == 1) continue;
    rank.group[ax] = rt_comm_mesh_group(world, &mesh, (RtMeshAxis)ax, err, sizeof err);
    if (!rank.group[ax]) rt_comm_abort(world, "mrun: %s", err);
  }
  /* ZeRO over the data-parallel axes together (dp+cp: docs/sharding.md) */
  if (rt_rank_axes_groups(&rank, world, err, sizeof err) != 0) rt_comm_abort(world, "mrun: %s", err);
  /* on GPUs the device's collectives go through NCCL on its comm stream */
  if (gpu.dev && rt_rank_gpu_groups(&rank, gpu.dev, err, sizeof err) != 0) rt_comm_abort(world, "mrun: %s", err);
  RtTrainOpts o = {.data_path = a->data, .metrics_path = a->metrics, .trace_path = a->trace, .quiet = a->quiet, .log = stdout,
                   .rank = &rank, .world = world, .save_params_path = a->save_params,
                   .ckpt = a->ckpt, .init_from = a->init_from, .export_dir = a->export_dir, .hf = hf_opts(a, plan), .gpt = a->gpt};
  o.peak_flops = peak_flops(a, plan, gpu.dev != NULL);
  o.eval_interval = a->eval_interval;
  o.eval_iters = a->eval_iters;
  o.eval_test = a->eval_test;
  o.no_prefetch = a->no_prefetch;
  RtGenOpts go;
  if (a->generate && gen_opts(a, m, &go, err, sizeof err) != 0) rt_comm_abort(world, "mrun: %s", err);
  o.generate = a->generate ? &go : NULL;
  RtTrainResult res;
  if (rt_train(m, &o, &res, err, sizeof err) != 0) rt_comm_abort(world, "mrun: %s", err);
  if (a->generate) gen_opts_free(&go);
  if (me == 0 && !a->generate) print_done(a, &res);
  int rc = a->generate ? 0 : stopped(&res, m, a->ckpt.save_dir, me == 0);
  fflush(stdout);
  rt_rank_gpu_groups_free(&rank);   /* before the device's context */
  gpu_close(&gpu);
  rt_rank_axes_groups_free(&rank);
  for (int ax = 0; ax < IR_AXIS_COUNT; ax++) rt_comm_free(rank.group[ax]);
  plan_free(plan);
  rt_comm_free(world);   /* MPI_Finalize */
  return rc;
}

/* What parse_args allocated (--data-path's lists). */
static void args_free(Args *a) {
  free(a->dpath);
  free(a->dweight);
  a->dpath = NULL;
  a->dweight = NULL;
}

/* mrun --calibrate FILE on this rank of `world` (NULL: one rank): rank 0
 * writes the description (checked by the parser mcc uses).  Exit status. */
static int calibrate_rank(RtComm *world, const Args *a) {
  StrBuf b = {0};
  char err[1024];
  int me = world ? rt_comm_rank(world) : 0, rc = 0;
  if (rt_calibrate(world, &b, me == 0 && !a->quiet ? stderr : NULL, err, sizeof err) != 0) {
    fprintf(stderr, "mrun: --calibrate: %s\n", err);
    rc = 1;
  } else if (me == 0) {
    HwDesc hw;
    if (hw_parse(b.p ? b.p : "", a->calibrate, &hw, err, sizeof err) != 0) {
      fprintf(stderr, "mrun: --calibrate: internal error: the description does not parse: %s\n", err);  /* internal */
      rc = 1;
    } else if (ts_write_file(a->calibrate, b.p, b.n) != 0) {
      fprintf(stderr, "mrun: --calibrate: %s\n", ts_io_error());
      rc = 1;
    } else if (!a->quiet) {
      fprintf(stderr, "mrun: wrote %s (mcc --report time --hw %s)\n", a->calibrate, a->calibrate);  /* not a refusal */
    }
  }
  sb_free(&b);
  return rc;
}

/* The run parse_args asked for: its exit status. */
static int run(int argc, char **argv, Args *a) {
  if (a->selftest) return run_selftest();
  if (a->calibrate) {
    if (under_launcher()) {
      char err[1024];
      RtComm *world = rt_comm_init_mpi(&argc, &argv, a->timeout, err, sizeof err);
      if (!world) { fprintf(stderr, "mrun: %s\n", err); return 1; }
      int rc = calibrate_rank(world, a);
      rt_comm_free(world);
      return rc;
    }
    if (a->gpus > 1) return launch(a->gpus, argv);
    return calibrate_rank(NULL, a);
  }
  RtExecOpts xo = {.backend = a->backend, .dp_bucket_bytes = a->dp_bucket_elems ? -a->dp_bucket_elems : a->dp_bucket_bytes, .no_overlap = a->no_overlap};
  rt_exec_set_default(&xo);   /* what rt_train's program uses */
  if (under_launcher()) return run_rank(&argc, &argv, a);
  if (a->gpus > 1) {
    if (getenv("TS_MRUN_LAUNCHED")) {
      fprintf(stderr, "mrun: started by mpirun, but the MPI environment is missing (OMPI_COMM_WORLD_SIZE / PMI_SIZE)\n");
      return 1;
    }
    /* check what can be checked before starting N processes */
    char err[2048] = "";
    Plan *plan = load_plan(a->plan, err, sizeof err);
    PlanMesh mesh;
    char given[64];
    int ok = plan && mesh_for(plan, a, a->gpus, ranks_given(a, a->gpus, given, sizeof given), &mesh, err, sizeof err) == 0 &&
             rt_packed_check(&a->gpt, (const IrModule *const *)plan->programs, plan->nprograms, err, sizeof err) == 0;
    if (ok && a->generate && plan->nprograms > 0) {   /* one message, not one per rank after mpirun's start */
      char why[512];
      if (pass_decode_layout(plan->programs[0], why, sizeof why) != 0) {
        ok = 0;
        snprintf(err, sizeof err, "%s: --generate: %s", a->plan, why);
      }
    }
    plan_free(plan);
    if (!ok) { fprintf(stderr, "mrun: %s\n", err); return 1; }
    return launch(a->gpus, argv);
  }
  return run_single(a);
}

int main(int argc, char **argv) {
  ts_check_stdout_at_exit("mrun");
  Args a;
  int pr = parse_args(argc, argv, &a), rc;
  if (pr == 1) { fputs(usage, stdout); rc = 0; }
  else if (pr != 0) rc = 2;
  else rc = run(argc, argv, &a);
  args_free(&a);
  return rc;
}
