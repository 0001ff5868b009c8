"""Running both programs on random inputs: numeric witnesses for bug reports and
numeric checks of derived views (the soundness tests use these)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dlverify.interpret import Interpreter
from dlverify.partial_tags import full_size
from dlverify.problem import Problem
from dlverify.verdict import PaddedViewFact, ViewFact, scale_value


def _block(x: np.ndarray, offsets: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    return x[tuple(slice(o, o + n) for o, n in zip(offsets, shape))]


@dataclass
class Run:
    seq: dict[int, list[np.ndarray]]
    dist: dict[int, list[np.ndarray]]


def random_inputs(problem: Problem, seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Sequential inputs, and each rank's distributed inputs cut from them by the input relations."""
    rng = np.random.default_rng(seed)
    seq_in, dist_in = [], []
    for s, d, rel in zip(problem.seq.inputs, problem.dist.inputs, problem.inputs):
        t = problem.seq.tensors[s]
        dt = np.dtype(t.dtype) if t.dtype not in ("bfloat16", "token") else np.dtype(np.float32)
        if np.issubdtype(dt, np.floating):
            x = rng.standard_normal(t.shape).astype(np.float64)
        elif dt == np.bool_:
            x = rng.integers(0, 2, t.shape).astype(bool)
        else:
            x = rng.integers(0, 4, t.shape).astype(dt)
        seq_in.append(x)
        dshape = problem.dist.tensors[d].shape
        dist_in.append([_block(x, rel.offsets[r], dshape) for r in range(problem.mesh.size)])
    return seq_in, dist_in


def run_both(problem: Problem, seed: int = 0) -> Run:
    seq_in, dist_in = random_inputs(problem, seed)
    mesh = problem.mesh
    if problem.scans:  # scans summarised for induction: their bodies run per iteration
        from dlverify.induction import run_with_scans

        coords = lambda r, a: mesh.coords(r)[a]  # noqa: E731
        return Run(run_with_scans(problem.seq, [sc.seq for sc in problem.scans], 1, None,
                                  [[x] for x in seq_in]),
                   run_with_scans(problem.dist, [sc.dist for sc in problem.scans], mesh.size,
                                  coords, dist_in))
    seq_vals = Interpreter(problem.seq, 1).run([[x] for x in seq_in])
    dist_vals = Interpreter(problem.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
    return Run(seq_vals, dist_vals)


def view_error(run: Run, problem: Problem, v: ViewFact) -> float:
    """Largest |d - c * s[block]| of a complete view on its rank (wildcards: offset 0)."""
    d = np.asarray(run.dist[v.dist][v.rank], dtype=np.float64)
    s = np.asarray(run.seq[v.seq][0], dtype=np.float64)
    offs = tuple(max(o, 0) for o in v.offsets)
    want = float(scale_value(v.scale)) * _block(s, offs, d.shape)
    return value_error(d, want)


def padded_view_error(run: Run, problem: Problem, v: PaddedViewFact) -> float:
    """Largest error of a padded view on its rank: |d - s| over the part of the block
    inside s, and |d - p| over the rest when the padding is said to be p."""
    d = np.asarray(run.dist[v.dist][v.rank], dtype=np.float64)
    s = np.asarray(run.seq[v.seq][0], dtype=np.float64)
    inside = tuple(slice(0, max(0, min(n, sn - o))) for o, n, sn in zip(v.offsets, d.shape, s.shape))
    err = value_error(d[inside], _block(s, v.offsets, d.shape))
    if v.padding is not None:
        pad = np.ones(d.shape, dtype=bool)
        pad[inside] = False
        err = max(err, value_error(d[pad], np.full(int(pad.sum()), v.padding)))
    return err


def value_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want|; where both hold the same non-finite value (NaN and NaN,
    inf and inf) the entries agree, and any other NaN is an infinite error (a NaN
    must never pass a `err > tol` check for lack of an order)."""
    if not got.size:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - want)
    same = (np.isnan(got) & np.isnan(want)) | ((got == want) & ~np.isfinite(got))
    diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
    return float(np.max(diff))


def reduced_size(problem: Problem, op_id: int, axis: int) -> int:
    """The number of terms of the partial-term family (op, axis): the size of a
    reduced axis, or of a family of dlverify.partial_tags. A tag naming no family of
    the sequential graph is an error: its terms could not be checked."""
    n = full_size(problem.seq, op_id, axis)
    if n is None:
        raise ValueError(f"partial tag (op {op_id}, axis {axis}) names no family of the "
                         f"sequential graph")
    return n


def partial_sum_errors(run: Run, problem: Problem, views: list[ViewFact]) -> list[tuple[tuple, float]]:
    """For every set of ranks whose partial terms of one reduction tile its range,
    the largest |sum of their terms - c * s[block]|, relative to the sum's magnitude
    where it exceeds one (as the views are checked: the programs' float32 literals
    are read as the rationals they round, so a sum scaled by c is off by their
    rounding, relative to its size)."""
    groups: dict[tuple, dict[tuple[int, int], int]] = defaultdict(dict)
    out = []
    for v in views:
        if v.partial is None or v.partial.reducer != 0:
            continue
        key = (v.seq, v.dist, v.offsets, v.scale, v.partial.op, v.partial.axis)
        if v.partial.lo == v.partial.hi:   # no terms: the sum is zero
            out.append((key, value_error(np.asarray(run.dist[v.dist][v.rank], dtype=np.float64), 0.0)))
            continue
        groups[key].setdefault((v.partial.lo, v.partial.hi), v.rank)
    for key, ranges in groups.items():
        pos, ranks = 0, []
        while True:
            nxt = [(lo, hi) for lo, hi in ranges if lo == pos]
            if not nxt:
                break
            ranks.append(ranges[nxt[0]])
            pos = nxt[0][1]
        s_id, d_id, offsets, scale, op_id, axis = key
        if pos != reduced_size(problem, op_id, axis):
            continue
        total = sum(np.asarray(run.dist[d_id][r], dtype=np.float64) for r in ranks)
        s = np.asarray(run.seq[s_id][0], dtype=np.float64)
        want = float(scale_value(scale)) * _block(s, tuple(max(o, 0) for o in offsets), total.shape)
        if want.shape == total.shape:
            size = float(np.max(np.abs(total))) if total.size else 1.0
            out.append((key, value_error(total, want) / max(1.0, size)))
    return out
