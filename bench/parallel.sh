#!/usr/bin/env bash
# parallel.sh - the tiny GPT across parallel layouts on CPU ranks: step
# time and bytes communicated per step, one markdown table per run.
#
#   bench/parallel.sh [--build DIR] [--steps N] [--warmup N] [--model gpt|llama|moe]
#   defaults: --build build, --steps 10 (timed), --warmup 2, --model gpt
#
# Layouts: 1 rank; tp=2; tp=2 sp; dp=2; tp=2 dp=2 sp; tp=4; pp=2 (1f1b,
# gpipe); pp=2 dp=2; cp=2 (ring attention, when the model has no attention
# dropout; else the all-gather form).  --model moe instead: 1 rank and
# ep=2 / ep=4 / ep=2 dp=2 with the sparse experts (token dispatch by
# all_to_all_v), and 1 rank / ep=2 with nn.moe's dense form.  Each is
# compiled with mcc and trained with `mrun --gpus N --metrics` (f32, MPI
# ranks started by mrun, OPENBLAS_NUM_THREADS=1 per rank).
# - step time: median of the elapsed_s differences of the timed steps
#   after the warm-up steps (from --metrics);
# - bytes communicated: from the COMPILED program, `mcc --report comm`
#   (not measured on the wire): per rank per step, the sum over collective
#   nodes of their payload (the whole tensor: all_reduce / reduce_scatter
#   operand, all_gather result) times the runs of their block (micro:
#   micro batches per rank), and the bytes a rank sends with a ring
#   algorithm (2(n-1)/n x payload for all_reduce, (n-1)/n otherwise); with
#   pp the pipeline sends count too, for the busiest pipeline rank;
# - final loss: the last step's, the same model in every layout (equal up
#   to f32 rounding: tests/parallel checks it to 1e-10 in f64).
# The machine has 2 cores: 4 ranks share them, so this measures overheads
# (collectives, launch, small GEMMs), not speed-up.  Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=10 warmup=2 model=gpt
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --model) model=${2:?}; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "parallel.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MCC=$build/mcc MRUN=$build/mrun
[ -x "$MCC" ] && [ -x "$MRUN" ] || { echo "parallel.sh: no mcc/mrun in $build (build first, or --build DIR)" >&2; exit 2; }
micro=2
[ "$model" = moe ] && micro=4   # ep splits each micro batch: up to ep=4
CFG=(-D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=$micro)
[ "$model" = llama ] && CFG+=(-D kv_heads=4 -D ffn=256)
[ "$model" = moe ] && CFG+=(-D kv_heads=2 -D ffn=128 -D experts=4 -D topk=2)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

layouts=("1 rank|" "tp=2|--tp 2" "tp=2 sp|--tp 2 --sp" "dp=2|--dp 2" "tp=2 dp=2 sp|--tp 2 --dp 2 --sp" "tp=4|--tp 4"
         "pp=2 (1f1b)|--pp 2" "pp=2 gpipe|--pp 2 --schedule gpipe" "pp=2 dp=2|--pp 2 --dp 2" "cp=2 (ring)|--cp 2")
[ "$model" = moe ] && layouts=("1 rank|" "ep=2|--ep 2" "ep=4|--ep 4" "ep=2 dp=2|--ep 2 --dp 2"
                               "1 rank, dense experts|-D dense=true" "ep=2, dense experts|-D dense=true --ep 2")
echo "| layout | ranks | median step (ms) | vs 1 rank | collectives / step | payload bytes / step / rank | ring bytes sent / step / rank | final loss |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
base=""
for entry in "${layouts[@]}"; do
  name=${entry%%|*} opts=${entry#*|}
  # shellcheck disable=SC2086
  "$MCC" samples/$model.mdl "${CFG[@]}" $opts -o "$TMP/p.plan"
  # shellcheck disable=SC2086
  # one total line, or with pp one per pipeline rank: the busiest rank's
  comm=$("$MCC" samples/$model.mdl "${CFG[@]}" $opts --report comm | sed -n \
    -e 's/^total per step: \([0-9]*\) collectives, payload \([0-9]*\) bytes, ring \([0-9]*\) bytes.*/\1 \2 \3/p' \
    -e 's/^total per step on pipeline rank [0-9]*: \([0-9]*\) operations, payload \([0-9]*\) bytes, \([0-9]*\) bytes sent.*/\1 \2 \3/p' |
    sort -k3,3n | tail -1)
  read -r ncoll payload ring <<<"$comm"
  ranks=$("$MCC" samples/$model.mdl "${CFG[@]}" $opts --emit=plan-text | sed -n 's/^ranks \([0-9]*\)$/\1/p')
  "$MRUN" "$TMP/p.plan" --gpus "$ranks" --steps $((warmup + steps)) --quiet --metrics "$TMP/m.jsonl" 2>/dev/null >/dev/null
  read -r med loss < <(/usr/bin/python3 - "$TMP/m.jsonl" "$warmup" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])][int(sys.argv[2]) - 1:]
print("%.1f %.6f" % (1e3 * statistics.median(t), rows[-1]["loss"]))
PY
)
  [ -n "$base" ] || base=$med
  rel=$(awk -v a="$med" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
  echo "| $name | $ranks | $med | $rel | $ncoll | $payload | $ring | $loss |"
done
echo
echo "- $model ${CFG[*]}, f32, median of $steps steps after $warmup warm-up; $(getconf _NPROCESSORS_ONLN) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)."
echo "- Bytes from \`mcc --report comm\` (the compiled program), per rank per step; the trainer's 8-byte loss all-reduce over dp is not counted."
