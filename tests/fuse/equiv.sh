#!/usr/bin/env bash
# equiv.sh - fused vs unfused, reference vs LLVM backend on one sample:
#   equiv.sh MCC MRUN PARAMS_DIFF SOURCE_DIR WORK_DIR MODEL PRECISION TOL
# Compiles the model at tiny size twice (default pipeline, with fusion
# groups, and --no-fuse) and trains 4 steps four ways:
#   ref  on the unfused plan  - the oracle (every node on ops_ref.c)
#   ref  on the fused plan    - must equal the oracle EXACTLY (the reference
#                               backend ignores groups)
#   llvm on the fused plan    - fused JIT kernels
#   llvm on the unfused plan  - one JIT kernel per lowerable node
# (both llvm runs also run the native launches of exec_jit.c: the
# attention backward in one pass, gradients made straight into their
# states; they must be there)
# The losses of every step and every final parameter of the llvm runs must
# be within TOL of the oracle (relative; params_diff's measure).  The llvm
# runs must really have run generated kernels, fused groups only in the
# fused plan (TS_RT_PROFILE's backend line).  The JIT's on-disk cache is
# a fresh directory: a second llvm run on the fused plan must load every
# kernel from it and give bit-identical results.
set -uo pipefail
mcc=$1 mrun=$2 pdiff=$3 src=$4 work=$5 model=$6 prec=$7 tol=$8
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
D="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 --precision $prec"
[ "$model" = llama ] && D="$D -D kv_heads=2 -D ffn=64"
data="$src/samples/data/kjv.txt"
steps=4
fail() { echo "FAIL: $*"; exit 1; }
"$mcc" "$src/samples/$model.mdl" $D -o fused.plan || fail "mcc"
"$mcc" "$src/samples/$model.mdl" $D --no-fuse -o unfused.plan || fail "mcc --no-fuse"
export TS_CACHE_DIR="$work/cache"
run() {   # name plan backend
  TS_RT_PROFILE=1 TS_THREADS=2 "$mrun" "$2" --backend "$3" --steps $steps --quiet --data "$data" \
    --metrics "$1.jsonl" --save-params "$1.bin" 2> "$1.err" || { cat "$1.err"; fail "mrun $1"; }
}
run oracle unfused.plan ref
run ref_fused fused.plan ref
run llvm_fused fused.plan llvm
run llvm_unfused unfused.plan llvm
run llvm_cached fused.plan llvm
groups() { sed -n 's/^rt: llvm backend: \([0-9]*\) kernels (\([0-9]*\) fused groups.*/\1 \2/p' "$1.err"; }
read -r k g <<<"$(groups llvm_fused)"
[ -n "${k:-}" ] && [ "$k" -gt 0 ] && [ "$g" -gt 0 ] || fail "llvm on the fused plan ran no fused kernels: $(cat llvm_fused.err)"
# the native launches must have run too, so the comparison below covers
# them: the attention backward in one pass and the gradients made straight
# into their states (GEMM with beta = 1, the embedding's scatter-add)
for r in llvm_fused llvm_unfused; do
  na=$(sed -n 's/.*, \([0-9]*\) attention backwards in one pass.*/\1/p' $r.err)
  nd=$(sed -n 's/.*, \([0-9]*\) gradients made straight into their state.*/\1/p' $r.err)
  [ "${na:-0}" -gt 0 ] && [ "${nd:-0}" -gt 0 ] ||
    fail "$r: attention backwards in one pass '$na', gradients straight into their state '$nd' (want > 0)"
done
read -r k g <<<"$(groups llvm_unfused)"
[ -n "${k:-}" ] && [ "$k" -gt 0 ] && [ "$g" = 0 ] || fail "llvm on the unfused plan: kernels '$k', groups '$g' (want > 0, 0)"
grep -q "compiled, 0 groups on the reference) in [0-9.]* s, 0 from the disk cache" llvm_fused.err ||
  fail "the first llvm run found kernels in a fresh cache: $(grep 'llvm backend' llvm_fused.err)"
sed -n 's/.* \([0-9]*\) distinct compiled.* s, \([0-9]*\) from the disk cache.*/\1 \2/p' llvm_cached.err | {
  read -r d h; [ -n "${d:-}" ] && [ "$d" = "$h" ]; } || fail "the second run did not load every kernel from the cache: $(grep 'llvm backend' llvm_cached.err)"
cmp -s llvm_fused.bin llvm_cached.bin || fail "kernels loaded from the cache give different parameters"
losses() { sed -E 's/.*"loss": ([^,]*),.*/\1/' "$1"; }
cmp -s oracle.bin ref_fused.bin || fail "the reference backend on the fused plan differs from the unfused plan"
[ "$(losses oracle.jsonl)" = "$(losses ref_fused.jsonl)" ] || fail "reference losses differ between fused and unfused plans"
status=0
for r in llvm_fused llvm_unfused; do
  paste <(losses oracle.jsonl) <(losses $r.jsonl) | awk -v n="$r" -v t="$tol" -v s=$steps '
    { d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1); if (r > w) w = r; k++ }
    END { printf "%s: %d steps, max relative loss difference %.3g (tolerance %g)\n", n, k, w, t; exit !(k == s && w <= t) }' ||
    { echo "FAIL: $r losses"; status=1; }
  "$pdiff" oracle.bin $r.bin "$tol" || { echo "FAIL: $r parameters"; status=1; }
done
exit $status
