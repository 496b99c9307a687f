# common.sh - what the mcc test scripts of tests/pipe share (sourced after
# MCC, SRC and TMP are set): a fresh $TMP, `fail`, and
#   die MSG...                  records a failure (the script exits $fail)
#   run EXPECTED_RC ARGS...     mcc ARGS: stdout in $TMP/out, stderr in $TMP/err
#   has FILE TEXT               FILE contains TEXT
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }
run() {
  local want=$1; shift
  "$MCC" "$@" > "$TMP/out" 2> "$TMP/err"
  local rc=$?
  [ "$rc" = "$want" ] || die "mcc $*: exit $rc, expected $want; stderr: $(head -c 600 "$TMP/err")"
  return 0
}
has() { grep -qF -- "$2" "$1" || die "'$2' not in $1: $(head -c 3000 "$1")"; }
