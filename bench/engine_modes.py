"""Engine labels the benchmarks accept to run the engines side by side.

`souffle` is Soufflé in its default mode (the cached compiled binary, compiled
first when a C++ compiler is present); `souffle-compiled` and
`souffle-interpreted` force a mode (DLVERIFY_SOUFFLE_MODE).
"""
import os
from contextlib import contextmanager
from typing import Iterator

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
