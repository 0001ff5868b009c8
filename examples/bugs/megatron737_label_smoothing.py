"""Vocab-parallel cross-entropy with label smoothing (Megatron-LM #737, #7464).

Megatron's `_VocabParallelCrossEntropy` holds the logits split over the vocab
('tp'). With label smoothing eps the per-token loss is

    loss = (1 - s) * nll - s * mean_v(log p_v),    s = eps * V / (V - 1),

and mean_v runs over the *whole* vocabulary V. The shipped code took V from
the local logits (`exp_logits.size(-1)`, the partition vocab size) and the
mean of the *local* log-probs, without an all-reduce, so the loss depends on
the rank and is wrong on every rank (fixed in PR #5522 / #7466).

The programs return the per-token losses, as Megatron's
vocab_parallel_cross_entropy does.

Cases: the correct loss (TP=4) and the buggy twin that averages the log-probs
over the local vocab slice.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
BATCH, SEQ, VOCAB = 2, 8, 32
VL = VOCAB // TP
EPS = 0.1
SMOOTH = EPS * VOCAB / (VOCAB - 1)


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    return (jax.ShapeDtypeStruct((BATCH, SEQ, VOCAB), jnp.float32),   # logits
            jax.ShapeDtypeStruct((BATCH, SEQ), jnp.int32))            # labels


def _dist(local_fn, check_vma=True):
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP), in_specs=(P(None, None, "tp"), P()),
                                 out_specs=P(), check_vma=check_vma))


def one_hot(ids, n, start=None):
    cols = jnp.arange(n, dtype=ids.dtype)
    if start is not None:
        cols = cols + start
    return (ids[..., None] == cols).astype(jnp.float32)


def smoothed_xent_seq(logits, labels):
    m = jnp.max(logits, axis=-1)
    z = logits - m[..., None]
    logp = z - jnp.log(jnp.sum(jnp.exp(z), axis=-1))[..., None]
    nll = -jnp.sum(one_hot(labels, VOCAB) * logp, axis=-1)
    loss = (1.0 - SMOOTH) * nll - SMOOTH * jnp.sum(logp, axis=-1) / VOCAB
    return loss


def smoothed_xent_local(logits, labels):
    start = jax.lax.axis_index("tp") * VL
    m = jax.lax.pmax(jnp.max(logits, axis=-1), "tp")
    z = logits - m[..., None]
    logp = z - jnp.log(jax.lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp"))[..., None]
    nll = -jax.lax.psum(jnp.sum(one_hot(labels, VL, start) * logp, axis=-1), "tp")
    loss = (1.0 - SMOOTH) * nll - SMOOTH * jax.lax.psum(jnp.sum(logp, axis=-1), "tp") / VOCAB
    return loss


@dlverify.case
def megatron737_label_smoothing():
    return dlverify.Case(
        seq=smoothed_xent_seq, dist=_dist(smoothed_xent_local), args=_args(), expect="verified",
        options={"token_range": VOCAB},
        description="vocab-parallel cross-entropy with label smoothing: mean log-prob over the "
                    "whole vocab (psum of the slice sums / V); TP=4")


def smoothed_xent_local_bug(logits, labels):
    """Megatron-LM #737: mean over the local vocab slice (divides by the partition
    vocab size, no all-reduce): every rank gets its own, wrong, loss."""
    start = jax.lax.axis_index("tp") * VL
    m = jax.lax.pmax(jnp.max(logits, axis=-1), "tp")
    z = logits - m[..., None]
    logp = z - jnp.log(jax.lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp"))[..., None]
    nll = -jax.lax.psum(jnp.sum(one_hot(labels, VL, start) * logp, axis=-1), "tp")
    loss = (1.0 - SMOOTH) * nll - SMOOTH * jnp.mean(logp, axis=-1)  # BUG: mean over the local vocab slice
    return loss


@dlverify.case
def megatron737_label_smoothing_bug():
    return dlverify.Case(
        seq=smoothed_xent_seq, dist=_dist(smoothed_xent_local_bug, check_vma=False), args=_args(),
        expect="bug", options={"token_range": VOCAB},
        description="Megatron-LM #737: label smoothing averages the log-probs over the local "
                    "vocab slice")
