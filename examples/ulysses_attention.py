"""DeepSpeed-Ulysses sequence parallelism for causal self-attention.

The sequence is sharded over 'sp' (SP=2). Each rank projects its tokens with
the fused w_qkv to q, k, v (S/SP, H, Dh), an all_to_all(split_axis=1, concat_axis=0) trades the
sequence shards for head groups (S, H/SP, Dh), every rank runs causal
attention over the whole sequence for its heads, and the inverse
all_to_all(split_axis=0, concat_axis=1) trades them back (S/SP, H, Dh) before
the output projection. Also the training form: the gradient of the mean loss
with respect to the replicated projections, psum'd over 'sp' and divided by SP
(the fused weight's gradient is the concatenation of three token sums,
datalog/concat_terms.dl; the causal mask's backward passes the cotangent's
scale, datalog/masked.dl).

Buggy twins: the return all_to_all concatenates along head_dim instead of the
heads (the shapes still fit once the heads are flattened), and the Ulysses
gradient summed over 'sp' but never divided by SP (DeepSpeed #5248: gradients
over-scaled by the SP size).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

SP = 2
SEQ, HEADS, HEAD_DIM = 8, 4, 2
D = HEADS * HEAD_DIM


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((SEQ, D), f32),      # x
        jax.ShapeDtypeStruct((D, 3 * D), f32),    # w_qkv (fused)
        jax.ShapeDtypeStruct((D, D), f32),        # w_o
    )


def _mesh():
    return dlverify.host_mesh((SP,), ("sp",))


def _forward_dist(local_fn):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(P("sp"), P(), P()),
                                 out_specs=P("sp"), check_vma=False))


def _grad_dist(local_fn):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(P("sp"), P(), P()),
                                 out_specs=(P(), P()), check_vma=False))


def causal_attention(q, k, v):
    """q, k, v: (S, h, Dh) for the whole sequence; causal softmax attention per head."""
    s = jnp.einsum("qhd,khd->hqk", q, k) / HEAD_DIM ** 0.5
    pos = jnp.arange(q.shape[0])
    s = jnp.where(pos[None, :, None] >= pos[None, None, :], s, -1e9)
    return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(s, axis=-1), v)


def _qkv(x, w_qkv):
    return (t.reshape(x.shape[0], HEADS, HEAD_DIM) for t in jnp.split(x @ w_qkv, 3, axis=-1))


def attention_seq(x, w_qkv, wo):
    q, k, v = _qkv(x, w_qkv)
    return causal_attention(q, k, v).reshape(SEQ, D) @ wo


def _to_heads(t):   # (S/SP, H, Dh) -> (S, H/SP, Dh)
    return jax.lax.all_to_all(t, "sp", split_axis=1, concat_axis=0, tiled=True)


def ulysses_local(x, w_qkv, wo):
    q, k, v = (_to_heads(t) for t in _qkv(x, w_qkv))
    o = causal_attention(q, k, v)                                             # (S, H/SP, Dh)
    o = jax.lax.all_to_all(o, "sp", split_axis=0, concat_axis=1, tiled=True)  # (S/SP, H, Dh)
    return o.reshape(SEQ // SP, D) @ wo


@dlverify.case
def ulysses_causal_attention():
    return dlverify.Case(
        seq=attention_seq, dist=_forward_dist(ulysses_local), args=_args(), expect="verified",
        description="Ulysses causal attention: all_to_all seq -> heads, attention, heads -> seq; SP=2")


def ulysses_local_back_concat_head_dim(x, w_qkv, wo):
    q, k, v = (_to_heads(t) for t in _qkv(x, w_qkv))
    o = causal_attention(q, k, v)
    o = jax.lax.all_to_all(o, "sp", split_axis=0, concat_axis=2, tiled=True)  # BUG: concatenates head_dim, not the heads (axis 1)
    return o.reshape(SEQ // SP, D) @ wo


@dlverify.case
def ulysses_bug_back_all_to_all_wrong_concat_axis():
    return dlverify.Case(
        seq=attention_seq, dist=_forward_dist(ulysses_local_back_concat_head_dim), args=_args(),
        expect="bug",
        description="Ulysses whose return all_to_all concatenates the head groups along head_dim")


# --------------------------------------------------------------- training: gradients of the projections

WEIGHTS = (1, 2)   # argnums of w_qkv, wo


def loss_seq(x, w_qkv, wo):
    return jnp.mean(attention_seq(x, w_qkv, wo) ** 2)


def grads_seq(x, w_qkv, wo):
    return jax.grad(loss_seq, argnums=WEIGHTS)(x, w_qkv, wo)


def _local_loss(x, w_qkv, wo):   # this rank's tokens' mean loss
    return jnp.mean(ulysses_local(x, w_qkv, wo) ** 2)


def ulysses_grads_local(x, w_qkv, wo):
    grads = jax.grad(_local_loss, argnums=WEIGHTS)(x, w_qkv, wo)
    return tuple(jax.lax.psum(g, "sp") / SP for g in grads)


@dlverify.case
def ulysses_grads():
    return dlverify.Case(
        seq=grads_seq, dist=_grad_dist(ulysses_grads_local), args=_args(), expect="verified",
        description="Ulysses training: gradients of the replicated projections, psum over 'sp' / SP")


def ulysses_grads_local_not_divided(x, w_qkv, wo):
    g_qkv, g_o = jax.grad(_local_loss, argnums=WEIGHTS)(x, w_qkv, wo)
    g_qkv = jax.lax.psum(g_qkv, "sp")  # BUG: the sum of SP local-mean gradients is never divided by SP
    return g_qkv, jax.lax.psum(g_o, "sp") / SP


@dlverify.case
def ulysses_bug_grad_over_scaled_by_sp():
    return dlverify.Case(
        seq=grads_seq, dist=_grad_dist(ulysses_grads_local_not_divided), args=_args(), expect="bug",
        description="Ulysses gradients over-scaled by the SP size (DeepSpeed #5248)")
