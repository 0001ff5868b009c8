"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs these rules in its pass): layout ops leave the collectives that move whole
values between ranks, toward the outputs as everywhere in the normal form.

* permutes: collective_permute(reshape(y)) is reshape(collective_permute(y)),
  and collective_permute(transpose(y)) is transpose(collective_permute(y)):
  a permute sends a rank's whole value to another rank (a rank that receives
  nothing holds zeros, which every layout op keeps zeros), so re-indexing its
  elements before sending or after receiving is the same. A compiled pipeline
  deletes a stage's size-1 batch dim before its permute; the program keeps it.

Each an identity of data movement for every input on every rank;
tests/test_simplify_moves.py checks each numerically on several ranks and where it
must not fire. A transpose enters a permute only with the op under it, in the same
rewrite (simplify_layouts.py, simplify_transposes.transpose_into_permute), so none is
left right under a permute and no rule undoes another.
"""
from __future__ import annotations

from dlverify.cse import _COMMUTATIVE
from dlverify.ir import Op
from dlverify.simplify_forms import _FormRules, _unit_deletion

# layout ops that re-index a value's elements alike on every rank
_LAYOUT = frozenset({"reshape", "transpose"})


class _MoveRules(_FormRules):
    """The rules above, for `_Simplifier` (dlverify/simplify.py) to run in its pass
    (a `_FormRules`: its dot reshaped by size-1 dims is shared)."""

    def moves(self, op: Op) -> bool:
        """Whether one of this module's rules replaced `op`."""
        return (self.layout_out_of_permute(op) or self.unit_moves_out_of_dot(op)
                or self.literal_last(op))

    def literal_last(self, op: Op) -> bool:
        """A commutative op of two operands whose first is a splat (a tensor holding one
        value, `splat`) and whose second is not reads them swapped: the rules pair
        operands by position, and the two programs write `c * x` and `x * c` as they
        please (GELU's `0.044715 * x**3`)."""
        if op.kind not in _COMMUTATIVE or len(op.inputs) != 2 \
                or self.splat(op.inputs[0]) is None or self.splat(op.inputs[1]) is not None:
            return False
        self.new_op(op.kind, [op.inputs[1], op.inputs[0]], self.shape(op.output),
                    self.g.tensors[op.output].dtype, op.params, op, output=op.output)
        return True

    def layout_out_of_permute(self, op: Op) -> bool:
        """collective_permute(L(y)) for a reshape or transpose L is
        L(collective_permute(y)), the permute's pairs unchanged."""
        if op.kind != "collective_permute" or len(op.inputs) != 1:
            return False
        layout = self.producer.get(op.inputs[0])
        if layout is None or layout.kind not in _LAYOUT:
            return False
        y = layout.inputs[0]
        moved = self.new_op("collective_permute", [y], self.shape(y), self.g.tensors[y].dtype,
                            op.params, op)
        self.new_op(layout.kind, [moved], self.shape(op.output), self.g.tensors[op.output].dtype,
                    layout.params, layout, output=op.output)
        return True

    def _unit_moved(self, t: int) -> tuple[int, tuple[int, ...] | None] | None:
        """(y, q) when t is reshape(y), or transpose(reshape(y)), whose reshape only
        moves, inserts or deletes size-1 dims, and not a reshape deleting size-1
        dims alone (unit_dims_into_dot's): t's sized dims are y's, read in y's
        order (q None) or in the order of transpose(y, q), q permuting y's sized
        dims among their places (its size-1 dims stay). Else None. A transpose
        moving sized dims is taken too: where a rank's block of a dim is size 1, the
        distributed transpose moves only size-1 dims and the sequential one sized
        ones, and both sides must reach one form."""
        op = self.producer.get(t)
        perm = None
        if op is not None and op.kind == "transpose":
            perm = op.params["permutation"]
            op = self.producer.get(op.inputs[0])
        if op is None or op.kind != "reshape":
            return None
        y, mid = op.inputs[0], self.shape(op.output)
        if _unit_deletion(self.shape(y), mid) is not None \
                or [n for n in mid if n != 1] != [n for n in self.shape(y) if n != 1]:
            return None
        if perm is None:
            return y, None
        rank = {d: k for k, d in enumerate(d for d, n in enumerate(mid) if n != 1)}
        order = [rank[d] for d in perm if mid[d] != 1]     # y's k-th sized dim, as t reads them
        if order == sorted(order):
            return y, None
        ysized = [d for d, n in enumerate(self.shape(y)) if n != 1]
        moved = iter(ysized[k] for k in order)
        return y, tuple(next(moved) if n != 1 else d for d, n in enumerate(self.shape(y)))

    def unit_moves_out_of_dot(self, op: Op) -> bool:
        """A dot operand that only moves, inserts or deletes size-1 dims of a tensor
        y (`_unit_moved`) is replaced by y (transposed as the operand reads its
        sized dims): its sized dims keep their roles, its
        size-1 batch and contracted dims are taken by size-1 dims of y (any one:
        each holds the one element), y's other size-1 dims are free; the dot's
        result then differs by size-1 dims only and is reshaped to its shape. A
        compiled pipeline's stages insert and delete a micro-batch's size-1 dims
        around permutes and dots that the program keeps as a batch dim."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = op.params
        for side, key in ((0, "lhs"), (1, "rhs")):
            t = op.inputs[side]
            found = self._unit_moved(t)
            if found is None:
                continue
            y, q_perm = found
            shape = self.shape(t)
            src = self.shape(y) if q_perm is None else tuple(self.shape(y)[d] for d in q_perm)
            sized = iter(d for d, n in enumerate(src) if n != 1)
            units = iter(d for d, n in enumerate(src) if n == 1)
            at: dict[int, int] = {}               # a dim of t read -> the dim of y
            roles = set(p[f"{key}_batch"]) | set(p[f"{key}_contract"])
            for d, n in enumerate(shape):
                if n != 1:
                    at[d] = next(sized)
                elif d in roles:
                    at[d] = next(units, None)
            if None in at.values():
                continue                          # too few size-1 dims in y for the roles
            if q_perm is not None:
                y = self.new_op("transpose", [y], src, self.g.tensors[y].dtype,
                                {"permutation": q_perm}, self.producer[t])
            return self._dot_reading(op, side, key, y, at)
        return False


__all__ = ["_MoveRules"]
