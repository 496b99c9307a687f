#!/bin/sh
# fuzz_safetensors.sh MCC MRUN SRC FUZZER SECONDS: seeds the safetensors
# fuzzer with real files (a tiny GPT-2 exported by mrun --export: F32 and
# F64), then runs it for SECONDS in fuzz_corpus (the directory libFuzzer
# writes).
set -e
mcc=$1 mrun=$2 src=$3 fuzz=$4 secs=$5
rm -rf seeds x32 x64 && mkdir -p fuzz_corpus seeds
tiny="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=1 -D micro_batch=1"
printf 'In the beginning God created the heaven and the earth. %.0s' 1 2 3 4 > corpus.txt
for p in f32 f64; do
  # shellcheck disable=SC2086
  "$mcc" "$src/samples/gpt.mdl" $tiny --precision $p -o $p.plan
  "$mrun" $p.plan --steps 1 --data corpus.txt --quiet --export x$p --format hf
  cp x$p/model.safetensors seeds/$p.safetensors
done
exec "$fuzz" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 fuzz_corpus seeds
