"""Three normal-form pieces that let XLA-compiled SP prefix sums and per-example DP
noise verify (issue 10), each checked through the shared evaluator:

* a dynamic_slice of a concatenation, whole along the concatenated dim, is the
  concatenation of the pieces' dynamic_slices (dlverify/concat_slices.py), for any
  starts (clamped as HLO clamps them);
* `x - c` is `x + (-c)` for a signed integer literal c too (simplify.literal_difference),
  wrapped as XLA wraps, but not for c the type's minimum nor for unsigned types;
* an all_gather along a contracted dim counts as a concatenation of its members'
  pieces, so the other program's dot over a concatenation of pieces of those sizes
  stays fused (rewrites._fused_pieces) instead of being split into masked terms.

Then examples/sequence_parallel_cumsum.py and dropout_shard_map.py's DP noise verify
from their compiled modules, and their buggy twins do not.
"""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from conftest import bug_line
from hlo_pairs import compiled_pair, example_module, verify_texts
from test_moe_compiled import _run
from test_simplify_int import _graph  # (shape, dtype) per input; build(b, *xs) -> the output

from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.rewrites import split_contracted_concatenations
from dlverify.simplify import simplify_graph




def _scalar(b, value, dtype):
    return b.constant(np.asarray(value, dtype=dtype), (), dtype)


def _splat(b, value, shape, dtype):
    return b.op("broadcast_in_dim", [_scalar(b, value, dtype)], shape, dtype,
                {"broadcast_dimensions": ()})


# ------------------------------------------------ dynamic_slice of a concatenation
def _ds_of_cat(pieces, k, sizes, dtype="float32"):
    """dynamic_slice(concatenate(inputs; k), starts) with the starts as int32 inputs."""
    n = len(pieces[0])
    shape = list(pieces[0])
    shape[k] = sum(p[k] for p in pieces)

    def build(b, *xs):
        cat = b.op("concatenate", list(xs[:len(pieces)]), tuple(shape), dtype, {"dimension": k})
        return b.op("dynamic_slice", [cat, *xs[len(pieces):]], tuple(sizes), dtype,
                    {"slice_sizes": tuple(sizes)})
    return _graph(build, [(p, dtype) for p in pieces] + [((), "int32")] * n)


@pytest.mark.parametrize("pieces,k,sizes", [
    ([(16, 1), (16, 1)], 1, (4, 2)),              # jax.random.split's stacked words, 4 rows
    ([(8, 3), (8, 2), (8, 1)], 1, (5, 6)),        # three pieces of unequal widths
    ([(2, 6, 3), (1, 6, 3)], 0, (3, 2, 3)),        # concatenated along dim 0, sliced in dim 1
    ([(4, 2, 5), (4, 3, 5)], 1, (1, 5, 2)),
])
def test_a_dynamic_slice_of_a_concatenation_is_the_concatenation_of_the_pieces_slices(
        pieces, k, sizes):
    g, ids = _ds_of_cat(pieces, k, sizes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    cat = [op for op in g.ops if op.kind == "concatenate"]
    assert len(cat) == 1 and cat[0].output == g.outputs[0]
    assert all(g.producer()[t].kind == "dynamic_slice" for t in cat[0].inputs)
    rng = np.random.default_rng(len(pieces) + k)
    # starts in range, negative and past the end: HLO clamps each into [0, dim - size]
    for starts in [(0,) * len(sizes), (1, 1, 1)[:len(sizes)], (-3, 7, 2)[:len(sizes)],
                   (100, -100, 9)[:len(sizes)], (2, 0, 50)[:len(sizes)]]:
        ins = [rng.standard_normal(p).astype(np.float32) for p in pieces]
        ins += [np.asarray(s, dtype=np.int32) for s in starts]
        np.testing.assert_array_equal(_run(g, ins)[0], _run(before, ins)[0])


@pytest.mark.parametrize("pieces,k,sizes,why", [
    ([(16, 1), (16, 1)], 1, (4, 1), "one column of two: the slice is not whole along k"),
    ([(8, 2), (8, 2)], 0, (8, 2), "the slice cuts the concatenated dim"),
])
def test_a_dynamic_slice_that_cuts_the_concatenated_dim_stays(pieces, k, sizes, why):
    g, ids = _ds_of_cat(pieces, k, sizes)
    simplify_graph(g, ids)
    kinds = [op.kind for op in g.ops]
    assert kinds.count("dynamic_slice") == 1 and kinds.count("concatenate") == 1, why
    assert g.producer()[g.outputs[0]].kind == "dynamic_slice", why


# ---------------------------------------------------- integer literal differences
_SIGNED = ["int8", "int32", "int64"]


def _edge(dtype, rng):
    info = np.iinfo(dtype)
    edge = np.asarray([info.min, info.min + 1, -2, -1, 0, 1, 2, info.max - 1, info.max], dtype=dtype)
    return np.concatenate([edge, rng.integers(info.min, info.max, size=23, endpoint=True,
                                              dtype=dtype)])


@pytest.mark.parametrize("dtype", _SIGNED)
@pytest.mark.parametrize("which", ["one", "minus_one", "max", "min_plus_one", "random"])
def test_subtracting_an_integer_literal_is_adding_its_negation(dtype, which):
    """x - c and x + (-c) reach one form, which computes what the subtraction does for
    every x, the type's extremes included (wrapping alike)."""
    info = np.iinfo(dtype)
    c = {"one": 1, "minus_one": -1, "max": int(info.max), "min_plus_one": int(info.min) + 1,
         "random": int(np.random.default_rng(3).integers(info.min + 1, info.max))}[which]
    x = _edge(dtype, np.random.default_rng(4))
    forms = []
    for kind, lit in (("sub", c), ("add", -c)):
        g, ids = _graph(lambda b, t: b.op(kind, [t, _splat(b, lit, x.shape, dtype)], x.shape, dtype),
                        [(x.shape, dtype)])
        before = copy.deepcopy(g)
        simplify_graph(g, ids)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(_run(g, [x])[0], _run(before, [x])[0])
            np.testing.assert_array_equal(_run(g, [x])[0], (x - np.asarray(c, dtype)).astype(dtype))
        forms.append(([op.kind for op in g.ops],
                      [int(op.params["value"]) for op in g.ops if op.kind == "constant"]))
    assert forms[0] == forms[1] and "sub" not in forms[0][0]


@pytest.mark.parametrize("dtype,c,why", [
    ("int32", int(np.iinfo(np.int32).min), "-min is no int32"),
    ("int8", -128, "-min is no int8"),
    ("uint32", 1, "unsigned: -1 is no uint32"),
    ("uint8", 3, "unsigned"),
])
def test_integer_differences_without_a_negated_literal_stay(dtype, c, why):
    g, ids = _graph(lambda b, t: b.op("sub", [t, _splat(b, c, (5,), dtype)], (5,), dtype),
                    [((5,), dtype)])
    simplify_graph(g, ids)
    assert "sub" in [op.kind for op in g.ops], why


def test_a_literal_minus_an_integer_tensor_stays():
    g, ids = _graph(lambda b, t: b.op("sub", [_splat(b, 1, (5,), "int32"), t], (5,), "int32"),
                    [((5,), "int32")])
    simplify_graph(g, ids)
    assert "sub" in [op.kind for op in g.ops]


# --------------------------------------- a dot over gathered pieces stays fused
def _dot_pair(dist_gathers: bool):
    """seq: dot(m, concatenate(r_0..r_3)) over the rows (four different [1, 8] values);
    dist: dot(m, all_gather(r)) over four members, or dot(m, r4) of a [4, 8] input."""
    ids = IdAllocator()
    seq, dist = Graph("sequential"), Graph("distributed")
    S, D = GraphBuilder(seq, ids), GraphBuilder(dist, ids)
    dims = {"lhs_contract": (0,), "rhs_contract": (0,), "lhs_batch": (), "rhs_batch": ()}
    m = S.tensor((4,), "float32", "m")
    rows = [S.tensor((1, 8), "float32", f"r{i}") for i in range(4)]
    seq.inputs = [m, *rows]
    cat = S.op("concatenate", rows, (4, 8), "float32", {"dimension": 0})
    seq.outputs = [S.op("dot_general", [m, cat], (8,), "float32", dims)]
    dm = D.tensor((4,), "float32", "m")
    if dist_gathers:
        r = D.tensor((1, 8), "float32", "r")
        t = D.op("all_gather", [r], (4, 8), "float32", {"dimension": 0, "groups": [[0, 1, 2, 3]]})
    else:
        r = t = D.tensor((4, 8), "float32", "t")
    dist.inputs = [dm, r]
    dist.outputs = [D.op("dot_general", [dm, t], (8,), "float32", dims)]
    return seq, dist, ids


def test_a_dot_over_pieces_the_other_program_gathers_stays_fused():
    seq, dist, ids = _dot_pair(dist_gathers=True)
    assert split_contracted_concatenations(seq, dist, ids) == []
    assert [op.kind for op in seq.ops].count("dot_general") == 1


def test_a_dot_over_pieces_the_other_program_does_not_concatenate_is_split():
    seq, dist, ids = _dot_pair(dist_gathers=False)
    before = copy.deepcopy(seq)
    assert split_contracted_concatenations(seq, dist, ids) == [seq]
    assert "concatenate" not in [op.kind for op in seq.ops]
    rng = np.random.default_rng(5)
    ins = [rng.standard_normal(seq.tensors[t].shape).astype(np.float32) for t in seq.inputs]
    np.testing.assert_allclose(_run(seq, ins)[0], _run(before, ins)[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------ compiled examples
def _jitted(case):
    """The case with its shard_map program under jax.jit (as bench/xla_examples.py
    compiles it), when the example did not jit it."""
    import jax
    return case if hasattr(case.dist, "lower") else dataclasses.replace(case, dist=jax.jit(case.dist))


@pytest.mark.parametrize("module,correct,twin,located", [
    ("sequence_parallel_cumsum", "sp_position_ids", "sp_position_ids_bug_restart", True),
    ("sequence_parallel_cumsum", "sp_running_sum", "sp_running_sum_bug_own_block", False),
    ("dropout_shard_map", "noise_per_example_dp", "noise_per_example_dp_bug_same_keys", False),
])
def test_compiled_examples_verify_and_twins_do_not(tmp_path, module, correct, twin, located):
    """`located`: the twin's first failure holds its # BUG line. The others fail at an op
    XLA left without metadata (the masked dot) or at the first key-schedule add of the
    sampling, which reads the wrong keys (the split's own line holds no failing op)."""
    ex = example_module(module)
    res = verify_texts(tmp_path, *compiled_pair(_jitted(getattr(ex, correct)())))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    case = getattr(ex, twin)()
    res = verify_texts(tmp_path, *compiled_pair(_jitted(case)))
    assert not res.verified and res.failures
    if located:
        assert bug_line(case.dist) in {fr.line for fr in res.failures[0].frames}
