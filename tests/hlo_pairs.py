"""Verifying a pair of HLO module texts written to files, for the HLO op tests
(test_hlo_sort.py, test_hlo_batchnorm.py, test_hlo_custom_neuron.py), and the
bundled examples as XLA compiles them (test_cse.py, test_const_layout.py,
test_resharding_regions.py; bench/xla_examples.py runs them all)."""
import importlib.util
from pathlib import Path

from conftest import bug_line
from rulekit import assert_views_hold

from dlverify.frontends.jax_compiled import dumped_after_optimizations
from dlverify.hlo_api import verify_hlo

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def verify_texts(tmp_path: Path, seq: str, dist: str):
    """The verdict on `dist` (written to tmp_path/dist.hlo) against `seq`."""
    seq_path, dist_path = tmp_path / "seq.hlo", tmp_path / "dist.hlo"
    seq_path.write_text(seq)
    dist_path.write_text(dist)
    return verify_hlo(seq_path, dist_path)


def assert_pair_verifies(tmp_path: Path, seq: str, dist: str, outputs: list[str]):
    """The pair verifies with exactly these output reconstructions, and every
    derived view holds on random inputs."""
    res = verify_texts(tmp_path, seq, dist)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert res.outputs == outputs
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)
    return res


def example_module(name: str):
    """examples/NAME.py, loaded under a private module name."""
    spec = importlib.util.spec_from_file_location(f"_hlo_pairs_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_pair(case, dumped: bool = False) -> tuple[str, str]:
    """The case's sequential module before optimisations and its distributed module
    after them: XLA's compiled text (large constants elided), or, `dumped`, the file
    --xla_dump_to writes with --xla_dump_large_constants."""
    import jax
    seq = jax.jit(case.seq).lower(*case.args).as_text(dialect="hlo")
    lowered = case.dist.lower(*case.args)
    return seq, dumped_after_optimizations(lowered) if dumped else lowered.compile().as_text()


def assert_compiled_case_and_twin(tmp_path: Path, correct, twin, dumped: bool = False) -> None:
    """The correct case verifies from its compiled modules; the buggy twin does not, and
    its first failure's frames hold its `# BUG` line."""
    res = verify_texts(tmp_path, *compiled_pair(correct, dumped))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    res = verify_texts(tmp_path, *compiled_pair(twin, dumped))
    assert not res.verified
    assert bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}, \
        [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
