#!/usr/bin/env bash
# run_sample.sh - builds Tessera (tools/setup.sh), compiles samples/gpt.mdl
# at a small size and trains it on the bundled corpus (samples/data/kjv.txt,
# byte-level tokens) with the CPU reference runtime, printing one progress
# line per step.  Extra arguments go to mrun, e.g.
#   tools/run_sample.sh --steps 50
# The size (4 layers, d_model 128, 4 heads, 128-token context, byte vocab,
# 8 sequences per step) is chosen to learn visibly within a few minutes on
# 2 cores (about 0.35 s per step on an idle 2-core machine).  A later --data
# overrides the bundled corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "run_sample: checking packages and building (tools/setup.sh; quiet unless something fails)"
bash tools/setup.sh
bdir=${TESSERA_BUILD_DIR:-build}

out=$(mktemp -d "${TMPDIR:-/tmp}/tessera-sample.XXXXXX")
trap 'rm -rf "$out"' EXIT

echo "run_sample: compiling samples/gpt.mdl (4 layers, d_model 128, 4 heads, seq_len 128, vocab 256)"
"$bdir/mcc" samples/gpt.mdl -D layers=4 -D d_model=128 -D heads=4 -D seq_len=128 -D vocab=256 \
    -D batch=8 -D micro_batch=8 -o "$out/gpt.plan"
echo "run_sample: training on samples/data/kjv.txt (byte-level tokens; 8 sequences per step)"
"$bdir/mrun" "$out/gpt.plan" --data samples/data/kjv.txt "$@"
