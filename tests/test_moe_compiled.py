"""The mixture-of-experts examples as XLA compiles them (bench/xla_examples.py):
the forms XLA's optimisations give their routing (dlverify/simplify_compiled.py)
leave every output unchanged on random data, evaluated by the shared evaluator,
and fire only where they apply; a prefix sum of a converted mask holds counts
(frontends/hlo/ops/reduction.py), as does a scatter-add of converted masks
(scatter.py); the compiled top-1 and top-2 MoE layers verify
from their HLO and their buggy twins are located at their `# BUG` line."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.simplify import simplify_graph


def _graph(build, in_shapes, dtype="float32"):
    ids = IdAllocator()
    g = Graph("g")
    b = GraphBuilder(g, ids)
    xs = [b.tensor(s, dtype, f"in{i}") for i, s in enumerate(in_shapes)]
    g.inputs = list(xs)
    g.outputs = [build(b, *xs)]
    return g, ids


def _run(g, ins):
    vals = Interpreter(g, 1).run([[x] for x in ins])
    return [vals[t][0] for t in g.outputs]


def _inputs(rng, in_shapes, dtype, ties):
    """Random inputs; with `ties`, small integers (many equal values, no -0)."""
    if ties or dtype != "float32":
        return [rng.integers(-2, 3, s).astype(dtype) for s in in_shapes]
    return [rng.standard_normal(s).astype(np.float32) for s in in_shapes]


def _check(build, in_shapes, gone, dtype="float32", ties=False):
    """Simplify; the outputs agree with the original on random inputs and no op of
    a kind in `gone` is left."""
    g, ids = _graph(build, in_shapes, dtype)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    assert not [op.kind for op in g.ops if op.kind in gone], [op.kind for op in g.ops]
    rng = np.random.default_rng(0)
    for _ in range(4):
        ins = _inputs(rng, in_shapes, dtype, ties)
        for a, b in zip(_run(before, ins), _run(g, ins)):
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    return g


def _dot(b, lhs, rhs, shape, lc, rc, lb=(), rb=(), dtype="float32"):
    return b.op("dot_general", [lhs, rhs], shape, dtype,
                {"lhs_contract": lc, "rhs_contract": rc, "lhs_batch": lb, "rhs_batch": rb})


# ------------------------------------------------ a dot without contraction
@pytest.mark.parametrize("lhs, rhs, out, lb, rb", [
    ((3, 4, 5), (3, 4), (3, 4, 5), (0, 1), (0, 1)),      # tec,te->tec: the MoE combine weights
    ((3, 4), (3, 4, 5), (3, 4, 5), (0, 1), (0, 1)),      # the gates first
    ((3,), (4,), (3, 4), (), ()),                        # an outer product
    ((2, 3), (2, 4), (2, 3, 4), (0,), (0,)),             # batched, free dims on both sides
    ((3, 2), (4, 2), (2, 3, 4), (1,), (1,)),             # batch dims last: put first by dot_layout
    ((3, 4), (3, 4), (3, 4), (0, 1), (0, 1)),            # all batch: an elementwise product
])
def test_a_dot_without_contraction_is_a_product_of_broadcasts(lhs, rhs, out, lb, rb):
    g = _check(lambda b, x, y: _dot(b, x, y, out, (), (), lb, rb), [lhs, rhs], {"dot_general"})
    (mul,) = [op for op in g.ops if op.kind == "mul"]
    assert mul.output == g.outputs[0]


def test_a_dot_and_the_product_xla_writes_for_it_meet():
    # seq: dot(mask, gate) batching (t, e); XLA: mask * broadcast(gate)
    def xla(b, m, w):
        bw = b.op("broadcast_in_dim", [w], (3, 4, 5), "float32", {"broadcast_dimensions": (0, 1)})
        return b.op("mul", [m, bw], (3, 4, 5), "float32")
    g1, ids1 = _graph(lambda b, m, w: _dot(b, m, w, (3, 4, 5), (), (), (0, 1), (0, 1)),
                      [(3, 4, 5), (3, 4)])
    g2, ids2 = _graph(xla, [(3, 4, 5), (3, 4)])
    simplify_graph(g1, ids1)
    assert not simplify_graph(g2, ids2)            # XLA's form is the normal form
    assert [(op.kind, op.params) for op in g1.ops] == [(op.kind, op.params) for op in g2.ops]


def test_a_dot_with_a_contraction_stays_a_dot():
    g, ids = _graph(lambda b, x, y: _dot(b, x, y, (3, 5), (1,), (0,)), [(3, 4), (4, 5)])
    simplify_graph(g, ids)
    assert [op.kind for op in g.ops] == ["dot_general"]


# ------------------------------------------------ a product of two masks
def _masks(b, x, y):
    p = b.op("gt", [x, y], (3, 4), "bool")
    q = b.op("lt", [y, x], (3, 4), "bool")
    eq = b.op("eq", [x, y], (3, 4), "bool")
    return p, b.op("or", [q, eq], (3, 4), "bool")


def test_a_product_of_two_masks_is_a_select_on_the_right_one():
    def build(b, x, y):
        p, q = _masks(b, x, y)
        return b.op("mul", [p, q], (3, 4), "float32")
    g = _check(build, [(3, 4), (3, 4)], {"mul"}, ties=True)
    (sel,) = [op for op in g.ops if op.kind == "select_n"]
    prod = {op.output: op for op in g.ops}
    assert prod[sel.inputs[0]].kind == "or" and prod[sel.inputs[2]].kind == "gt"


def test_a_product_of_masks_meets_the_select_xla_writes_for_it():
    def seq(b, x, y):
        p, q = _masks(b, x, y)
        return b.op("mul", [p, q], (3, 4), "float32")

    def xla(b, x, y):
        p, q = _masks(b, x, y)
        zero = b.constant(np.float32(0), (), "float32")
        zeros = b.op("broadcast_in_dim", [zero], (3, 4), "float32", {"broadcast_dimensions": ()})
        return b.op("select_n", [q, zeros, p], (3, 4), "float32")
    (g1, ids1), (g2, ids2) = _graph(seq, [(3, 4)] * 2), _graph(xla, [(3, 4)] * 2)
    simplify_graph(g1, ids1)
    simplify_graph(g2, ids2)
    assert [op.kind for op in g1.ops] == [op.kind for op in g2.ops]


def test_an_integer_product_of_masks_stays():
    def build(b, x, y):
        p, q = _masks(b, x, y)
        return b.op("mul", [p, q], (3, 4), "int32")
    g, ids = _graph(build, [(3, 4), (3, 4)])
    assert not simplify_graph(g, ids)


# ------------------------------------------------ a descending sort of a whole dim
def _iota(b, shape, d):
    line = b.op("iota", [], (shape[d],), "int32", {"dimension": 0})
    return b.op("broadcast_in_dim", [line], shape, "int32", {"broadcast_dimensions": (d,)})


def _descending(b, x, shape, d, output, dtype, flip=None, key_of=None, iota_dim=None,
                with_iota=True):
    key = b.op(flip or ("neg" if dtype == "float32" else "not"), [key_of or x], shape, dtype)
    ins = [key, x] + ([_iota(b, shape, d if iota_dim is None else iota_dim)] if with_iota else [])
    out_dtype = "int32" if output == 2 else dtype
    return b.op("sort", ins, shape, out_dtype, {"dimension": d, "num_keys": 1, "output": output})


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("d", [0, 1])
@pytest.mark.parametrize("output", [0, 1, 2])
def test_a_descending_sort_of_a_whole_dim_is_a_top_k(output, d, dtype):
    shape = (5, 6)
    g = _check(lambda b, x: _descending(b, x, shape, d, output, dtype), [shape], {"sort"},
               dtype=dtype, ties=True)
    (top,) = [op for op in g.ops if op.kind == "top_k"]
    assert top.params == {"axis": d, "k": shape[d], "output": int(output == 2)}


def test_a_descending_sort_without_indices_is_a_top_k():
    g = _check(lambda b, x: _descending(b, x, (4, 6), 1, 1, "float32", with_iota=False),
               [(4, 6)], {"sort"}, ties=True)
    assert [op.kind for op in g.ops] == ["top_k"]


@pytest.mark.parametrize("case", ["key_of_another_value", "iota_along_another_dim",
                                  "increasing_key", "two_keys"])
def test_other_sorts_stay(case):
    def build(b, x, y):
        if case == "key_of_another_value":
            return _descending(b, x, (4, 6), 1, 1, "float32", key_of=y)
        if case == "iota_along_another_dim":
            return _descending(b, x, (4, 6), 1, 2, "float32", iota_dim=0)
        if case == "increasing_key":
            return _descending(b, x, (4, 6), 1, 1, "float32", flip="exp")
        key = b.op("neg", [x], (4, 6), "float32")
        return b.op("sort", [key, x, y], (4, 6), "float32",
                    {"dimension": 1, "num_keys": 2, "output": 1})
    g, ids = _graph(build, [(4, 6), (4, 6)])
    simplify_graph(g, ids)
    assert "sort" in [op.kind for op in g.ops] and "top_k" not in [op.kind for op in g.ops]


# ------------------------------------------------ a prefix sum of a mask
@pytest.mark.parametrize("stage", ["pre", "post"])
def test_a_prefix_sum_of_a_converted_mask_holds_counts(stage):
    def fn(x):
        return jnp.cumsum((x > 0).astype(jnp.float32), axis=0)
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    low = jax.jit(fn).lower(x)
    text = low.as_text(dialect="hlo") if stage == "pre" else low.compile().as_text()
    g, _ = hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")
    (scan,) = [op for op in g.ops if op.kind == "cumsum"]
    assert g.tensors[scan.output].dtype == "float32"
    np.testing.assert_array_equal(_run(g, [x])[0], np.asarray(fn(x)))


@pytest.mark.parametrize("stage", ["pre", "post"])
def test_a_scatter_add_of_converted_masks_holds_counts(stage):
    def fn(x, y, idx):
        return (x > 0).astype(jnp.float32).at[idx].add((y > 0).astype(jnp.float32))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([0, 2, 2, 5, 0], np.int32)
    low = jax.jit(fn).lower(x, y, idx)
    text = low.as_text(dialect="hlo") if stage == "pre" else low.compile().as_text()
    g, _ = hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")
    assert g.tensors[g.outputs[0]].dtype == "float32"
    np.testing.assert_array_equal(_run(g, [x, y, idx])[0], np.asarray(jax.jit(fn)(x, y, idx)))


# ------------------------------------------------ the compiled examples
@pytest.mark.parametrize("correct, twin", [
    ("moe_top1_capacity", "moe_bug_missing_psum"),
    ("moe_top2_capacity", "moe_bug_top2_among_local_experts"),
])
def test_compiled_moe_layers_verify_and_twins_are_located(tmp_path, correct, twin):
    m = example_module("moe_expert_parallel")
    assert_compiled_case_and_twin(tmp_path, getattr(m, correct)(), getattr(m, twin)(),
                                  dumped=True)


# ------------------------------------------------ rsqrt as the reciprocal of a square root

def _normalised(b, x, v, rsqrt: bool):
    """x / sqrt(v * v + 1) as a program writes it, or x * rsqrt(v * v + 1) as XLA does."""
    s = b.op("add", [b.op("mul", [v, v], (3, 4), "float32"),
                     b.constant(np.ones((3, 4), np.float32), (3, 4), "float32")], (3, 4), "float32")
    if rsqrt:
        return b.op("mul", [x, b.op("rsqrt", [s], (3, 4), "float32")], (3, 4), "float32")
    return b.op("div", [x, b.op("sqrt", [s], (3, 4), "float32")], (3, 4), "float32")


def test_a_product_with_rsqrt_is_the_division_by_the_square_root():
    g = _check(lambda b, x, v: _normalised(b, x, v, rsqrt=True), [(3, 4), (3, 4)], {"rsqrt"})
    assert [op.kind for op in g.ops if op.output == g.outputs[0]] == ["div"]


def _tril_select(b, x, y, flip: bool):
    """select(x >= y, true, false) (or the flipped constants) of two float inputs."""
    p = b.op("ge", [x, y], (3, 4), "bool")
    t = b.constant(np.ones((3, 4), bool), (3, 4), "bool")
    f = b.constant(np.zeros((3, 4), bool), (3, 4), "bool")
    return b.op("select_n", [p, t, f] if flip else [p, f, t], (3, 4), "bool")


@pytest.mark.parametrize("flip", [False, True])
def test_a_select_of_the_boolean_constants_is_its_predicate(flip):
    g = _check(lambda b, x, y: _tril_select(b, x, y, flip), [(3, 4), (3, 4)], {"select_n"})
    assert [op.kind for op in g.ops if op.output == g.outputs[0]] == (["not"] if flip else ["ge"])
