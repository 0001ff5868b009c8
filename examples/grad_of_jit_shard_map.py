"""`jax.grad` around a `jax.jit` whose body is a `shard_map`: the training code
that differentiates a tensor-parallel loss from outside.

The gradient's jaxpr is global code around two shard_maps, the forward one and
the transposed backward one. JAX writes `reshard` on the cotangent seed (a
sharding change of a global value: the identity on its value), and passes the
forward shard_map's residuals to the backward one stacked over the ranks
(out_specs / in_specs P('tp')): each rank takes back the block it produced,
which dlverify reads as that block itself (frontends/jaxpr/shard_map.py).

Cases: the gradients of a Megatron MLP's squared error with respect to both
weights (w1 split on its output dim, w2 on its input dim) at TP=2 and TP=4, and
with respect to the input too. Buggy twins: the loss of each rank's partial
output averaged over the ranks (the psum moved after the nonlinearity), and the
gradient of w2 scaled by the number of ranks.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

BATCH, D_MODEL, D_FF = 8, 16, 32
IN_SPECS = (P(), P(), P(None, "tp"), P("tp", None))   # x, target, w1, w2


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),   # x
            jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),   # target
            jax.ShapeDtypeStruct((D_MODEL, D_FF), f32),    # w1
            jax.ShapeDtypeStruct((D_FF, D_MODEL), f32))    # w2


def loss_seq(x, t, w1, w2):
    y = jnp.tanh(x @ w1) @ w2
    return jnp.mean((y - t) ** 2)


def loss_local(x, t, w1, w2):
    h = jnp.tanh(x @ w1)                          # this rank's block of hidden units
    y = jax.lax.psum(h @ w2, "tp")                # the partial products summed
    return jnp.mean((y - t) ** 2)


def loss_local_partial(x, t, w1, w2):
    h = jnp.tanh(x @ w1)
    return jax.lax.pmean(jnp.mean((h @ w2 - t) ** 2), "tp")   # BUG: loss of a partial sum


def _loss(local, tp):
    mesh = dlverify.host_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=IN_SPECS, out_specs=P()))


def _grads(loss, argnums):
    return jax.grad(loss, argnums=argnums)


@dlverify.case
def grad_of_jit_shard_map_tp2():
    return dlverify.Case(
        seq=_grads(loss_seq, (2, 3)), dist=_grads(_loss(loss_local, 2), (2, 3)), args=_args(),
        expect="verified",
        description="jax.grad of a jitted shard_map Megatron MLP loss, both weights; TP=2")


@dlverify.case
def grad_of_jit_shard_map_tp4():
    return dlverify.Case(
        seq=_grads(loss_seq, (2, 3)), dist=_grads(_loss(loss_local, 4), (2, 3)), args=_args(),
        expect="verified",
        description="jax.grad of a jitted shard_map Megatron MLP loss, both weights; TP=4")


@dlverify.case
def grad_of_jit_shard_map_input_too():
    return dlverify.Case(
        seq=_grads(loss_seq, (0, 2, 3)), dist=_grads(_loss(loss_local, 2), (0, 2, 3)),
        args=_args(), expect="verified",
        description="jax.grad of a jitted shard_map Megatron MLP loss, input and weights; TP=2")


@dlverify.case
def grad_of_jit_shard_map_bug_partial_loss():
    return dlverify.Case(
        seq=_grads(loss_seq, (2, 3)), dist=_grads(_loss(loss_local_partial, 2), (2, 3)),
        args=_args(), expect="bug",
        description="the squared error of each rank's partial output, averaged over the ranks")


def _w2_grad_scaled(x, t, w1, w2):
    g1, g2 = _grads(_loss(loss_local, 2), (2, 3))(x, t, w1, w2)
    return g1, g2 * 2   # BUG: the w2 gradient scaled by the number of ranks


@dlverify.case
def grad_of_jit_shard_map_bug_w2_scaled():
    return dlverify.Case(
        seq=_grads(loss_seq, (2, 3)), dist=_w2_grad_scaled, args=_args(), expect="bug",
        description="the w2 gradient multiplied by the number of ranks")
