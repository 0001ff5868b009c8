"""dlverify/kept_index.py: a masked gather's index that equals `labels - first` only
on the rows the mask keeps (a clip, min/max, a clamp, a clip before the shift, a
where on one side) is rewritten as the one-hot contraction, exactly: the rewritten
graphs compute what JAX computes on every rank, for labels far outside the vocab and
the int32 extremes. Bounds that cut a kept value and shifts by the wrong amount are
refused, and their programs are not verified."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from test_rules_masked_gather import INTS, _check_ranges_hold, _inputs, _outputs

import dlverify
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.interpret import Interpreter
from dlverify.masked_gather import rewrite_masked_gathers

TP, T, V = 4, 6, 16
VL = V // TP


def _args():
    return (jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))


def _seq(logits, labels):
    return (jnp.take_along_axis(logits, (labels % V)[:, None], axis=-1)[:, 0],)


def _dist(index_fn):
    def local(logits, labels):
        labels = labels % V
        first = lax.axis_index("tp") * VL
        outside = (labels < first) | (labels >= first + VL)
        picked = jnp.take_along_axis(logits, index_fn(labels, first)[:, None], axis=-1)[:, 0]
        return (lax.psum(jnp.where(outside, 0.0, picked), "tp"),)
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=(P(),),
                                 check_vma=False))


CORRECT = {
    "clip": lambda l, f: jnp.clip(l - f, 0, VL - 1),
    "min_max": lambda l, f: jnp.minimum(jnp.maximum(l - f, 0), VL - 1),
    "lax_clamp": lambda l, f: lax.clamp(0, l - f, VL - 1),
    "clip_then_shift": lambda l, f: jnp.clip(l, f, f + VL - 1) - f,
    "min_of_where": lambda l, f: jnp.minimum(jnp.where(l < f, 0, l - f), VL - 1),
}
BUGGY = {   # each reads another logit than labels - first on some kept row
    "clip_short": lambda l, f: jnp.clip(l - f, 0, VL - 2),
    "clip_low": lambda l, f: jnp.clip(l - f, 1, VL - 1),
    "clip_off_by_one": lambda l, f: jnp.clip(l - f + 1, 0, VL - 1),
    "shift_off_by_one": lambda l, f: jnp.clip(l, f, f + VL - 1) - f + 1,
}


def _rewritten_runs_as_jax(problem, dist):
    new = copy.deepcopy(problem)
    assert rewrite_masked_gathers(new)
    assert not any(op.kind == "gather" for op in new.dist.ops + new.seq.ops)
    rng = np.random.default_rng(0)
    for _ in range(4):
        seq_in, dist_in = _inputs(problem, rng, INTS)
        args = [x[0] if x[0].dtype == np.int32 else x[0].astype(np.float32) for x in seq_in]
        got_s, got_d = _outputs(new, seq_in, dist_in)
        np.testing.assert_allclose(got_s[0], np.asarray(_seq(*args)[0]), rtol=1e-6, atol=1e-6)
        want = np.asarray(dist(*args)[0])
        for r in range(TP):
            np.testing.assert_allclose(got_d[0][r], want, rtol=1e-6, atol=1e-6)
    return new


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_an_index_equal_on_the_kept_rows_rewrites_exactly_and_verifies(name):
    dist = _dist(CORRECT[name])
    problem = import_jax(_seq, dist, _args(), name)
    _rewritten_runs_as_jax(problem, dist)
    res = verify_problem(import_jax(_seq, dist, _args(), name), engine="clingo")
    assert res.verified, [f.message for f in res.failures]


@pytest.mark.parametrize("name", sorted(BUGGY))
def test_an_index_that_differs_on_a_kept_row_is_refused(name):
    dist = _dist(BUGGY[name])
    problem = import_jax(_seq, dist, _args(), name)
    assert not rewrite_masked_gathers(copy.deepcopy(problem))
    res = verify_problem(problem, engine="clingo")
    assert not res.verified
    if name != "shift_off_by_one":   # a bound cuts kept rows: the diagnosis names it, first
        first = res.failures[0]
        assert first.kind == "index-cut-on-kept-rows" and first.op in ("max", "min", "clamp"), first
        assert first.line == BUGGY[name].__code__.co_firstlineno, (first.line, first.message)
    # the buggy programs do differ: on some labels the sequential and distributed results part
    rng = np.random.default_rng(1)
    seq_in, dist_in = _inputs(import_jax(_seq, dist, _args(), name), rng, np.arange(V))
    args = [x[0] if x[0].dtype == np.int32 else x[0].astype(np.float32) for x in seq_in]
    labels = np.arange(T, dtype=np.int32) * (V // T + 1) % V
    args[1] = labels
    assert not np.allclose(np.asarray(_seq(*args)[0]), np.asarray(dist(*args)[0]))


def test_the_index_ranges_of_a_clip_hold_on_data():
    problem = import_jax(_seq, _dist(CORRECT["clip_then_shift"]), _args(), "ranges")
    rng = np.random.default_rng(2)
    mesh = problem.mesh
    seq_in, dist_in = _inputs(problem, rng, INTS)
    dv = Interpreter(problem.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
    assert _check_ranges_hold(problem.dist, mesh, dv) > 0
