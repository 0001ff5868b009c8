"""all_gather and psum_scatter with tiled=False (frontends/jaxpr/primitives.py): a
new stacked dim, exported as the tiled collective of a size-1 dim and a reshape,
so the collective rules serve both. Each case is checked numerically
(rulekit.assert_views_hold); the buggy twins stack or scatter the wrong dim."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh as JMesh, PartitionSpec as P

import dlverify
from rulekit import assert_views_hold


def _mesh():
    return JMesh(np.array(jax.devices()[:2]), ("x",))


def _verify(seq, local, args, in_specs, out_specs):
    dist = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=in_specs, out_specs=out_specs,
                                 check_vma=False))
    res = dlverify.verify_jax(seq, dist, *args)
    assert_views_hold(res.problem, res.views)
    return res


def test_untiled_all_gather_stacks_the_blocks():
    args = (jax.ShapeDtypeStruct((8, 3), jnp.float32),)

    def seq(x):
        return jnp.tanh(x.reshape(2, 4, 3))

    def stacked(x):   # (2, 4, 3): block r at index r of the new dim 0
        return jnp.tanh(jax.lax.all_gather(x, "x", axis=0, tiled=False))

    def stacked_inner(x):   # (4, 2, 3) read as (2, 4, 3): the blocks' rows interleave
        return jnp.tanh(jax.lax.all_gather(x, "x", axis=1, tiled=False).reshape(2, 4, 3))

    res = _verify(seq, stacked, args, (P("x"),), P())
    assert res.verified, [f.message for f in res.failures]
    assert not _verify(seq, stacked_inner, args, (P("x"),), P()).verified


def test_untiled_psum_scatter_keeps_one_row_per_rank():
    args = (jax.ShapeDtypeStruct((2, 6), jnp.float32), jax.ShapeDtypeStruct((6, 2), jnp.float32))

    def seq(x, w):
        return (x @ w).reshape(4)

    def rows(x, w):   # rank r: row r of the summed product
        return jax.lax.psum_scatter(x @ w, "x", scatter_dimension=0, tiled=False)

    def cols(x, w):   # rank r: column r
        return jax.lax.psum_scatter(x @ w, "x", scatter_dimension=1, tiled=False)

    specs = (P(None, "x"), P("x", None))
    res = _verify(seq, rows, args, specs, P("x"))
    assert res.verified, [f.message for f in res.failures]
    assert not _verify(seq, cols, args, specs, P("x")).verified


def test_untiled_all_gather_of_per_rank_scalars():
    # each rank's sum of its rows, stacked: the sequential sums of the row blocks
    args = (jax.ShapeDtypeStruct((8, 3), jnp.float32),)

    def seq(x):
        return jnp.stack([jnp.sum(x[:4]), jnp.sum(x[4:])])

    def sums(x):
        return jax.lax.all_gather(jnp.sum(x), "x", tiled=False)

    def sums_twice(x):   # the sum over all ranks on every rank, stacked: not the blocks' sums
        return jax.lax.all_gather(jax.lax.psum(jnp.sum(x), "x"), "x", tiled=False)

    res = _verify(seq, sums, args, (P("x"),), P())
    assert res.verified, [f.message for f in res.failures]
    assert not _verify(seq, sums_twice, args, (P("x"),), P()).verified
