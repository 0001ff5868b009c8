"""Elementwise HLO opcodes: unary and binary arithmetic, compare, select,
clamp, rounding, and element type conversions."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.model import HloComputation, HloInstruction, np_dtype
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc, is_float_dtype
from dlverify.ops.dtypes import convert_kind, is_int_dtype

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


UNARY = {
    "abs": "abs", "ceil": "ceil", "floor": "floor", "cosine": "cos", "sine": "sin", "tan": "tan",
    "exponential": "exp", "exponential-minus-one": "expm1", "log": "log",
    "log-plus-one": "log1p", "logistic": "logistic", "negate": "neg", "not": "not",
    "sign": "sign", "sqrt": "sqrt", "rsqrt": "rsqrt", "cbrt": "cbrt", "tanh": "tanh",
    "is-finite": "is_finite", "popcnt": "population_count", "count-leading-zeros": "clz",
    "clz": "clz", "real": "real", "imag": "imag", "erf": "erf",
}
BINARY = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max",
    "minimum": "min", "power": "pow", "remainder": "rem", "atan2": "atan2", "and": "and",
    "or": "or", "xor": "xor", "shift-left": "shift_left",
    "shift-right-logical": "shift_right_logical",
    "shift-right-arithmetic": "shift_right_arithmetic", "complex": "complex",
}
_COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}
# str(jax.lax.RoundingMethod.X), as frontends/jaxpr.py records it.
_ROUNDING = {"round-nearest-afz": "0", "round-nearest-even": "1"}


@handler(*UNARY, *BINARY)
def _arithmetic(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    return L.elementwise(ins, UNARY.get(ins.opcode) or BINARY[ins.opcode], ops, loc)


@handler("compare")
def _compare(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    d = (ins.attrs.get("direction") or "").strip()
    if d not in _COMPARE:
        raise L.err(ins, f"compare without a known direction (got {d!r})")
    if L.bit_reinterpretation and (ins.attrs.get("type") or "").strip() == "TOTALORDER":
        return _total_order_compare(L, ins, ops, loc, _COMPARE[d])
    return L.elementwise(ins, _COMPARE[d], ops, loc)


def _total_order_compare(L: Lowerer, ins: HloInstruction, ops: list[Val], loc: SourceLoc,
                         kind: str) -> int:
    """XLA's `type=TOTALORDER` float compare, in a comparator being evaluated:
    the floats' bits read as signed integers, negatives flipped to
    `x ^ INT_MAX` (so -0 < +0 and NaN orders by its sign), compared as
    integers; exactly how XLA expands it."""
    a, b = (L.tid(ins, v) for v in ops)
    src = L.dtype_of(a)
    if not is_float_dtype(src):
        return L.elementwise(ins, kind, ops, loc)
    bits = np_dtype(src).itemsize * 8
    it = f"int{bits}"
    shape = L.shape_of(a)
    zero = L.b.constant(np.zeros(shape, np.dtype(it)), shape, it, loc, ins.name)
    top = L.b.constant(np.full(shape, 2 ** (bits - 1) - 1, np.dtype(it)), shape, it, loc, ins.name)
    keys = []
    for x in (a, b):
        i = L.emit("bitcast_convert", [x], shape, it, {"from": src}, loc, ins.name)
        neg = L.emit("lt", [i, zero], shape, "bool", {}, loc, ins.name)
        flip = L.emit("xor", [top, i], shape, it, {}, loc, ins.name)
        keys.append(L.emit("select_n", [neg, i, flip], shape, it, {}, loc, ins.name))
    return L.emit(kind, keys, L.array_shape(ins).dims, "bool", {}, loc, ins.name)


@handler("select")
def _select(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    if len(ops) != 3:
        raise L.err(ins, "select takes (pred, on_true, on_false)")
    if isinstance(ops[1], tuple):  # old tuple select: statically chosen only
        raise L.unknown(ins, "select of tuples is not supported")
    pred, on_true, on_false = ops
    return L.elementwise(ins, "select_n", [pred, on_false, on_true], loc)


@handler("clamp")
def _clamp(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return L.elementwise(ins, "clamp", ops, loc)  # clamp(min, x, max), as lax.clamp


@handler("round-nearest-afz", "round-nearest-even")
def _round(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return L.elementwise(ins, "round", ops, loc, {"rounding": _ROUNDING[ins.opcode]})


@handler("convert")
def _convert(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    src = L.dtype_of(t)
    dst = L.array_shape(ins).dtype
    kind = convert_kind(src, dst)
    if kind is None:  # an identity over the reals (see convert_kind)
        if L.shape_of(t) != ins.shape.dims:
            raise L.err(ins, f"convert changes the shape {L.shape_of(t)} -> {ins.shape.dims}")
        return t
    return L.elementwise(ins, kind, [t], loc)


@handler("bitcast-convert")
def _bitcast_convert(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                     loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    if L.dtype_of(t) == ins.shape.dtype and L.shape_of(t) == ins.shape.dims:
        return t
    sh = L.array_shape(ins)
    src = L.dtype_of(t)
    same_width = np_dtype(src).itemsize == np_dtype(sh.dtype).itemsize
    if is_int_dtype(src) and (is_int_dtype(sh.dtype) or same_width and L.shape_of(t) == sh.dims):
        # integer bits (a PRNG key, random bits read as a float's mantissa): a
        # function of the integer's value; to integers of any width
        a, b = np_dtype(src).itemsize, np_dtype(sh.dtype).itemsize
        shape = L.shape_of(t)
        want = (shape if a == b else shape + (a // b,) if a > b
                else shape[:-1] if shape and shape[-1] * a == b else None)
        if want != sh.dims:
            raise L.err(ins, f"bitcast-convert {src}{list(shape)} -> {sh} does not keep the bits "
                             f"(expected shape {list(want) if want is not None else 'none'})")
        return L.emit("bitcast_convert", [t], sh.dims, sh.dtype, {"from": src}, loc, ins.name)
    return reinterpret_bits(L, ins, t, loc)



def reinterpret_bits(L: Lowerer, ins: HloInstruction, t: int, loc: SourceLoc) -> int:
    """A bitcast between element types of one width, same shape: only inside a
    comparator being evaluated (see Lowerer.bit_reinterpretation)."""
    sh = L.array_shape(ins)
    src = L.dtype_of(t)
    if not L.bit_reinterpretation:
        raise L.unknown(ins, f"{ins.opcode} reinterprets the bits of {src} as {sh.dtype}: no "
                             f"translation")
    if L.shape_of(t) != sh.dims or np_dtype(src).itemsize != np_dtype(sh.dtype).itemsize:
        raise L.unknown(ins, f"{ins.opcode} {src}{list(L.shape_of(t))} -> {sh} changes the width "
                             f"or shape")
    return L.emit("bitcast_convert", [t], sh.dims, sh.dtype, {"from": src}, loc, ins.name)
