"""`x * M(1 / y)` is `x / M(y)` for data movement M (reshapes, transposes, broadcasts:
simplify_reshapes.reciprocal_of_moved), so the normal form of a product by a reciprocal
does not depend on whether the reshape after XLA's split sank past the sigmoid before
the reciprocal met the product (gspmd_llama_tp_train in examples/gspmd_jit.py). Each
form checked on random data with the shared evaluator, where the rule must not fire,
and on a tiny sequential/distributed pair that verifies while its twin does not."""
import numpy as np
import pytest
from rulekit import Tiny, assert_views_hold
from test_simplify import _check, _graph, _splat

from dlverify.api import verify_problem
from dlverify.simplify import simplify_graph


def _reciprocal(b, y, shape, numerator=1.0):
    return b.op("div", [_splat(b, numerator, shape), y], shape, "float32")


def test_a_product_by_a_reshaped_reciprocal_is_a_division():
    def build(b, x, y):
        inv = b.op("reshape", [_reciprocal(b, y, (2, 3, 1, 4))], (2, 3, 4), "float32")
        return b.op("mul", [x, inv], (2, 3, 4), "float32")
    g = _check(build, [(2, 3, 4), (2, 3, 1, 4)], {"mul"}, positive=True)
    (div,) = [op for op in g.ops if op.kind == "div"]
    assert div.inputs[0] == g.inputs[0]


def test_a_reciprocal_under_a_chain_of_moves_is_divided_by_the_moved_operand():
    # reshape, then broadcast, then transpose of 1/y; the reciprocal on the right of the
    # product too
    def build(b, x, y):
        r = b.op("reshape", [_reciprocal(b, y, (3, 1, 4))], (3, 4), "float32")
        w = b.op("broadcast_in_dim", [r], (3, 4, 5), "float32", {"broadcast_dimensions": (0, 1)})
        t = b.op("transpose", [w], (5, 3, 4), "float32", {"permutation": (2, 0, 1)})
        return b.op("mul", [t, x], (5, 3, 4), "float32")
    g = _check(build, [(5, 3, 4), (3, 1, 4)], {"mul"}, positive=True)
    (div,) = [op for op in g.ops if op.kind == "div"]
    assert div.inputs[0] == g.inputs[0]


@pytest.mark.parametrize("numerator", [2.0, -1.0])
def test_a_moved_quotient_of_another_numerator_stays_a_product(numerator):
    def build(b, x, y):
        q = b.op("reshape", [_reciprocal(b, y, (2, 1, 4), numerator)], (2, 4), "float32")
        return b.op("mul", [x, q], (2, 4), "float32")
    g, ids = _graph(build, [(2, 4), (2, 1, 4)])
    simplify_graph(g, ids)
    assert "mul" in [op.kind for op in g.ops]


def _kinds(g):
    return [(op.kind, g.tensors[op.output].shape) for op in g.ops]


def test_both_orders_of_sinking_and_reciprocal_reach_one_form():
    shape, unit = (2, 3, 4), (2, 3, 1, 4)

    def program(b, x, y):          # x * sigmoid(squeeze(y)), the squeeze first
        s = b.op("reshape", [y], shape, "float32")
        e = b.op("exp", [b.op("neg", [s], shape, "float32")], shape, "float32")
        a = b.op("add", [e, _splat(b, 1.0, shape)], shape, "float32")
        return b.op("mul", [x, _reciprocal(b, a, shape)], shape, "float32")

    def quotient(b, x, y):         # x / squeeze(1 + exp(-y)): the reciprocal met first
        e = b.op("exp", [b.op("neg", [y], unit, "float32")], unit, "float32")
        a = b.op("add", [e, _splat(b, 1.0, unit)], unit, "float32")
        return b.op("div", [x, b.op("reshape", [a], shape, "float32")], shape, "float32")
    written = _check(program, [shape, unit], {"mul"}, positive=True)
    divided, ids = _graph(quotient, [shape, unit])
    simplify_graph(divided, ids)
    assert _kinds(written) == _kinds(divided)


def _split_sigmoid_pair(bug: bool) -> Tiny:
    """The program multiplies by sigmoid(squeeze(y)) written as 1/(1+exp(-y')) after the
    squeeze; the rank divides by the squeezed 1+exp(-y) (XLA's fusion split). The twin
    forgets the negation (sigmoid(-y))."""
    t = Tiny()
    shape, unit = (4, 3, 5), (4, 3, 1, 5)
    xs, xd = t.input(shape, ("x", None, None))
    ys, yd = t.input(unit, ("x", None, None, None))
    local = (2, 3, 5)
    sq = t.sop("reshape", [ys], shape)
    e = t.sop("exp", [t.sop("neg", [sq], shape)], shape)
    a = t.sop("add", [e, t.sop("broadcast_in_dim", [t.sconst(1.0)], shape, broadcast_dimensions=())],
              shape)
    one = t.sop("broadcast_in_dim", [t.sconst(1.0)], shape, broadcast_dimensions=())
    out_s = t.sop("mul", [xs, t.sop("div", [one, a], shape)], shape)
    lunit = (2, 3, 1, 5)
    arg = yd if bug else t.dop("neg", [yd], lunit)
    ed = t.dop("exp", [arg], lunit)
    ad = t.dop("add", [ed, t.dop("broadcast_in_dim", [t.dconst(1.0)], lunit, broadcast_dimensions=())],
               lunit)
    out_d = t.dop("div", [xd, t.dop("reshape", [ad], local)], local)
    t.output(out_s, out_d, ("x", None, None))
    return t


def test_a_split_sigmoid_divided_on_the_rank_verifies():
    p = _split_sigmoid_pair(bug=False).problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert res.verified, [f.message for f in res.failures]
    assert_views_hold(p, res.views)


def test_a_split_sigmoid_without_its_negation_does_not_verify_and_is_located():
    p = _split_sigmoid_pair(bug=True).problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert not res.verified
    assert (res.failures[0].program, res.failures[0].op) == ("distributed", "exp")
    assert_views_hold(p, res.views)
