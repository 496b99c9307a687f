#!/usr/bin/env bash
# e2e.sh - issue 20's acceptance: the tiny MODEL (the e2e configuration,
# tests/e2e) trained 200 steps on the bundled corpus in f32 and in bf16;
# the bf16 run's final loss is within 2% of the f32 run's.  Both runs read
# the same batches in the same order (same seed).
#   e2e.sh BIN_DIR SOURCE_DIR WORK_DIR MODEL
set -euo pipefail
bin=$1 src=$2 work=$3 model=$4
rm -rf "$work"; mkdir -p "$work"; cd "$work"
ln -s "$src/samples" samples
for p in f32 bf16; do
  "$bin/mcc" samples/$model.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 --precision $p -o $p.plan
  "$bin/mrun" $p.plan --cpu --steps 200 --metrics $p.jsonl --quiet 2>&1 | grep -v "no GPU driver" || true
done
python3 - <<'PY'
import json, sys
f = [json.loads(l)["loss"] for l in open("f32.jsonl")]
b = [json.loads(l)["loss"] for l in open("bf16.jsonl")]
if len(f) != 200 or len(b) != 200:
    sys.exit(f"FAIL: {len(f)} f32 and {len(b)} bf16 steps, expected 200")
rel = abs(b[-1] - f[-1]) / f[-1]
m10f, m10b = sum(f[-10:]) / 10, sum(b[-10:]) / 10
print(f"final loss: f32 {f[-1]:.4f}, bf16 {b[-1]:.4f}: {100 * rel:.2f}% apart (last 10 steps' mean {m10f:.4f} vs "
      f"{m10b:.4f}); first {f[0]:.4f} / {b[0]:.4f}")
if not rel <= 0.02:
    sys.exit("FAIL: the bf16 final loss is more than 2% from the f32 run's")
if not b[-1] < 0.6 * b[0]:
    sys.exit("FAIL: bf16 did not learn")
PY
