/* dev_priv.h - what dev_prog.c (the device plan of a program), exec_dev.c
 * (the executor's device backend) and rt.c share. */
#ifndef TS_RT_DEV_PRIV_H
#define TS_RT_DEV_PRIV_H
#include "rt_priv.h"
#include "runtime/device/device.h"
#include "plan/memplan.h"

/* What runs node i of a block on a device. */
enum {
  RT_DS_KERNEL,   /* a kernel of the planning (RtJitBlock.kern[i] >= 0): generated, AdamW run, GEMM epilogue */
  RT_DS_ALIAS,    /* shares its operand's buffer or state bytes (memplan): nothing runs */
  RT_DS_INPUT,    /* host feed -> device */
  RT_DS_STATE,    /* a pointer into the device slab */
  RT_DS_OUTPUT,   /* device scalar -> host */
  RT_DS_GEMM,     /* matmul */
  RT_DS_COMM,     /* collective / point to point / stash (the communication layer) */
  RT_DS_LIB       /* library kernel(s), RtDevPlan.lib[RtDevBlock.lib[i]] */
};

/* Whether op runs through the communication layer (RT_DS_COMM). */
int rt_dev_is_comm(IrOp op);

typedef struct {
  CgCudaLaunch l[CG_CUDA_LIB_MAX_LAUNCH];
  int nl;
  int64_t scratch;
} RtDevLib;

typedef struct {
  unsigned char *kind;  /* per node: RT_DS_* */
  int *lib;             /* per node: index into RtDevPlan.lib, or -1 (a collective: its re-layout, if any;
                           a kernel of the planning: the library kernels of an attention backward's
                           launch group, RtJitKernel.attn_grads, at its position) */
} RtDevBlock;

typedef struct RtDevPlan {
  int nblocks;
  RtDevBlock *blk;
  VEC(RtDevLib) lib;
  int64_t scratch;      /* the largest scratch a library kernel asks for */
  int64_t comm_scratch; /* the largest a collective's re-layout asks for (the comm stream's own) */
  RtCudaModule mod;
} RtDevPlan;

/* The device plan of m whose kernels jit (cuda mode) planned; plans[b]
 * is block b's memory plan (NULL: not known, as in mcc; reshapes the plan
 * would alias then count as kernels).  NULL with a message naming the
 * first node no device can run. */
RtDevPlan *rt_dev_plan_new(const IrModule *m, RtJit *jit, const MemPlan *const *plans, char *err, size_t errlen);
void rt_dev_plan_free(RtDevPlan *P);

/* ---- the executor's device backend (exec_dev.c) ---- */
typedef struct RtDevExec RtDevExec;
/* Plans m's blocks for o->dev (jit: the cuda-mode planning; plans: the
 * memory plans), loads the module (o->image, else its source), allocates
 * the run block, scratch and AdamW scalars.  NULL with a message. */
RtDevExec *rt_dev_exec_new(const IrModule *m, const RtExecOpts *o, RtJit *jit, const MemPlan *const *plans,
                           char *err, size_t errlen);
void rt_dev_exec_free(RtDevExec *x);
RtDev *rt_dev_exec_dev(const RtDevExec *x);
const RtDevPlan *rt_dev_exec_plan(const RtDevExec *x);
/* Before a run of a block: the run block's words for info (seed, step,
 * micro, lr, the rank's coordinates) copied to the device if changed. */
int rt_dev_exec_begin(RtDevExec *x, RtProgram *p, const RtRunInfo *info, char *msg, size_t n);
/* Node i of block bi (kind GEMM, COMM or LIB) with its operands' and
 * result's device buffers. */
int rt_dev_exec_node(RtDevExec *x, RtProgram *p, int bi, int i, const void *const *in, void *out, const RtRunInfo *info,
                     char *msg, size_t n);
/* Kernel K of the planning at its position: bufs = its buffers (io), vals
 * = every value's buffer (AdamW runs read their operands there). */
int rt_dev_exec_kernel(RtDevExec *x, RtProgram *p, int bi, const RtJitKernel *K, void **bufs, void *const *vals,
                       const RtRunInfo *info, char *msg, size_t n);

/* Device work touching these buffers is about to be issued on the compute
 * stream: compute first waits for the collectives in flight (NCCL on the
 * comm stream) that read or write any of them.  rt_dev_exec_join: waits
 * for all of them (the end of a block run).  0, or -1 with a message. */
typedef struct { const void *p; size_t bytes; } RtDevRange;
int rt_dev_exec_order(RtDevExec *x, const RtDevRange *r, int n, char *msg, size_t len);
int rt_dev_exec_join(RtDevExec *x, char *msg, size_t len);
/* The end of a training step on a pipeline (rt_pipe_end_step): flushes
 * the queued sends, waits for the comm stream, returns the send buffers
 * to the pool; a value stashed or handed off and never taken is an
 * error (named).  0, or -1 with a message. */
int rt_dev_exec_pipe_end(RtDevExec *x, char *msg, size_t len);
/* The buffers the memory plan hands over (memplan.h, ext) on a CUDA
 * device: a pool buffer for a value of `bytes` bytes, and its return. */
int rt_dev_exec_pipe_buf(RtDevExec *x, size_t bytes, void **buf, char *msg, size_t len);
void rt_dev_exec_pipe_unbuf(RtDevExec *x, void *buf, size_t bytes);
/* A stash keeping *buf (its operand's buffer, from rt_dev_exec_pipe_buf),
 * or an unstash taking the stashed buffer into *buf; nothing runs on the
 * device.  0, or -1 with a message. */
int rt_dev_exec_handover(RtDevExec *x, const IrBlock *b, const IrNode *nd, const RtRunInfo *info, void **buf,
                         char *msg, size_t len);
/* Collectives issued on the comm stream so far, and operations issued on
 * compute while one was in flight. */
void rt_dev_exec_comm_stats(const RtDevExec *x, long long *collectives, long long *overlapped);

/* A bucket of the overlapped dp reduction (rt.c, "Overlapped dp
 * reduction") posted on the comm stream: after the compute issued so far,
 * pack[0..npack) copied into buf (src NULL: zeros), then NCCL's sum over
 * the rank's group for `axes` (dp, or a set holding dp such as dp+cp), in
 * place (all-reduce, buf[count]) or into recv (reduce-scatter,
 * buf[N*count] -> recv[count]); pending like any
 * collective, so compute issued after it overlaps it.  0, or -1 with a
 * message. */
typedef struct { size_t off; const void *src; size_t bytes; } RtDevPack;
int rt_dev_exec_dp_post(RtDevExec *x, RtProgram *p, IrOp op, int64_t axes, IrDtype dt, const RtDevPack *pack,
                        int npack, void *buf, void *recv, size_t count, char *msg, size_t len);
/* Buckets posted so far, and of them those after which the block issued
 * compute work before its end (the recorded issue order: a bucket posted
 * only when the backward is over has none). */
void rt_dev_exec_dp_stats(const RtDevExec *x, long long *posted, long long *overlapped);

/* rt.c: the program's device executor, or NULL (a CPU program). */
RtDevExec *rt_program_dev_exec(RtProgram *p);
/* rt.c: the device address of state s (program on a device). */
void *rt_state_dev(RtProgram *p, int s);

#endif
