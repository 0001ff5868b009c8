"""contraction.dl: dot_general and reductions on tiny programs."""
import numpy as np
import pytest
from rulekit import Tiny

from dlverify.verdict import Partial

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def test_contracted_dim_split_gives_tagged_partial_sums():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 5), ("x", None))
    ys = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    yd = t.dop("dot_general", [xd, wd], (4, 5), **DOT)
    out = t.run()
    sop = t.seq.ops[-1].id
    for r in range(2):
        (v,) = out.views(ys, yd, r)
        assert v.offsets == (0, 0)
        assert v.partial == Partial(0, sop, 0, 3 * r, 3 * r + 3)


def test_free_dim_split_gives_blocks_and_batch_dims_must_agree():
    t = Tiny()
    xs, xd = t.input((2, 4, 6), ("x", None, None))
    ws, wd = t.input((2, 6, 8), ("x", None, None))
    dn = dict(lhs_contract=(2,), rhs_contract=(1,), lhs_batch=(0,), rhs_batch=(0,))
    ys = t.sop("dot_general", [xs, ws], (2, 4, 8), **dn)
    yd = t.dop("dot_general", [xd, wd], (1, 4, 8), **dn)
    out = t.run()
    assert out.offsets(ys, yd, 0) == {(0, 0, 0)}
    assert out.offsets(ys, yd, 1) == {(1, 0, 0)}


def test_batch_dims_that_disagree_give_no_view():
    t = Tiny()
    xs, xd = t.input((2, 4, 6), ("x", None, None))
    ws, wd = t.input((2, 6, 8), ())
    sl = t.dop("slice", [wd], (1, 6, 8), start_indices=(0, 0, 0), limit_indices=(1, 6, 8), strides=None)
    dn = dict(lhs_contract=(2,), rhs_contract=(1,), lhs_batch=(0,), rhs_batch=(0,))
    ys = t.sop("dot_general", [xs, ws], (2, 4, 8), **dn)
    yd = t.dop("dot_general", [xd, sl], (1, 4, 8), **dn)
    out = t.run()
    assert out.offsets(ys, yd, 0) == {(0, 0, 0)}
    assert out.views(ys, yd, 1) == []   # rank 1 pairs batch 1 of x with batch 0 of w


def test_reduce_sum_over_split_dim_is_partial_and_over_full_dim_complete():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    a_s = t.sop("reduce_sum", [xs], (4,), axes=(1,))
    a_d = t.dop("reduce_sum", [xd], (4,), axes=(1,))
    b_s = t.sop("reduce_sum", [xs], (6,), axes=(0,))
    b_d = t.dop("reduce_sum", [xd], (3,), axes=(0,))
    out = t.run()
    (v,) = out.views(a_s, a_d, 1)
    assert v.partial is not None and (v.partial.lo, v.partial.hi) == (3, 6)
    assert out.offsets(b_s, b_d, 1) == {(3,)}


def test_reduce_max_partial_is_not_a_sum():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    md = t.dop("reduce_max", [xd], (4,), axes=(1,))
    # a sum of the partial maxima is not the sequential sum of anything
    ss = t.sop("reduce_sum", [ms], (), axes=(0,))
    sd = t.dop("reduce_sum", [md], (), axes=(0,))
    out = t.run()
    (v,) = out.views(ms, md, 0)
    assert v.partial.reducer == 1
    assert out.views(ss, sd) == []


# ------------------------------------------- whole-axis reductions, scans and sorts

@pytest.mark.parametrize("kind", ["argmax", "argmin", "reduce_prod"])
def test_argmax_and_prod_over_a_whole_axis_give_the_block_of_the_kept_dims(kind):
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))          # rows split, the reduced dim whole
    dtype = "int32" if kind.startswith("arg") else "float32"
    ys = t.S.op(kind, [xs], (4,), dtype, {"axes": (1,)})
    yd = t.D.op(kind, [xd], (2,), dtype, {"axes": (1,)})
    t.output(ys, yd, ("x",))
    out = t.run()
    assert out.result.verified
    assert {v.offsets for v in out.views(ys, yd, 1)} == {(2,)}


def test_argmax_over_a_split_axis_or_of_a_scaled_operand_has_no_view():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))          # the reduced dim split
    split_s = t.S.op("argmax", [xs], (4,), "int32", {"axes": (1,)})
    split_d = t.D.op("argmax", [xd], (4,), "int32", {"axes": (1,)})
    ws, wd = t.input((4, 6))
    w2 = t.dop("mul", [wd, t.dop("broadcast_in_dim", [t.dconst(2.0)], (4, 6), broadcast_dimensions=())], (4, 6))
    ps = t.sop("reduce_prod", [ws], (4,), axes=(1,))
    pd = t.dop("reduce_prod", [w2], (4,), axes=(1,))
    out = t.run()
    assert out.views(split_s, split_d) == []
    assert out.views(ws, w2) and out.views(ps, pd) == []   # prod(2 w) = 2^6 prod(w)


@pytest.mark.parametrize("kind,params", [("sort", {"dimension": 1}),
                                         ("cummax", {"axis": 1, "reverse": False}),
                                         ("cumsum", {"axis": 1, "reverse": True}),
                                         ("cumlogsumexp", {"axis": 1, "reverse": False})])
def test_sorts_and_scans_along_a_whole_axis_keep_the_block(kind, params):
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    ys = t.sop(kind, [xs], (4, 6), **params)
    yd = t.dop(kind, [xd], (2, 6), **params)
    t.output(ys, yd, ("x", None))
    assert t.run().result.verified


def test_top_k_and_a_sort_of_several_operands_along_a_whole_axis_keep_the_rows():
    # top_k (values and indices) and argsort (sort of values and an iota, result 1)
    # on rows split over the ranks: every rank's rows of the sequential results.
    t = Tiny()
    xs, xd = t.input((4, 6), ("x", None))
    out_pairs = []
    for i in (0, 1):
        dtype = "float32" if i == 0 else "int32"
        ks = t.sop("top_k", [xs], (4, 2), axis=1, k=2, output=i)
        kd = t.dop("top_k", [xd], (2, 2), axis=1, k=2, output=i)
        t.seq.tensors[ks].dtype = t.dist.tensors[kd].dtype = dtype
        out_pairs.append((ks, kd))
    ios = t.sop("iota", [], (4, 6), dimension=1)
    iod = t.dop("iota", [], (2, 6), dimension=1)
    t.seq.tensors[ios].dtype = t.dist.tensors[iod].dtype = "int32"
    ars = t.sop("sort", [xs, ios], (4, 6), dimension=1, num_keys=1, output=1)
    ard = t.dop("sort", [xd, iod], (2, 6), dimension=1, num_keys=1, output=1)
    t.seq.tensors[ars].dtype = t.dist.tensors[ard].dtype = "int32"
    # a sort of several operands whose second operand is not related: no view
    ys, yd = t.input((4, 6), ("x", None))
    bad_s = t.sop("sort", [xs, ys], (4, 6), dimension=1, num_keys=1, output=1)
    bad_d = t.dop("sort", [xd, xd], (2, 6), dimension=1, num_keys=1, output=1)
    for s, d in out_pairs + [(ars, ard)]:
        t.output(s, d, ("x", None))
    out = t.run()
    for s, d in out_pairs + [(ars, ard)]:
        assert {v.offsets for v in out.views(s, d)} == {(0, 0), (2, 0)}, (s, d)
    assert out.views(bad_s, bad_d) == []
    assert out.result.verified


def test_top_k_over_a_split_axis_has_no_view():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ks = t.sop("top_k", [xs], (4, 2), axis=1, k=2, output=0)
    kd = t.dop("top_k", [xd], (4, 2), axis=1, k=2, output=0)
    t.output(ks, kd)
    out = t.run()
    assert out.views(ks, kd) == [] and not out.result.verified


def _scans_of_split_and_partial(kind):
    """`kind` along a split axis (seq ys, dist yd), and along a whole axis of a
    partial sum over the batch dim, all-reduced after the scan (cs, cd): run."""
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ys = t.sop(kind, [xs], (4, 6), axis=1, reverse=False)
    yd = t.dop(kind, [xd], (4, 3), axis=1, reverse=False)
    ws, wd = t.input((6, 5), ("x", None))
    ps = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    pd = t.dop("dot_general", [xd, wd], (4, 5), **DOT)
    cs = t.sop(kind, [ps], (4, 5), axis=1, reverse=False)
    cd = t.dop(kind, [pd], (4, 5), axis=1, reverse=False)
    rd = t.dop("all_reduce", [cd], (4, 5), reducer="sum", groups=[[0, 1]])
    t.output(cs, rd)
    return t, t.run(), (ys, yd), (cs, cd)


def test_a_scan_along_a_split_axis_has_no_view_and_cumsum_keeps_partial_terms():
    t, out, split, (cs, cd) = _scans_of_split_and_partial("cumsum")
    assert out.views(*split) == []
    assert {v.partial.op for v in out.views(cs, cd, 0)} == {t.seq.ops[-2].id}
    assert out.result.verified


def test_cumlogsumexp_along_a_split_axis_or_of_partial_terms_has_no_view():
    """log-sum-exp is not linear: a rank's prefix along its own block of the axis is
    not a block of the sequential prefix, and a partial sum's terms do not pass."""
    _, out, split, partial = _scans_of_split_and_partial("cumlogsumexp")
    assert out.views(*split) == [] and out.views(*partial) == []
    assert not out.result.verified


@pytest.mark.parametrize("const_side", [0, 1])
def test_a_constant_operand_takes_the_other_operands_offset_in_a_contracted_dim(const_side):
    """The cotangent of a mean, contracted with a rank's rows: the distributed 1/b is n
    times the sequential 1/(n b) on any block (a splat), so the product is n times the
    partial sum over the rank's rows (checked numerically on random data); the psum of
    the partials divided by n is the sequential product."""
    t = Tiny()
    hs, hd = t.input((8, 5), ("x", None))                        # rows split over 2 ranks
    cs = t.sop("broadcast_in_dim", [t.sconst(1 / 8)], (8,), broadcast_dimensions=())
    cd = t.dop("broadcast_in_dim", [t.dconst(1 / 4)], (4,), broadcast_dimensions=())
    if const_side == 0:
        dn = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
        ys, yd = t.sop("dot_general", [cs, hs], (5,), **dn), t.dop("dot_general", [cd, hd], (5,), **dn)
    else:
        dn = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
        ys, yd = t.sop("dot_general", [hs, cs], (5,), **dn), t.dop("dot_general", [hd, cd], (5,), **dn)
    summed = t.dop("all_reduce", [yd], (5,), reducer="sum", groups=[[0, 1]])
    mean = t.dop("div", [summed, t.dop("broadcast_in_dim", [t.dconst(2.0)], (5,),
                                          broadcast_dimensions=())], (5,))
    t.output(ys, mean)
    out = t.run()
    sop = [op for op in t.seq.ops if op.output == ys][0].id
    for r in range(2):
        (v,) = out.views(ys, yd, r)
        assert v.partial == Partial(0, sop, 0, 4 * r, 4 * r + 4) and v.scale == (1, 0, 0, 0)
    assert out.result.verified


def test_a_constant_that_is_not_a_splat_gets_no_wildcard_and_no_view():
    """A distributed constant with distinct values (an iota-like ramp) relates to nothing
    by value here: the product is not derived from the wildcard rule."""
    t = Tiny()
    hs, hd = t.input((8, 5), ("x", None))
    cs = t.S.constant(np.arange(8, dtype=np.float32), (8,), "float32")
    cd = t.D.constant(np.arange(4, dtype=np.float32), (4,), "float32")
    dn = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
    ys, yd = t.sop("dot_general", [cs, hs], (5,), **dn), t.dop("dot_general", [cd, hd], (5,), **dn)
    t.output(ys, t.dop("all_reduce", [yd], (5,), reducer="sum", groups=[[0, 1]]))
    out = t.run()
    assert out.views(ys, yd, 1) == [] and not out.result.verified
