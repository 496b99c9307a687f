#!/usr/bin/env bash
# plan_quality.sh [--build DIR] - what a compiled plan costs, per
# transformer layer, next to Megatron's hand-written equivalent: bytes each
# rank sends and activation bytes it holds; last, each pipeline schedule's
# bubble and stash (1f1b, interleaved, zb-h1; formulas above that table).  Compile only (mcc --report
# comm / --report memory), so every figure is exact and the script takes
# seconds.  Per-layer figures are differences: the model compiled with 3
# layers minus the same with 2 (one micro batch of one sequence per step,
# so the embedding, head and loss cancel).
#
# Closed forms (E = bytes per element, s = sequence, b = micro batch,
# h = d_model, a = heads, t = tp):
#   comm, tp: 8 (t-1)/t s b h E per layer per micro batch: two all-reduces
#     forward and two backward (ring: 2 (t-1)/t each) (Narayanan et al.
#     2021).  tp + sp: four all-gathers and four reduce-scatters of the same
#     tensors, the same bytes (Korthikanti et al. 2022, sec. 4.2.2), plus
#     what Megatron-LM's implementation adds: the backward of each
#     column-parallel linear (QKV, MLP in) all-gathers its input again for
#     the weight gradient instead of keeping the gathered copy, 2 (t-1)/t
#     s b h E more: 10 (t-1)/t s b h E.  Tessera's cost model (pass remat:
#     bytes sent first, then bytes held) keeps the gathered copies by
#     default (tp's bytes, more memory); the rows "sp regather" are
#     `--regather`, Megatron's choice (its bytes, the least memory).
#   comm, cp (ring or all-gather form): 6 (c-1)/c s b h_kv E per layer per
#     micro batch (k and v forward, k and v again and dk, dv backward; the
#     all-gather form gathers k, v forward and backward and reduce-scatters
#     dk, dv: the same count), plus the once-per-step all-reduce over cp of
#     the layer's weight gradients, 2 (c-1)/c P (P = the layer's parameter
#     bytes, from --report memory).
#   comm, cp all-to-all (--cp-attn a2a, DeepSpeed-Ulysses): per attention
#     forward 4 all-to-alls (q, k, v, o) and backward 4 (do, dq, dk, dv),
#     each of a rank's s/c b h (or h_kv for k, v) elements, of which it
#     sends (c-1)/c: (c-1)/c (s/c) b (4 h + 4 h_kv) E per layer per micro
#     batch (8 (c-1)/c^2 s b h E for multi-head attention; Jacobs et al.
#     2023), plus the same all-reduce of the weight gradients, 2 (c-1)/c P.
#   comm, dp with ZeRO-1 (Megatron's distributed optimizer): reduce-scatter
#     of the gradients and all-gather of the parameters once per step,
#     2 (d-1)/d P per layer (one micro batch per rank here).
#   activations without recompute (Korthikanti et al. 2022, sec. 4, Table 2,
#     2-byte activations scaled to E/2): t = 1: s b h (34 + 5 a s / h);
#     tp: s b h (10 + 24/t + 5 a s / (h t)); tp + sp: s b h / t (34 + 5 a s / h);
#     cp c (flash attention, as Megatron's context parallelism runs it, no
#     s x s term): 34 s b h / c; dp: as t = 1.
#     The formulas are for GPT's block (4h MLP, multi-head attention with
#     dropout); rows of other models print "-".
#   precision (the last table, issue 20): state bytes per parameter (the
#     memory report's line: master + 16-bit copy + grad + Adam, the whole
#     model) next to Megatron's: f32 4 + 4 + 8 = 16; bf16 or fp16 with f32 masters
#     2 + 4 + 4 + 8 = 18; with the distributed optimizer (dp = d) the 12
#     bytes of master and moments are sharded: 6 + 12/d (f32: 8 + 8/d).
#     Held for the backward per layer with --recompute none, selective and
#     full next to Korthikanti's s b h (34 + 5 a s / h) (t = 1, dp),
#     s b h / t (34 + 5 a s / h) (tp + sp), 34 s b h / t (selective) and
#     2 s b h / t (full), at E = 2 for bf16 / fp16 and E = 4 for f32.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,54p' "$0"; exit 0 ;;
    *) echo "plan_quality: unknown option $1" >&2; exit 2 ;;
  esac
done
mcc=$build/mcc
[ -x "$mcc" ] || { echo "plan_quality: no $mcc (build first, or --build DIR)" >&2; exit 1; }

# report MODEL LAYERS KIND ARGS...: the figure of `--report KIND`
#   comm: ring bytes sent per rank per step (the largest rank);
#   memory: what the micro block holds for the backward (live at the loss),
#   per rank.
report() {
  local model=$1 layers=$2 kind=$3; shift 3
  local out
  out=$("$mcc" "samples/$model.mdl" -D layers="$layers" "$@" --report "$kind" 2>&1) || { echo "ERR"; return; }
  if [ "$kind" = comm ]; then
    echo "$out" | grep "^total per step" | sed -n 's/.* \([0-9][0-9]*\) bytes sent per rank.*/\1/p' | sort -n | tail -1
  else
    echo "$out" | grep -m1 "block micro: held for the backward" | awk '{print $(NF-1)}'
  fi
}
per_layer() { local a b; a=$(report "$1" 2 "$2" "${@:4}"); b=$(report "$1" 3 "$2" "${@:4}"); echo $((b - a)); }

mb() { awk -v x="$1" 'BEGIN { printf "%.2f", x / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else printf "-" }'; }

# name|model|defines|s b h a h_kv|gpt-block (1 if the activation formula applies)
models=(
  "gpt d2048 s64|gpt|-D d_model=2048 -D heads=16 -D seq_len=64 -D vocab=256|64 1 2048 16 2048|1"
  "gpt d1024 s256|gpt|-D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0|256 1 1024 16 1024|1"
  "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|2048 1 12288 96 12288|1"
  "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|4096 1 8192 64 1024|0"
)
# name|kind|size|flags (kind: tp, cp, cpa2a, dp; dp runs one micro batch per rank;
# expert parallelism and pipelines have tables of their own below)
layouts=("tp=1|tp|1|" "tp=4|tp|4|--tp 4" "tp=4 sp|tp|4|--tp 4 --sp" "tp=4 sp regather|tp|4|--tp 4 --sp --regather"
         "tp=8|tp|8|--tp 8" "tp=8 sp|tp|8|--tp 8 --sp" "tp=8 sp regather|tp|8|--tp 8 --sp --regather"
         "cp=2 ring|cp|2|--cp 2" "cp=2 allgather|cp|2|--cp 2 --cp-attn allgather" "cp=2 a2a|cpa2a|2|--cp 2 --cp-attn a2a"
         "cp=4 ring|cp|4|--cp 4" "cp=4 a2a|cpa2a|4|--cp 4 --cp-attn a2a"
         "dp=2 ZeRO-1|dp|2|--dp 2")

# parameter bytes of one layer: the memory report's "parameters" row, 3 layers minus 2
param_bytes() {
  local a b
  a=$("$mcc" "samples/$1.mdl" -D layers=2 "${@:2}" --report memory 2>&1 | awk 'index($0, "  parameters") == 1 { print $(NF-1); exit }')
  b=$("$mcc" "samples/$1.mdl" -D layers=3 "${@:2}" --report memory 2>&1 | awk 'index($0, "  parameters") == 1 { print $(NF-1); exit }')
  echo $((b - a))
}

echo "plan_quality: $(git rev-parse --short HEAD 2>/dev/null), $mcc, f32 (E = 4), one sequence per micro batch"
echo
echo "| model | layout | sent / layer / micro batch (MB) | Megatron (MB) | ratio | held for the backward / layer (MB) | Megatron, no recompute (MB) | ratio |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for m in "${models[@]}"; do
  IFS='|' read -r name model defs dims gptblock <<<"$m"
  read -r s b h a hkv <<<"$dims"
  # shellcheck disable=SC2086
  P=$(param_bytes "$model" $defs)
  for l in "${layouts[@]}"; do
    IFS='|' read -r lname kind t largs <<<"$l"
    batch=1; [ "$kind" = dp ] && batch=$t
    # shellcheck disable=SC2086  # word splitting of the flags is intended
    comm=$(per_layer "$model" comm x $defs -D batch=$batch -D micro_batch=1 $largs)
    # shellcheck disable=SC2086
    mem=$(per_layer "$model" memory x $defs -D batch=$batch -D micro_batch=1 $largs)
    sp=0; [[ $lname == *sp* ]] && sp=1
    mcomm=$(awk -v k="$kind" -v t="$t" -v s="$s" -v b="$b" -v h="$h" -v hkv="$hkv" -v sp="$sp" -v P="$P" 'BEGIN {
      if (k == "tp") x = (sp ? 10 : 8) * (t - 1) / t * s * b * h * 4;
      else if (k == "cp") x = 6 * (t - 1) / t * s * b * hkv * 4 + 2 * (t - 1) / t * P;
      else if (k == "cpa2a") x = (t - 1) / t * (s / t) * b * (4 * h + 4 * hkv) * 4 + 2 * (t - 1) / t * P;
      else x = 2 * (t - 1) / t * P;
      printf "%.0f", x }')
    if [ "$gptblock" = 1 ]; then
      mact=$(awk -v k="$kind" -v t="$t" -v s="$s" -v b="$b" -v h="$h" -v a="$a" -v sp="$sp" 'BEGIN {
        if (k == "cp" || k == "cpa2a") e = 34 / t;   # flash attention: no s x s term, the sequence split t ways
        else if (t == 1 || k == "dp") e = 34 + 5 * a * s / h;
        else if (sp) e = (34 + 5 * a * s / h) / t; else e = 10 + 24 / t + 5 * a * s / (h * t);
        printf "%.0f", s * b * h * e * 2 }')
    else mact=0; fi
    if [ "$t" = 1 ]; then c1="$(mb "$comm")"; c2="0"; c3="-"; else c1=$(mb "$comm"); c2=$(mb "$mcomm"); c3=$(ratio "$comm" "$mcomm"); fi
    if [ "$mact" = 0 ]; then a2="-"; a3="-"; else a2=$(mb "$mact"); a3=$(ratio "$mem" "$mact"); fi
    echo "| $name | $lname | $c1 | $c2 | $c3 | $(mb "$mem") | $a2 | $a3 |"
  done
done

# Expert parallelism (samples/moe.mdl: Llama blocks with a top-k mixture of
# SwiGLU experts, dropless), one sequence per rank (micro batch = ep), per
# layer and micro batch.  Tessera's bytes are at uniform routing (`mcc
# --report comm`'s "at uniform routing" line: each all_to_all_v sends
# (ep-1)/ep of the rank's routed rows; the rows above it count the static
# buffers' worst routing).  Megatron with the all-to-all token dispatcher:
# dispatch and combine forward, their transposes backward, 4 (ep-1)/ep
# s k h E (k = top-k), plus the all-reduce over the ep ranks (data parallel
# for everything but the experts) of the layer's non-expert gradients,
# 2 (ep-1)/ep P_dense.
echo
echo "| model | layout | sent / layer / micro batch, uniform routing (MB) | Megatron (MB) | ratio | held for the backward / layer (MB) |"
echo "|---|---|---:|---:|---:|---:|"
moes=(
  "moe d1024 s256 e8 k2|-D d_model=1024 -D heads=16 -D kv_heads=4 -D ffn=2048 -D experts=8 -D topk=2 -D seq_len=256 -D vocab=256|256 1024 2048 8 2"
  "Mixtral-8x7B|-D d_model=4096 -D heads=32 -D kv_heads=8 -D ffn=14336 -D experts=8 -D topk=2 -D seq_len=4096 -D vocab=32000|4096 4096 14336 8 2"
)
uniform() {
  "$mcc" samples/moe.mdl -D layers="$1" "${@:2}" --report comm 2>&1 |
    sed -n 's/^total per step at uniform routing: \([0-9][0-9]*\) bytes sent per rank.*/\1/p'
}
for me in "${moes[@]}"; do
  IFS='|' read -r name defs dims <<<"$me"
  read -r s h ffn E k <<<"$dims"
  # shellcheck disable=SC2086
  P=$(param_bytes moe $defs)
  Pd=$((P - 3 * E * h * ffn * 4))
  # dropless, then capacity factor 1.25 (each expert takes at most 1.25 x its
  # uniform share of the micro batch's slots: the dispatch buffers are sized
  # by it, and uniform routing drops nothing)
  for cf in 0 1.25; do
    for ep in 2 4 8; do
      opts="-D batch=$ep -D micro_batch=$ep --ep $ep -D capacity_factor=$cf"
      # shellcheck disable=SC2086
      a=$(uniform 2 $defs $opts); b=$(uniform 3 $defs $opts)
      # shellcheck disable=SC2086
      mem=$(per_layer moe memory x $defs $opts)
      comm=$((b - a))
      meg=$(awk -v e="$ep" -v s="$s" -v h="$h" -v k="$k" -v Pd="$Pd" 'BEGIN {
        printf "%.0f", 4 * (e - 1) / e * s * k * h * 4 + 2 * (e - 1) / e * Pd }')
      lay="ep=$ep"
      [ "$cf" = 0 ] || lay="ep=$ep, capacity $cf"
      echo "| $name | $lay | $(mb "$comm") | $(mb "$meg") | $(ratio "$comm" "$meg") | $(mb "$mem") |"
    done
  done
done

# Context parallelism, attention alone: the bytes the micro block sends per
# layer and micro batch (the weight gradients' all-reduce over cp, once per
# step in the update block, left out), for the three forms of --cp-attn, next
# to their closed forms: ring and all-gather 6 (c-1)/c s b h_kv E (Megatron's
# ring of k, v: forward, backward, and dk, dv home; its all-gather form the
# same count), all-to-all (c-1)/c (s/c) b (4 h + 4 h_kv) E (DeepSpeed-Ulysses:
# q, k, v, o forward, do, dq, dk, dv backward).  The all-to-all form sends
# less from cp = 2 on for multi-head attention (8/c x 1/6 of the ring's: 0.67x
# at c = 2, 0.33x at c = 4) and needs heads (per tp rank) divisible by c; with
# grouped-query attention (h_kv < h) the ring's k, v are small and a2a wins
# only at larger c.
micro_bytes() {
  "$mcc" "samples/$1.mdl" -D layers="$2" "${@:3}" --report comm 2>&1 |
    awk '$1 == "micro" { s += $NF } END { printf "%.0f", s }'
}
echo
echo "| model | layout | attention bytes sent / layer / micro batch (MB) | closed form (MB) | ratio | vs ring |"
echo "|---|---|---:|---:|---:|---:|"
cps=(
  "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|2048 1 12288 12288"
  "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|4096 1 8192 1024"
)
for cl in "${cps[@]}"; do
  IFS='|' read -r name model defs dims <<<"$cl"
  read -r s b h hkv <<<"$dims"
  for c in 2 4 8; do
    ring=0
    for form in ring allgather a2a; do
      opts="-D batch=1 -D micro_batch=1 --cp $c --cp-attn $form"
      # shellcheck disable=SC2086
      a=$(micro_bytes "$model" 2 $defs $opts); bb=$(micro_bytes "$model" 3 $defs $opts)
      got=$((bb - a))
      [ "$form" = ring ] && ring=$got
      cf=$(awk -v f="$form" -v c="$c" -v s="$s" -v b="$b" -v h="$h" -v hkv="$hkv" 'BEGIN {
        if (f == "a2a") x = (c - 1) / c * (s / c) * b * (4 * h + 4 * hkv) * 4; else x = 6 * (c - 1) / c * s * b * hkv * 4
        printf "%.0f", x }')
      echo "| $name | cp=$c $form | $(mb "$got") | $(mb "$cf") | $(ratio "$got" "$cf") | $(ratio "$got" "$ring") |"
    done
  done
done

# The same at micro batch 4 (4 sequences per micro batch, one micro batch per
# step): per layer and micro batch, 4x the closed form at micro batch 1.  The
# weight gradients read each rank's rows of batch x seq merged (not one
# contiguous block of them): each is a partial sum over cp, as at micro batch
# 1, not a reason to gather the activations (passes/shard.c, merged rows;
# before it, Llama-2-70B cp=2 ring sent 15.4 GB per 3 layers and step instead
# of 0.6 GB).
echo
echo "| model | layout | micro batch | bytes sent / layer / micro batch (MB) | closed form (MB) | ratio |"
echo "|---|---|---:|---:|---:|---:|"
for cl in "${cps[@]}"; do
  IFS='|' read -r name model defs dims <<<"$cl"
  read -r s b h hkv <<<"$dims"
  b=4
  for c in 2 4; do
    for form in ring allgather a2a; do
      opts="-D batch=$b -D micro_batch=$b --cp $c --cp-attn $form"
      # shellcheck disable=SC2086
      a=$(micro_bytes "$model" 2 $defs $opts); bb=$(micro_bytes "$model" 3 $defs $opts)
      got=$((bb - a))
      cf=$(awk -v f="$form" -v c="$c" -v s="$s" -v b="$b" -v h="$h" -v hkv="$hkv" 'BEGIN {
        if (f == "a2a") x = (c - 1) / c * (s / c) * b * (4 * h + 4 * hkv) * 4; else x = 6 * (c - 1) / c * s * b * hkv * 4
        printf "%.0f", x }')
      echo "| $name | cp=$c $form | $b | $(mb "$got") | $(mb "$cf") | $(ratio "$got" "$cf") |"
    done
  done
done

# Pipeline parallelism, whole step: the busiest pipeline rank's bytes next to
# Megatron's: a middle stage sends each micro batch's activation forward and
# its gradient backward, 2 m s b h E (m micro batches); the first and last
# send one of the two, m s b h E, plus the all-reduce of the tied embedding's
# gradient between them once per step, V h E (2 ranks: 2 (2-1)/2).
echo
echo "| model | layout | micro batches | sent per step, busiest pipeline rank (MB) | Megatron (MB) | ratio |"
echo "|---|---|---:|---:|---:|---:|"
pipes=(
  "gpt d1024 s256|gpt|-D layers=8 -D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0 -D vocab=50304|256 1 1024 50304|8"
  "GPT-3 175B|gpt|-D layers=96 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|2048 1 12288 51200|16"
)
for pl in "${pipes[@]}"; do
  IFS='|' read -r name model defs dims m <<<"$pl"
  read -r s b h V <<<"$dims"
  for p in 2 4 8; do
    # shellcheck disable=SC2086
    got=$("$mcc" "samples/$model.mdl" $defs -D batch="$m" -D micro_batch=1 --pp "$p" --report comm 2>&1 |
          sed -n 's/^total per step.* \([0-9][0-9]*\) bytes sent per rank.*/\1/p' | sort -n | tail -1)
    meg=$(awk -v p="$p" -v m="$m" -v s="$s" -v b="$b" -v h="$h" -v V="$V" 'BEGIN {
      end = m * s * b * h * 4 + V * h * 4; mid = (p > 2) ? 2 * m * s * b * h * 4 : 0
      printf "%.0f", (end > mid ? end : mid) }')
    echo "| $name | pp=$p | $m | $(mb "${got:-0}") | $(mb "$meg") | $(ratio "${got:-0}" "$meg") |"
  done
done

# Pipelines over two layer stacks (samples/t5.mdl, docs/pipeline.md "Several
# layer stacks"): the bytes the forward sends per micro batch over all cuts
# (--report comm's fwd.<g> sends / m) next to Megatron's T5 pipeline, which
# sends the encoder's hidden state s_src b h E out of an encoder stage and,
# out of a decoder stage, the decoder's s_tgt b h E plus the encoder output
# s_src b h E it carries to every later decoder stage.  The backward sends
# the same again (the gradients).
echo
echo "| model | layout | stages (units) | forward p2p per micro batch, all cuts (MB) | Megatron (MB) | ratio |"
echo "|---|---|---|---:|---:|---:|"
t5s=(
  "T5-base s512+512|-D enc_layers=12 -D dec_layers=12 -D d_model=768 -D heads=12 -D seq_len=1024|512 512 1 768|8"
)
for tl in "${t5s[@]}"; do
  IFS='|' read -r name defs dims m <<<"$tl"
  read -r ss st b h <<<"$dims"
  for p in 2 4 8; do
    # shellcheck disable=SC2086
    sched=$("$mcc" samples/t5.mdl $defs -D batch="$m" -D micro_batch=1 --pp "$p" --report schedule 2>&1)
    # shellcheck disable=SC2086
    got=$("$mcc" samples/t5.mdl $defs -D batch="$m" -D micro_batch=1 --pp "$p" --report comm 2>&1 |
          awk -v m="$m" '$1 ~ /^fwd\./ && $2 == "send" { s += $5 } END { printf "%.0f", s / m }')
    # a cut after a chunk that holds decoder layers carries both tensors
    meg=$(printf '%s\n' "$sched" | awk -v p="$p" -v ss="$ss" -v st="$st" -v b="$b" -v h="$h" '
      $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $1 < p - 1 { x += (index($0, "dec_layers") ? ss + st : ss) * b * h * 4 }
      END { printf "%.0f", x }')
    units=$(printf '%s\n' "$sched" | awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {
      u = $0; sub(/^ *[0-9]+ +[0-9]+ +/, "", u); sub(/ +[0-9.]+[kMGT]? +[0-9.]+[kMGT]? +[0-9.]+[kMGT]? +[-0-9.]+[kMGT]? *$/, "", u)
      printf "%s%s", (n++ ? " \\| " : ""), u }')
    echo "| $name | pp=$p | $units | $(mb "${got:-0}") | $(mb "$meg") | $(ratio "${got:-0}" "$meg") |"
  done
done

# 16-bit pipelines (issue 20): --precision bf16 / fp16 send and stash the
# 16-bit values.  Per micro batch, the busiest pipeline rank's training
# sends (--report comm's "pipeline p2p per micro batch" line) next to
# Megatron's closed form, one s b h e message per chunk boundary each way
# (e = 2 in bf16 / fp16, 4 in f32); the first rank's stash peak
# (--report memory).  pp 4, 8 micro batches; bf16 and fp16 halve both.
echo
echo "| model | layout | precision | p2p per micro batch, busiest rank (MB) | Megatron m x s b h e (MB) | ratio | stash peak, first rank (MB) |"
echo "|---|---|---|---:|---:|---:|---:|"
p16=(
  "gpt d1024 s256|gpt|-D layers=8 -D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0 -D vocab=50304"
  "GPT-3 175B|gpt|-D layers=96 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200"
)
for pl in "${p16[@]}"; do
  IFS='|' read -r name model defs <<<"$pl"
  for lay in "--pp 4" "--pp 4 --vpp 2"; do
    for prec in f32 bf16 fp16; do
      # shellcheck disable=SC2086
      cr=$("$mcc" "samples/$model.mdl" $defs -D batch=8 -D micro_batch=1 $lay --precision $prec --report comm 2>&1)
      # shellcheck disable=SC2086
      mr=$("$mcc" "samples/$model.mdl" $defs -D batch=8 -D micro_batch=1 $lay --precision $prec --report memory 2>&1)
      read -r got meg <<<"$(echo "$cr" | sed -n 's/^  pipeline p2p per micro batch: [0-9]* sends*, \([0-9]*\) bytes .* = \([0-9]*\) bytes (s = .*/\1 \2/p' |
                            sort -n | tail -1)"
      s0=$(echo "$mr" | grep "^  stash peak" | head -1 | awk '{print $(NF-1)}')
      echo "| $name | $(echo "$lay" | sed 's/--//g') | $prec | $(mb "${got:-0}") | $(mb "${meg:-0}") | $(ratio "${got:-0}" "${meg:-0}") | $(mb "${s0:-0}") |"
    done
  done
done

# The dp gradient reduction bucketed and overlapped with the last micro
# batch's backward (docs/sharding.md, "Overlapped gradient reduction"):
# `mcc --report comm --hw h100-sxm` at dp=8 with ZeRO-1 (tp 8 for the big
# models), whole step, 8 layers, Megatron's default bucket (40M elements,
# 160 MB in f32) and 1/4 of it.  Exposed = the ring bytes still in flight
# when the backward ends, buckets queued on the comm stream in issue order
# (predicted seconds of the backward after each bucket's issue point and of
# each bucket's reduce-scatter on the H100 description).  Megatron's
# closed form: (d-1)/d P E ring bytes (P = gradient elements of the rank),
# exposed = its last bucket, the remainder of P cut into buckets of exactly
# the size (P - B floor((P-1)/B) elements).  Before this change every byte
# was exposed (the reduction ran after the backward).  The cp 2 x dp 4 row:
# ZeRO-1 over the joint group dp x cp = 8, buckets over the set dp+cp.
echo
echo "| model | layout | bucket (MB) | buckets | dp ring bytes / step (MB) | exposed after overlap (MB) | Megatron ring (MB) | Megatron exposed (MB) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
dps=(
  "gpt d1024 s256|gpt|-D layers=8 -D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0 -D vocab=50304|--dp 8"
  "GPT-3 175B|gpt|-D layers=8 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|--tp 8 --dp 8"
  "Llama-2-70B|llama|-D layers=8 -D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|--tp 8 --dp 8"
  "Llama-2-70B|llama|-D layers=8 -D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|--tp 8 --cp 2 --dp 4"
)
for d in "${dps[@]}"; do
  IFS='|' read -r name model defs lay <<<"$d"
  for bucket in 160000000 40000000; do
    # shellcheck disable=SC2086
    out=$("$mcc" "samples/$model.mdl" $defs $lay -D batch=8 -D micro_batch=1 --report comm --hw h100-sxm \
          --dp-bucket-size $bucket 2>&1)
    nb=$(echo "$out" | awk '/^dp gradient reduction:/ { n++ } n == 1 && $1 ~ /^[0-9]+$/ && $2 == "micro" { c++ } END { print c + 0 }')
    read -r ex ring mr me <<<"$(echo "$out" | sed -n 's/^  exposed after overlap: \([0-9]*\) of \([0-9]*\) ring bytes.* closed form): \([0-9]*\) ring bytes.*exposed \([0-9]*\) (its last.*/\1 \2 \3 \4/p')"
    echo "| $name | $(echo "$lay" | sed 's/--//g') | $(mb "$bucket") | $nb | $(mb "${ring:-0}") | $(mb "${ex:-0}") | $(mb "${mr:-0}") | $(mb "${me:-0}") |"
  done
done

# Pipeline schedules (issue 19): the bubble and the stash each schedule
# costs.  Bubble = idle / busy of the worst pipeline rank on the simulated
# timeline (communication free), on the unit grid (F = 1, backward = 2;
# zb-h1's backward = B 1 + W 1) and with the partition's estimated costs
# (mcc --report schedule's summary line); next to the closed forms:
# 1F1B (p-1)/m, interleaved (p-1)/(v m) (Narayanan et al. 2021), zb-h1
# (p-1)/(3m) (Qi et al. 2023: (p-1)(F+B-W) idle against m(F+B+W) busy at
# F = B = W).  Peak in flight = micro batches whose activations a rank
# holds at once (zb-h1: from F until W), first and worst rank; stash peak
# = --report memory's "stash peak" row (zb-h1: the forward's stash until
# B, then what B keeps for W until W), first and worst rank.
echo
echo "| model | pp | m | schedule | bubble, unit grid (worst rank) | closed form | bubble, estimated costs (worst rank) | peak in flight (first / worst rank) | stash peak, first rank (MB) | stash peak, worst rank (MB) |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
scheds=(
  "gpt d1024 s256|gpt|-D layers=8 -D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0 -D vocab=50304|4 8"
  "GPT-3 175B|gpt|-D layers=96 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|4 8"
  "GPT-3 175B|gpt|-D layers=96 -D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|8 16"
)
for sl in "${scheds[@]}"; do
  IFS='|' read -r name model defs pm <<<"$sl"
  read -r p m <<<"$pm"
  for sch in "1f1b|1" "interleaved|2" "zb-h1|1"; do
    IFS='|' read -r k v <<<"$sch"
    opts="--pp $p --schedule $k"
    [ "$v" = 1 ] || opts="$opts --vpp $v"
    # shellcheck disable=SC2086
    sr=$("$mcc" "samples/$model.mdl" $defs -D batch="$m" -D micro_batch=1 $opts --report schedule 2>&1)
    # shellcheck disable=SC2086
    mr=$("$mcc" "samples/$model.mdl" $defs -D batch="$m" -D micro_batch=1 $opts --report memory 2>&1)
    read -r bu pk bc <<<"$(echo "$sr" | sed -n 's/^summary: [^ ]* bubble \([0-9.]*\) .*peak in flight \([0-9]*\) .*estimated costs: bubble \([0-9.]*\) .*/\1 \2 \3/p')"
    p0=$(echo "$sr" | sed -n 's/^  rank 0 *peak \([0-9]*\) micro.*/\1/p')
    st=$(echo "$mr" | grep "^  stash peak" | awk '{print $(NF-1)}')
    s0=$(echo "$st" | head -1); sw=$(echo "$st" | sort -n | tail -1)
    cf=$(awk -v p="$p" -v m="$m" -v v="$v" -v k="$k" 'BEGIN { printf "%.4f", (p - 1) / (m * v * (k == "zb-h1" ? 3 : 1)) }')
    echo "| $name | $p | $m | $k${v:+$( [ "$v" = 1 ] || echo " vpp=$v")} | ${bu:-ERR} | $cf | ${bc:-ERR} | ${p0:-?} / ${pk:-?} | $(mb "${s0:-0}") | $(mb "${sw:-0}") |"
  done
done

# Precision (issue 20): f32 against --precision bf16 and fp16 (f32 masters,
# 16-bit copies and activations; fp16 adds the loss scaler's four scalar
# states), state bytes per parameter and bytes held per layer, next to
# Megatron's figures (closed forms in the header).
echo
echo "| model | layout | precision | recompute | state bytes / parameter | Megatron | held for the backward / layer (MB) | Korthikanti (MB) | ratio |"
echo "|---|---|---|---|---:|---:|---:|---:|---:|"
bigs=(
  "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|2048 1 12288 96|1"
  "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|4096 1 8192 64|0"
)
# layout|kind|size|flags|precision|recompute
prows=("tp=1|tp|1||f32|none" "tp=1|tp|1||bf16|none" "tp=8 sp|tp|8|--tp 8 --sp|f32|none" "tp=8 sp|tp|8|--tp 8 --sp|bf16|none"
       "tp=8 sp|tp|8|--tp 8 --sp|bf16|selective" "tp=8 sp|tp|8|--tp 8 --sp|bf16|full"
       "dp=8 ZeRO-1|dp|8|--dp 8|f32|none" "dp=8 ZeRO-1|dp|8|--dp 8|bf16|none"
       "tp=8 sp|tp|8|--tp 8 --sp|fp16|none" "dp=8 ZeRO-1|dp|8|--dp 8|fp16|none")
for m in "${bigs[@]}"; do
  IFS='|' read -r name model defs dims gptblock <<<"$m"
  read -r s b h a <<<"$dims"
  for r in "${prows[@]}"; do
    IFS='|' read -r lname kind t largs prec rec <<<"$r"
    batch=1; [ "$kind" = dp ] && batch=$t
    fl="$defs -D batch=$batch -D micro_batch=1 $largs --precision $prec --recompute $rec"
    # shellcheck disable=SC2086
    mem=$(per_layer "$model" memory x $fl)
    # shellcheck disable=SC2086
    bpp=$("$mcc" "samples/$model.mdl" -D layers=3 $fl --report memory 2>&1 |
          sed -n 's/^  state bytes per parameter: \([0-9.]*\) = .*/\1/p' | head -1)
    meg=$(awk -v p="$prec" -v k="$kind" -v d="$t" 'BEGIN {
      h16 = p == "bf16" || p == "fp16"
      if (k == "dp") x = h16 ? 6 + 12 / d : 8 + 8 / d; else x = h16 ? 18 : 16
      printf "%.4g", x }')
    E=4; [ "$prec" != f32 ] && E=2
    sp=0; [[ $lname == *sp* ]] && sp=1
    if [ "$gptblock" = 1 ]; then
      kact=$(awk -v k="$kind" -v t="$t" -v s="$s" -v b="$b" -v h="$h" -v a="$a" -v sp="$sp" -v r="$rec" -v E="$E" 'BEGIN {
        if (r == "full") e = (sp ? 2 / t : 2)
        else if (r == "selective") e = 34 / t
        else if (t == 1 || k == "dp") e = 34 + 5 * a * s / h
        else e = (34 + 5 * a * s / h) / t
        printf "%.0f", s * b * h * e * E / 2 }')
      k2=$(mb "$kact"); k3=$(ratio "$mem" "$kact")
    else k2="-"; k3="-"; fi
    echo "| $name | $lname | $prec | $rec | ${bpp:-?} | $meg | $(mb "$mem") | $k2 | $k3 |"
  done
done

# ZeRO-3 / FSDP (--zero 3, passes/zero3.c) against ZeRO-1 (the distributed
# optimizer, the default), per layer (3 layers minus 2), one micro batch of
# one sequence per dp rank, f32: ring bytes each rank sends per step over
# dp and state bytes it holds (parameters + gradients + Adam moments), next
# to the closed forms (P = the layer's parameter bytes, d = dp): ZeRO-1
# sends 2 (d-1)/d P (gradients reduce-scattered, parameters all-gathered
# once per step) and holds (2 + 2/d) P (4 + 4 + 8/d bytes per parameter);
# Megatron-FSDP sends 3 (d-1)/d P per micro batch (every parameter gathered
# for the forward and again for the backward, every gradient
# reduce-scattered) and holds 4P/d (16/d bytes per parameter).  Tessera's
# backward gathers only the parameters its gradients read (biases and norm
# shifts are not gathered again), so it sends a little less than the closed
# form.  Gathered in flight = the memory report's most bytes of gathered
# parameters live at once in the micro block (the 8-layer model: with the
# prefetch, the layer computing and the next one, plus a tied embedding
# that stays gathered through the forward), inside the activation arena.
echo
echo "| model | dp | stage | sent / layer / step (MB) | closed form (MB) | ratio | states held / layer (MB) | closed form (MB) | ratio | gathered in flight, 8 layers (MB) |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"
z3s=(
  "gpt d1024 s256|gpt|-D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0 -D vocab=50304|2 8"
  "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|8"
  "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|8"
)
states_total() {
  "$mcc" "samples/$1.mdl" -D layers="$2" "${@:3}" --report memory 2>&1 | awk 'index($0, "  states total") == 1 { print $(NF-1); exit }'
}
for z in "${z3s[@]}"; do
  IFS='|' read -r name model defs dl <<<"$z"
  # shellcheck disable=SC2086
  P=$(param_bytes "$model" $defs --precision f32)
  for d in $dl; do
    for stage in 1 3; do
      fl="$defs -D batch=$d -D micro_batch=1 --dp $d --zero $stage --precision f32"
      # shellcheck disable=SC2086
      comm=$(per_layer "$model" comm x $fl)
      # shellcheck disable=SC2086
      h3=$(states_total "$model" 3 $fl); h2=$(states_total "$model" 2 $fl)
      if [ -n "$h3" ] && [ -n "$h2" ]; then held=$((h3 - h2)); else held=0; fi
      read -r cc ch <<<"$(awk -v z="$stage" -v d="$d" -v P="$P" 'BEGIN {
        if (z == 3) printf "%.0f %.0f", 3 * (d - 1) / d * P, 4 * P / d
        else printf "%.0f %.0f", 2 * (d - 1) / d * P, (2 + 2 / d) * P }')"
      fly="-"
      if [ "$stage" = 3 ]; then
        # shellcheck disable=SC2086
        fly=$(mb "$("$mcc" "samples/$model.mdl" -D layers=8 $fl --report memory 2>&1 |
                   awk 'index($0, "  ZeRO-3: gathered parameters live at once") == 1 { print $(NF-1); exit }')")
      fi
      echo "| $name | $d | ZeRO-$stage | $(mb "$comm") | $(mb "$cc") | $(ratio "$comm" "$cc") | $(mb "$held") | $(mb "$ch") | $(ratio "$held" "$ch") | $fly |"
    done
  done
done

# ZeRO-3 in bf16 (Megatron-FSDP's layout): the state bytes per parameter
# the memory report gives (f32 master, main grad and moments all 1/dp, no
# bf16 copy held: 16/dp) next to Tessera's bf16 ZeRO-1 (10 + 8/dp: moments
# only), Megatron's distributed optimizer (6 + 12/dp) and Megatron-FSDP
# (18/dp: it also keeps a bf16 parameter shard), and the gathered bf16
# parameters in flight (8 layers, the memory report's peak) next to the
# f32 plan's (the gathers cast the f32 chunk to bf16 first).  Measured
# 2026-11-28: 16/dp exactly in every row (8 at dp 2, 2 at dp 8) against
# Megatron's 12 / 7.5 and Megatron-FSDP's 9 / 2.25; in flight gpt d1024
# 206.57 MB (f32 307.86), GPT-3 175B 8707.99 (17114.04), Llama-2-70B
# 3481.34 (6845.24): half for the big models, two thirds for the gpt
# d1024, whose peak the 50304 x 1024 tied embedding dominates (not
# analysed further).
echo
echo "| model | dp | ZeRO-3 bf16 bytes / param | closed form 16/dp | Tessera ZeRO-1 bf16 | Megatron dist. opt. 6+12/dp | Megatron-FSDP 18/dp | gathered in flight bf16 (MB) | f32 (MB) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
bpp_of() {
  "$mcc" "samples/$1.mdl" "${@:2}" --report memory 2>&1 | awk 'index($0, "  state bytes per parameter:") == 1 { print $5; exit }'
}
fly_of() {
  "$mcc" "samples/$1.mdl" -D layers=8 "${@:2}" --report memory 2>&1 |
    awk 'index($0, "  ZeRO-3: gathered parameters live at once") == 1 { print $(NF-1); exit }'
}
for z in "${z3s[@]}"; do
  IFS='|' read -r name model defs dl <<<"$z"
  for d in $dl; do
    fl="$defs -D batch=$d -D micro_batch=1 --dp $d"
    # shellcheck disable=SC2086
    b3=$(bpp_of "$model" -D layers=2 $fl --zero 3 --precision bf16)
    # shellcheck disable=SC2086
    b1=$(bpp_of "$model" -D layers=2 $fl --zero 1 --precision bf16)
    # shellcheck disable=SC2086
    fb=$(fly_of "$model" $fl --zero 3 --precision bf16); ff=$(fly_of "$model" $fl --zero 3 --precision f32)
    read -r c3 meg fsdp <<<"$(awk -v d="$d" 'BEGIN { printf "%.4g %.4g %.4g", 16 / d, 6 + 12 / d, 18 / d }')"
    echo "| $name | $d | ${b3:-?} | $c3 | ${b1:-?} | $meg | $fsdp | $(mb "$fb") | $(mb "$ff") |"
  done
done

# Muon over tp (issue 24, deliverable 8; docs/sharding.md "Muon"): the bytes
# a rank sends per step for one layer's Newton-Schulz iterations (3 layers
# minus 2), as compiled (--muon-tp-mode auto: the fewer bytes per matrix),
# next to the two hand-written closed forms for a tp-split matrix R x C
# with k its unsplit side: all-reducing the k x k Gram matrix every
# iteration, 2 (t-1)/t (5 k^2 + 1) E per matrix, and gathering the matrix
# once, (t-1)/t R C E.  GPT's layer: wq, wk, wv [h, h], wo [h, h], mlp
# [h, 4h], [4h, h], k = h for all: Gram 6 x 2 (t-1)/t (5 h^2 + 1) E, gather
# 12 (t-1)/t h^2 E; Llama's: wq, wo [h, h], wk, wv [h, h_kv], three
# [h, ffn]: Gram 7 x 2 (t-1)/t (5 h^2 + 1) E, gather (t-1)/t (2 h^2 + 2 h h_kv
# + 3 h ffn) E.
echo
echo "| model | layout | muon bytes sent / layer / step (MB) | Gram all-reduce closed form (MB) | gather closed form (MB) | compiled / cheaper closed form |"
echo "|---|---|---:|---:|---:|---:|"
muon_layer() {
  local model=$1; shift
  local a b
  a=$("$mcc" "samples/$model.mdl" -D layers=2 "$@" --optimizer muon --report comm 2>&1 |
      sed -n 's/.*Gram matrix: \([0-9]*\) ring bytes sent per rank.*/\1/p')
  b=$("$mcc" "samples/$model.mdl" -D layers=3 "$@" --optimizer muon --report comm 2>&1 |
      sed -n 's/.*Gram matrix: \([0-9]*\) ring bytes sent per rank.*/\1/p')
  echo $(( ${b:-0} - ${a:-0} ))
}
mrows=("gpt d1024 s256|gpt|-D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0|1024 1024 4096"
       "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|12288 12288 49152"
       "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|8192 1024 28672")
for r in "${mrows[@]}"; do
  IFS='|' read -r name model defs dims <<<"$r"
  read -r h hkv ffn <<<"$dims"
  for t in 4 8; do
    # shellcheck disable=SC2086
    got=$(muon_layer "$model" $defs -D batch=1 -D micro_batch=1 --tp "$t")
    read -r gram gath <<<"$(awk -v m="$model" -v t="$t" -v h="$h" -v kv="$hkv" -v f="$ffn" 'BEGIN {
      n = (m == "gpt") ? 6 : 7
      g = n * 2 * (t - 1) / t * (5 * h * h + 1) * 4
      a = (m == "gpt") ? 12 * h * h : 2 * h * h + 2 * h * kv + 3 * h * f
      printf "%.0f %.0f", g, (t - 1) / t * a * 4 }')"
    best=$(( gram < gath ? gram : gath ))
    echo "| $name | tp=$t | $(mb "$got") | $(mb "$gram") | $(mb "$gath") | $(ratio "$got" "$best") |"
  done
done

# ZeRO-1 over the joint data-parallel group (issue 19, docs/sharding.md
# "ZeRO-1 over dp x cp"): with cp the moments are flat over dp x cp = N
# ranks, as Megatron's distributed optimizer shards over its dp x cp group.
# Whole model, one micro batch per rank: Adam bytes per f32 parameter
# (--report memory) next to Megatron's 12/N (master and moments; Tessera
# keeps the f32 parameter whole, so its 8/N is moments only), and the update
# block's ring bytes per rank per step (--report comm: the gradients'
# reduce-scatters, the parameters' all-gathers, any cp all-reduce of
# gradients) next to Megatron's 2 (N-1)/N P E.  Tessera's micro block also
# gathers activations over cp for the weight gradients (not in these
# columns; Megatron leaves those gradients partial over cp instead).
echo
echo "| model | layout | adam bytes / parameter | Megatron 12/N | update ring bytes / step (MB) | Megatron 2(N-1)/N P E (MB) | ratio |"
echo "|---|---|---:|---:|---:|---:|---:|"
zrows=("llama (tests/parallel)|llama|-D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256"
       "gpt d256 s128 4 layers|gpt|-D layers=4 -D d_model=256 -D heads=4 -D seq_len=128 -D dropout=0")
for r in "${zrows[@]}"; do
  IFS='|' read -r name model defs <<<"$r"
  for lay in "2 2" "2 4" "4 2"; do
    read -r c d <<<"$lay"
    n=$((c * d))
    # shellcheck disable=SC2086
    fl="$defs -D batch=$d -D micro_batch=1 --cp $c --dp $d"
    # shellcheck disable=SC2086
    adam=$("$mcc" "samples/$model.mdl" $fl --report memory 2>&1 |
           sed -n 's/^  state bytes per parameter: .* + \([0-9.]*\) (adam m+v.*/\1/p' | head -1)
    # shellcheck disable=SC2086
    cr=$("$mcc" "samples/$model.mdl" $fl --report comm 2>&1)
    upd=$(printf '%s\n' "$cr" | awk '$1 == "update" && ($2 == "reduce_scatter" || $2 == "all_gather" || ($2 == "all_reduce" && $5 > 8)) { s += $6 } END { printf "%.0f", s }')
    P=$(printf '%s\n' "$cr" | sed -n 's/.*closed form 2 x (N-1)\/N x \([0-9]*\) parameters.*/\1/p')
    meg=$(awk -v n="$n" -v p="${P:-0}" 'BEGIN { printf "%.0f", 2 * (n - 1) / n * p * 4 }')
    echo "| $name | cp=$c x dp=$d | ${adam:-?} | $(awk -v n="$n" 'BEGIN { printf "%.4g", 12 / n }') | $(mb "$upd") | $(mb "$meg") | $(ratio "$upd" "$meg") |"
  done
done
