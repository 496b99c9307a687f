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

Then mrun's own schedule flags (the same Megatron names): one plan compiled
with mcc's defaults, run with each case's flags given to mrun instead,
trains exactly as the plan compiled with them (every step's loss, lr and
grad norm equal, the parameters byte for byte); the flags that are
constants of the compiled program (--adam-beta1, --weight-decay,
--clip-grad, --optimizer, ...) are taken at the plan's value and refused at
another, naming mcc's flag.
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
    run([MRUN, plan, "--cpu", "--quiet", "--metrics", metrics, "--save-params", plan + ".params"])
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

# ---- mrun's flags: the same schedules given at run time ----
base = os.path.join(WORK, "base.plan")
run([MCC, MODEL] + TINY + ["--train-iters", str(STEPS), "-o", base])
KEYS = ("loss", "lr", "grad_norm")
for name, flags, want in CASES:
    metrics = os.path.join(WORK, name + ".mrun.jsonl")
    run([MRUN, base, "--cpu", "--quiet", "--metrics", metrics, "--save-params", metrics + ".params", "--lr", str(LR),
         "--min-lr", str(MIN_LR), "--lr-warmup-iters", "3"] + flags)
    with open(metrics) as f:
        got = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(WORK, name + ".jsonl")) as f:
        ref = [json.loads(line) for line in f if line.strip()]
    diff = [(n, k) for n, (g, r) in enumerate(zip(got, ref), 1) for k in KEYS if g[k] != r[k]]
    if len(got) != len(ref) or diff:
        fail("%s through mrun's flags: steps %d vs %d, differing (step, key): %s" % (name, len(got), len(ref), diff[:5]))
    with open(metrics + ".params", "rb") as f, open(os.path.join(WORK, name + ".plan.params"), "rb") as g:
        if f.read() != g.read():
            fail("%s through mrun's flags: the parameters differ from the plan compiled with them" % name)
    print("mrun %-60s = mcc's plan: %d steps, loss / lr / grad norm equal, parameters byte for byte"
          % (" ".join(flags), len(got)))

# Muon's AdamW-group lr (--muon-adamw-lr, a run-time value): mcc's flag and mrun's train alike, and it
# changes the AdamW group (the embedding, biases and gains) only
def params_of(path):
    with open(path, "rb") as f:
        return f.read()


mplans = {}
for tag, extra in (("muon", []), ("muon_alr", ["--muon-adamw-lr", "0.0025"])):
    mplans[tag] = os.path.join(WORK, tag + ".plan")
    run([MCC, MODEL] + TINY + ["--train-iters", "3", "--optimizer", "muon"] + extra + ["-o", mplans[tag]])
outs = {}
for tag, plan, extra in (("mcc", mplans["muon_alr"], []), ("mrun", mplans["muon"], ["--muon-adamw-lr", "0.0025"]),
                         ("none", mplans["muon"], [])):
    outs[tag] = os.path.join(WORK, "muon_" + tag + ".params")
    run([MRUN, plan, "--cpu", "--quiet", "--save-params", outs[tag]] + extra)
if params_of(outs["mcc"]) != params_of(outs["mrun"]):
    fail("--muon-adamw-lr: mrun's flag does not train as mcc's")
if params_of(outs["mcc"]) == params_of(outs["none"]):
    fail("--muon-adamw-lr 0.0025 changed nothing")
print("--muon-adamw-lr 0.0025: mrun's flag = mcc's (parameters byte for byte), and not the run without it")
p = run([MCC, MODEL] + TINY + ["--muon-adamw-lr", "0.01", "-o", os.path.join(WORK, "bad.plan")], ok=False)
if p.returncode == 0 or "is the lr of Muon's AdamW group, and the optimizer is adamw" not in p.stderr:
    fail("mcc --muon-adamw-lr with adamw was not refused:\n" + p.stderr)

# the program's constants: the plan's value is taken (a no-op), another refused naming mcc's flag
SAME = ["--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--weight-decay", "0.1",
        "--clip-grad", "1.0", "--optimizer", "adam", "--global-batch-size", "1", "--micro-batch-size", "1"]
m1 = os.path.join(WORK, "same.jsonl")
run([MRUN, base, "--cpu", "--quiet", "--steps", "2", "--metrics", m1] + SAME)
print("mrun %s: taken (the plan's values)" % " ".join(SAME))
MRUN_REFUSALS = [
    (["--adam-beta1", "0.8"], "--adam-beta1 0.8: the plan (optimizer adamw) was compiled with beta1 = 0.9, a constant "
                              "of its program (adamw's and lion's b1), not a run-time value: compile the plan again "
                              "with mcc --adam-beta1 0.8"),
    (["--weight-decay", "0"], "compile the plan again with mcc --weight-decay 0"),
    (["--clip-grad", "0.5"], "compile the plan again with mcc --clip-grad 0.5"),
    (["--optimizer", "lion"], "was compiled with optimizer = adamw"),
    (["--momentum", "0.5"], "compile the plan again with mcc --momentum 0.5"),
    (["--nesterov"], "compile the plan again with mcc --nesterov"),
    (["--global-batch-size", "4"], "the loss gradient's seed 1 / (global_batch / micro_batch)"),
    (["--lr-decay-style", "WSD"], "the WSD schedule needs its final decay's length in 1 .. 14"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "20"], "give --lr-wsd-decay-iters N"),
    (["--lr", "0"], "--lr needs a number > 0, got '0'"),
    (["--adam-beta2", "1"], "--adam-beta2 needs a number >= 0 and < 1, got '1'"),
    (["--lr-decay-style", "noam"], "--lr-decay-style must be constant, linear, cosine, WSD or inverse-square-root"),
    (["--muon-adamw-lr", "0.01"], "--muon-adamw-lr is the lr of Muon's AdamW group, and the plan's optimizer is adamw"),
    (["--lr-warmup-iters", "1.5"], "--lr-warmup-iters needs a whole number >= 0"),
]
for flags, msg in MRUN_REFUSALS:
    p = run([MRUN, base, "--cpu", "--quiet", "--steps", "1"] + flags, ok=False)
    if p.returncode == 0 or msg not in p.stderr:
        fail("mrun %s: expected a refusal saying '%s', got exit %d:\n%s" % (" ".join(flags), msg, p.returncode,
                                                                           p.stderr))
    print("mrun refused %-40s %s" % (" ".join(flags), p.stderr.strip().splitlines()[-1][:150]))
print("lr_schedules: PASS: %d schedules equal their closed forms (worst %.3g relative), %d refusals; mrun's flags "
      "train as mcc's (%d schedules), %d mrun refusals" % (len(CASES), worst, len(REFUSALS), len(CASES),
                                                           len(MRUN_REFUSALS)))
