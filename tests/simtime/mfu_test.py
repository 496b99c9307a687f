#!/usr/bin/env python3
"""mrun's TFLOP/s per rank and MFU (--hw) count what mcc --report time counts.

  usage: mfu_test.py MCC MRUN SRC TMPDIR

For 1 rank, tp 2 and pp 2 runs of a tiny gpt (rank 0 reads every token of
a step in these layouts, so its tokens/s times the step's tokens gives the
step's time): tflops_per_rank x ranks x step time equals `mcc --report
time`'s model FLOPs per step (Megatron's formula) to its 4 printed digits, and with
--hw the mfu is tflops_per_rank over the description's fp32 peak; the
progress line shows both.
"""
import json
import os
import re
import subprocess
import sys

MCC, MRUN, SRC, TMP = sys.argv[1:5]
os.makedirs(TMP, exist_ok=True)
TINY = [os.path.join(SRC, "samples", "gpt.mdl"), "-D", "layers=2", "-D", "d_model=64", "-D", "heads=4",
        "-D", "seq_len=64", "-D", "vocab=256", "-D", "batch=8", "-D", "micro_batch=2"]
HW = os.path.join(SRC, "hw", "h100-sxm.hw")
peak = float(re.search(r"^peak fp32 (\S+)", open(HW).read(), re.M).group(1))
failed = 0
for tag, flags, n in (("1 rank", [], 1), ("tp2", ["--tp", "2"], 2), ("pp2", ["--pp", "2"], 2)):
    plan = os.path.join(TMP, "p.plan")
    subprocess.run([MCC] + TINY + flags + ["-o", plan], check=True)
    rep = subprocess.run([MCC] + TINY + flags + ["--report", "time", "--hw", HW, "-o", "-"], check=True,
                         capture_output=True, text=True).stdout
    model = float(re.search(r"model FLOPs per step \(Megatron's[^)]*\): (\S+)", rep).group(1))
    met = os.path.join(TMP, "m.jsonl")
    p = subprocess.run([MRUN, plan, "--gpus", str(n), "--steps", "2", "--mock-data", "--hw", "h100-sxm",
                        "--metrics", met], capture_output=True, text=True)
    if p.returncode != 0:
        print("FAIL: %s: mrun: %s" % (tag, p.stderr))
        failed += 1
        continue
    rows = [json.loads(l) for l in open(met) if l.strip()]
    for r in rows:
        step_s = 8 * 64 / r["tokens_per_s"]
        got = r["tflops_per_rank"] * 1e12 * n * step_s
        if abs(got - model) > 5e-4 * model:   # mcc prints 4 significant digits
            print("FAIL: %s step %d: mrun's model FLOPs %.6g, mcc's %.6g" % (tag, r["step"], got, model))
            failed += 1
        if abs(r["mfu"] - r["tflops_per_rank"] * 1e12 / peak) > 1e-9:
            print("FAIL: %s: mfu %g is not tflops / peak %g" % (tag, r["mfu"], peak))
            failed += 1
    if not re.search(r"TFLOP/s/rank \| MFU [0-9.]+%", p.stdout):
        print("FAIL: %s: the progress line lacks TFLOP/s or MFU:\n%s" % (tag, p.stdout))
        failed += 1
    print("ok: %s: model FLOPs per step %.4g (mcc) = mrun's, MFU %.2f%%" % (tag, model, 100 * rows[-1]["mfu"]))
print("mfu_test: %s" % ("FAILED (%d)" % failed if failed else "passed"))
sys.exit(1 if failed else 0)
