"""A sequential prefix sum written in blocks: an exact rewrite (over the reals).

Sequence parallelism splits the dim a prefix sum runs along (position ids from
a cumsum of a mask, token counts, the scan of a linear recurrence). Each rank
holds a block of b positions, takes the cumsum of its block, and adds a carry:
the total of every earlier block. No op-by-op rule relates that to the
sequential cumsum(x, a): the rank's local cumsum is not a block of it. But for
every x and every split N = n * b of the scanned dim,

    cumsum(x, a) = concatenate_r( L_r + broadcast(C_r) ; a ),   r = 0 .. n-1,

    L_r = cumsum(slice_r(x), a)           the prefix sums of block r alone,
    t_r = L_r at position b - 1 along a   the total of block r (a squeeze),
    T   = the t_r stacked along a new leading dim              ([n] + rest),
    C_r = sum_{j < r} T[j]                the carry of block r,

since position r*b + i of the cumsum is the sum of every element of the blocks
before r plus the first i + 1 of block r. T and the carry are written as the
distributed program writes them, the forms being the same values. T: the
squeezed totals concatenated flat and reshaped to [n] + rest (an all_gather of
the rank's squeezed total, as jax writes it), or, along dim 0, the last rows
themselves concatenated (XLA's compiled module gathers the rows). The carry:

* the exclusive prefix sum of the totals, picked at r:  C_r = (cumsum(T, 0) - T)[r]
  (chosen when the distributed program itself takes a cumsum of length n of an
  all_gather's result: the gathered totals' prefix sum, indexed by the rank);
* otherwise a masked sum:  C_r = m_r . T  with m_r[j] = 1 if j < r else 0
  (a dot with a rank-dependent 0/1 mask, which the constant folding of the
  distributed program's `arange(n) < axis_index` meets per rank).

Which split (n) is used, and which carry form, is read from the distributed
program (a cumsum there along a dim of length N / n, n a product of mesh axis
sizes); that choice only routes the rewrite: every choice is the identity
above, so the rewritten sequential program computes the same value for every
input and any consumer (a backward pass included) sees the same numbers. A
sequential cumsum is left whole when the distributed program also scans a dim
of its full length (no split there), and reversed scans are left as they are.

A module XLA optimised may hold a long cumsum as its own two-level scan (blocks of
16 on CPU, whatever the ranks' blocks): dlverify/scan_fold.py folds those back into
one cumsum first, in both programs, and the blocks here are the distributed ones.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from dlverify.ir import Graph, GraphBuilder, Op
from dlverify.problem import Problem
from dlverify.scan_fold import fold_two_level_scans


def _split_sizes(mesh_shape: tuple[int, ...]) -> set[int]:
    """Products of subsets of the mesh's axis sizes, above 1: the block counts a
    dim split over mesh axes can have."""
    out: set[int] = set()
    for k in range(1, len(mesh_shape) + 1):
        for sub in itertools.combinations(mesh_shape, k):
            if math.prod(sub) > 1:
                out.add(math.prod(sub))
    return out


def _forward_scans(g: Graph) -> list[Op]:
    return [op for op in g.ops if op.kind == "cumsum" and not op.params.get("reverse")]


def _scanned_lengths(g: Graph) -> set[tuple[int, int, int]]:
    """(ndim, scanned dim, its length) of each forward cumsum of g."""
    return {(len(g.tensors[op.output].shape), int(op.params["axis"]),
             g.tensors[op.output].shape[int(op.params["axis"])]) for op in _forward_scans(g)}


def _gathered_scan_lengths(g: Graph, depth: int = 8) -> set[int]:
    """Lengths of the scanned dims of g's forward cumsums whose operand is an
    all_gather's result, read through ops that only move or convert data: the
    gathered totals' prefix sum of the exclusive carry form."""
    producer = {op.output: op for op in g.ops}
    moves = {"reshape", "transpose", "broadcast_in_dim", "convert_element_type", "copy"}
    out = set()
    for op in _forward_scans(g):
        t = op.inputs[0]
        for _ in range(depth):
            p = producer.get(t)
            if p is None or (p.kind not in moves and p.kind != "all_gather"):
                break
            if p.kind == "all_gather":
                out.add(g.tensors[op.output].shape[int(op.params["axis"])])
                break
            t = p.inputs[0]
    return out


def _gathers_rows(g: Graph, ndim: int) -> bool:
    """Whether g all-gathers, along dim 0, a value of `ndim` dims whose dim 0 has size 1:
    the rank's last row kept as a row (XLA's compiled form), not squeezed first."""
    return any(op.kind == "all_gather" and int(op.params["dimension"]) == 0
               and len(g.tensors[op.inputs[0]].shape) == ndim and g.tensors[op.inputs[0]].shape[0] == 1
               for op in g.ops)


def _blocks(op: Op, seq: Graph, dist_lengths: set[tuple[int, int, int]], sizes: set[int]) -> int | None:
    """The number of blocks n to write the sequential cumsum `op` in, or None."""
    shape = seq.tensors[op.output].shape
    a = int(op.params["axis"])
    N, nd = shape[a], len(shape)
    if (nd, a, N) in dist_lengths:   # the distributed program scans the whole dim somewhere
        return None
    counts = sorted(N // b for d, ax, b in dist_lengths
                    if (d, ax) == (nd, a) and 0 < b < N and N % b == 0 and N // b in sizes)
    return counts[0] if counts else None


class _Writer:
    """Emits the blocked form of one cumsum into `ops` (the graph's next op list)."""

    def __init__(self, g: Graph, problem: Problem, ops: list[Op]) -> None:
        self.g = g
        self.b = GraphBuilder(Graph(g.name, tensors=g.tensors, ops=ops), problem.ids)

    def op(self, kind: str, ins: list[int], shape, like: Op, params: dict | None = None,
           output: int | None = None, dtype: str | None = None) -> int:
        dtype = dtype or self.g.tensors[like.output].dtype
        return self.b.op(kind, ins, tuple(shape), dtype, params, like.loc, like.name, output)

    def slice(self, t: int, dim: int, lo: int, hi: int, like: Op) -> int:
        shape = list(self.g.tensors[t].shape)
        start = [0] * len(shape)
        limit = list(shape)
        start[dim], limit[dim] = lo, hi
        shape[dim] = hi - lo
        return self.op("slice", [t], shape, like,
                       {"start_indices": tuple(start), "limit_indices": tuple(limit), "strides": None})

    def blocked(self, scan: Op, n: int, exclusive_scan: bool, stacked: bool) -> None:
        x = scan.inputs[0]
        shape = self.g.tensors[scan.output].shape
        a = int(scan.params["axis"])
        bsz = shape[a] // n
        rest = tuple(s for i, s in enumerate(shape) if i != a)   # the dims a total keeps
        block_shape = tuple(bsz if i == a else s for i, s in enumerate(shape))
        locals_, lasts = [], []
        for r in range(n):
            local = self.op("cumsum", [self.slice(x, a, r * bsz, (r + 1) * bsz, scan)],
                            block_shape, scan, dict(scan.params))
            last = self.slice(local, a, bsz - 1, bsz, scan)
            lasts.append(last)
            locals_.append(local)
        if stacked and a == 0:   # T: the last rows themselves, concatenated ([n] + rest)
            stacked_t = self.op("concatenate", lasts, (n,) + rest, scan, {"dimension": 0})
        else:   # T: the totals concatenated flat along dim 0, then split ([n] + rest):
            # how an all_gather of the rank's squeezed total reads
            # (each total squeezed to `rest`; a scalar as [1])
            totals = [self.op("reshape", [last], rest or (1,), scan) for last in lasts]
            flat = (n * (rest or (1,))[0],) + rest[1:]
            cat = self.op("concatenate", totals, flat, scan, {"dimension": 0})
            stacked_t = self.op("reshape", [cat], (n,) + rest, scan) if rest else cat
        excl = None
        if exclusive_scan:   # cumsum(T, 0) - T: the sum of the totals before each row
            inclusive = self.op("cumsum", [stacked_t], (n,) + rest, scan, {"axis": 0, "reverse": False})
            excl = self.op("sub", [inclusive, stacked_t], (n,) + rest, scan)
        pieces = []
        for r in range(n):
            if excl is not None:
                row = self.slice(excl, 0, r, r + 1, scan)
                carry = self.op("reshape", [row], rest, scan)
            else:   # m_r . T with m_r[j] = (j < r)
                # (the 0/1 mask as a program writes it, iota(n) < r: bool, read by the
                # dot as 0 and 1 in the totals' type; the comparison meets the
                # distributed program's iota(n) < axis_index, folded per rank)
                index = self.op("iota", [], (n,), scan, {"dimension": 0}, dtype="int32")
                bound = self.b.constant(np.asarray(r, dtype=np.int32), (), "int32", scan.loc, scan.name)
                bound = self.op("broadcast_in_dim", [bound], (n,), scan, {"broadcast_dimensions": ()},
                                dtype="int32")
                mask = self.op("lt", [index, bound], (n,), scan, dtype="bool")
                carry = self.op("dot_general", [mask, stacked_t], rest, scan,
                                {"lhs_contract": (0,), "rhs_contract": (0,),
                                 "lhs_batch": (), "rhs_batch": ()})
            spread = self.op("broadcast_in_dim", [carry], block_shape, scan,
                             {"broadcast_dimensions": tuple(i for i in range(len(shape)) if i != a)})
            pieces.append(self.op("add", [locals_[r], spread], block_shape, scan))
        # into the cumsum's own tensor: every reader sees the same value
        self.op("concatenate", pieces, shape, scan, {"dimension": a}, output=scan.output)


def block_scans(problem: Problem) -> bool:
    """Rewrite, in problem.seq, each forward cumsum along a dim the distributed
    program scans in blocks into the blocked form above, after folding XLA's
    two-level scans of either program back into cumsums. True if anything changed."""
    seq, dist = problem.seq, problem.dist
    # (XLA's two-level prefix sums as one cumsum first, on both sides: dlverify/scan_fold.py)
    folded = [fold_two_level_scans(g, problem.ids) for g in (seq, dist)]
    dist_lengths = _scanned_lengths(dist)
    gathered = _gathered_scan_lengths(dist)
    sizes = _split_sizes(tuple(problem.mesh.axis_sizes))
    plan = {}
    for op in _forward_scans(seq):
        n = _blocks(op, seq, dist_lengths, sizes)
        if n is not None:
            plan[op.id] = (n, n in gathered, _gathers_rows(dist, len(seq.tensors[op.output].shape)))
    if not plan:
        return any(folded)
    ops: list[Op] = []
    w = _Writer(seq, problem, ops)
    for op in seq.ops:
        if op.id in plan:
            w.blocked(op, *plan[op.id])
        else:
            ops.append(op)
    seq.ops[:] = ops
    problem.notes.append(f"{len(plan)} sequential cumsum(s) written as blocked prefix sums "
                         "with carries (dlverify/blocked_scan.py)")
    return True
