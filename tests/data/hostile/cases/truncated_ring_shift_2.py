"""Ring shift with ppermute: jnp.roll of a row-sharded array by one block.

x (rows, cols) is sharded on its rows over 'ring' (N ranks, BLOCK rows
each). jnp.roll(x, BLOCK, axis=0) moves block r to position r + 1 (mod N),
so each rank sends its block to the next rank. N = 4: with only two ranks
both directions would coincide.

Cases: the correct shift and a buggy twin that sends to the previous rank.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

N = 4
BLOCK, COLS = 4, 8
ROWS = N * BLOCK


def _args():
    return (jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),)


def _dist(local_fn):
    mesh = dlverify.host_mesh((N,), ("ring",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P("ring", None),),
                                 out_specs=P("ring", None)))


def roll_seq(x):
    return jnp.roll(x, shift=BLOCK, axis=0)


def roll_local(x):
    to_next = [(r, (r + 1) % N) for r in range(N)]
    return jax.lax.ppermute(x, "ring",