#!/usr/bin/env bash
# gpu_check.sh OUTDIR [--kit DIR|FILE.tar.xz] [--budget SECONDS] [--only PART,...]
#
# The prepared check of the CUDA path on a GPU machine on loan (issue 25):
# every result into OUTDIR, the summary as a table on stdout (and in
# OUTDIR/table.md).  A failing part is recorded and the rest goes on; each
# part has its own time limit and all of them together stay within
# --budget (default 450 s), the most important first:
#   env         nvidia-smi: the GPU, driver and CUDA versions; the kit's commit
#   selftest    mrun --selftest: every kernel kind against the CPU
#   train-*     tiny gpt, llama, moe, packed (document masks, a window, validation),
#               gpt with --recompute full and gpt in bf16: 20 steps on the GPU and on a
#               CPU rank, losses side by side (max relative difference), CUDA graph launches
#   generate-*  tiny gpt and bloom (ALiBi): 16 greedy tokens on the GPU from a CPU-trained
#               checkpoint, each checked against a full forward (mrun --generate-check)
#   gpt2-124m   GPT-2 124M, 8 x 1024 tokens per step, f32: step time, tokens/s, MFU
#   tf32        the same with the GEMMs in TF32 (TS_CUDA_TF32=1), and PyTorch's allow_tf32
#   bf16        the same in --precision bf16 (bf16 storage, f32 arithmetic and GEMMs)
#   exact       (last) the same in f32 with f64 arithmetic in the generated kernels
#               (TS_CUDA_EXACT=1, the arithmetic before 2026-11-27): what f32 arithmetic gains
#   kernels     its ten most expensive kernels and GEMMs (TS_RT_PROFILE: CUDA events)
#   torch-*     the same model in PyTorch: eager, torch.compile (f32), and eager
#               under bf16 autocast (bench/torch_step.py)
#   memcheck    compute-sanitizer memcheck over a tiny training step
#   racecheck   compute-sanitizer racecheck over the same
# --only runs the parts named (env always; train-gpt, memcheck and racecheck
# need train; kernels needs gpt2-124m), e.g. --only gpt2-124m,kernels,torch
# Without a GPU (or without nvidia-smi) each GPU row says "no GPU" and the
# CPU side still runs, so the script is tested on machines without one.
#
# The binaries: the kit's when this script is inside one (tools/gpu_kit.sh)
# or --kit names one (a folder, or the .tar.xz that travels: unpacked into
# OUTDIR/kit), else the repository's build/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out="" kit="" budget=450 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) kit=${2:?--kit needs a folder or a .tar.xz}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --only) only=",${2:?--only needs parts},"; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option '$1'" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$out" ] || { echo "usage: tools/gpu_check.sh OUTDIR [--kit DIR|FILE.tar.xz] [--budget SECONDS]" >&2; exit 2; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
t_start=$(date +%s)

# ---- the binaries ----
if [ -n "$kit" ] && [ -f "$kit" ]; then
  mkdir -p "$out/kit" && tar -C "$out/kit" -xJf "$kit" || { echo "gpu_check: cannot unpack $kit" >&2; exit 2; }
  kit=$(find "$out/kit" -maxdepth 3 -path '*/bin/mrun' | head -1)
  kit=${kit%/bin/mrun}
elif [ -z "$kit" ] && [ -x "$here/../bin/mrun" ]; then
  kit=$here/..
fi
if [ -n "$kit" ]; then
  bin=$(cd "$kit/bin" && pwd); share=$(cd "$kit/share/tessera" && pwd); src=$(cd "$kit" && pwd)
  commit=$(sed -n 's/^commit: //p' "$kit/MANIFEST" 2>/dev/null)
else
  root=$(cd "$here/.." && pwd)
  bin=$root/build; share=$root; src=$root
  commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
fi
MCC=$bin/mcc MRUN=$bin/mrun
[ -x "$MCC" ] && [ -x "$MRUN" ] || { echo "gpu_check: no mcc / mrun in $bin (build first, or --kit)" >&2; exit 2; }
samples=$share/samples
data=$samples/data/kjv.txt

# ---- the table ----
: > "$out/summary.tsv"
row() {   # row PART RESULT DETAIL
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$out/summary.tsv"
  printf 'gpu_check: %-12s %-8s %s\n' "$1" "$2" "$3" >&2
}
left() { echo $(( budget - ($(date +%s) - t_start) )); }
# limit WANT: WANT seconds, or what is left of the budget (0: none)
limit() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 0 ? l : 0 )) || echo "$1"; }
# run_part NAME SECONDS CMD...: CMD with its output in OUTDIR/NAME.log;
# sets rc (124: timed out, 125: no time left) and secs
run_part() {
  local name=$1 want=$2; shift 2
  local t; t=$(limit "$want")
  if [ "$t" -lt 5 ]; then rc=125; secs=0; echo "not run: the budget was spent" > "$out/$name.log"; return; fi
  local t0; t0=$(date +%s.%N)
  timeout -k 5 "$t" "$@" > "$out/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
}
why_failed() {   # the last error-looking line of a log
  grep -E -i "error|fail|mrun:|mcc:|abort|fault" "$1" 2>/dev/null | grep -v -E "^ *[0-9]+ .* pass" | tail -1 | cut -c1-200
}
want() {   # want PART: whether --only (if given) names it
  [ -z "$only" ] || case "$only" in *",$1,"*) return 0 ;; *) return 1 ;; esac
}
status_of() { case "$rc" in 0) echo ok ;; 124|137) echo "TIMEOUT" ;; 125) echo "skipped" ;; *) echo FAIL ;; esac; }

# ---- env ----
gpu=0 arch="" gpuname="" peak32="" peak16=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi > "$out/nvidia-smi.txt" 2>&1; then
  gpu=1
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)
  gpuname=$(echo "$q" | cut -d, -f1 | sed 's/^ *//')
  cap=$(echo "$q" | cut -d, -f4 | tr -d ' .')
  arch=sm_$cap
  cuda=$(grep -o "CUDA Version: [0-9.]*" "$out/nvidia-smi.txt" | head -1)
  row env ok "$q; $cuda; kit $commit; $(uname -r)"
  case "$gpuname" in   # dense fp32 (no tensor cores), dense bf16 and tf32 tensor, NVIDIA's datasheets, TFLOP/s
    *H100*PCIe*) peak32=51 peak16=756 peaktf32=378 ;;
    *H100*|*H200*|*GH200*) peak32=67 peak16=989 peaktf32=494 ;;
    *A100*) peak32=19.5 peak16=312 peaktf32=156 ;;
    *B200*) peak32=80 peak16=2250 peaktf32=1100 ;;
  esac
  # where the CUDA libraries are, for the logs (the runtime finds them itself: ir/dl.h)
  { ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libnvrtc|libcublasLt|libnccl|libcudart"
    ls -l /usr/local/cuda/lib64 /usr/local/nvidia/lib64 2>&1 | grep -E "libcuda\.so|libnvrtc|libcublasLt|libnccl|libcudart|cannot"
    python3 -c 'import sys; print("\n".join(sys.path))' 2>/dev/null | while read -r p; do ls -d "$p"/nvidia/*/lib 2>/dev/null; done
    ldd "$MRUN"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; } > "$out/libs.txt" 2>&1
else
  row env "no GPU" "nvidia-smi: $(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi 2>&1 | head -1 || echo 'not installed'); kit $commit"
fi

# ---- selftest ----
if ! want selftest; then :
elif run_part selftest 150 "$MRUN" --selftest; [ "$gpu" = 0 ] && grep -q "no GPU driver" "$out/selftest.log"; then
  row selftest "no GPU" "$(head -1 "$out/selftest.log" | cut -c1-160)"
else
  npass=$(grep -c -E " pass$" "$out/selftest.log"); nfail=$(grep -c -E " FAIL$" "$out/selftest.log")
  if [ "$rc" = 0 ]; then row selftest ok "$npass rows pass (${secs}s)"
  else row selftest "$(status_of)" "$npass pass, $nfail FAIL: $(grep -E "\bFAIL\b" "$out/selftest.log" | head -3 | tr -s ' ' | tr '\n' ';' | cut -c1-200) $(why_failed "$out/selftest.log")"; fi
fi

# ---- tiny models: GPU against a CPU rank ----
target=""
[ -n "$arch" ] && target="--target $arch"
# losses LOG.jsonl -> one per line
losses() { sed -n 's/.*"loss": *\([-0-9.eE+naif]*\).*/\1/p' "$1"; }
vlosses() { sed -n 's/.*"val_loss": *\([-0-9.eE+naif]*\).*/\1/p' "$1"; }
# maxrel FILE.tsv: the largest |a - b| / max(|b|, 1) over its two columns (1e9 for a NaN)
maxrel() { awk 'BEGIN{m=0} {a=$1; b=$2; e=(a>b?a-b:b-a)/((b<0?-b:b)>1?(b<0?-b:b):1); if (e>m) m=e; if (a!=a) m=1e9} END{printf "%.2e", m}' "$1"; }
run_args="--data $data"
tiny() {   # tiny NAME MDL DEFINES...
  local name=$1 mdl=$2; shift 2
  local p="$out/$name.plan"
  # shellcheck disable=SC2086  # $target is two words or none
  run_part "$name-mcc" 90 "$MCC" "$samples/$mdl" "$@" $target -o "$p"
  if [ "$rc" != 0 ]; then row "train-$name" "$(status_of)" "mcc: $(why_failed "$out/$name-mcc.log")"; return; fi
  # shellcheck disable=SC2086  # $run_args: mrun's words for this model (the data by default)
  run_part "$name-cpu" 90 "$MRUN" "$p" --cpu --steps 20 $run_args --metrics "$out/$name-cpu.jsonl"
  if [ "$rc" != 0 ]; then row "train-$name" "$(status_of)" "CPU rank: $(why_failed "$out/$name-cpu.log")"; return; fi
  local cpus=$secs
  if [ "$gpu" = 0 ]; then
    row "train-$name" "no GPU" "CPU rank: 20 steps, loss $(losses "$out/$name-cpu.jsonl" | head -1) -> $(losses "$out/$name-cpu.jsonl" | tail -1) (${cpus}s)"
    return
  fi
  # shellcheck disable=SC2086
  run_part "$name-gpu" 90 "$MRUN" "$p" --steps 20 $run_args --metrics "$out/$name-gpu.jsonl"
  if [ "$rc" != 0 ]; then row "train-$name" "$(status_of)" "GPU: $(why_failed "$out/$name-gpu.log")"; return; fi
  paste <(losses "$out/$name-gpu.jsonl") <(losses "$out/$name-cpu.jsonl") > "$out/$name-losses.tsv"
  local d graphs
  d=$(maxrel "$out/$name-losses.tsv")
  graphs=$(grep -o "CUDA graphs: .*" "$out/$name-gpu.log" | head -1)
  local res=ok
  awk -v d="$d" -v t="${tiny_tol:-2e-3}" 'BEGIN{exit !(d <= t)}' || res=FAIL
  [ "$(wc -l < "$out/$name-losses.tsv")" = 20 ] || res=FAIL
  # validation losses (--eval-interval), side by side as well
  local vnote=""
  if grep -q '"val_loss"' "$out/$name-cpu.jsonl"; then
    paste <(vlosses "$out/$name-gpu.jsonl") <(vlosses "$out/$name-cpu.jsonl") > "$out/$name-vlosses.tsv"
    local vd
    vd=$(maxrel "$out/$name-vlosses.tsv")
    awk -v d="$vd" 'BEGIN{exit !(d <= 2e-3)}' || res=FAIL
    [ "$(wc -l < "$out/$name-vlosses.tsv")" = "$(vlosses "$out/$name-cpu.jsonl" | wc -l)" ] || res=FAIL
    vnote="; $(wc -l < "$out/$name-vlosses.tsv") validations, GPU $(tail -1 "$out/$name-vlosses.tsv" | cut -f1), max rel diff $vd"
  fi
  row "train-$name" "$res" "20 steps, GPU $(head -1 "$out/$name-losses.tsv" | cut -f1) -> $(tail -1 "$out/$name-losses.tsv" | cut -f1), CPU -> $(tail -1 "$out/$name-losses.tsv" | cut -f2); max rel diff $d (limit ${tiny_tol:-2e-3})$vnote; ${graphs:-no CUDA graph}; GPU ${secs}s, CPU ${cpus}s"
}
if want train; then
tiny gpt gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
tiny llama llama.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
tiny moe moe.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D batch=8 -D micro_batch=4
# packed sequences (document masks from the end-of-document id 0, about one
# per 32 mock tokens), a sliding window of 16, a validation every 5 steps
run_args="--mock-data --reset-position-ids --reset-attention-mask --eod-mask-loss --eod-id 0 --eval-interval 5 --eval-iters 2"
tiny packed gpt_packed.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=32 -D window=16 -D batch=8 -D micro_batch=4
run_args="--data $data"
# ALiBi (issue 24): samples/bert.mdl, a bidirectional masked LM whose
# attention adds -slope |i - j| per head
tiny bert bert.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
# activation recompute: every layer's forward again in the backward (GEMMs, attention), only
# each layer's input held (mcc --recompute full)
tiny recompute gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4 --recompute full
# bf16 (bf16 storage, f32 arithmetic on the GPU, f64 on the CPU: values on a
# rounding boundary round apart, hence the looser limit)
tiny_tol=2e-2 tiny gpt-bf16 gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4 --precision bf16
# causal ALiBi (samples/bloom.mdl): the slopes made on the device (arange)
tiny bloom bloom.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
fi

# ---- generation: KV-cache decoding on the GPU, each token checked ----
# gen NAME MDL DEFINES...: 30 CPU steps saved, then 16 greedy tokens on the
# GPU with --generate-check (every token against a full forward's argmax)
gen() {
  local name=$1 mdl=$2; shift 2
  local p="$out/gen-$name.plan" ck="$out/gen-$name.ck"
  # shellcheck disable=SC2086
  run_part "gen-$name-mcc" 60 "$MCC" "$samples/$mdl" "$@" --decode $target -o "$p"
  if [ "$rc" != 0 ]; then row "generate-$name" "$(status_of)" "mcc: $(why_failed "$out/gen-$name-mcc.log")"; return; fi
  run_part "gen-$name-train" 60 "$MRUN" "$p" --cpu --steps 30 --data "$data" --save "$ck" --quiet
  if [ "$rc" != 0 ]; then row "generate-$name" "$(status_of)" "CPU training: $(why_failed "$out/gen-$name-train.log")"; return; fi
  local dev=()
  [ "$gpu" = 0 ] && dev=(--cpu)
  run_part "gen-$name" 60 "$MRUN" "$p" "${dev[@]}" --load "$ck" --generate --prompt "In the beginning God" \
    --max-tokens 16 --generate-check
  if [ "$rc" != 0 ]; then row "generate-$name" "$(status_of)" "$(why_failed "$out/gen-$name.log")"; return; fi
  local chk; chk=$(grep -o "full-forward check: .*" "$out/gen-$name.log" | head -1)
  local res=ok
  case "$chk" in *"all 16 tokens equal"*) ;; *) res=FAIL ;; esac
  [ "$gpu" = 0 ] && res="no GPU"
  row "generate-$name" "$res" "${chk:-no check line}; $(grep -o "[0-9.]* tokens/s (prefill.*" "$out/gen-$name.log" | head -1) (${secs}s)"
}
if want generate; then
gen gpt gpt.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
gen bloom bloom.mdl -D layers=2 -D d_model=64 -D heads=4 -D seq_len=64 -D vocab=256 -D batch=8 -D micro_batch=4
fi

# ---- GPT-2 124M, 8 x 1024 tokens per step ----
L=12 D=768 V=50304 S=1024 B=8
# parameters less the position table (nanoGPT's count), and the model FLOPs
# per token 6N + 12*L*D*S (PaLM, appendix B: 12 L H Q T with H*Q = D, T = S)
N=$(( V * D + L * (12 * D * D + 13 * D) + 2 * D ))
fpt=$(( 6 * N + 12 * L * D * S ))
mfu_note="MFU = tokens/s x (6N + 12*L*d*s) / peak, N=$N; peak f32 ${peak32:-?} TFLOP/s (dense, no tensor cores), tf32 ${peaktf32:-?} and bf16 ${peak16:-?} (dense, tensor cores)"
# gpt2_row NAME LABEL PEAK [ENV=VALUE...]: the plan ($gpt2_plan, else gpt2.plan) 8 steps on the GPU (under env), the
# median of the steps after the third (the first runs eagerly, the second captures); MFU
# against PEAK TFLOP/s
gpt2_row() {
  local name=$1 label=$2 peak=$3; shift 3
  run_part "$name-gpu" 150 env "$@" "$MRUN" "${gpt2_plan:-$out/gpt2.plan}" --steps 8 --data "$data" --metrics "$out/$name.jsonl"
  if [ "$rc" != 0 ]; then row "$name" "$(status_of)" "$(why_failed "$out/$name-gpu.log")"; return; fi
  local st tps mfu
  st=$(sed -n 's/.*"elapsed_s": *\([0-9.eE+-]*\).*/\1/p' "$out/$name.jsonl" |
       awk '{t[NR]=$1} END{for(i=4;i<=NR;i++) print t[i]-t[i-1]}' | sort -g |
       awk '{d[NR]=$1} END{print (NR ? d[int((NR+1)/2)] : 0)}')
  if ! awk -v s="$st" 'BEGIN{exit !(s > 0)}'; then row "$name" FAIL "no step times in $out/$name.jsonl"; return; fi
  tps=$(awk -v s="$st" -v t=$((B * S)) 'BEGIN{printf "%.0f", t/s}')
  mfu=$(awk -v s="$st" -v t=$((B * S)) -v f=$fpt -v p="${peak:-0}" 'BEGIN{if (p>0) printf "%.1f%%", 100*t*f/s/(p*1e12); else print "?"}')
  row "$name" ok "tessera $label: $(awk -v s="$st" 'BEGIN{printf "%.1f", s*1000}') ms/step, $tps tokens/s, MFU $mfu of ${peak:-?} TFLOP/s; loss $(losses "$out/$name.jsonl" | head -1) -> $(losses "$out/$name.jsonl" | tail -1)"
}
if ! want gpt2-124m; then :
elif [ "$gpu" = 1 ]; then
  run_part gpt2-mcc 120 "$MCC" "$samples/gpt.mdl" -D batch=$B -D micro_batch=$B $target -o "$out/gpt2.plan"
  if [ "$rc" != 0 ]; then row gpt2-124m "$(status_of)" "mcc: $(why_failed "$out/gpt2-mcc.log")"
  else
    gpt2_row gpt2-124m f32 "${peak32:-}" TS_CUDA_TF32=0
    # the GEMMs on tensor cores in TF32 (cuBLASLt's CUBLAS_COMPUTE_32F_FAST_TF32; the
    # generated kernels, attention included, stay f32): against PyTorch's allow_tf32
    want tf32 && gpt2_row gpt2-124m-tf32 "f32, TF32 GEMMs" "${peaktf32:-}" TS_CUDA_TF32=1
    # bf16 activations and parameter copies (the GEMMs still read f32 casts: not tensor-core bf16 yet)
    if want bf16; then
      run_part gpt2-bf16-mcc 120 "$MCC" "$samples/gpt.mdl" -D batch=$B -D micro_batch=$B --precision bf16 $target \
        -o "$out/gpt2-bf16.plan"
      if [ "$rc" != 0 ]; then row gpt2-124m-bf16 "$(status_of)" "mcc: $(why_failed "$out/gpt2-bf16-mcc.log")"
      else gpt2_plan="$out/gpt2-bf16.plan" gpt2_row gpt2-124m-bf16 "bf16 storage, f32 GEMMs" "${peak32:-}" TS_CUDA_TF32=0
      fi
    fi
  fi
else
  row gpt2-124m "no GPU" "$mfu_note"
fi

# ---- PyTorch on the same GPU ----
torch_row() {   # torch_row NAME SECONDS ARGS...
  local name=$1 want=$2; shift 2
  if [ "$gpu" = 0 ]; then row "$name" "no GPU" "bench/torch_step.py --device cuda $*"; return; fi
  run_part "$name" "$want" env PYTHONUNBUFFERED=1 python3 "$src/bench/torch_step.py" --device cuda --vocab $V \
    --d-model $D --heads 12 --layers $L --batch $B --seq $S --steps 5 --warmup 2 "$@"
  if [ "$rc" != 0 ]; then row "$name" "$(status_of)" "$(tail -1 "$out/$name.log" | cut -c1-200)"; return; fi
  local st peak=${peak32:-0}
  case " $* " in *" --bf16 "*) peak=${peak16:-0} ;; *" --tf32 "*) peak=${peaktf32:-0} ;; esac
  st=$(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); s=sorted(d["step_s"]); print(s[len(s)//2])' "$out/$name.log")
  row "$name" ok "$(awk -v s="$st" -v t=$((B * S)) -v f=$fpt -v p="$peak" 'BEGIN{printf "%.1f ms/step, %.0f tokens/s, MFU %s of %s TFLOP/s", s*1000, t/s, (p>0? sprintf("%.1f%%", 100*t*f/s/(p*1e12)) : "?"), p}') (bench/torch_step.py --device cuda $*)"
}
# ---- where GPT-2's step goes: CUDA events around every launch ----
if ! want kernels; then :
elif [ "$gpu" = 0 ] || [ ! -f "$out/gpt2.plan" ]; then row kernels "no GPU" "TS_RT_PROFILE=1 mrun gpt2.plan"
else
  run_part kernels 90 env TS_RT_PROFILE=1 "$MRUN" "$out/gpt2.plan" --steps 4 --data "$data" --quiet
  if [ "$rc" != 0 ]; then row kernels "$(status_of)" "$(why_failed "$out/kernels.log")"
  else
    grep -A11 "GPU time per kernel" "$out/kernels.log" > "$out/kernels.txt"
    head -1 "$out/kernels.txt" | grep -q . && row kernels ok "$(head -1 "$out/kernels.txt" | sed 's/^rt profile: //'); the ten most: below" ||
      row kernels FAIL "no GPU profile in the output"
  fi
fi

want torch && torch_row torch-eager 120

# ---- compute-sanitizer over one tiny step ----
san() {   # san NAME TOOL
  local name=$1 tool=$2
  if [ "$gpu" = 0 ]; then row "$name" "no GPU" "compute-sanitizer --tool $tool"; return; fi
  local cs; cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -z "$cs" ] || [ ! -f "$out/gpt.plan" ]; then row "$name" skipped "no compute-sanitizer or no tiny plan"; return; fi
  run_part "$name" 100 "$cs" --tool "$tool" --error-exitcode 9 "$MRUN" "$out/gpt.plan" --steps 2 --data "$data" --quiet
  local summary; summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$name.log" | tail -1)
  row "$name" "$(status_of)" "${summary:-$(why_failed "$out/$name.log")} (${secs}s)"
}
if want train; then
  san memcheck memcheck
  san racecheck racecheck
fi

want torch && want tf32 && torch_row torch-tf32 120 --tf32
want torch && torch_row torch-compile 180 --compile
want torch && torch_row torch-bf16 90 --bf16

# ---- last, if the budget allows: GPT-2 124M with the f32 kernels in f64 arithmetic ----
# (TS_CUDA_EXACT=1: the mode of the GPU runs before 2026-11-27; docs/cuda.md "The printer"):
# what f32 arithmetic gains.  Its own plan: the image is compiled in the mode it runs in.
if ! want exact; then :
elif [ "$gpu" = 1 ] && [ -f "$out/gpt2.plan" ]; then
  run_part gpt2-exact-mcc 120 env TS_CUDA_EXACT=1 "$MCC" "$samples/gpt.mdl" -D batch=$B -D micro_batch=$B $target \
    -o "$out/gpt2-exact.plan"
  if [ "$rc" != 0 ]; then row gpt2-124m-exact "$(status_of)" "mcc: $(why_failed "$out/gpt2-exact-mcc.log")"
  else
    gpt2_plan="$out/gpt2-exact.plan" gpt2_row gpt2-124m-exact "f32, f64 arithmetic (TS_CUDA_EXACT=1)" "${peak32:-}" \
      TS_CUDA_TF32=0 TS_CUDA_EXACT=1
  fi
else
  row gpt2-124m-exact "no GPU" "TS_CUDA_EXACT=1: GPT-2 124M with f64 arithmetic in its f32 kernels"
fi

# ---- the table ----
{
  echo "| part | result | detail |"
  echo "|------|--------|--------|"
  awk -F'\t' '{gsub(/\|/, "/", $3); printf "| %s | %s | %s |\n", $1, $2, $3}' "$out/summary.tsv"
  echo
  echo "$mfu_note. $(left)s of the ${budget}s budget left; logs in $out."
  if [ -s "$out/kernels.txt" ]; then
    echo
    echo "GPT-2 124M f32, steps 2-4 with a CUDA event around every launch (graphs off):"
    echo '```'
    cat "$out/kernels.txt"
    echo '```'
  fi
} > "$out/table.md"
cat "$out/table.md"
# exit 0 when nothing failed (a row "no GPU" or "skipped" is not a failure)
! cut -f2 "$out/summary.tsv" | grep -q -E "FAIL|TIMEOUT"
