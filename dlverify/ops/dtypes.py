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


def exact_dtype(dtype: object) -> np.dtype | None:
    """The numpy type of an integer or bool element type; None for floating point
    and for names numpy does not know (token, int4, ...)."""
    name = str(dtype)
    if is_float_dtype(name):
        return None
    try:
        dt = np.dtype(name)
    except TypeError:
        return None
    return dt if dt == np.bool_ or np.issubdtype(dt, np.integer) else None


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
