"""A summing all-reduce (or reduce-scatter) of an add, split into an add of them
(distributed side).

    psum(a + b) = psum(a) + psum(b),  psum_scatter(a + b) = psum_scatter(a) + psum_scatter(b)

holds for every input over the reals (a sum over the ranks of sums), so the
rewrite is exact. It matters when a and b are partial sums of *different* sequential
values that the sequential program never adds on their own: Megatron's parallel
residual (GPT-NeoX, GPT-J, PaLM) psums the attention and MLP partials together,
psum(A_r + M_r), while the sequential block computes x + (A + bo) + (M + bb). Split,
each psum completes its own reduction, and the sum trees (datalog/sum_trees.dl)
add the complete terms in the sequential order.

Only adds of reductions' results are split (dot_general, reduce_sum, or adds of
those, each read by nothing else), and only when the two sides are different
computations (no reduction of one side has the kind, attributes, operand shapes
and program inputs of one of the other, computed by the same ops up to the offsets
of slices and the values of constants): the partial terms of two reductions the
collective exists to complete. The K and V pieces of a fused projection's input
gradient (dlverify/rewrites.py splits it by them) read the same inputs, but through
different ops; micro-batches read other slices through the same ops. A value added to a partial sum before the psum (a bias added on every
rank) is left where the program put it, so its diagnosis is unchanged, and so are
the terms of one reduction accumulated over micro-batches (datalog/partials.dl).
"""
from __future__ import annotations

from collections import Counter

from dlverify.graph_memo import PostOrderMemo
from dlverify.ir import Graph, IdAllocator, Op
from dlverify.op_pass import PassState, to_fixpoint

_REDUCTIONS = frozenset({"dot_general", "reduce_sum"})


_OFFSETS = frozenset({"start_indices", "limit_indices", "value"})


class _Form(PostOrderMemo[int]):
    """The ops a tensor is computed by, up to slice offsets and constant values, as a
    hash: micro-batches of one computation share it."""

    def value(self, t: int, p: Op | None) -> int:
        return hash((self.g.tensors[t].shape,) if p is None else (
            p.kind, tuple(sorted((k, repr(v)) for k, v in p.params.items() if k not in _OFFSETS)),
            self.g.tensors[t].shape, tuple(self.memo[i] for i in p.inputs)))


class _Sources(PostOrderMemo[int]):
    """The program inputs each tensor is computed from, as a bit mask."""

    def __init__(self, g: Graph, producer: dict[int, Op]) -> None:
        super().__init__(g, producer)
        self.bit = {t: 1 << i for i, t in enumerate(g.inputs)}

    def value(self, t: int, p: Op | None) -> int:
        m = self.bit.get(t, 0)
        for i in p.inputs if p else ():
            m |= self.memo[i]
        return m


def _leaf_sigs(g: Graph, t: int, producer: dict[int, Op], uses: Counter,
               sources: _Sources, form: _Form) -> list[tuple] | None:
    """The signatures (kind, attributes, operand shapes, the program inputs read, the
    form of the computation) of the reductions t adds up through adds read once; None
    when a leaf is no reduction or is read elsewhere."""
    p = producer.get(t)
    if p is None or uses[t] != 1 or t in g.outputs:
        return None
    if p.kind == "add" and len(p.inputs) == 2:
        parts = [_leaf_sigs(g, x, producer, uses, sources, form) for x in p.inputs]
        return None if None in parts else parts[0] + parts[1]
    if p.kind not in _REDUCTIONS:
        return None
    return [(p.kind, tuple(sorted((k, repr(v)) for k, v in p.params.items())),
             tuple(g.tensors[x].shape for x in p.inputs), sources(t), form(t))]


def _splittable(g: Graph, add: Op | None, producer: dict[int, Op], uses: Counter,
                sources: _Sources, form: _Form) -> bool:
    """`add` is an add read once (by the collective) of reductions' results on both sides,
    the two sides computed differently: no reduction of one has the signature of one of
    the other (the same kind, attributes and shapes, from the same program inputs). Sums of terms of one reduction (micro-batches accumulated) are left
    whole: the accumulation rules complete them as they are."""
    if add is None or add.kind != "add" or len(add.inputs) != 2 or uses[add.output] != 1:
        return False
    sides = [_leaf_sigs(g, t, producer, uses, sources, form) for t in add.inputs]
    return None not in sides and not set(sides[0]) & set(sides[1])


def _split_one(st: PassState, op: Op) -> bool:
    """Rewrite `op` when it is a summing all_reduce or reduce_scatter of a splittable add."""
    summing = op.params.get("reducer") == "sum" if op.kind == "all_reduce" else \
        op.kind == "reduce_scatter" and op.params.get("reducer", "sum") == "sum"
    if not summing or len(op.inputs) != 1:
        return False
    if "sources" not in st.cache:   # one memo of input masks and forms per pass
        st.cache["sources"] = _Sources(st.g, st.producer)
        st.cache["form"] = _Form(st.g, st.producer)
    add = st.producer.get(op.inputs[0])
    if not _splittable(st.g, add, st.producer, st.uses, st.cache["sources"], st.cache["form"]):
        return False
    t = st.g.tensors[op.output]
    parts = [st.builder.op(op.kind, [x], t.shape, t.dtype, op.params, op.loc, op.name)
             for x in add.inputs]
    st.builder.op("add", parts, t.shape, t.dtype, {}, add.loc, add.name, output=op.output)
    return True


def split_summed_adds(g: Graph, ids: IdAllocator) -> bool:
    """Rewrite every summing all_reduce or reduce_scatter of a splittable add of g (to a fixpoint: an add
    of adds is split again). Returns whether anything changed; the adds left unread
    are for the caller to drop."""
    return to_fixpoint(g, ids, _split_one)
