#!/usr/bin/env bash
# bubble_exec.sh MCC MRUN BUBBLE_EXEC SOURCE_DIR WORK_DIR: trains one step of
# a pipeline plan with TS_PIPE_TRACE set (each pipeline rank records the
# steps it ran) and measures the bubble of that executed schedule
# (bubble_exec.c): 1F1B with pp 4 and 8 micro batches, zb-h1 likewise
# (against the 1F1B run: a third of its bubble, the same peak in flight),
# interleaved with pp 2, vpp 2 and 8 micro batches, GPipe with pp 2.
set -uo pipefail
mcc=$1 mrun=$2 bub=$3 src=$4 work=$5
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=8 -D micro_batch=1"
data="$src/samples/data/kjv.txt"
status=0
base=""  # run's 6th argument to bubble_exec, when set
run() {   # name kind pp vpp mcc-options...
  local name=$1 kind=$2 pp=$3 vpp=$4; shift 4
  "$mcc" "$src/samples/gpt.mdl" $D "$@" -o "$name.plan" || { status=1; return; }
  TS_PIPE_TRACE="$work/$name.trace" timeout -k 5 120 "$mrun" "$name.plan" --gpus "$pp" --steps 1 --quiet \
    --data "$data" || { echo "bubble_exec: mrun $name failed"; status=1; return; }
  "$bub" "$work/$name.trace" "$kind" "$pp" "$vpp" 8 $base || { echo "bubble_exec: $name: wrong bubble"; status=1; }
}
run 1f1b_pp4 1f1b 4 1 -D layers=4 --pp 4
base="$work/1f1b_pp4.trace" run zbh1_pp4 zb-h1 4 1 -D layers=4 --pp 4 --schedule zb-h1
run interleaved_pp2_v2 interleaved 2 2 -D layers=4 --pp 2 --vpp 2
run gpipe_pp2 gpipe 2 1 -D layers=2 --pp 2 --schedule gpipe
exit $status
