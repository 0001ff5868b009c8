"""Layer stacks and gradient accumulation written as loops (`lax.scan`,
`lax.fori_loop`, `lax.while_loop`), as MaxText-style JAX models write them.

A stack of L residual Megatron MLP blocks, x <- x + tanh(gelu(x @ w1[l]) @ w2[l] + b2[l]),
with the per-layer weights stacked on a leading dim: w1 [L, D, F] split on F,
w2 [L, F, D] split on F over 'tp'. The scan carries the residual stream; each
iteration reads its layer's slice of the stacked weights. Training takes the
gradient of every stacked weight through the scan (JAX's transpose of a scan
is a reversed scan reading the stacked forward activations).

Buggy twins: a missing psum inside the scanned block, and the bias added
inside the block before the psum.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

LAYERS, BATCH, D_MODEL, D_FF, TP = 4, 8, 16, 32, 2


def _stack_args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((BATCH, D_MODEL), f32),          # x
        jax.ShapeDtypeStruct((LAYERS, D_MODEL, D_FF), f32),   # w1, stacked per layer
        jax.ShapeDtypeStruct((LAYERS, D_FF, D_MODEL), f32),   # w2, stacked per layer
        jax.ShapeDtypeStruct((LAYERS, D_MODEL), f32),         # b2, stacked per layer
    )


STACK_SPECS = (P(), P(None, None, "tp"), P(None, "tp", None), P())
GRAD_SPECS = (P(None, None, "tp"), P(None, "tp", None), P())


def _tp(local_fn, out_specs=P(), check_vma=True):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=STACK_SPECS, out_specs=out_specs,
                                 check_vma=check_vma))


# ---------------------------------------------------------- the layer stack

def block_seq(x, w1, w2, b2):
    return x + jnp.tanh(jax.nn.gelu(x @ w1) @ w2 + b2)


def block_local(x, w1, w2, b2):
    return x + jnp.tanh(jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp") + b2)


def stack_seq(x, w1, w2, b2):
    return jax.lax.scan(lambda h, w: (block_seq(h, *w), None), x, (w1, w2, b2))[0]


def stack_local(x, w1, w2, b2):
    return jax.lax.scan(lambda h, w: (block_local(h, *w), None), x, (w1, w2, b2))[0]


@dlverify.case
def scan_stack_forward():
    return dlverify.Case(
        seq=stack_seq, dist=_tp(stack_local), args=_stack_args(), expect="verified",
        description="A lax.scan over 4 tensor-parallel MLP blocks with stacked weights (TP=2)")


def fori_stack_local(x, w1, w2, b2):
    return jax.lax.fori_loop(0, LAYERS, lambda i, h: block_local(h, w1[i], w2[i], b2[i]), x)


@dlverify.case
def fori_stack_forward():
    return dlverify.Case(
        seq=stack_seq, dist=_tp(fori_stack_local), args=_stack_args(), expect="verified",
        description="The same stack as a fori_loop indexing the stacked weights (TP=2)")


def while_stack_local(x, w1, w2, b2):
    def body(state):
        i, h = state
        return i + 1, block_local(h, w1[i], w2[i], b2[i])
    return jax.lax.while_loop(lambda state: state[0] < LAYERS, body, (0, x))[1]


@dlverify.case
def while_stack_forward():
    return dlverify.Case(
        seq=stack_seq, dist=_tp(while_stack_local), args=_stack_args(), expect="verified",
        description="The same stack as a while_loop with a counter (static trip count; TP=2)")


def _loss(stack):
    return lambda x, w1, w2, b2: jnp.mean(stack(x, w1, w2, b2) ** 2)


def train_seq(x, w1, w2, b2):
    return jax.grad(_loss(stack_seq), argnums=(1, 2, 3))(x, w1, w2, b2)


def train_local(x, w1, w2, b2):
    return jax.grad(_loss(stack_local), argnums=(1, 2, 3))(x, w1, w2, b2)


@dlverify.case
def scan_stack_training():
    return dlverify.Case(
        seq=train_seq, dist=_tp(train_local, out_specs=GRAD_SPECS), args=_stack_args(),
        expect="verified",
        description="Gradients of every stacked weight through the scanned TP stack (TP=2)")


# --------------------------------------------------------------- buggy twins

def stack_local_missing_psum(x, w1, w2, b2):
    def block(h, w):
        w1, w2, b2 = w
        return h + jnp.tanh(jax.nn.gelu(h @ w1) @ w2 + b2), None  # BUG: missing psum over 'tp' inside the scanned block
    return jax.lax.scan(block, x, (w1, w2, b2))[0]


@dlverify.case
def scan_stack_bug_missing_psum():
    return dlverify.Case(
        seq=stack_seq, dist=_tp(stack_local_missing_psum, check_vma=False), args=_stack_args(),
        expect="bug", description="The scanned TP stack without the psum after the row-parallel matmul")


def fori_stack_local_bias_before_psum(x, w1, w2, b2):
    def block(i, h):
        partial = jax.nn.gelu(h @ w1[i]) @ w2[i]
        return h + jnp.tanh(jax.lax.psum(partial + b2[i], "tp"))  # BUG: bias added before the psum
    return jax.lax.fori_loop(0, LAYERS, block, x)


@dlverify.case
def fori_stack_bug_bias_before_psum():
    return dlverify.Case(
        seq=stack_seq, dist=_tp(fori_stack_local_bias_before_psum), args=_stack_args(),
        expect="bug", description="The fori_loop stack with each layer's bias added on every rank before the psum")
