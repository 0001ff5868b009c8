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
    return (jax.ShapeDtypeStruct((BATCH, SEQ, DIM), jnp.f