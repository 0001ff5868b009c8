"""Data parallelism times tensor parallelism on a 2x2 ('dp', 'tp') mesh.

The batch of x is sharded over 'dp'; the MLP y = gelu(x @ w1) @ w2 + b2 is
Megatron-parallel over 'tp' (w1 split on dim 1, w2 on dim 0), so the
partial sums must be reduced over 'tp' only. The output stays sharded on
'dp' and replicated over 'tp'.

Cases: the correct program and a buggy twin that reduces over 'dp'
instead of 'tp'.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP, TP = 2, 2
BATCH, D_MODEL, D_FF = 8, 16, 32


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),  # x
        jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),   # w1
        jax.ShapeDtypeStruct((D_FF, D_MODEL), f32),   # w2
        jax.ShapeDtypeStruct((D_MODEL,), f32),        # b2
    )


def _dist(local_fn, check_vma=True):
    mesh = dlverify.host_mesh((DP, TP), ("dp", "tp"))
    return jax.jit(jax.shard_map(
        local_fn, mesh=mesh,
        in_specs=(P("dp", None), P(None, "tp"), P("tp", None), P()),
        out_specs=P("dp", None), check_vma=check_vma))


def mlp_seq(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)
    return h @ w2 + b2


def mlp_local(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)              # local batch rows, local hidden block
    y = jax.lax.psum(h @ w2, "tp")       # complete the row-parallel matmul
    return y + b2


@dlverify.case
def mesh_2d_dp_tp():
    return dlverify.Case(
        seq=mlp_seq, dist=_dist(mlp_local), args=_args(), expect="verified",
        description="2x2 mesh: batch sharded on 'dp', Megatron MLP on 'tp', output sharded on 'dp'")


def mlp_local_psum_wrong_axis(x, w1, w2, b2):
    """Bug: the row-parallel partial sums are reduced over 'dp' instead of 'tp'.

    This adds rows of two different batch shards together and never
    combines the two halves of the hidden dimension.
    """
    h = jax.nn.gelu(x @ w1)
    y = jax.lax.psum(h @ w2, "dp")  # BUG: psum over the wrong mesh axis ('dp' instead of 'tp')
    return y + b2


@dlverify.case
def mesh_2d_bug_psum_wrong_axis(