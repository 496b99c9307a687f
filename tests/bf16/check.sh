#!/usr/bin/env bash
# check.sh - `mcc --check` of a bf16 layout against one bf16 rank: PASS,
# the loss within 1e-2 relative on every step and the parameters within
# 5e-2 (both read back from the printed numbers, so a verdict line that
# lies about them fails too).  docs/precision.md says why the parameters
# get the looser bound (Adam turns a gradient of pure rounding noise into
# lr-sized steps).
#   check.sh MCC MDL [mcc options...]
set -u
MCC=$1 MDL=$2
shift 2
out=$("$MCC" "$MDL" --check "$@" 2>&1)
rc=$?
echo "$out" | grep -v "no GPU driver found"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ $rc -eq 0 ] || fail "mcc --check exited $rc"
echo "$out" | grep -q "^check: PASS" || fail "no PASS verdict"
echo "$out" | grep -q "^check: [a-z]*, .* against 1 rank" || fail "no header"
echo "$out" | grep -q "steps, bf16$" || fail "the check did not run in bf16"
loss=$(echo "$out" | sed -n 's/^  loss: *max relative difference \([^ ]*\) .*/\1/p')
par=$(echo "$out" | sed -n 's/^  params: *max relative difference \([^ ]*\) .*/\1/p')
[ -n "$loss" ] && [ -n "$par" ] || fail "no differences printed"
awk -v l="$loss" -v p="$par" 'BEGIN { exit !(l + 0 <= 1e-2 && p + 0 <= 5e-2) }' ||
  fail "loss difference $loss above 1e-2 or parameter difference $par above 5e-2"
echo "ok: loss $loss (<= 1e-2), params $par (<= 5e-2)"
