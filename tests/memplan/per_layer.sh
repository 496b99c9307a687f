#!/bin/bash
# per_layer.sh MCC SRCDIR - activation memory per transformer layer within
# Korthikanti et al. 2022's selective-recompute figure, 72 s b h / t bytes
# at f32 (34 s b h / t at 2 bytes, less the attention scores, with sp),
# for gpt with d_model 1024, 16 heads, seq 256, micro batch 1, dropout 0,
# at tp 1 and at tp 4 + sp: the micro block's arena peak (mcc --report
# memory: what mrun allocates) grows by at most that per added layer (9
# layers minus 8, where the layers and not the head set the peak), and so
# do the bytes held for the backward (live at the loss); with sp both with
# the gathered copies kept (the default) and gathered again (--regather,
# the least memory).  Compile only:
# exact.  Before the weight-gradient, view and remat work of issue 18 the
# growth was 50.4 MB (tp 1) and 34.6 MB (tp 4 + sp) against 18.9 / 4.7.
set -u
MCC=$1 SRC=$2
fail=0
row() { awk -v l="$1" 'index($0, "  " l) == 1 { print $(NF-1); exit }'; }
for layout in "1|" "4|--tp 4 --sp" "4|--tp 4 --sp --regather"; do
  IFS='|' read -r t flags <<<"$layout"
  s=256 h=1024
  limit=$((72 * s * h / t))
  declare -A peak held
  for L in 8 9; do
    # shellcheck disable=SC2086
    out=$("$MCC" "$SRC/samples/gpt.mdl" -D layers=$L -D d_model=$h -D heads=16 -D seq_len=$s -D batch=1 -D micro_batch=1 \
          -D dropout=0 $flags --report memory) || { echo "FAIL: mcc (tp $t, $L layers)"; fail=1; continue 2; }
    peak[$L]=$(echo "$out" | row "block micro: arena peak (packed)")
    held[$L]=$(echo "$out" | row "block micro: held for the backward")
  done
  gp=$((peak[9] - peak[8])) gh=$((held[9] - held[8]))
  echo "tp $t${flags:+ ($flags)}: per layer, arena peak +$gp bytes, held +$gh bytes; limit 72 s b h / t = $limit"
  [ "$gp" -gt 0 ] && [ "$gp" -le "$limit" ] || { echo "FAIL: tp $t: the arena grows by $gp bytes per layer (limit $limit)"; fail=1; }
  [ "$gh" -gt 0 ] && [ "$gh" -le "$limit" ] || { echo "FAIL: tp $t: $gh bytes held per layer (limit $limit)"; fail=1; }
done
exit $fail
