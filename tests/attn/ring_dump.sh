#!/bin/bash
# ring_dump.sh MCC ROOT - the IR after pass "shard" for llama (grouped-query,
# rope) under cp 2: by default every fused attention node (forward and the
# three backward parts) carries ring=1 and reads k / v as cp blocks, with no
# all_gather along the sequence; with --cp-attn allgather the nodes carry
# ring=0 and k / v are all-gathered.  A bad --cp-attn value is refused.
set -u
mcc=$1 root=$2
defs=(-D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256 -D batch=4
      -D micro_batch=1)
fail() { echo "FAIL: $*"; exit 1; }
ring=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --print-ir-after=shard) || fail "mcc --cp 2"
n=$(grep -cE ' = attention(_bwd)? .*ring=1' <<<"$ring")
[ "$n" = 8 ] || fail "ring: $n attention nodes with ring=1, expected 2 layers x (1 forward + 3 backward)"
n=$(grep -cE ' = attention(_bwd)? .*ring=0' <<<"$ring")
[ "$n" = 0 ] || fail "ring: $n attention nodes with ring=0"
grep -E ' = attention %' <<<"$ring" | grep -q '{2:cp}' || fail "ring: the attention output is not a cp block"
n=$(grep -cE ' = all_gather .*axis=cp' <<<"$ring")
[ "$n" = 0 ] || fail "ring: $n all_gathers over cp, expected none"
ag=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --cp-attn allgather --print-ir-after=shard) ||
  fail "mcc --cp-attn allgather"
n=$(grep -cE ' = attention(_bwd)? .*ring=0' <<<"$ag")
[ "$n" = 8 ] || fail "allgather: $n attention nodes with ring=0, expected 8"
n=$(grep -cE ' = all_gather .*axis=cp dim=2' <<<"$ag")
[ "$n" -ge 4 ] || fail "allgather: $n all_gathers of k / v over cp, expected at least 4"
err=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" --cp 2 --cp-attn sideways 2>&1) && fail "--cp-attn sideways accepted"
grep -q "ring or allgather" <<<"$err" || fail "--cp-attn sideways: message '$err'"
echo "ok: ring=1 on 8 attention nodes under cp 2, no cp all_gather; allgather variant and refusal as expected"
