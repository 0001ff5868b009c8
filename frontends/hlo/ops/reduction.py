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
from dlverify.frontends.hlo.ops.window_select import variadic_reduce_window
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


# reducer opcode -> the elementwise kind that combines a window's elements
_WINDOW_REDUCERS = {"add": "add", "maximum": "max", "minimum": "min", "multiply": "mul",
                    "and": "and", "or": "or", "xor": "xor"}
_SCAN_KINDS = {"add": "cumsum", "multiply": "cumprod", "maximum": "cummax", "minimum": "cummin"}


def _identity_init(L: Lowerer, ins: HloInstruction, init: int, op: str) -> None:
    """A reduce-window's init enters every window once: only the reducer's identity
    leaves the windows' reductions unchanged."""
    val = L.known.get(init)
    if val is None or np.shape(val) != () or \
            not any(np.asarray(val).item() == o for o in _identity_value(op, L.dtype_of(init))):
        raise L.unknown(ins, f"reduce-window ({op}) whose init is not a known constant identity "
                             f"of {op}")


def _windows(L: Lowerer, ins: HloInstruction, x: int, init: int, win: dict[str, list],
             loc: SourceLoc) -> int:
    """Any window but a prefix scan (pooling: windows that tile the operand, as XLA's
    tree-reduction rewriter writes them, or overlapping, padded, dilated ones): the
    operand padded with the init, the reducer's identity, and reduced per window
    (dlverify/window_lowering.py)."""
    if any(win["rhs_reversal"]):
        raise L.unknown(ins, "reduce-window with a reversed window is not supported")
    op = L.reducer(ins, {k: k for k in _WINDOW_REDUCERS})
    _identity_init(L, ins, init, op)
    out = L.array_shape(ins)

    def emit(kind: str, inputs: list[int], shape: tuple[int, ...], params: dict) -> int:
        return L.emit(kind, inputs, shape, out.dtype, params, loc, ins.name)

    def scalar(value: float) -> int:
        return L.scalar(value, out.dtype, loc, ins.name)

    rw = ReduceWindow(_WINDOW_REDUCERS[op], tuple(win["size"]), tuple(win["stride"]),
                      tuple(tuple(p) for p in win["pad"]), tuple(win["lhs_dilate"]),
                      tuple(win["rhs_dilate"]))
    return lower_reduce_window(WindowSite(emit, scalar), x, L.shape_of(x), out.dims, rw, init,
                               (L.file, ins.line))


@handler("reduce-window")
def _reduce_window(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                   loc: SourceLoc) -> Val:
    """A prefix scan along one dim d of size n (jnp.cumsum, lax.cummax, ...):
    window n along d and 1 elsewhere, stride 1, padding (n-1, 0) along d (a
    reverse scan: (0, n-1)), no dilation, the reducer's identity as init; or any
    other window (_windows; XLA's CPU tree reduction rewriter splits a long reduce
    into a reduce-window of 32 that tiles the operand and a reduce)."""
    if ins.shape.is_tuple or len(ops) != 2:
        return variadic_reduce_window(L, ins, ops, comp, loc)
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
    if not scan:
        return _windows(L, ins, x, init, win, loc)
    op = L.reducer(ins, {k: k for k in _SCAN_KINDS})
    _identity_init(L, ins, init, op)
    # the result's declared type, not the operand's: a convert from pred is an
    # identity of the IR (bools are 0/1 reals), so x may be bool while its
    # prefix sums are counts
    return L.emit(_SCAN_KINDS[op], [x], shape, L.array_shape(ins).dtype,
                  {"axis": d, "reverse": win["pad"][d] == (0, n - 1) and n > 1}, loc, ins.name)
