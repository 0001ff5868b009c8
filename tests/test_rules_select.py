"""select.dl: select_n whose index is known before run time on one side.

`Tiny.run()` checks every derived view numerically on random data, so each
test is also a soundness check of the rule."""
import numpy as np
from rulekit import Tiny

UNIT = (0, 0, 0, 0)


def test_rank_dependent_index_takes_the_case_of_each_rank():
    # where(axis_index == 0, a, b): select_n(pred, b, a) is a on rank 0, b elsewhere
    t = Tiny()
    as_, ad = t.input((4, 6), ("x", None))
    bs, bd = t.input((4, 6))
    pred = t.drank_is(0, (2, 6))
    bd2 = t.dop("slice", [bd], (2, 6), start_indices=(0, 0), limit_indices=(2, 6), strides=None)
    sel = t.dop("select_n", [pred, bd2, ad], (2, 6))
    out = t.run()
    assert {v.offsets for v in out.views(as_, sel, 0)} == {(0, 0)}   # rank 0: its block of a
    assert out.views(as_, sel, 1) == []                               # rank 1 holds b's rows
    assert {v.offsets for v in out.views(bs, sel, 1)} == {(0, 0)}
    assert out.views(bs, sel, 0) == []


def test_partial_terms_pass_through_a_known_select_unchanged():
    # a partial sum selected on every rank stays a term of the same sum
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 5), ("x", None))
    dot = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
    ys = t.sop("dot_general", [xs, ws], (4, 5), **dot)
    yd = t.dop("dot_general", [xd, wd], (4, 5), **dot)
    zero = t.dconst(0.0, (4, 5))
    one = t.D.constant(np.ones((4, 5), dtype=np.int32), (4, 5), "int32")
    sel = t.dop("select_n", [one, zero, yd], (4, 5))
    rd = t.dop("all_reduce", [sel], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(ys, rd)
    out = t.run()
    assert {v.partial for v in out.views(ys, sel)} == {v.partial for v in out.views(ys, yd)}
    assert out.result.verified


def test_sequential_select_on_a_constant_index():
    t = Tiny()
    as_, ad = t.input((4, 6), ("x", None))
    bs, _ = t.input((4, 6))
    zero = t.S.constant(np.zeros((4, 6), dtype=bool), (4, 6), "bool")
    sel = t.sop("select_n", [zero, as_, bs], (4, 6))
    t.output(sel, ad, ("x", None))
    out = t.run()
    assert out.result.verified


def test_an_index_unknown_before_run_time_gives_no_one_sided_view():
    t = Tiny()
    as_, ad = t.input((4, 6), ("x", None))
    _, cd = t.input((4, 6), ("x", None))
    bs, bd = t.input((4, 6), ("x", None))
    pred = t.D.op("gt", [cd, bd], (2, 6), "bool")
    sel = t.dop("select_n", [pred, bd, ad], (2, 6))
    out = t.run()
    assert out.views(as_, sel) == [] and out.views(bs, sel) == []
