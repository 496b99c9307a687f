#!/usr/bin/env bash
# mrun_pipe.sh - mrun with pipeline plans, what `mcc --check` does not
# cover (tests/parallel/pipeline.cmake has the equivalence matrix):
#   mrun_pipe.sh MCC MRUN SOURCE_DIR WORK_DIR
#  - a pp=2 plan compiled for dp=1 on --gpus 8 (dp 4: one micro batch per
#    dp rank, fewer than 1f1b's pp) is refused before any rank starts,
#    naming the --gpus values that work (2 and 4; tests/parallel/atdp.sh
#    runs pipeline plans at other dps);
#  - a pp=2 x dp=2 run (4 ranks) reports per step the loss and grad norm of
#    the single-rank run of the same model (its metrics, written by world
#    rank 0, which holds the first stage: the loss comes from the last
#    stage over pp and dp), to f32 rounding;
#  - both ranks hand their stashes over without a copy (TS_RT_PROFILE);
#  - a pipeline rank killed in step 2 (TS_FAULT_KILL) ends the job, named
#    by mpirun; a stalled one (TS_FAULT_STALL) makes its pipeline peer time
#    out in 3 s naming it; both within the bound and leaving no process.
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D layers=2 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=4 -D micro_batch=1"
data="$src/samples/data/kjv.txt"
status=0
"$mcc" "$src/samples/gpt.mdl" $D --pp 2 -o "$work/pp2.plan" || exit 1
"$mcc" "$src/samples/gpt.mdl" $D --pp 2 --dp 2 -o "$work/pp2dp2.plan" || exit 1
"$mcc" "$src/samples/gpt.mdl" $D -o "$work/flat.plan" || exit 1

# 1. a pipeline plan runs at any dp whose micro batches its schedule can run
"$mrun" "$work/pp2.plan" --gpus 8 --steps 1 >out.txt 2>&1; rc=$?
cat out.txt
if [ "$rc" != 1 ] || ! grep -q "gives dp=4.*there are 1.*The --gpus values that work: 2, 4$" out.txt; then
  echo "mrun_pipe: a pp plan at a dp its schedule cannot run: exit $rc, expected 1 and the --gpus that work"; status=1
fi
if grep -q "using 4 CPU ranks" out.txt; then echo "mrun_pipe: ranks were started before the refusal"; status=1; fi

# 2. losses of pp2 x dp2 equal the unpipelined run's (f32: to rounding)
timeout -k 5 120 "$mrun" "$work/pp2dp2.plan" --gpus 4 --steps 3 --quiet --data "$data" --metrics pp.jsonl || status=1
"$mrun" "$work/flat.plan" --steps 3 --quiet --data "$data" --metrics flat.jsonl || status=1
loss() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
gn() { sed -E 's/.*"grad_norm": ([^,]*),.*/\1/' "$1"; }
paste <(loss pp.jsonl) <(loss flat.jsonl) <(gn pp.jsonl) <(gn flat.jsonl) | awk '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; s = b < 0 ? -b : b; return d / (s > 1 ? s : 1) }
  { if (rel($1, $2) > 1e-5 || rel($3, $4) > 1e-4) bad = 1; n++ }
  END { exit !(n == 3 && !bad) }' ||
  { echo "mrun_pipe: pp2 x dp2 losses / grad norms differ from the single rank's:"; paste pp.jsonl flat.jsonl; status=1; }

# 2b. stashes hand their buffers over (the memory plan's ext): every rank
# counts them, none copied (TS_RT_PROFILE prints the counts per program)
TS_RT_PROFILE=1 timeout -k 5 60 "$mrun" "$work/pp2.plan" --gpus 2 --steps 1 --quiet --data "$data" >out.txt 2>&1 || status=1
n=$(grep -cE "pipeline stashes: [1-9][0-9]* handed over, 0 copied" out.txt)
[ "$n" = 2 ] || { echo "mrun_pipe: want both ranks' stashes handed over, none copied:"; grep "stashes" out.txt; status=1; }
# 2c. the same with zb-h1: what B keeps for W is handed over too (a value B
# unstashed and stashes again keeps its buffer)
"$mcc" "$src/samples/gpt.mdl" $D --pp 2 --schedule zb-h1 -o "$work/zb.plan" || exit 1
TS_RT_PROFILE=1 timeout -k 5 60 "$mrun" "$work/zb.plan" --gpus 2 --steps 1 --quiet --data "$data" >out.txt 2>&1 || status=1
n=$(grep -cE "pipeline stashes: [1-9][0-9]* handed over, 0 copied" out.txt)
[ "$n" = 2 ] || { echo "mrun_pipe: zb-h1: want both ranks' stashes handed over, none copied:"; grep "stashes" out.txt; status=1; }

# 3. faults: world rank 1 (pipeline rank 1) fails in step 2
fault() {   # fault KILL|STALL REGEX
  local what=$1 re=$2 plan="$work/fault_$1.plan"
  cp "$work/pp2.plan" "$plan"
  local start=$(date +%s)
  env "TS_FAULT_${what}_RANK=1" "TS_FAULT_${what}_STEP=2" \
    timeout -k 5 90 "$mrun" "$plan" --gpus 2 --steps 20 --timeout 3 --data "$data" >out.txt 2>&1
  local rc=$? elapsed=$(( $(date +%s) - start ))
  cat out.txt
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || { echo "mrun_pipe: $what: exit $rc"; status=1; }
  [ "$elapsed" -le 30 ] || { echo "mrun_pipe: $what: took ${elapsed} s, bound 30 s"; status=1; }
  grep -Eq -- "$re" out.txt || { echo "mrun_pipe: $what: no line matches /$re/"; status=1; }
  sleep 0.5
  if pgrep -f -- "$plan" >/dev/null; then
    echo "mrun_pipe: $what: processes left behind:"; pgrep -af -- "$plan"
    pkill -KILL -f -- "$plan"   # only this run's own processes (the plan path is unique)
    status=1
  fi
}
fault KILL "process rank 1|\\[\\[[0-9]+,[0-9]+\\],1\\]"
fault STALL "rank 0: .*timed out after 3 s \\(.*waiting for rank 1\\?"
echo "mrun_pipe: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
