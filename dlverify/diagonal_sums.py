"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier` runs
`diagonal_sum` in its pass): a sum that keeps only the diagonal of two dims of equal
size is that diagonal, and the diagonal of a dot whose two dims come one from each
operand is the dot batched over them.

XLA computes a convolution with batch groups (the kernel gradient of a depthwise
convolution: each channel's kernel reads that channel's batch) as the convolution
without groups, every channel against every channel, then keeps the diagonal: a
select of the result where the two channel indices are equal (an eq of two iotas),
zeros elsewhere, summed over one of the two channel dims (a reduce-window over the
group dim). The program's convolution (dlverify/conv_lowering.py) is one dot per
output position, batched over the channel. So

    sum over a of select(iota_a == iota_b, X, 0) = diag(X; a, b)

with diag(X; a, b) the elements of X whose indices along a and b are equal, X's dim a
dropped and the common index at b's place. The diagonal then moves into X's producer:

* diag(dot(l, r)), a a free dim of one operand and b of the other, is the dot with
  those two dims batched as well (their sizes are equal), transposed to X's layout
  less dim a;
* diag(concat(x_i; k)) for k neither a nor b is concat(diag(x_i); k);
* diag(reshape(x)), the reshape only moving size-1 dims, is the reshape of x's
  diagonal over the same two sized dims; diag(transpose(x)) is the transpose of x's
  diagonal over the dims the transpose takes a and b from.

Anything else under the select leaves the sum as it is. Each is an identity over the
reals for every input (a select writes exact zeros: no 0 * x); tests/test_diagonal_sums.py
checks each numerically through the shared evaluator, and where it must not fire.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier

_DEPTH = 64     # producers followed at most under one diagonal


def diagonal_sum(s: "_Simplifier", op: Op) -> bool:
    """Whether `op`, a sum over the diagonal mask of two dims (module docstring), was
    replaced by the diagonal."""
    if op.kind != "reduce_sum" or len(op.inputs) != 1:
        return False
    y = op.inputs[0]
    sel, at = y, list(range(len(s.shape(y))))       # at[d]: sel's dim for y's sized dim d
    r = s.producer.get(y)
    if r is not None and r.kind == "reshape" and _sized(s.shape(r.inputs[0])) == _sized(s.shape(y)):
        sel = r.inputs[0]
        sized_sel = [d for d, n in enumerate(s.shape(sel)) if n != 1]
        sized_y = [d for d, n in enumerate(s.shape(y)) if n != 1]
        at = [-1] * len(s.shape(y))
        for dy, ds in zip(sized_y, sized_sel):
            at[dy] = ds
    pick = s.producer.get(sel)
    if pick is None or pick.kind != "select_n" or len(pick.inputs) != 3 \
            or s.splat(pick.inputs[1]) != 0.0:
        return False
    dims = _diagonal_mask(s, pick.inputs[0], s.shape(sel))
    if dims is None:
        return False
    reduced = {at[d] for d in op.params["axes"] if at[d] >= 0}
    a, b = dims if dims[0] in reduced else (dims[1], dims[0])
    if a not in reduced:
        return False
    x = pick.inputs[2]
    if not _diagonal_ok(s, x, a, b, 0):
        return False
    v = _diagonal(s, x, a, b, op)
    rest = tuple(sorted(d - (d > a) for d in reduced if d != a))
    dtype = s.g.tensors[op.output].dtype
    kept = tuple(n for d, n in enumerate(s.shape(v)) if d not in rest)
    if rest:
        v = s.new_op("reduce_sum", [v], kept, dtype, {"axes": rest}, op)
    if kept == s.shape(op.output):
        return s.fold(op, v)
    s.new_op("reshape", [v], s.shape(op.output), dtype, {}, op, output=op.output)
    return True


def _sized(shape: tuple[int, ...]) -> list[int]:
    return [n for n in shape if n != 1]


def _diagonal_mask(s: "_Simplifier", m: int, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(p, q) when m is iota_p == iota_q over `shape`: true exactly where the indices
    along dims p and q (of one size, above 1) are equal."""
    e = s.producer.get(m)
    if e is None or e.kind != "eq" or len(e.inputs) != 2:
        return None
    dims = [_iota_dim(s, t, shape) for t in e.inputs]
    if None in dims or dims[0] == dims[1] or shape[dims[0]] != shape[dims[1]] \
            or shape[dims[0]] < 2:
        return None
    return dims[0], dims[1]


def _iota_dim(s: "_Simplifier", t: int, shape: tuple[int, ...]) -> int | None:
    """The dim d when t (of `shape`) holds the index along d at every position: an
    iota along d, or a one-dim iota broadcast along d."""
    if s.shape(t) != shape:
        return None
    e = s.producer.get(t)
    if e is not None and e.kind == "iota":
        return int(e.params["dimension"])
    if e is None or e.kind != "broadcast_in_dim" or len(e.inputs) != 1:
        return None
    i = s.producer.get(e.inputs[0])
    dims = tuple(e.params["broadcast_dimensions"])
    if i is None or i.kind != "iota" or len(dims) != 1 or int(i.params["dimension"]) != 0:
        return None
    return dims[0]


def _diagonal_ok(s: "_Simplifier", x: int, a: int, b: int, depth: int) -> bool:
    """Whether `_diagonal` can build diag(x; a, b) (the forms of the module docstring)."""
    e = s.producer.get(x)
    if e is None or depth > _DEPTH:
        return False
    if e.kind == "dot_general" and len(e.inputs) == 2:
        sides = _free_sides(s, e)
        return {sides[a][0], sides[b][0]} == {0, 1}
    if e.kind == "concatenate":
        return e.params["dimension"] not in (a, b) and \
            all(_diagonal_ok(s, p, a, b, depth + 1) for p in e.inputs)
    if e.kind == "reshape" and len(e.inputs) == 1:
        moved = _unit_moves(s.shape(e.inputs[0]), s.shape(x))
        return moved is not None and _diagonal_ok(s, e.inputs[0], moved[a], moved[b], depth + 1)
    if e.kind == "transpose" and len(e.inputs) == 1:
        perm = e.params["permutation"]
        return _diagonal_ok(s, e.inputs[0], perm[a], perm[b], depth + 1)
    return False


def _free_sides(s: "_Simplifier", d: Op) -> list[tuple[int, int]]:
    """For each dim of dot d's result: (-1, batch index) for a batch dim, (0, lhs dim)
    or (1, rhs dim) for a free dim."""
    p = d.params
    out = [(-1, k) for k in range(len(p["lhs_batch"]))]
    for side, key in ((0, "lhs"), (1, "rhs")):
        rank = len(s.shape(d.inputs[side]))
        out += [(side, j) for j in range(rank)
                if j not in p[f"{key}_batch"] and j not in p[f"{key}_contract"]]
    return out


def _unit_moves(src: tuple[int, ...], to: tuple[int, ...]) -> list[int] | None:
    """For a reshape from src to `to` that only moves size-1 dims: for each sized dim of
    `to`, the dim of src it is (-1 for size-1 dims); else None."""
    if _sized(src) != _sized(to):
        return None
    sized_src = iter(d for d, n in enumerate(src) if n != 1)
    return [next(sized_src) if n != 1 else -1 for n in to]


def _diagonal(s: "_Simplifier", x: int, a: int, b: int, like: Op) -> int:
    """diag(x; a, b): x less dim a, x's elements whose indices along a and b are
    equal, the index at b's place (checked by `_diagonal_ok`)."""
    e = s.producer[x]
    shape = s.shape(x)
    vshape = tuple(n for d, n in enumerate(shape) if d != a)
    dtype = s.g.tensors[x].dtype
    if e.kind == "concatenate":
        pieces = [_diagonal(s, p, a, b, like) for p in e.inputs]
        k = e.params["dimension"]
        return s.new_op("concatenate", pieces, vshape, dtype, {"dimension": k - (k > a)}, e)
    if e.kind == "reshape":
        moved = _unit_moves(s.shape(e.inputs[0]), shape)
        inner = _diagonal(s, e.inputs[0], moved[a], moved[b], like)
        return s.new_op("reshape", [inner], vshape, dtype, {}, e)
    if e.kind == "transpose":
        perm = list(e.params["permutation"])
        inner = _diagonal(s, e.inputs[0], perm[a], perm[b], like)
        pa = perm[a]
        order = [perm[k] - (perm[k] > pa) for k in range(len(shape)) if k != a]
        return _transposed(s, inner, order, vshape, dtype, e)
    # a dot: the two free dims batched as well
    p = e.params
    sides = _free_sides(s, e)
    lhs_dim = sides[a][1] if sides[a][0] == 0 else sides[b][1]
    rhs_dim = sides[a][1] if sides[a][0] == 1 else sides[b][1]
    q = dict(p)
    q["lhs_batch"] = tuple(p["lhs_batch"]) + (lhs_dim,)
    q["rhs_batch"] = tuple(p["rhs_batch"]) + (rhs_dim,)
    nb = len(p["lhs_batch"])
    # the new dot's result dims, each as the dim of x it is (b for the new batch dim)
    labels = list(range(nb)) + [b] + [k for k in range(nb, len(shape)) if k not in (a, b)]
    dshape = tuple(shape[k] for k in labels)
    d = s.new_op("dot_general", list(e.inputs), dshape, dtype, q, e)
    order = [labels.index(k) for k in range(len(shape)) if k != a]
    return _transposed(s, d, order, vshape, dtype, e)


def _transposed(s: "_Simplifier", t: int, order: list[int], shape: tuple[int, ...], dtype: str,
                like: Op) -> int:
    """t transposed so that its dim order[k] is dim k (t itself for the identity)."""
    if order == list(range(len(order))):
        return t
    return s.new_op("transpose", [t], shape, dtype, {"permutation": tuple(order)}, like)


__all__ = ["diagonal_sum"]
