#!/usr/bin/env bash
# backends.sh - a bf16 plan trained 3 steps on the reference kernels and on
# the LLVM backend (fused kernels that load and store bf16, BLAS GEMMs):
# the saved parameters are byte for byte the same, and so are the losses.
# The reference rounds to bf16 at exactly the casts pass precision placed;
# the generated kernels round at the same points, in registers.
#   backends.sh BIN_DIR WORK MDL [mcc -D options...]
set -euo pipefail
bin=$1 work=$2 mdl=$3
shift 3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin/mcc" "$mdl" "$@" --precision bf16 -o b.plan
for be in ref llvm; do
  "$bin/mrun" b.plan --cpu --steps 3 --backend $be --metrics $be.jsonl --save-params $be.params --quiet 2>&1 |
    grep -v "no GPU driver" || true
done
cmp ref.params llvm.params || { echo "FAIL: the LLVM backend's parameters differ from the reference's" >&2; exit 1; }
python3 - <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open("ref.jsonl")]
b = [json.loads(l)["loss"] for l in open("llvm.jsonl")]
if len(a) != 3 or a != b:
    sys.exit(f"FAIL: losses differ: ref {a}, llvm {b}")
print("ok: 3 bf16 steps, losses", a, "bit-identical on both backends, parameters byte for byte")
PY
