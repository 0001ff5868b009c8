"""Static evaluation of small values during the HLO lowering (loop counters,
reduce inits, branch selectors): `eval_small` (formerly hlo_text._eval_small)
folds one IR op over known numpy operands, or returns None when it cannot.

Folded values decide loop trip counts and branches, so they must follow XLA's
semantics exactly (bitwise and/or/not on integers). This body is to be
replaced by the project's shared evaluator."""
from __future__ import annotations

from typing import Any

import numpy as np

# Values small enough to track for static evaluation (loop counters, inits).
KNOWN_LIMIT = 4096


def eval_small(kind: str, xs: list[np.ndarray], shape: tuple[int, ...], p: dict) -> Any:
    """The value of IR op `kind` on known operands `xs` (result shape `shape`,
    params `p`); None when the kind is not folded."""
    ew = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
          "min": np.minimum, "and": np.logical_and, "or": np.logical_or, "eq": np.equal,
          "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
          "ge": np.greater_equal}
    if kind in ew:
        a, b = xs
        if a.dtype == np.bool_ and kind in ("and", "or"):
            return ew[kind](a, b)
        if kind == "and":
            return np.bitwise_and(a, b)
        if kind == "or":
            return np.bitwise_or(a, b)
        return ew[kind](a, b)
    if kind == "div":
        a, b = xs
        if np.issubdtype(a.dtype, np.integer):
            return np.trunc(a / b).astype(a.dtype)
        return a / b
    if kind == "neg":
        return -xs[0]
    if kind == "not":
        return np.logical_not(xs[0]) if xs[0].dtype == np.bool_ else np.invert(xs[0])
    if kind == "select_n":
        return np.choose(xs[0].astype(np.int64), xs[1:])
    if kind == "broadcast_in_dim":
        x = xs[0]
        sh = [1] * len(shape)
        for i, d in enumerate(p["broadcast_dimensions"]):
            sh[d] = x.shape[i]
        return np.broadcast_to(x.reshape(sh), shape)
    if kind == "reshape":
        return xs[0].reshape(shape)
    if kind == "convert_to_int":
        return np.trunc(xs[0]).astype(np.int64)
    if kind == "convert_to_bool":
        return xs[0] != 0
    if kind == "iota":
        idx = np.arange(shape[p["dimension"]])
        sh = [1] * len(shape)
        sh[p["dimension"]] = -1
        return np.broadcast_to(idx.reshape(sh), shape)
    if kind == "slice":
        st = p.get("strides") or (1,) * len(shape)
        return xs[0][tuple(slice(a, b, s) for a, b, s in
                           zip(p["start_indices"], p["limit_indices"], st))]
    if kind == "concatenate":
        return np.concatenate(xs, axis=p["dimension"])
    if kind == "transpose":
        return np.transpose(xs[0], p["permutation"])
    return None

