"""Exporter of `conv_general_dilated`: its parameters as a ConvSpec, expanded into
pads, slices, dots and adds by dlverify/conv_lowering.py (shared with the HLO
frontend's `convolution`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from dlverify.conv_lowering import ConvSite, ConvSpec, lower_conv
from dlverify.frontends.jaxpr.walk import Ctx, _loc, _out, _where, exporter


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in v)


@exporter("conv_general_dilated")
def _conv(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    p = eqn.params
    dn = p["dimension_numbers"]
    shape, dtype = _out(eqn)
    loc = _loc(eqn)
    k = len(shape) - 2
    spec = ConvSpec(
        lhs_spec=_ints(dn.lhs_spec), rhs_spec=_ints(dn.rhs_spec), out_spec=_ints(dn.out_spec),
        strides=_ints(p["window_strides"]),
        padding=tuple((int(lo), int(hi)) for lo, hi in p["padding"]),
        lhs_dilation=_ints(p.get("lhs_dilation") or (1,) * k),
        rhs_dilation=_ints(p.get("rhs_dilation") or (1,) * k),
        feature_group_count=int(p.get("feature_group_count", 1)),
        batch_group_count=int(p.get("batch_group_count", 1)))

    def emit(kind: str, inputs: list[int], out: tuple[int, ...], params: dict) -> int:
        return ctx.b.op(kind, inputs, out, dtype, params, loc, "conv_general_dilated")

    def zero() -> int:
        return ctx.b.constant(np.zeros((), np.dtype(dtype)), (), dtype, loc, "conv_general_dilated")

    lhs, rhs = eqn.invars
    return [lower_conv(ConvSite(emit, zero), ins[0], tuple(lhs.aval.shape), ins[1],
                       tuple(rhs.aval.shape), shape, spec, _where(eqn))]
