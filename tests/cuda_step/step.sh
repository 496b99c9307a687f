#!/bin/bash
# step.sh MCC TEST_EMU_STEP MODEL.mdl WORKDIR PRECISION STEPS TOL [-D k=v ...]
# Compiles MODEL at PRECISION into a single-rank plan, then trains it STEPS
# steps on the CPU and on the emulated CUDA device (test_emu_step).
set -euo pipefail
mcc=$1 step=$2 model=$3 dir=$4 prec=$5 steps=$6 tol=$7
shift 7
mkdir -p "$dir"
"$mcc" "$model" "$@" --precision "$prec" -o "$dir/model.plan"
cd "$dir"   # the default corpus is found from the source tree
exec "$step" "$dir/model.plan" "$steps" "$tol"
