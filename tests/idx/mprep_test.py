"""mprep_test.py MPREP SRC SCRATCH [TOKENIZER] - mprep's output read back by
the independent reader (tests/idx/idx_reader.py, written from docs/data.md).

Without TOKENIZER (--tokenizer bytes): for text and JSONL input, with and
without --append-eod, the documents and their tokens equal what the input
gives, split here by docs/data.md's rules (text: runs of non-blank lines;
JSONL: the key's string, or one sequence per non-empty string of an array;
empty documents skipped); --workers 1 and 3 write identical files; the
docs' worked example byte for byte; --dtype i32; several keys; errors
naming FILE:LINE leave no file behind.

With TOKENIZER (a tokenizer.json): the same text and JSONL checks with the
PyPI `tokenizers` package's ids (encode(text, add_special_tokens=False)),
its end-of-document token appended with --append-eod."""
import json
import os
import subprocess
import sys

import idx_reader

MPREP, SRC, SCRATCH = sys.argv[1], sys.argv[2], sys.argv[3]
TOKENIZER = sys.argv[4] if len(sys.argv) > 4 else None
KJV = os.path.join(SRC, "samples", "data", "kjv.txt")
fails = 0
checks = 0


def check(cond, what):
    global fails, checks
    checks += 1
    if not cond:
        fails += 1
        print("FAIL:", what, file=sys.stderr)


def mprep(*args, ok=True):
    r = subprocess.run([MPREP, "--quiet", *args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        print(r.stderr, file=sys.stderr)
    return r


# ---- the expected documents, from docs/data.md's rules ----
def text_documents(data):
    """Runs of non-blank lines, each line with its newline (bytes)."""
    docs, cur = [], b""
    for line in data.splitlines(keepends=True):
        if line.strip(b" \t\r\n\f\v") == b"":
            if cur:
                docs.append([cur])
            cur = b""
        else:
            cur += line
    if cur:
        docs.append([cur])
    return docs


def json_documents(lines, key):
    docs = []
    for line in lines:
        if not line.strip():
            continue
        v = json.loads(line)[key]
        sentences = v if isinstance(v, list) else [v]
        docs.append([s.encode("utf-8") for s in sentences])
    return docs


class Encoder:
    """ids of bytes (the byte tokenizer) or of the `tokenizers` package"""

    def __init__(self, path):
        self.tok = None
        self.eod = 256
        if path:
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(path)
            for t in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"):
                if self.tok.token_to_id(t) is not None:
                    self.eod = self.tok.token_to_id(t)
                    break

    def __call__(self, b):
        if self.tok is None:
            return list(b)
        return self.tok.encode(b.decode("utf-8", "replace"), add_special_tokens=False).ids


def expected(docs, enc, eod):
    out = []
    for sentences in docs:
        seqs = [enc(s) for s in sentences]
        seqs = [s for s in seqs if s]
        if not seqs:
            continue
        if eod:
            seqs[-1] = seqs[-1] + [enc.eod]
        out.append(seqs)
    return out


def compare(prefix, want, what, code=None):
    got_code, got = idx_reader.read(prefix)
    check(code is None or got_code == code, "%s: dtype code %d, expected %s" % (what, got_code, code))
    check(len(got) == len(want), "%s: %d documents, expected %d" % (what, len(got), len(want)))
    for d, (g, w) in enumerate(zip(got, want)):
        gl = [list(map(int, s)) for s in g]
        if gl != w:
            check(False, "%s: document %d differs: %s... vs %s..." % (what, d, str(gl)[:200], str(w)[:200]))
            return
    check(True, what)


def same_files(a, b, what):
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as f, open(b + ext, "rb") as g:
            check(f.read() == g.read(), "%s: %s%s and %s%s differ" % (what, a, ext, b, ext))


def tok_args():
    return ["--tokenizer", TOKENIZER] if TOKENIZER else ["--tokenizer", "bytes"]


def run_text(enc, code):
    with open(KJV, "rb") as f:
        data = f.read()
    docs = text_documents(data)
    check(len(docs) == 2378, "kjv.txt: %d documents, expected 2378" % len(docs))
    for eod in (False, True):
        flags = ["--append-eod"] if eod else []
        for w in (1, 3):
            p = "kjv_e%d_w%d" % (eod, w)
            r = mprep("--input", KJV, "--output-prefix", p, *tok_args(), "--workers", str(w), *flags)
            check(r.returncode == 0, "mprep text %s: exit %d" % (p, r.returncode))
        compare("kjv_e%d_w1" % eod, expected(docs, enc, eod), "text, append-eod %s" % eod, code(eod))
        same_files("kjv_e%d_w1" % eod, "kjv_e%d_w3" % eod, "text, --workers 1 vs 3")


def make_jsonl():
    """kjv's documents as JSONL, plus escapes, non-ASCII text, sentence
    arrays, empty strings and a blank line."""
    with open(KJV, "rb") as f:
        docs = text_documents(f.read())
    lines = [json.dumps({"text": d[0].decode("ascii"), "id": i}) for i, d in enumerate(docs)]
    extra = [{"text": "tab\there \"quoted\" \\ back\u00e9 \u4e2d\u6587 \U0001F600 end"},
             {"text": ["first sentence. ", "", "second one."]},
             {"text": ""},
             {"text": []},
             {"text": ["", ""]},
             {"text": "\r\nCRLF\r\n  spaces    and 12345678901234567890 digits"}]
    lines[5:5] = [json.dumps(e, ensure_ascii=i % 2 == 0) for i, e in enumerate(extra)]
    lines.insert(9, "   ")
    with open("in.jsonl", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open("in.jsonl", encoding="utf-8") as f:
        return f.read().split("\n")


def run_jsonl(enc, code):
    lines = make_jsonl()
    docs = json_documents(lines, "text")
    for eod in (False, True):
        flags = ["--append-eod"] if eod else []
        for w in (1, 3):
            p = "j_e%d_w%d" % (eod, w)
            r = mprep("--input", "in.jsonl", "--output-prefix", p, *tok_args(), "--json-keys", "text",
                      "--workers", str(w), *flags)
            check(r.returncode == 0, "mprep jsonl %s: exit %d" % (p, r.returncode))
            check("(3 empty skipped)" in r.stdout, "jsonl: summary '%s' lacks 3 empty documents" % r.stdout.strip())
        compare("j_e%d_w1" % eod, expected(docs, enc, eod), "jsonl, append-eod %s" % eod, code(eod))
        same_files("j_e%d_w1" % eod, "j_e%d_w3" % eod, "jsonl, --workers 1 vs 3")


def run_bytes_only():
    enc = Encoder(None)
    # the worked example of docs/data.md, byte for byte
    with open("ex.jsonl", "w") as f:
        f.write('{"text": "ab"}\n{"text": ["c", "", "de"]}\n')
    r = mprep("--input", "ex.jsonl", "--output-prefix", "ex", "--tokenizer", "bytes", "--json-keys", "text",
              "--append-eod")
    check(r.returncode == 0, "example: exit %d" % r.returncode)
    with open("ex.bin", "rb") as f:
        check(f.read() == bytes.fromhex("610062000001 6300 640065000001"), "example: .bin")
    with open("ex.idx", "rb") as f:
        idx = f.read()
    want = (b"MMIDIDX\0\0" + (1).to_bytes(8, "little") + b"\x08" + (3).to_bytes(8, "little") +
            (3).to_bytes(8, "little") + b"".join(x.to_bytes(4, "little") for x in (3, 1, 3)) +
            b"".join(x.to_bytes(8, "little") for x in (0, 6, 8, 0, 1, 3)))
    check(idx == want, "example: .idx is %s" % idx.hex())
    # --dtype i32, and several keys
    lines = make_jsonl()
    r = mprep("--input", "in.jsonl", "--output-prefix", "wide", "--tokenizer", "bytes", "--json-keys", "text",
              "--dtype", "i32")
    check(r.returncode == 0, "--dtype i32: exit %d" % r.returncode)
    compare("wide", expected(json_documents(lines, "text"), enc, False), "--dtype i32", 4)
    with open("two.jsonl", "w") as f:
        for i in range(50):
            f.write(json.dumps({"a": "doc %d" % i, "b": ["x" * i, "y"]}) + "\n")
    r = mprep("--input", "two.jsonl", "--output-prefix", "two", "--tokenizer", "bytes", "--json-keys", "a,b")
    check(r.returncode == 0, "two keys: exit %d" % r.returncode)
    with open("two.jsonl") as f:
        tl = f.read().split("\n")
    compare("two_a", expected(json_documents(tl, "a"), enc, False), "key a", 8)
    compare("two_b", expected(json_documents(tl, "b"), enc, False), "key b", 8)
    # refusals: FILE:LINE, exit 1, nothing written
    bad = [('{"text": "ok"}\n[1, 2]\n', "bad.jsonl:2: error: an array, not a JSON object"),
           ('{"text": "ok"}\n\n{"txt": "x"}\n', 'bad.jsonl:3: error: the object has no key "text"'),
           ('{"text": 5}\n', 'bad.jsonl:1: error: "text" is a number, not a string'),
           ('{"text": ["a", 1]}\n', 'bad.jsonl:1: error: "text" is an array holding a non-string'),
           ('{"text": "a"}\n{"text": "b",}\n', "bad.jsonl:2:"),
           ('{"text": "\\u0000"}\n', "bad.jsonl:1:")]
    for text, msg in bad:
        with open("bad.jsonl", "w") as f:
            f.write(text)
        r = mprep("--input", "bad.jsonl", "--output-prefix", "bad", "--tokenizer", "bytes", "--json-keys", "text",
                  "--workers", "2", ok=False)
        check(r.returncode == 1 and msg in r.stderr, "refusal: exit %d, '%s', wanted '%s'" %
              (r.returncode, r.stderr.strip(), msg))
        check(not [n for n in os.listdir(".") if n.startswith("bad.") and n != "bad.jsonl"],
              "refusal '%s' left files: %s" % (msg, os.listdir(".")))
    r = mprep("--input", "nothing.txt", "--output-prefix", "bad", "--tokenizer", "bytes", ok=False)
    check(r.returncode == 1 and "nothing.txt: cannot read" in r.stderr, "missing input: '%s'" % r.stderr.strip())
    # bounded lines and documents: /dev/zero has no newline
    r = mprep("--input", "/dev/zero", "--output-prefix", "bad", "--tokenizer", "bytes", "--max-document-mb", "2",
              ok=False)
    check(r.returncode == 1 and "/dev/zero:1: error: a line longer than 2 MB" in r.stderr,
          "/dev/zero: exit %d, '%s'" % (r.returncode, r.stderr.strip()))
    with open("long.txt", "w") as f:
        f.write("title\n\n" + ("a" * 99 + "\n") * 30000)
    r = mprep("--input", "long.txt", "--output-prefix", "bad", "--tokenizer", "bytes", "--max-document-mb", "2",
              ok=False)
    check(r.returncode == 1 and "long.txt:3: error: the document that starts here is longer than 2 MB" in r.stderr,
          "long document: exit %d, '%s'" % (r.returncode, r.stderr.strip()))
    check(not [n for n in os.listdir(".") if n.startswith("bad.") and n != "bad.jsonl"], "a refused input left files")
    # every option mprep parses is in its --help
    import re
    with open(os.path.join(SRC, "tools", "mprep.c")) as f:
        src = f.read()
    parse = src[src.index("static int parse_args("):]
    flags = set(re.findall(r'"(--[a-z0-9-]+)', parse[:parse.index("\n}\n")]))
    helptext = subprocess.run([MPREP, "--help"], capture_output=True, text=True).stdout
    check(len(flags) >= 8, "only %d flags found in parse_args" % len(flags))
    for fl in sorted(flags):
        check(re.search(r"(^|[^a-z0-9-])%s($|[^a-z0-9-])" % re.escape(fl), helptext), "--help lacks " + fl)
    r = mprep("--input", KJV, "--output-prefix", "bad", "--tokenizer", "bytes", "--workers", "0", ok=False)
    check(r.returncode == 2 and "--workers needs 1 to 256" in r.stderr, "--workers 0: '%s'" % r.stderr.strip())


def main():
    os.makedirs(SCRATCH, exist_ok=True)
    os.chdir(SCRATCH)
    enc = Encoder(TOKENIZER)
    if TOKENIZER:
        vocab = enc.tok.get_vocab_size(with_added_tokens=True)
        code = lambda eod: 8 if vocab < 65500 else 4
    else:
        code = lambda eod: 8
        run_bytes_only()
    run_text(enc, code)
    run_jsonl(enc, code)
    name = "idx.mprep_bpe" if TOKENIZER else "idx.mprep"
    if fails:
        print("%s: %d of %d checks FAILED" % (name, fails, checks), file=sys.stderr)
        return 1
    print("%s: all %d checks passed" % (name, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
