#!/bin/bash
# ring_dump.sh MCC ROOT - the IR after pass "shard" for llama (grouped-query,
# rope) under cp 2: by default every attention (forward and the three
# backward parts) is lowered into ring steps (docs/sharding.md "Ring
# attention"): per layer and cp = 2, the forward folds 2 blocks (attn_acc
# src=0, 1), dq takes 2 steps, dk and dv 2 each, all on ONE backward ring
# of (k, v), and the blocks move by ring_shift / ring_wait pairs (k and v
# before each step but the last, forward and backward; the dk / dv partial
# sums of the other ranks after every step but the first): 6 (cp - 1) per
# layer, the closed form's count, with no fused attention node and no
# all_gather along the sequence; with --cp-attn allgather the fused nodes
# stay and k / v are all-gathered.  A bad --cp-attn value is refused.
set -u
mcc=$1 root=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT   # the plans mcc writes besides the dumps (not into the source tree)
defs=(-D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256 -D batch=4
      -D micro_batch=1)
fail() { echo "FAIL: $*"; exit 1; }
ring=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --print-ir-after=shard -o "$tmp/ring.plan") || fail "mcc --cp 2"
count() { grep -cE "$1" <<<"$ring"; }
[ "$(count ' = attention(_bwd)? ')" = 0 ] || fail "ring: fused attention nodes left"
[ "$(count ' = attn_acc .*src=0 ')" = 2 ] && [ "$(count ' = attn_acc .*src=1 ')" = 2 ] ||
  fail "ring: attn_acc steps: $(count ' = attn_acc '), expected 2 layers x src 0, 1"
[ "$(count ' = attn_finish ')" = 2 ] || fail "ring: $(count ' = attn_finish ') attn_finish, expected 2"
[ "$(count ' = attn_bwd_q ')" = 4 ] || fail "ring: $(count ' = attn_bwd_q ') attn_bwd_q, expected 4"
[ "$(count ' = attn_bwd_kv .*part=1 ')" = 4 ] && [ "$(count ' = attn_bwd_kv .*part=2 ')" = 4 ] ||
  fail "ring: $(count ' = attn_bwd_kv ') attn_bwd_kv, expected 2 layers x 2 steps x dk, dv"
[ "$(count ' = ring_shift .*axis=cp')" = 12 ] || fail "ring: $(count ' = ring_shift ') ring_shift, expected 2 layers x 6 (cp - 1)"
[ "$(count ' = ring_wait ')" = 12 ] || fail "ring: $(count ' = ring_wait ') ring_wait, expected 12"
grep -E ' = attn_finish %' <<<"$ring" | grep -q '{2:cp}' || fail "ring: the attention output is not a cp block"
n=$(grep -cE ' = all_gather .*axis=cp' <<<"$ring")
[ "$n" = 0 ] || fail "ring: $n all_gathers over cp, expected none"
ag=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --cp-attn allgather --print-ir-after=shard -o "$tmp/ag.plan") ||
  fail "mcc --cp-attn allgather"
n=$(grep -cE ' = attention(_bwd)? ' <<<"$ag")
[ "$n" = 8 ] || fail "allgather: $n fused attention nodes, expected 2 layers x (1 forward + 3 backward)"
[ "$(grep -cE ' = (attn_|ring_)' <<<"$ag")" = 0 ] || fail "allgather: ring steps emitted"
n=$(grep -cE ' = all_gather .*axis=cp dim=2' <<<"$ag")
[ "$n" -ge 4 ] || fail "allgather: $n all_gathers of k / v over cp, expected at least 4"
err=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --cp-attn sideways -o "$tmp/bad.plan" 2>&1) && fail "--cp-attn sideways accepted"
grep -q "ring, allgather or a2a" <<<"$err" || fail "--cp-attn sideways: message '$err'"
echo "ok: the ring in IR steps under cp 2 (no fused node, no cp all_gather); allgather variant and refusal as expected"
