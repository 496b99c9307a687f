#!/usr/bin/env bash
# kernels_test.sh MCC SRC: `mcc --report kernels` (tools/kreport.c) on a
# small gpt: one row per distinct kernel whose sites add up to the
# header's launch sites; with --hw the fused attention is compute-bound and
# the elementwise kernels memory-bound, with times that add up to the
# total; with --target sm_80 every row has ptxas' registers, no spill and
# an occupancy that follows from registers, shared memory and threads
# (recomputed here); refusals.
set -uo pipefail
mcc=$1 src=$2
fail=0
die() { echo "kernels_test: $*"; fail=1; }
# head_dim 64 and 512 positions: the attention does ~64 FLOPs per byte, above the ridge of any description
G=(-D layers=2 -D d_model=256 -D heads=4 -D seq_len=512 -D vocab=256 -D batch=4 -D micro_batch=2 --precision f32)
out=$("$mcc" "$src/samples/gpt.mdl" "${G[@]}" --report kernels --hw h100-sxm 2>&1) || die "--report kernels --hw failed: $out"
sites=$(sed -n 's/^# program 0: \([0-9]*\) launch sites.*/\1/p' <<<"$out")
[ -n "$sites" ] || die "no header: $out"
rows=$(grep -v '^#' <<<"$out" | grep -v '^kernel ')
sum=$(awk '{s += $2} END {print s}' <<<"$rows")
[ "$sum" = "$sites" ] || die "the rows' sites add up to $sum, the header says $sites"
grep -q '^attention_[0-9a-f]*_0 .* compute ' <<<"$rows" || die "the fused attention is not compute-bound: $out"
grep -E '^(fused_)?add_f32' <<<"$rows" | grep -qv ' memory ' && die "an add kernel is not memory-bound"
tot=$(sed -n 's/.*; \([0-9.]*\) us of generated.*/\1/p' <<<"$out")
rsum=$(awk '{s += $12} END {printf "%.1f", s}' <<<"$rows")
awk -v a="$tot" -v b="$rsum" 'BEGIN {exit !(a > 0 && (a - b) < 0.2 && (b - a) < 0.2)}' ||
  die "the rows' times add up to $rsum us, the total says $tot"
if out2=$("$mcc" "$src/samples/gpt.mdl" "${G[@]}" --report kernels --target sm_80 2>&1); then
  rows2=$(grep -v '^#' <<<"$out2" | grep -v '^kernel ')
  # occupancy on sm_80: 64 warps, 65536 registers (per warp in units of 256), 164 KiB (+1 KiB per block), 32 blocks
  bad=$(awk '{
      th = $4; sub(/.*x/, "", th); regs = $5; sm = $6; sp = $7; occ = $8; sub(/%/, "", occ)
      if (regs !~ /^[0-9]+$/ || sp != 0) { print "no registers or a spill: " $0; next }
      mult = 1; if (sm ~ /K$/) { mult = 1000; sub(/K/, "", sm) }; smem = sm * mult
      w = int((th + 31) / 32); b = 32
      t = int(2048 / (w * 32)); if (t < b) b = t
      pw = int((regs * 32 + 255) / 256) * 256; r = int(int(65536 / pw) / w); if (r < b) b = r
      if (smem > 0) { s = int(167936 / (smem + 1024)); if (s < b) b = s }
      want = 100 * b * w / 64
      if (want - occ > 1.5 || occ - want > 1.5) print "occupancy " occ "%, want " want "%: " $0
    }' <<<"$rows2")
  [ -z "$bad" ] || die "$bad"
  [ "$(wc -l <<<"$rows2")" = "$(wc -l <<<"$rows")" ] || die "--target sm_80 lists other kernels than --hw"
else
  grep -q "NVRTC" <<<"$out2" && echo "kernels_test: --target skipped: $out2" || die "--target sm_80 failed: $out2"
fi
r=$("$mcc" "$src/samples/gpt.mdl" "${G[@]}" --report kernels --target sm_80,sm_90 2>&1) && die "two archs accepted"
grep -q "one --target arch" <<<"$r" || die "two archs: $r"
r=$("$mcc" "$src/samples/gpt.mdl" "${G[@]}" --report kernls 2>&1) && die "--report kernls accepted"
grep -q "time or kernels" <<<"$r" || die "--report kernls: $r"
[ "$fail" = 0 ] && echo "kernels_test: $(wc -l <<<"$rows") kernels, $sites launch sites, $tot us on h100-sxm"
exit $fail
