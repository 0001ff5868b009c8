"""Output relations inferred from the derived views, for programs whose expected
output relations are not given (an HLO pair without `[outputs]` in its spec, an
XLA dump module whose root carries no sharding).

An output's relation is inferred when every rank holds a complete, unit-scale
view of the sequential output (a theorem the rules derived) and the ranks'
blocks tile it in device order: the distinct blocks form the full grid of even
pieces of the sequential shape, and the rank holding each piece is the one an
XLA iota tile assignment names (`devices=[pieces..., copies]<=[f...]T(perm)`:
the ranks in order, reshaped and transposed; a replica is the grid of one
piece). The reconstruction is then exactly what `Output_Ok` would prove for
that relation, so the verdict is the one the rules give with the relation
stated; it is listed under assumptions, because the user did not state it.

Why device order and not any tiling: a ring shift in the wrong direction or a
pair swap on the wrong bit leaves every rank a whole block, in the wrong
place; a layout that took any order would call them verified. Every layout a
framework writes without an explicit device list is an iota assignment, and an
explicit one is stated where the relation is (a sharding annotation, a spec).
"""
from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np

from dlverify.problem import Problem
from dlverify.relations import BlockRelation
from dlverify.verdict import ViewFact

MAX_SEARCH = 100_000  # candidate assignments tried per output before giving up
MAX_IOTA_DIMS = 4     # the device order reshaped into at most this many dims


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
    cands: list[set[tuple[int, ...]]] = []
    for r in range(ranks):
        opts: set[tuple[int, ...]] = set()
        for v in views:
            if v.seq == s and v.dist == d and v.rank == r and v.complete:
                opts.update(c for c in _candidates(v, seq_shape, dist_shape) if c in grid)
        if not opts:
            return None
        cands.append(opts)
    if len(grid) > ranks or ranks % len(grid):
        return None
    for tried, index in enumerate(iota_assignments(tuple(pieces), ranks)):
        if tried >= MAX_SEARCH:
            return None
        offsets = index * np.asarray(dist_shape, dtype=np.int64)
        blocks = []
        for r in range(ranks):      # most orders fail at the first ranks
            b = tuple(int(o) for o in offsets[r])
            if b not in cands[r]:
                break
            blocks.append(b)
        else:
            return BlockRelation(seq_shape, dist_shape, tuple(blocks))
    return None


def _factorisations(n: int, most: int) -> Iterator[tuple[int, ...]]:
    """Every ordered factorisation of n into at most `most` factors above 1 (n = 1: the
    empty one)."""
    if n == 1:
        yield ()
        return
    if most == 0:
        return
    for f in range(2, n + 1):
        if n % f == 0:
            for rest in _factorisations(n // f, most - 1):
                yield (f, *rest)


def iota_assignments(pieces: tuple[int, ...], ranks: int) -> Iterator[np.ndarray]:
    """For each distinct XLA iota tile assignment of `ranks` devices to a grid of
    `pieces` (times ranks / prod(pieces) copies), reshaping the device order into at
    most MAX_IOTA_DIMS dims (a mesh's axes): the grid index of every rank, an array
    (ranks, len(pieces)). The row-major order (rank r holds piece r, copies
    innermost) comes first."""
    shape = (*pieces, ranks // int(np.prod(pieces)))
    seen: set[bytes] = set()
    for f in sorted(set(_factorisations(ranks, MAX_IOTA_DIMS)), key=len):
        for perm in itertools.permutations(range(len(f))):
            tiles = np.arange(ranks).reshape(f or (1,)).transpose(perm or (0,)).ravel()
            key = tiles.tobytes()
            if key in seen:
                continue
            seen.add(key)
            position = np.empty(ranks, dtype=np.int64)
            position[tiles] = np.arange(ranks)
            index = np.unravel_index(position, shape)[:len(pieces)]
            yield np.stack(index, axis=1) if index else np.zeros((ranks, 0), dtype=np.int64)
