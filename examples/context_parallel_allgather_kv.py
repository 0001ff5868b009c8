"""Context parallelism by all-gathering K and V (Llama-3 style CP) for causal attention.

The sequence is sharded over 'cp' (CP=2). Each rank keeps its queries, all-gathers
the keys and values along the sequence and masks causally with the global
positions of its queries (axis_index * S/CP + iota) against the global key
positions. The outputs stay sequence-sharded; the loss (the mean over all
tokens of the squared error against a target) is the psum of the local sums
divided by the global token count.

Buggy twins: the causal mask built from positions that restart on every shard
(every rank but the first masks as if its queries were the sequence's first
tokens, the published CP position bug class, cf. TransformerEngine PR #536), and
the loss summed over the CP ranks without normalising by the global token
count (SkyRL PR #1420: CP metrics summed across CP ranks).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

CP = 2
SEQ, D = 8, 4
LOCAL = SEQ // CP


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((SEQ, D), f32),   # q
        jax.ShapeDtypeStruct((SEQ, D), f32),   # k
        jax.ShapeDtypeStruct((SEQ, D), f32),   # v
        jax.ShapeDtypeStruct((SEQ, D), f32),   # target
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    seq = P("cp")
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(seq, seq, seq, seq),
                                 out_specs=(seq, P()), check_vma=False))


def attend(q, k, v, q_pos, k_pos):
    s = (q @ k.T) / D ** 0.5
    s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, -1e9)
    return jax.nn.softmax(s, axis=-1) @ v


def cp_seq(q, k, v, t):
    pos = jnp.arange(SEQ)
    o = attend(q, k, v, pos, pos)
    return o, jnp.sum((o - t) ** 2) / SEQ


def _gather(x):
    return jax.lax.all_gather(x, "cp", axis=0, tiled=True)


def cp_local(q, k, v, t):
    q_pos = jax.lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)   # this rank's global positions
    o = attend(q, _gather(k), _gather(v), q_pos, jnp.arange(SEQ))
    return o, jax.lax.psum(jnp.sum((o - t) ** 2), "cp") / SEQ


@dlverify.case
def cp_allgather_kv_attention():
    return dlverify.Case(
        seq=cp_seq, dist=_dist(cp_local), args=_args(), expect="verified",
        description="all-gather-KV context-parallel causal attention and its loss; CP=2")


# --------------------------------------------------------------- buggy twins

def cp_local_positions_restart(q, k, v, t):
    k_pos = jnp.arange(SEQ)
    o = attend(q, _gather(k), _gather(v), jnp.arange(LOCAL), k_pos)  # BUG: local query positions
    return o, jax.lax.psum(jnp.sum((o - t) ** 2), "cp") / SEQ


@dlverify.case
def cp_bug_causal_mask_local_positions():
    return dlverify.Case(
        seq=cp_seq, dist=_dist(cp_local_positions_restart), args=_args(), expect="bug",
        description="CP causal mask whose query positions restart at 0 on every shard")


def cp_local_loss_summed(q, k, v, t):
    q_pos = jax.lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)
    o = attend(q, _gather(k), _gather(v), q_pos, jnp.arange(SEQ))
    local_mean = jnp.sum((o - t) ** 2) / LOCAL
    return o, jax.lax.psum(local_mean, "cp")  # BUG: the CP ranks' mean losses are summed, not averaged


@dlverify.case
def cp_bug_loss_summed_over_cp():
    return dlverify.Case(
        seq=cp_seq, dist=_dist(cp_local_loss_summed), args=_args(), expect="bug",
        description="CP loss: the ranks' local means summed over 'cp' (CP times the loss)")
