"""eval_test.py MODE MCC MRUN SRC WORK - issue 22 D5: validation in mrun
(--eval-interval N --eval-iters K --test; pass eval's forward-only block;
docs/data.md "Validation").

Modes (one ctest each):
  oracle   the validation loss equals an independent computation: a
           dataset whose valid part mirrors its train part (same sequences,
           so the same sample order), trained with lr 1e-300 (no parameter moves), where the training
           steps' losses over the first K batches ARE the forward loss of
           those samples; reported after every N-th step only, in the
           progress line and --metrics, with val_ppl = exp(val_loss); a
           model with dropout 0.2 trains on other losses (dropout on) but
           evaluates to the same val_loss as without dropout (dropout off)
  params   evaluation changes nothing: parameters (--save-params) and the
           training losses are bit-identical with and without it (dropout
           on, lr > 0), and a run saved and resumed with evaluation ends
           bit-identical to one that ran straight through (same val_loss);
           --test reports the test split once at the end; the same for a
           pipeline program (pp 2 x vpp 2: its eval.<g> blocks and their
           messages), where the checkpoint's files (parameters, gradients,
           AdamW moments of every rank) are bit-identical too
  layouts  dp 2, tp 2, cp 2, pp 2, pp 2 x vpp 2 (4 layers, against 1 rank
           of 4 layers) and pp 2 x dp 2 give the 1-rank val_loss and
           test_loss (f64, 1e-10); --mock-data evaluates too (never on
           training samples)
  layouts16  bf16 and fp16 pipelines (issue 20): pp 2, pp 2 x vpp 2 and
           pp 2 x dp 2 give the val_loss and test_loss of one rank of the
           same precision (relative TOL16 = 1e-6)
  prefetch the batches of the prefetch thread train bit-identical losses to
           --no-prefetch (1 rank, dp 2, cp 2, pp 2, the byte corpus, and
           samples/gpt_packed.mdl with the packed-sequence flags at cp 2,
           whose inputs are made from the global tokens the thread
           delivers), and a data error made in the thread is reported the
           same way
  refuse   the byte corpus (no split), --eval-iters without --eval-interval,
           a split with an empty valid / test part, --eval-interval 0:
           refused naming the flag and the problem (also on a pipeline
           program); --eval-iters 0 evaluates nothing"""
import math
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gptdata"))
import gptdata_twin as tw  # noqa: E402
import random  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrun_util import ENV, fail, run  # noqa: E402
MODE, MCC, MRUN, SRC, WORK = sys.argv[1:6]


def docs(seed, n, maxlen):
    r = random.Random(seed)
    return [[[r.randrange(256) for _ in range(r.randrange(8, maxlen))]] for _ in range(n)]


def compile_plan(name, *extra, lr0=False, layers=2, model="gpt.mdl"):
    src = os.path.join(SRC, "samples", model)
    if lr0:   # lr 1e-300 throughout (mcc wants lr > 0): every AdamW step is below half an ulp of every parameter
        text = open(src).read()
        text, n1 = re.subn(r"lr: [0-9.e-]+", "lr: 1e-300", text)
        text, n2 = re.subn(r"min_lr: [0-9.e-]+", "min_lr: 1e-300", text)
        if n1 < 1 or n2 < 1:
            fail("samples/gpt.mdl has no lr / min_lr to set to 0")
        src = os.path.join(WORK, name + ".mdl")
        open(src, "w").write(text)
    path = os.path.join(WORK, name + ".plan")
    run([MCC, src, "-D", "layers=%d" % layers, "-D", "d_model=32", "-D", "heads=4", "-D", "seq_len=16", "-D", "vocab=256",
         "-D", "batch=4", "-D", "micro_batch=1", "--precision", "f64", "-o", path] + list(extra))
    return path


def metrics(path):
    import json
    return [json.loads(l) for l in open(path) if l.strip()]


def train(plan, tag, *args, gpus=1, steps=4, ok=True):
    out = os.path.join(WORK, tag + ".jsonl")
    if os.path.exists(out):
        os.remove(out)
    p = run([MRUN, plan, "--steps", str(steps), "--metrics", out, "--gpus", str(gpus)] + list(args), ok)
    return (metrics(out) if ok else None), p


def col(ms, key):
    return [m[key] for m in ms if key in m]


def close(a, b, tol):
    return len(a) == len(b) and len(a) > 0 and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def mode_oracle():
    ds = os.path.join(WORK, "mirror")
    d = docs(1, 60, 40)
    tw.write_indexed(ds, d + d)   # --split 1,1,0: valid = the same sequences as train
    data = ["--data-path", ds, "--split", "1,1,0", "--data-cache-path", os.path.join(WORK, "c")]
    for drop in ("0.0", "0.2"):
        plan = compile_plan("lr0_%s" % drop, "-D", "dropout=" + drop, lr0=True)
        ms, p = train(plan, "o" + drop, *data, "--eval-interval", "1", "--eval-iters", "2", steps=2)
        loss, val = col(ms, "loss"), col(ms, "val_loss")
        if drop == "0.0":
            want = (loss[0] + loss[1]) / 2   # batches 0 and 1 at the initial parameters
            if not close(val, [want, want], 1e-12):
                fail("val_loss %s; the training forward over the same samples gives %.15g" % (val, want))
            print("ok: val_loss %s = the mean training loss %.12f over the same 2 batches (lr 1e-300)" % (val, want))
            ref_val, ref_loss = val, loss
            lines = [l for l in p.stdout.splitlines() if "val_loss" in l]
            if len(lines) != 2 or "val_ppl" not in lines[0]:
                fail("progress lines without val_loss / val_ppl:\n" + p.stdout)
            for m in ms:
                if "val_loss" in m and abs(m["val_ppl"] - math.exp(m["val_loss"])) > 1e-9 * m["val_ppl"]:
                    fail("val_ppl %r is not exp(val_loss %r)" % (m["val_ppl"], m["val_loss"]))
        else:
            if close(loss, ref_loss, 1e-6):
                fail("dropout 0.2 trained the losses of dropout 0 (%s): is dropout on in training?" % loss)
            if not close(val, ref_val, 1e-12):
                fail("with dropout 0.2 val_loss is %s, without %s: dropout is not off in evaluation" % (val, ref_val))
            print("ok: dropout 0.2: training losses %s differ, val_loss %s equal (dropout off)" % (
                ["%.6f" % x for x in loss], ["%.12f" % x for x in val]))
    plan = compile_plan("lr", "-D", "dropout=0.1")
    ms, p = train(plan, "iv", *data, "--eval-interval", "2", "--eval-iters", "1", steps=5)
    at = [m["step"] for m in ms if "val_loss" in m]
    if at != [2, 4]:
        fail("--eval-interval 2 over 5 steps evaluated at steps %s" % at)
    print("ok: --eval-interval 2 over 5 steps evaluates after steps %s" % at)


def same_bytes(a, b):
    return open(a, "rb").read() == open(b, "rb").read()


def mode_params():
    ds = os.path.join(WORK, "ds")
    tw.write_indexed(ds, docs(2, 120, 50))
    data = ["--data-path", ds, "--split", "8,1,1", "--data-cache-path", os.path.join(WORK, "c")]
    plan = compile_plan("p", "-D", "dropout=0.1")
    pa, pb = os.path.join(WORK, "a.params"), os.path.join(WORK, "b.params")
    ev = ["--eval-interval", "1", "--eval-iters", "3"]
    ma, _ = train(plan, "a", *data, *ev, "--test", "--save-params", pa)
    mb, _ = train(plan, "b", *data, "--save-params", pb)
    if col(ma, "loss") != col(mb, "loss") or not same_bytes(pa, pb):
        fail("evaluation changed training: losses %s vs %s, parameters %s" % (
            col(ma, "loss"), col(mb, "loss"), "equal" if same_bytes(pa, pb) else "differ"))
    if len(col(ma, "val_loss")) != 4 or len(col(ma, "test_loss")) != 1 or col(mb, "val_loss"):
        fail("expected 4 val_loss and 1 test_loss: %s" % ma)
    print("ok: 4 evaluations and a test leave the parameters and the losses bit-identical (val %s, test %.6f)" % (
        ["%.6f" % x for x in col(ma, "val_loss")], col(ma, "test_loss")[0]))
    # a checkpoint with evaluation in the run, resumed
    ck, pc = os.path.join(WORK, "ck"), os.path.join(WORK, "c.params")
    ck2 = os.path.join(WORK, "ck_noeval")
    m1, _ = train(plan, "r1", *data, *ev, "--save", ck, steps=2)
    train(plan, "r1n", *data, "--save", ck2, steps=2)
    for f in sorted(os.listdir(os.path.join(ck, "iter_0000002"))):
        a, b = os.path.join(ck, "iter_0000002", f), os.path.join(ck2, "iter_0000002", f)
        if f != "metadata.json" and not same_bytes(a, b):
            fail("checkpoint file %s differs with evaluation in the run" % f)
    m2, _ = train(plan, "r2", *data, *ev, "--load", ck, "--save-params", pc)
    if not same_bytes(pc, pa) or col(m1, "loss") + col(m2, "loss") != col(ma, "loss") or \
            col(m1, "val_loss") + col(m2, "val_loss") != col(ma, "val_loss"):
        fail("save at step 2 and resume with evaluation: losses %s + %s vs %s, val %s + %s vs %s, parameters %s" % (
            col(m1, "loss"), col(m2, "loss"), col(ma, "loss"), col(m1, "val_loss"), col(m2, "val_loss"),
            col(ma, "val_loss"), "equal" if same_bytes(pc, pa) else "differ"))
    print("ok: saved at step 2 and resumed with evaluation: bit-identical losses, val_loss and parameters; the "
          "checkpoint's data files equal those of a run without evaluation")
    # a pipeline program: eval.<g> on every stage, messages between them
    pp = compile_plan("pp", "-D", "dropout=0.1", "--pp", "2", "--vpp", "2", layers=4)
    one = compile_plan("one4", "-D", "dropout=0.1", layers=4)
    qa, qb, ca, cb = [os.path.join(WORK, x) for x in ("pa.params", "pb.params", "ck_pa", "ck_pb")]
    na, _ = train(pp, "pa", *data, *ev, "--test", "--save-params", qa, "--save", ca, gpus=2)
    nb, _ = train(pp, "pb", *data, "--save-params", qb, "--save", cb, gpus=2)
    if col(na, "loss") != col(nb, "loss") or not same_bytes(qa, qb):
        fail("pp 2 x vpp 2: evaluation changed training: losses %s vs %s, parameters %s" % (
            col(na, "loss"), col(nb, "loss"), "equal" if same_bytes(qa, qb) else "differ"))
    files = sorted(os.listdir(os.path.join(ca, "iter_0000004")))
    for f in files:
        a, b = os.path.join(ca, "iter_0000004", f), os.path.join(cb, "iter_0000004", f)
        if f != "metadata.json" and not same_bytes(a, b):
            fail("pp 2 x vpp 2: checkpoint file %s differs with evaluation in the run" % f)
    n1, _ = train(one, "pone", *data, *ev, "--test")
    if len(col(na, "val_loss")) != 4 or not close(col(na, "val_loss"), col(n1, "val_loss"), 1e-10) or \
            not close(col(na, "test_loss"), col(n1, "test_loss"), 1e-10):
        fail("pp 2 x vpp 2: val_loss %s test_loss %s; 1 rank %s %s" % (
            col(na, "val_loss"), col(na, "test_loss"), col(n1, "val_loss"), col(n1, "test_loss")))
    print("ok: pp 2 x vpp 2: 4 evaluations and a test (the 1-rank values) leave the losses, parameters and the "
          "checkpoint's %d files (gradients, moments) bit-identical" % len(files))


def mode_layouts():
    ds = os.path.join(WORK, "ds")
    tw.write_indexed(ds, docs(3, 150, 50))
    base = ["--data-path", ds, "--split", "8,1,1", "--data-cache-path", os.path.join(WORK, "c"), "--quiet",
            "--eval-interval", "2", "--eval-iters", "2", "--test"]
    p1 = compile_plan("p1", "-D", "dropout=0.1")
    ref, _ = train(p1, "one", *base)
    rv, rt = col(ref, "val_loss"), col(ref, "test_loss")
    ref4, _ = train(compile_plan("p4", "-D", "dropout=0.1", layers=4), "one4", *base)
    for tag, plan, g, r in (("dp 2", p1, 2, ref), ("tp 2", compile_plan("tp2", "-D", "dropout=0.1", "--tp", "2"), 2, ref),
                            ("cp 2", compile_plan("cp2", "-D", "dropout=0.1", "--cp", "2"), 2, ref),
                            ("pp 2", compile_plan("pp2", "-D", "dropout=0.1", "--pp", "2"), 2, ref),
                            ("pp 2 x vpp 2", compile_plan("pp2v2", "-D", "dropout=0.1", "--pp", "2", "--vpp", "2",
                                                          layers=4), 2, ref4),
                            ("pp 2 x dp 2", compile_plan("pp2dp2", "-D", "dropout=0.1", "--pp", "2", "--dp", "2"), 4,
                             ref)):
        rv, rt = col(r, "val_loss"), col(r, "test_loss")
        ms, _ = train(plan, tag.replace(" ", ""), *base, gpus=g)
        if not close(col(ms, "val_loss"), rv, 1e-10) or not close(col(ms, "test_loss"), rt, 1e-10):
            fail("%s: val_loss %s test_loss %s; 1 rank: %s %s" % (tag, col(ms, "val_loss"), col(ms, "test_loss"), rv, rt))
        print("ok: %s gives the 1-rank%s val_loss %s and test_loss %s" % (
            tag, " (4 layers)" if r is ref4 else "", ["%.10f" % x for x in rv], rt))
    ma, _ = train(p1, "mock", "--mock-data", "--quiet", "--eval-interval", "2", "--eval-iters", "2")
    mb, _ = train(p1, "mock2", "--mock-data", "--quiet", "--eval-interval", "2", "--eval-iters", "2", gpus=2)
    v = col(ma, "val_loss")
    if len(v) != 2 or not all(4.0 < x < 7.0 for x in v) or not close(col(mb, "val_loss"), v, 1e-10):
        fail("--mock-data val_loss %s, dp 2 %s" % (v, col(mb, "val_loss")))
    print("ok: --mock-data evaluates: val_loss %s near ln 256, dp 2 equal" % v)


def mode_layouts16():
    ds = os.path.join(WORK, "ds")
    tw.write_indexed(ds, docs(3, 150, 50))
    base = ["--data-path", ds, "--split", "8,1,1", "--data-cache-path", os.path.join(WORK, "c"), "--quiet",
            "--eval-interval", "2", "--eval-iters", "2", "--test"]
    for prec in (["bf16"], ["fp16", "--initial-loss-scale", "1024"]):
        p, name = ["--precision"] + prec, prec[0]
        ref, _ = train(compile_plan(name + "1", "-D", "dropout=0.1", *p), name + "one", *base)
        ref4, _ = train(compile_plan(name + "4", "-D", "dropout=0.1", *p, layers=4), name + "one4", *base)
        for tag, plan, g, r in (("pp 2", compile_plan(name + "pp2", "-D", "dropout=0.1", "--pp", "2", *p), 2, ref),
                                ("pp 2 x vpp 2", compile_plan(name + "pp2v2", "-D", "dropout=0.1", "--pp", "2", "--vpp",
                                                              "2", *p, layers=4), 2, ref4),
                                ("pp 2 x dp 2", compile_plan(name + "pp2dp2", "-D", "dropout=0.1", "--pp", "2", "--dp",
                                                             "2", *p), 4, ref)):
            rv, rt = col(r, "val_loss"), col(r, "test_loss")
            ms, _ = train(plan, name + tag.replace(" ", ""), *base, gpus=g)
            mv, mt = col(ms, "val_loss"), col(ms, "test_loss")
            d = max([abs(x - y) / abs(y) for x, y in zip(mv + mt, rv + rt)] or [1])
            if len(mv) != 2 or not close(mv, rv, TOL16) or not close(mt, rt, TOL16):
                fail("%s %s: val_loss %s test_loss %s; 1 rank: %s %s" % (name, tag, mv, mt, rv, rt))
            print("ok: %s %s gives the 1-rank%s val_loss %s and test_loss %s (max relative difference %.3g)" % (
                name, tag, " (4 layers)" if r is ref4 else "", ["%.8f" % x for x in rv], rt, d))


# the 16-bit evaluations against one rank: the forward blocks round where
# one rank's do, but the parameters are an f32 ulp apart in a few elements
# after step 2 (the clip factor's sum order, docs/precision.md "Pipelines"),
# and such an ulp can move a 16-bit copy's rounding: measured 0 in all six
# cells while the weight gradients were rounded to bf16, 1.1e-8 (bf16 pp 2,
# the second evaluation) since they are made in f32
TOL16 = 1e-6


def mode_prefetch():
    ds = os.path.join(WORK, "ds")
    tw.write_indexed(ds, docs(5, 150, 50))
    base = ["--data-path", ds, "--split", "8,1,1", "--data-cache-path", os.path.join(WORK, "c"), "--quiet"]
    p1 = compile_plan("p1", "-D", "dropout=0.1")
    for tag, plan, g, extra in (("1 rank", p1, 1, []), ("dp 2", p1, 2, []),
                                ("cp 2", compile_plan("cp2", "-D", "dropout=0.1", "--cp", "2"), 2, []),
                                ("pp 2", compile_plan("pp2", "-D", "dropout=0.1", "--pp", "2"), 2, []),
                                ("byte corpus", p1, 1, ["BYTES"]),
                                ("packed cp 2", compile_plan("pk", "--cp", "2", model="gpt_packed.mdl"), 2, ["PACKED"])):
        args = ["--quiet"] if extra == ["BYTES"] else base
        if extra == ["PACKED"]:   # short documents ended by EOD 7: several inside every row
            r = random.Random(6)
            tw.write_indexed(os.path.join(WORK, "dsp"), [[[r.randrange(8, 256) for _ in range(r.randrange(1, 8))] + [7]]
                                                         for _ in range(300)])
            args = ["--data-path", os.path.join(WORK, "dsp"), "--split", "8,1,1", "--data-cache-path",
                    os.path.join(WORK, "cp"), "--quiet", "--eod-id", "7", "--reset-position-ids",
                    "--reset-attention-mask", "--eod-mask-loss"]
        a, _ = train(plan, "pf", *args, gpus=g, steps=5)
        b, _ = train(plan, "nopf", *args, "--no-prefetch", gpus=g, steps=5)
        if col(a, "loss") != col(b, "loss") or len(col(a, "loss")) != 5:
            fail("%s: losses with prefetch %s, without %s" % (tag, col(a, "loss"), col(b, "loss")))
        print("ok: %s: the prefetched batches train bit-identical losses %s" % (tag, ["%.6f" % x for x in col(a, "loss")]))
    # an error made in the prefetch thread is reported for its step, as without it
    small = compile_plan("v64", "-D", "vocab=64")
    msgs = []
    for pf in ([], ["--no-prefetch"]):
        _, p = train(small, "bad", *base, *pf, ok=False)
        if p.returncode == 0 or "vocabulary" not in p.stderr:
            fail("ids >= 64 were not refused%s: %s" % (" without prefetch" if pf else "", p.stderr))
        msgs.append(p.stderr.strip().splitlines()[-1])
    if msgs[0] != msgs[1]:
        fail("the refusal differs with prefetch: %r vs %r" % tuple(msgs))
    print("ok: an id above the vocabulary is refused the same with and without prefetch: " + msgs[0])


def mode_refuse():
    ds = os.path.join(WORK, "ds")
    tw.write_indexed(ds, docs(4, 60, 40))
    p1 = compile_plan("p1")
    pp2 = compile_plan("pp2", "--pp", "2")
    dp = ["--data-path", ds, "--data-cache-path", os.path.join(WORK, "c")]
    cases = [
        (p1, ["--eval-interval", "2"], 1, ["--eval-interval", "byte corpus", "--data-path"]),
        (p1, ["--test"], 1, ["--test", "byte corpus"]),
        (p1, dp + ["--eval-iters", "5"], 1, ["--eval-iters goes with --eval-interval"]),
        (p1, dp + ["--split", "100,0,0", "--eval-interval", "2"], 1, ["leaves the valid part"]),
        (p1, dp + ["--split", "99,1,0", "--test"], 1, ["leaves the test part"]),
        (pp2, dp + ["--split", "100,0,0", "--eval-interval", "2"], 2, ["leaves the valid part"]),
        (p1, dp + ["--eval-interval", "0"], 1, ["--eval-interval"]),
        (p1, dp + ["--eval-interval", "2", "--eval-iters", "-1"], 1, ["--eval-iters"]),
    ]
    for plan, extra, g, want in cases:
        _, p = train(plan, "x", *extra, gpus=g, ok=False)
        if p.returncode == 0 or any(w not in p.stderr for w in want):
            fail("mrun %s: exit %d, stderr %r; expected %s" % (" ".join(extra), p.returncode, p.stderr, want))
        said = [l for l in p.stderr.splitlines() if want[0] in l]   # (MPI adds lines after it)
        print("ok: refused %s%s: %s" % (" ".join(e for e in extra if e not in dp), " (pp 2)" if plan == pp2 else "",
                                        said[0].strip()))
    ms, _ = train(p1, "none", "--eval-interval", "2", "--eval-iters", "0")
    if col(ms, "val_loss"):
        fail("--eval-iters 0 evaluated")
    print("ok: --eval-iters 0 evaluates nothing (and needs no split)")


if __name__ == "__main__":
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    {"oracle": mode_oracle, "params": mode_params, "prefetch": mode_prefetch, "layouts": mode_layouts,
     "layouts16": mode_layouts16, "refuse": mode_refuse}[MODE]()
    print("PASS")
