#!/usr/bin/env bash
# dp_overlap.sh - the data-parallel gradient reduction overlapped with the
# last micro batch's backward, MEASURED on CPU ranks (nonblocking MPI),
# next to the same plan with --no-overlap-grad-reduce (the reduction in
# the update block after the backward).
#
#   bench/dp_overlap.sh [--build DIR] [--steps N] [--rounds R] [--bucket BYTES]
#   defaults: --build build, --steps 8 (after 2 warm-up steps), --rounds 3,
#   --bucket 1048576
#
# Model: gpt, 4 layers, d_model 256, 8 heads, seq 128, vocab 256, f32,
# micro batches of 1, batch 4 (2 micro batches per rank at dp=2, 1 at dp=4).
# Per layout and mode, R runs alternating overlapped / not (the machine is
# shared), each `mrun --gpus N --steps 2+N --metrics`:
# - step time: median over all runs of the per-step elapsed_s differences
#   after the warm-up;
# - waiting on the dp reduction, per step: overlapped, the seconds the
#   update block waited for buckets still in flight; not overlapped, the
#   seconds its dp collectives took (both from mrun's "dp reduction" line,
#   rank 0, all steps, warm-up included);
# - posting + polling (overlapped only): packing buckets, posting them and
#   polling them inside the backward (MPI over shared memory moves the
#   bytes inside these calls, on the rank's own core: on CPU ranks the
#   copy itself is not hidden, the waiting for the slowest rank is);
# - exposed bytes: `mcc --report comm`'s ring bytes of the buckets that
#   overlap no backward FLOPs, of all the dp gradient reduction's bytes.
# MPI's idle polls yield the core only where the ranks outnumber the 2
# cores (OMPI_MCA_mpi_yield_when_idle=1 at 4 ranks, 0 at 2): a yielding
# poll inside the backward hands the core to whatever else runs (measured
# at dp=2 under load 14: polling 82 ms per step yielding, 7 ms not).
# Not a test: the numbers move with the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=8 rounds=3 bucket=1048576
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --bucket) bucket=${2:?}; shift ;;
    -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dp_overlap.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MCC=$build/mcc MRUN=$build/mrun
[ -x "$MCC" ] && [ -x "$MRUN" ] || { echo "dp_overlap.sh: no mcc/mrun in $build" >&2; exit 2; }
CFG=(-D layers=4 -D d_model=256 -D heads=8 -D seq_len=128 -D vocab=256 -D batch=4 -D micro_batch=1 -D dropout=0)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TS_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
warm=2
layouts=("dp=2 ZeRO-1|2|--dp 2" "dp=2 no ZeRO|2|--dp 2 --no-zero" "dp=4 ZeRO-1|4|--dp 4" "tp=2 dp=2 ZeRO-1|4|--tp 2 --dp 2")
echo "| layout | buckets / step | exposed ring bytes / all (mcc) | step ms, overlapped | step ms, after the backward | waiting on the reduction ms/step, overlapped | ... after the backward | posting + polling ms/step (inside the backward) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for entry in "${layouts[@]}"; do
  IFS='|' read -r name ranks flags <<<"$entry"
  read -ra fl <<<"$flags"
  "$MCC" samples/gpt.mdl "${CFG[@]}" "${fl[@]}" -o "$TMP/p.plan"
  "$MCC" samples/gpt.mdl "${CFG[@]}" "${fl[@]}" --report comm --dp-bucket-size "$bucket" >"$TMP/rep"
  nb=$(awk '/^dp gradient reduction:/ { n++ } n == 1 && $1 ~ /^[0-9]+$/ && $2 == "micro" { c++ } END { print c + 0 }' "$TMP/rep")
  exp=$(sed -n 's/^  exposed after overlap: \([0-9]*\) of \([0-9]*\) ring bytes.*/\1 \/ \2/p' "$TMP/rep" | head -1)
  : >"$TMP/on.t"; : >"$TMP/off.t"; : >"$TMP/on.w"; : >"$TMP/off.w"; : >"$TMP/on.p"
  for ((r = 0; r < rounds; r++)); do
    for mode in on off; do
      extra=(--dp-bucket-size "$bucket"); [ $mode = off ] && extra=(--no-overlap-grad-reduce)
      OMPI_MCA_mpi_yield_when_idle=$((ranks > 2)) "$MRUN" "$TMP/p.plan" --gpus "$ranks" --steps $((warm + steps)) --metrics "$TMP/m.jsonl" "${extra[@]}" >"$TMP/out" 2>&1 ||
        { cat "$TMP/out" >&2; exit 1; }
      python3 - "$TMP/m.jsonl" "$warm" >>"$TMP/$mode.t" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "elapsed_s" in r]
w = int(sys.argv[2])
t = [r["elapsed_s"] for r in rows]
for a, b in zip(t[w:], t[w + 1:]):
    print(b - a)
PY
      line=$(grep "dp reduction" "$TMP/out" || true)
      n=$((warm + steps))
      if [ $mode = on ]; then
        echo "$line" | sed -n 's/.*update waited \([0-9.]*\) ms.*/\1/p' | awk -v n=$n '{ print $1 / n }' >>"$TMP/on.w"
        echo "$line" | sed -n 's/.*posting them took \([0-9.]*\) ms, polling them \([0-9.]*\) ms.*/\1 \2/p' |
          awk -v n=$n '{ print ($1 + $2) / n }' >>"$TMP/on.p"
      else
        echo "$line" | sed -n 's/.*update block, \([0-9.]*\) ms.*/\1/p' | awk -v n=$n '{ print $1 / n }' >>"$TMP/off.w"
      fi
    done
  done
  med() { sort -g "$1" | awk '{ a[NR] = $1 } END { if (!NR) { print "-"; exit } m = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2; printf "%.2f", m * f }' f="${2:-1}"; }
  echo "| $name | $nb | $exp | $(med "$TMP/on.t" 1000) | $(med "$TMP/off.t" 1000) | $(med "$TMP/on.w") | $(med "$TMP/off.w") | $(med "$TMP/on.p") |"
done
