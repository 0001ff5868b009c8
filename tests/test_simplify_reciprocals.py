"""dlverify/simplify_reciprocals.py: a product with a reciprocal that a literal scales
is the division, scaled. Each form leaves the graph's outputs unchanged on random
data (the shared evaluator, dlverify/interpret.py, runs the graph before and after)
and does fire; the forms it must not touch stay; and the program's form of the
backward of `o / l` meets the form XLA writes for it through the whole pipeline,
every view derived checked numerically (tests/rulekit.py); compiled by XLA, the
ring-attention gradients verify and the ring backward's buggy twin is located."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module
from rulekit import Tiny, assert_views_hold
from test_simplify import _check, _graph, _run, _splat

from dlverify.api import verify_problem
from dlverify.simplify import simplify_graph

F = "float32"


def _recip(b, y, shape):
    return b.op("div", [_splat(b, 1.0, shape), y], shape, F)


def _bcast(b, t, shape):
    return b.op("broadcast_in_dim", [t], shape, F, {"broadcast_dimensions": (0,)})


# the scaled reciprocal of y (shape (4,)) for each form; c = 8.0 or 0.3
FORMS = {
    "reciprocal / c": lambda b, y, c: b.op("div", [_recip(b, y, (4,)), _splat(b, c, (4,))], (4,), F),
    "reciprocal * c": lambda b, y, c: b.op("mul", [_recip(b, y, (4,)), _splat(b, c, (4,))], (4,), F),
    "c * reciprocal": lambda b, y, c: b.op("mul", [_splat(b, c, (4,)), _recip(b, y, (4,))], (4,), F),
    "c / y": lambda b, y, c: b.op("div", [_splat(b, c, (4,)), y], (4,), F),
}


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("c", [8.0, 0.3, -3.0])
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("pos", [0, 1])
def test_a_product_with_a_scaled_reciprocal_is_a_scaled_division(form, c, broadcast, pos):
    shape = (4, 6) if broadcast else (4,)

    def build(b, x, y):
        r = FORMS[form](b, y, c)
        if broadcast:
            r = _bcast(b, r, shape)
        return b.op("mul", [x, r] if pos == 0 else [r, x], shape, F)
    # y away from 0 (the identities hold wherever the program's value is finite)
    g = _check(build, [shape, (4,)], set(), positive=True)
    # no reciprocal is left: x is divided by y (broadcast as the reciprocal was) ...
    (div,) = [op for op in g.ops if op.kind == "div" and op.inputs[0] == g.inputs[0]]
    prod = {op.output: op for op in g.ops}
    y = prod[div.inputs[1]].inputs[0] if broadcast else div.inputs[1]
    assert y == g.inputs[1]
    assert not [op for op in g.ops if op.kind == "div" and op.inputs[1] == g.inputs[1]
                and op is not div]
    # ... and the literal scales the quotient: the output's op reads it
    last = prod[g.outputs[0]]
    assert div.output in last.inputs and last.kind in ("mul", "div")


def test_the_backward_of_a_normalisation_as_xla_writes_it_reaches_the_reciprocals_division():
    # g * broadcast((1 / (l * l)) / 8), XLA's fused form of (g / 8) * (1 / (l * l))
    def build(b, g, l):
        ll = b.op("mul", [l, l], (4,), F)
        scaled = b.op("div", [_recip(b, ll, (4,)), _splat(b, 8.0, (4,))], (4,), F)
        return b.op("mul", [g, _bcast(b, scaled, (4, 6))], (4, 6), F)
    g = _check(build, [(4, 6), (4,)], set(), positive=True)
    kinds = [op.kind for op in g.ops]
    assert kinds.count("div") == 2 and kinds.count("mul") == 1   # l * l, then two divisions


@pytest.mark.parametrize("case", ["numerator not a literal", "zero literal", "infinite literal",
                                  "literal times literal", "sum with the reciprocal",
                                  "not a reciprocal"])
def test_other_products_stay(case):
    def build(b, x, y):
        if case == "numerator not a literal":
            ex = b.op("exp", [x], (4,), F)
            q = b.op("div", [b.op("div", [ex, y], (4,), F), _splat(b, 3.0, (4,))], (4,), F)
        elif case == "zero literal":
            q = b.op("mul", [_recip(b, y, (4,)), _splat(b, 0.0, (4,))], (4,), F)
        elif case == "infinite literal":
            q = b.op("div", [_splat(b, np.inf, (4,)), y], (4,), F)
        elif case == "literal times literal":
            return b.op("mul", [_splat(b, 2.0, (4,)), FORMS["c / y"](b, y, 3.0)], (4,), F)
        elif case == "sum with the reciprocal":
            q = b.op("add", [_recip(b, y, (4,)), _splat(b, 3.0, (4,))], (4,), F)
        else:
            q = b.op("mul", [b.op("exp", [y], (4,), F), _splat(b, 3.0, (4,))], (4,), F)
        return b.op("mul", [x, q], (4,), F)
    g, ids = _graph(build, [(4,), (4,)])
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    # whatever other rules do, none of this module's quotients x / y appears
    assert not [op for op in g.ops if op.kind == "div" and op.inputs == [g.inputs[0], g.inputs[1]]]
    ins = [np.abs(np.random.default_rng(2).standard_normal((4,))).astype(np.float32) + 0.5
           for _ in range(2)]
    np.testing.assert_allclose(_run(g, ins)[0], _run(before, ins)[0], rtol=1e-5)


def _backward(t, side, g, l, xla):
    """The cotangent of o / l with respect to l, times o: the program's
    `((g * 2) * 0.0625) * broadcast(1 / (l * l)) * o` or XLA's
    `g * broadcast((1 / (l * l)) * 0.125) * o`, o = g here."""
    op, const = (t.sop, t.sconst) if side == "seq" else (t.dop, t.dconst)
    rows = t.seq.tensors[g].shape[0] if side == "seq" else t.dist.tensors[g].shape[0]

    def splat(value, shape):
        return op("broadcast_in_dim", [const(value)], shape, broadcast_dimensions=())
    ll = op("mul", [l, l], (rows,))
    inv = op("div", [splat(1.0, (rows,)), ll], (rows,))
    if xla:
        inv = op("mul", [inv, splat(0.125, (rows,))], (rows,))
        scaled = g
    else:
        scaled = op("mul", [op("mul", [g, splat(2.0, (rows, 3))], (rows, 3)),
                            splat(0.0625, (rows, 3))], (rows, 3))
    grad = op("mul", [scaled, op("broadcast_in_dim", [inv], (rows, 3), broadcast_dimensions=(0,))],
              (rows, 3))
    return op("mul", [grad, g], (rows, 3))


@pytest.mark.parametrize("xla_side", ["dist", "seq"])
def test_the_programs_form_meets_xlas_form(xla_side):
    t = Tiny()
    gs, gd = t.input((4, 3), ("x", None))
    ls, ld = t.input((4,), ("x",))
    out_s = _backward(t, "seq", gs, ls, xla=xla_side == "seq")
    out_d = _backward(t, "dist", gd, ld, xla=xla_side == "dist")
    t.output(out_s, out_d, ("x", None))
    p = t.problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert res.verified, [f.message for f in res.failures]
    assert_views_hold(p, res.views)


def test_a_wrong_literal_in_xlas_form_is_not_verified():
    t = Tiny()
    gs, gd = t.input((4, 3), ("x", None))
    ls, ld = t.input((4,), ("x",))
    out_s = _backward(t, "seq", gs, ls, xla=False)
    ll = t.dop("mul", [ld, ld], (2,))
    one = t.dop("broadcast_in_dim", [t.dconst(1.0)], (2,), broadcast_dimensions=())
    quarter = t.dop("broadcast_in_dim", [t.dconst(0.25)], (2,), broadcast_dimensions=())  # not 1/8
    inv = t.dop("mul", [t.dop("div", [one, ll], (2,)), quarter], (2,))
    grad = t.dop("mul", [gd, t.dop("broadcast_in_dim", [inv], (2, 3), broadcast_dimensions=(0,))],
                 (2, 3))
    t.output(out_s, t.dop("mul", [grad, gd], (2, 3)), ("x", None))
    p = t.problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert not res.verified
    assert_views_hold(p, res.views)


def test_compiled_ring_attention_grads_verify_and_the_backward_twin_is_located(tmp_path):
    # XLA's g * broadcast((1 / (l*l)) / 8) against the program's (g / 8) / (l*l)
    m = example_module("ring_attention")
    assert_compiled_case_and_twin(tmp_path, m.ring_attention_grads(),
                                  m.ring_bug_backward_block_max(), dumped=True)
