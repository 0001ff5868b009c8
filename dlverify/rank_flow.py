"""Which values of a distributed program reach which, rank by rank.

An SPMD graph's tensor t is a different value on every rank; a failing output
on rank r depends on (t, q) pairs, not on whole tensors. Local ops connect
(operand, r) to (result, r); collectives connect the members of a group
(or a permute's source and destination); a select_n whose index holds one
known value on rank r depends there only on the index and the case it picks.
The diagnosis uses this to leave out values that never reach a failing output
(a pipeline's warm-up computations on stages that discard them).
"""
from __future__ import annotations

import networkx as nx

from dlverify.ir import Graph, Mesh, Op
from dlverify.ops import KINDS
from dlverify.passes import fold, picked_case

Node = tuple[int, int]  # (tensor, rank)


def _edges(op: Op, ranks: int, splat: dict[int, list[float]]) -> list[tuple[Node, Node]]:
    out = op.output
    entry = KINDS[op.kind]
    if entry.collective is not None:
        if "pairs" in op.params:
            return [((i, src), (out, dst)) for src, dst in op.params["pairs"] for i in op.inputs]
        edges = []
        for grp in op.params.get("groups") or [list(range(ranks))]:
            edges += [((i, m), (out, r)) for r in grp for m in grp for i in op.inputs]
        return edges
    edges = []
    for r in range(ranks):
        inputs = op.inputs
        case = picked_case(op.inputs, splat, r) if op.kind == "select_n" else None
        if case is not None:
            inputs = [op.inputs[0], case]
        edges += [((i, r), (out, r)) for i in inputs]
    return edges


def rank_ancestors(graph: Graph, mesh: Mesh, targets: list[Node]) -> set[Node]:
    """Every (tensor, rank) whose value some target (tensor, rank) depends on,
    the targets included."""
    splat = fold(graph, mesh).splat
    flow = nx.DiGraph()
    for op in graph.ops:
        flow.add_edges_from(_edges(op, mesh.size, splat))
    keep: set[Node] = set(targets)
    for node in targets:
        if node in flow:
            keep |= nx.ancestors(flow, node)
    return keep
