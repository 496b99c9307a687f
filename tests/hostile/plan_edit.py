#!/usr/bin/env python3
"""plan_edit.py FILE CODE - damages a binary plan behind a valid checksum for
the hostile-input corpus (refusals.cases): runs the Python statement CODE
with d (the payload, a bytearray) and the helpers below, then writes FILE
back with the header's length and checksum (FNV-1a, ts_hash64 with seed 0)
recomputed, so the damage reaches the decoder (plan/plan.c).  Stdlib only.

    rec(tag, k=0)    offset of the body of the k-th record `tag` ('MESH', 'TRAN', ...)
    u32(off, v)      writes a little-endian u32 at off
    i32(off, v)      the same, signed
    swap_str(old, new)  replaces the first length-prefixed string old by new
                     (the same length)
    state(k=0)       offsets in the k-th state of the first program: 'dim' and
                     'dname' (lists, one per dim: its i64 size, its name's u32
                     length), 'split' (the sharding's first byte), 'nl' (the
                     count of logical sizes)
    rename_block(old, new)  renames block old of the first program"""
import struct
import sys

path, code = sys.argv[1], sys.argv[2]
b = open(path, 'rb').read()
n = struct.unpack_from('<Q', b, 16)[0]
d = bytearray(b[32:32 + n])


def rec(tag, k=0):
    t = tag.encode()
    at = -1
    for _ in range(k + 1):
        at = d.index(t, at + 1)
    return at + 8


def u32(off, v):
    struct.pack_into('<I', d, off, v)


def i32(off, v):
    struct.pack_into('<i', d, off, v)


def swap_str(old, new):
    assert len(old) == len(new)
    o = struct.pack('<I', len(old)) + old.encode()
    at = d.index(o)
    d[at + 4:at + 4 + len(new)] = new.encode()


def str_end(off):
    """the offset after the length-prefixed string at off"""
    n = struct.unpack_from('<I', d, off)[0]
    return off + 4 + (0 if n == 0xFFFFFFFF else n)


def state(k=0):
    at = rec('STAT') + 4
    for i in range(k + 1):
        at = str_end(at)                      # name
        rank = d[at + 1]
        at += 2                               # dtype, rank
        s = {'dim': [], 'dname': []}
        for _ in range(rank):
            s['dim'].append(at)
            s['dname'].append(at + 8)
            at = str_end(at + 8)
        at += 32                              # kind, init, init_a, init_b, of, flags
        s['split'] = at
        at += rank + 2                        # split per dim, partial, flat
        s['nl'] = at
        at += 1 + 8 * d[at]
    return s


def rename_block(old, new):
    o = struct.pack('<I', len(old)) + old.encode()
    blk = rec('BLCK')
    while bytes(d[blk:blk + len(o)]) != o:
        blk = d.index(b'BLCK', blk) + 8
    grow = len(new) - len(old)
    d[blk:blk + len(o)] = struct.pack('<I', len(new)) + new.encode()
    for lenat in (blk - 4, rec('PROG') - 4):  # the block's record and its program's
        struct.pack_into('<I', d, lenat, struct.unpack_from('<I', d, lenat)[0] + grow)


env = {'d': d, 'rec': rec, 'u32': u32, 'i32': i32, 'swap_str': swap_str, 'state': state,
       'rename_block': rename_block, 'struct': struct}
exec(code, env)
d = env['d']
h = 14695981039346656037
for c in bytes(d):
    h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
open(path, 'wb').write(b[:16] + struct.pack('<QQ', len(d), h) + bytes(d))
