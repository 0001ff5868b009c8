"""Synchronised batch norm in a data-parallel training step (torch's SyncBatchNorm,
flax's BatchNorm with `axis_name`): the batch split over 'dp' (DP=4), each rank's
per-channel sums psum'd before the mean and variance are taken, and the
gradients of conv kernel, scale and shift of each rank's mean loss pmean'd.
jax.grad carries the statistics' cotangents back through the psums, and sums
their [1, c, 1, 1] broadcasts' size-1 dims away (datalog/partials.dl: Red_Root
looks through those round trips).

Twins: each rank's own batch statistics (BatchNorm not synchronised); the psum'd
sums divided by the rank's element count instead of the global one.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

DP, EPS = 4, 1e-5
B, C, C1, H, W = 2, 4, 8, 8, 8       # images per rank (NCHW), conv output channels


def _conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME")


def _per_channel(v):
    return v[None, :, None, None]


def _bn_relu(y, mean, var, g, b):
    return jax.nn.relu((y - _per_channel(mean)) * lax.rsqrt(_per_channel(var) + EPS)
                       * _per_channel(g) + _per_channel(b))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B * DP, C, H, W), f32), jax.ShapeDtypeStruct((C1, C, 3, 3), f32),
            jax.ShapeDtypeStruct((C1,), f32), jax.ShapeDtypeStruct((C1,), f32))


def _batch_stats(y):
    mean = jnp.mean(y, axis=(0, 2, 3))
    return mean, jnp.mean((y - _per_channel(mean)) ** 2, axis=(0, 2, 3))


def block_seq(x, w, g, b):
    y = _conv(x, w)
    return _bn_relu(y, *_batch_stats(y), g, b)


def grads_seq(x, w, g, b):
    return jax.grad(lambda *p: jnp.mean(block_seq(x, *p) ** 2), argnums=(0, 1, 2))(w, g, b)


def _pmean_grads(block, w, g, b):
    """Gradients of this rank's mean loss through `block`, averaged over 'dp'."""
    gr = jax.grad(lambda *p: jnp.mean(block(*p) ** 2), argnums=(0, 1, 2))(w, g, b)
    return jax.tree.map(lambda t: lax.pmean(t, "dp"), gr)


def grads_local(x, w, g, b):
    def block(w_, g_, b_):
        y = _conv(x, w_)
        n = y.shape[0] * y.shape[2] * y.shape[3] * DP          # elements per channel, all ranks
        mean = lax.psum(jnp.sum(y, axis=(0, 2, 3)), "dp") / n
        var = lax.psum(jnp.sum((y - _per_channel(mean)) ** 2, axis=(0, 2, 3)), "dp") / n
        return _bn_relu(y, mean, var, g_, b_)
    return _pmean_grads(block, w, g, b)


def grads_local_unsynced(x, w, g, b):
    def block(w_, g_, b_):
        y = _conv(x, w_)
        mean, var = _batch_stats(y)  # BUG: this rank's batch statistics (BatchNorm not synchronised)
        return _bn_relu(y, mean, var, g_, b_)
    return _pmean_grads(block, w, g, b)


def grads_local_local_count(x, w, g, b):
    def block(w_, g_, b_):
        y = _conv(x, w_)
        n = y.shape[0] * y.shape[2] * y.shape[3]
        mean = lax.psum(jnp.sum(y, axis=(0, 2, 3)), "dp") / n  # BUG: divided by this rank's count
        var = lax.psum(jnp.sum((y - _per_channel(mean)) ** 2, axis=(0, 2, 3)), "dp") / (n * DP)
        return _bn_relu(y, mean, var, g_, b_)
    return _pmean_grads(block, w, g, b)


def _dist(fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("dp"), P(), P(), P()),
                                 out_specs=P(), check_vma=False))


@dlverify.case
def sync_bn_grads():
    return dlverify.Case(seq=grads_seq, dist=_dist(grads_local), args=_args(), expect="verified",
                         description="conv + SyncBatchNorm + relu: gradients of kernel, scale and "
                                     "shift, batch split over 'dp'; DP=4")


@dlverify.case
def sync_bn_grads_bug_unsynced():
    return dlverify.Case(seq=grads_seq, dist=_dist(grads_local_unsynced), args=_args(),
                         expect="bug", description="batch statistics of the local batch only")


@dlverify.case
def sync_bn_grads_bug_local_count():
    return dlverify.Case(seq=grads_seq, dist=_dist(grads_local_local_count), args=_args(),
                         expect="bug", description="the synchronised sum divided by the local count")
