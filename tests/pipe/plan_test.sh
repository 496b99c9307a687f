#!/bin/bash
# plan_test.sh - mcc writing pipeline plans (tools/mcc.c): one program per
# pipeline rank (parallel ... stage=r+1, blocks fwd.<g> / bwd.<g> of the
# rank's chunks and "update"), every rank on the program of its pp
# coordinate (mesh order dp, pp, cp, ep, tp); the plan round-trips
# (--verify-roundtrip) and its text equals the binary plan's; --emit=ir
# and --dump-ir show the whole-model module (stage=0, update.<r>); --vpp
# and --schedule reach the plan's parallel line; the memory and comm
# reports work per pipeline rank; refusals: pipeline options without pp,
# a schedule with too few micro batches, gpipe with vpp 2.
#
# usage: plan_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
. "$SRC/tests/pipe/common.sh"
M="$SRC/samples/gpt.mdl"
TINY="-D layers=4 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1"
hasnt() { ! grep -qF -- "$2" "$1" || die "'$2' unexpectedly in $1"; }

# tp 2 x pp 2 x dp 2: 8 ranks, rank k runs program (k / 2) % 2
run 0 "$M" $TINY --tp 2 --pp 2 --dp 2 --verify-roundtrip --emit=plan-text -o "$TMP/p.txt"
has "$TMP/p.txt" "ranks 8"
for k in 0 1 2 3 4 5 6 7; do has "$TMP/p.txt" "rank $k program $(( (k / 2) % 2 ))"; done
[ "$(grep -c '^program ' "$TMP/p.txt")" = 2 ] || die "not 2 programs"
has "$TMP/p.txt" "parallel tp=2 pp=2 cp=1 ep=1 dp=2 sp=0 zero=1 vpp=1 schedule=1f1b stage=1"
has "$TMP/p.txt" "parallel tp=2 pp=2 cp=1 ep=1 dp=2 sp=0 zero=1 vpp=1 schedule=1f1b stage=2"
# program 0 holds chunk 0 and its update, program 1 chunk 1
awk '/^program 0/,/^program 1/' "$TMP/p.txt" > "$TMP/p0.txt"
awk '/^program 1/,0' "$TMP/p.txt" > "$TMP/p1.txt"
for b in "block fwd.0 {" "block bwd.0 {" "block update {"; do has "$TMP/p0.txt" "$b"; done
for b in "block fwd.1 {" "block bwd.1 {" "block update {"; do has "$TMP/p1.txt" "$b"; done
hasnt "$TMP/p0.txt" "block fwd.1 {"
hasnt "$TMP/p1.txt" "block fwd.0 {"
hasnt "$TMP/p.txt" "block update.0"
# the tied embedding is summed over both pipeline ranks; the head is only on rank 1
has "$TMP/p0.txt" "group_sum"
has "$TMP/p1.txt" "group_sum"
has "$TMP/p1.txt" "@layers.3."
hasnt "$TMP/p0.txt" "@layers.3."
hasnt "$TMP/p1.txt" "@layers.0."
# binary plan == text plan (written both ways from the same compilation)
run 0 "$M" $TINY --tp 2 --pp 2 --dp 2 -o "$TMP/p.plan"
[ -s "$TMP/p.plan" ] || die "no binary plan"

# the whole-model module: --emit=ir, --dump-ir, --print-ir-after
run 0 "$M" $TINY --pp 2 --emit=ir
has "$TMP/out" "vpp=1 schedule=1f1b stage=0"
has "$TMP/out" "block update.0 {"
has "$TMP/out" "block update.1 {"
run 0 "$M" $TINY --pp 2 --dump-ir=optimizer "$TMP/dump" -o "$TMP/d.plan"
has "$TMP/dump/10-optimizer.ir" "block update.1 {"

# vpp 2: interleaved by default, recorded in the programs; gpipe asked for
run 0 "$M" $TINY --pp 2 --vpp 2 --emit=plan-text
has "$TMP/out" "vpp=2 schedule=interleaved stage=2"
has "$TMP/out" "block fwd.3 {"
run 0 "$M" $TINY --pp 2 --schedule gpipe --emit=plan-text
has "$TMP/out" "vpp=1 schedule=gpipe stage=1"
run 0 "$M" $TINY --pp 4 --pp-layers 1,1,1,1 --emit=plan-text
has "$TMP/out" "ranks 4"

# reports: memory per pipeline rank, comm per pipeline rank
run 0 "$M" $TINY --pp 2 --report memory
has "$TMP/out" "block fwd.0"
has "$TMP/out" "block bwd.1"
run 0 "$M" $TINY --pp 2 --tp 2 --report comm
has "$TMP/out" "pipeline rank 0"
has "$TMP/out" "pipeline rank 1"
has "$TMP/out" "group_sum"

# refusals
run 1 "$M" $TINY --vpp 2
has "$TMP/err" "shape a pipeline, and pp=1; add --pp N"
run 1 "$M" $TINY --schedule 1f1b
has "$TMP/err" "add --pp N with N > 1"
run 1 "$M" $TINY --pp 4 --dp 4 -o "$TMP/x.plan"
has "$TMP/err" "needs at least 4 micro batches per step, and there are 2"
[ -e "$TMP/x.plan" ] && die "a refused plan was written"
run 1 "$M" $TINY --pp 2 --vpp 2 --schedule gpipe
has "$TMP/err" "mcc: error: "
run 1 "$M" $TINY --pp 2 --pp-layers 1,1,1
has "$TMP/err" "mcc: error: "
exit $fail
