"""layout.dl: broadcast, transpose, reshape, slice, dynamic_slice, concatenate
and iota on tiny program pairs (every derived view is checked numerically)."""
import numpy as np
from rulekit import Tiny

from dlverify.ir import Mesh
from dlverify.verdict import Partial

UNIT = (0, 0, 0, 0)


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def iconst(b, value):
    """An int32 scalar constant in builder b (t.S or t.D)."""
    return b.constant(np.asarray(value, dtype=np.int32), (), "int32")


def rank_start(t, mul, add=0, axis="x"):
    """The distributed int32 scalar axis_index(axis) * mul + add (folded per rank by passes.fold)."""
    i = t.D.op("axis_index", [], (), "int32", {"axis": axis})
    v = t.D.op("mul", [i, iconst(t.D, mul)], (), "int32")
    if add:
        v = t.D.op("add", [v, iconst(t.D, add)], (), "int32")
    return v


# ---------------------------------------------------------------- broadcast_in_dim

def test_broadcast_new_dims_equal_size_give_offset_0_smaller_give_wildcard():
    t = Tiny()
    bs, bd = t.input((5,))
    ss = t.sop("broadcast_in_dim", [bs], (4, 5), broadcast_dimensions=(1,))
    full = t.dop("broadcast_in_dim", [bd], (4, 5), broadcast_dimensions=(1,))
    small = t.dop("broadcast_in_dim", [bd], (2, 5), broadcast_dimensions=(1,))
    big = t.dop("broadcast_in_dim", [bd], (6, 5), broadcast_dimensions=(1,))
    out = t.run()
    for r in range(2):
        assert vset(out, ss, full, r) == {((0, 0), None, UNIT)}
        assert vset(out, ss, small, r) == {((-1, 0), None, UNIT)}
    assert out.views(ss, big) == []          # larger than the sequential tensor


def test_broadcast_keeps_the_offsets_of_mapped_dims():
    t = Tiny()
    bs, bd = t.input((6,), ("x",))
    ss = t.sop("broadcast_in_dim", [bs], (4, 6), broadcast_dimensions=(1,))
    sd = t.dop("broadcast_in_dim", [bd], (4, 3), broadcast_dimensions=(1,))
    # a size-1 dim expanded on the sequential side only: the distributed broadcast
    # moves nothing (ed is cd), and cd is any row of es (layout_algebra.dl)
    cs, cd = t.input((1, 6))
    es = t.sop("broadcast_in_dim", [cs], (4, 6), broadcast_dimensions=(0, 1))
    ed = t.dop("broadcast_in_dim", [cd], (1, 6), broadcast_dimensions=(0, 1))
    out = t.run()
    assert vset(out, ss, sd, 0) == {((0, 0), None, UNIT)}
    assert vset(out, ss, sd, 1) == {((0, 3), None, UNIT)}
    for r in range(2):
        assert vset(out, es, ed, r) == {((-1, 0), None, UNIT)}


def test_broadcast_carries_partial_tags():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ys = t.sop("reduce_sum", [xs], (4,), axes=(1,))
    yd = t.dop("reduce_sum", [xd], (4,), axes=(1,))
    sop = t.seq.ops[-1].id
    bs = t.sop("broadcast_in_dim", [ys], (4, 3), broadcast_dimensions=(0,))
    bd = t.dop("broadcast_in_dim", [yd], (4, 3), broadcast_dimensions=(0,))
    out = t.run()
    for r in range(2):
        assert vset(out, bs, bd, r) == {((0, 0), Partial(0, sop, 0, 3 * r, 3 * r + 3), UNIT)}


# ---------------------------------------------------------------- transpose

def test_transpose_permutes_offsets():
    t = Tiny()
    xs, xd = t.input((4, 6, 2), (None, "x", None))
    ts = t.sop("transpose", [xs], (6, 2, 4), permutation=(1, 2, 0))
    td = t.dop("transpose", [xd], (3, 2, 4), permutation=(1, 2, 0))
    ws = t.sop("transpose", [xs], (2, 6, 4), permutation=(2, 1, 0))   # another permutation
    out = t.run()
    assert vset(out, ts, td, 0) == {((0, 0, 0), None, UNIT)}
    assert vset(out, ts, td, 1) == {((3, 0, 0), None, UNIT)}
    assert out.views(ws, td) == []


def test_rev_mirrors_the_block_of_a_reversed_split_dim_and_keeps_the_others():
    # x [4, 6] split on dim 1; rev over both dims: rank 0's columns [0, 3) of x are
    # columns [3, 6) of the reversed x, and rows keep their (whole) block
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    rs = t.sop("rev", [xs], (4, 6), dimensions=(0, 1))
    rd = t.dop("rev", [xd], (4, 3), dimensions=(0, 1))
    ks = t.sop("rev", [xs], (4, 6), dimensions=(0,))       # the split dim kept
    kd = t.dop("rev", [xd], (4, 3), dimensions=(0,))
    other = t.dop("rev", [xd], (4, 3), dimensions=(1,))    # reverses other dims than rs
    t.output(rs, rd, (None, "x"))    # the expected relation: rank r holds block r...
    out = t.run()
    assert vset(out, rs, rd, 0) == {((0, 3), None, UNIT)}
    assert vset(out, rs, rd, 1) == {((0, 0), None, UNIT)}
    assert vset(out, ks, kd, 1) == {((0, 3), None, UNIT)}
    assert out.views(rs, other) == []
    # ...but rank 0 holds the mirrored block [3, 6): not the output out_specs promise
    assert not out.result.verified


# ---------------------------------------------------------------- reshape

def test_reshape_split_of_a_sharded_dim_that_splits_evenly():
    t = Tiny()
    xs, xd = t.input((8, 3), ("x", None))
    ss = t.sop("reshape", [xs], (4, 2, 3))
    sd = t.dop("reshape", [xd], (2, 2, 3))
    out = t.run()
    assert vset(out, ss, sd, 0) == {((0, 0, 0), None, UNIT)}
    assert vset(out, ss, sd, 1) == {((2, 0, 0), None, UNIT)}


def test_reshape_merge_of_a_sharded_major_dim():
    t = Tiny()
    xs, xd = t.input((4, 2, 3), ("x", None, None))
    ms = t.sop("reshape", [xs], (8, 3))
    md = t.dop("reshape", [xd], (4, 3))
    out = t.run()
    assert vset(out, ms, md, 0) == {((0, 0), None, UNIT)}
    assert vset(out, ms, md, 1) == {((4, 0), None, UNIT)}


def test_reshape_merging_a_sharded_minor_dim_moves_the_shard_boundary():
    # (the transformers-neuronx #109 class) rank 1 holds x[:, 3:6]; flattened
    # it is rows 3:6, 9:12, ... of x.reshape(-1), not one block
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    fs = t.sop("reshape", [xs], (24,))
    fd = t.dop("reshape", [xd], (12,))
    # and heads split from a sharded hidden dim with the wrong head size
    hs = t.sop("reshape", [xs], (4, 2, 3))     # 2 heads of 3
    hd = t.dop("reshape", [xd], (4, 1, 3))     # fine: rank r holds head r ...
    gs = t.sop("reshape", [xs], (4, 3, 2))     # 3 heads of 2: a rank's 3 columns straddle heads
    gd = t.dop("reshape", [xd], (4, 3, 1))
    out = t.run()
    assert out.views(fs, fd) == []
    assert out.views(gs, gd) == []
    # the aligned split: the size-1 local head dim is free to join the split group
    # (layout_algebra.dl), so rank r holds head r
    for r in range(2):
        assert vset(out, hs, hd, r) == {((0, r, 0), None, UNIT)}


def test_reshape_of_an_unaligned_dist_block_has_no_view():
    t = Tiny()
    xs, xd = t.input((12,))
    sl = t.dop("slice", [xd], (8,), start_indices=(2,), limit_indices=(10,), strides=None)
    rs = t.sop("reshape", [xs], (3, 4))
    rd = t.dop("reshape", [sl], (2, 4))
    al = t.dop("slice", [xd], (8,), start_indices=(4,), limit_indices=(12,), strides=None)
    ad = t.dop("reshape", [al], (2, 4))
    out = t.run()
    assert vset(out, xs, sl, 0) == {((2,), None, UNIT)}
    assert out.views(rs, rd) == []                          # offset 2 is not a multiple of 4
    assert vset(out, rs, ad, 1) == {((1, 0), None, UNIT)}   # offset 4 is row 1


# ---------------------------------------------------------------- slice

def test_dist_only_slice_of_a_block_is_a_block():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    sd = t.dop("slice", [xd], (2, 3), start_indices=(1, 1), limit_indices=(3, 4), strides=None)
    st = t.dop("slice", [xd], (2, 4), start_indices=(0, 0), limit_indices=(4, 4), strides=(2, 1))
    out = t.run()
    assert vset(out, xs, sd, 0) == {((1, 1), None, UNIT)}
    assert vset(out, xs, sd, 1) == {((5, 1), None, UNIT)}
    assert out.views(xs, st) == []                          # strided: not a block


def test_seq_only_slice_block_inside_and_outside():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    upper = t.sop("slice", [xs], (4, 4), start_indices=(4, 0), limit_indices=(8, 4), strides=None)
    tail = t.sop("slice", [xs], (6, 4), start_indices=(2, 0), limit_indices=(8, 4), strides=None)
    cols = t.sop("slice", [xs], (8, 2), start_indices=(0, 1), limit_indices=(8, 3), strides=None)
    out = t.run()
    assert out.views(upper, xd, 0) == []                    # rows 0:4 are outside rows 4:8
    assert vset(out, upper, xd, 1) == {((0, 0), None, UNIT)}
    assert out.views(tail, xd, 0) == []                     # rows 0:4 straddle the start 2
    assert vset(out, tail, xd, 1) == {((2, 0), None, UNIT)}
    assert out.views(cols, xd) == []                        # 4 columns do not fit in 2


def test_seq_only_slice_starting_one_past_the_block_is_not_a_wildcard():
    # a block at offset 0 of x has offset 0 - 1 = -1 in a slice starting at 1: that
    # is "outside", not the wildcard -1 ("any offset") of the offset lists
    t = Tiny()
    xs, xd = t.input((2, 3, 4))
    q = t.dop("slice", [xd], (2, 1, 4), start_indices=(0, 0, 0), limit_indices=(2, 1, 4),
              strides=None)
    ks = t.sop("slice", [xs], (2, 1, 4), start_indices=(0, 1, 0), limit_indices=(2, 2, 4),
               strides=None)
    out = t.run()
    assert out.views(ks, q) == []


def test_matching_slices_on_both_sides():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    ss = t.sop("slice", [xs], (8, 2), start_indices=(0, 2), limit_indices=(8, 4), strides=None)
    sd = t.dop("slice", [xd], (4, 2), start_indices=(0, 2), limit_indices=(4, 4), strides=None)
    out = t.run()
    assert vset(out, ss, sd, 1) == {((4, 0), None, UNIT)}
    assert vset(out, xs, sd, 1) == {((4, 2), None, UNIT)}


# ---------------------------------------------------------------- dynamic_slice

def test_dynamic_slice_with_a_rank_dependent_start():
    t = Tiny(mesh=Mesh(("x",), (2,)))
    xs, xd = t.input((8, 4))
    zero = iconst(t.D, 0)
    a = t.dop("dynamic_slice", [xd, rank_start(t, 4), zero], (4, 4), slice_sizes=(4, 4))
    b = t.dop("dynamic_slice", [xd, rank_start(t, 2, add=1), zero], (2, 4), slice_sizes=(2, 4))
    # XLA clamps: rank 1's start 6 becomes 8 - 4 = 4
    c = t.dop("dynamic_slice", [xd, rank_start(t, 6), zero], (4, 4), slice_sizes=(4, 4))
    out = t.run()
    assert [vset(out, xs, a, r) for r in range(2)] == [{((0, 0), None, UNIT)}, {((4, 0), None, UNIT)}]
    assert [vset(out, xs, b, r) for r in range(2)] == [{((1, 0), None, UNIT)}, {((3, 0), None, UNIT)}]
    assert [vset(out, xs, c, r) for r in range(2)] == [{((0, 0), None, UNIT)}, {((4, 0), None, UNIT)}]


def test_dynamic_slice_on_a_2d_mesh_axis():
    t = Tiny(mesh=Mesh(("dp", "tp"), (2, 2)))
    xs, xd = t.input((4, 8))
    zero = iconst(t.D, 0)
    d = t.dop("dynamic_slice", [xd, zero, rank_start(t, 4, axis="tp")], (4, 4), slice_sizes=(4, 4))
    out = t.run()
    # rank = 2 * dp + tp
    assert [vset(out, xs, d, r) for r in range(4)] == [
        {((0, 0), None, UNIT)}, {((0, 4), None, UNIT)}, {((0, 0), None, UNIT)}, {((0, 4), None, UNIT)}]


def test_dynamic_slice_with_a_runtime_start_has_no_view():
    t = Tiny()
    xs, xd = t.input((8, 4))
    ks, kd = t.input((), dtype="int32")          # a start only known at run time
    zero = iconst(t.D, 0)
    d = t.dop("dynamic_slice", [xd, kd, zero], (4, 4), slice_sizes=(4, 4))
    out = t.run()
    assert out.views(xs, d) == []


# ---------------------------------------------------------------- concatenate

def test_dist_only_concat_of_adjacent_blocks_in_order():
    t = Tiny()
    xs, xd = t.input((8, 4))
    a = t.dop("slice", [xd], (2, 4), start_indices=(1, 0), limit_indices=(3, 4), strides=None)
    b = t.dop("slice", [xd], (3, 4), start_indices=(3, 0), limit_indices=(6, 4), strides=None)
    c = t.dop("slice", [xd], (2, 4), start_indices=(6, 0), limit_indices=(8, 4), strides=None)
    abc = t.dop("concatenate", [a, b, c], (7, 4), dimension=0)
    ba = t.dop("concatenate", [b, a], (5, 4), dimension=0)        # out of order
    ac = t.dop("concatenate", [a, c], (4, 4), dimension=0)        # a gap between them
    out = t.run()
    for r in range(2):
        assert vset(out, xs, abc, r) == {((1, 0), None, UNIT)}
    assert out.views(xs, ba) == []
    assert out.views(xs, ac) == []


def test_dist_only_concat_along_columns_of_sharded_blocks():
    t = Tiny()
    xs, xd = t.input((4, 8), ("x", None))
    a = t.dop("slice", [xd], (2, 3), start_indices=(0, 0), limit_indices=(2, 3), strides=None)
    b = t.dop("slice", [xd], (2, 5), start_indices=(0, 3), limit_indices=(2, 8), strides=None)
    ab = t.dop("concatenate", [a, b], (2, 8), dimension=1)
    out = t.run()
    assert vset(out, xs, ab, 0) == {((0, 0), None, UNIT)}
    assert vset(out, xs, ab, 1) == {((2, 0), None, UNIT)}


def test_seq_only_concat_shifts_the_block():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    zs, zd = t.input((4, 3), ("x", None))
    cs = t.sop("concatenate", [xs, zs], (8, 3), dimension=0)
    out = t.run()
    for r in range(2):
        assert vset(out, cs, xd, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, cs, zd, r) == {((4 + 2 * r, 0), None, UNIT)}


def test_matching_concat_of_shards_on_both_sides():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    zs, zd = t.input((4, 5), ("x", None))
    cs = t.sop("concatenate", [xs, zs], (4, 8), dimension=1)
    cd = t.dop("concatenate", [xd, zd], (2, 8), dimension=1)
    out = t.run()
    assert vset(out, cs, cd, 1) == {((2, 0), None, UNIT)}


# ---------------------------------------------------------------- iota

def test_iota_is_the_leading_block_of_a_longer_iota():
    t = Tiny()
    s1 = t.S.op("iota", [], (8,), "int32", {"dimension": 0})
    d1 = t.D.op("iota", [], (4,), "int32", {"dimension": 0})
    s2 = t.S.op("iota", [], (4, 8), "int32", {"dimension": 1})
    d2 = t.D.op("iota", [], (2, 4), "int32", {"dimension": 1})   # fewer rows: any row offset
    d3 = t.D.op("iota", [], (4, 4), "int32", {"dimension": 1})   # all rows: offset 0
    d4 = t.D.op("iota", [], (4, 4), "int32", {"dimension": 0})   # counts along the other dim
    out = t.run()
    for r in range(2):
        assert vset(out, s1, d1, r) == {((0,), None, UNIT)}
        assert vset(out, s2, d2, r) == {((-1, 0), None, UNIT)}
        assert vset(out, s2, d3, r) == {((0, 0), None, UNIT)}
    assert out.views(s2, d4) == []


def test_iota_plus_a_per_rank_constant_is_the_shifted_block():
    # positions under sequence parallelism: rank r's positions are r*4 + iota(4)
    t = Tiny()
    ps = t.S.op("iota", [], (8,), "int32", {"dimension": 0})
    io = t.D.op("iota", [], (4,), "int32", {"dimension": 0})
    off = t.D.op("broadcast_in_dim", [rank_start(t, 4)], (4,), "int32", {"broadcast_dimensions": ()})
    pd = t.D.op("add", [io, off], (4,), "int32")
    qd = t.D.op("add", [off, io], (4,), "int32")                 # constant first
    sd = t.D.op("sub", [pd, t.D.op("broadcast_in_dim", [iconst(t.D, 1)], (4,), "int32",
                                   {"broadcast_dimensions": ()})], (4,), "int32")
    far = t.D.op("broadcast_in_dim", [rank_start(t, 6)], (4,), "int32", {"broadcast_dimensions": ()})
    fd = t.D.op("add", [io, far], (4,), "int32")                 # rank 1: 6:10 is outside 0:8
    out = t.run()
    assert [vset(out, ps, pd, r) for r in range(2)] == [{((0,), None, UNIT)}, {((4,), None, UNIT)}]
    assert [vset(out, ps, qd, r) for r in range(2)] == [{((0,), None, UNIT)}, {((4,), None, UNIT)}]
    assert vset(out, ps, sd, 1) == {((3,), None, UNIT)}
    assert out.views(ps, sd, 0) == []                            # -1:3 is outside
    assert vset(out, ps, fd, 0) == {((0,), None, UNIT)}
    assert out.views(ps, fd, 1) == []


def test_iota_shift_through_a_broadcast_positions_matrix():
    # seq positions iota(8) broadcast to (batch, seq); dist broadcasts its local
    # iota(4) the same way and adds its rank's start: Iota_Along follows the broadcast
    t = Tiny()
    ps = t.S.op("iota", [], (8,), "int32", {"dimension": 0})
    pbs = t.S.op("broadcast_in_dim", [ps], (2, 8), "int32", {"broadcast_dimensions": (1,)})
    io = t.D.op("iota", [], (4,), "int32", {"dimension": 0})
    iob = t.D.op("broadcast_in_dim", [io], (2, 4), "int32", {"broadcast_dimensions": (1,)})
    off = t.D.op("broadcast_in_dim", [rank_start(t, 4)], (2, 4), "int32", {"broadcast_dimensions": ()})
    pd = t.D.op("add", [iob, off], (2, 4), "int32")
    # a 2-D iota on both sides, counting along dim 1
    qs = t.S.op("iota", [], (2, 8), "int32", {"dimension": 1})
    qi = t.D.op("iota", [], (2, 4), "int32", {"dimension": 1})
    qd = t.D.op("add", [qi, off], (2, 4), "int32")
    out = t.run()
    for r in range(2):
        assert vset(out, pbs, iob, r) == {((0, 0), None, UNIT)}
        assert vset(out, pbs, pd, r) == {((0, 4 * r), None, UNIT)}
        assert vset(out, qs, qd, r) == {((0, 4 * r), None, UNIT)}
