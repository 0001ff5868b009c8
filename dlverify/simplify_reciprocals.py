"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier` runs
`scaled_reciprocal` in its pass): a product with a reciprocal that a literal scales.

simplify.py's `reciprocal` reads `x * (1/y)` as `x / y`. XLA's optimisations may
apply a literal factor of the product to the reciprocal instead, the smaller
operand: the backward of `o / l` (compiled ring_attention_grads) multiplies the
cotangent by `1/(l*l)`; the program computes `(g * 0.125) * broadcast(1 / (l*l))`,
XLA `g * broadcast((1 / (l*l)) * 0.125)` (read `/ 8` by exact_scaling). The literal then sits between the product and the
reciprocal, and `reciprocal` never meets it. So, for a splat literal c (finite,
nonzero) and the reciprocal `1/y`, directly or through a broadcast_in_dim:

* `x * ((1/y) / c)` is `(x / y) / c`;
* `x * ((1/y) * c)` and `x * (c * (1/y))` are `(x / y) * c`;
* `x * (c / y)` is `(x / y) * c` (`c * (1/y)` written as one division).

Each is an identity of real arithmetic wherever y is nonzero (where the program
computes a finite value at all); through a broadcast, y is broadcast as the
reciprocal was (`broadcast(1/y) = 1 / broadcast(y)`). The literal leaves toward the
outputs, as `negated_sum` moves negations and `sink_reshape` reshapes, and a
literal divisor or factor one side applies to the other factor is a scaled view
the rules relate (a division by a literal gives `1/c x` its operand's view, for a
c the scales express: a product of powers of schema.SCALE_PRIMES). No
rule here makes a product with a reciprocal, so none undoes another, and nothing
fires when the other factor is itself a literal (`literal_product`'s case).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


def scaled_reciprocal(s: "_Simplifier", op: Op) -> bool:
    """Whether `op`, a product with a scaled reciprocal (module doc), was replaced by
    the division times (or divided by) the literal."""
    out = s.float_binary(op, "mul")
    if out is None:
        return False
    for pos in (0, 1):
        x, factor = op.inputs[1 - pos], op.inputs[pos]
        if s.splat(x) is not None or s.shape(x) != out.shape or s.g.tensors[x].dtype != out.dtype:
            continue
        scaled = s.producer.get(factor)
        bcast = None
        if scaled is not None and scaled.kind == "broadcast_in_dim":
            bcast, scaled = scaled, s.producer.get(scaled.inputs[0])
        found = _scaled(s, scaled, out.dtype) if scaled is not None else None
        if found is None:
            continue
        y, kind, c = found
        if bcast is not None:
            y = s.new_op("broadcast_in_dim", [y], s.shape(bcast.output), out.dtype, bcast.params,
                         bcast)
        quotient = s.new_op("div", [x, y], out.shape, out.dtype, {}, op)
        literal = s.splat_of(c, out.shape, out.dtype, op)
        s.new_op(kind, [quotient, literal], out.shape, out.dtype, {}, op, output=op.output)
        return True
    return False


def _scaled(s: "_Simplifier", q: Op, dtype: str) -> tuple[int, str, float] | None:
    """q as `(1/y) / c`, `(1/y) * c`, `c * (1/y)` or `c / y`: (y, "div" or "mul", c)."""
    if len(q.inputs) != 2 or s.g.tensors[q.output].dtype != dtype:
        return None
    if q.kind == "div":
        k = _literal(s, q.inputs[0])
        if k is not None and k != 1.0 and s.splat(q.inputs[1]) is None \
                and s.shape(q.inputs[1]) == s.shape(q.output):
            return q.inputs[1], "mul", k                        # c / y
        c = _literal(s, q.inputs[1])
        y = _reciprocal_of(s, q.inputs[0])
        return (y, "div", c) if c is not None and y is not None else None
    if q.kind == "mul":
        for cpos in (0, 1):
            c, y = _literal(s, q.inputs[cpos]), _reciprocal_of(s, q.inputs[1 - cpos])
            if c is not None and y is not None:
                return y, "mul", c
    return None


def _literal(s: "_Simplifier", t: int) -> float | None:
    """The finite nonzero value splat tensor t holds everywhere."""
    value = s.splat(t)
    return value if value is not None and math.isfinite(value) and value != 0.0 else None


def _reciprocal_of(s: "_Simplifier", t: int) -> int | None:
    """y when t is `1 / y` (the splat 1 of y's shape), else None."""
    r = s.producer.get(t)
    if r is None or r.kind != "div" or len(r.inputs) != 2 or s.splat(r.inputs[0]) != 1.0 \
            or s.splat(r.inputs[1]) is not None or s.shape(r.inputs[1]) != s.shape(t):
        return None
    return r.inputs[1]


__all__ = ["scaled_reciprocal"]
