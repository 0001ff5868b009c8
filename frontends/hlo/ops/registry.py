"""The opcode handler table of the HLO lowering: one handler per HLO opcode,
registered with `@handler("opcode", ...)` by the family modules of this
package. A handler gets the lowerer, the instruction, its operand values, the
enclosing computation and the source location, and returns the value of the
instruction."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer
    from dlverify.frontends.hlo.model import HloComputation, HloInstruction


@dataclass
class Async:
    """The value of an async `*-start`: its `*-done` yields `value`."""

    value: Any


Val = Any  # int (tensor id) | tuple[Val, ...] | Async | None (token)

Handler = Callable[["Lowerer", "HloInstruction", list[Val], "HloComputation", SourceLoc], Val]
HANDLERS: dict[str, Handler] = {}


def handler(*names: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the translation of HLO opcodes `names`."""
    def deco(fn: Handler) -> Handler:
        for n in names:
            if n in HANDLERS:
                raise RuntimeError(f"two handlers for HLO opcode {n!r}")
            HANDLERS[n] = fn
        return fn
    return deco
