#!/usr/bin/env bash
# memory.sh - peak memory of a GPT-2 training step: Tessera (mcc + mrun)
# against PyTorch CPU (bench/torch_step.py), f32, same sizes, same
# threads, side by side in one run.  Per system: the peak resident set of
# the whole process (/usr/bin/time -f %M: libraries, LLVM JIT and the
# torch library included) after two optimizer steps; for Tessera also what
# `mcc --report memory` plans (states, activation arena) and what mrun
# measured of its arena (TS_RT_MEMORY), which must be the same bytes.
# Prints a markdown table.
#
#   bench/memory.sh                 the issue's target: GPT-2 124M, B=4, T=256
#   bench/memory.sh --config tiny   seconds: checks the script itself
#   options: --config NAME (tiny, quick: T=64, full), --threads N (default 2),
#            --build DIR (mcc/mrun; default build)
# Not a test: no assertions, not in ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3            # Debian's python3: the only one with torch

cfg=full threads=2 build=build
while [ $# -gt 0 ]; do
  case $1 in
    --config) cfg=${2:?--config needs a name}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "memory.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "memory.sh: --threads must be a whole number >= 1" >&2; exit 2; }
case $cfg in
  tiny) read -r B T L E H V <<<"4 64 2 128 4 50304" ;;
  quick) read -r B T L E H V <<<"4 64 12 768 12 50304" ;;
  full) read -r B T L E H V <<<"4 256 12 768 12 50304" ;;
  *) echo "memory.sh: unknown config '$cfg' (tiny, quick, full)" >&2; exit 2 ;;
esac
MCC=$build/mcc MRUN=$build/mrun
for t in "$MCC" "$MRUN" /usr/bin/time "$PY"; do
  [ -x "$t" ] || { echo "memory.sh: '$t' not found (build Tessera first; /usr/bin/time is Debian's 'time' package)" >&2; exit 2; }
done
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads TS_THREADS=$threads
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DEFS=(-D batch="$B" -D micro_batch="$B" -D seq_len="$T" -D layers="$L" -D d_model="$E" -D heads="$H" -D vocab="$V")
"$MCC" samples/gpt.mdl -o "$TMP/gpt.plan" --precision f32 "${DEFS[@]}" 2>"$TMP/mcc.err" ||
  { echo "memory.sh: mcc failed:" >&2; cat "$TMP/mcc.err" >&2; exit 1; }
"$MCC" samples/gpt.mdl --report memory --precision f32 "${DEFS[@]}" >"$TMP/report" 2>"$TMP/mcc.err" ||
  { echo "memory.sh: mcc --report memory failed:" >&2; cat "$TMP/mcc.err" >&2; exit 1; }
row() { awk -v l="$1" 'index($0, "  " l) == 1 { print $(NF-1); exit }' "$TMP/report"; }
states=$(row "states total")
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }

: >"$TMP/rows"
for be in llvm ref; do
  echo "memory.sh: $cfg (B=$B T=$T layers=$L d_model=$E): Tessera --backend $be, 2 steps ..." >&2
  TS_RT_MEMORY=1 /usr/bin/time -f '%M' -o "$TMP/rss" "$MRUN" "$TMP/gpt.plan" --backend "$be" --steps 2 --quiet \
    >"$TMP/mrun.out" 2>"$TMP/mrun.err" || { echo "memory.sh: mrun failed:" >&2; tail -5 "$TMP/mrun.err" >&2; exit 1; }
  if [ "$be" = llvm ]; then arena=$(row "activation arena (largest block)"); else arena=$(row "activation arena, --backend ref"); fi
  # the highest arena byte any block's values occupied
  measured=$(sed -n 's/^rt memory: .* used \([0-9]*\) live .*/\1/p' "$TMP/mrun.err" | sort -n | tail -1)
  echo "Tessera-$be $states $arena ${measured:-?} $(tail -1 "$TMP/rss")" >>"$TMP/rows"
done
echo "memory.sh: PyTorch, 2 steps ..." >&2
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} /usr/bin/time -f '%M' -o "$TMP/rss" "$PY" bench/torch_step.py --batch "$B" \
  --seq "$T" --layers "$L" --d-model "$E" --heads "$H" --vocab "$V" --steps 1 --warmup 1 --threads "$threads" \
  >/dev/null 2>"$TMP/torch.err" || { echo "memory.sh: torch_step.py failed:" >&2; tail -5 "$TMP/torch.err" >&2; exit 1; }
echo "PyTorch - - - $(tail -1 "$TMP/rss")" >>"$TMP/rows"
torch_kib=$(tail -1 "$TMP/rss")

echo "| config | system | states, planned (GiB) | activation arena, planned (GiB) | arena, measured (GiB) | peak RSS (GiB) | RSS vs PyTorch |"
echo "|---|---|---:|---:|---:|---:|---:|"
while read -r sys st ar me kib; do
  f() { [ "$1" = - ] && echo "-" || gib "$1"; }
  ratio=$(awk -v a="$kib" -v b="$torch_kib" 'BEGIN { printf "%.2fx", a / b }')
  echo "| GPT-2 $L layers, B=$B, T=$T | $sys | $(f "$st") | $(f "$ar") | $( [ "$me" = - ] && echo - || { [ "$me" = "$ar" ] && echo "$(gib "$me") (=)" || echo "$(gib "$me") (differs!)"; }) | $(awk -v k="$kib" 'BEGIN { printf "%.2f", k / 1048576 }') | $ratio |"
done <"$TMP/rows"
echo
echo "- states = parameters + gradients + Adam m and v, exact bytes from the IR types; arena = the largest block's planned peak (mcc --report memory), measured by mrun (TS_RT_MEMORY); peak RSS = /usr/bin/time -f %M of the whole process, after 2 steps."
echo "- $threads threads, f32, $(date -u +%F); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs."
