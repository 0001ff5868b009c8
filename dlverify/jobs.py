"""`--jobs N` of check-jax and check-dump: independent units of work (the cases
of a file, the module pairs of a dump folder), each in its own supervised child
(dlverify/supervise.py: the fork server that imported JAX once, the limits in
every phase), at most N at once.

Deterministic: the outcomes come back in the units' order, whatever order the
children finish in, and a unit's child does what it would do under --jobs 1,
so the report is the same for any N (the times aside). The run's --timeout is
one deadline shared by all units, --max-memory holds for each child: a unit
that would start after the deadline does not start ("not run", as the units
after the one that ran out of time under --jobs 1).

The pool is a set of threads in the parent, each waiting on one child (as the
zoo's, dlverify/zoo/runner.py): the children do the work.

Within one program there is nothing to run in parallel: its segments
(dlverify/segments.py) form a chain, each window chosen from the views the
previous ones derived, so one case or module pair is one unit.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dlverify.errors import InputError
from dlverify.supervise import Event, Limits, TaskOutcome, run_supervised

MAX_JOBS = 256  # as the zoo's --jobs


def jobs_ok(jobs: int) -> int:
    if not 1 <= jobs <= MAX_JOBS:
        raise InputError(f"--jobs {jobs}: expected 1..{MAX_JOBS}")
    return jobs


@dataclass(frozen=True)
class Unit:
    """One supervised task: `task(*args, reporter=...)`, picklable (see run_supervised)."""

    name: str
    task: Callable[..., Any]
    args: tuple


def run_units(units: list[Unit], jobs: int, limits: Limits, deadline: float | None,
              on_start: Callable[[str], None] | None = None,
              on_event: Callable[[Event], None] | None = None,
              ) -> Iterator[tuple[Unit, TaskOutcome | None]]:
    """Each unit's outcome, in the units' order; None for a unit not started
    because the run's deadline had passed. `on_start` and `on_event` are called
    from the pool's threads. Never raises for what a unit does; on
    KeyboardInterrupt the units not started are dropped (the running children
    end with the fork server, dlverify.supervise.shutdown)."""
    def one(unit: Unit) -> TaskOutcome | None:
        if deadline is not None and time.monotonic() >= deadline:
            return None
        if on_start is not None:
            on_start(unit.name)
        return run_supervised(unit.task, unit.args, limits, deadline=deadline, on_event=on_event)

    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units))),
                              thread_name_prefix="dlverify-jobs")
    futures = [pool.submit(one, u) for u in units]
    try:
        for unit, fut in zip(units, futures):
            yield unit, fut.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def run_dump_units(job: Any, jobs: int, limits: Limits, deadline: float | None,
                   on_start: Callable[[str], None] | None = None,
                   on_event: Callable[[Event], None] | None = None) -> TaskOutcome:
    """`check-dump --jobs N`: list the module pairs of `job.dump_dir` (a
    tasks.HloJob) in a child, verify each in its own, and return what the one
    child of tasks.run_hlo_task would have returned for the whole folder: the
    rendered modules in folder order (a list of tasks.ItemRun), or the outcome
    of the first module (in folder order) that ended without a verdict (that
    child stops at it), or the error of a folder with no partitioned module."""
    from dlverify.tasks import list_dump_task, run_dump_module_task

    dump_dir = job.dump_dir
    listed = run_supervised(list_dump_task, (dump_dir,), limits, deadline=deadline,
                            on_event=on_event)
    if not listed.ok:
        return listed
    modules = [m for m in listed.value if m.after is not None]
    many = len(modules) > 1
    units = [Unit(m.name, run_dump_module_task, (job, m, many)) for m in modules]
    runs: list = []
    first_failed: TaskOutcome | None = None
    t0 = time.monotonic()
    # Every outcome is awaited, even after a failure: the children under way cannot be
    # stopped one by one, and the first failure in folder order is the one reported.
    for _unit, got in run_units(units, jobs, limits, deadline, on_start, on_event):
        if got is None:
            got = TaskOutcome("out_of_time", phase="startup", seconds=time.monotonic() - t0)
        if not got.ok:
            first_failed = first_failed or got
        elif first_failed is None:
            runs.extend(got.value)
    if first_failed is not None:
        return first_failed
    if not runs:
        from dlverify.hlo_api import no_partitioned_module

        e = no_partitioned_module(dump_dir)
        return TaskOutcome("input_error", message=e.message, file=e.file, line=e.line)
    return TaskOutcome("ok", value=runs, seconds=time.monotonic() - t0)

