#!/usr/bin/env bash
# run.sh - the hostile-input corpus: every case of CASES (a file of this
# directory) is a command a careless or hostile user might type, with the
# exit status and the message it must give.
#
#   run.sh CASES MCC MRUN SRCDIR TMPDIR
#
# A case is one line:   EXIT | TEXT | COMMAND   (fields split at ' | ', so TEXT
# may hold a '|' without spaces around it, and COMMAND anything)
#   EXIT     the exit status the command must end with
#   TEXT     a fixed string its stdout or stderr must contain
#   COMMAND  bash, run in TMPDIR/w (a fresh copy of the fixtures for every
#            case), with $MCC, $MRUN, $SRC and $TINY (the tiny gpt's -D
#            flags) set.  Fixtures: m.mdl (samples/gpt.mdl), p.plan and
#            p.txt (its tiny plan, binary and text), ir.txt (its final IR),
#            corpus.txt (text, 4 KiB).
# Lines starting with '#' and empty lines are comments.  Besides its exit
# status and message, every case must finish within 30 s and print no
# sanitizer report, assertion or signal death (an exit above 128 fails
# unless EXIT says so).  Cases run two at a time.
set -u
CASES=$1 MCC=$2 MRUN=$3 SRC=$4 TMP=$5
rm -rf "$TMP" && mkdir -p "$TMP/fix" || exit 1
export MCC MRUN SRC
export TINY="-D layers=1 -D d_model=32 -D heads=2 -D seq_len=16 -D batch=2 -D micro_batch=1 -D vocab=256"
export MODEL="-D d_model=32 -D heads=2 -D vocab=256 -D micro_batch=1"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TS_THREADS=1

fix=$TMP/fix
cp "$SRC/samples/gpt.mdl" "$fix/m.mdl"
printf 'In the beginning God created the heaven and the earth. %.0s' {1..72} > "$fix/corpus.txt"
# shellcheck disable=SC2086
"$MCC" "$fix/m.mdl" $TINY -o "$fix/p.plan" &&
  "$MCC" "$fix/m.mdl" $TINY --emit=plan-text -o "$fix/p.txt" &&
  "$MCC" "$fix/m.mdl" $TINY --emit=ir -o "$fix/ir.txt" || { echo "FAIL: the fixtures do not build" >&2; exit 1; }

# one CASE-NUMBER: runs line N of CASES; prints "ok N" or "FAIL N: why"
one() {
  local n=$1 line want text cmd w rc
  line=$(sed -n "${n}p" "$CASES")
  want=${line%% | *}
  local rest=${line#* | }
  text=${rest%% | *}
  cmd=${rest#* | }
  want=$(printf '%s' "$want" | tr -d ' ')
  text=$(printf '%s' "$text" | sed 's/^ *//; s/ *$//')
  w=$TMP/c$n
  rm -rf "$w" && cp -r "$fix" "$w" || return 1
  (cd "$w" && timeout -k 5 30 bash -c "$cmd" > "$w/.out" 2>&1 < /dev/null)
  rc=$?
  local why=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then why="did not finish in 30 s"
  elif [ "$rc" != "$want" ]; then why="exit $rc, expected $want"
  elif ! grep -qF -- "$text" "$w/.out"; then why="no '$text' in its output"
  elif grep -qE 'Sanitizer|runtime error:|Assertion|Segmentation fault|internal error' "$w/.out"; then why="a sanitizer report, assertion or internal error"
  fi
  if [ -n "$why" ]; then
    printf 'FAIL line %s: %s\n    command: %s\n' "$n" "$why" "$cmd"
    sed 's/^/    | /' "$w/.out" | head -12
  else
    echo "ok $n"
    rm -rf "$w"
  fi
}
export -f one
export CASES TMP fix

lines=$(grep -nvE '^[[:space:]]*(#|$)' "$CASES" | cut -d: -f1)
[ -n "$lines" ] || { echo "FAIL: no cases in $CASES" >&2; exit 1; }
echo "$lines" | xargs -P 2 -I{} bash -c 'one {}' > "$TMP/results.txt"
total=$(echo "$lines" | wc -l)
failed=$(grep -c '^FAIL' "$TMP/results.txt")
grep -v '^ok ' "$TMP/results.txt" >&2
for d in /dev/null /dev/full /dev/zero; do
  [ -c "$d" ] || { echo "FAIL: $d is no longer a character device" >&2; failed=$((failed + 1)); }
done
echo "hostile: $((total - failed)) of $total cases as expected ($(basename "$CASES"))"
[ "$failed" = 0 ]
