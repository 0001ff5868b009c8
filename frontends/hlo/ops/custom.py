"""custom-call: expanded through the custom-call registry
(frontends/custom_calls.py, dlverify/custom_calls.toml); an unknown target is
an UnknownOpError."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.frontends.hlo.model import HloComputation, HloInstruction
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


@handler("custom-call")
def _custom_call(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    from dlverify.frontends.custom_calls import expand
    target = (ins.attrs.get("custom_call_target") or "").strip().strip('"')
    spec = L.registry.get(target)
    if spec is None:
        raise L.unknown(ins, f"custom call target '{target}' is not in the custom-call registry "
                             f"(dlverify/custom_calls.toml; add it there or in a --custom-calls file)")
    out, assumption = expand(spec, L, ins, ops, loc)
    L.custom_calls[target] = L.custom_calls.get(target, 0) + 1
    L.assume(assumption)
    return out
