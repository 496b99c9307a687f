#!/usr/bin/env bash
# train.sh - --fp8 on the tiny gpt (4 layers: layers 1 and 2 in fp8, the
# first and last bf16), CPU ranks:
#   - the IR: 36 matmul8 in block micro (2 layers x 6 GEMMs x forward, dX,
#     dW), 20 E4M3 and 12 E5M2 quantizations under hybrid (E4M3 only under
#     e4m3), no matmul8 in layers 0 and 3; --fp8-all-layers: 72;
#   - trains: 30 steps, the final loss within 2% of the bf16 run's, and the
#     fp8 run is not the bf16 run (the losses differ somewhere);
#   - resume: stopped after step 3 and resumed, steps 4-6, the parameters
#     and the whole checkpoint of step 6 (fp8 states included) bit for bit
#     the uninterrupted run's;
#   - --report memory lists the fp8 states and copies.
#   train.sh BIN SRC WORK
set -euo pipefail
bin=$1 src=$2 work=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
cfg=(-D layers=4 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1 --precision bf16)
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --fp8 hybrid --emit=ir -o h.ir
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --fp8 e4m3 --emit=ir -o e.ir
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --fp8 hybrid --fp8-all-layers --emit=ir -o a.ir
micro() { awk '/^block /{b=$2} b=="micro"' "$1"; }
[ "$(micro h.ir | grep -c ' = matmul8 ')" = 36 ] || fail "hybrid: $(micro h.ir | grep -c ' = matmul8 ') matmul8, want 36"
[ "$(micro h.ir | grep -c 'quant8 .*: f8e4m3')" = 20 ] && [ "$(micro h.ir | grep -c 'quant8 .*: f8e5m2')" = 12 ] ||
  fail "hybrid: want 20 E4M3 and 12 E5M2 quantizations"
[ "$(micro e.ir | grep -c 'quant8 .*: f8e5m2')" = 0 ] && [ "$(micro e.ir | grep -c 'quant8 .*: f8e4m3')" = 32 ] ||
  fail "e4m3: want 32 E4M3 quantizations, no E5M2"
[ "$(micro a.ir | grep -c ' = matmul8 ')" = 72 ] || fail "--fp8-all-layers: want 72 matmul8"
grep -q '^state @fp8.layers.1.x0.amax_history : f32\[1024\] fp8' h.ir && ! grep -q '@fp8.layers.[03]\.' h.ir ||
  fail "the states: layers 1 and 2 only, history 1024"
grep -q 'fp8_scale .* algo=1 margin=0.0 fmax=57344.0' h.ir && grep -q 'fp8_scale .* algo=1 margin=0.0 fmax=448.0' h.ir ||
  fail "the update's scale ops (most_recent, margin 0, both formats)"
echo "ok: 36 fp8 GEMMs in layers 1-2 (20 E4M3 + 12 E5M2 quantizations; e4m3: 32 E4M3), 72 with --fp8-all-layers"

"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --fp8 hybrid -o f.plan
"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" -o b.plan
"$bin/mrun" f.plan --steps 30 --metrics f.jsonl --quiet 2> f.err || { cat f.err; exit 1; }
"$bin/mrun" b.plan --steps 30 --metrics b.jsonl --quiet 2> b.err || { cat b.err; exit 1; }
python3 - f.jsonl b.jsonl <<'PY'
import json, sys
f = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
rel = abs(f[-1] - b[-1]) / abs(b[-1])
print(f"30 steps: fp8 {f[-1]:.5f}, bf16 {b[-1]:.5f} (relative {rel:.2e}); first loss {f[0]:.4f} -> {f[-1]:.4f}")
assert f[-1] < f[0] - 0.3, "fp8 does not train"
assert rel < 0.02, "fp8's final loss is not within 2% of bf16's"
assert f != b, "the fp8 run equals the bf16 run: nothing was quantized"
PY

"$bin/mrun" f.plan --steps 6 --metrics a.jsonl --save-params a.bin --save cka --quiet 2> r.err || { cat r.err; exit 1; }
"$bin/mrun" f.plan --steps 3 --save ck --quiet 2> r.err || { cat r.err; exit 1; }
"$bin/mrun" f.plan --steps 6 --load ck --metrics r.jsonl --save-params r.bin --save ckr --quiet 2> r.err ||
  { cat r.err; exit 1; }
cmp -s a.bin r.bin || fail "the resumed run's parameters differ"
keep() { python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["step"] > 3: print(r["step"], r["loss"], r["grad_norm"])' "$1"; }
[ "$(keep a.jsonl)" = "$(keep r.jsonl)" ] || fail "steps 4-6 differ after the resume"
n=$(strings cka/iter_0000006/rank_00000.idx | grep -c '^tensor fp8\..* kind=fp8')
[ "$n" = 128 ] || fail "$n fp8 states in the step-6 checkpoint, want 128 (32 tensors x 4)"
cmp -s cka/iter_0000006/rank_00000.bin ckr/iter_0000006/rank_00000.bin || fail "the step-6 checkpoints differ"
echo "ok: resumed after step 3: steps 4-6, the parameters and the step-6 checkpoint (128 fp8 states) bit for bit"

"$bin/mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --fp8 hybrid --report memory > mem.txt
cat mem.txt | grep fp8
grep -q "fp8 states (32 tensors x (history 1024 + 3) f32) *131456" mem.txt || fail "fp8 states row"
grep -q "fp8 copies per micro batch" mem.txt && grep -q "fp8 copies held for the backward" mem.txt || fail "fp8 copies rows"
