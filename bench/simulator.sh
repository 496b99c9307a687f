#!/usr/bin/env bash
# simulator.sh [--build DIR] [--hw FILE] [--steps N] [--only REGEX] - the step-time model
# (mcc --report time, docs/performance-model.md) against what mrun's CPU
# ranks measure, side by side in one run (issue 23, deliverable 5).
#
# The description is this host's, measured first by `mrun --calibrate`
# (2 ranks; or --hw FILE).  Each layout of a medium gpt (and the moe
# sample for ep) is compiled, predicted with `--report time --hw` for its
# ranks, and trained for N steps (default 12) on --mock-data; the measured
# step time is the median of the per-step times after the first two.
# Every run uses one thread per rank (as mrun runs several ranks).  Then
# the layout `mcc --auto-layout --gpus 2` chooses on the description,
# trained the same way; last the largest error, the predicted and measured
# rankings, and how far the auto-layout's choice is from the fastest
# measured layout.  Two 1-rank rows follow as a reference (one rank alone
# on the machine has the memory and caches to itself: not what the
# description describes).  --only REGEX runs only the rows whose name
# matches (e.g. 'dp=2' after a change to how dp is modelled; "auto" for the
# auto-layout's).  --paper instead predicts the published GPT runs of
# Narayanan et al. 2021 (bench/paper.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --paper ]; then shift; exec bash bench/paper.sh "$@"; fi
build=build hw="" steps=12 only=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --hw) hw=$2; shift ;;
    --steps) steps=$2; shift ;;
    --only) only=$2; shift ;;
    *) echo "simulator.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=1 TS_THREADS=1
if [ -z "$hw" ]; then
  hw=$TMP/cpu.hw
  "$build/mrun" --calibrate "$hw" --gpus 2 2>"$TMP/cal.log" || { cat "$TMP/cal.log"; exit 1; }
  grep '^calibrate:' "$TMP/cal.log" | sed 's/^/# /'
fi

GPT="samples/gpt.mdl -D layers=4 -D d_model=256 -D heads=8 -D seq_len=128 -D vocab=4096 -D batch=8 -D micro_batch=2"
MOE="samples/moe.mdl -D layers=2 -D d_model=128 -D heads=4 -D kv_heads=2 -D ffn=256 -D seq_len=128 -D batch=8 -D micro_batch=2 -D experts=4 -D topk=2"
printf '%-26s %5s %12s %12s %8s\n' layout ranks "predicted s" "measured s" error
: > "$TMP/rows"
# row NAME RANKS MODEL FLAGS...
row() {
  local name=$1 n=$2; shift 2
  if [ -n "$only" ] && ! [[ "$name" =~ $only ]]; then return; fi
  # shellcheck disable=SC2086
  "$build/mcc" $1 "${@:2}" --precision f32 -o "$TMP/p.plan" 2>"$TMP/err" || { echo "$name: $(cat "$TMP/err")"; return; }
  local pred meas
  # shellcheck disable=SC2086
  pred=$("$build/mcc" $1 "${@:2}" --precision f32 --report time --hw "$hw" --gpus "$n" -o - | sed -n 's/^step_time_s=\([^ ]*\).*/\1/p')
  "$build/mrun" "$TMP/p.plan" --gpus "$n" --steps "$steps" --mock-data --quiet --metrics "$TMP/m.jsonl" >/dev/null 2>&1
  meas=$(python3 - "$TMP/m.jsonl" <<'PY'
import json, sys
e = [json.loads(l)["elapsed_s"] for l in open(sys.argv[1]) if l.strip()]
d = sorted(b - a for a, b in zip(e[1:], e[2:]))
print("%.5g" % d[len(d) // 2])
PY
)
  local err
  err=$(python3 -c "print('%+.1f%%' % (100 * ($pred - $meas) / $meas))")
  printf '%-26s %5s %12s %12s %8s\n' "$name" "$n" "$pred" "$meas" "$err"
  echo "$name $pred $meas" >> "$TMP/rows"
}
row "tp=2" 2 "$GPT" --tp 2
row "tp=2 sp" 2 "$GPT" --tp 2 --sp
row "dp=2" 2 "$GPT"
row "dp=2 no-zero" 2 "$GPT" --no-zero
row "pp=2 1f1b" 2 "$GPT" --pp 2
row "pp=2 vpp=2 interleaved" 2 "$GPT" --pp 2 --vpp 2
row "cp=2" 2 "$GPT" --cp 2
row "cp=2 allgather" 2 "$GPT" --cp 2 --cp-attn allgather
row "moe ep=2" 2 "$MOE" --ep 2
row "moe dp=2" 2 "$MOE"
row "moe tp=2" 2 "$MOE" --tp 2
# the layout mcc --auto-layout picks for 2 ranks on this description, trained
if [ -z "$only" ] || [[ auto =~ $only ]]; then
"$build/mcc" $GPT --precision f32 --auto-layout --gpus 2 --hw "$hw" -o "$TMP/auto.plan" > "$TMP/auto.txt" 2>&1 || cat "$TMP/auto.txt"
auto=$(sed -n 's/^chosen: \(.*\) (mcc flags: \(.*\))$/\2/p' "$TMP/auto.txt")
# shellcheck disable=SC2086
[ -n "$auto" ] && only="" row "auto: $(sed -n 's/^chosen: \(.*\) (mcc flags.*/\1/p' "$TMP/auto.txt" | sed 's/ recompute=none//')" 2 "$GPT" $auto
fi
echo "# reference, not in the error: one rank alone on the machine (the description is of ranks running side by side)"
: > "$TMP/rows.ref"
mv "$TMP/rows" "$TMP/rows.keep"
row "one rank" 1 "$GPT"
row "moe one rank" 1 "$MOE"
mv "$TMP/rows.keep" "$TMP/rows"
python3 - "$TMP/rows" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
rows = [(" ".join(r[:-2]), float(r[-2]), float(r[-1])) for r in rows]
if not rows:
    sys.exit(0)
worst = max(abs(p - m) / m for _, p, m in rows)
print("largest error: %.1f%% over %d layouts of 2 ranks" % (100 * worst, len(rows)))
gpt = [r for r in rows if not r[0].startswith("moe") and not r[0].startswith("auto")]
bp = [r[0] for r in sorted(gpt, key=lambda r: r[1])]
bm = [r[0] for r in sorted(gpt, key=lambda r: r[2])]
print("gpt ranking, predicted: " + ", ".join(bp))
print("gpt ranking, measured:  " + ", ".join(bm))
auto = [r for r in rows if r[0].startswith("auto")]
if auto:
    best = min(r[2] for r in rows if not r[0].startswith("moe"))
    print("auto-layout's choice measured %.4g s: %+.1f%% from the fastest measured gpt layout (%.4g s)"
          % (auto[0][2], 100 * (auto[0][2] / best - 1), best))
PY
