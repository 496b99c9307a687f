#!/usr/bin/env bash
# frontend.sh - how fp16 is asked for, what its IR holds, what is refused:
#   --precision fp16 and `precision = fp16` in the train block give the
#   same IR: train line precision=f16, f16 copy states and casts, the four
#   scaler states (@loss_scale start=2^32 by default, or the flags'), the
#   seed `muls` of @loss_scale, blocks "scaler" (nonfinite, all_reduce max
#   over tp and dp, the outputs) and "skip" (zero the gradients), and
#   scale_update at the end of "skip" (found 1) and "update" (found 0),
#   after the update unscaled by 1 / @loss_scale; it prints and parses back
#   identically (--verify-roundtrip); --loss-scale makes scale_update fixed
#   (dynamic=0).  Refused, naming what works: fp16 with pp > 1, a loss-scale
#   flag without fp16, a hysteresis of 0, a negative scale.
#   frontend.sh MCC SOURCE_DIR WORK
set -uo pipefail
mcc=$1 src=$2 work=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1)
fail() { echo "FAIL: $*" >&2; exit 1; }
refused() {   # refused WANT mcc-args...: exit != 0 and WANT in the message
  local want=$1; shift
  local out; out=$("$mcc" "$@" -o x.plan 2>&1); local rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -qF -- "$want" || fail "expected a refusal with '$want' (exit $rc): $out"
  echo "refused as expected: $(echo "$out" | grep -m1 error)"
}

"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --tp 2 --dp 2 --verify-roundtrip --emit=ir -o flag.ir ||
  fail "--precision fp16 does not compile"
grep -q "precision=f16" flag.ir || fail "no precision=f16 on the train line"
grep -q "state @f16.layers.0.attention.wq : f16\[.* copy of=@layers.0.attention.wq" flag.ir || fail "no f16 copy state of a weight"
grep -q "state @loss_scale : f32\[\] scaler start=4294967296.0" flag.ir || fail "no @loss_scale starting at 2^32"
grep -q "state @loss_scale.hyst : f32\[\] scaler start=2.0" flag.ir || fail "no hysteresis state starting at 2"
grep -q "= state @loss_scale : f32\[\]" flag.ir && grep -q "= muls %[0-9]* c=0.25 : f32\[\]" flag.ir || fail "the seed does not read the scale"
grep -q "^block scaler" flag.ir && grep -q "^block skip" flag.ir || fail "no blocks scaler and skip"
awk '/^block scaler/{on=1; next} /^block/{on=0} on' flag.ir > scaler.ir
grep -q "= nonfinite %" scaler.ir || fail "the scaler block checks no gradient"
grep -q "all_reduce %.* axis=tp red=1" scaler.ir && grep -q "all_reduce %.* axis=dp red=1" scaler.ir ||
  fail "the found-inf flag is not max-reduced over tp and dp"
for o in found_inf loss_scale skipped_steps; do grep -q "output .*\"$o\"" scaler.ir || fail "no output $o"; done
! grep -q "scale_update" scaler.ir || fail "the scaler block changes the scale before the update used it"
awk '/^block skip/{on=1; next} /^block/{on=0} on' flag.ir > skip.ir
awk '/^block update/{on=1; next} /^block/{on=0} on' flag.ir > update.ir
grep -q "zero @grad\." skip.ir || fail "skip does not zero grads"
for b in skip update; do
  last=$(grep -v "^}" $b.ir | tail -1)
  echo "$last" | grep -q "^  scale_update .* window=1000 hysteresis=2 dynamic=1 min=1.0" || fail "$b does not end with scale_update (Megatron's defaults): $last"
done
grep -q "= div .*, %[0-9]* : f32\[\]" update.ir && grep -q "= state @loss_scale " update.ir || fail "update does not unscale"
echo "ok: fp16 IR: scaler states, scaled seed, blocks scaler ($(grep -c nonfinite scaler.ir) gradients checked) and skip"

sed 's/precision = f32/precision = fp16/' "$src/samples/gpt.mdl" > gpt_fp16.mdl
grep -q "precision = fp16" gpt_fp16.mdl || fail "the sample's train block changed"
"$mcc" gpt_fp16.mdl --stdlib "$src/stdlib" "${cfg[@]}" --tp 2 --dp 2 --emit=ir -o block.ir ||
  fail "precision = fp16 does not compile"
cmp -s <(grep -v "^module" flag.ir) <(grep -v "^module" block.ir) || fail "precision = fp16 and --precision fp16 differ"

"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --loss-scale 4096 --emit=ir -o fixed.ir || fail "--loss-scale"
grep -q "state @loss_scale : f32\[\] scaler start=4096.0" fixed.ir && grep -q "scale_update .* dynamic=0" fixed.ir ||
  fail "--loss-scale 4096 is not a fixed scale of 4096"
echo "ok: --loss-scale 4096 is a fixed scale"

# a pipeline: the scaled seed in the last chunk's backward, per pipeline
# rank its own check and skip, the check's max over pp
"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --pp 2 --emit=ir -o pp.ir || fail "fp16 with --pp 2"
awk '/^block /{b=$2} /= muls .*/ && b == "bwd.1" {f=1} END {exit !f}' pp.ir || fail "pp 2: no scaled seed in bwd.1"
for r in 0 1; do
  grep -q "^block scaler.$r {" pp.ir && grep -q "^block skip.$r {" pp.ir || fail "pp 2: no scaler.$r / skip.$r"
  awk -v b="scaler.$r" '/^block /{in_b = $2 == b} in_b && /all_reduce .* axis=pp red=1/ {f=1} END {exit !f}' pp.ir ||
    fail "pp 2: scaler.$r does not take the max over pp"
  awk -v b="update.$r" '/^block /{in_b = $2 == b} in_b && /scale_update/ {l=$0} in_b && /^}/ {exit !(l != "")} ' pp.ir ||
    fail "pp 2: update.$r does not update the scale"
done
grep -E "= (recv|unstash) .* : f16\[" pp.ir | grep -q recv || fail "pp 2: no f16 message"
echo "ok: pp 2: the scaled seed in bwd.1, scaler.0 / scaler.1 with the max over pp, f16 messages"
refused "sets fp16's loss scaling, but this module trains in f32" "$src/samples/gpt.mdl" "${cfg[@]}" --hysteresis 3
refused "expect a positive whole number" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --hysteresis 0
refused "expect a positive number" "$src/samples/gpt.mdl" "${cfg[@]}" --precision fp16 --initial-loss-scale -1
echo "PASS"
