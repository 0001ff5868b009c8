"""A wall-clock limit for a verification run (CLI exit code 3).

Uses SIGALRM, so it only works in the main thread of the main interpreter;
long engine calls are interrupted when they return to Python (between
segments), which keeps a run within about one segment of its limit.
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
