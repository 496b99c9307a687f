"""packed_test.py MODE MCC MRUN SRC WORK - Megatron's packed-sequence flags
in mrun (docs/data.md "Packed sequences", runtime/exec/packed.c).

Modes (one ctest each):
  feeds    samples/gpt_packed.mdl trained on an indexed dataset whose
           documents end with an EOD token: the position_ids, document_ids
           and loss_mask mrun feeds in the first step (TS_DUMP_FEEDS) equal
           what an independent Python rendering of Megatron's
           get_ltor_masks_and_position_ids makes from the fed tokens, for
           each flag alone, all three, and none (0..T-1, all 0, all 1);
           the same on the byte corpus (EOD = newline) and --mock-data; the
           EOD id from --tokenizer; the flags change the losses
  layouts  with all three flags, cp 2 (ring and all-to-all), dp 2, pp 2 and tp 2 + sp give the 1-rank
           losses and the 1-rank validation loss of the packed inputs (f64,
           1e-10; pp 2 through its eval.<g> blocks)
  refuse   a flag without an EOD id, a flag whose input the model does not
           declare (naming the flag and the input), a bad --eod-id, an
           --eod-id that contradicts --tokenizer, a tokenizer that does not
           parse; mcc refuses a trained model's input that mrun cannot feed"""
import os
import random
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gptdata"))
import gptdata_twin as tw  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrun_util import ENV, fail, run  # noqa: E402
MODE, MCC, MRUN, SRC, WORK = sys.argv[1:6]
VOCAB, EOD, T = 64, 63, 16
FLAGS = ["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"]


def ltor(tokens, eod, reset_pos, reset_attn, eod_mask):
    """Megatron's rules as its description goes (docs/data.md), in its
    subtractive form (packed.c scans forward instead): for each EOD at
    index i in order, the positions after it drop by i + 1 - (the previous
    EOD's i + 1), and the tokens after it may not see those up to i (a new
    document: the EOD belongs to the one it ends); loss_mask is 0 where
    the input token is the EOD.  One row."""
    n = len(tokens)
    pos = list(range(n))
    doc = [0] * n
    mask = [0.0 if eod_mask and x == eod else 1.0 for x in tokens]
    prev = 0
    for i in [k for k in range(n) if tokens[k] == eod]:
        for j in range(i + 1, n):
            if reset_pos:
                pos[j] -= i + 1 - prev
            if reset_attn:
                doc[j] += 1
        prev = i + 1
    return pos, doc, [int(m) for m in mask]


def make_dataset(prefix, seed=1, n=60):
    """Documents of 1..11 ids below EOD, each ended by EOD (mprep --append-eod's layout)."""
    r = random.Random(seed)
    docs = [[[r.randrange(EOD) for _ in range(r.randrange(1, 12))] + [EOD]] for _ in range(n)]
    tw.write_indexed(prefix, docs)


def compile_plan(name, *extra, model="gpt_packed.mdl"):
    path = os.path.join(WORK, name + ".plan")
    run([MCC, os.path.join(SRC, "samples", model), "-D", "layers=2", "-D", "d_model=32", "-D", "heads=4", "-D",
         "seq_len=%d" % T, "-D", "vocab=%d" % VOCAB, "-D", "batch=4", "-D", "micro_batch=2", "--precision", "f64",
         "-o", path] + list(extra))
    return path


def losses(out):
    return [float(x) for x in re.findall(r'"loss": ([^,]+),', open(out).read())]


def train(plan, tag, *args, gpus=1, ok=True, dump=None, steps=3):
    out = os.path.join(WORK, tag + ".jsonl")
    env = dict(ENV, TS_DUMP_FEEDS=dump) if dump else ENV
    p = run([MRUN, plan, "--steps", str(steps), "--metrics", out, "--gpus", str(gpus), "--quiet"] + list(args), ok,
            env)
    return (losses(out) if ok else None), p


def read_dump(path):
    return {l.split()[0]: [int(x) for x in l.split()[1:]] for l in open(path)}


def check_feeds(plan, tag, data, flags, eod, want_eods=4):
    d = os.path.join(WORK, "dump_" + tag)
    os.makedirs(d)
    train(plan, tag, *(data + flags), dump=d, steps=1)
    files = sorted(os.listdir(d))
    if files != ["feeds.0.0", "feeds.0.1"]:
        fail("%s: TS_DUMP_FEEDS wrote %s, expected the 2 micro batches of step 1" % (tag, files))
    eods = 0
    for fn in files:
        f = read_dump(os.path.join(d, fn))
        for name in ("tokens", "position_ids", "document_ids", "loss_mask"):
            if len(f.get(name, [])) != 2 * T:
                fail("%s/%s: %s has %d values, expected %d" % (tag, fn, name, len(f.get(name, [])), 2 * T))
        for r in range(2):
            tok = f["tokens"][r * T:(r + 1) * T]
            pos, doc, mask = ltor(tok, eod, *[x in flags for x in FLAGS])
            eods += sum(1 for x in tok[:-1] if x == eod)
            for name, want in (("position_ids", pos), ("document_ids", doc), ("loss_mask", mask)):
                got = f[name][r * T:(r + 1) * T]
                if got != want:
                    fail("%s: %s row %d: fed %s, Megatron's rules give %s (tokens %s, EOD %d)" %
                         (tag, fn, r, got, want, tok, eod))
    if eods < want_eods:
        fail("%s: only %d EOD tokens inside the rows: the check would prove little" % (tag, eods))
    print("ok: %s: position_ids, document_ids, loss_mask of 4 rows (%d EODs inside) equal Megatron's rules" %
          (tag, eods))


def mode_feeds():
    prefix = os.path.join(WORK, "ds")
    make_dataset(prefix)
    plan = compile_plan("p")
    data = ["--data-path", prefix, "--split", "1", "--data-cache-path", os.path.join(WORK, "c")]
    for i, flags in enumerate(([], [FLAGS[0]], [FLAGS[1]], [FLAGS[2]], FLAGS)):
        check_feeds(plan, "idx%d" % i, data + ["--eod-id", str(EOD)], flags, EOD)
    # every data source: the byte corpus (EOD = newline, 10) and mock ids
    corpus = os.path.join(SRC, "samples", "data", "kjv.txt")
    bplan = compile_plan("pb", "-D", "vocab=256")
    check_feeds(bplan, "bytes", ["--data", corpus, "--eod-id", "10"], FLAGS, 10, want_eods=0)
    check_feeds(compile_plan("pm", "-D", "vocab=12"), "mock", ["--mock-data", "--eod-id", "7"], FLAGS, 7)
    # the EOD id from the tokenizer (its <|endoftext|>)
    tok = os.path.join(SRC, "samples", "tokenizer", "tokenizer.json")
    vocab = {}
    import json
    tj = json.load(open(tok))
    for a in tj.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    teod = vocab.get("<|endoftext|>")
    if teod is None:
        fail("samples/tokenizer/tokenizer.json has no <|endoftext|>")
    tplan = compile_plan("pt", "-D", "vocab=%d" % (teod + 8))   # mock ids below it: the EOD now and then
    check_feeds(tplan, "tokenizer", ["--mock-data", "--tokenizer", tok], FLAGS, teod, want_eods=2)
    # the flags reach the model: its losses change with them
    a, _ = train(plan, "plain", *data, "--eod-id", str(EOD))
    b, _ = train(plan, "packed", *data, "--eod-id", str(EOD), *FLAGS)
    if a == b or len(a) != 3:
        fail("the losses with and without the flags are %s and %s" % (b, a))
    print("ok: the flags change the losses: %s without, %s with" % (["%.5f" % x for x in a], ["%.5f" % x for x in b]))


def close(a, b, tol=1e-10):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def val_losses(tag):
    return [float(x) for x in re.findall(r'"val_loss": ([^,}]+)', open(os.path.join(WORK, tag + ".jsonl")).read())]


def mode_layouts():
    """Training losses, and the validation losses of the packed inputs
    (--eval-interval: the eval block is fed position_ids / document_ids
    too; under pp every stage's eval.<g> that reads them), of every layout
    against 1 rank."""
    prefix = os.path.join(WORK, "ds")
    make_dataset(prefix, seed=2)
    args = ["--data-path", prefix, "--split", "3,1", "--data-cache-path", os.path.join(WORK, "c"), "--eod-id",
            str(EOD)] + FLAGS
    ev = ["--eval-interval", "2", "--eval-iters", "1"]
    ref, _ = train(compile_plan("p1"), "one", *(args + ev))
    vref = val_losses("one")
    if len(vref) != 1 or not all(x == x and 0 < x < 100 for x in vref):
        fail("1 rank: validation losses %s, expected one finite value (step 2 of 3)" % vref)
    for tag, extra in (("cp2", ["--cp", "2"]), ("cp2a2a", ["--cp", "2", "--cp-attn", "a2a"]), ("dp2", []),
                       ("pp2", ["--pp", "2"]), ("tp2sp", ["--tp", "2", "--sp"])):
        got, _ = train(compile_plan(tag, *extra), tag, *(args + ev), gpus=2)
        if not close(got, ref):
            fail("%s: losses %s, 1 rank %s" % (tag, got, ref))
        if not close(val_losses(tag), vref) or len(val_losses(tag)) != 1:
            fail("%s: validation losses %s, 1 rank %s" % (tag, val_losses(tag), vref))
        print("ok: %s gives the 1-rank losses %s and val_loss %.8f" % (tag, ["%.8f" % x for x in ref], vref[0]))


def mode_refuse():
    prefix = os.path.join(WORK, "ds")
    make_dataset(prefix, seed=3)
    data = ["--data-path", prefix, "--split", "1", "--data-cache-path", os.path.join(WORK, "c")]
    packed, plain = compile_plan("p"), compile_plan("g", model="gpt.mdl")
    bad_tok = os.path.join(WORK, "bad.json")
    open(bad_tok, "w").write("{ not json")
    tok = os.path.join(SRC, "samples", "tokenizer", "tokenizer.json")
    cases = [
        (packed, FLAGS[1:2], ["--reset-attention-mask needs the end-of-document token id", "--eod-id N"]),
        (packed, [FLAGS[2]], ["--eod-mask-loss needs the end-of-document token id"]),
        (plain, ["--eod-id", "3", FLAGS[1]],
         ["--reset-attention-mask needs the model input document_ids (nn.attention(docs: document_ids))"]),
        (plain, ["--eod-id", "3", FLAGS[0]],
         ["--reset-position-ids needs the model input position_ids (nn.position_embedding(x, positions: position_ids))"]),
        (plain, ["--eod-id", "3", FLAGS[2]], ["--eod-mask-loss needs the model input loss_mask"]),
        (packed, ["--eod-id", "-1"], ["--eod-id"]),
        (packed, ["--eod-id", "x"], ["--eod-id"]),
        (packed, ["--tokenizer", tok, "--eod-id", "5"], ["--eod-id 5 but tokenizer", "give one of them"]),
        (packed, ["--tokenizer", bad_tok], ["--tokenizer", "bad.json"]),
    ]
    for plan, extra, want in cases:
        for gpus in (1, 2) if plan == plain and extra[-1] == FLAGS[1] else (1,):
            _, p = train(plan, "x", *(data + extra), ok=False, gpus=gpus)
            if p.returncode == 0 or any(w not in p.stderr for w in want):
                fail("mrun %s (%d rank): exit %d, stderr %r; expected %s" % (" ".join(extra), gpus, p.returncode,
                                                                           p.stderr, want))
            print("ok: refused %s%s: %s" % (" ".join(extra).replace(WORK + "/", ""), " at 2 ranks" if gpus > 1 else "",
                                            p.stderr.strip().splitlines()[-1].replace(WORK + "/", "")))
    # mcc: a trained model's input that no data pipeline feeds
    src = os.path.join(WORK, "odd.mdl")
    open(src, "w").write(open(os.path.join(SRC, "samples", "gpt.mdl")).read().replace(
        "targets: i32[batch=micro_batch, seq=seq_len])", "targets: i32[batch=micro_batch, seq=seq_len], "
        "segment_ids: i32[batch=micro_batch, seq=seq_len])"))
    p = run([MCC, src, "-o", os.path.join(WORK, "odd.plan")], ok=False)
    want = ["model input 'segment_ids'", "tokens, targets, loss_mask, position_ids, document_ids"]
    if p.returncode == 0 or any(w not in p.stderr for w in want):
        fail("mcc with an input segment_ids: exit %d, %r" % (p.returncode, p.stderr))
    print("ok: mcc: " + p.stderr.strip().splitlines()[0].replace(WORK + "/", ""))


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
{"feeds": mode_feeds, "layouts": mode_layouts, "refuse": mode_refuse}[MODE]()
