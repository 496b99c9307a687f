#!/usr/bin/env bash
# check.sh - one cell of issue 3's acceptance matrix: `mcc --check` on a
# sample at tiny size with a layout, which trains the sharded and the
# unsharded plan with mrun and compares per-step losses and final
# parameters.  Passes when mcc says PASS, exits 0, and the two differences
# it prints are both <= TOL (read back here, so a verdict line that lies
# about its numbers fails too).
#
#   check.sh MCC MDL TOL [mcc options...]
# TOL is one bound for both, or LOSS,PARAMS (tests/bf16: 1e-2,5e-2).
set -u
MCC=$1 MDL=$2 TOL=$3
shift 3
LTOL=${TOL%%,*} PTOL=${TOL#*,}
out=$("$MCC" "$MDL" --check "$@" 2>&1)
rc=$?
echo "$out" | grep -v "no GPU driver found"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ $rc -eq 0 ] || fail "mcc --check exited $rc"
echo "$out" | grep -q "^check: PASS" || fail "no PASS verdict"
loss=$(echo "$out" | sed -n 's/^  loss: *max relative difference \([^ ]*\) .*/\1/p')
par=$(echo "$out" | sed -n 's/^  params: *max relative difference \([^ ]*\) .*/\1/p')
[ -n "$loss" ] && [ -n "$par" ] || fail "no differences printed"
awk -v l="$loss" -v p="$par" -v lt="$LTOL" -v pt="$PTOL" 'BEGIN { exit !(l + 0 <= lt + 0 && p + 0 <= pt + 0) }' ||
  fail "loss difference $loss above $LTOL or parameter difference $par above $PTOL"
steps=$(echo "$out" | sed -n 's/.* over \([0-9]*\) steps.*/\1/p')
want=$(printf '%s\n' "$@" | awk 'p { print; exit } $0 == "--steps" { p = 1 }')
[ -z "$want" ] || [ "$steps" = "$want" ] || fail "compared $steps steps, asked for $want"
echo "ok: loss $loss, params $par (tolerance $TOL)"
