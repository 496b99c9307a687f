#!/usr/bin/env bash
# data_step.sh - the step time with real data (an indexed dataset) against
# --mock-data (issue 22 D6: batches off the critical path), with the
# prefetch thread and without it (--no-prefetch).
#   bench/data_step.sh [--build build] [--steps N] [--tokens T] [--runs R]
# Writes a dataset of T random u16 ids (default 20M: 40 MB; documents of
# random lengths, tests/gptdata's writer) in a temporary folder, compiles
# samples/gpt.mdl (4 layers, d_model 128, seq_len 256, vocab 50304,
# global batch 16 in micro batches of 4) and trains it N steps (default
# 30) per mode, R runs (default 3), interleaved.  Prints, per mode, the
# median over runs of the median step time (steps 3..N: the first steps
# pay for page faults and the JIT).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=30 tokens=20000000 runs=3
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --steps) steps=$2; shift ;;
    --tokens) tokens=$2; shift ;;
    --runs) runs=$2; shift ;;
    *) echo "data_step.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP/ds" "$tokens" <<'PY'
import array, os, random, struct, sys
sys.path.insert(0, os.path.join("tests", "gptdata"))
prefix, total = sys.argv[1], int(sys.argv[2])
r = random.Random(1)
lens = []
n = 0
while n < total:
    L = min(r.randrange(50, 4000), total - n)
    lens.append(L)
    n += L
ids = array.array("H", (r.randrange(50304) for _ in range(n)))
with open(prefix + ".bin", "wb") as f:
    ids.tofile(f)
ptr, p = [], 0
for L in lens:
    ptr.append(p)
    p += 2 * L
with open(prefix + ".idx", "wb") as f:   # MMIDIDX (docs/data.md)
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", len(lens), len(lens) + 1))
    f.write(array.array("i", lens).tobytes())
    f.write(array.array("q", ptr).tobytes())
    f.write(array.array("q", range(len(lens) + 1)).tobytes())
PY
"$build/mcc" samples/gpt.mdl -D layers=4 -D d_model=128 -D heads=4 -D seq_len=256 -D vocab=50304 -D batch=16 \
  -D micro_batch=4 -o "$TMP/p.plan"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
step_ms() {   # the median step time (ms) of a metrics file, steps 3..N
  python3 -c "import json,sys; e=[json.loads(l)['elapsed_s'] for l in open(sys.argv[1])]; \
d=sorted((b-a)*1e3 for a,b in zip(e[1:],e[2:])); print(d[len(d)//2])" "$1"
}
declare -A res
modes="mock real real_noprefetch"
for r in $(seq "$runs"); do
  for m in $modes; do
    case $m in
      mock) args=(--mock-data) ;;
      real) args=(--data-path "$TMP/ds" --data-cache-path "$TMP/cache") ;;
      real_noprefetch) args=(--data-path "$TMP/ds" --data-cache-path "$TMP/cache" --no-prefetch) ;;
    esac
    "$build/mrun" "$TMP/p.plan" --steps "$steps" --quiet --metrics "$TMP/$m.jsonl" "${args[@]}" >/dev/null 2>&1
    res[$m]+="$(step_ms "$TMP/$m.jsonl") "
  done
done
printf "%-18s %12s   %s\n" mode "step ms" "(median of $runs runs; per run: median of steps 3..$steps)"
for m in $modes; do
  printf "%-18s %12.2f   %s\n" "$m" "$(echo "${res[$m]}" | tr ' ' '\n' | grep . | median)" "${res[$m]}"
done
