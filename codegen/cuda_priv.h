/* cuda_priv.h - what the library kernel writers (cuda_lib.c, cuda_attn.c)
 * share: the mesh's axis sizes, double literals, 1-D launches, and the
 * kernel head and grid-stride loop they all print. */
#ifndef TS_CG_CUDA_PRIV_H
#define TS_CG_CUDA_PRIV_H
#include "cuda.h"

/* Size of mesh axis a (IrAxis) the module was compiled for (>= 1). */
int cg_cuda_axis_size(const IrModule *m, int a);
/* v as a C++ double literal ("10000.0", not the int 10000). */
void cg_cuda_dlit(char *buf, size_t n, double v);
/* Launch k of the node (kernel NAME_k): `threads` per block, blocks to
 * cover `work` items (at least 1, at most 65535 * 32: kernels loop). */
void cg_cuda_launch(CgCudaLaunch *l, const char *name, int k, int64_t work, int threads);

#define CG_CUDA_HEAD(src, name, k) sb_printf(src, "\nextern \"C\" __global__ void %s_%d(TsArgs a) {\n", name, k)
#define CG_CUDA_GRID_LOOP(src, var, n) \
  sb_printf(src, "  for (long long %s = blockIdx.x * (long long)blockDim.x + threadIdx.x; %s < %lldLL;" \
            " %s += (long long)gridDim.x * blockDim.x) {\n", var, var, (long long)(n), var)

/* The flash-attention kernels (cuda_attn.c): attention, attention_bwd and
 * the ring steps attn_acc, attn_finish, attn_lse, attn_bwd_q, attn_bwd_kv.
 * Same contract as cg_cuda_lib_kernel. */
int cg_cuda_attn_op(IrOp op);
/* Prints `static __device__ long long FN(const long long *run, long long
 * g)`: the global index of local index g of a dim of L local elements
 * split over the axes of mask (cp's load-balanced halves included; ring_src
 * >= 0: the cp block a ring step holds), from the run's mesh coordinates. */
void cg_cuda_print_pos(const IrModule *m, StrBuf *src, const char *fn, unsigned mask, int64_t L, int64_t ring_src);
int cg_cuda_attn_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                        CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen);

/* The mixture-of-experts kernels (cuda_moe.c): topk_mask, capacity_mask,
 * moe_counts, moe_perm, moe_unperm, moe_gate_grad, gmm, gmm_dw. */
int cg_cuda_moe_op(IrOp op);
int cg_cuda_moe_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                       CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen);

/* The generation ops' kernels (cuda_decode.c): kv_write, slice_at,
 * attn_cached (rope_at is rope's, cuda_lib.c).  Same contract. */
int cg_cuda_decode_op(IrOp op);
int cg_cuda_decode_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                          CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen);

/* --fp8's kernels (cuda_fp8.c): quant8, amax_acc, fp8_scale, and a cast
 * into or out of f8e4m3 / f8e5m2, an fp8 reshape (cg_cuda_fp8_node: node i of b is one of
 * them).  Same contract as cg_cuda_lib_kernel; the module needs
 * cg_cuda_fp8_prelude (cuda.h) after the prelude. */
int cg_cuda_fp8_node(const IrBlock *b, int i);
int cg_cuda_fp8_kernel(const IrModule *m, const IrBlock *b, int i, const char *name, StrBuf *src,
                       CgCudaLaunch *l, int *nl, int64_t *scratch, char *why, size_t whylen);

#endif
