#!/usr/bin/env bash
# skip.sh - a skipped fp16 step (docs/precision.md, "Loss scaling"): the
# tiny gpt on 4 ranks, tp 2 x dp 2 (ZeRO-1) unless a layout is given (pp 2
# x dp 2: fp16.skip_pp), +inf injected into ONE rank's gradient (world
# rank 3 unless RANK is given) at steps 3 and 4 (TS_FAULT_INF_RANK /
# TS_FAULT_INF_STEPS, the test hook of runtime/exec/train.c).  Checks:
#   - every rank skips both steps: each rank's parameters and Adam moments
#     in the checkpoints of steps 2, 3 and 4 are bit for bit the same (the
#     .idx hashes of every tensor, rank by rank; the 16-bit copies are
#     refreshed lazily, before the next block that reads them, so a
#     checkpoint's copies may trail its masters by a step: not compared);
#   - the scale: steps 1-4 at 1024, hysteresis 2: the first overflow only
#     counts, the second halves it: step 5 runs at 512;
#   - the skipped steps advance neither the lr schedule nor Adam's step:
#     step 5's lr is the clean run's lr of step 3;
#   - a step with no inf changes the parameters (the check can fail).
#   Under --zero 3 (fp16.skip_zero3) a rank's parameters are its f32 shards
#   (checkpointed as its chunks of each parameter) and its gradients the
#   chunks the micro batches reduce-scattered: the inf goes into one.
#   skip.sh MCC MRUN SRCDIR TMPDIR [RANK [mcc layout options...]]
set -eu
MCC=$1 MRUN=$2 SRC=$3 TMP=$4
INF_RANK=${5:-3}
shift 4
[ $# -gt 0 ] && shift
layout=("$@")
[ ${#layout[@]} -gt 0 ] || layout=(--tp 2 --dp 2)
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP"
fail() { echo "FAIL: $*" >&2; exit 1; }
"$MCC" "$SRC/samples/gpt.mdl" -D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 \
  -D micro_batch=1 --precision fp16 --initial-loss-scale 1024 "${layout[@]}" -o p.plan
run() { "$MRUN" p.plan --gpus 4 --timeout 120 --steps 6 "$@"; }
TS_FAULT_INF_RANK=$INF_RANK TS_FAULT_INF_STEPS=3,4 run --save ck --save-interval 1 --metrics m.jsonl > out.txt 2>&1 \
  || { cat out.txt; fail "the run with injected infs failed"; }
run --metrics clean.jsonl > clean.txt 2>&1 || { cat clean.txt; fail "the clean run failed"; }
cat out.txt
grep -c "TS_FAULT_INF" out.txt | grep -qx 2 || fail "expected 2 injections (steps 3, 4)"
# the optimizer's tensors of rank r in checkpoint k: name and hash
state() { grep -E "kind=(param|shard|adam_m|adam_v) " "ck/iter_$(printf %07d "$1")/rank_0000$2.idx" |
          sed -E 's/^tensor ([^ ]+) .* hash=([0-9a-f]+).*/\1 \2/'; }
for r in 0 1 2 3; do
  a=$(state 2 $r) b=$(state 3 $r) c=$(state 4 $r) d=$(state 5 $r)
  [ -n "$a" ] || fail "rank $r: no parameters or moments in the checkpoint of step 2"
  [ "$a" = "$b" ] || fail "rank $r: a state changed in the skipped step 3: $(diff <(echo "$a") <(echo "$b") | head -4)"
  [ "$a" = "$c" ] || fail "rank $r: a state changed in the skipped step 4"
  [ "$a" != "$d" ] || fail "rank $r: nothing changed in step 5 (no skip there)"
  echo "rank $r: $(echo "$a" | wc -l) parameter and moment tensors bit-identical over the skipped steps 3 and 4"
done
field() { sed -n "${2}p" "$1" | grep -o "\"$3\": [^,}]*" | cut -d' ' -f2; }
is() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 == b + 0) }'; }   # numerically equal
for k in 1 2 3 4 5 6; do echo "step $k: scale $(field m.jsonl $k loss_scale) skipped $(field m.jsonl $k skipped) lr $(field m.jsonl $k lr)"; done
is "$(field m.jsonl 3 skipped)" 1 && is "$(field m.jsonl 4 skipped)" 1 || fail "steps 3 and 4 not reported skipped"
is "$(field m.jsonl 2 skipped)" 0 && is "$(field m.jsonl 5 skipped)" 0 || fail "steps 2 and 5 reported skipped"
is "$(field m.jsonl 4 loss_scale)" 1024 || fail "the first overflow halved the scale (hysteresis 2)"
is "$(field m.jsonl 5 loss_scale)" 512 || fail "step 5's scale is not 512 after two overflows"
is "$(field m.jsonl 6 skipped_steps)" 2 || fail "skipped_steps is not 2 at the end"
[ "$(field m.jsonl 5 lr)" = "$(field clean.jsonl 3 lr)" ] || fail "step 5's lr is not the clean run's of step 3"
[ "$(field m.jsonl 5 lr)" != "$(field clean.jsonl 5 lr)" ] || fail "the lr schedule advanced over skipped steps"
echo "PASS"
