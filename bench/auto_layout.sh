#!/usr/bin/env bash
# auto_layout.sh [--build DIR] - mcc --auto-layout on the large models of
# the papers: how long the search takes on this machine, how many layouts
# it costed and compiled, what it chose, and the prediction of the choice.
# Compile only (no GPU).  Issue 23's goal: GPT-3 175B on 1024 A100-80GB in
# at most 10 s on a 2-core machine.
#   GPT-3 175B    Brown et al. 2020: 96 layers, d 12288, 96 heads, seq 2048,
#                 global batch 1536 sequences (Narayanan et al. 2021, Table 1)
#   Llama-2 70B   Touvron et al. 2023: 80 layers, d 8192, 64 heads, 8 kv
#                 heads (GQA), ffn 28672, seq 4096, vocab 32000, 1024 seqs
#   GPT-3 1.3B    24 layers, d 2048, 16 heads, 512 sequences, on 64 GPUs
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    *) echo "auto_layout.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

printf '%-14s %-10s %6s %8s %9s %9s  %-58s %10s %6s %8s\n' model hw gpus "wall s" costed compiled "chosen layout" "step s" MFU "GiB/GPU"
# row NAME SAMPLE HW GPUS FLAGS...
row() {
  local name=$1 sample=$2 hw=$3 gpus=$4; shift 4
  local t0 t1
  t0=$(date +%s.%N)
  "$build/mcc" "samples/$sample.mdl" "$@" --auto-layout --gpus "$gpus" --hw "$hw" > "$TMP/out" 2>&1 || true
  t1=$(date +%s.%N)
  local costed compiled first
  costed=$(sed -n 's/.* \([0-9]*\) whole layouts costed.*/\1/p' "$TMP/out")
  compiled=$(sed -n 's/^# stage B: \([0-9]*\) compiled whole.*/\1/p' "$TMP/out")
  first=$(grep -E '^  1 ' "$TMP/out" | head -1)
  if [ -z "$first" ]; then
    printf '%-14s %-10s %6s %8.2f  %s\n' "$name" "$hw" "$gpus" "$(echo "$t1 - $t0" | bc)" "$(tail -1 "$TMP/out")"
    return
  fi
  local layout step mfu gib
  layout=$(echo "$first" | sed -E 's/^ +1 +(tp=.*recompute=[a-z]+).*/\1/')
  step=$(echo "$first" | sed -E 's/.*recompute=[a-z]+ +([^ ]+) .*/\1/')
  mfu=$(echo "$first" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /%$/) {print $i; exit}}')
  gib=$(echo "$first" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /%$/) {print $(i + 1); exit}}')
  printf '%-14s %-10s %6s %8.2f %9s %9s  %-58s %10s %6s %8s\n' "$name" "$hw" "$gpus" "$(echo "$t1 - $t0" | bc)" \
    "$costed" "$compiled" "$layout" "$step" "$mfu" "$gib"
}
G3="-D layers=96 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200 -D batch=1536 -D micro_batch=1"
L70="-D layers=80 -D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000 -D batch=1024 -D micro_batch=1"
G13="-D layers=24 -D d_model=2048 -D heads=16 -D seq_len=2048 -D vocab=51200 -D batch=512 -D micro_batch=1"
# shellcheck disable=SC2086
row "GPT-3 175B" gpt a100-80gb 1024 $G3
# shellcheck disable=SC2086
row "GPT-3 175B" gpt h100-sxm 1024 $G3
# shellcheck disable=SC2086
row "Llama-2 70B" llama h100-sxm 512 $L70
# shellcheck disable=SC2086
row "GPT-3 1.3B" gpt a100-80gb 64 $G13
