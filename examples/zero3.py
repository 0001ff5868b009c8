"""ZeRO-3 / FSDP: parameters sharded over 'dp', gathered before use, gradients
reduce-scattered back to the shards.

A two-layer MLP with a LayerNorm gain in front, loss = mean((mlp(ln(x)) - t) ** 2)
over the full batch. The batch is sharded over 'dp' (DP=2); w1 (D, F) and w2
(F, D) are sharded over 'dp' on their first dim (each rank owns a slice of
every parameter, ZeRO-3); the LayerNorm gain is small and kept replicated. Each
rank all-gathers w1 and w2 before the forward, differentiates its local mean
loss, reduce-scatters (psum_scatter) the weight gradients back to the shards
and divides by DP; the replicated gain's gradient is averaged by a pmean.

Buggy twins, both published classes: the replicated gain's gradient is never
all-reduced (each rank keeps the gradient of its own half of the batch;
Megatron-LM #1446, torchtitan PR #1373, NeMo Automodel #3857), and the
reduce-scattered gradient divided by the wrong world size (DeepSpeed #5248).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP = 2
BATCH, D, F = 8, 4, 8


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D,), f32),         # gain (LayerNorm weight), replicated
        jax.ShapeDtypeStruct((D, F), f32),       # w1, sharded over 'dp' on dim 0
        jax.ShapeDtypeStruct((F, D), f32),       # w2, sharded over 'dp' on dim 0
        jax.ShapeDtypeStruct((BATCH, D), f32),   # x
        jax.ShapeDtypeStruct((BATCH, D), f32),   # t (targets)
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    batch = P("dp")
    return jax.jit(jax.shard_map(local_fn, mesh=mesh,
                                 in_specs=(P(), P("dp"), P("dp"), batch, batch),
                                 out_specs=(P(), P("dp"), P("dp")), check_vma=False))


def loss_fn(gain, w1, w2, x, t):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    h = (x - mu) * jax.lax.rsqrt(var + 1e-5) * gain
    y = jax.nn.gelu(h @ w1) @ w2
    return jnp.mean((y - t) ** 2)


def grads_seq(gain, w1, w2, x, t):
    return jax.grad(loss_fn, argnums=(0, 1, 2))(gain, w1, w2, x, t)


def _gather(w):
    return jax.lax.all_gather(w, "dp", axis=0, tiled=True)


def _scatter(g):
    return jax.lax.psum_scatter(g, "dp", scatter_dimension=0, tiled=True)


def zero3_local(gain, w1, w2, x, t):
    g_gain, g1, g2 = jax.grad(loss_fn, argnums=(0, 1, 2))(gain, _gather(w1), _gather(w2), x, t)
    return jax.lax.pmean(g_gain, "dp"), _scatter(g1) / DP, _scatter(g2) / DP


@dlverify.case
def zero3_grads():
    return dlverify.Case(
        seq=grads_seq, dist=_dist(zero3_local), args=_args(), expect="verified",
        description="ZeRO-3 gradient step: all_gather params, psum_scatter grads / DP, "
                    "pmean of the replicated LayerNorm gain; DP=2")


# --------------------------------------------------------------- buggy twins

def zero3_local_gain_not_reduced(gain, w1, w2, x, t):
    """The replicated gain's gradient is never averaged over 'dp': each rank keeps
    the gradient of its own half of the batch (returned below without a pmean)."""
    grad_fn = jax.grad(loss_fn, argnums=(0, 1, 2))
    g_gain, g1, g2 = grad_fn(gain, _gather(w1), _gather(w2), x, t)  # BUG: g_gain is never pmean'd
    return g_gain, _scatter(g1) / DP, _scatter(g2) / DP


@dlverify.case
def zero3_bug_replicated_gain_grad_not_reduced():
    return dlverify.Case(
        seq=grads_seq, dist=_dist(zero3_local_gain_not_reduced), args=_args(), expect="bug",
        description="ZeRO-3 step whose replicated LayerNorm gain gradient is never all-reduced")


def zero3_local_wrong_world_size(gain, w1, w2, x, t):
    """The reduce-scattered w2 gradient is divided by DP twice (the local loss is
    already a mean over the local batch): 1/DP of the true gradient."""
    g_gain, g1, g2 = jax.grad(loss_fn, argnums=(0, 1, 2))(gain, _gather(w1), _gather(w2), x, t)
    g2 = _scatter(g2) / (DP * DP)  # BUG: the sum of DP local-mean gradients must be divided by DP
    return jax.lax.pmean(g_gain, "dp"), _scatter(g1) / DP, g2


@dlverify.case
def zero3_bug_grad_wrong_world_size():
    return dlverify.Case(
        seq=grads_seq, dist=_dist(zero3_local_wrong_world_size), args=_args(), expect="bug",
        description="ZeRO-3 step whose reduce-scattered gradient is divided by the wrong world size")
