#!/usr/bin/env bash
# compile_time.sh - how long mcc takes on the full-size samples (GPT-2 124M
# and Llama-2-7B shapes; compiling allocates no tensors).  Compiles each
# model N times to a binary plan and prints a table of the median wall time
# (mcc's own --time total: frontend + passes + verification + plan write).
# Then the growth table: each input at two sizes, once each (a long chain
# of adds, gpt with many layers, a GPT-3-width stack, a config block of
# many keys): the time ratio next to the size ratio shows whether
# compiling stays linear.
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

# growth: each input at two sizes, one compile each
echo
printf '%-28s %9s %9s %10s %10s %8s\n' input "size a" "size b" "a ms" "b ms" "b/a"
chain() {   # repeat n { x = x + x }
  cat >"$TMP/chain.mdl" <<EOF
config { n = $1 }
model m(x: f32[4, 8]) {
  w = param [8] init normal(0.02)
  x = x * w
  repeat n { x = x + x }
  return sum(sum(x, axis: 0), axis: 0)
}
EOF
  echo "$TMP/chain.mdl"
}
keys() {    # a config block of n keys
  { echo "config {"; seq 0 $(($1 - 1)) | sed 's/.*/  c& = &/'; echo "}"
    printf 'model m(x: f32[4, 8]) {\n  w = param [8] init normal(0.02)\n  return sum(sum(x * w, axis: 0), axis: 0)\n}\n'
  } >"$TMP/keys.mdl"
  echo "$TMP/keys.mdl"
}
gpt_layers() { echo "samples/gpt.mdl -D layers=$1"; }
gpt3_layers() { echo "samples/gpt.mdl -D layers=$1 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200"; }
ms() {   # mcc's --time total of one compile (ms); the arguments split on spaces
  # shellcheck disable=SC2068
  "$MCC" $@ -o "$TMP/g.plan" --time 2>&1 | awk '/^time: total/ {print $3}'
}
row() {   # row NAME A B GEN: GEN n prints mcc's arguments for size n
  local ta tb
  ta=$(ms "$($4 "$2")") tb=$(ms "$($4 "$3")")
  printf '%-28s %9s %9s %10s %10s %8s\n' "$1" "$2" "$3" "$ta" "$tb" "$(awk -v x="$ta" -v y="$tb" 'BEGIN {printf "%.1fx", y / x}')"
}
row "repeat n { x = x + x }" 10000 100000 chain
row "gpt, n layers" 250 2500 gpt_layers
row "GPT-3 width, n layers" 96 384 gpt3_layers
row "config block of n keys" 10000 100000 keys
