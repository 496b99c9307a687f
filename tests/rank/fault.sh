#!/usr/bin/env bash
# fault.sh - a rank that dies or stalls mid-step stops the whole job:
#   fault.sh MCC MRUN SOURCE_DIR WORK_DIR KILL|STALL GPUS BOUND_S REGEX
# Trains a tiny gpt on GPUS ranks (mrun starts mpirun itself) with world
# rank 2 failing in step 3 (TS_FAULT_<KILL|STALL>_RANK/_STEP, train.h),
# --timeout 3.  Passes iff mrun exits non-zero within BOUND_S seconds, its
# output matches REGEX (naming rank 2), and no process of the run is left
# (pgrep on the run's own plan path, which no other test uses).
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4 what=$5 gpus=$6 bound=$7 regex=$8
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
plan="$work/fault_$what.plan"
"$mcc" "$src/samples/gpt.mdl" -D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 \
  -D batch=8 -D micro_batch=2 -o "$plan" || exit 1
start=$(date +%s)
env "TS_FAULT_${what}_RANK=2" "TS_FAULT_${what}_STEP=3" \
  timeout -k 5 90 "$mrun" "$plan" --gpus "$gpus" --steps 20 --timeout 3 --data "$src/samples/data/kjv.txt" \
  >out.txt 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat out.txt
status=0
[ "$rc" != 0 ] || { echo "fault: exit status 0, expected a failure"; status=1; }
[ "$rc" != 124 ] || { echo "fault: mrun hung (killed by timeout)"; status=1; }
[ "$elapsed" -le "$bound" ] || { echo "fault: took ${elapsed} s, bound ${bound} s"; status=1; }
grep -Eq -- "$regex" out.txt || { echo "fault: no line matches /$regex/"; status=1; }
sleep 0.5
if pgrep -f -- "$plan" >/dev/null; then
  echo "fault: processes left behind:"; pgrep -af -- "$plan"
  pkill -KILL -f -- "$plan"   # only this run's own processes
  status=1
fi
echo "fault: $what on $gpus ranks: exit $rc after ${elapsed} s -> $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
