"""Facts for the layout algebra with free size-1 dims, pad and dynamic_update_slice.

A reshape is row-major reinterpretation. Split its dims into consecutive groups
whose size products agree on both sides (the *cuts* are the index pairs (i, j)
where the prefix products of operand and output sizes are equal): the reshape
acts on each group independently. A block of the operand maps to a block of the
output when, in every group, the operand box and the output box are contiguous
in row-major order (all dims before the first partially held one have size 1,
all dims after it are whole): both then enumerate the same flat range.

The sequential reshape fixes the groups (its finest chain of cuts, size-1 dims
standing alone); the distributed reshape only has to have a cut wherever the
sequential one ends a group. So a size-1 local dim (one KV head per rank) is
free to sit in any group, and the two reshapes pair although their own
groupings differ (datalog/layout_algebra.dl).

Also exported here: pad configurations (datalog/padding.dl) and the per-rank
window a dynamic_update_slice writes (datalog/update.dl).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from math import prod
from typing import Any, Callable

from dlverify import schema as S
from dlverify.ir import CHAIN_DEPTH, Graph, Op
from dlverify.ops.structural import clamped_starts
from dlverify.passes import Folded

_INT32 = 2 ** 31
AddRow = Callable[..., None]


@dataclass(frozen=True)
class ReshapeGroup:
    """Operand dims [i0, i1) reshape to output dims [j0, j1) (equal products)."""

    i0: int
    i1: int
    j0: int
    j1: int


def reshape_cuts(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int]]:
    """Index pairs (i, j) with prod(src[:i]) == prod(dst[:j])."""
    out_at: dict[int, list[int]] = {}
    p = 1
    for j in range(len(dst) + 1):
        out_at.setdefault(p, []).append(j)
        if j < len(dst):
            p *= dst[j]
    cuts, p = [], 1
    for i in range(len(src) + 1):
        cuts += [(i, j) for j in out_at.get(p, [])]
        if i < len(src):
            p *= src[i]
    return cuts


def reshape_chain(src: tuple[int, ...], dst: tuple[int, ...]) -> list[ReshapeGroup] | None:
    """The finest chain of cuts from (0, 0) to the end, as groups; None when the
    sizes do not factor or a group holds 2^31 elements or more (flat offsets in
    Datalog are 32-bit)."""
    if prod(src) != prod(dst) or 0 in src:
        return None
    cuts = set(reshape_cuts(src, dst))
    end = (len(src), len(dst))
    at, groups = (0, 0), []
    while at != end:
        nxt = [c for c in cuts if c[0] >= at[0] and c[1] >= at[1] and c != at]
        if not nxt:
            return None
        step = min(nxt, key=lambda c: (c[0] + c[1], c[0]))
        g = ReshapeGroup(at[0], step[0], at[1], step[1])
        if prod(src[g.i0:g.i1]) >= _INT32:
            return None
        groups.append(g)
        at = step
    return groups


def reshape_rows(add: AddRow, op: Op, x: int, src: tuple[int, ...], dst: tuple[int, ...],
                 dist: bool, same_ok: bool = True) -> None:
    """Facts of the reshape from tensor x to the end dst of op's chain: Reshape_Chain;
    Reshape_Same when dst is op's output and has x's shape; Reshape_Cut for the
    distributed program; Reshape_Group and Reshape_Dim for the sequential one (the
    groups the distributed side must respect)."""
    for rel, tail in _reshape_rows(tuple(src), tuple(dst), dist, same_ok):
        add(rel, op.id, x, *tail)


@functools.lru_cache(maxsize=4096)
def _reshape_rows(src: tuple[int, ...], dst: tuple[int, ...], dist: bool,
                  same_ok: bool) -> tuple[tuple[S.Relation, tuple[int, ...]], ...]:
    """reshape_rows' rows without their op and tensor columns: they depend on the
    shapes alone, and a deep model reshapes the same shapes in every layer."""
    rows: list[tuple[S.Relation, tuple[int, ...]]] = [(S.RESHAPE_CHAIN, ())]
    if same_ok and src == dst:
        rows.append((S.RESHAPE_SAME, ()))
    if dist:
        rows.extend((S.RESHAPE_CUT, (i, j)) for i, j in reshape_cuts(src, dst))
        return tuple(rows)
    groups = reshape_chain(src, dst) or []
    for g, grp in enumerate(groups):
        rows.append((S.RESHAPE_GROUP, (g, grp.i0, grp.i1, grp.j0, grp.j1, len(groups))))
        for side, (lo, hi, sizes) in enumerate(((grp.i0, grp.i1, src), (grp.j0, grp.j1, dst))):
            prev = -1
            for k in range(lo, hi):
                stride = prod(sizes[k + 1:hi])
                rows.append((S.RESHAPE_DIM, (side, k, g, stride, prev)))
                if sizes[k] > 1:
                    prev = k
    return tuple(rows)


def broadcast_end(src: tuple[int, ...], dst: tuple[int, ...], bd: tuple[int, ...]) -> tuple[int, ...]:
    """The operand of broadcast_in_dim with its new dims inserted as size 1: the
    broadcast is a reshape to this shape, then an expansion of size-1 dims."""
    end = [1] * len(dst)
    for i, j in enumerate(bd):
        end[j] = src[i]
    return tuple(end)


def reshape_chains(add: AddRow, graph: Graph, dist: bool) -> None:
    """Reshape facts from every start of a chain of reshape-like ops (up to
    CHAIN_DEPTH ops) to its end: a chain is one reshape. A broadcast_in_dim that
    expands dims ends a chain too: the chain's end is its operand with the new
    dims inserted as size 1 (Reshape_End_Dim), and Broadcast_Expands names the
    dims the broadcast then expands."""
    producer = {op.output: op for op in graph.ops}
    like = {op.id for op in graph.ops if graph.moves_no_element(op)}
    for op in graph.ops:
        out = graph.tensors[op.output].shape
        if op.id in like:
            end, same_ok = out, True
        elif op.kind == "broadcast_in_dim":
            bd = tuple(op.params["broadcast_dimensions"])
            end, same_ok = broadcast_end(graph.tensors[op.inputs[0]].shape, out, bd), False
            for j, (e, n) in enumerate(zip(end, out)):
                if e != n:
                    add(S.BROADCAST_EXPANDS, op.id, j)
        else:
            continue
        for i, n in enumerate(end):
            add(S.RESHAPE_END_DIM, op.id, i, n)
        x = op.inputs[0]
        for _ in range(CHAIN_DEPTH):
            reshape_rows(add, op, x, graph.tensors[x].shape, end, dist, same_ok)
            up = producer.get(x)
            if up is None or up.id not in like:
                break
            x = up.inputs[0]


def pad_rows(add: AddRow, op: Op) -> None:
    """Pad_Dim rows when the padding is non-negative and has no interior padding."""
    cfg = op.params.get("padding_config") or ()
    if any(int(c[2]) != 0 or int(c[0]) < 0 or int(c[1]) < 0 for c in cfg):
        return
    for i, c in enumerate(cfg):
        add(S.PAD_DIM, op.id, i, int(c[0]), int(c[1]))


def update_rows(add: AddRow, g: Graph, op: Op, fold: Folded) -> None:
    """Update_Window rows of a dynamic_update_slice whose update is smaller than
    the operand in exactly one dim, Update_Cell rows when it is smaller in two
    and has one element along one of them (the gradient of a per-rank
    dynamic_slice taking part of one row: a query-head range of one KV group),
    with starts known before run time; starts are clamped as XLA clamps them
    (the evaluator's `clamp_start`)."""
    z, u = g.tensors[op.inputs[0]].shape, g.tensors[op.inputs[1]].shape
    starts = op.inputs[2:]
    smaller = [k for k in range(len(z)) if u[k] < z[k]]
    if tuple(u) == tuple(z):
        add(S.UPDATE_WHOLE, op.id)
    if len(smaller) == 1 and len(starts) == len(z):
        add(S.UPDATE_ALONG, op.id, smaller[0])
    if len(smaller) not in (1, 2) or len(starts) != len(z):
        return
    if len(smaller) == 2:   # the dim where the update has one element is the outer one
        smaller.sort(key=lambda k: u[k] != 1)
        if u[smaller[0]] != 1:
            return
    clamped = clamped_starts(fold.small, [starts[k] for k in smaller], [z[k] for k in smaller],
                             [u[k] for k in smaller], fold.ranks)
    if clamped is None:   # a start not known, or not one integer: no fact, so no rule applies
        return
    for r, at in enumerate(clamped):
        if len(smaller) == 1:
            add(S.UPDATE_WINDOW, op.id, r, smaller[0], at[0])
        else:
            add(S.UPDATE_CELL, op.id, r, smaller[0], at[0], smaller[1], at[1])


def add_facts(add: AddRow, graph: Graph, fold: Folded, dist: bool) -> None:
    """The facts of this module for every op of one program."""
    reshape_chains(add, graph, dist)
    for op in graph.ops:
        if op.kind == "pad":
            pad_rows(add, op)
        elif op.kind == "dynamic_update_slice":
            update_rows(add, graph, op, fold)


def export_all(exporter: Any, seq: Graph, dist: Graph, seq_fold: Folded, dist_fold: Folded) -> None:
    """Hook for dlverify.facts.export."""
    add_facts(exporter.add, seq, seq_fold, dist=False)
    add_facts(exporter.add, dist, dist_fold, dist=True)
