#!/usr/bin/env bash
# stale.sh - a launcher killed with SIGKILL cannot remove its job directory
# (TS_MRUN_JOB_BASE: MPI's shared-memory segments); the next multi-rank
# mrun on the host removes it, and never the directory of a job that runs:
#   stale.sh MCC MRUN SOURCE_DIR WORK_DIR
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4
rm -rf "$work"; mkdir -p "$work/jobs"; cd "$work" || exit 1
status=0
fail() { echo "stale: $*"; status=1; }
plan="$work/stale.plan"
"$mcc" "$src/samples/gpt.mdl" -D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 \
  -D batch=4 -D micro_batch=2 -o "$plan" || exit 1
export TS_MRUN_JOB_BASE="$work/jobs"
# start NAME: a long run in the background, once it has done two steps
start() {
  "$mrun" "$plan" --gpus 2 --steps 1000000 --quiet --metrics "$1.jsonl" --data "$src/samples/data/kjv.txt" >"$1.txt" 2>&1 &
  eval "$1=$!"
  for _ in $(seq 600); do [ "$(cat "$1.jsonl" 2>/dev/null | wc -l)" -ge 2 ] && break; sleep 0.1; done
}
start dead
kill -KILL "$dead"
wait "$dead" 2>/dev/null
pkill -KILL -f -- "$plan"   # mpirun and its ranks outlive a SIGKILLed launcher
sleep 1
[ "$(ls jobs | wc -l)" = 1 ] || fail "expected the killed launcher's job directory, found: $(ls jobs | tr '\n' ' ')"
left=$(ls jobs)
start live
"$mrun" "$plan" --gpus 2 --steps 2 --quiet --data "$src/samples/data/kjv.txt" >short.txt 2>&1 || fail "a short run failed: $(tail -2 short.txt)"
[ -e "jobs/$left" ] && fail "the killed launcher's job directory $left was not removed"
[ "$(ls jobs | wc -l)" = 1 ] || fail "the running job's directory is gone (jobs: $(ls jobs | tr '\n' ' '))"
n1=$(wc -l <live.jsonl); sleep 1; n2=$(wc -l <live.jsonl)
[ "$n2" -gt "$n1" ] || fail "the running job stopped training ($n1 -> $n2 steps)"
kill -TERM "$live"; wait "$live"
[ -z "$(ls -A jobs)" ] || fail "left after the live job ended: $(ls -A jobs)"
pkill -KILL -f -- "$plan" && fail "processes were left behind"
echo "stale: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
