"""Values computable before run time while a jaxpr is being walked: what a
while loop's condition or a cond's index evaluates to when it depends only on
constants (a counter started at a literal), by the shared evaluator."""
from __future__ import annotations

import numpy as np

from dlverify.ir import Graph, Op
from dlverify.ops import KINDS, NotExecutable, evaluate

KNOWN_SIZE = 1 << 16  # elements: larger values are not evaluated before run time


class KnownValues:
    """Values of tensors of one graph that are computable before run time (from
    constants only, no inputs, no rank coordinates), memoised per tensor id."""

    def __init__(self) -> None:
        self.values: dict[int, np.ndarray | None] = {}
        self.producer: dict[int, Op] = {}
        self.indexed = 0

    def dropped_from(self, position: int) -> None:
        """The graph's ops from `position` on were removed (a while condition's)."""
        self.indexed = min(self.indexed, position)

    def index(self, ops: list[Op]) -> None:
        """Record the producers of ops appended since the last call."""
        for op in ops[self.indexed:]:
            self.producer[op.output] = op
        self.indexed = len(ops)

    def value(self, graph: Graph, tid: int) -> np.ndarray | None:
        self.index(graph.ops)
        todo = [tid]
        while todo:  # iterative post-order: carried counters form long chains
            t = todo[-1]
            if t in self.values:
                todo.pop()
                continue
            op = self.producer.get(t)
            if op is None or op.kind == "axis_index" or KINDS[op.kind].collective is not None \
                    or int(np.prod(graph.tensors[t].shape)) > KNOWN_SIZE:
                self.values[t] = None
                todo.pop()
                continue
            missing = [i for i in op.inputs if i not in self.values]
            if missing:
                todo.extend(missing)
                continue
            todo.pop()
            ins = [self.values[i] for i in op.inputs]
            if op.kind == "constant":
                v = op.params.get("value")
                self.values[t] = None if v is None else np.asarray(v)
            elif any(x is None for x in ins):
                self.values[t] = None
            else:
                out = graph.tensors[t]
                try:
                    self.values[t] = evaluate(op.kind, op.params, ins, out.shape, out.dtype)
                except NotExecutable:
                    self.values[t] = None
        return self.values[tid]


def _known(ctx: Ctx) -> KnownValues:
    if ctx.known is None:
        ctx.known = KnownValues()
    return ctx.known
