"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs `accumulate_forms` in its pass): micro-batch gradients accumulated by adds
are one contraction over (micro-batch, rows).

A sequential weight gradient contracts a batch of rows; a program that splits it
into M micro-batches (a scan or loop over a stacked (M, B/M, ...) batch, each
micro-batch's rows sharded over the ranks) adds M dots, each contracting its
micro-batch's rows. On a sequential graph the normal form contracts the batch as
the pair (micro-batch, rows) (simplify.py: split_contraction); on the
distributed one each micro-batch is a slice of size 1 along the micro-batch dim,
which the dot keeps as a size-1 free dim (simplify_forms.py: unit_dims_into_dot)
or batches over (unit_dims_batched). A rank's terms are then not one range of
the sequential contraction's rows. The identity

    dot(A0, B0) + dot(A1, B1) = dot(concat(A0, A1; l), concat(B0, B1; k))

for dots with the same dimension numbers whose operands agree in every dim
but the contracted pair (l, k) (concatenated along it) makes the sum one dot
whose micro-batch pair the rank holds whole: its rows are the one partial range
left. A dot whose output has a size-1 dim j (a free dim of one operand, or a
batch pair of size 1) is first read as the dot contracting that dim with a new
size-1 dim of the other operand (of the pair), its output reshaped to insert j
back: the sum of size-1 slices along j is a contraction over j. A sum whose
operand is such a reshaped dot (the accumulation of three or more micro-batches)
meets the next dot the same way.

Only where both operands of an add are dots (or such reshapes of dots) related
by one contracted pair, lifted from the same output dim j: a size-1 dim alone is
ambiguous (a batch of one group on a rank is a batch dim: simplify_forms.py), a
sum over it is not. Dots of equal shapes with no size-1 dim are left alone (which
pair to concatenate along is then a choice, and the partial rules relate such
sums of adjacent ranges already: datalog/partials.dl).

The lifted lhs of the compiled micro-batch reads reshape(transpose(reshape(x))),
XLA having deleted x's size-1 micro-batch dim before transposing the rows:
`unit_reshapes_around_transpose` writes a transpose between reshapes that only
delete and insert size-1 dims as one transpose of x, so the concatenated
micro-batches meet the sequential transpose of the whole stack.

This is a rewrite rather than Datalog partial-term families: the per-rank terms
of the sum (micro-batch i, rows of rank r) are interleaved ranges of the flattened
(micro-batch, rows) family, which a re-indexing of blocks (partials.dl, Tag_Trans*)
would have to encode over a flattened pair; as one dot, the rank holds the
micro-batch pair whole and its rows' range is a plain partial term (contraction.dl).

Each an identity of real arithmetic or data movement for every input, applied to
both graphs alike; tests/test_simplify_accumulate.py checks them numerically and
where they must not fire.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


@dataclass(frozen=True)
class _Lifted:
    """A dot read with its micro-batch pair first among its contracted pairs: the
    operands, whether one gets a size-1 dim inserted first (side, position), the
    dimension numbers, the output shape and the output dim j it was lifted from."""

    ins: tuple[int, int]
    insert: tuple[int, int] | None
    params: dict
    out: tuple[int, ...]
    j: int

    def shape(self, s: "_Simplifier", side: int) -> tuple[int, ...]:
        shape = s.shape(self.ins[side])
        if self.insert is None or self.insert[0] != side:
            return shape
        pos = self.insert[1]
        return shape[:pos] + (1,) + shape[pos:]


def accumulate_forms(s: "_Simplifier", op: Op) -> bool:
    """Whether one of this module's rules replaced `op` (in `s`'s pass)."""
    return accumulated_dots(s, op) or unit_reshapes_around_transpose(s, op)


def _shifted(dims, pos: int) -> tuple[int, ...]:
    """Dim numbers after a dim was inserted at `pos`."""
    return tuple(d + 1 if d >= pos else d for d in dims)


def _lift(s: "_Simplifier", dot: Op, j: int) -> _Lifted:
    """`dot` with its size-1 output dim j contracted: a batch pair, or a free dim of
    one operand against a size-1 dim inserted into the other before its contracted
    dims."""
    p = dot.params
    out = s.shape(dot.output)
    lhs, rhs = dot.inputs
    lb, rb = list(p["lhs_batch"]), list(p["rhs_batch"])
    lc, rc = tuple(p["lhs_contract"]), tuple(p["rhs_contract"])
    nb = len(lb)
    lrank, rrank = len(s.shape(lhs)), len(s.shape(rhs))
    lfree = [d for d in range(lrank) if d not in lb and d not in lc]
    rfree = [d for d in range(rrank) if d not in rb and d not in rc]
    q = dict(p)
    insert = None
    if j < nb:
        bl, br = lb.pop(j), rb.pop(j)
        q["lhs_batch"], q["rhs_batch"] = tuple(lb), tuple(rb)
        q["lhs_contract"], q["rhs_contract"] = (bl,) + lc, (br,) + rc
    elif j < nb + len(lfree):
        pos = nb                                  # rhs order: batch, contracted, free
        insert = (1, pos)
        q["rhs_batch"] = _shifted(rb, pos)
        q["lhs_contract"] = (lfree[j - nb],) + lc
        q["rhs_contract"] = (pos,) + _shifted(rc, pos)
    else:
        pos = lrank - len(lc)                     # lhs order: batch, free, contracted
        insert = (0, pos)
        q["lhs_batch"] = _shifted(lb, pos)
        q["lhs_contract"] = (pos,) + _shifted(lc, pos)
        q["rhs_contract"] = (rfree[j - nb - len(lfree)],) + rc
    return _Lifted((lhs, rhs), insert, q, out[:j] + out[j + 1:], j)


def _readings(s: "_Simplifier", t: int) -> list[_Lifted]:
    """The ways operand t of an add reads as a dot with a micro-batch pair: a dot
    with a size-1 output dim j, lifted; or a reshape inserting one size-1 dim j
    into a dot's result, that dot as it is (its first contracted pair the one
    lifted before)."""
    op = s.producer.get(t)
    if op is None:
        return []
    if op.kind == "dot_general" and len(op.inputs) == 2:
        return [_lift(s, op, j) for j, n in enumerate(s.shape(t)) if n == 1]
    if op.kind != "reshape":
        return []
    dot = s.producer.get(op.inputs[0])
    src, to = s.shape(op.inputs[0]), s.shape(t)
    if dot is None or dot.kind != "dot_general" or len(dot.inputs) != 2 \
            or not dot.params["lhs_contract"] or len(to) != len(src) + 1:
        return []
    return [_Lifted((dot.inputs[0], dot.inputs[1]), None, dict(dot.params), src, j)
            for j in range(len(to)) if to[j] == 1 and to[:j] + to[j + 1:] == src][:1]


def _paired(s: "_Simplifier", a: _Lifted, b: _Lifted) -> bool:
    """The two dots agree in every operand dim but their micro-batch pair."""
    if a.params != b.params or a.out != b.out or a.j != b.j:
        return False
    for side, key in ((0, "lhs"), (1, "rhs")):
        sx, sy = a.shape(s, side), b.shape(s, side)
        m = a.params[f"{key}_contract"][0]
        if len(sx) != len(sy) or any(u != v for d, (u, v) in enumerate(zip(sx, sy)) if d != m) \
                or s.g.tensors[a.ins[side]].dtype != s.g.tensors[b.ins[side]].dtype:
            return False
    return True


def _sized(shape: tuple[int, ...]) -> list[int]:
    """The dims of `shape` that are not size 1."""
    return [d for d, n in enumerate(shape) if n != 1]


def unit_reshapes_around_transpose(s: "_Simplifier", op: Op) -> bool:
    """reshape(transpose(reshape(x))), both reshapes only deleting or inserting
    size-1 dims and the result holding as many size-1 dims as x, is one transpose
    of x: its sized dims in the order the transpose puts them, its size-1 dims
    where the result has them (the i-th size-1 dim of the result is x's i-th; they
    hold one index each, so any assignment is the same element order). The lifted
    micro-batch dot reads a micro-batch so: XLA deleted its size-1 micro-batch dim
    and transposed the rows, the pair puts one back next to them."""
    if op.kind != "reshape":
        return False
    t = s.producer.get(op.inputs[0])
    r = None if t is None or t.kind != "transpose" else s.producer.get(t.inputs[0])
    if r is None or r.kind != "reshape":
        return False
    x = r.inputs[0]
    sx, mid, out = s.shape(x), s.shape(r.output), s.shape(op.output)
    if [sx[d] for d in _sized(sx)] != [mid[d] for d in _sized(mid)] \
            or len(out) != len(sx) or out.count(1) != sx.count(1) \
            or s.g.tensors[x].dtype != s.g.tensors[op.output].dtype:
        return False
    perm = t.params["permutation"]
    moved = [_sized(mid).index(perm[k]) for k in _sized(s.shape(t.output))]  # sized dims, in order
    xs, units = _sized(sx), [d for d, n in enumerate(sx) if n == 1]
    if [s.shape(t.output)[k] for k in _sized(s.shape(t.output))] != [out[d] for d in _sized(out)]:
        return False
    order, it_sized, it_units = [], iter(moved), iter(units)
    for n in out:
        order.append(next(it_units) if n == 1 else xs[next(it_sized)])
    s.new_op("transpose", [x], out, s.g.tensors[x].dtype, {"permutation": tuple(order)}, op,
             output=op.output)
    return True


def accumulated_dots(s: "_Simplifier", op: Op) -> bool:
    """add(dot(A0, B0), dot(A1, B1)) as one dot of the operands concatenated along
    their micro-batch pair (see the module docstring); True when it replaced `op`."""
    if op.kind != "add" or len(op.inputs) != 2 or op.inputs[0] == op.inputs[1]:
        return False
    for a in _readings(s, op.inputs[0]):
        for b in _readings(s, op.inputs[1]):
            if _paired(s, a, b):
                return _emit(s, op, a, b)
    return False


def _operand(s: "_Simplifier", r: _Lifted, side: int, like: Op) -> int:
    """Operand `side` of the lifted dot (reshaped when it gets the size-1 dim)."""
    t = r.ins[side]
    if r.insert is None or r.insert[0] != side:
        return t
    return s.new_op("reshape", [t], r.shape(s, side), s.g.tensors[t].dtype, {}, like)


def _emit(s: "_Simplifier", op: Op, a: _Lifted, b: _Lifted) -> bool:
    """`op` as the dot of a's and b's operands concatenated along the micro-batch
    pair, reshaped to op's shape (the lifted dim j inserted back)."""
    dtype = s.g.tensors[op.output].dtype
    ins = []
    for side, key in ((0, "lhs"), (1, "rhs")):
        m = a.params[f"{key}_contract"][0]
        x, y = _operand(s, a, side, op), _operand(s, b, side, op)
        shape = tuple(u + v if d == m else u
                      for d, (u, v) in enumerate(zip(s.shape(x), s.shape(y))))
        ins.append(s.new_op("concatenate", [x, y], shape, s.g.tensors[x].dtype, {"dimension": m},
                            op))
    total = s.new_op("dot_general", ins, a.out, dtype, a.params, op)
    s.new_op("reshape", [total], s.shape(op.output), dtype, {}, op, output=op.output)
    return True


__all__ = ["accumulate_forms", "accumulated_dots", "unit_reshapes_around_transpose"]
