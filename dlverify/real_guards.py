"""Guards against values that real numbers never take, dropped: exact rewrites
over the reals, run on both graphs.

Library code protects floating point from infinities and signs that real
arithmetic cannot produce; the program written by hand usually does not. JAX's
`jax.nn.logsumexp` shifts by

    select_n(is_finite(m), 0, m)      m = max(reduce_max(x), -inf)

and takes `log(abs(sum(exp(x - shift))))`; a vocab-parallel cross-entropy shifts
by the `pmax` of local maxima and takes the log of the sum. Over the reals:

* `select_n(is_finite(x), c, x) = x` when x is finite for finite inputs
  (dlverify/finite_values.py): is_finite(x) is then true everywhere;
* `abs(x) = x` when x is nonnegative for every real input (`_Nonnegative`: an
  exponential, a square, an abs, sums, products, maxima, moves and reductions of
  such values, nonnegative literals);
* `max(x, -inf) = x` and `min(x, +inf) = x` (the identity the reduction starts
  from, a splat literal), so the shift above is the row max the other program
  computes.

Each is an identity for every real input, the semantics of a verdict
(shared/design/semantics.md); tests/test_real_guards.py checks each on random data
with the shared evaluator and leaves guards whose side condition fails.
"""
from __future__ import annotations

import numpy as np

from dlverify.finite_values import EXTREMUM_IDENTITY, FiniteValues
from dlverify.graph_memo import PostOrderMemo
from dlverify.ir import Graph, IdAllocator, Op, literal_value
from dlverify.ops.dtypes import is_float_dtype
from dlverify.rewrites import _Rewriter

# ops whose result is >= 0 when every operand is
_CLOSED = frozenset({"add", "mul", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                     "max", "min", "cumsum", "cumprod", "cummax", "cummin", "sqrt", "div",
                     "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice",
                     "concatenate", "pad", "rev", "gather", "all_gather", "all_to_all",
                     "collective_permute", "reduce_scatter", "convert_to_float"})
# ops whose result is >= 0 whatever their operands
_NONNEGATIVE = frozenset({"exp", "exp2", "abs", "square", "softmax", "logistic"})


class _Nonnegative(PostOrderMemo[bool]):
    """nonneg(t): tensor t is >= 0 for every real input (graph_memo's walk)."""

    def operands(self, op: Op) -> list[int]:
        """The operands whose sign decides the result's (none for a value that is
        nonnegative anyway, a select's branches, a gather's operand but not its
        indices, a pad's value too)."""
        if op.kind in _NONNEGATIVE:
            return []
        if op.kind == "select_n":
            return op.inputs[1:]
        if op.kind in ("gather", "dynamic_slice"):
            return op.inputs[:1]
        return op.inputs

    def value(self, t: int, op: Op | None) -> bool:
        if op is None:
            return False    # an input: any real
        if op.kind in _NONNEGATIVE:
            return True
        if op.kind == "constant":
            v = op.params.get("value")
            return v is not None and bool(np.all(np.asarray(v, dtype=np.float64) >= 0))
        if op.kind == "integer_pow":
            y = op.params.get("y", 1)
            return y % 2 == 0 or self.memo[op.inputs[0]]
        if op.kind == "all_reduce":
            return op.params.get("reducer", "sum") in ("sum", "max", "min") and \
                self.memo[op.inputs[0]]
        if op.kind == "max":     # one nonnegative operand suffices
            return any(self.memo[i] for i in op.inputs)
        if op.kind in _CLOSED or op.kind == "select_n":
            return all(self.memo[i] for i in self.operands(op))
        return False


class _RealGuards(_Rewriter):
    def __init__(self, graph: Graph, ids: IdAllocator, decided: dict[int, list] | None = None) -> None:
        super().__init__(graph, ids)
        self.finite = FiniteValues(graph, decided=decided)
        self.nonneg = _Nonnegative(graph)
        self.made = {op.output: op for op in graph.ops}

    def apply(self, op: Op) -> bool:
        if op.kind == "select_n" and len(op.inputs) == 3:
            guard = self.made.get(op.inputs[0])
            x = op.inputs[2]
            if guard is not None and guard.kind == "is_finite" and guard.inputs[0] == x and \
                    self.g.tensors[x].shape == self.g.tensors[op.output].shape and self.finite(x):
                return self.fold(op, x)
        if op.kind == "abs" and is_float_dtype(self.g.tensors[op.output].dtype) and \
                self.nonneg(op.inputs[0]):
            return self.fold(op, op.inputs[0])
        if op.kind in EXTREMUM_IDENTITY and len(op.inputs) == 2:
            ident = EXTREMUM_IDENTITY[op.kind]
            for keep, other in ((0, 1), (1, 0)):
                x = op.inputs[keep]
                v = literal_value(self.made, op.inputs[other], ("broadcast_in_dim", "reshape"))
                if v is not None and v.size and bool(np.all(v.astype(np.float64) == ident)) and \
                        self.g.tensors[x].shape == self.g.tensors[op.output].shape:
                    return self.fold(op, x)
        return False


def drop_real_guards(g: Graph, ids: IdAllocator, decided: dict[int, list] | None = None) -> bool:
    """Rewrite g's guards (module doc); whether anything changed. `decided`: bools known
    per rank (passes.fold's splats), so that a select they decide is as finite as its case."""
    return _RealGuards(g, ids, decided).run()
