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
        jax.ShapeDtypeStruct((D_MODEL, HEAD