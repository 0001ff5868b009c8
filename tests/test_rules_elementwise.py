"""elementwise.dl: elementwise ops on tiny sequential/distributed program pairs.

Every `Tiny.run()` also checks each derived view (and every tiling set of
partial terms) numerically on random data, so each test is a soundness check
of the rules it exercises as well as a check of what they derive.
"""
import numpy as np
import pytest
from rulekit import Tiny, run_both, view_error

from dlverify.verdict import Partial

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
UNIT = (0, 0, 0, 0)
TWO, THREE, FOUR = (1, 0, 0, 0), (0, 1, 0, 0), (2, 0, 0, 0)


def vset(out, s, d, r):
    """The views of s in d on rank r as (offsets, partial, scale) triples."""
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def term(sop, r, width=3):
    """The sum tag rank r holds for contraction `sop` split in halves of `width`."""
    return Partial(0, sop, 0, width * r, width * r + width)


def partial_pair(t, w_shape=(6, 5)):
    """seq y = x @ w; dist: each rank multiplies its columns of x by its rows of w,
    giving one tagged term of the contraction over dim 0 of w."""
    xs, xd = t.input((4, w_shape[0]), (None, "x"))
    ws, wd = t.input(w_shape, ("x", None))
    ys = t.sop("dot_general", [xs, ws], (4, w_shape[1]), **DOT)
    yd = t.dop("dot_general", [xd, wd], (4, w_shape[1]), **DOT)
    return ys, yd, t.seq.ops[-1].id


def sfull(t, value, shape):
    """A sequential splat constant of `shape` (scalar + explicit broadcast, as the frontend does)."""
    return t.sop("broadcast_in_dim", [t.sconst(value)], shape, broadcast_dimensions=())


def dfull(t, value, shape):
    return t.dop("broadcast_in_dim", [t.dconst(value)], shape, broadcast_dimensions=())


# ---------------------------------------------------------------- unary

def test_nonlinear_unary_maps_each_block_to_the_same_block():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    es = t.sop("exp", [xs], (4, 6))
    ed = t.dop("exp", [xd], (2, 6))
    ts = t.sop("tanh", [es], (4, 6))
    td = t.dop("tanh", [ed], (2, 6))
    out = t.run()
    for r in range(2):
        assert vset(out, es, ed, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, ts, td, r) == {((2 * r, 0), None, UNIT)}


def test_nonlinear_unary_needs_a_unit_scale():
    # exp(2 x) is not 2 exp(x): a scaled operand gives no view
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    x2 = t.dop("mul", [xd, dfull(t, 2.0, (2, 6))], (2, 6))
    es = t.sop("exp", [xs], (4, 6))
    ed = t.dop("exp", [x2], (2, 6))
    out = t.run()
    assert vset(out, xs, x2, 1) == {((2, 0), None, TWO)}
    assert out.views(es, ed) == []


def test_neg_keeps_the_partial_tag_and_scale():
    t = Tiny()
    ys, yd, sop = partial_pair(t)
    y2 = t.dop("mul", [yd, dfull(t, 2.0, (4, 5))], (4, 5))     # dist-only: 2 x term
    ns = t.sop("neg", [ys], (4, 5))
    nd = t.dop("neg", [yd], (4, 5))
    n2 = t.dop("neg", [y2], (4, 5))
    out = t.run()
    for r in range(2):
        assert vset(out, ns, nd, r) == {((0, 0), term(sop, r), UNIT)}
        assert vset(out, ns, n2, r) == {((0, 0), term(sop, r), TWO)}


@pytest.mark.parametrize("kind", ["exp", "tanh", "abs", "square"])
def test_nonlinear_unary_on_a_partial_term_has_no_view(kind):
    t = Tiny()
    ys, yd, _ = partial_pair(t)
    es = t.sop(kind, [ys], (4, 5))
    ed = t.dop(kind, [yd], (4, 5))
    out = t.run()
    assert out.views(ys, yd, 0) and out.views(ys, yd, 1)
    assert out.views(es, ed) == []


def test_nonlinear_binary_on_a_partial_term_has_no_view_and_is_reported():
    # relu of a partial sum, then the psum: the classic "nonlinear before the reduction"
    t = Tiny()
    ys, yd, _ = partial_pair(t)
    ms = t.sop("max", [ys, sfull(t, 0.0, (4, 5))], (4, 5))
    md = t.dop("max", [yd, dfull(t, 0.0, (4, 5))], (4, 5))
    ad = t.dop("all_reduce", [md], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(ms, ad)
    out = t.run()
    assert out.views(ms, md) == []
    assert not out.result.verified
    first = out.result.failures[0]
    assert first.op == "max"
    assert first.reason == "nonlinear op applied to a partial sum: reduce first"
    assert first.ranks == (0, 1)


def test_neg_of_a_partial_max_has_no_view():
    # -max(a, b) is min(-a, -b): only sum terms pass through linear ops
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    md = t.dop("reduce_max", [xd], (4,), axes=(1,))
    ns = t.sop("neg", [ms], (4,))
    nd = t.dop("neg", [md], (4,))
    out = t.run()
    (v,) = out.views(ms, md, 1)
    assert v.partial.reducer == 1 and (v.partial.lo, v.partial.hi) == (3, 6)
    assert out.views(ns, nd) == []


# ---------------------------------------------------------------- add / sub

def test_add_and_sub_of_terms_of_the_same_sum_stay_partial():
    t = Tiny()
    ys, yd, sop = partial_pair(t)
    bs, bd = t.input((4, 5))
    ms = t.sop("mul", [ys, bs], (4, 5))     # another term of the same sum, scaled by b
    md = t.dop("mul", [yd, bd], (4, 5))
    as_ = t.sop("add", [ys, ms], (4, 5))
    ad = t.dop("add", [yd, md], (4, 5))
    ss = t.sop("sub", [ms, ys], (4, 5))
    sd = t.dop("sub", [md, yd], (4, 5))
    out = t.run()
    for r in range(2):
        assert vset(out, ms, md, r) == {((0, 0), term(sop, r), UNIT)}
        assert vset(out, as_, ad, r) == {((0, 0), term(sop, r), UNIT)}
        assert vset(out, ss, sd, r) == {((0, 0), term(sop, r), UNIT)}


def test_add_of_terms_with_different_scales_has_no_view():
    # seq y + y, dist term + 2 term: 3 terms do not sum to 2 y
    t = Tiny()
    ys, yd, sop = partial_pair(t)
    y2 = t.dop("mul", [yd, dfull(t, 2.0, (4, 5))], (4, 5))
    as_ = t.sop("add", [ys, ys], (4, 5))
    ad = t.dop("add", [yd, y2], (4, 5))
    ok = t.dop("add", [yd, yd], (4, 5))
    out = t.run()
    assert vset(out, ys, y2, 0) == {((0, 0), term(sop, 0), TWO)}
    assert out.views(as_, ad) == []
    # a term of the same sum, and (the same adds on both sides) a term of the
    # accumulation tree's family (partials.dl: Tag_AccBase = 5000 + reduced axis,
    # named by its first leaf)
    assert vset(out, as_, ok, 1) == {((0, 0), term(sop, 1), UNIT),
                                     ((0, 0), Partial(0, sop, 5000, 3, 6), UNIT)}


def test_partial_plus_complete_has_no_view_and_is_reported():
    # the Megatron bias-before-psum bug: the bias would be counted once per rank
    t = Tiny()
    ys, yd, _ = partial_pair(t)
    bs, bd = t.input((4, 5))
    zs = t.sop("add", [ys, bs], (4, 5))
    zd = t.dop("add", [yd, bd], (4, 5))
    rd = t.dop("all_reduce", [zd], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(zs, rd)
    out = t.run()
    # rank 0 (term 0's holder) has a view of the add; rank 1, which adds the bias again, none
    assert out.views(zs, zd, 1) == [] and out.views(zs, rd) == []
    first = out.result.failures[0]
    assert first.op == "add" and first.ranks == (1,)
    assert first.reason.startswith("adds a complete value to a partial sum")


def test_terms_of_different_sums_do_not_add():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    w1s, w1d = t.input((6, 5), ("x", None))
    w2s, w2d = t.input((6, 5), ("x", None))
    y1s = t.sop("dot_general", [xs, w1s], (4, 5), **DOT)
    y1d = t.dop("dot_general", [xd, w1d], (4, 5), **DOT)
    op1 = t.seq.ops[-1].id
    y2s = t.sop("dot_general", [xs, w2s], (4, 5), **DOT)
    y2d = t.dop("dot_general", [xd, w2d], (4, 5), **DOT)
    op2 = t.seq.ops[-1].id
    zs = t.sop("add", [y1s, y2s], (4, 5))
    zd = t.dop("add", [y1d, y2d], (4, 5))
    out = t.run()
    assert vset(out, y1s, y1d, 0) == {((0, 0), term(op1, 0), UNIT)}
    assert vset(out, y2s, y2d, 0) == {((0, 0), term(op2, 0), UNIT)}
    # never a term of either sum: a term of the add's own family (partials.dl),
    # F(k) = F1(k) + F2(k), which a psum completes only over the same ranges, in
    # both its namings (two reductions added; an accumulation tree, Tag_AccBase)
    add_op = t.seq.ops[-1].id
    assert {v.partial for v in out.views(zs, zd)} == (
        {Partial(0, add_op, 2000, 3 * r, 3 * r + 3) for r in range(2)}
        | {Partial(0, op1, 5000, 3 * r, 3 * r + 3) for r in range(2)})


# ---------------------------------------------------------------- mul / div

def test_mul_of_a_partial_by_a_complete_operand_multiplies_scales():
    t = Tiny()
    ys, yd, sop = partial_pair(t)
    bs, bd = t.input((4, 5))
    y2 = t.dop("mul", [yd, dfull(t, 2.0, (4, 5))], (4, 5))    # 2 x term
    b3 = t.dop("mul", [dfull(t, 3.0, (4, 5)), bd], (4, 5))    # 3 x b (constant on the left)
    ms = t.sop("mul", [ys, bs], (4, 5))
    md = t.dop("mul", [y2, b3], (4, 5))
    rs = t.sop("mul", [bs, ys], (4, 5))                      # the partial operand second
    rd = t.dop("mul", [b3, y2], (4, 5))
    out = t.run()
    for r in range(2):
        assert vset(out, bs, b3, r) == {((0, 0), None, THREE)}
        assert vset(out, ms, md, r) == {((0, 0), term(sop, r), (1, 1, 0, 0))}
        assert vset(out, rs, rd, r) == {((0, 0), term(sop, r), (1, 1, 0, 0))}


def test_mul_of_two_partial_terms_has_no_view():
    t = Tiny()
    ys, yd, _ = partial_pair(t)
    ms = t.sop("mul", [ys, ys], (4, 5))
    md = t.dop("mul", [yd, yd], (4, 5))
    rd = t.dop("all_reduce", [md], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(ms, rd)
    out = t.run()
    assert out.views(ms, md) == []
    first = out.result.failures[0]
    assert first.op == "mul" and first.reason.startswith("multiplies two partial sums")


def test_div_of_a_partial_by_a_complete_operand_divides_scales():
    t = Tiny()
    ys, yd, sop = partial_pair(t)
    bs, bd = t.input((4, 5))
    es = t.sop("exp", [bs], (4, 5))                            # positive denominators
    ed = t.dop("exp", [bd], (4, 5))
    y2 = t.dop("mul", [yd, dfull(t, 2.0, (4, 5))], (4, 5))    # 2 x term
    e4 = t.dop("mul", [ed, dfull(t, 4.0, (4, 5))], (4, 5))    # 4 x exp(b)
    qs = t.sop("div", [ys, es], (4, 5))
    qd = t.dop("div", [y2, e4], (4, 5))
    # a partial denominator is not linear
    ps = t.sop("div", [es, ys], (4, 5))
    pd = t.dop("div", [ed, yd], (4, 5))
    out = t.run()
    for r in range(2):
        assert vset(out, qs, qd, r) == {((0, 0), term(sop, r), (-1, 0, 0, 0))}
    assert out.views(ps, pd) == []


# ---------------------------------------------------------------- wildcards

def test_a_broadcast_operand_merges_with_a_block():
    t = Tiny()
    xs, xd = t.input((4, 5), ("x", None))
    bs, bd = t.input((5,))
    bbs = t.sop("broadcast_in_dim", [bs], (4, 5), broadcast_dimensions=(1,))
    bbd = t.dop("broadcast_in_dim", [bd], (2, 5), broadcast_dimensions=(1,))
    zs = t.sop("add", [bbs, xs], (4, 5))
    zd = t.dop("add", [bbd, xd], (2, 5))
    ws = t.sop("mul", [bbs, bbs], (4, 5))            # wildcard with wildcard stays wildcard
    wd = t.dop("mul", [bbd, bbd], (2, 5))
    gs = t.sop("max", [xs, bbs], (4, 5))             # also through a nonlinear binary op
    gd = t.dop("max", [xd, bbd], (2, 5))
    out = t.run()
    for r in range(2):
        assert vset(out, bbs, bbd, r) == {((-1, 0), None, UNIT)}
        assert vset(out, zs, zd, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, ws, wd, r) == {((-1, 0), None, UNIT)}
        assert vset(out, gs, gd, r) == {((2 * r, 0), None, UNIT)}


def test_operands_holding_different_blocks_give_no_view():
    t = Tiny()
    xs, xd = t.input((4, 5), ("x", None))
    zs, zd = t.input((4, 5))
    top = t.dop("slice", [zd], (2, 5), start_indices=(0, 0), limit_indices=(2, 5), strides=None)
    as_ = t.sop("add", [xs, zs], (4, 5))
    ad = t.dop("add", [xd, top], (2, 5))
    out = t.run()
    assert vset(out, as_, ad, 0) == {((0, 0), None, UNIT)}   # rows 0:2 of both
    assert out.views(as_, ad, 1) == []                       # rows 2:4 of x + rows 0:2 of z


# ---------------------------------------------------------------- constants

def test_equal_splat_constants_match_on_any_block():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    as_ = t.sop("add", [xs, sfull(t, 1.0, (4, 6))], (4, 6))
    ad = t.dop("add", [xd, dfull(t, 1.0, (2, 6))], (2, 6))
    rs = t.sop("max", [xs, sfull(t, 0.0, (4, 6))], (4, 6))   # relu
    rd = t.dop("max", [xd, dfull(t, 0.0, (2, 6))], (2, 6))
    out = t.run()
    for r in range(2):
        assert vset(out, as_, ad, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, rs, rd, r) == {((2 * r, 0), None, UNIT)}


def test_constants_that_differ_give_no_view_unless_by_an_exact_ratio():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    as_ = t.sop("add", [xs, sfull(t, 1.0, (4, 6))], (4, 6))
    ad = t.dop("add", [xd, dfull(t, 1.5, (2, 6))], (2, 6))     # 1.5 / 1 = 3/2, but add is not a scaling
    ms = t.sop("mul", [xs, sfull(t, 2.0, (4, 6))], (4, 6))
    md = t.dop("mul", [xd, dfull(t, -2.0, (2, 6))], (2, 6))    # negative ratio: no scale
    out = t.run()
    assert out.views(as_, ad) == []
    assert out.views(ms, md) == []


def test_constants_differing_by_an_exact_ratio_give_a_scale():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    qs = t.sop("mul", [xs, sfull(t, 0.25, (4, 6))], (4, 6))
    qd = t.dop("mul", [xd, dfull(t, 1.0, (2, 6))], (2, 6))     # 4 x the sequential value
    ts = t.sop("mul", [xs, sfull(t, 0.75, (4, 6))], (4, 6))
    td = t.dop("mul", [xd, dfull(t, 0.5, (2, 6))], (2, 6))     # 2/3 x
    t.output(qs, qd, ("x", None))
    out = t.run()
    for r in range(2):
        assert vset(out, qs, qd, r) == {((2 * r, 0), None, FOUR)}
        assert vset(out, ts, td, r) == {((2 * r, 0), None, (1, -1, 0, 0))}
    assert not out.result.verified
    assert any("scale differs by 4" in f.message for f in out.result.failures)


def test_scaling_by_a_constant_on_one_side_only():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    d_mul = t.dop("mul", [xd, dfull(t, 2.0, (2, 6))], (2, 6))      # dist x * 2
    d_lmul = t.dop("mul", [dfull(t, 7.0, (2, 6)), xd], (2, 6))     # dist 7 * x
    d_div = t.dop("div", [xd, dfull(t, 4.0, (2, 6))], (2, 6))      # dist x / 4
    s_mul = t.sop("mul", [xs, sfull(t, 3.0, (4, 6))], (4, 6))      # seq x * 3
    s_div = t.sop("div", [xs, sfull(t, 5.0, (4, 6))], (4, 6))      # seq x / 5
    d_neg = t.dop("mul", [xd, dfull(t, -2.0, (2, 6))], (2, 6))     # negative: no scale
    d_inv = t.dop("div", [dfull(t, 2.0, (2, 6)), xd], (2, 6))      # 2 / x is not linear in x
    out = t.run()
    for r in range(2):
        o = (2 * r, 0)
        assert vset(out, xs, d_mul, r) == {(o, None, TWO)}
        assert vset(out, xs, d_lmul, r) == {(o, None, (0, 0, 0, 1))}
        assert vset(out, xs, d_div, r) == {(o, None, (-2, 0, 0, 0))}
        assert vset(out, s_mul, xd, r) == {(o, None, (0, -1, 0, 0))}   # x = s_mul / 3
        assert vset(out, s_div, xd, r) == {(o, None, (0, 0, 1, 0))}    # x = 5 s_div
        # both sides scaled: dist x*2 is 2/3 of seq x*3
        assert vset(out, s_mul, d_mul, r) == {(o, None, (1, -1, 0, 0))}
    assert out.views(xs, d_neg) == []
    assert out.views(xs, d_inv) == []


def test_halving_on_each_side_in_different_ways_verifies():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    hs = t.sop("mul", [xs, sfull(t, 0.5, (4, 6))], (4, 6))
    hd = t.dop("div", [xd, dfull(t, 2.0, (2, 6))], (2, 6))
    t.output(hs, hd, ("x", None))
    out = t.run()
    assert vset(out, hs, hd, 1) == {((2, 0), None, UNIT)}
    assert out.result.verified
    assert out.result.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)"]


# ---------------------------------------------------------------- three operands

def test_select_n_and_clamp_map_blocks():
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    ps = t.sop("gt", [xs, sfull(t, 0.0, (4, 6))], (4, 6))
    pd = t.dop("gt", [xd, dfull(t, 0.0, (2, 6))], (2, 6))
    ns = t.sop("neg", [xs], (4, 6))
    nd = t.dop("neg", [xd], (2, 6))
    ss = t.sop("select_n", [ps, ns, xs], (4, 6))                  # |x|
    sd = t.dop("select_n", [pd, nd, xd], (2, 6))
    cs = t.sop("clamp", [sfull(t, -0.5, (4, 6)), xs, sfull(t, 0.5, (4, 6))], (4, 6))
    cd = t.dop("clamp", [dfull(t, -0.5, (2, 6)), xd, dfull(t, 0.5, (2, 6))], (2, 6))
    out = t.run()
    for r in range(2):
        assert vset(out, ss, sd, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, cs, cd, r) == {((2 * r, 0), None, UNIT)}


def test_three_operand_ops_need_complete_unit_scale_operands():
    t = Tiny()
    ys, yd, _ = partial_pair(t)
    bs, bd = t.input((4, 5))
    ps = t.sop("gt", [bs, sfull(t, 0.0, (4, 5))], (4, 5))
    pd = t.dop("gt", [bd, dfull(t, 0.0, (4, 5))], (4, 5))
    ss = t.sop("select_n", [ps, ys, bs], (4, 5))                  # a partial case
    sd = t.dop("select_n", [pd, yd, bd], (4, 5))
    xs, xd = t.input((4, 5))
    cs = t.sop("clamp", [sfull(t, -0.5, (4, 5)), xs, sfull(t, 0.25, (4, 5))], (4, 5))
    cd = t.dop("clamp", [dfull(t, -0.5, (4, 5)), xd, dfull(t, 0.5, (4, 5))], (4, 5))   # hi differs
    out = t.run()
    assert vset(out, ps, pd, 0) == {((0, 0), None, UNIT)}
    assert out.views(ss, sd) == []
    assert out.views(cs, cd) == []


# ---------------------------------------------------------------- integer division
# Elem_Div is emitted for every `div`, whatever the dtype, and the one-sided
# scaling rules treat it as real division. On integers `div` truncates
# (jnp `//` on int32, lax.div), so d / 2 is not 1/2 x d: no scaling rule may apply.

def _int_const(b, value, shape):
    c = b.constant(np.full((), value, dtype=np.int32), (), "int32")
    return b.op("broadcast_in_dim", [c], shape, "int32", {"broadcast_dimensions": ()})


def test_integer_division_on_the_sequential_side_is_not_a_scaling():
    t = Tiny()
    xs, xd = t.input((8,), (), dtype="int32")
    hs = t.S.op("div", [xs, _int_const(t.S, 2, (8,))], (8,), "int32")
    out = t.run()            # numeric check: View(hs, xd, scale 2) is false for odd x
    assert out.views(hs, xd) == []


def test_integer_division_on_the_distributed_side_is_not_a_scaling():
    t = Tiny()
    xs, xd = t.input((8,), (), dtype="int32")
    hd = t.D.op("div", [xd, _int_const(t.D, 2, (8,))], (8,), "int32")
    out = t.run()            # numeric check: View(xs, hd, scale 1/2) is false for odd x
    assert out.views(xs, hd) == []


def test_a_literal_is_read_as_the_rational_it_rounds():
    # x * (1/3) and x / 3, x * 0.1 and x / 10: equal over the reals when the float32
    # literal is read as the rational it rounds. That reading is an assumption (it is
    # listed), not a theorem: the numeric check allows exactly the literal's rounding
    # (half an ulp of float32, relative) instead of rulekit's 1e-9. 0.34 is no
    # rounding of a 2,3,5,7-smooth rational and gives no view.
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    thirds = t.sop("div", [xs, sfull(t, 3.0, (4, 6))], (4, 6))
    thirdd = t.dop("mul", [xd, dfull(t, 1 / 3, (2, 6))], (2, 6))
    tenths = t.sop("mul", [xs, sfull(t, 0.1, (4, 6))], (4, 6))
    tenthd = t.dop("div", [xd, dfull(t, 10.0, (2, 6))], (2, 6))
    bad = t.dop("mul", [xd, dfull(t, 0.34, (2, 6))], (2, 6))
    t.output(thirds, thirdd, ("x", None))
    t.output(tenths, tenthd, ("x", None))
    out = t.run(check_numerically=False)
    for seed in (0, 1):
        run = run_both(out.problem, seed)
        for v in out.result.views:
            d = np.abs(run.dist[v.dist][v.rank])
            assert view_error(run, out.problem, v) <= 2.0 ** -24 * max(1.0, float(d.max())), v
    for r in range(2):
        assert vset(out, thirds, thirdd, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, tenths, tenthd, r) == {((2 * r, 0), None, UNIT)}
        assert not vset(out, thirds, bad, r)
    assert out.result.verified
    assert any("is read as 1/3" in a for a in out.result.assumptions)
    assert any("is read as 1/10" in a for a in out.result.assumptions)
    assert not any("0.34" in a for a in out.result.assumptions)


def test_read_literal():
    from fractions import Fraction

    from dlverify.ops.export import read_literal
    assert read_literal(float(np.float32(1 / 3))).value == Fraction(1, 3)
    assert read_literal(float(np.float32(2 / 3))).value == Fraction(2, 3)
    assert read_literal(float(np.float32(0.001))).value == Fraction(1, 1000)
    exact = read_literal(0.125)
    assert exact.value == Fraction(1, 8) and not exact.rounded
    assert read_literal(1 / 3).rounded
    for f in (0.34, 1 / 11, 0.0, -0.5, float("inf"), 0.1 + 1e-12):
        assert read_literal(f) is None, f
