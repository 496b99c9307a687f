"""report_test.py - `mcc --report memory` and `mcc --report comm` against
figures computed here, independently of the shard and optimizer passes:

memory: from the UNSHARDED frontend IR (state lines with dim names) and
its `rule` lines, a parameter dim whose name maps to tp is split in tp
equal blocks (padded up when it does not divide: vocab), so each rank
holds numel/tp of it; gradients likewise; with ZeRO each dp rank holds
ceil(local numel / dp) of each Adam moment, without ZeRO the whole local
tensor.  The unsharded section holds the plain numel.

comm: from the compiled IR text (--emit=ir), every all_reduce /
all_gather / reduce_scatter over an axis of size n > 1, payload = the
operand's bytes (the result's for all_gather), ring bytes = 2(n-1)/n resp.
(n-1)/n of it, micro-block ones times global_batch / (micro_batch * dp).

usage: report_test.py MCC SRCDIR
"""
import math
import re
import subprocess
import sys

MCC, SRC = sys.argv[1], sys.argv[2]
GPT = ["-D", "layers=2", "-D", "d_model=32", "-D", "heads=4", "-D", "seq_len=16", "-D", "batch=4",
       "-D", "micro_batch=1"]
LLAMA = GPT + ["-D", "kv_heads=2", "-D", "ffn=64"]
DSIZE = {"f32": 4, "f64": 8, "i32": 4}
failures = 0


def fail(msg):
    global failures
    failures += 1
    print("FAIL: " + msg)


def mcc(args):
    r = subprocess.run([MCC] + args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("mcc %s failed: %s" % (" ".join(args), r.stderr))
    return r.stdout


def parse_type(t):
    """'f32[vocab:256, dim:32]' -> ('f32', [(name or None, size), ...])"""
    m = re.match(r"(\w+)\[(.*)\]", t)
    dims = []
    for d in filter(None, (x.strip() for x in m.group(2).split(","))):
        name, _, size = d.rpartition(":")
        dims.append((name or None, int(size)))
    return m.group(1), dims


def frontend_params(model, defs):
    """[(dtype, dims)] of the params and the dim -> axis rules, unsharded."""
    text = mcc(["%s/samples/%s.mdl" % (SRC, model)] + defs + ["--print-ir-after=frontend", "-o", "/dev/null"])
    params, rules = [], {}
    for line in text.splitlines():
        m = re.match(r"state @\S+ : (\S+\[[^\]]*\]) param", line)
        if m:
            params.append(parse_type(m.group(1)))
        m = re.match(r"rule (\S+) = (.*)", line)
        if m:
            rules[m.group(1)] = m.group(2).split()
    return params, rules


def rows(section):
    """label -> bytes for the rows of one report section"""
    out = {}
    for line in section:
        m = re.match(r"  (\S.*?)\s+(\d+)\s+[\d.]+$", line)
        if m:
            out[re.sub(r" \(.*\)$", "", m.group(1))] = int(m.group(2))
    return out


def check_memory(model, defs, tp, dp, zero, extra, cp=1):
    """cp: ranks replicating every parameter besides dp; ZeRO-1 shards the
    moments over dp x cp (the joint data-parallel group), also at dp 1"""
    before = failures
    params, rules = frontend_params(model, defs)
    tp_dims = {d for d, axes in rules.items() if "tp" in axes}
    par = adam = whole = loc = 0
    for dtype, dims in params:
        size = DSIZE[dtype]
        split = [i for i, (name, _) in enumerate(dims) if name in tp_dims] if tp > 1 else []
        if len(split) > 1:
            fail("%s: a parameter with two tp dims %s: the test cannot predict it" % (model, dims))
        local = 1
        for i, (_, n) in enumerate(dims):
            local *= math.ceil(n / tp) if i in split else n
        whole += math.prod(n for _, n in dims) * size
        loc += local * size
        par += (math.ceil(local / dp) if zero == 3 and dp > 1 else local) * size
        adam += 2 * (math.ceil(local / (dp * cp)) if zero and dp * cp > 1 else local) * size
    args = ["%s/samples/%s.mdl" % (SRC, model)] + defs + extra + ["--report", "memory"]
    text = mcc(args).splitlines()
    what = "%s %s" % (model, " ".join(extra))
    n = tp * dp * cp
    head = [i for i, l in enumerate(text) if re.match(r"ranks? ", l)]
    uns = [i for i, l in enumerate(text) if l.startswith("unsharded")]
    if len(head) != 1 or len(uns) != 1:
        return fail("%s: expected one rank group and one unsharded section:\n%s" % (what, "\n".join(text)))
    want_head = "ranks 0-%d (each):" % (n - 1)
    if text[head[0]] != want_head:
        fail("%s: rank group line %r, expected %r" % (what, text[head[0]], want_head))
    mine, base = rows(text[head[0]:uns[0]]), rows(text[uns[0]:])
    for label, got, want in [("parameters", mine.get("parameters"), par), ("gradients", mine.get("gradients"), par),
                             ("optimizer state", mine.get("optimizer state"), adam),
                             ("unsharded parameters", base.get("parameters"), whole),
                             ("unsharded optimizer state", base.get("optimizer state"), 2 * whole)]:
        if got != want:
            fail("%s: %s %s bytes, expected %d" % (what, label, got, want))
    if mine.get("states total") != mine.get("parameters", 0) + mine.get("gradients", 0) + mine.get("optimizer state", 0):
        fail("%s: states total does not add up" % what)
    # tp shrinks the micro block's activations; dp alone leaves them as they
    # are.  (The update block is not compared: without ZeRO it holds every
    # reduced gradient until the global norm is known, and at these sizes
    # that can be the largest block.)
    arena, arena1 = mine.get("block micro: arena peak", 0), base.get("block micro: arena peak", 0)
    if zero == 3 and dp > 1:
        # ZeRO-3: the gathered parameters are activations of the micro block:
        # some live at once, at most the whole (local) model twice over
        live = mine.get("ZeRO-3: gathered parameters live at once", 0)
        if not 0 < live <= 2 * loc:
            fail("%s: gathered parameters live at once %d bytes, expected in (0, %d]" % (what, live, 2 * loc))
        check_per_param(what, text[head[0]:uns[0]], dp, par, adam, params, tp_dims, tp)
    elif not (0 < arena < arena1 if tp > 1 else 0 < arena <= arena1):
        fail("%s: micro block arena %d per rank against %d unsharded" % (what, arena, arena1))
    if failures == before:
        print("ok: memory %s: params %d, adam %d bytes per rank (unsharded %d)" % (what, par, adam, whole))


def local_elements(params, tp_dims, tp):
    """parameter elements one rank's tp block holds (a tp dim split t ways)"""
    n = 0
    for _, dims in params:
        n += math.prod(math.ceil(k / tp) if tp > 1 and name in tp_dims else k for name, k in dims)
    return n


def check_per_param(what, section, dp, par, adam, params, tp_dims, tp):
    """ZeRO-3's per-parameter rows: 16/dp bytes in f32 (4E/dp: E the element
    size) when every local tensor divides by dp, next to ZeRO-1's 2E + 2E/dp
    and Megatron's 18 and 6 + 12/dp."""
    n = local_elements(params, tp_dims, tp)
    e = DSIZE[params[0][0]]
    text = "\n".join(section)
    m = re.search(r"state bytes per parameter: ([\d.]+) =", text)
    want = (2 * par + adam) / n
    if not m or abs(float(m.group(1)) - want) > 1e-3 * want:
        fail("%s: state bytes per parameter %s, expected %.4g" % (what, m and m.group(1), want))
    m = re.search(r"closed form \(E = (\d+) bytes, \w+\): ZeRO-3 4E/dp = ([\d.]+); ZeRO-1 E \+ E \+ 2E/dp = ([\d.]+);",
                  text)
    if not m or int(m.group(1)) != e or abs(float(m.group(2)) - 4 * e / dp) > 1e-3 or \
            abs(float(m.group(3)) - (2 * e + 2 * e / dp)) > 1e-3:
        fail("%s: closed forms %s, expected E=%d, ZeRO-3 %.4g, ZeRO-1 %.4g" % (what, m and m.groups(), e, 4 * e / dp,
                                                                            2 * e + 2 * e / dp))
    if e == 4 and abs(want - 16 / dp) > 1e-9:
        fail("%s: %.6g bytes per parameter in f32, expected exactly 16/dp = %.4g" % (what, want, 16 / dp))
    m = re.search(r"18 bytes per parameter plain, 6 \+ 12/dp = ([\d.]+)", text)
    if not m or abs(float(m.group(1)) - (6 + 12 / dp)) > 1e-3:
        fail("%s: Megatron's distributed optimizer %s, expected %.4g" % (what, m and m.group(1), 6 + 12 / dp))


def check_zero3_comm(model, defs, extra, dp, tp):
    """--report comm's ZeRO-3 section: the forward gathers every (tp-local)
    parameter once per micro batch, (dp-1)/dp of its bytes sent per rank;
    Megatron-FSDP's closed form 3 (dp-1)/dp P E and ZeRO-1's 2 (dp-1)/dp P E."""
    params, rules = frontend_params(model, defs)
    tp_dims = {d for d, axes in rules.items() if "tp" in axes}
    P = local_elements(params, tp_dims, tp)
    e = DSIZE[params[0][0]]
    text = mcc(["%s/samples/%s.mdl" % (SRC, model)] + defs + extra + ["--report", "comm"])
    what = "%s %s" % (model, " ".join(extra))
    m = re.search(r"micro batches per rank", text)
    fwd = re.search(r"parameter all_gather, forward\s+(\d+)\s+(\d+)\s+(\d+)", text)
    fsdp = re.search(r"Megatron-FSDP, closed form: .* = (\d+), per step (\d+)", text)
    z1 = re.search(r"ZeRO-1 \(--zero 1\), closed form: .* = (\d+): ZeRO-3 sends (\d+) more", text)
    if not (m and fwd and fsdp and z1):
        return fail("%s: no ZeRO-3 section in:\n%s" % (what, text))
    want_fwd = (dp - 1) / dp * P * e
    if abs(int(fwd.group(2)) - want_fwd) > 1 or int(fwd.group(1)) != len(params):
        fail("%s: forward gathers %s, expected %d gathers of %.0f ring bytes" % (what, fwd.groups(), len(params), want_fwd))
    if abs(int(fsdp.group(1)) - 3 * want_fwd) > 1 or abs(int(z1.group(1)) - 2 * want_fwd) > 1:
        fail("%s: closed forms FSDP %s ZeRO-1 %s, expected %.0f and %.0f" % (what, fsdp.group(1), z1.group(1),
                                                                           3 * want_fwd, 2 * want_fwd))
    else:
        print("ok: comm %s: ZeRO-3 forward gathers %d ring bytes per micro batch, closed forms %s / %s" %
              (what, int(fwd.group(2)), fsdp.group(1), z1.group(1)))


def check_comm(model, defs, extra, sizes):
    src = ["%s/samples/%s.mdl" % (SRC, model)] + defs + extra
    ir = mcc(src + ["--emit=ir"]).splitlines()
    train = next(l for l in ir if l.startswith("train "))
    gb = int(re.search(r"global_batch=(\d+)", train).group(1))
    mb = int(re.search(r"micro_batch=(\d+)", train).group(1))
    nmicro = gb // (mb * sizes.get("dp", 1))
    count = payload = ring = 0
    block, types = None, {}
    for line in ir:
        m = re.match(r"block (\w+) \{", line)
        if m:
            block, types = m.group(1), {}
            continue
        m = re.match(r"\s+%(\d+) = (\w+) (.*) : (\S+\[[^\]]*\])", line)
        if not m:
            continue
        types[int(m.group(1))] = parse_type(m.group(4))
        op = m.group(2)
        if op not in ("all_reduce", "all_gather", "reduce_scatter"):
            continue
        n = sizes.get(re.search(r"axis=(\w+)", m.group(3)).group(1), 1)
        if n < 2:
            continue
        operand = int(re.match(r"%(\d+)", m.group(3)).group(1))
        dtype, dims = types[int(m.group(1))] if op == "all_gather" else types[operand]
        nbytes = math.prod(s for _, s in dims) * DSIZE[dtype]
        # evaluation blocks (pass eval) do not run in a training step
        runs = nmicro if block == "micro" else 0 if block == "eval" else 1
        count += runs
        payload += nbytes * runs
        ring += (2 if op == "all_reduce" else 1) * (n - 1) / n * nbytes * runs
    text = mcc(src + ["--report", "comm"])
    m = re.search(r"total per step: (\d+) collectives, payload (\d+) bytes, ring (\d+) bytes", text)
    what = "%s %s" % (model, " ".join(extra))
    if not m:
        return fail("%s: no total line in:\n%s" % (what, text))
    got = tuple(int(x) for x in m.groups())
    if got != (count, payload, round(ring)) or count == 0:
        fail("%s: comm total %s, expected %s" % (what, got, (count, payload, round(ring))))
    else:
        print("ok: comm %s: %d collectives, %d payload bytes per step" % (what, count, payload))


check_memory("gpt", GPT + ["-D", "vocab=257"], 2, 1, True, ["--tp", "2"])          # padded vocab
check_memory("llama", LLAMA + ["-D", "vocab=256"], 2, 2, True, ["--tp", "2", "--dp", "2", "--sp"])
check_memory("gpt", GPT + ["-D", "vocab=256"], 1, 4, True, ["--dp", "4"])
check_memory("gpt", GPT + ["-D", "vocab=256"], 1, 4, False, ["--dp", "4", "--no-zero"])
check_memory("llama", LLAMA + ["-D", "vocab=256", "-D", "heads=8", "-D", "kv_heads=4"], 4, 1, True, ["--tp", "4"])
# ZeRO-1 over the joint group at dp 1: cp alone shards the moments (Megatron's dp x cp group), --no-zero does not
def micro_bytes(src):
    """bytes sent per step by the micro block's collectives and sends that
    move more than a scalar (--report sharding's lines), and the number of
    its all_gathers over cp"""
    text = mcc(src + ["--report", "sharding"])
    ring = gathers = 0
    for m in re.finditer(r"^  micro %\d+: (\w+) over (\S+) of (\S+\[[^\]]*\]), (\d+) per step, (\d+) bytes sent",
                         text, re.M):
        op, axis, (_, dims), count, sent = m.group(1), m.group(2), parse_type(m.group(3)), int(m.group(4)), \
            int(m.group(5))
        if dims:
            ring += sent
        if op == "all_gather" and "cp" in axis.split("+"):
            gathers += count
    return ring, gathers


def check_micro_batch_invariant(model, defs, extra, gathers_ok=False):
    """At a fixed global batch the micro block moves the same bytes per step
    whatever the micro batch: its collectives carry tokens, and a weight
    gradient over the micro batch's rows (batch x seq merged) is a partial
    sum over cp, not a reason to gather the activations (shard.c, merged
    rows).  Scalars (the loss's token count) are left out: one per micro
    batch."""
    what = "%s %s" % (model, " ".join(extra))
    got = {}
    for mb in (1, 2, 4):
        src = ["%s/samples/%s.mdl" % (SRC, model)] + defs + ["-D", "batch=4", "-D", "micro_batch=%d" % mb] + extra
        got[mb] = micro_bytes(src)
    rings = {mb: r for mb, (r, _) in got.items()}
    if len(set(rings.values())) != 1 or rings[1] == 0:
        fail("%s: micro-block ring bytes per step by micro batch %s, expected equal and > 0" % (what, rings))
    elif not gathers_ok and any(g for _, g in got.values()):
        fail("%s: the micro block all-gathers over cp: %s" % (what, {mb: g for mb, (_, g) in got.items()}))
    else:
        print("ok: micro batch 1/2/4 %s: %d ring bytes per step each" % (what, rings[1]))


def check_cp_attention(form, c):
    """llama (grouped-query: 2 kv heads of 4) under cp: the bytes one layer
    adds per micro batch are at most the closed form of the ring / all-gather
    forms, 6 (c-1)/c s b h_kv E (k and v forward, again backward, dk and dv
    home); the all-gather form once reduced its key / value gradients whole
    (3.5x it).  f32, s = 16, b = 1, h_kv = 2 x 8."""
    defs = LLAMA + ["-D", "vocab=256", "--cp", str(c), "--cp-attn", form, "--precision", "f32"]
    nmicro = 4   # batch 4, micro batch 1
    per_layer = [micro_bytes(["%s/samples/llama.mdl" % SRC] + defs + ["-D", "layers=%d" % L])[0] for L in (2, 3)]
    got = (per_layer[1] - per_layer[0]) / nmicro
    closed = 6 * (c - 1) / c * 16 * 1 * 16 * 4
    what = "llama --cp %d --cp-attn %s" % (c, form)
    if not 0 < got <= closed:
        fail("%s: %g bytes per layer and micro batch, the closed form %g" % (what, got, closed))
    else:
        print("ok: %s: %g bytes per layer and micro batch, closed form %g" % (what, got, closed))


for form in ("ring", "allgather"):
    for c in (2, 4):
        check_cp_attention(form, c)
check_micro_batch_invariant("gpt", GPT + ["-D", "vocab=256", "-D", "dropout=0.0"], ["--cp", "2"])
check_micro_batch_invariant("llama", LLAMA + ["-D", "vocab=256"], ["--cp", "2", "--cp-attn", "a2a"])
check_micro_batch_invariant("llama", LLAMA + ["-D", "vocab=256"], ["--cp", "2", "--tp", "2", "--sp"])
check_micro_batch_invariant("llama", LLAMA + ["-D", "vocab=256"], ["--cp", "2", "--cp-attn", "allgather"], True)
check_micro_batch_invariant("gpt", GPT + ["-D", "vocab=256"], ["--tp", "2", "--sp"])
check_memory("llama", LLAMA + ["-D", "vocab=256"], 1, 1, True, ["--cp", "2"], cp=2)
check_memory("llama", LLAMA + ["-D", "vocab=256"], 1, 1, False, ["--cp", "2", "--no-zero"], cp=2)
check_memory("llama", LLAMA + ["-D", "vocab=256"], 1, 2, True, ["--cp", "2", "--dp", "2"], cp=2)
check_comm("gpt", GPT + ["-D", "vocab=256"], ["--tp", "2", "--dp", "2", "--sp"], {"tp": 2, "dp": 2})
check_comm("llama", LLAMA + ["-D", "vocab=256"], ["--tp", "2"], {"tp": 2})
check_comm("gpt", GPT + ["-D", "vocab=256"], ["--dp", "4", "--no-zero"], {"dp": 4})
# ZeRO-3: parameters, gradients and moments 1/dp (16/dp bytes per f32 parameter)
check_memory("gpt", GPT + ["-D", "vocab=256"], 1, 2, 3, ["--dp", "2", "--zero", "3", "--precision", "f32"])
check_memory("gpt", GPT + ["-D", "vocab=256"], 1, 4, 3, ["--dp", "4", "--zero", "3", "--precision", "f32"])
check_memory("llama", LLAMA + ["-D", "vocab=256"], 2, 2, 3, ["--tp", "2", "--dp", "2", "--sp", "--zero", "3",
                                                            "--precision", "f32"])
check_comm("gpt", GPT + ["-D", "vocab=256"], ["--dp", "2", "--zero", "3"], {"dp": 2})
check_zero3_comm("gpt", GPT + ["-D", "vocab=256"], ["--dp", "2", "--zero", "3"], 2, 1)
check_zero3_comm("llama", LLAMA + ["-D", "vocab=256"], ["--tp", "2", "--dp", "4", "--zero", "3"], 4, 2)
sys.exit(1 if failures else 0)
