#!/usr/bin/env bash
# metrics.sh - tokens per expert as training metrics (nn.moe's
# metric("moe.#.tokens", ...)): in a moe run's --metrics file, every step
# and layer, the per-expert slot counts sum to tokens * topk * micro batches
# (dropless); the ep 2 x dp 2 x tp 2 run reports the same counts as one rank
# (summed over dp, not double counted over ep / tp), and so does pp 2 x ep 2
# (each stage reports its layers; the trainer merges the stages' lists); with capacity factor
# 0.5 no expert exceeds C * micro batches and slots are dropped.
#
#   metrics.sh MCC MRUN MDL TMPDIR
set -u
MCC=$1 MRUN=$2 MDL=$3 TMP=$4
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
# 2 micro batches of 2 x 16 tokens (ep splits each micro batch), top 2 of 4 experts, 2 layers
D=(-D layers=2 -D d_model=32 -D heads=4 -D kv_heads=2 -D ffn=32 -D seq_len=16 -D batch=4 -D micro_batch=2
   -D experts=4 -D topk=2)
run() {   # name ranks mcc-args...
  local name=$1 ranks=$2
  shift 2
  "$MCC" "$MDL" "${D[@]}" "$@" -o "$TMP/$name.plan" || fail "mcc $name"
  "$MRUN" "$TMP/$name.plan" --gpus "$ranks" --steps 3 --metrics "$TMP/$name.jsonl" >"$TMP/$name.log" 2>&1 ||
    { cat "$TMP/$name.log"; fail "mrun $name"; }
  grep -q "moe.0.tokens" "$TMP/$name.log" || fail "$name: no tokens per expert in the progress line"
}
run one 1
run ep 8 --ep 2 --dp 2 --tp 2
run pp 4 --pp 2 --ep 2
run cap 1 -D capacity_factor=0.5
/usr/bin/python3 - "$TMP" <<'PY' || fail "metrics check"
import json, sys
tmp = sys.argv[1]
def load(name):
    steps = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    assert len(steps) == 3, f"{name}: {len(steps)} metric lines"
    out = []
    for s in steps:
        c = {(l, e): s[f"moe.{l}.tokens.{e}"] for l in range(2) for e in range(4)}
        assert not any(k.startswith("moe.2.") for k in s), f"{name}: a third moe layer"
        out.append(c)
    return out
slots = 32 * 2 * 2                       # tokens per micro batch * topk * micro batches
one, ep, pp, cap = load("one"), load("ep"), load("pp"), load("cap")
for i, c in enumerate(one):
    for l in range(2):
        t = sum(c[(l, e)] for e in range(4))
        assert t == slots, f"step {i+1} layer {l}: {t} slots, want {slots}"
    assert c == ep[i], f"step {i+1}: ep2 dp2 tp2 counts {ep[i]} != one rank {c}"
    assert c == pp[i], f"step {i+1}: pp2 ep2 counts {pp[i]} != one rank {c}"
C = 8                                    # ceil(0.5 * 32 * 2 / 4) per micro batch
dropped = 0
for i, c in enumerate(cap):
    for l in range(2):
        assert all(c[(l, e)] <= C * 2 for e in range(4)), f"capacity step {i+1}: {c}"
        dropped += slots - sum(c[(l, e)] for e in range(4))
assert dropped > 0, "capacity 0.5 dropped nothing"
print("ok: per-expert counts", one[0], "; capacity dropped", dropped, "slots over 3 steps")
PY
