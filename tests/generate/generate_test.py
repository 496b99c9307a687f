#!/usr/bin/env python3
"""generate_test.py MODE MCC MRUN SRC WORK: mrun --generate (issue 21 D7,
pass decode, docs/generation.md).  Modes:

full     greedy decoding equals, token by token, the argmax of a full
         forward (the prefill block, i.e. the training forward over the
         whole prefix) at every step (mrun --generate-check): gpt, llama
         and bloom (ALiBi: the KV-cache attention adds the slopes' bias),
         f32 and f64, tp 1 and tp 2 (from a tp 1 checkpoint), ZeRO-3 at
         dp 2 (parameters gathered from their shards), the
         plan compiled with mcc --decode or without (mrun derives the
         blocks); in f64 the tokens are the same on every layout.  The IR
         with the decode blocks prints and parses back (--verify-roundtrip).
sample   --temperature / --top-k / --top-p: the same seed gives the same
         text (also under tp 2), another seed another text; top-k 1 is
         greedy; every sampled id is in the vocabulary.
refuse   bad input gets a clear message and exit 1, never a crash: a prompt
         longer than seq_len, --max-tokens past the cache, no weights, a
         model with no language-model head, non-causal attention, options
         without --generate, an empty prompt.
Exit 0 iff every check passes."""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrun_util import ENV, fail, run  # noqa: E402

MODE, MCC, MRUN, SRC, WORK = sys.argv[1:6]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
os.chdir(WORK)
T = 32
PROMPT = "In the beginning God"


def plan(arch, prec, name, *extra):
    mdl = os.path.join(SRC, "samples", arch + ".mdl")
    d = ["-D", "vocab=256", "-D", "seq_len=%d" % T, "-D", "d_model=32", "-D", "heads=4", "-D", "layers=2",
         "-D", "batch=2", "-D", "micro_batch=1"]
    if arch == "llama":
        d += ["-D", "kv_heads=2", "-D", "ffn=64"]
    run([MCC, mdl] + d + ["--precision", prec] + list(extra) + ["-o", name])
    return name


def train(p, ck, steps=1000):
    """A few steps of training on the bundled corpus: weights that are not the initializers'."""
    run([MRUN, p, "--steps", str(steps), "--save", ck, "--quiet"])


def generate(p, *extra, gpus=1):
    """mrun --generate; its output read with undecodable bytes replaced (byte tokens need not be UTF-8)."""
    cmd = [MRUN, p, "--generate", "--print-ids"] + list(extra)
    if gpus > 1:
        cmd += ["--gpus", str(gpus)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=ENV)
    if r.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r


def ids_of(out):
    m = re.search(r"^ids:(.*)$", out, re.M)
    if not m:
        fail("no ids line in:\n" + out)
    return [int(x) for x in m.group(1).split()]


checks = 0


def check(ok, what):
    global checks
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        fail(what)
    checks += 1


if MODE == "full":
    for arch in ("gpt", "llama", "bloom"):   # bloom: ALiBi, attn_cached with the slopes
        for prec in ("f32", "f64"):
            p1 = plan(arch, prec, "%s_%s.plan" % (arch, prec), "--decode", "--verify-roundtrip")
            p2 = plan(arch, prec, "%s_%s_tp2.plan" % (arch, prec), "--tp", "2")   # mrun derives the blocks
            ck = "ck_%s_%s" % (arch, prec)
            train(p1, ck)
            got = {}
            for p, gpus in ((p1, 1), (p2, 2)):
                r = generate(p, "--generate-check", "--load", ck, "--prompt", PROMPT, "--max-tokens", "12", gpus=gpus)
                got[gpus] = ids_of(r.stdout)
                check("full-forward check: all 12 tokens equal" in r.stdout and "tokens/s" in r.stdout,
                      "%s %s tp %d: 12 greedy tokens equal the full forward's argmax (%s)"
                      % (arch, prec, gpus, " ".join(map(str, got[gpus]))))
            if prec == "f64":
                check(got[1] == got[2], "%s f64: tp 2 generates the tokens of tp 1" % arch)
                # ZeRO-3 at dp 2: prefill and step gather each parameter from its shard as the forward does
                # (a learned position table too: gathered whole, then the token's row)
                p3 = plan(arch, prec, "%s_%s_z3.plan" % (arch, prec), "--zero", "3", "--dp", "2", "--decode")
                r = generate(p3, "--generate-check", "--load", ck, "--prompt", PROMPT, "--max-tokens", "12", gpus=2)
                check("full-forward check: all 12 tokens equal" in r.stdout and ids_of(r.stdout) == got[1],
                      "%s f64 --zero 3 at dp 2: the tokens of one rank, and each equals the full forward's argmax"
                      % arch)
    # the IR text of a plan with the decode blocks: prefill, step, the cache states
    r = run([MCC, os.path.join(SRC, "samples", "llama.mdl"), "-D", "vocab=256", "-D", "seq_len=16", "-D", "d_model=32",
             "-D", "heads=4", "-D", "kv_heads=2", "-D", "layers=1", "-D", "ffn=64", "--decode", "--verify-roundtrip",
             "--emit=ir"])
    check(all(s in r.stdout for s in ("block prefill {", "block step {", "cache", "kv_write", "attn_cached", "rope_at",
                                      'input "pos"')),
          "mcc --decode --emit=ir: blocks prefill and step, cache states, kv_write / attn_cached / rope_at, input pos")
elif MODE == "sample":
    p1 = plan("gpt", "f64", "gpt.plan", "--decode")
    p2 = plan("gpt", "f64", "gpt_tp2.plan", "--tp", "2", "--decode")
    train(p1, "ck")
    base = ["--load", "ck", "--prompt", PROMPT, "--max-tokens", "12"]
    greedy = ids_of(generate(p1, *base).stdout)
    a = ids_of(generate(p1, *base, "--temperature", "1.5", "--seed", "7").stdout)
    b = ids_of(generate(p1, *base, "--temperature", "1.5", "--seed", "7").stdout)
    c = ids_of(generate(p1, *base, "--temperature", "1.5", "--seed", "8").stdout)
    d = ids_of(generate(p2, *base, "--temperature", "1.5", "--seed", "7", gpus=2).stdout)
    check(a == b and a == d, "temperature 1.5, seed 7: the same tokens twice and under tp 2 (%s)" % " ".join(map(str, a)))
    check(a != c, "seed 8 gives other tokens (%s)" % " ".join(map(str, c)))
    check(a != greedy, "sampling at temperature 1.5 differs from greedy")
    k1 = ids_of(generate(p1, *base, "--temperature", "1.0", "--top-k", "1", "--seed", "3").stdout)
    check(k1 == greedy, "--top-k 1 is greedy")
    tp = ids_of(generate(p1, *base, "--temperature", "1.0", "--top-p", "1e-9", "--seed", "3").stdout)
    check(tp == greedy, "--top-p 1e-9 keeps the most likely token alone: greedy")
    mix = ids_of(generate(p1, *base, "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "5").stdout)
    check(len(mix) == 12 and all(0 <= t < 256 for t in mix), "top-k 20 and top-p 0.9 together: 12 ids in the vocabulary")
elif MODE == "refuse":
    p1 = plan("gpt", "f32", "gpt.plan", "--decode")
    train(p1, "ck", steps=1)
    cases = [
        ([p1, "--generate", "--load", "ck", "--prompt", "x" * (T + 1), "--max-tokens", "1"],
         "the prompt is 33 tokens, longer than the model's window (seq_len 32"),
        ([p1, "--generate", "--load", "ck", "--prompt", "abc", "--max-tokens", "30"],
         "3 prompt tokens + --max-tokens 30 is past the model's window (seq_len 32, the KV cache's size): at most 29"),
        ([p1, "--generate", "--prompt", "abc", "--max-tokens", "3"], "--generate needs trained weights"),
        ([p1, "--generate", "--load", "ck", "--max-tokens", "3"], "--generate needs the prompt"),
        ([p1, "--generate", "--load", "ck", "--prompt", "abc"], "--generate needs --max-tokens"),
        ([p1, "--generate", "--load", "ck", "--prompt", "", "--max-tokens", "3"], "the prompt is empty"),
        ([p1, "--load", "ck", "--prompt", "abc", "--steps", "1"], "go with --generate"),
        ([p1, "--generate", "--load", "ck", "--prompt", "abc", "--max-tokens", "3", "--save", "x"],
         "--save does not go with it"),
        ([p1, "--generate", "--load", "no_such_dir", "--prompt", "abc", "--max-tokens", "3"], "no_such_dir"),
        ([p1, "--generate", "--load", "ck", "--prompt-file", "missing.txt", "--max-tokens", "3"],
         "cannot read 'missing.txt'"),
        ([p1, "--generate", "--load", "ck", "--prompt", "abc", "--max-tokens", "3", "--top-p", "0"],
         "--top-p needs a probability in (0, 1]"),
        ([p1, "--generate", "--load", "ck", "--prompt", "abc", "--max-tokens", "3", "--temperature", "-1"],
         "--temperature needs a number >= 0"),
        ([p1, "--generate-check", "--load", "ck", "--prompt", "abc", "--max-tokens", "3", "--temperature", "1"],
         "not with --temperature > 0"),
    ]
    # a model that is not a language model: tests/ints/bert_mask.mdl (a masked-LM loss written with gather, no
    # "targets" and no cross entropy): refused by mcc --decode and by mrun --generate
    bert = os.path.join(SRC, "tests", "ints", "bert_mask.mdl")
    run([MCC, bert, "-o", "bert.plan"])
    cases.append((["bert.plan", "--generate", "--load", "ck", "--prompt", "ab", "--max-tokens", "1"],
                  "no cross_entropy of the input \"targets\""))
    r = run([MCC, bert, "--decode", "-o", "bert2.plan"], ok=False)
    check(r.returncode == 1 and "decode: no cross_entropy of the input \"targets\"" in r.stderr,
          "mcc --decode refuses a model without a language-model head (%s)" % r.stderr.strip().splitlines()[-1])
    for cmd, want in cases:
        r = run([MRUN] + cmd, ok=False)
        out = r.stdout + r.stderr
        check(r.returncode in (1, 2) and want in out and "Segmentation" not in out and "Abort" not in out,
              "refused (exit %d): %s" % (r.returncode, out.strip().splitlines()[-1] if out.strip() else "(nothing)"))
else:
    fail("unknown mode " + MODE)
print("generate_test %s: %d checks passed" % (MODE, checks))
