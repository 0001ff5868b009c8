"""Exporters of the windowed primitives: `conv_general_dilated` (a ConvSpec,
expanded by dlverify/conv_lowering.py, shared with the HLO frontend's
`convolution`) and `reduce_window_{sum,max,min}` (pooling, expanded by
dlverify/window_lowering.py, shared with HLO `reduce-window`) and
`select_and_scatter_add` (their gradient for max and min pooling, expanded by
dlverify/select_scatter.py, shared with HLO `select-and-scatter`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from dlverify.conv_lowering import ConvSpec, lower_conv
from dlverify.frontends.jaxpr.walk import Ctx, _dtype, _loc, _out, _where, exporter
from dlverify.select_scatter import (SelectSite, SelectWindow, at_dtype,
                                    lower_select_and_scatter)
from dlverify.window_lowering import ReduceWindow, WindowSite, lower_reduce_window


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


def _typed_site(ctx: Ctx, eqn: Any) -> SelectSite:
    """Ops and constants in any dtype at the equation's location."""
    loc, name = _loc(eqn), eqn.primitive.name

    def emit(kind: str, inputs: list[int], out: tuple[int, ...], dtype: str, params: dict) -> int:
        return ctx.b.op(kind, inputs, out, dtype, params, loc, name)

    def constant(value: np.ndarray, dtype: str) -> int:
        v = np.asarray(value, dtype=np.dtype(dtype))
        return ctx.b.constant(v, v.shape, dtype, loc, name)

    return SelectSite(emit, constant)


def _site(ctx: Ctx, eqn: Any) -> WindowSite:
    """Ops in the result's dtype at the equation's location."""
    return at_dtype(_typed_site(ctx, eqn), _out(eqn)[1])


@exporter("conv_general_dilated")
def _conv(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    p = eqn.params
    dn = p["dimension_numbers"]
    shape, _ = _out(eqn)
    k = len(shape) - 2
    spec = ConvSpec(
        lhs_spec=_ints(dn.lhs_spec), rhs_spec=_ints(dn.rhs_spec), out_spec=_ints(dn.out_spec),
        strides=_ints(p["window_strides"]),
        padding=tuple((int(lo), int(hi)) for lo, hi in p["padding"]),
        lhs_dilation=_ints(p.get("lhs_dilation") or (1,) * k),
        rhs_dilation=_ints(p.get("rhs_dilation") or (1,) * k),
        feature_group_count=int(p.get("feature_group_count", 1)),
        batch_group_count=int(p.get("batch_group_count", 1)))
    lhs, rhs = eqn.invars
    return [lower_conv(_site(ctx, eqn), ins[0], tuple(lhs.aval.shape), ins[1],
                       tuple(rhs.aval.shape), shape, spec, _where(eqn))]


_REDUCERS = {"reduce_window_sum": "add", "reduce_window_max": "max", "reduce_window_min": "min"}


def _identity(reducer: str, dtype: str) -> float | int | bool:
    """The value `reducer` ignores in `dtype` (lax.reduce_window_{sum,max,min}'s
    init): 0, or the least (greatest) value, -inf (+inf) for floats."""
    dt = np.dtype(dtype)
    if reducer == "add":
        return 0
    if dt == np.bool_:
        return reducer == "min"
    if dt.kind in "iu":
        return int(np.iinfo(dt).min if reducer == "max" else np.iinfo(dt).max)
    return float("-inf") if reducer == "max" else float("inf")


@exporter(*_REDUCERS)
def _reduce_window(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    p = eqn.params
    shape, _ = _out(eqn)
    x = eqn.invars[0]
    k = len(x.aval.shape)
    rw = ReduceWindow(_REDUCERS[eqn.primitive.name], _ints(p["window_dimensions"]),
                      _ints(p["window_strides"]),
                      tuple((int(lo), int(hi)) for lo, hi in p["padding"]),
                      _ints(p.get("base_dilation") or (1,) * k),
                      _ints(p.get("window_dilation") or (1,) * k))
    site = _site(ctx, eqn)
    init = site.scalar(_identity(rw.reducer, _out(eqn)[1]))
    return [lower_reduce_window(site, ins[0], tuple(x.aval.shape), shape, rw, init,
                                _where(eqn))]


@exporter("select_and_scatter_add")
def _select_and_scatter_add(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """source scattered onto each window's selected operand element (max pooling's
    gradient selects by `ge`); operands (source, operand), the result in the
    operand's shape and the source's dtype, starting from zero."""
    p = eqn.params
    src, x = eqn.invars
    sw = SelectWindow(p["select_prim"].name, _ints(p["window_dimensions"]),
                      _ints(p["window_strides"]),
                      tuple((int(lo), int(hi)) for lo, hi in p["padding"]))
    return [lower_select_and_scatter(_typed_site(ctx, eqn), ins[1], tuple(x.aval.shape),
                                     _dtype(x.aval), ins[0], tuple(src.aval.shape),
                                     _out(eqn)[1], None, sw, _where(eqn))]
