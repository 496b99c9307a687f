#!/usr/bin/python3
"""test_check_metrics.py - makes sure check_metrics.py can fail: feeds it
synthetic metrics files (a good run, and one per thing it must catch) and
checks its exit status."""
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_metrics.py")


def rows(n=200, start=5.5, end=2.0):
    out = []
    for i in range(n):
        loss = start + (end - start) * i / (n - 1)
        out.append({"step": i + 1, "loss": loss, "lr": 1e-3, "grad_norm": 1.0,
                    "tokens_per_s": 1000.0, "elapsed_s": 0.1 * i})
    return out


def run(lines, steps=200):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(l if isinstance(l, str) else json.dumps(l) + "\n" for l in lines))
        path = f.name
    try:
        return subprocess.run([sys.executable, CHECK, path, str(steps)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    finally:
        os.unlink(path)


def main():
    bad_key = rows()
    del bad_key[17]["grad_norm"]
    nan = rows()
    nan[50]["loss"] = math.nan
    cases = [
        ("good run", rows(), 0),
        ("final loss above 0.6 ln 256", rows(end=3.5), 1),
        ("loss went up", rows(start=1.0, end=2.0), 1),
        ("199 lines", rows()[:-1], 1),
        ("a key missing", bad_key, 1),
        ("a non-finite loss", nan, 1),
        ("a line that is not JSON", rows()[:100] + ["{oops\n"] + rows()[101:], 1),
        ("steps out of order", rows()[1:] + rows()[:1], 1),
    ]
    failed = 0
    for name, lines, want in cases:
        got = run(lines)
        ok = (got == 0) == (want == 0)
        print("%-30s exit %d  %s" % (name, got, "ok" if ok else "WRONG (expected %s)" % ("0" if want == 0 else "non-zero")))
        failed += not ok
    if failed:
        sys.exit("test_check_metrics: FAIL: %d case(s) judged wrongly" % failed)
    print("test_check_metrics: OK")


if __name__ == "__main__":
    main()
