"""The units of work the CLI runs in supervised child processes
(dlverify/supervise.py): list the cases of a file, verify one case, verify
an HLO pair or an XLA dump folder. Each does every phase of its item (import,
trace or parse, engine, report: the text and the extras asked for) inside the
child, so that the limits hold in all of them, and returns a picklable value
without the problem graphs (large; only the extras need them)."""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlverify.errors import InputError
from dlverify.supervise import NULL_REPORTER, Reporter

if TYPE_CHECKING:  # the CLI's parent process imports this module: keep it light
    from dlverify.patterns import Pattern
    from dlverify.verdict import CaseOutcome


@dataclass(frozen=True)
class Extras:
    """The optional products asked for on the command line, made per item."""

    explain: str | None = None
    witness: bool = False
    graph: Path | None = None
    verbose: bool = False


@dataclass(frozen=True)
class CaseJob:
    """One case of a case file to verify."""

    path: Path
    name: str
    engine: str = "auto"
    keep_facts: Path | None = None
    extras: Extras = Extras()
    cache_dir: Path | None = None  # the on-disk segment memo (--cache); off when None
    rules_dir: Path | None = None  # --rules: another rule set; the installed one when None
    patterns: tuple[Pattern, ...] | None = None  # the bug patterns; None: the shipped ones


@dataclass(frozen=True)
class HloJob:
    """An HLO pair (`dump_dir` None) or every partitioned module of a dump folder."""

    seq: Path | None = None
    dist: Path | None = None
    spec: Path | None = None
    ranks: int | None = None
    dump_dir: Path | None = None
    engine: str = "auto"
    custom_calls: Path | None = None
    keep_facts: Path | None = None
    extras: Extras = Extras()
    cache_dir: Path | None = None  # the on-disk segment memo (--cache); off when None
    rules_dir: Path | None = None  # --rules: another rule set; the installed one when None
    patterns: tuple[Pattern, ...] | None = None  # the bug patterns; None: the shipped ones


@dataclass(frozen=True)
class SpecJob:
    """`dlverify spec`: infer the relation spec of an HLO pair."""

    seq: Path
    dist: Path
    spec: Path | None = None
    ranks: int | None = None
    engine: str = "auto"
    custom_calls: Path | None = None


def run_spec_task(job: SpecJob, reporter: Reporter = NULL_REPORTER):
    """Infer the spec (dlverify.spec_writer.InferredSpec)."""
    from dlverify.spec_writer import infer_spec

    reporter.phase("infer")
    return infer_spec(job.seq, job.dist, job.spec, ranks=job.ranks, engine=job.engine,
                      custom_calls=job.custom_calls)


@dataclass
class ItemRun:
    """One verified item: the lines the text report prints for it, its status,
    and its CaseOutcome pickled: the CLI's parent unpickles it only for the
    JSON, SARIF and JUnit reports (unpickling imports the verifier's modules,
    a second of the parent's time that a --timeout would not see)."""

    lines: list[str]
    status: str            # CaseOutcome.status: ok | expected | mismatch | error
    matches: bool          # the verdict is the one the case expects
    outcome_pickle: bytes

    @classmethod
    def of(cls, o: "CaseOutcome", lines: list[str]) -> "ItemRun":
        if o.result is not None:
            o.result.problem = None  # large, and only the extras (made already) need it
        return cls(lines, o.status, o.matches, pickle.dumps(o))

    def outcome(self) -> "CaseOutcome":
        return pickle.loads(self.outcome_pickle)


def split_target(target: str) -> tuple[Path, str | None]:
    """`PATH.py` or `PATH.py::NAME`."""
    path, _, name = target.partition("::")
    return Path(path), (name or None)


def list_cases_task(path: Path, name: str | None, reporter: Reporter = NULL_REPORTER) -> list[str]:
    """The names of the cases of a file (importing it runs the user's code)."""
    from dlverify.cases import load_cases

    reporter.phase("import")
    return [n for n, _ in load_cases(path, name)]


def run_case_task(job: CaseJob, reporter: Reporter = NULL_REPORTER) -> ItemRun:
    """Import the case file, verify one case, render it and its extras."""
    from dlverify.cases import load_cases, run_case
    from dlverify.reports.text import outcome_text

    reporter.phase("import")
    fn = dict(load_cases(job.path, job.name))[job.name]
    o = run_case(job.path, job.name, fn, job.engine, job.keep_facts, reporter,
                 cache_dir=job.cache_dir, rules_dir=job.rules_dir, patterns=job.patterns)
    reporter.phase("report")
    lines = outcome_text(o, job.extras.verbose) + _extras(o, job.extras)
    return ItemRun.of(o, lines)


def run_hlo_task(job: HloJob, reporter: Reporter = NULL_REPORTER) -> list[ItemRun]:
    """Verify an HLO pair, or each partitioned module of a dump folder; render them."""
    from dlverify.hlo_api import dump_modules, verify_dump, verify_hlo

    reporter.phase("parse")
    t0 = time.perf_counter()
    if job.dump_dir is None:
        assert job.seq is not None and job.dist is not None
        res = verify_hlo(job.seq, job.dist, job.spec, ranks=job.ranks, engine=job.engine,
                         custom_calls=job.custom_calls, keep_facts=job.keep_facts,
                         cache_dir=job.cache_dir, rules_dir=job.rules_dir, patterns=job.patterns)
        items = [(f"{job.seq.name} vs {job.dist.name}", str(job.dist), res,
                  time.perf_counter() - t0)]
        return _render(items, job, reporter, many=False)
    out = verify_dump(job.dump_dir, engine=job.engine, custom_calls=job.custom_calls,
                      cache_dir=job.cache_dir, rules_dir=job.rules_dir, patterns=job.patterns)
    secs = (time.perf_counter() - t0) / max(1, len(out))
    items = [(res.name or name, name, res, secs) for name, res in out]
    many = sum(m.after is not None for m in dump_modules(job.dump_dir)) > 1
    return _render(items, job, reporter, many)


def list_dump_task(dump_dir: Path, reporter: Reporter = NULL_REPORTER) -> list:
    """The module pairs of a dump folder (hlo_api.DumpModule), for `check-dump --jobs N`."""
    from dlverify.hlo_api import dump_modules

    reporter.phase("parse")
    return dump_modules(dump_dir)


def run_dump_module_task(job: HloJob, module, many: bool,
                         reporter: Reporter = NULL_REPORTER) -> list[ItemRun]:
    """Verify one module pair of a dump folder (hlo_api.DumpModule) and render it as
    run_hlo_task renders it within the folder: [] when it was not partitioned.
    `many`: the folder has several candidate modules (--graph writes one file each)."""
    from dlverify.hlo_api import verify_dump_module

    reporter.phase("parse")
    t0 = time.perf_counter()
    res = verify_dump_module(module, engine=job.engine, custom_calls=job.custom_calls,
                             cache_dir=job.cache_dir, rules_dir=job.rules_dir, patterns=job.patterns)
    if res is None:
        return []
    items = [(res.name or module.name, module.name, res, time.perf_counter() - t0)]
    return _render(items, job, reporter, many)


def _render(items: list, job: HloJob, reporter: Reporter, many: bool) -> list[ItemRun]:
    """The text report and the extras of verified HLO pairs (name, file, Result, seconds)."""
    from dlverify.reports.text import pair_text
    from dlverify.verdict import CaseOutcome

    reporter.phase("report")
    runs = []
    for i, (name, file, res, secs) in enumerate(items):
        o = CaseOutcome(name, file, "verified", res, seconds=secs)
        extras = job.extras
        if extras.graph is not None and many:  # one file per module
            g = extras.graph
            extras = Extras(extras.explain, extras.witness,
                            g.with_name(f"{g.stem}.{_file_safe(file) or i}{g.suffix}"),
                            extras.verbose)
        lines = pair_text(name, res, secs, extras.verbose) + _extras(o, extras)
        runs.append(ItemRun.of(o, lines))
    return runs


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:120]


def _extras(o: CaseOutcome, extras: Extras) -> list[str]:
    from dlverify.artifacts import case_extras, parse_explain_target

    if extras.explain and o.result is not None and o.result.problem is not None:
        _name, rank = parse_explain_target(extras.explain)
        ranks = o.result.problem.mesh.size
        if rank >= ranks:
            raise InputError(f"--explain {extras.explain!r}: rank {rank} does not exist, the "
                             f"distributed program has ranks 0..{ranks - 1}")
    return case_extras(o, explain=extras.explain, witness=extras.witness, graph=extras.graph)
