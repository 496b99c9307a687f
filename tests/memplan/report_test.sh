#!/bin/bash
# report_test.sh - `mcc FILE --report memory` as a user runs it: the table's
# state rows equal 4 bytes (f32) times the parameter count that --stats
# reports, per block lower bound <= packed peak <= no-reuse sum, the totals
# add up for both backends, the slab holds the states (64-byte aligned), the
# note that mrun runs in the planned arena is there, no plan file is written, -o takes the report, and a bad kind is a usage error.
#
# usage: report_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }

# bytes column of the row whose label starts with $1 (label may contain spaces)
row() { awk -v l="$1" 'index($0, "  " l) == 1 { print $(NF-1); exit }' "$2"; }

check_model() {   # name, then -D options
  local name=$1; shift
  cp "$SRC/samples/$name.mdl" "$TMP/$name.mdl"
  local out="$TMP/$name.report"
  "$MCC" "$TMP/$name.mdl" "$@" --report memory > "$out" 2> "$TMP/$name.err" || { die "$name: mcc failed: $(cat "$TMP/$name.err")"; return; }
  [ -e "$TMP/$name.plan" ] && die "$name: --report memory wrote a plan"
  grep -q "ONE activation arena" "$out" || die "$name: no note that mrun runs in the planned arena"
  local n
  n=$("$MCC" "$TMP/$name.mdl" "$@" --stats --emit=ir -o /dev/null 2>&1 | sed -n 's/^stats: \([0-9]*\) parameters.*/\1/p')
  [ -n "$n" ] || { die "$name: no parameter count from --stats"; return; }
  local p g o s
  p=$(row "parameters" "$out"); g=$(row "gradients" "$out"); o=$(row "optimizer state" "$out"); s=$(row "states total" "$out")
  [ "$p" = $((4 * n)) ] || die "$name: parameters $p bytes, expected 4 * $n"
  [ "$g" = $((4 * n)) ] || die "$name: gradients $g bytes, expected 4 * $n"
  [ "$o" = $((8 * n)) ] || die "$name: optimizer state $o bytes, expected 8 * $n"
  [ "$s" = $((16 * n)) ] || die "$name: states total $s bytes, expected 16 * $n"
  local maxpeak=0 nblocks=0
  for b in micro update; do
    local pk lb nr
    pk=$(row "block $b: arena peak" "$out"); lb=$(row "block $b: lower bound" "$out"); nr=$(row "block $b: no reuse" "$out")
    [ -n "$pk" ] && [ -n "$lb" ] && [ -n "$nr" ] || { die "$name: rows for block $b missing"; continue; }
    nblocks=$((nblocks + 1))
    [ "$lb" -gt 0 ] && [ "$lb" -le "$pk" ] && [ "$pk" -le "$nr" ] || die "$name $b: bound $lb, peak $pk, no reuse $nr out of order"
    [ "$pk" -gt "$maxpeak" ] && maxpeak=$pk
  done
  [ "$(row "activation arena" "$out")" = "$maxpeak" ] || die "$name: arena is not the largest block peak ($maxpeak)"
  [ "$(row "total" "$out")" = $((16 * n + maxpeak)) ] || die "$name: total is not states + arena"
  local refmax=0
  for b in micro update; do
    local pk lb
    pk=$(row "block $b, --backend ref: arena peak" "$out"); lb=$(row "block $b, --backend ref: lower bound" "$out")
    [ -n "$pk" ] && [ -n "$lb" ] && [ "$lb" -le "$pk" ] || die "$name $b: reference rows missing or out of order ($lb, $pk)"
    [ -n "$pk" ] && [ "$pk" -gt "$refmax" ] && refmax=$pk
  done
  [ "$(row "activation arena, --backend ref" "$out")" = "$refmax" ] || die "$name: ref arena is not the largest ref block peak"
  [ "$(row "total, --backend ref" "$out")" = $((16 * n + refmax)) ] || die "$name: ref total is not states + ref arena"
  local slab
  slab=$(row "state slab as allocated" "$out")
  [ -n "$slab" ] && [ "$slab" -ge $((16 * n)) ] && [ "$slab" -lt $((16 * n + 64 * 4 * 400)) ] && [ $((slab % 64)) = 0 ] || \
    die "$name: slab $slab bytes for $((16 * n)) bytes of states"
  # MiB column: bytes / 2^20 to two decimals
  local mib
  mib=$(awk 'index($0, "  parameters") == 1 { print $NF }' "$out")
  [ "$mib" = "$(awk -v b="$p" 'BEGIN { printf "%.2f", b / 1048576 }')" ] || die "$name: MiB column $mib for $p bytes"
}

check_model gpt                               # full size: 124,475,904 parameters
check_model llama -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64
[ "$(row parameters "$TMP/gpt.report")" = 497903616 ] || die "gpt: not 4 * 124475904 parameter bytes"

# -o takes the report
"$MCC" "$TMP/gpt.mdl" -D layers=1 --report memory -o "$TMP/r.txt" > "$TMP/stdout.txt" || die "-o: mcc failed"
grep -q "^memory report: gpt" "$TMP/r.txt" || die "-o: no report in the file"
[ -s "$TMP/stdout.txt" ] && die "-o: report also on stdout"

# usage errors
"$MCC" "$TMP/gpt.mdl" --report speed > /dev/null 2> "$TMP/usage.err"
[ $? -eq 2 ] || die "--report speed: exit status not 2"
grep -q "report must be memory" "$TMP/usage.err" || die "--report speed: message: $(cat "$TMP/usage.err")"
"$MCC" "$TMP/gpt.mdl" --report > /dev/null 2>&1
[ $? -eq 2 ] || die "--report without a kind: exit status not 2"

[ $fail -eq 0 ] && echo "memplan report: ok"
exit $fail
