#!/usr/bin/env python3
"""hf_generate.py MCC MRUN SRC: greedy generation (mrun --generate
--init-from, issue 21 D7) against transformers' generate() (do_sample=False).

Run by the .venv python tools/setup.sh makes (transformers pinned in
tools/requirements-hf.txt, Debian's torch), like hf_test.py.  A small GPT-2
and a small Llama (grouped-query heads, rope, RMSNorm, SwiGLU) are made by
transformers from local configs (random init plus noise on every tensor;
nothing is downloaded) and saved with save_pretrained; Tessera imports them
(--init-from) and generates 20 tokens after a 12-byte prompt (one token per
byte): the ids equal transformers' generate() token by token, f32 and f64,
on one rank and under tp 2.  Exit 0 iff every check passes."""
import os
import re
import subprocess
import sys

import torch
import transformers

MCC, MRUN, SRC = sys.argv[1:4]
T = 32              # seq_len: the prompt and the new tokens fill it
NEW = 20
PROMPT = "Hello, world"   # 12 bytes = 12 tokens
VOCAB = 256
fails = 0

import hf_f64  # noqa: F401,E402  (transformers' Llama in f64 for f64 models)


def check(ok, what):
    global fails
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        fails += 1


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit("command failed: " + " ".join(cmd))
    return p.stdout


def make(arch, dtype, name):
    torch.manual_seed(4321)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(dtype).eval()
    with torch.no_grad():   # away from the initializers: every tensor matters, logits spread out
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(name, safe_serialization=True)
    return model


def plan(arch, prec, name, *extra):
    mdl = os.path.join(SRC, "samples", "gpt.mdl" if arch == "gpt2" else "llama.mdl")
    d = ["-D", "vocab=%d" % VOCAB, "-D", "seq_len=%d" % T, "-D", "d_model=32", "-D", "heads=4", "-D", "layers=2",
         "-D", "batch=2", "-D", "micro_batch=1"]
    if arch == "llama":
        d += ["-D", "kv_heads=2", "-D", "ffn=64"]
    run([MCC, mdl] + d + ["--precision", prec, "--decode"] + list(extra) + ["-o", name])
    return name


ids = torch.tensor([list(PROMPT.encode())])
for arch in ("gpt2", "llama"):
    for prec, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        d = "%s_%s" % (arch, prec)
        model = make(arch, dtype, d)
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                 attention_mask=torch.ones_like(ids))[0, ids.shape[1]:].tolist()
        for tp in (1, 2):
            p = plan(arch, prec, "%s_tp%d.plan" % (d, tp), "--tp", str(tp))
            cmd = [MRUN, p, "--generate", "--init-from", d, "--prompt", PROMPT, "--max-tokens", str(NEW), "--print-ids"]
            if tp > 1:
                cmd += ["--gpus", str(tp)]
            out = run(cmd)
            m = re.search(r"^ids:(.*)$", out, re.M)
            got = [int(x) for x in m.group(1).split()] if m else []
            check(got == ref, "%s %s tp %d: 20 greedy tokens equal transformers' generate(): %s%s"
                  % (arch, prec, tp, " ".join(map(str, got)), "" if got == ref else " vs " + " ".join(map(str, ref))))
        check(len(set(ref)) > 3, "%s %s: the reference is not one token repeated (%d distinct)" % (arch, prec, len(set(ref))))

print("hf_generate: %d check(s) failed" % fails if fails else "hf_generate: all checks passed")
sys.exit(1 if fails else 0)
