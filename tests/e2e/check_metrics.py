#!/usr/bin/python3
"""check_metrics.py - checks the metrics file of an end-to-end run.

    check_metrics.py m.jsonl STEPS

Asserts that the file has exactly STEPS lines, each a JSON object with all
of mrun's per-step keys (KEYS), steps numbered in order; that the loss went
down (mean of the last 10 steps below the mean of the first 10); and that
the final loss (mean of the last 10 steps) is below 0.6 * ln(256) = 3.33,
far below the loss of a uniform guess over byte tokens (ln 256 = 5.55).
"""
import json
import math
import sys

# The keys mrun writes on every line of --metrics (see docs/cli.md).
KEYS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s")


def fail(msg):
    sys.exit("check_metrics: FAIL: " + msg)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: check_metrics.py METRICS.jsonl STEPS")
    path, steps = sys.argv[1], int(sys.argv[2])
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().split("\n") if ln.strip()]
    except OSError as e:
        fail("cannot read %s: %s" % (path, e))
    if len(lines) != steps:
        fail("%s has %d lines, expected %d" % (path, len(lines), steps))
    rows = []
    for i, ln in enumerate(lines, 1):
        try:
            r = json.loads(ln)
        except ValueError as e:
            fail("line %d is not JSON (%s): %r" % (i, e, ln[:200]))
        missing = [k for k in KEYS if k not in r]
        if missing:
            fail("line %d lacks %s: %r" % (i, ", ".join(missing), ln[:200]))
        if not isinstance(r["loss"], (int, float)) or not math.isfinite(r["loss"]):
            fail("line %d: loss is %r" % (i, r["loss"]))
        rows.append(r)
    step_nums = [r["step"] for r in rows]
    if step_nums != list(range(step_nums[0], step_nums[0] + steps)) or step_nums[0] not in (0, 1):
        fail("steps are not numbered consecutively from 0 or 1: %s ..." % step_nums[:5])

    first = sum(r["loss"] for r in rows[:10]) / 10
    last = sum(r["loss"] for r in rows[-10:]) / 10
    bound = 0.6 * math.log(256)
    print("check_metrics: %d steps, loss %.4f (first 10) -> %.4f (last 10), bound %.4f"
          % (steps, first, last, bound))
    if not last < first:
        fail("loss did not decrease (%.4f -> %.4f)" % (first, last))
    if not last < bound:
        fail("final loss %.4f is not below 0.6 * ln(256) = %.4f" % (last, bound))
    print("check_metrics: OK")


if __name__ == "__main__":
    main()
