"""sort and topk: one IR op per result (the IR's ops have one output each),
each reading every operand, with the result's number in `output`, as the
jaxpr frontend emits them (frontends/jaxpr/sorting.py).

The IR's sort is stable and ascending by operand 0 (num_keys = 1 here); what
an HLO sort's comparator computes is found by evaluating it on probe values
(frontends/hlo/comparator.py). A descending comparator (`a > b`) becomes an
ascending sort keyed by a decreasing function of operand 0 (neg for floats,
bitwise not for integers and bool: no overflow), with the operands themselves
as the outputs: stable, equal keys keep their order exactly as a stable
descending sort keeps them; NaN ends up last (see the comparator's notes)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.comparator import comparator_order
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, HloShape
from dlverify.frontends.hlo.ops.registry import Val, handler

from dlverify.ir import SourceLoc, is_float_dtype
from dlverify.ops.dtypes import is_int_dtype

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


def _results(L: Lowerer, ins: HloInstruction, n: int) -> list[HloShape]:
    """The declared result of each of the n operands (an array for one, a tuple else)."""
    if n == 1 and not ins.shape.is_tuple:
        return [ins.shape]
    if not ins.shape.is_tuple or len(ins.shape.elements) != n:
        raise L.err(ins, f"{ins.opcode} of {n} operands declares the result {ins.shape}")
    return list(ins.shape.elements)


@handler("sort")
def _sort(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    ts = [L.tid(ins, v) for v in ops]
    if not ts:
        raise L.err(ins, "sort without operands")
    dims = ints(ins.attrs.get("dimensions"))
    shape = L.shape_of(ts[0])
    if len(dims) != 1 or not 0 <= dims[0] < len(shape):
        raise L.err(ins, f"sort needs dimensions={{d}} within the rank-{len(shape)} operands")
    dim = dims[0]
    results = _results(L, ins, len(ts))
    for t, res in zip(ts, results):
        if L.shape_of(t) != shape or res.is_tuple or res.dims != shape or res.dtype != L.dtype_of(t):
            raise L.err(ins, f"sort operands must share the shape {list(shape)} and each result "
                             f"must be its operand's shape and type (operand "
                             f"{L.dtype_of(t)}{list(L.shape_of(t))}, result {res})")
    cname = (ins.attrs.get("to_apply") or "").strip().lstrip("%")
    if cname not in L.m.computations:
        raise L.err(ins, "sort without a to_apply comparator computation")
    order = comparator_order(L, ins, L.m.computations[cname], [L.dtype_of(t) for t in ts])
    for note in order.assumptions:
        L.assume(note)
    if len(ts) > 1 and ins.attrs.get("is_stable", "false").strip() != "true":
        L.assume(f"sort {ins.name} ({L.file}:{ins.line}) is not stable: equal keys assumed to "
                 f"keep their order, as in the IR's stable sort")
    operands, first = ts, 0
    if order.descending:
        flip = "neg" if is_float_dtype(L.dtype_of(ts[0])) else "not"
        key = L.emit(flip, [ts[0]], shape, L.dtype_of(ts[0]), {}, loc, ins.name)
        operands, first = [key] + ts, 1
    outs = [L.emit("sort", operands, res.dims, res.dtype,
                   {"dimension": dim, "num_keys": 1, "output": first + i}, loc, ins.name)
            for i, res in enumerate(results)]
    return outs[0] if not ins.shape.is_tuple else tuple(outs)


@handler("topk")
def _topk(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    """`topk(x), k=K, largest=true`: the K largest along the last dim, as lax.top_k."""
    if len(ops) != 1:
        raise L.err(ins, "topk takes one operand")
    if (ins.attrs.get("largest") or "true").strip() != "true":
        raise L.unknown(ins, "topk with largest=false (the k smallest) is not supported")
    k = ints(ins.attrs.get("k"))
    if len(k) != 1:
        raise L.err(ins, "topk needs k=<int>")
    return emit_top_k(L, ins, L.tid(ins, ops[0]), k[0], loc)


def emit_top_k(L: Lowerer, ins: HloInstruction, x: int, k: int, loc: SourceLoc) -> tuple[int, int]:
    """The (values, indices) of the k largest of `x` along its last dim, checked
    against `ins`'s declared tuple result."""
    shape = L.shape_of(x)
    if not shape or not 0 <= k <= shape[-1]:
        raise L.err(ins, f"top-k with k={k} of an operand of shape {list(shape)}")
    res = _results(L, ins, 2)
    want = shape[:-1] + (k,)
    if res[0].dims != want or res[1].dims != want or res[0].dtype != L.dtype_of(x) \
            or not is_int_dtype(res[1].dtype):
        raise L.err(ins, f"top-k of {L.dtype_of(x)}{list(shape)} with k={k} declares the result "
                         f"{ins.shape}, expected ({L.dtype_of(x)}{list(want)}, s32{list(want)})")
    params = {"axis": len(shape) - 1, "k": k}
    return tuple(L.emit("top_k", [x], r.dims, r.dtype, {**params, "output": i}, loc, ins.name)
                 for i, r in enumerate(res))
