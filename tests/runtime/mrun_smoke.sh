#!/usr/bin/env bash
# mrun_smoke.sh - a tiny model compiled by mcc and trained by mrun, from
# the binary plan and from the text plan:
#   mrun_smoke.sh MCC MRUN SOURCE_DIR WORK_DIR MODEL
# Checks: both plans give the same losses (the text form holds the same
# program), 60 complete metric lines, and a loss that fell by > 0.5 nats.
set -euo pipefail
mcc=$1 mrun=$2 src=$3 work=$4 model=$5
rm -rf "$work"; mkdir -p "$work"; cd "$work"
D="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2"
"$mcc" "$src/samples/$model.mdl" $D -o s.plan
"$mcc" "$src/samples/$model.mdl" $D --emit=plan-text -o s.txt
"$mrun" s.plan --steps 60 --quiet --data "$src/samples/data/kjv.txt" --metrics bin.jsonl
"$mrun" s.txt --steps 60 --quiet --data "$src/samples/data/kjv.txt" --metrics txt.jsonl
# elapsed_s and tokens_per_s differ run to run; the rest must not
strip() { sed -E 's/, "tokens_per_s".*//' "$1"; }
if ! diff <(strip bin.jsonl) <(strip txt.jsonl) >/dev/null; then
  echo "mrun_smoke: binary and text plans train differently"; exit 1
fi
lines=$(grep -c '"grad_norm"' bin.jsonl)
[ "$lines" = 60 ] || { echo "mrun_smoke: $lines metric lines, expected 60"; exit 1; }
first=$(head -1 bin.jsonl | sed -E 's/.*"loss": ([^,]*),.*/\1/')
last=$(tail -1 bin.jsonl | sed -E 's/.*"loss": ([^,]*),.*/\1/')
echo "mrun_smoke: $model loss $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || { echo "mrun_smoke: loss did not fall by 0.5"; exit 1; }
