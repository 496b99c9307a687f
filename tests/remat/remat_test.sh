#!/bin/bash
# remat_test.sh - see CMakeLists.txt.  usage: remat_test.sh MCC MRUN PARAMS_DIFF SRCDIR TMPDIR
set -u
MCC=$1 MRUN=$2 PDIFF=$3 SRC=$4 TMP=$5
rm -rf "$TMP" && mkdir -p "$TMP" && cd "$TMP" || exit 1
fail=0
die() { echo "FAIL: $*" >&2; fail=1; }
data="$SRC/samples/data/kjv.txt"

# held IR: the ops of values made before `output "loss"` in block micro and read after it
held_ops() {
  python3 - "$1" <<'PY'
import re, sys
inb, loss, defs, late = False, None, {}, set()
for line in open(sys.argv[1]):
    if line.startswith('block micro'): inb = True; continue
    if not inb: continue
    if line.startswith('}'): break
    m = re.match(r'\s*%(\d+) = (\S+)', line)
    if 'output "loss"' in line: loss = True; continue
    lhs = line.split(':')[0]
    if m: defs.setdefault(int(m.group(1)), (m.group(2), loss)); lhs = lhs.split('=', 1)[1]
    if loss:
        for u in re.findall(r'%(\d+)', lhs):
            if int(u) in defs and not defs[int(u)][1]: late.add(int(u))
print(' '.join(sorted({defs[v][0] for v in late if defs[v][0] != 'state'})))
PY
}
held_bytes() { awk '/held for the backward/ { print $(NF-1) }' "$1"; }

for model in gpt llama; do
  D="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 --precision f64"
  [ $model = llama ] && D="$D -D kv_heads=2 -D ffn=64"
  "$MCC" "$SRC/samples/$model.mdl" $D --emit=ir -o $model.ir 2> err.txt || { die "$model: mcc: $(cat err.txt)"; continue; }
  "$MCC" "$SRC/samples/$model.mdl" $D --no-remat --emit=ir -o $model.keep.ir 2> err.txt || { die "$model: mcc --no-remat: $(cat err.txt)"; continue; }
  kept=$(held_ops $model.keep.ir) now=$(held_ops $model.ir)
  echo "$model held ops, --no-remat: $kept"
  echo "$model held ops, remat:      $now"
  for op in layernorm rmsnorm gelu_tanh silu broadcast; do
    case " $kept " in *" $op "*) case " $now " in *" $op "*) die "$model: a $op value is still held across the loss" ;; esac ;; esac
  done
  case " $now " in *" matmul "*|*" permute "*|*" add "*|*" reshape "*) ;; *) die "$model: nothing GEMM-related held: the pass removed too much? ($now)" ;; esac
  [ "$kept" != "$now" ] || die "$model: remat changed nothing that is held"
  "$MCC" "$SRC/samples/$model.mdl" $D --report memory > r.txt && "$MCC" "$SRC/samples/$model.mdl" $D --no-remat --report memory > k.txt ||
    die "$model: --report memory"
  hr=$(held_bytes r.txt) hk=$(held_bytes k.txt)
  echo "$model held for the backward: $hk bytes with --no-remat, $hr with remat"
  [ -n "$hr" ] && [ -n "$hk" ] && [ "$hr" -lt "$hk" ] || die "$model: held bytes $hr (remat) not below $hk (--no-remat)"
done

# training: bit-identical on the reference backend, 1e-12 on the LLVM backend
train() {   # name plan gpus backend
  "$MRUN" "$2" --gpus "$3" --backend "$4" --steps 3 --quiet --data "$data" --metrics "$1.jsonl" --save-params "$1.bin" \
    > "$1.out" 2> "$1.err" || { die "mrun $1: $(tail -3 "$1.err")"; return 1; }
}
D="-D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=2 --precision f64"
layouts=("gpt 1" "gpt 2 --tp 2 --sp" "gpt 2 --tp 2 --sp --regather" "gpt 2 --tp 2 --sp --activation-budget 140000" "gpt 2 --pp 2" "llama 1" "llama 2 --tp 2 --sp --regather")
# TS_REMAT_SUBSET=1 (the sanitizer build): three of them, the runtime paths the others share
[ "${TS_REMAT_SUBSET:-0}" = 1 ] && layouts=("gpt 1" "gpt 2 --tp 2 --sp --activation-budget 140000" "llama 2 --tp 2 --sp --regather")
for layout in "${layouts[@]}"; do
  set -- $layout
  model=$1 g=$2; shift 2
  DD="$D"; [ $model = llama ] && DD="$D -D kv_heads=2 -D ffn=64"
  name="${model}_$g$(printf %s "$*" | tr -d " -")"
  "$MCC" "$SRC/samples/$model.mdl" $DD "$@" -o $name.plan 2> err.txt &&
    "$MCC" "$SRC/samples/$model.mdl" $DD "$@" --no-remat -o $name.keep.plan 2>> err.txt || { die "$name: mcc: $(cat err.txt)"; continue; }
  train $name.remat $name.plan $g ref && train $name.keep $name.keep.plan $g ref || continue
  if cmp -s $name.remat.bin $name.keep.bin && cmp -s <(sed 's/"tokens_per_s.*//' $name.remat.jsonl) <(sed 's/"tokens_per_s.*//' $name.keep.jsonl); then
    echo "$name: reference backend, remat and --no-remat: losses and parameters bit-identical"
  else die "$name: remat changes the numbers on the reference backend"; "$PDIFF" $name.keep.bin $name.remat.bin 0; fi
  if [ "$g" = 1 ]; then
    train $name.llvm $name.plan 1 llvm && { "$PDIFF" $name.keep.bin $name.llvm.bin 1e-12 || die "$name: LLVM backend on the remat plan"; }
  fi
done
[ $fail = 0 ] && echo "remat: all checks passed"
exit $fail
