#!/bin/bash
# nvcc_check.sh TEST NVCC DIR - the CUDA printer's module (every kernel kind
# test_cuda_print builds, prelude included) through nvcc for sm_80, apart
# from NVRTC: no error, no warning (177, a value computed and not used, is
# expected: the printer emits every instruction), and ptxas reports for
# every kernel 0 bytes of stack frame, spill stores and spill loads.
set -u
test=$1 nvcc=$2 dir=$3
mkdir -p "$dir"
"$test" --emit "$dir/module.cu" > "$dir/emit.log" 2>&1 || { cat "$dir/emit.log"; echo "FAIL: --emit"; exit 1; }
"$nvcc" -arch=sm_80 -cubin -std=c++17 -fmad=false -Xptxas -v --diag-suppress=177 -Werror all-warnings \
  -o "$dir/module.cubin" -x cu "$dir/module.cu" > "$dir/nvcc.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then head -40 "$dir/nvcc.log"; echo "FAIL: nvcc exited with $rc"; exit 1; fi
if grep -qi "warning" "$dir/nvcc.log"; then grep -i -m 10 "warning" "$dir/nvcc.log"; echo "FAIL: warnings"; exit 1; fi
kernels=$(grep -c '^extern "C" __global__' "$dir/module.cu")
entries=$(grep -c "Compiling entry function" "$dir/nvcc.log")
clean="^ *(ptxas info *: *)?0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
bad=$(grep -E "bytes stack frame" "$dir/nvcc.log" | grep -v -E "$clean" | head -5)
echo "nvcc: $kernels kernels in the module, $entries compiled by ptxas"
if [ "$kernels" -eq 0 ] || [ "$kernels" -ne "$entries" ]; then echo "FAIL: kernel count"; exit 1; fi
if [ -n "$bad" ]; then echo "$bad"; echo "FAIL: stack frame or spills"; exit 1; fi
echo "nvcc: every kernel has no stack frame and no spills"
