"""The jaxpr frontend on `jax.grad` of a `jax.jit` around a `shard_map`
(examples/grad_of_jit_shard_map.py): `reshard` (a sharding change: the identity on
the value outside shard_map, and inside it when the spec names no mesh axis; a
loud error otherwise), and a later shard_map taking back the blocks an earlier
one assembled (the residuals of the forward shard_map, read by the backward one)
as those blocks themselves.

Each checked against JAX: the distributed graph the frontend builds, run by the
shared evaluator on every rank, computes what JAX computes on the same inputs."""
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import dlverify
from dlverify.errors import UnknownOpError
from dlverify.frontends.jaxpr import import_jax
from dlverify.frontends.jaxpr.primitives import _reshard
from dlverify.frontends.jaxpr.walk import Ctx
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.numeric import random_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import grad_of_jit_shard_map as G  # noqa: E402

f32 = jnp.float32


def _as_jax(seq_fn, dist_fn, args):
    """The frontend's distributed graph, run by the shared evaluator on every rank,
    against JAX's dist_fn on the same global inputs; returns the problem."""
    problem = import_jax(seq_fn, dist_fn, args)
    seq_in, dist_in = random_inputs(problem, seed=3)
    for x, per_rank in zip(seq_in, dist_in):   # global code: every rank holds the inputs
        assert all(np.array_equal(x, xr) for xr in per_rank)
    mesh = problem.mesh
    vals = Interpreter(problem.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
    want = jax.tree.leaves(dist_fn(*[x.astype(np.float32) for x in seq_in]))
    assert len(want) == len(problem.dist.outputs)
    for t, w in zip(problem.dist.outputs, want):
        for r in range(mesh.size):
            np.testing.assert_allclose(vals[t][r], np.asarray(w), rtol=1e-4, atol=1e-5)
    return problem


def _gathered_then_sliced(problem):
    """dynamic_slices that read an all_gather's result."""
    producer = problem.dist.producer()
    return [op for op in problem.dist.ops if op.kind == "dynamic_slice"
            and producer.get(op.inputs[0]) is not None
            and producer[op.inputs[0]].kind == "all_gather"]


# ------------------------------------------------------------------ jax.grad(jit(shard_map))

@pytest.mark.parametrize("tp, argnums", [(2, (2, 3)), (4, (2, 3)), (2, (0, 2, 3))])
def test_grad_of_a_jitted_shard_map_is_what_jax_computes_and_verifies(tp, argnums):
    seq, dist = G._grads(G.loss_seq, argnums), G._grads(G._loss(G.loss_local, tp), argnums)
    jaxpr = jax.make_jaxpr(dist)(*G._args())
    assert "reshard" in {e.primitive.name for e in jaxpr.jaxpr.eqns}   # the cotangent seed
    problem = _as_jax(seq, dist, G._args())
    assert not _gathered_then_sliced(problem)   # residuals read as the ranks' own blocks
    res = dlverify.verify_jax(seq, dist, *G._args())
    assert res.verified, [f.message for f in res.failures[:2]]


def test_the_partial_loss_twin_is_what_jax_computes_and_does_not_verify():
    seq = G._grads(G.loss_seq, (2, 3))
    dist = G._grads(G._loss(G.loss_local_partial, 2), (2, 3))
    _as_jax(seq, dist, G._args())
    assert not dlverify.verify_jax(seq, dist, *G._args()).verified


# ------------------------------------------------------------------ blocks taken back

def _two_shard_maps(back_spec):
    mesh = dlverify.host_mesh((2,), ("tp",))

    def dist(x):
        y = jax.shard_map(jnp.tanh, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))(x)
        z = jax.shard_map(lambda b: b * 3.0, mesh=mesh, in_specs=back_spec,
                          out_specs=back_spec)(y)
        return z + 1.0
    return dist


def seq_tanh(x):
    return jnp.tanh(x) * 3.0 + 1.0


@pytest.mark.parametrize("back_spec, sliced", [(P("tp"), False), (P(None, "tp"), True)])
def test_a_block_taken_back_along_the_same_axes_is_the_block_itself(back_spec, sliced):
    # along the same axes: the rank's own block; along others: sliced from the gathered
    # value as before. Both are what JAX computes, and both verify
    args = (jax.ShapeDtypeStruct((4, 6), f32),)
    dist = _two_shard_maps(back_spec)
    problem = _as_jax(seq_tanh, dist, args)
    assert bool(_gathered_then_sliced(problem)) == sliced
    res = dlverify.verify_jax(seq_tanh, dist, *args)
    assert res.verified, [f.message for f in res.failures[:2]]


# ------------------------------------------------------------------ reshard itself

def test_reshard_to_a_replicated_spec_is_the_identity_inside_and_outside_shard_map():
    mesh = dlverify.host_mesh((2,), ("tp",))

    def dist(x):
        def local(b):
            return jnp.exp(jax.sharding.reshard(b, P()))
        y = jax.shard_map(local, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))(x)
        return jax.sharding.reshard(y, NamedSharding(mesh, P())) * 2.0

    def seq(x):
        return jnp.exp(x) * 2.0
    args = (jax.ShapeDtypeStruct((4, 6), f32),)
    names = [e.primitive.name for e in jax.make_jaxpr(dist)(*args).jaxpr.eqns]
    assert "reshard" in names
    problem = _as_jax(seq, dist, args)
    assert "reshard" not in {op.name for op in problem.dist.ops}   # no op: the value itself
    assert dlverify.verify_jax(seq, dist, *args).verified


def _reshard_eqn():
    """A real reshard equation (of a shard_map body), and a Ctx inside shard_map."""
    mesh = dlverify.host_mesh((2,), ("tp",))

    def g(x):
        return jax.shard_map(lambda b: jax.sharding.reshard(b, P()), mesh=mesh,
                             in_specs=P("tp"), out_specs=P("tp"))(x)
    outer = jax.make_jaxpr(g)(jnp.ones((4, 4), f32)).jaxpr.eqns[0]
    (eqn,) = [e for e in outer.params["jaxpr"].eqns if e.primitive.name == "reshard"]
    ids, graph = IdAllocator(), Graph("g")
    b = GraphBuilder(graph, ids)
    x = b.tensor((2, 4), "float32", "x")
    ctx = Ctx(b, Mesh(("tp",), (2,)), True)
    return eqn, ctx, x


def test_reshard_inside_shard_map_naming_a_mesh_axis_is_refused_loudly():
    eqn, ctx, x = _reshard_eqn()
    assert _reshard(ctx, eqn, [x]) == [x]                # P(): the rank's value itself
    dst = eqn.params["dst_sharding"]
    named = eqn.replace(params=dict(eqn.params, dst_sharding=dst.update(spec=P("tp"))))
    with pytest.raises(UnknownOpError, match="reshard .* inside shard_map"):
        _reshard(ctx, named, [x])
