"""Engine labels the benchmarks accept to run the engines side by side.

`souffle` is Soufflé in its default mode (the cached compiled binary, compiled
first when a C++ compiler is present); `souffle-compiled` and
`souffle-interpreted` force a mode (DLVERIFY_SOUFFLE_MODE).
"""
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

ENGINE_MODES = {"clingo": ("clingo", None), "auto": ("auto", None), "souffle": ("souffle", "auto"),
                "souffle-compiled": ("souffle", "compiled"),
                "souffle-interpreted": ("souffle", "interpreted")}


@contextmanager
def engine_mode(label: str) -> Iterator[str]:
    """The engine name to pass to dlverify for `label`, with Soufflé's mode set
    in the environment for the duration."""
    from dlverify.engine.souffle_runner import MODE_ENV

    engine, mode = ENGINE_MODES[label]
    if mode:
        os.environ[MODE_ENV] = mode
    try:
        yield engine
    finally:
        os.environ.pop(MODE_ENV, None)


def side_by_side(name: str, labels: list[str], run: Callable[[str], Any]) -> str:
    """One row: the verdict and the Datalog seconds of `run(engine)` (a dlverify
    Result) for each engine label; the verdicts must agree."""
    cells, verdicts = [], set()
    for label in labels:
        with engine_mode(label) as engine:
            res = run(engine)
        verdicts.add(res.verified)
        cells.append(f"{label} {res.timings.get('datalog', 0):7.3f}s")
    verdict = ("verified" if verdicts == {True} else "NOT verified" if verdicts == {False}
               else "ENGINES DISAGREE")
    return f"{name:<45} {verdict:<16} " + "  ".join(cells)
