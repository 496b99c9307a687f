"""models.py - hand-written PyTorch versions of samples/gpt.mdl and
samples/llama.mdl, written from the published architectures (not from the
IR), so that comparing them with Tessera checks the frontend's lowering as
well as the kernels and autodiff.

Each model takes the exported parameters (name -> float64 tensor, names as
stdlib/nn.mdl makes them) and the inputs ("tokens", "targets": [batch, seq]
ints, -1 = ignore), and returns (mean cross-entropy over the targets that
are not -1, the set of parameter names it read).  Sizes come from the
parameter shapes, so any -D overrides work:
  layers.N.attention.wq [embed, heads, head_dim]    wk/wv [embed, kv_heads, head_dim]
  layers.N.attention.wo [heads, head_dim, embed]    bq [heads, head_dim], bo [embed]
"""
import math

import torch
import torch.nn.functional as F

EPS = 1e-5  # nn.layernorm / nn.rmsnorm default


class Params:
    """The parameter dict, recording which names were read."""

    def __init__(self, params):
        self.p, self.used = params, set()

    def __getitem__(self, name):
        if name not in self.p:
            raise SystemExit("oracle: FAIL: the reference model needs parameter %r, which Tessera "
                             "did not export (exported: %s)" % (name, sorted(self.p)))
        self.used.add(name)
        return self.p[name]

    def __contains__(self, name):
        return name in self.p

    def n_layers(self):
        n = 0
        while ("layers.%d.attention.wq" % n) in self.p:
            n += 1
        return n


def layernorm(P, pre, x):
    """x: [..., E] -> [..., E]; LayerNorm with gain pre.g and bias pre.b."""
    return F.layer_norm(x, (x.shape[-1],), P[pre + ".g"], P[pre + ".b"], eps=EPS)


def rmsnorm(P, pre, x):
    """x: [..., E] -> [..., E]; RMSNorm (Llama) with gain pre.g."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * P[pre + ".g"]


def rope(x, base=10000.0):
    """x: [B, T, H, D] -> same; rotary embedding, rotate-half pairing
    (dim i with dim i + D/2), position = index along T.  A 16-bit x (under
    autocast, autocast.py) is rotated in f32 and stored in its dtype again,
    as Megatron's fused rope and Tessera's `rope` do; f64 is untouched."""
    T, D = x.shape[1], x.shape[-1]
    dev = x.device
    inv_freq = base ** (-torch.arange(0, D // 2, dtype=torch.float64, device=dev) * 2.0 / D)   # [D/2]
    ang = torch.arange(T, dtype=torch.float64, device=dev)[:, None] * inv_freq[None, :]        # [T, D/2]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(ct)           # [1, T, 1, D]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(ct)
    xc = x.to(ct)
    x1, x2 = xc[..., : D // 2], xc[..., D // 2:]
    return (xc * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


def attention(P, pre, x, bias, use_rope):
    """x: [B, T, E] -> [B, T, E]; causal multi-head attention, grouped-query
    when wk has fewer heads than wq (query head h reads kv head h // group)."""
    B, T, E = x.shape
    wq, wk, wv, wo = (P[pre + "." + n] for n in ("wq", "wk", "wv", "wo"))
    H, D = wq.shape[1], wq.shape[2]
    KV = wk.shape[1]
    q = (x @ wq.reshape(E, H * D)).reshape(B, T, H, D)
    k = (x @ wk.reshape(E, KV * D)).reshape(B, T, KV, D)
    v = (x @ wv.reshape(E, KV * D)).reshape(B, T, KV, D)
    if bias:
        q, k, v = q + P[pre + ".bq"], k + P[pre + ".bk"], v + P[pre + ".bv"]
    if use_rope:
        q, k = rope(q), rope(k)
    if KV != H:
        k = k.repeat_interleave(H // KV, dim=2)    # [B, T, H, D], kv-head-major
        v = v.repeat_interleave(H // KV, dim=2)
    q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))     # [B, H, T, D]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    causal = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
    p = torch.softmax(s.masked_fill(causal, float("-inf")), -1)
    y = (p @ v).permute(0, 2, 1, 3).reshape(B, T, H * D)
    out = y @ wo.reshape(H * D, E)
    if bias:
        out = out + P[pre + ".bo"]
    return out


def mean_ce(logits, targets):
    """logits [B, T, V], targets [B, T] (-1 = ignore) -> scalar mean loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(),
                           ignore_index=-1, reduction="mean")


def gpt(params, feeds):
    """GPT-2: learned positions, pre-LN blocks, GELU (tanh) MLP with biases,
    final LN, head tied to the token embedding."""
    P = Params(params)
    tok, tgt = feeds["tokens"].long(), feeds["targets"]
    wte = P["token_embedding.wte"]
    x = F.embedding(tok, wte) + P["position_embedding.wpe"]
    for i in range(P.n_layers()):
        L = "layers.%d." % i
        x = x + attention(P, L + "attention", layernorm(P, L + "layernorm", x), bias=True, use_rope=False)
        h = layernorm(P, L + "layernorm_1", x)
        h = F.gelu(h @ P[L + "mlp.w_in"] + P[L + "mlp.b_in"], approximate="tanh")
        x = x + h @ P[L + "mlp.w_out"] + P[L + "mlp.b_out"]
    x = layernorm(P, "layernorm", x)
    return mean_ce(x @ wte.t(), tgt), P.used


def llama(params, feeds):
    """Llama: RMSNorm, RoPE (base 10000), grouped-query attention, SwiGLU,
    untied head, no biases."""
    P = Params(params)
    tok, tgt = feeds["tokens"].long(), feeds["targets"]
    x = F.embedding(tok, P["token_embedding.wte"])
    for i in range(P.n_layers()):
        L = "layers.%d." % i
        x = x + attention(P, L + "attention", rmsnorm(P, L + "rmsnorm", x), bias=False, use_rope=True)
        h = rmsnorm(P, L + "rmsnorm_1", x)
        x = x + (F.silu(h @ P[L + "swiglu.w_gate"]) * (h @ P[L + "swiglu.w_up"])) @ P[L + "swiglu.w_down"]
    x = rmsnorm(P, "rmsnorm", x)
    return mean_ce(x @ P["lm_head.w_out"].t(), tgt), P.used


MODELS = {"gpt": gpt, "llama": llama}
