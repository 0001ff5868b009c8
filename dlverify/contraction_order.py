"""A dot's contracted pairs in one order (more of the algebraic normal form of
dlverify/simplify.py, whose `_Simplifier` runs this rule in its pass).

A dot_general sums over its contracted pairs (lhs dim l_i against rhs dim r_i) all
at once: listing the pairs in another order is the same function. The normal form's
`dot_layout` transposes each operand to (batch, free, contracted) with the contracted
dims in the order the pairs are listed, so two programs listing one contraction in
two orders reach two transposes, and the rules pair transposes by permutation
(datalog/layout.dl). The order listed is whatever the writer chose: jax's einsum
`bqhe,hed->bqd` lists (e, h) for the program, while a rank holding one head, whose
head dim XLA deleted, gets it back where the reshape that restores it puts it, (h, e).

The one order: the pairs sorted by where their dims sit in the values the operands
read, looking through the transposes `dot_layout` composes with (so the transposes it
writes keep them in their order there; none is needed when an operand is laid out so
already), when one order sorts both operands' dims alike. The rule is symmetric in the
operands, so a dot the normal form later turns round (simplify_layouts.transposed_dot)
keeps its order. When the two operands hold the contracted dims in different orders
no listing is the natural one and the writer's stays (a form the other side may
list otherwise, as before). Both sides are written so whatever order their writer
chose; a dot whose pairs are so listed is left as it is, so the rule and `dot_layout`
reach a fixpoint together. tests/test_contraction_order.py checks the
reordering with the shared evaluator.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


def _source_positions(s: "_Simplifier", t: int) -> tuple[int, ...]:
    """For each dim of dot operand t, its position in the value t reads: through the
    transpose producing t, else t's own."""
    op = s.producer.get(t)
    if op is not None and op.kind == "transpose":
        return tuple(op.params["permutation"])
    return tuple(range(len(s.shape(t))))


def contracted_pairs_in_source_order(s: "_Simplifier", op: Op) -> bool:
    """Relist a dot's contracted pairs sorted by the positions of their dims in the
    operands' sources (`_source_positions`), when one order sorts both sides; True
    when it replaced `op`."""
    if op.kind != "dot_general" or len(op.inputs) != 2 or len(op.params["lhs_contract"]) < 2:
        return False
    lpos, rpos = (_source_positions(s, t) for t in op.inputs)
    pairs = list(zip(op.params["lhs_contract"], op.params["rhs_contract"]))
    ordered = sorted(pairs, key=lambda pair: lpos[pair[0]])
    if ordered == pairs or [rpos[r] for _, r in ordered] != sorted(rpos[r] for _, r in ordered):
        return False
    q = dict(op.params)
    q["lhs_contract"] = tuple(l for l, _ in ordered)
    q["rhs_contract"] = tuple(r for _, r in ordered)
    s.new_op("dot_general", list(op.inputs), s.shape(op.output), s.g.tensors[op.output].dtype, q,
             op, output=op.output)
    return True


__all__ = ["contracted_pairs_in_source_order"]
