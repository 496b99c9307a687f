#!/usr/bin/python3
"""autocast.py - `--precision bf16` training against PyTorch's CPU autocast.

    /usr/bin/python3 autocast.py --mcc MCC --mrun MRUN --mdl samples/gpt.mdl \
        --model gpt --out DIR --steps N --loss-tol L --param-tol P [-D name=value ...]

Issue 20, deliverable 3's last sentence: a short run of Tessera's bf16 plan
agrees with PyTorch's autocast-bf16 training of the same model.  Both sides
train with Megatron's semantics: f32 master weights, the forward's GEMMs on
bf16 operands with f32 accumulation, f32 gradients and an f32 AdamW.

  Tessera  mcc --precision bf16, mrun --mock-data --metrics --save-params.
           The initial parameters come from a first run of one step with
           --lr 1e-30 (mrun refuses 0): AdamW moves each element by about
           1e-30, nothing next to an f32 ulp of an initialized weight, and
           the zeros it moves to +-1e-30 are set back to 0 here; so nothing
           of the initializer is reimplemented.
  PyTorch  the hand-written models of models.py (not the IR) on f32
           parameters loaded from that file, the forward under
           torch.autocast("cpu", dtype=torch.bfloat16), backward outside
           it, clip_grad_norm_ and torch.optim.AdamW on the f32 parameters
           (two groups: the plan's `nodecay` parameters, read from
           `mcc --emit=ir`, without weight decay), lr per step taken from
           Tessera's --metrics (the schedule is checked elsewhere:
           tests/grad), the same mock batches (docs/data.md: token t of
           sample i is rand(seed, 5, i (T+1) + t) mod vocab, reproduced
           here from gptdata.c's formula), the step's loss the mean of its
           micro batches' losses, their gradients accumulated.

Why not bit equality, and the bounds: the two round to bf16 at different
points.  Tessera stores every activation in bf16 (the residual stream, the
norms' and the softmax's outputs: docs/precision.md's policy table);
autocast rounds the GEMMs' operands and outputs and leaves the rest in the
dtype it gets (the residual stream starts as the f32 embedding and stays
f32), and torch's CPU GEMM sums in another order.  Either way each token's
loss carries a rounding error of about half a bf16 ulp (2^-9 relative) of
its logits, independent from token to token, and a step's loss is the mean
over its B T tokens (64 here), so the two losses differ by about
2^-9 / sqrt(64) = 2^-12 = 2.4e-4 relative: --loss-tol (measured about a
quarter of it).  The final parameters are compared per tensor as
|a - b| / |b - b0| (Frobenius norms; b0 the initial values): the fraction
of the training's movement the two disagree on.  Adam moves every element
by about lr per step whatever its gradient's size, so an element whose
gradient is near 0 moves by rounding noise in both runs; the norm, unlike
the max, weighs those few against the whole tensor (--param-tol).  The
attention key bias is all such noise (its true gradient is 0) and is
listed, not compared.  --expect-fail inverts the verdict (a perturbed
reference).
Exit 1 on a failed comparison or any error (torch missing included:
setup.sh installs Debian's python3-torch).
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys

try:
    import torch
except ImportError as e:  # must fail, not skip
    sys.exit("autocast: FAIL: cannot import torch into %s (%s); install Debian's "
             "python3-torch (tools/setup.sh does)" % (sys.executable, e))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

M64 = (1 << 64) - 1
BF16_ULP = 2.0 ** -8   # bf16's spacing relative to a value in [1, 2): 8 significant bits
# The attention key bias adds the same number to every score of a query row,
# which softmax ignores: its gradient is 0 in exact arithmetic and rounding
# noise in both runs, and Adam turns noise of either sign into lr-sized
# steps, so the two runs' key biases are unrelated walks of the same size.
NOISE = re.compile(r"attention\.bk$")


def mix64(z):
    """gptdata.c's rt_gpt_mix64 (splitmix64's finalizer)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def mock_sample(seed, i, T, vocab):
    """rt_gpt_mock_sample: T + 1 tokens of global sample i."""
    base = mix64(mix64(seed) ^ 5)
    return [mix64(base ^ (i * (T + 1) + t)) % vocab for t in range(T + 1)]


def read_params(path):
    """mrun --save-params (runtime/exec/train.h): name -> f32 tensor."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"TSPARAMS":
        raise SystemExit("autocast: FAIL: %s is not a --save-params file" % path)
    _, count = struct.unpack_from("<II", buf, 8)
    off, out = 16, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", buf, off)
        name = buf[off + 4:off + 4 + nl].decode()
        off += 4 + nl
        dtype, rank = struct.unpack_from("<II", buf, off)
        off += 8
        dims = struct.unpack_from("<%dq" % rank, buf, off)
        off += 8 * rank
        n = 1
        for d in dims:
            n *= d
        fmt, size = {1: ("f", 4), 2: ("d", 8)}[dtype]
        vals = struct.unpack_from("<%d%s" % (n, fmt), buf, off)
        off += n * size
        out[name] = torch.tensor(vals, dtype=torch.float64).reshape(dims).float()
    return out


def run(cmd):
    print("autocast: running", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        sys.exit("autocast: FAIL: %s exited with %d" % (os.path.basename(cmd[0]), r.returncode))
    return r.stdout


def train_block(ir):
    """(seed, global_batch, micro_batch, betas, eps, weight_decay, clip, nodecay names) from the IR text."""
    m = re.search(r"^train (.*)$", ir, re.M)
    if not m:
        raise SystemExit("autocast: FAIL: no train line in mcc --emit=ir")
    kv = dict(w.split("=", 1) for w in m.group(1).split() if "=" in w)
    nodecay = set(re.findall(r"state @(\S+) : \S+ param\b[^\n]*\bnodecay", ir))
    return kv, nodecay


def torch_train(model, init, kv, nodecay, lrs, T, vocab, seed, autocast, shift):
    """Trains len(lrs) steps from init, reading global samples from `shift`
    on (0: Tessera's); returns (losses, params)."""
    params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    gb, mb = int(kv["global_batch"]), int(kv["micro_batch"])
    b1, b2 = float(kv["beta1"]), float(kv["beta2"])
    groups = [{"params": [p for n, p in params.items() if n not in nodecay], "weight_decay": float(kv["weight_decay"])},
              {"params": [p for n, p in params.items() if n in nodecay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lrs[0], betas=(b1, b2), eps=float(kv["eps"]))
    clip = float(kv.get("clip_grad", "0"))
    losses = []
    for s, lr in enumerate(lrs):
        opt.zero_grad()
        total = 0.0
        for j in range(gb // mb):
            rows = [mock_sample(seed, s * gb + j * mb + r + shift, T, vocab) for r in range(mb)]
            feeds = {"tokens": torch.tensor([r[:T] for r in rows], dtype=torch.int32),
                     "targets": torch.tensor([r[1:] for r in rows], dtype=torch.int32)}
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss, _ = model(params, feeds)
            (loss.float() / (gb // mb)).backward()
            total += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(total / (gb // mb))
    return losses, {k: v.detach() for k, v in params.items()}


def compare(ts_losses, ref_losses, ts_final, ref_final, init, loss_tol, param_tol):
    """Prints the figures; returns the list of what exceeded its bound."""
    bad = []
    worst = 0.0
    for s, (a, b) in enumerate(zip(ts_losses, ref_losses)):
        e = abs(a - b) / abs(b)
        worst = max(worst, e)
        print("  step %2d  loss tessera %.6f  torch %.6f  rel %.3e (%.2f bf16 ulps)" % (s + 1, a, b, e, e / BF16_ULP))
    if not worst <= loss_tol:
        bad.append("loss %.3e > %.3e" % (worst, loss_tol))
    moved = {n: float((ref_final[n] - init[n]).norm()) for n in init}
    pw = 0.0
    for n in sorted(init):
        if NOISE.search(n):
            print("  %-40s (not compared: its true gradient is 0, both sides move it by rounding noise)" % n)
            continue
        d = float((ts_final[n] - ref_final[n]).norm())
        e = d / moved[n]
        pw = max(pw, e)
        print("  %-40s |diff| %.3e  |update| %.3e  ratio %.4f  (max|diff| %.2e)"
              % (n, d, moved[n], e, float((ts_final[n] - ref_final[n]).abs().max())))
    if not pw <= param_tol:
        bad.append("params %.3f > %.3f" % (pw, param_tol))
    print("autocast: worst loss %.3e relative (%.2f bf16 ulps), params %.3f of the update" % (worst, worst / BF16_ULP, pw))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mcc", required=True)
    ap.add_argument("--mrun", required=True)
    ap.add_argument("--mdl", required=True)
    ap.add_argument("--model", required=True, choices=sorted(models.MODELS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--precision", default="bf16", help="Tessera's --precision")
    ap.add_argument("--torch", default="autocast", choices=["autocast", "f32"],
                    help="the reference: autocast-bf16 forward (default) or plain f32")
    ap.add_argument("--loss-tol", type=float, required=True)
    ap.add_argument("--param-tol", type=float, required=True)
    ap.add_argument("--perturb", choices=["none", "data", "lr"], default="none",
                    help="perturb the reference: data = every micro batch's samples shifted by one, "
                         "lr = lr x 1.25; with --expect-fail (the comparison must then fail)")
    ap.add_argument("--expect-fail", action="store_true")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    defs = sum((["-D", d] for d in args.defines), [])
    plan = os.path.join(args.out, "model.plan")
    base = [args.mcc, args.mdl] + defs + ["--precision", args.precision]
    ir = run(base + ["--emit=ir"])
    run(base + ["-o", plan])
    kv, nodecay = train_block(ir)
    init_f, final_f, metrics = (os.path.join(args.out, f) for f in ("init.params", "final.params", "m.jsonl"))
    run([args.mrun, plan, "--mock-data", "--steps", "1", "--lr", "1e-30", "--min-lr", "1e-30", "--quiet",
         "--save-params", init_f])
    if os.path.exists(metrics):
        os.remove(metrics)
    run([args.mrun, plan, "--mock-data", "--steps", str(args.steps), "--quiet", "--metrics", metrics,
         "--save-params", final_f])
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    init, ts_final = read_params(init_f), read_params(final_f)
    for v in init.values():   # the zero-initialized ones (biases) moved to +-1e-30
        v[v.abs() < 1e-20] = 0.0
    T = int(kv["seq_len"])
    vocab = int(init["token_embedding.wte"].shape[0])
    lrs = [r["lr"] * (1.25 if args.perturb == "lr" else 1.0) for r in rows]
    losses, ref_final = torch_train(models.MODELS[args.model], init, kv, nodecay, lrs, T, vocab,
                                    int(kv["seed"]), args.torch == "autocast",
                                    1 if args.perturb == "data" else 0)
    bad = compare([r["loss"] for r in rows], losses, ts_final, ref_final, init, args.loss_tol, args.param_tol)
    what = "%s %s vs torch %s%s, %d steps" % (args.model, args.precision,
                                               "autocast bf16" if args.torch == "autocast" else "f32",
                                               "" if args.perturb == "none" else " perturbed (%s)" % args.perturb, args.steps)
    if args.expect_fail:
        if not bad:
            sys.exit("autocast: FAIL: the perturbed run (%s) agreed within the bounds: the check cannot fail" % what)
        print("autocast: OK: the perturbed run fails as it must (%s): %s" % (what, "; ".join(bad)))
        return
    if bad:
        sys.exit("autocast: FAIL (%s): %s" % (what, "; ".join(bad)))
    print("autocast: OK (%s): loss within %.3e, params within %.3f of the update" % (what, args.loss_tol, args.param_tol))


if __name__ == "__main__":
    main()
