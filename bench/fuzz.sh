#!/usr/bin/env bash
# fuzz.sh - runs every libFuzzer target of a build for a given time and
# prints one table: executions, rate, edges covered, and findings (crash,
# leak, timeout or out-of-memory inputs written).  The targets and their
# seeds are the suite's (frontend_fuzz, frontend_fuzz_passes, ir.fuzz,
# plan.fuzz, ckpt.fuzz_index, hf.fuzz_safetensors, tok.fuzz, idx.fuzz run each for 30 s): this script runs the same binaries longer, each on its own corpus
# in a temporary directory (seeded from the suite's corpus when the suite
# has run).  Not a test.
#
#   bench/fuzz.sh [--build DIR] [--seconds N] [--runs N] [--keep DIR] [--only NAME]
#
# defaults: build, 60 s.  --runs N stops a target after N executions (or at
# --seconds, whichever is first: give both for a campaign of N executions
# with a time cap).  --keep DIR keeps each target's grown corpus in DIR/NAME
# and starts from it next time, so campaigns add up across runs.  --only
# runs the one target named NAME (as in the table).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build secs=60 runs=-1 keep= only=
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=${2:?}; shift ;;
    --seconds) secs=${2:?}; shift ;;
    --runs) runs=${2:?}; shift ;;
    --keep) keep=${2:?}; shift ;;
    --only) only=${2:?}; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
  [ -z "$only" ] || [ "$name" = "$only" ] || continue
  [ -x "$build/$bin" ] || { echo "| $name | - | not built (clang with libFuzzer?) | | | |"; continue; }
  dirs=()
  for s in $seeds; do
    for d in "$build/$s" "$s"; do [ -d "$d" ] && { dirs+=("$(realpath "$d")"); break; }; done
  done
  work="$TMP/${name// /_}"
  mkdir -p "$work/findings"
  if [ -n "$keep" ]; then
    mkdir -p "$keep/${name// /_}"
    ln -s "$(realpath "$keep/${name// /_}")" "$work/corpus"
  else
    mkdir -p "$work/corpus"
  fi
  exe=$(realpath "$build/$bin")
  t0=$(date +%s)
  (cd "$work" && "$exe" -max_total_time="$secs" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -max_len="$maxlen" \
     -print_final_stats=1 -artifact_prefix=findings/ corpus "${dirs[@]}" >log 2>&1) || true
  el=$(( $(date +%s) - t0 ))
  n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
  r=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
  c=$(grep -o 'cov: [0-9]*' "$work/log" | tail -1 | awk '{print $2}')
  f=$(find "$work/findings" -type f | wc -l)
  echo "| $name | $el | ${n:-?} | ${r:-?} | ${c:-?} | $f |"
  [ "$f" = 0 ] || { mkdir -p fuzz-findings; cp "$work"/findings/* fuzz-findings/; echo "fuzz.sh: $name's findings copied to fuzz-findings/" >&2; }
done
