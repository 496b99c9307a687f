#!/usr/bin/env bash
# refuse.sh - a layout mcc must refuse: exit status 1, the message on
# stderr as "mcc: error: ..." containing TEXT, and no plan written.
#
#   refuse.sh MCC TMPDIR TEXT [mcc arguments...]
set -u
MCC=$1 TMP=$2 TEXT=$3
shift 3
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
"$MCC" "$@" -o "$TMP/out.plan" >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
cat "$TMP/stderr"
fail() { echo "FAIL: $*" >&2; exit 1; }
[ $rc -eq 1 ] || fail "exit status $rc, expected 1"
grep -q "^mcc: error: " "$TMP/stderr" || fail "no 'mcc: error: ' line"
grep -qF -- "$TEXT" "$TMP/stderr" || fail "the message lacks '$TEXT'"
[ -e "$TMP/out.plan" ] && fail "a plan was written"
echo "ok: refused"
