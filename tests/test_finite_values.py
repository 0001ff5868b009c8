"""Which values are finite reals for all finite inputs (dlverify/finite_values.py),
and the softmax shift identity taking only such a stabiliser
(dlverify/softmax_form.py): exp(x - k) / sum exp(x - k) is softmax(x) for a real
k; with k = min(rowmax, -inf) = -inf the program yields NaN, and must not verify
(found by bench/hlo_mutants.py: four compiled attention modules with the
stabiliser's max turned into a min, or its -inf splat read instead, verified)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax
from dlverify.finite_values import FiniteValues
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator

F32 = "float32"


def _graph():
    g = Graph("g")
    b = GraphBuilder(g, IdAllocator())
    x = b.tensor((4, 8), F32, "x")
    g.inputs.append(x)
    rowmax = b.op("reduce_max", [x], (4,), F32, {"axes": (1,)})
    neg_inf = b.op("broadcast_in_dim", [b.constant(np.array(-np.inf, np.float32), (), F32)], (4,),
                   F32, {"broadcast_dimensions": (), "shape": (4,)})
    pos_inf = b.constant(np.full((4,), np.inf, np.float32), (4,), F32)
    vals = {
        "max with -inf": (b.op("max", [rowmax, neg_inf], (4,), F32), True),
        "-inf with max": (b.op("max", [neg_inf, rowmax], (4,), F32), True),
        "min with -inf": (b.op("min", [rowmax, neg_inf], (4,), F32), False),
        "min with +inf": (b.op("min", [pos_inf, rowmax], (4,), F32), True),
        "max with +inf": (b.op("max", [rowmax, pos_inf], (4,), F32), False),
        "the -inf splat": (neg_inf, False),
        "exp of a sum": (b.op("exp", [b.op("add", [rowmax, rowmax], (4,), F32)], (4,), F32), True),
        "a division": (b.op("div", [rowmax, rowmax], (4,), F32), False),
        "a logarithm": (b.op("log", [rowmax], (4,), F32), False),
        "a finite literal": (b.constant(np.arange(4, dtype=np.float32), (4,), F32), True),
        "an integer": (b.op("convert_to_int", [b.op("div", [rowmax, rowmax], (4,), F32)], (4,),
                            "int32"), True),
    }
    return g, vals


@pytest.mark.parametrize("name", list(_graph()[1]))
def test_finite_values(name):
    g, vals = _graph()
    t, finite = vals[name]
    assert FiniteValues(g)(t) is finite
    if finite and g.tensors[t].dtype == F32:   # checked on random inputs: finite indeed
        x = np.random.default_rng(0).standard_normal((4, 8))
        got = Interpreter(g, 1).run([[x]])[t][0]
        assert np.all(np.isfinite(got))


def test_an_elided_constant_is_not_known_finite():
    g = Graph("g")
    t = GraphBuilder(g, IdAllocator()).constant(None, (4,), F32)
    assert not FiniteValues(g)(t)


def _seq(x):
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _dist(stabilise):
    def local(x):
        k = stabilise(jnp.max(x, axis=-1, keepdims=True), -jnp.inf)
        e = jnp.exp(x - k)
        return e / e.sum(-1, keepdims=True)
    mesh = dlverify.host_mesh((2,), ("dp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")))


ARG = jax.ShapeDtypeStruct((8, 16), jnp.float32)


def test_a_softmax_stabilised_by_its_max_verifies():
    res = verify_jax(_seq, _dist(jnp.maximum), ARG, engine="clingo")
    assert res.verified, [f.message for f in res.failures[:2]]


def test_a_softmax_stabilised_by_minus_infinity_is_not_verified():
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    assert np.isnan(np.asarray(_dist(jnp.minimum)(x))).all()   # what the bug does
    res = verify_jax(_seq, _dist(jnp.minimum), ARG, engine="clingo")
    assert not res.verified
