"""Gradient accumulation over micro-batches with data parallelism.

loss(w) = mean((x @ w - t) ** 2) over the full batch; the batch is sharded
over 'dp' and w is replicated. Each rank splits its shard into M micro-batches,
adds the gradients of their mean losses into a zeros accumulator (a Python
loop, unrolled in the trace), divides by M and averages over 'dp'. Each
micro-batch gradient is a partial sum over its rows; adding the terms of
adjacent row ranges gives the partial sum over the rank's whole shard, and
zeros + partial = partial.

The same accumulation written with lax.scan and with lax.fori_loop (the loops
are unrolled into the trace), and a scan over stacked (M, B/M) micro-batches
whose rows are sharded over 'dp' (a rank's micro-batches are then not adjacent
rows of the batch), also against a sequential reference that accumulates the
same micro-batches in the same order.

Buggy twins: a scan step that replaces the accumulator instead of adding to it
(only the last micro-batch trains), every step differentiating the first
micro-batch (it is counted M times, the others never), and the accumulated sum
not divided by M.
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


def accumulate_scan_local(w, x, t):
    xs, ts = x.reshape(M, MB, D_IN), t.reshape(M, MB, D_OUT)

    def step(g, batch):
        return g + jax.grad(mse)(w, *batch), None

    g, _ = jax.lax.scan(step, jnp.zeros_like(w), (xs, ts))
    return jax.lax.pmean(g / M, "dp")


@dlverify.case
def microbatch_accumulation_scan():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_scan_local), args=_args(), expect="verified",
        description="data-parallel MSE gradient accumulated over 2 micro-batches by lax.scan, then pmean")


# The micro-batch dim outermost, each micro-batch's rows sharded over 'dp': a rank's
# micro-batches are not adjacent rows of the batch (rows i * B/M + r * B/(M*DP) ...).

def _stacked_args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D_IN, D_OUT), f32),             # w
        jax.ShapeDtypeStruct((M, BATCH // M, D_IN), f32),     # xs: (micro-batch, row, feature)
        jax.ShapeDtypeStruct((M, BATCH // M, D_OUT), f32),    # ts
    )


def grad_seq_stacked(w, xs, ts):
    return jax.grad(mse)(w, xs.reshape(BATCH, D_IN), ts.reshape(BATCH, D_OUT))


def accumulate_stacked_local(w, xs, ts):
    def step(g, batch):
        return g + jax.grad(mse)(w, *batch), None

    g, _ = jax.lax.scan(step, jnp.zeros_like(w), (xs, ts))
    return jax.lax.pmean(g / M, "dp")


@dlverify.case
def microbatch_accumulation_sharded_microbatches():
    mesh = dlverify.host_mesh((DP,), ("dp",))
    dist = jax.jit(jax.shard_map(accumulate_stacked_local, mesh=mesh,
                                 in_specs=(P(), P(None, "dp"), P(None, "dp")), out_specs=P(),
                                 check_vma=False))
    return dlverify.Case(
        seq=grad_seq_stacked, dist=dist, args=_stacked_args(), expect="verified",
        description="scan over (M, B/M) micro-batches whose rows are sharded over 'dp', then pmean")


def accumulate_stacked(w, xs, ts):
    """The accumulation itself, as the sequential reference too (on the whole stack)."""
    g = jnp.zeros_like(w)
    for i in range(M):
        g = g + jax.grad(mse)(w, xs[i], ts[i])
    return g / M


def accumulate_stacked_mirrored_local(w, xs, ts):
    return jax.lax.pmean(accumulate_stacked(w, xs, ts), "dp")


@dlverify.case
def microbatch_accumulation_mirrored():
    mesh = dlverify.host_mesh((DP,), ("dp",))
    dist = jax.jit(jax.shard_map(accumulate_stacked_mirrored_local, mesh=mesh,
                                 in_specs=(P(), P(None, "dp"), P(None, "dp")), out_specs=P(),
                                 check_vma=False))
    return dlverify.Case(
        seq=accumulate_stacked, dist=dist, args=_stacked_args(), expect="verified",
        description="the same micro-batch accumulation on both sides (sharded rows), then pmean")


def accumulate_fori_local(w, x, t):
    def step(i, g):
        xb = jax.lax.dynamic_slice_in_dim(x, i * MB, MB)
        tb = jax.lax.dynamic_slice_in_dim(t, i * MB, MB)
        return g + jax.grad(mse)(w, xb, tb)

    return jax.lax.pmean(jax.lax.fori_loop(0, M, step, jnp.zeros_like(w)) / M, "dp")


@dlverify.case
def microbatch_accumulation_fori():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_fori_local), args=_args(), expect="verified",
        description="gradient accumulation by fori_loop with dynamic_slice micro-batches, then pmean")


def accumulate_scan_local_last_only(w, x, t):
    """Bug (NVIDIA-NeMo/Automodel PR #3530: the gradient reset between micro-batches):
    each step replaces the accumulator, so only the last micro-batch trains."""
    xs, ts = x.reshape(M, MB, D_IN), t.reshape(M, MB, D_OUT)

    def step(g, batch):
        return jax.grad(mse)(w, *batch), None  # BUG: the accumulated g is dropped, not added to

    g, _ = jax.lax.scan(step, jnp.zeros_like(w), (xs, ts))
    return jax.lax.pmean(g / M, "dp")


@dlverify.case
def microbatch_bug_last_microbatch_only():
    return dlverify.Case(
        seq=grad_seq, dist=_dist(accumulate_scan_local_last_only), args=_args(), expect="bug",
        description="scan gradient accumulation that keeps only the last micro-batch's gradient")


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
