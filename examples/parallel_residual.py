"""GPT-NeoX / GPT-J / PaLM parallel residual block under Megatron tensor parallelism.

The sequential block adds attention and MLP to the same input:

    out = x + attn(ln1(x)) + mlp(ln2(x))

with attn = o @ wo + bo and mlp = gelu(h @ w1 + bb1) @ w2 + bb2. The distributed
block shards heads and hidden units over 'tp' and saves one all-reduce by summing
the two row-parallel partials first (as GPT-NeoX's `gpt_j_residual` does), then
adds the replicated biases once:

    out = x + psum(attn_partial + mlp_partial) + bo + bb2

The terms are added in another order than the sequential program adds them;
dlverify splits the psum of the add (psum(a + b) = psum(a) + psum(b)) and sums
the complete terms as one sum tree (datalog/sum_trees.dl).

Cases: forward at TP=2 and TP=4, gradients of every parameter at TP=2 (jax.grad
inside shard_map with JAX's replication checks), and buggy twins: a bias inside
the psum (counted once per rank), the MLP partial added after the psum (never
reduced), and the residual inside the psum.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

B, S, D, F, H = 2, 8, 16, 32, 4
DH = D // H
N_PARAMS = 12


def _args():
    f32 = jnp.float32
    shapes = ((B, S, D), (D,), (D,), (D,), (D,), (D, 3, H, DH), (H, DH, D), (D,), (D, F), (F,),
              (F, D), (D,))
    return tuple(jax.ShapeDtypeStruct(s, f32) for s in shapes)


# x, ln1 gain/bias, ln2 gain/bias, fused QKV (heads sharded), wo (heads sharded), bo,
# w1 (columns sharded), bb1 (sharded), w2 (rows sharded), bb2
SPECS = (P(), P(), P(), P(), P(), P(None, None, "tp"), P("tp"), P(), P(None, "tp"), P("tp"),
         P("tp"), P())


def _dist(local_fn, tp, check_vma=True, out_specs=P()):
    mesh = dlverify.host_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=SPECS, out_specs=out_specs,
                                 check_vma=check_vma))


def layer_norm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps) * g + b


def attention(h, wqkv, wo):
    """Causal attention over the heads wqkv holds; the output projection without bias."""
    qkv = jnp.einsum("bsd,dthe->bsthe", h, wqkv)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s = jnp.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(DH)
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, -1), v)
    return jnp.einsum("bqhe,hed->bqd", o, wo)


def mlp(h, w1, bb1, w2):
    return jax.nn.gelu(h @ w1 + bb1) @ w2


# ---------------------------------------------------------------- reference

def block_seq(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
    attn = attention(layer_norm(x, g1, b1), wqkv, wo) + bo
    return x + attn + (mlp(layer_norm(x, g2, b2), w1, bb1, w2) + bb2)


def block_local(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
    a = attention(layer_norm(x, g1, b1), wqkv, wo)         # this rank's heads: a partial sum
    m = mlp(layer_norm(x, g2, b2), w1, bb1, w2)            # this rank's hidden units: a partial sum
    return x + jax.lax.psum(a + m, "tp") + bo + bb2        # one all-reduce for both


def _loss(block):
    return lambda *p: (block(*p) ** 2).mean()


def _grads(block):
    return jax.grad(_loss(block), argnums=tuple(range(N_PARAMS)))


@dlverify.case
def parallel_residual_tp2():
    return dlverify.Case(
        seq=block_seq, dist=_dist(block_local, 2), args=_args(), expect="verified",
        description="parallel residual: one psum of attention + MLP partials, biases after; TP=2")


@dlverify.case
def parallel_residual_tp4():
    return dlverify.Case(
        seq=block_seq, dist=_dist(block_local, 4), args=_args(), expect="verified",
        description="parallel residual: one psum of attention + MLP partials, biases after; TP=4")


@dlverify.case
def parallel_residual_grads_tp2():
    return dlverify.Case(
        seq=_grads(block_seq), dist=_dist(_grads(block_local), 2, out_specs=SPECS),
        args=_args(), expect="verified",
        description="parallel residual: gradients of every parameter (jax.grad in shard_map); TP=2")


# --------------------------------------------------------------- buggy twins

def block_local_bias_in_psum(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
    a = attention(layer_norm(x, g1, b1), wqkv, wo)
    m = mlp(layer_norm(x, g2, b2), w1, bb1, w2)
    return x + jax.lax.psum(a + bo + m, "tp") + bb2  # BUG: bo added on every rank before the psum


def block_local_mlp_unreduced(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
    a = attention(layer_norm(x, g1, b1), wqkv, wo)
    m = mlp(layer_norm(x, g2, b2), w1, bb1, w2)
    return x + jax.lax.psum(a, "tp") + m + bo + bb2  # BUG: the MLP partial is never reduced


def block_local_residual_in_psum(x, g1, b1, g2, b2, wqkv, wo, bo, w1, bb1, w2, bb2):
    a = attention(layer_norm(x, g1, b1), wqkv, wo)
    m = mlp(layer_norm(x, g2, b2), w1, bb1, w2)
    return jax.lax.psum(x + a + m, "tp") + bo + bb2  # BUG: the residual is summed over the ranks


@dlverify.case
def parallel_residual_bug_bias_in_psum():
    return dlverify.Case(
        seq=block_seq, dist=_dist(block_local_bias_in_psum, 2, check_vma=False), args=_args(),
        expect="bug", description="parallel residual with the attention bias inside the psum (TP=2)")


@dlverify.case
def parallel_residual_bug_mlp_unreduced():
    return dlverify.Case(
        seq=block_seq, dist=_dist(block_local_mlp_unreduced, 2, check_vma=False), args=_args(),
        expect="bug", description="parallel residual whose MLP partial is added after the psum (TP=2)")


@dlverify.case
def parallel_residual_bug_residual_in_psum():
    return dlverify.Case(
        seq=block_seq, dist=_dist(block_local_residual_in_psum, 2, check_vma=False), args=_args(),
        expect="bug", description="parallel residual with the residual inside the psum (TP=2)")
