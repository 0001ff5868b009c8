"""Load-balanced ("zigzag") causal ring attention: context parallelism as Megatron-LM's
CP, ring-flash-attention's zigzag_ring_flash_attn and MaxText's
`context_parallel_load_balance` lay the sequence out.

Under a causal mask, a contiguous split gives the last rank all the work. The
zigzag layout cuts the sequence into 2*CP chunks and gives rank r chunks r and
2*CP-1-r, one early and one late, so every rank attends to as many keys. The
distributed program reorders the sequence outside shard_map as MaxText's
`reorder_causal_load_balanced` does (`jnp.take` of the chunks, dim 0 reshaped into
(2*CP, chunk)) or as ring-flash-attention's `extract_local` does for each rank
(slices of the chunks, concatenated), shards the reordered sequence over 'cp', runs
ring attention (K/V blocks passed on by `ppermute`, the online softmax of
examples/ring_attention.py) with the causal mask on the global positions of the
chunks that meet at each step, and puts the outputs back in the natural order (the
inverse reorder); they are compared to the sequential causal attention on the
natural order. dlverify rewrites the sequential program to compute in the zigzag
order (dlverify/sequence_permutation.py), where each rank holds one block.

Cases: the forward pass, unrolled and with steps 1..CP-1 as a `lax.fori_loop`, with
either reorder, and with every rank given the whole sequence and picking its two
chunks itself (Megatron-LM's `get_batch_on_this_cp_rank`); with rotary embeddings
of q and k at the zigzag positions; the backward pass by `jax.grad` (dQ, dK, dV of a loss over all
tokens, the target reordered with q, k, v, the gradients put back in order); and a
training step (tokens and targets reordered, the loss and the gradients of the
replicated q/k/v projections psum'd over 'cp': a sum over tokens needs no
un-permute).

Buggy twins: the inputs paired as chunks r and r+CP while the mask assumes the
zigzag pairs; the mask on positions local to the rank (TransformerEngine PR #536's
CP position bug class); the outputs left in the zigzag order (no un-permute) or put
back by the zigzag order itself instead of its inverse; rotary embeddings at
contiguous positions r*S/CP + i instead of the zigzag chunks' (the mask right); the backward with the target
(the labels) left in the natural order while q, k, v are reordered; and a training
step whose targets are reordered by another layout than its tokens; and a rank
picking chunk 2*CP-2-r instead of its partner 2*CP-1-r.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

CP = 4
CHUNKS = 2 * CP
SEQ, D = 16, 4
CHUNK = SEQ // CHUNKS
LOCAL = 2 * CHUNK
TO_NEXT = [(r, (r + 1) % CP) for r in range(CP)]
MASKED = -1e9

ZIGZAG = [c for r in range(CP) for c in (r, CHUNKS - 1 - r)]       # 0, 7, 1, 6, 2, 5, 3, 4
UNZIGZAG = [int(i) for i in np.argsort(ZIGZAG)]                    # its inverse


def _args():
    return tuple(jax.ShapeDtypeStruct((SEQ, D), jnp.float32) for _ in range(3))   # q, k, v


def reorder(x, order):
    """The chunks of the sequence (dim 0) in `order`, as MaxText's reorder_sequence."""
    chunks = x.reshape(CHUNKS, CHUNK, *x.shape[1:])
    return jnp.take(chunks, jnp.asarray(order), axis=0).reshape(x.shape)


def scores(q, k, q_pos, k_pos):
    s = (q @ k.T) / D ** 0.5
    return jnp.where(q_pos[:, None] >= k_pos[None, :], s, MASKED)


def causal_seq(q, k, v):
    pos = jnp.arange(SEQ)
    s = scores(q, k, pos, pos)
    p = jnp.exp(s - lax.stop_gradient(s.max(-1, keepdims=True)))
    return (p @ v) / p.sum(-1, keepdims=True)


def zigzag_positions(rank):
    """Global positions of the tokens rank `rank` holds: chunks rank and 2*CP-1-rank."""
    return jnp.concatenate([rank * CHUNK + jnp.arange(CHUNK),
                            (CHUNKS - 1 - rank) * CHUNK + jnp.arange(CHUNK)])


def _pass_on(k, v):
    return lax.ppermute(k, "cp", TO_NEXT), lax.ppermute(v, "cp", TO_NEXT)


def first_block(s, v):
    """The statistics (max m, sum l, output o) of the first block of scores."""
    m = lax.stop_gradient(s.max(-1, keepdims=True))
    p = jnp.exp(s - m)
    return m, p.sum(-1, keepdims=True), p @ v


def merge_block(stats, s, v):
    """The online softmax: the running sum and output rescaled by exp(m_old - m_new)."""
    m, l, o = stats
    m_new = jnp.maximum(m, lax.stop_gradient(s.max(-1, keepdims=True)))
    corr = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new)
    return m_new, l * corr + p.sum(-1, keepdims=True), o * corr + p @ v


def ring_zigzag(q, k, v, positions=zigzag_positions):
    """Ring attention over the zigzag shards: at step j rank r holds the K/V of rank
    (r - j) mod CP, whose positions mask the scores."""
    rank = lax.axis_index("cp")
    q_pos = positions(rank)
    stats = first_block(scores(q, k, q_pos, q_pos), v)
    for step in range(1, CP):
        k, v = _pass_on(k, v)
        stats = merge_block(stats, scores(q, k, q_pos, positions((rank - step) % CP)), v)
    _, l, o = stats
    return o / l


def _sharded(local_fn):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    seq = P("cp")
    return jax.shard_map(local_fn, mesh=mesh, in_specs=(seq, seq, seq), out_specs=seq,
                         check_vma=False)


def zigzag(local_fn):
    """The distributed program: reorder, attend on the shards, restore the natural order."""
    def zigzag_attention(q, k, v):
        q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))
        return reorder(_sharded(local_fn)(q, k, v), UNZIGZAG)
    return jax.jit(zigzag_attention)


@dlverify.case
def ring_zigzag_causal():
    return dlverify.Case(
        seq=causal_seq, dist=zigzag(ring_zigzag), args=_args(), expect="verified",
        description="zigzag (load-balanced) causal ring attention, reordered by jnp.take; CP=4")


# --------------------------------------------------------------- the steps as a fori_loop

def ring_zigzag_loop(q, k, v):
    """Step 0 peeled (it starts the statistics), steps 1..CP-1 a `lax.fori_loop`; the
    positions of the K/V block in hand follow the loop counter."""
    rank = lax.axis_index("cp")
    q_pos = zigzag_positions(rank)

    def step(i, carry):
        stats, k, v = carry
        k, v = _pass_on(k, v)
        return merge_block(stats, scores(q, k, q_pos, zigzag_positions((rank - i) % CP)), v), k, v

    (_, l, o), _, _ = lax.fori_loop(1, CP, step, (first_block(scores(q, k, q_pos, q_pos), v), k, v))
    return o / l


@dlverify.case
def ring_zigzag_fori_loop():
    return dlverify.Case(
        seq=causal_seq, dist=zigzag(ring_zigzag_loop), args=_args(), expect="verified",
        description="zigzag causal ring attention, steps 1..CP-1 as a lax.fori_loop; CP=4")


# --------------------------------------------------------------- rotary embeddings on the zigzag positions

def rope(x, pos):
    """Rotary position embedding (the rotate-half form) at positions `pos`."""
    half = D // 2
    ang = pos[:, None].astype(jnp.float32) * (1.0 / 10000.0 ** (jnp.arange(half) / half))[None, :]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[:, :half], x[:, half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def rope_causal_seq(q, k, v):
    pos = jnp.arange(SEQ)
    return causal_seq(rope(q, pos), rope(k, pos), v)


def ring_zigzag_rope(q, k, v):
    """q and k rotated at this rank's zigzag positions before the ring (k travels
    rotated, as in Llama with context parallelism)."""
    pos = zigzag_positions(lax.axis_index("cp"))
    return ring_zigzag(rope(q, pos), rope(k, pos), v)


@dlverify.case
def ring_zigzag_rotary():
    return dlverify.Case(
        seq=rope_causal_seq, dist=zigzag(ring_zigzag_rope), args=_args(), expect="verified",
        description="zigzag causal ring attention with rotary embeddings at the zigzag positions; CP=4")


# --------------------------------------------------------------- the reorder as slices and a concatenate

def reorder_by_slices(x, order):
    """The chunks in `order` sliced and concatenated (ring-flash-attention's
    extract_local, for every rank at once)."""
    return jnp.concatenate([x[c * CHUNK:(c + 1) * CHUNK] for c in order], axis=0)


def zigzag_attention_sliced(q, k, v):
    q, k, v = (reorder_by_slices(x, ZIGZAG) for x in (q, k, v))
    return reorder_by_slices(_sharded(ring_zigzag)(q, k, v), UNZIGZAG)


@dlverify.case
def ring_zigzag_causal_sliced():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(zigzag_attention_sliced), args=_args(), expect="verified",
        description="zigzag causal ring attention, reordered by slices and a concatenate; CP=4")


# --------------------------------------------------------------- each rank picks its chunks (Megatron)

def pick_chunks(x, idx):
    """Chunks `idx` of the whole sequence x (dim 0), as Megatron-LM's
    get_batch_on_this_cp_rank does on every CP rank."""
    chunks = x.reshape(CHUNKS, CHUNK, *x.shape[1:])
    return jnp.take(chunks, idx, axis=0).reshape(LOCAL, *x.shape[1:])


def _replicated_in(local_fn):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    return jax.shard_map(local_fn, mesh=mesh, in_specs=(P(),) * 3, out_specs=P("cp"),
                         check_vma=False)


def ring_zigzag_picked(q, k, v):
    r = lax.axis_index("cp")
    idx = jnp.stack([r, CHUNKS - 1 - r])
    return ring_zigzag(*(pick_chunks(x, idx) for x in (q, k, v)))


def zigzag_attention_picked(q, k, v):
    """Every rank gets the whole sequence and picks its two chunks; the outputs,
    gathered in rank order, are the zigzag order, put back after."""
    return reorder(_replicated_in(ring_zigzag_picked)(q, k, v), UNZIGZAG)


@dlverify.case
def ring_zigzag_per_rank_pick():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(zigzag_attention_picked), args=_args(), expect="verified",
        description="zigzag causal ring attention, each rank picking its chunks r and 2*CP-1-r "
                    "of the replicated sequence (Megatron's get_batch_on_this_cp_rank); CP=4")


# --------------------------------------------------------------- training: dQ, dK, dV

def _grad_args():
    return _args() + (jax.ShapeDtypeStruct((SEQ, D), jnp.float32),)   # q, k, v, target


def causal_grads_seq(q, k, v, t):
    return jax.grad(lambda q, k, v: jnp.sum((causal_seq(q, k, v) - t) ** 2) / SEQ,
                    argnums=(0, 1, 2))(q, k, v)


def zigzag_grads_local(q, k, v, t):
    """Each rank differentiates its tokens' part of the loss through the ring; the
    transposed ppermutes send the K/V cotangents back to the rank that holds the
    block (as in examples/ring_attention.py)."""
    def local_loss(q, k, v):
        return jnp.sum((ring_zigzag(q, k, v) - t) ** 2) / SEQ
    return jax.grad(local_loss, argnums=(0, 1, 2))(q, k, v)


def zigzag_grads(q, k, v, t):
    """The inputs and the target reordered, the gradients put back in the natural order."""
    q, k, v, t = (reorder(x, ZIGZAG) for x in (q, k, v, t))
    mesh = dlverify.host_mesh((CP,), ("cp",))
    grads = jax.shard_map(zigzag_grads_local, mesh=mesh, in_specs=(P("cp"),) * 4,
                          out_specs=(P("cp"),) * 3, check_vma=False)(q, k, v, t)
    return tuple(reorder(g, UNZIGZAG) for g in grads)


@dlverify.case
def ring_zigzag_grads():
    return dlverify.Case(
        seq=causal_grads_seq, dist=jax.jit(zigzag_grads), args=_grad_args(), expect="verified",
        description="zigzag causal ring attention backward: dQ, dK, dV by jax.grad; CP=4")


# --------------------------------------------------------------- training: the loss and the projections' gradients

def _train_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((SEQ, D), f32),) + (jax.ShapeDtypeStruct((D, D), f32),) * 3 + \
        (jax.ShapeDtypeStruct((SEQ, D), f32),)   # x, wq, wk, wv, target


def train_loss_seq(x, wq, wk, wv, t):
    return jnp.sum((causal_seq(x @ wq, x @ wk, x @ wv) - t) ** 2) / SEQ


def train_seq(x, wq, wk, wv, t):
    return (train_loss_seq(x, wq, wk, wv, t),) + \
        jax.grad(train_loss_seq, argnums=(1, 2, 3))(x, wq, wk, wv, t)


def train_local(x, wq, wk, wv, t):
    """A rank's part of the loss and its gradients, psum'd over 'cp': a sum over the
    tokens does not care about their order, so nothing is put back in order."""
    def local_loss(wq, wk, wv):
        return jnp.sum((ring_zigzag(x @ wq, x @ wk, x @ wv) - t) ** 2) / SEQ
    loss, grads = jax.value_and_grad(local_loss, argnums=(0, 1, 2))(wq, wk, wv)
    return tuple(lax.psum(g, "cp") for g in (loss,) + grads)


def zigzag_train(x, wq, wk, wv, t):
    """The tokens and their targets reordered (MaxText reorders the batch), the
    replicated weights' gradients summed over the ranks."""
    x, t = reorder(x, ZIGZAG), reorder(t, ZIGZAG)
    mesh = dlverify.host_mesh((CP,), ("cp",))
    return jax.shard_map(train_local, mesh=mesh, in_specs=(P("cp"), P(), P(), P(), P("cp")),
                         out_specs=(P(),) * 4, check_vma=False)(x, wq, wk, wv, t)


@dlverify.case
def ring_zigzag_train():
    return dlverify.Case(
        seq=train_seq, dist=jax.jit(zigzag_train), args=_train_args(), expect="verified",
        description="zigzag ring attention training: the loss and the q/k/v projections' "
                    "gradients, psum over 'cp'; CP=4")


# --------------------------------------------------------------- buggy twins

def zigzag_grads_target_unordered(q, k, v, t):
    q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))  # BUG: the target is not reordered with them
    mesh = dlverify.host_mesh((CP,), ("cp",))
    grads = jax.shard_map(zigzag_grads_local, mesh=mesh, in_specs=(P("cp"),) * 4,
                          out_specs=(P("cp"),) * 3, check_vma=False)(q, k, v, t)
    return tuple(reorder(g, UNZIGZAG) for g in grads)


@dlverify.case
def ring_zigzag_bug_target_not_reordered():
    return dlverify.Case(
        seq=causal_grads_seq, dist=jax.jit(zigzag_grads_target_unordered), args=_grad_args(),
        expect="bug",
        description="zigzag ring attention backward whose target (the labels) keeps the natural "
                    "order while q, k, v are reordered")


PAIRED = [c for r in range(CP) for c in (r, r + CP)]               # 0, 4, 1, 5, 2, 6, 3, 7
UNPAIRED = [int(i) for i in np.argsort(PAIRED)]


def paired_layout(q, k, v):
    """The shards hold chunks r and r+CP (the halves interleaved), but the attention
    masks with the zigzag positions."""
    def attend(q, k, v):
        return ring_zigzag(q, k, v)  # BUG: zigzag mask positions on shards holding chunks r and r+CP
    q, k, v = (reorder(x, PAIRED) for x in (q, k, v))
    return reorder(_sharded(attend)(q, k, v), UNPAIRED)


@dlverify.case
def ring_zigzag_bug_pairs_r_plus_cp():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(paired_layout), args=_args(), expect="bug",
        description="shards paired as chunks r and r+CP while the mask assumes the zigzag pairs")


def local_position_mask(q, k, v):
    def attend(q, k, v):
        return ring_zigzag(q, k, v, positions=lambda rank: jnp.arange(LOCAL))  # BUG: positions local to the shard
    q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))
    return reorder(_sharded(attend)(q, k, v), UNZIGZAG)


@dlverify.case
def ring_zigzag_bug_local_positions():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(local_position_mask), args=_args(), expect="bug",
        description="zigzag ring attention whose mask uses positions that restart on every shard")


def no_unpermute(q, k, v):
    q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))
    return _sharded(ring_zigzag)(q, k, v)  # BUG: the outputs stay in the zigzag order


@dlverify.case
def ring_zigzag_bug_missing_unpermute():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(no_unpermute), args=_args(), expect="bug",
        description="zigzag ring attention whose outputs are not put back in the natural order")


def forward_unpermute(q, k, v):
    q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))
    return reorder(_sharded(ring_zigzag)(q, k, v), ZIGZAG)  # BUG: the zigzag order again, not its inverse


@dlverify.case
def ring_zigzag_bug_unpermute_not_inverse():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(forward_unpermute), args=_args(), expect="bug",
        description="zigzag ring attention un-permuting its outputs by the zigzag order itself")


def train_labels_other_order(x, wq, wk, wv, t):
    x, t = reorder(x, ZIGZAG), reorder(t, PAIRED)  # BUG: the targets reordered unlike the tokens
    mesh = dlverify.host_mesh((CP,), ("cp",))
    return jax.shard_map(train_local, mesh=mesh, in_specs=(P("cp"), P(), P(), P(), P("cp")),
                         out_specs=(P(),) * 4, check_vma=False)(x, wq, wk, wv, t)


@dlverify.case
def ring_zigzag_bug_train_targets_other_order():
    return dlverify.Case(
        seq=train_seq, dist=jax.jit(train_labels_other_order), args=_train_args(), expect="bug",
        description="zigzag training whose targets are reordered by another layout than the tokens")


def pick_off_by_one(q, k, v):
    def attend(q, k, v):
        r = lax.axis_index("cp")
        picked = [pick_chunks(x, jnp.stack([r, CHUNKS - 2 - r])) for x in (q, k, v)]  # BUG: chunk 2*CP-2-r, not 2*CP-1-r
        return ring_zigzag(*picked)
    return reorder(_replicated_in(attend)(q, k, v), UNZIGZAG)


@dlverify.case
def ring_zigzag_bug_pick_off_by_one():
    return dlverify.Case(
        seq=causal_seq, dist=jax.jit(pick_off_by_one), args=_args(), expect="bug",
        description="each rank picks chunks r and 2*CP-2-r (one before its zigzag partner: the "
                    "last rank picks chunk CP-1 twice, chunk 2*CP-1 nobody)")


def rope_contiguous_positions(q, k, v):
    def attend(q, k, v):
        q, k = (rope(x, lax.axis_index("cp") * LOCAL + jnp.arange(LOCAL)) for x in (q, k))  # BUG: contiguous positions
        return ring_zigzag(q, k, v)
    q, k, v = (reorder(x, ZIGZAG) for x in (q, k, v))
    return reorder(_sharded(attend)(q, k, v), UNZIGZAG)


@dlverify.case
def ring_zigzag_bug_rotary_contiguous_positions():
    return dlverify.Case(
        seq=rope_causal_seq, dist=jax.jit(rope_contiguous_positions), args=_args(), expect="bug",
        description="zigzag ring attention rotating q and k at contiguous positions r*S/CP + i "
                    "instead of the positions of the rank's zigzag chunks")
