"""Data movement HLO opcodes: broadcast, reshape, bitcast, transpose,
slices, concatenate, pad, reverse, gather, iota, and the aliases (copy,
optimization barriers) that move nothing."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.model import np_dtype
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.elementwise import reinterpret_bits
from dlverify.frontends.hlo.ops.registry import Async, Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

# Opcodes that pass their operand through (one operand) or tuple them.
ALIASES = ("copy", "reduce-precision", "domain", "opt-barrier", "optimization-barrier",
           "copy-done")


@dataclass(frozen=True)
class _DimsOperand:
    """The one operand of an op that takes a `dimensions={...}` list, and that list."""
    tensor: int
    rank: int
    dims: tuple[int, ...]


def _operand_with_dims(L: Lowerer, ins: HloInstruction, ops: list[Val]) -> _DimsOperand:
    t = L.tid(ins, ops[0])
    return _DimsOperand(t, len(L.shape_of(t)), ints(ins.attrs.get("dimensions")))


def one_dimension(L: Lowerer, ins: HloInstruction, name: str) -> int:
    """The single dim of `dimensions={d}` (concatenate, all-gather, reduce-scatter)."""
    dims = ints(ins.attrs.get("dimensions"))
    if len(dims) != 1:
        raise L.err(ins, f"{name} needs dimensions={{d}}")
    return dims[0]


@handler(*ALIASES)
def _alias(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    if ins.opcode == "copy-done":
        return ops[0].value if isinstance(ops[0], Async) else ops[0]
    if len(ops) != 1:
        return tuple(ops)
    return ops[0]


@handler("broadcast")
def _broadcast(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    x = _operand_with_dims(L, ins, ops)
    if len(x.dims) != x.rank:
        raise L.err(ins, f"broadcast dimensions {x.dims} do not match the operand rank {x.rank}")
    t, dims = x.tensor, tuple(x.dims)
    if list(dims) != sorted(dims):
        # HLO lets a broadcast transpose its operand (dimensions={2,1}); the IR's
        # broadcast_in_dim, as JAX's, places the operand's dims in order: the
        # operand is transposed into the order of its result dims first
        order = tuple(sorted(range(len(dims)), key=dims.__getitem__))
        t = L.emit("transpose", [t], tuple(L.shape_of(t)[i] for i in order), L.dtype_of(t),
                   {"permutation": order}, loc, ins.name)
        dims = tuple(dims[i] for i in order)
    return L.emit("broadcast_in_dim", [t], sh.dims, sh.dtype,
                  {"broadcast_dimensions": dims}, loc, ins.name)


def reshape_to(L: Lowerer, ins: HloInstruction, t: int, dims: tuple[int, ...], loc: SourceLoc,
                dtype: str | None = None) -> int:
    if int(np.prod(L.shape_of(t))) != int(np.prod(dims)):
        raise L.err(ins, f"reshape {L.shape_of(t)} -> {dims} changes the element count")
    if L.shape_of(t) == tuple(dims):
        return t
    return L.emit("reshape", [t], tuple(dims), dtype or L.dtype_of(t), {}, loc, ins.name)


@handler("reshape")
def _reshape(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    if int(np.prod(L.shape_of(t))) != int(np.prod(sh.dims)):
        raise L.err(ins, f"reshape {L.shape_of(t)} -> {sh.dims} changes the element count")
    if L.shape_of(t) == sh.dims and L.dtype_of(t) == sh.dtype:
        return t  # a reshape to the same shape (a layout change in XLA) is the identity
    return L.emit("reshape", [t], sh.dims, sh.dtype, {}, loc, ins.name)


def _trivial_perm(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """A transpose that only moves size-1 dims is a reshape."""
    big = [p for p in perm if shape[p] != 1]
    return big == sorted(big)


def _transpose_or_reshape(L: Lowerer, ins: HloInstruction, t: int, perm: tuple[int, ...],
                          loc: SourceLoc) -> int:
    shape = L.shape_of(t)
    if perm == tuple(range(len(perm))):
        return t
    out = tuple(shape[p] for p in perm)
    if _trivial_perm(shape, perm):
        return reshape_to(L, ins, t, out, loc)
    return L.emit("transpose", [t], out, L.dtype_of(t), {"permutation": perm}, loc, ins.name)


@handler("bitcast")
def _bitcast(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    """A bitcast reinterprets the operand's physical buffer in the result's
    layout: transpose to the operand's physical (major-to-minor) order, reshape,
    transpose back from the result's physical order."""
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    src = comp.by_name[ins.operands[0]].shape
    if src.is_tuple:
        raise L.err(ins, "bitcast of a tuple")
    if src.dtype != sh.dtype:
        if src.dims == sh.dims and L.bit_reinterpretation:
            return reinterpret_bits(L, ins, t, loc)
        raise L.unknown(ins, f"bitcast changes the element type {src.dtype} -> {sh.dtype}")
    if int(np.prod(src.dims)) != int(np.prod(sh.dims)):
        raise L.err(ins, f"bitcast {src} -> {sh} changes the element count")
    phys_in = tuple(reversed(src.minor_to_major))
    phys_out = tuple(reversed(sh.minor_to_major))
    x = _transpose_or_reshape(L, ins, t, phys_in, loc)
    x = reshape_to(L, ins, x, tuple(sh.dims[d] for d in phys_out), loc)
    inv = tuple(int(i) for i in np.argsort(phys_out))
    x = _transpose_or_reshape(L, ins, x, inv, loc)
    return x


@handler("transpose")
def _transpose(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    x = _operand_with_dims(L, ins, ops)
    if sorted(x.dims) != list(range(x.rank)):
        raise L.err(ins, f"transpose dimensions {x.dims} are not a permutation")
    return L.emit("transpose", [x.tensor], sh.dims, sh.dtype, {"permutation": x.dims}, loc,
                  ins.name)


@handler("slice")
def _slice(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    spec = ins.attrs.get("slice") or ""
    ranges = re.findall(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+))?\s*\]", spec)
    if len(ranges) != len(L.shape_of(t)):
        raise L.err(ins, f"slice={spec} does not give one range per operand dim")
    starts = tuple(int(a) for a, _, _ in ranges)
    limits = tuple(int(b) for _, b, _ in ranges)
    strides = tuple(int(s) if s else 1 for _, _, s in ranges)
    return L.emit("slice", [t], sh.dims, sh.dtype, {
        "start_indices": starts, "limit_indices": limits,
        "strides": None if all(s == 1 for s in strides) else strides}, loc, ins.name)


def _scalar_starts(L: Lowerer, ins: HloInstruction, idx: list[Val], rank: int,
                   loc: SourceLoc) -> list[int]:
    ts = [L.tid(ins, v) for v in idx]
    if len(ts) == rank and all(L.shape_of(x) == () for x in ts):
        return ts
    if len(ts) == 1 and L.shape_of(ts[0]) == (rank,):  # old form: one index vector
        out = []
        for d in range(rank):
            s = L.emit("slice", [ts[0]], (1,), L.dtype_of(ts[0]),
                       {"start_indices": (d,), "limit_indices": (d + 1,), "strides": None},
                       loc, ins.name)
            out.append(L.emit("reshape", [s], (), L.dtype_of(ts[0]), {}, loc, ins.name))
        return out
    raise L.err(ins, f"expected {rank} scalar start indices")


@handler("dynamic-slice")
def _dynamic_slice(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                   loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    starts = _scalar_starts(L, ins, ops[1:], len(L.shape_of(t)), loc)
    sizes = ints(ins.attrs.get("dynamic_slice_sizes")) or sh.dims
    return L.emit("dynamic_slice", [t] + starts, sh.dims, sh.dtype,
                  {"slice_sizes": tuple(sizes)}, loc, ins.name)


@handler("dynamic-update-slice")
def _dus(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t, u = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    starts = _scalar_starts(L, ins, ops[2:], len(L.shape_of(t)), loc)
    return L.emit("dynamic_update_slice", [t, u] + starts, sh.dims, sh.dtype, {}, loc, ins.name)


@handler("concatenate")
def _concat(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    dim = one_dimension(L, ins, "concatenate")
    return L.elementwise(ins, "concatenate", ops, loc, {"dimension": dim})


@handler("iota")
def _iota(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    d = ints(ins.attrs.get("iota_dimension"))
    if len(d) != 1 or not 0 <= d[0] < len(sh.dims):
        raise L.err(ins, "iota needs iota_dimension=d within the shape")
    return L.emit("iota", [], sh.dims, sh.dtype, {"dimension": d[0]}, loc, ins.name)


@handler("pad")
def _pad(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    cfg = []
    for part in (ins.attrs.get("padding") or "").split("x"):
        nums = [int(x) for x in part.split("_")] if part else []
        if len(nums) == 2:
            nums.append(0)
        if len(nums) != 3:
            raise L.err(ins, f"bad padding={ins.attrs.get('padding')}")
        cfg.append(tuple(nums))
    return L.elementwise(ins, "pad", ops, loc, {"padding_config": tuple(cfg)})


@handler("reverse")
def _reverse(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    return L.elementwise(ins, "rev", ops, loc, {"dimensions": ints(ins.attrs.get("dimensions"))})


@handler("gather")
def _gather(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    ivd = ints(ins.attrs.get("index_vector_dim"))
    return L.elementwise(ins, "gather", ops, loc, {
        "offset_dims": ints(ins.attrs.get("offset_dims")),
        "collapsed_slice_dims": ints(ins.attrs.get("collapsed_slice_dims")),
        "start_index_map": ints(ins.attrs.get("start_index_map")),
        "operand_batching_dims": ints(ins.attrs.get("operand_batching_dims")),
        "start_indices_batching_dims": ints(ins.attrs.get("start_indices_batching_dims")),
        "index_vector_dim": ivd[0] if ivd else None,
        "slice_sizes": ints(ins.attrs.get("slice_sizes")),
        "indices_are_sorted": ins.attrs.get("indices_are_sorted", "false") == "true"})


@handler("get-dimension-size")
def _get_dim(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    d = ints(ins.attrs.get("dimensions"))
    val = np.array(L.shape_of(t)[d[0]], dtype=np_dtype(ins.shape.dtype))
    out = L.b.constant(val, (), ins.shape.dtype, loc, ins.name)
    L.known[out] = val
    return out
