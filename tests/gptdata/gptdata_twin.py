"""gptdata_twin.py - an independent Python implementation of Tessera's GPT
sample indices, written from docs/data.md "Sample indices" alone (not from
runtime/data/gptdata.c): the generator, the shuffles, --split, the
document / sample / shuffle indices, blending, and the cache file layout.
Also a writer of Megatron's indexed datasets (docs/data.md / indexed.h),
so the tests make their own small datasets.  Pure Python + struct."""
import struct

M64 = (1 << 64) - 1


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rand(seed, stream, i):
    return mix64(mix64(mix64(seed) ^ stream) ^ i)


def shuffle(a, seed, stream):
    """Fisher-Yates in place: i from n-1 down to 1, j = (r * (i+1)) >> 64."""
    for i in range(len(a) - 1, 0, -1):
        j = (rand(seed, stream, i) * (i + 1)) >> 64
        a[i], a[j] = a[j], a[i]


STREAM_DOC, STREAM_DOC_LAST, STREAM_SHUF, STREAM_SHUF_LAST, STREAM_MOCK = 1, 2, 3, 4, 5


def split_ranges(text, n):
    """--split a,b,c over n sequences: [(beg, end)] for train, valid, test."""
    v = [float(x) for x in text.replace("/", ",").split(",")]
    v += [0.0] * (3 - len(v))
    s = v[0] + v[1] + v[2]
    w = [x / s for x in v]
    cum = [0.0]
    for x in w:
        cum.append(cum[-1] + x)
    out = []
    for p in range(3):
        if cum[p + 1] <= cum[p]:
            out.append((0, 0))
        else:
            out.append((int(round(cum[p] * float(n))), int(round(cum[p + 1] * float(n)))))
    return out


def indices(lengths, beg, end, T, num_samples, seed):
    """(doc, sample, shuffle) of sequences [beg, end) as flat lists."""
    n_part = end - beg
    tpe = sum(lengths[beg:end])
    need = num_samples * T + 1
    epochs = 1 if need <= tpe else -(-need // tpe)
    separate = False
    sans = 0
    if epochs > 1:
        sans = ((epochs - 1) * tpe - 1) // T
        per_epoch = (tpe - 1) // T
        separate = (num_samples - sans) < int(0.80 * per_epoch)
    doc = [beg + i for _ in range(epochs) for i in range(n_part)]
    if separate:
        first, last = doc[: len(doc) - n_part], doc[len(doc) - n_part:]
        shuffle(first, seed, STREAM_DOC)
        shuffle(last, seed, STREAM_DOC_LAST)
        doc = first + last
    else:
        shuffle(doc, seed, STREAM_DOC)
    n_sample = (epochs * tpe - 1) // T
    # the sample index: where each sample of T + 1 tokens starts; the next
    # one starts on the previous one's last token
    sample = [(0, 0)]
    pos, off = 0, 0
    for k in range(1, n_sample + 1):
        left = T + 1
        while left:
            avail = lengths[doc[pos]] - off
            if avail >= left:
                off += left - 1
                left = 0
            else:
                left -= avail
                if pos == len(doc) - 1:
                    off = lengths[doc[pos]] - 1
                    break
                pos += 1
                off = 0
        sample.append((pos, off))
    shuf = list(range(n_sample))
    if separate:
        a, b = shuf[:sans], shuf[sans:]
        shuffle(a, seed, STREAM_SHUF)
        shuffle(b, seed, STREAM_SHUF_LAST)
        shuf = a + b
    else:
        shuffle(shuf, seed, STREAM_SHUF)
    return doc, [x for row in sample for x in row], shuf, epochs


def blend(weights, size):
    """Greedy blending: per sample the dataset furthest below its share."""
    s = sum(weights)
    w = [x / s for x in weights]
    count = [0] * len(w)
    ds, dss = [], []
    for k in range(size):
        kd = float(max(k, 1))
        best, best_err = 0, w[0] * kd - count[0]
        for d in range(1, len(w)):
            e = w[d] * kd - count[d]
            if e > best_err:
                best, best_err = d, e
        ds.append(best)
        dss.append(count[best])
        count[best] += 1
    return ds, dss


def sample_tokens(tokens_of, doc, sample, shuf, T, j):
    """Sample j (through the shuffle index) as T + 1 ids; tokens_of(s) is
    sequence s's list of ids."""
    k = shuf[j]
    p0, o0, p1, o1 = sample[2 * k], sample[2 * k + 1], sample[2 * k + 2], sample[2 * k + 3]
    out = []
    for q in range(p0, p1 + 1):
        seq = tokens_of(doc[q])
        lo = o0 if q == p0 else 0
        hi = o1 + 1 if q == p1 else len(seq)
        out += seq[lo:hi]
    assert len(out) == T + 1
    return out


def read_cache(path):
    """The arrays of a cache file: (description, [arrays of int64])."""
    b = open(path, "rb").read()
    assert b[:8] == b"TSGPTIDX", "magic"
    version, narr = struct.unpack_from("<II", b, 8)
    key, checksum, dlen = struct.unpack_from("<QQQ", b, 16)
    counts = struct.unpack_from("<4Q", b, 40)[:narr]
    assert version == 1
    desc = b[80:80 + dlen].decode()
    h = 0xcbf29ce484222325
    for (w,) in struct.iter_unpack("<Q", b[80:]):
        h = ((h ^ w) * 0x100000001b3) & M64
    assert h == checksum, "checksum"
    off = 80 + ((dlen + 7) & ~7)
    arrs = []
    for c in counts:
        arrs.append(list(struct.unpack_from("<%dq" % c, b, off)))
        off += 8 * c
    assert off == len(b), "size"
    return desc, arrs, key


def write_indexed(prefix, docs, dtype=8):
    """Megatron's MMIDIDX: docs is a list of documents, each a list of
    sequences (lists of ids).  dtype: 8 u16, 4 i32."""
    fmt = {8: "H", 4: "i", 1: "B"}[dtype]
    size = struct.calcsize(fmt)
    lens, ptrs, doc_idx = [], [], [0]
    with open(prefix + ".bin", "wb") as f:
        ptr = 0
        for d in docs:
            for s in d:
                f.write(struct.pack("<%d%s" % (len(s), fmt), *s))
                lens.append(len(s))
                ptrs.append(ptr)
                ptr += len(s) * size
            doc_idx.append(len(lens))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, dtype, len(lens), len(doc_idx)))
        f.write(struct.pack("<%di" % len(lens), *lens))
        f.write(struct.pack("<%dq" % len(ptrs), *ptrs))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))
    return lens
