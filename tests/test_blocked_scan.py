"""A sequential cumsum written in blocks (dlverify/blocked_scan.py), and
examples/sequence_parallel_cumsum.py.

Soundness: the rewritten sequential graph is run by the shared evaluator
(dlverify/interpret.py) on random inputs, floats and integers, for several
block counts, scanned dims and both carry forms, and must equal the cumsum it
replaced. Where the rewrite must not fire (no blocked scan in the distributed
program, a whole-length one, a reversed scan, a block count no mesh split
gives) the graph is left as it was. The example's correct cases verify with
every derived view checked on a run of both programs, and its buggy twins are
not verified and are located at their `# BUG` line.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_ring_attention import _views_hold, located_twin, verified_example

from dlverify.blocked_scan import block_scans
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.problem import Problem

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sequence_parallel_cumsum.py"


def _pair(shape, axis, dist_lengths, mesh_sizes, dtype="float32", reverse=False, gathered=None,
          rows=False):
    """A sequential graph cumsum(x, axis) and a distributed graph holding a forward
    cumsum of a same-rank tensor along `axis` for each length in `dist_lengths` (and,
    with `gathered` = n, a cumsum of length n of an all_gather's result; with `rows`,
    an all_gather of a [1] + rest row, as XLA gathers the last rows)."""
    ids = IdAllocator()
    seq, dist = Graph("sequential"), Graph("distributed")
    S, D = GraphBuilder(seq, ids), GraphBuilder(dist, ids)
    x = S.tensor(shape, dtype, "x")
    seq.inputs.append(x)
    out = S.op("cumsum", [x], shape, dtype, {"axis": axis, "reverse": reverse})
    seq.outputs.append(out)
    for b in dist_lengths:
        local = tuple(b if i == axis else s for i, s in enumerate(shape))
        t = D.tensor(local, dtype, "x")
        dist.inputs.append(t)
        dist.outputs.append(D.op("cumsum", [t], local, dtype, {"axis": axis, "reverse": False}))
    if gathered is not None:
        rest = tuple(s for i, s in enumerate(shape) if i != axis) or (1,)
        t = D.tensor(rest, dtype, "total")
        dist.inputs.append(t)
        g = D.op("all_gather", [t], (gathered * rest[0],) + rest[1:], dtype,
                 {"dimension": 0, "groups": [list(range(gathered))]})
        g = D.op("reshape", [g], (gathered,) + rest, dtype)
        dist.outputs.append(D.op("cumsum", [g], (gathered,) + rest, dtype, {"axis": 0, "reverse": False}))
    if rows:
        rest = tuple(s for i, s in enumerate(shape) if i != axis)
        t = D.tensor((1,) + rest, dtype, "row")
        dist.inputs.append(t)
        n = math.prod(mesh_sizes)
        dist.outputs.append(D.op("all_gather", [t], (n,) + rest, dtype,
                                 {"dimension": 0, "groups": [list(range(n))]}))
    names = tuple(f"a{i}" for i in range(len(mesh_sizes)))
    return Problem(seq, dist, Mesh(names, tuple(mesh_sizes)), [], [], ids), x, out


def _values(problem, x, out, data):
    return Interpreter(problem.seq).run([[data]])[out][0]


CASES = [  # shape, scanned dim, block count
    ((16, 3), 0, 4), ((16, 3), 0, 2), ((16, 3), 0, 8), ((2, 12), 1, 3), ((2, 12), 1, 4),
    ((12,), 0, 4), ((2, 8, 3), 1, 2), ((2, 8, 3), 1, 8),
]


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("shape,axis,n", CASES)
def test_blocked_form_keeps_the_cumsum(shape, axis, n, dtype, exclusive):
    problem, x, out = _pair(shape, axis, [shape[axis] // n], (n,), dtype,
                            gathered=n if exclusive else None)
    before = [op.kind for op in problem.seq.ops]
    assert block_scans(problem)
    kinds = [op.kind for op in problem.seq.ops]
    assert kinds != before
    # the carry form the distributed program uses
    assert ("dot_general" in kinds) is (not exclusive)
    assert kinds.count("cumsum") == n + (1 if exclusive else 0)
    assert problem.seq.outputs == [out]   # (the cumsum's own tensor holds the blocked value)
    rng = np.random.default_rng(sum(shape) + n)
    for _ in range(2):
        if dtype == "int32":
            data = rng.integers(-50, 50, size=shape).astype(np.int32)
            np.testing.assert_array_equal(_values(problem, x, out, data), np.cumsum(data, axis=axis))
        else:
            data = rng.standard_normal(shape).astype(np.float32)
            np.testing.assert_allclose(_values(problem, x, out, data), np.cumsum(data, axis=axis),
                                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("shape,n", [((16, 3), 4), ((16, 3), 2), ((8, 2, 3), 4), ((12,), 4)])
def test_totals_stacked_as_rows_keep_the_cumsum(shape, n, exclusive):
    # the last rows concatenated (no squeeze), when the distributed program gathers rows
    problem, x, out = _pair(shape, 0, [shape[0] // n], (n,), gathered=n if exclusive else None,
                            rows=True)
    assert block_scans(problem)
    cats = [op for op in problem.seq.ops if op.kind == "concatenate"]
    assert len(cats) == 2 and all(problem.seq.tensors[i].shape[0] == 1 for i in cats[0].inputs)
    assert "reshape" not in [op.kind for op in problem.seq.ops][:problem.seq.ops.index(cats[0])]
    data = np.random.default_rng(n).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(_values(problem, x, out, data), np.cumsum(data, 0), rtol=1e-5, atol=1e-5)


def test_block_count_from_a_two_axis_mesh():
    # a dim split over both axes of a (2, 2) mesh: 4 blocks of 4
    problem, x, out = _pair((16, 3), 0, [4], (2, 2))
    assert block_scans(problem)
    assert [op.kind for op in problem.seq.ops].count("cumsum") == 4
    data = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32)
    np.testing.assert_allclose(_values(problem, x, out, data), np.cumsum(data, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why,kwargs", [
    ("no cumsum in the distributed program", dict(dist_lengths=[], mesh_sizes=(4,))),
    ("the distributed program scans the whole dim", dict(dist_lengths=[16, 4], mesh_sizes=(4,))),
    ("a reversed scan", dict(dist_lengths=[4], mesh_sizes=(4,), reverse=True)),
    ("no mesh split gives 8 blocks", dict(dist_lengths=[2], mesh_sizes=(4,))),
    ("the blocked scan runs along another dim's length", dict(dist_lengths=[5], mesh_sizes=(4,))),
])
def test_left_whole(why, kwargs):
    problem, x, out = _pair((16, 3), 0, **kwargs)
    before = [(op.kind, list(op.inputs), op.output) for op in problem.seq.ops]
    assert not block_scans(problem), why
    assert [(op.kind, list(op.inputs), op.output) for op in problem.seq.ops] == before


# ------------------------------------------------------------------ the example

CORRECT = ["sp_position_ids", "sp_running_sum"]
TWINS = ["sp_position_ids_bug_restart", "sp_running_sum_bug_own_block"]


@pytest.mark.parametrize("name", CORRECT)
def test_sp_cumsum_cases_verify(name, example_runs):
    res = verified_example(example_runs, EXAMPLE, name)
    assert any("blocked_scan" in n for n in res.notes), res.notes


@pytest.mark.parametrize("name", TWINS)
def test_sp_cumsum_twins_are_located_at_their_bug_line(name, example_runs):
    _views_hold(located_twin(example_runs, EXAMPLE, name))
