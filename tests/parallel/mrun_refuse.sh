#!/usr/bin/env bash
# mrun_refuse.sh - a run mrun must refuse before starting any rank: the
# plan compiles, then `mrun PLAN --gpus GPUS` exits 1 with "mrun: ..."
# containing TEXT on stderr, and no line saying that ranks started.
#
#   mrun_refuse.sh MCC MRUN TMPDIR GPUS TEXT [mcc arguments...]
set -u
MCC=$1 MRUN=$2 TMP=$3 GPUS=$4 TEXT=$5
shift 5
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
"$MCC" "$@" -o "$TMP/p.plan" || fail "mcc failed"
timeout -k 5 60 "$MRUN" "$TMP/p.plan" --gpus "$GPUS" --steps 1 >"$TMP/stdout" 2>"$TMP/stderr"
rc=$?
cat "$TMP/stderr"
[ $rc -eq 1 ] || fail "exit status $rc, expected 1"
grep -q "^mrun: " "$TMP/stderr" || fail "no 'mrun: ' line"
grep -qF -- "$TEXT" "$TMP/stderr" || fail "the message lacks '$TEXT'"
grep -q "CPU ranks\|GPU rank" "$TMP/stderr" && fail "ranks were started before the refusal"
echo "ok: refused"
