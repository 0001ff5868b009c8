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

Also a two-layer tanh MLP's mean output, whose cotangent is the constant
1/batch: each rank's 1/(batch/DP) is DP times the sequential constant, so each
rank's gradients are DP times partial sums and the pmean makes them whole.

Buggy twins: psum without dividing by the dp size, a pmean applied to a
gradient that autodiff had already summed, and the MLP's averaged gradients
divided by DP once more.
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
        description="data-parallel MSE gradient summed over 'dp' without dividing by DP")


# ------------------------------- implicit: autodiff sums over 'dp', then divide

def grad_local_implicit_sum(w, x, t):
    g = jax.grad(mse)(w, x, t)   # w is invariant: autodiff psums the cotangent over 'dp'
    return g / DP


@dlverify.case
def dp_grad_implicit_psum():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(grad_local_implicit_sum), args=_args(), expect="verified",
        description="data-parallel MSE gradient w.r.t. a replicated w (autodiff inserts the psum), divided by DP")


def grad_local_implicit_then_pmean(w, x, t):
    """Bug: pmean of a gradient that autodiff has already summed over 'dp'.

    g is invariant (already the sum of the local gradients); pmean of an
    invariant value returns it unchanged, so the result is DP times too large.
    """
    g = jax.grad(mse)(w, x, t)
    return jax.lax.pmean(g, "dp")  # BUG: g is already summed over 'dp'; the mean should divide it by DP


@dlverify.case
def dp_grad_bug_pmean_of_summed_grad():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(grad_local_implicit_then_pmean), args=_args(), expect="bug",
        description="pmean applied to a replicated-parameter gradient that autodiff already summed over 'dp'")


# ---------------------------------------------- a two-layer model: the mean's cotangent is a constant
HIDDEN = 8


def _mlp_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((D_IN, HIDDEN), f32), jax.ShapeDtypeStruct((HIDDEN, 1), f32),
            jax.ShapeDtypeStruct((BATCH, D_IN), f32))


def mlp_mean(w1, w2, x):
    """The mean output of a tanh MLP: its cotangent is the constant 1/batch, which each
    rank holds as 1/(BATCH/DP), DP times the sequential value."""
    return jnp.mean(jnp.tanh(x @ w1) @ w2)


def mlp_grads_seq(w1, w2, x):
    return jax.grad(mlp_mean, argnums=(0, 1))(w1, w2, x)


def _mlp_dist(local_fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P(), P("dp")),
                                 out_specs=(P(), P()), check_vma=False))


def mlp_grads_pmean(w1, w2, x):
    return tuple(jax.lax.pmean(g, "dp") for g in jax.grad(mlp_mean, argnums=(0, 1))(w1, w2, x))


@dlverify.case
def dp_mlp_grads_pmean():
    return dlverify.Case(
        seq=mlp_grads_seq, dist=_mlp_dist(mlp_grads_pmean), args=_mlp_args(), expect="verified",
        description="data-parallel gradients of a two-layer MLP's mean output: local grads, pmean; DP=4")


def mlp_grads_global_batch(w1, w2, x):
    grads = jax.grad(mlp_mean, argnums=(0, 1))(w1, w2, x)
    return tuple(jax.lax.pmean(g, "dp") / DP for g in grads)  # BUG: the local mean's grads divided by DP again


@dlverify.case
def dp_mlp_grads_bug_divided_twice():
    return dlverify.Case(
        seq=mlp_grads_seq, dist=_mlp_dist(mlp_grads_global_batch), args=_mlp_args(), expect="bug",
        description="data-parallel MLP gradients averaged over 'dp' and divided by DP once more")
