"""A reduction over several axes as a chain of one-axis reductions, the last axis first
(dlverify/simplify_compiled.one_axis_reductions): red(x, {a1 < .. < ak}) =
red(..red(x, {ak})..., {a1}). XLA's algebraic simplifier folds the program's
`sum(sum(x, -1), (0, 1))` (a loss: the vocabulary, then the batch) into one
`sum(x, (0, 1, 2))`; both become the same chain, the program's inner sum one of its
values. Checked with the shared evaluator on several ranks (every reducer of a set),
where it must not fire, and on a pair: the program's chain against XLA's merged sum of
a batch-sharded tensor (gspmd_llama_fsdp_train's loss), the views it derives checked
numerically; a twin summing one rank's block only is not verified."""
import copy

import numpy as np
import pytest
from rulekit import Tiny, assert_views_hold
from test_compiled_forms import _chain, _red
from test_simplify import _graph

from dlverify.api import verify_problem
from dlverify.interpret import Interpreter
from dlverify.simplify import simplify_graph

RANKS = 2


def _same_values(build, shape):
    """Simplify; the output on every rank agrees with the original's."""
    g, ids = _graph(build, [shape])
    before = copy.deepcopy(g)
    changed = simplify_graph(g, ids)
    rng = np.random.default_rng(3)
    ins = [[rng.standard_normal(shape).astype(np.float32) for _ in range(RANKS)]]
    for o0, o1 in zip(before.outputs, g.outputs):
        a, b = Interpreter(before, RANKS).run(ins)[o0], Interpreter(g, RANKS).run(ins)[o1]
        for r in range(RANKS):
            np.testing.assert_allclose(a[r], b[r], rtol=1e-5, atol=1e-5)
    return g, changed


@pytest.mark.parametrize("kind", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
@pytest.mark.parametrize("axes, out", [((0, 1, 2), ()), ((0, 2), (3,)), ((1, 2), (2,))])
def test_a_reduction_over_several_axes_is_a_chain_of_one_axis_reductions(kind, axes, out):
    g, changed = _same_values(lambda b, x: _red(b, kind, x, out, axes), (2, 3, 4))
    assert changed
    chain = _chain(g)
    assert [k for k, _, _ in chain] == [kind] * len(axes)
    # from the output down: the lowest axis last reduced, the highest first
    assert [a for _, a, _ in chain] == [(a,) for a in axes]


def test_the_chain_reduces_the_last_axis_first():
    g, _ = _same_values(lambda b, x: _red(b, "reduce_sum", x, (), (0, 1, 2)), (2, 3, 4))
    assert _chain(g) == [("reduce_sum", (0,), (2,)), ("reduce_sum", (1,), (2, 3)),
                         ("reduce_sum", (2,), (2, 3, 4))]


def test_the_programs_chain_and_the_merged_sum_meet():
    """sum(sum(x, 2), (0, 1)) and sum(x, (0, 1, 2)): the same chain."""
    prog, _ = _same_values(lambda b, x: _red(b, "reduce_sum", _red(b, "reduce_sum", x, (2, 3), (2,)),
                                             (), (0, 1)), (2, 3, 4))
    xla, _ = _same_values(lambda b, x: _red(b, "reduce_sum", x, (), (0, 1, 2)), (2, 3, 4))
    assert _chain(prog) == _chain(xla)


@pytest.mark.parametrize("axes", [(1,), ()])
def test_one_axis_and_no_axis_reductions_stay(axes):
    out = tuple(n for d, n in enumerate((2, 3, 4)) if d not in axes)
    _, changed = _same_values(lambda b, x: _red(b, "reduce_sum", x, out, axes), (2, 3, 4))
    assert not changed


def test_a_reduction_of_a_reshape_is_left_to_the_reshape_rules():
    """sum(reshape(x), (0, 1)) reducing part of a split group (x's last dim as 2 x 2)
    stays one reduction: the reshape rules read a reshape's groups in one reduction."""
    def build(b, x):
        r = b.op("reshape", [x], (6, 2, 2), "float32", {})
        return _red(b, "reduce_sum", r, (2,), (0, 1))
    g, _ = _same_values(build, (2, 3, 4))
    assert [op.kind for op in g.ops if op.kind.startswith("reduce")] == ["reduce_sum"]


def _loss_pair(dist_axes_then_psum: bool = True) -> Tiny:
    """The program's loss sum(sum(x, 2), (0, 1)) against XLA's merged sum of the rank's
    batch block, all-reduced (x sharded over its batch dim 0); the twin does not
    all-reduce."""
    t = Tiny()
    xs, xd = t.input((4, 3, 5), ("x", None, None))
    inner = t.sop("reduce_sum", [xs], (4, 3), axes=(2,))
    loss_s = t.sop("reduce_sum", [inner], (), axes=(0, 1))
    local = t.dop("reduce_sum", [xd], (), axes=(0, 1, 2))
    loss_d = t.dop("all_reduce", [local], (), reducer="sum", groups=[[0, 1]]) if dist_axes_then_psum \
        else local
    t.output(loss_s, loss_d, ())
    return t


def test_the_programs_loss_and_xlas_merged_sum_verify():
    p = _loss_pair().problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert res.verified, [f.message for f in res.failures]
    assert_views_hold(p, res.views)


def test_xlas_merged_sum_of_one_rank_only_does_not_verify():
    p = _loss_pair(dist_axes_then_psum=False).problem()
    p.normal_form = True
    res = verify_problem(p, engine="clingo")
    assert not res.verified
    assert_views_hold(p, res.views)
