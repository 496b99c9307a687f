#!/usr/bin/env python3
"""tok_test.py - the C tokenizer (tok_tool) against the PyPI `tokenizers`
package.  Each subcommand is one ctest test (tests/tok/CMakeLists.txt);
WORK is the test's scratch directory, TOOL the tok_tool binary.

  classes TOOL WORK        the class (\\p{L}, \\p{N}, \\s) of every code
                           point: the C table against the package's regex
                           engine (Oniguruma), which says what Unicode is
  pieces TOOL WORK         the pieces of GPT-2's and Llama 3's regexes (the
                           scanners of tok_pretok.c alone, before BPE can
                           hide a difference) on kjv.txt and the adversarial
                           text, against the package's Split(regex)
  ids TOOL WORK SET        ids equal to Tokenizer.encode(text).ids for each
                           tokenizer of SET (shipped: the sample files, the
                           vocab.json + merges.txt pair loaded both ways;
                           variants: prefix space, extra added tokens,
                           ignore_merges, made here) on kjv.txt and on the
                           adversarial text (make_adversarial.py)
  roundtrip TOOL WORK      decode(encode(x)) == x (x as Python reads it),
                           and the C decode equal to the package's
  errors TOOL WORK         bad tokenizer files refused with the expected
                           message (the table ERRORS below)
"""
import array, json, os, shutil, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SAMPLES = os.path.join(ROOT, "samples", "tokenizer")
KJV = os.path.join(ROOT, "samples", "data", "kjv.txt")


def fail(msg):
    sys.exit("tok_test: FAIL: " + msg)


def run(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode:
        fail(f"tok_tool {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def read_ids(path):
    a = array.array("i")
    a.frombytes(open(path, "rb").read())
    return a.tolist()


def adversarial(work):
    path = os.path.join(work, "adversarial.txt")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(HERE, "make_adversarial.py"), path, "3"], check=True)
    return path


# ---- classes ----

def package_class_mask(pattern, text):
    """1 for each character of text the package's regex matches."""
    from tokenizers import Regex, pre_tokenizers
    kept = pre_tokenizers.Split(Regex(pattern), "removed").pre_tokenize_str(text)
    mask = bytearray([1]) * len(text)
    for _, (s, e) in kept:   # character offsets of what the regex did not match
        mask[s:e] = bytes(e - s)
    return mask


def cmd_classes(tool, work):
    out = os.path.join(work, "classes.bin")
    run(tool, "classes", out)
    got = open(out, "rb").read()
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]   # Python strings to Rust: no surrogates
    text = "".join(map(chr, cps))
    bad = 0
    for bit, pat in ((1, r"\p{L}"), (2, r"\p{N}"), (4, r"\s")):
        mask = package_class_mask(pat, text)
        n = 0
        for i, c in enumerate(cps):
            want, have = mask[i], 1 if got[c] & bit else 0
            n += want
            if want != have:
                if bad < 20:
                    print(f"U+{c:04X} {pat}: package {want}, C {have}")
                bad += 1
        print(f"{pat}: {n} code points")
    if any(got[c] for c in range(0xD800, 0xE000)):
        fail("a surrogate has a class")
    if bad:
        fail(f"{bad} code point classes disagree with the package")
    print(f"classes: {len(cps)} code points agree with the package")


# ---- pieces ----

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def cmd_pieces(tool, work):
    from tokenizers import Regex, pre_tokenizers
    for src in (KJV, adversarial(work)):
        text = open(src, "rb").read().decode("utf-8", "replace")
        valid = os.path.join(work, "valid.txt")
        open(valid, "wb").write(text.encode("utf-8"))
        # byte offset of each character offset
        byte_at = array.array("q", [0]) * (len(text) + 1)
        b = 0
        for i, ch in enumerate(text):
            byte_at[i] = b
            o = ord(ch)
            b += 1 if o < 0x80 else 2 if o < 0x800 else 3 if o < 0x10000 else 4
        byte_at[len(text)] = b
        for name, pat in (("gpt2", GPT2_RE), ("llama3", LLAMA3_RE)):
            out = os.path.join(work, name + ".pieces")
            run(tool, "pieces", name, valid, out)
            got = array.array("q")
            got.frombytes(open(out, "rb").read())
            pieces = pre_tokenizers.Split(Regex(pat), "isolated").pre_tokenize_str(text)
            want = [byte_at[e] for _, (s, e) in pieces]
            if got.tolist() != want:
                i = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                start = want[i - 1] if i else 0
                enc = text.encode("utf-8")
                fail(f"{name} regex on {os.path.basename(src)}: piece {i} (at byte {start}) ends at {got[i] if i < len(got) else 'end'} "
                     f"in C, at {want[i] if i < len(want) else 'end'} in the package: {enc[start:start + 24]!r}")
            print(f"{name} regex on {os.path.basename(src)}: {len(want)} pieces equal")


# ---- ids ----

def py_gpt2_pair(vocab, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    t = Tokenizer(models.BPE.from_file(vocab, merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    t.decoder = decoders.ByteLevel()
    return t


def variants(work):
    """Tokenizers made here from the samples, for what the samples lack."""
    out = {}
    d = json.load(open(os.path.join(SAMPLES, "tokenizer.json")))
    d["pre_tokenizer"]["add_prefix_space"] = True
    # added tokens: one not normalized inside another's text, one normalized
    # one whose content is in the vocabulary, one of plain text
    d["added_tokens"] += [
        {"id": 8192, "content": "<|sep|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True},
        {"id": 8193, "content": "endoftext", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
        {"id": d["model"]["vocab"]["the"], "content": "the", "single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False},
        {"id": 8194, "content": " and", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False},
    ]
    p = os.path.join(work, "prefix_added.json")
    json.dump(d, open(p, "w"))
    out["prefix_added"] = p
    d = json.load(open(os.path.join(SAMPLES, "llama3-style", "tokenizer.json")))
    d["model"]["ignore_merges"] = True
    d["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True   # a space before each split piece
    p = os.path.join(work, "llama3_ignore_merges.json")
    json.dump(d, open(p, "w"))
    out["llama3_ignore_merges"] = p
    return out


def compare(tool, work, name, c_args, py_tok, text_path):
    ids_path = os.path.join(work, name + ".ids")
    run(tool, *c_args[:1], *c_args[1:], text_path, ids_path)
    got = read_ids(ids_path)
    text = open(text_path, "rb").read().decode("utf-8", "replace")
    want = py_tok.encode(text).ids
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        fail(f"{name} on {os.path.basename(text_path)}: {len(got)} ids, the package {len(want)}; first difference at "
             f"id {i}: C {got[i:i + 8]} {[py_tok.id_to_token(x) for x in got[i:i + 8]]}, package {want[i:i + 8]} "
             f"{[py_tok.id_to_token(x) for x in want[i:i + 8]]}")
    print(f"{name} on {os.path.basename(text_path)}: {len(got)} ids equal ({os.path.getsize(text_path)} bytes)")
    return os.path.getsize(text_path)


def cmd_ids(tool, work, which):
    from tokenizers import Tokenizer
    texts = [KJV, adversarial(work)]
    vocab, merges = os.path.join(SAMPLES, "vocab.json"), os.path.join(SAMPLES, "merges.txt")
    if which == "shipped":
        cases = [("gpt2_json", ["encode", os.path.join(SAMPLES, "tokenizer.json")],
                  Tokenizer.from_file(os.path.join(SAMPLES, "tokenizer.json"))),
                 ("gpt2_pair_load", ["encode", vocab], py_gpt2_pair(vocab, merges)),
                 ("gpt2_pair_explicit", ["encode2", vocab, merges], py_gpt2_pair(vocab, merges)),
                 ("llama3_json", ["encode", os.path.join(SAMPLES, "llama3-style")],
                  Tokenizer.from_file(os.path.join(SAMPLES, "llama3-style", "tokenizer.json")))]
    else:
        cases = [(n, ["encode", p], Tokenizer.from_file(p)) for n, p in variants(work).items()]
    total = sum(compare(tool, work, n, a, t, x) for n, a, t in cases for x in texts)
    print(f"ids: {total / 1e6:.1f} MB of text, every id equal")


# ---- round trip ----

def cmd_roundtrip(tool, work):
    from tokenizers import Tokenizer
    for name, path in (("gpt2", os.path.join(SAMPLES, "tokenizer.json")),
                       ("llama3", os.path.join(SAMPLES, "llama3-style", "tokenizer.json"))):
        py = Tokenizer.from_file(path)
        for text_path in (KJV, adversarial(work)):
            want = open(text_path, "rb").read().decode("utf-8", "replace").encode("utf-8")
            ids, out = os.path.join(work, name + ".rt.ids"), os.path.join(work, name + ".rt.txt")
            run(tool, "encode", path, text_path, ids)
            run(tool, "decode", path, ids, out)
            got = open(out, "rb").read()
            if got != want:
                i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                fail(f"{name}: decode(encode({os.path.basename(text_path)})) differs at byte {i}: {got[i:i+20]!r} vs {want[i:i+20]!r}")
            pkg = py.decode(read_ids(ids), skip_special_tokens=False).encode("utf-8")
            if pkg != got:
                fail(f"{name}: the C decode of {os.path.basename(text_path)} differs from the package's")
            print(f"{name}: decode(encode({os.path.basename(text_path)})) == text ({len(got)} bytes), as the package decodes")


# ---- errors ----

def edit_json(src, fn):
    d = json.load(open(src))
    fn(d)
    return json.dumps(d)


def set_path(d, keys, v):
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = v


def errors_table():
    tj = os.path.join(SAMPLES, "tokenizer.json")
    l3 = os.path.join(SAMPLES, "llama3-style", "tokenizer.json")
    raw = open(tj).read()
    merges = open(os.path.join(SAMPLES, "merges.txt")).read().split("\n")
    vocab = open(os.path.join(SAMPLES, "vocab.json")).read()
    j = lambda keys, v, src=tj: edit_json(src, lambda d: set_path(d, keys, v))
    # (name, {file: text}, file to load, expected message)
    return [
        ("not_json", {"tokenizer.json": "this is not JSON\n"}, "tokenizer.json",
         "not_json/tokenizer.json:1:1: error: not a JSON value"),
        ("truncated", {"tokenizer.json": raw[:2000]}, "tokenizer.json",
         "truncated/tokenizer.json:118:13: error: expected ',' or '}' in an object"),
        ("dup_key", {"tokenizer.json": raw[:raw.index('"the": ')] + '"the": 5,\n      ' + raw[raw.index('"the": '):]},
         "tokenizer.json", "dup_key/tokenizer.json:6609:12: error: a key repeated in an object"),
        ("empty", {"tokenizer.json": ""}, "tokenizer.json",
         "empty/tokenizer.json:1:1: error: the text ends where a value should be"),
        ("array", {"tokenizer.json": "[1, 2]"}, "tokenizer.json",
         "array/tokenizer.json: a tokenizer.json holds an object, not an array"),
        ("no_model", {"tokenizer.json": "{\"version\": \"1.0\"}"}, "tokenizer.json",
         "no_model/tokenizer.json: no \"model\": not a tokenizer.json (GPT-2's vocabulary must be named *vocab.json)"),
        ("wordpiece", {"tokenizer.json": j(["model", "type"], "WordPiece")}, "tokenizer.json",
         "wordpiece/tokenizer.json: \"model\".\"type\" \"WordPiece\": not supported (only BPE)"),
        ("merge_not_in_vocab", {"tokenizer.json": j(["model", "merges", 5], "Ġth zzzq")}, "tokenizer.json",
         "merge_not_in_vocab/tokenizer.json: \"model\".\"merges\"[5]: the merge names 'zzzq', which is not in the vocabulary"),
        ("merge_makes_unknown", {"tokenizer.json": j(["model", "merges", 7], "t t")}, "tokenizer.json",
         "merge_makes_unknown/tokenizer.json: \"model\".\"merges\"[7]: the merge makes 'tt', which is not in the vocabulary"),
        ("merge_three", {"tokenizer.json": j(["model", "merges", 0], "a b c")}, "tokenizer.json",
         "merge_three/tokenizer.json: \"model\".\"merges\"[0]: not \"left right\" nor [\"left\", \"right\"]"),
        ("pretok_unknown", {"tokenizer.json": j(["pre_tokenizer"], {"type": "Whitespace"})}, "tokenizer.json",
         "pretok_unknown/tokenizer.json: \"pre_tokenizer\" type \"Whitespace\": not supported (only ByteLevel, Split, Sequence)"),
        ("pretok_null", {"tokenizer.json": j(["pre_tokenizer"], None)}, "tokenizer.json",
         "pretok_null/tokenizer.json: \"pre_tokenizer\" is null: not supported (a byte-level BPE needs ByteLevel)"),
        ("regex_other", {"tokenizer.json": j(["pre_tokenizer", "pretokenizers", 0, "pattern", "Regex"], "\\w+", l3)},
         "tokenizer.json",
         "regex_other/tokenizer.json: \"pre_tokenizer\" Split \"pattern\".\"Regex\" \"\\w+\": not supported (only GPT-2's and Llama 3's regexes)"),
        ("split_removed", {"tokenizer.json": j(["pre_tokenizer", "pretokenizers", 0, "behavior"], "Removed", l3)},
         "tokenizer.json",
         "split_removed/tokenizer.json: \"pre_tokenizer\" Split \"behavior\" \"Removed\": not supported (only \"Isolated\")"),
        ("no_bytelevel", {"tokenizer.json": j(["pre_tokenizer", "pretokenizers"],
                                              [json.load(open(l3))["pre_tokenizer"]["pretokenizers"][0]], l3)},
         "tokenizer.json", "no_bytelevel/tokenizer.json: \"pre_tokenizer\" has no ByteLevel step: not a byte-level BPE"),
        ("normalizer", {"tokenizer.json": j(["normalizer"], {"type": "NFC"})}, "tokenizer.json",
         "normalizer/tokenizer.json: \"normalizer\" type \"NFC\": not supported (only null)"),
        ("decoder", {"tokenizer.json": j(["decoder"], {"type": "WordPiece", "prefix": "##", "cleanup": True})},
         "tokenizer.json", "decoder/tokenizer.json: \"decoder\" type \"WordPiece\": not supported (only ByteLevel)"),
        ("dropout", {"tokenizer.json": j(["model", "dropout"], 0.1)}, "tokenizer.json",
         "dropout/tokenizer.json: \"model\".\"dropout\" is 0.1: not supported (only null)"),
        ("byte_fallback", {"tokenizer.json": j(["model", "byte_fallback"], True)}, "tokenizer.json",
         "byte_fallback/tokenizer.json: \"model\".\"byte_fallback\" is true: not supported (only null)"),
        ("lstrip", {"tokenizer.json": j(["added_tokens", 0, "lstrip"], True)}, "tokenizer.json",
         "lstrip/tokenizer.json: \"added_tokens[0]\".\"lstrip\" is true: not supported (only null)"),
        ("added_id", {"tokenizer.json": j(["added_tokens", 0, "id"], 9000)}, "tokenizer.json",
         "added_id/tokenizer.json: \"added_tokens[0]\" '<|endoftext|>' has \"id\" 9000, but the tokenizers package gives it 0"),
        ("vocab_id_string", {"tokenizer.json": j(["model", "vocab", "the"], "7")}, "tokenizer.json",
         "vocab_id_string/tokenizer.json: \"model\".\"vocab\": token 'the' has id a string, not an integer in [0, 2^31-1)"),
        ("truncation", {"tokenizer.json": j(["truncation"], {"max_length": 512})}, "tokenizer.json",
         "truncation/tokenizer.json: \"truncation\" is set: not supported (only null)"),
        ("pair_no_merges", {"vocab.json": vocab}, "vocab.json",
         "pair_no_merges/merges.txt: cannot read: No such file or directory"),
        ("pair_truncated_vocab", {"vocab.json": vocab[:5000], "merges.txt": "\n".join(merges)}, "vocab.json",
         "pair_truncated_vocab/vocab.json:1:5340: error: unterminated string"),
        ("pair_bad_merge", {"vocab.json": vocab, "merges.txt": "\n".join(merges[:6] + ["Ġth zzzq"] + merges[6:])},
         "vocab.json", "pair_bad_merge/merges.txt:7: the merge names 'zzzq', which is not in the vocabulary"),
        ("pair_truncated_merges", {"vocab.json": vocab, "merges.txt": "\n".join(merges[:100]) + "\nĠ"}, "vocab.json",
         "pair_truncated_merges/merges.txt:101: expected two tokens separated by one space, found 'Ġ'"),
        ("pair_dup_id", {"vocab.json": "{\"a\": 0, \"b\": 0}", "merges.txt": "#version: 0.2\n"}, "vocab.json",
         "pair_dup_id/vocab.json: id 0 is given to two tokens (the second is 'b')"),
        ("dir_empty", {}, ".", "dir_empty/.: a directory without tokenizer.json or vocab.json"),
    ]


def cmd_errors(tool, work):
    bad = 0
    for name, files, target, want in errors_table():
        d = os.path.join(work, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for f, text in files.items():
            open(os.path.join(d, f), "w", encoding="utf-8").write(text)
        r = subprocess.run([tool, "load", os.path.join(name, target)], capture_output=True, text=True, cwd=work)
        msg = r.stderr.strip()
        prefix = "tok_tool: error: "
        ok = r.returncode == 1 and msg.startswith(prefix) and msg[len(prefix):] == want and "\n" not in msg
        print(("ok   " if ok else "FAIL ") + f"{name}: {msg}")
        if not ok:
            print(f"     expected: {prefix}{want}")
            bad += 1
    if bad:
        fail(f"{bad} bad tokenizer files not refused as expected")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    cmd, tool, work = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    os.makedirs(work, exist_ok=True)
    if cmd == "classes": cmd_classes(tool, work)
    elif cmd == "pieces": cmd_pieces(tool, work)
    elif cmd == "ids": cmd_ids(tool, work, sys.argv[4])
    elif cmd == "roundtrip": cmd_roundtrip(tool, work)
    elif cmd == "errors": cmd_errors(tool, work)
    else: sys.exit(__doc__)


if __name__ == "__main__":
    main()
