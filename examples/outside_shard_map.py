"""Distributed programs that do work outside their shard_map, as real training
code does: reshape and scale the inputs first (closing over a constant array),
run the tensor-parallel part in shard_map, post-process the global result.

dlverify models the global code as run by every rank, the shard_map entry as
each rank taking its block of each operand (per in_specs) and the exit as
gathering the blocks (per out_specs); the closed-over array is related to the
sequential program's equal constant by value.

Cases: an MLP whose input arrives flattened and is reshaped and scaled before
shard_map, with a tanh and a sum over the batch after it; a variant returning
the row-parallel output sharded over 'tp' (out_specs P(None, 'tp')) that is
reduced outside. Buggy twins: the post-processing reads only the first rank's
block, and the scale array closed over differs from the reference's.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import dlverify

BATCH, D_MODEL, D_FF, TP = 8, 16, 32, 2
SCALE = np.linspace(0.5, 1.5, D_MODEL).astype(np.float32)


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH * D_MODEL,), f32),   # x, flattened
        jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),      # w1
        jax.ShapeDtypeStruct((D_FF, D_MODEL), f32),      # w2
    )


def _mesh():
    return dlverify.host_mesh((TP,), ("tp",))


def mlp_seq(x, w1, w2):
    h = x.reshape(BATCH, D_MODEL) * SCALE
    return jnp.tanh(jax.nn.gelu(h @ w1) @ w2).sum(axis=0)


def mlp_local(h, w1, w2):
    return jax.lax.psum(jax.nn.gelu(h @ w1) @ w2, "tp")


def _mlp_dist():
    mlp = jax.shard_map(mlp_local, mesh=_mesh(), in_specs=(P(), P(None, "tp"), P("tp", None)),
                        out_specs=P())

    @jax.jit
    def dist(x, w1, w2):
        h = x.reshape(BATCH, D_MODEL) * SCALE      # before shard_map, closing over SCALE
        return jnp.tanh(mlp(h, w1, w2)).sum(axis=0)  # after it, on the global result
    return dist


@dlverify.case
def outside_pre_and_post():
    return dlverify.Case(
        seq=mlp_seq, dist=_mlp_dist(), args=_args(), expect="verified",
        description="Reshape and scale before shard_map, tanh and a batch sum after it (TP=2)")


def _hidden_dist(post):
    """The MLP's hidden activations come out of shard_map sharded over 'tp'."""
    hidden = jax.shard_map(lambda h, w1: jax.nn.gelu(h @ w1), mesh=_mesh(),
                           in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))

    @jax.jit
    def dist(x, w1, w2):
        h = x.reshape(BATCH, D_MODEL) * SCALE
        return post(hidden(h, w1), w2)
    return dist


@dlverify.case
def outside_sharded_result_used_globally():
    return dlverify.Case(
        seq=mlp_seq, dist=_hidden_dist(lambda a, w2: jnp.tanh(a @ w2).sum(axis=0)), args=_args(),
        expect="verified",
        description="Hidden activations returned sharded (out_specs P(None, 'tp')), second matmul outside")


# --------------------------------------------------------------- buggy twins

def _first_block_only_dist():
    hidden = jax.shard_map(lambda h, w1: jax.nn.gelu(h @ w1), mesh=_mesh(),
                           in_specs=(P(), P(None, "tp")), out_specs=P(None, "tp"))
    half = D_FF // TP

    @jax.jit
    def dist(x, w1, w2):
        a = hidden(x.reshape(BATCH, D_MODEL) * SCALE, w1)
        return jnp.tanh(a[:, :half] @ w2[:half]).sum(axis=0)  # BUG: only the first rank's block of hidden units
    return dist


@dlverify.case
def outside_bug_first_block_only():
    return dlverify.Case(
        seq=mlp_seq, dist=_first_block_only_dist(), args=_args(), expect="bug",
        description="The global post-processing multiplies only the first rank's block of hidden units")


def _wrong_scale_dist():
    mlp = jax.shard_map(mlp_local, mesh=_mesh(), in_specs=(P(), P(None, "tp"), P("tp", None)),
                        out_specs=P())
    wrong = SCALE[::-1].copy()

    @jax.jit
    def dist(x, w1, w2):
        h = x.reshape(BATCH, D_MODEL) * wrong  # BUG: the scale table closed over is reversed
        return jnp.tanh(mlp(h, w1, w2)).sum(axis=0)
    return dist


@dlverify.case
def outside_bug_wrong_constant():
    return dlverify.Case(
        seq=mlp_seq, dist=_wrong_scale_dist(), args=_args(), expect="bug",
        description="The closed-over scale array differs from the reference's")
