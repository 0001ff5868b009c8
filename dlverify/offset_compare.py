"""An integer offset moved from the data side of an equality to its index side:

    (a - c) == i   <=>   a == i + c        (and the same for !=)

for integers, exactly (two's complement arithmetic wraps alike on both sides:
x - c == i and x == i + c hold for the same x modulo 2^bits). `i` must be an
index (an iota, through broadcasts and reshapes), so the offset always goes to
the same side, and the data side becomes what the other program compares.

A vocab-parallel one-hot embedding compares each rank's shifted ids with the
local class iota, `one_hot(ids - r * V/n, V/n)`; the sequential program compares
the ids with the global iota, `one_hot(ids, V)`. After the move the rank compares
the same ids as the sequential program with `iota(V/n) + r * V/n`, a block of the
global iota (the relation rotary positions offset by the rank already use), so the
one-hot and its contraction with the table shard are blocks and partial sums of
the sequential ones. The broadcasts, reshapes and transposes between the
subtraction and the comparison (m(a - c) = m(a) - m(c)) are applied to both of its
operands. Run on both graphs (dlverify/pass_order.py);
tests/test_offset_compare.py checks the rewrite on random integers with the shared
evaluator and where it must not fire.
"""
from __future__ import annotations

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.ops.dtypes import is_int_dtype
from dlverify.rewrites import _Rewriter

_INDEX_MOVES = ("broadcast_in_dim", "reshape")
# unary moves that commute with an elementwise subtraction: m(a - c) = m(a) - m(c)
_MOVES = ("broadcast_in_dim", "reshape", "transpose")


class _OffsetCompare(_Rewriter):
    def __init__(self, graph: Graph, ids: IdAllocator) -> None:
        super().__init__(graph, ids)
        self.made = {op.output: op for op in graph.ops}

    def _is_index(self, t: int) -> bool:
        op = self.made.get(t)
        while op is not None and op.kind in _INDEX_MOVES:
            op = self.made.get(op.inputs[0])
        return op is not None and op.kind == "iota"

    def _shifted(self, t: int) -> tuple[Op, list[Op]] | None:
        """(the subtraction, the moves from it to t, innermost first)."""
        chain: list[Op] = []
        op = self.made.get(t)
        while op is not None and op.kind in _MOVES:
            chain.append(op)
            op = self.made.get(op.inputs[0])
        if op is None or op.kind != "sub" or len(op.inputs) != 2 or \
                not is_int_dtype(self.g.tensors[op.output].dtype):
            return None
        return op, chain[::-1]

    def _moved(self, t: int, chain: list[Op], like: Op) -> int:
        for b in chain:
            t = self.new_op(b.kind, [t], self.shape(b.output),
                            self.g.tensors[b.output].dtype, dict(b.params), like)
        return t

    def apply(self, op: Op) -> bool:
        if op.kind not in ("eq", "ne") or len(op.inputs) != 2:
            return False
        for side in (0, 1):
            data, index = op.inputs[side], op.inputs[1 - side]
            found = self._shifted(data)
            if found is None or not self._is_index(index) or \
                    self.g.tensors[data].dtype != self.g.tensors[index].dtype:
                continue
            sub, chain = found
            a, c = sub.inputs
            a2, c2 = self._moved(a, chain, sub), self._moved(c, chain, sub)
            shape, dtype = self.shape(index), self.g.tensors[index].dtype
            moved = self.new_op("add", [index, c2], shape, dtype, {}, sub)
            ins = [a2, moved] if side == 0 else [moved, a2]
            self.new_op(op.kind, ins, self.shape(op.output), self.g.tensors[op.output].dtype,
                        dict(op.params), op, output=op.output)
            return True
        return False


def move_compare_offsets(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite g's shifted equalities (module doc); whether anything changed."""
    return _OffsetCompare(g, ids).run()
