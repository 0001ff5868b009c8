"""HLO opcode handlers, one module per family; importing this package fills
the table `HANDLERS` (opcode -> handler, see registry.py)."""
from dlverify.frontends.hlo.ops import (batchnorm, collectives, control,  # noqa: F401 - registers
                                        convolution, custom, elementwise, movement,
                                        reduction, rng, scatter, select_scatter, sorting)
from dlverify.frontends.hlo.ops.registry import HANDLERS, Async, Handler, Val, handler

__all__ = ["HANDLERS", "Async", "Handler", "Val", "handler"]
