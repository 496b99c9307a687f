#!/usr/bin/env bash
# compile_time.sh - how long mcc takes on the full-size samples (GPT-2 124M
# and Llama-2-7B shapes; compiling allocates no tensors).  Compiles each
# model N times to a binary plan and prints a table of the median wall time
# (mcc's own --time total: frontend + passes + verification + plan write).
#
#   bench/compile_time.sh [N] [MCC]      (defaults: 5, build/mcc)
#   extra mcc options via MCC_FLAGS, e.g. MCC_FLAGS=--no-verify
set -euo pipefail
N=${1:-5}
cd "$(dirname "$0")/.."
MCC=${2:-${MCC:-build/mcc}}
[ -x "$MCC" ] || { echo "compile_time.sh: no mcc at '$MCC' (build first, or pass its path)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

printf '%-8s %14s %9s %10s %10s %10s\n' model params "IR nodes" "median ms" "min ms" "plan MB"
for model in gpt llama; do
  times=()
  stats=""
  for ((i = 0; i < N; i++)); do
    # shellcheck disable=SC2086
    "$MCC" samples/$model.mdl -o "$TMP/$model.plan" --time --stats ${MCC_FLAGS:-} 2>"$TMP/err" ||
      { echo "compile_time.sh: mcc failed on $model:" >&2; cat "$TMP/err" >&2; exit 1; }
    times+=("$(awk '/^time: total/ {print $3}' "$TMP/err")")
    stats=$(grep '^stats:' "$TMP/err")
  done
  params=$(echo "$stats" | awk '{print $2}')
  nodes=$(echo "$stats" | sed -E 's/.* ([0-9]+) IR nodes.*/\1/')
  sorted=$(printf '%s\n' "${times[@]}" | sort -g)
  median=$(echo "$sorted" | awk -v n="$N" 'NR == int((n + 1) / 2) {print}')
  min=$(echo "$sorted" | head -1)
  mb=$(awk -v b="$(stat -c %s "$TMP/$model.plan")" 'BEGIN {printf "%.2f", b / 1048576}')
  printf '%-8s %14s %9s %10s %10s %10s\n' "$model" "$params" "$nodes" "$median" "$min" "$mb"
done
