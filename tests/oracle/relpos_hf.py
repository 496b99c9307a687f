"""relpos_hf.py - nn.relative_position_bucket against HF transformers.

    .venv/bin/python relpos_hf.py EXPORTER SRC OUTDIR

For each (num_buckets, max_distance) it runs ts_export on
tests/ints/relpos_buckets.mdl (f64, one micro batch), whose loss is
sum(float(bucket) * x) over rel = key - query from -302 to 299: the
gradient of x is then Tessera's bucket index for every rel, bidirectional
(param xb) and causal (xc).  Those must equal, exactly,
T5Attention._relative_position_bucket of HF transformers (the T5 the
published checkpoints were trained with) on the same rel.  Exit 1 on any
difference, or when transformers does not import (it must fail, not skip).
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention
except ImportError as e:
    sys.exit("relpos_hf: FAIL: cannot import torch / transformers into %s (%s)" % (sys.executable, e))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle import load_export  # noqa: E402


def main():
    exporter, src, out = sys.argv[1:4]
    mdl = os.path.join(src, "tests", "ints", "relpos_buckets.mdl")
    Q, K, start = 3, 600, 300
    rel = torch.arange(K)[None, :] - torch.arange(start, start + Q)[:, None]
    bad = 0
    for nb, md in ((32, 128), (8, 20), (16, 50), (64, 300)):
        d = os.path.join(out, "nb%d_md%d" % (nb, md))
        os.makedirs(d, exist_ok=True)
        subprocess.run([exporter, mdl, d, "-D", "buckets=%d" % nb, "-D", "max_distance=%d" % md], check=True,
                       stdout=subprocess.DEVNULL)
        _, grads, _, _ = load_export(d)
        for name, bid in (("xb", True), ("xc", False)):
            want = T5Attention._relative_position_bucket(rel, bidirectional=bid, num_buckets=nb,
                                                         max_distance=md).numpy()
            got = grads[name]
            n = int(np.sum(got != want))
            print("relpos_hf: num_buckets %d max_distance %d %s: %d of %d buckets differ (max bucket %d)"
                  % (nb, md, "bidirectional" if bid else "causal", n, got.size, int(want.max())))
            if n:
                i = np.argwhere(got != want)[0]
                print("  first at rel %d: tessera %g, transformers %d" % (int(rel[i[0], i[1]]), got[i[0], i[1]],
                                                                         int(want[i[0], i[1]])))
            bad += n
    print("relpos_hf: %s" % ("FAIL" if bad else "PASS"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
