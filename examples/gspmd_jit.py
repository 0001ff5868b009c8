"""Programs partitioned by XLA's SPMD partitioner (GSPMD), written as users write
them: the sequential model under `jax.jit` with `in_shardings` / `out_shardings`
(NamedSharding over a Mesh) and `jax.lax.with_sharding_constraint`, no shard_map.
dlverify verifies the per-device module right after the partitioning pass against
the sequential program on one device (README, "Python API").

A sharding annotation never changes what a jit computes (XLA keeps the semantics
whatever the layout), so a "wrong" sharding is not a bug. The buggy twins are
math bugs in the distributed step: a loss summed where the sequential one takes
the mean, an update with the wrong sign.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import dlverify

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
import llama3 as L  # noqa: E402

B, S, D, F, H = 4, 8, 16, 32, 4
DH = D // H
LR = 0.1


def _shard(mesh, tree):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), tree, is_leaf=lambda x: isinstance(x, P))


def _f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _sgd(loss, nparams: int):
    """A training step: (x, y, *params) -> (loss, *updated params), plain SGD."""
    def step(x, y, *params):
        value, grads = jax.value_and_grad(loss, argnums=tuple(range(2, 2 + nparams)))(x, y, *params)
        return (value, *(p - LR * g for p, g in zip(params, grads)))
    return step


# ------------------------------------------------------------------ layers

def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def mlp_loss(x, y, w1, w2):
    return jnp.mean((mlp(x, w1, w2) - y) ** 2)


def attention(x, wq, wk, wv, wo):
    """Causal multi-head attention, heads a dim of the weights (D, H, DH)."""
    q = jnp.einsum("bsd,dhk->bshk", x, wq)
    k = jnp.einsum("bsd,dhk->bshk", x, wk)
    v = jnp.einsum("bsd,dhk->bshk", x, wv)
    s = jnp.einsum("bshk,bthk->bhst", q, k) / np.sqrt(DH)
    causal = jnp.arange(x.shape[1])[:, None] >= jnp.arange(x.shape[1])[None, :]
    p = jax.nn.softmax(jnp.where(causal, s, -1e9), axis=-1)
    o = jnp.einsum("bhst,bthk->bshk", p, v)
    return jnp.einsum("bshk,hkd->bsd", o, wo)


def attn_loss(x, y, wq, wk, wv, wo):
    return jnp.mean((attention(x, wq, wk, wv, wo) - y) ** 2)


def layer_norm(x, g):
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g


# -------------------------------------------- Megatron TP by annotations only

TP_MLP = (P(), P(None, "tp"), P("tp", None))                 # x, w1 columns, w2 rows
TP_ATTN = (P(), P(None, "tp", None), P(None, "tp", None), P(None, "tp", None), P("tp", None, None))


def _mlp_args():
    return _f32(B, S, D), _f32(D, F), _f32(F, D)


def _attn_args():
    return _f32(B, S, D), _f32(D, H, DH), _f32(D, H, DH), _f32(D, H, DH), _f32(H, DH, D)


@dlverify.case
def gspmd_tp_mlp_forward():
    mesh = dlverify.host_mesh((4,), ("tp",))
    dist = jax.jit(mlp, in_shardings=_shard(mesh, TP_MLP), out_shardings=NamedSharding(mesh, P()))
    return dlverify.Case(seq=mlp, dist=dist, args=_mlp_args(),
                         description="Megatron MLP by shardings: w1 column-, w2 row-sharded, TP=4")


@dlverify.case
def gspmd_tp_attention_forward():
    mesh = dlverify.host_mesh((4,), ("tp",))
    dist = jax.jit(attention, in_shardings=_shard(mesh, TP_ATTN),
                   out_shardings=NamedSharding(mesh, P()))
    return dlverify.Case(seq=attention, dist=dist, args=_attn_args(),
                         description="causal attention, heads sharded by the weights' shardings, TP=4")


@dlverify.case
def gspmd_tp_mlp_train():
    mesh = dlverify.host_mesh((4,), ("tp",))
    step = _sgd(mlp_loss, 2)
    specs = (P(), P()) + TP_MLP[1:]
    dist = jax.jit(step, in_shardings=_shard(mesh, specs),
                   out_shardings=_shard(mesh, (P(),) + TP_MLP[1:]))
    return dlverify.Case(seq=step, dist=dist, args=(_f32(B, S, D),) + _mlp_args(),
                         description="Megatron MLP training step (loss, SGD on sharded params), TP=4")


@dlverify.case
def gspmd_tp_attention_train():
    mesh = dlverify.host_mesh((4,), ("tp",))
    step = _sgd(attn_loss, 4)
    dist = jax.jit(step, in_shardings=_shard(mesh, (P(),) + TP_ATTN),
                   out_shardings=_shard(mesh, (P(),) + TP_ATTN[1:]))
    return dlverify.Case(seq=step, dist=dist, args=(_f32(B, S, D),) + _attn_args(),
                         description="attention training step, heads sharded, SGD, TP=4")


# ---------------------------------------------------------- FSDP / ZeRO-3

FSDP = (P("fsdp", None), P("fsdp", None), P("fsdp", None), P("fsdp", None))   # x, y, w1, w2


def _fsdp_loss(mesh):
    def loss(x, y, w1, w2):
        h = jax.lax.with_sharding_constraint(jax.nn.gelu(x @ w1), NamedSharding(mesh, P("fsdp", None)))
        out = jax.lax.with_sharding_constraint(h @ w2, NamedSharding(mesh, P("fsdp", None)))
        return jnp.mean((out - y) ** 2)
    return loss


@dlverify.case
def gspmd_fsdp_train():
    mesh = dlverify.host_mesh((4,), ("fsdp",))
    dist = jax.jit(_sgd(_fsdp_loss(mesh), 2), in_shardings=_shard(mesh, FSDP),
                   out_shardings=_shard(mesh, (P(),) + FSDP[2:]))
    return dlverify.Case(seq=_sgd(mlp_loss, 2), dist=dist,
                         args=(_f32(16, D), _f32(16, D), _f32(D, F), _f32(F, D)),
                         description="ZeRO-3 by shardings: params and batch split on dim 0 over "
                                     "'fsdp', activations constrained, SGD step, 4 devices")


# -------------------------------------------------------- 2-D data x model

MESH2D = (P("data", None), P("data", None), P(None, "model"), P("model", None))


@dlverify.case
def gspmd_2d_mesh_train():
    mesh = dlverify.host_mesh((2, 2), ("data", "model"))
    step = _sgd(mlp_loss, 2)
    dist = jax.jit(step, in_shardings=_shard(mesh, MESH2D),
                   out_shardings=_shard(mesh, (P(),) + MESH2D[2:]))
    return dlverify.Case(seq=step, dist=dist, args=(_f32(8, D), _f32(8, D), _f32(D, F), _f32(F, D)),
                         description="2-layer MLP training step on a 2x2 (data, model) mesh")


# ------------------------------------------------------ sequence parallel

SP_ACT = P(None, "tp", None)


def _sp_layers(mesh, constrain: bool):
    def fwd(x, g1, w1, w2, g2, w3, w4):
        c = (lambda t: jax.lax.with_sharding_constraint(t, NamedSharding(mesh, SP_ACT))) \
            if constrain else (lambda t: t)
        x = c(x)
        x = c(x + mlp(layer_norm(x, g1), w1, w2))
        return c(x + mlp(layer_norm(x, g2), w3, w4))
    return fwd


SP_PARAMS = (P(), P(None, "tp"), P("tp", None), P(), P(None, "tp"), P("tp", None))


def _sp_args():
    return (_f32(B, S, D), _f32(D), _f32(D, F), _f32(F, D), _f32(D), _f32(D, F), _f32(F, D))


@dlverify.case
def gspmd_sequence_parallel_forward():
    mesh = dlverify.host_mesh((4,), ("tp",))
    dist = jax.jit(_sp_layers(mesh, True), in_shardings=_shard(mesh, (SP_ACT,) + SP_PARAMS),
                   out_shardings=NamedSharding(mesh, SP_ACT))
    return dlverify.Case(seq=_sp_layers(None, False), dist=dist, args=_sp_args(),
                         description="two LayerNorm+MLP residual layers, activations constrained "
                                     "to the seq dim between layers, MLPs tensor-parallel, 4 devices")


@dlverify.case
def gspmd_sequence_parallel_train():
    mesh = dlverify.host_mesh((4,), ("tp",))

    def loss_of(fwd):
        return lambda x, y, *p: jnp.mean((fwd(x, *p) - y) ** 2)
    step_d = _sgd(loss_of(_sp_layers(mesh, True)), 6)
    step_s = _sgd(loss_of(_sp_layers(None, False)), 6)
    dist = jax.jit(step_d, in_shardings=_shard(mesh, (SP_ACT, SP_ACT) + SP_PARAMS),
                   out_shardings=_shard(mesh, (P(),) + SP_PARAMS))
    return dlverify.Case(seq=step_s, dist=dist, args=(_f32(B, S, D),) + _sp_args(),
                         description="sequence-parallel layers' training step, SGD, 4 devices")


# ------------------------------------- remat, scanned layers, fused attention, Adam

@dlverify.case
def gspmd_remat_tp_train():
    """Two residual TP MLP blocks under jax.checkpoint: the backward pass recomputes them."""
    mesh = dlverify.host_mesh((2,), ("tp",))
    block = jax.checkpoint(lambda x, a, b: x + mlp(x, a, b))

    def loss(x, y, w1, w2, w3, w4):
        return jnp.mean((block(block(x, w1, w2), w3, w4) - y) ** 2)
    step = _sgd(loss, 4)
    specs = (P(), P()) + TP_MLP[1:] * 2
    dist = jax.jit(step, in_shardings=_shard(mesh, specs), out_shardings=_shard(mesh, (P(),) + specs[2:]))
    return dlverify.Case(seq=step, dist=dist, args=(_f32(B, S, D),) + _mlp_args() + _mlp_args()[1:],
                         description="rematerialised TP MLP blocks, SGD step, TP=2")


@dlverify.case
def gspmd_scanned_layers_tp_train():
    """Three TP MLP layers stacked (L, ...) and run by lax.scan, as MaxText does (each
    layer's output squashed by tanh, so that random weights keep the values small)."""
    mesh = dlverify.host_mesh((2,), ("tp",))

    def loss(x, y, w1, w2):
        out = jax.lax.scan(lambda h, w: (jnp.tanh(h + mlp(h, w[0], w[1])), None), x, (w1, w2))[0]
        return jnp.mean((out - y) ** 2)
    step = _sgd(loss, 2)
    specs = (P(), P(), P(None, None, "tp"), P(None, "tp", None))
    dist = jax.jit(step, in_shardings=_shard(mesh, specs), out_shardings=_shard(mesh, (P(),) + specs[2:]))
    return dlverify.Case(seq=step, dist=dist, args=(_f32(B, S, D), _f32(B, S, D), _f32(3, D, F), _f32(3, F, D)),
                         description="stacked layers under lax.scan, weights' hidden dim over 'tp'")


def fused_attention(x, wq, wk, wv, wo):
    q, k, v = (jnp.einsum("bsd,dhk->bshk", x, w) for w in (wq, wk, wv))
    return jnp.einsum("bshk,hkd->bsd", jax.nn.dot_product_attention(q, k, v, is_causal=True), wo)


@dlverify.case
def gspmd_dot_product_attention_forward():
    # TP=2: 2 of the 4 heads per rank (one head per rank: tests/test_gspmd_jit.py's xfail)
    mesh = dlverify.host_mesh((2,), ("tp",))
    dist = jax.jit(fused_attention, in_shardings=_shard(mesh, TP_ATTN), out_shardings=NamedSharding(mesh, P()))
    return dlverify.Case(seq=fused_attention, dist=dist, args=_attn_args(),
                         description="jax.nn.dot_product_attention (causal), heads sharded, TP=2")


def adam_step(x, y, w1, w2, m1, m2, v1, v2):
    value, (g1, g2) = jax.value_and_grad(mlp_loss, argnums=(2, 3))(x, y, w1, w2)
    out = [value]
    for w, g, m, v in ((w1, g1, m1, v1), (w2, g2, m2, v2)):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        # |v|: the cases' inputs are random (a real second moment is never negative)
        out += [w - 1e-3 * m / (jnp.sqrt(jnp.abs(v)) + 1e-8), m, v]
    return tuple(out)


@dlverify.case
def gspmd_fsdp_tp_adam():
    """An Adam step on a 2x2 (fsdp, tp) mesh: weights and both moments sharded alike."""
    mesh = dlverify.host_mesh((2, 2), ("fsdp", "tp"))
    a, b = P("fsdp", "tp"), P("tp", "fsdp")
    dist = jax.jit(adam_step, in_shardings=_shard(mesh, (P("fsdp"), P("fsdp"), a, b, a, b, a, b)),
                   out_shardings=_shard(mesh, (P(), a, a, a, b, b, b)))
    return dlverify.Case(seq=adam_step, dist=dist,
                         args=(_f32(8, D), _f32(8, D)) + (_f32(D, F), _f32(F, D)) * 3,
                         description="Adam on a 2-D (fsdp, tp) mesh")


# ------------------------------------------- embedding over a sharded vocabulary

VOCAB = 64


def embed_mlp(emb, w1, w2, ids):
    """A lookup (mode="clip": ids clamped into the table, as indexing does) and a
    residual MLP. XLA partitions the lookup over the table's sharded rows as a masked
    gather: each rank keeps the ids in its rows, and an all-reduce sums the ranks'."""
    x = jnp.take(emb, ids, axis=0, mode="clip")
    return x + mlp(x, w1, w2)


EMBED = (P("tp", None), P(None, "tp"), P("tp", None), P())


@dlverify.case
def gspmd_vocab_parallel_embedding():
    mesh = dlverify.host_mesh((4,), ("tp",))
    dist = jax.jit(embed_mlp, in_shardings=_shard(mesh, EMBED), out_shardings=NamedSharding(mesh, P()))
    return dlverify.Case(seq=embed_mlp, dist=dist,
                         args=(_f32(VOCAB, D), _f32(D, F), _f32(F, D),
                               jax.ShapeDtypeStruct((B, S), jnp.int32)),
                         description="an embedding table sharded over its rows by jit, then a TP MLP")


# ------------------------------------------------------------ buggy twins

@dlverify.case
def gspmd_tp_mlp_train_sum_bug():
    mesh = dlverify.host_mesh((4,), ("tp",))

    def step(x, y, w1, w2):
        def loss(w1, w2):
            return jnp.sum((mlp(x, w1, w2) - y) ** 2)   # BUG: the sequential loss is a mean
        value, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return value, w1 - LR * g1, w2 - LR * g2
    dist = jax.jit(step, in_shardings=_shard(mesh, (P(), P()) + TP_MLP[1:]),
                   out_shardings=_shard(mesh, (P(),) + TP_MLP[1:]))
    return dlverify.Case(seq=_sgd(mlp_loss, 2), dist=dist, args=(_f32(B, S, D),) + _mlp_args(),
                         expect="bug", description="the loss summed, not averaged")


@dlverify.case
def gspmd_fsdp_train_ascent_bug():
    mesh = dlverify.host_mesh((4,), ("fsdp",))

    def step(x, y, w1, w2):
        value, (g1, g2) = jax.value_and_grad(_fsdp_loss(mesh), argnums=(2, 3))(x, y, w1, w2)
        return value, w1 - LR * g1, w2 + LR * g2   # BUG: w2 climbs the gradient
    dist = jax.jit(step, in_shardings=_shard(mesh, FSDP), out_shardings=_shard(mesh, (P(),) + FSDP[2:]))
    return dlverify.Case(seq=_sgd(mlp_loss, 2), dist=dist,
                         args=(_f32(16, D), _f32(16, D), _f32(D, F), _f32(F, D)),
                         expect="bug", description="ZeRO-3 step updating w2 with the wrong sign")


@dlverify.case
def gspmd_sequence_parallel_norm_gain_bug():
    mesh = dlverify.host_mesh((4,), ("tp",))

    def fwd(x, g1, w1, w2, g2, w3, w4):
        def c(t):
            return jax.lax.with_sharding_constraint(t, NamedSharding(mesh, SP_ACT))
        x = c(x + mlp(layer_norm(x, g1), w1, w2))
        return c(x + mlp(layer_norm(x, g1), w3, w4))   # BUG: the first layer's norm gain
    dist = jax.jit(fwd, in_shardings=_shard(mesh, (SP_ACT,) + SP_PARAMS),
                   out_shardings=NamedSharding(mesh, SP_ACT))
    return dlverify.Case(seq=_sp_layers(None, False), dist=dist, args=_sp_args(), expect="bug",
                         description="sequence-parallel layers, the second normalised by g1")


@dlverify.case
def gspmd_vocab_parallel_embedding_shifted_ids_bug():
    mesh = dlverify.host_mesh((4,), ("tp",))

    def fwd(emb, w1, w2, ids):
        x = jnp.take(emb, ids + 1, axis=0, mode="clip")   # BUG: the ids shifted by one
        return x + mlp(x, w1, w2)
    dist = jax.jit(fwd, in_shardings=_shard(mesh, EMBED), out_shardings=NamedSharding(mesh, P()))
    return dlverify.Case(seq=embed_mlp, dist=dist,
                         args=(_f32(VOCAB, D), _f32(D, F), _f32(F, D),
                               jax.ShapeDtypeStruct((B, S), jnp.int32)),
                         expect="bug", description="the lookup one row off")


# ------------------------------------------- Llama-3 (examples/models/llama3.py)
# The sequential forward and training step of the model zoo's small Llama, jitted
# with parameter shardings: Megatron TP (heads, MLP hidden, vocabulary over 'tp'),
# FSDP (every parameter's dim 0 and the batch over one axis), both on a 2x2 mesh,
# and sequence parallelism by a constraint on the residual stream.

LLAMA = L.SMALL._replace(layers=1)


def _llama_jit(fn, mesh, params, data, outs):
    return jax.jit(fn, in_shardings=_shard(mesh, tuple(params) + (data, data)),
                   out_shardings=_shard(mesh, outs))


def _llama_case(dist, train: bool, what: str, seq=None):
    return dlverify.Case(seq=seq or L.make_seq(LLAMA, train), dist=dist, args=L.args(LLAMA),
                         options={"token_range": LLAMA.vocab}, description=f"Llama-3, {what}")


@dlverify.case
def gspmd_llama_tp_forward():
    mesh = dlverify.host_mesh((2,), ("tp",))
    specs = L.param_specs(LLAMA, 2).values()
    dist = _llama_jit(L.make_seq(LLAMA, False), mesh, specs, P(), (P(None, None, "tp"), P()))
    return _llama_case(dist, False, "TP=2 by parameter shardings: logits and loss")


@dlverify.case
def gspmd_llama_tp_train():
    mesh = dlverify.host_mesh((2,), ("tp",))
    specs = tuple(L.param_specs(LLAMA, 2).values())
    dist = _llama_jit(L.make_seq(LLAMA, True), mesh, specs, P(), (P(),) + specs)
    return _llama_case(dist, True, "TP=2 by parameter shardings: loss and all gradients")


def _fsdp_specs(axis: str, ranks: int):
    return tuple(P(axis) if shape[0] % ranks == 0 else P() for shape in L.param_shapes(LLAMA).values())


@dlverify.case
def gspmd_llama_fsdp_train():
    """XLA keeps each weight sharded and shards the activations by it: the fused QKV
    and gate/up cotangents are concatenated per rank, then gathered (rewrites.py,
    simplify_sink.py)."""
    mesh = dlverify.host_mesh((2,), ("fsdp",))
    specs = _fsdp_specs("fsdp", 2)
    dist = _llama_jit(L.make_seq(LLAMA, True), mesh, specs, P("fsdp"), (P(),) + specs)
    return _llama_case(dist, True, "FSDP=2 (params' dim 0 and the batch): loss and gradients")


def _fsdp_tp_specs():
    """Megatron TP over 'tp', and every matrix's d_model dim over 'fsdp'."""
    shapes, out = L.param_shapes(LLAMA), []
    for name, spec in L.param_specs(LLAMA, 2).items():
        dims = list(spec) + [None] * (len(shapes[name]) - len(spec))
        at = next((i for i, d in enumerate(dims) if d is None and shapes[name][i] == LLAMA.d_model), None)
        if at is not None and len(dims) > 1:
            dims[at] = "fsdp"
        out.append(P(*dims))
    return tuple(out)


@dlverify.case
def gspmd_llama_fsdp_tp_train():
    mesh = dlverify.host_mesh((2, 2), ("fsdp", "tp"))
    specs = _fsdp_tp_specs()
    dist = _llama_jit(L.make_seq(LLAMA, True), mesh, specs, P("fsdp"), (P(),) + specs)
    return _llama_case(dist, True, "2x2 (fsdp, tp) mesh: loss and gradients")


def _llama_sp_forward(mesh):
    """forward_seq with the residual stream constrained to the seq dim (None: unconstrained)."""
    cfg = LLAMA

    def c(t):
        return t if mesh is None else jax.lax.with_sharding_constraint(
            t, NamedSharding(mesh, P(None, "tp", None)))

    def fwd(*flat):
        p, ids, labels = L._unpack(cfg, flat)
        tabs = L.tables(cfg, jnp.float32)
        x = c(L.one_hot(ids, cfg.vocab) @ p["embed"])

        def block(x, lp):
            q, k, v = L.qkv_fused(cfg, L.rms_norm(x, lp["attn_norm"], cfg.eps), lp["w_qkv"],
                                  cfg.q_per_group)
            x = c(x + jnp.einsum("bsgjd,gjde->bse", L.attention_core(cfg, q, k, v, tabs), lp["w_o"]))
            return c(x + L.swiglu(cfg, L.rms_norm(x, lp["mlp_norm"], cfg.eps), lp) @ lp["w_down"])
        logits = L.rms_norm(L.run_layers(cfg, p, x, block), p["final_norm"], cfg.eps) @ p["lm_head"]
        return logits, L.xent(logits, labels, cfg.vocab)
    return fwd


@dlverify.case
def gspmd_llama_sequence_parallel_forward():
    mesh = dlverify.host_mesh((2,), ("tp",))
    dist = _llama_jit(_llama_sp_forward(mesh), mesh, L.param_specs(LLAMA, 2).values(), P(),
                      (P(None, None, "tp"), P()))
    return _llama_case(dist, False, "TP+SP=2 (residual stream constrained to the seq dim)",
                       seq=_llama_sp_forward(None))
