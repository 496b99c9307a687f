#!/usr/bin/env bash
# plan_quality.sh [--build DIR] - what a compiled plan costs, per
# transformer layer, next to Megatron's hand-written equivalent: bytes each
# rank sends and activation bytes it holds.  Compile only (mcc --report
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
#     s b h E more: 10 (t-1)/t s b h E.  Tessera does the same by default
#     (pass remat); the row "sp keep" is `--keep-gathered`, which keeps the
#     gathered copies (tp's bytes, more memory).
#   activations without recompute (Korthikanti et al. 2022, sec. 4, Table 2,
#     2-byte activations scaled to E/2): t = 1: s b h (34 + 5 a s / h);
#     tp: s b h (10 + 24/t + 5 a s / (h t)); tp + sp: s b h / t (34 + 5 a s / h).
#     The formulas are for GPT's block (4h MLP, multi-head attention with
#     dropout); rows of other models print "-".
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
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

# name|model|defines|s b h a|gpt-block (1 if the activation formula applies)
models=(
  "gpt d2048 s64|gpt|-D d_model=2048 -D heads=16 -D seq_len=64 -D vocab=256|64 1 2048 16|1"
  "gpt d1024 s256|gpt|-D d_model=1024 -D heads=16 -D seq_len=256 -D dropout=0|256 1 1024 16|1"
  "GPT-3 175B|gpt|-D d_model=12288 -D heads=96 -D seq_len=2048 -D vocab=51200|2048 1 12288 96|1"
  "Llama-2-70B|llama|-D d_model=8192 -D heads=64 -D kv_heads=8 -D ffn=28672 -D seq_len=4096 -D vocab=32000|4096 1 8192 64|0"
)
layouts=("tp=1|1|" "tp=4|4|--tp 4" "tp=4 sp|4|--tp 4 --sp" "tp=4 sp keep|4|--tp 4 --sp --keep-gathered"
         "tp=8|8|--tp 8" "tp=8 sp|8|--tp 8 --sp")

echo "plan_quality: $(git rev-parse --short HEAD 2>/dev/null), $mcc, f32 (E = 4), one sequence per micro batch"
echo
echo "| model | layout | sent / layer / micro batch (MB) | Megatron (MB) | ratio | held for the backward / layer (MB) | Megatron, no recompute (MB) | ratio |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for m in "${models[@]}"; do
  IFS='|' read -r name model defs dims gptblock <<<"$m"
  read -r s b h a <<<"$dims"
  for l in "${layouts[@]}"; do
    IFS='|' read -r lname t largs <<<"$l"
    # shellcheck disable=SC2086  # word splitting of the flags is intended
    comm=$(per_layer "$model" comm x $defs -D batch=1 -D micro_batch=1 $largs)
    # shellcheck disable=SC2086
    mem=$(per_layer "$model" memory x $defs -D batch=1 -D micro_batch=1 $largs)
    mcomm=$(awk -v t="$t" -v s="$s" -v b="$b" -v h="$h" -v k="$([[ $lname == *"sp"* ]] && echo 10 || echo 8)" \
      'BEGIN { printf "%.0f", k * (t - 1) / t * s * b * h * 4 }')
    if [ "$gptblock" = 1 ]; then
      mact=$(awk -v t="$t" -v s="$s" -v b="$b" -v h="$h" -v a="$a" -v sp="$([[ $lname == *sp* ]] && echo 1 || echo 0)" 'BEGIN {
        if (t == 1) e = 34 + 5 * a * s / h; else if (sp) e = (34 + 5 * a * s / h) / t; else e = 10 + 24 / t + 5 * a * s / (h * t);
        printf "%.0f", s * b * h * e * 2 }')
    else mact=0; fi
    if [ "$t" = 1 ]; then c1="$(mb "$comm")"; c2="0"; c3="-"; else c1=$(mb "$comm"); c2=$(mb "$mcomm"); c3=$(ratio "$comm" "$mcomm"); fi
    if [ "$mact" = 0 ]; then a2="-"; a3="-"; else a2=$(mb "$mact"); a3=$(ratio "$mem" "$mact"); fi
    echo "| $name | $lname | $c1 | $c2 | $c3 | $(mb "$mem") | $a2 | $a3 |"
  done
done
