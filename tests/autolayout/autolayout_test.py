#!/usr/bin/env python3
"""mcc --auto-layout (tools/autolayout.c) as a user runs it.

  usage: autolayout_test.py MCC MRUN SRCDIR TMPDIR

  ranking   every row of the table is what `mcc --report time` predicts for
            the row's flags (step_time_s, 4 significant digits), the rows
            are in ascending order, and stage A's estimate of each is within
            25% of it (the short copies extrapolate);
  plan      the plan written with -o is, byte for byte, what mcc writes for
            the chosen flags, and mrun trains it (3 steps, f64) to the
            losses of the one-rank plan within 1e-10;
  memory    with --memory below the unconstrained winner's bytes, the new
            winner fits it (its --report memory total), and --memory 1K is
            refused naming the figures;
  refusals  a layout flag next to --auto-layout, --auto-layout without --hw,
            --memory without --auto-layout: exit 2 with the reason.
"""
import json
import os
import re
import subprocess
import sys

MCC, MRUN, SRC, TMP = sys.argv[1:5]
os.makedirs(TMP, exist_ok=True)
GPT = os.path.join(SRC, "samples", "gpt.mdl")
# a tiny gpt whose micro batch (the sample's config key, 4) is searched
TINY = ["-D", "layers=4", "-D", "d_model=64", "-D", "heads=4", "-D", "seq_len=64", "-D", "vocab=256",
        "-D", "batch=16", "--precision", "f64"]
HW = ["--hw", "h100-sxm"]
failed = 0


def fail(msg):
    global failed
    failed += 1
    print("FAIL: " + msg)


def run(args, expect=0):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != expect:
        fail("%s: exit %d (expected %d)\n%s%s" % (" ".join(args), p.returncode, expect, p.stdout, p.stderr))
    return p


def rows(out):
    """(rank, flags dict, step, est, gib) per row of the table."""
    res = []
    for line in out.splitlines():
        m = re.match(r"\s+(\d+)\s+(tp=.*?recompute=\w+)\s+(\S+)\s+(\S+)\s+(\S+)%\s+(\S+)\s+(\S+)\s+", line)
        if m:
            res.append((int(m.group(1)), m.group(2), float(m.group(3)), float(m.group(7)), float(m.group(6))))
    return res


def flags_of(layout):
    """mcc's flags for a layout string "tp=2 sp pp=2 vpp=2 interleaved dp=2 mb=2 recompute=none"."""
    f = []
    for tok in layout.split():
        if tok == "sp":
            f.append("--sp")
        elif "=" in tok:
            k, v = tok.split("=")
            f += {"tp": ["--tp", v], "cp": ["--cp", v], "ep": ["--ep", v], "pp": ["--pp", v], "vpp": ["--vpp", v],
                  "dp": ["--dp", v], "mb": ["--micro-batch-size", v], "recompute": ["--recompute", v]}[k]
        elif tok in ("1f1b", "interleaved", "gpipe"):
            f += ["--schedule", tok]
        elif tok == "no-zero":
            f.append("--no-zero")
        elif tok in ("a2a", "allgather"):
            f += ["--cp-attn", tok]
    return f


def predicted(flags):
    p = run([MCC, GPT] + TINY + flags + ["--report", "time"] + HW + ["-o", "-"])
    m = re.search(r"step_time_s=(\S+)", p.stdout)
    return float(m.group(1)) if m else float("nan")


def memory_total(flags):
    p = run([MCC, GPT] + TINY + flags + ["--report", "memory", "-o", "-"])
    tot = [int(x) for x in re.findall(r"total with the stash peak \(states \+ arena \+ stash\)\s+(\d+)", p.stdout)]
    if not tot:
        tot = [int(x) for x in re.findall(r"total \(states \+ arena\)\s+(\d+)", p.stdout)]
    # the per-rank sections come first, the unsharded comparison last
    return max(tot[:-1]) if len(tot) > 1 else tot[0]


# ---- ranking ----
plan = os.path.join(TMP, "auto.plan")
p = run([MCC, GPT] + TINY + ["--auto-layout", "--gpus", "4"] + HW + ["-o", plan])
table = rows(p.stdout)
if len(table) < 3:
    fail("fewer than 3 rows:\n" + p.stdout)
steps = [r[2] for r in table]
if steps != sorted(steps):
    fail("rows not in ascending step time: %s" % steps)
for rank, layout, step, est, gib in table:
    pred = predicted(flags_of(layout))
    if abs(pred - step) > 5e-4 * step:
        fail("row %d (%s): table says %g s, mcc --report time says %g s" % (rank, layout, step, pred))
    if abs(est - step) > 0.25 * step:
        fail("row %d (%s): stage A estimated %g s, the whole compile %g s (more than 25%% off)" % (rank, layout, est, step))
print("ok: ranking: %d rows, each --report time's prediction; estimates within %.1f%%" %
      (len(table), 100 * max(abs(r[3] - r[2]) / r[2] for r in table) if table else 0))

# ---- plan ----
chosen = re.search(r"^chosen: (.*?) \(mcc flags: (.*)\)$", p.stdout, re.M)
if not chosen:
    fail("no 'chosen:' line:\n" + p.stdout)
else:
    if chosen.group(1) != table[0][1]:
        fail("chosen %s is not the first row %s" % (chosen.group(1), table[0][1]))
    manual = os.path.join(TMP, "manual.plan")
    run([MCC, GPT] + TINY + chosen.group(2).split() + ["-o", manual])
    if open(plan, "rb").read() != open(manual, "rb").read():
        fail("the -o plan differs from mcc %s" % chosen.group(2))
    one = os.path.join(TMP, "one.plan")
    run([MCC, GPT] + TINY + ["--micro-batch-size", str(re.search(r"mb=(\d+)", chosen.group(1)).group(1)), "-o", one])
    dp = re.search(r"dp=(\d+)", chosen.group(1))
    losses = {}
    for tag, pl, gpus in (("auto", plan, 4), ("one", one, 1)):
        met = os.path.join(TMP, tag + ".jsonl")
        run([MRUN, pl, "--gpus", str(gpus), "--steps", "3", "--quiet", "--mock-data", "--metrics", met])
        try:
            losses[tag] = [json.loads(l)["loss"] for l in open(met) if l.strip()]
        except (OSError, ValueError, KeyError) as e:
            losses[tag] = []
            fail("%s: no losses (%s)" % (tag, e))
    if len(losses["auto"]) != 3 or len(losses["one"]) != 3:
        fail("losses: %s" % losses)
    else:
        d = max(abs(a - b) / abs(b) for a, b in zip(losses["auto"], losses["one"]))
        if d > 1e-10:
            fail("the chosen plan's losses %s differ from one rank's %s by %g" % (losses["auto"], losses["one"], d))
        print("ok: plan: the -o plan is mcc %s byte for byte; 3 steps on 4 ranks equal one rank within %.1e"
              % (chosen.group(2), d))

# ---- memory ----
if table:
    full = memory_total(flags_of(table[0][1]))
    limit = int(full * 0.8)
    p2 = run([MCC, GPT] + TINY + ["--auto-layout", "--gpus", "4", "--memory", str(limit)] + HW)
    t2 = rows(p2.stdout)
    if not t2:
        fail("no layout under --memory %d:\n%s" % (limit, p2.stdout))
    else:
        got = memory_total(flags_of(t2[0][1]))
        if got > limit:
            fail("under --memory %d the winner %s holds %d bytes" % (limit, t2[0][1], got))
        else:
            print("ok: memory: the winner holds %d bytes; under --memory %d: %s holds %d" % (full, limit, t2[0][1], got))
    p3 = run([MCC, GPT] + TINY + ["--auto-layout", "--gpus", "4", "--memory", "1K"] + HW, expect=1)
    if "no layout" not in p3.stderr or "fits 0.0 GiB" not in p3.stderr:
        fail("--memory 1K: %s" % p3.stderr)

# ---- refusals ----
for extra, want in ((["--tp", "2"], "--tp fixes part of it"), (["--recompute", "full"], "--recompute"),
                    (["--report", "time"], "does not go")):
    p4 = run([MCC, GPT, "--auto-layout", "--gpus", "4"] + HW + extra, expect=2)
    if want not in p4.stderr:
        fail("%s: %s" % (extra, p4.stderr))
p5 = run([MCC, GPT, "--auto-layout", "--gpus", "4"], expect=2)
if "needs --gpus N and --hw" not in p5.stderr:
    fail("no --hw: " + p5.stderr)
p6 = run([MCC, GPT, "--memory", "1G"], expect=2)
if "--memory goes with --auto-layout" not in p6.stderr:
    fail("--memory alone: " + p6.stderr)
print("ok: refusals")

print("autolayout: %s" % ("FAILED (%d)" % failed if failed else "passed"))
sys.exit(1 if failed else 0)
