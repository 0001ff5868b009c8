"""Data-parallel gradient of a linear model's mean-squared error.

loss(w) = mean((x @ w - t) ** 2) over the full batch; the batch is sharded
over 'dp' and w is replicated. Each rank differentiates the mean loss of
its own shard; the mean of those local gradients over 'dp' is the full
gradient (all shards have the same size).

Under check_vma=True, autodiff of a replicated (invariant) w inside
shard_map already sums the cotangent over 'dp' (the transpose of the
implicit pvary is a psum). The cases cover both ways of writing it:
making w varying first (pcast) and averaging explicitly, or relying on the
implicit sum and dividing by the dp size.

Buggy twins: psum without dividing by the dp size, and a pmean applied to
a gradient that autodiff had already summed.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP = 4
BATCH, D_IN, D_OUT = 32, 16, 4


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D_IN, D_OUT), f32),   # w
        jax.ShapeDtypeStruct((BATCH, D_IN), f32),   # x
        jax.ShapeDtypeStruct((BATCH, D_OUT), f32),  # t (targets)
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                                 out_specs=P()))


def mse(w, x, t):
    return jnp.mean((x @ w - t) ** 2)


def grad_seq(w, x, t):
    return jax.grad(mse)(w, x, t)


# ---------------------------------------------- explicit: local grad, then pmean

def grad_local_pmean(w, x, t):
    w = jax.lax.pcast(w, "dp", to="varying")   # differentiate this rank's copy of w
    g = jax.grad(mse)(w, x, t)                 # gradient of the local mean loss
    return jax.lax.pmean(g, "dp")


@dlverify.case
def dp_grad_pmean():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(grad_local_pmean), args=_args(), expect="verified",
        description="data-parallel MSE gradient: local jax.grad, then pmean over 'dp'; DP=4")


def grad_local_psum_no_divide(w, x, t):
    """Bug: the local gradients of the local *mean* losses are summed, not averaged.

    The result is DP times the full-batch gradient.
    """
    w = jax.lax.pcast(w, "dp", to="varying")
    g = jax.grad(mse)(w, x, t)
    return jax.lax.psum(g, "dp")  # BUG: psum without dividing by the dp size


@dlverify.case
def dp_grad_bug_psum_no_divide():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(grad_local_psum_no_divide), args=_args(), expect="bug",
        description="data-parallel MSE gra