"""Max pooling's gradient (`select_and_scatter_add`: the gradient lands on each
window's first maximum) in CNN training split over ranks: a ResNet-style stem
(conv, relu, 3x3/2 SAME max pool, conv).

- Channel parallel (TP=2): conv1's output channels split over 'tp' (kernel split
  on O), the pool per channel on the rank's own channels, conv2 reading them
  (kernel split on I) and psum'd; the kernels' gradients.
- Data parallel (DP=4): the batch split over 'dp', each rank's kernel gradients
  of its mean loss pmean'd.

Twins: the data-parallel gradients psum'd (scaled by the world size); the
channel-parallel pool taken after conv2's psum on the rank's partial sums
instead of before (pooling the partial sums: max does not distribute over +).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

TP, DP = 2, 4
B, C, H, W = 2, 4, 8, 8          # images per rank (NCHW)
C1, C2 = 8, 6                    # conv1 / conv2 output channels


def _conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME")


def _max_pool(h):
    """3x3 windows, stride 2, SAME (-inf padding): ResNet's stem pooling."""
    return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "SAME")


def _args(batch):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((batch, C, H, W), f32), jax.ShapeDtypeStruct((C1, C, 3, 3), f32),
            jax.ShapeDtypeStruct((C2, C1, 3, 3), f32))


def _loss(y):
    return jnp.mean(y ** 2)


def stem_seq(x, w1, w2):
    return _conv(_max_pool(jax.nn.relu(_conv(x, w1))), w2)


def stem_grads_seq(x, w1, w2):
    return jax.grad(lambda a, b: _loss(stem_seq(x, a, b)), argnums=(0, 1))(w1, w2)


# -- channel parallel -----------------------------------------------------------

def stem_tp_local(x, w1, w2):
    h = _max_pool(jax.nn.relu(_conv(x, w1)))      # this rank's C1 / TP channels
    return lax.psum(_conv(h, w2), "tp")


def stem_tp_grads(x, w1, w2):
    return jax.grad(lambda a, b: _loss(stem_tp_local(x, a, b)), argnums=(0, 1))(w1, w2)


def stem_tp_grads_pool_after_psum(x, w1, w2):
    def loss(a, b):
        h = jax.nn.relu(_conv(x, a))
        return _loss(_max_pool(lax.psum(_conv(h, b), "tp")))   # BUG: pools after conv2 (not the program's order)
    return jax.grad(loss, argnums=(0, 1))(w1, w2)


def _tp(grads):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=(P(), P("tp"), P(None, "tp")),
                                 out_specs=(P("tp"), P(None, "tp"))))


@dlverify.case
def pool_channel_parallel_grads():
    return dlverify.Case(seq=stem_grads_seq, dist=_tp(stem_tp_grads), args=_args(B),
                         expect="verified",
                         description="kernel gradients through a max pool, channels split; TP=2")


@dlverify.case
def pool_channel_parallel_bug_pool_after_psum():
    return dlverify.Case(seq=stem_grads_seq, dist=_tp(stem_tp_grads_pool_after_psum),
                         args=_args(B), expect="bug",
                         description="the max pool moved after conv2's reduction")


# -- data parallel --------------------------------------------------------------

def stem_dp_local(x, w1, w2):
    return lax.pmean(stem_grads_seq(x, w1, w2), "dp")   # each rank's mean loss: their mean


def stem_dp_local_psum(x, w1, w2):
    return lax.psum(stem_grads_seq(x, w1, w2), "dp")    # BUG: summed, not averaged over 'dp'


def _dp(local):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("dp"), P(), P()),
                                 out_specs=P(), check_vma=False))


@dlverify.case
def pool_data_parallel_grads():
    return dlverify.Case(seq=stem_grads_seq, dist=_dp(stem_dp_local), args=_args(B * DP),
                         expect="verified",
                         description="kernel gradients through a max pool, batch split over 'dp'; DP=4")


@dlverify.case
def pool_data_parallel_bug_psum():
    return dlverify.Case(seq=stem_grads_seq, dist=_dp(stem_dp_local_psum), args=_args(B * DP),
                         expect="bug", description="the gradients summed over 'dp', not averaged")
