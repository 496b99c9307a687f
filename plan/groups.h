/* groups.h - which nodes of a block run as one launch: the rules that both
 * the compiler (passes/fuse.c forms fusion groups by them; plan/memplan.c
 * plans buffers by them) and the executor (runtime/exec: which kernel runs
 * each node) use.  Pure functions of the IR: nothing here changes it.
 *
 *   - a node the code generator may run as a generated kernel, alone or in
 *     a fusion group (IrNode.group);
 *   - a GEMM bias epilogue: one BLAS call with beta = 1 into the add's
 *     buffer pre-filled with the broadcast bias;
 *   - a run of optimizer steps (adamw, sgd, lion, lr_step) updated by ONE
 *     multi-tensor launch;
 *   - the attention_bwd parts (dq, dk, dv) of one attention computed by ONE
 *     pass over its tiles;
 *   - a gradient made straight into its state: a GEMM with beta = 1, or
 *     the embedding's scatter-add, into the accum's state. */
#ifndef TS_PLAN_GROUPS_H
#define TS_PLAN_GROUPS_H
#include "ir/ir.h"

/* Whether node i of b may be run as a generated kernel (in a group or
 * alone): cg_op_lowerable, and not a node whose kernel would need the
 * rank's mesh offsets (causal mask on split dims, dropout on a split dim,
 * row op on a split last dim). */
int plan_kernel_node_ok(const IrModule *m, const IrBlock *b, int i);

/* A GEMM bias epilogue: add = matmul (seen through up to
 * PLAN_EPILOGUE_MAX_RESHAPES reshapes, ascending) + broadcast bias, either
 * operand order, all one float dtype.  plan_epilogue_match: whether node a
 * is the add of one (structure only; 1 and *e filled, or 0);
 * plan_epilogue_members: its nodes, ascending, into mem (returns the
 * count, at most PLAN_EPILOGUE_MAX_RESHAPES + 3). */
#define PLAN_EPILOGUE_MAX_RESHAPES 4
typedef struct { int matmul, bias, add, nreshape, reshape[PLAN_EPILOGUE_MAX_RESHAPES]; } PlanEpilogue;
int plan_epilogue_match(const IrBlock *b, int a, PlanEpilogue *e);
int plan_epilogue_members(const PlanEpilogue *e, int *mem);

/* Optimizer steps as one launch: the runs of adamw, sgd, lion or lr_step
 * nodes of b that the executor updates in ONE multi-tensor launch (one
 * op, the same dtypes and the same constant attributes, cg_opt_step_layout:
 * adamw's b1, b2, eps, sgd's momentum and nesterov, lion's betas; no node
 * between two of them writes state or reads a state an earlier one
 * wrote).  run_at[i] (b->n entries) = the position of the launch (the
 * run's last node) for every node in a run, -1 for other nodes.
 * Returns the number of runs. */
int plan_opt_runs(const IrBlock *b, int *run_at);

/* The backward of one attention as one launch: attention_bwd nodes of b
 * with the same operands (q, k, v, o, do) and attributes (causal, scale)
 * and different parts, when no other node reads one of them before the
 * last (the launch runs there) and every operand is a value (not a state
 * an effect in between could write).  run_at[i] (b->n entries) = the
 * position of the launch (the last part) for each member of such a group
 * of two or three, -1 for other nodes.  Returns the number of groups. */
int plan_attn_grad_runs(const IrBlock *b, int *run_at);

/* Gradients made straight into their state: accum @s of a producer, seen
 * through up to PLAN_EPILOGUE_MAX_RESHAPES reshapes, where nothing else
 * reads the producer's value or the reshapes, no member is in a fusion
 * group, and no effect between the producer and the accum could write an
 * operand that is a state.  Producers: a matmul of two 2-D operands of its
 * float dtype, or of two bf16 / f16 operands with an f32 result (the
 * executor runs C = A.B + C, beta = 1, C the state's bytes; 16-bit
 * operands converted to f32 first) and embedding_bwd (its scatter-add adds into the state's rows).
 * Both run at the accum's position; the producer's value never gets a
 * buffer.  run_at[i] (b->n entries) = the accum's position for the
 * producer, its reshapes and the accum, -1 for other nodes.  Returns the
 * number of such accums. */
int plan_accum_direct_runs(const IrBlock *b, int *run_at);

#endif
