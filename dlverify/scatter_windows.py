"""A scatter whose indices are known before run time, as the window updates it is
(XLA's operation semantics): each index vector places one window of the updates
at the start it gives, in the dims of `scatter_dims_to_operand_dims`; operand dims
in `inserted_window_dims` have a window of size 1:

    set:      out = dynamic_update_slice(out, window, start)
    combine:  out = dynamic_update_slice(out, f(slice(out, window), window), start)

which the rules already relate. Both frontends call `window_updates` (the jaxpr
`scatter*` primitives, `x.at[i].set(v)`; HLO `scatter` with an overwriting or a
combining reducer, as the SPMD partitioner leaves `.at[].set`). Overlapping windows
of a set (XLA leaves their order unspecified) and windows out of bounds (dropped
or implementation-defined) are refused through `refuse`, unless the mode clips.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

MAX_WINDOWS = 1024  # index vectors: a scatter of more is not unrolled into window updates

# (kind, inputs, shape, dtype, params) -> the new op's result, at the scatter's location
Emit = Callable[[str, list[int], tuple[int, ...], str, dict], int]


@dataclass(frozen=True)
class ScatterSite:
    """How to emit ops, an int32 scalar constant, and an error for a refused form."""

    emit: Emit
    index: Callable[[int], int]
    refuse: Callable[[str], Exception]


@dataclass(frozen=True)
class WindowScatter:
    """One scatter: operand, updates and their shapes and types, the known index
    vectors (dim `index_vector_dim` of `indices`), the dimension numbers, the
    combining kind (None: set) and whether starts are clipped into bounds."""

    operand: int
    operand_shape: tuple[int, ...]
    dtype: str
    updates: int
    updates_shape: tuple[int, ...]
    updates_dtype: str
    indices: np.ndarray
    index_vector_dim: int
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    combine: str | None
    clip: bool


def _overlap(a: list[int], b: tuple[int, ...], window: list[int]) -> bool:
    return all(x < y + w and y < x + w for x, y, w in zip(a, b, window))


def window_updates(site: ScatterSite, s: WindowScatter) -> int:
    """The scatter's result as a chain of window updates of the operand."""
    op_shape, U = s.operand_shape, s.updates_shape
    scatter_dims = [d for d in range(len(U)) if d not in s.update_window_dims]
    free = [k for k in range(len(op_shape)) if k not in s.inserted_window_dims]
    if len(free) != len(s.update_window_dims):
        raise site.refuse("with update window dims that do not fit the operand")
    window = [1] * len(op_shape)
    for k, d in zip(free, s.update_window_dims):
        window[k] = U[d]
    positions = list(np.ndindex(*[U[d] for d in scatter_dims]))
    if len(positions) > MAX_WINDOWS:
        raise site.refuse(f"of {len(positions)} windows is too large to unroll "
                          f"(limit {MAX_WINDOWS})")
    idx = np.asarray(s.indices)
    if s.index_vector_dim >= idx.ndim:   # one index per position
        idx = idx[..., None]
    else:
        idx = np.moveaxis(idx, s.index_vector_dim, -1)
    vectors = idx.reshape(-1, idx.shape[-1]) if idx.size else idx.reshape(0, idx.shape[-1])
    if len(vectors) != len(positions) or idx.shape[-1] != len(s.scatter_dims_to_operand_dims):
        raise site.refuse("whose index vectors do not match its update positions")
    starts_seen: list[tuple[int, ...]] = []
    out = s.operand
    for n, pos in enumerate(positions):
        start = [0] * len(op_shape)
        for i, k in enumerate(s.scatter_dims_to_operand_dims):
            start[k] = int(vectors[n][i])
        for k in range(len(op_shape)):
            hi = op_shape[k] - window[k]
            if s.clip:
                start[k] = min(max(start[k], 0), hi)
            elif not 0 <= start[k] <= hi:
                raise site.refuse(f"with a window out of bounds (start {start[k]} in dim {k} "
                                  f"of size {op_shape[k]}) is not supported")
        if s.combine is None and any(_overlap(start, t, window) for t in starts_seen):
            raise site.refuse("with overlapping windows (their order is unspecified) is not "
                              "supported")
        starts_seen.append(tuple(start))
        # the window of the updates at this position, shaped like the operand's window
        lo = [0] * len(U)
        hi_ = list(U)
        for d, p in zip(scatter_dims, pos):
            lo[d], hi_[d] = p, p + 1
        piece = site.emit("slice", [s.updates], tuple(h - l for l, h in zip(lo, hi_)),
                          s.updates_dtype, {"start_indices": tuple(lo), "limit_indices": tuple(hi_),
                                            "strides": None})
        piece = site.emit("reshape", [piece], tuple(window), s.updates_dtype, {})
        if s.combine is not None:
            current = site.emit("slice", [out], tuple(window), s.dtype, {
                "start_indices": tuple(start),
                "limit_indices": tuple(a + w for a, w in zip(start, window)), "strides": None})
            piece = site.emit(s.combine, [current, piece], tuple(window), s.dtype, {})
        offsets = [site.index(a) for a in start]
        out = site.emit("dynamic_update_slice", [out, piece] + offsets, op_shape, s.dtype, {})
    return out
