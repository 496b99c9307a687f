#!/usr/bin/env bash
# gpu_refused.sh - until fp16 CUDA kernels exist (issue 20, deliverable 4; bf16
# has them: tests/bf16/gpu_train.sh), an fp16 plan given a GPU (the fake driver of tests/cuda_dev) is refused
# before any step, with a message naming what works (--cpu), and the same
# plan trains with --cpu on the same machine; mcc --emit=cuda refuses too.
# PREC may carry more mcc flags and WANT the refusal's text (tests/fp8: an
# --fp8 plan, whose GPU path is not built either).
#   gpu_refused.sh BIN_DIR SOURCE_DIR WORK FAKE_DIR [PREC [WANT]]
set -uo pipefail
bin=$1 src=$2 work=$3 fake=$4 prec=${5:-fp16}
want=${6:-no ${prec} CUDA kernels yet}
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision $prec -o b.plan || fail "mcc"
export TS_CUDA_DRIVER=$fake/libcuda.so.1 TS_CUBLASLT_LIB=$fake/libcublasLt.so.13 FAKE_CUDA_DEVICES=80
export FAKE_CUDART_DEVICES=1 LD_LIBRARY_PATH=$fake/nccl TS_CACHE_DIR=off
out=$("$bin/mrun" b.plan --steps 1 --metrics m.jsonl 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] || fail "mrun ran a $prec plan on a GPU (exit 0)"
echo "$out" | grep -qF "$want" && echo "$out" | grep -q "mrun --cpu" || fail "no message naming --cpu"
[ ! -s m.jsonl ] || fail "a step ran"
"$bin/mrun" b.plan --cpu --steps 1 --quiet 2>&1 || fail "--cpu does not train it"
out=$("$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision $prec --emit=cuda cu 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -qF "$want" || fail "--emit=cuda: $out"
echo "ok: refused on the GPU with a message naming --cpu; trains with --cpu"
