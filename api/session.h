/* session.h - the compile driver behind mcc and the C API (include/tessera.h).
 *
 * A ApiSession is the options of one compilation (mcc's command line, or
 * ts_session_set) and what it made.  Both clients go through the same
 * option table (api/options.c: api_opt_apply takes one option by its mcc
 * name) and the same driver (api/driver.c: frontend, layout checks, pass
 * pipeline, plan, reports), so mcc's behaviour and the library's cannot
 * drift apart.  Every diagnostic goes to s->diag (mcc: stderr; the
 * library: a memory stream the caller reads back), prefixed by s->prog;
 * nothing here exits.
 *
 * Layering: api/ uses frontend, passes, plan, codegen and runtime/exec
 * (the executor's kernel positions, which the memory report plans by);
 * no layer below includes it (tools/check_layers.sh). */
#ifndef TS_API_SESSION_H
#define TS_API_SESSION_H
#include "frontend/mdl.h"
#include "passes/passes.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include <stdio.h>

/* api_opt_apply's and the driver's results (mcc's exit codes) */
enum { API_OK = 0, API_FAIL = 1, API_USAGE = 2, API_STOP = 3 /* --help, --version: done, exit 0 */ };

typedef struct ApiSession {
  const char *prog;          /* the messages' prefix: "mcc", or "tessera" for the library */
  FILE *diag;                /* where diagnostics go */
  int api;                   /* set through the C API: mcc-only options are refused */
  const char *input;         /* the model's file name */
  const char *source;        /* its text when compiled from a string (the library), else NULL */
  const char *output, *emit, *report;
  VEC(MdlDefine) defines;
  MdlOptions mdl;
  PassCtx *cx, cx_store;
  int time, stats;
  int dp;                    /* --dp N; -1: the parallel block's (else 1) */
  int check, steps, gpus;    /* --check, --steps K (-1: 3), --gpus N (0: the mesh size) */
  const char *trace;         /* --emit=trace FILE */
  const char *hw;            /* --hw NAME|FILE (plan/hw.h) */
  const char *llvm_dir;      /* --emit=llvm DIR: each kernel's LLVM IR (runtime/exec/exec_jit.c) */
  const char *cuda_dir;      /* --emit=cuda DIR: each program's CUDA module (runtime/exec/dev_prog.c) */
  int sm[8], nsm;            /* --target sm_80,sm_90: NVRTC images in the plan (docs/cuda.md) */
  const char *schedule;      /* --schedule NAME; NULL: 1f1b, interleaved with vpp >= 2 */
  const char *pp_layout;     /* --pp-layout STR */
  const char *pp_stack;      /* --pp-stack NAME: cut only this repeat stack */
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
  char *text;                /* an option's text to print (--precision-policy help) with API_STOP */
} ApiSession;

/* A session with mcc's defaults; its diagnostics to diag under prog. */
void api_session_init(ApiSession *a, const char *prog, FILE *diag);
void api_session_free(ApiSession *a);

/* "prog: " + the formatted message, to a->diag. */
void api_diag(const ApiSession *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- options (api/options.c) ---- */
/* How an option takes its value: none (a switch), one value, or a name
 * suffix after '=' plus a value ("--dump-ir=PASS DIR"). */
typedef enum { API_ARG_NONE, API_ARG_VALUE, API_ARG_SUFFIX } ApiArg;
/* Looks `name` up (spelled as on mcc's command line, or without its
 * leading dashes; "--flag=VALUE" too): 0 with *arg, *sub (the suffix of a
 * suffix option, or NULL) and *inline_value (the text after '=' when the
 * name carried it, or NULL); -1 when unknown. */
int api_opt_lookup(const char *name, ApiArg *arg, const char **sub, const char **inline_value);
/* Applies one option: API_OK, API_STOP (done: --help / --version; a->text
 * may hold what to print), or API_USAGE after the message. */
int api_opt_apply(ApiSession *a, const char *name, const char *value);
/* The checks between options once all are given, and the -D / Megatron
 * flag conflicts: API_OK or API_USAGE after the message. */
int api_opt_finish(ApiSession *a);

/* ---- the driver (api/driver.c) ---- */
/* --report schedule or --emit=trace: the pipeline views (pp > 1 allowed). */
int api_pipe_views_wanted(const ApiSession *a);
/* The frontend on the session's model with options o (a->mdl or another's):
 * a->source when set, else the file a->input.  NULL after diagnostics. */
IrModule *api_frontend(const ApiSession *a, const MdlOptions *o);
/* Frontend + layout checks + passes with options o and data-parallel size
 * dp (-1: the parallel block's).  NULL after diagnostics.  *t_front gets
 * the frontend's wall time in ms (may be NULL). */
IrModule *api_compile(const ApiSession *a, const MdlOptions *o, int dp, PassCtx *cx, double *t_front);
/* mcc's compilation of the session's model: a->mdl at a->dp, and with
 * --report time --gpus N the same layout at dp = N / (tp pp cp ep). */
IrModule *api_compile_main(ApiSession *a, double *t_front);
/* A second compilation (the unsharded reference of --report memory and
 * --check): options o, no dumps or prints. */
IrModule *api_compile_quiet(const ApiSession *a, const MdlOptions *o, int dp);
/* The options of the unsharded run of the same model: one rank. */
MdlOptions api_unsharded_options(const MdlOptions *o);
/* The plan of compiled module m (the plan takes m).  NULL after diagnostics. */
Plan *api_make_plan(const ApiSession *a, IrModule *m);
/* The plan as mcc writes it: --verify-roundtrip checked, then plan text
 * (--emit=plan-text) or the binary to -o ("-": stdout), default FILE.plan. */
int api_plan_output(const ApiSession *a, const Plan *p);
/* Report `kind` (memory, comm, sharding, time) of compiled module m into out. */
int api_report(const ApiSession *a, const char *kind, IrModule *m, StrBuf *out);
/* --report schedule / --emit=trace: the report into rep (with a->report),
 * the trace into tr (with a->trace); cx as the pipeline's context. */
int api_pipe_views(const ApiSession *a, PassCtx *cx, StrBuf *rep, StrBuf *tr);
/* Writes text to out, or stdout when out is NULL or "-". */
int api_emit_text(const ApiSession *a, const char *out, const StrBuf *b);
/* "tp=2 dp=2 sp": the layout of m. */
const char *api_layout_str(const IrModule *m, char *buf, size_t n);
int64_t api_mesh_ranks(const IrModule *m);
/* The IR's record of a pipeline schedule kind (m->par.sched). */
IrPipeSched api_ir_sched_of(PipeSchedKind k);
/* The executor's kernel positions (runtime/exec), for the memory plans. */
int api_llvm_positions(void *ctx, const IrModule *m, int block, int *at, char *err, size_t errlen);
#endif
