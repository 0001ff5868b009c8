"""x ** 2 and jnp.square as one op (x * x left for the bug patterns) (dlverify/square_forms.py): the rewrite keeps
the values (shared evaluator) and leaves other powers and products; a LayerNorm whose
hidden dim is sharded (mean and variance by psums) verifies against jnp.var, and its
twin dividing by the local width does not."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from test_simplify import _graph, _run

import dlverify
from dlverify.api import verify_jax
from dlverify.square_forms import square_forms

F = "float32"


@pytest.mark.parametrize("form,squared", [("pow2", True), ("self_mul", False), ("pow3", False),
                                          ("mul_other", False)])
def test_squares_become_one_op(form, squared):
    def build(b, x, y):
        if form.startswith("pow"):
            return b.op("integer_pow", [x], (3, 4), F, {"y": int(form[-1])})
        return b.op("mul", [x, x if form == "self_mul" else y], (3, 4), F)
    g, ids = _graph(build, [(3, 4), (3, 4)])
    before = copy.deepcopy(g)
    assert square_forms(g, ids) == squared
    assert ({op.kind for op in g.ops} == {"square"}) == squared
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    np.testing.assert_array_equal(_run(g, ins)[0], _run(before, ins)[0])


TP, T, H = 4, 6, 16


def _layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5) * g + b


def _layernorm_hidden_sharded(width):
    def local(x, g, b):
        mu = lax.psum(jnp.sum(x, axis=-1, keepdims=True), "tp") / H
        var = lax.psum(jnp.sum((x - mu) ** 2, axis=-1, keepdims=True), "tp") / width
        return (x - mu) * lax.rsqrt(var + 1e-5) * g + b
    return local


@pytest.mark.parametrize("width,verified", [(H, True), (H // TP, False)])
def test_a_hidden_sharded_layernorm_verifies_against_jnp_var(width, verified):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    dist = jax.jit(jax.shard_map(_layernorm_hidden_sharded(width), mesh=mesh,
                                 in_specs=(P(None, "tp"), P("tp"), P("tp")), out_specs=P(None, "tp")))
    args = (jax.ShapeDtypeStruct((T, H), jnp.float32), jax.ShapeDtypeStruct((H,), jnp.float32),
            jax.ShapeDtypeStruct((H,), jnp.float32))
    res = verify_jax(_layernorm, dist, *args, engine="clingo", name="ln")
    assert res.verified == verified, [f.message[:200] for f in res.failures[:2]]
