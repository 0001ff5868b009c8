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
size-1 dim of the other operand (of the pair): the sum of size-1 slices along j
is a contraction over j. The merged dot, read as it is (its first contracted
pair the micro-batch one), meets the next micro-batch's dot the same way (the
accumulation of three or more micro-batches), also through a reshape that only
inserts or deletes size-1 dims of either.

Each dot is compared in one normal form whatever its operands' layout and its
transient size-1 dims: operands in the standard order (lhs: batch, free,
contracted; rhs: batch, contracted, free), size-1 free dims and size-1 batch
pairs deleted. The partitioner's micro-batch i is a dot batched over a size-1
micro-batch dim ([1, d, b] against [1, b, f]), the merge of the earlier ones
contracts [d, m, b] against [m, b, f]; the unit-dim rules of simplify_forms.py
pass a dot through [1, d, 1, f] on the way: all read alike.

Only where both operands of an add are dots (or such reshapes of dots) related
by one contracted pair, one of them lifted from a size-1 output dim: a size-1
dim alone is ambiguous (a batch of one group on a rank is a batch dim:
simplify_forms.py), a sum over it is not. Dots of equal shapes with no size-1
dim are left alone (which pair to concatenate along is then a choice, and the
partial rules relate such sums of adjacent ranges already: datalog/partials.dl).

`summed_accumulation`: XLA's unrolled scan over a sharded batch completes each
micro-batch's weight gradient by its own all-reduce before adding it to the
accumulator; psum(x) + psum(y) over the same groups is psum(x + y), taken where
x + y is such a sum of micro-batch dots, so the merged contraction is summed once.

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
both graphs alike; tests/test_simplify_accumulate.py and
tests/test_accumulate_layouts.py check them numerically and where they must not fire.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


Pair = tuple[int, int]
Shape = tuple[int, ...]


@dataclass(frozen=True)
class _Form:
    """A dot's dimension numbers over its operands' shapes: the batch and contracted
    pairs (lhs dim, rhs dim), in pair order."""

    shapes: tuple[Shape, Shape]
    batch: tuple[Pair, ...]
    contract: tuple[Pair, ...]

    def free(self, side: int) -> list[int]:
        used = {p[side] for p in self.batch + self.contract}
        return [d for d in range(len(self.shapes[side])) if d not in used]

    def out(self) -> Shape:
        """The result shape: batch dims, then the lhs's free dims, then the rhs's."""
        l, r = self.shapes
        return tuple([l[a] for a, _ in self.batch] + [l[d] for d in self.free(0)]
                     + [r[d] for d in self.free(1)])

    def params(self) -> dict:
        return {"lhs_batch": tuple(a for a, _ in self.batch),
                "rhs_batch": tuple(b for _, b in self.batch),
                "lhs_contract": tuple(a for a, _ in self.contract),
                "rhs_contract": tuple(b for _, b in self.contract)}


def _renumbered(form: _Form, keep: tuple[list[int], list[int]],
                shapes: tuple[Shape, Shape]) -> _Form:
    """`form` over operands whose dims are `keep[side]` of the old ones (in that
    order), of shapes `shapes`; pairs of dims not kept are dropped."""
    new = [{d: i for i, d in enumerate(k)} for k in keep]

    def pairs(ps):
        return tuple((new[0][a], new[1][b]) for a, b in ps if a in new[0] and b in new[1])
    return _Form(shapes, pairs(form.batch), pairs(form.contract))


@dataclass(frozen=True)
class _Reading:
    """A dot read as a contraction whose first contracted pair is the micro-batch
    pair, in a normal form that does not depend on how its operands were laid
    out: each operand (`ins`) reshaped to `shapes` (a size-1 dim inserted for a
    lifted free dim, size-1 free dims and size-1 batch pairs deleted: a reshape
    of size-1 dims only), then transposed by `perm` to the standard order (lhs:
    batch, free, contracted; rhs: batch, contracted, free; batch and contracted
    dims in pair order, free dims in their own, as simplify.py's dot_layout puts
    them). The dot of `form` over the operands so moved is the same tensor up to
    its size-1 dims (`form.out()` holds the sized dims of the dot's result in
    their order). `lifted`: whether the micro-batch pair is a size-1 output dim
    lifted into a contraction (else the dot as it is, the merge of earlier
    micro-batches: it pairs only with a lifted dot)."""

    ins: tuple[int, int]
    shapes: tuple[Shape, Shape]
    perm: tuple[Shape, Shape]
    form: _Form
    lifted: bool


def accumulate_forms(s: "_Simplifier", op: Op) -> bool:
    """Whether one of this module's rules replaced `op` (in `s`'s pass)."""
    return accumulated_dots(s, op) or summed_accumulation(s, op) \
        or unit_reshapes_around_transpose(s, op)


def _form(s: "_Simplifier", dot: Op) -> _Form:
    p = dot.params
    return _Form((s.shape(dot.inputs[0]), s.shape(dot.inputs[1])),
                 tuple(zip(p["lhs_batch"], p["rhs_batch"])),
                 tuple(zip(p["lhs_contract"], p["rhs_contract"])))


def _insert_unit(form: _Form, side: int) -> _Form:
    """`form` with a size-1 dim inserted at position 0 of operand `side`."""
    shapes = list(form.shapes)
    shapes[side] = (1,) + shapes[side]

    def sh(ps):
        return tuple((a + 1, b) if side == 0 else (a, b + 1) for a, b in ps)
    return _Form((shapes[0], shapes[1]), sh(form.batch), sh(form.contract))


def _lift(form: _Form, j: int) -> _Form:
    """`form` with its size-1 output dim j contracted first: a batch pair, or a free
    dim of one operand against a size-1 dim inserted into the other."""
    nb, lfree, rfree = len(form.batch), form.free(0), form.free(1)
    if j < nb:
        return _Form(form.shapes, form.batch[:j] + form.batch[j + 1:],
                     (form.batch[j],) + form.contract)
    if j < nb + len(lfree):
        f = _insert_unit(form, 1)
        return _Form(f.shapes, f.batch, ((lfree[j - nb], 0),) + f.contract)
    f = _insert_unit(form, 0)
    return _Form(f.shapes, f.batch, ((0, rfree[j - nb - len(lfree)]),) + f.contract)


def _squeezed(form: _Form) -> _Form:
    """`form` without its size-1 batch pairs and size-1 free dims (neither moves an
    element of the result); the contracted pairs stay, the micro-batch one first."""
    drop = ({a for a, _ in form.batch if form.shapes[0][a] == 1}
            | {d for d in form.free(0) if form.shapes[0][d] == 1},
            {b for a, b in form.batch if form.shapes[0][a] == 1}
            | {d for d in form.free(1) if form.shapes[1][d] == 1})
    keep = tuple([d for d in range(len(form.shapes[side])) if d not in drop[side]]
                 for side in (0, 1))
    shapes = tuple(tuple(form.shapes[side][d] for d in keep[side]) for side in (0, 1))
    return _renumbered(form, (keep[0], keep[1]), (shapes[0], shapes[1]))


def _standard(form: _Form) -> tuple[tuple[Shape, Shape], _Form]:
    """The permutations taking each operand to the standard order, and `form` over
    the permuted operands."""
    perms = []
    for side in (0, 1):
        batch = [p[side] for p in form.batch]
        contract = [p[side] for p in form.contract]
        free = form.free(side)
        perms.append(batch + (free + contract if side == 0 else contract + free))
    shapes = tuple(tuple(form.shapes[side][d] for d in perms[side]) for side in (0, 1))
    moved = _renumbered(form, (perms[0], perms[1]), (shapes[0], shapes[1]))
    return (tuple(perms[0]), tuple(perms[1])), moved


def _reading(ins: tuple[int, int], form: _Form, lifted: bool) -> _Reading:
    squeezed = _squeezed(form)
    perm, std = _standard(squeezed)
    return _Reading(ins, squeezed.shapes, perm, std, lifted)


def _readings(s: "_Simplifier", t: int) -> list[_Reading]:
    """The ways operand t of an add reads as a dot with a micro-batch pair: t is a
    dot, or a reshape that only inserts or deletes size-1 dims of a dot's result
    (the partitioner's [1, d, f] -> [d, f] before its all-reduce); the dot with a
    size-1 output dim j lifted (one reading per such j), or as it is when it
    contracts something (its first contracted pair the one lifted before)."""
    op = s.producer.get(t)
    if op is not None and op.kind == "reshape" \
            and _sized_dims(s.shape(op.inputs[0])) == _sized_dims(s.shape(t)):
        op = s.producer.get(op.inputs[0])
    if op is None or op.kind != "dot_general" or len(op.inputs) != 2:
        return []
    form, ins = _form(s, op), (op.inputs[0], op.inputs[1])
    out = s.shape(op.output)
    found = [_reading(ins, _lift(form, j), True) for j, n in enumerate(out) if n == 1]
    if form.contract:
        found.append(_reading(ins, form, False))
    return found


def _paired(s: "_Simplifier", a: _Reading, b: _Reading) -> bool:
    """The two dots agree in every operand dim but their micro-batch pair (one of
    them lifted)."""
    if not (a.lifted or b.lifted) or a.form.batch != b.form.batch \
            or a.form.contract != b.form.contract or not a.form.contract:
        return False
    for side in (0, 1):
        sx, sy = a.form.shapes[side], b.form.shapes[side]
        m = a.form.contract[0][side]
        if len(sx) != len(sy) or any(u != v for d, (u, v) in enumerate(zip(sx, sy)) if d != m) \
                or s.g.tensors[a.ins[side]].dtype != s.g.tensors[b.ins[side]].dtype:
            return False
    return True


def _sized_dims(shape: Shape) -> list[int]:
    """The sizes of `shape`'s dims that are not size 1, in order."""
    return [n for n in shape if n != 1]


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


def _accumulates(s: "_Simplifier", x: int, y: int) -> bool:
    """x + y is a sum of micro-batch dots that accumulated_dots merges."""
    return any(_paired(s, a, b) for a in _readings(s, x) for b in _readings(s, y))


def summed_accumulation(s: "_Simplifier", op: Op) -> bool:
    """add(all_reduce(x), all_reduce(y)) as all_reduce(add(x, y)) when both sum over
    the same groups and x + y is a sum of micro-batch dots (accumulated_dots then
    merges it): on every rank the sum over its group of x plus that of y is the sum
    over the group of x + y. The partitioner completes each micro-batch's weight
    gradient by its own all-reduce before adding it to the accumulator (a scan over
    micro-batches whose rows it shards), while the sequential program adds the
    micro-batch dots, which the normal form merges into one contraction over
    (micro-batch, rows); the rank's terms of the merged dot are one range of its
    rows. dlverify/collective_sums.py splits the other way only the sums of
    different reductions, never a micro-batch accumulation, so the two never undo
    each other."""
    if op.kind != "add" or len(op.inputs) != 2 or op.inputs[0] == op.inputs[1]:
        return False
    ars = [s.producer.get(t) for t in op.inputs]
    if any(ar is None or ar.kind != "all_reduce" or len(ar.inputs) != 1 for ar in ars) \
            or ars[0].params.get("reducer") != "sum" or ars[0].params != ars[1].params:
        return False
    x, y = ars[0].inputs[0], ars[1].inputs[0]
    out = s.g.tensors[op.output]
    if any(s.shape(t) != out.shape or s.g.tensors[t].dtype != out.dtype for t in (x, y)) \
            or not _accumulates(s, x, y):
        return False
    total = s.new_op("add", [x, y], out.shape, out.dtype, {}, op)
    s.new_op("all_reduce", [total], out.shape, out.dtype, ars[0].params, ars[0], output=op.output)
    return True


def _keeps_order(perm: Shape, shape: Shape) -> bool:
    """Whether transposing `shape` by `perm` keeps its sized dims in their order (it
    moves size-1 dims only: the same elements in the same row-major order)."""
    sized = [d for d in perm if shape[d] != 1]
    return sized == sorted(sized)


def _unit_source(s: "_Simplifier", t: int) -> int:
    """The tensor t is a reshape of through reshapes and transposes that only move,
    insert or delete size-1 dims (a dot's transient unit-dim forms)."""
    while True:
        op = s.producer.get(t)
        if op is None or op.kind not in ("reshape", "transpose") \
                or _sized_dims(s.shape(op.inputs[0])) != _sized_dims(s.shape(t)) \
                or (op.kind == "transpose"
                    and not _keeps_order(op.params["permutation"], s.shape(op.inputs[0]))):
            return t
        t = op.inputs[0]


def _operand(s: "_Simplifier", r: _Reading, side: int, like: Op) -> int:
    """Operand `side` of the reading: reshaped (size-1 dims only), then permuted to
    the standard order; or the tensor it only moves size-1 dims of, when that
    tensor has the standard shape already (the merge then reads the value the
    other program's micro-batches have, not a transient unit-dim form of it)."""
    t = r.ins[side]
    dtype = s.g.tensors[t].dtype
    if _keeps_order(r.perm[side], r.shapes[side]):
        src = _unit_source(s, t)
        if s.shape(src) == r.form.shapes[side]:
            return src
    if s.shape(t) != r.shapes[side]:
        t = s.new_op("reshape", [t], r.shapes[side], dtype, {}, like)
    if r.perm[side] == tuple(range(len(r.perm[side]))):
        return t
    return s.new_op("transpose", [t], r.form.shapes[side], dtype,
                    {"permutation": r.perm[side]}, like)


def _emit(s: "_Simplifier", op: Op, a: _Reading, b: _Reading) -> bool:
    """`op` as the dot of a's and b's operands concatenated along the micro-batch
    pair, reshaped to op's shape (its size-1 dims put back)."""
    dtype = s.g.tensors[op.output].dtype
    ins = []
    for side in (0, 1):
        m = a.form.contract[0][side]
        x, y = _operand(s, a, side, op), _operand(s, b, side, op)
        shape = tuple(u + v if d == m else u
                      for d, (u, v) in enumerate(zip(s.shape(x), s.shape(y))))
        ins.append(s.new_op("concatenate", [x, y], shape, s.g.tensors[x].dtype, {"dimension": m},
                            op))
    if a.form.out() == s.shape(op.output):
        s.new_op("dot_general", ins, a.form.out(), dtype, a.form.params(), op, output=op.output)
        return True
    total = s.new_op("dot_general", ins, a.form.out(), dtype, a.form.params(), op)
    s.new_op("reshape", [total], s.shape(op.output), dtype, {}, op, output=op.output)
    return True


__all__ = ["accumulate_forms", "accumulated_dots", "summed_accumulation",
           "unit_reshapes_around_transpose"]
