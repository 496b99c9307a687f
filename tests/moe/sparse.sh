#!/usr/bin/env bash
# sparse.sh - nn.moe's sparse expert MLP (token dispatch: moe_perm, gmm,
# moe_unperm) against its dense form (dense = true: every expert on every
# token, gates 0 where not routed), which is the same function:
#   sparse.sh MCC MRUN PARAMS_DIFF SOURCE_DIR WORK_DIR TOL
# samples/moe.mdl at tiny size in f64, three router setups (dropless;
# capacity_factor 0.5, which drops slots; one shared expert).  Per setup the
# dense plan on the reference backend is the oracle; the sparse plan on the
# reference and on the LLVM backend (which runs the moe ops on their
# reference kernels) must match its loss at every step and every final
# parameter within TOL (relative; params_diff's measure).  The sparse runs
# must really have run gmm (TS_RT_PROFILE), the dense run must not.
set -uo pipefail
mcc=$1 mrun=$2 pdiff=$3 src=$4 work=$5 tol=$6
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D=(-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2
   -D experts=4 -D topk=2 --precision f64)
data="$src/samples/data/kjv.txt"
steps=5
status=0
fail() { echo "FAIL: $*"; status=1; }
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
run() {   # name plan backend
  TS_RT_PROFILE=1 TS_THREADS=2 "$mrun" "$2" --backend "$3" --steps $steps --quiet --data "$data" \
    --metrics "$1.jsonl" --save-params "$1.bin" 2> "$1.err" || { cat "$1.err"; fail "mrun $1"; return 1; }
}
for setup in dropless:"" capacity:"-D capacity_factor=0.5" shared:"-D shared=1"; do
  name=${setup%%:*} defs=${setup#*:}
  # shellcheck disable=SC2086  # defs is a list of words
  "$mcc" "$src/samples/moe.mdl" "${D[@]}" $defs -o "$name.sparse.plan" || { fail "mcc $name"; continue; }
  # shellcheck disable=SC2086
  "$mcc" "$src/samples/moe.mdl" "${D[@]}" $defs -D dense=true -o "$name.dense.plan" || { fail "mcc $name dense"; continue; }
  run "$name.oracle" "$name.dense.plan" ref || continue
  grep -q "^  gmm " "$name.oracle.err" && fail "$name: the dense plan ran gmm"
  for be in ref llvm; do
    r=$name.sparse_$be
    run "$r" "$name.sparse.plan" $be || continue
    grep -q "^  gmm " "$r.err" || fail "$r: no gmm in the profile (not the sparse form?)"
    paste <(losses "$name.oracle.jsonl") <(losses "$r.jsonl") | awk -v n="$r" -v t="$tol" -v s=$steps '
      { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; k++ }
      END { printf "%s: %d steps, max relative loss difference %.3g (tolerance %g)\n", n, k, w, t; exit !(k == s && w <= t) }' ||
      fail "$r losses"
    "$pdiff" "$name.oracle.bin" "$r.bin" "$tol" || fail "$r parameters"
  done
done
[ $status = 0 ] && echo "ok: sparse = dense within $tol (3 setups, ref and llvm backends, $steps steps)"
exit $status
