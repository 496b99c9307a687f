#!/usr/bin/python3
"""lr_schedules.py - the LR schedules through mcc's flags and mrun, against
closed forms written here from Megatron-LM's OptimizerParamScheduler.get_lr
(issue 24, deliverable 8; docs/cli.md "LR schedules").

    lr_schedules.py MCC MRUN SRC WORKDIR

For each schedule, compiles a tiny gpt with Megatron's flags, runs it with
mrun --metrics and prints, step by step, the lr mrun used and the closed
form (n = the step being taken, from 1; W warmup, D decay steps, Dw the wsd
decay steps):
  warmup         lr n / W                                     (n <= W)
  inverse-sqrt   max(min_lr, lr sqrt(max(W, 1)) / sqrt(n))
  WSD            lr while n <= D - Dw; then min_lr + f(r) (lr - min_lr),
                 r = (n - (D - Dw)) / Dw, f = 1 - r | (1 + cos(pi r)) / 2 |
                 2 * 0.5^r - 1 | 1 - sqrt(r) (linear | cosine | exponential |
                 minus_sqrt); min_lr after D
  cosine         min_lr + (lr - min_lr) (1 + cos(pi p)) / 2, p = (n - 1 - W) / (D - W)
Passes when every step agrees to 1e-15 relative.  Also the refusals: WSD
without --lr-wsd-decay-iters, one longer than the decay, an unknown style.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrun_util import fail, run  # noqa: E402

MCC, MRUN, SRC, WORK = sys.argv[1:5]
os.makedirs(WORK, exist_ok=True)
MODEL = os.path.join(SRC, "samples", "gpt.mdl")
TINY = ["-D", "layers=1", "-D", "d_model=16", "-D", "heads=2", "-D", "seq_len=8", "-D", "vocab=256",
        "-D", "batch=1", "-D", "micro_batch=1"]
LR, MIN_LR, STEPS = 0.01, 0.001, 14


def wsd(n, W, D, Dw, style):
    if n <= W:
        return LR * n / W
    if n > D:
        return MIN_LR
    start = D - Dw
    if n <= start:
        return LR
    r = (n - start) / Dw
    f = {"linear": 1 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1), "exponential": 2 * 0.5 ** r - 1,
         "minus_sqrt": 1 - math.sqrt(r)}[style]
    return MIN_LR + f * (LR - MIN_LR)


def invsqrt(n, W):
    if n <= W:
        return LR * n / W
    return max(MIN_LR, LR * math.sqrt(max(W, 1)) / math.sqrt(n))


def cosine(n, W, D):
    if n <= W:
        return LR * n / W
    p = min(1.0, max(0.0, (n - 1 - W) / (D - W)))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * p))


CASES = [
    ("wsd_linear", ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "5", "--lr-decay-iters", "12"],
     lambda n: wsd(n, 3, 12, 5, "linear")),
    ("wsd_cosine", ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4", "--lr-wsd-decay-style", "cosine"],
     lambda n: wsd(n, 3, STEPS, 4, "cosine")),
    ("wsd_exponential", ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "6", "--lr-wsd-decay-style",
                         "exponential"], lambda n: wsd(n, 3, STEPS, 6, "exponential")),
    ("wsd_minus_sqrt", ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "6", "--lr-wsd-decay-style",
                        "minus_sqrt"], lambda n: wsd(n, 3, STEPS, 6, "minus_sqrt")),
    ("inverse_sqrt", ["--lr-decay-style", "inverse-square-root"], lambda n: invsqrt(n, 3)),
    ("cosine", ["--lr-decay-style", "cosine"], lambda n: cosine(n, 3, STEPS)),
]

worst = 0.0
for name, flags, want in CASES:
    plan = os.path.join(WORK, name + ".plan")
    metrics = os.path.join(WORK, name + ".jsonl")
    run([MCC, MODEL] + TINY + ["--train-iters", str(STEPS), "--lr", str(LR), "--min-lr", str(MIN_LR),
                               "--lr-warmup-iters", "3"] + flags + ["-o", plan])
    run([MRUN, plan, "--cpu", "--quiet", "--metrics", metrics])
    with open(metrics) as f:
        got = [json.loads(line)["lr"] for line in f if line.strip()]
    if len(got) != STEPS:
        fail("%s: %d steps in %s, expected %d" % (name, len(got), metrics, STEPS))
    print("%s (%s):" % (name, " ".join(flags)))
    print("  step  mrun lr                  closed form")
    for n, g in enumerate(got, 1):
        w = want(n)
        err = abs(g - w) / w
        worst = max(worst, err)
        print("  %4d  %.17g  %.17g%s" % (n, g, w, "  <-- differs" if err > 1e-15 else ""))
if worst > 1e-15:
    fail("an lr differs from its closed form by %.3g relative" % worst)

# refusals, each naming what would work
REFUSALS = [
    (["--lr-decay-style", "WSD"], "needs its final decay's length"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "40"], "wsd_decay_steps = 40 is longer than decay_steps = 14"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4", "--lr-wsd-decay-style", "square"],
     "the wsd decay styles are linear, cosine, exponential and minus_sqrt"),
    (["--lr-decay-style", "noam"], "inverse_sqrt (inverse-square-root)"),
]
for flags, msg in REFUSALS:
    p = run([MCC, MODEL] + TINY + ["--train-iters", str(STEPS)] + flags + ["-o", os.path.join(WORK, "bad.plan")],
            ok=False)
    if p.returncode == 0 or msg not in p.stderr:
        fail("%s: expected a refusal saying '%s', got exit %d:\n%s" % (" ".join(flags), msg, p.returncode, p.stderr))
    print("refused %-60s %s" % (" ".join(flags), p.stderr.strip().splitlines()[0]))
print("lr_schedules: PASS: %d schedules equal their closed forms (worst %.3g relative), %d refusals"
      % (len(CASES), worst, len(REFUSALS)))
