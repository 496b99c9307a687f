#!/usr/bin/env bash
# data_start.sh - how long mrun takes to get a large indexed dataset ready
# (issue 22: "a second start on a multi-GB dataset takes well under a
# second"): cold (no cache: the document, sample and shuffle indices are
# built and written) and warm (the cache files mapped and checked).
#   bench/data_start.sh [--build build] [--tokens N] [--mean-len L] [--runs R]
# Makes a synthetic dataset of N tokens (default 1.5e9: 3 GB of u16 ids)
# in a temporary folder: .idx with sequences of random lengths in
# [1, 2L) (mean L, default 1000), .bin a sparse file of zeros (so no disk
# is spent on it and every id is valid).  Trains the tiny GPT with
# seq_len 1024 for one step and reports the medians over R runs (default
# 3) of:
#   data:  the "data:" line's seconds (indices built / loaded, in rank 0);
#   wall:  the whole `mrun PLAN --steps 1` (process start to exit).
# The dataset is never committed: it lives and dies in the temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build tokens=1500000000 mean=1000 runs=3
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --tokens) tokens=$2; shift ;;
    --mean-len) mean=$2; shift ;;
    --runs) runs=$2; shift ;;
    *) echo "data_start.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python

# the dataset: lengths drawn from a fixed seed, the last one adjusted so
# they sum to exactly N (numpy when there is one: millions of sequences)
"$py" - "$TMP/ds" "$tokens" "$mean" <<'EOF'
import os, struct, sys
prefix, N, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import numpy as np
rng = np.random.default_rng(1)
n = N // L + N // L // 10 + 100   # enough to reach N
lens = rng.integers(1, 2 * L, size=n, dtype=np.int64)
c = np.cumsum(lens)
k = int(np.searchsorted(c, N))           # the first sequence that reaches N
lens = lens[: k + 1]
lens[k] -= int(c[k]) - N
lens = lens[lens > 0].astype(np.int32)
ptr = np.zeros(len(lens), dtype=np.int64)
ptr[1:] = np.cumsum(lens[:-1].astype(np.int64)) * 2
with open(prefix + ".bin", "wb") as f:
    f.truncate(N * 2)                       # sparse: zeros, no disk
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lens), len(lens) + 1))
    f.write(lens.tobytes()); f.write(ptr.tobytes()); f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())
print("dataset: %d tokens (%.2f GB of u16) in %d sequences, mean length %d" % (N, N * 2 / 1e9, len(lens), L))
EOF
"$build/mcc" samples/gpt.mdl -D layers=1 -D d_model=16 -D heads=2 -D seq_len=1024 -D vocab=256 -D batch=8 \
  -D micro_batch=8 -o "$TMP/p.plan" 2>/dev/null
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# row MODE(cold|warm)
row() {
  local mode=$1 datas="" walls=""
  for r in $(seq "$runs"); do
    [ "$mode" = cold ] && rm -rf "$TMP/cache"
    local t0 t1 out
    t0=$(date +%s.%N)
    out=$("$build/mrun" "$TMP/p.plan" --steps 1 --data-path "$TMP/ds" --data-cache-path "$TMP/cache" 2>/dev/null)
    t1=$(date +%s.%N)
    datas="$datas $(echo "$out" | sed -n 's/^data: .* in \([0-9.]*\) s$/\1/p' | head -1)"
    walls="$walls $(echo "$t0 $t1" | awk '{printf "%.3f", $2 - $1}')"
    [ "$r" = 1 ] && echo "$out" | grep '^data:' | sed 's|'"$TMP"'/||g' | sed 's/^/  /'
  done
  printf "%-5s  data %6.3f s   wall %6.3f s\n" "$mode" "$(echo "$datas" | tr ' ' '\n' | grep . | median)" \
    "$(echo "$walls" | tr ' ' '\n' | grep . | median)"
}
row cold
row warm
du -sh "$TMP/cache" | awk '{print "cache: " $1}'
