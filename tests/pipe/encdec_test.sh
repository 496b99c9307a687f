#!/bin/bash
# encdec_test.sh - pipelines over several layer stacks (issue 24,
# deliverable 6; docs/pipeline.md "Several layer stacks"), compile time:
# samples/t5.mdl (an encoder stack, then a decoder stack whose every layer
# cross-attends to the encoder's output) is cut over both stacks in
# program order; the bytes each cut carries are the decoder's hidden state
# plus the encoder output it carries along (--report schedule's "sent" and
# --report comm's sends, against the closed form); --pp-stack NAME cuts one
# stack; a single-stack model's plan is the same byte for byte with
# --pp-stack naming its stack; the refusals, message for message.
#
# usage: encdec_test.sh MCC SRCDIR TMPDIR
set -u
MCC=$1 SRC=$2 TMP=$3
. "$SRC/tests/pipe/common.sh"
# b = 1 sequence per micro batch, h = 32, source and target 8 positions each, f32:
# one [b, 8, h] tensor is 1024 bytes
T5="-D enc_layers=2 -D dec_layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1"
GPT="-D layers=4 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1"

# the chunk row of chunk $2 in the schedule report $1: "units ... sent"
row() { grep -E "^  $2 +[0-9]+ " "$1"; }

# pp 2: the cut falls between the stacks; it carries the encoder output (1024 bytes)
run 0 "$SRC/samples/t5.mdl" $T5 --pp 2 --report schedule
has "$TMP/out" "partition of the repeat stacks 'enc_layers' (2 layers) then 'dec_layers' (2 layers), cut in that order"
row "$TMP/out" 0 | grep -qE "E \+ enc_layers 0-1 .* 1\.02k$" || die "pp 2 chunk 0: $(row "$TMP/out" 0)"
row "$TMP/out" 1 | grep -qE "dec_layers 0-1 \+ L .* -$" || die "pp 2 chunk 1: $(row "$TMP/out" 1)"
has "$TMP/out" "shared across pipeline ranks (gradients all-reduced in an embedding group): token_embedding.wte"

# pp 4: inside the decoder a cut carries the hidden state AND the encoder output (2 x 1024)
run 0 "$SRC/samples/t5.mdl" $T5 --pp 4 --report schedule
row "$TMP/out" 1 | grep -qE "enc_layers 1 .* 1\.02k$" || die "pp 4 chunk 1: $(row "$TMP/out" 1)"
row "$TMP/out" 2 | grep -qE "dec_layers 0 .* 2\.05k$" || die "pp 4 chunk 2: $(row "$TMP/out" 2)"
# what the compiled programs send per step (8 micro batches): forward 2 tensors out of
# chunk 2, backward 2 (the decoder's gradient and the encoder output's, summed in the chunk)
run 0 "$SRC/samples/t5.mdl" $T5 --pp 4 --report comm
grep -qE "^  fwd\.2 +send +pp +16 +16384 +16384$" "$TMP/out" || die "fwd.2 sends: $(grep send "$TMP/out")"
grep -qE "^  bwd\.3 +send +pp +16 +16384 +16384$" "$TMP/out" || die "bwd.3 sends: $(grep send "$TMP/out")"
grep -qE "^  fwd\.1 +send +pp +8 +8192 +8192$" "$TMP/out" || die "fwd.1 sends: $(grep send "$TMP/out")"

# --pp-stack dec_layers: the encoder rides whole with the first stage
run 0 "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-stack dec_layers --report schedule
row "$TMP/out" 0 | grep -qE "E \+ enc_layers 0-1 \+ dec_layers 0 .* 2\.05k$" || die "--pp-stack chunk 0: $(row "$TMP/out" 0)"
row "$TMP/out" 1 | grep -qE "dec_layers 1 \+ L " || die "--pp-stack chunk 1: $(row "$TMP/out" 1)"

# one stack: --pp-stack naming it changes nothing, byte for byte
run 0 "$SRC/samples/gpt.mdl" $GPT --pp 2 --vpp 2 -o "$TMP/a.plan"
run 0 "$SRC/samples/gpt.mdl" $GPT --pp 2 --vpp 2 --pp-stack layers -o "$TMP/b.plan"
cmp -s "$TMP/a.plan" "$TMP/b.plan" || die "--pp-stack layers changed gpt's plan"

# a Megatron layout counts the layers of both stacks in order
run 0 "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-layout "Et*3|tL" --report schedule
row "$TMP/out" 0 | grep -qE "E \+ enc_layers 0-1 \+ dec_layers 0 " || die "layout chunk 0: $(row "$TMP/out" 0)"

# a weight of the first stack's last layer read by the head after the second
# stack: a shared read (both ranks hold it, gradients summed), not a refusal
run 0 "$SRC/tests/pipe/tied_stacks.mdl" --pp 2 --report schedule
has "$TMP/out" "shared across pipeline ranks (gradients all-reduced in an embedding group): first.1.w"
row "$TMP/out" 0 | grep -qE "E \+ first 0-1 " || die "tied chunk 0: $(row "$TMP/out" 0)"

# refusals: the exact messages
refuse() {   # refuse "MESSAGE" args...
  local msg=$1; shift
  run 1 "$@" -o "$TMP/r.plan"
  [ "$(cat "$TMP/err")" = "mcc: error: $msg" ] || die "mcc $*: stderr '$(cat "$TMP/err")', expected 'mcc: error: $msg'"
  [ -e "$TMP/r.plan" ] && die "mcc $*: a refused plan was written"
  rm -f "$TMP/r.plan"
}
STACKS="'enc_layers' (2 layers) then 'dec_layers' (2 layers)"
refuse "--pp-stack decoder: the model has no repeat stack of that name; its stacks are $STACKS" \
  "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-stack decoder
refuse "pipeline: pp=4 x vpp=1 = 4 stages but --pp-stack dec_layers cuts only its 2 layers: every stage needs at least one of them (the stacks are $STACKS): drop --pp-stack to cut all 4 layers, or use at most 2 stages" \
  "$SRC/samples/t5.mdl" $T5 --pp 4 --pp-stack dec_layers
refuse "pipeline: pp=8 x vpp=1 = 8 stages but the stacks $STACKS have only 4 layers: every stage needs at least one layer (or say where they go with --pp-layout)" \
  "$SRC/samples/t5.mdl" $T5 --pp 8
refuse "--pp-stack and --pp-layers do not go together: --pp-layers already places every layer of every stack" \
  "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-stack dec_layers --pp-layers 2,2
refuse "--pp-stack and --pp-layout do not go together: --pp-layout already places every layer of every stack" \
  "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-stack enc_layers --pp-layout "Et*2|t*2L"
refuse "--pp-layout \"Et*2|t*3L\" has 5 transformer layers 't' but the model's stacks $STACKS have 4: each layer must be placed exactly once, the stacks' layers one after the other" \
  "$SRC/samples/t5.mdl" $T5 --pp 2 --pp-layout "Et*2|t*3L"
refuse "--vpp, --schedule, --pp-layers, --pp-layout, --pp-stack and --num-layers-per-virtual-pipeline-stage shape a pipeline, and pp=1; add --pp N with N > 1" \
  "$SRC/samples/t5.mdl" $T5 --pp-stack dec_layers
refuse "--pp-stack layer: the model has no repeat stack of that name; its stacks are 'layers' (4 layers)" \
  "$SRC/samples/gpt.mdl" $GPT --pp 2 --pp-stack layer
exit $fail
