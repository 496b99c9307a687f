#!/usr/bin/env bash
# fuzz.sh - runs every libFuzzer target of a build for a given time and
# prints one table: executions, rate, edges covered, and findings (crash,
# leak, timeout or out-of-memory inputs written).  The targets and their
# seeds are the suite's (frontend_fuzz, frontend_fuzz_passes, ir.fuzz,
# plan.fuzz, ckpt.fuzz_index, hf.fuzz_safetensors, tok.fuzz, idx.fuzz run each for 30 s): this script runs the same binaries longer, each on its own corpus
# in a temporary directory (seeded from the suite's corpus when the suite
# has run).  Not a test.
#
#   bench/fuzz.sh [--build DIR] [--seconds N]      defaults: build, 60
set -euo pipefail
cd "$(dirname "$0")/.."
build=build secs=60
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --seconds) secs=${2:?}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "| target | seconds | executions | exec/s | edges | findings |"
echo "|---|---:|---:|---:|---:|---:|"
for t in "mdl|tests/frontend/fuzz_mdl|tests/frontend/fuzz_corpus samples stdlib tests/frontend/errors tests/frontend/sema tests/frontend/ok|16384" \
         "mdl through the passes|tests/frontend/fuzz_passes|tests/frontend/fuzz_passes_corpus tests/frontend/ok tests/frontend/sema samples|16384" \
         "ir text|tests/ir/fuzz_ir|tests/ir/fuzz_corpus tests/ir/seeds/gpt tests/ir/seeds/llama tests/oracle|65536" \
         "plan|tests/plan/fuzz_plan|tests/plan/fuzz_corpus tests/plan/seeds|262144" \
         "checkpoint index|tests/ckpt/fuzz_ckpt_index|tests/ckpt/fuzz_corpus tests/ckpt/seeds|65536" \
         "safetensors|tests/hf/fuzz_safetensors|tests/hf/fuzz_corpus tests/hf/seeds|65536" \
         "tokenizer|tests/tok/fuzz_tok|tests/tok/fuzz_corpus tests/tok/seeds|65536" \
         "indexed dataset|tests/idx/fuzz_idx|tests/idx/fuzz_corpus tests/idx/seeds|4096"; do
  IFS='|' read -r name bin seeds maxlen <<<"$t"
  [ -x "$build/$bin" ] || { echo "| $name | - | not built (clang with libFuzzer?) | | | |"; continue; }
  dirs=()
  for s in $seeds; do
    for d in "$build/$s" "$s"; do [ -d "$d" ] && { dirs+=("$(realpath "$d")"); break; }; done
  done
  work="$TMP/${name// /_}"
  mkdir -p "$work/corpus" "$work/findings"
  exe=$(realpath "$build/$bin")
  (cd "$work" && "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$maxlen" \
     -print_final_stats=1 -artifact_prefix=findings/ corpus "${dirs[@]}" >log 2>&1) || true
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
  r=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
  c=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1 | awk '{print $2}')
  f=$(find "$work/findings" -type f | wc -l)
  echo "| $name | $secs | ${n:-?} | ${r:-?} | ${c:-?} | $f |"
  [ "$f" = 0 ] || { mkdir -p fuzz-findings; cp "$work"/findings/* fuzz-findings/; echo "fuzz.sh: $name's findings copied to fuzz-findings/" >&2; }
done
