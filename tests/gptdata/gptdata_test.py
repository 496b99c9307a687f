"""gptdata_test.py MODE TOOL MCC MRUN SRC WORK - issue 22's Megatron-style
data in mrun (runtime/data/gptdata.h, docs/data.md "Sample indices"),
checked against the independent Python twin (gptdata_twin.py).

Modes (one ctest each):
  twin     the document, sample and shuffle indices in the cache files, and
           the samples read through them, equal the twin's exactly: one
           epoch, several epochs with and without the last one separated,
           the valid part, empty sequences, documents of several sequences;
           the split ranges (ties included) equal the twin's
  blend    10,000 blended samples (weights 5:3:2) respect the weights within
           1% and the order and the samples equal the twin's; blending by
           size without weights too
  split    a split that leaves the needed part empty is refused with the
           numbers; malformed --split values are refused naming the flag
  cache    a second start loads the cache (the file's inode and mtime kept,
           same losses); a corrupted or truncated cache file is rebuilt;
           another seed or a rewritten dataset gets a file of its own
  layouts  mrun on a small indexed dataset at 1 rank, dp 2, tp 2 and in
           micro batches of 2 instead of 1 (f64) gives the same losses, with
           one dataset and with a blend; pp 2 and cp 2 with one dataset
  mock     --mock-data trains, reproducibly, and dp 2 equals 1 rank
  refuse   a token id at or above the vocabulary, a missing dataset, and
           the flags that do not go together are refused naming them"""
import os
import random
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptdata_twin as tw  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from mrun_util import ENV, fail, run  # noqa: E402
MODE, TOOL, MCC, MRUN, SRC, WORK = sys.argv[1:7]


def make_docs(seed, n, maxlen, seqs_per_doc=1, vocab=256, empty_every=0):
    r = random.Random(seed)
    docs = []
    for i in range(n):
        doc = []
        for _ in range(seqs_per_doc):
            L = 0 if empty_every and i % empty_every == 3 else r.randrange(1, maxlen)
            doc.append([r.randrange(vocab) for _ in range(L)])
        docs.append(doc)
    return docs


def seqs_of(docs):
    return [s for d in docs for s in d]


def caches(d, what):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".gptidx") and f.startswith(what))


def tool(split, part, T, N, seed, cache, K, *data, ok=True):
    p = run([TOOL, split, part, str(T), str(N), str(seed), cache, str(K)] + [str(x) for x in data], ok)
    if not ok:
        return p
    lines = p.stdout.splitlines()
    m = re.match(r"size (\d+) loaded (\d+) built (\d+)", lines[0])
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), [[int(x) for x in l.split()] for l in lines[1:]], p


def check_part(cache_file, seqs, split, part, T, need, seed, what):
    """The cache file's three indices against the twin; returns them."""
    desc, arrs, _ = tw.read_cache(cache_file)
    n = len(seqs)
    beg, end = tw.split_ranges(split, n)[["train", "valid", "test"].index(part)]
    m = re.search(r"sequences \[(\d+), (\d+)\)", desc)
    if (int(m.group(1)), int(m.group(2))) != (beg, end):
        fail("%s: C's part is %s, the twin's [%d, %d)" % (what, m.group(0), beg, end))
    lens = [len(s) for s in seqs]
    doc, sample, shuf, epochs = tw.indices(lens, beg, end, T, need, seed)
    for name, a, b in (("document", arrs[0], doc), ("sample", arrs[1], sample), ("shuffle", arrs[2], shuf)):
        if a != b:
            i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            fail("%s: the %s index differs from the twin's at %d (C %d entries, twin %d)" % (what, name, i, len(a), len(b)))
    return doc, sample, shuf, epochs


def mode_twin():
    configs = [  # (name, docs, split, part, T, N, seed, expect epochs, expect separate)
        ("one_epoch", make_docs(1, 200, 60, empty_every=17), "949,50,1", "train", 16, 50, 1234, 1),
        ("epochs_separate", make_docs(2, 40, 30), "1", "train", 8, None, 7, 3),
        ("epochs_together", make_docs(3, 40, 30), "1", "train", 8, None, 8, 3),
        ("valid_part", make_docs(4, 300, 40), "80,20,0", "valid", 7, 100, 99, None),
        ("multi_seq_docs", make_docs(5, 50, 20, seqs_per_doc=3), "90,5,5", "train", 12, 120, 3, None),
    ]
    for name, docs, split, part, T, N, seed, want_epochs in configs:
        d = os.path.join(WORK, name)
        os.makedirs(d)
        seqs = seqs_of(docs)
        tw.write_indexed(os.path.join(d, "ds"), docs)
        beg, end = tw.split_ranges(split, len(seqs))[["train", "valid", "test"].index(part)]
        tpe = sum(len(s) for s in seqs[beg:end])
        per_epoch = (tpe - 1) // T
        if name == "epochs_separate":
            N = 2 * per_epoch + 3          # the third epoch used for a few samples: shuffled on its own
        elif name == "epochs_together":
            N = 2 * per_epoch + per_epoch * 9 // 10
        size, loaded, built, samples, _ = tool(split, part, T, N, seed, os.path.join(d, "c"), 40, os.path.join(d, "ds"))
        doc, sample, shuf, epochs = check_part(caches(os.path.join(d, "c"), "ds.")[0], seqs, split, part, T, N, seed, name)
        if want_epochs and epochs != want_epochs:
            fail("%s: %d epochs, the configuration meant %d" % (name, epochs, want_epochs))
        sep = ""
        if name.startswith("epochs"):   # the separation happened (or not) as meant
            sans = ((epochs - 1) * tpe - 1) // T
            separated = sorted(shuf[:sans]) == list(range(sans))
            if separated != (name == "epochs_separate"):
                fail("%s: the last epoch %s shuffled on its own" % (name, "was" if separated else "was not"))
            sep = ", the last shuffled on its own" if separated else ", shuffled together"
        if size != len(shuf):
            fail("%s: size %d, the twin has %d samples" % (name, size, len(shuf)))
        for j, got in enumerate(samples):
            want = tw.sample_tokens(lambda s: seqs[s], doc, sample, shuf, T, j)
            if got != want:
                fail("%s: sample %d is %s, the twin's %s" % (name, j, got[:8], want[:8]))
        print("ok: %s: %d samples, %d epochs%s, equal to the twin" % (name, size, epochs, sep))
    # the split ranges, ties (x.5) included: the bounds in the descriptions
    docs = make_docs(6, 10, 30)
    for n, split in ((10, "1,1"), (2, "1,2,1"), (6, "1,1,1"), (10, "949,50,1"), (7, "3,3,1")):
        d = os.path.join(WORK, "split_%d_%s" % (n, split.replace(",", "_")))
        os.makedirs(d)
        tw.write_indexed(os.path.join(d, "ds"), docs[:n])
        for p, (beg, end) in zip(("train", "valid", "test"), tw.split_ranges(split, n)):
            r = tool(split, p, 2, 1, 1, os.path.join(d, "c"), 0, os.path.join(d, "ds"), ok=False)
            if end <= beg:
                if r.returncode == 0:
                    fail("split %s over %d: the %s part is empty in the twin, C accepted it" % (split, n, p))
                continue
            if r.returncode != 0:
                fail("split %s over %d, %s: %s" % (split, n, p, r.stderr))
            desc = tw.read_cache(caches(os.path.join(d, "c"), "ds.%s." % p)[0])[0]
            got = re.search(r"sequences \[(\d+), (\d+)\)", desc).groups()
            if (int(got[0]), int(got[1])) != (beg, end):
                fail("split %s over %d, %s: C [%s, %s), twin [%d, %d)" % (split, n, p, got[0], got[1], beg, end))
    print("ok: split ranges equal the twin's (ties to even)")


def mode_blend():
    d = WORK
    dsets = [make_docs(10 + i, 60 + 20 * i, 50) for i in range(3)]
    for i, docs in enumerate(dsets):
        tw.write_indexed(os.path.join(d, "d%d" % i), docs)
    N, T, seed = 10000, 8, 5
    weights = [5, 3, 2]
    args = []
    for i, w in enumerate(weights):
        args += [w, os.path.join(d, "d%d" % i)]
    size, _, _, samples, _ = tool("1", "train", T, N, seed, os.path.join(d, "c"), 200, *args)
    _, (ds, dss), _ = tw.read_cache(caches(os.path.join(d, "c"), "blend.")[0])
    tds, tdss = tw.blend(weights, N)
    if (ds, dss) != (tds, tdss):
        fail("the blend differs from the twin's")
    for i, w in enumerate(weights):
        share = ds.count(i) / N
        if abs(share - w / 10) > 0.01:
            fail("dataset %d: %.4f of the samples, weight %.2f" % (i, share, w / 10))
    print("ok: blend of %d samples equal to the twin's, shares %s for weights 0.5/0.3/0.2" %
          (N, "/".join("%.4f" % (ds.count(i) / N) for i in range(3))))
    idx = []
    for i, docs in enumerate(dsets):
        seqs = seqs_of(docs)
        need = ds.count(i)
        idx.append((seqs,) + check_part(caches(os.path.join(d, "c"), "d%d." % i)[0], seqs, "1", "train", T, need, seed,
                                        "dataset %d" % i)[:3])
    for k, got in enumerate(samples):
        seqs, doc, sample, shuf = idx[ds[k]]
        want = tw.sample_tokens(lambda s: seqs[s], doc, sample, shuf, T, dss[k])
        if got != want:
            fail("blended sample %d differs from the twin's" % k)
    print("ok: the first %d blended samples equal the twin's" % len(samples))
    # no weights: blended by the parts' samples per epoch
    tool("1", "train", T, 3000, seed, os.path.join(d, "c2"), 0, *[os.path.join(d, "d%d" % i) for i in range(3)])
    _, (ds2, _), _ = tw.read_cache(caches(os.path.join(d, "c2"), "blend.")[0])
    per = [(sum(len(s) for s in seqs_of(docs)) - 1) // T for docs in dsets]
    if ds2 != tw.blend(per, 3000)[0]:
        fail("the blend by size differs from the twin's")
    print("ok: blend by size (weights %s) equal to the twin's" % per)


def compile_plan(name, *extra):
    path = os.path.join(WORK, name + ".plan")
    run([MCC, os.path.join(SRC, "samples", "gpt.mdl"), "-D", "layers=2", "-D", "d_model=32", "-D", "heads=4", "-D",
         "seq_len=16", "-D", "vocab=256", "-D", "batch=4", "-D", "micro_batch=1", "--precision", "f64", "-o", path] +
        list(extra))
    return path


def losses(out):
    return [float(x) for x in re.findall(r'"loss": ([^,]+),', open(out).read())]


def train(plan, tag, *args, gpus=1, ok=True):
    out = os.path.join(WORK, tag + ".jsonl")
    p = run([MRUN, plan, "--steps", "4", "--metrics", out, "--gpus", str(gpus)] + list(args), ok)
    return (losses(out) if ok else None), p


def mode_split():
    d = WORK
    tw.write_indexed(os.path.join(d, "ds"), make_docs(20, 20, 40))
    plan = compile_plan("s")
    cases = [
        (["--split", "1,98,1"], ["--split 1,98,1 leaves the train part", "20 sequences", "train gets [0, 0)",
                                 "valid [0, 20)"]),
        (["--split", "0,1,0"], ["--split 0,1,0 leaves the train part", "train gets [0, 0)"]),
        (["--split", "1,2,3,4"], ["--split", "more than three"]),
        (["--split", "a,b"], ["--split", "'a,b'"]),
        (["--split", "0,0,0"], ["--split", "weight 0"]),
        (["--split", "-1,2"], ["--split", "'-1,2'"]),
    ]
    for extra, want in cases:
        _, p = train(plan, "x", "--data-path", os.path.join(d, "ds"), *extra, ok=False)
        if p.returncode == 0 or any(w not in p.stderr for w in want):
            fail("mrun %s: exit %d, stderr %r; expected %s" % (" ".join(extra), p.returncode, p.stderr, want))
        print("ok: refused %s: %s" % (" ".join(extra), p.stderr.strip().splitlines()[-1]))
    r = tool("100,0,0", "valid", 8, 10, 1, os.path.join(d, "c"), 0, os.path.join(d, "ds"), ok=False)
    if r.returncode == 0 or "leaves the valid part" not in r.stderr:
        fail("an empty valid part was not refused: %r" % r.stderr)
    print("ok: an empty valid part is refused when it is needed")
    r = tool("1", "train", 8, 10, 1, os.path.join(d, "c"), 0, os.path.join(d, "ds"))
    print("ok: the same dataset with --split 1 trains")


def stat_of(path):
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


def mode_cache():
    d = WORK
    tw.write_indexed(os.path.join(d, "ds"), make_docs(30, 100, 60))
    plan = compile_plan("c")
    cache = os.path.join(d, "cache")
    args = ["--data-path", os.path.join(d, "ds"), "--data-cache-path", cache]
    l1, p1 = train(plan, "a", *args)
    if "built and cached" not in p1.stdout:
        fail("the first start did not build the cache:\n" + p1.stdout)
    (f,) = caches(cache, "ds.")
    s1 = stat_of(f)
    l2, p2 = train(plan, "b", *args)
    if "loaded from the cache" not in p2.stdout or stat_of(f) != s1 or l2 != l1:
        fail("the second start did not reuse the cache (%s; file %s -> %s; losses %s %s)" %
             (p2.stdout.splitlines()[0], s1, stat_of(f), l1, l2))
    print("ok: second start loaded %s (inode and mtime kept), same losses" % os.path.basename(f))
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:   # one flipped bit in the shuffle index
        fh.seek(size - 40)
        b = fh.read(1)
        fh.seek(size - 40)
        fh.write(bytes([b[0] ^ 4]))
    l3, p3 = train(plan, "c", *args)
    if "damaged" not in p3.stdout or "checksum" not in p3.stdout or "built and cached" not in p3.stdout or l3 != l1:
        fail("a corrupted cache file was not rebuilt:\n" + p3.stdout)
    print("ok: a corrupted cache file is rebuilt: " + next(l for l in p3.stdout.splitlines() if "damaged" in l))
    with open(f, "r+b") as fh:
        fh.truncate(size - 8)
    l4, p4 = train(plan, "d", *args)
    if "damaged" not in p4.stdout or l4 != l1:
        fail("a truncated cache file was not rebuilt:\n" + p4.stdout)
    tw.read_cache(f)   # rebuilt whole (checksum and size checked by the twin)
    print("ok: a truncated cache file is rebuilt")
    _, p5 = train(plan, "e", "--seed", "77", *args)
    if len(caches(cache, "ds.")) != 2 or "built and cached" not in p5.stdout:
        fail("another seed did not get a cache file of its own")
    os.utime(os.path.join(d, "ds.idx"), ns=(1, 1))   # the dataset "changed"
    _, p6 = train(plan, "f", *args)
    if len(caches(cache, "ds.")) != 3 or "built and cached" not in p6.stdout:
        fail("a rewritten dataset reused the old cache file")
    print("ok: another seed and a rewritten dataset get cache files of their own")
    # default folder: beside the dataset
    _, p7 = train(plan, "g", "--data-path", os.path.join(d, "ds"))
    if not caches(os.path.join(d, "cache"), "ds.") or "cache" not in p7.stdout:
        fail("no cache beside the dataset by default")
    print("ok: without --data-cache-path the indices are cached in %s" % os.path.join(d, "cache"))


def close(a, b, tol=1e-10):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


def mode_layouts():
    d = WORK
    tw.write_indexed(os.path.join(d, "a"), make_docs(40, 80, 50))
    tw.write_indexed(os.path.join(d, "b"), make_docs(41, 50, 70, seqs_per_doc=2), dtype=4)
    p1, ptp = compile_plan("p1"), compile_plan("tp2", "--tp", "2")
    pmb2 = compile_plan("mb2", "-D", "micro_batch=2")   # the same 4 samples per step in 2 micro batches of 2
    for tag, data in (("one", ["--data-path", os.path.join(d, "a")]),
                      ("blend", ["--data-path", "0.7", os.path.join(d, "a"), "0.3", os.path.join(d, "b")])):
        base = data + ["--data-cache-path", os.path.join(d, "c"), "--quiet"]
        ref, _ = train(p1, tag + "_1", *base)
        dp2, _ = train(p1, tag + "_dp2", *base, gpus=2)
        tp2, _ = train(ptp, tag + "_tp2", *base, gpus=2)
        mb2, _ = train(pmb2, tag + "_mb2", *base)
        if not close(dp2, ref) or not close(tp2, ref) or not close(mb2, ref):
            fail("%s: losses 1 rank %s, dp 2 %s, tp 2 %s, micro batches of 2 %s" % (tag, ref, dp2, tp2, mb2))
        print("ok: %s: dp 2, tp 2 and micro batches of 2 give the 1-rank losses %s" % (tag, ["%.6f" % x for x in ref]))
        if tag == "one":   # a pipeline (only its first and last stage read data) and context parallelism
            pp2, _ = train(compile_plan("pp2", "--pp", "2"), tag + "_pp2", *base, gpus=2)
            cp2, _ = train(compile_plan("cp2", "--cp", "2"), tag + "_cp2", *base, gpus=2)
            if not close(pp2, ref) or not close(cp2, ref):
                fail("%s: losses 1 rank %s, pp 2 %s, cp 2 %s" % (tag, ref, pp2, cp2))
            print("ok: %s: pp 2 and cp 2 give the 1-rank losses too" % tag)
    # and the data matters: another seed's sample order gives other losses
    other, _ = train(p1, "seed", "--seed", "9", "--data-path", os.path.join(d, "a"), "--quiet")
    if close(other, ref):
        fail("another seed trained the same losses: is the data read at all?")


def mode_mock():
    p1 = compile_plan("m")
    a, _ = train(p1, "a", "--mock-data", "--quiet")
    b, _ = train(p1, "b", "--mock-data", "--quiet")
    c, _ = train(p1, "c", "--mock-data", "--quiet", gpus=2)
    if len(a) != 4 or a != b or not close(c, a):
        fail("--mock-data: losses %s, again %s, dp 2 %s" % (a, b, c))
    if not all(4.0 < x < 7.0 for x in a):   # ln 256 = 5.55: uniform random ids are unlearnable
        fail("--mock-data losses %s are not near ln(256)" % a)
    print("ok: --mock-data trains: losses %s, reproducible, dp 2 equal" % ["%.4f" % x for x in a])


def mode_refuse():
    d = WORK
    docs = make_docs(50, 30, 40)
    docs[7][0][5] = 300
    tw.write_indexed(os.path.join(d, "big"), docs)
    p1 = compile_plan("r")
    _, p = train(p1, "v", "--data-path", os.path.join(d, "big"), "--split", "1", "--steps", "40", ok=False)
    want = [os.path.join(d, "big"), "sequence 7", "token id 300", "position 5", "vocabulary of 256 ids", "embedding"]
    if p.returncode == 0 or any(w not in p.stderr for w in want):
        fail("id 300 with a vocabulary of 256: exit %d, %r" % (p.returncode, p.stderr))
    print("ok: " + p.stderr.strip().splitlines()[-1])
    cases = [
        (["--data-path", os.path.join(d, "nope")], ["--data-path", "nope"]),
        (["--data-path", "0.5", os.path.join(d, "big"), "0.5"], ["--data-path", "weight-prefix pairs"]),
        (["--data-path", "-1", os.path.join(d, "big")], ["--data-path", "not a weight"]),
        (["--data-path", os.path.join(d, "big"), "--data", "x.txt"], ["--data-path and --data"]),
        (["--data-path", os.path.join(d, "big"), "--mock-data"], ["--data-path and --mock-data"]),
        (["--split", "1,1,1"], ["--split goes with --data-path"]),
        (["--data-cache-path", d], ["--data-cache-path goes with --data-path"]),
        (["--data-path", os.path.join(d, "big"), "--data-cache-path", os.path.join(d, "big.idx")],
         ["--data-cache-path", "big.idx"]),
    ]
    for extra, want in cases:
        _, p = train(p1, "x", *extra, ok=False)
        if p.returncode == 0 or any(w not in p.stderr for w in want):
            fail("mrun %s: exit %d, stderr %r; expected %s" % (" ".join(extra), p.returncode, p.stderr, want))
        print("ok: refused %s: %s" % (" ".join(x.replace(d + "/", "") for x in extra),
                                      p.stderr.strip().splitlines()[-1].replace(d + "/", "")))
    p = run([MRUN, "--data-path", os.path.join(d, "big"), p1], ok=False)
    if p.returncode == 0 or "put PLAN before --data-path" not in p.stderr:
        fail("a plan after --data-path: %r" % p.stderr)
    print("ok: a plan after --data-path is explained")


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
{"twin": mode_twin, "blend": mode_blend, "split": mode_split, "cache": mode_cache, "layouts": mode_layouts,
 "mock": mode_mock, "refuse": mode_refuse}[MODE]()
