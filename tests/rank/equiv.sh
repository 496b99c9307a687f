#!/usr/bin/env bash
# equiv.sh - a model trained on N CPU ranks equals the single-rank run:
#   equiv.sh MCC MRUN PARAMS_DIFF SOURCE_DIR WORK_DIR MODEL CASE...
# CASE is GPUS:TP:SP:ZERO (e.g. 4:1:0:1 = dp 4 with ZeRO, 4:2:1:1 = tp 2
# with sequence parallelism x dp 2).  Everything in f64 at tiny sizes, 3
# steps.  For every case: the loss of every step (from --metrics) and every
# parameter after training (--save-params, global shapes) must be within a
# relative 1e-10 of the single-rank run (batch 32 = 16 micro batches, so dp
# can go up to 16).  The plans are compiled for dp = 1 (mcc --tp only), so
# mrun rebuilds their update block for the run's dp (pass_respecialize_dp);
# ZERO=0 compiles with --no-zero.
set -uo pipefail
mcc=$1 mrun=$2 pdiff=$3 src=$4 work=$5 model=$6
shift 6
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D layers=2 -D d_model=16 -D heads=4 -D seq_len=8 -D vocab=250 -D batch=32 -D micro_batch=2 --precision f64"
[ "$model" = llama ] && D="$D -D kv_heads=2 -D ffn=32"
data="$src/samples/data/kjv.txt"
run() { echo "+ $*"; "$@"; }
run "$mcc" "$src/samples/$model.mdl" $D -o single.plan || exit 1
run "$mrun" single.plan --steps 3 --quiet --data "$data" --metrics single.jsonl --save-params single.bin || exit 1
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
status=0
for c in "$@"; do
  IFS=: read -r gpus tp sp zero <<<"$c"
  name="g${gpus}_tp${tp}_sp${sp}_z${zero}"
  flags="--tp $tp"; [ "$sp" = 1 ] && flags="$flags --sp"; [ "$zero" = 0 ] && flags="$flags --no-zero"
  prog="$name.plan"
  run "$mcc" "$src/samples/$model.mdl" $D $flags -o "$prog" || { echo "equiv: $name: mcc failed"; status=1; continue; }
  if ! run "$mrun" "$prog" --gpus "$gpus" --steps 3 --quiet --timeout 30 --data "$data" \
       --metrics "$name.jsonl" --save-params "$name.bin"; then
    echo "equiv: $name: mrun failed"; status=1; continue
  fi
  if ! paste <(losses single.jsonl) <(losses "$name.jsonl") | awk -v n="$name" '
       { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > worst) worst = r; k++ }
       END { printf "equiv: %s: %d steps, max relative loss difference %.3g\n", n, k, worst;
             exit !(k == 3 && worst <= 1e-10) }'; then
    echo "equiv: $name: losses differ from the single-rank run"; status=1
  fi
  run "$pdiff" single.bin "$name.bin" 1e-10 || { echo "equiv: $name: parameters differ"; status=1; }
done
echo "equiv: $model -> $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
