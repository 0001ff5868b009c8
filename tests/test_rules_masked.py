"""masked.dl: a select_n whose one case is zero on both sides is linear in its other case.

`Tiny.run()` checks every derived view numerically on random data, so each
test is also a soundness check of the rule."""
from rulekit import Tiny

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def _mask(t: Tiny, shape: tuple[int, ...]) -> tuple[int, int]:
    """A data-dependent predicate, the same on both sides: a > b for replicated a, b."""
    as_, ad = t.input(shape)
    bs, bd = t.input(shape)
    return t.S.op("gt", [as_, bs], shape, "bool"), t.D.op("gt", [ad, bd], shape, "bool")


def test_a_scaled_case_keeps_its_scale_through_the_mask():
    # the backward of where(mask, s, -inf) with a cotangent of a local mean: 2 x the sequential one
    t = Tiny()
    ms, md = _mask(t, (4, 6))
    xs, xd = t.input((4, 6), ("x", None))
    ms2 = t.S.op("slice", [ms], (2, 6), "bool", dict(start_indices=(0, 0), limit_indices=(2, 6), strides=None))
    xs2 = t.sop("slice", [xs], (2, 6), start_indices=(0, 0), limit_indices=(2, 6), strides=None)
    md2 = t.D.op("slice", [md], (2, 6), "bool", dict(start_indices=(0, 0), limit_indices=(2, 6), strides=None))
    x2 = t.dop("mul", [xd, t.dop("broadcast_in_dim", [t.dconst(2.0)], (2, 6), broadcast_dimensions=())], (2, 6))
    sel_s = t.sop("select_n", [ms2, t.sconst(0.0, (2, 6)), xs2], (2, 6))
    sel_d = t.dop("select_n", [md2, t.dconst(0.0, (2, 6)), x2], (2, 6))
    out = t.run()
    assert {(v.offsets, v.scale) for v in out.views(sel_s, sel_d, 0)} == {((0, 0), (1, 0, 0, 0))}


def _partial_product(t: Tiny) -> tuple[int, int]:
    """x @ w contracted over a sharded dim: a partial sum on each rank."""
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 5), ("x", None))
    return t.sop("dot_general", [xs, ws], (4, 5), **DOT), t.dop("dot_general", [xd, wd], (4, 5), **DOT)


def test_partial_terms_pass_through_the_mask_and_a_psum_completes_them():
    for zero_first in (True, False):
        t = Tiny()
        ms, md = _mask(t, (4, 5))
        ys, yd = _partial_product(t)
        zs, zd = t.sconst(0.0, (4, 5)), t.dconst(0.0, (4, 5))
        sel_s = t.sop("select_n", [ms, zs, ys] if zero_first else [ms, ys, zs], (4, 5))
        sel_d = t.dop("select_n", [md, zd, yd] if zero_first else [md, yd, zd], (4, 5))
        rd = t.dop("all_reduce", [sel_d], (4, 5), reducer="sum", groups=[[0, 1]])
        t.output(sel_s, rd)
        out = t.run()
        assert out.result.verified, [f.message for f in out.result.failures]


def test_a_nonzero_case_does_not_pass_partial_terms():
    # select(m, 1, y_r) summed over 2 ranks gives 2 where m is false: not select(m, 1, y)
    t = Tiny()
    ms, md = _mask(t, (4, 5))
    ys, yd = _partial_product(t)
    sel_s = t.sop("select_n", [ms, t.sconst(1.0, (4, 5)), ys], (4, 5))
    sel_d = t.dop("select_n", [md, t.dconst(1.0, (4, 5)), yd], (4, 5))
    rd = t.dop("all_reduce", [sel_d], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(sel_s, rd)
    out = t.run()
    assert not out.result.verified
    assert out.views(sel_s, sel_d) == []


def test_a_zero_on_one_side_only_does_not_count():
    # the sequential case is 0 but the distributed one is 1: no view of the select
    t = Tiny()
    ms, md = _mask(t, (4, 6))
    xs, xd = t.input((4, 6))
    sel_s = t.sop("select_n", [ms, t.sconst(0.0, (4, 6)), xs], (4, 6))
    sel_d = t.dop("select_n", [md, t.dconst(1.0, (4, 6)), xd], (4, 6))
    t.output(sel_s, sel_d)
    out = t.run()
    assert not out.result.verified
    assert out.views(sel_s, sel_d) == []
