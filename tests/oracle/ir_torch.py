"""ir_torch.py - a model-agnostic PyTorch interpreter of Tessera's IR text
(the format of ir_print_module; see docs/ir.md).  It reads the "forward"
block as the frontend makes it and evaluates each op with torch in the
node's dtype, so torch.autograd gives reference gradients for any .mdl.

Only what a forward block contains is implemented; derivative ops
(*_bwd), optimizer effects and dropout with p > 0 (its mask comes from
Tessera's counter-based hash) are rejected with a clear message.
"""
import math
import re

import torch
import torch.nn.functional as F

TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int64}


class IrError(Exception):
    pass


class Type:
    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, shape

    def __repr__(self):
        return "%s%s" % (self.dtype, list(self.shape))


class Node:
    def __init__(self, line_no, op, string, operands, states, attrs, type_):
        self.line_no, self.op, self.string = line_no, op, string
        self.operands, self.states, self.attrs, self.type = operands, states, attrs, type_


class Module:
    def __init__(self):
        self.name, self.states, self.blocks, self.seed = None, {}, {}, 0

    def param_names(self):
        return [n for n, (kind, _) in self.states.items() if kind == "param"]


_TOKEN = re.compile(r'''\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<val>%\d+)
  | (?P<state>@[A-Za-z0-9_.]+)
  | (?P<kv>[A-Za-z_][A-Za-z0-9_]*=(?:\[[^\]]*\]|[^\s,]+))
  | (?P<comma>,)
  | (?P<colon>:)
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
)''', re.X)


def strip_comment(line):
    """Drops a '#' comment that is not inside a string."""
    out, in_str, esc = [], False, False
    for c in line:
        if in_str:
            esc = (c == "\\") and not esc
            if c == '"' and not esc:
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "#":
            break
        out.append(c)
    return "".join(out).strip()


def parse_type(s):
    """'f64[batch:4, 64]' -> Type('f64', (4, 64)); 'f64[]' is a scalar."""
    m = re.fullmatch(r"\s*([a-z0-9]+)\[(.*)\]\s*", s)
    if not m:
        raise IrError("bad type %r" % s)
    dims = []
    for d in filter(None, (x.strip() for x in m.group(2).split(","))):
        dims.append(int(d.split(":")[-1]))
    return Type(m.group(1), tuple(dims))


def parse_value(v):
    if v.startswith("["):
        return [int(x) for x in v[1:-1].split(",") if x.strip()]
    try:
        return int(v)
    except ValueError:
        return float(v)   # handles inf, -inf, nan, 1e-08


def parse_node(text, line_no):
    """'%3 = op "s" %1, %2 @st k=v : type'  or an effect without '%N =' / type."""
    result = None
    m = re.match(r"%(\d+)\s*=\s*", text)
    if m:
        result = int(m.group(1))
        text = text[m.end():]
    type_ = None
    if result is not None:
        # The type is the last item; its dim names use ':' without spaces.
        head, sep, tail = text.rpartition(" : ")
        if not sep:
            raise IrError("line %d: value node without ': type'" % line_no)
        text, type_ = head, parse_type(tail)
    op, _, rest = text.strip().partition(" ")
    string, operands, states, attrs = None, [], [], {}
    pos = 0
    rest = rest.strip()
    while pos < len(rest):
        t = _TOKEN.match(rest, pos)
        if not t or t.end() == pos:
            raise IrError("line %d: cannot read %r" % (line_no, rest[pos:]))
        pos = t.end()
        kind = t.lastgroup
        tok = t.group(kind)
        if kind == "str":
            string = bytes(tok[1:-1], "utf-8").decode("unicode_escape")
        elif kind == "val":
            operands.append(int(tok[1:]))
        elif kind == "state":
            states.append(tok[1:])
        elif kind == "kv":
            k, _, v = tok.partition("=")
            attrs[k] = parse_value(v)
        elif kind == "comma":
            pass
        else:
            raise IrError("line %d: unexpected %r" % (line_no, tok))
    return result, Node(line_no, op, string, operands, states, attrs, type_)


def parse_module(text):
    mod, block = Module(), None
    for i, raw in enumerate(text.splitlines(), 1):
        line = strip_comment(raw)
        if not line:
            continue
        if block is not None:
            if line == "}":
                block = None
                continue
            idx, node = parse_node(line, i)
            if idx is not None and idx != len(block):
                raise IrError("line %d: expected %%%d, got %%%d" % (i, len(block), idx))
            block.append(node)
            continue
        word = line.split()[0]
        if word == "module":
            mod.name = line.split()[1]
        elif word == "state":
            m = re.match(r"state\s+@(\S+)\s+:\s+(\S+\[[^\]]*\])\s+(\w+)", line)
            if not m:
                raise IrError("line %d: bad state line" % i)
            mod.states[m.group(1)] = (m.group(3), parse_type(m.group(2)))
        elif word == "block":
            name = line.split()[1]
            block = mod.blocks[name] = []
        elif word == "train":
            m = re.search(r"\bseed=(\d+)", line)
            mod.seed = int(m.group(1)) if m else 0
        elif word in ("const", "parallel", "rule"):   # rules: sharding only
            pass
        elif word == "end":   # a module's last line (lets the plan text embed modules)
            break
        else:
            raise IrError("line %d: unknown item %r" % (i, word))
    return mod


# ---------------------------------------------------------------- ops ----
def _rope(x, axis, inverse, base):
    """x[..., T (at axis), ..., D]: rotate-half rotary embedding with the
    position taken along `axis`; inverse rotates by the negative angle."""
    axis = axis % x.dim()
    T, D = x.shape[axis], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]      # [T, D/2]
    shape = [1] * x.dim()
    shape[axis], shape[-1] = T, D
    cos = torch.cat([ang.cos(), ang.cos()], -1).reshape(shape).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).reshape(shape).to(x.dtype)
    if inverse:
        sin = -sin
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _sum_to(x, shape):
    """Sums x down to `shape` (adjoint of numpy broadcasting)."""
    extra = x.dim() - len(shape)
    if extra > 0:
        x = x.sum(dim=tuple(range(extra)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and x.shape[i] != 1)
    if dims:
        x = x.sum(dim=dims, keepdim=True)
    return x.reshape(shape)


def _reduce(fn, x, a):
    r = fn(x, a["axis"] % max(x.dim(), 1), keepdim=bool(a["keepdim"]))
    return r if isinstance(r, torch.Tensor) else r.values   # torch.max gives (values, indices)


def _causal(x, fill):
    T, S = x.shape[-2], x.shape[-1]
    return x.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), fill)


def _dropout(x, a):
    if a["p"] != 0.0:
        raise IrError("dropout with p=%g cannot be reproduced (Tessera's hash mask); use dropout=0" % a["p"])
    return x


def _cross_entropy(logits, targets, ignore):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), reduction="none",
                           ignore_index=ignore).reshape(targets.shape)


def _matmul(x, y, a):
    if a["ta"]:
        x = x.transpose(-1, -2)
    if a["tb"]:
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def _attention(q, k, v, a, extra):
    """Fused attention as explicit softmax(scale q k^T) v (this torch has no
    scaled_dot_product_attention); kv heads repeated for grouped-query
    attention (query head h reads kv head h // (Hq / Hkv)); causal: key j
    hidden from query i when j > i; window W > 0: also when |i - j| >= W;
    alibi: the operand after v is ALiBi's slopes [Hq], the score of head h
    less slope[h] |i - j| (a constant: detached, no gradient);
    doc [B, T] (document ids, the operand after those): also hidden when
    doc[b, j] != doc[b, i].  A row that sees no key gives 0, as the op's
    definition says."""
    slope = extra.pop(0).detach() if a.get("alibi", 0) else None
    doc = extra[0] if extra else None
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * a["scale"]
    i = torch.arange(q.shape[2]).reshape(-1, 1)
    j = torch.arange(k.shape[2]).reshape(1, -1)
    if slope is not None:
        s = s - slope.to(s.dtype).reshape(1, -1, 1, 1) * (i - j).abs().to(s.dtype)
    hide = torch.zeros(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool)
    if a["causal"]:
        hide = hide | (j > i)
    if a.get("window", 0) > 0:
        hide = hide | ((i - j).abs() >= a["window"])
    if doc is not None:
        hide = hide | (doc[:, None, :q.shape[2], None] != doc[:, None, None, :k.shape[2]])
    s = s.masked_fill(hide, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)   # an all-masked row: 0
    return torch.matmul(p, v)


def _topk_mask(x, k):
    """1 at the k largest entries of each last-axis row; ties to the lower
    index (a stable descending sort); no gradient."""
    idx = torch.sort(x.detach(), dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros_like(x).scatter(-1, idx, 1.0)


def _capacity_mask(keep, cap):
    """Per last-axis column of the 0/1 mask keep[..., E], the first cap
    nonzero entries in row-major order of the leading dims; no gradient."""
    flat = (keep.detach() != 0).reshape(-1, keep.shape[-1]).to(keep.dtype)
    return (flat * (torch.cumsum(flat, dim=0) <= cap).to(keep.dtype)).reshape(keep.shape)


def _moe_slots(routed):
    """The routed (token, expert) slots of routed[N, E] in token-layout row
    order (docs/ir.md "Token dispatch"): expert 0's tokens in token order,
    then expert 1's, ...  Returns (t, e) index tensors."""
    e, t = (routed.detach() != 0).t().nonzero(as_tuple=True)
    return t, e


def _moe_perm(x, routed, scale, rows):
    t, e = _moe_slots(routed)
    if len(t) > rows:
        raise IrError("moe_perm: %d routed slots do not fit in %d rows" % (len(t), rows))
    vals = scale[t, e].unsqueeze(-1) * x[t]
    return torch.cat([vals, vals.new_zeros(rows - len(t), x.shape[1])])


def _moe_unperm(y, routed, scale):
    t, e = _moe_slots(routed)
    vals = scale[t, e].unsqueeze(-1) * y[:len(t)]
    return y.new_zeros(routed.shape[0], y.shape[1]).index_add(0, t, vals)


def _gmm(x, w, cnt, tb):
    """Group g's rows (cnt summed over sources) times w[g] (w[g]^T when tb);
    rows past all groups 0."""
    outs, off = [], 0
    for g, m in enumerate(cnt.sum(0).tolist()):
        outs.append(torch.matmul(x[off:off + m], w[g].t() if tb else w[g]))
        off += m
    outs.append(x.new_zeros(x.shape[0] - off, w.shape[1] if tb else w.shape[2]))
    return torch.cat(outs)


_M64 = (1 << 64) - 1


def _mix64(z):
    z = (z + 0x9e3779b97f4a7c15) & _M64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & _M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & _M64
    return z ^ (z >> 31)


def _rand(n, a, dt, seed, step=0, micro=0):
    """Tessera's counter-based uniform (runtime/cpu/rng.c, written out
    again here): u = H(2, seed, stream, step, micro, flat index) in [0, 1)."""
    shape, lo, hi = n.type.shape, a["lo"], a["hi"]
    count = 1
    for d in shape:
        count *= d
    out = []
    for i in range(count):
        h = 0x6a09e667f3bcc909
        for w in (2, seed, a["stream"], step, micro, i):
            h = _mix64(h ^ (w & _M64))
        u = (h >> 11) * 2.0 ** -53
        v = lo + u * (hi - lo)
        if dt == torch.int32:
            v = math.floor(v)
            v = hi - 1 if v >= hi else v
        out.append(v)
    return torch.tensor(out, dtype=torch.float64).reshape(shape).to(dt)


def _arange(n, a, dt):
    shape, ax = n.type.shape, a["axis"]
    idx = torch.arange(shape[ax], dtype=torch.float64) * a["step"] + a["start"]
    view = [1] * len(shape)
    view[ax] = shape[ax]
    return torch.broadcast_to(idx.reshape(view), shape).to(dt).contiguous()


def _cmp(x, y, pred):
    return [x == y, x != y, x < y, x <= y, x > y, x >= y][pred]


def _divmod(x, y, mod):
    safe = torch.where(y == 0, torch.ones_like(y), y)
    r = torch.remainder(x, safe) if mod else torch.div(x, safe, rounding_mode="floor")
    return torch.where(y == 0, torch.zeros_like(r), r)


def _scalar_op(x, c, op, dt):
    if dt == torch.int32:   # i32 arithmetic, exact for the small values tests use
        return op(x.to(torch.int64), int(c)).to(dt)
    return op(x, c)


def _gather_bwd(idx, dy, n, a, dt):
    return torch.zeros(n.type.shape, dtype=dt).scatter_add(a["axis"], idx.long(), dy)


# op -> f(operands, attrs, node, dtype) -> tensor
OPS = {
    "cmp": lambda v, a, n, dt: _cmp(v[0], v[1], a["pred"]).to(dt),
    "where": lambda v, a, n, dt: torch.where(v[0] != 0, v[1], v[2]),
    "floordiv": lambda v, a, n, dt: _divmod(v[0], v[1], False),
    "mod": lambda v, a, n, dt: _divmod(v[0], v[1], True),
    "gather": lambda v, a, n, dt: torch.gather(v[0], a["axis"], v[1].long()),
    "gather_bwd": lambda v, a, n, dt: _gather_bwd(v[0], v[1], n, a, dt),
    "add": lambda v, a, n, dt: v[0] + v[1],
    "sub": lambda v, a, n, dt: v[0] - v[1],
    "mul": lambda v, a, n, dt: v[0] * v[1],
    "div": lambda v, a, n, dt: v[0] / v[1],
    "adds": lambda v, a, n, dt: _scalar_op(v[0], a["c"], lambda x, c: x + c, dt),
    "muls": lambda v, a, n, dt: _scalar_op(v[0], a["c"], lambda x, c: x * c, dt),
    "neg": lambda v, a, n, dt: -v[0],
    "exp": lambda v, a, n, dt: torch.exp(v[0]),
    "log": lambda v, a, n, dt: torch.log(v[0]),
    "sqrt": lambda v, a, n, dt: torch.sqrt(v[0]),
    "rsqrt": lambda v, a, n, dt: torch.rsqrt(v[0]),
    "tanh": lambda v, a, n, dt: torch.tanh(v[0]),
    "gelu_tanh": lambda v, a, n, dt: F.gelu(v[0], approximate="tanh"),
    "gelu_erf": lambda v, a, n, dt: F.gelu(v[0]),
    "silu": lambda v, a, n, dt: F.silu(v[0]),
    "relu": lambda v, a, n, dt: F.relu(v[0]),
    "eq": lambda v, a, n, dt: (v[0] == v[1]).to(dt),
    "ne_scalar": lambda v, a, n, dt: (v[0] != a["c"]).to(dt),
    "cast": lambda v, a, n, dt: v[0].to(dt),
    "reshape": lambda v, a, n, dt: v[0].reshape(n.type.shape),
    "permute": lambda v, a, n, dt: v[0].permute(*a["perm"]),
    "slice": lambda v, a, n, dt: v[0].narrow(a["axis"], a["start"], a["end"] - a["start"]),
    "pad": lambda v, a, n, dt: torch.cat(
        [v[0].new_zeros(v[0].shape[:a["axis"]] + (a["before"],) + v[0].shape[a["axis"] + 1:]), v[0],
         v[0].new_zeros(v[0].shape[:a["axis"]] + (a["after"],) + v[0].shape[a["axis"] + 1:])], a["axis"]),
    "concat": lambda v, a, n, dt: torch.cat(v, a["axis"]),
    "broadcast": lambda v, a, n, dt: torch.broadcast_to(v[0], n.type.shape),
    "sum_to": lambda v, a, n, dt: _sum_to(v[0], n.type.shape),
    "sum": lambda v, a, n, dt: _reduce(torch.sum, v[0], a),
    "mean": lambda v, a, n, dt: _reduce(torch.mean, v[0], a),
    "max": lambda v, a, n, dt: _reduce(torch.max, v[0], a),
    "sumsq": lambda v, a, n, dt: (v[0] * v[0]).sum(),
    "matmul": lambda v, a, n, dt: _matmul(v[0], v[1], a),
    "softmax": lambda v, a, n, dt: torch.softmax(v[0], -1),
    "log_softmax": lambda v, a, n, dt: torch.log_softmax(v[0], -1),
    "layernorm": lambda v, a, n, dt: F.layer_norm(v[0], (v[0].shape[-1],), eps=a["eps"]),
    "rmsnorm": lambda v, a, n, dt: v[0] * torch.rsqrt(v[0].pow(2).mean(-1, keepdim=True) + a["eps"]),
    "embedding": lambda v, a, n, dt: F.embedding(v[1].long(), v[0]),
    "causal_mask": lambda v, a, n, dt: _causal(v[0], a["fill"]),
    "masked_fill": lambda v, a, n, dt: torch.where(v[1] != 0, v[0], torch.full_like(v[0], a["fill"])),
    "dropout": lambda v, a, n, dt: _dropout(v[0], a),
    "rope": lambda v, a, n, dt: _rope(v[0], a["axis"], a["inverse"], a["base"]),
    "cross_entropy": lambda v, a, n, dt: _cross_entropy(v[0], v[1], a["ignore"]),
    "topk_mask": lambda v, a, n, dt: _topk_mask(v[0], a["k"]),
    "capacity_mask": lambda v, a, n, dt: _capacity_mask(v[0], a["cap"]),
    "attention": lambda v, a, n, dt: _attention(v[0], v[1], v[2], a, list(v[3:])),
    "moe_counts": lambda v, a, n, dt: (v[0].detach() != 0).sum(0).reshape(1, -1).to(dt),
    "moe_perm": lambda v, a, n, dt: _moe_perm(v[0], v[1], v[2], a["rows"]),
    "moe_unperm": lambda v, a, n, dt: _moe_unperm(v[0], v[1], v[2]),
    "gmm": lambda v, a, n, dt: _gmm(v[0], v[1], v[2], a["tb"]),
}


def run_forward(mod, params, feeds, block="forward"):
    """Evaluates `block`: params maps state names to tensors (leaves with
    requires_grad), feeds maps input names to tensors.  Returns the
    outputs {name: scalar tensor}."""
    if block not in mod.blocks:
        raise IrError("no block %r" % block)
    vals, outs = [], {}
    for i, n in enumerate(mod.blocks[block]):
        try:
            if n.op == "output":
                outs[n.string] = vals[n.operands[0]]
                vals.append(None)
                continue
            dt = TORCH_DTYPES[n.type.dtype]
            if n.op == "input":
                if n.string not in feeds:
                    raise IrError("no data for input %r" % n.string)
                v = feeds[n.string].to(dt)
            elif n.op == "state":
                v = params[n.states[0]]
            elif n.op == "full":
                v = torch.full(n.type.shape, n.attrs["value"], dtype=dt)
            elif n.op == "arange":
                v = _arange(n, n.attrs, dt)
            elif n.op == "rand":
                v = _rand(n, n.attrs, dt, mod.seed)
            elif n.op in OPS:
                v = OPS[n.op]([vals[j] for j in n.operands], n.attrs, n, dt)
            else:
                raise IrError("op %r is not expected in a forward block" % n.op)
            if tuple(v.shape) != tuple(n.type.shape):
                raise IrError("computed shape %s, IR says %s" % (tuple(v.shape), n.type))
            vals.append(v)
        except (IrError, RuntimeError, KeyError, IndexError) as e:
            raise SystemExit("oracle: FAIL: forward.ir line %d (%%%d = %s): %s" % (n.line_no, i, n.op, e))
    return outs
