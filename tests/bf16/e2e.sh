#!/usr/bin/env bash
# e2e.sh - issue 20's acceptance: the tiny MODEL (the e2e configuration,
# tests/e2e) trained STEPS steps (default 200) on the bundled corpus in f32
# and in each 16-bit PRECISION (default bf16; an entry may carry mcc flags
# after commas, e.g. fp16,--initial-loss-scale,65536, and a shorter run
# after @, e.g. fp16@100); each one's final loss is within 2% of the f32
# run's loss at that step and below 0.6 of its first (it learned).  All
# runs read the same batches in the same order (same seed), and a shorter
# run's losses are the longer one's first (the schedule is the plan's, not
# --steps'), so one f32 run serves them all.  E2E_F32_RUN=DIR: the f32 run
# is tests/e2e's (DIR/x.plan, DIR/m.jsonl: the same command), taken when
# its plan is byte for byte the one compiled here and it ran STEPS steps.
#   e2e.sh BIN_DIR SOURCE_DIR WORK_DIR MODEL [STEPS [PRECISION...]]
set -euo pipefail
bin=$1 src=$2 work=$3 model=$4 steps=${5:-200}
shift $(($# < 5 ? $# : 5))
precs=("$@")
[ ${#precs[@]} -gt 0 ] || precs=(bf16)
rm -rf "$work"; mkdir -p "$work"; cd "$work"
ln -s "$src/samples" samples
names=()
for e in f32 "${precs[@]}"; do
  p=${e%%,*} flags=() n=$steps
  [ "$e" = "$p" ] || IFS=, read -r -a flags <<<"${e#*,}"
  if [[ $p = *@* ]]; then n=${p#*@} p=${p%@*}; fi
  name=$p   # bf16 and "bf16 --fp8 hybrid" are two runs: --fp8 names its own
  [[ " ${flags[*]} " = *" --fp8 "* ]] && name=${p}_fp8
  names+=("$name:$n")
  "$bin/mcc" samples/$model.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 --precision $p "${flags[@]}" -o $name.plan
  f32run=${E2E_F32_RUN:-}
  if [ "$e" = f32 ] && [ -n "$f32run" ] && cmp -s "$f32run/x.plan" f32.plan &&
     [ "$(wc -l < "$f32run/m.jsonl" 2>/dev/null)" = "$n" ]; then
    cp "$f32run/m.jsonl" f32.jsonl
    echo "f32: the run of $f32run (the same plan, $n steps)"
    continue
  fi
  "$bin/mrun" $name.plan --cpu --steps "$n" --metrics $name.jsonl --quiet 2>&1 | grep -v "no GPU driver" || true
done
python3 - "$steps" "${names[@]:1}" <<'PY'
import json, sys
f = [json.loads(l)["loss"] for l in open("f32.jsonl")]
if len(f) != int(sys.argv[1]):
    sys.exit(f"FAIL: {len(f)} f32 steps, expected {sys.argv[1]}")
bad = 0
for e in sys.argv[2:]:
    p, n = e.rsplit(":", 1)
    n = int(n)
    rows = [json.loads(l) for l in open(p + ".jsonl")]
    b = [r["loss"] for r in rows]
    if len(b) != n or n > len(f):
        sys.exit(f"FAIL: {len(b)} {p} steps, expected {n} (and at most the f32 run's {len(f)})")
    fn = f[:n]
    rel = abs(b[-1] - fn[-1]) / fn[-1]
    m10f, m10b = sum(fn[-10:]) / 10, sum(b[-10:]) / 10
    skips = f", {int(rows[-1]['skipped_steps'])} steps skipped, final loss scale {rows[-1]['loss_scale']:g}" \
        if "skipped_steps" in rows[-1] else ""
    print(f"loss at step {n}: f32 {fn[-1]:.4f}, {p} {b[-1]:.4f}: {100 * rel:.2f}% apart (last 10 steps' mean "
          f"{m10f:.4f} vs {m10b:.4f}); first {f[0]:.4f} / {b[0]:.4f}{skips}")
    if not rel <= 0.02:
        print(f"FAIL: the {p} loss at step {n} is more than 2% from the f32 run's")
        bad = 1
    if not b[-1] < 0.6 * b[0]:
        print(f"FAIL: {p} did not learn")
        bad = 1
sys.exit(bad)
PY
