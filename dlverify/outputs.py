"""Output relations inferred from the derived views, for programs whose expected
output relations are not given (an HLO pair without `[outputs]` in its spec, an
XLA dump module whose root carries no sharding).

An output's relation is inferred when every rank holds a complete, unit-scale
view of the sequential output (a theorem the rules derived) and the ranks'
blocks tile it: the distinct blocks form the full grid of even pieces of the
sequential shape, each held by at least one rank (a replica is the grid of one
piece). The reconstruction is then exactly what `Output_Ok` would prove for
that relation, so the verdict is the one the rules give with the relation
stated; it is listed under assumptions, because the user did not state it.
"""
from __future__ import annotations

import itertools

from dlverify.problem import Problem
from dlverify.relations import BlockRelation
from dlverify.verdict import ViewFact

MAX_SEARCH = 100_000  # candidate assignments tried per output before giving up


def _candidates(v: ViewFact, seq_shape: tuple[int, ...], dist_shape: tuple[int, ...]
                ) -> list[tuple[int, ...]]:
    """The grid blocks a complete view can stand for: a wildcard offset (the
    sequential output is constant along that dim) stands for every piece."""
    per_dim = []
    for o, n, size in zip(v.offsets, dist_shape, seq_shape):
        if o >= 0:
            per_dim.append([o])
        elif n and size % n == 0:
            per_dim.append(list(range(0, size, n)))
        else:
            return []
    return [tuple(c) for c in itertools.product(*per_dim)]


def infer_output_relation(problem: Problem, idx: int, views: list[ViewFact]) -> BlockRelation | None:
    """The relation of output `idx` proved by `views`, or None when no choice of
    one complete view per rank tiles the sequential output."""
    s, d = problem.seq.outputs[idx], problem.dist.outputs[idx]
    seq_shape = problem.seq.tensors[s].shape
    dist_shape = problem.dist.tensors[d].shape
    if len(seq_shape) != len(dist_shape):
        return None
    if any(n == 0 or size % n for n, size in zip(dist_shape, seq_shape)):
        return None
    pieces = [size // n for n, size in zip(dist_shape, seq_shape)]
    grid = {tuple(i * n for i, n in zip(idx_, dist_shape))
            for idx_ in itertools.product(*(range(k) for k in pieces))}
    ranks = problem.mesh.size
    cands: list[list[tuple[int, ...]]] = []
    for r in range(ranks):
        opts: set[tuple[int, ...]] = set()
        for v in views:
            if v.seq == s and v.dist == d and v.rank == r and v.complete:
                opts.update(c for c in _candidates(v, seq_shape, dist_shape) if c in grid)
        if not opts:
            return None
        cands.append(sorted(opts))
    if len(grid) > ranks:
        return None
    # Depth-first choice of one block per rank covering the whole grid; ranks
    # with fewer options first.
    order = sorted(range(ranks), key=lambda r: len(cands[r]))
    chosen: list[tuple[int, ...] | None] = [None] * ranks
    budget = [MAX_SEARCH]

    def search(k: int, covered: dict[tuple[int, ...], int]) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if len(grid) - len(covered) > ranks - k:
            return False
        if k == ranks:
            return len(covered) == len(grid)
        r = order[k]
        uncovered_first = sorted(cands[r], key=lambda c: c in covered)
        for c in uncovered_first:
            chosen[r] = c
            covered[c] = covered.get(c, 0) + 1
            if search(k + 1, covered):
                return True
            covered[c] -= 1
            if not covered[c]:
                del covered[c]
        return False

    if not search(0, {}):
        return None
    return BlockRelation(seq_shape, dist_shape, tuple(chosen))  # type: ignore[arg-type]
