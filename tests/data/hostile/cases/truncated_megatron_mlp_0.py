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

def mlp_local_missing_psum(x, w1, w2, b2):
    """Bug: the partial products h @ w2 are never summed over 'tp'.

    Every rank returns only its own term of the row-parallel matmul (plus
    the bias), so the output is one rank's partial sum instead of y.
    """
    h = jax.nn.gelu(x @ w1)
    y = h @ w2  # BUG: missing psum over 'tp'
    return y + b2


@dlverify.case
def megatron_mlp_bug_missing_psum():
    return dlverify.Case(
        seq=mlp_seq, dist=_dist(mlp_local_missing_psum, 2, check_vma=False),
        args=_args(), expect="bug",
        description="Megatron MLP without the psum after the row-parallel matmul (TP=2)")


def mlp_local_bias_before_psum(x, w1, w2, b2):
    """Bug: the replicated bias is added to each rank's partial sum.

    The psum then adds b2 once per rank, so y carries tp * b2.
    """
    h = jax.nn.gelu(x @ w1)
    y = jax.lax.psum(h @ w2 + b2, "tp")  # BUG: bias added on every rank before the psum
    return y


@dlverify.case
def megatron_mlp_bug_bias_before_psum():
    return dlverify.Case(
        seq=mlp_seq, dist=_dist(mlp_local_bias_before_psum, 4),
        args=_args(), expect="bug",
        description="Megatron MLP with b2 added to the partial sums before the psum (TP=4)")


# ------------------------------------ output nonlinearity after the second matmul

def mlp_out_gelu_seq(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)
    return jax.nn.gelu(h @ w2) + b2


def mlp_out_gelu_local(x, w1, w2, b2):
    h = jax.nn.gelu(x @ w1)
    y = jax.nn.gelu(jax.lax.psum(h @ w2, "tp"))   # gelu of the full sum
    return y + b2


@dlverify.case
def megatron_mlp_out_gelu():
    return dlverify.Case(
        seq=mlp_out_gelu_seq, dist=_dist(mlp_out_gelu_local, 2), args=_args(),
        expect="verified",
        description="Megatron MLP with a gelu after the row-parallel matmul, applied after the psum (TP=2)")


def mlp_out_gelu_local_on_partial(x, w1, w2, b2):
    """Bug: gelu is applied to each rank's partial sum before the psum.

    gelu is not linear, so sum_r gelu(p_r) differs from gelu(sum_r p_r),
    which is what the sequential version computes.
    """
    h = jax.nn.gelu(x @ w1)
    y = jax.lax.psum(jax.nn.gelu(h @ w2), "tp")  # BUG: gelu on a partial sum, before the psum
    return y + b2


@dlverify.case
def megatron