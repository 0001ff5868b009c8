"""Ring attention: context parallelism with K/V blocks passed around a ring and an
online softmax (Liu et al., "Ring Attention with Blockwise Transformers").

The sequence is sharded over 'cp' (CP=4). Each rank keeps its queries and, for
CP steps, attends to the K/V block it holds, then passes K and V on to the next
rank with `lax.ppermute`: at step j rank r holds block (r - j) mod CP. It never
sees a whole row of scores, so it keeps running statistics per query row: the
max m of the scores seen so far, the sum l of their exponentials and the output
o, both rescaled by exp(m_old - m_new) whenever the max grows; finally o / l.
dlverify proves this equals the sequential attention: the rescaling factors
telescope (dlverify/online_softmax.py) and the blocks a rank has merged wrap
around the ring (datalog/ring_ranges.dl). The sequential reference normalises
after the product with V, `(exp(s - max) @ v) / sum exp(s - max)`.

Cases: the forward pass, non-causal and causal (the block mask from the global
positions of the queries, axis_index * S/CP + iota, and of the K block held at
the step), unrolled and with steps 1..CP-1 as a `lax.fori_loop`; the backward
pass by `jax.grad` (dQ, dK, dV of a loss, the K/V cotangents sent back around
the ring by the transposed ppermutes); and a hand-written ring backward
(FlashAttention's formulas, dK/dV buffers travelling with their K/V block).

Buggy twins: the running output (or, in the loop, the running sum) not rescaled
when the max grows (the accumulator keeps terms against stale maxima, the
flash-attention merge bug class); the rescale factor inverted, exp(m_new - m_old); the causal mask built from positions
that restart on every shard (TransformerEngine PR #536's CP position bug class);
the mask assuming the ring runs the other way (K block r + j at step j: a
ppermute direction mismatch); and a ring backward that recomputes P with each
block's own max instead of the forward's statistics (a wrong dQ/dK/dV, the
class of TransformerEngine #1557 / Megatron-LM #1464; its exact cause not read).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

CP = 4
SEQ, D = 16, 4
LOCAL = SEQ // CP
TO_NEXT = [(r, (r + 1) % CP) for r in range(CP)]
MASKED = -1e9


def _args():
    return tuple(jax.ShapeDtypeStruct((SEQ, D), jnp.float32) for _ in range(3))   # q, k, v


def _dist(local_fn):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    seq = P("cp")
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(seq, seq, seq), out_specs=seq,
                                 check_vma=False))


def scores(q, k, q_pos=None, k_pos=None):
    s = (q @ k.T) / D ** 0.5
    if q_pos is None:
        return s
    return jnp.where(q_pos[:, None] >= k_pos[None, :], s, MASKED)


def attention_seq(q, k, v, causal=False):
    pos = jnp.arange(SEQ)
    s = scores(q, k, pos, pos) if causal else scores(q, k)
    p = jnp.exp(s - lax.stop_gradient(s.max(-1, keepdims=True)))
    return (p @ v) / p.sum(-1, keepdims=True)


def causal_seq(q, k, v):
    return attention_seq(q, k, v, causal=True)


def _pass_on(k, v):
    return lax.ppermute(k, "cp", TO_NEXT), lax.ppermute(v, "cp", TO_NEXT)


def _block_pos(step):
    """Global positions of the K block rank r holds at `step`: block (r - step) mod CP."""
    return ((lax.axis_index("cp") - step) % CP) * LOCAL + jnp.arange(LOCAL)


def ring_statistics(q, k, v, causal=False):
    """The merged statistics: running output o, sum l and max m of each query row."""
    q_pos = lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)
    for step in range(CP):
        s = scores(q, k, q_pos, _block_pos(step)) if causal else scores(q, k)
        m_blk = lax.stop_gradient(s.max(-1, keepdims=True))
        if step == 0:
            m = m_blk
            p = jnp.exp(s - m)
            o, l = p @ v, p.sum(-1, keepdims=True)
        else:
            m_new = jnp.maximum(m, m_blk)
            corr = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            o = o * corr + p @ v
            l = l * corr + p.sum(-1, keepdims=True)
            m = m_new
        if step < CP - 1:
            k, v = _pass_on(k, v)
    return o, l, m


def ring_attention(q, k, v, causal=False):
    o, l, _ = ring_statistics(q, k, v, causal)
    return o / l


def ring_causal(q, k, v):
    return ring_attention(q, k, v, causal=True)


@dlverify.case
def ring_attention_forward():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(ring_attention), args=_args(), expect="verified",
        description="ring attention with the online softmax, non-causal; CP=4")


@dlverify.case
def ring_attention_causal():
    return dlverify.Case(
        seq=causal_seq, dist=_dist(ring_causal), args=_args(), expect="verified",
        description="causal ring attention, block mask from global positions; CP=4")


# --------------------------------------------------------------- the steps as a fori_loop

def ring_attention_loop(q, k, v, causal=False):
    """Step 0 peeled (it starts the statistics), steps 1..CP-1 a `lax.fori_loop`
    whose carry holds the statistics and the K/V block in hand."""
    q_pos = lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)
    s = scores(q, k, q_pos, _block_pos(0)) if causal else scores(q, k)
    m = lax.stop_gradient(s.max(-1, keepdims=True))
    p = jnp.exp(s - m)
    o, l = p @ v, p.sum(-1, keepdims=True)

    def step(i, carry):
        m, l, o, k, v = carry
        k, v = _pass_on(k, v)
        s = scores(q, k, q_pos, _block_pos(i)) if causal else scores(q, k)
        m_new = jnp.maximum(m, lax.stop_gradient(s.max(-1, keepdims=True)))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new)
        o = o * corr + p @ v
        l = l * corr + p.sum(-1, keepdims=True)
        return m_new, l, o, k, v

    _, l, o, _, _ = lax.fori_loop(1, CP, step, (m, l, o, k, v))
    return o / l


def ring_loop_causal(q, k, v):
    return ring_attention_loop(q, k, v, causal=True)


@dlverify.case
def ring_attention_fori_loop():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(ring_attention_loop), args=_args(), expect="verified",
        description="ring attention, steps 1..CP-1 as a lax.fori_loop; CP=4")


@dlverify.case
def ring_attention_fori_loop_causal():
    return dlverify.Case(
        seq=causal_seq, dist=_dist(ring_loop_causal), args=_args(), expect="verified",
        description="causal ring attention, steps 1..CP-1 as a lax.fori_loop; CP=4")


# --------------------------------------------------------------- training: dQ, dK, dV

def _grad_args():
    return _args() + (jax.ShapeDtypeStruct((SEQ, D), jnp.float32),)   # q, k, v, target


def causal_loss_seq(q, k, v, t):
    return jnp.sum((causal_seq(q, k, v) - t) ** 2) / SEQ


def causal_grads_seq(q, k, v, t):
    return jax.grad(causal_loss_seq, argnums=(0, 1, 2))(q, k, v, t)


def ring_grads_local(q, k, v, t):
    """Each rank differentiates its queries' part of the loss; the transpose of each
    ppermute sends the K/V cotangents back around the ring to the rank that owns
    the block, so every rank ends with the whole gradient of its q, k and v blocks."""
    def local_loss(q, k, v):
        return jnp.sum((ring_causal(q, k, v) - t) ** 2) / SEQ
    return jax.grad(local_loss, argnums=(0, 1, 2))(q, k, v)


@dlverify.case
def ring_attention_grads():
    mesh = dlverify.host_mesh((CP,), ("cp",))
    seq = P("cp")
    dist = jax.jit(jax.shard_map(ring_grads_local, mesh=mesh, in_specs=(seq,) * 4,
                                 out_specs=(seq,) * 3, check_vma=False))
    return dlverify.Case(
        seq=causal_grads_seq, dist=dist, args=_grad_args(), expect="verified",
        description="causal ring attention backward: dQ, dK, dV through the ring; CP=4")


# --------------------------------------------------------------- a hand-written ring backward

def _bwd_args():
    return _args() + (jax.ShapeDtypeStruct((SEQ, D), jnp.float32),)   # q, k, v, d_out


def _bwd_dist(local_fn):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    seq = P("cp")
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(seq,) * 4, out_specs=(seq,) * 3,
                                 check_vma=False))


def flash_backward_seq(q, k, v, d_out):
    """FlashAttention's backward over the whole sequence: P recomputed from the
    statistics, delta = rowsum(dO * O), dS = P * (dO V^T - delta)."""
    s = scores(q, k)
    e = jnp.exp(s - s.max(-1, keepdims=True))
    l = e.sum(-1, keepdims=True)
    p = e / l
    delta = (d_out * ((e @ v) / l)).sum(-1, keepdims=True)
    ds = p * (d_out @ v.T - delta)
    return ds @ k / D ** 0.5, ds.T @ q / D ** 0.5, p.T @ d_out


def ring_flash_backward(q, k, v, d_out):
    """The ring backward (as in ring attention implementations): P of each K/V block
    recomputed from the forward's final statistics; dQ accumulates locally, dK and
    dV accumulate in buffers that travel with their K/V block and come home after
    CP hops."""
    o, l, m = ring_statistics(q, k, v)
    delta = (d_out * (o / l)).sum(-1, keepdims=True)
    dq, dk, dv = jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    for _ in range(CP):
        p = jnp.exp(scores(q, k) - m) / l
        ds = p * (d_out @ v.T - delta)
        dq = dq + ds @ k / D ** 0.5
        dk, dv = dk + ds.T @ q / D ** 0.5, dv + p.T @ d_out
        k, v = _pass_on(k, v)
        dk, dv = _pass_on(dk, dv)
    return dq, dk, dv


@dlverify.case
def ring_attention_flash_backward():
    return dlverify.Case(
        seq=flash_backward_seq, dist=_bwd_dist(ring_flash_backward), args=_bwd_args(),
        expect="verified",
        description="hand-written ring backward: dK/dV buffers travel with their block; CP=4")


# --------------------------------------------------------------- buggy twins

def ring_no_rescale(q, k, v):
    for step in range(CP):
        s = scores(q, k)
        m_blk = s.max(-1, keepdims=True)
        if step == 0:
            m = m_blk
            p = jnp.exp(s - m)
            l, o = p.sum(-1, keepdims=True), p @ v
        else:
            m_new = jnp.maximum(m, m_blk)
            corr = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            l = l * corr + p.sum(-1, keepdims=True)
            o = o + p @ v  # BUG: the running output is not rescaled by exp(m_old - m_new)
            m = m_new
        if step < CP - 1:
            k, v = _pass_on(k, v)
    return o / l


@dlverify.case
def ring_bug_output_not_rescaled():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(ring_no_rescale), args=_args(), expect="bug",
        description="online softmax whose running output misses the exp(m_old - m_new) rescale")


def ring_inverted_rescale(q, k, v):
    for step in range(CP):
        s = scores(q, k)
        m_blk = s.max(-1, keepdims=True)
        if step == 0:
            m = m_blk
            p = jnp.exp(s - m)
            l, o = p.sum(-1, keepdims=True), p @ v
        else:
            m_new = jnp.maximum(m, m_blk)
            corr = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            l = l * corr + p.sum(-1, keepdims=True)
            o = o * jnp.exp(m_new - m) + p @ v  # BUG: the output's rescale factor is inverted
            m = m_new
        if step < CP - 1:
            k, v = _pass_on(k, v)
    return o / l


@dlverify.case
def ring_bug_rescale_inverted():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(ring_inverted_rescale), args=_args(), expect="bug",
        description="online softmax rescaling by exp(m_new - m_old) instead of exp(m_old - m_new)")


def ring_local_positions(q, k, v):
    for step in range(CP):
        s = scores(q, k, jnp.arange(LOCAL), _block_pos(step))  # BUG: query positions restart at 0 on every shard
        m_blk = s.max(-1, keepdims=True)
        if step == 0:
            m = m_blk
            p = jnp.exp(s - m)
            l, o = p.sum(-1, keepdims=True), p @ v
        else:
            m_new = jnp.maximum(m, m_blk)
            corr = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            l = l * corr + p.sum(-1, keepdims=True)
            o = o * corr + p @ v
            m = m_new
        if step < CP - 1:
            k, v = _pass_on(k, v)
    return o / l


@dlverify.case
def ring_bug_causal_mask_local_positions():
    return dlverify.Case(
        seq=causal_seq, dist=_dist(ring_local_positions), args=_args(), expect="bug",
        description="causal ring attention whose query positions restart on every shard")


def ring_mask_wrong_direction(q, k, v):
    q_pos = lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)
    for step in range(CP):
        s = scores(q, k, q_pos, _block_pos(-step))  # BUG: block r + step assumed; the ring brings r - step
        m_blk = s.max(-1, keepdims=True)
        if step == 0:
            m = m_blk
            p = jnp.exp(s - m)
            l, o = p.sum(-1, keepdims=True), p @ v
        else:
            m_new = jnp.maximum(m, m_blk)
            corr = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            l = l * corr + p.sum(-1, keepdims=True)
            o = o * corr + p @ v
            m = m_new
        if step < CP - 1:
            k, v = _pass_on(k, v)
    return o / l


@dlverify.case
def ring_bug_mask_wrong_direction():
    return dlverify.Case(
        seq=causal_seq, dist=_dist(ring_mask_wrong_direction), args=_args(), expect="bug",
        description="causal ring attention whose mask assumes K/V travel to the previous rank")


def ring_loop_sum_not_rescaled(q, k, v):
    s = scores(q, k)
    m = s.max(-1, keepdims=True)
    p = jnp.exp(s - m)
    o, l = p @ v, p.sum(-1, keepdims=True)

    def step(i, carry):
        m, l, o, k, v = carry
        k, v = _pass_on(k, v)
        s = scores(q, k)
        m_new = jnp.maximum(m, s.max(-1, keepdims=True))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new)
        o = o * corr + p @ v
        l = l + p.sum(-1, keepdims=True)  # BUG: the running sum is not rescaled by exp(m_old - m_new)
        return m_new, l, o, k, v

    _, l, o, _, _ = lax.fori_loop(1, CP, step, (m, l, o, k, v))
    return o / l


@dlverify.case
def ring_bug_loop_sum_not_rescaled():
    return dlverify.Case(
        seq=attention_seq, dist=_dist(ring_loop_sum_not_rescaled), args=_args(), expect="bug",
        description="fori_loop ring attention whose running sum misses the rescale")


def ring_backward_step_max(q, k, v, d_out):
    o, l, _ = ring_statistics(q, k, v)
    delta = (d_out * (o / l)).sum(-1, keepdims=True)
    dq, dk, dv = jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    for _ in range(CP):
        s = scores(q, k)
        p = jnp.exp(s - s.max(-1, keepdims=True)) / l  # BUG: the block's own max, not the forward's final max
        ds = p * (d_out @ v.T - delta)
        dq = dq + ds @ k / D ** 0.5
        dk, dv = dk + ds.T @ q / D ** 0.5, dv + p.T @ d_out
        k, v = _pass_on(k, v)
        dk, dv = _pass_on(dk, dv)
    return dq, dk, dv


@dlverify.case
def ring_bug_backward_block_max():
    return dlverify.Case(
        seq=flash_backward_seq, dist=_bwd_dist(ring_backward_step_max), args=_bwd_args(), expect="bug",
        description="ring backward recomputing P with each block's max instead of the forward's "
                    "statistics (wrong dQ/dK/dV, the class of TransformerEngine #1557)")
