#!/usr/bin/env bash
# memory.sh - `mcc --report memory` of the tiny gpt in f32 and in bf16:
# the activation bytes a layer holds for the backward halve exactly, the
# layer input too, the bf16 parameter copies are half the f32 masters, and
# the states come to 18 bytes per parameter (2 copy + 4 master + 4 grad +
# 8 Adam), Megatron's figure, which the report prints next to it.
#   memory.sh MCC SOURCE_DIR
set -euo pipefail
mcc=$1 src=$2
cfg=(-D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256)
f=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision f32 --report memory)
b=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --report memory)
row() { echo "$1" | sed -n "s/^  $2  *\([0-9][0-9]*\) .*/\1/p" | head -1; }
fail() { echo "FAIL: $*" >&2; exit 1; }
echo "$b" | grep -q "bf16 training" || fail "the bf16 report does not say bf16"
fh=$(row "$f" "per layer: held at the loss (mean)"); bh=$(row "$b" "per layer: held at the loss (mean)")
fi=$(row "$f" "per layer: the layer's input"); bi=$(row "$b" "per layer: the layer's input")
[ -n "$fh" ] && [ -n "$bh" ] && [ "$fh" -gt 0 ] || fail "no per-layer rows"
[ $((2 * bh)) -eq "$fh" ] || fail "per-layer held bytes: f32 $fh, bf16 $bh (not half)"
[ $((2 * bi)) -eq "$fi" ] || fail "per-layer input bytes: f32 $fi, bf16 $bi (not half)"
p=$(row "$b" "parameters (36 tensors), f32 masters"); c=$(row "$b" "parameter copies (bf16, pass precision)")
fp=$(row "$f" "parameters (36 tensors)")
[ -n "$p" ] && [ -n "$c" ] && [ "$p" = "$fp" ] && [ $((2 * c)) -eq "$p" ] || fail "masters $p (f32 run $fp), copies $c"
echo "$b" | grep -q "state bytes per parameter: 18 = 4 (f32 master) + 2 (bf16 copy) + 4 (f32 grad) + 8 (adam m+v)" ||
  fail "not 18 bytes per parameter"
echo "$b" | grep -q "Megatron, 16-bit with f32 masters: 18 bytes per parameter" || fail "no Megatron figure"
echo "$f" | grep -q "state bytes per parameter: 16 = 4 (f32 master) + 0 (no copy)" || fail "f32: not 16 bytes per parameter"
echo "ok: per layer held $fh -> $bh bytes, layer input $fi -> $bi, copies $c = masters $p / 2, 18 bytes per parameter"
