"""Weight gradient gathered along the wrong dim under sequence parallelism
(NVIDIA/TransformerEngine #530).

A column-parallel Linear under sequence parallelism: the input x (tokens, D)
is sharded along the tokens. Forward gathers it along the tokens; the weight
gradient dW = x_full^T @ dy needs the full x again. TE's FP8 path keeps x
transposed, (D, tokens), so it must be gathered along its *last* dim;
`gather_along_last_dim` used `all_gather_into_tensor`, which concatenates
along dim 0, into a buffer shaped as the last-dim concatenation: the data are
scrambled, shapes still fit.

Cases: the correct forward and weight gradient (SP=TP=4) and the buggy twin
(gather along dim 0, then a reshape to the expected shape).
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TP = 4
TOKENS, D, F = 16, 8, 32
TL = TOKENS // TP


def _mesh(n):
    return dlverify.host_mesh((n,), ("tp",))


def _args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((TOKENS, D), f32),   # x
            jax.ShapeDtypeStruct((D, F), f32),        # w
            jax.ShapeDtypeStruct((TOKENS, F), f32))   # dy


def _dist(local_fn):
    col = P(None, "tp")
    return jax.jit(jax.shard_map(local_fn, mesh=_mesh(TP), in_specs=(P("tp", None), col, col),
                                 out_specs=(col, col)))


def linear_fwd_wgrad_seq(x, w, dy):
    return x @ w, x.T @ dy


def linear_fwd_wgrad_local(x, w, dy):
    y = jax.lax.all_gather(x, "tp", axis=0, tiled=True) @ w      # sequence-parallel gather
    x_t = x.T                                                       # saved transposed (D, TL)
    x_t_full = jax.lax.all_gather(x_t, "tp", axis=1, tiled=True)    # gather along the last dim
    return y, x_t_full @ dy


@dlverify.case
def te530_wgrad_gather_dim():
    return dlverify.Case(
        seq=linear_fwd_wgrad_seq, dist=_dist(linear_fwd_wgrad_local), args=_args(),
        expect="verified",
        description="column-parallel Linear under SP: forward and weight gradient, transposed "
                    "input gathered along its last dim; TP=4")


def linear_fwd_wgrad_local_bug(x, w, dy):
    """TransformerEngine #530: the transposed input is gathered along dim 0 and
    viewed as the last-dim gather."""
    y = jax.lax.all_gather(x, "tp", axis=0, tiled=True) @ w
    x_t = x.T
    x_t_full = jax.lax.all_gather(x_t, "tp", axis=0, tiled=True).reshape(D, TOKENS)  # BUG: gathered along dim 0
    return y, x_t_full @ dy


@dlverify.case
def te530_wgrad_gather_dim_bug():
    return dlverify.Case(
        seq=linear_fwd_wgrad_seq, dist=_dist(linear_fwd_wgrad_local_bug), args=_args(),
        expect="bug",
        description="TransformerEngine #530: weight-gradient input gathered along the wrong dim")
