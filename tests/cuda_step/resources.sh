#!/bin/bash
# resources.sh MCC MRUN WORKDIR SRCDIR - every kernel of the samples that
# have a CUDA form, at several sizes and layouts, compiled by NVRTC for
# sm_80 and sm_90 (mcc --target fails if NVRTC rejects a kernel or ptxas
# reports a spill, a stack frame, > 255 registers or > 48 KiB of shared
# memory), the images round-trip through the plan's text form, --emit=cuda
# writes the sources, and a plan whose cubin is damaged is refused.
set -uo pipefail
mcc=$1 mrun=$2 dir=$3 src=$4
mkdir -p "$dir"
cd "$dir"
fails=0
tiny_gpt="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1"
tiny_llama="-D layers=2 -D d_model=32 -D heads=4 -D kv_heads=2 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1"
wide_gpt="-D layers=2 -D d_model=256 -D heads=8 -D seq_len=128 -D vocab=1024 -D batch=2 -D micro_batch=1"
run() {   # NAME MODEL ARGS...
  local name=$1 model=$2
  shift 2
  if "$mcc" "$src/samples/$model.mdl" "$@" --target sm_80,sm_90 --verify-roundtrip -o "$name.plan" 2> "$name.log"; then
    local n80 n90
    n80=$(grep -c "sm_80: .* registers, \(no spills\|at most [0-9]* bytes of spills or stack\)" "$name.log")
    n90=$(grep -c "sm_90: .* registers, \(no spills\|at most [0-9]* bytes of spills or stack\)" "$name.log")
    if [ "$n80" -lt 1 ] || [ "$n80" != "$n90" ]; then
      echo "FAIL $name: ptxas summary lines sm_80 $n80 sm_90 $n90"; cat "$name.log"; fails=$((fails + 1)); return
    fi
    echo "ok   $name: $(grep "sm_80" "$name.log" | head -1 | sed 's/^mcc: //')"
  else
    echo "FAIL $name:"; cat "$name.log"; fails=$((fails + 1))
  fi
}
run gpt_tiny gpt $tiny_gpt
run gpt_tiny_f64 gpt $tiny_gpt --precision f64
run gpt_wide gpt $wide_gpt
run gpt_pp2 gpt $tiny_gpt --pp 2
run llama_tiny llama $tiny_llama
run llama_pp2 llama $tiny_llama --pp 2
# context parallelism: the ring steps' flash kernels, and the fused op with k / v all-gathered
run llama_cp2 llama $tiny_llama --cp 2
run gpt_wide_cp2_allgather gpt $wide_gpt --cp 2 --cp-attn allgather
# tensor and sequence parallelism (vocab-parallel take / onehot, padding masks), experts
run gpt_tp2_sp gpt $tiny_gpt --tp 2 --sp
tiny_moe="-D experts=4 -D topk=2 -D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2"
run moe_tiny moe $tiny_moe -D capacity_factor=1.0
run moe_ep2 moe $tiny_moe --ep 2
# 16-bit storage: bf16 on every family; fp16's kernels are bf16's with the
# other 16-bit type (f16 loads and stores) plus the loss-scaling kernels, so
# two plans cover them: wide gpt (WMMA attention at head_dim 32; tiny's 8
# keeps the f32 kernels) and llama
for prec in bf16 fp16; do
  run gpt_wide_$prec gpt $wide_gpt --precision $prec
  run llama_tiny_$prec llama $tiny_llama --precision $prec
  [ $prec = fp16 ] && continue
  run gpt_tiny_$prec gpt $tiny_gpt --precision $prec
  run llama_cp2_$prec llama $tiny_llama --cp 2 --precision $prec
  run gpt_tp2_sp_$prec gpt $tiny_gpt --tp 2 --sp --precision $prec
  run moe_tiny_$prec moe $tiny_moe -D capacity_factor=1.0 --precision $prec
done

# the other samples in both 16-bit types: bert (rand's masking, non-causal
# ALiBi attention), bloom (causal ALiBi), gpt_packed (document masks, a
# sliding window), t5 (encoder-decoder, cross-attention; its relative-position
# score bias has no CUDA attention kernel yet: mcc says so)
tiny_any="-D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1"
for prec in bf16 fp16; do
  run bert_$prec bert $tiny_any -D layers=2 --precision $prec
  run bloom_$prec bloom $tiny_any -D layers=2 --precision $prec
  run gpt_packed_$prec gpt_packed $tiny_any -D layers=2 -D window=5 --precision $prec
  run t5_$prec t5 $tiny_any -D enc_layers=1 -D dec_layers=1 --precision $prec
done

# the other update rules' step kernels (sgd, lion, muon's lr_step next to its AdamW group), ZeRO-1 at dp 2
run gpt_sgd_dp2 gpt $tiny_gpt --optimizer sgd --nesterov --dp 2
run llama_lion_dp2 llama $tiny_llama --optimizer lion --dp 2
run gpt_muon_dp2 gpt $tiny_gpt --optimizer muon --dp 2
# --fp8 (cuBLASLt's fp8 GEMMs: sm_89 and newer, so sm_90 alone): the quantizing
# kernels, the amax block reductions, the scale updates and matmul8's TN
# transposes (codegen/cuda_fp8.c) of gpt and llama in the module, all of
# it within ptxas' limits (mcc --target's check)
run90() {   # NAME MODEL ARGS...
  local name=$1 model=$2
  shift 2
  rm -rf "$name.cu"
  if "$mcc" "$src/samples/$model.mdl" "$@" --target sm_90 --emit=cuda "$name.cu" 2> "$name.log" &&
     grep -q "sm_90: .* registers, \(no spills\|at most [0-9]* bytes of spills or stack\)" "$name.log"; then
    local k missing=""
    for k in quant8 amax_acc fp8_scale matmul8; do
      grep -q "__global__ .*${k}_[0-9a-f]*_[0-9](TsArgs" "$name".cu/*.cu || missing="$missing $k"
    done
    if [ -n "$missing" ]; then echo "FAIL $name: no kernel for$missing"; fails=$((fails + 1)); return; fi
    echo "ok   $name: $(grep "sm_90" "$name.log" | head -1 | sed 's/^mcc: //')"
  else
    echo "FAIL $name:"; cat "$name.log"; fails=$((fails + 1))
  fi
}
fp8="--precision bf16 --fp8 hybrid --fp8-all-layers"
run90 gpt_fp8 gpt $tiny_gpt $fp8
run90 gpt_fp8_dp2_tp2 gpt $tiny_gpt $fp8 --dp 2 --tp 2 --sp
run90 llama_fp8 llama $tiny_llama $fp8
run90 gpt_wide_fp8 gpt $wide_gpt $fp8 --fp8-amax-compute-algo max --fp8-margin 1
# the images are in the plan, in its text form too
"$mcc" "$src/samples/gpt.mdl" $tiny_gpt --target sm_90 --emit=plan-text -o gpt.txt 2> /dev/null
if ! grep -q "^cuda 1$" gpt.txt || ! grep -q "^image program 0 sm_90 hash" gpt.txt; then
  echo "FAIL: the plan text has no CUDA image section"; fails=$((fails + 1))
fi
# --emit=cuda writes the module source (and the PTX per target)
rm -rf cu && "$mcc" "$src/samples/gpt.mdl" $tiny_gpt --emit=cuda cu --target sm_80 2> cu.log
if ! ls cu/prog0_*.cu > /dev/null 2>&1 || ! ls cu/prog0_*.sm_80.ptx > /dev/null 2>&1 ||
   ! grep -q '__global__' cu/prog0_*.cu || ! grep -q '\.entry' cu/prog0_*.sm_80.ptx; then
  echo "FAIL: --emit=cuda"; cat cu.log; ls cu; fails=$((fails + 1))
fi
# a damaged cubin (its ELF magic) in the text form is refused on reading
python3 - gpt.txt bad.txt << 'PY'
import sys
lines = open(sys.argv[1]).read().split('\n')
# the first base64 line after the kernel reports and the PTX is the cubin's
for i, l in enumerate(lines):
    if l.startswith('image program'):
        parts = l.split()
        ptx = int(parts[parts.index('ptx') + 1]); nk = int(parts[parts.index('kernels') + 1])
        ptx_lines = (4 * ((ptx + 2) // 3) + 75) // 76
        cub = i + 1 + nk + ptx_lines
        lines[cub] = 'AAAA' + lines[cub][4:]   # "\x7fEL" -> zeros
        break
open(sys.argv[2], 'w').write('\n'.join(lines))
PY
if "$mrun" bad.txt --steps 1 > bad.log 2>&1 || ! grep -q "not an ELF file" bad.log; then
  echo "FAIL: a plan with a damaged cubin was not refused:"; cat bad.log; fails=$((fails + 1))
fi
echo "resources: $fails failures"
[ "$fails" = 0 ]
