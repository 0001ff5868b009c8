"""reduce_squeeze.dl and its pairing in layout_algebra.dl: reductions whose axes
differ by dims the distributed operand holds with size 1 (one position per rank:
JAX's transpose of a broadcast reduces the batch only and keeps the local
position dim, the sequential side reduces batch and positions).

Every view a tiny program derives is checked numerically (rulekit: complete views
exactly, partial terms by summing the tiling ranks' terms); each buggy JAX twin
must not verify, with its first failure at the `# BUG` line."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax, verify_problem
from dlverify.reports.explain import explain
from dlverify.schema import REDUCER_MAX, REDUCER_SUM
from dlverify.verdict import Partial

UNIT = (0, 0, 0, 0)
DOT = dict(lhs_contract=(2,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def op_of(graph, t):
    return next(op.id for op in graph.ops if op.output == t)


def positions_per_rank(seq=("reduce_sum", (0, 1), (4,)), dist=("reduce_sum", (0,), (1, 4))):
    """Two ranks, one position each: x (2, 2, 4) split along the positions, reduced by
    seq and dist = (kind, axes, result shape); by default the batch-and-positions sum
    and the batch-only sum that keeps the local position."""
    t = Tiny()
    xs, xd = t.input((2, 2, 4), (None, "x", None))
    (sk, sa, ss), (dk, da, ds) = seq, dist
    return t, t.sop(sk, [xs], ss, axes=sa), t.dop(dk, [xd], ds, axes=da)


def completed(t, s, zd, reducer="sum"):
    """zd combined over both ranks, declared the output equal to s; the derived views."""
    ad = t.dop("all_reduce", [zd], t.dist.tensors[zd].shape, reducer=reducer, groups=[[0, 1]])
    t.output(s, ad)
    return ad, t.run()


def term(reducer, op, r):
    """Rank r's term: range [r, r+1) of the seq reduction's axis 1 (the positions)."""
    return Partial(reducer, op, 1, r, r + 1)


# ---------------------------------------------------------------- derived views

def test_batch_sum_keeping_the_local_position_is_a_term_of_the_full_sum():
    # JAX's pattern: dist sum over the batch (1, 4), reshaped to (1, 1, 4) and summed
    # over the ranks; seq sum over batch and positions (4,), reshaped to (1, 1, 4)
    t, ys, yd = positions_per_rank()
    zs = t.sop("reshape", [ys], (1, 1, 4))
    zd = t.dop("reshape", [yd], (1, 1, 4))
    ad, out = completed(t, zs, zd)
    for r in range(2):
        assert vset(out, zs, zd, r) == {((0, 0, 0), term(REDUCER_SUM, op_of(t.seq, ys), r), UNIT)}
        assert vset(out, zs, ad, r) == {((0, 0, 0), None, UNIT)}
    assert out.result.verified


def test_chain_ending_in_the_squeezed_shape_is_the_squeezed_value():
    # dist (1, 4) reshaped to (4,): the squeezed value itself, a term of the seq sum
    t, ys, yd = positions_per_rank()
    zd = t.dop("reshape", [yd], (4,))
    _, out = completed(t, ys, zd)
    for r in range(2):
        assert vset(out, ys, zd, r) == {((0,), term(REDUCER_SUM, op_of(t.seq, ys), r), UNIT)}
    assert out.result.verified


def test_max_over_the_batch_keeping_the_local_position():
    t, ys, yd = positions_per_rank(("reduce_max", (0, 1), (4,)), ("reduce_max", (0,), (1, 4)))
    zs = t.sop("reshape", [ys], (1, 4))
    zd = t.dop("reshape", [yd], (1, 4))          # a chain that moves nothing
    _, out = completed(t, zs, zd, reducer="max")
    for r in range(2):
        assert vset(out, zs, zd, r) == {((0, 0), term(REDUCER_MAX, op_of(t.seq, ys), r), UNIT)}
    assert out.result.verified


def test_reshapes_after_the_sums_pair_by_the_sequential_groups():
    # seq (4,) -> (2, 2); dist (1, 4) -> (2, 2): one group, the size-1 dim free in it
    t, ys, yd = positions_per_rank()
    zs = t.sop("reshape", [ys], (2, 2))
    zd = t.dop("reshape", [yd], (2, 2))
    wd = t.dop("reshape", [yd], (4, 1))          # not a block of (2, 2): no view
    out = t.run()
    for r in range(2):
        assert vset(out, zs, zd, r) == {((0, 0), term(REDUCER_SUM, op_of(t.seq, ys), r), UNIT)}
    assert out.views(zs, wd) == []


def test_a_size1_dim_only_the_distributed_side_reduces():
    # seq sums the batch of (2, 2, 4) -> (2, 4); dist sums batch and its one position
    # -> (4,): row r of the seq sum, a complete block once the dim is back
    t, ys, yd = positions_per_rank(("reduce_sum", (0,), (2, 4)), ("reduce_sum", (0, 1), (4,)))
    ws = t.sop("reshape", [ys], (2, 2, 2))
    zd = t.dop("reshape", [yd], (1, 4))          # the squeezed shape
    wd = t.dop("reshape", [yd], (1, 2, 2))       # pairs with the seq reshape
    out = t.run()
    for r in range(2):
        assert vset(out, ys, zd, r) == {((r, 0), None, UNIT)}
        assert vset(out, ws, wd, r) == {((r, 0, 0), None, UNIT)}


def test_a_partial_operand_summed_whole_keeps_its_tag():
    # the operand is a partial term of a dot (K split over the ranks); the seq sums
    # batch and a global size-1 dim, the dist the batch only
    t = Tiny()
    as_, ad_ = t.input((2, 1, 4), (None, None, "x"))
    bs, bd = t.input((4, 3), ("x", None))
    ts = t.sop("dot_general", [as_, bs], (2, 1, 3), **DOT)
    td = t.dop("dot_general", [ad_, bd], (2, 1, 3), **DOT)
    ys = t.sop("reduce_sum", [ts], (3,), axes=(0, 1))
    zd = t.dop("reshape", [t.dop("reduce_sum", [td], (1, 3), axes=(0,))], (3,))
    _, out = completed(t, ys, zd)
    dot = op_of(t.seq, ts)
    for r in range(2):
        assert vset(out, ys, zd, r) == {((0,), Partial(REDUCER_SUM, dot, 0, 2 * r, 2 * r + 2), UNIT)}
    assert out.result.verified


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH")
def test_souffle_derives_the_same_views():
    t, ys, yd = positions_per_rank()
    zs = t.sop("reshape", [ys], (1, 1, 4))
    zd = t.dop("reshape", [yd], (1, 1, 4))
    wd = t.dop("reshape", [yd], (4,))
    _, out = completed(t, zs, zd)
    res = verify_problem(t.problem(), engine="souffle")
    assert res.verified and set(res.views) == set(out.result.views)
    assert out.views(zs, zd) and out.views(ys, wd)


# ---------------------------------------------------------------- no view

def test_reducers_must_agree():
    t, ys, yd = positions_per_rank(dist=("reduce_max", (0,), (1, 4)))
    zd = t.dop("reshape", [yd], (4,))
    assert t.run().views(ys, zd) == []


def test_a_dim_only_one_side_reduces_must_have_size1_locally():
    # dist sums the features (4 on the rank) where the seq sums the batch: no pair
    t = Tiny()
    xs, xd = t.input((4, 2, 4), (None, "x", None))
    ys = t.sop("reduce_sum", [xs], (4,), axes=(0, 1))
    yd = t.dop("reduce_sum", [xd], (4, 1), axes=(2,))
    zd = t.dop("reshape", [yd], (4,))
    assert t.run().views(ys, zd) == []


# ---------------------------------------------------------------- JAX programs

def _mesh(n=2):
    return JMesh(np.array(jax.devices()[:n]), ("tp",))


def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _sum_batch_positions(x):
    return jnp.sum(x, axis=(0, 1))


def _batch_sum_then_psum(x):      # (B, 1, D) -> (1, D) -> (D,), summed over the ranks
    return jax.lax.psum(jnp.sum(x, axis=0).reshape(-1), "tp")


def _missing_psum(x):
    return jnp.sum(x, axis=0).reshape(-1)   # BUG: the ranks' positions are never summed


def _sums_the_features(x):
    return jax.lax.psum(jnp.sum(x, axis=2).reshape(-1), "tp")   # BUG: sums D, keeps the batch


def _pmax_not_psum(x):
    return jax.lax.pmax(jnp.sum(x, axis=0).reshape(-1), "tp")   # BUG: max of the ranks' sums


SPECS = dict(in_specs=P(None, "tp", None), out_specs=P(), check_vma=False)


def test_weight_gradient_with_one_position_per_rank_verifies_and_is_explained():
    # JAX's own transpose (the norm-weight gradient of issue 10) and the hand-written sum
    def grad_w(x, w):
        return jax.grad(lambda w: jnp.sum(x * w))(w)
    dist = jax.jit(jax.shard_map(grad_w, mesh=_mesh(), in_specs=(P(None, "tp", None), P()),
                                 out_specs=P()))
    res = verify_jax(grad_w, dist, _sds(2, 2, 4), _sds(4), engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:3]]
    for rank in range(2):
        lines = explain(res, "out0", rank)
        assert any("reduce_squeeze.dl" in line for line in lines), lines
        assert any("input relation" in line for line in lines), lines
    dist = jax.jit(jax.shard_map(_batch_sum_then_psum, mesh=_mesh(), **SPECS))
    res = verify_jax(_sum_batch_positions, dist, _sds(4, 2, 4), engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:3]]


@pytest.mark.parametrize("local", [_missing_psum, _sums_the_features, _pmax_not_psum],
                         ids=["missing_psum", "sums_the_features", "pmax"])
def test_buggy_twin_is_not_verified_and_is_located(local):
    dist = jax.jit(jax.shard_map(local, mesh=_mesh(), **SPECS))
    x = np.random.default_rng(0).standard_normal((4, 2, 4)).astype(np.float32)
    assert np.max(np.abs(np.asarray(_sum_batch_positions(x)) - np.asarray(dist(x)))) > 1e-3
    res = verify_jax(_sum_batch_positions, dist, _sds(4, 2, 4), engine="clingo")
    assert not res.verified
    lines = {fr.line for f in res.failures[:1] for fr in f.frames}
    assert bug_line(local) in lines, [(f.op, f.line, f.message) for f in res.failures[:3]]
