#!/usr/bin/env bash
# siblings.sh MCC SRC: pass remat's recomputation of GELU's output (for the
# MLP's weight gradient) and GELU's backward read the same kept value; remat
# puts them side by side and fuse runs them as ONE kernel (docs/codegen.md,
# "Siblings").  Checked on the tiny gpt's micro block, f32 and f64, tp 1
# and tp 2: after `output "loss"`, every gelu_tanh_bwd shares its group
# (non-zero) with a gelu_tanh of the same operand.  --no-remat keeps the
# forward's value instead, so there is nothing to pair (the check must then
# find no recomputation at all).
set -euo pipefail
mcc=$1 src=$2
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
size=(-D layers=2 -D d_model=64 -D heads=4 -D seq_len=32 -D vocab=64 -D batch=4 -D micro_batch=2)
# check IR: prints "pairs N unpaired M recomputed R"
check() {
  awk '
    /^block micro/ {inb=1; next}
    inb && /^}/ {inb=0}
    !inb {next}
    /output "loss"/ {bwd=1; next}
    !bwd {next}
    {
      grp = 0; if (match($0, /group=[0-9]+/)) grp = substr($0, RSTART + 6, RLENGTH - 6)
      if ($3 == "gelu_tanh") { x = $4; rec++; g[x] = g[x] " " grp }
      if ($3 == "gelu_tanh_bwd") { x = $4; sub(/,$/, "", x); nb++; bx[nb] = x; bg[nb] = grp }
    }
    END {
      p = 0; u = 0
      for (i = 1; i <= nb; i++) {
        ok = 0; n = split(g[bx[i]], a, " ")
        for (j = 1; j <= n; j++) if (bg[i] != 0 && a[j] == bg[i]) ok = 1
        if (ok) p++; else u++
      }
      printf "pairs %d unpaired %d recomputed %d\n", p, u, rec + 0
    }' "$1"
}
fail=0
for prec in f32 f64; do
  for lay in "" "--tp 2"; do
    # shellcheck disable=SC2086
    "$mcc" "$src/samples/gpt.mdl" "${size[@]}" $lay --precision $prec --emit=ir -o "$t/g.ir"
    r=$(check "$t/g.ir")
    echo "gpt $prec ${lay:-tp 1}: $r"
    [ "$r" = "pairs 2 unpaired 0 recomputed 2" ] || { echo "FAIL: want both layers' GELU backward fused with the recomputation"; fail=1; }
  done
done
"$mcc" "$src/samples/gpt.mdl" "${size[@]}" --no-remat --emit=ir -o "$t/n.ir"
r=$(check "$t/n.ir")
echo "gpt --no-remat: $r"
[ "$r" = "pairs 0 unpaired 2 recomputed 0" ] || { echo "FAIL: --no-remat should recompute nothing"; fail=1; }
exit $fail
