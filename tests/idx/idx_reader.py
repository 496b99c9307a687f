"""idx_reader.py - an independent reader of Megatron's indexed dataset,
written from docs/data.md "Indexed datasets" alone (struct and numpy, no
Tessera or Megatron code).  read(prefix) returns the dtype code and the
documents as lists of sequences (numpy int64 arrays), after checking every
relation the document lists; a violation raises ValueError."""
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        binary = f.read()
    if len(idx) < 34 or idx[:9] != MAGIC:
        raise ValueError("bad header")
    version, = struct.unpack_from("<Q", idx, 9)
    code = idx[17]
    n, m = struct.unpack_from("<QQ", idx, 18)
    if version != 1 or code not in DTYPES:
        raise ValueError("version %d, dtype code %d" % (version, code))
    if len(idx) != 34 + 12 * n + 8 * m:
        raise ValueError(".idx size %d, expected %d" % (len(idx), 34 + 12 * n + 8 * m))
    dt = np.dtype(DTYPES[code])
    lengths = np.frombuffer(idx, "<i4", n, 34)
    pointers = np.frombuffer(idx, "<i8", n, 34 + 4 * n)
    docs = np.frombuffer(idx, "<i8", m, 34 + 12 * n)
    expect = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * dt.itemsize)])
    if (lengths < 0).any() or not np.array_equal(pointers, expect[:-1]) or len(binary) != expect[-1]:
        raise ValueError("pointers, lengths and .bin size disagree")
    if m < 1 or docs[0] != 0 or docs[-1] != n or (np.diff(docs) < 0).any():
        raise ValueError("bad document index")
    tokens = np.frombuffer(binary, dt).astype(np.int64)
    seqs = [tokens[p // dt.itemsize:p // dt.itemsize + l] for p, l in zip(pointers, lengths)]
    return code, [seqs[docs[d]:docs[d + 1]] for d in range(m - 1)]
