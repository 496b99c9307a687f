#!/usr/bin/env bash
# dropout.sh - dropout inside fused kernels, end to end:
#   dropout.sh MCC MRUN PARAMS_DIFF SOURCE_DIR WORK_DIR PRECISION TOL [PARAM_TOL]
# Compiles samples/gpt.mdl at tiny size with dropout 0.1 (the default
# pipeline: fusion groups), checks that the fused IR has dropout nodes
# INSIDE groups (after the fuse pass, --dump-ir=fuse), then trains 3 steps
# on the fused plan with --backend ref (every node on ops_ref.c: the
# oracle) and --backend llvm (fused JIT kernels computing the masks from
# the step, micro batch and seed at run time).  Losses of every step and
# the final parameters must agree within TOL (relative; params_diff's
# measure): a mask that differed in a single element of a step would move
# them far more (f64: 1e-12 leaves no room for one).  The llvm run must
# have run fused groups and none of them on the reference (all lowered,
# dropout included).  PARAM_TOL (default TOL) is the parameters' own
# tolerance: in f32 this configuration's parameters differ by 1.84e-6
# (tensor-relative, layers.1.mlp.w_in, from the first step on) between the
# LLVM backend and the reference EVEN WITH every dropout node on the
# reference kernel -- Adam's first update m/(sqrt(v)+eps) amplifies f32
# rounding of gradients near eps -- so f32 parameters use 4e-6; the
# losses keep 1e-6 (they agree to the last digit).
set -uo pipefail
mcc=$1 mrun=$2 pdiff=$3 src=$4 work=$5 prec=$6 tol=$7 ptol=${8:-$7}
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 -D dropout=0.1 --precision $prec"
data="$src/samples/data/kjv.txt"
steps=3
fail() { echo "FAIL: $*"; exit 1; }
"$mcc" "$src/samples/gpt.mdl" $D --dump-ir=fuse dump -o fused.plan || fail "mcc"
ir=$(ls dump/*fuse.ir 2>/dev/null | head -1)
[ -n "$ir" ] || fail "no fuse dump"
total=$(grep -c ' = dropout ' "$ir")
grouped=$(grep ' = dropout ' "$ir" | grep -c ' group=[1-9]')
echo "fused IR: $grouped of $total dropout nodes inside fusion groups"
[ "$total" -gt 0 ] || fail "the sample has no dropout at dropout=0.1"
[ "$grouped" = "$total" ] || fail "dropout nodes outside groups: $(grep ' = dropout ' "$ir" | grep -v ' group=[1-9]')"
export TS_CACHE_DIR=off
run() {   # name backend
  TS_RT_PROFILE=1 TS_THREADS=2 "$mrun" fused.plan --backend "$2" --steps $steps --quiet --data "$data" \
    --metrics "$1.jsonl" --save-params "$1.bin" 2> "$1.err" || { cat "$1.err"; fail "mrun $1"; }
}
run oracle ref
run llvm llvm
line=$(grep 'llvm backend' llvm.err)
echo "$line"
g=$(sed -n 's/^rt: llvm backend: [0-9]* kernels (\([0-9]*\) fused groups.*/\1/p' llvm.err)
[ -n "$g" ] && [ "$g" -gt 0 ] || fail "no fused groups ran: $line"
echo "$line" | grep -q ' 0 groups on the reference' || fail "groups fell back to the reference: $line"
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
status=0
paste <(losses oracle.jsonl) <(losses llvm.jsonl) | awk -v t="$tol" -v s=$steps '
  { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; k++ }
  END { printf "%d steps, max relative loss difference %.3g (tolerance %g)\n", k, w, t; exit !(k == s && w <= t) }' ||
  { echo "FAIL: losses"; status=1; }
"$pdiff" oracle.bin llvm.bin "$ptol" || { echo "FAIL: parameters"; status=1; }
exit $status
