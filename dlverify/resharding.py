"""XLA's all-to-all resharding, rewritten as an all-gather and a slice.

When XLA's SPMD partitioner moves a tensor from being split along dim s to
being split along dim t (FSDP's gradients, a batch-split activation meeting a
column-split weight), it writes a chain of data movement on the distributed
side only: reshape (dim t cut into [n, t/n]), all-to-all over the new dim,
transpose (the new dim next to dim s), reshape (merged into dim s). No op of
the sequential program mirrors that chain, so nothing relates its pieces.

Its end value is simpler than its pieces: on the rank at position q of its
group, the block q of dim t of the all-gather of x along dim s. This pass
replaces the chain's last op by that all-gather and a `dynamic_slice` at
`q(rank) * (t/n)` (the rank's position read from a constant table indexed by
the rank, as XLA writes partition-dependent offsets), which the rules relate.

Sound by construction, not by pattern: the chain and the candidate are pure
data movement (every output element is one input element), so running both
on inputs whose elements are all distinct (each rank's flat positions, tagged
by the rank) and getting the same outputs on every rank proves them equal for
all inputs. Only chains of reshape, transpose and all-to-all with `groups`
over the flat rank (HLO programs) are tried, and only when the tags fit in
`MAX_TAGGED` elements per rank.
"""
from __future__ import annotations

import numpy as np

from dlverify.frontends.hlo.model import FLAT_AXIS
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Op
from dlverify.problem import Problem

MAX_CHAIN = 6
MAX_TAGGED = 1 << 20   # elements per rank run through the proof


def _chains(g: Graph) -> list[list[Op]]:
    """Chains of data-movement ops holding one all-to-all, each op's data input the
    previous op's output, from a tensor that is no such op's output."""
    producer = {op.output: op for op in g.ops}
    readers: dict[int, list[Op]] = {}
    for op in g.ops:
        for t in op.inputs:
            readers.setdefault(t, []).append(op)
    out = []
    for op in g.ops:
        if op.kind != "all_to_all" or "groups" not in op.params:
            continue
        chain = [op]
        while len(chain) < MAX_CHAIN:   # back to the chain's start
            p = producer.get(chain[0].inputs[0])
            if p is None or p.kind not in ("reshape", "transpose"):
                break
            chain.insert(0, p)
        while len(chain) < MAX_CHAIN:   # on to its end, through single readers
            nxt = readers.get(chain[-1].output, [])
            if len(nxt) != 1 or nxt[0].kind not in ("reshape", "transpose"):
                break
            chain.append(nxt[0])
        out.append(chain)
    return out


def _tags(shape: tuple[int, ...], ranks: int) -> list[np.ndarray]:
    size = int(np.prod(shape))
    return [np.arange(r * size, (r + 1) * size, dtype=np.float64).reshape(shape)
            for r in range(ranks)]


def _run(tensors: dict, ops: list[Op], x: int, ranks: int) -> dict[int, list[np.ndarray]]:
    sub = Graph("resharding", tensors=tensors, inputs=[x], ops=list(ops))
    return Interpreter(sub, ranks, lambda r, a: r).run([_tags(tensors[x].shape, ranks)])


def _candidate(g: Graph, ids: IdAllocator, x: int, end: Op, groups: list[list[int]], ranks: int,
               s: int, t: int) -> Graph:
    """all_gather(x, s) sliced at q(rank) * size along t, in a scratch graph holding
    x, the chain's end and the new tensors only (not a copy of all of g's)."""
    xt, ot = g.tensors[x], g.tensors[end.output]
    n = len(groups[0])
    scratch = Graph("candidate", tensors={x: xt, end.output: ot})
    b = GraphBuilder(scratch, ids)
    gathered_shape = tuple(d * n if i == s else d for i, d in enumerate(xt.shape))
    gathered = b.op("all_gather", [x], gathered_shape, xt.dtype,
                    {"dimension": s, "groups": groups}, end.loc, f"{end.name}.gathered")
    table = np.zeros(ranks, np.int32)
    for grp in groups:
        for q, r in enumerate(grp):
            table[r] = q * ot.shape[t]
    offsets = b.constant(table, (ranks,), "int32", end.loc, f"{end.name}.offsets")
    rank = b.op("axis_index", [], (), "int32", {"axis": FLAT_AXIS}, end.loc, f"{end.name}.rank")
    picked = b.op("dynamic_slice", [offsets, rank], (1,), "int32", {"slice_sizes": (1,)},
                  end.loc, f"{end.name}.offset1")
    start = b.op("reshape", [picked], (), "int32", {}, end.loc, f"{end.name}.offset")
    zero = b.constant(np.int32(0), (), "int32", end.loc, f"{end.name}.zero")
    starts = [start if i == t else zero for i in range(len(ot.shape))]
    b.op("dynamic_slice", [gathered, *starts], ot.shape, ot.dtype,
         {"slice_sizes": ot.shape}, end.loc, end.name, output=end.output)
    return scratch


def _replacement(g: Graph, ids: IdAllocator, chain: list[Op], ranks: int) -> list[Op] | None:
    """The all-gather and slice equal to the chain's end (proven on tags), else None."""
    x = chain[0].inputs[0]
    end = chain[-1]
    xs, os_ = g.tensors[x].shape, g.tensors[end.output].shape
    groups = chain[[op.kind for op in chain].index("all_to_all")].params["groups"]
    n = len(groups[0]) if groups else 0
    if n < 2 or len(xs) != len(os_) or any(len(grp) != n for grp in groups) \
            or sorted(r for grp in groups for r in grp) != list(range(ranks)) \
            or int(np.prod(xs)) > MAX_TAGGED:
        return None
    grown = [i for i in range(len(xs)) if os_[i] == xs[i] * n]
    shrunk = [i for i in range(len(xs)) if os_[i] * n == xs[i]]
    if any(os_[i] != xs[i] for i in range(len(xs)) if i not in grown and i not in shrunk):
        return None
    want = _run(g.tensors, chain, x, ranks)[end.output]
    for s in grown:
        for t in shrunk:
            if s == t:
                continue
            scratch = _candidate(g, ids, x, end, groups, ranks, s, t)
            got = _run(scratch.tensors, scratch.ops, x, ranks)[end.output]
            if all(np.array_equal(a, b) for a, b in zip(got, want)):
                g.tensors.update(scratch.tensors)
                return scratch.ops
    return None


def rewrite_reshardings(problem: Problem) -> bool:
    """Replace the end of every all-to-all resharding chain of the distributed graph
    that an all-gather and a slice reproduce (see the module docstring)."""
    g = problem.dist
    if problem.mesh.axis_names != (FLAT_AXIS,):
        return False
    ranks = problem.mesh.size
    changed = False
    for chain in _chains(g):
        # the longest piece around the all-to-all that an all-gather reproduces
        # (the chain may begin with moves of its own before the resharding starts)
        first = [op.kind for op in chain].index("all_to_all")
        pieces = sorted(((a, b) for a in range(first + 1) for b in range(len(chain), first, -1)),
                        key=lambda ab: ab[0] - ab[1])
        for a, b in pieces:
            ops = _replacement(g, problem.ids, chain[a:b], ranks)
            if ops is None:
                continue
            at = g.ops.index(chain[b - 1])
            g.ops[at:at + 1] = ops
            changed = True
            break
    return changed


__all__ = ["rewrite_reshardings"]
