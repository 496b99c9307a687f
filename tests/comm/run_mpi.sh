#!/usr/bin/env bash
# run_mpi.sh - runs test_comm under mpirun with a hard bound, and checks
# that no process of the run is left behind:
#   run_mpi.sh MPIEXEC NP BOUND_S EXPECT MODE TEST_COMM [REGEX]
# EXPECT is "pass" (exit 0 required) or "fail" (non-zero exit required,
# within BOUND_S seconds, and REGEX must appear in the output).
set -uo pipefail
mpiexec=$1 np=$2 bound=$3 expect=$4 mode=$5 bin=$6 regex=${7:-}
# A token only this run's processes carry in their command line, so that
# pgrep finds our leftovers and not those of a test running alongside.
token="run$$"
out=$(mktemp)
start=$(date +%s)
timeout -k 5 60 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$bin" "$mode" "$token" >"$out" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
status=0
# 124: timeout fired; 137 is also what mpirun returns for a rank killed by
# SIGKILL, so only count it as a hang when the 60 s were used up.
if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && [ "$elapsed" -ge 60 ]; }; then
  echo "run_mpi: mpirun hung (killed by timeout after 60 s)"; status=1
elif [ "$expect" = pass ] && [ "$rc" != 0 ]; then
  echo "run_mpi: exit status $rc, expected 0"; status=1
elif [ "$expect" = fail ]; then
  [ "$rc" != 0 ] || { echo "run_mpi: exit status 0, expected a failure"; status=1; }
  [ "$elapsed" -le "$bound" ] || { echo "run_mpi: took ${elapsed} s, bound ${bound} s"; status=1; }
  grep -Eq -- "$regex" "$out" || { echo "run_mpi: no line matches /$regex/"; status=1; }
fi
sleep 0.5
if pgrep -f -- "$mode $token" >/dev/null; then
  echo "run_mpi: processes left behind:"; pgrep -af -- "$mode $token"
  pkill -KILL -f -- "$mode $token"   # only this run's own processes
  status=1
fi
rm -f "$out"
echo "run_mpi: $mode on $np rank(s): exit $rc after ${elapsed} s -> $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
