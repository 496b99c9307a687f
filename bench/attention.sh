#!/usr/bin/env bash
# attention.sh - nn.attention's two forms side by side on CPU ranks: the
# fused attention op (flash style, the default) and the composed one
# (matmul, softmax, matmul; `fused: false`, or any attention dropout).
# The rows marked ALiBi run nn.attention's `alibi: true` (issue 24): the
# fused kernels add -slope |i - j| per score tile, the composed form adds
# a [heads, seq, seq] bias to the scores.
#
#   bench/attention.sh [--build DIR] [--steps N] [--warmup N] [--rounds N]
#   defaults: --build build, --steps 4 (timed), --warmup 1, --rounds 2
#
# Per configuration (a GPT block stack: learned positions, pre-LN, GELU
# MLP, tied head, f32, one rank, micro batch = batch), both forms are
# compiled from one model text and trained `--rounds` times each,
# alternating (fused, composed, fused, ...), so a change in the machine's
# load hits both; the step time is the median over all rounds of the
# elapsed_s differences after the warm-up steps (`mrun --metrics`).
# Memory is from the compiled program (`mcc --report memory`): the micro
# block's arena peak and what it holds for the backward (live at the
# loss).  Not a test: the machine is shared and noisy, read the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=4 warmup=1 rounds=2
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --steps) steps=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "attention.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MCC=$build/mcc MRUN=$build/mrun
[ -x "$MCC" ] && [ -x "$MRUN" ] || { echo "attention.sh: no mcc/mrun in $build (build first, or --build DIR)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export TS_THREADS=${TS_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}

# the model, with the form as a config knob (FUSED)
cat >"$TMP/m.mdl" <<'EOF'
import nn
config { vocab = 256; seq_len = 256; d_model = 256; heads = 4; layers = 2; batch = 2; fused = true; alibi = false }
rules { batch: dp, seq: cp, heads: tp, ffn: tp, vocab: tp }
model bench(tokens: i32[batch, seq=seq_len], targets: i32[batch, seq=seq_len]) {
  x, wte = nn.token_embedding(tokens, vocab, d_model)
  x = nn.position_embedding(x)
  repeat layers {
    x = x + nn.attention(nn.layernorm(x), heads: heads, layers: layers, fused: fused, alibi: alibi)
    x = x + nn.mlp(nn.layernorm(x), ffn: 4 * d_model, layers: layers)
  }
  return nn.lm_head_tied(nn.layernorm(x), wte, targets)
}
train {
  optimizer = adamw(lr: 1e-3)
  global_batch = batch
  micro_batch = batch
  seq_len = seq_len
  steps = 10
  precision = f32
}
EOF

configs=("d256 h4 T256 B4|-D d_model=256 -D heads=4 -D seq_len=256 -D batch=4"
         "d256 h4 T1024 B2|-D d_model=256 -D heads=4 -D seq_len=1024 -D batch=2"
         "d512 h8 T512 B2|-D d_model=512 -D heads=8 -D seq_len=512 -D batch=2"
         "d768 h12 T1024 B1|-D d_model=768 -D heads=12 -D seq_len=1024 -D batch=1"
         "d256 h4 T1024 B2 ALiBi|-D d_model=256 -D heads=4 -D seq_len=1024 -D batch=2 -D alibi=true"
         "d512 h8 T512 B2 ALiBi|-D d_model=512 -D heads=8 -D seq_len=512 -D batch=2 -D alibi=true")

# median step (ms) of the metrics files given
median() {
  /usr/bin/python3 - "$warmup" "$@" <<'PY'
import json, sys, statistics
w, t = int(sys.argv[1]), []
for f in sys.argv[2:]:
    rows = [json.loads(l) for l in open(f)]
    t += [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])][w - 1:]
print("%.1f" % (1e3 * statistics.median(t)))
PY
}
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }

echo "| config | fused step (ms) | composed step (ms) | fused / composed | fused arena (MiB) | composed arena (MiB) | fused held (MiB) | composed held (MiB) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for entry in "${configs[@]}"; do
  name=${entry%%|*} opts=${entry#*|}
  declare -A peak held
  for f in true false; do
    # shellcheck disable=SC2086
    "$MCC" "$TMP/m.mdl" $opts -D fused=$f -o "$TMP/$f.plan"
    # shellcheck disable=SC2086
    rep=$("$MCC" "$TMP/m.mdl" $opts -D fused=$f --report memory)
    peak[$f]=$(echo "$rep" | grep -m1 "block micro: arena peak" | awk '{print $(NF-1)}')
    held[$f]=$(echo "$rep" | grep -m1 "block micro: held for the backward" | awk '{print $(NF-1)}')
  done
  for r in $(seq "$rounds"); do
    for f in true false; do
      "$MRUN" "$TMP/$f.plan" --steps $((warmup + steps)) --quiet --metrics "$TMP/$f.$r.jsonl" >/dev/null 2>&1
    done
  done
  tf=$(median "$TMP"/true.*.jsonl) tc=$(median "$TMP"/false.*.jsonl)
  echo "| $name | $tf | $tc | $(awk -v a="$tf" -v b="$tc" 'BEGIN { printf "%.2fx", a / b }') | $(mib "${peak[true]}") | $(mib "${peak[false]}") | $(mib "${held[true]}") | $(mib "${held[false]}") |"
  rm -f "$TMP"/*.jsonl
done
echo
echo "- 2 layers, d_ff = 4 d_model, vocab 256, f32, one rank, causal (learned positions; the ALiBi rows add ALiBi's bias); median of $steps steps after $warmup warm-up, $rounds rounds alternating; TS_THREADS=$TS_THREADS, OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS."
echo "- $(getconf _NPROCESSORS_ONLN) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
