"""Norm-weight gradient not all-reduced under sequence parallelism (Megatron-LM #1446).

With tensor + sequence parallelism the final LayerNorm/RMSNorm runs on the
rank's sequence shard, so the weight gradient a rank computes,
dgamma = sum over *its* tokens of dy * x_hat, is a partial sum: Megatron must
all-reduce it over the TP group (parameters tagged `sequence_parallel`). In
#1446 the final layernorm's gradient was not all-reduced, so its main_grad
differed across TP ranks before optimizer.step().

The program is the backward of an RMSNorm over sequence shards, written the
way fused norm kernels compute it: dx through the normalisation, dgamma as a
sum over tokens of dy * x_hat.

Cases: the correct backward (TP=4, dgamma all-reduced) and the buggy twin.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
BATCH, SEQ, D = 2, 16, 8
EPS = 1e-5


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((BATCH, SEQ, D), f32),   # x: the norm's input
            jax.ShapeDtypeStruct((D,), f32),              # gamma
            jax.ShapeDtypeStruct((BATCH, SEQ, D), f32))   # dy: gradient of the norm's output


SP = P(None, "tp", None)   # activations sharded along the sequence


def _dist(local_fn, check_vma=True):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP), in_specs=(SP, P(), SP),
                                 out_specs=(SP, P()), check_vma=check_vma))


def normalize(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)


def rmsnorm_backward_seq(x, gamma, dy):
    x_hat, vjp = jax.vjp(normalize, x)
    (dx,) = vjp(dy * gamma)
    dgamma = jnp.sum(dy * x_hat, axis=(0, 1))
    return dx, dgamma


def rmsnorm_backward_local(x, gamma, dy):
    x_hat, vjp = jax.vjp(normalize, x)                       # this rank's tokens
    (dx,) = vjp(dy * gamma)
    dgamma = jax.lax.psum(jnp.sum(dy * x_hat, axis=(0, 1)), "tp")   # sum over all tokens
    return dx, dgamma


@dlverify.case
def megatron1446_norm_grad_sp():
    return dlverify.Case(
        seq=rmsnorm_backward_seq, dist=_dist(rmsnorm_backward_local), args=_args(),
        expect="verified",
        description="RMSNorm backward on sequence shards; the weight gradient all-reduced over "
                    "'tp'; TP=4")


def rmsnorm_backward_local_bug(x, gamma, dy):
    """Megatron-LM #1446: dgamma stays a sum over this rank's tokens only."""
    x_hat, vjp = jax.vjp(normalize, x)
    (dx,) = vjp(dy * gamma)
    dgamma = jnp.sum(dy * x_hat, axis=(0, 1))  # BUG: this rank's tokens only, not all-reduced
    return dx, dgamma


@dlverify.case
def megatron1446_norm_grad_sp_bug():
    return dlverify.Case(
        seq=rmsnorm_backward_seq, dist=_dist(rmsnorm_backward_local_bug, check_vma=False),
        args=_args(), expect="bug",
        description="Megatron-LM #1446: norm weight gradient under sequence parallelism not "
                    "all-reduced")
