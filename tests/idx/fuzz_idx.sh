#!/bin/sh
# fuzz_idx.sh MPREP SRC FUZZER SECONDS: seeds the indexed dataset fuzzer with
# mprep's outputs (u16 and i32, one and several sequences per document, an
# empty dataset), each as u32 LE .idx size + .idx + .bin (fuzz_idx.c), then
# runs it for SECONDS in fuzz_corpus (the directory libFuzzer writes).
set -e
mprep=$1 src=$2 fuzz=$3 secs=$4
rm -rf seeds work && mkdir -p fuzz_corpus seeds work
printf 'In the beginning\n\nGod created\nthe heaven\n\n\nand the earth.\n' > work/a.txt
printf '{"text": ["one", "", "two"]}\n{"text": "three"}\n{"text": ""}\n' > work/b.jsonl
: > work/empty.txt
"$mprep" --quiet --input work/a.txt --output-prefix work/a --tokenizer bytes --append-eod
"$mprep" --quiet --input work/a.txt --output-prefix work/a32 --tokenizer bytes --dtype i32
"$mprep" --quiet --input work/b.jsonl --output-prefix work/b --tokenizer bytes --json-keys text --append-eod
"$mprep" --quiet --input work/empty.txt --output-prefix work/empty --tokenizer bytes
for p in a a32 b empty; do
  python3 -c 'import os, struct, sys; p = sys.argv[1]; i = open(p + ".idx", "rb").read(); b = open(p + ".bin", "rb").read(); sys.stdout.buffer.write(struct.pack("<I", len(i)) + i + b)' "work/$p" > "seeds/$p"
done
exec "$fuzz" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 fuzz_corpus seeds
