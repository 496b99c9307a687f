#!/bin/sh
# fuzz_tok.sh SRC FUZZER SECONDS: seeds the tokenizer fuzzer (fuzz_tok.c)
# with small tokenizer files cut from the samples (the first 400 tokens
# and the merges among them), a GPT-2 pair, and texts, then runs it for
# SECONDS in fuzz_corpus (the directory libFuzzer writes).
set -e
src=$1 fuzz=$2 secs=$3
rm -rf seeds && mkdir -p fuzz_corpus seeds
python3 - "$src" <<'PY'
import json, sys
src = sys.argv[1]
for name, path in (("gpt2", "tokenizer.json"), ("llama3", "llama3-style/tokenizer.json")):
    d = json.load(open(f"{src}/samples/tokenizer/{path}"))
    vocab = {k: v for k, v in d["model"]["vocab"].items() if v < 400}
    d["model"]["vocab"] = vocab
    d["model"]["merges"] = [m for m in d["model"]["merges"]
                            if all(x in vocab for x in m.split(" ") + ["".join(m.split(" "))])]
    open(f"seeds/{name}.json", "wb").write(b"J" + json.dumps(d).encode())
    if name == "gpt2":
        # a vocab without the symbol of byte 0x0D ("\r" is U+010D in ByteLevel): such a
        # tokenizer drops the byte as the tokenizers package does (found by CI's fuzzing)
        d2 = dict(d, model=dict(d["model"], vocab={k: v for k, v in vocab.items() if k != "\u010d"}))
        open("seeds/gpt2_no_cr.json", "wb").write(b"J" + json.dumps(d2).encode())
        merges = "#version: 0.2\n" + "\n".join(d["model"]["merges"]) + "\n"
        open("seeds/pair", "wb").write(b"G" + json.dumps(vocab).encode() + b"\0" + merges.encode())
PY
head -c 3000 "$src/samples/data/kjv.txt" > seeds/kjv
# a vocab.json whose only token is "" (bench/fuzz.sh's campaign of 2026-11-28:
# the empty key's offset into a pool not yet allocated, UBSan's null + 0)
printf 'G{"":\r2}' > seeds/empty_token
printf "x's 'S 'LL \r\n\r  \t\t 12345 <|endoftext|>a<|endoftext\xff\xed\xa0\x80\xf0\x9f\x98\x80 \xc3\xa9\xcc\x81" > seeds/mixed
exec "$fuzz" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 fuzz_corpus seeds
