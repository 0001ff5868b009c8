"""Block offsets computed with bit operations on the rank number.

Every rank holds the same replicated buffer x (SLOTS * BLOCK rows); rank r
must read its own block of rows with a dynamic_slice whose start is derived
from axis_index by bit operations, as index arithmetic on power-of-two sizes
often is (`r & (SLOTS - 1)` for r % SLOTS, `r ^ 1` for the partner in a pair,
`<<` and `>>` for multiplying and dividing by powers of two). Integer `&`,
`|`, `^`, `~` are bitwise in XLA (6 & 3 == 2), so a verifier that folded them
as logical operations would see the wrong rank offsets.

Cases:
- a strided slot: rank r reads slot (r * STRIDE) & (SLOTS - 1) of a ring of
  SLOTS slots; the buggy twin uses stride 3, so rank 1 reads rows [6, 7]
  instead of [2, 3] (a logical `&` would fold both strides to slot 1);
- a pairwise swap: rank r reads the block of its partner r ^ 1, with the start
  computed as ((r ^ 1) << LOG2_BLOCK); the buggy twin flips the wrong bit
  (r ^ 2, the partner across pairs).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

# Strided slot: 2 ranks read the first half of a ring of 4 slots.
RING_RANKS, SLOTS, BLOCK, COLS = 2, 4, 2, 8
# Pairwise swap: 4 ranks, blocks of 2**LOG2_BLOCK rows.
SWAP_RANKS, LOG2_BLOCK = 4, 1
SWAP_BLOCK = 1 << LOG2_BLOCK


def _ring_args():
    return (jax.ShapeDtypeStruct((SLOTS * BLOCK, COLS), jnp.float32),)


def _swap_args():
    return (jax.ShapeDtypeStruct((SWAP_RANKS * SWAP_BLOCK, COLS), jnp.float32),)


def _dist(local_fn, ranks):
    mesh = dlverify.host_mesh((ranks,), ("r",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(),), out_specs=P("r", None)))


def ring_seq(x):
    return x[:RING_RANKS * BLOCK]


def ring_local(x):
    slot = (jax.lax.axis_index("r") * 1) & (SLOTS - 1)
    return jax.lax.dynamic_slice_in_dim(x, slot * BLOCK, BLOCK, axis=0)


@dlverify.case
def bitwise_ring_slot():
    return dlverify.Case(
        seq=ring_seq, dist=_dist(ring_local, RING_RANKS), args=_ring_args(), expect="verified",
        description="each rank reads slot r & (SLOTS-1) of a replicated ring buffer; 2 ranks")


def ring_local_wrong_stride(x):
    """Bug: slot stride 3, so rank 1 reads slot 3 (rows 6, 7) instead of slot 1."""
    slot = (jax.lax.axis_index("r") * 3) & (SLOTS - 1)
    return jax.lax.dynamic_slice_in_dim(x, slot * BLOCK, BLOCK, axis=0)  # BUG: slot of stride 3


@dlverify.case
def bitwise_ring_slot_bug_wrong_stride():
    return dlverify.Case(
        seq=ring_seq, dist=_dist(ring_local_wrong_stride, RING_RANKS), args=_ring_args(),
        expect="bug",
        description="masked slot index with stride 3: rank 1 reads rows 6..7 instead of 2..3")


def swap_seq(x):
    blocks = [x[b * SWAP_BLOCK:(b + 1) * SWAP_BLOCK] for b in range(SWAP_RANKS)]
    return jnp.concatenate([blocks[b ^ 1] for b in range(SWAP_RANKS)], axis=0)


def swap_local(x):
    partner = jax.lax.axis_index("r") ^ 1
    return jax.lax.dynamic_slice_in_dim(x, partner << LOG2_BLOCK, SWAP_BLOCK, axis=0)


@dlverify.case
def bitwise_pair_swap():
    return dlverify.Case(
        seq=swap_seq, dist=_dist(swap_local, SWAP_RANKS), args=_swap_args(), expect="verified",
        description="each rank reads its partner's block, start (r ^ 1) << 1; 4 ranks")


def swap_local_wrong_bit(x):
    """Bug: flips bit 1 of the rank (the partner across pairs) instead of bit 0."""
    partner = jax.lax.axis_index("r") ^ 2
    return jax.lax.dynamic_slice_in_dim(x, partner << LOG2_BLOCK, SWAP_BLOC