#!/bin/bash
# recompute_test.sh - see CMakeLists.txt.  usage: recompute_test.sh MCC MRUN PARAMS_DIFF SRCDIR TMPDIR
set -u
MCC=$1 MRUN=$2 PDIFF=$3 SRC=$4 TMP=$5
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }
data="$SRC/samples/data/kjv.txt"
D="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 --precision f64"

# pass remat's summary in --report memory: "held ... per micro batch N bytes", "was M bytes"
held_now() { sed -n 's/^# recompute [^:]*: holds at the loss per micro batch \([0-9]*\) bytes.*/\1/p' "$1"; }
held_was() { sed -n 's/^# recompute .* was \([0-9]*\) bytes .*/\1/p' "$1"; }
row() { awk -v l="$1" 'index($0, "  " l) == 1 { print $(NF-1); exit }' "$2"; }

train() {   # name plan gpus backend
  "$MRUN" "$2" --gpus "$3" --backend "$4" --steps 2 --quiet --data "$data" --metrics "$1.jsonl" --save-params "$1.bin" \
    > "$1.out" 2> "$1.err" || { die "mrun $1: $(tail -3 "$1.err")"; return 1; }
}
same() {   # a b: losses and parameters bit-identical
  cmp -s "$1.bin" "$2.bin" && cmp -s <(sed 's/"tokens_per_s.*//' "$1.jsonl") <(sed 's/"tokens_per_s.*//' "$2.jsonl")
}

for layout in "1" "1 -D dropout=0.1" "2 --tp 2" "2 --tp 2 --sp" "2 --dp 2" "2 --pp 2" "2 --cp 2"; do
  set -- $layout
  g=$1; shift
  name="g$g$(printf %s "$*" | tr -d " -=.")"
  "$MCC" "$SRC/samples/gpt.mdl" $D "$@" --recompute full --report memory > $name.full.rep 2> err.txt ||
    { die "$name: mcc --recompute full --report memory: $(cat err.txt)"; continue; }
  now=$(held_now $name.full.rep) was=$(held_was $name.full.rep)
  [ -n "$now" ] && [ -n "$was" ] && [ "$now" -lt "$was" ] || { die "$name: full recompute holds $now bytes, not below $was"; continue; }
  budget=$(((now + was) / 2))
  echo "$name: held for the backward: $was bytes (cheap values only), $now (full); auto budget $budget"
  for mode in none full selective auto; do
    opts="--recompute $mode"
    [ $mode = auto ] && opts="--memory-budget $budget"
    "$MCC" "$SRC/samples/gpt.mdl" $D "$@" $opts -o $name.$mode.plan 2> err.txt || { die "$name $mode: mcc: $(cat err.txt)"; continue 2; }
    train $name.$mode $name.$mode.plan $g ref || continue 2
  done
  "$MCC" "$SRC/samples/gpt.mdl" $D "$@" --memory-budget $budget --report memory > $name.auto.rep 2> err.txt || die "$name: auto report: $(cat err.txt)"
  got=$(held_now $name.auto.rep)
  [ -n "$got" ] && [ "$got" -le "$budget" ] || die "$name: auto holds $got bytes over the budget $budget"
  [ "$got" -lt "$was" ] || die "$name: auto recomputed nothing ($got bytes, was $was)"
  for mode in full selective auto; do
    if same $name.none $name.$mode; then echo "$name: --recompute $mode: losses and parameters bit-identical to none"
    else die "$name: --recompute $mode changes the numbers"; "$PDIFF" $name.none.bin $name.$mode.bin 0; fi
  done
  cmp -s $name.none.plan $name.full.plan && die "$name: the full-recompute plan is the plain one"
done

# the LLVM backend runs a full-recompute plan as the reference runs the plain one
train llvm.full g1.full.plan 1 llvm && { "$PDIFF" g1.none.bin llvm.full.bin 1e-12 || die "LLVM backend on the full plan"; }

# auto's budget: the report's row, and what mrun measures at the loss (f32, the default backend)
DF="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2"
for layout in "1" "2 --tp 2 --sp"; do
  set -- $layout
  g=$1; shift
  name="m$g$(printf %s "$*" | tr -d " -")"
  "$MCC" "$SRC/samples/gpt.mdl" $DF "$@" --recompute full --report memory > $name.full.rep 2> err.txt || { die "$name: $(cat err.txt)"; continue; }
  budget=$((($(held_now $name.full.rep) + $(held_was $name.full.rep)) / 2))
  "$MCC" "$SRC/samples/gpt.mdl" $DF "$@" --memory-budget $budget --report memory > $name.rep 2> err.txt &&
    "$MCC" "$SRC/samples/gpt.mdl" $DF "$@" --memory-budget $budget -o $name.plan 2> err.txt || { die "$name: $(cat err.txt)"; continue; }
  rep=$(row "block micro: held for the backward" $name.rep)
  [ -n "$rep" ] && [ "$rep" -le "$budget" ] || die "$name: the report holds $rep bytes, over the budget $budget"
  TS_RT_MEMORY=1 "$MRUN" $name.plan --gpus $g --steps 1 --quiet --mock-data > /dev/null 2> $name.err || { die "$name: mrun: $(tail -3 $name.err)"; continue; }
  meas=$(awk '/^rt memory: .* block micro: / { for (i = 1; i < NF; i++) if ($i == "held") print $(i + 1) }' $name.err | sort -u)
  [ "$meas" = "$rep" ] || die "$name: mrun measured '$meas' bytes held at the loss, the report says $rep"
  echo "$name: --memory-budget $budget: the report holds $rep bytes, mrun measured $meas"
done

# a budget that cannot be met: refused, with the least figure
"$MCC" "$SRC/samples/gpt.mdl" $D --memory-budget 1000 -o small.plan > /dev/null 2> small.txt; rc=$?
[ $rc = 1 ] && grep -q "memory-budget 1000 bytes .* cannot be met: the least .* is [0-9]* bytes" small.txt ||
  die "a budget too small: exit $rc, $(cat small.txt)"
[ -e small.plan ] && die "a budget too small wrote a plan"
least=$(sed -n 's/.*cannot be met: the least .* is \([0-9]*\) bytes.*/\1/p' small.txt)
"$MCC" "$SRC/samples/gpt.mdl" $D --memory-budget "$least" -o least.plan 2> err.txt || die "the least figure $least is refused: $(cat err.txt)"
"$MCC" "$SRC/samples/gpt.mdl" $D --memory-budget $((least - 1)) -o least.plan 2> /dev/null && die "the least figure minus one byte is accepted"
echo "a budget of 1000 bytes is refused: $(head -1 small.txt)"
# usage and model errors
expect() {   # rc pattern args...
  local want=$1 pat=$2; shift 2
  "$MCC" "$@" -o x.plan > /dev/null 2> err.txt; local rc=$?
  [ $rc = "$want" ] && grep -q -- "$pat" err.txt || die "mcc $*: exit $rc (want $want), '$(cat err.txt)' (want /$pat/)"
}
expect 2 "must be none, full, selective or auto" "$SRC/samples/gpt.mdl" --recompute most
expect 2 "needs --memory-budget" "$SRC/samples/gpt.mdl" --recompute auto
expect 2 "goes with --recompute auto" "$SRC/samples/gpt.mdl" --recompute full --memory-budget 1M
expect 2 "positive byte count" "$SRC/samples/gpt.mdl" --memory-budget lots
expect 2 "give one of them" "$SRC/samples/gpt.mdl" --memory-budget 1M --activation-budget 1M
expect 2 "give one of them" "$SRC/samples/gpt.mdl" --recompute full --no-remat
expect 1 "has none" "$SRC/tests/frontend/ok/attention_window.mdl" --recompute full
[ $fail = 0 ] && echo "recompute: all checks passed"
exit $fail
