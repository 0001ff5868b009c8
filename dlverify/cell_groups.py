"""A summing all-reduce of updates into zeros that several ranks write at the same place,
split into two levels (distributed side).

On rank r, y_r = dynamic_update_slice(zeros, u_r, S_r) with the start S_r known per
rank. When the members of a group of psum(y) fall into classes of equal starts, all
classes of one size c > 1, then

    psum(y) = psum_across(dynamic_update_slice(zeros, psum_class(u), S_r))

where psum_class sums over the members of r's class and psum_across over one member of
every class (the q-th member of each, in rank order). The update into zeros is linear
in u for a fixed start, so the ranks of one class may add their updates first; the
second level then adds one update per start, as the members of the group did, each
once. Both sides are sums over the same ranks, so the rewrite is exact for every input
over the reals (tests/test_cell_groups.py checks it numerically).

It matters when the ranks of a class hold partial terms of the update: with fewer KV
heads than ranks, the gradient of the replicated K (V) projection is written at the
rank's KV head by the transpose of its dynamic_slice, as a partial sum over the rank's
query heads; the ranks serving one KV head complete it in the first level, and the
second level assembles the heads (datalog/update.dl). A start that differs between the
members of a class never joins them; nothing is rewritten when every start is distinct.
"""
from __future__ import annotations

from dlverify.ir import Graph, IdAllocator, Mesh, Op
from dlverify.op_pass import PassState, to_fixpoint
from dlverify.ops.structural import clamped_starts
from dlverify.passes import Folded, fold


def _zero_splat(splat: dict[int, list[float]], t: int) -> bool:
    return t in splat and all(v == 0 for v in splat[t])


def _levels(group: list[int], starts: dict[int, tuple[int, ...]]) -> tuple[list[list[int]], list[list[int]]] | None:
    """The classes of equal starts of one group and the groups across them (member q of
    each class), or None when the classes differ in size or have one member each."""
    classes: dict[tuple[int, ...], list[int]] = {}
    for r in group:
        classes.setdefault(starts[r], []).append(r)
    sizes = {len(c) for c in classes.values()}
    if len(sizes) != 1 or sizes == {1}:
        return None
    cls = sorted(classes.values())
    return cls, [list(m) for m in zip(*cls)]


def _split_one(st: PassState, op: Op, mesh: Mesh, fold: Folded) -> bool:
    if op.kind != "all_reduce" or len(op.inputs) != 1 or op.params.get("reducer") != "sum":
        return False
    dus = st.producer.get(op.inputs[0])
    if dus is None or dus.kind != "dynamic_update_slice" or not _zero_splat(fold.splat, dus.inputs[0]):
        return False
    groups = op.params.get("groups") or [list(range(mesh.size))]
    clamped = clamped_starts(fold.small, dus.inputs[2:], st.g.tensors[dus.inputs[0]].shape,
                             st.g.tensors[dus.inputs[1]].shape, mesh.size)
    if clamped is None:
        return False
    starts = {r: tuple(row) for r, row in enumerate(clamped)}
    levels = [_levels(grp, starts) for grp in groups]
    if any(lv is None for lv in levels):
        return False
    first = [c for cls, _ in levels for c in cls]
    second = [a for _, across in levels for a in across]
    u = st.g.tensors[dus.inputs[1]]
    summed = st.builder.op("all_reduce", [dus.inputs[1]], u.shape, u.dtype,
                           {**op.params, "groups": first}, op.loc, op.name)
    t = st.g.tensors[dus.output]
    placed = st.builder.op("dynamic_update_slice", [dus.inputs[0], summed, *dus.inputs[2:]], t.shape,
                           t.dtype, dict(dus.params), dus.loc, dus.name)
    st.builder.op("all_reduce", [placed], t.shape, t.dtype, {**op.params, "groups": second},
                  op.loc, op.name, output=op.output)
    return True


def split_repeated_cells(g: Graph, ids: IdAllocator, mesh: Mesh | None) -> bool:
    """Rewrite every summing all_reduce of g whose operand is an update into zeros
    written at equal starts by several members of a group. Returns whether anything
    changed; the updates left unread are for the caller to drop."""
    if mesh is None or not any(op.kind == "dynamic_update_slice" for op in g.ops):
        return False
    producer = {op.output: op for op in g.ops}
    if not any(op.kind == "all_reduce" and producer.get(op.inputs[0]) is not None
               and producer[op.inputs[0]].kind == "dynamic_update_slice" for op in g.ops):
        return False
    folded = fold(g, mesh)
    return to_fixpoint(g, ids, lambda st, op: _split_one(st, op, mesh, folded))
