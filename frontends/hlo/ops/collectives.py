"""Collective HLO opcodes (all-reduce, all-gather, reduce-scatter,
all-to-all, collective-permute, their async forms) and partition-id /
replica-id, over the flat rank axis."""
from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

from dlverify.errors import InputError
from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.model import FLAT_AXIS, HloShape
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Async, Val, handler
from dlverify.frontends.hlo.ops.movement import one_dimension, reshape_to
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


@handler("partition-id", "replica-id")
def _axis_index(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    if L.R > 1 and L.P > 1:
        raise L.unknown(ins, f"{ins.opcode} with both replicas ({L.R}) and partitions ({L.P}) is "
                             f"not expressible over one flat axis")
    sh = L.array_shape(ins)
    return L.emit("axis_index", [], sh.dims, sh.dtype, {"axis": FLAT_AXIS}, loc, ins.name)


def _shape_for(ins: HloInstruction, shape: HloShape, i: int, n: int) -> HloShape:
    if n == 1 and not shape.is_tuple:
        return shape
    if not shape.is_tuple or len(shape.elements) != n:
        raise InputError(f"{ins.name}: {n} operands but result shape {shape}", "", ins.line)
    return shape.elements[i]


def _collective(L: Lowerer, ins: HloInstruction, ops: list[Val], loc: SourceLoc, kind: str,
                params: dict, result: HloShape) -> Val:
    ts = [L.tid(ins, v) for v in ops]
    outs = []
    for i, t in enumerate(ts):
        try:
            sh = _shape_for(ins, result, i, len(ts))
        except InputError as e:
            raise L.err(ins, e.message.split(": ", 1)[1]) from None
        outs.append(L.emit(kind, [t], sh.dims, sh.dtype, dict(params), loc, ins.name))
    if len(outs) == 1 and not result.is_tuple:
        return outs[0]
    return tuple(outs)


_AR_REDUCERS = {"add": "sum", "maximum": "max", "minimum": "min"}


@handler("all-reduce", "cross-replica-sum", "all-reduce-start")
def _all_reduce(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    red = L.reducer(ins, _AR_REDUCERS)
    v = _collective(L, ins, ops, loc, "all_reduce", {"reducer": red, "groups": L.groups(ins)},
                    ins.shape)
    return Async(v) if ins.opcode.endswith("-start") else v


@handler("all-gather", "all-gather-start")
def _all_gather(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    dim = one_dimension(L, ins, "all-gather")
    result = ins.shape
    if ins.opcode.endswith("-start"):
        if not result.is_tuple or len(result.elements) != 2:
            raise L.err(ins, "all-gather-start result must be (operands, results)")
        result = result.elements[1]
    v = _collective(L, ins, ops, loc, "all_gather", {"dimension": dim, "groups": L.groups(ins)},
                    result)
    return Async(v) if ins.opcode.endswith("-start") else v


@handler("reduce-scatter")
def _reduce_scatter(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                    loc: SourceLoc) -> Val:
    dim = one_dimension(L, ins, "reduce-scatter")
    red = L.reducer(ins, _AR_REDUCERS)
    return _collective(L, ins, ops, loc, "reduce_scatter",
                       {"dimension": dim, "reducer": red, "groups": L.groups(ins)}, ins.shape)


@handler("all-to-all")
def _all_to_all(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    groups = L.groups(ins)
    dims = ints(ins.attrs.get("dimensions"))
    if dims:
        if len(dims) != 1 or len(ops) != 1:
            raise L.unknown(ins, "all-to-all with several dimensions/operands")
        return _collective(L, ins, ops, loc, "all_to_all",
                           {"split_dimension": dims[0], "concat_dimension": dims[0],
                            "groups": groups}, ins.shape)
    # Tuple form: operand i goes to the i-th member of the group, result j comes
    # from member j. Exactly an array all-to-all over the operands stacked along
    # a leading dim, sliced apart again.
    ts = [L.tid(ins, v) for v in ops]
    k = len(ts)
    sizes = {len(g) for g in groups}
    shapes = {L.shape_of(t) for t in ts}
    dtypes = {L.dtype_of(t) for t in ts}
    if sizes != {k} or len(shapes) != 1 or len(dtypes) != 1:
        raise L.unknown(ins, "tuple all-to-all whose operands differ in shape or do not match the "
                             "group size is not expressible as an array all-to-all")
    (shape,), (dtype,) = shapes, dtypes
    pieces = [reshape_to(L, ins, t, (1,) + shape, loc) for t in ts]
    stacked = L.emit("concatenate", pieces, (k,) + shape, dtype, {"dimension": 0}, loc, ins.name)
    moved = L.emit("all_to_all", [stacked], (k,) + shape, dtype,
                   {"split_dimension": 0, "concat_dimension": 0, "groups": groups}, loc, ins.name)
    outs = []
    for j in range(k):
        s = L.emit("slice", [moved], (1,) + shape, dtype,
                   {"start_indices": (j,) + (0,) * len(shape),
                    "limit_indices": (j + 1,) + shape, "strides": None}, loc, ins.name)
        outs.append(reshape_to(L, ins, s, shape, loc))
    return tuple(outs)


@handler("collective-permute", "collective-permute-start")
def _permute(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    txt = ins.attrs.get("source_target_pairs") or "{}"
    pairs = [tuple(p) for p in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", txt)]
    pairs = [(int(a), int(b)) for a, b in pairs]
    R, P = L.R, L.P
    if R > 1 and P > 1:
        if "channel_id" in ins.attrs:
            pairs = [(r * P + a, r * P + b) for r in range(R) for a, b in pairs]
        else:
            pairs = [(a * P + p, b * P + p) for p in range(P) for a, b in pairs]
    for a, b in pairs:
        if not (0 <= a < L.ranks and 0 <= b < L.ranks):
            raise L.err(ins, f"source_target_pairs {{{a},{b}}} outside the {L.ranks} ranks")
    for end, ranks in (("source", [a for a, _ in pairs]), ("target", [b for _, b in pairs])):
        twice = sorted(r for r, n in Counter(ranks).items() if n > 1)
        if twice:   # XLA's verifier rejects it: a rank would send (or receive) two values
            raise L.err(ins, f"source_target_pairs name {end} {twice[0]} more than once")
    if len(ops) != 1:
        raise L.unknown(ins, "collective-permute with several operands (in-place form)")
    result = ins.shape
    if ins.opcode.endswith("-start"):
        if not result.is_tuple or len(result.elements) < 2:
            raise L.err(ins, "collective-permute-start result must be a tuple")
        result = result.elements[1]
    v = _collective(L, ins, ops, loc, "collective_permute", {"pairs": pairs}, result)
    return Async(v) if ins.opcode.endswith("-start") else v
