#!/bin/bash
# a2a_dump.sh MCC ROOT - all-to-all attention (mcc --cp-attn a2a,
# docs/sharding.md "All-to-all attention") as the IR and the comm report
# show it, for llama (grouped-query, 8 heads over 4 kv heads, rope) under
# cp 2, alone and with tp 2:
#   - the fused nodes stay (per layer 1 forward, 3 backward), every one on
#     head-split operands ({1:cp*}, under tp {1:tp+cp*}) whole along the
#     sequence; no ring step, no all_gather of the sequence over cp;
#   - per layer 8 all_to_all over cp: q, k, v and do to the head split
#     (split=1 concat=2), o, dq, dk and dv back (split=2 concat=1);
#   - mcc --report comm's all_to_all bytes per step equal the closed form
#     (cp-1)/cp (s/cp) b (4 h + 4 h_kv r) E per layer and micro batch, and the
#     text form of the plan round-trips (--verify-roundtrip);
#   - at cp 4 x tp 2 the 2 kv heads per tp rank are replicated r = 2 times
#     (reshape / broadcast / reshape before the all_to_all of k and v, the
#     copies' gradients summed after the all_to_all of dk and dv).
set -u
mcc=$1 root=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
defs=(-D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256 -D batch=4
      -D micro_batch=1)
fail() { echo "FAIL: $*"; exit 1; }
for cfg in "1 2 1" "2 2 1" "2 4 2"; do
  read -r tp cp rep <<<"$cfg"
  lay=(--cp "$cp" --cp-attn a2a)
  want='\{1:cp\*\}'
  if [ "$tp" = 2 ]; then lay+=(--tp 2); want='\{1:tp\+cp\*\}'; fi
  ir=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" "${lay[@]}" --verify-roundtrip --print-ir-after=shard \
       -o "$tmp/a2a.plan") || fail "mcc ${lay[*]}"
  count() { grep -cE "$1" <<<"$ir"; }
  [ "$(count ' = attention ')" = 2 ] && [ "$(count ' = attention_bwd ')" = 6 ] ||
    fail "tp $tp: $(count ' = attention ') attention, $(count ' = attention_bwd ') attention_bwd, expected 2 and 6"
  [ "$(grep -E ' = attention(_bwd)? ' <<<"$ir" | grep -cE "$want")" = 8 ] ||
    fail "tp $tp: the fused nodes are not all head-split $want"
  [ "$(count ' = (attn_|ring_)')" = 0 ] || fail "tp $tp: ring steps emitted"
  [ "$(count ' = all_gather .*axis=cp dim=2')" = 0 ] || fail "tp $tp: the sequence all-gathered over cp"
  [ "$(count ' = all_to_all .*axis=cp split=1 concat=2 .*'"$want")" = 8 ] ||
    fail "tp $tp: $(count ' = all_to_all .*split=1 concat=2') all_to_all to the head split, expected 2 layers x 4"
  [ "$(count ' = all_to_all .*axis=cp split=2 concat=1 .*[{ ]2:cp[}]')" = 8 ] ||
    fail "tp $tp: $(count ' = all_to_all .*split=2 concat=1') all_to_all back, expected 2 layers x 4"
  # kv heads replicated: per layer 2 broadcasts (k, v) and 2 sums (dk, dv) over the copies
  nb=$(count ' = broadcast .*: f32\[batch:1, kv_heads:[0-9]*, '"$rep"', ')
  ns=$(count ' = sum .* axis=2 keepdim=0 : f32\[batch:1, kv_heads:')
  if [ "$rep" = 1 ]; then [ "$nb" = 0 ] && [ "$ns" = 0 ] || fail "tp $tp cp $cp: kv heads replicated ($nb, $ns)"
  else [ "$nb" = 4 ] && [ "$ns" = 4 ] || fail "tp $tp cp $cp: $nb kv broadcasts, $ns sums, expected 2 layers x 2"; fi
  # bytes: s 16, b 1, h 32 / tp, h_kv 16 / tp (times rep), E 4; 2 layers, 4 micro batches per step
  rep_=$("$mcc" "$root/samples/llama.mdl" "${defs[@]}" "${lay[@]}" --report comm -o - 2>&1) || fail "--report comm"
  got=$(awk '$1 == "micro" && $2 == "all_to_all" { print $NF }' <<<"$rep_")
  want_b=$(awk -v t="$tp" -v c="$cp" -v r="$rep" 'BEGIN {
    printf "%.0f", (c - 1) / c * (16 / c) * 1 * (4 * 32 / t + 4 * 16 / t * r) * 4 * 2 * 4 }')
  [ "$got" = "$want_b" ] || fail "tp $tp cp $cp: all_to_all bytes $got, closed form $want_b"
  echo "ok: tp $tp cp $cp: 8 all_to_all per layer, fused nodes on ${want//\\/}, kv heads x $rep, $got bytes per step = the closed form"
done
