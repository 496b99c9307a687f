#!/usr/bin/env python3
"""mrun --trace FILE (runtime/exec/trace.c): a Chrome / Perfetto trace.

  usage: trace_test.py MCC MRUN SRC TMPDIR

For tp 2 (2 ranks) and pp 2 (2 ranks) runs of a tiny gpt: the file is JSON
with the keys Perfetto's Chrome importer reads (traceEvents; ph, ts, pid,
tid, dur for complete events; process_name metadata), one process per rank,
every rank's collectives (tp) or pipeline messages (pp) present, the steps
on thread 1 as many as were run, no two ops of a rank overlapping on
thread 0 (they run one after another), every op inside its run's span,
and the parts each rank wrote are gone.  A third run names the --metrics
file as --trace: refused.
"""
import glob
import json
import os
import subprocess
import sys

MCC, MRUN, SRC, TMP = sys.argv[1:5]
os.makedirs(TMP, exist_ok=True)
TINY = [os.path.join(SRC, "samples", "gpt.mdl"), "-D", "layers=2", "-D", "d_model=64", "-D", "heads=4",
        "-D", "seq_len=64", "-D", "vocab=256"]
failed = 0


def fail(msg):
    global failed
    failed += 1
    print("FAIL: " + msg)


for tag, flags, want in (("tp2", ["--tp", "2"], "collective"), ("pp2", ["--pp", "2"], "pipeline")):
    plan = os.path.join(TMP, tag + ".plan")
    trace = os.path.join(TMP, tag + ".json")
    subprocess.run([MCC] + TINY + flags + ["-o", plan], check=True)
    p = subprocess.run([MRUN, plan, "--gpus", "2", "--steps", "3", "--mock-data", "--quiet", "--trace", trace],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fail("%s: mrun exited %d: %s" % (tag, p.returncode, p.stderr))
        continue
    try:
        doc = json.load(open(trace))
    except ValueError as e:
        fail("%s: not JSON: %s" % (tag, e))
        continue
    ev = doc.get("traceEvents")
    if not isinstance(ev, list) or not ev:
        fail("%s: no traceEvents" % tag)
        continue
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
    if sorted(names) != [0, 1]:
        fail("%s: processes %s, want ranks 0 and 1" % (tag, names))
    for rank in (0, 1):
        xs = [e for e in ev if e.get("ph") == "X" and e.get("pid") == rank]
        for e in xs:
            if not all(k in e for k in ("name", "ts", "dur", "tid")) or e["dur"] < 0 or e["ts"] < 0:
                fail("%s: rank %d: bad event %s" % (tag, rank, e))
                break
        ops = sorted((e for e in xs if e["tid"] == 0), key=lambda e: e["ts"])
        steps = [e for e in xs if e["tid"] == 1]
        if len(steps) != 3:
            fail("%s: rank %d: %d step events, want 3" % (tag, rank, len(steps)))
        if not any(e.get("cat") == want for e in ops):
            fail("%s: rank %d: no %s events" % (tag, rank, want))
        if not any(e.get("cat") == "gemm" for e in ops):
            fail("%s: rank %d: no GEMMs" % (tag, rank))
        overlap = [(a["name"], b["name"]) for a, b in zip(ops, ops[1:]) if a["ts"] + a["dur"] > b["ts"] + 0.002]
        if overlap:
            fail("%s: rank %d: %d ops overlap, e.g. %s" % (tag, rank, len(overlap), overlap[0]))
        if steps and ops:
            lo = min(s["ts"] for s in steps)
            hi = max(s["ts"] + s["dur"] for s in steps)
            out = [e for e in ops if e["ts"] < lo - 0.002 or e["ts"] + e["dur"] > hi + 0.002]
            if out:
                fail("%s: rank %d: %d ops outside the steps, e.g. %s" % (tag, rank, len(out), out[0]))
        print("ok: %s rank %d: %d ops (%s), %d steps" % (tag, rank, len(ops),
              ", ".join("%s %d" % (c, sum(1 for e in ops if e.get("cat") == c))
                        for c in ("gemm", "attention", "collective", "pipeline", "kernel")), len(steps)))
    left = glob.glob(trace + ".rank*")
    if left:
        fail("%s: the ranks' parts are left: %s" % (tag, left))

plan = os.path.join(TMP, "tp2.plan")
m = os.path.join(TMP, "m.jsonl")
p = subprocess.run([MRUN, plan, "--gpus", "2", "--steps", "1", "--mock-data", "--quiet", "--metrics", m, "--trace", m],
                   capture_output=True, text=True)
if p.returncode == 0 or "each needs a file of its own" not in p.stderr:
    fail("--trace = --metrics: exit %d, %s" % (p.returncode, p.stderr))
print("trace_test: %s" % ("FAILED (%d)" % failed if failed else "passed"))
sys.exit(1 if failed else 0)
