"""Contractions and reductions: dot, reduce (with its identity init check; a
variadic argmax/argmin reduce: argreduce.py), the reduce-window of a
cumulative sum, product, max or min, and a reduce-window whose windows tile
its operand (lowered as pad, slice, reshape and reduce)."""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints, parse_window
from dlverify.frontends.hlo.model import np_dtype
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.argreduce import arg_reduce
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc
from dlverify.window_lowering import ReduceWindow, WindowSite, lower_reduce_window

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


@handler("dot")
def _dot(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    if "sparsity" in ins.attrs or len(ops) != 2:
        raise L.unknown(ins, "sparse dot is not supported")
    return L.elementwise(ins, "dot_general", ops, loc, {
        "lhs_contract": ints(ins.attrs.get("lhs_contracting_dims")),
        "rhs_contract": ints(ins.attrs.get("rhs_contracting_dims")),
        "lhs_batch": ints(ins.attrs.get("lhs_batch_dims")),
        "rhs_batch": ints(ins.attrs.get("rhs_batch_dims"))})


def _identity_value(op: str, dtype: str) -> list[Any]:
    """Acceptable init values of a reduce with reducer `op`."""
    dt = np_dtype(dtype)
    if op == "add":
        return [0]
    if op == "multiply":
        return [1]
    if op in ("or", "xor"):
        return [0, False]
    if op == "and":
        return [True] if dt == np.bool_ else [True, -1] + ([np.iinfo(dt).max] if dt.kind == "u" else [])
    if op in ("maximum", "minimum"):
        inf = float("inf") if op == "minimum" else float("-inf")
        if dt == np.bool_:
            return [op == "minimum"]
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return [info.max if op == "minimum" else info.min]
        vals: list[Any] = [inf]
        try:
            import ml_dtypes
            fi = ml_dtypes.finfo(dt)
        except (ImportError, ValueError, TypeError):
            fi = np.finfo(dt)
        vals.append(float(fi.max) if op == "minimum" else float(fi.min))
        return vals
    return []


_REDUCE_KINDS = {"add": "reduce_sum", "maximum": "reduce_max", "minimum": "reduce_min",
                 "multiply": "reduce_prod", "and": "reduce_and", "or": "reduce_or",
                 "xor": "reduce_xor"}


@handler("reduce")
def _reduce(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    if ins.shape.is_tuple or len(ops) != 2:
        return arg_reduce(L, ins, ops, comp, loc, _identity_value)
    op = L.reducer(ins, {k: k for k in _REDUCE_KINDS})
    x, init = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    if L.shape_of(init) != ():
        raise L.err(ins, "reduce init value must be a scalar")
    val = L.known.get(init)
    ok = _identity_value(op, L.dtype_of(init))
    if val is None:
        raise L.unknown(ins, f"reduce ({op}) with an init value that is not a known constant")
    v = val.reshape(()).item()
    if not any(v == o for o in ok):
        raise L.unknown(ins, f"reduce ({op}) with init value {v}, which is not the identity of "
                             f"{op}")
    sh = L.array_shape(ins)
    axes = ints(ins.attrs.get("dimensions"))
    return L.emit(_REDUCE_KINDS[op], [x], sh.dims, sh.dtype, {"axes": tuple(axes)}, loc, ins.name)


_WINDOW_REDUCERS = {"add": "add", "maximum": "max", "minimum": "min"}
_SCAN_KINDS = {"add": "cumsum", "multiply": "cumprod", "maximum": "cummax", "minimum": "cummin"}


def _identity_init(L: Lowerer, ins: HloInstruction, init: int, op: str) -> None:
    """A reduce-window's init enters every window once: only the reducer's identity
    leaves the windows' reductions unchanged."""
    val = L.known.get(init)
    if val is None or np.shape(val) != () or \
            not any(np.asarray(val).item() == o for o in _identity_value(op, L.dtype_of(init))):
        raise L.unknown(ins, f"reduce-window ({op}) whose init is not a known constant identity "
                             f"of {op}")


def _tiled(win: dict[str, list]) -> bool:
    """Windows that tile the padded operand: stride = size on every dim, padding
    not negative, no dilation or reversal (XLA's tree reduction rewriter)."""
    return all(st == sz for st, sz in zip(win["stride"], win["size"])) and \
        all(lo >= 0 and hi >= 0 for lo, hi in win["pad"]) and \
        all(v == 1 for k in ("lhs_dilate", "rhs_dilate") for v in win[k]) and \
        not any(win["rhs_reversal"])


def _tiled_reduce(L: Lowerer, ins: HloInstruction, x: int, init: int, win: dict[str, list],
                  loc: SourceLoc) -> int:
    """Non-overlapping windows w_d: out[i] = reduce(xp[i*w : (i+1)*w]) with xp the
    operand padded by the init (the identity) and cut to out_d * w_d. That is
    pad, slice, reshape of every dim with w_d > 1 into (out_d, w_d), and the
    reduction of the w_d dims: exactly the same values, in existing IR ops."""
    op = L.reducer(ins, {k: k for k in _REDUCE_KINDS})
    _identity_init(L, ins, init, op)
    out = L.array_shape(ins)
    shape, dt = L.shape_of(x), L.dtype_of(x)
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(shape, win["pad"]))
    if len(out.dims) != len(shape) or any(
            o != (p - w) // w + 1 for o, p, w in zip(out.dims, padded, win["size"])):
        raise L.err(ins, f"reduce-window result {out.dims} does not fit window="
                         f"{ins.attrs.get('window')} over {shape}")
    t = x
    if padded != shape:
        t = L.emit("pad", [t, init], padded, dt,
                   {"padding_config": tuple((lo, hi, 0) for lo, hi in win["pad"])}, loc, ins.name)
    used = tuple(o * w for o, w in zip(out.dims, win["size"]))
    if used != padded:   # the trailing elements no whole window covers
        t = L.emit("slice", [t], used, dt, {"start_indices": (0,) * len(used),
                                            "limit_indices": used, "strides": None},
                   loc, ins.name)
    # a dim of window 1 stays as it is; another splits into (windows, window size)
    split: list[int] = []
    axes: list[int] = []
    for o, w in zip(out.dims, win["size"]):
        split.append(o)
        if w != 1:
            axes.append(len(split))
            split.append(w)
    if tuple(split) != used:
        t = L.emit("reshape", [t], tuple(split), dt, {}, loc, ins.name)
    return L.emit(_REDUCE_KINDS[op], [t], out.dims, out.dtype, {"axes": tuple(axes)}, loc,
                  ins.name)


def _windows(L: Lowerer, ins: HloInstruction, x: int, init: int, win: dict[str, list],
             loc: SourceLoc) -> int:
    """Any other window (pooling: overlapping windows, padding, dilations): the
    reduction over window offsets of strided slices of the operand padded with the
    init, the reducer's identity (dlverify/window_lowering.py)."""
    if any(win["rhs_reversal"]):
        raise L.unknown(ins, "reduce-window with a reversed window is not supported")
    op = L.reducer(ins, {k: k for k in _REDUCE_KINDS})
    _identity_init(L, ins, init, op)
    out = L.array_shape(ins)
    dtype = out.dtype

    def emit(kind: str, inputs: list[int], shape: tuple[int, ...], params: dict) -> int:
        return L.emit(kind, inputs, shape, dtype, params, loc, ins.name)

    def scalar(value: float) -> int:
        return L.scalar(value, dtype, loc, ins.name)

    rw = ReduceWindow(_WINDOW_REDUCERS[op], tuple(win["size"]), tuple(win["stride"]),
                      tuple(tuple(p) for p in win["pad"]), tuple(win["lhs_dilate"]),
                      tuple(win["rhs_dilate"]))
    return lower_reduce_window(WindowSite(emit, scalar), x, L.shape_of(x), out.dims, rw,
                               (L.file, ins.line))


@handler("reduce-window")
def _reduce_window(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                   loc: SourceLoc) -> Val:
    """A prefix scan along one dim d of size n (jnp.cumsum, lax.cummax, ...):
    window n along d and 1 elsewhere, stride 1, padding (n-1, 0) along d (a
    reverse scan: (0, n-1)), no dilation, the reducer's identity as init; or
    windows that tile the operand (stride = size: XLA's CPU tree reduction
    rewriter splits a long reduce into a reduce-window of 32 and a reduce)."""
    if ins.shape.is_tuple or len(ops) != 2:
        raise L.unknown(ins, "variadic (tuple) reduce-window is not supported")
    x, init = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    shape = L.shape_of(x)
    win = parse_window(ins.attrs.get("window"), len(shape))
    moved = [d for d in range(len(shape)) if win["size"][d] != 1 or win["pad"][d] != (0, 0)]
    d = moved[0] if len(moved) == 1 else -1
    n = shape[d] if d >= 0 else 0
    plain = all(v == 1 for k in ("stride", "lhs_dilate", "rhs_dilate") for v in win[k]) and \
        not any(win["rhs_reversal"])
    scan = d >= 0 and plain and win["size"][d] == n and n > 1 and \
        win["pad"][d] in ((n - 1, 0), (0, n - 1)) and L.array_shape(ins).dims == shape
    if not scan and _tiled(win):
        return _tiled_reduce(L, ins, x, init, win, loc)
    if not scan:
        return _windows(L, ins, x, init, win, loc)
    op = L.reducer(ins, {k: k for k in _SCAN_KINDS})
    _identity_init(L, ins, init, op)
    # the result's declared type, not the operand's: a convert from pred is an
    # identity of the IR (bools are 0/1 reals), so x may be bool while its
    # prefix sums are counts
    return L.emit(_SCAN_KINDS[op], [x], shape, L.array_shape(ins).dtype,
                  {"axis": d, "reverse": win["pad"][d] == (0, n - 1) and n > 1}, loc, ins.name)
