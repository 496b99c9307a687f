#!/usr/bin/env bash
# test.sh - builds Tessera twice (release in build/, ASan+UBSan in
# build-asan/) through tools/setup.sh, then runs the whole ctest suite in
# each.  Prints ctest's summary per build and exits non-zero if either failed.
#
# The ASan run skips tests labelled `slow` (the 200-step end-to-end training
# runs, tests/e2e; the 64-rank run; NVRTC's resource reports; the fake-GPU
# layouts but one per host path, tests/cuda_dev/CMakeLists.txt) and `mpi_matrix` (the many-layout
# equivalence matrices of tests/parallel, tests/shard, tests/rank, tests/fuse:
# the sanitizer run keeps one layout of each family -- tp x dp x sp, cp, ep,
# the LLVM backend -- and every fault and refusal test): under the
# sanitizers they take several times longer and exercise no code that the
# kept ones do not.  Set TESSERA_ASAN_SLOW=1 to run them there too.  It
# also skips the tests labelled `fuzz` (the libFuzzer targets): they are
# clang builds with ASan and UBSan of their own, whichever build runs them.
# The sanitizer build is Debug at -O1 (CMakeLists.txt: ASan's advice).  Its
# largest MPI tests run without the leak check (its full-stack unwinding
# per malloc, for Open MPI's unloaded plugins, was most of their time:
# ts_no_leak_check in tests/CMakeLists.txt; each family keeps one with it).
set -uo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh --asan || { echo "test: setup failed" >&2; exit 1; }

bdir=${TESSERA_BUILD_DIR:-build}
adir=${TESSERA_ASAN_DIR:-build-asan}
jobs=$(nproc 2>/dev/null || echo 2)
status=0

# suite NAME DIR [ctest options...]: runs ctest, prints its summary with timing.
suite() {
  local name=$1 dir=$2; shift 2
  local t0=$SECONDS
  echo "== ctest: $name ($dir) =="
  if (cd "$dir" && ctest --output-on-failure -j"$jobs" "$@"); then
    echo "== $name: passed in $((SECONDS - t0)) s =="
  else
    echo "== $name: FAILED (after $((SECONDS - t0)) s) =="
    status=1
  fi
}

suite release "$bdir"
# halt_on_error so a sanitizer report fails the test; no leak suppressions.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
if [ "${TESSERA_ASAN_SLOW:-0}" = 1 ]; then
  suite asan "$adir"
else
  suite asan "$adir" -LE "slow|mpi_matrix|fuzz"
fi

exit $status
