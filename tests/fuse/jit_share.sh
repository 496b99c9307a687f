#!/usr/bin/env bash
# jit_share.sh - ranks starting together with a cold kernel cache share the
# compilation (codegen/llvm.c, "who compiles a kernel"):
#   jit_share.sh MCC MRUN SOURCE_DIR WORK_DIR
# 1. 4 ranks of a tp 2 plan, one cold cache directory: the kernels compiled
#    (distinct minus loaded from the disk, per rank's TS_RT_PROFILE line)
#    add up to one rank's distinct count -- each compiled once on the
#    machine, not once per rank -- and the ranks waited for one another's
#    kernels; losses and parameters bit-identical to a run without the
#    cache (TS_CACHE_DIR=off: every rank compiles all).
# 2. A lock left by a dead process (the cache emptied, every kernel's lock
#    file naming a pid that has exited): taken over, the run finishes and
#    no lock is left behind.
# 3. A lock held by a live process that then exits without writing the
#    object (a `sleep 2` standing in for a rank killed mid-compile): the
#    run waits for it, then compiles the kernel itself.
set -uo pipefail
mcc=$1 mrun=$2 src=$3 work=$4
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$mcc" "$src/samples/gpt.mdl" -D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 \
  -D micro_batch=2 --tp 2 -o tp2.plan || fail "mcc"
run() {   # name cache-dir ranks
  TS_CACHE_DIR=$2 TS_RT_PROFILE=1 TS_THREADS=1 timeout 120 "$mrun" tp2.plan --gpus "$3" --steps 2 --quiet \
    --metrics "$1.jsonl" --save-params "$1.bin" 2> "$1.err" || { cat "$1.err"; fail "mrun $1"; }
}
# "distinct compiled" minus "from the disk cache": what this rank compiled itself
compiled() { sed -n 's/^rt: llvm backend: .* \([0-9]*\) distinct compiled.* s, \([0-9]*\) from the disk cache (\([0-9]*\) waited.*/\1 \2 \3/p' "$1.err"; }

run nocache off 4
run shared "$work/cache" 4
read -r distinct _ _ <<<"$(compiled nocache | head -1)"
[ -n "${distinct:-}" ] && [ "$distinct" -gt 0 ] || fail "no distinct kernel count in: $(cat nocache.err)"
total=0 waited=0 ranks=0
while read -r d h w; do
  [ "$d" = "$distinct" ] || fail "a rank has $d distinct kernels, the uncached run $distinct"
  total=$((total + d - h)); waited=$((waited + w)); ranks=$((ranks + 1))
done < <(compiled shared)
[ "$ranks" = 4 ] || fail "$ranks backend lines for 4 ranks: $(cat shared.err)"
echo "4 ranks, cold cache: $total kernels compiled in all (one rank has $distinct distinct); $waited waits for another rank"
[ "$total" = "$distinct" ] || fail "the ranks compiled $total kernels in all, want $distinct (each once on the machine)"
[ "$waited" -gt 0 ] || fail "no rank waited for another's kernel: the compilation was not shared"
[ "$(ls cache/*.o | wc -l)" = "$distinct" ] || fail "$(ls cache/*.o | wc -l) objects in the cache, want $distinct"
ls cache/*.lock 2>/dev/null && fail "lock files left behind"
cmp -s nocache.bin shared.bin || fail "parameters differ from the run without the cache"
cmp -s <(grep -o '"loss": [^,]*' nocache.jsonl) <(grep -o '"loss": [^,]*' shared.jsonl) ||
  fail "losses differ: $(grep -o '"loss": [^,]*' nocache.jsonl shared.jsonl)"

# 2: stale locks of a dead process
bash -c 'exit 0' & dead=$!; wait $dead
for o in cache/*.o; do echo "$dead" > "${o%.o}.o.lock"; rm "$o"; done
run stale "$work/cache" 4
read -r d h w <<<"$(compiled stale | head -1)"
[ "$(ls cache/*.o | wc -l)" = "$d" ] || fail "stale locks: $(ls cache/*.o | wc -l) objects remade, want $d"
ls cache/*.lock 2>/dev/null && fail "stale lock files left behind"
cmp -s nocache.bin stale.bin || fail "parameters differ after taking over stale locks"

# 3: a live holder that exits without writing
sleep 2 & live=$!
for o in cache/*.o; do echo "$live" > "${o%.o}.o.lock"; rm "$o"; done
t0=$(date +%s.%N)
run live "$work/cache" 4
t1=$(date +%s.%N)
wait $live
read -r d h w <<<"$(compiled live | head -1)"
[ "$(ls cache/*.o | wc -l)" = "$d" ] || fail "live holder: $(ls cache/*.o | wc -l) objects remade, want $d"
awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a >= 1.5) }' || fail "the run did not wait for the lock's live holder"
ls cache/*.lock 2>/dev/null && fail "lock files left behind"
cmp -s nocache.bin live.bin || fail "parameters differ after waiting for a holder"
echo "OK"
