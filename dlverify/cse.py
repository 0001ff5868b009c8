"""Values computed twice, computed once (common subexpression elimination).

XLA's fusion duplicates cheap computations into every fusion that reads them: a
compiled module divides the same scores by the same constant in each of several
fusions, broadcasting the constant anew each time. Rewrites that recognise a
structure by which tensors flow where (the online softmax's running maxima,
dlverify/online_softmax.py: the max of a block and the block it shifts must be
one tensor) see two unrelated values. Merging ops of one kind, with the same
operands (in either order for commutative kinds), parameters, shape and dtype
keeps every value: these ops are functions of their operands. Collectives,
opaque ops (custom calls, random bits) and sources are never merged; a merged
op stays in `graph.folded` for diagnosis, located at its own line.

The same key (`value_key`) serves the merge inside simplify's normal form
(simplify_forms.common_value), which sees the values its other rewrites create;
this pass runs first, before the rewrites that read the programs' own structure
(dlverify/rewrites.py).
"""
from __future__ import annotations

import numpy as np

from dlverify.ir import FoldedOp, Graph, Op
from dlverify.ops.table import KINDS, Family

# kinds whose value does not depend on operand order
_COMMUTATIVE = frozenset({"add", "mul", "max", "min", "and", "or", "xor", "eq", "ne"})
# families whose ops may be merged: not collectives (channels, ranks), opaque ops
# (custom calls, random bits) or sources (constants are compared by value elsewhere)
_MERGED_FAMILIES = frozenset({Family.ELEMENTWISE, Family.LAYOUT, Family.REDUCTION,
                              Family.CONTRACTION, Family.SCAN, Family.SORT})


def _frozen(v: object) -> object:
    """A hashable stand-in for a params value (equal values, equal stand-ins)."""
    if isinstance(v, dict):
        return tuple(sorted((k, _frozen(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.generic):
        return ("scalar", v.dtype.str, v.tobytes())
    hash(v)                          # anything else must be hashable as it is
    return v


def value_key(graph: Graph, op: Op) -> tuple | None:
    """What determines `op`'s value, when it is a function of its operands alone that
    may be merged; None otherwise."""
    kind = KINDS.get(op.kind)
    if kind is None or kind.family not in _MERGED_FAMILIES or kind.local is None or not op.inputs:
        return None
    ins = tuple(sorted(op.inputs)) if op.kind in _COMMUTATIVE else tuple(op.inputs)
    out = graph.tensors[op.output]
    try:
        return (op.kind, ins, _frozen(op.params), out.shape, out.dtype)
    except TypeError:                 # a params value without equality: never merged
        return None


def merge_common_values(graph: Graph) -> dict[int, int]:
    """Merge every op into the first op computing the same value, in one pass in
    program order (a merge makes its readers' operands equal, so chains of
    duplicates merge whole). Returns the aliases: merged tensor -> the one kept."""
    alias: dict[int, int] = {}
    computed: dict[tuple, int] = {}
    kept: list[Op] = []
    for op in graph.ops:
        op.inputs = [alias.get(i, i) for i in op.inputs]
        key = value_key(graph, op)
        earlier = computed.get(key) if key is not None else None
        if earlier is not None:
            alias[op.output] = earlier
            graph.folded.append(FoldedOp(op.kind, op.loc, earlier))
            continue
        if key is not None:
            computed[key] = op.output
        kept.append(op)
    if alias:
        graph.ops = kept
        graph.outputs = [alias.get(t, t) for t in graph.outputs]
    return alias


__all__ = ["merge_common_values", "value_key"]
