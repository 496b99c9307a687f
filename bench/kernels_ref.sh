#!/usr/bin/env bash
# bench/kernels_ref.sh - where a GPT-2 training step spends its time in the
# reference kernels (runtime/cpu/ops_ref.c), for one or two builds side by side:
# `mrun` with TS_RT_PROFILE=1, per-op seconds per step (median over runs),
# the step time and tokens/s.  Prints one markdown table.
#
#   bench/kernels_ref.sh [--build DIR] [--base DIR] [--runs N] [--steps N]
#                        [--batch B] [--seq T] [--threads N] [--mrun-args STR]
#
#   --build DIR   the build to measure (default: build/); needs mcc and mrun
#   --base DIR    a second build (e.g. of an older commit) shown as "before"
#   --runs N      mrun runs per build (default 3); the median is reported
#   --steps N     steps per run (default 2: the first is a warm-up, only the
#                 per-op totals of steps after it count; see below)
#   --threads N   OPENBLAS_NUM_THREADS, TS_NUM_THREADS, TS_THREADS (default 2)
#   --mrun-args S extra mrun options for --build's runs only (e.g.
#                 "--backend ref": the reference kernels on a build whose
#                 mrun defaults to the LLVM backend)
#
# Per-op time per step = (profile of a run of S steps - profile of a run of
# 1 step) / (S - 1): the first step pays page faults of the slab and buffer
# pool and OpenBLAS's start-up, which later steps do not.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
base=""
margs=""
runs=3
steps=2
B=4
T=256
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) B=$2; shift 2 ;;
    --seq) T=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --mrun-args) margs=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "kernels_ref.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$runs" "$steps" "$B" "$T" "$threads"; do
  case "$v" in ''|*[!0-9]*|0) echo "kernels_ref.sh: counts must be positive integers" >&2; exit 2 ;; esac
done
[ "$steps" -ge 2 ] || { echo "kernels_ref.sh: --steps must be at least 2 (one warm-up step)" >&2; exit 2; }
builds=("$build")
[ -n "$base" ] && builds=("$base" "$build")
for b in "${builds[@]}"; do
  for t in mcc mrun; do
    [ -x "$b/$t" ] || { echo "kernels_ref.sh: $b/$t not found (build it: cmake --build $b --target $t)" >&2; exit 1; }
  done
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OPENBLAS_NUM_THREADS=$threads TS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads TS_THREADS=$threads
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

# run BUILD STEPS OUT [ARGS]: one mrun with the profile on stderr into OUT
run() {
  # shellcheck disable=SC2086  # ARGS are words on purpose
  "$1/mrun" "$TMP/g.plan" --steps "$2" --metrics "$3.jsonl" ${4:-} 2>"$3" >/dev/null ||
    { echo "kernels_ref.sh: mrun failed:" >&2; tail -5 "$3" >&2; exit 1; }
}
i=0
for b in "${builds[@]}"; do
  "$b/mcc" "$here/samples/gpt.mdl" -D batch=$B -D micro_batch=$B -D seq_len=$T -o "$TMP/g.plan"
  a=""
  [ "$b" = "$build" ] && a=$margs
  for r in $(seq 1 "$runs"); do
    TS_RT_PROFILE=1 run "$b" 1 "$TMP/p$i.1.$r" "$a"
    TS_RT_PROFILE=1 run "$b" "$steps" "$TMP/p$i.S.$r" "$a"
  done
  i=$((i + 1))
done

/usr/bin/python3 - "$TMP" "$runs" "$steps" "$B" "$T" "${#builds[@]}" "$threads" <<'EOF'
import json, re, statistics, sys
tmp, runs, steps, B, T, nb, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
def prof(path):
    d = {}
    for line in open(path):
        m = re.match(r"\s+(\S+)\s+([\d.]+) s\s", line)
        if m: d[m.group(1)] = float(m.group(2))
    return d
def step_times(path):
    t = [json.loads(l)["elapsed_s"] for l in open(path) if "elapsed_s" in l]
    return [b - a for a, b in zip(t, t[1:])]
cols = []
for i in range(nb):
    per = {}   # op -> per-run seconds per step (after the first)
    st = []
    for r in range(1, runs + 1):
        p1, pS = prof("%s/p%d.1.%d" % (tmp, i, r)), prof("%s/p%d.S.%d" % (tmp, i, r))
        for op in set(p1) | set(pS):
            per.setdefault(op, []).append(max(0.0, (pS.get(op, 0) - p1.get(op, 0)) / (steps - 1)))
        st += step_times("%s/p%d.S.%d.jsonl" % (tmp, i, r))
    cols.append(({op: statistics.median(v) for op, v in per.items()}, statistics.median(st)))
ops = sorted(set().union(*[c[0] for c in cols]), key=lambda o: -cols[-1][0].get(o, 0))
names = ["before", "after"] if nb == 2 else ["s/step"]
print()
print("| op | " + " | ".join(n + " (s/step)" for n in names) + (" | speed-up |" if nb == 2 else " |"))
print("|---|" + "---:|" * (nb + (1 if nb == 2 else 0)))
for op in ops:
    v = [c[0].get(op, 0.0) for c in cols]
    if max(v) < 0.005: continue
    row = "| %s | " % op + " | ".join("%.3f" % x for x in v)
    if nb == 2: row += " | %.1fx" % (v[0] / v[1] if v[1] > 0 else float("inf"))
    print(row + " |")
tot = [sum(c[0].values()) for c in cols]
print("| **all kernels** | " + " | ".join("**%.3f**" % x for x in tot) + (" | %.1fx |" % (tot[0] / tot[1]) if nb == 2 else " |"))
print("| **step (wall)** | " + " | ".join("**%.3f**" % c[1] for c in cols) + (" | %.1fx |" % (cols[0][1] / cols[1][1]) if nb == 2 else " |"))
print("| tokens/s | " + " | ".join("%.0f" % (B * T / c[1]) for c in cols) + (" | |" if nb == 2 else " |"))
print()
print("GPT-2 124M, B=%d, T=%d, f32, %s threads; median of %d runs of %d steps (per-op: steps after the first)." % (B, T, threads, runs, steps))
EOF
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
