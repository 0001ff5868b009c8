"""A value per tensor of a graph computed from its producer and its operands'
values: memoised, in post-order without recursion (graphs are deep: a
Python-recursive walk would overflow on a 100-layer model). The analyses that
say whether a value is finite (finite_values.py), nonnegative (real_guards.py)
or which computation it is (collective_sums.py) subclass it."""
from __future__ import annotations

from typing import Generic, TypeVar

from dlverify.ir import Graph, Op

V = TypeVar("V")


class PostOrderMemo(Generic[V]):
    """`self(t)`: `value(t, producer of t)` once the values of `operands(producer)`
    are known (in `self.memo`). Inputs and constants have no producer operands."""

    def __init__(self, g: Graph, producer: dict[int, Op] | None = None) -> None:
        self.g = g
        self.producer = producer if producer is not None else {op.output: op for op in g.ops}
        self.memo: dict[int, V] = {}

    def value(self, t: int, p: Op | None) -> V:
        raise NotImplementedError

    def operands(self, p: Op) -> list[int]:
        """The operands whose values `value` reads (all, unless a subclass says)."""
        return p.inputs

    def __call__(self, t: int) -> V:
        todo = [t]
        while todo:
            x = todo[-1]
            if x in self.memo:
                todo.pop()
                continue
            p = self.producer.get(x)
            missing = [i for i in (self.operands(p) if p is not None else ()) if i not in self.memo]
            if missing:
                todo.extend(missing)
                continue
            todo.pop()
            self.memo[x] = self.value(x, p)
        return self.memo[t]
