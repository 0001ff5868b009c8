"""HLO `select-and-scatter` (max and min pooling's gradient), expanded by
dlverify/select_scatter.py as the jaxpr frontend expands `select_and_scatter_add`."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import parse_window
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, np_dtype
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc
from dlverify.select_scatter import SelectSite, SelectWindow, lower_select_and_scatter

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

_DIRECTIONS = {"GE": "ge", "GT": "gt", "LE": "le", "LT": "lt"}
_FLIPPED = {"ge": "le", "gt": "lt", "le": "ge", "lt": "gt"}


def _select(L: Lowerer, ins: HloInstruction) -> str:
    """The `select=` computation as select(selected, candidate): one compare of its
    two parameters (either order), GE/GT/LE/LT, not a total order (which orders -0
    before +0 and would pick another of two equal elements)."""
    cname = (ins.attrs.get("select") or "").lstrip("%")
    comp = L.m.computations.get(cname)
    if comp is None:
        raise L.err(ins, "select-and-scatter without a select computation")
    params = comp.parameters()
    root = comp.root
    direction = _DIRECTIONS.get(str(root.attrs.get("direction", "")))
    names = [params[k].name for k in sorted(params)] if len(params) == 2 else []
    if root.opcode != "compare" or direction is None or \
            str(root.attrs.get("type", "")).upper() == "TOTALORDER" or \
            sorted(root.operands) != sorted(names):
        raise L.unknown(ins, f"select-and-scatter whose select %{cname} is not a GE, GT, LE or "
                             f"LT compare of its two parameters")
    return direction if root.operands == names else _FLIPPED[direction]


def select_site(L: Lowerer, ins: HloInstruction, loc: SourceLoc) -> SelectSite:
    """Ops and known constants emitted at `ins` (dlverify/select_scatter.py's site)."""
    def emit(kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str, params: dict) -> int:
        return L.emit(kind, inputs, shape, dtype, params, loc, ins.name)

    def constant(value: np.ndarray, dtype: str) -> int:
        v = np.asarray(value, dtype=np_dtype(dtype))
        c = L.b.constant(v, v.shape, dtype, loc, ins.name)
        L.known[c] = v
        return c
    return SelectSite(emit, constant)


@handler("select-and-scatter")
def _select_and_scatter(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                        loc: SourceLoc) -> Val:
    """operands (operand, source, init); the scatter computation must add."""
    if ins.shape.is_tuple or len(ops) != 3:
        raise L.unknown(ins, "variadic (tuple) select-and-scatter is not supported")
    x, src, init = (L.tid(ins, v) for v in ops)
    shape = L.shape_of(x)
    win = parse_window(ins.attrs.get("window"), len(shape))
    if any(v != 1 for k in ("lhs_dilate", "rhs_dilate") for v in win[k]) or any(win["rhs_reversal"]):
        raise L.unknown(ins, "select-and-scatter with a dilated or reversed window")
    L.reducer(ins, {"add": "add"}, attr="scatter")
    out = L.array_shape(ins)
    known = L.known.get(init)
    zero = known is not None and np.shape(known) == () and np.asarray(known).item() == 0
    sw = SelectWindow(_select(L, ins), tuple(win["size"]), tuple(win["stride"]),
                      tuple(tuple(p) for p in win["pad"]))
    return lower_select_and_scatter(select_site(L, ins, loc), x, shape, L.dtype_of(x), src,
                                    L.shape_of(src), out.dtype, None if zero else init, sw,
                                    (L.file, ins.line))
