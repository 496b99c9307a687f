#!/usr/bin/python3
"""oracle.py - checks Tessera's loss and gradients against PyTorch.

    /usr/bin/python3 oracle.py --exporter PATH/ts_export --mdl MODEL.mdl \
        --out DIR --check {gpt,llama,ir} [-D name=value ...]

Runs ts_export (which compiles MODEL.mdl in f64, runs one micro-batch and
writes the initial parameters, Tessera's gradients, inputs, loss and the
forward IR to DIR), then recomputes the loss and every parameter gradient
in float64 with torch.autograd, in one of two independent ways:
  gpt / llama  a hand-written PyTorch model (models.py) that loads the
               exported weights by their MDL names: checks the frontend's
               lowering, the kernels and autodiff together;
  ir           a generic interpreter of the forward IR text (ir_torch.py):
               model-agnostic, so it covers any .mdl.
Passes when |loss - loss_ref| / |loss_ref| and, for every parameter,
max|g - g_ref| / max(max|g_ref|, 1e-6 * G) are <= --tol (1e-9), where G is
the largest reference gradient element of any parameter.  The floor only
matters for gradients that are zero in exact arithmetic (e.g. the key bias
of attention: softmax ignores a per-query constant), where both sides are
rounding noise (~1e-20) and a plain ratio of noise to noise means nothing;
a real error there is of the size of the other gradients and still fails.  Exit code 1 on any
mismatch or error (including torch missing: setup.sh installs it).
"""
import argparse
import json
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # must fail, not skip: the oracle is part of the suite
    sys.exit("oracle: FAIL: cannot import torch/numpy into %s (%s); "
             "install Debian's python3-torch and python3-numpy (tools/setup.sh does)"
             % (sys.executable, e))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ir_torch  # noqa: E402
import models  # noqa: E402

NP_DTYPES = {"i32": np.int32, "f32": np.float32, "f64": np.float64}


def load_export(out_dir):
    """Reads manifest.json: returns (params, grads, inputs, loss) where
    params/grads map state names (grads by their parameter's name) to
    float64 numpy arrays and inputs maps input names to arrays."""
    with open(os.path.join(out_dir, "manifest.json")) as f:
        man = json.load(f)

    def read(entry, dtype):
        a = np.fromfile(os.path.join(out_dir, entry["file"]), dtype=np.dtype(dtype).newbyteorder("<"))
        shape = tuple(entry["shape"])
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise SystemExit("oracle: FAIL: %s has %d values, shape %s" % (entry["file"], a.size, shape))
        return a.reshape(shape)

    params, grads = {}, {}
    for s in man["states"]:
        if s["kind"] == "param":
            params[s["name"]] = read(s, np.float64)
        elif s["kind"] == "grad":
            grads[s["of"]] = read(s, np.float64)
    inputs = {i["name"]: read(i, NP_DTYPES[i["dtype"]]) for i in man["inputs"]}
    if man["loss"] is None:
        raise SystemExit("oracle: FAIL: Tessera's loss is not finite")
    return params, grads, inputs, float(man["loss"])


def rel_err(a, b, floor=0.0):
    """max|a - b| / max(max|b|, floor) (0 when both are all zeros)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = max(np.max(np.abs(b)) if b.size else 0.0, floor)
    num = np.max(np.abs(a - b)) if a.size else 0.0
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return float(num / den)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exporter", required=True)
    ap.add_argument("--mdl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", required=True, choices=["gpt", "llama", "ir"])
    ap.add_argument("--tol", type=float, default=1e-9)
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()

    cmd = [args.exporter, args.mdl, args.out]
    for d in args.defines:
        cmd += ["-D", d]
    print("oracle: running", " ".join(cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        sys.exit("oracle: FAIL: ts_export exited with %d" % r.returncode)

    params_np, grads, inputs, loss = load_export(args.out)
    torch.manual_seed(0)
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params_np.items()}
    feeds = {k: torch.from_numpy(v.copy()) for k, v in inputs.items()}

    if args.check == "ir":
        with open(os.path.join(args.out, "forward.ir")) as f:
            mod = ir_torch.parse_module(f.read())
        outs = ir_torch.run_forward(mod, params, feeds)
        if "loss" not in outs:
            sys.exit("oracle: FAIL: the forward IR has no output \"loss\"")
        ref_loss = outs["loss"]
        used = set(mod.param_names())
    else:
        model = models.MODELS[args.check]
        ref_loss, used = model(params, feeds)

    unused = set(params) - used
    if unused:
        sys.exit("oracle: FAIL: parameters exported by Tessera that the reference never reads: %s"
                 % sorted(unused))
    ref_loss.backward()

    failures = []
    e = abs(loss - ref_loss.item()) / max(abs(ref_loss.item()), 1e-300)
    print("  %-44s %12.5g  (tessera %.17g, torch %.17g)" % ("loss", e, loss, ref_loss.item()))
    if not e <= args.tol:
        failures.append("loss")
    refs = {n: (p.grad.numpy() if p.grad is not None else np.zeros(p.shape)) for n, p in params.items()}
    floor = 1e-6 * max((float(np.max(np.abs(r))) for r in refs.values() if r.size), default=0.0)
    for name in sorted(params):
        ref = refs[name]
        if name not in grads:
            failures.append(name + " (no gradient exported)")
            continue
        e = rel_err(grads[name], ref, floor)
        print("  %-44s %12.5g  max|g| %.4g" % ("grad " + name, e, float(np.max(np.abs(ref))) if ref.size else 0.0))
        if not e <= args.tol:
            failures.append(name)
    if failures:
        sys.exit("oracle: FAIL (%s): relative error above %g for: %s" % (args.check, args.tol, ", ".join(failures)))
    print("oracle: OK (%s): loss and %d parameter gradients match PyTorch within %g"
          % (args.check, len(params), args.tol))


if __name__ == "__main__":
    main()
