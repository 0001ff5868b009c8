"""Grouped-query attention with fewer KV heads than tensor-parallel ranks, forward and
training, with separate q/k/v/o projections (the Hugging Face Llama layout).

The query heads and the output projection's rows are split over 'tp'. There are fewer
KV heads than ranks, so each KV head is replicated: the K and V projections stay whole
on every rank and rank r slices out the KV head of its query heads, r // (tp / kv_heads)
(Megatron-LM and vLLM replicate KV heads this way when tp > num_query_groups). The
output projection's partial sums are psum'ed. In training (check_vma=True) JAX sums the
gradients of the replicated K and V projections over the ranks itself.

That gradient is the interesting part: a rank's K (V) gradient is a partial sum over its
query heads only, written at its KV head by the transpose of the slice; the ranks
serving one KV head complete it (dlverify/cell_groups.py splits the psum in two levels).
The input's gradient contracts that partial K gradient over the one KV head the rank
holds: the terms are a product of two families, heads x query heads (datalog/partials.dl,
Tag_ProdBase).

Buggy twins: a rank that slices the wrong KV head (r % kv_heads), and a K gradient
"averaged" over the ranks that replicate the head.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

B, S, D, H, DH = 2, 8, 16, 8, 4


def _args(kv_heads):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((D,), f32),
            jax.ShapeDtypeStruct((D, H * DH), f32), jax.ShapeDtypeStruct((D, kv_heads * DH), f32),
            jax.ShapeDtypeStruct((D, kv_heads * DH), f32), jax.ShapeDtypeStruct((H * DH, D), f32))


# x, norm weight, q_proj (heads' columns), k_proj and v_proj (replicated), o_proj (heads' rows)
SPECS = (P(), P(), P(None, "tp"), P(), P(), P("tp"))


def _rms(x, w):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w


def _attend(q, k, v):
    """q (B, S, kv heads, group, DH); k, v (B, S, kv heads, DH) -> (B, S, heads * DH)."""
    s = jnp.einsum("bqgjd,bkgd->bgjqk", q, k) / math.sqrt(DH)
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    p = jax.nn.softmax(jnp.where(causal, s, -1e9), -1)
    o = jnp.einsum("bgjqk,bkgd->bqgjd", p, v)
    return o.reshape(B, S, -1)


def block_seq(x, wn, wq, wk, wv, wo):
    g = wk.shape[1] // DH
    h = _rms(x, wn)
    q = (h @ wq).reshape(B, S, g, H // g, DH)
    k = (h @ wk).reshape(B, S, g, DH)
    v = (h @ wv).reshape(B, S, g, DH)
    return x + _attend(q, k, v) @ wo


def _kv(h, wk, wv, head):
    """The key and value of one KV head: its columns sliced out of the replicated weights."""
    wk_r = jax.lax.dynamic_slice_in_dim(wk, head * DH, DH, 1)
    wv_r = jax.lax.dynamic_slice_in_dim(wv, head * DH, DH, 1)
    return (h @ wk_r).reshape(B, S, 1, DH), (h @ wv_r).reshape(B, S, 1, DH)


def _block_local(x, wn, wq, wk, wv, wo, tp):
    rep = tp // (wk.shape[1] // DH)     # ranks serving one KV head
    h = _rms(x, wn)
    q = (h @ wq).reshape(B, S, 1, H // tp, DH)
    o = _attend(q, *_kv(h, wk, wv, jax.lax.axis_index("tp") // rep))
    return x + jax.lax.psum(o @ wo, "tp")


def block_local_wrong_head(x, wn, wq, wk, wv, wo):
    h = _rms(x, wn)
    q = (h @ wq).reshape(B, S, 1, H // 4, DH)
    o = _attend(q, *_kv(h, wk, wv, jax.lax.axis_index("tp") % 2))  # BUG: serves KV head r // 2
    return x + jax.lax.psum(o @ wo, "tp")


def _dist(fn, tp, out_specs):
    mesh = dlverify.host_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=SPECS, out_specs=out_specs, check_vma=True))


def _forward(tp):
    return _dist(lambda *a: _block_local(*a, tp), tp, P())


def _loss(y):
    return jnp.mean(y * y)


def train_seq(*params):
    return jax.value_and_grad(lambda *a: _loss(block_seq(*a)), argnums=tuple(range(6)))(*params)


def _train(tp):
    def step(*params):
        return jax.value_and_grad(
            lambda *a: _loss(_block_local(*a, tp)), argnums=tuple(range(6)))(*params)
    return _dist(step, tp, (P(), SPECS))


@dlverify.case
def gqa_two_kv_heads_tp4_forward():
    return dlverify.Case(seq=block_seq, dist=_forward(4), args=_args(2), expect="verified",
                         description="8 query heads, 2 KV heads each on 2 of 4 ranks")


@dlverify.case
def gqa_two_kv_heads_tp4_train():
    return dlverify.Case(seq=train_seq, dist=_train(4), args=_args(2), expect="verified",
                         description="loss and the gradients of every weight")


@dlverify.case
def gqa_two_kv_heads_tp8_train():
    return dlverify.Case(seq=train_seq, dist=_train(8), args=_args(2), expect="verified",
                         description="one query head a rank, each KV head on 4 ranks")


@dlverify.case
def mqa_one_kv_head_tp4_train():
    return dlverify.Case(seq=train_seq, dist=_train(4), args=_args(1), expect="verified",
                         description="multi-query attention: one KV head on every rank")


@dlverify.case
def gqa_bug_wrong_kv_head():
    return dlverify.Case(seq=block_seq, dist=_dist(block_local_wrong_head, 4, P()), args=_args(2),
                         expect="bug",
                         description="ranks 1 and 2 attend with each other's KV head")


def _train_k_grad_averaged(tp):
    rep = tp // 2

    def step(*params):
        loss, grads = jax.value_and_grad(
            lambda *a: _loss(_block_local(*a, tp)), argnums=tuple(range(6)))(*params)
        dk = grads[3] / rep  # BUG: the replicas hold different query heads' terms, not copies
        return loss, grads[:3] + (dk,) + grads[4:]
    return _dist(step, tp, (P(), SPECS))


@dlverify.case
def gqa_bug_k_grad_averaged_over_replicas():
    return dlverify.Case(seq=train_seq, dist=_train_k_grad_averaged(4), args=_args(2), expect="bug",
                         description="the K gradient divided by the number of replicas")
