"""Data parallelism with gradient clipping by the global norm, and its ZeRO-2 form.

Sequential: g = grad of the mean loss over the whole batch; c = min(1, M/|g|);
w <- w - lr * c * g, for two weight matrices (one global norm over both).

* Data parallel: each rank takes the gradient of its batch shard's mean loss,
  pmean's it, and clips with the norm of the mean gradient.
* ZeRO-2: the gradients are reduce-scattered (psum_scatter / ranks), each rank
  sums the squares of its two shards (16 and 32 rows: two reductions of
  different sizes), one psum gives the global squared norm, each rank updates its
  rows and the rows are all-gathered.

Buggy twins: the ZeRO-2 norm taken from the local shard only (no psum), and a
gradient pmean'd after JAX's replication checks already summed it (jax.grad of a
replicated parameter inside shard_map with check_vma: the gradient is psum'd
once more, ranks times too large). Clipping hides that bug whenever the norm
exceeds M: the clipped step is then the same, and a numerical comparison on
such data passes; dlverify proves the steps differ (for gradients below M).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP, BATCH, D, F = 4, 8, 16, 32
LR = 0.1
# The data-parallel cases clip above a norm random data stays below, the ZeRO-2 cases
# above one it exceeds: each twin then differs visibly on random data too.
DP_MAX_NORM, ZERO_MAX_NORM = 100.0, 1.0


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((D, F), f32), jax.ShapeDtypeStruct((F, D), f32),
            jax.ShapeDtypeStruct((BATCH, D), f32), jax.ShapeDtypeStruct((BATCH, D), f32))


def _dist(local_fn, check_vma=False):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")),
                                 out_specs=(P(), P()), check_vma=check_vma))


def loss(w1, w2, x, y):
    return ((jnp.tanh(x @ w1) @ w2 - y) ** 2).mean()


def clip_scale(sq_norm, max_norm):
    return jnp.minimum(1.0, max_norm / (jnp.sqrt(sq_norm) + 1e-6))


# ---------------------------------------------------------------- reference

def _step_seq(w1, w2, x, y, max_norm):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    c = clip_scale((g1 ** 2).sum() + (g2 ** 2).sum(), max_norm)
    return w1 - LR * c * g1, w2 - LR * c * g2


def step_seq_dp(w1, w2, x, y):
    return _step_seq(w1, w2, x, y, DP_MAX_NORM)


def step_seq_zero2(w1, w2, x, y):
    return _step_seq(w1, w2, x, y, ZERO_MAX_NORM)


def step_dp(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)   # this shard's mean loss
    g1, g2 = jax.lax.pmean(g1, "dp"), jax.lax.pmean(g2, "dp")
    c = clip_scale((g1 ** 2).sum() + (g2 ** 2).sum(), DP_MAX_NORM)
    return w1 - LR * c * g1, w2 - LR * c * g2


def _scattered_grads(w1, w2, x, y):
    """This rank's rows of the mean gradients (reduce-scattered, / DP)."""
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)
    return (jax.lax.psum_scatter(g1, "dp", scatter_dimension=0, tiled=True) / DP,
            jax.lax.psum_scatter(g2, "dp", scatter_dimension=0, tiled=True) / DP)


def _update_rows(w1, w2, g1, g2, c):
    """This rank's rows updated with the clipped step, then all-gathered."""
    r = jax.lax.axis_index("dp")
    w1s = jax.lax.dynamic_slice_in_dim(w1, r * (D // DP), D // DP, 0)
    w2s = jax.lax.dynamic_slice_in_dim(w2, r * (F // DP), F // DP, 0)
    return (jax.lax.all_gather(w1s - LR * c * g1, "dp", axis=0, tiled=True),
            jax.lax.all_gather(w2s - LR * c * g2, "dp", axis=0, tiled=True))


def step_zero2(w1, w2, x, y):
    g1, g2 = _scattered_grads(w1, w2, x, y)
    c = clip_scale(jax.lax.psum((g1 ** 2).sum() + (g2 ** 2).sum(), "dp"), ZERO_MAX_NORM)
    return _update_rows(w1, w2, g1, g2, c)


@dlverify.case
def dp_clip_global_norm():
    return dlverify.Case(
        seq=step_seq_dp, dist=_dist(step_dp), args=_args(), expect="verified",
        description="data parallel: pmean'd gradients clipped by their global norm; DP=4")


@dlverify.case
def zero2_clip_global_norm():
    return dlverify.Case(
        seq=step_seq_zero2, dist=_dist(step_zero2), args=_args(), expect="verified",
        description="ZeRO-2: reduce-scattered gradients, global norm from a psum of the shards' "
                    "squares; DP=4")


# --------------------------------------------------------------- buggy twins

def step_zero2_local_norm(w1, w2, x, y):
    g1, g2 = _scattered_grads(w1, w2, x, y)
    c = clip_scale((g1 ** 2).sum() + (g2 ** 2).sum(), ZERO_MAX_NORM)  # BUG: no psum: local shards
    return _update_rows(w1, w2, g1, g2, c)


def step_dp_double_sum(w1, w2, x, y):
    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x, y)   # check_vma: already psum'd over dp
    g1, g2 = jax.lax.pmean(g1, "dp"), jax.lax.pmean(g2, "dp")  # BUG: sums the summed gradients again
    c = clip_scale((g1 ** 2).sum() + (g2 ** 2).sum(), DP_MAX_NORM)
    return w1 - LR * c * g1, w2 - LR * c * g2


@dlverify.case
def zero2_clip_bug_local_norm():
    return dlverify.Case(
        seq=step_seq_zero2, dist=_dist(step_zero2_local_norm), args=_args(), expect="bug",
        description="ZeRO-2 clipping by the norm of the local shards (no psum); DP=4")


@dlverify.case
def dp_clip_bug_gradient_summed_twice():
    return dlverify.Case(
        seq=step_seq_dp, dist=_dist(step_dp_double_sum, check_vma=True), args=_args(), expect="bug",
        description="data parallel under check_vma: JAX psums the replicated weights' gradients, "
                    "the pmean keeps the sum (DP times the mean); DP=4")
