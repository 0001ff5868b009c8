"""Element types by their IR names ("float32", "int8", "uint32", "bool",
"bfloat16", ...): which are floating point, and the numpy type of the exact ones.

Floating point values are evaluated as approximations of reals (in float64
where an operand is an integer), integer and bool values exactly, in their own
width, as XLA computes them (wrapping on overflow)."""
from __future__ import annotations

import numpy as np


def is_float_dtype(dtype: object) -> bool:
    """Floating (or complex) element type, by name: covers bfloat16 and the float8
    types, which numpy does not count as np.floating."""
    return str(dtype).startswith(("float", "bfloat", "complex"))


def is_int_dtype(dtype: object) -> bool:
    """Signed or unsigned integer element type, by name (any width)."""
    return str(dtype).startswith(("int", "uint"))


# By name: numpy reads "int4" and "int2" as its legacy 4- and 2-byte aliases,
# while the IR (from HLO's s4, s2) means 4- and 2-bit integers.
_EXACT = {name: np.dtype(name) for name in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                            "uint16", "uint32", "uint64")}


def exact_dtype(dtype: object) -> np.dtype | None:
    """The numpy type of an integer or bool element type; None for floating point
    and for types numpy has no exact counterpart of (token, int4, uint2, ...)."""
    return _EXACT.get(str(dtype))


def is_exact(x: np.ndarray) -> bool:
    """Integer or bool values (computed exactly, with XLA's wrap-around)."""
    return x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer)


def convert_kind(src: object, dst: object) -> str | None:
    """How the IR records an element type conversion from `src` to `dst`: None
    when it is an identity over the reals (float <-> float, int/bool -> float,
    and int/bool -> an integer type holding every source value), else the
    kind that computes it: "convert_to_bool" (x != 0) or "convert_to_int"
    (float -> int truncates and saturates; a narrowing or sign-changing
    int -> int cast wraps, as XLA's convert does)."""
    if is_float_dtype(dst):
        return None
    s, d = exact_dtype(src), exact_dtype(dst)
    if not is_float_dtype(src) and s is not None and d is not None and np.can_cast(s, d, "safe"):
        return None
    return "convert_to_bool" if str(dst) == "bool" else "convert_to_int"
