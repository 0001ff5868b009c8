"""One pass over a graph's ops that may replace some of them, repeated to a fixpoint.

The rewrites that replace an op by new ops in place (dlverify/collective_sums.py,
dlverify/gather_batching.py) share this driver: each pass sees every op in order with
the use counts and producers of the graph as the pass began, and new ops go where the
replaced one was, so every producer still precedes its readers.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op


@dataclass
class PassState:
    """What a rewrite reads during one pass: the graph as the pass began (uses, producers),
    the builder its new ops go through, and a cache it may fill for the pass."""

    g: Graph
    builder: GraphBuilder
    producer: dict[int, Op]
    uses: Counter
    cache: dict[str, Any] = field(default_factory=dict)


def to_fixpoint(g: Graph, ids: IdAllocator, rewrite_op: Callable[[PassState, Op], bool]) -> bool:
    """Run passes of `rewrite_op` (True: it replaced the op through the builder) until
    one changes nothing. Returns whether any did; ops left unread are the caller's to drop."""
    changed = False
    while True:
        uses: Counter = Counter(g.outputs)
        for op in g.ops:
            uses.update(op.inputs)
        out: list[Op] = []
        state = PassState(g, GraphBuilder(Graph(g.name, tensors=g.tensors, ops=out), ids),
                          {op.output: op for op in g.ops}, uses)
        step = False
        for op in g.ops:
            if rewrite_op(state, op):
                step = True
            else:
                out.append(op)
        if not step:
            return changed
        g.ops = out
        changed = True
