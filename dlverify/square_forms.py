"""One spelling of a square: `integer_pow(x, 2)` (`x ** 2`) becomes `square(x)`
(`jnp.square`, which `jnp.var` uses), on both graphs of a program pair as written
(jaxprs; XLA writes both as one multiply). `mul(x, x)` stays: the bug pattern of a
partial sum times a partial sum (patterns/, rules tests) reads it as a product.

The two are the same function of x, exactly, in floating point too; the rules
relate one op to an op of the same kind, so a hand-written variance
`mean((x - mu) ** 2)` on one side and `jnp.var(x)` on the other met nowhere.
tests/test_square_forms.py checks the rewrite on random data with the shared
evaluator and leaves other powers and products of two different values.
"""
from __future__ import annotations

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.rewrites import _Rewriter


class _Squares(_Rewriter):
    def apply(self, op: Op) -> bool:
        if op.kind != "integer_pow" or len(op.inputs) != 1 or op.params.get("y") != 2:
            return False
        x = op.inputs[0]
        out = self.g.tensors[op.output]
        self.new_op("square", [x], out.shape, out.dtype, {}, op, output=op.output)
        return True


def square_forms(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite g's squares into `square` ops (module doc); whether anything changed."""
    return _Squares(g, ids).run()
