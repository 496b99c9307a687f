/* flops.h - the FLOPs of a node, counted one way for the compiler's step
 * time model (passes/timereport.c) and the runtime's measured TFLOP/s and
 * MFU (runtime/exec/train.c), so that what mrun reports is what mcc
 * predicts.  Pure functions of the IR. */
#ifndef TS_PLAN_FLOPS_H
#define TS_PLAN_FLOPS_H
#include "ir/ir.h"

/* GEMM shape of a matmul node: batch, M, N, K (the result is [..., M, N]). */
void plan_matmul_shape(const IrBlock *b, const IrNode *n, double *batch, double *M, double *N, double *K);

/* FLOPs of an attention-family node (attention, attention_bwd, attn_acc,
 * attn_bwd_q, attn_bwd_kv) in units of B Hq Tq Tk D: forward 4 (q k^T and
 * p v), backward parts dq 6, dk 6, dv 4 (each recomputes the scores); with
 * full = 0 times the visited fraction of the score matrix (causal: half; a
 * window W: W of Tk keys), with full = 1 the whole matrix (Megatron's
 * model FLOPs).  0 for any other op. */
double plan_attn_flops(const IrBlock *b, const IrNode *n, int full);
/* The visited fraction itself. */
double plan_attn_frac(int causal, int64_t window, double Tk);

/* Megatron's model FLOPs of a node of a forward: GEMMs 2 M N K (matmul,
 * gmm), fused attention forward 4 B H Tq Tk D over the full score matrix
 * (attention, attn_acc); 0 for everything else. */
double plan_node_model_flops(const IrBlock *b, const IrNode *n);

/* The model FLOPs one micro batch of program m runs forward: the nodes of
 * block "forward" (the frontend's module), of block "micro" before its
 * `output "loss"` (a compiled program: what follows is the backward and
 * recomputation), or of every forward chunk block fwd.<g> (a pipeline
 * rank).  A sharded program counts its own share (1/tp of a tp-split
 * GEMM ...): summed over a replica's ranks it is the model's. */
double plan_forward_model_flops(const IrModule *m);

#endif
