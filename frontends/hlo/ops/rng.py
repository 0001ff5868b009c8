"""rng-bit-generator: one IR op per result (the IR's ops have one output each),
each reading the state, with the result's number in `output` (0: the new
state, 1: the random bits), the algorithm in `algorithm` and the bits' type in
`bits_shape`/`bits_dtype` (the new state counts the bits drawn).

The bits are a function of the state, the algorithm and the result shape
only, so the op is exported as a whole function (dlverify/ops/export.py,
datalog/whole_fn.dl): a distributed generator whose state equals the
sequential one's on a rank gives the same bits there (a replicated state:
replicated bits); a state that differs per rank relates to nothing. That XLA
computes the same bits for the same state in both programs (the same
algorithm on the same backend; `rng_default` is backend-defined) is listed as
an assumption."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer

ALGORITHMS = ("rng_default", "rng_three_fry", "rng_philox")


@handler("rng-bit-generator")
def _rng_bit_generator(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                       loc: SourceLoc) -> Val:
    if len(ops) != 1:
        raise L.err(ins, f"rng-bit-generator takes one operand (the state), got {len(ops)}")
    state = L.tid(ins, ops[0], "state")
    algorithm = (ins.attrs.get("algorithm") or "").strip()
    if algorithm not in ALGORITHMS:
        raise L.err(ins, f"rng-bit-generator algorithm {algorithm or '(none)'!r} is not one of "
                         f"{', '.join(ALGORITHMS)}")
    res = ins.shape.elements if ins.shape.is_tuple else ()
    shape, dtype = L.shape_of(state), L.dtype_of(state)
    if len(res) != 2 or res[0].is_tuple or res[1].is_tuple or res[0].dims != shape \
            or res[0].dtype != dtype or not res[1].dtype.startswith(("uint", "int")):
        raise L.err(ins, f"rng-bit-generator of a {dtype}{list(shape)} state declares the result "
                         f"{ins.shape}, expected (the state's shape, integer bits)")
    L.assume(f"rng-bit-generator {ins.name} ({L.file}:{ins.line}, {algorithm}) assumed to give "
             f"the same bits in both programs for the same state")
    return tuple(L.emit("rng_bit_generator", [state], r.dims, r.dtype,
                        {"algorithm": algorithm, "output": i, "bits_shape": res[1].dims,
                         "bits_dtype": res[1].dtype}, loc, ins.name)
                 for i, r in enumerate(res))
