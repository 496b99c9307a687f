#!/usr/bin/env python3
"""make_sample_tokenizers.py - trains the sample byte-level BPE tokenizers
shipped in samples/tokenizer/ on the bundled corpus (samples/data/kjv.txt)
with the PyPI `tokenizers` package (the version in tools/setup.sh's venv).

  samples/tokenizer/tokenizer.json                GPT-2 style: ByteLevel
                                                  pre-tokenizer (GPT-2's regex)
  samples/tokenizer/vocab.json + merges.txt       the same model, GPT-2's files
  samples/tokenizer/llama3-style/tokenizer.json   Llama 3 style: Split(Llama 3's
                                                  regex) + ByteLevel(use_regex=false)

Both have 8192 ids, <|endoftext|> (id 0) as their one special token, and
all 256 byte symbols, so every text encodes.  The trainer is
deterministic: running this again rewrites the same bytes (checked by
--check, which writes to a temporary directory and compares).

  .venv/bin/python tools/make_sample_tokenizers.py [--check]
"""
import filecmp, json, os, sys, tempfile
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "samples", "data", "kjv.txt")
VOCAB = 8192
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(pre_tokenizer):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([CORPUS], trainer)
    return tok


def write_all(out):
    os.makedirs(os.path.join(out, "llama3-style"), exist_ok=True)
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    gpt2.save(os.path.join(out, "tokenizer.json"))
    gpt2.model.save(out)          # vocab.json + merges.txt
    llama = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    llama.save(os.path.join(out, "llama3-style", "tokenizer.json"))


FILES = ["tokenizer.json", "vocab.json", "merges.txt", "llama3-style/tokenizer.json"]


def main():
    dest = os.path.join(ROOT, "samples", "tokenizer")
    if "--check" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            write_all(tmp)
            bad = [f for f in FILES if not filecmp.cmp(os.path.join(tmp, f), os.path.join(dest, f), shallow=False)]
        if bad:
            sys.exit("make_sample_tokenizers: differs from samples/tokenizer: " + " ".join(bad))
        print("make_sample_tokenizers: samples/tokenizer reproduced byte for byte")
        return
    write_all(dest)
    for f in FILES:
        print(f, os.path.getsize(os.path.join(dest, f)))


if __name__ == "__main__":
    main()
