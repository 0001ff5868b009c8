"""Layout ops of array constants, folded into constants.

A compiled module stores a constant in the layout its readers want: XLA folds
`reshape(c)` or `transpose(c)` of a closed-over array into one literal, while
the sequential module (before optimisations) still reshapes its own literal.
Constants are related by value (facts.equal_constants: same shape, dtype and
bytes), so the folded literal and the reshape relate to nothing. Replacing a
layout op whose operand is an array constant by the constant it computes (the
shared evaluator's value, exact: layout ops only move elements) puts both
programs' values in literal form. Splats are left alone: they are matched by
value whatever their shape.
"""
from __future__ import annotations

import numpy as np

from dlverify.ir import Graph
from dlverify.ops import KINDS, Family, NotExecutable, evaluate

MAX_ELEMENTS = 1 << 16   # as passes.share_nullary: larger literals are not compared by value


def fold_constant_layouts(graph: Graph) -> bool:
    """Replace every single-operand layout op of a non-splat array constant by a
    constant holding its value, in program order (chains fold whole). Returns
    whether anything changed; the operand constants left unread are for the
    caller's dead-op pass."""
    values: dict[int, np.ndarray] = {}
    changed = False
    for op in graph.ops:
        if op.kind == "constant" and op.params.get("value") is not None:
            v = np.asarray(op.params["value"])
            if 1 < v.size <= MAX_ELEMENTS and not np.all(v == v.flat[0]):
                values[op.output] = v
            continue
        if KINDS[op.kind].family is not Family.LAYOUT or len(op.inputs) != 1 \
                or op.inputs[0] not in values:
            continue
        out = graph.tensors[op.output]
        try:
            v = evaluate(op.kind, op.params, [values[op.inputs[0]]], out.shape, out.dtype)
        except NotExecutable:
            continue
        op.kind, op.inputs, op.params = "constant", [], {"value": v}
        values[op.output] = v
        changed = True
    return changed


__all__ = ["fold_constant_layouts"]
