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


def _ring_args