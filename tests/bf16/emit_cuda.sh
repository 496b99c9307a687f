#!/usr/bin/env bash
# emit_cuda.sh - a bf16 plan's CUDA module (mcc --emit=cuda): bf16 buffers
# are unsigned short, loaded through ts_bf16_f32 and stored through
# ts_f32_bf16 (runtime/cpu/half.h's rounding), the arithmetic between them
# in float.  The numbers are checked where the kernels run: the fake-GPU
# cells cuda_dev.fake_gpu_*bf16* (the CUDA emulator against CPU ranks).
#   emit_cuda.sh BIN_DIR SOURCE_DIR WORK
set -uo pipefail
bin=$1 src=$2 work=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --emit=cuda cu || fail "--emit=cuda"
n16=$(grep -c "unsigned short \*" cu/*.cu) nup=$(grep -o "ts_bf16_f32(v" cu/*.cu | wc -l) ndown=$(grep -o "ts_f32_bf16((float)v" cu/*.cu | wc -l)
echo "bf16 buffers: $n16, loads widened: $nup, stores rounded: $ndown"
[ "$n16" -gt 10 ] && [ "$nup" -gt 10 ] && [ "$ndown" -gt 10 ] || fail "too few bf16 loads/stores in the module"
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision f32 --emit=cuda cu32 || fail "--emit=cuda f32"
! grep -q "unsigned short \*" cu32/*.cu || fail "an f32 plan has bf16 buffers"
echo "ok: the bf16 module stores bf16 and computes in f32"
