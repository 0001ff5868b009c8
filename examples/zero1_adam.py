"""ZeRO-1: an Adam step with the optimizer state sharded over the data-parallel
ranks (DeepSpeed ZeRO stage 1, the sharded optimizer of PyTorch's
ZeroRedundancyOptimizer). The batch is split over 'dp'; each rank computes its
local gradient, a reduce-scatter (psum_scatter, divided by the world size) leaves
each rank the mean gradient of its rows of every weight, the rank updates its
rows of the weights and its shard of the first and second moments (the first
bias-corrected Adam step, from zero moments), and an all-gather rebuilds the
replicated weights.

The sequential program is one Adam step on the whole batch.

Buggy twins:
- the moments are updated with the rank's own gradient rows (the reduce-scatter
  forgotten: the rows are sliced from the local gradient), a mistake that trains
  on 1 / dp of the batch per row block;
- the reduce-scattered gradient is divided by the world size twice (once by the
  loss and once after the collective), an effective learning rate off by dp.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP, BATCH, D_IN, D_HID = 4, 8, 8, 16
B1, B2, LR, EPS = 0.9, 0.999, 1e-3, 1e-8
f32 = jnp.float32


def _args():
    return (jax.ShapeDtypeStruct((D_IN, D_HID), f32), jax.ShapeDtypeStruct((D_HID, D_IN), f32),
        jax.ShapeDtypeStruct((BATCH, D_IN), f32), jax.ShapeDtypeStruct((BATCH, D_IN), f32))


def loss(w1, w2, x, y):
    return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)


def adam(p, g):
    """Adam's first step from zero moments: the updated weights and the moments."""
    m = B1 * jnp.zeros_like(g) + (1 - B1) * g
    v = B2 * jnp.zeros_like(g) + (1 - B2) * g * g
    return p - LR * (m / (1 - B1)) / (jnp.sqrt(v / (1 - B2)) + EPS), m, v


def adam_seq(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    w1, m1, v1 = adam(w1, g1)
    w2, m2, v2 = adam(w2, g2)
    return w1, w2, m1, m2, v1, v2


def _rows(w):
    """This rank's rows of a replicated weight."""
    n = w.shape[0] // DP
    return jax.lax.dynamic_slice_in_dim(w, jax.lax.axis_index("dp") * n, n, 0)


def mean_grad_rows(g):
    """This rank's rows of the gradient summed over the ranks, divided by the world size."""
    return jax.lax.psum_scatter(g, "dp", scatter_dimension=0, tiled=True) / DP


def update_rows(w1, w2, g1, g2):
    """Adam on this rank's rows with their gradient rows; the weights all-gathered."""
    p1, m1, v1 = adam(_rows(w1), g1)
    p2, m2, v2 = adam(_rows(w2), g2)
    return (jax.lax.all_gather(p1, "dp", axis=0, tiled=True),
            jax.lax.all_gather(p2, "dp", axis=0, tiled=True), m1, m2, v1, v2)


def zero1_local(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    return update_rows(w1, w2, mean_grad_rows(g1), mean_grad_rows(g2))


def _dist(local_fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    rows = P("dp")
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P(), rows, rows),
                                 out_specs=(P(), P()) + (rows,) * 4, check_vma=False))


@dlverify.case
def zero1_adam_step():
    return dlverify.Case(
        seq=adam_seq, dist=_dist(zero1_local), args=_args(), expect="verified",
        description="ZeRO-1 Adam step: reduce-scattered mean gradient, sharded moments, "
                    "all-gathered weights, DP=4")


# --------------------------------------------------------------- buggy twins

def zero1_local_gradient(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)  # BUG: local gradients, used unreduced
    return update_rows(w1, w2, _rows(g1), _rows(g2))


@dlverify.case
def zero1_bug_local_gradient():
    return dlverify.Case(
        seq=adam_seq, dist=_dist(zero1_local_gradient), args=_args(), expect="bug",
        description="ZeRO-1 Adam step whose moments see each rank's local gradient only")


def zero1_divided_twice(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    g1, g2 = mean_grad_rows(g1) / DP, mean_grad_rows(g2) / DP  # BUG: divided by the world size again
    return update_rows(w1, w2, g1, g2)


@dlverify.case
def zero1_bug_grad_divided_twice():
    return dlverify.Case(
        seq=adam_seq, dist=_dist(zero1_divided_twice), args=_args(), expect="bug",
        description="ZeRO-1 Adam step whose reduce-scattered gradient is divided by the world size twice")
