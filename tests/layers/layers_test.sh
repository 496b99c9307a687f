#!/usr/bin/env bash
# layers_test.sh SRC - tools/check_layers.sh passes on the source tree, and
# fails, naming the file and line, for each forbidden include added to a
# copy of it (one at a time; the quoted forms the compiler resolves: from
# the source root and relative to the file).
set -uo pipefail
src=$1
check=$src/tools/check_layers.sh
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

out=$(bash "$check" "$src" 2>&1); rc=$?
[ $rc = 0 ] || fail "the source tree breaks the layer rules (rc $rc):"$'\n'"$out"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ts_layers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# case FILE INCLUDE LAYER: FILE (of the copy) gets `#include "INCLUDE"` as a
# new last line; the checker must exit 1 and name FILE:line and LAYER.
case_() {
  local file=$1 inc=$2 layer=$3
  rm -rf "$tmp/t" && mkdir "$tmp/t"
  cp -r "$src"/{ir,frontend,codegen,plan,passes,runtime} "$tmp/t/"
  [ -f "$tmp/t/$file" ] || { fail "no $file in the tree"; return; }
  printf '#include "%s"\n' "$inc" >> "$tmp/t/$file"
  local line; line=$(wc -l < "$tmp/t/$file")
  out=$(bash "$check" "$tmp/t" 2>&1); rc=$?
  if [ $rc != 1 ]; then fail "$file including $inc: rc $rc, want 1"; return; fi
  echo "$out" | grep -q "^$file:$line: $layer may not include" ||
    fail "$file including $inc: no line '$file:$line: $layer may not include ...' in:"$'\n'"$out"
  echo "caught: $(echo "$out" | head -1)"
}
case_ ir/util.c passes/passes.h ir
case_ frontend/diag.c codegen/cg.h frontend
case_ codegen/kir.c runtime/exec/rt.h codegen
case_ plan/plan.c passes/passes.h plan
case_ passes/dce.c runtime/exec/rt.h passes
case_ passes/dce.c frontend/mdl.h passes
case_ runtime/exec/rt.c passes/memreport.h runtime/exec
case_ runtime/exec/train.c ../../frontend/mdl.h runtime/exec
case_ runtime/cpu/ops_route.c ../exec/rt.h runtime/cpu
case_ runtime/comm/comm_mpi.c runtime/device/device.h runtime/comm
case_ runtime/device/dev_cuda.c runtime/cpu/kernels.h runtime/device

[ $fails = 0 ] && echo "PASS: the tree keeps the layer rules; 11 forbidden includes caught"
exit $((fails > 0))
