"""Size-1 dims a program inserts around a collective, taken out of its way: exact
rewrites, run on both graphs of a program pair as written (jaxprs).

A row max kept as [T, 1] (`jnp.max(x, axis=-1, keepdims=True)`, a broadcast that
only inserts a size-1 dim), reduced across ranks by `pmax` and added back
squeezed (`m[:, 0]`) holds the same values as a [T] max reduced across ranks; the
sequential program (`jax.nn.logsumexp`) adds its [T] max. Two identities bring
both to one form:

* `all_reduce(u(x)) = u(all_reduce(x))` for `u` a broadcast_in_dim or reshape that
  only inserts size-1 dims (the same on every rank): an all_reduce combines the
  ranks' values position by position, and `u` moves no element relative to
  another (every element keeps its row-major position), so it commutes;
* `reshape(u(y)) = reshape(y)`, and `= y` when the reshape's shape is y's: such a
  `u` is itself a reshape (row-major order kept), and reshapes compose.

The reshape of the all_reduce then reads the all_reduce of the [T] max, the value
the sequential max relates to. Only size-1 insertions are moved: the collective
keeps its size, and no dim the ranks hold differently is moved across it.
tests/test_unit_collectives.py checks both identities with the shared evaluator.
"""
from __future__ import annotations

from dlverify.ir import Graph, IdAllocator, Op
from dlverify.rewrites import _Rewriter


def inserts_units_only(g: Graph, op: Op) -> bool:
    """op only inserts size-1 dims into its operand: the sized dims (and the operand's
    own size-1 dims) in order, each of the same size; as a reshape it is exact."""
    if len(op.inputs) != 1:
        return False
    src, dst = g.tensors[op.inputs[0]].shape, g.tensors[op.output].shape
    if op.kind == "reshape":
        return len(dst) >= len(src) and [n for n in src if n != 1] == [n for n in dst if n != 1]
    if op.kind != "broadcast_in_dim":
        return False
    bd = tuple(op.params["broadcast_dimensions"])
    return list(bd) == sorted(set(bd)) and len(bd) == len(src) and \
        all(src[i] == dst[d] for i, d in enumerate(bd)) and \
        all(dst[d] == 1 for d in range(len(dst)) if d not in bd)


class _UnitCollectives(_Rewriter):
    def apply(self, op: Op) -> bool:
        inner = self.producer.get(op.inputs[0]) if op.inputs else None
        if inner is None or not inserts_units_only(self.g, inner):
            return False
        x = inner.inputs[0]
        if op.kind == "all_reduce" and len(op.inputs) == 1:
            reduced = self.new_op("all_reduce", [x], self.shape(x), self.g.tensors[x].dtype, op.params, op)
            self.new_op(inner.kind, [reduced], self.shape(op.output), self.g.tensors[op.output].dtype,
                        inner.params, inner, output=op.output)
            return True
        if op.kind == "reshape" and self.g.tensors[x].dtype == self.g.tensors[op.output].dtype:
            if self.shape(x) == self.shape(op.output):
                return self.fold(op, x)
            self.new_op("reshape", [x], self.shape(op.output), self.g.tensors[op.output].dtype, {}, op,
                        output=op.output)
            return True
        return False


def move_unit_insertions(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite g (module doc) in one pass in op order (each rewrite reads the ops the
    earlier ones wrote); whether anything changed."""
    return _UnitCollectives(g, ids).run()
