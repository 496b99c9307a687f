#!/usr/bin/env bash
# ckpt_save.sh - what a checkpoint save costs the training loop: mrun
# --save with --save-interval, synchronous and --async-save, side by side in
# one run, on the same plan.  Prints a markdown table: the states per rank,
# the median step time of the steps after which nothing was saved, the time
# training waited per save, and (async) the part of it spent copying the
# states to host buffers; then the same saves' files compared (they must be
# identical: the async save writes what the synchronous one writes).
#
#   bench/ckpt_save.sh [--build DIR] [--gpus N] [--steps N] [--interval N]
#                      [-D name=value ...]   (model sizes, samples/gpt.mdl)
#   defaults: --build build, --gpus 1, --steps 12, --interval 3,
#             layers=4 d_model=512 heads=8 seq_len=64 vocab=256 batch=4 micro_batch=2
#
# Not a test: no assertions beyond the files being identical, not in ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build gpus=1 steps=12 interval=3 defs=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --gpus) gpus=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --interval) interval=${2:?}; shift ;;
    -D) defs+=(-D "${2:?}"); shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ckpt_save.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MCC=$build/mcc MRUN=$build/mrun
for t in "$MCC" "$MRUN"; do [ -x "$t" ] || { echo "ckpt_save.sh: '$t' not found (build first)" >&2; exit 2; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
flags=(-D layers=4 -D d_model=512 -D heads=8 -D seq_len=64 -D vocab=256 -D batch=4 -D micro_batch=2 -D dropout=0)
dp=()
[ "$gpus" -gt 1 ] && dp=(--dp "$gpus")
"$MCC" samples/gpt.mdl "${flags[@]}" "${defs[@]}" "${dp[@]}" -o "$tmp/p.plan" 2> "$tmp/mcc.txt" ||
  { cat "$tmp/mcc.txt" >&2; exit 1; }
# median of the step times (elapsed_s differences) of steps not followed by a save
median_plain() {
  awk -v k="$interval" '{ match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
         match($0, /"elapsed_s": [0-9.e+-]+/); e = substr($0, RSTART + 13, RLENGTH - 13) + 0
         if (s > 1 && (s - 1) % k != 0) print e - prev; prev = e }' "$1" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
echo "| save | ranks | states per rank (MB) | step, no save (s) | saves | waited per save (s) | copying, per save (s) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for mode in none sync async; do
  args=()
  case $mode in sync) args=(--save "$tmp/ck_sync" --save-interval "$interval") ;;
                async) args=(--save "$tmp/ck_async" --save-interval "$interval" --async-save) ;; esac
  "$MRUN" "$tmp/p.plan" --gpus "$gpus" --steps "$steps" --metrics "$tmp/$mode.jsonl" "${args[@]}" > "$tmp/$mode.txt" 2>&1 ||
    { tail -3 "$tmp/$mode.txt" >&2; exit 1; }
  mb=-
  [ -d "$tmp/ck_$mode" ] && mb=$(du -bc "$tmp/ck_$mode"/iter_"$(printf %07d "$interval")"/rank_00000.bin | awk 'END { printf "%.1f", $1 / 1e6 }')
  line=$(sed -n 's/.*checkpoints\{0,1\} during training (\([a-z]*\)): training waited \([0-9.]*\) s per save\(, of which \([0-9.]*\) s.*\)\{0,1\}/\2 \4/p' "$tmp/$mode.txt")
  n=$(grep -o '^mrun: [0-9]* checkpoint' "$tmp/$mode.txt" | grep -o '[0-9]*' || echo 0)
  read -r waited copied <<< "${line:-- -}"
  echo "| $mode | $gpus | $mb | $(printf %.4f "$(median_plain "$tmp/$mode.jsonl")") | $n | $waited | ${copied:--} |"
done
same=identical
for f in "$tmp"/ck_sync/iter_*/rank_*.bin; do cmp -s "$f" "${f/ck_sync/ck_async}" || same="DIFFERENT ($f)"; done
echo
echo "the shard files of the synchronous and the asynchronous saves: $same"
