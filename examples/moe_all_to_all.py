"""Expert parallelism with all-to-all token exchange (GShard, Switch Transformer):
tokens and experts are both sharded over 'ep'. Each rank routes its own group
of tokens (top-1, per-group capacity: GShard's groups are the ranks' token
shards), builds the dispatch buffers for every expert, and an all_to_all sends
each expert's buffer to the rank that holds the expert; the experts run on the
tokens of every group, and a second all_to_all brings the results back for the
combine.

The sequential program is the same layer over all groups at once: routing per
group, buffers (experts, groups, capacity, d_model), every expert on every
group. The distributed one is what a Switch/GShard layer runs on each device.

Buggy twins (both run and give plausible numbers):
- the dispatch orders the experts round-robin over the ranks (expert e on rank
  e % EP) while the weights are sharded in contiguous blocks (experts
  [r * E/EP, (r+1) * E/EP) on rank r): every token is processed by another
  expert's weights;
- the return all_to_all concatenates the experts' results along the group dim
  instead of the expert dim, and a reshape makes the shape fit: each token gets
  another expert's result.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

EP = 4                                   # ranks = token groups
GROUPS, GROUP_TOKENS, D_MODEL, EXPERTS, CAPACITY, D_FF = EP, 8, 8, 8, 3, 16
LOCAL = EXPERTS // EP
f32 = jnp.float32


def _args():
    return (
        jax.ShapeDtypeStruct((GROUPS, GROUP_TOKENS, D_MODEL), f32),   # x, grouped tokens
        jax.ShapeDtypeStruct((D_MODEL, EXPERTS), f32),                 # router
        jax.ShapeDtypeStruct((EXPERTS, D_MODEL, D_FF), f32),           # w1 per expert
        jax.ShapeDtypeStruct((EXPERTS, D_FF, D_MODEL), f32),           # w2 per expert
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((EP,), ("ep",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")),
                                 out_specs=P("ep")))


def route(x, router):
    """Top-1 routing with per-group capacity: dispatch mask (g, s, e, c) and the
    combine weights (the mask times the softmax gate)."""
    logits = jnp.einsum("gsd,de->gse", x, router)
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), EXPERTS, dtype=f32)
    slot = jnp.cumsum(onehot, axis=1) * onehot - onehot        # position in the group's buffer
    keep = onehot * (slot < CAPACITY)                          # dropped beyond the capacity
    slots = jax.nn.one_hot(jnp.sum(slot * keep, axis=-1).astype(jnp.int32), CAPACITY, dtype=f32)
    dispatch = keep[..., None] * slots[:, :, None, :]
    return dispatch, dispatch * jax.nn.softmax(logits, axis=-1)[..., None]


def run_experts(xe, w1, w2):
    """Every expert's MLP on its buffers (e, g, c, d)."""
    h = jax.nn.gelu(jnp.einsum("egcd,edf->egcf", xe, w1))
    return jnp.einsum("egcf,efd->egcd", h, w2)


def moe_seq(x, router, w1, w2):
    dispatch, combine = route(x, router)
    xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    return jnp.einsum("gsec,egcd->gsd", combine, run_experts(xe, w1, w2))


def to_experts(xe):
    """(E, 1, C, D) buffers of this rank's group -> (E/EP, G, C, D): its experts' buffers of every group."""
    return jax.lax.all_to_all(xe, "ep", split_axis=0, concat_axis=1, tiled=True)


def to_groups(ye):
    """The inverse: (E/EP, G, C, D) -> (E, 1, C, D), every expert's results for this rank's group."""
    return jax.lax.all_to_all(ye, "ep", split_axis=1, concat_axis=0, tiled=True)


def moe_local(x, router, w1, w2):
    dispatch, combine = route(x, router)
    xe = to_experts(jnp.einsum("gsec,gsd->egcd", dispatch, x))
    return jnp.einsum("gsec,egcd->gsd", combine, to_groups(run_experts(xe, w1, w2)))


@dlverify.case
def moe_all_to_all_top1():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local), args=_args(), expect="verified",
        description="Top-1 GShard MoE, tokens and 8 experts over EP=4, all_to_all dispatch and combine")


# --------------------------------------------------------------- buggy twins

def _round_robin(xe):
    """Experts reordered so that expert i * EP + r comes at r * LOCAL + i."""
    return xe.reshape(LOCAL, EP, *xe.shape[1:]).swapaxes(0, 1).reshape(xe.shape)


def _round_robin_inverse(ye):
    return ye.reshape(EP, LOCAL, *ye.shape[1:]).swapaxes(0, 1).reshape(ye.shape)


def moe_local_round_robin(x, router, w1, w2):
    dispatch, combine = route(x, router)
    xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    xe = to_experts(_round_robin(xe))  # BUG: experts placed round-robin, weights sharded in blocks
    ye = _round_robin_inverse(to_groups(run_experts(xe, w1, w2)))
    return jnp.einsum("gsec,egcd->gsd", combine, ye)


@dlverify.case
def moe_a2a_bug_round_robin_placement():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local_round_robin), args=_args(), expect="bug",
        description="GShard MoE whose dispatch places experts round-robin over ranks that hold "
                    "contiguous blocks of expert weights")


def moe_local_return_wrong_axes(x, router, w1, w2):
    dispatch, combine = route(x, router)
    xe = to_experts(jnp.einsum("gsec,gsd->egcd", dispatch, x))
    ye = run_experts(xe, w1, w2)
    ye = jax.lax.all_to_all(ye, "ep", split_axis=1, concat_axis=1, tiled=True)  # BUG: concatenated along the group dim
    return jnp.einsum("gsec,egcd->gsd", combine, ye.reshape(EXPERTS, 1, CAPACITY, D_MODEL))


@dlverify.case
def moe_a2a_bug_return_exchange_wrong_axes():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local_return_wrong_axes), args=_args(), expect="bug",
        description="GShard MoE whose return all_to_all concatenates along the group dim, "
                    "reshaped to fit")
