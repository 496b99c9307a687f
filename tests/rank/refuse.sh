#!/usr/bin/env bash
# refuse.sh - mrun's refusals for a rank count that does not fit the mesh,
# and mrun joining a job started by an outside launcher:
#   refuse.sh MCC MRUN SOURCE_DIR WORK_DIR MPIEXEC
# A tp=2 module (IR text: mrun takes its mesh from the `parallel` line) on
# 3 ranks must be refused before any rank starts, with a
# message naming the numbers; a global batch that the dp ranks cannot share
# in whole micro batches likewise (here from inside the ranks).  Under
# `mpirun -np 2`, mrun without --gpus trains on the 2 ranks (the losses of
# the single-rank run), and --gpus 3 is refused; a rank count mpirun gives
# that does not fit is refused naming "mpirun -np N", not --gpus.
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4 mpiexec=$5
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=4 -D micro_batch=2"
"$mcc" "$src/samples/gpt.mdl" $D --tp 2 --emit=ir -o tp2.ir || exit 1
"$mcc" "$src/samples/gpt.mdl" $D -o dp.plan || exit 1
status=0
expect() {   # expect REGEX CMD...: CMD must exit 1 and print REGEX
  local re=$1; shift
  "$@" >out.txt 2>&1; local rc=$?
  cat out.txt
  if [ "$rc" != 1 ] || ! grep -Eq -- "$re" out.txt; then
    echo "refuse: '$*' exited $rc, expected 1 and /$re/"; status=1
  fi
}
expect "--gpus 3 does not divide into the plan's mesh: tp=2 .*use a multiple of 2" \
  "$mrun" tp2.ir --gpus 3 --steps 1
# global_batch 4 / micro_batch 2 = 2 micro batches: not enough for dp 4 (refused before the ranks start)
expect "--gpus 4 gives dp = 4 / 1 = 4, which does not divide the 2 micro batches of a step" \
  timeout -k 5 60 "$mrun" dp.plan --gpus 4 --steps 1 --timeout 10
root=; [ "$(id -u)" = 0 ] && root=--allow-run-as-root
expect "--gpus 3 but the MPI job has 2 ranks" \
  timeout -k 5 60 "$mpiexec" $root --oversubscribe -np 2 "$mrun" dp.plan --gpus 3 --steps 1
# under a launcher the messages name the launcher's rank count, not --gpus (issue 24)
expect "mpirun -np 3 does not divide into the plan's mesh: tp=2 .*use a multiple of 2: mpirun -np 2" \
  timeout -k 5 60 "$mpiexec" $root --oversubscribe -np 3 "$mrun" tp2.ir --steps 1
expect "mpirun -np 3 gives dp = 3 / 1 = 3, which does not divide the 2 micro batches of a step" \
  timeout -k 5 60 "$mpiexec" $root --oversubscribe -np 3 "$mrun" dp.plan --steps 1
data="$src/samples/data/kjv.txt"
"$mrun" dp.plan --steps 2 --quiet --data "$data" --metrics one.jsonl || status=1
if ! timeout -k 5 60 "$mpiexec" $root --oversubscribe -np 2 "$mrun" dp.plan --steps 2 --quiet --data "$data" \
     --metrics two.jsonl; then
  echo "refuse: mrun under mpirun -np 2 failed"; status=1
fi
loss() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
paste <(loss one.jsonl) <(loss two.jsonl) | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) bad = 1; n++ }
  END { exit !(n == 2 && !bad) }' || { echo "refuse: 2 ranks under mpirun do not train like 1"; status=1; }
echo "refuse: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
