#!/usr/bin/env bash
# bench/kernels.sh - GB/s of a few fused kernels: the LLVM JIT (codegen/)
# on 1 and 2 threads against the reference runtime running the same nodes
# one by one.  Prints one markdown table.
#
#   bench/kernels.sh [--build DIR] [--reps N]
#
# Needs a Release build with the bench_kernels target (tests/codegen):
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2 --target bench_kernels
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
reps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kernels.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$reps" in ''|*[!0-9]*) echo "kernels.sh: --reps needs a positive integer" >&2; exit 2 ;; esac
bin="$build/tests/codegen/bench_kernels"
if [ ! -x "$bin" ]; then
  echo "kernels.sh: $bin not found; build it: cmake --build $build --target bench_kernels" >&2
  exit 1
fi
# the reference runtime is single-threaded outside BLAS; keep BLAS out of it
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
"$bin" "$reps"
echo
echo "ref: reference runtime (one kernel per node, intermediates through memory);"
echo "jit1/jit2: the fused LLVM kernel on 1/2 threads; jit cms: its compile time (LLVM O3 + JIT)."
