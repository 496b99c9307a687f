#!/usr/bin/env bash
# expect_fail.sh - `mcc --check` must be able to fail: run with
# TS_CHECK_PERTURB_SEED=1 (the layout's run gets another seed, so its
# losses and parameters differ), it must print a FAIL verdict and exit 1.
#
#   expect_fail.sh MCC [mcc arguments...]
set -u
MCC=$1
shift
out=$(TS_CHECK_PERTURB_SEED=1 "$MCC" "$@" --check 2>&1)
rc=$?
echo "$out" | grep -v "no GPU driver found"
[ $rc -eq 1 ] || { echo "FAIL: exit status $rc, expected 1" >&2; exit 1; }
echo "$out" | grep -q "^check: FAIL" || { echo "FAIL: no FAIL verdict" >&2; exit 1; }
echo "ok: the check reports the difference"
