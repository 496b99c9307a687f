#!/bin/bash
# mcc_test.sh - the pipeline views of mcc as a user runs them:
# `--report schedule` (partition, one timeline line per rank, bubbles that
# equal (p-1)/(v*m) on the time grid, in-flight peaks), `--emit=trace FILE`
# (well-formed JSON with ph "X" events, one per step), the refusals (1f1b
# with too few micro batches, also for a plan, pipeline options with pp=1, interleaved without --vpp,
# a layout that misses a layer, micro batches that do not divide), and
# that no plan is written.
#
# usage: mcc_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
. "$SRC/tests/pipe/common.sh"
cp "$SRC/samples/gpt.mdl" "$TMP/gpt.mdl"
cp "$SRC/samples/llama.mdl" "$TMP/llama.mdl"
TINY="-D layers=8 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=64 -D batch=16 -D micro_batch=1"


# 1F1B, pp=4, 16 micro batches: bubble 3/16 on every rank, rank 0 holds 4
run 0 "$TMP/gpt.mdl" $TINY --pp 4 --report schedule
has "$TMP/out" "pp=4 vpp=1, 1f1b, 16 micro batches per step"
has "$TMP/out" "E + layers 0-1"
has "$TMP/out" "layers 6-7 + L"
has "$TMP/out" "shared across pipeline ranks (gradients all-reduced in an embedding group): token_embedding.wte"
[ "$(grep -c '^  rank [0-9]* *|' "$TMP/out")" = 4 ] || die "1f1b: not one timeline line per rank"
[ "$(grep -c 'f=1,b=2 0.1875 ' "$TMP/out")" = 4 ] || die "1f1b: bubble not 3/16 on every rank: $(grep f=1 "$TMP/out")"
has "$TMP/out" "rank 0   peak 4 micro batches"
[ -e "$TMP/gpt.plan" ] && die "--report schedule wrote a plan"

# interleaved (default with --vpp 2), pp=2: bubble 1/(2*16)
run 0 "$TMP/llama.mdl" $TINY --pp 2 --vpp 2 --report schedule -o "$TMP/il.txt"
has "$TMP/il.txt" "pp=2 vpp=2, interleaved"
[ "$(grep -c 'f=1,b=2 0.0312 ' "$TMP/il.txt")" = 2 ] || die "interleaved: bubble not 1/32: $(grep f=1 "$TMP/il.txt")"

# a Megatron layout and a trace
run 0 "$TMP/gpt.mdl" $TINY --pp 4 --pp-layout "Et*3|t*2|t*2|tL" --schedule gpipe --report schedule --emit=trace "$TMP/t.json"
has "$TMP/out" "E + layers 0-2"
has "$TMP/out" "layer 7 + L"
/usr/bin/python3 - "$TMP/t.json" <<'PY' || die "trace is not a well-formed Chrome trace"
import json, sys
d = json.load(open(sys.argv[1]))
ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
assert len(ev) == 4 * 2 * 16, len(ev)                 # pp ranks x (F + B) x micro batches
assert {e["tid"] for e in ev} == {0, 1, 2, 3}
for e in ev:
    assert e["dur"] > 0 and e["ts"] >= 0 and e["name"][0] in "FB"
for tid in range(4):                                 # a rank's steps never overlap
    xs = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == tid)
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(xs, xs[1:]))
PY
# zb-h1 against 1f1b at pp 4, m 8, from the reports' own numbers (issue
# 19): the worst rank's bubble at most a third of 1f1b's, the same peak
# in flight (worst rank and first rank); W steps on the grid; the memory
# report counts what B keeps for W
run 0 "$TMP/gpt.mdl" $TINY -D batch=8 --pp 4 --report schedule -o "$TMP/s1.txt"
run 0 "$TMP/gpt.mdl" $TINY -D batch=8 --pp 4 --schedule zb-h1 --report schedule -o "$TMP/sz.txt"
has "$TMP/sz.txt" "pp=4 vpp=1, zb-h1, 8 micro batches per step"
has "$TMP/sz.txt" "B (input gradient) 1 + W (weight gradients) 1"
[ "$(grep -c '^  rank 0  |.* W7 |$' "$TMP/sz.txt")" = 1 ] || die "zb-h1: rank 0 does not end with W7: $(grep '|' "$TMP/sz.txt")"
summ() { sed -n "s/^summary: $2 bubble \([0-9.]*\) (worst rank, f=1,b=2), peak in flight \([0-9]*\) .*/\1 \2/p" "$1"; }
read -r b1 k1 <<< "$(summ "$TMP/s1.txt" 1f1b)"
read -r bz kz <<< "$(summ "$TMP/sz.txt" zb-h1)"
[ -n "$b1" ] && [ -n "$bz" ] || die "no summary lines: $(grep summary "$TMP/s1.txt" "$TMP/sz.txt")"
awk -v z="$bz" -v o="$b1" 'BEGIN { exit !(z > 0 && o > 0 && z <= o / 3 + 1e-4) }' ||
  die "zb-h1 bubble $bz is not at most a third of 1f1b's $b1"
[ "$kz" = "$k1" ] || die "zb-h1 peak in flight $kz, 1f1b $k1"
p1=$(sed -n 's/^  rank 0   peak \([0-9]*\) micro.*/\1/p' "$TMP/s1.txt")
pz=$(sed -n 's/^  rank 0   peak \([0-9]*\) micro.*/\1/p' "$TMP/sz.txt")
[ -n "$p1" ] && [ "$p1" = "$pz" ] || die "first rank holds $pz under zb-h1, $p1 under 1f1b"
echo "zb-h1 bubble $bz (1f1b $b1), peak in flight $kz (1f1b $k1)"
run 0 "$TMP/gpt.mdl" $TINY -D batch=8 --pp 4 --schedule zb-h1 --report memory -o "$TMP/mz.txt"
[ "$(grep -c 'stash, chunk [0-9]*: kept by B for W, per micro batch' "$TMP/mz.txt")" = 4 ] ||
  die "zb-h1 memory report: no 'kept by B for W' row per rank: $(grep stash "$TMP/mz.txt")"
has "$TMP/mz.txt" "stash peak (zb-h1, 8 micro batches: 4 in flight)"
run 1 "$TMP/gpt.mdl" $TINY -D batch=2 --pp 4 --schedule zb-h1 --report schedule
has "$TMP/err" "--schedule zb-h1 with pp=4 needs at least 4 micro batches per step, and there are 2"
run 1 "$TMP/gpt.mdl" $TINY --pp 2 --vpp 2 --schedule zb-h1 -o "$TMP/gpt.plan"
has "$TMP/err" "--schedule zb-h1 runs one chunk per rank, and vpp=2"

# --pp-layers with uneven first and last stages
run 0 "$TMP/gpt.mdl" $TINY --pp 4 --pp-layers 1,3,3,1 --report schedule
has "$TMP/out" "E + layer 0"
has "$TMP/out" "layers 1-3"

# refusals
run 1 "$TMP/gpt.mdl" $TINY -D batch=2 --pp 4 -o "$TMP/gpt.plan"
has "$TMP/err" "needs at least 4 micro batches per step, and there are 2"
run 1 "$TMP/gpt.mdl" $TINY -D batch=2 --pp 4 --report schedule
has "$TMP/err" "needs at least 4 micro batches per step, and there are 2"
run 1 "$TMP/gpt.mdl" $TINY -D batch=12 --pp 8 --vpp 1 --schedule interleaved --report schedule
has "$TMP/err" "--vpp V >= 2"
run 1 "$TMP/gpt.mdl" $TINY -D batch=10 --pp 4 --vpp 2 --report schedule
has "$TMP/err" "needs the micro batches per step (10) to be a multiple of pp=4"
run 1 "$TMP/gpt.mdl" $TINY --pp 4 --pp-layout "Et*3|t*2|t*2|L" --report schedule
has "$TMP/err" "has 7 transformer layers 't' but the model's stack has 8"
run 1 "$TMP/gpt.mdl" $TINY --pp 16 --report schedule
has "$TMP/err" "16 stages but the stack 'layers' has only 8 layers"
run 1 "$TMP/gpt.mdl" $TINY --dp 3 --pp 2 --report schedule
has "$TMP/err" "dp=3 does not divide the 16 micro batches"
run 0 "$TMP/gpt.mdl" $TINY --dp 2 --pp 2 --report schedule
has "$TMP/out" "8 micro batches per step"
run 1 "$TMP/gpt.mdl" $TINY --vpp 2 -o "$TMP/gpt.plan"
has "$TMP/err" "add --pp N with N > 1"
run 2 "$TMP/gpt.mdl" $TINY --report schedule --schedule zigzag
has "$TMP/err" "--schedule must be gpipe, 1f1b, interleaved or zb-h1"
exit $fail
