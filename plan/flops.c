/* flops.c - FLOPs per node (flops.h). */
#include "plan/flops.h"
#include <string.h>

void plan_matmul_shape(const IrBlock *b, const IrNode *n, double *batch, double *M, double *N, double *K) {
  const IrType *a = &b->nodes[n->in[0]].type;
  int r = n->type.rank;
  *M = r >= 2 ? (double)n->type.dim[r - 2] : 1;
  *N = r >= 1 ? (double)n->type.dim[r - 1] : 1;
  *K = n->ia[0] ? (double)a->dim[a->rank - 2] : (double)a->dim[a->rank - 1];
  double mn = *M * *N;
  *batch = mn > 0 ? (double)ir_type_numel(&n->type) / mn : 0;
}

double plan_attn_frac(int causal, int64_t window, double Tk) {
  double f = causal ? 0.5 : 1;
  if (window > 0 && (double)window / Tk < f) f = (double)window / Tk;
  return f;
}

/* B * Hq * Tq * Tk * D of an attention-like node whose operands 0 and 1
 * are q[B, Hq, Tq, D] and k[B, Hkv, Tk, D]. */
static double attn_size(const IrBlock *b, const IrNode *n, double *Tk) {
  const IrType *q = &b->nodes[n->in[0]].type, *k = &b->nodes[n->in[1]].type;
  *Tk = (double)k->dim[2];
  return (double)q->dim[0] * (double)q->dim[1] * (double)q->dim[2] * (double)k->dim[2] * (double)q->dim[3];
}

double plan_attn_flops(const IrBlock *b, const IrNode *n, int full) {
  int part = -1;
  double units = 4;
  switch (n->op) {
  case IR_OP_ATTENTION: case IR_OP_ATTN_ACC: units = 4; break;
  case IR_OP_ATTENTION_BWD: part = (int)n->ia[1]; break;
  case IR_OP_ATTN_BWD_Q: part = 0; break;
  case IR_OP_ATTN_BWD_KV: part = (int)n->ia[2]; break;
  default: return 0;
  }
  double Tk, s = attn_size(b, n, &Tk);
  if (part >= 0) units = part == 2 ? 4 : 6;
  return units * s * (full ? 1 : plan_attn_frac((int)n->ia[0], ir_attn_window(n), Tk));
}

double plan_node_model_flops(const IrBlock *b, const IrNode *n) {
  switch (n->op) {
  case IR_OP_MATMUL: {
    double bt, M, N, K;
    plan_matmul_shape(b, n, &bt, &M, &N, &K);
    return 2 * bt * M * N * K;
  }
  case IR_OP_GMM: {
    const IrType *a = &b->nodes[n->in[0]].type;
    return 2.0 * (double)a->dim[0] * (double)a->dim[1] * (double)n->type.dim[1];
  }
  case IR_OP_ATTENTION: case IR_OP_ATTN_ACC: return plan_attn_flops(b, n, 1);
  default: return 0;
  }
}

double plan_forward_model_flops(const IrModule *m) {
  const char *loss = ts_intern("loss");
  double fl = 0;
  for (int bi = 0; bi < m->blocks.n; bi++) {
    const IrBlock *b = &m->blocks.a[bi];
    IrChunkKind kind;
    int g = ir_block_chunk_kind(b, &kind), end = -1;
    if (!strcmp(b->name, "forward") || (g >= 0 && kind == IR_CHUNK_FWD)) end = b->n;
    else if (!strcmp(b->name, "micro"))
      for (int i = 0; i < b->n && end < 0; i++)
        if (b->nodes[i].op == IR_OP_OUTPUT && b->nodes[i].sa == loss) end = i;
    for (int i = 0; i < end; i++) fl += plan_node_model_flops(b, &b->nodes[i]);
  }
  return fl;
}
