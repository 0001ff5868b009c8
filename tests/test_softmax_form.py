"""dlverify/softmax_form.py: softmaxes in canonical form, whatever per-row value
the program subtracts before the exponential (issue 15 item 8).

The rewrite is exact over the reals: every test that rewrites also evaluates
both graphs before and after on random data and compares every output, and the
views derived afterwards are checked numerically by the shared evaluator.
"""
from __future__ import annotations

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax
from dlverify.frontends.jaxpr import import_jax
from dlverify.numeric import run_both, value_error, view_error
from dlverify.ops.semantics import Call
from dlverify.ops.structural import softmax
from dlverify.pass_order import rewrite

H, S, D = 2, 8, 4
ARGS = tuple(jax.ShapeDtypeStruct((H, S, D), jnp.float32) for _ in range(3))


def _scores(q, k):
    return jnp.einsum("hqd,hkd->hqk", q, k)


def seq_attention(q, k, v):
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(_scores(q, k), axis=-1), v)


def _attention(shift):
    """Attention normalised after the product with V, subtracting shift(s)."""
    def f(q, k, v):
        s = _scores(q, k)
        e = jnp.exp(s - shift(s))
        return jnp.einsum("hqk,hkd->hqd", e, v) / e.sum(-1, keepdims=True)
    return f


CORRECT = {
    "row_max": _attention(lambda s: s.max(-1, keepdims=True)),
    "a_constant": _attention(lambda s: 3.0),
    "the_first_column": _attention(lambda s: s[..., :1]),
    "no_shift": _attention(lambda s: 0.0),
    "softmax_of_a_shifted_input": lambda q, k, v: jnp.einsum(
        "hqk,hkd->hqd", jax.nn.softmax(_scores(q, k) - 1.5, axis=-1), v),
}
BUGGY = {   # name -> the line's marker
    "shift_varies_along_the_axis": _attention(lambda s: s[..., :1, :]),
    "normalised_over_the_wrong_axis": lambda q, k, v: (lambda e: jnp.einsum("hqk,hkd->hqd", e, v)
                                                        / e.sum(-2)[..., None][..., :D])(
        jnp.exp(_scores(q, k))),
}


def _tp(f):
    mesh = dlverify.host_mesh((2,), ("tp",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("tp"),) * 3, out_specs=P("tp")))


def _outputs_unchanged_by_the_rewrite(problem):
    before = copy.deepcopy(problem)
    rewrite(problem)
    for seed in (0, 1):
        a, b = run_both(before, seed), run_both(problem, seed)
        for g, ra, rb in (("seq", a.seq, b.seq), ("dist", a.dist, b.dist)):
            graph = getattr(problem, g)
            for t in graph.outputs:
                for x, y in zip(ra[t], rb[t]):
                    assert value_error(np.asarray(y, np.float64), np.asarray(x, np.float64)) <= 1e-9, (g, t)
    return problem


def test_the_canonical_softmax_is_the_softmax():
    x = np.random.default_rng(0).standard_normal((3, 5))
    got = softmax(Call({"axis": 1}, [x], x.shape, "float64"))
    assert np.allclose(got, np.asarray(jax.nn.softmax(x, axis=1)), atol=1e-6)


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_any_shift_constant_along_the_axis_verifies(name):
    problem = _outputs_unchanged_by_the_rewrite(import_jax(seq_attention, _tp(CORRECT[name]), ARGS))
    assert any(op.kind == "softmax" for op in problem.dist.ops)
    assert any(op.kind == "softmax" for op in problem.seq.ops)
    res = verify_jax(seq_attention, _tp(CORRECT[name]), *ARGS, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:2]]
    run = run_both(res.problem, seed=2)
    for v in res.views:
        if v.partial is None:
            assert view_error(run, res.problem, v) <= 1e-6, v


@pytest.mark.parametrize("name", sorted(BUGGY))
def test_a_shift_that_varies_or_a_wrong_normaliser_is_not_verified(name):
    # (a shift that varies along the axis is part of x: the distributed side is then
    # the softmax of s - k, exactly, and k has no sequential partner)
    _outputs_unchanged_by_the_rewrite(import_jax(seq_attention, _tp(BUGGY[name]), ARGS))
    res = verify_jax(seq_attention, _tp(BUGGY[name]), *ARGS, engine="clingo")
    assert not res.verified


def test_a_softmax_normalised_across_ranks_is_left_to_the_rules_on_both_sides():
    # the normalised axis split over the ranks: pmax, then a psum of the sums. No
    # distributed candidate, so the sequential softmax is not rewritten either,
    # and the rules relate the two as they did before the rewrite existed.
    mesh = dlverify.host_mesh((2,), ("cp",))

    def seq(x):
        e = jnp.exp(x - jax.lax.stop_gradient(x.max(-1, keepdims=True)))
        return e / e.sum(-1, keepdims=True)

    def local(x):
        m = jax.lax.pmax(jax.lax.stop_gradient(x.max(-1, keepdims=True)), "cp")
        e = jnp.exp(x - m)
        return e / jax.lax.psum(e.sum(-1, keepdims=True), "cp")

    dist = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, "cp"),), out_specs=P(None, "cp")))
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    problem = _outputs_unchanged_by_the_rewrite(import_jax(seq, dist, (x,)))
    assert not any(op.kind == "softmax" for g in (problem.seq, problem.dist) for op in g.ops)
    assert verify_jax(seq, dist, x, engine="clingo").verified
