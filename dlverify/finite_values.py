"""Which values are finite reals whenever the program's inputs are: the side
condition of identities that hold for real numbers only.

The softmax shift identity exp(x - k) / sum exp(x - k) = softmax(x)
(dlverify/softmax_form.py) needs k to be a real number. A stabiliser computed as
`max(reduce_max(x), -inf)` (JAX's softmax) is one; `min(reduce_max(x), -inf)`,
or the -inf splat read by mistake, is not, and the program then yields NaN where
the sequential one does not: no rewrite may treat the two as equal.

A value is finite when its op maps finite reals to finite reals (sums,
products, exponentials, moves, collectives, ...) and its operands are finite; a
literal when every element is finite; a max (min) when its operands are, or one
is and the other is a -inf (+inf) splat, the identity the max starts from.
Divisions, logarithms, roots, custom calls and elided constants are not known to
be finite. Integer and boolean values always are. Structural, memoised, one
visit per op: linear in the graph.
"""
from __future__ import annotations

import numpy as np

from dlverify.graph_memo import PostOrderMemo
from dlverify.ir import Op, literal_value
from dlverify.ops.dtypes import is_float_dtype

# Ops that map finite real operands to a finite real (or an integer, a bool).
TOTAL = frozenset({
    "abs", "add", "sub", "mul", "neg", "exp", "exp2", "expm1", "tanh", "logistic", "sin", "cos",
    "sinh", "cosh", "atan", "asinh", "erf", "erfc", "square", "sign", "floor", "ceil", "round",
    "cbrt", "clamp", "broadcast_in_dim", "reshape", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "rev", "gather", "scatter", "scatter_add",
    "select_n", "dot_general", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "cumsum",
    "cummax", "cummin", "cumprod", "cumlogsumexp", "all_gather", "all_reduce", "all_to_all", "collective_permute",
    "reduce_scatter", "softmax", "sort", "top_k", "iota", "axis_index", "convert_to_int",
    "convert_to_bool", "eq", "ne", "lt", "le", "gt", "ge", "argmax", "argmin", "is_finite",
})
EXTREMUM_IDENTITY = {"max": -np.inf, "min": np.inf}


class FiniteValues(PostOrderMemo[bool]):
    """finite(t): tensor t of graph g is a finite real for all finite inputs. `decided`:
    bool tensors proved to hold one value per rank (passes.fold's splats, index ranges):
    a select_n on one of them is finite when the case it takes on every rank is (the
    NaN fill of a `jnp.take` whose indices are proved in range is never taken)."""

    def __init__(self, g, producer=None, decided: dict[int, list] | None = None) -> None:
        super().__init__(g, producer)
        self.decided = decided or {}

    def value(self, t: int, op: Op | None) -> bool:
        dtype = self.g.tensors[t].dtype
        if op is None or not is_float_dtype(dtype):
            return True     # an input (a real number), or an integer or bool value
        if op.kind == "constant":
            v = op.params.get("value")
            return v is not None and bool(np.all(np.isfinite(np.asarray(v, dtype=np.float64))))
        if op.kind in EXTREMUM_IDENTITY:
            a, b = (self.memo[i] for i in op.inputs)
            ident = EXTREMUM_IDENTITY[op.kind]
            return (a and b) or (a and self.splat_of(op.inputs[1], ident)) \
                or (b and self.splat_of(op.inputs[0], ident))
        if op.kind == "integer_pow":
            return op.params.get("y", -1) >= 0 and self.memo[op.inputs[0]]
        taken = self.decided.get(op.inputs[0]) if op.kind == "select_n" and op.inputs else None
        if taken is not None and self.g.tensors[op.inputs[0]].dtype == "bool" and len(op.inputs) == 3:
            return all(self.memo[op.inputs[2 if bool(v) else 1]] for v in taken)
        return op.kind in TOTAL and all(self.memo[i] for i in op.inputs)

    def splat_of(self, t: int, value: float) -> bool:
        """t repeats one literal equal to `value` (through broadcasts and reshapes)."""
        v = literal_value(self.producer, t, ("broadcast_in_dim", "reshape"))
        return v is not None and bool(v.size) and bool(np.all(v.astype(np.float64) == value))

