#!/bin/sh
# fuzz_plan.sh MCC SRC FUZZER SECONDS: seeds the plan fuzzer with mcc's plans
# of the tiny samples (binary payloads after a 0 byte, and text), then runs
# it for SECONDS in fuzz_corpus (the directory libFuzzer writes); the
# inputs in tests/plan/fuzz_regress (past findings) run first as seeds.
set -e
mcc=$1 src=$2 fuzz=$3 secs=$4
mkdir -p fuzz_corpus seeds
tiny="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=32 -D batch=4 -D micro_batch=2"
for m in "gpt|" "llama|-D kv_heads=2 -D ffn=32 -D layers=2 --pp 2" "moe|-D kv_heads=2 -D ffn=32 -D experts=4 -D topk=2 --ep 2"; do
  name=${m%%|*} opts=${m#*|}
  # shellcheck disable=SC2086
  "$mcc" "$src/samples/$name.mdl" $tiny $opts -o "seeds/$name.plan"
  # shellcheck disable=SC2086
  "$mcc" "$src/samples/$name.mdl" $tiny $opts --emit=plan-text -o "seeds/$name.txt"
  { printf '\000'; tail -c +33 "seeds/$name.plan"; } >"seeds/$name.bin"
  rm "seeds/$name.plan"
done
exec "$fuzz" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=262144 -print_final_stats=1 fuzz_corpus seeds "$src/tests/plan/fuzz_regress"
