"""XLA's two-level prefix sum folded back into one cumsum (dlverify/scan_fold.py).

Soundness: XLA's form (built here as dlverify/window_lowering.py lowers its
reduce-window: a pad by n zeros in front, slices at the window offsets, an add tree)
is rewritten and run by the shared evaluator on random floats and integers, and
must equal the cumsum, for several block counts, block lengths, scanned dims, add
trees and a transposed operand. Forms that are not the exclusive prefix sum (an
offset missing, a nonzero pad, the inclusive window, the wrong row as totals) are
left as they are. Then the SP examples verify with their sequential module
optimised by XLA too.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.scan_fold import fold_two_level_scans


def _slice(B, t, shape, dim, lo, hi, dtype):
    start, limit = [0] * len(shape), list(shape)
    start[dim], limit[dim] = lo, hi
    out = list(shape)
    out[dim] = hi - lo
    return B.op("slice", [t], tuple(out), dtype,
                {"start_indices": tuple(start), "limit_indices": tuple(limit), "strides": None})


def _two_level(shape, d, n, dtype="float32", transposed=False, chain=False, offsets=None,
               pad_value=0, pad_front=None, first_row=0, total_row=None):
    """cumsum(x, d) as XLA's CPU pipeline writes it (the defaults), or a near miss."""
    ids = IdAllocator()
    g = Graph("g")
    B = GraphBuilder(g, ids)
    x0 = B.tensor(shape, dtype, "x")
    g.inputs = [x0]
    x, xs = x0, tuple(shape)
    perm = None
    if transposed:   # XLA scans the minor dim: the scanned dim d moved last
        perm = tuple(j for j in range(len(shape)) if j != d) + (d,)
        xs = tuple(shape[j] for j in perm)
        x = B.op("transpose", [x0], xs, dtype, {"permutation": perm})
        d = len(shape) - 1
    N = xs[d]
    b = N // n
    rs = xs[:d] + (n, b) + xs[d + 1:]
    a = d + 1
    inner = B.op("cumsum", [B.op("reshape", [x], rs, dtype)], rs, dtype, {"axis": a, "reverse": False})
    es = rs[:a] + rs[a + 1:]
    last = _slice(B, inner, rs, a, (total_row if total_row is not None else b - 1),
                  (total_row if total_row is not None else b - 1) + 1, dtype)
    totals = B.op("reshape", [last], es, dtype)
    front = n if pad_front is None else pad_front
    ps = list(es)
    ps[d] = n + front
    zero = B.constant(np.asarray(pad_value, dtype=dtype), (), dtype)
    padded = B.op("pad", [totals, zero], tuple(ps), dtype,
                  {"padding_config": tuple((front, 0, 0) if j == d else (0, 0, 0) for j in range(len(es)))})
    ws = list(es)
    ws[d] = ps[d] - n + 1
    leaves = [_slice(B, padded, tuple(ps), d, k, k + ws[d], dtype)
              for k in (range(n) if offsets is None else offsets)]
    while len(leaves) > 1:   # balanced, as window_lowering.balanced adds, or a chain
        if chain:
            leaves = [B.op("add", leaves[:2], tuple(ws), dtype)] + leaves[2:]
        else:
            pairs = [B.op("add", leaves[i:i + 2], tuple(ws), dtype) for i in range(0, len(leaves) - 1, 2)]
            leaves = pairs + (leaves[-1:] if len(leaves) % 2 else [])
    carry = _slice(B, leaves[0], tuple(ws), d, first_row, first_row + n, dtype)
    spread = B.op("broadcast_in_dim", [carry], rs, dtype,
                  {"broadcast_dimensions": tuple(j for j in range(len(rs)) if j != a)})
    out = B.op("reshape", [B.op("add", [inner, spread], rs, dtype)], xs, dtype)
    if perm is not None:
        out = B.op("transpose", [out], tuple(shape), dtype, {"permutation": tuple(np.argsort(perm))})
    g.outputs = [out]
    return g, ids


def _run(g, data):
    return Interpreter(g, 1).run([[data]])[g.outputs[0]][0]


CASES = [  # shape, scanned dim, block count
    ((2, 32), 1, 2), ((32,), 0, 4), ((32, 8), 0, 2), ((3, 48, 2), 1, 3), ((2, 40), 1, 5),
    ((64,), 0, 8), ((2, 30), 1, 6),
]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shape,d,n", CASES)
def test_two_level_scan_is_the_cumsum(shape, d, n, transposed, chain, dtype):
    g, ids = _two_level(shape, d, n, dtype, transposed=transposed, chain=chain)
    before = copy.deepcopy(g)
    assert fold_two_level_scans(g, ids)
    kinds = [op.kind for op in g.ops]
    assert kinds.count("cumsum") == 1 and "pad" not in kinds and "add" not in kinds
    assert [op for op in g.ops if op.kind == "cumsum"][0].params["axis"] == d
    rng = np.random.default_rng(sum(shape) + n)
    for _ in range(2):
        if dtype == "int32":
            data = rng.integers(-50, 50, size=shape).astype(np.int32)
            np.testing.assert_array_equal(_run(g, data), np.cumsum(data, axis=d))
            np.testing.assert_array_equal(_run(before, data), np.cumsum(data, axis=d))
        else:
            data = rng.standard_normal(shape).astype(np.float32)
            np.testing.assert_allclose(_run(g, data), np.cumsum(data, axis=d), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(_run(before, data), _run(g, data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why,kwargs", [
    ("an offset missing", dict(offsets=[0, 1, 2])),
    ("an offset twice", dict(offsets=[0, 1, 1, 3])),
    ("a nonzero pad value", dict(pad_value=1)),
    ("the inclusive window (pad n - 1)", dict(pad_front=3)),
    ("the window sums' rows 1 .. n", dict(first_row=1)),
    ("totals from another row", dict(total_row=2)),
])
def test_near_misses_stay(why, kwargs):
    g, ids = _two_level((2, 32), 1, 4, **kwargs)
    before = [(op.kind, list(op.inputs), op.output) for op in g.ops]
    assert not fold_two_level_scans(g, ids), why
    assert [(op.kind, list(op.inputs), op.output) for op in g.ops] == before
    data = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    assert not np.allclose(_run(g, data), np.cumsum(data, 1), rtol=1e-5, atol=1e-5), why


@pytest.mark.parametrize("case", ["sp_position_ids", "sp_running_sum"])
def test_sp_examples_verify_with_the_sequential_module_optimised(tmp_path, case):
    import jax
    from hlo_pairs import example_module, verify_texts

    ex = example_module("sequence_parallel_cumsum")
    c = getattr(ex, case)()
    seq = jax.jit(c.seq).lower(*c.args).compile().as_text()
    dist = c.dist.lower(*c.args).compile().as_text()
    assert "reduce-window" in seq
    res = verify_texts(tmp_path, seq, dist)
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
