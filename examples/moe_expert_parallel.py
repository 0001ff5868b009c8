"""Expert parallelism: top-1 and top-2 mixture-of-experts layers with capacity,
written GShard-style with dense dispatch and combine tensors, experts sharded
over 'ep'.

Routing (identical on both sides, on the full token set): argmax of the router
logits picks each token's expert, a cumsum over tokens gives its slot in that
expert, tokens beyond the capacity are dropped; the dispatch mask (T, E, C)
gathers tokens into per-expert buffers, each expert's MLP runs, the combine
einsum (weighted by the softmax gate) scatters them back. Each rank holds
E / EP experts' weights, takes its experts' columns of the dispatch mask and
gate (a dynamic_slice at axis_index * E / EP), and one psum over 'ep' adds the
experts' contributions.

dlverify relates argmax, top_k, cumsum and the capacity mask over dims every
rank holds whole, and the per-rank expert slices to blocks of the sequential mask.

Buggy twins: the psum over experts is missing; the gate softmax is normalised
over each rank's experts only; top-2 routing picks among each rank's experts
only. (A mask or gate sliced at the wrong expert
offset is found too, but located at the expert einsum that first combines the
wrong blocks, not at the slice: not shipped as a twin.)
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TOKENS, D_MODEL, EXPERTS, CAPACITY, D_FF, EP = 16, 8, 4, 6, 16, 2
LOCAL = EXPERTS // EP
f32 = jnp.float32


def _args():
    return (
        jax.ShapeDtypeStruct((TOKENS, D_MODEL), f32),             # x
        jax.ShapeDtypeStruct((D_MODEL, EXPERTS), f32),            # router
        jax.ShapeDtypeStruct((EXPERTS, D_MODEL, D_FF), f32),      # w1 per expert
        jax.ShapeDtypeStruct((EXPERTS, D_FF, D_MODEL), f32),      # w2 per expert
    )


def _dist(local_fn, check_vma=True):
    mesh = dlverify.host_mesh((EP,), ("ep",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P(), P("ep"), P("ep")),
                                 out_specs=P(), check_vma=check_vma))


def route(x, router):
    """Top-1 routing with capacity: the dispatch mask (T, E, C) and the gates (T, E)."""
    logits = x @ router
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), EXPERTS, dtype=f32)
    slot = jnp.cumsum(onehot, axis=0) * onehot - onehot        # position in the expert's buffer
    keep = onehot * (slot < CAPACITY)                          # dropped beyond the capacity
    slots = jax.nn.one_hot(jnp.sum(slot * keep, axis=-1).astype(jnp.int32), CAPACITY, dtype=f32)
    return keep[:, :, None] * slots[:, None, :], jax.nn.softmax(logits, axis=-1)


def top2_dispatch(logits):
    """Each token's two best experts among the columns of `logits` (lax.top_k),
    (T, E) with two ones per token, and the dispatch mask (T, E, C): slots and
    the capacity drop as in `route`."""
    _, best = jax.lax.top_k(logits, 2)
    chosen = jax.nn.one_hot(best, logits.shape[-1], dtype=f32).sum(axis=1)
    slot = jnp.cumsum(chosen, axis=0) * chosen - chosen
    keep = chosen * (slot < CAPACITY)
    return chosen, keep[:, :, None] * jax.nn.one_hot((slot * keep).astype(jnp.int32), CAPACITY, dtype=f32)


def route_top2(x, router):
    """Top-2 routing with capacity (GShard): the dispatch mask and the gates."""
    logits = x @ router
    chosen, mask = top2_dispatch(logits)
    return mask, jax.nn.softmax(logits, axis=-1) * chosen


def experts(mask, gate, x, w1, w2):
    xe = jnp.einsum("tec,td->ecd", mask, x)                    # dispatch
    ye = jnp.einsum("ecf,efd->ecd", jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xe, w1)), w2)
    return jnp.einsum("tec,ecd,te->td", mask, ye, gate)        # combine


def moe_seq(x, router, w1, w2):
    mask, gate = route(x, router)
    return experts(mask, gate, x, w1, w2)


def expert_parallel(routing):
    """The EP program of a routing: each rank takes its experts' columns of the
    full routing's mask and gates, runs its experts, and one psum adds them."""
    def local(x, router, w1, w2):
        mask, gate = routing(x, router)
        first = jax.lax.axis_index("ep") * LOCAL               # this rank's experts
        mask = jax.lax.dynamic_slice_in_dim(mask, first, LOCAL, axis=1)
        gate = jax.lax.dynamic_slice_in_dim(gate, first, LOCAL, axis=1)
        return jax.lax.psum(experts(mask, gate, x, w1, w2), "ep")
    return local


moe_local = expert_parallel(route)


@dlverify.case
def moe_top1_capacity():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local), args=_args(), expect="verified",
        description="Top-1 MoE with capacity, dense dispatch/combine, 4 experts over EP=2")


def moe_top2_seq(x, router, w1, w2):
    mask, gate = route_top2(x, router)
    return experts(mask, gate, x, w1, w2)


@dlverify.case
def moe_top2_capacity():
    return dlverify.Case(
        seq=moe_top2_seq, dist=_dist(expert_parallel(route_top2)), args=_args(), expect="verified",
        description="Top-2 MoE (lax.top_k) with capacity, dense dispatch/combine, 4 experts over EP=2")


# --------------------------------------------------------------- buggy twins

def moe_local_no_psum(x, router, w1, w2):
    mask, gate = route(x, router)
    first = jax.lax.axis_index("ep") * LOCAL
    mask = jax.lax.dynamic_slice_in_dim(mask, first, LOCAL, axis=1)
    gate = jax.lax.dynamic_slice_in_dim(gate, first, LOCAL, axis=1)
    return experts(mask, gate, x, w1, w2)  # BUG: the experts' contributions are never summed over 'ep'


@dlverify.case
def moe_bug_missing_psum():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local_no_psum, check_vma=False), args=_args(), expect="bug",
        description="MoE whose ranks return only their own experts' contributions")


def moe_local_local_softmax(x, router, w1, w2):
    mask, _ = route(x, router)
    first = jax.lax.axis_index("ep") * LOCAL
    mask = jax.lax.dynamic_slice_in_dim(mask, first, LOCAL, axis=1)
    logits = jax.lax.dynamic_slice_in_dim(x @ router, first, LOCAL, axis=1)
    gate = jax.nn.softmax(logits, axis=-1)  # BUG: the gates are normalised over this rank's experts only
    return jax.lax.psum(experts(mask, gate, x, w1, w2), "ep")


@dlverify.case
def moe_bug_gate_softmax_over_local_experts():
    return dlverify.Case(
        seq=moe_seq, dist=_dist(moe_local_local_softmax), args=_args(), expect="bug",
        description="MoE whose gate softmax runs over each rank's experts instead of all experts")


def moe_top2_local_routing(x, router, w1, w2):
    first = jax.lax.axis_index("ep") * LOCAL
    logits = jax.lax.dynamic_slice_in_dim(x @ router, first, LOCAL, axis=1)  # BUG: routes among this rank's experts only
    chosen, mask = top2_dispatch(logits)
    gate = jax.lax.dynamic_slice_in_dim(jax.nn.softmax(x @ router, axis=-1), first, LOCAL, axis=1) * chosen
    return jax.lax.psum(experts(mask, gate, x, w1, w2), "ep")


@dlverify.case
def moe_bug_top2_among_local_experts():
    return dlverify.Case(
        seq=moe_top2_seq, dist=_dist(moe_top2_local_routing), args=_args(), expect="bug",
        description="Top-2 MoE whose ranks pick each token's two best experts among their own experts")
