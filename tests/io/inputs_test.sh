#!/bin/bash
# inputs_test.sh - what mcc reads is bounded: an endless device or an
# oversized MDL source (or import) stops with a size error naming the
# limit, a directory says so, and a bad --max-source-bytes is a usage
# error (issue 17, deliverable 2).
#
# usage: inputs_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
fail=0 n=0
die() { echo "FAIL: $*" >&2; fail=1; }
expect() {   # rc pattern cmd...
  local rc=$1 pat=$2; shift 2
  timeout 20 "$@" > out.txt 2> err.txt
  local got=$?
  if [ $got != "$rc" ]; then die "$*: exit $got, expected $rc ($(head -2 err.txt))"
  elif [ -n "$pat" ] && ! grep -q -- "$pat" err.txt; then die "$*: no '$pat' in: $(head -3 err.txt)"
  else n=$((n + 1)); fi
}
expect 1 "'/dev/zero' is larger than 16777216 bytes, the limit on an MDL source (--max-source-bytes N raises it)" "$MCC" /dev/zero
expect 1 "'/dev/urandom' is larger than 16777216 bytes" "$MCC" /dev/urandom
size=$(wc -c < "$SRC/samples/gpt.mdl")
expect 1 "is larger than $((size - 1)) bytes" "$MCC" "$SRC/samples/gpt.mdl" --max-source-bytes $((size - 1))
expect 1 "gpt.mdl:4:8: error: module 'nn' at '.*nn.mdl' is larger than $((size + 1)) bytes" \
  "$MCC" "$SRC/samples/gpt.mdl" --max-source-bytes $((size + 1))
mkdir adir
expect 1 "cannot read 'adir': Is a directory" "$MCC" adir
expect 2 "--max-source-bytes expects a positive byte count, got '0'" "$MCC" "$SRC/samples/gpt.mdl" --max-source-bytes 0
expect 2 "--max-source-bytes expects a positive byte count, got '12x'" "$MCC" "$SRC/samples/gpt.mdl" --max-source-bytes 12x
expect 0 "" "$MCC" "$SRC/samples/gpt.mdl" --max-source-bytes 1000000 -D layers=1 -D d_model=32 -D heads=2 -D seq_len=16 \
  -D vocab=64 -D batch=2 -D micro_batch=2 -o ok.plan
[ $fail = 0 ] && echo "inputs: $n checks passed"
exit $fail
