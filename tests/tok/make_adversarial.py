#!/usr/bin/env python3
"""make_adversarial.py OUT [MB] - writes a text (bytes) meant to break a
byte-level BPE tokenizer, deterministically (a fixed seed), about MB
megabytes (default 3): every code point of the Basic Multilingual Plane
and samples of every other plane (unassigned and private-use ones
included), combining marks, emoji with ZWJ and skin tones, flags, CRLF
and lone CR, every kind of Unicode space, long runs of spaces, tabs and
digits, apostrophes in all cases ('S 'LL 'ſ), special tokens inside words
and cut short, invalid UTF-8 (stray continuation bytes, truncated and
overlong sequences, surrogates encoded in UTF-8, code points past
U+10FFFF), mixed with lines of the bundled corpus."""
import os, random, sys

SEED = 22
SPACES = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680", "\u2000", "\u2007", "\u200a",
          "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\x1c", "\x1d", "\x1e", "\x1f", "\u200b", "\ufeff"]
COMBINING = [chr(c) for c in list(range(0x300, 0x370)) + [0x483, 0x591, 0x64b, 0x93c, 0x1ab0, 0x20d0, 0xfe20]]
EMOJI = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F1FA\U0001F1F8", "\U0001F9D1\U0001F3FF\u200D\U0001F4BB",
         "\u2764\uFE0F", "\U0001F469\U0001F3FB\u200D\u2764\uFE0F\u200D\U0001F48B\u200D\U0001F468\U0001F3FF",
         "#\uFE0F\u20E3", "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"]
APOS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'rE", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'Ll",
        "'lL", "'d", "'D", "'\u017f", "'\u212a", "''", "'", "\u2019s", "'x", "'sa", "'llama", "'\n", "' s"]
SPECIAL = ["<|endoftext|>", "<|endoftext|", "<|endoftext", "<|", "|>", "<|endoftext|><|endoftext|>", "<|ENDOFTEXT|>",
           "<<|endoftext|>>", "< |endoftext|>"]
INVALID = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\x81", b"\xc2", b"\xe0\x80\x80", b"\xe0\xa0", b"\xe2\x82",
           b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\x80\xed\xb0\x80", b"\xf0\x80\x80\x80", b"\xf0\x9f\x98",
           b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xc3\x28",
           b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\x00"]
DIGITS = "0123456789\u0660\u0661\u06f5\u0966\u09e7\uff11\uff19\U0001D7CE\u00b2\u00bd\u2160\u3007\u2460"
WORDS = ["the", "The", "THE", "naïve", "Straße", "İstanbul", "ǅemal", "ΑΒΓ", "привет", "שָׁלוֹם", "مرحبا", "नमस्ते",
         "日本語", "한국어", "ไทย", "𐐷𐐸", "ﬁne", "x\u0301y", "e\u0301\u0302\u0323", "Ⅻ", "ⓐⓑ", "𝔘𝔫𝔦"]


def chunk(rng, kjv):
    """One random piece of adversarial text, as bytes."""
    k = rng.randrange(14)
    if k == 0:   # random code points of a random plane (0..16), unassigned and private use included
        plane = rng.randrange(17)
        cps = [plane << 16 | rng.randrange(0x10000) for _ in range(rng.randrange(1, 40))]
        return "".join(chr(c) for c in cps if not 0xD800 <= c < 0xE000).encode()
    if k == 1:
        w = rng.choice(WORDS)
        return (w + "".join(rng.choice(COMBINING) for _ in range(rng.randrange(1, 6)))).encode()
    if k == 2:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 5))).encode()
    if k == 3:
        return "".join(rng.choice(["\r\n", "\r", "\n", "\n\n", "\r\r\n", " \r\n", "\t\n"]) for _ in range(rng.randrange(1, 4))).encode()
    if k == 4:
        return "".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 8))).encode()
    if k == 5:
        return (rng.choice([" ", "\t", "  ", "\u3000"]) * rng.randrange(1, 300)).encode()
    if k == 6:
        return "".join(rng.choice(DIGITS) for _ in range(rng.randrange(1, 60))).encode()
    if k == 7:
        return (rng.choice(WORDS + [""]) + rng.choice(APOS) + rng.choice(WORDS + ["", " "])).encode()
    if k == 8:
        return (rng.choice(WORDS + [""]) + rng.choice(SPECIAL) + rng.choice(WORDS + ["", " ", "\n"])).encode()
    if k == 9:
        return rng.choice(INVALID) * rng.randrange(1, 3)
    if k == 10:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12)))
    if k == 11:
        return "".join(chr(rng.choice([0x21, 0x2d, 0x2e, 0x3f, 0x40, 0x5f, 0x7e, 0xa1, 0xbf, 0x2014, 0x3001, 0xff01, 0x1f4a9]))
                       for _ in range(rng.randrange(1, 10))).encode()
    if k == 12:
        return rng.choice(kjv)
    return rng.choice(WORDS).swapcase().encode()


def main():
    out = sys.argv[1]
    target = int(float(sys.argv[2] if len(sys.argv) > 2 else 3) * 1e6)
    rng = random.Random(SEED)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    kjv = open(os.path.join(root, "samples", "data", "kjv.txt"), "rb").read().split(b"\n")[:3000]
    parts = []
    # every BMP code point but the surrogates, in runs of 1..64 between random separators
    c = 0
    while c < 0x10000:
        n = rng.randrange(1, 65)
        parts.append("".join(chr(x) for x in range(c, min(c + n, 0x10000)) if not 0xD800 <= x < 0xE000).encode())
        parts.append(chunk(rng, kjv))
        c += n
    size = sum(map(len, parts))
    while size < target:
        p = chunk(rng, kjv)
        parts.append(p)
        size += len(p)
        if rng.random() < 0.5:
            parts.append(rng.choice([b" ", b"", b"\n", b"'", b"<|endoftext|>"]))
    with open(out, "wb") as f:
        f.write(b"".join(parts))


if __name__ == "__main__":
    main()
