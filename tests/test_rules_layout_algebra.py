"""layout_algebra.dl, padding.dl, update.dl: reshapes with free size-1 dims,
sequential-only broadcasts of size-1 dims, pad, dynamic_update_slice.

Every view a tiny program derives is checked numerically (rulekit); each family
has a buggy JAX twin that must not verify, with its first failure at the
`# BUG` line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax
from dlverify.ir import Mesh
from dlverify.layout_algebra import reshape_chain, reshape_cuts, ReshapeGroup
from dlverify.partial_tags import MASK_BASE, WINDOW_BASE
from dlverify.verdict import Partial

UNIT = (0, 0, 0, 0)
DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def iconst(b, value):
    return b.constant(np.asarray(value, dtype=np.int32), (), "int32")


def rank_start(t, mul, add=0):
    i = t.D.op("axis_index", [], (), "int32", {"axis": "x"})
    v = t.D.op("mul", [i, iconst(t.D, mul)], (), "int32")
    return t.D.op("add", [v, iconst(t.D, add)], (), "int32") if add else v


def psum(t, x, shape, n=2):
    return t.dop("all_reduce", [x], shape, reducer="sum", groups=[list(range(n))])


# ---------------------------------------------------------------- groups and cuts

def test_groups_put_size1_dims_alone_and_cuts_list_every_equal_prefix():
    assert reshape_chain((4, 8), (4, 4, 2)) == [ReshapeGroup(0, 1, 0, 1), ReshapeGroup(1, 2, 1, 3)]
    assert reshape_chain((4, 1, 8), (4, 8)) == [
        ReshapeGroup(0, 1, 0, 1), ReshapeGroup(1, 2, 1, 1), ReshapeGroup(2, 3, 1, 2)]
    assert reshape_chain((6, 4), (4, 6)) == [ReshapeGroup(0, 2, 0, 2)]
    assert reshape_chain((3,), (4,)) is None
    assert set(reshape_cuts((4, 2), (4, 1, 2))) == {(0, 0), (1, 1), (1, 2), (2, 3)}


# ---------------------------------------------------------------- reshape

def test_split_with_a_size1_local_head_dim():
    # one head per rank: (4, 2) -> (4, 1, 2) pairs with (4, 8) -> (4, 4, 2)
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((4, 8), (None, "x"))
    hs = t.sop("reshape", [xs], (4, 4, 2))
    hd = t.dop("reshape", [xd], (4, 1, 2))
    ms = t.sop("reshape", [hs], (4, 8))          # and merged back
    md = t.dop("reshape", [hd], (4, 2))
    out = t.run()
    for r in range(4):
        assert vset(out, hs, hd, r) == {((0, r, 0), None, UNIT)}
        assert vset(out, ms, md, r) == {((0, 2 * r), None, UNIT)}


def test_a_block_inside_one_row_of_a_split():
    # rank r holds x[2r:2r+2] of 8 = 2 x 4: row r // 2, columns 2 (r % 2) .. +2
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((8,), ("x",))
    ys = t.sop("reshape", [xs], (2, 4))
    yd = t.dop("reshape", [xd], (1, 2))
    out = t.run()
    for r in range(4):
        assert vset(out, ys, yd, r) == {((r // 2, 2 * (r % 2)), None, UNIT)}


def test_boxes_that_are_not_contiguous_have_no_view():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    fs = t.sop("reshape", [xs], (24,))           # rank 1's columns 3:6 are not one range
    fd = t.dop("reshape", [xd], (12,))
    gs = t.sop("reshape", [xs], (4, 3, 2))       # heads of 2: 3 columns straddle heads
    gd = t.dop("reshape", [xd], (4, 3, 1))
    out = t.run()
    assert out.views(fs, fd) == [] and out.views(gs, gd) == []


def test_reduce_over_size1_dims_then_broadcast_back_is_a_reshape():
    # JAX's transpose of a broadcast whose local operand has a size-1 dim
    t = Tiny(mesh=Mesh(("x",), (4,)))
    ns, nd = t.input((2, 4, 1), (None, "x", None))
    qs = t.sop("reduce_sum", [ns], (2, 4), axes=(2,))
    sd = t.dop("reduce_sum", [nd], (2,), axes=(1, 2))
    td = t.dop("broadcast_in_dim", [sd], (2, 1), broadcast_dimensions=(0,))
    same = t.dop("reshape", [td], (2, 1, 1))     # back to the start's shape: the start itself
    out = t.run()
    for r in range(4):
        assert vset(out, qs, td, r) == {((0, r), None, UNIT)}
        assert vset(out, ns, same, r) == {((0, r, 0), None, UNIT)}


def test_reduce_over_a_dim_the_sequential_side_does_not_reduce_has_no_view():
    t = Tiny()
    xs, xd = t.input((2, 4), (None, "x"))
    zs = t.sop("reshape", [xs], (2, 4, 1))
    zd = t.dop("reduce_sum", [xd], (2,), axes=(1,))   # sums 2 elements: not a reshape
    wd = t.dop("broadcast_in_dim", [zd], (2, 1, 1), broadcast_dimensions=(0,))
    out = t.run()
    assert out.views(zs, wd) == []


def test_chain_ending_in_a_broadcast_that_expands():
    # dist (2,1,8,1) -reduce over size-1 dims-> (2,8) -insert size 1-> (2,1,8)
    # -expand a new dim-> (2,1,8,8); seq (2,4,8,1) -> (2,4,8) -> (2,4,8,8)
    t = Tiny(mesh=Mesh(("x",), (4,)))
    ns, nd = t.input((2, 4, 8, 1), (None, "x", None, None))
    qs = t.sop("reduce_sum", [ns], (2, 4, 8), axes=(3,))
    rs = t.sop("broadcast_in_dim", [qs], (2, 4, 8, 8), broadcast_dimensions=(0, 1, 2))
    hd = t.dop("reduce_sum", [nd], (2, 8), axes=(1, 3))
    sd = t.dop("broadcast_in_dim", [hd], (2, 1, 8), broadcast_dimensions=(0, 2))
    jd = t.dop("broadcast_in_dim", [sd], (2, 1, 8, 8), broadcast_dimensions=(0, 1, 2))
    half = t.dop("broadcast_in_dim", [sd], (2, 1, 8, 4), broadcast_dimensions=(0, 1, 2))
    # expanding a dim the sequential side does not expand: no view
    es = t.sop("reshape", [ns], (2, 4, 8))
    ed = t.dop("broadcast_in_dim", [hd], (2, 4, 8), broadcast_dimensions=(0, 2))
    out = t.run()
    for r in range(4):
        assert vset(out, qs, sd, r) == {((0, r, 0), None, UNIT)}
        assert vset(out, rs, jd, r) == {((0, r, 0, 0), None, UNIT)}
        assert vset(out, rs, half, r) == {((0, r, 0, -1), None, UNIT)}
        assert out.views(es, ed, r) == []


# ---------------------------------------------------------------- sequential-only broadcast

def test_sequential_broadcast_of_a_size1_dim_the_local_operand_already_has():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((4, 8), ("x", None))
    cs, cd = t.input((1, 8))
    bs = t.sop("broadcast_in_dim", [cs], (4, 8), broadcast_dimensions=(0, 1))
    ys = t.sop("mul", [xs, bs], (4, 8))
    yd = t.dop("mul", [xd, cd], (1, 8))
    out = t.run()
    for r in range(4):
        assert vset(out, bs, cd, r) == {((-1, 0), None, UNIT)}
        assert vset(out, ys, yd, r) == {((r, 0), None, UNIT)}


# ---------------------------------------------------------------- pad

def _pad(t, side, x, value, cfg, shape):
    b = t.S if side == "s" else t.D
    v = b.constant(np.asarray(value, dtype=np.float32), (), "float32")
    return b.op("pad", [x, v], shape, "float32", {"padding_config": cfg})


def test_pad_of_an_unsharded_dim_keeps_the_block_and_zero_padding_keeps_terms():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    cfg = ((0, 0, 0), (1, 2, 0))
    ps = _pad(t, "s", xs, 0.0, cfg, (8, 7))
    pd = _pad(t, "d", xd, 0.0, cfg, (4, 7))
    os_ = _pad(t, "s", xs, 1.0, cfg, (8, 7))         # another value: still a block
    od = _pad(t, "d", xd, 1.0, cfg, (4, 7))
    ws, wd = t.input((6, 8), (None, "x"))            # a partial term, zero-padded
    ys = t.sop("dot_general", [ws, xs], (6, 4), **DOT)
    yd = t.dop("dot_general", [wd, xd], (6, 4), **DOT)
    qs = _pad(t, "s", ys, 0.0, cfg, (6, 7))
    qd = _pad(t, "d", yd, 0.0, cfg, (6, 7))
    q1s = _pad(t, "s", ys, 1.0, cfg, (6, 7))         # padding a term with 1: not linear
    q1d = _pad(t, "d", yd, 1.0, cfg, (6, 7))
    out = t.run()
    dot = t.seq.ops[[o.output for o in t.seq.ops].index(ys)].id
    for r in range(2):
        # (also the mask family's terms of the columns it holds: update.dl reads the
        # pad as an update into zeros, now that the block of x is one of ps, halo.dl)
        assert {v for v in vset(out, ps, pd, r) if v[1] is None} == {((4 * r, 0), None, UNIT)}
        assert vset(out, os_, od, r) == {((4 * r, 0), None, UNIT)}
        assert vset(out, qs, qd, r) == {((0, 0), Partial(0, dot, 0, 4 * r, 4 * r + 4), UNIT)}
        assert out.views(q1s, q1d, r) == []


def test_pad_of_a_sharded_dim_is_a_block_only_where_it_adds_padding():
    t = Tiny()
    xs, xd = t.input((8, 4), ("x", None))
    ps = _pad(t, "s", xs, 0.0, ((1, 0, 0), (0, 0, 0)), (9, 4))
    pd = _pad(t, "d", xd, 0.0, ((1, 0, 0), (0, 0, 0)), (5, 4))   # each rank pads its block
    qs = _pad(t, "s", xs, 0.0, ((0, 0, 0), (1, 0, 0)), (8, 5))
    qd = _pad(t, "d", xd, 0.0, ((0, 0, 0), (0, 1, 0)), (4, 5))   # the other side
    out = t.run()
    # Rank 0's own zero row is the sequential padding row (halo.dl's extend rule: the
    # rows it adds lie in the padding), so its block is rows [0, 5); rank 1's zero row
    # would be row 4 of x: not a block (only the mask family's terms of rows 5..8,
    # update.dl). Padding the other side of dim 1 is never one.
    assert {v.offsets for v in out.views(ps, pd, 0) if v.complete} == {(0, 0)}
    assert [v for v in out.views(ps, pd, 1) if v.complete] == [] and out.views(qs, qd) == []


# ---------------------------------------------------------------- dynamic_update_slice

def _zeros(b, shape):
    return b.constant(np.zeros(shape, dtype=np.float32), shape, "float32")


def _dus(b, z, u, starts, shape):
    return b.op("dynamic_update_slice", [z, u, *starts], shape, "float32", {})


def test_update_into_zeros_is_a_masked_term_that_psum_completes():
    t = Tiny()
    gs, gd = t.input((8, 4), ("x", None))
    ys = t.sop("neg", [gs], (8, 4))
    yd = t.dop("neg", [gd], (4, 4))
    ud = _dus(t.D, _zeros(t.D, (8, 4)), yd, [rank_start(t, 4), iconst(t.D, 0)], (8, 4))
    sd = psum(t, ud, (8, 4))
    out = t.run()
    neg = t.seq.ops[-1].id
    for r in range(2):
        assert vset(out, ys, ud, r) == {((0, 0), Partial(0, neg, MASK_BASE, 4 * r, 4 * r + 4), UNIT)}
        assert vset(out, ys, sd, r) == {((0, 0), None, UNIT)}


def test_update_uses_clamped_starts_and_a_wrong_window_is_refused():
    t = Tiny()
    gs, gd = t.input((8, 4), ("x", None))
    ys = t.sop("neg", [gs], (8, 4))
    yd = t.dop("neg", [gd], (4, 4))
    zero = iconst(t.D, 0)
    # starts 8 and 12 both clamp to 4: rank 0 writes its rows at 4, rank 1 at 4
    ud = _dus(t.D, _zeros(t.D, (8, 4)), yd, [rank_start(t, 4, add=8), zero], (8, 4))
    # rank r writes at 4 (1 - r): swapped rows
    wd = _dus(t.D, _zeros(t.D, (8, 4)), yd, [t.D.op("sub", [iconst(t.D, 4), rank_start(t, 4)], (), "int32"),
                                               zero], (8, 4))
    sw = psum(t, wd, (8, 4))
    out = t.run()
    neg = t.seq.ops[-1].id
    assert out.views(ys, ud, 0) == []
    assert vset(out, ys, ud, 1) == {((0, 0), Partial(0, neg, MASK_BASE, 4, 8), UNIT)}
    assert out.views(ys, wd) == [] and out.views(ys, sw) == []


def test_update_matched_with_a_sequential_update_into_zeros():
    t = Tiny()
    gs, gd = t.input((4, 3), ("x", None))
    zs = t.sop("dynamic_update_slice", [_zeros(t.S, (6, 3)), gs, iconst(t.S, 1), iconst(t.S, 0)], (6, 3))
    ud = _dus(t.D, _zeros(t.D, (6, 3)), gd, [rank_start(t, 2, add=1), iconst(t.D, 0)], (6, 3))
    sd = psum(t, ud, (6, 3))
    out = t.run()
    dus = t.seq.ops[-1].id
    for r in range(2):
        assert vset(out, zs, ud, r) == {((0, 0), Partial(0, dus, WINDOW_BASE, 2 * r, 2 * r + 2), UNIT)}
        assert vset(out, zs, sd, r) == {((0, 0), None, UNIT)}


def test_an_update_as_large_as_its_operand_is_the_update():
    t = Tiny()
    gs, gd = t.input((4, 3), ("x", None))
    zs = t.sop("dynamic_update_slice", [_zeros(t.S, (4, 3)), gs, iconst(t.S, 0), iconst(t.S, 0)], (4, 3))
    ud = _dus(t.D, _zeros(t.D, (2, 3)), gd, [iconst(t.D, 5), iconst(t.D, 0)], (2, 3))
    out = t.run()
    for r in range(2):
        assert vset(out, zs, gd, r) == {((2 * r, 0), None, UNIT)}
        assert vset(out, gs, ud, r) == {((2 * r, 0), None, UNIT)}


# ---------------------------------------------------------------- buggy twins (JAX)

def _mesh(n):
    return JMesh(np.array(jax.devices()[:n]), ("tp",))


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _heads_merged_local(x):
    return x.reshape(-1)   # BUG: merging a sharded minor dim moves the shard boundary


def _pad_wrong_side(x):
    return jnp.pad(x, ((0, 0), (0, 1)))   # BUG: the sequential program pads before


def _update_wrong_rows(table, g):
    r = jax.lax.axis_index("tp")

    def f(t):
        return jnp.sum(jax.lax.dynamic_slice_in_dim(t, (1 - r) * 4, 4) * g)   # BUG: the other rank's rows
    return jax.grad(f)(table)


def _reduce_keepdims_wrong_dim(x):
    return jnp.sum(x, axis=-2, keepdims=True) * x   # BUG: sums the head dim (local size 1), not the last


TWINS = [
    ("reshape", lambda x: x.reshape(-1), _heads_merged_local,
     dict(in_specs=P(None, "tp"), out_specs=P("tp")), (_sds(4, 8),), 4),
    ("pad", lambda x: jnp.pad(x, ((0, 0), (1, 0))), _pad_wrong_side,
     dict(in_specs=P("tp", None), out_specs=P("tp", None)), (_sds(8, 4),), 2),
    ("dynamic_update_slice", lambda table, g: g, _update_wrong_rows,
     dict(in_specs=(P(), P("tp")), out_specs=P()), (_sds(8, 4), _sds(8, 4)), 2),
    ("size1_reduce", lambda x: jnp.sum(x, axis=-1, keepdims=True) * x, _reduce_keepdims_wrong_dim,
     dict(in_specs=P(None, "tp", None), out_specs=P(None, "tp", None)), (_sds(2, 4, 8),), 4),
]


@pytest.mark.parametrize("name,seq,local,specs,args,n", TWINS, ids=[t[0] for t in TWINS])
def test_buggy_twin_is_not_verified_and_is_located(name, seq, local, specs, args, n):
    dist = jax.jit(jax.shard_map(local, mesh=_mesh(n), **specs))
    xs = [np.random.default_rng(0).standard_normal(a.shape).astype(np.float32) for a in args]
    assert np.max(np.abs(np.asarray(seq(*xs)) - np.asarray(dist(*xs)))) > 1e-3   # really buggy
    res = verify_jax(seq, dist, *args, engine="clingo")
    assert not res.verified
    lines = {fr.line for f in res.failures[:1] for fr in f.frames}
    assert bug_line(local) in lines, [(f.op, f.line, f.message) for f in res.failures[:3]]
