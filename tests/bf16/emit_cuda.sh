#!/usr/bin/env bash
# emit_cuda.sh - a bf16 (or fp16) plan's CUDA module (mcc --emit=cuda): the
# 16-bit buffers are unsigned short, loaded through ts_bf16_f32 (ts_f16_f32)
# and stored through ts_f32_bf16 (ts_f32_f16) (runtime/cpu/half.h's
# rounding), the arithmetic between them in float; an fp16 plan's module
# also has the loss scaling's kernels (nonfinite, scale_update).  The
# numbers are checked where the kernels run: the fake-GPU cells
# cuda_dev.fake_gpu_*bf16*, *fp16* (the CUDA emulator against CPU ranks).
#   emit_cuda.sh BIN_DIR SOURCE_DIR WORK [PREC]
set -uo pipefail
bin=$1 src=$2 work=$3 prec=${4:-bf16}
h=$([ "$prec" = fp16 ] && echo f16 || echo bf16)
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision $prec --emit=cuda cu || fail "--emit=cuda"
n16=$(grep -c "unsigned short \*" cu/*.cu) nup=$(grep -o "ts_${h}_f32(v" cu/*.cu | wc -l) ndown=$(grep -o "ts_f32_${h}((float)v" cu/*.cu | wc -l)
echo "$h buffers: $n16, loads widened: $nup, stores rounded: $ndown"
[ "$n16" -gt 10 ] && [ "$nup" -gt 10 ] && [ "$ndown" -gt 10 ] || fail "too few $h loads/stores in the module"
other=$([ "$h" = f16 ] && echo bf16 || echo f16)
! grep -q "ts_f32_${other}((float)v\|ts_${other}_f32(v" cu/*.cu || fail "a $prec module converts $other"
if [ "$prec" = fp16 ]; then
  grep -q "x\[e\] - x\[e\] == 0" cu/*.cu && grep -q "if (found) skipped += 1" cu/*.cu ||
    fail "no loss-scaling kernels (nonfinite, scale_update) in the fp16 module"
fi
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision f32 --emit=cuda cu32 || fail "--emit=cuda f32"
! grep -q "unsigned short \*" cu32/*.cu || fail "an f32 plan has 16-bit buffers"
echo "ok: the $prec module stores $h and computes in f32"
