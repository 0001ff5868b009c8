"""collectives.dl: all_reduce, all_gather, reduce_scatter, all_to_all and
collective_permute on tiny program pairs (every derived view is checked
numerically, so each completed sum is also checked on random data)."""
import pytest
from rulekit import Tiny

from dlverify.ir import Mesh
from dlverify.partial_tags import group_axis, trans_axis
from dlverify.verdict import Partial

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
UNIT = (0, 0, 0, 0)


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def matmul_terms(t, w_spec=("x", None), k=8):
    """seq y = x @ w (contraction of size k); dist: x's columns and w's rows split by
    w_spec, so each rank holds one term of the sum."""
    x_spec = (None, w_spec[0])
    xs, xd = t.input((4, k), x_spec)
    ws, wd = t.input((k, 5), w_spec)
    local = t.dist.tensors[wd].shape[0]
    ys = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    yd = t.dop("dot_general", [xd, wd], (4, 5), **DOT)
    return ys, yd, t.seq.ops[-1].id, local


# ---------------------------------------------------------------- all_reduce: partial sums

@pytest.mark.parametrize("n", [2, 4])
def test_all_reduce_sum_completes_tiling_terms(n):
    t = Tiny(mesh=Mesh(("x",), (n,)))
    ys, yd, sop, local = matmul_terms(t)
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[list(range(n))])
    t.output(ys, ad)
    out = t.run()
    for r in range(n):
        assert vset(out, ys, yd, r) == {((0, 0), Partial(0, sop, 0, local * r, local * (r + 1)), UNIT)}
        assert vset(out, ys, ad, r) == {((0, 0), None, UNIT)}
    assert out.result.verified
    assert out.result.outputs == [f"out0 = r0.out0  (replicated on all {n} ranks)"]


def test_all_reduce_over_the_right_mesh_axis_of_a_2d_mesh():
    mesh = Mesh(("dp", "tp"), (2, 2))
    t = Tiny(mesh=mesh)
    ys, yd, sop, _ = matmul_terms(t, ("tp", None))
    assert mesh.groups(("tp",)) == [[0, 1], [2, 3]]
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=mesh.groups(("tp",)))
    out = t.run()
    for r in range(4):
        tp = r % 2
        assert vset(out, ys, yd, r) == {((0, 0), Partial(0, sop, 0, 4 * tp, 4 * tp + 4), UNIT)}
        assert vset(out, ys, ad, r) == {((0, 0), None, UNIT)}


def test_all_reduce_over_the_wrong_mesh_axis_of_a_2d_mesh():
    mesh = Mesh(("dp", "tp"), (2, 2))
    t = Tiny(mesh=mesh)
    ys, yd, _, _ = matmul_terms(t, ("tp", None))
    groups = mesh.groups(("dp",))
    assert groups == [[0, 2], [1, 3]]
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=groups)
    t.output(ys, ad)
    out = t.run()
    assert out.views(ys, ad) == []
    first = out.result.failures[0]
    assert first.op == "all_reduce"
    assert "over groups [[0, 2], [1, 3]]" in first.reason
    assert "rank 0 [0:4), rank 1 [4:8)" in first.reason


def test_all_reduce_of_members_holding_the_same_range_has_no_view():
    # every rank multiplies the first half of the contraction: 2 x the same term
    t = Tiny()
    xs, xd = t.input((4, 8))
    ws, wd = t.input((8, 5))
    xh = t.dop("slice", [xd], (4, 4), start_indices=(0, 0), limit_indices=(4, 4), strides=None)
    wh = t.dop("slice", [wd], (4, 5), start_indices=(0, 0), limit_indices=(4, 5), strides=None)
    ys = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    yd = t.dop("dot_general", [xh, wh], (4, 5), **DOT)
    sop = t.seq.ops[-1].id
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    for r in range(2):
        assert vset(out, ys, yd, r) == {((0, 0), Partial(0, sop, 0, 0, 4), UNIT)}
    assert out.views(ys, ad) == []


def test_all_reduce_with_members_in_reversed_order_has_no_view():
    # The sum over {1, 0} is the same number, but the rule walks members in group
    # order and requires their ranges to tile [0, n) in that order (documented in
    # collectives.dl): group [1, 0] starts with the range [4, 8) and derives nothing.
    t = Tiny()
    ys, yd, _, _ = matmul_terms(t)
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[[1, 0]])
    out = t.run()
    assert out.views(ys, ad) == []


def test_all_reduce_of_complete_replicas_scales_by_the_group_size():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((4, 5))
    pair = t.dop("all_reduce", [xd], (4, 5), reducer="sum", groups=[[0, 1], [2, 3]])
    whole = t.dop("all_reduce", [xd], (4, 5), reducer="sum", groups=[[0, 1, 2, 3]])
    mx = t.dop("all_reduce", [xd], (4, 5), reducer="max", groups=[[0, 1, 2, 3]])
    mn = t.dop("all_reduce", [xd], (4, 5), reducer="min", groups=[[0, 1], [2, 3]])
    t.output(xs, whole)
    out = t.run()
    for r in range(4):
        assert vset(out, xs, pair, r) == {((0, 0), None, (1, 0, 0, 0))}
        assert vset(out, xs, whole, r) == {((0, 0), None, (2, 0, 0, 0))}
        assert vset(out, xs, mx, r) == {((0, 0), None, UNIT)}
        assert vset(out, xs, mn, r) == {((0, 0), None, UNIT)}
    assert any("scale differs by 4" in f.message for f in out.result.failures)


def test_all_reduce_of_replicas_over_three_ranks():
    t = Tiny(mesh=Mesh(("x",), (3,)))
    xs, xd = t.input((3, 2))
    sd = t.dop("all_reduce", [xd], (3, 2), reducer="sum", groups=[[0, 1, 2]])
    out = t.run()
    assert vset(out, xs, sd, 2) == {((0, 0), None, (0, 1, 0, 0))}


def test_max_all_reduce_completes_partial_maxima():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    md = t.dop("reduce_max", [xd], (4,), axes=(1,))
    sop = t.seq.ops[-1].id
    mx = t.dop("all_reduce", [md], (4,), reducer="max", groups=[[0, 1]])
    sm = t.dop("all_reduce", [md], (4,), reducer="sum", groups=[[0, 1]])    # wrong reducer
    mn = t.dop("all_reduce", [md], (4,), reducer="min", groups=[[0, 1]])    # wrong reducer
    out = t.run()
    for r in range(2):
        assert vset(out, ms, md, r) == {((0,), Partial(1, sop, 0, 3 * r, 3 * r + 3), UNIT)}
        assert vset(out, ms, mx, r) == {((0,), None, UNIT)}
    assert out.views(ms, sm) == []
    assert out.views(ms, mn) == []


def test_max_all_reduce_does_not_complete_partial_sums():
    t = Tiny()
    ys, yd, _, _ = matmul_terms(t)
    mx = t.dop("all_reduce", [yd], (4, 5), reducer="max", groups=[[0, 1]])
    out = t.run()
    assert out.views(ys, mx) == []


# ---------------------------------------------------------------- two-level reductions

def _two_axis_terms(order, mesh_shape=(2, 2), k=16):
    """seq y = x @ w with the contraction split over both axes of an ("a", "b") mesh,
    in the mesh-axis order `order` (rank (a, b) holds range a*B + b for ("a", "b"))."""
    mesh = Mesh(("a", "b"), mesh_shape)
    t = Tiny(mesh=mesh)
    ys, yd, sop, local = matmul_terms(t, (order, None), k=k)
    return t, mesh, ys, yd, sop, local


def test_reduce_scatter_over_the_inner_axis_leaves_the_union_range_that_the_outer_completes():
    # HSDP: rank (a, b) holds range 2a + b; reduce-scatter over b, then all-reduce over a
    t, mesh, ys, yd, sop, _ = _two_axis_terms(("a", "b"))
    rs = t.dop("reduce_scatter", [yd], (2, 5), dimension=0, reducer="sum", groups=mesh.groups(("b",)))
    ar = t.dop("all_reduce", [rs], (2, 5), reducer="sum", groups=mesh.groups(("a",)))
    t.output(ys, ar, ("b", None))
    out = t.run()
    for r in range(4):
        a, b = divmod(r, 2)
        assert vset(out, ys, rs, r) == {((2 * b, 0), Partial(0, sop, 0, 8 * a, 8 * a + 8), UNIT)}
        assert vset(out, ys, ar, r) == {((2 * b, 0), None, UNIT)}
    assert out.result.verified


def test_all_reduce_over_the_outer_axis_first_gives_terms_of_its_groups_sums():
    # psum(psum(y, "a"), "b"): group g = b of the first all-reduce holds ranges b and 2 + b,
    # interleaved; its result is term g of the family of the groups' sums
    t, mesh, ys, yd, sop, _ = _two_axis_terms(("a", "b"))
    first = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=mesh.groups(("a",)))
    first_op = t.dist.ops[-1].id
    second = t.dop("all_reduce", [first], (4, 5), reducer="sum", groups=mesh.groups(("b",)))
    t.output(ys, second)
    out = t.run()
    for r in range(4):
        b = r % 2
        # also range [8b, 8b + 8) of the dot's terms re-indexed by the transpose of
        # their blocks of 4, 2 per row (block 2a + b becomes 2b + a; partials.dl)
        assert vset(out, ys, first, r) == {
            ((0, 0), Partial(0, first_op, group_axis(0, 1, 2), b, b + 1), UNIT),
            ((0, 0), Partial(0, sop, trans_axis(0, 4, 2), 8 * b, 8 * b + 8), UNIT)}
        assert vset(out, ys, second, r) == {((0, 0), None, UNIT)}
    assert out.result.verified


def test_three_level_reduction_over_a_2x2x2_mesh():
    # Each level reduces the innermost remaining axis (adjacent ranges), or one whose
    # groups interleave slot by slot within a class of groups, or members holding
    # blocks a row apart (re-indexed by the transpose of the blocks): every order completes.
    mesh = Mesh(("a", "b", "c"), (2, 2, 2))
    for order in [("c", "b", "a"), ("a", "c", "b"), ("c", "a", "b"), ("a", "b", "c"),
                  ("b", "a", "c"), ("b", "c", "a")]:
        t = Tiny(mesh=mesh)
        ys, yd, _, _ = matmul_terms(t, (("a", "b", "c"), None), k=16)
        x = yd
        for axis in order:
            x = t.dop("all_reduce", [x], (4, 5), reducer="sum", groups=mesh.groups((axis,)))
        out = t.run()
        complete = [vset(out, ys, x, r) for r in range(8)]
        assert complete == [{((0, 0), None, UNIT)}] * 8, order


def test_outer_axis_first_with_blocks_on_a_third_axis():
    # (dp, fsdp, tp): the contraction split over (dp, fsdp), the output columns over tp.
    # psum over dp first: the groups holding one tp block form a class (stride 2)
    mesh = Mesh(("dp", "fsdp", "tp"), (2, 2, 2))
    t = Tiny(mesh=mesh)
    xs, xd = t.input((4, 8), (None, ("dp", "fsdp")))
    ws, wd = t.input((8, 6), (("dp", "fsdp"), "tp"))
    ys = t.sop("dot_general", [xs, ws], (4, 6), **DOT)
    sop = t.seq.ops[-1].id
    yd = t.dop("dot_general", [xd, wd], (4, 3), **DOT)
    over_dp = t.dop("all_reduce", [yd], (4, 3), reducer="sum", groups=mesh.groups(("dp",)))
    dp_op = t.dist.ops[-1].id
    both = t.dop("all_reduce", [over_dp], (4, 3), reducer="sum", groups=mesh.groups(("fsdp",)))
    t.output(ys, both, (None, "tp"))
    out = t.run()
    for r in range(8):
        f, tp = (r // 2) % 2, r % 2
        assert vset(out, ys, over_dp, r) == {
            ((0, 3 * tp), Partial(0, dp_op, group_axis(tp, 2, 2), f, f + 1), UNIT),
            ((0, 3 * tp), Partial(0, sop, trans_axis(0, 2, 2), 4 * f, 4 * f + 4), UNIT)}
        assert vset(out, ys, both, r) == {((0, 3 * tp), None, UNIT)}
    assert out.result.verified


def test_two_level_reduction_that_reduces_one_axis_twice_does_not_complete():
    t, mesh, ys, yd, _, _ = _two_axis_terms(("a", "b"))
    first = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=mesh.groups(("a",)))
    again = t.dop("all_reduce", [first], (4, 5), reducer="sum", groups=mesh.groups(("a",)))
    out = t.run()
    assert out.views(ys, again) == []


def test_groups_sums_need_every_rank_to_hold_a_distinct_range():
    # the contraction split over "a" only (replicated over "b"): an all-reduce over "a"
    # completes it; over "b" the members hold the same range twice: nothing
    t, mesh, ys, yd, _, _ = _two_axis_terms("a")
    over_b = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=mesh.groups(("b",)))
    out = t.run()
    assert out.views(ys, over_b) == []


def test_partial_maxima_reduced_over_two_axes():
    mesh = Mesh(("a", "b"), (2, 2))
    t = Tiny(mesh=mesh)
    xs, xd = t.input((4, 8), (None, ("a", "b")))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    md = t.dop("reduce_max", [xd], (4,), axes=(1,))
    sop = t.seq.ops[-1].id
    inner = t.dop("all_reduce", [md], (4,), reducer="max", groups=mesh.groups(("b",)))
    both = t.dop("all_reduce", [inner], (4,), reducer="max", groups=mesh.groups(("a",)))
    outer = t.dop("all_reduce", [md], (4,), reducer="max", groups=mesh.groups(("a",)))
    both2 = t.dop("all_reduce", [outer], (4,), reducer="max", groups=mesh.groups(("b",)))
    wrong = t.dop("all_reduce", [inner], (4,), reducer="sum", groups=mesh.groups(("a",)))
    out = t.run()
    for r in range(4):
        a = r // 2
        assert vset(out, ms, inner, r) == {((0,), Partial(1, sop, 0, 4 * a, 4 * a + 4), UNIT)}
        assert vset(out, ms, both, r) == {((0,), None, UNIT)}
        assert vset(out, ms, both2, r) == {((0,), None, UNIT)}
    assert out.views(ms, wrong) == []


def test_groups_of_different_sizes_give_no_groups_sums():
    # rank (a, b) of a 2x4 mesh holds range b of 4. With groups [[0, 2], [1, 3, 4], ...]
    # the slots of the groups 0 and 1 (ranks 0, 1, 2, 3) tile the range, but group 1
    # also sums rank 4: its result is no term of a family whose total is the sequential value
    t = Tiny(mesh=Mesh(("a", "b"), (2, 4)))
    ys, yd, sop, _ = matmul_terms(t, ("b", None), k=8)
    odd = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[[0, 2], [1, 3, 4], [5, 6, 7]])
    out = t.run()
    # group [0, 2] holds blocks 0 and 2 of 2 terms: a range of the transposed blocks
    pair = {((0, 0), Partial(0, sop, trans_axis(0, 2, 2), 0, 4), UNIT)}
    assert [vset(out, ys, odd, r) for r in range(5)] == [pair, set(), pair, set(), set()]
    # group [5, 6, 7] holds the adjacent ranges [2, 8): their union
    assert [vset(out, ys, odd, r) for r in range(5, 8)] == [{((0, 0), Partial(0, sop, 0, 2, 8), UNIT)}] * 3


def test_groups_of_one_reduce_nothing_and_leave_no_view():
    # an all-reduce over groups of one is the identity: the partial term is not carried
    # through, so the failure stays at the collective with the wrong groups
    t = Tiny()
    ys, yd, _, _ = matmul_terms(t)
    ad = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[[0], [1]])
    t.output(ys, ad)
    out = t.run()
    assert out.views(ys, ad) == []
    assert (out.result.failures[0].op, out.result.failures[0].kind) == ("all_reduce", "wrong-group")


# ---------------------------------------------------------------- all_gather

def test_all_gather_of_adjacent_blocks_in_group_order():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((8, 3), ("x", None))
    gd = t.dop("all_gather", [xd], (8, 3), dimension=0, groups=[[0, 1, 2, 3]])
    pd = t.dop("all_gather", [xd], (4, 3), dimension=0, groups=[[0, 1], [2, 3]])
    out = t.run()
    for r in range(4):
        assert vset(out, xs, gd, r) == {((0, 0), None, UNIT)}
        assert vset(out, xs, pd, r) == {((0 if r < 2 else 4, 0), None, UNIT)}


def test_all_gather_along_the_wrong_dim_or_out_of_order_has_no_view():
    t = Tiny()
    xs, xd = t.input((8, 3), ("x", None))
    wrong_dim = t.dop("all_gather", [xd], (4, 6), dimension=1, groups=[[0, 1]])
    reversed_ = t.dop("all_gather", [xd], (8, 3), dimension=0, groups=[[1, 0]])
    t.output(xs, wrong_dim)
    out = t.run()
    assert out.views(xs, wrong_dim) == []
    assert out.views(xs, reversed_) == []
    first = out.result.failures[0]
    assert first.op == "all_gather"
    assert first.reason == "the members' blocks are not adjacent along dim 1 in group order"


def test_all_gather_on_a_2d_mesh_over_one_axis():
    mesh = Mesh(("dp", "tp"), (2, 2))
    t = Tiny(mesh=mesh)
    xs, xd = t.input((4, 6), ("dp", "tp"))
    gd = t.dop("all_gather", [xd], (2, 6), dimension=1, groups=mesh.groups(("tp",)))
    out = t.run()
    for r in range(4):
        assert vset(out, xs, gd, r) == {((2 * (r // 2), 0), None, UNIT)}


def test_all_gather_passes_a_shared_partial_tag_and_scale():
    # all members hold the term of the same range of their own rows: the gathered rows
    # are that term of all rows (dp x tp: rows split over dp, contraction over tp)
    mesh = Mesh(("dp", "tp"), (2, 2))
    t = Tiny(mesh=mesh)
    xs, xd = t.input((4, 8), ("dp", "tp"))
    ws, wd = t.input((8, 5), ("tp", None))
    ys = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    yd = t.dop("dot_general", [xd, wd], (2, 5), **DOT)
    sop = t.seq.ops[-1].id
    gd = t.dop("all_gather", [yd], (4, 5), dimension=0, groups=mesh.groups(("dp",)))
    ad = t.dop("all_reduce", [gd], (4, 5), reducer="sum", groups=mesh.groups(("tp",)))
    out = t.run()
    for r in range(4):
        tp = r % 2
        assert vset(out, ys, gd, r) == {((0, 0), Partial(0, sop, 0, 4 * tp, 4 * tp + 4), UNIT)}
        assert vset(out, ys, ad, r) == {((0, 0), None, UNIT)}


# ---------------------------------------------------------------- reduce_scatter

def test_reduce_scatter_completes_terms_and_gives_member_q_chunk_q():
    t = Tiny()
    ys, yd, _, _ = matmul_terms(t)
    rd = t.dop("reduce_scatter", [yd], (2, 5), dimension=0, reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert [vset(out, ys, rd, r) for r in range(2)] == [{((0, 0), None, UNIT)}, {((2, 0), None, UNIT)}]


def test_reduce_scatter_over_four_ranks_and_of_replicas():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    ys, yd, _, _ = matmul_terms(t)
    rd = t.dop("reduce_scatter", [yd], (2, 5), dimension=0, reducer="sum", groups=[[0, 1], [2, 3]])
    xs, xd = t.input((4, 6))
    sd = t.dop("reduce_scatter", [xd], (4, 3), dimension=1, reducer="sum", groups=[[0, 2], [1, 3]])
    out = t.run()
    # groups [0,1] and [2,3] each hold only half the contraction: nothing completes,
    # each group's chunks are partial sums of its half (the union of its members' ranges)
    sop = t.seq.ops[0].id
    assert [vset(out, ys, rd, r) for r in range(4)] == [
        {((0, 0), Partial(0, sop, 0, 0, 4), UNIT)}, {((2, 0), Partial(0, sop, 0, 0, 4), UNIT)},
        {((0, 0), Partial(0, sop, 0, 4, 8), UNIT)}, {((2, 0), Partial(0, sop, 0, 4, 8), UNIT)}]
    # replicas: chunk q of 2 x, by position q in the group
    assert [vset(out, xs, sd, r) for r in range(4)] == [
        {((0, 0), None, (1, 0, 0, 0))}, {((0, 0), None, (1, 0, 0, 0))},
        {((0, 3), None, (1, 0, 0, 0))}, {((0, 3), None, (1, 0, 0, 0))}]


def test_reduce_scatter_in_reversed_group_order():
    # member q gets chunk q: with group [1, 0], rank 1 is member 0 and gets rows 0:2,
    # but its term range [4, 8) does not start the tiling, so nothing is derived
    t = Tiny()
    ys, yd, _, _ = matmul_terms(t)
    rd = t.dop("reduce_scatter", [yd], (2, 5), dimension=0, reducer="sum", groups=[[1, 0]])
    out = t.run()
    assert out.views(ys, rd) == []


# ---------------------------------------------------------------- all_to_all

def test_all_to_all_reshards_rows_to_columns():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    ad = t.dop("all_to_all", [xd], (8, 2), split_dimension=1, concat_dimension=0, groups=[[0, 1]])
    out = t.run()
    assert [vset(out, xs, ad, r) for r in range(2)] == [{((0, 0), None, UNIT)}, {((0, 2), None, UNIT)}]


def test_all_to_all_over_four_ranks():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((4, 8, 2), (None, "x", None))
    ad = t.dop("all_to_all", [xd], (1, 8, 2), split_dimension=0, concat_dimension=1,
               groups=[[0, 1, 2, 3]])
    out = t.run()
    for r in range(4):
        assert vset(out, xs, ad, r) == {((r, 0, 0), None, UNIT)}


def test_all_to_all_splitting_the_wrong_axis_has_no_view():
    # rows are sharded, but the all_to_all concatenates along columns: the members'
    # blocks are not adjacent along the concat dim
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    ad = t.dop("all_to_all", [xd], (2, 8), split_dimension=0, concat_dimension=1, groups=[[0, 1]])
    out = t.run()
    assert out.views(xs, ad) == []


# ---------------------------------------------------------------- collective_permute

def test_collective_permute_ring_shift_moves_blocks():
    n = 4
    t = Tiny(mesh=Mesh(("x",), (n,)))
    xs, xd = t.input((8, 3), ("x", None))
    fwd = t.dop("collective_permute", [xd], (2, 3), pairs=[(r, (r + 1) % n) for r in range(n)])
    bwd = t.dop("collective_permute", [xd], (2, 3), pairs=[(r, (r - 1) % n) for r in range(n)])
    part = t.dop("collective_permute", [xd], (2, 3), pairs=[(0, 1), (1, 2)])
    out = t.run()
    for r in range(n):
        assert vset(out, xs, fwd, r) == {((2 * ((r - 1) % n), 0), None, UNIT)}
        assert vset(out, xs, bwd, r) == {((2 * ((r + 1) % n), 0), None, UNIT)}
    assert vset(out, xs, part, 1) == {((0, 0), None, UNIT)}
    assert vset(out, xs, part, 2) == {((2, 0), None, UNIT)}
    assert out.views(xs, part, 0) == [] and out.views(xs, part, 3) == []   # receive zeros


def test_collective_permute_moves_partial_terms_which_then_do_not_tile():
    t = Tiny()
    ys, yd, sop, _ = matmul_terms(t)
    swapped = t.dop("collective_permute", [yd], (4, 5), pairs=[(0, 1), (1, 0)])
    copied = t.dop("collective_permute", [yd], (4, 5), pairs=[(0, 1), (0, 0)])
    ad = t.dop("all_reduce", [copied], (4, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert vset(out, ys, swapped, 0) == {((0, 0), Partial(0, sop, 0, 4, 8), UNIT)}
    assert vset(out, ys, swapped, 1) == {((0, 0), Partial(0, sop, 0, 0, 4), UNIT)}
    assert vset(out, ys, copied, 1) == {((0, 0), Partial(0, sop, 0, 0, 4), UNIT)}
    assert out.views(ys, ad) == []          # both members hold [0, 4)
