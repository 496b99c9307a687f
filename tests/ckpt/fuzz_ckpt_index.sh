#!/bin/sh
# fuzz_ckpt_index.sh MCC MRUN SRC FUZZER SECONDS: seeds the checkpoint-index
# fuzzer with the .idx files of real checkpoints (one rank; tp 2 with
# ZeRO over dp 2: flat chunks and partial sums), then runs it for SECONDS
# in fuzz_corpus (the directory libFuzzer writes).
set -e
mcc=$1 mrun=$2 src=$3 fuzz=$4 secs=$5
rm -rf seeds ck1 ck4 && mkdir -p fuzz_corpus seeds
tiny="-D layers=1 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=4 -D micro_batch=1"
printf 'In the beginning God created the heaven and the earth. %.0s' 1 2 3 4 5 6 7 8 > corpus.txt
# shellcheck disable=SC2086
"$mcc" "$src/samples/gpt.mdl" $tiny -o one.plan
# shellcheck disable=SC2086
"$mcc" "$src/samples/gpt.mdl" $tiny --tp 2 --dp 2 -o tp2dp2.plan
"$mrun" one.plan --steps 1 --data corpus.txt --quiet --save ck1
"$mrun" tp2dp2.plan --gpus 4 --steps 1 --data corpus.txt --quiet --save ck4
cp ck1/iter_0000001/rank_00000.idx seeds/one.idx
cp ck4/iter_0000001/rank_00003.idx seeds/tp2dp2.idx
exec "$fuzz" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 fuzz_corpus seeds
