#!/usr/bin/env bash
# calibrate_test.sh MCC MRUN SRC TMPDIR RANKS - mrun --calibrate FILE
# writes a description that mcc reads (--report time predicts a step on
# it), with measured, positive figures; with 2 ranks the link is measured;
# a plan next to --calibrate is refused.
set -uo pipefail
mcc=$1 mrun=$2 src=$3 tmp=$4 ranks=$5
rm -rf "$tmp" && mkdir -p "$tmp"
fail() { echo "calibrate_test: FAIL: $*"; exit 1; }
"$mrun" --calibrate "$tmp/cpu.hw" --gpus "$ranks" 2>"$tmp/log" || { cat "$tmp/log"; fail "mrun --calibrate exited $?"; }
grep -q '^calibrate: f64 GEMM' "$tmp/log" || fail "no GEMM lines in the log: $(cat "$tmp/log")"
for k in "peak fp64" "peak fp32" hbm_bandwidth nvlink_bandwidth kernel_overhead; do
  v=$(awk -v k="$k" 'index($0, k " ") == 1 {print $(split(k, a, " ") + 1)}' "$tmp/cpu.hw")
  python3 -c "import sys; v = float('$v'); sys.exit(0 if v > 0 else 1)" 2>/dev/null || fail "$k is '$v'"
done
if [ "$ranks" -gt 1 ]; then
  grep -q '^nvlink_latency .*MEASURED' "$tmp/cpu.hw" || fail "2 ranks: the link is not measured"
else
  grep -q '^nvlink_latency .*ASSUMED' "$tmp/cpu.hw" || fail "1 rank: the link should say ASSUMED"
fi
out=$("$mcc" "$src/samples/gpt.mdl" -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 \
      --report time --hw "$tmp/cpu.hw" -o - 2>&1) || fail "mcc --report time --hw: $out"
s=$(sed -n 's/^step_time_s=\([^ ]*\).*/\1/p' <<<"$out")
python3 -c "import sys; sys.exit(0 if float('$s') > 0 else 1)" || fail "step_time_s '$s'"
"$mcc" "$src/samples/gpt.mdl" -o "$tmp/g.plan" || fail "mcc"
"$mrun" "$tmp/g.plan" --calibrate "$tmp/x.hw" 2>"$tmp/err"; rc=$?
[ "$rc" = 2 ] && grep -q "takes no plan" "$tmp/err" || fail "a plan with --calibrate: exit $rc, $(cat "$tmp/err")"
[ ! -e "$tmp/x.hw" ] || fail "a refused --calibrate wrote its file"
echo "calibrate_test: ok ($ranks rank(s)): $(grep -c MEASURED "$tmp/cpu.hw") measured figures; predicted step $s s"
