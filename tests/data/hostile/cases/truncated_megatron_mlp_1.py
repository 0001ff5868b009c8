"""Megatron-style tensor-parallel MLP: y = gelu(x @ w1) @ w2 + b2.

w1 is split column-wise (on its output dim 1) and w2 row-wise (on its input
dim 0) over the mesh axis 'tp'. Each rank computes gelu on its own block of
hidden units, multiplies by its rows of w2 and obtains a partial sum of y;
one psum over 'tp' completes it, and the replicated bias is added once,
after the psum.

Cases: the correct MLP at TP=2 and TP=4, a variant whose output
nonlinearity follows the second matmul, and three buggy twins (missing
psum, bias added before the psum, gelu applied to a partial sum).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

BATCH, D_MODEL, D_FF = 8, 16, 32


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),  # x
        jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),   # w1
        jax.ShapeDtypeStruct((D_FF, D_MODEL), f32),   # w2
        jax.ShapeDtypeStruct((D_MODEL,), f32),        # b2
    )


# x replicated, w1 split on dim 1, w2 split on dim 0, b2 replicated.
IN_SPECS = (P(), P(None, "tp"), P("tp", None), P())


def _dist(local_fn, tp, check_vma=True):
    mesh = dlverify.host_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=IN_SPECS,
                                 out_specs=P(), check_vma=check_vma))


# ---------------------------------------------------------------- reference

def mlp_seq(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)
    return h @ w2 + b2


def mlp_local(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)                 # this rank's block of hidden units
    y = jax.lax.psum(h @ w2, "tp")          # partial sums -> full sum
    return y + b2


@dlverify.case
def megatron_mlp_tp2():
    return dlverify.Case(
        seq=mlp_seq, dist=_dist(mlp_local, 2), args=_args(), expect="verified",
        description="Megatron MLP, column-parallel w1, row-parallel w2, psum, bias after the psum; TP=2")


@dlverify.case
def megatron_mlp_tp4():
    return dlverify.Case(
        seq=mlp_seq, dist=_dist(mlp_local, 4), args=_args(), expect="verified",
        description="Megatron MLP, column-parallel w1, row-parallel w2, psum, bias after the psum; TP=4")


# --------------------------------------------------------------- buggy twins

def mlp_local_missing_psum(x, w1, w2, b