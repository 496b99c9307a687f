/* exec_jit.c - the executor's LLVM backend: which nodes of a block run as
 * generated kernels, and those kernels compiled once per program.
 *
 * For every block of the module, at program creation:
 *   - every fusion group (IrNode.group > 0, from passes/fuse.c) becomes ONE
 *     kernel (cg_lower_group), run when execution reaches the group's last
 *     member; its other members are skipped, and values used only inside
 *     the group get no buffer (ir_value_materialized);
 *   - every other node the code generator can lower (plan_kernel_node_ok)
 *     becomes a kernel of its own, except lone layout ops (reshape,
 *     permute, ...), which are copies the reference does as well;
 *   - a fusion group that is a GEMM bias epilogue (x @ W + b, formed by
 *     passes/fuse.c) runs as one BLAS call with beta = 1 into the add's
 *     buffer pre-filled with the bias (exec_gemm.c);
 *   - the two or three attention_bwd parts of one attention (plan_attn_
 *     grad_runs) run as one pass over the tiles at the last part
 *     (rt_attn_grads_run: native code, not generated; on a device the
 *     group's library kernels, dev_prog.c);
 *   - a gradient's producer and its accum (plan_accum_direct_runs: a
 *     weight gradient's matmul, one BLAS call with beta = 1, or the
 *     embedding's scatter-add) add straight into the gradient state at
 *     the accum (exec_gemm.c): the product is never stored;
 *   - every run of optimizer steps (plan_opt_runs: adamw, sgd, lion or
 *     lr_step nodes of one kind, in the update block, ZeRO chunks
 *     included) becomes ONE multi-tensor launch of a generated kernel at
 *     the run's last node (below);
 *   - everything else (matmul, collectives, other effects, split
 *     dropout, ...) stays on the reference kernels (ops_ref.c).
 * A kernel with dropout reads the seed, step and micro batch at run time
 * (kir.h PARAM): rt_jit_run passes them after the buffers.
 * A group the lowering refuses, or one whose placement is unsafe in this
 * block (a value used outside before the group runs, a state read across
 * an effect that writes state), falls back to the reference kernels, node
 * by node: counted in RtExecStats.fallbacks, never an error, since the
 * reference computes the same values.
 * Kernels are JIT-compiled by one CgJit per program (identical kernels,
 * e.g. the same op in every layer, compile once: cg_jit_compile caches by
 * text) and run over a persistent CgPool.
 * Compiling GPT-2's ~40 distinct kernels at O3 takes seconds, so machine
 * code is also kept on disk between runs (cg_jit_set_cache_dir), keyed by
 * the kernel's text, the CPU and the LLVM version: the first run of a
 * model compiles, later runs (and the other ranks, and other models with
 * the same kernels) load objects.  The directory is $TS_CACHE_DIR, else
 * $XDG_CACHE_HOME/tessera, else ~/.cache/tessera; TS_CACHE_DIR=off (or
 * empty) compiles every time. */
#include "rt_priv.h"
#include "plan/groups.h"
#include "dev_prog.h"
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A distinct CUDA kernel of the module (cuda mode): its text's hash and
 * launch, so the same kernel in every layer is printed once. */
typedef struct {
  uint64_t hash;
  CgCudaLaunch cl;
} CudaSeen;

struct RtJit {
  CgJit *jit;           /* NULL in cuda mode */
  CgPool *pool;
  int cuda;             /* kernels printed as CUDA C into `cuda_src` instead of JIT-compiled */
  int exact;            /* cuda: f32 groups compute in f64 (RtExecOpts.cuda_exact) */
  StrBuf cuda_src;
  VEC(CudaSeen) cuda_seen;
  VEC(RtCudaKernelInfo) cuda_info;
  RtJitBlock *blocks;   /* per block of the module */
  int nblocks;
  RtExecStats stats;
};

static int is_layout_alone(IrOp op) {
  return op == IR_OP_RESHAPE || op == IR_OP_PERMUTE || op == IR_OP_SLICE || op == IR_OP_PAD ||
         op == IR_OP_CONCAT || op == IR_OP_BROADCAST;
}

/* Whether the kernel over members mem[0..n) can run at its last member:
 * every member may be generated code (if `generated`: not for a GEMM
 * epilogue, which runs on BLAS), no node outside uses a member's
 * value before the last member, and no effect lies between the first
 * member reading a state and the last member (it could write that state). */
static int placement_ok(const IrModule *m, const IrBlock *b, const int *mem, int n, const unsigned char *in_k,
                        int generated) {
  int at = mem[n - 1], first_state = -1;
  for (int j = 0; j < n; j++) {
    if (generated && !plan_kernel_node_ok(m, b, mem[j])) return 0;
    const IrNode *nd = &b->nodes[mem[j]];
    for (int k = 0; k < nd->nin; k++)
      if (b->nodes[nd->in[k]].op == IR_OP_STATE && first_state < 0) first_state = mem[j];
  }
  for (int u = mem[0] + 1; u < at; u++) {
    if (in_k[u]) continue;
    const IrNode *nd = &b->nodes[u];
    if (first_state >= 0 && u > first_state && (ir_ops[nd->op].flags & OPF_EFFECT)) return 0;
    for (int k = 0; k < nd->nin; k++)
      if (in_k[nd->in[k]]) return 0;
  }
  return 1;
}

/* cuda mode: prints kernel k (renamed NAME_<hash of its text>, so equal
 * kernels share one function and different ones never collide) into the
 * module unless an equal one is there, and gives its launch.  0 or -1. */
static int cuda_add(RtJit *J, CgKernel *k, const IrBlock *b, int at, CgCudaLaunch *cl, char *err, size_t errlen) {
  StrBuf key = {0};
  cg_kernel_print(k, &key);
  uint64_t h = ts_hash64(key.p, key.n, 0);
  sb_free(&key);
  for (int i = 0; i < J->cuda_seen.n; i++)
    if (J->cuda_seen.a[i].hash == h) { *cl = J->cuda_seen.a[i].cl; return 0; }
  char name[64];
  snprintf(name, sizeof name, "%.40s_%08llx", k->name, (unsigned long long)(h & 0xffffffffu));
  snprintf(k->name, sizeof k->name, "%s", name);
  char why[512];
  if (cg_kernel_cuda_text(k, &J->cuda_src, cl, why, sizeof why) != 0)
    return ts_errf(err, errlen, "block %s: printing the CUDA kernel of %%%d (%s): %s", b->name, at, k->name, why);
  CudaSeen cs = {h, *cl};
  VEC_PUSH(J->cuda_seen, cs);
  RtCudaKernelInfo ki;
  memset(&ki, 0, sizeof ki);
  snprintf(ki.name, sizeof ki.name, "%s", cl->name);
  snprintf(ki.where, sizeof ki.where, "block %s, %%%d = %s", b->name, at, ir_ops[b->nodes[at].op].name);
  VEC_PUSH(J->cuda_info, ki);
  J->stats.distinct++;
  return 0;
}

/* Lowers and compiles the kernel of members mem[0..n) of block b into
 * *out.  0; 1 if the lowering refused (fall back); -1 on a JIT error. */
static int compile_kernel(RtJit *J, const IrModule *m, const IrBlock *b, const int *mem, int n, RtJitKernel *out,
                          char *err, size_t errlen) {
  char why[512];
  CgLowerOpts lo = {.f32 = J->cuda && !J->exact};
  CgKernel *k = cg_lower_group_opts(m, b, NULL, mem, n, &out->io, &lo, why, sizeof why);
  if (!k) return 1;
  if (J->cuda) {
    int rc = cuda_add(J, k, b, mem[n - 1], &out->cl, err, errlen);
    out->grid = k->grid;
    out->nparam = k->nparam;
    out->at = mem[n - 1];
    out->op = b->nodes[mem[n - 1]].op;
    cg_kernel_free(k);
    return rc;
  }
  int hits = cg_jit_cache_hits(J->jit), busy = 0;
  CgFn fn = cg_jit_compile_or_defer(J->jit, k, &busy, why, sizeof why);
  if (!fn && !busy) {
    ts_errf(err, errlen, "block %s: compiling the kernel of %%%d (%s): %s", b->name, mem[n - 1], k->name, why);
    cg_kernel_free(k);
    return -1;
  }
  if (fn && cg_jit_cache_hits(J->jit) == hits) J->stats.distinct++;
  out->fn = fn;
  out->grid = k->grid;
  out->nparam = k->nparam;
  out->at = mem[n - 1];
  out->op = b->nodes[mem[n - 1]].op;
  /* the largest buffer measures the work: small kernels run inline */
  int64_t work = 0;
  for (int i = 0; i < k->nbuf; i++) if (k->buf[i].n > work) work = k->buf[i].n;
  out->work = work;
  if (busy) out->defer = k;
  else cg_kernel_free(k);
  return 0;
}

/* ---- optimizer steps as one pass over all parameters ----
 * plan_opt_runs (plan/groups.c) cuts the adamw, sgd, lion and lr_step
 * nodes of a block into runs of one kind (in the update block: all the
 * nodes of that kind, unless another effect stands between them); each
 * run is ONE launch on the pool over the concatenation of its tensors'
 * element ranges (a multi-tensor apply): the threads split the total count
 * into contiguous shares, and a share that spans several tensors runs the
 * kernel on each piece with that tensor's buffers, from a table made per
 * launch.  The launch happens at the run's last node (memplan models it:
 * the operands stay live until there), after the clip coefficient and
 * every gradient exist.
 *
 * The kernel is generated once per run (cg_lower_opt_step, codegen/lower.c,
 * one lowering parameterised by the update rule): the reference's
 * arithmetic (ops_ref_t.h, adamw_range, sgd_range, lion_range,
 * lr_step_range), in f64, in the same order, so every element gets the
 * bits the per-tensor reference gives.  The rule's constants (adamw's b1,
 * b2, eps; sgd's momentum and nesterov; lion's betas) are the run's key;
 * lr, wd, adamw's bias corrections and lr_step's scale come per tensor in
 * a small f64 buffer (the kernel IR has no run-time arguments; wd differs
 * between decayed and undecayed parameters).  Its buffers are declared
 * with the run's largest tensor's count: a piece [lo, hi) never passes
 * its own tensor's end.  A ZeRO member (flat moments) updates the rank's
 * chunk: the param pointer moves to the chunk, the count is the chunk's
 * part of it. */

void rt_jit_opt_scalars(const IrTrain *tr, const IrNode *n, const RtRunInfo *info, double s[4]) {
  double t = (double)(info->step + 1);
  s[0] = info->lr;
  s[1] = s[2] = 0;
  switch (n->op) {
  case IR_OP_ADAMW:
    s[0] = ir_train_adamw_lr(tr, info->lr);   /* Muon's AdamW group may have its own lr */
    s[1] = 1.0 - pow(n->fa[0], t);
    s[2] = 1.0 - pow(n->fa[1], t);
    s[3] = n->fa[3];
    break;
  case IR_OP_LR_STEP:   /* fa = {scale, wd} */
    s[1] = n->fa[0];
    s[3] = n->fa[1];
    break;
  default:   /* sgd, lion: fa = {a, b, wd} */
    s[3] = n->fa[2];
    break;
  }
}

/* The elements step node n updates, as the reference does (ops_ref.c
 * ref_ADAMW, ref_SGD ...): the param's count, or (ZeRO: flat moments) the
 * moment chunk's count; the states' types checked.  -1 if the kernel
 * cannot take the node (the reference then runs it and reports what is
 * wrong). */
static int64_t opt_count(const IrModule *m, const IrBlock *b, const IrNode *n) {
  int nmom, nkey, nin = cg_opt_step_layout(n->op, &nmom, &nkey);
  if (nin == 0 || n->nin != nin) return -1;
  for (int s = 0; s < 1 + nmom; s++)
    if (n->ia[s] < 0 || n->ia[s] >= m->states.n) return -1;
  const IrState *w = &m->states.a[n->ia[0]], *ms = nmom ? &m->states.a[n->ia[1]] : w;
  const IrNode *gr = &b->nodes[n->in[nin - 1]];
  IrDtype T = w->type.dtype;
  if (gr->type.dtype != T) return -1;
  int chunked = nmom && ms->sh.flat && !w->sh.flat;
  const IrType *want = chunked ? &ms->type : &w->type;
  if (chunked && (ms->type.rank != 1 || ms->type.dtype != T)) return -1;
  for (int s = 1; s < 1 + nmom; s++) {
    const IrState *x = &m->states.a[n->ia[s]];
    if (x->sh.flat != ms->sh.flat || x->type.dtype != T || !ir_type_same_shape(&x->type, want)) return -1;
  }
  if (!ir_type_same_shape(&gr->type, want)) return -1;
  return ir_type_numel(want);
}

/* Size of mesh axis a in m's parallel configuration (>= 1). */
static int64_t par_axis_size(const IrModule *m, int a) {
  const IrParallel *q = &m->par;
  int v = a == IR_AXIS_DP ? q->dp : a == IR_AXIS_PP ? q->pp : a == IR_AXIS_CP ? q->cp : a == IR_AXIS_EP ? q->ep : q->tp;
  return v > 1 ? v : 1;
}

/* cuda mode: one launch per tensor of the run (graphs make launches
 * cheap).  A kernel's grid is a constant, but a ZeRO member updates a
 * count that depends on the rank (the last chunk may be partial, a chunk
 * past the end is empty) while the module is shared by every dp rank: so
 * each member gets the kernels of both possible counts, cls[2j] for the
 * full chunk (ccnt[2j]) and cls[2j + 1] for the partial one (ccnt[2j + 1],
 * 0 if none); the executor launches the one matching its count. */
static int cuda_opt_run(RtJit *J, const IrModule *m, const IrBlock *b, int *run, int nrun, RtJitKernel *out,
                        char *err, size_t errlen) {
  CgCudaLaunch *cls = ts_xcalloc((size_t)(2 * nrun), sizeof *cls);
  int64_t *ccnt = ts_xcalloc((size_t)(2 * nrun), sizeof *ccnt);
  int rc = 0;
  for (int j = 0; j < nrun && rc == 0; j++) {
    const IrNode *nd = &b->nodes[run[j]];
    int nmom, nkey, nin = cg_opt_step_layout(nd->op, &nmom, &nkey);
    const IrState *w = &m->states.a[nd->ia[0]], *ms = nmom ? &m->states.a[nd->ia[1]] : w;
    int64_t c = opt_count(m, b, nd), total = ir_type_numel(&w->type), nblk = 1;
    for (int a = 0; a < IR_AXIS_COUNT; a++)
      if (ms->sh.flat & (1u << a)) nblk *= par_axis_size(m, a);
    int chunked = ms->sh.flat && !w->sh.flat;   /* a ZeRO-3 shard is always the whole chunk */
    ccnt[2 * j] = chunked ? (total >= c ? c : 0) : c;
    if (chunked && total % c != 0 && total < nblk * c) ccnt[2 * j + 1] = total % c;
    for (int h = 0; h < 2 && rc == 0; h++) {
      if (ccnt[2 * j + h] <= 0) continue;
      CgKernel *k = cg_lower_opt_step(nd->op, b->nodes[nd->in[nin - 1]].type.dtype, b->nodes[nd->in[0]].type.dtype,
                                      nd->fa, ccnt[2 * j + h]);
      if (!k) { rc = 1; break; }
      rc = cuda_add(J, k, b, run[j], &cls[2 * j + h], err, errlen);
      cg_kernel_free(k);
    }
  }
  if (rc != 0) {
    free(cls);
    free(ccnt);
    return rc;
  }
  memset(out, 0, sizeof *out);
  out->at = run[nrun - 1];
  out->op = b->nodes[run[0]].op;
  out->opt = 1;
  out->run = run;
  out->nrun = nrun;
  out->cls = cls;
  out->ccnt = ccnt;
  return 0;
}

/* Compiles the launch of the optimizer steps run[0..nrun) of block b
 * into *out (which takes run).  0; 1 if one of them cannot be generated
 * (the run stays on the reference); -1 on a JIT error. */
static int compile_opt_run(RtJit *J, const IrModule *m, const IrBlock *b, int *run, int nrun, RtJitKernel *out,
                             char *err, size_t errlen) {
  int64_t most = 1;
  for (int j = 0; j < nrun; j++) {
    int64_t c = opt_count(m, b, &b->nodes[run[j]]);
    if (c < 0) return 1;
    if (c > most) most = c;
  }
  const IrNode *n0 = &b->nodes[run[0]];
  if (J->cuda) return cuda_opt_run(J, m, b, run, nrun, out, err, errlen);
  CgKernel *k = cg_lower_opt_step(n0->op, b->nodes[n0->in[n0->nin - 1]].type.dtype, b->nodes[n0->in[0]].type.dtype,
                                  n0->fa, most);
  if (!k) return 1;
  char why[512];
  int hits = cg_jit_cache_hits(J->jit), busy = 0;
  CgFn fn = cg_jit_compile_or_defer(J->jit, k, &busy, why, sizeof why);
  if (!fn && !busy) {
    ts_errf(err, errlen, "block %s: compiling the %s kernel of node %d: %s", b->name, ir_ops[n0->op].name, run[0], why);
    cg_kernel_free(k);
    return -1;
  }
  if (fn && cg_jit_cache_hits(J->jit) == hits) J->stats.distinct++;
  memset(out, 0, sizeof *out);
  out->fn = fn;
  out->grid = out->work = most;
  out->at = run[nrun - 1];
  out->op = n0->op;
  out->opt = 1;
  out->run = run;
  out->nrun = nrun;
  if (busy) out->defer = k;
  else cg_kernel_free(k);
  return 0;
}

/* The table of one multi-tensor launch: tensor t covers elements
 * [start[t], start[t + 1]) of the concatenation, with buffers bufs[t]. */
typedef struct {
  CgFn fn;
  int n;
  const int64_t *start;
  void *(*bufs)[6];
} OptTable;

/* A CgFn over the concatenation: bufs[0] is the table; [lo, hi) is cut
 * at tensor boundaries, each piece run by the kernel on its tensor. */
static void opt_apply(void **bufs, int64_t lo, int64_t hi) {
  const OptTable *tb = bufs[0];
  int a = 0, z = tb->n;   /* the first tensor with start[t + 1] > lo */
  while (a < z) {
    int mid = (a + z) / 2;
    if (tb->start[mid + 1] > lo) z = mid; else a = mid + 1;
  }
  for (int t = a; t < tb->n && tb->start[t] < hi; t++) {
    int64_t s = lo > tb->start[t] ? lo : tb->start[t], e = hi < tb->start[t + 1] ? hi : tb->start[t + 1];
    if (e > s) tb->fn(tb->bufs[t], s - tb->start[t], e - tb->start[t]);
  }
}

/* If the group mem[0..cnt) of block b is a GEMM bias epilogue
 * (plan_epilogue_match on its last member, exactly its nodes, the
 * add its only output, a product BLAS takes): its matmul's id, else -1. */
static int epilogue_of(const IrBlock *b, const int *mem, int cnt) {
  PlanEpilogue e;
  int want[PLAN_EPILOGUE_MAX_RESHAPES + 3];
  if (!plan_epilogue_match(b, mem[cnt - 1], &e) || plan_epilogue_members(&e, want) != cnt) return -1;
  for (int j = 0; j < cnt; j++)
    if (want[j] != mem[j] || (j < cnt - 1 && ir_value_materialized(b, mem[j]))) return -1;
  /* A, B and the bias come from outside (a hand-written group might
   * broadcast its own product) */
  int outside[3] = {b->nodes[e.matmul].in[0], b->nodes[e.matmul].in[1], b->nodes[e.bias].in[0]};
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < cnt; j++)
      if (outside[k] == mem[j]) return -1;
  return rt_gemm_epilogue_ok(b, e.matmul) ? e.matmul : -1;
}

/* Whether the epilogue group's bias is one value per output column
 * (rank-1, the product's N): what cuBLASLt's bias epilogue adds. */
static int bias_per_column(const IrBlock *b, const int *mem, int cnt, int mm) {
  const IrNode *add = &b->nodes[mem[cnt - 1]];
  int bc = b->nodes[add->in[0]].op == IR_OP_BROADCAST ? add->in[0] : add->in[1];
  const IrType *bt = &b->nodes[b->nodes[bc].in[0]].type, *ot = &add->type, *mt = &b->nodes[mm].type;
  if (bt->rank < 1 || bt->rank > ot->rank || bt->dtype != mt->dtype ||
      ir_type_numel(bt) != mt->dim[mt->rank - 1])
    return 0;
  /* the bias's dims are the output's trailing ones (a reshaped product,
   * e.g. [.., heads, head_dim] + b[heads, head_dim]) */
  for (int d = 0; d < bt->rank; d++)
    if (bt->dim[d] != ot->dim[ot->rank - bt->rank + d]) return 0;
  return 1;
}

/* The epilogue kernel of group mem[0..cnt) with matmul mm: buffers A, B,
 * bias, then the add's value. */
static void make_epilogue(const IrBlock *b, const int *mem, int cnt, int mm, RtJitKernel *out) {
  const IrNode *add = &b->nodes[mem[cnt - 1]];
  int bc = b->nodes[add->in[0]].op == IR_OP_BROADCAST ? add->in[0] : add->in[1];
  memset(out, 0, sizeof *out);
  out->gemm_mm = mm + 1;
  out->at = mem[cnt - 1];
  out->op = IR_OP_MATMUL;
  out->io.nin = 3;
  out->io.in[0] = b->nodes[mm].in[0];
  out->io.in[1] = b->nodes[mm].in[1];
  out->io.in[2] = b->nodes[bc].in[0];
  out->io.nout = 1;
  out->io.out[0] = mem[cnt - 1];
}

static int plan_block(RtJit *J, const IrModule *m, const IrBlock *b, RtJitBlock *jb, int use_groups,
                      char *err, size_t errlen) {
  int n = b->n;
  jb->kern = ts_xmalloc((size_t)(n ? n : 1) * sizeof *jb->kern);
  for (int i = 0; i < n; i++) jb->kern[i] = -1;
  int *mem = ts_xmalloc((size_t)(n ? n : 1) * sizeof *mem);
  int *run_at = ts_xmalloc((size_t)(n ? n : 1) * sizeof *run_at);
  unsigned char *in_k = ts_xcalloc((size_t)(n ? n : 1), 1);
  unsigned char *done = ts_xcalloc((size_t)(n ? n : 1), 1);
  plan_opt_runs(b, run_at);
  int *attn_at = ts_xmalloc((size_t)(n ? n : 1) * sizeof *attn_at);
  int *acc_at = ts_xmalloc((size_t)(n ? n : 1) * sizeof *acc_at);
  plan_accum_direct_runs(b, acc_at);
  /* the parts of one attention's backward: one launch group on a device
   * too (dev_prog.c prints its library kernels: the statistics once, dk
   * and dv in one kernel) */
  plan_attn_grad_runs(b, attn_at);
  if (J->cuda) {   /* the device: a weight gradient's GEMM adds into its state (beta = 1) */
    for (int i = 0; i < n; i++)
      if (acc_at[i] >= 0 && b->nodes[i].op == IR_OP_EMBEDDING_BWD)   /* its kernel zeroes what it writes */
        for (int j = i, a = acc_at[i]; j <= a; j++)
          if (acc_at[j] == a) acc_at[j] = -1;
  }
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (done[i]) continue;
    const IrNode *nd = &b->nodes[i];
    int cnt = 0;
    if (run_at[i] >= 0) {   /* the first step of a run: one launch for all of it */
      int *run = ts_xmalloc((size_t)(run_at[i] - i + 1) * sizeof *run), nrun = 0;
      for (int j = i; j <= run_at[i]; j++)
        if (run_at[j] == run_at[i]) { run[nrun++] = j; done[j] = 1; }
      RtJitKernel kk;
      int r = compile_opt_run(J, m, b, run, nrun, &kk, err, errlen);
      if (r != 0) {   /* < 0: error; > 0: the reference updates them one by one */
        free(run);
        if (r < 0) { rc = -1; break; }
        J->stats.fallbacks++;
        continue;
      }
      kk.scal_at = J->stats.opt_tensors;   /* the program's slots of scalars so far */
      VEC_PUSH(jb->k, kk);
      for (int j = 0; j < nrun; j++) jb->kern[run[j]] = jb->k.n - 1;
      J->stats.kernels++;
      J->stats.opt_runs++;
      J->stats.opt_tensors += nrun;
      continue;
    }
    if (attn_at[i] >= 0) {   /* the first part of an attention's backward: one pass (CPU) or launch group (device) for all */
      RtJitKernel kk;
      memset(&kk, 0, sizeof kk);
      kk.at = attn_at[i];
      kk.op = IR_OP_ATTENTION_BWD;
      kk.attn_grads = 1;
      kk.run = ts_xmalloc(3 * sizeof *kk.run);
      kk.io.nin = nd->nin;   /* (q, k, v, o, do[, slope][, doc]) */
      for (int k = 0; k < nd->nin; k++) kk.io.in[k] = nd->in[k];
      for (int j = i; j <= attn_at[i]; j++)
        if (attn_at[j] == attn_at[i]) { kk.run[kk.nrun++] = j; kk.io.out[kk.io.nout++] = j; done[j] = 1; }
      VEC_PUSH(jb->k, kk);
      for (int j = 0; j < kk.nrun; j++) jb->kern[kk.run[j]] = jb->k.n - 1;
      J->stats.kernels++;
      J->stats.attn_grads++;
      continue;
    }
    if (acc_at[i] >= 0) {   /* a gradient's producer: it adds into the accum's state */
      RtJitKernel kk;
      memset(&kk, 0, sizeof kk);
      kk.at = acc_at[i];
      kk.op = nd->op;
      kk.accum_from = i + 1;
      kk.io.nin = 2;
      kk.io.in[0] = nd->in[0];
      kk.io.in[1] = nd->in[1];
      VEC_PUSH(jb->k, kk);
      for (int j = i; j <= acc_at[i]; j++)
        if (acc_at[j] == acc_at[i]) { jb->kern[j] = jb->k.n - 1; done[j] = 1; }
      J->stats.kernels++;
      J->stats.accum_direct++;
      continue;
    }
    if (use_groups && nd->group > 0) {
      for (int j = i; j < n; j++)
        if (b->nodes[j].group == nd->group) { mem[cnt++] = j; done[j] = 1; }
    } else {
      /* lone layout ops are copies the reference does on the CPU; a
       * device needs them as kernels */
      if (!plan_kernel_node_ok(m, b, i) || (is_layout_alone(nd->op) && !J->cuda)) continue;
      mem[cnt++] = i;
    }
    for (int j = 0; j < cnt; j++) in_k[mem[j]] = 1;
    int r = 1, mm = cnt > 1 ? epilogue_of(b, mem, cnt) : -1;
    if (mm >= 0 && J->cuda && !bias_per_column(b, mem, cnt, mm)) mm = -1;   /* cuBLASLt's bias epilogue */
    RtJitKernel kk;
    memset(&kk, 0, sizeof kk);
    if (mm >= 0) {   /* a GEMM bias epilogue: BLAS, nothing to compile */
      if (placement_ok(m, b, mem, cnt, in_k, 0)) { make_epilogue(b, mem, cnt, mm, &kk); r = 0; }
    } else if (placement_ok(m, b, mem, cnt, in_k, 1)) {
      r = compile_kernel(J, m, b, mem, cnt, &kk, err, errlen);
    }
    for (int j = 0; j < cnt; j++) in_k[mem[j]] = 0;
    if (r < 0) { rc = -1; break; }
    if (r > 0) {   /* the reference computes the members one by one */
      if (cnt > 1) J->stats.fallbacks++;
      /* a device has no reference kernels: members that lower alone do */
      for (int j = 0; J->cuda && cnt > 1 && j < cnt && rc == 0; j++) {
        if (!plan_kernel_node_ok(m, b, mem[j])) continue;
        RtJitKernel k1;
        memset(&k1, 0, sizeof k1);
        int r1 = compile_kernel(J, m, b, &mem[j], 1, &k1, err, errlen);
        if (r1 < 0) rc = -1;
        if (r1 != 0) continue;
        VEC_PUSH(jb->k, k1);
        jb->kern[mem[j]] = jb->k.n - 1;
        J->stats.kernels++;
      }
      continue;
    }
    VEC_PUSH(jb->k, kk);
    for (int j = 0; j < cnt; j++) jb->kern[mem[j]] = jb->k.n - 1;
    J->stats.kernels++;
    if (cnt > 1) J->stats.groups++;
    if (mm >= 0) J->stats.epilogues++;
  }
  free(mem);
  free(run_at);
  free(attn_at);
  free(acc_at);
  free(in_k);
  free(done);
  return rc;
}

/* The object cache directory (see the header), or NULL: off. */
static const char *cache_dir(char *buf, size_t n) {
  const char *d = getenv("TS_CACHE_DIR");
  if (d) return *d && strcmp(d, "off") != 0 ? d : NULL;
  const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (x && *x == '/') snprintf(buf, n, "%s/tessera", x);
  else if (h && *h == '/') snprintf(buf, n, "%s/.cache/tessera", h);
  else return NULL;
  return buf;
}

static int default_threads(void) {
  const char *s = getenv("TS_THREADS");
  if (s && *s) {
    long v = strtol(s, NULL, 10);
    if (v >= 1 && v <= 1024) return (int)v;
  }
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c >= 1 ? (int)(c > 1024 ? 1024 : c) : 1;
}

/* The kernels another process was compiling when plan_block asked
 * (cg_jit_compile_or_defer): by now most are in the cache directory;
 * cg_jit_compile waits for the rest. */
static int finish_deferred(RtJit *J, const IrModule *m, char *err, size_t errlen) {
  for (int bi = 0; bi < J->nblocks; bi++)
    for (int i = 0; i < J->blocks[bi].k.n; i++) {
      RtJitKernel *K = &J->blocks[bi].k.a[i];
      if (!K->defer) continue;
      char why[512];
      int hits = cg_jit_cache_hits(J->jit);
      K->fn = cg_jit_compile(J->jit, K->defer, why, sizeof why);
      if (!K->fn)
        return ts_errf(err, errlen, "block %s: compiling the kernel of %%%d (%s): %s", m->blocks.a[bi].name, K->at,
                       K->defer->name, why);
      if (cg_jit_cache_hits(J->jit) == hits) J->stats.distinct++;
      J->stats.deferred++;
      cg_kernel_free(K->defer);
      K->defer = NULL;
    }
  return 0;
}

RtJit *rt_jit_new(const IrModule *m, const RtExecOpts *o, char *err, size_t errlen) {
  double t0 = ts_now_s();
  RtJit *J = ts_xcalloc(1, sizeof *J);
  char why[512];
  J->cuda = o->cuda || o->dev;   /* cuda: plan and print only, the device compiles */
  const char *ex = getenv("TS_CUDA_EXACT");
  J->exact = o->cuda_exact || (ex && strcmp(ex, "1") == 0);
  if (!J->cuda && !(J->jit = cg_jit_new(why, sizeof why))) {
    ts_errf(err, errlen, "the LLVM backend cannot start: %s (use --backend ref)", why);
    free(J);
    return NULL;
  }
  char dir[4096];
  if (J->jit) cg_jit_set_cache_dir(J->jit, cache_dir(dir, sizeof dir));
  J->nblocks = m->blocks.n;
  J->blocks = ts_xcalloc((size_t)(m->blocks.n ? m->blocks.n : 1), sizeof *J->blocks);
  for (int bi = 0; bi < m->blocks.n; bi++)
    if (plan_block(J, m, &m->blocks.a[bi], &J->blocks[bi], !o->no_groups, err, errlen) != 0) {
      rt_jit_free(J);
      return NULL;
    }
  if (J->jit && finish_deferred(J, m, err, errlen) != 0) {
    rt_jit_free(J);
    return NULL;
  }
  if (J->jit) {
    J->pool = cg_pool_new(o->threads > 0 ? o->threads : default_threads());
    J->stats.threads = cg_pool_threads(J->pool);
    J->stats.disk_hits = cg_jit_disk_hits(J->jit);
  }
  J->stats.jit_s = ts_now_s() - t0;
  return J;
}

void rt_jit_free(RtJit *J) {
  if (!J) return;
  for (int b = 0; b < J->nblocks; b++) {
    free(J->blocks[b].kern);
    for (int k = 0; k < J->blocks[b].k.n; k++) {
      free(J->blocks[b].k.a[k].run);
      cg_kernel_free(J->blocks[b].k.a[k].defer);
      free(J->blocks[b].k.a[k].cls);
      free(J->blocks[b].k.a[k].ccnt);
    }
    free(J->blocks[b].k.a);
  }
  free(J->blocks);
  if (J->pool) cg_pool_free(J->pool);
  if (J->jit) cg_jit_free(J->jit);
  sb_free(&J->cuda_src);
  free(J->cuda_seen.a);
  free(J->cuda_info.a);
  free(J);
}

const RtJitBlock *rt_jit_block(const RtJit *J, int b) { return J && b >= 0 && b < J->nblocks ? &J->blocks[b] : NULL; }
const RtExecStats *rt_jit_stats(const RtJit *J) { return &J->stats; }
const StrBuf *rt_jit_cuda_source(const RtJit *J) { return &J->cuda_src; }
const RtCudaKernelInfo *rt_jit_cuda_info(const RtJit *J, int *n) {
  *n = J->cuda_info.n;
  return J->cuda_info.a;
}

/* Below this many elements a kernel runs on the calling thread: waking the
 * pool costs more than the work. */
#define RT_JIT_INLINE_WORK 16384

void rt_jit_run(RtJit *J, const RtProgram *p, const RtJitKernel *k, void **bufs, const RtRunInfo *info) {
  /* the run-time scalars (kir.h PARAM) go after the buffers: the slots of
   * rt_dropout_u's words that vary per launch */
  void *all[CG_MAX_BUFS + 1];
  int64_t prm[CG_PARAM_COUNT];
  if (k->nparam) {
    int nb = k->io.nin + k->io.nout;
    memcpy(all, bufs, (size_t)nb * sizeof *all);
    prm[CG_PARAM_SEED] = (int64_t)rt_program_seed(p);
    prm[CG_PARAM_STEP] = info ? info->step : 0;
    prm[CG_PARAM_MICRO] = info ? info->micro : 0;
    all[nb] = prm;
    bufs = all;
  }
  if (k->work < RT_JIT_INLINE_WORK || cg_pool_threads(J->pool) == 1) k->fn(bufs, 0, k->grid);
  else cg_pool_run(J->pool, k->fn, bufs, k->grid);
}

void rt_jit_opt_chunk(const RtProgram *p, const IrNode *n, int64_t *off, int64_t *cnt) {
  const IrModule *m = rt_program_module(p);
  int nmom, nkey;
  cg_opt_step_layout(n->op, &nmom, &nkey);
  const IrState *w = &m->states.a[n->ia[0]], *ms = nmom ? &m->states.a[n->ia[1]] : w;
  *cnt = ir_type_numel(&w->type);
  *off = 0;
  if (ms->sh.flat && !w->sh.flat) {   /* the rank's chunk of the flattened param (ref_ADAMW's rule; a ZeRO-3
                                          shard is the chunk itself) */
    int64_t c = ir_type_numel(&ms->type), s0 = rt_shard_block(rt_program_rank(p), ms->sh.flat, NULL) * c;
    *off = s0 < *cnt ? s0 : *cnt;
    *cnt = s0 >= *cnt ? 0 : (*cnt - s0 < c ? *cnt - s0 : c);
  }
}

/* The buffers of step node nd's kernel (cg_opt_step_layout's order) into
 * row[0 .. 6): its operands, the scalars sc, the param at elements off,
 * the moments; param and moments from state(p, id) (host or device
 * copies).  Returns the count, or -1 when an operand has no buffer. */
int rt_jit_opt_buffers(const RtProgram *p, const IrNode *nd, void *const *vals, void *sc, int64_t off,
                       void *(*state)(const RtProgram *, int), void *row[6]) {
  const IrModule *m = rt_program_module(p);
  int nmom, nkey, nin = cg_opt_step_layout(nd->op, &nmom, &nkey), k = 0;
  size_t es = ir_dtype_size(m->states.a[nd->ia[0]].type.dtype);
  for (int j = 0; j < nin; j++) {
    row[k] = vals[nd->in[j]];
    if (!row[k++]) return -1;
  }
  row[k++] = sc;
  row[k++] = (char *)state(p, (int)nd->ia[0]) + off * (int64_t)es;
  for (int j = 0; j < nmom; j++) row[k++] = state(p, (int)nd->ia[1 + j]);
  return k;
}

static void *host_state(const RtProgram *p, int id) { return rt_state_data((RtProgram *)p, id); }

int rt_jit_run_opt(RtJit *J, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void *const *vals,
                   const RtRunInfo *info, char *msg, size_t n) {
  int nt = K->nrun;
  int64_t *start = ts_xmalloc((size_t)(nt + 1) * sizeof *start);
  void *(*bufs)[6] = ts_xmalloc((size_t)nt * sizeof *bufs);
  double (*sc)[4] = ts_xmalloc((size_t)nt * sizeof *sc);
  int rc = 0;
  start[0] = 0;
  for (int t = 0; t < nt; t++) {
    const IrNode *nd = &b->nodes[K->run[t]];
    int64_t off, cnt;
    rt_jit_opt_chunk(p, nd, &off, &cnt);
    rt_jit_opt_scalars(&rt_program_module(p)->train, nd, info, sc[t]);
    if (rt_jit_opt_buffers(p, nd, vals, sc[t], off, host_state, bufs[t]) < 0) {
      snprintf(msg, n, "internal error: %s %%%d's operand has no buffer", ir_ops[nd->op].name, K->run[t]);
      rc = -1;
      break;
    }
    start[t + 1] = start[t] + cnt;
  }
  if (rc == 0) {
    OptTable tb = {K->fn, nt, start, bufs};
    void *arg[1] = {&tb};
    int64_t total = start[nt];
    if (total < RT_JIT_INLINE_WORK || cg_pool_threads(J->pool) == 1) opt_apply(arg, 0, total);
    else cg_pool_run(J->pool, opt_apply, arg, total);
    J->stats.opt_launches++;
  }
  free(start);
  free(bufs);
  free(sc);
  return rc;
}
int rt_jit_run_gemm(RtJit *J, RtProgram *p, const IrBlock *b, const RtJitKernel *K, void **bufs,
                    const RtRunInfo *info, char *msg, size_t n) {
  J->stats.epilogue_gemms++;
  return rt_gemm_epilogue_run(p, b, K, bufs, info, msg, n);
}

/* ---- --emit=llvm ---- */
int rt_emit_llvm(const IrModule *m, const char *dir, int *count, char *err, size_t errlen) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return ts_errf(err, errlen, "cannot create '%s': %s", dir, strerror(errno));
  VEC(uint64_t) seen = {0};
  int rc = 0, written = 0;
  for (int bi = 0; bi < m->blocks.n && rc == 0; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int *mem = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *mem);
    unsigned char *done = ts_xcalloc((size_t)(b->n ? b->n : 1), 1);
    for (int i = 0; i < b->n && rc == 0; i++) {
      if (done[i]) continue;
      const IrNode *nd = &b->nodes[i];
      int cnt = 0;
      if (nd->group > 0) {
        for (int j = i; j < b->n; j++)
          if (b->nodes[j].group == nd->group) { mem[cnt++] = j; done[j] = 1; }
      } else {
        if (!plan_kernel_node_ok(m, b, i) || is_layout_alone(nd->op)) continue;
        mem[cnt++] = i;
      }
      CgGroupIO io;
      char why[512];
      CgKernel *k = cg_lower_group(m, b, mem, cnt, &io, why, sizeof why);
      if (!k) continue;   /* the executor runs these on the reference kernels */
      StrBuf key = {0};
      cg_kernel_print(k, &key);
      uint64_t h = ts_hash64(key.p, key.n, 0);
      sb_free(&key);
      int dup = 0;
      for (int s = 0; s < seen.n; s++) dup |= seen.a[s] == h;
      if (!dup) {
        VEC_PUSH(seen, h);
        StrBuf ll = {0};
        if (cg_kernel_llvm_text(k, 1, &ll, why, sizeof why) != 0) {
          rc = ts_errf(err, errlen, "block %s, %%%d: %s", b->name, mem[cnt - 1], why);
        } else {
          /* the kernel's name plus its content hash: identical kernels
           * share one file, different ones never collide */
          char path[4096];
          snprintf(path, sizeof path, "%s/%s_%08llx.ll", dir, k->name, (unsigned long long)(h & 0xffffffffu));
          if (ts_write_file(path, ll.p ? ll.p : "", ll.n) != 0)
            rc = ts_errf(err, errlen, "%s", ts_io_error());
          else written++;
          /* and the kernel IR it came from (codegen/kir.h's text form) */
          StrBuf kt = {0};
          cg_kernel_print(k, &kt);
          snprintf(path, sizeof path, "%s/%s_%08llx.kir", dir, k->name, (unsigned long long)(h & 0xffffffffu));
          if (rc == 0 && ts_write_file(path, kt.p ? kt.p : "", kt.n) != 0)
            rc = ts_errf(err, errlen, "%s", ts_io_error());
          sb_free(&kt);
        }
        sb_free(&ll);
      }
      cg_kernel_free(k);
    }
    free(mem);
    free(done);
  }
  free(seen.a);
  if (count) *count = written;
  return rc;
}
