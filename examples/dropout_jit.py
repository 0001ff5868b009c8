"""Dropout in a tensor-parallel MLP partitioned by XLA (`jax.jit` with shardings):
the key is replicated, the hidden activation split over 'tp' (TP=2), and XLA's
partitionable threefry draws each rank's block of the mask from the global
counter, so every rank's mask is its block of the sequential mask. The bits pass
through shifts, ors and a bitcast to f32 (uniform sampling) elementwise.

Twin: the mask drawn for one row and broadcast over the batch (every token
dropping the same hidden units).
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import dlverify

TP, KEEP = 2, 0.9
B, D, F = 8, 16, 32


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((2,), jnp.uint32), jax.ShapeDtypeStruct((B, D), f32),
            jax.ShapeDtypeStruct((D, F), f32), jax.ShapeDtypeStruct((F, D), f32))


def mlp(key_data, x, w1, w2):
    h = jax.nn.relu(x @ w1)
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key_data), KEEP, h.shape)
    return jnp.where(keep, h / KEEP, 0.0) @ w2


def mlp_one_mask_row(key_data, x, w1, w2):
    h = jax.nn.relu(x @ w1)
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key_data), KEEP, (1, F))  # BUG: one row for all tokens
    return jnp.where(keep, h / KEEP, 0.0) @ w2


def _tp(fn):
    mesh = dlverify.host_mesh((TP,), ("tp",))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))
    return jax.jit(fn, in_shardings=(s(), s(), s(None, "tp"), s("tp", None)), out_shardings=s())


@dlverify.case
def dropout_tp_mlp():
    return dlverify.Case(seq=mlp, dist=_tp(mlp), args=_args(), expect="verified",
                         description="dropout on the hidden activation split over 'tp' by jax.jit; TP=2")


@dlverify.case
def dropout_tp_mlp_bug_one_mask_row():
    return dlverify.Case(seq=mlp, dist=_tp(mlp_one_mask_row), args=_args(), expect="bug",
                         description="one dropout mask row broadcast over the batch")
