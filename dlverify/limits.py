"""OutOfTime, the exception for a run past its time limit (CLI exit code 3),
and a SIGALRM-based limit for in-process use of the library.

The CLI does not use `time_limit`: a SIGALRM is swallowed by broad exception
handlers or fires inside JAX's callbacks. It runs every case in a child
process that its parent kills at the deadline (dlverify/supervise.py); an
OutOfTime raised inside that child (e.g. by an engine that checks a deadline)
is reported as out of time too. `time_limit` only works in the main thread
and interrupts long engine calls when they return to Python.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class OutOfTime(Exception):
    """The run exceeded its time limit."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    if not seconds:
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise OutOfTime(f"out of time after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
