"""A view that moves the sharded dim (pytorch/pytorch #179502,
aws-neuron/transformers-neuronx #109).

Activations (batch, seq, D) are sharded along the sequence (sequence
parallelism). Flattening them to tokens (batch * seq, D) batch-major does not
give a rank a contiguous block of the flattened tokens: its rows are
(b, r * S/tp + s) for every b. PyTorch's `view` on a Shard(1) DTensor
nevertheless returned Shard(0) (#179502); transformers-neuronx split an axis
a -> (c, d) and took the shard on d instead of c (#109). Either way the
program goes on as if the rank held the r-th block of the flattened dim.

Cases: the correct program (SP=4), which first moves the shard to the batch
dim with an all_to_all and then flattens, and the buggy twin, which flattens
the sequence-sharded tensor and claims a block of the flattened tokens.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

SP = 4
BATCH, SEQ, D, F = 8, 16, 8, 8


def _mesh(n):
    return dlverify.host_mesh((n,), ("sp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, D), f32),   # x
            jax.ShapeDtypeStruct((D, F), f32))            # w


def _dist(local_fn):
    # x sharded along the sequence; the tokens out sharded along the flattened dim.
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(SP), in_specs=(P(None, "sp", None), P()),
                                 out_specs=P("sp", None)))


def tokens_seq(x, w):
    return x.reshape(BATCH * SEQ, D) @ w


def tokens_local(x, w):
    x = jax.lax.all_to_all(x, "sp", split_axis=0, concat_axis=1, tiled=True)   # (B/sp, S, D)
    return x.reshape(BATCH // SP * SEQ, D) @ w


@dlverify.case
def pytorch179502_view_moves_shard():
    return dlverify.Case(
        seq=tokens_seq, dist=_dist(tokens_local), args=_args(), expect="verified",
        description="flatten sequence-sharded activations to tokens after resharding to the "
                    "batch dim (all_to_all); SP=4")


def tokens_local_bug(x, w):
    """pytorch #179502 / transformers-neuronx #109: the view keeps the local
    rows, which are not this rank's block of the flattened tokens."""
    return x.reshape(BATCH * SEQ // SP, D) @ w  # BUG: view moves the sharded dim


@dlverify.case
def pytorch179502_view_moves_shard_bug():
    return dlverify.Case(
        seq=tokens_seq, dist=_dist(tokens_local_bug), args=_args(), expect="bug",
        description="pytorch #179502: a view moves the sharded dim")
