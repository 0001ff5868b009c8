"""Context parallelism by all-gathering K and V (Llama-3 style CP) for causal attention.

The sequence is sharded over 'cp' (CP=2). Each rank keeps its queries, all-gathers
the keys and values along the sequence and masks causally with the global
positions of its queries (axis_index * S/CP + iota) against the global key
positions. The outputs stay sequence-sharded; the loss (the mean over all
tokens of the squared error against a target) is the psum of the local sums
divided by the global token count. Also the training form: the gradients of the
q/k/v projections (replicated weights, psum'd over 'cp').

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


def cp_attend(q, k, v):
    q_pos = jax.lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)   # this rank's global positions
    return attend(q, _gather(k), _gather(v), q_pos, jnp.arange(SEQ))


def cp_local(q, k, v, t):
    o = cp_attend(q, k, v)
    return o, jax.lax.psum(jnp.sum((o - t) ** 2), "cp") / SEQ


@dlverify.case
def cp_allgather_kv_attention():
    return dlverify.Case(
        seq=cp_seq, dist=_dist(cp_local), args=_args(), expect="verified",
        description="all-gather-KV context-parallel causal attention and its loss; CP=2")


# --------------------------------------------------------------- training: gradients of the projections

def _train_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((SEQ, D), f32),) + (jax.ShapeDtypeStruct((D, D), f32),) * 3 + \
        (jax.ShapeDtypeStruct((SEQ, D), f32),)   # x, wq, wk, wv, target


def train_loss_seq(x, wq, wk, wv, t):
    return cp_seq(x @ wq, x @ wk, x @ wv, t)[1]


def train_grads_seq(x, wq, wk, wv, t):
    return jax.grad(train_loss_seq, argnums=(1, 2, 3))(x, wq, wk, wv, t)


def train_grads_local(x, wq, wk, wv, t):
    """Each rank differentiates its tokens' part of the loss (no psum inside: with
    check_vma=False its transpose would sum the cotangent again); the transpose of
    the K/V all_gather is a psum_scatter; the replicated weights' gradients are psum'd."""
    def local_loss(wq, wk, wv):
        return jnp.sum((cp_attend(x @ wq, x @ wk, x @ wv) - t) ** 2) / SEQ
    grads = jax.grad(local_loss, argnums=(0, 1, 2))(wq, wk, wv)
    return tuple(jax.lax.psum(g, "cp") for g in grads)


@dlverify.case
def cp_allgather_kv_grads():
    mesh = dlverify.host_mesh((CP,), ("cp",))
    dist = jax.jit(jax.shard_map(train_grads_local, mesh=mesh,
                                 in_specs=(P("cp"), P(), P(), P(), P("cp")),
                                 out_specs=(P(), P(), P()), check_vma=False))
    return dlverify.Case(
        seq=train_grads_seq, dist=dist, args=_train_args(), expect="verified",
        description="all-gather-KV CP trai