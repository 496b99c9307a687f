#!/usr/bin/python3
"""rampup.py - Megatron's batch-size ramp-up (--rampup-batch-size START
INCR SAMPLES, --train-samples; docs/cli.md "Batch-size ramp-up").

    rampup.py MCC MRUN SRC WORKDIR

1. The global batch of every step and the samples consumed, from mrun
   --metrics, against Megatron's rule written here (its
   RampupBatchsizeNumMicroBatchesCalculator and update_train_iters), for
   several ramps and --train-samples.
2. The loss gradient's seed is a run-time value (1 / the step's micro
   batches): f64, a ramp plan whose first step runs START samples equals,
   bit for bit, one step of a plan compiled for global batch START (loss,
   grad norm, parameters), and differs from the full batch's step (so the
   check can fail); a ramp of no increments (START = global batch) trains
   exactly as the plain plan for every step.
3. dp 2 equals dp 1 over a ramp (1e-10); a run stopped and resumed in the
   middle of the ramp equals the uninterrupted one bit for bit, and one
   resumed with another ramp goes on from the samples the checkpoint
   records (Megatron's consumed_train_samples); pp 2 (1f1b)
   and pp 2 x vpp 2 (interleaved, with validation) equal one rank: the
   schedule is made for each step's micro batches.
4. The lr follows the samples (Megatron's scheduler): warmup over W =
   warmup x global_batch samples, lr min(n, W) / W with n the samples
   consumed after the step.
5. bf16 and fp16 plans ramp too; the refusals, each naming what works.
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
        "-D", "micro_batch=1"]
CONST = ["--lr", "0.01", "--lr-warmup-iters", "0", "--lr-decay-style", "constant"]


def megatron_batches(start, incr, samples, gbs, steps):
    """Megatron's calculator, step by step: the global batch of each step."""
    n = (gbs - start) // incr
    per = samples / n if n else 0
    out, consumed = [], 0
    for _ in range(steps):
        if consumed > samples or n == 0:
            b = gbs
        else:
            b = start + int(consumed / per) * incr
        out.append(b)
        consumed += b
    return out


def megatron_iters(start, incr, samples, gbs, train_samples):
    """Megatron's update_train_iters for sample-based training with a ramp."""
    it = consumed = 0
    while consumed <= samples and consumed <= train_samples:
        consumed += megatron_batches(start, incr, samples, gbs, 1)[0] if consumed == 0 else \
            _batch_at(start, incr, samples, gbs, consumed)
        it += 1
    if train_samples > consumed:
        it += (train_samples - consumed) // gbs
    return it


def _batch_at(start, incr, samples, gbs, consumed):
    n = (gbs - start) // incr
    if consumed > samples or n == 0:
        return gbs
    return start + int(consumed / (samples / n)) * incr


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compile_plan(name, flags):
    plan = os.path.join(WORK, name + ".plan")
    run([MCC, MODEL] + TINY + flags + ["-o", plan])
    return plan


def train(plan, name, flags=()):
    m, p = os.path.join(WORK, name + ".jsonl"), os.path.join(WORK, name + ".params")
    run([MRUN, plan, "--cpu", "--quiet", "--metrics", m, "--save-params", p] + list(flags))
    with open(p, "rb") as f:
        return metrics(m), f.read()


# ---- 1. the batches and the steps of --train-samples ----
for (s, i, n, gbs, extra) in [(2, 2, 16, 8, ["--train-iters", "9"]), (1, 1, 10, 4, ["--train-iters", "8"]),
                              (4, 4, 40, 16, ["--train-samples", "100"]), (2, 3, 5, 8, ["--train-samples", "30"])]:
    name = "batches_%d_%d_%d_%d" % (s, i, n, gbs)
    plan = compile_plan(name, ["--precision", "f64", "-D", "batch=%d" % gbs, "--rampup-batch-size", str(s), str(i),
                               str(n)] + CONST + extra)
    got, _ = train(plan, name)
    steps = int(extra[1]) if extra[0] == "--train-iters" else megatron_iters(s, i, n, gbs, int(extra[1]))
    want = megatron_batches(s, i, n, gbs, steps)
    gb = [r["global_batch"] for r in got]
    cons = [r["consumed_samples"] for r in got]
    if gb != want or cons != [sum(want[:k + 1]) for k in range(len(want))]:
        fail("%s %s: batches %s (consumed %s), Megatron's rule %s" % (name, " ".join(extra), gb, cons, want))
    print("ramp %d %d %d to %d, %s: %d steps, batches %s  (Megatron's rule: the same)" % (s, i, n, gbs, " ".join(extra),
                                                                                       len(gb), gb))

# ---- 2. the seed at run time ----
ramp = compile_plan("ramp", ["--precision", "f64", "-D", "batch=8", "--rampup-batch-size", "2", "2", "16",
                             "--train-iters", "6"] + CONST)
small = compile_plan("small", ["--precision", "f64", "-D", "batch=2", "--train-iters", "6"] + CONST)
full = compile_plan("full", ["--precision", "f64", "-D", "batch=8", "--train-iters", "6"] + CONST)
r1, rp = train(ramp, "ramp1", ["--steps", "1"])
s1, sp = train(small, "small1", ["--steps", "1"])
f1, fpar = train(full, "full1", ["--steps", "1"])
for k in ("loss", "grad_norm", "lr"):
    if r1[0][k] != s1[0][k]:
        fail("step 1 of the ramp (batch 2): %s %r, the plan compiled for batch 2: %r" % (k, r1[0][k], s1[0][k]))
if rp != sp:
    fail("step 1 of the ramp (batch 2): the parameters differ from the plan compiled for batch 2")
if fpar == rp or f1[0]["loss"] == r1[0]["loss"]:
    fail("step 1 of the ramp equals the full batch's step: the ramp was not applied")
print("step 1 of the ramp 2 2 16 (batch 2) = the plan for batch 2, bit for bit (loss %.17g); the batch-8 step differs "
      "(loss %.17g)" % (r1[0]["loss"], f1[0]["loss"]))
noramp = compile_plan("noramp", ["--precision", "f64", "-D", "batch=8", "--rampup-batch-size", "8", "2", "16",
                                 "--train-iters", "4"] + CONST)
plain = compile_plan("plain", ["--precision", "f64", "-D", "batch=8", "--train-iters", "4"] + CONST)
a, ap = train(noramp, "noramp")
b, bp = train(plain, "plain")
if [(x["loss"], x["grad_norm"], x["lr"]) for x in a] != [(x["loss"], x["grad_norm"], x["lr"]) for x in b] or ap != bp:
    fail("a ramp of no increments (8 2 16 at global batch 8) does not train exactly as the plain plan")
print("ramp 8 2 16 (no increments) = the plain plan for 4 steps, bit for bit")

# ---- 3. dp 2, and a resume in the middle of the ramp ----
one, onep = train(ramp, "ramp_dp1")
two, twop = train(ramp, "ramp_dp2", ["--gpus", "2"])
worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(one, two))
if len(two) != 6 or worst > 1e-10:
    fail("ramp at dp 2: %d steps, loss differs from dp 1 by %.3g" % (len(two), worst))
print("ramp at dp 2 = dp 1 over 6 steps (batches %s): loss within %.2g" % ([x["global_batch"] for x in two], worst))
ck = os.path.join(WORK, "ck")
run([MRUN, ramp, "--cpu", "--quiet", "--steps", "4", "--save", ck])
res, resp = train(ramp, "ramp_resumed", ["--load", ck])
if [x["loss"] for x in res] != [x["loss"] for x in one[4:]] or resp != onep:
    fail("a run resumed at step 4 of the ramp differs from the uninterrupted run: %s vs %s" %
         ([x["loss"] for x in res], [x["loss"] for x in one[4:]]))
print("stopped after step 4 and resumed: steps 5-6 and the parameters equal the uninterrupted run, bit for bit")
with open(os.path.join(ck, "iter_0000004", "metadata.json")) as f:
    if json.load(f).get("consumed_samples") != 10:
        fail("the checkpoint of step 4 does not say it was written after 10 samples (2 + 2 + 2 + 4)")
# resumed with other batch sizes, the run goes on from the samples the
# checkpoint records (Megatron's consumed_train_samples): the data position,
# the ramp's batch and the lr follow them, and a note says so
mres = os.path.join(WORK, "ramp_other.jsonl")
p = run([MRUN, ramp, "--cpu", "--quiet", "--load", ck, "--rampup-batch-size", "4", "2", "16", "--metrics", mres])
want = ("the checkpoint of step 4 was written after 10 samples; this run's batches (global_batch 8, with a ramp-up) "
        "would put its step 4 after 20: the data and the ramp go on from sample 10")
if want not in p.stderr:
    fail("resuming with another ramp: expected a note saying '%s', got:\n%s" % (want, p.stderr))
got = [(x["global_batch"], x["consumed_samples"]) for x in metrics(mres)]
c, rule = 10, []
for _ in range(2):   # Megatron's calculator from 10 consumed samples, ramp 4 2 16 to 8
    b = _batch_at(4, 2, 16, 8, c)
    c += b
    rule.append((b, c))
if got != rule:
    fail("resumed with the ramp 4 2 16 after 10 samples: (global_batch, consumed_samples) %s, Megatron's rule %s" %
         (got, rule))
if "note" in run([MRUN, ramp, "--cpu", "--quiet", "--load", ck]).stderr:
    fail("resuming with the same ramp prints a note")
print("resumed with another ramp (4 2 16) after 10 samples: steps 5-6 ran (batch, consumed) %s = Megatron's rule "
      "(this run's ramp alone would have put step 4 after 20 samples)" % got)

# ---- 3b. pipelines: the schedule is made for each step's count ----
for tag, extra, gpus, data in [("pp2", ["--pp", "2", "-D", "layers=2"], "2", []),
                               ("pp2_vpp2", ["--pp", "2", "--vpp", "2", "-D", "layers=4"], "2",
                                ["--mock-data", "--eval-interval", "3", "--eval-iters", "1"])]:
    layers = extra[-2:]
    rpp = compile_plan("ramp_" + tag, ["--precision", "f64", "-D", "batch=8", "--rampup-batch-size", "4", "2", "16",
                                       "--train-iters", "6"] + CONST + extra)
    r1 = compile_plan("ramp1_" + tag, ["--precision", "f64", "-D", "batch=8", "--rampup-batch-size", "4", "2", "16",
                                       "--train-iters", "6"] + CONST + layers)
    a, ap = train(r1, "ramp1_" + tag, data)
    b, bp = train(rpp, "ramp_" + tag, ["--gpus", gpus] + data)
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    vals = [(x.get("val_loss"), y.get("val_loss")) for x, y in zip(a, b)]
    if len(b) != 6 or worst > 1e-10 or any(v != w for v, w in vals):
        fail("ramp at %s: %d steps, loss differs from one rank by %.3g, validation %s" % (tag, len(b), worst, vals))
    print("ramp at %s = one rank over 6 steps (batches %s): loss within %.2g%s" %
          (tag, [x["global_batch"] for x in b], worst, ", validation equal" if data else ""))

# ---- 4. the lr in samples ----
warm = compile_plan("warm", ["--precision", "f64", "-D", "batch=8", "--rampup-batch-size", "2", "2", "16",
                             "--train-iters", "8", "--lr", "0.01", "--lr-warmup-iters", "3", "--lr-decay-style",
                             "constant"])
w, _ = train(warm, "warm")
for x in w:
    n = x["consumed_samples"]
    want = 0.01 * min(n, 3 * 8) / (3 * 8) if n - x["global_batch"] < 3 * 8 else 0.01
    if abs(x["lr"] - want) > 1e-15 * want:
        fail("step %d: lr %r, Megatron's sample-based warmup gives %r" % (x["step"], x["lr"], want))
print("lr during the ramp = 0.01 x min(consumed, 24) / 24 until 24 samples: %s" % [round(x["lr"], 6) for x in w])

# ---- 5. 16-bit plans, and the refusals ----
for prec in ("bf16", "fp16"):
    p16 = compile_plan("ramp_" + prec, ["--precision", prec, "-D", "batch=8", "--rampup-batch-size", "2", "2", "16",
                                        "--train-iters", "6"])
    m16, _ = train(p16, "ramp_" + prec)
    if [x["global_batch"] for x in m16] != [2, 2, 2, 4, 4, 6] or not all(math.isfinite(x["loss"]) for x in m16):
        fail("%s ramp: %s" % (prec, m16))
    print("%s ramp: batches %s, losses finite" % (prec, [x["global_batch"] for x in m16]))

REFUSALS = [
    ([MCC, MODEL] + TINY + ["-D", "batch=8", "--rampup-batch-size", "3", "2", "16"],
     "the global batch 8 must be the start plus a whole number of increments"),
    ([MCC, MODEL] + TINY + ["-D", "batch=8", "--rampup-batch-size", "2", "2"],
     "--rampup-batch-size takes three numbers"),
    ([MCC, MODEL] + TINY + ["-D", "batch=8", "-D", "layers=4", "--rampup-batch-size", "3", "1", "16", "--pp", "2",
                            "--vpp", "2"],
     "the ramp's global batch 3 gives 3 micro batches per dp rank (micro_batch 1, dp 1), which the pipeline (pp=2, "
     "vpp=2, --schedule interleaved) cannot run"),
    ([MCC, MODEL] + TINY + ["-D", "batch=8", "--rampup-batch-size", "2", "2", "16", "--dp", "4"],
     "the ramp's global batch 2 is not a multiple of micro_batch 1 x dp 4 = 4"),
    ([MCC, MODEL] + TINY + ["-D", "batch=8", "--train-samples", "40", "--train-iters", "3"],
     "both --train-iters (3) and --train-samples (40) are given"),
    ([MRUN, plain, "--cpu", "--rampup-batch-size", "2", "2", "16"],
     "the plan was compiled for a constant global batch (8)"),
    ([MRUN, ramp, "--cpu", "--gpus", "4"], "--gpus 4 gives dp = 4: --rampup-batch-size 2 2 16: the ramp's global "
     "batch 2 is not a multiple of micro_batch 1 x dp 4 = 4"),
    ([MRUN, ramp, "--cpu", "--rampup-batch-size", "2", "x", "16"], "--rampup-batch-size takes three numbers"),
]
for cmd, msg in REFUSALS:
    p = run(cmd[:2] + ["-o", os.path.join(WORK, "bad.plan")] + cmd[2:] if cmd[0] == MCC else cmd, ok=False)
    if p.returncode == 0 or msg not in p.stderr:
        fail("%s: expected a refusal saying '%s', got exit %d:\n%s" % (" ".join(cmd[1:]), msg, p.returncode,
                                                                     p.stderr))
    print("refused %-50s %s" % (" ".join(cmd[2:])[-50:], p.stderr.strip().splitlines()[0][:140]))
print("rampup: PASS")
