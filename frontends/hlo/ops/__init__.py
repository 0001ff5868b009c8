"""HLO opcode handlers, one module per family; importing this package fills
the table `HANDLERS` (opcode -> handler, see registry.py)."""
from dlverify.frontends.hlo.ops import (collectives, control, custom,  # noqa: F401 - registers
                                        elementwise, movement, reduction, sorting)
from dlverify.frontends.hlo.ops.registry import HANDLERS, Async, Handler, Val, handler

__all__ = ["HANDLERS", "Async", "Handler", "Val", "handler"]
