#!/usr/bin/env bash
# overlap.sh - the data-parallel gradient reduction bucketed and issued
# during the last micro batch's backward (docs/sharding.md, "Overlapped
# gradient reduction"), for one layout:
#   1. mcc --report comm lists the buckets of pipeline rank 0's program
#      (at least 2, so bucketing is real, and at least one overlapping
#      backward FLOPs);
#   2. mrun on the layout's ranks posts exactly those buckets every step
#      (its "dp reduction: K buckets" line: K = buckets x steps), so what
#      the report shows is what ran;
#   3. the same run with --no-overlap-grad-reduce posts none and ends with
#      parameters bit-identical to the overlapped run (same summands,
#      same order: only the time of the reduction moved).
# Equality with one rank (1e-10, f64) is check.sh's, run by the same
# ctest entries with --dp-bucket-size.
#
#   overlap.sh MCC MRUN TMPDIR BUCKET_BYTES STEPS GPUS MDL [mcc arguments...]
set -u
MCC=$1 MRUN=$2 TMP=$3 BUCKET=$4 STEPS=$5 GPUS=$6 MDL=$7
shift 7
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
"$MCC" "$MDL" "$@" --precision f64 -o "$TMP/l.plan" || fail "mcc could not compile the layout"
"$MCC" "$MDL" "$@" --precision f64 --report comm --dp-bucket-size "$BUCKET" >"$TMP/report" ||
  fail "mcc --report comm failed"
# the first dp section (pipeline rank 0's program, whose rank 0 prints)
nb=$(awk '/^dp gradient reduction:/ { n++ } n == 1 && $1 ~ /^[0-9]+$/ && ($2 == "micro" || $2 ~ /^bwd[.]/) { c++ }
          END { print c + 0 }' "$TMP/report")
ov=$(awk '/^dp gradient reduction:/ { n++ } n == 1 && $1 ~ /^[0-9]+$/ && ($2 == "micro" || $2 ~ /^bwd[.]/) && $9 + 0 > 0 { c++ }
          END { print c + 0 }' "$TMP/report")
sed -n '/^dp gradient reduction:/,/exposed after overlap/p' "$TMP/report" | head -20
[ "$nb" -ge 2 ] || fail "the report lists $nb buckets; at least 2 expected with buckets of $BUCKET bytes"
[ "$ov" -ge 1 ] || fail "no bucket overlaps backward FLOPs"
"$MRUN" "$TMP/l.plan" --gpus "$GPUS" --steps "$STEPS" --dp-bucket-size "$BUCKET" --save-params "$TMP/a.params" \
  >"$TMP/a.out" 2>&1 || { cat "$TMP/a.out"; fail "mrun (overlapped) failed"; }
"$MRUN" "$TMP/l.plan" --gpus "$GPUS" --steps "$STEPS" --no-overlap-grad-reduce --save-params "$TMP/b.params" \
  >"$TMP/b.out" 2>&1 || { cat "$TMP/b.out"; fail "mrun (--no-overlap-grad-reduce) failed"; }
grep "dp reduction" "$TMP/a.out" "$TMP/b.out"
posted=$(sed -n 's/^mrun: dp reduction: \([0-9]*\) buckets.*/\1/p' "$TMP/a.out")
[ "$posted" = $((nb * STEPS)) ] || fail "mrun posted '${posted}' buckets during the backward; the report's $nb x $STEPS steps expected"
grep -q "buckets" "$TMP/b.out" && fail "--no-overlap-grad-reduce still posted buckets"
grep -q "dp collectives waited for in the update block" "$TMP/b.out" || fail "no dp reduction ran in the update block"
cmp -s "$TMP/a.params" "$TMP/b.params" || fail "the overlapped run's parameters differ from --no-overlap-grad-reduce's"
echo "ok: $nb buckets per step posted during the backward, parameters bit-identical to the reduction after it"
