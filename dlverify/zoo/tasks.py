"""What a zoo item does in its supervised child process (dlverify/supervise.py):
list a case file's cases, verify one case, an HLO pair or a dump folder. Each
returns the item's results with the details the HTML page shows (computed
here, where the problem graphs still exist: the first failure's source line,
the failing subgraph as SVG) and the Python files the item imported from
outside the environment (for the cache: a change to a helper module of a case
file must make its verdict stale)."""
from __future__ import annotations

import linecache
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlverify.supervise import NULL_REPORTER, Reporter
from dlverify.zoo.cache import file_digest, outside_environment
from dlverify.zoo.items import DumpEntry, HloEntry
from dlverify.zoo.results import ItemDetail, ItemResult

if TYPE_CHECKING:
    from dlverify.patterns import Pattern
    from dlverify.verdict import CaseOutcome


@dataclass(frozen=True)
class CaseJob:
    """One case of a case file."""

    item_id: str
    path: Path
    name: str
    engine: str
    segment_cache: Path | None  # the on-disk segment memo shared by the zoo's items
    rules_dir: Path | None = None  # --rules: another rule set; the installed one when None
    patterns: tuple[Pattern, ...] | None = None  # the bug patterns; None: the shipped ones


@dataclass(frozen=True)
class HloJob:
    item_id: str
    entry: HloEntry
    engine: str
    segment_cache: Path | None
    rules_dir: Path | None = None
    patterns: tuple[Pattern, ...] | None = None


@dataclass(frozen=True)
class DumpJob:
    item_id: str
    entry: DumpEntry
    engine: str
    segment_cache: Path | None
    rules_dir: Path | None = None
    patterns: tuple[Pattern, ...] | None = None


@dataclass
class ChildValue:
    """What a task returns: case names (listing) or item results, and the
    user's Python files it imported with their digests."""

    names: list[str]
    results: list[ItemResult]
    deps: dict[str, str]


class _ImportedFiles:
    """The user's Python files imported while a task runs (modules new in sys.modules)."""

    def __init__(self) -> None:
        self.before = set(sys.modules)

    def digests(self) -> dict[str, str]:
        out = {}
        for name in set(sys.modules) - self.before:
            file = getattr(sys.modules.get(name), "__file__", None)
            if not file or not file.endswith(".py"):
                continue
            p = Path(file)
            if p.is_file() and outside_environment(p):
                out[str(p.resolve())] = file_digest(p)
        return out


def ready_task(reporter: Reporter = NULL_REPORTER) -> bool:
    """Nothing: run once before the pool starts, so that the fork server's one
    import of JAX (seconds) is not counted against the first items' limits."""
    return True


def list_task(path: Path, reporter: Reporter = NULL_REPORTER) -> ChildValue:
    """The case names of a file (importing it runs the user's module code)."""
    from dlverify.cases import load_cases

    imported = _ImportedFiles()
    reporter.phase("import")
    names = [n for n, _ in load_cases(path)]
    return ChildValue(names, [], imported.digests())


def case_task(job: CaseJob, reporter: Reporter = NULL_REPORTER) -> ChildValue:
    from dlverify.cases import load_cases, run_case
    from dlverify.reports.text import outcome_text

    imported = _ImportedFiles()
    reporter.phase("import")
    fn = dict(load_cases(job.path, job.name))[job.name]
    o = run_case(job.path, job.name, fn, job.engine, None, reporter, cache_dir=job.segment_cache,
                 rules_dir=job.rules_dir, patterns=job.patterns)
    reporter.phase("report")
    result = _result(job.item_id, "case", o, outcome_text(o))
    return ChildValue([], [result], imported.digests())


def hlo_task(job: HloJob, reporter: Reporter = NULL_REPORTER) -> ChildValue:
    from dlverify.hlo_api import verify_hlo
    from dlverify.reports.text import pair_text
    from dlverify.verdict import CaseOutcome

    e = job.entry
    reporter.phase("parse")
    t0 = time.perf_counter()
    res = verify_hlo(e.seq, e.dist, e.spec, ranks=e.ranks, engine=job.engine,  # type: ignore[arg-type]
                     custom_calls=e.custom_calls, cache_dir=job.segment_cache, rules_dir=job.rules_dir,
                     patterns=job.patterns)
    secs = time.perf_counter() - t0
    reporter.phase("report")
    o = CaseOutcome(e.label, str(e.dist), e.expect, res, seconds=secs)
    return ChildValue([], [_result(job.item_id, "hlo", o, pair_text(e.label, res, secs))], {})


def dump_task(job: DumpJob, reporter: Reporter = NULL_REPORTER) -> ChildValue:
    """One result per partitioned module of the folder."""
    from dlverify.errors import InputError
    from dlverify.hlo_api import verify_dump
    from dlverify.reports.text import pair_text
    from dlverify.verdict import CaseOutcome

    e = job.entry
    reporter.phase("parse")
    t0 = time.perf_counter()
    modules = verify_dump(e.path, engine=job.engine, custom_calls=e.custom_calls,  # type: ignore[arg-type]
                          cache_dir=job.segment_cache, rules_dir=job.rules_dir, patterns=job.patterns)
    if not modules:
        raise InputError("no SPMD-partitioned module in this dump folder", str(e.path))
    secs = (time.perf_counter() - t0) / len(modules)
    reporter.phase("report")
    results = []
    for file, res in modules:
        name = res.name or file
        o = CaseOutcome(name, file, e.expect, res, seconds=secs)
        results.append(_result(f"{job.item_id}::{name}", "dump", o, pair_text(name, res, secs)))
    return ChildValue([], results, {})


def _result(item_id: str, kind: str, o: "CaseOutcome", lines: list[str]) -> ItemResult:
    from dlverify.tasks import ItemRun

    detail = _detail(o, item_id)
    run = ItemRun.of(o, lines)  # drops the problem graphs: the detail is made already
    return ItemResult(item_id, o.name, kind, o.file, o.expect, o.status, o.verdict,  # type: ignore[arg-type]
                      o.seconds, lines, detail=detail, outcome_pickle=run.outcome_pickle)


def _detail(o: "CaseOutcome", item_id: str) -> ItemDetail:
    res = o.result
    if res is None:
        return ItemDetail()
    d = ItemDetail(assumptions=list(res.assumptions), outputs=list(res.outputs))
    if res.verified:
        return d
    if res.failures:
        from dlverify.reports.text import failure_line

        f = res.failures[0]
        d.first_failure = failure_line(f)
        d.source_file, d.source_line = f.file, f.line
        if f.file and f.line > 0:
            d.source_text = linecache.getline(f.file, f.line).strip()
    if res.problem is None:
        d.svg_note = "no program graphs to draw"
        return d
    from dlverify.reports.graph import failing_subgraphs
    from dlverify.zoo.svg import subgraphs_svg

    try:
        d.svg = subgraphs_svg(failing_subgraphs(res), res.name, item_id)
    except (ValueError, KeyError, IndexError) as err:  # a drawing must not cost the verdict
        d.svg_note = f"the failing subgraph could not be drawn: {type(err).__name__}: {err}"
    return d
