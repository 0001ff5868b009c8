"""HLO scatters with indices known before run time as window updates
(dlverify/scatter_windows.py, shared with the jaxpr frontend): `.at[...].set`
(an overwriting reducer, as the SPMD partitioner leaves it), `.add`, `.mul`,
`.max`, one index or several, compute what JAX computes (the shared interpreter
on random data); overlapping sets and windows out of bounds are refused at the
scatter's line; the pipeline buffer's module right after SPMD partitioning
verifies and its wrong-slot twin does not."""
import jax
import numpy as np
import pytest
from hlo_pairs import EXAMPLES, verify_texts

from dlverify.cases import load_cases
from dlverify.errors import UnknownOpError
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
from dlverify.frontends.jax_compiled import dumped_after_spmd
from dlverify.interpret import Interpreter
from dlverify.ir import IdAllocator

RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 3)).astype(np.float32)
V = RNG.standard_normal((2, 3)).astype(np.float32)

FORMS = {
    "set_row": lambda x, v: x.at[1].set(v[0]),
    "set_rows": lambda x, v: x.at[np.array([4, 0])].set(v),
    "add_block": lambda x, v: x.at[1:3].add(v),
    "mul_rows": lambda x, v: x.at[np.array([2, 3])].multiply(v),
    "max_cells": lambda x, v: x.at[np.array([0, 4]), 2].max(v[:, 0]),
}


def _graph(text: str):
    return hlo_to_graph(parse_hlo_module(text, "s.hlo"), IdAllocator(), "g")[0]


@pytest.mark.parametrize("name", list(FORMS))
def test_known_index_scatters_compute_what_jax_computes(name):
    fn = FORMS[name]
    text = jax.jit(fn).lower(X, V).as_text(dialect="hlo")
    assert " scatter(" in text
    g = _graph(text)
    assert not any(op.kind == "scatter" for op in g.ops)
    got = Interpreter(g, 1).run([[X], [V]])[g.outputs[0]][0]
    np.testing.assert_allclose(got, np.asarray(jax.jit(fn)(X, V)), rtol=1e-6)


@pytest.mark.parametrize("fn,words", [
    (lambda x, v: x.at[np.array([1, 1])].set(v), "overlapping"),
    (lambda x, v: x.at[np.array([1, 7])].set(v, mode="promise_in_bounds"), "out of bounds"),
])
def test_unordered_or_out_of_bounds_sets_are_refused_at_their_line(fn, words):
    text = jax.jit(fn).lower(X, V).as_text(dialect="hlo")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if " scatter(" in ln)
    with pytest.raises(UnknownOpError) as e:
        _graph(text)
    assert f"s.hlo:{line}" in str(e.value) and words in str(e.value)


def test_the_pipeline_buffer_after_spmd_partitioning_verifies(tmp_path):
    cases = dict(load_cases(EXAMPLES / "pipeline_buffer.py"))
    for name, expect in (("buffer_unrolled_at_set", True), ("buffer_bug_wrong_slot", False)):
        case = cases[name]()
        seq = jax.jit(case.seq).lower(*case.args).as_text(dialect="hlo")
        dist = dumped_after_spmd(case.dist.lower(*case.args))
        assert " scatter(" in dist
        res = verify_texts(tmp_path, seq, dist)
        assert res.verified is expect, [f.message[:200] for f in res.failures[:2]]
