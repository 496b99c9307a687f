#!/bin/bash
# per_layer.sh MCC SRCDIR - activation bytes per layer with --recompute,
# on gpt with d_model 1024, 16 heads, seq 256, micro batch 1, dropout 0
# (f32): the micro block's arena peak (what mrun allocates) and its bytes
# held for the backward (live at the loss), 9 layers minus 8.
#   full: within 10% of the layer's input alone, s b h x 4 bytes (/ t
#         with sp: the rank keeps its 1/t shard), at tp 1 and tp 4 + sp;
#   selective: within Korthikanti's 72 s b h / t bytes at f32 (as
#         tests/memplan/per_layer.sh for the default) and not above none;
#         with the composed attention (dropout 0.1) it recomputes the s x s
#         scores: per layer what the fused form holds, 8 MiB less than none.
# Prints the figures without recompute next to them.  Compile only.
set -u
MCC=$1 SRC=$2
fail=0
row() { awk -v l="$1" 'index($0, "  " l) == 1 { print $(NF-1); exit }'; }
s=256 h=1024
for layout in "1|" "4|--tp 4 --sp"; do
  IFS='|' read -r t flags <<<"$layout"
  input=$((s * h * 4 / t))
  declare -A gp gh
  for mode in none full selective; do
    declare -A peak held
    for L in 8 9; do
      # shellcheck disable=SC2086
      out=$("$MCC" "$SRC/samples/gpt.mdl" -D layers=$L -D d_model=$h -D heads=16 -D seq_len=$s -D batch=1 -D micro_batch=1 \
            -D dropout=0 $flags --recompute $mode --report memory) || { echo "FAIL: mcc (tp $t, $mode, $L layers)"; fail=1; continue 3; }
      peak[$L]=$(echo "$out" | row "block micro: arena peak (packed)")
      held[$L]=$(echo "$out" | row "block micro: held for the backward")
    done
    gp[$mode]=$((peak[9] - peak[8])) gh[$mode]=$((held[9] - held[8]))
    echo "tp $t${flags:+ ($flags)} --recompute $mode: per layer, arena peak +${gp[$mode]} bytes, held +${gh[$mode]} bytes (8 layers: peak ${peak[8]}, held ${held[8]})"
  done
  lo=$((input * 9 / 10)) hi=$((input * 11 / 10)) lim=$((72 * s * h / t))
  for k in "${gp[full]}" "${gh[full]}"; do
    [ "$k" -ge $lo ] && [ "$k" -le $hi ] || { echo "FAIL: tp $t full: $k bytes per layer, not within 10% of the layer input $input"; fail=1; }
  done
  for k in "${gp[selective]}" "${gh[selective]}"; do
    [ "$k" -gt 0 ] && [ "$k" -le $lim ] || { echo "FAIL: tp $t selective: $k bytes per layer (limit $lim)"; fail=1; }
  done
  [ "${gh[selective]}" -le "${gh[none]}" ] || { echo "FAIL: tp $t: selective holds more per layer than none"; fail=1; }
  echo "tp $t: the layer's input is $input bytes (limits $lo .. $hi); Korthikanti's 72 s b h / t = $lim"
  [ "$t" = 1 ] && fused_none=${gh[none]}
done
# selective on the composed attention (dropout > 0 needs it): the s x s
# scores, softmax and dropout (2 a s^2 b x 4 bytes per layer more than the
# fused form holds) are what the cost model recomputes, so selective holds
# per layer what the fused form does without recompute (tp 1)
declare -A cg
for mode in none selective; do
  declare -A held
  for L in 8 9; do
    held[$L]=$("$MCC" "$SRC/samples/gpt.mdl" -D layers=$L -D d_model=$h -D heads=16 -D seq_len=$s -D batch=1 -D micro_batch=1                -D dropout=0.1 --recompute $mode --report memory | row "block micro: held for the backward")
  done
  cg[$mode]=$((held[9] - held[8]))
  echo "tp 1, dropout 0.1 (composed attention) --recompute $mode: held +${cg[$mode]} bytes per layer"
done
[ "${cg[selective]}" -le "$fused_none" ] && [ "${cg[none]}" -ge $((fused_none + 2 * 16 * s * s * 4)) ] ||
  { echo "FAIL: composed attention: selective holds ${cg[selective]} bytes per layer (none ${cg[none]}; the fused form $fused_none)"; fail=1; }
exit $fail
