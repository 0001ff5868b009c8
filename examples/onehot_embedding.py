"""A vocab-parallel embedding by one-hot matmul, as TPU code writes lookups.

The table (V, D) is sharded over the vocab dim on 'tp' (TP=4); token ids are
replicated. The sequential program embeds by `one_hot(ids, V) @ table` (a
lookup as a contraction, the form that runs well on matrix units). On rank r the
ids are shifted into the rank's shard, `one_hot(ids - r * V/TP, V/TP)`: an id
outside the shard matches no class and gives a zero row, so the psum over 'tp'
adds exactly one table row per token. Also the training form: the table shard's
gradient, the one-hot's transpose times the cotangent.

dlverify moves the offset to the class iota ((a - c) == iota as a == iota + c,
exact for integers: dlverify/offset_compare.py), where `iota(V/TP) + r * V/TP`
is block r of the global class iota, so each rank's one-hot is a block of the
sequential one and its product a partial sum.

Buggy twins: the ids shifted by the next rank's offset (r + 1) * V/TP (every token
gets another shard's row), and the table gradient averaged over 'tp' (a psum that
divides by TP: only each shard's own tokens contribute, nothing to average).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
TOKENS, VOCAB, D = 16, 32, 8
V_LOCAL = VOCAB // TP


def _args():
    return (jax.ShapeDtypeStruct((TOKENS,), jnp.int32), jax.ShapeDtypeStruct((VOCAB, D), jnp.float32))


def _dist(local_fn, out_specs=P()):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P("tp", None)),
                                 out_specs=out_specs))


def embed_seq(ids, table):
    return jax.nn.one_hot(ids % VOCAB, VOCAB, dtype=table.dtype) @ table


def embed_local(ids, table):
    first = jax.lax.axis_index("tp") * V_LOCAL
    return jax.lax.psum(jax.nn.one_hot(ids % VOCAB - first, V_LOCAL, dtype=table.dtype) @ table, "tp")


@dlverify.case
def onehot_embedding_tp():
    return dlverify.Case(seq=embed_seq, dist=_dist(embed_local), args=_args(), expect="verified",
                         description="vocab-parallel embedding by one-hot matmul, ids shifted into the shard; TP=4")


def _loss(embed):
    return lambda ids, table: jnp.sum(jnp.tanh(embed(ids, table)))


def grads_seq(ids, table):
    return jax.grad(_loss(embed_seq), argnums=1)(ids, table)


def grads_local(ids, table):
    return jax.grad(_loss(embed_local), argnums=1)(ids, table)


@dlverify.case
def onehot_embedding_tp_grads():
    return dlverify.Case(seq=grads_seq, dist=_dist(grads_local, out_specs=P("tp", None)), args=_args(),
                         expect="verified",
                         description="the table shard's gradient through the one-hot matmul; TP=4")


def embed_local_next_offset(ids, table):
    nxt = jax.lax.axis_index("tp") + 1
    return jax.lax.psum(jax.nn.one_hot(ids % VOCAB - nxt * V_LOCAL, V_LOCAL) @ table, "tp")  # BUG: the next rank's offset


@dlverify.case
def onehot_embedding_bug_next_offset():
    return dlverify.Case(seq=embed_seq, dist=_dist(embed_local_next_offset), args=_args(), expect="bug",
                         description="one-hot embedding with the ids shifted by the next rank's offset")


def grads_local_averaged(ids, table):
    g = jax.grad(_loss(embed_local), argnums=1)(ids, table)
    return g / TP  # BUG: the shard's gradient divided by TP, as if averaged over 'tp'


@dlverify.case
def onehot_embedding_bug_grad_averaged():
    return dlverify.Case(seq=grads_seq, dist=_dist(grads_local_averaged, out_specs=P("tp", None)), args=_args(),
                         expect="bug", description="the table shard's gradient divided by TP")
