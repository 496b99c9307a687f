#!/usr/bin/env bash
# explain.sh MCC SOURCE_DIR - mcc --report sharding (--explain-sharding):
# for layouts of every kind (tp + sp + dp, cp ring, all-gather and all-to-all, the
# composed attention under cp, pp, ep with tp, tp + cp + sp), every
# communication node of the plan is listed with a note from the pass that
# made it (none says "no note recorded"), the total equals --report comm's,
# and the notes say what they should: the matmul rule's byte weighing, the
# ring, remat's cost model (copies kept by default, gathered again with
# --regather or past --activation-budget), ZeRO-1, the
# pipeline's messages, the tied embedding's group_sum, expert dispatch;
# and --report comm's uniform-routing figure for expert dispatch.
set -uo pipefail
mcc=$1 src=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tiny=(-D layers=2 -D d_model=64 -D heads=4 -D seq_len=32 -D vocab=256 -D batch=4 -D micro_batch=1)
check() {   # name model want-patterns(|-separated, each must appear) -- flags
  local name=$1 model=$2 want=$3; shift 3
  local ex co
  ex=$("$mcc" "$src/samples/$model.mdl" "$@" --explain-sharding 2>&1) || { fail "$name: mcc --explain-sharding: $ex"; return; }
  co=$("$mcc" "$src/samples/$model.mdl" "$@" --report comm 2>&1) || { fail "$name: --report comm: $co"; return; }
  local n; n=$(grep -c "^  [a-z.0-9]* %[0-9]*: " <<<"$ex")
  [ "$n" -gt 0 ] || fail "$name: no communication node listed"
  grep -q "no note recorded" <<<"$ex" && fail "$name: a node without a note: $(grep -B1 'no note recorded' <<<"$ex" | head -2)"
  [ "$(grep '^total per step' <<<"$ex" | sed 's/[0-9]* operations\|[0-9]* collectives//')" = \
    "$(grep '^total per step' <<<"$co" | sed 's/[0-9]* operations\|[0-9]* collectives//')" ] ||
    fail "$name: totals differ from --report comm: $(grep '^total' <<<"$ex") / $(grep '^total' <<<"$co")"
  local IFS='|'
  for w in $want; do grep -q -- "$w" <<<"$ex" || fail "$name: no note saying '$w'"; done
  echo "$name: $n communication nodes, each with its note"
}
check "gpt tp2 sp dp2" gpt "kept for the backward (pass remat: gathering again would send|ZeRO-1: the gradient of|ZeRO-1: token_embedding.wte is re-assembled|cross entropy over vocabulary-split logits|it is a partial sum" \
  "${tiny[@]}" --tp 2 --sp --dp 2
check "gpt tp2 sp --keep-gathered" gpt "reads the add" "${tiny[@]}" --tp 2 --sp --keep-gathered
for k in "" --keep-gathered; do
  "$mcc" "$src/samples/gpt.mdl" "${tiny[@]}" --tp 2 --sp $k --explain-sharding 2>&1 | grep -q "gathered again" &&
    fail "gpt tp2 sp ${k:-(no budget)}: something is gathered again"
done
check "gpt tp2 sp --regather" gpt "gathered again for the backward instead of held across it (pass remat: --regather)" \
  "${tiny[@]}" --tp 2 --sp --regather
"$mcc" "$src/samples/gpt.mdl" "${tiny[@]}" --tp 2 --sp --regather --explain-sharding 2>&1 | grep -q "kept for the backward" &&
  fail "--regather: a gathered copy is kept"
# a budget between the two: some copies kept, the rest gathered again, and
# the held bytes between --regather's and the default's
held() { "$mcc" "$src/samples/gpt.mdl" "${tiny[@]}" --tp 2 --sp "$@" --report memory | awk '/block micro: held for the backward/ { print $(NF-1); exit }'; }
lo=$(held --regather) hi=$(held)
mid=$(( (lo + hi) / 2 ))
check "gpt tp2 sp --activation-budget $mid" gpt "within --activation-budget|over --activation-budget $mid" \
  "${tiny[@]}" --tp 2 --sp --activation-budget $mid
got=$(held --activation-budget $mid)
[ -n "$lo" ] && [ "$lo" -lt "$got" ] && [ "$got" -lt "$hi" ] && [ "$got" -le "$mid" ] ||
  fail "--activation-budget $mid: held $got bytes, want within the budget and between --regather's $lo and the default's $hi"
check "llama cp2 ring" llama "ring attention under cp|ring attention's backward under cp" \
  "${tiny[@]}" -D kv_heads=2 -D ffn=128 --cp 2
check "llama cp2 allgather" llama "reads the" "${tiny[@]}" -D kv_heads=2 -D ffn=128 --cp 2 --cp-attn allgather
check "llama cp2 a2a" llama "the sequence-split operand exchanged for this rank's heads|the result, head-split over the whole sequence, exchanged back|the gradient, head-split over the whole sequence, exchanged back" \
  "${tiny[@]}" -D kv_heads=2 -D ffn=128 --cp 2 --cp-attn a2a
check "gpt cp2 composed attention" gpt "gathering the first sends [0-9]* bytes, the second [0-9]*" \
  "${tiny[@]}" -D dropout=0.1 --cp 2
check "gpt pp2" gpt "pipeline: the forward value|pipeline: the backward value|token_embedding.wte is read on several pipeline stages" \
  "${tiny[@]}" --pp 2
check "moe ep2 tp2" moe "expert parallelism: each token row" -D layers=1 --tp 2 --ep 2
check "moe tp2 cp2 sp" moe "reads the" -D layers=1 --tp 2 --cp 2 --sp
# at uniform routing an all_to_all_v over ep = 2 sends half of this rank's
# own routed rows; the worst routing (the static buffers) sends all of them
u=$("$mcc" "$src/samples/moe.mdl" -D layers=1 --ep 2 --report comm 2>&1 |
    sed -n 's/^total per step at uniform routing: .*(all_to_all_v: \([0-9]*\) of the \([0-9]*\) above.*/\1 \2/p')
read -r uni worst <<<"$u"
[ -n "${uni:-}" ] && [ "$uni" -gt 0 ] && [ $((2 * uni)) = "$worst" ] ||
  fail "moe ep2: all_to_all_v at uniform routing '$uni' bytes is not half the worst routing's '$worst'"
# with a capacity factor each expert takes at most cap = ceil(f x tokens x
# topk / experts) rows of the micro batch, so a rank receives at most its
# experts x cap: at f = 1 exactly its own routed rows, the uniform share,
# and the static buffers' worst routing is half the dropless one at ep = 2
u=$("$mcc" "$src/samples/moe.mdl" -D layers=1 --ep 2 -D capacity_factor=1 --report comm 2>&1 |
    sed -n 's/^total per step at uniform routing: .*(all_to_all_v: \([0-9]*\) of the \([0-9]*\) above.*/\1 \2/p')
read -r cuni cworst <<<"$u"
[ -n "${cworst:-}" ] && [ "$cworst" = "$cuni" ] && [ $((2 * cworst)) = "$worst" ] ||
  fail "moe ep2 capacity 1: all_to_all_v worst routing '$cworst' bytes, want the uniform '$cuni' and half the dropless '$worst'"
[ $fails = 0 ] && echo PASS
exit $((fails > 0))
