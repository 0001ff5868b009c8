"""`convolution`: its window and dim_labels as a ConvSpec, expanded into pads,
slices, dots and adds by dlverify/conv_lowering.py (shared with the jaxpr
frontend's conv_general_dilated)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.conv_lowering import ConvSpec, lower_conv
from dlverify.window_lowering import WindowSite
from dlverify.frontends.hlo.attributes import parse_window
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


def _labels(text: str, batch: str, feature: str, rank: int) -> tuple[int, ...]:
    """One operand's dim_labels (e.g. `b01f`) as (batch dim, feature dim, spatial
    dims 0, 1, ...); ValueError unless every dim is labelled once."""
    if len(text) != rank or len(set(text)) != rank:
        raise ValueError(f"dim_labels {text!r} do not label {rank} dims once each")
    spatial = [str(d) for d in range(rank - 2)]
    if set(text) != {batch, feature, *spatial}:
        raise ValueError(f"dim_labels {text!r}: expected {batch}, {feature} and "
                         f"{''.join(spatial)}")
    return (text.index(batch), text.index(feature)) + tuple(text.index(d) for d in spatial)


@handler("convolution")
def _convolution(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    if len(ops) != 2:
        raise L.err(ins, f"convolution takes 2 operands, got {len(ops)}")
    lhs, rhs = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    out = L.array_shape(ins)
    rank = len(out.dims)
    labels = ins.attrs.get("dim_labels") or ""
    ops_part, _, out_part = labels.partition("->")
    lhs_part, _, rhs_part = ops_part.partition("_")
    lhs_spec = _labels(lhs_part, "b", "f", rank)
    rhs_spec = _labels(rhs_part, "o", "i", rank)
    out_spec = _labels(out_part, "b", "f", rank)
    win = parse_window(ins.attrs.get("window"), rank - 2)
    if any(win["rhs_reversal"]):
        raise L.unknown(ins, "convolution with rhs_reversal (a reversed window) is not supported")
    kernel = tuple(L.shape_of(rhs)[d] for d in rhs_spec[2:])
    if tuple(win["size"]) != kernel:
        raise L.err(ins, f"convolution window size {win['size']} is not the kernel's "
                         f"spatial shape {kernel}")
    spec = ConvSpec(lhs_spec, rhs_spec, out_spec, tuple(win["stride"]),
                    tuple(tuple(p) for p in win["pad"]), tuple(win["lhs_dilate"]),
                    tuple(win["rhs_dilate"]),
                    int(ins.attrs.get("feature_group_count", 1)),
                    int(ins.attrs.get("batch_group_count", 1)))

    def emit(kind: str, inputs: list[int], shape: tuple[int, ...], params: dict) -> int:
        return L.emit(kind, inputs, shape, out.dtype, params, loc, ins.name)

    def scalar(value: float) -> int:
        return L.scalar(value, out.dtype, loc, ins.name)

    return lower_conv(WindowSite(emit, scalar), lhs, L.shape_of(lhs), rhs, L.shape_of(rhs),
                      out.dims, spec, (L.file, ins.line))
