"""Multi-head self-attention with the heads sharded over 'tp' (Megatron).

wq, wk, wv (d_model, heads * head_dim) are split on their output dim, so
each rank holds whole heads; wo (heads * head_dim, d_model) is split on its
input dim. Each rank runs softmax attention for its heads, multiplies by
its rows of wo and holds a partial sum of the output; a psum completes it.

Cases: the correct layer (TP=2) and two buggy twins: the psum is missing,
and the heads are split with the global head count on the local shard.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import dlverify

TP = 2
SEQ, D_MODEL, HEADS, HEAD_DIM = 8, 16, 4, 8
LOCAL_HEADS = HEADS // TP
SCALE = 1.0 / np.sqrt(HEAD_DIM)


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((SEQ, D_MODEL), f32),              # x
        jax.ShapeDtypeStruct((D_MODEL, HEADS * HEAD_DIM), f32),  # wq
        jax.ShapeDtypeStruct((D_MODEL, HEADS * HEAD_DIM), f32),  # wk
        jax.ShapeDtypeStruct((D_MODEL, HEADS * HEAD_DIM), f32),  # wv
        jax.ShapeDtypeStruct((HEADS * HEAD_DIM, D_MODEL), f32),  # wo
    )


def _dist(local_fn, check_vma=True):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    col = P(None, "tp")
    return jax.jit(jax.shard_map(
        local_fn, mesh=mesh, in_specs=(P(), col, col, col, P("tp", None)),
        out_specs=P(), check_vma=check_vma))


def attention_seq(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv                                   # (S, H*Dh)
    q, k, v = (t.reshape(SEQ, HEADS, HEAD_DIM) for t in (q, k, v))     # (S, H, Dh)
    scores = jnp.einsum("qhd,khd->hqk", q, k) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)                            # over the keys
    o = jnp.einsum("hqk,khd->qhd", probs, v).reshape(SEQ, HEADS * HEAD_DIM)
    return o @ wo


def attention_local(x, wq, wk, wv, wo):
    q, k, v = x @ wq, x @ wk, x @ wv                                   # this rank's heads
    q, k, v = (t.reshape(SEQ, LOCAL_HEADS, HEAD_DIM) for t in (q, k, v))
    scores = jnp.einsum("qhd,khd->hqk", q, k) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("hqk,khd->qhd", probs, v).reshape(SEQ, LOCAL_HEADS * HEAD_DIM)
    return jax.lax.psum(o @ wo, "tp")                                  # sum over head groups


@dlverify.case
def attention_heads():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(attention_local), args=_args(), expect="verified",
        description="head-parallel self-attention: column-parallel q/k/v, row-parallel wo, psum; TP=2")


def attention_local_missing_psum(x, wq, wk, wv, wo):
    """Bug: the output projection's partial sums are never summed over 'tp'.

    Each rank returns only the contribution of its own heads.
    """
    q, k, v = x @ wq, x @ wk, x @ wv
    q, k, v = (t.reshape(SEQ, LOCAL_HEADS, HEAD_DIM) for t in (q, k, v))
    scores = jnp.einsum("qhd,khd->hqk", q, k) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("hqk,khd->qhd", probs, v).reshape(SEQ, LOCAL_HEADS * HEAD_DIM)
    return o @ wo  # BUG: missing psum over 'tp'


@dlverify.case
def attention_heads_bug_missing_psum():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(attention_local_missing_psum, check_vma=False),
        args=_args(), expect="bug",
        description="head-parallel self-attention without the final psum")


def attention_local_global_head_count(x, wq, wk, wv, wo):
    """Bug: the local q/k/v are split into the global number of heads.

    The shard holds LOCAL_HEADS * HEAD_DIM columns; reshaping them into
    HEADS heads of HEAD_DIM // TP features regroups the features, so the
    attention scores are computed over the wrong vectors. Shapes still fit.
    """
    q, k, v = x @ wq, x @ wk, x @ wv
    q, k, v = (t.reshape(SEQ, HEADS, -1) for t in (q, k, v))  # BUG: reshape uses the global head count on a local shard
    scores = jnp.einsum("qhd,khd->hqk", q, k) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("hqk,khd->qhd", probs, v).reshape(SEQ, LOCAL_HEADS * HEAD_DIM)
    return jax.lax.psum(o @ wo, "tp")


@dlverify.case
def attention_heads_bug_wrong_reshape():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(attention_local_global_head_count),
        args=_args(), expect="bug",
        description="head-parallel self-attention that splits each shard into the global number of heads")
