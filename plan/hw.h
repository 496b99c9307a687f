/* hw.h - hardware descriptions as data, and the cost model over them.
 *
 * A description (hw/<name>.hw, format in hw/README.md) gives one
 * accelerator and its node: peak dense FLOP/s per number format, HBM size
 * and bandwidth, the NVLink domain (GPUs per node, bandwidth per GPU), the
 * NICs, and the few efficiency constants of the model below.  mcc's
 * `--report time` and `--emit=trace` read one (`--hw NAME|FILE`); later
 * mrun's calibration writes the same format for a CPU host, and its MFU
 * reads the peak from one.  Shared by both sides, hence plan/.
 *
 * The cost model, every formula in docs/performance-model.md:
 *   GEMM        t = overhead + max(F / (peak * eff * waves), bytes / (bw * mem_eff))
 *               waves = units / (ceil(units / SMs) * SMs), units of tile_m x tile_n outputs
 *               by tile_k of the K loop (split-K / stream-K);
 *   attention   t = overhead + F / (peak * attention_eff), F the kernel's own FLOPs;
 *   memory      t = overhead + bytes / (hbm_bw * mem_eff);
 *   collectives the alpha-beta (latency-bandwidth) model of NCCL's ring and tree
 *               algorithms over the link the axis's group uses (NVLink inside
 *               the NVSwitch domain, the NICs across nodes).
 * Pure functions; nothing here knows a model. */
#ifndef TS_PLAN_HW_H
#define TS_PLAN_HW_H
#include "ir/ir.h"

/* the number formats a description gives a peak for */
typedef enum { HW_FP64, HW_FP32, HW_TF32, HW_BF16, HW_FP16, HW_FP8, HW_FMT_COUNT } HwFormat;
const char *hw_format_name(HwFormat f);

typedef struct {
  char name[64];               /* `name` key */
  char path[512];              /* the file it was read from */
  double peak[HW_FMT_COUNT];   /* dense FLOP/s; 0 = the format is not supported */
  double gemm_eff[HW_FMT_COUNT];   /* best fraction of peak a large GEMM reaches (0: 1) */
  double attention_eff[HW_FMT_COUNT]; /* fraction of peak of the fused attention kernels (0: gemm_eff) */
  double hbm_bytes;            /* memory per GPU */
  double hbm_bw;               /* bytes/s per GPU */
  double mem_eff;              /* fraction of hbm_bw a streaming kernel reaches */
  int sms;                     /* streaming multiprocessors (wave quantization) */
  int tile_m, tile_n;          /* the GEMM's output tile per thread block */
  int tile_k;                  /* the K depth of one unit of split-K / stream-K work */
  double kernel_overhead;      /* s per kernel launch (inside a CUDA graph) */
  int gpus_per_node;           /* the NVLink / NVSwitch domain */
  double nvlink_bw;            /* bytes/s per GPU per direction */
  double nvlink_latency;       /* s per algorithm step (alpha) inside the domain */
  double nvlink_eff;           /* fraction of nvlink_bw a collective reaches */
  int nics_per_node;
  double nic_bw;               /* bytes/s per NIC per direction */
  double nic_latency;          /* s per algorithm step across nodes */
  double nic_eff;              /* fraction of nic_bw a collective reaches */
} HwDesc;

/* Reads a description from text (`path` for messages).  0, or -1 with
 * "path:line: error: ..." in err (an unknown key, a bad number, a key
 * given twice, a missing key names the file and line 0... see hw.c). */
int hw_parse(const char *text, const char *path, HwDesc *out, char *err, size_t errlen);
/* `name_or_file`: a path (contains '/' or names an existing file), else a
 * name looked up as <data root>/hw/<name>.hw (ts_data_root, beside the
 * stdlib; $TESSERA_HW overrides the folder).  0, or -1 with a message
 * (listing the names there when the name is unknown). */
int hw_load(const char *name_or_file, HwDesc *out, char *err, size_t errlen);

/* The format a plan of dtype t computes its GEMMs in: f64 -> fp64, f32 ->
 * fp32 (CUDA cores: no TF32 unless `tf32` is set), bf16 -> bf16, f16 -> fp16. */
HwFormat hw_format_of(IrDtype t, int tf32);

/* ---- the cost model (seconds) ---- */
/* A batch of GEMMs [batch] x (M x K) . (K x N) in format f with elements of
 * `esize` bytes: the larger of its compute time (at the wave-quantized
 * efficiency) and its memory time (reading A and B, writing C once), plus
 * one launch. */
double hw_gemm_time(const HwDesc *h, HwFormat f, double batch, double M, double N, double K, double esize);
/* A kernel moving `bytes` to or from HBM (memory-bound). */
double hw_mem_time(const HwDesc *h, double bytes);
/* A fused attention kernel of `flops` (its own FLOPs, causal skipping
 * included) that also moves `bytes`. */
double hw_attention_time(const HwDesc *h, HwFormat f, double flops, double bytes);

/* Collectives over n ranks.  `stride`: how many ranks apart the group's
 * members are in the mesh (the product of the sizes of the axes inside
 * this one; ranks are numbered node by node); from it and n the link:
 * inside one node (stride * n <= gpus_per_node) NVLink, else the NICs. */
typedef enum { HW_ALL_REDUCE, HW_ALL_GATHER, HW_REDUCE_SCATTER, HW_ALL_TO_ALL, HW_SEND } HwColl;
typedef struct { double bw, latency; int inter; } HwLink;   /* achieved bytes/s per GPU, alpha, 1 = across nodes */
HwLink hw_link(const HwDesc *h, int n, int64_t stride);
/* `bytes`: the whole tensor (all_reduce / reduce_scatter: the operand;
 * all_gather: the result; all_to_all: the buffer; send: the message).
 *   ring all_reduce   2(n-1) a + 2(n-1)/n S / B
 *   tree all_reduce   2 ceil(log2 n) a + 2 S / B   (NCCL's double binary tree)
 *   all_reduce        the faster of the two (NCCL's tuner picks per size)
 *   all_gather, reduce_scatter, all_to_all   (n-1) a + (n-1)/n S / B
 *   send              a + S / B */
double hw_coll_time(const HwLink *l, HwColl c, int n, double bytes);

#endif
