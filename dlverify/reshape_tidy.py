"""Reshapes tidied once more after the passes that follow the normal form.

dlverify/unit_layouts.py and unit_placement.py run on the distributed graph after its
normal form (dlverify/simplify.py) and rewrite a dot to the dims the sequential
program's dot has, reshaping its result back to the shape its readers read: a rank
holding one head gets [b, 1, q, k] scores back as [b, 1, q, 1, k]. The normal form
is not run again (it would undo the forms those passes chose for transposes and
dots), so the reshape back stays where it is: under the elementwise ops that read
it (`scores / sqrt(d)`, then reshaped to [b, 1, q, k] again) and in chains
`reshape(reshape(x))` to x's own shape, where the sequential program's ops read the
dot's result directly, and the two never meet.

Two rules of the normal form, and only those, are applied again to a fixpoint:
a reshape of a reshape is one reshape (none when it ends at the first operand's
shape: both are row-major re-indexings of the same elements), and an elementwise op
of reshapes of one shape (and splats) is the reshape of the op on that shape
(simplify_reshapes.sink_reshape, with its `x * M(1/y)` as `x / M(y)`). Neither writes
a transpose or touches a dot, so the forms the passes chose stay; both are identities
of data movement, checked with the shared evaluator in tests/test_contraction_order.py.
"""
from __future__ import annotations

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.rewrites import _drop_newly_dead, _unused
from dlverify.simplify import _Simplifier, _retarget_folded

# passes at most: each collapses a chain or sinks a reshape one op further
_PASSES = 16


class _ReshapeTidy(_Simplifier):
    """One pass in op order (the normal form's, `_Simplifier.run`) of the two rules (see
    the module docstring)."""

    def rules(self, op: Op) -> bool:
        return bool(op.kind == "reshape" and self.layout(op) or self.sink_reshape(op))


def tidy_reshapes(graph: Graph, ids: IdAllocator) -> bool:
    """Collapse reshape chains and sink reshapes past elementwise ops in `graph` (in
    place); returns whether anything changed."""
    unused = _unused(graph)
    alias: dict[int, int] = {}
    changed = False
    for _ in range(_PASSES):
        tidy = _ReshapeTidy(graph, ids)
        if not tidy.run():
            break
        alias.update(tidy.alias)
        changed = True
    if changed:
        _drop_newly_dead(graph, unused)
        _retarget_folded(graph, alias)
    return changed


__all__ = ["tidy_reshapes"]
