"""Parity of the two engines: a correct case and a buggy twin of every example file
(examples/*.py, examples/bugs/), the TP=2 sequence-parallel models forward and
training (conftest.representative_targets), and every HLO pair in tests/data give
the same verdict, the same failures and the same derived views with Soufflé as
with clingo.

Skipped when `souffle` is not on PATH (CI puts ../shared/tools/souffle/bin there).
Soufflé runs its cached compiled binary of the rules when there is one (built by any
`--engine souffle` run with a C++ compiler present) and its interpreter otherwise: a
compile costs minutes, more than the interpreter's starts over the whole suite.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import representative_targets
from dlverify.api import rules_path, verify_jax
from dlverify.engine import load_rules, souffle_runner
from dlverify.hlo_api import verify_hlo
from dlverify.verdict import Result

SOUFFLE = shutil.which("souffle")
pytestmark = pytest.mark.skipif(
    SOUFFLE is None, reason="`souffle` is not on PATH: run ../shared/tools/souffle/setup.sh and put "
                            "its bin/ on PATH to run the Soufflé parity suite")

DATA = Path(__file__).resolve().parent / "data"
NEURON, MUT = DATA / "neuron_llama", DATA / "mutants"
TARGETS = representative_targets()
HLO_PAIRS = [
    ("neuron_layer1", NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo", NEURON / "tp2.toml"),
    ("neuron_layer2", NEURON / "tp1_layer2.hlo", NEURON / "tp2_layer2.hlo", NEURON / "tp2_layer2.toml"),
    ("neuron_no_allreduce", NEURON / "tp1_layer1.hlo", MUT / "tp2_layer1_no_allreduce.hlo", NEURON / "tp2.toml"),
    ("neuron_wrong_group", NEURON / "tp1_layer1.hlo", MUT / "tp2_layer1_wrong_group.hlo", NEURON / "tp2.toml"),
    ("neuron_wrong_slice", NEURON / "tp1_layer1.hlo", MUT / "tp2_layer1_wrong_slice.hlo", NEURON / "tp2.toml"),
    ("jax_flatten", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_dist.hlo", None),
    ("jax_flatten_wrong_gather_dim", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_wrong_gather_dim.hlo", None),
    ("xla_uneven_mlp", DATA / "xla_uneven" / "mlp.before.hlo", DATA / "xla_uneven" / "mlp.after.hlo", None),
]


@pytest.fixture(scope="module", autouse=True)
def souffle_mode():
    """The cached compiled binary when there is one, else the interpreter (never a compile)."""
    mp = pytest.MonkeyPatch()
    binary = souffle_runner.cached_binary(load_rules(rules_path()).program, SOUFFLE)
    if binary is None:
        mp.setenv(souffle_runner.MODE_ENV, "interpreted")
    yield "compiled" if binary else "interpreted"
    mp.undo()


def _summary(res: Result) -> dict:
    return {
        "verified": res.verified,
        "outputs": res.outputs,
        "failures": [(f.kind, f.message) for f in res.failures],
        "views": sorted(res.views, key=repr),
    }


def _same(clingo_res: Result, souffle_res: Result) -> None:
    assert clingo_res.engine == "clingo" and souffle_res.engine == "souffle"
    a, b = _summary(clingo_res), _summary(souffle_res)
    assert a["views"], "no views derived: the comparison would be empty"
    for key in a:
        assert a[key] == b[key], key


@pytest.mark.parametrize("path,name", TARGETS, ids=[n for _, n in TARGETS])
def test_example_same_on_both_engines(path, name, example_runs):
    """clingo's result is the session's (conftest.ExampleRuns: each example is
    verified with clingo once per session); Soufflé runs the same case."""
    case = example_runs.case(path, name)
    clingo_res = example_runs.run(path, name).result
    _same(clingo_res, verify_jax(case.seq, case.dist, *case.args, engine="souffle", name=name))


@pytest.mark.parametrize("name,seq,dist,spec", HLO_PAIRS, ids=[p[0] for p in HLO_PAIRS])
def test_hlo_pair_same_on_both_engines(name, seq, dist, spec):
    results = [verify_hlo(seq, dist, spec, engine=e) for e in ("clingo", "souffle")]
    _same(*results)
