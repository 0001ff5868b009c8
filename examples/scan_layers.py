"""Layer stacks and gradient accumulation written as loops (`lax.scan`,
`lax.fori_loop`, `lax.while_loop`), as MaxText-style JAX models write them.

A stack of L residual Megatron MLP blocks, x <- x + tanh(gelu(x @ w1[l]) @ w2[l] + b2[l]),
with the per-layer weights stacked on a leading dim: w1 [L, D, F] split on F,
w2 [L, F, D] split on F over 'tp'. The scan carries the residual stream; each
iteration reads its layer's slice of the stacked weights. Training takes the
gradient of every stacked weight through the scan (JAX's transpose of a scan
is a reversed scan reading the stacked forward activations).

Gradient accumulation: a linear model's batch is split over 'dp' and each
rank's shard into micro-batches; a scan adds the micro-batches' gradients
into a zeros buffer, the sum is divided by the micro-batch count and averaged
over 'dp'.

Buggy twins: a missing psum inside the scanned block, the bias added inside
the block before the psum, and gradient accumulation that forgets to divide
by the number of micro-batches.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

LAYERS, BATCH, D_MODEL, D_FF, TP = 4, 8, 16, 32, 2
DP, MICRO, GBATCH, D_IN, D_OUT = 2, 4, 32, 8, 4


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


# ------------------------------------------------------ gradient accumulation

def _dp_args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((D_IN, D_OUT), f32),    # w
        jax.ShapeDtypeStruct((GBATCH, D_IN), f32),   # x
        jax.ShapeDtypeStruct((GBATCH, D_OUT), f32),  # t
    )


def mse(w, x, t):
    return jnp.mean((x @ w - t) ** 2)


def accum_seq(w, x, t):
    return jax.grad(mse)(w, x, t)


def _accumulate(w, x, t):
    """The sum of the micro-batches' gradients of this rank's shard."""
    w = jax.lax.pcast(w, "dp", to="varying")
    xs = x.reshape(MICRO, -1, D_IN)
    ts = t.reshape(MICRO, -1, D_OUT)

    def step(acc, batch):
        return acc + jax.grad(mse)(w, *batch), None
    return jax.lax.scan(step, jnp.zeros_like(w), (xs, ts))[0]


def accum_local(w, x, t):
    return jax.lax.pmean(_accumulate(w, x, t) / MICRO, "dp")


def _dp(local_fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                                 out_specs=P()))


@dlverify.case
def scan_grad_accumulation():
    return dlverify.Case(
        seq=accum_seq, dist=_dp(accum_local), args=_dp_args(), expect="verified",
        description="Data-parallel gradient accumulated over 4 micro-batches by a scan, then pmean (DP=2)")


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


def accum_local_no_divide(w, x, t):
    return jax.lax.pmean(_accumulate(w, x, t), "dp")  # BUG: the accumulated sum is not divided by MICRO


@dlverify.case
def scan_grad_accumulation_bug_no_divide():
    return dlverify.Case(
        seq=accum_seq, dist=_dp(accum_local_no_divide), args=_dp_args(), expect="bug",
        description="Gradient accumulation that returns the sum of the micro-batch gradients, not their mean")
