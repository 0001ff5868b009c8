"""Softmax in canonical form: an exact rewrite (over the reals) run on both graphs.

Frameworks subtract whatever per-row value is at hand before the exponential:
the row max, a `pmax` of local maxima, a stale running max, a constant. For any
k constant along the normalised axis a,

    exp(x - k) / sum_a exp(x - k)  =  exp(x) / sum_a exp(x)  =  softmax_a(x),

so the value does not depend on k. Written out, the two programs differ in k and
no op-by-op rule can relate `exp(x - k)` to `exp(x - m)`. This pass replaces the
division that ends a softmax by one `softmax` op over `x` (dlverify/ops/
structural.py computes it), on both sides, and also the form attention uses,
where the normalisation follows the product with V:

    dot(exp(x - k), v; contracting a) / sum_a exp(x - k)  =  dot(softmax_a(x), v).

Both are identities of real arithmetic for every real k that does not vary
along a; the pass checks that structurally: k reaches the subtraction only
through broadcasts that never index axis a, and k is finite for finite inputs
(dlverify/finite_values.py: `max(reduce_max(x), -inf)` is, `min(..., -inf)` is not). The sum must be exactly the one over axis a
of the same exponential, broadcast back along a. The exponential and the sum
keep their other consumers (a backward pass reads them).

One axis only: the rules relate a softmax through `Along_Axis`
(datalog/contraction.dl), which names one axis per op.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from dlverify.finite_values import FiniteValues
from dlverify.ir import Graph, IdAllocator, Op, Tensor


@dataclass(frozen=True)
class Source:
    """t[i] = src[i[dims[0]], i[dims[1]], ...] over src's dims of size > 1
    (`dims[j]`: the dim of t indexing src's j-th such dim)."""

    src: int
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Sum:
    """l = reduce_sum(exp, axes=(axis,))."""

    exp: int
    axis: int


@dataclass(frozen=True)
class Candidate:
    """A division that is a softmax: the ops replacing it, and what kind of
    softmax it is (the exponential's rank and the axis), which the other graph
    must have as often for either to be rewritten. Both forms (the softmax
    itself, and the product with V normalised after it) give a `softmax` op over
    the same x, so they pair."""

    div: Op
    ops: list[Op]
    signature: tuple[int, int]


def _big(shape: tuple[int, ...]) -> list[int]:
    return [i for i, n in enumerate(shape) if n != 1]


def _shape(g: Graph, t: int) -> tuple[int, ...]:
    return g.tensors[t].shape


def source_of(g: Graph, producer: dict[int, Op], t: int) -> Source:
    """Follow broadcasts (and reshapes that only add or drop size-1 dims) back
    to the tensor whose values `t` repeats."""
    dims = tuple(_big(_shape(g, t)))
    while True:
        op = producer.get(t)
        if op is None:
            return Source(t, dims)
        a = op.inputs[0] if op.inputs else None
        if op.kind == "broadcast_in_dim":
            bd = op.params["broadcast_dimensions"]
            # src's dims of size > 1 are a's; each is broadcast to bd[i] of t
            moved = tuple(_through(g, bd[i], dims, t) for i in _big(_shape(g, a)))
            if any(d < 0 for d in moved):   # not placed: stop here, varying along all of t
                return Source(t, dims)
            dims = moved
        elif op.kind != "reshape" or [_shape(g, a)[i] for i in _big(_shape(g, a))] != \
                [_shape(g, t)[i] for i in _big(_shape(g, t))]:
            return Source(t, dims)
        # (a reshape that only adds or drops size-1 dims keeps the big dims in order)
        t = a


def _through(g: Graph, j: int, dims: tuple[int, ...], t: int) -> int:
    """The dim of the original tensor that dim j of `t` (a size > 1 dim) sits at."""
    big = _big(_shape(g, t))
    return dims[big.index(j)] if j in big else -1


class _Softmaxes:
    def __init__(self, g: Graph, ids: IdAllocator) -> None:
        self.g = g
        self.ids = ids
        self.producer = {op.output: op for op in g.ops}
        self.finite = FiniteValues(g)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.tensors[t].shape

    def source(self, t: int) -> Source:
        return source_of(self.g, self.producer, t)

    def exp_of_shift(self, e: int, axis: int) -> int | None:
        """x, when e = exp(x) up to shifts: e = exp(x + k1 - k2 ...) with every k
        constant along `axis` and a finite real (the softmax of x - c is the softmax
        of x for a real c; a stabiliser that may be -inf makes NaNs instead)."""
        op = self.producer.get(e)
        if op is None or op.kind != "exp":
            return None
        x = op.inputs[0]
        while True:
            inner = self.producer.get(x)
            if inner is None or inner.kind not in ("sub", "add"):
                return x
            shifted = [i for i, t in enumerate(inner.inputs)
                       if self.shape(t) == self.shape(e) and (inner.kind == "add" or i == 0)
                       and axis not in self.source(inner.inputs[1 - i]).dims
                       and self.finite(inner.inputs[1 - i])]
            if not shifted:
                return x
            x = inner.inputs[shifted[0]]

    def normaliser(self, den: int, want: dict[int, int]) -> Sum | None:
        """The sum, when `den` repeats l = reduce_sum(e, axes=(a,)) with each dim i
        of e other than a (of size > 1) at dim want[i] of den."""
        src = self.source(den)
        red = self.producer.get(src.src)
        if red is None or red.kind != "reduce_sum" or len(red.params["axes"]) != 1:
            return None
        e, a = red.inputs[0], red.params["axes"][0]
        kept = [i for i in range(len(self.shape(e))) if i != a]     # l's dims, in e's order
        big_l = _big(self.shape(src.src))
        if len(src.dims) != len(big_l):
            return None
        for j, dim_of_den in zip(big_l, src.dims):
            if want.get(kept[j]) != dim_of_den:
                return None
        return Sum(e, a)

    def rewrite(self, op: Op) -> Candidate | None:
        """The ops replacing the division `op` when it is a softmax, or None."""
        num, den = op.inputs
        out_shape = self.shape(op.output)
        if self.shape(den) != out_shape or self.shape(num) != out_shape:
            return None
        nop = self.producer.get(num)
        # softmax itself: num is the exponential, with the shape of the output
        norm = self.normaliser(den, {i: i for i in range(len(out_shape))})
        if norm is not None and norm.exp == num:
            x = self.exp_of_shift(num, norm.axis)
            if x is not None:
                return Candidate(op, [Op(self.ids(), "softmax", [x], op.output, {"axis": norm.axis},
                                         op.loc, op.name)], (len(out_shape), norm.axis))
        # attention: num = dot(e, v) contracting axis a of e alone
        if nop is None or nop.kind != "dot_general":
            return None
        p = nop.params
        for side in (0, 1):
            e = nop.inputs[side]
            contract, batch = (p["lhs_contract"], p["lhs_batch"]) if side == 0 else \
                (p["rhs_contract"], p["rhs_batch"])
            if len(contract) != 1:
                continue
            free = [i for i in range(len(self.shape(e))) if i not in contract and i not in batch]
            lhs_free = len([i for i in range(len(self.shape(nop.inputs[0])))
                            if i not in p["lhs_contract"] and i not in p["lhs_batch"]])
            first_free = len(batch) + (0 if side == 0 else lhs_free)
            want = {b: k for k, b in enumerate(batch)}
            want.update({f: first_free + k for k, f in enumerate(free)})
            if self.normaliser(den, want) != Sum(e, contract[0]):
                continue
            x = self.exp_of_shift(e, contract[0])
            if x is None:
                continue
            sm = self.ids()
            self.g.tensors[sm] = Tensor(sm, self.shape(e), self.g.tensors[e].dtype, "softmax")
            ins = [sm, nop.inputs[1]] if side == 0 else [nop.inputs[0], sm]
            return Candidate(op, [Op(self.ids(), "softmax", [x], sm, {"axis": contract[0]}, op.loc, op.name),
                                  Op(self.ids(), "dot_general", ins, op.output, dict(p), nop.loc, nop.name)],
                             (len(self.shape(e)), contract[0]))
        return None

    def candidates(self) -> list[Candidate]:
        return [c for op in self.g.ops if op.kind == "div" and len(op.inputs) == 2
                for c in [self.rewrite(op)] if c is not None]

    def apply(self, chosen: list[Candidate]) -> None:
        by_div = {c.div.id: c for c in chosen}
        out: list[Op] = []
        for op in self.g.ops:
            out.extend(by_div[op.id].ops if op.id in by_div else [op])
        self.g.ops = out


def canonical_softmaxes(seq: Graph, dist: Graph, ids: IdAllocator) -> bool:
    """Replace the softmax divisions of both graphs by `softmax` ops (module doc):
    of each kind, only when both graphs have as many. A softmax normalised across
    ranks (a psum of the sums) is no candidate on the distributed side, and
    rewriting only its sequential partner would part two ops the rules relate
    today. The online softmax's merges are put in shift-free form first
    (dlverify/online_softmax.py). Returns whether anything changed; ops left
    without consumers are for the caller's dead-op pass. New tensors of candidates not taken are dropped."""
    from dlverify.online_softmax import shift_free_merges   # imports this module
    merged = [shift_free_merges(seq, ids), shift_free_merges(dist, ids)]
    s, d = _Softmaxes(seq, ids), _Softmaxes(dist, ids)
    cs, cd = s.candidates(), d.candidates()
    count = Counter(c.signature for c in cs)
    both = {sig for sig, n in Counter(c.signature for c in cd).items() if count.get(sig) == n}
    for side, cands in ((s, cs), (d, cd)):
        for c in cands:
            if c.signature not in both:
                for o in c.ops[:-1]:     # the fresh softmax tensor of the attention form
                    del side.g.tensors[o.output]
        side.apply([c for c in cands if c.signature in both])
    return bool(both) or any(merged)
