"""Numpy semantics of the IR op kinds: one function per kind (or per family of
kinds), referenced from the op-kind table (dlverify/ops/table.py).

Integer and bool values follow XLA exactly: `and`/`or`/`xor`/`not` are bitwise
on integers and logical on bool; division truncates toward zero and the
remainder takes the dividend's sign (x / 0 is -1, x rem 0 is x); shift amounts
are read as unsigned and a shift by the bit width or more gives 0 (logical) or
the sign fill (arithmetic); float -> int conversion truncates and saturates
(NaN -> 0); dynamic-slice starts are clamped so the window stays in bounds.
Floating point values are approximations of reals, computed in float64 where an
operand is an integer. Anything this module cannot evaluate faithfully raises
NotExecutable instead of guessing.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlverify.ops.dtypes import exact_dtype, is_exact


class NotExecutable(Exception):
    """No faithful numeric semantics here: an elided constant, an op kind without
    semantics, or operands outside what the semantics covers."""


@dataclass(frozen=True)
class Call:
    """One application of an op on one rank: the operand values, the op's params,
    the result's shape and IR dtype, and (for axis_index) this rank's coordinate
    along a named mesh axis."""

    params: Mapping[str, Any]
    ins: Sequence[np.ndarray]
    out_shape: tuple[int, ...]
    out_dtype: str
    axis_coord: Callable[[str], int] | None = None


LocalFn = Callable[[Call], np.ndarray]


# ----------------------------------------------------------------- operands
def cast_like_result(x: np.ndarray, out_dtype: str) -> np.ndarray:
    """An operand of a same-type elementwise op, in the type the op computes in:
    the result's own integer/bool type (which applies the wrap of an int -> int
    cast the frontends record as an identity), else a float (float64 for
    integer operands of a float op)."""
    x = np.asarray(x)
    dt = exact_dtype(out_dtype)
    if dt is not None:
        if not is_exact(x):
            raise NotExecutable(f"float operand of an op whose result is {out_dtype}")
        return x.astype(dt)
    return x.astype(np.float64) if is_exact(x) else x


def _same_type(call: Call) -> list[np.ndarray]:
    return [cast_like_result(x, call.out_dtype) for x in call.ins]


def _common(xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Operands of a comparison: compared in a common type (float64 if any is a float)."""
    xs = [np.asarray(x) for x in xs]
    if all(is_exact(x) for x in xs):
        return xs
    return [x.astype(np.float64) if is_exact(x) else x for x in xs]


def _int_info(x: np.ndarray) -> tuple[int, np.dtype, np.dtype]:
    """Bit width, and the unsigned and signed types of that width."""
    bits = x.dtype.itemsize * 8
    return bits, np.dtype(f"uint{bits}"), np.dtype(f"int{bits}")


def _require_int(xs: Sequence[np.ndarray], what: str) -> None:
    if any(not np.issubdtype(x.dtype, np.integer) for x in xs):
        raise NotExecutable(f"{what} of non-integer operands")


# ----------------------------------------------------------------- elementwise
def unary(fn: Callable[[np.ndarray], np.ndarray]) -> LocalFn:
    def ev(call: Call) -> np.ndarray:
        return fn(*_same_type(call))
    return ev


def binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> LocalFn:
    def ev(call: Call) -> np.ndarray:
        return fn(*_same_type(call))
    return ev


def float_only(fn: Callable[..., np.ndarray]) -> LocalFn:
    """Transcendental functions: defined on floats only."""
    def ev(call: Call) -> np.ndarray:
        xs = _same_type(call)
        if any(is_exact(x) for x in xs):
            raise NotExecutable("a floating-point function with an integer result")
        return fn(*xs)
    return ev


def compare(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> LocalFn:
    def ev(call: Call) -> np.ndarray:
        return fn(*_common(call.ins))
    return ev


def bitwise(fn: Callable[..., np.ndarray]) -> LocalFn:
    """and/or/xor/not: numpy's bitwise ufuncs are logical on bool and bitwise on
    integers, exactly XLA's semantics."""
    def ev(call: Call) -> np.ndarray:
        xs = _same_type(call)
        if any(not is_exact(x) for x in xs):
            raise NotExecutable("bitwise op on floats")
        return fn(*xs)
    return ev


def divide(call: Call) -> np.ndarray:
    a, b = _same_type(call)
    if not is_exact(a):
        return np.true_divide(a, b)
    if a.dtype == np.bool_:
        raise NotExecutable("division of bools")
    zero = b == 0
    overflow = (b == -1) & (a == np.iinfo(a.dtype).min) if np.issubdtype(a.dtype, np.signedinteger) \
        else np.zeros(np.broadcast(a, b).shape, bool)
    safe = np.where(zero | overflow, np.ones_like(b), b)
    q = np.floor_divide(a, safe)
    # floor -> toward zero: one up where the division was inexact and the signs differ
    inexact = np.remainder(a, safe) != 0
    q = np.where(inexact & ((a < 0) != (safe < 0)), q + 1, q).astype(a.dtype)
    q = np.where(overflow, a, q)          # MIN / -1 wraps to MIN
    return np.where(zero, np.array(-1).astype(a.dtype), q)   # x / 0 is all ones


def remainder(call: Call) -> np.ndarray:
    a, b = _same_type(call)
    if not is_exact(a):
        return np.fmod(a, b)  # C fmod: sign of the dividend, like XLA
    if a.dtype == np.bool_:
        raise NotExecutable("remainder of bools")
    zero = b == 0
    safe = np.where(zero, np.ones_like(b), b)
    if np.issubdtype(a.dtype, np.signedinteger):
        safe = np.where(safe == -1, np.ones_like(b), safe)  # x rem -1 is 0; avoids MIN rem -1
    return np.where(zero, a, np.fmod(a, safe))             # x rem 0 is x


def power(call: Call) -> np.ndarray:
    a, b = _same_type(call)
    if is_exact(a):
        if np.any(b < 0):
            raise NotExecutable("integer power with a negative exponent")
        return np.power(a, b)
    return np.power(a, b)


def integer_pow(call: Call) -> np.ndarray:
    (x,) = _same_type(call)
    y = int(call.params["y"])
    if is_exact(x) and y < 0:
        raise NotExecutable("integer_pow of an integer with a negative exponent")
    return np.power(x, y) if y >= 0 else np.power(x, float(y))


def _shift_amount(x: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shift amount as an unsigned value of x's width, and where it is >= the width."""
    bits, utype, _ = _int_info(x)
    amount = s.astype(utype)
    big = amount >= bits
    return np.where(big, np.zeros_like(amount), amount), big


def _logical_shift(call: Call, shift: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """A shift of x's bits as unsigned; an amount >= the width shifts every bit out (0)."""
    x, s = _same_type(call)
    _require_int([x, s], "shift")
    _, utype, _ = _int_info(x)
    amount, big = _shift_amount(x, s)
    r = shift(x.astype(utype), amount)
    return np.where(big, np.zeros_like(r), r).astype(x.dtype)


def shift_left(call: Call) -> np.ndarray:
    return _logical_shift(call, np.left_shift)


def shift_right_logical(call: Call) -> np.ndarray:
    return _logical_shift(call, np.right_shift)


def shift_right_arithmetic(call: Call) -> np.ndarray:
    x, s = _same_type(call)
    _require_int([x, s], "shift")
    _, _, stype = _int_info(x)
    amount, big = _shift_amount(x, s)
    signed = x.astype(stype)           # the top bit is the sign, also for unsigned types
    r = np.right_shift(signed, amount.astype(stype))
    fill = np.where(signed < 0, np.array(-1, stype), np.array(0, stype))
    return np.where(big, fill, r).astype(x.dtype)


def _bit_length(x: np.ndarray) -> tuple[np.ndarray, int]:
    bits, utype, _ = _int_info(x)
    u = x.astype(utype)
    length = np.zeros(u.shape, np.int64)
    for k in range(bits):
        length = np.where((u >> np.array(k, utype)) != 0, k + 1, length)
    return length, bits


def population_count(call: Call) -> np.ndarray:
    (x,) = _same_type(call)
    _require_int([x], "population_count")
    bits, utype, _ = _int_info(x)
    u = x.astype(utype)
    one = np.array(1, utype)
    return sum(((u >> np.array(k, utype)) & one).astype(np.int64) for k in range(bits))


def clz(call: Call) -> np.ndarray:
    (x,) = _same_type(call)
    _require_int([x], "clz")
    length, bits = _bit_length(x)
    return bits - length


def convert_to_int(call: Call) -> np.ndarray:
    """float -> int truncates toward zero and saturates at the type's range; NaN is 0
    (XLA's conversion). int -> int wraps."""
    dt = exact_dtype(call.out_dtype)
    if dt is None or dt == np.bool_:
        raise NotExecutable(f"convert_to_int with result type {call.out_dtype}")
    x = np.asarray(call.ins[0])
    if is_exact(x):
        return x.astype(dt)
    if np.iscomplexobj(x):
        raise NotExecutable("convert of a complex value to an integer")
    info = np.iinfo(dt)
    x = x.astype(np.float64)
    lo, hi = float(info.min), float(info.max)
    inside = np.where(np.isnan(x), 0.0, np.clip(np.trunc(x), lo, hi))
    # float(info.max) may round up to 2^63 or 2^64: saturate those explicitly
    over = inside >= hi
    val = np.where(over, 0.0, inside).astype(dt)
    return np.where(over, np.array(info.max, dt), val)


def convert_to_bool(call: Call) -> np.ndarray:
    return np.asarray(call.ins[0]) != 0


def round_half(call: Call) -> np.ndarray:
    """`round`: half away from zero (rounding "0", lax's default) or half to even ("1")."""
    (x,) = _same_type(call)
    method = str(call.params.get("rounding", "0"))
    if method not in ("0", "1"):
        raise NotExecutable(f"round with rounding method {method!r}")
    if method == "1":
        return np.round(x)
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)  # x - trunc(x) is exact


def select_n(call: Call) -> np.ndarray:
    which = np.asarray(call.ins[0])
    cases = [cast_like_result(c, call.out_dtype) for c in call.ins[1:]]
    idx = which.astype(np.int64)
    if np.any(idx < 0) or np.any(idx >= len(cases)):
        raise NotExecutable("select_n with a case index out of range")
    return np.choose(idx, cases)


def clamp(call: Call) -> np.ndarray:
    lo, x, hi = _same_type(call)
    return np.minimum(np.maximum(x, lo), hi)


def complex_of(call: Call) -> np.ndarray:
    a, b = _common(call.ins)
    return np.asarray(a) + 1j * np.asarray(b)


def reciprocal(x: np.ndarray) -> np.ndarray:
    return 1.0 / x


def rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


# ----------------------------------------------------------------- sources
def constant(call: Call) -> np.ndarray:
    v = call.params.get("value")
    if v is None:
        raise NotExecutable("a constant whose value is elided")
    return np.asarray(v)


def iota(call: Call) -> np.ndarray:
    shape, dim = call.out_shape, call.params["dimension"]
    idx = np.arange(shape[dim])
    sh = [1] * len(shape)
    sh[dim] = -1
    return np.broadcast_to(idx.reshape(sh), shape)


def axis_index(call: Call) -> np.ndarray:
    if call.axis_coord is None:
        raise NotExecutable("axis_index outside a distributed program")
    return np.asarray(call.axis_coord(call.params["axis"]))
