"""Resharding with all_to_all: from sharded-by-rows to sharded-by-columns.

A tiled all_to_all(split_axis=1, concat_axis=0) turns a block of rows
(S/N, D) into a block of columns (S, D/N): each rank cuts its rows into N
column chunks, sends chunk j to rank j and stacks what it receives in rank
order. This is the DeepSpeed-Ulysses switch from sequence-sharded to
head-sharded activations.

Cases:
- a plain 2-D reshard followed by an elementwise op;
- the Ulysses form: hidden states (S, H*Dh) are viewed as (S, H, Dh), the
  head axis is sharded with all_to_all, a per-head softmax runs over Dh and
  the heads are merged back to (S, H/N*Dh);
- a buggy twin of the Ulysses form that splits the head_dim axis instead of
  the head axis (shapes still fit after merging the heads back).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

N = 4
SEQ, HEADS, HEAD_DIM = 16, 8, 8
D = HEADS * HEAD_DIM


def _args():
    return (jax.ShapeDtypeStruct((SEQ, D), jnp.float32),)


def _dist(local_fn):
    mesh = dlverify.host_mesh((N,), ("x",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P("x", None),),
                                 out_specs=P(None, "x")))


# ------------------------------------------------------------- plain 2-D reshard

def tanh_seq(x):
    return 2.0 * jnp.tanh(x) + 1.0


def tanh_local(x):
    cols = jax.lax.all_to_all(x, "x", split_axis=1, concat_axis=0, tiled=True)  # (S, D/N)
    return 2.0 * jnp.tanh(cols) + 1.0


@dlverify.case
def all_to_all_reshard():
    return dlverify.Case(
        seq=tanh_seq, dist=_dist(tanh_local), args=_args(), expect="verified",
        description="row-sharded -> column-sharded with a tiled all_to_all, then an elementwise op; N=4")


# ---------------------------------------------------- Ulysses: shard the heads

def head_softmax_seq(x):
    heads = x.reshape(SEQ, HEADS, HEAD_DIM)
    return jax.nn.softmax(heads, axis=-1).reshape(SEQ, D)


def head_softmax_local(x):
    heads = x.reshape(SEQ // N, HEADS, HEAD_DIM)                                    # sequence shard
    heads = jax.lax.all_to_all(heads, "x", split_axis=1, concat_axis=0, tiled=True)  # (S, H/N, Dh)
    return jax.nn.softmax(heads, axis=-1).reshape(SEQ, D // N)


@dlverify.case
def all_to_all_heads():
    return dlverify.Case(
        seq=head_softmax_seq, dist=_dist(head_softmax_local), args=_args(), expect="verified",
        description="Ulysses-style reshard: sequence-sharded (S, H, Dh) -> head-sharded via all_to_all, per-head softmax; N=4")


def head_softmax_local_split_head_dim(x):
    """Bug: the all_to_all splits the head_dim axis instead of the head axis.

    Every rank receives a 1/N slice of the features of every head instead of
    whole heads, so the per-head softmax normalises over the wrong features
    and the merged columns are not the columns this rank should own.
    """
    heads = x.reshape(SEQ // N, HEADS, HEAD_DIM)
    heads = jax.lax.all_to_all(heads, "x", split_axis=2, concat_axis=0, tiled=True)  # BUG: splits head_dim (axis 2), not the head axis (axis 1)
    return jax.nn.softmax(heads, axis=-1).reshape(SEQ, D // N)


@dlverify.case
def all_to_all_heads_bug_split_head_dim():
    return dlverify.Case(
        seq=head_softmax_seq, dist=