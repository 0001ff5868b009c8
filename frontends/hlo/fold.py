"""Static evaluation of small values during the HLO lowering (loop counters,
reduce inits, branch selectors): `eval_small` (formerly hlo_text._eval_small)
folds one IR op over known numpy operands, or returns None when it cannot.

Folded values decide loop trip counts and branches, so they must follow XLA's
semantics exactly (bitwise and/or/not on integers, truncating division,
shifts, clamped dynamic-slice starts): they are computed by the project's one
evaluator (dlverify/ops), the one the jaxpr folder and the interpreter use."""
from __future__ import annotations

import numpy as np

from dlverify.ops import NotExecutable, evaluate

# Values small enough to track for static evaluation (loop counters, inits).
KNOWN_LIMIT = 4096


def eval_small(kind: str, xs: list[np.ndarray], shape: tuple[int, ...], p: dict,
               dtype: str) -> np.ndarray | None:
    """The value of IR op `kind` on known operands `xs` (result shape `shape`,
    element type `dtype`, params `p`); None when the evaluator cannot compute it."""
    try:
        return evaluate(kind, p, xs, shape, dtype)
    except NotExecutable:
        return None
