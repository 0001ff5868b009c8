"""Rotary positions not offset per micro-batch (NVIDIA/TransformerEngine PR #536).

With pipeline-parallel, micro-batched inference TE applied the rotary
embedding with positions starting at 0 for every micro-batch, so the queries
of every micro-batch but the first were rotated by the wrong angles.

Here the sequence is split over a context-parallel axis 'cp' and each rank
processes its chunk in micro-batches of MB_LEN tokens: the positions of a
micro-batch are the shard's start (axis_index * LOCAL_LEN) plus the
micro-batch's start (m * MB_LEN) plus 0..MB_LEN-1.

Cases: the correct program (CP=2, 2 micro-batches per rank) and the buggy
twin that drops the micro-batch offset.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

CP = 2
BATCH, SEQ, DIM = 2, 16, 8
LOCAL_LEN = SEQ // CP
MICRO = 2
MB_LEN = LOCAL_LEN // MICRO
HALF = DIM // 2


def _mesh(n):
    return dlverify.host_mesh((n,), ("cp",))


def _args():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DIM), jnp.float32),)   # queries of one head


def _dist(local_fn):
    spec = P(None, "cp", None)
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(CP), in_specs=(spec,), out_specs=spec))


def rope(x, positions):
    """Rotate-half RoPE of x (..., len, DIM) at integer positions (len,)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(HALF, dtype=jnp.float32) / HALF))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]
    cos = jnp.concatenate([jnp.cos(angles), jnp.cos(angles)], axis=-1)
    sin = jnp.concatenate([jnp.sin(angles), jnp.sin(angles)], axis=-1)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def rope_seq(x):
    return rope(x, jnp.arange(SEQ))


def rope_local(x):
    start = jax.lax.axis_index("cp") * LOCAL_LEN
    out = []
    for m in range(MICRO):
        xm = x[:, m * MB_LEN:(m + 1) * MB_LEN]
        out.append(rope(xm, jnp.arange(MB_LEN) + (start + m * MB_LEN)))
    return jnp.concatenate(out, axis=1)


@dlverify.case
def te536_rope_microbatch_offset():
    return dlverify.Case(
        seq=rope_seq, dist=_dist(rope_local), args=_args(), expect="verified",
        description="RoPE on a context-parallel shard in 2 micro-batches, positions offset by "
                    "shard and micro-batch start; CP=2")


def rope_local_bug(x):
    """TransformerEngine PR #536: every micro-batch restarts at the shard's start."""
    start = jax.lax.axis_index("cp") * LOCAL_LEN
    out = []
    for m in range(MICRO):
        xm = x[:, m * MB_LEN:(m + 1) * MB_LEN]
        out.append(rope(xm, jnp.arange(MB_LEN) + start))  # BUG: no micro-batch offset m * MB_LEN
    return jnp.concatenate(out, axis=1)


@dlverify.case
def te536_rope_microbatch_offset_bug():
    return dlverify.Case(
        seq=rope_seq, dist=_dist(rope_local_bug), args=_args(), expect="bug",
        description="TransformerEngine PR #536: rotary positions not offset per micro-batch")
