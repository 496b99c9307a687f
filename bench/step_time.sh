#!/usr/bin/env bash
# step_time.sh - GPT-2 training step time, Tessera (mcc + mrun) against
# PyTorch CPU (bench/torch_step.py, the hand-written GPT-2 of
# tests/oracle/models.py), side by side in one run, f32, same sizes, same
# optimizer, same thread count.  Tessera runs three ways: the reference
# backend (mrun --backend ref; it ignores fusion groups, so "ref fused" is
# the same computation and not run), the LLVM backend on a plan compiled
# with --no-fuse (one generated kernel per elementwise / row op), and the
# LLVM backend on the default, fused plan.  Prints a markdown table:
# config, system, median step time, tokens/s, model GFLOP/s, peak RSS,
# tokens/s relative to PyTorch; then a second table with mcc's compile
# time and mrun's time to the end of the first step with a cold and a warm
# kernel cache (and the JIT's share); then the machine's sgemm rate.
#
#   bench/step_time.sh                  quick: GPT-2 124M, B=4, T=64
#   bench/step_time.sh --full           the issue's target: B=4, T=256
#   bench/step_time.sh --config tiny --config quick --steps 5
#   options: --config NAME (repeatable: tiny, quick, full), --full,
#            --steps N (timed, default 3), --warmup N (default 1),
#            --threads N (default 2), --build DIR (mcc/mrun; default build)
#
# Step time = wall time of one optimizer step (forward, backward, clip,
# AdamW) with B*T tokens; the median over the timed steps after warm-up.
# Tessera's times come from mrun --metrics (elapsed_s differences); peak
# RSS from /usr/bin/time -f %M of each whole process (so PyTorch's includes
# the torch library itself).  Not a test: no assertions, not in ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3            # Debian's python3: the only one with torch

configs=() steps=3 warmup=1 threads=2 build=build
while [ $# -gt 0 ]; do
  case $1 in
    --full) configs+=(full) ;;
    --config) configs+=("${2:?--config needs a name}"); shift ;;
    --steps) steps=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --threads) threads=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "step_time.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#configs[@]} -gt 0 ] || configs=(quick)
for n in "$steps" "$warmup" "$threads"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "step_time.sh: '$n' is not a whole number" >&2; exit 2; }
done
[ "$steps" -ge 1 ] && [ "$threads" -ge 1 ] || { echo "step_time.sh: --steps and --threads must be >= 1" >&2; exit 2; }

MCC=$build/mcc MRUN=$build/mrun
for t in "$MCC" "$MRUN" /usr/bin/time "$PY"; do
  [ -x "$t" ] || { echo "step_time.sh: '$t' not found (build Tessera first, e.g. cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2; /usr/bin/time is Debian's 'time' package)" >&2; exit 2; }
done
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "step_time.sh: warning: $build is not a Release build; its times mean little" >&2
fi

# Same thread count everywhere: OpenBLAS (Tessera's GEMMs), OpenMP (torch),
# and torch.set_num_threads in torch_step.py.  OPENBLAS_CORETYPE, when the
# machine sets it, is left alone (see shared FACTS).
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# PyTorch (Debian's build) runs elementwise ops on an OpenMP pool and GEMMs
# on OpenBLAS' own pthread pool.  With GNU OpenMP's default ACTIVE wait its
# idle threads spin while OpenBLAS works, so the two pools fight for the
# cores: measured here 2-3x slower steps on a busy machine.  PASSIVE is the
# usual fix and the fair baseline (same thread count); an OMP_WAIT_POLICY
# already in the environment wins.
torch_wait=${OMP_WAIT_POLICY:-PASSIVE}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# config NAME -> "B T layers d_model heads vocab"; ffn = 4 * d_model.
config_sizes() {
  case $1 in
    tiny) echo "4 64 2 128 4 50304" ;;       # a few seconds: checks the script itself
    quick) echo "4 64 12 768 12 50304" ;;    # GPT-2 124M
    full) echo "4 256 12 768 12 50304" ;;    # the issue's target
    *) echo "step_time.sh: unknown config '$1' (tiny, quick, full)" >&2; return 1 ;;
  esac
}

for cfg in "${configs[@]}"; do config_sizes "$cfg" >/dev/null || exit 2; done

# sgemm rate at $threads threads through the same OpenBLAS that Tessera links:
# C = A*B with square n x n f32 matrices, 2*n^3 flops, median of 9 calls.
cat >"$TMP/sgemm.c" <<'EOF'
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(void) {
  const int n = 2048, reps = 9;
  float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
  if (!a || !b || !c) return 1;
  for (long i = 0; i < (long)n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.2f; }
  double t[9];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a, n, b, n, 0.f, c, n);  /* warm-up */
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a, n, b, n, 0.f, c, n);
    t[r] = now() - t0;
  }
  qsort(t, reps, sizeof *t, cmp);
  printf("%.1f\n", 2.0 * n * n * n / t[reps / 2] / 1e9);
  free(a); free(b); free(c);
  return 0;
}
EOF
sgemm=n/a
inc=$(ls -d /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas 2>/dev/null | head -1 || true)
if cc -O2 ${inc:+-I"$inc"} "$TMP/sgemm.c" -o "$TMP/sgemm" -lopenblas 2>"$TMP/sgemm.err"; then
  sgemm=$("$TMP/sgemm") || sgemm=n/a
else
  echo "step_time.sh: warning: could not build the sgemm probe: $(head -3 "$TMP/sgemm.err")" >&2
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# One results line per (config, system): config system B T params rss_kib times...
results=$TMP/results
: >"$results"
for cfg in "${configs[@]}"; do
  read -r B T L E H V < <(config_sizes "$cfg") || exit 2
  n=$((warmup + steps))
  echo "step_time.sh: $cfg (B=$B T=$T layers=$L d_model=$E heads=$H vocab=$V): Tessera, $n steps ..." >&2
  DEFS=(-D batch="$B" -D micro_batch="$B" -D seq_len="$T" -D layers="$L" -D d_model="$E" -D heads="$H" -D vocab="$V")
  t0=$(date +%s.%N)
  "$MCC" samples/gpt.mdl -o "$TMP/$cfg.fused.plan" --stats --precision f32 "${DEFS[@]}" 2>"$TMP/mcc.err" ||
    { echo "step_time.sh: mcc failed:" >&2; cat "$TMP/mcc.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  params=$(sed -n 's/^stats: \([0-9]*\) parameters.*/\1/p' "$TMP/mcc.err")
  "$MCC" samples/gpt.mdl -o "$TMP/$cfg.unfused.plan" --no-fuse --precision f32 "${DEFS[@]}" 2>"$TMP/mcc.err" ||
    { echo "step_time.sh: mcc --no-fuse failed:" >&2; cat "$TMP/mcc.err" >&2; exit 1; }
  # time to the end of step 1 (load, initialize 124M parameters, compile or
  # load the kernels, one step): a cold kernel cache, then a warm one
  export TS_CACHE_DIR=$TMP/cache.$cfg TS_THREADS=$threads
  first=()
  for c in cold warm; do
    s0=$(date +%s.%N)
    TS_RT_PROFILE=1 "$MRUN" "$TMP/$cfg.fused.plan" --steps 1 --quiet >"$TMP/first.out" 2>&1 ||
      { echo "step_time.sh: mrun failed:" >&2; cat "$TMP/first.out" >&2; exit 1; }
    s1=$(date +%s.%N)
    jit=$(sed -n 's/^rt: llvm backend: .* in \([0-9.]*\) s, .*/\1/p' "$TMP/first.out")
    first+=("$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.2f", b - a }')" "${jit:-n/a}")
  done
  awk -v a="$t0" -v b="$t1" -v c="$cfg" -v r="${first[*]}" 'BEGIN { printf "%s %.3f %s\n", c, b - a, r }' >>"$TMP/start"
  for v in ref:unfused llvm:unfused llvm:fused; do
    be=${v%%:*} plan=${v#*:}
    sys=Tessera-$be; [ "$be" = llvm ] && sys=Tessera-llvm-$plan
    echo "step_time.sh: $cfg: $sys, $n steps ..." >&2
    /usr/bin/time -f '%M' -o "$TMP/rss" "$MRUN" "$TMP/$cfg.$plan.plan" --backend "$be" --steps "$n" --quiet \
      --metrics "$TMP/m.jsonl" >"$TMP/mrun.out" 2>&1 ||
      { echo "step_time.sh: mrun failed:" >&2; cat "$TMP/mrun.out" >&2; exit 1; }
    # elapsed_s is measured from the start of step 1: differences are step times.
    times=$("$PY" -c '
import json, sys
e = [json.loads(l)["elapsed_s"] for l in open(sys.argv[1]) if l.strip()]
d = [b - a for a, b in zip([0.0] + e[:-1], e)]
print(" ".join("%.6f" % x for x in d[int(sys.argv[2]):]))' "$TMP/m.jsonl" "$warmup")
    echo "$cfg $sys $B $T $params $(tail -1 "$TMP/rss") $times" >>"$results"
  done

  echo "step_time.sh: $cfg: PyTorch, $n steps ..." >&2
  OMP_WAIT_POLICY=$torch_wait /usr/bin/time -f '%M' -o "$TMP/rss" "$PY" bench/torch_step.py --batch "$B" --seq "$T" --layers "$L" \
    --d-model "$E" --heads "$H" --vocab "$V" --steps "$steps" --warmup "$warmup" --threads "$threads" \
    >"$TMP/torch.json" 2>"$TMP/torch.err" ||
    { echo "step_time.sh: torch_step.py failed:" >&2; cat "$TMP/torch.err" >&2; exit 1; }
  "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], "PyTorch", sys.argv[3], sys.argv[4], r["params"], sys.argv[5], " ".join("%.6f" % x for x in r["step_s"]))
' "$TMP/torch.json" "$cfg" "$B" "$T" "$(tail -1 "$TMP/rss")" >>"$results"
done

torch_ver=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["torch"])' "$TMP/torch.json")
"$PY" - "$results" "$sgemm" "$threads" "$steps" "$warmup" "$torch_ver" "$load_start" "$(nproc)" "$torch_wait" "$TMP/start" <<'EOF'
import statistics, sys
path, sgemm, threads, steps, warmup, torch_ver, load, ncpu, wait, start = sys.argv[1:]
rows = [l.split() for l in open(path) if l.strip()]
print("| config | system | median step (s) | tokens/s | model GFLOP/s | peak RSS (GiB) | tokens/s vs PyTorch |")
print("|---|---|---:|---:|---:|---:|---:|")
med = {}
notes = []
for cfg, system, B, T, params, rss, *times in rows:
    med[cfg, system] = statistics.median(float(t) for t in times)
for cfg, system, B, T, params, rss, *times in rows:
    m, tok, P = med[cfg, system], int(B) * int(T), int(params)
    other = med.get((cfg, "PyTorch"))
    ratio = "%.2fx" % (other / m) if other else "n/a"
    name = "GPT-2 %dM, B=%s, T=%s" % (round(P / 1e6), B, T) if P > 1e8 else "GPT-2 %.1fM, B=%s, T=%s" % (P / 1e6, B, T)
    print("| %s | %s | %.3f | %.0f | %.1f | %.2f | %s |" % (
        name, system, m, tok / m, 6 * P * tok / m / 1e9, int(rss) / 2**20, ratio))
    if system == "Tessera-llvm-fused":
        notes.append("%s: Tessera %.1f GFLOP/s" % (name, 6 * P * tok / m / 1e9))
    pt = [r for r in rows if r[0] == cfg and r[1] != system]
    if pt and system.startswith("Tessera") and pt[0][4] != params:
        notes.append("warning: %s: parameter counts differ (Tessera %s, PyTorch %s)" % (cfg, params, pt[0][4]))
print()
print("- Machine: OpenBLAS sgemm (2048^3, f32, %s threads, median of 9) = %s GFLOP/s." % (threads, sgemm))
print("- Achieved = 6 * params * tokens_per_step / median step time (params counted once, tied head; "
      "the attention score FLOPs are not counted): " + "; ".join(notes) + " (fused LLVM backend).")
print("- %s threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, torch.set_num_threads), f32, "
      "median of %s timed steps after %s warm-up; PyTorch %s (OMP_WAIT_POLICY=%s)." % (
          threads, steps, warmup, torch_ver, wait))
print("- Tessera-ref: mrun --backend ref; Tessera-llvm-unfused: mcc --no-fuse, LLVM backend (one JIT kernel "
      "per elementwise/row op); Tessera-llvm-fused: the default (fusion groups, LLVM backend); TS_THREADS=%s." % threads)
print()
print("| config | mcc compile (s) | mrun to end of step 1, cold kernel cache (s) | of which JIT (s) | warm cache (s) | of which JIT (s) |")
print("|---|---:|---:|---:|---:|---:|")
for l in open(start):
    cfg, mcc, cold, jcold, warm, jwarm = l.split()
    print("| %s | %s | %s | %s | %s | %s |" % (cfg, mcc, cold, jcold, warm, jwarm))
print("- Load average at the start: %s on %s CPUs (other work on the machine slows both systems alike only roughly)." % (load, ncpu))
EOF
