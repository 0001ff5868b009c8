"""Control flow and structure: constants, tuples, calls and fusions (inlined),
async wrappers, statically unrolled while loops and statically chosen
conditionals."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from dlverify.frontends.hlo.attributes import ints, parse_literal
from dlverify.frontends.hlo.fold import KNOWN_LIMIT
from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Async, Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

# A while loop is unrolled; more iterations than this is refused.
MAX_UNROLL = 4096


@handler("constant")
def _constant(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
              loc: SourceLoc) -> Val:
    if ins.shape.is_tuple:
        raise L.unknown(ins, "tuple-shaped constants are not supported")
    val = parse_literal(ins.raw_operands, ins.shape, ins, L.file)
    out = L.b.constant(val, ins.shape.dims, ins.shape.dtype, loc, ins.name)
    if val is not None and val.size <= KNOWN_LIMIT:
        L.known[out] = val
    return out


@handler("tuple")
def _tuple(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return tuple(ops)


@handler("get-tuple-element")
def _gte(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    v = ops[0]
    idx = ints(ins.attrs.get("index"))
    if not isinstance(v, tuple) or len(idx) != 1 or not 0 <= idx[0] < len(v):
        raise L.err(ins, "get-tuple-element of a non-tuple or out of range")
    return v[idx[0]]


@handler("add-dependency")
def _add_dep(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    return ops[0]


@handler("after-all")
def _after_all(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    return None


@handler("call")
def _call(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    callee = L.m.computations[(ins.attrs.get("to_apply") or "").lstrip("%")]
    return L.run_comp(callee, ops, loc, ins)


@handler("fusion")
def _fusion(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    callee = L.m.computations[(ins.attrs.get("calls") or "").lstrip("%")]
    return L.run_comp(callee, ops, loc, ins)


@handler("async-start")
def _async_start(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    name = (ins.attrs.get("calls") or "").lstrip("%")
    if name not in L.m.computations:
        raise L.unknown(ins, "async-start without calls=")
    return Async(L.run_comp(L.m.computations[name], ops, loc, ins))


@handler("async-update")
def _async_update(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                  loc: SourceLoc) -> Val:
    return ops[0]


@handler("async-done", "all-reduce-done", "all-gather-done", "collective-permute-done")
def _async_done(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    if not isinstance(ops[0], Async):
        raise L.err(ins, f"{ins.opcode} of an operand that is not a matching *-start")
    return ops[0].value


@handler("copy-start")
def _copy_start(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    return Async(ops[0])


@handler("while")
def _while(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    cond = L.m.computations[(ins.attrs.get("condition") or "").lstrip("%")]
    body = L.m.computations[(ins.attrs.get("body") or "").lstrip("%")]
    if len(ops) != 1:
        raise L.err(ins, "while takes one (tuple) operand")
    state = ops[0]
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)',
                  ins.attrs.get("backend_config") or "")
    declared = int(m.group(1)) if m else None
    trips = 0
    while True:
        # Evaluate the condition on the known values, then drop its ops again.
        n_ops, n_tensors = len(L.b.graph.ops), set(L.b.graph.tensors)
        c = L.tid(ins, L.run_comp(cond, [state], loc, ins), "while condition")
        value = L.known.get(c)
        del L.b.graph.ops[n_ops:]
        for t in set(L.b.graph.tensors) - n_tensors:
            del L.b.graph.tensors[t]
            L.known.pop(t, None)
        if value is None:
            if declared is None:
                raise L.unknown(ins, "while loop whose trip count is not statically known")
            go = trips < declared
            L.assume(f"while loop {ins.name} ({L.file}:{ins.line}) assumed to run {declared} times "
                     f"(its known_trip_count)")
        else:
            go = bool(np.asarray(value).reshape(-1)[0])
        if not go:
            return state
        trips += 1
        if trips > MAX_UNROLL:
            raise L.unknown(ins, f"while loop runs more than {MAX_UNROLL} iterations: not unrolled")
        state = L.run_comp(body, [state], loc, ins)


@handler("conditional")
def _conditional(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    sel = L.known.get(L.tid(ins, ops[0], "branch selector"))
    if sel is None:
        raise L.unknown(ins, "conditional whose branch is not statically known")
    if "branch_computations" in ins.attrs:
        names = [x.strip().lstrip("%") for x in ins.attrs["branch_computations"].strip("{}").split(",")]
        idx = int(np.asarray(sel).reshape(-1)[0])
        if not 0 <= idx < len(names):
            idx = len(names) - 1  # XLA: out-of-range index runs the last branch
    else:
        names = [ins.attrs["true_computation"].lstrip("%"), ins.attrs["false_computation"].lstrip("%")]
        idx = 0 if bool(np.asarray(sel).reshape(-1)[0]) else 1
    return L.run_comp(L.m.computations[names[idx]], [ops[1 + idx]], loc, ins)
