#!/usr/bin/env bash
# start.sh - how long mrun takes to start: cold (empty JIT cache) and warm
# (the cache filled by the cold run), at 1 and 4 ranks, for the tiny GPT
# and GPT-2 124M sizes (parameter initialization dominates the latter).
# One table; with --old DIR a second build's rows side by side.
#   bench/start.sh [--build build] [--old DIR] [--runs N] [--tiny]
# (--tiny: the tiny GPT's rows only)
# A row's figures are medians over N runs (default 3) of:
#   wall:  the whole `mrun PLAN --steps 1` (process start to exit);
#   step:  the first step's elapsed_s from --metrics (the training part);
#   start: wall - step (plan load, ranks, JIT, initialization, exit).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build old="" runs=3 tiny=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --old) old=$2; shift ;;
    --runs) runs=$2; shift ;;
    --tiny) tiny=1 ;;
    *) echo "start.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# row BUILD LABEL PLAN GPUS MODE(cold|warm)
row() {
  local b=$1 label=$2 plan=$3 gpus=$4 mode=$5 walls="" steps=""
  for r in $(seq "$runs"); do
    local cache="$TMP/cache-$label-$gpus-$r"
    if [ "$mode" = warm ]; then
      mkdir -p "$cache"
      TS_CACHE_DIR=$cache "$b/mrun" "$plan" --steps 1 --quiet --gpus "$gpus" >/dev/null 2>&1
    else
      rm -rf "$cache"; mkdir -p "$cache"
    fi
    local t0 t1
    t0=$(date +%s.%N)
    TS_CACHE_DIR=$cache "$b/mrun" "$plan" --steps 1 --quiet --gpus "$gpus" --metrics "$TMP/m.jsonl" >/dev/null 2>&1
    t1=$(date +%s.%N)
    walls="$walls $(echo "$t1 - $t0" | bc -l)"
    steps="$steps $(sed -n 's/.*"elapsed_s": \([0-9.e+-]*\).*/\1/p' "$TMP/m.jsonl" | head -1)"
    rm -rf "$cache"
  done
  local w s
  w=$(tr ' ' '\n' <<<"$walls" | grep . | median)
  s=$(tr ' ' '\n' <<<"$steps" | grep . | median)
  printf '| %s | %s | %d | %s | %.3f | %.3f | %.3f |\n' "$(basename "$(dirname "$b/x")")" "$label" "$gpus" "$mode" "$w" "$s" \
    "$(echo "$w - $s" | bc -l)"
}

echo "| build | model | ranks | JIT cache | wall (s) | step (s) | start (s) |"
echo "|---|---|---:|---|---:|---:|---:|"
for b in "$build" ${old:+"$old"}; do
  "$b/mcc" samples/gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=2 \
    --tp 2 --dp 1 -o "$TMP/tiny_tp2.plan"
  "$b/mcc" samples/gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=2 \
    -o "$TMP/tiny.plan"
  "$b/mcc" samples/gpt.mdl -D seq_len=64 -D batch=4 -D micro_batch=1 -o "$TMP/gpt124m.plan"
  "$b/mcc" samples/gpt.mdl -D seq_len=64 -D batch=4 -D micro_batch=1 --tp 2 -o "$TMP/gpt124m_tp2.plan"
  for mode in cold warm; do
    row "$b" "tiny gpt" "$TMP/tiny.plan" 1 $mode
    row "$b" "tiny gpt tp=2 dp=2" "$TMP/tiny_tp2.plan" 4 $mode
    [ "$tiny" = 1 ] && continue
    row "$b" "gpt-2 124M" "$TMP/gpt124m.plan" 1 $mode
    row "$b" "gpt-2 124M tp=2 dp=2" "$TMP/gpt124m_tp2.plan" 4 $mode
  done
done
echo
echo "- $(nproc) CPUs; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
