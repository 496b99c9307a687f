"""torch_step.py - the PyTorch side of bench/step_time.sh: times full
training steps (forward, backward, grad-norm clip, AdamW update) of the
hand-written GPT-2 in tests/oracle/models.py, in f32 on the CPU, with the
same sizes, optimizer settings and thread count as the Tessera run it is
compared with.  Prints one JSON object on stdout:
  {"step_s": [...timed steps...], "params": N, "peak_rss_kib": K, "torch": "1.13..."}

Run it with Debian's /usr/bin/python3 (the only interpreter that has torch):
  /usr/bin/python3 bench/torch_step.py --batch 4 --seq 64 --steps 3 --warmup 1

Parameters are created under the names stdlib/nn.mdl gives them (the shapes
models.py reads them with), so the model is the same architecture as
samples/gpt.mdl: learned positions, pre-LN, GELU (tanh), head tied to the
token embedding.  Tokens are uniform random ids; the step time does not
depend on their values. """
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle"))
import models  # noqa: E402  (tests/oracle/models.py: the reference GPT-2)


def gpt_params(vocab, seq, embed, heads, layers, ffn, gen):
    """-> dict name -> f32 leaf tensor (requires_grad), named and shaped as
    stdlib/nn.mdl makes them.  Weights normal(0, 0.02), output projections
    scaled by 1/sqrt(2*layers) as in GPT-2, biases zero, LN gains one."""
    D = embed // heads
    std, out_std = 0.02, 0.02 / (2 * layers) ** 0.5

    def normal(shape, s):
        return torch.randn(*shape, generator=gen) * s

    p = {"token_embedding.wte": normal((vocab, embed), std),
         "position_embedding.wpe": normal((seq, embed), std),
         "layernorm.g": torch.ones(embed), "layernorm.b": torch.zeros(embed)}
    for i in range(layers):
        L = "layers.%d." % i
        for ln in ("layernorm", "layernorm_1"):
            p[L + ln + ".g"], p[L + ln + ".b"] = torch.ones(embed), torch.zeros(embed)
        A = L + "attention."
        for w in ("wq", "wk", "wv"):
            p[A + w] = normal((embed, heads, D), std)
        for b in ("bq", "bk", "bv"):
            p[A + b] = torch.zeros(heads, D)
        p[A + "wo"] = normal((heads, D, embed), out_std)
        p[A + "bo"] = torch.zeros(embed)
        M = L + "mlp."
        p[M + "w_in"], p[M + "b_in"] = normal((embed, ffn), std), torch.zeros(ffn)
        p[M + "w_out"], p[M + "b_out"] = normal((ffn, embed), out_std), torch.zeros(embed)
    return {k: v.float().requires_grad_(True) for k, v in p.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=0, help="default 4 * d_model")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (tools/gpu_check.sh)")
    ap.add_argument("--compile", action="store_true", help="the forward and backward through torch.compile")
    ap.add_argument("--bf16", action="store_true", help="autocast to bf16 (f32 parameters and optimizer)")
    ap.add_argument("--tf32", action="store_true", help="cuda: TF32 in the GEMMs (allow_tf32; f32 otherwise)")
    a = ap.parse_args()
    if a.d_model % a.heads:
        sys.exit("torch_step.py: d_model %d is not a multiple of heads %d" % (a.d_model, a.heads))
    if a.steps < 1:
        sys.exit("torch_step.py: --steps must be at least 1")
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(1234)
    params = gpt_params(a.vocab, a.seq, a.d_model, a.heads, a.layers, a.ffn or 4 * a.d_model, gen)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        # f32 means f32 on the GPU too: no TF32 in GEMMs or convolutions unless --tf32
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        params = {k: v.detach().to(dev).requires_grad_(True) for k, v in params.items()}
    # samples/gpt.mdl's train block: AdamW(1e-3, (0.9, 0.95), 1e-8, wd 0.1), clip 1.0.
    opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    feeds = {"tokens": torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen, dtype=torch.int32),
             "targets": torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen, dtype=torch.int32)}
    feeds = {k: v.to(dev) for k, v in feeds.items()}

    def forward(params, feeds):
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            return models.gpt(params, feeds)[0]
    fwd = torch.compile(forward) if a.compile else forward

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = fwd(params, feeds)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if s >= a.warmup:
            times.append(dt)
    if not all(x == x and abs(x) != float("inf") for x in losses):
        sys.exit("torch_step.py: non-finite loss %s" % losses)
    json.dump({"step_s": times, "losses": losses,
               "params": sum(p.numel() for p in params.values()),
               "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               "threads": torch.get_num_threads(), "torch": torch.__version__, "device": a.device,
               "compile": a.compile, "bf16": a.bf16,
               "peak_gpu_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else 0}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
