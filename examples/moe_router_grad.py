"""The gradient of a top-2 MoE router (Mixtral/GShard style: softmax over the two
largest logits) in data-parallel training: tokens split over 'dp' (DP=4), each
rank's router-weight gradient of its mean loss pmean'd. jax.grad of `lax.top_k`
scatter-adds the cotangent back at the chosen experts' indices (a one-hot
contraction in the IR).

Twin: the gradients psum'd instead of averaged over 'dp'.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

DP, TOKENS, D, EXPERTS = 4, 16, 8, 6


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f32), jax.ShapeDtypeStruct((TOKENS, D), f32),
            jax.ShapeDtypeStruct((D, EXPERTS), f32))


def _loss(x, y, wg):
    """Each token's two gate weights times its two chosen logits, against a target."""
    vals, _ = lax.top_k(x @ wg, 2)
    gates = jax.nn.softmax(vals, axis=-1)
    return jnp.mean((jnp.sum(gates * vals, axis=-1) - jnp.sum(y, axis=-1)) ** 2)


def router_grad_seq(x, y, wg):
    return jax.grad(_loss, argnums=2)(x, y, wg)


def router_grad_local(x, y, wg):
    return lax.pmean(jax.grad(_loss, argnums=2)(x, y, wg), "dp")


def router_grad_local_psum(x, y, wg):
    return lax.psum(jax.grad(_loss, argnums=2)(x, y, wg), "dp")  # BUG: summed, not averaged


def _dp(fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("dp"), P("dp"), P()), out_specs=P(),
                                 check_vma=False))


@dlverify.case
def moe_top2_router_grad_dp():
    return dlverify.Case(seq=router_grad_seq, dist=_dp(router_grad_local), args=_args(),
                         expect="verified",
                         description="top-2 router gradient, tokens split over 'dp'; DP=4")


@dlverify.case
def moe_top2_router_grad_bug_psum():
    return dlverify.Case(seq=router_grad_seq, dist=_dp(router_grad_local_psum), args=_args(),
                         expect="bug", description="router gradients summed over 'dp'")
