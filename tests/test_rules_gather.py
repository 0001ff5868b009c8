"""gather.dl: XLA gathers on tiny program pairs, in the forms the Neuron files
(the gather of the last token) and JAX's compiled HLO (an embedding lookup)
use. Every derived view is checked numerically on random data, with random
indices (clamped by the gather exactly as XLA does)."""
from rulekit import Tiny, assert_views_hold

from dlverify.ir import Mesh
from dlverify.verdict import Partial

UNIT = (0, 0, 0, 0)
DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def last_token(slice_sizes):
    """The Neuron form: operand [seq, hidden, batch], one index s32[1] picking a
    position along dim 0 (index vector dim implicit), output [1, hidden, batch]."""
    return dict(offset_dims=(1, 2), collapsed_slice_dims=(0,), start_index_map=(0,),
                operand_batching_dims=(), start_indices_batching_dims=(), index_vector_dim=1,
                slice_sizes=slice_sizes, indices_are_sorted=False)


def lookup(width):
    """The JAX form of table[tokens]: table [vocab, width], tokens [b, s, 1]."""
    return dict(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,),
                operand_batching_dims=(), start_indices_batching_dims=(), index_vector_dim=2,
                slice_sizes=(1, width), indices_are_sorted=False)


def test_gather_of_the_last_token_keeps_the_hidden_split():
    t = Tiny()
    xs, xd = t.input((8, 6, 4), (None, "x", None))
    is_, id_ = t.input((1,), (), dtype="int32")
    gs = t.sop("gather", [xs, is_], (1, 6, 4), **last_token((1, 6, 4)))
    gd = t.dop("gather", [xd, id_], (1, 3, 4), **last_token((1, 3, 4)))
    t.output(gs, gd, (None, "x", None))
    out = t.run()
    for r in range(2):
        assert vset(out, gs, gd, r) == {((0, 3 * r, 0), None, UNIT)}
    assert out.result.verified


def test_gather_of_replicated_values():
    t = Tiny()
    xs, xd = t.input((8, 6, 4))
    is_, id_ = t.input((1,), (), dtype="int32")
    gs = t.sop("gather", [xs, is_], (1, 6, 4), **last_token((1, 6, 4)))
    gd = t.dop("gather", [xd, id_], (1, 6, 4), **last_token((1, 6, 4)))
    out = t.run()
    assert all(vset(out, gs, gd, r) == {((0, 0, 0), None, UNIT)} for r in range(2))


def test_embedding_lookup_split_along_the_width_and_the_batch():
    t = Tiny(mesh=Mesh(("a", "b"), (2, 2)))
    es, ed = t.input((10, 6), (None, "b"))
    ts, td = t.input((4, 3, 1), ("a", None, None), dtype="int32")
    gs = t.sop("gather", [es, ts], (4, 3, 6), **lookup(6))
    gd = t.dop("gather", [ed, td], (2, 3, 3), **lookup(3))
    t.output(gs, gd, ("a", None, "b"))
    out = t.run()
    for r in range(4):
        a, b = divmod(r, 2)
        assert vset(out, gs, gd, r) == {((2 * a, 0, 3 * b), None, UNIT)}
    assert out.result.verified


def test_gather_over_a_split_indexed_dim_has_no_view():
    # each rank holds half the positions but indexes them with global indices
    t = Tiny()
    xs, xd = t.input((8, 6, 4), ("x", None, None))
    is_, id_ = t.input((1,), (), dtype="int32")
    gs = t.sop("gather", [xs, is_], (1, 6, 4), **last_token((1, 6, 4)))
    gd = t.dop("gather", [xd, id_], (1, 6, 4), **last_token((1, 6, 4)))
    out = t.run()
    assert out.views(gs, gd) == []


def test_gather_with_other_indices_has_no_view():
    t = Tiny()
    es, ed = t.input((10, 6))
    is_, id_ = t.input((2, 1), (), dtype="int32")
    js, jd = t.input((2, 1), (), dtype="int32")
    rows = lookup(6) | dict(offset_dims=(1,), index_vector_dim=1)
    hs = t.sop("gather", [es, is_], (2, 6), **rows)
    hd = t.dop("gather", [ed, jd], (2, 6), **rows)
    out = t.run()
    assert out.views(hs, hd) == []


def test_gather_of_part_of_a_non_indexed_dim_has_no_view():
    # slice_sizes smaller than a non-indexed dim: the slice starts at 0 on each
    # rank's own block, so the ranks do not read their blocks of the sequential slice
    t = Tiny()
    xs, xd = t.input((8, 6, 4), (None, "x", None))
    is_, id_ = t.input((1,), (), dtype="int32")
    gs = t.sop("gather", [xs, is_], (1, 2, 4), **last_token((1, 2, 4)))
    gd = t.dop("gather", [xd, id_], (1, 2, 4), **last_token((1, 2, 4)))
    out = t.run()
    assert out.views(gs, gd) == []


def test_uncollapsed_indexed_dim_needs_equal_slice_sizes():
    t = Tiny()
    xs, xd = t.input((8, 6), (None, "x"))
    is_, id_ = t.input((1,), (), dtype="int32")
    win = dict(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0,),
               operand_batching_dims=(), start_indices_batching_dims=(), index_vector_dim=1,
               indices_are_sorted=False)
    gs = t.sop("gather", [xs, is_], (1, 3, 6), **win, slice_sizes=(3, 6))
    gd = t.dop("gather", [xd, id_], (1, 3, 3), **win, slice_sizes=(3, 3))
    ws = t.sop("gather", [xs, is_], (1, 2, 6), **win, slice_sizes=(2, 6))
    out = t.run()
    for r in range(2):
        assert vset(out, gs, gd, r) == {((0, 0, 3 * r), None, UNIT)}
    assert out.views(ws, gd) == []   # a 3-row window is not the 2-row one


def test_gather_clamps_the_same_way_on_both_sides():
    # windows of 2 rows out of 3: random indices 0..3 start at 0, 1, 1, 1 after
    # clamping, on both sides alike since the indexed dim is whole on both
    t = Tiny()
    xs, xd = t.input((3, 6), (None, "x"))
    is_, id_ = t.input((5, 1), (), dtype="int32")
    win = dict(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0,),
               operand_batching_dims=(), start_indices_batching_dims=(), index_vector_dim=1,
               indices_are_sorted=False)
    gs = t.sop("gather", [xs, is_], (5, 2, 6), **win, slice_sizes=(2, 6))
    gd = t.dop("gather", [xd, id_], (5, 2, 3), **win, slice_sizes=(2, 3))
    t.output(gs, gd, (None, None, "x"))
    out = t.run()
    assert out.result.verified
    for r in range(2):
        assert vset(out, gs, gd, r) == {((0, 0, 3 * r), None, UNIT)}


def test_gather_carries_partial_sums_to_the_all_reduce():
    t = Tiny()
    xs, xd = t.input((8, 6), (None, "x"))
    ws, wd = t.input((6, 5), ("x", None))
    ys = t.sop("dot_general", [xs, ws], (8, 5), **DOT)
    yd = t.dop("dot_general", [xd, wd], (8, 5), **DOT)
    sop = t.seq.ops[-1].id
    is_, id_ = t.input((2, 1), (), dtype="int32")
    rows = lookup(5) | dict(offset_dims=(1,), index_vector_dim=1)
    gs = t.sop("gather", [ys, is_], (2, 5), **rows)
    gd = t.dop("gather", [yd, id_], (2, 5), **rows)
    ad = t.dop("all_reduce", [gd], (2, 5), reducer="sum", groups=[[0, 1]])
    t.output(gs, ad)
    out = t.run()
    for r in range(2):
        assert vset(out, gs, gd, r) == {((0, 0), Partial(0, sop, 0, 3 * r, 3 * r + 3), UNIT)}
    assert out.result.verified


def test_jaxpr_gather_meets_the_same_rules():
    """x[i] in a shard_map program: the jaxpr exporter emits the IR gather the HLO
    frontend emits, so one rule serves both; jnp.take's default fill mode (out-of-range
    rows become NaN) is the clamping gather and a select on its in-bounds mask."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh as JMesh, PartitionSpec as P

    import dlverify

    mesh = JMesh(np.array(jax.devices()[:2]), ("x",))
    args = (jax.ShapeDtypeStruct((10, 6), jnp.float32), jax.ShapeDtypeStruct((2, 3), jnp.int32))

    def lookup_tanh(e, t):
        return jnp.tanh(e[t])

    dist = jax.jit(jax.shard_map(lookup_tanh, mesh=mesh, in_specs=(P(None, "x"), P()),
                                 out_specs=P(None, None, "x")))
    res = dlverify.verify_jax(lookup_tanh, dist, *args)
    assert res.verified and res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 2)"]
    assert_views_hold(res.problem, res.views)

    # jnp.take's default mode fills out-of-range rows with NaN: the clamped gather and
    # a select on the in-bounds mask (frontends/jaxpr/primitives.py). NaN equals
    # nothing, so the lookup of any int32 id is not proved; with the ids clipped into
    # range the mask folds to true (dlverify/index_ranges.py) and it verifies.
    def take(e, t):
        return jnp.take(e, t, axis=0)

    def take_clipped(e, t):
        return jnp.take(e, jnp.clip(t, 0, 9), axis=0)

    for fn, verified in ((take, False), (take_clipped, True)):
        dist = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(None, "x"), P()),
                                     out_specs=P(None, None, "x")))
        res = dlverify.verify_jax(fn, dist, *args)
        assert res.verified == verified
        assert_views_hold(res.problem, res.views)
