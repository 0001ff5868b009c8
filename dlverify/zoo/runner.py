"""Running a zoo: every item in its own supervised child process
(dlverify/supervise.py, the CLI's supervisor: the limits hold in every phase,
a crash or hang is reported as such), at most `jobs` at once. The pool is a
set of threads in the parent, each waiting on one child; the children do the
work, so the threads cost nothing but a wait. Case files are first listed (in
a child too: importing runs the user's code), then each case is an item.

Before an item runs, the resume journal (--resume) and the verdict cache are
asked for it (dlverify/zoo/cache.py); a case file's list of cases is cached
as well, so a run that the cache serves entirely starts no child at all.
With --ray the threads wait on Ray tasks instead, each running the same
supervised child on a worker (dlverify/zoo/ray_backend.py): same results.

Exit code of a run (`ZooRun.code`), as for check-jax, the highest applying:
0 every item's verdict is the expected one; 1 some verdict differs from its
expectation; 2 some item had no verdict for another reason than a limit (bad
input, a crash of the process verifying it, an internal error); 3 some item
ran out of its time or memory limit. The other items always run to the end.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dlverify.errors import InputError
from dlverify.zoo import cache as C
from dlverify.zoo.items import CaseEntry, DumpEntry, Entry, HloEntry, ItemLimits
from dlverify.zoo.results import ItemKind, ItemResult, error_result
from dlverify.zoo.tasks import (CaseJob, ChildValue, DumpJob, HloJob, case_task, dump_task,
                                hlo_task, list_task, ready_task)

if TYPE_CHECKING:
    from dlverify.patterns import Pattern

EXIT_OK, EXIT_MISMATCH, EXIT_INPUT, EXIT_RESOURCES = 0, 1, 2, 3


@dataclass(frozen=True)
class ZooOptions:
    jobs: int = 1
    engine: str = "auto"
    limits: ItemLimits = ItemLimits()  # for each item; a manifest entry may override
    cache_dir: Path = field(default_factory=C.default_cache_dir)
    use_cache: bool = True             # --no-cache: neither read nor write verdicts
    resume: bool = False               # keep the finished items of the interrupted run
    rules_dir: Path | None = None      # --rules: another rule set; the installed one when None
    ray: str | None = None             # --ray: "auto" or a cluster's address; None: local pool
    patterns: tuple[Pattern, ...] | None = None  # --patterns: the bug patterns; None: the shipped ones


class Display(Protocol):
    """What a run tells whoever shows it. `event` is called from pool threads."""

    def add_total(self, n: int) -> None: ...
    def started(self, item_id: str) -> None: ...
    def event(self, item_id: str, event: Any) -> None: ...
    def finished(self, item_id: str, results: list[ItemResult]) -> None: ...


class NoDisplay:
    def add_total(self, n: int) -> None:
        pass

    def started(self, item_id: str) -> None:
        pass

    def event(self, item_id: str, event: Any) -> None:
        pass

    def finished(self, item_id: str, results: list[ItemResult]) -> None:
        pass


@dataclass
class ZooRun:
    """The results of a run, in the order of the entries."""

    results: list[ItemResult]
    seconds: float
    from_cache: int = 0     # items the verdict cache served
    resumed: int = 0        # items kept from the interrupted run (--resume)

    @property
    def code(self) -> int:
        code = EXIT_OK
        for r in self.results:
            if r.status == "mismatch":
                code = max(code, EXIT_MISMATCH)
            elif r.status == "error":
                code = max(code, EXIT_RESOURCES if r.hit_limit else EXIT_INPUT)
        return code

    def summary(self) -> str:
        status = [r.status for r in self.results]
        kinds = [r.error_kind for r in self.results]
        text = (f"summary: {_count(len(status), 'item')}: {status.count('ok')} verified, "
                f"{_count(status.count('expected'), 'bug')} found as expected, "
                f"{_count(status.count('mismatch'), 'mismatch')}, "
                f"{_count(status.count('error'), 'error')}")
        why = [f"{kinds.count(k)} {label}" for k, label in
               (("out_of_time", "out of time"), ("out_of_memory", "out of memory"),
                ("crashed", "crashed"), ("input_error", "bad input"),
                ("internal_error", "internal error")) if kinds.count(k)]
        if why:
            text += f" ({', '.join(why)})"
        served = [f"{self.from_cache} from the cache"] if self.from_cache else []
        if self.resumed:
            served.append(f"{self.resumed} kept from the interrupted run")
        if served:
            text += "; " + ", ".join(served)
        return text + f"; {self.seconds:.1f}s"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


@dataclass
class _Work:
    """One unit for the pool: a case file's listing or an item."""

    order: tuple[int, ...]
    key: str
    item_id: str
    kind: ItemKind
    file: str
    name: str
    expect: str
    task: Callable[..., ChildValue]
    args: tuple
    limits: ItemLimits
    listing: CaseEntry | None = None  # a listing: expanded into case items when done


class _Runner:
    def __init__(self, entries: list[Entry], options: ZooOptions, display: Display) -> None:
        self.options = options
        self.display = display
        # the explanations are part of a cached verdict: the patterns are part of its key
        self.salt = C.digest_bytes(C.salt(options.engine, options.rules_dir), repr(options.patterns))
        self.cache = C.ZooCache(options.cache_dir, options.use_cache)
        run_key = C.digest_bytes(self.salt, repr(entries), repr(options.limits))
        self.journal = C.Journal(options.cache_dir, run_key, options.resume)
        self.segments = options.cache_dir / "segments" if options.use_cache else None
        self.pending: deque[_Work] = deque()
        self.finished: list[tuple[tuple[int, ...], list[ItemResult]]] = []
        self.from_cache = 0
        self.resumed = 0
        self.entries = entries

    # -- building works ----------------------------------------------------------------

    def _digest(self, path: Path) -> str:
        try:
            return C.folder_digest(path) if path.is_dir() else C.file_digest(path)
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror or e}", str(path)) from None

    def initial(self) -> list[_Work]:
        works = []
        for i, e in enumerate(self.entries):
            limits = e.limits.over(self.options.limits)
            if isinstance(e, CaseEntry) and e.name is None:
                key = C.digest_bytes(self.salt, "list", self._digest(e.path))
                works.append(_Work((i,), key, str(e.path), "case", str(e.path), "", "verified",
                                   list_task, (e.path,), limits, listing=e))
            elif isinstance(e, CaseEntry):
                assert e.name is not None
                works.append(self._case_work((i,), e.path, e.name, limits))
            elif isinstance(e, HloEntry):
                parts = [f"{role}={self._digest(p) if p else ''}" for role, p in
                         (("seq", e.seq), ("dist", e.dist), ("spec", e.spec),
                          ("custom_calls", e.custom_calls))]
                key = C.digest_bytes(self.salt, "hlo", *parts, f"ranks={e.ranks}",
                                     f"expect={e.expect}", f"name={e.label}")
                job = HloJob(e.label, e, self.options.engine, self.segments, self.options.rules_dir,
                             self.options.patterns)
                works.append(_Work((i,), key, e.label, "hlo", str(e.dist), e.label, e.expect,
                                   hlo_task, (job,), limits))
            else:
                assert isinstance(e, DumpEntry)
                calls = self._digest(e.custom_calls) if e.custom_calls else ""
                key = C.digest_bytes(self.salt, "dump", self._digest(e.path), calls,
                                     f"expect={e.expect}")
                job = DumpJob(str(e.path), e, self.options.engine, self.segments, self.options.rules_dir,
                              self.options.patterns)
                works.append(_Work((i,), key, str(e.path), "dump", str(e.path), "", e.expect,
                                   dump_task, (job,), limits))
        return works

    def _case_work(self, order: tuple[int, ...], path: Path, name: str,
                   limits: ItemLimits) -> _Work:
        key = C.digest_bytes(self.salt, "case", self._digest(path), name)
        item_id = f"{path}::{name}"
        job = CaseJob(item_id, path, name, self.options.engine, self.segments, self.options.rules_dir,
                      self.options.patterns)
        return _Work(order, key, item_id, "case", str(path), name, "verified", case_task, (job,),
                     limits)

    # -- before running: the journal and the cache ------------------------------------

    def consider(self, w: _Work) -> None:
        kept = self.journal.get(w.key)
        if kept is not None:
            self.resumed += len(kept)
            self._finish(w, kept, cached=True)
            return
        hit = self.cache.get(w.key)
        if hit is not None and w.listing is not None:
            self._expand(w, hit.value)
            return
        if hit is not None:
            self.from_cache += len(hit.value)
            self._finish(w, hit.value, cached=True)
            return
        self.pending.append(w)

    def _expand(self, w: _Work, names: list[str]) -> None:
        self.display.add_total(len(names) - 1)
        for j, name in enumerate(names):
            self.consider(self._case_work(w.order + (j,), Path(w.file), name, w.limits))

    def _finish(self, w: _Work, results: list[ItemResult], cached: bool = False) -> None:
        for r in results:
            r.cached = cached
        self.finished.append((w.order, results))
        self.display.finished(w.item_id, results)

    # -- running -----------------------------------------------------------------------

    def run(self) -> None:
        from dlverify.supervise import Limits, run_supervised

        works = self.initial()
        self.display.add_total(len(works))
        for w in works:
            self.consider(w)
        submit: Callable[..., Any] = run_supervised
        ray_pool = None
        if self.pending and self.options.ray is not None:
            # Ray tasks instead of local children (dlverify/zoo/ray_backend.py): joined
            # only when something runs, so a run the cache serves starts no cluster.
            from dlverify.zoo.ray_backend import RayPool

            ray_pool = RayPool.connect(self.options.ray)
            submit = ray_pool.run
        elif self.pending:
            run_supervised(ready_task, ())  # see ready_task; how it ends does not matter
        jobs = max(1, self.options.jobs)
        pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="dlverify-zoo")
        running: dict[Future, _Work] = {}
        try:
            while self.pending or running:
                while self.pending and len(running) < jobs:
                    w = self.pending.popleft()
                    self.display.started(w.item_id)
                    on_event = (lambda ev, item=w.item_id: self.display.event(item, ev))
                    limits = Limits(w.limits.seconds, w.limits.memory_bytes)
                    running[pool.submit(submit, w.task, w.args, limits, None, on_event)] = w
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    self._ended(running.pop(fut), fut.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            if ray_pool is not None:
                ray_pool.close()
        pool.shutdown(wait=True)

    def _ended(self, w: _Work, outcome: Any) -> None:
        if outcome.ok:
            value: ChildValue = outcome.value
            if w.listing is not None:
                self.cache.put(w.key, C.Entry(value.names, value.deps))
                self._expand(w, value.names)
                return
            self.cache.put(w.key, C.Entry(value.results, value.deps))
            self.journal.put(w.key, value.results, value.deps)
            self._finish(w, value.results)
            return
        if outcome.status == "input_error":
            text = str(outcome.input_error())
        else:
            text = outcome.message or outcome.status.replace("_", " ")
        result = error_result(w.item_id, w.name, w.kind, w.file, w.expect, outcome.status, text,
                              outcome.seconds)
        self.journal.put(w.key, [result], {})
        self._finish(w, [result])


def run_zoo(entries: list[Entry], options: ZooOptions, display: Display | None = None) -> ZooRun:
    """Verify every item of `entries`; never raises for what an item does (bad
    input in an item, a limit, a crash are results). InputError for a file that
    cannot be read at all; KeyboardInterrupt stops the run (children are killed
    when the supervisor's fork server goes: dlverify.supervise.shutdown)."""
    t0 = time.monotonic()
    runner = _Runner(entries, options, display or NoDisplay())
    runner.run()
    runner.finished.sort(key=lambda pair: pair[0])
    results = _unique_ids([r for _, rs in runner.finished for r in rs])
    return ZooRun(results, time.monotonic() - t0, runner.from_cache, runner.resumed)


def _unique_ids(results: list[ItemResult]) -> list[ItemResult]:
    seen: dict[str, int] = {}
    for r in results:
        n = seen.get(r.id, 0) + 1
        seen[r.id] = n
        if n > 1:
            r.id = f"{r.id} ({n})"
    return results
