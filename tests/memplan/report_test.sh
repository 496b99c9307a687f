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
  n=$("$MCC" "$TMP/$name.mdl" "$@" --stats --emit=ir -o "$TMP/$name.ir" 2>&1 | sed -n 's/^stats: \([0-9]*\) parameters.*/\1/p')
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

# Pipeline stashes (issue 5's acceptance line: the first stage under 1F1B
# holds at most pp micro batches of stash).  Per pipeline rank r, the
# report's stash of one micro batch of chunk r must equal the bytes of the
# operands of the stash nodes of block fwd.<r>, counted here from the IR
# text; under 1F1B rank r holds pp - r micro batches at its peak (so the
# first stage exactly pp) and the peak row is that many stashes; under
# GPipe every rank holds all of them.
# the bytes column of row $1 within the section of pipeline rank $3
srow() { awk -v l="$1" -v k="$3" '/^ranks? [0-9]/ { sec++ } /^unsharded/ { sec = -1 } sec == k + 1 && index($0, "  " l) == 1 { print $(NF-1); exit }' "$2"; }
# bytes of the stash operands of block $2 of the IR text $1
stash_bytes() {
  awk -v blk="block $2 {" '
    $0 == blk { inb = 1; next }
    inb && /^}/ { inb = 0 }
    inb && /^  %[0-9]+ = / {
      t = $0; sub(/^[^:]*= [^:]*: /, "", t)          # "f32[batch:1, seq:16, dim:32] ..."
      es = t ~ /^f64/ ? 8 : 4
      sub(/^[a-z0-9]*\[/, "", t); sub(/\].*/, "", t)
      n = split(t, d, ", "); e = 1
      for (i = 1; i <= n; i++) { x = d[i]; sub(/.*:/, "", x); e *= x }
      bytes[$1] = (t == "" ? 1 : e) * es
    }
    inb && /^  stash / { sum += bytes[$2] }
    END { print sum + 0 }' "$1"
}
pipe_check() {   # pp schedule
  local pp=$1 sch=$2 nmicro=8
  local D="-D layers=4 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1"
  local rep="$TMP/pp$pp-$sch.report" ir="$TMP/pp$pp-$sch.ir"
  "$MCC" "$TMP/gpt.mdl" $D --pp "$pp" --schedule "$sch" --report memory > "$rep" 2> "$TMP/pp.err" ||
    { die "pp $pp $sch: mcc --report memory: $(cat "$TMP/pp.err")"; return; }
  "$MCC" "$TMP/gpt.mdl" $D --pp "$pp" --schedule "$sch" --emit=ir -o "$ir" 2> "$TMP/pp.err" ||
    { die "pp $pp $sch: mcc --emit=ir: $(cat "$TMP/pp.err")"; return; }
  local r
  for ((r = 0; r < pp; r++)); do
    local want got peak fl expect
    want=$(stash_bytes "$ir" "fwd.$r")
    got=$(srow "stash, chunk $r: per micro batch" "$rep" $r)
    peak=$(srow "stash peak" "$rep" $r)
    fl=$(awk -v k=$r '/^ranks? [0-9]/ { sec++ } sec == k + 1 && /^  stash peak/ { sub(/ in flight.*/, ""); print $NF; exit }' "$rep")
    [ -n "$want" ] && [ "$want" -gt 0 ] || { die "pp $pp $sch rank $r: no stash nodes in fwd.$r"; continue; }
    [ "$got" = "$want" ] || die "pp $pp $sch rank $r: report stashes $got bytes per micro batch, the IR's stash nodes $want"
    if [ "$sch" = 1f1b ]; then expect=$((pp - r)); else expect=$nmicro; fi
    [ "$fl" = "$expect" ] || die "pp $pp $sch rank $r: $fl micro batches in flight, expected $expect"
    [ "$peak" = $((expect * want)) ] || die "pp $pp $sch rank $r: stash peak $peak, expected $expect x $want"
    if [ "$sch" = 1f1b ] && [ $r = 0 ]; then
      [ "$peak" -le $((pp * want)) ] || die "pp $pp: the first stage holds more than pp micro batches of stash"
    fi
  done
}
pipe_check 2 1f1b
pipe_check 4 1f1b
pipe_check 2 gpipe

# zb-h1 (pass wsplit): per rank the forward's stash (fwd.<r>'s stash nodes)
# and what B keeps for W (bwd.<r>'s stash nodes), each counted from the IR;
# pp micro batches in flight on every rank (F until W); the peak at least
# the forward's stash of pp micro batches (1F1B's first stage) and at most
# pp micro batches of both
zb_check() {   # pp
  local pp=$1
  local D="-D layers=4 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1"
  local rep="$TMP/pp$pp-zb.report" ir="$TMP/pp$pp-zb.ir" r
  "$MCC" "$TMP/gpt.mdl" $D --pp "$pp" --schedule zb-h1 --report memory > "$rep" 2> "$TMP/pp.err" &&
    "$MCC" "$TMP/gpt.mdl" $D --pp "$pp" --schedule zb-h1 --emit=ir -o "$ir" 2> "$TMP/pp.err" ||
    { die "pp $pp zb-h1: $(cat "$TMP/pp.err")"; return; }
  for ((r = 0; r < pp; r++)); do
    local f w gf gw peak fl
    f=$(stash_bytes "$ir" "fwd.$r"); w=$(stash_bytes "$ir" "bwd.$r")
    gf=$(srow "stash, chunk $r: per micro batch" "$rep" $r)
    gw=$(srow "stash, chunk $r: kept by B for W, per micro batch" "$rep" $r)
    peak=$(srow "stash peak" "$rep" $r)
    fl=$(awk -v k=$r '/^ranks? [0-9]/ { sec++ } sec == k + 1 && /^  stash peak/ { sub(/ in flight.*/, ""); print $NF; exit }' "$rep")
    [ -n "$f" ] && [ "$f" -gt 0 ] && [ -n "$w" ] && [ "$w" -gt 0 ] || { die "pp $pp zb-h1 rank $r: no stash nodes"; continue; }
    [ "$gf" = "$f" ] || die "pp $pp zb-h1 rank $r: forward stash $gf in the report, $f in the IR"
    [ "$gw" = "$w" ] || die "pp $pp zb-h1 rank $r: kept for W $gw in the report, $w in the IR"
    [ "$fl" = "$pp" ] || die "pp $pp zb-h1 rank $r: $fl micro batches in flight, expected $pp"
    [ "$peak" -ge $((pp * f)) ] && [ "$peak" -le $((pp * (f + w))) ] ||
      die "pp $pp zb-h1 rank $r: stash peak $peak outside [$((pp * f)), $((pp * (f + w)))]"
  done
}
zb_check 2
zb_check 4

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
