"""HSDP (hybrid sharded data parallel) gradient synchronisation: two-level reductions.

loss(w) = mean((x @ w - t) ** 2) over the full batch. The mesh is
('replica', 'shard'), 2 x 2. The batch is sharded over both axes; w is sharded
over 'shard' (FSDP inside a replica group) and replicated over 'replica'.
Each rank all-gathers w over 'shard', differentiates its local mean loss,
reduce-scatters the gradient over 'shard' (psum_scatter) and averages it over
'replica' (pmean): a partial sum over the ranks of 'shard', reduced over
'shard', is still a partial sum over 'replica', which pmean completes.

The same by autodiff: the gradient of the local w shard, where JAX inserts the
reduce-scatter over 'shard' (the transpose of all_gather) and the sum over
'replica' (w is invariant over it). Also the plain two-level all-reduce
psum(psum(g, 'replica'), 'shard') of a gradient whose batch is sharded over
both axes (the outer axis reduced first).

Buggy twins: the second level averages over 'shard' again (the replicas are
never combined), the autodiff gradient divided by the 'shard' size only, and
the two-level psum that reduces 'replica' twice.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

R, S = 2, 2
BATCH, D_IN, D_OUT = 16, 8, 4


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D_IN, D_OUT), f32),   # w
        jax.ShapeDtypeStruct((BATCH, D_IN), f32),   # x
        jax.ShapeDtypeStruct((BATCH, D_OUT), f32),  # t (targets)
    )


def _mesh():
    return dlverify.host_mesh((R, S), ("replica", "shard"))


def _hsdp(local_fn):
    batch = P(("replica", "shard"))
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(P("shard"), batch, batch),
                                 out_specs=P("shard"), check_vma=False))


def _replicated_w(local_fn):
    batch = P(("replica", "shard"))
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(P(), batch, batch),
                                 out_specs=P(), check_vma=False))


def mse(w, x, t):
    return jnp.mean((x @ w - t) ** 2)


def grad_seq(w, x, t):
    return jax.grad(mse)(w, x, t)


# ------------------------------------ HSDP: reduce-scatter over 'shard', pmean over 'replica'

def hsdp_local(w, x, t):
    w_full = jax.lax.all_gather(w, "shard", axis=0, tiled=True)   # FSDP: gather the shard group's w
    g = jax.grad(mse)(w_full, x, t)                               # gradient of the local mean loss
    g = jax.lax.psum_scatter(g, "shard", scatter_dimension=0, tiled=True) / S
    return jax.lax.pmean(g, "replica")


@dlverify.case
def hsdp_grad_sync():
    return dlverify.Case(
        seq=grad_seq, dist=_hsdp(hsdp_local), args=_args(), expect="verified",
        description="HSDP gradient: psum_scatter over 'shard', then pmean over 'replica'; 2x2 mesh")


def hsdp_local_second_level_wrong_axis(w, x, t):
    """Bug: the second level averages over 'shard' again instead of over 'replica'.

    Each rank ends with the gradient of its replica group's half of the batch only.
    """
    w_full = jax.lax.all_gather(w, "shard", axis=0, tiled=True)
    g = jax.grad(mse)(w_full, x, t)
    g = jax.lax.psum_scatter(g, "shard", scatter_dimension=0, tiled=True) / S
    return jax.lax.pmean(g, "shard")  # BUG: the replicas are never combined (pmean over 'shard', not 'replica')


@dlverify.case
def hsdp_bug_second_level_wrong_axis():
    return dlverify.Case(
        seq=grad_seq, dist=_hsdp(hsdp_local_second_level_wrong_axis), args=_args(), expect="bug",
        description="HSDP gradient whose second reduction runs over 'shard' instead of 'replica'")


# ------------------------------------ HSDP by autodiff: the gradient of the local w shard

def _hsdp_vma(local_fn):
    batch = P(("replica", "shard"))
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(P("shard"), batch, batch),
                                 out_specs=P("shard")))


def hsdp_autodiff_local(w, x, t):
    def local_loss(w_shard):
        return mse(jax.lax.all_gather(w_shard, "shard", axis=0, tiled=True), x, t)
    # the transpose of all_gather is a psum_scatter over 'shard'; w is invariant over
    # 'replica', so autodiff also sums the cotangent over 'replica'
    return jax.grad(local_loss)(w) / (R * S)


@dlverify.case
def hsdp_autodiff():
    return dlverify.Case(
        seq=grad_seq, dist=_hsdp_vma(hsdp_autodiff_local), args=_args(), expect="verified",
        description="HSDP gradient of the local w shard by autodiff (reductions inserted by JAX), / R*S")


def hsdp_autodiff_local_divides_by_shard(w, x, t):
    """Bug: autodiff summed the local mean-loss gradients over both axes, but the sum
    is divided by the 'shard' size only: R times the full-batch gradient."""
    def local_loss(w_shard):
        return mse(jax.lax.all_gather(w_shard, "shard", axis=0, tiled=True), x, t)
    return jax.grad(local_loss)(w) / S  # BUG: the gradient is summed over both axes; divide by R * S


@dlverify.case
def hsdp_bug_autodiff_divides_by_shard_only():
    return dlverify.Case(
        seq=grad_seq, dist=_hsdp_vma(hsdp_autodiff_local_divides_by_shard), args=_args(),
        expect="bug", description="HSDP gradient by autodiff divided by the 'shard' size only")


# ------------------------------------ two-level all-reduce, the outer mesh axis first

def two_level_psum_local(w, x, t):
    g = jax.grad(mse)(w, x, t)
    g = jax.lax.psum(jax.lax.psum(g, "replica"), "shard")
    return g / (R * S)


@dlverify.case
def hsdp_two_level_psum():
    return dlverify.Case(
        seq=grad_seq, dist=_replicated_w(two_level_psum_local), args=_args(), expect="verified",
        description="data-parallel gradient over a 2x2 mesh: psum over 'replica', then over 'shard'")


def two_level_psum_local_same_axis_twice(w, x, t):
    """Bug: the second psum runs over 'replica