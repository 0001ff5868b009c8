"""Megatron sequence parallelism around a tensor-parallel MLP.

Activations x of shape (batch, seq, d_model) enter sharded along the
sequence dim (dim 1) over 'tp'. The block all-gathers the sequence, flattens
the tokens, runs the column/row-parallel MLP (w1 split on dim 1, w2 on dim
0) and leaves with a reduce-scatter (psum_scatter) that sums the partial
products and re-shards the result along the sequence dim.

Cases: the correct block (TP=4) and a buggy twin that gathers along the
batch dim instead of the sequence dim.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
BATCH, SEQ, D_MODEL, D_FF = 4, 16, 8, 32


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH, SEQ, D_MODEL), f32),  # x
        jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),        # w1
        jax.ShapeDtypeStruct((D_FF, D_MODEL), f32),        # w2
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(
        local_fn, mesh=mesh,
        in_specs=(P(None, "tp", None), P(None, "tp"), P("tp", None)),
        out_specs=P(None, "tp", None)))


def sp_mlp_seq(x, w1, w2):
    h = jax.nn.gelu(x.reshape(BATCH * SEQ, D_MODEL) @ w1)   # flatten the tokens
    return (h @ w2).reshape(BATCH, SEQ, D_MODEL)


def sp_mlp_local(x, w1, w2):
    x_full = jax.lax.all_gather(x, "tp", axis=1, tiled=True)      # (B, S, D)
    h = jax.nn.gelu(x_full.reshape(BATCH * SEQ, D_MODEL) @ w1)    # hidden block of this rank
    y = (h @ w2).reshape(BATCH, SEQ, D_MODEL)                     # partial sum of the output
    return jax.lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)


@dlverify.case
def sequence_parallel_mlp():
    return dlverify.Case(
        seq=sp_mlp_seq, dist=_dist(sp_mlp_local), args=_args(), expect="verified",
        description="sequence-parallel MLP: all_gather(seq) -> column/row-parallel MLP -> psum_scatter(seq); TP=4")


def sp_mlp_local_gather_wrong_dim(x, w1, w2):
    """Bug: the all_gather concatenates the sequence shards along the batch dim.

    The gathered tensor has the right number of tokens but in the wrong
    order, (TP*B, S/TP, D) instead of (B, S, D); after flattening, the MLP
    rows no longer line up with the sequence positions the psum_scatter hands
    back, so each rank receives outputs computed for other tokens.
    """
    x_full = jax.lax.all_gather(x, "tp", axis=0, tiled=True)  # BUG: gathers along the batch dim, not the sequence dim
    h = jax.nn.gelu(x_full.reshape(BATCH * SEQ, D_MODEL) @ w1)
    y = (h @ w2).reshape(BATCH, SEQ, D_MODEL)
    return jax.lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)


@dlverify.case
def sequence_parallel_mlp_bug_gather_wrong_dim():
    return dlverify.Case(
        seq=sp_mlp_seq, dist=_dist(sp_mlp_local_gather_wrong_dim), args=_args(), expect="bug",
        description="sequence-parallel MLP whose all_gather runs along the batch dim instead of the sequence dim")
