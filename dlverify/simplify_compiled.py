"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs `compiled_forms` in its pass): ops a program writes one way and XLA's
optimisations another, brought to one form.

* a dot without contraction is a product of broadcasts: `dot_general(x, y)`
  contracting no dim (operands in the standard order of `dot_layout`: batch
  dims first, then free dims) is `broadcast(x) * broadcast(y)`, each operand
  broadcast to the result along its own dims (a broadcast that maps every dim
  to itself is none): out[b, i, j] = x[b, i] * y[b, j]. An einsum that weighs
  a (t, e, c) mask by (t, e) gates (`tec,te->tec`) is such a dot; XLA writes
  it as `mask * broadcast(gate)`.
* a product of two boolean masks is a select: `p * q` for boolean p and q and
  a floating-point result is `select(q, p, 0)`, the right operand the
  predicate, as XLA writes `convert(p) * convert(q)`. Either operand could be
  the predicate (both are 0/1 values); XLA takes the right one, so this takes
  it too (a mask and a real value are `mask_product`'s, dlverify/simplify.py).
* a descending sort of a whole dim is a top_k of all of it: the IR's stable
  ascending sort keyed by `neg(x)` (`not(x)` for integers: how the HLO
  frontend lowers a descending comparator), carrying x and an iota along the
  sorted dim, gives x's values in descending order, equal values by ascending
  index, and their indices: `top_k(x, k=n)` (its sorted keys are `neg` of
  those values). XLA writes `lax.top_k` of all n elements of a dim as that
  sort; the program's top_k stays one. (XLA's total order puts +0 above -0,
  which `neg` keys tie; the reals have one zero.)
* `rsqrt(y)` is `1 / sqrt(y)`: XLA writes a normalisation's division by a square
  root as a product with rsqrt.
* a select of the boolean constants is its predicate (or the predicate's negation):
  XLA folds `select(p, true, false)` to `p`.
* a chain of reductions of one kind of a reshape, that together reduce whole groups of
  the reshape, is the one reduction of the reshape's operand over those groups: XLA's
  CPU tree reduction rewriter splits a long reduce (`sum(x, d)`, d of n > 32) into a
  reduce-window of tiles of 32 (the HLO frontend: the reduction of x reshaped to
  [.., n/32, 32, ..] over the 32s) and a reduce of the tiles' results. Not a
  general merge of two reductions: where one side sums a sharded dim, then
  all-reduces, then sums the others, its inner sums are values the other side must
  keep (a vocabulary-parallel loss); where the other side merged them (XLA's
  algebraic simplifier, with no collective between), the two stay apart.
* so a reduction over several axes is a chain of one-axis reductions, the last axis
  reduced first: `red(x, {a1 < .. < ak}) = red(..red(x, {ak})..., {a1})` (reducing a
  set in steps reduces its union; removing the highest axis first leaves the lower
  axes' numbers unchanged). The program's `sum(sum(x, -1))` (a loss: the vocabulary,
  then the batch) keeps its inner sum, and XLA's merged `sum(x, all)` (its algebraic
  simplifier folds a reduce of a reduce) computes it again, the same way round. A
  reduction of a reshape is left to the reshape rules, which read it whole.

Each is an identity of real arithmetic for every input, applied to both graphs
alike; tests/test_moe_compiled.py (the reduction of tiles: tests/test_compiled_forms.py)
checks each numerically and where it must not fire. No rule makes a dot, a
multiplication of booleans, a sort or an rsqrt; one-axis chains are merged again
only over a reshape, which the merged reduction no longer reads, so none undoes another.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlverify.ir import Op, literal_value
from dlverify.simplify_forms import _SET_REDUCTIONS, _reshape_groups

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier

# the decreasing key a descending sort is lowered with (frontends/hlo/ops/sorting.py)
_FLIPS = frozenset({"neg", "not"})


def compiled_forms(s: "_Simplifier", op: Op) -> bool:
    """Whether one of this module's rules replaced `op` (in `s`'s pass)."""
    return (dot_without_contraction(s, op) or mask_of_masks(s, op) or whole_dim_top_k(s, op)
            or rsqrt_as_reciprocal(s, op) or select_of_booleans(s, op)
            or reduction_of_tiles(s, op) or one_axis_reductions(s, op))


def _bool_splat(s: "_Simplifier", t: int) -> float | None:
    """The one value (0.0 or 1.0) a boolean constant, or a broadcast of one, holds."""
    v = literal_value(s.producer, t, ("broadcast_in_dim",))
    if v is None or v.size == 0 or v.dtype != np.bool_ or not (np.all(v) or not np.any(v)):
        return None
    return float(bool(v.flat[0]))


def select_of_booleans(s: "_Simplifier", op: Op) -> bool:
    """`select(p, true, false)` is `p` and `select(p, false, true)` is `not p`, for a
    boolean p and boolean splats (`jnp.tril(jnp.ones(..., bool))` selects them; XLA keeps
    the predicate)."""
    out = s.g.tensors[op.output]
    if op.kind != "select_n" or len(op.inputs) != 3 or out.dtype != "bool":
        return False
    p, on_false, on_true = op.inputs
    if s.g.tensors[p].dtype != "bool" or s.g.tensors[p].shape != out.shape:
        return False
    lo, hi = _bool_splat(s, on_false), _bool_splat(s, on_true)
    if (lo, hi) == (0.0, 1.0):
        return s.fold(op, p)
    if (lo, hi) == (1.0, 0.0):
        s.new_op("not", [p], out.shape, out.dtype, {}, op, output=op.output)
        return True
    return False


def rsqrt_as_reciprocal(s: "_Simplifier", op: Op) -> bool:
    """`rsqrt(y)` is `1 / sqrt(y)` (XLA writes a LayerNorm's `(x - m) / sqrt(v + eps)` as
    `(x - m) * rsqrt(v + eps)`; the reciprocal then meets `x * (1/y)` as `x / y`)."""
    out = s.g.tensors[op.output]
    if op.kind != "rsqrt" or len(op.inputs) != 1 or not out.dtype.startswith(("float", "bfloat")):
        return False
    root = s.new_op("sqrt", [op.inputs[0]], out.shape, out.dtype, {}, op)
    ones = s.splat_of(1, out.shape, out.dtype, op)
    s.new_op("div", [ones, root], out.shape, out.dtype, {}, op, output=op.output)
    return True


def dot_without_contraction(s: "_Simplifier", op: Op) -> bool:
    """`dot_general(x, y)` with no contracted dim, its operands in the standard
    order (batch dims 0..nb-1 on both sides, then free dims), is the product of
    x and y each broadcast to the result: its batch dims, then its free dims
    where the result has them (lhs free dims before rhs free dims)."""
    if op.kind != "dot_general" or len(op.inputs) != 2:
        return False
    p = op.params
    if p["lhs_contract"] or p["rhs_contract"]:
        return False
    nb = len(p["lhs_batch"])
    if tuple(p["lhs_batch"]) != tuple(range(nb)) or tuple(p["rhs_batch"]) != tuple(range(nb)):
        return False                                # not in the standard order (yet)
    x, y = op.inputs
    nl, nr = len(s.shape(x)) - nb, len(s.shape(y)) - nb
    out = s.g.tensors[op.output]
    lhs_dims = tuple(range(nb + nl))
    rhs_dims = tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr))
    ins = []
    for t, dims in ((x, lhs_dims), (y, rhs_dims)):
        if s.shape(t) != out.shape:                 # else t is the result's shape already
            t = s.new_op("broadcast_in_dim", [t], out.shape, s.g.tensors[t].dtype,
                         {"broadcast_dimensions": dims}, op)
        ins.append(t)
    s.new_op("mul", ins, out.shape, out.dtype, {}, op, output=op.output)
    return True


def mask_of_masks(s: "_Simplifier", op: Op) -> bool:
    """`p * q` for boolean p and q of the result's shape and a floating-point
    result is `select(q, p, 0)` (select_n(q, 0, p)): 1 where both hold, else 0."""
    out = s.float_binary(op, "mul")
    if out is None:
        return False
    p, q = op.inputs
    if s.g.tensors[p].dtype != "bool" or s.g.tensors[q].dtype != "bool" \
            or not s.shape(p) == s.shape(q) == out.shape:
        return False
    zeros = s.splat_of(0, out.shape, out.dtype, op)
    s.new_op("select_n", [q, zeros, p], out.shape, out.dtype, {}, op, output=op.output)
    return True


def _iota_along(s: "_Simplifier", t: int, d: int) -> bool:
    """Whether t counts 0, 1, ... along dim d (an iota, or the broadcast of a 1-D
    one along d: the normal form of `iota_1d`)."""
    op = s.producer.get(t)
    if op is not None and op.kind == "broadcast_in_dim" \
            and tuple(op.params["broadcast_dimensions"]) == (d,):
        op = s.producer.get(op.inputs[0])
        return op is not None and op.kind == "iota" and op.params["dimension"] == 0
    return op is not None and op.kind == "iota" and op.params["dimension"] == d


def whole_dim_top_k(s: "_Simplifier", op: Op) -> bool:
    """`sort(flip(x), x[, iota along d])` along d (one key) is, by the result it
    names, `flip(top_k(x))`, `top_k(x)` or top_k's indices, k the length of d."""
    if op.kind != "sort" or int(op.params.get("num_keys", 1)) != 1 or len(op.inputs) not in (2, 3):
        return False
    d, which = op.params["dimension"], int(op.params.get("output", 0))
    key, x = op.inputs[0], op.inputs[1]
    flip = s.producer.get(key)
    if flip is None or flip.kind not in _FLIPS or flip.inputs != [x] \
            or len(op.inputs) == 3 and not _iota_along(s, op.inputs[2], d):
        return False
    out = s.g.tensors[op.output]
    params = {"axis": d, "k": s.shape(x)[d]}
    if which == 2:
        s.new_op("top_k", [x], out.shape, out.dtype, {**params, "output": 1}, op,
                 output=op.output)
        return True
    values = s.new_op("top_k", [x], out.shape, s.g.tensors[x].dtype, {**params, "output": 0},
                      op, output=op.output if which == 1 else None)
    if which == 0:
        s.new_op(flip.kind, [values], out.shape, out.dtype, {}, op, output=op.output)
    return True


def _chain_to_reshape(s: "_Simplifier", op: Op) -> tuple[Op, set[int]] | None:
    """When op, a set reduction no reduction of its kind reads, reduces a chain of
    reductions of its kind (one or more) of a reshape: that reshape and every axis the
    chain reduces, in the reshape's numbering; else None."""
    if op.kind not in _SET_REDUCTIONS or any(o.kind == op.kind for o in s.readers(op.output)):
        return None                     # (not the chain's last: its reader takes the chain)
    chain = [op]
    while True:
        p = s.producer.get(chain[-1].inputs[0])
        if p is None or p.kind != op.kind or len(p.inputs) != 1:
            break
        chain.append(p)
    r = s.producer.get(chain[-1].inputs[0])
    if len(chain) < 2 or r is None or r.kind != "reshape":
        return None
    axes: set[int] = set()
    for red in reversed(chain):         # the innermost first: its axes are the reshape's
        kept = [d for d in range(len(s.shape(r.output))) if d not in axes]
        axes |= {kept[b] for b in red.params["axes"]}
    return r, axes


def reduction_of_tiles(s: "_Simplifier", op: Op) -> bool:
    """`red(...red(reshape(x), A1)..., An)` is `reshape(red(x, C))` for one set
    reduction `red` (reducing a set in steps reduces its union: sums reassociate; max,
    min, prod, and, or, xor alike), when A1 .. An (in the reshape's numbering) together
    reduce every independent group of the reshape they touch whole (its size-1 dims
    aside), C those groups' dims of x: the groups left are x's other dims in their
    order, so a reshape (of size-1 dims only, mostly none) gives the result's shape."""
    found = _chain_to_reshape(s, op)
    if found is None:
        return False
    r, axes = found
    x = r.inputs[0]
    src, to = s.shape(x), s.shape(r.output)
    groups = _reshape_groups(src, to)
    if groups is None:
        return False
    reduced: list[int] = []
    for gs, gt in groups:
        if any(d in axes and to[d] != 1 for d in gt):
            if not all(d in axes or to[d] == 1 for d in gt):
                return False                # a group reduced in part: no reduction of x
            reduced.extend(gs)
        elif gt and all(d in axes for d in gt):
            reduced.extend(gs)              # a group of size-1 dims, reduced whole
    if not reduced:
        return False
    out = s.g.tensors[op.output]
    left = tuple(n for d, n in enumerate(src) if d not in reduced)
    t = s.new_op(op.kind, [x], left, out.dtype, {**op.params, "axes": tuple(reduced)}, op,
                 output=op.output if left == out.shape else None)
    if left != out.shape:
        s.new_op("reshape", [t], out.shape, out.dtype, {}, op, output=op.output)
    return True


def one_axis_reductions(s: "_Simplifier", op: Op) -> bool:
    """A set reduction over several axes as a chain of one-axis reductions of its kind,
    the highest axis first (module doc); not of a reshape (reduce_of_reshape and
    reduction_of_tiles read a reshape's groups in one reduction)."""
    if op.kind not in _SET_REDUCTIONS or len(op.inputs) != 1 or len(op.params["axes"]) < 2:
        return False
    src = s.producer.get(op.inputs[0])
    if src is not None and src.kind == "reshape":
        return False
    axes = sorted(op.params["axes"])
    out = s.g.tensors[op.output]
    t, shape = op.inputs[0], s.shape(op.inputs[0])
    for a in reversed(axes[1:]):
        shape = shape[:a] + shape[a + 1:]
        t = s.new_op(op.kind, [t], shape, out.dtype, {**op.params, "axes": (a,)}, op)
    s.new_op(op.kind, [t], out.shape, out.dtype, {**op.params, "axes": (axes[0],)}, op, output=op.output)
    return True


__all__ = ["compiled_forms"]
