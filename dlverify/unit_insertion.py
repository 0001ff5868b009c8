"""Size-1 dims a rank's dot never had, inserted where the program's dot has them (more of
dlverify/unit_layouts.py's rules, in the normal form's pass over the distributed graph).

With one query head per rank (examples/gqa_replicated_kv.py at TP = 8: two KV heads of
four query heads each) a rank holds one KV head g and one query head j of each; XLA
deletes both and computes the attention scores as [b, s, d] x [b, d, s] batched over b
alone, where the program batches over (b, g) and keeps j free ([b, g, j, s, d] x
[b, g, d, s]). The dot has no size-1 dim for lone_units_batched to batch; it is the same
function as the dot of its operands with size-1 dims inserted, a batch pair in both and a
free dim in one, whose result has those size-1 dims (reshaped back): a size-1 batch pair
or free dim holds one index.

`units_inserted` gives a dot that could compute a block of no sequential dot
(unit_layouts._fits: dims by role, sizes dividing) as many size-1 batch pairs and free
dims as a sequential dot with as many contracted dims and more batch dims has more, when
the dot then fits it. Only a batched dot, and only where a batch pair is missing: a dot
that merged or lost free dims alone (XLA's flattened weight gradients) is left to the
rules that split merged dims and place lone size-1 dims, and an unbatched one may as
well have lost a contracted pair (a rank's one expert, [t, f] x [f, d] for the program's
[t, e, f] x [e, f, d]), which size divisibility alone would misread.

Sizes alone do not say where the inserted dims go. Among the batch dims (a size-1 dim
before or after b both divide the program's (b, g)) and the free dims they go between
the two, last among the batch dims and first among an operand's free dims, where
attention keeps its head dims ([b, g, j, s, d]; the rank's module does not say: XLA
reshapes the scores to [1, 1, b, s, s] for the masked softmax). Which operand's free
dims take the program's lhs ones: the dot's lhs, unless the dot's result is read (once
at each step, through elementwise ops with splats and reshapes keeping its sized dims)
by a transpose that puts an rhs free dim first (XLA computes the scores as k q^T and
transposes them; the program's dot is q k^T, with j among q's free dims). The result is
reshaped back; the reshapes XLA wrote after the dot then meet that one as they sink.

Every choice is an identity of the distributed graph; a wrong one costs a relation,
never soundness (tests/test_unit_insertion.py checks each with the shared evaluator).
"""
from __future__ import annotations

from dlverify.ir import Op
from dlverify.ops.table import KINDS, Family


_READ_DEPTH = 8   # ops followed from a dot's result to the transpose that reads it


def _grown(mine: tuple[int, ...], theirs: tuple[int, ...], first: bool) -> tuple[int, ...] | None:
    """`mine` with len(theirs) - len(mine) size-1 dims inserted at its start (`first`) or
    end, when each size then divides theirs in order; else None."""
    extra = len(theirs) - len(mine)
    if extra < 0:
        return None
    grown = (1,) * extra + mine if first else mine + (1,) * extra
    return grown if all(t % n == 0 for n, t in zip(grown, theirs)) else None


def _read_swapped(s, op: Op, nb: int, nl: int) -> bool:
    """Whether the dot's result, read once at each step through elementwise ops (other
    operands splats) and reshapes that keep its sized dims, reaches a transpose that puts
    a sized rhs free dim before every sized lhs free dim (XLA's k q^T for q k^T)."""
    readers, producer = s.g.consumers(), s.g.producer()   # (the later ops: not yet in s's map)

    def splat(x: int) -> bool:
        b = producer.get(x)
        return b is not None and b.kind == "broadcast_in_dim" and s.shape(b.inputs[0]) == ()
    out = s.shape(op.output)
    role = ["batch"] * nb + ["lhs"] * nl + ["rhs"] * (len(out) - nb - nl)
    roles = [r for r, n in zip(role, out) if n != 1]   # the sized dims' roles, in order
    t = op.output
    for _ in range(_READ_DEPTH):
        reading = readers.get(t, [])
        if len(reading) != 1:
            return False
        r = reading[0]
        if r.kind == "transpose":
            shape = s.shape(t)
            sized_at = {d: i for i, d in enumerate(d for d, n in enumerate(shape) if n != 1)}
            after = [roles[sized_at[d]] for d in r.params["permutation"] if d in sized_at]
            free = [x for x in after if x != "batch"]
            return bool(free) and free[0] == "rhs" and "lhs" in free
        same = [n for n in s.shape(r.output) if n != 1] == [n for n in s.shape(t) if n != 1]
        if r.kind == "reshape" and same or KINDS[r.kind].family is Family.ELEMENTWISE and \
                s.shape(r.output) == s.shape(t) and all(
                    x == t or splat(x) for x in r.inputs):
            t = r.output
            continue
        return False
    return False


def units_inserted(s, op: Op, partner) -> bool:
    """See the module docstring; `s` the normal form's rewriter of the distributed graph,
    `partner` the sequential dot_roles. Only a dot whose operands are in the standard order
    (simplify.dot_layout) and whose result has no size-1 dim."""
    from dlverify.unit_layouts import _dot_sizes, _fits
    p = op.params
    shapes = [s.shape(t) for t in op.inputs]
    nb, nc = len(p["lhs_batch"]), len(p["lhs_contract"])
    ranks = [len(x) for x in shapes]
    if not nb or 1 in s.shape(op.output) or _fits(p, *shapes, partner) \
            or tuple(p["lhs_batch"]) != tuple(range(nb)) \
            or tuple(p["rhs_batch"]) != tuple(range(nb)) \
            or tuple(p["lhs_contract"]) != tuple(range(ranks[0] - nc, ranks[0])) \
            or tuple(p["rhs_contract"]) != tuple(range(nb, nb + nc)):
        return False
    batch, lfree, rfree, contract = _dot_sizes(p, *shapes)
    swapped = _read_swapped(s, op, nb, ranks[0] - nb - nc)
    for tb, tl, tr, tc in sorted(partner.shapes):
        for theirs_l, theirs_r in [(tr, tl) if swapped else (tl, tr)]:
            grown = (_grown(batch, tb, False), _grown(lfree, theirs_l, True),
                     _grown(rfree, theirs_r, True))
            if None in grown or len(tc) != nc or len(tb) == nb:
                continue                           # (a batch pair lost, the heads': see above)
            b, lf, rf = grown
            lhs, rhs = b + lf + contract, b + contract + rf
            q = {"lhs_batch": tuple(range(len(b))), "rhs_batch": tuple(range(len(b))),
                 "lhs_contract": tuple(range(len(lhs) - nc, len(lhs))),
                 "rhs_contract": tuple(range(len(b), len(b) + nc))}
            if not _fits(q, lhs, rhs, partner):
                continue
            ins = [t if s.shape(t) == shape else s.new_op("reshape", [t], shape,
                                                            s.g.tensors[t].dtype, {}, op)
                   for t, shape in zip(op.inputs, (lhs, rhs))]
            return s._dot_then_unit_reshape(op, ins, {**p, **q})
    return False


__all__ = ["units_inserted"]
