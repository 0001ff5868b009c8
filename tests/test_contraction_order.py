"""A dot's contracted pairs listed in one order (dlverify/contraction_order.py), and
reshapes tidied after the passes that follow the normal form (dlverify/reshape_tidy.py):
each checked on random data with the shared evaluator, where it must not fire, and on
the compiled parallel-residual block with one head per rank (examples/parallel_residual.py,
TP=4), whose buggy twins at TP=4 stay not verified and located."""
import copy

import numpy as np
from hlo_pairs import assert_compiled_case_and_twin, example_module
from test_simplify import _check, _graph, _run, _splat

import dlverify
from dlverify.reshape_tidy import tidy_reshapes
from dlverify.simplify import simplify_graph


def _dot(b, lhs, rhs, shape, lc, rc):
    return b.op("dot_general", [lhs, rhs], shape, "float32",
                {"lhs_contract": lc, "rhs_contract": rc, "lhs_batch": (), "rhs_batch": ()})


def _projection(order):
    """[b, h, q, e] attention output transposed to [b, q, h, e] and contracted with a
    [h, e, d] weight over (h, e), the pairs listed in `order` ("he" or "eh")."""
    def build(b, y, w):
        x = b.op("transpose", [y], (2, 5, 3, 4), "float32", {"permutation": (0, 2, 1, 3)})
        lc, rc = ((2, 3), (0, 1)) if order == "he" else ((3, 2), (1, 0))
        return _dot(b, x, w, (2, 5, 6), lc, rc)
    return build


def _form(g):
    return [(op.kind, g.tensors[op.output].shape,
             sorted((k, v) for k, v in op.params.items() if k != "value")) for op in g.ops]


def test_a_contraction_listed_in_either_order_reaches_one_form():
    shapes = [(2, 3, 5, 4), (3, 4, 6)]
    forms = [_form(_check(_projection(order), shapes, set()) if order == "eh"
                   else _simplified(_projection(order), shapes)) for order in ("eh", "he")]
    assert forms[0] == forms[1]
    (dot,) = [op for op in _simplified(_projection("eh"), shapes).ops if op.kind == "dot_general"]
    assert dot.params["lhs_contract"] == (2, 3)


def _simplified(build, shapes):
    g, ids = _graph(build, shapes)
    simplify_graph(g, ids)
    return g


def test_pairs_listed_in_the_lhs_sources_order_are_left():
    # contracted dims (h, e) of [b, q, h, e] in the order the operand holds them
    def build(b, x, w):
        return _dot(b, x, w, (2, 5, 6), (2, 3), (0, 1))
    g, ids = _graph(build, [(2, 5, 3, 4), (3, 4, 6)])
    before = copy.deepcopy(g)
    assert not simplify_graph(g, ids)
    assert _form(g) == _form(before)


def test_a_contraction_pairing_other_dims_is_another_form():
    # the twin: e against the weight's h (both of size 4): another function, another form
    shapes = [(2, 4, 5, 4), (4, 4, 6)]

    def swapped(b, y, w):
        x = b.op("transpose", [y], (2, 5, 4, 4), "float32", {"permutation": (0, 2, 1, 3)})
        return _dot(b, x, w, (2, 5, 6), (3, 2), (0, 1))

    def right(b, y, w):
        x = b.op("transpose", [y], (2, 5, 4, 4), "float32", {"permutation": (0, 2, 1, 3)})
        return _dot(b, x, w, (2, 5, 6), (3, 2), (1, 0))
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    a, b = _simplified(swapped, shapes), _simplified(right, shapes)
    assert _form(a) != _form(b)
    assert not np.allclose(_run(a, ins)[0], _run(b, ins)[0])


def test_reshapes_left_after_the_normal_form_collapse_and_sink():
    # reshape(reshape(x)) back to x's shape under a dot's reader, and a division by a
    # splat of a reshape that another reshape undoes: both read x directly after
    def build(b, x):
        there = b.op("reshape", [x], (2, 1, 8, 1, 8), "float32")
        back = b.op("reshape", [there], (2, 1, 8, 8), "float32")
        scaled = b.op("div", [there, _splat(b, 2.0, (2, 1, 8, 1, 8))], (2, 1, 8, 1, 8), "float32")
        flat = b.op("reshape", [scaled], (2, 1, 8, 8), "float32")
        return b.op("add", [back, flat], (2, 1, 8, 8), "float32")
    g, ids = _graph(build, [(2, 1, 8, 8)])
    before = copy.deepcopy(g)
    assert tidy_reshapes(g, ids)
    assert not [op for op in g.ops if op.kind == "reshape"], _form(g)
    rng = np.random.default_rng(0)
    for _ in range(3):
        ins = [rng.standard_normal((2, 1, 8, 8)).astype(np.float32)]
        np.testing.assert_allclose(_run(before, ins)[0], _run(g, ins)[0], rtol=1e-6)


def test_tidying_leaves_transposes_and_dots_as_they_are():
    # a transpose moving only size-1 dims a reshape inserted: the normal form writes it
    # as one reshape; the passes after it chose the pair, and tidying keeps it
    def build(b, x, w):
        r = b.op("reshape", [x], (2, 8, 1, 4), "float32")
        t = b.op("transpose", [r], (2, 1, 8, 4), "float32", {"permutation": (0, 2, 1, 3)})
        return _dot(b, t, w, (2, 1, 8, 6), (3,), (0,))
    g, ids = _graph(build, [(2, 8, 4), (4, 6)])
    before = _form(g)
    assert not tidy_reshapes(g, ids)
    assert _form(g) == before


def test_compiled_parallel_residual_with_one_head_per_rank_verifies_and_twins_are_located(tmp_path):
    """TP=4 of 4 heads: XLA deletes the rank's head dim; its output projection
    contracts (h, e) where jax's einsum lists (e, h), and the scores come back through
    a reshape the passes after the normal form wrote. The twins at TP=4 (the bias inside
    the psum, the MLP partial never reduced, the residual summed over ranks) are located
    at their BUG lines."""
    pr = example_module("parallel_residual")
    for bug in (pr.block_local_bias_in_psum, pr.block_local_mlp_unreduced,
                pr.block_local_residual_in_psum):
        twin = dlverify.Case(seq=pr.block_seq, dist=pr._dist(bug, 4, check_vma=False),
                             args=pr._args(), expect="bug")
        assert_compiled_case_and_twin(tmp_path, pr.parallel_residual_tp4(), twin)
