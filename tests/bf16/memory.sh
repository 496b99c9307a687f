#!/usr/bin/env bash
# memory.sh - `mcc --report memory` of the tiny gpt in f32 and in bf16:
# the activation bytes a layer holds for the backward halve exactly, the
# layer input too, the bf16 parameter copies are half the f32 masters, and
# the states come to 18 bytes per parameter (2 copy + 4 master + 4 grad +
# 8 Adam), Megatron's figure, which the report prints next to it.  Under
# --zero 3 at dp 4: 16/dp = 4 bytes per parameter (f32 master, grad and
# moments sharded, no copy held) next to Megatron's distributed optimizer
# (6 + 12/dp), and the parameters gathered per micro batch (the gathers
# move the bf16 copies) exactly half of the f32 ZeRO-3 plan's.
# The states total adds up every state row (fp16: the loss scaler; --decode:
# the KV cache), and --report comm names bf16 in its header.
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
# the states total is every state the slab holds: the rows above it, fp16's
# loss scaler and a generation plan's KV cache included (the allocated slab
# is that, each state 64-byte aligned); the comm report names bf16 too
adds() {   # adds REPORT: the rows between "rank 0" and "states total" sum to it
  echo "$1" | awk '/^rank 0/ {on = 1; next} on && /^  states total / {print (s == $3) ? "ok" : "sum " s " total " $3; exit}
                   on && /^  [a-zA-Z]/ {s += $(NF - 1)}'
}
h=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --report memory)
g=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --decode --report memory)
sc=$(row "$h" "loss scaler (fp16: scale, growth tracker, hysteresis)"); kv=$(row "$g" "KV cache (generation, pass decode)")
[ "$sc" = 16 ] || fail "fp16: loss scaler row '$sc', expected 4 f32 scalars (16 bytes)"
[ -n "$kv" ] && [ "$kv" -gt 0 ] || fail "--decode: no KV cache row"
for r in "$f" "$b" "$h" "$g"; do [ "$(adds "$r")" = ok ] || fail "states total does not add up: $(adds "$r")"; done
"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --report comm | head -1 | grep -q "bf16 training" ||
  fail "the bf16 comm report does not say bf16"
z=(-D batch=4 -D micro_batch=1 --dp 4 --zero 3)
zf=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" "${z[@]}" --precision f32 --report memory)
zb=$("$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" "${z[@]}" --precision bf16 --report memory)
echo "$zb" | grep -q "state bytes per parameter: 4 = 1 (f32 master, ZeRO-3 shard over dp) + 0 (no copy) + 1 (f32 grad, ZeRO-3 shard over dp) + 2 (adam m+v, ZeRO-3 over dp)" ||
  fail "bf16 --zero 3 at dp 4: not 4 bytes per parameter: $(echo "$zb" | grep "state bytes per")"
echo "$zb" | grep -q "distributed optimizer 6 + 12 / dp = 9 at dp=4; Megatron-FSDP" || fail "bf16 --zero 3: no Megatron figure"
for r in "ZeRO-3: gathered per micro batch (forward + backward)" "ZeRO-3: gathered parameters, largest run of gathers"; do
  gf=$(row "$zf" "$r"); gb=$(row "$zb" "$r")
  [ -n "$gf" ] && [ -n "$gb" ] && [ $((2 * gb)) -eq "$gf" ] || fail "$r: f32 $gf, bf16 $gb (not half)"
done
echo "ok: bf16 --zero 3 at dp 4: 4 bytes per parameter, gathered per micro batch $(row "$zf" "ZeRO-3: gathered per micro batch (forward + backward)") -> $(row "$zb" "ZeRO-3: gathered per micro batch (forward + backward)")"
echo "ok: per layer held $fh -> $bh bytes, layer input $fi -> $bi, copies $c = masters $p / 2, 18 bytes per parameter"
