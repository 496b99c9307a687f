#!/usr/bin/env bash
# gpu_refused.sh - an --fp8 plan on a (fake) GPU is refused, naming --cpu
# (the fp8 GPU path is not built: docs/precision.md "FP8"); it trains on CPU
# ranks.
#   gpu_refused.sh BIN SRC WORK FAKE
set -uo pipefail
bin=$1 src=$2 work=$3 fake=$4
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --fp8 hybrid --fp8-all-layers -o b.plan || fail "mcc"
export TS_CUDA_DRIVER=$fake/libcuda.so.1 TS_CUBLASLT_LIB=$fake/libcublasLt.so.13 FAKE_CUDA_DEVICES=90
export FAKE_CUDART_DEVICES=1 LD_LIBRARY_PATH=$fake/nccl TS_CACHE_DIR=off
out=$("$bin/mrun" b.plan --steps 1 --metrics m.jsonl 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] || fail "mrun ran an fp8 plan on a GPU (exit 0)"
echo "$out" | grep -qF "this plan trains with --fp8 (matmul8 on f8e4m3 / f8e5m2 operands), and its GPU path (cuBLASLt's fp8 GEMMs, the quantizing kernels) is not built yet" && echo "$out" | grep -q "mrun --cpu" || fail "no message naming --cpu"
[ ! -s m.jsonl ] || fail "a step ran"
"$bin/mrun" b.plan --cpu --steps 1 --quiet 2>&1 || fail "--cpu does not train it"
echo "ok: refused on the GPU with a message naming --cpu; trains with --cpu"
