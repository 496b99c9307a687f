#!/usr/bin/python3
"""opt_torch.py - Tessera's sgd, lion and muon steps against PyTorch (f64).

    /usr/bin/python3 opt_torch.py --exe PATH/opt_torch --out DIR

Runs opt_torch (tests/grad/opt_torch.c), which trains a four-parameter model
a few steps with each optimizer config and writes the initial parameters,
the inputs, each step's lr and the parameters after every step.  Replays
them in torch, float64, with autograd for the gradients and
torch.nn.utils.clip_grad_norm_ for clipping:
  sgd   torch.optim.SGD (momentum, nesterov, weight_decay; the nodecay bias
        in a group with weight_decay 0)
  lion  written out from Chen et al. 2023 (Algorithm 2): c = b1 m + (1-b1) g,
        p = p (1 - lr wd) - lr sign(c), m = b2 m + (1-b2) g
  muon  written out from the reference implementation (Keller Jordan's
        muon.py, muon_update and zeropower_via_newtonschulz5, in f64 rather
        than bf16): momentum.lerp_(g, 1-beta), nesterov g.lerp_(m, beta),
        quintic Newton-Schulz (3.4445, -4.7750, 2.0315) on the matrix with
        rows <= cols (a tall one transposed), scaled by
        sqrt(max(1, rows / cols)); p = p (1 - lr wd) - lr update.  The
        head H (the last matmul before the loss), the bias and the embedding
        table take torch.optim.AdamW.
The model: loss = sum((A W1 W2 H) Y) + sum(b xb) + sum(E[ids] Z) + 0.5 sum of
squares of every parameter, averaged over the micro batches.
Passes when every parameter after every step agrees to 1e-12 (relative to
max(1, max |p|)) and the reported gradient norm to 1e-12.  Exit code 1 on any
mismatch or error (torch missing included: setup.sh installs it).
"""
import argparse
import glob
import os
import subprocess
import sys

try:
    import torch
except ImportError as e:  # must fail, not skip
    sys.exit("opt_torch: FAIL: cannot import torch into %s (%s); install Debian's "
             "python3-torch (tools/setup.sh does)" % (sys.executable, e))

TOL = 1e-12
NS_COEF = (3.4445, -4.7750, 2.0315)


def load(path):
    cfg, params, shapes, inputs, lrs, after, norms = {}, {}, {}, {}, {}, {}, {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "config":
                for kv in w[1:]:
                    k, v = kv.split("=")
                    cfg[k] = v if k == "opt" else float(v)
            elif w[0] == "param":
                name, rank, d0, d1 = w[1], int(w[2]), int(w[3]), int(w[4])
                shapes[name] = (d0,) if rank == 1 else (d0, d1)
                params[name] = torch.tensor([float(x) for x in w[5:]], dtype=torch.float64).reshape(shapes[name])
            elif w[0] == "input":
                inputs[(int(w[1]), int(w[2]), w[3])] = [float(x) for x in w[4:]]
            elif w[0] == "lr":
                lrs[int(w[1])] = float(w[2])
            elif w[0] == "grad_norm":
                norms[int(w[1])] = float(w[2])
            elif w[0] == "after":
                after[(int(w[1]), w[2])] = torch.tensor([float(x) for x in w[3:]], dtype=torch.float64)
    return cfg, params, shapes, inputs, lrs, after, norms


def newton_schulz(g, steps):
    a, b, c = NS_COEF
    x = g.clone()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    if tall:
        x = x.mT
    return x


def replay(cfg, params, shapes, inputs, lrs, after, norms):
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt, wd, clip = cfg["opt"], cfg["wd"], cfg["clip"]
    nest = bool(cfg["nesterov"])
    decay = [p["W1"], p["W2"], p["H"], p["E"]]
    nodecay = [p["b"]]
    torch_opt = None
    state = {}
    if opt == "sgd":
        torch_opt = torch.optim.SGD([{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}],
                                    lr=1.0, momentum=cfg["momentum"], nesterov=nest)
    elif opt == "muon":
        torch_opt = torch.optim.AdamW([{"params": [p["H"], p["E"]], "weight_decay": wd},
                                       {"params": nodecay, "weight_decay": 0.0}],
                                      lr=1.0, betas=(cfg["b1"], cfg["b2"]), eps=cfg["eps"])
    worst = 0.0
    for s in range(int(cfg["steps"])):
        lr = lrs[s]
        nm = int(cfg["nmicro"])
        loss = 0.0
        for mi in range(nm):
            x = {k: torch.tensor(inputs[(s, mi, k)], dtype=torch.float64) for k in ("A", "Y", "xb", "Z", "ids")}
            ids = x["ids"].long()
            out = x["A"].reshape(3, 4) @ p["W1"] @ p["W2"] @ p["H"]
            term = ((out * x["Y"].reshape(3, 5)).sum() + (p["b"] * x["xb"]).sum()
                    + (p["E"][ids] * x["Z"].reshape(len(ids), 4)).sum())
            sq = sum((v * v).sum() for v in p.values())
            loss = loss + (term + 0.5 * sq) / nm
        for v in p.values():
            v.grad = None
        loss.backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        else:
            norm = torch.sqrt(sum((v.grad * v.grad).sum() for v in p.values()))
        worst = max(worst, abs(float(norm) - norms[s]) / max(1.0, abs(float(norm))))
        with torch.no_grad():
            if torch_opt is not None:
                for grp in torch_opt.param_groups:   # muon's AdamW group: its own lr (--muon-adamw-lr)
                    ratio = cfg.get("adamw_lr_ratio", 0.0) if opt == "muon" else 0.0
                    grp["lr"] = lr * ratio if ratio > 0 else lr
            if opt == "sgd":
                torch_opt.step()
            elif opt == "lion":
                b1, b2 = cfg["b1"], cfg["b2"]
                for k, v in p.items():
                    m = state.setdefault(k, torch.zeros_like(v))
                    g = v.grad
                    c = b1 * m + (1 - b1) * g
                    v.mul_(1 - lr * (0.0 if k == "b" else wd))
                    v.add_(torch.sign(c), alpha=-lr)
                    m.mul_(b2).add_(g, alpha=1 - b2)
            elif opt == "muon":
                torch_opt.step()   # the AdamW group: b and E
                beta = cfg["muon_momentum"]
                for k in ("W1", "W2"):
                    v = p[k]
                    g = v.grad.clone()
                    m = state.setdefault(k, torch.zeros_like(v))
                    m.lerp_(g, 1 - beta)
                    u = g.lerp_(m, beta) if nest else m
                    u = newton_schulz(u, int(cfg["ns_steps"]))
                    u = u * max(1.0, v.size(-2) / v.size(-1)) ** 0.5
                    v.mul_(1 - lr * wd)
                    v.add_(u, alpha=-lr)
            else:
                raise SystemExit("opt_torch: FAIL: unknown optimizer %s" % opt)
        for k, v in p.items():
            got = after[(s, k)]
            want = v.detach().reshape(-1)
            err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
            worst = max(worst, err)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for old in glob.glob(os.path.join(a.out, "*.txt")):
        os.remove(old)
    r = subprocess.run([a.exe, a.out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.exit("opt_torch: FAIL: %s exited %d" % (a.exe, r.returncode))
    files = sorted(glob.glob(os.path.join(a.out, "*.txt")))
    if len(files) < 7:
        sys.exit("opt_torch: FAIL: %d configs written, expected 7" % len(files))
    bad = 0
    torch.set_default_dtype(torch.float64)
    for path in files:
        worst = replay(*load(path))
        ok = worst <= TOL
        bad += not ok
        print("%s %-28s max relative difference %.3e (tolerance %g)"
              % ("ok  " if ok else "FAIL", os.path.basename(path)[:-4], worst, TOL))
    if bad:
        sys.exit("opt_torch: FAIL: %d config(s) differ from torch" % bad)
    print("opt_torch: PASS: %d configs equal torch's formulas" % len(files))


if __name__ == "__main__":
    main()
