"""A scalar added to a partial sum on every rank (pytorch/pytorch #163193).

Adding a Python scalar to a DTensor with a Partial(sum) placement added it on
every rank, so after the reduction the result carried tp times the scalar.
The same mistake in a hand-written program: adaLN-style modulation
x * (1 + c @ w_mod) with w_mod row-parallel, where the `1 +` is applied to
each rank's partial product before the psum.

Cases: the correct modulation (TP=4; the scalar added after the psum) and the
buggy twin.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
BATCH, D, C = 4, 8, 16


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, D), f32),   # x
            jax.ShapeDtypeStruct((BATCH, C), f32),   # c: conditioning
            jax.ShapeDtypeStruct((C, D), f32))       # w_mod


def _dist(local_fn):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP),
                                 in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P()))


def modulate_seq(x, c, w_mod):
    return x * (1.0 + c @ w_mod)


def modulate_local(x, c, w_mod):
    scale = 1.0 + jax.lax.psum(c @ w_mod, "tp")     # row-parallel: complete after the psum
    return x * scale


@dlverify.case
def pytorch163193_scalar_on_partial():
    return dlverify.Case(
        seq=modulate_seq, dist=_dist(modulate_local), args=_args(), expect="verified",
        description="modulation x * (1 + c @ w_mod), w_mod row-parallel, 1 added after the psum; TP=4")


def modulate_local_bug(x, c, w_mod):
    """pytorch #163193: the scalar is added to every rank's partial sum."""
    scale = jax.lax.psum(1.0 + c @ w_mod, "tp")  # BUG: 1.0 added on every rank
    return x * scale


@dlverify.case
def pytorch163193_scalar_on_partial_bug():
    return dlverify.Case(
        seq=modulate_seq, dist=_dist(modulate_local_bug), args=_args(), expect="bug",
        description="pytorch #163193: scalar added to a partial sum on every rank")
