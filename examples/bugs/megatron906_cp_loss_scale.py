"""Loss scaled by a parallel size that the gradient averaging does not use
(NVIDIA/Megatron-LM #906, cf. #673; fixed in commit 3bdcbbb).

Data parallel x context parallel training on a ('dp', 'cp') mesh: each DP
rank holds one sequence, each CP rank a chunk of it. A rank's loss is its
tokens' loss sum divided by the tokens of the whole sequence and multiplied
by cp_size, because the gradients are then averaged over the dp x cp ranks.
In #906 the loss was scaled by cp_size while the gradients were averaged
over the data-parallel group without CP: the gradients come out cp_size
times too large (the loss value itself looks right).

The tokens of the dp sequences are flattened batch-major, so the token dim
is split over ('dp', 'cp') together. Gradients are computed per rank with
jax.grad (check_vma=False: no implicit reduction) and then averaged by hand,
as Megatron's DDP does.

Cases: the correct training step (DP=2, CP=2) and the buggy twin.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

DP, CP = 2, 2
SEQ, D, F = 8, 8, 16
TOKENS = DP * SEQ            # one sequence per DP rank, flattened batch-major


def _mesh():
    return dlverify.host_mesh((DP, CP), ("dp", "cp"))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f32),   # x
            jax.ShapeDtypeStruct((TOKENS, D), f32),   # target
            jax.ShapeDtypeStruct((D, F), f32),        # w1
            jax.ShapeDtypeStruct((F, D), f32))        # w2


def _dist(local_fn):
    tok = P(("dp", "cp"), None)
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(), in_specs=(tok, tok, P(), P()),
                                 out_specs=(P(), P(), P()), check_vma=False))


def token_losses(x, y, w1, w2):
    pred = jax.nn.gelu(x @ w1) @ w2
    return jnp.sum((pred - y) ** 2, axis=-1)


def train_step_seq(x, y, w1, w2):
    def loss_fn(w1, w2):
        return jnp.sum(token_losses(x, y, w1, w2)) / TOKENS
    loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
    return loss, g1, g2


def train_step_local(x, y, w1, w2):
    def loss_fn(w1, w2):   # this rank's tokens, normalised by the sequence's tokens, times cp_size
        return CP * jnp.sum(token_losses(x, y, w1, w2)) / SEQ
    loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
    loss = jax.lax.psum(loss, ("dp", "cp")) / (DP * CP)
    g1, g2 = (jax.lax.psum(g, ("dp", "cp")) / (DP * CP) for g in grads)   # average over dp x cp
    return loss, g1, g2


@dlverify.case
def megatron906_cp_loss_scale():
    return dlverify.Case(
        seq=train_step_seq, dist=_dist(train_step_local), args=_args(), expect="verified",
        description="DP x CP training step: loss scaled by cp_size, gradients averaged over "
                    "dp x cp; DP=2, CP=2")


def train_step_local_bug(x, y, w1, w2):
    """Megatron-LM #906: the loss carries cp_size but the average divides by dp_size only."""
    def loss_fn(w1, w2):
        return CP * jnp.sum(token_losses(x, y, w1, w2)) / SEQ
    loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
    loss = jax.lax.psum(loss, ("dp", "cp")) / (DP * CP)
    g1, g2 = (jax.lax.psum(g, ("dp", "cp")) / DP for g in grads)  # BUG: / dp_size, loss scaled by cp_size
    return loss, g1, g2


@dlverify.case
def megatron906_cp_loss_scale_bug():
    return dlverify.Case(
        seq=train_step_seq, dist=_dist(train_step_local_bug), args=_args(), expect="bug",
        description="Megatron-LM #906: loss scaled by cp_size, gradients averaged over dp only")
