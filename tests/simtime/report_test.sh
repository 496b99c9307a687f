#!/bin/bash
# report_test.sh - `mcc --report time` as a user runs it: the last line
# parses (step_time_s tflops_per_gpu mfu), the step time is the blocks'
# total, a model twice as deep predicts about twice the compute, tp=2 halves
# the GEMM time per rank at fixed shapes and adds tp communication, a 1F1B
# pipeline shows a bubble near (p-1)/(m+p-1), --gpus adds dp communication,
# a damaged --hw file is a file:line error, an unknown name lists the
# known ones, and --emit=trace --hw carries predicted seconds.
#
# usage: report_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }
cp "$SRC/samples/gpt.mdl" "$TMP/gpt.mdl"
# a small GPT whose layers dominate (small vocab): depth, tp and pp compare cleanly
SMALL="-D vocab=128 -D seq_len=256 -D d_model=512 -D heads=8 -D batch=8"

report() {   # out-name, mcc options...
  local name=$1; shift
  "$MCC" "$TMP/gpt.mdl" --report time "$@" > "$TMP/$name.txt" 2> "$TMP/$name.err" ||
    { die "$name: mcc failed: $(cat "$TMP/$name.err")"; return 1; }
}
# field of the machine-readable last line
field() { tail -1 "$TMP/$1.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# a column of the block row $2 in report $1: $3 = GEMM|attention|memory|total|comm tp|...
col() {
  awk -v b="$2" -v c="$3" '
    /^  block/ { n = 0; line = $0; sub(/^  block +runs/, "", line)
                 while (match(line, /[^ ]+( [a-z]+)?/)) { h[++n] = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
                   sub(/^ +/, "", line) } next }
    $1 == b { rest = $0; sub(/^ +[^ ]+ +[0-9]+ +/, "", rest); k = 0
              while (match(rest, /(0|[0-9.]+ (us|ms|s))/)) { v = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
                split(v, p, " "); s = p[1] * (p[2] == "us" ? 1e-6 : p[2] == "ms" ? 1e-3 : 1); k++
                if (h[k] == c) { printf "%.9g\n", s; exit } } }' "$TMP/$1.txt"
}
ratio_in() {   # what, a, b, lo, hi: lo <= a / b <= hi
  awk -v a="$2" -v b="$3" -v lo="$4" -v hi="$5" 'BEGIN { r = b > 0 ? a / b : -1; exit !(r >= lo && r <= hi) }' ||
    die "$1: $2 / $3 not in [$4, $5]"
}

# ---- GPT-2 124M on an H200: the machine-readable line ----
if report gpt2 -D batch=8 -D micro_batch=8 --hw h200; then
  last=$(tail -1 "$TMP/gpt2.txt")
  echo "$last" | grep -Eq '^step_time_s=[0-9.e+-]+ tflops_per_gpu=[0-9.e+-]+ mfu=[0-9.e+-]+( |$)' ||
    die "gpt2: last line does not parse: $last"
  st=$(field gpt2 step_time_s) tf=$(field gpt2 tflops_per_gpu) mfu=$(field gpt2 mfu)
  awk -v s="$st" -v t="$tf" -v m="$mfu" 'BEGIN { exit !(s > 0.01 && s < 10 && t > 0 && m > 0 && m < 1) }' ||
    die "gpt2: implausible step_time_s=$st tflops_per_gpu=$tf mfu=$mfu"
  # tflops_per_gpu = model FLOPs / step / 1 GPU, and mfu = that / 67 TFLOP/s (the H200's fp32 peak)
  mf=$(sed -n 's/^model FLOPs per step.*: \([0-9.e+]*\)$/\1/p' "$TMP/gpt2.txt")
  ratio_in "gpt2: tflops_per_gpu vs model FLOPs / step" "$tf" "$(awk -v f="$mf" -v s="$st" 'BEGIN { print f / s / 1e12 }')" 0.999 1.001
  ratio_in "gpt2: mfu vs tflops / 67" "$mfu" "$(awk -v t="$tf" 'BEGIN { print t / 67 }')" 0.998 1.002
  # Megatron's formula: 72 B s l h^2 (1 + s / 6h + V / 12 h l), B=8 s=1024 l=12 h=768 V=50304
  ratio_in "gpt2: model FLOPs vs Megatron's formula" "$mf" \
    "$(awk 'BEGIN { B=8; s=1024; l=12; h=768; V=50304; print 72*B*s*l*h*h*(1 + s/(6*h) + V/(12*h*l)) }')" 0.99 1.01
  # the step is the blocks' totals added up (no pp: micro x 1 + update)
  ratio_in "gpt2: step vs micro + update" "$st" "$(awk -v a="$(col gpt2 micro total)" -v b="$(col gpt2 update total)" 'BEGIN { print a + b }')" 0.99 1.01
fi

# ---- twice as deep: about twice the compute ----
report d4 $SMALL -D layers=4 --hw h100-sxm && report d8 $SMALL -D layers=8 --hw h100-sxm &&
  ratio_in "depth 8 vs 4: micro compute" "$(col d8 micro total)" "$(col d4 micro total)" 1.8 2.05

# ---- tp=2 at fixed shapes: GEMMs halve per rank, tp communication appears ----
# (GPT-2's widths: at the small model's, a GEMM fills less than a wave of
# SMs and splitting it saves nothing, which the model says too)
WIDE="-D vocab=1024 -D layers=2 -D batch=8 -D micro_batch=8"
if report tp1 $WIDE --hw h100-sxm && report tp2 $WIDE --tp 2 --hw h100-sxm; then
  ratio_in "tp2 vs tp1: GEMM time per rank" "$(col tp2 micro GEMM)" "$(col tp1 micro GEMM)" 0.45 0.56
  c=$(col tp2 micro "comm tp")
  awk -v c="${c:-0}" 'BEGIN { exit !(c > 0) }' || die "tp2: no tp communication time in the micro block"
  grep -q "comm tp" "$TMP/tp1.txt" && die "tp1: a tp communication column without tp"
  line=$(grep "^exposed communication per step: tp " "$TMP/tp2.txt") || die "tp2: no exposed tp communication line"
  # exposed (waited for) <= all of it (overlapped or not), both in ms
  echo "$line" | awk '{ u = $7; v = $10; e = $6 * (u == "ms" ? 1e-3 : u == "us" ? 1e-6 : 1)
                       a = $9 * (v == "ms)" ? 1e-3 : v == "us)" ? 1e-6 : 1); exit !(e > 0 && a >= e) }' || die "tp2: exposed vs total: $line"
fi

# ---- --gpus: dp over nodes adds dp communication ----
if report dp16 $SMALL -D layers=4 -D batch=16 -D micro_batch=1 --hw h100-sxm --gpus 16; then
  grep -q "^time report: .*16 GPUs" "$TMP/dp16.txt" || die "dp16: not 16 GPUs: $(head -1 "$TMP/dp16.txt")"
  c=$(col dp16 update "comm dp")
  awk -v c="${c:-0}" 'BEGIN { exit !(c > 0) }' || die "dp16: no dp communication in the update block"
fi
"$MCC" "$TMP/gpt.mdl" $SMALL -D layers=4 --tp 2 --report time --hw h100-sxm --gpus 3 > /dev/null 2> "$TMP/g3.err" &&
  die "--gpus 3 with tp=2 was accepted"
grep -q "not a multiple of the 2 ranks" "$TMP/g3.err" || die "--gpus 3: message: $(cat "$TMP/g3.err")"

# ---- pp=4, 8 micro batches, 1F1B: bubble near (p-1)/(m+p-1) = 0.2727 ----
if report pp4 $SMALL -D layers=8 -D micro_batch=1 --pp 4 --hw h100-sxm; then
  b=$(sed -n 's/^pipeline bubble .*: [0-9.]* [mu]*s, \([0-9.]*\) of the pipeline.*/\1/p' "$TMP/pp4.txt")
  [ -n "$b" ] || die "pp4: no bubble line"
  awk -v b="${b:-0}" 'BEGIN { exit !(b >= 0.25 && b <= 0.33) }' || die "pp4: bubble fraction $b, expected about 3/11"
  grep -q "comm pp" "$TMP/pp4.txt" || die "pp4: no pp communication column"
  # --emit=trace --hw: the timeline in predicted seconds (us in the trace) ends near the step
  if "$MCC" "$TMP/gpt.mdl" $SMALL -D layers=8 -D micro_batch=1 --pp 4 --hw h100-sxm --emit=trace "$TMP/pp4.json" 2> "$TMP/tr.err"; then
    end=$(grep -o '"ts": [0-9.]*, "dur": [0-9.]*' "$TMP/pp4.json" | awk '{ gsub(/,/, ""); e = $2 + $4; if (e > m) m = e } END { print m }')
    ratio_in "pp4 trace end (us) vs step time" "$end" "$(awk -v s="$(field pp4 step_time_s)" 'BEGIN { print s * 1e6 }')" 0.9 1.0
  else
    die "pp4: --emit=trace --hw failed: $(cat "$TMP/tr.err")"
  fi
fi

# ---- damaged and unknown descriptions ----
sed '12s/.*/peak tf32 fast/' "$SRC/hw/h200.hw" > "$TMP/bad.hw"
"$MCC" "$TMP/gpt.mdl" --report time --hw "$TMP/bad.hw" > /dev/null 2> "$TMP/bad.err" && die "a damaged --hw file was accepted"
grep -q "$TMP/bad.hw:12: error: 'peak tf32' needs one non-negative number" "$TMP/bad.err" ||
  die "damaged --hw: message: $(cat "$TMP/bad.err")"
"$MCC" "$TMP/gpt.mdl" --report time --hw h900 > /dev/null 2> "$TMP/h900.err" && die "--hw h900 was accepted"
grep -q "no description named 'h900'.*a100-80gb.*h200" "$TMP/h900.err" || die "--hw h900: message: $(cat "$TMP/h900.err")"
"$MCC" "$TMP/gpt.mdl" --report time > /dev/null 2> "$TMP/nohw.err"
[ $? = 2 ] && grep -q "needs --hw" "$TMP/nohw.err" || die "--report time without --hw: $(cat "$TMP/nohw.err")"
[ -e "$TMP/gpt.plan" ] && die "--report time wrote a plan"

[ $fail = 0 ] && echo "simtime report: ok"
exit $fail
