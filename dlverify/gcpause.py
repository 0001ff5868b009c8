"""Python's cyclic garbage collector paused while a program is traced or verified.

Why: tracing and verifying a deep model allocates millions of objects (jaxpr
equations, IR ops, fact rows, views) that are freed by reference counting, not
by the cycle collector. Their sheer number triggers full collections, each of
which walks every live object and finds almost nothing: on the unrolled
Llama-3.1-405B forward (bench/bench_llama405b.py) they took 2-3 s of 12-13 s.
Paused, the resident set grew by a few MiB (the little cyclic garbage a run
makes waits until the collector runs again after it).

The collector's state is restored on exit (left off if the caller had turned it
off), so nesting and callers that manage it themselves are unaffected.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the body with the cycle collector off, restoring its state afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
