"""Rotary position embeddings on activations sharded along the sequence.

x (batch, seq, d) is sharded on the sequence dim over 'sp'. RoPE rotates
feature pairs (i, i + d/2) by the angle position * inv_freq[i]
("rotate-half" form). On rank r the local rows are the global positions
r * LOCAL_LEN ... r * LOCAL_LEN + LOCAL_LEN - 1, so the local positions must
be offset by axis_index('sp') * LOCAL_LEN.

Cases: the correct program (SP=4) and a buggy twin that uses the local row
numbers as positions.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

SP = 4
BATCH, SEQ, DIM = 2, 32, 16
LOCAL_LEN = SEQ // SP
HALF = DIM // 2


def _args():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DIM), jnp.float32),)


def _dist(local_fn):
    mesh = dlverify.host_mesh((SP,), ("sp",))
    spec = P(None, "sp", None)
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(spec,), out_specs=spec))


def rope(x, positions):
    """Rotate-half RoPE of x (..., len, DIM) at integer positions (len,)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(HALF, dtype=jnp.float32) / HALF))
    angles = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]   # (len, HALF)
    cos = jnp.concatenate([jnp.cos(angles), jnp.cos(angles)], axis=-1)     # (len, DIM)
    sin = jnp.concatenate([jnp.sin(angles), jnp.sin(angles)], axis=-1)
    x1, x2 = x[..., :HALF], x[..., HALF:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return x * cos + rotated * sin


def rope_seq(x):
    return rope(x, jnp.arange(SEQ))


def rope_local(x):
    positions = jnp.arange(LOCAL_LEN) + jax.lax.axis_index("sp") * LOCAL_LEN  # global positions
    return rope(x, positions)


@dlverify.case
def rotary_sp():
    return dlverify.Case(
