"""Dropout in a hand-written tensor-parallel MLP (`jax.shard_map`, TP=2), with
typed PRNG keys (`jax.random.key`, split and folded in).

The key is replicated. The hidden activation is split over 'tp' (column-parallel
w1): each rank draws the whole hidden mask from its key and keeps its own
columns, so its mask is its block of the sequential one. The output, after the
row-parallel all-reduce, is replicated: every rank draws the same output mask
from the same key. dlverify knows the generators only as deterministic
functions of their operands: the same key gives the same bits.

Twins: the output mask drawn from a key folded with the rank (each rank drops
other units of the replicated output, as Megatron's model-parallel RNG tracker
does for regions that are split, not replicated), and the hidden mask drawn at
the local shape (every rank the same first block of columns).

Data parallel: one key per example (noise added to the inputs), the batch split
over 'dp' (DP=4). Each rank splits the shared key into the whole batch's keys and
takes its block; drawn key by key, each rank's noise is its rows of the
sequential noise. Twin: each rank splits the key into its local batch's keys, so
every rank draws the same noise (correlated ranks).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP, KEEP = 2, 0.9
B, D, F = 8, 16, 32


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((), jax.random.key(0).dtype), jax.ShapeDtypeStruct((B, D), f32),
            jax.ShapeDtypeStruct((D, F), f32), jax.ShapeDtypeStruct((F, D), f32))


def _dropout(key, x, shape=None):
    keep = jax.random.bernoulli(key, KEEP, shape or x.shape)
    return jnp.where(keep, x / KEEP, 0.0)


def mlp(key, x, w1, w2):
    k_hidden, k_out = jax.random.split(key)
    h = _dropout(k_hidden, jax.nn.relu(x @ w1))
    return _dropout(jax.random.fold_in(k_out, 1), h @ w2)


def _hidden_block(k_hidden, h):
    # this rank's columns of the whole hidden mask
    keep = jax.random.bernoulli(k_hidden, KEEP, (B, F))
    cols = F // TP
    keep = jax.lax.dynamic_slice_in_dim(keep, jax.lax.axis_index("tp") * cols, cols, axis=1)
    return jnp.where(keep, h / KEEP, 0.0)


def mlp_tp(key, x, w1, w2):
    k_hidden, k_out = jax.random.split(key)
    h = _hidden_block(k_hidden, jax.nn.relu(x @ w1))
    y = jax.lax.psum(h @ w2, "tp")
    return _dropout(jax.random.fold_in(k_out, 1), y)


def mlp_tp_out_mask_per_rank(key, x, w1, w2):
    k_hidden, k_out = jax.random.split(key)
    h = _hidden_block(k_hidden, jax.nn.relu(x @ w1))
    y = jax.lax.psum(h @ w2, "tp")
    k_rank = jax.random.fold_in(jax.random.fold_in(k_out, 1), jax.lax.axis_index("tp"))  # BUG: per-rank key
    return _dropout(k_rank, y)


def mlp_tp_local_hidden_mask(key, x, w1, w2):
    k_hidden, k_out = jax.random.split(key)
    h = jax.nn.relu(x @ w1)
    keep = jax.random.bernoulli(k_hidden, KEEP, h.shape)  # BUG: the local shape: every rank columns 0..F/TP
    h = jnp.where(keep, h / KEEP, 0.0)
    y = jax.lax.psum(h @ w2, "tp")
    return _dropout(jax.random.fold_in(k_out, 1), y)


def _tp(fn):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    # check_vma off: the twin's per-rank key makes the output vary over 'tp', which
    # JAX would refuse to trace; the verifier is what should catch it
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P(), P(None, "tp"), P("tp", None)),
                         out_specs=P(), check_vma=False)


@dlverify.case
def dropout_shard_map_tp():
    return dlverify.Case(seq=mlp, dist=_tp(mlp_tp), args=_args(), expect="verified",
                         description="hidden mask block per rank, output mask from the shared key")


@dlverify.case
def dropout_shard_map_bug_out_mask_per_rank():
    return dlverify.Case(seq=mlp, dist=_tp(mlp_tp_out_mask_per_rank), args=_args(), expect="bug",
                         description="the replicated output's mask drawn from a per-rank key")


@dlverify.case
def dropout_shard_map_bug_local_hidden_mask():
    return dlverify.Case(seq=mlp, dist=_tp(mlp_tp_local_hidden_mask), args=_args(), expect="bug",
                         description="the hidden mask drawn at the local shape on every rank")


# ---------------------------------------------------------------- data parallel

DP, NB = 4, 16


def noisy(key, x):
    keys = jax.random.split(key, x.shape[0])
    return x + 0.1 * jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)


def noisy_dp(key, x):
    rows = x.shape[0]
    keys = jax.random.split(key, rows * DP)
    mine = jax.lax.dynamic_slice_in_dim(keys, jax.lax.axis_index("dp") * rows, rows)
    return x + 0.1 * jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(mine)


def noisy_dp_same_keys(key, x):
    keys = jax.random.split(key, x.shape[0])  # BUG: the local batch's keys: every rank the same noise
    return x + 0.1 * jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)


def _dp(fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"))


def _dp_args():
    return (jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
            jax.ShapeDtypeStruct((NB, D), jnp.float32))


@dlverify.case
def noise_per_example_dp():
    return dlverify.Case(seq=noisy, dist=_dp(noisy_dp), args=_dp_args(), expect="verified",
                         description="one key per example; each rank takes its block of the keys")


@dlverify.case
def noise_per_example_dp_bug_same_keys():
    return dlverify.Case(seq=noisy, dist=_dp(noisy_dp_same_keys), args=_dp_args(), expect="bug",
                         description="each rank splits the key for its local batch: the same noise")
