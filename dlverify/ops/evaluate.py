"""The one numpy evaluator of the IR: every place that computes op values (the
constant folder, the interpreter behind witnesses and rule tests, the HLO
lowering's static folding) calls `evaluate` or `evaluate_ranks`.

Results keep the op's integer or bool type exactly (XLA wraps on overflow);
floating point results stay in the precision numpy computed them in (float64
for the interpreter's inputs), as approximations of reals.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dlverify.ops.dtypes import exact_dtype, is_exact
from dlverify.ops.semantics import Call, NotExecutable
from dlverify.ops.table import KINDS


def _as_result(v: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    v = np.asarray(v)
    dt = exact_dtype(dtype)
    if dt is not None:
        if not is_exact(v):
            raise NotExecutable(f"a floating-point value for a {dtype} result")
        v = v.astype(dt)
    elif is_exact(v) and str(dtype).startswith(("float", "bfloat", "complex")):
        v = v.astype(np.complex128 if str(dtype).startswith("complex") else np.float64)
    if v.shape != tuple(shape):
        if v.size == 1:
            return np.broadcast_to(v.reshape(()), shape)
        if v.size != int(np.prod(shape)):
            raise NotExecutable(f"a value of shape {v.shape} for a result of shape {shape}")
        v = v.reshape(shape)
    return v


def evaluate(kind: str, params: Mapping[str, Any], ins: Sequence[np.ndarray],
             out_shape: tuple[int, ...], out_dtype: str,
             axis_coord: Callable[[str], int] | None = None) -> np.ndarray:
    """The value of one op on one rank. Raises NotExecutable when the kind has
    no numpy semantics here (or none for these operands)."""
    entry = KINDS.get(kind)
    if entry is None or entry.local is None:
        raise NotExecutable(f"no numeric semantics for op kind {kind!r}")
    if not entry.arity.accepts(len(ins)):
        raise NotExecutable(f"{kind} with {len(ins)} operands")
    call = Call(params, [np.asarray(x) for x in ins], tuple(out_shape), out_dtype, axis_coord)
    try:
        with np.errstate(all="ignore"):
            v = entry.local(call)
    except (ValueError, IndexError, TypeError, OverflowError, ZeroDivisionError) as e:
        raise NotExecutable(f"{kind}: {type(e).__name__}: {e}") from None
    return _as_result(v, out_shape, out_dtype)


def evaluate_ranks(kind: str, params: Mapping[str, Any], ins: Sequence[Sequence[np.ndarray]],
                   out_shape: tuple[int, ...], out_dtype: str, ranks: int,
                   axis_coord: Callable[[int, str], int] | None = None) -> list[np.ndarray]:
    """The value of one op on every rank: `ins[i][r]` is operand i on rank r.
    Collectives exchange values between ranks; every other kind runs per rank."""
    entry = KINDS.get(kind)
    if entry is not None and entry.collective is not None:
        try:
            with np.errstate(all="ignore"):
                out = entry.collective(dict(params), [np.asarray(x) for x in ins[0]], tuple(out_shape))
        except (ValueError, IndexError, TypeError) as e:
            raise NotExecutable(f"{kind}: {type(e).__name__}: {e}") from None
        return [_as_result(v, out_shape, out_dtype) for v in out]
    out = []
    for r in range(ranks):
        coord = (lambda axis, r=r: axis_coord(r, axis)) if axis_coord is not None else None
        out.append(evaluate(kind, params, [x[r] for x in ins], out_shape, out_dtype, coord))
    return out
