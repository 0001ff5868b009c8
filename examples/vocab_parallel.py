"""Megatron's vocab-parallel embedding (by masked gather) and cross-entropy.

The embedding table (V, D) and the LM head (D, V) are sharded over the vocab
dim on 'tp' (TP=2); token ids and labels are replicated. Embedding: each rank
shifts the ids into its shard (ids - axis_index * V/TP), masks the ids outside
it, gathers rows of its table slice with the masked ids, zeroes the masked
rows and a psum adds the ranks' rows. Cross-entropy on vocab-sharded logits:
the max is a pmax, the sum of exponentials a psum, and the target logit is
picked by the same masked gather (each rank contributes the labels it holds,
zeros for the others) and a psum.

Ids and labels are taken modulo V on both sides, so any integer input is a
valid token (the sequential `jnp.take` would fill out-of-range rows with NaN).
The max subtracted before the exponentials is a constant shift
(stop_gradient, as frameworks do). Also the training form: the gradients of
the table and head shards (the gathers' transposes are scatter-adds at the
masked ids).

dlverify proves `ids % V` lies in [0, V) and that each rank keeps exactly the
rows of ids - first in [0, V/TP), and relates the masked gathers (and their
scatter-add gradients) to the sequential lookups as one-hot contractions
(dlverify/index_ranges.py, dlverify/masked_gather.py, frontends/jaxpr/scatter.py).

Another common way of writing the cross-entropy: the local target index clipped
into the shard, `clip(labels - first, 0, V/TP - 1)` (the identity on the labels the
rank keeps, the others masked anyway: dlverify/kept_index.py).

Buggy twins: the embedding mask drops each shard's first id (an off-by-one
`<=` for `<`: those tokens get a zero embedding on every rank), the target
logit is not psum'd over 'tp' (each rank only knows the target logits of the
labels in its vocab shard), and the clip stops one short of the shard's last label
(those labels read their neighbour's logit).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 2
TOKENS, VOCAB, D = 8, 4, 4
V_LOCAL = VOCAB // TP


def _args():
    return (
        jax.ShapeDtypeStruct((TOKENS,), jnp.int32),        # ids
        jax.ShapeDtypeStruct((TOKENS,), jnp.int32),        # labels
        jax.ShapeDtypeStruct((VOCAB, D), jnp.float32),     # embedding table
        jax.ShapeDtypeStruct((D, VOCAB), jnp.float32),     # LM head
    )


def _dist(local_fn, out_specs=(P(), P()), check_vma=False):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh,
                                 in_specs=(P(), P(), P("tp", None), P(None, "tp")),
                                 out_specs=out_specs, check_vma=check_vma))


def lm_seq(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    x = jnp.take(table, ids, axis=0)
    logits = x @ head
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))   # a constant shift
    lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[:, 0]
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return x, jnp.mean(lse - target)


def _vocab_mask(ids):
    """Megatron's input mask: the ids outside this rank's vocab shard, and the ids
    shifted into it (the masked ones set to 0)."""
    first = jax.lax.axis_index("tp") * V_LOCAL
    outside = (ids < first) | (ids >= first + V_LOCAL)
    return outside, jnp.where(outside, 0, ids - first)


def _embed(table, outside, local):
    """This shard's rows of the ids it holds, zero rows for the others, summed over 'tp'."""
    return jax.lax.psum(jnp.where(outside[:, None], 0.0, jnp.take(table, local, axis=0)), "tp")


def _xent_vocab_parallel(x, labels, head, target_psum=True):
    logits = x @ head                                                 # (T, V/TP)
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)), "tp")
    lse = jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), "tp")) + m[:, 0]
    outside, local = _vocab_mask(labels)
    picked = jnp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
    target = jnp.where(outside, 0.0, picked)
    if target_psum:
        target = jax.lax.psum(target, "tp")
    return jnp.mean(lse - target)


def vocab_parallel_local(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    x = _embed(table, *_vocab_mask(ids))
    return x, _xent_vocab_parallel(x, labels, head)


@dlverify.case
def vocab_parallel_embedding_xent():
    return dlverify.Case(
        seq=lm_seq, dist=_dist(vocab_parallel_local), args=_args(), expect="verified",
        description="vocab-parallel embedding by masked gather and vocab-parallel cross-entropy; TP=2")


# --------------------------------------------------------------- training: the embedding's gradient

def lm_loss_seq(ids, labels, table, head):
    return lm_seq(ids, labels, table, head)[1]


def grads_seq(ids, labels, table, head):
    return jax.grad(lm_loss_seq, argnums=(2, 3))(ids, labels, table, head)


def vocab_parallel_grads_local(ids, labels, table, head):
    """The gradients of this rank's table and head shards. The loss is the same on
    every rank; with check_vma, the psums' transposes hand each rank the cotangent
    of its own shard: a one-hot scatter-add of the masked cotangent rows."""
    return jax.grad(lambda tb, hd: vocab_parallel_local(ids, labels, tb, hd)[1], argnums=(0, 1))(table, head)


@dlverify.case
def vocab_parallel_grads():
    return dlverify.Case(
        seq=grads_seq, dist=_dist(vocab_parallel_grads_local, out_specs=(P("tp", None), P(None, "tp")),
                                  check_vma=True),
        args=_args(), expect="verified",
        description="gradients of the vocab-parallel embedding table and LM head through the "
                    "masked gathers and the vocab-parallel cross-entropy; TP=2")


# --------------------------------------------------------------- buggy twins

def vocab_parallel_local_mask_off_by_one(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    first = jax.lax.axis_index("tp") * V_LOCAL
    outside = (ids <= first) | (ids >= first + V_LOCAL)  # BUG: drops the shard's first id (must be ids < first)
    x = _embed(table, outside, jnp.where(outside, 0, ids - first))
    return x, _xent_vocab_parallel(x, labels, head)


@dlverify.case
def vocab_parallel_bug_embedding_mask_off_by_one():
    return dlverify.Case(
        seq=lm_seq, dist=_dist(vocab_parallel_local_mask_off_by_one), args=_args(), expect="bug",
        description="vocab-parallel embedding whose mask drops each shard's first id")


def vocab_parallel_local_target_not_reduced(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    x = _embed(table, *_vocab_mask(ids))
    loss = _xent_vocab_parallel(x, labels, head, target_psum=False)  # BUG: the target logits must be psum'd over 'tp'
    return x, loss


@dlverify.case
def vocab_parallel_bug_target_logit_not_reduced():
    return dlverify.Case(
        seq=lm_seq, dist=_dist(vocab_parallel_local_target_not_reduced), args=_args(),
        expect="bug", description="vocab-parallel cross-entropy whose target logit is never psum'd")


# --------------------------------------------------------------- other ways of writing the cross-entropy

def _xent_clipped(x, labels, head):
    """The target logit picked at the local index clipped into the shard."""
    logits = x @ head
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)), "tp")
    lse = jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), "tp")) + m[:, 0]
    first = jax.lax.axis_index("tp") * V_LOCAL
    outside = (labels < first) | (labels >= first + V_LOCAL)
    local = jnp.clip(labels - first, 0, V_LOCAL - 1)
    picked = jnp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - jax.lax.psum(jnp.where(outside, 0.0, picked), "tp"))


def vocab_parallel_clipped_local(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    x = _embed(table, *_vocab_mask(ids))
    return x, _xent_clipped(x, labels, head)


@dlverify.case
def vocab_parallel_xent_clipped_index():
    return dlverify.Case(
        seq=lm_seq, dist=_dist(vocab_parallel_clipped_local), args=_args(), expect="verified",
        description="vocab-parallel cross-entropy whose local target index is clipped into the shard")


def vocab_parallel_clip_short_local(ids, labels, table, head):
    ids, labels = ids % VOCAB, labels % VOCAB
    x = _embed(table, *_vocab_mask(ids))
    first = jax.lax.axis_index("tp") * V_LOCAL
    outside = (labels < first) | (labels >= first + V_LOCAL)
    local = jnp.clip(labels - first, 0, V_LOCAL - 2)  # BUG: the shard's last label is V_LOCAL - 1
    logits = x @ head
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)), "tp")
    lse = jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), "tp")) + m[:, 0]
    picked = jnp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
    return x, jnp.mean(lse - jax.lax.psum(jnp.where(outside, 0.0, picked), "tp"))


@dlverify.case
def vocab_parallel_bug_clip_one_short():
    return dlverify.Case(
        seq=lm_seq, dist=_dist(vocab_parallel_clip_short_local), args=_args(), expect="bug",
        description="vocab-parallel cross-entropy whose clip stops one short of the shard's last label")
