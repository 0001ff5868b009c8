"""Graph passes run before export: sharing of identical constants, and folding
of values known before run time (constants and the rank coordinates that
`axis_index` reads), per rank.

Folding is plain evaluation of the program on known values by the shared
evaluator of the op-kind table (dlverify/ops), so it is exact: rank-dependent
scalars (dynamic-slice starts, position offsets) become per-rank
integers, and tensors holding one value everywhere ("splats") are recorded with
that value so the rules can match constants without enumerating elements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dlverify.index_ranges import IndexFacts, MaskPrefix
from dlverify.ir import Graph, Mesh, Op
from dlverify.ops import KINDS, Family, NotExecutable, data_operands, evaluate, exact_dtype

SMALL = 64  # arrays up to this many elements are folded in full


def share_nullary(graph: Graph) -> None:
    """Merge constants with identical value and iotas with identical params, so
    every distinct constant is one tensor (keeps constant matching linear)."""
    seen: dict[tuple, int] = {}
    alias: dict[int, int] = {}
    kept = []
    for op in graph.ops:
        key = None
        t = graph.tensors[op.output]
        if op.kind == "constant" and op.params.get("value") is not None:
            v = np.asarray(op.params["value"])
            if v.size <= 1 << 16:
                key = ("c", t.shape, t.dtype, v.tobytes())
        elif op.kind == "iota":
            key = ("i", t.shape, t.dtype, op.params["dimension"])
        if key is not None and key in seen:
            alias[op.output] = seen[key]
            continue
        if key is not None:
            seen[key] = op.output
        op.inputs = [alias.get(i, i) for i in op.inputs]
        kept.append(op)
    graph.ops = kept
    graph.outputs = [alias.get(o, o) for o in graph.outputs]


@dataclass
class Folded:
    """Values known before run time. `small[t][r]` is the full array of tensor t
    on rank r; `splat[t][r]` the single value t holds everywhere on rank r.
    Sequential graphs have one "rank", 0."""

    ranks: int
    small: dict[int, list[np.ndarray]] = field(default_factory=dict)
    splat: dict[int, list[float]] = field(default_factory=dict)
    prefix: dict[int, list[MaskPrefix | None]] = field(default_factory=dict)


def _value(graph: Graph, op: Op, ins: list[np.ndarray], mesh: Mesh | None, rank: int,
           shape: tuple[int, ...] | None = None) -> np.ndarray | None:
    """The op's value on one rank, or None when the evaluator cannot compute it."""
    out = graph.tensors[op.output]
    coord = (lambda axis: mesh.coords(rank)[axis]) if mesh is not None else None
    try:
        return evaluate(op.kind, op.params, ins, out.shape if shape is None else shape, out.dtype,
                        coord)
    except NotExecutable:
        return None


def picked_case(inputs: list[int], splat: dict[int, list[float]], rank: int) -> int | None:
    """The operand select_n(index, case0, case1, ...) returns on `rank` when its
    index holds one valid value there, else None."""
    if inputs[0] not in splat:
        return None
    idx = splat[inputs[0]][rank]
    if float(idx) != int(idx) or not 0 <= int(idx) < len(inputs) - 1:
        return None
    return inputs[1 + int(idx)]


def _picked_splats(inputs: list[int], splat: dict[int, list[float]], ranks: int) -> list[float] | None:
    """select_n per rank, when the case it picks there holds one value: that value."""
    out = []
    for r in range(ranks):
        case = picked_case(inputs, splat, r)
        if case is None or case not in splat:
            return None
        out.append(splat[case][r])
    return out


def array_prefix(mask: np.ndarray) -> MaskPrefix | None:
    """A known bool array as a prefix along one dim (MaskPrefix), when it is one."""
    for j in range(mask.ndim):
        cols = np.moveaxis(mask, j, 0).reshape(mask.shape[j], -1)
        if cols.shape[1] == 0 or not np.all(cols == cols[:, :1]):
            continue
        line = cols[:, 0]
        k = int(np.argmin(line == line[0])) if not np.all(line == line[0]) else len(line)
        if np.all(line[k:] != line[0]):
            return MaskPrefix(j, k, bool(line[0]))
    return None


def fold(graph: Graph, mesh: Mesh | None) -> Folded:
    ranks = mesh.size if mesh is not None else 1
    res = Folded(ranks)
    small, splat = res.small, res.splat
    index_facts = IndexFacts(graph, ranks, splat)   # masks decided by index ranges
    for op in graph.ops:
        out = graph.tensors[op.output]
        size = math.prod(out.shape)  # (np.prod: a third of fold's time on deep graphs)
        if op.kind == "constant":
            v = op.params.get("value")
            if v is None:
                continue
            v = np.asarray(v)
            if v.size and np.all(v == v.flat[0]):
                splat[op.output] = [v.flat[0].item()] * ranks
            if v.size <= SMALL:
                small[op.output] = [v] * ranks
            continue
        if op.kind == "axis_index":
            assert mesh is not None
            vals = [_value(graph, op, [], mesh, r) for r in range(ranks)]
            if all(v is not None for v in vals):
                small[op.output] = vals
                splat[op.output] = [v.item() for v in vals]
            continue
        if op.kind == "iota" and size <= SMALL:
            v = _value(graph, op, [], mesh, 0)
            if v is not None:
                small[op.output] = [v] * ranks
            continue
        if op.inputs and all(i in small for i in op.inputs) and size <= SMALL \
                and KINDS[op.kind].collective is None:
            vals = []
            for r in range(ranks):
                v = _value(graph, op, [small[i][r] for i in op.inputs], mesh, r)
                if v is None:
                    break
                vals.append(v)
            if len(vals) == ranks:
                small[op.output] = vals
                if size and all(np.all(v == v.flat[0]) for v in vals):
                    splat[op.output] = [v.flat[0].item() for v in vals]
                continue
        # Large tensors: follow one-value tensors through ops that copy their
        # first operand, and elementwise ops on one-value operands.
        kind = KINDS[op.kind]
        if kind.copies_operand0 and op.inputs and op.inputs[0] in splat:
            splat[op.output] = list(splat[op.inputs[0]])
        elif op.kind == "select_n" and op.inputs and op.inputs[0] in splat:
            picked = _picked_splats(op.inputs, splat, ranks)
            if picked is not None:
                splat[op.output] = picked
        elif data_operands(op.kind, len(op.inputs)) > 1:
            # every element comes from operands holding one value v: the result is v
            data = op.inputs[:data_operands(op.kind, len(op.inputs))]
            if all(i in splat and splat[i] == splat[data[0]] for i in data):
                splat[op.output] = list(splat[data[0]])
        elif kind.family is Family.ELEMENTWISE and op.inputs and all(i in splat for i in op.inputs):
            vals = []
            for r in range(ranks):
                # integer splats back in their own type (exact, wrapping);
                # float splats as Python floats, i.e. float64
                ins = [np.asarray(splat[i][r], dtype=exact_dtype(graph.tensors[i].dtype))
                       for i in op.inputs]
                v = _value(graph, op, ins, mesh, r, shape=())
                if v is None:
                    break
                vals.append(v.item())
            if len(vals) == ranks:
                splat[op.output] = vals
        decided = index_facts.visit(op.output)   # in op order: short recursions
        if decided is not None and op.output not in splat:
            splat[op.output] = decided
        elif decided is None and out.dtype == "bool" and op.output not in splat:
            prefix = index_facts.prefix(op.output)   # a mask of uneven shards' padding
            if prefix is not None:
                res.prefix[op.output] = prefix
    for t, vals in small.items():
        if t not in splat and graph.tensors[t].dtype == "bool":
            prefix = [array_prefix(v) for v in vals]
            if any(m is not None for m in prefix):
                res.prefix[t] = prefix
    return res
