"""The norm of a partial tensor taken per rank (pytorch/pytorch PR #159856).

`linalg_vector_norm` / `_foreach_norm` on a DTensor with a Partial(sum)
placement returned the sum of the ranks' local norms instead of the norm of
the sum. The same mistake in a hand-written program: an L2-normalised
projection head, y = h @ w row-parallel, out = y / ||y||, whose norm is taken
of each rank's partial product and the norms summed.

Cases: the correct head (TP=4; the norm of the completed y) and the buggy twin.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
BATCH, F, D = 4, 16, 8


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, F), f32),   # h
            jax.ShapeDtypeStruct((F, D), f32))       # w


def _dist(local_fn):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP), in_specs=(P(None, "tp"), P("tp", None)),
                                 out_specs=P()))


def l2_head_seq(h, w):
    y = h @ w
    return y / jnp.linalg.norm(y, axis=-1, keepdims=True)


def l2_head_local(h, w):
    y = jax.lax.psum(h @ w, "tp")
    return y / jnp.linalg.norm(y, axis=-1, keepdims=True)


@dlverify.case
def pytorch159856_norm_of_partial():
    return dlverify.Case(
        seq=l2_head_seq, dist=_dist(l2_head_local), args=_args(), expect="verified",
        description="L2-normalised row-parallel projection, norm of the completed sum; TP=4")


def l2_head_local_bug(h, w):
    """pytorch PR #159856: the norm of each rank's partial sum, summed over ranks."""
    y = h @ w                                              # partial sum on this rank
    norm = jax.lax.psum(jnp.linalg.norm(y, axis=-1, keepdims=True), "tp")  # BUG: norm of a partial sum, per rank
    return jax.lax.psum(y, "tp") / norm


@dlverify.case
def pytorch159856_norm_of_partial_bug():
    return dlverify.Case(
        seq=l2_head_seq, dist=_dist(l2_head_local_bug), args=_args(), expect="bug",
        description="pytorch PR #159856: vector norm of a partial tensor taken per rank")
