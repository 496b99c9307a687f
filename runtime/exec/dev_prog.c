/* dev_prog.c - a rank program as device work: for every node of every
 * block, what a device runs (a generated kernel, a library kernel, a GEMM,
 * a copy, a collective), and the one CUDA module holding all the kernels.
 *
 * The kernel choice is the CPU executor's planning (exec_jit.c) in cuda
 * mode: fusion groups, lone lowerable nodes (lone layout ops included, a
 * copy on the device), AdamW runs and GEMM bias epilogues, each generated
 * kernel printed as CUDA C; the parts of one attention's backward
 * (plan_attn_grad_runs) one group of library kernels at the last part
 * (cg_cuda_attn_grads_kernel: the statistics once, dk and dv together).  The nodes no kernel covers get, by op:
 *   input, state, output      copies / pointers (the executor, rt.c)
 *   matmul                    a GEMM (cuBLASLt; the host BLAS emulated)
 *   collectives, send / recv, stash, group_sum
 *                             the communication layer
 *   anything cuda_lib.c has   its library kernel(s)
 * and anything else is refused, naming the node.  Library kernels are
 * printed once per distinct text (the same op on the same shapes in every
 * layer shares one function), named <op>_<hash>. */
#include "rt_priv.h"
#include "dev_priv.h"
#include "plan/flops.h"

/* Whether op's node runs in the communication layer. */
int rt_dev_is_comm(IrOp op) {
  switch (op) {
  case IR_OP_ALL_REDUCE: case IR_OP_ALL_GATHER: case IR_OP_REDUCE_SCATTER: case IR_OP_ALL_TO_ALL:
  case IR_OP_ALL_TO_ALL_V: case IR_OP_RING_SHIFT: case IR_OP_RING_WAIT: case IR_OP_SEND: case IR_OP_RECV:
  case IR_OP_STASH: case IR_OP_UNSTASH: case IR_OP_GROUP_SUM:
    return 1;
  default:
    return 0;
  }
}

/* A distinct library kernel: the hash of its text and its launches. */
typedef struct {
  uint64_t hash;
  RtDevLib lib;
} LibSeen;
typedef VEC(LibSeen) LibSeenVec;
typedef VEC(RtCudaKernelInfo) KernelInfoVec;

/* A writer of library kernels (cuda.h: cg_cuda_lib_kernel's contract). */
typedef int (*LibGen)(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src, CgCudaLaunch *l,
                      int *nl, int64_t *scratch, char *why, size_t whylen);

/* What to write: node i's kernels by gen, or (run != NULL) the launch
 * group of one attention's backward, nodes run[0 .. nrun) (i their last). */
typedef struct {
  LibGen gen;
  const int *run;
  int nrun;
} LibJob;

static int lib_write(const IrModule *m, const IrBlock *b, int i, const LibJob *job, const char *name, StrBuf *src,
                     RtDevLib *l, char *why, size_t whylen) {
  if (job->run)
    return cg_cuda_attn_grads_kernel(m, b, job->run, job->nrun, name, src, l->l, &l->nl, &l->scratch, why, whylen);
  return job->gen(m, b, i, name, src, l->l, &l->nl, &l->scratch, why, whylen);
}

/* Library kernels of node i by job: printed into src unless an identical
 * one is there (seen), its launches into *out (none: out->nl = 0).  0; -1
 * with a message. */
static int lib_kernel(const IrModule *m, const IrBlock *b, int i, const LibJob *job, StrBuf *src, LibSeenVec *seen,
                      KernelInfoVec *info, RtDevLib *out, char *err, size_t errlen) {
  const IrNode *nd = &b->nodes[i];
  StrBuf probe = {0};
  RtDevLib l;
  memset(&l, 0, sizeof l);
  char why[512] = "";
  int r = lib_write(m, b, i, job, "TSLIB", &probe, &l, why, sizeof why);
  if (r != 0) {
    sb_free(&probe);
    if (r > 0)
      return ts_errf(err, errlen, "block %s, %%%d = %s: no CUDA kernel for this op%s%s", b->name, i,
                     ir_ops[nd->op].name, why[0] ? ": " : "", why);
    return ts_errf(err, errlen, "block %s, %%%d = %s: %s", b->name, i, ir_ops[nd->op].name, why);
  }
  if (l.nl == 0) { sb_free(&probe); *out = l; return 0; }
  uint64_t h = ts_hash64(probe.p, probe.n, 0);
  sb_free(&probe);
  for (int s = 0; s < seen->n; s++)
    if (seen->a[s].hash == h) { *out = seen->a[s].lib; return 0; }
  char name[64];
  snprintf(name, sizeof name, "%.40s_%08llx", job->run ? "attention_grads" : ir_ops[nd->op].name,
           (unsigned long long)(h & 0xffffffffu));
  memset(&l, 0, sizeof l);
  if (lib_write(m, b, i, job, name, src, &l, why, sizeof why) != 0)
    return ts_errf(err, errlen, "block %s, %%%d = %s: %s", b->name, i, ir_ops[nd->op].name, why);
  LibSeen ls = {h, l};
  VEC_PUSH(*seen, ls);
  for (int k = 0; k < l.nl; k++) {
    RtCudaKernelInfo ki;
    memset(&ki, 0, sizeof ki);
    snprintf(ki.name, sizeof ki.name, "%s", l.l[k].name);
    if (job->run)
      snprintf(ki.where, sizeof ki.where, "block %s, %%%d = %s and %d other part(s) (library kernels, one group)",
               b->name, i, ir_ops[nd->op].name, job->nrun - 1);
    else
      snprintf(ki.where, sizeof ki.where, "block %s, %%%d = %s (library kernel)", b->name, i, ir_ops[nd->op].name);
    VEC_PUSH(*info, ki);
  }
  *out = l;
  return 0;
}

/* The step of node i of block b that no kernel of jb covers. */
static int classify(const IrModule *m, const IrBlock *b, int i, const MemPlan *pl, int *kind) {
  const IrNode *nd = &b->nodes[i];
  if (pl && ((pl->buf[i] >= 0 && pl->buf[i] != i) || pl->view[i])) { *kind = RT_DS_ALIAS; return 0; }
  switch (nd->op) {
  case IR_OP_INPUT: *kind = RT_DS_INPUT; return 0;
  case IR_OP_STATE: *kind = RT_DS_STATE; return 0;
  case IR_OP_OUTPUT: *kind = RT_DS_OUTPUT; return 0;
  case IR_OP_MATMUL:
    if (!rt_gemm_node_ok(b, i)) return -1;
    *kind = RT_DS_GEMM;
    return 0;
  default: break;
  }
  if (rt_dev_is_comm(nd->op)) { *kind = RT_DS_COMM; return 0; }
  *kind = RT_DS_LIB;
  return 0;
}

/* Finds each kernel's lines in the module (its `__global__` line up to
 * the line before the next one) and its `where` from info. */
static void locate(RtCudaModule *cm, const RtCudaKernelInfo *info, int ninfo) {
  const char *s = cm->src.p ? cm->src.p : "";
  int line = 1;
  KernelInfoVec k = {0};
  for (const char *q = s; *q; q++) {
    if ((q == s || q[-1] == '\n') && strncmp(q, "extern \"C\" __global__", 21) == 0) {
      const char *v = strstr(q, " void ");
      RtCudaKernelInfo ki;
      memset(&ki, 0, sizeof ki);
      if (v) {
        v += 6;
        while (*v == ' ') v++;
        if (strncmp(v, "__launch_bounds__(", 18) == 0) {   /* void __launch_bounds__(256) NAME(TsArgs a) */
          v = strchr(v, ')');
          v = v ? v + 1 : "";
          while (*v == ' ') v++;
        }
        size_t len = strcspn(v, "( \n");
        snprintf(ki.name, sizeof ki.name, "%.*s", (int)(len < sizeof ki.name ? len : sizeof ki.name - 1), v);
      }
      ki.line0 = line;
      if (k.n) k.a[k.n - 1].line1 = line - 1;
      for (int j = 0; j < ninfo; j++)
        if (strcmp(info[j].name, ki.name) == 0) { snprintf(ki.where, sizeof ki.where, "%s", info[j].where); break; }
      VEC_PUSH(k, ki);
    }
    if (*q == '\n') line++;
  }
  if (k.n) k.a[k.n - 1].line1 = line;
  cm->kern = k.a;
  cm->nkern = k.n;
}

RtDevPlan *rt_dev_plan_new(const IrModule *m, RtJit *jit, const MemPlan *const *plans, char *err, size_t errlen) {
  RtDevPlan *P = ts_xcalloc(1, sizeof *P);
  P->nblocks = m->blocks.n;
  P->blk = ts_xcalloc((size_t)(m->blocks.n ? m->blocks.n : 1), sizeof *P->blk);
  StrBuf lib = {0};
  LibSeenVec seen = {0};
  KernelInfoVec info = {0};
  int rc = 0;
  for (int bi = 0; bi < m->blocks.n && rc == 0; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    const RtJitBlock *jb = rt_jit_block(jit, bi);
    RtDevBlock *db = &P->blk[bi];
    db->kind = ts_xcalloc((size_t)(b->n ? b->n : 1), sizeof *db->kind);
    db->lib = ts_xcalloc((size_t)(b->n ? b->n : 1), sizeof *db->lib);
    for (int i = 0; i < b->n && rc == 0; i++) {
      db->lib[i] = -1;
      if (jb && jb->kern[i] >= 0) {
        db->kind[i] = RT_DS_KERNEL;
        const RtJitKernel *K = &jb->k.a[jb->kern[i]];
        if (!K->attn_grads || K->at != i) continue;
        /* the backward of one attention: its library kernels, one group (at the last part) */
        RtDevLib l;
        LibJob job = {NULL, K->run, K->nrun};
        if (lib_kernel(m, b, i, &job, &lib, &seen, &info, &l, err, errlen) != 0) { rc = -1; break; }
        if (l.scratch > P->scratch) P->scratch = l.scratch;
        VEC_PUSH(P->lib, l);
        db->lib[i] = P->lib.n - 1;
        continue;
      }
      int kind;
      if (classify(m, b, i, plans ? plans[bi] : NULL, &kind) != 0) {
        rc = ts_errf(err, errlen, "block %s, %%%d = %s: the device cannot run this product (shapes)", b->name, i,
                     ir_ops[b->nodes[i].op].name);
        break;
      }
      db->kind[i] = (unsigned char)kind;
      /* an fp8 reshape's byte copy (the kernel IR has no byte type) is in
       * the module whether or not the memory plan makes it a view, so the
       * module is the same with and without plans (mcc's, mrun's) */
      int fp8_view = kind == RT_DS_ALIAS && b->nodes[i].op == IR_OP_RESHAPE && ir_dtype_is_8(b->nodes[i].type.dtype);
      if (kind != RT_DS_LIB && kind != RT_DS_COMM && !fp8_view) continue;
      /* a collective may need a re-layout around NCCL, on the comm stream's scratch */
      RtDevLib l;
      LibJob job = {kind != RT_DS_COMM ? cg_cuda_lib_kernel : cg_cuda_comm_relayout, NULL, 0};
      if (lib_kernel(m, b, i, &job, &lib, &seen, &info, &l, err, errlen) != 0) { rc = -1; break; }
      int64_t *most = kind != RT_DS_COMM ? &P->scratch : &P->comm_scratch;
      if (l.scratch > *most) *most = l.scratch;
      if (l.nl == 0) continue;
      VEC_PUSH(P->lib, l);
      db->lib[i] = P->lib.n - 1;
    }
  }
  if (rc == 0) {
    const char *lt = lib.p ? lib.p : "";   /* the fp8 conversions, for the modules that call them */
    sb_printf(&P->mod.src, "%s%s", cg_cuda_prelude(),
              strstr(lt, "ts_f8") || strstr(lt, "ts_f32_f8") ? cg_cuda_fp8_prelude() : "");
    const StrBuf *gen = rt_jit_cuda_source(jit);
    if (gen->n) sb_printf(&P->mod.src, "%s", gen->p);
    if (lib.n) sb_printf(&P->mod.src, "%s", lib.p);
    P->mod.hash = ts_hash64(P->mod.src.p, P->mod.src.n, 0);
    int ngen;
    const RtCudaKernelInfo *gi = rt_jit_cuda_info(jit, &ngen);
    for (int j = 0; j < ngen; j++) VEC_PUSH(info, gi[j]);
    locate(&P->mod, info.a, info.n);
  }
  sb_free(&lib);
  free(seen.a);
  free(info.a);
  if (rc != 0) { rt_dev_plan_free(P); return NULL; }
  return P;
}

void rt_dev_plan_free(RtDevPlan *P) {
  if (!P) return;
  for (int b = 0; b < P->nblocks; b++) {
    free(P->blk[b].kind);
    free(P->blk[b].lib);
  }
  free(P->blk);
  free(P->lib.a);
  rt_cuda_module_free(&P->mod);
  free(P);
}

/* The kernel planning of m for a device, no device open (cuda mode). */
static RtJit *cuda_planning(const IrModule *m, char *err, size_t errlen) {
  RtExecOpts o = rt_exec_default();
  o.backend = RT_BACKEND_LLVM;
  o.cuda = 1;
  o.dev = NULL;
  return rt_jit_new(m, &o, err, errlen);
}

int rt_cuda_module_build(const IrModule *m, RtCudaModule *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  RtJit *J = cuda_planning(m, err, errlen);
  if (!J) return -1;
  RtDevPlan *P = rt_dev_plan_new(m, J, NULL, err, errlen);
  rt_jit_free(J);
  if (!P) return -1;
  *out = P->mod;
  memset(&P->mod, 0, sizeof P->mod);
  rt_dev_plan_free(P);
  return 0;
}

/* ---- launch sites (mcc --report kernels) ---- */

static double value_bytes(const IrBlock *b, int id) {
  const IrType *t = &b->nodes[id].type;
  return (double)ir_type_numel(t) * (double)ir_dtype_size(t->dtype);
}

/* A site of node i of block b: where it is, its launch. */
static RtCudaKernelUse kernel_use(const IrBlock *b, int i, const CgCudaLaunch *l, int lib) {
  RtCudaKernelUse u;
  memset(&u, 0, sizeof u);
  snprintf(u.name, sizeof u.name, "%s", l->name);
  snprintf(u.where, sizeof u.where, "block %s, %%%d = %s", b->name, i, ir_ops[b->nodes[i].op].name);
  u.block = b->name;
  u.lib = lib;
  u.blocks = l->blocks;
  u.threads = l->threads;
  u.launches = 1;
  return u;
}

/* The arithmetic per element of an optimizer step's kernel
 * (cg_lower_opt_step): adamw's moments, bias corrections, sqrt and decay;
 * sgd's decay, momentum and step (Nesterov counted); lion's interpolation,
 * sign, decay and moment; lr_step's decay and scaled step. */
static double opt_step_flops(IrOp op) {
  switch (op) {
  case IR_OP_ADAMW: return 15;
  case IR_OP_SGD: return 8;
  case IR_OP_LION: return 12;
  default: return 6;
  }
}

/* Operand and result bytes of node i, and its FLOPs (attention's, else
 * one per result element). */
static void node_cost(const IrBlock *b, int i, double *bytes, double *flops) {
  const IrNode *nd = &b->nodes[i];
  *bytes = value_bytes(b, i);
  for (int j = 0; j < nd->nin; j++) *bytes += value_bytes(b, nd->in[j]);
  double af = plan_attn_flops(b, nd, 0);
  *flops = af > 0 ? af : (double)ir_type_numel(&nd->type);
}

int rt_cuda_kernel_uses(const IrModule *m, RtCudaModule *mod, RtCudaKernelUse **uses, int *n, char *err,
                        size_t errlen) {
  *uses = NULL;
  *n = 0;
  if (mod) memset(mod, 0, sizeof *mod);
  RtJit *J = cuda_planning(m, err, errlen);
  if (!J) return -1;
  /* the memory plans as the executor makes them: reshapes that alias launch nothing */
  int nb = m->blocks.n ? m->blocks.n : 1;
  MemPlan *mp = ts_xcalloc((size_t)nb, sizeof *mp);
  const MemPlan **plans = ts_xcalloc((size_t)nb, sizeof *plans);
  int rc = 0;
  for (int bi = 0; bi < m->blocks.n && rc == 0; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    int *at = ts_xmalloc((size_t)(b->n ? b->n : 1) * sizeof *at);
    plan_mem_group_at(b, at);
    rc = plan_mem_block_at(m, bi, at, &mp[bi], err, errlen);
    free(at);
    plans[bi] = &mp[bi];
  }
  RtDevPlan *P = rc == 0 ? rt_dev_plan_new(m, J, plans, err, errlen) : NULL;
  VEC(RtCudaKernelUse) v = {0};
  for (int bi = 0; P && bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    const RtJitBlock *jb = rt_jit_block(J, bi);
    for (int i = 0; i < b->n; i++) {
      /* a value sharing its operand's bytes runs nothing (rt.c walk_block) */
      if (mp[bi].view[i] || (mp[bi].buf[i] >= 0 && mp[bi].buf[i] != i)) continue;
      const RtJitKernel *K = jb && jb->kern[i] >= 0 ? &jb->k.a[jb->kern[i]] : NULL;
      if (P->blk[bi].kind[i] == RT_DS_KERNEL && K && K->at == i && !K->attn_grads && !K->gemm_mm && !K->accum_from &&
          K->cl.name[0]) {
        RtCudaKernelUse u = kernel_use(b, i, &K->cl, 0);
        if (K->opt) {   /* per tensor: param and moments read and written, the gradient read */
          int nmom, nkey;
          cg_opt_step_layout(K->op, &nmom, &nkey);
          u.launches = 0;
          for (int j = 0; j < K->nrun; j++)
            for (int h = 0; h < 2; h++) {
              int64_t c = K->ccnt ? K->ccnt[2 * j + h] : 0;
              if (c <= 0) continue;
              u.launches++;
              const IrNode *sn = &b->nodes[K->run[j]];
              double es = (double)ir_dtype_size(b->nodes[sn->in[sn->nin - 1]].type.dtype);
              u.bytes += (1.0 + 2.0 * (1 + nmom)) * es * (double)c;
              u.flops += opt_step_flops(K->op) * (double)c;
            }
        } else {
          for (int j = 0; j < K->io.nin; j++) u.bytes += value_bytes(b, K->io.in[j]);
          for (int j = 0; j < K->io.nout; j++) u.bytes += value_bytes(b, K->io.out[j]);
          for (int g = 0; g <= i; g++)   /* the group's members: one flop per element each */
            if (g == i || (b->nodes[i].group > 0 && b->nodes[g].group == b->nodes[i].group))
              u.flops += (double)ir_type_numel(&b->nodes[g].type);
        }
        VEC_PUSH(v, u);
      }
      int li = P->blk[bi].lib[i];
      if (li < 0 || (P->blk[bi].kind[i] != RT_DS_LIB && P->blk[bi].kind[i] != RT_DS_KERNEL)) continue;
      const RtDevLib *L = &P->lib.a[li];
      double bytes = 0, flops = 0;
      if (K && K->attn_grads)   /* one attention's backward parts, at the last */
        for (int j = 0; j < K->nrun; j++) {
          double bb, ff;
          node_cost(b, K->run[j], &bb, &ff);
          bytes += bb;
          flops += ff;
        }
      else node_cost(b, i, &bytes, &flops);
      for (int j = 0; j < L->nl; j++) {   /* the node's costs on its first launch */
        RtCudaKernelUse u = kernel_use(b, i, &L->l[j], 1);
        if (j == 0) u.bytes = bytes, u.flops = flops;
        VEC_PUSH(v, u);
      }
    }
  }
  for (int bi = 0; bi < m->blocks.n; bi++) plan_mem_free(&mp[bi]);
  free(mp);
  free(plans);
  if (!P) { rt_jit_free(J); return -1; }
  if (mod) {
    *mod = P->mod;
    memset(&P->mod, 0, sizeof P->mod);
  }
  rt_dev_plan_free(P);
  rt_jit_free(J);
  *uses = v.a;
  *n = v.n;
  return 0;
}

void rt_cuda_module_free(RtCudaModule *cm) {
  sb_free(&cm->src);
  free(cm->kern);
  memset(cm, 0, sizeof *cm);
}

const RtCudaKernelInfo *rt_cuda_module_kernel_at(const RtCudaModule *cm, int line) {
  for (int k = 0; k < cm->nkern; k++)
    if (line >= cm->kern[k].line0 && line <= cm->kern[k].line1) return &cm->kern[k];
  return NULL;
}
