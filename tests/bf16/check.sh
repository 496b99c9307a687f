#!/usr/bin/env bash
# check.sh - `mcc --check` of a bf16 layout against one bf16 rank: the
# parallel matrix's check (tests/parallel/check.sh: PASS, the differences
# read back from the printed numbers) with the loss within 1e-2 relative
# on every step and the parameters within 5e-2, and the run in the 16-bit
# type the options ask for (--precision bf16, or fp16: tests/fp16).
# docs/precision.md says why the parameters get the looser bound (Adam
# turns a gradient of pure rounding noise into lr-sized steps).  A layout
# that keeps the rounding points (pipelines: docs/precision.md, "Pipelines")
# is held to a stricter LOSS,PARAMS bound in TS_CHECK_TOL.
#   [TS_CHECK_TOL=LOSS,PARAMS] check.sh MCC MDL [mcc options...]
set -u
MCC=$1 MDL=$2
shift 2
out=$(bash "$(dirname "$0")/../parallel/check.sh" "$MCC" "$MDL" "${TS_CHECK_TOL:-1e-2,5e-2}" "$@" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || exit 1
echo "$out" | grep -q "^check: [a-z]*, .* against 1 rank" || { echo "FAIL: no header" >&2; exit 1; }
want=bf16
for a in "$@"; do [ "${prev:-}" = --precision ] && want=$a; prev=$a; done
[ "$want" = fp16 ] && want=f16
echo "$out" | grep -q "steps, $want$" || { echo "FAIL: the check did not run in $want" >&2; exit 1; }
