"""dlverify/unit_collectives.py: an all_reduce of a broadcast or reshape that only
inserts size-1 dims is that layout of the all_reduce, and a reshape of such a layout
is a reshape of its operand. Each rewrite keeps every value of the graph on every
rank (the shared evaluator, random data); layouts that expand or transpose stay.
A vocab-parallel cross-entropy that keeps its row max as [T, 1] through the pmax
verifies against jax.nn.logsumexp; squeezing a local max (no pmax) does not."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.unit_collectives import move_unit_insertions

F = "float32"
MESH = Mesh(("x",), (4,))


def _dist_graph(layout):
    """x [4, 6] per rank -> reduce_max -> layout -> all_reduce(max) -> reshape [4] (and the
    all_reduce itself as a second output)."""
    g, ids = Graph("distributed"), IdAllocator()
    b = GraphBuilder(g, ids)
    x = b.tensor((4, 6), F, "x")
    g.inputs.append(x)
    m = b.op("reduce_max", [x], (4,), F, {"axes": (1,)})
    u = layout(b, m)
    shape = g.tensors[u].shape
    red = b.op("all_reduce", [u], shape, F, {"reducer": "max", "groups": [[0, 1, 2, 3]]})
    sq = b.op("reshape", [red], (4,) if int(np.prod(shape)) == 4 else (int(np.prod(shape)),), F)
    g.outputs += [sq, red]
    return g, ids


def _run(g, xs):
    vals = Interpreter(g, MESH.size, lambda r, a: MESH.coords(r)[a]).run([xs])
    return vals


LAYOUTS = {
    "broadcast_keepdims": lambda b, m: b.op("broadcast_in_dim", [m], (4, 1), F, {"broadcast_dimensions": (0,)}),
    "broadcast_leading": lambda b, m: b.op("broadcast_in_dim", [m], (1, 4, 1), F, {"broadcast_dimensions": (1,)}),
    "reshape_units": lambda b, m: b.op("reshape", [m], (1, 4, 1), F),
    "two_insertions": lambda b, m: b.op("reshape", [b.op("broadcast_in_dim", [m], (4, 1), F,
                                                           {"broadcast_dimensions": (0,)})], (1, 4, 1), F),
}
KEPT = {   # layouts that are not size-1 insertions: not moved
    "expanding_broadcast": lambda b, m: b.op("broadcast_in_dim", [m], (4, 3), F, {"broadcast_dimensions": (0,)}),
    "regrouping_reshape": lambda b, m: b.op("reshape", [m], (2, 2), F),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_an_all_reduce_of_a_size1_insertion_moves_out_and_the_squeeze_goes(name):
    g, ids = _dist_graph(LAYOUTS[name])
    before = copy.deepcopy(g)
    assert move_unit_insertions(g, ids)
    (sq_op,) = [op for op in g.ops if op.output == g.outputs[0]] or [None]
    # the squeeze now reads the all_reduce of the [4] max itself
    assert sq_op is not None and sq_op.kind == "all_reduce" and g.tensors[sq_op.inputs[0]].shape == (4,)
    rng = np.random.default_rng(0)
    for _ in range(3):
        xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(MESH.size)]
        want, got = _run(before, xs), _run(g, xs)
        for t in set(before.tensors) & set(g.tensors):
            if t in want and t in got:
                for r in range(MESH.size):
                    np.testing.assert_array_equal(want[t][r], got[t][r])
        for a, b in zip(before.outputs, g.outputs):
            for r in range(MESH.size):
                np.testing.assert_array_equal(want[a][r], got[b][r])


@pytest.mark.parametrize("name", sorted(KEPT))
def test_layouts_that_add_or_regroup_elements_stay(name):
    g, ids = _dist_graph(KEPT[name])
    assert not move_unit_insertions(g, ids)


TP, T, V = 4, 8, 16
VL = V // TP


def _seq(logits, labels):
    labels = labels % V
    tgt = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - tgt)


def _dist(pmax):
    def local(logits, labels):
        labels = labels % V
        first = lax.axis_index("tp") * VL
        m = lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        m = lax.pmax(m, "tp") if pmax else m
        lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1), "tp")) + m[:, 0]
        outside = (labels < first) | (labels >= first + VL)
        picked = jnp.take_along_axis(logits, jnp.where(outside, 0, labels - first)[:, None], axis=-1)[:, 0]
        return jnp.mean(lse - lax.psum(jnp.where(outside, 0.0, picked), "tp"))
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P(),
                                 check_vma=False))


def _args():
    return (jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))


def test_a_keepdims_pmax_squeezed_verifies_against_jax_logsumexp():
    res = verify_problem(import_jax(_seq, _dist(True), _args(), "keepdims"), engine="clingo")
    assert res.verified, [f.message for f in res.failures]


def test_a_squeezed_local_max_is_not_verified():
    res = verify_problem(import_jax(_seq, _dist(False), _args(), "local_max"), engine="clingo")
    assert not res.verified
    assert any("partial" in f.message for f in res.failures[:1]), [f.message for f in res.failures[:2]]
