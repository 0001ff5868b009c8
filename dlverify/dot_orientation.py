"""Which orientation a transposed dot takes on the distributed side, read off the
sequential program's normal form (simplify_layouts.transposed_dot splits a
transpose of a dot that interleaves the operands' free dims into the dot whose lhs
is the operand the transpose reads a sized free dim of first, and the transpose
left).

A rank's block of a dim may have size 1 where the sequential dim is sized (one head
per rank): the transpose then reads another operand's sized dim first on the
distributed side, or interleaves the free dims by that size-1 dim alone (which
stays), and the two sides would split one value into different dots. Both
orientations, and leaving the transpose, are the same function; which one meets the
program is the one the program's normal form holds: a transpose by the same
permutation of a dot whose dims' sizes, role by role and in order, the rank's dot'
divides (PartnerLayouts), or, for a transpose taken whole, such a dot alone.

This only chooses among equal forms of the distributed graph: a wrong choice costs a
relation, never soundness (tests/test_dot_orientation.py checks every form the
choice can give with the shared evaluator).
"""
from __future__ import annotations

from typing import NamedTuple

from dlverify.ir import Graph

DotSizes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def dot_sizes(p: dict, lshape: tuple[int, ...], rshape: tuple[int, ...]) -> DotSizes:
    """(batch sizes, lhs free sizes, rhs free sizes, contracted sizes), each in the
    order the dot's result (batch, contracted: lhs order of the pairs) has them."""
    free = [tuple(n for d, n in enumerate(shape) if d not in p[f"{key}_batch"]
                  and d not in p[f"{key}_contract"])
            for shape, key in ((lshape, "lhs"), (rshape, "rhs"))]
    return (tuple(lshape[d] for d in p["lhs_batch"]), free[0], free[1],
            tuple(lshape[d] for d in p["lhs_contract"]))


class Form(NamedTuple):
    """A form of a transposed dot: the dot's sizes (dot_sizes), the rank of the value
    the transpose reads (the dot's, or a reshape's of it), and the transpose's
    permutation (None: no transpose, the dot computes the value whole)."""

    sizes: DotSizes
    rank: int
    perm: tuple[int, ...] | None


def _divides(mine: DotSizes, theirs: DotSizes) -> bool:
    """Whether each dim of `mine` could be a rank's block of the same dim of `theirs`."""
    return all(len(m) == len(t) and all(b % a == 0 for a, b in zip(m, t))
               for m, t in zip(mine, theirs))


class PartnerLayouts:
    """The sequential program's dots, and its transposes of a dot (through one reshape
    at most), as Forms."""

    def __init__(self, g: Graph) -> None:
        producer = g.producer()
        self.dots: list[DotSizes] = []
        self.transposed: list[Form] = []
        sizes = {}
        for op in g.ops:
            if op.kind == "dot_general" and len(op.inputs) == 2:
                sizes[op.output] = dot_sizes(op.params, *(g.tensors[t].shape for t in op.inputs))
                self.dots.append(sizes[op.output])
        for op in g.ops:
            if op.kind != "transpose" or not op.inputs:
                continue
            t = op.inputs[0]
            under = producer.get(t)
            if under is not None and under.kind == "reshape":
                t = under.inputs[0]
            if t in sizes:
                self.transposed.append(Form(sizes[t], len(g.tensors[op.inputs[0]].shape),
                                            tuple(op.params["permutation"])))

    def holds(self, form: Form) -> bool:
        """Whether the program's normal form holds `form` for a sequential value a rank's
        form could be a block of."""
        if form.perm is None:
            return any(_divides(form.sizes, s) for s in self.dots)
        return any(f.perm == form.perm and f.rank == form.rank and _divides(form.sizes, f.sizes)
                   for f in self.transposed)


__all__ = ["Form", "PartnerLayouts", "dot_sizes"]
