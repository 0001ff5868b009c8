"""Showing a zoo run: each finished item's status line goes to stdout (a pipe
gets one line per item: that is its progress); when stderr is a terminal, a
rich progress bar and a live table of the items running (their phase and
time so far) and of the last ones finished are drawn there."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from dlverify.zoo.results import ItemResult

RECENT = 5  # finished items the live table keeps


def status_lines(r: ItemResult) -> list[str]:
    """The item's line, as check-jax writes a case's (the same words for every
    kind of item), and for a mismatch its first failure."""
    cached = "  (cached)" if r.cached else ""
    if r.status == "error":
        return [f"ERROR     {r.id}: {r.error}{cached}"]
    got = "verified" if r.verdict == "verified" else "not verified"
    word, phrase = {"ok": ("ok", got), "expected": ("expected", "bug found as expected"),
                    "mismatch": ("MISMATCH", f"{got} (expected {r.expect})")}[r.status]
    lines = [f"{word:<9} {r.id}  {phrase}  {r.seconds:.2f}s{cached}"]
    if r.status == "mismatch" and r.detail.first_failure:
        lines.append(f"  {r.detail.first_failure}")
    return lines


class LineDisplay:
    """One status line per finished item, through `echo`; nothing else."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo = echo
        self._lock = threading.Lock()

    def add_total(self, n: int) -> None:
        pass

    def started(self, item_id: str) -> None:
        pass

    def event(self, item_id: str, event: Any) -> None:
        pass

    def finished(self, item_id: str, results: list[ItemResult]) -> None:
        # Called from the run's main thread only; not under the lock: a line
        # printed above the live area refreshes it, which takes the lock.
        for r in results:
            for line in status_lines(r):
                self.echo(line)

    def __enter__(self) -> "LineDisplay":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class LiveDisplay(LineDisplay):
    """LineDisplay plus, on a terminal, the progress bar and the live table.
    When stdout is that terminal too, its lines are printed above the live area."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        super().__init__(echo)
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("zoo"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
        self.task = self.progress.add_task("zoo", total=0)
        self.running: dict[str, tuple[float, str]] = {}  # item -> (started, phase)
        self.recent: list[ItemResult] = []
        from rich.live import Live
        self.live = Live(console=self.console, get_renderable=self._renderable,
                         refresh_per_second=4, transient=True,
                         redirect_stdout=sys.stdout.isatty())

    def _renderable(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        with self._lock:
            table = Table(box=None, show_header=True, header_style="bold", expand=False)
            for col in ("item", "state", "time"):
                table.add_column(col)
            now = time.monotonic()
            for item, (t0, phase) in list(self.running.items()):
                table.add_row(item, f"running ({phase})", f"{now - t0:.1f}s")
            for r in self.recent[-RECENT:]:
                table.add_row(r.id, r.status + (" (cached)" if r.cached else ""),
                              f"{r.seconds:.1f}s")
        return Group(self.progress, table)

    def add_total(self, n: int) -> None:
        with self._lock:
            total = self.progress.tasks[0].total or 0
            self.progress.update(self.task, total=total + n)

    def started(self, item_id: str) -> None:
        with self._lock:
            self.running[item_id] = (time.monotonic(), "startup")

    def event(self, item_id: str, event: Any) -> None:
        if getattr(event, "kind", "") != "phase":
            return
        with self._lock:
            if item_id in self.running:
                self.running[item_id] = (self.running[item_id][0], event.phase)

    def finished(self, item_id: str, results: list[ItemResult]) -> None:
        with self._lock:
            self.running.pop(item_id, None)
            self.recent += results
            self.progress.advance(self.task)
        super().finished(item_id, results)

    def __enter__(self) -> "LiveDisplay":
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()
