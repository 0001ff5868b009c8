"""Prefix sums along a sequence split over ranks (sequence parallelism).

Position ids from a cumsum of the attention mask (left padding skipped), and
running sums of activations, along a sequence dim sharded over 'sp'. Each rank
takes the cumsum of its own block and adds the carry: the total of every
earlier rank's block, read from the gathered block totals (their exclusive
prefix sum picked at axis_index, or a dot with the 0/1 mask "rank j < mine").
The sequential cumsum is checked in its blocked form (dlverify/blocked_scan.py).

Cases: position ids (SP=4, carry by an exclusive prefix sum of the totals), a
running sum of activations (SP=4, carry by a masked dot), and buggy twins:
positions restarting on every shard (the carry missing) and a carry that
counts the rank's own block too.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

SP = 4
BATCH, SEQ, DIM = 2, 32, 8


def _mask_args():
    return (jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32),)


def _x_args():
    return (jax.ShapeDtypeStruct((SEQ, DIM), jnp.float32),)


def _dist(local_fn, spec):
    mesh = dlverify.host_mesh((SP,), ("sp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(spec,), out_specs=spec))


# ------------------------------------------------------------------ position ids
def positions_seq(mask):
    """Position of each token among the real (mask 1) tokens of its row."""
    return jnp.cumsum(mask, axis=1) - 1


def positions_local(mask):
    counts = jnp.cumsum(mask, axis=1)                        # (BATCH, SEQ/SP): this block only
    totals = jax.lax.all_gather(counts[:, -1], "sp")         # (SP, BATCH): every block's count
    before = jnp.cumsum(totals, axis=0) - totals             # tokens in the blocks before each
    carry = before[jax.lax.axis_index("sp")]                 # (BATCH,)
    return counts + carry[:, None] - 1


@dlverify.case
def sp_position_ids():
    return dlverify.Case(
        seq=positions_seq, dist=_dist(positions_local, P(None, "sp")), args=_mask_args(),
        expect="verified",
        description="position ids from a cumsum of the mask under SP=4, carry from the gathered counts")


def positions_local_restart(mask):
    """Bug: every shard numbers its tokens from 0, as if it held the start of the row."""
    counts = jnp.cumsum(mask, axis=1)
    return counts - 1  # BUG: the carry (tokens on earlier ranks) is missing


@dlverify.case
def sp_position_ids_bug_restart():
    return dlverify.Case(
        seq=positions_seq, dist=_dist(positions_local_restart, P(None, "sp")), args=_mask_args(),
        expect="bug", description="position ids restarting at 0 on every shard")


# ------------------------------------------------------------------ running sums
def running_sum_seq(x):
    return jnp.cumsum(x, axis=0)


def running_sum_local(x):
    partial = jnp.cumsum(x, axis=0)                          # (SEQ/SP, DIM)
    totals = jax.lax.all_gather(partial[-1], "sp")           # (SP, DIM)
    earlier = (jnp.arange(SP) < jax.lax.axis_index("sp")).astype(x.dtype)
    return partial + earlier @ totals


@dlverify.case
def sp_running_sum():
    return dlverify.Case(
        seq=running_sum_seq, dist=_dist(running_sum_local, P("sp", None)), args=_x_args(),
        expect="verified", description="running sum under SP=4, carry by a masked dot of the totals")


def running_sum_local_own_block(x):
    """Bug: the carry also counts the rank's own block (<= instead of <)."""
    partial = jnp.cumsum(x, axis=0)
    totals = jax.lax.all_gather(partial[-1], "sp")
    own_too = jnp.arange(SP) <= jax.lax.axis_index("sp")
    return partial + own_too.astype(x.dtype) @ totals  # BUG: the carry counts this rank's block


@dlverify.case
def sp_running_sum_bug_own_block():
    return dlverify.Case(
        seq=running_sum_seq, dist=_dist(running_sum_local_own_block, P("sp", None)), args=_x_args(),
        expect="bug", description="running sum whose carry includes the rank's own block")
