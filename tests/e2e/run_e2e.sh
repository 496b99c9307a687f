#!/usr/bin/env bash
# run_e2e.sh - one end-to-end training run, exactly as the acceptance
# criterion states it, then the metrics check.
#   run_e2e.sh BIN_DIR SOURCE_DIR WORK_DIR MODEL [MCC_OPTION ...]
# BIN_DIR holds mcc and mrun (put first on PATH); the command runs in
# WORK_DIR, where `samples` links to SOURCE_DIR/samples so that the
# command's relative paths (samples/MODEL.mdl, the default corpus
# samples/data/kjv.txt) resolve and x.plan / m.jsonl stay out of the source tree.
set -euo pipefail
bin=$1 src=$2 work=$3 model=$4
shift 4   # the rest: extra mcc options (bert: its byte-level vocab)
rm -rf "$work"
mkdir -p "$work"
ln -s "$src/samples" "$work/samples"
cd "$work"
export PATH="$bin:$PATH"

t0=$SECONDS
# the depth: -D layers=2, or E2E_LAYERS (t5: its two stacks' depths)
# shellcheck disable=SC2086
mcc samples/$model.mdl ${E2E_LAYERS:--D layers=2} -D d_model=64 -D heads=4 -D seq_len=64 "$@" -o x.plan && mrun x.plan --steps 200 --metrics m.jsonl
echo "e2e: $model compiled and trained in $((SECONDS - t0)) s wall; CPU time (user, system) of mcc + mrun:"
times >times.txt    # (no pipe: a subshell would have no children)
tail -n 1 times.txt # children's times: meaningful even when the machine is shared

exec /usr/bin/python3 "$src/tests/e2e/check_metrics.py" m.jsonl 200
