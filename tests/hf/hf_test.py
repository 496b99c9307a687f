#!/usr/bin/env python3
"""hf_test.py MCC MRUN SRC: Hugging Face weights in and out (mrun
--init-from, --export DIR --format hf) against transformers itself.

Run by the .venv python tools/setup.sh makes (transformers pinned in
tools/requirements-hf.txt, Debian's torch).  Small GPT-2 and Llama models
are made by transformers from local configs (random init plus noise on
every tensor, so no bias or gain is at its trivial value; nothing is
downloaded) and saved with save_pretrained.  Then:

1. import: Tessera's step-1 loss (the forward at the imported weights) on
   the same tokens equals the HF model's: f32 within 1e-5, f64 within
   1e-10; GPT2Model's files (no "transformer." prefix, no head); bf16 weights into an f32 model; also under tp 2 (Llama, grouped-query heads split) and pp 2
   (GPT-2, the tied embedding on both ends), and into a model whose
   vocabulary is padded (the extra rows load as zero: HF's loss with zero
   logits appended is the reference);
2. export: a run that trains 2 steps (GPT-2 on 1 rank and under pp 2,
   Llama under tp 2) and exports;
   transformers loads the export and its loss equals Tessera's loss on the
   exported weights (a run that imports them) within 1e-10 (f64); the
   export's tensors equal --save-params of the same run, read here;
3. refusals: a config.json that disagrees with the model (heads), a model
   with more layers than the plan, the wrong architecture's weights.
Exit 0 iff every check passes; each check prints a line."""
import json
import os
import struct
import subprocess
import sys

import torch
import transformers

MCC, MRUN, SRC = sys.argv[1:4]


import hf_f64  # noqa: F401,E402  (transformers' Llama in f64 for f64 models: see hf_f64.py)
T = 16          # seq_len
VOCAB = 256     # byte tokens
fails = 0


def check(ok, what):
    global fails
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        fails += 1


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit("command failed: " + " ".join(cmd))
    return p


DATA = bytes((i * 37 + 11) % 256 for i in range(T + 2))   # T + 2 bytes: every window is at offset 0
with open("corpus.txt", "wb") as f:
    f.write(DATA)
X = torch.tensor([list(DATA[:T])])
Y = torch.tensor([list(DATA[1:T + 1])])


def hf_loss(model, pad_to=None):
    with torch.no_grad():
        # the head applied here: LlamaForCausalLM.forward casts the logits to f32
        logits = model.get_output_embeddings()(model.base_model(X)[0]).double()[0]
    if pad_to:   # a padded vocabulary's zero rows give zero logits
        logits = torch.cat([logits, torch.zeros(T, pad_to - logits.shape[1], dtype=logits.dtype)], 1)
    return torch.nn.functional.cross_entropy(logits, Y[0]).item()


def make(arch, dtype, name, **over):
    torch.manual_seed(1234)
    if arch == "gpt2":
        cfg = dict(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        cfg.update(over)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg))
    else:
        cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
        cfg.update(over)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    model = model.to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(name, safe_serialization=True)
    return model


def plan(arch, prec, name, *extra, vocab=VOCAB):
    mdl = os.path.join(SRC, "samples", "gpt.mdl" if arch == "gpt2" else "llama.mdl")
    d = ["-D", "vocab=%d" % vocab, "-D", "seq_len=%d" % T, "-D", "d_model=32", "-D", "heads=4", "-D", "layers=2",
         "-D", "batch=2", "-D", "micro_batch=1"]
    if arch == "llama":
        d += ["-D", "kv_heads=2", "-D", "ffn=64"]
    run([MCC, mdl] + d + ["--precision", prec] + list(extra) + ["-o", name])
    return name


def ts_loss(planfile, init, *extra, gpus=1, steps=1):
    met = "m_%d.jsonl" % os.getpid()
    cmd = [MRUN, planfile, "--steps", str(steps), "--data", "corpus.txt", "--metrics", met, "--quiet"]
    if init:
        cmd += ["--init-from", init]
    if gpus > 1:
        cmd += ["--gpus", str(gpus)]
    run(cmd + list(extra))
    with open(met) as f:
        rows = [json.loads(line) for line in f]
    os.remove(met)
    return rows[0]["loss"]


def read_params(path):
    """The TSPARAMS file of mrun --save-params (runtime/exec/train.h)."""
    with open(path, "rb") as f:
        b = f.read()
    assert b[:8] == b"TSPARAMS"
    n = struct.unpack_from("<I", b, 12)[0]
    pos, out = 16, {}
    for _ in range(n):
        (nl,) = struct.unpack_from("<I", b, pos); pos += 4
        name = b[pos:pos + nl].decode(); pos += nl
        dt, rk = struct.unpack_from("<II", b, pos); pos += 8
        dims = struct.unpack_from("<%dq" % rk, b, pos); pos += 8 * rk
        es, fmt = (4, "f") if dt == 1 else (8, "d")
        cnt = 1
        for x in dims:
            cnt *= x
        out[name] = torch.tensor(struct.unpack_from("<%d%s" % (cnt, fmt), b, pos), dtype=torch.float64).reshape(dims)
        pos += es * cnt
    return out


# ---- 1. import: the loss at the imported weights ----
for arch in ("gpt2", "llama"):
    for prec, dtype, tol in (("f32", torch.float32, 1e-5), ("f64", torch.float64, 1e-10)):
        d = "%s_%s" % (arch, prec)
        ref = hf_loss(make(arch, dtype, d))
        got = ts_loss(plan(arch, prec, d + ".plan"), d)
        check(abs(got - ref) <= tol, "%s %s import: Tessera loss %.12f, transformers %.12f, |diff| %.2e <= %g"
              % (arch, prec, got, ref, abs(got - ref), tol))

# bf16 weights (as most published models are) into an f32 model: transformers
# upcasts them exactly on loading, Tessera on reading
make("llama", torch.bfloat16, "llama_bf16")
ref = hf_loss(transformers.LlamaForCausalLM.from_pretrained("llama_bf16", torch_dtype=torch.float32).eval())
got = ts_loss("llama_f32.plan", "llama_bf16")
check(abs(got - ref) <= 1e-5, "llama bf16 weights into f32: |diff| %.2e <= 1e-05" % abs(got - ref))

ref = hf_loss(transformers.LlamaForCausalLM.from_pretrained("llama_f64", torch_dtype=torch.float64).eval())
got = ts_loss(plan("llama", "f64", "llama_tp2.plan", "--tp", "2"), "llama_f64", gpus=2)
check(abs(got - ref) <= 1e-10, "llama f64 import under tp 2: |diff| %.2e" % abs(got - ref))
ref = hf_loss(transformers.GPT2LMHeadModel.from_pretrained("gpt2_f64", torch_dtype=torch.float64).eval())
got = ts_loss(plan("gpt2", "f64", "gpt2_pp2.plan", "--pp", "2"), "gpt2_f64", gpus=2)
check(abs(got - ref) <= 1e-10, "gpt2 f64 import under pp 2: |diff| %.2e" % abs(got - ref))
ref = hf_loss(transformers.GPT2LMHeadModel.from_pretrained("gpt2_f64", torch_dtype=torch.float64).eval(), pad_to=320)
got = ts_loss(plan("gpt2", "f64", "gpt2_pad.plan", "--tp", "2", vocab=320), "gpt2_f64", gpus=2)
check(abs(got - ref) <= 1e-10, "gpt2 f64 import into a vocabulary padded to 320, tp 2: |diff| %.2e" % abs(got - ref))

# GPT2Model's own files (the hub's gpt2 is one): names without "transformer.",
# no head (the map's strip_prefix and tied lines)
base = transformers.GPT2LMHeadModel.from_pretrained("gpt2_f64", torch_dtype=torch.float64).eval()
base.transformer.save_pretrained("gpt2_base", safe_serialization=True)
got = ts_loss("gpt2_f64.plan", "gpt2_base")
check(abs(got - hf_loss(base)) <= 1e-10, "gpt2 f64 import of GPT2Model's files (h.0..., no head): |diff| %.2e"
      % abs(got - hf_loss(base)))

# ---- 2. export: transformers loads it and gives Tessera's loss ----
for arch, cls, extra, gpus in (("gpt2", transformers.GPT2LMHeadModel, [], 1),
                               ("gpt2", transformers.GPT2LMHeadModel, ["--pp", "2"], 2),
                               ("llama", transformers.LlamaForCausalLM, ["--tp", "2"], 2)):
    p = plan(arch, "f64", arch + "_x.plan", *extra)
    ts_loss(p, arch + "_f64", "--export", arch + "_out", "--format", "hf", "--save-params", arch + "_out.bin",
            gpus=gpus, steps=2)
    model = cls.from_pretrained(arch + "_out", torch_dtype=torch.float64).eval()
    ref = hf_loss(model)
    got = ts_loss(plan(arch, "f64", arch + "_1.plan"), arch + "_out")
    before = hf_loss(cls.from_pretrained(arch + "_f64", torch_dtype=torch.float64).eval())
    check(abs(got - ref) <= 1e-10 and abs(before - ref) > 1e-6,
          "%s export after 2 steps %s: transformers' loss %.12f, Tessera's %.12f (|diff| %.2e); before training %.6f"
          % (arch, " ".join(extra) or "on 1 rank", ref, got, abs(got - ref), before))
    ps = read_params(arch + "_out.bin")
    sd = model.state_dict()
    if arch == "gpt2":
        wq = ps["layers.1.attention.wq"].reshape(32, 32)
        same = torch.equal(sd["transformer.wte.weight"], ps["token_embedding.wte"]) and \
            torch.equal(sd["transformer.h.1.attn.c_attn.weight"][:, :32], wq) and \
            torch.equal(sd["lm_head.weight"], ps["token_embedding.wte"])
    else:
        same = torch.equal(sd["model.layers.1.self_attn.k_proj.weight"], ps["layers.1.attention.wk"].reshape(32, 16).t()) and \
            torch.equal(sd["model.layers.0.self_attn.o_proj.weight"], ps["layers.0.attention.wo"].reshape(32, 32).t()) and \
            torch.equal(sd["lm_head.weight"], ps["lm_head.w_out"])
    check(same, "%s export: its tensors equal the run's --save-params (embedding, a fused or transposed projection, "
          "the head)" % arch)

# ---- 3. refusals ----
make("gpt2", torch.float64, "gpt2_h2", n_head=2)          # same shapes, other heads
p = run([MRUN, "gpt2_f64.plan", "--steps", "1", "--data", "corpus.txt", "--quiet", "--init-from", "gpt2_h2"], False)
check(p.returncode != 0 and "n_head is 2, but this model needs 4" in p.stdout, "refused: heads differ (" + p.stdout.strip().splitlines()[-1] + ")")
make("gpt2", torch.float64, "gpt2_l3", n_layer=3)
p = run([MRUN, "gpt2_f64.plan", "--steps", "1", "--data", "corpus.txt", "--quiet", "--init-from", "gpt2_l3"], False)
check(p.returncode != 0 and "n_layer is 3, but this model needs 2" in p.stdout, "refused: more layers (" + p.stdout.strip().splitlines()[-1] + ")")
p = run([MRUN, "gpt2_f64.plan", "--steps", "1", "--data", "corpus.txt", "--quiet", "--init-from", "llama_f64"], False)
check(p.returncode != 0 and "the model has no rmsnorm op" in p.stdout, "refused: Llama weights into GPT-2 (" + p.stdout.strip().splitlines()[-1] + ")")
os.remove("gpt2_l3/config.json")
p = run([MRUN, "gpt2_f64.plan", "--steps", "1", "--data", "corpus.txt", "--quiet", "--init-from",
         "gpt2_l3/model.safetensors", "--hf-map", "gpt2"], False)
check(p.returncode != 0 and "'transformer.h.2." in p.stdout and "no parameter for" in p.stdout,
      "refused without config.json: a tensor the model lacks (" + p.stdout.strip().splitlines()[-1] + ")")

print("hf_test: %d check(s) failed" % fails if fails else "hf_test: all checks passed")
sys.exit(1 if fails else 0)
