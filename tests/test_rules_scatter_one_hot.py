"""frontends/jaxpr/scatter.py: a scatter-add of whole rows at data-dependent
indices (jnp.take's gradient, x.at[i].add(u)) as operand + onehot(i)^T . updates.

The exported graph is run by the IR interpreter on indices inside and far outside
the operand (fill_or_drop drops those rows, clip clamps them) and compared with JAX;
the verdicts (vocab rows sharded, and a scatter into the wrong rows) follow."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.frontends.jaxpr import import_jax
from dlverify.interpret import Interpreter
from rulekit import assert_views_hold

V, D, T = 6, 4, 5


def _args():
    return (jax.ShapeDtypeStruct((V, D), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32),
            jax.ShapeDtypeStruct((T, D), jnp.float32))


def take_grad(e, i, c):
    return jax.vjp(lambda e: jnp.take(e, i, axis=0), e)[1](c)[0]


def add_rows_clip(e, i, c):
    return e.at[i].add(c, mode="clip")


def add_cols_drop(e, i, c):   # rows of e.T: the scattered dim is 1
    return e.T.at[:, i].add(c.T, mode="drop").T


def _dist(fn, table_spec):
    mesh = dlverify.host_mesh((2,), ("x",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(table_spec, P(), P(None, "x")),
                                 out_specs=table_spec, check_vma=False))


@pytest.mark.parametrize("fn", [take_grad, add_rows_clip, add_cols_drop])
def test_the_one_hot_contraction_is_the_scatter_add(fn):
    problem = import_jax(fn, _dist(fn, P(None, "x")), _args(), fn.__name__)
    assert any(op.kind == "dot_general" for op in problem.seq.ops)
    assert not any(op.kind.startswith("scatter") for op in problem.seq.ops)
    rng = np.random.default_rng(0)
    for _ in range(5):
        e = rng.standard_normal((V, D)).astype(np.float32)
        i = rng.choice(np.r_[-9:12, np.iinfo(np.int32).min, np.iinfo(np.int32).max], T).astype(np.int32)
        c = rng.standard_normal((T, D)).astype(np.float32)
        got = Interpreter(problem.seq, 1).run([[e], [i], [c]])[problem.seq.outputs[0]][0]
        want = fn(jnp.asarray(e), jnp.asarray(i), jnp.asarray(c))
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [take_grad, add_rows_clip, add_cols_drop])
def test_columns_of_the_table_sharded_verify(fn):
    res = dlverify.verify_jax(fn, _dist(fn, P(None, "x")), *_args())
    assert res.verified, [f.message for f in res.failures]
    assert_views_hold(res.problem, res.views)


def test_a_scatter_into_shifted_rows_is_not_verified():
    def shifted(e, i, c):
        return e.at[i + 1].add(c)
    res = dlverify.verify_jax(take_grad, _dist(shifted, P(None, "x")), *_args())
    assert not res.verified
