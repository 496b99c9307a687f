#!/usr/bin/env bash
# structure.sh - what the sharding pass must produce, read off the IR it
# prints (shard_dump): the Megatron patterns come out of the per-op rules,
# no rank holds the full logits, uneven sizes are padded or refused.
#   structure.sh SHARD_DUMP SOURCE_DIR
# no pipefail: `... | grep -q` may close the pipe early (SIGPIPE upstream)
set -u
dump=$1 src=$2
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tiny="layers=2 d_model=32 heads=4 seq_len=8 vocab=40 batch=2 micro_batch=2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the micro block's forward part (up to the loss) and all of it
fwd() { sed -n '/^block micro {/,/output "loss"/p' "$1"; }
micro() { sed -n '/^block micro {/,/^}/p' "$1"; }
count() { grep -c -- " $1 " || true; }

# 1. tp=2: one all-reduce for the vocab-parallel embedding, two per layer
#    (attention and MLP row-parallel outputs), three scalar-per-token ones
#    in the vocab-parallel cross-entropy; nothing else talks.
"$dump" "$src/samples/gpt.mdl" 2 0 $tiny >"$tmp/tp2.ir" || fail "gpt tp=2 does not compile"
n=$(fwd "$tmp/tp2.ir" | count all_reduce)
[ "$n" = 8 ] || fail "gpt tp=2 forward: $n all_reduce, expected 1 + 2*2 + 3 = 8"
n=$(micro "$tmp/tp2.ir" | grep -cE " (all_gather|reduce_scatter|shard_slice) " || true)
[ "$n" = 0 ] || fail "gpt tp=2: $n gathers/scatters/slices, expected none"
# backward: one all-reduce per layer norm input gradient (2 per layer + final norm)
n=$(micro "$tmp/tp2.ir" | count all_reduce)
[ "$n" = 13 ] || fail "gpt tp=2 micro: $n all_reduce, expected 8 forward + 5 backward"
# 2. no rank holds the full logits: every vocab-sized dim is local (40 / 2)
micro "$tmp/tp2.ir" | grep -q "vocab:40" && fail "gpt tp=2: a value holds the whole vocab"
micro "$tmp/tp2.ir" | grep -q "vocab:20" || fail "gpt tp=2: no vocab-sharded value at all?"
# 3. sequence parallelism: all-gather before and reduce-scatter after each
#    column/row pair; the only all-reduces left are the per-token ones of
#    the cross-entropy (rank-2 [batch, seq] values)
"$dump" "$src/samples/gpt.mdl" 2 1 $tiny >"$tmp/sp.ir" || fail "gpt tp=2 sp does not compile"
n=$(fwd "$tmp/sp.ir" | count all_gather); [ "$n" = 5 ] || fail "gpt sp forward: $n all_gather, expected 2*2 + 1"
n=$(fwd "$tmp/sp.ir" | count reduce_scatter); [ "$n" = 5 ] || fail "gpt sp forward: $n reduce_scatter, expected 1 + 2*2"
fwd "$tmp/sp.ir" | grep " all_reduce " | grep -qv "f64\[batch:2, seq:8\]\|f32\[batch:2, seq:8\]" &&
  fail "gpt sp forward: an all_reduce of an activation (expected only per-token ones)"
fwd "$tmp/sp.ir" | grep -q "layernorm .*seq:4" || fail "gpt sp: layernorm does not run on sequence shards"
#    ... and the weight gradients are complete per shard, as Megatron's:
#    column-parallel from the re-gathered input, row-parallel from the
#    local shard: every reduce-scatter moves a sequence-split activation,
#    none a full-size weight gradient that is partial over tp (micro batch
#    1, where [batch, seq] flattens with the sequence split kept)
"$dump" "$src/samples/gpt.mdl" 2 1 layers=2 d_model=32 heads=4 seq_len=8 vocab=40 batch=2 micro_batch=1 \
  >"$tmp/sp_mb1.ir" || fail "gpt tp=2 sp micro_batch=1 does not compile"
n=$(micro "$tmp/sp_mb1.ir" | count reduce_scatter)
[ "$n" -gt 0 ] || fail "gpt sp micro_batch=1: no reduce_scatter at all?"
micro "$tmp/sp_mb1.ir" | grep " reduce_scatter " | grep -v "seq:" | grep -q . &&
  fail "gpt sp micro_batch=1: a weight gradient is reduce-scattered: $(micro "$tmp/sp_mb1.ir" | grep " reduce_scatter " | grep -v "seq:" | head -1)"
# 4. uneven sizes: a vocab tp does not divide is padded and masked ...
"$dump" "$src/samples/gpt.mdl" 4 0 layers=1 d_model=32 heads=4 seq_len=8 vocab=41 batch=2 micro_batch=2 \
  >"$tmp/pad.ir" || fail "gpt vocab=41 tp=4 does not compile"
grep -q "^state @token_embedding.wte : f32\[vocab:11, dim:32\] {0:tp} .*logical=\[41, 0\]" "$tmp/pad.ir" ||
  fail "vocab=41 tp=4: wte is not padded to 44 rows (11 per rank) with logical size 41"
micro "$tmp/pad.ir" | grep -q "pad_fill .* dim=2 limit=41 fill=-inf" || fail "vocab=41: padding is not masked"
# ... but heads (or kv_heads) it does not divide are refused, naming the dim and the sizes
"$dump" "$src/samples/gpt.mdl" 4 0 layers=1 d_model=48 heads=6 seq_len=8 vocab=40 batch=2 micro_batch=2 \
  >"$tmp/h.ir" 2>"$tmp/h.err" && fail "heads=6 tp=4 was accepted"
grep -q "dim 'heads' = 6 is not divisible by tp = 4" "$tmp/h.err" || fail "heads=6: message: $(cat "$tmp/h.err")"
"$dump" "$src/samples/llama.mdl" 2 0 layers=1 d_model=32 heads=4 seq_len=8 vocab=40 batch=2 micro_batch=2 \
  >"$tmp/k.ir" 2>"$tmp/k.err" && fail "kv_heads=1 tp=2 was accepted"
grep -q "dim 'kv_heads' = 1 is not divisible by tp = 2" "$tmp/k.err" || fail "kv_heads=1: message: $(cat "$tmp/k.err")"
# 5. sp needs tp
"$dump" "$src/samples/gpt.mdl" 1 1 $tiny >/dev/null 2>"$tmp/sp1.err" && fail "sp with tp=1 was accepted"
grep -q "sequence parallelism (sp) needs tp > 1" "$tmp/sp1.err" || fail "sp tp=1: message: $(cat "$tmp/sp1.err")"
# 6. tp=1 leaves the module unsharded
"$dump" "$src/samples/gpt.mdl" 1 0 $tiny >"$tmp/tp1.ir" || fail "gpt tp=1 does not compile"
grep -qE "\{[0-9]+:tp|partial:tp" "$tmp/tp1.ir" && fail "tp=1: shardings appear"
echo "structure.sh: $fails failure(s)"
[ "$fails" = 0 ]
