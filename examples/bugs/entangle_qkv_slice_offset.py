"""A fused-QKV slice at the wrong offset (the Entangle/GraphGuard broken graph).

Entangle's `tp2_layer1.broken` graph (a Megatron-style attention under TP=2)
slices the output of the fused QKV matmul at columns [0:256] where it should
read [1024:1280] (attention.py:124 vs :126): the keys are read at the queries'
offset. Shapes fit; the numbers do not.

Here the fused QKV weight is (D, 3, HEADS, HEAD_DIM) (q, k, v blocks, HF/NxD
order), column-parallel over the heads, so each rank's fused output holds
[q | k | v] of its heads; q, k and v are read at offsets 0, 1 and 2 of the
fused dim where they are used.

Cases: the correct attention (TP=2) and the buggy twin that reads the keys at
the queries' offset.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 2
BATCH, SEQ, D, HEADS, HEAD_DIM = 2, 8, 16, 4, 4
HL = HEADS // TP
SCALE = 1.0 / math.sqrt(HEAD_DIM)


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, D), f32),                # x
            jax.ShapeDtypeStruct((D, 3, HEADS, HEAD_DIM), f32),        # w_qkv (fused)
            jax.ShapeDtypeStruct((HEADS, HEAD_DIM, D), f32))           # w_o


def _dist(local_fn):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP),
                                 in_specs=(P(), P(None, None, "tp", None), P("tp", None, None)),
                                 out_specs=P()))


def attention_seq(x, w_qkv, w_o):
    qkv = jnp.einsum("bsd,dkhe->bskhe", x, w_qkv)            # (B, S, 3, H, Dh)
    scores = jnp.einsum("bqhe,bkhe->bhqk", qkv[:, :, 0], qkv[:, :, 1]) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhe->bqhe", probs, qkv[:, :, 2])
    return jnp.einsum("bqhe,hed->bqd", o, w_o)


def attention_local(x, w_qkv, w_o):
    qkv = jnp.einsum("bsd,dkhe->bskhe", x, w_qkv)            # (B, S, 3, HL, Dh): this rank's heads
    scores = jnp.einsum("bqhe,bkhe->bhqk", qkv[:, :, 0], qkv[:, :, 1]) * SCALE
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhe->bqhe", probs, qkv[:, :, 2])
    return jax.lax.psum(jnp.einsum("bqhe,hed->bqd", o, w_o), "tp")


@dlverify.case
def entangle_qkv_slice_offset():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(attention_local), args=_args(), expect="verified",
        description="attention with a column-parallel fused QKV, q/k/v read at their offsets; TP=2")


def attention_local_bug(x, w_qkv, w_o):
    """Entangle broken graph: the keys are read at the queries' offset of the fused output."""
    qkv = jnp.einsum("bsd,dkhe->bskhe", x, w_qkv)
    scores = jnp.einsum("bqhe,bkhe->bhqk", qkv[:, :, 0], qkv[:, :, 0]) * SCALE  # BUG: keys read at the queries' offset
    probs = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bhqk,bkhe->bqhe", probs, qkv[:, :, 2])
    return jax.lax.psum(jnp.einsum("bqhe,hed->bqd", o, w_o), "tp")


@dlverify.case
def entangle_qkv_slice_offset_bug():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(attention_local_bug), args=_args(), expect="bug",
        description="Entangle broken graph: fused-QKV slice at the wrong offset")
