"""Gradient accumulation over micro-batches with data parallelism.

loss(w) = mean((x @ w - t) ** 2) over the full batch; the batch is sharded
over 'dp' and w is replicated. Each rank splits its shard into M micro-batches,
adds the gradients of their mean losses into a zeros accumulator (a Python
loop, unrolled in the trace), divides by M and averages over 'dp'. Each
micro-batch gradient is a partial sum over its rows; adding the terms of
adjacent row ranges gives the partial sum over the rank's whole shard, and
zeros + partial = partial.

Buggy twins: every step differentiates the first micro-batch (it is counted
M times, the others never), and the accumulated sum not divided by M.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP, M = 2, 2
BATCH, D_IN, D_OUT = 16, 8, 4
MB = BATCH // DP // M   # rows per micro-batch


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
                                 out_specs=P(), check_vma=False))


def mse(w, x, t):
    return jnp.mean((x @ w - t) ** 2)


def grad_seq(w, x, t):
    return jax.grad(mse)(w, x, t)


def accumulate_local(w, x, t):
    g = jnp.zeros_like(w)
    for i in range(M):
        g = g + jax.grad(mse)(w, x[i * MB:(i + 1) * MB], t[i * MB:(i + 1) * MB])
    return jax.lax.pmean(g / M, "dp")


@dlverify.case
def microbatch_accumulation():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_local), args=_args(), expect="verified",
        description="data-parallel MSE gradient accumulated over 2 micro-batches, then pmean; DP=2")


def accumulate_local_first_microbatch(w, x, t):
    """Bug: the slice does not move with the step, so micro-batch 0 is differentiated
    M times and the other micro-batches never."""
    g = jnp.zeros_like(w)
    for i in range(M):
        g = g + jax.grad(mse)(w, x[:MB], t[:MB])  # BUG: every step takes micro-batch 0
    return jax.lax.pmean(g / M, "dp")


@dlverify.case
def microbatch_bug_first_microbatch_only():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_local_first_microbatch), args=_args(), expect="bug",
        description="gradient accumulation whose every step differentiates micro-batch 0")


def accumulate_local_no_divide(w, x, t):
    """Bug: the sum of the M micro-batch mean gradients is not divided by M: the
    result is M times the full-batch gradient."""
    g = jnp.zeros_like(w)
    for i in range(M):
        g = g + jax.grad(mse)(w, x[i * MB:(i + 1) * MB], t[i * MB:(i + 1) * MB])
    return jax.lax.pmean(g, "dp")  # BUG: the accumulated sum is not divided by M


@dlverify.case
def microbatch_bug_not_divided():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_local_no_divide), args=_args(), expect="bug",
        description="gradient accumulation over 2 micro-batches without dividing by M")
