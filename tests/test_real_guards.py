"""Guards against values real numbers never take (dlverify/real_guards.py): each
rewrite keeps the outputs on random data (the shared evaluator) and removes the
guard; guards whose side condition fails stay; jax.nn.logsumexp's shift reaches the
row max a hand-written vocab-parallel cross-entropy uses."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_simplify import _graph, _run, _splat

from dlverify.frontends.jaxpr import Ctx, walk
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.real_guards import drop_real_guards

F = "float32"


def _guarded(build, in_shapes, gone: set[str], dropped: bool = True):
    g, ids = _graph(build, in_shapes)
    before = copy.deepcopy(g)
    assert drop_real_guards(g, ids) == dropped
    kinds = [op.kind for op in g.ops]
    if dropped:
        assert not gone & set(kinds), kinds
    rng = np.random.default_rng(0)
    for _ in range(3):
        ins = [rng.standard_normal(s).astype(np.float32) for s in in_shapes]
        for a, b in zip(_run(before, ins), _run(g, ins)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    return g


def _max_shift(b, x):
    """JAX's logsumexp shift: select_n(is_finite(m), 0, m), m = max(reduce_max(x), -inf)."""
    m = b.op("reduce_max", [x], (4,), F, {"axes": (1,)})
    m = b.op("max", [m, _splat(b, -np.inf, (4,))], (4,), F)
    fin = b.op("is_finite", [m], (4,), "bool")
    return b.op("select_n", [fin, _splat(b, 0.0, (4,)), m], (4,), F)


def test_the_finite_guard_of_a_row_max_is_the_row_max():
    g = _guarded(_max_shift, [(4, 6)], {"is_finite", "select_n", "max"})
    (op,) = [o for o in g.ops if o.output == g.outputs[0]]
    assert op.kind == "reduce_max"


def test_a_finite_guard_of_a_value_that_may_be_infinite_stays():
    def build(b, x):        # log(x) is -inf at 0 and NaN below: the guard is not vacuous
        lx = b.op("log", [x], (4,), F)
        fin = b.op("is_finite", [lx], (4,), "bool")
        return b.op("select_n", [fin, _splat(b, 0.0, (4,)), lx], (4,), F)
    _guarded(build, [(4,)], set(), dropped=False)


def test_a_guard_picking_the_other_branch_stays():
    def build(b, x):        # is_finite(x) ? 0 : x  is 0 for every real x, not x
        fin = b.op("is_finite", [x], (4,), "bool")
        return b.op("select_n", [fin, x, _splat(b, 0.0, (4,))], (4,), F)
    _guarded(build, [(4,)], set(), dropped=False)


@pytest.mark.parametrize("inner", ["exp", "square", "softmax_sum", "psum_free"])
def test_abs_of_a_nonnegative_value_is_the_value(inner):
    def build(b, x):
        if inner == "exp":
            v = b.op("reduce_sum", [b.op("exp", [x], (4, 6), F)], (4,), F, {"axes": (1,)})
        elif inner == "square":
            v = b.op("add", [b.op("square", [x], (4, 6), F), b.op("abs", [x], (4, 6), F)],
                     (4, 6), F)
            v = b.op("max", [v, x], (4, 6), F)
        elif inner == "softmax_sum":
            e = b.op("exp", [x], (4, 6), F)
            v = b.op("mul", [e, _splat(b, 0.5, (4, 6))], (4, 6), F)
        else:
            v = b.op("reshape", [b.op("exp", [x], (4, 6), F)], (24,), F)
        return b.op("abs", [v], b.graph.tensors[v].shape, F)
    g = _guarded(build, [(4, 6)], {"abs"} if inner != "square" else set())
    assert g.outputs[0] not in {o.output for o in g.ops if o.kind == "abs"}


@pytest.mark.parametrize("inner", ["input", "sub", "negative_scale", "log"])
def test_abs_of_a_value_of_either_sign_stays(inner):
    def build(b, x):
        e = b.op("exp", [x], (4, 6), F)
        v = {"input": lambda: x,
             "sub": lambda: b.op("sub", [e, _splat(b, 1.0, (4, 6))], (4, 6), F),
             "negative_scale": lambda: b.op("mul", [e, _splat(b, -0.5, (4, 6))], (4, 6), F),
             "log": lambda: b.op("log", [e], (4, 6), F)}[inner]()
        return b.op("abs", [v], (4, 6), F)
    g = _guarded(build, [(4, 6)], set(), dropped=False)
    assert any(o.kind == "abs" for o in g.ops)


def test_jax_logsumexp_loses_its_guards():
    """jax.nn.logsumexp as the jaxpr frontend builds it: max with -inf, is_finite,
    select_n and abs all go; the values stay."""
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    closed = jax.make_jaxpr(lambda a: jax.nn.logsumexp(a, axis=-1))(x)
    ids = IdAllocator()
    g = Graph("lse")
    b = GraphBuilder(g, ids)
    g.inputs = [b.tensor(x.shape, F)]
    g.outputs = walk(Ctx(b, None, False), closed, g.inputs)
    assert drop_real_guards(g, ids)
    kinds = {op.kind for op in g.ops}
    assert not kinds & {"is_finite", "select_n", "abs", "max"}, kinds
    got = Interpreter(g, 1).run([[x]])[g.outputs[0]][0]
    np.testing.assert_allclose(got, np.asarray(jax.nn.logsumexp(jnp.asarray(x), axis=-1)),
                               rtol=1e-5)


TP, T, V = 4, 16, 32


def _lse_loss(logits, labels):
    labels = labels % V
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - target)


def _vocab_parallel_loss(global_max):
    from jax import lax

    def loss(logits, labels):
        labels = labels % V
        first = lax.axis_index("tp") * (V // TP)
        m = lax.stop_gradient(jnp.max(logits, axis=-1))
        if global_max:
            m = lax.pmax(m, "tp")
        lse = jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")) + m
        outside = (labels < first) | (labels >= first + V // TP)
        local = jnp.where(outside, 0, labels - first)
        picked = jnp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
        return jnp.mean(lse - lax.psum(jnp.where(outside, 0.0, picked), "tp"))
    return loss


@pytest.mark.parametrize("global_max", [True, False])
def test_a_vocab_parallel_cross_entropy_verifies_against_jax_logsumexp(global_max):
    """The sequential loss by jax.nn.logsumexp, the distributed one shifted by the pmax
    of the ranks' row maxima (verified), or by each rank's own max (not verified)."""
    import dlverify
    from jax.sharding import PartitionSpec as P

    from dlverify.api import verify_jax

    mesh = dlverify.host_mesh((TP,), ("tp",))
    dist = jax.jit(jax.shard_map(_vocab_parallel_loss(global_max), mesh=mesh,
                                 in_specs=(P(None, "tp"), P()), out_specs=P(), check_vma=False))
    args = (jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))
    res = verify_jax(_lse_loss, dist, *args, engine="clingo", name="xent")
    assert res.verified == global_max, [f.message[:200] for f in res.failures[:2]]
