#!/usr/bin/env bash
# cli_test.sh - runs the built mcc (and mrun) the way a user does.
#
#   cli_test.sh CASE MCC MRUN CLI_CHECK SRCDIR TMPDIR
#
# CASE is one of: usage, errors, parallel, options, full-gpt, full-llama,
# tiny-gpt, tiny-llama (one ctest each, see CMakeLists.txt).  The tiny
# cases hold the IR round-trip acceptance test: print -> parse -> print is
# identical for the sample after every pass, checked twice (mcc
# --verify-roundtrip, and cli_check on every --dump-ir=all file).
set -u
CASE=$1 MCC=$2 MRUN=$3 CHECK=$4 SRC=$5 TMP=$6
rm -rf "$TMP"
mkdir -p "$TMP"
cd "$SRC" || exit 1
FAILS=0

fail() { echo "FAIL [$CASE]: $*" >&2; FAILS=$((FAILS + 1)); }

# run EXPECTED_STATUS CMD...: runs CMD with stdout/stderr in $TMP/out, $TMP/err.
run() {
  local want=$1; shift
  "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    fail "exit $got (expected $want): $*"
    sed 's/^/    stderr: /' "$TMP/err" | head -20 >&2
    return 1
  fi
  return 0
}
# has FILE TEXT: FILE contains the fixed string TEXT.
has() { grep -qF -- "$2" "$1" || { fail "$1 lacks '$2'"; sed 's/^/    /' "$1" | head -10 >&2; }; }

TINY_GPT="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=2 -D micro_batch=2"
TINY_LLAMA="$TINY_GPT -D kv_heads=2 -D ffn=64"

case $CASE in
decay)
  # weight decay by role: the stdlib's biases and norm gains (every
  # parameter initialised to zeros or ones) are never decayed, whatever
  # their rank (attention's q/k/v biases are 2-D); every other parameter is
  for m in "gpt $TINY_GPT" "llama $TINY_LLAMA" "moe $TINY_LLAMA -D experts=4 -D topk=2 -D shared=2"; do
    set -- $m
    name=$1; shift
    run 0 "$MCC" "samples/$name.mdl" "$@" --emit=ir -o "$TMP/$name.ir" || continue
    n=$(grep -c '^state @.* param init=' "$TMP/$name.ir")
    [ "$n" -ge 5 ] || fail "$name: only $n parameters in the IR"
    bad=$(grep '^state @.* param init=' "$TMP/$name.ir" | awk '{
      role = ($0 ~ / init=(zeros|ones)/); nd = ($0 ~ / nodecay/)
      if (role != nd) print $2 (nd ? " is not decayed" : " is decayed") }')
    [ -z "$bad" ] || fail "$name: $bad"
  done
  ;;
megatron)
  # Megatron-LM's flags (docs/cli.md): the same plan, byte for byte, as
  # Tessera's own flags; the train flags as the train block's values
  mkdir -p "$TMP/a" "$TMP/b"
  cp samples/gpt.mdl "$TMP/b/gpt.mdl"
  sed -e 's/lr: 1e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1/lr: 3e-4, betas: (0.8, 0.9), eps: 1e-6, weight_decay: 0.01/' \
      -e 's/schedule = cosine(warmup: 20, min_lr: 1e-4)/schedule = linear(warmup: 5, min_lr: 3e-5, decay_steps: 90)/' \
      -e 's/clip_grad = 1.0/clip_grad = 0.5/; s/global_batch = batch/global_batch = 16/; s/steps = 200/steps = 100/' \
      -e 's/seed = 1234/seed = 7/' samples/gpt.mdl > "$TMP/a/gpt.mdl"
  cmp -s samples/gpt.mdl "$TMP/a/gpt.mdl" && fail "the sed did not change the train block of samples/gpt.mdl"
  SIZES="-D layers=4 -D d_model=64 -D heads=4 -D seq_len=32 -D micro_batch=2"
  ( cd "$TMP/a" && run 0 "$MCC" gpt.mdl --stdlib "$SRC/stdlib" $SIZES --tp 2 --sp --pp 2 --vpp 2 -o ours.plan ) &&
  ( cd "$TMP/b" && run 0 "$MCC" gpt.mdl --stdlib "$SRC/stdlib" --num-layers 4 --hidden-size=64 --num-attention-heads 4 \
      --seq-length 32 --micro-batch-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
      --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --use-distributed-optimizer \
      --lr 3e-4 --adam-beta1 0.8 --adam-beta2=0.9 --adam-eps 1e-6 --weight-decay 0.01 --lr-decay-style linear \
      --lr-warmup-iters 5 --min-lr 3e-5 --lr-decay-iters 90 --clip-grad 0.5 --global-batch-size 16 --train-iters 100 \
      --seed 7 -o megatron.plan ) &&
    { cmp -s "$TMP/a/ours.plan" "$TMP/b/megatron.plan" || fail "Megatron's flags give another plan than Tessera's"; }
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --tensor-model-parallel-size 2 -o "$TMP/mg.plan" &&
    run 0 "$MCC" samples/gpt.mdl $TINY_GPT --tp 2 -o "$TMP/tp.plan" &&
    { cmp -s "$TMP/mg.plan" "$TMP/tp.plan" || fail "--tensor-model-parallel-size 2 is not --tp 2"; }
  # refusals name the flag and what would work
  run 1 "$MCC" samples/moe.mdl --hidden-size 64 --num-layers 3 --ffn-hidden-size 32 --num-attention-heads 4 --lr 1 \
    --num-query-groups 2 --num-experts 4 --moe-router-topk 1 --seq-length 16 -D vocab=64 -D batch=2 -D micro_batch=2 \
    --pp 3 --num-layers-per-virtual-pipeline-stage 2 -o "$TMP/x.plan" &&
    has "$TMP/err" "--num-layers-per-virtual-pipeline-stage 2: the model's 3 layers over pp=3 stages do not make whole chunks of 2 layers"
  has "$TMP/err" "values that work: 1"
  run 1 "$MCC" tests/cli/../../samples/gpt.mdl $TINY_GPT --num-query-groups 2 -o "$TMP/x.plan" &&
    has "$TMP/err" "--num-query-groups sets the config key 'kv_heads', which this model does not have"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --num-layers 3 -o "$TMP/x.plan" &&
    has "$TMP/err" "--num-layers 3 and -D layers=2 both set the config key 'layers'"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --lr-decay-style noam -o "$TMP/x.plan" &&
    has "$TMP/err" "--lr-decay-style noam: the schedules are constant, cosine, linear, wsd (WSD) and inverse_sqrt"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --lr-decay-style WSD -o "$TMP/x.plan" &&
    has "$TMP/err" "the wsd schedule needs its final decay's length"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --optimizer adagrad -o "$TMP/x.plan" &&
    has "$TMP/err" "--optimizer adagrad: the optimizers are adamw (adam), sgd, lion and muon"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --optimizer sgd --sgd-momentum 0.8 --nesterov --emit=ir -o "$TMP/x.ir" &&
    has "$TMP/x.ir" "optimizer=sgd momentum=0.8 nesterov=1"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --lr -1 -o "$TMP/x.plan" && has "$TMP/err" "--lr -1 must be > 0"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --global-batch-size 3 -o "$TMP/x.plan" &&
    has "$TMP/err" "global_batch 3 (from the command line) is not a multiple of micro_batch 2"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --train-iters 2.5 -o "$TMP/x.plan" && has "$TMP/err" "--train-iters 2.5 must be an int >= 1"
  run 1 "$MCC" samples/gpt.mdl --seq-length abc -o "$TMP/x.plan" &&
    has "$TMP/err" "--seq-length abc: the value must be an int or float literal"
  run 2 "$MCC" samples/gpt.mdl --tensor-model-parallel-size 0 && has "$TMP/err" "--tensor-model-parallel-size expects a positive size, got '0'"
  run 2 "$MCC" samples/gpt.mdl --sequence-parallel=1 && has "$TMP/err" "option '--sequence-parallel' takes no value"
  run 2 "$MCC" samples/gpt.mdl --lr && has "$TMP/err" "option '--lr' needs an argument"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --num-layers-per-virtual-pipeline-stage 1 -o "$TMP/x.plan" &&
    has "$TMP/err" "shape a pipeline, and pp=1"
  # mrun: --train-iters is --steps
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT -o "$TMP/t.plan" &&
    run 0 "$MRUN" "$TMP/t.plan" --train-iters 2 --quiet --metrics "$TMP/m.jsonl" &&
    { [ "$(grep -c step "$TMP/m.jsonl")" = 2 ] || fail "mrun --train-iters 2 ran $(grep -c step "$TMP/m.jsonl") steps"; }
  ;;
usage)
  run 2 "$MCC" && has "$TMP/err" "no input file"
  run 2 "$MCC" samples/gpt.mdl --frobnicate && has "$TMP/err" "unknown option '--frobnicate'"
  run 2 "$MCC" samples/gpt.mdl --emit=exe && has "$TMP/err" "--emit must be plan, plan-text, ir or dot"
  run 2 "$MCC" samples/gpt.mdl -D layers && has "$TMP/err" "-D needs key=value"
  run 2 "$MCC" samples/gpt.mdl --tp && has "$TMP/err" "needs an argument"
  run 2 "$MCC" samples/gpt.mdl --dp-bucket-size 0 &&
    has "$TMP/err" "--dp-bucket-size expects a positive byte count (K, M, G suffixes) up to 2^47, got '0'"
  run 2 "$MCC" samples/gpt.mdl --ddp-bucket-size 1K &&
    has "$TMP/err" "--ddp-bucket-size expects a positive element count up to 2^47, got '1K'"
  run 2 "$MRUN" x.plan --dp-bucket-size 0 && has "$TMP/err" "--dp-bucket-size needs a whole number in [1, 140737488355328], got '0'"
  run 2 "$MCC" samples/gpt.mdl --tp zero && has "$TMP/err" "expected a positive size"
  run 2 "$MCC" samples/gpt.mdl --precision bf8 && has "$TMP/err" "f32, f64, bf16 or fp16"
  run 2 "$MCC" samples/gpt.mdl samples/llama.mdl && has "$TMP/err" "more than one input file"
  for b in -1 12Q 1T "" 99999999999G; do
    run 2 "$MCC" samples/gpt.mdl --activation-budget "$b" && has "$TMP/err" "--activation-budget expects a byte count"
  done
  run 2 "$MCC" samples/gpt.mdl --regather --activation-budget 8M && has "$TMP/err" "give one of them"
  run 2 "$MCC" samples/gpt.mdl --keep-gathered --regather && has "$TMP/err" "give one of them"
  run 2 "$MCC" samples/gpt.mdl --print-ir-after=autodif &&
    has "$TMP/err" "unknown pass 'autodif'" && has "$TMP/err" "frontend, partition, autodiff, shard, precision, fp8, remat, pipeline, wsplit, zero3, optimizer, eval, decode, dce"
  run 0 "$MCC" --help && has "$TMP/out" "usage: mcc FILE.mdl" && has "$TMP/out" "--dump-ir=all DIR"
  run 0 "$MCC" --version && has "$TMP/out" "plan format 4"
  run 1 "$MCC" "$TMP/missing.mdl" && has "$TMP/err" "cannot open '$TMP/missing.mdl'"
  ;;
errors)
  run 1 "$MCC" samples/gpt.mdl -D no_such_key=3 -o "$TMP/x.plan" && has "$TMP/err" "no_such_key"
  [ -e "$TMP/x.plan" ] && fail "a plan was written despite the error"
  printf 'import nn\nconfig {\n  d = 4 +\n}\n' >"$TMP/syntax.mdl"
  run 1 "$MCC" "$TMP/syntax.mdl" -o "$TMP/y.plan" && has "$TMP/err" "syntax.mdl:3:" && has "$TMP/err" "error:"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT -o "$TMP/no/such/dir/g.plan" && has "$TMP/err" "mcc: error: cannot write '$TMP/no/such/dir/g.plan': No such file or directory"
  # parameters the loss does not depend on would never train: refused by name
  printf 'model m(x: [b=2, n=4]) {\n  g = param [n] init ones\n  h = param [n] init ones\n  k = param [n] init ones\n  return sum(x * g)\n}\n' >"$TMP/unused.mdl"
  run 1 "$MCC" "$TMP/unused.mdl" -o "$TMP/u.plan" && has "$TMP/err" "parameter @h (and 1 more) does not influence the loss"
  ;;
parallel)
  # the plan's mesh is (dp, pp, cp, ep, tp) of the layout; every rank runs program 0
  LAY="-D batch=4 -D micro_batch=1"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT $LAY --tp 2 --dp 2 --sp --emit=plan-text -o "$TMP/tp.txt" &&
    has "$TMP/tp.txt" "mesh dp=2 pp=1 cp=1 ep=1 tp=2" && has "$TMP/tp.txt" "ranks 4" &&
    has "$TMP/tp.txt" "rank 3 program 0" && has "$TMP/tp.txt" "parallel tp=2 pp=1 cp=1 ep=1 dp=2 sp=1 zero=1"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --tp 2 -o "$TMP/tp.plan" && [ -s "$TMP/tp.plan" ] || fail "no tp=2 plan"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT $LAY --dp 4 --no-zero --emit=ir && has "$TMP/out" "dp=4 sp=0 zero=0"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --tp 2 --sp --emit=ir && has "$TMP/out" "parallel tp=2 pp=1 cp=1 ep=1 dp=0 sp=1"
  # refusals: too few micro batches for a pipeline, sp without tp, sizes that do not divide
  run 1 "$MCC" samples/llama.mdl $TINY_LLAMA --pp 2 --emit=plan-text &&
    has "$TMP/err" "mcc: error: --schedule 1f1b with pp=2 needs at least 2 micro batches per step, and there are 1"
  run 0 "$MCC" samples/llama.mdl $TINY_LLAMA --cp 2 --emit=ir && has "$TMP/out" "all_gather" &&
    has "$TMP/out" "parallel tp=1 pp=1 cp=2"
  run 1 "$MCC" samples/llama.mdl $TINY_LLAMA -D seq_len=6 --cp 2 && has "$TMP/err" "dim 'seq' = 6 is not divisible by 2 x cp = 4"
  # --ep on a model without experts splits nothing: refused, with what would work
  run 1 "$MCC" samples/llama.mdl $TINY_LLAMA --ep 2 --emit=ir && has "$TMP/err" "ep = 2 splits nothing" &&
    has "$TMP/err" "For data parallelism use --dp 2"
  run 0 "$MCC" samples/moe.mdl -D layers=1 --ep 2 --emit=ir && has "$TMP/out" "parallel tp=1 pp=1 cp=1 ep=2"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --sp -o "$TMP/sp.plan" && has "$TMP/err" "mcc: error: sequence parallelism" &&
    has "$TMP/err" "tp=1"
  [ -e "$TMP/sp.plan" ] && fail "an sp plan without tp was written"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --dp 2 && has "$TMP/err" "dp=2 does not divide the 1 micro batches"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT -D heads=2 --tp 4 -o "$TMP/h.plan" &&
    has "$TMP/err" "mcc: error: shard: dim 'heads' = 2 is not divisible by tp = 4"
  [ -e "$TMP/h.plan" ] && fail "a plan with heads not divisible by tp was written"
  run 2 "$MCC" samples/gpt.mdl --steps 3 && has "$TMP/err" "--steps and --gpus go with --check"
  run 2 "$MCC" samples/gpt.mdl --check --report memory && has "$TMP/err" "do not go together"
  run 2 "$MCC" samples/gpt.mdl --report speed && has "$TMP/err" "--report must be memory, comm, sharding, schedule, time or kernels"
  ;;
options)
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --precision f64 --emit=ir &&
    has "$TMP/out" "precision=f64" && has "$TMP/out" "state @token_embedding.wte : f64[vocab:256, dim:32] param"
  run 1 "$MCC" samples/gpt.mdl $TINY_GPT --stdlib "$TMP/nowhere" && has "$TMP/err" "cannot find module 'nn'"
  mkdir -p "$TMP/lib" && cp stdlib/nn.mdl "$TMP/lib/"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --stdlib "$TMP/lib" --emit=ir -o "$TMP/a.ir"
  run 0 "$MCC" samples/gpt.mdl -Dlayers=2 -Dd_model=32 -Dheads=4 -Dseq_len=16 -Dvocab=256 -Dbatch=2 -Dmicro_batch=2 \
    --emit=ir -o "$TMP/b.ir"
  cmp -s "$TMP/a.ir" "$TMP/b.ir" || fail "-Dkey=value and --stdlib change the IR"
  run 0 "$MCC" samples/gpt.mdl $TINY_GPT --no-verify --emit=ir -o "$TMP/c.ir"
  cmp -s "$TMP/a.ir" "$TMP/c.ir" || fail "--no-verify changes the IR"
  ;;
full-gpt|full-llama)
  # default (full-size) config: the IR only, nothing is allocated
  m=${CASE#full-}
  run 0 "$MCC" samples/$m.mdl -o "$TMP/$m.plan" --verify-roundtrip --stats --time --dump-ir=all "$TMP/dump" &&
    has "$TMP/err" "parameters in" && has "$TMP/err" "time: total"
  run 0 "$CHECK" plan "$TMP/$m.plan"
  run 0 "$CHECK" ir "$TMP"/dump/*.ir
  [ "$(ls "$TMP/dump" | wc -l)" = 15 ] || fail "expected 15 dumps: $(ls "$TMP/dump")"
  # -o - writes the same binary plan to stdout
  run 0 "$MCC" samples/$m.mdl -o - && cmp -s "$TMP/out" "$TMP/$m.plan" || fail "-o - differs from the plan file"
  head -c 6 "$TMP/$m.plan" | grep -q TSPLAN || fail "$m.plan does not start with the magic"
  ;;
tiny-gpt|tiny-llama)
  m=${CASE#tiny-}
  if [ "$m" = gpt ]; then DEFS=$TINY_GPT; else DEFS=$TINY_LLAMA; fi
  # every pass: --verify-roundtrip inside mcc, then the dumps checked here
  run 0 "$MCC" samples/$m.mdl $DEFS -o "$TMP/$m.plan" --verify-roundtrip --verify-each --dump-ir=all "$TMP/dump"
  dumps=$(ls "$TMP/dump" | tr '\n' ' ')
  [ "$dumps" = "00-frontend.ir 01-partition.ir 02-autodiff.ir 03-shard.ir 04-precision.ir 05-fp8.ir 06-remat.ir 07-pipeline.ir 08-wsplit.ir 09-zero3.ir 10-optimizer.ir 11-eval.ir 12-decode.ir 13-dce.ir 14-fuse.ir " ] || fail "dump files: $dumps"
  run 0 "$CHECK" ir "$TMP"/dump/*.ir
  has "$TMP/dump/00-frontend.ir" "block forward {"
  has "$TMP/dump/13-dce.ir" "block micro {"
  has "$TMP/dump/13-dce.ir" "block update {"
  # the final IR: --emit=ir equals the last dump
  run 0 "$MCC" samples/$m.mdl $DEFS --emit=ir -o "$TMP/final.ir"
  cmp -s "$TMP/final.ir" "$TMP/dump/14-fuse.ir" || fail "--emit=ir differs from the last dump"
  has "$TMP/dump/14-fuse.ir" " group=1"
  # --print-ir-after prints parseable IR of that pass to stdout
  run 0 "$MCC" samples/$m.mdl $DEFS --print-ir-after=autodiff -o "$TMP/p.plan" &&
    has "$TMP/out" "# IR after pass 'autodiff'" && has "$TMP/out" "block micro {"
  tail -n +2 "$TMP/out" >"$TMP/after-autodiff.ir"
  cmp -s "$TMP/after-autodiff.ir" "$TMP/dump/02-autodiff.ir" || fail "--print-ir-after=autodiff differs from 02-autodiff.ir"
  # graphviz accepts the dot output (one layer, and dot's cheapest layout
  # settings: full crossing minimization takes over a minute for 2 layers)
  run 0 "$MCC" samples/$m.mdl ${DEFS/layers=2/layers=1} --emit=dot -o "$TMP/$m.dot"
  if command -v dot >/dev/null; then
    dot -Tsvg -Gmclimit=0.1 -Gnslimit=1 -Gsplines=line "$TMP/$m.dot" -o "$TMP/$m.svg" 2>"$TMP/dot.err" ||
      fail "dot -Tsvg rejects the output: $(head -3 "$TMP/dot.err")"
    grep -q "<svg" "$TMP/$m.svg" || fail "no svg produced"
  else
    fail "graphviz (dot) is not installed (tools/setup.sh installs it)"
  fi
  # the text plan: same plan as the binary one, re-prints identically, and trains
  run 0 "$MCC" samples/$m.mdl $DEFS --emit=plan-text -o "$TMP/$m.plan.txt"
  head -1 "$TMP/$m.plan.txt" | grep -qx "tessera-plan 4" || fail "plan text header: $(head -1 "$TMP/$m.plan.txt")"
  run 0 "$CHECK" plan "$TMP/$m.plan" "$TMP/$m.plan.txt"
  run 0 "$CHECK" same-plan "$TMP/$m.plan" "$TMP/$m.plan.txt"
  # mrun trains from the text plan; the loss of a fresh byte-level model is
  # near ln(256) = 5.55
  if run 0 "$MRUN" "$TMP/$m.plan.txt" --steps 2 --quiet --metrics "$TMP/metrics.jsonl"; then
    [ "$(grep -c '"loss"' "$TMP/metrics.jsonl")" = 2 ] || fail "mrun did not report 2 steps"
    awk -F'"loss": ' 'NR == 1 {split($2, a, ","); exit !(a[1] > 4.5 && a[1] < 6.5)}' "$TMP/metrics.jsonl" ||
      fail "first loss is not near ln(256): $(head -1 "$TMP/metrics.jsonl")"
  fi
  # a text plan whose train line was edited after compiling (the loss
  # gradient is scaled for the compiled micro-batch count) is refused
  sed 's/global_batch=[0-9]*/global_batch=4194312/' "$TMP/$m.plan.txt" >"$TMP/edited.plan.txt"
  run 1 "$MRUN" "$TMP/edited.plan.txt" --steps 1 --quiet &&
    { grep -q "the plan was edited after compiling" "$TMP/err" || fail "edited global_batch: $(cat "$TMP/err")"; }
  # the default output name: FILE.mdl -> FILE.plan
  cp samples/$m.mdl "$TMP/copy.mdl"
  run 0 "$MCC" "$TMP/copy.mdl" $DEFS && [ -s "$TMP/copy.plan" ] || fail "default output $TMP/copy.plan missing"
  ;;
*)
  echo "cli_test.sh: unknown case '$CASE'" >&2
  exit 2
  ;;
esac

if [ "$FAILS" -gt 0 ]; then
  echo "cli_test.sh $CASE: $FAILS failures" >&2
  exit 1
fi
echo "cli_test.sh $CASE: ok"
