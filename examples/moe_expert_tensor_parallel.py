"""Expert parallelism with expert tensor parallelism: the experts sharded over 'ep' and
each expert's FFN hidden dim over 'tp' (Megatron-Core's expert tensor parallelism,
DeepSpeed-MoE's expert slicing), one psum over both mesh axes.

Routing is computed on every rank (top-1, the softmax gate weight on the chosen
expert, a dense combine matrix). Each rank holds its experts' rows of w1 and w2,
and of those its slice of the hidden dim: its output is a partial sum over the
hidden units it holds, of its experts only, weighted by its experts' columns of the
combine matrix. The psum over ('ep', 'tp') adds every expert's every hidden slice.

The combine einsum contracts the expert dim, of which a rank holds one block, with
an operand that is itself a partial sum over hidden units: the terms are a product
of two families, expert blocks x hidden units (datalog/partials.dl, Tag_ProdBase).

Buggy twins: the psum over 'tp' only (each expert group's output never added), and
the combine columns sliced at the 'tp' index instead of the 'ep' index.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

TOKENS, D_MODEL, EXPERTS, D_FF = 8, 8, 4, 16
f32 = jnp.float32


def _args():
    return (jax.ShapeDtypeStruct((TOKENS, D_MODEL), f32),            # x
            jax.ShapeDtypeStruct((D_MODEL, EXPERTS), f32),           # router
            jax.ShapeDtypeStruct((EXPERTS, D_MODEL, D_FF), f32),     # w1 per expert
            jax.ShapeDtypeStruct((EXPERTS, D_FF, D_MODEL), f32))     # w2 per expert


# experts' rows over 'ep', the hidden dim over 'tp'
SPECS = (P(), P(), P("ep", None, "tp"), P("ep", "tp", None))


def _combine(x, router):
    logits = x @ router
    return jax.nn.one_hot(jnp.argmax(logits, -1), EXPERTS) * jax.nn.softmax(logits, -1)


def _experts(x, w1, w2):
    h = jax.nn.gelu(jnp.einsum("td,edf->tef", x, w1))
    return jnp.einsum("tef,efd->ted", h, w2)


def moe_seq(x, router, w1, w2):
    return jnp.einsum("te,ted->td", _combine(x, router), _experts(x, w1, w2))


def moe_local(x, router, w1, w2):
    local = w1.shape[0]
    mine = jax.lax.dynamic_slice_in_dim(_combine(x, router), jax.lax.axis_index("ep") * local, local, 1)
    y = jnp.einsum("te,ted->td", mine, _experts(x, w1, w2))
    return jax.lax.psum(y, ("ep", "tp"))


def moe_local_tp_only(x, router, w1, w2):
    local = w1.shape[0]
    mine = jax.lax.dynamic_slice_in_dim(_combine(x, router), jax.lax.axis_index("ep") * local, local, 1)
    y = jnp.einsum("te,ted->td", mine, _experts(x, w1, w2))
    return jax.lax.psum(y, "tp")  # BUG: the expert groups' outputs are never added


def moe_local_wrong_axis(x, router, w1, w2):
    local = w1.shape[0]
    mine = jax.lax.dynamic_slice_in_dim(_combine(x, router), jax.lax.axis_index("tp") * local, local, 1)
    y = jnp.einsum("te,ted->td", mine, _experts(x, w1, w2))  # BUG: combine columns of the 'tp' index
    return jax.lax.psum(y, ("ep", "tp"))


def _dist(fn, grads=False):
    mesh = dlverify.host_mesh((2, 2), ("ep", "tp"))
    if grads:
        fn = jax.grad(lambda *a, f=fn: jnp.mean(f(*a) ** 2), argnums=(0, 2, 3))
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=SPECS, out_specs=(P(),) + SPECS[2:],
                                     check_vma=True))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=SPECS, out_specs=P(), check_vma=False))


def _seq_grads(*args):
    return jax.grad(lambda *a: jnp.mean(moe_seq(*a) ** 2), argnums=(0, 2, 3))(*args)


@dlverify.case
def moe_ep2_tp2_forward():
    return dlverify.Case(seq=moe_seq, dist=_dist(moe_local), args=_args(), expect="verified",
                         description="4 experts over 'ep', their hidden dim over 'tp'")


@dlverify.case
def moe_ep2_tp2_grads():
    return dlverify.Case(seq=_seq_grads, dist=_dist(moe_local, grads=True), args=_args(),
                         expect="verified", description="gradients of x, w1 and w2")


@dlverify.case
def moe_bug_psum_over_tp_only():
    return dlverify.Case(seq=moe_seq, dist=_dist(moe_local_tp_only), args=_args(), expect="bug",
                         description="the psum misses the 'ep' axis")


@dlverify.case
def moe_bug_combine_sliced_by_tp():
    return dlverify.Case(seq=moe_seq, dist=_dist(moe_local_wrong_axis), args=_args(), expect="bug",
                         description="each rank weights its experts with other experts' gates")
