"""A numpy interpreter of the IR: runs a graph on concrete inputs, every rank in
lockstep with collectives emulated. Used for numeric witnesses and for the
soundness tests that check derived views against real values.

Every op is evaluated by the shared evaluator of the op-kind table
(dlverify/ops), the same one the constant folder uses, so a rule test cannot
agree with a folder that computes an op wrongly.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dlverify.ir import Graph, Op
from dlverify.ops import NotExecutable, evaluate_ranks

__all__ = ["Interpreter", "NotExecutable"]


class Interpreter:
    """Runs `graph` on `ranks` ranks at once; `values[t][r]` is tensor t on rank r."""

    def __init__(self, graph: Graph, ranks: int = 1, axis_coords: Callable[[int, str], int] | None = None):
        self.g = graph
        self.ranks = ranks
        self.coords = axis_coords

    def run(self, inputs: list[list[np.ndarray]]) -> dict[int, list[np.ndarray]]:
        """`inputs[i][r]`: input i on rank r."""
        vals: dict[int, list[np.ndarray]] = {}
        for t, per_rank in zip(self.g.inputs, inputs):
            vals[t] = [np.asarray(v) for v in per_rank]
        for op in self.g.ops:
            ins = [vals[i] for i in op.inputs]
            out_t = self.g.tensors[op.output]
            res = self.op(op, ins)
            vals[op.output] = [np.asarray(v).reshape(out_t.shape) for v in res]
        return vals

    def op(self, op: Op, ins: list[list[np.ndarray]]) -> list[np.ndarray]:
        out = self.g.tensors[op.output]
        try:
            return evaluate_ranks(op.kind, op.params, ins, out.shape, out.dtype, self.ranks, self.coords)
        except NotExecutable as e:
            raise NotExecutable(f"{op.kind} {op.name or op.output}: {e}") from None
