#!/bin/bash
# per_layer.sh MCC SRCDIR - activation bytes per layer with --recompute,
# on gpt with d_model 1024, 16 heads, seq 256, micro batch 1, dropout 0
# (f32): the micro block's arena peak (what mrun allocates) and its bytes
# held for the backward (live at the loss), 9 layers minus 8.
#   full: within 10% of the layer's input alone, s b h x 4 bytes (/ t
#         with sp: the rank keeps its 1/t shard), at tp 1 and tp 4 + sp;
#   selective: within Korthikanti's 72 s b h / t bytes at f32 (as
#         tests/memplan/per_layer.sh for the default) and not above none.
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
done
exit $fail
