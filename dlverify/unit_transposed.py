"""A dot operand that transposes a reshape deleting size-1 dims, read with those dims
back (a rule of the normal form, dlverify/simplify.py, on both graphs).

XLA computes one dot (dV = P^T dO of one KV head) once and hands it to two readers in
two layouts; the normal form takes each reader's transpose into the dot
(dlverify/simplify_layouts.py), so one program value becomes two dots. One of them
reads the probabilities as transpose(reshape(p)), the reshape deleting p's size-1 KV
dim, while its other operand (dO) still carries that dim as a size-1 free dim: the
dot's result has it as a free dim from one side. The other dot batches over the pair.
`simplify_forms.unit_dims_into_dot` takes a deleted dim back into the dot only when
the reshape is the operand itself, so the two dots stayed apart and so did every
value built on one of them (the key gradient dK = dV-side terms added before the
input projection's gradient).

deleted_units_under_transpose: dot(transpose(reshape(y), P), x), the reshape deleting
y's size-1 dims and x having a size-1 free dim, is the dot of transpose(y, P'), P'
moving y's sized dims as P moves them and each deleted dim along with the sized dim
before it in y (first, when none is), its result reshaped to the dot's shape (only
size-1 dims differ): transpose(y, P') with those dims deleted is transpose(reshape(y),
P) element for element, as both keep the sized dims' row-major order under P. The
normal form's next rule (simplify_forms.unit_dims_batched) then batches the size-1
pair, and the two dots meet.

Only on the sequential graph: on the distributed one the sequential program's dots
choose where size-1 dims go (dlverify/unit_layouts.py), and a rank's one head read
back there is a different dot from the program's (the FSDP-split llama step). Not when
the other operand has no size-1 free dim: the taken-back dim would be a free
dim of the result only, a form the rules read from the reshape as it is."""
from __future__ import annotations

from dlverify.ir import Op
from dlverify.simplify_forms import _unit_deletion


def _free_units(rw, op: Op, side: int) -> list[int]:
    """The size-1 dims of `op`'s operand `side` that it neither batches nor contracts."""
    key = ("lhs", "rhs")[side]
    shape = rw.shape(op.inputs[side])
    roles = set(op.params[f"{key}_batch"]) | set(op.params[f"{key}_contract"])
    return [d for d, n in enumerate(shape) if n == 1 and d not in roles]


def units_restored(kept: list[int], deleted: list[int], perm: tuple[int, ...]
                   ) -> tuple[list[int], dict[int, int]]:
    """The permutation P' of y (see the module docstring) for a reshape of y keeping
    y's dims `kept` (in order) and deleting `deleted`, transposed by `perm`; and for
    each dim of the transposed reshape, the dim of transpose(y, P') that holds it."""
    follows: dict[int, list[int]] = {}    # kept dim of y (-1: none) -> deleted dims after it
    for d in deleted:
        before = max((k for k in kept if k < d), default=-1)
        follows.setdefault(before, []).append(d)
    order, at = list(follows.get(-1, [])), {}
    for i, p in enumerate(perm):
        at[i] = len(order)
        order.append(kept[p])
        order.extend(follows.get(kept[p], []))
    return order, at


def deleted_units_under_transpose(rw, op: Op) -> bool:
    """See the module docstring. `rw` the normal form's rewriter (shape, producer,
    new_op, _dot_reading)."""
    if op.kind != "dot_general" or len(op.inputs) != 2 or getattr(rw, "partner_dots", None):
        return False   # (on the distributed graph the sequential program's dots place them)
    for side in (0, 1):
        t = rw.producer.get(op.inputs[side])
        if t is None or t.kind != "transpose":
            continue
        r = rw.producer.get(t.inputs[0])
        if r is None or r.kind != "reshape" or not _free_units(rw, op, 1 - side):
            continue
        y = r.inputs[0]
        found = _unit_deletion(rw.shape(y), rw.shape(r.output))
        if found is None:
            continue
        order, at = units_restored(*found, tuple(t.params["permutation"]))
        ys = rw.shape(y)
        moved = rw.new_op("transpose", [y], tuple(ys[d] for d in order),
                          rw.g.tensors[y].dtype, {"permutation": tuple(order)}, t)
        return rw._dot_reading(op, side, ("lhs", "rhs")[side], moved, at)
    return False


__all__ = ["deleted_units_under_transpose", "units_restored"]
