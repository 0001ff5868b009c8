"""Contractions and reductions: dot and reduce (with its identity init check)."""
from __future__ import annotations

from typing import Any, TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.model import np_dtype
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc

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
        raise L.unknown(ins, "variadic (tuple) reduce is not supported")
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
