#!/bin/bash
# fake_gpu.sh MPIEXEC MCC TEST MODEL.mdl DIR NP STEPS TOL [mcc flags ...]
# Compiles MODEL with the flags (a layout of NP ranks: --dp NP, --tp NP ...)
# and trains it STEPS steps on NP CPU ranks and on NP "GPU ranks" over the
# fake driver (test_fake_gpu_step.c).
set -euo pipefail
mpiexec=$1 mcc=$2 test=$3 model=$4 dir=$5 np=$6 steps=$7 tol=$8
shift 8
rm -rf "$dir" && mkdir -p "$dir"
"$mcc" "$model" "$@" -o "$dir/model.plan"
cd "$dir"   # the default corpus is found from the source tree
exec timeout -k 5 540 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$test" "$dir/model.plan" "$steps" \
  "$tol" "$dir"
