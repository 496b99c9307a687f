#!/usr/bin/env bash
# run_sample.sh - builds Tessera (tools/setup.sh), compiles a sample model
# at a small size and trains it on the bundled corpus (samples/data/kjv.txt)
# with the CPU reference runtime, printing one progress line per step.
#
#   tools/run_sample.sh [mrun options]
#       samples/gpt_packed.mdl on BPE tokens: the corpus is tokenized with
#       samples/tokenizer/tokenizer.json (8192 ids) into Megatron's indexed
#       dataset on first use (tools/mprep --append-eod, one document per
#       chapter, into $TESSERA_BUILD_DIR/sample-data, never the source
#       tree), then trained as packed sequences: --split 949,50,1,
#       --reset-position-ids --reset-attention-mask --eod-mask-loss
#       (docs/data.md "Packed sequences"), the loss on 4 batches of the
#       validation split every 20 steps (val_loss in the progress line)
#   tools/run_sample.sh --bytes [mrun options]
#       samples/gpt.mdl on byte-level tokens (one token per byte, vocab 256)
#   (--packed: the default, accepted for older scripts)
#
# Extra arguments go to mrun, e.g.  tools/run_sample.sh --steps 50
# The size (4 layers, d_model 128, 4 heads, 128-token context, 8 sequences
# per step) is chosen to learn visibly within a few minutes on 2 cores
# (byte-level: about 0.35 s per step on an idle 2-core machine).  A later
# --data overrides the bundled corpus (byte-level run).
set -euo pipefail
cd "$(dirname "$0")/.."

packed=1
case "${1:-}" in
  --bytes) packed=0; shift ;;
  --packed) shift ;;
esac

echo "run_sample: checking packages and building (tools/setup.sh; quiet unless something fails)"
bash tools/setup.sh
bdir=${TESSERA_BUILD_DIR:-build}

out=$(mktemp -d "${TMPDIR:-/tmp}/tessera-sample.XXXXXX")
trap 'rm -rf "$out"' EXIT
size=(-D layers=4 -D d_model=128 -D heads=4 -D seq_len=128 -D batch=8 -D micro_batch=8)

if [ "$packed" = 0 ]; then
  echo "run_sample: compiling samples/gpt.mdl (4 layers, d_model 128, 4 heads, seq_len 128, vocab 256)"
  "$bdir/mcc" samples/gpt.mdl "${size[@]}" -D vocab=256 -o "$out/gpt.plan"
  echo "run_sample: training on samples/data/kjv.txt (byte-level tokens; 8 sequences per step)"
  "$bdir/mrun" "$out/gpt.plan" --data samples/data/kjv.txt "$@"
  exit
fi

tok=samples/tokenizer/tokenizer.json
data="$bdir/sample-data"
prefix="$data/kjv_bpe"
if [ ! -f "$prefix.bin" ] || [ ! -f "$prefix.idx" ]; then
  echo "run_sample: first use: tokenizing samples/data/kjv.txt with $tok into $prefix.bin/.idx"
  mkdir -p "$data"
  "$bdir/mprep" --input samples/data/kjv.txt --output-prefix "$prefix" --tokenizer "$tok" --append-eod \
      --workers 2 --quiet
fi
echo "run_sample: compiling samples/gpt_packed.mdl (4 layers, d_model 128, 4 heads, seq_len 128, vocab 8192)"
"$bdir/mcc" samples/gpt_packed.mdl "${size[@]}" -D vocab=8192 -o "$out/gpt_packed.plan"
echo "run_sample: training on $prefix (BPE tokens, chapters packed into rows of 128; 8 sequences per step)"
"$bdir/mrun" "$out/gpt_packed.plan" --data-path "$prefix" --split 949,50,1 \
    --data-cache-path "$data/cache" --tokenizer "$tok" \
    --reset-position-ids --reset-attention-mask --eod-mask-loss --eval-interval 20 --eval-iters 4 "$@"
