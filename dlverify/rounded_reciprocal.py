"""Division by a literal, as XLA's algebraic simplifier computes it.

XLA rewrites `x / d` for a floating-point literal d into `x * c` with c the
reciprocal 1/d rounded to the dtype. Over the reals the two differ unless 1/d
is exact (a power of two: `x * 0.03125` is `x / 32`, which simplify.py's
exact_scaling reads as the division). When one program divides by d and the
other multiplies by exactly that rounded reciprocal (or by it folded with a
literal b the quotient is then multiplied by: XLA turns `(x / d) * b` into
`x * fl(fl(1/d) * b)`, an Adam step's `lr * m / (1 - beta1^t)`), the division is
rewritten into the multiplication (simplify.py's literal_product then folds the
b), and the rounding is listed as an assumption naming both literals: the
verdict then speaks of the program as XLA computes it.
Nothing else is rewritten: a multiplier that is not the rounded reciprocal of
a divisor of the other program (a wrong scale) stays a multiplication, and a
program that divides on both sides keeps its divisions.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op


def _literal(g: Graph, producer: dict[int, Op], t: int) -> tuple[float, str] | None:
    """The value and dtype of a floating-point scalar literal t, or of a broadcast of one."""
    op = producer.get(t)
    if op is not None and op.kind == "broadcast_in_dim" and not op.params["broadcast_dimensions"]:
        op = producer.get(op.inputs[0])
    if op is None or op.kind != "constant" or op.params.get("value") is None:
        return None
    v = np.asarray(op.params["value"])
    dtype = g.tensors[op.output].dtype
    try:
        np.dtype(dtype)
    except TypeError:          # a dtype numpy does not name (rounding it is not attempted)
        return None
    if v.shape != () or not np.issubdtype(v.dtype, np.floating) or not np.isfinite(v) or v == 0:
        return None
    return float(v), dtype


def _literal_scales(g: Graph, producer: dict[int, Op]) -> dict[int, set[tuple[float, str]]]:
    """For each tensor, the literals (value, dtype) some product multiplies it by."""
    out: dict[int, set[tuple[float, str]]] = {}
    for op in g.ops:
        if op.kind == "mul" and len(op.inputs) == 2:
            for pos in (0, 1):
                lit = _literal(g, producer, op.inputs[1 - pos])
                if lit is not None:
                    out.setdefault(op.inputs[pos], set()).add(lit)
    return out


def _multipliers(g: Graph) -> set[tuple[float, str]]:
    """Every literal some product of `g` multiplies by."""
    return set().union(*_literal_scales(g, {op.output: op for op in g.ops}).values())


def _rewrite(g: Graph, ids: IdAllocator, wanted: set[tuple[float, str]],
             assumptions: list[str]) -> bool:
    """Divisions of `g` by a literal d whose rounded reciprocal is in `wanted`."""
    producer = {op.output: op for op in g.ops}
    scaled_by = _literal_scales(g, producer)
    changed = False
    ops: list[Op] = []
    for op in g.ops:
        ops.append(op)
        if op.kind != "div" or len(op.inputs) != 2:
            continue
        lit = _literal(g, producer, op.inputs[1])
        if lit is None:
            continue
        d, dtype = lit
        c = float(np.asarray(1.0, dtype) / np.asarray(d, dtype))
        if Fraction(c) * Fraction(d) == 1:
            continue
        # the rounded reciprocal itself, or folded with a literal the quotient is then
        # multiplied by (XLA folds (x * fl(1/d)) * b into x * fl(fl(1/d) * b))
        folded = {(float(np.asarray(c, dtype) * np.asarray(b, dtype)), dtype)
                  for b, _ in scaled_by.get(op.output, ())}
        if (c, dtype) not in wanted and not folded & wanted:
            continue
        divisor = producer[op.inputs[1]]
        # the rounded reciprocal as a new literal (the divisor may have other readers)
        scratch = Graph("reciprocal", tensors=g.tensors)
        b = GraphBuilder(scratch, ids)
        operand = b.constant(np.asarray(c, dtype), (), dtype, divisor.loc, f"{divisor.name}.reciprocal")
        if divisor.kind == "broadcast_in_dim":
            operand = b.op("broadcast_in_dim", [operand], g.tensors[divisor.output].shape, dtype,
                           {"broadcast_dimensions": ()}, divisor.loc, f"{divisor.name}.reciprocal")
        ops[-1:-1] = scratch.ops     # before the division, which becomes the product
        op.kind, op.inputs = "mul", [op.inputs[0], operand]
        scalar = np.dtype(dtype).type   # printed with the dtype's shortest digits
        note = (f"x / {np.format_float_positional(scalar(d))} computed as x * "
                f"{np.format_float_positional(scalar(c))}, the reciprocal rounded to "
                f"{dtype}, as XLA's algebraic simplifier does")
        if note not in assumptions:
            assumptions.append(note)
        changed = True
    g.ops = ops
    return changed


def match_rounded_reciprocals(seq: Graph, dist: Graph, ids: IdAllocator,
                              assumptions: list[str]) -> bool:
    """Rewrite each program's divisions by a literal that the other program computes as
    a multiplication by its rounded reciprocal (module doc). Returns whether anything
    changed."""
    seq_mul, dist_mul = _multipliers(seq), _multipliers(dist)
    return (_rewrite(seq, ids, dist_mul - seq_mul, assumptions)
            | _rewrite(dist, ids, seq_mul - dist_mul, assumptions))


__all__ = ["match_rounded_reciprocals"]
