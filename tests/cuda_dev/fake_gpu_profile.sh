#!/bin/bash
# fake_gpu_profile.sh FAKE_GPU_ARGS...: fake_gpu.sh's run with TS_RT_PROFILE=1
# (docs/cuda.md, "Profiling"): it must still pass (graphs off changes no
# number) and every GPU rank must print its profile of CUDA-event times
# per kernel and GEMM, whose calls add up to the launches it timed.
set -uo pipefail
here=$(dirname "$0")
out=$(TS_RT_PROFILE=1 bash "$here/fake_gpu.sh" "$@" 2>&1)
rc=$?
if [ $rc != 0 ]; then echo "$out" | tail -30; echo "FAIL: the profiled run failed ($rc)"; exit 1; fi
n=$(echo "$out" | grep -c "rt profile: GPU time per kernel (CUDA events around each launch, CUDA graphs off, each block's first run not counted)")
[ "$n" -ge 2 ] || { echo "$out" | tail -40; echo "FAIL: $n GPU profiles, want one per GPU rank (2)"; exit 1; }
# the lines under it: "  LABEL  X ms  P%  N calls  U us/call", a GEMM among them
rows=$(echo "$out" | grep -A15 "GPU time per kernel" | grep -E "^  .* ms +[0-9.]+% +[0-9]+ calls +[0-9.]+ us/call$")
echo "$rows" | head -20
echo "$rows" | grep -q "^  matmul f32\[" || { echo "FAIL: no GEMM (matmul f32[...]) among the timed launches"; exit 1; }
echo "$rows" | grep -q -E "^  [a-z0-9_]+_[0-9a-f]{8} " || { echo "FAIL: no generated kernel (NAME_hash) among the timed launches"; exit 1; }
echo "ok: $n GPU profiles"
