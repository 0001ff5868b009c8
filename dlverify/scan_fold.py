"""XLA's two-level prefix sum folded back into one cumsum (over the reals).

XLA's CPU pipeline (its reduce-window rewriter) computes a cumsum of N = n * b
positions along dim d in blocks of b: the operand reshaped to [.., n, b, ..], the
in-block prefix sums L (a cumsum along the block dim d + 1), the blocks' totals
T = L[.., :, b-1, ..] (a slice, squeezed), their exclusive prefix sum E written as
a reduce-window of n positions padded by n in front (`pad(T, (n, 0))` summed over
window offsets 0 .. n-1, the first n rows kept: E[i] = sum_{j < i} T[j]), and
L + broadcast(E), reshaped back. For every x,

    L + broadcast(E) = reshape(cumsum(x, d), [.., n, b, ..]),

position (i, j) being block i's j + 1 first elements plus every earlier block's
total, and row-major (i, j) the position i * b + j of dim d. The module before
optimisations (and the distributed one, scanning its shorter block whole) writes
the cumsum itself; so this rewrite puts the folded form back, the sums being the
same numbers over the reals (floating point may round them apart, as any
reassociated sum: the verdict says so). A transpose XLA put before the reshape (to
scan the minor dim) is taken into the cumsum: cumsum(transpose(y, p), d) is
transpose(cumsum(y, p[d]), p). dlverify/blocked_scan.py then writes the cumsum in
the distributed program's blocks.

The exclusive sum is matched op by op, as dlverify/window_lowering.py lowers the
reduce-window (a pad with the literal 0, slices at every window offset of one
length, summed by adds in any tree); any other form is left as it is. Each match
is checked for sizes, dims, offsets and the pad value; tests/test_scan_fold.py
runs the rewritten graphs through the shared evaluator.
"""
from __future__ import annotations

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op, literal_value
from dlverify.rewrites import _drop_newly_dead, _unused


def _whole_slice(op: Op, shape: tuple[int, ...], dim: int) -> tuple[int, int] | None:
    """(start, limit) along `dim` of slice op, when it takes every other dim whole with
    stride 1; else None."""
    p = op.params
    if p.get("strides") and any(s != 1 for s in p["strides"]):
        return None
    for j, n in enumerate(shape):
        if j != dim and (p["start_indices"][j] != 0 or p["limit_indices"][j] != n):
            return None
    return p["start_indices"][dim], p["limit_indices"][dim]


class _Match:
    """One two-level scan: `add` = L + broadcast(E) over the reshape of `x`."""

    def __init__(self, g: Graph, producer: dict[int, Op]) -> None:
        self.g, self.producer = g, producer

    def shape(self, t: int) -> tuple[int, ...]:
        return tuple(self.g.tensors[t].shape)

    def get(self, t: int, kind: str) -> Op | None:
        op = self.producer.get(t)
        return op if op is not None and op.kind == kind else None

    def scan(self, add: Op) -> tuple[int, int] | None:
        """(x, d): add computes reshape(cumsum(x, d)) as XLA's two-level form."""
        if add.kind != "add" or len(add.inputs) != 2:
            return None
        for li in (0, 1):
            inner, bcast = self.get(add.inputs[li], "cumsum"), self.get(add.inputs[1 - li],
                                                                         "broadcast_in_dim")
            if inner is None or bcast is None or inner.params.get("reverse"):
                continue
            a = int(inner.params["axis"])
            split = self.get(inner.inputs[0], "reshape")
            if a == 0 or split is None:
                continue
            d, rs, x = a - 1, self.shape(inner.output), split.inputs[0]
            n, b = rs[d], rs[a]
            if self.shape(x) != rs[:d] + (n * b,) + rs[a + 1:]:
                continue
            e = bcast.inputs[0]
            if self.shape(e) != rs[:a] + rs[a + 1:] or tuple(bcast.params["broadcast_dimensions"]) \
                    != tuple(j for j in range(len(rs)) if j != a):
                continue
            if self.exclusive_totals(e, inner.output, d, a, n, b):
                return x, d
        return None

    def totals(self, t: int, scanned: int, a: int, b: int) -> bool:
        """t is the last row along a of `scanned`, that dim squeezed: the blocks' totals."""
        sq = self.get(t, "reshape")
        last = self.get(sq.inputs[0], "slice") if sq is not None else None
        if last is None or last.inputs[0] != scanned:
            return False
        shape = self.shape(scanned)
        return _whole_slice(last, shape, a) == (b - 1, b) and \
            self.shape(t) == shape[:a] + shape[a + 1:]

    def exclusive_totals(self, e: int, scanned: int, d: int, a: int, n: int, b: int) -> bool:
        """e[.., i, ..] = sum_{j < i} T[.., j, ..] along d, T the totals of `scanned`:
        the first n rows of the window sums over offsets 0 .. n-1 (length n + 1 each)
        of T padded by n zeros in front."""
        first = self.get(e, "slice")
        if first is None:
            return False
        w = first.inputs[0]
        if self.shape(w)[d] != n + 1 or _whole_slice(first, self.shape(w), d) != (0, n):
            return False
        leaves, stack = [], [w]
        while stack:   # the add tree of the window offsets
            t = stack.pop()
            op = self.get(t, "add")
            if op is not None and len(op.inputs) == 2 and all(self.shape(i) == self.shape(w)
                                                              for i in op.inputs):
                stack.extend(op.inputs)
            else:
                leaves.append(t)
        pads, offsets = set(), []
        for t in leaves:
            s = self.get(t, "slice")
            cut = _whole_slice(s, self.shape(s.inputs[0]), d) if s is not None else None
            if cut is None or cut[1] - cut[0] != n + 1:
                return False
            pads.add(s.inputs[0])
            offsets.append(cut[0])
        if len(pads) != 1 or sorted(offsets) != list(range(n)):
            return False
        pad = self.get(pads.pop(), "pad")
        if pad is None or len(pad.inputs) != 2:
            return False
        zero = literal_value(self.producer, pad.inputs[1], ("broadcast_in_dim", "reshape"))
        cfg = [tuple(c) for c in pad.params["padding_config"]]
        if zero is None or zero.size != 1 or float(zero.flat[0]) != 0.0 or \
                cfg != [(n, 0, 0) if j == d else (0, 0, 0) for j in range(len(cfg))]:
            return False
        return self.totals(pad.inputs[0], scanned, a, b)


def fold_two_level_scans(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite each two-level scan of g (see the module docstring) as the reshape of
    one cumsum, into the add's own tensor; ops left unread are dropped. True if any."""
    producer = g.producer()
    m = _Match(g, producer)
    found = {op.id: hit for op in g.ops for hit in [m.scan(op)] if hit is not None}
    if not found:
        return False
    unused = _unused(g)
    ops: list[Op] = []
    b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=ops), ids)
    for op in g.ops:
        if op.id not in found:
            ops.append(op)
            continue
        x, d = found[op.id]
        dtype = g.tensors[op.output].dtype
        t = producer.get(x)
        if t is not None and t.kind == "transpose":   # cumsum(transpose(y, p), d) =
            perm = tuple(t.params["permutation"])      # transpose(cumsum(y, p[d]), p)
            y = t.inputs[0]
            inner = b.op("cumsum", [y], m.shape(y), dtype, {"axis": perm[d], "reverse": False},
                         op.loc, op.name)
            whole = b.op("transpose", [inner], m.shape(x), dtype, {"permutation": perm},
                         op.loc, op.name)
        else:
            whole = b.op("cumsum", [x], m.shape(x), dtype, {"axis": d, "reverse": False},
                         op.loc, op.name)
        b.op("reshape", [whole], m.shape(op.output), dtype, {}, op.loc, op.name, op.output)
    g.ops[:] = ops
    _drop_newly_dead(g, unused)
    return True
