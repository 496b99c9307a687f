#!/usr/bin/env bash
# frontend.sh - how bf16 is asked for and what is refused:
#   --precision bf16 and `precision = bf16` in the train block give the same
#   IR (train line precision=bf16, copy states, casts), which prints and
#   parses back identically (--verify-roundtrip) and shows its dtypes in
#   --dump-ir=precision; --precision f32 overrides the block;
#   --precision-policy norm=f32 keeps the norms' outputs in f32;
#   refused with a message that says what works: a loss-scale flag (fp16's;
#   tests/fp16), a bf16 param, an unknown policy class, bf16 with pp > 1.
#   frontend.sh MCC SOURCE_DIR WORK
set -uo pipefail
mcc=$1 src=$2 work=$3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
cfg=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1)
fail() { echo "FAIL: $*" >&2; exit 1; }
refused() {   # refused WANT mcc-args...: exit 1 and WANT in the message
  local want=$1; shift
  local out; out=$("$mcc" "$@" -o x.plan 2>&1); local rc=$?
  [ $rc -ne 0 ] && echo "$out" | grep -qF -- "$want" || fail "expected a refusal with '$want' (exit $rc): $out"
  echo "refused as expected: $(echo "$out" | grep -m1 error)"
}

"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --verify-roundtrip --emit=ir -o flag.ir ||
  fail "--precision bf16 does not compile"
grep -q "precision=bf16" flag.ir || fail "no precision=bf16 on the train line"
grep -q "bf16\[.*\] copy of=@layers.0.attention.wq" flag.ir || fail "no bf16 copy state of a weight"
grep -q "= cast .* : bf16\[" flag.ir || fail "no casts to bf16"
grep -q "= cross_entropy .* : f32\[" flag.ir || fail "the loss is not f32"
if grep -Eq "= (add|mul|gelu_tanh|layernorm|softmax|cross_entropy) .* : bf16\[" flag.ir; then
  fail "an arithmetic op other than matmul has a bf16 result"
fi
# the GEMMs read bf16 operands themselves (f32 accumulation): no cast feeds
# a matmul, and no cast to bf16 follows one (readers that compute still
# read through a cast to f32); weight gradients (read by accum) f32
python3 - flag.ir <<'PY' || fail "the matmuls do not read bf16 operands as they are (see above)"
import re, sys
op, ty, users, bad = {}, {}, {}, []
nmm = n16 = n32 = into = 0
def block_done():
    global op, ty, users, nmm, n16, n32, into
    mm = [i for i in op if op[i] == "matmul"]
    for i in mm:
        if "cast:bf16" in users.get(i, []): bad.append(f"%{i}: the matmul's result is cast to bf16")
    nmm += len(mm); n16 += sum(ty[i] == "bf16" for i in mm); n32 += sum(ty[i] == "f32" for i in mm)
    into += sum(ty[i] == "f32" and "accum:None" in users.get(i, []) for i in mm)
    op, ty, users = {}, {}, {}
for line in open(sys.argv[1]):
    if line.startswith("block "): block_done()
    m = re.match(r"\s*%(\d+) = (\w+) (.*?) : (\w+)\[", line)
    n = re.match(r"\s*(\w+) (%\d+)", line)
    if m:
        i, o, args, t = int(m[1]), m[2], m[3], m[4]
        op[i], ty[i] = o, t
        ins = [int(x) for x in re.findall(r"%(\d+)", args)]
    elif n:
        o, t, ins = n[1], None, [int(n[2][1:])]
    else:
        continue
    for x in ins:
        users.setdefault(x, []).append(o + ":" + str(t))
    if o == "matmul":
        for x in ins:
            if ty.get(x) != "bf16": bad.append(f"%{i}: operand %{x} is {op.get(x)} : {ty.get(x)}, not bf16")
block_done()
if n16 == 0 or into == 0: bad.append(f"{n16} matmuls store bf16, {into} f32 ones go into a gradient state")
print("\n".join(bad) if bad else f"ok: {nmm} matmuls read bf16 operands (no cast to f32 before, none to bf16 after): {n16} store bf16, {n32} f32 ({into} into gradient states)")
sys.exit(1 if bad else 0)
PY

sed 's/precision = f32/precision = bf16/' "$src/samples/gpt.mdl" > gpt_bf16.mdl
grep -q "precision = bf16" gpt_bf16.mdl || fail "the sample's train block changed"
"$mcc" gpt_bf16.mdl --stdlib "$src/stdlib" "${cfg[@]}" --emit=ir -o block.ir || fail "precision = bf16 does not compile"
cmp -s <(grep -v "^module" flag.ir) <(grep -v "^module" block.ir) || fail "precision = bf16 and --precision bf16 differ"
"$mcc" gpt_bf16.mdl --stdlib "$src/stdlib" "${cfg[@]}" --precision f32 --emit=ir -o over.ir || fail "override"
grep -q "precision=f32" over.ir && ! grep -q " copy of=" over.ir || fail "--precision f32 does not override the block"

"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --dump-ir=precision dump -o x.plan || fail "--dump-ir=precision"
ls dump/*precision*.ir >/dev/null 2>&1 || fail "no dump of pass precision"
grep -q "= cast .* : bf16\[" dump/*precision*.ir || fail "the precision dump shows no bf16"

"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --precision-policy norm=f32 --emit=ir -o pol.ir ||
  fail "--precision-policy norm=f32"
n16() { awk '/= layernorm /{ln=1; next} ln { if ($0 ~ /= cast .* : bf16\[/) c++; ln=0 } END { print c + 0 }' "$1"; }
[ "$(n16 flag.ir)" -gt 0 ] || fail "by default the norms are stored in bf16"
[ "$(n16 pol.ir)" -eq 0 ] || fail "norm=f32: a layernorm output is still cast to bf16"
echo "ok: norms stored bf16 by default ($(n16 flag.ir) casts), f32 with norm=f32"

refused "sets fp16's loss scaling" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --loss-scale 1024
refused "not CLASS=f32 or CLASS=16" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --precision-policy nrom=f32
# a pipeline moves the 16-bit values: the activation sent forward, the
# gradient sent back and every stash of this model are bf16 (2 bytes each)
"$mcc" "$src/samples/gpt.mdl" "${cfg[@]}" --precision bf16 --pp 2 --emit=ir -o pp.ir || fail "bf16 with --pp 2"
nrecv=$(grep -c "= recv .* : bf16\[" pp.ir || true)
[ "$nrecv" -ge 2 ] || fail "pp 2: expected the forward and backward receives in bf16, found $nrecv"
! grep -qE "= (recv|unstash) .* : f32\[" pp.ir || fail "pp 2: an f32 value crosses a stage or is stashed: $(grep -E "= (recv|unstash) .* : f32\[" pp.ir | head -2)"
echo "ok: pp 2: $nrecv receives (forward, backward, evaluation), all bf16; only bf16 stashed"
mkdir -p lib && sed '0,/g = param \[embed\] init ones/s//g = param bf16[embed] init ones/' "$src/stdlib/nn.mdl" > lib/nn.mdl
grep -q "param bf16\[embed\]" lib/nn.mdl || fail "could not make a bf16 param"
refused "parameters are trained as f32" "$src/samples/gpt.mdl" --stdlib lib "${cfg[@]}"
echo "ok: bf16 from the flag and the train block, its dumps, policy and refusals"
