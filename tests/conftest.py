"""Shared test set-up: host CPU devices for JAX (the one place XLA_FLAGS is
set), and the example cases, each built and verified at most once per session."""
import os

# Before JAX is imported anywhere (pytest imports this file before any test
# module): 8 host devices, and collectives printed with explicit replica
# groups. Flags the environment already has are kept; ours are added.
TEST_XLA_FLAGS = {"--xla_force_host_platform_device_count": "8",
                  "--xla_enable_rgv3_materialization": "false"}
_flags = os.environ.get("XLA_FLAGS", "").split()
_flags += [f"{k}={v}" for k, v in TEST_XLA_FLAGS.items()
           if not any(f.startswith(k + "=") for f in _flags)]
os.environ["XLA_FLAGS"] = " ".join(_flags)

import inspect  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def example_targets() -> list[tuple[Path, str]]:
    """(file, case name) of every case under examples/, found without running them."""
    import re

    out = []
    for path in sorted(EXAMPLES.rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"@dlverify\.case\s*\ndef (\w+)\(", text):
            out.append((path, m.group(1)))
    return out


def representative_targets() -> list[tuple[Path, str]]:
    """One correct case and one buggy twin of every example file, and the TP=2
    sequence-parallel models (forward and training), with their layers in a
    Python loop. For suites that compare two ways of evaluating the same rules
    (engine parity, segments against one fixpoint): the other cases repeat these
    graphs on more ranks, with other layer counts or as a lax.scan, and every
    case is verified end to end by tests/test_examples_e2e.py."""
    out, seen = [], set()
    for p, n in example_targets():
        if p.parent.name == "models":
            if "_tp2_sp_" in n and "_scan_" not in n:
                out.append((p, n))
            continue
        kind = (p, "bug" in n)
        if kind not in seen:
            seen.add(kind)
            out.append((p, n))
    return out


def bug_line(dist_fn) -> int:
    """The line marked `# BUG` inside the local function of a shard_map program."""
    fn = dist_fn
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    lines, start = inspect.getsourcelines(fn)
    marked = [start + i for i, line in enumerate(lines) if "# BUG" in line]
    assert len(marked) == 1, f"{fn.__name__}: expected exactly one '# BUG' line, found {marked}"
    return marked[0]


@dataclass
class ExampleRun:
    """One example case and its verdict (engine clingo). When the case's dist
    is a shard_map program, `result.problem` is the problem the jaxpr frontend
    built (rewritten by the verification), ready for numeric checks."""

    case: Any
    result: Any
    shard_map: bool


class ExampleRuns:
    """Builds and verifies each example case at most once per session: the
    verdict tests, the derived-view soundness checks and the model tests share
    one verification instead of repeating it."""

    def __init__(self) -> None:
        self._cases: dict[tuple[Path, str], Any] = {}
        self._runs: dict[tuple[Path, str], ExampleRun] = {}

    def case(self, path: Path, name: str):
        key = (Path(path).resolve(), name)
        if key not in self._cases:
            from dlverify.cases import load_cases
            self._cases[key] = dict(load_cases(key[0], name))[name]()
        return self._cases[key]

    def run(self, path: Path, name: str) -> ExampleRun:
        key = (Path(path).resolve(), name)
        if key not in self._runs:
            from dlverify.api import verify_jax
            from dlverify.frontends.jax_compiled import uses_shard_map

            c = self.case(path, name)
            res = verify_jax(c.seq, c.dist, *c.args, engine="clingo", name=name)
            self._runs[key] = ExampleRun(c, res, uses_shard_map(c.dist, tuple(c.args)))
        return self._runs[key]


@pytest.fixture(scope="session")
def example_runs() -> ExampleRuns:
    return ExampleRuns()


def pytest_sessionstart(session: pytest.Session) -> None:
    """With worker processes (pytest-xdist's controller: the README's test command),
    compile the shipped rules for Soufflé in the background while the workers start on
    the clingo tests: each worker's first Soufflé run would otherwise compile them
    itself, the two builds sharing the two cores for minutes. Workers that get there
    first wait for this build (souffle_runner's lock file). A session that ends before
    the build leaves it running to completion: the binary is cached for the next one."""
    import shutil
    import subprocess
    import sys

    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) \
            or shutil.which("souffle") is None:
        return
    code = ("from dlverify.api import rules_path; "
            "from dlverify.engine.souffle_runner import prebuild; prebuild(rules_path())")
    subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
