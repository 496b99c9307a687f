#!/usr/bin/env bash
# signal.sh - SIGINT / SIGTERM stop a training run cleanly:
#   signal.sh MCC MRUN SOURCE_DIR WORK_DIR GPUS SIG
# Trains a tiny gpt on GPUS ranks (mrun starts mpirun itself when GPUS > 1)
# for many steps, sends SIG to mrun once two steps are in the metrics, and
# passes iff mrun exits with 128 + the signal within 60 s, says "stopped by
# SIG after step N", the metrics hold exactly N steps, mrun's job directory
# (TS_MRUN_JOB_BASE: MPI's shared-memory segments, the ranks' status files)
# is gone, and no process of the run is left.
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4 gpus=$5 sig=$6
rm -rf "$work"; mkdir -p "$work/jobs"; cd "$work" || exit 1
plan="$work/signal_$sig.plan"
"$mcc" "$src/samples/gpt.mdl" -D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 \
  -D batch=4 -D micro_batch=2 -o "$plan" || exit 1
TS_MRUN_JOB_BASE="$work/jobs" "$mrun" "$plan" --gpus "$gpus" --steps 1000000 --quiet --metrics m.jsonl \
  --data "$src/samples/data/kjv.txt" >out.txt 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ "$(cat m.jsonl 2>/dev/null | wc -l)" -ge 2 ] && break
  sleep 0.1
done
start=$(date +%s)
kill "-$sig" "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait "$pid"
rc=$?
elapsed=$(( $(date +%s) - start ))
cat out.txt
status=0
want=$(( 128 + $(kill -l "$sig") ))
[ "$rc" = "$want" ] || { echo "signal: exit status $rc, expected $want"; status=1; }
n=$(sed -n "s/^mrun: stopped by SIG$sig after step \([0-9]*\) of 1000000 .*/\1/p" out.txt)
[ -n "$n" ] || { echo "signal: no 'stopped by SIG$sig after step N' line"; status=1; }
[ -n "$n" ] && [ "$(wc -l <m.jsonl)" = "$n" ] || { echo "signal: $(wc -l <m.jsonl) metric lines, the message says $n"; status=1; }
[ -z "$(ls -A jobs)" ] || { echo "signal: the job directory was left: $(ls -A jobs)"; status=1; }
sleep 0.5
if pgrep -f -- "$plan" >/dev/null; then
  echo "signal: processes left behind:"; pgrep -af -- "$plan"
  pkill -KILL -f -- "$plan"
  status=1
fi
echo "signal: SIG$sig on $gpus ranks: exit $rc after ${elapsed} s -> $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
