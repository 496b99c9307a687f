#!/usr/bin/env bash
# gpu_arch.sh - an --fp8 plan on a GPU below sm_89 (the fake driver's
# sm_80, tests/cuda_dev): cuBLASLt has no fp8 GEMM there, so mrun refuses
# before any step, naming the arch, sm_89 and --cpu; the same plan trains
# with --cpu; mcc --target sm_80 refuses at compile time; mcc --emit=cuda
# (no arch) writes the module, with the fp8 kernels (codegen/cuda_fp8.c).
#   gpu_arch.sh BIN_DIR SOURCE_DIR WORK FAKE_DIR
set -uo pipefail
bin=$1 src=$2 work=$3 fake=$4
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1
     --precision bf16 --fp8 hybrid --fp8-all-layers)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" -o b.plan || fail "mcc"
export TS_CUDA_DRIVER=$fake/libcuda.so.1 TS_CUBLASLT_LIB=$fake/libcublasLt.so.13 FAKE_CUDA_DEVICES=80
export FAKE_CUDART_DEVICES=1 LD_LIBRARY_PATH=$fake/nccl TS_CACHE_DIR=off
out=$("$bin/mrun" b.plan --steps 1 --metrics m.jsonl 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] || fail "mrun ran an --fp8 plan on an sm_80 GPU (exit 0)"
for want in "this plan trains with --fp8 (matmul8 on f8e4m3 / f8e5m2 operands), and this GPU is sm_80" \
            ": cuBLASLt's fp8 GEMMs need sm_89 or newer (Ada, Hopper: sm_90 for H100 / H200): run it on CPU ranks" "mrun --cpu"; do
  echo "$out" | grep -qF "$want" || fail "the refusal does not say: $want"
done
[ ! -s m.jsonl ] || fail "a step ran"
"$bin/mrun" b.plan --cpu --steps 1 --quiet 2>&1 || fail "--cpu does not train it"
out=$("$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --target sm_80 -o t.plan 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qF "need sm_89 or newer" || fail "--target sm_80: $out"
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --emit=cuda cu > emit.txt 2>&1 || fail "--emit=cuda: $(cat emit.txt)"
grep -l "ts_f32_f8e4m3" cu/*.cu > /dev/null || fail "--emit=cuda wrote no fp8 kernel"
echo "ok: refused on sm_80 naming sm_89 and --cpu; trains with --cpu; --target sm_80 refused; --emit=cuda has the fp8 kernels"
