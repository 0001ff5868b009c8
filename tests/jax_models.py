"""Small JAX models sharded with `jax.jit` shardings (no shard_map), for the
tests of the compiled-HLO path: a Megatron MLP and a 2-layer pre-LayerNorm
transformer block stack, forward and backward (`jax.grad` of a loss), on a
1-D or a 2x2 ("data", "model") mesh."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

B, S, D, H, F = 4, 8, 16, 4, 32
DH = D // H


def mesh(shape=(2, 2), names=("data", "model")) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def shardings(m: Mesh, tree):
    return jax.tree.map(lambda s: NamedSharding(m, s), tree, is_leaf=lambda x: isinstance(x, P))


# ---------------------------------------------------------------- MLP

def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def mlp_loss(x, w1, w2):
    return jnp.mean(mlp(x, w1, w2) ** 2)


def mlp_args():
    rng = np.random.default_rng(0)
    f32 = np.float32
    return (rng.standard_normal((8, 16)).astype(f32), rng.standard_normal((16, 32)).astype(f32),
            rng.standard_normal((32, 16)).astype(f32))


MLP_SPECS = (P("data", None), P(None, "model"), P("model", None))


def mlp_jit(m: Mesh, backward: bool = False, specs=MLP_SPECS, out=P("data", None)):
    if backward:
        return jax.jit(jax.grad(mlp_loss, argnums=(1, 2)), in_shardings=shardings(m, specs),
                       out_shardings=shardings(m, (specs[1], specs[2])))
    return jax.jit(mlp, in_shardings=shardings(m, specs), out_shardings=NamedSharding(m, out))


# ---------------------------------------------------------------- transformer

def layer_norm(x, g):
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g


def attention(x, wq, wk, wv, wo):
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    k = jnp.einsum("bsd,dhk->bshk", x, wk)
    v = jnp.einsum("bsd,dhk->bshk", x, wv)
    s = jnp.einsum("bshk,bthk->bhst", q, k) / np.sqrt(DH)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bhst,bthk->bshk", p, v)
    return jnp.einsum("bshk,hkd->bsd", o, wo)


def block(x, p):
    x = x + attention(layer_norm(x, p["g1"]), p["wq"], p["wk"], p["wv"], p["wo"])
    h = jax.nn.gelu(layer_norm(x, p["g2"]) @ p["w1"])
    return x + h @ p["w2"]


def transformer(x, params):
    for p in params:
        x = block(x, p)
    return x


def transformer_loss(x, params):
    return jnp.mean(transformer(x, params) ** 2)


LAYER_SPECS = {"g1": P(), "wq": P(None, "model", None), "wk": P(None, "model", None),
               "wv": P(None, "model", None), "wo": P("model", None, None), "g2": P(),
               "w1": P(None, "model"), "w2": P("model", None)}


def transformer_args(layers: int = 2):
    rng = np.random.default_rng(1)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    params = [{"g1": np.ones(D, np.float32), "wq": w(D, H, DH), "wk": w(D, H, DH),
               "wv": w(D, H, DH), "wo": w(H, DH, D), "g2": np.ones(D, np.float32),
               "w1": w(D, F), "w2": w(F, D)} for _ in range(layers)]
    return rng.standard_normal((B, S, D)).astype(np.float32), params


def transformer_jit(m: Mesh, layers: int = 2, backward: bool = False):
    in_specs = (P("data", None, None), [LAYER_SPECS] * layers)
    if backward:
        return jax.jit(jax.grad(transformer_loss, argnums=1),
                       in_shardings=shardings(m, in_specs),
                       out_shardings=shardings(m, [LAYER_SPECS] * layers))
    return jax.jit(transformer, in_shardings=shardings(m, in_specs),
                   out_shardings=NamedSharding(m, P("data", None, None)))
