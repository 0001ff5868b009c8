"""Run every case in examples/*.py on random data.

This is a sanity check on the examples themselves, not on the verifier:
correct cases (expect="verified") must agree with their sequential
reference and buggy twins (expect="bug") must visibly differ from it.
The cases are built once per session (conftest.ExampleRuns).
"""
import numpy as np
import pytest

import jax
from conftest import EXAMPLES, example_targets

from dlverify.frontends.jaxpr.prng import _key_dtype_impl
from dlverify.frontends.jaxpr.walk import key_shape

RTOL = ATOL = 1e-4
BUG_MIN_DIFF = 1e-3

CASES = [(path, name) for path, name in example_targets() if path.parent == EXAMPLES]


def _materialize(args, seed=0):
    rng = np.random.default_rng(seed)

    def one(a):
        if isinstance(a, jax.ShapeDtypeStruct) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            data = rng.integers(0, 2 ** 32, a.shape + key_shape(a.dtype), dtype=np.uint32)
            return jax.random.wrap_key_data(data, impl=_key_dtype_impl(a))
        if isinstance(a, jax.ShapeDtypeStruct):
            return rng.standard_normal(a.shape).astype(np.float32).astype(a.dtype)
        return a

    return jax.tree.map(one, args)


def _max_abs_diff(seq_out, dist_out):
    seq_leaves, seq_tree = jax.tree.flatten(seq_out)
    dist_leaves, dist_tree = jax.tree.flatten(dist_out)
    assert seq_tree == dist_tree, f"output pytrees differ: {seq_tree} vs {dist_tree}"
    diffs, close = [], True
    for s, d in zip(seq_leaves, dist_leaves):
        s, d = np.asarray(s), np.asarray(d)
        assert s.shape == d.shape, f"output shapes differ: {s.shape} vs {d.shape}"
        assert s.dtype == d.dtype, f"output dtypes differ: {s.dtype} vs {d.dtype}"
        diffs.append(float(np.max(np.abs(s.astype(np.float64) - d.astype(np.float64)), initial=0.0)))
        close = close and np.allclose(s, d, rtol=RTOL, atol=ATOL)
    return max(diffs, default=0.0), close


def test_examples_were_found():
    assert len(jax.devices()) >= 8
    assert len(CASES) >= 8


@pytest.mark.parametrize("path,name", CASES, ids=[f"{p.name}::{n}" for p, n in CASES])
def test_case_numerics(path, name, example_runs):
    case = example_runs.case(path, name)
    assert case.expect in ("verified", "bug")
    for a in case.args:
        assert isinstance(a, jax.ShapeDtypeStruct)
    args = _materialize(case.args)
    seq_out = case.seq(*args)
    dist_out = case.dist(*args)
    diff, close = _max_abs_diff(seq_out, dist_out)
    if case.expect == "verified":
        assert close, f"correct case disagrees with its reference: max abs diff {diff:.3g}"
    else:
        assert diff > BUG_MIN_DIFF, f"buggy twin agrees with its reference: max abs diff {diff:.3g}"
