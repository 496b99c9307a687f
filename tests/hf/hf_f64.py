"""hf_f64.py - imported for its effect: transformers 4.40's Llama in f64 as
the precision asks (hf_test.py, hf_generate.py).

"""
import torch
import transformers

# transformers 4.40's Llama computes four things in f32 whatever the
# model's dtype: the rotary angles, RMSNorm's mean square, and the attention
# softmax (softmax(..., dtype=float32)), and the logits (hf_loss applies the
# head itself); at f64 that moves the loss by 5e-9.
# For an f64 model the oracle computes them in f64, as its precision asks
# (f32 models run transformers' own code unchanged).
_llama = transformers.models.llama.modeling_llama
_rope, _rms, _softmax = _llama.LlamaRotaryEmbedding.forward, _llama.LlamaRMSNorm.forward, torch.nn.functional.softmax


def _rope_f64(self, x, position_ids):
    if x.dtype != torch.float64:
        return _rope(self, x, position_ids)
    inv = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
    freqs = position_ids[:, :, None].double() * inv[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rms_f64(self, h):
    if h.dtype != torch.float64:
        return _rms(self, h)
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _softmax_f64(x, *args, dtype=None, **kw):
    if x.dtype == torch.float64 and dtype == torch.float32:
        dtype = torch.float64
    return _softmax(x, *args, dtype=dtype, **kw)


_llama.LlamaRotaryEmbedding.forward = _rope_f64
_llama.LlamaRMSNorm.forward = _rms_f64
torch.nn.functional.softmax = _softmax_f64
