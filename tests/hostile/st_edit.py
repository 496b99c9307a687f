#!/usr/bin/env python3
"""st_edit.py FILE CODE - damages a safetensors file for the hostile-input
corpus (files.cases): runs the Python statement CODE with h (the header, a
dict), d (the data, a bytearray) and raw (None: set it to bytes to write the
header bytes as they are, unchecked), then writes FILE back with the header's
length in front.  Stdlib only."""
import json
import struct
import sys

path, code = sys.argv[1], sys.argv[2]
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
d = bytearray(b[8 + n:])
env = {'h': h, 'd': d, 'raw': None, 'json': json}
exec(code, env)
hb = env['raw'] if env['raw'] is not None else json.dumps(env['h'], separators=(',', ':')).encode()
open(path, 'wb').write(struct.pack('<Q', len(hb)) + hb + bytes(env['d']))
