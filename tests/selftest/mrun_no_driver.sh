#!/bin/bash
# mrun_no_driver.sh MRUN - on a machine without a GPU driver (this one),
# `mrun --selftest` prints one line saying there is nothing to test and
# exits 1; with a plan it is a usage error (2).  Skipped (exit 0, saying
# so) where a driver is present.
set -uo pipefail
mrun=$1
if [ -e /proc/driver/nvidia/version ] || ldconfig -p 2> /dev/null | grep -q 'libcuda\.so\.1 '; then
  echo "a GPU driver is installed here: the no-driver case cannot be tested"
  exit 0
fi
fails=0
out=$("$mrun" --selftest 2>&1)
rc=$?
want="mrun --selftest: no GPU driver found (libcuda.so.1): nothing to test; the CUDA path has been checked"
want="$want here only under emulation (ctest -L cuda)"
if [ "$rc" != 1 ] || [ "$out" != "$want" ]; then
  echo "FAIL: mrun --selftest gave exit $rc and:"; echo "$out"; echo "want exit 1 and:"; echo "$want"
  fails=$((fails + 1))
fi
"$mrun" --selftest some.plan > /dev/null 2>&1
rc=$?
if [ "$rc" != 2 ]; then echo "FAIL: mrun --selftest with a plan: exit $rc, want 2"; fails=$((fails + 1)); fi
echo "mrun_no_driver: $fails failures"
[ "$fails" = 0 ]
